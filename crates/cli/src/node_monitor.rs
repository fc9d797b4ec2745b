//! Monitoring of one replica node (`bourse node --monitor-listen ADDR`): its `/metrics`, its
//! dashboard with the cluster view, fed from what the node exposes:
//!
//! - `Node::status_brief()` (own status, every `status_poll_ms`) and
//!   `client::node_status_brief` over the client protocol for each peer (one task per peer,
//!   same period): positions, the newest hash checkpoint and the commit index, without
//!   hashing the state;
//! - the node's stage histograms (`Node::stages`): one interval taken per status poll, for
//!   `bourse_node_stage_seconds{stage}` and the dashboard's node path table (queue, propose,
//!   replicate, commit_apply, reply, md_published, ae_round_trip, follower_append);
//! - the node's hooks (`Node::hooks`): t2 stamps of sampled requests matched with journal
//!   appends for the t2→t3 leg; `Node::batcher_queue_depth`; the state machine's snapshot
//!   build times;
//! - openraft's metrics watch (`node.raft().metrics()`): leader's quorum-matched index and
//!   the applied index, each time they change, for the entry stage legs;
//! - the committed stream (`Node::subscribe`): the events of every applied request, counted
//!   as transactions, orders, trades, cancels and rejects;
//! - the journal's and snapshot store's counters, found by directory
//!   (`bourse_journal::journal_stats_for`).
//!
//! Everything here runs on the node's runtime inside the `bourse node` loop; the HTTP server
//! runs on its own thread (`DashboardServer`), so a flood of dashboard clients costs that
//! thread, not the node's workers.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use bourse_cluster::client::node_status_brief;
use bourse_cluster::stages::StageInterval;
use bourse_cluster::tokio;
use bourse_cluster::tokio::sync::mpsc;
use bourse_cluster::{ClusterConfig, Node, Subscription};
use bourse_journal::{JournalStats, SnapshotStats};
use bourse_monitor::node::{
    quorum_index, BucketReading, JournalReading, NodeSample, Progress, SnapshotReading,
};
use bourse_monitor::{DashboardServer, Monitor, MonitorConfig, NodeMetrics};

/// Peer samples waiting for the node loop, at most (a slow loop drops the newest).
const PEER_SAMPLES_QUEUED_MAX: usize = 64;
/// How long one peer status query may take.
const PEER_STATUS_TIMEOUT_MS: u64 = 800;

/// Reads a monitor config file (TOML, every key optional) or the defaults.
pub fn load_config(path: Option<&Path>, node_name: String) -> Result<MonitorConfig> {
    let mut config = match path {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            MonitorConfig::from_toml(&text).map_err(|e| anyhow!("{}: {e}", p.display()))?
        }
        None => MonitorConfig::default(),
    };
    config.node_name = node_name;
    Ok(config)
}

/// The monitoring of one running node.
pub struct NodeMonitor {
    server: DashboardServer,
    metrics: NodeMetrics,
    members: usize,
    peers_rx: mpsc::Receiver<NodeSample>,
    peer_tasks: Vec<tokio::task::JoinHandle<()>>,
    journal_dir: std::path::PathBuf,
    snapshot_dir: std::path::PathBuf,
    journal: Option<Arc<JournalStats>>,
    snapshots: Option<Arc<SnapshotStats>>,
    subscription: Option<Subscription>,
    next_status: Instant,
    status_period: Duration,
    /// The node's stage histograms of the last interval (swapped in, reused every poll).
    stage_interval: StageInterval,
}

impl NodeMonitor {
    /// Starts the dashboard server on `listen` (read-only endpoints, any address) and the peer pollers.
    pub async fn start(
        node: &Node,
        config: &ClusterConfig,
        listen: SocketAddr,
        monitor_config: MonitorConfig,
    ) -> Result<NodeMonitor> {
        let id = node.id();
        let status_period = Duration::from_millis(monitor_config.status_poll_ms);
        // t2 stamps inside the node: as often as the other probes sample.
        node.hooks().set_sample_every(monitor_config.sample_every);
        let monitor = Monitor::new(monitor_config);
        let server = DashboardServer::start(monitor.clone(), listen)
            .with_context(|| format!("monitor: binding {listen}"))?;
        let members: Vec<u64> = config.nodes.iter().map(|n| n.id).collect();
        let core = format!("cluster-{}", config.cluster_id);
        let metrics = NodeMetrics::new(monitor.clone(), id, &members, &core);
        let (tx, peers_rx) = mpsc::channel(PEER_SAMPLES_QUEUED_MAX);
        let mut peer_tasks = Vec::new();
        for n in config.nodes.iter().filter(|n| n.id != id) {
            let addr = config.addr_of(n.id).expect("validated config");
            let tx = tx.clone();
            peer_tasks.push(tokio::spawn(async move {
                let mut every = tokio::time::interval(status_period);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    // An unreachable peer sends nothing: the view marks it down by silence.
                    if let Ok(s) =
                        node_status_brief(addr, Duration::from_millis(PEER_STATUS_TIMEOUT_MS)).await
                    {
                        if tx.try_send(bourse_venue::sample_of(&s)).is_err() && tx.is_closed() {
                            return;
                        }
                    }
                }
            }));
        }
        let dir = config.node_dir(id);
        Ok(NodeMonitor {
            server,
            metrics,
            members: members.len(),
            peers_rx,
            peer_tasks,
            journal_dir: dir.join("journal"),
            snapshot_dir: dir.join("snapshots"),
            journal: None,
            snapshots: None,
            subscription: None,
            next_status: Instant::now(),
            status_period,
            stage_interval: StageInterval::new(),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// Observes the node for `period`, then returns (the caller's loop checks its stop flag
    /// and the alarm in between).
    pub async fn run_for(&mut self, node: &Node, period: Duration) {
        let deadline = tokio::time::Instant::now() + period;
        // A fresh receiver each call (its type is openraft's, which this crate does not name).
        let mut raft_metrics = node.raft().metrics();
        loop {
            if Instant::now() >= self.next_status {
                self.next_status = Instant::now() + self.status_period;
                self.poll_own(node).await;
            }
            if self.subscription.is_none() {
                // Start at the next entry to apply; a future index is allowed.
                let from = raft_metrics
                    .borrow()
                    .last_applied
                    .map_or(0, |l| l.index + 1);
                self.subscription = node.subscribe(from).ok();
            }
            let wake = tokio::time::Instant::from_std(self.next_status).min(deadline);
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                }
                changed = raft_metrics.changed() => {
                    if changed.is_err() {
                        // openraft stopped; nothing more to watch.
                        tokio::time::sleep_until(deadline).await;
                        break;
                    }
                    let progress = {
                        let m = raft_metrics.borrow_and_update();
                        let committed = m.replication.as_ref().and_then(|r| {
                            let matched: Vec<(u64, Option<u64>)> =
                                r.iter().map(|(id, l)| (*id, l.map(|l| l.index))).collect();
                            quorum_index(self.members, &matched)
                        });
                        Progress {
                            committed,
                            applied: m.last_applied.map(|l| l.index),
                        }
                    };
                    self.on_progress(node, progress);
                }
                entry = next_entry(&mut self.subscription) => match entry {
                    Some(Ok(entry)) => {
                        for r in &entry.requests {
                            // A retried request answered from the idempotency table carries the events
                            // of its first application again: counting them twice would overstate
                            // orders and trades (seen as 3 extra orders in a loaded demo).
                            if r.kind != bourse_cluster::OutcomeKind::Applied {
                                continue;
                            }
                            if let Ok(events) = bourse_core::codec::decode_events(&r.events) {
                                self.metrics.on_applied_events(&events);
                            }
                        }
                    }
                    // Lagged, gap, closed: resubscribe from the present on the next turn.
                    Some(Err(_)) | None => self.subscription = None,
                },
                Some(peer) = self.peers_rx.recv() => self.metrics.observe_peer(&peer),
            }
        }
        self.metrics.publish_events();
    }

    fn on_progress(&mut self, node: &Node, progress: Progress) {
        let now = Instant::now();
        if self.journal.is_none() {
            self.journal = bourse_journal::journal_stats_for(&self.journal_dir);
        }
        if !self.metrics.samples_entries() {
            return;
        }
        let seen = self.metrics.appends_seen_to();
        let appends = self
            .journal
            .as_ref()
            .map(|j| j.append_times_after(seen))
            .unwrap_or_default();
        self.metrics.on_progress(now, progress, &appends);
        let handoffs: Vec<(u64, Instant)> = node
            .hooks()
            .take_handoffs()
            .iter()
            .map(|h| (h.index, h.queued_at))
            .collect();
        if !handoffs.is_empty() {
            self.metrics.on_handoffs(&handoffs);
        }
    }

    async fn poll_own(&mut self, node: &Node) {
        // The brief status: no hash of the whole state under the state machine's lock (the
        // cluster view compares the replicas' newest checkpoints instead).
        let s = node.status_brief().await;
        self.metrics.observe(&bourse_venue::sample_of(&s));
        self.metrics.publish_events();
        self.metrics
            .observe_batcher_queue(node.batcher_queue_depth() as u64);
        let refusals = node.refusals().all();
        self.metrics.observe_refusals(&refusals);
        node.stages().take_interval(&mut self.stage_interval);
        self.metrics
            .observe_node_stages(self.stage_interval.latencies());
        let build = node.state_machine().snapshot_build_times();
        self.metrics.observe_snapshot_builds(&BucketReading {
            buckets: &build.buckets,
            sum_ns: build.sum_ns,
            count: build.count,
        });
        if self.journal.is_none() {
            self.journal = bourse_journal::journal_stats_for(&self.journal_dir);
        }
        if let Some(j) = &self.journal {
            let r = j.snapshot();
            self.metrics.observe_journal(&JournalReading {
                bytes_appended: r.bytes_appended,
                records_appended: r.records_appended,
                fsync: BucketReading {
                    buckets: &r.fsync.buckets,
                    sum_ns: r.fsync.sum_ns,
                    count: r.fsync.count,
                },
            });
        }
        if self.snapshots.is_none() {
            self.snapshots = bourse_journal::snapshot_stats_for(&self.snapshot_dir);
        }
        if let Some(st) = &self.snapshots {
            let r = st.snapshot();
            self.metrics.observe_snapshots(&SnapshotReading {
                written: r.written,
                bytes_total: r.bytes_total,
                bytes_last: r.bytes_last,
                write: BucketReading {
                    buckets: &r.write.buckets,
                    sum_ns: r.write.sum_ns,
                    count: r.write.count,
                },
            });
        }
    }
}

impl Drop for NodeMonitor {
    fn drop(&mut self) {
        for t in &self.peer_tasks {
            t.abort();
        }
    }
}

async fn next_entry(
    sub: &mut Option<Subscription>,
) -> Option<Result<Arc<bourse_cluster::CommittedEntry>, bourse_cluster::StreamError>> {
    match sub {
        Some(s) => Some(s.recv().await),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_journal_exports_over_the_monitors_latency_buckets() {
        // The journal's fsync histogram is mirrored bucket for bucket.
        assert_eq!(
            bourse_journal::FSYNC_BUCKETS_NS,
            bourse_monitor::metrics::LATENCY_BUCKETS_NS
        );
    }
}
