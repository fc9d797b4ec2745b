//! Data delivery (seed 003): the latest state of every order and trade of one or more trading
//! cores, for many polling clients, by cursor, filtered, across cores.
//!
//! Start at [`node::DeliveryNode`]: a [`store::Store`] fed only by committed entries (one feed
//! per core), its state file, and two fronts on one [`poll`] engine, [`server`] (HTTP/JSON long
//! poll) and [`binary`] (SBE over TCP); or a read replica ([`node::Follow`]). A
//! [`cursor::Cursor`] is a vector of per-core positions, valid across failovers and restarts;
//! [`access`] says who may read what. [`client::AnyClient`] and the [`record`] types come from
//! the SDK.
//!
//! Design and invariants: ARCHITECTURE.md, `crates/delivery`.

pub mod access;
pub mod binary;
pub mod cold;
pub mod cursor;
pub mod node;
pub mod poll;
pub mod server;
pub mod store;

pub use access::{AccessConfig, Reader, ServerTls};
/// The client and the record types live in the SDK (`bourse_client::delivery`), which a
/// broker's program uses without the store or the cluster; they are re-exported here.
pub use bourse_client::delivery::{self as client, record};
pub use bourse_client::delivery::{
    Access, AnyClient, BinaryClient, ClientError, DeliveryClient, PollAnswer, PollRequest,
};
/// How a client trusts a node's certificate (its TLS fronts).
pub use bourse_client::TlsClient;
pub use cursor::{Cursor, CursorError};
pub use node::{
    CoreSource, DeliveryConfig, DeliveryNode, Follow, FollowLogin, FollowTls, Limits, Role,
};
pub use record::{Filter, Pos, Record};
pub use server::{AnswerHeader, ServerTimings};
pub use store::{Answer, Store, StoreConfig};
