//! Helpers of the delivery tests: replicated cores on loopback, a delivery node over them,
//! a polling client, and the cores' own event logs to check what clients got against.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bourse_cluster::client::PipelinedClient;
use bourse_cluster::{ClusterConfig, Node, StreamConsumer};
use bourse_core::{Command, Event, OrderId, OrderLog};
use bourse_delivery::record::is_kept;
use bourse_delivery::{
    AnyClient, CoreSource, DeliveryConfig, DeliveryNode, Filter, Limits, PollRequest, Pos, Record,
};
use bourse_engine::workload::{Flow, FlowConfig};

pub const LIMIT: Duration = Duration::from_secs(60);

/// One replica group of three nodes in process, with a pipelined client and an order flow.
pub struct Core {
    pub id: u32,
    pub config: ClusterConfig,
    pub nodes: Vec<Node>,
    pub client: PipelinedClient,
    pub flow: Flow,
    pub next_ts: u64,
    pub last_seq: u64,
    /// The core's committed stream, from which the flow learns what its commands did
    /// (answers carry no events).
    feedback: StreamConsumer,
    _dir: tempfile::TempDir,
}

impl Core {
    pub async fn start(id: u32, seed: u64) -> Core {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ClusterConfig::local(
            100 + u64::from(id),
            dir.path().to_path_buf(),
            bourse_testkit::free_ports(),
        );
        config.fsync = bourse_cluster::FsyncSetting::Never;
        config.orders_max = 8192;
        config.accounts_max = 1024;
        config.first_order_id = (u64::from(id) << 48) + 1;
        let mut nodes = Vec::new();
        for n in &config.nodes {
            nodes.push(Node::start(&config, n.id).await.expect("node starts"));
        }
        let addrs = config
            .nodes
            .iter()
            .map(|n| (n.id, n.addr.parse().unwrap()))
            .collect();
        let client = PipelinedClient::start(addrs, 1, 1, 256);
        let feedback = StreamConsumer::remote(
            config
                .nodes
                .iter()
                .map(|n| n.addr.parse().unwrap())
                .collect(),
            0,
        );
        let mut flow = FlowConfig::exchange_core(seed);
        flow.accounts = 30;
        flow.live_orders_target = 60;
        let mut core = Core {
            id,
            config,
            nodes,
            client,
            flow: Flow::new(flow),
            next_ts: 1,
            last_seq: 0,
            feedback,
            _dir: dir,
        };
        for body in core.flow.setup() {
            core.submit(body).await;
        }
        core
    }

    pub fn source(&self) -> CoreSource {
        CoreSource {
            id: self.id,
            nodes: self.addrs(),
            tls: None,
        }
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.config
            .nodes
            .iter()
            .map(|n| n.addr.parse().unwrap())
            .collect()
    }

    async fn submit(&mut self, body: bourse_core::CommandBody) {
        self.last_seq = self
            .client
            .submit(&Command::new(self.next_ts, body))
            .await
            .unwrap();
        self.next_ts += 1;
    }

    /// Submits `count` commands of the flow and waits until the last is answered.
    pub async fn run(&mut self, count: usize) {
        for _ in 0..count {
            let body = self.flow.next_command();
            self.submit(body).await;
        }
        loop {
            let a = tokio::time::timeout(LIMIT, self.client.next_answer())
                .await
                .expect("answers arrive")
                .unwrap();
            if a.request_seq == self.last_seq {
                self.observe_until(a.applied_index).await;
                return;
            }
        }
    }

    /// Feeds the flow the events of this core's client's requests, from the stream up to
    /// and including entry `index`.
    async fn observe_until(&mut self, index: u64) {
        while self.feedback.position() <= index {
            let e = tokio::time::timeout(LIMIT, self.feedback.next())
                .await
                .expect("the stream goes on")
                .unwrap();
            for r in e.requests().filter(|r| r.applied_here() && r.key().0 == 1) {
                let events: Vec<Event> = r.events().map(|e| e.unwrap()).collect();
                self.flow.observe(&events);
            }
        }
    }

    pub async fn leader(&self) -> usize {
        let started = Instant::now();
        loop {
            for (i, n) in self.nodes.iter().enumerate() {
                let s = n.status().await;
                if s.leader == Some(s.id) {
                    return i;
                }
            }
            assert!(started.elapsed() < LIMIT, "no leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the leader (a failover follows).
    pub async fn kill_leader(&mut self) {
        let l = self.leader().await;
        self.nodes.remove(l).shutdown().await;
    }

    /// The next log index after everything applied on any running node. A follower may
    /// lag the leader that answered, so the furthest node is the end of what was committed.
    pub async fn end_index(&self) -> u64 {
        let mut end = 0;
        for n in &self.nodes {
            let s = n.status().await;
            end = end.max(s.last_applied_index.map_or(0, |i| i + 1));
        }
        end
    }

    /// The core's own event log, read from its committed stream: the record of every kept
    /// event by position, up to `end` (firms from the accounts' own `AccountAdded` events).
    pub async fn event_log(&self, end: u64) -> BTreeMap<Pos, Record> {
        let mut consumer = StreamConsumer::remote(self.addrs(), 0);
        let mut log = BTreeMap::new();
        let mut firms = BTreeMap::new();
        while consumer.position() < end {
            let e = tokio::time::timeout(LIMIT, consumer.next())
                .await
                .expect("the stream goes on")
                .unwrap();
            let mut ord = 0;
            for r in e.requests().filter(|r| r.applied_here()) {
                for ev in r.events().map(|e| e.unwrap()) {
                    if let Event::AccountAdded { account, firm, .. } = ev {
                        firms.insert(account, firm);
                    }
                    if !is_kept(&ev) {
                        continue;
                    }
                    let f = |a| firms.get(&a).copied();
                    let record_firms = match ev {
                        Event::OrderLog(l) => [Some(l.firm); 2],
                        Event::Trade { buy, sell, .. } => [f(buy.account), f(sell.account)],
                        Event::OrderRejected { account, .. } => [f(account); 2],
                        _ => unreachable!("kept events"),
                    };
                    let record = Record {
                        core: self.id,
                        index: e.index(),
                        ord,
                        firms: record_firms,
                        event: ev,
                    };
                    log.insert(record.pos(), record);
                    ord += 1;
                }
            }
        }
        log
    }

    pub async fn stop(self) {
        for n in self.nodes {
            n.shutdown().await;
        }
    }
}

pub fn delivery_config(cores: &[&Core], state_dir: Option<std::path::PathBuf>) -> DeliveryConfig {
    DeliveryConfig {
        name: "test-venue".into(),
        listen: format!("127.0.0.1:{}", bourse_testkit::free_port())
            .parse()
            .unwrap(),
        binary_listen: Some("127.0.0.1:0".parse().unwrap()),
        state_dir,
        persist_interval_ms: 20,
        threads: 2,
        cores: cores.iter().map(|c| c.source()).collect(),
        follow: None,
        cold: None,
        limits: Limits::default(),
        access: Default::default(),
    }
}

/// Starts a node from a blocking thread (it owns a runtime, which may not be built or
/// dropped inside the test's).
pub async fn start_delivery(config: DeliveryConfig) -> DeliveryNode {
    tokio::task::spawn_blocking(move || DeliveryNode::start(config))
        .await
        .unwrap()
        .expect("delivery node starts")
}

pub async fn stop_delivery(node: DeliveryNode, crash: bool) {
    tokio::task::spawn_blocking(move || {
        if crash {
            node.kill();
        } else {
            node.stop().unwrap();
        }
    })
    .await
    .unwrap();
}

/// Waits until the delivery node applied every core up to `ends` (per core, in order).
pub async fn caught_up(node: &DeliveryNode, ends: &[u64]) {
    let started = Instant::now();
    while node.applied_indexes().iter().zip(ends).any(|(a, e)| a < e) {
        assert!(
            started.elapsed() < LIMIT,
            "delivery applied {:?} of {ends:?}",
            node.applied_indexes()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What one client received.
#[derive(Clone, Default)]
pub struct Received {
    pub records: Vec<Record>,
    pub cursor: Option<String>,
    pub answers: u64,
}

impl Received {
    /// One poll; connection errors (a delivery node being restarted) are retried.
    pub async fn poll(&mut self, client: &mut AnyClient, filter: Filter, limit: usize) -> usize {
        let req = PollRequest {
            cursor: self.cursor.clone(),
            filter,
            limit: Some(limit),
            wait_us: Some(2_000),
            min_rows: None,
            since_ns: None,
        };
        let started = Instant::now();
        loop {
            match client.poll(&req).await {
                Ok(a) => {
                    let n = a.records.len();
                    self.cursor = Some(a.header.next_cursor);
                    assert_eq!(a.header.count, n);
                    self.records.extend(a.records);
                    self.answers += 1;
                    return n;
                }
                Err(bourse_delivery::ClientError::Io(_)) => {
                    assert!(
                        started.elapsed() < LIMIT,
                        "the delivery node is unreachable"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("poll failed: {e}"),
            }
        }
    }

    /// Polls until an answer is empty.
    pub async fn drain(&mut self, client: &mut AnyClient, filter: Filter, limit: usize) {
        while self.poll(client, filter, limit).await > 0 {}
    }
}

/// Checks one client's records of one core against the core's event log: positions strictly
/// increasing (no reordering), each record the core's record at its position, and the
/// client's final picture (each order's latest state, every trade and reject once) exactly
/// what the log says for the records matching `filter` (no gap).
pub fn check_against_log(
    records: &[Record],
    core: u32,
    log: &BTreeMap<Pos, Record>,
    filter: &Filter,
) {
    let mine: Vec<&Record> = records.iter().filter(|r| r.core == core).collect();
    assert!(
        mine.windows(2).all(|w| w[0].pos() < w[1].pos()),
        "core {core}: records out of order"
    );
    let picture = |records: &mut dyn Iterator<Item = &Record>| {
        let mut orders: BTreeMap<OrderId, OrderLog> = BTreeMap::new();
        let mut finals = Vec::new();
        for r in records {
            match r.event {
                Event::OrderLog(l) => {
                    orders.insert(l.order_id, l);
                }
                _ => finals.push(*r),
            }
        }
        (orders, finals)
    };
    for r in &mine {
        assert!(r.matches(filter), "a record that does not match {filter:?}");
        assert_eq!(log.get(&r.pos()), Some(*r), "core {core} at {:?}", r.pos());
    }
    let (orders, finals) = picture(&mut mine.iter().copied());
    // The latest state of each order in the log, kept if that state matches the filter.
    let (mut want_orders, _) = picture(&mut log.values());
    want_orders.retain(|_, l| {
        let r = Record {
            core,
            index: 0,
            ord: 0,
            firms: [Some(l.firm); 2],
            event: Event::OrderLog(*l),
        };
        r.matches(filter)
    });
    let (_, want_finals) = picture(&mut log.values().filter(|r| r.matches(filter)));
    if orders != want_orders {
        let differ: Vec<_> = want_orders
            .iter()
            .filter(|(id, l)| orders.get(id) != Some(l))
            .take(3)
            .map(|(id, l)| (id, orders.get(id).map(|o| o.seq), l.seq))
            .collect();
        panic!(
            "core {core}: {} orders, {} expected; first differing (order, seq got, seq in the log): {differ:?}",
            orders.len(),
            want_orders.len()
        );
    }
    assert_eq!(
        finals.len(),
        want_finals.len(),
        "core {core}: trades and rejects"
    );
    assert!(
        finals == want_finals,
        "core {core}: trades and rejects differ"
    );
}
