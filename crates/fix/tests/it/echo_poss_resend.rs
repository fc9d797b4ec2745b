//! The echo application and PossResend (97): an order sent with
//! PossResend=Y is echoed with the flag kept, unless its ClOrdID was already
//! seen on the session, in which case it is dropped (its number still
//! counts).

use crate::common;

use bourse_fix::codec::{self, OutMessage};
use bourse_fix::tags;
use bourse_fix::{Action, EchoApplication, Session};
use common::{connected_acceptor, from_peer, logon, T0};

struct Echo {
    session: Session,
    app: EchoApplication,
    next_seq: u64,
}

impl Echo {
    fn logged_on() -> Self {
        let mut echo = Echo {
            session: connected_acceptor(),
            app: EchoApplication::new(),
            next_seq: 1,
        };
        echo.receive(logon());
        assert!(echo.session.is_logged_on());
        echo.sent();
        echo
    }

    fn receive(&mut self, m: OutMessage) {
        let bytes = from_peer(m, self.next_seq, false);
        self.next_seq += 1;
        self.session.on_bytes(T0, &bytes, &mut self.app);
    }

    fn order(&mut self, id: &str, poss_resend: Option<&str>) {
        let mut m = OutMessage::new("D");
        if let Some(flag) = poss_resend {
            m.set_header(tags::POSS_RESEND, flag);
        }
        m.push(tags::CL_ORD_ID, id).push(54, "2").push(55, "XYZ");
        self.receive(m);
    }

    /// The messages sent since the last call, each as its fields after
    /// BodyLength, CheckSum and SendingTime are taken out.
    fn sent(&mut self) -> Vec<Vec<(bourse_fix::Tag, String)>> {
        let mut out = Vec::new();
        while let Some(action) = self.session.poll_action() {
            let Action::Send(bytes) = action else {
                panic!("unexpected {action:?}");
            };
            let raw = codec::decode(&bytes, None, 1 << 20).expect("valid message");
            out.push(
                raw.fields
                    .iter()
                    .filter(|f| ![9, 10, 52].contains(&f.tag))
                    .map(|f| (f.tag, String::from_utf8_lossy(f.value).into_owned()))
                    .collect(),
            );
        }
        out
    }
}

fn fields(list: &[(bourse_fix::Tag, &str)]) -> Vec<(bourse_fix::Tag, String)> {
    list.iter().map(|&(t, v)| (t, v.to_string())).collect()
}

#[test]
fn order_with_poss_resend_is_echoed_with_the_flag() {
    let mut e = Echo::logged_on();
    e.order("first", Some("Y"));
    let expected = fields(&[
        (8, "FIX.4.4"),
        (35, "D"),
        (34, "2"),
        (49, "ISLD"),
        (56, "TW"),
        (97, "Y"),
        (11, "first"),
        (54, "2"),
        (55, "XYZ"),
    ]);
    assert_eq!(e.sent(), [expected]);
}

#[test]
fn poss_resend_no_is_echoed_as_sent_and_an_absent_flag_stays_absent() {
    let mut e = Echo::logged_on();
    e.order("a", Some("N"));
    e.order("b", None);
    let sent = e.sent();
    assert_eq!(sent.len(), 2);
    assert!(sent[0].contains(&(97, "N".into())));
    assert!(sent[1].iter().all(|(tag, _)| *tag != 97));
}

#[test]
fn poss_resend_of_a_seen_order_is_dropped_but_counted() {
    let mut e = Echo::logged_on();
    e.order("same", None);
    assert_eq!(e.sent().len(), 1);
    e.order("same", Some("Y"));
    assert_eq!(e.sent(), Vec::<Vec<_>>::new(), "the duplicate is ignored");
    assert_eq!(e.session.next_target_seq_num(), 4);
    // Without the flag the same ClOrdID is a new order and is echoed.
    e.order("same", None);
    let sent = e.sent();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].iter().all(|(tag, _)| *tag != 97));
}

#[test]
fn poss_resend_of_an_unseen_order_is_echoed_once() {
    let mut e = Echo::logged_on();
    e.order("late", Some("Y"));
    assert_eq!(e.sent().len(), 1);
    e.order("late", Some("Y"));
    assert_eq!(e.sent().len(), 0, "now it has been seen");
}
