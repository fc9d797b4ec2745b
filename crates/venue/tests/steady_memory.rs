// Its own binary, outside tests/it: its #[global_allocator] counts the whole process's heap.
//! Steady memory: a replicated venue (three nodes, their market data feeds, a gateway) whose
//! bounded structures are sized small ([`MemoryBounds::SMALL`]) takes a fixed number of
//! commands, and the bytes its heap holds stop growing once the bounds are reached.
//!
//! What is measured is the heap's live bytes (every allocation minus every free, counted by
//! this test's global allocator), not RSS: exact, and blind to the allocator's retention.
//! Nothing depends on time: the load is a fixed count of order pairs (a resting sell and an
//! IOC buy that trades with it, so both orders finish and every trade reaches the feed), sent
//! in windows, each window fully answered before the heap is sampled. The assertion is a
//! slope: the growth over the second half divided by its commands, against a bound that is
//! zero per command plus a fixed allowance for buffers that reach a new high-water mark (a
//! `Vec` doubles its capacity once and keeps it).

use bourse_client::binary::{BinTif, BinaryClient, Received, Response};
use bourse_core::*;
use bourse_engine::fixtures::equity;
use bourse_loadgen::gateway::SessionProtocol;
use bourse_venue::heap::{self, Counting};
use bourse_venue::{Backend, DeploymentSpec, LocalDeployment, MarketSpec, MemoryBounds};
use std::alloc::System;
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: Counting<System> = Counting::new(System);

const SBER: u32 = 1;
const WAIT: Duration = Duration::from_secs(30);
/// Order pairs per window (both orders of a pair are answered before the next window).
const PAIRS_PER_WINDOW: u64 = 250;
/// Windows in all: the first half fills every bound, the second half is measured. The bounds
/// are counts of orders or bytes where they can be (the gateway's 4,096 finished orders take
/// nine windows), and a node's decoded log tail is bounded in bytes as well as entries, so
/// how the replicas batch commands (which varies with the machine's load) cannot delay the
/// plateau past the first half: it came after about ten windows on a loaded machine.
const WINDOWS: u64 = 2 * 40;
/// What buffers reaching a new high-water mark may add over the second half, at most.
const HIGH_WATER_ALLOWANCE_BYTES: i64 = 4 << 20;
/// Bytes per command the heap may grow by once every bound is reached. A leak of the kind
/// issue 18 reported held 3,500 bytes per command.
const BYTES_PER_COMMAND_MAX: f64 = 8.0;

fn venue(dir: &std::path::Path) -> LocalDeployment {
    let mut setup = vec![CommandBody::AddInstrument(equity(SBER, "SBER", 10_000))];
    for account in [1, 2] {
        setup.push(CommandBody::AddAccount(AccountSpec {
            account: AccountId(account),
            firm: FirmId(1),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        }));
        setup.push(CommandBody::Deposit {
            account: AccountId(account),
            amount: Cash(1_000_000_000_000_000),
        });
    }
    let spec = DeploymentSpec {
        markets: vec![MarketSpec {
            name: "equities".into(),
            instruments: vec![equity(SBER, "SBER", 10_000)],
            setup,
        }],
        backend: Backend::Cluster,
        protocol: SessionProtocol::Binary,
        gateways: 1,
        worker_sessions: vec![vec![vec![1, 2]]],
        data_dir: dir.join("venue"),
        orders_max: 10_000,
        accounts_max: 16,
        fsync: bourse_cluster::FsyncSetting::Never,
        market_data: true,
        core_in_flight_max: None,
        bounds: Some(MemoryBounds::SMALL),
        monitor: None,
        extra_fix_sessions: Vec::new(),
        verbose: false,
    };
    LocalDeployment::start(spec).expect("the venue starts")
}

/// Sends one window of pairs and waits until each order of it has its fill.
fn window(client: &mut BinaryClient, first_id: u64) {
    for i in 0..PAIRS_PER_WINDOW {
        let id = first_id + 2 * i;
        client
            .new_order(id, 1, SBER, false, 10, Some(10_000), BinTif::Day)
            .unwrap();
        client
            .new_order(
                id + 1,
                2,
                SBER,
                true,
                10,
                Some(10_000),
                BinTif::ImmediateOrCancel,
            )
            .unwrap();
    }
    let mut fills = 0;
    let deadline = Instant::now() + WAIT;
    while fills < 2 * PAIRS_PER_WINDOW {
        assert!(Instant::now() < deadline, "a window was not answered");
        match client.recv(Duration::from_millis(100)).unwrap() {
            Some(Received {
                response: Response::Execution { .. },
                ..
            }) => fills += 1,
            Some(Received {
                response: r @ (Response::OrderReject { .. } | Response::BusinessReject { .. }),
                ..
            }) => panic!("an order was refused: {r:?}"),
            _ => {}
        }
    }
}

#[test]
fn the_heap_stops_growing_once_the_bounded_structures_are_full() {
    let dir = tempfile::tempdir().unwrap();
    let mut deployment = venue(dir.path());
    let addr = deployment.gateways()[0].binary_addr().unwrap();
    let mut client = BinaryClient::connect(addr, "W0S0", 30_000, 1).unwrap();
    let mut samples = Vec::with_capacity(WINDOWS as usize);
    for w in 0..WINDOWS {
        window(&mut client, 1 + w * 2 * PAIRS_PER_WINDOW);
        samples.push(heap::live_bytes());
    }
    if std::env::var_os("STEADY_MEMORY_TRACE").is_some() {
        for (w, b) in samples.iter().enumerate().step_by(5) {
            eprintln!("window {w}: {:.2} MiB", *b as f64 / (1 << 20) as f64);
        }
    }
    let commands_per_window = 2 * PAIRS_PER_WINDOW;
    let half = samples.len() / 2;
    // The floor of each quarter of the second half: in-flight buffers come and go, what is
    // kept raises the floor.
    let quarter = half / 2;
    let floor = |s: &[i64]| *s.iter().min().unwrap();
    let early = floor(&samples[half..half + quarter]);
    let late = floor(&samples[samples.len() - quarter..]);
    let commands = (samples.len() - half - quarter) as f64 * commands_per_window as f64;
    let per_command = (late - early) as f64 / commands;
    let mb = |b: i64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "live heap: {:.1} MiB after the first window, {:.1} MiB at half, floors {:.1} → {:.1} MiB \
         over the second half: {per_command:.2} bytes per command",
        mb(samples[0]),
        mb(samples[half]),
        mb(early),
        mb(late),
    );
    let allowed = BYTES_PER_COMMAND_MAX * commands + HIGH_WATER_ALLOWANCE_BYTES as f64;
    assert!(
        ((late - early) as f64) <= allowed,
        "the heap grew by {} bytes over {commands} commands ({per_command:.1} per command) once \
         every bound was reached; allowed {allowed} (samples per window: {samples:?})",
        late - early
    );
    deployment.stop();
}
