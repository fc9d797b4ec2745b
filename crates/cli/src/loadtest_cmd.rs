//! `bourse loadtest` and `bourse report`: run a load profile against a deployment and write
//! the MOEX-style report; re-render a report from its `results.json` and compare it with a
//! baseline run.
//!
//! The work is in the `bourse-loadgen` crate; this module finds the profile, prints a short
//! summary and sets the exit status (non-zero when a cross-check fails).

use anyhow::{anyhow, bail, Result};
use bourse_loadgen::gateway::{SessionProtocol, WorkerPlan, ACCOUNTS_PER_SESSION_MAX};
use bourse_loadgen::profile::{FsyncMode, Protocol, TargetKind};
use bourse_loadgen::{report, Connection, Profile, RunOptions};
use bourse_venue::{Backend, DeploymentSpec, LocalDeployment, MarketSpec};
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
    /// Run the generator as this many `bourse loadgen-worker` processes, each with its own
    /// sessions and share of the rate and accounts (gateway and cluster targets); their
    /// records are merged into one report. Replaces the profile's generator.workers.
    #[arg(long)]
    workers: Option<u32>,
    /// Keep the deployment's journals and stores (in DIR/deployment) instead of deleting them.
    #[arg(long)]
    keep_data: bool,
}

/// `bourse loadgen-worker`: one generator worker in its own process, started by
/// `bourse loadtest --workers N`. Not meant to be run by hand.
#[derive(Args)]
pub struct WorkerArgs {
    /// The profile, as JSON (written by the parent).
    #[arg(long)]
    profile_json: PathBuf,
    /// The worker's sessions, as JSON (written by the parent).
    #[arg(long)]
    plan_json: PathBuf,
    #[arg(long)]
    worker: u32,
    /// When the run starts, in nanoseconds since the Unix epoch.
    #[arg(long)]
    start_unix_ns: u64,
    /// Where to write the worker's record (JSON).
    #[arg(long)]
    out: PathBuf,
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
    let (path, mut profile) = load_profile(&args.profile)?;
    if let Some(n) = args.workers {
        if n == 0 || n > bourse_loadgen::profile::WORKERS_MAX {
            bail!(
                "--workers must be 1 to {}",
                bourse_loadgen::profile::WORKERS_MAX
            );
        }
        if profile.target.kind == TargetKind::InProcess {
            bail!(
                "--workers runs the generator as processes that connect to the gateways: the \
                 profile's target.kind must be \"gateway\" or \"cluster\", not \"in-process\""
            );
        }
        if profile.markets.iter().any(|m| m.accounts < n) {
            bail!("--workers {n}: a market has fewer accounts than workers");
        }
        profile.generator.workers = n;
    }
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
    let options = RunOptions {
        progress: !args.no_progress,
        version: crate::report::version().to_string(),
        ticker: false,
        stop: None,
        live: None,
    };
    let results = match profile.target.kind {
        TargetKind::InProcess => bourse_loadgen::run(&profile, &options).map_err(|e| anyhow!(e))?,
        _ => run_deployed(&profile, &options, &args)?,
    };
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
    let sources = report::sources_lines(&results);
    if !sources.is_empty() {
        println!("commands the cores applied, by source:");
        for line in sources {
            println!("  {line}");
        }
    }
    if let Some(s) = results.sustainable_per_s {
        println!(
            "highest sustainable rate: {} commands/s",
            report::count(s as u64)
        );
    }
    println!("report: {}", args.out.join(report::REPORT_HTML).display());
    let failed = results.failed_checks();
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

/// The accounts each session of each worker trades: every account a worker's flows use in
/// any market (a session may trade its accounts in every market: the gateway routes by
/// instrument), in chunks of at most 255, and at least the profile's share of sessions.
pub fn worker_sessions(profile: &Profile) -> Vec<Vec<Vec<u32>>> {
    let workers = profile.generator.workers;
    let min_sessions = (profile.target.sessions / workers).max(1) as usize;
    (0..workers)
        .map(|w| {
            let mut accounts: Vec<u32> = Vec::new();
            for (i, m) in profile.markets.iter().enumerate() {
                let (first, count) = bourse_loadgen::flow::worker_accounts(m.accounts, w, workers);
                accounts.extend(first..first + count);
                // The accounts added under load it trades: allowed from the start, refused
                // by the core until they are added.
                let (first, count) = bourse_loadgen::flow::worker_late_accounts(profile, i, w);
                accounts.extend(first..first + count);
            }
            accounts.sort_unstable();
            accounts.dedup();
            let sessions = accounts
                .len()
                .div_ceil(ACCOUNTS_PER_SESSION_MAX)
                .max(min_sessions)
                .min(accounts.len().max(1));
            let per = accounts.len().div_ceil(sessions).max(1);
            accounts.chunks(per).map(|c| c.to_vec()).collect()
        })
        .collect()
}

/// The deployment a gateway or cluster profile asks for.
pub fn deployment_spec(profile: &Profile, data_dir: PathBuf, verbose: bool) -> DeploymentSpec {
    let workers = profile.generator.workers;
    let markets = profile
        .markets
        .iter()
        .enumerate()
        .map(|(m, spec)| MarketSpec {
            name: spec.name.clone(),
            instruments: bourse_loadgen::flow::instruments(spec, m),
            setup: (0..workers)
                .flat_map(|w| bourse_loadgen::setup_commands(profile, m, w))
                .collect(),
        })
        .collect();
    DeploymentSpec {
        markets,
        backend: match profile.target.kind {
            TargetKind::Cluster => Backend::Cluster,
            _ => Backend::InProcess,
        },
        protocol: match profile.target.protocol {
            Protocol::Fix => SessionProtocol::Fix,
            Protocol::Binary => SessionProtocol::Binary,
        },
        gateways: profile.target.gateways as usize,
        worker_sessions: worker_sessions(profile),
        data_dir,
        orders_max: bourse_loadgen::orders_max_of(profile),
        accounts_max: profile
            .markets
            .iter()
            .map(|m| m.accounts)
            .max()
            .unwrap_or(1)
            .saturating_add(
                profile
                    .accounts_under_load
                    .as_ref()
                    .map_or(0, |a| a.count.min(u64::from(u32::MAX)) as u32),
            )
            + 16,
        fsync: match profile.target.fsync {
            FsyncMode::Always => bourse_cluster::FsyncSetting::Always,
            FsyncMode::Batch => bourse_cluster::FsyncSetting::Batch,
            FsyncMode::Never => bourse_cluster::FsyncSetting::Never,
        },
        market_data: profile.target.market_data && profile.target.kind == TargetKind::Cluster,
        core_in_flight_max: profile.target.core_in_flight_max.map(|n| n as usize),
        bounds: None,
        monitor: None,
        extra_fix_sessions: Vec::new(),
        verbose,
    }
}

/// Starts the local deployment of a gateway or cluster profile, runs it and stops it.
fn run_deployed(
    profile: &Profile,
    options: &RunOptions,
    args: &LoadtestArgs,
) -> Result<bourse_loadgen::Results> {
    let data_dir = if args.keep_data {
        args.out.join("deployment")
    } else {
        std::env::temp_dir().join(format!("bourse-loadtest-{}", std::process::id()))
    };
    let _ = std::fs::remove_dir_all(&data_dir);
    eprintln!("starting the deployment in {}", data_dir.display());
    let t0 = std::time::Instant::now();
    let mut deployment = LocalDeployment::start(deployment_spec(profile, data_dir.clone(), true))?;
    eprintln!(
        "deployment ready in {:.1} s: {}",
        t0.elapsed().as_secs_f64(),
        deployment.describe()
    );
    if let Some(plan) = &profile.accounts_under_load {
        std::fs::create_dir_all(&args.out)
            .map_err(|e| anyhow!("cannot create {}: {e}", args.out.display()))?;
        deployment.add_accounts_under_load(plan.clone(), args.out.join("admin-audit.jsonl"));
    }
    if !profile.clearing_runs.is_empty() {
        // The clearing service's runs, per-firm reports and snapshot stay with the report.
        let dir = args.out.join("clearing");
        deployment.clear_under_load(profile.clearing_runs.clone(), dir.clone())?;
        eprintln!(
            "clearing service on every core: {} (runs and reports in {})",
            deployment
                .clearing_node()
                .map_or_else(String::new, |n| n.url()),
            dir.display()
        );
    }
    if args.workers.is_some() {
        let dir = args.out.join("workers");
        std::fs::create_dir_all(&dir)
            .map_err(|e| anyhow!("cannot create {}: {e}", dir.display()))?;
        let profile_json = dir.join("profile.json");
        std::fs::write(&profile_json, serde_json::to_vec(profile)?)
            .map_err(|e| anyhow!("cannot write {}: {e}", profile_json.display()))?;
        // A worker process is bounded: the phases, the drain, and a margin to start and stop.
        let limit = std::time::Duration::from_secs_f64(
            profile.duration_s() + profile.generator.drain_timeout_s + 60.0,
        );
        deployment.remote = Some(Box::new(move |w, plan: &WorkerPlan| {
            let plan_json = dir.join(format!("plan-{w}.json"));
            let out = dir.join(format!("record-{w}.json"));
            std::fs::write(
                &plan_json,
                serde_json::to_vec(plan).map_err(|e| e.to_string())?,
            )
            .map_err(|e| format!("cannot write {}: {e}", plan_json.display()))?;
            let profile_json = profile_json.clone();
            Ok(Connection::Remote(Box::new(move |start_unix_ns| {
                run_worker_process(&profile_json, &plan_json, w, start_unix_ns, &out, limit)
            })))
        }));
    }
    let result = bourse_loadgen::run_on(profile, options, &mut deployment);
    deployment.stop();
    if !args.keep_data {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    result.map_err(|e| anyhow!(e))
}

/// Runs one `bourse loadgen-worker` child and reads its record; kills it past `limit`.
fn run_worker_process(
    profile_json: &Path,
    plan_json: &Path,
    worker: usize,
    start_unix_ns: u64,
    out: &Path,
    limit: std::time::Duration,
) -> Result<bourse_loadgen::Record, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut child = std::process::Command::new(exe)
        .arg("loadgen-worker")
        .arg("--profile-json")
        .arg(profile_json)
        .arg("--plan-json")
        .arg(plan_json)
        .arg("--worker")
        .arg(worker.to_string())
        .arg("--start-unix-ns")
        .arg(start_unix_ns.to_string())
        .arg("--out")
        .arg(out)
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start worker process {worker}: {e}"))?;
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "worker process {worker} did not finish within {limit:?}; killed"
                ));
            }
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(50)),
            Err(e) => return Err(format!("worker process {worker}: {e}")),
        }
    };
    if !status.success() {
        return Err(format!("worker process {worker} failed ({status})"));
    }
    let text = std::fs::read(out).map_err(|e| format!("cannot read {}: {e}", out.display()))?;
    let wire: bourse_loadgen::generator::RecordWire =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(wire.into_record())
}

/// `bourse loadgen-worker`: connects the planned sessions and runs one generator worker.
pub fn worker(args: WorkerArgs) -> Result<()> {
    let profile: Profile = serde_json::from_slice(
        &std::fs::read(&args.profile_json)
            .map_err(|e| anyhow!("cannot read {}: {e}", args.profile_json.display()))?,
    )
    .map_err(|e| anyhow!("{}: {e}", args.profile_json.display()))?;
    let plan: WorkerPlan = serde_json::from_slice(
        &std::fs::read(&args.plan_json)
            .map_err(|e| anyhow!("cannot read {}: {e}", args.plan_json.display()))?,
    )
    .map_err(|e| anyhow!("{}: {e}", args.plan_json.display()))?;
    if args.worker >= profile.generator.workers {
        bail!(
            "worker {} of a profile with {} workers",
            args.worker,
            profile.generator.workers
        );
    }
    let mut target = bourse_loadgen::gateway::GatewayTarget::connect(&plan)
        .map_err(|e| anyhow!("worker {}: {e}", args.worker))?;
    let worker = bourse_loadgen::generator::Worker {
        index: args.worker,
        workers: profile.generator.workers,
        flows: bourse_loadgen::worker_flows(&profile, args.worker),
        profile: std::sync::Arc::new(profile),
        live: std::sync::Arc::new(bourse_loadgen::generator::Live::default()),
    };
    let start = bourse_loadgen::instant_of_unix_ns(args.start_unix_ns);
    let record = worker
        .run(&mut target, start)
        .map_err(|e| anyhow!("worker {}: {e}", args.worker))?;
    target.close();
    let wire = bourse_loadgen::generator::RecordWire::of(&record);
    std::fs::write(&args.out, serde_json::to_vec(&wire)?)
        .map_err(|e| anyhow!("cannot write {}: {e}", args.out.display()))?;
    Ok(())
}
