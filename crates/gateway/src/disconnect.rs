//! Why the gateway closes a connection: [`DisconnectReason`], the `reason` label of
//! `bourse_gateway_disconnects_total` and the word in the one log line each close gets.
//! Reasons are fine-grained on purpose: an operator who sees connections closed must be able
//! to tell a careless client (bad CheckSum, wrong BodyLength) from a hostile one (quota,
//! unknown session, bad credentials) from the metrics alone.

/// Why the gateway closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DisconnectReason {
    /// The client closed its end.
    PeerClosed,
    /// A read or write failed.
    IoError,
    /// Its unsent output passed `outbound_buffer_max_bytes`.
    SlowConsumer,
    /// It did not log on (establish) within `logon_timeout_ms`.
    LogonTimeout,
    /// Accepted while every connection was a logged-on session and `connections_max` was
    /// reached: closed at once.
    ConnectionsMax,
    /// A connection that had not logged on yet, displaced (the oldest first) by a newer one
    /// because `prelogon_connections_max` were waiting to log on.
    PrelogonQuota,
    /// Its source address already had `prelogon_per_address_max` connections waiting to log
    /// on: closed at once.
    AddressQuota,
    /// Its first bytes are not a FIX 4.4 message (or, binary, not a valid frame).
    Garbled,
    /// A message larger than the size limit was announced or sent.
    Oversized,
    /// BodyLength does not match the message.
    BadBodyLength,
    /// CheckSum does not match the message.
    BadCheckSum,
    /// Its first message was not a Logon (Establish).
    NotLogon,
    /// The Logon names no configured session (SenderCompID/TargetCompID), or the Establish
    /// no configured credentials.
    UnknownSession,
    /// The session is already logged on over another connection.
    SessionInUse,
    /// The session may not log on from this source address.
    AddressNotAllowed,
    /// The session has a `password_hash` and the Logon's Password (554), or the Establish's
    /// password, was missing or did not match it.
    BadPassword,
    /// The Logon was refused for another reason (the session layer's text is logged).
    LogonRefused,
    /// An orderly Logout (either side).
    Logout,
    /// The peer stopped sending: no heartbeat (FIX) or keepalive (binary) in time.
    HeartbeatTimeout,
    /// The FIX session ended it for a session-level fault (its text is logged).
    FixSession,
    /// The binary session was terminated (by the client or by the gateway, with a code).
    BinaryTerminate,
    /// The gateway is stopping.
    Shutdown,
    /// On a TLS listener: the handshake or a record failed (no common version or cipher,
    /// a certificate the client refused, plain bytes instead of TLS).
    TlsError,
    /// The session logs on only over TLS (`tls_required`) and came over plain TCP.
    TlsRequired,
}

impl DisconnectReason {
    pub const ALL: [DisconnectReason; 24] = [
        DisconnectReason::PeerClosed,
        DisconnectReason::IoError,
        DisconnectReason::SlowConsumer,
        DisconnectReason::LogonTimeout,
        DisconnectReason::ConnectionsMax,
        DisconnectReason::PrelogonQuota,
        DisconnectReason::AddressQuota,
        DisconnectReason::Garbled,
        DisconnectReason::Oversized,
        DisconnectReason::BadBodyLength,
        DisconnectReason::BadCheckSum,
        DisconnectReason::NotLogon,
        DisconnectReason::UnknownSession,
        DisconnectReason::SessionInUse,
        DisconnectReason::AddressNotAllowed,
        DisconnectReason::BadPassword,
        DisconnectReason::LogonRefused,
        DisconnectReason::Logout,
        DisconnectReason::HeartbeatTimeout,
        DisconnectReason::FixSession,
        DisconnectReason::BinaryTerminate,
        DisconnectReason::Shutdown,
        DisconnectReason::TlsError,
        DisconnectReason::TlsRequired,
    ];

    /// Its position in [`DisconnectReason::ALL`] (the loop's counter index).
    pub fn index(self) -> usize {
        DisconnectReason::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or(0)
    }

    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            DisconnectReason::PeerClosed => "peer_closed",
            DisconnectReason::IoError => "io_error",
            DisconnectReason::SlowConsumer => "slow_consumer",
            DisconnectReason::LogonTimeout => "logon_timeout",
            DisconnectReason::ConnectionsMax => "connections_max",
            DisconnectReason::PrelogonQuota => "prelogon_quota",
            DisconnectReason::AddressQuota => "address_quota",
            DisconnectReason::Garbled => "garbled",
            DisconnectReason::Oversized => "oversized",
            DisconnectReason::BadBodyLength => "bad_body_length",
            DisconnectReason::BadCheckSum => "bad_checksum",
            DisconnectReason::NotLogon => "not_logon",
            DisconnectReason::UnknownSession => "unknown_session",
            DisconnectReason::SessionInUse => "session_in_use",
            DisconnectReason::AddressNotAllowed => "address_not_allowed",
            DisconnectReason::BadPassword => "bad_password",
            DisconnectReason::LogonRefused => "logon_refused",
            DisconnectReason::Logout => "logout",
            DisconnectReason::HeartbeatTimeout => "heartbeat_timeout",
            DisconnectReason::FixSession => "fix_session",
            DisconnectReason::BinaryTerminate => "binary_terminate",
            DisconnectReason::Shutdown => "shutdown",
            DisconnectReason::TlsError => "tls_error",
            DisconnectReason::TlsRequired => "tls_required",
        }
    }

    /// The reason a FIX session's own disconnect text stands for. The session layer
    /// (`bourse_fix::Session`) says why it disconnects in words, as QuickFIX does; the few
    /// that an operator must count apart are recognised here, the rest count as
    /// [`DisconnectReason::FixSession`] and their text is logged.
    pub fn of_fix_session_text(text: &str) -> DisconnectReason {
        if text.starts_with("Received logout") || text.contains("waiting for logout") {
            DisconnectReason::Logout
        } else if text.contains("waiting for heartbeat") {
            DisconnectReason::HeartbeatTimeout
        } else if text.contains("exceeds the limit") {
            DisconnectReason::Oversized
        } else if text.contains("garbled") {
            DisconnectReason::Garbled
        } else {
            DisconnectReason::FixSession
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_label_and_index() {
        let mut names: Vec<&str> = DisconnectReason::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DisconnectReason::ALL.len());
        for (i, r) in DisconnectReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }

    #[test]
    fn the_session_layers_texts_map_to_their_reasons() {
        let oversized = bourse_fix::FrameError::TooLarge {
            size_bytes: 9_000,
            size_max_bytes: 8_192,
        }
        .to_string();
        assert_eq!(
            DisconnectReason::of_fix_session_text(&oversized),
            DisconnectReason::Oversized
        );
        assert_eq!(
            DisconnectReason::of_fix_session_text("Received logout request"),
            DisconnectReason::Logout
        );
        assert_eq!(
            DisconnectReason::of_fix_session_text("Timed out waiting for heartbeat"),
            DisconnectReason::HeartbeatTimeout
        );
        assert_eq!(
            DisconnectReason::of_fix_session_text("MsgSeqNum too low, expecting 5 but received 3"),
            DisconnectReason::FixSession
        );
    }
}
