//! Pipelined replication (`append_in_flight_max` above 1): every command acknowledged is
//! applied once on every replica, a follower that stops and returns catches up through new
//! streams, a new leader after the old one is lost loses nothing acknowledged, and a restart
//! of all nodes gives the same state hash. The followers must have taken the AppendEntries on
//! pipelined streams, or the tests prove nothing about them.

use crate::common;

use std::time::Duration;

use bourse_cluster::client::{Answer, PipelinedClient};
use bourse_cluster::{ClusterConfig, FsyncSetting, Node, OutcomeKind};
use bourse_core::Command;
use bourse_engine::workload::Flow;
use common::{addrs, converged, free_ports, small_flow};

const CONVERGE_LIMIT: Duration = Duration::from_secs(30);
/// Requests the client keeps in flight, so that batches follow one another while earlier
/// AppendEntries are still out.
const CLIENT_WINDOW: usize = 256;

fn config(dir: &std::path::Path, fsync: FsyncSetting) -> ClusterConfig {
    let mut c = ClusterConfig::local(17, dir.to_path_buf(), free_ports());
    c.fsync = fsync;
    c.append_in_flight_max = 16;
    c.snapshot_every_entries = 200;
    c.hash_checkpoint_every_entries = 16;
    c.hash_check_interval_ms = 30;
    c.orders_max = 8192;
    c.accounts_max = 1024;
    c.validate().expect("valid config");
    c
}

async fn start_all(config: &ClusterConfig) -> Vec<Node> {
    let mut nodes = Vec::new();
    for n in &config.nodes {
        nodes.push(Node::start(config, n.id).await.expect("node starts"));
    }
    nodes
}

/// Submits `count` commands of `flow` (its setup first when `setup`) through a pipelined
/// client and waits for every answer; returns how many were applied (by this attempt or an
/// earlier one of the same request).
async fn drive(client: &mut PipelinedClient, flow: &mut Flow, setup: bool, count: usize) -> u64 {
    let mut commands: Vec<Command> = Vec::new();
    if setup {
        commands.extend(
            flow.setup()
                .into_iter()
                .enumerate()
                .map(|(i, body)| Command::new(i as u64, body)),
        );
    }
    for i in 0..count {
        commands.push(Command::new(10_000 + i as u64, flow.next_command()));
    }
    let mut answers = 0u64;
    for command in &commands {
        client.submit(command).await.expect("queued");
        while let Some(answer) = client.try_answer().expect("client runs") {
            answers += applied(&answer);
        }
    }
    while answers < commands.len() as u64 {
        let answer = tokio::time::timeout(Duration::from_secs(60), client.next_answer())
            .await
            .expect("answered within the hang guard")
            .expect("client runs");
        answers += applied(&answer);
    }
    answers
}

/// 1 for an answer that says the request applied (now or by an earlier attempt).
fn applied(answer: &Answer) -> u64 {
    assert_ne!(answer.kind, OutcomeKind::Refused, "{answer:?}");
    1
}

fn pipelined_requests(nodes: &[Node]) -> u64 {
    nodes
        .iter()
        .map(|n| n.stages().append_stream_requests())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_replication_applies_every_command_once_and_a_restart_gives_the_same_hash() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Always);
    let nodes = start_all(&config).await;
    let mut client = PipelinedClient::start(addrs(&config), 1, 1, CLIENT_WINDOW);
    let mut flow = Flow::new(small_flow(21));
    let acked = drive(&mut client, &mut flow, true, 3_000).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    for s in &statuses {
        assert_eq!(s.commands_applied, acked, "node {} applied each once", s.id);
        assert!(s.alarm.is_none(), "node {}: {:?}", s.id, s.alarm);
    }
    assert!(
        pipelined_requests(&nodes) > 0,
        "the followers took no AppendEntries on a pipelined stream"
    );
    let most = nodes
        .iter()
        .map(|n| n.stages().append_stream_unanswered_max())
        .max();
    println!("most AppendEntries unanswered on one stream: {most:?}");
    let hash = statuses[0].state_hash;
    for n in nodes {
        n.shutdown().await;
    }
    let nodes = start_all(&config).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let after = converged(&refs, CONVERGE_LIMIT).await;
    assert_eq!(after[0].state_hash, hash, "restart from journals");
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_stops_and_returns_and_a_lost_leader_lose_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Never);
    let mut nodes = start_all(&config).await;
    let mut client = PipelinedClient::start(addrs(&config), 2, 1, CLIENT_WINDOW);
    let mut flow = Flow::new(small_flow(22));
    let mut acked = drive(&mut client, &mut flow, true, 1_000).await;

    // A follower stops; the other two go on; it returns and must catch up.
    let leader = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await[0]
        .leader
        .expect("a leader");
    let follower_at = nodes.iter().position(|n| n.id() != leader).unwrap();
    let follower = nodes[follower_at].id();
    nodes.remove(follower_at).shutdown().await;
    acked += drive(&mut client, &mut flow, false, 1_000).await;
    nodes.push(Node::start(&config, follower).await.expect("restarts"));
    acked += drive(&mut client, &mut flow, false, 1_000).await;
    let statuses = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await;
    for s in &statuses {
        assert_eq!(s.commands_applied, acked, "node {} applied each once", s.id);
    }

    // The leader is lost; the new one has everything acknowledged.
    let leader_at = nodes.iter().position(|n| n.id() == leader).unwrap();
    nodes.remove(leader_at).shutdown().await;
    acked += drive(&mut client, &mut flow, false, 1_000).await;
    let statuses = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await;
    for s in &statuses {
        assert_eq!(s.commands_applied, acked, "node {} applied each once", s.id);
        assert_ne!(s.leader, Some(leader), "a new leader");
    }
    nodes.push(Node::start(&config, leader).await.expect("restarts"));
    let statuses = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await;
    assert_eq!(statuses.len(), 3);
    for s in &statuses {
        assert_eq!(s.commands_applied, acked, "node {} applied each once", s.id);
    }
    assert!(pipelined_requests(&nodes) > 0);
    for n in nodes {
        n.shutdown().await;
    }
}

/// Connections a node may still serve once every client has gone: openraft keeps a few
/// clients per peer (replication, heartbeats, elections), each with a connection of its own,
/// plus the pipelined stream to each follower. A connection beyond these is one that closed
/// and was never let go (each client below leaves one, each restarted stream another).
const SETTLED_CONNECTIONS_MAX: u64 = 8;
/// Clients that connect, submit and leave, one after another (more than the bound above, so
/// that a connection leaked per client cannot hide under it).
const CLIENTS: u64 = 24;
const FOLLOWER_RESTARTS: usize = 3;

/// Drives `count` commands through a new client that then leaves.
async fn one_client(config: &ClusterConfig, id: u64, flow: &mut Flow, count: usize) -> u64 {
    let mut client = PipelinedClient::start(addrs(config), id, 1, CLIENT_WINDOW);
    let applied = drive(&mut client, flow, false, count).await;
    drop(client);
    applied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_end_and_clients_that_leave_hold_no_connection_on_any_node() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Never);
    let mut nodes = start_all(&config).await;
    let mut flow = Flow::new(small_flow(23));
    let mut setup = PipelinedClient::start(addrs(&config), 100, 1, CLIENT_WINDOW);
    let mut acked = drive(&mut setup, &mut flow, true, 200).await;
    drop(setup);
    let mut next_client = 101;

    // A follower stopped and returned ends the leader's stream to it; the returned follower
    // takes a new one. Clients come and go meanwhile.
    for _ in 0..FOLLOWER_RESTARTS {
        let leader = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await[0]
            .leader
            .expect("a leader");
        let at = nodes.iter().position(|n| n.id() != leader).unwrap();
        let follower = nodes[at].id();
        nodes.remove(at).shutdown().await;
        acked += one_client(&config, next_client, &mut flow, 300).await;
        nodes.push(Node::start(&config, follower).await.expect("restarts"));
        acked += one_client(&config, next_client + 1, &mut flow, 300).await;
        next_client += 2;
    }
    while next_client < 100 + CLIENTS {
        acked += one_client(&config, next_client, &mut flow, 50).await;
        next_client += 1;
    }
    let statuses = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await;
    for s in &statuses {
        assert_eq!(s.commands_applied, acked, "node {} applied each once", s.id);
    }
    let served: Vec<u64> = nodes
        .iter()
        .map(|n| n.stages().append_streams_served())
        .collect();
    println!("pipelined streams served per node since its last start: {served:?}");
    assert!(
        pipelined_requests(&nodes) > 0,
        "no pipelined stream was used"
    );

    // Every connection that closed must be let go: the counts come down to what the peers
    // hold open (waited for, under a hang guard; a leak never comes down).
    let open = |nodes: &[Node]| -> Vec<u64> {
        nodes
            .iter()
            .map(|n| n.stages().connections_open())
            .collect()
    };
    let settled = tokio::time::timeout(CONVERGE_LIMIT, async {
        while open(&nodes).iter().any(|&c| c > SETTLED_CONNECTIONS_MAX) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    println!("connections open per node: {:?}", open(&nodes));
    assert!(
        settled.is_ok(),
        "connections left open after every client left: {:?} (at most {SETTLED_CONNECTIONS_MAX} each)",
        open(&nodes)
    );
    for n in nodes {
        n.shutdown().await;
    }
}

/// Rounds of "a follower returns, then the other one is lost".
const HANDOVER_ROUNDS: usize = 4;

/// A follower that restarted must be replicated to at once, not only once it has caught up on
/// its own: right after it returns (before its catch-up is waited for) the other follower is
/// stopped, so that the leader's quorum is the returned follower alone, and the group must go
/// on committing. The bed saw acknowledgements stop when a follower was cut off soon after the
/// other had returned (docs/results/netns-faults.md, session 19): openraft's replication
/// backoff (200 ms before each new stream to a follower that was unreachable) made this take
/// ~600 ms per round here, 27-46 ms with `REPLICATION_BACKOFF_MS`. The times are printed, never
/// asserted (a hang guard only), beside those of the same commands with all three up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_returns_makes_the_quorum_when_the_other_is_lost_right_after() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Always);
    let mut nodes = start_all(&config).await;
    let mut flow = Flow::new(small_flow(24));
    let mut setup = PipelinedClient::start(addrs(&config), 200, 1, CLIENT_WINDOW);
    let mut acked = drive(&mut setup, &mut flow, true, 300).await;
    drop(setup);
    let mut next_client = 201;
    for round in 0..HANDOVER_ROUNDS {
        let leader = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await[0]
            .leader
            .expect("a leader");
        let followers: Vec<u64> = nodes
            .iter()
            .map(|n| n.id())
            .filter(|&id| id != leader)
            .collect();
        let (returning, other) = (followers[round % 2], followers[1 - round % 2]);
        let started = std::time::Instant::now();
        acked += one_client(&config, 300 + round as u64, &mut flow, 100).await;
        println!(
            "round {round}: all three up: 100 commands in {} ms",
            started.elapsed().as_millis()
        );
        let at = nodes.iter().position(|n| n.id() == returning).unwrap();
        nodes.remove(at).shutdown().await;
        acked += one_client(&config, next_client, &mut flow, 300).await;
        nodes.push(Node::start(&config, returning).await.expect("restarts"));
        let at = nodes.iter().position(|n| n.id() == other).unwrap();
        nodes.remove(at).shutdown().await;
        let started = std::time::Instant::now();
        acked += one_client(&config, next_client + 1, &mut flow, 100).await;
        println!(
            "round {round}: node {returning} returned, node {other} stopped: 100 commands \
             committed with the leader and node {returning} in {} ms",
            started.elapsed().as_millis()
        );
        nodes.push(Node::start(&config, other).await.expect("restarts"));
        next_client += 2;
    }
    let statuses = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await;
    for s in &statuses {
        assert_eq!(s.commands_applied, acked, "node {} applied each once", s.id);
    }
    for n in nodes {
        n.shutdown().await;
    }
}
