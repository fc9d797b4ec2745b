//! A delay line for benchmarks: a loopback TCP relay that holds every byte for a fixed time in
//! each direction, standing in for the distance between hosts (this kernel has no netem).
//! Plain threads with blocking sockets, not tokio, whose timers tick in milliseconds: the
//! distances measured here are 100 µs. The relay adds its own cost (two extra socket hops and
//! a thread wake per chunk); a benchmark measures its floor through the same line.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Chunks in flight per direction of one connection; a full line holds its reader back
/// (TCP's own flow control then reaches the sender), so memory stays bounded.
const CHUNKS_IN_FLIGHT_MAX: usize = 4_096;
/// Bytes read at most per chunk.
const CHUNK_BYTES_MAX: usize = 64 * 1024;
/// The writer sleeps until this close to a chunk's due time, then yields until it is due:
/// a sleep alone overshoots by the kernel's timer slack (50 µs by default).
const SPIN_NS: u64 = 60_000;
/// One-way delays above this are refused (a benchmark of distance, not of timeouts).
pub const ONE_WAY_US_MAX: u64 = 100_000;

/// A listener on a loopback port that joins every connection to `target`, each direction
/// delayed by `one_way`. Dropping it stops accepting; open connections end with their peers.
pub struct DelayLine {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl DelayLine {
    pub fn start(listen: SocketAddr, target: SocketAddr, one_way: Duration) -> Result<DelayLine> {
        assert!(one_way <= Duration::from_micros(ONE_WAY_US_MAX));
        let listener =
            TcpListener::bind(listen).with_context(|| format!("delay line on {listen}"))?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::Builder::new()
            .name("delay-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stopping.load(Ordering::Acquire) {
                        return;
                    }
                    // A target not up yet: the caller's connection closes and it dials again.
                    if let Ok(near) = conn {
                        if let Ok(far) = TcpStream::connect(target) {
                            let _ = join(near, far, one_way);
                        }
                    }
                }
            })
            .context("delay line thread")?;
        Ok(DelayLine { addr, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Pumps both directions of a connection through the line.
fn join(near: TcpStream, far: TcpStream, one_way: Duration) -> std::io::Result<()> {
    near.set_nodelay(true)?;
    far.set_nodelay(true)?;
    pump(near.try_clone()?, far.try_clone()?, one_way)?;
    pump(far, near, one_way)
}

/// One direction: a reader thread stamps each chunk with its due time, a writer thread
/// writes it then. An end of stream is passed on as a write shutdown.
fn pump(mut from: TcpStream, to: TcpStream, one_way: Duration) -> std::io::Result<()> {
    let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT_MAX);
    std::thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; CHUNK_BYTES_MAX];
            loop {
                let n = from.read(&mut buf).unwrap_or(0);
                let due = Instant::now() + one_way;
                // An empty chunk says the stream ended.
                if tx.send((due, buf[..n].to_vec())).is_err() || n == 0 {
                    return;
                }
            }
        })?;
    std::thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || write_when_due(rx, to))?;
    Ok(())
}

fn write_when_due(rx: Receiver<(Instant, Vec<u8>)>, mut to: TcpStream) {
    while let Ok((due, chunk)) = rx.recv() {
        wait_until(due);
        if chunk.is_empty() || to.write_all(&chunk).is_err() {
            let _ = to.shutdown(Shutdown::Write);
            return;
        }
    }
}

fn wait_until(due: Instant) {
    let spin = Duration::from_nanos(SPIN_NS);
    let now = Instant::now();
    if due > now + spin {
        std::thread::sleep(due - now - spin);
    }
    while Instant::now() < due {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_cross_the_line_in_order_no_sooner_than_the_delay_each_way() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 1024];
            loop {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    return;
                }
                s.write_all(&buf[..n]).unwrap();
            }
        });
        let one_way = Duration::from_millis(2);
        let line = DelayLine::start("127.0.0.1:0".parse().unwrap(), target, one_way).unwrap();
        let mut c = TcpStream::connect(line.addr()).unwrap();
        let sent: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let t = Instant::now();
        c.write_all(&sent).unwrap();
        let mut back = vec![0u8; sent.len()];
        c.read_exact(&mut back).unwrap();
        // A lower bound only: the line never delivers early (no upper bound on a busy machine).
        assert!(t.elapsed() >= 2 * one_way, "{:?}", t.elapsed());
        assert_eq!(back, sent);
        c.shutdown(Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "the end of stream crossed the line");
    }
}
