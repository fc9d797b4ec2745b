//! `bourse node`, `bourse cluster up|status|snapshot` and `bourse bench cluster`: a trading
//! core replicated on three nodes (see the `bourse-cluster` crate).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bourse_cluster::batch::{decode_events, encode_command, LogCommand};
use bourse_cluster::client::{node_snapshot, node_status};
use bourse_cluster::net::{decode_message, encode_frame, NodeStatus, Request, Response, Tagged};
use bourse_cluster::tokio;
use bourse_cluster::{ClusterConfig, FsyncSetting, Node, OutcomeKind, ReplicatedState};
use bourse_core::Command;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::EngineConfig;
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use serde_json::json;

use crate::report::{self, histogram, record, Latency, Machine};

/// How long `cluster up` waits for the first leader before it reports a problem.
const LEADER_WAIT_MS_MAX: u64 = 10_000;
/// How long a status query waits for one node.
const STATUS_TIMEOUT_MS: u64 = 1_000;

#[derive(Args)]
pub struct NodeArgs {
    /// The cluster's configuration (TOML; see examples/cluster.toml).
    #[arg(long)]
    config: PathBuf,
    /// This node's id in the configuration.
    #[arg(long)]
    id: u64,
    /// Serve `/metrics` and the dashboard (with the group's cluster view) on this loopback
    /// address, e.g. 127.0.0.1:9101 (port 0: any free port; the address is printed).
    #[arg(long)]
    monitor_listen: Option<SocketAddr>,
    /// Monitoring settings (TOML: sample_every, status_poll_ms, [alerts], …; see
    /// crates/monitor/monitor.example.toml). Needs --monitor-listen.
    #[arg(long, requires = "monitor_listen")]
    monitor_config: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Start every node of the configuration as a local process, report the leader, and run
    /// until interrupted.
    Up {
        #[arg(long, default_value = "examples/cluster.toml")]
        config: PathBuf,
    },
    /// Leader, term, log, commit/apply index, lag and state hash of every node.
    Status {
        #[arg(long, default_value = "examples/cluster.toml")]
        config: PathBuf,
        /// One JSON object per node.
        #[arg(long)]
        json: bool,
    },
    /// Ask nodes to take a snapshot now.
    Snapshot {
        #[arg(long, default_value = "examples/cluster.toml")]
        config: PathBuf,
        /// Only this node (default: all).
        #[arg(long)]
        id: Option<u64>,
    },
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")
}

fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    // Only one handler per process; a second call fails harmlessly.
    let _ = ctrlc::set_handler(move || s.store(true, Ordering::SeqCst));
    stop
}

/// `bourse node`: one member of the group, until interrupted or killed.
pub fn node(args: NodeArgs) -> Result<()> {
    let config = ClusterConfig::load(&args.config).map_err(|e| anyhow!(e))?;
    let stop = stop_flag();
    let rt = runtime()?;
    rt.block_on(async {
        let node = Node::start(&config, args.id)
            .await
            .map_err(|e| anyhow!(e))?;
        eprintln!("bourse node {}: serving on {}", args.id, node.addr);
        // The core's market data: sent by this node while it leads (see `[marketdata]`).
        let market_data = match &config.marketdata {
            Some(section) => {
                let md = bourse_cluster::marketdata::MarketDataService::start(&node, section)
                    .map_err(|e| anyhow!(e))?;
                eprintln!(
                    "bourse node {}: market data on 127.0.0.1 from UDP port {} (sent while leading)",
                    args.id, section.base_port
                );
                Some(md)
            }
            None => None,
        };
        let mut monitor = match args.monitor_listen {
            Some(listen) => {
                let mconfig = crate::node_monitor::load_config(
                    args.monitor_config.as_deref(),
                    format!("node {} of cluster {}", args.id, config.cluster_id),
                )?;
                let m = crate::node_monitor::NodeMonitor::start(&node, &config, listen, mconfig)
                    .await?;
                eprintln!(
                    "bourse node {}: dashboard http://{}/ metrics http://{}/metrics",
                    args.id,
                    m.addr(),
                    m.addr()
                );
                Some(m)
            }
            None => None,
        };
        while !stop.load(Ordering::SeqCst) {
            match &mut monitor {
                Some(m) => m.run_for(&node, Duration::from_millis(100)).await,
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            if let Some(alarm) = node.alarm() {
                drop(market_data);
                node.shutdown().await;
                bail!("node {} taken out: {alarm}", args.id);
            }
        }
        drop(market_data);
        node.shutdown().await;
        Ok(())
    })
}

pub fn run(command: ClusterCommand) -> Result<()> {
    match command {
        ClusterCommand::Up { config } => up(&config),
        ClusterCommand::Status { config, json } => {
            let config = ClusterConfig::load(&config).map_err(|e| anyhow!(e))?;
            let statuses = runtime()?.block_on(statuses(&config));
            print_status(&config, &statuses, json);
            Ok(())
        }
        ClusterCommand::Snapshot { config, id } => {
            let config = ClusterConfig::load(&config).map_err(|e| anyhow!(e))?;
            runtime()?.block_on(async {
                for n in &config.nodes {
                    if id.is_some_and(|id| id != n.id) {
                        continue;
                    }
                    let addr = config.addr_of(n.id).expect("validated");
                    node_snapshot(addr, Duration::from_secs(30))
                        .await
                        .with_context(|| format!("node {}", n.id))?;
                    println!("node {}: snapshot taken", n.id);
                }
                Ok(())
            })
        }
    }
}

async fn statuses(config: &ClusterConfig) -> Vec<(u64, Result<NodeStatus, String>)> {
    let mut out = Vec::new();
    for n in &config.nodes {
        let addr = config.addr_of(n.id).expect("validated");
        let s = node_status(addr, Duration::from_millis(STATUS_TIMEOUT_MS))
            .await
            .map_err(|e| e.to_string());
        out.push((n.id, s));
    }
    out
}

fn print_status(
    config: &ClusterConfig,
    statuses: &[(u64, Result<NodeStatus, String>)],
    json: bool,
) {
    let leader = statuses
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .find(|s| s.leader == Some(s.id));
    let lag = |id: u64| -> Option<u64> {
        let l = leader?;
        let last = l.last_log_index?;
        let matched = l.matched.iter().find(|(n, _)| *n == id)?.1;
        Some(last.saturating_sub(matched.unwrap_or(0)))
    };
    if json {
        for (id, s) in statuses {
            let o = match s {
                Ok(s) => json!({"node": id, "status": s, "lag_entries": lag(*id)}),
                Err(e) => json!({"node": id, "error": e}),
            };
            println!("{o}");
        }
        return;
    }
    println!(
        "cluster {} — leader {}",
        config.cluster_id,
        leader.map_or("unknown".to_string(), |l| format!(
            "node {} (term {})",
            l.id, l.term
        ))
    );
    println!(
        "  {:<5} {:<10} {:>5} {:>12} {:>12} {:>12} {:>8} {:>16} {:>7}  alarm",
        "node", "state", "term", "last log", "applied", "snapshot", "lag", "state hash", "checks"
    );
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for (id, s) in statuses {
        match s {
            Ok(s) => println!(
                "  {:<5} {:<10} {:>5} {:>12} {:>12} {:>12} {:>8} {:>16x} {:>7}  {}",
                id,
                s.state,
                s.term,
                opt(s.last_log_index),
                opt(s.last_applied_index),
                opt(s.snapshot_index),
                opt(lag(*id)),
                s.state_hash,
                s.hash_checks_passed,
                s.alarm.as_deref().unwrap_or("-")
            ),
            Err(e) => println!("  {id:<5} unreachable: {e}"),
        }
    }
}

fn spawn_node(config_path: &Path, id: u64) -> Result<Child> {
    let exe = std::env::current_exe().context("current executable")?;
    Process::new(exe)
        .arg("node")
        .arg("--config")
        .arg(config_path)
        .arg("--id")
        .arg(id.to_string())
        .spawn()
        .with_context(|| format!("spawning node {id}"))
}

/// `bourse cluster up`: every node as a child process of this one.
fn up(config_path: &Path) -> Result<()> {
    let config = ClusterConfig::load(config_path).map_err(|e| anyhow!(e))?;
    let stop = stop_flag();
    let mut children = Vec::new();
    for n in &config.nodes {
        children.push((n.id, spawn_node(config_path, n.id)?));
    }
    let rt = runtime()?;
    let started = Instant::now();
    let mut reported = false;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        for (id, child) in &mut children {
            if let Ok(Some(status)) = child.try_wait() {
                eprintln!("bourse cluster: node {id} exited with {status}");
            }
        }
        children.retain_mut(|(_, c)| matches!(c.try_wait(), Ok(None)));
        if children.is_empty() {
            bail!("every node exited");
        }
        if !reported {
            let s = rt.block_on(statuses(&config));
            if s.iter()
                .any(|(_, s)| s.as_ref().is_ok_and(|s| s.leader == Some(s.id)))
            {
                print_status(&config, &s, false);
                println!(
                    "cluster up; `bourse cluster status --config {}` for more; Ctrl-C stops it",
                    config_path.display()
                );
                reported = true;
            } else if started.elapsed() > Duration::from_millis(LEADER_WAIT_MS_MAX) {
                print_status(&config, &s, false);
                eprintln!("bourse cluster: no leader after {LEADER_WAIT_MS_MAX} ms");
                reported = true;
            }
        }
    }
    for (_, child) in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(())
}

// ----- bourse bench cluster -----

#[derive(Args)]
pub struct ClusterBenchArgs {
    /// Seconds of load per scenario.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
    /// Offered rates in commands/s (a saturation run follows them).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    rates: Vec<u64>,
    /// fsync modes to run: always, never, or both.
    #[arg(long, default_value = "both")]
    fsync: String,
    /// Requests in flight at most (the saturation run keeps this many outstanding).
    #[arg(long, default_value_t = 8192)]
    window: u64,
    /// One JSON object per scenario.
    #[arg(long)]
    json: bool,
}

/// Round trips of the loopback echo baseline.
const ECHO_ROUND_TRIPS: u32 = 20_000;
/// The most commands one scenario offers (bounds memory and time).
const BENCH_COMMANDS_MAX: u64 = 5_000_000;

fn echo_baseline() -> Result<Histogram<u64>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        for _ in 0..ECHO_ROUND_TRIPS {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        Ok(())
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    let mut h = histogram();
    let mut buf = [7u8; 64];
    for _ in 0..ECHO_ROUND_TRIPS {
        let t = Instant::now();
        c.write_all(&buf)?;
        c.read_exact(&mut buf)?;
        record(&mut h, t.elapsed().as_nanos() as u64);
    }
    server
        .join()
        .map_err(|_| anyhow!("echo server panicked"))??;
    Ok(h)
}

fn read_frame_sync(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len);
    if len > bourse_cluster::net::FRAME_SIZE_BYTES_MAX {
        return Err(std::io::Error::other("frame too large"));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)?;
    Ok(body)
}

struct ScenarioResult {
    offered_per_s: Option<u64>,
    sent: u64,
    acked: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
}

/// Open-loop load on one pipelined connection to the leader: request i is due at
/// `start + i / rate` and its latency counts from then, so a stall cannot hide itself.
fn run_scenario(
    leader: SocketAddr,
    client_id: u64,
    flow: &mut Flow,
    rate: Option<u64>,
    seconds: u64,
    window: u64,
) -> Result<ScenarioResult> {
    let mut stream = TcpStream::connect(leader)?;
    stream.set_nodelay(true)?;
    let mut reader = stream.try_clone()?;
    let total = rate.map_or(BENCH_COMMANDS_MAX, |r| {
        (r * seconds).min(BENCH_COMMANDS_MAX)
    });
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let acked = Arc::new(AtomicU64::new(0));
    let (events_tx, events_rx) = mpsc::channel::<Vec<bourse_core::Event>>();
    let due_ns: Arc<Vec<AtomicU64>> = Arc::new(
        (0..total.min(16 << 20))
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    let acked_r = acked.clone();
    let due_r = due_ns.clone();
    let reader_thread = std::thread::spawn(move || -> Result<Histogram<u64>> {
        let mut h = histogram();
        loop {
            let frame = match read_frame_sync(&mut reader) {
                Ok(f) => f,
                Err(_) => return Ok(h),
            };
            let now = start.elapsed().as_nanos() as u64;
            let msg: Tagged<Response> = decode_message(&frame)?;
            let Response::Submitted(result) = msg.body else {
                bail!("unexpected response");
            };
            let outcome = result.map_err(|e| anyhow!("request {}: {e:?}", msg.tag))?;
            if outcome.kind != OutcomeKind::Applied {
                bail!("request {} answered {:?}", msg.tag, outcome.kind);
            }
            let Some(due) = due_r.get(msg.tag as usize) else {
                bail!("response tag {} was never sent", msg.tag);
            };
            let due = due.load(Ordering::Relaxed);
            record(&mut h, now.saturating_sub(due));
            let _ = events_tx.send(decode_events(&outcome.events)?);
            acked_r.fetch_add(1, Ordering::Release);
        }
    });
    let mut sent = 0u64;
    let mut out = Vec::with_capacity(1 << 16);
    while sent < total && Instant::now() < deadline {
        while let Ok(events) = events_rx.try_recv() {
            flow.observe(&events);
        }
        let now_ns = start.elapsed().as_nanos() as u64;
        let due = rate.map_or(now_ns, |r| sent * 1_000_000_000 / r);
        if due > now_ns {
            if !out.is_empty() {
                stream.write_all(&out)?;
                out.clear();
            }
            std::thread::sleep(Duration::from_nanos((due - now_ns).min(200_000)));
            continue;
        }
        if sent - acked.load(Ordering::Acquire) >= window {
            if !out.is_empty() {
                stream.write_all(&out)?;
                out.clear();
            }
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        due_ns[sent as usize].store(due, Ordering::Relaxed);
        let command = Command::new(now_ns, flow.next_command());
        let request = Request::Submit {
            client_id,
            request_seq: sent + 1,
            command: encode_command(&command),
        };
        out.extend_from_slice(&encode_frame(&Tagged {
            tag: sent,
            body: request,
        }));
        sent += 1;
        if out.len() > 32 * 1024 || rate.is_some() {
            stream.write_all(&out)?;
            out.clear();
        }
    }
    stream.write_all(&out)?;
    // Wait for the answers still in flight (bounded).
    let drain_deadline = Instant::now() + Duration::from_secs(10);
    while acked.load(Ordering::Acquire) < sent && Instant::now() < drain_deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let elapsed = start.elapsed();
    let acked_n = acked.load(Ordering::Acquire);
    stream.shutdown(std::net::Shutdown::Both)?;
    let latency = reader_thread
        .join()
        .map_err(|_| anyhow!("reader panicked"))??;
    while let Ok(events) = events_rx.try_recv() {
        flow.observe(&events);
    }
    Ok(ScenarioResult {
        offered_per_s: rate,
        sent,
        acked: acked_n,
        elapsed,
        latency,
    })
}

/// A scratch directory for the benchmark's journals, removed when dropped.
struct BenchDir(PathBuf);

impl BenchDir {
    fn new() -> Result<BenchDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "bourse-bench-cluster-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(BenchDir(dir))
    }
}

impl Drop for BenchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_ports() -> Result<[u16; 3]> {
    let l: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()?;
    Ok([
        l[0].local_addr()?.port(),
        l[1].local_addr()?.port(),
        l[2].local_addr()?.port(),
    ])
}

fn bench_flow() -> FlowConfig {
    let mut f = FlowConfig::exchange_core(42);
    f.accounts = 100;
    f
}

/// Replays node 1's journal into a fresh state: commands/s of apply from the log.
fn replay_speed(config: &ClusterConfig) -> Result<(u64, f64)> {
    let dir = config.node_dir(1).join("journal");
    let mut state = ReplicatedState::new(
        EngineConfig {
            orders_max: config.orders_max,
            instruments_max: config.instruments_max,
            accounts_max: config.accounts_max,
            levels_per_side_hint: 64,
            first_order_id: 1,
        },
        u64::MAX,
    );
    let records = bourse_journal::Records::open(&dir, ..)?;
    let mut batches = Vec::new();
    for record in records {
        let record = record?;
        let command = bourse_cluster::storage::entry_command(&record.payload)
            .map_err(|e| anyhow!("journal record {}: {e}", record.info.index))?;
        if let Some(LogCommand::Batch(requests)) = command {
            batches.push(requests);
        }
    }
    let started = Instant::now();
    let mut outcomes = Vec::new();
    let mut commands = 0u64;
    for requests in &batches {
        outcomes.clear();
        state.apply_batch(requests, &mut outcomes);
        commands += requests.len() as u64;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    Ok((commands, commands as f64 / secs))
}

pub fn bench(args: ClusterBenchArgs) -> Result<()> {
    let modes: Vec<FsyncSetting> = match args.fsync.as_str() {
        "both" => vec![FsyncSetting::Never, FsyncSetting::Always],
        "always" => vec![FsyncSetting::Always],
        "never" => vec![FsyncSetting::Never],
        other => bail!("--fsync {other}: use always, never or both"),
    };
    if args.seconds == 0 || args.seconds > 600 {
        bail!("--seconds must be in 1..=600");
    }
    let echo = Latency::of(&echo_baseline()?);
    let machine = Machine::this();
    if !args.json {
        println!(
            "bourse bench cluster — 3 nodes in one process on loopback TCP; {} ({} cpus), version {}",
            machine.model,
            machine.cpus,
            report::version()
        );
        println!(
            "  echo round trip (64 B, loopback): p50 {}  p99 {}  p99.9 {}",
            report::ns(echo.p50),
            report::ns(echo.p99),
            report::ns(echo.p999)
        );
    }
    let rt = runtime()?;
    for mode in modes {
        let dir = BenchDir::new()?;
        let mut config = ClusterConfig::local(99, dir.0.clone(), free_ports()?);
        config.fsync = mode;
        let mode_name = format!("{mode:?}").to_lowercase();
        let nodes = rt.block_on(async {
            let mut nodes = Vec::new();
            for n in &config.nodes {
                nodes.push(Node::start(&config, n.id).await.map_err(|e| anyhow!(e))?);
            }
            Ok::<_, anyhow::Error>(nodes)
        })?;
        let leader = rt.block_on(async {
            let limit = Instant::now() + Duration::from_secs(10);
            loop {
                for n in &nodes {
                    let s = n.status().await;
                    if s.leader == Some(s.id) {
                        return Ok(n.addr);
                    }
                }
                if Instant::now() > limit {
                    bail!("no leader within 10 s");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })?;
        let mut flow = Flow::new(bench_flow());
        {
            let mut setup = bourse_cluster::Client::new(
                config
                    .nodes
                    .iter()
                    .map(|n| (n.id, n.addr.parse().expect("valid")))
                    .collect(),
                1,
                1,
            );
            rt.block_on(async {
                for body in flow.setup() {
                    setup
                        .submit(&Command::new(0, body), Duration::from_secs(10))
                        .await
                        .map_err(|e| anyhow!("setup: {e}"))?;
                }
                Ok::<_, anyhow::Error>(())
            })?;
        }
        let mut rates: Vec<Option<u64>> = args.rates.iter().map(|r| Some(*r)).collect();
        rates.push(None);
        for (i, rate) in rates.into_iter().enumerate() {
            let r = run_scenario(
                leader,
                100 + i as u64,
                &mut flow,
                rate,
                args.seconds,
                args.window,
            )?;
            let lat = Latency::of(&r.latency);
            let tput = r.acked as f64 / r.elapsed.as_secs_f64();
            let scenario = format!(
                "fsync-{mode_name}-{}",
                rate.map_or("saturation".to_string(), |r| format!("{}k", r / 1000))
            );
            let ratio = |v: u64, base: u64| (v as f64 / base.max(1) as f64 * 100.0).round() / 100.0;
            if args.json {
                println!(
                    "{}",
                    json!({
                        "bench": "cluster", "scenario": scenario, "fsync": mode_name,
                        "offered_per_s": r.offered_per_s, "throughput_per_s": tput.round() as u64,
                        "sent": r.sent, "acked": r.acked,
                        "latency_ns": lat,
                        "ratio_to_echo": {"p50": ratio(lat.p50, echo.p50), "p99": ratio(lat.p99, echo.p99), "p999": ratio(lat.p999, echo.p999)},
                        "baseline": {"echo_rtt_ns": {"p50": echo.p50, "p99": echo.p99, "p999": echo.p999}},
                        "machine": machine, "version": report::version(),
                    })
                );
            } else {
                println!(
                    "  {:<26} offered {:>9}  acked {:>9}/s  commit p50 {:>9} ({:>5.1}x echo)  p99 {:>9} ({:>5.1}x)  p99.9 {:>9} ({:>5.1}x)",
                    scenario,
                    r.offered_per_s.map_or("max".into(), report::count),
                    report::count(tput.round() as u64),
                    report::ns(lat.p50),
                    ratio(lat.p50, echo.p50),
                    report::ns(lat.p99),
                    ratio(lat.p99, echo.p99),
                    report::ns(lat.p999),
                    ratio(lat.p999, echo.p999),
                );
            }
            if r.acked < r.sent {
                eprintln!(
                    "  warning: {} of {} requests unanswered",
                    r.sent - r.acked,
                    r.sent
                );
            }
        }
        rt.block_on(async {
            for n in nodes {
                n.shutdown().await;
            }
        });
        let (commands, per_s) = replay_speed(&config)?;
        if args.json {
            println!(
                "{}",
                json!({"bench": "cluster", "scenario": format!("replay-fsync-{mode_name}"),
                       "commands": commands, "throughput_per_s": per_s.round() as u64,
                       "machine": machine, "version": report::version()})
            );
        } else {
            println!(
                "  {:<26} {} commands from node 1's journal at {} commands/s",
                format!("replay-fsync-{mode_name}"),
                report::count(commands),
                report::count(per_s.round() as u64)
            );
        }
    }
    Ok(())
}
