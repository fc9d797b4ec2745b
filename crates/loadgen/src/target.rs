//! What the generator drives: the [`Target`] trait, and the in-process deployment that
//! implements it today (one [`Engine`] per market on its own thread behind bounded queues).
//!
//! A target takes commands and gives back, for each, the core's answer events with the time
//! they reached the client. It does not schedule and does not measure: the generator stamps
//! the scheduled time and computes latency, so every target is measured the same way. The
//! gateway target (FIX or binary sessions over loopback) and the cluster target (gateways in
//! front of replicated cores) will implement the same trait, translating execution reports
//! back into [`Event`]s; until they exist a profile that asks for them fails before the run.

use bourse_core::*;
use bourse_engine::{Engine, EngineConfig};
use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError, TrySendError};
use serde::{Deserialize, Serialize};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Time spent in each stage a target can see, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stages {
    /// From the submit to the core starting on the command (queue into the core: the "IPC"
    /// leg of LTP's table; later also network and sequencing).
    pub queue_in_ns: u64,
    /// The core applying the command (LTP's "matching").
    pub matching_ns: u64,
    /// From the core finishing to the answer reaching the client (queue back).
    pub queue_out_ns: u64,
}

/// The tag of an [`Answer`] that answers no command of this client: events about its
/// orders caused by another client's command (its resting order traded, as an execution
/// report would tell a session).
pub const NOTIFY_TAG: u64 = u64::MAX;

/// The answer to one submitted command, or a notification ([`NOTIFY_TAG`]).
#[derive(Clone, Debug)]
pub struct Answer {
    /// The tag given at submit.
    pub tag: u64,
    /// The market (index into the profile's markets) the events come from.
    pub market: usize,
    /// When the answer reached the client.
    pub received: Instant,
    /// Stage times, where the target can measure them.
    pub stages: Option<Stages>,
    /// What the core said, in order.
    pub events: Vec<Event>,
    /// The target refused the request as busy (overload: a gateway's busy or throttle
    /// reject); `events` then hold one `CommandRejected`.
    pub busy: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue to the core is full: try again after draining answers. Commands wait in the
    /// generator, and their wait counts in their latency (open loop).
    Full,
    /// The target is gone (a core thread ended).
    Closed(String),
}

/// One client connection to a deployment: a session (or a set of sessions) of one generator
/// worker. Implementations must never block in `submit`; `poll` may wait up to `wait`.
pub trait Target: Send {
    /// Sends `command` to the core of market `market` (an index into the profile's markets).
    fn submit(&mut self, tag: u64, market: usize, command: Command) -> Result<(), SubmitError>;
    /// Moves answers that have arrived into `out`, waiting up to `wait` for the first one.
    /// Returns how many were added.
    fn poll(&mut self, out: &mut Vec<Answer>, wait: Duration) -> Result<usize, SubmitError>;
}

/// What a core did over the measured run, as the core itself counts it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CoreTotals {
    pub market: String,
    /// Commands the core applied during the run: those from the gateways' links when the
    /// deployment tells sources apart (`applied_by_source`), else all of them.
    pub commands: u64,
    pub orders_accepted: u64,
    pub orders_rejected: u64,
    pub trades: u64,
    pub cancels: u64,
    pub replaces: u64,
    pub live_orders_at_end: u64,
    pub setup_commands: u64,
    pub setup_rejected: u64,
    pub setup_ms: u64,
    pub state_hash: String,
    /// Commands the gateways passed on to this core during the run (`None`: no gateway; the
    /// generator hands commands to the core itself). A gateway answers some requests itself
    /// (a cancel of an order it knows has left, a full queue), so this can be below the
    /// commands sent; the core must have applied exactly these.
    #[serde(default)]
    pub commands_forwarded: Option<u64>,
    /// Commands the gateways passed on to this core from sessions that are not the
    /// generator's (a person trading beside it in the demo). The cores' counts include them,
    /// so the checks that compare the generator's view with the cores' cannot hold exactly.
    #[serde(default)]
    pub commands_other: u64,
    /// The commands this core applied during the run by who sent them, told apart by the
    /// client id each arrived under (`None`: the deployment cannot tell them apart; then
    /// `commands` is everything the core applied). The cores take commands from more than the
    /// gateways: an operator's deposit through the admin API, a clearing run's cash
    /// movements. The checks compare the gateways' forwarded count with what came from the
    /// gateways' links alone, and want every other command attributed to a known source.
    #[serde(default)]
    pub applied_by_source: Option<AppliedBySource>,
    /// Trades a market data subscriber of this core saw on the feed during the run (`None`:
    /// no feed in this deployment).
    #[serde(default)]
    pub md_trades: Option<u64>,
    /// The state hash of every replica at the end (`None`: the core is not replicated).
    #[serde(default)]
    pub replica_hashes: Option<Vec<String>>,
    /// Stages of the path the deployment timed itself over the run (warm-up included), by
    /// [`StageFigure::name`]: `link_round_trip`, `group_answer`, `stream_after_answer` (a
    /// gateway's link to the core), `journal_fsync` (the replicas' journals),
    /// `replica_apply_spread` (how much later the last replica applied an entry than the
    /// first), and `md_publication_delay` (a trade's apply to its Trade record read from the
    /// market data feed). Empty: the deployment times nothing.
    #[serde(default)]
    pub stage_figures: Vec<StageFigure>,
    /// The market data publication delay (`md_publication_delay`) of the trades read in each
    /// second of the run, indexed as the generator's seconds (empty: not timed per second).
    #[serde(default)]
    pub md_delay_by_second: Vec<crate::generator::HistogramWire>,
}

/// The commands a core applied during a run, by source (see
/// [`CoreTotals::applied_by_source`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedBySource {
    /// Through the gateways' links: the generator's sessions and anyone trading beside them.
    pub gateways: u64,
    /// The admin API's clients: an operator's actions (a deposit, a halt, added accounts)
    /// and the schedule driver's phase changes.
    pub admin: u64,
    /// Clearing runs: their cash movements.
    pub clearing: u64,
    /// The deployment's setup clients (instruments, funded accounts); they finish before the
    /// run, so this stays 0 unless one was still applying.
    pub setup: u64,
    /// Under a client id that no source of the deployment uses: a program the deployment
    /// does not know reached the core.
    pub unknown: u64,
}

impl AppliedBySource {
    /// Each source with its name as reports print it, in report order.
    pub fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("gateways", self.gateways),
            ("admin", self.admin),
            ("clearing", self.clearing),
            ("setup", self.setup),
            ("unknown", self.unknown),
        ]
    }

    /// Every source's count added up.
    pub fn total(&self) -> u64 {
        self.named().iter().map(|(_, n)| n).sum()
    }

    /// The sum of `self` and `other`, source by source.
    pub fn plus(&self, other: &AppliedBySource) -> AppliedBySource {
        AppliedBySource {
            gateways: self.gateways + other.gateways,
            admin: self.admin + other.admin,
            clearing: self.clearing + other.clearing,
            setup: self.setup + other.setup,
            unknown: self.unknown + other.unknown,
        }
    }
}

/// One stage a deployment timed (see [`CoreTotals::stage_figures`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StageFigure {
    pub name: String,
    /// What the stage covers, in words.
    pub what: String,
    pub latency: crate::results::Latency,
}

enum ToCore {
    Command {
        tag: u64,
        worker: u16,
        sent: Instant,
        command: Command,
    },
    /// Applied at once, before the run; the reply says how many were rejected. Accounts
    /// added here belong to `worker`: events about their orders reach that worker.
    Setup {
        worker: u16,
        commands: Vec<Command>,
        reply: Sender<(u64, u64)>,
    },
}

struct FromCore {
    tag: u64,
    market: u16,
    sent: Instant,
    started: Instant,
    done: Instant,
    events: Vec<Event>,
}

/// The in-process deployment: one engine per market, each on its own thread.
pub struct InProcess {
    markets: Vec<String>,
    to_cores: Vec<Sender<ToCore>>,
    answer_rx: Vec<Option<Receiver<FromCore>>>,
    cores: Vec<JoinHandle<CoreTotals>>,
    clock_origin: (Instant, u64),
}

/// Nanoseconds since the Unix epoch now, for the commands' `ts_ns` (the gateway's stamp).
fn epoch_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl InProcess {
    /// Starts one core thread per market. `workers` answer queues are made, one per
    /// [`InProcess::connect`]; `orders_max` sizes each core's order pool.
    pub fn start(
        markets: &[String],
        workers: usize,
        queue_capacity: usize,
        orders_max: u32,
        accounts_max: u32,
    ) -> std::io::Result<InProcess> {
        let mut answer_tx = Vec::new();
        let mut answer_rx = Vec::new();
        for _ in 0..workers {
            // Room for every core's full queue, so a core rarely waits on a slow client.
            let (tx, rx) = bounded(queue_capacity * markets.len().max(1));
            answer_tx.push(tx);
            answer_rx.push(Some(rx));
        }
        let mut to_cores = Vec::new();
        let mut cores = Vec::new();
        for (index, name) in markets.iter().enumerate() {
            let (tx, rx) = bounded::<ToCore>(queue_capacity);
            let replies = answer_tx.clone();
            let market = name.clone();
            let config = EngineConfig {
                orders_max,
                accounts_max: accounts_max.max(1),
                ..EngineConfig::default()
            };
            let handle = std::thread::Builder::new()
                .name(format!("core-{name}"))
                .spawn(move || core_loop(market, index as u16, config, rx, replies))?;
            to_cores.push(tx);
            cores.push(handle);
        }
        Ok(InProcess {
            markets: markets.to_vec(),
            to_cores,
            answer_rx,
            cores,
            clock_origin: (Instant::now(), epoch_ns()),
        })
    }

    /// Applies setup commands (instruments, accounts, deposits) to a market's core and waits.
    /// Returns (commands, rejected).
    pub fn setup(
        &self,
        market: usize,
        worker: usize,
        bodies: Vec<CommandBody>,
    ) -> Result<(u64, u64), String> {
        let ts = epoch_ns();
        let commands = bodies.into_iter().map(|b| Command::new(ts, b)).collect();
        let (tx, rx) = bounded(1);
        self.to_cores
            .get(market)
            .ok_or_else(|| format!("no market {market}"))?
            .send(ToCore::Setup {
                worker: worker as u16,
                commands,
                reply: tx,
            })
            .map_err(|_| format!("the core of {} has stopped", self.markets[market]))?;
        rx.recv()
            .map_err(|_| format!("the core of {} has stopped", self.markets[market]))
    }

    /// The connection of generator worker `worker` (each can be taken once).
    pub fn connect(&mut self, worker: usize) -> Option<InProcessTarget> {
        let answers = self.answer_rx.get_mut(worker)?.take()?;
        Some(InProcessTarget {
            worker: worker as u16,
            to_cores: self.to_cores.clone(),
            answers,
            clock_origin: self.clock_origin,
        })
    }

    /// Stops the cores (after every connection has been dropped) and returns their totals.
    pub fn finish(self) -> Vec<CoreTotals> {
        drop(self.to_cores);
        drop(self.answer_rx);
        self.cores
            .into_iter()
            .zip(self.markets)
            .map(|(h, market)| {
                h.join().unwrap_or_else(|_| CoreTotals {
                    market,
                    state_hash: "the core thread panicked".into(),
                    ..CoreTotals::default()
                })
            })
            .collect()
    }
}

fn core_loop(
    market: String,
    market_index: u16,
    config: EngineConfig,
    rx: Receiver<ToCore>,
    replies: Vec<Sender<FromCore>>,
) -> CoreTotals {
    let mut engine = Engine::new(config);
    let mut events: Vec<Event> = Vec::with_capacity(256);
    let mut setup_commands = 0;
    let mut setup_rejected = 0;
    let mut setup_ms = 0;
    let mut base = *engine.counters();
    let mut owners: rustc_hash::FxHashMap<AccountId, u16> = rustc_hash::FxHashMap::default();
    let mut notify: Vec<Vec<Event>> = vec![Vec::new(); replies.len()];
    // Blocking receive: on a small machine the cores, the generator and the build share two
    // CPUs, and a spinning core would steal the generator's time (crossbeam spins briefly
    // before it parks, which covers the busy case).
    for msg in rx.iter() {
        match msg {
            ToCore::Command {
                tag,
                worker,
                sent,
                command,
            } => {
                events.clear();
                let started = Instant::now();
                engine.apply(&command, &mut events);
                let done = Instant::now();
                // With several clients, tell each about its orders that another's command
                // changed (a fill of its resting order), as its session would be told, and
                // only that one: every client sees the order-log records of its own orders
                // exactly once, in an answer or in a notification (as a gateway session does).
                if replies.len() > 1 {
                    events.retain(|e| {
                        if let Event::OrderLog(l) = e {
                            match owners.get(&l.account) {
                                Some(&w) if w != worker => {
                                    notify[w as usize].push(*e);
                                    return false;
                                }
                                _ => {}
                            }
                        }
                        true
                    });
                    for (w, list) in notify.iter_mut().enumerate() {
                        if !list.is_empty() {
                            let _ = replies[w].send(FromCore {
                                tag: NOTIFY_TAG,
                                market: market_index,
                                sent: done,
                                started: done,
                                done,
                                events: std::mem::take(list),
                            });
                        }
                    }
                }
                let answer = FromCore {
                    tag,
                    market: market_index,
                    sent,
                    started,
                    done,
                    events: events.clone(),
                };
                if let Some(reply) = replies.get(worker as usize) {
                    // A client that went away no longer wants answers; the core goes on.
                    let _ = reply.send(answer);
                }
            }
            ToCore::Setup {
                worker,
                commands,
                reply,
            } => {
                let t0 = Instant::now();
                let mut rejected = 0;
                for c in &commands {
                    if let CommandBody::AddAccount(spec) = &c.body {
                        owners.insert(spec.account, worker);
                    }
                    events.clear();
                    engine.apply(c, &mut events);
                    rejected += events
                        .iter()
                        .filter(|e| {
                            matches!(
                                e,
                                Event::CommandRejected { .. }
                                    | Event::OrderRejected { .. }
                                    | Event::CancelRejected { .. }
                            )
                        })
                        .count() as u64;
                }
                setup_commands += commands.len() as u64;
                setup_rejected += rejected;
                setup_ms += t0.elapsed().as_millis() as u64;
                base = *engine.counters();
                let _ = reply.send((commands.len() as u64, rejected));
            }
        }
    }
    let c = *engine.counters();
    CoreTotals {
        market,
        commands: c.commands - base.commands,
        orders_accepted: c.orders_accepted - base.orders_accepted,
        orders_rejected: c.orders_rejected - base.orders_rejected,
        trades: c.trades - base.trades,
        cancels: c.cancels - base.cancels,
        replaces: c.replaces - base.replaces,
        live_orders_at_end: engine.live_orders() as u64,
        setup_commands,
        setup_rejected,
        setup_ms,
        state_hash: format!("{:016x}", engine.state_hash()),
        ..CoreTotals::default()
    }
}

/// One worker's connection to the in-process cores.
pub struct InProcessTarget {
    worker: u16,
    to_cores: Vec<Sender<ToCore>>,
    answers: Receiver<FromCore>,
    clock_origin: (Instant, u64),
}

impl InProcessTarget {
    fn convert(a: FromCore, received: Instant) -> Answer {
        let market = a.market as usize;
        if a.tag == NOTIFY_TAG {
            return Answer {
                tag: a.tag,
                market,
                received,
                stages: None,
                events: a.events,
                busy: false,
            };
        }
        Answer {
            tag: a.tag,
            market,
            received,
            stages: Some(Stages {
                queue_in_ns: a.started.saturating_duration_since(a.sent).as_nanos() as u64,
                matching_ns: a.done.saturating_duration_since(a.started).as_nanos() as u64,
                queue_out_ns: received.saturating_duration_since(a.done).as_nanos() as u64,
            }),
            events: a.events,
            busy: false,
        }
    }
}

/// Waits shorter than this are spent yielding rather than sleeping: a sleeping thread wakes
/// tens of microseconds late, which would add to every latency at high rates.
const SLEEP_THRESHOLD: Duration = Duration::from_micros(100);

impl Target for InProcessTarget {
    fn submit(&mut self, tag: u64, market: usize, mut command: Command) -> Result<(), SubmitError> {
        let Some(core) = self.to_cores.get(market) else {
            return Err(SubmitError::Closed(format!("no market {market}")));
        };
        let sent = Instant::now();
        command.ts_ns = self.clock_origin.1
            + sent
                .saturating_duration_since(self.clock_origin.0)
                .as_nanos() as u64;
        match core.try_send(ToCore::Command {
            tag,
            worker: self.worker,
            sent,
            command,
        }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SubmitError::Full),
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Closed(format!(
                "the core of market {market} has stopped"
            ))),
        }
    }

    fn poll(&mut self, out: &mut Vec<Answer>, wait: Duration) -> Result<usize, SubmitError> {
        let before = out.len();
        let deadline = Instant::now() + wait;
        loop {
            match self.answers.try_recv() {
                Ok(a) => {
                    let now = Instant::now();
                    out.push(Self::convert(a, now));
                    // Take what else is there without waiting.
                    while let Ok(a) = self.answers.try_recv() {
                        out.push(Self::convert(a, Instant::now()));
                    }
                    return Ok(out.len() - before);
                }
                Err(TryRecvError::Disconnected) => {
                    return Err(SubmitError::Closed("every core has stopped".into()))
                }
                Err(TryRecvError::Empty) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(0);
            }
            let left = deadline - now;
            if left > SLEEP_THRESHOLD {
                match self.answers.recv_timeout(left - SLEEP_THRESHOLD / 2) {
                    Ok(a) => {
                        out.push(Self::convert(a, Instant::now()));
                        while let Ok(a) = self.answers.try_recv() {
                            out.push(Self::convert(a, Instant::now()));
                        }
                        return Ok(out.len() - before);
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        return Err(SubmitError::Closed("every core has stopped".into()))
                    }
                }
            } else {
                std::thread::yield_now();
            }
        }
    }
}
