//! [`AdminVenue`]: what the admin service needs of a venue, and nothing else: its markets,
//! a way to submit commands to one market's core through the sequenced, replicated path (the
//! answer comes after the entry that applied them committed, with their events), and a
//! read of a core's state as its leader has it. `bourse_venue` implements it over the replica
//! groups it hosts; tests implement it over engines.

use bourse_core::{Command, Event};
use bourse_engine::Engine;
use std::future::Future;
use std::pin::Pin;

/// A boxed future that can cross threads (the trait is used behind `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A read of one core's engine, answering JSON.
pub type EngineRead = Box<dyn FnOnce(&Engine) -> serde_json::Value + Send>;

/// Who asked for the commands of one admin request: the operator and the request id. The
/// venue writes them beside each command into the replicated log, so that the journal of
/// every replica says who asked for what (the audit log says it too, with the outcome).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asker<'a> {
    pub operator: &'a str,
    pub request_id: &'a str,
}

/// The venue behind the admin API. See the module documentation.
pub trait AdminVenue: Send + Sync + 'static {
    /// The markets, one core each, in core order.
    fn markets(&self) -> Vec<String>;

    /// Submits `commands` to core `core` and answers each command's events, in the order
    /// given, once every one of them is committed and applied. With `ordered`, the commands
    /// apply in the order given; without it (independent commands, such as many account
    /// additions) they may be spread over several sequenced clients. A retry inside
    /// (failover) reuses the command's idempotency key, so nothing applies twice. An error
    /// means the outcome of some commands is unknown. `asker` travels with the commands.
    fn submit<'a>(
        &'a self,
        core: usize,
        commands: Vec<Command>,
        ordered: bool,
        asker: Asker<'a>,
    ) -> BoxFuture<'a, Result<Vec<Vec<Event>>, String>>;

    /// Runs `read` on core `core`'s engine as its leader has applied it: every command this
    /// venue answered before is in it.
    fn read(
        &self,
        core: usize,
        read: EngineRead,
    ) -> BoxFuture<'_, Result<serde_json::Value, String>>;
}
