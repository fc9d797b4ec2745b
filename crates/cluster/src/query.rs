//! Queries a node answers from its committed state (`net::Request::Instruments`).
//!
//! [`InstrumentsAnswer`]: every instrument the core holds, with the definition its
//! `InstrumentAdded` event carried, and the first log index the answering state has not
//! applied. A gateway's link asks for it when it starts: a gateway that crashed (no saved
//! order state) starts its committed stream after the leader's last applied index, so the
//! `InstrumentAdded` of an instrument an operator added earlier is behind it; the answer
//! covers every entry before the stream's start, so together they miss no instrument.
//!
//! The answer's bytes (little-endian, `bourse_core::codec`):
//!
//! ```text
//! version u8 = 1, next_index u64, instruments_total u32,
//! event list (bourse_core::codec::encode_events): one InstrumentAdded per instrument,
//!   ids strictly ascending, at most INSTRUMENTS_ANSWER_MAX
//! ```
//!
//! A core holding more than [`INSTRUMENTS_ANSWER_MAX`] instruments answers the first ones and
//! its total, and [`InstrumentsAnswer::complete`] refuses that answer by name: the bound keeps
//! the frame far below `net::FRAME_SIZE_BYTES_MAX`. The decoder refuses an unknown version,
//! an event of another kind, ids out of order, more instruments than the bound or than the
//! total, and trailing bytes, naming what is wrong; it never panics (property-tested below).

use bourse_core::codec::{decode_events, encode_events, Reader, Writer};
use bourse_core::{Event, InstrumentDef, InstrumentId};

use crate::state::ReplicatedState;

/// The most instruments one answer carries (an encoded `InstrumentAdded` takes at most 103
/// bytes, so an answer stays under 7 MB).
pub const INSTRUMENTS_ANSWER_MAX: usize = 65_536;

const VERSION: u8 = 1;

/// A core's instruments as of one applied log index (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstrumentsAnswer {
    /// The first log index the answering state had not applied: the answer reflects every
    /// entry before it.
    pub next_index: u64,
    /// How many instruments the core holds (more than `instruments` only past the bound).
    pub instruments_total: u32,
    /// Id and definition, ids strictly ascending.
    pub instruments: Vec<(InstrumentId, InstrumentDef)>,
}

impl InstrumentsAnswer {
    /// The answer of `state`, which has applied every entry before `next_index`.
    pub fn of_state(state: &ReplicatedState, next_index: u64) -> InstrumentsAnswer {
        let mut instruments: Vec<(InstrumentId, InstrumentDef)> = state
            .engine()
            .instruments()
            // The engine holds only instruments whose definition is valid (it refuses the
            // others), so every one has a definition.
            .filter_map(|i| Some((i.instrument, i.def()?)))
            .collect();
        instruments.sort_by_key(|(id, _)| *id);
        let instruments_total = u32::try_from(instruments.len()).unwrap_or(u32::MAX);
        instruments.truncate(INSTRUMENTS_ANSWER_MAX);
        InstrumentsAnswer {
            next_index,
            instruments_total,
            instruments,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.instruments.len() <= INSTRUMENTS_ANSWER_MAX);
        let events: Vec<Event> = self
            .instruments
            .iter()
            .map(|&(instrument, definition)| Event::InstrumentAdded {
                instrument,
                definition,
                ts_ns: 0,
            })
            .collect();
        let list = encode_events(&events);
        let mut w = Writer::with_capacity(13 + list.len());
        w.u8(VERSION);
        w.u64(self.next_index);
        w.u32(self.instruments_total);
        w.buf.extend_from_slice(&list);
        w.finish()
    }

    /// Reads what [`InstrumentsAnswer::encode`] wrote, or says what is wrong and where.
    pub fn decode(bytes: &[u8]) -> Result<InstrumentsAnswer, String> {
        let bad = |e: bourse_core::codec::DecodeError| format!("instruments answer: {e}");
        let mut r = Reader::new(bytes);
        let version = r.u8().map_err(bad)?;
        if version != VERSION {
            return Err(format!(
                "instruments answer: version {version}, this build reads {VERSION}"
            ));
        }
        let next_index = r.u64().map_err(bad)?;
        let instruments_total = r.u32().map_err(bad)?;
        let list_at = r.offset();
        let events = decode_events(&bytes[list_at..]).map_err(|e| {
            format!(
                "instruments answer: {} at byte {}",
                e.what,
                list_at + e.offset
            )
        })?;
        if events.len() > INSTRUMENTS_ANSWER_MAX {
            return Err(format!(
                "instruments answer: {} instruments, more than the {INSTRUMENTS_ANSWER_MAX} \
                 an answer carries",
                events.len()
            ));
        }
        if events.len() as u64 > u64::from(instruments_total) {
            return Err(format!(
                "instruments answer: {} instruments listed, more than the total {instruments_total}",
                events.len()
            ));
        }
        let mut instruments = Vec::with_capacity(events.len());
        for (n, event) in events.into_iter().enumerate() {
            let Event::InstrumentAdded {
                instrument,
                definition,
                ..
            } = event
            else {
                return Err(format!(
                    "instruments answer: entry {n} is not an InstrumentAdded event"
                ));
            };
            if instruments
                .last()
                .is_some_and(|&(previous, _)| previous >= instrument)
            {
                return Err(format!(
                    "instruments answer: instrument {} at entry {n} is not after the one before \
                     (ids must be strictly ascending)",
                    instrument.0
                ));
            }
            instruments.push((instrument, definition));
        }
        Ok(InstrumentsAnswer {
            next_index,
            instruments_total,
            instruments,
        })
    }

    /// Whether the answer lists every instrument of the core; an error naming the counts if
    /// the core holds more than an answer carries.
    pub fn complete(&self) -> Result<(), String> {
        if self.instruments.len() as u64 == u64::from(self.instruments_total) {
            return Ok(());
        }
        Err(format!(
            "the core holds {} instruments, more than the {INSTRUMENTS_ANSWER_MAX} its instruments \
             answer carries",
            self.instruments_total
        ))
    }

    /// The answer as the `InstrumentAdded` events a consumer of the stream would have read
    /// (`ts_ns` 0: the core keeps no time of an addition).
    pub fn events(&self) -> Vec<Event> {
        self.instruments
            .iter()
            .map(|&(instrument, definition)| Event::InstrumentAdded {
                instrument,
                definition,
                ts_ns: 0,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::{Cash, Market, Price, Symbol};
    use proptest::prelude::*;

    fn definition() -> impl Strategy<Value = InstrumentDef> {
        (
            "[A-Z0-9]{1,32}",
            0u8..3,
            any::<u8>(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            any::<i128>(),
            any::<u32>(),
            any::<i64>(),
        )
            .prop_map(
                |(symbol, market, scale, tick, lot, multiplier, margin, band, reference)| {
                    InstrumentDef {
                        symbol: Symbol::new(&symbol).expect("1 to 32 bytes"),
                        market: [Market::Equity, Market::Fx, Market::Futures][market as usize],
                        price_scale: scale,
                        tick: Price(tick),
                        lot_size: lot,
                        multiplier,
                        initial_margin: Cash(margin),
                        band_bps: band,
                        reference_price: Price(reference),
                    }
                },
            )
    }

    fn answer() -> impl Strategy<Value = InstrumentsAnswer> {
        (
            any::<u64>(),
            proptest::collection::btree_map(any::<u32>(), definition(), 0..20),
            0u32..5,
        )
            .prop_map(|(next_index, defs, beyond)| InstrumentsAnswer {
                next_index,
                instruments_total: defs.len() as u32 + beyond,
                instruments: defs
                    .into_iter()
                    .map(|(id, d)| (InstrumentId(id), d))
                    .collect(),
            })
    }

    proptest! {
        #[test]
        fn an_answer_reads_back_as_written(a in answer()) {
            let bytes = a.encode();
            prop_assert_eq!(InstrumentsAnswer::decode(&bytes), Ok(a));
        }

        #[test]
        fn every_cut_of_an_answer_is_refused_by_name(a in answer(), cut in any::<prop::sample::Index>()) {
            let bytes = a.encode();
            let len = cut.index(bytes.len());
            let e = InstrumentsAnswer::decode(&bytes[..len]).unwrap_err();
            prop_assert!(e.starts_with("instruments answer: "), "{}", e);
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = InstrumentsAnswer::decode(&bytes);
        }

        #[test]
        fn a_changed_byte_never_panics_and_still_reads_as_a_valid_answer_or_is_refused(
            a in answer(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let mut bytes = a.encode();
            let i = at.index(bytes.len());
            bytes[i] = byte;
            if let Ok(b) = InstrumentsAnswer::decode(&bytes) {
                // What decodes keeps the answer's rules.
                prop_assert!(b.instruments.len() as u64 <= u64::from(b.instruments_total));
                prop_assert!(b.instruments.windows(2).all(|w| w[0].0 < w[1].0));
            }
        }
    }

    fn some_definition(symbol: &str) -> InstrumentDef {
        InstrumentDef {
            symbol: Symbol::new(symbol).unwrap(),
            market: Market::Futures,
            price_scale: 0,
            tick: Price(10),
            lot_size: 1,
            multiplier: 1,
            initial_margin: Cash(5_000),
            band_bps: 1_000,
            reference_price: Price(110_000),
        }
    }

    #[test]
    fn an_unknown_version_other_events_ids_out_of_order_and_a_short_total_are_refused() {
        let a = InstrumentsAnswer {
            next_index: 7,
            instruments_total: 2,
            instruments: vec![
                (InstrumentId(3), some_definition("RTS")),
                (InstrumentId(5), some_definition("SI")),
            ],
        };
        let mut bytes = a.encode();
        bytes[0] = 2;
        let e = InstrumentsAnswer::decode(&bytes).unwrap_err();
        assert!(e.contains("version 2"), "{e}");

        let mut swapped = a.clone();
        swapped.instruments.reverse();
        let e = InstrumentsAnswer::decode(&swapped.encode()).unwrap_err();
        assert!(e.contains("strictly ascending"), "{e}");

        let mut short = a.clone();
        short.instruments_total = 1;
        let e = InstrumentsAnswer::decode(&short.encode()).unwrap_err();
        assert!(e.contains("more than the total 1"), "{e}");

        let mut other = Writer::default();
        other.u8(VERSION);
        other.u64(1);
        other.u32(1);
        other
            .buf
            .extend_from_slice(&encode_events(&[Event::EndOfDayDone {
                orders_expired: 0,
                ts_ns: 0,
            }]));
        let e = InstrumentsAnswer::decode(&other.finish()).unwrap_err();
        assert!(e.contains("entry 0 is not an InstrumentAdded"), "{e}");

        let mut trailing = a.encode();
        trailing.push(0);
        assert!(InstrumentsAnswer::decode(&trailing).is_err());
    }

    #[test]
    fn an_answer_past_the_bound_is_refused_as_incomplete() {
        let a = InstrumentsAnswer {
            next_index: 1,
            instruments_total: 70_000,
            instruments: vec![(InstrumentId(1), some_definition("RTS"))],
        };
        let e = a.complete().unwrap_err();
        assert!(e.contains("70000 instruments"), "{e}");
        let whole = InstrumentsAnswer {
            instruments_total: 1,
            ..a
        };
        assert_eq!(whole.complete(), Ok(()));
    }
}
