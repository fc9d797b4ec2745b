//! kill -9 under load: three `bourse node` processes, a client driving commands and recording
//! every acknowledgement, and the leader killed (SIGKILL) and restarted `BOURSE_KILLS` times
//! (default 20; the documented long run is `BOURSE_KILLS=1000`). Each kill happens at one of
//! the moments the issue names, drawn from the seed:
//!
//! - **mid-batch**: after a random pause while the client's requests flow through the leader;
//! - **mid-snapshot**: right after the leader was asked to snapshot (`Request::Snapshot`, as
//!   `bourse cluster snapshot` sends it); a `*.snap.tmp` file left behind proves the kill cut a
//!   snapshot write, and the test counts those;
//! - **mid-election**: the leader elected after the previous kill is killed as soon as it
//!   reports itself, before the restarted node has necessarily caught up.
//!
//! Every `CHECK_EVERY_KILLS` kills and at the end the client pauses, the replicas converge,
//! and the test checks that every acknowledged command is in the replicated history exactly
//! once (the engine's command counter equals the acknowledgements, since the client sends one
//! request at a time and retries it under the same key until answered) and that all three
//! replicas have the same state hash. Prints failover times (kill → a new leader reports
//! itself; kill → the client's next acknowledgement) as p50/p99/max from HDR histograms, and
//! the seed (`BOURSE_KILL_SEED` replays the same kill schedule; thread timing still varies).

use crate::replica_check;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bourse_cluster::net::{PeerConnection, Request};
use bourse_cluster::tokio;
use bourse_engine::workload::Rng;
use hdrhistogram::Histogram;
use replica_check::{
    check_replicas, client_thread, pause_client, resume_client, spawn_node, statuses, summary,
    write_loopback_config, Shared, FAILOVER_LIMIT,
};

/// Kills in a CI run.
const KILLS_DEFAULT: u64 = 20;
/// The whole CI run must end within this (a hang is a failure, not a stuck CI job).
const TEST_TIME_LIMIT: Duration = Duration::from_secs(170);
/// Per kill in a long run (it scales the limit above).
const TIME_PER_KILL_LIMIT: Duration = Duration::from_secs(4);
/// The replicas must agree this often (in kills), besides at the end.
const CHECK_EVERY_KILLS: u64 = 10;
/// Failover times above this are clamped in the histogram.
const FAILOVER_US_MAX: u64 = 60_000_000;

// The kill moments are named as the issue names them: in the middle of a batch, a snapshot
// and an election.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Moment {
    MidBatch,
    MidSnapshot,
    MidElection,
}

/// Interrupted snapshot writes in a node's snapshot directory.
fn temp_snapshots(dir: &Path, id: u64) -> usize {
    let snapshots = dir
        .join("data")
        .join(format!("node-{id}"))
        .join("snapshots");
    std::fs::read_dir(snapshots)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".snap.tmp"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn killing_the_leader_under_load_loses_nothing_acknowledged_and_applies_nothing_twice() {
    let kills: u64 = std::env::var("BOURSE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(KILLS_DEFAULT);
    let seed: u64 = std::env::var("BOURSE_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("kill test: {kills} kills, BOURSE_KILL_SEED={seed}");
    let time_limit = TEST_TIME_LIMIT.max(TIME_PER_KILL_LIMIT * kills as u32);
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let ports = bourse_testkit::free_ports::<3>();
    let config = write_loopback_config(
        &dir,
        42,
        "fsync = \"always\"\nheartbeat_ms = 50\nelection_timeout_ms_min = 150\n\
         election_timeout_ms_max = 300\nsnapshot_every_entries = 150\n\
         hash_checkpoint_every_entries = 50\nhash_check_interval_ms = 200\n\
         orders_max = 8192\naccounts_max = 1024",
        &ports,
    );
    let addrs: Vec<(u64, SocketAddr)> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}").parse().unwrap()))
        .collect();
    let mut children: Vec<Child> = (1..=3).map(|id| spawn_node(&dir, &config, id)).collect();

    let shared = Shared::new();
    let client = client_thread(shared.clone(), addrs.clone(), seed);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rng = Rng::new(seed);
    let mut to_leader = Histogram::<u64>::new_with_bounds(1, FAILOVER_US_MAX, 3).unwrap();
    let mut to_ack = Histogram::<u64>::new_with_bounds(1, FAILOVER_US_MAX, 3).unwrap();
    let mut moments = [0u64; 3];
    let mut snapshots_cut = 0usize;
    let mut checks = 0u64;
    // The leader elected by the previous failover, for a mid-election kill.
    let mut just_elected: Option<(u64, u64)> = None;
    let mut moment = Moment::MidBatch;
    for kill in 0..kills {
        assert!(
            started.elapsed() < time_limit,
            "out of time after {kill} kills (seed {seed})"
        );
        moments[moment as usize] += 1;
        let (leader_id, term) = match (moment, just_elected) {
            (Moment::MidElection, Some(elected)) => elected,
            _ => {
                // Under load for a while, so batches are in flight when the kill comes.
                std::thread::sleep(Duration::from_millis(100 + rng.below(400)));
                rt.block_on(async {
                    let limit = Instant::now() + FAILOVER_LIMIT;
                    loop {
                        let s = statuses(&addrs).await;
                        if let Some(l) = s.iter().flatten().find(|s| s.leader == Some(s.id)) {
                            return (l.id, l.term);
                        }
                        assert!(Instant::now() < limit, "no leader (seed {seed})");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            }
        };
        let index = (leader_id - 1) as usize;
        if moment == Moment::MidSnapshot {
            // Ask for a snapshot and kill while it is being built or written: the request is
            // on the wire, then a random delay of up to 1.5 ms.
            let addr = addrs[index].1;
            let delay_us = rng.below(1_500);
            rt.block_on(async {
                let mut conn = PeerConnection::new(addr);
                let call = conn.call(Request::Snapshot, Duration::from_millis(500));
                tokio::pin!(call);
                let _ = tokio::time::timeout(Duration::from_micros(delay_us), &mut call).await;
            });
        }
        let acked_at_kill = shared.acked.load(Ordering::SeqCst);
        children[index].kill().unwrap(); // SIGKILL
        children[index].wait().unwrap();
        let killed_at = Instant::now();
        if moment == Moment::MidSnapshot {
            snapshots_cut += temp_snapshots(&dir, leader_id);
        }
        let elected = rt.block_on(async {
            loop {
                let s = statuses(&addrs).await;
                if let Some(l) = s
                    .iter()
                    .flatten()
                    .find(|s| s.leader == Some(s.id) && s.id != leader_id && s.term > term)
                {
                    return (l.id, l.term);
                }
                assert!(
                    killed_at.elapsed() < FAILOVER_LIMIT,
                    "no new leader after killing node {leader_id} (kill {kill}, {moment:?}, \
                     seed {seed}; logs in {})",
                    dir.display()
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        to_leader
            .record((killed_at.elapsed().as_micros() as u64).clamp(1, FAILOVER_US_MAX))
            .unwrap();
        children[index] = spawn_node(&dir, &config, leader_id);
        just_elected = Some(elected);
        let check_now = (kill + 1) % CHECK_EVERY_KILLS == 0 && kill + 1 < kills;
        let next = match rng.below(4) {
            0 if !check_now && kill + 1 < kills => Moment::MidElection,
            1 => Moment::MidSnapshot,
            _ => Moment::MidBatch,
        };
        // The client's view: the next acknowledgement after the kill. A mid-election kill
        // comes before it; then this failover has no acknowledgement of its own.
        if next != Moment::MidElection {
            let limit = killed_at + FAILOVER_LIMIT;
            while shared.acked.load(Ordering::SeqCst) == acked_at_kill {
                assert!(
                    Instant::now() < limit,
                    "no acknowledgement after killing node {leader_id} (kill {kill}, seed \
                     {seed}; logs in {})",
                    dir.display()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            to_ack
                .record((killed_at.elapsed().as_micros() as u64).clamp(1, FAILOVER_US_MAX))
                .unwrap();
            just_elected = None;
        }
        moment = next;
        if check_now {
            pause_client(&shared, seed);
            let acked = shared.acked.load(Ordering::SeqCst);
            rt.block_on(check_replicas(&addrs, acked, seed, &dir));
            checks += 1;
            resume_client(&shared);
            just_elected = None;
        }
    }
    // Let the client run a little on the final configuration, then stop it.
    std::thread::sleep(Duration::from_millis(300));
    pause_client(&shared, seed);
    let acked = shared.acked.load(Ordering::SeqCst);
    let finals = rt.block_on(check_replicas(&addrs, acked, seed, &dir));
    checks += 1;
    shared.stop.store(true, Ordering::SeqCst);
    let (duplicates, timeouts) = client.join().expect("client thread");
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    println!(
        "kill test: {kills} kills ({} mid-batch, {} mid-snapshot with {snapshots_cut} snapshot \
         writes cut, {} mid-election), {acked} commands acknowledged ({duplicates} answered \
         from the idempotency table, {timeouts} client timeouts), {checks} consistency checks, \
         final state hash {:016x}, {:.1} s, seed {seed}",
        moments[0],
        moments[1],
        moments[2],
        finals[0].state_hash,
        started.elapsed().as_secs_f64()
    );
    println!(
        "kill test: failover, kill -> new leader reports itself: {}",
        summary(&to_leader)
    );
    println!(
        "kill test: failover, kill -> client's next acknowledgement: {}",
        summary(&to_ack)
    );
    assert!(acked > 0);
}
