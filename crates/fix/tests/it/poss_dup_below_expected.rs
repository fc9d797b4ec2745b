//! A message numbered below what the acceptor expects: with PossDupFlag=Y it
//! is a duplicate of something already processed and is ignored (no state
//! change, no reject, no logout), a SequenceReset-GapFill included whatever
//! its NewSeqNo; without PossDupFlag=Y the peer's numbering is broken and
//! the acceptor logs out.

use crate::common;

use bourse_fix::codec::{self, OutMessage};
use bourse_fix::tags::{self, BusinessRejectReason};
use bourse_fix::{Action, Application, Inbound, Session};
use common::{connected_acceptor, from_peer, logon, T0};

/// The ClOrdIDs of the orders the application got, in order.
#[derive(Default)]
struct Orders(Vec<String>);

impl Application for Orders {
    fn on_app_message(
        &mut self,
        m: &Inbound<'_>,
        _replies: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason> {
        let id = String::from_utf8_lossy(m.get(tags::CL_ORD_ID).unwrap_or(b""));
        self.0.push(id.into_owned());
        Ok(())
    }
}

/// What the acceptor did, decoded: a sent message as its type and fields,
/// a disconnect as "disconnect" with no fields.
type Sent = Vec<(String, Vec<(bourse_fix::Tag, String)>)>;

struct Acceptor {
    session: Session,
    app: Orders,
}

impl Acceptor {
    /// Logged on by the peer's Logon numbered 1, so expecting 2.
    fn logged_on() -> Self {
        let mut a = Acceptor {
            session: connected_acceptor(),
            app: Orders::default(),
        };
        a.feed(&from_peer(logon(), 1, false));
        assert_eq!(kinds(&a.sent()), ["A"]);
        assert_eq!(a.session.next_target_seq_num(), 2);
        a
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.session.on_bytes(T0, bytes, &mut self.app);
    }

    fn order(&mut self, id: &str, seq: u64, resend: bool) {
        let mut m = OutMessage::new("D");
        m.push(tags::CL_ORD_ID, id).push(54, "1").push(55, "ABC");
        self.feed(&from_peer(m, seq, resend));
    }

    fn test_request(&mut self, id: &str, seq: u64) {
        let mut m = OutMessage::new("1");
        m.push(tags::TEST_REQ_ID, id);
        self.feed(&from_peer(m, seq, false));
    }

    fn sent(&mut self) -> Sent {
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
}

fn kinds(sent: &Sent) -> Vec<&str> {
    sent.iter().map(|(kind, _)| kind.as_str()).collect()
}

/// The gap fill of the reproduction, exactly as the peer sent it:
/// `35=4 34=1 43=Y 36=20 123=Y`, with no OrigSendingTime.
fn duplicate_gap_fill_numbered_1_to_20() -> Vec<u8> {
    let mut m = OutMessage::new("4");
    m.set_header(tags::POSS_DUP_FLAG, "Y");
    m.push(tags::NEW_SEQ_NO, "20")
        .push(tags::GAP_FILL_FLAG, "Y");
    from_peer(m, 1, false)
}

#[test]
fn duplicate_gap_fill_below_the_expected_number_is_ignored_and_the_session_goes_on() {
    let mut a = Acceptor::logged_on();
    a.feed(&duplicate_gap_fill_numbered_1_to_20());
    assert!(
        a.sent().is_empty(),
        "no reject, no logout, no resend request"
    );
    assert_eq!(
        a.session.next_target_seq_num(),
        2,
        "NewSeqNo 20 not applied"
    );

    a.test_request("PING", 2);
    let sent = a.sent();
    assert_eq!(kinds(&sent), ["0"], "a Heartbeat and nothing else");
    assert!(sent[0].1.contains(&(tags::TEST_REQ_ID, "PING".into())));
    assert!(a.session.is_logged_on());
    assert_eq!(a.session.next_target_seq_num(), 3);
}

#[test]
fn duplicate_application_message_below_the_expected_number_is_not_processed_twice() {
    let mut a = Acceptor::logged_on();
    a.order("o2", 2, false);
    a.order("o2", 2, true);
    assert_eq!(a.app.0, ["o2"]);
    assert!(a.sent().is_empty(), "no reject, no logout");
    assert!(a.session.is_logged_on());
    assert_eq!(a.session.next_target_seq_num(), 3);
}

#[test]
fn message_below_the_expected_number_without_poss_dup_logs_out() {
    let mut a = Acceptor::logged_on();
    a.order("o2", 2, false);
    a.order("again", 2, false);
    let sent = a.sent();
    assert_eq!(kinds(&sent), ["5", "disconnect"]);
    assert!(sent[0].1.contains(&(
        tags::TEXT,
        "MsgSeqNum too low, expecting 3 but received 2".into()
    )));
    assert_eq!(a.app.0, ["o2"]);
    assert!(!a.session.is_connected());
}
