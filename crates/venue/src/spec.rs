//! What a deployment is asked for: the markets with their instruments and setup, the
//! backend that runs their cores, the gateways and the generator's sessions.

use bourse_cluster::FsyncSetting;
use bourse_core::*;
use bourse_loadgen::gateway::SessionProtocol;
use std::path::PathBuf;
use std::sync::Arc;

/// What runs the trading cores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// One engine per market inside the gateway's process (no replication).
    InProcess,
    /// One replica group of three nodes per market.
    Cluster,
}

/// One market: its core's name, instruments and setup commands.
pub struct MarketSpec {
    pub name: String,
    pub instruments: Vec<Instrument>,
    /// Instruments, accounts and deposits, applied in order before the gateways start.
    pub setup: Vec<CommandBody>,
}

/// Everything the deployment needs.
pub struct DeploymentSpec {
    pub markets: Vec<MarketSpec>,
    pub backend: Backend,
    pub protocol: SessionProtocol,
    /// Gateways in front of the cores; sessions are spread over them.
    pub gateways: usize,
    /// For each generator worker, the accounts of each of its sessions.
    pub worker_sessions: Vec<Vec<Vec<u32>>>,
    /// Journals, snapshots and FIX stores go here.
    pub data_dir: PathBuf,
    pub orders_max: u32,
    pub accounts_max: u32,
    pub fsync: FsyncSetting,
    /// Publish market data from the nodes (cluster backend only).
    pub market_data: bool,
    /// Each gateway's bound on commands in flight to one core (`None`: the gateway's
    /// default, `bourse_gateway::config::CORE_IN_FLIGHT_MAX_DEFAULT`).
    pub core_in_flight_max: Option<usize>,
    /// Gateway 0 reports into this monitor (its owner serves the dashboard and `/metrics`).
    pub monitor: Option<Arc<bourse_monitor::Monitor>>,
    /// FIX sessions for people (`bourse order`) on gateway 0, of firm 1: (CompID, accounts;
    /// none: entitled by firm, every account of firm 1).
    pub extra_fix_sessions: Vec<(String, Vec<u32>)>,
    /// Print what starts, as it starts.
    pub verbose: bool,
    /// The sizes of the structures that grow with the flow until their bound (`None`: each
    /// component's default). Small bounds make a short run reach all of them (the
    /// steady-memory test and `bourse soak --small-bounds`).
    pub bounds: Option<MemoryBounds>,
}

/// The bounds of every structure of the venue that fills with the flow and then stays at its
/// size: each node's committed stream ring, each feed's replay history per channel, each
/// gateway's binary resend store per session, the finished orders a gateway remembers, the
/// raft log a node keeps between snapshots and the part of it a node keeps decoded in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBounds {
    pub stream_entries_kept: usize,
    pub stream_bytes_kept: usize,
    pub replay_history_packets: usize,
    pub replay_history_bytes: usize,
    pub gateway_stored_messages_max: usize,
    /// The gateway's `finished_orders_kept`.
    pub gateway_finished_orders_kept: usize,
    pub snapshot_every_entries: u64,
    /// Each node's decoded log tail: entries and bytes (`log_tail_entries_kept`,
    /// `log_tail_bytes_kept`).
    pub log_tail_entries_kept: usize,
    pub log_tail_bytes_kept: usize,
}

impl MemoryBounds {
    /// Bounds a run of some ten thousand commands reaches: a few hundred KiB each.
    pub const SMALL: MemoryBounds = MemoryBounds {
        stream_entries_kept: 512,
        stream_bytes_kept: 256 * 1024,
        replay_history_packets: 512,
        replay_history_bytes: 256 * 1024,
        gateway_stored_messages_max: 1_024,
        gateway_finished_orders_kept: 4_096,
        snapshot_every_entries: 2_000,
        log_tail_entries_kept: 64,
        log_tail_bytes_kept: 256 * 1024,
    };
}
