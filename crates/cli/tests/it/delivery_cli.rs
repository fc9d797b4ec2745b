//! `bourse delivery serve` over a replicated core and `bourse delivery tail` reading it: what
//! tail prints is each order's latest state, every trade and reject, as the core's committed
//! stream says, and the example Python client reads the same; with the TLS flags it follows a
//! core that requires certificates; a read replica (`--follow`) prints the same; a config file
//! with an unknown key is refused naming it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bourse_cluster::client::PipelinedClient;
use bourse_cluster::transport;
use bourse_cluster::{tokio, ClusterConfig, Node, StreamConsumer, TlsFiles};
use bourse_core::Event;
use bourse_delivery::{DeliveryClient, Record};
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_testkit::certs::Authority;

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");
const LIMIT: Duration = Duration::from_secs(60);

/// Interrupts (then kills) the child when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_prints_the_latest_state_of_every_order_a_core_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        ClusterConfig::local(77, dir.path().to_path_buf(), bourse_testkit::free_ports());
    config.fsync = bourse_cluster::FsyncSetting::Never;
    config.orders_max = 4096;
    config.accounts_max = 256;
    let (nodes, end) = start_and_drive(&config, 300).await;

    let listen = format!("127.0.0.1:{}", bourse_testkit::free_port());
    let binary_listen = format!("127.0.0.1:{}", bourse_testkit::free_port());
    let core = core_arg(&config);
    let _serve = Guard(
        Command::new(BOURSE)
            .args([
                "delivery",
                "serve",
                "--name",
                "cli-test",
                "--listen",
                &listen,
                "--binary-listen",
                &binary_listen,
                "--core",
                &core,
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_caught_up(&listen, end).await;
    let out = Command::new(BOURSE)
        .args([
            "delivery",
            "tail",
            "--addr",
            &listen,
            "--limit",
            "50",
            "--until-empty",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cursor "));
    let printed: Vec<Record> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();

    // The same picture from the core's committed stream.
    let mut consumer = StreamConsumer::remote(
        config
            .nodes
            .iter()
            .map(|n| n.addr.parse().unwrap())
            .collect(),
        0,
    );
    let mut latest = BTreeMap::new();
    let mut finals = 0;
    while consumer.position() < end {
        let e = consumer.next().await.unwrap();
        for r in e.requests().filter(|r| r.applied_here()) {
            for ev in r.events().map(|e| e.unwrap()) {
                match ev {
                    Event::OrderLog(l) => {
                        latest.insert(l.order_id, l);
                    }
                    Event::Trade { .. } | Event::OrderRejected { .. } => finals += 1,
                    _ => {}
                }
            }
        }
    }
    let mut got = BTreeMap::new();
    let mut got_finals = 0;
    for r in &printed {
        match r.event {
            Event::OrderLog(l) => {
                assert!(
                    got.insert(l.order_id, l).is_none(),
                    "an order printed twice"
                );
            }
            _ => got_finals += 1,
        }
    }
    assert_eq!(got, latest);
    assert_eq!(got_finals, finals);
    assert!(printed.windows(2).all(|w| w[0].pos() < w[1].pos()));

    // The example Python client reads the same records.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/delivery_client.py"
    );
    let out = Command::new("python3")
        .args([
            script,
            "--url",
            &format!("http://{listen}"),
            "--limit",
            "50",
        ])
        .args(["--count", &printed.len().to_string(), "--seconds", "60"])
        .output()
        .expect("python3 runs (scripts/install-test-tools.sh installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from_python: Vec<Record> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(from_python, printed);

    // The binary front gives the same records.
    let out = Command::new(BOURSE)
        .args(["delivery", "tail", "--binary", "--addr", &binary_listen])
        .args(["--limit", "50", "--until-empty"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from_binary: Vec<Record> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(from_binary, printed);

    // A read replica of that node (`--follow` its binary front) prints the same records, and
    // refuses a filtered tail naming the primary.
    let replica_listen = format!("127.0.0.1:{}", bourse_testkit::free_port());
    let _replica = Guard(
        Command::new(BOURSE)
            .args(["delivery", "serve", "--name", "cli-test", "--listen"])
            .args([
                &replica_listen,
                "--follow",
                &binary_listen,
                "--follow-cores",
                "0",
            ])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_caught_up(&replica_listen, end).await;
    let tail = |extra: &[&str]| {
        Command::new(BOURSE)
            .args(["delivery", "tail", "--addr", &replica_listen])
            .args(["--limit", "50", "--until-empty"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = tail(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from_replica: Vec<Record> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(from_replica, printed);
    let out = tail(&["--firm", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("filter_not_served"), "{err}");
    drop(_replica);
    drop(_serve);
    for n in nodes {
        n.shutdown().await;
    }
}

/// Starts `config`'s nodes and commits the flow's set-up and `orders` commands; returns the
/// nodes and the end of what was committed (the furthest node's applied index + 1: a
/// follower may lag the leader that answered).
async fn start_and_drive(config: &ClusterConfig, orders: usize) -> (Vec<Node>, u64) {
    let mut nodes = Vec::new();
    for n in &config.nodes {
        nodes.push(Node::start(config, n.id).await.unwrap());
    }
    let addrs: Vec<_> = config
        .nodes
        .iter()
        .map(|n| (n.id, n.addr.parse().unwrap()))
        .collect();
    let mut client = PipelinedClient::start(addrs, 1, 1, 256);
    let mut flow = FlowConfig::exchange_core(5);
    flow.accounts = 20;
    let mut flow = Flow::new(flow);
    let mut last = 0;
    let bodies: Vec<_> = flow
        .setup()
        .into_iter()
        .chain((0..orders).map(|_| flow.next_command()))
        .collect();
    for (i, body) in bodies.into_iter().enumerate() {
        last = client
            .submit(&bourse_core::Command::new(i as u64, body))
            .await
            .unwrap();
    }
    while tokio::time::timeout(LIMIT, client.next_answer())
        .await
        .unwrap()
        .unwrap()
        .request_seq
        != last
    {}
    let mut end = 0;
    for n in &nodes {
        end = end.max(n.status().await.last_applied_index.map_or(0, |i| i + 1));
    }
    (nodes, end)
}

/// Waits until the delivery node at `listen` serves and has applied core 0 up to `end`.
async fn wait_caught_up(listen: &str, end: u64) {
    let mut status_client = DeliveryClient::new(listen.parse().unwrap());
    let started = Instant::now();
    loop {
        if let Ok(s) = status_client.status().await {
            if s["cores"][0]["applied_index"].as_u64() >= Some(end) {
                return;
            }
        }
        assert!(started.elapsed() < LIMIT, "delivery node did not catch up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `--core ID=ADDR,...` for `config`'s nodes, as core 0.
fn core_arg(config: &ClusterConfig) -> String {
    format!(
        "0={}",
        config
            .nodes
            .iter()
            .map(|n| n.addr.clone())
            .collect::<Vec<_>>()
            .join(",")
    )
}

/// With `--tls-ca/--tls-cert/--tls-key`, `serve` follows a core whose nodes accept only
/// certificates of the venue's authority (plain TCP would be refused before any frame).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_follows_a_core_that_requires_certificates_with_the_tls_flags() {
    let dir = tempfile::tempdir().unwrap();
    let venue = Authority::new(dir.path(), "venue");
    let mut config =
        ClusterConfig::local(78, dir.path().join("data"), bourse_testkit::free_ports());
    config.fsync = bourse_cluster::FsyncSetting::Never;
    config.orders_max = 4096;
    config.accounts_max = 256;
    for n in &config.nodes {
        venue.issue(&format!("node-{}", n.id), &["127.0.0.1"]);
    }
    let (cert_path, key_path) = venue.paths("node-{id}");
    config.tls = Some(TlsFiles {
        ca_path: venue.ca_path(),
        cert_path,
        key_path,
    });
    // This process reaches the nodes as a gateway would, with a certificate of its own.
    let node_addrs: Vec<SocketAddr> = config
        .nodes
        .iter()
        .map(|n| n.addr.parse().unwrap())
        .collect();
    let (cert_path, key_path) = venue.issue("test-client", &[]);
    let files = TlsFiles {
        ca_path: venue.ca_path(),
        cert_path,
        key_path,
    };
    transport::configure_client(&node_addrs, Some(&files)).unwrap();
    let (nodes, end) = start_and_drive(&config, 100).await;

    let listen = format!("127.0.0.1:{}", bourse_testkit::free_port());
    let (cert, key) = venue.issue("delivery", &[]);
    let _serve = Guard(
        Command::new(BOURSE)
            .args([
                "delivery",
                "serve",
                "--listen",
                &listen,
                "--core",
                &core_arg(&config),
            ])
            .arg("--tls-ca")
            .arg(venue.ca_path())
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_caught_up(&listen, end).await;
    drop(_serve);
    for n in nodes {
        n.shutdown().await;
    }
}

#[test]
fn serve_refuses_a_config_with_an_unknown_key_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("delivery.toml");
    std::fs::write(
        &path,
        "name = \"x\"\nlisten = \"127.0.0.1:0\"\ncolour = \"red\"\n[[cores]]\nid = 0\nnodes = [\"127.0.0.1:1\"]\n",
    )
    .unwrap();
    let out = Command::new(BOURSE)
        .args(["delivery", "serve", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field `colour`"), "{err}");
}
