//! The admin API's view of a local deployment ([`VenueAdmin`], a `bourse_admin::AdminVenue`):
//! commands go to each market's replica group through cluster clients of their own
//! (`bourse_cluster::Client`, retrying under the same idempotency key across a failover),
//! answered after commit with their events read from the committed stream; queries
//! (`bourse_cluster::query::Query`) are answered from the state of the core's current leader,
//! which applied every entry it answered.
//!
//! The same type serves two deployments: replica groups hosted in this process
//! ([`VenueAdmin::new`]: the committed stream and the leader's state are read in process), and
//! the nodes of separate `bourse node` processes ([`VenueAdmin::remote`], what `bourse admin
//! serve` runs: the committed stream is read over TCP, and queries go to the leader as
//! `net::Request::Query`).
//!
//! Ordered commands (a phase change, a kill switch) go one at a time through a sequential
//! client. Unordered ones (many account additions) go through a `PipelinedClient`: up to
//! [`ADMIN_PIPELINE_WINDOW`] in flight at once, so the leader's batcher puts hundreds of them
//! into one log entry, while a consumer of the committed stream in this process collects
//! their events by request seq as the entries apply.
//!
//! Only replicated cores are served: the gateways take every output of a replica group from
//! its committed stream, so they see what an admin command did (a kill switch's cancels, for
//! one). An in-process core reports only to the gateway that submitted, so an action there
//! would leave the gateway's order table stale.

use bourse_admin::{AdminVenue, Asker, BoxFuture, Query, QueryAnswer};
use bourse_cluster::client::{PipelineError, PipelinedClient};
use bourse_cluster::{tokio, Audit, Client, OutcomeKind, Raft, StateMachineStore, StreamConsumer};
use bourse_core::{Command, Event};
use bourse_engine::Engine;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The admin's client ids per core: lane 0 (ordered commands, one at a time) and lane 1
/// (unordered commands, pipelined).
pub const ADMIN_LANES: usize = 2;
/// Client ids of the admin's clients start here (gateways use 1..=gateways, the setup
/// `1 << 61` on): core `c`'s lane `l` is `ADMIN_CLIENT_ID_BASE + 1000 c + l`. They are the
/// nodes' bulk clients, batched after trading (`bourse_cluster::admission`).
pub const ADMIN_CLIENT_ID_BASE: u64 = bourse_cluster::admission::BULK_CLIENT_ID_MIN;
/// Unordered admin commands in flight to one core at most (the pipelined client's window:
/// it holds the rest back, so memory and the node's queue stay bounded).
pub const ADMIN_PIPELINE_WINDOW: usize = 4_096;
/// The lane of the pipelined client.
const PIPELINED_LANE: usize = 1;
/// How long one admin command may take to be answered (an election included).
const ADMIN_COMMAND_DEADLINE: Duration = Duration::from_secs(10);
/// How long a read waits for a core to have a leader.
const READ_LEADER_DEADLINE: Duration = Duration::from_secs(5);
/// How long one node may take to answer a status or a query.
const NODE_CALL_TIMEOUT: Duration = Duration::from_millis(500);

/// A read of one core's engine in process (tests and the venue's own reports).
pub type EngineRead = Box<dyn FnOnce(&Engine) -> serde_json::Value + Send>;

struct Replica {
    id: u64,
    raft: Raft,
    state: StateMachineStore,
}

struct AdminCore {
    nodes: Vec<(u64, SocketAddr)>,
    /// The replicas in this process; empty for a core of separate node processes, which is
    /// read over the network.
    replicas: Vec<Replica>,
    /// The ordered lane's client, made on first use (it continues its id's numbering).
    ordered: tokio::sync::Mutex<Option<Client>>,
    /// The pipelined lane's client, made on first use; one bulk submission at a time.
    pipelined: tokio::sync::Mutex<Option<PipelinedClient>>,
    client_base: u64,
}

/// See the module documentation.
pub struct VenueAdmin {
    markets: Vec<String>,
    cores: Vec<AdminCore>,
}

impl VenueAdmin {
    pub(crate) fn new(cores: Vec<(String, &[bourse_cluster::Node])>) -> VenueAdmin {
        let mut markets = Vec::new();
        let mut admin_cores = Vec::new();
        for (index, (name, nodes)) in cores.into_iter().enumerate() {
            markets.push(name);
            admin_cores.push(AdminCore {
                nodes: nodes.iter().map(|n| (n.id(), n.addr)).collect(),
                replicas: nodes
                    .iter()
                    .map(|n| Replica {
                        id: n.id(),
                        raft: n.raft().clone(),
                        state: n.state_machine().clone(),
                    })
                    .collect(),
                ordered: tokio::sync::Mutex::new(None),
                pipelined: tokio::sync::Mutex::new(None),
                client_base: ADMIN_CLIENT_ID_BASE + crate::CLIENT_IDS_PER_CORE * index as u64,
            });
        }
        VenueAdmin {
            markets,
            cores: admin_cores,
        }
    }

    /// The admin's view of cores whose nodes run in other processes: per core its market's
    /// name, its nodes' client addresses and the first of the admin's two client ids there
    /// (lane 0 orders, lane 1 pipelines; both must be bulk ids,
    /// `bourse_cluster::admission::BULK_CLIENT_ID_MIN` on).
    pub fn remote(cores: Vec<(String, Vec<SocketAddr>, u64)>) -> VenueAdmin {
        let mut markets = Vec::new();
        let mut admin_cores = Vec::new();
        for (name, addrs, client_base) in cores {
            markets.push(name);
            admin_cores.push(AdminCore {
                // The ids a client needs only to follow a leader hint; a node's place in the
                // list, as the gateway's links number them.
                nodes: addrs
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (i as u64 + 1, *a))
                    .collect(),
                replicas: Vec::new(),
                ordered: tokio::sync::Mutex::new(None),
                pipelined: tokio::sync::Mutex::new(None),
                client_base,
            });
        }
        VenueAdmin {
            markets,
            cores: admin_cores,
        }
    }

    /// Runs `read` on core `core`'s engine as its leader in this process has applied it (the
    /// venue's reports and tests; a core of other processes answers only [`Query`]s).
    pub fn read(
        &self,
        core: usize,
        read: EngineRead,
    ) -> BoxFuture<'_, Result<serde_json::Value, String>> {
        Box::pin(async move {
            let c = self
                .cores
                .get(core)
                .ok_or_else(|| format!("no core {core}"))?;
            let r = c.local_leader().await?;
            Ok(r.state.with_state(|s| read(s.engine())).await)
        })
    }
}

impl AdminCore {
    /// The lane's client id and the next seq it must use: the numbering its id has at the
    /// group's leader, continued.
    async fn resume(&self, lane: usize) -> Result<(u64, u64), String> {
        let id = self.client_base + lane as u64;
        let deadline = Instant::now() + ADMIN_COMMAND_DEADLINE;
        let mut last_error = String::from("no node answered");
        while Instant::now() < deadline {
            for &(_, addr) in &self.nodes {
                let timeout = NODE_CALL_TIMEOUT;
                let leads = match bourse_cluster::client::node_status(addr, timeout).await {
                    Ok(s) => s.leader == Some(s.id),
                    Err(e) => {
                        last_error = format!("{addr}: {e}");
                        false
                    }
                };
                if !leads {
                    continue;
                }
                match bourse_cluster::client::node_last_seq(addr, id, timeout).await {
                    Ok(last) => return Ok((id, last + 1)),
                    Err(e) => last_error = format!("{addr}: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "no leader found for the admin client: {last_error}"
        ))
    }

    async fn run_ordered(
        &self,
        commands: Vec<Command>,
        audit: &Audit,
    ) -> Result<Vec<Vec<Event>>, String> {
        let mut slot = self.ordered.lock().await;
        if slot.is_none() {
            let (id, first_seq) = self.resume(0).await?;
            *slot = Some(Client::new(self.nodes.clone(), id, first_seq));
        }
        let client = slot.as_mut().expect("made above");
        let mut out = Vec::with_capacity(commands.len());
        for c in &commands {
            match client
                .submit_audited_for_events(c, Some(audit), ADMIN_COMMAND_DEADLINE)
                .await
            {
                Ok((_, events)) => out.push(events),
                Err(e) => {
                    // The request may or may not have applied; a new client continues from
                    // the group's numbering next time.
                    *slot = None;
                    return Err(e.to_string());
                }
            }
        }
        Ok(out)
    }
}

impl AdminCore {
    /// Submits unordered commands through the pipelined lane (see the module documentation)
    /// and answers each command's events in the order given.
    async fn run_pipelined(
        &self,
        commands: Vec<Command>,
        audit: Audit,
    ) -> Result<Vec<Vec<Event>>, String> {
        let mut slot = self.pipelined.lock().await;
        if slot.is_none() {
            let (id, first_seq) = self.resume(PIPELINED_LANE).await?;
            *slot = Some(PipelinedClient::start(
                self.nodes.clone(),
                id,
                first_seq,
                ADMIN_PIPELINE_WINDOW,
            ));
        }
        let client = slot.as_mut().expect("made above");
        client.set_audit(Some(audit));
        let result = self.pipeline(client, &commands).await;
        if result.is_err() {
            // Some requests may be unanswered: a new client continues from the group's
            // numbering next time, and the requests left behind can no longer apply.
            *slot = None;
        }
        result
    }

    /// The replica whose committed stream the pipelined lane reads: the leader if one is
    /// known (it applied every entry it answered), else the first (every replica applies the
    /// same entries at the same indexes).
    fn stream_replica(&self) -> &Replica {
        self.replicas
            .iter()
            .find(|r| r.raft.metrics().borrow().current_leader == Some(r.id))
            .unwrap_or(&self.replicas[0])
    }

    /// Keeps up to the window of `commands` in flight while the replica's committed stream
    /// hands back their events (matched by request seq, so answers and entries may come in
    /// any order); done when every command is answered and its events are read.
    async fn pipeline(
        &self,
        client: &mut PipelinedClient,
        commands: &[Command],
    ) -> Result<Vec<Vec<Event>>, String> {
        // Nothing of this call is proposed yet, so every command applies at or after the
        // stream's next index (in process), or after the entries the leader has applied.
        let from = if self.replicas.is_empty() {
            self.remote_leader()
                .await?
                .1
                .last_applied_index
                .map_or(0, |i| i + 1)
        } else {
            self.stream_replica().state.stream().next_index()
        };
        self.pipeline_from(client, commands, from).await
    }

    /// The replica in this process that leads the group, waiting for one up to
    /// [`READ_LEADER_DEADLINE`].
    async fn local_leader(&self) -> Result<&Replica, String> {
        let deadline = Instant::now() + READ_LEADER_DEADLINE;
        loop {
            let leader = self
                .replicas
                .iter()
                .find(|r| r.raft.metrics().borrow().current_leader == Some(r.id));
            if let Some(r) = leader {
                return Ok(r);
            }
            if Instant::now() >= deadline {
                return Err("the core has no leader".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The node (of other processes) that says it leads the group, with its status, waiting
    /// for one up to [`READ_LEADER_DEADLINE`].
    async fn remote_leader(&self) -> Result<(SocketAddr, bourse_cluster::net::NodeStatus), String> {
        let deadline = Instant::now() + READ_LEADER_DEADLINE;
        let mut last_error = String::from("no node says it leads");
        loop {
            for &(_, addr) in &self.nodes {
                match bourse_cluster::client::node_status_brief(addr, NODE_CALL_TIMEOUT).await {
                    Ok(s) if s.leader == Some(s.id) => return Ok((addr, s)),
                    Ok(_) => {}
                    Err(e) => last_error = format!("{addr}: {e}"),
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("the core has no leader: {last_error}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`AdminCore::pipeline`] reading the committed stream from index `from`, at or before
    /// the first application of any of `commands`.
    async fn pipeline_from(
        &self,
        client: &mut PipelinedClient,
        commands: &[Command],
        from: u64,
    ) -> Result<Vec<Vec<Event>>, String> {
        let mut consumer = if self.replicas.is_empty() {
            StreamConsumer::remote(self.nodes.iter().map(|&(_, a)| a).collect(), from)
        } else {
            let stream = self.stream_replica().state.stream().clone();
            StreamConsumer::local(stream, None, from)
        };
        let client_id = client.client_id();
        let first_seq = client.next_seq();
        let n = commands.len();
        let submit = async {
            let (mut sent, mut answered) = (0usize, 0usize);
            while answered < n {
                while sent < n {
                    match client.try_submit(&commands[sent]) {
                        Ok(_) => sent += 1,
                        Err(PipelineError::Full) => break,
                        Err(e) => return Err(e.to_string()),
                    }
                }
                let answer = tokio::time::timeout(ADMIN_COMMAND_DEADLINE, client.next_answer())
                    .await
                    .map_err(|_| {
                        format!("no answer within {} s", ADMIN_COMMAND_DEADLINE.as_secs())
                    })?
                    .map_err(|e| e.to_string())?;
                match answer.kind {
                    // `Duplicate` and `Stale` mean an earlier attempt of this request applied
                    // (a resend after a rewind, under load): `Stale` when the group no longer
                    // keeps its answer because a later request of this client applied since.
                    // Its events are on the stream at that first application, where `read`
                    // finds them: the lane's numbering resumes past every request applied
                    // before this call, so only this call's own attempts can have applied it.
                    OutcomeKind::Applied | OutcomeKind::Duplicate | OutcomeKind::Stale => {}
                    other => return Err(format!("request {}: {other:?}", answer.request_seq)),
                }
                answered += 1;
            }
            Ok::<(), String>(())
        };
        let read = async {
            let mut found: Vec<Option<Vec<Event>>> = vec![None; n];
            let mut missing = n;
            while missing > 0 {
                let entry = tokio::time::timeout(ADMIN_COMMAND_DEADLINE, consumer.next())
                    .await
                    .map_err(|_| "the committed stream stalled".to_string())?
                    .map_err(|e| format!("the committed stream: {e}"))?;
                for r in entry.requests() {
                    let (id, seq) = r.key();
                    if id != client_id || !r.applied_here() || seq < first_seq {
                        continue;
                    }
                    let Some(place) = found.get_mut((seq - first_seq) as usize) else {
                        continue;
                    };
                    if place.is_none() {
                        let events = bourse_core::codec::decode_events(r.event_bytes())
                            .map_err(|e| format!("request {seq}: bad events: {e}"))?;
                        *place = Some(events);
                        missing -= 1;
                    }
                }
            }
            Ok::<_, String>(found)
        };
        let ((), found) = tokio::try_join!(submit, read)?;
        Ok(found
            .into_iter()
            .map(|e| e.expect("every command's events were read"))
            .collect())
    }
}

impl AdminVenue for VenueAdmin {
    fn markets(&self) -> Vec<String> {
        self.markets.clone()
    }

    fn submit<'a>(
        &'a self,
        core: usize,
        commands: Vec<Command>,
        ordered: bool,
        asker: Asker<'a>,
    ) -> BoxFuture<'a, Result<Vec<Vec<Event>>, String>> {
        Box::pin(async move {
            let c = self
                .cores
                .get(core)
                .ok_or_else(|| format!("no core {core}"))?;
            // The log entries say who asked: the journal's audit trail.
            let audit = Audit::new(asker.operator, asker.request_id)?;
            if ordered || commands.len() < 2 {
                c.run_ordered(commands, &audit).await
            } else {
                c.run_pipelined(commands, audit).await
            }
        })
    }

    fn query(&self, core: usize, query: Query) -> BoxFuture<'_, Result<QueryAnswer, String>> {
        Box::pin(async move {
            let c = self
                .cores
                .get(core)
                .ok_or_else(|| format!("no core {core}"))?;
            if !c.replicas.is_empty() {
                let r = c.local_leader().await?;
                return Ok(r.state.query_answer(query).await);
            }
            let (addr, _) = c.remote_leader().await?;
            bourse_cluster::client::node_query(addr, query, NODE_CALL_TIMEOUT)
                .await
                .map_err(|e| format!("{addr}: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_cluster::{ClusterConfig, FsyncSetting, Node};
    use bourse_core::{AccountId, AccountSpec, CommandBody, FirmId, StpMode, StpScope};

    fn add_account(account: u32) -> Command {
        Command::new(
            1,
            CommandBody::AddAccount(AccountSpec {
                account: AccountId(account),
                firm: FirmId(1),
                may_short: false,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            }),
        )
    }

    /// What a rewind of the pipelined lane does under load, made deterministic: an earlier
    /// attempt applied requests 1 and 2 of the lane, and the pipelined client then sends 1,
    /// 2 and 3. The group answers 1 `Stale` (2 applied since, so it no longer keeps 1's
    /// answer), 2 `Duplicate`, and applies 3; the admin takes all three as applied (each
    /// applied once, as the core's table says), with the events of their first application
    /// read from the committed stream.
    #[test]
    fn a_request_resent_after_a_later_one_applied_is_answered_with_its_first_events() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ClusterConfig::local(
            5,
            dir.path().to_path_buf(),
            bourse_testkit::free_ports::<3>(),
        );
        config.fsync = FsyncSetting::Never;
        config.orders_max = 1_024;
        config.accounts_max = 1_024;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut nodes = Vec::new();
            for n in &config.nodes {
                nodes.push(Node::start(&config, n.id).await.unwrap());
            }
            let admin = VenueAdmin::new(vec![("equities".into(), nodes.as_slice())]);
            let core = &admin.cores[0];
            // `resume` waits for a leader; a fresh lane starts at request 1.
            let (id, first_seq) = core.resume(PIPELINED_LANE).await.unwrap();
            assert_eq!(first_seq, 1);
            let commands: Vec<Command> = (1..=3).map(add_account).collect();
            let from = core.stream_replica().state.stream().next_index();
            let mut earlier = Client::new(core.nodes.clone(), id, 1);
            for c in &commands[..2] {
                let (ack, _) = earlier
                    .submit_for_events(c, ADMIN_COMMAND_DEADLINE)
                    .await
                    .unwrap();
                assert!(!ack.duplicate);
            }
            let mut client = PipelinedClient::start(core.nodes.clone(), id, 1, 16);
            let events = core
                .pipeline_from(&mut client, &commands, from)
                .await
                .expect("Stale and Duplicate answers are applied earlier, not errors");
            for (n, events) in events.iter().enumerate() {
                let added = events.iter().any(|e| {
                    matches!(e, Event::AccountAdded { account, .. } if account.0 == n as u32 + 1)
                });
                assert!(added, "request {}: {events:?}", n + 1);
            }
            let applied = core
                .stream_replica()
                .state
                .with_state(|s| s.applied_by_client().find(|(c, _)| *c == id))
                .await;
            assert_eq!(
                applied,
                Some((id, 3)),
                "each of the three requests applied once, whichever attempt applied it"
            );
            drop(client);
            for n in nodes {
                n.shutdown().await;
            }
        });
    }
}
