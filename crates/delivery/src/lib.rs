//! Data delivery (seed 003): the latest state of every order and trade of one or more trading
//! cores, for thousands of polling clients, by cursor, filtered, across cores.
//!
//! - [`store::Store`]: fed only by committed entries; per core an ordered index by
//!   [`record::Pos`] (log index, ordinal in the entry) holding each order's latest state
//!   (the core's `OrderLog` record), each trade and each rejected new order, with secondary
//!   indexes by firm, account and instrument; bounded, evicting the oldest final records.
//! - [`cursor::Cursor`]: a vector of per-core positions, opaque to clients (versioned,
//!   deployment-bound, checksummed; hex over HTTP, bytes over SBE); valid across a
//!   delivery-node restart and a core failover because positions are log indexes.
//! - [`node::DeliveryNode`]: the store, one feed per core (a remote `StreamConsumer`), the
//!   persisted state file, and two fronts on one [`poll`] engine: [`server`], the HTTP/JSON
//!   long poll, and [`binary`], SBE over TCP (GetOrders); or, as a read replica
//!   ([`node::Follow`]), one task polling a primary node's binary front instead of feeds.
//! - [`access`]: who may read what: readers log on with the venue's credential store (HTTP
//!   Basic, a binary Logon), checked once and remembered; a firm's reader gets its own
//!   firm's records only; fronts off the loopback need TLS and credentials.
//! - [`client::AnyClient`]: a Rust client of either front ([`DeliveryClient`], [`BinaryClient`]),
//!   from the SDK (`bourse_client::delivery`), as are the [`record`] types.

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
