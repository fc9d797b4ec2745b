//! Who gets a connection, and what a connection must do before it is a session.
//!
//! The venue's admission policy (`bourse_admission::Admission`, one table for both ports):
//! connections that have not logged on (established) yet are strangers: they get their own
//! small quota (`prelogon_connections_max`), at most `prelogon_per_address_max` per source
//! address (a newcomer past it displaces its own address's longest-waiting stranger), and
//! `logon_timeout_ms` to log on. When the quota is full, a new connection displaces the
//! stranger that has waited longest rather than being turned away, and a logged-on session
//! never counts against the quota: so idle or trickling sockets, however many, cannot keep a
//! configured session from logging on (its Logon arrives right after its connect; the
//! strangers before it are older). `connections_max` bounds everything open at once; only
//! when every open connection is a logged-on session is a new one refused. A connection's
//! mio token is its admission id past [`FIRST_CONN`].
//!
//! A FIX stranger's bytes are judged as they arrive (`crate::prelogon`); every close is
//! counted by reason and logged once, with the peer (at most [`CLOSE_LOG_LINES_PER_S`] lines
//! a second; the rest are counted and summed up in one line).

use super::credentials;
use super::*;
use crate::prelogon::{decode_fault, scan_logon};
use bourse_admission::{Cidr, Refusal};
use std::net::IpAddr;

/// Close log lines per second at most; more closes are counted and summed up.
pub(super) const CLOSE_LOG_LINES_PER_S: u32 = 50;

/// The token of the connection the admission table knows as `id`.
fn token_of(id: u64) -> Token {
    Token(FIRST_CONN + id as usize)
}

/// The admission id of the connection at `token`.
pub(super) fn id_of(token: Token) -> u64 {
    (token.0 - FIRST_CONN) as u64
}

/// How the gateway names (and counts) a closing by the admission policy.
fn reason_of(why: Refusal) -> DisconnectReason {
    match why {
        Refusal::Full => DisconnectReason::ConnectionsMax,
        Refusal::AddressFull | Refusal::AddressShare => DisconnectReason::AddressQuota,
        Refusal::Displaced => DisconnectReason::PrelogonQuota,
        Refusal::Timeout => DisconnectReason::LogonTimeout,
    }
}

/// The close log's budget for the current second.
#[derive(Default)]
pub(super) struct CloseLog {
    second: u64,
    lines: u32,
    suppressed: u64,
}

impl Server {
    /// Accepts what waits at one listener; `true` if it stopped at its turn's share with more
    /// perhaps waiting (the loop comes back to it without a new readiness event).
    pub(super) fn accept(&mut self, kind: Kind, tls: bool) -> bool {
        // At most a quarter of the strangers' quota per turn: a connection accepted in this
        // turn reads its Logon in a later one, and must not have been displaced by then.
        let quarter = self.config.gateway.prelogon_connections_max / 4;
        for _ in 0..quarter.clamp(1, ACCEPTS_PER_EVENT_MAX) {
            let listener = match (kind, tls) {
                (Kind::Fix, false) => self.fix_listener.as_ref(),
                (Kind::Binary, false) => self.binary_listener.as_ref(),
                (Kind::Fix, true) => self.fix_tls_listener.as_ref(),
                (Kind::Binary, true) => self.binary_tls_listener.as_ref(),
            };
            let Some(listener) = listener else {
                return false;
            };
            match listener.accept() {
                Ok((stream, peer)) => {
                    self.stats
                        .connections_accepted
                        .fetch_add(1, Ordering::Relaxed);
                    match self.prelogon.admit(peer.ip(), self.now_ms) {
                        Err(why) => self.refuse(stream, peer, kind, reason_of(why)),
                        Ok(admit) => {
                            if let Some((victim, why)) = admit.displaced {
                                self.close(token_of(victim), reason_of(why));
                            }
                            self.admit(stream, peer, kind, tls, token_of(admit.id));
                        }
                    }
                }
                Err(_) => return false,
            }
        }
        true
    }

    fn refuse(
        &mut self,
        stream: TcpStream,
        peer: SocketAddr,
        kind: Kind,
        reason: DisconnectReason,
    ) {
        self.counters.disconnects[reason.index()] += 1;
        self.stats
            .connections_refused
            .fetch_add(1, Ordering::Relaxed);
        drop(stream);
        let what = match reason {
            DisconnectReason::AddressQuota => "its address has too many connections not logged on",
            _ => "every connection is a logged-on session",
        };
        self.log_line(format_args!(
            "gateway: refused {} connection from {peer}: {} ({what})",
            kind.name(),
            reason.name()
        ));
    }

    fn admit(
        &mut self,
        mut stream: TcpStream,
        peer: SocketAddr,
        kind: Kind,
        tls: bool,
        token: Token,
    ) {
        let _ = stream.set_nodelay(true);
        let registered = self.poll.registry().register(
            &mut stream,
            token,
            Interest::READABLE | Interest::WRITABLE,
        );
        let stream = match (registered, tls, &self.tls) {
            (Err(_), _, _) => None,
            (Ok(()), false, _) => Some(Transport::Plain(stream)),
            (Ok(()), true, Some(config)) => rustls::ServerConnection::new(Arc::clone(config))
                .ok()
                .map(|c| Transport::Tls(stream, Box::new(c))),
            (Ok(()), true, None) => None,
        };
        let Some(stream) = stream else {
            // Never served: its place is given back at once.
            self.prelogon.remove(id_of(token));
            return;
        };
        self.conns.insert(
            token,
            Conn {
                stream,
                kind,
                out: Vec::new(),
                out_pos: 0,
                attached: None,
                inbuf: Vec::new(),
                closing: false,
                close_reason: DisconnectReason::PeerClosed,
                close_detail: None,
                peer,
                wire_version: oe::SCHEMA_VERSION,
            },
        );
        self.stats
            .connections_open
            .store(self.conns.len(), Ordering::Relaxed);
    }

    /// `token` logged on to (established) session `slot`: no longer a stranger.
    pub(super) fn attach(&mut self, token: Token, slot: usize) {
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.attached = Some(slot);
            conn.inbuf = Vec::new();
            self.prelogon.proven(id_of(token));
        }
    }

    /// Closes the strangers that did not log on within `logon_timeout_ms`.
    pub(super) fn close_stale_prelogon(&mut self, now_ms: u64) {
        for id in self.prelogon.expire(now_ms) {
            self.close(token_of(id), DisconnectReason::LogonTimeout);
        }
    }

    /// Closes `token` for `reason`, with `detail` in its log line.
    pub(super) fn close_because(&mut self, token: Token, reason: DisconnectReason, detail: String) {
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.close_detail = Some(detail);
        }
        self.close(token, reason);
    }

    // ----- FIX before logon -----

    pub(super) fn on_fix_bytes(&mut self, token: Token, bytes: &[u8]) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(slot) = conn.attached {
            self.fix_feed(slot, bytes);
            return;
        }
        if self.checks.is_parked(token) {
            return self.hold_while_checking(token, bytes);
        }
        conn.inbuf.extend_from_slice(bytes);
        let size_max = self.config.gateway.fix_message_size_max_bytes;
        let frame_bytes = match scan_logon(&conn.inbuf, size_max) {
            Ok(Some(n)) => n,
            Ok(None) => return,
            Err(reason) => return self.close(token, reason),
        };
        let all = std::mem::take(&mut conn.inbuf);
        // The first message must be a Logon for a configured session; anything else is
        // closed without a word (as a FIX acceptor does), counted and logged.
        let raw = match bourse_fix::decode(&all[..frame_bytes], None, size_max) {
            Ok(raw) => raw,
            Err(e) => return self.close_because(token, decode_fault(&e), e.to_string()),
        };
        if raw.msg_type() != b"A" {
            let t = String::from_utf8_lossy(raw.msg_type()).into_owned();
            return self.close_because(token, DisconnectReason::NotLogon, format!("MsgType {t}"));
        }
        let sender = raw.get_str(49).unwrap_or("");
        let target = raw.get_str(56).unwrap_or("");
        let names = format!("SenderCompID {sender:?} TargetCompID {target:?}");
        let Some(slot) = self
            .fix
            .iter()
            .position(|s| s.client_comp_id == sender && s.gateway_comp_id == target)
        else {
            return self.refuse_fix_stranger(token, &raw, DisconnectReason::UnknownSession, names);
        };
        let peer = self.conns.get(&token).map(|c| c.peer.ip());
        if !address_allowed(&self.fix[slot].allowed_addresses, peer) {
            let reason = DisconnectReason::AddressNotAllowed;
            return self.refuse_fix_stranger(token, &raw, reason, names);
        }
        // A session with a password says it is in use only to whoever knows the password
        // (checked again once the password is).
        let hidden = self.config.fix_sessions[slot].password_hash.is_some();
        if self.fix[slot].conn.is_some() && !hidden {
            return self.close_because(token, DisconnectReason::SessionInUse, names);
        }
        let tls = self.conns.get(&token).is_some_and(|c| c.stream.is_tls());
        if self.config.fix_sessions[slot].tls_required && !tls {
            // With passwords in use, the session is not named to whoever reaches it over
            // plain TCP: it is refused as a stranger is, after the same decoy check.
            if self.checks.hides_sessions() {
                let reason = DisconnectReason::TlsRequired;
                let detail = format!("{names}: over plain TCP, the session logs on over TLS only");
                return self.refuse_fix_stranger(token, &raw, reason, detail);
            }
            return self.refuse_fix_logon(
                token,
                slot,
                DisconnectReason::TlsRequired,
                "This session logs on over TLS only",
            );
        }
        let required = self.config.fix_sessions[slot].password_hash.is_some();
        let password = credentials::fix_password(&raw, required);
        self.fix_logon_credentials(token, slot, password, all);
    }

    // ----- the close log -----

    /// Logs the close of `conn` once: peer, protocol, session, reason and detail.
    pub(super) fn log_close(&mut self, conn: &Conn, token: Token, reason: DisconnectReason) {
        if reason == DisconnectReason::Shutdown {
            return;
        }
        let session = match (conn.kind, conn.attached) {
            (Kind::Fix, Some(slot)) => format!(" session {}", self.fix[slot].client_comp_id),
            (Kind::Binary, Some(slot)) => format!(" binary session #{slot}"),
            _ => String::new(),
        };
        let detail = conn
            .close_detail
            .as_deref()
            .map(|d| format!(": {d}"))
            .unwrap_or_default();
        self.log_line(format_args!(
            "gateway: closed {} connection {} from {}{session}: {}{detail}",
            conn.kind.name(),
            token.0,
            conn.peer,
            reason.name()
        ));
    }

    fn log_line(&mut self, line: std::fmt::Arguments<'_>) {
        let second = self.now_ms / 1_000;
        let log = &mut self.close_log;
        if second != log.second {
            if log.suppressed > 0 {
                eprintln!(
                    "gateway: {} more closes in the last second not logged (counted in bourse_gateway_disconnects_total)",
                    log.suppressed
                );
            }
            *log = CloseLog {
                second,
                lines: 0,
                suppressed: 0,
            };
        }
        if log.lines < CLOSE_LOG_LINES_PER_S {
            log.lines += 1;
            eprintln!("{line}");
        } else {
            log.suppressed += 1;
        }
    }
}

/// Whether a session whose registered networks are `allowed` (empty: any) may log on from
/// `peer`.
pub(super) fn address_allowed(allowed: &[Cidr], peer: Option<IpAddr>) -> bool {
    allowed.is_empty() || peer.is_some_and(|p| allowed.iter().any(|n| n.contains(p)))
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Fix => "FIX",
            Kind::Binary => "binary",
        }
    }
}
