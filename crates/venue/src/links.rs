//! The gateways' links to the cores: a counter of what each gateway passes on (for the
//! report's accounting) around a `ClusterLink` to a replica group or an in-process engine.

use anyhow::{anyhow, Result};
use bourse_cluster::Node;
use bourse_core::*;
use bourse_gateway::{CoreLink, CoreOutput};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A core link that counts what the gateway passes on to the core.
pub(crate) struct CountingLink {
    pub(crate) inner: Box<dyn CoreLink>,
    pub(crate) forwarded: Arc<AtomicU64>,
    /// Commands from sessions outside the generator (a person's `bourse order`).
    pub(crate) other: Arc<AtomicU64>,
    /// Gateway session numbers (`RequestKey::session`) up to this one are not the
    /// generator's: the people's FIX sessions come first in the gateway's configuration.
    pub(crate) other_sessions_max: u32,
}

impl CoreLink for CountingLink {
    fn submit(
        &mut self,
        key: bourse_gateway::RequestKey,
        command: Command,
    ) -> Result<(), bourse_gateway::SubmitError> {
        let r = self.inner.submit(key, command);
        // Session 0 is the gateway's own administration (bootstrap), not client traffic.
        if r.is_ok() && key.session != 0 {
            if key.session <= self.other_sessions_max {
                self.other.fetch_add(1, Ordering::Relaxed);
            } else {
                self.forwarded.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }
    fn try_recv(&mut self) -> Option<CoreOutput> {
        self.inner.try_recv()
    }
    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>) {
        self.inner.set_notify(notify)
    }
}

/// The gateway's link to a replicated core: a `ClusterLink` (pipelined submissions, every
/// output from the group's committed stream) under the gateway's own client id.
pub(crate) fn cluster_link(
    nodes: &[Node],
    client_id: u64,
    queue_depth: usize,
) -> Result<(Box<dyn CoreLink>, bourse_cluster::link::ClusterLinkWatch)> {
    let config = bourse_cluster::link::ClusterLinkConfig::new(
        nodes.iter().map(|n| n.addr).collect(),
        client_id,
        queue_depth,
    );
    let link = bourse_cluster::link::ClusterLink::start(config).map_err(|e| anyhow!(e))?;
    let watch = link.watch();
    Ok((Box::new(link), watch))
}
