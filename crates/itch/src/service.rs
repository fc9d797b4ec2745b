//! The feed as a service: a committed-stream consumer (`bourse_cluster::consumer`) of one
//! core, projecting every applied request's events onto a [`UdpFeed`], with heartbeats while
//! the stream is idle, until stopped; then End of Messages and the end-of-session packet.

use crate::net::{FeedReport, ServeConfig, UdpFeed};
use bourse_cluster::consumer::StreamConsumer;
use bourse_cluster::tokio;
use bourse_core::{Event, Instrument};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What to serve and from where.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The client addresses of the core's nodes (any of them serves the stream).
    pub nodes: Vec<SocketAddr>,
    /// The log index to start from (0: the beginning, as far as the nodes still keep it).
    pub from_position: u64,
    pub serve: ServeConfig,
    /// Definitions published as the stock directory before anything else.
    pub instruments: Vec<Instrument>,
    /// Stop after this many entries (for tests and bounded runs).
    pub entries_max: Option<u64>,
}

/// A running service. See the module documentation.
pub struct ItchService {
    request_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<(u64, FeedReport)>>,
    thread: Option<JoinHandle<Result<FeedReport, String>>>,
}

impl ItchService {
    /// Binds the feed's sockets (errors are returned here) and starts following the stream.
    pub fn start(config: ServiceConfig) -> Result<ItchService, String> {
        let mut feed = UdpFeed::start(&config.serve).map_err(|e| {
            format!(
                "ITCH feed to {} with requests on {}: {e}",
                config.serve.dest, config.serve.request_listen
            )
        })?;
        for def in &config.instruments {
            feed.define(def);
        }
        let request_addr = feed.request_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new((config.from_position, feed.report())));
        let thread = {
            let (stop, report) = (stop.clone(), report.clone());
            std::thread::Builder::new()
                .name("itch-feed".into())
                .spawn(move || follow(feed, config, &stop, &report))
                .map_err(|e| format!("ITCH feed thread: {e}"))?
        };
        Ok(ItchService {
            request_addr,
            stop,
            report,
            thread: Some(thread),
        })
    }

    pub fn request_addr(&self) -> SocketAddr {
        self.request_addr
    }

    /// The stream position reached and the feed's figures so far.
    pub fn report(&self) -> (u64, FeedReport) {
        *self.report.lock().expect("report lock")
    }

    /// Whether the service stopped by itself (`entries_max` reached, or an error).
    pub fn finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Ends the session and stops; returns the final figures or why the feed stopped early.
    pub fn stop(mut self) -> Result<FeedReport, String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| "the ITCH feed thread panicked".to_string())?,
            None => Err("already stopped".into()),
        }
    }
}

fn follow(
    mut feed: UdpFeed,
    config: ServiceConfig,
    stop: &AtomicBool,
    report: &Mutex<(u64, FeedReport)>,
) -> Result<FeedReport, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("ITCH feed runtime: {e}"))?;
    let mut consumer = StreamConsumer::remote(config.nodes.clone(), config.from_position);
    // Wake up for heartbeats, and for coalesced packets that have waited long enough.
    let heartbeat = Duration::from_millis(config.serve.heartbeat_ms.clamp(1, 100));
    let idle = feed.tick_every().map_or(heartbeat, |t| t.min(heartbeat));
    let mut events: Vec<Event> = Vec::with_capacity(1024);
    let mut entries = 0u64;
    let result = runtime.block_on(async {
        while !stop.load(Ordering::Relaxed) && config.entries_max.is_none_or(|m| entries < m) {
            let entry = match tokio::time::timeout(idle, consumer.next()).await {
                Err(_) => {
                    feed.tick();
                    continue;
                }
                Ok(Err(e)) => {
                    return Err(format!(
                        "committed stream at position {}: {e}",
                        consumer.position()
                    ))
                }
                Ok(Ok(entry)) => entry,
            };
            events.clear();
            for r in entry.requests().filter(|r| r.applied_here()) {
                for e in r.events() {
                    events.push(e.map_err(|e| {
                        format!("entry {}: events do not decode: {e}", entry.index())
                    })?);
                }
            }
            if !events.is_empty() {
                feed.publish(&events);
            }
            feed.tick();
            entries += 1;
            *report.lock().expect("report lock") = (consumer.position(), feed.report());
        }
        Ok(())
    });
    feed.end();
    let last = feed.stop();
    *report.lock().expect("report lock") = (consumer.position(), last);
    result.map(|()| last)
}
