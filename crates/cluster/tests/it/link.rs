//! A replicated core behind the gateway's `CoreLink`: three in-process nodes, the link's
//! outputs taken from the committed stream. Losing the leader mid-stream loses and doubles
//! nothing (checked against a surviving node's own stream), and two links trading against
//! each other each receive the events of their own resting orders.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bourse_cluster::link::{ClusterLink, ClusterLinkConfig, FOREIGN_KEY};
use bourse_cluster::tokio;
use bourse_cluster::{ClusterConfig, FsyncSetting, Node, OutcomeKind};
use bourse_core::codec::decode_events;
use bourse_core::link::{CoreLink, CoreOutput, RequestKey, SubmitError};
use bourse_core::{
    ClOrdId, Command, CommandBody, Event, NewOrder, OrdType, OrderId, Price, Qty, Side, TimeInForce,
};
use bourse_engine::workload::{Flow, FlowConfig};

const LIMIT: Duration = Duration::from_secs(30);

struct Group {
    rt: tokio::runtime::Runtime,
    nodes: Vec<Node>,
    config: ClusterConfig,
    _dir: tempfile::TempDir,
}

impl Group {
    fn start() -> Group {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ClusterConfig::local(
            3,
            dir.path().to_path_buf(),
            bourse_testkit::free_ports::<3>(),
        );
        config.fsync = FsyncSetting::Never;
        config.orders_max = 8192;
        config.accounts_max = 1024;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let nodes = rt.block_on(async {
            let mut nodes = Vec::new();
            for n in &config.nodes {
                nodes.push(Node::start(&config, n.id).await.unwrap());
            }
            nodes
        });
        Group {
            rt,
            nodes,
            config,
            _dir: dir,
        }
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.config
            .nodes
            .iter()
            .map(|n| n.addr.parse().unwrap())
            .collect()
    }

    fn leader(&self) -> usize {
        let started = Instant::now();
        loop {
            for (i, n) in self.nodes.iter().enumerate() {
                let s = self.rt.block_on(n.status());
                if s.leader == Some(s.id) {
                    return i;
                }
            }
            assert!(started.elapsed() < LIMIT, "no leader");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn shutdown(self) {
        let Group { rt, nodes, .. } = self;
        rt.block_on(async {
            for n in nodes {
                n.shutdown().await;
            }
        });
    }
}

fn flow_config(seed: u64) -> FlowConfig {
    let mut flow = FlowConfig::exchange_core(seed);
    flow.accounts = 20;
    flow.live_orders_target = 50;
    flow
}

/// Submits, retrying while the link's queue is full (the link never blocks the caller).
fn submit(link: &mut ClusterLink, key: RequestKey, command: Command, out: &mut Vec<CoreOutput>) {
    let started = Instant::now();
    loop {
        match link.submit(key, command.clone()) {
            Ok(()) => return,
            Err(SubmitError::Full | SubmitError::NoQuorum) => {
                while let Some(o) = link.try_recv() {
                    out.push(o);
                }
                assert!(started.elapsed() < LIMIT, "link stayed full");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(SubmitError::Closed) => panic!("link closed: {:?}", link.status()),
        }
    }
}

/// Drains outputs until `dones` Done outputs have arrived in total.
fn collect_dones(link: &mut ClusterLink, out: &mut Vec<CoreOutput>, dones: usize) {
    let started = Instant::now();
    let count = |out: &Vec<CoreOutput>| {
        out.iter()
            .filter(|o| matches!(o, CoreOutput::Done { .. }))
            .count()
    };
    while count(out) < dones {
        match link.try_recv() {
            Some(o) => out.push(o),
            None => {
                assert!(
                    started.elapsed() < LIMIT,
                    "{} of {dones} commands done; link {:?}",
                    count(out),
                    link.status()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

#[test]
fn losing_the_leader_mid_stream_loses_and_doubles_no_output() {
    let group = Group::start();
    let leader = group.leader();
    let mut link = ClusterLink::start(ClusterLinkConfig::new(group.addrs(), 41, 512)).unwrap();
    let mut flow = Flow::new(flow_config(3));
    let mut keys = Vec::new();
    let mut out = Vec::new();
    for (i, body) in flow.setup().into_iter().enumerate() {
        let key = RequestKey {
            session: 0,
            seq: i as u64 + 1,
        };
        keys.push(key);
        submit(&mut link, key, Command::new(0, body), &mut out);
    }
    let mut group = group;
    // The flow learns the live orders (from `Event::OrderLog`, which the link leaves out)
    // from a node that stays up.
    let survivor = (leader + 1) % 3;
    let mut watch = group.nodes[survivor].subscribe(0).unwrap();
    // What the flow sends depends on what it has seen of the stream when it sends, which
    // depends on timing, so a fixed number of commands makes a varying number of trades.
    // The drive goes on past 4,000 commands until the stream has shown TRADES_MIN trades,
    // so that the comparison below always covers that many.
    const TRADES_MIN: usize = 150;
    const COMMANDS_MAX: u64 = 40_000;
    let mut trades_seen = 0;
    let mut n = 0u64;
    while n < 4_000 || trades_seen < TRADES_MIN {
        assert!(
            n < COMMANDS_MAX,
            "the flow made {trades_seen} trades in {n} commands"
        );
        while let Ok(Some(entry)) = watch.try_recv() {
            // Only an applied request's events are new: a duplicate repeats what was seen,
            // and a request refused as a gap (after the leader was lost) carries none.
            for r in entry
                .requests
                .iter()
                .filter(|r| r.kind == OutcomeKind::Applied)
            {
                let events = decode_events(&r.events).unwrap();
                trades_seen += events
                    .iter()
                    .filter(|e| matches!(e, Event::Trade { .. }))
                    .count();
                flow.observe(&events);
            }
        }
        let key = RequestKey {
            session: 1,
            seq: n + 1,
        };
        keys.push(key);
        submit(
            &mut link,
            key,
            Command::new(n, flow.next_command()),
            &mut out,
        );
        if n == 1_500 {
            // Stop the leader with commands queued and in flight, the stream on it.
            let node = group.nodes.remove(leader);
            group.rt.block_on(node.shutdown());
        }
        n += 1;
    }
    collect_dones(&mut link, &mut out, keys.len());
    // The stream came from the leader, so the link had to resubscribe elsewhere.
    assert!(link.status().resubscriptions >= 1, "{:?}", link.status());
    // Everything the link reported, by key, in order.
    let mut reported: BTreeMap<RequestKey, Vec<Event>> = BTreeMap::new();
    let mut done: BTreeMap<RequestKey, usize> = BTreeMap::new();
    for o in &out {
        match *o {
            CoreOutput::Event { key, event } => {
                assert_ne!(key, FOREIGN_KEY, "only this link trades on this core");
                assert!(!done.contains_key(&key), "an event after its Done");
                reported.entry(key).or_default().push(event);
            }
            CoreOutput::Done { key } => *done.entry(key).or_default() += 1,
        }
    }
    assert!(done.values().all(|&n| n == 1), "each command done once");
    assert_eq!(done.len(), keys.len());
    drop(watch);
    // The truth: a surviving node's own stream, from the start.
    let mut sub = group.nodes[0].subscribe(0).expect("ring keeps everything");
    let mut truth: BTreeMap<u64, Vec<Event>> = BTreeMap::new();
    while let Ok(Some(entry)) = sub.try_recv() {
        for r in entry.requests.iter().filter(|r| r.client_id == 41) {
            if r.kind == OutcomeKind::Applied {
                let events = decode_events(&r.events).unwrap();
                let events = events
                    .into_iter()
                    .filter(|e| !matches!(e, Event::OrderLog(_)))
                    .collect();
                assert!(truth.insert(r.request_seq, events).is_none());
            }
        }
    }
    assert_eq!(truth.len(), keys.len(), "each command applied once");
    let mut trades = 0;
    for (i, key) in keys.iter().enumerate() {
        let expected = &truth[&(i as u64 + 1)];
        trades += expected
            .iter()
            .filter(|e| matches!(e, Event::Trade { .. }))
            .count();
        assert_eq!(
            reported.get(key).map_or(&[][..], Vec::as_slice),
            expected.as_slice(),
            "outputs of {key:?}"
        );
    }
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for e in truth.values().flatten() {
        let name = format!("{e:?}");
        let name = name.split([' ', '{', '(']).next().unwrap_or("").to_string();
        *kinds.entry(name).or_default() += 1;
    }
    assert!(
        trades >= TRADES_MIN,
        "the flow traded ({trades} trades): {kinds:?}"
    );
    drop(link);
    group.shutdown();
}

fn order(cl: u64, account: u32, side: Side, price: i64, qty: i64) -> CommandBody {
    CommandBody::NewOrder(NewOrder {
        firm: None,
        account: bourse_core::AccountId(account),
        cl_ord_id: ClOrdId(cl),
        instrument: flow_config(1).instruments[0].instrument,
        side,
        ord_type: OrdType::Limit,
        price: Price(price),
        qty: Qty(qty),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(0),
    })
}

fn accepted_id(out: &[CoreOutput], key: RequestKey) -> OrderId {
    out.iter()
        .find_map(|o| match *o {
            CoreOutput::Event {
                key: k,
                event: Event::OrderAccepted { order_id, .. },
            } if k == key => Some(order_id),
            _ => None,
        })
        .expect("order accepted")
}

#[test]
fn two_links_trading_each_get_the_fills_of_their_own_resting_orders() {
    let group = Group::start();
    group.leader();
    let mut a = ClusterLink::start(ClusterLinkConfig::new(group.addrs(), 1, 64)).unwrap();
    let mut b = ClusterLink::start(ClusterLinkConfig::new(group.addrs(), 2, 64)).unwrap();
    let flow = Flow::new(flow_config(1));
    let price = flow_config(1).instruments[0].reference_price.0;
    let (mut out_a, mut out_b) = (Vec::new(), Vec::new());
    let setup = flow.setup();
    let n_setup = setup.len();
    for (i, body) in setup.into_iter().enumerate() {
        let key = RequestKey {
            session: 0,
            seq: i as u64 + 1,
        };
        submit(&mut a, key, Command::new(0, body), &mut out_a);
    }
    collect_dones(&mut a, &mut out_a, n_setup);
    // A rests a sell; B buys into it, then rests a buy that A sells into.
    let a1 = RequestKey { session: 1, seq: 1 };
    submit(
        &mut a,
        a1,
        Command::new(1, order(1, 1, Side::Sell, price, 10)),
        &mut out_a,
    );
    collect_dones(&mut a, &mut out_a, n_setup + 1);
    let a_order = accepted_id(&out_a, a1);
    let b1 = RequestKey { session: 1, seq: 1 };
    submit(
        &mut b,
        b1,
        Command::new(2, order(1, 2, Side::Buy, price, 4)),
        &mut out_b,
    );
    let b2 = RequestKey { session: 1, seq: 2 };
    submit(
        &mut b,
        b2,
        Command::new(3, order(2, 2, Side::Buy, price - 1, 5)),
        &mut out_b,
    );
    collect_dones(&mut b, &mut out_b, 2);
    let b_resting = accepted_id(&out_b, b2);
    let a2 = RequestKey { session: 1, seq: 2 };
    submit(
        &mut a,
        a2,
        Command::new(4, order(2, 1, Side::Sell, price - 1, 5)),
        &mut out_a,
    );
    collect_dones(&mut a, &mut out_a, n_setup + 2);
    // Let B's link catch up with A's last command.
    let started = Instant::now();
    while a.status().last_index > b.status().last_index {
        assert!(started.elapsed() < LIMIT);
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    while let Some(o) = b.try_recv() {
        out_b.push(o);
    }
    while let Some(o) = a.try_recv() {
        out_a.push(o);
    }
    let trades = |out: &[CoreOutput], key: RequestKey| -> Vec<(OrderId, OrderId)> {
        out.iter()
            .filter_map(|o| match *o {
                CoreOutput::Event {
                    key: k,
                    event: Event::Trade { buy, sell, .. },
                } if k == key => Some((buy.order_id, sell.order_id)),
                _ => None,
            })
            .collect()
    };
    // A hears of B's buy filling its resting sell, under the foreign key, once.
    let a_foreign = trades(&out_a, FOREIGN_KEY);
    assert_eq!(a_foreign.len(), 1, "{out_a:?}");
    assert_eq!(a_foreign[0].1, a_order);
    assert_eq!(trades(&out_b, b1).len(), 1);
    // B hears of A's sell filling its resting buy, under the foreign key, once.
    let b_foreign = trades(&out_b, FOREIGN_KEY);
    assert_eq!(b_foreign.len(), 1, "{out_b:?}");
    assert_eq!(b_foreign[0].0, b_resting);
    assert_eq!(trades(&out_a, a2).len(), 1);
    // A's own setup is foreign to B (no Done for it there), and nothing is done twice.
    assert_eq!(
        out_b
            .iter()
            .filter(|o| matches!(o, CoreOutput::Done { .. }))
            .count(),
        2
    );
    // Each link timed each of its own requests once in every leg (an answer may trail the
    // report by a moment), and another link's requests not at all.
    for (link, own) in [(&a, n_setup as u64 + 2), (&b, 2)] {
        let started = Instant::now();
        while link.status().legs.answered.count < own {
            assert!(started.elapsed() < LIMIT, "{:?}", link.status().legs);
            std::thread::sleep(Duration::from_millis(5));
        }
        let legs = link.status().legs;
        assert_eq!(legs.answered.count, own);
        assert_eq!(legs.round_trip.count, own);
        assert_eq!(legs.streamed_after_answer.count, own);
        let rt = legs.round_trip.percentiles().unwrap();
        assert!(rt.p50 <= rt.p99 && rt.p99 <= rt.max && rt.max == legs.round_trip.max_ns);
    }
    drop(a);
    drop(b);
    group.shutdown();
}

#[test]
fn a_restarted_link_continues_its_numbering() {
    let group = Group::start();
    group.leader();
    let mut out = Vec::new();
    let mut link = ClusterLink::start(ClusterLinkConfig::new(group.addrs(), 9, 16)).unwrap();
    for seq in 1..=3 {
        let key = RequestKey { session: 0, seq };
        submit(
            &mut link,
            key,
            Command::new(0, CommandBody::EndOfDay),
            &mut out,
        );
    }
    collect_dones(&mut link, &mut out, 3);
    drop(link);
    // A new link under the same id: its commands are applied (not taken as duplicates of the
    // first run's) and reported.
    let mut out = Vec::new();
    let mut link = ClusterLink::start(ClusterLinkConfig::new(group.addrs(), 9, 16)).unwrap();
    let key = RequestKey { session: 0, seq: 1 };
    submit(
        &mut link,
        key,
        Command::new(0, CommandBody::EndOfDay),
        &mut out,
    );
    collect_dones(&mut link, &mut out, 1);
    let leader = group.leader();
    assert_eq!(group.rt.block_on(group.nodes[leader].last_seq(9)), 4);
    drop(link);
    group.shutdown();
}

/// Submits one command with a fresh key unless the link refuses it for want of a quorum;
/// true if it was taken.
fn try_one(link: &mut ClusterLink, flow: &mut Flow, seq: &mut u64) -> bool {
    let key = RequestKey {
        session: 1,
        seq: *seq + 1,
    };
    match link.submit(key, Command::new(*seq, flow.next_command())) {
        Ok(()) => {
            *seq += 1;
            true
        }
        Err(SubmitError::NoQuorum) => false,
        // Taken by nothing: the next call tries again.
        Err(SubmitError::Full) => true,
        Err(SubmitError::Closed) => panic!("link closed: {:?}", link.status()),
    }
}

#[test]
fn without_a_quorum_new_commands_are_refused_and_the_window_is_not_resent_in_a_loop() {
    let mut group = Group::start();
    let leader = group.leader();
    let mut link = ClusterLink::start(ClusterLinkConfig::new(group.addrs(), 45, 512)).unwrap();
    let health = link.health();
    let mut flow = Flow::new(flow_config(45));
    let mut out = Vec::new();
    let setup = flow.setup();
    let mut seq = 0u64;
    for body in setup {
        seq += 1;
        let key = RequestKey { session: 1, seq };
        submit(&mut link, key, Command::new(seq, body), &mut out);
    }
    collect_dones(&mut link, &mut out, seq as usize);

    // Both followers go: the leader stays leader but nothing can commit.
    let leader_id = group.nodes[leader].id();
    let followers: Vec<Node> = {
        let mut kept = Vec::new();
        let mut gone = Vec::new();
        for n in std::mem::take(&mut group.nodes) {
            if n.id() == leader_id {
                kept.push(n);
            } else {
                gone.push(n);
            }
        }
        group.nodes = kept;
        gone
    };
    let follower_ids: Vec<u64> = followers.iter().map(|n| n.id()).collect();
    group.rt.block_on(async {
        for n in followers {
            n.shutdown().await;
        }
    });
    // Commands keep coming until the link refuses one with the reason (the leader answers
    // "no quorum" once its last quorum acknowledgement is older than the election timeout).
    let started = Instant::now();
    while try_one(&mut link, &mut flow, &mut seq) {
        assert!(
            started.elapsed() < LIMIT,
            "never refused: {:?}",
            link.status()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(health.no_quorum());
    // The leader says so in its status (what its monitor exports): it leads without a
    // quorum and has counted the refusal the link just heard.
    let status = group.rt.block_on(group.nodes[0].status_brief());
    assert!(
        status.quorum_lost_ms.is_some(),
        "status without quorum loss: {status:?}"
    );
    assert!(status.no_quorum_refusals >= 1, "{status:?}");
    let taken_during_outage = seq;
    // While it lasts, the link holds what it took and probes with one request at a time: no
    // more re-sends than probes, and every new command is refused at once.
    let (resent, probes) = (health.resent(), health.probes());
    let started = Instant::now();
    while health.probes() < probes + 3 {
        assert!(
            !try_one(&mut link, &mut flow, &mut seq),
            "taken without a quorum"
        );
        assert!(started.elapsed() < LIMIT, "no probe: {:?}", link.status());
        std::thread::sleep(Duration::from_millis(10));
    }
    let resent_during = health.resent() - resent;
    let probed_during = health.probes() - probes;
    assert!(
        resent_during <= probed_during,
        "{resent_during} re-sent for {probed_during} probes"
    );
    assert_eq!(seq, taken_during_outage);

    // The followers return: the link takes commands again, and every command it took, held
    // ones included, is done exactly once.
    group.rt.block_on(async {
        for id in follower_ids {
            group
                .nodes
                .push(Node::start(&group.config, id).await.unwrap());
        }
    });
    let started = Instant::now();
    while health.no_quorum() {
        assert!(
            started.elapsed() < LIMIT,
            "quorum not back: {:?}",
            link.status()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for _ in 0..20 {
        let key = RequestKey {
            session: 1,
            seq: seq + 1,
        };
        seq += 1;
        submit(
            &mut link,
            key,
            Command::new(seq, flow.next_command()),
            &mut out,
        );
    }
    collect_dones(&mut link, &mut out, seq as usize);
    let mut dones: Vec<u64> = out
        .iter()
        .filter_map(|o| match o {
            CoreOutput::Done { key } => Some(key.seq),
            _ => None,
        })
        .collect();
    dones.sort_unstable();
    assert_eq!(dones, (1..=seq).collect::<Vec<u64>>());
    drop(link);
    group.shutdown();
}
