//! `bourse md ...`: market data tools (listen, book, record, demo-publish).
//!
//! Every tool reads UDP on ports of the loopback broadcast address 127.255.255.255
//! (`--base-port`, default 31400: channel i on base+2i for feed A and base+2i+1 for feed B;
//! the TCP replay service of incremental channel i on 127.0.0.1, base+20+i), which every
//! reader on the host receives whole, so a recorder and the venue's own subscribers coexist,
//! unless `--feed-a-host`/`--feed-b-host` name multicast groups (joined on the
//! interfaces `--interfaces` names) or this host's addresses, and `--replay-host` the node
//! serving replay. With
//! `--self-test` a tool also runs an in-process core with simulated order flow publishing on
//! those ports, so it can be tried on its own.

use anyhow::{bail, Context, Result};
use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::{Engine, EngineConfig};
use bourse_marketdata::pcap::PcapWriter;
use bourse_marketdata::replay::ReplayServer;
use bourse_marketdata::udp::{
    FeedAddrs, UdpSink, UdpSubscriber, BASE_PORT_DEFAULT, LOOPBACK_BROADCAST,
};
use bourse_marketdata::{
    describe, now_ns, Channel, Feed, PublicationMode, Publisher, PublisherConfig, SubscriberConfig,
    CHANNEL_COUNT,
};
use clap::{Args, Subcommand};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum MdCommand {
    /// Print every decoded message of the feeds.
    Listen(ListenArgs),
    /// Show one instrument's live book (order log + snapshots), refreshed in the terminal.
    Book(BookArgs),
    /// Write the feeds to a pcap file (Ethernet/IPv4/UDP) that tshark and Wireshark open.
    Record(RecordArgs),
    /// Run a core with simulated order flow and publish its market data on this host
    /// (127.255.255.255).
    DemoPublish(DemoPublishArgs),
}

#[derive(Args, Clone)]
pub struct Common {
    /// First UDP port of the feeds.
    #[arg(long, default_value_t = BASE_PORT_DEFAULT)]
    base_port: u16,
    /// Feed A's multicast group, or this host's address it is sent to (by default the
    /// loopback broadcast address, which every local reader receives whole).
    #[arg(long, default_value_t = LOOPBACK_BROADCAST)]
    feed_a_host: Ipv4Addr,
    /// Feed B's multicast group, or this host's address it is sent to.
    #[arg(long, default_value_t = LOOPBACK_BROADCAST)]
    feed_b_host: Ipv4Addr,
    /// The addresses of the interfaces to join feed A's and feed B's groups on ("A,B").
    #[arg(long, value_delimiter = ',', default_values_t = [Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST])]
    interfaces: Vec<Ipv4Addr>,
    /// The host of the replay service (the leading node's `replay_listen` address).
    #[arg(long, default_value_t = Ipv4Addr::LOCALHOST)]
    replay_host: Ipv4Addr,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Also run an in-process publisher with simulated flow on the same ports.
    #[arg(long)]
    self_test: bool,
    /// Commands per second of the self-test publisher.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
}

#[derive(Args)]
pub struct ListenArgs {
    #[command(flatten)]
    common: Common,
    /// Channels to print (orders, trades, book, statistics, instruments, snapshot); all if
    /// not given.
    #[arg(long, value_delimiter = ',')]
    channels: Vec<String>,
    /// Print both feeds' copies (default: feed A and replayed packets only).
    #[arg(long)]
    both: bool,
    /// Stop after this many packets.
    #[arg(long)]
    count: Option<u64>,
    /// Keep every instrument's order-level book, as rebuilt from the feeds, in this JSON file
    /// (rewritten whole when the feeds are idle, at most every `BOOKS_OUT_EVERY_MS`, and at
    /// the end), to compare with the venue's own (`bourse admin book`).
    #[arg(long)]
    books_out: Option<std::path::PathBuf>,
}

/// How often `md listen --books-out` rewrites its file while the feeds are idle.
const BOOKS_OUT_EVERY_MS: u64 = 200;

#[derive(Args)]
pub struct BookArgs {
    /// Instrument symbol (as in SecurityDefinition), or its numeric id.
    symbol: String,
    #[command(flatten)]
    common: Common,
    /// Price levels shown per side.
    #[arg(long, default_value_t = 10)]
    depth: usize,
}

#[derive(Args)]
pub struct RecordArgs {
    /// The pcap file to write.
    #[arg(long)]
    out: std::path::PathBuf,
    #[command(flatten)]
    common: Common,
    /// Stop after this many packets.
    #[arg(long)]
    count: Option<u64>,
}

#[derive(Args)]
pub struct DemoPublishArgs {
    /// First UDP port of the feeds (on 127.255.255.255).
    #[arg(long, default_value_t = BASE_PORT_DEFAULT)]
    base_port: u16,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Commands per second.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
    /// Publication mode of the incremental channels: online, 1ms or 15ms.
    #[arg(long, default_value = "online")]
    mode: String,
}

pub fn run(command: MdCommand) -> Result<()> {
    match command {
        MdCommand::Listen(a) => listen(a),
        MdCommand::Book(a) => book(a),
        MdCommand::Record(a) => record_pcap(a),
        MdCommand::DemoPublish(a) => {
            let mode = PublicationMode::parse(&a.mode).context("--mode: online, 1ms or 15ms")?;
            let stop = Arc::new(AtomicBool::new(false));
            let s = Arc::clone(&stop);
            let _ = ctrlc::set_handler(move || s.store(true, Ordering::Relaxed));
            let addrs = FeedAddrs::localhost(a.base_port);
            println!(
                "publishing on 127.255.255.255:{}..{} (A/B), replay on tcp {} for {} s at {} commands/s, mode {}",
                a.base_port,
                a.base_port as usize + 2 * CHANNEL_COUNT - 1,
                addrs.replay,
                a.seconds,
                a.rate,
                a.mode
            );
            let n = demo_publisher(addrs, a.rate, Duration::from_secs(a.seconds), mode, &stop)?;
            println!("published {n} commands");
            Ok(())
        }
    }
}

/// Runs a core with simulated flow and publishes its market data until `duration` passes or
/// `stop` is set. Returns the number of commands applied.
pub fn demo_publisher(
    addrs: FeedAddrs,
    rate: u64,
    duration: Duration,
    mode: PublicationMode,
    stop: &AtomicBool,
) -> Result<u64> {
    let fc = FlowConfig::three_markets(1_000, 42);
    let defs = fc.instruments.clone();
    let mut flow = Flow::new(fc);
    let mut engine = Engine::new(EngineConfig::default());
    let mut events = Vec::with_capacity(4096);
    for body in flow.setup() {
        engine.apply(&Command::new(now_ns(), body), &mut events);
    }
    events.clear();
    let config = PublisherConfig {
        modes: [mode; CHANNEL_COUNT],
        ..PublisherConfig::default()
    };
    let mut publisher = Publisher::new(config, &defs);
    let _server = ReplayServer::spawn_for(SocketAddr::V4(addrs.replay), &publisher)
        .context("starting the replay services")?;
    let mut sink = UdpSink::new(addrs)?;
    let start = Instant::now();
    let mut done: u64 = 0;
    while start.elapsed() < duration && !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_nanos() as u64).saturating_mul(rate.max(1)) / 1_000_000_000;
        // Smart batching: everything due now is one committed batch.
        let batch = due.saturating_sub(done).min(10_000);
        events.clear();
        let now = now_ns();
        for _ in 0..batch {
            let body = flow.next_command();
            let at = events.len();
            engine.apply(&Command::new(now, body), &mut events);
            flow.observe(&events[at..]);
        }
        done += batch;
        if batch > 0 {
            publisher.publish(&events, now, &mut sink);
        }
        publisher.tick(now_ns(), &mut sink);
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(done)
}

fn spawn_self_test(c: &Common) -> Option<std::thread::JoinHandle<()>> {
    if !c.self_test {
        return None;
    }
    let addrs = FeedAddrs::localhost(c.base_port);
    let (rate, seconds) = (c.rate, c.seconds);
    Some(std::thread::spawn(move || {
        let stop = AtomicBool::new(false);
        if let Err(e) = demo_publisher(
            addrs,
            rate,
            Duration::from_secs(seconds),
            PublicationMode::Online,
            &stop,
        ) {
            eprintln!("self-test publisher: {e:#}");
        }
    }))
}

impl Common {
    /// The feeds' destinations as the options name them.
    fn addrs(&self) -> FeedAddrs {
        let mut addrs = FeedAddrs::on(self.feed_a_host, self.feed_b_host, self.base_port);
        addrs.replay.set_ip(self.replay_host);
        addrs
    }

    /// A subscriber of `channels` (all when empty) on the feeds the options name.
    fn subscriber(&self, channels: &[Channel], use_replay: bool) -> Result<UdpSubscriber> {
        if self.self_test && self.addrs() != FeedAddrs::localhost(self.base_port) {
            bail!("--self-test publishes on this host only (127.255.255.255): leave out the feed and replay hosts");
        }
        let [a, b] = self.interfaces[..] else {
            bail!(
                "--interfaces takes two addresses, feed A's interface and feed B's (\"A,B\"), not {}",
                self.interfaces.len()
            );
        };
        let interfaces = [a, b];
        UdpSubscriber::bind_on(
            &self.addrs(),
            channels,
            SubscriberConfig::default(),
            use_replay,
            interfaces,
        )
        .context(
            "binding the feed ports (is another listener running, or an address not this host's?)",
        )
    }
}

fn parse_channels(names: &[String]) -> Result<Vec<Channel>> {
    names
        .iter()
        .map(|n| Channel::from_name(n).with_context(|| format!("unknown channel {n}")))
        .collect()
}

fn listen(a: ListenArgs) -> Result<()> {
    let channels = parse_channels(&a.channels)?;
    let mut sub = a.common.subscriber(&channels, true)?;
    let publisher = spawn_self_test(&a.common);
    let deadline = Instant::now() + Duration::from_secs(a.common.seconds);
    let mut printed = 0u64;
    let limit = a.count.unwrap_or(u64::MAX);
    let both = a.both;
    let mut print = |c: Channel, f: Feed, d: &[u8], _now: u64| {
        if printed < limit && (both || f != Feed::B) {
            println!("{}", describe::datagram(c, f, d));
            printed += 1;
        }
    };
    // Ctrl-C (SIGINT) ends the listening early, still printing the counts.
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let _ = ctrlc::set_handler(move || s.store(true, Ordering::Relaxed));
    let books_out = a.books_out.as_deref();
    let mut written_at = Instant::now();
    let mut failed = None;
    let mut idle = |sub: &bourse_marketdata::Subscriber| {
        if let Some(path) = books_out {
            if written_at.elapsed() >= Duration::from_millis(BOOKS_OUT_EVERY_MS) {
                written_at = Instant::now();
                if let Err(e) = write_books(sub, path) {
                    failed = Some(e);
                    return true;
                }
            }
        }
        stop.load(Ordering::Relaxed)
    };
    sub.run_until(deadline, &mut idle, &mut print);
    if let Some(e) = failed {
        return Err(e);
    }
    if let Some(path) = books_out {
        write_books(&sub.sub, path)?;
    }
    let s = sub.sub.stats();
    eprintln!(
        "packets A {} B {} replayed {}; duplicates {}; gaps {} (replayed {}, skipped {}); skipped datagrams {}{}",
        s.packets_a,
        s.packets_b,
        s.packets_replay,
        s.duplicates,
        s.gaps_detected,
        s.replays_requested,
        s.gaps_skipped,
        s.skipped(),
        sub.sub
            .last_skipped()
            .map(|l| format!(" (last: {l})"))
            .unwrap_or_default()
    );
    if let Some(p) = publisher {
        let _ = p.join();
    }
    Ok(())
}

/// Every instrument's order-level book as `sub` holds it, as JSON: instruments by id, each
/// with its orders (order id, side, price, visible quantity) bids then asks, best first, then
/// time. Written to a temporary file and renamed, so a reader never sees half of it.
fn write_books(sub: &bourse_marketdata::Subscriber, path: &std::path::Path) -> Result<()> {
    let mut instruments: Vec<_> = sub.instruments().collect();
    instruments.sort_by_key(|i| i.id);
    let list: Vec<serde_json::Value> = instruments
        .iter()
        .map(|i| {
            let orders: Vec<serde_json::Value> = i
                .book
                .orders()
                .map(|o| serde_json::json!([o.order_id, o.side, o.price, o.qty]))
                .collect();
            serde_json::json!({
                "instrument": i.id, "symbol": i.symbol, "live": i.live, "rpt_seq": i.rpt_seq,
                "orders": orders,
            })
        })
        .collect();
    let st = sub.stats();
    let text = serde_json::json!({
        "packets_a": st.packets_a, "packets_b": st.packets_b, "instruments": list,
    })
    .to_string();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn book(a: BookArgs) -> Result<()> {
    let mut sub = a.common.subscriber(&[], true)?;
    let publisher = spawn_self_test(&a.common);
    let deadline = Instant::now() + Duration::from_secs(a.common.seconds);
    let mut last_draw = Instant::now() - Duration::from_secs(1);
    let mut ignore = |_: Channel, _: Feed, _: &[u8], _: u64| {};
    while Instant::now() < deadline {
        if sub.poll_once(&mut ignore) == 0 {
            std::thread::sleep(Duration::from_micros(500));
        }
        if last_draw.elapsed() >= Duration::from_millis(250) {
            last_draw = Instant::now();
            print!("\x1b[2J\x1b[H{}", render_book(&sub, &a.symbol, a.depth));
        }
    }
    println!("{}", render_book(&sub, &a.symbol, a.depth));
    if let Some(p) = publisher {
        let _ = p.join();
    }
    Ok(())
}

fn render_book(sub: &UdpSubscriber, symbol: &str, depth: usize) -> String {
    use std::fmt::Write;
    let s = &sub.sub;
    let inst = s
        .by_symbol(symbol)
        .or_else(|| symbol.parse().ok().and_then(|id| s.instrument(id)));
    let mut out = String::new();
    let Some(i) = inst else {
        let known: Vec<&str> = s.instruments().map(|i| i.symbol.as_str()).collect();
        let _ = writeln!(out, "waiting for {symbol} ... instruments seen: {known:?}");
        return out;
    };
    let px = |p: i64| format_scaled(p as i128, i.price_scale);
    let _ = writeln!(
        out,
        "{} (id {})  rpt {}  {}  orders {}",
        i.symbol,
        i.id,
        i.rpt_seq,
        if i.live { "LIVE" } else { "RECOVERING" },
        i.book.len()
    );
    if let Some(st) = i.stats {
        let _ = writeln!(
            out,
            "last {} x {}  volume {}  trades {}  open {} high {} low {} vwap {}",
            st.last_px.map(px).unwrap_or("-".into()),
            st.last_qty.map(|q| q.to_string()).unwrap_or("-".into()),
            st.volume,
            st.trades,
            st.open_px.map(px).unwrap_or("-".into()),
            st.high_px.map(px).unwrap_or("-".into()),
            st.low_px.map(px).unwrap_or("-".into()),
            st.vwap_px.map(px).unwrap_or("-".into()),
        );
    }
    let _ = writeln!(
        out,
        "{:>8} {:>12} {:>14} | {:<14} {:<12} {:<8}",
        "orders", "bid qty", "bid", "ask", "ask qty", "orders"
    );
    let bids: Vec<_> = i.book.levels(Side::Buy).take(depth).collect();
    let asks: Vec<_> = i.book.levels(Side::Sell).take(depth).collect();
    for k in 0..depth.max(1) {
        let b = bids.get(k);
        let a = asks.get(k);
        let _ = writeln!(
            out,
            "{:>8} {:>12} {:>14} | {:<14} {:<12} {:<8}",
            b.map(|l| l.orders.to_string()).unwrap_or_default(),
            b.map(|l| l.qty.to_string()).unwrap_or_default(),
            b.map(|l| px(l.price)).unwrap_or_default(),
            a.map(|l| px(l.price)).unwrap_or_default(),
            a.map(|l| l.qty.to_string()).unwrap_or_default(),
            a.map(|l| l.orders.to_string()).unwrap_or_default(),
        );
    }
    let st = s.stats();
    let _ = writeln!(
        out,
        "packets A {} B {}  duplicates {}  gaps {}  replays {}  snapshots {}  skipped {}",
        st.packets_a,
        st.packets_b,
        st.duplicates,
        st.gaps_detected,
        st.replays_requested,
        st.snapshots_applied,
        st.skipped()
    );
    out
}

fn record_pcap(a: RecordArgs) -> Result<()> {
    let addrs = a.common.addrs();
    let mut sub = a.common.subscriber(&[], false)?;
    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut w = PcapWriter::new(std::io::BufWriter::new(file))?;
    let publisher = spawn_self_test(&a.common);
    let deadline = Instant::now() + Duration::from_secs(a.common.seconds);
    let limit = a.count.unwrap_or(u64::MAX);
    let src = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
    let mut error = None;
    let mut write = |c: Channel, f: Feed, d: &[u8], now: u64| {
        if w.packets >= limit || f == Feed::Replay {
            return;
        }
        let dst = match f {
            Feed::A => addrs.channels[c.index()].a,
            _ => addrs.channels[c.index()].b,
        };
        if let Err(e) = w.write_udp(now, src, dst, d) {
            error.get_or_insert(e);
        }
    };
    sub.run_until(deadline, &mut |_| false, &mut write);
    if let Some(e) = error {
        bail!("writing {}: {e}", a.out.display());
    }
    w.flush()?;
    println!("wrote {} packets to {}", w.packets, a.out.display());
    if let Some(p) = publisher {
        let _ = p.join();
    }
    Ok(())
}
