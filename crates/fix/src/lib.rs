//! bourse-fix: FIX 4.4 for bourse, written to stand alone.
//!
//! Principal types, bottom up:
//!
//! - [`codec`]: [`FrameBuffer`] cuts a TCP byte stream into frames;
//!   [`decode`] splits a frame into a [`RawMessage`] of borrowed
//!   [`Field`]s and checks BodyLength (9) and CheckSum (10);
//!   [`OutMessage`] builds and encodes outbound messages.
//! - [`dictionary`]: [`Dictionary`] loads a QuickFIX-format data dictionary
//!   (XML) at run time, sorts a message into header, body, trailer and
//!   repeating groups ([`Structure`]) and validates it, producing the
//!   [`Reject`] (reason, RefTagID, Text) a QuickFIX peer would send.
//! - [`store`]: [`MessageStore`] with [`MemoryStore`] and the durable
//!   [`FileStore`] (sequence numbers and outbound messages in a directory).
//! - [`session`]: [`Session`], the session layer as a sans-I/O state machine
//!   fed bytes, ticks and connection events with `now_ms`, emitting
//!   [`Action`]s; [`Application`] receives verified messages.
//! - [`echo`]: [`EchoApplication`], QuickFIX's acceptance-test server
//!   application, for conformance runs; [`QueueingApplication`], which
//!   queues owned copies of application messages for a driver.
//! - [`acceptor`]: [`run_acceptor`] / [`spawn_acceptor`], a blocking
//!   std::net driver for one acceptor session, configured by
//!   [`AcceptorConfig`].
//! - [`testing`]: a small FIX 4.4 dictionary for tests that drive a session.

#![forbid(unsafe_code)]

pub mod acceptor;
pub mod codec;
pub mod dictionary;
pub mod echo;
pub mod session;
pub mod store;
pub mod tags;
pub mod testing;
pub mod time;

pub use acceptor::{run_acceptor, spawn_acceptor, AcceptorConfig, AcceptorHandle};
pub use codec::{
    decode, DecodeError, Field, FrameBuffer, FrameError, OutMessage, RawMessage, SessionHeader,
};
pub use dictionary::{Dictionary, DictionaryError, Reject, Structure, ValidationOptions};
pub use echo::{EchoApplication, OwnedMessage, QueueingApplication, RejectingApplication};
pub use session::{Action, Application, Inbound, Role, SendError, Session, SessionConfig};
pub use store::{FileStore, MemoryStore, MessageStore};
pub use tags::Tag;
