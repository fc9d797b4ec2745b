//! The dashboard server against good and bad clients: it serves the page, metrics and frames;
//! malformed requests get errors or a closed connection; an event-stream client that never
//! reads is cut off; clients past the limits are refused; the server stays up throughout.

use bourse_core::CommandKind;
use bourse_monitor::{clock, DashboardServer, Monitor, MonitorConfig, Stage, Trace};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn start(config: MonitorConfig) -> (Arc<Monitor>, DashboardServer) {
    let m = Monitor::new(config.validated().expect("valid test config"));
    let s = DashboardServer::start(m.clone(), "127.0.0.1:0".parse().unwrap()).expect("bind");
    (m, s)
}

/// One request with `Connection: close`; returns (status, body). A bounded read.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    let _ = s.take(16 << 20).read_to_end(&mut buf);
    parse(&buf)
}

fn parse(buf: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(buf).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Sends raw bytes and returns whatever comes back before the server closes or 5 s pass.
fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    let mut buf = Vec::new();
    let _ = s.take(1 << 20).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).to_string()
}

fn fast_config() -> MonitorConfig {
    MonitorConfig {
        tick_ms: 20,
        sample_every: 1,
        flush_interval_ms: 1,
        ..MonitorConfig::default()
    }
}

fn feed(m: &Monitor, n: u64) {
    let mut core = m.core("test");
    for i in 0..n {
        if core.sample() {
            let mut t = Trace::new(CommandKind::NewOrder);
            let t0 = clock::now_ns();
            t.stamp_at(Stage::SocketRead, t0);
            t.stamp_at(Stage::Processed, t0 + 1_000 + i);
            core.on_trace(&t);
        }
        core.on_command(CommandKind::NewOrder, &[]);
    }
    core.flush();
}

#[test]
fn serves_the_page_metrics_frames_and_an_event_stream() {
    let (m, s) = start(fast_config());
    feed(&m, 1_000);
    let (status, page) = get(s.addr(), "/");
    assert_eq!(status, 200);
    assert!(page.contains("<canvas id=\"chart-rates\""));
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "no external resources"
    );
    let (status, metrics) = get(s.addr(), "/metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("bourse_commands_total{core=\"test\",kind=\"new\"} 1000\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "bourse_stage_latency_seconds_count{kind=\"new\",stage=\"processed\"} 1000\n"
        ),
        "{metrics}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    // The first frame may predate the feed; wait for one that counts it.
    loop {
        let (status, body) = get(s.addr(), "/api/frame");
        if status == 200 {
            let v: serde_json::Value = serde_json::from_str(&body).expect("frame is JSON");
            if v["totals"]["commands"].as_u64() == Some(1_000) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no frame with the feed within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(s.addr(), "/nope").0, 404);

    let mut es = TcpStream::connect(s.addr()).unwrap();
    es.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(es, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut got = String::new();
    let mut buf = [0u8; 8192];
    while !(got.contains("event: hello") && got.contains("event: frame")) {
        let n = es.read(&mut buf).expect("event stream reads");
        assert!(n > 0, "stream ended early: {got}");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.contains("text/event-stream"), "{got}");
}

#[test]
fn malformed_requests_get_errors_and_the_server_stays_up() {
    let (_m, s) = start(MonitorConfig {
        header_read_timeout_ms: 300,
        ..fast_config()
    });
    let a = s.addr();
    let garbage: Vec<Vec<u8>> = vec![
        b"GARBAGE\r\n\r\n".to_vec(),
        b"GET / HTTP/9.9\r\n\r\n".to_vec(),
        b"GET /\x00\xff HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
        format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(64 * 1024)).into_bytes(),
        b"POST /metrics HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n".to_vec(),
    ];
    for (i, g) in garbage.iter().enumerate() {
        let reply = raw(a, g);
        assert!(
            reply.is_empty() || reply.starts_with("HTTP/1.1 4"),
            "unexpected reply to garbage #{i}: {}",
            &reply[..reply.len().min(200)]
        );
    }
    // Both framings at once (a smuggling shape): RFC 9112 lets the server answer by the chunked
    // framing, but it must close the connection afterwards, so nothing can be smuggled behind.
    let reply = raw(
        a,
        b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nzz\r\nGET /metrics HTTP/1.1\r\n\r\n",
    );
    assert!(
        reply.is_empty() || reply.contains("connection: close"),
        "{reply}"
    );
    assert!(
        !reply.contains("bourse_build_info"),
        "a second request was smuggled through"
    );
    // A client that sends half a request and stalls is closed after the header timeout.
    let t0 = Instant::now();
    let reply = raw(a, b"GET / HTTP/1.1\r\nHost: x\r\n");
    assert!(
        t0.elapsed() < Duration::from_secs(4),
        "slow headers kept open"
    );
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 408"),
        "{reply}"
    );
    assert_eq!(get(a, "/healthz"), (200, "ok\n".to_string()));
}

#[test]
fn an_event_stream_client_that_never_reads_is_cut_off() {
    let (m, s) = start(MonitorConfig {
        tick_ms: 2,
        sse_queue_frames: 2,
        send_buffer_bytes: 4096,
        ..fast_config()
    });
    feed(&m, 100);
    // A client with a tiny receive buffer that asks for the stream and never reads it.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&s.addr().into()).unwrap();
    let mut stalled: TcpStream = sock.into();
    write!(stalled, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while m.dashboard().dropped_total() == 0 {
        assert!(
            Instant::now() < deadline,
            "the stalled client was not cut off within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(m.dashboard().clients(), 0);
    // Its connection is closed: after what was buffered, the read ends.
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut sink = Vec::new();
    let r = (&mut stalled).take(64 << 20).read_to_end(&mut sink);
    assert!(r.is_ok() || sink.len() < 64 << 20, "connection still open");
    assert_eq!(get(s.addr(), "/healthz").0, 200);
}

#[test]
fn hundreds_of_clients_are_capped_and_the_server_stays_up() {
    let (m, s) = start(MonitorConfig {
        sse_clients_max: 16,
        connections_max: 200,
        ..fast_config()
    });
    let mut streams = Vec::new();
    let (mut ok, mut busy, mut closed) = (0, 0, 0);
    for _ in 0..300 {
        let Ok(mut c) = TcpStream::connect(s.addr()) else {
            closed += 1;
            continue;
        };
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        if write!(c, "GET /events HTTP/1.1\r\nHost: x\r\n\r\n").is_err() {
            closed += 1;
            continue;
        }
        let mut head = [0u8; 12];
        match c.read_exact(&mut head) {
            Ok(()) if head.starts_with(b"HTTP/1.1 200") => ok += 1,
            Ok(()) if head.starts_with(b"HTTP/1.1 503") => busy += 1,
            _ => closed += 1,
        }
        streams.push(c);
    }
    assert_eq!(
        ok, 16,
        "event-stream clients are capped ({busy} busy, {closed} closed)"
    );
    assert!(busy > 0, "clients past the cap get 503");
    // The admission policy (docs/admission.md) answers every newcomer (an event stream past
    // its cap gets 503 and is closed behind the answer) and keeps the connections under the
    // bound by displacing the longest-idle one rather than refusing the newcomer; the server
    // never holds more than its bound.
    assert_eq!(
        ok + busy + closed,
        300,
        "every client counted ({ok} ok, {busy} busy, {closed} closed)"
    );
    let (status, metrics) = get(s.addr(), "/metrics");
    assert_eq!(status, 200);
    let open: f64 = metrics
        .lines()
        .find(|l| l.starts_with("bourse_listener_connections_open{listener=\"dashboard\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("the dashboard's open connections on /metrics");
    assert!(
        open <= 200.0,
        "{open} connections open past the bound of 200"
    );
    assert_eq!(m.dashboard().clients(), 16);
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.dashboard().clients() > 0 {
        assert!(Instant::now() < deadline, "clients not released");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(s.addr(), "/healthz").0, 200);
}

#[test]
fn the_dashboard_refuses_non_loopback_addresses() {
    let m = Monitor::new(MonitorConfig::default());
    assert!(DashboardServer::start(m, "0.0.0.0:0".parse().unwrap()).is_err());
}
