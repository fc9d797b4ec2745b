//! `bourse itch serve | tail`: one core's order log as NASDAQ TotalView-ITCH 5.0 over
//! MoldUDP64 (fed from the core's committed stream, with a retransmission request server),
//! and a gap-filling consumer that follows such a feed.

use anyhow::{anyhow, bail, Context, Result};
use bourse_core::Instrument;
use bourse_itch::feed::FeedLimits;
use bourse_itch::mold::session_of;
use bourse_itch::net::{run_consumer, ConsumerLimits, ServeConfig};
use bourse_itch::service::{ItchService, ServiceConfig};
use bourse_marketdata::pcap::PcapWriter;
use clap::{Args, Subcommand};
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum ItchCommand {
    /// Publish one core's order log as TotalView-ITCH 5.0 over MoldUDP64, fed from its
    /// committed stream, with a retransmission request server, until interrupted.
    Serve(ServeArgs),
    /// Follow an ITCH feed, asking the request server for whatever it misses, until the
    /// session ends; print the counts and each stock's best bid and ask.
    Tail(TailArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    /// The client addresses of the core's nodes, comma-separated (any one serves the stream).
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<SocketAddr>,
    /// The log index to start from (0: the beginning, as far as the nodes keep it).
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Where packets go (a host or a multicast group).
    #[arg(long, default_value = "127.0.0.1:26400")]
    dest: SocketAddr,
    /// Where retransmission requests are answered.
    #[arg(long, default_value = "127.0.0.1:26401")]
    request_listen: SocketAddr,
    /// The MoldUDP64 session name (at most ten characters); each run is a session of its own.
    #[arg(long, default_value = "BOURSE")]
    session: String,
    /// Largest UDP payload, live or retransmitted.
    #[arg(long, default_value_t = bourse_itch::mold::PACKET_BYTES_DEFAULT)]
    packet_bytes: usize,
    /// Messages kept for retransmission (46 bytes each).
    #[arg(long, default_value_t = 1 << 20)]
    window_messages: usize,
    /// Retransmission requests answered per second; the rest are refused and counted.
    #[arg(long, default_value_t = 1_000)]
    requests_per_s: u32,
    /// A heartbeat goes out after this long without a packet.
    #[arg(long, default_value_t = 1_000)]
    heartbeat_ms: u64,
    /// Coalesce: a message waits up to this long for later entries' messages to share its
    /// packet (1000 is the SBE feed's 1 ms channel); 0 sends each entry's messages at once.
    #[arg(long, default_value_t = 0)]
    coalesce_us: u64,
    /// Instrument definitions (a JSON array, as `AddInstrument` takes them): symbols, price
    /// scales and lot sizes for the stock directory. An instrument met without one is
    /// published under its id with --default-price-scale.
    #[arg(long)]
    instruments: Option<PathBuf>,
    #[arg(long, default_value_t = 4)]
    default_price_scale: u8,
    /// Stop after this many committed entries.
    #[arg(long)]
    entries: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    seconds: Option<u64>,
    /// Print the final report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct TailArgs {
    /// Where the feed arrives.
    #[arg(long, default_value = "127.0.0.1:26400")]
    listen: SocketAddr,
    /// The feed's retransmission request server.
    #[arg(long, default_value = "127.0.0.1:26401")]
    request: SocketAddr,
    /// Messages held past a gap while it is filled.
    #[arg(long, default_value_t = 1 << 20)]
    held_max: usize,
    /// Messages asked for per request.
    #[arg(long, default_value_t = 1_000)]
    request_count_max: u16,
    /// A request for the same gap is repeated after this long.
    #[arg(long, default_value_t = 20)]
    retry_ms: u64,
    /// Give up after this many seconds if the session has not ended.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Write every datagram received (live and retransmitted) to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Drop every Nth live datagram (to see the gap filling at work).
    #[arg(long)]
    drop_every: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(command: ItchCommand) -> Result<()> {
    match command {
        ItchCommand::Serve(args) => serve(args),
        ItchCommand::Tail(args) => tail(args),
    }
}

pub(crate) fn read_instruments(path: &std::path::Path) -> Result<Vec<Instrument>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let defs: Vec<Instrument> = serde_json::from_str(&text)
        .with_context(|| format!("instrument definitions in {}", path.display()))?;
    for d in &defs {
        d.validate()
            .map_err(|e| anyhow!("instrument {} in {}: {e}", d.symbol, path.display()))?;
    }
    Ok(defs)
}

fn serve(args: ServeArgs) -> Result<()> {
    let instruments = match &args.instruments {
        Some(p) => read_instruments(p)?,
        None => Vec::new(),
    };
    let config = ServiceConfig {
        nodes: args.nodes.clone(),
        from_position: args.from,
        serve: ServeConfig {
            session: session_of(&args.session).map_err(|e| anyhow!(e))?,
            dest: args.dest,
            request_listen: args.request_listen,
            limits: FeedLimits {
                packet_bytes_max: args.packet_bytes,
                window_messages: args.window_messages,
                requests_per_s_max: args.requests_per_s,
                coalesce_us_max: args.coalesce_us,
            },
            heartbeat_ms: args.heartbeat_ms,
            default_price_scale: args.default_price_scale,
        },
        instruments,
        entries_max: args.entries,
    };
    let service = ItchService::start(config).map_err(|e| anyhow!(e))?;
    eprintln!(
        "ITCH 5.0 over MoldUDP64: session {:?} to {}, retransmission requests on {}",
        args.session,
        args.dest,
        service.request_addr()
    );
    let stop = Arc::new(AtomicBool::new(false));
    {
        let s = stop.clone();
        let _ = ctrlc::set_handler(move || s.store(true, Ordering::Relaxed));
    }
    let deadline = args
        .seconds
        .map(|s| Instant::now() + Duration::from_secs(s));
    while !stop.load(Ordering::Relaxed)
        && !service.finished()
        && deadline.is_none_or(|d| Instant::now() < d)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let position = service.report().0;
    let report = service.stop().map_err(|e| anyhow!(e))?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "position": position, "report": report })
        );
    } else {
        let p = report.projection;
        let r = report.requests;
        println!(
            "stream position {position}; {} messages in {} packets (next sequence {}), {} send errors",
            p.messages, report.packets_sent, report.next_sequence, report.send_errors
        );
        println!(
            "not published: {} instruments refused (more than 4 decimals), {} of their orders, {} unrepresentable, {} unknown instruments; {} hidden executions as Trade",
            p.instruments_refused, p.orders_not_published, p.unrepresentable, p.unknown_instrument, p.hidden_executions
        );
        println!(
            "retransmission: {} answered ({} messages); refused: {} out of window, {} not yet sent, {} rate-limited, {} other session, {} malformed, {} empty",
            r.answered, r.messages_resent, r.too_old, r.not_yet_sent, r.rate_limited, r.wrong_session, r.malformed, r.empty
        );
    }
    Ok(())
}

fn tail(args: TailArgs) -> Result<()> {
    let socket =
        UdpSocket::bind(args.listen).with_context(|| format!("binding {}", args.listen))?;
    let limits = ConsumerLimits {
        held_max: args.held_max,
        request_count_max: args.request_count_max,
        retry_ms: args.retry_ms,
        deadline_ms: args.seconds.saturating_mul(1_000),
    };
    let mut pcap = match &args.pcap {
        Some(p) => Some(PcapWriter::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        ))?),
        None => None,
    };
    let (SocketAddr::V4(listen), SocketAddr::V4(request)) = (args.listen, args.request) else {
        if pcap.is_some() {
            bail!("--pcap records IPv4 only");
        }
        return tail_run(&socket, &args, limits, None);
    };
    tail_run(
        &socket,
        &args,
        limits,
        pcap.as_mut().map(|w| (w, listen, request)),
    )?;
    if let Some(mut w) = pcap {
        w.flush()?;
    }
    Ok(())
}

type Recorder<'a> = (
    &'a mut PcapWriter<std::io::BufWriter<std::fs::File>>,
    SocketAddrV4,
    SocketAddrV4,
);

fn tail_run(
    socket: &UdpSocket,
    args: &TailArgs,
    limits: ConsumerLimits,
    mut record: Option<Recorder<'_>>,
) -> Result<()> {
    let mut write_error = None;
    let (consumer, requests) = run_consumer(socket, args.request, limits, |live, bytes| {
        if let Some((w, listen, request)) = record.as_mut() {
            // Live datagrams are written as arriving from the request server's host on the
            // feed's port pair; either way tshark decodes them with `-d udp.port==PORT,moldudp64`.
            let src = if live.is_some() {
                SocketAddrV4::new(*request.ip(), 0)
            } else {
                *request
            };
            if let Err(e) = w.write_udp(bourse_marketdata::now_ns(), src, *listen, bytes) {
                write_error.get_or_insert(e);
            }
        }
        match (live, args.drop_every) {
            (Some(k), Some(n)) if n > 0 => k % n != 0,
            _ => true,
        }
    })?;
    if let Some(e) = write_error {
        bail!("writing the pcap: {e}");
    }
    let s = consumer.stats();
    if args.json {
        let books: Vec<_> = consumer
            .stocks()
            .iter()
            .map(|(locate, st)| {
                serde_json::json!({
                    "locate": locate,
                    "stock": String::from_utf8_lossy(&st.stock).trim_end(),
                    "orders": st.book.len(),
                    "best_bid": st.book.best(bourse_core::Side::Buy).map(|l| l.price),
                    "best_ask": st.book.best(bourse_core::Side::Sell).map(|l| l.price),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({ "stats": s, "requests": requests, "complete": consumer.complete(), "books": books })
        );
    } else {
        println!(
            "{} messages applied, {} packets, {} gaps, {} requests, {} duplicates; malformed: {} packets, {} messages; {} book errors; session {}",
            s.messages_applied,
            s.packets,
            s.gaps_detected,
            requests,
            s.duplicates,
            s.malformed_packets,
            s.malformed_messages,
            s.book_errors,
            if s.end_of_session { "ended" } else { "still open" }
        );
        for (locate, st) in consumer.stocks() {
            let price = |p: Option<i64>| {
                p.map_or("-".to_string(), |p| format!("{:.4}", p as f64 / 10_000.0))
            };
            println!(
                "  {:>5} {:<8} {:>7} orders  bid {:>12}  ask {:>12}",
                locate,
                String::from_utf8_lossy(&st.stock),
                st.book.len(),
                price(st.book.best(bourse_core::Side::Buy).map(|l| l.price)),
                price(st.book.best(bourse_core::Side::Sell).map(|l| l.price)),
            );
        }
    }
    if !(s.end_of_session && consumer.complete()) {
        bail!(
            "the feed did not end complete within {} s (next sequence {}, session {})",
            args.seconds,
            consumer.next_sequence(),
            if s.end_of_session { "ended" } else { "open" }
        );
    }
    Ok(())
}
