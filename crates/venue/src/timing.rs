//! What the deployment times of each core's path: the legs of every entry the replicas
//! append and apply (quorum append, commit and apply, replica spread), and the report's
//! stage figures from them, the links' legs, the journals' fsyncs and the feed.

use crate::feed::{stamp_trades, PubDelay};
use crate::Core;
use bourse_cluster::link::LegTimes;
use bourse_cluster::tokio;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Entries the replica-spread timer remembers while waiting for the other replicas.
const SPREAD_ENTRIES_MAX: usize = 65_536;

/// What [`time_entries`] measures of each entry a core applies.
#[derive(Clone, Default)]
pub(crate) struct EntryLegs {
    /// From the first replica's journal append of the entry (the leader's) to the second's
    /// (a quorum holds it): sending it to a follower, its append and fsync.
    pub(crate) quorum_append: LegTimes,
    /// From that second append to the first replica applying the entry: the follower's
    /// answer, the commit, the apply.
    pub(crate) commit_apply: LegTimes,
    /// How much later the last replica applied the entry than the first.
    pub(crate) apply_spread: LegTimes,
}

/// Appends remembered per replica while their entries are awaited.
const APPENDS_KEPT: usize = 8_192;

/// Times every entry a core applies, from the replicas' journals' append rings (when each
/// append, fsync included, completed) and their committed streams (when each replica
/// applied it), all on this process's one clock: one task per replica's stream stamps each
/// entry as it arrives, this one pairs the stamps. The task that delivers an entry first
/// (normally the leader's stream, which applies first) also stamps the apply of each of its
/// trades for the publication delay (`pub_delay`). Ends when the streams end.
pub(crate) async fn time_entries(
    subs: Vec<bourse_cluster::Subscription>,
    journal_dirs: Vec<PathBuf>,
    out: Arc<Mutex<EntryLegs>>,
    pub_delay: Option<Arc<Mutex<PubDelay>>>,
) {
    use std::collections::BTreeMap;
    let replicas = subs.len() as u8;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(u64, Instant)>(SPREAD_ENTRIES_MAX);
    // The highest index any replica's task has delivered: a task that moves it is the first.
    let first_seen = Arc::new(AtomicU64::new(0));
    for mut sub in subs {
        let tx = tx.clone();
        let first_seen = Arc::clone(&first_seen);
        let pub_delay = pub_delay.clone();
        tokio::spawn(async move {
            let mut trades: Vec<u64> = Vec::new();
            while let Ok(entry) = sub.recv().await {
                let at = Instant::now();
                if let Some(d) = &pub_delay {
                    if first_seen.fetch_max(entry.index, Ordering::Relaxed) < entry.index {
                        stamp_trades(&entry, bourse_marketdata::now_ns(), d, &mut trades);
                    }
                }
                if tx.send((entry.index, at)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut journals: Vec<Option<Arc<bourse_journal::JournalStats>>> =
        journal_dirs.iter().map(|_| None).collect();
    // Per replica: last index of an append -> (its first index, completed at).
    let mut appends: Vec<BTreeMap<u64, (u64, Instant)>> =
        journal_dirs.iter().map(|_| BTreeMap::new()).collect();
    let mut seen: BTreeMap<u64, (Instant, u8)> = BTreeMap::new();
    while let Some((index, at)) = rx.recv().await {
        let e = seen.entry(index).or_insert((at, 0));
        e.1 += 1;
        let count = e.1;
        if count == 1 {
            // The first apply: a quorum has appended the entry by now.
            let mut times = Vec::new();
            for (n, dir) in journal_dirs.iter().enumerate() {
                if journals[n].is_none() {
                    journals[n] = bourse_journal::journal_stats_for(dir);
                }
                let Some(j) = &journals[n] else { continue };
                let after = appends[n].keys().next_back().copied();
                for (first, last, done) in j.append_times_after(after) {
                    appends[n].insert(last, (first, done));
                }
                while appends[n].len() > APPENDS_KEPT {
                    appends[n].pop_first();
                }
                if let Some((_, &(first, done))) = appends[n].range(index..).next() {
                    if first <= index {
                        times.push(done);
                    }
                }
            }
            times.sort();
            if times.len() >= 2 {
                let mut o = out.lock().expect("entry legs lock");
                o.quorum_append
                    .observe(times[1].saturating_duration_since(times[0]).as_nanos() as u64);
                o.commit_apply
                    .observe(at.saturating_duration_since(times[1]).as_nanos() as u64);
            }
        }
        if count == replicas {
            let first = seen.remove(&index).map_or(at, |e| e.0);
            out.lock()
                .expect("entry legs lock")
                .apply_spread
                .observe(at.saturating_duration_since(first).as_nanos() as u64);
        }
        while seen.len() > SPREAD_ENTRIES_MAX {
            seen.pop_first();
        }
    }
}

/// What the deployment timed of one core's path over the run (see
/// `bourse_loadgen::CoreTotals::stage_figures`).
pub(crate) fn stage_figures(core: &Core) -> Vec<bourse_loadgen::StageFigure> {
    let mut out = Vec::new();
    if core.links.is_empty() {
        return out;
    }
    let mut legs = bourse_cluster::link::LinkLegs::default();
    for w in &core.links {
        let l = w.status().legs;
        legs.answered.add(&l.answered);
        legs.streamed_after_answer.add(&l.streamed_after_answer);
        legs.round_trip.add(&l.round_trip);
    }
    let mut push = |name: &str, what: &str, latency| {
        out.push(bourse_loadgen::StageFigure {
            name: name.into(),
            what: what.into(),
            latency,
        })
    };
    push(
        "link_round_trip",
        "a gateway's link: command taken to its outputs handed to the gateway",
        Option::unwrap_or_default(legs.round_trip.percentiles()),
    );
    push(
        "group_answer",
        "a gateway's link: command taken to the replica group's answer",
        Option::unwrap_or_default(legs.answered.percentiles()),
    );
    push(
        "stream_after_answer",
        "a gateway's link: the group's answer to the entry on the committed stream",
        Option::unwrap_or_default(legs.streamed_after_answer.percentiles()),
    );
    // The journals' fsyncs since the setup, over every replica.
    let bounds = bourse_journal::FSYNC_BUCKETS_NS;
    let mut buckets = vec![0u64; bounds.len() + 1];
    let (mut sum_ns, mut count) = (0u64, 0u64);
    for (dir, base) in &core.journals {
        let Some(now) = bourse_journal::journal_stats_for(dir).map(|j| j.snapshot().fsync) else {
            continue;
        };
        for (i, b) in buckets.iter_mut().enumerate() {
            let at = |r: &bourse_journal::stats::HistogramReading| r.buckets.get(i).copied();
            *b += at(&now).unwrap_or(0).saturating_sub(at(base).unwrap_or(0));
        }
        sum_ns += now.sum_ns.saturating_sub(base.sum_ns);
        count += now.count.saturating_sub(base.count);
    }
    if count > 0 {
        let mut all: Vec<u64> = bounds.to_vec();
        all.push(bounds[bounds.len() - 1]);
        let cumulative: Vec<u64> = buckets
            .iter()
            .scan(0u64, |acc, c| {
                *acc += c;
                Some(*acc)
            })
            .collect();
        push(
            "journal_fsync",
            "one fsync of a replica's journal",
            Option::unwrap_or_default(bourse_monitor::ltp::percentiles_from_buckets(
                &all,
                &cumulative,
                sum_ns,
                count,
            )),
        );
    }
    if let Some(legs) = &core.spread {
        let t = legs.lock().expect("entry legs lock").clone();
        push(
            "quorum_append",
            "an entry's first journal append (the leader's) to its second (a quorum holds it)",
            Option::unwrap_or_default(t.quorum_append.percentiles()),
        );
        push(
            "commit_apply",
            "an entry's second journal append to the first replica applying it",
            Option::unwrap_or_default(t.commit_apply.percentiles()),
        );
        push(
            "replica_apply_spread",
            "how much later the last replica applied an entry than the first",
            Option::unwrap_or_default(t.apply_spread.percentiles()),
        );
    }
    if let Some(md) = &core.md_counter {
        let d = md.delay.lock().expect("publication delay lock");
        out.push(bourse_loadgen::StageFigure {
            name: "md_publication_delay".into(),
            what: format!(
                "a trade's apply (the earlier of the entry timer's stamp and the publisher's \
                 SendingTime; the publisher's for {} of {} trades) to its Trade record read \
                 from the feed (first of A and B)",
                d.publisher_first,
                d.delay.len()
            ),
            latency: bourse_loadgen::results::Latency::of(&d.delay),
        });
        out.push(bourse_loadgen::StageFigure {
            name: "md_send_to_read".into(),
            what: "a Trade record's packet SendingTime (the publisher took the entry) to its \
                   read from the feed (first of A and B)"
                .into(),
            latency: bourse_loadgen::results::Latency::of(&d.send_to_read),
        });
    }
    out
}
