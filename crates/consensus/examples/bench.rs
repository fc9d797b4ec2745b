//! The core's own cost: three cores in one thread exchanging messages in memory, the leader
//! proposing entries in batches, every sync completing at once. One round is: propose a
//! batch, then pass `Ready`s and messages around until the batch is committed on the leader
//! and applied on every node. Prints ns per committed entry and the distribution of a
//! round's time (hdrhistogram), with and without the codec on every message.
//!
//! ```sh
//! cargo run --release -p bourse-consensus --example bench -- [--entries N] [--payload-bytes B]
//! ```

use std::time::Instant;

use bourse_consensus::codec::{self, DecodeLimits};
use bourse_consensus::{Config, Core, HardState, LogId, MemStore, Message, Ready, Role};
use bytes::Bytes;
use hdrhistogram::Histogram;

struct Group {
    cores: Vec<Core<MemStore>>,
    readies: Vec<Ready>,
    inbox: Vec<Message>,
    next: Vec<Message>,
    applied: Vec<u64>,
    codec: bool,
    limits: DecodeLimits,
    buf: Vec<u8>,
    messages: u64,
}

impl Group {
    fn new(codec: bool) -> Group {
        let voters = vec![1, 2, 3];
        let cores: Vec<_> = voters
            .iter()
            .map(|&id| {
                let mut config = Config::with_defaults(id, voters.clone());
                // Whole batches in one message, as the venue's batcher makes them.
                config.append_entries_max = 1024;
                config.uncommitted_entries_max = 1 << 16;
                config.apply_entries_max = 1 << 16;
                config.log_kept_below_snapshot_entries = 1024;
                Core::new(
                    config,
                    HardState::default(),
                    MemStore::new(),
                    LogId::default(),
                    id,
                )
            })
            .collect();
        let limits = DecodeLimits::for_config(cores[0].config(), 1024);
        Group {
            cores,
            readies: (0..3).map(|_| Ready::default()).collect(),
            inbox: Vec::with_capacity(64),
            next: Vec::with_capacity(64),
            applied: vec![0; 3],
            codec,
            limits,
            buf: Vec::with_capacity(1 << 20),
            messages: 0,
        }
    }

    /// One pass: every node's ready handled (syncs complete at once), then every message
    /// delivered. Returns whether anything happened.
    fn pass(&mut self) -> bool {
        let mut busy = false;
        for i in 0..3 {
            let ready = &mut self.readies[i];
            self.cores[i].ready(ready);
            busy |= !ready.is_empty();
            self.next.append(&mut ready.messages);
            if let Some(log_id) = ready.sync_to {
                self.cores[i].persisted(log_id);
            }
            self.applied[i] += ready.committed.len() as u64;
        }
        std::mem::swap(&mut self.inbox, &mut self.next);
        for message in self.inbox.drain(..) {
            self.messages += 1;
            let to = (message.to - 1) as usize;
            let message = if self.codec {
                self.buf.clear();
                codec::encode(&message, &mut self.buf);
                codec::decode(&Bytes::copy_from_slice(&self.buf), &self.limits).expect("decodes")
            } else {
                message
            };
            self.cores[to].step(message).expect("a member's message");
        }
        busy
    }

    fn elect(&mut self) -> usize {
        loop {
            for core in self.cores.iter_mut() {
                core.tick();
            }
            while self.pass() {}
            if let Some(i) = self
                .cores
                .iter()
                .position(|c| c.soft_state().role == Role::Leader)
            {
                // Let the blank entry commit everywhere.
                for _ in 0..100 {
                    for core in self.cores.iter_mut() {
                        core.tick();
                    }
                    while self.pass() {}
                }
                return i;
            }
        }
    }
}

fn run(entries: u64, batch: u64, payload_bytes: usize, codec: bool) {
    let mut group = Group::new(codec);
    let leader = group.elect();
    let payload = Bytes::from(vec![7u8; payload_bytes]);
    let mut rounds =
        Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("histogram bounds");
    let base: Vec<u64> = group.applied.clone();
    let messages_before = group.messages;
    let started = Instant::now();
    let mut proposed = 0;
    let mut snapshots = 0;
    while proposed < entries {
        let round_started = Instant::now();
        for _ in 0..batch {
            group.cores[leader]
                .propose(payload.clone())
                .expect("the leader takes it");
        }
        proposed += batch;
        let target = base[leader] + proposed;
        while group
            .applied
            .iter()
            .zip(&base)
            .any(|(a, b)| a - b < proposed)
        {
            group.pass();
        }
        let ns = round_started.elapsed().as_nanos() as u64;
        rounds.record(ns.max(1)).expect("in bounds");
        // Compact now and then, as the venue's snapshots do, so the logs stay bounded.
        if proposed % 65_536 < batch {
            for core in group.cores.iter_mut() {
                let applied = core.applied_index();
                core.snapshot_taken(applied);
            }
            snapshots += 1;
        }
        debug_assert!(group.cores[leader].commit_index() >= target);
    }
    let total_ns = started.elapsed().as_nanos() as f64;
    let rounds_count = rounds.len();
    println!(
        "batch {batch:>4}  codec {:<3}  {:>8.0} ns/entry  round p50 {:>7} p99 {:>7} p99.9 {:>7} max {:>8} ns  messages/round {:>4.1}  ({} rounds, {} compactions)",
        if codec { "yes" } else { "no" },
        total_ns / entries as f64,
        rounds.value_at_quantile(0.50),
        rounds.value_at_quantile(0.99),
        rounds.value_at_quantile(0.999),
        rounds.max(),
        (group.messages - messages_before) as f64 / rounds_count as f64,
        rounds_count,
        snapshots,
    );
}

fn main() {
    let mut entries: u64 = 1_000_000;
    let mut payload_bytes = 100;
    let mut batches = vec![1, 16, 64, 256];
    let mut codecs = vec![false, true];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--entries" => {
                entries = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--entries N")
            }
            "--payload-bytes" => {
                payload_bytes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--payload-bytes B")
            }
            // One configuration alone, e.g. under `valgrind --tool=callgrind` to count
            // instructions (the difference of two entry counts, divided, is per entry).
            "--batch" => {
                batches = vec![args.next().and_then(|v| v.parse().ok()).expect("--batch B")]
            }
            "--codec" => {
                codecs = match args.next().as_deref() {
                    Some("on") => vec![true],
                    Some("off") => vec![false],
                    _ => panic!("--codec on|off"),
                }
            }
            other => panic!("unknown argument {other}"),
        }
    }
    println!("three cores, one thread, {entries} entries of {payload_bytes} bytes, syncs complete at once");
    let single = batches.len() == 1;
    for &codec in &codecs {
        for &batch in &batches {
            // Fewer entries for batch 1, whose rounds dominate the run time.
            let n = if batch == 1 && !single {
                entries / 4
            } else {
                entries
            };
            run(n - n % batch, batch, payload_bytes, codec);
        }
    }
}
