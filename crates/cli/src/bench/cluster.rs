//! `bourse bench cluster`: three local nodes on loopback, replicated commands/s and commit
//! latency per fsync mode (open loop at the offered rates, then saturation), beside a TCP echo
//! round trip; replay speed; where each node's time goes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bourse_cluster::batch::LogCommand;
use bourse_cluster::net::{decode_message, encode_frame_into, Request, Response, Tagged};
use bourse_cluster::tokio;
use bourse_cluster::{ClusterConfig, FsyncSetting, Node, OutcomeKind, ReplicatedState};
use bourse_core::codec::{decode_events, encode_command};
use bourse_core::Command;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::EngineConfig;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;

use super::common::{self, histogram, record, thread_cpu, Latency, Machine, ThreadCpu};

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
    /// Worker threads of each node's own runtime (2, as `bourse node` runs; 1: a
    /// current-thread runtime, where a journal fsync stalls the whole node).
    #[arg(long, default_value_t = 2)]
    node_threads: usize,
    /// The links: `direct` (the client's plain TCP straight to the leader), `relay` (plain
    /// TCP, the client through a relay thread that dials the leader as every bourse client
    /// does), `tls` (mutual TLS between the nodes and from the relay to the leader; the
    /// same relay). `relay` against `tls` is what TLS costs.
    #[arg(long, default_value = "direct")]
    links: String,
    /// One-way distances between the nodes in µs, a set of scenarios per value: each node's
    /// peers reach it through a delay line holding every byte this long each way (what
    /// separate hosts cost; the client still reaches the leader directly). 0: no line.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    distance_us: Vec<u64>,
    /// AppendEntries a leader keeps unanswered per follower (the nodes'
    /// `append_in_flight_max`): 1 one at a time, more pipelined. Default: the config's.
    #[arg(long)]
    append_in_flight: Option<usize>,
}

/// The most commands one scenario offers (bounds memory and time).
const BENCH_COMMANDS_MAX: u64 = 5_000_000;

pub(super) fn bench_flow() -> FlowConfig {
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
            batches.push((record.info.index, requests));
        }
    }
    let started = Instant::now();
    let mut outcomes = Vec::new();
    let mut commands = 0u64;
    for (index, requests) in &batches {
        outcomes.clear();
        state.apply_batch(requests, *index, &mut outcomes);
        commands += requests.len() as u64;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    Ok((commands, commands as f64 / secs))
}

pub fn bench(args: ClusterBenchArgs) -> Result<()> {
    bourse_venue::tune_allocator();
    let modes: Vec<FsyncSetting> = match args.fsync.as_str() {
        "both" => vec![FsyncSetting::Never, FsyncSetting::Always],
        "always" => vec![FsyncSetting::Always],
        "never" => vec![FsyncSetting::Never],
        other => bail!("--fsync {other}: use always, never or both"),
    };
    if args.seconds == 0 || args.seconds > 600 {
        bail!("--seconds must be in 1..=600");
    }
    if args.window == 0 || args.window > DUE_RING_SLOTS as u64 {
        bail!("--window must be in 1..={DUE_RING_SLOTS}");
    }
    if args.node_threads == 0 || args.node_threads > 8 {
        bail!("--node-threads must be in 1..=8");
    }
    let echo = Latency::of(&common::echo_baseline()?);
    let machine = Machine::this();
    if !args.json {
        println!(
            "bourse bench cluster — 3 nodes on loopback ({} links), each on its own tokio runtime ({} \
             thread{}) as if a process of its own; an open-loop client on two threads of its \
             own; {} ({} cpus), version {}",
            args.links,
            args.node_threads,
            if args.node_threads == 1 { "" } else { "s" },
            machine.model,
            machine.cpus,
            common::version()
        );
        println!(
            "  latency: from the moment a request was due (its scheduled send time) to the \
             moment the client read its answer (committed on a quorum under the fsync mode, \
             applied by the leader)"
        );
        println!(
            "  echo round trip (64 B, loopback): p50 {}  p99 {}  p99.9 {}",
            common::ns(echo.p50),
            common::ns(echo.p99),
            common::ns(echo.p999)
        );
    }
    // The client side's runtime: setup, status queries and shutdown (the load itself runs
    // on plain threads).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    if !["direct", "relay", "tls"].contains(&args.links.as_str()) {
        bail!("--links {}: use direct, relay or tls", args.links);
    }
    if let Some(d) = args
        .distance_us
        .iter()
        .find(|&&d| d > super::delay::ONE_WAY_US_MAX)
    {
        bail!(
            "--distance-us {d}: at most {} µs one way",
            super::delay::ONE_WAY_US_MAX
        );
    }
    let runs = modes
        .iter()
        .flat_map(|&m| args.distance_us.iter().map(move |&d| (m, d)));
    for (mode, distance_us) in runs {
        let dir = common::ScratchDir::new("bench-cluster")?;
        let mut config = ClusterConfig::local(99, dir.0.clone(), common::free_ports()?);
        config.fsync = mode;
        if let Some(n) = args.append_in_flight {
            config.append_in_flight_max = n;
            config
                .validate()
                .map_err(|e| anyhow!("--append-in-flight: {e}"))?;
        }
        // Kept until the nodes are gone.
        let _lines = behind_delay_lines(&mut config, distance_us)?;
        let echo = if distance_us == 0 {
            echo
        } else {
            let floor = Latency::of(&common::echo_baseline_via(Some(Duration::from_micros(
                distance_us,
            )))?);
            if !args.json {
                println!(
                    "  distance {distance_us} µs one way between the nodes (delay lines): echo round trip through a line p50 {}  p99 {}  p99.9 {} — a commit's floor (one round trip to the nearer follower); the x columns below are against it",
                    common::ns(floor.p50),
                    common::ns(floor.p99),
                    common::ns(floor.p999)
                );
            }
            floor
        };
        if args.links == "tls" {
            use_tls(&mut config, &dir.0)?;
        }
        let mode_name = format!("{mode:?}").to_lowercase();
        if !args.json {
            println!(
                "  fsync {mode_name}: AppendEntries in flight per follower at most {} ({})",
                config.append_in_flight_max,
                if config.append_in_flight_max == 1 {
                    "one at a time"
                } else {
                    "pipelined"
                }
            );
        }
        let mut nodes = Vec::new();
        for n in &config.nodes {
            nodes.push(BenchNode::start(&config, n.id, args.node_threads)?);
        }
        let leader = rt.block_on(async {
            let limit = Instant::now() + Duration::from_secs(10);
            loop {
                for (i, n) in nodes.iter().enumerate() {
                    let s = n.node().status().await;
                    if s.leader == Some(s.id) {
                        return Ok(i);
                    }
                }
                if Instant::now() > limit {
                    bail!("no leader within 10 s");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })?;
        let leader_addr = nodes[leader].node().addr;
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
            for n in &nodes {
                n.node().stages().reset();
            }
            let cpu_before = thread_cpu();
            // The flow learns its orders' ids from the leader's committed stream (answers
            // carry no events), from the next entry on.
            let next_index = rt
                .block_on(nodes[leader].node().status())
                .last_applied_index
                .map_or(0, |i| i + 1);
            let stream = nodes[leader]
                .node()
                .subscribe(next_index)
                .map_err(|e| anyhow!("stream: {e}"))?;
            let target = match args.links.as_str() {
                "direct" => leader_addr,
                _ => relay(leader_addr)?,
            };
            let r = open_loop(
                target,
                stream,
                100 + i as u64,
                &mut flow,
                rate,
                args.seconds,
                args.window,
            )?;
            let batches = nodes[leader]
                .node()
                .stages()
                .snapshot()
                .iter()
                .find(|(name, _)| *name == "batch_requests")
                .map_or(0, |(_, h)| h.len());
            let cpu = cpu_split(
                &cpu_before,
                &thread_cpu(),
                config.nodes[leader].id,
                nodes.len() - 1,
                r.acked,
                batches,
            );
            let lat = Latency::of(&r.latency);
            let tput = r.acked as f64 / r.elapsed.as_secs_f64();
            let scenario = format!(
                "fsync-{mode_name}-{}{}",
                rate.map_or("saturation".to_string(), |r| format!("{}k", r / 1000)),
                if distance_us == 0 {
                    String::new()
                } else {
                    format!("-d{distance_us}us")
                }
            );
            let ratio = |v: u64, base: u64| (v as f64 / base.max(1) as f64 * 100.0).round() / 100.0;
            let stages = stage_breakdown(&nodes, leader);
            if args.json {
                let stage_json: serde_json::Map<String, serde_json::Value> = stages
                    .iter()
                    .map(|(name, l)| (name.clone(), json!(l)))
                    .collect();
                println!(
                    "{}",
                    json!({
                        "bench": "cluster", "scenario": scenario, "fsync": mode_name,
                        "offered_per_s": r.offered_per_s, "throughput_per_s": tput.round() as u64,
                        "sent": r.sent, "acked": r.acked,
                        "latency_ns": lat,
                        "ratio_to_echo": {"p50": ratio(lat.p50, echo.p50), "p99": ratio(lat.p99, echo.p99), "p999": ratio(lat.p999, echo.p999)},
                        "baseline": {"echo_rtt_ns": {"p50": echo.p50, "p99": echo.p99, "p999": echo.p999}},
                        "stages_ns": stage_json, "node_threads": args.node_threads,
                        "append_in_flight_max": config.append_in_flight_max,
                        "distance_us": distance_us,
                        "send_lag_ns": Latency::of(&r.send_lag), "cpu": cpu,
                        "machine": machine, "version": common::version(),
                    })
                );
            } else {
                println!(
                    "  {:<24} offered {:>9}  acked {:>9}/s  commit p50 {:>9} ({:>5.1}x echo)  p99 {:>9} ({:>5.1}x)  p99.9 {:>9} ({:>5.1}x)  max {:>9}",
                    scenario,
                    r.offered_per_s.map_or("max".into(), common::count),
                    common::count(tput.round() as u64),
                    common::ns(lat.p50),
                    ratio(lat.p50, echo.p50),
                    common::ns(lat.p99),
                    ratio(lat.p99, echo.p99),
                    common::ns(lat.p999),
                    ratio(lat.p999, echo.p999),
                    common::ns(lat.max),
                );
                if !r.send_lag.is_empty() {
                    let lag = Latency::of(&r.send_lag);
                    println!(
                        "      {:<16} p50 {:>9}  p99 {:>9}  p99.9 {:>9}  max {:>9}   client: due -> put in its send buffer (part of the latency above)",
                        "send_lag",
                        common::ns(lag.p50),
                        common::ns(lag.p99),
                        common::ns(lag.p999),
                        common::ns(lag.max)
                    );
                }
                print_stages(&stages);
                println!(
                    "      {:<16} leader {} ({} waiting for a cpu), each follower {}, client {} per command; voluntary switches per batch: leader {:.1}, each follower {:.1}",
                    "cpu",
                    common::ns(cpu.leader_cpu_ns_per_command),
                    common::ns(cpu.leader_wait_ns_per_command),
                    common::ns(cpu.follower_cpu_ns_per_command),
                    common::ns(cpu.client_cpu_ns_per_command),
                    cpu.leader_switches_per_batch,
                    cpu.follower_switches_per_batch,
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
            for n in &mut nodes {
                if let Some(node) = n.node.take() {
                    node.shutdown().await;
                }
            }
        });
        drop(nodes);
        let (commands, per_s) = replay_speed(&config)?;
        if args.json {
            println!(
                "{}",
                json!({"bench": "cluster", "scenario": format!("replay-fsync-{mode_name}"),
                       "commands": commands, "throughput_per_s": per_s.round() as u64,
                       "machine": machine, "version": common::version()})
            );
        } else {
            println!(
                "  {:<24} {} commands from node 1's journal at {} commands/s",
                format!("replay-fsync-{mode_name}"),
                common::count(commands),
                common::count(per_s.round() as u64)
            );
        }
    }
    Ok(())
}

/// One node of the benchmark on a tokio runtime of its own, on a thread of its own: the
/// nodes share no scheduler, as if each were its own `bourse node` process.
pub(super) struct BenchNode {
    pub(super) node: Option<Node>,
    /// Dropping it lets the node's thread end its runtime.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BenchNode {
    pub(super) fn start(config: &ClusterConfig, id: u64, threads: usize) -> Result<BenchNode> {
        let (node_tx, node_rx) = mpsc::channel::<Result<Node>>();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let config = config.clone();
        let thread = std::thread::Builder::new()
            .name(format!("bench-node-{id}"))
            .spawn(move || {
                let rt = if threads == 1 {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                } else {
                    // Named after the node, so that the CPU accounting finds its threads.
                    tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(threads)
                        .thread_name(format!("bench-node-{id}w"))
                        .enable_all()
                        .build()
                };
                let rt = match rt {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = node_tx.send(Err(anyhow!("node {id}: runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    match Node::start(&config, id).await {
                        Ok(node) => {
                            let _ = node_tx.send(Ok(node));
                            // Drive the node's tasks until the benchmark is done with it.
                            let _ = stop_rx.await;
                        }
                        Err(e) => {
                            let _ = node_tx.send(Err(anyhow!("node {id}: {e}")));
                        }
                    }
                });
            })
            .context("node thread")?;
        let node = node_rx
            .recv()
            .map_err(|_| anyhow!("node {id}: its thread ended"))??;
        Ok(BenchNode {
            node: Some(node),
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub(super) fn node(&self) -> &Node {
        self.node.as_ref().expect("node running")
    }
}

impl Drop for BenchNode {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Where one scenario's CPU went: per command for the leader's threads, one follower's (the
/// mean of the followers) and the load client's, and voluntary context switches per batch.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub(super) struct CpuSplit {
    pub(super) leader_cpu_ns_per_command: u64,
    pub(super) follower_cpu_ns_per_command: u64,
    client_cpu_ns_per_command: u64,
    /// Time the leader's threads were ready to run but waited for a CPU (the machine's load).
    leader_wait_ns_per_command: u64,
    pub(super) leader_switches_per_batch: f64,
    pub(super) follower_switches_per_batch: f64,
}

pub(super) fn cpu_split(
    before: &std::collections::BTreeMap<u64, (String, ThreadCpu)>,
    after: &std::collections::BTreeMap<u64, (String, ThreadCpu)>,
    leader_id: u64,
    followers: usize,
    commands: u64,
    batches: u64,
) -> CpuSplit {
    let (mut leader, mut follower, mut client) = (
        ThreadCpu::default(),
        ThreadCpu::default(),
        ThreadCpu::default(),
    );
    for (tid, (name, now)) in after {
        let was = before.get(tid).map(|(_, c)| *c).unwrap_or_default();
        let into = if name.starts_with(&format!("bench-node-{leader_id}")) {
            &mut leader
        } else if name.starts_with("bench-node-") {
            &mut follower
        } else if *tid == u64::from(std::process::id()) || name == "bench-reader" {
            // The main thread (the client's writer) and its reader.
            &mut client
        } else {
            continue;
        };
        into.cpu_ns += now.cpu_ns.saturating_sub(was.cpu_ns);
        into.wait_ns += now.wait_ns.saturating_sub(was.wait_ns);
        into.switches += now.switches.saturating_sub(was.switches);
    }
    let per = |v: u64, n: u64| v / n.max(1);
    let followers = followers.max(1) as u64;
    CpuSplit {
        leader_cpu_ns_per_command: per(leader.cpu_ns, commands),
        follower_cpu_ns_per_command: per(follower.cpu_ns / followers, commands),
        client_cpu_ns_per_command: per(client.cpu_ns, commands),
        leader_wait_ns_per_command: per(leader.wait_ns, commands),
        leader_switches_per_batch: leader.switches as f64 / batches.max(1) as f64,
        follower_switches_per_batch: follower.switches as f64
            / followers as f64
            / batches.max(1) as f64,
    }
}

/// The leader's stages (see `bourse_cluster::stages`) and the followers' appends, in order.
fn stage_breakdown(nodes: &[BenchNode], leader: usize) -> Vec<(String, Latency)> {
    let mut out: Vec<(String, Latency)> = nodes[leader]
        .node()
        .stages()
        .snapshot()
        .into_iter()
        .filter(|(name, h)| *name != "follower_append" && !h.is_empty())
        .map(|(name, h)| (name.to_string(), Latency::of(&h)))
        .collect();
    let mut appends = histogram();
    for (i, n) in nodes.iter().enumerate() {
        if i == leader {
            continue;
        }
        for (name, h) in n.node().stages().snapshot() {
            if name == "follower_append" {
                let _ = appends.add(&h);
            }
        }
    }
    if !appends.is_empty() {
        out.push(("follower_append".into(), Latency::of(&appends)));
    }
    out
}

fn print_stages(stages: &[(String, Latency)]) {
    for (name, l) in stages {
        let what = match name.as_str() {
            "queue" => "leader, per batch: request read -> batcher took it",
            "propose" => "leader, per batch: batcher -> openraft client_write_ff returned",
            "replicate" => "leader, per batch: proposed -> first follower acked its AppendEntries",
            "commit_apply" => {
                "leader, per batch: that ack -> openraft answered (commit, apply, wake)"
            }
            "reply" => "leader, per write: answer queued -> written to the client socket",
            "ae_round_trip" => "leader, per AppendEntries with entries: sent -> answered",
            "follower_append" => "followers, per AppendEntries with entries: handled by openraft",
            "batch_requests" => "requests per batch",
            _ => "",
        };
        if name == "batch_requests" {
            println!(
                "      {:<16} p50 {:>9}  p99 {:>9}  max {:>9}   {what}",
                name,
                common::count(l.p50),
                common::count(l.p99),
                common::count(l.max)
            );
        } else {
            println!(
                "      {:<16} p50 {:>9}  p99 {:>9}  p99.9 {:>9}  max {:>9}   {what}",
                name,
                common::ns(l.p50),
                common::ns(l.p99),
                common::ns(l.p999),
                common::ns(l.max)
            );
        }
    }
}

/// Slots of the ring of due times, by request: at least the largest window.
const DUE_RING_SLOTS: usize = 1 << 16;
/// A writer flushes its buffer when it holds this much.
const CLIENT_WRITE_BYTES: usize = 64 * 1024;

pub(super) struct ScenarioRun {
    offered_per_s: Option<u64>,
    pub(super) sent: u64,
    pub(super) acked: u64,
    pub(super) elapsed: Duration,
    pub(super) latency: Histogram<u64>,
    send_lag: Histogram<u64>,
}

/// Offers `rate` commands/s (None: as fast as the window allows) for `seconds` to the leader
/// on one connection, open loop: each request has a due time on a fixed schedule, is sent as
/// soon as it is due (all requests due together go in one write), and its latency runs from
/// that due time, so a stalled cluster or a late client counts against the result, never
/// hides it. A reader thread matches answers by tag (the request's seq); the writer feeds the
/// flow the events of its applied requests from `stream`, the leader's committed stream.
/// Certificates of a throw-away authority for the three nodes (127.0.0.1) and the bench's
/// own client, `[tls]` in `config`, and this process reaching the nodes with them.
fn use_tls(config: &mut ClusterConfig, dir: &std::path::Path) -> Result<()> {
    let venue = bourse_testkit::certs::Authority::new(dir, "bench");
    for n in &config.nodes {
        venue.issue(&format!("node-{}", n.id), &["127.0.0.1"]);
    }
    let (cert_path, key_path) = venue.paths("node-{id}");
    config.tls = Some(bourse_cluster::TlsFiles {
        ca_path: venue.ca_path(),
        cert_path,
        key_path,
    });
    let (cert_path, key_path) = venue.issue("client", &[]);
    let client = bourse_cluster::TlsFiles {
        ca_path: venue.ca_path(),
        cert_path,
        key_path,
    };
    let addrs: Vec<SocketAddr> = config
        .nodes
        .iter()
        .filter_map(|n| n.addr.parse().ok())
        .collect();
    bourse_cluster::transport::configure_client(&addrs, Some(&client)).map_err(|e| anyhow!(e))
}

/// With `distance_us` > 0, puts a delay line in front of every node: its peers (and set-up
/// clients) dial the line's port, which is now the node's advertised address, and the node
/// listens on its old one. Returns the lines (dropping one stops it).
fn behind_delay_lines(
    config: &mut ClusterConfig,
    distance_us: u64,
) -> Result<Vec<super::delay::DelayLine>> {
    if distance_us == 0 {
        return Ok(Vec::new());
    }
    let mut lines = Vec::new();
    for n in config.nodes.iter_mut() {
        let listen: SocketAddr = n.addr.parse().context("node address")?;
        let line = super::delay::DelayLine::start(
            "127.0.0.1:0".parse()?,
            listen,
            Duration::from_micros(distance_us),
        )?;
        n.listen = Some(listen.to_string());
        n.addr = line.addr().to_string();
        lines.push(line);
    }
    Ok(lines)
}

/// A relay on a thread of its own: takes one plain connection on a loopback port (returned)
/// and joins it to `leader` through `transport::dial` (TLS when this process was told so),
/// until either side ends.
fn relay(leader: SocketAddr) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    std::thread::Builder::new()
        .name("bench-relay".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("relay runtime");
            let run = rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let (local, _) = listener.accept().await?;
                local.set_nodelay(true)?;
                let remote = bourse_cluster::transport::dial(leader).await?;
                let (mut lr, mut lw) = local.into_split();
                let (mut rr, mut rw) = remote.into_split();
                // `copy` flushes whenever its reader has nothing more for now, so nothing
                // waits in rustls' buffer.
                tokio::select! {
                    r = tokio::io::copy(&mut lr, &mut rw) => r.map(|_| ()),
                    r = tokio::io::copy(&mut rr, &mut lw) => r.map(|_| ()),
                }
            });
            if let Err(e) = run {
                eprintln!("bench relay: {e}");
            }
        })
        .context("relay thread")?;
    Ok(addr)
}

pub(super) fn open_loop(
    leader: SocketAddr,
    mut stream_in: bourse_cluster::Subscription,
    client_id: u64,
    flow: &mut Flow,
    rate: Option<u64>,
    seconds: u64,
    window: u64,
) -> Result<ScenarioRun> {
    let mut stream = TcpStream::connect(leader)?;
    stream.set_nodelay(true)?;
    let reader = stream.try_clone()?;
    let total = rate.map_or(BENCH_COMMANDS_MAX, |r| {
        (r * seconds).min(BENCH_COMMANDS_MAX)
    });
    let start = Instant::now();
    let deadline_ns = seconds * 1_000_000_000;
    let acked = Arc::new(AtomicU64::new(0));
    let due_ns: Arc<Vec<AtomicU64>> =
        Arc::new((0..DUE_RING_SLOTS).map(|_| AtomicU64::new(0)).collect());
    let acked_r = acked.clone();
    let due_r = due_ns.clone();
    let reader_thread = std::thread::Builder::new()
        .name("bench-reader".into())
        .spawn(move || -> Result<Histogram<u64>> {
            let mut h = histogram();
            let mut reader = std::io::BufReader::with_capacity(256 * 1024, reader);
            let mut frame = Vec::new();
            loop {
                let mut len = [0u8; 4];
                if reader.read_exact(&mut len).is_err() {
                    return Ok(h);
                }
                let len = u32::from_le_bytes(len);
                if len > bourse_cluster::net::FRAME_SIZE_BYTES_MAX {
                    bail!("answer frame of {len} bytes");
                }
                frame.resize(len as usize, 0);
                if reader.read_exact(&mut frame).is_err() {
                    return Ok(h);
                }
                let now = start.elapsed().as_nanos() as u64;
                let msg: Tagged<Response> = decode_message(&frame)?;
                let Response::Submitted(result) = msg.body else {
                    bail!("unexpected response");
                };
                let outcome = result.map_err(|e| anyhow!("request {}: {e:?}", msg.tag))?;
                if outcome.kind != OutcomeKind::Applied {
                    bail!("request {} answered {:?}", msg.tag, outcome.kind);
                }
                let due = due_r[(msg.tag as usize) % DUE_RING_SLOTS].load(Ordering::Acquire);
                record(&mut h, now.saturating_sub(due));
                acked_r.fetch_add(1, Ordering::Release);
            }
        })
        .context("reader thread")?;
    let mut sent = 0u64;
    let mut out: Vec<u8> = Vec::with_capacity(2 * CLIENT_WRITE_BYTES);
    // How late the client put each request in its buffer, after its due time.
    let mut send_lag = histogram();
    let result = (|| -> Result<()> {
        while sent < total {
            // The applied requests' events feed the flow, so that its cancels and replaces
            // name live orders.
            while let Some(entry) = stream_in.try_recv().map_err(|e| anyhow!("stream: {e}"))? {
                let own = |r: &&bourse_cluster::CommittedRequest| {
                    r.client_id == client_id && r.kind == OutcomeKind::Applied
                };
                for r in entry.requests.iter().filter(own) {
                    flow.observe(&decode_events(&r.events)?);
                }
            }
            let now_ns = start.elapsed().as_nanos() as u64;
            if now_ns >= deadline_ns {
                break;
            }
            let due = rate.map_or(now_ns, |r| sent * 1_000_000_000 / r);
            let window_full = sent - acked.load(Ordering::Acquire) >= window;
            if due > now_ns || window_full {
                if !out.is_empty() {
                    stream.write_all(&out)?;
                    out.clear();
                }
                // Sleep (a spinning client would take a core from the nodes on a small
                // machine); only within the last few microseconds yield instead. A sleep
                // overshoots by the timer slack (~50 us): that lateness counts against the
                // latency and is reported apart as `send_lag`.
                if window_full {
                    std::thread::sleep(Duration::from_micros(50));
                } else if due - now_ns > 20_000 {
                    std::thread::sleep(Duration::from_nanos(due - now_ns - 10_000));
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            if rate.is_some() {
                record(&mut send_lag, now_ns.saturating_sub(due));
            }
            // Keyed by the request's tag (its seq), as the reader looks it up.
            due_ns[((sent + 1) as usize) % DUE_RING_SLOTS].store(due, Ordering::Release);
            encode_frame_into(
                &mut out,
                &Tagged {
                    tag: sent + 1,
                    body: Request::Submit {
                        client_id,
                        request_seq: sent + 1,
                        command: encode_command(&Command::new(now_ns, flow.next_command())),
                    },
                },
            );
            sent += 1;
            if out.len() >= CLIENT_WRITE_BYTES {
                stream.write_all(&out)?;
                out.clear();
            }
        }
        stream.write_all(&out)?;
        Ok(())
    })();
    // Wait for the answers still in flight (bounded).
    let drain_deadline = Instant::now() + Duration::from_secs(10);
    while result.is_ok() && acked.load(Ordering::Acquire) < sent && Instant::now() < drain_deadline
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let elapsed = start.elapsed();
    let acked_n = acked.load(Ordering::Acquire);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let latency = reader_thread
        .join()
        .map_err(|_| anyhow!("reader panicked"))??;
    result?;
    // The last answers' events, so that the next run's flow knows every live order.
    while let Some(entry) = stream_in.try_recv().map_err(|e| anyhow!("stream: {e}"))? {
        for r in entry.requests.iter() {
            if r.client_id == client_id && r.kind == OutcomeKind::Applied {
                flow.observe(&decode_events(&r.events)?);
            }
        }
    }
    Ok(ScenarioRun {
        offered_per_s: rate,
        sent,
        acked: acked_n,
        elapsed,
        latency,
        send_lag,
    })
}
