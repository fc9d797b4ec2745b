//! `bourse gateway`, `bourse order` and `bourse bench gateway` as a user runs them.

use std::net::TcpStream;
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

/// Starts `bourse gateway` with the example config on free ports (plus `extra` lines in its
/// `[gateway]` table); returns the process and the FIX port once it listens.
fn start_gateway(dir: &std::path::Path, extra: &str) -> (Killed, u16) {
    start_gateway_with(dir, extra, &|config| config)
}

/// [`start_gateway`] with `edit` applied to the whole config text.
fn start_gateway_with(
    dir: &std::path::Path,
    extra: &str,
    edit: &dyn Fn(String) -> String,
) -> (Killed, u16) {
    let port = bourse_testkit::free_port();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/gateway.toml"
    ))
    .unwrap();
    let config = example
        .replace("127.0.0.1:9878", &format!("127.0.0.1:{port}"))
        .replace(
            "binary_listen = \"127.0.0.1:9879\"",
            &format!("binary_listen = \"127.0.0.1:0\"\n{extra}"),
        )
        .replace(
            "store_dir = \"gateway-store\"",
            &format!("store_dir = \"{}\"", dir.join("gw").display()),
        );
    let path = dir.join("gateway.toml");
    std::fs::write(&path, edit(config)).unwrap();
    let gateway = Killed(
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
    (gateway, port)
}

#[test]
fn orders_sent_from_the_terminal_trade_and_show_in_the_list() {
    let dir = tempfile::tempdir().unwrap();
    let (_gateway, port) = start_gateway(dir.path(), "");
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
    let out = order(port, "ALPHA", &alpha, &["status", "--cl-ord-id", "s1"]);
    assert!(
        out.contains("exec status    s1 SBER sell 100 @ 250.10 leaves 70 cum 30"),
        "{out}"
    );
    // The list comes from the gateway: with this terminal's record of orders gone, the
    // order is still listed, as the gateway has it.
    std::fs::remove_file(alpha.join("orders.tsv")).unwrap();
    let out = order(port, "ALPHA", &alpha, &["list"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("s1 ") && l.contains("partially-filled")),
        "{out}"
    );
    let out = order(port, "ALPHA", &alpha, &["cancel", "--orig", "s1"]);
    assert!(out.contains("exec cancelled"), "{out}");
    let out = order(port, "ALPHA", &alpha, &["list"]);
    assert!(!out.lines().any(|l| l.starts_with("s1 ")), "{out}");
    // A finished order's status is its last state, not "unknown".
    let out = order(port, "ALPHA", &alpha, &["status", "--cl-ord-id", "s1"]);
    assert!(
        out.contains("exec status    s1 SBER sell 100 @ 250.10 leaves 0 cum 30")
            && out.contains("is cancelled"),
        "{out}"
    );
    let out = order(
        port,
        "ALPHA",
        &alpha,
        &["status", "--cl-ord-id", "never-sent"],
    );
    assert!(out.contains("unknown order"), "{out}");
}

/// One HTTP GET on loopback; the body.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text.split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string())
}

/// The sum of the series `name{...}` whose labels include every `key="value"` of `series`
/// (given as `name{a="x",b="y"}`, in any order).
fn metric(body: &str, series: &str) -> f64 {
    let (name, labels) = match series.split_once('{') {
        Some((n, l)) => (n, l.trim_end_matches('}')),
        None => (series, ""),
    };
    let wanted: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap_or((l, ""));
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && wanted
                    .iter()
                    .all(|w| rest.split(',').any(|x| x.trim_end_matches('}') == *w))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn the_gateway_serves_metrics_that_move_with_the_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let monitor_port = bourse_testkit::free_port();
    let (_gateway, port) = start_gateway(
        dir.path(),
        &format!("monitor_listen = \"127.0.0.1:{monitor_port}\"\nmonitor_sample_every = 1"),
    );
    let addr = format!("127.0.0.1:{monitor_port}");
    let before = http_get(&addr, "/metrics");
    assert_eq!(
        metric(&before, "bourse_gateway_requests_total{kind=\"new_order\"}"),
        0.0,
        "{before}"
    );
    let alpha = dir.path().join("alpha");
    let send = |id: &str, price: &str| {
        order(
            port,
            "ALPHA",
            &alpha,
            &[
                "send",
                "--symbol",
                "SBER",
                "--side",
                "buy",
                "--qty",
                "10",
                "--price",
                price,
                "--cl-ord-id",
                id,
            ],
        )
    };
    send("m1", "249.00");
    send("m2", "249.10");
    // A price outside the band: a reject by the core.
    send("m3", "999.00");
    order(port, "ALPHA", &alpha, &["cancel", "--orig", "m1"]);
    // Counters are published on the gateway's 20 ms timer and probes every 100 ms.
    let deadline = Instant::now() + Duration::from_secs(5);
    let after = loop {
        let body = http_get(&addr, "/metrics");
        let probes = metric(
            &body,
            "bourse_stage_latency_seconds_count{kind=\"new\",stage=\"written\"}",
        );
        if metric(&body, "bourse_gateway_requests_total{kind=\"cancel\"}") >= 1.0 && probes >= 3.0
            || Instant::now() > deadline
        {
            break body;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let m = |series: &str| metric(&after, series);
    assert_eq!(
        m("bourse_gateway_requests_total{kind=\"new_order\"}"),
        3.0,
        "{after}"
    );
    assert_eq!(
        m("bourse_gateway_requests_total{kind=\"cancel\"}"),
        1.0,
        "{after}"
    );
    assert_eq!(
        m("bourse_gateway_rejects_total{cause=\"core\"}"),
        1.0,
        "{after}"
    );
    assert!(
        m("bourse_gateway_messages_total{direction=\"in\",protocol=\"fix\"}") >= 4.0,
        "{after}"
    );
    // New ×3 (one rejected), cancelled ×1.
    assert!(
        m("bourse_gateway_execution_reports_total") >= 4.0,
        "{after}"
    );
    // Four `bourse order` runs logged on (a Logon and a report each) and off.
    assert!(
        m("bourse_gateway_messages_total{direction=\"out\",protocol=\"fix\"}") >= 8.0,
        "{after}"
    );
    assert!(m("bourse_gateway_disconnects_total") >= 3.0, "{after}");
    assert!(
        after.contains("bourse_queue_depth{queue=\"gateway_to_core_core\"}"),
        "{after}"
    );
    assert!(
        after.contains("bourse_sessions{protocol=\"fix\"}"),
        "{after}"
    );
    // Every request was sampled: the legs from the socket read to the write are there.
    for stage in ["decoded", "to_sequencer", "processed", "encoded", "written"] {
        let series =
            format!("bourse_stage_latency_seconds_count{{kind=\"new\",stage=\"{stage}\"}}");
        assert!(m(&series) >= 3.0, "{series}: {after}");
    }
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

#[test]
fn the_gateway_benchmark_refuses_a_window_of_zero_by_name() {
    let out = Command::new(BOURSE)
        .args(["bench", "gateway", "--window", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--window must be in 1..="), "{err}");
}

/// An operator hashes a password with `bourse auth hash-password`, puts the hash in the
/// session's config, and the firm logs on with `bourse order --password-file`; without the
/// password the Logon is refused with the gateway's reason.
#[test]
fn a_session_with_a_password_hash_logs_on_from_the_terminal_only_with_its_password() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let mut hasher = Command::new(BOURSE)
        .args([
            "auth",
            "hash-password",
            "--memory-kib",
            "64",
            "--iterations",
            "1",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    hasher
        .stdin
        .take()
        .unwrap()
        .write_all(b"beta secret\n")
        .unwrap();
    let out = hasher.wait_with_output().unwrap();
    assert!(out.status.success());
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let (_gateway, port) = start_gateway_with(dir.path(), "", &|config| {
        config.replace(
            "client_comp_id = \"BETA\"\n",
            &format!("client_comp_id = \"BETA\"\npassword_hash = \"{hash}\"\n"),
        )
    });
    let refused = Command::new(BOURSE)
        .args([
            "order",
            "--fix",
            &format!("127.0.0.1:{port}"),
            "--sender",
            "BETA",
        ])
        .arg("--store")
        .arg(dir.path().join("without"))
        .arg("list")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("Password (554) required"), "{why}");
    let password_file = dir.path().join("beta.password");
    std::fs::write(&password_file, "beta secret\n").unwrap();
    order(
        port,
        "BETA",
        &dir.path().join("with"),
        &["--password-file", password_file.to_str().unwrap(), "list"],
    );
}

/// `bourse order` reaches a session that logs on over TLS only (`--tls-ca`, the gateway's
/// certificate made here) and changes its password on Logon (`--new-password-file`): the old
/// password stops working, the new one works, and over plain TCP the session is refused as a
/// stranger is.
#[test]
fn the_terminal_logs_on_over_tls_and_changes_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.path().join("gw.crt"), dir.path().join("gw.key"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.key_pair.serialize_pem()).unwrap();
    let hash =
        bourse_auth::hash_password_with("beta old", bourse_auth::HashCost::TEST_ONLY).unwrap();
    let tls_port = bourse_testkit::free_port();
    let extra = format!(
        "fix_tls_listen = \"127.0.0.1:{tls_port}\"\ntls_cert_path = \"{}\"\ntls_key_path = \"{}\"\npassword_store_path = \"{}\"",
        cert.display(),
        key.display(),
        dir.path().join("passwords.toml").display()
    );
    let (_gateway, plain_port) = start_gateway_with(dir.path(), &extra, &|config| {
        config.replace(
            "client_comp_id = \"BETA\"\n",
            &format!(
                "client_comp_id = \"BETA\"\npassword_hash = \"{hash}\"\ntls_required = true\n"
            ),
        )
    });
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let (old, new) = (write("old", "beta old\n"), write("new", "beta new\n"));
    let ca = cert.to_str().unwrap().to_string();
    let run = |port: u16, store: &str, args: &[&str]| {
        Command::new(BOURSE)
            .args([
                "order",
                "--fix",
                &format!("127.0.0.1:{port}"),
                "--sender",
                "BETA",
            ])
            .arg("--store")
            .arg(dir.path().join(store))
            .args(["--wait-ms", "300"])
            .args(args)
            .output()
            .unwrap()
    };
    let over_tls = |store: &str, args: &[&str]| {
        let mut all = vec!["--tls-ca", ca.as_str()];
        all.extend_from_slice(args);
        run(tls_port, store, &all)
    };
    // The terminal's session store ("s") carries the sequence numbers from one successful
    // logon to the next; refused attempts use stores of their own.
    let changed = over_tls(
        "s",
        &["--password-file", &old, "--new-password-file", &new, "list"],
    );
    assert!(
        changed.status.success(),
        "{}",
        String::from_utf8_lossy(&changed.stderr)
    );
    let stale = over_tls("x1", &["--password-file", &old, "list"]);
    assert!(!stale.status.success());
    let why = String::from_utf8_lossy(&stale.stderr);
    assert!(why.contains("Invalid password"), "{why}");
    let fresh = over_tls("s", &["--password-file", &new, "list"]);
    assert!(
        fresh.status.success(),
        "{}",
        String::from_utf8_lossy(&fresh.stderr)
    );
    // Over plain TCP even the right password is told what a stranger is told.
    let plain = run(plain_port, "x2", &["--password-file", &new, "list"]);
    assert!(!plain.status.success());
    let why = String::from_utf8_lossy(&plain.stderr);
    assert!(why.contains("Invalid password"), "{why}");
    // A certificate the terminal does not trust fails the connect, saying so.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let untrusted = write("other.crt", &other.cert.pem());
    let doubt = run(
        tls_port,
        "x3",
        &["--tls-ca", &untrusted, "--password-file", &new, "list"],
    );
    assert!(!doubt.status.success());
    let why = String::from_utf8_lossy(&doubt.stderr);
    assert!(why.contains("TLS handshake"), "{why}");
}
