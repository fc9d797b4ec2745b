//! What the admin crate's tests share: a venue of one market whose core is an engine applied
//! in place.

// Each test file uses a part of it.
#![allow(dead_code)]

use bourse_admin::{AdminVenue, Asker, BoxFuture, Query, QueryAnswer};
use bourse_core::*;
use bourse_engine::fixtures::future;
use bourse_engine::{Engine, EngineConfig};
use std::sync::Mutex;

/// One market (`futures`) whose core is an engine applied in place (the sequenced path is
/// the venue's business; the service only needs answers).
pub struct EngineVenue {
    pub engine: Mutex<Engine>,
    /// Every command submitted, in order.
    pub applied: Mutex<Vec<CommandBody>>,
}

impl AdminVenue for EngineVenue {
    fn markets(&self) -> Vec<String> {
        vec!["futures".into()]
    }

    fn submit<'a>(
        &'a self,
        _core: usize,
        commands: Vec<Command>,
        _ordered: bool,
        _asker: Asker<'a>,
    ) -> BoxFuture<'a, Result<Vec<Vec<Event>>, String>> {
        Box::pin(async move {
            let mut e = self.engine.lock().unwrap();
            Ok(commands
                .iter()
                .map(|c| {
                    self.applied.lock().unwrap().push(c.body.clone());
                    let mut out = Vec::new();
                    e.apply(c, &mut out);
                    out
                })
                .collect())
        })
    }

    fn query(&self, _core: usize, query: Query) -> BoxFuture<'_, Result<QueryAnswer, String>> {
        Box::pin(async move { Ok(query.answer(&self.engine.lock().unwrap(), 0)) })
    }
}

impl EngineVenue {
    pub fn new(engine: Engine) -> EngineVenue {
        EngineVenue {
            engine: Mutex::new(engine),
            applied: Mutex::new(Vec::new()),
        }
    }
}

/// Applies a Day limit order to buy one of instrument 1 for `account` (a trader's order,
/// straight to the engine) and returns its events.
pub fn order(e: &mut Engine, account: u32, cl: u64, price: i64) -> Vec<Event> {
    let mut out = Vec::new();
    e.apply(
        &Command::new(
            1,
            CommandBody::NewOrder(NewOrder {
                firm: None,
                account: AccountId(account),
                cl_ord_id: ClOrdId(cl),
                instrument: InstrumentId(1),
                side: Side::Buy,
                ord_type: OrdType::Limit,
                price: Price(price),
                qty: Qty(1),
                tif: TimeInForce::Day,
                expire_ts_ns: 0,
                display_qty: Qty(0),
            }),
        ),
        &mut out,
    );
    out
}

/// An engine with one future (instrument 1, `SI`) and account 1 of firm 1, funded with
/// 1,000,000.0000 and allowed to short.
pub fn funded_engine() -> Engine {
    let mut engine = Engine::new(EngineConfig::default());
    let mut out = Vec::new();
    for body in [
        CommandBody::AddInstrument(future(1, "SI", 100_000)),
        CommandBody::AddAccount(AccountSpec {
            account: AccountId(1),
            firm: FirmId(1),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        }),
        CommandBody::Deposit {
            account: AccountId(1),
            amount: Cash(1_000_000_0000),
        },
    ] {
        engine.apply(&Command::new(0, body), &mut out);
    }
    engine
}
