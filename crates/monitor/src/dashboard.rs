//! Dashboard frames: once per tick the sampler turns counters, probe histograms and the
//! cluster view into one JSON frame, keeps the last frames as history, and offers the frame to
//! every event-stream client through that client's bounded queue. A client whose queue is full
//! is cut off (its connection closed), so a client that never reads costs a bounded amount.

use crate::admin::AdminPanel;
use crate::cluster::{evaluate, Alert, ClusterSnapshot};
use crate::metrics::{render_histogram, Counter, Gauge, Registry, LATENCY_BUCKETS_NS};
use crate::probe::{
    kind_name, IntervalStats, Percentiles, Stage, KINDS, KIND_ENTRY, LEGS, LEG_DOOR_TO_DOOR,
    LEG_NETWORK,
};
use crate::{names, Monitor, MonitorConfig};
use bourse_core::CommandKind;
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, Notify};

/// Per-second rates.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Rates {
    pub commands: f64,
    pub tx: f64,
    pub orders: f64,
    pub trades: f64,
    pub cancels: f64,
    pub rejects: f64,
    /// Requests a gateway refused as busy (overload), per second.
    pub busy: f64,
    /// Log entries a replica node applied (0 where there is no node).
    pub entries: f64,
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Totals {
    pub commands: u64,
    pub tx: u64,
    pub orders: u64,
    pub trades: u64,
    pub cancels: u64,
    pub rejects: u64,
    pub busy: u64,
    pub entries: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct StageRow {
    pub stage: &'static str,
    pub all: Option<Percentiles>,
    pub new: Option<Percentiles>,
    pub cancel: Option<Percentiles>,
    /// Log entries as a replica node observes them (kind `entry`).
    pub entry: Option<Percentiles>,
}

/// One stage of a replica node's own path over the last interval (per batch, RPC or
/// published entry; see `bourse_cluster::stages`).
#[derive(Clone, Debug, Serialize)]
pub struct NodeStageRow {
    pub stage: String,
    pub latency: Option<Percentiles>,
}

/// Node stages one dashboard shows at most (a bound on names handed in).
pub const NODE_STAGES_MAX: usize = 16;

#[derive(Clone, Debug, Serialize)]
pub struct Latencies {
    pub all: Option<Percentiles>,
    pub new: Option<Percentiles>,
    pub cancel: Option<Percentiles>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub name: String,
    pub value: i64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub name: String,
    pub text: String,
}

/// One dashboard frame. `None` fields are parts that do not exist yet ("n/a" on the page).
#[derive(Clone, Debug, Serialize)]
pub struct Frame {
    pub node: String,
    pub unix_ms: u64,
    pub uptime_s: f64,
    pub interval_s: f64,
    pub sample_every: u32,
    pub rates: Rates,
    pub totals: Totals,
    pub live_orders: Option<i64>,
    pub latency: Latencies,
    pub stages: Vec<StageRow>,
    /// A replica node's own stages (empty where there is no node).
    pub node_stages: Vec<NodeStageRow>,
    pub network_leg: Option<Percentiles>,
    pub md_delay: Option<Percentiles>,
    pub delivery_delay: Option<Percentiles>,
    pub md_packets_per_s: Option<f64>,
    pub md_bytes_per_s: Option<f64>,
    pub sessions: Option<i64>,
    pub queues: Vec<Series>,
    /// The process's own named figures (e.g. a node's snapshot build time), as text.
    pub figures: Vec<Figure>,
    pub cluster: ClusterSnapshot,
    pub alerts: Vec<Alert>,
    /// What operators did through the admin API (none where this process has none).
    pub admin: Option<AdminPanel>,
    /// A data-delivery node's figures (none where this process has none).
    pub delivery: Option<crate::delivery::DeliveryPanel>,
    pub dashboard_clients: usize,
}

struct Client {
    id: u64,
    tx: mpsc::Sender<Arc<str>>,
    kill: Arc<Notify>,
}

struct State {
    history: VecDeque<Arc<str>>,
    clients: Vec<Client>,
    next_id: u64,
    prev_totals: Option<(Instant, Totals, u64, u64)>,
    /// A node's stage histograms since the last frame, by stage, in the order first seen.
    node_stages: Vec<(String, hdrhistogram::Histogram<u64>)>,
}

/// History and clients of the event stream.
pub struct Dashboard {
    state: Mutex<State>,
    history_frames: usize,
    clients_max: usize,
    queue_frames: usize,
    clients_gauge: Gauge,
    dropped: Counter,
    alerts_firing: Gauge,
}

/// Removes its client from the list when the event stream ends (connection gone).
pub struct ClientGuard {
    monitor: Arc<Monitor>,
    id: u64,
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        let d = &self.monitor.dashboard;
        if let Ok(mut s) = d.state.lock() {
            s.clients.retain(|c| c.id != self.id);
            d.clients_gauge.set(s.clients.len() as i64);
        }
    }
}

/// What a new event-stream client gets: the history as one JSON array, its queue, its guard.
pub struct Subscription {
    pub history_json: String,
    pub rx: mpsc::Receiver<Arc<str>>,
    pub guard: ClientGuard,
}

impl Dashboard {
    pub(crate) fn new(config: &MonitorConfig, registry: &Registry) -> Dashboard {
        Dashboard {
            state: Mutex::new(State {
                history: VecDeque::with_capacity(config.history_frames),
                clients: Vec::new(),
                next_id: 0,
                prev_totals: None,
                node_stages: Vec::new(),
            }),
            history_frames: config.history_frames,
            clients_max: config.sse_clients_max,
            queue_frames: config.sse_queue_frames,
            clients_gauge: registry.gauge(
                names::DASHBOARD_CLIENTS,
                "Dashboard event-stream clients connected.",
                &[],
            ),
            dropped: registry.counter(
                names::DASHBOARD_CLIENTS_DROPPED_TOTAL,
                "Event-stream clients cut off because they did not keep up.",
                &[],
            ),
            alerts_firing: registry.gauge(names::ALERTS_FIRING, "Alerts firing now.", &[]),
        }
    }

    pub fn clients(&self) -> usize {
        self.state.lock().map(|s| s.clients.len()).unwrap_or(0)
    }

    pub fn dropped_total(&self) -> u64 {
        self.dropped.get()
    }

    /// The newest frame, if any.
    pub fn latest(&self) -> Option<Arc<str>> {
        self.state.lock().ok()?.history.back().cloned()
    }

    /// Registers an event-stream client; `None` when the client limit is reached.
    pub fn subscribe(monitor: &Arc<Monitor>, kill: Arc<Notify>) -> Option<Subscription> {
        let d = &monitor.dashboard;
        let mut s = d.state.lock().ok()?;
        if s.clients.len() >= d.clients_max {
            return None;
        }
        let (tx, rx) = mpsc::channel(d.queue_frames);
        let id = s.next_id;
        s.next_id += 1;
        s.clients.push(Client { id, tx, kill });
        d.clients_gauge.set(s.clients.len() as i64);
        let mut history_json =
            String::with_capacity(s.history.iter().map(|f| f.len() + 1).sum::<usize>() + 2);
        history_json.push('[');
        for (i, f) in s.history.iter().enumerate() {
            if i > 0 {
                history_json.push(',');
            }
            history_json.push_str(f);
        }
        history_json.push(']');
        Some(Subscription {
            history_json,
            rx,
            guard: ClientGuard {
                monitor: monitor.clone(),
                id,
            },
        })
    }

    /// Adds one interval of a node stage's histogram (ns) to the next frame's table. A stage
    /// seen once keeps its row (shown as n/a while empty); past [`NODE_STAGES_MAX`] names,
    /// new ones are ignored.
    pub fn add_node_stage(&self, stage: &str, h: &hdrhistogram::Histogram<u64>) {
        let Ok(mut s) = self.state.lock() else { return };
        let i = match s.node_stages.iter().position(|(n, _)| n == stage) {
            Some(i) => i,
            None if s.node_stages.len() < NODE_STAGES_MAX => {
                s.node_stages
                    .push((stage.to_string(), hdrhistogram::Histogram::new_from(h)));
                s.node_stages.len() - 1
            }
            None => return,
        };
        // Values outside the bounds cannot come from a histogram of the same shape.
        let _ = s.node_stages[i].1.add(h);
    }

    /// The node stage rows of the interval now ending; starts the next one.
    fn take_node_stages(&self) -> Vec<NodeStageRow> {
        let Ok(mut s) = self.state.lock() else {
            return Vec::new();
        };
        s.node_stages
            .iter_mut()
            .map(|(stage, h)| {
                let latency = Percentiles::of_recorded(h);
                h.reset();
                NodeStageRow {
                    stage: stage.clone(),
                    latency,
                }
            })
            .collect()
    }

    /// Adds a frame to the history and offers it to every client, cutting off the slow ones.
    pub fn publish(&self, frame: Arc<str>) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.history.len() >= self.history_frames {
            s.history.pop_front();
        }
        s.history.push_back(frame.clone());
        let mut dropped = 0;
        s.clients.retain(|c| match c.tx.try_send(frame.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                // The client has not taken `queue_frames` frames: close its connection.
                c.kill.notify_one();
                dropped += 1;
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
        self.dropped.add(dropped);
        self.clients_gauge.set(s.clients.len() as i64);
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn totals(r: &Registry) -> Totals {
    let g = |n| r.counter_sum(n).unwrap_or(0);
    Totals {
        // A trading core counts commands by kind; a replica node counts what its state
        // machine applied.
        commands: r
            .counter_sum(names::COMMANDS_TOTAL)
            .unwrap_or_else(|| g(names::NODE_COMMANDS_APPLIED_TOTAL)),
        entries: g(names::NODE_ENTRIES_APPLIED_TOTAL),
        tx: g(names::TRANSACTIONS_TOTAL),
        orders: g(names::ORDERS_TOTAL),
        trades: g(names::TRADES_TOTAL),
        cancels: g(names::CANCELS_TOTAL),
        rejects: g(names::REJECTS_TOTAL),
        busy: r
            .counter_sum_where(names::GATEWAY_REJECTS_TOTAL, "cause", "busy")
            .unwrap_or(0),
    }
}

/// Builds the frame for the interval since the last call and publishes it.
pub fn tick(monitor: &Monitor) -> Arc<str> {
    let r = monitor.registry();
    let now = Instant::now();
    let t = totals(r);
    let md_packets = r.counter_sum(names::MD_PACKETS_TOTAL);
    let md_bytes = r.counter_sum(names::MD_BYTES_TOTAL);
    let prev = monitor.dashboard.state.lock().ok().and_then(|mut s| {
        s.prev_totals
            .replace((now, t, md_packets.unwrap_or(0), md_bytes.unwrap_or(0)))
    });
    let (interval_s, rates, md_rates) = match prev {
        Some((then, p, pp, pb)) => {
            let dt = now.duration_since(then).as_secs_f64().max(1e-3);
            let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
            (
                dt,
                Rates {
                    commands: rate(t.commands, p.commands),
                    tx: rate(t.tx, p.tx),
                    orders: rate(t.orders, p.orders),
                    trades: rate(t.trades, p.trades),
                    cancels: rate(t.cancels, p.cancels),
                    rejects: rate(t.rejects, p.rejects),
                    busy: rate(t.busy, p.busy),
                    entries: rate(t.entries, p.entries),
                },
                (
                    md_packets.map(|n| rate(n, pp)),
                    md_bytes.map(|n| rate(n, pb)),
                ),
            )
        }
        None => (0.0, Rates::default(), (None, None)),
    };
    let stats: IntervalStats = monitor.probes().take_interval();
    let latency = Latencies {
        all: stats.by_leg[LEG_DOOR_TO_DOOR],
        new: stats.get(CommandKind::NewOrder, LEG_DOOR_TO_DOOR),
        cancel: stats.get(CommandKind::Cancel, LEG_DOOR_TO_DOOR),
    };
    let stages = Stage::ALL[1..]
        .iter()
        .map(|&s| StageRow {
            stage: s.name(),
            all: stats.by_leg[s as usize],
            new: stats.get(CommandKind::NewOrder, s as usize),
            cancel: stats.get(CommandKind::Cancel, s as usize),
            entry: stats.by_kind_leg[KIND_ENTRY * LEGS + s as usize],
        })
        .collect();
    let cluster = monitor
        .cluster()
        .snapshot(monitor.config().alerts.node_down_ms, r);
    let node_stages = monitor.dashboard.take_node_stages();
    // Sampled orders' market data leg where a process stamps it; on a replica node, the
    // publication delay of every entry its feed sent.
    let md_delay = stats.by_leg[Stage::MdPublished as usize].or_else(|| {
        node_stages
            .iter()
            .find(|r| r.stage == "md_published")
            .and_then(|r| r.latency)
    });
    let alerts = evaluate(
        &monitor.config().alerts,
        latency.all.map(|p| p.p99),
        md_delay.map(|p| p.p99),
        &cluster,
    );
    monitor.dashboard.alerts_firing.set(alerts.len() as i64);
    let sessions = {
        let s = r.gauge_series(names::SESSIONS);
        (!s.is_empty()).then(|| s.iter().map(|x| x.1).sum())
    };
    let live = r.gauge_series(names::LIVE_ORDERS);
    let frame = Frame {
        node: monitor.config().node_name.clone(),
        unix_ms: unix_ms(),
        uptime_s: monitor.uptime().as_secs_f64(),
        interval_s,
        sample_every: monitor.config().sample_every,
        rates,
        totals: t,
        live_orders: (!live.is_empty()).then(|| live.iter().map(|x| x.1).sum()),
        latency,
        stages,
        node_stages,
        network_leg: stats.by_leg[LEG_NETWORK],
        md_delay,
        delivery_delay: stats.by_leg[Stage::DeliveryStored as usize],
        md_packets_per_s: md_rates.0,
        md_bytes_per_s: md_rates.1,
        sessions,
        queues: r
            .gauge_series(names::QUEUE_DEPTH)
            .into_iter()
            .map(|(labels, value)| Series {
                name: labels
                    .into_iter()
                    .find(|(k, _)| k == "queue")
                    .map(|(_, v)| v)
                    .unwrap_or_default(),
                value,
            })
            .collect(),
        figures: monitor
            .figures()
            .into_iter()
            .map(|(name, text)| Figure { name, text })
            .collect(),
        cluster,
        alerts,
        admin: monitor.admin().panel(r, interval_s),
        delivery: monitor.delivery().panel(interval_s),
        dashboard_clients: monitor.dashboard.clients(),
    };
    let json: Arc<str> = serde_json::to_string(&frame)
        .unwrap_or_else(|_| "{}".into())
        .into();
    monitor.dashboard.publish(json.clone());
    json
}

/// Appends the probe histograms (since start) as Prometheus histograms in seconds.
pub fn render_probe_histograms(monitor: &Monitor, out: &mut String) {
    let _ = monitor.probes().with_totals(|hist, sums| {
        let families: [(&str, &str, Vec<usize>); 3] = [
            (
                names::STAGE_LATENCY_SECONDS,
                "Time from the previous stamped stage to this stage (sampled orders).",
                (1..LEGS - 1).collect(),
            ),
            (
                names::ORDER_LATENCY_SECONDS,
                "Door to door: first to last stamped stage of t0..t7 (sampled orders).",
                vec![LEG_DOOR_TO_DOOR],
            ),
            (
                names::NETWORK_LEG_SECONDS,
                "Network leg by the LTP formula (T0,7 - T1,6) / 2 (sampled orders).",
                vec![LEG_NETWORK],
            ),
        ];
        for (name, help, legs) in families {
            let mut header = false;
            for leg in legs {
                for k in 0..KINDS {
                    let i = k * LEGS + leg;
                    let h = &hist[i];
                    if h.is_empty() {
                        continue;
                    }
                    if !header {
                        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
                        header = true;
                    }
                    let mut noncumulative = vec![0u64; LATENCY_BUCKETS_NS.len()];
                    for v in h.iter_recorded() {
                        let value = v.value_iterated_to();
                        let b = LATENCY_BUCKETS_NS.partition_point(|&x| x < value);
                        if b < noncumulative.len() {
                            noncumulative[b] += v.count_at_value();
                        }
                    }
                    let mut acc = 0;
                    let cumulative: Vec<u64> = noncumulative
                        .iter()
                        .map(|n| {
                            acc += n;
                            acc
                        })
                        .collect();
                    let mut labels = vec![("kind".to_string(), kind_name(k).to_string())];
                    if leg != LEG_DOOR_TO_DOOR && leg != LEG_NETWORK {
                        labels.push(("stage".to_string(), Stage::ALL[leg].name().to_string()));
                    }
                    render_histogram(
                        out,
                        name,
                        &labels,
                        LATENCY_BUCKETS_NS,
                        &cumulative,
                        sums[i],
                        h.len(),
                    );
                }
            }
        }
    });
}
