//! Saved run plans (`run-<id>.json`, written durably before a run submits anything) and run
//! reports: one line per account (firm, futures lots, variation margin, realised P&L,
//! obligations, the movement and what the core said), written as JSON and CSV for the whole
//! run and for each firm.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use bourse_core::{format_scaled, AccountId, Market, CASH_SCALE};
use serde::{Deserialize, Serialize};

use crate::run::{RunKind, RunPlan};
use crate::service::MovementResult;
use crate::state::{value_to_cash_floor, ClearingState};

fn plan_path(dir: &Path, run_id: u32) -> PathBuf {
    dir.join(format!("run-{run_id:06}.json"))
}

/// The plans saved in `dir`, in run order (none when the directory does not exist).
pub fn saved_runs(dir: &Path) -> Result<Vec<RunPlan>, String> {
    let mut runs = Vec::new();
    if !dir.exists() {
        return Ok(runs);
    }
    let entries = fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with("run-") && name.ends_with(".json")) {
            continue;
        }
        let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let plan: RunPlan = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a clearing run plan: {e}", path.display()))?;
        runs.push(plan);
    }
    runs.sort_by_key(|r| r.run_id);
    Ok(runs)
}

/// Writes `bytes` to `dir/name` durably: a temporary file, fsync, rename, fsync of the
/// directory, so a crash leaves either the old file or the whole new one.
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("{}/{name}: {e}", dir.display());
    fs::create_dir_all(dir).map_err(fail)?;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = fs::File::create(&tmp).map_err(fail)?;
    f.write_all(bytes).map_err(fail)?;
    f.sync_all().map_err(fail)?;
    fs::rename(&tmp, &path).map_err(fail)?;
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(fail)
}

/// Saves the plan durably before anything of it is submitted, so that a restarted run (or a
/// standby taking over) finds exactly this plan.
pub fn save_plan(dir: &Path, plan: &RunPlan) -> Result<(), String> {
    let text = serde_json::to_string_pretty(plan).map_err(|e| e.to_string())?;
    let path = plan_path(dir, plan.run_id);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a file name");
    write_durably(dir, name, text.as_bytes())
}

/// One account's lines of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountLine {
    pub account: u32,
    pub firm: Option<u32>,
    /// Futures contracts held, net, over all instruments.
    pub futures_lots: i64,
    pub variation_margin: String,
    pub realised_pnl: String,
    pub obligations_cash: String,
    pub obligations_securities: i64,
    pub movement: String,
    pub result: String,
    /// The fees this run charged the account (the venue's account: those it received,
    /// negative).
    #[serde(default)]
    pub fees: String,
    /// Initial margin at the cut, over the account's futures on every core.
    #[serde(default)]
    pub initial_margin: String,
    /// The margin call the run issued (summed over cores; 0 also when it closed one).
    #[serde(default)]
    pub margin_call: String,
    /// The debts of earlier runs this run collects (in `movement`), summed over cores.
    #[serde(default)]
    pub debt_collected: String,
    /// What this run's debits left unpaid (the cores refused them for want of free cash):
    /// a debt the account carries to the next run, and a margin call.
    #[serde(default)]
    pub debt_unpaid: String,
}

/// A run's report: its figures, and one line per account that holds a position or moved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub run_id: u32,
    pub kind: RunKind,
    pub cut: Vec<u64>,
    pub state_hash: String,
    pub settlement_prices: BTreeMap<u32, i64>,
    pub rounding_kept: String,
    pub movements: usize,
    pub refused: usize,
    /// Commands of the run not (yet) known to be applied: non-zero for a run stopped half
    /// way, until it is resumed.
    pub pending: usize,
    /// End of day: the Day orders the cores expired.
    pub orders_expired: u64,
    /// Margin calls the run issued for a non-zero amount (one per account and core).
    #[serde(default)]
    pub margin_calls: usize,
    /// The debts of earlier runs this run collects, in total.
    #[serde(default)]
    pub debts_collected: String,
    /// What the run's refused debits left unpaid, in total: the accounts carry it as debts.
    /// The movements applied, the rounding kept and this, less `debts_collected`, sum to
    /// zero.
    #[serde(default)]
    pub debts_unpaid: String,
    /// Where the run's time went (absent before the run was executed, and in a report of an
    /// older build).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<RunTiming>,
    pub accounts: Vec<AccountLine>,
}

/// Where one run's time went, in milliseconds of the node's clock, by step. Under load the
/// wait can dominate: the state must apply everything the cores had applied when the run was
/// asked (a bulk addition of accounts just before the ask included), while computing grows
/// with the positions and executing with the movements and the cores' load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunTiming {
    /// Waiting until the clearing state had applied each core's stream up to its end at the
    /// ask (a resumed run: until the state had settled the run).
    pub wait_ms: u64,
    /// Computing the plan at the cut, saving it durably, building the report and settling
    /// the plan into the state (0 for a resumed run, computed before).
    pub compute_ms: u64,
    /// Submitting the run's commands to the cores (pipelined) until each was answered, and
    /// reading their results back from the committed streams.
    pub execute_ms: u64,
    /// When the run was asked and when its last step ended, in nanoseconds since the Unix
    /// epoch by the node's system clock (not the schedule's clock, which a demo compresses):
    /// what a report of trading around the run lines its latency up with. 0 in a report of
    /// an older build.
    #[serde(default)]
    pub asked_unix_ns: u64,
    #[serde(default)]
    pub done_unix_ns: u64,
}

impl RunTiming {
    /// The three steps, summed.
    pub fn total_ms(&self) -> u64 {
        self.wait_ms + self.compute_ms + self.execute_ms
    }
}

fn cash(v: i128) -> String {
    format_scaled(v, CASH_SCALE)
}

impl Report {
    /// The report of `plan` on `state` (at the run's cut or after it: the positions' lots
    /// and realised P&L are read from it), with the results known so far.
    pub fn new(
        state: &ClearingState,
        plan: &RunPlan,
        results: &BTreeMap<(usize, u64), MovementResult>,
    ) -> Report {
        let mut vm: BTreeMap<AccountId, i128> = BTreeMap::new();
        for l in &plan.margin {
            *vm.entry(l.account).or_default() += l.vm.0;
        }
        let mut lots: BTreeMap<AccountId, i64> = BTreeMap::new();
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
        let mut fees: BTreeMap<AccountId, i128> = BTreeMap::new();
        for l in &plan.fees {
            *fees.entry(l.account).or_default() += l.fee.0;
            if let Some(s) = &plan.fee_schedule {
                *fees.entry(AccountId(s.venue_account)).or_default() -= l.fee.0;
            }
        }
        let mut moved: BTreeMap<AccountId, i128> = BTreeMap::new();
        for m in &plan.movements {
            *moved.entry(m.account).or_default() += m.amount.0;
        }
        let mut margin: BTreeMap<AccountId, (i128, i128)> = BTreeMap::new();
        for l in &plan.initial_margin {
            let m = margin.entry(l.account).or_default();
            m.0 += l.initial_margin.0;
            m.1 += l.call.0;
        }
        let mut collected: BTreeMap<AccountId, i128> = BTreeMap::new();
        for d in &plan.debts {
            *collected.entry(d.account).or_default() += d.amount.0;
        }
        let accounts = realised
            .keys()
            .chain(vm.keys())
            .chain(moved.keys())
            .chain(margin.keys())
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|a| {
                let mv = moved.get(&a).copied().unwrap_or_default();
                let (ob_cash, ob_sec) = obligations.get(&a).copied().unwrap_or_default();
                let (im, call) = margin.get(&a).copied().unwrap_or_default();
                AccountLine {
                    account: a.0,
                    firm: state.firm_of(a).map(|f| f.0),
                    futures_lots: lots.get(&a).copied().unwrap_or(0),
                    variation_margin: cash(vm.get(&a).copied().unwrap_or(0)),
                    realised_pnl: cash(realised.get(&a).copied().unwrap_or(0)),
                    obligations_cash: cash(ob_cash),
                    obligations_securities: ob_sec,
                    movement: cash(mv),
                    result: String::new(),
                    fees: cash(fees.get(&a).copied().unwrap_or(0)),
                    initial_margin: cash(im),
                    margin_call: cash(call),
                    debt_collected: cash(collected.get(&a).copied().unwrap_or(0)),
                    debt_unpaid: cash(0),
                }
            })
            .collect();
        let mut report = Report {
            run_id: plan.run_id,
            kind: plan.kind,
            cut: plan.cut.clone(),
            state_hash: format!("{:016x}", plan.state_hash),
            settlement_prices: plan.prices.iter().map(|(i, p)| (i.0, p.0)).collect(),
            rounding_kept: cash(plan.rounding.values().map(|c| c.0).sum()),
            movements: plan.movements.len(),
            refused: 0,
            pending: 0,
            orders_expired: 0,
            margin_calls: plan.initial_margin.iter().filter(|l| l.call.0 > 0).count(),
            debts_collected: cash(plan.debts.iter().map(|d| d.amount.0).sum()),
            debts_unpaid: cash(0),
            timing: None,
            accounts,
        };
        report.set_results(plan, results);
        report
    }

    /// Sets what the cores said of the run's commands (the figures and each account's
    /// result) from `results`, by (core, seq).
    pub fn set_results(
        &mut self,
        plan: &RunPlan,
        results: &BTreeMap<(usize, u64), MovementResult>,
    ) {
        let mut result_of: BTreeMap<AccountId, String> = BTreeMap::new();
        let mut unpaid: BTreeMap<AccountId, i128> = BTreeMap::new();
        let mut refused = 0;
        for m in &plan.movements {
            let result = match results.get(&(m.core, m.seq)) {
                Some(MovementResult::Done { applied_index, .. }) => {
                    format!("applied@{applied_index}")
                }
                Some(MovementResult::Refused { reason, .. }) => {
                    refused += 1;
                    if m.amount.0 < 0 {
                        *unpaid.entry(m.account).or_default() -= m.amount.0;
                    }
                    format!("unpaid, margin call ({reason:?})")
                }
                None => "not submitted".into(),
            };
            result_of.insert(m.account, result);
        }
        self.debts_unpaid = cash(unpaid.values().sum());
        for line in &mut self.accounts {
            line.result = result_of
                .remove(&AccountId(line.account))
                .unwrap_or_default();
            line.debt_unpaid = cash(unpaid.get(&AccountId(line.account)).copied().unwrap_or(0));
        }
        let expected: usize = (0..plan.cut.len()).map(|c| plan.commands(c).len()).sum();
        self.refused = refused;
        self.pending = expected.saturating_sub(results.len());
        self.orders_expired = results
            .values()
            .map(|r| match r {
                MovementResult::Done { orders_expired, .. } => *orders_expired,
                MovementResult::Refused { .. } => 0,
            })
            .sum();
    }

    /// The report as a table on standard output.
    pub fn print(&self) {
        println!(
            "clearing run {} ({:?}) cut {:?} state {} movements {} refused {} pending {} rounding kept {} orders expired {} margin calls {} debts collected {} unpaid {}",
            self.run_id,
            self.kind,
            self.cut,
            self.state_hash,
            self.movements,
            self.refused,
            self.pending,
            self.rounding_kept,
            self.orders_expired,
            self.margin_calls,
            self.debts_collected,
            self.debts_unpaid
        );
        if let Some(t) = &self.timing {
            println!(
                "  took {} ms: waiting for the cores' ends at the ask {} ms, computing {} ms, executing {} ms",
                t.total_ms(),
                t.wait_ms,
                t.compute_ms,
                t.execute_ms
            );
        }
        for (i, p) in &self.settlement_prices {
            println!("  settlement price of instrument {i}: {p}");
        }
        println!(
            "{:>10} {:>6} {:>8} {:>18} {:>18} {:>18} {:>12} {:>18} {:>18} {:>18} {:>18} {:>18}  result",
            "account",
            "firm",
            "fut.lots",
            "variation margin",
            "realised P&L",
            "obligation cash",
            "oblig.units",
            "movement",
            "initial margin",
            "margin call",
            "debt collected",
            "debt unpaid"
        );
        for a in &self.accounts {
            println!(
                "{:>10} {:>6} {:>8} {:>18} {:>18} {:>18} {:>12} {:>18} {:>18} {:>18} {:>18} {:>18}  {}",
                a.account,
                a.firm.map_or("-".into(), |f| f.to_string()),
                a.futures_lots,
                a.variation_margin,
                a.realised_pnl,
                a.obligations_cash,
                a.obligations_securities,
                a.movement,
                a.initial_margin,
                a.margin_call,
                a.debt_collected,
                a.debt_unpaid,
                a.result
            );
        }
    }

    /// The report's account lines as CSV (a header line, then one line per account).
    pub fn csv(lines: &[AccountLine]) -> String {
        let mut csv = String::from(
            "account,firm,futures_lots,variation_margin,realised_pnl,obligations_cash,obligations_securities,fees,movement,result,initial_margin,margin_call,debt_collected,debt_unpaid\n",
        );
        for a in lines {
            csv.push_str(&format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                a.account,
                a.firm.map_or(String::new(), |f| f.to_string()),
                a.futures_lots,
                a.variation_margin,
                a.realised_pnl,
                a.obligations_cash,
                a.obligations_securities,
                a.fees,
                a.movement,
                a.result,
                a.initial_margin,
                a.margin_call,
                a.debt_collected,
                a.debt_unpaid
            ));
        }
        csv
    }

    /// Writes `report.json` and `report.csv` into `out`, and for each firm
    /// `firm-<id>.json` and `firm-<id>.csv` with only its accounts' lines (accounts of no
    /// known firm go to `firm-none.*`). Returns the number of firm files pairs written.
    pub fn write(&self, out: &Path) -> Result<usize, String> {
        let json = |v: &Report| serde_json::to_string_pretty(v).map_err(|e| e.to_string());
        write_durably(out, "report.json", json(self)?.as_bytes())?;
        write_durably(out, "report.csv", Report::csv(&self.accounts).as_bytes())?;
        let mut by_firm: BTreeMap<Option<u32>, Vec<AccountLine>> = BTreeMap::new();
        for a in &self.accounts {
            by_firm.entry(a.firm).or_default().push(a.clone());
        }
        for (firm, lines) in &by_firm {
            let name = firm.map_or("firm-none".into(), |f| format!("firm-{f}"));
            let firm_report = Report {
                accounts: lines.clone(),
                ..self.clone()
            };
            write_durably(out, &format!("{name}.json"), json(&firm_report)?.as_bytes())?;
            write_durably(out, &format!("{name}.csv"), Report::csv(lines).as_bytes())?;
        }
        Ok(by_firm.len())
    }
}
