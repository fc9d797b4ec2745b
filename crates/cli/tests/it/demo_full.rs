//! `bourse demo` end to end on the whole local deployment: replicated cores per market that
//! publish market data, a gateway, the dashboard, simulated participants; a person trades
//! beside them with `bourse order` on the FIX session the demo prints; at the end the report
//! is written and its figures agree with the cores and the market data feed.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");

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

#[test]
fn the_demo_runs_the_replicated_venue_and_its_report_cross_checks() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let mut child = Command::new(BOURSE)
        .args([
            "demo",
            "--seconds",
            "8",
            "--rate",
            "2000",
            "--accounts",
            "500",
            "--dashboard-port",
            "0",
        ])
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("bourse demo starts");
    let stdout = child.stdout.take().unwrap();
    let proc = Proc(child);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    // The layout: three replicated cores, the gateway, the dashboard, and how to trade.
    let dashboard = wait_for(&lines, "dashboard: http://", Duration::from_secs(60));
    let addr = dashboard
        .split("dashboard: http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_string();
    for market in ["equities", "fx", "futures"] {
        let l = wait_for(&lines, &format!("core {market}"), Duration::from_secs(5));
        assert_eq!(l.matches("127.0.0.1:").count(), 3, "3 nodes: {l}");
        assert!(
            l.contains("market data on udp 127.255.255.255:"),
            "a feed every local reader gets whole: {l}"
        );
    }
    let order_line = wait_for(&lines, "bourse order --fix", Duration::from_secs(5));
    let args: Vec<String> = order_line
        .split_whitespace()
        .skip(2)
        .map(str::to_string)
        .collect();
    wait_for(&lines, "     1  ", Duration::from_secs(20));

    // The dashboard serves metrics while the demo trades.
    let mut s = std::net::TcpStream::connect(&addr).expect("dashboard reachable");
    use std::io::{Read, Write};
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    assert!(
        body.starts_with("HTTP/1.") && body.contains(" 200"),
        "{body}"
    );

    // A person's order through the FIX session the demo printed.
    let store = dir.path().join("order-store");
    let o = Command::new(BOURSE)
        .arg("order")
        .args(&args[..args.iter().position(|a| a == "send").unwrap()])
        .arg("--store")
        .arg(&store)
        .args(&args[args.iter().position(|a| a == "send").unwrap()..])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "bourse order failed: {said}");

    let summary = wait_for(&lines, "summary after", Duration::from_secs(60));
    assert!(summary.contains("summary after"));
    let mut proc = proc;
    let status = proc.0.wait().unwrap();
    let printed = lines.lock().unwrap().clone();
    assert!(status.success(), "the demo failed: {printed:?}");
    // The person's order reached a core beside the participants' commands: the demo says
    // so, and every check that does not compare the participants' own figures holds.
    assert!(
        printed
            .iter()
            .any(|l| l.contains("commands came from other sessions")),
        "{printed:?}"
    );
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert!(out.join("report.html").is_file() && out.join("report.md").is_file());
    let names: Vec<&str> = r["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        names.iter().any(|n| n.contains("market data feed")),
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.contains("replica")), "{names:?}");
    for c in r["checks"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        if name.starts_with("no other session") {
            assert_eq!(c["actual"].as_u64(), Some(1), "the person's one order: {c}");
        } else if name.contains("market data")
            || name.contains("replica")
            || name.contains("forwarded")
            || name.contains("answered")
        {
            assert_eq!(c["ok"], Value::Bool(true), "check failed: {c}");
        }
    }
    assert_eq!(r["cores"].as_array().unwrap().len(), 3);
    assert!(
        r["totals"]["trades"].as_u64().unwrap() > 0,
        "the demo trades"
    );
    // The deployment timed its own path: every command the gateway forwarded to a core went
    // through that core's link, and every entry the core applied was timed on its replicas.
    for core in r["cores"].as_array().unwrap() {
        let figure = |name: &str| {
            core["stage_figures"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["name"] == name)
                .unwrap_or_else(|| panic!("no {name} in {core}"))["latency"]
                .clone()
        };
        let forwarded =
            core["commands_forwarded"].as_u64().unwrap() + core["commands_other"].as_u64().unwrap();
        assert_eq!(
            figure("link_round_trip")["count"].as_u64(),
            Some(forwarded),
            "{core}"
        );
        assert_eq!(
            figure("group_answer")["count"].as_u64(),
            Some(forwarded),
            "{core}"
        );
        for leg in ["journal_fsync", "quorum_append", "replica_apply_spread"] {
            assert!(figure(leg)["count"].as_u64().unwrap() > 0, "{leg}: {core}");
        }
    }
    let stages: Vec<&str> = r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["mean_ns"].is_number())
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        stages
            .iter()
            .any(|s| s.starts_with("sequencing / replication")),
        "{stages:?}"
    );
    assert!(r["replication_lag"]["count"].as_u64().unwrap() > 0);
}

#[test]
fn bench_venue_measures_the_demo_s_venue_per_transaction_by_thread_group() {
    let out = Command::new(BOURSE)
        .args([
            "bench",
            "venue",
            "--rates",
            "300",
            "--seconds",
            "2",
            "--warmup-seconds",
            "1",
            "--json",
        ])
        .output()
        .expect("run bourse bench venue");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench venue failed (its cross-checks included): {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("one JSON line per rate");
    let v: Value = serde_json::from_str(line).expect("JSON");
    assert_eq!(v["bench"], "venue");
    assert_eq!(v["offered_per_s"], 300);
    assert!(v["venue_cpu_us_per_tx"].as_f64().unwrap() > 0.0, "{v}");
    assert!(
        v["transactions_per_log_entry"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(v["latency_ns"]["count"].as_u64().unwrap() > 0, "{v}");
    // Every replica's market data thread and stream archive, grouped by role: 3 cores x 3.
    for group in ["md-node", "stream-archive"] {
        assert_eq!(v["groups"][group]["threads"], 9, "{group}: {v}");
    }
    assert!(
        v["groups"].get("loadgen").is_none(),
        "the generator is not the venue"
    );
}

/// `bench round` runs the openraft group and the loop group at the same rate: each answers
/// every command, and the loop group's three replicas end on the same applied index and
/// state hash (the bench fails otherwise), so the floor it measures is a group that really
/// replicates and applies.
#[test]
fn bench_round_measures_both_groups_and_the_loop_group_s_replicas_agree() {
    let out = Command::new(BOURSE)
        .args([
            "bench",
            "round",
            "--rates",
            "300",
            "--seconds",
            "1",
            "--json",
        ])
        .output()
        .expect("run bourse bench round");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench round failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(rows.len(), 2, "one row per group: {stdout}");
    for (row, group) in rows.iter().zip(["openraft", "loop"]) {
        assert_eq!(row["group"], group);
        assert_eq!(row["acked"], row["sent"], "{row}");
        assert!(row["acked"].as_u64().unwrap() > 0, "{row}");
        assert!(row["group_cpu_ns_per_entry"].as_u64().unwrap() > 0, "{row}");
    }
}
