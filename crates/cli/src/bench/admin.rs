//! `bourse bench admin`: accounts added through the admin API of a running replicated venue,
//! and the trading latency while they are added against a run without.
//!
//! Two runs of the same venue (one market, a replica group of three nodes, a gateway, the
//! load generator's sessions at a constant rate):
//! - *with additions*: after the warm-up, one bulk NDJSON request adds `--accounts` accounts
//!   (each added with its cash, one command per account, in every market) through
//!   `POST /v1/accounts/bulk`; the measured
//!   trading phase ends when the answer arrives;
//! - *without*: a fresh venue, the same trading for as long as the additions took.
//!
//! Included in the addition rate: the HTTP request with its NDJSON parsing, planning, the
//! pipelined submission of each account's one command, replication and apply on three
//! replicas, and reading their events from the committed stream. Excluded: starting the venue
//! and generating the request's lines (done lazily while it is sent). Trading latency is the
//! load generator's, from each command's scheduled send time to its answer through the gateway.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::json;

use super::common::{count, latency_header, latency_row, Latency, Machine, ScratchDir};
use bourse_venue::LocalDeployment;

/// The first id of the accounts the benchmark adds (far above the generator's).
const ADDED_ACCOUNT_ID_BASE: u32 = 100_000_000;
/// The most accounts one run may add (the venue's account table is sized for them).
const ACCOUNTS_MAX: u64 = 10_000_000;
/// The operator of the benchmark's admin API.
const OPERATOR: &str = "bench";
/// How long the bulk request may take in all.
const BULK_TIMEOUT: Duration = Duration::from_secs(600);
/// The measured phase of the run with additions is stopped when they are done; this bounds it.
const MEASURED_PHASE_S_MAX: f64 = 900.0;

#[derive(Args)]
pub struct AdminBenchArgs {
    /// Accounts to add through the admin API (each in every market, with a deposit).
    #[arg(long, default_value_t = 1_000_000)]
    accounts: u64,
    /// Trading commands per second offered while they are added (and in the run without).
    #[arg(long, default_value_t = 2_000)]
    rate: u32,
    /// Accounts the load generator trades with (set up before the runs).
    #[arg(long, default_value_t = 400)]
    trading_accounts: u32,
    /// Seconds of trading before the additions start (not measured).
    #[arg(long, default_value_t = 3.0)]
    warmup_s: f64,
    /// Markets (one replica group of three nodes each).
    #[arg(long, default_value_t = 1)]
    markets: u32,
    /// The journals' fsync mode: always, batch or never.
    #[arg(long, default_value = "batch")]
    fsync: String,
    /// Skip the run without additions.
    #[arg(long)]
    no_baseline: bool,
    /// Print one JSON object per run.
    #[arg(long)]
    json: bool,
}

/// What one run measured.
struct RunFigures {
    trading: Latency,
    trading_sent: u64,
    measured_s: f64,
    added: Option<Added>,
}

struct Added {
    accounts: u64,
    commands: u64,
    elapsed_s: f64,
    answer: serde_json::Value,
}

pub fn bench(args: AdminBenchArgs) -> Result<()> {
    if args.accounts == 0 || args.accounts > ACCOUNTS_MAX {
        bail!("--accounts: 1 to {ACCOUNTS_MAX}, not {}", args.accounts);
    }
    if args.rate == 0 || args.trading_accounts < 2 || args.markets == 0 || args.markets > 3 {
        bail!("--rate must be above 0, --trading-accounts at least 2, --markets 1 to 3");
    }
    if !(args.warmup_s > 0.0 && args.warmup_s <= 60.0) {
        bail!("--warmup-s: more than 0 and at most 60");
    }
    if !["always", "batch", "never"].contains(&args.fsync.as_str()) {
        bail!("--fsync: always, batch or never, not {:?}", args.fsync);
    }
    let mut machine = Machine::this();
    println!(
        "bench admin: {} accounts added through the admin API ({} market(s), 3 replicas each, \
         fsync {}), trading at {}/s; load average {:.2}",
        count(args.accounts),
        args.markets,
        args.fsync,
        count(args.rate as u64),
        machine.load_average_start
    );
    let with = run(&args, None)?;
    let added = with.added.as_ref().expect("the run adds accounts");
    println!(
        "\nadded {} accounts ({} commands) in {:.2} s: {} accounts/s, {} commands/s",
        count(added.accounts),
        count(added.commands),
        added.elapsed_s,
        count((added.accounts as f64 / added.elapsed_s) as u64),
        count((added.commands as f64 / added.elapsed_s) as u64),
    );
    println!(
        "  the answer: {}",
        serde_json::to_string(&added.answer).unwrap_or_default()
    );
    let without = if args.no_baseline {
        None
    } else {
        Some(run(&args, Some(added.elapsed_s.max(1.0)))?)
    };
    machine.load_average_end = Machine::this().load_average_start;
    println!("\ntrading through the gateway (scheduled send → answer), measured phase only:");
    println!("{}", latency_header());
    println!("{}", latency_row("with adds", &with.trading));
    if let Some(w) = &without {
        println!("{}", latency_row("without", &w.trading));
        println!(
            "  p99 with / without: {:.2}; p50 {:.2}",
            with.trading.p99 as f64 / w.trading.p99.max(1) as f64,
            with.trading.p50 as f64 / w.trading.p50.max(1) as f64
        );
    }
    println!(
        "load average {:.2} → {:.2}",
        machine.load_average_start, machine.load_average_end
    );
    if args.json {
        for (name, r) in [
            ("with_additions", Some(&with)),
            ("without", without.as_ref()),
        ] {
            let Some(r) = r else { continue };
            println!(
                "{}",
                json!({
                    "bench": "admin",
                    "run": name,
                    "version": super::common::version(),
                    "machine": machine,
                    "markets": args.markets,
                    "fsync": args.fsync,
                    "rate_per_s": args.rate,
                    "trading": r.trading,
                    "trading_sent": r.trading_sent,
                    "measured_s": r.measured_s,
                    "accounts_added": r.added.as_ref().map(|a| a.accounts),
                    "commands": r.added.as_ref().map(|a| a.commands),
                    "elapsed_s": r.added.as_ref().map(|a| a.elapsed_s),
                    "accounts_per_s": r.added.as_ref().map(|a| a.accounts as f64 / a.elapsed_s),
                })
            );
        }
    }
    Ok(())
}

/// The trading profile: one or more futures markets, a warm-up, then a constant rate for
/// `measured_s` seconds (the run with additions stops it early).
fn profile(args: &AdminBenchArgs, measured_s: f64) -> Result<bourse_loadgen::Profile> {
    let mut markets = String::new();
    for m in 0..args.markets {
        markets.push_str(&format!(
            "[[markets]]\nname = \"market{m}\"\nkind = \"futures\"\ninstruments = 10\n\
             accounts = {}\nshare = {}\nlive_orders_target = 2000\nspread_ticks = 30\n\n",
            args.trading_accounts,
            1.0 / args.markets as f64
        ));
    }
    let text = format!(
        r#"
name = "bench-admin"
description = "trading while accounts are added through the admin API"
seed = 20

[target]
kind = "cluster"
protocol = "binary"
sessions = 4
queue_capacity = 16384
fsync = "{fsync}"
market_data = false

[generator]
workers = 1
pacing = "poisson"
inflight_max = 65536
drain_timeout_s = 10

{markets}
[mix]
limit = 46
market = 0.5
ioc = 2
fok = 0.5
cancel = 44
replace = 7
mass_cancel = 0.05
crossing_share = 0.05

[[phases]]
name = "warm-up"
duration_s = {warmup}
warmup = true
[phases.rate]
shape = "constant"
per_s = {rate}

[[phases]]
name = "measured"
duration_s = {measured_s}
[phases.rate]
shape = "constant"
per_s = {rate}
"#,
        fsync = args.fsync,
        warmup = args.warmup_s,
        rate = args.rate,
    );
    let profile = bourse_loadgen::Profile::parse(&text).map_err(|e| anyhow!("profile: {e}"))?;
    profile.check_runnable().map_err(|e| anyhow!(e))?;
    Ok(profile)
}

/// One run: with additions when `measured_s` is `None` (the measured phase lasts as long
/// as they take), without for `measured_s` seconds.
fn run(args: &AdminBenchArgs, measured_s: Option<f64>) -> Result<RunFigures> {
    let adding = measured_s.is_none();
    let profile = profile(args, measured_s.unwrap_or(MEASURED_PHASE_S_MAX))?;
    let scratch = ScratchDir::new("bench-admin")?;
    let mut spec = crate::loadtest_cmd::deployment_spec(&profile, scratch.0.join("venue"), false);
    spec.accounts_max =
        spec.accounts_max
            .saturating_add(if adding { args.accounts as u32 } else { 0 });
    let mut deployment = LocalDeployment::start(spec)?;
    let stop = Arc::new(AtomicBool::new(false));
    let adder = if adding {
        Some(start_adder(args, &deployment, &scratch, Arc::clone(&stop))?)
    } else {
        None
    };
    let options = bourse_loadgen::RunOptions {
        progress: false,
        version: super::common::version().to_string(),
        ticker: false,
        stop: Some(Arc::clone(&stop)),
        live: None,
    };
    let results = bourse_loadgen::run_on(&profile, &options, &mut deployment);
    stop.store(true, Ordering::Relaxed);
    let added = match adder {
        Some((thread, server)) => {
            let r = thread
                .join()
                .map_err(|_| anyhow!("the adding thread panicked"))?;
            server.stop();
            Some(r?)
        }
        None => None,
    };
    deployment.stop();
    let results = results.map_err(|e| anyhow!(e))?;
    let failed: Vec<String> = results
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{}: expected {}, got {}", c.name, c.expected, c.actual))
        .collect();
    if !failed.is_empty() {
        bail!("the run's cross-checks failed: {}", failed.join("; "));
    }
    Ok(RunFigures {
        trading: results.latency_all,
        trading_sent: results.totals.commands_sent,
        measured_s: results.elapsed_s,
        added,
    })
}

type Adder = (
    std::thread::JoinHandle<Result<Added>>,
    bourse_admin::AdminServer,
);

/// Starts the admin API on `deployment` and a thread that, after the warm-up, adds the
/// accounts in one bulk request and then sets `stop`.
fn start_adder(
    args: &AdminBenchArgs,
    deployment: &LocalDeployment,
    scratch: &ScratchDir,
    stop: Arc<AtomicBool>,
) -> Result<Adder> {
    let password = format!("bench-{}", std::process::id());
    let mut store = bourse_auth::CredentialStore::new();
    store.insert(
        OPERATOR,
        bourse_auth::hash_password(&password)?,
        vec![bourse_admin::ROLE_OPERATOR.to_string()],
    )?;
    let (_service, server) = deployment.start_admin(
        Arc::new(store),
        &scratch.0.join("admin-audit.jsonl"),
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        None,
    )?;
    let client = bourse_admin::AdminClient::new(&server.url())
        .map_err(|e| anyhow!(e))?
        .with_credentials(OPERATOR, &password)
        .with_timeout(BULK_TIMEOUT);
    let accounts = args.accounts;
    let markets = args.markets as u64;
    let warmup = Duration::from_secs_f64(args.warmup_s);
    let thread = std::thread::Builder::new()
        .name("bench-admin-adder".into())
        .spawn(move || {
            // The generator's clock starts with its run; the warm-up is a fixed time from it.
            std::thread::sleep(warmup);
            let result = add_accounts(&client, accounts, markets);
            stop.store(true, Ordering::Relaxed);
            result
        })
        .context("starting the adding thread")?;
    Ok((thread, server))
}

fn add_accounts(client: &bourse_admin::AdminClient, accounts: u64, markets: u64) -> Result<Added> {
    let len = AccountLines::new(accounts).total_len();
    let t0 = Instant::now();
    let reply = client
        .bulk_accounts("bench-admin-1", &mut AccountLines::new(accounts), len)
        .map_err(|e| anyhow!("bulk addition: {e}"))?;
    let elapsed_s = t0.elapsed().as_secs_f64();
    let added = reply.body["accounts_added"].as_u64().unwrap_or(0);
    let funded = reply.body["deposits"].as_u64().unwrap_or(0);
    if reply.status != 200 || added != accounts * markets || funded != added {
        bail!(
            "the bulk addition answered {}: {} (expected {} additions and as many deposits)",
            reply.status,
            reply.body,
            accounts * markets
        );
    }
    Ok(Added {
        accounts,
        // One `add_funded_account` per account and market.
        commands: added,
        elapsed_s,
        answer: reply.body,
    })
}

/// The bulk request's body, made line by line as it is read: account `base + i` of firm
/// `1 + i % 100` with 1,000.0000 of cash.
struct AccountLines {
    next: u64,
    end: u64,
    line: Vec<u8>,
    at: usize,
}

impl AccountLines {
    fn new(accounts: u64) -> AccountLines {
        AccountLines {
            next: 0,
            end: accounts,
            line: Vec::with_capacity(96),
            at: 0,
        }
    }

    fn fill(&mut self) -> bool {
        if self.next == self.end {
            return false;
        }
        let i = self.next;
        self.next += 1;
        self.line.clear();
        self.line.extend_from_slice(
            format!(
                "{{\"account\":{},\"firm\":{},\"cash\":10000000}}\n",
                ADDED_ACCOUNT_ID_BASE as u64 + i,
                1 + i % 100
            )
            .as_bytes(),
        );
        self.at = 0;
        true
    }

    /// The body's length in bytes (a pass over it, since it is sent with its length).
    fn total_len(mut self) -> u64 {
        let mut total = 0u64;
        while self.fill() {
            total += self.line.len() as u64;
        }
        total
    }
}

impl Read for AccountLines {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            if self.at == self.line.len() && !self.fill() {
                break;
            }
            let k = (self.line.len() - self.at).min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&self.line[self.at..self.at + k]);
            self.at += k;
            n += k;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_body_is_as_long_as_announced_and_one_account_a_line() {
        let mut body = String::new();
        AccountLines::new(1_234)
            .read_to_string(&mut body)
            .expect("made in memory");
        assert_eq!(body.len() as u64, AccountLines::new(1_234).total_len());
        let lines: Vec<&str> = body.lines().collect();
        assert_eq!(lines.len(), 1_234);
        let last: serde_json::Value = serde_json::from_str(lines[1_233]).unwrap();
        assert_eq!(last["account"], ADDED_ACCOUNT_ID_BASE as u64 + 1_233);
        let parsed: bourse_admin::NewAccount = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(parsed.cash.0, 10_000_000);
    }
}
