//! openraft's storage traits over the journal and the snapshot store: what is appended reads
//! back after a reopen, truncation and purge keep the log consistent, the vote survives, a
//! snapshot restores the same state hash, and a hash entry that disagrees takes the node out.

use std::sync::{Arc, Mutex};

use bourse_cluster::batch::{ClientRequest, LogCommand};
use bourse_cluster::{Entry, LogId, LogStore, StateMachineStore, Vote};
use bourse_core::{AccountId, AccountSpec, Command, CommandBody, FirmId, StpMode, StpScope};
use bourse_engine::EngineConfig;
use bourse_journal::{Config, Fsync, Journal, SnapshotStore};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{EntryPayload, RaftLogReader, RaftSnapshotBuilder};

fn engine_config() -> EngineConfig {
    EngineConfig {
        orders_max: 1024,
        instruments_max: 16,
        accounts_max: 1024,
        levels_per_side_hint: 8,
        first_order_id: 1,
    }
}

fn entry(term: u64, index: u64, command: LogCommand) -> Entry {
    Entry {
        log_id: LogId::new_term_index(term, index),
        payload: EntryPayload::Normal(command),
    }
}

/// Applies `entries` as openraft hands them over (a stream, no client waiting on any).
async fn apply(sm: &mut StateMachineStore, entries: Vec<Entry>) -> std::io::Result<()> {
    let stream = futures_util::stream::iter(entries.into_iter().map(|e| Ok((e, None))));
    sm.apply(stream).await
}

fn add_account(seq: u64) -> LogCommand {
    LogCommand::batch(&[ClientRequest {
        client_id: 1,
        request_seq: seq,
        command: Command::new(
            seq,
            CommandBody::AddAccount(AccountSpec {
                account: AccountId(seq as u32),
                firm: FirmId(1),
                may_short: false,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            }),
        ),
    }])
}

fn open_log(dir: &std::path::Path) -> LogStore {
    let mut config = Config::new(5, 1);
    config.fsync = Fsync::Never;
    LogStore::new(Journal::open(dir, config).unwrap().0)
}

#[tokio::test]
async fn appended_entries_and_the_vote_survive_a_reopen_and_truncate_and_purge_keep_the_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = open_log(dir.path());
        let entries: Vec<_> = (0..10).map(|i| entry(1, i, add_account(i + 1))).collect();
        // The callback is openraft's; the journal appends under Fsync::Never call it at once.
        log.blocking_append(entries).await.unwrap();
        log.save_vote(&Vote::new_committed(3, 2)).await.unwrap();
        // A conflict at 8: entries after 7 go.
        log.truncate_after(Some(LogId::new_term_index(1, 7)))
            .await
            .unwrap();
        log.purge(LogId::new_term_index(1, 2)).await.unwrap();
    }
    let mut log = open_log(dir.path());
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id.map(|l| l.index), Some(7));
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(2));
    let read = log.try_get_log_entries(3..8).await.unwrap();
    assert_eq!(read.len(), 5);
    assert_eq!(read[0].log_id.index, 3);
    assert!(matches!(&read[0].payload, EntryPayload::Normal(c) if *c == add_account(4)));
    let vote = log.read_vote().await.unwrap().unwrap();
    assert_eq!(
        (
            vote.leader_id.term,
            vote.leader_id.voted_for,
            vote.committed
        ),
        (3, 2, true)
    );
}

/// A node's own committed vote (it led that term) reads back as not committed, so openraft
/// restarts it as a follower instead of as the leader of the old term: its log may have lost
/// entries of that term that its followers hold (see `LogStore::read_vote`).
#[tokio::test]
async fn a_restarted_leader_reads_its_vote_back_uncommitted_and_the_commit_point_survives() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = open_log(dir.path());
        let entries: Vec<_> = (0..6).map(|i| entry(2, i, add_account(i + 1))).collect();
        log.blocking_append(entries).await.unwrap();
        log.save_vote(&Vote::new_committed(2, 1)).await.unwrap();
        log.save_committed(Some(LogId::new_term_index(2, 4)))
            .await
            .unwrap();
    }
    let mut log = open_log(dir.path());
    let vote = log.read_vote().await.unwrap().unwrap();
    assert_eq!(
        (
            vote.leader_id.term,
            vote.leader_id.voted_for,
            vote.committed
        ),
        (2, 1, false)
    );
    let committed = log.read_committed().await.unwrap().unwrap();
    assert_eq!((committed.leader_id.term, committed.index), (2, 4));
}

fn open_sm(dir: &std::path::Path, alarm: Arc<Mutex<Option<String>>>) -> StateMachineStore {
    let (snapshots, _) = SnapshotStore::open(dir, 5, 3).unwrap();
    StateMachineStore::open(snapshots, 5, engine_config(), 2, alarm).unwrap()
}

#[tokio::test]
async fn a_snapshot_restores_the_same_state_hash_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let alarm = Arc::new(Mutex::new(None));
    let mut sm = open_sm(dir.path(), alarm.clone());
    let entries: Vec<_> = (1..=5).map(|i| entry(1, i, add_account(i))).collect();
    apply(&mut sm, entries).await.unwrap();
    let built = sm.build_snapshot().await.unwrap();
    assert_eq!(built.meta.last_log_id.map(|l| l.index), Some(5));
    let hash = sm.status().await.state_hash;
    let reopened = open_sm(dir.path(), alarm);
    let status = reopened.status().await;
    assert_eq!(status.last_applied_index, Some(5));
    assert_eq!(status.state_hash, hash);
}

#[tokio::test]
async fn a_hash_entry_that_disagrees_raises_the_alarm_and_stops_the_state_machine() {
    let dir = tempfile::tempdir().unwrap();
    let alarm = Arc::new(Mutex::new(None));
    let mut sm = open_sm(dir.path(), alarm.clone());
    apply(
        &mut sm,
        vec![entry(1, 1, add_account(1)), entry(1, 2, add_account(2))],
    )
    .await
    .unwrap();
    let (index, hash) = sm.last_checkpoint().await.unwrap();
    assert_eq!(index, 2);
    let agreeing = LogCommand::HashCheck {
        index,
        state_hash: hash,
    };
    apply(&mut sm, vec![entry(1, 3, agreeing)]).await.unwrap();
    assert!(alarm.lock().unwrap().is_none());
    let wrong = LogCommand::HashCheck {
        index,
        state_hash: hash ^ 1,
    };
    assert!(apply(&mut sm, vec![entry(1, 4, wrong)]).await.is_err());
    let text = alarm.lock().unwrap().clone().expect("alarm raised");
    assert!(
        text.contains("state hash mismatch after log index 2"),
        "{text}"
    );
}

#[tokio::test]
async fn a_failed_fsync_fails_the_append_and_every_later_one() {
    let dir = tempfile::tempdir().unwrap();
    let storage = bourse_journal::FaultyStorage::new(Arc::new(bourse_journal::RealStorage));
    let faults = storage.faults();
    let mut config = Config::new(5, 1);
    config.fsync = Fsync::Always;
    let journal = Journal::open_with_storage(Arc::new(storage), dir.path(), config)
        .unwrap()
        .0;
    let mut log = LogStore::new(journal);
    log.blocking_append(vec![entry(1, 0, add_account(1))])
        .await
        .unwrap();
    faults.fail_syncs(bourse_journal::EIO);
    // Under fsync always an entry is not appended until it is on disk: the error reaches
    // openraft (which stops the node) and the journal refuses every later write (fail-stop).
    assert!(log
        .blocking_append(vec![entry(1, 1, add_account(2))])
        .await
        .is_err());
    faults.clear();
    assert!(log
        .blocking_append(vec![entry(1, 2, add_account(3))])
        .await
        .is_err());
}

/// A batch of `requests` deposits, numbered from `seq` (distinct payloads, any size).
fn deposits(seq: u64, requests: u64) -> LogCommand {
    LogCommand::batch(
        &(0..requests)
            .map(|i| ClientRequest {
                client_id: 7,
                request_seq: seq + i,
                command: Command::new(
                    seq + i,
                    CommandBody::Deposit {
                        account: AccountId(1),
                        amount: bourse_core::Cash(i128::from(seq + i)),
                    },
                ),
            })
            .collect::<Vec<_>>(),
    )
}

/// What a read returned, comparable (openraft's `Entry` has no `PartialEq`).
fn shown(entries: &[Entry]) -> Vec<String> {
    entries.iter().map(|e| format!("{e:?}")).collect()
}

/// The newest entries are read from the in-memory tail; what it returns must equal what the
/// journal returns, across the tail's start, after truncation, after purge and after a
/// snapshot restarted the log. A seeded random sequence of appends (by new leaders after
/// truncations), truncations, purges and reads is checked against a plain model of the log
/// and, at the end, against the journal read back by a fresh store.
#[tokio::test]
async fn reads_from_the_in_memory_tail_equal_the_journal_through_appends_truncations_and_purges() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open_log(dir.path());
    // The model: the log's entries by index, first..next.
    let mut model: std::collections::BTreeMap<u64, Entry> = Default::default();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next_random = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    let mut term = 1;
    let mut seq = 1;
    let mut crossed_the_tail = false;
    for _ in 0..1500 {
        let next = model.keys().next_back().map_or(
            // An empty model after a reset or at the start: the log's own next index.
            log.get_log_state()
                .await
                .unwrap()
                .last_purged_log_id
                .map_or(0, |p| p.index + 1),
            |last| last + 1,
        );
        match next_random(10) {
            0..=5 => {
                let n = 1 + next_random(40);
                let entries: Vec<_> = (next..next + n)
                    .map(|i| {
                        let e = entry(term, i, deposits(seq, 1 + next_random(12)));
                        seq += 20;
                        e
                    })
                    .collect();
                for e in &entries {
                    model.insert(e.log_id.index, e.clone());
                }
                log.blocking_append(entries).await.unwrap();
            }
            6 if model.len() > 2 => {
                // A new leader's log conflicts from `at` on (never index 0).
                // Within the newest hundred entries, as conflicts are, so the log grows
                // past the tail's bound.
                let first = *model.keys().next().unwrap();
                let back = 1 + next_random((model.len() as u64 - 1).min(100));
                let at = (next - back).max(first + 1).max(1);
                log.truncate_after(Some(model[&(at - 1)].log_id))
                    .await
                    .unwrap();
                model.retain(|&i, _| i < at);
                term += 1;
            }
            7 if model.len() > 2 => {
                let first = *model.keys().next().unwrap();
                let upto = first + next_random((model.len() as u64 - 1).min(60));
                let t = model[&upto].log_id.leader_id.term;
                log.purge(LogId::new_term_index(t, upto)).await.unwrap();
                model.retain(|&i, _| i > upto);
            }
            8 if next_random(20) == 0 => {
                // A snapshot beyond the log was installed: the log restarts after it.
                let upto = next + 5 + next_random(50);
                log.purge(LogId::new_term_index(term, upto)).await.unwrap();
                model.clear();
                assert_eq!(log.tail_extent(), (None, 0), "a reset empties the tail");
            }
            _ => {
                let a = next_random(next + 10);
                let b = a + next_random(300);
                let read = log.try_get_log_entries(a..b).await.unwrap();
                let expected: Vec<_> = model.range(a..b).map(|(_, e)| e.clone()).collect();
                assert_eq!(shown(&read), shown(&expected), "read {a}..{b}");
                if let (Some(tail_first), Some(&first)) = (log.tail_extent().0, model.keys().next())
                {
                    if a < tail_first && b > tail_first && first < tail_first {
                        crossed_the_tail = true;
                    }
                }
            }
        }
        // The tail is a suffix of the log, within its bounds.
        let (tail_first, tail_len) = log.tail_extent();
        assert!(tail_len <= bourse_cluster::storage::LOG_TAIL_ENTRIES_MAX);
        if let Some(tail_first) = tail_first {
            assert_eq!(
                tail_first + tail_len as u64,
                model.keys().next_back().unwrap() + 1,
                "the tail ends where the log ends"
            );
            assert!(model.contains_key(&tail_first));
        }
    }
    assert!(
        crossed_the_tail,
        "some read started before the tail and ended inside it"
    );
    // Everything the tail served is what the journal holds.
    let all = log.try_get_log_entries(..).await.unwrap();
    drop(log);
    let mut reopened = open_log(dir.path());
    assert_eq!(
        reopened.tail_extent(),
        (None, 0),
        "a reopened log reads its journal"
    );
    let from_journal = reopened.try_get_log_entries(..).await.unwrap();
    assert_eq!(shown(&all), shown(&from_journal));
    let expected: Vec<_> = model.values().cloned().collect();
    assert_eq!(shown(&from_journal), shown(&expected));
}

/// The tail's byte bound holds with large batches, and a read across its start is whole.
#[tokio::test]
async fn the_tail_keeps_to_its_byte_bound_and_older_entries_come_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open_log(dir.path());
    let per_entry = 4096;
    // Enough entries to pass the byte bound well before the count bound.
    let entry_bytes = deposits(1, per_entry).encode().len();
    let entries = (bourse_cluster::storage::LOG_TAIL_BYTES_MAX / entry_bytes + 8) as u64;
    assert!(entries < bourse_cluster::storage::LOG_TAIL_ENTRIES_MAX as u64);
    let mut appended = Vec::new();
    for i in 0..entries {
        let e = entry(1, i, deposits(i * per_entry + 1, per_entry));
        appended.push(e.clone());
        log.blocking_append(vec![e]).await.unwrap();
    }
    let (tail_first, tail_len) = log.tail_extent();
    let tail_first = tail_first.expect("the tail keeps the newest entry");
    assert!(
        tail_len < entries as usize && tail_len > 1,
        "{tail_len} entries of {per_entry} requests kept in {} bytes",
        bourse_cluster::storage::LOG_TAIL_BYTES_MAX
    );
    assert_eq!(tail_first + tail_len as u64, entries);
    let read = log
        .try_get_log_entries(tail_first - 2..tail_first + 2)
        .await
        .unwrap();
    assert_eq!(
        shown(&read),
        shown(&appended[tail_first as usize - 2..tail_first as usize + 2])
    );
}
