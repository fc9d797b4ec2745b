//! `bourse delivery serve | tail`: a data-delivery node over the committed streams of one or
//! more cores (seed 003), and a client that follows it and prints records as JSON Lines.

use anyhow::{anyhow, bail, Context, Result};
use bourse_cluster::tokio;
use bourse_core::{AccountId, FirmId, InstrumentId};
use bourse_delivery::{
    AnyClient, CoreSource, DeliveryConfig, DeliveryNode, Filter, Follow, Limits, PollRequest,
};
use clap::{Args, Subcommand};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum DeliveryCommand {
    /// Serve GetOrders (HTTP/JSON long poll, `GET /v1/orders`) from a store fed by the
    /// committed streams of the cores named, until interrupted.
    Serve(ServeArgs),
    /// Follow a delivery node from a cursor (none: a snapshot of the current state first) and
    /// print every record as one JSON line; the last cursor goes to standard error.
    Tail(TailArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    /// A TOML file of the node (`name`, `listen`, `state_dir`, `persist_interval_ms`,
    /// `[[cores]] id, nodes`, `[limits]`); the flags below are then not used.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The deployment's name (cursors of another name are refused as foreign).
    #[arg(long, default_value = "bourse")]
    name: String,
    #[arg(long, default_value = "127.0.0.1:8700")]
    listen: SocketAddr,
    /// Also serve the binary API (SBE over TCP) on this address.
    #[arg(long)]
    binary_listen: Option<SocketAddr>,
    /// A core: `ID=ADDR,ADDR,ADDR` (its id in cursors and the client addresses of its
    /// nodes); repeat for each core.
    #[arg(long = "core", required_unless_present_any = ["config", "follow"])]
    cores: Vec<String>,
    /// Be a read replica of the delivery node whose binary API is at this address (it keeps
    /// no secondary indexes and answers unfiltered polls only); name its cores with
    /// `--follow-cores`.
    #[arg(long, conflicts_with_all = ["cores", "state_dir"], requires = "follow_cores")]
    follow: Option<SocketAddr>,
    /// The primary's core ids, in its order (for example `0,1`).
    #[arg(long, value_delimiter = ',')]
    follow_cores: Vec<u32>,
    /// Where the store is persisted (kept in memory only if not given).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Keep the records evicted from memory on disk under `STATE_DIR/cold` for this many
    /// seconds (86400: the day), so that older cursors and `since` reads are answered.
    #[arg(long, requires = "state_dir")]
    cold_retain_seconds: Option<u64>,
    /// Worker threads of the node (feeds, both fronts, the persister).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Mutual TLS to every `--core`'s nodes (required for nodes off the loopback).
    #[command(flatten)]
    tls: crate::cluster_cmd::NodeTlsArgs,
}

#[derive(Args)]
pub struct TailArgs {
    /// The delivery node's address (its HTTP API, or with `--binary` its binary API).
    #[arg(long, default_value = "127.0.0.1:8700")]
    addr: SocketAddr,
    /// Read through the binary API (SBE over TCP) instead of HTTP; the records and cursors
    /// are the same.
    #[arg(long)]
    binary: bool,
    /// Continue from this cursor (the one a previous tail printed last).
    #[arg(long)]
    cursor: Option<String>,
    /// Start with what changed in the last this many seconds instead (HTTP; served from the
    /// node's cold data where memory no longer holds it).
    #[arg(long, conflicts_with_all = ["cursor", "binary"])]
    since_seconds: Option<u64>,
    #[arg(long)]
    firm: Option<u32>,
    #[arg(long)]
    account: Option<u32>,
    #[arg(long)]
    instrument: Option<u32>,
    /// Rows per answer.
    #[arg(long, default_value_t = 1_000)]
    limit: usize,
    /// How long a poll waits for `min_rows` rows.
    #[arg(long, default_value_t = 500)]
    wait_us: u64,
    #[arg(long, default_value_t = 1)]
    min_rows: usize,
    /// Stop after this many records.
    #[arg(long)]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: Option<u64>,
    /// Stop at the first empty answer (everything so far was printed).
    #[arg(long)]
    until_empty: bool,
    /// Log on as this reader (the password is read from BOURSE_DELIVERY_PASSWORD): needed
    /// at a node with `[[access.readers]]`.
    #[arg(long)]
    user: Option<String>,
    /// Speak TLS, trusting the authorities of this PEM file (a node with `access.tls`).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// The name the node's certificate carries (default: the address's IP).
    #[arg(long, requires = "tls_ca")]
    tls_name: Option<String>,
}

pub fn run(command: DeliveryCommand) -> Result<()> {
    match command {
        DeliveryCommand::Serve(args) => serve(args),
        DeliveryCommand::Tail(args) => tail(args),
    }
}

fn parse_core(spec: &str, tls: Option<bourse_cluster::TlsFiles>) -> Result<CoreSource> {
    let (id, nodes) = spec
        .split_once('=')
        .ok_or_else(|| anyhow!("--core {spec}: expected ID=ADDR,ADDR,..."))?;
    let id = id
        .parse()
        .with_context(|| format!("--core {spec}: the id is not a number"))?;
    let nodes = nodes
        .split(',')
        .map(|a| {
            a.parse()
                .with_context(|| format!("--core {spec}: `{a}` is not an address"))
        })
        .collect::<Result<Vec<SocketAddr>>>()?;
    Ok(CoreSource { id, nodes, tls })
}

fn serve(args: ServeArgs) -> Result<()> {
    let config = match &args.config {
        Some(path) => DeliveryConfig::load(path).map_err(|e| anyhow!(e))?,
        None => DeliveryConfig {
            name: args.name,
            listen: args.listen,
            binary_listen: args.binary_listen,
            state_dir: args.state_dir,
            persist_interval_ms: 1_000,
            threads: args.threads,
            cores: args
                .cores
                .iter()
                .map(|c| parse_core(c, args.tls.files()))
                .collect::<Result<_>>()?,
            follow: args.follow.map(|primary| Follow {
                primary,
                cores: args.follow_cores.clone(),
                secondary_indexes: false,
                login: None,
                tls: None,
            }),
            cold: args.cold_retain_seconds.map(|retain_seconds| {
                bourse_delivery::cold::ColdConfig {
                    retain_seconds,
                    ..Default::default()
                }
            }),
            limits: Limits::default(),
            access: Default::default(),
        },
    };
    let stop = crate::cluster_cmd::stop_flag();
    let node = DeliveryNode::start(config.clone()).map_err(|e| anyhow!(e))?;
    let what = match &config.follow {
        Some(f) => format!(
            "a read replica of {} (core(s) {:?}, unfiltered polls only)",
            f.primary, f.cores
        ),
        None => format!("{} core(s)", config.cores.len()),
    };
    eprintln!(
        "bourse delivery: serving {what} on {} (GET /v1/orders, GET /v1/status); \
         follow it with: bourse delivery tail --addr {}",
        node.url(),
        node.addr()
    );
    if let Some(b) = node.binary_addr() {
        eprintln!(
            "bourse delivery: binary API (SBE over TCP) on {b}; \
             follow it with: bourse delivery tail --binary --addr {b}"
        );
    }
    let mut last = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() >= Duration::from_secs(10) {
            last = Instant::now();
            let c = &node.shared().counters;
            let errors = node
                .shared()
                .feed_errors
                .lock()
                .expect("feed errors")
                .clone();
            eprintln!(
                "bourse delivery: applied {:?}, polls {} ({} empty), rows sent {}{}",
                node.applied_indexes(),
                c.polls.get(),
                c.polls_empty.get(),
                c.rows_sent.get(),
                errors
                    .iter()
                    .enumerate()
                    .filter_map(|(slot, e)| {
                        let e = e.as_ref()?;
                        Some(match config.cores.get(slot) {
                            Some(c) => format!("; core {}: {e}", c.id),
                            None => format!("; following: {e}"),
                        })
                    })
                    .collect::<String>()
            );
        }
    }
    node.stop().map_err(|e| anyhow!(e))
}

fn tail(args: TailArgs) -> Result<()> {
    if args.limit == 0 {
        bail!("--limit must be at least 1");
    }
    let credentials = match &args.user {
        Some(name) => {
            let password = std::env::var("BOURSE_DELIVERY_PASSWORD")
                .context("set BOURSE_DELIVERY_PASSWORD to the reader's password")?;
            Some((name.clone(), password))
        }
        None => None,
    };
    let tls = match &args.tls_ca {
        Some(ca) => {
            let name = args
                .tls_name
                .clone()
                .unwrap_or_else(|| args.addr.ip().to_string());
            Some(bourse_client::TlsClient::from_ca_file(ca, &name).map_err(|e| anyhow!(e))?)
        }
        None => None,
    };
    let access = bourse_delivery::Access { tls, credentials };
    let stop = crate::cluster_cmd::stop_flag();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async move {
        let client = if args.binary {
            AnyClient::binary(args.addr)
        } else {
            AnyClient::http(args.addr)
        };
        let mut client = client.with_access(access);
        let mut req = PollRequest {
            cursor: args.cursor.clone(),
            filter: Filter {
                firm: args.firm.map(FirmId),
                account: args.account.map(AccountId),
                instrument: args.instrument.map(InstrumentId),
            },
            limit: Some(args.limit),
            wait_us: Some(args.wait_us),
            min_rows: Some(args.min_rows),
            since_ns: args.since_seconds.map(|s| {
                let now_ns = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                now_ns.saturating_sub(s.saturating_mul(1_000_000_000))
            }),
        };
        let started = Instant::now();
        let mut printed = 0u64;
        let out = std::io::stdout();
        let result = loop {
            if stop.load(Ordering::SeqCst)
                || args
                    .seconds
                    .is_some_and(|s| started.elapsed().as_secs() >= s)
                || args.count.is_some_and(|c| printed >= c)
            {
                break Ok(());
            }
            // Never ask for more than --count leaves, so the cursor printed at the end
            // continues right after the last record printed.
            if let Some(c) = args.count {
                req.limit = Some(args.limit.min((c - printed) as usize));
                req.min_rows = Some(args.min_rows.min(req.limit.unwrap_or(1)));
            }
            let answer = match client.poll(&req).await {
                Ok(a) => a,
                Err(e) => break Err(anyhow!("{}: {e}", args.addr)),
            };
            req.cursor = Some(answer.header.next_cursor.clone());
            req.since_ns = None;
            let mut out = out.lock();
            for r in &answer.records {
                serde_json::to_writer(&mut out, r)?;
                out.write_all(b"\n")?;
                printed += 1;
            }
            out.flush()?;
            if args.until_empty && answer.records.is_empty() {
                break Ok(());
            }
        };
        if let Some(c) = &req.cursor {
            eprintln!("bourse delivery tail: {printed} records; continue with --cursor {c}");
        }
        result
    })
}
