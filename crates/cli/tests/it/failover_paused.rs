//! A paused leader (SIGSTOP) keeps its connections open and answers nothing, so a client
//! waiting on it learns nothing from its socket. Three `bourse node` processes on loopback;
//! the leader is paused while clients wait on it:
//!
//! - the sequential client, with an attempt timeout far beyond the test's hang guard, can
//!   only move on by asking the other nodes who leads (`LEADER_PROBE_AFTER_MS`): it must be
//!   answered by the newly elected leader, having switched by a probe, and read each
//!   request's events from the committed stream though it read that from the paused node;
//! - the pipelined client (the gateway's and the admin's) must have every request of its
//!   window answered, those queued after the pause by another node.
//!
//! "Paused" means every thread of the node has stopped (`replica_check::pause_process` waits
//! for that): `kill -STOP` returns before the signal takes effect, and on a loaded machine the
//! node's threads went on long enough to commit and answer the next request, in the term it
//! led (session 17: 5 of 24 runs). Such an answer is legitimate; one after the node has stopped
//! would be a defect, and this test fails on it.
//!
//! Afterwards the paused node resumes and every replica must hold exactly the acknowledged
//! commands, with equal state hashes. Nothing here asserts how fast: the hang guards are
//! generous; the failover times are BENCHMARKS.md's and the namespace bed's.

use crate::replica_check;

use std::time::Duration;

use bourse_cluster::client::{Answer, PipelinedClient};
use bourse_cluster::tokio;
use bourse_cluster::Client;
use bourse_core::Command;
use bourse_engine::workload::{Flow, FlowConfig};
use replica_check::{check_replicas, leader, loopback_addrs, write_loopback_config, NodeProcesses};

/// Commands each client sends before and after the pause.
const COMMANDS_PER_PHASE: usize = 30;
/// The sequential client's attempt timeout: beyond every hang guard, so only a leader probe
/// can take it off the paused leader.
const ATTEMPT_TIMEOUT_NEVER_MS: u64 = 600_000;
/// The hang guard of one request, and of the pipelined client's whole window.
const ANSWER_LIMIT: Duration = Duration::from_secs(120);
const SEED: u64 = 5;

/// Node `id` paused: returns once it runs no code at all.
fn pause(nodes: &NodeProcesses, id: u64) {
    let running = nodes.pause(id);
    println!("node {id}: a thread still ran {running:?} after kill -STOP returned");
}

/// Commands that set up a small market, then its order flow (not observed: cancels of
/// orders that are not there are refused by the engine, and still count as commands).
fn commands(n: usize) -> Vec<Command> {
    let mut config = FlowConfig::exchange_core(SEED);
    config.accounts = 10;
    config.live_orders_target = 50;
    let mut flow = Flow::new(config);
    let mut out: Vec<Command> = flow
        .setup()
        .into_iter()
        .map(|b| Command::new(0, b))
        .collect();
    let mut ts_ns = 1;
    while out.len() < n {
        out.push(Command::new(ts_ns, flow.next_command()));
        ts_ns += 1;
    }
    out
}

/// The pipelined client's next answer, within the hang guard.
async fn answer(client: &mut PipelinedClient, limit: tokio::time::Instant) -> Answer {
    tokio::time::timeout_at(limit, client.next_answer())
        .await
        .expect("the pipelined client's window was not answered in time")
        .expect("pipelined client stopped")
}

#[test]
fn clients_waiting_on_a_paused_leader_move_to_the_new_one_and_nothing_is_lost() {
    // Kept when the test fails (the messages name it for the nodes' logs); removed at the
    // end of a run that passes.
    let dir = tempfile::tempdir().unwrap().keep();
    let ports = bourse_testkit::free_ports::<3>();
    let config = write_loopback_config(
        &dir,
        44,
        "fsync = \"never\"\nheartbeat_ms = 50\nelection_timeout_ms_min = 150\n\
         election_timeout_ms_max = 300\norders_max = 8192\naccounts_max = 1024",
        &ports,
    );
    let addrs = loopback_addrs(&ports);
    let nodes = NodeProcesses::start(&dir, &config, 3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let logs = dir.display().to_string();
    let all = commands(4 * COMMANDS_PER_PHASE);
    let mut acked = 0u64;

    // The sequential client.
    rt.block_on(async {
        let mut client = Client::new(addrs.clone(), 1, 1);
        client.set_attempt_timeout_ms(ATTEMPT_TIMEOUT_NEVER_MS);
        let mut before = 0;
        for c in &all[..COMMANDS_PER_PHASE] {
            let (ack, _events) = client.submit_for_events(c, ANSWER_LIMIT).await.unwrap();
            before = ack.leader;
            acked += 1;
        }
        // The node the client talks to, leader or not (an election may have moved the lead
        // meanwhile): paused, it answers nothing, and another node leads or soon will.
        let paused = before;
        pause(&nodes, paused);
        for (k, c) in all[COMMANDS_PER_PHASE..2 * COMMANDS_PER_PHASE]
            .iter()
            .enumerate()
        {
            // With its events: the client read the stream from the paused node, and must
            // read on from the node that answered.
            let (ack, _events) = client
                .submit_for_events(c, ANSWER_LIMIT)
                .await
                .unwrap_or_else(|e| panic!("request {k} after the pause: {e} (logs in {logs})"));
            assert_ne!(
                ack.leader,
                paused,
                "request {k} after the pause answered by the paused node: {ack:?}, {} probe \
                 switches (logs in {logs})",
                client.leader_probe_switches()
            );
            acked += 1;
        }
        assert!(
            client.leader_probe_switches() >= 1,
            "the client left the paused leader without a probe"
        );
        nodes.resume(paused);
    });

    // The pipelined client, on whichever node leads now.
    rt.block_on(async {
        let mut client = PipelinedClient::start(addrs.clone(), 2, 1, 64);
        let limit = tokio::time::Instant::now() + ANSWER_LIMIT;
        for c in &all[2 * COMMANDS_PER_PHASE..3 * COMMANDS_PER_PHASE] {
            client.submit(c).await.unwrap();
        }
        for _ in 0..COMMANDS_PER_PHASE {
            answer(&mut client, limit).await;
            acked += 1;
        }
        let paused = leader(&addrs, SEED).await;
        pause(&nodes, paused);
        for c in &all[3 * COMMANDS_PER_PHASE..] {
            client.submit(c).await.unwrap();
        }
        for _ in 0..COMMANDS_PER_PHASE {
            let a = answer(&mut client, limit).await;
            assert_ne!(a.node, paused, "answered by the paused node");
            acked += 1;
        }
        println!(
            "pipelined client: {} leader probe switches, {} requests re-sent",
            client.health().leader_probe_switches(),
            client.health().resent()
        );
        nodes.resume(paused);
    });

    rt.block_on(check_replicas(&addrs, acked, SEED, &dir));
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}
