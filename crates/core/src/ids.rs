//! Identifier newtypes. They are plain integers on the wire and in JSON (serde transparent).

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $inner:ty) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// An instrument (a security, an FX pair, a futures contract), unique within the venue.
    InstrumentId,
    u32
);
id_type!(
    /// A client account: the owner of cash, positions and orders. u32 holds the seeds' 4,000,000
    /// accounts with room to spare and keeps per-order records small.
    AccountId,
    u32
);
id_type!(
    /// A trading firm (a member of the exchange); accounts belong to firms.
    FirmId,
    u32
);
id_type!(
    /// An exchange order id, assigned by the core in sequence and never reused.
    OrderId,
    u64
);
id_type!(
    /// A client order id, chosen by the client. Unique among an account's live orders.
    /// Gateways map textual FIX ClOrdIDs onto these numbers.
    ClOrdId,
    u64
);
id_type!(
    /// A trade id, assigned by the core in sequence.
    TradeId,
    u64
);
