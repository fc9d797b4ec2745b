//! Hostile and broken clients: each case says what the client gets, that the gateway stays up,
//! that another session keeps trading, and that no connection leaks.

use crate::common;

use bourse_client::binary::BinTif;
use bourse_client::{BinaryClient, FixClient, FixClientConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(5);

/// Reads until the server closes; returns what it sent, or None if it stayed open past `timeout`.
fn read_until_closed(s: &mut TcpStream, timeout: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(got),
        }
    }
    None
}

/// Another session still trades: an order gets its New report.
fn still_trades(gw: &common::TestGateway, id: &str) {
    let cfg = FixClientConfig::new(gw.handle.fix_addr().unwrap(), "BETA", "BOURSE");
    let mut beta = FixClient::connect(&cfg).unwrap();
    beta.new_order(id, None, "SBER", true, 10, Some("90"), '0')
        .unwrap();
    let m = beta
        .recv_type("8", WAIT)
        .unwrap()
        .expect("execution report");
    assert_eq!(FixClient::field(&m, 39), Some("0"));
    beta.logout(WAIT).unwrap();
}

fn connections_back_to(gw: &common::TestGateway, n: usize) {
    let stats = gw.handle.stats();
    assert!(
        common::eventually(WAIT, || stats.connections_open.load(Ordering::Relaxed) == n),
        "connections open: {}",
        stats.connections_open.load(Ordering::Relaxed)
    );
}

fn fix_addr(gw: &common::TestGateway) -> SocketAddr {
    gw.handle.fix_addr().unwrap()
}

#[test]
fn garbage_bytes_close_the_connection_at_once_without_an_answer() {
    let gw = common::start();
    let mut s = TcpStream::connect(fix_addr(&gw)).unwrap();
    s.write_all(&[0xA5; 10_000]).unwrap();
    let got = read_until_closed(&mut s, Duration::from_secs(3)).expect("closed");
    assert!(got.is_empty(), "no answer to garbage");
    still_trades(&gw, "g1");
    connections_back_to(&gw, 0);
}

#[test]
fn a_half_message_then_silence_is_closed_at_the_logon_timeout() {
    let gw = common::start();
    let mut s = TcpStream::connect(fix_addr(&gw)).unwrap();
    s.write_all(b"8=FIX.4.4\x019=120\x0135=A\x0149=ALPHA\x01")
        .unwrap();
    let t = Instant::now();
    let got = read_until_closed(&mut s, Duration::from_secs(3)).expect("closed");
    assert!(got.is_empty());
    assert!(
        t.elapsed() >= Duration::from_millis(800),
        "closed by the 1 s logon timeout"
    );
    still_trades(&gw, "h1");
    connections_back_to(&gw, 0);
}

#[test]
fn a_ten_megabyte_message_is_cut_off_at_the_size_limit() {
    let gw = common::start();
    let mut s = TcpStream::connect(fix_addr(&gw)).unwrap();
    s.write_all(b"8=FIX.4.4\x019=10485760\x0135=A\x01").unwrap();
    let chunk = vec![b'x'; 64 * 1024];
    let mut written = 0usize;
    while written < 10 << 20 {
        match s.write(&chunk) {
            Ok(n) => written += n,
            Err(_) => break,
        }
    }
    assert!(
        read_until_closed(&mut s, Duration::from_secs(3)).is_some(),
        "disconnected"
    );
    still_trades(&gw, "t1");
    connections_back_to(&gw, 0);
}

#[test]
fn a_logon_with_the_wrong_begin_string_is_disconnected_without_a_logon() {
    let gw = common::start();
    let mut s = TcpStream::connect(fix_addr(&gw)).unwrap();
    let body =
        "35=A\x0149=ALPHA\x0156=BOURSE\x0134=1\x0152=20260101-00:00:00\x0198=0\x01108=30\x01";
    let head = format!("8=FIX.4.2\x019={}\x01", body.len());
    let mut msg = format!("{head}{body}").into_bytes();
    let sum: u32 = msg.iter().map(|&b| u32::from(b)).sum();
    msg.extend_from_slice(format!("10={:03}\x01", sum % 256).as_bytes());
    s.write_all(&msg).unwrap();
    let got = read_until_closed(&mut s, Duration::from_secs(3)).expect("closed");
    assert!(
        !String::from_utf8_lossy(&got).contains("35=A"),
        "no Logon answer"
    );
    still_trades(&gw, "w1");
    connections_back_to(&gw, 0);
}

#[test]
fn thousands_of_connection_attempts_leave_the_gateway_serving_within_its_limit() {
    let gw = common::start();
    let cfg = FixClientConfig::new(fix_addr(&gw), "ALPHA", "BOURSE");
    let mut alpha = FixClient::connect(&cfg).unwrap();
    // Connect and drop, quickly.
    for _ in 0..2_000 {
        let _ = TcpStream::connect(fix_addr(&gw));
    }
    // Hold more connections than connections_max (64) from one address: past the address's
    // share of strangers (8 by default), each newcomer displaces the address's oldest.
    let held: Vec<TcpStream> = (0..100)
        .filter_map(|_| TcpStream::connect(fix_addr(&gw)).ok())
        .collect();
    let stats = gw.handle.stats();
    assert!(common::eventually(WAIT, || stats
        .connections_accepted
        .load(Ordering::Relaxed)
        >= 2_001 + held.len() as u64));
    assert!(common::eventually(WAIT, || stats
        .connections_open
        .load(Ordering::Relaxed)
        <= 1 + 8));
    // The logged-on session keeps trading meanwhile.
    alpha
        .new_order("k1", None, "SBER", false, 10, Some("110"), '0')
        .unwrap();
    let m = alpha.recv_type("8", WAIT).unwrap().expect("report");
    assert_eq!(FixClient::field(&m, 11), Some("k1"));
    drop(held);
    // Only alpha's connection is left once the silent ones time out.
    connections_back_to(&gw, 1);
    alpha.logout(WAIT).unwrap();
    connections_back_to(&gw, 0);
}

#[test]
fn a_client_that_never_reads_is_closed_as_a_slow_consumer() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let mut flood = BinaryClient::connect(addr, "flood", 60_000, 1).unwrap();
    // New/cancel pairs, never reading the answers: the gateway's unsent output passes its
    // 256 KiB limit (after the kernel's buffers fill) and it drops the connection.
    let deadline = Instant::now() + Duration::from_secs(30);
    let stats = gw.handle.stats();
    let mut id = 1u64;
    while stats.slow_consumers_closed.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        if flood
            .new_order(id, 201, 1, true, 10, Some(9_000), BinTif::Day)
            .is_err()
        {
            break;
        }
        if flood.cancel(id + 1, id, 201, 1).is_err() {
            break;
        }
        id += 2;
    }
    assert!(
        common::eventually(WAIT, || stats.slow_consumers_closed.load(Ordering::Relaxed)
            == 1),
        "slow consumer closed"
    );
    still_trades(&gw, "s1");
    drop(flood);
    connections_back_to(&gw, 0);
    // The session itself survives: it can establish again and resume from its sequence.
    let again = BinaryClient::connect(addr, "flood", 1000, 1).unwrap();
    assert!(again.server_next_seq_at_establish > 1);
}
