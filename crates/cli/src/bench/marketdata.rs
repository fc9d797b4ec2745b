//! `bourse bench marketdata`: market data publication delay, top-20 book delay and bandwidth
//! over loopback UDP, beside the floor of one `sendto`.

use super::common::{self, histogram, record, Latency, Machine};
use anyhow::{bail, Context, Result};
use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::{Engine, EngineConfig};
use bourse_marketdata::udp::{bind_receiver, FeedAddrs, UdpSink};
use bourse_marketdata::{Channel, PublicationMode, Publisher, PublisherConfig, CHANNEL_COUNT};
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            common::version()
        );
        println!(
            "  sendto floor (1,400 B, loopback): p50 {} p99 {} p99.9 {}",
            common::ns(floor.p50),
            common::ns(floor.p99),
            common::ns(floor.p999)
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
                    "version": common::version(),
                })
            );
        } else {
            println!(
                "  publisher alone (one command per batch, no sockets): {} ns per event, per command p50 {} p99 {} p99.9 {}",
                per_event_ns,
                common::ns(l.p50),
                common::ns(l.p99),
                common::ns(l.p999)
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
            snapshot_cycle_ns: u64::MAX / 4,
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
                    "version": common::version(),
                })
            );
        } else {
            println!(
                "\n  offered {}/s: achieved {}/s, {} events in {} batches",
                common::count(rate),
                common::count(throughput.round() as u64),
                common::count(stream.events.len() as u64),
                common::count(batches)
            );
            println!("{}", common::latency_header().replace("command", "delay"));
            println!("{}", common::latency_row("to sendto", &send));
            println!("{}", common::latency_row("to receive", &recv));
            println!("{}", common::latency_row("book sendto", &book_send));
            println!("{}", common::latency_row("book receive", &book));
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
