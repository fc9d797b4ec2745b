//! `bourse md ...`: market data tools (listen, book, record, demo-publish), and
//! `bourse bench marketdata`.
//!
//! Every tool talks UDP to 127.0.0.1 ports (`--base-port`, default 31400: channel i on
//! base+2i for feed A and base+2i+1 for feed B; the TCP replay service of incremental channel
//! i on base+20+i). With
//! `--self-test` a tool also runs an in-process core with simulated order flow publishing on
//! those ports, so it can be tried on its own.

use crate::report::{self, histogram, record, Latency, Machine};
use anyhow::{bail, Context, Result};
use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::{Engine, EngineConfig};
use bourse_marketdata::pcap::PcapWriter;
use bourse_marketdata::replay::ReplayServer;
use bourse_marketdata::udp::{bind_receiver, FeedAddrs, UdpSink, UdpSubscriber, BASE_PORT_DEFAULT};
use bourse_marketdata::{
    describe, now_ns, Channel, Feed, PublicationMode, Publisher, PublisherConfig, SubscriberConfig,
    CHANNEL_COUNT,
};
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
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
    /// Run a core with simulated order flow and publish its market data on 127.0.0.1.
    DemoPublish(DemoPublishArgs),
}

#[derive(Args, Clone)]
pub struct Common {
    /// First UDP port of the feeds on 127.0.0.1.
    #[arg(long, default_value_t = BASE_PORT_DEFAULT)]
    base_port: u16,
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
}

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
    /// First UDP port of the feeds on 127.0.0.1.
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
                "publishing on 127.0.0.1:{}..{} (A/B), replay on tcp {} for {} s at {} commands/s, mode {}",
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

fn parse_channels(names: &[String]) -> Result<Vec<Channel>> {
    names
        .iter()
        .map(|n| Channel::from_name(n).with_context(|| format!("unknown channel {n}")))
        .collect()
}

fn listen(a: ListenArgs) -> Result<()> {
    let channels = parse_channels(&a.channels)?;
    let addrs = FeedAddrs::localhost(a.common.base_port);
    let mut sub = UdpSubscriber::bind(&addrs, &channels, SubscriberConfig::default(), true)
        .context("binding the feed ports (is another listener running?)")?;
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
    sub.run_until(deadline, &mut |_| false, &mut print);
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

fn book(a: BookArgs) -> Result<()> {
    let addrs = FeedAddrs::localhost(a.common.base_port);
    let mut sub = UdpSubscriber::bind(&addrs, &[], SubscriberConfig::default(), true)
        .context("binding the feed ports (is another listener running?)")?;
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
    let addrs = FeedAddrs::localhost(a.common.base_port);
    let mut sub = UdpSubscriber::bind(&addrs, &[], SubscriberConfig::default(), false)
        .context("binding the feed ports (is another listener running?)")?;
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

// ----- bench marketdata -----

#[derive(Args)]
pub struct BenchArgs {
    /// Offered rates, commands per second.
    #[arg(long, value_delimiter = ',', default_values_t = vec![10_000u64, 100_000, 500_000])]
    rates: Vec<u64>,
    /// Seconds measured per rate.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Publication mode of the incremental channels: online, 1ms or 15ms.
    #[arg(long, default_value = "online")]
    mode: String,
    /// How the publishing thread waits for the next scheduled command: spin (one core busy;
    /// the receiving thread blocks in recv) or yield.
    #[arg(long, default_value = "spin")]
    wait: String,
    /// One JSON object per scenario.
    #[arg(long)]
    json: bool,
}

/// One command's events, generated ahead so that the measured loop only publishes.
struct Stream {
    events: Vec<Event>,
    /// Start of each command's events in `events`.
    starts: Vec<u32>,
}

fn generate(commands: usize, seed: u64) -> (Stream, Vec<Instrument>) {
    let mut fc = FlowConfig::three_markets(1_000, seed);
    fc.live_orders_target = 4_000;
    let defs = fc.instruments.clone();
    let mut flow = Flow::new(fc);
    let mut engine = Engine::new(EngineConfig::default());
    let mut events = Vec::new();
    for body in flow.setup() {
        engine.apply(&Command::new(1, body), &mut events);
    }
    events.clear();
    let mut starts = Vec::with_capacity(commands + 1);
    for _ in 0..commands {
        starts.push(events.len() as u32);
        let at = events.len();
        engine.apply(&Command::new(1, flow.next_command()), &mut events);
        flow.observe(&events[at..]);
    }
    starts.push(events.len() as u32);
    (Stream { events, starts }, defs)
}

/// Sends through UDP and notes when the last order-log and top-20 packets' sendto returned.
struct TimedSink {
    inner: UdpSink,
    orders_sent_ns: u64,
    book_sent_ns: u64,
}

impl TimedSink {
    fn sent(&mut self, channel: Channel) {
        match channel {
            Channel::Orders => self.orders_sent_ns = mono_ns(),
            Channel::Book => self.book_sent_ns = mono_ns(),
            _ => {}
        }
    }
}

impl bourse_marketdata::PacketSink for TimedSink {
    fn send(&mut self, channel: Channel, packet: &[u8]) {
        self.inner.send(channel, packet);
        self.sent(channel);
    }

    // The publisher hands over a whole flush at once (one sendmmsg for feeds A and B).
    fn send_all(&mut self, channel: Channel, packets: &[Vec<u8>]) {
        self.inner.send_all(channel, packets);
        self.sent(channel);
    }
}

/// The loopback receiver's view: delays from scheduled time to receive, by channel.
struct Received {
    orders: Histogram<u64>,
    book: Histogram<u64>,
    packets: u64,
}

fn receiver(socket: UdpSocket, stop: Arc<AtomicBool>) -> Received {
    let _ = socket.set_nonblocking(false);
    let _ = socket.set_read_timeout(Some(Duration::from_millis(50)));
    let mut r = Received {
        orders: histogram(),
        book: histogram(),
        packets: 0,
    };
    let mut buf = [0u8; 2048];
    loop {
        match socket.recv(&mut buf) {
            Ok(n) => {
                let now = mono_ns();
                r.packets += 1;
                let Ok(p) = bourse_marketdata::wire::market_data::parse_packet(&buf[..n]) else {
                    continue;
                };
                let Some(inc) = p.incremental else { continue };
                let delay = now.saturating_sub(inc.transact_time_ns);
                match p.messages().next() {
                    Some(bourse_marketdata::wire::market_data::Message::AggregatedBook(_)) => {
                        record(&mut r.book, delay)
                    }
                    Some(
                        bourse_marketdata::wire::market_data::Message::OrderUpdate(_)
                        | bourse_marketdata::wire::market_data::Message::OrderExecution(_)
                        | bourse_marketdata::wire::market_data::Message::EmptyBook(_),
                    ) => record(&mut r.orders, delay),
                    _ => {}
                }
            }
            Err(_) => {
                if stop.load(Ordering::Relaxed) {
                    return r;
                }
            }
        }
    }
}

/// A process-wide monotonic clock in ns, shared by the bench's threads (one origin).
fn mono_ns() -> u64 {
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// The 1,400-byte sendto on loopback, measured the same way as the publisher's sends.
fn sendto_floor(samples: usize) -> Result<Latency> {
    let rx = bind_receiver(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    let to = rx.local_addr()?;
    let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    let payload = [0x5au8; 1_400];
    let mut h = histogram();
    let mut buf = [0u8; 2048];
    for _ in 0..samples {
        let t = Instant::now();
        tx.send_to(&payload, to)?;
        record(&mut h, t.elapsed().as_nanos() as u64);
        while rx.recv(&mut buf).is_ok() {}
    }
    Ok(Latency::of(&h))
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let mode = PublicationMode::parse(&args.mode).context("--mode: online, 1ms or 15ms")?;
    let yield_when_idle = match args.wait.as_str() {
        "spin" => false,
        "yield" => true,
        other => bail!("--wait: spin or yield, not {other}"),
    };
    let machine = Machine::this();
    let floor = sendto_floor(50_000)?;
    if !args.json {
        println!(
            "bourse bench marketdata — publisher + loopback subscriber on 127.0.0.1, mode {}; {} ({} cpus), version {}",
            args.mode,
            machine.model,
            machine.cpus,
            report::version()
        );
        println!(
            "  sendto floor (1,400 B, loopback): p50 {} p99 {} p99.9 {}",
            report::ns(floor.p50),
            report::ns(floor.p99),
            report::ns(floor.p999)
        );
    }
    // The publisher's own cost, no sockets: every command of a stream published into a sink
    // that drops packets, as fast as it goes.
    {
        struct Null(u64);
        impl bourse_marketdata::PacketSink for Null {
            fn send(&mut self, _c: Channel, p: &[u8]) {
                self.0 += p.len() as u64;
            }
        }
        let commands = 200_000;
        let (stream, defs) = generate(commands, 3);
        let mut publisher = Publisher::new(PublisherConfig::default(), &defs);
        let mut null = Null(0);
        let mut h = histogram();
        let t = Instant::now();
        for k in 0..commands {
            let (s, e) = (stream.starts[k] as usize, stream.starts[k + 1] as usize);
            let t0 = Instant::now();
            publisher.publish(&stream.events[s..e], 1, &mut null);
            record(&mut h, t0.elapsed().as_nanos() as u64);
        }
        let total_ns = t.elapsed().as_nanos() as u64;
        let per_event_ns = total_ns / stream.events.len().max(1) as u64;
        let l = Latency::of(&h);
        if args.json {
            println!(
                "{}",
                json!({
                    "bench": "marketdata",
                    "scenario": "publish-service-time-no-io",
                    "offered_per_s": null,
                    "throughput_per_s": (commands as f64 / (total_ns as f64 / 1e9)).round() as u64,
                    "commands": commands,
                    "events": stream.events.len(),
                    "ns_per_event": per_event_ns,
                    "latency_ns": l,
                    "machine": machine,
                    "version": report::version(),
                })
            );
        } else {
            println!(
                "  publisher alone (one command per batch, no sockets): {} ns per event, per command p50 {} p99 {} p99.9 {}",
                per_event_ns,
                report::ns(l.p50),
                report::ns(l.p99),
                report::ns(l.p999)
            );
        }
    }
    for &rate in &args.rates {
        let commands = ((rate as f64 * args.seconds) as usize).max(1_000);
        let (mut stream, defs) = generate(commands, 7 + rate);
        // One socket receives feed A of every channel (so one blocking thread sees them all);
        // feed B goes to a socket nobody reads, which costs the sender the same sendto.
        let rx_a = bind_receiver(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
        let rx_b = bind_receiver(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
        let (SocketAddr::V4(a), SocketAddr::V4(b)) = (rx_a.local_addr()?, rx_b.local_addr()?)
        else {
            bail!("IPv4 sockets with IPv6 addresses");
        };
        let mut addrs = FeedAddrs::localhost(0);
        for c in addrs.channels.iter_mut() {
            c.a = a;
            c.b = b;
        }
        let config = PublisherConfig {
            modes: [mode; CHANNEL_COUNT],
            snapshot_interval_ns: u64::MAX / 4,
            instruments_interval_ns: u64::MAX / 4,
            ..PublisherConfig::default()
        };
        let mut publisher = Publisher::new(config, &defs);
        let mut sink = TimedSink {
            inner: UdpSink::new(addrs)?,
            orders_sent_ns: 0,
            book_sent_ns: 0,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let _ = mono_ns();
        let rx_thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || receiver(rx_a, stop))
        };
        let mut send_delay = histogram();
        let mut book_send_delay = histogram();
        let interval_ns = 1_000_000_000 / rate.max(1);
        let start = mono_ns() + 1_000_000;
        let mut next = 0usize;
        let mut batches = 0u64;
        // Commands handed over whose order-log (book) packets have not left yet: in the
        // interval modes they leave at a later flush, which is when they count.
        let (mut orders_unsent, mut book_unsent) = (0usize, 0usize);
        let mut settle =
            |sink: &mut TimedSink, upto: usize, orders: &mut usize, book: &mut usize| {
                if sink.orders_sent_ns > 0 {
                    for k in *orders..upto {
                        let scheduled = start + k as u64 * interval_ns;
                        record(
                            &mut send_delay,
                            sink.orders_sent_ns.saturating_sub(scheduled),
                        );
                    }
                    *orders = upto;
                }
                if sink.book_sent_ns > 0 {
                    for k in *book..upto {
                        let scheduled = start + k as u64 * interval_ns;
                        record(
                            &mut book_send_delay,
                            sink.book_sent_ns.saturating_sub(scheduled),
                        );
                    }
                    *book = upto;
                }
                sink.orders_sent_ns = 0;
                sink.book_sent_ns = 0;
            };
        while next < commands {
            let now = mono_ns();
            let due = if now < start {
                0
            } else {
                (((now - start) / interval_ns) as usize + 1).min(commands)
            };
            if due <= next {
                if yield_when_idle {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                if mode != PublicationMode::Online {
                    publisher.tick(now, &mut sink);
                    settle(&mut sink, next, &mut orders_unsent, &mut book_unsent);
                }
                continue;
            }
            // Everything due is one batch; each command's events carry its scheduled time, so
            // the receiver measures from the schedule too (open loop).
            let (from, to) = (stream.starts[next] as usize, stream.starts[due] as usize);
            for k in next..due {
                let scheduled = start + k as u64 * interval_ns;
                let (s, e) = (stream.starts[k] as usize, stream.starts[k + 1] as usize);
                for ev in &mut stream.events[s..e] {
                    *ev.ts_ns_mut() = scheduled;
                }
            }
            // Per command: from its scheduled time to the return of the sendto of the last
            // order-log packet that carried its batch (feed B, sent after A).
            publisher.publish(&stream.events[from..to], now, &mut sink);
            if mode != PublicationMode::Online {
                publisher.tick(mono_ns(), &mut sink);
            }
            settle(&mut sink, due, &mut orders_unsent, &mut book_unsent);
            next = due;
            batches += 1;
        }
        publisher.flush_all(mono_ns(), &mut sink);
        settle(&mut sink, commands, &mut orders_unsent, &mut book_unsent);
        let elapsed_ns = mono_ns().saturating_sub(start).max(1);
        publisher.flush_all(mono_ns(), &mut sink);
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        let received = rx_thread
            .join()
            .map_err(|_| anyhow::anyhow!("receiver panicked"))?;
        let mut sent_a = 0u64;
        let mut bandwidth = serde_json::Map::new();
        for c in Channel::ALL {
            let k = publisher.counters(c);
            sent_a += k.packets_sent + k.heartbeats;
            let mbit = k.bytes_sent as f64 * 8.0 / (elapsed_ns as f64 / 1e9) / 1e6;
            bandwidth.insert(c.name().into(), json!((mbit * 100.0).round() / 100.0));
        }
        let lost = sent_a.saturating_sub(received.packets);
        let data_packets: u64 = Channel::ALL
            .iter()
            .map(|&c| publisher.counters(c).packets_sent)
            .sum();
        // System calls of the data packets (heartbeats go one at a time): each sendmmsg
        // carries feeds A and B of every packet of one channel's flush.
        let calls_per_packet = sink.inner.send_calls as f64 / data_packets.max(1) as f64;
        let send = Latency::of(&send_delay);
        let recv = Latency::of(&received.orders);
        let book = Latency::of(&received.book);
        let book_send = Latency::of(&book_send_delay);
        let throughput = commands as f64 / (elapsed_ns as f64 / 1e9);
        if args.json {
            println!(
                "{}",
                json!({
                    "bench": "marketdata",
                    "scenario": format!("{}-{}", args.mode, rate),
                    "offered_per_s": rate,
                    "throughput_per_s": throughput.round() as u64,
                    "commands": commands,
                    "events": stream.events.len(),
                    "batches": batches,
                    "latency_ns": send,
                    "publish_to_sendto_ns": send,
                    "publish_to_receive_ns": recv,
                    "top20_book_to_sendto_ns": book_send,
                    "top20_book_to_receive_ns": book,
                    "bandwidth_mbit_per_s_per_feed": bandwidth,
                    "packets_sent_feed_a": sent_a,
                    "packets_lost_feed_a": lost,
                    "sendmmsg_calls_per_packet": (calls_per_packet * 1000.0).round() / 1000.0,
                    "baseline": {"sendto_1400b_ns": floor},
                    "machine": machine,
                    "version": report::version(),
                })
            );
        } else {
            println!(
                "\n  offered {}/s: achieved {}/s, {} events in {} batches",
                report::count(rate),
                report::count(throughput.round() as u64),
                report::count(stream.events.len() as u64),
                report::count(batches)
            );
            println!("{}", report::latency_header().replace("command", "delay"));
            println!("{}", report::latency_row("to sendto", &send));
            println!("{}", report::latency_row("to receive", &recv));
            println!("{}", report::latency_row("book sendto", &book_send));
            println!("{}", report::latency_row("book receive", &book));
            let bw: Vec<String> = bandwidth.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("  Mbit/s per feed: {}", bw.join(", "));
            println!("  packets on feed A: sent {sent_a}, lost {lost}");
            println!(
                "  system calls: {} sendmmsg for {data_packets} packets ({calls_per_packet:.2} per packet, feeds A and B together)",
                sink.inner.send_calls
            );
        }
    }
    Ok(())
}
