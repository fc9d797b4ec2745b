//! Monitoring against real peers: the Prometheus server scrapes a running `bourse demo` and
//! gives back what the node reported; headless Chromium opens the dashboard under load, sees
//! live figures that move, and saves a screenshot. Both tools come from Debian packages
//! installed by scripts/install-test-tools.sh; a missing tool fails the test with that advice.
//! Everything listens on 127.0.0.1 only.

use crate::monitor_support as support;

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;

fn prometheus_query(prom: SocketAddr, query: &str) -> Option<Value> {
    let q: String = query
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, body) = http(prom, "GET", &format!("/api/v1/query?query={q}"), None);
    if status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&body).ok()?;
    (v["status"] == "success").then(|| v["data"]["result"].clone())
}

/// The single value of an instant query, if the result has exactly one series.
fn prometheus_scalar(prom: SocketAddr, query: &str) -> Option<f64> {
    let r = prometheus_query(prom, query)?;
    let a = r.as_array()?;
    if a.len() != 1 {
        return None;
    }
    a[0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_the_demo_and_reads_back_what_it_reported() {
    let prometheus = require("prometheus");
    let demo = Demo::start(&["--seconds", "8", "--rate", "3000", "--linger-seconds", "60"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: bourse\n    static_configs:\n      - targets: ['{}']\n",
            demo.addr
        ),
    )
    .unwrap();
    let prom_port = free_port();
    let prom_addr: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let _prom = Proc(
        std::process::Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .arg("--log.level=warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );

    // Under load: Prometheus sees the target up and a counter that grows. The demo's
    // dashboard counts what each market's replicated core committed (label `core`).
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if prometheus_scalar(prom_addr, "up{job=\"bourse\"}") == Some(1.0) {
            if let Some(v) = prometheus_scalar(prom_addr, "sum(bourse_orders_total)") {
                if v > 0.0 {
                    break v;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not scrape the demo within 60 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    };

    // After the run the counters are frozen: Prometheus must hold exactly what the dashboard
    // says, and the cores' orders must be the orders the demo's own summary printed as
    // registered (the generator's count and the cores' count of accepted orders).
    let summary = demo.wait_for_line("orders registered:", Duration::from_secs(60));
    demo.wait_for_line("dashboard stays at", Duration::from_secs(30));
    let printed = summary
        .split_whitespace()
        .nth(2)
        .and_then(parse_count)
        .expect("summary count");
    // The last committed entries reach the dashboard within a publication period.
    std::thread::sleep(Duration::from_secs(1));
    let (status, exposition) = http(demo.addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let sum_of = |name: &str| -> f64 {
        exposition
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let node_orders = sum_of("bourse_orders_total");
    assert_eq!(
        node_orders as u64, printed,
        "the cores' orders vs the demo's summary"
    );
    assert!(
        node_orders >= first,
        "Prometheus saw more than the dashboard reported"
    );
    let node = sum_of("bourse_transactions_total");
    assert!(
        node >= node_orders,
        "transactions include every registered order"
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tx = prometheus_scalar(prom_addr, "sum(bourse_transactions_total)");
        let orders = prometheus_scalar(prom_addr, "sum(bourse_orders_total)");
        if tx == Some(node) && orders == Some(node_orders) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus holds {tx:?} / {orders:?}, the dashboard reported {node} / {node_orders}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Prometheus saw the counter grow while the demo traded.
    let growth = prometheus_scalar(
        prom_addr,
        "sum(max_over_time(bourse_transactions_total[5m]) - min_over_time(bourse_transactions_total[5m]))",
    )
    .expect("growth of the counter");
    assert!(growth > 0.0, "Prometheus never saw the counter move");
    // The histograms are well-formed enough for PromQL's quantile over buckets.
    let p99 = prometheus_scalar(
        prom_addr,
        "histogram_quantile(0.99, sum by (le) (bourse_order_latency_seconds_bucket))",
    )
    .expect("p99 from the order latency histogram");
    assert!(p99 > 0.0 && p99 < 10.0, "p99 {p99} s");
    let count = prometheus_scalar(
        prom_addr,
        "sum(bourse_stage_latency_seconds_count{stage=\"processed\"})",
    )
    .expect("stage histogram count");
    let node_count: f64 = exposition
        .lines()
        .filter(|l| {
            l.starts_with("bourse_stage_latency_seconds_count{")
                && l.contains("stage=\"processed\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(count, node_count, "sampled stage count: Prometheus vs node");
}

struct WebDriver {
    addr: SocketAddr,
    session: String,
    _driver: Proc,
}

impl WebDriver {
    fn start(user_data_dir: &std::path::Path) -> WebDriver {
        let chromedriver = require("chromedriver");
        let chromium = require("chromium");
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let driver = Proc(
            std::process::Command::new(chromedriver)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("chromedriver starts"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while http(addr, "GET", "/status", None).0 != 200 {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                    "--window-size=1440,900",
                    format!("--user-data-dir={}", user_data_dir.display()),
                ]
            }
        }}});
        let (status, body) = http(addr, "POST", "/session", Some(&caps.to_string()));
        assert_eq!(status, 200, "new session: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let session = v["value"]["sessionId"]
            .as_str()
            .expect("session id")
            .to_string();
        WebDriver {
            addr,
            session,
            _driver: driver,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let (status, text) = http(
            self.addr,
            method,
            &format!("/session/{}{path}", self.session),
            body.as_deref(),
        );
        assert_eq!(status, 200, "{method} {path}: {text}");
        serde_json::from_str::<Value>(&text).unwrap()["value"].take()
    }

    fn script(&self, js: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": js, "args": []})),
        )
    }
}

impl Drop for WebDriver {
    fn drop(&mut self) {
        let _ = http(
            self.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
    }
}

const READ_PAGE: &str = r##"
const t = (id) => document.getElementById(id).textContent;
const b = window.bourse || {};
return {
  frames: b.frames || 0,
  tx_total: b.last ? b.last.totals.tx : 0,
  tx_rate: b.last ? b.last.rates.tx : 0,
  kpi_tx: t("kpi-tx"), kpi_orders: t("kpi-orders"), kpi_trades: t("kpi-trades"),
  kpi_p99: t("kpi-p99"), tot_tx: t("tot-tx"), conn: t("conn"),
  rates_points: Number(document.getElementById("chart-rates").dataset.points || 0),
  latency_points: Number(document.getElementById("chart-latency").dataset.points || 0),
  stage_rows: document.querySelectorAll("#stages tbody tr:not(.na)").length,
  cluster_rows: document.querySelectorAll("#cluster tbody tr").length,
};
"##;

#[test]
fn chromium_shows_live_figures_that_move_and_saves_a_screenshot() {
    let demo = Demo::start(&["--seconds", "40", "--rate", "3000"]);
    let profile = tempfile::tempdir().unwrap();
    let wd = WebDriver::start(profile.path());
    wd.call(
        "POST",
        "/url",
        Some(json!({"url": format!("http://{}/", demo.addr)})),
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let first = loop {
        let v = wd.script(READ_PAGE);
        if v["frames"].as_u64().unwrap_or(0) >= 3
            && v["tx_rate"].as_f64().unwrap_or(0.0) > 0.0
            && v["latency_points"].as_u64().unwrap_or(0) > 0
        {
            break v;
        }
        assert!(Instant::now() < deadline, "no live data on the page: {v}");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(first["conn"], "live", "{first}");
    for id in ["kpi_tx", "kpi_orders", "kpi_trades", "kpi_p99", "tot_tx"] {
        let text = first[id].as_str().unwrap_or("");
        assert!(
            !text.is_empty() && text != "–" && text != "n/a" && text != "0",
            "{id} shows {text:?}: {first}"
        );
    }
    assert!(first["stage_rows"].as_u64().unwrap() >= 2, "{first}");
    // The view shows one replica group (the first market's): three nodes.
    assert_eq!(first["cluster_rows"], 3, "{first}");

    std::thread::sleep(Duration::from_millis(2_500));
    let later = wd.script(READ_PAGE);
    assert!(
        later["frames"].as_u64() > first["frames"].as_u64(),
        "no new frames: {first} -> {later}"
    );
    assert!(
        later["tx_total"].as_f64() > first["tx_total"].as_f64(),
        "totals do not move: {first} -> {later}"
    );
    assert_ne!(
        later["tot_tx"], first["tot_tx"],
        "the counter on the page does not move"
    );
    assert!(
        later["rates_points"].as_u64() > first["rates_points"].as_u64(),
        "the throughput chart does not grow: {first} -> {later}"
    );

    // A few more seconds of history make the screenshot worth reading.
    std::thread::sleep(Duration::from_secs(6));
    let png = base64_decode(wd.call("GET", "/screenshot", None).as_str().unwrap_or(""));
    assert!(png.starts_with(b"\x89PNG"), "screenshot is a PNG");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("monitor-dashboard.png");
    std::fs::write(&path, &png).unwrap();
    eprintln!("dashboard screenshot: {}", path.display());
}

/// A Prometheus server scraping `targets` every second; killed when dropped.
struct Prometheus {
    addr: SocketAddr,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[SocketAddr]) -> Prometheus {
        let prometheus = require("prometheus");
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: bourse\n    static_configs:\n      - targets: [{}]\n",
                list.join(", ")
            ),
        )
        .unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let proc = Proc(
            std::process::Command::new(prometheus)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("prometheus starts"),
        );
        Prometheus {
            addr,
            _proc: proc,
            _dir: dir,
        }
    }
}

/// Waits (bounded) until Prometheus returns exactly `want` for `query`.
fn await_prometheus(prom: SocketAddr, query: &str, want: f64, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let got = prometheus_scalar(prom, query);
        if got == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus answers {got:?} to {query}, the node reported {want}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn prometheus_scrapes_three_nodes_and_reads_back_what_they_reported() {
    let cluster = NodeCluster::start();
    let targets: Vec<SocketAddr> = cluster.dashboards.iter().map(|d| d.1).collect();
    let prom = Prometheus::start(&targets);
    let mut load = Load::start(cluster.nodes.clone(), 8);
    let leader = cluster.leader(Duration::from_secs(30));

    // Under load: every node is up for Prometheus and its applied-commands counter grows.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = prometheus_query(prom.addr, "sum(up{job=\"bourse\"})")
            .and_then(|r| r[0]["value"][1].as_str().map(str::to_string));
        let moving = prometheus_scalar(prom.addr, "count(bourse_node_commands_applied_total > 0)");
        if up.as_deref() == Some("3") && moving == Some(3.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not see three nodes applying commands: up {up:?}, moving {moving:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(2));
    load.stop();
    let acked = load.acked.load(std::sync::atomic::Ordering::Relaxed);
    let tally = *load.tally.lock().unwrap();
    assert!(
        acked > 0 && tally.transactions > 0,
        "the load ran: {acked} acks"
    );
    eprintln!(
        "load: {acked} acknowledged, {} transactions, {} errors",
        tally.transactions,
        load.errors.load(std::sync::atomic::Ordering::Relaxed)
    );

    // Once the load stopped the figures freeze. Each node must report what the clients were
    // acknowledged (the events of every applied request, counted from its committed stream),
    // and Prometheus must hold exactly what each node reports.
    std::thread::sleep(Duration::from_secs(2));
    for (id, addr) in &cluster.dashboards {
        let deadline = Instant::now() + Duration::from_secs(20);
        let exposition = loop {
            let (status, text) = http(*addr, "GET", "/metrics", None);
            assert_eq!(status, 200);
            let tx = metric_value(&text, "bourse_transactions_total{core=\"cluster-61\"}");
            if tx == Some(tally.transactions as f64) {
                break text;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} reports {tx:?} transactions, the clients saw {}",
                tally.transactions
            );
            std::thread::sleep(Duration::from_millis(250));
        };
        let v = |series: &str| {
            metric_value(&exposition, series)
                .unwrap_or_else(|| panic!("node {id} exports {series}"))
        };
        let trades = v("bourse_trades_total{core=\"cluster-61\"}");
        assert_eq!(trades as u64, tally.trades, "node {id}: trades");
        let node_label = format!("{{node=\"{id}\"}}");
        let commands = v(&format!("bourse_node_commands_applied_total{node_label}"));
        let applied = v(&format!("bourse_raft_last_applied_index{node_label}"));
        let fsyncs = v(&format!("bourse_journal_fsync_seconds_count{node_label}"));
        let records = v(&format!("bourse_journal_records_total{node_label}"));
        assert!(
            commands >= acked as f64 * 0.9,
            "node {id}: {commands} commands for {acked} acks"
        );
        assert!(fsyncs > 0.0 && records > 0.0, "node {id}: journal figures");
        let instance = format!("instance=\"{addr}\"");
        await_prometheus(
            prom.addr,
            &format!("bourse_transactions_total{{{instance}}}"),
            tally.transactions as f64,
            Duration::from_secs(20),
        );
        await_prometheus(
            prom.addr,
            &format!("bourse_node_commands_applied_total{{{instance}}}"),
            commands,
            Duration::from_secs(20),
        );
        await_prometheus(
            prom.addr,
            &format!("bourse_raft_last_applied_index{{{instance}}}"),
            applied,
            Duration::from_secs(20),
        );
        await_prometheus(
            prom.addr,
            &format!("bourse_journal_fsync_seconds_count{{{instance}}}"),
            fsyncs,
            Duration::from_secs(20),
        );
        let p99 = prometheus_scalar(
            prom.addr,
            &format!("histogram_quantile(0.99, sum by (le) (bourse_journal_fsync_seconds_bucket{{{instance}}}))"),
        )
        .expect("fsync p99 from the node's histogram");
        assert!(p99 > 0.0 && p99 < 10.0, "node {id}: fsync p99 {p99} s");
    }
    // The leader: one commit index for the group, the same in every node's cluster view.
    let leader_addr = cluster.dashboard(leader);
    let (_, text) = http(leader_addr, "GET", "/metrics", None);
    let commit = metric_value(
        &text,
        &format!("bourse_raft_commit_index{{node=\"{leader}\"}}"),
    )
    .expect("the leader's commit index");
    assert!(commit > 0.0);
    await_prometheus(
        prom.addr,
        &format!("bourse_raft_commit_index{{instance=\"{leader_addr}\",node=\"{leader}\"}}"),
        commit,
        Duration::from_secs(20),
    );
    // Entry stage legs were sampled on the leader (kind "entry").
    let entry_commits = prometheus_scalar(
        prom.addr,
        &format!(
            "sum(bourse_stage_latency_seconds_count{{{},kind=\"entry\",stage=\"committed\"}})",
            format_args!("instance=\"{leader_addr}\"")
        ),
    );
    assert!(
        entry_commits.is_some_and(|n| n > 0.0),
        "entry commit legs on the leader: {entry_commits:?}"
    );
    // And the t2->t3 leg: sampled requests handed to the batcher, to their batch's append.
    let handoffs = prometheus_scalar(
        prom.addr,
        &format!(
            "sum(bourse_stage_latency_seconds_count{{{},kind=\"entry\",stage=\"appended\"}})",
            format_args!("instance=\"{leader_addr}\"")
        ),
    );
    assert!(
        handoffs.is_some_and(|n| n > 0.0),
        "t2->t3 legs on the leader: {handoffs:?}"
    );
    // The node's own path (bourse_cluster::stages): on the leader every batch stage, the
    // AppendEntries round trip and the market data publication delay; on each follower its
    // appends. The load has stopped, so the counts are final once a poll took them; then
    // Prometheus must hold the same count.
    let stage_count = |addr: SocketAddr, id: u64, stage: &str| {
        let (_, text) = http(addr, "GET", "/metrics", None);
        metric_value(
            &text,
            &format!("bourse_node_stage_seconds_count{{node=\"{id}\",stage=\"{stage}\"}}"),
        )
    };
    for stage in [
        "queue",
        "propose",
        "replicate",
        "commit_apply",
        "reply",
        "md_published",
        "ae_round_trip",
    ] {
        let n = stage_count(leader_addr, leader, stage);
        assert!(
            n.is_some_and(|n| n > 0.0),
            "leader {leader}: stage {stage} count {n:?}"
        );
    }
    for (id, addr) in &cluster.dashboards {
        if *id != leader {
            let n = stage_count(*addr, *id, "follower_append");
            assert!(
                n.is_some_and(|n| n > 0.0),
                "follower {id}: follower_append count {n:?}"
            );
        }
    }
    let replicated = stage_count(leader_addr, leader, "replicate").unwrap();
    await_prometheus(
        prom.addr,
        &format!(
            "bourse_node_stage_seconds_count{{instance=\"{leader_addr}\",stage=\"replicate\"}}"
        ),
        replicated,
        Duration::from_secs(20),
    );
    let md_p99 = prometheus_scalar(
        prom.addr,
        &format!(
            "histogram_quantile(0.99, sum by (le) (bourse_node_stage_seconds_bucket{{instance=\"{leader_addr}\",stage=\"md_published\"}}))"
        ),
    )
    .expect("publication delay p99 from the leader's histogram");
    assert!(
        md_p99 > 0.0 && md_p99 < 10.0,
        "publication delay p99 {md_p99} s"
    );
    // Every follower reports its own commit index (from the leader's AppendEntries): once
    // the load stopped, the leader's.
    for (id, addr) in &cluster.dashboards {
        if *id == leader {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (_, text) = http(*addr, "GET", "/metrics", None);
            let own = metric_value(&text, &format!("bourse_raft_commit_index{{node=\"{id}\"}}"));
            let (_, text) = http(leader_addr, "GET", "/metrics", None);
            let leaders = metric_value(
                &text,
                &format!("bourse_raft_commit_index{{node=\"{leader}\"}}"),
            );
            if own.is_some() && own == leaders {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "follower {id} reports commit index {own:?}, the leader {leaders:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

const READ_NODE_PAGE: &str = r##"
const t = (id) => document.getElementById(id).textContent;
const b = window.bourse || {};
const rows = [...document.querySelectorAll("#cluster tbody tr")].map((r) =>
  [...r.children].map((c) => c.textContent));
return {
  frames: b.frames || 0,
  commands_total: b.last ? b.last.totals.commands : 0,
  commands_rate: b.last ? b.last.rates.commands : 0,
  commit: b.last ? b.last.cluster.commit_index : 0,
  kpi_commands: t("kpi-commands"), kpi_commit: t("kpi-commit"), kpi_tx: t("kpi-tx"),
  kpi_md: t("kpi-md"),
  node_stages: [...document.querySelectorAll("#node-stages tbody tr")].map((r) =>
    [...r.children].map((c) => c.textContent)),
  conn: t("conn"), head: t("cluster-head"), alerts: t("alerts"),
  rates_points: Number(document.getElementById("chart-rates").dataset.points || 0),
  rows: rows,
};
"##;

#[test]
fn chromium_shows_a_nodes_cluster_view_under_load_and_a_node_going_down() {
    let mut cluster = NodeCluster::start();
    let _load = Load::start(cluster.nodes.clone(), 8);
    let leader = cluster.leader(Duration::from_secs(30));
    let profile = tempfile::tempdir().unwrap();
    let wd = WebDriver::start(profile.path());
    wd.call(
        "POST",
        "/url",
        Some(json!({"url": format!("http://{}/", cluster.dashboard(leader))})),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        let v = wd.script(READ_NODE_PAGE);
        let rows = v["rows"].as_array().map_or(0, |r| r.len());
        let all_up = v["rows"]
            .as_array()
            .is_some_and(|r| r.iter().all(|row| row[8] == "up"));
        // The node path table: the leader's batches replicated in the last interval.
        let replicated = v["node_stages"].as_array().is_some_and(|r| {
            r.iter()
                .any(|row| row[0] == "replicate" && row[1] != "0" && row[2] != "n/a")
        });
        let md = v["kpi_md"]
            .as_str()
            .is_some_and(|t| t != "n/a" && !t.is_empty());
        if v["frames"].as_u64().unwrap_or(0) >= 3
            && v["commands_rate"].as_f64().unwrap_or(0.0) > 0.0
            && rows == 3
            && all_up
            && replicated
            && md
        {
            break v;
        }
        assert!(Instant::now() < deadline, "no live cluster view: {v}");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(first["conn"], "live", "{first}");
    for id in ["kpi_commands", "kpi_commit", "kpi_tx"] {
        let text = first[id].as_str().unwrap_or("");
        assert!(
            !text.is_empty() && text != "–" && text != "n/a" && text != "0",
            "{id} shows {text:?}: {first}"
        );
    }
    let head = first["head"].as_str().unwrap_or("");
    assert!(head.contains(&format!("leader {leader}")), "{first}");
    let roles: Vec<String> = first["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[1].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        roles.iter().filter(|r| *r == "leader").count(),
        1,
        "one leader in {roles:?}"
    );
    assert_eq!(
        roles.iter().filter(|r| *r == "follower").count(),
        2,
        "{roles:?}"
    );

    std::thread::sleep(Duration::from_millis(2_500));
    let later = wd.script(READ_NODE_PAGE);
    assert!(
        later["commands_total"].as_f64() > first["commands_total"].as_f64(),
        "totals do not move: {first} -> {later}"
    );
    assert!(
        later["commit"].as_f64() > first["commit"].as_f64(),
        "the commit index does not move: {first} -> {later}"
    );
    assert_ne!(
        later["kpi_commit"], first["kpi_commit"],
        "{first} -> {later}"
    );

    // A follower goes down: the leader's page marks it DOWN and fires the alert.
    let victim = (1..=3).find(|id| *id != leader).unwrap();
    cluster.kill(victim);
    let deadline = Instant::now() + Duration::from_secs(20);
    let down = loop {
        let v = wd.script(READ_NODE_PAGE);
        let row_down = v["rows"].as_array().is_some_and(|r| {
            // The row's first cell is the node id as text.
            let id = victim.to_string();
            r.iter()
                .any(|row| row[0].as_str() == Some(id.as_str()) && row[8] == "DOWN")
        });
        let alert = v["alerts"]
            .as_str()
            .is_some_and(|a| a.contains("node_down") && a.contains(&format!("node {victim}")));
        if row_down && alert {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "node {victim} not shown down: {v}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    eprintln!("after killing node {victim}: {}", down["alerts"]);
    std::thread::sleep(Duration::from_secs(2));
    let png = base64_decode(wd.call("GET", "/screenshot", None).as_str().unwrap_or(""));
    assert!(png.starts_with(b"\x89PNG"), "screenshot is a PNG");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("monitor-node-dashboard.png");
    std::fs::write(&path, &png).unwrap();
    eprintln!("node dashboard screenshot: {}", path.display());
}

/// `bourse cluster up --monitor-base-port P` gives each node its `/metrics` and dashboard on
/// P, P+1, P+2 (printed at start); a scrape of each returns that node's own figures, the
/// group has one leader, and a snapshot taken on demand shows up as a snapshot build.
#[test]
fn cluster_up_serves_every_nodes_metrics_from_the_base_port() {
    let dir = tempfile::tempdir().unwrap();
    let ports = [free_port(), free_port(), free_port()];
    let mut toml = format!(
        "cluster_id = 62\ndata_dir = \"{}\"\nfsync = \"never\"\n",
        dir.path().join("data").display()
    );
    for (i, p) in ports.iter().enumerate() {
        toml.push_str(&format!(
            "[[nodes]]\nid = {}\naddr = \"127.0.0.1:{p}\"\n",
            i + 1
        ));
    }
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, toml).unwrap();
    let monitor = dir.path().join("monitor.toml");
    std::fs::write(&monitor, TEST_MONITOR_TOML).unwrap();
    let base = free_port_block(3);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_bourse"))
        .args(["cluster", "up", "--config"])
        .arg(&config)
        .args(["--monitor-base-port", &base.to_string()])
        .arg("--monitor-config")
        .arg(&monitor)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("bourse cluster up starts");
    let stdout = child.stdout.take().unwrap();
    let _up = Interruptible(child);
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().unwrap().push(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("cluster up"))
    {
        assert!(
            Instant::now() < deadline,
            "no leader reported: {:?}",
            lines.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let printed = lines.lock().unwrap().clone();
    let mut leaders = 0;
    for id in 1..=3u64 {
        let addr: SocketAddr = format!("127.0.0.1:{}", base + id as u16 - 1)
            .parse()
            .unwrap();
        assert!(
            printed
                .iter()
                .any(|l| l.contains(&format!("node {id}: dashboard http://{addr}/"))),
            "node {id}'s addresses are printed: {printed:?}"
        );
        // The node's own figures, under its own id (the first status poll may take a tick).
        let deadline = Instant::now() + Duration::from_secs(20);
        let text = loop {
            let (status, text) = http(addr, "GET", "/metrics", None);
            if status == 200
                && metric_value(
                    &text,
                    &format!("bourse_raft_last_applied_index{{node=\"{id}\"}}"),
                )
                .is_some_and(|v| v > 0.0)
            {
                break text;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} at {addr} serves no node metrics: {status} {text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(
            text.contains("bourse_queue_depth{queue=\"batcher\"}"),
            "node {id}: batcher queue depth"
        );
        let leading = metric_value(&text, &format!("bourse_raft_is_leader{{node=\"{id}\"}}"))
            .expect("leader gauge");
        leaders += leading as u32;
    }
    assert_eq!(leaders, 1, "one leader among the three nodes");

    // A snapshot on demand on node 2: its build time is exported.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_bourse"))
        .args(["cluster", "snapshot", "--id", "2", "--config"])
        .arg(&config)
        .status()
        .unwrap();
    assert!(status.success(), "bourse cluster snapshot");
    let addr: SocketAddr = format!("127.0.0.1:{}", base + 1).parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, text) = http(addr, "GET", "/metrics", None);
        let builds = metric_value(&text, "bourse_snapshot_build_seconds_count{node=\"2\"}");
        if builds.is_some_and(|n| n >= 1.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 2 exports no snapshot build: {builds:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
