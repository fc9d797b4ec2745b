//! Scenarios with a fixed shape: what pre-vote, the lease and recovery promise.

use bourse_consensus::{LogStore, Role};

use crate::sim::{Faults, Fsync, Sim};

/// Runs until a leader is followed by everyone; returns (leader, term).
fn settle(sim: &mut Sim) -> (u64, u64) {
    for _ in 0..2000 {
        sim.step();
        if let Some(l) = sim.leader() {
            let term = sim.core(l).soft_state().term;
            if sim
                .nodes
                .iter()
                .all(|n| n.core.as_ref().unwrap().soft_state().leader == Some(l))
            {
                return (l, term);
            }
        }
    }
    panic!("no stable leader");
}

#[test]
fn a_node_cut_off_and_returning_does_not_disturb_the_leader() {
    for seed in 1..=20 {
        for voters in [3, 5] {
            let mut sim = Sim::new(seed, voters, Faults::none());
            let (leader, term) = settle(&mut sim);
            let lonely = if leader == 1 { 2 } else { 1 };
            sim.isolate(lonely);
            // Many of its election timeouts: it asks for pre-votes that never arrive, and
            // never raises its own term.
            for _ in 0..1000 {
                sim.step();
            }
            assert_eq!(
                sim.core(lonely).soft_state().term,
                term,
                "seed {seed}: a pre-vote raises no term"
            );
            assert_ne!(sim.core(lonely).soft_state().role, Role::Leader);
            sim.heal();
            for _ in 0..1000 {
                sim.step();
                for n in &sim.nodes {
                    let s = n.core.as_ref().unwrap().soft_state();
                    assert_eq!(
                        s.term, term,
                        "seed {seed}: node {}'s term rose after the return",
                        n.id
                    );
                }
            }
            assert_eq!(sim.leader(), Some(leader), "seed {seed}: the leader stays");
            assert_eq!(
                sim.core(lonely).soft_state().leader,
                Some(leader),
                "seed {seed}: the returned node follows it"
            );
            assert!(
                sim.core(lonely).commit_index()
                    >= sim.core(leader).commit_index().saturating_sub(8)
            );
        }
    }
}

#[test]
fn an_isolated_leader_stops_claiming_leadership_within_its_lease() {
    for seed in 1..=20 {
        let mut sim = Sim::new(seed, 3, Faults::none());
        let (leader, term) = settle(&mut sim);
        let lease_ticks = sim.core(leader).config().lease_ticks;
        sim.isolate(leader);
        let mut ticks = 0;
        while sim.core(leader).soft_state().role == Role::Leader {
            sim.step();
            ticks += 1;
            assert!(
                ticks <= lease_ticks,
                "seed {seed}: still leading {ticks} ticks after isolation (lease {lease_ticks})"
            );
        }
        assert_eq!(
            sim.core(leader).soft_state().term,
            term,
            "stepping down raises no term"
        );
        // The others elect a new leader in a later term, and the old one follows it on return.
        for _ in 0..400 {
            sim.step();
        }
        let new = sim.leader().expect("the majority elects");
        assert_ne!(new, leader);
        sim.heal();
        for _ in 0..200 {
            sim.step();
        }
        assert_eq!(
            sim.core(leader).soft_state().leader,
            Some(new),
            "seed {seed}"
        );
        sim.check_converged();
    }
}

#[test]
fn a_paused_leader_returning_follows_the_new_one_and_loses_nothing_committed() {
    for seed in 1..=20 {
        let mut sim = Sim::new(seed, 3, Faults::none());
        let (leader, _) = settle(&mut sim);
        for _ in 0..100 {
            sim.step();
        }
        let committed_before = sim.max_commit();
        let i = (leader - 1) as usize;
        sim.nodes[i].paused = true;
        for _ in 0..400 {
            sim.step();
        }
        let new = sim.leader().expect("the others elect");
        assert_ne!(new, leader);
        sim.nodes[i].paused = false;
        for _ in 0..300 {
            sim.step();
        }
        assert_eq!(
            sim.core(leader).soft_state().leader,
            Some(new),
            "seed {seed}"
        );
        assert!(sim.max_commit() > committed_before);
        sim.check_converged();
    }
}

#[test]
fn a_group_without_faults_elects_once_and_commits_every_proposal() {
    for voters in [1, 3, 5] {
        let mut sim = Sim::new(7, voters, Faults::none());
        for _ in 0..2000 {
            sim.step();
        }
        assert_eq!(
            sim.stats.elections, 1,
            "{voters} nodes: one election when nothing fails"
        );
        // Every proposal was taken and all but the last few ticks' are applied everywhere.
        assert!(
            sim.max_commit() + 16 >= sim.proposed,
            "{voters} nodes: committed {} of {}",
            sim.max_commit(),
            sim.proposed
        );
        sim.check_converged();
    }
}

#[test]
fn a_follower_restarting_with_less_than_it_acknowledged_is_caught_up_by_the_same_leader() {
    let mut reverted = 0;
    for seed in 1..=20 {
        let mut faults = Faults::none();
        faults.fsync = Fsync::Never;
        let mut sim = Sim::new(seed, 3, faults);
        // Nothing is written back on its own: only the syncs below.
        sim.never_sync_every_ticks = u64::MAX;
        let (leader, term) = settle(&mut sim);
        let follower = if leader == 1 { 2 } else { 1 };
        let other = 6 - leader - follower;
        sim.sync(follower);
        for _ in 0..60 {
            sim.step();
        }
        // The follower acknowledged entries it never synced; the other two hold them durably.
        let acked = sim.core(leader).progress(follower).unwrap().match_index;
        let synced = sim.nodes[(follower - 1) as usize]
            .durable_log
            .last_log_id()
            .index;
        assert!(
            acked > synced,
            "seed {seed}: acknowledged {acked}, synced {synced}"
        );
        for _ in 0..6 {
            sim.step();
        }
        sim.sync(leader);
        sim.sync(other);
        sim.crash_losing(follower);
        sim.restart(follower);
        let restarted_last = sim.core(follower).last_log_id().index;
        if restarted_last < sim.core(leader).progress(follower).unwrap().match_index {
            reverted += 1;
        }
        for _ in 0..200 {
            sim.step();
        }
        assert_eq!(sim.leader(), Some(leader), "seed {seed}: the same leader");
        assert_eq!(
            sim.core(leader).soft_state().term,
            term,
            "seed {seed}: no election"
        );
        let commit = sim.core(leader).commit_index();
        assert!(
            sim.core(follower).commit_index() + 16 >= commit,
            "seed {seed}: the follower caught up"
        );
        assert!(
            sim.core(leader).progress(follower).unwrap().match_index + 16 >= commit,
            "seed {seed}: its match found again"
        );
        sim.check_converged();
    }
    assert!(
        reverted >= 15,
        "the follower's log was shorter than its acknowledged match in {reverted} of 20 runs"
    );
}
