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
    /// FIX sessions for people (`bourse order`) on gateway 0: (CompID, accounts).
    pub extra_fix_sessions: Vec<(String, Vec<u32>)>,
    /// Print what starts, as it starts.
    pub verbose: bool,
}
