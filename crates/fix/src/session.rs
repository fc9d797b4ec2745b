//! The FIX session layer as a sans-I/O state machine.
//!
//! A [`Session`] is fed received bytes ([`Session::on_bytes`]), the passage
//! of time ([`Session::on_tick`]) and transport events
//! ([`Session::on_connect`], [`Session::on_disconnect`]); every call takes
//! `now_ms` and the session reads no clock. What the session wants done is
//! queued as [`Action`]s (send these bytes, close the connection) for the
//! driver to drain with [`Session::poll_action`]. Verified messages go to an
//! [`Application`] synchronously, so a reply it produces is sent in the same
//! order a QuickFIX peer would send it.
//!
//! The rules follow the FIX session protocol as the QuickFIX engines apply
//! it, since the conformance scripts were written against them: sequence
//! gaps are queued and a ResendRequest sent; resend requests are answered by
//! replaying stored application messages with PossDupFlag=Y and
//! OrigSendingTime and by SequenceReset-GapFill for administrative ones.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::codec::{self, FrameBuffer, OutMessage, RawMessage};
use crate::dictionary::{Dictionary, Reject, Structure};
use crate::store::MessageStore;
use crate::tags::{self, msg_type, BusinessRejectReason, SessionRejectReason, Tag};
use crate::time::{self, UnixMs};

/// Which side opens the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Waits for the peer's Logon and answers it with the peer's HeartBtInt.
    Acceptor,
    /// Sends Logon on connect with this HeartBtInt.
    Initiator { heart_bt_int_s: u32 },
}

#[derive(Clone, Debug)]
pub struct SessionConfig {
    pub begin_string: String,
    pub sender_comp_id: String,
    pub target_comp_id: String,
    pub role: Role,
    /// Reject messages whose SendingTime is further than this from `now`.
    pub check_latency: bool,
    pub latency_max_ms: i64,
    pub check_comp_id: bool,
    /// Forget sequence numbers and stored messages when a connection ends.
    pub reset_on_disconnect: bool,
    /// As initiator, reset both sequence numbers to 1 and send
    /// ResetSeqNumFlag=Y on every Logon.
    pub reset_on_logon: bool,
    pub logon_timeout_ms: i64,
    pub logout_timeout_ms: i64,
    pub message_size_max_bytes: usize,
    /// Messages received ahead of a gap are queued up to this many; beyond
    /// it the peer is too far ahead and the connection is dropped.
    pub queued_messages_max: usize,
    /// At most this many stored messages are replayed for one
    /// ResendRequest; the rest of the range is left for the peer to ask again.
    pub resend_messages_max: u64,
    /// Logons asking for a longer HeartBtInt are refused.
    pub heart_bt_int_max_s: u32,
    /// As initiator, the Password (554) sent on Logon; none: no Password field.
    pub logon_password: Option<String>,
    /// As initiator, the NewPassword (925) sent on Logon with the Password: asks the acceptor
    /// to change the session's password once the old one is checked; none: no change.
    pub logon_new_password: Option<String>,
}

impl SessionConfig {
    pub fn new(begin_string: &str, sender_comp_id: &str, target_comp_id: &str, role: Role) -> Self {
        SessionConfig {
            begin_string: begin_string.to_string(),
            sender_comp_id: sender_comp_id.to_string(),
            target_comp_id: target_comp_id.to_string(),
            role,
            check_latency: true,
            latency_max_ms: 120_000,
            check_comp_id: true,
            reset_on_disconnect: false,
            reset_on_logon: false,
            logon_timeout_ms: 10_000,
            logout_timeout_ms: 2_000,
            message_size_max_bytes: codec::MESSAGE_SIZE_MAX_BYTES_DEFAULT,
            queued_messages_max: 10_000,
            resend_messages_max: 100_000,
            heart_bt_int_max_s: 3_600,
            logon_password: None,
            logon_new_password: None,
        }
    }
}

/// Something the driver must do for the session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Send(Vec<u8>),
    /// Close the connection. The session has already reset its connection
    /// state; the driver should not feed it more bytes from this connection.
    Disconnect {
        reason: String,
    },
}

/// A verified inbound message as the application sees it.
pub struct Inbound<'a> {
    pub raw: &'a RawMessage<'a>,
    pub structure: &'a Structure,
    pub dictionary: &'a Dictionary,
}

impl<'a> Inbound<'a> {
    pub fn msg_type(&self) -> &'a [u8] {
        self.raw.msg_type()
    }

    pub fn get(&self, tag: Tag) -> Option<&'a [u8]> {
        self.raw.get(tag)
    }

    pub fn seq_num(&self) -> u64 {
        self.raw.get_u64(tags::MSG_SEQ_NUM).unwrap_or(0)
    }

    /// The body's fields for re-sending: top-level fields in ascending tag
    /// order (the order QuickFIX writes a message it builds), each group's
    /// entries right after its count field in the order received.
    pub fn body_fields(&self) -> Vec<(Tag, Vec<u8>)> {
        let mut out = Vec::new();
        emit_map(self.raw, &self.structure.body, true, &mut out);
        out
    }
}

fn emit_map(
    raw: &RawMessage<'_>,
    map: &crate::dictionary::FieldMap,
    sort: bool,
    out: &mut Vec<(Tag, Vec<u8>)>,
) {
    let mut indices = map.fields.clone();
    if sort {
        indices.sort_by_key(|&i| raw.fields[i].tag);
    }
    for i in indices {
        let field = raw.fields[i];
        out.push((field.tag, field.value.to_vec()));
        if let Some(group) = map.groups.iter().find(|g| g.count_field == i) {
            for entry in &group.entries {
                emit_map(raw, entry, false, out);
            }
        }
    }
}

/// The business logic behind a session.
pub trait Application {
    fn on_logon(&mut self) {}
    fn on_logout(&mut self) {}
    /// A verified administrative message; `replies` are sent after it.
    fn on_admin_message(&mut self, _message: &Inbound<'_>, _replies: &mut Vec<OutMessage>) {}
    /// A verified application message. Returning an error makes the session
    /// answer with a BusinessMessageReject.
    fn on_app_message(
        &mut self,
        message: &Inbound<'_>,
        replies: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason>;
}

/// Why [`Session::send_app`] refused a message.
#[derive(Debug)]
pub enum SendError {
    NotLoggedOn,
    AdminMsgType,
    Store(std::io::Error),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::NotLoggedOn => write!(f, "session is not logged on"),
            SendError::AdminMsgType => {
                write!(f, "administrative messages are sent by the session itself")
            }
            SendError::Store(e) => write!(f, "message store failed: {e}"),
        }
    }
}

impl std::error::Error for SendError {}

#[derive(Debug, Default)]
struct ConnectionState {
    connected: bool,
    received_logon: bool,
    sent_logon: bool,
    sent_logout: bool,
    received_reset: bool,
    sent_reset: bool,
    connected_at_ms: UnixMs,
    logon_sent_at_ms: UnixMs,
    logout_sent_at_ms: UnixMs,
    last_received_ms: UnixMs,
    last_sent_ms: UnixMs,
    test_request_counter: u64,
    heart_bt_int_s: u32,
    /// The range asked for in our last ResendRequest, until satisfied.
    resend_range: Option<(u64, u64)>,
    /// Messages received ahead of a gap, by sequence number.
    queue: BTreeMap<u64, Vec<u8>>,
}

/// One FIX session: its configuration, store, the state of the current
/// connection and the actions waiting for the driver. See the module
/// documentation for how to drive it.
pub struct Session {
    config: SessionConfig,
    dictionary: Arc<Dictionary>,
    store: Box<dyn MessageStore>,
    inbound: FrameBuffer,
    /// The frame being processed, kept to reuse its allocation.
    frame: Vec<u8>,
    /// The field table and structure of the last message, kept to reuse their allocations.
    spare_fields: Vec<codec::Field<'static>>,
    spare_structure: Structure,
    state: ConnectionState,
    actions: VecDeque<Action>,
    /// Human-readable session events, for the driver to log (bounded).
    events: VecDeque<String>,
}

const EVENTS_MAX: usize = 1024;

impl Session {
    pub fn new(
        config: SessionConfig,
        dictionary: Arc<Dictionary>,
        store: Box<dyn MessageStore>,
    ) -> Self {
        assert!(!config.sender_comp_id.is_empty() && !config.target_comp_id.is_empty());
        assert!(
            config.latency_max_ms > 0
                && config.logout_timeout_ms > 0
                && config.logon_timeout_ms > 0
        );
        assert!(config.queued_messages_max > 0 && config.resend_messages_max > 0);
        let inbound = FrameBuffer::new(config.message_size_max_bytes);
        Session {
            config,
            dictionary,
            store,
            inbound,
            frame: Vec::new(),
            spare_fields: Vec::new(),
            spare_structure: Structure::default(),
            state: ConnectionState::default(),
            actions: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    pub fn is_connected(&self) -> bool {
        self.state.connected
    }

    pub fn is_logged_on(&self) -> bool {
        self.state.received_logon && self.state.sent_logon
    }

    pub fn next_sender_seq_num(&self) -> u64 {
        self.store.next_sender_seq_num()
    }

    pub fn next_target_seq_num(&self) -> u64 {
        self.store.next_target_seq_num()
    }

    /// Bytes of the outbound messages the session's store keeps for resending.
    pub fn stored_bytes(&self) -> usize {
        self.store.stored_bytes()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn poll_event(&mut self) -> Option<String> {
        self.events.pop_front()
    }

    fn event(&mut self, text: String) {
        if self.events.len() >= EVENTS_MAX {
            self.events.pop_front();
        }
        self.events.push_back(text);
    }

    /// A transport connection was established. An initiator sends Logon.
    pub fn on_connect(&mut self, now_ms: UnixMs) {
        assert!(!self.state.connected, "on_connect while already connected");
        self.state = ConnectionState {
            connected: true,
            connected_at_ms: now_ms,
            last_received_ms: now_ms,
            last_sent_ms: now_ms,
            ..ConnectionState::default()
        };
        self.inbound.clear();
        if let Role::Initiator { heart_bt_int_s } = self.config.role {
            self.state.heart_bt_int_s = heart_bt_int_s;
            self.generate_logon(now_ms);
        }
    }

    /// The transport closed underneath us.
    pub fn on_disconnect(&mut self, now_ms: UnixMs, app: &mut dyn Application) {
        let _ = now_ms;
        if self.state.connected {
            self.reset_connection(app);
        }
    }

    /// Feeds received bytes; complete messages are processed at once.
    pub fn on_bytes(&mut self, now_ms: UnixMs, bytes: &[u8], app: &mut dyn Application) {
        if !self.state.connected {
            return;
        }
        self.inbound.push(bytes);
        // One frame buffer for the session's life: no allocation per message.
        let mut frame = std::mem::take(&mut self.frame);
        while self.state.connected {
            match self.inbound.next_frame_into(&mut frame) {
                Ok(true) => {
                    self.next_message(now_ms, &frame, app);
                    self.next_queued(now_ms, app);
                }
                Ok(false) => break,
                Err(e) => {
                    self.disconnect(&e.to_string(), app);
                    break;
                }
            }
        }
        self.frame = frame;
    }

    /// Lets time pass: heartbeats, test requests and timeouts.
    pub fn on_tick(&mut self, now_ms: UnixMs, app: &mut dyn Application) {
        if !self.state.connected {
            return;
        }
        if !self.state.received_logon {
            let (since, what) = if self.state.sent_logon {
                (
                    self.state.logon_sent_at_ms,
                    "Timed out waiting for logon response",
                )
            } else {
                (self.state.connected_at_ms, "Timed out waiting for logon")
            };
            if now_ms - since >= self.config.logon_timeout_ms {
                self.disconnect(what, app);
            }
            return;
        }
        if self.state.heart_bt_int_s == 0 {
            return;
        }
        if self.state.sent_logout
            && now_ms - self.state.logout_sent_at_ms >= self.config.logout_timeout_ms
        {
            self.disconnect("Timed out waiting for logout response", app);
            return;
        }
        let heart_bt_int_ms = i64::from(self.state.heart_bt_int_s) * 1000;
        let since_received_ms = now_ms - self.state.last_received_ms;
        let since_sent_ms = now_ms - self.state.last_sent_ms;
        if since_received_ms < heart_bt_int_ms && since_sent_ms < heart_bt_int_ms {
            return;
        }
        // The 2.4 and 1.2 factors give the peer a margin of transmission
        // time before we probe it with a TestRequest and before we give up.
        let counter = i64::try_from(self.state.test_request_counter).unwrap_or(i64::MAX / 8);
        if since_received_ms * 5 >= heart_bt_int_ms * 12 {
            self.disconnect("Timed out waiting for heartbeat", app);
        } else if since_received_ms * 5 >= heart_bt_int_ms * 6 * (counter + 1) {
            let mut m = OutMessage::new(msg_type::TEST_REQUEST);
            m.push(tags::TEST_REQ_ID, "TEST");
            self.send_raw(now_ms, m, None);
            self.state.test_request_counter += 1;
            self.event("Sent test request TEST".into());
        } else if since_sent_ms >= heart_bt_int_ms && self.state.test_request_counter == 0 {
            self.send_raw(now_ms, OutMessage::new(msg_type::HEARTBEAT), None);
        }
    }

    /// Sends an application message: fills in the header, stores it for
    /// resending and queues the bytes. Returns the sequence number used.
    pub fn send_app(&mut self, now_ms: UnixMs, message: OutMessage) -> Result<u64, SendError> {
        self.send_app_ref(now_ms, &message)
    }

    /// As [`Session::send_app`], but the message is only read: a driver that renders every
    /// report into the same [`OutMessage`] (see [`OutMessage::reset`]) allocates none per
    /// message.
    pub fn send_app_ref(&mut self, now_ms: UnixMs, message: &OutMessage) -> Result<u64, SendError> {
        if tags::is_admin_msg_type(message.msg_type.as_bytes()) {
            return Err(SendError::AdminMsgType);
        }
        if !self.is_logged_on() {
            return Err(SendError::NotLoggedOn);
        }
        let seq = self.store.next_sender_seq_num();
        let bytes = self.fill_and_encode(now_ms, message, seq);
        self.store
            .store_message(seq, &bytes)
            .map_err(SendError::Store)?;
        self.store
            .set_next_sender_seq_num(seq + 1)
            .map_err(SendError::Store)?;
        self.state.last_sent_ms = now_ms;
        self.actions.push_back(Action::Send(bytes));
        Ok(seq)
    }

    /// Starts a Logout; the connection closes when the peer answers or the
    /// logout timeout passes.
    pub fn logout(&mut self, now_ms: UnixMs, text: Option<&str>) {
        if self.state.connected && !self.state.sent_logout {
            self.generate_logout(now_ms, text);
        }
    }

    // ---- inbound processing -------------------------------------------------

    fn next_queued(&mut self, now_ms: UnixMs, app: &mut dyn Application) {
        while self.state.connected {
            let expected = self.store.next_target_seq_num();
            let Some(frame) = self.state.queue.remove(&expected) else {
                break;
            };
            self.event(format!("Processing queued message: {expected}"));
            let kind = codec::peek_msg_type(&frame).map(<[u8]>::to_vec);
            if kind.as_deref() == Some(b"A") || kind.as_deref() == Some(b"2") {
                // Logon and ResendRequest were acted upon when they arrived.
                self.incr_target();
            } else {
                self.next_message(now_ms, &frame, app);
            }
        }
    }

    fn next_message(&mut self, now_ms: UnixMs, frame: &[u8], app: &mut dyn Application) {
        let dictionary = Arc::clone(&self.dictionary);
        // The field table and the structure are the previous message's, emptied: no
        // allocation per message.
        let fields = codec::recycle_fields(std::mem::take(&mut self.spare_fields));
        let raw = match codec::decode_reusing(
            frame,
            Some(&dictionary),
            self.config.message_size_max_bytes,
            fields,
        ) {
            Ok(raw) => raw,
            Err(e) => {
                self.event(format!("Dropped invalid message: {e}"));
                if codec::peek_msg_type(frame) == Some(b"A") {
                    self.disconnect("Logon message is not valid", app);
                }
                return;
            }
        };
        let mut structure = std::mem::take(&mut self.spare_structure);
        match dictionary.structure_into(&raw, &mut structure) {
            Ok(()) => self.next_structured(now_ms, &raw, &structure, &dictionary, app),
            Err(reject) => self.generate_reject(now_ms, &raw, reject, app),
        }
        self.spare_structure = structure;
        self.spare_fields = codec::recycle_fields(raw.fields);
    }

    fn next_structured(
        &mut self,
        now_ms: UnixMs,
        raw: &RawMessage<'_>,
        structure: &Structure,
        dictionary: &Dictionary,
        app: &mut dyn Application,
    ) {
        let msg_type = raw.msg_type();
        if raw.begin_string() != self.config.begin_string.as_bytes() {
            if !self.state.received_logon {
                self.disconnect("Incorrect BeginString before logon", app);
            } else if msg_type == b"5" {
                self.next_logout(now_ms, raw, structure, app);
            } else {
                let text = format!(
                    "Incorrect BeginString ({})",
                    String::from_utf8_lossy(raw.begin_string())
                );
                self.generate_logout(now_ms, Some(&text));
                self.incr_target();
            }
            return;
        }
        if let Err(reject) = dictionary.validate(raw, structure) {
            self.generate_reject(now_ms, raw, reject, app);
            return;
        }
        let inbound = Inbound {
            raw,
            structure,
            dictionary,
        };
        match msg_type {
            b"A" => self.next_logon(now_ms, &inbound, app),
            _ if !self.state.received_logon => {
                // A Logout in answer to our Logon says why the acceptor refused it.
                let text = match (msg_type, raw.get_str(tags::TEXT)) {
                    (b"5", Some(why)) => format!("Received logout before logon: {why}"),
                    _ => format!(
                        "Received msg type '{}' when not logged on",
                        String::from_utf8_lossy(msg_type)
                    ),
                };
                self.disconnect(&text, app);
            }
            b"0" => {
                if self.verify(now_ms, &inbound, true, true, app) {
                    self.incr_target();
                }
            }
            b"1" => {
                if self.verify(now_ms, &inbound, true, true, app) {
                    let mut hb = OutMessage::new(msg_type::HEARTBEAT);
                    if let Some(id) = raw.get(tags::TEST_REQ_ID) {
                        hb.push(tags::TEST_REQ_ID, id);
                    }
                    self.send_raw(now_ms, hb, None);
                    self.incr_target();
                }
            }
            b"4" => self.next_sequence_reset(now_ms, &inbound, app),
            b"5" => self.next_logout(now_ms, raw, structure, app),
            b"2" => self.next_resend_request(now_ms, &inbound, app),
            _ => {
                if !self.verify(now_ms, &inbound, true, true, app) {
                    return;
                }
                if tags::is_admin_msg_type(msg_type) {
                    // Reject (3) and XMLnonFIX (n): on_admin_message already ran in verify.
                    self.incr_target();
                    return;
                }
                let mut replies = Vec::new();
                let outcome = app.on_app_message(&inbound, &mut replies);
                for reply in replies {
                    self.send_raw(now_ms, reply, None);
                }
                match outcome {
                    Ok(()) => self.incr_target(),
                    Err(reason) => self.generate_business_reject(now_ms, raw, reason),
                }
            }
        }
    }

    fn next_logon(&mut self, now_ms: UnixMs, inbound: &Inbound<'_>, app: &mut dyn Application) {
        let raw = inbound.raw;
        let reset_flag = raw.get(tags::RESET_SEQ_NUM_FLAG) == Some(b"Y");
        self.state.received_reset = reset_flag;
        if reset_flag {
            self.event("Logon contains ResetSeqNumFlag=Y, resetting sequence numbers to 1".into());
            if !self.state.sent_reset && !self.store_reset(app) {
                return;
            }
        }
        let is_initiator = matches!(self.config.role, Role::Initiator { .. });
        if is_initiator && !self.state.sent_logon && !reset_flag {
            self.disconnect("Received logon response before sending request", app);
            return;
        }
        if !self.verify(now_ms, inbound, false, true, app) {
            return;
        }
        self.state.received_logon = true;
        if !is_initiator {
            let heart_bt_int_s = raw.get_u64(tags::HEART_BT_INT).unwrap_or(u64::MAX);
            if heart_bt_int_s > u64::from(self.config.heart_bt_int_max_s) {
                self.generate_logout(now_ms, Some("HeartBtInt out of range"));
                self.disconnect("HeartBtInt out of range", app);
                return;
            }
            self.state.heart_bt_int_s = heart_bt_int_s as u32;
            let mut logon = OutMessage::new(msg_type::LOGON);
            logon.push(tags::ENCRYPT_METHOD, "0");
            logon.push(tags::HEART_BT_INT, heart_bt_int_s.to_string());
            if self.state.received_reset {
                logon.push(tags::RESET_SEQ_NUM_FLAG, "Y");
            }
            self.send_raw(now_ms, logon, None);
            self.state.sent_logon = true;
        }
        self.state.sent_reset = false;
        self.state.received_reset = false;
        let seq = inbound.seq_num();
        if seq > self.store.next_target_seq_num() && !reset_flag {
            self.do_target_too_high(now_ms, raw, app);
        } else {
            self.incr_target();
        }
        if self.is_logged_on() {
            app.on_logon();
        }
    }

    fn next_sequence_reset(
        &mut self,
        now_ms: UnixMs,
        inbound: &Inbound<'_>,
        app: &mut dyn Application,
    ) {
        let raw = inbound.raw;
        let gap_fill = raw.get(tags::GAP_FILL_FLAG) == Some(b"Y");
        // A gap fill numbered below what we expect is a duplicate whatever
        // its NewSeqNo says: verify ignores it when it carries PossDupFlag=Y
        // and logs out otherwise. Applying it would skip numbers on the word
        // of a stale message, and the real messages it jumped over would
        // then be refused as too low.
        if !self.verify(now_ms, inbound, gap_fill, gap_fill, app) {
            return;
        }
        if let Some(new_seq) = raw.get_u64(tags::NEW_SEQ_NO) {
            let expected = self.store.next_target_seq_num();
            self.event(format!(
                "Received SequenceReset FROM: {expected} TO: {new_seq}"
            ));
            if new_seq > expected {
                self.advance_target_to(new_seq, app);
            } else if new_seq < expected {
                self.generate_reject(
                    now_ms,
                    raw,
                    Reject::new(SessionRejectReason::ValueIsIncorrect, None),
                    app,
                );
            }
        }
    }

    /// Moves the expected inbound number forward to `new_seq` (a sequence
    /// reset): queued messages below it can no longer be processed and are
    /// dropped, and a resend request it covers is satisfied.
    fn advance_target_to(&mut self, new_seq: u64, app: &mut dyn Application) {
        if let Err(e) = self.store.set_next_target_seq_num(new_seq) {
            self.store_failed(e, app);
            return;
        }
        let kept = self.state.queue.split_off(&new_seq);
        let skipped = std::mem::replace(&mut self.state.queue, kept);
        if !skipped.is_empty() {
            self.event(format!(
                "Dropped {} queued messages below SequenceReset TO: {new_seq}",
                skipped.len()
            ));
        }
        if let Some((_, end)) = self.state.resend_range {
            if new_seq > end {
                self.event(format!("ResendRequest up to {end} has been satisfied"));
                self.state.resend_range = None;
            }
        }
    }

    fn next_logout(
        &mut self,
        now_ms: UnixMs,
        raw: &RawMessage<'_>,
        structure: &Structure,
        app: &mut dyn Application,
    ) {
        let dictionary = Arc::clone(&self.dictionary);
        let inbound = Inbound {
            raw,
            structure,
            dictionary: &dictionary,
        };
        if !self.verify(now_ms, &inbound, false, false, app) {
            return;
        }
        let reason = if self.state.sent_logout {
            "Received logout response"
        } else {
            self.generate_logout(now_ms, None);
            "Received logout request"
        };
        self.incr_target();
        self.disconnect(reason, app);
    }

    fn next_resend_request(
        &mut self,
        now_ms: UnixMs,
        inbound: &Inbound<'_>,
        app: &mut dyn Application,
    ) {
        if !self.verify(now_ms, inbound, false, false, app) {
            return;
        }
        let raw = inbound.raw;
        let begin = raw.get_u64(tags::BEGIN_SEQ_NO).unwrap_or(1).max(1);
        let mut end = raw.get_u64(tags::END_SEQ_NO).unwrap_or(0);
        let next_sender = self.store.next_sender_seq_num();
        self.event(format!("Received ResendRequest FROM: {begin} TO: {end}"));
        if end == 0 || end == 999_999 || end >= next_sender {
            end = next_sender.saturating_sub(1);
        }
        // Bound the work one request can cause; the peer asks again for the rest.
        if end >= begin && end - begin >= self.config.resend_messages_max {
            end = begin + self.config.resend_messages_max - 1;
        }
        let mut stored = Vec::new();
        if let Err(e) = self.store.messages_in_range(begin, end, &mut stored) {
            self.store_failed(e, app);
            return;
        }
        let dictionary = Arc::clone(&self.dictionary);
        let mut current = begin;
        let mut gap_begin = 0u64;
        for (seq, bytes) in &stored {
            let seq = *seq;
            if current != seq && gap_begin == 0 {
                gap_begin = current;
            }
            let resent = match codec::decode(bytes, Some(&dictionary), usize::MAX) {
                Ok(msg) if !tags::is_admin_msg_type(msg.msg_type()) => {
                    Some(self.resend_copy(now_ms, &msg))
                }
                _ => None,
            };
            match resent {
                Some(copy) => {
                    if gap_begin != 0 {
                        self.generate_sequence_reset(now_ms, gap_begin, seq);
                    }
                    self.state.last_sent_ms = now_ms;
                    self.actions.push_back(Action::Send(copy));
                    gap_begin = 0;
                }
                None => {
                    if gap_begin == 0 {
                        gap_begin = seq;
                    }
                }
            }
            current = seq + 1;
        }
        let end_exclusive = (end + 1).min(next_sender);
        if gap_begin == 0 {
            gap_begin = current;
        }
        if end_exclusive > gap_begin {
            self.generate_sequence_reset(now_ms, gap_begin, end_exclusive);
        }
        let seq = inbound.seq_num();
        let expected = self.store.next_target_seq_num();
        if seq == expected {
            self.incr_target();
        }
    }

    /// Rebuilds a stored application message for resending: same sequence
    /// number, header and body; PossDupFlag=Y, OrigSendingTime = the
    /// original SendingTime, SendingTime = now.
    fn resend_copy(&self, now_ms: UnixMs, stored: &RawMessage<'_>) -> Vec<u8> {
        let mut m = OutMessage::new(&String::from_utf8_lossy(stored.msg_type()));
        let mut in_header = true;
        let mut orig_sending_time: Option<&[u8]> = None;
        for field in stored.fields.iter().skip(3) {
            if field.tag == tags::CHECK_SUM
                || field.tag == tags::SIGNATURE
                || field.tag == tags::SIGNATURE_LENGTH
            {
                continue;
            }
            if in_header && !self.dictionary.is_header_field(field.tag) {
                in_header = false;
            }
            if in_header {
                match field.tag {
                    tags::SENDING_TIME => orig_sending_time = Some(field.value),
                    tags::POSS_DUP_FLAG | tags::ORIG_SENDING_TIME => {}
                    tag => {
                        m.set_header(tag, field.value);
                    }
                }
            } else {
                m.push(field.tag, field.value);
            }
        }
        m.set_header(tags::POSS_DUP_FLAG, "Y");
        if let Some(orig) = orig_sending_time {
            m.set_header(tags::ORIG_SENDING_TIME, orig);
        }
        m.set_header(tags::SENDING_TIME, time::format_utc_timestamp_ms(now_ms));
        m.encode(&self.config.begin_string)
    }

    /// The checks every inbound message passes before it is acted upon:
    /// CompIDs, sequence number (too high: queue and ask for a resend; too
    /// low: PossDup or logout), SendingTime accuracy.
    fn verify(
        &mut self,
        now_ms: UnixMs,
        inbound: &Inbound<'_>,
        check_too_high: bool,
        check_too_low: bool,
        app: &mut dyn Application,
    ) -> bool {
        let raw = inbound.raw;
        if self.config.check_comp_id {
            let sender_ok =
                raw.get(tags::SENDER_COMP_ID) == Some(self.config.target_comp_id.as_bytes());
            let target_ok =
                raw.get(tags::TARGET_COMP_ID) == Some(self.config.sender_comp_id.as_bytes());
            if !sender_ok || !target_ok {
                self.generate_reject(
                    now_ms,
                    raw,
                    Reject::new(SessionRejectReason::CompIdProblem, None),
                    app,
                );
                if self.state.connected {
                    self.generate_logout(now_ms, None);
                }
                return false;
            }
        }
        let seq = inbound.seq_num();
        let expected = self.store.next_target_seq_num();
        if check_too_high && seq > expected {
            self.do_target_too_high(now_ms, raw, app);
            return false;
        }
        if check_too_low && seq < expected {
            self.do_target_too_low(now_ms, raw, app);
            return false;
        }
        if check_too_high || check_too_low {
            if let Some((_, end)) = self.state.resend_range {
                if seq >= end {
                    self.event(format!("ResendRequest up to {end} has been satisfied"));
                    self.state.resend_range = None;
                }
            }
        }
        if !self.is_good_time(now_ms, raw) {
            self.generate_reject(
                now_ms,
                raw,
                Reject::new(SessionRejectReason::SendingTimeAccuracyProblem, None),
                app,
            );
            if self.state.connected {
                self.generate_logout(now_ms, None);
            }
            return false;
        }
        self.state.last_received_ms = now_ms;
        self.state.test_request_counter = 0;
        if tags::is_admin_msg_type(raw.msg_type()) {
            let mut replies = Vec::new();
            app.on_admin_message(inbound, &mut replies);
            for reply in replies {
                self.send_raw(now_ms, reply, None);
            }
        }
        true
    }

    fn is_good_time(&self, now_ms: UnixMs, raw: &RawMessage<'_>) -> bool {
        if !self.config.check_latency {
            return true;
        }
        match raw
            .get(tags::SENDING_TIME)
            .and_then(time::parse_utc_timestamp_ms)
        {
            Some(sent_ms) => (now_ms - sent_ms).abs() <= self.config.latency_max_ms,
            None => false,
        }
    }

    fn do_target_too_high(
        &mut self,
        now_ms: UnixMs,
        raw: &RawMessage<'_>,
        app: &mut dyn Application,
    ) {
        let seq = raw.get_u64(tags::MSG_SEQ_NUM).unwrap_or(0);
        let expected = self.store.next_target_seq_num();
        self.event(format!(
            "MsgSeqNum too high, expecting {expected} but received {seq}"
        ));
        if self.state.queue.len() >= self.config.queued_messages_max
            && !self.state.queue.contains_key(&seq)
        {
            self.disconnect("Too many messages queued ahead of a sequence gap", app);
            return;
        }
        self.state.queue.insert(seq, raw.frame.to_vec());
        if let Some((begin, end)) = self.state.resend_range {
            if seq >= begin {
                self.event(format!(
                    "Already sent ResendRequest FROM: {begin} TO: {end}. Not sending another."
                ));
                return;
            }
        }
        let mut request = OutMessage::new(msg_type::RESEND_REQUEST);
        request.push(tags::BEGIN_SEQ_NO, expected.to_string());
        // FIX 4.2 and later use 0 for "everything after BeginSeqNo".
        request.push(tags::END_SEQ_NO, "0");
        self.send_raw(now_ms, request, None);
        self.state.resend_range = Some((expected, seq - 1));
    }

    fn do_target_too_low(
        &mut self,
        now_ms: UnixMs,
        raw: &RawMessage<'_>,
        app: &mut dyn Application,
    ) {
        let seq = raw.get_u64(tags::MSG_SEQ_NUM).unwrap_or(0);
        if raw.get(tags::POSS_DUP_FLAG) != Some(b"Y") {
            let expected = self.store.next_target_seq_num();
            let text = format!("MsgSeqNum too low, expecting {expected} but received {seq}");
            self.generate_logout(now_ms, Some(&text));
            self.disconnect(&text, app);
            return;
        }
        // A possible duplicate: ignore it, but check that it carries a
        // consistent OrigSendingTime, as a genuine resend must.
        if raw.msg_type() == b"4" {
            return;
        }
        let Some(orig) = raw.get(tags::ORIG_SENDING_TIME) else {
            let reject = Reject::new(
                SessionRejectReason::RequiredTagMissing,
                Some(tags::ORIG_SENDING_TIME),
            );
            self.generate_reject(now_ms, raw, reject, app);
            return;
        };
        let orig_ms = time::parse_utc_timestamp_ms(orig);
        let sent_ms = raw
            .get(tags::SENDING_TIME)
            .and_then(time::parse_utc_timestamp_ms);
        if let (Some(orig_ms), Some(sent_ms)) = (orig_ms, sent_ms) {
            if orig_ms > sent_ms {
                let reject = Reject::new(SessionRejectReason::SendingTimeAccuracyProblem, None);
                self.generate_reject(now_ms, raw, reject, app);
                if self.state.connected {
                    self.generate_logout(now_ms, None);
                }
            }
        }
    }

    // ---- outbound ------------------------------------------------------------

    /// The message as sent with sequence number `seq`: the session's header fields are
    /// written by the encoder, not set on the message, which stays as it was.
    fn fill_and_encode(&self, now_ms: UnixMs, m: &OutMessage, seq: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let header = codec::SessionHeader {
            sender_comp_id: self.config.sender_comp_id.as_bytes(),
            target_comp_id: self.config.target_comp_id.as_bytes(),
            msg_seq_num: seq,
            sending_time_ms: now_ms,
        };
        m.encode_with_session_into(&self.config.begin_string, &header, &mut out);
        out
    }

    /// Fills the header, stores and counts the message unless `seq_override`
    /// is given (gap fills reuse old numbers), and queues it for sending if
    /// the session state allows.
    fn send_raw(&mut self, now_ms: UnixMs, m: OutMessage, seq_override: Option<u64>) {
        let seq = seq_override.unwrap_or_else(|| self.store.next_sender_seq_num());
        let bytes = self.fill_and_encode(now_ms, &m, seq);
        if seq_override.is_none() {
            let stored = self
                .store
                .store_message(seq, &bytes)
                .and_then(|()| self.store.set_next_sender_seq_num(seq + 1));
            if let Err(e) = stored {
                self.event(format!("Error writing message store: {e}"));
                self.actions.push_back(Action::Disconnect {
                    reason: format!("message store failed: {e}"),
                });
                self.state.connected = false;
                return;
            }
        }
        let allowed = match m.msg_type.as_str() {
            "A" | "5" | "2" | "4" => true,
            _ => self.is_logged_on(),
        };
        if allowed && self.state.connected {
            self.state.last_sent_ms = now_ms;
            self.actions.push_back(Action::Send(bytes));
        }
    }

    fn generate_logon(&mut self, now_ms: UnixMs) {
        let mut logon = OutMessage::new(msg_type::LOGON);
        logon.push(tags::ENCRYPT_METHOD, "0");
        logon.push(tags::HEART_BT_INT, self.state.heart_bt_int_s.to_string());
        if let Some(password) = &self.config.logon_password {
            logon.push(tags::PASSWORD, password);
        }
        if let Some(new_password) = &self.config.logon_new_password {
            logon.push(tags::NEW_PASSWORD, new_password);
        }
        // With reset_on_logon both sides start again from 1: reset our store
        // and ask the peer to do the same with ResetSeqNumFlag=Y.
        let should_reset = self.config.reset_on_logon;
        if should_reset {
            if let Err(e) = self.store.reset() {
                self.event(format!("Error resetting message store: {e}"));
                self.actions.push_back(Action::Disconnect {
                    reason: format!("message store failed: {e}"),
                });
                self.state.connected = false;
                return;
            }
            logon.push(tags::RESET_SEQ_NUM_FLAG, "Y");
        }
        self.state.sent_reset = should_reset;
        self.state.last_received_ms = now_ms;
        self.state.test_request_counter = 0;
        self.state.sent_logon = true;
        self.state.logon_sent_at_ms = now_ms;
        self.send_raw(now_ms, logon, None);
    }

    fn generate_logout(&mut self, now_ms: UnixMs, text: Option<&str>) {
        let mut logout = OutMessage::new(msg_type::LOGOUT);
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            logout.push(tags::TEXT, text);
        }
        self.send_raw(now_ms, logout, None);
        self.state.sent_logout = true;
        self.state.logout_sent_at_ms = now_ms;
    }

    fn generate_sequence_reset(&mut self, now_ms: UnixMs, begin_seq: u64, new_seq: u64) {
        assert!(new_seq > begin_seq, "a gap fill moves the sequence forward");
        let mut reset = OutMessage::new(msg_type::SEQUENCE_RESET);
        reset.set_header(tags::POSS_DUP_FLAG, "Y");
        reset.set_header(
            tags::ORIG_SENDING_TIME,
            time::format_utc_timestamp_ms(now_ms),
        );
        reset.push(tags::NEW_SEQ_NO, new_seq.to_string());
        reset.push(tags::GAP_FILL_FLAG, "Y");
        self.send_raw(now_ms, reset, Some(begin_seq));
        self.event(format!("Sent SequenceReset TO: {new_seq}"));
    }

    /// Sends a session-level Reject (35=3) for `raw`. Before logon there is
    /// no session to reject within, so the connection is dropped instead.
    fn generate_reject(
        &mut self,
        now_ms: UnixMs,
        raw: &RawMessage<'_>,
        reject: Reject,
        app: &mut dyn Application,
    ) {
        if !self.state.received_logon {
            self.disconnect(
                &format!("Rejected message before logon: {}", reject.text),
                app,
            );
            return;
        }
        let kind = raw.msg_type();
        let seq = raw.get(tags::MSG_SEQ_NUM).and_then(codec::parse_u64);
        let mut m = OutMessage::new(msg_type::REJECT);
        reverse_route(&mut m, raw);
        if let Some(seq) = seq {
            m.push(tags::REF_SEQ_NUM, seq.to_string());
        }
        m.push(tags::TEXT, &reject.text);
        if let Some(tag) = reject.ref_tag {
            m.push(tags::REF_TAG_ID, tag.to_string());
        } else if reject.reason == SessionRejectReason::InvalidTagNumber {
            m.push(tags::REF_TAG_ID, "0");
        }
        if !kind.is_empty() {
            m.push(tags::REF_MSG_TYPE, kind);
        }
        m.push(
            tags::SESSION_REJECT_REASON,
            reject.reason.code().to_string(),
        );
        if kind != b"A" && kind != b"4" && seq == Some(self.store.next_target_seq_num()) {
            self.incr_target();
        }
        self.event(format!(
            "Message {} Rejected: {}",
            seq.unwrap_or(0),
            reject.text
        ));
        self.send_raw(now_ms, m, None);
    }

    fn generate_business_reject(
        &mut self,
        now_ms: UnixMs,
        raw: &RawMessage<'_>,
        reason: BusinessRejectReason,
    ) {
        let mut m = OutMessage::new(msg_type::BUSINESS_MESSAGE_REJECT);
        let seq = raw.get_u64(tags::MSG_SEQ_NUM).unwrap_or(0);
        m.push(tags::REF_SEQ_NUM, seq.to_string());
        m.push(tags::TEXT, reason.text());
        m.push(tags::REF_MSG_TYPE, raw.msg_type());
        m.push(tags::BUSINESS_REJECT_REASON, reason.code().to_string());
        self.incr_target();
        self.send_raw(now_ms, m, None);
    }

    // ---- state helpers -------------------------------------------------------

    fn incr_target(&mut self) {
        let next = self.store.next_target_seq_num() + 1;
        if let Err(e) = self.store.set_next_target_seq_num(next) {
            self.event(format!("Error writing message store: {e}"));
            self.actions.push_back(Action::Disconnect {
                reason: format!("message store failed: {e}"),
            });
            self.state.connected = false;
        }
    }

    fn store_reset(&mut self, app: &mut dyn Application) -> bool {
        match self.store.reset() {
            Ok(()) => true,
            Err(e) => {
                self.store_failed(e, app);
                false
            }
        }
    }

    fn store_failed(&mut self, e: std::io::Error, app: &mut dyn Application) {
        self.disconnect(&format!("message store failed: {e}"), app);
    }

    fn disconnect(&mut self, reason: &str, app: &mut dyn Application) {
        if !self.state.connected {
            return;
        }
        self.event(format!("Disconnecting: {reason}"));
        self.actions.push_back(Action::Disconnect {
            reason: reason.to_string(),
        });
        self.reset_connection(app);
    }

    fn reset_connection(&mut self, app: &mut dyn Application) {
        if self.state.received_logon || self.state.sent_logon {
            app.on_logout();
        }
        self.state = ConnectionState::default();
        self.inbound.clear();
        if self.config.reset_on_disconnect {
            if let Err(e) = self.store.reset() {
                self.event(format!("Error resetting message store: {e}"));
            }
        }
    }
}

/// Sets the reject's routing fields from the rejected message's, swapped:
/// whoever the message was on behalf of is who the reject is delivered to.
fn reverse_route(m: &mut OutMessage, raw: &RawMessage<'_>) {
    const SWAPS: &[(Tag, Tag)] = &[
        (tags::ON_BEHALF_OF_COMP_ID, tags::DELIVER_TO_COMP_ID),
        (tags::ON_BEHALF_OF_SUB_ID, tags::DELIVER_TO_SUB_ID),
        (tags::DELIVER_TO_COMP_ID, tags::ON_BEHALF_OF_COMP_ID),
        (tags::DELIVER_TO_SUB_ID, tags::ON_BEHALF_OF_SUB_ID),
        (tags::ON_BEHALF_OF_LOCATION_ID, tags::DELIVER_TO_LOCATION_ID),
        (tags::DELIVER_TO_LOCATION_ID, tags::ON_BEHALF_OF_LOCATION_ID),
    ];
    for &(from, to) in SWAPS {
        if let Some(value) = raw.get(from).filter(|v| !v.is_empty()) {
            m.set_header(to, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{FileStore, MemoryStore};
    use crate::testing::small_dictionary;

    /// Records what reaches the application.
    #[derive(Default)]
    struct Recorder {
        app_messages: Vec<(String, u64)>,
        logons: usize,
        logouts: usize,
    }

    impl Application for Recorder {
        fn on_logon(&mut self) {
            self.logons += 1;
        }
        fn on_logout(&mut self) {
            self.logouts += 1;
        }
        fn on_app_message(
            &mut self,
            m: &Inbound<'_>,
            _replies: &mut Vec<OutMessage>,
        ) -> Result<(), BusinessRejectReason> {
            self.app_messages.push((
                String::from_utf8_lossy(m.get(tags::CL_ORD_ID).unwrap_or(b"")).into(),
                m.seq_num(),
            ));
            Ok(())
        }
    }

    const T0: UnixMs = 1_700_000_000_000;

    fn acceptor_config() -> SessionConfig {
        SessionConfig::new("FIX.4.4", "ISLD", "TW", Role::Acceptor)
    }

    fn initiator_config(heart_bt_int_s: u32) -> SessionConfig {
        SessionConfig::new("FIX.4.4", "TW", "ISLD", Role::Initiator { heart_bt_int_s })
    }

    fn session(config: SessionConfig) -> Session {
        Session::new(
            config,
            Arc::new(small_dictionary()),
            Box::new(MemoryStore::default()),
        )
    }

    fn sent(s: &mut Session) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(a) = s.poll_action() {
            if let Action::Send(bytes) = a {
                out.push(bytes);
            }
        }
        out
    }

    fn field(bytes: &[u8], tag: Tag) -> Option<String> {
        let raw = codec::decode(bytes, None, 1 << 20).expect("we send valid messages");
        raw.get_str(tag).map(str::to_string)
    }

    /// Moves bytes both ways until neither side has anything to send.
    fn pump(
        a: &mut Session,
        a_app: &mut Recorder,
        b: &mut Session,
        b_app: &mut Recorder,
        now_ms: UnixMs,
    ) {
        for _ in 0..100 {
            let from_a = sent(a);
            let from_b = sent(b);
            if from_a.is_empty() && from_b.is_empty() {
                return;
            }
            for m in from_a {
                b.on_bytes(now_ms, &m, b_app);
            }
            for m in from_b {
                a.on_bytes(now_ms, &m, a_app);
            }
        }
        panic!("sessions kept talking");
    }

    fn order(id: &str) -> OutMessage {
        let mut m = OutMessage::new("D");
        m.push(tags::CL_ORD_ID, id).push(54, "1").push(55, "ABC");
        m
    }

    fn logged_on_pair() -> (Session, Recorder, Session, Recorder) {
        let (mut init, mut acc) = (session(initiator_config(30)), session(acceptor_config()));
        let (mut init_app, mut acc_app) = (Recorder::default(), Recorder::default());
        acc.on_connect(T0);
        init.on_connect(T0);
        pump(&mut init, &mut init_app, &mut acc, &mut acc_app, T0);
        assert!(init.is_logged_on() && acc.is_logged_on());
        (init, init_app, acc, acc_app)
    }

    #[test]
    fn an_initiator_sends_its_password_and_new_password_on_logon_only_when_configured() {
        let mut plain = session(initiator_config(30));
        plain.on_connect(T0);
        let logon = sent(&mut plain).remove(0);
        assert_eq!(
            (
                field(&logon, tags::PASSWORD),
                field(&logon, tags::NEW_PASSWORD)
            ),
            (None, None)
        );
        let mut config = initiator_config(30);
        config.logon_password = Some("old".into());
        config.logon_new_password = Some("new".into());
        let mut changing = session(config);
        changing.on_connect(T0);
        let logon = sent(&mut changing).remove(0);
        assert_eq!(field(&logon, tags::PASSWORD).as_deref(), Some("old"));
        assert_eq!(field(&logon, tags::NEW_PASSWORD).as_deref(), Some("new"));
    }

    #[test]
    fn initiator_and_acceptor_log_on_and_exchange_orders() {
        let (mut init, mut init_app, mut acc, mut acc_app) = logged_on_pair();
        assert_eq!((init_app.logons, acc_app.logons), (1, 1));
        assert_eq!(init.send_app(T0, order("a")).expect("send"), 2);
        assert_eq!(init.send_app(T0, order("b")).expect("send"), 3);
        pump(&mut init, &mut init_app, &mut acc, &mut acc_app, T0);
        assert_eq!(acc_app.app_messages, vec![("a".into(), 2), ("b".into(), 3)]);
        assert_eq!(acc.next_target_seq_num(), 4);
        init.logout(T0, None);
        pump(&mut init, &mut init_app, &mut acc, &mut acc_app, T0);
        assert!(!init.is_connected() && !acc.is_connected());
        assert_eq!((init_app.logouts, acc_app.logouts), (1, 1));
    }

    #[test]
    fn gap_is_filled_by_resend_with_poss_dup() {
        let (mut init, mut init_app, mut acc, mut acc_app) = logged_on_pair();
        init.send_app(T0, order("lost")).expect("send");
        let _dropped = sent(&mut init);
        init.send_app(T0 + 1, order("after")).expect("send");
        let after = sent(&mut init);
        for m in &after {
            acc.on_bytes(T0 + 1, m, &mut acc_app);
        }
        // The acceptor saw 3 while expecting 2: it queues 3 and asks for 2..∞.
        let request = sent(&mut acc);
        assert_eq!(request.len(), 1);
        assert_eq!(field(&request[0], tags::MSG_TYPE).as_deref(), Some("2"));
        assert_eq!(field(&request[0], tags::BEGIN_SEQ_NO).as_deref(), Some("2"));
        assert!(acc_app.app_messages.is_empty());
        for m in &request {
            init.on_bytes(T0 + 2, m, &mut init_app);
        }
        let replay = sent(&mut init);
        assert_eq!(replay.len(), 2, "both stored orders are replayed");
        assert!(replay
            .iter()
            .all(|m| field(m, tags::POSS_DUP_FLAG).as_deref() == Some("Y")));
        assert!(replay
            .iter()
            .all(|m| field(m, tags::ORIG_SENDING_TIME).is_some()));
        for m in &replay {
            acc.on_bytes(T0 + 2, m, &mut acc_app);
        }
        // 2 arrives, then the queued 3; the duplicate 3 is too low with PossDup and ignored.
        assert_eq!(
            acc_app.app_messages,
            vec![("lost".into(), 2), ("after".into(), 3)]
        );
        assert_eq!(acc.next_target_seq_num(), 4);
        pump(&mut init, &mut init_app, &mut acc, &mut acc_app, T0 + 2);
        assert!(acc.is_logged_on());
    }

    #[test]
    fn admin_messages_are_gap_filled() {
        let (mut init, mut init_app, mut acc, mut acc_app) = logged_on_pair();
        // The acceptor sends a heartbeat (admin, seq 2) then nothing else.
        acc.on_tick(T0 + 30_000, &mut acc_app);
        pump(
            &mut init,
            &mut init_app,
            &mut acc,
            &mut acc_app,
            T0 + 30_000,
        );
        let mut rr = OutMessage::new("2");
        rr.push(tags::BEGIN_SEQ_NO, "1").push(tags::END_SEQ_NO, "0");
        let seq = init.next_sender_seq_num();
        let bytes = init.fill_and_encode(T0 + 30_000, &rr, seq);
        init.store.set_next_sender_seq_num(seq + 1).expect("store");
        acc.on_bytes(T0 + 30_000, &bytes, &mut acc_app);
        let out = sent(&mut acc);
        assert_eq!(out.len(), 1);
        assert_eq!(field(&out[0], tags::MSG_TYPE).as_deref(), Some("4"));
        assert_eq!(field(&out[0], tags::MSG_SEQ_NUM).as_deref(), Some("1"));
        assert_eq!(field(&out[0], tags::NEW_SEQ_NO).as_deref(), Some("3"));
        assert_eq!(field(&out[0], tags::GAP_FILL_FLAG).as_deref(), Some("Y"));
    }

    #[test]
    fn heartbeat_test_request_and_timeout_follow_heart_bt_int() {
        let (mut init, mut init_app, mut acc, mut acc_app) = logged_on_pair();
        let _ = (&mut init, &mut init_app);
        acc.on_tick(T0 + 29_999, &mut acc_app);
        assert!(sent(&mut acc).is_empty());
        acc.on_tick(T0 + 30_000, &mut acc_app);
        let hb = sent(&mut acc);
        assert_eq!(hb.len(), 1);
        assert_eq!(field(&hb[0], tags::MSG_TYPE).as_deref(), Some("0"));
        acc.on_tick(T0 + 36_000, &mut acc_app);
        let tr = sent(&mut acc);
        assert_eq!(field(&tr[0], tags::MSG_TYPE).as_deref(), Some("1"));
        assert_eq!(field(&tr[0], tags::TEST_REQ_ID).as_deref(), Some("TEST"));
        acc.on_tick(T0 + 71_999, &mut acc_app);
        assert!(acc.is_connected());
        acc.on_tick(T0 + 72_000, &mut acc_app);
        assert!(!acc.is_connected());
        assert!(matches!(acc.poll_action(), Some(Action::Disconnect { .. })));
    }

    #[test]
    fn invalid_field_gets_session_reject_with_quickfix_wording() {
        let (mut init, _init_app, mut acc, mut acc_app) = logged_on_pair();
        let mut bad = order("x");
        bad.retain_body(|t| t != 54);
        bad.push(54, "9");
        init.send_app(T0, bad).expect("send");
        for m in sent(&mut init) {
            acc.on_bytes(T0, &m, &mut acc_app);
        }
        let out = sent(&mut acc);
        assert_eq!(field(&out[0], tags::MSG_TYPE).as_deref(), Some("3"));
        assert_eq!(
            field(&out[0], tags::TEXT).as_deref(),
            Some("Value is incorrect (out of range) for this tag")
        );
        assert_eq!(field(&out[0], tags::REF_TAG_ID).as_deref(), Some("54"));
        assert_eq!(
            field(&out[0], tags::SESSION_REJECT_REASON).as_deref(),
            Some("5")
        );
        assert_eq!(
            acc.next_target_seq_num(),
            3,
            "a rejected message still consumes its number"
        );
    }

    #[test]
    fn queueing_application_hands_over_owned_messages_and_pushes_back() {
        let (mut init, mut init_app, mut acc, _) = logged_on_pair();
        let mut queue = crate::echo::QueueingApplication::new(1);
        init.send_app(T0, order("a")).expect("send");
        init.send_app(T0, order("b")).expect("send");
        for m in sent(&mut init) {
            acc.on_bytes(T0, &m, &mut queue);
        }
        assert_eq!(queue.inbox.len(), 1);
        let first = queue.inbox.pop_front().expect("queued");
        assert_eq!((first.msg_type.as_str(), first.seq_num), ("D", 2));
        assert_eq!(first.get(tags::CL_ORD_ID), Some(&b"a"[..]));
        // The second order found the inbox full and was refused.
        let out = sent(&mut acc);
        assert_eq!(field(&out[0], tags::MSG_TYPE).as_deref(), Some("j"));
        assert_eq!(
            field(&out[0], tags::BUSINESS_REJECT_REASON).as_deref(),
            Some("4")
        );
        assert_eq!(acc.next_target_seq_num(), 4);
        let _ = &mut init_app;
    }

    #[test]
    fn oversized_message_drops_the_connection() {
        let mut config = acceptor_config();
        config.message_size_max_bytes = 256;
        let mut acc = session(config);
        let mut app = Recorder::default();
        acc.on_connect(T0);
        let mut chunk = b"8=FIX.4.4\x019=9999\x01".to_vec();
        chunk.extend(std::iter::repeat_n(b'x', 600));
        acc.on_bytes(T0, &chunk, &mut app);
        assert!(!acc.is_connected());
        assert!(matches!(acc.poll_action(), Some(Action::Disconnect { .. })));
    }

    #[test]
    fn file_store_resumes_sequence_numbers_after_restart() {
        let dir =
            std::env::temp_dir().join(format!("bourse-fix-session-resume-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let dictionary = Arc::new(small_dictionary());
        let mut init = session(initiator_config(30));
        let mut init_app = Recorder::default();
        {
            let store = FileStore::open(&dir, 100, false).expect("store");
            let mut acc = Session::new(acceptor_config(), Arc::clone(&dictionary), Box::new(store));
            let mut acc_app = Recorder::default();
            acc.on_connect(T0);
            init.on_connect(T0);
            pump(&mut init, &mut init_app, &mut acc, &mut acc_app, T0);
            init.send_app(T0, order("a")).expect("send");
            pump(&mut init, &mut init_app, &mut acc, &mut acc_app, T0);
            assert_eq!(acc.next_target_seq_num(), 3);
            // The process dies: the acceptor is dropped without a logout.
        }
        init.on_disconnect(T0, &mut init_app);
        let store = FileStore::open(&dir, 100, false).expect("reopen");
        let mut acc = Session::new(acceptor_config(), dictionary, Box::new(store));
        let mut acc_app = Recorder::default();
        assert_eq!(
            (acc.next_sender_seq_num(), acc.next_target_seq_num()),
            (2, 3)
        );
        acc.on_connect(T0 + 1000);
        init.on_connect(T0 + 1000);
        pump(&mut init, &mut init_app, &mut acc, &mut acc_app, T0 + 1000);
        assert!(acc.is_logged_on() && init.is_logged_on());
        assert_eq!(acc.next_target_seq_num(), 4);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn logon_with_sequence_number_too_low_is_logged_out() {
        let mut acc = session(acceptor_config());
        acc.store.set_next_target_seq_num(5).expect("store");
        let mut app = Recorder::default();
        acc.on_connect(T0);
        let mut logon = OutMessage::new("A");
        logon.push(98, "0").push(108, "30");
        logon
            .set_header(tags::SENDER_COMP_ID, "TW")
            .set_header(tags::TARGET_COMP_ID, "ISLD");
        logon.set_header(tags::MSG_SEQ_NUM, "1");
        logon.set_header(tags::SENDING_TIME, time::format_utc_timestamp_ms(T0));
        acc.on_bytes(T0, &logon.encode("FIX.4.4"), &mut app);
        let out = sent(&mut acc);
        assert_eq!(field(&out[0], tags::MSG_TYPE).as_deref(), Some("5"));
        assert_eq!(
            field(&out[0], tags::TEXT).as_deref(),
            Some("MsgSeqNum too low, expecting 5 but received 1")
        );
        assert!(!acc.is_connected());
    }
}
