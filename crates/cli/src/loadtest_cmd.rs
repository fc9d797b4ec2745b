//! `bourse loadtest` and `bourse report`: run a load profile against a deployment and write
//! the MOEX-style report; re-render a report from its `results.json` and compare it with a
//! baseline run.
//!
//! The work is in the `bourse-loadgen` crate; this module finds the profile, prints a short
//! summary and sets the exit status (non-zero when a cross-check fails).

use anyhow::{anyhow, bail, Result};
use bourse_loadgen::{report, Profile, RunOptions};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct LoadtestArgs {
    /// A profile: a path to a TOML file, or the name of a shipped profile (smoke, moex-2020,
    /// ltp, peak) looked up in ./profiles and in the source tree's profiles/.
    #[arg(long)]
    profile: String,
    /// Directory for results.json, report.md and report.html (created if missing).
    #[arg(long)]
    out: PathBuf,
    /// Compare with an earlier run's directory.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Check the profile and stop (nothing is started).
    #[arg(long)]
    check: bool,
    /// No progress bar (it is also off when standard error is not a terminal).
    #[arg(long)]
    no_progress: bool,
}

#[derive(Args)]
pub struct ReportArgs {
    /// A directory written by `bourse loadtest`.
    dir: PathBuf,
    /// Another run's directory: the report gives the change against it in percent.
    #[arg(long)]
    baseline: Option<PathBuf>,
}

/// Where a profile name may be found, in order.
fn profile_candidates(name: &str) -> Vec<PathBuf> {
    let file = if name.ends_with(".toml") {
        name.to_string()
    } else {
        format!("{name}.toml")
    };
    vec![
        PathBuf::from(name),
        Path::new("profiles").join(&file),
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../profiles")
            .join(&file),
    ]
}

fn load_profile(name: &str) -> Result<(PathBuf, Profile)> {
    let path = profile_candidates(name)
        .into_iter()
        .find(|p| p.is_file())
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .ok_or_else(|| {
            anyhow!("no profile '{name}': not a file, and not in ./profiles or the source tree's profiles/")
        })?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
    let profile = Profile::parse(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok((path, profile))
}

pub fn loadtest(args: LoadtestArgs) -> Result<()> {
    let (path, profile) = load_profile(&args.profile)?;
    // Everything that can be refused is refused before anything starts.
    profile
        .check_runnable()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    let baseline = match &args.baseline {
        Some(dir) => Some(report::read(dir).map_err(|e| anyhow!(e))?),
        None => None,
    };
    if args.check {
        println!(
            "{}: profile '{}' is valid ({} markets, {} phases, {:.0} s)",
            path.display(),
            profile.name,
            profile.markets.len(),
            profile.phases.len(),
            profile.duration_s()
        );
        return Ok(());
    }
    eprintln!(
        "bourse loadtest: profile '{}' ({:.0} s of phases) against the {} target",
        profile.name,
        profile.duration_s(),
        profile.target.kind.name()
    );
    let results = bourse_loadgen::run(
        &profile,
        &RunOptions {
            progress: !args.no_progress,
            version: crate::report::version().to_string(),
        },
    )
    .map_err(|e| anyhow!(e))?;
    report::write(&args.out, &results, baseline.as_ref(), true)
        .map_err(|e| anyhow!("cannot write the report into {}: {e}", args.out.display()))?;
    let t = &results.totals;
    let l = &results.latency_all;
    println!(
        "{}: {} successful transactions ({} max/s), {} orders ({} max/s), {} trades ({} max/s)",
        profile.name,
        report::count(t.transactions),
        report::count(t.transactions_max_per_s),
        report::count(t.orders),
        report::count(t.orders_max_per_s),
        report::count(t.trades),
        report::count(t.trades_max_per_s),
    );
    println!(
        "latency from the scheduled send: mean {}, median {}, 90% {}, 99% {}, 99.9% {}",
        report::ns(l.mean as f64),
        report::ns(l.p50 as f64),
        report::ns(l.p90 as f64),
        report::ns(l.p99 as f64),
        report::ns(l.p999 as f64),
    );
    if let Some(s) = results.sustainable_per_s {
        println!(
            "highest sustainable rate: {} commands/s",
            report::count(s as u64)
        );
    }
    println!("report: {}", args.out.join(report::REPORT_HTML).display());
    let failed: Vec<&str> = results
        .checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("cross-checks failed: {}", failed.join("; "));
    }
    Ok(())
}

pub fn report_cmd(args: ReportArgs) -> Result<()> {
    let results = report::read(&args.dir).map_err(|e| anyhow!(e))?;
    let baseline = match &args.baseline {
        Some(dir) => Some(report::read(dir).map_err(|e| anyhow!(e))?),
        None => None,
    };
    report::write(&args.dir, &results, baseline.as_ref(), false)
        .map_err(|e| anyhow!("cannot write the report into {}: {e}", args.dir.display()))?;
    if let Some(b) = &baseline {
        for (name, now, _) in report::key_figures(&results).into_iter().take(12) {
            if let Some((_, was, _)) = report::key_figures(b).into_iter().find(|f| f.0 == name) {
                println!(
                    "{name:<45} {:>14.0} {:>14.0} {:>9}",
                    was,
                    now,
                    report::change(now, was)
                );
            }
        }
    }
    println!("report: {}", args.dir.join(report::REPORT_HTML).display());
    Ok(())
}
