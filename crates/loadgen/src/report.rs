//! The report: Markdown and HTML (with inline SVG charts) rendered from [`Results`], plus the
//! change against a baseline run in percent.
//!
//! Both formats come from one list of [`Section`]s, so they always say the same thing.

use crate::charts;
use crate::results::{Latency, Results};
use std::fmt::Write as _;
use std::path::Path;

/// A table of a section.
struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

struct Section {
    title: String,
    paragraphs: Vec<String>,
    tables: Vec<Table>,
    /// Inline SVG, HTML only.
    charts: Vec<(String, String)>,
}

impl Section {
    fn new(title: &str) -> Section {
        Section {
            title: title.into(),
            paragraphs: Vec::new(),
            tables: Vec::new(),
            charts: Vec::new(),
        }
    }
    fn text(mut self, p: impl Into<String>) -> Section {
        let p = p.into();
        // An empty paragraph is a figure that does not apply to this run.
        if !p.is_empty() {
            self.paragraphs.push(p);
        }
        self
    }
    fn table(mut self, headers: &[&str], rows: Vec<Vec<String>>) -> Section {
        self.tables.push(Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows,
        });
        self
    }
}

/// Formats nanoseconds for people: "850 ns", "12.3 µs", "4.56 ms".
pub fn ns(v: f64) -> String {
    if v < 1_000.0 {
        format!("{v:.0} ns")
    } else if v < 1_000_000.0 {
        format!("{:.1} µs", v / 1e3)
    } else if v < 1_000_000_000.0 {
        format!("{:.2} ms", v / 1e6)
    } else {
        format!("{:.2} s", v / 1e9)
    }
}

/// Formats a count with thousands separators: 1234567 → "1,234,567".
// `is_multiple_of` is newer than the workspace's rust-version (1.85).
#[allow(clippy::manual_is_multiple_of)]
pub fn count(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn rate(v: f64) -> String {
    count(v.round().max(0.0) as u64)
}

fn pct(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{:.1}%", v * 100.0))
}

/// Change from `base` to `now` in percent, signed.
pub fn change(now: f64, base: f64) -> String {
    if base == 0.0 {
        return if now == 0.0 {
            "0%".into()
        } else {
            "new".into()
        };
    }
    let c = (now - base) / base * 100.0;
    format!("{}{:.1}%", if c >= 0.0 { "+" } else { "" }, c)
}

/// The figures compared against a baseline: (name, value, higher is better).
pub fn key_figures(r: &Results) -> Vec<(String, f64, bool)> {
    let t = &r.totals;
    let l = &r.latency_all;
    let mut v = vec![
        (
            "successful transactions".to_string(),
            t.transactions as f64,
            true,
        ),
        ("orders registered".into(), t.orders as f64, true),
        ("trades".into(), t.trades as f64, true),
        (
            "max successful transactions per second".into(),
            t.transactions_max_per_s as f64,
            true,
        ),
        (
            "max orders per second".into(),
            t.orders_max_per_s as f64,
            true,
        ),
        (
            "max trades per second".into(),
            t.trades_max_per_s as f64,
            true,
        ),
        (
            "mean successful transactions per second".into(),
            t.transactions_mean_per_s,
            true,
        ),
        ("latency mean, ns".into(), l.mean as f64, false),
        ("latency median, ns".into(), l.p50 as f64, false),
        ("latency 90%, ns".into(), l.p90 as f64, false),
        ("latency 99%, ns".into(), l.p99 as f64, false),
        ("latency 99.9%, ns".into(), l.p999 as f64, false),
    ];
    for op in &r.by_op {
        v.push((
            format!("{} median, ns", op.op),
            op.latency.p50 as f64,
            false,
        ));
        v.push((format!("{} 99%, ns", op.op), op.latency.p99 as f64, false));
    }
    if let Some(s) = r.sustainable_per_s {
        v.push(("highest sustainable rate, commands/s".into(), s, true));
    }
    if let Some(m) = &r.market_data_delay {
        v.push(("publication delay median, ns".into(), m.p50 as f64, false));
        v.push(("publication delay 99%, ns".into(), m.p99 as f64, false));
    }
    if let Some(l) = &r.replication_lag {
        v.push(("replication lag median, ns".into(), l.p50 as f64, false));
        v.push(("replication lag 99%, ns".into(), l.p99 as f64, false));
    }
    v
}

fn latency_cells(l: &Latency) -> Vec<String> {
    vec![
        ns(l.mean as f64),
        ns(l.p50 as f64),
        ns(l.p90 as f64),
        ns(l.p99 as f64),
        ns(l.p999 as f64),
        ns(l.max as f64),
    ]
}

fn utc(unix_s: u64) -> String {
    // Civil date from days since the epoch (Howard Hinnant's algorithm), to avoid a
    // date-time dependency for one line of the report.
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Accounts added through the admin API during the run: their rate, and trading latency in
/// the seconds they overlapped against the other measured seconds.
fn accounts_under_load_section(a: &crate::results::AccountsUnderLoadFigures) -> Section {
    let mut during = vec![format!(
        "trading, seconds {}–{} (during)",
        a.first_s, a.end_s
    )];
    during.extend(latency_cells(&a.latency_during));
    let mut outside = vec!["trading, other measured seconds".to_string()];
    outside.extend(latency_cells(&a.latency_outside));
    let outcome = match &a.added.error {
        Some(e) => format!("{} ({e})", a.added.outcome),
        None => a.added.outcome.clone(),
    };
    Section::new("Accounts added under load")
        .text(format!(
            "{} accounts added to market `{}` through the venue's admin API (one bulk request; each account added, then funded: {} commands through the replicated path) in {:.2} s while the load ran: {} accounts/s. Outcome: {}. Trading latency below is the generator's (scheduled send → answer), merged from the HDR histograms of the measured seconds the additions overlapped, against the other measured seconds (warm-up left out).",
            count(a.added.accounts),
            a.added.market,
            count(a.added.commands),
            a.elapsed_s,
            count(a.accounts_per_s as u64),
            outcome,
        ))
        .text(if a.added.traded_accounts > 0 {
            format!(
                "The generator traded {} of the added accounts alongside its own (its sessions may trade them from the start; the core refuses their orders `unknown_account` until the addition reaches them): at the end of the run they held {} positions (account × instrument with a non-zero net quantity).",
                count(a.added.traded_accounts),
                count(a.added.positions_held),
            )
        } else {
            "The generator did not trade the added accounts (`traded` = 0).".to_string()
        })
        .table(
            &["figure", "mean", "median", "90%", "99%", "99.9%", "max"],
            vec![during, outside],
        )
}

/// Clearing runs asked of the clearing service while the load ran: when each started and
/// ended, what it cleared, and trading latency before, during and after it.
fn clearing_runs_section(runs: &[crate::results::ClearingRunFigures]) -> Section {
    let mut section = Section::new("Clearing under load").text(
        "A clearing service followed every core's committed stream while the load ran and made the runs below, asked at the profile's times (`[[clearing_runs]]`) or by itself at the clearing pauses of the venue's schedule (`bourse demo --day`). A run waits until the clearing state has applied everything the cores had applied when it was asked, takes that cut without pausing trading, fixes settlement prices, computes variation margin and obligations, and feeds the cash movements back to the cores through the sequenced path (one keyed command per account and core); it ends when the last movement is applied. The clearing service splits each run's time into waiting (until its state had applied the cores' streams up to their ends at the ask), computing (the plan, the report, settling it into the state) and executing (the movements submitted and answered). Trading latency is the generator's (scheduled send → answer), merged from the HDR histograms of the measured seconds before the run (since the previous one), the seconds it overlapped, and after it (until the next one); warm-up left out.",
    );
    let mut figures = Vec::new();
    let mut latency = Vec::new();
    for f in runs {
        let r = &f.run;
        let outcome = match &r.error {
            Some(e) => format!("{} ({e})", r.outcome),
            None => r.outcome.clone(),
        };
        figures.push(vec![
            format!("{} (run {})", r.kind, r.run_id),
            format!("{:.1}", r.at_s),
            format!("{:.2}", f.started_s),
            format!("{:.3}", f.elapsed_s),
            format!("{:.3}", r.wait_ms as f64 / 1e3),
            format!("{:.3}", r.compute_ms as f64 / 1e3),
            format!("{:.3}", r.execute_ms as f64 / 1e3),
            count(r.positions),
            count(r.accounts),
            format!(
                "{} ({} refused, {} pending)",
                count(r.movements),
                r.refused,
                r.pending
            ),
            bourse_core::format_scaled(r.margin_paid, bourse_core::CASH_SCALE),
            if r.unbalanced_instruments.is_empty() {
                "yes".into()
            } else {
                format!("NO: {:?}", r.unbalanced_instruments)
            },
            outcome,
        ]);
        for (label, l) in [
            (
                format!("run {}: before (s < {})", r.run_id, f.first_s),
                &f.latency_before,
            ),
            (
                format!("run {}: during (s {}–{})", r.run_id, f.first_s, f.end_s),
                &f.latency_during,
            ),
            (
                format!("run {}: after (s ≥ {})", r.run_id, f.end_s),
                &f.latency_after,
            ),
        ] {
            let mut row = vec![label];
            row.extend(latency_cells(l));
            latency.push(row);
        }
    }
    section = section
        .table(
            &[
                "run",
                "asked at s",
                "started s",
                "took s",
                "waiting s",
                "computing s",
                "executing s",
                "positions",
                "accounts",
                "movements",
                "VM paid",
                "VM sums to 0",
                "outcome",
            ],
            figures,
        )
        .table(
            &[
                "trading latency",
                "mean",
                "median",
                "90%",
                "99%",
                "99.9%",
                "max",
            ],
            latency,
        );
    section
}

/// What the cores applied during the run by who sent it, a source per row and a core per
/// column (`None`: the cores cannot tell their sources apart).
fn sources_section(r: &Results) -> Option<Section> {
    let all = crate::results::applied_by_source(&r.cores)?;
    let mut headers = vec!["source"];
    headers.extend(r.cores.iter().map(|c| c.market.as_str()));
    headers.push("all cores");
    let rows = all
        .named()
        .iter()
        .enumerate()
        .map(|(i, (name, total))| {
            let mut row = vec![name.to_string()];
            row.extend(r.cores.iter().map(|c| {
                c.applied_by_source
                    .map_or_else(|| "-".to_string(), |s| count(s.named()[i].1))
            }));
            row.push(count(*total));
            row
        })
        .collect();
    Some(
        Section::new("Commands applied by source")
            .text(
                "The commands each core applied during the run, told apart by the client id they \
                 arrived under: the gateways' links (the generator's sessions and anyone trading \
                 beside them), the admin API (an operator's actions, the schedule's phase \
                 changes), clearing runs (cash movements) and the venue's setup. The cross-checks \
                 compare the gateways' forwarded count with the first row alone; the last row \
                 must be 0.",
            )
            .table(&headers, rows),
    )
}

/// The commands the cores applied by source, one line per source (`admin          3`), for
/// a summary printed at the end of a run (empty: the cores cannot tell their sources apart).
pub fn sources_lines(r: &Results) -> Vec<String> {
    crate::results::applied_by_source(&r.cores).map_or_else(Vec::new, |all| {
        all.named()
            .iter()
            .map(|(name, n)| format!("{name:<9}{:>12}", count(*n)))
            .collect()
    })
}

fn sections(r: &Results, baseline: Option<&Results>, with_charts: bool) -> Vec<Section> {
    let t = &r.totals;
    let mut out = Vec::new();

    let mut head = Section::new("About this run")
        .text(format!(
            "Profile `{}`{}. Started {}, ran {:.1} s. Target: {} ({}; protocol recorded: {}; {} session(s), {} generator worker(s), {} pacing).",
            r.profile_name,
            if r.profile.description.is_empty() { String::new() } else { format!(": {}", r.profile.description) },
            utc(r.started_unix_s),
            r.elapsed_s,
            r.target.kind,
            r.target.note,
            r.target.protocol,
            r.target.sessions,
            r.target.workers,
            r.target.pacing,
        ))
        .text(format!(
            "Machine: {} CPUs, {}, Linux {}; load average {:.2} at the start and {:.2} at the end{}. Software: bourse {}.",
            r.machine.cpus,
            r.machine.model,
            r.machine.kernel,
            r.machine.load_average_start,
            r.machine.load_average_end,
            if r.machine.load_average_start > r.machine.cpus as f64 * 0.5 {
                " (the machine was shared with other work: figures are from a loaded machine)"
            } else {
                ""
            },
            r.version,
        ));
    if r.target.kind == "in-process" {
        head = head.text(
            "These figures are from the in-process target: commands go from the generator to \
             each market's core over in-memory queues, with no network, gateway, sequencer or \
             replication. They are not comparable with full-stack results such as LTP's.",
        );
    }
    out.push(head);

    let base_row = |name: &str, f: &dyn Fn(&Results) -> [u64; 3]| -> Vec<String> {
        let v = f(r);
        let mut row = vec![name.to_string()];
        row.extend(v.iter().map(|x| count(*x)));
        row
    };
    let mut rows = vec![
        base_row("Done (count)", &|r| {
            [r.totals.transactions, r.totals.orders, r.totals.trades]
        }),
        base_row("Max per second", &|r| {
            [
                r.totals.transactions_max_per_s,
                r.totals.orders_max_per_s,
                r.totals.trades_max_per_s,
            ]
        }),
    ];
    if let Some(b) = baseline {
        let mut done = vec!["Done (count), baseline".to_string()];
        done.extend([b.totals.transactions, b.totals.orders, b.totals.trades].map(count));
        let mut max = vec!["Max per second, baseline".to_string()];
        max.extend(
            [
                b.totals.transactions_max_per_s,
                b.totals.orders_max_per_s,
                b.totals.trades_max_per_s,
            ]
            .map(count),
        );
        let ch = vec![
            "Change in max per second".to_string(),
            change(
                t.transactions_max_per_s as f64,
                b.totals.transactions_max_per_s as f64,
            ),
            change(t.orders_max_per_s as f64, b.totals.orders_max_per_s as f64),
            change(t.trades_max_per_s as f64, b.totals.trades_max_per_s as f64),
        ];
        rows.push(done);
        rows.push(max);
        rows.push(ch);
    }
    out.push(
        Section::new("Transactions, orders and trades")
            .text(
                "As in the seeds' reports, a successful transaction is a command that registered \
                 a new order or removed (or replaced) a registered one: new orders accepted, \
                 cancels, replaces and mass cancels that succeeded. Rejected commands are not \
                 transactions.",
            )
            .table(&["", "Transactions", "Orders", "Trades"], rows)
            .text(format!(
                "Commands sent {}, answered {}, unanswered {}. Mean {} successful transactions/s over the measured phases. Rejected: {} orders, {} cancels/replaces (mostly orders that traded away before the cancel arrived); of all rejects, {} were refused as busy (overload refused at the gateway, not processed). The generator found a core's queue full {} times.",
                count(t.commands_sent),
                count(t.answers),
                count(t.unanswered),
                rate(t.transactions_mean_per_s),
                count(t.orders_rejected),
                count(t.cancels_rejected),
                count(t.busy_rejects),
                count(t.queue_full),
            ))
            .text(if t.not_sent > 0 {
                format!(
                    "Not sent: {} more commands were due by the schedule but still waiting in the generator when the phases had ended on the clock (the target did not take them in time); the run stopped offering them rather than run on. The offered rate was not carried.",
                    count(t.not_sent)
                )
            } else {
                String::new()
            }),
    );

    let seeds = Section::new("Beside the seeds")
        .text("The seeds' figures come from full production stacks (network, gateways, replication); the row for this run says which target it measured.")
        .table(
            &["system", "successful tx/s (peak)", "orders/s", "median", "mean", "99%"],
            vec![
                vec!["MOEX ASTS equities, 2020".into(), "74,636".into(), "38,070".into(), "~300 µs (305 µs ≤ 18k tx/s, 2014)".into(), "".into(), "660 µs (≤ 18k tx/s, 2014)".into()],
                vec!["MOEX SPECTRA derivatives, 2020".into(), "182,000 (stable ~150,000)".into(), "".into(), "100–150 µs (TWIME RTT, 3k–90k tx/s)".into(), "".into(), "".into()],
                vec!["SSE LTP, 3 gateways × 8 SETs".into(), "".into(), "105,000".into(), "".into(), "637 µs".into(), "991 µs".into()],
                vec![
                    format!("this run ({})", r.target.kind),
                    count(t.transactions_max_per_s),
                    count(t.orders_max_per_s),
                    ns(r.latency_all.p50 as f64),
                    ns(r.latency_all.mean as f64),
                    ns(r.latency_all.p99 as f64),
                ],
            ],
        );
    out.push(seeds);

    out.push(
        Section::new("Cross-checks")
            .text("Figures from the generator's answers against what the cores counted themselves.")
            .table(
                &["check", "expected", "measured", "result"],
                r.checks
                    .iter()
                    .map(|c| {
                        vec![
                            c.name.clone(),
                            count(c.expected),
                            count(c.actual),
                            if c.ok { "ok".into() } else { "MISMATCH".into() },
                        ]
                    })
                    .collect(),
            ),
    );

    if let Some(section) = sources_section(r) {
        out.push(section);
    }

    let mut rates = Section::new("Rates over time").text(
        "Per second: commands offered by the schedule, and what the cores answered (successful transactions, orders registered, cancels, trades), by the second the answer arrived.",
    );
    let kept_s = r.profile.generator.series_seconds_max;
    if r.elapsed_s > f64::from(kept_s) {
        // The generator kept its per-second series for the first seconds only (a bound on
        // its memory): say so, or a short table would read as a short run.
        rates = rates.text(format!(
            "Per-second series (this table, the charts, the load ranges, the recovery after \
             peaks) cover the run's first {kept_s} s of {:.0} s (`generator.series_seconds_max`); \
             the totals cover all of it.",
            r.elapsed_s
        ));
    }
    if with_charts {
        if let Ok(svg) = charts::rates(r) {
            rates.charts.push(("Rates per second".into(), svg));
        }
        if let Ok(svg) = charts::latency_over_time(r) {
            rates
                .charts
                .push(("Response time per second (median, mean, 99%)".into(), svg));
        }
    }
    let step = (r.per_second.len() / 40).max(1);
    rates = rates.table(
        &[
            "second",
            "phase",
            "offered",
            "transactions",
            "orders",
            "cancels",
            "trades",
            "median",
            "99%",
        ],
        r.per_second
            .iter()
            .step_by(step)
            .map(|s| {
                vec![
                    s.t_s.to_string(),
                    format!("{}{}", s.phase, if s.warmup { " (warm-up)" } else { "" }),
                    count(s.offered),
                    count(s.transactions),
                    count(s.orders),
                    count(s.cancels),
                    count(s.trades),
                    ns(s.latency_p50_ns as f64),
                    ns(s.latency_p99_ns as f64),
                ]
            })
            .collect(),
    );
    if step > 1 {
        rates = rates.text(format!(
            "Every {step}th second shown; results.json has all of them."
        ));
    }
    out.push(rates);

    let mut dist = Section::new("Response time per command type").text(
        "Latency counts from each command's scheduled send time to its answer (open loop: a stall in the target or the generator is not hidden). Measured phases only.",
    );
    if with_charts {
        if let Ok(svg) = charts::distribution(r) {
            dist.charts
                .push(("Distribution per command type (log time axis)".into(), svg));
        }
    }
    let mut op_rows: Vec<Vec<String>> = r
        .by_op
        .iter()
        .map(|o| {
            let mut row = vec![o.op.clone(), count(o.sent), count(o.succeeded)];
            row.extend(latency_cells(&o.latency));
            row
        })
        .collect();
    let mut all = vec![
        "all".to_string(),
        count(t.commands_sent),
        count(t.transactions),
    ];
    all.extend(latency_cells(&r.latency_all));
    op_rows.push(all);
    dist = dist.table(
        &[
            "type",
            "sent",
            "succeeded",
            "mean",
            "median",
            "90%",
            "99%",
            "99.9%",
            "max",
        ],
        op_rows,
    );
    out.push(dist);

    let md_by_range = r.load_ranges.iter().any(|lr| lr.md_delay.is_some());
    out.push(
        Section::new("Response time per load range")
            .text(if md_by_range {
                "Seconds grouped by their successful transactions per second, as seed 001 gives its figures per load range; the last two columns are the market data publication delay (see below) of the trades read from the feed in those seconds."
            } else {
                "Seconds grouped by their successful transactions per second, as seed 001 gives its figures per load range."
            })
            .table(
                &if md_by_range {
                    vec!["load range, tx/s", "seconds", "mean tx/s", "mean", "median", "90%", "99%", "99.9%", "max", "md delay median", "md delay 99%"]
                } else {
                    vec!["load range, tx/s", "seconds", "mean tx/s", "mean", "median", "90%", "99%", "99.9%", "max"]
                },
                r.load_ranges
                    .iter()
                    .map(|lr| {
                        let name = match lr.to_per_s {
                            Some(to) => format!("{} – {}", rate(lr.from_per_s), rate(to)),
                            None => format!("{} and more", rate(lr.from_per_s)),
                        };
                        let mut row = vec![name, lr.seconds.to_string(), rate(lr.transactions_mean_per_s)];
                        if lr.seconds > 0 {
                            row.extend(latency_cells(&lr.latency));
                        } else {
                            row.extend((0..6).map(|_| "–".to_string()));
                        }
                        if md_by_range {
                            match &lr.md_delay {
                                Some(m) if m.count > 0 => {
                                    row.push(ns(m.p50 as f64));
                                    row.push(ns(m.p99 as f64));
                                }
                                _ => row.extend(["–".to_string(), "–".to_string()]),
                            }
                        }
                        row
                    })
                    .collect(),
            ),
    );

    out.push(
        Section::new("Where the time goes (LTP's stage table)")
            .text("Mean time per command in each stage, and its share of the door-to-door mean; LTP's shares (3×3 configuration) beside them. Stages this target does not have are n/a.")
            .table(
                &["stage", "mean", "share", "LTP share", "note"],
                r.stages
                    .iter()
                    .map(|s| {
                        vec![
                            s.name.clone(),
                            s.mean_ns.map_or("n/a".into(), ns),
                            pct(s.share),
                            pct(s.ltp_share),
                            s.note.clone(),
                        ]
                    })
                    .collect(),
            ),
    );

    let opt = |l: &Option<Latency>| -> Vec<String> {
        match l {
            Some(l) => latency_cells(l),
            None => (0..6).map(|_| "n/a".to_string()).collect(),
        }
    };
    let mut md = vec![if r.target.kind == "cluster" {
        "market data publication delay (trade applied → its record read from the feed)".to_string()
    } else {
        "market data publication delay (after the ack)".to_string()
    }];
    md.extend(opt(&r.market_data_delay));
    let mut rl = vec!["replication lag".to_string()];
    rl.extend(opt(&r.replication_lag));
    let mut md_rows = vec![md];
    if r.market_data_send_to_read.is_some() {
        let mut row = vec!["· of which the packet's SendingTime → read".to_string()];
        row.extend(opt(&r.market_data_send_to_read));
        md_rows.push(row);
    }
    md_rows.push(rl);
    out.push(
        Section::new("Market data and replication")
            .text(match r.target.kind.as_str() {
                "cluster" => "The nodes publish market data (the leader of each core sends, the others stand by); the trades on each core's feed are counted by a subscriber and cross-checked against the cores' own count (see the cross-checks). Replication lag: for every log entry, how much later the last of a core's three replicas applied it than the first (timed in this process, where every node runs on one clock; the percentiles and the maximum are the highest over the cores). Market data publication delay: for every trade, from the moment its core applied the log entry that made it (the leader's apply, which is also when the order's acknowledgement leaves the node; stamped by the first of two subscribers of the leader's committed stream to see the entry: the deployment's entry timer, or the node's publisher, whose stamp is the packet's SendingTime) to the moment a subscriber read the first copy (feed A or B) of the trade's record from loopback UDP, all on this process's one wall clock. It includes the committed stream to the node's publisher, the encoding, the send, the loopback and the subscriber's wake-up; the row below it is the part after the publisher took the entry (SendingTime to the read). The percentiles and the maximum are the highest over the cores. SPECTRA's figure (4–5 µs mean at 50,000 tx/s, 2020) runs from the trade's commit in the core to the publisher's send, without the subscriber's side.",
                "gateway" => "Not measured by this target: its in-process cores publish no market data and replicate nothing. (SPECTRA 2020: 4–5 µs mean publication delay at 50,000 tx/s.)",
                _ => "Not measured by this target: the in-process deployment publishes no market data and replicates nothing. (SPECTRA 2020: 4–5 µs mean publication delay at 50,000 tx/s.)",
            })
            .table(&["figure", "mean", "median", "90%", "99%", "99.9%", "max"], md_rows),
    );

    if let Some(a) = &r.accounts_under_load {
        out.push(accounts_under_load_section(a));
    }
    if !r.clearing_runs.is_empty() {
        out.push(clearing_runs_section(&r.clearing_runs));
    }

    let mut rec = Section::new("Recovery after peaks");
    if r.recovery.is_empty() {
        rec = rec.text("This profile has no repeated peaks.");
    } else {
        rec = rec
            .text("After each peak: the share of the answers during the peak that were busy rejects (overload refused at the gateway); the 99th percentile of the answers in the 5 s before the peak and during it (by 100 ms windows of answer arrival, to one bin of 12%); the time from the peak's end until the 99th percentile of 100 ms windows is back within 1.5× its value before the peak, and until their mean is back within 1.5× (or +50 µs) of the mean before, each for three windows in a row.")
            .table(
                &[
                    "peak",
                    "from, s",
                    "to, s",
                    "busy rejected",
                    "99% before",
                    "99% during",
                    "p99 recovered after",
                    "mean before",
                    "mean during",
                    "mean recovered after",
                ],
                r.recovery
                    .iter()
                    .map(|p| {
                        vec![
                            p.peak.to_string(),
                            format!("{:.1}", p.peak_start_s),
                            format!("{:.1}", p.peak_end_s),
                            if p.peak_answered == 0 {
                                "–".into()
                            } else {
                                format!(
                                    "{:.1}% ({} of {})",
                                    100.0 * p.peak_busy as f64 / p.peak_answered as f64,
                                    count(p.peak_busy),
                                    count(p.peak_answered)
                                )
                            },
                            p.baseline_p99_ns.map_or("–".into(), ns),
                            p.peak_p99_ns.map_or("–".into(), ns),
                            p.p99_recovery_ms.map_or(
                                "not recovered before the next peak or the phase's end".into(),
                                |ms| format!("{ms:.0} ms"),
                            ),
                            ns(p.baseline_mean_ns),
                            ns(p.peak_mean_ns),
                            p.recovery_ms.map_or(
                                "not recovered before the next peak or the phase's end".into(),
                                |ms| format!("{ms:.0} ms"),
                            ),
                        ]
                    })
                    .collect(),
            );
    }
    out.push(rec);

    if !r.search.is_empty() {
        out.push(
            Section::new("Search for the highest sustainable rate")
                .text(format!(
                    "Closed loop: each step runs at one rate; it keeps up if the answers match the offered rate and the 99th percentile stays within the limit. A step that kept up but missed only the latency limit is run again at the same rate before the rate counts as failed; after a failed step the generator waits for the target to drain. Highest sustained (the highest rate at which at least half of its steps kept up): {} commands/s.",
                    r.sustainable_per_s.map_or("none".into(), rate)
                ))
                .table(
                    &["step start, s", "worker", "offered/s", "answered/s", "99%", "kept up"],
                    r.search
                        .iter()
                        .map(|s| {
                            vec![
                                format!("{:.1}", s.start_s),
                                s.worker.to_string(),
                                rate(s.offered_per_s),
                                rate(s.answered_per_s),
                                ns(s.p99_ns as f64),
                                if s.kept_up { "yes".into() } else { "no".into() },
                            ]
                        })
                        .collect(),
                ),
        );
    }

    out.push(
        Section::new("Cores").table(
            &[
                "market",
                "commands",
                "orders accepted",
                "trades",
                "cancels",
                "replaces",
                "live at end",
                "setup",
                "state hash",
            ],
            r.cores
                .iter()
                .map(|c| {
                    vec![
                        c.market.clone(),
                        count(c.commands),
                        count(c.orders_accepted),
                        count(c.trades),
                        count(c.cancels),
                        count(c.replaces),
                        count(c.live_orders_at_end),
                        format!("{} commands in {} ms", count(c.setup_commands), c.setup_ms),
                        c.state_hash.clone(),
                    ]
                })
                .collect(),
        ),
    );

    let p = &r.profile;
    out.push(
        Section::new("Profile")
            .table(
                &["market", "kind", "instruments", "accounts", "share of load", "resting orders kept"],
                p.markets
                    .iter()
                    .map(|m| {
                        vec![
                            m.name.clone(),
                            format!("{:?}", m.kind).to_lowercase(),
                            count(m.instruments as u64),
                            count(m.accounts as u64),
                            format!("{:.2}", m.share),
                            count(m.live_orders_target as u64),
                        ]
                    })
                    .collect(),
            )
            .table(
                &["phase", "seconds", "rate", "hot instruments", "measured"],
                p.phases
                    .iter()
                    .map(|ph| {
                        vec![
                            ph.name.clone(),
                            format!("{}", ph.duration_s),
                            describe_rate(&ph.rate),
                            ph.hot.map_or("–".into(), |h| {
                                format!(
                                    "{} instrument(s) take {:.0}% of new orders{}",
                                    h.instruments,
                                    h.share * 100.0,
                                    if h.during_peaks_only { " during peaks" } else { "" }
                                )
                            }),
                            if ph.warmup { "no (warm-up)".into() } else { "yes".into() },
                        ]
                    })
                    .collect(),
            )
            .text(format!(
                "Mix (weights): limit {}, market {}, IOC {}, FOK {}, cancel {}, replace {}, mass cancel {}; {:.1}% of limit orders cross on arrival.",
                p.mix.limit, p.mix.market, p.mix.ioc, p.mix.fok, p.mix.cancel, p.mix.replace, p.mix.mass_cancel, p.mix.crossing_share * 100.0
            )),
    );

    if let Some(b) = baseline {
        let base: Vec<(String, f64, bool)> = key_figures(b);
        let rows = key_figures(r)
            .into_iter()
            .map(|(name, now, higher_better)| {
                let was = base.iter().find(|(n, _, _)| *n == name).map(|x| x.1);
                let verdict = match was {
                    Some(w) if w != 0.0 => {
                        let better = if higher_better { now > w } else { now < w };
                        if (now - w).abs() / w.abs() < 0.02 {
                            "same"
                        } else if better {
                            "better"
                        } else {
                            "worse"
                        }
                    }
                    _ => "",
                };
                let fmt = |v: f64| {
                    if name.ends_with(", ns") {
                        ns(v)
                    } else {
                        rate(v)
                    }
                };
                vec![
                    name.trim_end_matches(", ns").to_string(),
                    was.map_or("–".into(), fmt),
                    fmt(now),
                    was.map_or("–".into(), |w| change(now, w)),
                    verdict.into(),
                ]
            })
            .collect();
        out.push(
            Section::new("Change against the baseline")
                .text(format!(
                    "Baseline: profile `{}`, started {}, version {}, target {}.",
                    b.profile_name,
                    utc(b.started_unix_s),
                    b.version,
                    b.target.kind
                ))
                .table(&["figure", "baseline", "this run", "change", ""], rows)
                .text(if b.profile_name != r.profile_name || b.target.kind != r.target.kind {
                    "The baseline ran another profile or target: these changes are not like for like."
                } else {
                    "Same profile and target: the change is the system's (or the machine's: compare the load averages)."
                }),
        );
    }
    out
}

fn describe_rate(r: &crate::profile::Rate) -> String {
    use crate::profile::Rate::*;
    match r {
        Constant(c) => format!("constant {}/s", rate(c.per_s)),
        Ramp(c) => format!("ramp {} → {}/s", rate(c.from_per_s), rate(c.to_per_s)),
        Steps(c) => format!(
            "steps {} → {}/s by {} every {} s",
            rate(c.from_per_s),
            rate(c.to_per_s),
            rate(c.step_per_s),
            c.step_s
        ),
        Peaks(c) => format!(
            "{}/s with {} s at {}/s every {} s",
            rate(c.base_per_s),
            c.peak_s,
            rate(c.peak_per_s),
            c.period_s
        ),
        Search(c) => format!(
            "search from {}/s (×{} per {} s step, p99 ≤ {} µs, up to {}/s)",
            rate(c.start_per_s),
            c.factor,
            c.step_s,
            c.p99_limit_us,
            rate(c.max_per_s)
        ),
    }
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The report as Markdown (no charts: the tables carry the figures).
pub fn markdown(r: &Results, baseline: Option<&Results>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Load test `{}` ({} target)\n",
        r.profile_name, r.target.kind
    );
    for sec in sections(r, baseline, false) {
        let _ = writeln!(s, "## {}\n", sec.title);
        let mut paragraphs = sec.paragraphs.iter();
        // The first paragraph introduces the tables; the rest follow them.
        if let Some(p) = paragraphs.next() {
            let _ = writeln!(s, "{p}\n");
        }
        for t in &sec.tables {
            let _ = writeln!(
                s,
                "| {} |",
                t.headers
                    .iter()
                    .map(|h| md_cell(h))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            let _ = writeln!(
                s,
                "|{}|",
                t.headers
                    .iter()
                    .enumerate()
                    .map(|(i, _)| if i == 0 { "---" } else { "---:" })
                    .collect::<Vec<_>>()
                    .join("|")
            );
            for row in &t.rows {
                let _ = writeln!(
                    s,
                    "| {} |",
                    row.iter()
                        .map(|c| md_cell(c))
                        .collect::<Vec<_>>()
                        .join(" | ")
                );
            }
            let _ = writeln!(s);
        }
        for p in paragraphs {
            let _ = writeln!(s, "{p}\n");
        }
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Backticks in the prose become code spans in HTML.
fn prose(s: &str) -> String {
    let mut out = String::new();
    for (i, part) in esc(s).split('`').enumerate() {
        if i % 2 == 1 {
            let _ = write!(out, "<code>{part}</code>");
        } else {
            out.push_str(part);
        }
    }
    out
}

const CSS: &str = r#"
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0; background: #f6f7f9; color: #1d2330; }
main { max-width: 1160px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 26px; margin: 8px 0 4px; }
h2 { font-size: 19px; margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 2px solid #dde1e8; }
p { line-height: 1.5; margin: 8px 0; max-width: 70em; }
.note { background: #fff6e0; border-left: 4px solid #e6a700; padding: 8px 12px; }
table { border-collapse: collapse; margin: 10px 0 14px; background: #fff; font-size: 14px; box-shadow: 0 1px 2px rgba(0,0,0,.06); }
th, td { padding: 6px 10px; border-bottom: 1px solid #e6e9ee; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
td.wrap { white-space: normal; text-align: left; max-width: 26em; }
th { background: #eef1f5; font-weight: 600; }
tr:last-child td { border-bottom: none; }
.bad { color: #b00020; font-weight: 600; } .good { color: #0a7d38; font-weight: 600; }
figure { margin: 12px 0 18px; background: #fff; padding: 8px; box-shadow: 0 1px 2px rgba(0,0,0,.06); }
figure svg { width: 100%; height: auto; display: block; }
figcaption { font-size: 13px; color: #555; margin: 4px 6px 0; }
code { background: #eef1f5; padding: 1px 4px; border-radius: 3px; }
.kpis { display: flex; flex-wrap: wrap; gap: 12px; margin: 14px 0; }
.kpi { background: #fff; padding: 10px 16px; min-width: 150px; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
.kpi b { display: block; font-size: 22px; } .kpi span { font-size: 12px; color: #555; }
"#;

/// The report as one self-contained HTML page with inline SVG charts.
pub fn html(r: &Results, baseline: Option<&Results>) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>bourse load test: {}</title><style>{CSS}</style></head><body><main>\n",
        esc(&r.profile_name)
    );
    let _ = writeln!(
        s,
        "<h1>Load test <code>{}</code> — {} target</h1>",
        esc(&r.profile_name),
        esc(&r.target.kind)
    );
    let t = &r.totals;
    let checks = if r.checks_pass() {
        "<b class=\"good\">all pass</b>"
    } else {
        "<b class=\"bad\">MISMATCH</b>"
    };
    let _ = writeln!(
        s,
        "<div class=\"kpis\">\
         <div class=\"kpi\"><b>{}</b><span>max successful tx/s</span></div>\
         <div class=\"kpi\"><b>{}</b><span>successful transactions</span></div>\
         <div class=\"kpi\"><b>{}</b><span>trades</span></div>\
         <div class=\"kpi\"><b>{}</b><span>median response</span></div>\
         <div class=\"kpi\"><b>{}</b><span>99% response</span></div>\
         <div class=\"kpi\">{checks}<span>cross-checks</span></div></div>",
        count(t.transactions_max_per_s),
        count(t.transactions),
        count(t.trades),
        ns(r.latency_all.p50 as f64),
        ns(r.latency_all.p99 as f64),
    );
    for sec in sections(r, baseline, true) {
        let _ = writeln!(s, "<h2>{}</h2>", esc(&sec.title));
        let mut paragraphs = sec.paragraphs.iter();
        if let Some(p) = paragraphs.next() {
            let class = if p.contains("not comparable") {
                " class=\"note\""
            } else {
                ""
            };
            let _ = writeln!(s, "<p{class}>{}</p>", prose(p));
        }
        for (caption, svg) in &sec.charts {
            let _ = writeln!(
                s,
                "<figure>{svg}<figcaption>{}</figcaption></figure>",
                esc(caption)
            );
        }
        for t in &sec.tables {
            s.push_str("<table><thead><tr>");
            for h in &t.headers {
                let _ = write!(s, "<th>{}</th>", esc(h));
            }
            s.push_str("</tr></thead><tbody>\n");
            for row in &t.rows {
                s.push_str("<tr>");
                for (i, c) in row.iter().enumerate() {
                    let prose_column = t.headers.get(i).is_some_and(|h| h == "note");
                    let class = match c.as_str() {
                        "MISMATCH" | "worse" => " class=\"bad\"",
                        "ok" | "better" => " class=\"good\"",
                        _ if prose_column || (c.len() > 40 && i > 0) => " class=\"wrap\"",
                        _ => "",
                    };
                    let _ = write!(s, "<td{class}>{}</td>", esc(c));
                }
                s.push_str("</tr>\n");
            }
            s.push_str("</tbody></table>\n");
        }
        for p in paragraphs {
            let class = if p.contains("not comparable") {
                " class=\"note\""
            } else {
                ""
            };
            let _ = writeln!(s, "<p{class}>{}</p>", prose(p));
        }
    }
    s.push_str("</main></body></html>\n");
    s
}

/// File names inside a report directory.
pub const RESULTS_JSON: &str = "results.json";
pub const REPORT_MD: &str = "report.md";
pub const REPORT_HTML: &str = "report.html";

/// Writes the report (Markdown and HTML) into `dir`; `results.json` too when `with_json`.
pub fn write(
    dir: &Path,
    r: &Results,
    baseline: Option<&Results>,
    with_json: bool,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if with_json {
        let json = serde_json::to_string_pretty(r).map_err(std::io::Error::other)?;
        std::fs::write(dir.join(RESULTS_JSON), json)?;
    }
    std::fs::write(dir.join(REPORT_MD), markdown(r, baseline))?;
    std::fs::write(dir.join(REPORT_HTML), html(r, baseline))?;
    Ok(())
}

/// Reads `results.json` from a report directory.
pub fn read(dir: &Path) -> Result<Results, String> {
    let path = dir.join(RESULTS_JSON);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let r: Results = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a bourse results file: {e}", path.display()))?;
    if r.format != crate::results::RESULTS_FORMAT {
        return Err(format!(
            "{} has results format {}, this bourse reads format {}",
            path.display(),
            r.format,
            crate::results::RESULTS_FORMAT
        ));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_signed_percentages() {
        assert_eq!(change(110.0, 100.0), "+10.0%");
        assert_eq!(change(90.0, 100.0), "-10.0%");
        assert_eq!(change(0.0, 0.0), "0%");
        assert_eq!(change(5.0, 0.0), "new");
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(ns(850.0), "850 ns");
        assert_eq!(ns(12_300.0), "12.3 µs");
        assert_eq!(ns(4_560_000.0), "4.56 ms");
    }

    #[test]
    fn prose_escapes_html_and_keeps_code_spans() {
        assert_eq!(prose("a <b> `x`"), "a &lt;b&gt; <code>x</code>");
    }
}
