//! The clearing state's inputs and outputs over the network: feeding it from the cores'
//! committed streams (up to a cut, replaying saved runs on the way), and executing a run's
//! movements through the normal sequenced path, resumable after a crash.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bourse_cluster::client::node_status_brief;
use bourse_cluster::client::{PipelineError, PipelinedClient};
use bourse_cluster::{NodeId, OutcomeKind, StreamConsumer};
use bourse_core::{Command, Event, RejectReason};
use serde::Serialize;

use crate::run::{run_client_id, RunPlan};
use crate::state::ClearingState;

/// How long a node may take to say where its stream ends.
const STATUS_TIMEOUT_MS: u64 = 2_000;
/// A node silent this long while it owes entries that exist is left for the next one.
const STALL_TIMEOUT_MS: u64 = 1_000;
/// How long one movement may take to be committed and applied, failovers included.
pub const MOVEMENT_DEADLINE_MS: u64 = 20_000;

/// Each node's id, asked of the node (the client follows the leader by id).
pub async fn with_ids(nodes: &[SocketAddr]) -> Result<Vec<(NodeId, SocketAddr)>, String> {
    let mut out = Vec::new();
    for &addr in nodes {
        let status = node_status_brief(addr, Duration::from_millis(STATUS_TIMEOUT_MS))
            .await
            .map_err(|e| format!("node {addr} does not answer: {e}"))?;
        out.push((status.id, addr));
    }
    Ok(out)
}

/// The position just past the newest entry any of `nodes` applied: the cut a run takes now
/// (trading goes on; what is applied later belongs to the next run).
pub async fn stream_end(nodes: &[SocketAddr]) -> Result<u64, String> {
    let mut end = None;
    let mut errors = Vec::new();
    for &addr in nodes {
        match node_status_brief(addr, Duration::from_millis(STATUS_TIMEOUT_MS)).await {
            Ok(s) => {
                let here = s.last_applied_index.map_or(0, |i| i + 1);
                end = Some(end.map_or(here, |e: u64| e.max(here)));
            }
            Err(e) => errors.push(format!("{addr}: {e}")),
        }
    }
    end.ok_or_else(|| format!("no node answered: {}", errors.join("; ")))
}

/// Feeds `state` the entries of `core` from its position up to `until` (exclusive).
pub async fn feed_to(
    state: &mut ClearingState,
    core: usize,
    nodes: &[SocketAddr],
    until: u64,
) -> Result<(), String> {
    let from = state.cut()[core];
    if from >= until {
        return Ok(());
    }
    let mut consumer = StreamConsumer::remote(nodes.to_vec(), from);
    consumer.set_stall_timeout_ms(STALL_TIMEOUT_MS);
    while consumer.position() < until {
        let entry = consumer
            .next()
            .await
            .map_err(|e| format!("core {core}, entry {}: {e}", consumer.position()))?;
        state
            .apply_entry(core, &entry)
            .map_err(|e| format!("core {core}, entry {}: {e}", entry.index()))?;
    }
    Ok(())
}

/// Feeds `state` up to `until` (per core), settling each of the saved `runs` (in run order)
/// when the state reaches its cut, and checks that the state there hashes as it did when the
/// run was computed: clearing is reproducible, and a difference means a run was computed on
/// other data.
pub async fn replay(
    state: &mut ClearingState,
    cores: &[Vec<SocketAddr>],
    runs: &[RunPlan],
    until: &[u64],
) -> Result<(), String> {
    for run in runs {
        if run.cut.len() != cores.len() {
            return Err(format!(
                "run {} cleared {} cores, this clearing follows {}",
                run.run_id,
                run.cut.len(),
                cores.len()
            ));
        }
        for (core, nodes) in cores.iter().enumerate() {
            feed_to(state, core, nodes, run.cut[core]).await?;
        }
        if state.state_hash() != run.state_hash {
            return Err(format!(
                "the state at run {}'s cut {:?} hashes {:016x}, the run saw {:016x}",
                run.run_id,
                run.cut,
                state.state_hash(),
                run.state_hash
            ));
        }
        state.settle(run);
    }
    for (core, nodes) in cores.iter().enumerate() {
        feed_to(state, core, nodes, until[core]).await?;
    }
    Ok(())
}

/// What became of one command of a run (a movement, or the end of day).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum MovementResult {
    /// The core applied it (now or in an earlier attempt of the run); an end of day says
    /// how many Day orders it expired.
    Done {
        applied_index: u64,
        orders_expired: u64,
    },
    /// The core refused it (a withdrawal above the account's free cash): a margin call the
    /// member must meet.
    Refused {
        applied_index: u64,
        reason: RejectReason,
    },
}

/// Options of [`execute`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecuteOptions {
    /// Submit at most this many movements, then stop as if the process died (tests of a
    /// restarted run).
    pub stop_after: Option<usize>,
}

/// Submits the plan's movements to the cores (`cores[c]`: the nodes of core `c`), each once:
/// first reads each core's stream from the run's cut for requests of the run's client id that
/// are already applied (an earlier attempt of the same run), then submits the rest in seq
/// order. Returns the result of every movement known so far, by (core, seq).
///
/// The rest go out pipelined, up to [`MOVEMENTS_IN_FLIGHT_MAX`] at once: the group applies a
/// client's requests gaplessly in seq order, so the order of a core's movements, its margin
/// calls and its end of day is kept, while a loaded core costs one commit round trip per
/// window rather than per movement (one at a time, a run's 16,468 movements behind a bulk
/// account addition took minutes). Their events are read back from the committed stream.
pub async fn execute(
    plan: &RunPlan,
    cores: &[Vec<(NodeId, SocketAddr)>],
    options: ExecuteOptions,
) -> Result<BTreeMap<(usize, u64), MovementResult>, String> {
    let mut results = BTreeMap::new();
    let mut submitted = 0usize;
    for (core, nodes) in cores.iter().enumerate() {
        let mine = plan.commands(core);
        if mine.is_empty() {
            continue;
        }
        let client_id = run_client_id(plan.run_id, core);
        let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.1).collect();
        // Everything applied before this end was applied by an earlier attempt: what this
        // attempt applies lies after it.
        let end = stream_end(&addrs).await?;
        let earlier = applied_between(&addrs, plan.cut[core], end, client_id).await?;
        let last = earlier.keys().next_back().copied().unwrap_or(0);
        results.extend(earlier.into_iter().map(|(seq, r)| ((core, seq), r)));
        let mut todo: Vec<&Command> = mine.iter().filter(|c| c.0 > last).map(|c| &c.1).collect();
        if let Some(n) = options.stop_after {
            todo.truncate(n.saturating_sub(submitted));
        }
        if todo.is_empty() {
            if options.stop_after.is_some_and(|n| submitted >= n) {
                return Ok(results);
            }
            continue;
        }
        submit_pipelined(nodes.clone(), client_id, last + 1, &todo)
            .await
            .map_err(|e| format!("core {core}: {e}"))?;
        submitted += todo.len();
        let now = stream_end(&addrs).await?;
        let applied = applied_between(&addrs, end, now, client_id).await?;
        for seq in last + 1..last + 1 + todo.len() as u64 {
            let r = applied.get(&seq).ok_or_else(|| {
                format!("core {core}, command {seq}: answered but not on the stream")
            })?;
            results.insert((core, seq), *r);
        }
        if options.stop_after.is_some_and(|n| submitted >= n) {
            return Ok(results);
        }
    }
    Ok(results)
}

/// Requests of one run a core has in flight at most.
pub const MOVEMENTS_IN_FLIGHT_MAX: usize = 1_024;

/// Submits `commands` as requests `first_seq..` of `client_id`, pipelined, and waits until
/// the group has applied every one (now or by an earlier attempt).
async fn submit_pipelined(
    nodes: Vec<(NodeId, SocketAddr)>,
    client_id: u64,
    first_seq: u64,
    commands: &[&Command],
) -> Result<(), String> {
    let mut client = PipelinedClient::start(nodes, client_id, first_seq, MOVEMENTS_IN_FLIGHT_MAX);
    let deadline = Duration::from_millis(MOVEMENT_DEADLINE_MS);
    let (mut sent, mut answered) = (0usize, 0usize);
    while answered < commands.len() {
        while sent < commands.len() {
            match client.try_submit(commands[sent]) {
                Ok(_) => sent += 1,
                Err(PipelineError::Full) => break,
                Err(e) => return Err(format!("command {}: {e}", first_seq + sent as u64)),
            }
        }
        let answer = tokio::time::timeout(deadline, client.next_answer())
            .await
            .map_err(|_| format!("no answer within {MOVEMENT_DEADLINE_MS} ms"))?
            .map_err(|e| e.to_string())?;
        match answer.kind {
            // Applied now, or by an earlier send of the same request (a resend after a
            // failover): once either way, its events on the stream where it first applied.
            OutcomeKind::Applied | OutcomeKind::Duplicate | OutcomeKind::Stale => answered += 1,
            other => return Err(format!("command {}: {other:?}", answer.request_seq)),
        }
    }
    Ok(())
}

/// The requests of `client_id` applied on the stream from `from` up to `until` (exclusive).
async fn applied_between(
    nodes: &[SocketAddr],
    from: u64,
    until: u64,
    client_id: u64,
) -> Result<BTreeMap<u64, MovementResult>, String> {
    let mut found = BTreeMap::new();
    if from >= until {
        return Ok(found);
    }
    let mut consumer = StreamConsumer::remote(nodes.to_vec(), from);
    consumer.set_stall_timeout_ms(STALL_TIMEOUT_MS);
    while consumer.position() < until {
        let entry = consumer.next().await.map_err(|e| e.to_string())?;
        for r in entry.requests() {
            if r.key().0 != client_id || !r.applied_here() {
                continue;
            }
            let events: Vec<Event> = r
                .events()
                .collect::<Result<_, _>>()
                .map_err(|e| format!("entry {}: {e}", entry.index()))?;
            found.insert(r.key().1, result_of(entry.index(), &events));
        }
    }
    Ok(found)
}

fn result_of(applied_index: u64, events: &[Event]) -> MovementResult {
    match events.iter().find_map(|e| match e {
        Event::CommandRejected { reason, .. } => Some(*reason),
        _ => None,
    }) {
        Some(reason) => MovementResult::Refused {
            applied_index,
            reason,
        },
        None => MovementResult::Done {
            applied_index,
            orders_expired: events
                .iter()
                .find_map(|e| match e {
                    Event::EndOfDayDone { orders_expired, .. } => Some(*orders_expired),
                    _ => None,
                })
                .unwrap_or(0),
        },
    }
}
