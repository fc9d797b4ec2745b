//! Binary (SBE) sessions in the gateway's event loop: framing a connection's bytes,
//! Establish and its answer, Terminate, keepalive-driven Sequence messages, retransmission
//! of the session's sequenced responses, and the hand-over of each decoded request
//! (`binary_front::parse_request`) to the router, after the session's throttle.

use super::*;
use crate::binary_front::Parsed;
use crate::router::ClientId;
use bourse_wire::order_entry::codec::{
    establishment_ack_codec::EstablishmentAckEncoder,
    establishment_reject_code::EstablishmentRejectCode,
    establishment_reject_codec::EstablishmentRejectEncoder,
    retransmission_codec::RetransmissionEncoder, sequence_codec::SequenceEncoder,
    terminate_codec::TerminateEncoder, termination_code::TerminationCode,
};

impl Server {
    pub(super) fn on_binary_bytes(&mut self, token: Token, bytes: &[u8]) {
        if self.checks.is_parked(token) {
            return self.hold_while_checking(token, bytes);
        }
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.inbuf.extend_from_slice(bytes);
        let decoder = FrameDecoder::default();
        let mut pos = 0usize;
        let buf = std::mem::take(&mut conn.inbuf);
        loop {
            match decoder.decode(&buf[pos..]) {
                Ok(Some(d)) => {
                    pos += d.frame_bytes;
                    self.on_binary_message(token, d.message);
                    match self.conns.get(&token) {
                        Some(c) if !c.closing => {}
                        _ => return,
                    }
                    // An Establish whose password is being checked: the rest waits for it.
                    if self.checks.is_parked(token) {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let attached = self.conns.get(&token).is_some_and(|c| c.attached.is_some());
                    let reason = if attached {
                        DisconnectReason::BinaryTerminate
                    } else {
                        DisconnectReason::Garbled
                    };
                    self.binary_terminate_because(token, TerminationCode::InvalidFrame, reason);
                    if let Some(c) = self.conns.get_mut(&token) {
                        c.close_detail = Some(format!("invalid frame: {e}"));
                    }
                    return;
                }
            }
        }
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.inbuf = buf;
            conn.inbuf.drain(..pos);
        }
    }

    /// Queues a binary frame for a connection.
    pub(super) fn write_to(&mut self, token: Token, frame: &[u8]) {
        if let Some(conn) = self.conns.get_mut(&token) {
            self.counters.binary_msgs_out += 1;
            let start = conn.out.len();
            conn.out.extend_from_slice(frame);
            if conn.wire_version < oe::SCHEMA_VERSION {
                oe::set_frame_version(&mut conn.out[start..], conn.wire_version);
            }
            self.dirty.push(token);
        }
    }

    pub(super) fn binary_terminate(&mut self, token: Token, code: TerminationCode) {
        self.binary_terminate_because(token, code, DisconnectReason::BinaryTerminate);
    }

    /// Sends Terminate with `code` and closes the connection once it is written, counted as
    /// `reason`.
    pub(super) fn binary_terminate_because(
        &mut self,
        token: Token,
        code: TerminationCode,
        reason: DisconnectReason,
    ) {
        let mut buf = [0u8; FRAME_BYTES_MAX];
        if let Ok(n) = encode_frame(&mut buf, |mut e: TerminateEncoder| {
            e.reason(code);
            e
        }) {
            self.write_to(token, &buf[..n]);
        }
        if let Some(conn) = self.conns.get_mut(&token) {
            conn.closing = true;
            conn.close_reason = reason;
            if conn.close_detail.is_none() {
                conn.close_detail = Some(format!("Terminate {code:?}"));
            }
            if let Some(j) = conn.attached {
                self.bin[j].conn = None;
            }
        }
    }

    fn binary_establish(
        &mut self,
        token: Token,
        ts: u64,
        keepalive_ms: u32,
        credentials: [u8; 32],
        password: [u8; 32],
    ) {
        let creds = bourse_wire::ascii_field(&credentials).unwrap_or("");
        let slot = self.bin.iter().position(|s| s.credentials == creds);
        let peer = self.conns.get(&token).map(|c| c.peer.ip());
        let tls = self.conns.get(&token).is_some_and(|c| c.stream.is_tls());
        // A stranger (unknown credentials, an address its session does not allow, or plain
        // TCP for a session that establishes over TLS only) is answered as a wrong password
        // is; the log and the counter say what it was.
        let names = format!("credentials {creds:?}");
        if !tls && slot.is_some_and(|j| self.config.binary_sessions[j].tls_required) {
            let refusal = (
                DisconnectReason::TlsRequired,
                EstablishmentRejectCode::Unspecified,
            );
            let detail = format!("{names}: over plain TCP, the session establishes over TLS only");
            return self.refuse_binary_stranger(token, ts, &password, refusal, detail);
        }
        // Without passwords in use, an address refused is told Unspecified (a stranger learns
        // nothing more).
        let Some(j) = slot else {
            let refusal = (
                DisconnectReason::UnknownSession,
                EstablishmentRejectCode::BadCredentials,
            );
            return self.refuse_binary_stranger(token, ts, &password, refusal, names);
        };
        if !admission::address_allowed(&self.bin[j].allowed_addresses, peer) {
            let refusal = (
                DisconnectReason::AddressNotAllowed,
                EstablishmentRejectCode::Unspecified,
            );
            return self.refuse_binary_stranger(token, ts, &password, refusal, names);
        }
        // A session with a password says it is in use only to whoever knows the password
        // (checked again once the password is).
        let hidden = self.config.binary_sessions[j].password_hash.is_some();
        let keepalive_range = oe::KEEPALIVE_INTERVAL_MS_MIN..=oe::KEEPALIVE_INTERVAL_MS_MAX;
        let code = if self.bin[j].conn.is_some() && !hidden {
            Some(EstablishmentRejectCode::AlreadyEstablished)
        } else if !keepalive_range.contains(&keepalive_ms) {
            Some(EstablishmentRejectCode::KeepaliveOutOfRange)
        } else {
            None
        };
        if let Some(code) = code {
            let reason = match code {
                EstablishmentRejectCode::AlreadyEstablished => DisconnectReason::SessionInUse,
                _ => DisconnectReason::LogonRefused,
            };
            let detail = format!("EstablishmentReject {code:?}");
            return self.binary_reject(token, ts, code, reason, &detail);
        }
        self.binary_establish_credentials(token, j, ts, keepalive_ms, password);
    }

    /// Answers an Establish with EstablishmentReject `code` and closes the connection once it
    /// is written, counted as `reason` with `detail` in its log line.
    pub(super) fn binary_reject(
        &mut self,
        token: Token,
        ts: u64,
        code: EstablishmentRejectCode,
        reason: DisconnectReason,
        detail: &str,
    ) {
        let mut buf = [0u8; FRAME_BYTES_MAX];
        if let Ok(n) = encode_frame(&mut buf, |mut e: EstablishmentRejectEncoder| {
            e.request_timestamp_ns(ts).reason(code);
            e
        }) {
            self.write_to(token, &buf[..n]);
        }
        if let Some(c) = self.conns.get_mut(&token) {
            c.closing = true;
            c.close_reason = reason;
            c.close_detail = Some(detail.to_string());
        }
    }

    /// The connection becomes binary session `j`: EstablishmentAck.
    pub(super) fn binary_accept(&mut self, token: Token, j: usize, ts: u64, keepalive_ms: u32) {
        let mut buf = [0u8; FRAME_BYTES_MAX];
        let s = &mut self.bin[j];
        s.conn = Some(token);
        s.keepalive_ms = keepalive_ms;
        s.last_recv_ms = self.now_ms;
        s.last_sent_ms = self.now_ms;
        let next = s.next_seq;
        self.attach(token, j);
        if let Ok(n) = encode_frame(&mut buf, |mut e: EstablishmentAckEncoder| {
            e.request_timestamp_ns(ts)
                .next_seq_no(next)
                .keepalive_interval_ms(keepalive_ms);
            e
        }) {
            self.write_to(token, &buf[..n]);
        }
    }

    fn on_binary_message(&mut self, token: Token, message: Message<'_>) {
        let attached = self.conns.get(&token).and_then(|c| c.attached);
        let Some(j) = attached else {
            match message {
                Message::Establish(m) => {
                    // Answer in the client's version (at least 1, at most ours).
                    if let Some(c) = self.conns.get_mut(&token) {
                        c.wire_version = m.acting_version.clamp(1, oe::SCHEMA_VERSION);
                    }
                    self.binary_establish(
                        token,
                        m.timestamp_ns(),
                        m.keepalive_interval_ms(),
                        m.credentials(),
                        m.password(),
                    )
                }
                _ => self.binary_terminate_because(
                    token,
                    TerminationCode::NotEstablished,
                    DisconnectReason::NotLogon,
                ),
            }
            return;
        };
        self.bin[j].last_recv_ms = self.now_ms;
        let sref = self.bin[j].sref;
        let template = message.template_id() as u16;
        if message.template_id().is_client_request() {
            self.counters.binary_msgs_in += 1;
            let kind = match message {
                Message::NewOrder(_) => Some(CommandKind::NewOrder),
                Message::CancelOrder(_) => Some(CommandKind::Cancel),
                Message::ReplaceOrder(_) => Some(CommandKind::Replace),
                Message::MassCancel(_) => Some(CommandKind::MassCancel),
                _ => None,
            };
            self.router.note_request(false, kind);
            if let Err(throttled) = self.router.throttle(sref, self.now_ms) {
                let ref_id = match message {
                    Message::NewOrder(m) => Some(m.cl_ord_id()),
                    Message::CancelOrder(m) => Some(m.cl_ord_id()),
                    Message::ReplaceOrder(m) => Some(m.cl_ord_id()),
                    Message::MassCancel(m) => Some(m.cl_ord_id()),
                    _ => None,
                };
                let report = Report::BusinessReject {
                    ref_msg_type: String::new(),
                    ref_seq_num: 0,
                    ref_id: ref_id.map(ClientId::Num),
                    ref_template_id: template,
                    throttled_retry_ms: Some(throttled.retry_ms),
                    text: format!("throttle: more than {} messages/s", throttled.msgs_per_s),
                    ts_ns: self.now_ns,
                };
                self.router.business_reject(sref, report);
                return;
            }
        }
        let ts = self.now_ns;
        match message {
            Message::Sequence(_) => {}
            Message::Terminate(_) => self.binary_terminate_because(
                token,
                TerminationCode::Finished,
                DisconnectReason::Logout,
            ),
            Message::RetransmitRequest(m) => {
                self.binary_retransmit(token, j, m.timestamp_ns(), m.from_seq_no(), m.count())
            }
            Message::Establish(_) => self.binary_terminate(token, TerminationCode::Unspecified),
            Message::NewOrder(_)
            | Message::CancelOrder(_)
            | Message::ReplaceOrder(_)
            | Message::MassCancel(_) => {
                match binary_front::parse_request(&self.router, &message, ts) {
                    Some(Parsed::Request(request)) => self.router.handle(sref, request, ts),
                    Some(Parsed::RejectNew(req, g)) => {
                        self.router
                            .reject_new(sref, &req, RejectCause::Gateway(g), ts)
                    }
                    Some(Parsed::Reject(report)) => self.router.report(sref, report),
                    None => {}
                }
            }
            _ => {
                let report = Report::BusinessReject {
                    ref_msg_type: String::new(),
                    ref_seq_num: 0,
                    ref_id: None,
                    ref_template_id: template,
                    throttled_retry_ms: None,
                    text: "unsupported message from a client".into(),
                    ts_ns: ts,
                };
                self.router.business_reject(sref, report);
            }
        }
    }

    fn binary_retransmit(&mut self, token: Token, j: usize, ts: u64, from: u64, count: u32) {
        let s = &self.bin[j];
        if count == 0 || count > oe::RETRANSMIT_COUNT_MAX || from < s.first_kept_seq || from == 0 {
            return self.binary_terminate(token, TerminationCode::RetransmitLimitExceeded);
        }
        let end = from.saturating_add(u64::from(count)).min(s.next_seq);
        let n = end.saturating_sub(from);
        let mut buf = [0u8; FRAME_BYTES_MAX];
        if let Ok(len) = encode_frame(&mut buf, |mut e: RetransmissionEncoder| {
            e.request_timestamp_ns(ts).next_seq_no(from).count(n as u32);
            e
        }) {
            self.write_to(token, &buf[..len]);
        }
        for seq in from..end {
            let idx = (seq - self.bin[j].first_kept_seq) as usize;
            if let Some(frame) = self.bin[j].sent.get(idx).cloned() {
                self.write_to(token, &frame);
            }
        }
    }

    pub(super) fn binary_send(&mut self, j: usize, frame: &[u8]) {
        let s = &mut self.bin[j];
        s.next_seq += 1;
        s.sent.push_back(frame.into());
        self.stats
            .binary_resend_bytes
            .fetch_add(frame.len(), Ordering::Relaxed);
        if s.sent.len() > self.config.gateway.stored_messages_max {
            if let Some(old) = s.sent.pop_front() {
                self.stats
                    .binary_resend_bytes
                    .fetch_sub(old.len(), Ordering::Relaxed);
            }
            s.first_kept_seq += 1;
        }
        s.last_sent_ms = self.now_ms;
        if let Some(t) = s.conn {
            self.write_to(t, frame);
            self.stats.reports_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The binary sessions' timers: a session silent for too many keepalive intervals is
    /// terminated; one the gateway has not written to for an interval gets a Sequence.
    pub(super) fn binary_tick(&mut self, now: u64) {
        let mut buf = [0u8; FRAME_BYTES_MAX];
        for j in 0..self.bin.len() {
            let Some(token) = self.bin[j].conn else {
                continue;
            };
            let s = &self.bin[j];
            let keepalive = u64::from(s.keepalive_ms);
            if now.saturating_sub(s.last_recv_ms)
                > keepalive * u64::from(oe::KEEPALIVE_MISSED_INTERVALS_MAX)
            {
                self.binary_terminate_because(
                    token,
                    TerminationCode::KeepaliveTimeout,
                    DisconnectReason::HeartbeatTimeout,
                );
                continue;
            }
            if now.saturating_sub(s.last_sent_ms) >= keepalive {
                let next = s.next_seq;
                if let Ok(n) = encode_frame(&mut buf, |mut e: SequenceEncoder| {
                    e.next_seq_no(next);
                    e
                }) {
                    self.bin[j].last_sent_ms = now;
                    self.write_to(token, &buf[..n]);
                }
            }
        }
    }
}
