//! A node's replicated apply path with market data on, without sockets or threads, for
//! instruction counts (callgrind): N commands of the exchange-core order flow (three markets),
//! 64 client requests per log entry, applied to a replicated state that keeps the market data
//! numbering (`apply_side`: decode, engine, idempotency table, the one publisher, the
//! hand-off), and the node's market data thread's work on the same entries (`md_side`: take
//! the handed-off packets, stamp them, keep the replay history, send them, here to a sink that
//! drops them). Building the flow and the UDP sockets are left out.
//!
//! ```text
//! cargo build --release -p bourse-cluster --example md_apply_profile
//! valgrind --tool=callgrind --toggle-collect='*md_apply_profile::apply_side*' \
//!     target/release/examples/md_apply_profile 200000 leader
//! valgrind --tool=callgrind --toggle-collect='*md_apply_profile::md_side*' \
//!     target/release/examples/md_apply_profile 200000 leader
//! ```
//!
//! Instructions per command = the collected total over N. `leader` sends (to the sink);
//! `follower` is a standby feed (keeps the replay history, sends nothing). Counts do not
//! depend on the machine's load.

use bourse_cluster::marketdata::{NodeFeed, PacketHandoff};
use bourse_cluster::{Batch, ClientRequest, CommittedRequest, ReplicatedState};
use bourse_core::Command;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::EngineConfig;
use bourse_marketdata::{Channel, PacketSink, PublisherConfig};

/// Requests per log entry, as `bourse bench recovery`'s default batch.
const BATCH: usize = 64;

/// A sink that counts what it is given and sends nothing.
#[derive(Default)]
struct CountingSink {
    packets: u64,
    bytes: u64,
}

impl PacketSink for CountingSink {
    fn send(&mut self, _channel: Channel, packet: &[u8]) {
        self.packets += 1;
        self.bytes += packet.len() as u64;
    }
}

#[inline(never)]
fn apply_side(
    state: &mut ReplicatedState,
    batch: &Batch,
    index: u64,
    out: &mut Vec<CommittedRequest>,
) {
    state.apply_batch(batch, index, out);
    state.entry_applied(index);
}

#[inline(never)]
fn md_side(feed: &mut NodeFeed, sink: &mut CountingSink) {
    feed.drain(1, sink);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let commands: usize = args
        .next()
        .map(|a| a.parse().expect("N: a number of commands"))
        .unwrap_or(200_000);
    let leader = match args.next().as_deref() {
        None | Some("leader") => true,
        Some("follower") => false,
        Some(other) => panic!("{other:?}: leader or follower"),
    };
    let config = PublisherConfig::default();
    let mut state = ReplicatedState::new(EngineConfig::default(), 1_000);
    state.enable_marketdata(&config);
    let handoff = PacketHandoff::new();
    state
        .marketdata_mut()
        .expect("numbering on")
        .attach(handoff.clone());
    let mut feed = NodeFeed::new(config, handoff, None);
    feed.set_leader(leader);
    let mut sink = CountingSink::default();
    let mut flow = Flow::new(FlowConfig::three_markets(1_000, 7));
    let mut out = Vec::with_capacity(BATCH);
    let mut index = 0u64;
    let mut ts = 1_000_000_000u64;
    let mut seq = 0u64;
    let mut entry = |requests: Vec<ClientRequest>, flow: &mut Flow| {
        index += 1;
        out.clear();
        apply_side(
            &mut state,
            &Batch::from_requests(&requests),
            index,
            &mut out,
        );
        md_side(&mut feed, &mut sink);
        for o in &out {
            flow.observe(&bourse_core::codec::decode_events(&o.events).expect("events decode"));
        }
    };
    let setup: Vec<ClientRequest> = flow
        .setup()
        .into_iter()
        .enumerate()
        .map(|(k, body)| ClientRequest {
            client_id: 1,
            request_seq: k as u64 + 1,
            command: Command::new(ts, body),
        })
        .collect();
    entry(setup, &mut flow);
    let mut done = 0;
    while done < commands {
        let n = BATCH.min(commands - done);
        let requests = (0..n)
            .map(|_| {
                ts += 1_000;
                seq += 1;
                ClientRequest {
                    client_id: 2,
                    request_seq: seq,
                    command: Command::new(ts, flow.next_command()),
                }
            })
            .collect();
        entry(requests, &mut flow);
        done += n;
    }
    let s = feed.status();
    println!(
        "{commands} commands in {} entries; packets {} sent, {} bytes to the sink; next MsgSeqNum {:?}; lost {}",
        s.next_index - 1,
        sink.packets,
        sink.bytes,
        s.next_seq,
        s.lost_packets
    );
}
