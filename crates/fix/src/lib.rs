//! bourse-fix: FIX 4.4 for bourse, written to stand alone.
//!
//! Bottom up: [`codec`] ([`FrameBuffer`] cuts frames, [`decode`] gives a [`RawMessage`] of
//! borrowed [`Field`]s, [`OutMessage`] encodes); [`dictionary`] ([`Dictionary`]: a
//! QuickFIX-format XML dictionary, the message's [`Structure`], and validation into the
//! [`Reject`] a QuickFIX peer would send); [`store`] ([`MemoryStore`] and the durable
//! [`FileStore`]); [`session`] ([`Session`]: the session layer sans I/O, fed bytes and `now_ms`,
//! emitting [`Action`]s to its driver and verified messages to an [`Application`]). [`echo`]
//! and [`acceptor`] run the QuickFIX acceptance scripts; [`testing`] is a small dictionary for
//! tests. Start at [`Session`].
//!
//! Design: ARCHITECTURE.md, `crates/fix`.

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
