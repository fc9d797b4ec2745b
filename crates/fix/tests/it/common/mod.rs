//! A scripted peer for the tests that drive an acceptor session one hand-built message at a
//! time: the acceptor ISLD, the peer TW, the small FIX 4.4 dictionary, one instant.

use std::sync::Arc;

use bourse_fix::codec::OutMessage;
use bourse_fix::tags;
use bourse_fix::testing::small_dictionary;
use bourse_fix::time::{format_utc_timestamp_ms, UnixMs};
use bourse_fix::{MemoryStore, Role, Session, SessionConfig};

/// The instant every message is sent and received at.
pub const T0: UnixMs = 1_700_000_000_000;

/// An acceptor connected at [`T0`], waiting for the peer's Logon.
pub fn connected_acceptor() -> Session {
    let config = SessionConfig::new("FIX.4.4", "ISLD", "TW", Role::Acceptor);
    let mut session = Session::new(
        config,
        Arc::new(small_dictionary()),
        Box::new(MemoryStore::default()),
    );
    session.on_connect(T0);
    session
}

/// The peer's Logon body (HeartBtInt 30 s).
pub fn logon() -> OutMessage {
    let mut logon = OutMessage::new("A");
    logon
        .push(tags::ENCRYPT_METHOD, "0")
        .push(tags::HEART_BT_INT, "30");
    logon
}

/// `m` as the peer sends it, numbered `seq`; a resend carries PossDupFlag=Y and an
/// OrigSendingTime a second before its SendingTime.
pub fn from_peer(mut m: OutMessage, seq: u64, resend: bool) -> Vec<u8> {
    m.set_header(tags::SENDER_COMP_ID, "TW")
        .set_header(tags::TARGET_COMP_ID, "ISLD")
        .set_header(tags::MSG_SEQ_NUM, seq.to_string())
        .set_header(tags::SENDING_TIME, format_utc_timestamp_ms(T0));
    if resend {
        m.set_header(tags::POSS_DUP_FLAG, "Y")
            .set_header(tags::ORIG_SENDING_TIME, format_utc_timestamp_ms(T0 - 1000));
    }
    m.encode("FIX.4.4")
}
