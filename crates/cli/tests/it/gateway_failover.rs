//! Failover as a client sees it through a gateway (issue 21's failover goals): three
//! `bourse node` processes on loopback, a gateway in front of them started as `bourse gateway`
//! starts it (a `ClusterLink` with this run's epoch), and a FIX client on loopback sending one
//! new order every `PACE_MS` whatever happens. The faults, in turn:
//!
//! - **leader killed** (SIGKILL; restarted afterwards);
//! - **leader paused** (SIGSTOP until every thread stopped; continued afterwards);
//! - **no quorum**: both followers paused, then continued.
//!
//! What must hold, asserted: after a leader's loss the client's orders are acknowledged again;
//! without a quorum the gateway refuses new orders with its specific reason ("trading core has
//! no quorum"), acknowledges nothing sent after the fault, and re-sends nothing in a loop (the
//! link re-sends no more requests than it sends probes, one at a time); once the followers
//! return, everything taken is acknowledged; at the end every order the core answered is in
//! every replica's history once (the engine's command counter is the bootstrap's commands plus
//! those orders) with equal state hashes.
//!
//! What is measured, printed and never asserted (HDR p50/p99/max per kind of fault): from the
//! moment the fault took effect (the process dead or stopped) to the first acknowledgement of
//! an order the client sent after it; for no quorum, to the first refusal reaching the
//! client, and from the followers' return to the first acknowledgement. Faults per kind:
//! `BOURSE_GATEWAY_FAULTS` (default 2; BENCHMARKS.md's run uses 30). The gateway runs in the
//! test's process so that its link's counters (re-sends, probes, resubscriptions) can be
//! read; the nodes are processes of their own, so a fault never touches the gateway.

use crate::fix_orders;
use crate::replica_check;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bourse_cluster::client::PipelineHealth;
use bourse_cluster::link::{ClusterLink, ClusterLinkConfig, ClusterLinkWatch};
use bourse_cluster::tokio;
use bourse_gateway::metrics::metric_names;
use bourse_gateway::recovery::Recovery;
use bourse_gateway::{CoreLink, GatewayConfig, GatewayHandle};
use fix_orders::{fix_client_thread, FixOrders, OrderSpec, Outcome};
use hdrhistogram::Histogram;
use replica_check::{
    check_replicas, leader, loopback_addrs, statuses, summary, write_loopback_config,
    NodeProcesses, FAILOVER_LIMIT,
};

/// The client sends one new order this often.
const PACE_MS: u64 = 10;
/// Faults of each kind unless `BOURSE_GATEWAY_FAULTS` says otherwise.
const FAULTS_PER_KIND_DEFAULT: usize = 2;
/// Probes the link must send while the quorum is lost before the re-sends are compared.
const NO_QUORUM_PROBES: u64 = 3;
/// Histogram bound (µs); slower failovers are clamped.
const FAILOVER_US_MAX: u64 = 60_000_000;
const SEED: u64 = 21;

/// The gateway's configuration; the core's nodes are added after.
const GATEWAY: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"
binary_listen = "127.0.0.1:0"
connections_max = 16
monitor_listen = "127.0.0.1:0"
throttle_msgs_per_s = 1000
logon_timeout_ms = 5000
core_queue_depth = 4096

[core]
bootstrap = true

[[instruments]]
instrument = 1
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 10
band_bps = 2000
reference_price = 25000

[[accounts]]
account = 101
firm = 1
cash = 1000000000000000
may_short = true

[[fix_sessions]]
client_comp_id = "ALPHA"
firm = 1
accounts = [101]
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    LeaderKilled,
    LeaderPaused,
    NoQuorum,
}

/// Waits until `f` gives a value, within the hang guard.
/// The value of the gateway's `/metrics` series `name{core="equities"}`, if it is there.
fn link_metric(gateway: &GatewayHandle, name: &str) -> Option<u64> {
    let text = gateway.monitor().expect("monitor_listen").render_metrics();
    let key = format!("{name}{{core=\"equities\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|v| v.trim().parse::<f64>().unwrap() as u64)
}

/// Every order: a buy of 10 SBER at 240.00 for account 101 (they rest: nothing sells).
fn buy_order(_: usize) -> OrderSpec {
    OrderSpec {
        account: 101,
        buy: true,
        symbol: "SBER",
        qty: 10,
        price: "240.00",
    }
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Once every node answers, agrees on the leader of the highest term and has applied at least
/// what the leader had when asked first: the group is whole again.
fn wait_whole(rt: &tokio::runtime::Runtime, addrs: &[(u64, SocketAddr)]) {
    let target = rt.block_on(async {
        let l = leader(addrs, SEED).await;
        let s = statuses(addrs).await;
        s[(l - 1) as usize]
            .as_ref()
            .and_then(|s| s.last_applied_index)
            .unwrap_or(0)
    });
    wait_for("the group whole again", FAILOVER_LIMIT, || {
        let s = rt.block_on(statuses(addrs));
        let all: Vec<_> = s.into_iter().flatten().collect();
        (all.len() == 3
            && all
                .iter()
                .all(|s| s.leader.is_some() && s.leader == all[0].leader)
            && all
                .iter()
                .all(|s| s.last_applied_index.unwrap_or(0) >= target))
        .then_some(())
    });
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, FAILOVER_US_MAX, 3).unwrap()
}

#[test]
fn through_a_gateway_orders_are_acknowledged_again_after_a_leader_loss_and_refused_without_a_quorum(
) {
    let per_kind: usize = std::env::var("BOURSE_GATEWAY_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(FAULTS_PER_KIND_DEFAULT);
    let dir = tempfile::tempdir().unwrap().keep();
    let ports = bourse_testkit::free_ports::<3>();
    let config = write_loopback_config(
        &dir,
        46,
        "fsync = \"never\"\nheartbeat_ms = 50\nelection_timeout_ms_min = 150\n\
         election_timeout_ms_max = 300\norders_max = 65536\naccounts_max = 1024",
        &ports,
    );
    let addrs = loopback_addrs(&ports);
    let mut nodes = NodeProcesses::start(&dir, &config, 3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(leader(&addrs, SEED));

    // The gateway, as `bourse gateway` starts it in front of a replicated core.
    let node_list: Vec<String> = addrs.iter().map(|(_, a)| format!("\"{a}\"")).collect();
    let text = format!(
        "{GATEWAY}\n[[cores]]\nname = \"equities\"\ninstruments = [1]\nnodes = [{}]\n\
         client_id = 7\n",
        node_list.join(", ")
    );
    let mut gateway_config = GatewayConfig::from_toml(&text).unwrap();
    gateway_config.gateway.store_dir = dir.join("gateway");
    let recovery = Recovery::open(&gateway_config).unwrap();
    let plan = gateway_config.core_plan();
    let core = &plan[0];
    let link = ClusterLink::start(ClusterLinkConfig {
        from_index: recovery.resume_index(0),
        ..ClusterLinkConfig::new(
            core.nodes.clone(),
            recovery.link_client_id(core.client_id.unwrap()),
            gateway_config.gateway.core_queue_depth,
        )
    })
    .unwrap();
    let health: Arc<PipelineHealth> = link.health();
    let watch: ClusterLinkWatch = link.watch();
    let links: Vec<Box<dyn CoreLink>> = vec![Box::new(link)];
    let gateway = bourse_gateway::spawn_cores(gateway_config, links, None).unwrap();
    let fix = gateway.fix_addr().unwrap();

    // The bootstrap's commands, counted once the replicas agree.
    let base = wait_for(
        "the replicas to agree after the bootstrap",
        FAILOVER_LIMIT,
        || {
            let s = rt.block_on(statuses(&addrs));
            let all: Vec<_> = s.into_iter().flatten().collect();
            (all.len() == 3
                && all.windows(2).all(|w| {
                    w[0].last_applied_index == w[1].last_applied_index
                        && w[0].engine_commands == w[1].engine_commands
                }))
            .then(|| all[0].engine_commands)
        },
    );

    let shared = FixOrders::new(Instant::now());
    let client = fix_client_thread(
        shared.clone(),
        fix,
        "ALPHA",
        Duration::from_millis(PACE_MS),
        buy_order,
    );
    let started_us = shared.now_us();
    wait_for("the first acknowledgement", FAILOVER_LIMIT, || {
        shared.first_answer_after(started_us, &|o| *o == Outcome::Applied)
    });

    let kinds = [Fault::LeaderKilled, Fault::LeaderPaused, Fault::NoQuorum];
    let mut resumed: Vec<Histogram<u64>> = kinds.iter().map(|_| histogram()).collect();
    let mut refused = histogram();
    let mut after_heal = histogram();
    let mut resent_by_kind = [0u64; 3];
    for round in 0..per_kind * kinds.len() {
        let k = round % kinds.len();
        let fault = kinds[k];
        let l = rt.block_on(leader(&addrs, SEED));
        let followers: Vec<u64> = (1..=3).filter(|&id| id != l).collect();
        let resent_before = health.resent();
        let probes_before = health.probes();
        let fault_us = match fault {
            Fault::LeaderKilled => {
                nodes.kill(l);
                shared.now_us()
            }
            Fault::LeaderPaused => {
                nodes.pause(l);
                shared.now_us()
            }
            Fault::NoQuorum => {
                for &f in &followers {
                    nodes.pause(f);
                }
                shared.now_us()
            }
        };
        match fault {
            Fault::LeaderKilled | Fault::LeaderPaused => {
                let at = wait_for(
                    &format!("an acknowledgement after {fault:?} (round {round}, logs in {dir:?})"),
                    FAILOVER_LIMIT,
                    || shared.first_answer_after(fault_us, &|o| *o == Outcome::Applied),
                );
                resumed[k].saturating_record(at - fault_us);
                // While no node leads, the link tries one node after another with one request
                // at a time: the window goes again only to a node that applies requests, so
                // each order still unanswered at the fault or sent since is re-sent at most
                // twice (to that node, and after a later switch to a named leader), besides
                // the probes. The counters are read before the orders, which only grow.
                let (resent, probes) = (
                    health.resent() - resent_before,
                    health.probes() - probes_before,
                );
                let window = shared
                    .orders
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|o| o.answer.as_ref().is_none_or(|(at, _)| *at >= fault_us))
                    .count() as u64;
                assert!(
                    resent <= probes + 2 * window,
                    "{resent} re-sent after {fault:?} with {window} orders in flight and \
                     {probes} probes: the window was re-sent in a loop"
                );
                if fault == Fault::LeaderKilled {
                    nodes.restart(&dir, &config, l);
                } else {
                    nodes.resume(l);
                }
            }
            Fault::NoQuorum => {
                let refused_at = wait_for(
                    &format!("a no-quorum refusal (round {round}, logs in {dir:?})"),
                    FAILOVER_LIMIT,
                    || shared.first_answer_after(fault_us, &|o| *o == Outcome::NoQuorum),
                );
                refused.saturating_record(refused_at - fault_us);
                // While it lasts the link holds what it took and probes with one request at
                // a time: no more re-sends than probes.
                let (resent, probes) = (health.resent(), health.probes());
                wait_for(
                    "the link's probes while the quorum is lost",
                    FAILOVER_LIMIT,
                    || (health.probes() >= probes + NO_QUORUM_PROBES).then_some(()),
                );
                let resent_during = health.resent() - resent;
                let probed_during = health.probes() - probes;
                assert!(
                    resent_during <= probed_during,
                    "{resent_during} re-sent for {probed_during} probes without a quorum"
                );
                // Nothing sent after the fault was acknowledged without a quorum.
                let heal_us = shared.now_us();
                {
                    let orders = shared.orders.lock().unwrap();
                    let start = orders.partition_point(|o| o.sent_us < fault_us);
                    for (i, o) in orders[start..].iter().enumerate() {
                        if let Some((at, Outcome::Applied)) = o.answer {
                            assert!(
                                at >= heal_us,
                                "order {} sent after the quorum was lost acknowledged before \
                                 it returned",
                                start + i + 1
                            );
                        }
                    }
                }
                // The operator sees it on the gateway's /metrics.
                wait_for(
                    "the core without a quorum on the gateway's /metrics",
                    FAILOVER_LIMIT,
                    || {
                        (link_metric(&gateway, metric_names::LINK_NO_QUORUM) == Some(1))
                            .then_some(())
                    },
                );
                for &f in &followers {
                    nodes.resume(f);
                }
                let at = wait_for(
                    &format!("an acknowledgement after the quorum returned (round {round})"),
                    FAILOVER_LIMIT,
                    || shared.first_answer_after(heal_us, &|o| *o == Outcome::Applied),
                );
                after_heal.saturating_record(at - heal_us);
            }
        }
        resent_by_kind[k] += health.resent() - resent_before;
        wait_whole(&rt, &addrs);
        // The link is past the fault: an order sent now is acknowledged.
        let now = shared.now_us();
        wait_for(
            &format!("an acknowledgement after round {round}"),
            FAILOVER_LIMIT,
            || shared.first_answer_after(now, &|o| *o == Outcome::Applied),
        );
    }

    // Every order answered; the refused ones never reached the core.
    shared.sending.store(false, Ordering::SeqCst);
    wait_for("every order answered", FAILOVER_LIMIT * 2, || {
        shared.all_answered().then_some(())
    });
    shared.stop.store(true, Ordering::SeqCst);
    client.join().expect("the FIX client");
    let other = shared.count(&|o| matches!(o, Outcome::Refused(_)));
    assert_eq!(other, 0, "orders refused for another reason than no quorum");
    let acknowledged = shared.applied();
    rt.block_on(check_replicas(&addrs, base + acknowledged, SEED, &dir));

    // The gateway's /metrics carry the link's own counts (published on the gateway's 20 ms
    // tick: the link is idle now, so they stop moving) and the quorum back.
    let link_status = watch.status();
    for (name, want) in [
        (metric_names::LINK_REQUESTS_RESENT_TOTAL, health.resent()),
        (metric_names::LINK_PROBES_TOTAL, health.probes()),
        (
            metric_names::LINK_NODE_SWITCHES_TOTAL,
            health.node_switches(),
        ),
        (
            metric_names::LINK_LEADER_PROBE_SWITCHES_TOTAL,
            health.leader_probe_switches(),
        ),
        (
            metric_names::LINK_STREAM_RESUBSCRIPTIONS_TOTAL,
            link_status.resubscriptions,
        ),
        (metric_names::LINK_REQUESTS_PENDING, 0),
        (metric_names::LINK_NO_QUORUM, 0),
    ] {
        wait_for(
            &format!("{name} {want} on the gateway's /metrics"),
            FAILOVER_LIMIT,
            || (link_metric(&gateway, name) == Some(want)).then_some(()),
        );
    }
    // A leader was lost (killed or paused) in two rounds of three, and acknowledgements
    // resumed after each: the link moved its requests to another node at least that often.
    let leader_losses = (per_kind * 2) as u64;
    assert!(
        health.node_switches() >= leader_losses,
        "{} node switches for {leader_losses} leader losses",
        health.node_switches()
    );
    let sent = shared.orders.lock().unwrap().len();
    println!(
        "through a gateway: {} orders sent, {acknowledged} acknowledged, {} refused (no quorum); \
         link: {} re-sent, {} probes, {} node switches, {} leader probe switches, {} stream \
         resubscriptions",
        sent,
        shared.count(&|o| *o == Outcome::NoQuorum),
        health.resent(),
        health.probes(),
        health.node_switches(),
        health.leader_probe_switches(),
        link_status.resubscriptions
    );
    for (k, fault) in kinds.iter().enumerate().take(2) {
        println!(
            "{fault:?}: fault -> next acknowledgement {}; link re-sent {}",
            summary(&resumed[k]),
            resent_by_kind[k]
        );
    }
    println!(
        "NoQuorum: fault -> refusal at the client {}; link re-sent {}",
        summary(&refused),
        resent_by_kind[2]
    );
    println!(
        "NoQuorum: followers back -> next acknowledgement {}",
        summary(&after_heal)
    );
    gateway.shutdown();
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}
