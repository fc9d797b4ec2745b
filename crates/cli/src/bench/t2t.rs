//! `bourse bench t2t`: tick-to-trade on loopback as seed 004 measures it, beside the floors
//! of the same run.
//!
//! One process, two threads: the driver (spinning on its TCP socket) and the reference
//! client (blocking in `recv` unless `--busy-poll`). Scenarios, in order:
//!
//! 1. floors: UDP one way (send returned → recv returned in another thread), the TCP echo
//!    round trip of every network benchmark, and the driver with a null client that answers
//!    every packet with a fixed order without decoding (the stand's own floor: UDP send,
//!    wake-up, TCP send and receive);
//! 2. t2t: the reference client on a capture of packets of 1-20 updates (what fits the feed's
//!    1472 bytes), the seed's table, and the client's processing (recv returned → send
//!    called) by packet size;
//! 3. stages: the same with the client timing each stage;
//! 4. size curve: a loopback-only capture of packets of 1-128 updates (jumbo datagrams);
//! 5. the reaction alone: `Reactor::on_datagram` timed per packet in a loop over the same
//!    captures, no sockets (warm caches: what the code costs, apart from the wake-up).
//!
//! `--feed itch` runs every scenario on MoldUDP64 packets of ITCH 5.0 messages instead of
//! bourse's SBE order log (an update is then one ITCH book message).

use super::common::{echo_baseline, Machine};
use anyhow::{anyhow, Result};
use bourse_t2t::capture::{read_pcap_file, Capture, Datagram};
use bourse_t2t::client::{bind_feed, report_text, run_client, ClientConfig, ClientReport};
use bourse_t2t::driver::{drive, prepare, DriveConfig, DriveReport, Replay};
use bourse_t2t::floor::{null_replay, run_null_client, udp_one_way};
use bourse_t2t::gen::{synthetic, GenConfig, Sizes};
use bourse_t2t::reactor::{Reactor, ReactorConfig};
use bourse_t2t::stats::{
    seed_rows, size_table, table_header, table_row, text_histogram, BySize, Summary,
};
use bourse_t2t::FeedFormat;
use clap::Args;
use serde_json::json;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Datagrams of the UDP one-way floor.
const UDP_FLOOR_PACKETS: usize = 20_000;
/// Largest datagram of the size-curve capture (128 OrderExecutions and the headers).
const JUMBO_PACKET_BYTES: usize = 9_000;

#[derive(Args)]
pub struct T2tBenchArgs {
    /// Packets of the t2t run (the seed's has 90,000).
    #[arg(long, default_value_t = 90_000)]
    packets: usize,
    /// Updates per packet of the t2t run's generated capture.
    #[arg(long, default_value = "1-20")]
    updates: String,
    /// Replay this capture in the t2t run instead of a generated one.
    #[arg(long)]
    capture: Option<PathBuf>,
    /// Packets of the stage-timing run.
    #[arg(long, default_value_t = 20_000)]
    stage_packets: usize,
    /// Packets of the 1-128 size curve (0 skips it).
    #[arg(long, default_value_t = 20_000)]
    curve_packets: usize,
    /// The client spins on its feed socket (with the spinning driver: both cores busy).
    #[arg(long)]
    busy_poll: bool,
    /// Pin the driver to CPU 0 and the client to CPU 1, so that neither preempts the other.
    /// Off by default: on a 2-core machine a pinned thread queues behind whatever else runs
    /// on its core (DESIGN.md: no core pinning on small machines).
    #[arg(long)]
    pin: bool,
    /// The feed: `sbe` (bourse's order log) or `itch` (MoldUDP64/ITCH 5.0).
    #[arg(long, default_value = "sbe", value_parser = FeedFormat::parse)]
    feed: FeedFormat,
    /// One JSON object per scenario.
    #[arg(long)]
    json: bool,
}

fn in_memory(packets: Vec<Vec<u8>>) -> Capture {
    let addr = |port| SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    Capture {
        datagrams: packets
            .into_iter()
            .enumerate()
            .map(|(k, payload)| Datagram {
                ts_ns: k as u64,
                src: addr(40_000),
                dst: addr(bourse_t2t::ORDERS_PORT_DEFAULT),
                payload,
            })
            .collect(),
        ..Capture::default()
    }
}

fn generated(
    feed: FeedFormat,
    packets: usize,
    updates: &str,
    packet_bytes_max: usize,
) -> Result<Replay> {
    let cfg = GenConfig {
        packets,
        sizes: Sizes::parse(updates).map_err(|e| anyhow!(e))?,
        packet_bytes_max,
        ..GenConfig::default()
    };
    let packets = match feed {
        FeedFormat::Sbe => synthetic(&cfg),
        FeedFormat::Itch => bourse_t2t::itch::synthetic(&cfg),
    }
    .map_err(|e| anyhow!(e))?;
    prepare(
        &in_memory(packets),
        feed,
        None,
        usize::MAX,
        packet_bytes_max,
    )
    .map_err(|e| anyhow!(e))
}

/// Runs the driver against a client thread; `null` runs the floor's null client instead.
fn run_pair(
    replay: &Replay,
    client: &ClientConfig,
    driver_cpu: Option<usize>,
    null: bool,
) -> Result<(DriveReport, Option<ClientReport>)> {
    let feed = bind_feed(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?;
    let SocketAddr::V4(target) = feed.local_addr()? else {
        return Err(anyhow!("the feed socket is not IPv4"));
    };
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let cfg = ClientConfig {
        fix_addr: listener.local_addr()?,
        ..client.clone()
    };
    let stop = AtomicBool::new(false);
    let drive_cfg = DriveConfig {
        timeout_ms: 1_000,
        cpu: driver_cpu,
        ..DriveConfig::new(target)
    };
    let (report, client_report) = std::thread::scope(|s| {
        let c = s.spawn(|| {
            if null {
                run_null_client(&cfg, feed, &stop).map(|_| None)
            } else {
                run_client(&cfg, feed, &stop).map(Some)
            }
        });
        let report = drive(replay, &listener, &drive_cfg);
        (report, c.join())
    });
    let report = report.map_err(|e| anyhow!(e))?;
    let client_report = client_report
        .map_err(|_| anyhow!("the client thread panicked"))?
        .map_err(|e| anyhow!(e))?;
    Ok((report, client_report))
}

/// Times `Reactor::on_datagram` per reacting packet, by packet size, in `rounds` passes over
/// the packets (a fresh reactor each pass, so every pass sees the same books).
fn reaction_alone(replay: &Replay, packet_bytes_max: usize, rounds: usize) -> Result<BySize> {
    let mut by_size = BySize::default();
    for _ in 0..rounds {
        let mut r = Reactor::new(ReactorConfig {
            feed: replay.feed,
            packet_bytes_max,
            ..ReactorConfig::default()
        })
        .map_err(|e| anyhow!(e))?;
        for p in &replay.packets {
            let t = Instant::now();
            let reaction = r.on_datagram(p, 1_700_000_000_000_000_000);
            let ns = t.elapsed().as_nanos() as u64;
            if reaction.orders > 0 {
                by_size.record(reaction.updates, ns);
            }
        }
    }
    Ok(by_size)
}

fn summary_json(s: &Summary) -> serde_json::Value {
    serde_json::to_value(s).unwrap_or_default()
}

pub fn bench(a: T2tBenchArgs) -> Result<()> {
    let mut machine = Machine::this();
    let replay = match &a.capture {
        Some(path) => {
            let capture = read_pcap_file(path).map_err(|e| anyhow!(e))?;
            prepare(&capture, a.feed, None, a.packets, 1472).map_err(|e| anyhow!(e))?
        }
        None => generated(a.feed, a.packets, &a.updates, 1472)?,
    };
    let pin = a.pin && machine.cpus >= 2;
    let (driver_cpu, client_cpu) = if pin {
        (Some(0), Some(1))
    } else {
        (None, None)
    };
    let mut client = ClientConfig {
        busy_poll: a.busy_poll,
        cpu: client_cpu,
        ..ClientConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)))
    };
    client.reactor.feed = a.feed;
    let mut sizes: Vec<usize> = replay.packets.iter().map(Vec::len).collect();
    sizes.sort_unstable();
    let median_bytes = sizes[sizes.len() / 2];

    // 1. Floors.
    let udp = Summary::of(&udp_one_way(
        UDP_FLOOR_PACKETS,
        median_bytes,
        pin.then_some((0, 1)),
    )?);
    let echo = Summary::of(&echo_baseline()?);
    let (null, _) = run_pair(&null_replay(&replay), &client, driver_cpu, true)?;

    // 2. t2t.
    let (t2t, client_report) = run_pair(&replay, &client, driver_cpu, false)?;
    let client_report = client_report.ok_or_else(|| anyhow!("no client report"))?;

    // 3. Stages.
    let n = a.stage_packets.min(replay.packets.len());
    let stage_replay = Replay {
        feed: replay.feed,
        port: replay.port,
        packets: replay.packets[..n].to_vec(),
        updates: replay.updates[..n].to_vec(),
        expected: replay.expected[..n].to_vec(),
    };
    let staged = ClientConfig {
        reactor: bourse_t2t::reactor::ReactorConfig {
            stages: true,
            ..client.reactor.clone()
        },
        ..client.clone()
    };
    let (_, stage_report) = run_pair(&stage_replay, &staged, driver_cpu, false)?;
    let stage_report = stage_report.ok_or_else(|| anyhow!("no client report"))?;

    // 4. The size curve up to 128 updates.
    let curve = if a.curve_packets > 0 {
        let curve_replay = generated(a.feed, a.curve_packets, "1-128", JUMBO_PACKET_BYTES)?;
        let jumbo = ClientConfig {
            reactor: bourse_t2t::reactor::ReactorConfig {
                packet_bytes_max: JUMBO_PACKET_BYTES,
                ..client.reactor.clone()
            },
            ..client.clone()
        };
        let (d, c) = run_pair(&curve_replay, &jumbo, driver_cpu, false)?;
        Some((d, c.ok_or_else(|| anyhow!("no client report"))?))
    } else {
        None
    };

    // 5. The reaction alone.
    let alone = reaction_alone(&replay, 1472, 3)?;
    let alone_curve = match &curve {
        Some(_) => Some(reaction_alone(
            &generated(a.feed, a.curve_packets, "1-128", JUMBO_PACKET_BYTES)?,
            JUMBO_PACKET_BYTES,
            3,
        )?),
        None => None,
    };

    machine.finish();
    let ratio_mean = t2t.t2t_ns.mean as f64 / null.t2t_ns.mean.max(1) as f64;
    let ratio_p50 = t2t.t2t_ns.p50 as f64 / null.t2t_ns.p50.max(1) as f64;
    if a.json {
        println!(
            "{}",
            json!({"scenario": "floors", "udp_one_way_ns": summary_json(&udp), "tcp_echo_rtt_ns": summary_json(&echo),
                   "null_client_t2t_ns": summary_json(&null.t2t_ns), "machine": machine})
        );
        println!(
            "{}",
            json!({"scenario": "t2t", "drive": t2t, "client": client_report,
                   "ratio_to_null_client_mean": ratio_mean, "ratio_to_null_client_p50": ratio_p50})
        );
        println!("{}", json!({"scenario": "stages", "client": stage_report}));
        if let Some((d, c)) = &curve {
            println!(
                "{}",
                json!({"scenario": "size_curve", "drive": d, "client": c})
            );
        }
        return Ok(());
    }
    println!(
        "bourse bench t2t: {} ({} cpus), load average {:.2} at the start, {:.2} at the end",
        machine.model, machine.cpus, machine.load_average_start, machine.load_average_end
    );
    println!(
        "capture: {} packets of {} ({}), median {} bytes; client {}; driver spinning; {}\n",
        replay.packets.len(),
        match a.feed {
            FeedFormat::Sbe => "bourse's SBE order log",
            FeedFormat::Itch => "ITCH 5.0 over MoldUDP64",
        },
        a.capture.as_ref().map_or(
            format!("generated, {} updates per packet", a.updates),
            |p| p.display().to_string()
        ),
        median_bytes,
        if a.busy_poll {
            "busy-polling"
        } else {
            "blocking in recv"
        },
        if pin {
            "driver pinned to CPU 0, client to CPU 1"
        } else {
            "unpinned"
        }
    );
    println!("floors of this run, ns:");
    println!("{}", table_header());
    println!(
        "{}",
        table_row("UDP one way (send returned -> recv returned)", &udp)
    );
    println!("{}", table_row("TCP echo round trip, 64 bytes", &echo));
    println!(
        "{}",
        table_row(
            "null client (UDP in, fixed FIX order out, no decoding)",
            &null.t2t_ns
        )
    );
    println!("\ntick-to-trade, ns (last byte sent -> first byte of the order):");
    println!("{}", table_header());
    println!("{}", seed_rows());
    println!("{}", table_row("bourse t2t client, loopback", &t2t.t2t_ns));
    println!(
        "{}",
        table_row(
            "the same, clock from the send call",
            &t2t.t2t_from_send_call_ns
        )
    );
    println!(
        "{}",
        table_row(
            "null client, clock from the send call",
            &null.t2t_from_send_call_ns
        )
    );
    println!(
        "ratio to the null client of the same run: mean {ratio_mean:.2}x, p50 {ratio_p50:.2}x; orders {} expected, {} right, {} packets wrong, {} timeouts\n",
        t2t.orders_expected, t2t.orders_matching, t2t.packets_wrong, t2t.timeouts
    );
    print!("{}", text_histogram(&t2t.histogram, 50));
    println!();
    print!("{}", size_table("t2t", &t2t.t2t_by_size));
    println!();
    print!("{}", report_text(&client_report));
    println!(
        "\nwith stage timing ({} packets):",
        stage_replay.packets.len()
    );
    print!("{}", report_text(&stage_report));
    if let Some((d, c)) = &curve {
        println!("\nsize curve, packets of 1-128 updates ({} packets, jumbo datagrams up to {JUMBO_PACKET_BYTES} bytes):", d.packets_sent);
        println!("{}", table_row("t2t, all sizes", &d.t2t_ns));
        print!("{}", size_table("t2t", &d.t2t_by_size));
        print!("{}", size_table("processing", &c.processing_by_size));
    }
    println!("\nthe reaction alone (Reactor::on_datagram in a loop, no sockets, 3 passes), reacting packets:");
    println!("{}", table_row("all sizes", &Summary::of(&alone.all)));
    print!("{}", size_table("reaction", &alone.rows()));
    if let Some(c) = &alone_curve {
        print!("{}", size_table("reaction, 1-128 curve", &c.rows()));
    }
    Ok(())
}
