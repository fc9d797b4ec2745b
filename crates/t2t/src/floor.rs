//! The loopback floors a tick-to-trade figure is compared with, measured in the same run:
//!
//! - [`udp_one_way`]: a datagram from `send` returning to `recv` returning in another thread
//!   (both read the same monotonic clock), one at a time.
//! - [`run_null_client`]: a client that answers every datagram at once with the same
//!   pre-encoded FIX order, without decoding anything. Driven by the same driver
//!   ([`null_replay`] expects one order per packet), it gives the floor of the whole stand:
//!   UDP send, wake-up, TCP send and receive, with no reaction work at all.
//!
//! The TCP echo round trip every network benchmark quotes is `bourse bench`'s own
//! (`crates/cli/src/bench/common.rs`).

use crate::client::{connect_and_log_on, ClientConfig};
use crate::driver::Replay;
use crate::order::OrderTemplate;
use bourse_latency::{histogram, record};
use hdrhistogram::Histogram;
use std::io::{ErrorKind, Write};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One-way UDP latency over loopback of `count` datagrams of `payload_bytes`, sent one at a
/// time (the receiver answers each so the next leaves only after it arrived).
/// `cpus` pins the sender and the receiver to a CPU each.
pub fn udp_one_way(
    count: usize,
    payload_bytes: usize,
    cpus: Option<(usize, usize)>,
) -> std::io::Result<Histogram<u64>> {
    let pin = |cpu: usize| crate::pin_to_cpu(cpu).map_err(std::io::Error::other);
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    tx.connect(rx.local_addr()?)?;
    rx.connect(tx.local_addr()?)?;
    rx.set_read_timeout(Some(Duration::from_secs(5)))?;
    tx.set_read_timeout(Some(Duration::from_secs(5)))?;
    let (stamps_tx, stamps_rx) = mpsc::channel();
    let receiver = std::thread::spawn(move || -> std::io::Result<()> {
        if let Some((_, cpu)) = cpus {
            pin(cpu)?;
        }
        let mut buf = vec![0u8; payload_bytes.max(1) + 64];
        let mut stamps = Vec::with_capacity(count);
        for _ in 0..count {
            rx.recv(&mut buf)?;
            stamps.push(Instant::now());
            rx.send(&[1])?;
        }
        let _ = stamps_tx.send(stamps);
        Ok(())
    });
    if let Some((cpu, _)) = cpus {
        pin(cpu)?;
    }
    let payload = vec![7u8; payload_bytes];
    let mut sent = Vec::with_capacity(count);
    let mut ack = [0u8; 8];
    for _ in 0..count {
        tx.send(&payload)?;
        sent.push(Instant::now());
        tx.recv(&mut ack)?;
    }
    receiver
        .join()
        .map_err(|_| std::io::Error::other("the UDP receiver panicked"))??;
    let received = stamps_rx
        .recv()
        .map_err(|_| std::io::Error::other("the UDP receiver sent no times"))?;
    let mut h = histogram();
    for (s, r) in sent.iter().zip(&received) {
        record(&mut h, r.saturating_duration_since(*s).as_nanos() as u64);
    }
    Ok(h)
}

/// The same packets, each expecting exactly one order (what the null client sends).
pub fn null_replay(replay: &Replay) -> Replay {
    Replay {
        expected: replay.packets.iter().map(|_| vec![(0, 0)]).collect(),
        ..replay.clone()
    }
}

/// Answers every datagram on `feed` with one fixed FIX order, until the FIX peer closes or
/// `stop` is set. Returns the number of datagrams answered.
pub fn run_null_client(
    cfg: &ClientConfig,
    feed: UdpSocket,
    stop: &AtomicBool,
) -> Result<u64, String> {
    if let Some(cpu) = cfg.cpu {
        crate::pin_to_cpu(cpu)?;
    }
    let template = OrderTemplate::new(&cfg.reactor.order, 0)?;
    let order = template.bytes().to_vec();
    let mut stream = connect_and_log_on(cfg)?;
    feed.set_read_timeout(Some(Duration::from_millis(cfg.idle_poll_ms.max(1))))
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; crate::client::DATAGRAM_BYTES_MAX];
    let mut answered = 0u64;
    loop {
        match feed.recv(&mut buf) {
            Ok(_) => {
                if stream.write_all(&order).is_err() {
                    return Ok(answered);
                }
                answered += 1;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if stop.load(Ordering::Relaxed) || peer_closed(&mut stream) {
                    return Ok(answered);
                }
            }
            Err(e) => return Err(format!("receiving the feed: {e}")),
        }
    }
}

fn peer_closed(stream: &mut std::net::TcpStream) -> bool {
    use std::io::Read;
    let mut buf = [0u8; 512];
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let r = stream.read(&mut buf);
    let _ = stream.set_nonblocking(false);
    match r {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    }
}
