//! `bourse bench ...`: one module per benchmark. Each measures with HDR histograms, prints p50
//! to max and, with `--json`, one JSON object per scenario (BENCHMARKS.md quotes them);
//! latency in open-loop runs counts from the scheduled send time. What they share (the
//! latency summary, table rows, the loopback echo baseline, medians, free ports, scratch
//! directories) is in `common`.

mod admin;
mod capacity;
mod clearing;
mod cluster;
pub(crate) mod common;
mod delay;
mod delivery;
mod engine;
mod gateway;
mod journal;
mod marketdata;
mod node_loop;
mod recovery;
mod round;
mod t2t;
mod venue;

use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Accounts added per second through the admin API of a replicated venue, and trading
    /// latency while they are added against a run without.
    Admin(admin::AdminBenchArgs),
    /// One core in-process on one thread, no I/O: throughput and latency per command type.
    Engine(engine::EngineBenchArgs),
    /// Memory per account, per position and per resting order at the seeds' scale.
    Capacity(capacity::CapacityArgs),
    /// Journal appends per fsync mode: records/s, MB/s and fsync latency.
    Journal(journal::JournalBenchArgs),
    /// Three local nodes on loopback: replicated commands/s and commit latency per fsync mode,
    /// beside a TCP echo round trip; replay speed.
    Cluster(cluster::ClusterBenchArgs),
    /// The data-delivery store (seed 003): records/s written with no readers, and the lag,
    /// batch size and share of empty answers of N polling readers at a given write rate.
    Delivery(delivery::DeliveryBenchArgs),
    /// Market data publication delay, top-20 book delay and bandwidth over loopback UDP.
    Marketdata(marketdata::BenchArgs),
    /// Door-to-door round trips through the FIX and binary gateways over loopback, open loop
    /// and at saturation, beside a TCP echo round trip.
    Gateway(gateway::GatewayBenchArgs),
    /// A node's recovery: journal replay (commands/s, read and apply apart) and snapshot
    /// size, write, fsync and restore time for 1M accounts and 10M positions.
    Recovery(recovery::RecoveryBenchArgs),
    /// Tick-to-trade (seed 004) on loopback: the replay driver and the reference reacting
    /// client, beside the UDP, TCP echo and null-client floors of the same run.
    T2t(t2t::T2tBenchArgs),
    /// An intermediate clearing of N accounts × M positions in process: positions/s of the
    /// run and memory per position of the clearing state.
    Clearing(clearing::ClearingBenchArgs),
    /// One replica group's CPU time and context switches per replication round, as it runs
    /// (openraft) and as one loop per node (the floor of that design), side by side.
    Round(round::RoundBenchArgs),
    /// The whole demo venue at fixed rates: CPU time and context switches per transaction by
    /// thread group and in total, beside the round trip through the gateway.
    Venue(venue::VenueBenchArgs),
}

/// Runs one benchmark.
pub fn run(command: BenchCommand) -> Result<()> {
    match command {
        BenchCommand::Admin(args) => admin::bench(args),
        BenchCommand::Engine(args) => engine::engine(args),
        BenchCommand::Capacity(args) => capacity::capacity(args),
        BenchCommand::Journal(args) => journal::bench(args),
        BenchCommand::Cluster(args) => cluster::bench(args),
        BenchCommand::Delivery(args) => delivery::bench(args),
        BenchCommand::Marketdata(args) => marketdata::bench(args),
        BenchCommand::Gateway(args) => gateway::bench(args),
        BenchCommand::Recovery(args) => recovery::recovery(args),
        BenchCommand::T2t(args) => t2t::bench(args),
        BenchCommand::Clearing(args) => clearing::bench(args),
        BenchCommand::Round(args) => round::bench(args),
        BenchCommand::Venue(args) => venue::bench(args),
    }
}
