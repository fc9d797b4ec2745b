//! The data-delivery client (seed 003; the service is `bourse delivery serve`, crate
//! `bourse-delivery`): the latest state of every order and trade, read by cursor.
//!
//! - [`record`]: what an answer holds ([`Record`] at a [`Pos`] of its core) and what a client
//!   may ask for ([`Filter`]).
//! - [`api`]: the request and answer of GetOrders, the refusals, the client's errors.
//! - [`DeliveryClient`] (HTTP/JSON long poll), [`BinaryClient`] (SBE over TCP), and
//!   [`AnyClient`] over both: the same request and answer on either front, so a program picks
//!   its front with one argument. Async (tokio); neither pulls in the cluster or the store.
//!   Each takes an [`Access`]: TLS for a node off the loopback, and credentials from the
//!   venue's credential store (HTTP Basic on each request; a Logon per binary connection).

pub mod api;
pub mod binary;
mod conn;
pub mod http;
pub mod record;

pub use api::{
    AnswerHeader, ApiError, ClientError, PollAnswer, PollRequest, RefusalKind, ServerTimings,
};
pub use binary::{BinaryClient, Logon};
pub use conn::Access;
pub use http::{AnyClient, DeliveryClient, ANSWER_BYTES_MAX};
pub use record::{Filter, Pos, Record};
