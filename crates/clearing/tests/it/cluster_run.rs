//! A clearing run against a replicated core (three nodes over TCP): the state is fed from the
//! committed stream up to the cut, the run's movements are submitted through the sequenced
//! path, a run that dies after its first movement is restarted and applies nothing twice
//! (checked on the core's own balances), and a saved run replays onto a fresh state; a run
//! that finds an account's collateral below its initial margin issues one margin call through
//! the same path, which the core enforces until a deposit covers it; a debit the core refuses
//! is carried as the account's debt and collected by the next run.

use std::net::SocketAddr;
use std::time::Duration;

use bourse_clearing::{
    compute_run, execute, replay, run_client_id, stream_end, ClearingState, ExecuteOptions,
    MovementResult, RunKind, SettlementRule,
};
use bourse_cluster::{Client, ClusterConfig, Node, NodeId, StreamConsumer};
use bourse_core::*;
use bourse_engine::fixtures::future;

const DEADLINE: Duration = Duration::from_secs(20);
const FUT: u32 = 1;
const CASH_START: i128 = 1_000_000_0000;

fn addrs(config: &ClusterConfig) -> Vec<(NodeId, SocketAddr)> {
    config
        .nodes
        .iter()
        .map(|n| (n.id, n.addr.parse().unwrap()))
        .collect()
}

async fn submit(client: &mut Client, body: CommandBody) -> Vec<Event> {
    client
        .submit_for_events(&Command::new(1_000, body), DEADLINE)
        .await
        .expect("applied")
        .1
}

fn order(account: u32, id: u64, side: Side, price: i64, qty: i64) -> CommandBody {
    CommandBody::NewOrder(NewOrder {
        firm: None,
        account: AccountId(account),
        cl_ord_id: ClOrdId(id),
        instrument: InstrumentId(FUT),
        side,
        ord_type: OrdType::Limit,
        price: Price(price),
        qty: Qty(qty),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(0),
    })
}

/// The account's cash as the core has it: a deposit of one unit answers with the balance.
async fn core_cash(client: &mut Client, account: u32) -> i128 {
    let events = submit(
        client,
        CommandBody::Deposit {
            account: AccountId(account),
            amount: Cash(1),
        },
    )
    .await;
    match events[..] {
        [Event::CashChanged { cash, .. }] => cash.0 - 1,
        _ => panic!("a deposit answers with the balance: {events:?}"),
    }
}

/// Applied requests of `client_id` on the whole stream, by seq, with how often each was
/// applied.
async fn applied_requests(nodes: &[SocketAddr], client_id: u64) -> Vec<(u64, u32)> {
    let end = stream_end(nodes).await.unwrap();
    let mut consumer = StreamConsumer::remote(nodes.to_vec(), 0);
    let mut seen = std::collections::BTreeMap::new();
    while consumer.position() < end {
        let entry = consumer.next().await.unwrap();
        for r in entry.requests() {
            if r.key().0 == client_id && r.applied_here() {
                *seen.entry(r.key().1).or_insert(0) += 1;
            }
        }
    }
    seen.into_iter().collect()
}

/// A three-node core over TCP in `dir`.
async fn start_core(dir: &std::path::Path) -> (ClusterConfig, Vec<Node>) {
    let mut config = ClusterConfig::local(16, dir.to_path_buf(), bourse_testkit::free_ports());
    config.fsync = bourse_cluster::FsyncSetting::Never;
    config.orders_max = 1024;
    config.accounts_max = 64;
    let mut nodes = Vec::new();
    for n in &config.nodes {
        nodes.push(Node::start(&config, n.id).await.unwrap());
    }
    (config, nodes)
}

/// Adds account `a` (firm 1, may go short) with `cash`.
async fn add_account(client: &mut Client, a: u32, cash: i128) {
    let spec = AccountSpec {
        account: AccountId(a),
        firm: FirmId(1),
        may_short: true,
        stp: StpMode::None,
        stp_scope: StpScope::Account,
    };
    let events = submit(
        client,
        CommandBody::AddFundedAccount {
            spec,
            cash: Cash(cash),
        },
    )
    .await;
    assert!(
        matches!(
            events[..],
            [Event::AccountAdded { .. }, Event::CashChanged { .. }]
        ),
        "{events:?}"
    );
}

fn reject(events: &[Event]) -> Option<RejectReason> {
    events.iter().find_map(|e| match e {
        Event::OrderRejected { reason, .. } | Event::CommandRejected { reason, .. } => {
            Some(*reason)
        }
        _ => None,
    })
}

/// Waits until every node has applied its whole log, and returns their state hashes.
async fn replica_hashes(nodes: &[Node]) -> Vec<u64> {
    let started = std::time::Instant::now();
    loop {
        let mut statuses = Vec::new();
        for n in nodes {
            statuses.push(n.status().await);
        }
        let same_index = statuses
            .windows(2)
            .all(|w| w[0].last_applied_index == w[1].last_applied_index);
        let done = statuses
            .iter()
            .all(|s| s.last_applied_index.is_some() && s.last_applied_index == s.last_log_index);
        if same_index && done {
            return statuses.iter().map(|s| s.state_hash).collect();
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no convergence: {statuses:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_under_margined_account_gets_one_margin_call_the_core_enforces_until_a_deposit() {
    let dir = tempfile::tempdir().unwrap();
    let (config, nodes) = start_core(dir.path()).await;
    let group = addrs(&config);
    let stream_nodes: Vec<SocketAddr> = group.iter().map(|n| n.1).collect();
    let cores_streams = [stream_nodes.clone()];
    let mut trader = Client::new(group.clone(), 7, 1);
    let def = future(FUT, "FUT", 100_000);
    let im_per_lot = def.initial_margin.0;
    submit(&mut trader, CommandBody::AddInstrument(def.clone())).await;
    // Account 1 holds just enough for two lots' margin and 10 points more; 2 and 3 plenty.
    let point = 1_0000; // one price point on one lot, in cash units
    let thin = 2 * im_per_lot + 10 * point;
    add_account(&mut trader, 1, thin).await;
    add_account(&mut trader, 2, CASH_START).await;
    add_account(&mut trader, 3, CASH_START).await;
    // 1 buys 2 at 100,000 from 3; then 2 buys 1 from 3 at 99,000, where the run settles.
    submit(&mut trader, order(3, 1, Side::Sell, 100_000, 2)).await;
    submit(&mut trader, order(1, 2, Side::Buy, 100_000, 2)).await;
    submit(&mut trader, order(3, 3, Side::Sell, 99_000, 1)).await;
    let events = submit(&mut trader, order(2, 4, Side::Buy, 99_000, 1)).await;
    assert!(events.iter().any(|e| matches!(e, Event::Trade { .. })));

    let cut = stream_end(&stream_nodes).await.unwrap();
    let mut state = ClearingState::new(1, [def.clone()]);
    replay(&mut state, &cores_streams, &[], &[cut])
        .await
        .unwrap();
    let rule = SettlementRule {
        last_trades: 1,
        window_ns: None,
    };
    let plan = compute_run(&state, 5, RunKind::Intermediate, &rule);
    assert_eq!(plan.prices[&InstrumentId(FUT)], Price(99_000));
    // Account 1 loses 2 × 1,000 points, which its 10 points of free cash cannot pay: after
    // the movements its collateral is below the two lots' initial margin.
    let loss = 2 * 1_000 * point;
    let line = |a: u32| {
        *plan
            .initial_margin
            .iter()
            .find(|l| l.account == AccountId(a))
            .expect("a line per account with futures")
    };
    let l1 = line(1);
    assert_eq!(l1.initial_margin.0, 2 * im_per_lot);
    assert_eq!(l1.collateral.0, thin - loss);
    let call = 2 * im_per_lot - (thin - loss);
    assert_eq!(l1.call.0, call);
    assert_eq!(line(2).call.0, 0);
    assert_eq!(line(3).initial_margin.0, 3 * im_per_lot);
    assert_eq!(line(3).call.0, 0);
    let calls: Vec<_> = plan.initial_margin.iter().filter(|l| l.seq != 0).collect();
    assert_eq!(
        calls.len(),
        1,
        "exactly one margin call: {:?}",
        plan.initial_margin
    );
    // The call comes after the core's movements, under the run's keys.
    assert_eq!(calls[0].seq, plan.movements.len() as u64 + 1);

    // The run dies after its first command; restarted, and run a third time, it applies
    // every command once.
    let cores = [group.clone()];
    let stop = ExecuteOptions {
        stop_after: Some(1),
    };
    assert_eq!(execute(&plan, &cores, stop).await.unwrap().len(), 1);
    let full = execute(&plan, &cores, ExecuteOptions::default())
        .await
        .unwrap();
    let again = execute(&plan, &cores, ExecuteOptions::default())
        .await
        .unwrap();
    assert_eq!(again, full);
    let commands = plan.commands(0).len() as u64;
    assert_eq!(full.len() as u64, commands);
    let applied = applied_requests(&stream_nodes, run_client_id(5, 0)).await;
    assert_eq!(
        applied,
        (1..=commands).map(|seq| (seq, 1)).collect::<Vec<_>>(),
        "each command of the run applied once"
    );
    // The loser's withdrawal is refused by the core (it cannot pay); the call is applied.
    assert!(
        matches!(full[&(0, calls[0].seq)], MovementResult::Done { .. }),
        "{full:?}"
    );

    // Under the call: more exposure is refused with its own reason, a reducing sell passes.
    let ev = submit(&mut trader, order(1, 10, Side::Buy, 98_000, 1)).await;
    assert_eq!(reject(&ev), Some(RejectReason::MarginCallOpen), "{ev:?}");
    let ev = submit(&mut trader, order(1, 11, Side::Sell, 101_000, 1)).await;
    assert!(
        ev.iter().any(|e| matches!(e, Event::OrderAccepted { .. })),
        "{ev:?}"
    );
    // Clearing sees the call on the stream.
    let end = stream_end(&stream_nodes).await.unwrap();
    state.settle(&plan);
    replay(&mut state, &cores_streams, &[], &[end])
        .await
        .unwrap();
    assert_eq!(state.cash()[&(0, AccountId(1))].margin_called.0, call);

    // A deposit covering the call (and a lot's margin more) closes it; the buy then passes.
    let ev = submit(
        &mut trader,
        CommandBody::Deposit {
            account: AccountId(1),
            amount: Cash(call + im_per_lot),
        },
    )
    .await;
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::MarginCallSet {
                account: AccountId(1),
                amount: Cash(0),
                ..
            }
        )),
        "{ev:?}"
    );
    let ev = submit(&mut trader, order(1, 12, Side::Buy, 98_000, 1)).await;
    assert!(
        ev.iter().any(|e| matches!(e, Event::OrderAccepted { .. })),
        "{ev:?}"
    );

    // The next run finds no call open and no shortfall for account 1: it calls nothing.
    let end = stream_end(&stream_nodes).await.unwrap();
    replay(&mut state, &cores_streams, &[], &[end])
        .await
        .unwrap();
    assert_eq!(state.cash()[&(0, AccountId(1))].margin_called.0, 0);
    let next = compute_run(&state, 6, RunKind::Intermediate, &rule);
    assert!(
        next.initial_margin.iter().all(|l| l.seq == 0),
        "{:?}",
        next.initial_margin
    );

    // Every replica applied the same commands to the same state.
    let hashes = replica_hashes(&nodes).await;
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_restarted_after_a_crash_applies_every_movement_once() {
    let dir = tempfile::tempdir().unwrap();
    let (config, nodes) = start_core(dir.path()).await;
    let group = addrs(&config);
    let stream_nodes: Vec<SocketAddr> = group.iter().map(|n| n.1).collect();
    let cores_streams = [stream_nodes.clone()];

    // Four accounts trade a future: 1 and 2 buy, 3 and 4 sell, at several prices.
    let mut trader = Client::new(group.clone(), 7, 1);
    submit(
        &mut trader,
        CommandBody::AddInstrument(future(FUT, "FUT", 100_000)),
    )
    .await;
    for a in 1..=4 {
        submit(
            &mut trader,
            CommandBody::AddAccount(AccountSpec {
                account: AccountId(a),
                firm: FirmId(1),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            }),
        )
        .await;
        submit(
            &mut trader,
            CommandBody::Deposit {
                account: AccountId(a),
                amount: Cash(CASH_START),
            },
        )
        .await;
    }
    let fills = [
        (1, 3, 99_000, 5),
        (2, 4, 101_000, 3),
        (1, 4, 100_500, 2),
        (2, 3, 100_020, 4),
    ];
    let mut id = 0;
    for (buyer, seller, price, qty) in fills {
        id += 2;
        submit(&mut trader, order(seller, id, Side::Sell, price, qty)).await;
        let events = submit(&mut trader, order(buyer, id + 1, Side::Buy, price, qty)).await;
        assert!(
            events.iter().any(|e| matches!(e, Event::Trade { .. })),
            "{events:?}"
        );
    }

    // The cut: where the stream ends now. The state is fed up to it.
    let cut = stream_end(&stream_nodes).await.unwrap();
    let defs = [future(FUT, "FUT", 100_000)];
    let mut state = ClearingState::new(1, defs.clone());
    replay(&mut state, &cores_streams, &[], &[cut])
        .await
        .unwrap();
    assert_eq!(state.trades(), 4);
    let rule = SettlementRule {
        last_trades: 2,
        window_ns: None,
    };
    let plan = compute_run(&state, 3, RunKind::Intermediate, &rule);
    // VWAP of the last two trades: (100,500 × 2 + 100,020 × 4) / 6 = 100,180.
    assert_eq!(plan.prices[&InstrumentId(FUT)], Price(100_180));
    // Account 1 bought 5 at 99,000 and 2 at 100,500: (1,180 × 5 − 320 × 2) points.
    let vm_of = |a: u32| {
        plan.margin
            .iter()
            .filter(|l| l.account == AccountId(a))
            .map(|l| l.vm.0)
            .sum::<i128>()
    };
    assert_eq!(vm_of(1), (1_180 * 5 - 320 * 2) * 1_0000);
    assert_eq!((1..=4).map(vm_of).sum::<i128>(), 0);
    assert_eq!(plan.movements.len(), 4);

    // The run dies after its first movement; the restarted run submits the other three.
    let cores = [group.clone()];
    let partial = execute(
        &plan,
        &cores,
        ExecuteOptions {
            stop_after: Some(1),
        },
    )
    .await
    .unwrap();
    assert_eq!(partial.len(), 1);
    let full = execute(&plan, &cores, ExecuteOptions::default())
        .await
        .unwrap();
    assert_eq!(full.len(), 4);
    assert!(
        full.values()
            .all(|r| matches!(r, MovementResult::Done { .. })),
        "{full:?}"
    );
    // A third attempt finds everything done and submits nothing.
    let again = execute(&plan, &cores, ExecuteOptions::default())
        .await
        .unwrap();
    assert_eq!(again, full);

    let run_client = run_client_id(3, 0);
    let applied = applied_requests(&stream_nodes, run_client).await;
    assert_eq!(
        applied,
        vec![(1, 1), (2, 1), (3, 1), (4, 1)],
        "each movement applied once"
    );
    let mut checker = Client::new(group.clone(), 8, 1);
    for a in 1..=4 {
        let cash = core_cash(&mut checker, a).await;
        assert_eq!(cash, CASH_START + vm_of(a), "account {a} on the core");
    }

    // A fresh clearing state replays the saved run and reaches the same state; with no
    // trade since, a second run owes nothing.
    let end = stream_end(&stream_nodes).await.unwrap();
    let mut replayed = ClearingState::new(1, defs);
    replay(
        &mut replayed,
        &cores_streams,
        std::slice::from_ref(&plan),
        &[end],
    )
    .await
    .unwrap();
    state.settle(&plan);
    replay(&mut state, &cores_streams, &[], &[end])
        .await
        .unwrap();
    assert_eq!(replayed.state_hash(), state.state_hash());
    let next = compute_run(&replayed, 4, RunKind::EndOfDay, &rule);
    assert!(next.movements.is_empty(), "{next:?}");
    for a in 1..=4 {
        // The mirror of each balance follows the core's own figure (plus the checker's unit).
        assert_eq!(
            replayed.cash()[&(0, AccountId(a))].cash.0,
            CASH_START + vm_of(a) + 1
        );
    }

    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpaid_variation_margin_debit_is_carried_called_and_collected_by_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let (config, nodes) = start_core(dir.path()).await;
    let group = addrs(&config);
    let stream_nodes: Vec<SocketAddr> = group.iter().map(|n| n.1).collect();
    let cores_streams = [stream_nodes.clone()];
    let cores = [group.clone()];
    let mut trader = Client::new(group.clone(), 7, 1);
    let def = future(FUT, "FUT", 100_000);
    let im = def.initial_margin.0;
    submit(&mut trader, CommandBody::AddInstrument(def.clone())).await;
    // Account 1 holds two lots' margin and 10 points more; 3 plenty.
    let point = 1_0000;
    let thin = 2 * im + 10 * point;
    add_account(&mut trader, 1, thin).await;
    add_account(&mut trader, 3, CASH_START).await;
    // 1 buys 2 at 100,000 from 3; then 3 sells 1 to 2 at 99,000, where the run settles.
    submit(&mut trader, order(3, 1, Side::Sell, 100_000, 2)).await;
    submit(&mut trader, order(1, 2, Side::Buy, 100_000, 2)).await;
    add_account(&mut trader, 2, CASH_START).await;
    submit(&mut trader, order(3, 3, Side::Sell, 99_000, 1)).await;
    submit(&mut trader, order(2, 4, Side::Buy, 99_000, 1)).await;
    let rule = SettlementRule {
        last_trades: 1,
        window_ns: None,
    };
    let mut state = ClearingState::new(1, [def.clone()]);
    let cut = stream_end(&stream_nodes).await.unwrap();
    replay(&mut state, &cores_streams, &[], &[cut])
        .await
        .unwrap();

    // Run 5: account 1 owes 2 × 1,000 points and has 10 points free. Its debit is refused,
    // once, however often the run is restarted.
    let loss = 2 * 1_000 * point;
    let run5 = compute_run(&state, 5, RunKind::Intermediate, &rule);
    let debit = run5
        .movements
        .iter()
        .find(|m| m.account == AccountId(1))
        .copied()
        .unwrap();
    assert_eq!(debit.amount.0, -loss);
    let stop = ExecuteOptions {
        stop_after: Some(1),
    };
    assert_eq!(execute(&run5, &cores, stop).await.unwrap().len(), 1);
    let full = execute(&run5, &cores, ExecuteOptions::default())
        .await
        .unwrap();
    assert_eq!(
        execute(&run5, &cores, ExecuteOptions::default())
            .await
            .unwrap(),
        full
    );
    assert!(
        matches!(
            full[&(0, debit.seq)],
            MovementResult::Refused {
                reason: RejectReason::InsufficientFreeCash,
                ..
            }
        ),
        "{full:?}"
    );
    let commands = run5.commands(0).len() as u64;
    assert_eq!(
        applied_requests(&stream_nodes, run_client_id(5, 0)).await,
        (1..=commands).map(|seq| (seq, 1)).collect::<Vec<_>>()
    );

    // Clearing carries the debt; the call is what makes the next debit payable.
    state.settle(&run5);
    let end = stream_end(&stream_nodes).await.unwrap();
    replay(&mut state, &cores_streams, &[], &[end])
        .await
        .unwrap();
    assert_eq!(state.debts()[&(0, AccountId(1))].0, loss);
    assert_eq!(
        state.cash()[&(0, AccountId(1))].cash.0,
        thin,
        "nothing was taken"
    );
    let call = 2 * im - (thin - loss);
    assert_eq!(state.cash()[&(0, AccountId(1))].margin_called.0, call);

    // Under the call the account can neither add exposure nor take cash out.
    let ev = submit(&mut trader, order(1, 10, Side::Buy, 98_000, 1)).await;
    assert_eq!(reject(&ev), Some(RejectReason::MarginCallOpen), "{ev:?}");
    let ev = submit(
        &mut trader,
        CommandBody::Withdraw {
            account: AccountId(1),
            amount: Cash(1),
        },
    )
    .await;
    assert_eq!(reject(&ev), Some(RejectReason::MarginCallOpen), "{ev:?}");

    // It deposits the call, which closes it.
    let ev = submit(
        &mut trader,
        CommandBody::Deposit {
            account: AccountId(1),
            amount: Cash(call),
        },
    )
    .await;
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::MarginCallSet {
                amount: Cash(0),
                ..
            }
        )),
        "{ev:?}"
    );

    // Run 6 collects the debt (restarted half way, still once), calls nothing, and leaves
    // the account exactly its initial margin.
    let end = stream_end(&stream_nodes).await.unwrap();
    replay(&mut state, &cores_streams, &[], &[end])
        .await
        .unwrap();
    let run6 = compute_run(&state, 6, RunKind::Intermediate, &rule);
    assert_eq!(run6.debts.len(), 1);
    assert_eq!(run6.debts[0].amount.0, loss);
    let collect = run6
        .movements
        .iter()
        .find(|m| m.account == AccountId(1))
        .copied()
        .unwrap();
    assert_eq!(collect.amount.0, -loss);
    assert!(run6
        .initial_margin
        .iter()
        .all(|l| l.seq == 0 && l.call.0 == 0));
    assert_eq!(execute(&run6, &cores, stop).await.unwrap().len(), 1);
    let full = execute(&run6, &cores, ExecuteOptions::default())
        .await
        .unwrap();
    assert!(
        full.values()
            .all(|r| matches!(r, MovementResult::Done { .. })),
        "{full:?}"
    );
    let commands = run6.commands(0).len() as u64;
    assert_eq!(
        applied_requests(&stream_nodes, run_client_id(6, 0)).await,
        (1..=commands).map(|seq| (seq, 1)).collect::<Vec<_>>()
    );
    state.settle(&run6);
    let end = stream_end(&stream_nodes).await.unwrap();
    replay(&mut state, &cores_streams, &[], &[end])
        .await
        .unwrap();
    assert!(state.debts().is_empty(), "{:?}", state.debts());
    assert_eq!(state.cash()[&(0, AccountId(1))].cash.0, 2 * im);
    let run7 = compute_run(&state, 7, RunKind::Intermediate, &rule);
    assert!(run7.movements.is_empty() && run7.debts.is_empty());

    // A clearing rebuilt from the streams and the two saved runs reaches the same state,
    // and every replica of the core applied the same commands.
    let mut rebuilt = ClearingState::new(1, [def.clone()]);
    replay(
        &mut rebuilt,
        &cores_streams,
        &[run5.clone(), run6.clone()],
        &[end],
    )
    .await
    .unwrap();
    assert_eq!(rebuilt.state_hash(), state.state_hash());
    let hashes = replica_hashes(&nodes).await;
    assert!(hashes.windows(2).all(|w| w[0] == w[1]), "{hashes:?}");
    for n in nodes {
        n.shutdown().await;
    }
}
