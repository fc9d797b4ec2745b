//! What a process that hosts replica nodes needs around them: the allocator's tuning and the
//! node's status in the monitor's plain form.

use bourse_cluster::net::NodeStatus as ClusterStatus;
use bourse_monitor::node::{role_of, NodeSample};

/// Tunes glibc's allocator for a node: its per-thread arenas otherwise give freed memory back
/// to the kernel and take it again over and over, an `mprotect` system call each time (27,500
/// in two seconds of `bench cluster` at 100k commands/s, about three per batch, each a change
/// of the page tables that every core running the process must see). Keeping up to 256 MiB of
/// free memory per arena and growing an arena 64 MiB at a time took that count to zero.
/// Process-wide: called by the subcommands that host nodes, before they start any.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune_allocator() {
    const ALLOCATOR_TRIM_THRESHOLD_BYTES: i32 = 256 * 1024 * 1024;
    const ALLOCATOR_TOP_PAD_BYTES: i32 = 64 * 1024 * 1024;
    // glibc's mallopt parameters (malloc.h).
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_TOP_PAD: i32 = -2;
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    // SAFETY: mallopt only sets the allocator's parameters (glibc takes its own lock); it is
    // called before the node's threads start.
    unsafe {
        mallopt(M_TRIM_THRESHOLD, ALLOCATOR_TRIM_THRESHOLD_BYTES);
        mallopt(M_TOP_PAD, ALLOCATOR_TOP_PAD_BYTES);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune_allocator() {}

/// The cluster crate's status in the monitor's plain form.
pub fn sample_of(s: &ClusterStatus) -> NodeSample {
    NodeSample {
        id: s.id,
        role: Some(role_of(&s.state)),
        term: s.term,
        leader: s.leader,
        last_log_index: s.last_log_index,
        last_applied_index: s.last_applied_index,
        snapshot_index: s.snapshot_index,
        state_hash: s.state_hash,
        commands_applied: s.commands_applied,
        hash_checks_passed: s.hash_checks_passed,
        matched: s.matched.clone(),
        alarm: s.alarm.clone(),
        checkpoint: s.checkpoint,
        commit_index: s.commit_index,
        quorum_lost_ms: s.quorum_lost_ms,
        no_quorum_refusals: s.no_quorum_refusals,
        unconfirmed_refusals: s.unconfirmed_refusals,
    }
}
