//! Market data as the deployment checks it: a subscriber counting every trade the feeds
//! carry, and the publication delay from a trade's apply to its read from the feed.

use anyhow::{Context, Result};
use bourse_core::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How many stamps of one side of the publication delay (trades applied, or trades read from
/// the feed) may wait for the other side's before the oldest are dropped: this bounds the
/// timer's memory when one side never comes (a trade of a lost packet that the subscriber
/// recovered from the snapshot loop instead of a replay).
const PUB_DELAY_PENDING_MAX: usize = 262_144;
/// How long the feed's subscriber blocks waiting for a datagram before it checks whether to
/// stop and runs its gap recovery. A datagram wakes it at once; the timeout only paces an
/// idle feed, where 2 ms woke each core's counter 500 times a second for nothing.
const MD_WAIT_MS: u16 = 20;

/// Market data publication delay of one core: for each trade, from the moment the core
/// applied the log entry that made it to the moment the feed's subscriber read the first
/// copy (feed A or B) of its Trade record. The apply is seen by two subscribers of the
/// leader's committed stream, both woken by it: this deployment's entry timer, and the
/// node's publisher, which stamps the moment it took the entry as the packet's SendingTime;
/// the earlier of the two is the apply's time (whichever woke first is the closer to it).
/// Every stamp is read from the one wall clock of this process
/// (`bourse_marketdata::now_ns`, which the SendingTime also comes from). Whichever of the
/// apply and the read comes first waits, keyed by trade id (unique within a core).
pub(crate) struct PubDelay {
    pub(crate) applied: std::collections::BTreeMap<u64, u64>,
    /// Trade id -> (read at, the packet's SendingTime).
    pub(crate) received: std::collections::BTreeMap<u64, (u64, u64)>,
    /// The apply to the read.
    pub(crate) delay: hdrhistogram::Histogram<u64>,
    /// The packet's SendingTime to the read: the send, the loopback, the subscriber's
    /// wake-up (the part of the delay after the publisher took the entry).
    pub(crate) send_to_read: hdrhistogram::Histogram<u64>,
    /// Trades whose packet's SendingTime came before the entry timer's stamp (the publisher
    /// woke first, so its stamp stood for the apply).
    pub(crate) publisher_first: u64,
    /// When the generator's second 0 begins (ns since the Unix epoch), once the run starts.
    pub(crate) run_start_ns: Option<u64>,
    /// The delay by the generator's second in which the record was read.
    pub(crate) by_second: Vec<hdrhistogram::Histogram<u64>>,
    /// How many of the run's first seconds `by_second` covers (the profile's
    /// `generator.series_seconds_max`, one ~32 KB histogram each); trades read later count
    /// in the overall figure only.
    pub(crate) seconds_kept: usize,
}

impl PubDelay {
    pub(crate) fn new() -> PubDelay {
        PubDelay {
            applied: Default::default(),
            received: Default::default(),
            delay: bourse_loadgen::generator::second_histogram(),
            send_to_read: bourse_loadgen::generator::second_histogram(),
            publisher_first: 0,
            run_start_ns: None,
            by_second: Vec::new(),
            seconds_kept: 0,
        }
    }

    pub(crate) fn pair(&mut self, applied_ns: u64, read_ns: u64, sending_ns: u64) {
        let from = if sending_ns < applied_ns {
            self.publisher_first += 1;
            sending_ns
        } else {
            applied_ns
        };
        let ns = read_ns.saturating_sub(from);
        bourse_loadgen::generator::record(&mut self.delay, ns);
        let Some(start) = self.run_start_ns.filter(|s| read_ns >= *s) else {
            return;
        };
        let second = ((read_ns - start) / 1_000_000_000) as usize;
        if second >= self.seconds_kept {
            return;
        }
        while self.by_second.len() <= second {
            self.by_second
                .push(bourse_loadgen::generator::second_histogram());
        }
        bourse_loadgen::generator::record(&mut self.by_second[second], ns);
    }

    pub(crate) fn applied(&mut self, trade_id: u64, at_ns: u64) {
        match self.received.remove(&trade_id) {
            Some((read, sending)) => self.pair(at_ns, read, sending),
            None => {
                self.applied.insert(trade_id, at_ns);
                while self.applied.len() > PUB_DELAY_PENDING_MAX {
                    self.applied.pop_first();
                }
            }
        }
    }

    pub(crate) fn received(&mut self, trade_id: u64, read_ns: u64, sending_ns: u64) {
        bourse_loadgen::generator::record(
            &mut self.send_to_read,
            read_ns.saturating_sub(sending_ns),
        );
        match self.applied.remove(&trade_id) {
            Some(a) => self.pair(a, read_ns, sending_ns),
            None => {
                self.received.insert(trade_id, (read_ns, sending_ns));
                while self.received.len() > PUB_DELAY_PENDING_MAX {
                    self.received.pop_first();
                }
            }
        }
    }
}

/// Counts the trades one core publishes on its trades channel (feeds A and B, gaps
/// recovered from the replay service), and times each one's publication ([`PubDelay`]), on
/// a thread of its own.
pub(crate) struct MdCounter {
    pub(crate) trades: Arc<AtomicU64>,
    pub(crate) delay: Arc<Mutex<PubDelay>>,
    pub(crate) stop: Arc<std::sync::atomic::AtomicBool>,
    pub(crate) thread: Option<std::thread::JoinHandle<()>>,
}

impl MdCounter {
    pub(crate) fn start(base_port: u16) -> Result<MdCounter> {
        use bourse_marketdata::udp::{FeedAddrs, UdpSubscriber};
        let addrs = FeedAddrs::localhost(base_port);
        let mut sub = UdpSubscriber::bind(
            &addrs,
            &[bourse_marketdata::Channel::Trades],
            bourse_marketdata::SubscriberConfig::default(),
            true,
        )
        .with_context(|| format!("bind the market data feeds at {base_port}"))?;
        let trades = Arc::new(AtomicU64::new(0));
        let delay = Arc::new(Mutex::new(PubDelay::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t, st, d) = (Arc::clone(&trades), Arc::clone(&stop), Arc::clone(&delay));
        let thread = std::thread::Builder::new()
            .name("bourse-md-count".into())
            .spawn(move || {
                // The highest MsgSeqNum read so far: a packet at or below it is the other
                // feed's copy (or a replay) of one already timed.
                let mut seq_seen = 0u32;
                let mut ids: Vec<u64> = Vec::with_capacity(64);
                let mut on_packet = |_: bourse_marketdata::Channel,
                                     _: bourse_marketdata::Feed,
                                     datagram: &[u8],
                                     read_ns: u64| {
                    use bourse_marketdata::wire::market_data::{parse_packet, Message};
                    let Ok(mut delay) = d.lock() else { return };
                    let Ok(p) = parse_packet(datagram) else {
                        return;
                    };
                    if p.header.msg_seq_num <= seq_seen {
                        return;
                    }
                    seq_seen = p.header.msg_seq_num;
                    ids.clear();
                    ids.extend(p.messages().filter_map(|m| match m {
                        Message::Trade(t) => Some(t.trade_id()),
                        _ => None,
                    }));
                    for id in &ids {
                        delay.received(*id, read_ns, p.header.sending_time_ns);
                    }
                };
                while !st.load(Ordering::Relaxed) {
                    if sub.poll_once(&mut on_packet) == 0 {
                        // Blocks until a datagram arrives, so a receipt is stamped when the
                        // datagram is there, not when a sleep ends.
                        if sub.wait_readable(MD_WAIT_MS).is_err() {
                            std::thread::sleep(Duration::from_millis(u64::from(MD_WAIT_MS)));
                        }
                    }
                    t.store(sub.sub.stats().trades, Ordering::Relaxed);
                }
            })
            .context("market data thread")?;
        Ok(MdCounter {
            trades,
            delay,
            stop,
            thread: Some(thread),
        })
    }

    /// The trades seen, once they reach `expected` or the feed has been quiet for a while.
    pub(crate) fn settle(&self, expected: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = (self.trades.load(Ordering::Relaxed), Instant::now());
        loop {
            let n = self.trades.load(Ordering::Relaxed);
            if n >= expected || Instant::now() >= deadline {
                return n;
            }
            if n != last.0 {
                last = (n, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(2) {
                return n;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for MdCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Stamps the apply of every trade of `entry` (requests that applied; a duplicate's events
/// were published when it first applied) for the publication delay.
pub(crate) fn stamp_trades(
    entry: &bourse_cluster::stream::CommittedEntry,
    at_ns: u64,
    delay: &Mutex<PubDelay>,
    trades: &mut Vec<u64>,
) {
    trades.clear();
    for r in &entry.requests {
        if r.kind != bourse_cluster::OutcomeKind::Applied || r.events.is_empty() {
            continue;
        }
        if let Ok(events) = bourse_core::codec::decode_events(&r.events) {
            trades.extend(events.iter().filter_map(|e| match e {
                Event::Trade { trade_id, .. } => Some(trade_id.0),
                _ => None,
            }));
        }
    }
    if trades.is_empty() {
        return;
    }
    let Ok(mut d) = delay.lock() else { return };
    for id in trades.iter() {
        d.applied(*id, at_ns);
    }
}
