//! Faults between hosts, as Jepsen injects them, in network namespaces (`scripts/netbed.sh`):
//! three `bourse node` processes each in its own namespace (n1, n2, n3), the clients in their
//! own (cl; the test process runs there), a `bourse gateway` in its own (gw) with its links to
//! the nodes over mutual TLS, and a `bourse md listen` subscriber in its own (sub) reading
//! feeds A and B over real multicast on two networks. Two clients run throughout: the cluster
//! client, one request at a time straight to the nodes, and a FIX client sending an order
//! every 10 ms through the gateway (the failover as a venue's client sees it). Faults, in an
//! order drawn from the seed:
//!
//! - **leader alone**: the leader cut off both ways from everyone (the majority goes on);
//! - **leader cannot send**: the leader's packets to everyone dropped, theirs still arrive
//!   (one way);
//! - **follower alone**: one follower cut off both ways (a minority without the leader);
//! - **leader paused** / **follower paused**: SIGSTOP, later SIGCONT;
//! - **leader killed**: SIGKILL, restarted at the heal;
//! - **no quorum**: both followers paused (nothing can commit until they return);
//! - **leader lossy** / **leader duplicating** / **leader reordering**: 15% of the packets on
//!   the leader's links, both ways, lost / duplicated / held 2 ms longer so later ones pass
//!   them (`netbed.sh impair`, a userspace netem: this kernel has none); the loss also hits
//!   the leader's feed A (not B), the reordering both feeds;
//! - **follower delayed**: a 50 ms delay spike on the links between the leader and one
//!   follower, both ways;
//! - **follower slow disk**: the follower's process may write to its disk only 10 times a
//!   second (`netbed.sh slowdisk`, a cgroup's write limit: each of its fsyncs takes 100 ms or
//!   more); the other two must go on acknowledging, and after the heal (the limit lifted) the
//!   follower must apply everything the group had committed at the heal;
//! - **follower full disk**: the follower's file system filled until ENOSPC (every node's
//!   data directory is a 256 MiB ext4 of its own on a loop device, `netbed.sh smalldisk`,
//!   whose image is on /dev/shm where there is one);
//!   the follower must stop (its process ends, or its status names the error) and the other
//!   two go on; the heal removes the filler and restarts it, and it must catch up as above;
//! - **leader slow disk** / **leader full disk**: the same for the leader. On a slow disk it
//!   may keep leading (the followers' two fsyncs make a quorum without its own) or lose the
//!   lead, but acknowledgements must go on; on a full disk it must stop and the other two elect
//!   a leader among themselves and go on; after either heal it must catch up.
//!
//! The bed runs with `netbed.sh distance` on: n1 and n2 in one data centre 50 µs apart, n3 in
//! another 1 ms one way from every host (an impairment of a link adds to its distance).
//!
//! Each fault holds for a while and is healed; acknowledgements must resume after every heal,
//! for both clients. At the end every replica must hold exactly the acknowledged commands (the
//! cluster client sends one at a time and retries under the same key; the gateway's link
//! applies each order once; so the engine's command count equals the gateway's bootstrap, the
//! cluster client's acknowledgements and the orders the gateway did not refuse for want of a
//! quorum: nothing lost, nothing applied twice) with equal state hashes and no alarm, every
//! order through the gateway must be answered, none refused for another reason, the
//! subscriber must have read both feeds from across the namespaces, and the order-level books
//! it rebuilt from them (`md listen --books-out`) must come to equal every replica's, order by
//! order (`Query::Book`), whatever it lost and recovered on the way. The test
//! prints, per kind of fault, how long acknowledgements stopped counted from the fault and
//! from the heal (p50/p99/max from HDR histograms), the same for the FIX client through the
//! gateway (and when the no-quorum refusal reached it), and two hops seen by asking the nodes for
//! their status every 20 ms while the fault holds: when another node named itself leader,
//! and when a leader without a quorum said so.
//!
//! The CI run injects each kind once (seeded order). `BOURSE_NETBED_FAULTS=N` runs N faults
//! drawn at random (the long run of docs/results/netns-faults.md); `BOURSE_NETBED_SEED`
//! replays a schedule; `BOURSE_NETBED_KINDS` names the kinds to draw from and
//! `BOURSE_NETBED_FSYNC` the nodes' fsync setting (`always` unless set). It needs root and
//! `ip netns`; without them it says SKIPPED and passes.
//! The impairments need iptables (scripts/install-test-tools.sh) and `bourse-netem` beside
//! the `bourse` binary (`cargo build --release -p bourse-testkit --bin bourse-netem`; a
//! workspace test run builds it); the disks need a cgroup io controller (v1 blkio throttling
//! or v2 io), `losetup` and `mkfs.ext4`. Without any of them the test fails and says which is
//! missing: no kind of fault is skipped.
//!
//! Every link to a node runs over mutual TLS (the nodes are off the loopback, where plain TCP
//! is refused): the test makes a venue authority, a certificate per node naming its address on
//! network 1, and one for its own client (rcgen, never committed).

use crate::fix_orders;
use crate::replica_check;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bourse_cluster::tokio;
use bourse_engine::workload::Rng;
use fix_orders::{fix_client_thread, FixOrders, OrderSpec, Outcome};
use hdrhistogram::Histogram;
use replica_check::{
    bourse_bin, check_replicas, client_thread, leader, pause_client, statuses, summary, Shared,
    FAILOVER_LIMIT,
};

/// This test's full name in the `it` binary (module path included), run again with `--exact`.
const TEST_NAME: &str =
    "netns_faults::faults_between_namespaces_lose_nothing_acknowledged_and_the_feed_crosses_hosts";
/// Set in the inner run (inside the client's namespace) to the bed's prefix.
const INNER_ENV: &str = "BOURSE_NETBED_INNER";
/// `BOURSE_NETBED_DISTANCE=0` runs the bed without `netbed.sh distance` (every host 0 µs
/// from the others), for comparing what distance costs.
const DISTANCE_ENV: &str = "BOURSE_NETBED_DISTANCE";
/// `BOURSE_NETBED_FSYNC=batch` (or `never`) runs the nodes with that fsync setting instead of
/// `always`, for comparing what a leader's slow disk costs under each.
const FSYNC_ENV: &str = "BOURSE_NETBED_FSYNC";
/// `BOURSE_NETBED_KINDS=LeaderSlowDisk,LeaderAlone` draws only those kinds of fault.
const KINDS_ENV: &str = "BOURSE_NETBED_KINDS";
/// Acknowledgements timed before the first fault, one request in flight: the quiet round
/// trip (client → leader → quorum → client) the distance adds to.
const QUIET_ACKS: usize = 1_000;
const NODE_PORT: u16 = 7101;
const FEED_BASE_PORT: u16 = 32000;
const GROUP_A: &str = "239.192.77.1";
const GROUP_B: &str = "239.192.78.1";
/// Silences above this are clamped in the histograms.
const SILENCE_US_MAX: u64 = 60_000_000;
/// After a heal the client runs this long before the next fault (the heal's window).
const AFTER_HEAL: Duration = Duration::from_millis(1_500);
/// While a fault holds, the nodes are asked for their status this often, to time the hops of
/// a failover (when another node names itself leader; when a leader without a quorum says so).
const WATCH_EVERY: Duration = Duration::from_millis(20);
/// How long one node may take to answer a status call while the fault holds.
const WATCH_CALL_TIMEOUT: Duration = Duration::from_millis(100);
/// The gateway's FIX port on its host (gw).
const GATEWAY_FIX_PORT: u16 = 9880;
/// The FIX client sends one order through the gateway this often, whatever happens.
const FIX_PACE: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    LeaderAlone,
    LeaderCannotSend,
    FollowerAlone,
    LeaderPaused,
    FollowerPaused,
    LeaderKilled,
    NoQuorum,
    LeaderLossy,
    LeaderDuplicating,
    LeaderReordering,
    FollowerDelayed,
    FollowerSlowDisk,
    FollowerFullDisk,
    LeaderSlowDisk,
    LeaderFullDisk,
}

const FAULTS: [Fault; 15] = [
    Fault::LeaderAlone,
    Fault::LeaderCannotSend,
    Fault::FollowerAlone,
    Fault::LeaderPaused,
    Fault::FollowerPaused,
    Fault::LeaderKilled,
    Fault::NoQuorum,
    Fault::LeaderLossy,
    Fault::LeaderDuplicating,
    Fault::LeaderReordering,
    Fault::FollowerDelayed,
    Fault::FollowerSlowDisk,
    Fault::FollowerFullDisk,
    Fault::LeaderSlowDisk,
    Fault::LeaderFullDisk,
];

/// The share of the leader's packets (both ways) lost, duplicated or reordered by those faults.
const IMPAIR_PCT: &str = "15";
/// How much longer a reordered packet is held (so that the ones after it pass it).
const REORDER_EXTRA_US: u64 = 2_000;
/// The delay spike between the leader and one follower (one way).
const SPIKE_DELAY_US: u64 = 50_000;
/// The writes a second a slow disk takes (`netbed.sh slowdisk`): each fsync needs at least
/// one, so it takes 100 ms or more.
const SLOW_DISK_WRITE_IOPS: u64 = 10;
/// Each node's data directory is a file system of this size of its own (`netbed.sh
/// smalldisk`), so that a full disk fills one node's alone. Its image is sparse.
const SMALL_DISK_MIB: u64 = 256;
/// Where the small disks' images go when it exists: a tmpfs, so that an fsync on a small disk
/// costs what the loop device and ext4 cost, not the machine's disk under other load (the
/// slow disk is the cgroup limit on the loop device, which holds either way).
const IMAGE_DIR: &str = "/dev/shm";
/// Acknowledgements the group must give while a node's disk is slow or full.
const ACKS_WITHOUT_THE_DISK: u64 = 20;
/// What a journal write on a full disk fails with, as the node's status names it.
const ENOSPC_TEXT: &str = "No space left on device";

/// The distance between two hosts with `netbed.sh distance` on, one way, in µs: n1 and n2
/// 50 µs apart, n3 1 ms from every other host (its data centre is the far one).
fn distance_us(from: &str, to: &str) -> u64 {
    if !distance_on() {
        return 0;
    }
    match (from, to) {
        ("n3", t) | (t, "n3") if t != "n3" => 1_000,
        ("n1", "n2") | ("n2", "n1") => 50,
        _ => 0,
    }
}

fn netbed() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netbed.sh")
}

/// A host's address on network 1 (scripts/netbed.sh); a multicast group stays itself.
fn host_addr(host: &str) -> String {
    let i = match host {
        "n1" => 1,
        "n2" => 2,
        "n3" => 3,
        "gw" => 5,
        "cl" => 10,
        "sub" => 20,
        group => return group.to_string(),
    };
    format!("10.201.0.{i}")
}

/// A node's data directory (`node_dir` of the cluster config): its small disk's mount point.
fn node_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join("data").join(format!("node-{id}"))
}

fn distance_on() -> bool {
    std::env::var(DISTANCE_ENV).map_or(true, |v| v != "0")
}

/// The userspace netem `netbed.sh impair` starts: the one built beside `bourse`.
fn netem_bin() -> PathBuf {
    Path::new(&bourse_bin()).with_file_name("bourse-netem")
}

fn netbed_cmd(args: &[&str]) -> std::process::Output {
    Command::new(netbed())
        .args(args)
        .env("BOURSE_NETEM", netem_bin())
        .output()
        .expect("run scripts/netbed.sh")
}

/// Runs a netbed step that must succeed; returns what it printed.
fn netbed_ok(args: &[&str]) -> String {
    let out = netbed_cmd(args);
    assert!(
        out.status.success(),
        "netbed.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deletes the bed's namespaces (and whatever still runs in them) however the test ends.
struct Bed(String);

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = netbed_cmd(&["down", &self.0]);
    }
}

#[test]
fn faults_between_namespaces_lose_nothing_acknowledged_and_the_feed_crosses_hosts() {
    if let Ok(prefix) = std::env::var(INNER_ENV) {
        return inner(&prefix);
    }
    let uid = Command::new("id").arg("-u").output();
    match uid {
        Ok(o) if String::from_utf8_lossy(&o.stdout).trim() == "0" => {}
        _ => {
            eprintln!("SKIPPED netns fault test: it needs root (ip netns, veth, bridges)");
            return;
        }
    }
    assert!(
        netem_bin().exists(),
        "no {} for the impairments: cargo build --release -p bourse-testkit --bin bourse-netem",
        netem_bin().display()
    );
    // The slow disk's cgroup, before anything starts (the small disks check their tools as
    // they are made).
    netbed_ok(&["iocgroup"]);
    let prefix = format!("bnf{}", std::process::id() % 100_000);
    let up = netbed_cmd(&["up", &prefix]);
    let bed = Bed(prefix.clone());
    if !up.status.success() {
        eprintln!(
            "SKIPPED netns fault test: scripts/netbed.sh up failed (ip netns, veth or bridges \
             unavailable): {}",
            String::from_utf8_lossy(&up.stderr).trim()
        );
        return;
    }
    // Two data centres for the whole run (before any process starts, so that every link of
    // the venue has its distance from its first packet).
    if distance_on() {
        netbed_ok(&["distance", &prefix]);
    }
    // The checker and the client run inside the client's namespace: this binary again.
    let status = Command::new("ip")
        .args(["netns", "exec", &format!("{prefix}-cl")])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(INNER_ENV, &prefix)
        .status()
        .expect("ip netns exec");
    drop(bed);
    assert!(status.success(), "the run inside the namespaces failed");
}

fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("cluster.toml");
    let mut f = std::fs::File::create(&path).unwrap();
    let fsync = std::env::var(FSYNC_ENV).unwrap_or_else(|_| "always".into());
    assert!(
        ["always", "batch", "never"].contains(&fsync.as_str()),
        "{FSYNC_ENV}={fsync}: always, batch or never"
    );
    writeln!(
        f,
        "cluster_id = 43\ndata_dir = {:?}\nfsync = {fsync:?}\nheartbeat_ms = 50\n\
         election_timeout_ms_min = 150\nelection_timeout_ms_max = 300\n\
         snapshot_every_entries = 500\nhash_checkpoint_every_entries = 50\n\
         hash_check_interval_ms = 200\norders_max = 8192\naccounts_max = 1024",
        dir.join("data")
    )
    .unwrap();
    writeln!(
        f,
        "[tls]\nca_path = {:?}\ncert_path = {:?}\nkey_path = {:?}",
        dir.join("venue-ca.crt"),
        dir.join("venue-node-{id}.crt"),
        dir.join("venue-node-{id}.key")
    )
    .unwrap();
    for id in 1..=3 {
        writeln!(
            f,
            "[[nodes]]\nid = {id}\naddr = \"10.201.0.{id}:{NODE_PORT}\"\nlisten = \"0.0.0.0:{NODE_PORT}\""
        )
        .unwrap();
    }
    writeln!(
        f,
        "[marketdata]\nbase_port = {FEED_BASE_PORT}\nfeed_a_host = \"{GROUP_A}\"\n\
         feed_b_host = \"{GROUP_B}\"\nmulticast_ttl = 1\nmulticast_loop = false\n\
         replay_listen = \"0.0.0.0\"\n\
         interfaces = {{ 1 = [\"10.201.0.1\", \"10.202.0.1\"], 2 = [\"10.201.0.2\", \"10.202.0.2\"], 3 = [\"10.201.0.3\", \"10.202.0.3\"] }}"
    )
    .unwrap();
    path
}

/// `bourse gateway`'s configuration on host gw: FIX clients on its network-1 address, one
/// replicated core (the three nodes, over mutual TLS with the gateway's certificate) trading
/// an instrument of its own (2, beside the direct client's 1) for two accounts whose orders
/// cross, so that nothing piles up on the book however long the run.
fn write_gateway_config(dir: &Path) -> PathBuf {
    let path = dir.join("gateway.toml");
    let nodes: Vec<String> = (1..=3)
        .map(|id| format!("\"10.201.0.{id}:{NODE_PORT}\""))
        .collect();
    let text = format!(
        r#"[gateway]
fix_listen = "{gw}:{GATEWAY_FIX_PORT}"
store_dir = {store:?}
connections_max = 16
throttle_msgs_per_s = 1000
logon_timeout_ms = 5000
core_queue_depth = 4096

[[instruments]]
instrument = 2
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 10
band_bps = 2000
reference_price = 24000

[[accounts]]
account = 101
firm = 1
cash = 1000000000000000
may_short = true

[[accounts]]
account = 102
firm = 1
cash = 1000000000000000
may_short = true

[[fix_sessions]]
client_comp_id = "ALPHA"
firm = 1
accounts = [101, 102]

[[cores]]
name = "equities"
instruments = [2]
nodes = [{nodes}]
client_id = 7
tls = {{ ca_path = {ca:?}, cert_path = {cert:?}, key_path = {key:?} }}
"#,
        gw = host_addr("gw"),
        store = dir.join("gateway"),
        nodes = nodes.join(", "),
        ca = dir.join("venue-ca.crt"),
        cert = dir.join("venue-gateway.crt"),
        key = dir.join("venue-gateway.key"),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Order k through the gateway: buys from account 101 and sells from 102 in turn, at one
/// price, so that each sell trades with the buy before it.
fn gateway_order(k: usize) -> OrderSpec {
    let buy = k.is_multiple_of(2);
    OrderSpec {
        account: if buy { 101 } else { 102 },
        buy,
        symbol: "SBER",
        qty: 10,
        price: "240.00",
    }
}

/// The venue's authority, a certificate per node (for its address on network 1) and one for
/// this test's client; returns the client's files.
fn make_certs(dir: &Path) -> bourse_cluster::TlsFiles {
    let venue = bourse_testkit::certs::Authority::new(dir, "venue");
    for id in 1..=3 {
        venue.issue(&format!("node-{id}"), &[format!("10.201.0.{id}").as_str()]);
    }
    // The gateway's, for its links to the nodes (a client of theirs, as this test is).
    venue.issue("gateway", &[]);
    let (cert_path, key_path) = venue.issue("client", &[]);
    bourse_cluster::TlsFiles {
        ca_path: venue.ca_path(),
        cert_path,
        key_path,
    }
}

/// A process on one of the bed's hosts; `netbed.sh run` execs `ip netns exec`, which execs
/// the command, so the child's pid is the command's.
fn spawn_on(prefix: &str, host: &str, args: &[&str], log: &Path) -> Child {
    spawn_on_with(prefix, host, args, log, false)
}

/// As [`spawn_on`]; with `stdout_too` what the command prints goes to `log` as well.
fn spawn_on_with(prefix: &str, host: &str, args: &[&str], log: &Path, stdout_too: bool) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let stdout = if stdout_too {
        Stdio::from(log.try_clone().unwrap())
    } else {
        Stdio::null()
    };
    Command::new(netbed())
        .args(["run", prefix, host, &bourse_bin()])
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn on the bed")
}

fn spawn_node(prefix: &str, dir: &Path, config: &Path, id: u64) -> Child {
    let config = config.to_str().unwrap();
    let host = format!("n{id}");
    spawn_on(
        prefix,
        &host,
        &["node", "--config", config, "--id", &id.to_string()],
        &dir.join(format!("node-{id}.log")),
    )
}

/// Sends signal `name` to `child` (through the shell's own `kill`, present wherever `sh` is).
fn signal(child: &Child, name: &str) {
    let ok = Command::new("sh")
        .args(["-c", &format!("kill -{name} {}", child.id())])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{name} {}", child.id());
}

/// Waits until `done` holds, within the hang guard.
fn wait_until(what: &str, dir: &Path, seed: u64, mut done: impl FnMut() -> bool) {
    let limit = Instant::now() + FAILOVER_LIMIT;
    while !done() {
        assert!(
            Instant::now() < limit,
            "{what}: not within {FAILOVER_LIMIT:?} (seed {seed}; logs in {})",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A resting order as both the replicas and the subscriber's file name it: (order id, side,
/// price, visible quantity).
type BookRow = (u64, String, i64, i64);

/// Every instrument's order-level book as the replicas hold it (`Query::Book`), checked equal
/// on all three.
async fn replica_books(
    addrs: &[(u64, SocketAddr)],
    seed: u64,
    dir: &Path,
) -> BTreeMap<u32, Vec<BookRow>> {
    use bourse_cluster::query::{Query, QueryAnswer};
    let timeout = Duration::from_secs(5);
    let ask = |addr: SocketAddr, query: Query| async move {
        bourse_cluster::client::node_query(addr, query, timeout)
            .await
            .unwrap_or_else(|e| panic!("{query:?} of {addr}: {e} (seed {seed})"))
    };
    let QueryAnswer::Phases(phases) = ask(addrs[0].1, Query::Phases).await else {
        panic!("node 1 answered another query than Phases");
    };
    assert_eq!(phases.instruments.len() as u32, phases.instruments_total);
    let mut per_node = Vec::new();
    for &(id, addr) in addrs {
        let mut books = BTreeMap::new();
        for i in &phases.instruments {
            let QueryAnswer::Book(b) = ask(
                addr,
                Query::Book {
                    instrument: i.instrument,
                },
            )
            .await
            else {
                panic!("node {id} answered another query than Book");
            };
            assert!(b.known && !b.orders_truncated, "node {id}: {b:?}");
            let rows = b
                .orders
                .iter()
                .map(|o| (o.order_id, side_name(o.side), o.price, o.qty_display))
                .collect();
            books.insert(i.instrument, rows);
        }
        per_node.push(books);
    }
    for (k, books) in per_node.iter().enumerate().skip(1) {
        assert_eq!(
            books,
            &per_node[0],
            "node {}'s books differ from node {}'s (seed {seed}; logs in {})",
            addrs[k].0,
            addrs[0].0,
            dir.display()
        );
    }
    per_node.swap_remove(0)
}

fn side_name(side: bourse_core::Side) -> String {
    serde_json::to_value(side)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// What the subscriber's `--books-out` file says, or why it does not match `want`.
fn subscriber_books_mismatch(path: &Path, want: &BTreeMap<u32, Vec<BookRow>>) -> Option<String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return Some(format!("{}: {e}", path.display())),
    };
    let v: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Some(format!("{}: {e}", path.display())),
    };
    let mut got = BTreeMap::new();
    for i in v["instruments"].as_array().into_iter().flatten() {
        let id = i["instrument"].as_u64().unwrap_or(u64::MAX) as u32;
        if i["live"] != serde_json::Value::Bool(true) {
            return Some(format!("instrument {id} is not live in the subscriber"));
        }
        let rows: Vec<BookRow> = match serde_json::from_value(i["orders"].clone()) {
            Ok(r) => r,
            Err(e) => return Some(format!("instrument {id}'s orders: {e}")),
        };
        got.insert(id, rows);
    }
    if got.keys().ne(want.keys()) {
        return Some(format!(
            "the subscriber knows instruments {:?}, the replicas {:?}",
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        ));
    }
    got.iter().zip(want).find_map(|((id, g), (_, w))| {
        (g != w).then(|| {
            let first = g.iter().zip(w).position(|(a, b)| a != b);
            format!(
                "instrument {id}: the subscriber holds {} orders, the replicas {}; first \
                 difference at {first:?}: {:?} against {:?}",
                g.len(),
                w.len(),
                first.and_then(|k| g.get(k)),
                first.and_then(|k| w.get(k))
            )
        })
    })
}

/// Waits, under a hang guard, until the subscriber's file holds `want`.
fn subscriber_books_equal(path: &Path, want: &BTreeMap<u32, Vec<BookRow>>, seed: u64, dir: &Path) {
    let limit = Instant::now() + FAILOVER_LIMIT * 2;
    loop {
        let Some(why) = subscriber_books_mismatch(path, want) else {
            return;
        };
        assert!(
            Instant::now() < limit,
            "the subscriber's books are not the replicas': {why} (seed {seed}; logs in {})",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the gateway says it serves FIX (it does once the core answered its bootstrap)
/// and the replicas agree; returns the commands in their histories then: the bootstrap's.
async fn gateway_bootstrapped(
    addrs: &[(u64, SocketAddr)],
    gateway_log: &Path,
    seed: u64,
    dir: &Path,
) -> u64 {
    let limit = Instant::now() + FAILOVER_LIMIT * 4;
    let late = |what: &str| {
        assert!(
            Instant::now() < limit,
            "{what} (seed {seed}; logs in {})",
            dir.display()
        )
    };
    let serving =
        || std::fs::read_to_string(gateway_log).is_ok_and(|l| l.contains("FIX 4.4 listening on"));
    while !serving() {
        late("the gateway does not serve FIX");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    loop {
        let all: Vec<_> = statuses(addrs).await.into_iter().flatten().collect();
        if all.len() == 3
            && all.windows(2).all(|w| {
                w[0].last_applied_index == w[1].last_applied_index
                    && w[0].engine_commands == w[1].engine_commands
            })
        {
            return all[0].engine_commands;
        }
        late("the replicas do not agree after the gateway's bootstrap");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every node answers and one leads: the group is whole again.
async fn whole(addrs: &[(u64, SocketAddr)], seed: u64, after: Fault) {
    let limit = Instant::now() + FAILOVER_LIMIT;
    loop {
        let s = statuses(addrs).await;
        if s.iter().all(|s| s.is_some()) && s.iter().flatten().any(|s| s.leader == Some(s.id)) {
            return;
        }
        assert!(
            Instant::now() < limit,
            "the group is not whole after healing {after:?} (seed {seed}): {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cuts `from`'s packets to each of `to` (one way).
fn cut(prefix: &str, from: &str, to: &[&str]) {
    for t in to {
        netbed_ok(&["cut", prefix, from, t]);
    }
}

fn others(of: u64) -> Vec<String> {
    ["n1", "n2", "n3", "cl", "sub", "gw"]
        .iter()
        .filter(|h| **h != format!("n{of}"))
        .map(|h| h.to_string())
        .collect()
}

struct Run<'a> {
    prefix: &'a str,
    dir: &'a Path,
    config: &'a Path,
    nodes: Vec<Child>,
    /// The impairments a fault added, as `netbed.sh unimpair` names them (FROM, TO).
    impaired: Vec<(String, String)>,
}

impl Run<'_> {
    fn node(&self, id: u64) -> &Child {
        &self.nodes[(id - 1) as usize]
    }

    /// Impairs `from`'s packets to each of `to` with `opts`, on top of the distance: the
    /// newest impairment of a link alone acts on it (netbed.sh), so each carries the
    /// distance's delay plus `extra_delay_us`. One impairment per distinct delay.
    fn impair(&mut self, from: &str, to: &[String], extra_delay_us: u64, opts: &[&str]) {
        let mut by_delay: Vec<(u64, Vec<&str>)> = Vec::new();
        for t in to {
            let d = distance_us(from, t) + extra_delay_us;
            match by_delay.iter_mut().find(|(dd, _)| *dd == d) {
                Some((_, hosts)) => hosts.push(t),
                None => by_delay.push((d, vec![t])),
            }
        }
        for (delay, hosts) in by_delay {
            // By address: `distance` named the same links by host, and netbed.sh keeps one
            // impairment per (FROM, TO) as written.
            let to = hosts
                .iter()
                .map(|h| host_addr(h))
                .collect::<Vec<_>>()
                .join(",");
            let delay = delay.to_string();
            let mut args = vec!["impair", self.prefix, from, &to, "--delay-us", &delay];
            args.extend_from_slice(opts);
            netbed_ok(&args);
            self.impaired.push((from.to_string(), to));
        }
    }

    /// Impairs every link of `host` both ways (to and from every other host), and what it
    /// sends to the multicast `groups`.
    fn impair_both_ways(&mut self, host: &str, groups: &[&str], opts: &[&str]) {
        let rest: Vec<String> = ["n1", "n2", "n3", "cl", "sub", "gw"]
            .iter()
            .filter(|h| **h != host)
            .map(|h| h.to_string())
            .collect();
        let mut out = rest.clone();
        out.extend(groups.iter().map(|g| g.to_string()));
        self.impair(host, &out, 0, opts);
        for r in &rest {
            self.impair(r, &[host.to_string()], 0, opts);
        }
    }

    /// Injects `fault` with `leader` leading; returns what undoes it.
    fn inject(&mut self, fault: Fault, leader: u64, follower: u64) -> Vec<(u64, &'static str)> {
        let p = self.prefix;
        let cut_off = |id: u64, both_ways: bool| {
            let host = format!("n{id}");
            let rest = others(id);
            let rest: Vec<&str> = rest.iter().map(|s| s.as_str()).collect();
            cut(p, &host, &rest);
            if both_ways {
                for r in &rest {
                    cut(p, r, &[&host]);
                }
            }
        };
        match fault {
            Fault::LeaderAlone => cut_off(leader, true),
            Fault::LeaderCannotSend => cut_off(leader, false),
            Fault::FollowerAlone => cut_off(follower, true),
            Fault::LeaderPaused => {
                signal(self.node(leader), "STOP");
                return vec![(leader, "CONT")];
            }
            Fault::FollowerPaused => {
                signal(self.node(follower), "STOP");
                return vec![(follower, "CONT")];
            }
            Fault::LeaderKilled => {
                let child = &mut self.nodes[(leader - 1) as usize];
                child.kill().unwrap();
                child.wait().unwrap();
                return vec![(leader, "restart")];
            }
            Fault::NoQuorum => {
                let followers: Vec<u64> = (1..=3).filter(|&id| id != leader).collect();
                for &f in &followers {
                    signal(self.node(f), "STOP");
                }
                return followers.into_iter().map(|f| (f, "CONT")).collect();
            }
            // Feed A loses packets too, feed B none: the subscriber's arbitration fills A's
            // holes from B across real multicast.
            Fault::LeaderLossy => self.impair_both_ways(
                &format!("n{leader}"),
                &[GROUP_A],
                &["--loss-pct", IMPAIR_PCT],
            ),
            // TCP links only: a TEE clone needs a route to its gateway, and the hosts have
            // none to a group.
            Fault::LeaderDuplicating => {
                self.impair_both_ways(&format!("n{leader}"), &[], &["--dup-pct", IMPAIR_PCT])
            }
            Fault::LeaderReordering => {
                let extra = REORDER_EXTRA_US.to_string();
                self.impair_both_ways(
                    &format!("n{leader}"),
                    &[GROUP_A, GROUP_B],
                    &["--reorder-pct", IMPAIR_PCT, "--reorder-extra-us", &extra],
                )
            }
            Fault::FollowerDelayed => {
                let (l, f) = (format!("n{leader}"), format!("n{follower}"));
                self.impair(&l, std::slice::from_ref(&f), SPIKE_DELAY_US, &[]);
                self.impair(&f, std::slice::from_ref(&l), SPIKE_DELAY_US, &[]);
            }
            // The probe's time for one write with fsync under the limit goes to the log.
            Fault::FollowerSlowDisk | Fault::LeaderSlowDisk => {
                let victim = disk_victim(fault, leader, follower).unwrap();
                let path = node_dir(self.dir, victim);
                print!(
                    "{}",
                    netbed_ok(&[
                        "slowdisk",
                        p,
                        &format!("n{victim}"),
                        &SLOW_DISK_WRITE_IOPS.to_string(),
                        path.to_str().unwrap(),
                    ])
                );
                return vec![(victim, "fastdisk")];
            }
            Fault::FollowerFullDisk | Fault::LeaderFullDisk => {
                let victim = disk_victim(fault, leader, follower).unwrap();
                print!("{}", netbed_ok(&["fulldisk", p, &format!("n{victim}")]));
                return vec![(victim, "emptydisk")];
            }
        }
        Vec::new()
    }

    fn heal(&mut self, undo: Vec<(u64, &'static str)>) {
        netbed_ok(&["heal-all", self.prefix]);
        for (from, to) in std::mem::take(&mut self.impaired) {
            // What the netem did (queued, dropped, duplicated …) goes to the run's log.
            print!("{}", netbed_ok(&["unimpair", self.prefix, &from, &to]));
        }
        for (id, what) in undo {
            let host = format!("n{id}");
            match what {
                "restart" => {
                    self.nodes[(id - 1) as usize] =
                        spawn_node(self.prefix, self.dir, self.config, id);
                }
                "fastdisk" => {
                    netbed_ok(&["fastdisk", self.prefix, &host]);
                }
                // The node stopped on its full disk (it runs on, refusing, until restarted):
                // restarted with room again, it keeps what reached its files and catches up.
                "emptydisk" => {
                    netbed_ok(&["emptydisk", self.prefix, &host]);
                    let child = &mut self.nodes[(id - 1) as usize];
                    let _ = child.kill();
                    child.wait().unwrap();
                    self.nodes[(id - 1) as usize] =
                        spawn_node(self.prefix, self.dir, self.config, id);
                }
                signal_name => signal(self.node(id), signal_name),
            }
        }
    }
}

/// The node whose disk `fault` slows or fills, if it is one of a disk.
fn disk_victim(fault: Fault, leader: u64, follower: u64) -> Option<u64> {
    match fault {
        Fault::FollowerSlowDisk | Fault::FollowerFullDisk => Some(follower),
        Fault::LeaderSlowDisk | Fault::LeaderFullDisk => Some(leader),
        _ => None,
    }
}

/// While a node's disk is slow or full, before the heal: on a full disk the node stops (its
/// process ends, or its status names ENOSPC: fail-stop; a leader's followers then elect one
/// of themselves), and either way the group goes on acknowledging.
fn disk_holds(
    run: &mut Run<'_>,
    rt: &tokio::runtime::Runtime,
    shared: &Shared,
    addrs: &[(u64, SocketAddr)],
    fault: Fault,
    node: u64,
    seed: u64,
) {
    let full = matches!(fault, Fault::FollowerFullDisk | Fault::LeaderFullDisk);
    if full {
        let addr = addrs[(node - 1) as usize].1;
        let limit = Instant::now() + FAILOVER_LIMIT;
        loop {
            if let Some(exit) = run.nodes[(node - 1) as usize].try_wait().unwrap() {
                println!("netns faults: {fault:?}: n{node} ended on its full disk ({exit})");
                break;
            }
            let status = rt.block_on(bourse_cluster::client::node_status(
                addr,
                WATCH_CALL_TIMEOUT * 3,
            ));
            if let Some(alarm) = status
                .ok()
                .and_then(|s| s.alarm)
                .filter(|a| a.contains(ENOSPC_TEXT))
            {
                println!("netns faults: {fault:?}: n{node} stopped and says: {alarm}");
                break;
            }
            assert!(
                Instant::now() < limit,
                "n{node} did not stop on its full disk (seed {seed}; logs in {})",
                run.dir.display()
            );
            std::thread::sleep(WATCH_EVERY);
        }
    }
    let from = shared.acked.load(Ordering::SeqCst);
    let limit = Instant::now() + FAILOVER_LIMIT;
    while shared.acked.load(Ordering::SeqCst) < from + ACKS_WITHOUT_THE_DISK {
        assert!(
            Instant::now() < limit,
            "the group did not acknowledge {ACKS_WITHOUT_THE_DISK} commands while n{node}'s \
             disk was {} ({fault:?}, seed {seed}; logs in {})",
            if full { "full" } else { "slow" },
            run.dir.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The highest commit index any node reports, and what `node` has applied.
fn commit_and_applied(
    rt: &tokio::runtime::Runtime,
    addrs: &[(u64, SocketAddr)],
    node: u64,
) -> (u64, Option<u64>) {
    let s = rt.block_on(statuses(addrs));
    let committed = s
        .iter()
        .flatten()
        .filter_map(|s| s.commit_index)
        .max()
        .unwrap_or(0);
    let applied = s[(node - 1) as usize]
        .as_ref()
        .map(|s| s.last_applied_index.unwrap_or(0));
    (committed, applied)
}

/// After the heal of a node's disk: waits until the node has applied everything the group
/// had committed at the heal (`committed`); returns how long that took from the heal.
fn catches_up(
    rt: &tokio::runtime::Runtime,
    addrs: &[(u64, SocketAddr)],
    node: u64,
    committed: u64,
    healed_at: Instant,
    seed: u64,
    after: Fault,
) -> Duration {
    let limit = Instant::now() + FAILOVER_LIMIT;
    loop {
        let (_, applied) = commit_and_applied(rt, addrs, node);
        if applied.is_some_and(|a| a >= committed) {
            return healed_at.elapsed();
        }
        assert!(
            Instant::now() < limit,
            "n{node} did not catch up to index {committed} after healing {after:?} (it \
             applied {applied:?}; seed {seed})"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What the status calls saw while a fault held, in µs from the fault.
#[derive(Default)]
struct Watched {
    /// A node other than the old leader named itself leader.
    new_leader_us: Option<u64>,
    /// The old leader reported that it leads without a quorum (it refuses new requests).
    quorum_lost_us: Option<u64>,
}

/// Asks every node for its status every [`WATCH_EVERY`] until `until`, all at once (a
/// paused node costs one call timeout, not a round's worth), and notes the first moment each
/// hop of [`Watched`] was seen.
async fn watch(
    addrs: &[(u64, SocketAddr)],
    old_leader: u64,
    fault_at: Instant,
    until: Instant,
) -> Watched {
    let mut seen = Watched::default();
    while Instant::now() < until {
        let mut asked = tokio::task::JoinSet::new();
        for &(id, addr) in addrs {
            asked.spawn(async move {
                (
                    id,
                    bourse_cluster::client::node_status_brief(addr, WATCH_CALL_TIMEOUT).await,
                )
            });
        }
        while let Some(answer) = asked.join_next().await {
            let Ok((id, Ok(status))) = answer else {
                continue;
            };
            let at = fault_at.elapsed().as_micros() as u64;
            if id != old_leader && status.leader == Some(id) && seen.new_leader_us.is_none() {
                seen.new_leader_us = Some(at);
            }
            if id == old_leader && status.quorum_lost_ms.is_some() && seen.quorum_lost_us.is_none()
            {
                seen.quorum_lost_us = Some(at);
            }
        }
        let next = (Instant::now() + WATCH_EVERY).min(until);
        tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
    }
    seen
}

/// Silences counted from faults and from heals, per kind of fault, and the hops the status
/// calls saw.
struct Silences {
    from_fault: Vec<Histogram<u64>>,
    from_heal: Vec<Histogram<u64>>,
    /// Through the gateway, as the FIX client saw it: the longest time without an
    /// acknowledgement from the fault and from the heal, and from the fault to the first
    /// no-quorum refusal.
    gateway_from_fault: Vec<Histogram<u64>>,
    gateway_from_heal: Vec<Histogram<u64>>,
    gateway_refused: Vec<Histogram<u64>>,
    new_leader: Vec<Histogram<u64>>,
    quorum_lost: Vec<Histogram<u64>>,
}

impl Silences {
    fn new() -> Silences {
        let h = || Histogram::<u64>::new_with_bounds(1, SILENCE_US_MAX, 3).unwrap();
        Silences {
            from_fault: FAULTS.iter().map(|_| h()).collect(),
            from_heal: FAULTS.iter().map(|_| h()).collect(),
            gateway_from_fault: FAULTS.iter().map(|_| h()).collect(),
            gateway_from_heal: FAULTS.iter().map(|_| h()).collect(),
            gateway_refused: FAULTS.iter().map(|_| h()).collect(),
            new_leader: FAULTS.iter().map(|_| h()).collect(),
            quorum_lost: FAULTS.iter().map(|_| h()).collect(),
        }
    }

    fn record(&mut self, fault: Fault, from_fault_us: u64, from_heal_us: u64, seen: &Watched) {
        let i = FAULTS.iter().position(|f| *f == fault).unwrap();
        let clamp = |us: u64| us.clamp(1, SILENCE_US_MAX);
        self.from_fault[i].record(clamp(from_fault_us)).unwrap();
        self.from_heal[i].record(clamp(from_heal_us)).unwrap();
        if let Some(us) = seen.new_leader_us {
            self.new_leader[i].record(clamp(us)).unwrap();
        }
        if let Some(us) = seen.quorum_lost_us {
            self.quorum_lost[i].record(clamp(us)).unwrap();
        }
    }

    /// What the FIX client saw through the gateway around one fault (called at the end of
    /// the heal's window, `end_us`).
    fn record_gateway(
        &mut self,
        fault: Fault,
        fix: &FixOrders,
        fault_us: u64,
        heal_us: u64,
        end_us: u64,
    ) {
        let i = FAULTS.iter().position(|f| *f == fault).unwrap();
        let clamp = |us: u64| us.clamp(1, SILENCE_US_MAX);
        self.gateway_from_fault[i]
            .record(clamp(fix.longest_silence_us(fault_us, heal_us)))
            .unwrap();
        self.gateway_from_heal[i]
            .record(clamp(fix.longest_silence_us(heal_us, end_us)))
            .unwrap();
        if let Some(at) = fix.first_answer_after(fault_us, &|o| *o == Outcome::NoQuorum) {
            if at < heal_us {
                self.gateway_refused[i]
                    .record(clamp(at - fault_us))
                    .unwrap();
            }
        }
    }

    fn print(&self) {
        for (i, f) in FAULTS.iter().enumerate() {
            if self.from_fault[i].is_empty() {
                continue;
            }
            println!(
                "netns faults: {f:?}: no acknowledgement for, from the fault: {}; from the heal: {}",
                summary(&self.from_fault[i]),
                summary(&self.from_heal[i])
            );
            println!(
                "netns faults: {f:?}: through the gateway, no acknowledgement for, from the \
                 fault: {}; from the heal: {}",
                summary(&self.gateway_from_fault[i]),
                summary(&self.gateway_from_heal[i])
            );
            if !self.gateway_refused[i].is_empty() {
                println!(
                    "netns faults: {f:?}: through the gateway, the no-quorum refusal reached the \
                     client, from the fault: {}",
                    summary(&self.gateway_refused[i])
                );
            }
            if !self.new_leader[i].is_empty() {
                println!(
                    "netns faults: {f:?}: another node named itself leader, from the fault: {}",
                    summary(&self.new_leader[i])
                );
            }
            if !self.quorum_lost[i].is_empty() {
                println!(
                    "netns faults: {f:?}: the leader reported no quorum, from the fault: {}",
                    summary(&self.quorum_lost[i])
                );
            }
        }
    }
}

/// Reads "packets A <n> B <m>" from the subscriber's final line.
fn feed_counts(log: &str) -> Option<(u64, u64)> {
    let line = log.lines().rev().find(|l| l.starts_with("packets A "))?;
    let mut words = line.split_whitespace();
    let a = words.nth(2)?.parse().ok()?;
    let b = words.nth(1)?.parse().ok()?;
    Some((a, b))
}

fn inner(prefix: &str) {
    let faults: u64 = std::env::var("BOURSE_NETBED_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let seed: u64 = std::env::var("BOURSE_NETBED_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let mut rng = Rng::new(seed);
    let kinds: Vec<Fault> = match std::env::var(KINDS_ENV) {
        Ok(names) => names
            .split(',')
            .map(|name| {
                *FAULTS
                    .iter()
                    .find(|k| format!("{k:?}") == name.trim())
                    .unwrap_or_else(|| panic!("{KINDS_ENV}: no kind of fault {name:?}"))
            })
            .collect(),
        Err(_) => FAULTS.to_vec(),
    };
    // The CI run: every kind once, in a seeded order; a long run: kinds drawn at random.
    let schedule: Vec<Fault> = if faults == 0 {
        let mut s = kinds.clone();
        for i in (1..s.len()).rev() {
            s.swap(i, rng.below(i as u64 + 1) as usize);
        }
        s
    } else {
        (0..faults)
            .map(|_| kinds[rng.below(kinds.len() as u64) as usize])
            .collect()
    };
    println!(
        "netns faults: {} faults, BOURSE_NETBED_SEED={seed}, bed {prefix}",
        schedule.len()
    );
    let started = Instant::now();
    // Kept when the run fails (the messages name it for its logs) or when `BOURSE_NET_DEBUG`
    // is set (the nodes' debug lines are what such a run is for); removed at the end of any
    // other run that passes.
    let dir = tempfile::tempdir().unwrap().keep();
    if std::env::var_os("BOURSE_NET_DEBUG").is_some() {
        println!(
            "netns faults: the bed's directory (kept): {}",
            dir.display()
        );
    }
    let client_tls = make_certs(&dir);
    let config = write_config(&dir);
    let addrs: Vec<(u64, SocketAddr)> = (1..=3)
        .map(|id| {
            let a = format!("10.201.0.{id}:{NODE_PORT}").parse().unwrap();
            (id, a)
        })
        .collect();
    let node_addrs: Vec<SocketAddr> = addrs.iter().map(|(_, a)| *a).collect();
    bourse_cluster::transport::configure_client(&node_addrs, Some(&client_tls)).unwrap();
    // Each node's data directory on a small disk of its own, mounted here (in this process's
    // mount namespace, which the nodes started from here inherit), for the full disk.
    for id in 1..=3 {
        let image = if Path::new(IMAGE_DIR).is_dir() {
            format!("{IMAGE_DIR}/{prefix}-n{id}.img")
        } else {
            format!("{}.img", node_dir(&dir, id).display())
        };
        netbed_ok(&[
            "smalldisk",
            prefix,
            &format!("n{id}"),
            node_dir(&dir, id).to_str().unwrap(),
            &SMALL_DISK_MIB.to_string(),
            &image,
        ]);
    }
    let nodes = (1..=3)
        .map(|id| spawn_node(prefix, &dir, &config, id))
        .collect();
    let mut run = Run {
        prefix,
        dir: &dir,
        config: &config,
        nodes,
        impaired: Vec::new(),
    };
    let sub_log = dir.join("subscriber.log");
    let sub_books = dir.join("subscriber-books.json");
    let port = FEED_BASE_PORT.to_string();
    let mut subscriber = spawn_on(
        prefix,
        "sub",
        &[
            "md",
            "listen",
            "--base-port",
            &port,
            "--feed-a-host",
            GROUP_A,
            "--feed-b-host",
            GROUP_B,
            "--interfaces",
            "10.201.0.20,10.202.0.20",
            "--count",
            "0",
            "--seconds",
            "36000",
            "--books-out",
            sub_books.to_str().unwrap(),
        ],
        &sub_log,
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The gateway on its own host, bootstrapped before the direct client sends anything, so
    // that the commands its bootstrap added are counted once.
    let gateway_config = write_gateway_config(&dir);
    let gateway_log = dir.join("gateway.log");
    let mut gateway = spawn_on_with(
        prefix,
        "gw",
        &["gateway", "--config", gateway_config.to_str().unwrap()],
        &gateway_log,
        true,
    );
    let fix_addr: SocketAddr = format!("{}:{GATEWAY_FIX_PORT}", host_addr("gw"))
        .parse()
        .unwrap();
    let bootstrap = rt.block_on(gateway_bootstrapped(&addrs, &gateway_log, seed, &dir));
    let shared = Shared::new();
    let client = client_thread(shared.clone(), addrs.clone(), seed);
    // The quiet round trip, before any fault: the gaps between consecutive acknowledgements
    // with one request in flight. A hang guard on progress, not on a rate: a loaded machine
    // may be slow, not stuck.
    let (mut seen, mut limit) = (0, Instant::now() + FAILOVER_LIMIT * 4);
    while shared.acked.load(Ordering::SeqCst) < QUIET_ACKS as u64 + 1 {
        let now = shared.acked.load(Ordering::SeqCst);
        if now > seen {
            (seen, limit) = (now, Instant::now() + FAILOVER_LIMIT);
        }
        assert!(
            Instant::now() < limit,
            "acknowledgements stopped at {seen} of the {QUIET_ACKS} before the first fault \
             (seed {seed}; logs in {})",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let quiet_leader = rt.block_on(leader(&addrs, seed));
    let mut quiet = Histogram::<u64>::new_with_bounds(1, SILENCE_US_MAX, 3).unwrap();
    for w in shared.ack_times_us.lock().unwrap()[..=QUIET_ACKS].windows(2) {
        quiet
            .record((w[1] - w[0]).clamp(1, SILENCE_US_MAX))
            .unwrap();
    }
    println!(
        "netns faults: quiet acknowledgement interval (one request in flight), distance {}, \
         leader n{quiet_leader}: p50 {} µs, p99 {} µs, max {} µs (n = {})",
        if distance_on() { "on" } else { "off" },
        quiet.value_at_quantile(0.5),
        quiet.value_at_quantile(0.99),
        quiet.max(),
        quiet.len()
    );
    // The FIX client through the gateway, on the same clock as the direct client.
    let fix = FixOrders::new(shared.epoch);
    let fix_client = fix_client_thread(fix.clone(), fix_addr, "ALPHA", FIX_PACE, gateway_order);
    wait_until(
        "the first order acknowledged through the gateway",
        &dir,
        seed,
        || {
            fix.first_answer_after(0, &|o| *o == Outcome::Applied)
                .is_some()
        },
    );
    let mut silences = Silences::new();
    for (k, &fault) in schedule.iter().enumerate() {
        // The client must be acknowledging before a fault, so its silence is the fault's.
        let before = shared.acked.load(Ordering::SeqCst);
        let limit = Instant::now() + FAILOVER_LIMIT;
        while shared.acked.load(Ordering::SeqCst) < before + 5 {
            assert!(
                Instant::now() < limit,
                "no acknowledgements before fault {k} (seed {seed}; logs in {})",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let leader = rt.block_on(leader(&addrs, seed));
        let follower = [1, 2, 3]
            .into_iter()
            .filter(|&id| id != leader)
            .nth(rng.below(2) as usize)
            .unwrap();
        let hold = Duration::from_millis(500 + rng.below(1_500));
        let fault_us = shared.now_us();
        let fault_at = Instant::now();
        // With BOURSE_NET_DEBUG, on the nodes' clock: their lines can be read against it.
        bourse_cluster::net::debug_line(format_args!(
            "netns faults: fault {k}: {fault:?}, leader n{leader}, follower n{follower}, \
             held {} ms",
            hold.as_millis()
        ));
        let undo = run.inject(fault, leader, follower);
        let seen = rt.block_on(watch(&addrs, leader, fault_at, fault_at + hold));
        // A node's disk: what the group had committed at the heal, which the node must reach
        // after it.
        let victim = disk_victim(fault, leader, follower);
        let at_heal = victim.map(|victim| {
            disk_holds(&mut run, &rt, &shared, &addrs, fault, victim, seed);
            (victim, commit_and_applied(&rt, &addrs, victim))
        });
        let acked_at_heal = shared.acked.load(Ordering::SeqCst);
        let healed_at = Instant::now();
        run.heal(undo);
        bourse_cluster::net::debug_line(format_args!("netns faults: fault {k} healed"));
        // The heal is whole once the last link is: a host's impaired links heal one by one.
        let heal_us = shared.now_us();
        let limit = Instant::now() + FAILOVER_LIMIT;
        while shared.acked.load(Ordering::SeqCst) == acked_at_heal {
            assert!(
                Instant::now() < limit,
                "no acknowledgement after healing {fault:?} (fault {k}, leader {leader}, \
                 follower {follower}, seed {seed}; logs in {})",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Orders through the gateway are acknowledged again too.
        wait_until(
            &format!(
                "an order through the gateway acknowledged after healing {fault:?} (fault {k})"
            ),
            &dir,
            seed,
            || {
                fix.first_answer_after(heal_us, &|o| *o == Outcome::Applied)
                    .is_some()
            },
        );
        if let Some((victim, (committed, applied))) = at_heal {
            let took = catches_up(&rt, &addrs, victim, committed, healed_at, seed, fault);
            println!(
                "netns faults: {fault:?}: n{victim} had applied {} of the group's {committed} \
                 committed entries at the heal, and all of them {} ms after it",
                applied.map_or("(no answer)".to_string(), |a| a.to_string()),
                took.as_millis()
            );
        }
        std::thread::sleep(AFTER_HEAL);
        let end_us = shared.now_us();
        silences.record(
            fault,
            shared.longest_silence_us(fault_us, heal_us),
            shared.longest_silence_us(heal_us, end_us),
            &seen,
        );
        silences.record_gateway(fault, &fix, fault_us, heal_us, end_us);
        rt.block_on(whole(&addrs, seed, fault));
    }
    pause_client(&shared, seed);
    fix.sending.store(false, Ordering::SeqCst);
    wait_until(
        "every order through the gateway answered",
        &dir,
        seed,
        || fix.all_answered(),
    );
    fix.stop.store(true, Ordering::SeqCst);
    fix_client.join().expect("the FIX client");
    let refused = fix.count(&|o| matches!(o, Outcome::Refused(_)));
    assert_eq!(
        refused, 0,
        "orders through the gateway refused for another reason than no quorum (seed {seed})"
    );
    let acked = shared.acked.load(Ordering::SeqCst);
    let through_gateway = fix.applied();
    println!(
        "netns faults: to check: the gateway's bootstrap {bootstrap} commands, the cluster \
         client's {acked}, {through_gateway} orders through the gateway ({} sent, {} refused for \
         no quorum)",
        fix.sent(),
        fix.count(&|o| *o == Outcome::NoQuorum)
    );
    let finals = rt.block_on(check_replicas(
        &addrs,
        bootstrap + acked + through_gateway,
        seed,
        &dir,
    ));
    // Nothing more is sent: the subscriber on its own host must come to hold exactly the
    // books every replica holds, whatever it lost and recovered on the way.
    let books = rt.block_on(replica_books(&addrs, seed, &dir));
    let orders: usize = books.values().map(Vec::len).sum();
    subscriber_books_equal(&sub_books, &books, seed, &dir);
    println!(
        "netns faults: the subscriber's books equal the replicas' ({} instruments, {orders} \
         resting orders)",
        books.len()
    );
    shared.stop.store(true, Ordering::SeqCst);
    let (duplicates, timeouts) = client.join().expect("client thread");
    signal(&subscriber, "INT");
    let _ = subscriber.wait();
    signal(&gateway, "INT");
    let _ = gateway.wait();
    for mut c in run.nodes {
        let _ = c.kill();
        let _ = c.wait();
    }
    // The bed's teardown would do this too; here a disk that cannot be removed fails the run.
    for id in 1..=3 {
        netbed_ok(&["nodisk", prefix, &format!("n{id}")]);
    }
    let log = std::fs::read_to_string(&sub_log).unwrap_or_default();
    let counts = feed_counts(&log);
    println!(
        "netns faults: {} faults, {acked} commands acknowledged ({duplicates} answered from the \
         idempotency table, {timeouts} client timeouts), final state hash {:016x}, subscriber \
         packets (A, B) {counts:?}, {:.1} s, seed {seed}",
        schedule.len(),
        finals[0].state_hash,
        started.elapsed().as_secs_f64()
    );
    silences.print();
    // The subscriber's own account (duplicates, gaps and how they were filled), for the log.
    if let Some(line) = log.lines().rev().find(|l| l.starts_with("packets A ")) {
        println!("netns faults: subscriber: {line}");
    }
    assert!(acked > 0);
    let (a, b) = counts.unwrap_or_else(|| panic!("no counts from the subscriber: {log}"));
    assert!(
        a > 0 && b > 0,
        "the subscriber in its own namespace read feed A {a} and feed B {b} packets: {log}"
    );
    if std::env::var_os("BOURSE_NET_DEBUG").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
