//! # bourse: the one binary
//!
//! Subcommands in the style of `tigerbeetle` or `cockroach`: `demo` (the main job), `engine`
//! (the batch interface of one trading core), `bench` (benchmarks that print HDR percentiles
//! and, with `--json`, one JSON object per scenario). Each subcommand lives in its own module;
//! this file only parses arguments and dispatches.

mod bench;
mod demo;
mod engine_run;
mod fix_acceptor;
mod journal_cmd;
mod report;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "bourse",
    version = env!("BOURSE_GIT_DESCRIBE"),
    about = "bourse: an exchange trading-clearing system"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a trading core with simulated participants on equities, FX and futures, printing
    /// the rates every second and a summary at the end.
    Demo(demo::DemoArgs),
    /// The batch interface of one trading core.
    Engine {
        #[command(subcommand)]
        command: EngineCommand,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
    /// Operator views of a journal directory (read only).
    Journal {
        #[command(subcommand)]
        command: journal_cmd::JournalCommand,
    },
    /// The FIX 4.4 session layer on its own.
    Fix {
        #[command(subcommand)]
        command: FixCommand,
    },
}

#[derive(Subcommand)]
enum FixCommand {
    /// Run a FIX 4.4 acceptor (the session layer with the echo application, as QuickFIX's
    /// acceptance-test server) until killed.
    Acceptor(fix_acceptor::AcceptorArgs),
}

#[derive(Subcommand)]
enum EngineCommand {
    /// Feed commands from a JSON Lines file through one core and write every event as JSON
    /// Lines (see docs/engine-jsonl.md).
    Run {
        /// Commands, one JSON object per line ("-" for standard input).
        #[arg(long)]
        input: PathBuf,
        /// Events, one JSON object per line ("-" for standard output).
        #[arg(long)]
        output: PathBuf,
        /// Also write the final state hash and counters to standard error.
        #[arg(long)]
        summary: bool,
        /// Live orders the core can hold.
        #[arg(long, default_value_t = 1 << 20)]
        orders_max: u32,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// One core in-process on one thread, no I/O: throughput and latency per command type.
    Engine(bench::EngineBenchArgs),
    /// Memory per account, per position and per resting order at the seeds' scale.
    Capacity(bench::CapacityArgs),
    /// Journal appends per fsync mode: records/s, MB/s and fsync latency.
    Journal(journal_cmd::JournalBenchArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Engine {
            command:
                EngineCommand::Run {
                    input,
                    output,
                    summary,
                    orders_max,
                },
        } => engine_run::run(&input, &output, summary, orders_max),
        Command::Bench { command } => match command {
            BenchCommand::Engine(args) => bench::engine(args),
            BenchCommand::Capacity(args) => bench::capacity(args),
            BenchCommand::Journal(args) => journal_cmd::bench(args),
        },
        Command::Journal { command } => journal_cmd::run(command),
        Command::Fix {
            command: FixCommand::Acceptor(args),
        } => fix_acceptor::run(args),
    };
    if let Err(e) = result {
        eprintln!("bourse: {e:#}");
        std::process::exit(1);
    }
}
