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
    /// At the opening (FIX OPG): only in the opening auction; what the uncrossing does not
    /// execute is cancelled (`AuctionUnexecuted`).
    AtOpening,
    /// At the close (FIX ATC): only in the closing auction; cancelled after its uncrossing as
    /// at the opening.
    AtClose,
    /// Good for auction: in any call auction (opening, closing, volatility); cancelled after
    /// that auction's uncrossing as at the opening.
    GoodForAuction,
}

impl TimeInForce {
    /// Whether the order lives for one call auction only (OPG, ATC, GFA).
    #[inline]
    pub fn is_auction_only(self) -> bool {
        matches!(
            self,
            TimeInForce::AtOpening | TimeInForce::AtClose | TimeInForce::GoodForAuction
        )
    }
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
    /// The firm the account must belong to, or none: a gateway session entitled by firm
    /// (rather than by a list of accounts) sends its firm, so that an account added at run
    /// time trades at once and another firm's account is refused with `AccountNotOfFirm` by
    /// the core, which alone knows every account's firm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firm: Option<FirmId>,
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
    /// Add an account with its initial cash: the addition and a deposit of `cash` in one
    /// command (cash 0: no deposit), so that a bulk addition is one command per account and
    /// no account is ever left added but unfunded. A negative or too large `cash` refuses
    /// the whole command, and nothing is added.
    AddFundedAccount {
        #[serde(flatten)]
        spec: AccountSpec,
        cash: Cash,
    },
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
    /// Engage (cancel every resting order of the target in this core and refuse its new
    /// orders and replaces) or release the kill switch of one firm or one account. Exactly
    /// one of `firm` and `account` is given.
    KillSwitch {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        firm: Option<FirmId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        account: Option<AccountId>,
        engaged: bool,
    },
    /// Set the margin call open on an account (clearing issues it after a run, through the
    /// sequenced path): `amount` is the cash the account must add to cover its initial
    /// margin, 0 closes the call. While a call is open the account's orders that would
    /// increase its exposure are refused (`MarginCallOpen`); its deposits reduce the call.
    MarginCall {
        account: AccountId,
        amount: Cash,
    },
    /// Take cash a clearing run collects from an account (its variation margin, fees and
    /// unpaid debts): a `Withdraw` a margin call does not stop, because the clearing house
    /// collects what the account owes whatever it owes besides. Refused above the account's
    /// free cash (`InsufficientFreeCash`), and then the unpaid amount is added to the
    /// account's margin call (`MarginCallSet`), so the account trades only to reduce its
    /// exposure until it pays.
    ClearingDebit {
        account: AccountId,
        amount: Cash,
    },
}

/// A command with the time the gateway stamped on it.
///
/// It is written as one flat object, and read through `strict::StrictCommand`, which
/// refuses a field it does not know: serde's `deny_unknown_fields` does not reach through
/// `flatten`, and a misspelled optional field (`display_qtty`) silently read as absent would
/// make a replay misread the command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "strict::StrictCommand")]
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

/// The form a [`Command`] is read from: the same flat object, spelled out field by field in
/// one internally tagged enum so that `deny_unknown_fields` applies. The conversion below
/// builds every command struct without `..`, so a field added to one of them and not here
/// fails to compile instead of being ignored on input.
mod strict {
    use super::*;
    use crate::instrument::{one, Market, StpMode, StpScope, VolatilityGuard};

    #[derive(Deserialize)]
    #[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
    pub enum StrictCommand {
        NewOrder {
            ts_ns: u64,
            account: AccountId,
            cl_ord_id: ClOrdId,
            instrument: InstrumentId,
            side: Side,
            #[serde(default)]
            ord_type: OrdType,
            #[serde(default)]
            price: Price,
            qty: Qty,
            #[serde(default)]
            tif: TimeInForce,
            #[serde(default)]
            expire_ts_ns: u64,
            #[serde(default)]
            display_qty: Qty,
        },
        Cancel {
            ts_ns: u64,
            account: AccountId,
            #[serde(default)]
            cl_ord_id: ClOrdId,
            #[serde(default)]
            order_id: Option<OrderId>,
            #[serde(default)]
            orig_cl_ord_id: Option<ClOrdId>,
        },
        Replace {
            ts_ns: u64,
            account: AccountId,
            cl_ord_id: ClOrdId,
            #[serde(default)]
            order_id: Option<OrderId>,
            #[serde(default)]
            orig_cl_ord_id: Option<ClOrdId>,
            #[serde(default)]
            price: Option<Price>,
            #[serde(default)]
            qty: Option<Qty>,
        },
        MassCancel {
            ts_ns: u64,
            #[serde(default)]
            cl_ord_id: ClOrdId,
            #[serde(default)]
            account: Option<AccountId>,
            #[serde(default)]
            firm: Option<FirmId>,
            #[serde(default)]
            instrument: Option<InstrumentId>,
            #[serde(default)]
            side: Option<Side>,
        },
        SetPhase {
            ts_ns: u64,
            #[serde(default)]
            instrument: Option<InstrumentId>,
            phase: Phase,
        },
        AddInstrument {
            ts_ns: u64,
            instrument: InstrumentId,
            symbol: String,
            market: Market,
            price_scale: u8,
            tick: Price,
            #[serde(default = "one")]
            lot_size: i64,
            #[serde(default = "one")]
            multiplier: i64,
            #[serde(default)]
            initial_margin: Cash,
            band_bps: u32,
            reference_price: Price,
            #[serde(default)]
            volatility: VolatilityGuard,
        },
        AddAccount {
            ts_ns: u64,
            account: AccountId,
            firm: FirmId,
            #[serde(default)]
            may_short: bool,
            #[serde(default)]
            stp: StpMode,
            #[serde(default)]
            stp_scope: StpScope,
        },
        AddFundedAccount {
            ts_ns: u64,
            account: AccountId,
            firm: FirmId,
            #[serde(default)]
            may_short: bool,
            #[serde(default)]
            stp: StpMode,
            #[serde(default)]
            stp_scope: StpScope,
            cash: Cash,
        },
        Deposit {
            ts_ns: u64,
            account: AccountId,
            amount: Cash,
        },
        Withdraw {
            ts_ns: u64,
            account: AccountId,
            amount: Cash,
        },
        SetCollateral {
            ts_ns: u64,
            account: AccountId,
            amount: Cash,
        },
        EndOfDay {
            ts_ns: u64,
        },
        KillSwitch {
            ts_ns: u64,
            #[serde(default)]
            firm: Option<FirmId>,
            #[serde(default)]
            account: Option<AccountId>,
            engaged: bool,
        },
        MarginCall {
            ts_ns: u64,
            account: AccountId,
            amount: Cash,
        },
        ClearingDebit {
            ts_ns: u64,
            account: AccountId,
            amount: Cash,
        },
    }

    impl From<StrictCommand> for Command {
        fn from(strict: StrictCommand) -> Command {
            use StrictCommand as S;
            let (ts_ns, body) = match strict {
                S::NewOrder {
                    ts_ns,
                    account,
                    cl_ord_id,
                    instrument,
                    side,
                    ord_type,
                    price,
                    qty,
                    tif,
                    expire_ts_ns,
                    display_qty,
                } => {
                    let order = NewOrder {
                        firm: None,
                        account,
                        cl_ord_id,
                        instrument,
                        side,
                        ord_type,
                        price,
                        qty,
                        tif,
                        expire_ts_ns,
                        display_qty,
                    };
                    (ts_ns, CommandBody::NewOrder(order))
                }
                S::Cancel {
                    ts_ns,
                    account,
                    cl_ord_id,
                    order_id,
                    orig_cl_ord_id,
                } => {
                    let target = OrderRef {
                        order_id,
                        orig_cl_ord_id,
                    };
                    let cancel = Cancel {
                        account,
                        cl_ord_id,
                        target,
                    };
                    (ts_ns, CommandBody::Cancel(cancel))
                }
                S::Replace {
                    ts_ns,
                    account,
                    cl_ord_id,
                    order_id,
                    orig_cl_ord_id,
                    price,
                    qty,
                } => {
                    let target = OrderRef {
                        order_id,
                        orig_cl_ord_id,
                    };
                    let replace = Replace {
                        account,
                        cl_ord_id,
                        target,
                        price,
                        qty,
                    };
                    (ts_ns, CommandBody::Replace(replace))
                }
                S::MassCancel {
                    ts_ns,
                    cl_ord_id,
                    account,
                    firm,
                    instrument,
                    side,
                } => {
                    let mass = MassCancel {
                        cl_ord_id,
                        account,
                        firm,
                        instrument,
                        side,
                    };
                    (ts_ns, CommandBody::MassCancel(mass))
                }
                S::SetPhase {
                    ts_ns,
                    instrument,
                    phase,
                } => (ts_ns, CommandBody::SetPhase { instrument, phase }),
                S::AddInstrument {
                    ts_ns,
                    instrument,
                    symbol,
                    market,
                    price_scale,
                    tick,
                    lot_size,
                    multiplier,
                    initial_margin,
                    band_bps,
                    reference_price,
                    volatility,
                } => {
                    let spec = Instrument {
                        instrument,
                        symbol,
                        market,
                        price_scale,
                        tick,
                        lot_size,
                        multiplier,
                        initial_margin,
                        band_bps,
                        reference_price,
                        volatility,
                    };
                    (ts_ns, CommandBody::AddInstrument(spec))
                }
                S::AddAccount {
                    ts_ns,
                    account,
                    firm,
                    may_short,
                    stp,
                    stp_scope,
                } => {
                    let spec = AccountSpec {
                        account,
                        firm,
                        may_short,
                        stp,
                        stp_scope,
                    };
                    (ts_ns, CommandBody::AddAccount(spec))
                }
                S::AddFundedAccount {
                    ts_ns,
                    account,
                    firm,
                    may_short,
                    stp,
                    stp_scope,
                    cash,
                } => {
                    let spec = AccountSpec {
                        account,
                        firm,
                        may_short,
                        stp,
                        stp_scope,
                    };
                    (ts_ns, CommandBody::AddFundedAccount { spec, cash })
                }
                S::Deposit {
                    ts_ns,
                    account,
                    amount,
                } => (ts_ns, CommandBody::Deposit { account, amount }),
                S::Withdraw {
                    ts_ns,
                    account,
                    amount,
                } => (ts_ns, CommandBody::Withdraw { account, amount }),
                S::SetCollateral {
                    ts_ns,
                    account,
                    amount,
                } => (ts_ns, CommandBody::SetCollateral { account, amount }),
                S::EndOfDay { ts_ns } => (ts_ns, CommandBody::EndOfDay),
                S::KillSwitch {
                    ts_ns,
                    firm,
                    account,
                    engaged,
                } => (
                    ts_ns,
                    CommandBody::KillSwitch {
                        firm,
                        account,
                        engaged,
                    },
                ),
                S::MarginCall {
                    ts_ns,
                    account,
                    amount,
                } => (ts_ns, CommandBody::MarginCall { account, amount }),
                S::ClearingDebit {
                    ts_ns,
                    account,
                    amount,
                } => (ts_ns, CommandBody::ClearingDebit { account, amount }),
            };
            Command { ts_ns, body }
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

    /// One example of every command with every optional field given, as written by
    /// `Command`'s serializer.
    fn every_command_in_full() -> Vec<Command> {
        use crate::instrument::{Market, StpMode, StpScope};
        let target = OrderRef {
            order_id: Some(OrderId(3)),
            orig_cl_ord_id: Some(ClOrdId(4)),
        };
        let bodies = vec![
            CommandBody::NewOrder(NewOrder {
                firm: None,
                account: AccountId(1),
                cl_ord_id: ClOrdId(2),
                instrument: InstrumentId(3),
                side: Side::Sell,
                ord_type: OrdType::Limit,
                price: Price(10),
                qty: Qty(100),
                tif: TimeInForce::Gtd,
                expire_ts_ns: 77,
                display_qty: Qty(10),
            }),
            CommandBody::Cancel(Cancel {
                account: AccountId(1),
                cl_ord_id: ClOrdId(5),
                target,
            }),
            CommandBody::Replace(Replace {
                account: AccountId(1),
                cl_ord_id: ClOrdId(6),
                target,
                price: Some(Price(11)),
                qty: Some(Qty(50)),
            }),
            CommandBody::MassCancel(MassCancel {
                cl_ord_id: ClOrdId(7),
                account: Some(AccountId(1)),
                firm: Some(FirmId(2)),
                instrument: Some(InstrumentId(3)),
                side: Some(Side::Buy),
            }),
            CommandBody::SetPhase {
                instrument: Some(InstrumentId(3)),
                phase: Phase::Halted,
            },
            CommandBody::AddInstrument(Instrument {
                instrument: InstrumentId(3),
                symbol: "SBER".into(),
                market: Market::Futures,
                price_scale: 2,
                tick: Price(1),
                lot_size: 10,
                multiplier: 5,
                initial_margin: Cash(100),
                band_bps: 1000,
                reference_price: Price(10000),
                volatility: crate::VolatilityGuard {
                    dynamic_bps: 200,
                    static_bps: 500,
                    auction_ns: 5_000,
                },
            }),
            CommandBody::AddAccount(AccountSpec {
                account: AccountId(1),
                firm: FirmId(2),
                may_short: true,
                stp: StpMode::CancelBoth,
                stp_scope: StpScope::Firm,
            }),
            CommandBody::AddFundedAccount {
                spec: AccountSpec {
                    account: AccountId(2),
                    firm: FirmId(3),
                    may_short: true,
                    stp: StpMode::CancelResting,
                    stp_scope: StpScope::Firm,
                },
                cash: Cash(1_000_000),
            },
            CommandBody::Deposit {
                account: AccountId(1),
                amount: Cash(5),
            },
            CommandBody::Withdraw {
                account: AccountId(1),
                amount: Cash(5),
            },
            CommandBody::SetCollateral {
                account: AccountId(1),
                amount: Cash(5),
            },
            CommandBody::EndOfDay,
            CommandBody::MarginCall {
                account: AccountId(1),
                amount: Cash(7),
            },
            CommandBody::ClearingDebit {
                account: AccountId(1),
                amount: Cash(9),
            },
        ];
        bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Command::new(i as u64 + 1, body))
            .collect()
    }

    #[test]
    fn every_command_reads_back_what_it_writes_with_every_field_set() {
        for cmd in every_command_in_full() {
            let text = serde_json::to_string(&cmd).unwrap();
            let again: Command =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(again, cmd, "{text}");
        }
    }

    #[test]
    fn an_unknown_field_is_refused_by_name_in_every_command() {
        for cmd in every_command_in_full() {
            let text = serde_json::to_string(&cmd).unwrap();
            let misspelled = text.replacen('{', r#"{"display_qtty":1,"#, 1);
            let err = serde_json::from_str::<Command>(&misspelled)
                .expect_err(&misspelled)
                .to_string();
            assert!(
                err.contains("unknown field `display_qtty`"),
                "{misspelled}: {err}"
            );
        }
    }

    #[test]
    fn a_misspelled_iceberg_field_is_not_read_as_a_plain_order() {
        let text = r#"{"ts_ns":1,"cmd":"new_order","account":7,"cl_ord_id":1,"instrument":1,"side":"buy","price":10125,"qty":10,"display_qtty":1}"#;
        let err = serde_json::from_str::<Command>(text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `display_qtty`"), "{err}");
        let right = text.replace("display_qtty", "display_qty");
        match serde_json::from_str::<Command>(&right).unwrap().body {
            CommandBody::NewOrder(o) => assert_eq!(o.display_qty, Qty(1)),
            other => panic!("unexpected {other:?}"),
        }
    }
}
