//! The committed stream and the pipelined client on a three-node group: every index is
//! streamed once and in order (in process and over TCP, by leader and followers), each
//! client's requests are applied gaplessly and exactly once even when the leader is lost with
//! thousands in flight, a request that skips a seq is refused, and a start older than the ring
//! is refused with the oldest index kept.
//!
//! The [`StreamConsumer`]: it resumes with no gap and no duplicate after the node it reads
//! from is killed, after the consumer itself restarts from its saved position, and after it
//! was cut off or started behind the ring (from the stream archive on disk, also across a
//! node restart); frames that are not the entry due are refused and another node is asked.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bourse_cluster::client::{node_status, PipelinedClient, StreamClient};
use bourse_cluster::net::{PeerConnection, Request, Response};
use bourse_cluster::{
    ClusterConfig, CommittedEntry, Node, OutcomeKind, StreamConsumer, StreamError,
};
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
/// `client_id` applied exactly once each, as 1, 2, 3, ..., each with events; returns (last
/// applied seq, the index that applied each seq).
fn check_entries(
    entries: &[CommittedEntry],
    first: u64,
    client_id: u64,
) -> (u64, BTreeMap<u64, u64>) {
    let mut applied = BTreeMap::new();
    let mut last = 0;
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.index, first + i as u64, "consecutive indexes");
        for r in e.requests.iter().filter(|r| r.client_id == client_id) {
            if r.kind == OutcomeKind::Applied {
                assert_eq!(r.request_seq, last + 1, "applied in order, without gaps");
                last = r.request_seq;
                assert_eq!(r.applied_index, e.index);
                assert!(!r.events.is_empty(), "an applied command has events");
                applied.insert(r.request_seq, e.index);
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
        assert!(answers.insert(a.request_seq, a.applied_index).is_none());
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
    let (_, follower_indexes) = check_entries(&from_follower, 0, 21);
    let (_, leader_indexes) = check_entries(&from_leader, 0, 21);
    // Every answer names the entry that applied the request, on every node's stream.
    assert_eq!(follower_indexes, answers);
    assert_eq!(leader_indexes, answers);
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
    // Over TCP the node serves a start older than its ring from its stream archive.
    let mut tcp = StreamClient::connect(nodes[leader].addr, 0).await.unwrap();
    for index in 0..4 {
        assert_eq!(tcp.recv().await.unwrap().unwrap().index, index);
    }
    for n in nodes {
        n.shutdown().await;
    }
}

/// Reads from `consumer` until `client_id`'s request `last` was applied; returns the entries.
async fn consume_until(
    consumer: &mut StreamConsumer,
    entries: &mut Vec<CommittedEntry>,
    first: u64,
    client_id: u64,
    last: u64,
) {
    let started = Instant::now();
    while check_entries(entries, first, client_id).0 < last {
        let left = LIMIT.saturating_sub(started.elapsed());
        let e = tokio::time::timeout(left, consumer.next())
            .await
            .expect("entries arrive")
            .expect("the consumer goes on");
        entries.push(e.entry().clone());
    }
}

/// Submits `count` flow commands (after the setup when `setup`) and waits for every answer.
async fn submit_and_wait(
    client: &mut PipelinedClient,
    flow: &mut Flow,
    count: usize,
    setup: bool,
) -> u64 {
    let mut last = 0;
    if setup {
        for body in flow.setup() {
            last = client.submit(&Command::new(0, body)).await.unwrap();
        }
    }
    for i in 0..count {
        last = client
            .submit(&Command::new(i as u64, flow.next_command()))
            .await
            .unwrap();
    }
    loop {
        let a = tokio::time::timeout(LIMIT, client.next_answer())
            .await
            .expect("answers arrive")
            .unwrap();
        if a.request_seq == last {
            return last;
        }
    }
}

fn node_addrs(nodes: &[Node], first: usize) -> Vec<std::net::SocketAddr> {
    (0..nodes.len())
        .map(|k| nodes[(first + k) % nodes.len()].addr)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_resumes_with_no_gap_and_no_duplicate_when_the_node_it_reads_from_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mut nodes = start_all(&config).await;
    let leader = leader_of(&nodes).await;
    // The consumer reads from the leader first.
    let mut consumer = StreamConsumer::remote(node_addrs(&nodes, leader), 0);
    let mut client = PipelinedClient::start(addrs(&config), 41, 1, 256);
    let mut flow = Flow::new(small_flow(3));
    let before = submit_and_wait(&mut client, &mut flow, 800, true).await;
    let mut entries = Vec::new();
    consume_until(&mut consumer, &mut entries, 0, 41, before).await;
    assert_eq!(consumer.node(), Some(nodes[leader].addr));
    nodes.remove(leader).shutdown().await;
    let after = submit_and_wait(&mut client, &mut flow, 800, false).await;
    assert!(after > before);
    consume_until(&mut consumer, &mut entries, 0, 41, after).await;
    let s = consumer.status();
    assert!(s.cut_offs >= 1, "{s:?}");
    assert_eq!(s.position, entries.len() as u64);
    assert!(consumer
        .node()
        .is_some_and(|a| nodes.iter().any(|n| n.addr == a)));
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_consumer_resumes_from_its_saved_position_with_no_gap_and_no_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let nodes = start_all(&config).await;
    let leader = leader_of(&nodes).await;
    let mut client = PipelinedClient::start(addrs(&config), 42, 1, 256);
    let mut flow = Flow::new(small_flow(4));
    let first = submit_and_wait(&mut client, &mut flow, 500, true).await;
    let mut entries = Vec::new();
    let saved = {
        let mut consumer = StreamConsumer::remote(node_addrs(&nodes, leader), 0);
        consume_until(&mut consumer, &mut entries, 0, 42, first).await;
        consumer.position()
    };
    let last = submit_and_wait(&mut client, &mut flow, 500, false).await;
    // Restarted, reading from another node, in process this time.
    let mut consumer = nodes[(leader + 1) % 3].consumer(saved);
    consume_until(&mut consumer, &mut entries, 0, 42, last).await;
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_behind_the_ring_catches_up_from_the_archive_also_after_a_node_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.stream_entries_kept = 8;
    let mut nodes = start_all(&config).await;
    let leader = leader_of(&nodes).await;
    let mut client = PipelinedClient::start(addrs(&config), 43, 1, 16);
    let mut flow = Flow::new(small_flow(6));
    let mut last = submit_and_wait(&mut client, &mut flow, 50, true).await;
    for _ in 0..10 {
        last = submit_and_wait(&mut client, &mut flow, 30, false).await;
    }
    let follower = (leader + 1) % 3;
    let mut consumer = nodes[follower].consumer(0);
    let mut entries = Vec::new();
    consume_until(&mut consumer, &mut entries, 0, 43, last).await;
    let s = consumer.status();
    assert!(entries.len() > 8 + 10, "{} entries", entries.len());
    assert!(s.entries_from_disk > 0, "{s:?}");
    // The follower restarts: its archive, consistent with what it applies again, still
    // serves the whole run, byte for byte.
    let id = config.nodes[follower].id;
    nodes.remove(follower).shutdown().await;
    let restarted = Node::start(&config, id)
        .await
        .expect("the follower restarts");
    nodes.push(restarted);
    let more = submit_and_wait(&mut client, &mut flow, 30, false).await;
    let mut again = nodes.last().unwrap().consumer(0);
    let mut replayed = Vec::new();
    consume_until(&mut again, &mut replayed, 0, 43, more).await;
    assert_eq!(replayed[..entries.len()], entries[..]);
    assert!(again.status().entries_from_disk > 0);
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_that_are_not_the_entry_due_are_refused_and_another_node_is_asked() {
    use bourse_cluster::net::{encode_frame, Tagged};
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let nodes = start_all(&config).await;
    let leader = leader_of(&nodes).await;
    let mut client = PipelinedClient::start(addrs(&config), 44, 1, 256);
    let mut flow = Flow::new(small_flow(8));
    let last = submit_and_wait(&mut client, &mut flow, 300, true).await;
    // Two fake nodes on 127.0.0.1: one sends garbage in a well-formed frame, the other a
    // well-formed entry that is not the one asked for. Each serves every connection so.
    let wrong = encode_frame(&Tagged {
        tag: 1,
        body: Response::Committed {
            index: 7,
            entry: CommittedEntry {
                index: 7,
                requests: Vec::new(),
                market_data_flush_ns: None,
            }
            .encode(),
        },
    });
    let mut garbage = wrong.clone();
    for b in &mut garbage[4..] {
        *b = 0xff;
    }
    let mut fakes = Vec::new();
    for frame in [garbage, wrong] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        fakes.push(listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let _ = s.write_all(&frame).await;
                let _ = s.flush().await;
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    drop(s);
                });
            }
        });
    }
    let mut addrs_with_fakes = fakes.clone();
    addrs_with_fakes.push(nodes[leader].addr);
    let mut consumer = StreamConsumer::remote(addrs_with_fakes, 0);
    let mut entries = Vec::new();
    consume_until(&mut consumer, &mut entries, 0, 44, last).await;
    let s = consumer.status();
    assert_eq!(s.wire_errors, 2, "{s:?}");
    assert_eq!(consumer.node(), Some(nodes[leader].addr));
    // Only fakes: the consumer gives up with a reason rather than hand out a wrong entry.
    let mut stranded = StreamConsumer::remote(fakes, 0);
    stranded.set_reconnect_timeout_ms(500);
    assert!(matches!(
        stranded.next().await,
        Err(StreamError::Unreachable(_))
    ));
    assert!(stranded.status().wire_errors >= 2);
    for n in nodes {
        n.shutdown().await;
    }
}
