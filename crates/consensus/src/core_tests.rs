//! One test per rule, driving single cores by hand-made messages.

use super::*;
use crate::store::MemStore;
use crate::types::EntryKind;

fn config(id: NodeId) -> Config {
    let mut c = Config::with_defaults(id, vec![1, 2, 3]);
    c.heartbeat_ticks = 2;
    c.election_ticks_min = 10;
    c.election_ticks_max = 15;
    c.lease_ticks = 15;
    c.append_in_flight_max = 2;
    c.append_entries_max = 2;
    c
}

/// A log of entries with the given terms at indexes 1, 2, ...
fn store(terms: &[Term]) -> MemStore {
    let mut s = MemStore::new();
    for (i, &t) in terms.iter().enumerate() {
        s.append(Entry::normal(
            LogId::new(t, i as u64 + 1),
            Bytes::from_static(b"x"),
        ));
    }
    s
}

fn core(id: NodeId, term: Term, terms: &[Term]) -> Core<MemStore> {
    Core::new(
        config(id),
        HardState { term, vote: None },
        store(terms),
        LogId::default(),
        id,
    )
}

fn drain(core: &mut Core<MemStore>) -> Vec<Message> {
    let mut ready = Ready::default();
    core.ready(&mut ready);
    std::mem::take(&mut ready.messages)
}

fn msg(from: NodeId, to: NodeId, term: Term, body: Body) -> Message {
    Message {
        from,
        to,
        term,
        body,
    }
}

fn granted(messages: &[Message]) -> Option<bool> {
    messages.iter().find_map(|m| match m.body {
        Body::VoteReply { granted } | Body::PreVoteReply { granted } => Some(granted),
        _ => None,
    })
}

/// Makes node 1 leader of term `term + 1` with node 2's votes.
fn elect(core: &mut Core<MemStore>) {
    while core.soft_state().role != Role::PreCandidate {
        core.tick();
    }
    let term = core.soft_state().term;
    core.step(msg(2, 1, term + 1, Body::PreVoteReply { granted: true }))
        .unwrap();
    assert_eq!(core.soft_state().role, Role::Candidate);
    core.step(msg(2, 1, term + 1, Body::VoteReply { granted: true }))
        .unwrap();
    assert_eq!(core.soft_state().role, Role::Leader);
}

#[test]
fn votes_go_to_logs_at_least_as_up_to_date() {
    // Node 2 ends at (2, 3). Equal logs and higher last terms win; a lower last term loses
    // however long its log, and an equal last term loses if shorter.
    for (last, expect) in [
        (LogId::new(2, 3), true),
        (LogId::new(2, 4), true),
        (LogId::new(3, 1), true),
        (LogId::new(2, 2), false),
        (LogId::new(1, 100), false),
    ] {
        let mut c = core(2, 2, &[1, 2, 2]);
        c.step(msg(1, 2, 5, Body::Vote { last_log_id: last }))
            .unwrap();
        assert_eq!(
            granted(&drain(&mut c)),
            Some(expect),
            "vote for last log id {last:?}"
        );
        assert_eq!(
            c.hard_state().term,
            5,
            "a vote request of a higher term raises the term either way"
        );
        assert_eq!(c.hard_state().vote, expect.then_some(1));
    }
}

#[test]
fn one_vote_per_term_and_the_same_candidate_may_ask_again() {
    let mut c = core(2, 1, &[1]);
    c.step(msg(
        1,
        2,
        2,
        Body::Vote {
            last_log_id: LogId::new(1, 1),
        },
    ))
    .unwrap();
    assert_eq!(granted(&drain(&mut c)), Some(true));
    c.step(msg(
        3,
        2,
        2,
        Body::Vote {
            last_log_id: LogId::new(1, 5),
        },
    ))
    .unwrap();
    assert_eq!(
        granted(&drain(&mut c)),
        Some(false),
        "already voted in term 2"
    );
    c.step(msg(
        1,
        2,
        2,
        Body::Vote {
            last_log_id: LogId::new(1, 1),
        },
    ))
    .unwrap();
    assert_eq!(
        granted(&drain(&mut c)),
        Some(true),
        "a repeated request gets the same answer"
    );
}

#[test]
fn the_vote_is_in_the_ready_before_the_answer_that_depends_on_it() {
    let mut c = core(2, 1, &[1]);
    c.step(msg(
        1,
        2,
        2,
        Body::Vote {
            last_log_id: LogId::new(1, 1),
        },
    ))
    .unwrap();
    let mut ready = Ready::default();
    c.ready(&mut ready);
    assert_eq!(
        ready.hard_state,
        Some(HardState {
            term: 2,
            vote: Some(1)
        })
    );
    assert_eq!(granted(&ready.messages), Some(true));
}

#[test]
fn a_pre_vote_changes_nothing_and_is_refused_within_a_lease() {
    let mut c = core(2, 3, &[1, 3]);
    c.step(msg(
        1,
        2,
        4,
        Body::PreVote {
            last_log_id: LogId::new(3, 2),
        },
    ))
    .unwrap();
    let answers = drain(&mut c);
    assert_eq!(granted(&answers), Some(true));
    assert_eq!(
        answers[0].term, 4,
        "a granted pre-vote echoes the asked term"
    );
    assert_eq!(
        c.hard_state(),
        HardState {
            term: 3,
            vote: None
        },
        "a pre-vote neither raises the term nor votes"
    );

    // Once node 3 leads term 3 and was heard just now, the same request is refused.
    c.step(msg(3, 2, 3, Body::Heartbeat { commit: 0 })).unwrap();
    drain(&mut c);
    c.step(msg(
        1,
        2,
        4,
        Body::PreVote {
            last_log_id: LogId::new(3, 2),
        },
    ))
    .unwrap();
    assert_eq!(granted(&drain(&mut c)), Some(false));
    // ...and so is a real vote of a higher term, which leaves the term alone.
    c.step(msg(
        1,
        2,
        4,
        Body::Vote {
            last_log_id: LogId::new(3, 2),
        },
    ))
    .unwrap();
    assert_eq!(granted(&drain(&mut c)), Some(false));
    assert_eq!(c.hard_state().term, 3);
    // After the lease (election_ticks_min ticks without the leader) it is granted again.
    for _ in 0..10 {
        c.tick();
    }
    c.step(msg(
        1,
        2,
        4,
        Body::PreVote {
            last_log_id: LogId::new(3, 2),
        },
    ))
    .unwrap();
    assert_eq!(granted(&drain(&mut c)), Some(true));
}

#[test]
fn a_longer_log_refusing_a_pre_vote_without_a_leader_asks_at_once() {
    let mut c = core(2, 3, &[1, 3, 3]);
    c.step(msg(
        1,
        2,
        4,
        Body::PreVote {
            last_log_id: LogId::new(3, 2),
        },
    ))
    .unwrap();
    let out = drain(&mut c);
    assert_eq!(granted(&out), Some(false));
    assert_eq!(c.soft_state().role, Role::PreCandidate);
    let asks = out
        .iter()
        .filter(|m| matches!(m.body, Body::PreVote { .. }))
        .count();
    assert_eq!(asks, 2, "it asks both peers");
    assert_eq!(c.hard_state().term, 3);
}

#[test]
fn a_pre_candidate_refused_by_a_quorum_goes_back_to_following() {
    let mut c = core(1, 1, &[1]);
    while c.soft_state().role != Role::PreCandidate {
        c.tick();
    }
    c.step(msg(2, 1, 1, Body::PreVoteReply { granted: false }))
        .unwrap();
    assert_eq!(
        c.soft_state().role,
        Role::PreCandidate,
        "one refusal of three is not a decision"
    );
    c.step(msg(3, 1, 1, Body::PreVoteReply { granted: false }))
        .unwrap();
    assert_eq!(c.soft_state().role, Role::Follower);
    assert_eq!(c.hard_state().term, 1);
}

#[test]
fn a_new_leader_appends_a_blank_entry_of_its_term() {
    let mut c = core(1, 1, &[1, 1]);
    elect(&mut c);
    assert_eq!(c.last_log_id(), LogId::new(2, 3));
    assert_eq!(c.store().get(3).unwrap().kind, EntryKind::Blank);
}

#[test]
fn only_entries_of_the_current_term_commit_by_counting() {
    // Node 1 holds entries of term 1 and 2 (durable); it leads term 3.
    let mut c = core(1, 2, &[1, 2]);
    elect(&mut c);
    let probes = drain(&mut c);
    let seq = probes
        .iter()
        .find_map(|m| match m.body {
            Body::Append { seq, .. } if m.to == 2 => Some(seq),
            _ => None,
        })
        .unwrap();
    // Node 2 holds index 2 (term 2), which a quorum (1 and 2) now holds: not committed,
    // because it is not of term 3.
    c.step(msg(
        2,
        1,
        3,
        Body::AppendReply {
            seq,
            result: AppendResult::Accepted { match_index: 2 },
        },
    ))
    .unwrap();
    assert_eq!(c.commit_index(), 0);
    // The blank entry of term 3 reaches node 2, but the leader's own copy is not durable:
    // one durable copy of two needed.
    drain(&mut c);
    c.step(msg(
        2,
        1,
        3,
        Body::AppendReply {
            seq: seq + 1,
            result: AppendResult::Accepted { match_index: 3 },
        },
    ))
    .unwrap();
    assert_eq!(
        c.commit_index(),
        0,
        "the leader counts itself only once durable"
    );
    c.persisted(LogId::new(3, 3));
    assert_eq!(
        c.commit_index(),
        3,
        "the term-3 entry commits, and the term-2 entry under it"
    );
}

#[test]
fn progress_moves_from_probe_to_replicate_and_pipelines_up_to_its_limit() {
    let mut c = core(1, 1, &[]);
    elect(&mut c);
    let first = drain(&mut c);
    let to2: Vec<_> = first
        .iter()
        .filter(|m| m.to == 2 && matches!(m.body, Body::Append { .. }))
        .collect();
    assert_eq!(to2.len(), 1, "one probe in the probe state");
    let Body::Append { seq, .. } = to2[0].body else {
        panic!("a probe")
    };
    assert_eq!(c.progress(2).unwrap().state, ProgressState::Probe);
    for i in 0..6 {
        c.propose(Bytes::from(vec![i; 3])).unwrap();
    }
    assert!(
        drain(&mut c).is_empty(),
        "nothing more while the probe is out"
    );
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq,
            result: AppendResult::Accepted { match_index: 1 },
        },
    ))
    .unwrap();
    assert_eq!(c.progress(2).unwrap().state, ProgressState::Replicate);
    let out = drain(&mut c);
    let appends: Vec<_> = out
        .iter()
        .filter(|m| m.to == 2 && matches!(m.body, Body::Append { .. }))
        .collect();
    // Six entries after index 1, two per message, two messages in flight at most.
    assert_eq!(appends.len(), 2);
    assert_eq!(c.progress(2).unwrap().in_flight.len(), 2);
    assert_eq!(c.progress(2).unwrap().next, 6);
    let Body::Append {
        seq: s1,
        ref entries,
        ..
    } = appends[0].body
    else {
        unreachable!()
    };
    assert_eq!(entries.len(), 2);
    // An answer frees its slot and the next batch goes.
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq: s1,
            result: AppendResult::Accepted { match_index: 3 },
        },
    ))
    .unwrap();
    assert_eq!(c.progress(2).unwrap().in_flight.len(), 1);
    let more = drain(&mut c);
    assert_eq!(
        more.iter()
            .filter(|m| m.to == 2 && matches!(m.body, Body::Append { .. }))
            .count(),
        1
    );
    assert_eq!(c.progress(2).unwrap().next, 8);

    // A rejection turns the follower back to probing from where it says its log ends.
    let s_last = c.progress(2).unwrap().seq_next - 1;
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq: s_last,
            result: AppendResult::Rejected {
                prev_index: 5,
                hint_index: 4,
            },
        },
    ))
    .unwrap();
    let pr = c.progress(2).unwrap();
    assert_eq!(
        (pr.state, pr.next, pr.match_index),
        (ProgressState::Probe, 5, 3)
    );
}

#[test]
fn a_stale_rejection_is_ignored_and_a_reverted_log_lowers_the_match() {
    let mut c = core(1, 1, &[]);
    elect(&mut c);
    let seq = drain(&mut c)
        .iter()
        .find_map(|m| match m.body {
            Body::Append { seq, .. } if m.to == 2 => Some(seq),
            _ => None,
        })
        .unwrap();
    for i in 0..4 {
        c.propose(Bytes::from(vec![i; 3])).unwrap();
    }
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq,
            result: AppendResult::Accepted { match_index: 1 },
        },
    ))
    .unwrap();
    drain(&mut c);
    let newest = c.progress(2).unwrap().seq_next - 1;
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq: newest,
            result: AppendResult::Accepted { match_index: 5 },
        },
    ))
    .unwrap();
    assert_eq!(c.progress(2).unwrap().match_index, 5);
    // A rejection of an older message (delivered late) changes nothing.
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq: newest - 1,
            result: AppendResult::Rejected {
                prev_index: 1,
                hint_index: 0,
            },
        },
    ))
    .unwrap();
    assert_eq!(c.progress(2).unwrap().state, ProgressState::Replicate);
    // The follower restarted with only index 2 of the 5 it acknowledged: a rejection of a
    // newer message lowers the match and probes from there.
    c.propose(Bytes::from_static(b"y")).unwrap();
    drain(&mut c);
    let newer = c.progress(2).unwrap().seq_next - 1;
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq: newer,
            result: AppendResult::Rejected {
                prev_index: 5,
                hint_index: 2,
            },
        },
    ))
    .unwrap();
    let pr = c.progress(2).unwrap();
    assert_eq!(
        (pr.state, pr.match_index, pr.next),
        (ProgressState::Probe, 2, 3)
    );
    // An acknowledgement sent before the restart, arriving now, is not believed.
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq: newest,
            result: AppendResult::Accepted { match_index: 5 },
        },
    ))
    .unwrap();
    assert_eq!(c.progress(2).unwrap().match_index, 2);
}

#[test]
fn a_follower_acknowledges_only_what_is_durable_and_adopts_commit_only_within_its_match() {
    let mut c = core(2, 1, &[1]);
    let entries = vec![
        Entry::normal(LogId::new(2, 2), Bytes::from_static(b"a")),
        Entry::normal(LogId::new(2, 3), Bytes::from_static(b"b")),
    ];
    c.step(msg(
        1,
        2,
        2,
        Body::Append {
            seq: 7,
            prev: LogId::new(1, 1),
            commit: 9,
            entries,
        },
    ))
    .unwrap();
    let mut ready = Ready::default();
    c.ready(&mut ready);
    assert!(
        ready.messages.is_empty(),
        "no acknowledgement before the entries are durable"
    );
    assert_eq!(ready.sync_to, Some(LogId::new(2, 3)));
    assert_eq!(
        c.commit_index(),
        3,
        "the leader's commit, bounded by what matches it"
    );
    c.persisted(LogId::new(2, 3));
    let out = drain(&mut c);
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0].body,
        Body::AppendReply {
            seq: 7,
            result: AppendResult::Accepted { match_index: 3 }
        }
    );
}

#[test]
fn a_conflicting_tail_is_truncated_and_its_durability_forgotten() {
    let mut c = core(2, 2, &[1, 1, 1]);
    assert_eq!(c.durable_index(), 3);
    let entries = vec![Entry::normal(LogId::new(2, 2), Bytes::from_static(b"a"))];
    c.step(msg(
        1,
        2,
        2,
        Body::Append {
            seq: 1,
            prev: LogId::new(1, 1),
            commit: 0,
            entries,
        },
    ))
    .unwrap();
    assert_eq!(c.last_log_id(), LogId::new(2, 2));
    assert_eq!(c.durable_index(), 1);
    // A sync reported for the old index 3 no longer applies.
    c.persisted(LogId::new(1, 3));
    assert_eq!(c.durable_index(), 1);
}

#[test]
fn a_leader_that_hears_no_quorum_within_its_lease_steps_down() {
    let mut c = core(1, 1, &[]);
    elect(&mut c);
    for _ in 0..14 {
        c.tick();
        assert_eq!(c.soft_state().role, Role::Leader);
    }
    c.tick();
    assert_eq!(
        c.soft_state().role,
        Role::Follower,
        "lease_ticks (15) without a quorum"
    );
    assert_eq!(c.soft_state().leader, None);
}

#[test]
fn a_leader_asks_for_a_snapshot_for_a_follower_behind_its_compacted_log() {
    let mut c = core(1, 1, &[1, 1, 1, 1]);
    elect(&mut c);
    c.persisted(LogId::new(2, 5));
    // Node 3 is at index 5 already; commit everything, apply, snapshot, compact.
    let seq = drain(&mut c)
        .iter()
        .find_map(|m| match m.body {
            Body::Append { seq, .. } if m.to == 3 => Some(seq),
            _ => None,
        })
        .unwrap();
    c.step(msg(
        3,
        1,
        2,
        Body::AppendReply {
            seq,
            result: AppendResult::Accepted { match_index: 5 },
        },
    ))
    .unwrap();
    assert_eq!(c.commit_index(), 5);
    let mut ready = Ready::default();
    c.ready(&mut ready);
    assert_eq!(ready.committed.len(), 5);
    let mut config = c.config().clone();
    config.log_kept_below_snapshot_entries = 0;
    c.config = config;
    c.snapshot_taken(5);
    assert_eq!(c.store().base(), LogId::new(2, 5));
    // Node 2 says its log is empty.
    let s2 = c.progress(2).unwrap().seq_next - 1;
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq: s2,
            result: AppendResult::Rejected {
                prev_index: 4,
                hint_index: 0,
            },
        },
    ))
    .unwrap();
    c.ready(&mut ready);
    assert_eq!(ready.snapshot_wanted, vec![2]);
    assert_eq!(c.progress(2).unwrap().state, ProgressState::Snapshot);
    assert!(c.send_snapshot(2, LogId::new(2, 5), Bytes::from_static(b"state")));
    let out = drain(&mut c);
    assert!(out.iter().any(|m| m.to == 2
        && matches!(m.body, Body::Snapshot { snapshot, .. } if snapshot == LogId::new(2, 5))));

    // The follower installs it and restarts its log after it.
    let mut f = core(2, 1, &[]);
    let snapshot = out
        .into_iter()
        .find(|m| m.to == 2 && matches!(m.body, Body::Snapshot { .. }))
        .unwrap();
    f.step(snapshot).unwrap();
    let mut ready = Ready::default();
    f.ready(&mut ready);
    assert_eq!(
        ready.snapshot_install.as_ref().map(|(id, _)| *id),
        Some(LogId::new(2, 5))
    );
    assert_eq!(f.last_log_id(), LogId::new(2, 5));
    assert_eq!((f.commit_index(), f.applied_index()), (5, 5));
    assert!(matches!(
        ready.messages[0].body,
        Body::AppendReply {
            result: AppendResult::Accepted { match_index: 5 },
            ..
        }
    ));
}

#[test]
fn proposals_are_refused_by_followers_and_beyond_the_limits() {
    let mut c = core(1, 1, &[]);
    assert_eq!(
        c.propose(Bytes::new()),
        Err(ProposeError::NotLeader { leader: None })
    );
    elect(&mut c);
    let max = c.config().entry_bytes_max;
    assert_eq!(
        c.propose(Bytes::from(vec![0; max + 1])),
        Err(ProposeError::TooLarge { len: max + 1, max })
    );
    let limit = c.config().uncommitted_entries_max;
    for _ in 1..limit {
        c.propose(Bytes::new()).unwrap();
    }
    assert_eq!(
        c.propose(Bytes::new()),
        Err(ProposeError::Busy { uncommitted: limit })
    );
}

#[test]
fn messages_from_strangers_are_refused() {
    let mut c = core(1, 1, &[]);
    assert_eq!(
        c.step(msg(9, 1, 1, Body::HeartbeatReply)),
        Err(StepError::UnknownSender { from: 9 })
    );
    assert_eq!(
        c.step(msg(2, 3, 1, Body::HeartbeatReply)),
        Err(StepError::NotForMe { to: 3 })
    );
}

#[test]
fn a_rejection_of_a_conflicting_term_points_before_that_term() {
    // Node 2 holds a tail of term 2 (indexes 3-6) that the leader of term 3 does not have.
    let mut c = core(2, 2, &[1, 1, 2, 2, 2, 2]);
    let probe = Body::Append {
        seq: 4,
        prev: LogId::new(3, 6),
        commit: 0,
        entries: Vec::new(),
    };
    c.step(msg(1, 2, 3, probe)).unwrap();
    let out = drain(&mut c);
    let rejected = AppendResult::Rejected {
        prev_index: 6,
        hint_index: 2,
    };
    assert_eq!(
        out[0].body,
        Body::AppendReply {
            seq: 4,
            result: rejected
        }
    );
    // A prev beyond the log's end is answered with the end.
    let probe = Body::Append {
        seq: 5,
        prev: LogId::new(3, 9),
        commit: 0,
        entries: Vec::new(),
    };
    c.step(msg(1, 2, 3, probe)).unwrap();
    let out = drain(&mut c);
    let rejected = AppendResult::Rejected {
        prev_index: 9,
        hint_index: 6,
    };
    assert_eq!(
        out[0].body,
        Body::AppendReply {
            seq: 5,
            result: rejected
        }
    );
}

#[test]
fn a_commit_carrier_is_not_answered_and_is_followed_within_the_match() {
    let mut c = core(2, 1, &[1]);
    let entries = vec![Entry::normal(LogId::new(2, 2), Bytes::from_static(b"a"))];
    c.step(msg(
        1,
        2,
        2,
        Body::Append {
            seq: 1,
            prev: LogId::new(1, 1),
            commit: 0,
            entries,
        },
    ))
    .unwrap();
    c.persisted(LogId::new(2, 2));
    drain(&mut c);
    c.step(msg(1, 2, 2, Body::Commit { commit: 5 })).unwrap();
    assert!(drain(&mut c).is_empty(), "no answer to a commit carrier");
    assert_eq!(
        c.commit_index(),
        2,
        "only as far as the log matches the leader's"
    );
}

#[test]
fn a_leader_carries_an_advanced_commit_to_a_follower_with_nothing_to_receive() {
    let mut c = core(1, 1, &[]);
    elect(&mut c);
    let seq = |out: &[Message], to| {
        out.iter()
            .find_map(|m| match m.body {
                Body::Append { seq, .. } if m.to == to => Some(seq),
                _ => None,
            })
            .unwrap()
    };
    let out = drain(&mut c);
    let (s2, s3) = (seq(&out, 2), seq(&out, 3));
    c.persisted(LogId::new(2, 1));
    c.step(msg(
        2,
        1,
        2,
        Body::AppendReply {
            seq: s2,
            result: AppendResult::Accepted { match_index: 1 },
        },
    ))
    .unwrap();
    c.step(msg(
        3,
        1,
        2,
        Body::AppendReply {
            seq: s3,
            result: AppendResult::Accepted { match_index: 1 },
        },
    ))
    .unwrap();
    assert_eq!(c.commit_index(), 1);
    let out = drain(&mut c);
    assert_eq!(out.len(), 2);
    assert!(out.iter().all(|m| m.body == Body::Commit { commit: 1 }));
}
