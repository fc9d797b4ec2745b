//! The cluster view (nodes, leader, term, commit index, health) and alert evaluation.
//!
//! The cluster crate reports each node's status (its own and what it learns of its peers) with
//! [`ClusterView::report`]; the view stamps the report's arrival, derives replication lag as
//! the highest commit index minus the node's applied index, exports gauges, and tells the
//! dashboard which nodes are down (silent past the threshold) and whether replicas disagree
//! on the state hash at the same log index (nodes report their newest hash checkpoint).

use crate::metrics::Registry;
use crate::names;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// Nodes a view tracks at most.
pub const NODES_MAX: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    /// One node with no replication (the demo today).
    Standalone,
    /// A member the view expects (from the configuration) that has not reported yet.
    Unknown,
}

/// What a node says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: u64,
    pub role: Role,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// A state hash of the core, when known: at `hash_index` if set, else at `applied_index`.
    pub state_hash: Option<u64>,
    /// The log index `state_hash` was taken at (a node's newest hash checkpoint, the same
    /// indexes on every replica), so that replicas are compared at one index.
    #[serde(default)]
    pub hash_index: Option<u64>,
}

/// A node as the dashboard shows it.
#[derive(Clone, Debug, Serialize)]
pub struct NodeView {
    #[serde(flatten)]
    pub status: NodeStatus,
    pub lag_entries: u64,
    pub last_seen_ms: u64,
    pub up: bool,
    pub state_hash_hex: Option<String>,
    /// The node's own divergence alarm (it stopped on a state hash mismatch), if raised.
    pub alarm: Option<String>,
    /// A leader refusing commands for want of a quorum: ms since one last acknowledged it.
    pub quorum_lost_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ClusterSnapshot {
    pub nodes: Vec<NodeView>,
    pub leader: Option<u64>,
    pub term: u64,
    pub commit_index: u64,
    /// Largest lag of any node, in log entries; `None` when there is nothing to replicate to.
    pub replication_lag_entries: Option<u64>,
    /// Nodes whose hash differs from another node's at the same applied index.
    pub hash_mismatch: Vec<u64>,
}

struct Entry {
    status: NodeStatus,
    seen: Instant,
    /// (applied index, hash) pairs kept for comparison: the last few per node.
    hashes: Vec<(u64, u64)>,
    alarm: Option<String>,
    quorum_lost_ms: Option<u64>,
}

const HASHES_KEPT_PER_NODE: usize = 16;

#[derive(Default)]
pub struct ClusterView {
    nodes: Mutex<BTreeMap<u64, Entry>>,
}

impl ClusterView {
    pub fn report(&self, status: NodeStatus) {
        let Ok(mut nodes) = self.nodes.lock() else {
            return;
        };
        if !nodes.contains_key(&status.id) && nodes.len() >= NODES_MAX {
            return;
        }
        let e = nodes.entry(status.id).or_insert_with(|| Entry {
            status: status.clone(),
            seen: Instant::now(),
            hashes: Vec::new(),
            alarm: None,
            quorum_lost_ms: None,
        });
        if let Some(h) = status.state_hash {
            let index = status.hash_index.unwrap_or(status.applied_index);
            if !e.hashes.iter().any(|x| x.0 == index) {
                if e.hashes.len() >= HASHES_KEPT_PER_NODE {
                    e.hashes.remove(0);
                }
                e.hashes.push((index, h));
            }
        }
        e.status = status;
        e.seen = Instant::now();
    }

    /// Adds members known from a configuration before they report, so that a member that
    /// never answers shows as down once the threshold passes (counted from now).
    pub fn expect(&self, ids: &[u64]) {
        let Ok(mut nodes) = self.nodes.lock() else {
            return;
        };
        for &id in ids {
            if nodes.len() >= NODES_MAX {
                break;
            }
            nodes.entry(id).or_insert_with(|| Entry {
                status: NodeStatus {
                    id,
                    role: Role::Unknown,
                    term: 0,
                    commit_index: 0,
                    applied_index: 0,
                    state_hash: None,
                    hash_index: None,
                },
                seen: Instant::now(),
                hashes: Vec::new(),
                alarm: None,
                quorum_lost_ms: None,
            });
        }
    }

    /// Records whether a leader refuses commands for want of a quorum (`None`: it does not).
    /// Only nodes the view knows.
    pub fn set_quorum_lost(&self, id: u64, quorum_lost_ms: Option<u64>) {
        if let Ok(mut nodes) = self.nodes.lock() {
            if let Some(e) = nodes.get_mut(&id) {
                e.quorum_lost_ms = quorum_lost_ms;
            }
        }
    }

    /// Records a node's divergence alarm (`None`: no alarm). Only nodes the view knows.
    pub fn set_alarm(&self, id: u64, alarm: Option<String>) {
        if let Ok(mut nodes) = self.nodes.lock() {
            if let Some(e) = nodes.get_mut(&id) {
                e.alarm = alarm;
            }
        }
    }

    pub fn remove(&self, id: u64) {
        if let Ok(mut nodes) = self.nodes.lock() {
            nodes.remove(&id);
        }
    }

    /// The view now; `node_down_ms`: silence after which a node counts as down.
    pub fn snapshot(&self, node_down_ms: u64, registry: &Registry) -> ClusterSnapshot {
        let Ok(nodes) = self.nodes.lock() else {
            return ClusterSnapshot::default();
        };
        let commit = nodes
            .values()
            .map(|e| e.status.commit_index)
            .max()
            .unwrap_or(0);
        let leader = nodes
            .values()
            .filter(|e| matches!(e.status.role, Role::Leader | Role::Standalone))
            .max_by_key(|e| e.status.term)
            .map(|e| e.status.id);
        let term = nodes.values().map(|e| e.status.term).max().unwrap_or(0);
        let mut views = Vec::with_capacity(nodes.len());
        for e in nodes.values() {
            let last_seen_ms = e.seen.elapsed().as_millis() as u64;
            // A member that never reported has no position to lag behind with.
            let lag = if e.status.role == Role::Unknown {
                0
            } else {
                commit.saturating_sub(e.status.applied_index)
            };
            let id = e.status.id.to_string();
            let l = [("node", id.as_str())];
            registry
                .gauge(
                    names::REPLICATION_LAG_ENTRIES,
                    "Commit index minus the node's applied index.",
                    &l,
                )
                .set(lag.min(i64::MAX as u64) as i64);
            registry
                .gauge(
                    names::RAFT_COMMIT_INDEX,
                    "Commit index as the node reports it.",
                    &l,
                )
                .set(e.status.commit_index.min(i64::MAX as u64) as i64);
            registry
                .gauge(names::RAFT_TERM, "Term as the node reports it.", &l)
                .set(e.status.term.min(i64::MAX as u64) as i64);
            registry
                .gauge(
                    names::NODE_UP,
                    "1 if the node reported within the down threshold.",
                    &l,
                )
                .set((last_seen_ms <= node_down_ms) as i64);
            views.push(NodeView {
                status: e.status.clone(),
                lag_entries: lag,
                last_seen_ms,
                up: last_seen_ms <= node_down_ms,
                state_hash_hex: e.status.state_hash.map(|h| format!("{h:016x}")),
                alarm: e.alarm.clone(),
                quorum_lost_ms: e.quorum_lost_ms,
            });
        }
        let mut mismatch = Vec::new();
        for (a_id, a) in nodes.iter() {
            let differs = nodes.iter().any(|(b_id, b)| {
                b_id != a_id
                    && a.hashes
                        .iter()
                        .any(|(ia, ha)| b.hashes.iter().any(|(ib, hb)| ia == ib && ha != hb))
            });
            if differs {
                mismatch.push(*a_id);
            }
        }
        let replicated = nodes.values().any(|e| e.status.role != Role::Standalone);
        ClusterSnapshot {
            leader,
            term,
            commit_index: commit,
            replication_lag_entries: replicated
                .then(|| views.iter().map(|v| v.lag_entries).max().unwrap_or(0)),
            hash_mismatch: mismatch,
            nodes: views,
        }
    }
}

/// Alert thresholds, from the `[alerts]` table of the monitor's TOML config.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertThresholds {
    /// Door-to-door p99 over one dashboard interval above this fires `latency_p99`.
    pub p99_us_max: u64,
    /// Any node's replication lag above this fires `replication_lag`.
    pub replication_lag_entries_max: u64,
    /// Market data publication delay p99 above this fires `md_delay`.
    pub md_delay_us_max: u64,
    /// A node silent for longer than this is down (`node_down`).
    pub node_down_ms: u64,
}

impl Default for AlertThresholds {
    fn default() -> Self {
        AlertThresholds {
            p99_us_max: 5_000,
            replication_lag_entries_max: 10_000,
            md_delay_us_max: 1_000,
            node_down_ms: 3_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Alert {
    pub name: &'static str,
    pub message: String,
}

/// The alerts that fire for one interval's figures.
pub fn evaluate(
    t: &AlertThresholds,
    p99_ns: Option<u64>,
    md_delay_p99_ns: Option<u64>,
    cluster: &ClusterSnapshot,
) -> Vec<Alert> {
    let mut out = Vec::new();
    if let Some(p99) = p99_ns {
        if p99 > t.p99_us_max.saturating_mul(1_000) {
            out.push(Alert {
                name: "latency_p99",
                message: format!(
                    "order latency p99 {} µs is above {} µs",
                    p99 / 1_000,
                    t.p99_us_max
                ),
            });
        }
    }
    if let Some(lag) = cluster.replication_lag_entries {
        if lag > t.replication_lag_entries_max {
            out.push(Alert {
                name: "replication_lag",
                message: format!(
                    "replication lag {lag} entries is above {}",
                    t.replication_lag_entries_max
                ),
            });
        }
    }
    if let Some(d) = md_delay_p99_ns {
        if d > t.md_delay_us_max.saturating_mul(1_000) {
            out.push(Alert {
                name: "md_delay",
                message: format!(
                    "market data delay p99 {} µs is above {} µs",
                    d / 1_000,
                    t.md_delay_us_max
                ),
            });
        }
    }
    if !cluster.hash_mismatch.is_empty() {
        out.push(Alert {
            name: "hash_mismatch",
            message: format!(
                "replica state hashes differ at the same index on nodes {:?}",
                cluster.hash_mismatch
            ),
        });
    }
    for n in cluster.nodes.iter() {
        if let Some(a) = &n.alarm {
            out.push(Alert {
                name: "divergence",
                message: format!("node {} stopped on a state hash alarm: {a}", n.status.id),
            });
        }
    }
    for n in cluster.nodes.iter() {
        if let Some(ms) = n.quorum_lost_ms {
            out.push(Alert {
                name: "no_quorum",
                message: format!(
                    "node {} leads without a quorum (last acknowledged {ms} ms ago) and refuses new commands",
                    n.status.id
                ),
            });
        }
    }
    for n in cluster.nodes.iter().filter(|n| !n.up) {
        out.push(Alert {
            name: "node_down",
            message: format!(
                "node {} silent for {} ms (threshold {} ms)",
                n.status.id, n.last_seen_ms, t.node_down_ms
            ),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: u64, role: Role, applied: u64, hash: u64) -> NodeStatus {
        NodeStatus {
            id,
            role,
            term: 3,
            commit_index: 100,
            applied_index: applied,
            state_hash: Some(hash),
            hash_index: None,
        }
    }

    #[test]
    fn replicas_are_compared_at_the_index_of_their_checkpoints() {
        let v = ClusterView::default();
        let r = Registry::new();
        let at = |id, applied, index, hash| NodeStatus {
            hash_index: Some(index),
            ..status(id, Role::Follower, applied, hash)
        };
        // Different applied indexes, the same checkpoint: equal hashes agree.
        v.report(at(1, 1_500, 1_000, 7));
        v.report(at(2, 1_200, 1_000, 7));
        assert!(v.snapshot(3_000, &r).hash_mismatch.is_empty());
        // Node 3 reaches the checkpoint later with another hash: a mismatch at index 1000,
        // even though node 1 has moved on to its next checkpoint meanwhile.
        v.report(at(1, 2_100, 2_000, 9));
        v.report(at(3, 1_001, 1_000, 8));
        assert_eq!(v.snapshot(3_000, &r).hash_mismatch, vec![1, 2, 3]);
    }

    #[test]
    fn lag_leader_and_hash_mismatch_come_from_the_reports() {
        let v = ClusterView::default();
        let r = Registry::new();
        v.report(status(1, Role::Leader, 100, 7));
        v.report(status(2, Role::Follower, 90, 5));
        v.report(status(3, Role::Follower, 100, 8));
        let s = v.snapshot(3_000, &r);
        assert_eq!(s.leader, Some(1));
        assert_eq!(s.replication_lag_entries, Some(10));
        assert_eq!(s.hash_mismatch, vec![1, 3]);
        let alerts = evaluate(&AlertThresholds::default(), Some(10_000_000), None, &s);
        let names: Vec<_> = alerts.iter().map(|a| a.name).collect();
        assert_eq!(names, vec!["latency_p99", "hash_mismatch"]);
        assert_eq!(
            r.gauge_series(names::REPLICATION_LAG_ENTRIES).len(),
            3,
            "one lag gauge per node"
        );
    }

    #[test]
    fn an_expected_member_that_never_reports_goes_down_and_an_alarm_fires() {
        let v = ClusterView::default();
        v.expect(&[1, 2, 3]);
        v.report(status(1, Role::Leader, 100, 7));
        v.report(status(2, Role::Follower, 100, 7));
        v.set_alarm(2, Some("hash differs at 100".into()));
        std::thread::sleep(std::time::Duration::from_millis(30));
        v.report(status(1, Role::Leader, 100, 7));
        v.report(status(2, Role::Follower, 100, 7));
        let s = v.snapshot(20, &Registry::new());
        assert_eq!(s.nodes.len(), 3);
        assert_eq!(s.nodes[2].status.role, Role::Unknown);
        assert!(!s.nodes[2].up && s.nodes[0].up);
        let alerts = evaluate(&AlertThresholds::default(), None, None, &s);
        let names: Vec<_> = alerts.iter().map(|a| a.name).collect();
        assert_eq!(names, vec!["divergence", "node_down"]);
        assert!(alerts[1].message.contains("node 3"), "{alerts:?}");
    }

    #[test]
    fn a_silent_node_is_down() {
        let v = ClusterView::default();
        v.report(status(1, Role::Standalone, 100, 7));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let s = v.snapshot(5, &Registry::new());
        assert!(!s.nodes[0].up);
        assert_eq!(
            s.replication_lag_entries, None,
            "standalone: nothing to lag"
        );
        let alerts = evaluate(&AlertThresholds::default(), None, None, &s);
        assert_eq!(alerts[0].name, "node_down");
    }
}
