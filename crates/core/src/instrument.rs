//! Instruments and accounts: what trades and who trades.

use crate::ids::{AccountId, FirmId, InstrumentId};
use crate::num::{Cash, Price, Qty, CASH_SCALE, PRICE_MAX};
use serde::{Deserialize, Serialize};

/// The largest symbol length, in bytes.
pub const SYMBOL_LEN_MAX: usize = 32;
/// The largest price scale (decimals) an instrument may use.
pub const PRICE_SCALE_MAX: u8 = 12;
/// Price bands are given in basis points; 10,000 bps = 100%.
pub const BAND_BPS_MAX: u32 = 10_000;

/// Powers of ten up to the largest scale difference between prices and cash.
const POW10: [i128; PRICE_SCALE_MAX as usize + 1] = {
    let mut t = [1i128; PRICE_SCALE_MAX as usize + 1];
    let mut i = 1;
    while i < t.len() {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// The largest raw notional the fast path takes: scaling it by any power of ten up to the
/// largest price scale cannot overflow an i128.
const NOTIONAL_FAST_RAW_MAX: u128 = i128::MAX as u128 / POW10[PRICE_SCALE_MAX as usize] as u128;

/// The three markets of the seeds: equities and FX (ASTS), derivatives (SPECTRA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Market {
    /// Cash equities: a buy pays cash, a sell delivers a position.
    Equity,
    /// FX pairs, settled in the venue's one settlement currency: the position is in the base
    /// currency, the price is the quote. (One settlement currency is a simplification stated in
    /// ARCHITECTURE.md; multi-currency accounts are future work.)
    Fx,
    /// Futures: no premium changes hands on a trade; each contract locks initial margin.
    Futures,
}

/// Trading phase of an instrument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Continuous trading: orders are accepted and matched.
    Open,
    /// Trading is suspended: new orders and replaces are rejected, cancels are accepted.
    Halted,
    /// The instrument is closed for the day: new orders and replaces are rejected, cancels are
    /// accepted.
    Closed,
    /// A scheduled pause of the session (MOEX's intermediate and evening clearing): new
    /// orders and replaces are rejected with `InstrumentPaused`, resting orders stay, cancels
    /// are accepted. Apart from `Halted`, which is an operator's unscheduled stop.
    Paused,
    /// The opening call auction: orders (limit and market; Day, GTC, GTD, at the opening and
    /// good for auction) rest without matching; leaving the phase uncrosses the book at one
    /// price (`docs/engine-jsonl.md`, "Call auctions").
    OpeningAuction,
    /// The closing call auction, as the opening one (at the close instead of at the opening);
    /// its uncrossing price is the instrument's official close.
    ClosingAuction,
    /// A volatility interruption: a call auction that an order entered in continuous trading
    /// starts when it would trade outside the instrument's [`VolatilityGuard`] bands. It ends
    /// at `ts_ns + auction_ns` (acted on by the first command at or after that time) if its
    /// indicative price is within the bands, else it is extended; or by `SetPhase`.
    VolatilityAuction,
}

impl Phase {
    /// Whether the phase is a call auction (orders rest without matching).
    #[inline]
    pub fn is_auction(self) -> bool {
        matches!(
            self,
            Phase::OpeningAuction | Phase::ClosingAuction | Phase::VolatilityAuction
        )
    }
}

/// The largest volatility auction length: a day.
pub const AUCTION_NS_MAX: u64 = 86_400 * 1_000_000_000;

/// An instrument's volatility interruption: bands around prices, in basis points, that a trade
/// in continuous trading may not leave; an order that would trade outside one starts a
/// volatility auction of `auction_ns` instead. A band of 0 is off; all 0 (the default) is no
/// volatility interruption at all, as before it existed. Apart from the hard price band
/// (`band_bps`), which refuses orders priced outside it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolatilityGuard {
    /// The dynamic band around the last trade price (as it was when the incoming order arrived).
    #[serde(default)]
    pub dynamic_bps: u32,
    /// The static band around the static reference price: the instrument's reference price,
    /// then the price of each auction that executed.
    #[serde(default)]
    pub static_bps: u32,
    /// The length of a volatility auction, and of each extension, in nanoseconds.
    #[serde(default)]
    pub auction_ns: u64,
}

impl VolatilityGuard {
    /// True when no band is set (serde skips the field then).
    pub fn is_off(&self) -> bool {
        self.dynamic_bps == 0 && self.static_bps == 0
    }

    /// Checks the setting: bands of at most 10,000 bps, and a positive auction length (at most
    /// a day) if a band is set.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.dynamic_bps > BAND_BPS_MAX || self.static_bps > BAND_BPS_MAX {
            return Err("volatility bands must be at most 10000 bps");
        }
        if !self.is_off() && (self.auction_ns == 0 || self.auction_ns > AUCTION_NS_MAX) {
            return Err("a volatility band needs auction_ns in 1..=86400000000000");
        }
        if self.is_off() && self.auction_ns != 0 {
            return Err("auction_ns needs a volatility band");
        }
        Ok(())
    }

    /// Whether `price` is within `bps` basis points of `reference` (always, for a band of 0).
    #[inline]
    pub fn within(bps: u32, reference: Price, price: Price) -> bool {
        bps == 0
            || (price.0 as i128 - reference.0 as i128).abs() * BAND_BPS_MAX as i128
                <= reference.0 as i128 * bps as i128
    }
}

/// Self-trade prevention: what happens when an incoming order would trade against a resting
/// order of the same account (or firm, by [`StpScope`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StpMode {
    /// Self-trades are allowed.
    #[default]
    None,
    /// The resting order is cancelled and matching continues.
    CancelResting,
    /// The incoming order's remainder is cancelled; the resting order stays.
    CancelIncoming,
    /// Both the resting order and the incoming remainder are cancelled.
    CancelBoth,
}

/// Whether self-trade prevention compares accounts or firms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StpScope {
    #[default]
    Account,
    Firm,
}

/// An instrument's symbol held inline (1 to [`SYMBOL_LEN_MAX`] bytes of UTF-8), so that the
/// event announcing an instrument stays `Copy` like every other event.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Symbol {
    len: u8,
    bytes: [u8; SYMBOL_LEN_MAX],
}

impl Symbol {
    /// The symbol, or None unless it has 1 to [`SYMBOL_LEN_MAX`] bytes.
    pub fn new(s: &str) -> Option<Symbol> {
        if s.is_empty() || s.len() > SYMBOL_LEN_MAX {
            return None;
        }
        let mut bytes = [0u8; SYMBOL_LEN_MAX];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Some(Symbol {
            len: s.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // Built only from a `&str` cut at its own length, so always UTF-8.
        std::str::from_utf8(&self.bytes[..self.len as usize]).expect("a symbol is UTF-8")
    }
}

impl std::fmt::Debug for Symbol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Symbol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Symbol {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Symbol {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Symbol, D::Error> {
        let s = String::deserialize(d)?;
        Symbol::new(&s).ok_or_else(|| serde::de::Error::custom("symbol must have 1 to 32 bytes"))
    }
}

/// An instrument's definition as the event that announces it carries it: everything of an
/// [`Instrument`] but its id (which the event carries beside it), with the reference price it
/// was added with. Consumers of the committed stream (gateways, market data, ITCH, clearing)
/// learn instruments added at run time from it. An output only, flattened into the event's
/// JSON object (serde cannot refuse unknown fields of a flattened struct; inputs use
/// [`Instrument`], which does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstrumentDef {
    pub symbol: Symbol,
    pub market: Market,
    pub price_scale: u8,
    pub tick: Price,
    pub lot_size: i64,
    pub multiplier: i64,
    pub initial_margin: Cash,
    pub band_bps: u32,
    pub reference_price: Price,
    #[serde(default, skip_serializing_if = "VolatilityGuard::is_off")]
    pub volatility: VolatilityGuard,
}

impl InstrumentDef {
    /// The instrument `id` with this definition.
    pub fn instrument(&self, id: InstrumentId) -> Instrument {
        Instrument {
            instrument: id,
            symbol: self.symbol.as_str().to_owned(),
            market: self.market,
            price_scale: self.price_scale,
            tick: self.tick,
            lot_size: self.lot_size,
            multiplier: self.multiplier,
            initial_margin: self.initial_margin,
            band_bps: self.band_bps,
            reference_price: self.reference_price,
            volatility: self.volatility,
        }
    }
}

/// The definition of an instrument, given by `AddInstrument`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instrument {
    pub instrument: InstrumentId,
    pub symbol: String,
    pub market: Market,
    /// Decimals of the price: a raw price of 10125 with scale 2 means 101.25.
    pub price_scale: u8,
    /// Minimum price increment, in raw price units.
    pub tick: Price,
    /// Units of the underlying per lot (quantities are counted in lots).
    #[serde(default = "one")]
    pub lot_size: i64,
    /// Contract multiplier (futures); 1 for equities and FX.
    #[serde(default = "one")]
    pub multiplier: i64,
    /// Initial margin per contract (futures only), in cash units.
    #[serde(default)]
    pub initial_margin: Cash,
    /// Price band: limit prices outside reference ± band_bps/10,000 are rejected, and market
    /// orders trade no further than the band.
    pub band_bps: u32,
    /// The reference price the band is centred on; it follows the last trade.
    pub reference_price: Price,
    /// The volatility interruption (off unless given).
    #[serde(default, skip_serializing_if = "VolatilityGuard::is_off")]
    pub volatility: VolatilityGuard,
}

pub(crate) fn one() -> i64 {
    1
}

impl Instrument {
    /// Checks the definition. Returns a description of the first problem.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.symbol.is_empty() || self.symbol.len() > SYMBOL_LEN_MAX {
            return Err("symbol must have 1 to 32 bytes");
        }
        if self.price_scale > PRICE_SCALE_MAX {
            return Err("price_scale must be at most 12");
        }
        if self.tick.0 <= 0 || self.tick.0 > PRICE_MAX {
            return Err("tick must be positive");
        }
        if self.lot_size <= 0 || self.lot_size > 1_000_000_000 {
            return Err("lot_size must be in 1..=10^9");
        }
        if self.multiplier <= 0 || self.multiplier > 1_000_000_000 {
            return Err("multiplier must be in 1..=10^9");
        }
        if self.band_bps == 0 || self.band_bps > BAND_BPS_MAX {
            return Err("band_bps must be in 1..=10000");
        }
        if self.reference_price.0 <= 0 || self.reference_price.0 > PRICE_MAX {
            return Err("reference_price must be positive");
        }
        if self.reference_price.0 % self.tick.0 != 0 {
            return Err("reference_price must be on the tick");
        }
        self.volatility.validate()?;
        match self.market {
            Market::Futures => {
                if self.initial_margin.0 <= 0 || self.initial_margin.0 > 1_000_000_000_000_000 {
                    return Err("futures need a positive initial_margin");
                }
            }
            Market::Equity | Market::Fx => {
                if self.initial_margin.0 != 0 {
                    return Err("initial_margin applies to futures only");
                }
            }
        }
        Ok(())
    }

    /// The definition an `InstrumentAdded` event carries; None if the symbol is not 1 to
    /// [`SYMBOL_LEN_MAX`] bytes (never for an instrument that passed [`Instrument::validate`]).
    pub fn def(&self) -> Option<InstrumentDef> {
        Some(InstrumentDef {
            symbol: Symbol::new(&self.symbol)?,
            market: self.market,
            price_scale: self.price_scale,
            tick: self.tick,
            lot_size: self.lot_size,
            multiplier: self.multiplier,
            initial_margin: self.initial_margin,
            band_bps: self.band_bps,
            reference_price: self.reference_price,
            volatility: self.volatility,
        })
    }

    /// The value of `qty` lots at `price`, in cash units, rounded down (what changes hands in
    /// a trade). None if the product does not fit the arithmetic (never for valid orders).
    pub fn notional_floor(&self, price: Price, qty: Qty) -> Option<i128> {
        let (num, div) = self.notional_parts(price, qty)?;
        if div == 1 {
            return Some(num);
        }
        Some(num.div_euclid(div))
    }

    /// The value of `qty` lots at `price`, in cash units, rounded up (what a reservation holds,
    /// so that it always covers the trade it stands for).
    pub fn notional_ceil(&self, price: Price, qty: Qty) -> Option<i128> {
        let (num, div) = self.notional_parts(price, qty)?;
        if div == 1 {
            // 128-bit division is a library call even by one; most instruments never divide.
            return Some(num);
        }
        let q = num.div_euclid(div);
        Some(if num.rem_euclid(div) == 0 { q } else { q + 1 })
    }

    #[inline]
    fn notional_parts(&self, price: Price, qty: Qty) -> Option<(i128, i128)> {
        // Fast path for the usual case (every order the engine admits): non-negative values
        // whose products fit 64 bits each, so one widening multiply does it with no overflow
        // checks on 128-bit values, which cost several multiplies each.
        if price.0 >= 0 && qty.0 >= 0 {
            let units = (self.lot_size as u64).checked_mul(self.multiplier as u64);
            let pq = (price.0 as u64).checked_mul(qty.0 as u64);
            if let (Some(units), Some(pq)) = (units, pq) {
                let raw = pq as u128 * units as u128;
                if raw <= NOTIONAL_FAST_RAW_MAX {
                    let raw = raw as i128;
                    return Some(if self.price_scale <= CASH_SCALE {
                        (raw * POW10[(CASH_SCALE - self.price_scale) as usize], 1)
                    } else {
                        (raw, POW10[(self.price_scale - CASH_SCALE) as usize])
                    });
                }
            }
        }
        let raw = (price.0 as i128)
            .checked_mul(qty.0 as i128)?
            .checked_mul(self.lot_size as i128)?
            .checked_mul(self.multiplier as i128)?;
        if self.price_scale <= CASH_SCALE {
            let mul = POW10[(CASH_SCALE - self.price_scale) as usize];
            Some((raw.checked_mul(mul)?, 1))
        } else {
            Some((raw, POW10[(self.price_scale - CASH_SCALE) as usize]))
        }
    }

    /// The band's lowest and highest acceptable prices, snapped inwards to the tick.
    pub fn band(&self) -> (Price, Price) {
        let reference = self.reference_price.0 as i128;
        let width = reference * self.band_bps as i128 / BAND_BPS_MAX as i128;
        let tick = self.tick.0 as i128;
        let mut low = reference - width;
        let mut high = reference + width;
        // Snap inwards so the band never admits a price a tick beyond its percentage.
        low = (low + tick - 1).div_euclid(tick) * tick;
        high = high.div_euclid(tick) * tick;
        low = low.max(tick);
        high = high.min(PRICE_MAX as i128 / tick * tick);
        (Price(low as i64), Price(high as i64))
    }
}

/// The definition of an account, given by `AddAccount`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountSpec {
    pub account: AccountId,
    pub firm: FirmId,
    /// May the account sell equities or FX it does not hold? Uncovered sells then reserve their
    /// notional in cash as collateral.
    #[serde(default)]
    pub may_short: bool,
    #[serde(default)]
    pub stp: StpMode,
    #[serde(default)]
    pub stp_scope: StpScope,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn equity() -> Instrument {
        Instrument {
            instrument: InstrumentId(1),
            symbol: "SBER".into(),
            market: Market::Equity,
            price_scale: 2,
            tick: Price(1),
            lot_size: 10,
            multiplier: 1,
            initial_margin: Cash(0),
            band_bps: 1000,
            reference_price: Price(10000),
            volatility: VolatilityGuard::default(),
        }
    }

    #[test]
    fn notional_is_exact_when_price_scale_is_below_cash_scale() {
        let i = equity();
        // 100.00 * 3 lots * 10 = 3000.00 = 30_000_000 cash units at scale 4.
        assert_eq!(i.notional_floor(Price(10000), Qty(3)), Some(30_000_000));
        assert_eq!(i.notional_ceil(Price(10000), Qty(3)), Some(30_000_000));
    }

    #[test]
    fn notional_rounds_down_for_trades_and_up_for_reservations() {
        let mut i = equity();
        i.price_scale = 6;
        i.lot_size = 1;
        // 1.083451 * 1 = 1.0834 (floor) or 1.0835 (ceil) at scale 4.
        assert_eq!(i.notional_floor(Price(1_083_451), Qty(1)), Some(10_834));
        assert_eq!(i.notional_ceil(Price(1_083_451), Qty(1)), Some(10_835));
    }

    #[test]
    fn the_fast_and_the_checked_notional_agree() {
        let mut i = equity();
        for (scale, price, qty) in [
            (2u8, 10_000i64, 3i64),
            (6, 1_083_451, 7),
            (0, 1, 1),
            (12, i64::MAX / 3, 2),
        ] {
            i.price_scale = scale;
            let fast = i.notional_parts(Price(price), Qty(qty));
            let raw = (price as i128).checked_mul(qty as i128 * 10);
            let slow = raw.map(|r| {
                if scale <= CASH_SCALE {
                    (r * 10i128.pow((CASH_SCALE - scale) as u32), 1)
                } else {
                    (r, 10i128.pow((scale - CASH_SCALE) as u32))
                }
            });
            assert_eq!(fast, slow, "scale {scale} price {price} qty {qty}");
        }
        assert_eq!(
            i.notional_floor(Price(-5), Qty(2)).map(|v| v.signum()),
            Some(-1)
        );
    }

    #[test]
    fn band_is_snapped_inside_to_the_tick() {
        let mut i = equity();
        i.tick = Price(7);
        i.reference_price = Price(10003);
        let (low, high) = i.band();
        assert!(low.0 % 7 == 0 && high.0 % 7 == 0);
        assert!(low.0 >= 10003 - 1000 && high.0 <= 10003 + 1000);
    }

    #[test]
    fn invalid_definitions_are_refused() {
        let mut i = equity();
        assert!(i.validate().is_ok());
        i.tick = Price(0);
        assert!(i.validate().is_err());
        let mut i = equity();
        i.market = Market::Futures;
        assert!(i.validate().is_err(), "futures need margin");
    }
}

#[cfg(test)]
mod definition_tests {
    use super::*;
    use crate::Event;

    #[test]
    fn an_instrument_added_event_is_one_flat_json_object_that_reads_back() {
        let def = Instrument {
            instrument: InstrumentId(4),
            symbol: "Si-12.26".into(),
            market: Market::Futures,
            price_scale: 0,
            tick: Price(1),
            lot_size: 1_000,
            multiplier: 1,
            initial_margin: Cash(5_000_0000),
            band_bps: 700,
            reference_price: Price(80_000),
            volatility: VolatilityGuard::default(),
        };
        let event = Event::InstrumentAdded {
            instrument: def.instrument,
            definition: def.def().unwrap(),
            ts_ns: 9,
        };
        let json = serde_json::to_value(event).unwrap();
        assert_eq!(json["event"], "instrument_added");
        assert_eq!(json["symbol"], "Si-12.26");
        assert_eq!(json["lot_size"], 1_000);
        let back: Event = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
        let Event::InstrumentAdded { definition, .. } = back else {
            unreachable!()
        };
        assert_eq!(definition.instrument(InstrumentId(4)), def);
    }

    #[test]
    fn a_symbol_holds_one_to_32_bytes() {
        assert!(Symbol::new("").is_none());
        assert!(Symbol::new(&"x".repeat(SYMBOL_LEN_MAX + 1)).is_none());
        let s = Symbol::new("ГАЗП").unwrap();
        assert_eq!(s.as_str(), "ГАЗП");
        assert!(serde_json::from_str::<Symbol>("\"\"").is_err());
    }
}
