//! `bourse clearing run`: an intermediate or end-of-day clearing of one or more replicated
//! cores (see the `bourse-clearing` crate). It reads each core's committed stream up to its
//! current end (the cut; trading goes on), replaying the runs saved in `--dir` on the way,
//! computes the run, saves its plan (before submitting anything), submits the cash movements
//! through the sequenced path, and prints a report per account (CSV and JSON with `--out`).
//! Run again with the same `--run-id` after a crash, it resumes the saved plan and applies
//! nothing twice.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bourse_clearing::state::value_to_cash_floor;
use bourse_clearing::{
    compute_run, execute, replay, stream_end, ClearingState, ExecuteOptions, MovementResult,
    RunKind, RunPlan, SettlementRule,
};
use bourse_cluster::client::node_status_brief;
use bourse_cluster::{tokio, NodeId};
use bourse_core::{format_scaled, AccountId, Instrument, Market, CASH_SCALE};
use clap::{Args, Subcommand};
use serde::Serialize;

const STATUS_TIMEOUT_MS: u64 = 2_000;

#[derive(Subcommand)]
pub enum ClearingCommand {
    /// Clear the cores up to their current end and feed the results back to them.
    Run(RunArgs),
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
    /// The nodes of one core, comma-separated (host:port); repeat for each core, in the
    /// venue's core order.
    #[arg(long, required = true)]
    nodes: Vec<String>,
    /// The instruments the cores trade: a JSON array of instrument definitions (the
    /// `AddInstrument` form).
    #[arg(long)]
    instruments: PathBuf,
    /// Where the runs' plans are kept (`run-<id>.json`); every run replays the earlier ones.
    #[arg(long, default_value = "clearing")]
    dir: PathBuf,
    /// The run's id (default: one past the highest saved). An existing run's id resumes it.
    #[arg(long)]
    run_id: Option<u32>,
    /// Settlement price: VWAP of this many last trades before the cut.
    #[arg(long, default_value_t = 100)]
    last_trades: usize,
    /// Settlement price: only trades within this many milliseconds of the newest one.
    #[arg(long)]
    window_ms: Option<u64>,
    /// Write report.json and report.csv into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    tls: crate::cluster_cmd::NodeTlsArgs,
}

pub fn run(command: ClearingCommand) -> Result<()> {
    match command {
        ClearingCommand::Run(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("tokio runtime")?;
            rt.block_on(clearing_run(args))
        }
    }
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

fn load_instruments(path: &Path) -> Result<Vec<Instrument>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let defs: Vec<Instrument> = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a JSON array of instruments", path.display()))?;
    for d in &defs {
        d.validate()
            .map_err(|e| anyhow::anyhow!("{}: instrument {}: {e}", path.display(), d.instrument))?;
    }
    Ok(defs)
}

fn plan_path(dir: &Path, run_id: u32) -> PathBuf {
    dir.join(format!("run-{run_id:06}.json"))
}

/// The saved plans, in run order.
fn saved_runs(dir: &Path) -> Result<Vec<RunPlan>> {
    let mut runs = Vec::new();
    if !dir.exists() {
        return Ok(runs);
    }
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with("run-") && name.ends_with(".json")) {
            continue;
        }
        let text = fs::read_to_string(&path)?;
        let plan: RunPlan = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a clearing run plan", path.display()))?;
        runs.push(plan);
    }
    runs.sort_by_key(|r| r.run_id);
    Ok(runs)
}

/// Writes the plan durably (temporary file, fsync, rename, fsync of the directory) before
/// anything of it is submitted, so that a restarted run finds exactly this plan.
fn save_plan(dir: &Path, plan: &RunPlan) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = plan_path(dir, plan.run_id);
    let tmp = path.with_extension("json.tmp");
    let mut f = fs::File::create(&tmp)?;
    f.write_all(serde_json::to_string_pretty(plan)?.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, &path)?;
    fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// Each node's id, asked of the node (the client follows the leader by id).
async fn with_ids(nodes: &[SocketAddr]) -> Result<Vec<(NodeId, SocketAddr)>> {
    let mut out = Vec::new();
    for &addr in nodes {
        let status = node_status_brief(addr, Duration::from_millis(STATUS_TIMEOUT_MS))
            .await
            .with_context(|| format!("node {addr} does not answer"))?;
        out.push((status.id, addr));
    }
    Ok(out)
}

async fn clearing_run(args: RunArgs) -> Result<()> {
    let cores = parse_cores(&args.nodes)?;
    args.tls.apply(&cores.concat())?;
    let defs = load_instruments(&args.instruments)?;
    let rule = SettlementRule {
        last_trades: args.last_trades,
        window_ns: args.window_ms.map(|ms| ms.saturating_mul(1_000_000)),
    };
    rule.check()
        .map_err(|e| anyhow::anyhow!("--last-trades: {e}"))?;
    let kind = if args.end_of_day {
        RunKind::EndOfDay
    } else {
        RunKind::Intermediate
    };
    let saved = saved_runs(&args.dir)?;
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
            save_plan(&args.dir, &plan)?;
            plan
        }
    };
    let mut groups = Vec::new();
    for nodes in &cores {
        groups.push(with_ids(nodes).await?);
    }
    let results = execute(&plan, &groups, ExecuteOptions::default())
        .await
        .map_err(anyhow::Error::msg)?;
    let report = Report::new(&state, &plan, &results);
    report.print();
    if let Some(out) = &args.out {
        report.write(out)?;
        println!("wrote {}/report.json and report.csv", out.display());
    }
    Ok(())
}

/// One account's lines of a run.
#[derive(Serialize, Default)]
struct AccountLine {
    account: u32,
    firm: Option<u32>,
    /// Futures contracts held, net, over all instruments.
    futures_lots: i64,
    variation_margin: String,
    realised_pnl: String,
    obligations_cash: String,
    obligations_securities: i64,
    movement: String,
    result: String,
}

#[derive(Serialize)]
struct Report {
    run_id: u32,
    kind: RunKind,
    cut: Vec<u64>,
    state_hash: String,
    settlement_prices: BTreeMap<u32, i64>,
    rounding_kept: String,
    movements: usize,
    refused: usize,
    accounts: Vec<AccountLine>,
}

impl Report {
    fn new(
        state: &ClearingState,
        plan: &RunPlan,
        results: &BTreeMap<(usize, u64), MovementResult>,
    ) -> Report {
        let cash = |v: i128| format_scaled(v, CASH_SCALE);
        let mut vm: BTreeMap<AccountId, i128> = BTreeMap::new();
        let mut lots: BTreeMap<AccountId, i64> = BTreeMap::new();
        for l in &plan.margin {
            *vm.entry(l.account).or_default() += l.vm.0;
        }
        let mut realised: BTreeMap<AccountId, i128> = BTreeMap::new();
        for (&(account, instrument), p) in state.positions() {
            if let Some(def) = state.definition(instrument) {
                if def.market == Market::Futures {
                    *lots.entry(account).or_default() += p.qty;
                }
                *realised.entry(account).or_default() += value_to_cash_floor(def, p.realised_value);
            }
        }
        let mut obligations: BTreeMap<AccountId, (i128, i64)> = BTreeMap::new();
        for l in &plan.obligations {
            let o = obligations.entry(l.account).or_default();
            o.0 += l.cash.0;
            o.1 += l.securities;
        }
        let mut moved: BTreeMap<AccountId, (i128, String)> = BTreeMap::new();
        let mut refused = 0;
        for m in &plan.movements {
            let result = match results.get(&(m.core, m.seq)) {
                Some(MovementResult::Done { applied_index }) => format!("applied@{applied_index}"),
                Some(MovementResult::Refused { reason, .. }) => {
                    refused += 1;
                    format!("margin call ({reason:?})")
                }
                None => "not submitted".into(),
            };
            let e = moved.entry(m.account).or_default();
            e.0 += m.amount.0;
            e.1 = result;
        }
        let accounts = realised
            .keys()
            .chain(vm.keys())
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|a| {
                let (mv, result) = moved.get(&a).cloned().unwrap_or_default();
                let (ob_cash, ob_sec) = obligations.get(&a).copied().unwrap_or_default();
                AccountLine {
                    account: a.0,
                    firm: state.firm_of(a).map(|f| f.0),
                    futures_lots: lots.get(&a).copied().unwrap_or(0),
                    variation_margin: cash(vm.get(&a).copied().unwrap_or(0)),
                    realised_pnl: cash(realised.get(&a).copied().unwrap_or(0)),
                    obligations_cash: cash(ob_cash),
                    obligations_securities: ob_sec,
                    movement: cash(mv),
                    result,
                }
            })
            .collect();
        Report {
            run_id: plan.run_id,
            kind: plan.kind,
            cut: plan.cut.clone(),
            state_hash: format!("{:016x}", plan.state_hash),
            settlement_prices: plan.prices.iter().map(|(i, p)| (i.0, p.0)).collect(),
            rounding_kept: cash(plan.rounding.values().map(|c| c.0).sum()),
            movements: plan.movements.len(),
            refused,
            accounts,
        }
    }

    fn print(&self) {
        println!(
            "clearing run {} ({:?}) cut {:?} state {} movements {} refused {} rounding kept {}",
            self.run_id,
            self.kind,
            self.cut,
            self.state_hash,
            self.movements,
            self.refused,
            self.rounding_kept
        );
        for (i, p) in &self.settlement_prices {
            println!("  settlement price of instrument {i}: {p}");
        }
        println!(
            "{:>10} {:>6} {:>8} {:>18} {:>18} {:>18} {:>12} {:>18}  result",
            "account",
            "firm",
            "fut.lots",
            "variation margin",
            "realised P&L",
            "obligation cash",
            "oblig.units",
            "movement"
        );
        for a in &self.accounts {
            println!(
                "{:>10} {:>6} {:>8} {:>18} {:>18} {:>18} {:>12} {:>18}  {}",
                a.account,
                a.firm.map_or("-".into(), |f| f.to_string()),
                a.futures_lots,
                a.variation_margin,
                a.realised_pnl,
                a.obligations_cash,
                a.obligations_securities,
                a.movement,
                a.result
            );
        }
    }

    fn write(&self, out: &Path) -> Result<()> {
        fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        fs::write(out.join("report.json"), serde_json::to_string_pretty(self)?)?;
        let mut csv = String::from(
            "account,firm,futures_lots,variation_margin,realised_pnl,obligations_cash,obligations_securities,movement,result\n",
        );
        for a in &self.accounts {
            csv.push_str(&format!(
                "{},{},{},{},{},{},{},{},{}\n",
                a.account,
                a.firm.map_or(String::new(), |f| f.to_string()),
                a.futures_lots,
                a.variation_margin,
                a.realised_pnl,
                a.obligations_cash,
                a.obligations_securities,
                a.movement,
                a.result
            ));
        }
        fs::write(out.join("report.csv"), csv)?;
        Ok(())
    }
}
