//! Session passwords over real sockets: a FIX Logon's Password (554) and a binary Establish's
//! password are checked against the session's `password_hash`; the right one logs on, a wrong
//! or missing one is refused with a reason the client can read and counted as `bad_password`
//! on `/metrics`; sessions without a hash log on as before, and a version 1 binary client
//! (no password field) is still served in version 1.

use crate::common;

use bourse_auth::HashCost;
use bourse_client::{BinaryClient, FixClient, FixClientConfig};
use bourse_wire::frame::encode_frame;
use bourse_wire::order_entry::codec::establish_codec::EstablishEncoder;
use bourse_wire::order_entry::{FrameDecoder, Message};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn config() -> String {
    let fix_hash = bourse_auth::hash_password_with("alpha pass", HashCost::TEST_ONLY).unwrap();
    let bin_hash = bourse_auth::hash_password_with("bin-pass", HashCost::TEST_ONLY).unwrap();
    common::CONFIG
        .replace(
            "connections_max = 64\n",
            "connections_max = 64\nmonitor_listen = \"127.0.0.1:0\"\n",
        )
        .replace(
            "client_comp_id = \"ALPHA\"\n",
            &format!("client_comp_id = \"ALPHA\"\npassword_hash = \"{fix_hash}\"\n"),
        )
        .replace(
            "credentials = \"alpha-bin\"\n",
            &format!("credentials = \"alpha-bin\"\npassword_hash = \"{bin_hash}\"\n"),
        )
}

fn metric(gw: &common::TestGateway, reason: &str) -> u64 {
    let text = gw.handle.monitor().unwrap().render_metrics();
    let key = format!("bourse_gateway_disconnects_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

fn fix_config(addr: SocketAddr, comp_id: &str, password: Option<&str>) -> FixClientConfig {
    let mut c = FixClientConfig::new(addr, comp_id, "BOURSE");
    c.password = password.map(str::to_string);
    c
}

fn refusal(result: std::io::Result<FixClient>) -> String {
    match result {
        Ok(_) => panic!("the logon was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_fix_logon_needs_the_sessions_password_and_a_wrong_one_is_refused_with_a_reason() {
    let gw = common::start_with(&config());
    let fix = gw.handle.fix_addr().unwrap();

    let wrong = refusal(FixClient::connect(&fix_config(fix, "ALPHA", Some("guess"))));
    assert!(wrong.contains("Invalid password"), "{wrong}");
    assert!(common::eventually(WAIT, || metric(&gw, "bad_password") == 1));

    let missing = refusal(FixClient::connect(&fix_config(fix, "ALPHA", None)));
    assert!(missing.contains("Password (554) required"), "{missing}");
    assert!(common::eventually(WAIT, || metric(&gw, "bad_password") == 2));

    // The refusals did not touch the session: the right password logs on and trades.
    let mut alpha = FixClient::connect(&fix_config(fix, "ALPHA", Some("alpha pass"))).unwrap();
    assert!(alpha.is_logged_on());
    alpha
        .new_order("o1", None, "SBER", true, 10, Some("100.00"), '0')
        .unwrap();
    let report = alpha
        .recv_type("8", WAIT)
        .unwrap()
        .expect("an ExecutionReport");
    assert_eq!(report.get(39), Some(&b"0"[..]), "{report:?}");

    // A session without a hash logs on without a password, as before.
    let mut beta = FixClient::connect(&fix_config(fix, "BETA", None)).unwrap();
    beta.logout(WAIT).unwrap();
    alpha.logout(WAIT).unwrap();
    assert_eq!(metric(&gw, "bad_password"), 2);
}

fn raw_logon(body: &str) -> Vec<u8> {
    let mut m = format!("8=FIX.4.4\x019={}\x01{body}", body.len()).into_bytes();
    let sum: u32 = m.iter().map(|&b| u32::from(b)).sum();
    m.extend_from_slice(format!("10={:03}\x01", sum % 256).as_bytes());
    m
}

/// Everything the gateway sends until it closes the connection.
fn read_to_close(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    String::from_utf8_lossy(&all).into_owned()
}

#[test]
fn new_password_on_logon_without_a_password_store_is_refused_as_read_only() {
    let gw = common::start_with(&config());
    let mut s = TcpStream::connect(gw.handle.fix_addr().unwrap()).unwrap();
    s.write_all(&raw_logon(
        "35=A\x0149=ALPHA\x0156=BOURSE\x0134=1\x0152=20260101-00:00:00.000\x0198=0\x01108=30\x01554=alpha pass\x01925=new pass\x01",
    ))
    .unwrap();
    let answer = read_to_close(&mut s);
    assert!(answer.contains("\x0135=5\x01"), "{answer:?}");
    assert!(answer.contains("passwords are read-only"), "{answer:?}");
    assert!(common::eventually(WAIT, || metric(&gw, "logon_refused") == 1));
}

/// How the client SDK reports EstablishmentReject(BadCredentials = 1).
const BAD_CREDENTIALS: &str = "EstablishmentReject { reason: 1 }";

#[test]
fn a_binary_establish_needs_the_sessions_password() {
    let gw = common::start_with(&config());
    let bin = gw.handle.binary_addr().unwrap();

    let wrong = BinaryClient::connect_with_password(bin, "alpha-bin", "nope", 60_000, 1)
        .err()
        .expect("a wrong password is refused")
        .to_string();
    assert!(wrong.contains(BAD_CREDENTIALS), "{wrong}");
    assert!(common::eventually(WAIT, || metric(&gw, "bad_password") == 1));

    let missing = BinaryClient::connect(bin, "alpha-bin", 60_000, 1)
        .err()
        .expect("a missing password is refused")
        .to_string();
    assert!(missing.contains(BAD_CREDENTIALS), "{missing}");
    assert!(common::eventually(WAIT, || metric(&gw, "bad_password") == 2));

    let _alpha =
        BinaryClient::connect_with_password(bin, "alpha-bin", "bin-pass", 60_000, 1).unwrap();
    let _beta = BinaryClient::connect(bin, "beta-bin", 60_000, 1).unwrap();
    assert_eq!(metric(&gw, "bad_password"), 2);
}

/// A version 1 Establish: 44-byte block, header version 1, no password field.
fn establish_v1(credentials: &[u8]) -> Vec<u8> {
    let mut buf = [0u8; 256];
    let n = encode_frame(&mut buf, |mut e: EstablishEncoder| {
        e.timestamp_ns(1).keepalive_interval_ms(60_000);
        e.credentials_zero_padded(credentials);
        e
    })
    .unwrap();
    let v1_bytes = n - 32;
    let mut frame = buf[..v1_bytes].to_vec();
    frame[0..2].copy_from_slice(&(v1_bytes as u16).to_le_bytes());
    frame[4..6].copy_from_slice(&bourse_wire::order_entry::ESTABLISH_V1_BLOCK_LENGTH.to_le_bytes());
    frame[10..12].copy_from_slice(&1u16.to_le_bytes());
    frame
}

/// The first frame the gateway answers with, and its header's schema version.
fn first_answer(s: &mut TcpStream) -> (String, u16) {
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        if let Ok(Some(d)) = FrameDecoder::default().decode(&buf) {
            let version = u16::from_le_bytes([buf[10], buf[11]]);
            let what = match d.message {
                Message::EstablishmentAck(_) => "ack".to_string(),
                Message::EstablishmentReject(m) => format!("reject {:?}", m.reason()),
                other => format!("{:?}", other.template_id()),
            };
            return (what, version);
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed without an answer");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[test]
fn a_version_1_client_is_served_in_version_1_and_cannot_skip_a_password() {
    let gw = common::start_with(&config());
    let bin = gw.handle.binary_addr().unwrap();
    let mut beta = TcpStream::connect(bin).unwrap();
    beta.write_all(&establish_v1(b"beta-bin")).unwrap();
    assert_eq!(first_answer(&mut beta), ("ack".to_string(), 1));

    let mut alpha = TcpStream::connect(bin).unwrap();
    alpha.write_all(&establish_v1(b"alpha-bin")).unwrap();
    assert_eq!(
        first_answer(&mut alpha),
        ("reject BadCredentials".to_string(), 1)
    );
    assert!(common::eventually(WAIT, || metric(&gw, "bad_password") == 1));
}

/// The answer a FIX Logon gets: everything sent until the close.
fn fix_answer(gw: &common::TestGateway, fields: &str) -> String {
    let mut s = TcpStream::connect(gw.handle.fix_addr().unwrap()).unwrap();
    let body = format!("35=A\x01{fields}34=1\x0152=20260101-00:00:00.000\x0198=0\x01108=30\x01");
    s.write_all(&raw_logon(&body)).unwrap();
    read_to_close(&mut s)
}

/// The Logout's Text, and the CompIDs it was sent from and to.
fn logout_text(answer: &str) -> (String, String, String) {
    assert!(answer.contains("\x0135=5\x01"), "not a Logout: {answer:?}");
    let field = |tag: &str| {
        answer
            .split('\x01')
            .find_map(|f| f.strip_prefix(tag))
            .unwrap_or_default()
            .to_string()
    };
    (field("58="), field("49="), field("56="))
}

#[test]
fn a_stranger_is_answered_as_a_wrong_password_is_and_counted_as_what_it_was() {
    // BETA may log on only from an address this test does not use.
    let config = config().replace(
        "client_comp_id = \"BETA\"\n",
        "client_comp_id = \"BETA\"\nallowed_addresses = [\"127.0.0.2\"]\n",
    );
    let gw = common::start_with(&config);

    let wrong = fix_answer(&gw, "49=ALPHA\x0156=BOURSE\x01554=guess\x01");
    let ghost = fix_answer(&gw, "49=GHOST\x0156=BOURSE\x01554=guess\x01");
    let foreign = fix_answer(&gw, "49=BETA\x0156=BOURSE\x01554=guess\x01");
    assert_eq!(logout_text(&wrong).0, "Invalid password");
    assert_eq!(
        logout_text(&ghost),
        ("Invalid password".into(), "BOURSE".into(), "GHOST".into())
    );
    assert_eq!(logout_text(&foreign).0, "Invalid password");

    let ghost_bare = fix_answer(&gw, "49=GHOST\x0156=BOURSE\x01");
    let alpha_bare = fix_answer(&gw, "49=ALPHA\x0156=BOURSE\x01");
    assert_eq!(logout_text(&ghost_bare).0, logout_text(&alpha_bare).0);

    // The operator's counters say what each really was.
    assert!(common::eventually(WAIT, || {
        metric(&gw, "bad_password") == 2
            && metric(&gw, "unknown_session") == 2
            && metric(&gw, "address_not_allowed") == 1
    }));

    let bin = gw.handle.binary_addr().unwrap();
    let stranger = BinaryClient::connect_with_password(bin, "ghost-bin", "nope", 60_000, 1)
        .err()
        .expect("unknown credentials are refused")
        .to_string();
    assert!(stranger.contains(BAD_CREDENTIALS), "{stranger}");
    assert!(common::eventually(WAIT, || metric(&gw, "unknown_session") == 3));
}

#[test]
fn a_session_with_a_password_says_it_is_in_use_only_to_whoever_knows_the_password() {
    let gw = common::start_with(&config());
    let fix = gw.handle.fix_addr().unwrap();
    let mut alpha = FixClient::connect(&fix_config(fix, "ALPHA", Some("alpha pass"))).unwrap();

    let guess = fix_answer(&gw, "49=ALPHA\x0156=BOURSE\x01554=guess\x01");
    assert_eq!(logout_text(&guess).0, "Invalid password");
    assert!(common::eventually(WAIT, || metric(&gw, "bad_password") == 1));

    // The right password learns the session is taken: closed, counted as in use.
    let twin = fix_answer(&gw, "49=ALPHA\x0156=BOURSE\x01554=alpha pass\x01");
    assert!(!twin.contains("\x0135=A\x01"), "{twin:?}");
    assert!(common::eventually(WAIT, || metric(&gw, "session_in_use") == 1));

    // The session itself was not disturbed.
    alpha
        .new_order("o1", None, "SBER", true, 10, Some("100.00"), '0')
        .unwrap();
    assert!(alpha.recv_type("8", WAIT).unwrap().is_some());
    alpha.logout(WAIT).unwrap();
}
