//! Log entries: a batch of client requests, or a hash check, in a compact binary form.
//!
//! ```text
//! entry    := tag u8, body
//!   tag 1  := batch: count u32, count × request
//!   tag 2  := hash check: index u64, state_hash u64
//! request  := client_id u64, request_seq u64, command_len u32, command
//! command  := form u8, fields (fixed width), ts_ns u64      for the order-path commands
//!           | 0, MessagePack of the Command                  for administrative ones
//! ```
//!
//! Integers are little-endian. Administrative commands are MessagePack (`rmp-serde`) because
//! the core's `Command` is an internally tagged, flattened serde type that only
//! self-describing formats can read back. Decoding checks every length against
//! the limits below before it allocates, so garbage gives a [`DecodeError`], never a panic.

use bourse_core::codec::{DecodeError, Writer};
use bourse_core::{
    AccountId, Cancel, Cash, ClOrdId, Command, CommandBody, Event, FirmId, InstrumentId,
    MassCancel, NewOrder, OrdType, OrderId, OrderRef, Price, Qty, Replace, Side, TimeInForce,
};

/// The most requests one log entry may carry (smart batching stops filling a batch here).
pub const REQUESTS_PER_BATCH_MAX: u32 = 4096;
/// The largest encoded command (an `AddInstrument` is the biggest, well under this).
pub const COMMAND_SIZE_BYTES_MAX: u32 = 4096;
/// The largest encoded event list of one command (a sweep such as a mass cancel may emit many).
pub const EVENTS_SIZE_BYTES_MAX: usize = 16 * 1024 * 1024;

const TAG_BATCH: u8 = 1;
const TAG_HASH_CHECK: u8 = 2;
const TAG_MARKET_DATA_FLUSH: u8 = 3;

/// One client request: the idempotency key `(client_id, request_seq)` and the command.
///
/// A client numbers its requests 1, 2, 3, ... and retries a request with the same number; the
/// state machine applies each key at most once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRequest {
    pub client_id: u64,
    pub request_seq: u64,
    pub command: Command,
}

/// What a log entry asks the replicated state machine to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogCommand {
    /// Apply these requests in order (each at most once per idempotency key).
    Batch(Vec<ClientRequest>),
    /// The leader's state hash after it applied log entry `index`: every replica that has its
    /// own hash at `index` compares, and stops on a mismatch.
    HashCheck { index: u64, state_hash: u64 },
    /// The market data idle flush the leader proposes (`crate::marketdata`): every replica's
    /// publisher closes the packets of the 1 ms / 15 ms channels idle at `now_ns`.
    MarketDataFlush { now_ns: u64 },
}

// A command's encoding starts with a form byte. The order-path commands (new order, cancel,
// replace, mass cancel, cash operations, end of day) have fixed-width forms because they are
// decoded at least three times per command (leader, two followers); the rare administrative
// ones (instruments, accounts, phases) go as MessagePack.
const FORM_MSGPACK: u8 = 0;
const FORM_NEW_ORDER: u8 = 1;
const FORM_CANCEL: u8 = 2;
const FORM_REPLACE: u8 = 3;
const FORM_MASS_CANCEL: u8 = 4;
const FORM_DEPOSIT: u8 = 5;
const FORM_WITHDRAW: u8 = 6;
const FORM_SET_COLLATERAL: u8 = 7;
const FORM_END_OF_DAY: u8 = 8;

fn side_code(side: Side) -> u8 {
    match side {
        Side::Buy => 0,
        Side::Sell => 1,
    }
}

/// The reader of log entries and of the fixed-width command forms: the same checks and errors as
/// `bourse_core::codec::Reader` (every read bounded; "unexpected end of data" at the offset
/// where the data ran out), but each read is inlined here. Every command of every log entry
/// is decoded on every replica and again on replay, and `Reader`'s methods, compiled in
/// another crate, were called out of line once per field: about 300 instructions per new
/// order under callgrind, against about 100 this way.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    #[inline(always)]
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        match self
            .buf
            .get(self.pos..)
            .and_then(|rest| rest.first_chunk::<N>())
        {
            Some(a) => {
                self.pos += N;
                Ok(*a)
            }
            None => Err(self.error("unexpected end of data")),
        }
    }
    #[cold]
    fn error(&self, what: &'static str) -> DecodeError {
        DecodeError {
            offset: self.pos,
            what,
        }
    }
    #[inline(always)]
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    #[inline(always)]
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    #[inline(always)]
    fn i128(&mut self) -> Result<i128, DecodeError> {
        Ok(i128::from_le_bytes(self.array()?))
    }
    fn offset(&self) -> usize {
        self.pos
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// A length-prefixed byte string of at most `len_max` bytes.
    #[inline(always)]
    fn bytes(&mut self, len_max: usize) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        if len > len_max {
            return Err(self.error("byte string longer than allowed"));
        }
        if self.remaining() < len {
            return Err(self.error("unexpected end of data"));
        }
        let s = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(s)
    }
    fn expect_end(&self) -> Result<(), DecodeError> {
        if self.pos != self.buf.len() {
            return Err(self.error("trailing bytes"));
        }
        Ok(())
    }
}

#[inline(always)]
fn side_of(r: &mut Cursor) -> Result<Side, DecodeError> {
    match r.u8()? {
        0 => Ok(Side::Buy),
        1 => Ok(Side::Sell),
        _ => Err(r.error("invalid side")),
    }
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

#[inline(always)]
fn read_opt_u64(r: &mut Cursor) -> Result<Option<u64>, DecodeError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.u64()?)),
        _ => Err(r.error("invalid option flag")),
    }
}

fn opt_u32(w: &mut Writer, v: Option<u32>) {
    match v {
        Some(v) => {
            w.u8(1);
            w.u32(v);
        }
        None => w.u8(0),
    }
}

#[inline(always)]
fn read_opt_u32(r: &mut Cursor) -> Result<Option<u32>, DecodeError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.u32()?)),
        _ => Err(r.error("invalid option flag")),
    }
}

fn order_ref(w: &mut Writer, target: &OrderRef) {
    opt_u64(w, target.order_id.map(|o| o.0));
    opt_u64(w, target.orig_cl_ord_id.map(|c| c.0));
}

#[inline(always)]
fn read_order_ref(r: &mut Cursor) -> Result<OrderRef, DecodeError> {
    Ok(OrderRef {
        order_id: read_opt_u64(r)?.map(OrderId),
        orig_cl_ord_id: read_opt_u64(r)?.map(ClOrdId),
    })
}

pub fn encode_command(command: &Command) -> Vec<u8> {
    let mut w = Writer::with_capacity(64);
    encode_command_into(&mut w, command);
    w.finish()
}

/// Appends a command's encoding to `w` (no allocation of its own: a batch of thousands is
/// encoded on every append and every replication hop).
pub fn encode_command_into(w: &mut Writer, command: &Command) {
    let w = &mut *w;
    let cash = |w: &mut Writer, form, account: &AccountId, amount: &Cash| {
        w.u8(form);
        w.u32(account.0);
        w.i128(amount.0);
    };
    match &command.body {
        CommandBody::NewOrder(o) => {
            w.u8(FORM_NEW_ORDER);
            w.u32(o.account.0);
            w.u64(o.cl_ord_id.0);
            w.u32(o.instrument.0);
            w.u8(side_code(o.side));
            w.u8(match o.ord_type {
                OrdType::Limit => 0,
                OrdType::Market => 1,
            });
            w.i64(o.price.0);
            w.i64(o.qty.0);
            w.u8(match o.tif {
                TimeInForce::Day => 0,
                TimeInForce::Gtc => 1,
                TimeInForce::Gtd => 2,
                TimeInForce::Ioc => 3,
                TimeInForce::Fok => 4,
            });
            w.u64(o.expire_ts_ns);
            w.i64(o.display_qty.0);
        }
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
        CommandBody::MassCancel(m) => {
            w.u8(FORM_MASS_CANCEL);
            w.u64(m.cl_ord_id.0);
            opt_u32(w, m.account.map(|a| a.0));
            opt_u32(w, m.firm.map(|f| f.0));
            opt_u32(w, m.instrument.map(|i| i.0));
            match m.side {
                Some(side) => {
                    w.u8(1);
                    w.u8(side_code(side));
                }
                None => w.u8(0),
            }
        }
        CommandBody::Deposit { account, amount } => cash(w, FORM_DEPOSIT, account, amount),
        CommandBody::Withdraw { account, amount } => cash(w, FORM_WITHDRAW, account, amount),
        CommandBody::SetCollateral { account, amount } => {
            cash(w, FORM_SET_COLLATERAL, account, amount)
        }
        CommandBody::EndOfDay => w.u8(FORM_END_OF_DAY),
        _ => {
            w.u8(FORM_MSGPACK);
            // Serialising a plain in-memory value into a Vec cannot fail.
            w.buf
                .extend_from_slice(&rmp_serde::to_vec(command).expect("a command always encodes"));
            return;
        }
    }
    w.u64(command.ts_ns);
}

fn decode_fixed(form: u8, r: &mut Cursor) -> Result<Command, DecodeError> {
    let body = match form {
        FORM_NEW_ORDER => CommandBody::NewOrder(NewOrder {
            account: AccountId(r.u32()?),
            cl_ord_id: ClOrdId(r.u64()?),
            instrument: InstrumentId(r.u32()?),
            side: side_of(r)?,
            ord_type: match r.u8()? {
                0 => OrdType::Limit,
                1 => OrdType::Market,
                _ => return Err(r.error("invalid order type")),
            },
            price: Price(r.i64()?),
            qty: Qty(r.i64()?),
            tif: match r.u8()? {
                0 => TimeInForce::Day,
                1 => TimeInForce::Gtc,
                2 => TimeInForce::Gtd,
                3 => TimeInForce::Ioc,
                4 => TimeInForce::Fok,
                _ => return Err(r.error("invalid time in force")),
            },
            expire_ts_ns: r.u64()?,
            display_qty: Qty(r.i64()?),
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
            side: match r.u8()? {
                0 => None,
                1 => Some(side_of(r)?),
                _ => return Err(r.error("invalid option flag")),
            },
        }),
        FORM_DEPOSIT | FORM_WITHDRAW | FORM_SET_COLLATERAL => {
            let account = AccountId(r.u32()?);
            let amount = Cash(r.i128()?);
            match form {
                FORM_DEPOSIT => CommandBody::Deposit { account, amount },
                FORM_WITHDRAW => CommandBody::Withdraw { account, amount },
                _ => CommandBody::SetCollateral { account, amount },
            }
        }
        FORM_END_OF_DAY => CommandBody::EndOfDay,
        _ => return Err(r.error("unknown command form")),
    };
    Ok(Command::new(r.u64()?, body))
}

pub fn decode_command(bytes: &[u8]) -> Result<Command, DecodeError> {
    if bytes.len() > COMMAND_SIZE_BYTES_MAX as usize {
        return Err(DecodeError {
            offset: 0,
            what: "command longer than allowed",
        });
    }
    let mut r = Cursor { buf: bytes, pos: 0 };
    let form = r.u8()?;
    if form == FORM_MSGPACK {
        return rmp_serde::from_slice(&bytes[1..]).map_err(|_| DecodeError {
            offset: 1,
            what: "command is not valid MessagePack of a Command",
        });
    }
    let command = decode_fixed(form, &mut r)?;
    r.expect_end()?;
    Ok(command)
}

/// Encodes an event list compactly (see `events`): every applied request's events are
/// encoded on every replica, for the answer, the idempotency table and the committed stream.
/// (Neither serde format fits: MessagePack writes each variant's name and cost more than the
/// engine's own work per command; bincode cannot read the core's internally tagged `Event`.)
pub fn encode_events(events: &[Event]) -> Vec<u8> {
    let bytes = crate::events::encode(events);
    assert!(
        bytes.len() <= EVENTS_SIZE_BYTES_MAX,
        "event list over the limit"
    );
    bytes
}

pub fn decode_events(bytes: &[u8]) -> Result<Vec<Event>, DecodeError> {
    if bytes.len() > EVENTS_SIZE_BYTES_MAX {
        return Err(DecodeError {
            offset: 0,
            what: "event list longer than allowed",
        });
    }
    crate::events::decode(bytes)
}

impl LogCommand {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(match self {
            // A new order encodes in 64 bytes with its key and length.
            LogCommand::Batch(requests) => 8 + requests.len() * 72,
            LogCommand::HashCheck { .. } => 17,
            LogCommand::MarketDataFlush { .. } => 9,
        });
        match self {
            LogCommand::Batch(requests) => {
                assert!(requests.len() <= REQUESTS_PER_BATCH_MAX as usize);
                w.u8(TAG_BATCH);
                w.u32(requests.len() as u32);
                for r in requests {
                    w.u64(r.client_id);
                    w.u64(r.request_seq);
                    // The command in place after its length, which is filled in after it.
                    let at = w.buf.len();
                    w.u32(0);
                    encode_command_into(&mut w, &r.command);
                    let len = w.buf.len() - at - 4;
                    assert!(len <= COMMAND_SIZE_BYTES_MAX as usize);
                    w.buf[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
                }
            }
            LogCommand::HashCheck { index, state_hash } => {
                w.u8(TAG_HASH_CHECK);
                w.u64(*index);
                w.u64(*state_hash);
            }
            LogCommand::MarketDataFlush { now_ns } => {
                w.u8(TAG_MARKET_DATA_FLUSH);
                w.u64(*now_ns);
            }
        }
        w.finish()
    }

    pub fn decode(bytes: &[u8]) -> Result<LogCommand, DecodeError> {
        let mut r = Cursor { buf: bytes, pos: 0 };
        let command = match r.u8()? {
            TAG_BATCH => {
                let count = r.u32()?;
                // A request takes at least 20 bytes: refuse counts the data cannot hold.
                if count > REQUESTS_PER_BATCH_MAX || count as usize > r.remaining() / 20 {
                    return Err(r.error("request count out of range"));
                }
                let mut requests = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    let client_id = r.u64()?;
                    let request_seq = r.u64()?;
                    let offset = r.offset();
                    let command = decode_command(r.bytes(COMMAND_SIZE_BYTES_MAX as usize)?)
                        .map_err(|e| DecodeError {
                            offset: offset + e.offset,
                            what: e.what,
                        })?;
                    requests.push(ClientRequest {
                        client_id,
                        request_seq,
                        command,
                    });
                }
                LogCommand::Batch(requests)
            }
            TAG_HASH_CHECK => LogCommand::HashCheck {
                index: r.u64()?,
                state_hash: r.u64()?,
            },
            TAG_MARKET_DATA_FLUSH => LogCommand::MarketDataFlush { now_ns: r.u64()? },
            _ => return Err(r.error("unknown log entry tag")),
        };
        r.expect_end()?;
        Ok(command)
    }
}

// openraft carries application data through serde (our transport uses bincode); a log entry
// travels as its compact encoding in one byte string.
impl serde::Serialize for LogCommand {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.encode())
    }
}

impl<'de> serde::Deserialize<'de> for LogCommand {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<LogCommand, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = LogCommand;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an encoded log command")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<LogCommand, E> {
                LogCommand::decode(v).map_err(E::custom)
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<LogCommand, E> {
                self.visit_bytes(&v)
            }
        }
        d.deserialize_bytes(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::*;
    use proptest::prelude::*;

    fn arb_command() -> impl Strategy<Value = Command> {
        let new_order = (
            1u32..100,
            any::<u64>(),
            1u32..10,
            any::<bool>(),
            1i64..1_000_000,
            1i64..10_000,
        )
            .prop_map(|(account, cl, instrument, buy, price, qty)| {
                CommandBody::NewOrder(NewOrder {
                    account: AccountId(account),
                    cl_ord_id: ClOrdId(cl),
                    instrument: InstrumentId(instrument),
                    side: if buy { Side::Buy } else { Side::Sell },
                    ord_type: OrdType::Limit,
                    price: Price(price),
                    qty: Qty(qty),
                    tif: TimeInForce::Day,
                    expire_ts_ns: 0,
                    display_qty: Qty(0),
                })
            });
        let cancel = (1u32..100, any::<u64>()).prop_map(|(account, id)| {
            CommandBody::Cancel(Cancel {
                account: AccountId(account),
                cl_ord_id: ClOrdId(id),
                target: OrderRef {
                    order_id: Some(OrderId(id)),
                    orig_cl_ord_id: None,
                },
            })
        });
        let deposit =
            (1u32..100, any::<i128>()).prop_map(|(account, amount)| CommandBody::Deposit {
                account: AccountId(account),
                amount: Cash(amount),
            });
        let replace = (
            1u32..100,
            any::<u64>(),
            any::<Option<i64>>(),
            any::<Option<i64>>(),
        )
            .prop_map(|(account, id, price, qty)| {
                CommandBody::Replace(Replace {
                    account: AccountId(account),
                    cl_ord_id: ClOrdId(id),
                    target: OrderRef {
                        order_id: None,
                        orig_cl_ord_id: Some(ClOrdId(id ^ 1)),
                    },
                    price: price.map(Price),
                    qty: qty.map(Qty),
                })
            });
        let mass_cancel = (
            any::<Option<u32>>(),
            any::<Option<u32>>(),
            any::<Option<bool>>(),
        )
            .prop_map(|(account, firm, buy)| {
                CommandBody::MassCancel(MassCancel {
                    cl_ord_id: ClOrdId(9),
                    account: account.map(AccountId),
                    firm: firm.map(FirmId),
                    instrument: None,
                    side: buy.map(|b| if b { Side::Buy } else { Side::Sell }),
                })
            });
        let admin = (1u32..100).prop_map(|account| {
            CommandBody::AddAccount(AccountSpec {
                account: AccountId(account),
                firm: FirmId(2),
                may_short: true,
                stp: StpMode::None,
                stp_scope: StpScope::Account,
            })
        });
        let body = prop_oneof![
            new_order,
            cancel,
            replace,
            deposit,
            mass_cancel,
            admin,
            Just(CommandBody::EndOfDay),
            Just(CommandBody::MassCancel(MassCancel::default())),
        ];
        (any::<u64>(), body).prop_map(|(ts_ns, body)| Command::new(ts_ns, body))
    }

    fn arb_log_command() -> impl Strategy<Value = LogCommand> {
        let request = (any::<u64>(), any::<u64>(), arb_command()).prop_map(
            |(client_id, request_seq, command)| ClientRequest {
                client_id,
                request_seq,
                command,
            },
        );
        prop_oneof![
            proptest::collection::vec(request, 0..20).prop_map(LogCommand::Batch),
            (any::<u64>(), any::<u64>())
                .prop_map(|(index, state_hash)| LogCommand::HashCheck { index, state_hash }),
            any::<u64>().prop_map(|now_ns| LogCommand::MarketDataFlush { now_ns }),
        ]
    }

    #[test]
    fn the_events_of_a_real_order_flow_round_trip_and_a_cut_list_is_refused() {
        let mut engine = bourse_engine::Engine::new(bourse_engine::EngineConfig::default());
        let mut flow = bourse_engine::workload::Flow::new(
            bourse_engine::workload::FlowConfig::exchange_core(5),
        );
        let mut events = Vec::new();
        let mut kinds = std::collections::HashSet::new();
        let setup = flow.setup();
        for i in 0..(setup.len() + 5_000) {
            let body = setup.get(i).cloned().unwrap_or_else(|| flow.next_command());
            events.clear();
            engine.apply(&Command::new(i as u64, body), &mut events);
            flow.observe(&events);
            let bytes = encode_events(&events);
            assert_eq!(decode_events(&bytes).unwrap(), events);
            if !bytes.is_empty() && !events.is_empty() {
                assert!(decode_events(&bytes[..bytes.len() - 1]).is_err());
            }
            for e in &events {
                kinds.insert(std::mem::discriminant(e));
            }
        }
        assert!(kinds.len() >= 5, "the flow produced few kinds of events");
    }

    proptest! {
        #[test]
        fn log_commands_round_trip(cmd in arb_log_command()) {
            let bytes = cmd.encode();
            prop_assert_eq!(LogCommand::decode(&bytes), Ok(cmd.clone()));
            let via_serde: LogCommand = bincode::deserialize(&bincode::serialize(&cmd).unwrap()).unwrap();
            prop_assert_eq!(via_serde, cmd);
        }

        #[test]
        fn the_cursor_reads_and_fails_exactly_as_the_core_reader(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            ops in proptest::collection::vec(0u8..6, 0..12),
        ) {
            let mut reader = bourse_core::codec::Reader::new(&bytes);
            let mut cursor = Cursor { buf: &bytes, pos: 0 };
            for op in ops {
                let (a, b): (Result<u128, DecodeError>, Result<u128, DecodeError>) = match op {
                    0 => (reader.u8().map(u128::from), cursor.u8().map(u128::from)),
                    1 => (reader.u32().map(u128::from), cursor.u32().map(u128::from)),
                    2 => (reader.u64().map(u128::from), cursor.u64().map(u128::from)),
                    3 => (reader.i64().map(|v| v as u128), cursor.i64().map(|v| v as u128)),
                    4 => (reader.i128().map(|v| v as u128), cursor.i128().map(|v| v as u128)),
                    _ => (
                        reader.bytes(8).map(|b| b.len() as u128),
                        cursor.bytes(8).map(|b| b.len() as u128),
                    ),
                };
                prop_assert_eq!(&a, &b);
                prop_assert_eq!(reader.offset(), cursor.offset());
                if a.is_err() {
                    break;
                }
            }
            prop_assert_eq!(reader.expect_end(), cursor.expect_end());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = LogCommand::decode(&bytes);
            let _ = decode_events(&bytes);
        }

        #[test]
        fn truncated_or_extended_entries_are_refused(cmd in arb_log_command(), cut in any::<prop::sample::Index>()) {
            let bytes = cmd.encode();
            let n = cut.index(bytes.len());
            prop_assert!(LogCommand::decode(&bytes[..n]).is_err());
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert!(LogCommand::decode(&longer).is_err());
        }
    }

    #[test]
    fn a_damaged_command_is_refused_with_the_offset_and_the_reason() {
        let order = Command::new(
            7,
            CommandBody::NewOrder(NewOrder {
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
        assert_eq!(bytes.len(), 60);
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
        assert_eq!(decode_command(&longer), err(60, "trailing bytes"));
        assert_eq!(decode_command(&[99]), err(1, "unknown command form"));
        assert_eq!(decode_command(&[]), err(0, "unexpected end of data"));
    }

    #[test]
    fn a_huge_request_count_is_refused_before_allocating() {
        let mut bytes = vec![TAG_BATCH];
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(LogCommand::decode(&bytes).is_err());
    }
}
