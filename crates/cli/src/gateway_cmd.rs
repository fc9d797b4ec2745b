//! `bourse gateway --config FILE`: the FIX and binary access servers in front of the trading
//! cores of the config (`[[cores]]`: in-process engines, or replica groups reached through a
//! `ClusterLink`), with `/metrics` and the dashboard when `monitor_listen` is set. `start` also
//! serves `bourse bench gateway`.

use anyhow::{anyhow, Context, Result};
use bourse_cluster::link::{ClusterLink, ClusterLinkConfig};
use bourse_engine::in_process::InProcessCore;
use bourse_engine::EngineConfig;
use bourse_gateway::{CoreLink, GatewayConfig, GatewayHandle};
use clap::Args;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct GatewayArgs {
    /// The gateway's TOML configuration (see examples/gateway.toml).
    #[arg(long)]
    config: PathBuf,
    /// Live orders the in-process core can hold.
    #[arg(long, default_value_t = 1 << 20)]
    orders_max: u32,
}

/// The links to the config's cores, in the order of `GatewayConfig::core_plan`: an engine on
/// its own thread for an in-process core (numbering its orders from
/// `core_index << ORDER_ID_CORE_SHIFT`), a `ClusterLink` for a replicated one. A replicated
/// core's link takes this run's client id (a fresh epoch, `bourse_gateway::recovery`) and
/// resumes the core's committed stream where the order state saved by the previous run is
/// exact, so that the gateway loads it.
pub fn core_links(config: &GatewayConfig, orders_max: u32) -> Result<Vec<Box<dyn CoreLink>>> {
    let depth = config.gateway.core_queue_depth;
    let mut links: Vec<Box<dyn CoreLink>> = Vec::new();
    let engine = EngineConfig {
        orders_max,
        ..EngineConfig::default()
    };
    let in_process_cores = config.core_plan().iter().filter(|c| c.in_process).count();
    if in_process_cores > 0 {
        engine
            .check()
            .map_err(|why| anyhow!("--orders-max: {why}"))?;
        // Every in-process core sets aside its own tables, so they must fit together.
        crate::engine_run::check_engines_fit(&engine, in_process_cores as u64)?;
    }
    let recovery = if config.core_plan().iter().any(|c| !c.in_process) {
        Some(bourse_gateway::recovery::Recovery::open(config).map_err(|e| anyhow!(e))?)
    } else {
        None
    };
    for (index, core) in config.core_plan().iter().enumerate() {
        if core.in_process {
            links.push(Box::new(InProcessCore::engine(index, engine, depth)));
        } else {
            let client_id = core
                .client_id
                .ok_or_else(|| anyhow!("core {}: no client_id", core.name))?;
            bourse_cluster::transport::configure_client(&core.nodes, core.tls.as_ref())
                .map_err(|e| anyhow!("core {}: tls: {e}", core.name))?;
            let link_config = match &recovery {
                Some(r) => ClusterLinkConfig {
                    from_index: r.resume_index(index),
                    ..ClusterLinkConfig::new(core.nodes.clone(), r.link_client_id(client_id), depth)
                },
                None => ClusterLinkConfig::new(core.nodes.clone(), client_id, depth),
            };
            let link =
                ClusterLink::start(link_config).map_err(|e| anyhow!("core {}: {e}", core.name))?;
            links.push(Box::new(link));
        }
    }
    Ok(links)
}

/// Starts the access servers in front of the config's cores.
pub fn start(config: GatewayConfig, orders_max: u32) -> Result<GatewayHandle> {
    let links = core_links(&config, orders_max)?;
    bourse_gateway::spawn_cores(config, links, None).map_err(|e| anyhow!(e))
}

pub fn run(args: GatewayArgs) -> Result<()> {
    let mut config = GatewayConfig::from_file(&args.config).map_err(|e| anyhow!(e))?;
    // Bootstrap is idempotent, so it is on unless a core opts out (`bootstrap = false`).
    config.core.bootstrap = true;
    let handle = start(config, args.orders_max)?;
    if let Some(a) = handle.fix_addr() {
        println!("FIX 4.4 listening on {a}");
    }
    if let Some(a) = handle.binary_addr() {
        println!("binary order entry listening on {a}");
    }
    if let Some(a) = handle.fix_tls_addr() {
        println!("FIX 4.4 over TLS listening on {a}");
    }
    if let Some(a) = handle.binary_tls_addr() {
        println!("binary order entry over TLS listening on {a}");
    }
    if let Some(a) = handle.monitor_addr() {
        println!("metrics on http://{a}/metrics, dashboard on http://{a}/");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop_signal = Arc::clone(&stop);
    ctrlc::set_handler(move || stop_signal.store(true, Ordering::SeqCst))
        .context("cannot install the Ctrl-C handler")?;
    while !stop.load(Ordering::SeqCst) && handle.is_running() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = handle.stats();
    eprintln!(
        "gateway: {} connections accepted, {} requests, {} reports",
        s.connections_accepted.load(Ordering::Relaxed),
        s.requests_in.load(Ordering::Relaxed),
        s.reports_out.load(Ordering::Relaxed)
    );
    handle.shutdown();
    Ok(())
}
