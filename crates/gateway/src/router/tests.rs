//! The router against a fake link per core: a test double that records what the router
//! submits and hands back the outputs the test feeds it, so every answer is deterministic.

use super::*;
use std::sync::{Arc, Mutex};

const CONFIG: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"

[[cores]]
name = "equities"
instruments = [1]
in_process = true

[[cores]]
name = "fx"
instruments = [2]
in_process = true

[[instruments]]
instrument = 1
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 10
band_bps = 2000
reference_price = 25000

[[instruments]]
instrument = 2
symbol = "EURUSD"
market = "fx"
price_scale = 5
tick = 1
lot_size = 1000
band_bps = 500
reference_price = 108000

[[accounts]]
account = 101
firm = 1
cash = 100000000000

[[accounts]]
account = 201
firm = 2
cash = 100000000000

[[fix_sessions]]
client_comp_id = "ALPHA"
firm = 1
accounts = [101]

[[fix_sessions]]
client_comp_id = "BETA"
firm = 2
accounts = [201]

[[fix_sessions]]
client_comp_id = "ALPHA2"
firm = 1
accounts = [101]
"#;

const ALPHA: SessionRef = SessionRef(0);
const BETA: SessionRef = SessionRef(1);
/// A second session of ALPHA's firm, sharing its account.
const ALPHA2: SessionRef = SessionRef(2);

/// What one fake core saw and what it will answer.
#[derive(Default)]
struct FakeCore {
    submitted: Vec<(RequestKey, Command)>,
    outputs: VecDeque<CoreOutput>,
    /// Answer every submission `Full`, as a link whose queue is full does.
    full: bool,
    /// Answer every submission `NoQuorum`, as the link of a group without a quorum does.
    no_quorum: bool,
}

/// A `CoreLink` over a shared [`FakeCore`] the test keeps a handle to.
struct FakeLink(Arc<Mutex<FakeCore>>);

impl CoreLink for FakeLink {
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError> {
        let mut core = self.0.lock().unwrap();
        if core.full {
            return Err(SubmitError::Full);
        }
        if core.no_quorum {
            return Err(SubmitError::NoQuorum);
        }
        core.submitted.push((key, command));
        Ok(())
    }

    fn try_recv(&mut self) -> Option<CoreOutput> {
        self.0.lock().unwrap().outputs.pop_front()
    }

    fn set_notify(&mut self, _notify: Arc<dyn Fn() + Send + Sync>) {}
}

struct Fixture {
    router: Router,
    cores: Vec<Arc<Mutex<FakeCore>>>,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with_config(CONFIG)
    }

    fn with_config(toml: &str) -> Fixture {
        let config = GatewayConfig::from_toml(toml).unwrap();
        let cores: Vec<Arc<Mutex<FakeCore>>> = (0..config.core_plan().len())
            .map(|_| Arc::default())
            .collect();
        let links = cores
            .iter()
            .map(|c| Box::new(FakeLink(Arc::clone(c))) as Box<dyn CoreLink>)
            .collect();
        Fixture {
            router: Router::new(&config, links),
            cores,
        }
    }

    /// What core `core` was sent so far, and forgets it.
    fn take_submitted(&self, core: usize) -> Vec<(RequestKey, Command)> {
        std::mem::take(&mut self.cores[core].lock().unwrap().submitted)
    }

    /// Core `core` answers `key` with `events`, then `Done`; the router takes it all in.
    fn answer(&mut self, core: usize, key: RequestKey, events: &[Event]) {
        {
            let mut c = self.cores[core].lock().unwrap();
            for &event in events {
                c.outputs.push_back(CoreOutput::Event { key, event });
            }
            c.outputs.push_back(CoreOutput::Done { key });
        }
        self.router.poll_core(usize::MAX);
    }

    fn reports(&mut self) -> Vec<(SessionRef, Report)> {
        self.router.take_outbox()
    }

    /// Submits a limit order of `qty_lots` at `price` for the session and returns the key
    /// and the command the core received.
    fn new_order(
        &mut self,
        sref: SessionRef,
        client: u64,
        instrument: u32,
        side: Side,
        price: i64,
        qty_lots: i64,
    ) -> (RequestKey, NewOrder) {
        self.router.handle(
            sref,
            Request::New(NewOrderRequest {
                client: ClientId::Num(client),
                account: None,
                instrument: InstrumentId(instrument),
                side,
                ord_type: OrdType::Limit,
                price: Price(price),
                qty_lots,
                tif: TimeInForce::Day,
                expire_ts_ns: 0,
                display_lots: 0,
            }),
            1,
        );
        let core = (instrument - 1) as usize;
        let mut sent = self.take_submitted(core);
        assert_eq!(sent.len(), 1, "one command to core {core}");
        let (key, command) = sent.remove(0);
        let CommandBody::NewOrder(order) = command.body else {
            panic!("not a new order: {command:?}");
        };
        (key, order)
    }

    /// A new order the core accepts as `order_id`; its report is taken.
    #[allow(clippy::too_many_arguments)]
    fn accepted(
        &mut self,
        sref: SessionRef,
        client: u64,
        instrument: u32,
        side: Side,
        price: i64,
        qty_lots: i64,
        order_id: u64,
    ) -> NewOrder {
        let (key, order) = self.new_order(sref, client, instrument, side, price, qty_lots);
        let accepted = Event::OrderAccepted {
            order_id: OrderId(order_id),
            account: order.account,
            cl_ord_id: order.cl_ord_id,
            instrument: order.instrument,
            side,
            price: order.price,
            qty: order.qty,
            ts_ns: 2,
        };
        self.answer((instrument - 1) as usize, key, &[accepted]);
        let reports = self.reports();
        assert!(
            matches!(&reports[..], [(s, Report::Exec(r))] if *s == sref && r.kind == ExecKind::New),
            "{reports:?}"
        );
        order
    }
}

fn fill(order_id: u64, account: u32, filled: i64, leaves: i64) -> Fill {
    Fill {
        order_id: OrderId(order_id),
        account: AccountId(account),
        cl_ord_id: ClOrdId(0),
        qty_leaves: Qty(leaves),
        qty_filled: Qty(filled),
    }
}

fn trade(id: u64, price: i64, qty: i64, buy: Fill, sell: Fill) -> Event {
    Event::Trade {
        trade_id: TradeId(id),
        instrument: InstrumentId(1),
        price: Price(price),
        qty: Qty(qty),
        aggressor: Side::Buy,
        buy,
        sell,
        auction: false,
        ts_ns: 3,
    }
}

#[test]
fn a_new_order_goes_to_the_core_of_its_instrument() {
    let mut f = Fixture::new();
    let (key, order) = f.new_order(ALPHA, 1, 2, Side::Buy, 108_000, 5);
    assert_eq!(order.instrument, InstrumentId(2));
    assert_eq!(order.account, AccountId(101));
    assert_eq!(key.session, 1);
    assert!(f.take_submitted(0).is_empty());
    let (_, order) = f.new_order(ALPHA, 2, 1, Side::Sell, 25_000, 3);
    assert_eq!(order.instrument, InstrumentId(1));
    assert!(f.take_submitted(1).is_empty());
    assert_eq!(f.router.core_in_flight(0), 1);
    assert_eq!(f.router.core_in_flight(1), 1);
}

#[test]
fn a_cancel_and_a_replace_go_to_the_core_of_their_order() {
    let mut f = Fixture::new();
    let order = f.accepted(ALPHA, 1, 2, Side::Buy, 108_000, 5, 7);
    f.router.handle(
        ALPHA,
        Request::Replace {
            client: ClientId::Num(2),
            orig: ClientId::Num(1),
            order_id: None,
            price: Some(Price(108_001)),
            qty_lots: None,
        },
        4,
    );
    let sent = f.take_submitted(1);
    let [(
        _,
        Command {
            body: CommandBody::Replace(r),
            ..
        },
    )] = &sent[..]
    else {
        panic!("{sent:?}");
    };
    assert_eq!(r.target.orig_cl_ord_id, Some(order.cl_ord_id));
    assert_eq!(r.price, Some(Price(108_001)));
    f.router.handle(
        ALPHA,
        Request::Cancel {
            client: ClientId::Num(3),
            orig: ClientId::Num(1),
            order_id: Some(OrderId(7)),
        },
        5,
    );
    let sent = f.take_submitted(1);
    assert!(
        matches!(&sent[..], [(_, Command { body: CommandBody::Cancel(c), .. })]
            if c.target.orig_cl_ord_id == Some(order.cl_ord_id)),
        "{sent:?}"
    );
    assert!(f.take_submitted(0).is_empty());
}

#[test]
fn a_cancel_of_an_unknown_order_is_rejected_without_reaching_a_core() {
    let mut f = Fixture::new();
    f.router.handle(
        ALPHA,
        Request::Cancel {
            client: ClientId::Num(3),
            orig: ClientId::Num(99),
            order_id: None,
        },
        5,
    );
    assert!(f.take_submitted(0).is_empty() && f.take_submitted(1).is_empty());
    let reports = f.reports();
    assert!(
        matches!(&reports[..], [(ALPHA, Report::CancelReject { cause, .. })]
            if *cause == RejectCause::Gateway(GatewayReject::UnknownOrder)),
        "{reports:?}"
    );
}

/// FIX MassCancelRequestType 7 for every account of the session, on every core.
fn all_accounts_mass_cancel() -> Request {
    Request::MassCancel {
        client: ClientId::Num(9),
        request_type: 7,
        scope: MassCancelScope::Account,
        account: None,
        instrument: None,
        side: None,
    }
}

#[test]
fn an_account_mass_cancel_reaches_every_core_and_is_answered_once_with_the_sum() {
    let mut f = Fixture::new();
    f.router.handle(ALPHA, all_accounts_mass_cancel(), 6);
    let first = f.take_submitted(0);
    let second = f.take_submitted(1);
    assert_eq!((first.len(), second.len()), (1, 1));
    for (_, c) in first.iter().chain(&second) {
        assert!(matches!(c.body, CommandBody::MassCancel(m) if m.account == Some(AccountId(101))));
    }
    let done = |n| Event::MassCancelDone {
        cl_ord_id: ClOrdId(0),
        orders_cancelled: n,
        ts_ns: 7,
    };
    f.answer(0, first[0].0, &[done(2)]);
    assert!(
        f.reports().is_empty(),
        "no report before every core answered"
    );
    f.answer(1, second[0].0, &[done(3)]);
    let reports = f.reports();
    assert!(
        matches!(
            &reports[..],
            [(
                ALPHA,
                Report::MassCancel {
                    total: 5,
                    reject: None,
                    request_type: 7,
                    ..
                }
            )]
        ),
        "{reports:?}"
    );
}

#[test]
fn a_session_mass_cancel_cancels_its_own_orders_and_counts_what_it_reports() {
    let mut f = Fixture::new();
    f.accepted(ALPHA, 1, 1, Side::Buy, 25_000, 1, 11);
    f.accepted(ALPHA, 2, 2, Side::Sell, 108_000, 1, 12);
    f.accepted(ALPHA2, 1, 1, Side::Buy, 25_000, 1, 13);
    f.router.handle(
        ALPHA,
        Request::MassCancel {
            client: ClientId::Num(9),
            request_type: b'7',
            scope: MassCancelScope::Session,
            account: None,
            instrument: None,
            side: None,
        },
        6,
    );
    // One cancel per own order, on its core; none for ALPHA2's order in the same account.
    let first = f.take_submitted(0);
    let second = f.take_submitted(1);
    assert_eq!((first.len(), second.len()), (1, 1));
    assert!(first
        .iter()
        .chain(&second)
        .all(|(_, c)| matches!(c.body, CommandBody::Cancel(_))));
    let cancelled = Event::OrderCancelled {
        order_id: OrderId(11),
        account: AccountId(101),
        cl_ord_id: ClOrdId(0),
        instrument: InstrumentId(1),
        side: Side::Buy,
        qty_cancelled: Qty(1),
        reason: CancelReason::MassCancel,
        ts_ns: 7,
    };
    f.answer(0, first[0].0, &[cancelled]);
    // The other order filled before its cancel arrived: nothing to cancel, nothing counted.
    let too_late = Event::CancelRejected {
        account: AccountId(101),
        cl_ord_id: ClOrdId(0),
        order_id: Some(OrderId(12)),
        response_to: CancelRejectTo::Cancel,
        reason: RejectReason::UnknownOrder,
        ts_ns: 7,
    };
    f.answer(1, second[0].0, &[too_late]);
    let reports = f.reports();
    let execs = reports
        .iter()
        .filter(|(s, r)| {
            *s == ALPHA
                && matches!(r, Report::Exec(e) if matches!(e.kind, ExecKind::Canceled { .. }))
        })
        .count();
    assert_eq!(execs, 1, "{reports:?}");
    assert!(reports.iter().all(|(s, _)| *s == ALPHA), "{reports:?}");
    assert!(
        matches!(
            reports.last(),
            Some((
                ALPHA,
                Report::MassCancel {
                    total: 1,
                    reject: None,
                    ..
                }
            ))
        ),
        "{reports:?}"
    );
    // A session with no live order is answered at once: total 0, not a reject.
    f.router.handle(
        BETA,
        Request::MassCancel {
            client: ClientId::Num(10),
            request_type: b'7',
            scope: MassCancelScope::Session,
            account: None,
            instrument: None,
            side: None,
        },
        8,
    );
    assert!(f.take_submitted(0).is_empty() && f.take_submitted(1).is_empty());
    let reports = f.reports();
    assert!(
        matches!(
            &reports[..],
            [(
                BETA,
                Report::MassCancel {
                    total: 0,
                    reject: None,
                    ..
                }
            )]
        ),
        "{reports:?}"
    );
}

#[test]
fn fills_add_up_to_the_cumulative_quantity_and_notional_of_the_order() {
    let mut f = Fixture::new();
    f.accepted(ALPHA, 1, 1, Side::Buy, 25_010, 10, 7);
    let (key, _) = f.new_order(BETA, 1, 1, Side::Sell, 25_000, 4);
    f.answer(
        0,
        key,
        &[trade(1, 25_000, 4, fill(7, 101, 4, 6), fill(8, 201, 4, 0))],
    );
    let (key, _) = f.new_order(BETA, 2, 1, Side::Sell, 25_010, 6);
    f.answer(
        0,
        key,
        &[trade(2, 25_010, 6, fill(7, 101, 10, 0), fill(9, 201, 6, 0))],
    );
    let alpha: Vec<ExecReport> = f
        .reports()
        .into_iter()
        .filter_map(|(s, r)| match r {
            Report::Exec(e) if s == ALPHA => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(alpha.len(), 2, "{alpha:?}");
    assert_eq!((alpha[0].cum_lots, alpha[0].leaves_lots), (4, 6));
    assert_eq!((alpha[1].cum_lots, alpha[1].leaves_lots), (10, 0));
    let notional = 4 * 25_000 + 6 * 25_010;
    assert_eq!(alpha[1].notional, notional);
    // The average price a front end renders: notional over the filled quantity.
    assert_eq!(alpha[1].notional / 10, 25_006);
    assert!(matches!(
        alpha[1].kind,
        ExecKind::Trade { last_lots: 6, .. }
    ));
    // Filled, the order is no longer live but its status is still known.
    assert_eq!(f.router.tracked_orders(), 0);
    f.router.handle(
        ALPHA,
        Request::Status {
            client: Some(ClientId::Num(1)),
            order_id: None,
            symbol: None,
            side: None,
            status_req_id: None,
        },
        8,
    );
    let reports = f.reports();
    assert!(
        matches!(&reports[..], [(ALPHA, Report::Exec(e))]
            if e.kind == ExecKind::Status(StatusQuery {
                status_req_id: None,
                mass: None,
                pending_new: false,
                finished: Some(Finished::Filled),
            }) && e.cum_lots == 10),
        "{reports:?}"
    );
}

#[test]
fn a_status_request_answers_from_the_order_table() {
    let mut f = Fixture::new();
    f.accepted(ALPHA, 1, 1, Side::Buy, 25_010, 10, 7);
    let status = |client| Request::Status {
        client: Some(ClientId::Num(client)),
        order_id: None,
        symbol: None,
        side: None,
        status_req_id: Some("S1".into()),
    };
    f.router.handle(ALPHA, status(1), 8);
    let reports = f.reports();
    assert!(
        matches!(&reports[..], [(ALPHA, Report::Exec(e))]
            if e.order_id == Some(OrderId(7)) && e.leaves_lots == 10
                && matches!(&e.kind, ExecKind::Status(q) if q.finished.is_none() && !q.pending_new)),
        "{reports:?}"
    );
    // Another session cannot see the order, and an unknown id is answered as such.
    f.router.handle(BETA, status(1), 9);
    f.router.handle(ALPHA, status(2), 9);
    let reports = f.reports();
    assert!(
        matches!(
            &reports[..],
            [
                (BETA, Report::StatusUnknown { .. }),
                (ALPHA, Report::StatusUnknown { .. })
            ]
        ),
        "{reports:?}"
    );
}

#[test]
fn the_finished_orders_kept_are_the_newest_up_to_the_configured_bound() {
    let config = CONFIG.replace(
        "fix_listen = \"127.0.0.1:0\"",
        "fix_listen = \"127.0.0.1:0\"\nfinished_orders_kept = 3",
    );
    let mut f = Fixture::with_config(&config);
    let finished = |n: u64| SavedOrder {
        session: "FIX ALPHA".into(),
        order_id: OrderId(n),
        client: ClientId::Num(n),
        internal: ClOrdId(n),
        core: 0,
        account: AccountId(101),
        instrument: InstrumentId(1),
        side: Side::Buy,
        ord_type: OrdType::Limit,
        tif: TimeInForce::Day,
        price: Price(25_000),
        qty_lots: 1,
        cum_lots: 1,
        notional: 25_000,
        finished: Some(Finished::Filled),
    };
    let dropped = f.router.import_state(RouterState {
        next_internal: 10,
        positions: vec![None, None],
        live: Vec::new(),
        finished: (1..=5).map(finished).collect(),
        instruments: Vec::new(),
    });
    assert_eq!(dropped, 0);
    assert_eq!(f.router.finished_orders(), 3);
    let kept: Vec<u64> = f
        .router
        .export_state()
        .finished
        .iter()
        .map(|o| o.order_id.0)
        .collect();
    assert_eq!(kept, [3, 4, 5], "the oldest are forgotten first");
    // The default is unchanged.
    let f = Fixture::new();
    assert_eq!(f.router.finished_orders_kept, FINISHED_ORDERS_KEPT);
}

#[test]
fn finished_orders_bytes_follow_the_kept_orders_and_their_text_ids() {
    let config = CONFIG.replace(
        "fix_listen = \"127.0.0.1:0\"",
        "fix_listen = \"127.0.0.1:0\"\nfinished_orders_kept = 3",
    );
    let mut f = Fixture::with_config(&config);
    assert_eq!(f.router.finished_text_bytes, 0);
    let finished = |n: u64| SavedOrder {
        session: "FIX ALPHA".into(),
        order_id: OrderId(n),
        // Seven characters each.
        client: ClientId::Text(format!("order-{n}").into_boxed_str()),
        internal: ClOrdId(n),
        core: 0,
        account: AccountId(101),
        instrument: InstrumentId(1),
        side: Side::Buy,
        ord_type: OrdType::Limit,
        tif: TimeInForce::Day,
        price: Price(25_000),
        qty_lots: 1,
        cum_lots: 1,
        notional: 25_000,
        finished: Some(Finished::Filled),
    };
    let dropped = f.router.import_state(RouterState {
        next_internal: 10,
        positions: vec![None, None],
        live: Vec::new(),
        finished: (1..=5).map(finished).collect(),
        instruments: Vec::new(),
    });
    assert_eq!(dropped, 0);
    // The three kept orders' ids, not the two forgotten ones'.
    assert_eq!(f.router.finished_text_bytes, 21);
    let bytes = f.router.finished_orders_bytes();
    let entry = std::mem::size_of::<(OrderId, (OrderState, Finished))>();
    assert!(bytes >= 3 * entry + 2 * 21, "{bytes}");
}

fn limit_order(client: u64, instrument: u32) -> Request {
    Request::New(NewOrderRequest {
        client: ClientId::Num(client),
        account: None,
        instrument: InstrumentId(instrument),
        side: Side::Buy,
        ord_type: OrdType::Limit,
        price: Price(25_000),
        qty_lots: 1,
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_lots: 0,
    })
}

#[test]
fn past_core_in_flight_max_every_request_is_refused_busy_and_each_gets_one_answer() {
    let config = CONFIG.replace(
        "fix_listen = \"127.0.0.1:0\"\n",
        "fix_listen = \"127.0.0.1:0\"\ncore_in_flight_max = 3\n",
    );
    let mut f = Fixture::with_config(&config);
    // Ten orders to a core that answers none of them yet: three go in, seven are refused.
    for client in 1..=10 {
        f.router.handle(ALPHA, limit_order(client, 1), 1);
    }
    let sent = f.take_submitted(0);
    assert_eq!(sent.len(), 3);
    assert_eq!(f.router.core_in_flight(0), 3);
    let reports = f.reports();
    let busy: Vec<u64> = reports
        .iter()
        .filter_map(|(s, r)| match r {
            Report::Exec(e)
                if *s == ALPHA
                    && e.kind
                        == ExecKind::Rejected(RejectCause::Gateway(GatewayReject::SystemBusy)) =>
            {
                Some(e.client.num())
            }
            _ => None,
        })
        .collect();
    assert_eq!(busy, (4..=10).collect::<Vec<u64>>(), "{reports:?}");
    assert_eq!(
        reports.len(),
        7,
        "nothing but the refusals yet: {reports:?}"
    );
    // On the binary protocol a refusal is a BusinessReject(SystemUnavailable) naming the
    // request, not an OrderReject (docs/protocol-binary-order-entry.md, 6.7).
    let mut frame = [0u8; bourse_wire::order_entry::FRAME_BYTES_MAX];
    let version = bourse_wire::order_entry::SCHEMA_VERSION;
    let decoded = rendered(&f, &reports[0].1, version, &mut frame);
    let bourse_wire::order_entry::Message::BusinessReject(m) = decoded else {
        panic!("not a business reject: {decoded:?}")
    };
    assert_eq!(m.ref_cl_ord_id(), Some(4));
    assert_eq!(
        m.reason(),
        bourse_wire::order_entry::codec::business_reject_reason::BusinessRejectReason::SystemUnavailable
    );
    assert_eq!(m.ref_template_id(), 100);
    assert_eq!(f.router.counters().busy_rejects, 7);
    // The other core is not affected by this one's overload.
    f.router.handle(ALPHA, limit_order(11, 2), 1);
    assert_eq!(f.take_submitted(1).len(), 1);
    // One answer frees one place: the next order goes in, the one after is refused.
    let (key, command) = sent[0].clone();
    let CommandBody::NewOrder(order) = command.body else {
        panic!("not a new order")
    };
    f.answer(
        0,
        key,
        &[Event::OrderAccepted {
            order_id: OrderId(1),
            account: order.account,
            cl_ord_id: order.cl_ord_id,
            instrument: order.instrument,
            side: Side::Buy,
            price: order.price,
            qty: order.qty,
            ts_ns: 2,
        }],
    );
    f.router.handle(ALPHA, limit_order(12, 1), 1);
    f.router.handle(ALPHA, limit_order(13, 1), 1);
    assert_eq!(f.take_submitted(0).len(), 1);
    assert_eq!(f.router.counters().busy_rejects, 8);
    let kinds: Vec<(u64, bool)> = f
        .reports()
        .iter()
        .filter_map(|(_, r)| match r {
            Report::Exec(e) => Some((e.client.num(), e.kind == ExecKind::New)),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, vec![(1, true), (13, false)]);
}

#[test]
fn a_full_link_is_answered_system_busy() {
    let mut f = Fixture::new();
    f.cores[0].lock().unwrap().full = true;
    f.router.handle(
        ALPHA,
        Request::New(NewOrderRequest {
            client: ClientId::Num(1),
            account: None,
            instrument: InstrumentId(1),
            side: Side::Buy,
            ord_type: OrdType::Limit,
            price: Price(25_000),
            qty_lots: 1,
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_lots: 0,
        }),
        1,
    );
    let reports = f.reports();
    assert!(
        matches!(&reports[..], [(ALPHA, Report::Exec(e))]
            if e.kind == ExecKind::Rejected(RejectCause::Gateway(GatewayReject::SystemBusy))),
        "{reports:?}"
    );
    assert_eq!(f.router.counters().busy_rejects, 1);
    assert_eq!(f.router.pending_requests(), 0);
    // The client id is free again: the same order goes through once the core has room.
    f.cores[0].lock().unwrap().full = false;
    let (_, order) = f.new_order(ALPHA, 1, 1, Side::Buy, 25_000, 1);
    assert_eq!(order.qty, Qty(1));
}

#[test]
fn events_of_another_session_are_routed_to_the_owner_by_order_id() {
    let mut f = Fixture::new();
    f.accepted(ALPHA, 1, 1, Side::Buy, 25_000, 10, 7);
    // BETA's order trades against ALPHA's resting one: the core sends the trade under
    // BETA's key, and ALPHA gets its fill.
    let (key, _) = f.new_order(BETA, 1, 1, Side::Sell, 25_000, 10);
    f.answer(
        0,
        key,
        &[trade(
            1,
            25_000,
            10,
            fill(7, 101, 10, 0),
            fill(8, 201, 10, 0),
        )],
    );
    let reports = f.reports();
    let to_alpha = reports.iter().filter(|(s, _)| *s == ALPHA).count();
    assert_eq!(to_alpha, 1, "{reports:?}");
    // And a cancel by someone else (a foreign key the router never issued) too.
    f.accepted(ALPHA, 2, 1, Side::Buy, 24_000, 5, 9);
    let foreign = RequestKey {
        session: u32::MAX,
        seq: 0,
    };
    f.cores[0]
        .lock()
        .unwrap()
        .outputs
        .push_back(CoreOutput::Event {
            key: foreign,
            event: Event::OrderCancelled {
                order_id: OrderId(9),
                account: AccountId(101),
                cl_ord_id: ClOrdId(0),
                instrument: InstrumentId(1),
                side: Side::Buy,
                qty_cancelled: Qty(5),
                reason: CancelReason::MassCancel,
                ts_ns: 4,
            },
        });
    f.router.poll_core(usize::MAX);
    let reports = f.reports();
    assert!(
        matches!(&reports[..], [(ALPHA, Report::Exec(e))]
            if matches!(e.kind, ExecKind::Canceled { by: None, .. }) && e.order_id == Some(OrderId(9))),
        "{reports:?}"
    );
}

#[test]
fn an_order_for_a_core_without_a_quorum_is_rejected_at_once_with_that_reason() {
    let mut f = Fixture::new();
    f.cores[0].lock().unwrap().no_quorum = true;
    f.router.handle(ALPHA, limit_order(1, 1), 1);
    assert!(f.take_submitted(0).is_empty());
    let reports = f.reports();
    let [(s, Report::Exec(e))] = reports.as_slice() else {
        panic!("one execution report: {reports:?}")
    };
    assert_eq!(*s, ALPHA);
    assert_eq!(
        e.kind,
        ExecKind::Rejected(RejectCause::Gateway(GatewayReject::CoreNoQuorum))
    );
    assert!(GatewayReject::CoreNoQuorum.text().contains("no quorum"));
    assert_eq!(f.router.counters().no_quorum_rejects, 1);
    // On the binary protocol: a BusinessReject with the reason of its own since version 4,
    // and SystemUnavailable, which its decoder knows, for a client of an older version.
    use bourse_wire::order_entry::codec::business_reject_reason::BusinessRejectReason as R;
    for (version, reason) in [
        (bourse_wire::order_entry::SCHEMA_VERSION, R::CoreNoQuorum),
        (
            crate::binary_front::CORE_NO_QUORUM_SINCE_VERSION,
            R::CoreNoQuorum,
        ),
        (3, R::SystemUnavailable),
        (1, R::SystemUnavailable),
    ] {
        let mut frame = [0u8; bourse_wire::order_entry::FRAME_BYTES_MAX];
        let decoded = rendered(&f, &reports[0].1, version, &mut frame);
        let bourse_wire::order_entry::Message::BusinessReject(m) = decoded else {
            panic!("not a business reject: {decoded:?}")
        };
        assert_eq!(
            (m.reason(), m.ref_cl_ord_id(), m.ref_template_id()),
            (reason, Some(1), 100),
            "version {version}"
        );
    }
    assert_eq!(f.router.core_in_flight(0), 0);
    // The quorum is back: the next order goes to the core.
    f.cores[0].lock().unwrap().no_quorum = false;
    f.router.handle(ALPHA, limit_order(2, 1), 1);
    assert_eq!(f.take_submitted(0).len(), 1);
}

#[test]
fn a_mass_cancel_for_a_core_without_a_quorum_is_refused_with_that_reason() {
    let mut f = Fixture::new();
    f.cores[0].lock().unwrap().no_quorum = true;
    f.router.handle(ALPHA, all_accounts_mass_cancel(), 6);
    assert!(f.take_submitted(0).is_empty());
    let reports = f.reports();
    let [(
        ALPHA,
        Report::MassCancel {
            total: 0, reject, ..
        },
    )] = reports.as_slice()
    else {
        panic!("one mass cancel report: {reports:?}")
    };
    assert_eq!(
        *reject,
        Some(RejectCause::Gateway(GatewayReject::CoreNoQuorum)),
        "the reason is the core's lost quorum, not a busy gateway"
    );
    assert_eq!(f.router.counters().no_quorum_rejects, 1);
    // On the binary protocol: a MassCancelAck with the result of its own since version 5, and
    // Other, which its decoder knows, for a client of an older version.
    use bourse_wire::order_entry::codec::mass_cancel_result::MassCancelResult as R;
    for (version, result) in [
        (bourse_wire::order_entry::SCHEMA_VERSION, R::CoreNoQuorum),
        (
            crate::binary_front::MASS_CANCEL_REFUSALS_SINCE_VERSION,
            R::CoreNoQuorum,
        ),
        (4, R::Other),
        (1, R::Other),
    ] {
        let mut frame = [0u8; bourse_wire::order_entry::FRAME_BYTES_MAX];
        let decoded = rendered(&f, &reports[0].1, version, &mut frame);
        let bourse_wire::order_entry::Message::MassCancelAck(m) = decoded else {
            panic!("not a mass cancel ack: {decoded:?}")
        };
        assert_eq!(
            (m.result(), m.canceled_count()),
            (result, 0),
            "version {version}"
        );
    }
}

#[test]
fn a_mass_cancel_refused_busy_says_so_to_a_client_of_version_5() {
    use crate::binary_front::mass_cancel_result;
    use bourse_wire::order_entry::codec::mass_cancel_result::MassCancelResult as R;
    for g in [GatewayReject::SystemBusy, GatewayReject::CoreUnavailable] {
        let reject = Some(RejectCause::Gateway(g));
        assert_eq!(mass_cancel_result(reject, 5), R::SystemUnavailable, "{g:?}");
        assert_eq!(mass_cancel_result(reject, 4), R::Other, "{g:?}");
    }
    // The results every version knows stay what they were.
    assert_eq!(mass_cancel_result(None, 1), R::Done);
    let denied = Some(RejectCause::Gateway(GatewayReject::NotAuthorized));
    assert_eq!(mass_cancel_result(denied, 5), R::NotAuthorized);
}

/// `report` as the binary protocol renders it for a session of schema `version`, decoded.
fn rendered<'a>(
    f: &Fixture,
    report: &Report,
    version: u16,
    frame: &'a mut [u8; bourse_wire::order_entry::FRAME_BYTES_MAX],
) -> bourse_wire::order_entry::Message<'a> {
    let n = crate::binary_front::render(&f.router, report, version, frame);
    bourse_wire::order_entry::FrameDecoder::default()
        .decode_exact(&frame[..n])
        .unwrap()
}

/// An `InstrumentAdded` event on core `core`'s stream under another client's key.
fn announce(f: &mut Fixture, core: usize, id: u32, symbol: &str) {
    let def = bourse_core::Instrument {
        instrument: InstrumentId(id),
        symbol: symbol.into(),
        market: Market::Fx,
        price_scale: 4,
        tick: Price(1),
        lot_size: 100,
        multiplier: 1,
        initial_margin: Cash(0),
        band_bps: 500,
        reference_price: Price(9_000),
        volatility: Default::default(),
    };
    let event = Event::InstrumentAdded {
        instrument: def.instrument,
        definition: def.def().unwrap(),
        ts_ns: 1,
    };
    let foreign = RequestKey {
        session: u32::MAX,
        seq: 0,
    };
    f.cores[core]
        .lock()
        .unwrap()
        .outputs
        .push_back(CoreOutput::Event {
            key: foreign,
            event,
        });
    f.router.poll_core(usize::MAX);
}

#[test]
fn an_instrument_added_on_a_core_stream_is_routed_to_that_core_from_then_on() {
    let mut f = Fixture::new();
    assert!(f.router.instrument_by_symbol(b"GBPUSD").is_none());
    announce(&mut f, 1, 7, "GBPUSD");
    let info = f
        .router
        .instrument_by_symbol(b"GBPUSD")
        .expect("learned")
        .clone();
    assert_eq!(
        (info.id, info.core, info.lot_size),
        (InstrumentId(7), 1, 100)
    );
    assert_eq!(info.lots(300), Some(3));
    // An order for it goes to the core that announced it.
    f.router.handle(
        ALPHA,
        Request::New(NewOrderRequest {
            client: ClientId::Num(1),
            account: None,
            instrument: InstrumentId(7),
            side: Side::Buy,
            ord_type: OrdType::Limit,
            price: Price(9_000),
            qty_lots: 1,
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_lots: 0,
        }),
        1,
    );
    assert!(f.take_submitted(0).is_empty());
    let sent = f.take_submitted(1);
    assert!(
        matches!(&sent[..], [(_, c)] if matches!(&c.body, CommandBody::NewOrder(o) if o.instrument == InstrumentId(7))),
        "{sent:?}"
    );
    // A configured id announced again (the bootstrap's) and a symbol already taken by
    // another id change nothing.
    announce(&mut f, 1, 1, "SBER2");
    assert_eq!(f.router.instrument(InstrumentId(1)).unwrap().symbol, "SBER");
    assert!(f.router.instrument_by_symbol(b"SBER2").is_none());
    announce(&mut f, 0, 8, "GBPUSD");
    assert_eq!(
        f.router.instrument_by_symbol(b"GBPUSD").unwrap().id,
        InstrumentId(7)
    );
    assert_eq!(f.router.instrument(InstrumentId(8)).unwrap().core, 0);
}

/// The router's configuration with a session of firm 1 that lists no accounts.
fn with_firm_session() -> Fixture {
    let config = format!("{CONFIG}\n[[fix_sessions]]\nclient_comp_id = \"FIRM1\"\nfirm = 1\n");
    Fixture::with_config(&config)
}

/// The fourth session of [`with_firm_session`]'s configuration.
const FIRM1: SessionRef = SessionRef(3);

fn order_for(client: u64, account: Option<u32>) -> Request {
    Request::New(NewOrderRequest {
        client: ClientId::Num(client),
        account: account.map(AccountId),
        instrument: InstrumentId(1),
        side: Side::Buy,
        ord_type: OrdType::Limit,
        price: Price(25_000),
        qty_lots: 1,
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_lots: 0,
    })
}

#[test]
fn a_session_entitled_by_firm_sends_any_account_with_its_firm_for_the_core_to_check() {
    let mut f = with_firm_session();
    // An account the gateway has never heard of (added at run time): the core decides.
    f.router.handle(FIRM1, order_for(1, Some(900_002)), 1);
    let sent = f.take_submitted(0);
    assert_eq!(sent.len(), 1);
    let CommandBody::NewOrder(order) = sent[0].1.body else {
        panic!("not a new order: {:?}", sent[0].1);
    };
    assert_eq!(
        (order.account, order.firm),
        (AccountId(900_002), Some(FirmId(1)))
    );
    // A session that lists its accounts keeps the list and sends no firm.
    let (_, listed) = f.new_order(ALPHA, 2, 1, Side::Buy, 25_000, 1);
    assert_eq!((listed.account, listed.firm), (AccountId(101), None));
}

#[test]
fn a_session_entitled_by_firm_must_name_the_account_of_each_order() {
    let mut f = with_firm_session();
    f.router.handle(FIRM1, order_for(1, None), 1);
    assert!(f.take_submitted(0).is_empty());
    let reports = f.reports();
    assert!(
        matches!(
            &reports[..],
            [(FIRM1, Report::Exec(r))]
                if r.kind == ExecKind::Rejected(RejectCause::Gateway(GatewayReject::AccountRequired))
        ),
        "{reports:?}"
    );
}

#[test]
fn a_session_entitled_by_firm_mass_cancels_within_its_firm_only() {
    let mut f = with_firm_session();
    // Every account: the firm's, on every core.
    f.router.handle(FIRM1, all_accounts_mass_cancel(), 6);
    for core in 0..2 {
        let sent = f.take_submitted(core);
        assert!(
            matches!(&sent[..], [(_, c)] if matches!(c.body,
                CommandBody::MassCancel(m) if m.account.is_none() && m.firm == Some(FirmId(1)))),
            "{sent:?}"
        );
    }
    // One named account: the core cancels it only if it is the firm's.
    let mut one = all_accounts_mass_cancel();
    if let Request::MassCancel { account, .. } = &mut one {
        *account = Some(AccountId(201));
    }
    f.router.handle(FIRM1, one, 7);
    let sent = f.take_submitted(0);
    assert!(
        matches!(&sent[..], [(_, c)] if matches!(c.body,
            CommandBody::MassCancel(m)
                if m.account == Some(AccountId(201)) && m.firm == Some(FirmId(1)))),
        "{sent:?}"
    );
}
