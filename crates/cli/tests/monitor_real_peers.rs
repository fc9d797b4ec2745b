//! Monitoring against real peers: the Prometheus server scrapes a running `bourse demo` and
//! gives back what the node reported; headless Chromium opens the dashboard under load, sees
//! live figures that move, and saves a screenshot. Both tools come from Debian packages
//! installed by scripts/install-test-tools.sh; a missing tool fails the test with that advice.
//! Everything listens on 127.0.0.1 only.

#[path = "monitor_support.rs"]
mod support;

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
    let demo = Demo::start(&[
        "--seconds",
        "8",
        "--rate",
        "20000",
        "--linger-seconds",
        "60",
    ]);
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

    // Under load: Prometheus sees the target up and a counter that grows.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if prometheus_scalar(prom_addr, "up{job=\"bourse\"}") == Some(1.0) {
            if let Some(v) = prometheus_scalar(prom_addr, "bourse_transactions_total") {
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

    // After the run the counters are frozen: Prometheus must hold exactly what the node says,
    // and the node must say what the demo's own summary printed.
    let summary = demo.wait_for_line("transactions (successful):", Duration::from_secs(30));
    demo.wait_for_line("dashboard stays at", Duration::from_secs(30));
    let printed = summary
        .split_whitespace()
        .nth(2)
        .and_then(parse_count)
        .expect("summary count");
    let (status, exposition) = http(demo.addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let node = metric_value(&exposition, "bourse_transactions_total{core=\"demo\"}")
        .expect("the node exports bourse_transactions_total");
    assert_eq!(node as u64, printed, "node's counter vs the demo's summary");
    assert!(node >= first, "Prometheus saw more than the node reported");
    let node_orders = metric_value(&exposition, "bourse_orders_total{core=\"demo\"}").unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tx = prometheus_scalar(prom_addr, "bourse_transactions_total");
        let orders = prometheus_scalar(prom_addr, "bourse_orders_total");
        if tx == Some(node) && orders == Some(node_orders) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus holds {tx:?} / {orders:?}, the node reported {node} / {node_orders}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Prometheus saw the counter grow while the demo traded.
    let growth = prometheus_scalar(
        prom_addr,
        "max_over_time(bourse_transactions_total[5m]) - min_over_time(bourse_transactions_total[5m])",
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
    let demo = Demo::start(&["--seconds", "40", "--rate", "20000"]);
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
    assert_eq!(first["cluster_rows"], 1, "{first}");

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
