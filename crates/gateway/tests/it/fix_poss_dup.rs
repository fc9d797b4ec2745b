//! A FIX client's message numbered below what the gateway expects: with PossDupFlag=Y it is a
//! duplicate and is ignored (a SequenceReset-GapFill included, whatever its NewSeqNo), without
//! it the gateway logs the session out. The client is a raw socket so that every number and
//! flag is chosen by the test.

use crate::common;

use bourse_fix::codec::{self, FrameBuffer, OutMessage};
use bourse_fix::tags;
use bourse_fix::time::format_utc_timestamp_ms;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long to wait for an answer the gateway owes; only a broken gateway waits this long.
const WAIT: Duration = Duration::from_secs(5);

/// A message the gateway sent: its type and fields.
#[derive(Debug)]
struct Received {
    msg_type: String,
    fields: Vec<(bourse_fix::Tag, String)>,
}

impl Received {
    fn get(&self, tag: bourse_fix::Tag) -> Option<&str> {
        self.fields
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, v)| v.as_str())
    }
}

/// The session ALPHA of the test gateway, played by hand over a socket.
struct RawClient {
    stream: TcpStream,
    frames: FrameBuffer,
}

impl RawClient {
    /// Connected and logged on with a Logon numbered 1: the gateway then expects 2.
    fn logged_on(gw: &common::TestGateway) -> Self {
        let stream = TcpStream::connect(gw.handle.fix_addr().unwrap()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let mut client = RawClient {
            stream,
            frames: FrameBuffer::new(1 << 20),
        };
        let mut logon = OutMessage::new("A");
        logon
            .push(tags::ENCRYPT_METHOD, "0")
            .push(tags::HEART_BT_INT, "30");
        client.send(logon, 1);
        assert_eq!(client.recv().msg_type, "A");
        client
    }

    /// Sends `m` numbered `seq`, with whatever header fields the caller set on it.
    fn send(&mut self, mut m: OutMessage, seq: u64) {
        m.set_header(tags::SENDER_COMP_ID, "ALPHA")
            .set_header(tags::TARGET_COMP_ID, "BOURSE")
            .set_header(tags::MSG_SEQ_NUM, seq.to_string())
            .set_header(tags::SENDING_TIME, format_utc_timestamp_ms(now_ms()));
        self.stream.write_all(&m.encode("FIX.4.4")).unwrap();
    }

    /// Sends `m` numbered `seq` as a resend: PossDupFlag=Y with OrigSendingTime.
    fn resend(&mut self, mut m: OutMessage, seq: u64) {
        m.set_header(tags::POSS_DUP_FLAG, "Y")
            .set_header(tags::ORIG_SENDING_TIME, format_utc_timestamp_ms(now_ms()));
        self.send(m, seq);
    }

    fn test_request(&mut self, id: &str, seq: u64) {
        let mut m = OutMessage::new("1");
        m.push(tags::TEST_REQ_ID, id);
        self.send(m, seq);
    }

    /// The next message from the gateway; "closed" if it closed the connection first.
    fn recv(&mut self) -> Received {
        let deadline = Instant::now() + WAIT;
        let mut frame = Vec::new();
        let mut buf = [0u8; 4096];
        while !self.frames.next_frame_into(&mut frame).unwrap() {
            assert!(Instant::now() < deadline, "no answer from the gateway");
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Received {
                        msg_type: "closed".into(),
                        fields: Vec::new(),
                    }
                }
                Ok(n) => self.frames.push(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("read: {e}"),
            }
        }
        let raw = codec::decode(&frame, None, 1 << 20).unwrap();
        Received {
            msg_type: String::from_utf8_lossy(raw.msg_type()).into_owned(),
            fields: raw
                .fields
                .iter()
                .map(|f| (f.tag, String::from_utf8_lossy(f.value).into_owned()))
                .collect(),
        }
    }

    /// Sends a TestRequest numbered `seq` and checks that the next thing the gateway sends is
    /// the Heartbeat answering it: `seq` was the number it expected.
    fn assert_expects(&mut self, seq: u64) {
        let id = format!("T{seq}");
        self.test_request(&id, seq);
        let answer = self.recv();
        assert_eq!(answer.msg_type, "0", "{answer:?}");
        assert_eq!(answer.get(tags::TEST_REQ_ID), Some(id.as_str()));
    }
}

fn now_ms() -> i64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since_epoch.as_millis()).unwrap()
}

fn order(cl_ord_id: &str) -> OutMessage {
    let mut m = OutMessage::new("D");
    m.push(11, cl_ord_id)
        .push(1, "101")
        .push(55, "SBER")
        .push(54, "1")
        .push(60, format_utc_timestamp_ms(now_ms()))
        .push(38, "10")
        .push(40, "2")
        .push(44, "99")
        .push(59, "0");
    m
}

#[test]
fn duplicate_gap_fill_below_the_expected_number_is_ignored_and_the_session_goes_on() {
    let gw = common::start();
    let mut alpha = RawClient::logged_on(&gw);
    // The reproduction: 35=4 34=1 43=Y 36=20 123=Y, with no OrigSendingTime.
    let mut gap_fill = OutMessage::new("4");
    gap_fill.set_header(tags::POSS_DUP_FLAG, "Y");
    gap_fill
        .push(tags::NEW_SEQ_NO, "20")
        .push(tags::GAP_FILL_FLAG, "Y");
    alpha.send(gap_fill, 1);
    // Had the gap fill been applied, 2 would be too low and answered with a Logout.
    alpha.assert_expects(2);
    alpha.assert_expects(3);
}

#[test]
fn duplicate_order_below_the_expected_number_is_not_processed_twice() {
    let gw = common::start();
    let mut alpha = RawClient::logged_on(&gw);
    alpha.send(order("d1"), 2);
    let new = alpha.recv();
    assert_eq!((new.msg_type.as_str(), new.get(11)), ("8", Some("d1")));
    alpha.resend(order("d1"), 2);
    alpha.send(order("d2"), 3);
    // The gateway answers one session's requests in the order it read them, so a second
    // answer to d1 (a report or a reject) would come before d2's report.
    let next = alpha.recv();
    assert_eq!((next.msg_type.as_str(), next.get(11)), ("8", Some("d2")));
    alpha.assert_expects(4);
}

#[test]
fn message_below_the_expected_number_without_poss_dup_logs_out() {
    let gw = common::start();
    let mut alpha = RawClient::logged_on(&gw);
    alpha.assert_expects(2);
    alpha.test_request("again", 2);
    let logout = alpha.recv();
    assert_eq!(logout.msg_type, "5");
    assert_eq!(
        logout.get(tags::TEXT),
        Some("MsgSeqNum too low, expecting 3 but received 2")
    );
    assert_eq!(alpha.recv().msg_type, "closed");
}
