//! The TLS listeners over real sockets: a Rust client (rustls) logs on over TLS to FIX and
//! binary sessions that have passwords and trades; plain bytes on a TLS port and a client that
//! does not trust the gateway's certificate are refused and counted as `tls_error`. The
//! certificates are made here (rcgen), never committed.

use crate::common;

use bourse_auth::HashCost;
use bourse_fix::OutMessage;
use bourse_wire::frame::encode_frame;
use bourse_wire::order_entry::codec::establish_codec::EstablishEncoder;
use bourse_wire::order_entry::{FrameDecoder, Message};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

struct Venue {
    gw: common::TestGateway,
    /// The gateway's certificate, which the clients trust.
    cert: CertificateDer<'static>,
    _files: tempfile::TempDir,
}

fn start() -> Venue {
    let files = tempfile::tempdir().unwrap();
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert_path = files.path().join("gateway.crt");
    let key_path = files.path().join("gateway.key");
    std::fs::write(&cert_path, made.cert.pem()).unwrap();
    std::fs::write(&key_path, made.key_pair.serialize_pem()).unwrap();
    let fix_hash = bourse_auth::hash_password_with("alpha pass", HashCost::TEST_ONLY).unwrap();
    let bin_hash = bourse_auth::hash_password_with("bin-pass", HashCost::TEST_ONLY).unwrap();
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
            &format!("client_comp_id = \"ALPHA\"\npassword_hash = \"{fix_hash}\"\n"),
        )
        .replace(
            "credentials = \"alpha-bin\"\n",
            &format!("credentials = \"alpha-bin\"\npassword_hash = \"{bin_hash}\"\n"),
        )
        .replace(
            "client_comp_id = \"BETA\"\n",
            "client_comp_id = \"BETA\"\ntls_required = true\n",
        )
        .replace(
            "credentials = \"beta-bin\"\n",
            "credentials = \"beta-bin\"\ntls_required = true\n",
        );
    Venue {
        gw: common::start_with(&text),
        cert: made.cert.der().clone(),
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

type TlsStream = StreamOwned<ClientConnection, TcpStream>;

fn tls_connect(addr: SocketAddr, trusted: &CertificateDer<'static>) -> TlsStream {
    let mut roots = RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    StreamOwned::new(conn, tcp)
}

fn fix_message(
    msg_type: &str,
    seq: u64,
    sending_time: &str,
    body: &[(bourse_fix::Tag, &str)],
) -> Vec<u8> {
    let mut m = OutMessage::new(msg_type);
    m.set_header(49, "ALPHA")
        .set_header(56, "BOURSE")
        .set_header(34, seq.to_string())
        .set_header(52, sending_time);
    for (tag, value) in body {
        m.push(*tag, value);
    }
    m.encode("FIX.4.4")
}

/// Reads until the text received so far contains `needle`.
fn read_until(s: &mut impl Read, seen: &mut String, needle: &str) {
    let mut buf = [0u8; 4096];
    while !seen.contains(needle) {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed before {needle:?}; got {seen:?}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

#[test]
fn a_fix_client_logs_on_over_tls_with_its_password_and_trades() {
    let v = start();
    let mut s = tls_connect(v.gw.handle.fix_tls_addr().unwrap(), &v.cert);
    let now = bourse_fix::time::format_utc_timestamp_ms(bourse_fix::time::system_now_ms());
    let logon = fix_message("A", 1, &now, &[(98, "0"), (108, "30"), (554, "alpha pass")]);
    s.write_all(&logon).unwrap();
    let mut seen = String::new();
    read_until(&mut s, &mut seen, "\x0135=A\x01");
    let order = fix_message(
        "D",
        2,
        &now,
        &[
            (11, "tls-1"),
            (55, "SBER"),
            (54, "1"),
            (38, "10"),
            (40, "2"),
            (44, "100.00"),
            (59, "0"),
            (60, &now),
        ],
    );
    s.write_all(&order).unwrap();
    read_until(&mut s, &mut seen, "\x0111=tls-1\x01");
    let report = &seen[seen.find("\x0135=8\x01").expect("an ExecutionReport")..];
    assert!(report.contains("\x0139=0\x01"), "{report:?}");
    // The gateway counts logged-on sessions on its timer.
    assert!(common::eventually(WAIT, || v
        .gw
        .handle
        .stats()
        .fix_sessions_logged_on
        .load(std::sync::atomic::Ordering::Relaxed)
        == 1));
}

#[test]
fn a_binary_client_establishes_over_tls_with_its_password() {
    let v = start();
    let mut s = tls_connect(v.gw.handle.binary_tls_addr().unwrap(), &v.cert);
    let mut buf = [0u8; 256];
    let n = encode_frame(&mut buf, |mut e: EstablishEncoder| {
        e.timestamp_ns(1).keepalive_interval_ms(60_000);
        e.credentials_zero_padded(b"alpha-bin");
        e.password_zero_padded(b"bin-pass");
        e
    })
    .unwrap();
    s.write_all(&buf[..n]).unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 512];
    let answer = loop {
        if let Ok(Some(d)) = FrameDecoder::default().decode(&got) {
            break d.message;
        }
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "closed without an answer");
        got.extend_from_slice(&chunk[..n]);
    };
    assert!(
        matches!(answer, Message::EstablishmentAck(_)),
        "{:?}",
        answer.template_id()
    );
}

#[test]
fn plain_bytes_and_untrusting_clients_on_a_tls_port_are_refused_and_counted() {
    let v = start();
    let addr = v.gw.handle.fix_tls_addr().unwrap();
    // A FIX Logon in clear on the TLS port.
    let mut plain = TcpStream::connect(addr).unwrap();
    plain.set_read_timeout(Some(WAIT)).unwrap();
    plain
        .write_all(&fix_message(
            "A",
            1,
            "20260101-00:00:00.000",
            &[(98, "0"), (108, "30")],
        ))
        .unwrap();
    let mut sink = Vec::new();
    let _ = plain.read_to_end(&mut sink);
    assert!(common::eventually(WAIT, || metric(&v.gw, "tls_error") == 1));
    // A client that trusts another certificate: its handshake fails, it says so, and leaves.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let mut doubter = tls_connect(addr, &other.cert.der().clone());
    let e = doubter
        .write_all(b"8=FIX.4.4\x01")
        .and_then(|()| doubter.flush());
    assert!(e.is_err(), "the handshake must fail");
    drop(doubter);
    assert!(common::eventually(WAIT, || metric(&v.gw, "tls_error") == 2));
    // The plain listener is unaffected.
    assert!(v.gw.handle.fix_addr().is_some());
}

#[test]
fn a_session_that_requires_tls_is_refused_over_plain_tcp() {
    let v = start();
    let plain_fix = v.gw.handle.fix_addr().unwrap();
    let config = bourse_client::FixClientConfig::new(plain_fix, "BETA", "BOURSE");
    let refused = match bourse_client::FixClient::connect(&config) {
        Ok(_) => panic!("BETA logged on over plain TCP"),
        Err(e) => e.to_string(),
    };
    // Passwords are in use, so plain TCP gets what a stranger gets (the operator's counter
    // says tls_required).
    assert!(refused.contains("Password (554) required"), "{refused}");
    let plain_bin = v.gw.handle.binary_addr().unwrap();
    assert!(bourse_client::BinaryClient::connect(plain_bin, "beta-bin", 60_000, 1).is_err());
    assert!(common::eventually(WAIT, || metric(&v.gw, "tls_required") == 2));
    // Sessions without the flag still log on over plain TCP.
    let _alpha = bourse_client::BinaryClient::connect_with_password(
        plain_bin,
        "alpha-bin",
        "bin-pass",
        60_000,
        1,
    )
    .unwrap();
}
