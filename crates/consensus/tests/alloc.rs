// Its own binary, outside tests/it: its #[global_allocator] would become every test's there.
//! The core allocates nothing per entry in steady state: a round of a three-node group (a
//! batch proposed, replicated, acknowledged, committed and applied everywhere) costs the same
//! allocations whether the batch holds one entry or 256: one vector of entries per
//! AppendEntries message, nothing else. A counting global allocator watches this thread only.

use bourse_consensus::{Config, Core, HardState, LogId, MemStore, Message, Ready, Role};
use bourse_testkit::alloc::{count_allocations, CountingAllocator};
use bytes::Bytes;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

struct Group {
    cores: Vec<Core<MemStore>>,
    readies: Vec<Ready>,
    inbox: Vec<Message>,
    next: Vec<Message>,
    appends: u64,
}

impl Group {
    fn new() -> Group {
        let voters = vec![1, 2, 3];
        let cores = voters
            .iter()
            .map(|&id| {
                let mut config = Config::with_defaults(id, voters.clone());
                config.append_entries_max = 1024;
                config.log_kept_below_snapshot_entries = 512;
                Core::new(
                    config,
                    HardState::default(),
                    MemStore::new(),
                    LogId::default(),
                    id,
                )
            })
            .collect();
        Group {
            cores,
            readies: (0..3).map(|_| Ready::default()).collect(),
            inbox: Vec::with_capacity(64),
            next: Vec::with_capacity(64),
            appends: 0,
        }
    }

    fn pass(&mut self) -> bool {
        let mut busy = false;
        for i in 0..3 {
            self.cores[i].ready(&mut self.readies[i]);
            let ready = &mut self.readies[i];
            busy |= !ready.is_empty();
            self.next.append(&mut ready.messages);
            if let Some(log_id) = ready.sync_to {
                self.cores[i].persisted(log_id);
            }
        }
        std::mem::swap(&mut self.inbox, &mut self.next);
        for message in self.inbox.drain(..) {
            if matches!(message.body, bourse_consensus::Body::Append { .. }) {
                self.appends += 1;
            }
            let to = (message.to - 1) as usize;
            self.cores[to].step(message).expect("a member's message");
        }
        busy
    }

    fn round(&mut self, leader: usize, batch: usize, payload: &Bytes) {
        for _ in 0..batch {
            self.cores[leader]
                .propose(payload.clone())
                .expect("the leader takes it");
        }
        while self.pass() {}
        // Snapshots every round keep the logs (and so their buffers) at a steady length.
        for core in self.cores.iter_mut() {
            let applied = core.applied_index();
            core.snapshot_taken(applied);
        }
    }
}

#[test]
fn a_round_allocates_one_vector_per_append_whatever_its_batch() {
    let mut group = Group::new();
    let leader = loop {
        for core in group.cores.iter_mut() {
            core.tick();
        }
        while group.pass() {}
        if let Some(i) = group
            .cores
            .iter()
            .position(|c| c.soft_state().role == Role::Leader)
        {
            break i;
        }
    };
    // A payload already shared, so that cloning it only counts a reference.
    let payload = Bytes::from(vec![7u8; 100]);
    let _shared = payload.clone();
    let rounds = 200;
    for batch in [1, 16, 256] {
        // Warm up: buffers grow to their steady size (the logs to the 512 entries kept
        // below each snapshot, and a batch).
        for _ in 0..600 {
            group.round(leader, batch, &payload);
        }
        let appends_before = group.appends;
        let ((), allocations) = count_allocations(|| {
            for _ in 0..rounds {
                group.round(leader, batch, &payload);
            }
        });
        let appends = group.appends - appends_before;
        assert_eq!(
            appends,
            2 * rounds,
            "batch {batch}: one AppendEntries per follower per round"
        );
        assert_eq!(
            allocations, appends,
            "batch {batch}: {allocations} allocations in {rounds} rounds of {appends} AppendEntries"
        );
    }
}
