//! Applications that run behind a [`Session`](crate::Session) without
//! the rest of bourse: the echo application of QuickFIX's acceptance-test
//! server, used to check the session layer against QuickFIX's scripts; an
//! application that rejects everything; and one that queues owned copies of
//! application messages for a driver to handle outside the callback.

use std::collections::{HashSet, VecDeque};

use crate::codec::OutMessage;
use crate::session::{Application, Inbound};
use crate::tags::{self, msg_type, BusinessRejectReason, Tag};

/// The application of QuickFIX's acceptance-test server: echoes orders,
/// security definitions and quote requests, answers `echo:` news and
/// XMLnonFIX, accepts trade capture report requests and rejects anything
/// else as an unsupported message type.
#[derive(Debug, Default)]
pub struct EchoApplication {
    /// ClOrdIDs seen on this session, to drop PossResend duplicates.
    seen_cl_ord_ids: HashSet<Vec<u8>>,
}

/// Bound on remembered ClOrdIDs; past it the set starts over, which can only
/// let a very old PossResend duplicate through.
const ECHO_CL_ORD_IDS_MAX: usize = 100_000;

impl EchoApplication {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Application for EchoApplication {
    fn on_admin_message(&mut self, message: &Inbound<'_>, replies: &mut Vec<OutMessage>) {
        if message.msg_type() == msg_type::XML_NON_FIX.as_bytes() {
            let mut news = OutMessage::new(msg_type::NEWS);
            news.push(
                tags::HEADLINE,
                format!(
                    "Successfully received 'n' message with seqNo={}",
                    message.seq_num()
                ),
            );
            replies.push(news);
        }
    }

    fn on_app_message(
        &mut self,
        message: &Inbound<'_>,
        replies: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason> {
        let kind = message.msg_type();
        match kind {
            b"D" => {
                let cl_ord_id = message.get(tags::CL_ORD_ID).unwrap_or(b"").to_vec();
                let poss_resend = message.get(tags::POSS_RESEND) == Some(b"Y");
                if poss_resend && self.seen_cl_ord_ids.contains(&cl_ord_id) {
                    return Ok(());
                }
                if self.seen_cl_ord_ids.len() >= ECHO_CL_ORD_IDS_MAX {
                    self.seen_cl_ord_ids.clear();
                }
                self.seen_cl_ord_ids.insert(cl_ord_id);
                replies.push(echo_of(message));
                Ok(())
            }
            b"d" | b"R" => {
                replies.push(echo_of(message));
                Ok(())
            }
            b"B" => {
                let headline = message.get(tags::HEADLINE).unwrap_or(b"");
                if let Some(rest) = headline.strip_prefix(b"echo:") {
                    let mut news = OutMessage::new(msg_type::NEWS);
                    if let Some(encoding) = message.get(tags::MESSAGE_ENCODING) {
                        news.set_header(tags::MESSAGE_ENCODING, encoding);
                    }
                    news.push(tags::HEADLINE, rest);
                    if let Some(len) = message.get(tags::ENCODED_HEADLINE_LEN) {
                        news.push(tags::ENCODED_HEADLINE_LEN, len);
                    }
                    if let Some(encoded) = message.get(tags::ENCODED_HEADLINE) {
                        news.push(tags::ENCODED_HEADLINE, encoded);
                    }
                    replies.push(news);
                }
                Ok(())
            }
            b"AD" => Ok(()),
            _ => Err(BusinessRejectReason::UnsupportedMessageType),
        }
    }
}

/// The echo of an application message: the same type and body under a new
/// header, which keeps PossResend (97) as QuickFIX's test server does (it
/// sends a copy of the message, whose header the session refills but for
/// that flag), so the peer sees that what it gets back was a possible resend.
fn echo_of(message: &Inbound<'_>) -> OutMessage {
    let mut m = OutMessage::new(&String::from_utf8_lossy(message.msg_type()));
    if let Some(poss_resend) = message.get(tags::POSS_RESEND) {
        m.set_header(tags::POSS_RESEND, poss_resend);
    }
    for (tag, value) in message.body_fields() {
        m.push(tag, value);
    }
    m
}

/// An application that accepts nothing: every application message is
/// answered with a BusinessMessageReject. Useful for a bare session-layer
/// endpoint.
#[derive(Debug, Default)]
pub struct RejectingApplication;

impl Application for RejectingApplication {
    fn on_app_message(
        &mut self,
        _message: &Inbound<'_>,
        _replies: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason> {
        Err(BusinessRejectReason::UnsupportedMessageType)
    }
}

/// An owned copy of a verified application message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedMessage {
    pub msg_type: String,
    pub seq_num: u64,
    /// Every field in wire order, header and trailer included.
    pub fields: Vec<(Tag, Vec<u8>)>,
}

impl OwnedMessage {
    pub fn get(&self, tag: Tag) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v.as_slice())
    }
}

/// Queues application messages for a driver that handles them outside the
/// session callback (on another thread, say). The queue is bounded: when it
/// is full, messages are refused with a BusinessMessageReject
/// (ApplicationNotAvailable), so a stalled consumer pushes back on the peer
/// instead of growing memory.
#[derive(Debug)]
pub struct QueueingApplication {
    pub inbox: VecDeque<OwnedMessage>,
    inbox_messages_max: usize,
}

impl QueueingApplication {
    pub fn new(inbox_messages_max: usize) -> Self {
        assert!(inbox_messages_max > 0);
        QueueingApplication {
            inbox: VecDeque::new(),
            inbox_messages_max,
        }
    }
}

impl Application for QueueingApplication {
    fn on_app_message(
        &mut self,
        message: &Inbound<'_>,
        _replies: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason> {
        if self.inbox.len() >= self.inbox_messages_max {
            return Err(BusinessRejectReason::ApplicationNotAvailable);
        }
        self.inbox.push_back(OwnedMessage {
            msg_type: String::from_utf8_lossy(message.msg_type()).into_owned(),
            seq_num: message.seq_num(),
            fields: message
                .raw
                .fields
                .iter()
                .map(|f| (f.tag, f.value.to_vec()))
                .collect(),
        });
        Ok(())
    }
}
