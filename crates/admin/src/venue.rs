//! [`AdminVenue`]: what the admin service needs of a venue, and nothing else: its markets,
//! a way to submit commands to one market's core through the sequenced, replicated path (the
//! answer comes after the entry that applied them committed, with their events), and a
//! query of a core's state as its leader has it (`bourse_cluster::query::Query`, one answer
//! type whether the leader is in this process or asked over the network). `bourse_venue`
//! implements it over the replica groups it hosts (`VenueAdmin`) and over the nodes of
//! separate `bourse node` processes (`RemoteVenue`); tests implement it over engines.

pub use bourse_cluster::query::{Query, QueryAnswer};
use bourse_core::{Command, Event};
use std::future::Future;
use std::pin::Pin;

/// A boxed future that can cross threads (the trait is used behind `dyn`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

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

    /// Answers `query` from core `core`'s state as its leader has applied it: every command
    /// this venue answered before is in it (`Query::answer`).
    fn query(&self, core: usize, query: Query) -> BoxFuture<'_, Result<QueryAnswer, String>>;
}
