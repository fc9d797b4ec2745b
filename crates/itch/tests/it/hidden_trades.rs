//! Trade messages (`P`): executions the published book never showed.
//!
//! A feed that starts after orders were entered (`bourse itch serve --from N` past their
//! entries) has not shown them, so an execution against one is published as Trade, with
//! reference 0, the resting side, the shares, the price and the core's trade id as match
//! number; once an order shows on the feed (an iceberg's refilled slice enters as Add Order),
//! executions against it are Order Executed again. Checked against the engine's own Trade
//! events, read back with `itchy` (an ITCH 5.0 parser that is not ours).

use crate::common;

use bourse_core::*;
use bourse_engine::fixtures::{accepted_id, equity, Driver};
use bourse_itch::feed::{Feed, FeedLimits};
use bourse_itch::mold::session_of;
use common::{itch_price, itchy_decode, messages_of};

fn account(id: u32, firm: u32) -> AccountSpec {
    AccountSpec {
        account: AccountId(id),
        firm: FirmId(firm),
        may_short: true,
        stp: StpMode::None,
        stp_scope: StpScope::Account,
    }
}

fn new_order(cl: u64, side: Side, price: i64, qty: i64, display: i64) -> CommandBody {
    CommandBody::NewOrder(NewOrder {
        firm: None,
        account: AccountId(if side == Side::Buy { 1 } else { 2 }),
        cl_ord_id: ClOrdId(cl),
        instrument: InstrumentId(1),
        side,
        ord_type: OrdType::Limit,
        price: Price(price),
        qty: Qty(qty),
        tif: TimeInForce::Day,
        expire_ts_ns: 0,
        display_qty: Qty(display),
    })
}

/// The core's trades among `events`: (trade id, price, qty, resting side, resting order).
fn core_trades(events: &[Event]) -> Vec<(u64, i64, i64, Side, OrderId)> {
    events
        .iter()
        .filter_map(|e| match *e {
            Event::Trade {
                trade_id,
                price,
                qty,
                aggressor,
                buy,
                sell,
                ..
            } => {
                let resting = if aggressor == Side::Buy { sell } else { buy };
                Some((
                    trade_id.0,
                    price.0,
                    qty.0,
                    aggressor.opposite(),
                    resting.order_id,
                ))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn executions_against_orders_the_feed_never_showed_are_trade_messages_matching_the_core() {
    let mut d = Driver::new(bourse_engine::EngineConfig::default());
    let def = equity(1, "SBER", 30_000);
    d.add_instrument(def.clone());
    d.add_account_spec(account(1, 1), 1_000_000_000_0000);
    d.add_account_spec(account(2, 2), 1_000_000_000_0000);
    // Before the feed starts: a plain sell of 30 and an iceberg of 50 showing 10.
    let plain = accepted_id(d.run(new_order(1, Side::Sell, 30_100, 30, 0))).unwrap();
    let ice = accepted_id(d.run(new_order(2, Side::Sell, 30_200, 50, 10))).unwrap();

    let mut feed = Feed::new(session_of("LATE").unwrap(), FeedLimits::default(), 4).unwrap();
    let mut packets: Vec<Vec<u8>> = Vec::new();
    feed.define(&def, d.ts_ns, &mut |p| packets.push(p.to_vec()));
    // A buy of 40 takes the plain order whole and the iceberg's first slice: neither was
    // ever shown on this feed.
    let hidden_events = d.run(new_order(3, Side::Buy, 30_200, 40, 0)).to_vec();
    feed.publish(&hidden_events, &mut |p| packets.push(p.to_vec()));
    let hidden = core_trades(&hidden_events);
    assert_eq!(
        hidden.iter().map(|t| t.2).sum::<i64>(),
        40,
        "{hidden_events:?}"
    );
    let mut resting: Vec<OrderId> = hidden.iter().map(|t| t.4).collect();
    resting.dedup();
    assert_eq!(
        resting,
        vec![plain, ice],
        "the plain order, then the iceberg"
    );
    let published_upto = messages_of(&packets).len();
    // Then a buy of 15: against the iceberg's refilled slice, which the feed has shown.
    let shown_events = d.run(new_order(4, Side::Buy, 30_200, 15, 0)).to_vec();
    feed.publish(&shown_events, &mut |p| packets.push(p.to_vec()));
    let shown = core_trades(&shown_events);
    assert_eq!(shown.iter().map(|t| t.2).sum::<i64>(), 15);

    let messages: Vec<itchy::Message> = messages_of(&packets)
        .iter()
        .map(|(_, m)| itchy_decode(m))
        .collect();
    let (first, second) = messages.split_at(published_upto);
    let trades_of = |ms: &[itchy::Message]| -> Vec<(u64, i64, i64, Side, u64, String)> {
        ms.iter()
            .filter_map(|m| match &m.body {
                itchy::Body::NonCrossTrade(t) => Some((
                    t.match_number,
                    i64::from(t.price.raw()),
                    i64::from(t.shares),
                    match t.side {
                        itchy::Side::Buy => Side::Buy,
                        itchy::Side::Sell => Side::Sell,
                    },
                    t.reference,
                    t.stock.trim_end().to_string(),
                )),
                _ => None,
            })
            .collect()
    };
    let executed_of = |ms: &[itchy::Message]| -> Vec<(u64, u64, u32)> {
        ms.iter()
            .filter_map(|m| match m.body {
                itchy::Body::OrderExecuted {
                    reference,
                    executed,
                    match_number,
                } => Some((match_number, reference, executed)),
                _ => None,
            })
            .collect()
    };

    // Every hidden execution is one Trade message with the core's trade id, price, shares and
    // resting side, reference 0, and the stock; nothing of it is an Order Executed.
    let want: Vec<_> = hidden
        .iter()
        .map(|&(id, price, qty, side, _)| {
            (
                id,
                i64::from(itch_price(price, def.price_scale)),
                qty,
                side,
                0,
                "SBER".to_string(),
            )
        })
        .collect();
    assert_eq!(trades_of(first), want);
    assert!(executed_of(first).is_empty(), "{first:?}");
    assert_eq!(feed.stats().hidden_executions, hidden.len() as u64);
    // The iceberg's refill entered the published book: its stock locate, side and price.
    let refill = first
        .iter()
        .find_map(|m| match &m.body {
            itchy::Body::AddOrder(a) => Some(a.clone()),
            _ => None,
        })
        .expect("the refilled slice is shown");
    assert_eq!(
        (refill.side, refill.price.raw(), refill.shares),
        (itchy::Side::Sell, itch_price(30_200, 2), 10)
    );

    // Executions against what the feed showed are Order Executed, matched by trade id, with
    // no further Trade message.
    assert!(trades_of(second).is_empty(), "{second:?}");
    let executed = executed_of(second);
    let want: Vec<(u64, u32)> = shown.iter().map(|t| (t.0, t.2 as u32)).collect();
    assert_eq!(
        executed
            .iter()
            .map(|&(id, _, n)| (id, n))
            .collect::<Vec<_>>(),
        want
    );
    assert_eq!(executed[0].1, refill.reference, "against the shown slice");
}
