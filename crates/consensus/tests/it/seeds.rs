//! Random runs: each seed drives a group through faults for a few thousand ticks with every
//! safety property checked after every tick, then heals it and requires a leader and a new
//! commit within a bounded number of ticks.
//!
//! `BOURSE_CONSENSUS_SEEDS=N` runs N seeds per case instead of the few CI runs (from
//! `BOURSE_CONSENSUS_SEEDS_FROM`, 1 by default);
//! `BOURSE_CONSENSUS_SEED=S` runs that one seed (to replay a failure).

use crate::sim::{Faults, Fsync, Sim};

const SEEDS_CI: u64 = 12;
const STEPS: u64 = 3000;
/// Heal to a new commit applied everywhere: a few election slots, a snapshot round and the
/// catch-up of a node that was far behind, with room to spare.
const RECOVERY_TICKS_MAX: u64 = 600;

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("BOURSE_CONSENSUS_SEED") {
        return vec![s.parse().expect("BOURSE_CONSENSUS_SEED is a number")];
    }
    let count = std::env::var("BOURSE_CONSENSUS_SEEDS").map_or(SEEDS_CI, |s| {
        s.parse().expect("BOURSE_CONSENSUS_SEEDS is a number")
    });
    // A long run split in parts starts each part where the last ended.
    let first = std::env::var("BOURSE_CONSENSUS_SEEDS_FROM").map_or(1, |s| {
        s.parse().expect("BOURSE_CONSENSUS_SEEDS_FROM is a number")
    });
    (first..first + count).collect()
}

fn run(voters: usize, fsync: Fsync, salt: u64) {
    let mut recovery_max = 0;
    let mut totals = crate::sim::Stats::default();
    let seeds = seeds();
    for &seed in &seeds {
        // Seeds differ in how often things break: a quarter run with four times the
        // partitions, crashes and pauses, where the rarer interleavings show up.
        let mut faults = Faults::harsh(fsync);
        let storm = 1 + seed % 4;
        faults.partition_per_mille *= storm;
        faults.crash_per_mille *= storm;
        faults.pause_per_mille *= storm;
        let mut sim = Sim::new(seed * 16 + salt, voters, faults);
        for _ in 0..STEPS {
            sim.step();
        }
        sim.heal_all();
        let ticks = sim.ticks_to_recover(RECOVERY_TICKS_MAX);
        sim.check_converged();
        recovery_max = recovery_max.max(ticks);
        totals.committed += sim.stats.committed;
        totals.crashes += sim.stats.crashes;
        totals.lossy_crashes += sim.stats.lossy_crashes;
        totals.elections += sim.stats.elections;
        totals.snapshots_installed += sim.stats.snapshots_installed;
        totals.delivered += sim.stats.delivered;
    }
    eprintln!(
        "{voters} nodes, fsync {fsync:?}: {} seeds, committed {}, elections {}, crashes {} (lossy {}), snapshots installed {}, messages {}, recovery at most {recovery_max} ticks",
        seeds.len(),
        totals.committed,
        totals.elections,
        totals.crashes,
        totals.lossy_crashes,
        totals.snapshots_installed,
        totals.delivered
    );
    assert!(totals.committed > 0, "the runs committed something");
}

#[test]
fn three_nodes_fsync_always() {
    run(3, Fsync::Always, 1);
}

#[test]
fn three_nodes_fsync_batch() {
    run(3, Fsync::Batch, 2);
}

#[test]
fn three_nodes_fsync_never() {
    run(3, Fsync::Never, 3);
}

#[test]
fn five_nodes_fsync_always() {
    run(5, Fsync::Always, 4);
}

#[test]
fn five_nodes_fsync_never() {
    run(5, Fsync::Never, 5);
}
