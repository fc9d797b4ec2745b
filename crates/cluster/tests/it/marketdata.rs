//! Market data published by the replicated core: three in-process nodes each run their
//! core's publisher from their own committed stream, only the leader sends, and a subscriber
//! on loopback ends with every book equal to the engine's, through a failover of the leader in
//! the middle of the stream and through a load run of several concurrent clients.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bourse_cluster::marketdata::{MarketDataSection, MarketDataService};
use bourse_cluster::{Client, ClusterConfig, FsyncSetting, Node};
use bourse_core::{Command, InstrumentId, Side};
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::Engine;
use bourse_marketdata::udp::UdpSubscriber;
use bourse_marketdata::{Channel, SubscriberConfig};
use common::{addrs, converged, free_ports};

const DEADLINE: Duration = Duration::from_secs(10);
const CONVERGE_LIMIT: Duration = Duration::from_secs(30);
const SYNC_LIMIT: Duration = Duration::from_secs(30);

fn config(dir: &std::path::Path, section: MarketDataSection) -> ClusterConfig {
    let mut c = ClusterConfig::local(11, dir.to_path_buf(), free_ports());
    c.fsync = FsyncSetting::Never;
    c.hash_checkpoint_every_entries = 64;
    c.orders_max = 1 << 14;
    c.accounts_max = 1024;
    c.marketdata = Some(section);
    c.validate().expect("valid configuration");
    c
}

/// A subscriber on free loopback ports, and the `[marketdata]` section that publishes to it.
fn subscriber() -> (UdpSubscriber, MarketDataSection) {
    let (mut sub, addrs) =
        UdpSubscriber::bind_ephemeral(SubscriberConfig::default()).expect("bind subscriber");
    let replay_base = bourse_testkit::free_port_block(4);
    let mut section = MarketDataSection {
        replay_base_port: Some(replay_base),
        snapshot_cycle_ms: 4,
        instruments_interval_ms: 20,
        ..MarketDataSection::default()
    };
    for c in Channel::ALL {
        let a = addrs.channels[c.index()];
        section
            .ports
            .insert(c.name().to_string(), [a.a.port(), a.b.port()]);
    }
    sub.set_replay(Some(SocketAddr::from(([127, 0, 0, 1], replay_base))));
    (sub, section)
}

/// What the subscriber thread must reach before it stops on its own: every instrument's
/// depth hash, as (instrument id, hash).
type Target = Arc<Mutex<Option<Vec<(u32, u64)>>>>;

/// Runs the subscriber on its own thread until `stop`, or until it is synced with every book
/// equal to the target; hands it back.
fn run_subscriber(
    mut sub: UdpSubscriber,
    stop: Arc<AtomicBool>,
    target: Target,
) -> std::thread::JoinHandle<UdpSubscriber> {
    std::thread::spawn(move || {
        let started = Instant::now();
        let mut checked = Instant::now();
        // Bounded in time: a test never runs for more than a few minutes.
        while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(300) {
            if sub.poll_once(&mut |_, _, _, _| {}) == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
            if checked.elapsed() >= Duration::from_millis(20) {
                checked = Instant::now();
                let done = target.lock().unwrap().as_ref().is_some_and(|t| {
                    sub.sub.is_synced()
                        && t.iter()
                            .all(|(id, hash)| depth_hash(&subscriber_depth(&sub, *id)) == *hash)
                });
                if done {
                    break;
                }
            }
        }
        sub
    })
}

fn flow_config(seed: u64) -> FlowConfig {
    let mut fc = FlowConfig::three_markets(60, seed);
    fc.live_orders_target = 400;
    fc
}

async fn start(config: &ClusterConfig) -> Vec<(Node, MarketDataService)> {
    let mut nodes = Vec::new();
    for n in &config.nodes {
        let node = Node::start(config, n.id).await.expect("node starts");
        let md = MarketDataService::start(&node, config.marketdata.as_ref().unwrap())
            .expect("market data starts");
        nodes.push((node, md));
    }
    nodes
}

async fn drive(client: &mut Client, flow: &mut Flow, count: usize) {
    for _ in 0..count {
        let (_, events) = client
            .submit_for_events(
                &Command::new(bourse_marketdata::now_ns(), flow.next_command()),
                DEADLINE,
            )
            .await
            .expect("command acknowledged");
        flow.observe(&events);
    }
}

async fn setup(client: &mut Client, flow: &Flow) {
    for body in flow.setup() {
        client
            .submit(&Command::new(bourse_marketdata::now_ns(), body), DEADLINE)
            .await
            .expect("setup acknowledged");
    }
}

/// xxh3 of an instrument's full depth (price, quantity, orders per level, both sides).
fn depth_hash(levels: &[(i64, i64, u32)]) -> u64 {
    let mut bytes = Vec::with_capacity(levels.len() * 20);
    for (p, q, n) in levels {
        bytes.extend_from_slice(&p.to_le_bytes());
        bytes.extend_from_slice(&q.to_le_bytes());
        bytes.extend_from_slice(&n.to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

fn engine_depth(engine: &Engine, id: InstrumentId) -> Vec<(i64, i64, u32)> {
    [Side::Buy, Side::Sell]
        .into_iter()
        .flat_map(|side| engine.depth(id, side, usize::MAX))
        .map(|(p, q, n)| (p.0, q.0, n))
        .collect()
}

fn subscriber_depth(sub: &UdpSubscriber, id: u32) -> Vec<(i64, i64, u32)> {
    let Some(book) = sub.sub.book(id) else {
        return Vec::new();
    };
    [Side::Buy, Side::Sell]
        .into_iter()
        .flat_map(|side| book.levels(side))
        .map(|l| (l.price, l.qty, l.orders))
        .collect()
}

/// Waits (bounded) until the subscriber is synced and every instrument's depth hash equals
/// the engine's; panics with the differences otherwise.
async fn assert_books_match(
    node: &Node,
    target: Target,
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<UdpSubscriber>,
) -> UdpSubscriber {
    let expected: Vec<(u32, u64, usize)> = node
        .state_machine()
        .with_state(|s| {
            let e = s.engine();
            e.instruments()
                .map(|d| {
                    let depth = engine_depth(e, d.instrument);
                    (d.instrument.0, depth_hash(&depth), depth.len())
                })
                .collect()
        })
        .await;
    assert!(!expected.is_empty(), "the core has instruments");
    *target.lock().unwrap() = Some(expected.iter().map(|&(id, h, _)| (id, h)).collect());
    let started = Instant::now();
    // The subscriber keeps running while the snapshot loop and replay settle it.
    while !handle.is_finished() && started.elapsed() < SYNC_LIMIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let sub = handle.join().expect("subscriber thread");
    let mut mismatches = Vec::new();
    for (id, hash, levels) in &expected {
        let got = subscriber_depth(&sub, *id);
        let live = sub.sub.instrument(*id).is_some_and(|i| i.live);
        if depth_hash(&got) != *hash || !live {
            mismatches.push((*id, live, got.len(), *levels));
        }
    }
    assert!(
        mismatches.is_empty(),
        "books differ from the core's (id, live, subscriber levels, core levels): {mismatches:?}\n{:?}",
        sub.sub.stats()
    );
    assert!(sub.sub.is_synced(), "{:?}", sub.sub.stats());
    sub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_s_publisher_fails_over_mid_stream_and_the_books_equal_the_core_s() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, section) = subscriber();
    let config = config(dir.path(), section);
    let stop = Arc::new(AtomicBool::new(false));
    let target: Target = Arc::new(Mutex::new(None));
    let handle = run_subscriber(sub, Arc::clone(&stop), Arc::clone(&target));
    let mut nodes = start(&config).await;
    let mut client = Client::new(addrs(&config), 21, 1);
    let flow = Flow::new(flow_config(5));
    setup(&mut client, &flow).await;
    // A client keeps submitting through the failover (it retries on the new leader).
    let driver = {
        let peers = addrs(&config);
        tokio::spawn(async move {
            let mut client = Client::new(peers, 22, 1);
            let mut flow = Flow::new(flow_config(5));
            let _ = flow.setup();
            drive(&mut client, &mut flow, 1_200).await;
        })
    };
    // Wait until the stream is well under way, then check that exactly the leader sends.
    let started = Instant::now();
    let leader = loop {
        assert!(started.elapsed() < CONVERGE_LIMIT, "no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let leader = nodes[0].0.raft().metrics().borrow().current_leader;
        let Some(leader) = leader else { continue };
        let (_, md) = nodes.iter().find(|(n, _)| n.id() == leader).unwrap();
        if md.status().entries_published >= 300 {
            break leader;
        }
    };
    for (n, md) in &nodes {
        let s = md.status();
        assert_eq!(s.detached, None, "node {}: {s:?}", n.id());
        assert_eq!(s.active, n.id() == leader, "node {}: {s:?}", n.id());
    }
    let sent_before: u64 = nodes
        .iter()
        .find(|(n, _)| n.id() == leader)
        .map(|(_, md)| md.status().packets_sent[Channel::Orders.index()])
        .unwrap();
    assert!(sent_before > 0, "the leader published");

    // Kill the leader mid-stream (its publisher first, as a crash stops both at once).
    let position = nodes.iter().position(|(n, _)| n.id() == leader).unwrap();
    let (old, md) = nodes.remove(position);
    md.stop();
    old.shutdown().await;
    driver
        .await
        .expect("the client got every command acknowledged");
    let refs: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    let new_leader = statuses.iter().find(|s| s.leader == Some(s.id)).unwrap().id;
    assert_ne!(new_leader, leader);
    let (node, md) = nodes.iter().find(|(n, _)| n.id() == new_leader).unwrap();
    let status = md.status();
    assert!(status.active, "{status:?}");
    assert!(
        status.next_seq[Channel::Orders.index()] as u64 > sent_before,
        "the new leader continued the sequence: {status:?}"
    );
    let sub = assert_books_match(node, target, stop, handle).await;
    let s = sub.sub.stats();
    assert_eq!(
        s.sequence_resets, 0,
        "the order log was never renumbered: {s:?}"
    );
    assert_eq!(s.book_errors, 0, "{s:?}");
    for (n, md) in nodes {
        md.stop();
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_of_a_node_hosted_publisher_ends_a_load_run_with_the_core_s_books() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, section) = subscriber();
    let config = config(dir.path(), section);
    let stop = Arc::new(AtomicBool::new(false));
    let target: Target = Arc::new(Mutex::new(None));
    let handle = run_subscriber(sub, Arc::clone(&stop), Arc::clone(&target));
    let nodes = start(&config).await;
    let mut client = Client::new(addrs(&config), 30, 1);
    let flow = Flow::new(flow_config(9));
    setup(&mut client, &flow).await;
    // Several clients at once, so entries carry batches of commands.
    let mut tasks = Vec::new();
    for k in 0..4u64 {
        let peers = addrs(&config);
        tasks.push(tokio::spawn(async move {
            let mut client = Client::new(peers, 40 + k, 1);
            let mut flow = Flow::new(flow_config(100 + k));
            // The setup was done once; this flow only draws orders from it.
            let _ = flow.setup();
            drive(&mut client, &mut flow, 600).await;
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    let refs: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    let leader = statuses.iter().find(|s| s.leader == Some(s.id)).unwrap().id;
    let (node, md) = nodes.iter().find(|(n, _)| n.id() == leader).unwrap();
    assert!(md.status().active);
    let sub = assert_books_match(node, target, stop, handle).await;
    assert_eq!(sub.sub.stats().book_errors, 0, "{:?}", sub.sub.stats());
    // Every replica numbered the order log alike, once each feed took every entry its node
    // applied (a feed runs on its own thread, behind its node's apply).
    feeds_agree(&nodes).await;
    for (n, md) in nodes {
        md.stop();
        n.shutdown().await;
    }
}

/// Stops one node and its feed (the feed first, as a crash stops both at once).
async fn stop_node(nodes: &mut Vec<(Node, MarketDataService)>, id: u64) {
    let position = nodes.iter().position(|(n, _)| n.id() == id).unwrap();
    let (node, md) = nodes.remove(position);
    md.stop();
    node.shutdown().await;
}

/// Restarts a node from its own directory (journal and snapshots) with its feed, and checks
/// that it came back from a snapshot: its committed stream does not reach back to index 1,
/// so its feed can only number packets from the replicated state's numbering.
async fn restart_from_snapshot(config: &ClusterConfig, id: u64) -> (Node, MarketDataService) {
    let node = Node::start(config, id).await.expect("node restarts");
    let md = MarketDataService::start(&node, config.marketdata.as_ref().unwrap())
        .expect("market data restarts");
    assert!(
        node.subscribe(1).is_err(),
        "node {id} restarted from a snapshot, so its stream starts after it"
    );
    (node, md)
}

fn leader_of(nodes: &[(Node, MarketDataService)]) -> Option<u64> {
    nodes
        .iter()
        .find_map(|(n, _)| n.raft().metrics().borrow().current_leader)
}

/// Waits (bounded) until every running node's feed numbers the order log alike and none is
/// detached; returns the order log's next MsgSeqNum.
async fn feeds_agree(nodes: &[(Node, MarketDataService)]) -> u32 {
    let started = Instant::now();
    loop {
        let statuses: Vec<_> = nodes.iter().map(|(_, md)| md.status()).collect();
        for s in &statuses {
            assert_eq!(s.detached, None, "{s:?}");
        }
        // A feed numbers an entry on its own thread after the node applied it, so equal
        // numbers mean nothing until every feed has taken every entry its node applied:
        // under load the three could agree on a number one entry short of the last.
        let mut caught_up = true;
        for ((node, _), s) in nodes.iter().zip(&statuses) {
            let applied = node.status().await.last_applied_index.unwrap_or(0);
            caught_up &= s.next_index > applied;
        }
        let seqs: Vec<u32> = statuses
            .iter()
            .map(|s| s.next_seq[Channel::Orders.index()])
            .collect();
        if caught_up && seqs.windows(2).all(|w| w[0] == w[1]) {
            return seqs[0];
        }
        assert!(
            started.elapsed() < CONVERGE_LIMIT,
            "feeds number differently: {statuses:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn snapshot_config(dir: &std::path::Path, section: MarketDataSection) -> ClusterConfig {
    let mut c = config(dir, section);
    // Snapshots every few hundred entries, so that a restarted node comes back from one.
    c.snapshot_every_entries = 100;
    c.validate().expect("valid configuration");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_from_a_snapshot_takes_over_the_feed_mid_stream_and_the_books_equal_the_core_s(
) {
    let dir = tempfile::tempdir().unwrap();
    let (sub, section) = subscriber();
    let config = snapshot_config(dir.path(), section);
    let stop = Arc::new(AtomicBool::new(false));
    let target: Target = Arc::new(Mutex::new(None));
    let handle = run_subscriber(sub, Arc::clone(&stop), Arc::clone(&target));
    let mut nodes = start(&config).await;
    let mut client = Client::new(addrs(&config), 21, 1);
    let mut flow = Flow::new(flow_config(7));
    setup(&mut client, &flow).await;
    drive(&mut client, &mut flow, 500).await;
    let refs: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    let leader = statuses.iter().find(|s| s.leader == Some(s.id)).unwrap().id;
    // Both followers restart, one after the other, from their snapshots.
    let followers: Vec<u64> = statuses
        .iter()
        .map(|s| s.id)
        .filter(|&id| id != leader)
        .collect();
    for id in followers {
        stop_node(&mut nodes, id).await;
        drive(&mut client, &mut flow, 100).await;
        nodes.push(restart_from_snapshot(&config, id).await);
        let refs: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
        converged(&refs, CONVERGE_LIMIT).await;
        feeds_agree(&nodes).await;
    }
    // A client keeps submitting while the leader, the last node with the whole history,
    // dies; a restarted node takes over the feed.
    let driver = {
        let peers = addrs(&config);
        tokio::spawn(async move {
            let mut client = Client::new(peers, 22, 1);
            let mut flow = Flow::new(flow_config(8));
            let _ = flow.setup();
            drive(&mut client, &mut flow, 800).await;
        })
    };
    let started = Instant::now();
    let sent_before = loop {
        assert!(started.elapsed() < CONVERGE_LIMIT, "no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (_, md) = nodes.iter().find(|(n, _)| n.id() == leader).unwrap();
        let s = md.status();
        assert!(s.active, "{s:?}");
        if s.entries_published >= 900 {
            break s.packets_sent[Channel::Orders.index()];
        }
    };
    stop_node(&mut nodes, leader).await;
    driver
        .await
        .expect("the client got every command acknowledged");
    let refs: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    let new_leader = statuses.iter().find(|s| s.leader == Some(s.id)).unwrap().id;
    assert_ne!(new_leader, leader);
    let (node, md) = nodes.iter().find(|(n, _)| n.id() == new_leader).unwrap();
    assert!(
        node.subscribe(1).is_err(),
        "the new leader has no full stream"
    );
    let status = md.status();
    assert!(status.active, "{status:?}");
    assert_eq!(status.detached, None);
    assert!(
        status.next_seq[Channel::Orders.index()] as u64 > sent_before,
        "the restarted node continued the sequence: {status:?}"
    );
    feeds_agree(&nodes).await;
    let sub = assert_books_match(node, target, stop, handle).await;
    let s = sub.sub.stats();
    assert_eq!(
        s.sequence_resets, 0,
        "the order log was never renumbered: {s:?}"
    );
    assert_eq!(s.book_errors, 0, "{s:?}");
    for (n, md) in nodes {
        md.stop();
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_of_every_node_the_feed_continues_its_numbering_and_the_books_equal_the_core_s(
) {
    let dir = tempfile::tempdir().unwrap();
    let (sub, section) = subscriber();
    let config = snapshot_config(dir.path(), section);
    let stop = Arc::new(AtomicBool::new(false));
    let target: Target = Arc::new(Mutex::new(None));
    let handle = run_subscriber(sub, Arc::clone(&stop), Arc::clone(&target));
    let mut nodes = start(&config).await;
    let mut client = Client::new(addrs(&config), 31, 1);
    let mut flow = Flow::new(flow_config(11));
    setup(&mut client, &flow).await;
    drive(&mut client, &mut flow, 600).await;
    let refs: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
    converged(&refs, CONVERGE_LIMIT).await;
    let seq_before = feeds_agree(&nodes).await;
    assert!(seq_before > 100, "the feed published: {seq_before}");
    // Every node stops, then every node starts again from its snapshot and log.
    while let Some(id) = nodes.first().map(|(n, _)| n.id()) {
        stop_node(&mut nodes, id).await;
    }
    for n in &config.nodes {
        nodes.push(restart_from_snapshot(&config, n.id).await);
    }
    let refs: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
    converged(&refs, CONVERGE_LIMIT).await;
    assert_eq!(
        feeds_agree(&nodes).await,
        seq_before,
        "the restarted feeds take the next MsgSeqNum where the group stopped"
    );
    let mut client = Client::new(addrs(&config), 32, 1);
    let mut flow = Flow::new(flow_config(12));
    let _ = flow.setup();
    drive(&mut client, &mut flow, 600).await;
    let refs: Vec<&Node> = nodes.iter().map(|(n, _)| n).collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    let leader = statuses.iter().find(|s| s.leader == Some(s.id)).unwrap().id;
    assert_eq!(leader_of(&nodes), Some(leader));
    let after = feeds_agree(&nodes).await;
    assert!(after > seq_before, "{after} after {seq_before}");
    let (node, md) = nodes.iter().find(|(n, _)| n.id() == leader).unwrap();
    assert!(md.status().active, "{:?}", md.status());
    let sub = assert_books_match(node, target, stop, handle).await;
    let s = sub.sub.stats();
    assert_eq!(
        s.sequence_resets, 0,
        "the order log was never renumbered: {s:?}"
    );
    assert_eq!(s.book_errors, 0, "{s:?}");
    for (n, md) in nodes {
        md.stop();
        n.shutdown().await;
    }
}

/// Waits (bounded) until every running feed has taken every entry its node applied and all
/// number every incremental channel alike; returns their statuses.
async fn feeds_caught_up_alike(
    nodes: &[(Node, MarketDataService)],
) -> Vec<bourse_cluster::marketdata::FeedStatus> {
    let started = Instant::now();
    loop {
        let statuses: Vec<_> = nodes.iter().map(|(_, md)| md.status()).collect();
        let mut caught_up = true;
        for ((node, _), s) in nodes.iter().zip(&statuses) {
            let applied = node.status().await.last_applied_index.unwrap_or(0);
            caught_up &= s.next_index > applied;
        }
        // The incremental channels; the loops follow each node's clock.
        let incremental = |s: &bourse_cluster::marketdata::FeedStatus| -> Vec<u32> {
            Channel::ALL
                .into_iter()
                .filter(|c| c.is_incremental())
                .map(|c| s.next_seq[c.index()])
                .collect()
        };
        if caught_up
            && statuses
                .windows(2)
                .all(|w| incremental(&w[0]) == incremental(&w[1]))
        {
            return statuses;
        }
        assert!(
            started.elapsed() < CONVERGE_LIMIT,
            "feeds number differently: {statuses:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until the leader proposed an idle flush after `proposed_before` and every
/// feed applied it, with nothing left to flush.
async fn idle_flushed(
    nodes: &[(Node, MarketDataService)],
    leader: u64,
    proposed_before: u64,
) -> Vec<bourse_cluster::marketdata::FeedStatus> {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let statuses = feeds_caught_up_alike(nodes).await;
        let (_, md) = nodes.iter().find(|(n, _)| n.id() == leader).unwrap();
        let proposed = md.status().idle_flushes_proposed;
        let flushes: Vec<u64> = statuses.iter().map(|s| s.idle_flushes).collect();
        if proposed > proposed_before && flushes.iter().all(|&f| f > 0 && f == flushes[0]) {
            return statuses;
        }
        assert!(
            started.elapsed() < CONVERGE_LIMIT,
            "no idle flush applied: {statuses:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_1ms_mode_the_new_leader_continues_the_old_leader_s_numbering_across_an_idle_flush() {
    let dir = tempfile::tempdir().unwrap();
    let (sub, mut section) = subscriber();
    for c in ["orders", "trades", "book", "statistics"] {
        section.modes.insert(c.to_string(), "1ms".to_string());
    }
    let config = config(dir.path(), section);
    let stop = Arc::new(AtomicBool::new(false));
    let target: Target = Arc::new(Mutex::new(None));
    let handle = run_subscriber(sub, Arc::clone(&stop), Arc::clone(&target));
    let mut nodes = start(&config).await;
    let mut client = Client::new(addrs(&config), 51, 1);
    let mut flow = Flow::new(flow_config(13));
    setup(&mut client, &flow).await;
    drive(&mut client, &mut flow, 300).await;
    let leader = leader_of(&nodes).expect("a leader");
    // The flow pauses: the leader proposes the idle flush, every replica applies it.
    let before = idle_flushed(&nodes, leader, 0).await;
    let seq_before = before[0].next_seq;
    stop_node(&mut nodes, leader).await;
    drive(&mut client, &mut flow, 300).await;
    let new_leader = leader_of(&nodes).expect("a new leader");
    assert_ne!(new_leader, leader);
    let after = idle_flushed(&nodes, new_leader, 0).await;
    for c in Channel::ALL.into_iter().filter(|c| c.is_incremental()) {
        assert!(
            after[0].next_seq[c.index()] >= seq_before[c.index()],
            "{c:?}: {after:?}"
        );
    }
    assert!(after[0].next_seq[Channel::Orders.index()] > seq_before[Channel::Orders.index()]);
    let (node, _) = nodes.iter().find(|(n, _)| n.id() == new_leader).unwrap();
    let sub = assert_books_match(node, target, stop, handle).await;
    let s = sub.sub.stats();
    // The failover happened with nothing pending (after an idle flush every replica
    // applied), so the subscriber sees one sequence per channel: no gap to replay, no
    // renumbering, no RptSeq jump.
    assert_eq!(s.sequence_resets, 0, "{s:?}");
    assert_eq!(s.gaps_detected, 0, "{s:?}");
    assert_eq!(s.gaps_skipped, 0, "{s:?}");
    assert_eq!(s.rpt_gaps, 0, "{s:?}");
    assert_eq!(s.book_errors, 0, "{s:?}");
    for (n, md) in nodes {
        md.stop();
        n.shutdown().await;
    }
}
