//! Commands: everything a trading core can be asked to do.
//!
//! A command is a [`CommandBody`] plus the time the gateway stamped on it. In JSON Lines (the
//! batch interface, `docs/engine-jsonl.md`) a command is one flat object whose `cmd` field
//! names the body, for example
//! `{"ts_ns":1000,"cmd":"new_order","account":7,"cl_ord_id":1,"instrument":1,"side":"buy","ord_type":"limit","price":10125,"qty":10,"tif":"day"}`.

use crate::ids::{AccountId, ClOrdId, FirmId, InstrumentId, OrderId};
use crate::instrument::{AccountSpec, Instrument, Phase};
use crate::num::{Cash, Price, Qty};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Buy,
    Sell,
}

impl Side {
    pub fn opposite(self) -> Side {
        match self {
            Side::Buy => Side::Sell,
            Side::Sell => Side::Buy,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrdType {
    #[default]
    Limit,
    /// Trades at the best available prices, never beyond the price band; what does not trade
    /// at once is cancelled.
    Market,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeInForce {
    /// Rests until filled, cancelled, or the end of the trading day.
    #[default]
    Day,
    /// Good till cancelled: survives the end of the day.
    Gtc,
    /// Good till date: rests until `expire_ts_ns` passes (checked at the end of each day).
    Gtd,
    /// Immediate or cancel: trades what it can at once, the rest is cancelled.
    Ioc,
    /// Fill or kill: trades in full at once, or not at all.
    Fok,
}

/// A new order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewOrder {
    pub account: AccountId,
    pub cl_ord_id: ClOrdId,
    pub instrument: InstrumentId,
    pub side: Side,
    #[serde(default)]
    pub ord_type: OrdType,
    /// Limit price in raw units; ignored (and should be 0) for market orders.
    #[serde(default)]
    pub price: Price,
    pub qty: Qty,
    #[serde(default)]
    pub tif: TimeInForce,
    /// For GTD orders: the instant after which the order expires.
    #[serde(default)]
    pub expire_ts_ns: u64,
    /// For iceberg orders: the quantity shown in the book at a time (0 = all of it).
    #[serde(default)]
    pub display_qty: Qty,
}

/// Identifies an existing order either by the exchange's id or by the client's id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_id: Option<OrderId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orig_cl_ord_id: Option<ClOrdId>,
}

/// Cancel one order of the account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    pub account: AccountId,
    /// The id of this cancel request, echoed in its answer.
    #[serde(default)]
    pub cl_ord_id: ClOrdId,
    #[serde(flatten)]
    pub target: OrderRef,
}

/// Change an order's price and/or total quantity. Time priority is lost on a price change or a
/// quantity increase and kept on a decrease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replace {
    pub account: AccountId,
    /// The order's new client id.
    pub cl_ord_id: ClOrdId,
    #[serde(flatten)]
    pub target: OrderRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    /// The new total quantity (filled plus remaining), as FIX's OrderQty on a replace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qty: Option<Qty>,
}

/// Cancel every live order that matches all the given filters (an empty filter matches all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MassCancel {
    #[serde(default)]
    pub cl_ord_id: ClOrdId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<AccountId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firm: Option<FirmId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instrument: Option<InstrumentId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<Side>,
}

/// Everything a core can be asked to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum CommandBody {
    NewOrder(NewOrder),
    Cancel(Cancel),
    Replace(Replace),
    MassCancel(MassCancel),
    /// Change the phase of one instrument, or of every instrument when `instrument` is absent.
    SetPhase {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instrument: Option<InstrumentId>,
        phase: Phase,
    },
    AddInstrument(Instrument),
    AddAccount(AccountSpec),
    /// Add cash to an account.
    Deposit {
        account: AccountId,
        amount: Cash,
    },
    /// Take cash from an account; never more than its free cash.
    Withdraw {
        account: AccountId,
        amount: Cash,
    },
    /// Set an account's cash to the collateral clearing allocated to this core; never below
    /// what its orders and positions already lock.
    SetCollateral {
        account: AccountId,
        amount: Cash,
    },
    /// Close the trading day: expire Day orders, and GTD orders whose time has come.
    EndOfDay,
}

/// A command with the time the gateway stamped on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    /// Nanoseconds since the Unix epoch, stamped by the gateway (or the sequencer). The engine
    /// uses it for GTD expiry and copies it onto events; it never reads a clock itself.
    pub ts_ns: u64,
    #[serde(flatten)]
    pub body: CommandBody,
}

impl Command {
    pub fn new(ts_ns: u64, body: CommandBody) -> Command {
        Command { ts_ns, body }
    }

    /// A short name of the command's kind, for metrics and reports.
    pub fn kind(&self) -> CommandKind {
        match self.body {
            CommandBody::NewOrder(_) => CommandKind::NewOrder,
            CommandBody::Cancel(_) => CommandKind::Cancel,
            CommandBody::Replace(_) => CommandKind::Replace,
            CommandBody::MassCancel(_) => CommandKind::MassCancel,
            _ => CommandKind::Admin,
        }
    }
}

/// The kinds of command, for counting and for latency histograms per kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    NewOrder,
    Cancel,
    Replace,
    MassCancel,
    Admin,
}

impl CommandKind {
    pub const ALL: [CommandKind; 5] = [
        CommandKind::NewOrder,
        CommandKind::Cancel,
        CommandKind::Replace,
        CommandKind::MassCancel,
        CommandKind::Admin,
    ];
    pub fn name(self) -> &'static str {
        match self {
            CommandKind::NewOrder => "new",
            CommandKind::Cancel => "cancel",
            CommandKind::Replace => "replace",
            CommandKind::MassCancel => "mass_cancel",
            CommandKind::Admin => "admin",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_read_and_write_as_flat_json_objects() {
        let text = r#"{"ts_ns":1000,"cmd":"new_order","account":7,"cl_ord_id":1,"instrument":1,"side":"buy","ord_type":"limit","price":10125,"qty":10,"tif":"day"}"#;
        let cmd: Command = serde_json::from_str(text).unwrap();
        assert_eq!(cmd.ts_ns, 1000);
        match &cmd.body {
            CommandBody::NewOrder(o) => {
                assert_eq!(o.price, Price(10125));
                assert_eq!(o.display_qty, Qty(0));
            }
            other => panic!("unexpected {other:?}"),
        }
        let again: Command = serde_json::from_str(&serde_json::to_string(&cmd).unwrap()).unwrap();
        assert_eq!(again, cmd);

        let cancel = r#"{"ts_ns":5,"cmd":"cancel","account":7,"orig_cl_ord_id":1}"#;
        let cmd: Command = serde_json::from_str(cancel).unwrap();
        match cmd.body {
            CommandBody::Cancel(c) => assert_eq!(c.target.orig_cl_ord_id, Some(ClOrdId(1))),
            other => panic!("unexpected {other:?}"),
        }
        let eod: Command = serde_json::from_str(r#"{"ts_ns":9,"cmd":"end_of_day"}"#).unwrap();
        assert_eq!(eod.body, CommandBody::EndOfDay);
    }
}
