//! The one binary form of a [`Command`]: what a client sends, what a log entry carries and the
//! journal keeps, decoded once by each replica that applies it.
//!
//! ```text
//! command := form u8, the body's fields (fixed width, little-endian), ts_ns u64
//!   form 1  new order      account u32, cl_ord_id u64, instrument u32, side u8, ord_type u8,
//!                          price i64, qty i64, tif u8, expire_ts_ns u64, display_qty i64,
//!                          firm opt_u32
//!   form 2  cancel         account u32, cl_ord_id u64, order_ref
//!   form 3  replace        account u32, cl_ord_id u64, order_ref, price opt_i64, qty opt_i64
//!   form 4  mass cancel    cl_ord_id u64, account opt_u32, firm opt_u32, instrument opt_u32,
//!                          side (flag u8 [, side u8])
//!   form 5  deposit        account u32, amount i128
//!   form 6  withdraw       account u32, amount i128
//!   form 7  set collateral account u32, amount i128
//!   form 8  end of day     (no fields)
//!   form 9  set phase      instrument opt_u32, phase u8
//!   form 10 add instrument instrument u32, symbol (len u32, UTF-8), market u8, price_scale u8,
//!                          tick i64, lot_size i64, multiplier i64, initial_margin i128,
//!                          band_bps u32, reference_price i64
//!   form 11 add account    account u32, firm u32, may_short u8, stp u8, stp_scope u8
//!   form 12 kill switch    firm opt_u32, account opt_u32, engaged u8
//!   form 13 add funded     account u32, firm u32, may_short u8, stp u8, stp_scope u8,
//!           account        cash i128
//!   form 14 margin call    account u32, amount i128
//!   form 15 clearing debit account u32, amount i128
//!   form 16 add instrument form 10's fields, then the volatility guard: dynamic_bps u32,
//!           with a guard      static_bps u32, auction_ns u64 (an instrument without one is
//!                          form 10, as before)
//! order_ref := order_id opt_u64, orig_cl_ord_id opt_u64
//! opt_X    := flag u8 (0 absent, 1 present) [, X]
//! ```
//!
//! Enums are one byte, the position of the value in the tables below. Form 0 is never used
//! (it was MessagePack once; a journal that still holds one is refused by its version).
//! Decoding refuses a command longer than [`COMMAND_SIZE_BYTES_MAX`], unknown forms and enum
//! values, and trailing bytes.

use super::{DecodeError, Reader, Writer};
use crate::{
    AccountId, AccountSpec, Cancel, Cash, ClOrdId, Command, CommandBody, FirmId, Instrument,
    InstrumentId, Market, MassCancel, NewOrder, OrdType, OrderId, OrderRef, Phase, Price, Qty,
    Replace, Side, StpMode, StpScope, TimeInForce, VolatilityGuard,
};

/// The largest encoded command (an `AddInstrument` with the longest symbol the codec takes is
/// the biggest, well under this).
pub const COMMAND_SIZE_BYTES_MAX: u32 = 4096;
/// The longest symbol an `AddInstrument` may carry in its binary form. The engine accepts far
/// shorter ones (`SYMBOL_LEN_MAX`) and refuses the rest with a reject; this limit only keeps
/// the encoding bounded.
pub const SYMBOL_CODEC_BYTES_MAX: usize = 1024;

const FORM_NEW_ORDER: u8 = 1;
const FORM_CANCEL: u8 = 2;
const FORM_REPLACE: u8 = 3;
const FORM_MASS_CANCEL: u8 = 4;
const FORM_DEPOSIT: u8 = 5;
const FORM_WITHDRAW: u8 = 6;
const FORM_SET_COLLATERAL: u8 = 7;
const FORM_END_OF_DAY: u8 = 8;
const FORM_SET_PHASE: u8 = 9;
const FORM_ADD_INSTRUMENT: u8 = 10;
const FORM_ADD_ACCOUNT: u8 = 11;
const FORM_KILL_SWITCH: u8 = 12;
/// Added after the journal's format version 2 without changing another form's layout: a
/// journal of an older build reads as before, and an older build refuses this form by name.
const FORM_ADD_FUNDED_ACCOUNT: u8 = 13;
/// Added like form 13: no other form's layout changed.
const FORM_MARGIN_CALL: u8 = 14;
/// Added like form 13: no other form's layout changed.
const FORM_CLEARING_DEBIT: u8 = 15;
/// Added like form 13: an instrument with a volatility guard; without one it stays form 10.
const FORM_ADD_INSTRUMENT_GUARDED: u8 = 16;
/// The last form byte in use: the form check accepts `FORM_NEW_ORDER..=FORM_LAST`.
const FORM_LAST: u8 = FORM_ADD_INSTRUMENT_GUARDED;

pub(super) const SIDES: [Side; 2] = [Side::Buy, Side::Sell];
const ORD_TYPES: [OrdType; 2] = [OrdType::Limit, OrdType::Market];
const TIFS: [TimeInForce; 8] = [
    TimeInForce::Day,
    TimeInForce::Gtc,
    TimeInForce::Gtd,
    TimeInForce::Ioc,
    TimeInForce::Fok,
    TimeInForce::AtOpening,
    TimeInForce::AtClose,
    TimeInForce::GoodForAuction,
];
pub(super) const PHASES: [Phase; 7] = [
    Phase::Open,
    Phase::Halted,
    Phase::Closed,
    Phase::Paused,
    Phase::OpeningAuction,
    Phase::ClosingAuction,
    Phase::VolatilityAuction,
];
pub(super) const MARKETS: [Market; 3] = [Market::Equity, Market::Fx, Market::Futures];
const STP_MODES: [StpMode; 4] = [
    StpMode::None,
    StpMode::CancelResting,
    StpMode::CancelIncoming,
    StpMode::CancelBoth,
];
const STP_SCOPES: [StpScope; 2] = [StpScope::Account, StpScope::Firm];

/// The position of `v` in its table: the value's one-byte code.
#[inline]
pub(super) fn code_of<T: PartialEq>(values: &[T], v: &T) -> u8 {
    values
        .iter()
        .position(|x| x == v)
        .expect("every value is in its table") as u8
}

fn opt_u64(w: &mut Writer, v: Option<u64>) {
    match v {
        Some(v) => {
            w.u8(1);
            w.u64(v);
        }
        None => w.u8(0),
    }
}

pub(super) fn opt_u32(w: &mut Writer, v: Option<u32>) {
    match v {
        Some(v) => {
            w.u8(1);
            w.u32(v);
        }
        None => w.u8(0),
    }
}

/// Reads the presence flag of an optional field.
#[inline(always)]
fn present(r: &mut Reader) -> Result<bool, DecodeError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(r.error("invalid option flag")),
    }
}

#[inline(always)]
fn read_opt_u64(r: &mut Reader) -> Result<Option<u64>, DecodeError> {
    Ok(if present(r)? { Some(r.u64()?) } else { None })
}

#[inline(always)]
pub(super) fn read_opt_u32(r: &mut Reader) -> Result<Option<u32>, DecodeError> {
    Ok(if present(r)? { Some(r.u32()?) } else { None })
}

fn order_ref(w: &mut Writer, target: &OrderRef) {
    opt_u64(w, target.order_id.map(|o| o.0));
    opt_u64(w, target.orig_cl_ord_id.map(|c| c.0));
}

#[inline(always)]
fn read_order_ref(r: &mut Reader) -> Result<OrderRef, DecodeError> {
    Ok(OrderRef {
        order_id: read_opt_u64(r)?.map(OrderId),
        orig_cl_ord_id: read_opt_u64(r)?.map(ClOrdId),
    })
}

/// A command's binary form in a vector of its own.
pub fn encode_command(command: &Command) -> Vec<u8> {
    let mut w = Writer::with_capacity(64);
    encode_command_into(&mut w, command);
    w.finish()
}

/// Appends a command's binary form to `w` (no allocation of its own).
///
/// Panics on an `AddInstrument` whose symbol is longer than [`SYMBOL_CODEC_BYTES_MAX`]: no
/// valid instrument comes near it, and callers build commands from parsed, bounded input.
pub fn encode_command_into(w: &mut Writer, command: &Command) {
    match &command.body {
        CommandBody::NewOrder(o) => new_order(w, o),
        CommandBody::Cancel(c) => {
            w.u8(FORM_CANCEL);
            w.u32(c.account.0);
            w.u64(c.cl_ord_id.0);
            order_ref(w, &c.target);
        }
        CommandBody::Replace(c) => {
            w.u8(FORM_REPLACE);
            w.u32(c.account.0);
            w.u64(c.cl_ord_id.0);
            order_ref(w, &c.target);
            opt_u64(w, c.price.map(|p| p.0 as u64));
            opt_u64(w, c.qty.map(|q| q.0 as u64));
        }
        CommandBody::MassCancel(m) => mass_cancel(w, m),
        CommandBody::Deposit { account, amount } => cash(w, FORM_DEPOSIT, account, amount),
        CommandBody::Withdraw { account, amount } => cash(w, FORM_WITHDRAW, account, amount),
        CommandBody::SetCollateral { account, amount } => {
            cash(w, FORM_SET_COLLATERAL, account, amount)
        }
        CommandBody::EndOfDay => w.u8(FORM_END_OF_DAY),
        CommandBody::SetPhase { instrument, phase } => {
            w.u8(FORM_SET_PHASE);
            opt_u32(w, instrument.map(|i| i.0));
            w.u8(code_of(&PHASES, phase));
        }
        CommandBody::AddInstrument(i) => add_instrument(w, i),
        CommandBody::AddAccount(a) => {
            w.u8(FORM_ADD_ACCOUNT);
            account_spec(w, a);
        }
        CommandBody::AddFundedAccount { spec, cash } => {
            w.u8(FORM_ADD_FUNDED_ACCOUNT);
            account_spec(w, spec);
            w.i128(cash.0);
        }
        CommandBody::KillSwitch {
            firm,
            account,
            engaged,
        } => {
            w.u8(FORM_KILL_SWITCH);
            opt_u32(w, firm.map(|f| f.0));
            opt_u32(w, account.map(|a| a.0));
            w.bool(*engaged);
        }
        CommandBody::MarginCall { account, amount } => cash(w, FORM_MARGIN_CALL, account, amount),
        CommandBody::ClearingDebit { account, amount } => {
            cash(w, FORM_CLEARING_DEBIT, account, amount)
        }
    }
    w.u64(command.ts_ns);
}

fn new_order(w: &mut Writer, o: &NewOrder) {
    w.u8(FORM_NEW_ORDER);
    w.u32(o.account.0);
    w.u64(o.cl_ord_id.0);
    w.u32(o.instrument.0);
    w.u8(code_of(&SIDES, &o.side));
    w.u8(code_of(&ORD_TYPES, &o.ord_type));
    w.i64(o.price.0);
    w.i64(o.qty.0);
    w.u8(code_of(&TIFS, &o.tif));
    w.u64(o.expire_ts_ns);
    w.i64(o.display_qty.0);
    opt_u32(w, o.firm.map(|f| f.0));
}

fn mass_cancel(w: &mut Writer, m: &MassCancel) {
    w.u8(FORM_MASS_CANCEL);
    w.u64(m.cl_ord_id.0);
    opt_u32(w, m.account.map(|a| a.0));
    opt_u32(w, m.firm.map(|f| f.0));
    opt_u32(w, m.instrument.map(|i| i.0));
    match m.side {
        Some(side) => {
            w.u8(1);
            w.u8(code_of(&SIDES, &side));
        }
        None => w.u8(0),
    }
}

fn account_spec(w: &mut Writer, a: &AccountSpec) {
    w.u32(a.account.0);
    w.u32(a.firm.0);
    w.bool(a.may_short);
    w.u8(code_of(&STP_MODES, &a.stp));
    w.u8(code_of(&STP_SCOPES, &a.stp_scope));
}

fn read_account_spec(r: &mut Reader) -> Result<AccountSpec, DecodeError> {
    Ok(AccountSpec {
        account: AccountId(r.u32()?),
        firm: FirmId(r.u32()?),
        may_short: r.bool()?,
        stp: r.code(&STP_MODES, "invalid stp mode")?,
        stp_scope: r.code(&STP_SCOPES, "invalid stp scope")?,
    })
}

fn cash(w: &mut Writer, form: u8, account: &AccountId, amount: &Cash) {
    w.u8(form);
    w.u32(account.0);
    w.i128(amount.0);
}

fn add_instrument(w: &mut Writer, i: &Instrument) {
    assert!(
        i.symbol.len() <= SYMBOL_CODEC_BYTES_MAX,
        "an instrument symbol of {} bytes is over the codec's limit",
        i.symbol.len()
    );
    let guarded = !i.volatility.is_off();
    w.u8(if guarded {
        FORM_ADD_INSTRUMENT_GUARDED
    } else {
        FORM_ADD_INSTRUMENT
    });
    w.u32(i.instrument.0);
    w.bytes(i.symbol.as_bytes());
    w.u8(code_of(&MARKETS, &i.market));
    w.u8(i.price_scale);
    w.i64(i.tick.0);
    w.i64(i.lot_size);
    w.i64(i.multiplier);
    w.i128(i.initial_margin.0);
    w.u32(i.band_bps);
    w.i64(i.reference_price.0);
    if guarded {
        w.u32(i.volatility.dynamic_bps);
        w.u32(i.volatility.static_bps);
        w.u64(i.volatility.auction_ns);
    }
}

/// Checks what a relay of a command must know without decoding it: its length is within
/// [`COMMAND_SIZE_BYTES_MAX`] and its first byte names a known form. A leader copies client
/// commands into a batch after this check; the replicas decode them when they apply them.
pub fn check_command_form(bytes: &[u8]) -> Result<(), DecodeError> {
    if bytes.len() > COMMAND_SIZE_BYTES_MAX as usize {
        return Err(DecodeError {
            offset: 0,
            what: "command longer than allowed",
        });
    }
    match bytes.first() {
        None => Err(DecodeError {
            offset: 0,
            what: "unexpected end of data",
        }),
        Some(form) if (FORM_NEW_ORDER..=FORM_LAST).contains(form) => Ok(()),
        Some(_) => Err(DecodeError {
            offset: 1,
            what: "unknown command form",
        }),
    }
}

/// Decodes exactly one command, refusing anything else (see the module documentation).
/// Inlined into its callers: the state machine calls it once per command it applies.
#[inline]
pub fn decode_command(bytes: &[u8]) -> Result<Command, DecodeError> {
    if bytes.len() > COMMAND_SIZE_BYTES_MAX as usize {
        return Err(DecodeError {
            offset: 0,
            what: "command longer than allowed",
        });
    }
    let mut r = Reader::new(bytes);
    let body = decode_body(&mut r)?;
    let command = Command::new(r.u64()?, body);
    r.expect_end()?;
    Ok(command)
}

#[inline]
fn decode_body(r: &mut Reader) -> Result<CommandBody, DecodeError> {
    Ok(match r.u8()? {
        FORM_NEW_ORDER => CommandBody::NewOrder(NewOrder {
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            side: r.code(&SIDES, "invalid side")?,
            ord_type: r.code(&ORD_TYPES, "invalid order type")?,
            price: Price(r.i64()?),
            qty: Qty(r.i64()?),
            tif: r.code(&TIFS, "invalid time in force")?,
            expire_ts_ns: r.u64()?,
            display_qty: Qty(r.i64()?),
            firm: read_opt_u32(r)?.map(FirmId),
        }),
        FORM_CANCEL => CommandBody::Cancel(Cancel {
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            target: read_order_ref(r)?,
        }),
        FORM_REPLACE => CommandBody::Replace(Replace {
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            target: read_order_ref(r)?,
            price: read_opt_u64(r)?.map(|p| Price(p as i64)),
            qty: read_opt_u64(r)?.map(|q| Qty(q as i64)),
        }),
        FORM_MASS_CANCEL => CommandBody::MassCancel(MassCancel {
            cl_ord_id: ClOrdId(r.u64()?),
            account: read_opt_u32(r)?.map(AccountId),
            firm: read_opt_u32(r)?.map(FirmId),
            instrument: read_opt_u32(r)?.map(InstrumentId),
            side: if present(r)? {
                Some(r.code(&SIDES, "invalid side")?)
            } else {
                None
            },
        }),
        form @ (FORM_DEPOSIT | FORM_WITHDRAW | FORM_SET_COLLATERAL | FORM_MARGIN_CALL
        | FORM_CLEARING_DEBIT) => {
            let account = AccountId(r.u32()?);
            let amount = Cash(r.i128()?);
            match form {
                FORM_DEPOSIT => CommandBody::Deposit { account, amount },
                FORM_WITHDRAW => CommandBody::Withdraw { account, amount },
                FORM_MARGIN_CALL => CommandBody::MarginCall { account, amount },
                FORM_CLEARING_DEBIT => CommandBody::ClearingDebit { account, amount },
                _ => CommandBody::SetCollateral { account, amount },
            }
        }
        FORM_END_OF_DAY => CommandBody::EndOfDay,
        FORM_SET_PHASE => CommandBody::SetPhase {
            instrument: read_opt_u32(r)?.map(InstrumentId),
            phase: r.code(&PHASES, "invalid phase")?,
        },
        FORM_ADD_INSTRUMENT => CommandBody::AddInstrument(read_instrument(r, false)?),
        FORM_ADD_INSTRUMENT_GUARDED => CommandBody::AddInstrument(read_instrument(r, true)?),
        FORM_ADD_ACCOUNT => CommandBody::AddAccount(read_account_spec(r)?),
        FORM_ADD_FUNDED_ACCOUNT => CommandBody::AddFundedAccount {
            spec: read_account_spec(r)?,
            cash: Cash(r.i128()?),
        },
        FORM_KILL_SWITCH => CommandBody::KillSwitch {
            firm: read_opt_u32(r)?.map(FirmId),
            account: read_opt_u32(r)?.map(AccountId),
            engaged: r.bool()?,
        },
        _ => {
            return Err(DecodeError {
                offset: r.offset(),
                what: "unknown command form",
            })
        }
    })
}

fn read_instrument(r: &mut Reader, guarded: bool) -> Result<Instrument, DecodeError> {
    let instrument = InstrumentId(r.u32()?);
    let symbol = std::str::from_utf8(r.bytes(SYMBOL_CODEC_BYTES_MAX)?)
        .map_err(|_| r.error("symbol is not UTF-8"))?
        .to_owned();
    Ok(Instrument {
        instrument,
        symbol,
        market: r.code(&MARKETS, "invalid market")?,
        price_scale: r.u8()?,
        tick: Price(r.i64()?),
        lot_size: r.i64()?,
        multiplier: r.i64()?,
        initial_margin: Cash(r.i128()?),
        band_bps: r.u32()?,
        reference_price: Price(r.i64()?),
        volatility: if guarded {
            let guard = VolatilityGuard {
                dynamic_bps: r.u32()?,
                static_bps: r.u32()?,
                auction_ns: r.u64()?,
            };
            if guard.is_off() {
                return Err(r.error("a guarded instrument without a volatility band"));
            }
            guard
        } else {
            VolatilityGuard::default()
        },
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn side() -> impl Strategy<Value = Side> {
        prop::sample::select(SIDES.to_vec())
    }

    fn order_ref() -> impl Strategy<Value = OrderRef> {
        (any::<Option<u64>>(), any::<Option<u64>>()).prop_map(|(o, c)| OrderRef {
            order_id: o.map(OrderId),
            orig_cl_ord_id: c.map(ClOrdId),
        })
    }

    fn new_order() -> impl Strategy<Value = CommandBody> {
        (
            (any::<u32>(), any::<u64>(), any::<u32>(), side()),
            prop::sample::select(ORD_TYPES.to_vec()),
            (
                any::<i64>(),
                any::<i64>(),
                prop::sample::select(TIFS.to_vec()),
            ),
            (any::<u64>(), any::<i64>(), any::<Option<u32>>()),
        )
            .prop_map(
                |(
                    (account, cl, instrument, side),
                    ord_type,
                    (price, qty, tif),
                    (exp, disp, firm),
                )| {
                    CommandBody::NewOrder(NewOrder {
                        account: AccountId(account),
                        cl_ord_id: ClOrdId(cl),
                        instrument: InstrumentId(instrument),
                        side,
                        ord_type,
                        price: Price(price),
                        qty: Qty(qty),
                        tif,
                        expire_ts_ns: exp,
                        display_qty: Qty(disp),
                        firm: firm.map(FirmId),
                    })
                },
            )
    }

    fn instrument() -> impl Strategy<Value = Instrument> {
        (
            (
                any::<u32>(),
                "\\PC{0,40}",
                prop::sample::select(MARKETS.to_vec()),
            ),
            (any::<u8>(), any::<i64>(), any::<i64>(), any::<i64>()),
            (
                any::<i128>(),
                any::<u32>(),
                any::<i64>(),
                any::<Option<(u32, u32, u64)>>(),
            ),
        )
            .prop_map(
                |(
                    (id, symbol, market),
                    (scale, tick, lot, mult),
                    (margin, band, reference, guard),
                )| {
                    Instrument {
                        instrument: InstrumentId(id),
                        symbol,
                        market,
                        price_scale: scale,
                        tick: Price(tick),
                        lot_size: lot,
                        multiplier: mult,
                        initial_margin: Cash(margin),
                        band_bps: band,
                        reference_price: Price(reference),
                        volatility: guard.map_or(VolatilityGuard::default(), |(d, s, n)| {
                            VolatilityGuard {
                                dynamic_bps: d.max(1),
                                static_bps: s,
                                auction_ns: n,
                            }
                        }),
                    }
                },
            )
    }

    /// Every variant of `CommandBody`, with any field values.
    pub(crate) fn any_body() -> impl Strategy<Value = CommandBody> {
        let cash = (0u8..4, any::<u32>(), any::<i128>()).prop_map(|(k, a, amount)| {
            let (account, amount) = (AccountId(a), Cash(amount));
            match k {
                0 => CommandBody::Deposit { account, amount },
                1 => CommandBody::Withdraw { account, amount },
                2 => CommandBody::ClearingDebit { account, amount },
                _ => CommandBody::SetCollateral { account, amount },
            }
        });
        prop_oneof![
            new_order(),
            (any::<u32>(), any::<u64>(), order_ref()).prop_map(|(a, c, target)| {
                CommandBody::Cancel(Cancel {
                    account: AccountId(a),
                    cl_ord_id: ClOrdId(c),
                    target,
                })
            }),
            (
                (any::<u32>(), any::<u64>(), order_ref()),
                (any::<Option<i64>>(), any::<Option<i64>>())
            )
                .prop_map(|((a, c, target), (price, qty))| {
                    CommandBody::Replace(Replace {
                        account: AccountId(a),
                        cl_ord_id: ClOrdId(c),
                        target,
                        price: price.map(Price),
                        qty: qty.map(Qty),
                    })
                }),
            (
                any::<u64>(),
                any::<Option<u32>>(),
                any::<Option<u32>>(),
                any::<Option<u32>>(),
                prop::option::of(side())
            )
                .prop_map(|(c, account, firm, instrument, side)| {
                    CommandBody::MassCancel(MassCancel {
                        cl_ord_id: ClOrdId(c),
                        account: account.map(AccountId),
                        firm: firm.map(FirmId),
                        instrument: instrument.map(InstrumentId),
                        side,
                    })
                }),
            cash,
            Just(CommandBody::EndOfDay),
            (any::<Option<u32>>(), prop::sample::select(PHASES.to_vec())).prop_map(|(i, phase)| {
                CommandBody::SetPhase {
                    instrument: i.map(InstrumentId),
                    phase,
                }
            }),
            instrument().prop_map(CommandBody::AddInstrument),
            (
                any::<u32>(),
                any::<u32>(),
                any::<bool>(),
                prop::sample::select(STP_MODES.to_vec()),
                prop::sample::select(STP_SCOPES.to_vec())
            )
                .prop_map(|(a, f, may_short, stp, stp_scope)| {
                    CommandBody::AddAccount(AccountSpec {
                        account: AccountId(a),
                        firm: FirmId(f),
                        may_short,
                        stp,
                        stp_scope,
                    })
                }),
            (
                (any::<u32>(), any::<u32>(), any::<bool>()),
                prop::sample::select(STP_MODES.to_vec()),
                prop::sample::select(STP_SCOPES.to_vec()),
                any::<i128>()
            )
                .prop_map(|((a, f, may_short), stp, stp_scope, cash)| {
                    CommandBody::AddFundedAccount {
                        spec: AccountSpec {
                            account: AccountId(a),
                            firm: FirmId(f),
                            may_short,
                            stp,
                            stp_scope,
                        },
                        cash: Cash(cash),
                    }
                }),
            (any::<Option<u32>>(), any::<Option<u32>>(), any::<bool>()).prop_map(
                |(f, a, engaged)| CommandBody::KillSwitch {
                    firm: f.map(FirmId),
                    account: a.map(AccountId),
                    engaged,
                }
            ),
            (any::<u32>(), any::<i128>()).prop_map(|(a, amount)| CommandBody::MarginCall {
                account: AccountId(a),
                amount: Cash(amount),
            }),
        ]
    }

    pub(crate) fn any_command() -> impl Strategy<Value = Command> {
        (any::<u64>(), any_body()).prop_map(|(ts_ns, body)| Command::new(ts_ns, body))
    }

    proptest! {
        #[test]
        fn every_command_round_trips_and_passes_the_form_check(command in any_command()) {
            let bytes = encode_command(&command);
            prop_assert!(bytes.len() <= COMMAND_SIZE_BYTES_MAX as usize);
            prop_assert_eq!(check_command_form(&bytes), Ok(()));
            prop_assert_eq!(decode_command(&bytes), Ok(command));
        }

        #[test]
        fn a_cut_or_longer_command_is_refused(command in any_command(), cut in any::<prop::sample::Index>()) {
            let bytes = encode_command(&command);
            prop_assert!(decode_command(&bytes[..cut.index(bytes.len())]).is_err());
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert!(decode_command(&longer).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = check_command_form(&bytes);
            let _ = decode_command(&bytes);
        }

        #[test]
        fn bytes_after_a_valid_form_byte_never_panic(
            form in FORM_NEW_ORDER..=FORM_LAST,
            rest in proptest::collection::vec(any::<u8>(), 0..96),
        ) {
            let mut bytes = vec![form];
            bytes.extend_from_slice(&rest);
            let _ = decode_command(&bytes);
        }
    }

    #[test]
    fn a_damaged_command_is_refused_with_the_offset_and_the_reason() {
        let order = Command::new(
            7,
            CommandBody::NewOrder(NewOrder {
                firm: None,
                account: AccountId(3),
                cl_ord_id: ClOrdId(4),
                instrument: InstrumentId(5),
                side: Side::Sell,
                ord_type: OrdType::Limit,
                price: Price(100),
                qty: Qty(2),
                tif: TimeInForce::Day,
                expire_ts_ns: 0,
                display_qty: Qty(0),
            }),
        );
        let bytes = encode_command(&order);
        // form 1, account 4, cl_ord_id 8, instrument 4, then the side at offset 17.
        assert_eq!(bytes.len(), 61);
        assert_eq!(decode_command(&bytes), Ok(order));
        let err = |offset, what| Err(DecodeError { offset, what });
        assert_eq!(
            decode_command(&bytes[..30]),
            err(27, "unexpected end of data")
        );
        let mut bad = bytes.clone();
        bad[17] = 2;
        assert_eq!(decode_command(&bad), err(18, "invalid side"));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode_command(&longer), err(61, "trailing bytes"));
        assert_eq!(decode_command(&[99]), err(1, "unknown command form"));
        assert_eq!(decode_command(&[0]), err(1, "unknown command form"));
        assert_eq!(
            check_command_form(&[0]).map(|()| decode_command(&[0]).unwrap()),
            err(1, "unknown command form")
        );
        assert_eq!(decode_command(&[]), err(0, "unexpected end of data"));
        let huge = vec![FORM_ADD_INSTRUMENT; COMMAND_SIZE_BYTES_MAX as usize + 1];
        assert_eq!(decode_command(&huge), err(0, "command longer than allowed"));
        assert_eq!(
            check_command_form(&huge).map(|()| decode_command(&huge).unwrap()),
            err(0, "command longer than allowed")
        );
    }

    #[test]
    fn a_symbol_length_beyond_the_limit_is_refused_before_allocating() {
        let mut bytes = vec![FORM_ADD_INSTRUMENT];
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_command(&bytes),
            Err(DecodeError {
                offset: 9,
                what: "byte string longer than allowed"
            })
        );
    }
}
