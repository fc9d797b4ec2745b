//! SequenceReset-GapFill at every point of resend processing.
//!
//! An acceptor that sees a gap queues what arrived ahead of it and sends one
//! ResendRequest; the peer then replays. A gap fill in that replay can come
//! before the queued messages are reached, while they are being worked
//! through, or after all of them, and it can be numbered above, at or below
//! what the acceptor expects. A gap fill numbered at or above the expected
//! number is honoured once, in turn, and the acceptor never asks again for
//! what it covered. One numbered below is a duplicate and is ignored, as
//! FIX requires of any PossDupFlag=Y message numbered too low: what it would
//! have skipped is asked for again when the next message shows the gap. The
//! test plays the peer with hand-built messages so that every number is
//! chosen.

use crate::common;

use bourse_fix::codec::{self, OutMessage};
use bourse_fix::tags::{self, BusinessRejectReason};
use bourse_fix::{Action, Application, Inbound, Session};
use common::{connected_acceptor, from_peer, logon, T0};

/// The ClOrdIDs and sequence numbers of the orders the application got.
#[derive(Default)]
struct Orders(Vec<(String, u64)>);

impl Application for Orders {
    fn on_app_message(
        &mut self,
        m: &Inbound<'_>,
        _replies: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason> {
        let id = String::from_utf8_lossy(m.get(tags::CL_ORD_ID).unwrap_or(b""));
        self.0.push((id.into_owned(), m.seq_num()));
        Ok(())
    }
}

/// How the peer marks a message it sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dup {
    /// A first transmission.
    No,
    /// A resend: PossDupFlag=Y with OrigSendingTime.
    Yes,
}

struct Acceptor {
    session: Session,
    app: Orders,
}

impl Acceptor {
    /// An acceptor logged on by a peer Logon numbered 1, so expecting 2.
    fn logged_on() -> Self {
        let mut acceptor = Acceptor {
            session: connected_acceptor(),
            app: Orders::default(),
        };
        acceptor.receive(logon(), 1, Dup::No);
        assert!(acceptor.session.is_logged_on());
        assert_eq!(acceptor.sent_types(), ["A"]);
        acceptor
    }

    fn receive(&mut self, m: OutMessage, seq: u64, dup: Dup) {
        let bytes = from_peer(m, seq, dup == Dup::Yes);
        self.session.on_bytes(T0, &bytes, &mut self.app);
    }

    fn order(&mut self, id: &str, seq: u64, dup: Dup) {
        let mut m = OutMessage::new("D");
        m.push(tags::CL_ORD_ID, id).push(54, "1").push(55, "ABC");
        self.receive(m, seq, dup);
    }

    fn gap_fill(&mut self, seq: u64, new_seq_no: u64, dup: Dup) {
        let mut m = OutMessage::new("4");
        m.push(tags::GAP_FILL_FLAG, "Y")
            .push(tags::NEW_SEQ_NO, new_seq_no.to_string());
        self.receive(m, seq, dup);
    }

    /// Every message the acceptor sent since the last call, decoded to its
    /// type and fields; a disconnect shows as "disconnect".
    fn sent(&mut self) -> Vec<(String, Vec<(bourse_fix::Tag, String)>)> {
        let mut out = Vec::new();
        while let Some(action) = self.session.poll_action() {
            match action {
                Action::Send(bytes) => {
                    let raw = codec::decode(&bytes, None, 1 << 20).expect("valid message");
                    let fields = raw
                        .fields
                        .iter()
                        .map(|f| (f.tag, String::from_utf8_lossy(f.value).into_owned()))
                        .collect();
                    out.push((String::from_utf8_lossy(raw.msg_type()).into_owned(), fields));
                }
                Action::Disconnect { .. } => out.push(("disconnect".into(), Vec::new())),
            }
        }
        out
    }

    fn sent_types(&mut self) -> Vec<String> {
        self.sent().into_iter().map(|(kind, _)| kind).collect()
    }

    fn delivered(&self) -> Vec<u64> {
        self.app.0.iter().map(|(_, seq)| *seq).collect()
    }

    /// Orders numbered `seqs` arrive while 2 is expected: all are queued
    /// and one ResendRequest for 2 onwards goes out.
    fn with_queued_orders(seqs: &[u64]) -> Self {
        let mut a = Acceptor::logged_on();
        for &seq in seqs {
            a.order(&format!("o{seq}"), seq, Dup::No);
        }
        let sent = a.sent();
        assert_eq!(sent.len(), 1, "one ResendRequest for the whole gap");
        let (kind, fields) = &sent[0];
        assert_eq!(kind, "2");
        assert!(fields.contains(&(tags::BEGIN_SEQ_NO, "2".into())));
        assert!(a.delivered().is_empty());
        assert_eq!(a.session.next_target_seq_num(), 2);
        a
    }

    /// The acceptor is in sequence at `next` and asks for nothing: a fresh
    /// order numbered `next` is delivered at once and nothing is sent.
    fn assert_in_sequence_at(&mut self, next: u64) {
        assert_eq!(self.session.next_target_seq_num(), next);
        self.order("fresh", next, Dup::No);
        assert_eq!(self.delivered().last(), Some(&next));
        assert_eq!(
            self.sent_types(),
            Vec::<String>::new(),
            "no second ResendRequest"
        );
        assert!(self.session.is_logged_on());
    }
}

#[test]
fn gap_fill_before_the_queued_messages_leads_straight_to_them() {
    let mut a = Acceptor::with_queued_orders(&[5, 6]);
    a.gap_fill(2, 5, Dup::Yes);
    assert_eq!(a.delivered(), [5, 6]);
    assert_eq!(a.sent_types(), Vec::<String>::new());
    a.assert_in_sequence_at(7);
}

#[test]
fn gap_fill_overtaken_by_the_queued_messages_is_ignored_and_the_gap_asked_for_again() {
    // 3 and 4 were queued; the replayed 2 releases them, so the replay's gap
    // fill numbered 3 arrives after the acceptor moved on to 5. Numbered too
    // low, it is a duplicate and skips nothing, so 7 waits in the queue.
    let mut a = Acceptor::with_queued_orders(&[3, 4, 7]);
    a.order("o2", 2, Dup::Yes);
    assert_eq!(a.delivered(), [2, 3, 4]);
    assert_eq!(a.session.next_target_seq_num(), 5);
    a.gap_fill(3, 7, Dup::Yes);
    assert_eq!(a.session.next_target_seq_num(), 5);
    assert_eq!(a.sent_types(), Vec::<String>::new());
    // The peer's next message shows the gap again: the acceptor asks for 5
    // onwards, and the peer's gap fill numbered 5 releases the queue.
    a.order("o8", 8, Dup::No);
    let sent = a.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, "2");
    assert!(sent[0].1.contains(&(tags::BEGIN_SEQ_NO, "5".into())));
    a.gap_fill(5, 7, Dup::Yes);
    assert_eq!(a.delivered(), [2, 3, 4, 7, 8]);
    assert_eq!(a.sent_types(), Vec::<String>::new());
    a.assert_in_sequence_at(9);
}

#[test]
fn late_gap_fill_with_poss_dup_is_ignored_whatever_its_new_seq_no() {
    // Below, at and beyond the expected 4: none of them moves the sequence.
    for new_seq_no in [3, 4, 6] {
        let mut a = Acceptor::with_queued_orders(&[3]);
        a.order("o2", 2, Dup::Yes);
        assert_eq!(a.session.next_target_seq_num(), 4);
        a.gap_fill(2, new_seq_no, Dup::Yes);
        assert_eq!(
            a.sent_types(),
            Vec::<String>::new(),
            "NewSeqNo {new_seq_no}: no reject, no logout, no resend request"
        );
        a.assert_in_sequence_at(4);
    }
}

#[test]
fn late_gap_fill_without_poss_dup_is_a_sequence_error() {
    // Numbered below what is expected and not marked as a resend, it is not
    // part of any replay: the peer's numbering is broken.
    for new_seq_no in [3, 4, 6] {
        let mut a = Acceptor::with_queued_orders(&[3]);
        a.order("o2", 2, Dup::Yes);
        a.gap_fill(3, new_seq_no, Dup::No);
        let sent = a.sent();
        let kinds: Vec<&str> = sent.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["5", "disconnect"], "NewSeqNo {new_seq_no}");
        assert!(sent[0].1.contains(&(
            tags::TEXT,
            "MsgSeqNum too low, expecting 4 but received 3".into()
        )));
        assert!(!a.session.is_connected());
    }
}

#[test]
fn gap_fill_numbered_as_expected_applies_with_or_without_poss_dup() {
    for dup in [Dup::No, Dup::Yes] {
        let mut a = Acceptor::with_queued_orders(&[6]);
        a.gap_fill(2, 6, dup);
        assert_eq!(a.delivered(), [6], "{dup:?}");
        assert_eq!(a.sent_types(), Vec::<String>::new());
        a.assert_in_sequence_at(7);
    }
}

#[test]
fn gap_fill_numbered_as_expected_going_backwards_is_rejected() {
    let mut a = Acceptor::with_queued_orders(&[4]);
    a.order("o2", 2, Dup::Yes);
    a.order("o3", 3, Dup::Yes);
    assert_eq!(a.session.next_target_seq_num(), 5);
    a.gap_fill(5, 3, Dup::Yes);
    let sent = a.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, "3", "a session Reject");
    assert!(sent[0]
        .1
        .contains(&(tags::SESSION_REJECT_REASON, "5".into())));
    assert!(a.session.is_logged_on());
}

#[test]
fn gap_fill_numbered_ahead_is_queued_and_applied_in_turn() {
    // The peer's replay of 2 is lost again; its gap fill numbered 4 and the
    // order 3 arrive first and wait in the queue with the original 7.
    let mut a = Acceptor::with_queued_orders(&[7]);
    a.order("o3", 3, Dup::Yes);
    a.gap_fill(4, 7, Dup::Yes);
    assert_eq!(a.sent_types(), Vec::<String>::new(), "already asked");
    assert!(a.delivered().is_empty());
    a.order("o2", 2, Dup::Yes);
    assert_eq!(a.delivered(), [2, 3, 7]);
    a.assert_in_sequence_at(8);
}

#[test]
fn gap_fill_over_queued_messages_drops_them_and_ends_the_resend() {
    // The peer says 2..=5 hold nothing to deliver: what was queued there
    // can never be processed and must not hold queue space.
    let mut a = Acceptor::with_queued_orders(&[3, 5, 8]);
    a.gap_fill(2, 6, Dup::Yes);
    assert!(a.delivered().is_empty());
    assert_eq!(a.session.next_target_seq_num(), 6);
    a.order("o6", 6, Dup::No);
    a.order("o7", 7, Dup::No);
    assert_eq!(a.delivered(), [6, 7, 8]);
    assert_eq!(a.sent_types(), Vec::<String>::new());
    a.assert_in_sequence_at(9);
}

#[test]
fn gap_fill_that_leaves_part_of_the_gap_lets_the_resend_go_on() {
    // Covering 2..=3 leaves 4 missing: the resend request still stands, so
    // the queued 6 waits and a later message does not trigger a new request.
    let mut a = Acceptor::with_queued_orders(&[6]);
    a.gap_fill(2, 4, Dup::Yes);
    assert_eq!(a.session.next_target_seq_num(), 4);
    a.order("o7", 7, Dup::No);
    assert_eq!(a.sent_types(), Vec::<String>::new(), "already asked");
    a.order("o4", 4, Dup::Yes);
    a.gap_fill(5, 6, Dup::Yes);
    assert_eq!(a.delivered(), [4, 6, 7]);
    a.assert_in_sequence_at(8);
}
