//! `bourse admin serve` in front of separate node processes: three `bourse node` processes
//! form one market's replica group, `bourse admin serve` runs as a process of its own, and
//! `bourse admin ...` commands act through it and query it. The instrument it halts refuses
//! an order sent straight to the group, an unauthenticated request is refused, and a request
//! sent again under the same id applies once.

use bourse_auth::{hash_password_with, HashCost};
use bourse_cluster::tokio;
use bourse_core::*;
use bourse_testkit::certs::Authority;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

const OPERATOR: &str = "alice";
const PASSWORD: &str = "alice-pw";
/// A hang guard: the group elects and the service starts well within this.
const START_LIMIT: Duration = Duration::from_secs(60);

/// Kills the processes when the test ends, passed or failed.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `cluster.toml` for three nodes on `ports`; with `tls`, the `[tls]` table's body (the
/// nodes then accept only certificates of the venue's authority).
fn write_cluster_config(dir: &Path, ports: &[u16], tls: Option<&str>) -> std::path::PathBuf {
    let path = dir.join("cluster.toml");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(
        f,
        "cluster_id = 7\ndata_dir = {:?}\nfsync = \"never\"\nheartbeat_ms = 50\n\
         election_timeout_ms_min = 150\nelection_timeout_ms_max = 300\n\
         orders_max = 1024\naccounts_max = 1024",
        dir.join("data")
    )
    .unwrap();
    for (i, p) in ports.iter().enumerate() {
        writeln!(f, "[[nodes]]\nid = {}\naddr = \"127.0.0.1:{p}\"", i + 1).unwrap();
    }
    if let Some(tls) = tls {
        writeln!(f, "[tls]\n{tls}").unwrap();
    }
    path
}

/// Three `bourse node` processes on loopback (with `tls`, the `[tls]` lines of their config),
/// killed when the returned guard drops, and their addresses.
fn start_group(dir: &Path, tls: Option<&str>) -> (Processes, Vec<SocketAddr>) {
    let ports = bourse_testkit::free_ports::<3>();
    let config = write_cluster_config(dir, &ports, tls);
    let processes = Processes((1..=3).map(|id| spawn_node(dir, &config, id)).collect());
    let nodes = ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    (processes, nodes)
}

fn spawn_node(dir: &Path, config: &Path, id: u64) -> Child {
    let log = std::fs::File::create(dir.join(format!("node-{id}.log"))).unwrap();
    Process::new(env!("CARGO_BIN_EXE_bourse"))
        .args(["node", "--config"])
        .arg(config)
        .args(["--id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("bourse node starts")
}

/// Starts `bourse admin serve` and reads the address it prints; `top_extra` is added to the
/// config's top level (the listener's `tls`), `core_extra` to the core's table (its `tls`).
fn spawn_admin(
    dir: &Path,
    nodes: &[SocketAddr],
    top_extra: &str,
    core_extra: &str,
) -> (Child, String) {
    let hash = hash_password_with(PASSWORD, HashCost::TEST_ONLY).unwrap();
    std::fs::write(
        dir.join("operators.toml"),
        format!(
            "[[operators]]\nname = \"{OPERATOR}\"\npassword_hash = \"{}\"\nroles = [\"operator\"]\n",
            hash.as_str()
        ),
    )
    .unwrap();
    let nodes: Vec<String> = nodes.iter().map(|a| format!("\"{a}\"")).collect();
    let config = dir.join("admin.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\n{top_extra}\ncredentials_path = \"operators.toml\"\n\
             audit_log_path = \"audit.jsonl\"\n[[cores]]\nname = \"equities\"\n\
             instruments = [1]\nnodes = [{}]\n{core_extra}\n",
            nodes.join(", ")
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("admin.log")).unwrap();
    let mut child = Process::new(env!("CARGO_BIN_EXE_bourse"))
        .args(["admin", "serve", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("bourse admin serve starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .strip_prefix("admin API: ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| {
            panic!(
                "admin serve printed {line:?}; its log: {}",
                std::fs::read_to_string(dir.join("admin.log")).unwrap_or_default()
            )
        })
        .to_string();
    (child, url)
}

/// Runs `bourse admin ARGS` against the service; its exit status and JSON answer.
fn admin(url: &str, password: &str, args: &[&str]) -> (bool, Value) {
    admin_ca(url, None, password, args)
}

/// [`admin`] trusting the authority `ca` for an https URL (`--ca`).
fn admin_ca(url: &str, ca: Option<&Path>, password: &str, args: &[&str]) -> (bool, Value) {
    let mut command = Process::new(env!("CARGO_BIN_EXE_bourse"));
    command.args(["admin", "--url", url, "--user", OPERATOR]);
    if let Some(ca) = ca {
        command.arg("--ca").arg(ca);
    }
    let out = command
        .args(args)
        .env("BOURSE_ADMIN_PASSWORD", password)
        .output()
        .expect("bourse admin runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let answer = serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        panic!(
            "bourse admin {args:?} printed {text:?}; stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), answer)
}

/// The account's state in the one market, as `bourse admin account` answers it.
fn account(url: &str, id: u32) -> Value {
    account_ca(url, None, id)
}

fn account_ca(url: &str, ca: Option<&Path>, id: u32) -> Value {
    let (ok, answer) = admin_ca(url, ca, PASSWORD, &["account", &id.to_string()]);
    assert!(ok, "{answer}");
    answer["markets"][0]["state"].clone()
}

fn new_order(cl: u64, price: i64) -> Command {
    Command::new(
        1,
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(900_001),
            cl_ord_id: ClOrdId(cl),
            instrument: InstrumentId(1),
            side: Side::Buy,
            ord_type: OrdType::Limit,
            price: Price(price),
            qty: Qty(1),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        }),
    )
}

/// Adds instrument 1 (SBER), retrying only while the service answers `unavailable`: the
/// first action waits for the group's leader (the service's clients retry until one answers,
/// within their deadline).
fn add_instrument_once_a_leader_answers(url: &str, ca: Option<&Path>) {
    let instrument = r#"{"instrument":1,"symbol":"SBER","market":"equity","price_scale":2,"tick":1,"band_bps":1000,"reference_price":10000}"#;
    let started = Instant::now();
    loop {
        let (ok, answer) = admin_ca(
            url,
            ca,
            PASSWORD,
            &[
                "--request-id",
                "add-sber",
                "add-instrument",
                "--market",
                "equities",
                "--json",
                instrument,
            ],
        );
        if ok {
            break;
        }
        assert!(
            started.elapsed() < START_LIMIT,
            "the instrument was never added: {answer}"
        );
        assert_eq!(answer["outcome"], "unavailable", "{answer}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn admin_serve_operates_a_group_of_node_processes_through_the_admin_commands() {
    let dir = tempfile::tempdir().unwrap();
    let (mut processes, nodes) = start_group(dir.path(), None);
    let (child, url) = spawn_admin(dir.path(), &nodes, "", "");
    processes.0.push(child);
    add_instrument_once_a_leader_answers(&url, None);
    let (ok, answer) = admin(
        &url,
        PASSWORD,
        &[
            "add-account",
            "--account",
            "900001",
            "--firm",
            "3",
            "--cash",
            "1000000000",
        ],
    );
    assert!(ok, "{answer}");
    let state = account(&url, 900_001);
    assert_eq!(state["firm"], 3, "{state}");
    assert_eq!(state["cash"], 1_000_000_000i64, "{state}");

    // Halted: the leader answers the phase, and an order sent straight to the group is
    // refused with the halt's reason.
    let (ok, answer) = admin(&url, PASSWORD, &["halt", "--instrument", "1"]);
    assert!(ok, "{answer}");
    let (ok, answer) = admin(&url, PASSWORD, &["instruments"]);
    assert!(ok, "{answer}");
    let listed = &answer["markets"][0]["state"]["instruments"][0];
    assert_eq!(listed["symbol"], "SBER", "{answer}");
    assert_eq!(listed["phase"], "halted", "{answer}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ids: Vec<(u64, SocketAddr)> = nodes
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, *a))
        .collect();
    let mut trader = bourse_cluster::Client::new(ids, 1, 1);
    let (_, events) = rt
        .block_on(trader.submit_for_events(&new_order(1, 10_000), Duration::from_secs(30)))
        .expect("the group answers");
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::OrderRejected {
                reason: RejectReason::InstrumentHalted,
                ..
            }
        )),
        "{events:?}"
    );
    let (ok, answer) = admin(&url, PASSWORD, &["resume", "--instrument", "1"]);
    assert!(ok, "{answer}");
    let (_, events) = rt
        .block_on(trader.submit_for_events(&new_order(2, 10_000), Duration::from_secs(30)))
        .expect("the group answers");
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::OrderAccepted { .. })),
        "{events:?}"
    );
    let state = account(&url, 900_001);
    assert_eq!(state["orders"].as_array().unwrap().len(), 1, "{state}");
    // The book shows the order resting; an instrument no core holds has no book.
    let order_id = state["orders"][0]["order_id"].clone();
    let (ok, answer) = admin(&url, PASSWORD, &["book", "1"]);
    assert!(ok, "{answer}");
    let book = &answer["markets"][0]["state"];
    assert_eq!(book["orders_total"], 1, "{answer}");
    assert_eq!(
        book["orders"][0],
        serde_json::json!({"order_id": order_id, "side": "buy", "price": 10_000, "qty": 1}),
        "{answer}"
    );
    let (ok, answer) = admin(&url, PASSWORD, &["book", "77"]);
    assert!(ok, "{answer}");
    assert_eq!(answer["markets"][0]["state"], Value::Null, "{answer}");

    // The kill switch cancels the order and shows on the account and the book.
    let (ok, answer) = admin(&url, PASSWORD, &["kill", "--firm", "3"]);
    assert!(ok, "{answer}");
    let state = account(&url, 900_001);
    assert_eq!(state["kill_switch_engaged"], true, "{state}");
    assert_eq!(state["orders"].as_array().unwrap().len(), 0, "{state}");
    let (ok, answer) = admin(&url, PASSWORD, &["book", "1"]);
    assert!(ok, "{answer}");
    assert_eq!(answer["markets"][0]["state"]["orders_total"], 0, "{answer}");

    // Unauthenticated: refused, nothing applied.
    let (ok, answer) = admin(
        &url,
        "wrong-password",
        &[
            "deposit",
            "--market",
            "equities",
            "--account",
            "900001",
            "--amount",
            "5",
        ],
    );
    assert!(!ok, "{answer}");
    assert_eq!(answer["outcome"], "refused", "{answer}");

    // The same request id twice: applied once, the second answered from the first.
    let deposit = [
        "--request-id",
        "deposit-once",
        "deposit",
        "--market",
        "equities",
        "--account",
        "900001",
        "--amount",
        "700",
    ];
    let (ok, first) = admin(&url, PASSWORD, &deposit);
    assert!(ok, "{first}");
    let (ok, again) = admin(&url, PASSWORD, &deposit);
    assert!(ok, "{again}");
    assert_eq!(again["retried"], true, "{again}");
    let state = account(&url, 900_001);
    assert_eq!(state["cash"], 1_000_000_700i64, "{state}");

    // A margin call through `bourse admin margin-call`: the core applies it (its event is in
    // the answer), and 0 closes it.
    let (ok, answer) = admin(
        &url,
        PASSWORD,
        &["margin-call", "900001", "5000", "--market", "equities"],
    );
    assert!(ok, "{answer}");
    assert!(answer.to_string().contains("margin_call_set"), "{answer}");
    let (ok, answer) = admin(
        &url,
        PASSWORD,
        &["margin-call", "900001", "0", "--market", "equities"],
    );
    assert!(ok, "{answer}");
}

/// The nodes take only certificates of the venue's authority (plain TCP to them is refused
/// before any frame), and `bourse admin serve` reaches them with `tls` in the core's table,
/// as a gateway does: an ordered action (the halt), a bulk addition (the pipelined lane and
/// the committed stream read from the leader) and both queries all cross TLS. The service's
/// own listener speaks HTTPS (its top-level `tls`), and `bourse admin --ca` talks to it.
#[test]
fn admin_serve_drives_nodes_that_require_certificates_through_the_core_tls_key() {
    let dir = tempfile::tempdir().unwrap();
    let venue = Authority::new(dir.path(), "venue");
    for id in 1..=3 {
        venue.issue(&format!("node-{id}"), &["127.0.0.1"]);
    }
    let (node_cert, node_key) = venue.paths("node-{id}");
    let node_tls = format!(
        "ca_path = {:?}\ncert_path = {:?}\nkey_path = {:?}",
        venue.ca_path(),
        node_cert,
        node_key
    );
    let (mut processes, nodes) = start_group(dir.path(), Some(&node_tls));
    // The service's own certificate names no host: it is a client of the nodes, not a node.
    let (cert, key) = venue.issue("admin", &[]);
    let admin_tls = format!(
        "tls = {{ ca_path = {:?}, cert_path = {:?}, key_path = {:?} }}",
        venue.ca_path(),
        cert,
        key
    );
    let (api_cert, api_key) = venue.issue("admin-api", &["127.0.0.1"]);
    let listener_tls = format!(
        "tls = {{ cert_path = {:?}, key_path = {:?} }}",
        api_cert, api_key
    );
    let (child, url) = spawn_admin(dir.path(), &nodes, &listener_tls, &admin_tls);
    processes.0.push(child);
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let ca = venue.ca_path();
    let ca = Some(ca.as_path());
    add_instrument_once_a_leader_answers(&url, ca);

    let accounts = dir.path().join("accounts.ndjson");
    std::fs::write(
        &accounts,
        (1..=3)
            .map(|n| {
                format!(
                    "{{\"account\":{},\"firm\":4,\"cash\":{}}}\n",
                    910_000 + n,
                    n
                )
            })
            .collect::<String>(),
    )
    .unwrap();
    let file = accounts.to_str().unwrap();
    let (ok, answer) = admin_ca(&url, ca, PASSWORD, &["add-accounts", "--file", file]);
    assert!(ok, "{answer}");
    for n in 1..=3u32 {
        let state = account_ca(&url, ca, 910_000 + n);
        assert_eq!(state["firm"], 4, "{state}");
        assert_eq!(state["cash"], n, "{state}");
    }

    let (ok, answer) = admin_ca(&url, ca, PASSWORD, &["halt", "--instrument", "1"]);
    assert!(ok, "{answer}");
    let (ok, answer) = admin_ca(&url, ca, PASSWORD, &["instruments"]);
    assert!(ok, "{answer}");
    let listed = &answer["markets"][0]["state"]["instruments"][0];
    assert_eq!(listed["symbol"], "SBER", "{answer}");
    assert_eq!(listed["phase"], "halted", "{answer}");

    // Without the authority, the client refuses before it connects: no password is sent.
    let out = Process::new(env!("CARGO_BIN_EXE_bourse"))
        .args(["admin", "--url", &url, "--user", OPERATOR, "instruments"])
        .env("BOURSE_ADMIN_PASSWORD", PASSWORD)
        .env_remove("BOURSE_ADMIN_CA")
        .output()
        .expect("bourse admin runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("CA file"), "{stderr}");
}
