//! An operator acts through the demo's admin API while the participants trade: the cores
//! apply the operator's deposits beside the gateways' commands, and the demo's report counts
//! them as the admin's, apart from what the gateways forwarded, so its cross-checks still hold
//! and it exits 0. An account the operator adds to firm 1 during the run trades at once
//! through the demo's `DEMO` session, which is entitled by firm; another firm's account is
//! refused by the core (`AccountNotOfFirm`).
//!
//! The demo runs until it is interrupted, and is interrupted only once every deposit has
//! been answered: the counts asserted do not depend on how fast anything ran.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");
/// The demo's markets: one deposit goes to each, so every core applies an admin command.
const MARKETS: [&str; 3] = ["equities", "fx", "futures"];

/// The checks whose core-side counts include what sessions other than the generator's did
/// (the demo marks them n/a once someone traded beside the participants, as DEMO does here).
const COUNTING_OTHERS: [&str; 3] = [
    "trades in the report",
    "orders acknowledged",
    "every acknowledged order accounted for",
];

/// Kills the child if the test fails before it ends.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(lines: &Arc<Mutex<Vec<String>>>, needle: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(l) = lines.lock().unwrap().iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no line with {needle:?} within {timeout:?}: {:?}",
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value after `name=` in the line the demo prints for the operator's shell.
fn exported(line: &str, name: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        .to_string()
}

/// Sends the order of the demo's hint (`bourse order --fix ADDR --sender DEMO send ...`) for
/// `account` with client id `id`, and returns what `bourse order` printed.
fn demo_order(hint: &str, store: &std::path::Path, account: &str, id: &str) -> String {
    let words: Vec<&str> = hint.split_whitespace().collect();
    let from = words
        .iter()
        .position(|w| *w == "--fix")
        .expect("the hint names --fix");
    let mut args: Vec<String> = words[from..].iter().map(|w| w.to_string()).collect();
    let at = args
        .iter()
        .position(|w| w == "--account")
        .expect("the hint names an account");
    args[at + 1] = account.to_string();
    let o = Command::new(BOURSE)
        .arg("order")
        .arg("--store")
        .arg(store)
        .args(&args[..])
        .args(["--cl-ord-id", id])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "bourse order failed: {printed}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    printed
}

/// A source's count on one core of the demo's results.
fn source(core: &Value, name: &str) -> u64 {
    core["applied_by_source"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} count in {core}"))
}

#[test]
fn an_operator_s_deposits_during_the_demo_are_counted_as_the_admin_s_and_the_checks_hold() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let mut child = Command::new(BOURSE)
        .args(["demo", "--rate", "200", "--accounts", "50"])
        .args(["--no-dashboard", "--no-delivery", "--admin-port", "0"])
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("bourse demo starts");
    let stdout = child.stdout.take().unwrap();
    let mut proc = Proc(child);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    let export = wait_for(&lines, "export BOURSE_ADMIN_URL=", Duration::from_secs(60));
    let url = exported(&export, "BOURSE_ADMIN_URL");
    let password = exported(&export, "BOURSE_ADMIN_PASSWORD");
    // The participants trade (the ticker's first second) before the operator acts.
    wait_for(&lines, "     1  ", Duration::from_secs(30));

    for market in MARKETS {
        // Account 1 is one of the accounts the demo funds on every market.
        let o = Command::new(BOURSE)
            .args(["admin", "deposit", "--market", market])
            .args(["--account", "1", "--amount", "1000"])
            .env("BOURSE_ADMIN_URL", &url)
            .env("BOURSE_ADMIN_PASSWORD", &password)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "the deposit on {market} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }

    // The session DEMO trades every account of firm 1: one added a moment ago included.
    let o = Command::new(BOURSE)
        .args(["admin", "add-account", "--account", "900002", "--firm", "1"])
        .args(["--cash", "100000000000"])
        .env("BOURSE_ADMIN_URL", &url)
        .env("BOURSE_ADMIN_PASSWORD", &password)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "add-account failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let hint = wait_for(&lines, "--sender DEMO send", Duration::from_secs(1));
    let store = dir.path().join("demo-session");
    let added = demo_order(&hint, &store, "900002", "added1");
    assert!(
        added.contains("exec new       added1"),
        "the added account's order was not accepted: {added}"
    );
    // Account 10 belongs to firm 2 (the demo's accounts are in firms of ten).
    let foreign = demo_order(&hint, &store, "10", "foreign1");
    assert!(
        foreign.contains("exec rejected  foreign1") && foreign.contains("(AccountNotOfFirm)"),
        "another firm's account was not refused by the core: {foreign}"
    );

    // Ctrl-C ends the demo, which then writes its report and checks it.
    let kill = Command::new("kill")
        .args(["-INT", &proc.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = proc.0.wait().unwrap();
    let printed = lines.lock().unwrap().clone();
    assert!(status.success(), "the demo failed: {printed:?}");
    assert!(
        !printed.iter().any(|l| l.contains("FAIL")),
        "a cross-check failed: {printed:?}"
    );
    let by_source = printed
        .iter()
        .position(|l| l.contains("commands the cores applied, by source"))
        .unwrap_or_else(|| panic!("no sources in the summary: {printed:?}"));
    let shown: Vec<&str> = printed[by_source + 1..]
        .iter()
        .take(5)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        shown,
        ["gateways", "admin", "clearing", "setup", "unknown"],
        "{printed:?}"
    );

    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    for c in r["checks"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        if name.starts_with("no other session traded") {
            // The two orders sent as DEMO, and nothing else.
            assert_eq!(c["actual"], 2, "{c}");
        } else if !COUNTING_OTHERS.iter().any(|p| name.starts_with(p)) {
            assert_eq!(c["ok"], Value::Bool(true), "check failed: {c}");
        }
    }
    assert!(
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"].as_str().unwrap().contains("known source")),
        "{}",
        r["checks"]
    );
    let cores = r["cores"].as_array().unwrap();
    assert_eq!(cores.len(), MARKETS.len());
    for core in cores {
        assert!(source(core, "admin") >= 1, "the core's deposit: {core}");
        assert_eq!(source(core, "unknown"), 0, "{core}");
        // What the core applied from the gateways' links is what the gateway forwarded.
        assert_eq!(
            source(core, "gateways"),
            core["commands_forwarded"].as_u64().unwrap() + core["commands_other"].as_u64().unwrap(),
            "{core}"
        );
        assert!(
            source(core, "gateways") > 0,
            "the participants traded: {core}"
        );
    }
    let admin: u64 = cores.iter().map(|c| source(c, "admin")).sum();
    assert!(admin >= MARKETS.len() as u64, "admin {admin}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("Commands applied by source"), "{md}");
}

/// The instant of `hh:mm` Moscow time on the Monday `bourse demo --day` plays (2026-11-23,
/// day 20,780 since 1970-01-01, UTC+3), in nanoseconds since the Unix epoch.
fn demo_day_at(hh: u64, mm: u64) -> u64 {
    (20_780 * 24 * 60 + hh * 60 + mm - 180) * 60_000_000_000
}

/// `bourse demo --day` plays a day an hour a second. The clearing service the demo runs
/// reads the same day on the same clock and starts the intermediate clearing at the 14:00
/// pause and the end of day's at 18:50 by itself; the summary and the report show both with
/// trading's latency around them, and the cross-checks still hold. The demo is interrupted
/// only once the clearing service said the end of day's run is done.
#[test]
fn the_day_s_clearing_pauses_start_the_intermediate_and_the_evening_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let mut child = Command::new(BOURSE)
        .args(["demo", "--rate", "200", "--accounts", "50"])
        .args(["--day", "--day-speed", "3600"])
        .args(["--no-dashboard", "--no-delivery", "--admin-port", "0"])
        .args(["--clearing-port", "0"])
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bourse demo starts");
    let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let mut proc = Proc(child);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (a, b) = (lines.clone(), lines.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            a.lock().unwrap().push(line);
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            b.lock().unwrap().push(line);
        }
    });
    wait_for(&lines, "clearing: http://", Duration::from_secs(60));
    // The service reports each scheduled run as it ends (its log, on stderr).
    wait_for(&lines, "EndOfDay: Done", Duration::from_secs(180));

    let kill = Command::new("kill")
        .args(["-INT", &proc.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = proc.0.wait().unwrap();
    let printed = lines.lock().unwrap().clone();
    assert!(status.success(), "the demo failed: {printed:?}");
    assert!(
        !printed.iter().any(|l| l.contains("FAIL")),
        "a cross-check failed: {printed:?}"
    );
    for (id, kind) in [(1, "intermediate"), (2, "end_of_day")] {
        let said = format!("clearing run {id} ({kind}) at ");
        assert!(
            printed
                .iter()
                .any(|l| l.contains(&said) && l.contains(": done,") && l.contains("during")),
            "no {said:?} in the summary: {printed:?}"
        );
    }

    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let runs = r["clearing_runs"].as_array().expect("clearing runs");
    let kinds: Vec<&str> = runs
        .iter()
        .map(|f| f["run"]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["intermediate", "end_of_day"], "{runs:?}");
    for f in runs {
        assert_eq!(f["run"]["outcome"], "done", "{f}");
        assert_eq!(
            f["run"]["unbalanced_instruments"],
            serde_json::json!([]),
            "{f}"
        );
    }
    assert!(
        runs[1]["run"]["positions"].as_u64().unwrap() > 0,
        "{}",
        runs[1]
    );
    // Each run was made for its slot of the day: the pause's start, the end of day.
    for (id, at) in [(1, demo_day_at(14, 0)), (2, demo_day_at(18, 50))] {
        let plan = out.join("clearing/runs").join(format!("run-{id:06}.json"));
        let plan: Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
        assert_eq!(plan["scheduled_ns"].as_u64(), Some(at), "run {id}: {plan}");
    }
    for core in r["cores"].as_array().unwrap() {
        assert_eq!(source(core, "unknown"), 0, "{core}");
    }
    let clearing: u64 = r["cores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| source(c, "clearing"))
        .sum();
    assert!(clearing > 0, "the runs' movements reached the cores");
}
