//! The committed stream and the pipelined client on a three-node group: every index is
//! streamed once and in order (in process and over TCP, by leader and followers), each
//! client's requests are applied gaplessly and exactly once even when the leader is lost with
//! thousands in flight, a request that skips a seq is refused, and a start older than the ring
//! is refused with the oldest index kept.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bourse_cluster::client::{node_status, PipelinedClient, StreamClient};
use bourse_cluster::net::{PeerConnection, Request, Response};
use bourse_cluster::{ClusterConfig, CommittedEntry, Node, OutcomeKind, StreamError};
use bourse_core::{Command, CommandBody};
use bourse_engine::workload::Flow;
use common::{addrs, free_ports, small_flow};

const LIMIT: Duration = Duration::from_secs(30);

fn config(dir: &std::path::Path) -> ClusterConfig {
    let mut c = ClusterConfig::local(8, dir.to_path_buf(), free_ports());
    c.fsync = bourse_cluster::FsyncSetting::Never;
    c.orders_max = 8192;
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

async fn leader_of(nodes: &[Node]) -> usize {
    let started = Instant::now();
    loop {
        for (i, n) in nodes.iter().enumerate() {
            let s = n.status().await;
            if s.leader == Some(s.id) {
                return i;
            }
        }
        assert!(started.elapsed() < LIMIT, "no leader");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Queues the flow's setup and `count` flow commands; returns the last seq.
async fn submit_flow(client: &mut PipelinedClient, flow: &mut Flow, count: usize) -> u64 {
    let mut last = 0;
    for body in flow.setup() {
        last = client.submit(&Command::new(0, body)).await.unwrap();
    }
    for i in 0..count {
        last = client
            .submit(&Command::new(i as u64, flow.next_command()))
            .await
            .unwrap();
    }
    last
}

/// Checks a run of streamed entries: consecutive indexes from `first`, and the requests of
/// `client_id` applied exactly once each, as 1, 2, 3, ...; returns (last applied seq, the
/// applied events by seq).
fn check_entries(
    entries: &[CommittedEntry],
    first: u64,
    client_id: u64,
) -> (u64, BTreeMap<u64, Vec<u8>>) {
    let mut applied = BTreeMap::new();
    let mut last = 0;
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.index, first + i as u64, "consecutive indexes");
        for r in e.requests.iter().filter(|r| r.client_id == client_id) {
            if r.kind == OutcomeKind::Applied {
                assert_eq!(r.request_seq, last + 1, "applied in order, without gaps");
                last = r.request_seq;
                applied.insert(r.request_seq, r.events.clone());
            } else {
                assert!(r.request_seq <= last || matches!(r.kind, OutcomeKind::Gap { .. }));
            }
        }
    }
    (last, applied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_index_is_streamed_once_in_order_by_leader_and_followers() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let nodes = start_all(&config).await;
    let leader = leader_of(&nodes).await;
    let follower = (leader + 1) % 3;
    let mut in_process = nodes[follower].subscribe(0).expect("index 0 is kept");
    let mut over_tcp = StreamClient::connect(nodes[leader].addr, 0).await.unwrap();

    let mut client = PipelinedClient::start(addrs(&config), 21, 1, 256);
    let mut flow = Flow::new(small_flow(5));
    let last = submit_flow(&mut client, &mut flow, 1_500).await;
    let mut answers = BTreeMap::new();
    while answers.len() < last as usize {
        let a = tokio::time::timeout(LIMIT, client.next_answer())
            .await
            .expect("answers arrive")
            .unwrap();
        assert_eq!(a.kind, OutcomeKind::Applied);
        assert!(answers.insert(a.request_seq, a.events).is_none());
    }

    let mut from_follower = Vec::new();
    let mut from_leader = Vec::new();
    let started = Instant::now();
    loop {
        while let Some(e) = in_process.try_recv().unwrap() {
            from_follower.push((*e).clone());
        }
        let (seen, _) = check_entries(&from_follower, 0, 21);
        if seen == last {
            break;
        }
        assert!(
            started.elapsed() < LIMIT,
            "follower streamed up to {seen} of {last}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    loop {
        let e = tokio::time::timeout(LIMIT, over_tcp.recv())
            .await
            .expect("stream frames arrive")
            .unwrap()
            .unwrap();
        from_leader.push(e);
        if check_entries(&from_leader, 0, 21).0 == last {
            break;
        }
    }
    let (_, follower_events) = check_entries(&from_follower, 0, 21);
    let (_, leader_events) = check_entries(&from_leader, 0, 21);
    // The stream carries exactly what the client was answered, on every node.
    assert_eq!(follower_events, answers);
    assert_eq!(leader_events, answers);
    // Empty entries (the membership entry, hash checks, a leader's blank) advance the index.
    assert!(from_leader.iter().any(|e| e.requests.is_empty()));
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_leader_with_requests_in_flight_applies_each_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mut nodes = start_all(&config).await;
    let leader = leader_of(&nodes).await;
    let survivor = (leader + 1) % 3;
    let mut sub = nodes[survivor].subscribe(0).unwrap();

    let mut client = PipelinedClient::start(addrs(&config), 33, 1, 1024);
    let mut flow = Flow::new(small_flow(9));
    let mut last = 0;
    for body in flow.setup() {
        last = client.submit(&Command::new(0, body)).await.unwrap();
    }
    let mut answered = 0u64;
    let mut killed = false;
    for i in 0..6_000u64 {
        last = client
            .submit(&Command::new(i, flow.next_command()))
            .await
            .unwrap();
        while let Some(a) = client.try_answer().unwrap() {
            assert_ne!(a.kind, OutcomeKind::Refused);
            answered += 1;
        }
        if i == 2_000 && !killed {
            // Stop the leader with a window of requests in flight.
            nodes.remove(leader).shutdown().await;
            killed = true;
        }
    }
    let started = Instant::now();
    while answered < last {
        tokio::time::timeout(
            LIMIT.saturating_sub(started.elapsed()),
            client.next_answer(),
        )
        .await
        .expect("every request answered after the failover")
        .unwrap();
        answered += 1;
    }
    let mut entries = Vec::new();
    loop {
        let e = tokio::time::timeout(LIMIT, sub.recv())
            .await
            .expect("the survivor streams on")
            .unwrap();
        entries.push((*e).clone());
        if check_entries(&entries, 0, 33).0 == last {
            break;
        }
    }
    let new_leader = leader_of(&nodes).await;
    assert_eq!(nodes[new_leader].last_seq(33).await, last);
    let status = node_status(nodes[new_leader].addr, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(status.term > 1, "a new leader was elected");
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_seq_is_refused_and_an_old_start_is_too_old() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.stream_entries_kept = 8;
    let nodes = start_all(&config).await;
    let leader = leader_of(&nodes).await;
    let mut conn = PeerConnection::new(nodes[leader].addr);
    let submit = |seq: u64| Request::Submit {
        client_id: 5,
        request_seq: seq,
        command: bourse_core::codec::encode_command(&Command::new(0, CommandBody::EndOfDay)),
    };
    let mut kinds = Vec::new();
    for seq in [1, 3, 2, 3] {
        match conn
            .call(submit(seq), Duration::from_secs(5))
            .await
            .unwrap()
        {
            Response::Submitted(Ok(o)) => kinds.push(o.kind),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        kinds,
        vec![
            OutcomeKind::Applied,
            OutcomeKind::Gap { expected: 2 },
            OutcomeKind::Applied,
            OutcomeKind::Applied
        ]
    );
    match conn
        .call(Request::LastSeq { client_id: 5 }, Duration::from_secs(5))
        .await
        .unwrap()
    {
        Response::LastSeq(s) => assert_eq!(s, 3),
        other => panic!("unexpected {other:?}"),
    }
    for seq in 4..20 {
        conn.call(submit(seq), Duration::from_secs(5))
            .await
            .unwrap();
    }
    match nodes[leader].subscribe(0) {
        Err(StreamError::TooOld {
            from_index: 0,
            oldest_kept,
        }) => assert!(oldest_kept > 8),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("index 0 should have left an 8-entry ring"),
    }
    let mut tcp = StreamClient::connect(nodes[leader].addr, 0).await.unwrap();
    assert!(matches!(
        tcp.recv().await.unwrap(),
        Err(StreamError::TooOld { .. })
    ));
    for n in nodes {
        n.shutdown().await;
    }
}
