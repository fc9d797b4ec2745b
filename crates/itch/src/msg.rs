//! The ITCH 5.0 messages bourse publishes, their binary form and their decoder.
//!
//! Every message starts with the same 11 bytes: the message type (one ASCII letter), the
//! stock locate code (u16), the tracking number (u16) and the time stamp (48 bits, nanoseconds
//! since midnight). Integers are big-endian; prices are `Price(4)`, a u32 with four implied
//! decimals; a stock is eight ASCII characters, left-aligned and space-padded.

use std::fmt;

/// Bytes of the header every message starts with.
pub const HEADER_BYTES: usize = 11;
/// Largest message bourse writes (Net Order Imbalance Indicator, 50 bytes).
pub const MESSAGE_BYTES_MAX: usize = 50;
/// Nanoseconds in a day: ITCH time stamps count from midnight.
pub const DAY_NS: u64 = 86_400_000_000_000;

/// The system event codes (message `S`).
pub mod event_code {
    pub const START_OF_MESSAGES: u8 = b'O';
    pub const START_OF_SYSTEM_HOURS: u8 = b'S';
    pub const START_OF_MARKET_HOURS: u8 = b'Q';
    pub const END_OF_MARKET_HOURS: u8 = b'M';
    pub const END_OF_SYSTEM_HOURS: u8 = b'E';
    pub const END_OF_MESSAGES: u8 = b'C';
}

/// The cross types of Cross Trade (`Q`) and NOII (`I`) messages: the opening auction, the
/// closing auction, and a halt's cross (bourse's volatility auction).
pub mod cross_type {
    pub const OPENING: u8 = b'O';
    pub const CLOSING: u8 = b'C';
    pub const HALT: u8 = b'H';
}

/// The header fields every message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub stock_locate: u16,
    pub tracking_number: u16,
    /// Nanoseconds since midnight (48 bits on the wire).
    pub timestamp_ns: u64,
}

/// A stock directory entry (message `R`): bourse fills what it knows (symbol, round lot) and
/// writes the "not applicable" value of every field it has no notion of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StockDirectory {
    pub stock: [u8; 8],
    pub market_category: u8,
    pub financial_status: u8,
    pub round_lot_size: u32,
    pub round_lots_only: u8,
    pub issue_classification: u8,
    pub issue_subtype: [u8; 2],
    pub authenticity: u8,
    pub short_sale_threshold: u8,
    pub ipo_flag: u8,
    pub luld_tier: u8,
    pub etp_flag: u8,
    pub etp_leverage_factor: u32,
    pub inverse: u8,
}

/// One ITCH 5.0 message of the kinds bourse publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// `S`
    SystemEvent { event_code: u8 },
    /// `R`
    StockDirectory(StockDirectory),
    /// `A`: an order entered the book (no attribution).
    AddOrder {
        order_ref: u64,
        side: u8,
        shares: u32,
        stock: [u8; 8],
        price: u32,
    },
    /// `E`: part or all of a resting order traded at its price.
    OrderExecuted {
        order_ref: u64,
        executed_shares: u32,
        match_number: u64,
    },
    /// `X`: part of a resting order was cancelled.
    OrderCancel {
        order_ref: u64,
        cancelled_shares: u32,
    },
    /// `D`: the order left the book.
    OrderDelete { order_ref: u64 },
    /// `U`: the order left the book and a new one (new reference) entered at the back.
    OrderReplace {
        original_ref: u64,
        new_ref: u64,
        shares: u32,
        price: u32,
    },
    /// `P`: an execution the book did not show (the hidden part of an iceberg, or an order
    /// that never displayed).
    Trade {
        order_ref: u64,
        side: u8,
        shares: u32,
        stock: [u8; 8],
        price: u32,
        match_number: u64,
    },
    /// `C`: part or all of a resting order executed at a price of its own: bourse's form of
    /// an execution in a call auction's uncrossing, `printable` `N` because the Cross Trade
    /// that follows carries the print.
    OrderExecutedWithPrice {
        order_ref: u64,
        executed_shares: u32,
        match_number: u64,
        printable: u8,
        price: u32,
    },
    /// `Q`: a call auction uncrossed: every share it executed at one price.
    CrossTrade {
        shares: u64,
        stock: [u8; 8],
        cross_price: u32,
        match_number: u64,
        cross_type: u8,
    },
    /// `I` (NOII): a call auction's indicative uncrossing: the shares that would pair off,
    /// the imbalance and its side (`B`, `S`, or `N` for none), and the indicative price as
    /// the far, near and reference price alike (bourse has one indicative price).
    Noii {
        paired_shares: u64,
        imbalance_shares: u64,
        imbalance_direction: u8,
        stock: [u8; 8],
        far_price: u32,
        near_price: u32,
        reference_price: u32,
        cross_type: u8,
        price_variation: u8,
    },
}

/// A message: header and body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    pub header: Header,
    pub body: Body,
}

/// Why bytes are not a message bourse understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// No bytes at all.
    Empty,
    /// A message type bourse does not publish (the byte is given).
    UnknownType(u8),
    /// The length does not match the type's fixed length.
    Length {
        kind: u8,
        expected: usize,
        actual: usize,
    },
    /// A side that is neither `B` nor `S`.
    Side(u8),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DecodeError::Empty => write!(f, "empty ITCH message"),
            DecodeError::UnknownType(t) => write!(f, "unknown ITCH message type 0x{t:02x}"),
            DecodeError::Length {
                kind,
                expected,
                actual,
            } => write!(
                f,
                "ITCH message '{}' must be {expected} bytes, not {actual}",
                kind as char
            ),
            DecodeError::Side(s) => write!(f, "ITCH side 0x{s:02x} is neither B nor S"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl Body {
    /// The message type letter.
    pub fn kind(&self) -> u8 {
        match self {
            Body::SystemEvent { .. } => b'S',
            Body::StockDirectory(_) => b'R',
            Body::AddOrder { .. } => b'A',
            Body::OrderExecuted { .. } => b'E',
            Body::OrderCancel { .. } => b'X',
            Body::OrderDelete { .. } => b'D',
            Body::OrderReplace { .. } => b'U',
            Body::Trade { .. } => b'P',
            Body::OrderExecutedWithPrice { .. } => b'C',
            Body::CrossTrade { .. } => b'Q',
            Body::Noii { .. } => b'I',
        }
    }
}

/// The fixed length of a message type, if bourse publishes it.
pub fn length_of(kind: u8) -> Option<usize> {
    Some(match kind {
        b'S' => 12,
        b'R' => 39,
        b'A' => 36,
        b'E' => 31,
        b'X' => 23,
        b'D' => 19,
        b'U' => 35,
        b'P' => 44,
        b'C' => 36,
        b'Q' => 40,
        b'I' => 50,
        _ => return None,
    })
}

/// A symbol as ITCH writes it: ASCII, left-aligned, space-padded to eight bytes (longer
/// symbols are cut; non-ASCII bytes become `?`).
pub fn stock_of(symbol: &str) -> [u8; 8] {
    let mut out = [b' '; 8];
    for (o, b) in out.iter_mut().zip(symbol.bytes()) {
        *o = if b.is_ascii_graphic() { b } else { b'?' };
    }
    out
}

impl Message {
    /// Bytes of the encoded message.
    pub fn len(&self) -> usize {
        length_of(self.body.kind()).unwrap_or(0)
    }

    /// Never empty: every message has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the encoded message to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.push(self.body.kind());
        out.extend_from_slice(&self.header.stock_locate.to_be_bytes());
        out.extend_from_slice(&self.header.tracking_number.to_be_bytes());
        // The low 48 bits: the projection writes nanoseconds since midnight, which fit.
        out.extend_from_slice(&self.header.timestamp_ns.to_be_bytes()[2..]);
        match self.body {
            Body::SystemEvent { event_code } => out.push(event_code),
            Body::StockDirectory(d) => {
                out.extend_from_slice(&d.stock);
                out.push(d.market_category);
                out.push(d.financial_status);
                out.extend_from_slice(&d.round_lot_size.to_be_bytes());
                out.push(d.round_lots_only);
                out.push(d.issue_classification);
                out.extend_from_slice(&d.issue_subtype);
                out.push(d.authenticity);
                out.push(d.short_sale_threshold);
                out.push(d.ipo_flag);
                out.push(d.luld_tier);
                out.push(d.etp_flag);
                out.extend_from_slice(&d.etp_leverage_factor.to_be_bytes());
                out.push(d.inverse);
            }
            Body::AddOrder {
                order_ref,
                side,
                shares,
                stock,
                price,
            } => {
                out.extend_from_slice(&order_ref.to_be_bytes());
                out.push(side);
                out.extend_from_slice(&shares.to_be_bytes());
                out.extend_from_slice(&stock);
                out.extend_from_slice(&price.to_be_bytes());
            }
            Body::OrderExecuted {
                order_ref,
                executed_shares,
                match_number,
            } => {
                out.extend_from_slice(&order_ref.to_be_bytes());
                out.extend_from_slice(&executed_shares.to_be_bytes());
                out.extend_from_slice(&match_number.to_be_bytes());
            }
            Body::OrderCancel {
                order_ref,
                cancelled_shares,
            } => {
                out.extend_from_slice(&order_ref.to_be_bytes());
                out.extend_from_slice(&cancelled_shares.to_be_bytes());
            }
            Body::OrderDelete { order_ref } => out.extend_from_slice(&order_ref.to_be_bytes()),
            Body::OrderReplace {
                original_ref,
                new_ref,
                shares,
                price,
            } => {
                out.extend_from_slice(&original_ref.to_be_bytes());
                out.extend_from_slice(&new_ref.to_be_bytes());
                out.extend_from_slice(&shares.to_be_bytes());
                out.extend_from_slice(&price.to_be_bytes());
            }
            Body::Trade {
                order_ref,
                side,
                shares,
                stock,
                price,
                match_number,
            } => {
                out.extend_from_slice(&order_ref.to_be_bytes());
                out.push(side);
                out.extend_from_slice(&shares.to_be_bytes());
                out.extend_from_slice(&stock);
                out.extend_from_slice(&price.to_be_bytes());
                out.extend_from_slice(&match_number.to_be_bytes());
            }
            Body::OrderExecutedWithPrice {
                order_ref,
                executed_shares,
                match_number,
                printable,
                price,
            } => {
                out.extend_from_slice(&order_ref.to_be_bytes());
                out.extend_from_slice(&executed_shares.to_be_bytes());
                out.extend_from_slice(&match_number.to_be_bytes());
                out.push(printable);
                out.extend_from_slice(&price.to_be_bytes());
            }
            Body::CrossTrade {
                shares,
                stock,
                cross_price,
                match_number,
                cross_type,
            } => {
                out.extend_from_slice(&shares.to_be_bytes());
                out.extend_from_slice(&stock);
                out.extend_from_slice(&cross_price.to_be_bytes());
                out.extend_from_slice(&match_number.to_be_bytes());
                out.push(cross_type);
            }
            Body::Noii {
                paired_shares,
                imbalance_shares,
                imbalance_direction,
                stock,
                far_price,
                near_price,
                reference_price,
                cross_type,
                price_variation,
            } => {
                out.extend_from_slice(&paired_shares.to_be_bytes());
                out.extend_from_slice(&imbalance_shares.to_be_bytes());
                out.push(imbalance_direction);
                out.extend_from_slice(&stock);
                out.extend_from_slice(&far_price.to_be_bytes());
                out.extend_from_slice(&near_price.to_be_bytes());
                out.extend_from_slice(&reference_price.to_be_bytes());
                out.push(cross_type);
                out.push(price_variation);
            }
        }
        debug_assert_eq!(out.len() - start, self.len());
    }

    /// Decodes one message (exactly `bytes`, as a MoldUDP64 message block delimits it).
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        let kind = *bytes.first().ok_or(DecodeError::Empty)?;
        let expected = length_of(kind).ok_or(DecodeError::UnknownType(kind))?;
        if bytes.len() != expected {
            return Err(DecodeError::Length {
                kind,
                expected,
                actual: bytes.len(),
            });
        }
        let r = Fields(bytes);
        let header = Header {
            stock_locate: r.u16(1),
            tracking_number: r.u16(3),
            timestamp_ns: r.u48(5),
        };
        let side = |at: usize| match bytes[at] {
            s @ (b'B' | b'S') => Ok(s),
            s => Err(DecodeError::Side(s)),
        };
        let body = match kind {
            b'S' => Body::SystemEvent {
                event_code: bytes[11],
            },
            b'R' => Body::StockDirectory(StockDirectory {
                stock: r.stock(11),
                market_category: bytes[19],
                financial_status: bytes[20],
                round_lot_size: r.u32(21),
                round_lots_only: bytes[25],
                issue_classification: bytes[26],
                issue_subtype: [bytes[27], bytes[28]],
                authenticity: bytes[29],
                short_sale_threshold: bytes[30],
                ipo_flag: bytes[31],
                luld_tier: bytes[32],
                etp_flag: bytes[33],
                etp_leverage_factor: r.u32(34),
                inverse: bytes[38],
            }),
            b'A' => Body::AddOrder {
                order_ref: r.u64(11),
                side: side(19)?,
                shares: r.u32(20),
                stock: r.stock(24),
                price: r.u32(32),
            },
            b'E' => Body::OrderExecuted {
                order_ref: r.u64(11),
                executed_shares: r.u32(19),
                match_number: r.u64(23),
            },
            b'X' => Body::OrderCancel {
                order_ref: r.u64(11),
                cancelled_shares: r.u32(19),
            },
            b'D' => Body::OrderDelete {
                order_ref: r.u64(11),
            },
            b'U' => Body::OrderReplace {
                original_ref: r.u64(11),
                new_ref: r.u64(19),
                shares: r.u32(27),
                price: r.u32(31),
            },
            b'C' => Body::OrderExecutedWithPrice {
                order_ref: r.u64(11),
                executed_shares: r.u32(19),
                match_number: r.u64(23),
                printable: bytes[31],
                price: r.u32(32),
            },
            b'Q' => Body::CrossTrade {
                shares: r.u64(11),
                stock: r.stock(19),
                cross_price: r.u32(27),
                match_number: r.u64(31),
                cross_type: bytes[39],
            },
            b'I' => Body::Noii {
                paired_shares: r.u64(11),
                imbalance_shares: r.u64(19),
                imbalance_direction: bytes[27],
                stock: r.stock(28),
                far_price: r.u32(36),
                near_price: r.u32(40),
                reference_price: r.u32(44),
                cross_type: bytes[48],
                price_variation: bytes[49],
            },
            _ => Body::Trade {
                order_ref: r.u64(11),
                side: side(19)?,
                shares: r.u32(20),
                stock: r.stock(24),
                price: r.u32(32),
                match_number: r.u64(36),
            },
        };
        Ok(Message { header, body })
    }
}

/// Big-endian reads at offsets the length check above has already proved in range.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0; N];
        out.copy_from_slice(&self.0[at..at + N]);
        out
    }
    fn u16(&self, at: usize) -> u16 {
        u16::from_be_bytes(self.array(at))
    }
    fn u32(&self, at: usize) -> u32 {
        u32::from_be_bytes(self.array(at))
    }
    fn u64(&self, at: usize) -> u64 {
        u64::from_be_bytes(self.array(at))
    }
    fn u48(&self, at: usize) -> u64 {
        let six: [u8; 6] = self.array(at);
        let mut eight = [0; 8];
        eight[2..].copy_from_slice(&six);
        u64::from_be_bytes(eight)
    }
    fn stock(&self, at: usize) -> [u8; 8] {
        self.array(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = Header> {
        (any::<u16>(), any::<u16>(), 0..DAY_NS).prop_map(|(l, t, ns)| Header {
            stock_locate: l,
            tracking_number: t,
            timestamp_ns: ns,
        })
    }

    fn side() -> impl Strategy<Value = u8> {
        prop_oneof![Just(b'B'), Just(b'S')]
    }

    fn body() -> impl Strategy<Value = Body> {
        prop_oneof![
            any::<u8>().prop_map(|event_code| Body::SystemEvent { event_code }),
            (
                any::<[u8; 8]>(),
                any::<u32>(),
                any::<u32>(),
                any::<[u8; 8]>()
            )
                .prop_map(|(stock, lot, lev, misc)| Body::StockDirectory(
                    StockDirectory {
                        stock,
                        market_category: misc[0],
                        financial_status: misc[1],
                        round_lot_size: lot,
                        round_lots_only: misc[2],
                        issue_classification: misc[3],
                        issue_subtype: [misc[4], misc[5]],
                        authenticity: misc[6],
                        short_sale_threshold: misc[7],
                        ipo_flag: misc[0],
                        luld_tier: misc[1],
                        etp_flag: misc[2],
                        etp_leverage_factor: lev,
                        inverse: misc[3],
                    }
                )),
            (
                any::<u64>(),
                side(),
                any::<u32>(),
                any::<[u8; 8]>(),
                any::<u32>()
            )
                .prop_map(|(order_ref, side, shares, stock, price)| Body::AddOrder {
                    order_ref,
                    side,
                    shares,
                    stock,
                    price
                }),
            (any::<u64>(), any::<u32>(), any::<u64>()).prop_map(|(r, s, m)| {
                Body::OrderExecuted {
                    order_ref: r,
                    executed_shares: s,
                    match_number: m,
                }
            }),
            (any::<u64>(), any::<u32>()).prop_map(|(r, s)| Body::OrderCancel {
                order_ref: r,
                cancelled_shares: s
            }),
            any::<u64>().prop_map(|order_ref| Body::OrderDelete { order_ref }),
            (any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()).prop_map(
                |(original_ref, new_ref, shares, price)| Body::OrderReplace {
                    original_ref,
                    new_ref,
                    shares,
                    price
                }
            ),
            (
                any::<u64>(),
                side(),
                any::<u32>(),
                any::<[u8; 8]>(),
                any::<u32>(),
                any::<u64>()
            )
                .prop_map(|(order_ref, side, shares, stock, price, match_number)| {
                    Body::Trade {
                        order_ref,
                        side,
                        shares,
                        stock,
                        price,
                        match_number,
                    }
                }),
            (
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u8>(),
                any::<u32>()
            )
                .prop_map(
                    |(order_ref, executed_shares, match_number, printable, price)| {
                        Body::OrderExecutedWithPrice {
                            order_ref,
                            executed_shares,
                            match_number,
                            printable,
                            price,
                        }
                    }
                ),
            (
                any::<u64>(),
                any::<[u8; 8]>(),
                any::<u32>(),
                any::<u64>(),
                any::<u8>()
            )
                .prop_map(|(shares, stock, cross_price, match_number, cross_type)| {
                    Body::CrossTrade {
                        shares,
                        stock,
                        cross_price,
                        match_number,
                        cross_type,
                    }
                }),
            (
                (any::<u64>(), any::<u64>(), any::<u8>(), any::<[u8; 8]>()),
                (
                    any::<u32>(),
                    any::<u32>(),
                    any::<u32>(),
                    any::<u8>(),
                    any::<u8>()
                )
            )
                .prop_map(
                    |(
                        (paired, imbalance, direction, stock),
                        (far, near, reference, cross, variation),
                    )| {
                        Body::Noii {
                            paired_shares: paired,
                            imbalance_shares: imbalance,
                            imbalance_direction: direction,
                            stock,
                            far_price: far,
                            near_price: near,
                            reference_price: reference,
                            cross_type: cross,
                            price_variation: variation,
                        }
                    }
                ),
        ]
    }

    proptest! {
        #[test]
        fn every_message_decodes_to_itself(header in header(), body in body()) {
            let m = Message { header, body };
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            prop_assert_eq!(bytes.len(), m.len());
            prop_assert_eq!(Message::decode(&bytes), Ok(m));
        }

        #[test]
        fn any_bytes_decode_or_are_refused_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(m) = Message::decode(&bytes) {
                let mut again = Vec::new();
                m.encode(&mut again);
                prop_assert_eq!(again, bytes);
            }
        }

        #[test]
        fn a_cut_message_is_refused_by_length(header in header(), body in body(), cut in 1usize..44) {
            let m = Message { header, body };
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            let keep = bytes.len().saturating_sub(cut).max(1);
            prop_assert!(
                matches!(Message::decode(&bytes[..keep]), Err(DecodeError::Length { .. })),
                "a cut message is refused"
            );
        }
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert_eq!(Message::decode(&[]), Err(DecodeError::Empty));
        assert_eq!(Message::decode(b"Z"), Err(DecodeError::UnknownType(b'Z')));
        let e = Message::decode(b"D123").unwrap_err();
        assert_eq!(e.to_string(), "ITCH message 'D' must be 19 bytes, not 4");
        assert_eq!(stock_of("SBER"), *b"SBER    ");
        assert_eq!(stock_of("ABCDEFGHIJ"), *b"ABCDEFGH");
    }
}
