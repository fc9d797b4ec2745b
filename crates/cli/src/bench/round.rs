//! `bourse bench round`: what one replication round costs in CPU and context switches, for
//! the replica group as it runs (openraft 0.10, a runtime per node) and for the same group as
//! one loop per node on one thread (`node_loop`, the floor of that design), side by side at the
//! same rates with the same client, journal, state machine and committed stream.
//!
//! Issue 36 asks whether a node that drives consensus from its own loop would take the
//! venue's per-round cost down enough to be worth rebuilding the node; this is that figure.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use bourse_cluster::net::{decode_message, encode_frame, Request, Response, SubmitError, Tagged};
use bourse_cluster::tokio;
use bourse_cluster::{ClusterConfig, FsyncSetting, OutcomeKind};
use bourse_core::codec::encode_command;
use bourse_core::Command;
use bourse_engine::workload::Flow;
use bourse_engine::EngineConfig;
use clap::Args;
use serde_json::json;

use super::cluster::{bench_flow, cpu_split, open_loop, BenchNode};
use super::common::{self, thread_cpu, Latency, Machine};
use super::node_loop::LoopGroup;

#[derive(Args)]
pub struct RoundBenchArgs {
    /// Seconds of load per rate.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Offered rates in commands/s.
    #[arg(long, value_delimiter = ',', default_value = "2000,10000")]
    rates: Vec<u64>,
    /// fdatasync every entry on every replica (`always`, the venue's durability) or never.
    #[arg(long, default_value = "always")]
    fsync: String,
    /// Which groups: `both`, `openraft` or `loop`.
    #[arg(long, default_value = "both")]
    groups: String,
    /// Worker threads of each openraft node's runtime (2 as `bourse node` runs; 1: a
    /// current-thread runtime, every task of a node on one thread).
    #[arg(long, default_value_t = 2)]
    node_threads: usize,
    /// One JSON object per group and rate.
    #[arg(long)]
    json: bool,
}

/// The client's window: requests in flight at most.
const WINDOW: u64 = 8192;

pub fn bench(args: RoundBenchArgs) -> Result<()> {
    bourse_venue::tune_allocator();
    anyhow::ensure!(
        (1..=120).contains(&args.seconds),
        "--seconds must be in 1..=120"
    );
    anyhow::ensure!(
        (1..=8).contains(&args.node_threads),
        "--node-threads must be in 1..=8"
    );
    anyhow::ensure!(
        !args.rates.is_empty() && args.rates.iter().all(|r| (1..=500_000).contains(r)),
        "--rates: each in 1..=500000"
    );
    let fsync = match args.fsync.as_str() {
        "always" => true,
        "never" => false,
        other => anyhow::bail!("--fsync {other}: use always or never"),
    };
    let groups: Vec<&str> = match args.groups.as_str() {
        "both" => vec!["openraft", "loop"],
        "openraft" => vec!["openraft"],
        "loop" => vec!["loop"],
        other => anyhow::bail!("--groups {other}: use both, openraft or loop"),
    };
    let machine = Machine::this();
    if !args.json {
        println!(
            "bench round: one replica group of three on loopback, fsync {}; per rate the CPU time \
             and context switches of the group's threads (the client's apart) per command and per \
             log entry; latency from each request's due time to its answer; {} ({} cpus), load {}",
            args.fsync, machine.model, machine.cpus, machine.load_average_start
        );
        println!(
            "  {:<9} {:>8} {:>9} {:>8} {:>8} {:>11} {:>11} {:>12} {:>13}   p50 / p99 / p99.9 / max",
            "group",
            "offered",
            "acked/s",
            "entries/s",
            "cmd/entry",
            "CPU us/cmd",
            "CPU us/entry",
            "switches/entry",
            "leader/follower"
        );
    }
    for group in groups {
        let dir = common::ScratchDir::new("bench-round")?;
        let mut config = ClusterConfig::local(98, dir.0.clone(), common::free_ports()?);
        config.fsync = if fsync {
            FsyncSetting::Always
        } else {
            FsyncSetting::Never
        };
        let mut running = Running::start(group, &config, fsync, args.node_threads)?;
        let mut flow = Flow::new(bench_flow());
        let addr = running.leader_addr();
        for body in flow.setup() {
            submit_blocking(addr, 1, &Command::new(0, body), running.setup_seq())?;
        }
        let leader_id = running.leader_id();
        for (i, &rate) in args.rates.iter().enumerate() {
            let before = thread_cpu();
            let entries_before = running.entries();
            let next_index = running.next_index();
            let stream = running.subscribe(next_index)?;
            let run = open_loop(
                running.leader_addr(),
                stream,
                100 + i as u64,
                &mut flow,
                Some(rate),
                args.seconds,
                WINDOW,
            )?;
            let entries = running.entries().saturating_sub(entries_before).max(1);
            let cpu = cpu_split(&before, &thread_cpu(), leader_id, 2, run.acked, entries);
            let group_ns_per_cmd =
                cpu.leader_cpu_ns_per_command + 2 * cpu.follower_cpu_ns_per_command;
            let per_entry = |per_cmd: u64| per_cmd as f64 * run.acked as f64 / entries as f64;
            let switches_per_entry =
                cpu.leader_switches_per_batch + 2.0 * cpu.follower_switches_per_batch;
            let secs = run.elapsed.as_secs_f64();
            let lat = Latency::of(&run.latency);
            if args.json {
                println!(
                    "{}",
                    json!({
                        "bench": "round", "group": group, "fsync": args.fsync,
                        "offered_per_s": rate, "acked": run.acked, "sent": run.sent,
                        "acked_per_s": (run.acked as f64 / secs).round() as u64,
                        "entries_per_s": (entries as f64 / secs).round() as u64,
                        "group_cpu_ns_per_command": group_ns_per_cmd,
                        "group_cpu_ns_per_entry": per_entry(group_ns_per_cmd).round() as u64,
                        "group_voluntary_switches_per_entry": switches_per_entry,
                        "cpu": cpu, "latency_ns": lat, "machine": machine,
                        "version": common::version(),
                    })
                );
            } else {
                println!(
                    "  {:<9} {:>8} {:>9} {:>8} {:>8.2} {:>11.1} {:>11.1} {:>12.1} {:>6.1}/{:<6.1}   {} / {} / {} / {}",
                    group,
                    common::count(rate),
                    common::count((run.acked as f64 / secs).round() as u64),
                    common::count((entries as f64 / secs).round() as u64),
                    run.acked as f64 / entries as f64,
                    group_ns_per_cmd as f64 / 1000.0,
                    per_entry(group_ns_per_cmd) / 1000.0,
                    switches_per_entry,
                    cpu.leader_switches_per_batch,
                    cpu.follower_switches_per_batch,
                    common::ns(lat.p50),
                    common::ns(lat.p99),
                    common::ns(lat.p999),
                    common::ns(lat.max),
                );
            }
            if run.acked < run.sent {
                eprintln!(
                    "  warning: {} of {} requests unanswered",
                    run.sent - run.acked,
                    run.sent
                );
            }
        }
        running.stop(args.json)?;
    }
    Ok(())
}

/// One of the two groups, started.
enum Running {
    Openraft {
        rt: tokio::runtime::Runtime,
        nodes: Vec<BenchNode>,
        leader: usize,
        setup_seq: u64,
    },
    Loop {
        group: LoopGroup,
        setup_seq: u64,
    },
}

impl Running {
    fn start(
        group: &str,
        config: &ClusterConfig,
        fsync: bool,
        node_threads: usize,
    ) -> Result<Running> {
        if group == "loop" {
            let engine = EngineConfig {
                orders_max: config.orders_max,
                instruments_max: config.instruments_max,
                accounts_max: config.accounts_max,
                levels_per_side_hint: 64,
                first_order_id: config.first_order_id,
            };
            let ports = config
                .nodes
                .iter()
                .map(|n| {
                    n.addr
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.parse::<u16>().ok())
                })
                .collect::<Option<Vec<u16>>>()
                .context("node ports")?;
            let group = LoopGroup::start(
                &config.data_dir,
                [ports[0], ports[1], ports[2]],
                fsync,
                engine,
                config.hash_checkpoint_every_entries,
            )?;
            return Ok(Running::Loop {
                group,
                setup_seq: 0,
            });
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("tokio runtime")?;
        let mut nodes = Vec::new();
        for n in &config.nodes {
            nodes.push(BenchNode::start(config, n.id, node_threads)?);
        }
        let leader = rt.block_on(async {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                for (i, n) in nodes.iter().enumerate() {
                    let s = n.node().status().await;
                    if s.leader == Some(s.id) {
                        return Ok(i);
                    }
                }
                if std::time::Instant::now() > deadline {
                    anyhow::bail!("no leader within 10 s");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })?;
        Ok(Running::Openraft {
            rt,
            nodes,
            leader,
            setup_seq: 0,
        })
    }

    fn leader_id(&self) -> u64 {
        match self {
            Running::Openraft { nodes, leader, .. } => nodes[*leader].node().id(),
            Running::Loop { .. } => 1,
        }
    }

    fn leader_addr(&self) -> std::net::SocketAddr {
        match self {
            Running::Openraft { nodes, leader, .. } => nodes[*leader].node().addr,
            Running::Loop { group, .. } => group.leader_addr,
        }
    }

    /// Log entries the leader has committed (batches for openraft, from its stage counts).
    fn entries(&self) -> u64 {
        match self {
            Running::Openraft { nodes, leader, .. } => nodes[*leader]
                .node()
                .stages()
                .snapshot()
                .iter()
                .find(|(name, _)| *name == "batch_requests")
                .map_or(0, |(_, h)| h.len()),
            Running::Loop { group, .. } => group.entries.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    fn next_index(&self) -> u64 {
        match self {
            Running::Openraft {
                rt, nodes, leader, ..
            } => rt
                .block_on(nodes[*leader].node().status())
                .last_applied_index
                .map_or(0, |i| i + 1),
            Running::Loop { group, .. } => group.stream.next_index(),
        }
    }

    fn subscribe(&self, from: u64) -> Result<bourse_cluster::Subscription> {
        match self {
            Running::Openraft { nodes, leader, .. } => nodes[*leader].node().subscribe(from),
            Running::Loop { group, .. } => group.stream.subscribe(from),
        }
        .map_err(|e| anyhow!("stream: {e}"))
    }

    /// Stops the group. The loop group's replicas must end on the same applied index and
    /// state hash (openraft's nodes check their hashes in band, as they run).
    fn stop(self, quiet: bool) -> Result<()> {
        match self {
            Running::Openraft { rt, mut nodes, .. } => {
                rt.block_on(async {
                    for n in &mut nodes {
                        if let Some(node) = n.node.take() {
                            node.shutdown().await;
                        }
                    }
                });
            }
            Running::Loop { group, .. } => {
                let ends = group.finish(5_000)?;
                anyhow::ensure!(
                    ends.iter().all(|e| *e == ends[0]),
                    "the loop group's replicas disagree: (applied index, state hash) {ends:?}"
                );
                if !quiet {
                    println!(
                        "  loop: every replica applied {} entries to state hash {:016x}",
                        ends[0].0, ends[0].1
                    );
                }
            }
        }
        Ok(())
    }
}

impl Running {
    fn setup_seq(&mut self) -> &mut u64 {
        match self {
            Running::Openraft { setup_seq, .. } | Running::Loop { setup_seq, .. } => setup_seq,
        }
    }
}

/// How long a setup command is retried while a new leader waits for a quorum to confirm it.
const SETUP_LEADER_UNCONFIRMED_WAIT_MS: u64 = 10_000;

/// Submits one setup command as client `client_id` and waits for its answer (setup only). A
/// leader elected a moment ago answers `LeaderUnconfirmed` until a quorum acknowledged it
/// (nothing was proposed): the same request is sent again, for at most
/// `SETUP_LEADER_UNCONFIRMED_WAIT_MS`.
fn submit_blocking(
    addr: std::net::SocketAddr,
    client_id: u64,
    command: &Command,
    seq: &mut u64,
) -> Result<()> {
    *seq += 1;
    let deadline =
        std::time::Instant::now() + Duration::from_millis(SETUP_LEADER_UNCONFIRMED_WAIT_MS);
    loop {
        match submit_once(addr, client_id, command, *seq)? {
            Response::Submitted(Ok(o)) if o.kind == OutcomeKind::Applied => return Ok(()),
            Response::Submitted(Err(SubmitError::LeaderUnconfirmed))
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return Err(anyhow!("setup command {seq}: {other:?}")),
        }
    }
}

/// One setup request on a connection of its own, and its answer.
fn submit_once(
    addr: std::net::SocketAddr,
    client_id: u64,
    command: &Command,
    seq: u64,
) -> Result<Response> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(&encode_frame(&Tagged {
        tag: seq,
        body: Request::Submit {
            client_id,
            request_seq: seq,
            command: encode_command(command),
        },
    }))?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body)?;
    let answer: Tagged<Response> = decode_message(&body)?;
    Ok(answer.body)
}
