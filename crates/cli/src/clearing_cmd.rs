//! `bourse clearing run`: an intermediate or end-of-day clearing of one or more replicated
//! cores (see the `bourse-clearing` crate). It reads each core's committed stream up to its
//! current end (the cut; trading goes on), replaying the runs saved in `--dir` on the way,
//! computes the run, saves its plan (before submitting anything), submits the cash movements
//! through the sequenced path, and prints a report per account (CSV and JSON with `--out`).
//! Run again with the same `--run-id` after a crash, it resumes the saved plan and applies
//! nothing twice. With `--service URL` it asks a running clearing service instead.
//!
//! `bourse clearing serve --config clearing.toml`: the clearing service (`ClearingNode`):
//! it follows the cores continuously, answers clearing data over HTTP/JSON, runs clearings on
//! `POST /v1/runs`, snapshots its state, and may stand by for another.
//!
//! `bourse clearing positions --fix ADDR --comp-id NAME --account N --date YYYYMMDD`: a FIX
//! client of that service's `[fix]` acceptor (docs/clearing.md).
//!
//! `bourse clearing settlements --service URL --date YYYY-MM-DD`: what settles on that
//! business day, from that service's runs (`GET /v1/settlements/{date}`).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use bourse_clearing::{
    compute_run, execute, load_instruments, replay, save_plan, saved_runs, stream_end, with_ids,
    ClearingConfig, ClearingNode, ClearingState, ExecuteOptions, Report, RunKind, RunPlan,
    RunRequest, SettlementRule,
};
use bourse_cluster::tokio;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum ClearingCommand {
    /// Clear the cores up to their current end and feed the results back to them.
    Run(Box<RunArgs>),
    /// The clearing service: follow the cores, serve clearing data, run clearings on request.
    Serve(ServeArgs),
    /// Ask a clearing service for an account's positions over FIX (RequestForPositions) and
    /// print its PositionReports, one line each.
    Positions(PositionsArgs),
    /// Ask a clearing service what settles on a business day (equity and FX obligations per
    /// account and instrument) and print one line each.
    Settlements(SettlementsArgs),
}

#[derive(Args)]
pub struct SettlementsArgs {
    /// The clearing service (http://host:port).
    #[arg(long)]
    service: String,
    /// The credential's name; the password comes from BOURSE_CLEARING_PASSWORD (none: no
    /// credentials, for a service without any).
    #[arg(long, env = "BOURSE_CLEARING_USER")]
    user: Option<String>,
    /// The settlement date, YYYY-MM-DD.
    #[arg(long)]
    date: String,
    /// Only this firm's accounts.
    #[arg(long)]
    firm: Option<u32>,
}

#[derive(Args)]
pub struct PositionsArgs {
    /// The service's FIX address (its config's `[fix] listen`).
    #[arg(long)]
    fix: SocketAddr,
    /// Our SenderCompID: a credential's name on the service; the password comes from
    /// BOURSE_CLEARING_PASSWORD (none: no Password field).
    #[arg(long)]
    comp_id: String,
    /// The service's CompID.
    #[arg(long, default_value = "BOURSE-CLEARING")]
    target: String,
    #[arg(long)]
    account: u32,
    /// ClearingBusinessDate, YYYYMMDD.
    #[arg(long)]
    date: String,
    /// SettlSessID: ITD (intraday) or EOD (end of day).
    #[arg(long, default_value = "ITD")]
    session: String,
    /// Only this instrument.
    #[arg(long)]
    symbol: Option<String>,
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

#[derive(Args)]
pub struct ServeArgs {
    /// The service's TOML file (see examples/clearing.toml).
    #[arg(long)]
    config: PathBuf,
    /// Listen here instead of the file's `listen` (loopback unless operators are set).
    #[arg(long)]
    listen: Option<SocketAddr>,
}

#[derive(Args)]
pub struct RunArgs {
    /// An intermediate clearing (variation margin, obligations).
    #[arg(
        long,
        conflicts_with = "end_of_day",
        required_unless_present = "end_of_day"
    )]
    intermediate: bool,
    /// The end-of-day clearing (the same computation, recorded as the day's last run).
    #[arg(long)]
    end_of_day: bool,
    /// Ask the clearing service at this address (http://host:port) to run; the operator's
    /// name is --user, the password comes from BOURSE_CLEARING_PASSWORD (unset: no
    /// credentials, as a service without [[operators]] takes from its own host).
    #[arg(long, conflicts_with_all = ["nodes", "instruments", "out"])]
    service: Option<String>,
    /// The operator's name for --service.
    #[arg(long, env = "BOURSE_CLEARING_USER", default_value = "admin")]
    user: String,
    /// The nodes of one core, comma-separated (host:port); repeat for each core, in the
    /// venue's core order.
    #[arg(long, required_unless_present = "service")]
    nodes: Vec<String>,
    /// The instruments the cores trade: a JSON array of instrument definitions (the
    /// `AddInstrument` form).
    #[arg(long, required_unless_present = "service")]
    instruments: Option<PathBuf>,
    /// Where the runs' plans are kept (`run-<id>.json`); every run replays the earlier ones.
    #[arg(long, default_value = "clearing")]
    dir: PathBuf,
    /// The run's id (default: one past the highest saved). An existing run's id resumes it.
    #[arg(long)]
    run_id: Option<u32>,
    /// Settlement price: VWAP of this many last trades before the cut (the service's
    /// configured rule when asking a service).
    #[arg(long)]
    last_trades: Option<usize>,
    /// Settlement price: only trades within this many milliseconds of the newest one.
    #[arg(long)]
    window_ms: Option<u64>,
    /// Write report.json and report.csv, and firm-<id>.json and .csv per firm, into this
    /// directory (a service writes its own under its state_dir).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    tls: crate::cluster_cmd::NodeTlsArgs,
}

pub fn run(command: ClearingCommand) -> Result<()> {
    match command {
        ClearingCommand::Run(args) if args.service.is_some() => run_on_service(&args),
        ClearingCommand::Run(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("tokio runtime")?;
            rt.block_on(clearing_run(*args))
        }
        ClearingCommand::Serve(args) => serve(args),
        ClearingCommand::Positions(args) => positions(&args),
        ClearingCommand::Settlements(args) => settlements(&args),
    }
}

/// `bourse clearing positions`: one line per PositionReport (symbol, settlement prices,
/// quantities by PosType, amounts by PosAmtType); a refusal is an error naming the reason.
fn positions(args: &PositionsArgs) -> Result<()> {
    use bourse_clearing::fix::{field, group, tag, PositionsClient};
    let password = std::env::var("BOURSE_CLEARING_PASSWORD").ok();
    let timeout = std::time::Duration::from_millis(args.timeout_ms);
    let mut client = PositionsClient::connect(
        args.fix,
        &args.comp_id,
        &args.target,
        password.as_deref(),
        timeout,
    )
    .with_context(|| format!("logging on to {} as {}", args.fix, args.comp_id))?;
    let answer = client.positions(
        args.account,
        &args.date,
        &args.session,
        args.symbol.as_deref(),
        timeout,
    )?;
    let _ = client.logout(timeout);
    if answer.result() != Some(0) {
        bail!(
            "RequestForPositions refused: PosReqResult {} ({})",
            field(&answer.ack, tag::POS_REQ_RESULT).unwrap_or("?"),
            field(&answer.ack, 58).unwrap_or("no text")
        );
    }
    for r in &answer.reports {
        let pairs = |count, members: &[bourse_fix::Tag]| -> String {
            group(r, count, members)
                .iter()
                .map(|e| {
                    e.iter()
                        .map(|(_, v)| v.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "account {} {} date {} {}: settle {} (type {}) prior {}; qty [{}]; amounts [{}]",
            field(r, tag::ACCOUNT).unwrap_or("?"),
            field(r, tag::SYMBOL).unwrap_or("?"),
            field(r, tag::CLEARING_BUSINESS_DATE).unwrap_or("?"),
            field(r, tag::SETTL_SESS_ID).unwrap_or("?"),
            field(r, tag::SETTL_PRICE).unwrap_or("-"),
            field(r, tag::SETTL_PRICE_TYPE).unwrap_or("-"),
            field(r, tag::PRIOR_SETTL_PRICE).unwrap_or("-"),
            pairs(
                tag::NO_POSITIONS,
                &[tag::POS_TYPE, tag::LONG_QTY, tag::SHORT_QTY]
            ),
            pairs(tag::NO_POS_AMT, &[tag::POS_AMT_TYPE, tag::POS_AMT]),
        );
    }
    Ok(())
}

/// `bourse clearing settlements`: `GET /v1/settlements/{date}`, one line per account and
/// instrument.
fn settlements(args: &SettlementsArgs) -> Result<()> {
    let mut client = bourse_admin::AdminClient::new(&args.service).map_err(|e| anyhow!(e))?;
    if let Some(user) = &args.user {
        let password = std::env::var("BOURSE_CLEARING_PASSWORD")
            .context("set BOURSE_CLEARING_PASSWORD to the credential's password")?;
        client = client.with_credentials(user, &password);
    }
    let mut path = format!("/v1/settlements/{}", args.date);
    if let Some(firm) = args.firm {
        path.push_str(&format!("?firm={firm}"));
    }
    let reply = client.get(&path).map_err(|e| anyhow!(e))?;
    if reply.status != 200 {
        bail!(
            "the clearing service answered {}: {}",
            reply.status,
            reply.body
        );
    }
    let lines = reply.body["lines"]
        .as_array()
        .context("the clearing service's answer has no lines")?;
    println!("settlement date {}: {} lines", args.date, lines.len());
    for l in lines {
        println!(
            "account {} firm {} {} securities {} cash {} (runs {})",
            l["account"],
            l["firm"],
            l["symbol"].as_str().unwrap_or("?"),
            l["securities"],
            l["cash"].as_str().unwrap_or("?"),
            l["runs"]
        );
    }
    Ok(())
}

fn serve(args: ServeArgs) -> Result<()> {
    let mut config = ClearingConfig::load(&args.config).map_err(|e| anyhow!(e))?;
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let defs = load_instruments(&config.instruments).map_err(|e| anyhow!(e))?;
    let node = ClearingNode::start(config, defs).map_err(|e| anyhow!(e))?;
    println!(
        "bourse clearing: serving {} (GET /v1/accounts/ID, /v1/firms/ID, /v1/runs, /v1/status, /metrics; POST /v1/runs)",
        node.url()
    );
    if let Some(fix) = node.fix_addr() {
        println!("bourse clearing: FIX 4.4 clearing data on {fix} (RequestForPositions)");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })
    .context("installing the Ctrl-C handler")?;
    let _ = rx.recv();
    println!("bourse clearing: stopping (snapshotting the state)");
    node.stop().map_err(|e| anyhow!(e))
}

/// Asks a running clearing service to run (or resume `--run-id`) and prints its report.
fn run_on_service(args: &RunArgs) -> Result<()> {
    let url = args.service.as_deref().expect("--service");
    let mut client = bourse_admin::AdminClient::new(url).map_err(|e| anyhow!(e))?;
    // A service without [[operators]] takes runs from its own host without credentials; one
    // with operators answers 401 to a request without them, which names what is missing.
    let password = std::env::var("BOURSE_CLEARING_PASSWORD").ok();
    if let Some(password) = &password {
        client = client.with_credentials(&args.user, password);
    }
    let request = RunRequest {
        kind: Some(if args.end_of_day {
            RunKind::EndOfDay
        } else {
            RunKind::Intermediate
        }),
        run_id: args.run_id,
        last_trades: args.last_trades,
        window_ms: args.window_ms,
        // Only the service's own scheduler marks a run as a schedule's slot.
        scheduled_ns: None,
    };
    let reply = client
        .post_json("/v1/runs", None, &serde_json::to_value(&request)?)
        .map_err(|e| anyhow!(e))?;
    if reply.status == 401 && password.is_none() {
        bail!(
            "the clearing service answered 401 (it has operators): set BOURSE_CLEARING_PASSWORD \
             to the password of --user {}: {}",
            args.user,
            reply.body
        );
    }
    if reply.status != 200 {
        bail!(
            "the clearing service answered {}: {}",
            reply.status,
            reply.body
        );
    }
    let report: Report = serde_json::from_value(reply.body)
        .context("the clearing service's answer is not a run report")?;
    report.print();
    Ok(())
}

fn parse_cores(nodes: &[String]) -> Result<Vec<Vec<SocketAddr>>> {
    nodes
        .iter()
        .map(|core| {
            core.split(',')
                .map(|a| {
                    a.trim()
                        .parse::<SocketAddr>()
                        .with_context(|| format!("--nodes: '{a}' is not host:port"))
                })
                .collect()
        })
        .collect()
}

async fn clearing_run(args: RunArgs) -> Result<()> {
    let cores = parse_cores(&args.nodes)?;
    args.tls.apply(&cores.concat())?;
    let defs = load_instruments(args.instruments.as_deref().expect("--instruments"))
        .map_err(|e| anyhow!(e))?;
    let rule = SettlementRule {
        last_trades: args
            .last_trades
            .unwrap_or(SettlementRule::default().last_trades),
        window_ns: args.window_ms.map(|ms| ms.saturating_mul(1_000_000)),
    };
    rule.check()
        .map_err(|e| anyhow::anyhow!("--last-trades: {e}"))?;
    let kind = if args.end_of_day {
        RunKind::EndOfDay
    } else {
        RunKind::Intermediate
    };
    let saved = saved_runs(&args.dir).map_err(|e| anyhow!(e))?;
    let run_id = args
        .run_id
        .unwrap_or_else(|| saved.last().map_or(1, |r| r.run_id + 1));
    let earlier: Vec<RunPlan> = saved
        .iter()
        .filter(|r| r.run_id < run_id)
        .cloned()
        .collect();
    let mut state = ClearingState::new(cores.len(), defs);
    let plan = match saved.iter().find(|r| r.run_id == run_id) {
        Some(plan) => {
            println!("resuming run {run_id} at its saved cut {:?}", plan.cut);
            replay(&mut state, &cores, &earlier, &plan.cut)
                .await
                .map_err(anyhow::Error::msg)?;
            if state.state_hash() != plan.state_hash {
                bail!(
                    "run {run_id}: the state at its cut hashes {:016x}, the saved plan saw {:016x}",
                    state.state_hash(),
                    plan.state_hash
                );
            }
            plan.clone()
        }
        None => {
            if let Some(later) = saved.iter().find(|r| r.run_id > run_id) {
                bail!(
                    "--run-id {run_id}: run {} is already saved after it",
                    later.run_id
                );
            }
            let mut cut = Vec::new();
            for nodes in &cores {
                cut.push(stream_end(nodes).await.map_err(anyhow::Error::msg)?);
            }
            replay(&mut state, &cores, &earlier, &cut)
                .await
                .map_err(anyhow::Error::msg)?;
            let plan = compute_run(&state, run_id, kind, &rule);
            save_plan(&args.dir, &plan).map_err(|e| anyhow!(e))?;
            plan
        }
    };
    let mut groups = Vec::new();
    for nodes in &cores {
        groups.push(with_ids(nodes).await.map_err(|e| anyhow!(e))?);
    }
    let results = execute(&plan, &groups, ExecuteOptions::default())
        .await
        .map_err(anyhow::Error::msg)?;
    let report = Report::new(&state, &plan, &results);
    report.print();
    if let Some(out) = &args.out {
        let firms = report.write(out).map_err(|e| anyhow!(e))?;
        println!(
            "wrote {}/report.json and report.csv, and {firms} firms' firm-<id>.json and .csv",
            out.display()
        );
    }
    Ok(())
}
