//! The client SDK over TLS against a real gateway on 127.0.0.1 (FIX and binary, trusting the
//! gateway's certificate from a PEM file), and what a prober learns from refusals: a
//! `tls_required` session reached over plain TCP, and a known session's refusal, read exactly
//! as a stranger's (the same Logout text, MsgSeqNum 1 for both).

use crate::common;

use bourse_auth::HashCost;
use bourse_client::binary::{BinTif, Response};
use bourse_client::{BinaryClient, FixClient, FixClientConfig, TlsClient};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

struct Venue {
    gw: common::TestGateway,
    tls: TlsClient,
    _files: tempfile::TempDir,
}

/// ALPHA (FIX) and alpha-bin (binary) have passwords and log on over TLS only; BETA has a
/// password and may use plain TCP.
fn start() -> Venue {
    let files = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert_path = files.path().join("gateway.crt");
    let key_path = files.path().join("gateway.key");
    std::fs::write(&cert_path, made.cert.pem()).unwrap();
    std::fs::write(&key_path, made.key_pair.serialize_pem()).unwrap();
    let hash = |p: &str| bourse_auth::hash_password_with(p, HashCost::TEST_ONLY).unwrap();
    let text = common::CONFIG
        .replace(
            "connections_max = 64\n",
            &format!(
                "connections_max = 64\nmonitor_listen = \"127.0.0.1:0\"\n\
                 fix_tls_listen = \"127.0.0.1:0\"\nbinary_tls_listen = \"127.0.0.1:0\"\n\
                 tls_cert_path = \"{}\"\ntls_key_path = \"{}\"\n",
                cert_path.display(),
                key_path.display()
            ),
        )
        .replace(
            "client_comp_id = \"ALPHA\"\n",
            &format!(
                "client_comp_id = \"ALPHA\"\npassword_hash = \"{}\"\ntls_required = true\n",
                hash("alpha pass")
            ),
        )
        .replace(
            "client_comp_id = \"BETA\"\n",
            &format!(
                "client_comp_id = \"BETA\"\npassword_hash = \"{}\"\n",
                hash("beta pass")
            ),
        )
        .replace(
            "credentials = \"alpha-bin\"\n",
            &format!(
                "credentials = \"alpha-bin\"\npassword_hash = \"{}\"\ntls_required = true\n",
                hash("bin-pass")
            ),
        );
    let tls = TlsClient::from_ca_file(&cert_path, "localhost").unwrap();
    Venue {
        gw: common::start_with(&text),
        tls,
        _files: files,
    }
}

fn metric(gw: &common::TestGateway, reason: &str) -> u64 {
    let text = gw.handle.monitor().unwrap().render_metrics();
    let key = format!("bourse_gateway_disconnects_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

#[test]
fn the_client_sdk_trades_over_tls_with_fix_and_binary() {
    let v = start();
    let mut config = FixClientConfig::new(v.gw.handle.fix_tls_addr().unwrap(), "ALPHA", "BOURSE");
    config.password = Some("alpha pass".into());
    config.tls = Some(v.tls.clone());
    let mut alpha = FixClient::connect(&config).unwrap();
    alpha
        .new_order("o1", None, "SBER", true, 10, Some("100.00"), '0')
        .unwrap();
    let report = alpha
        .recv_type("8", WAIT)
        .unwrap()
        .expect("an ExecutionReport");
    assert_eq!(report.get(39), Some(&b"0"[..]), "{report:?}");
    alpha.logout(WAIT).unwrap();

    let addr = v.gw.handle.binary_tls_addr().unwrap();
    let mut bin =
        BinaryClient::connect_tls(addr, &v.tls, "alpha-bin", "bin-pass", 60_000, 1).unwrap();
    bin.new_order(1, 101, 1, false, 10, Some(10_050), BinTif::Day)
        .unwrap();
    let answer = bin.recv(WAIT).unwrap().expect("an answer over TLS");
    assert!(
        matches!(answer.response, Response::NewOrderAck { .. }),
        "{answer:?}"
    );
}

#[test]
fn the_client_sdk_refuses_a_gateway_it_does_not_trust() {
    let v = start();
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let path = v._files.path().join("other.crt");
    std::fs::write(&path, other.cert.pem()).unwrap();
    let doubter = TlsClient::from_ca_file(&path, "localhost").unwrap();
    let mut config = FixClientConfig::new(v.gw.handle.fix_tls_addr().unwrap(), "ALPHA", "BOURSE");
    config.password = Some("alpha pass".into());
    config.tls = Some(doubter);
    let e = FixClient::connect(&config)
        .err()
        .expect("an untrusted gateway");
    assert!(e.to_string().contains("TLS handshake"), "{e}");
    let wrong_name =
        TlsClient::from_ca_file(&v._files.path().join("gateway.crt"), "bourse.example");
    config.tls = Some(wrong_name.unwrap());
    assert!(FixClient::connect(&config).is_err(), "the name must match");
}

fn raw_logon(fields: &str) -> Vec<u8> {
    let body = format!("35=A\x01{fields}34=1\x0152=20260101-00:00:00.000\x0198=0\x01108=30\x01");
    let mut m = format!("8=FIX.4.4\x019={}\x01{body}", body.len()).into_bytes();
    let sum: u32 = m.iter().map(|&b| u32::from(b)).sum();
    m.extend_from_slice(format!("10={:03}\x01", sum % 256).as_bytes());
    m
}

/// The fields of the answer to a raw Logon over plain TCP, in order, without those that
/// differ by right (BodyLength, SendingTime, CheckSum) and with the CompIDs as sent.
fn answer_fields(gw: &common::TestGateway, fields: &str) -> Vec<String> {
    let mut s = TcpStream::connect(gw.handle.fix_addr().unwrap()).unwrap();
    s.write_all(&raw_logon(fields)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    String::from_utf8_lossy(&all)
        .split('\x01')
        .filter(|f| !f.is_empty())
        .filter(|f| !["9=", "52=", "10="].iter().any(|t| f.starts_with(t)))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_session_that_requires_tls_is_answered_over_plain_tcp_as_a_stranger_is() {
    let v = start();
    // The right password over plain TCP is refused as a wrong one for an unknown session is.
    let alpha = answer_fields(&v.gw, "49=ALPHA\x0156=BOURSE\x01554=alpha pass\x01");
    let ghost = answer_fields(&v.gw, "49=GHOST\x0156=BOURSE\x01554=alpha pass\x01");
    let named = |fields: &[String], who: &str| -> Vec<String> {
        fields.iter().map(|f| f.replace(who, "WHO")).collect()
    };
    assert!(
        alpha.contains(&"58=Invalid password".to_string()),
        "{alpha:?}"
    );
    assert_eq!(named(&alpha, "ALPHA"), named(&ghost, "GHOST"));
    assert!(common::eventually(WAIT, || metric(&v.gw, "tls_required") == 1));

    let plain_bin = v.gw.handle.binary_addr().unwrap();
    let refuse = |creds: &str| {
        BinaryClient::connect_with_password(plain_bin, creds, "bin-pass", 60_000, 1)
            .err()
            .expect("refused over plain TCP")
            .to_string()
    };
    assert_eq!(refuse("alpha-bin"), refuse("ghost-bin"));
    assert!(refuse("alpha-bin").contains("reason: 1"), "BadCredentials");
    assert!(common::eventually(WAIT, || metric(&v.gw, "tls_required") == 3));
}

#[test]
fn a_known_sessions_refusal_carries_the_number_a_strangers_does() {
    let v = start();
    // BETA's own numbers move on: it logs on and trades, so its next MsgSeqNum is past 1.
    let mut config = FixClientConfig::new(v.gw.handle.fix_addr().unwrap(), "BETA", "BOURSE");
    config.password = Some("beta pass".into());
    let mut beta = FixClient::connect(&config).unwrap();
    for id in ["b1", "b2", "b3"] {
        beta.new_order(id, None, "SBER", true, 10, Some("100.00"), '0')
            .unwrap();
        assert!(beta.recv_type("8", WAIT).unwrap().is_some());
    }
    beta.logout(WAIT).unwrap();

    let known = answer_fields(&v.gw, "49=BETA\x0156=BOURSE\x01554=guess\x01");
    let ghost = answer_fields(&v.gw, "49=GHOST\x0156=BOURSE\x01554=guess\x01");
    assert!(known.contains(&"34=1".to_string()), "{known:?}");
    let named = |fields: &[String], who: &str| -> Vec<String> {
        fields.iter().map(|f| f.replace(who, "WHO")).collect()
    };
    assert_eq!(named(&known, "BETA"), named(&ghost, "GHOST"));
    // The missing password too.
    let known = answer_fields(&v.gw, "49=BETA\x0156=BOURSE\x01");
    let ghost = answer_fields(&v.gw, "49=GHOST\x0156=BOURSE\x01");
    assert_eq!(named(&known, "BETA"), named(&ghost, "GHOST"));
}
