//! `bourse gateway`, `bourse order` and `bourse bench gateway` as a user runs them.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn order(port: u16, sender: &str, store: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(BOURSE)
        .args([
            "order",
            "--fix",
            &format!("127.0.0.1:{port}"),
            "--sender",
            sender,
        ])
        .arg("--store")
        .arg(store)
        .args(["--wait-ms", "700"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn orders_sent_from_the_terminal_trade_and_show_in_the_list() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/gateway.toml"
    ))
    .unwrap();
    let config = example
        .replace("127.0.0.1:9878", &format!("127.0.0.1:{port}"))
        .replace(
            "binary_listen = \"127.0.0.1:9879\"",
            "binary_listen = \"127.0.0.1:0\"",
        )
        .replace(
            "store_dir = \"gateway-store\"",
            &format!("store_dir = \"{}\"", dir.path().join("gw").display()),
        );
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let _gateway = Killed(
        Command::new(BOURSE)
            .args(["gateway", "--config"])
            .arg(&path)
            .args(["--orders-max", "10000"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "gateway did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let alpha = dir.path().join("alpha");
    let beta = dir.path().join("beta");
    let out = order(
        port,
        "ALPHA",
        &alpha,
        &[
            "send",
            "--symbol",
            "SBER",
            "--side",
            "sell",
            "--qty",
            "100",
            "--price",
            "250.10",
            "--cl-ord-id",
            "s1",
        ],
    );
    assert!(out.contains("exec new       s1"), "{out}");
    let out = order(
        port,
        "BETA",
        &beta,
        &[
            "send", "--symbol", "SBER", "--side", "buy", "--qty", "30", "--price", "250.10",
        ],
    );
    assert!(out.contains("exec trade"), "{out}");
    // Alpha's fill arrived while no alpha command ran: the next one receives it.
    let out = order(port, "ALPHA", &alpha, &["list"]);
    assert!(out.contains("last 30 @ 250.10"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("s1 ") && l.contains("partially-filled")),
        "{out}"
    );
    let out = order(port, "ALPHA", &alpha, &["cancel", "--orig", "s1"]);
    assert!(out.contains("exec cancelled"), "{out}");
    let out = order(port, "ALPHA", &alpha, &["list"]);
    assert!(!out.lines().any(|l| l.starts_with("s1 ")), "{out}");
}

#[test]
fn the_gateway_benchmark_prints_one_json_object_per_scenario() {
    let out = Command::new(BOURSE)
        .args([
            "bench",
            "gateway",
            "--seconds",
            "1",
            "--rates",
            "2000",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        4,
        "binary and fix, open loop and saturation: {text}"
    );
    for v in &lines {
        assert_eq!(v["bench"], "gateway");
        assert!(v["latency_ns"]["p50"].as_u64().unwrap() > 0);
        assert!(v["baseline"]["echo_rtt_ns"]["p50"].as_u64().unwrap() > 0);
        assert!(v["answered"].as_u64().unwrap() > 0);
    }
}
