//! The admin API's view of a local deployment ([`VenueAdmin`], a `bourse_admin::AdminVenue`):
//! commands go to each market's replica group through cluster clients of their own
//! (`bourse_cluster::Client`, retrying under the same idempotency key across a failover),
//! answered after commit with their events read from the committed stream; reads run on the
//! state of the core's current leader, which applied every entry it answered.
//!
//! Only replicated cores are served: the gateways take every output of a replica group from
//! its committed stream, so they see what an admin command did (a kill switch's cancels, for
//! one). An in-process core reports only to the gateway that submitted, so an action there
//! would leave the gateway's order table stale.

use bourse_admin::{AdminVenue, BoxFuture, EngineRead};
use bourse_cluster::{tokio, Client, Raft, StateMachineStore};
use bourse_core::{Command, Event};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The sequenced clients each core's admin commands are spread over when their order does
/// not matter (many account additions); ordered commands use the first.
pub const ADMIN_LANES: usize = 8;
/// Client ids of the admin's clients start here (gateways use 1..=gateways, the setup
/// `1 << 32` on): core `c`'s lane `l` is `ADMIN_CLIENT_ID_BASE + 1000 c + l`.
pub const ADMIN_CLIENT_ID_BASE: u64 = 3 << 32;
/// How long one admin command may take to be answered (an election included).
const ADMIN_COMMAND_DEADLINE: Duration = Duration::from_secs(10);
/// How long a read waits for a core to have a leader.
const READ_LEADER_DEADLINE: Duration = Duration::from_secs(5);

struct Replica {
    id: u64,
    raft: Raft,
    state: StateMachineStore,
}

struct AdminCore {
    /// Commands this core answered to the admin (applied, or refused by the engine): the
    /// venue's accounting of the generator's commands leaves them out.
    answered: std::sync::atomic::AtomicU64,
    nodes: Vec<(u64, SocketAddr)>,
    replicas: Vec<Replica>,
    /// Each lane's client, made on first use (it continues its id's numbering).
    lanes: Vec<tokio::sync::Mutex<Option<Client>>>,
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
                answered: std::sync::atomic::AtomicU64::new(0),
                nodes: nodes.iter().map(|n| (n.id(), n.addr)).collect(),
                replicas: nodes
                    .iter()
                    .map(|n| Replica {
                        id: n.id(),
                        raft: n.raft().clone(),
                        state: n.state_machine().clone(),
                    })
                    .collect(),
                lanes: (0..ADMIN_LANES)
                    .map(|_| tokio::sync::Mutex::new(None))
                    .collect(),
                client_base: ADMIN_CLIENT_ID_BASE + 1_000 * index as u64,
            });
        }
        VenueAdmin {
            markets,
            cores: admin_cores,
        }
    }
}

impl VenueAdmin {
    /// Commands the admin had applied in core `core` so far.
    pub fn commands_applied(&self, core: usize) -> u64 {
        self.cores
            .get(core)
            .map_or(0, |c| c.answered.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl AdminCore {
    /// The lane's client, continuing the numbering its id has at the group's leader.
    async fn client(&self, lane: usize) -> Result<Client, String> {
        let id = self.client_base + lane as u64;
        let deadline = Instant::now() + ADMIN_COMMAND_DEADLINE;
        let mut last_error = String::from("no node answered");
        while Instant::now() < deadline {
            for &(_, addr) in &self.nodes {
                let timeout = Duration::from_millis(500);
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
                    Ok(last) => return Ok(Client::new(self.nodes.clone(), id, last + 1)),
                    Err(e) => last_error = format!("{addr}: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!(
            "no leader found for the admin client: {last_error}"
        ))
    }

    async fn run_lane(
        &self,
        lane: usize,
        commands: Vec<Command>,
    ) -> Result<Vec<Vec<Event>>, String> {
        let mut slot = self.lanes[lane].lock().await;
        if slot.is_none() {
            *slot = Some(self.client(lane).await?);
        }
        let client = slot.as_mut().expect("made above");
        let mut out = Vec::with_capacity(commands.len());
        for c in &commands {
            match client.submit_for_events(c, ADMIN_COMMAND_DEADLINE).await {
                Ok((ack, events)) => {
                    if !ack.duplicate {
                        self.answered
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    out.push(events)
                }
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

impl AdminVenue for VenueAdmin {
    fn markets(&self) -> Vec<String> {
        self.markets.clone()
    }

    fn submit(
        &self,
        core: usize,
        commands: Vec<Command>,
        ordered: bool,
    ) -> BoxFuture<'_, Result<Vec<Vec<Event>>, String>> {
        Box::pin(async move {
            let c = self
                .cores
                .get(core)
                .ok_or_else(|| format!("no core {core}"))?;
            if ordered || commands.len() < 2 * ADMIN_LANES {
                return c.run_lane(0, commands).await;
            }
            // Contiguous chunks, one per lane, so the answers come back in the order given.
            let per = commands.len().div_ceil(ADMIN_LANES);
            let mut chunks = Vec::new();
            let mut rest = commands;
            while !rest.is_empty() {
                let tail = rest.split_off(per.min(rest.len()));
                chunks.push(rest);
                rest = tail;
            }
            let runs = chunks
                .into_iter()
                .enumerate()
                .map(|(lane, chunk)| c.run_lane(lane, chunk));
            let mut out = Vec::new();
            for r in futures_util::future::join_all(runs).await {
                out.extend(r?);
            }
            Ok(out)
        })
    }

    fn read(
        &self,
        core: usize,
        read: EngineRead,
    ) -> BoxFuture<'_, Result<serde_json::Value, String>> {
        Box::pin(async move {
            let c = self
                .cores
                .get(core)
                .ok_or_else(|| format!("no core {core}"))?;
            let deadline = Instant::now() + READ_LEADER_DEADLINE;
            loop {
                let leader = c
                    .replicas
                    .iter()
                    .find(|r| r.raft.metrics().borrow().current_leader == Some(r.id));
                if let Some(r) = leader {
                    return Ok(r.state.with_state(|s| read(s.engine())).await);
                }
                if Instant::now() >= deadline {
                    return Err("the core has no leader".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}
