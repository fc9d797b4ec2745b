//! Pre-vote (issue 21): a follower cut off from the others for many election timeouts asks
//! for pre-votes, gets none, and so does not raise its term; when the partition heals it
//! rejoins under the leader it left, which keeps leading in the same term.
//!
//! Three real nodes on the simulated network (`bourse_cluster::sim`) in one current-thread
//! runtime with a paused clock, so "many election timeouts" is virtual time and the run is a
//! function of its seed; every wait is on a condition, with a virtual-time hang guard.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bourse_cluster::sim::{seed_thread_rng, Rates, Sim};
use bourse_cluster::{ClusterConfig, FsyncSetting, Node, NodeId};

/// How long (virtual time) the follower stays cut off: dozens of election timeouts.
const PARTITION: Duration = Duration::from_secs(10);
/// How long (virtual time) the group runs after the partition heals.
const AFTER_HEAL: Duration = Duration::from_secs(5);
/// The most virtual time a leader may take to appear.
const LEADER_WAIT_LIMIT: Duration = Duration::from_secs(60);

const MEMBERS: [NodeId; 3] = [1, 2, 3];

fn config(dir: &Path) -> ClusterConfig {
    let mut config = ClusterConfig::local(9, dir.to_path_buf(), [0, 0, 0]);
    // Peers talk through the simulated network; the client ports are bound, never dialled.
    for (i, n) in config.nodes.iter_mut().enumerate() {
        n.addr = format!("127.0.0.{}:9", i + 1);
        n.listen = Some(format!("127.0.0.{}:0", i + 1));
    }
    config.fsync = FsyncSetting::Never;
    config
}

/// What each node believes: (term, leader).
fn views(nodes: &BTreeMap<NodeId, Node>) -> BTreeMap<NodeId, (u64, Option<NodeId>)> {
    nodes
        .iter()
        .map(|(id, n)| {
            let m = n.raft().metrics();
            let m = m.borrow();
            (*id, (m.current_term, m.current_leader))
        })
        .collect()
}

/// The leader every node agrees on, if they all agree.
fn agreed_leader(nodes: &BTreeMap<NodeId, Node>) -> Option<(NodeId, u64)> {
    let v = views(nodes);
    let (term, leader) = *v.values().next()?;
    let leader = leader?;
    v.values()
        .all(|&(t, l)| t == term && l == Some(leader))
        .then_some((leader, term))
}

/// What the scenario saw: the leader and term before, the cut-off follower's highest term
/// while cut off, and every node's view at the end.
struct Seen {
    leader: NodeId,
    term: u64,
    follower: NodeId,
    follower_term_max: u64,
    after: BTreeMap<NodeId, (u64, Option<NodeId>)>,
}

async fn cut_off_a_follower_then_heal(dir: &Path, seed: u64) -> Seen {
    let config = config(dir);
    let sim = Sim::new(seed);
    sim.set_rates(Rates::default());
    let mut nodes = BTreeMap::new();
    for id in MEMBERS {
        // Out of phase, as real nodes start (see the simulation test).
        tokio::time::sleep(Duration::from_millis(1 + sim.draw_below(75))).await;
        let node = Node::start_with_network(&config, id, sim.network(id))
            .await
            .expect("node starts");
        sim.node_up(id, node.raft().clone());
        nodes.insert(id, node);
    }
    let started = tokio::time::Instant::now();
    let (leader, term) = loop {
        if let Some(found) = agreed_leader(&nodes) {
            break found;
        }
        assert!(
            started.elapsed() < LEADER_WAIT_LIMIT,
            "no leader: {:?}",
            views(&nodes)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let follower = *MEMBERS
        .iter()
        .find(|&&id| id != leader)
        .expect("a follower");
    sim.partition(&[follower], &MEMBERS);
    let cut_at = tokio::time::Instant::now();
    let mut follower_term_max = 0;
    while cut_at.elapsed() < PARTITION {
        tokio::time::sleep(Duration::from_millis(10)).await;
        follower_term_max = follower_term_max.max(views(&nodes)[&follower].0);
    }
    sim.heal();
    tokio::time::sleep(AFTER_HEAL).await;
    let after = views(&nodes);
    for (_, node) in nodes {
        node.shutdown().await;
    }
    Seen {
        leader,
        term,
        follower,
        follower_term_max,
        after,
    }
}

fn run(seed: u64) -> Seen {
    let dir = tempfile::tempdir().expect("temp dir");
    seed_thread_rng(seed);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(cut_off_a_follower_then_heal(dir.path(), seed))
}

#[test]
fn a_cut_off_follower_does_not_raise_its_term() {
    for seed in [1, 2, 3] {
        let seen = run(seed);
        assert_eq!(
            seen.follower_term_max, seen.term,
            "seed {seed}: node {} raised its term while cut off",
            seen.follower
        );
        assert_eq!(
            seen.after[&seen.follower].0, seen.term,
            "seed {seed}: node {} rejoined in another term",
            seen.follower
        );
    }
}

#[test]
fn after_the_partition_heals_the_leader_keeps_leading_in_the_same_term() {
    for seed in [4, 5, 6] {
        let seen = run(seed);
        for (id, view) in &seen.after {
            assert_eq!(
                *view,
                (seen.term, Some(seen.leader)),
                "seed {seed}: node {id} after the heal (the follower cut off was {})",
                seen.follower
            );
        }
    }
}
