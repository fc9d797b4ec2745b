//! `bourse node` and `bourse cluster up|status|snapshot`: a trading core replicated on three
//! nodes (see the `bourse-cluster` crate).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bourse_cluster::client::{node_snapshot, node_status};
use bourse_cluster::net::NodeStatus;
use bourse_cluster::tokio;
use bourse_cluster::{ClusterConfig, Node};
use clap::{Args, Subcommand};
use serde_json::json;

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
    /// Serve `/metrics` and the dashboard (with the group's cluster view) on this address
    /// (read-only; a loopback one such as 127.0.0.1:9101 keeps it on the host) (port 0: any free port; the address is printed).
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
        /// Give each node its `/metrics` and dashboard on 127.0.0.1: the configuration's
        /// first node on this port, the second on the next, and so on (printed at start).
        #[arg(long)]
        monitor_base_port: Option<u16>,
        /// Monitoring settings for every node (TOML; see crates/monitor/monitor.example.toml).
        /// Needs --monitor-base-port.
        #[arg(long, requires = "monitor_base_port")]
        monitor_config: Option<PathBuf>,
    },
    /// Leader, term, log, commit/apply index, lag and state hash of every node.
    Status {
        #[arg(long, default_value = "examples/cluster.toml")]
        config: PathBuf,
        /// One JSON object per node.
        #[arg(long)]
        json: bool,
        /// With `[tls]`: present this node's certificate (run on its host; default: the
        /// configuration's first node).
        #[arg(long)]
        as_node: Option<u64>,
    },
    /// Ask nodes to take a snapshot now.
    Snapshot {
        #[arg(long, default_value = "examples/cluster.toml")]
        config: PathBuf,
        /// Only this node (default: all).
        #[arg(long)]
        id: Option<u64>,
        /// With `[tls]`: present this node's certificate (default: the configuration's first
        /// node).
        #[arg(long)]
        as_node: Option<u64>,
    },
}

/// Mutual TLS to nodes off the loopback, for tools that name nodes on the command line: the
/// venue's authority and this tool's certificate and key (PEM; docs/deploy.md).
#[derive(Args, Clone, Debug, Default)]
pub struct NodeTlsArgs {
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    #[arg(long, requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    #[arg(long, requires = "tls_ca")]
    tls_key: Option<PathBuf>,
}

impl NodeTlsArgs {
    /// This process reaches `nodes` over TLS with these files, if given (plain TCP
    /// otherwise, which only loopback addresses allow).
    pub fn apply(&self, nodes: &[SocketAddr]) -> Result<()> {
        bourse_cluster::transport::configure_client(nodes, self.files().as_ref())
            .map_err(|e| anyhow!("--tls-*: {e}"))
    }

    /// The files, when all three were given (clap requires them together).
    pub fn files(&self) -> Option<bourse_cluster::TlsFiles> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (Some(ca), Some(cert), Some(key)) => Some(bourse_cluster::TlsFiles {
                ca_path: ca.clone(),
                cert_path: cert.clone(),
                key_path: key.clone(),
            }),
            _ => None,
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")
}

pub(crate) fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    // Only one handler per process; a second call fails harmlessly.
    let _ = ctrlc::set_handler(move || s.store(true, Ordering::SeqCst));
    stop
}

/// `bourse node`: one member of the group, until interrupted or killed.
pub fn node(args: NodeArgs) -> Result<()> {
    bourse_venue::tune_allocator();
    let config = ClusterConfig::load(&args.config).map_err(|e| anyhow!(e))?;
    // The node's own clients (its monitor's status calls to its peers) present its
    // certificate, as its raft RPCs do.
    config.use_tls_as(args.id).map_err(|e| anyhow!(e))?;
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
                    "bourse node {}: market data to {} (A) and {} (B) from UDP port {} (sent while leading)",
                    args.id, section.feed_a_host, section.feed_b_host, section.base_port
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
        ClusterCommand::Up {
            config,
            monitor_base_port,
            monitor_config,
        } => up(&config, monitor_base_port, monitor_config.as_deref()),
        ClusterCommand::Status {
            config,
            json,
            as_node,
        } => {
            let config = ClusterConfig::load(&config).map_err(|e| anyhow!(e))?;
            use_tls(&config, as_node)?;
            let statuses = runtime()?.block_on(statuses(&config));
            print_status(&config, &statuses, json);
            Ok(())
        }
        ClusterCommand::Snapshot {
            config,
            id,
            as_node,
        } => {
            let config = ClusterConfig::load(&config).map_err(|e| anyhow!(e))?;
            use_tls(&config, as_node)?;
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

/// An operator's tool reaches the nodes as one of them (see `ClusterConfig::use_tls_as`).
fn use_tls(config: &ClusterConfig, as_node: Option<u64>) -> Result<()> {
    let id = as_node.unwrap_or(config.nodes[0].id);
    config.use_tls_as(id).map_err(|e| anyhow!(e))
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

/// A node's monitoring as `cluster up` passes it on: its address and the settings file.
struct NodeMonitorArgs<'a> {
    listen: SocketAddr,
    config: Option<&'a Path>,
}

fn spawn_node(config_path: &Path, id: u64, monitor: Option<NodeMonitorArgs>) -> Result<Child> {
    let exe = std::env::current_exe().context("current executable")?;
    let mut command = Process::new(exe);
    command
        .arg("node")
        .arg("--config")
        .arg(config_path)
        .arg("--id")
        .arg(id.to_string());
    if let Some(m) = monitor {
        command.arg("--monitor-listen").arg(m.listen.to_string());
        if let Some(c) = m.config {
            command.arg("--monitor-config").arg(c);
        }
    }
    command
        .spawn()
        .with_context(|| format!("spawning node {id}"))
}

/// The monitor addresses of `nodes` nodes from `base`: base, base + 1, … on 127.0.0.1.
fn monitor_addrs(base: u16, nodes: usize) -> Result<Vec<SocketAddr>> {
    let last = u32::from(base) + nodes.saturating_sub(1) as u32;
    if base == 0 || last > u32::from(u16::MAX) {
        bail!(
            "--monitor-base-port {base}: the {nodes} nodes need ports {base}..={last}, which \
             must lie in 1..=65535"
        );
    }
    Ok((0..nodes as u16)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], base + i)))
        .collect())
}

/// `bourse cluster up`: every node as a child process of this one.
fn up(
    config_path: &Path,
    monitor_base_port: Option<u16>,
    monitor_config: Option<&Path>,
) -> Result<()> {
    let config = ClusterConfig::load(config_path).map_err(|e| anyhow!(e))?;
    let monitors = match monitor_base_port {
        Some(base) => {
            if let Some(c) = monitor_config {
                // Refuse a bad file here, once, rather than in every node.
                crate::node_monitor::load_config(Some(c), String::new())?;
            }
            Some(monitor_addrs(base, config.nodes.len())?)
        }
        None => None,
    };
    let stop = stop_flag();
    let mut children = Vec::new();
    for (i, n) in config.nodes.iter().enumerate() {
        let monitor = monitors.as_ref().map(|m| NodeMonitorArgs {
            listen: m[i],
            config: monitor_config,
        });
        if let Some(m) = &monitor {
            println!(
                "node {}: dashboard http://{}/ metrics http://{}/metrics",
                n.id, m.listen, m.listen
            );
        }
        children.push((n.id, spawn_node(config_path, n.id, monitor)?));
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
