//! Helpers shared by the cluster's behaviour tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bourse_cluster::net::NodeStatus;
use bourse_cluster::{ClusterConfig, Node, NodeId};
use bourse_engine::workload::FlowConfig;
/// Free ports below the ephemeral range, shared by every crate's tests.
pub use bourse_testkit::free_ports;

pub fn addrs(config: &ClusterConfig) -> Vec<(NodeId, SocketAddr)> {
    config
        .nodes
        .iter()
        .map(|n| (n.id, n.addr.parse().expect("valid address")))
        .collect()
}

/// A small order flow: one book, 20 accounts.
pub fn small_flow(seed: u64) -> FlowConfig {
    let mut flow = FlowConfig::exchange_core(seed);
    flow.accounts = 20;
    flow.live_orders_target = 50;
    flow
}

/// Waits until every running node applied the same last index with the same state hash;
/// returns their statuses. Panics after `limit`.
pub async fn converged(nodes: &[&Node], limit: Duration) -> Vec<NodeStatus> {
    let started = Instant::now();
    loop {
        let mut statuses = Vec::new();
        for n in nodes {
            statuses.push(n.status().await);
        }
        let leader_known = statuses.iter().any(|s| s.leader == Some(s.id));
        let same_index = statuses
            .windows(2)
            .all(|w| w[0].last_applied_index == w[1].last_applied_index);
        let log_done = statuses
            .iter()
            .all(|s| s.last_applied_index.is_some() && s.last_applied_index == s.last_log_index);
        if leader_known && same_index && log_done {
            let hashes: Vec<u64> = statuses.iter().map(|s| s.state_hash).collect();
            assert!(
                hashes.windows(2).all(|w| w[0] == w[1]),
                "replicas applied the same log but differ: {statuses:#?}"
            );
            return statuses;
        }
        assert!(
            started.elapsed() < limit,
            "nodes did not converge within {limit:?}: {statuses:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
