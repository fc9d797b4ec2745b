//! The replica checker shared by the fault tests (`cluster_kill.rs`, `netns_faults.rs`,
//! `failover_paused.rs`, `gateway_failover.rs`, which `use crate::replica_check`; it holds no
//! tests): the node processes' config, start, pause and end, the finder of the
//! leader; a client that sends one request at a time and retries it under the same key until answered, recording when each
//! acknowledgement came; the pause that lets the replicas converge; and the check that every
//! replica holds exactly the acknowledged commands (the engine's command counter equals the
//! acknowledgements) with equal state hashes and no alarm.
#![allow(dead_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bourse_cluster::client::node_status;
use bourse_cluster::net::NodeStatus;
use bourse_cluster::tokio;
use bourse_cluster::{Client, ClientError};
use bourse_core::Command;
use bourse_engine::workload::{Flow, FlowConfig};
use hdrhistogram::Histogram;

/// The longest a failover may take before a test calls it lost.
pub const FAILOVER_LIMIT: Duration = Duration::from_secs(15);
/// The longest the replicas may take to converge once the client paused.
pub const CONVERGE_LIMIT: Duration = Duration::from_secs(30);

/// Writes a `bourse node` config for a group on loopback: `settings` are the TOML lines after
/// `cluster_id` and `data_dir` (fsync, timeouts, limits), one `[[nodes]]` entry per port.
pub fn write_loopback_config(
    dir: &Path,
    cluster_id: u64,
    settings: &str,
    ports: &[u16],
) -> PathBuf {
    let path = dir.join("cluster.toml");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(
        f,
        "cluster_id = {cluster_id}\ndata_dir = {:?}\n{settings}",
        dir.join("data")
    )
    .unwrap();
    for (i, p) in ports.iter().enumerate() {
        writeln!(f, "[[nodes]]\nid = {}\naddr = \"127.0.0.1:{p}\"", i + 1).unwrap();
    }
    path
}

/// The `bourse` binary the nodes run. A long run may pin a copy of it (`BOURSE_BIN`), so that
/// rebuilds of the working tree while it runs do not change the nodes under test.
pub fn bourse_bin() -> String {
    std::env::var("BOURSE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_bourse").into())
}

/// Starts a node process; its standard error goes to `node-<id>.log` in the test directory
/// (appended across restarts), which a failure message points to.
pub fn spawn_node(dir: &Path, config: &Path, id: u64) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("node-{id}.log")))
        .unwrap();
    Process::new(bourse_bin())
        .args(["node", "--config"])
        .arg(config)
        .args(["--id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn bourse node")
}

/// The nodes' ids and addresses for a group on loopback whose node `i + 1` listens on
/// `ports[i]` (as [`write_loopback_config`] writes it).
pub fn loopback_addrs(ports: &[u16]) -> Vec<(u64, SocketAddr)> {
    ports
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, SocketAddr::from(([127, 0, 0, 1], *p))))
        .collect()
}

/// A group's node processes, by id (node `id` at index `id - 1`), killed when this is dropped
/// however the test ends: a stopped process is continued first, so that it dies.
pub struct NodeProcesses(pub Vec<Child>);

impl NodeProcesses {
    /// Starts nodes 1 to `count` of `config` with [`spawn_node`].
    pub fn start(dir: &Path, config: &Path, count: u64) -> NodeProcesses {
        NodeProcesses((1..=count).map(|id| spawn_node(dir, config, id)).collect())
    }

    pub fn pid(&self, id: u64) -> u32 {
        self.0[(id - 1) as usize].id()
    }

    /// Node `id` paused with [`pause_process`]: returns once it runs no code at all, with how
    /// long a thread of it still ran after `kill -STOP` returned.
    pub fn pause(&self, id: u64) -> Duration {
        pause_process(self.pid(id))
    }

    pub fn resume(&self, id: u64) {
        signal_process(self.pid(id), "CONT");
    }

    /// Node `id` killed (SIGKILL) and reaped.
    pub fn kill(&mut self, id: u64) {
        let child = &mut self.0[(id - 1) as usize];
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Node `id` started again (after [`NodeProcesses::kill`]).
    pub fn restart(&mut self, dir: &Path, config: &Path, id: u64) {
        self.0[(id - 1) as usize] = spawn_node(dir, config, id);
    }
}

impl Drop for NodeProcesses {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = Process::new("sh")
                .args(["-c", &format!("kill -CONT {}", c.id())])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The leader of the highest term among the nodes that answer (Raft elects at most one per
/// term, so an old leader that has not heard of the new term yet is passed over).
pub async fn leader(addrs: &[(u64, SocketAddr)], seed: u64) -> u64 {
    let limit = Instant::now() + FAILOVER_LIMIT;
    loop {
        let s = statuses(addrs).await;
        if let Some(l) = s
            .iter()
            .flatten()
            .filter(|s| s.leader == Some(s.id))
            .max_by_key(|s| s.term)
        {
            return l.id;
        }
        assert!(Instant::now() < limit, "no leader (seed {seed})");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn statuses(addrs: &[(u64, SocketAddr)]) -> Vec<Option<NodeStatus>> {
    let mut out = Vec::new();
    for (_, a) in addrs {
        out.push(node_status(*a, Duration::from_millis(300)).await.ok());
    }
    out
}

pub fn summary(h: &Histogram<u64>) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    format!(
        "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (n = {})",
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
        ms(h.max()),
        h.len()
    )
}

/// What the test and the client thread share.
pub struct Shared {
    pub stop: AtomicBool,
    /// Asks the client to stop between requests (for a consistency check).
    pub pause: AtomicBool,
    /// The client is between requests and waits for `pause` to clear.
    pub idle: AtomicBool,
    pub acked: AtomicU64,
    /// When the test started; acknowledgement times count from it.
    pub epoch: Instant,
    /// When each acknowledgement came, in µs since `epoch`, in order.
    pub ack_times_us: Mutex<Vec<u64>>,
}

impl Shared {
    pub fn new() -> Arc<Shared> {
        Arc::new(Shared {
            stop: AtomicBool::new(false),
            pause: AtomicBool::new(false),
            idle: AtomicBool::new(false),
            acked: AtomicU64::new(0),
            epoch: Instant::now(),
            ack_times_us: Mutex::new(Vec::new()),
        })
    }

    /// Microseconds since `epoch`.
    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// The longest stretch without an acknowledgement in `from_us..to_us`, counted from
    /// `from_us` (the moment of a fault or a heal): the wait for the first acknowledgement
    /// after it, or a longer gap between two later ones, or the wait from the last one to
    /// `to_us`.
    pub fn longest_silence_us(&self, from_us: u64, to_us: u64) -> u64 {
        let times = self.ack_times_us.lock().unwrap();
        let start = times.partition_point(|&t| t < from_us);
        let mut previous = from_us;
        let mut longest = 0;
        for &t in &times[start..] {
            longest = longest.max(t - previous);
            previous = t;
            if t >= to_us {
                return longest;
            }
        }
        longest.max(to_us.saturating_sub(previous))
    }
}

/// Waits until the client is between requests (after it acknowledged its in-flight one).
pub fn pause_client(shared: &Shared, seed: u64) {
    shared.pause.store(true, Ordering::SeqCst);
    let limit = Instant::now() + FAILOVER_LIMIT * 4;
    while !shared.idle.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < limit,
            "the client did not finish its request (seed {seed})"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub fn resume_client(shared: &Shared) {
    shared.idle.store(false, Ordering::SeqCst);
    shared.pause.store(false, Ordering::SeqCst);
}

/// With the client paused: waits until the three replicas applied their whole logs, then
/// checks equal state hashes, no alarm, and exactly the acknowledged commands in the history.
pub async fn check_replicas(
    addrs: &[(u64, SocketAddr)],
    acked: u64,
    seed: u64,
    dir: &Path,
) -> Vec<NodeStatus> {
    let limit = Instant::now() + CONVERGE_LIMIT;
    let finals = loop {
        let s = statuses(addrs).await;
        let all: Vec<NodeStatus> = s.into_iter().flatten().collect();
        if all.len() == 3
            && all.iter().any(|s| s.leader == Some(s.id))
            && all.windows(2).all(|w| {
                w[0].last_applied_index == w[1].last_applied_index
                    && w[0].last_applied_index == w[0].last_log_index
            })
            && all[0].engine_commands >= acked
        {
            break all;
        }
        assert!(
            Instant::now() < limit,
            "replicas did not converge (seed {seed}; logs in {}): {all:#?}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for s in &finals {
        assert!(s.alarm.is_none(), "node {} raised {:?}", s.id, s.alarm);
        assert_eq!(
            s.state_hash, finals[0].state_hash,
            "replicas differ (seed {seed}): {finals:#?}"
        );
        assert_eq!(
            s.engine_commands, acked,
            "node {}: the history holds {} commands but {acked} were acknowledged (seed {seed})",
            s.id, s.engine_commands
        );
    }
    finals
}

/// The client: one request at a time, each retried under the same key until answered.
pub fn client_thread(
    shared: Arc<Shared>,
    addrs: Vec<(u64, SocketAddr)>,
    seed: u64,
) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut flow_config = FlowConfig::exchange_core(seed);
            flow_config.accounts = 20;
            flow_config.live_orders_target = 100;
            let mut flow = Flow::new(flow_config);
            let mut client = Client::new(addrs, 1, 1);
            let mut commands: Vec<Command> = flow
                .setup()
                .into_iter()
                .map(|b| Command::new(0, b))
                .collect();
            commands.reverse();
            let mut duplicates = 0u64;
            let mut timeouts = 0u64;
            let mut ts_ns = 1u64;
            while !shared.stop.load(Ordering::SeqCst) {
                if shared.pause.load(Ordering::SeqCst) {
                    shared.idle.store(true, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                let command = commands
                    .pop()
                    .unwrap_or_else(|| Command::new(ts_ns, flow.next_command()));
                ts_ns += 1;
                let mut attempts = 0u64;
                loop {
                    match client
                        .submit_for_events(&command, Duration::from_secs(5))
                        .await
                    {
                        Ok((ack, events)) => {
                            duplicates += ack.duplicate as u64;
                            flow.observe(&events);
                            shared.ack_times_us.lock().unwrap().push(shared.now_us());
                            shared.acked.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        Err(ClientError::Timeout { .. }) => {
                            // Unanswered: it may or may not be applied; same key again.
                            timeouts += 1;
                            attempts += 1;
                            assert!(attempts < 20, "the group stopped answering (seed {seed})");
                        }
                        Err(e) => panic!("request refused: {e}"),
                    }
                }
            }
            (duplicates, timeouts)
        })
    })
}

/// Sends signal `name` (as `kill` names it: STOP, CONT, KILL) to process `pid`.
pub fn signal_process(pid: u32, name: &str) {
    let ok = Process::new("sh")
        .args(["-c", &format!("kill -{name} {pid}")])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} {pid}");
}

/// Whether every thread of process `pid` is stopped (state `T` in /proc). A thread that
/// exits meanwhile (gone, or a zombie) runs no code and is passed over.
pub fn process_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // The state is the first field after the command name, which ends at the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if !matches!(state, Some("T" | "t" | "Z" | "X")) {
            return false;
        }
    }
    true
}

/// Pauses process `pid` (SIGSTOP) and returns once every one of its threads has stopped.
///
/// kill(2) returns when the signal is queued, not when it has taken effect: the kernel wakes
/// one thread to take it, and only when that thread gets a CPU does it stop the others. On a
/// loaded machine the process's other threads go on meanwhile, for milliseconds, long enough
/// for a node to commit and answer a request sent after `kill -STOP` returned (what
/// `failover_paused` saw in session 17). Past this call the process runs no code at all.
/// Returns how long after `kill` returned the last thread was seen running (zero if none was).
pub fn pause_process(pid: u32) -> Duration {
    signal_process(pid, "STOP");
    let signalled = Instant::now();
    let limit = signalled + FAILOVER_LIMIT;
    let mut running_until = None;
    while !process_stopped(pid) {
        running_until = Some(signalled.elapsed());
        assert!(Instant::now() < limit, "process {pid} did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    running_until.unwrap_or_default()
}
