//! `bourse soak --processes`: the soak with the venue as an operator deploys it, one process
//! per role, so each role's memory is its own process's RSS.
//!
//! Per market, three `bourse node` processes (each with `[marketdata]`, so the leader
//! publishes); one `bourse gateway` with a `[[cores]]` entry per market; one
//! `bourse loadgen-worker` that trades the demo's flow through the gateway. The configs are
//! the in-process venue's (`bourse_venue::core_cluster_config`, the gateway's limits as
//! `LocalDeployment` sets them) written as TOML into a state directory, and the instruments,
//! accounts and cash go in through the cluster client as `LocalDeployment::start` applies
//! them (`bourse_venue::apply_setup`). Every `--sample-s` seconds one row: the seconds since
//! the load started, the load average, the commands the cores applied (the most any replica
//! of each core applied, summed), and every process's `RssAnon` and `VmRSS`, one column each,
//! named by role (`node-c0-n1`, `gateway`, `loadgen`). At the end, per role, the least-squares
//! slope of `RssAnon` over the second half of the samples, per second and per command, and
//! whether it is within `--bound-bytes-per-command`.
//!
//! The children are killed when this process stops, by error or Ctrl-C ([`Children`]'s
//! drop), and the run is bounded: the load's phases, its drain, and a margin.

use anyhow::{anyhow, bail, Context, Result};
use bourse_cluster::tokio;
use bourse_loadgen::gateway::{SessionPlan, SessionProtocol, WorkerPlan};
use bourse_loadgen::Profile;
use bourse_venue::{DeploymentSpec, MemoryBounds};
use serde_json::{json, Value};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a core's nodes may take to elect a leader once started.
const LEADER_WAIT_MS_MAX: u64 = 30_000;
/// How long the gateway may take to listen once started (it connects to every core first).
const GATEWAY_WAIT_MS_MAX: u64 = 30_000;
/// The load starts this long after the worker is started, so its sessions are established.
const WORKER_START_DELAY_MS: u64 = 3_000;
/// Beyond the phases and the drain, the worker has this long to connect, finish and write.
const WORKER_MARGIN_S: f64 = 120.0;
/// How long one status query of a node may take.
const STATUS_TIMEOUT_MS: u64 = 1_000;

/// What `bourse soak --processes` is asked for (the flags of `bourse soak`).
pub struct ProcessesRun<'a> {
    pub profile: &'a Profile,
    pub sample_s: u64,
    pub small_bounds: bool,
    pub out: &'a Path,
    /// The configs, journals, stores and logs go here (created; removed at the end unless
    /// `keep_state`).
    pub state_dir: PathBuf,
    pub keep_state: bool,
    pub bound_bytes_per_command: f64,
    /// Set by Ctrl-C: the load is cut short and the samples so far summed up.
    pub interrupted: Arc<AtomicBool>,
}

/// One child process and the role it plays.
struct Proc {
    role: String,
    child: Child,
    log: PathBuf,
}

/// Every child of the run, killed (and reaped) when dropped: on success, on error and on
/// panic alike, so that no `bourse node` outlives the soak.
struct Children(Vec<Proc>);

impl Drop for Children {
    fn drop(&mut self) {
        for p in &mut self.0 {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Children {
    /// Starts `bourse ARGS` as `role`, its output into `dir/<role>.log`.
    fn spawn(&mut self, role: String, args: &[&std::ffi::OsStr], dir: &Path) -> Result<()> {
        let exe = std::env::current_exe().context("finding this program")?;
        let log = dir.join(format!("{role}.log"));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {role}"))?;
        self.0.push(Proc { role, child, log });
        Ok(())
    }

    /// An error naming the first child that has exited, with the end of its log.
    fn check_alive(&mut self, except: Option<&str>) -> Result<()> {
        for p in &mut self.0 {
            if except == Some(p.role.as_str()) {
                continue;
            }
            if let Some(status) = p.child.try_wait()? {
                bail!(
                    "{} (pid {}) exited ({status}) during the run; the end of {}:\n{}",
                    p.role,
                    p.child.id(),
                    p.log.display(),
                    log_tail(&p.log)
                );
            }
        }
        Ok(())
    }
}

/// The last lines of a child's log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// `RssAnon` and `VmRSS` of a process in KiB, from `/proc/PID/status`; `None` once it is gone.
fn rss_kib(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some((
        crate::soak_cmd::status_kib(&status, "RssAnon"),
        crate::soak_cmd::status_kib(&status, "VmRSS"),
    ))
}

/// A JSON value with its nulls left out (TOML has no null: an absent key is `None`).
fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_nulls).collect()),
        other => other,
    }
}

/// The gateway's TOML: a binary listener on `listen`, the limits `LocalDeployment` gives its
/// gateways, a replicated core per market at `core_nodes`, every instrument, and the worker's
/// sessions (`W0S<n>`, firm 1, their accounts).
fn gateway_toml(
    spec: &DeploymentSpec,
    listen: SocketAddr,
    store_dir: &Path,
    core_nodes: &[Vec<SocketAddr>],
) -> Result<String> {
    let sessions = &spec.worker_sessions[0];
    let bounds = spec.bounds;
    let mut limits = json!({
        "binary_listen": listen.to_string(),
        "store_dir": store_dir,
        "throttle_msgs_per_s": 1_000_000,
        "connections_max": (sessions.len() + 16).min(10_000),
        "core_queue_depth": 65_536,
    });
    if let Some(b) = bounds {
        limits["stored_messages_max"] = json!(b.gateway_stored_messages_max);
        limits["finished_orders_kept"] = json!(b.gateway_finished_orders_kept);
    }
    if let Some(n) = spec.core_in_flight_max {
        limits["core_in_flight_max"] = json!(n);
    }
    let cores: Vec<Value> = spec
        .markets
        .iter()
        .zip(core_nodes)
        .map(|(m, nodes)| {
            json!({
                "name": m.name,
                "instruments": m.instruments.iter().map(|i| i.instrument).collect::<Vec<_>>(),
                "nodes": nodes.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
                // One gateway: the client id `LocalDeployment` gives its first.
                "client_id": 1,
                "bootstrap": false,
            })
        })
        .collect();
    let instruments: Vec<_> = spec
        .markets
        .iter()
        .flat_map(|m| m.instruments.iter())
        .collect();
    let binary_sessions: Vec<Value> = sessions
        .iter()
        .enumerate()
        .map(|(s, accounts)| {
            json!({
                "credentials": format!("W0S{s}"),
                "firm": 1,
                "accounts": accounts,
            })
        })
        .collect();
    let config = json!({
        "gateway": limits,
        "cores": cores,
        "instruments": instruments,
        "binary_sessions": binary_sessions,
    });
    let text = toml::to_string(&without_nulls(config)).context("the gateway's TOML")?;
    // Refuse here, with the file's own checks, what the gateway would refuse at start.
    bourse_gateway::GatewayConfig::from_toml(&text)
        .map_err(|e| anyhow!("the generated gateway config: {e}"))?;
    Ok(text)
}

/// One row of samples.
struct Row {
    t_s: f64,
    load_1m: f64,
    commands: u64,
    /// Per process, in the order of `Children`: (RssAnon, VmRSS) in KiB, `None` once it exited.
    rss: Vec<Option<(u64, u64)>>,
    /// Per process: CPU time and context switches summed over its threads.
    cpu: Vec<Option<crate::bench::common::ThreadCpu>>,
    /// Taken while the load generator still ran (the last row is taken after it exited).
    loading: bool,
}

impl Row {
    fn line(&self) -> String {
        let mut s = format!("{:.0}\t{:.2}\t{}", self.t_s, self.load_1m, self.commands);
        for r in &self.rss {
            match r {
                Some((anon, rss)) => s.push_str(&format!(
                    "\t{:.1}\t{:.1}",
                    *anon as f64 / 1024.0,
                    *rss as f64 / 1024.0
                )),
                None => s.push_str("\t-\t-"),
            }
        }
        s
    }
}

/// The commands the cores applied: per core the most any of its replicas applied (a brief
/// status, which does not hash the state), summed over the cores.
async fn commands_applied(cores: &[Vec<SocketAddr>]) -> u64 {
    let mut total = 0;
    for nodes in cores {
        let mut most = 0;
        for addr in nodes {
            if let Ok(s) = bourse_cluster::client::node_status_brief(
                *addr,
                Duration::from_millis(STATUS_TIMEOUT_MS),
            )
            .await
            {
                most = most.max(s.commands_applied);
            }
        }
        total += most;
    }
    total
}

/// The least-squares slope of `y` over `x` (`None` with fewer than two distinct `x`).
pub(crate) fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// Starts the venue as processes, drives the load, samples, and sums up per role.
pub fn run(run: ProcessesRun) -> Result<()> {
    let profile = run.profile;
    if profile.generator.workers != 1 {
        bail!("--processes runs one generator worker");
    }
    let state = &run.state_dir;
    let _ = std::fs::remove_dir_all(state);
    std::fs::create_dir_all(state).with_context(|| format!("cannot create {}", state.display()))?;
    let mut spec = crate::loadtest_cmd::deployment_spec(profile, state.join("data"), false);
    // Every core publishes its market data, as the in-process soak's cores do.
    spec.market_data = true;
    if run.small_bounds {
        spec.bounds = Some(MemoryBounds::SMALL);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let mut children = Children(Vec::new());
    let mut core_nodes: Vec<Vec<SocketAddr>> = Vec::new();
    for (index, m) in spec.markets.iter().enumerate() {
        let base = bourse_testkit::try_free_port_block(3)?;
        let md_base = bourse_testkit::try_free_port_block(40)?;
        let config = bourse_venue::core_cluster_config(
            &spec,
            index,
            m,
            [base, base + 1, base + 2],
            Some(md_base),
        );
        let path = state.join(format!("core-{index}.toml"));
        std::fs::write(
            &path,
            toml::to_string(&config).context("the cluster's TOML")?,
        )
        .with_context(|| format!("cannot write {}", path.display()))?;
        for n in &config.nodes {
            let id = n.id.to_string();
            children.spawn(
                format!("node-c{index}-n{}", n.id),
                &[
                    "node".as_ref(),
                    "--config".as_ref(),
                    path.as_os_str(),
                    "--id".as_ref(),
                    id.as_ref(),
                ],
                state,
            )?;
        }
        let addrs: Vec<(u64, SocketAddr)> = config
            .nodes
            .iter()
            .map(|n| Ok((n.id, config.addr_of(n.id).context("a node's address")?)))
            .collect::<Result<_>>()?;
        core_nodes.push(addrs.iter().map(|(_, a)| *a).collect());
        // A leader first, so the setup does not spend its deadline on the election.
        let deadline = Instant::now() + Duration::from_millis(LEADER_WAIT_MS_MAX);
        loop {
            children.check_alive(None)?;
            let led = rt.block_on(async {
                for (_, a) in &addrs {
                    if let Ok(s) = bourse_cluster::client::node_status_brief(
                        *a,
                        Duration::from_millis(STATUS_TIMEOUT_MS),
                    )
                    .await
                    {
                        if s.leader.is_some() {
                            return true;
                        }
                    }
                }
                false
            });
            if led {
                break;
            }
            if Instant::now() >= deadline {
                bail!("core {}: no leader within {LEADER_WAIT_MS_MAX} ms", m.name);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let (commands, rejected) =
            rt.block_on(bourse_venue::apply_setup(&addrs, &m.setup, index))?;
        if rejected > 0 {
            bail!(
                "core {}: {rejected} of {commands} setup commands were rejected",
                m.name
            );
        }
        println!(
            "core {index} ({}): 3 node processes on {}..={}, market data from UDP port {md_base}, {commands} setup commands applied",
            m.name,
            base,
            base + 2
        );
    }
    let gateway_port = bourse_testkit::try_free_port_block(1)?;
    let listen = SocketAddr::from(([127, 0, 0, 1], gateway_port));
    let gateway_path = state.join("gateway.toml");
    std::fs::write(
        &gateway_path,
        gateway_toml(&spec, listen, &state.join("gateway-store"), &core_nodes)?,
    )
    .with_context(|| format!("cannot write {}", gateway_path.display()))?;
    children.spawn(
        "gateway".into(),
        &[
            "gateway".as_ref(),
            "--config".as_ref(),
            gateway_path.as_os_str(),
        ],
        state,
    )?;
    let deadline = Instant::now() + Duration::from_millis(GATEWAY_WAIT_MS_MAX);
    while TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_err() {
        children.check_alive(None)?;
        if Instant::now() >= deadline {
            bail!("the gateway did not listen on {listen} within {GATEWAY_WAIT_MS_MAX} ms");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("gateway process: binary order entry on {listen}");
    // The worker's plan and profile, as `bourse loadtest --workers` hands them over.
    let plan = WorkerPlan {
        sessions: spec.worker_sessions[0]
            .iter()
            .enumerate()
            .map(|(s, accounts)| SessionPlan {
                addr: listen,
                protocol: SessionProtocol::Binary,
                name: format!("W0S{s}"),
                gateway_comp_id: "BOURSE".into(),
                markets: (0..spec.markets.len()).collect(),
                accounts: accounts.clone(),
            })
            .collect(),
        instruments: spec.markets.iter().map(|m| m.instruments.clone()).collect(),
    };
    let plan_json = state.join("plan.json");
    let profile_json = state.join("profile.json");
    let record_json = state.join("record.json");
    std::fs::write(&plan_json, serde_json::to_vec(&plan)?)?;
    std::fs::write(&profile_json, serde_json::to_vec(profile)?)?;
    let start_unix_ns = bourse_loadgen::unix_ns() + WORKER_START_DELAY_MS * 1_000_000;
    let start_ns = start_unix_ns.to_string();
    children.spawn(
        "loadgen".into(),
        &[
            "loadgen-worker".as_ref(),
            "--profile-json".as_ref(),
            profile_json.as_os_str(),
            "--plan-json".as_ref(),
            plan_json.as_os_str(),
            "--worker".as_ref(),
            "0".as_ref(),
            "--start-unix-ns".as_ref(),
            start_ns.as_ref(),
            "--out".as_ref(),
            record_json.as_os_str(),
        ],
        state,
    )?;
    let limit = Duration::from_secs_f64(
        WORKER_START_DELAY_MS as f64 / 1e3
            + profile.duration_s()
            + profile.generator.drain_timeout_s
            + WORKER_MARGIN_S,
    );
    let mut file = std::fs::File::create(run.out)
        .with_context(|| format!("cannot create {}", run.out.display()))?;
    let mut header = "t_s\tload_1m\tcommands".to_string();
    for p in &children.0 {
        header.push_str(&format!("\t{0}_rss_anon_mib\t{0}_vm_rss_mib", p.role));
    }
    println!(
        "bourse soak --processes: {} processes, a sample every {} s into {} (state in {})",
        children.0.len(),
        run.sample_s,
        run.out.display(),
        state.display()
    );
    println!("{header}");
    writeln!(file, "{header}")?;
    let pids: Vec<u32> = children.0.iter().map(|p| p.child.id()).collect();
    let loadgen = children.0.len() - 1;
    let t0 = bourse_loadgen::instant_of_unix_ns(start_unix_ns);
    let started = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    let sample = |rows: &mut Vec<Row>, file: &mut std::fs::File| -> Result<()> {
        let now = Instant::now();
        let row = Row {
            t_s: if now >= t0 {
                (now - t0).as_secs_f64()
            } else {
                -(t0 - now).as_secs_f64()
            },
            load_1m: crate::soak_cmd::load_1m(),
            commands: rt.block_on(commands_applied(&core_nodes)),
            rss: pids.iter().map(|pid| rss_kib(*pid)).collect(),
            cpu: pids
                .iter()
                .map(|pid| crate::bench::common::process_cpu(*pid))
                .collect(),
            loading: true,
        };
        println!("{}", row.line());
        writeln!(file, "{}", row.line())?;
        rows.push(row);
        Ok(())
    };
    let every = Duration::from_secs(run.sample_s);
    let mut next = t0;
    let status = loop {
        if let Some(status) = children.0[loadgen].child.try_wait()? {
            break status;
        }
        children.check_alive(Some("loadgen"))?;
        if run.interrupted.load(Ordering::SeqCst) {
            bail!(
                "interrupted: the processes are stopped; the samples so far are in {}",
                run.out.display()
            );
        }
        if started.elapsed() > limit {
            bail!("the load did not finish within {limit:?}; every process is stopped");
        }
        if Instant::now() >= next {
            sample(&mut rows, &mut file)?;
            next += every;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The last row, with the servers as the load left them (the worker has exited).
    sample(&mut rows, &mut file)?;
    if let Some(last) = rows.last_mut() {
        last.loading = false;
    }
    children.check_alive(Some("loadgen"))?;
    if !status.success() {
        bail!(
            "the load generator failed ({status}); the end of its log:\n{}",
            log_tail(&children.0[loadgen].log)
        );
    }
    let wire: bourse_loadgen::generator::RecordWire = serde_json::from_slice(
        &std::fs::read(&record_json)
            .with_context(|| format!("cannot read {}", record_json.display()))?,
    )
    .with_context(|| record_json.display().to_string())?;
    let counts = wire.into_record().counts;
    let roles: Vec<String> = children.0.iter().map(|p| p.role.clone()).collect();
    drop(children);
    summarize(&rows, &roles, run.bound_bytes_per_command);
    summarize_cpu(&rows, &roles);
    println!(
        "load: {} commands sent, {} answered, {} unanswered, {} busy rejects, {} trades",
        counts.sent, counts.answered, counts.unanswered, counts.busy_rejects, counts.trades
    );
    if !run.keep_state {
        let _ = std::fs::remove_dir_all(state);
    }
    if counts.sent == 0 || counts.answered != counts.sent || counts.unanswered > 0 {
        bail!(
            "not every command was acknowledged: {} sent, {} answered, {} unanswered",
            counts.sent,
            counts.answered,
            counts.unanswered
        );
    }
    println!(
        "every process ran to the end; every command acknowledged; samples in {}",
        run.out.display()
    );
    Ok(())
}

/// Per role, the least-squares slope of `RssAnon` over the second half of the load's samples
/// (those from the middle of the run on, taken while the load ran), per second and per
/// command, and its verdict against `bound` bytes per command.
fn summarize(rows: &[Row], roles: &[String], bound: f64) {
    let during: Vec<&Row> = rows.iter().filter(|r| r.t_s >= 0.0).collect();
    let half = &during[during.len() / 2..];
    let (Some(first), Some(last)) = (half.first(), half.last()) else {
        println!("\nno samples during the load");
        return;
    };
    println!(
        "\nRssAnon per role over the second half ({:.0} s → {:.0} s, {} samples, {} commands); bound {bound} bytes per command:",
        first.t_s,
        last.t_s,
        half.len(),
        last.commands.saturating_sub(first.commands)
    );
    println!(
        "  {:<12} {:>10} {:>10} {:>12} {:>14}  verdict",
        "role", "first MiB", "last MiB", "bytes/s", "bytes/command"
    );
    for (i, role) in roles.iter().enumerate() {
        let points = |x: &dyn Fn(&Row) -> f64| -> Vec<(f64, f64)> {
            half.iter()
                .filter_map(|r| r.rss[i].map(|(anon, _)| (x(r), anon as f64 * 1024.0)))
                .collect()
        };
        let by_time = points(&|r| r.t_s);
        let by_command = points(&|r| r.commands as f64);
        let mib = |p: Option<&(f64, f64)>| {
            p.map_or("-".to_string(), |p| {
                format!("{:.1}", p.1 / f64::from(1u32 << 20))
            })
        };
        let per_s = slope(&by_time);
        let per_command = slope(&by_command);
        let verdict = match per_command {
            Some(b) if b <= bound => "within",
            Some(_) => "ABOVE",
            None => "-",
        };
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:+.1}"));
        println!(
            "  {role:<12} {:>10} {:>10} {:>12} {:>14}  {verdict}",
            mib(by_time.first()),
            mib(by_time.last()),
            fmt(per_s),
            fmt(per_command)
        );
    }
}

/// Per role, CPU time and context switches per command applied over the second half of the
/// samples taken while the load ran, and the venue's (every role but the generator's).
fn summarize_cpu(rows: &[Row], roles: &[String]) {
    let during: Vec<&Row> = rows.iter().filter(|r| r.t_s >= 0.0 && r.loading).collect();
    let half = &during[during.len() / 2..];
    let (Some(first), Some(last)) = (half.first(), half.last()) else {
        return;
    };
    let commands = last.commands.saturating_sub(first.commands).max(1) as f64;
    let seconds = (last.t_s - first.t_s).max(1e-3);
    println!(
        "\nCPU per command applied over the same half ({:.0} s → {:.0} s, {} commands, {:.0}/s):",
        first.t_s,
        last.t_s,
        commands,
        commands / seconds
    );
    println!(
        "  {:<12} {:>10} {:>10} {:>8}",
        "role", "CPU us/cmd", "switch/cmd", "cores"
    );
    let mut venue = crate::bench::common::ThreadCpu::default();
    let row = |role: &str, t: &crate::bench::common::ThreadCpu| {
        println!(
            "  {role:<12} {:>10.1} {:>10.2} {:>8.2}",
            t.cpu_ns as f64 / 1e3 / commands,
            (t.switches + t.preempted) as f64 / commands,
            t.cpu_ns as f64 / 1e9 / seconds
        )
    };
    for (i, role) in roles.iter().enumerate() {
        let (Some(a), Some(b)) = (first.cpu[i], last.cpu[i]) else {
            continue;
        };
        let d = b.since(&a);
        if role != "loadgen" {
            venue.add(&d);
        }
        row(role, &d);
    }
    row("venue", &venue);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_of_a_line_is_its_gradient_and_a_single_point_has_none() {
        let line: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 3.0 * x as f64 + 7.0)).collect();
        assert!((slope(&line).unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(slope(&[(1.0, 2.0)]), None);
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 5.0)]), None);
    }

    #[test]
    fn nulls_are_left_out_of_the_generated_toml() {
        let v = without_nulls(json!({"a": null, "b": [{"c": null, "d": 1}]}));
        assert_eq!(v, json!({"b": [{"d": 1}]}));
    }
}
