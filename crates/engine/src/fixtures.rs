//! Ready-made instruments and a small driver, shared by tests, benchmarks and the demo so that
//! they all describe the same markets the same way.

use crate::{Engine, EngineConfig};
use bourse_core::*;

/// An equity priced with 2 decimals, tick 0.01, lot of 10 shares, band ±20%.
pub fn equity(id: u32, symbol: &str, reference_price: i64) -> Instrument {
    Instrument {
        instrument: InstrumentId(id),
        symbol: symbol.into(),
        market: Market::Equity,
        price_scale: 2,
        tick: Price(1),
        lot_size: 10,
        multiplier: 1,
        initial_margin: Cash(0),
        band_bps: 2000,
        reference_price: Price(reference_price),
        volatility: VolatilityGuard::default(),
    }
}

/// An FX pair priced with 5 decimals, tick 0.00001, lot of 1,000 units of the base, band ±5%.
pub fn fx(id: u32, symbol: &str, reference_price: i64) -> Instrument {
    Instrument {
        instrument: InstrumentId(id),
        symbol: symbol.into(),
        market: Market::Fx,
        price_scale: 5,
        tick: Price(1),
        lot_size: 1000,
        multiplier: 1,
        initial_margin: Cash(0),
        band_bps: 500,
        reference_price: Price(reference_price),
        volatility: VolatilityGuard::default(),
    }
}

/// A future priced in whole points, tick 10, multiplier 1, initial margin 5,000.0000 per
/// contract, band ±10%.
pub fn future(id: u32, symbol: &str, reference_price: i64) -> Instrument {
    Instrument {
        instrument: InstrumentId(id),
        symbol: symbol.into(),
        market: Market::Futures,
        price_scale: 0,
        tick: Price(10),
        lot_size: 1,
        multiplier: 1,
        initial_margin: Cash(5_000_0000),
        band_bps: 1000,
        reference_price: Price(reference_price),
        volatility: VolatilityGuard::default(),
    }
}

/// Drives an engine with a running clock and keeps the last command's events.
pub struct Driver {
    pub engine: Engine,
    pub events: Vec<Event>,
    pub ts_ns: u64,
}

impl Driver {
    pub fn new(config: EngineConfig) -> Driver {
        Driver {
            engine: Engine::new(config),
            events: Vec::with_capacity(1024),
            ts_ns: 1_000_000_000,
        }
    }

    /// Applies `body` at the next tick of the clock and returns its events.
    pub fn run(&mut self, body: CommandBody) -> &[Event] {
        self.ts_ns += 1_000;
        self.events.clear();
        self.engine
            .apply(&Command::new(self.ts_ns, body), &mut self.events);
        &self.events
    }

    pub fn add_instrument(&mut self, def: Instrument) {
        let ev = self.run(CommandBody::AddInstrument(def)).to_vec();
        assert!(matches!(ev[..], [Event::InstrumentAdded { .. }]), "{ev:?}");
    }

    /// Adds an account with `cash` (in cash units) and no self-trade prevention.
    pub fn add_account(&mut self, account: u32, firm: u32, cash: i128) {
        self.add_account_spec(
            AccountSpec {
                account: AccountId(account),
                firm: FirmId(firm),
                may_short: false,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            },
            cash,
        );
    }

    pub fn add_account_spec(&mut self, spec: AccountSpec, cash: i128) {
        let ev = self.run(CommandBody::AddAccount(spec)).to_vec();
        assert!(matches!(ev[..], [Event::AccountAdded { .. }]), "{ev:?}");
        if cash > 0 {
            let ev = self
                .run(CommandBody::Deposit {
                    account: spec.account,
                    amount: Cash(cash),
                })
                .to_vec();
            assert!(matches!(ev[..], [Event::CashChanged { .. }]), "{ev:?}");
        }
    }

    /// A limit order with time in force Day.
    pub fn limit(
        &mut self,
        account: u32,
        cl_ord_id: u64,
        instrument: u32,
        side: Side,
        price: i64,
        qty: i64,
    ) -> Vec<Event> {
        self.order(NewOrder {
            firm: None,
            account: AccountId(account),
            cl_ord_id: ClOrdId(cl_ord_id),
            instrument: InstrumentId(instrument),
            side,
            ord_type: OrdType::Limit,
            price: Price(price),
            qty: Qty(qty),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        })
    }

    pub fn order(&mut self, order: NewOrder) -> Vec<Event> {
        self.run(CommandBody::NewOrder(order)).to_vec()
    }
}

/// The order id of the `OrderAccepted` event among `events`, if any.
pub fn accepted_id(events: &[Event]) -> Option<OrderId> {
    events.iter().find_map(|e| match e {
        Event::OrderAccepted { order_id, .. } => Some(*order_id),
        _ => None,
    })
}

/// The trades among `events` as (price, qty).
pub fn trades(events: &[Event]) -> Vec<(i64, i64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Trade { price, qty, .. } => Some((price.0, qty.0)),
            _ => None,
        })
        .collect()
}

/// The reject reason among `events`, if any.
pub fn reject_reason(events: &[Event]) -> Option<RejectReason> {
    events.iter().find_map(|e| match e {
        Event::OrderRejected { reason, .. }
        | Event::CancelRejected { reason, .. }
        | Event::CommandRejected { reason, .. } => Some(*reason),
        _ => None,
    })
}
