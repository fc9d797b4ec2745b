//! Storage faults at the level of a node in a three-node group (the journal crate tests each
//! fault on the journal alone; these test what the group does about it):
//!
//! - a node whose journal hits ENOSPC or EIO on a write, or EIO on an fsync, stops
//!   acknowledging (fail-stop), says why (its status and a client's error name the fault), and
//!   the other two go on; after a restart on a healthy disk it catches up;
//! - a node whose committed journal prefix is damaged (flipped bit, zeroed sector), whose
//!   directory holds a file that is not one of its segments, or whose journal is another
//!   cluster's or another node's, refuses to start with a message naming the file (and the byte
//!   offset where there is one); after its directory is wiped it catches up from its peers, by
//!   snapshot when the leader has purged the log it lacks;
//! - a torn (truncated) tail is cut and the node catches up from its peers;
//! - a restart of all three nodes from their journals and snapshots gives the same state hash.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bourse_cluster::net::NodeStatus;
use bourse_cluster::{Client, ClusterConfig, FsyncSetting, Node, NodeId};
use bourse_core::Command;
use bourse_engine::workload::Flow;
use bourse_journal::{Faults, FaultyStorage, RealStorage, EIO, ENOSPC};
use common::{addrs, converged, free_ports, small_flow};

const DEADLINE: Duration = Duration::from_secs(15);
const CONVERGE_LIMIT: Duration = Duration::from_secs(30);

fn config(dir: &Path, fsync: FsyncSetting) -> ClusterConfig {
    let mut c = ClusterConfig::local(21, dir.to_path_buf(), free_ports());
    c.fsync = fsync;
    c.snapshot_every_entries = 100;
    c.hash_checkpoint_every_entries = 8;
    c.hash_check_interval_ms = 30;
    c.orders_max = 4096;
    c.accounts_max = 1024;
    c
}

/// Starts every node, each on its own fault-injecting storage (all disarmed).
async fn start_faulty(config: &ClusterConfig) -> (Vec<Node>, Vec<Arc<Faults>>) {
    let mut nodes = Vec::new();
    let mut faults = Vec::new();
    for n in &config.nodes {
        let storage = FaultyStorage::new(Arc::new(RealStorage));
        faults.push(storage.faults());
        nodes.push(
            Node::start_with_storage(config, n.id, Arc::new(storage))
                .await
                .expect("node starts"),
        );
    }
    (nodes, faults)
}

/// Starts a node again after a shutdown. Shutdown releases the node's port asynchronously
/// (its accept task is aborted, not joined), so a bind error is retried for a while; any
/// other error fails the test with its message.
async fn restart(config: &ClusterConfig, id: NodeId) -> Node {
    let started = std::time::Instant::now();
    loop {
        match Node::start(config, id).await {
            Ok(node) => return node,
            Err(e) if e.contains("bind") && started.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("node {id} does not start again: {e}"),
        }
    }
}

async fn start_all(config: &ClusterConfig) -> Vec<Node> {
    let mut nodes = Vec::new();
    for n in &config.nodes {
        nodes.push(restart(config, n.id).await);
    }
    nodes
}

/// Shuts node `id` down and takes it out of `nodes`; returns where it was.
async fn stop(nodes: &mut Vec<Node>, id: NodeId) -> usize {
    let v = nodes.iter().position(|n| n.id() == id).unwrap();
    nodes.remove(v).shutdown().await;
    v
}

async fn stop_all(nodes: Vec<Node>) {
    for n in nodes {
        n.shutdown().await;
    }
}

/// Waits until the running nodes agree, checks that each applied every acknowledged command
/// exactly once, and returns their statuses.
async fn settled(nodes: &[Node], acked: u64) -> Vec<NodeStatus> {
    let refs: Vec<&Node> = nodes.iter().collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    assert_agree(&statuses, acked);
    statuses
}

/// The driver of the tests' order flow: one client, one request at a time.
struct Driver {
    client: Client,
    flow: Flow,
    ts_ns: u64,
    acked: u64,
}

impl Driver {
    fn new(config: &ClusterConfig, seed: u64) -> Driver {
        Driver {
            client: Client::new(addrs(config), 1, 1),
            flow: Flow::new(small_flow(seed)),
            ts_ns: 1,
            acked: 0,
        }
    }

    async fn setup(&mut self) {
        for body in self.flow.setup() {
            self.submit(Command::new(0, body)).await;
        }
    }

    async fn run(&mut self, count: usize) {
        for _ in 0..count {
            let command = Command::new(self.ts_ns, self.flow.next_command());
            self.ts_ns += 1;
            self.submit(command).await;
        }
    }

    async fn submit(&mut self, command: Command) {
        let (_, events) = self
            .client
            .submit_for_events(&command, DEADLINE)
            .await
            .unwrap_or_else(|e| panic!("command {} not acknowledged: {e}", self.acked));
        self.flow.observe(&events);
        self.acked += 1;
    }
}

async fn leader_of(nodes: &[Node]) -> NodeId {
    let started = std::time::Instant::now();
    loop {
        for n in nodes {
            let s = n.status().await;
            if s.leader == Some(s.id) {
                return s.id;
            }
        }
        assert!(started.elapsed() < DEADLINE, "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_agree(statuses: &[NodeStatus], acked: u64) {
    for s in statuses {
        assert!(s.alarm.is_none(), "node {}: {:?}", s.id, s.alarm);
        assert_eq!(
            s.engine_commands, acked,
            "node {} applied each command once",
            s.id
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    WriteFails(i32),
    FsyncFails(i32),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Leader,
    Follower,
}

/// Arms `fault` on the node in `role`, then checks fail-stop, the reason, that the other two
/// go on, and that the node catches up after a restart on a healthy disk.
async fn fail_stop(fault: Fault, role: Role, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Always);
    let (mut nodes, faults) = start_faulty(&config).await;
    let mut driver = Driver::new(&config, seed);
    driver.setup().await;
    driver.run(30).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    converged(&refs, CONVERGE_LIMIT).await;

    let leader = leader_of(&nodes).await;
    let victim = match role {
        Role::Leader => leader,
        Role::Follower => nodes
            .iter()
            .map(|n| n.id())
            .find(|&id| id != leader)
            .unwrap(),
    };
    let v = nodes.iter().position(|n| n.id() == victim).unwrap();
    let errno = match fault {
        Fault::WriteFails(errno) => {
            faults[v].fail_writes_after(0, errno);
            errno
        }
        Fault::FsyncFails(errno) => {
            faults[v].fail_syncs(errno);
            errno
        }
    };
    let os_text = std::io::Error::from_raw_os_error(errno).to_string();
    // The other two acknowledge everything (a new leader is elected if the victim led).
    driver.run(40).await;

    // The victim stopped and says why.
    let stopped = nodes[v].status().await;
    let reason = stopped
        .alarm
        .clone()
        .unwrap_or_else(|| panic!("node {victim} gives no reason: {stopped:#?}"));
    assert!(
        reason.contains(&os_text) && reason.contains("journal"),
        "node {victim}'s reason does not name the fault ({os_text}): {reason}"
    );
    // A client that can reach only the victim is refused, with the fault as the reason.
    let mut lone = Client::new(vec![(victim, config.addr_of(victim).unwrap())], 99, 1);
    let refused = lone
        .submit(
            &Command::new(0, bourse_core::CommandBody::EndOfDay),
            Duration::from_millis(600),
        )
        .await;
    match refused {
        Ok(ack) => panic!("the stopped node {victim} acknowledged: {ack:?}"),
        Err(e) => assert!(
            e.to_string().contains(&os_text) || e.to_string().contains("not the leader"),
            "unexpected refusal from node {victim}: {e}"
        ),
    }
    let healthy: Vec<&Node> = nodes.iter().filter(|n| n.id() != victim).collect();
    let statuses = converged(&healthy, CONVERGE_LIMIT).await;
    assert_agree(&statuses, driver.acked);
    let victim_status = nodes[v].status().await;
    assert!(
        victim_status.last_applied_index < statuses[0].last_applied_index,
        "the stopped node kept applying: {victim_status:#?}"
    );

    // Restarted on a healthy disk, it recovers what reached its files and catches up.
    let v = stop(&mut nodes, victim).await;
    nodes.insert(v, restart(&config, victim).await);
    driver.run(10).await;
    settled(&nodes, driver.acked).await;
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_on_the_leader_s_journal_write_stops_it_and_the_group_goes_on() {
    fail_stop(Fault::WriteFails(ENOSPC), Role::Leader, 31).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eio_on_a_follower_s_journal_write_stops_it_and_the_group_goes_on() {
    fail_stop(Fault::WriteFails(EIO), Role::Follower, 32).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eio_on_the_leader_s_journal_fsync_stops_it_and_the_group_goes_on() {
    fail_stop(Fault::FsyncFails(EIO), Role::Leader, 33).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_on_a_follower_s_journal_fsync_stops_it_and_the_group_goes_on() {
    fail_stop(Fault::FsyncFails(ENOSPC), Role::Follower, 34).await;
}

fn journal_dir(config: &ClusterConfig, id: NodeId) -> PathBuf {
    config.node_dir(id).join("journal")
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    files.sort();
    files
}

/// The file and byte offset of the record at `index`, found with the operator's inspect.
fn locate(dir: &Path, index: u64) -> (PathBuf, u64) {
    let info = bourse_journal::inspect(dir, index..=index)
        .expect("inspect")
        .next()
        .expect("record present")
        .expect("record valid");
    (info.file, info.offset)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// Replaces `dir` with a copy of `backup`.
fn restore(backup: &Path, dir: &Path) {
    std::fs::remove_dir_all(dir).unwrap();
    copy_dir(backup, dir);
}

async fn refused(config: &ClusterConfig, id: NodeId) -> String {
    let started = std::time::Instant::now();
    loop {
        match Node::start(config, id).await {
            Ok(node) => {
                node.shutdown().await;
                panic!("node {id} started on a damaged or foreign journal")
            }
            // The port of the node's previous run may still be held (see `restart`).
            Err(e) if e.contains("bind") && started.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return e,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_in_the_committed_prefix_or_a_foreign_journal_is_refused_and_a_wiped_node_catches_up_by_snapshot(
) {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Always);
    let mut nodes = start_all(&config).await;
    let mut driver = Driver::new(&config, 41);
    driver.setup().await;
    driver.run(150).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    converged(&refs, CONVERGE_LIMIT).await;
    // Take node 3 down (a follower or the leader, whichever it is) and keep its files.
    let victim: NodeId = 3;
    stop(&mut nodes, victim).await;
    let node_dir = config.node_dir(victim);
    let jdir = journal_dir(&config, victim);
    let backup = dir.path().join("backup-node-3");
    copy_dir(&node_dir, &backup);
    let last = bourse_journal::verify(&jdir).unwrap().last.unwrap().index;
    assert!(last > 100, "the journal holds {last} entries");

    // A flipped bit in a record in the middle of the committed log.
    let (file, offset) = locate(&jdir, last / 2);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[offset as usize + 40] ^= 0x10;
    std::fs::write(&file, bytes).unwrap();
    let error = refused(&config, victim).await;
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        error.contains(&name) && error.contains("offset") && error.contains("damaged"),
        "a flipped bit: {error}"
    );
    restore(&backup, &node_dir);

    // A zeroed 512-byte sector a third of the way in.
    let (file, offset) = locate(&jdir, last / 3);
    let sector = (offset / 512 + 1) * 512;
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[sector as usize..sector as usize + 512].fill(0);
    std::fs::write(&file, bytes).unwrap();
    let error = refused(&config, victim).await;
    assert!(
        error.contains(&name) && error.contains("offset"),
        "a zeroed sector: {error}"
    );
    restore(&backup, &node_dir);

    // A file named like a segment that is not one.
    let stray = jdir.join(bourse_journal::segment_file_name(last + 1_000_000));
    std::fs::write(
        &stray,
        b"not a segment at all, just some text a person left here",
    )
    .unwrap();
    let error = refused(&config, victim).await;
    assert!(
        error.contains(&stray.file_name().unwrap().to_string_lossy().to_string()),
        "a stray segment file: {error}"
    );
    restore(&backup, &node_dir);

    // Node 1's journal in node 3's place: another node's.
    std::fs::remove_dir_all(&jdir).unwrap();
    copy_dir(&journal_dir(&config, 1), &jdir);
    let error = refused(&config, victim).await;
    assert!(
        error.contains("another node's journal"),
        "node 1's journal: {error}"
    );
    restore(&backup, &node_dir);

    // Another cluster's journal (a one-node cluster of id 22, same node id).
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = config.clone();
    other.cluster_id = 22;
    other.data_dir = other_dir.path().to_path_buf();
    Node::start(&other, victim).await.unwrap().shutdown().await;
    std::fs::remove_dir_all(&jdir).unwrap();
    copy_dir(&journal_dir(&other, victim), &jdir);
    let error = refused(&config, victim).await;
    assert!(
        error.contains("another cluster's journal"),
        "another cluster's journal: {error}"
    );

    // While node 3 is out, the group goes on, far enough that the leader purges the log
    // node 3 lacks (entries below its snapshot minus what it keeps).
    let before = nodes[0].status().await.last_log_index.unwrap();
    while nodes[0].status().await.last_log_index.unwrap()
        < before + config.log_kept_below_snapshot_entries + 2 * config.snapshot_every_entries
    {
        driver.run(50).await;
    }
    // Wiped, node 3 starts pristine and catches up: its log now starts after a snapshot.
    std::fs::remove_dir_all(&node_dir).unwrap();
    nodes.push(restart(&config, victim).await);
    driver.run(10).await;
    let hash = settled(&nodes, driver.acked).await[0].state_hash;
    stop_all(nodes).await;
    let report = bourse_journal::verify(&jdir).unwrap();
    assert!(
        report.purged.is_some() || report.first_index.is_some_and(|i| i > before),
        "node 3 caught up by replaying the whole log, not from a snapshot: {report:?}"
    );

    // And a restart of all three from journals and snapshots gives the same hash.
    let nodes = start_all(&config).await;
    let statuses = settled(&nodes, driver.acked).await;
    assert_eq!(statuses[0].state_hash, hash, "restart of all nodes");
    stop_all(nodes).await;
}

/// Under `fsync = never` a crash of the machine may take a node's last records, committed
/// or not, with it: the node cuts the torn record, says what it lost, and catches up from its
/// peers. When the victim is the leader this is the regression test of a divergence: openraft
/// restarted a node whose saved vote was its own committed one as leader of the same term at
/// once, and it numbered new entries after its shortened log, reusing the log id of the lost
/// entry, which the followers still held and took for the same one (see
/// `LogStore::read_vote`). The replicas then applied different commands at the same index.
async fn torn_tail(role: Role, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Never);
    let mut nodes = start_all(&config).await;
    let mut driver = Driver::new(&config, seed);
    driver.setup().await;
    driver.run(60).await;
    settled(&nodes, driver.acked).await;
    let leader = leader_of(&nodes).await;
    let victim = match role {
        Role::Leader => leader,
        Role::Follower => nodes
            .iter()
            .map(|n| n.id())
            .find(|&id| id != leader)
            .unwrap(),
    };
    let v = stop(&mut nodes, victim).await;
    // Cut the last segment in the middle of its last record, as a crash mid-write leaves it.
    let jdir = journal_dir(&config, victim);
    let last = bourse_journal::verify(&jdir).unwrap().last.unwrap().index;
    let (file, offset) = locate(&jdir, last);
    assert_eq!(Some(&file), segments(&jdir).last());
    let len = std::fs::metadata(&file).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(offset + (len - offset) / 2)
        .unwrap();
    nodes.insert(v, restart(&config, victim).await);
    driver.run(20).await;
    settled(&nodes, driver.acked).await;
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_is_cut_and_the_node_catches_up_from_its_peers() {
    torn_tail(Role::Follower, 51).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_lost_its_torn_tail_restarts_as_a_follower_and_the_replicas_agree() {
    torn_tail(Role::Leader, 52).await;
}

/// Under `fsync = always` a record is counted as appended only once it is on disk, so a
/// committed record cannot be torn by a crash: a log that ends before the node's commit point
/// (a segment cut at a record boundary, a missing last segment) is damage, refused with the
/// files named; a torn record past the commit point (a crash mid-append) is cut as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_ending_inside_the_committed_prefix_is_refused_and_a_torn_uncommitted_record_is_cut()
{
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Always);
    let mut nodes = start_all(&config).await;
    let mut driver = Driver::new(&config, 71);
    driver.setup().await;
    driver.run(40).await;
    let applied = settled(&nodes, driver.acked).await[0]
        .last_applied_index
        .unwrap();
    let victim: NodeId = 1;
    let v = stop(&mut nodes, victim).await;
    let node_dir = config.node_dir(victim);
    let jdir = journal_dir(&config, victim);
    let backup = dir.path().join("backup-node-1");
    copy_dir(&node_dir, &backup);
    let last = bourse_journal::verify(&jdir).unwrap().last.unwrap().index;
    let commit = jdir.join(bourse_journal::COMMIT_FILE_NAME);
    assert!(commit.exists(), "the node recorded its commit point");

    // The last segment cut exactly before a record a few entries back: every record left is
    // whole, so only the commit point shows that committed records are missing.
    // (The commit point is at least the applied index: openraft saves it before applying.)
    let (file, offset) = locate(&jdir, applied - 2);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(offset)
        .unwrap();
    let error = refused(&config, victim).await;
    let name = file.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        error.contains(&name)
            && error.contains(&format!("offset {offset}"))
            && error.contains("committed"),
        "a cut at a record boundary: {error}"
    );
    restore(&backup, &node_dir);

    // The last segment missing altogether.
    std::fs::remove_file(segments(&jdir).pop().unwrap()).unwrap();
    let error = refused(&config, victim).await;
    assert!(
        error.contains("committed") && error.contains(&commit.display().to_string()),
        "a missing last segment: {error}"
    );
    restore(&backup, &node_dir);

    // A record torn half way past the commit point, as a crash in the middle of an append
    // leaves it: cut, and the node catches up.
    let (file, offset) = locate(&jdir, last);
    let mut bytes = std::fs::read(&file).unwrap();
    let record = bytes[offset as usize..].to_vec();
    bytes.extend_from_slice(&record[..record.len() / 2]);
    std::fs::write(&file, bytes).unwrap();
    nodes.insert(v, restart(&config, victim).await);
    driver.run(10).await;
    settled(&nodes, driver.acked).await;
    stop_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_of_every_node_from_journals_and_snapshots_gives_the_same_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Batch);
    let nodes = start_all(&config).await;
    let mut driver = Driver::new(&config, 61);
    driver.setup().await;
    driver.run(350).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let before = converged(&refs, CONVERGE_LIMIT).await;
    assert!(
        before.iter().all(|s| s.snapshot_index.is_some()),
        "every node took a snapshot: {before:#?}"
    );
    stop_all(nodes).await;
    // Twice: once from the files the run left, once from the files the first restart left.
    for round in 0..2 {
        let nodes = start_all(&config).await;
        let refs: Vec<&Node> = nodes.iter().collect();
        let after = converged(&refs, CONVERGE_LIMIT).await;
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(a.state_hash, before[0].state_hash, "round {round}: {a:#?}");
            assert!(a.last_applied_index >= b.last_applied_index);
        }
        assert_agree(&after, driver.acked);
        stop_all(nodes).await;
    }
}
