//! openraft's storage traits over the journal and the snapshot store: what is appended reads
//! back after a reopen, truncation and purge keep the log consistent, the vote survives, a
//! snapshot restores the same state hash, and a hash entry that disagrees takes the node out.

use std::sync::{Arc, Mutex};

use bourse_cluster::batch::{ClientRequest, LogCommand};
use bourse_cluster::{LogStore, StateMachineStore, TypeConfig};
use bourse_core::{AccountId, AccountSpec, Command, CommandBody, FirmId, StpMode, StpScope};
use bourse_engine::EngineConfig;
use bourse_journal::{Config, Fsync, Journal, SnapshotStore};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LeaderId, LogId, RaftLogReader, RaftSnapshotBuilder,
    Vote,
};

fn engine_config() -> EngineConfig {
    EngineConfig {
        orders_max: 1024,
        instruments_max: 16,
        accounts_max: 1024,
        levels_per_side_hint: 8,
        first_order_id: 1,
    }
}

fn entry(term: u64, index: u64, command: LogCommand) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 0), index),
        payload: EntryPayload::Normal(command),
    }
}

fn add_account(seq: u64) -> LogCommand {
    LogCommand::Batch(vec![ClientRequest {
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
        log.save_vote(&Vote {
            leader_id: LeaderId {
                term: 3,
                voted_for: Some(2),
            },
            committed: true,
        })
        .await
        .unwrap();
        log.truncate(LogId::new(CommittedLeaderId::new(1, 0), 8))
            .await
            .unwrap();
        log.purge(LogId::new(CommittedLeaderId::new(1, 0), 2))
            .await
            .unwrap();
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
        (3, Some(2), true)
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
        log.save_vote(&Vote {
            leader_id: LeaderId {
                term: 2,
                voted_for: Some(1),
            },
            committed: true,
        })
        .await
        .unwrap();
        log.save_committed(Some(LogId::new(CommittedLeaderId::new(2, 0), 4)))
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
        (2, Some(1), false)
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
    sm.apply(entries).await.unwrap();
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
    sm.apply(vec![
        entry(1, 1, add_account(1)),
        entry(1, 2, add_account(2)),
    ])
    .await
    .unwrap();
    let (index, hash) = sm.last_checkpoint().await.unwrap();
    assert_eq!(index, 2);
    let agreeing = LogCommand::HashCheck {
        index,
        state_hash: hash,
    };
    sm.apply(vec![entry(1, 3, agreeing)]).await.unwrap();
    assert!(alarm.lock().unwrap().is_none());
    let wrong = LogCommand::HashCheck {
        index,
        state_hash: hash ^ 1,
    };
    assert!(sm.apply(vec![entry(1, 4, wrong)]).await.is_err());
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
