//! `bourse t2t ...`: tick-to-trade as seed 004 measures it (`bourse_t2t`).
//!
//! `drive` replays a capture to a reacting client and times each reaction; `client` is the
//! reference reacting client; `gen` writes captures with packets of 1 to 128 updates. Run the
//! driver first (it listens for the client's FIX connection), then the client:
//!
//! ```text
//! bourse t2t gen --out t2t.pcap
//! bourse t2t drive --capture t2t.pcap --target 127.0.0.1:31400 --listen 31500 &
//! bourse t2t client --md 31400 --fix 127.0.0.1:31500
//! ```
//!
//! The same with ITCH 5.0 over MoldUDP64: `gen --format itch`, `drive --feed itch`, `client
//! --feed itch` (a `bourse itch tail --pcap` recording replays the same way). Against
//! bourse's FIX gateway the client sends each instrument's symbol and prices at its scale:
//! from the ITCH stock directory, or for SBE from `--instruments defs.json`.

use anyhow::{anyhow, bail, Context, Result};
use bourse_t2t::book::Limits;
use bourse_t2t::capture::read_pcap_file;
use bourse_t2t::client::{self, bind_feed, run_client, ClientConfig};
use bourse_t2t::driver::{self, drive, prepare, samples_csv, write_pcap, DriveConfig};
use bourse_t2t::gen::{self, GenConfig, Sizes};
use bourse_t2t::order::{InstrumentName, OrderSpec};
use bourse_t2t::reactor::ReactorConfig;
use bourse_t2t::FeedFormat;
use clap::{Args, Subcommand};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(Subcommand)]
pub enum T2tCommand {
    /// Replay a capture to a reacting client one packet at a time and time each reaction
    /// (last byte sent → first byte of the order received); print the seed's table.
    Drive(DriveArgs),
    /// The reference reacting client: order log over UDP in, a FIX NewOrderSingle at the new
    /// best ask out for every best-ask change.
    Client(ClientArgs),
    /// Write a capture with packets of a chosen number of updates (synthetic, or repacked
    /// from a `bourse md record` capture).
    Gen(GenArgs),
}

#[derive(Args)]
pub struct DriveArgs {
    /// The capture to replay (pcap, as `bourse md record`, `bourse itch tail --pcap` or
    /// `bourse t2t gen` write it).
    #[arg(long)]
    capture: PathBuf,
    /// What the capture carries: `sbe` (bourse's order log) or `itch` (MoldUDP64/ITCH 5.0).
    #[arg(long, default_value = "sbe", value_parser = FeedFormat::parse)]
    feed: FeedFormat,
    /// The client's feed address.
    #[arg(long)]
    target: SocketAddrV4,
    /// TCP port on 127.0.0.1 where the client's FIX connection is accepted.
    #[arg(long)]
    listen: u16,
    /// UDP destination port of the capture's packets to replay (default: that of the first
    /// order-log packet, feed A of the orders channel).
    #[arg(long)]
    port: Option<u16>,
    /// Packets replayed (the seed's run has 90,000).
    #[arg(long, default_value_t = 90_000)]
    packets: usize,
    /// Longest wait for the orders a packet should cause.
    #[arg(long, default_value_t = 100)]
    timeout_ms: u64,
    /// Wait after a packet that should cause no order (to catch an unexpected one).
    #[arg(long, default_value_t = 50)]
    quiet_us: u64,
    /// Decimal places of the prices in the client's orders (SBE; ITCH prices have four).
    #[arg(long, default_value_t = 0)]
    price_scale: u8,
    /// Largest packet accepted (1472, the feed's, unless the capture was generated larger).
    #[arg(long, default_value_t = 1472)]
    packet_bytes_max: usize,
    /// Longest wait for the client to connect and log on.
    #[arg(long, default_value_t = 60_000)]
    accept_timeout_ms: u64,
    /// Pin the driver to this CPU (and the client to another): on a small machine the two
    /// otherwise preempt each other and the clock stops while the client runs.
    #[arg(long)]
    cpu: Option<usize>,
    /// Write both directions (UDP feed, FIX orders) as a pcap.
    #[arg(long)]
    out_pcap: Option<PathBuf>,
    /// Write every latency with the size of the packet that caused it, as CSV.
    #[arg(long)]
    samples: Option<PathBuf>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
pub struct ClientArgs {
    /// UDP port on 127.0.0.1 the feed arrives on.
    #[arg(long)]
    md: u16,
    /// What the feed carries: `sbe` (bourse's order log) or `itch` (MoldUDP64/ITCH 5.0).
    #[arg(long, default_value = "sbe", value_parser = FeedFormat::parse)]
    feed: FeedFormat,
    /// The FIX acceptor (the driver's --listen port, or an exchange).
    #[arg(long)]
    fix: SocketAddr,
    /// Spin on the feed socket instead of blocking (takes a whole core).
    #[arg(long)]
    busy_poll: bool,
    /// Time the stages of every reaction (decode, book update, decision, encode, send).
    #[arg(long)]
    stages: bool,
    /// Pin the client to this CPU (another than the driver's).
    #[arg(long)]
    cpu: Option<usize>,
    /// Quantity of every order.
    #[arg(long, default_value_t = 1)]
    qty: i64,
    /// Decimal places of the feed's prices (SBE, for instruments not in --instruments; ITCH
    /// prices have four).
    #[arg(long, default_value_t = 0)]
    price_scale: u8,
    /// Instrument definitions (JSON, as `bourse itch serve --instruments` reads): orders
    /// carry each instrument's symbol and its prices at its scale, as bourse's gateway wants.
    /// An ITCH feed names its stocks itself (stock directory).
    #[arg(long)]
    instruments: Option<PathBuf>,
    /// At the end, wait up to this long for the exchange's answer to every order (against a
    /// gateway; the t2t driver answers none).
    #[arg(long)]
    await_answers_ms: Option<u64>,
    #[arg(long, default_value = "T2T")]
    sender_comp_id: String,
    #[arg(long, default_value = "BOURSE")]
    target_comp_id: String,
    /// Stop after this many datagrams.
    #[arg(long)]
    packets: Option<u64>,
    /// Largest datagram accepted.
    #[arg(long, default_value_t = 1472)]
    packet_bytes_max: usize,
    /// Instruments followed (the rest are counted and skipped).
    #[arg(long, default_value_t = 64)]
    instruments_max: usize,
    /// Resting orders over all books.
    #[arg(long, default_value_t = 1 << 16)]
    orders_max: usize,
    /// Price levels per side of a book.
    #[arg(long, default_value_t = 1_024)]
    levels_max: usize,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct GenArgs {
    /// The capture to write.
    #[arg(long)]
    out: PathBuf,
    /// `sbe` (bourse's order log) or `itch` (MoldUDP64 packets of 1 to 128 ITCH 5.0
    /// messages).
    #[arg(long, default_value = "sbe", value_parser = FeedFormat::parse)]
    format: FeedFormat,
    /// Repack the order-log messages of this capture (from `bourse md record`) instead of
    /// generating a flow.
    #[arg(long)]
    from: Option<PathBuf>,
    /// With --from: the UDP port of its order-log packets (default: found).
    #[arg(long)]
    port: Option<u16>,
    #[arg(long, default_value_t = 90_000)]
    packets: usize,
    /// Updates per packet: `A-B` (uniform), `A,B,C` (in turn) or `A`.
    #[arg(long, default_value = "1-20")]
    updates: String,
    #[arg(long, default_value_t = 4)]
    instruments: u32,
    #[arg(long, default_value_t = 4)]
    seed: u64,
    /// Largest packet: the feed's 1472 bytes hold up to 21 updates; a loopback-only capture
    /// of up to 128 needs about 8,500.
    #[arg(long, default_value_t = 1472)]
    packet_bytes_max: usize,
    /// UDP destination port written in the capture.
    #[arg(long, default_value_t = bourse_t2t::ORDERS_PORT_DEFAULT)]
    dst_port: u16,
}

pub fn run(command: T2tCommand) -> Result<()> {
    match command {
        T2tCommand::Drive(a) => drive_cmd(a),
        T2tCommand::Client(a) => client_cmd(a),
        T2tCommand::Gen(a) => gen_cmd(a),
    }
}

fn drive_cmd(a: DriveArgs) -> Result<()> {
    let capture = read_pcap_file(&a.capture).map_err(|e| anyhow!(e))?;
    let replay =
        prepare(&capture, a.feed, a.port, a.packets, a.packet_bytes_max).map_err(|e| anyhow!(e))?;
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, a.listen))
        .with_context(|| format!("listening on 127.0.0.1:{}", a.listen))?;
    eprintln!(
        "{} packets from UDP port {} in memory ({} orders expected); waiting for the client's FIX connection on 127.0.0.1:{}",
        replay.packets.len(),
        replay.port,
        replay.orders_expected(),
        a.listen
    );
    let cfg = DriveConfig {
        timeout_ms: a.timeout_ms,
        quiet_us: a.quiet_us,
        price_scale: a.price_scale,
        accept_timeout_ms: a.accept_timeout_ms,
        keep_traffic: a.out_pcap.is_some(),
        cpu: a.cpu,
        ..DriveConfig::new(a.target)
    };
    let report = drive(&replay, &listener, &cfg).map_err(|e| anyhow!(e))?;
    if let Some(path) = &a.out_pcap {
        let n = write_pcap(path, &replay, &report.traffic).map_err(|e| anyhow!(e))?;
        eprintln!(
            "wrote {n} packets (UDP feed and FIX over TCP) to {}",
            path.display()
        );
    }
    if let Some(path) = &a.samples {
        std::fs::write(path, samples_csv(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!(
            "{}",
            driver::report_text(&report, "bourse t2t client, loopback")
        );
    }
    if report.packets_wrong > 0 || report.timeouts > 0 {
        bail!(
            "{} packets got other orders than expected, {} timed out",
            report.packets_wrong,
            report.timeouts
        );
    }
    Ok(())
}

/// Symbols and price scales from a file of instrument definitions.
fn instrument_names(path: &std::path::Path) -> Result<Vec<InstrumentName>> {
    Ok(crate::itch_cmd::read_instruments(path)?
        .into_iter()
        .map(|d| InstrumentName {
            security_id: d.instrument.0,
            symbol: d.symbol,
            price_scale: d.price_scale,
        })
        .collect())
}

/// The client's settings from its arguments.
pub fn client_config(a: &ClientArgs) -> Result<ClientConfig> {
    let instruments = match &a.instruments {
        Some(p) => instrument_names(p)?,
        None => Vec::new(),
    };
    let limits = Limits {
        instruments_max: a.instruments_max,
        orders_max: a.orders_max,
        levels_per_side_max: a.levels_max,
    };
    check_limits_fit(&limits)?;
    Ok(ClientConfig {
        reactor: ReactorConfig {
            feed: a.feed,
            limits,
            order: OrderSpec {
                sender_comp_id: a.sender_comp_id.clone(),
                target_comp_id: a.target_comp_id.clone(),
                qty: a.qty,
                price_scale: a.price_scale,
                instruments,
            },
            stages: a.stages,
            packet_bytes_max: a.packet_bytes_max,
            ..ReactorConfig::default()
        },
        busy_poll: a.busy_poll,
        packets_max: a.packets,
        cpu: a.cpu,
        await_answers_ms: a.await_answers_ms,
        ..ClientConfig::new(a.fix)
    })
}

/// Refuses book limits the client cannot number or this machine cannot hold: the books
/// allocate and write all their memory at start, and an allocation too large aborts the
/// process instead of failing. The refusal names the flag that was typed.
fn check_limits_fit(limits: &Limits) -> Result<()> {
    limits.check().map_err(|why| {
        let (key, rest) = why.split_once(' ').unwrap_or((&why, ""));
        anyhow!("--{} {rest}", key.replace('_', "-"))
    })?;
    let flags: Vec<_> = limits
        .preallocations()
        .into_iter()
        .map(|p| p.as_flag())
        .collect();
    bourse_cluster::machine::check_fits_machine(&flags).map_err(|why| anyhow!(why))
}

fn client_cmd(a: ClientArgs) -> Result<()> {
    let cfg = client_config(&a)?;
    let feed = bind_feed(SocketAddrV4::new(Ipv4Addr::LOCALHOST, a.md))
        .with_context(|| format!("binding UDP 127.0.0.1:{}", a.md))?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let _ = ctrlc::set_handler(move || s.store(true, Ordering::Relaxed));
    let report = run_client(&cfg, feed, &stop).map_err(|e| anyhow!(e))?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", client::report_text(&report));
    }
    Ok(())
}

fn gen_cmd(a: GenArgs) -> Result<()> {
    let sizes = Sizes::parse(&a.updates).map_err(|e| anyhow!(e))?;
    let packets = match (&a.from, a.format) {
        (Some(_), FeedFormat::Itch) => bail!(
            "--from repacks a bourse md recording (SBE); an ITCH recording from `bourse itch tail --pcap` replays as it is with `bourse t2t drive --feed itch`"
        ),
        (None, FeedFormat::Itch) => bourse_t2t::itch::synthetic(&GenConfig {
            packets: a.packets,
            instruments: a.instruments,
            sizes,
            seed: a.seed,
            packet_bytes_max: a.packet_bytes_max,
            ..GenConfig::default()
        })
        .map_err(|e| anyhow!(e))?,
        (Some(from), FeedFormat::Sbe) => {
            let capture = read_pcap_file(from).map_err(|e| anyhow!(e))?;
            let messages = gen::order_log_messages(&capture, a.port, a.packet_bytes_max)
                .map_err(|e| anyhow!(e))?;
            eprintln!(
                "{} order-log messages in {}",
                messages.len(),
                from.display()
            );
            gen::repack(&messages, &sizes, a.seed, a.packet_bytes_max, a.packets)
                .map_err(|e| anyhow!(e))?
        }
        (None, FeedFormat::Sbe) => gen::synthetic(&GenConfig {
            packets: a.packets,
            instruments: a.instruments,
            sizes,
            seed: a.seed,
            packet_bytes_max: a.packet_bytes_max,
            ..GenConfig::default()
        })
        .map_err(|e| anyhow!(e))?,
    };
    gen::write_capture(&a.out, &packets, a.dst_port, GenConfig::default().start_ns)
        .map_err(|e| anyhow!(e))?;
    let per_packet = match a.format {
        FeedFormat::Sbe => {
            driver::reference_orders(
                &packets,
                &bourse_marketdata::wire::market_data::PacketParser::new(
                    a.packet_bytes_max,
                    bourse_marketdata::wire::market_data::MESSAGES_PER_PACKET_MAX,
                ),
            )
            .0
        }
        FeedFormat::Itch => driver::reference_orders_itch(&packets, a.packet_bytes_max).0,
    };
    let updates: usize = per_packet.iter().map(|&u| usize::from(u)).sum();
    println!(
        "wrote {} packets ({updates} updates) to {} (UDP to 127.0.0.1:{})",
        packets.len(),
        a.out.display(),
        a.dst_port
    );
    Ok(())
}
