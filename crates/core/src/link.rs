//! The seam between an access server and whatever runs a trading core: [`CoreLink`].
//!
//! A gateway speaks to every core through this trait and knows nothing else of it; the
//! implementations live next to what they drive (`bourse_engine::in_process::InProcessCore`,
//! an engine on its own thread; `bourse_cluster::link::ClusterLink`, a replica group), and
//! only the binary that starts a gateway picks one. The contract:
//!
//! - [`CoreLink::submit`] never blocks: a full queue is [`SubmitError::Full`], which the
//!   gateway answers "system busy", so that one slow core cannot stall every session.
//! - Each command travels under a [`RequestKey`] and a core applies a key at most once: a
//!   gateway may resubmit after a failover, and the second submission is answered (`Done`)
//!   but not applied again.
//! - Outputs are tagged by key: every event a command caused comes as [`CoreOutput::Event`]
//!   under that command's key, followed by one [`CoreOutput::Done`] with the key. Events that
//!   concern other sessions (the resting side of a trade, orders removed by someone else's
//!   mass cancel) come under the causing command's key too, or under a key the link reserves
//!   for other clients' commands; the gateway routes them by order id.
//!
//! Only std: this module is the whole of what a gateway needs to know about a core.

use crate::{Command, Event};
use std::sync::Arc;

/// Identifies one request of one session: the idempotency key of a command. `session` is the
/// gateway's number for the session (0 is the gateway's own administration); `seq` grows by
/// one per command the session submits. A core that sees a key again (a gateway resubmitting
/// after a failover) must not apply the command twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    pub session: u32,
    pub seq: u64,
}

/// What the core sends back. Every event carries the key of the command that caused it, and
/// the events of one command are followed by `Done` with that key. Events that concern other
/// sessions (the resting side of a trade, orders removed by another session's mass cancel)
/// come under the key of the command that caused them: the gateway routes them by order id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreOutput {
    Event { key: RequestKey, event: Event },
    Done { key: RequestKey },
}

/// Why a command could not be submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue to the core is full: the gateway answers "system busy" and the client may
    /// retry. Never blocks, so that one busy core cannot stall every session.
    Full,
    /// The core is gone.
    Closed,
    /// The core cannot commit now (a replica group without a quorum): refused at once, not
    /// queued; the gateway rejects with that reason and the client may retry later.
    NoQuorum,
}

/// What a link to a replicated core did to keep its requests going, for the gateway's
/// `/metrics`: counts since the link started (they only grow) and two gauges. A link to a core
/// that lives in the gateway's process has none of these (see [`CoreLink::link_counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Requests sent again after a first send (a failover, a gap, a timeout, a probe).
    pub requests_resent: u64,
    /// Requests sent alone to find out whether a node leads with a quorum (while the quorum is
    /// lost, or after moving to a node not known to lead).
    pub probes: u64,
    /// Times the link moved its requests to another node (an error, a "not the leader", a
    /// leader named by a hint or a probe).
    pub node_switches: u64,
    /// Times a leader probe found a newer leader while requests waited.
    pub leader_probe_switches: u64,
    /// Times the link subscribed again to the committed stream, on another node or the same.
    pub stream_resubscriptions: u64,
    /// Requests handed to the group and not yet answered (a gauge).
    pub requests_pending: u64,
    /// Whether the group's leader said it has no quorum and nothing was acknowledged since (a
    /// gauge): new commands are refused meanwhile ([`SubmitError::NoQuorum`]).
    pub no_quorum: bool,
}

/// The core behind a gateway (see the module documentation for the contract).
pub trait CoreLink: Send {
    /// Hands a command to the core without blocking.
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError>;
    /// The next output, if one is ready; never blocks.
    fn try_recv(&mut self) -> Option<CoreOutput>;
    /// Registers a function the link calls (from any thread) after it made output ready, so
    /// that a gateway sleeping in its event loop wakes up.
    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>);
    /// For a core that outlives the gateway (a replica group): the last position in the
    /// core's output stream (a log index) whose outputs [`CoreLink::try_recv`] has handed
    /// over, all of them; before the first, the position the link started after. The gateway
    /// saves it with its order state at stop and resumes from it. `None` for a core that
    /// lives and dies with the gateway (an engine in process): nothing of it can be resumed.
    fn stream_position(&self) -> Option<u64> {
        None
    }
    /// For a link to a replicated core: what it did to keep its requests going (see
    /// [`LinkCounters`]); read by the gateway on its metrics tick. `None` for a core in the
    /// gateway's process, which has no link to keep.
    fn link_counters(&self) -> Option<LinkCounters> {
        None
    }
}
