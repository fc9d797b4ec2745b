//! kill -9 under load: three `bourse node` processes, a client driving commands and recording
//! every acknowledgement, and the leader killed at random moments (mid-batch, mid-snapshot,
//! right after an election) and restarted, `BOURSE_KILLS` times (default 20; the documented
//! long run is `BOURSE_KILLS=1000`). At the end every acknowledged command is in the replicated
//! history exactly once (the engine's command counter equals the acknowledgements, since the
//! client sends one request at a time and retries it until answered) and all three replicas
//! have the same state hash. Prints failover time p50/p99 and the seed (`BOURSE_KILL_SEED`
//! replays the same kill moments).

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bourse_cluster::client::node_status;
use bourse_cluster::net::NodeStatus;
use bourse_cluster::tokio;
use bourse_cluster::{Client, ClientError};
use bourse_core::Command;
use bourse_engine::workload::{Flow, FlowConfig, Rng};

/// Kills in a CI run.
const KILLS_DEFAULT: u64 = 20;
/// The whole test must end within this (a hang is a failure, not a stuck CI job).
const TEST_TIME_LIMIT: Duration = Duration::from_secs(170);
/// The longest a failover may take before the test calls it lost.
const FAILOVER_LIMIT: Duration = Duration::from_secs(10);

fn free_ports() -> Vec<u16> {
    let l: Vec<TcpListener> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    l.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

fn write_config(dir: &Path, ports: &[u16]) -> std::path::PathBuf {
    let path = dir.join("cluster.toml");
    let mut f = std::fs::File::create(&path).unwrap();
    writeln!(
        f,
        "cluster_id = 42\ndata_dir = {:?}\nfsync = \"always\"\nheartbeat_ms = 50\n\
         election_timeout_ms_min = 150\nelection_timeout_ms_max = 300\n\
         snapshot_every_entries = 150\nhash_checkpoint_every_entries = 50\n\
         hash_check_interval_ms = 200\norders_max = 8192\naccounts_max = 1024",
        dir.join("data")
    )
    .unwrap();
    for (i, p) in ports.iter().enumerate() {
        writeln!(f, "[[nodes]]\nid = {}\naddr = \"127.0.0.1:{p}\"", i + 1).unwrap();
    }
    path
}

fn spawn(config: &Path, id: u64) -> Child {
    Process::new(env!("CARGO_BIN_EXE_bourse"))
        .args(["node", "--config"])
        .arg(config)
        .args(["--id", &id.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn bourse node")
}

async fn statuses(addrs: &[(u64, SocketAddr)]) -> Vec<Option<NodeStatus>> {
    let mut out = Vec::new();
    for (_, a) in addrs {
        out.push(node_status(*a, Duration::from_millis(300)).await.ok());
    }
    out
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
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
    let time_limit = if kills > KILLS_DEFAULT {
        Duration::from_secs(kills * 3)
    } else {
        TEST_TIME_LIMIT
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports();
    let config = write_config(dir.path(), &ports);
    let addrs: Vec<(u64, SocketAddr)> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}").parse().unwrap()))
        .collect();
    let mut children: Vec<Child> = (1..=3).map(|id| spawn(&config, id)).collect();

    // The client: one request at a time, each retried under the same key until answered.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let client_thread = {
        let stop = stop.clone();
        let acked = acked.clone();
        let addrs = addrs.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut flow_config = FlowConfig::exchange_core(seed);
                flow_config.accounts = 20;
                flow_config.live_orders_target = 100;
                let mut flow = Flow::new(flow_config);
                let mut client = Client::new(addrs, 1, 1);
                let mut commands: Vec<Command> = flow
                    .setup()
                    .into_iter()
                    .map(|b| Command::new(0, b))
                    .collect();
                commands.reverse();
                let mut duplicates = 0u64;
                let mut timeouts = 0u64;
                let mut ts_ns = 1u64;
                while !stop.load(Ordering::SeqCst) {
                    let command = commands
                        .pop()
                        .unwrap_or_else(|| Command::new(ts_ns, flow.next_command()));
                    ts_ns += 1;
                    loop {
                        match client.submit(&command, Duration::from_secs(5)).await {
                            Ok(ack) => {
                                duplicates += ack.duplicate as u64;
                                flow.observe(&ack.events);
                                acked.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            Err(ClientError::Timeout { .. }) => {
                                // Unanswered: it may or may not be applied; same key again.
                                timeouts += 1;
                                assert!(timeouts < 100, "the group stopped answering");
                            }
                            Err(e) => panic!("request refused: {e}"),
                        }
                    }
                }
                (duplicates, timeouts)
            })
        })
    };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rng = Rng::new(seed);
    let mut failovers = Vec::new();
    for kill in 0..kills {
        assert!(
            started.elapsed() < time_limit,
            "out of time after {kill} kills (seed {seed})"
        );
        // A random moment: mostly under load mid-batch, sometimes right after the election.
        let pause_ms = if rng.below(4) == 0 {
            rng.below(60)
        } else {
            100 + rng.below(500)
        };
        std::thread::sleep(Duration::from_millis(pause_ms));
        let leader = rt.block_on(async {
            let limit = Instant::now() + FAILOVER_LIMIT;
            loop {
                let s = statuses(&addrs).await;
                if let Some(l) = s.iter().flatten().find(|s| s.leader == Some(s.id)) {
                    return (l.id, l.term);
                }
                assert!(Instant::now() < limit, "no leader (seed {seed})");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let (leader_id, term) = leader;
        let index = (leader_id - 1) as usize;
        children[index].kill().unwrap(); // SIGKILL
        children[index].wait().unwrap();
        let killed_at = Instant::now();
        let failover = rt.block_on(async {
            loop {
                let s = statuses(&addrs).await;
                if s.iter()
                    .flatten()
                    .any(|s| s.leader == Some(s.id) && s.id != leader_id && s.term > term)
                {
                    return killed_at.elapsed();
                }
                assert!(
                    killed_at.elapsed() < FAILOVER_LIMIT,
                    "no new leader after killing node {leader_id} (kill {kill}, seed {seed})"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        failovers.push(failover);
        children[index] = spawn(&config, leader_id);
    }
    // Let the client run a little on the final configuration, then stop it.
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let (duplicates, timeouts) = client_thread.join().expect("client thread");
    let acked = acked.load(Ordering::SeqCst);

    let finals = rt.block_on(async {
        let limit = Instant::now() + Duration::from_secs(20);
        loop {
            let s = statuses(&addrs).await;
            let all: Vec<NodeStatus> = s.into_iter().flatten().collect();
            if all.len() == 3
                && all.iter().any(|s| s.leader == Some(s.id))
                && all.windows(2).all(|w| {
                    w[0].last_applied_index == w[1].last_applied_index
                        && w[0].last_applied_index == w[0].last_log_index
                })
            {
                return all;
            }
            assert!(
                Instant::now() < limit,
                "replicas did not converge: {all:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let mut sorted = failovers.clone();
    sorted.sort();
    println!(
        "kill test: {kills} kills, {acked} commands acknowledged ({duplicates} answered from the \
         idempotency table, {timeouts} client timeouts), failover p50 {:?} p99 {:?} max {:?}, \
         {:.1} s",
        percentile(&sorted, 0.5),
        percentile(&sorted, 0.99),
        sorted.last().unwrap(),
        started.elapsed().as_secs_f64()
    );
    for s in &finals {
        assert!(s.alarm.is_none(), "node {} raised {:?}", s.id, s.alarm);
        assert_eq!(
            s.state_hash, finals[0].state_hash,
            "replicas differ (seed {seed}): {finals:#?}"
        );
        assert_eq!(
            s.engine_commands, acked,
            "node {}: the history holds {} commands but {acked} were acknowledged (seed {seed})",
            s.id, s.engine_commands
        );
    }
    assert!(acked > 0);
}
