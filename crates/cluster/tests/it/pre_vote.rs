//! Leadership changes (issue 21). Pre-vote: a follower cut off from the others for many
//! election timeouts asks for pre-votes, gets none, and so does not raise its term; when the
//! partition heals it rejoins under the leader it left, which keeps leading in the same term.
//! A leader cut off: it refuses requests for want of a quorum once its lease has passed,
//! while the other two elect a leader that refuses requests as unconfirmed (not "not the
//! leader", which would send clients elsewhere) until a quorum has acknowledged it, and takes
//! them from then on. A leader lost: the lower-ranked survivor succeeds it in the next
//! term, without a split vote; if that survivor's log is shorter, the other stands at once.
//!
//! Three real nodes on the simulated network (`bourse_cluster::sim`) in one current-thread
//! runtime with a paused clock, so "many election timeouts" is virtual time and the run is a
//! function of its seed; every wait is on a condition, with a virtual-time hang guard.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bourse_cluster::net::SubmitError;
use bourse_cluster::sim::{seed_thread_rng, Rates, Sim};
use bourse_cluster::{ClusterConfig, FsyncSetting, LogCommand, Node, NodeId};

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

/// What one node believes: (term, leader).
fn views_of(node: &Node) -> (u64, Option<NodeId>) {
    let m = node.raft().metrics();
    let m = m.borrow();
    (m.current_term, m.current_leader)
}

/// What each node believes: (term, leader).
fn views(nodes: &BTreeMap<NodeId, Node>) -> BTreeMap<NodeId, (u64, Option<NodeId>)> {
    nodes.iter().map(|(id, n)| (*id, views_of(n))).collect()
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
    let (nodes, leader, term) = start_group(&config, &sim).await;
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

/// Starts the three nodes on `sim` and waits for a leader they agree on.
async fn start_group(config: &ClusterConfig, sim: &Sim) -> (BTreeMap<NodeId, Node>, NodeId, u64) {
    let mut nodes = BTreeMap::new();
    for id in MEMBERS {
        // Out of phase, as real nodes start (see the simulation test).
        tokio::time::sleep(Duration::from_millis(1 + sim.draw_below(75))).await;
        let node = Node::start_with_network(config, id, sim.network(id))
            .await
            .expect("node starts");
        sim.node_up(id, node.raft().clone());
        nodes.insert(id, node);
    }
    let (leader, term) = wait_for_leader(&nodes).await;
    (nodes, leader, term)
}

/// Waits for a leader every node agrees on.
async fn wait_for_leader(nodes: &BTreeMap<NodeId, Node>) -> (NodeId, u64) {
    let started = tokio::time::Instant::now();
    loop {
        if let Some(found) = agreed_leader(nodes) {
            return found;
        }
        assert!(
            started.elapsed() < LEADER_WAIT_LIMIT,
            "no leader: {:?}",
            views(nodes)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the cut-off-leader scenario saw.
struct LeaderCut {
    /// What the new leader said, in order, each change once, from the moment it knew it led.
    new_leader_said: Vec<Option<SubmitError>>,
    /// What the old leader said once the other two had elected.
    old_leader_said: Option<SubmitError>,
    /// The old leader's lease: how long it may go without a quorum before it refuses.
    old_lease_ms: u64,
}

/// What a leader's loss led to: the old leader and term, and the successor both survivors
/// agreed on with its term, and how long (virtual) that took.
#[derive(Debug)]
struct Succession {
    old: (NodeId, u64),
    new: (NodeId, u64),
    elected_after: Duration,
}

/// A simulated network on which every message takes 1 to `1 + delay_ms_max` ms each way.
fn sim_with_delay(seed: u64, delay_ms_max: u64) -> Sim {
    let sim = Sim::new(seed);
    sim.set_rates(Rates {
        delay_ms_max,
        ..Rates::default()
    });
    sim
}

/// Cuts `old` off both ways and waits for the others to agree on a successor.
async fn cut_off_and_wait_for_a_successor(
    sim: &Sim,
    nodes: &BTreeMap<NodeId, Node>,
    (old, term): (NodeId, u64),
) -> Succession {
    sim.partition(&[old], &MEMBERS);
    let cut_at = tokio::time::Instant::now();
    loop {
        let views: BTreeMap<NodeId, (u64, Option<NodeId>)> = nodes
            .iter()
            .filter(|(id, _)| **id != old)
            .map(|(id, n)| (*id, views_of(n)))
            .collect();
        let mut agreed = views.values();
        let &(new_term, leader) = agreed.next().expect("two survivors");
        if agreed.all(|v| *v == (new_term, leader)) && leader.is_some_and(|l| l != old) {
            return Succession {
                old: (old, term),
                new: (leader.expect("a leader"), new_term),
                elected_after: cut_at.elapsed(),
            };
        }
        assert!(
            cut_at.elapsed() < LEADER_WAIT_LIMIT,
            "no successor: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// On a network with 1-2 ms latency, cuts the leader off both ways (as a lost machine looks
/// to the others) and waits for the two others to agree on a successor; then heals, and does
/// the same to the successor.
async fn lose_the_leader_twice(dir: &Path, seed: u64) -> Vec<Succession> {
    let config = config(dir);
    let sim = sim_with_delay(seed, 1);
    let (nodes, mut leader, mut term) = start_group(&config, &sim).await;
    let mut successions = Vec::new();
    for _ in 0..2 {
        let succession = cut_off_and_wait_for_a_successor(&sim, &nodes, (leader, term)).await;
        (leader, term) = succession.new;
        successions.push(succession);
        sim.heal();
        // The old leader rejoins under its successor before the next loss.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for (_, node) in nodes {
        node.shutdown().await;
    }
    successions
}

/// On a network with 1-2 ms latency: cuts the leader's link to the lower-ranked follower,
/// commits a few entries through the other, then cuts the leader off entirely. Returns the
/// succession and the follower that holds the longer log.
async fn lose_the_leader_after_a_lagging_follower(dir: &Path, seed: u64) -> (Succession, NodeId) {
    let config = config(dir);
    let sim = sim_with_delay(seed, 1);
    let (nodes, old, term) = start_group(&config, &sim).await;
    let mut survivors = MEMBERS.iter().copied().filter(|&id| id != old);
    let (lagging, longer) = (
        survivors.next().expect("two"),
        survivors.next().expect("two"),
    );
    sim.partition(&[old], &[old, lagging]);
    for now_ns in 1..=3 {
        nodes[&old]
            .raft()
            .client_write(LogCommand::MarketDataFlush { now_ns })
            .await
            .expect("committed by the leader and the other follower");
    }
    let succession = cut_off_and_wait_for_a_successor(&sim, &nodes, (old, term)).await;
    for (_, node) in nodes {
        node.shutdown().await;
    }
    (succession, longer)
}

/// Cuts the leader off both ways and watches, at every virtual half-millisecond, what the
/// node that becomes leader would answer a client.
async fn cut_off_the_leader(dir: &Path, seed: u64) -> LeaderCut {
    let config = config(dir);
    // Every message takes 1-21 ms each way, so a new leader's first quorum is a round trip
    // (or more) after its election.
    let sim = sim_with_delay(seed, 20);
    let (nodes, old, _) = start_group(&config, &sim).await;
    sim.partition(&[old], &MEMBERS);
    let cut_at = tokio::time::Instant::now();
    let mut new_leader_said: Vec<Option<SubmitError>> = Vec::new();
    let mut new = None;
    // Until the new leader has taken requests for a while.
    while new_leader_said.last() != Some(&None) || new.is_none() {
        assert!(
            cut_at.elapsed() < LEADER_WAIT_LIMIT,
            "no new leader took requests: {:?}, said {new_leader_said:?}",
            views(&nodes)
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
        let leading = nodes.iter().find(|(id, n)| {
            **id != old && n.raft().metrics().borrow().current_leader == Some(**id)
        });
        let Some((id, node)) = leading else { continue };
        assert!(new.is_none() || new == Some(*id), "two new leaders");
        new = Some(*id);
        let said = node.refusal();
        if new_leader_said.last() != Some(&said) || new_leader_said.is_empty() {
            new_leader_said.push(said);
        }
    }
    // The old leader hears from no quorum for longer than the election timeout by now (the
    // others needed longer than that to elect).
    let old_leader_said = nodes[&old].refusal();
    for (_, node) in nodes {
        node.shutdown().await;
    }
    LeaderCut {
        new_leader_said,
        old_leader_said,
        old_lease_ms: config.election_window_ms(old).1,
    }
}

fn runtime(seed: u64) -> tokio::runtime::Runtime {
    seed_thread_rng(seed);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

fn run(seed: u64) -> Seen {
    let dir = tempfile::tempdir().expect("temp dir");
    runtime(seed).block_on(cut_off_a_follower_then_heal(dir.path(), seed))
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

#[test]
fn a_new_leader_refuses_as_unconfirmed_until_a_quorum_acknowledges_it() {
    for seed in [7, 8, 9] {
        let dir = tempfile::tempdir().expect("temp dir");
        let seen = runtime(seed).block_on(cut_off_the_leader(dir.path(), seed));
        assert_eq!(
            seen.new_leader_said,
            vec![Some(SubmitError::LeaderUnconfirmed), None],
            "seed {seed}: the new leader's answers from its election on"
        );
        assert!(
            matches!(seen.old_leader_said, Some(SubmitError::NoQuorum { quorum_ack_ms_ago }) if quorum_ack_ms_ago > seen.old_lease_ms),
            "seed {seed}: the old leader said {:?}",
            seen.old_leader_said
        );
    }
}

/// The survivors of a leader's loss draw their election timeouts from disjoint slots
/// (`ClusterConfig::election_window_ms`), so the lower-ranked one asks first and is elected
/// in the next term: no split vote, which cost another timeout when both drew from one range.
/// Losing the leader twice makes both lower ranks win once.
#[test]
fn a_lost_leader_is_succeeded_by_the_lower_ranked_survivor_in_the_next_term() {
    for seed in 10..30 {
        let dir = tempfile::tempdir().expect("temp dir");
        let seen = runtime(seed).block_on(lose_the_leader_twice(dir.path(), seed));
        for s in &seen {
            let (old, term) = s.old;
            let lower = *MEMBERS.iter().find(|&&id| id != old).expect("a survivor");
            assert_eq!(s.new, (lower, term + 1), "seed {seed}: {seen:?}");
            // Virtual time, so a function of the seed: the successor's lease and timeout
            // (at most twice its slot's top) after the last heartbeat (at most one interval
            // before the cut), and a tick and a round trip or two (50 ms).
            let (_, top_ms) = config(dir.path()).election_window_ms(lower);
            let bound = Duration::from_millis(2 * top_ms + 50 + 50);
            assert!(
                s.elected_after <= bound,
                "seed {seed}: over {bound:?}: {seen:?}"
            );
        }
        let winners: Vec<NodeId> = seen.iter().map(|s| s.new.0).collect();
        assert_eq!(winners.len(), 2, "seed {seed}: {seen:?}");
        assert_ne!(winners[0], winners[1], "seed {seed}: {seen:?}");
    }
}

/// The lower-ranked survivor asks first, but its log is shorter: the other refuses it and, its
/// own lease over, runs its own pre-vote at once (`answer_pre_vote`) instead of waiting for its
/// slot, so it is elected in the next term before its own timer could have fired.
#[test]
fn a_survivor_with_the_longer_log_stands_when_it_refuses_a_shorter_one() {
    for seed in 30..40 {
        let dir = tempfile::tempdir().expect("temp dir");
        let (seen, longer) =
            runtime(seed).block_on(lose_the_leader_after_a_lagging_follower(dir.path(), seed));
        let (_, term) = seen.old;
        assert_eq!(seen.new, (longer, term + 1), "seed {seed}: {seen:?}");
        // Its own timer: its lease and at least its slot's bottom after the last heartbeat,
        // which it heard at the cut at the earliest.
        let (bottom_ms, top_ms) = config(dir.path()).election_window_ms(longer);
        let own_timer = Duration::from_millis(top_ms + bottom_ms);
        assert!(
            seen.elected_after < own_timer,
            "seed {seed}: {seen:?}, own timer {own_timer:?}"
        );
    }
}
