//! What the store keeps and hands out: one [`Record`] per order (its latest state, the core's
//! own order-log record), per trade and per rejected new order, each at a [`Pos`] of its core.
//!
//! A position is `(log index, ordinal)`: the committed entry that produced the record and the
//! record's number among that entry's records. Every replica of a core applies the same
//! entries at the same indexes with the same events, so a position names the same record on
//! every node of the core, after any failover, and after the delivery node rebuilt its store
//! from the stream: that is what makes a cursor valid across both.

use bourse_core::{AccountId, ClOrdId, Event, FirmId, InstrumentId, OrderId, OrderLogAction};
use serde::{Deserialize, Serialize};

/// A record's place in its core's ordered index: the committed entry's log index, then the
/// record's ordinal within that entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    pub index: u64,
    pub ord: u32,
}

impl Pos {
    pub const START: Pos = Pos { index: 0, ord: 0 };

    /// The first position after this one (a cursor's component after reading `self`).
    pub fn next(self) -> Pos {
        Pos {
            index: self.index,
            ord: self.ord.saturating_add(1),
        }
    }

    /// The first position of the entry at `index`.
    pub fn entry_start(index: u64) -> Pos {
        Pos { index, ord: 0 }
    }
}

/// One record as stored and as answered: which core, where, the firms involved and the
/// core's event (an `order_log` record for an order's latest state, a `trade`, or an
/// `order_rejected`). In JSON the event's fields sit beside `core`, `index`, `ord`, `firms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub core: u32,
    pub index: u64,
    pub ord: u32,
    /// For a trade the buyer's then the seller's firm; for an order or a reject the owner's
    /// firm twice. `None` when the store never saw the account (it started after the account
    /// was added and no order of it passed by yet).
    pub firms: [Option<FirmId>; 2],
    #[serde(flatten)]
    pub event: Event,
}

/// The account a trade's withheld side carries: to a firm's reader, the counterparty's
/// account, client order id and firm are withheld (the firm is `None` in `firms`).
pub const WITHHELD_ACCOUNT: AccountId = AccountId(u32::MAX);
/// The client order id a trade's withheld side carries.
pub const WITHHELD_CL_ORD_ID: ClOrdId = ClOrdId(u64::MAX);

/// What a client may ask for: every field given must match (a trade matches a firm or an
/// account on either side).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    pub firm: Option<FirmId>,
    pub account: Option<AccountId>,
    pub instrument: Option<InstrumentId>,
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.firm.is_none() && self.account.is_none() && self.instrument.is_none()
    }
}

impl Record {
    pub fn pos(&self) -> Pos {
        Pos {
            index: self.index,
            ord: self.ord,
        }
    }

    pub fn ts_ns(&self) -> u64 {
        self.event.ts_ns()
    }

    /// The order this record is the state of (`None` for trades and rejects).
    pub fn order_id(&self) -> Option<OrderId> {
        match &self.event {
            Event::OrderLog(l) => Some(l.order_id),
            _ => None,
        }
    }

    /// Nothing will replace this record: a trade, a reject, an order that left the book.
    /// Only final records are evicted when a core's store is full.
    pub fn is_final(&self) -> bool {
        match &self.event {
            Event::OrderLog(l) => l.action == OrderLogAction::Delete,
            _ => true,
        }
    }

    /// The accounts involved (a trade's two sides; the same account twice otherwise).
    pub fn accounts(&self) -> [AccountId; 2] {
        match &self.event {
            Event::OrderLog(l) => [l.account, l.account],
            Event::Trade { buy, sell, .. } => [buy.account, sell.account],
            Event::OrderRejected { account, .. } => [*account, *account],
            _ => [AccountId(0); 2],
        }
    }

    pub fn instrument(&self) -> InstrumentId {
        match &self.event {
            Event::OrderLog(l) => l.instrument,
            Event::Trade { instrument, .. } | Event::OrderRejected { instrument, .. } => {
                *instrument
            }
            _ => InstrumentId(0),
        }
    }

    /// This trade as a reader of `firms` may see it: a side of another firm (or of no firm
    /// known) keeps its order id and quantities, but its account, client order id and firm
    /// are withheld ([`WITHHELD_ACCOUNT`], [`WITHHELD_CL_ORD_ID`], `None`). Orders and
    /// rejects are returned unchanged: a reader gets only its own firms' (the caller's
    /// filter sees to that).
    pub fn seen_by(mut self, firms: &[FirmId]) -> Record {
        if let Event::Trade { buy, sell, .. } = &mut self.event {
            for (side, firm) in [buy, sell].into_iter().zip(self.firms.iter_mut()) {
                if !firm.is_some_and(|f| firms.contains(&f)) {
                    side.account = WITHHELD_ACCOUNT;
                    side.cl_ord_id = WITHHELD_CL_ORD_ID;
                    *firm = None;
                }
            }
        }
        self
    }

    pub fn matches(&self, f: &Filter) -> bool {
        f.firm.is_none_or(|firm| self.firms.contains(&Some(firm)))
            && f.account.is_none_or(|a| self.accounts().contains(&a))
            && f.instrument.is_none_or(|i| self.instrument() == i)
    }
}

/// Whether the store keeps a record for this event (the order's state, trades, rejected new
/// orders). Acceptances, cancels, replaces and expiries are followed by the order's
/// `OrderLog` record, which carries its state after them; cancel rejects and control events
/// change no order.
pub fn is_kept(event: &Event) -> bool {
    matches!(
        event,
        Event::OrderLog(_) | Event::Trade { .. } | Event::OrderRejected { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::{ClOrdId, Fill, Price, Qty, Side, TradeId};

    fn trade(buy: u32, sell: u32) -> Record {
        let fill = |a| Fill {
            order_id: OrderId(1),
            account: AccountId(a),
            cl_ord_id: ClOrdId(1),
            qty_leaves: Qty(0),
            qty_filled: Qty(1),
        };
        Record {
            core: 0,
            index: 5,
            ord: 1,
            firms: [Some(FirmId(10)), Some(FirmId(20))],
            event: Event::Trade {
                trade_id: TradeId(1),
                instrument: InstrumentId(3),
                price: Price(100),
                qty: Qty(1),
                aggressor: Side::Buy,
                buy: fill(buy),
                sell: fill(sell),
                auction: false,
                ts_ns: 7,
            },
        }
    }

    #[test]
    fn a_trade_matches_either_side_and_every_given_field() {
        let t = trade(1, 2);
        let f = |firm: Option<u32>, account: Option<u32>, instrument: Option<u32>| Filter {
            firm: firm.map(FirmId),
            account: account.map(AccountId),
            instrument: instrument.map(InstrumentId),
        };
        assert!(t.matches(&f(None, None, None)));
        assert!(t.matches(&f(Some(20), Some(1), Some(3))));
        assert!(!t.matches(&f(Some(30), None, None)));
        assert!(!t.matches(&f(None, Some(3), None)));
        assert!(!t.matches(&f(Some(10), None, Some(4))));
    }

    #[test]
    fn a_firms_reader_sees_its_own_side_in_full_and_the_other_withheld() {
        let t = trade(1, 2).seen_by(&[FirmId(10)]);
        let Event::Trade { buy, sell, .. } = t.event else {
            unreachable!()
        };
        assert_eq!((buy.account, buy.cl_ord_id), (AccountId(1), ClOrdId(1)));
        assert_eq!(
            (sell.account, sell.cl_ord_id),
            (WITHHELD_ACCOUNT, WITHHELD_CL_ORD_ID)
        );
        assert_eq!((sell.order_id, sell.qty_filled), (OrderId(1), Qty(1)));
        assert_eq!(t.firms, [Some(FirmId(10)), None]);
        assert_eq!(trade(1, 2).seen_by(&[FirmId(10), FirmId(20)]), trade(1, 2));
        let neither = trade(1, 2).seen_by(&[FirmId(30)]);
        assert_eq!(neither.firms, [None, None]);
    }

    #[test]
    fn a_record_reads_back_from_its_json() {
        let t = trade(1, 2);
        let json = serde_json::to_string(&t).unwrap();
        assert!(json.contains("\"event\":\"trade\""), "{json}");
        assert_eq!(serde_json::from_str::<Record>(&json).unwrap(), t);
    }
}
