//! # bourse: the one binary
//!
//! Subcommands in the style of `tigerbeetle` or `cockroach`: `demo` (the main job), `engine`
//! (the batch interface of one trading core), `bench` (benchmarks that print HDR percentiles
//! and, with `--json`, one JSON object per scenario). Each subcommand lives in its own module;
//! this file only parses arguments and dispatches.

mod admin_cmd;
mod admin_serve;
mod auth_cmd;
mod bench;
mod clearing_cmd;
mod cluster_cmd;
mod delivery_cmd;
mod demo;
mod engine_run;
mod fix_acceptor;
mod gateway_cmd;
mod itch_cmd;
mod journal_cmd;
mod loadtest_cmd;
mod md_cmd;
mod node_monitor;
mod order_cmd;
mod report;
mod soak_cmd;
mod soak_processes;
mod t2t_cmd;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

// The allocator is chosen when the binary is built: glibc's malloc by default; mimalloc with
// the `mimalloc` feature; with `count-alloc`, either one wrapped in a counter of live bytes
// (`bourse soak` prints it beside RSS). Nothing counts in a default build.
#[cfg(all(feature = "count-alloc", not(feature = "mimalloc")))]
#[global_allocator]
static HEAP: bourse_venue::heap::Counting<std::alloc::System> =
    bourse_venue::heap::Counting::new(std::alloc::System);

#[cfg(all(feature = "count-alloc", feature = "mimalloc"))]
#[global_allocator]
static HEAP: bourse_venue::heap::Counting<mimalloc::MiMalloc> =
    bourse_venue::heap::Counting::new(mimalloc::MiMalloc);

#[cfg(all(feature = "mimalloc", not(feature = "count-alloc")))]
#[global_allocator]
static HEAP: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// One member of a replicated core's group, until interrupted or killed.
    Node(cluster_cmd::NodeArgs),
    /// A local replica group: up, status, snapshot.
    Cluster {
        #[command(subcommand)]
        command: cluster_cmd::ClusterCommand,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
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
    /// The FIX 4.4 and binary access servers in front of an in-process trading core.
    Gateway(gateway_cmd::GatewayArgs),
    /// Order entry at a terminal over FIX: send, cancel, replace, mass-cancel, list, watch.
    Order(order_cmd::OrderArgs),
    /// The demo's participants for a long time (60 min at 2,000 commands/s by default), with
    /// the venue's memory sampled every --sample-s seconds (docs/results/memory.md).
    Soak(soak_cmd::SoakArgs),
    /// Run a load profile (profiles/*.toml) against a local deployment and write the report
    /// (results.json, report.md, report.html) into --out.
    Loadtest(loadtest_cmd::LoadtestArgs),
    /// Re-render a load-test report from its results.json, optionally against a baseline run.
    Report(loadtest_cmd::ReportArgs),
    /// One generator worker of `bourse loadtest --workers N` (started by it, not by hand).
    #[command(hide = true)]
    LoadgenWorker(loadtest_cmd::WorkerArgs),
    /// Clearing: `run --intermediate|--end-of-day` clears the cores up to their current end
    /// and feeds variation margin back to them as cash movements.
    Clearing {
        #[command(subcommand)]
        command: clearing_cmd::ClearingCommand,
    },
    /// Data delivery (seed 003): serve the latest state of every order by cursor, or tail it.
    Delivery {
        #[command(subcommand)]
        command: delivery_cmd::DeliveryCommand,
    },
    /// Market data tools: listen, book, record, demo-publish.
    Md {
        #[command(subcommand)]
        command: md_cmd::MdCommand,
    },
    /// Market operations on a running venue through its admin API: instruments and phases,
    /// accounts and cash, halts, kill switches, end of day (`docs/admin.md`).
    Admin(admin_cmd::AdminArgs),
    /// Credentials: `hash-password` prints the hash a config stores for a password.
    Auth {
        #[command(subcommand)]
        command: auth_cmd::AuthCommand,
    },
    /// One core's order log as NASDAQ TotalView-ITCH 5.0 over MoldUDP64 (with retransmission),
    /// and a gap-filling consumer of it.
    Itch {
        #[command(subcommand)]
        command: itch_cmd::ItchCommand,
    },
    /// Tick-to-trade (seed 004): the replay driver, the reference reacting client, captures.
    T2t {
        #[command(subcommand)]
        command: t2t_cmd::T2tCommand,
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
        Command::Bench { command } => bench::run(command),
        Command::Journal { command } => journal_cmd::run(command),
        Command::Auth { command } => auth_cmd::run(command),
        Command::Admin(args) => admin_cmd::run(args),
        Command::Node(args) => cluster_cmd::node(args),
        Command::Cluster { command } => cluster_cmd::run(command),
        Command::Fix {
            command: FixCommand::Acceptor(args),
        } => fix_acceptor::run(args),
        Command::Delivery { command } => delivery_cmd::run(command),
        Command::Md { command } => md_cmd::run(command),
        Command::Itch { command } => itch_cmd::run(command),
        Command::T2t { command } => t2t_cmd::run(command),
        Command::Clearing { command } => clearing_cmd::run(command),
        Command::Gateway(args) => gateway_cmd::run(args),
        Command::Order(args) => order_cmd::run(args),
        Command::Soak(args) => soak_cmd::run(args),
        Command::Loadtest(args) => loadtest_cmd::loadtest(args),
        Command::Report(args) => loadtest_cmd::report_cmd(args),
        Command::LoadgenWorker(args) => loadtest_cmd::worker(args),
    };
    if let Err(e) = result {
        eprintln!("bourse: {e:#}");
        std::process::exit(1);
    }
}
