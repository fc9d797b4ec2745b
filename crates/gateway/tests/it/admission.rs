//! Strangers cannot keep a firm out: connections that never log on, or trickle a Logon byte
//! by byte, from one address or many, are held to their own quota while configured FIX and
//! binary sessions log on and trade; each close is counted by reason on `/metrics`.

use crate::common;

use bourse_client::binary::BinTif;
use bourse_client::{BinaryClient, FixClient, FixClientConfig};
use socket2::{Domain, Socket, Type};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);
const PRELOGON_MAX: usize = 16;
const PER_ADDRESS_MAX: usize = 4;

fn config() -> String {
    common::CONFIG
        .replace(
            "connections_max = 64\n",
            &format!(
                "connections_max = 64\nprelogon_connections_max = {PRELOGON_MAX}\n\
             prelogon_per_address_max = {PER_ADDRESS_MAX}\nlogon_timeout_ms = 30000\n\
             monitor_listen = \"127.0.0.1:0\"\n"
            ),
        )
        // The common file's 1 s timeout would let the strangers go before the test is done.
        .replace("logon_timeout_ms = 1000\n", "")
}

/// A connection to `to` from the loopback address `127.0.0.<host>`.
fn connect_from(host: u8, to: SocketAddr) -> TcpStream {
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 0);
    s.bind(&from.into()).unwrap();
    s.connect(&to.into()).unwrap();
    s.into()
}

/// Whether the gateway closed `s` (reads EOF or a reset within `timeout`).
fn closed_within(s: &mut TcpStream, timeout: Duration) -> bool {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
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
fn idle_and_trickling_strangers_cannot_keep_configured_sessions_from_logging_on() {
    let gw = common::start_with(&config());
    let fix = gw.handle.fix_addr().unwrap();
    let bin = gw.handle.binary_addr().unwrap();
    let stats = gw.handle.stats();
    let accepted = |n: u64| {
        assert!(
            common::eventually(WAIT, || stats.connections_accepted.load(Ordering::Relaxed)
                >= n),
            "accepted {}",
            stats.connections_accepted.load(Ordering::Relaxed)
        );
    };

    // One address: its share is held; each newcomer past it displaces the address's
    // longest-waiting stranger, so the address's newest connections are the ones open.
    let mut one: Vec<TcpStream> = (0..PER_ADDRESS_MAX + 3)
        .map(|_| connect_from(2, fix))
        .collect();
    accepted(one.len() as u64);
    for s in one.iter_mut().take(3) {
        assert!(
            closed_within(s, WAIT),
            "displaced past the per-address share"
        );
    }
    assert_eq!(stats.connections_refused.load(Ordering::Relaxed), 0);
    assert_eq!(
        stats.connections_open.load(Ordering::Relaxed),
        PER_ADDRESS_MAX
    );

    // Many addresses, both ports, half of them trickling a Logon: more than the quota.
    let mut many: Vec<TcpStream> = Vec::new();
    for host in 10..20u8 {
        for k in 0..PER_ADDRESS_MAX {
            let to = if k % 2 == 0 { fix } else { bin };
            many.push(connect_from(host, to));
        }
    }
    let total = (one.len() + many.len()) as u64;
    accepted(total);
    for (i, s) in many.iter_mut().enumerate().filter(|(i, _)| i % 3 == 0) {
        // A Logon's first bytes, a few at a time (on the binary port they are garbage).
        let _ = s.write_all(&b"8=FIX.4.4\x019=7"[..1 + i % 10]);
    }
    assert!(
        common::eventually(WAIT, || stats.connections_open.load(Ordering::Relaxed)
            <= PRELOGON_MAX),
        "strangers held to their quota: {}",
        stats.connections_open.load(Ordering::Relaxed)
    );

    // Configured sessions log on meanwhile, FIX and binary, and trade.
    let mut alpha = FixClient::connect(&FixClientConfig::new(fix, "ALPHA", "BOURSE")).unwrap();
    let mut alpha_bin = BinaryClient::connect(bin, "alpha-bin", 60_000, 1).unwrap();
    alpha
        .new_order("adm1", None, "SBER", true, 10, Some("90"), '0')
        .unwrap();
    let m = alpha.recv_type("8", WAIT).unwrap().expect("report");
    assert_eq!(FixClient::field(&m, 39), Some("0"));
    alpha_bin
        .new_order(1, 101, 1, true, 10, Some(9_000), BinTif::Day)
        .unwrap();
    assert!(alpha_bin.recv(WAIT).unwrap().is_some(), "binary report");

    // The strangers keep trickling; the sessions stay, and no stranger got past its quota.
    for s in many.iter_mut() {
        let _ = s.write_all(b"8");
    }
    let m = alpha.new_order("adm2", None, "SBER", true, 10, Some("90"), '0');
    assert!(m.is_ok());
    assert!(alpha.recv_type("8", WAIT).unwrap().is_some());
    assert!(stats.connections_open.load(Ordering::Relaxed) <= PRELOGON_MAX + 2);

    // Every close was counted by its reason.
    assert!(common::eventually(WAIT, || metric(&gw, "address_quota") == 3));
    // Beyond the quota every stranger was closed: displaced by a newer one, refused for its
    // address, or cut for its garbage (FIX bytes on the binary port).
    let closed = || {
        ["prelogon_quota", "address_quota", "garbled"]
            .iter()
            .map(|r| metric(&gw, r))
            .sum::<u64>()
    };
    let beyond = (one.len() + many.len() - PRELOGON_MAX) as u64;
    assert!(
        common::eventually(WAIT, || closed() >= beyond),
        "closed {} of {beyond}",
        closed()
    );
    assert!(metric(&gw, "prelogon_quota") > 0);
    alpha.logout(WAIT).unwrap();
}

#[test]
fn a_megabyte_of_body_length_digits_is_cut_at_once_and_counted() {
    let gw = common::start_with(&config());
    let mut s = TcpStream::connect(gw.handle.fix_addr().unwrap()).unwrap();
    s.write_all(b"8=FIX.4.4\x019=").unwrap();
    // The gateway closes after a few digits; the rest of the megabyte may not be written.
    let digits = vec![b'1'; 1 << 20];
    let _ = s.write_all(&digits);
    // Closed long before the 30 s logon timeout of this configuration.
    assert!(closed_within(&mut s, WAIT));
    assert!(common::eventually(WAIT, || metric(&gw, "oversized") == 1));
}

fn logon(body: &str) -> Vec<u8> {
    let mut m = format!("8=FIX.4.4\x019={}\x01{body}", body.len()).into_bytes();
    let sum: u32 = m.iter().map(|&b| u32::from(b)).sum();
    m.extend_from_slice(format!("10={:03}\x01", sum % 256).as_bytes());
    m
}

#[test]
fn each_careless_logon_is_closed_at_once_and_counted_by_its_reason() {
    let gw = common::start_with(&config());
    let fix = gw.handle.fix_addr().unwrap();
    let body = |sender: &str| {
        format!("35=A\x0149={sender}\x0156=BOURSE\x0134=1\x0152=20260101-00:00:00.000\x0198=0\x01108=30\x01")
    };
    let mut bad_sum = logon(&body("ALPHA"));
    let n = bad_sum.len();
    bad_sum[n - 2] = if bad_sum[n - 2] == b'9' {
        b'0'
    } else {
        bad_sum[n - 2] + 1
    };
    let short = String::from_utf8(logon(&body("ALPHA"))).unwrap().replacen(
        &format!("9={}", body("ALPHA").len()),
        &format!("9={}", body("ALPHA").len() + 3),
        1,
    );
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("bad_checksum", bad_sum),
        ("bad_body_length", short.into_bytes()),
        ("unknown_session", logon(&body("NOBODY"))),
        (
            "not_logon",
            logon("35=0\x0149=ALPHA\x0156=BOURSE\x0134=1\x0152=20260101-00:00:00.000\x01"),
        ),
        ("garbled", b"GET /metrics HTTP/1.1\r\n\r\n".to_vec()),
    ];
    for (reason, bytes) in cases {
        let mut s = TcpStream::connect(fix).unwrap();
        s.write_all(&bytes).unwrap();
        // The wrong BodyLength announces more bytes than were sent: the next bytes decide.
        if reason == "bad_body_length" {
            let _ = s.write_all(b"xyz1234567");
        }
        assert!(closed_within(&mut s, WAIT), "{reason}: closed");
        assert!(
            common::eventually(WAIT, || metric(&gw, reason) == 1),
            "{reason} counted"
        );
    }
}

#[test]
fn a_session_logs_on_only_from_its_allowed_addresses() {
    let text = config()
        .replace(
            "client_comp_id = \"ALPHA\"\n",
            "client_comp_id = \"ALPHA\"\nallowed_addresses = [\"127.0.0.1\"]\n",
        )
        .replace(
            "credentials = \"alpha-bin\"\n",
            "credentials = \"alpha-bin\"\nallowed_addresses = [\"127.0.0.1\"]\n",
        );
    let gw = common::start_with(&text);
    let fix = gw.handle.fix_addr().unwrap();
    let bin = gw.handle.binary_addr().unwrap();
    // From another loopback address: refused, counted.
    let mut s = connect_from(5, fix);
    s.write_all(&logon(
        "35=A\x0149=ALPHA\x0156=BOURSE\x0134=1\x0152=20260101-00:00:00.000\x0198=0\x01108=30\x01",
    ))
    .unwrap();
    assert!(closed_within(&mut s, WAIT));
    let mut b = connect_from(5, bin);
    let mut establish = [0u8; 128];
    let n = bourse_wire::frame::encode_frame(
        &mut establish,
        |mut e: bourse_wire::order_entry::codec::establish_codec::EstablishEncoder| {
            e.timestamp_ns(1).keepalive_interval_ms(1_000);
            e.credentials_zero_padded(b"alpha-bin");
            e
        },
    )
    .unwrap();
    b.write_all(&establish[..n]).unwrap();
    assert!(closed_within(&mut b, WAIT));
    assert!(common::eventually(WAIT, || metric(
        &gw,
        "address_not_allowed"
    ) == 2));
    // From the allowed address: both log on.
    let mut alpha = FixClient::connect(&FixClientConfig::new(fix, "ALPHA", "BOURSE")).unwrap();
    let _bin = BinaryClient::connect(bin, "alpha-bin", 60_000, 1).unwrap();
    alpha.logout(WAIT).unwrap();
}

/// A session bound to its firm's network (`allowed_sources`) logs on even when its client
/// waits a second before sending the Logon (QuickFIX/J's habit) while strangers from other
/// addresses open connections as fast as they can: a stranger from elsewhere never displaces
/// a connection from a registered network.
#[test]
fn a_slow_logon_from_a_registered_network_gets_in_beside_a_flood_of_strangers() {
    let text = config().replace(
        "client_comp_id = \"ALPHA\"\n",
        "client_comp_id = \"ALPHA\"\nallowed_sources = [\"127.0.0.77/32\"]\n",
    );
    let gw = common::start_with(&text);
    let fix = gw.handle.fix_addr().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // Strangers from 30 addresses, each new one held until 200 are open, then the
            // oldest dropped: a stream of newcomers for as long as the client takes.
            let mut open = std::collections::VecDeque::new();
            let mut opened = 0u64;
            while !stop.load(Ordering::Relaxed) {
                open.push_back(connect_from(10 + (opened % 30) as u8, fix));
                opened += 1;
                if open.len() > 200 {
                    open.pop_front();
                }
            }
            opened
        })
    };
    // Let the flood fill the strangers' quota first.
    assert!(common::eventually(WAIT, || metric(&gw, "prelogon_quota") > 0));
    let mut s = connect_from(77, fix);
    std::thread::sleep(Duration::from_secs(1));
    // Stamped now: the session layer checks SendingTime's accuracy.
    let mut now = Vec::new();
    bourse_fix::time::UtcTimestamp(bourse_fix::time::system_now_ms()).write_to(&mut now);
    let now = String::from_utf8(now).unwrap();
    s.write_all(&logon(&format!(
        "35=A\x0149=ALPHA\x0156=BOURSE\x0134=1\x0152={now}\x0198=0\x01108=30\x01"
    )))
    .unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(5).any(|w| w == b"\x0135=A") {
        match s.read(&mut buf) {
            Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let opened = flood.join().unwrap();
    assert!(
        got.windows(5).any(|w| w == b"\x0135=A"),
        "no Logon answer beside {opened} strangers: {:?} ({})",
        String::from_utf8_lossy(&got),
        gw.handle.monitor().unwrap().render_metrics()
    );
    eprintln!(
        "logged on after 1 s beside {opened} strangers ({} displaced)",
        metric(&gw, "prelogon_quota")
    );
}
