//! A three-node group in one process: commands are committed and applied identically on every
//! replica; retries are answered from the idempotency table; losing the leader loses nothing
//! acknowledged; a minority never acknowledges; a restart of all nodes from journals and
//! snapshots gives the same state hash.

use crate::common;

use std::time::Duration;

use bourse_cluster::client::node_snapshot;
use bourse_cluster::net::{PeerConnection, Request, Response};
use bourse_cluster::{Client, ClusterConfig, FsyncSetting, Node, OutcomeKind};
use bourse_core::Command;
use bourse_engine::workload::Flow;
use common::{addrs, converged, free_ports, small_flow};

const DEADLINE: Duration = Duration::from_secs(10);
const CONVERGE_LIMIT: Duration = Duration::from_secs(20);

fn config(dir: &std::path::Path, fsync: FsyncSetting) -> ClusterConfig {
    let mut c = ClusterConfig::local(7, dir.to_path_buf(), free_ports());
    c.fsync = fsync;
    c.snapshot_every_entries = 40;
    c.hash_checkpoint_every_entries = 8;
    c.hash_check_interval_ms = 30;
    c.orders_max = 4096;
    c.accounts_max = 1024;
    c
}

async fn start_all(config: &ClusterConfig) -> Vec<Node> {
    let mut nodes = Vec::new();
    for n in &config.nodes {
        nodes.push(Node::start(config, n.id).await.expect("node starts"));
    }
    nodes
}

/// Drives the setup and `count` flow commands through `client`; returns the acknowledgements.
async fn drive(client: &mut Client, flow: &mut Flow, setup: bool, count: usize) -> usize {
    let mut acked = 0;
    if setup {
        for (i, body) in flow.setup().into_iter().enumerate() {
            client
                .submit(&Command::new(i as u64, body), DEADLINE)
                .await
                .expect("setup acknowledged");
            acked += 1;
        }
    }
    for i in 0..count {
        let (_, events) = client
            .submit_for_events(
                &Command::new(1_000 + i as u64, flow.next_command()),
                DEADLINE,
            )
            .await
            .expect("command acknowledged");
        flow.observe(&events);
        acked += 1;
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_apply_the_same_commands_and_a_full_restart_gives_the_same_hash() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Always);
    let nodes = start_all(&config).await;
    let mut client = Client::new(addrs(&config), 1, 1);
    let mut flow = Flow::new(small_flow(11));
    let acked = drive(&mut client, &mut flow, true, 200).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let before = converged(&refs, CONVERGE_LIMIT).await;
    for s in &before {
        assert_eq!(
            s.commands_applied as usize, acked,
            "node {} applied each command once",
            s.id
        );
        assert!(s.alarm.is_none());
        assert!(
            s.hash_checks_passed > 0,
            "node {} compared no hash with the leader",
            s.id
        );
    }
    // A snapshot on demand, then periodic ones have happened too (every 40 entries).
    for n in &nodes {
        node_snapshot(n.addr, Duration::from_secs(5))
            .await
            .expect("snapshot");
    }
    let hash = before[0].state_hash;
    for n in nodes {
        n.shutdown().await;
    }

    let nodes = start_all(&config).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let after = converged(&refs, CONVERGE_LIMIT).await;
    assert_eq!(
        after[0].state_hash, hash,
        "restart from journals and snapshots"
    );
    // The group goes on where it stopped.
    let mut client = Client::new(addrs(&config), 1, client.next_seq());
    drive(&mut client, &mut flow, false, 20).await;
    converged(&refs, CONVERGE_LIMIT).await;
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_is_answered_from_the_table_and_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Never);
    let nodes = start_all(&config).await;
    let mut client = Client::new(addrs(&config), 5, 1);
    let mut flow = Flow::new(small_flow(12));
    drive(&mut client, &mut flow, true, 0).await;
    let leader = client.current_node();
    let leader_addr = config.addr_of(leader).unwrap();
    // Send request seq N again by hand, as a client that lost the answer would.
    let last_seq = client.next_seq() - 1;
    let mut conn = PeerConnection::new(leader_addr);
    let command =
        bourse_core::codec::encode_command(&Command::new(0, bourse_core::CommandBody::EndOfDay));
    let response = conn
        .call(
            Request::Submit {
                client_id: 5,
                request_seq: last_seq,
                command,
            },
            DEADLINE,
        )
        .await
        .unwrap();
    match response {
        Response::Submitted(Ok(outcome)) => assert_eq!(outcome.kind, OutcomeKind::Duplicate),
        other => panic!("unexpected {other:?}"),
    }
    let refs: Vec<&Node> = nodes.iter().collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    assert_eq!(
        statuses[0].commands_applied, last_seq,
        "the retry was not applied again"
    );
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_leader_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Never);
    let mut nodes = start_all(&config).await;
    let mut client = Client::new(addrs(&config), 9, 1);
    let mut flow = Flow::new(small_flow(13));
    let mut acked = drive(&mut client, &mut flow, true, 50).await;
    let leader = client.current_node();
    let position = nodes.iter().position(|n| n.id() == leader).unwrap();
    nodes.remove(position).shutdown().await;
    acked += drive(&mut client, &mut flow, false, 50).await;
    assert_ne!(
        client.current_node(),
        leader,
        "the client found the new leader"
    );
    let refs: Vec<&Node> = nodes.iter().collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    for s in &statuses {
        assert_eq!(s.commands_applied as usize, acked);
    }
    // The old leader comes back and catches up to the same state.
    nodes.push(Node::start(&config, leader).await.unwrap());
    let refs: Vec<&Node> = nodes.iter().collect();
    converged(&refs, CONVERGE_LIMIT).await;
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_never_acknowledges() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Never);
    let node = Node::start(&config, 1).await.unwrap();
    let mut client = Client::new(addrs(&config)[..1].to_vec(), 3, 1);
    let result = client
        .submit(
            &Command::new(0, bourse_core::CommandBody::EndOfDay),
            Duration::from_secs(2),
        )
        .await;
    assert!(
        result.is_err(),
        "one node of three acknowledged: {result:?}"
    );
    assert_eq!(node.status().await.commands_applied, 0);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_another_cluster_s_journal() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), FsyncSetting::Never);
    Node::start(&config, 1).await.unwrap().shutdown().await;
    let mut other = config.clone();
    other.cluster_id += 1;
    let error = match Node::start(&other, 1).await {
        Ok(_) => panic!("a node opened another cluster's journal"),
        Err(e) => e,
    };
    assert!(error.contains("journal"), "{error}");
}
