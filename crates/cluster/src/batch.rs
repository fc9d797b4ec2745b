//! Log entries: a batch of client requests, or a hash check, in a compact binary form.
//!
//! ```text
//! entry    := tag u8, body
//!   tag 1  := batch: count u32, count × request
//!   tag 2  := hash check: index u64, state_hash u64
//! request  := client_id u64, request_seq u64, command_len u32, command [, audit]
//! command  := the core's binary form of a `Command` (`bourse_core::codec::encode_command`)
//! audit    := operator_len u32, operator, request_id_len u32, request_id
//!             present when command_len has its top bit (AUDIT_FLAG) set
//! ```
//!
//! The audit trailer says who asked for a request: an operator's name and the admin API's
//! request id (see [`Audit`]), so that the replicated log itself records every admin action's
//! author. It is optional per request and flagged in the command length's top bit, which no
//! command length can reach (a command is at most `COMMAND_SIZE_BYTES_MAX` bytes): entries
//! written before the trailer existed read unchanged, and a trading request without one
//! costs exactly what it did (no extra byte, no allocation).
//!
//! Integers are little-endian. A [`Batch`] stays in this form from the leader's batcher to
//! every replica's state machine: the batcher copies each client's command bytes in as they
//! came (after [`check_command_form`]: a known form, within the size limit), openraft's
//! messages and the journal carry the entry as one opaque byte string, and each replica
//! decodes each command once, when it applies it (a command that does not decode is answered
//! `OutcomeKind::Invalid` there, on every replica alike). Reading an entry checks its framing
//! (the count, every length, every form byte) against the limits below before it allocates,
//! so garbage gives a [`DecodeError`], never a panic.

use std::sync::Arc;

use bourse_core::codec::{
    check_command_form, decode_command, encode_command_into, DecodeError, Reader, Writer,
    COMMAND_SIZE_BYTES_MAX,
};
use bourse_core::Command;

/// The most requests one log entry may carry (smart batching stops filling a batch here).
pub const REQUESTS_PER_BATCH_MAX: u32 = 4096;
/// The most bytes of an audit trailer's operator name (a credential name's limit,
/// `bourse_auth::NAME_BYTES_MAX`).
pub const AUDIT_OPERATOR_BYTES_MAX: usize = 64;
/// The most bytes of an audit trailer's request id (the admin API's `X-Request-Id` limit).
pub const AUDIT_REQUEST_ID_BYTES_MAX: usize = 128;
/// The top bit of a request's command length: an audit trailer follows the command.
const AUDIT_FLAG: u32 = 1 << 31;
const _: () = assert!(COMMAND_SIZE_BYTES_MAX < AUDIT_FLAG);

const TAG_BATCH: u8 = 1;
const TAG_HASH_CHECK: u8 = 2;
const TAG_MARKET_DATA_FLUSH: u8 = 3;
/// The tag and the count before a batch's requests.
const BATCH_HEADER_BYTES: usize = 5;
/// A request's key and command length before its command.
const REQUEST_HEADER_BYTES: usize = 20;

/// One client request, decoded: the idempotency key `(client_id, request_seq)` and the command.
///
/// A client numbers its requests 1, 2, 3, ... and retries a request with the same number; the
/// state machine applies each key at most once. Tools and tests build batches from these
/// ([`Batch::from_requests`]); the node's own path never decodes a command before applying it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRequest {
    pub client_id: u64,
    pub request_seq: u64,
    pub command: Command,
}

/// Who asked for a request: the operator's name and the request id it came under (the admin
/// API's `X-Request-Id`), carried beside the command through the sequenced path, kept in the
/// log, the committed stream and its archive, and shown by `bourse journal requests`. Both
/// are 1 to their limit of printable ASCII bytes without spaces ([`Audit::new`] checks).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Audit {
    pub operator: String,
    pub request_id: String,
}

/// Whether `bytes` is 1 to `max` printable ASCII bytes without spaces.
fn audit_field_ok(bytes: &[u8], max: usize) -> bool {
    !bytes.is_empty() && bytes.len() <= max && bytes.iter().all(|b| (0x21..0x7f).contains(b))
}

impl Audit {
    /// An audit trailer, its fields checked against their limits.
    pub fn new(operator: &str, request_id: &str) -> Result<Audit, String> {
        AuditRef::new(operator, request_id).map(AuditRef::to_audit)
    }

    pub fn borrowed(&self) -> AuditRef<'_> {
        AuditRef {
            operator: &self.operator,
            request_id: &self.request_id,
        }
    }

    /// Checks the fields of a trailer that came from elsewhere (a client, a decoded record).
    pub fn check(&self) -> Result<(), String> {
        AuditRef::new(&self.operator, &self.request_id).map(|_| ())
    }

    /// Appends the trailer's binary form (operator, then request id, each length-prefixed).
    pub fn encode_into(&self, w: &mut Writer) {
        self.borrowed().encode_into(w);
    }

    /// Reads what [`Audit::encode_into`] wrote, refusing fields out of their limits.
    pub fn decode_from(r: &mut Reader) -> Result<Audit, DecodeError> {
        AuditRef::decode_from(r).map(AuditRef::to_audit)
    }
}

/// An [`Audit`] trailer as it lies in a batch, fields checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuditRef<'a> {
    pub operator: &'a str,
    pub request_id: &'a str,
}

impl<'a> AuditRef<'a> {
    pub fn new(operator: &'a str, request_id: &'a str) -> Result<AuditRef<'a>, String> {
        if !audit_field_ok(operator.as_bytes(), AUDIT_OPERATOR_BYTES_MAX) {
            return Err(format!(
                "audit operator: 1 to {AUDIT_OPERATOR_BYTES_MAX} printable ASCII bytes without \
                 spaces, not {operator:?}"
            ));
        }
        if !audit_field_ok(request_id.as_bytes(), AUDIT_REQUEST_ID_BYTES_MAX) {
            return Err(format!(
                "audit request id: 1 to {AUDIT_REQUEST_ID_BYTES_MAX} printable ASCII bytes \
                 without spaces, not {request_id:?}"
            ));
        }
        Ok(AuditRef {
            operator,
            request_id,
        })
    }

    pub fn to_audit(self) -> Audit {
        Audit {
            operator: self.operator.to_string(),
            request_id: self.request_id.to_string(),
        }
    }

    fn encode_into(self, w: &mut Writer) {
        w.bytes(self.operator.as_bytes());
        w.bytes(self.request_id.as_bytes());
    }

    fn decode_from(r: &mut Reader<'a>) -> Result<AuditRef<'a>, DecodeError> {
        fn field<'a>(
            r: &mut Reader<'a>,
            max: usize,
            what: &'static str,
        ) -> Result<&'a str, DecodeError> {
            let at = r.offset();
            let bytes = r.bytes(max)?;
            if !audit_field_ok(bytes, max) {
                return Err(DecodeError { offset: at, what });
            }
            // Printable ASCII is UTF-8.
            Ok(std::str::from_utf8(bytes).expect("ASCII"))
        }
        Ok(AuditRef {
            operator: field(r, AUDIT_OPERATOR_BYTES_MAX, "bad audit operator")?,
            request_id: field(r, AUDIT_REQUEST_ID_BYTES_MAX, "bad audit request id")?,
        })
    }
}

/// One request of a [`Batch`] as it lies in the batch: the key, the command's bytes and the
/// audit trailer, if it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestRef<'a> {
    pub client_id: u64,
    pub request_seq: u64,
    /// The command's binary form, framing checked, not yet decoded.
    pub command: &'a [u8],
    /// Who asked, for a request that says so (admin actions).
    pub audit: Option<AuditRef<'a>>,
}

impl RequestRef<'_> {
    /// Decodes the command (what a replica does once, when it applies the request).
    pub fn decode(&self) -> Result<ClientRequest, DecodeError> {
        Ok(ClientRequest {
            client_id: self.client_id,
            request_seq: self.request_seq,
            command: decode_command(self.command)?,
        })
    }
}

/// A batch of client requests in its binary form (tag, count, requests; see the module
/// documentation), framing checked. Cloning shares the bytes: openraft clones an entry for
/// every follower it replicates to and for the state machine.
#[derive(Clone, PartialEq, Eq)]
pub struct Batch {
    bytes: Arc<Vec<u8>>,
    count: u32,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Batch({} requests, {} bytes)",
            self.count,
            self.bytes.len()
        )
    }
}

impl Batch {
    /// Encodes decoded requests into a batch (tools and tests; a node uses [`BatchBuilder`]).
    pub fn from_requests(requests: &[ClientRequest]) -> Batch {
        let mut b = BatchBuilder::with_capacity(requests.len());
        for r in requests {
            b.push(r);
        }
        b.finish()
    }

    /// The number of requests.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The whole entry's bytes (tag included).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The requests in order, keys read and commands left encoded.
    pub fn requests(&self) -> Requests<'_> {
        Requests {
            buf: &self.bytes[BATCH_HEADER_BYTES..],
            left: self.count,
        }
    }

    /// Every request decoded (tools and tests).
    pub fn decode_requests(&self) -> Result<Vec<ClientRequest>, DecodeError> {
        self.requests().map(|r| r.decode()).collect()
    }

    /// Checks a batch entry's framing (tag, count, every request's key, length and form byte)
    /// and keeps the bytes.
    fn from_checked_bytes(bytes: Vec<u8>) -> Result<Batch, DecodeError> {
        let mut r = Reader::new(&bytes);
        if r.u8()? != TAG_BATCH {
            return Err(DecodeError {
                offset: 0,
                what: "not a batch",
            });
        }
        let count = r.u32()?;
        // A request takes at least its header and a form byte: refuse counts the data cannot hold.
        if count > REQUESTS_PER_BATCH_MAX
            || count as usize > r.remaining() / (REQUEST_HEADER_BYTES + 1)
        {
            return Err(r.error("request count out of range"));
        }
        for _ in 0..count {
            r.u64()?;
            r.u64()?;
            let len = r.u32()?;
            let audited = len & AUDIT_FLAG != 0;
            let len = len & !AUDIT_FLAG;
            if len > COMMAND_SIZE_BYTES_MAX {
                return Err(r.error("byte string longer than allowed"));
            }
            let offset = r.offset();
            check_command_form(r.raw(len as usize)?).map_err(|e| DecodeError {
                offset: offset + e.offset,
                what: e.what,
            })?;
            if audited {
                AuditRef::decode_from(&mut r)?;
            }
        }
        r.expect_end()?;
        Ok(Batch {
            bytes: Arc::new(bytes),
            count,
        })
    }
}

/// The requests of a [`Batch`]; its framing was checked when it was made.
pub struct Requests<'a> {
    buf: &'a [u8],
    left: u32,
}

impl<'a> Iterator for Requests<'a> {
    type Item = RequestRef<'a>;

    #[inline]
    fn next(&mut self) -> Option<RequestRef<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let word = |at: usize| u64::from_le_bytes(self.buf[at..at + 8].try_into().expect("8"));
        let (client_id, request_seq) = (word(0), word(8));
        let len = u32::from_le_bytes(self.buf[16..20].try_into().expect("4"));
        let command_len = (len & !AUDIT_FLAG) as usize;
        let command = &self.buf[REQUEST_HEADER_BYTES..REQUEST_HEADER_BYTES + command_len];
        self.buf = &self.buf[REQUEST_HEADER_BYTES + command_len..];
        let audit = if len & AUDIT_FLAG == 0 {
            None
        } else {
            let mut r = Reader::new(self.buf);
            let audit = AuditRef::decode_from(&mut r).expect("checked when the batch was made");
            self.buf = &self.buf[r.offset()..];
            Some(audit)
        };
        Some(RequestRef {
            client_id,
            request_seq,
            command,
            audit,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

/// Builds a [`Batch`] request by request, in one buffer.
pub struct BatchBuilder {
    w: Writer,
    count: u32,
}

impl BatchBuilder {
    /// A builder sized for `requests` new orders (a new order takes 80 bytes with its header).
    pub fn with_capacity(requests: usize) -> BatchBuilder {
        let mut w = Writer::with_capacity(BATCH_HEADER_BYTES + requests * 80);
        w.u8(TAG_BATCH);
        w.u32(0);
        BatchBuilder { w, count: 0 }
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends a request whose command is already in its binary form, as a client sent it:
    /// the bytes are copied, not decoded. Refuses a command that fails
    /// [`check_command_form`]. Panics past [`REQUESTS_PER_BATCH_MAX`] requests.
    pub fn push_encoded(
        &mut self,
        client_id: u64,
        request_seq: u64,
        command: &[u8],
    ) -> Result<(), DecodeError> {
        self.push_encoded_audited(client_id, request_seq, command, None)
    }

    /// As [`BatchBuilder::push_encoded`], with the request's audit trailer when it has one
    /// (its fields checked by whoever made it: [`Audit::new`], or the node for a client's).
    pub fn push_encoded_audited(
        &mut self,
        client_id: u64,
        request_seq: u64,
        command: &[u8],
        audit: Option<AuditRef>,
    ) -> Result<(), DecodeError> {
        check_command_form(command)?;
        self.key(client_id, request_seq);
        match audit {
            None => self.w.bytes(command),
            Some(audit) => {
                self.w.u32(command.len() as u32 | AUDIT_FLAG);
                self.w.buf.extend_from_slice(command);
                audit.encode_into(&mut self.w);
            }
        }
        Ok(())
    }

    /// Appends a decoded request, encoding its command in place.
    pub fn push(&mut self, request: &ClientRequest) {
        self.key(request.client_id, request.request_seq);
        // The command in place after its length, which is filled in after it.
        let at = self.w.buf.len();
        self.w.u32(0);
        encode_command_into(&mut self.w, &request.command);
        let len = self.w.buf.len() - at - 4;
        assert!(len <= COMMAND_SIZE_BYTES_MAX as usize);
        self.w.buf[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
    }

    fn key(&mut self, client_id: u64, request_seq: u64) {
        assert!(self.count < REQUESTS_PER_BATCH_MAX, "batch over the limit");
        self.count += 1;
        self.w.u64(client_id);
        self.w.u64(request_seq);
    }

    pub fn finish(mut self) -> Batch {
        self.w.buf[1..5].copy_from_slice(&self.count.to_le_bytes());
        Batch {
            bytes: Arc::new(self.w.finish()),
            count: self.count,
        }
    }
}

/// What a log entry asks the replicated state machine to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogCommand {
    /// Apply these requests in order (each at most once per idempotency key).
    Batch(Batch),
    /// The leader's state hash after it applied log entry `index`: every replica that has its
    /// own hash at `index` compares, and stops on a mismatch.
    HashCheck { index: u64, state_hash: u64 },
    /// The market data idle flush the leader proposes (`crate::marketdata`): every replica's
    /// publisher closes the packets of the 1 ms / 15 ms channels idle at `now_ns`.
    MarketDataFlush { now_ns: u64 },
}

/// openraft 0.10 logs an entry's payload through `Display`: a summary, never the commands.
impl std::fmt::Display for LogCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LogCommand::Batch(batch) => write!(f, "batch of {} bytes", batch.bytes().len()),
            LogCommand::HashCheck { index, state_hash } => {
                write!(f, "hash check at {index}: {state_hash:016x}")
            }
            LogCommand::MarketDataFlush { now_ns } => write!(f, "market data flush at {now_ns}"),
        }
    }
}

impl LogCommand {
    /// A batch entry of decoded requests (tools and tests).
    pub fn batch(requests: &[ClientRequest]) -> LogCommand {
        LogCommand::Batch(Batch::from_requests(requests))
    }

    pub fn encode(&self) -> Vec<u8> {
        self.with_bytes(|b| b.to_vec())
    }

    /// Calls `f` with the entry's bytes (a batch's own, without a copy).
    fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> T) -> T {
        match self {
            LogCommand::Batch(batch) => f(batch.bytes()),
            LogCommand::HashCheck { index, state_hash } => {
                let mut w = Writer::with_capacity(17);
                w.u8(TAG_HASH_CHECK);
                w.u64(*index);
                w.u64(*state_hash);
                f(&w.buf)
            }
            LogCommand::MarketDataFlush { now_ns } => {
                let mut w = Writer::with_capacity(9);
                w.u8(TAG_MARKET_DATA_FLUSH);
                w.u64(*now_ns);
                f(&w.buf)
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<LogCommand, DecodeError> {
        match bytes.first() {
            Some(&TAG_BATCH) => LogCommand::decode_owned(bytes.to_vec()),
            _ => LogCommand::decode_small(bytes),
        }
    }

    /// As [`LogCommand::decode`], keeping `bytes` as the batch's buffer (no copy).
    pub fn decode_owned(bytes: Vec<u8>) -> Result<LogCommand, DecodeError> {
        match bytes.first() {
            Some(&TAG_BATCH) => Ok(LogCommand::Batch(Batch::from_checked_bytes(bytes)?)),
            _ => LogCommand::decode_small(&bytes),
        }
    }

    fn decode_small(bytes: &[u8]) -> Result<LogCommand, DecodeError> {
        let mut r = Reader::new(bytes);
        let command = match r.u8()? {
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
// travels as its binary form in one byte string, never decoded on the way.
impl serde::Serialize for LogCommand {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.with_bytes(|b| s.serialize_bytes(b))
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
                LogCommand::decode_owned(v).map_err(E::custom)
            }
        }
        d.deserialize_byte_buf(V)
    }
}

/// Audit trailers within the limits (property tests here and of the stream's form).
#[cfg(test)]
pub(crate) fn arb_audit() -> impl proptest::strategy::Strategy<Value = Audit> {
    use proptest::strategy::Strategy;
    ("[!-~]{1,64}", "[!-~]{1,128}").prop_map(|(operator, request_id)| Audit {
        operator,
        request_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_core::*;
    use proptest::prelude::*;

    /// A batch of requests, some with an audit trailer, and what it should read back as.
    fn audited_batch(
        requests: &[(ClientRequest, Option<Audit>)],
    ) -> (Batch, Vec<(ClientRequest, Option<Audit>)>) {
        let mut b = BatchBuilder::with_capacity(requests.len());
        for (r, audit) in requests {
            let bytes = bourse_core::codec::encode_command(&r.command);
            b.push_encoded_audited(
                r.client_id,
                r.request_seq,
                &bytes,
                audit.as_ref().map(Audit::borrowed),
            )
            .unwrap();
        }
        (b.finish(), requests.to_vec())
    }

    fn arb_audited_requests() -> impl Strategy<Value = Vec<(ClientRequest, Option<Audit>)>> {
        proptest::collection::vec(
            (
                any::<u64>(),
                any::<u64>(),
                arb_command(),
                proptest::option::of(arb_audit()),
            )
                .prop_map(|(client_id, request_seq, command, audit)| {
                    (
                        ClientRequest {
                            client_id,
                            request_seq,
                            command,
                        },
                        audit,
                    )
                }),
            0..12,
        )
    }

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
                    firm: None,
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
            proptest::collection::vec(request, 0..20).prop_map(|r| LogCommand::batch(&r)),
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
            let bytes = bourse_core::codec::encode_events(&events);
            assert_eq!(bourse_core::codec::decode_events(&bytes).unwrap(), events);
            if !bytes.is_empty() && !events.is_empty() {
                assert!(bourse_core::codec::decode_events(&bytes[..bytes.len() - 1]).is_err());
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
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(LogCommand::Batch(batch)) = LogCommand::decode(&bytes) {
                let _ = batch.decode_requests();
            }
            let mut framed = vec![TAG_BATCH];
            framed.extend_from_slice(&bytes);
            if let Ok(LogCommand::Batch(batch)) = LogCommand::decode(&framed) {
                let _ = batch.decode_requests();
            }
        }

        #[test]
        fn a_batch_of_client_bytes_equals_the_batch_of_the_decoded_requests(
            requests in proptest::collection::vec(
                (any::<u64>(), any::<u64>(), arb_command()),
                0..20,
            ),
        ) {
            let requests: Vec<ClientRequest> = requests
                .into_iter()
                .map(|(client_id, request_seq, command)| ClientRequest {
                    client_id,
                    request_seq,
                    command,
                })
                .collect();
            let mut b = BatchBuilder::with_capacity(requests.len());
            for r in &requests {
                let bytes = bourse_core::codec::encode_command(&r.command);
                b.push_encoded(r.client_id, r.request_seq, &bytes).unwrap();
            }
            let batch = b.finish();
            prop_assert_eq!(&batch, &Batch::from_requests(&requests));
            prop_assert_eq!(batch.len(), requests.len());
            prop_assert_eq!(batch.decode_requests(), Ok(requests));
        }

        #[test]
        fn audited_requests_read_back_with_their_trailers_through_the_log_form(
            requests in arb_audited_requests(),
        ) {
            let (batch, expected) = audited_batch(&requests);
            let decoded = LogCommand::decode(&LogCommand::Batch(batch.clone()).encode());
            prop_assert_eq!(&decoded, &Ok(LogCommand::Batch(batch.clone())));
            let got: Vec<(ClientRequest, Option<Audit>)> = batch
                .requests()
                .map(|r| (r.decode().unwrap(), r.audit.map(AuditRef::to_audit)))
                .collect();
            prop_assert_eq!(got, expected);
        }

        #[test]
        fn a_damaged_audited_batch_is_refused_or_reads_without_a_panic(
            requests in arb_audited_requests(),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let (batch, _) = audited_batch(&requests);
            let mut bytes = batch.bytes().to_vec();
            let n = at.index(bytes.len());
            bytes[n] = byte;
            if let Ok(LogCommand::Batch(b)) = LogCommand::decode(&bytes) {
                for r in b.requests() {
                    let _ = r.decode();
                    if let Some(a) = r.audit {
                        prop_assert!(AuditRef::new(a.operator, a.request_id).is_ok());
                    }
                }
            }
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
    fn the_builder_refuses_a_command_of_no_known_form_and_an_entry_with_one_is_refused() {
        let mut b = BatchBuilder::with_capacity(1);
        let err = b.push_encoded(1, 1, &[0, 1, 2]).unwrap_err();
        assert_eq!(err.what, "unknown command form");
        assert!(b.is_empty());
        // The same bytes framed by hand into an entry: refused when the entry is read.
        let mut entry = vec![TAG_BATCH];
        entry.extend_from_slice(&1u32.to_le_bytes());
        entry.extend_from_slice(&[0u8; 16]);
        entry.extend_from_slice(&3u32.to_le_bytes());
        entry.extend_from_slice(&[0, 1, 2]);
        assert_eq!(
            LogCommand::decode(&entry),
            Err(DecodeError {
                offset: 26,
                what: "unknown command form"
            })
        );
        // A known form with a damaged body passes the framing check; the replica that applies
        // it finds out (see `ReplicatedState`).
        entry[25] = 1;
        let Ok(LogCommand::Batch(batch)) = LogCommand::decode(&entry) else {
            panic!("the framing is sound")
        };
        assert!(batch.decode_requests().is_err());
    }

    #[test]
    fn a_batch_written_before_audit_trailers_reads_as_it_did_and_costs_the_same_bytes() {
        // The form of a one-request batch as it was written before trailers existed, by hand.
        let command = bourse_core::codec::encode_command(&Command::new(5, CommandBody::EndOfDay));
        let mut old = vec![TAG_BATCH];
        old.extend_from_slice(&1u32.to_le_bytes());
        old.extend_from_slice(&7u64.to_le_bytes());
        old.extend_from_slice(&9u64.to_le_bytes());
        old.extend_from_slice(&(command.len() as u32).to_le_bytes());
        old.extend_from_slice(&command);
        let Ok(LogCommand::Batch(batch)) = LogCommand::decode(&old) else {
            panic!("an old batch reads")
        };
        let r = batch.requests().next().unwrap();
        assert_eq!((r.client_id, r.request_seq, r.audit), (7, 9, None));
        // A request without a trailer is written byte for byte as before.
        let mut b = BatchBuilder::with_capacity(1);
        b.push_encoded_audited(7, 9, &command, None).unwrap();
        assert_eq!(b.finish().bytes(), &old[..]);
    }

    #[test]
    fn audit_fields_out_of_their_limits_are_refused_with_the_field_named() {
        assert!(Audit::new("alice", "r-1").is_ok());
        let long_operator = "o".repeat(AUDIT_OPERATOR_BYTES_MAX + 1);
        assert!(Audit::new(&long_operator, "r-1")
            .unwrap_err()
            .starts_with("audit operator"));
        assert!(Audit::new("", "r-1")
            .unwrap_err()
            .starts_with("audit operator"));
        assert!(Audit::new("alice", "has space")
            .unwrap_err()
            .starts_with("audit request id"));
        let long_id = "r".repeat(AUDIT_REQUEST_ID_BYTES_MAX + 1);
        assert!(Audit::new("alice", &long_id)
            .unwrap_err()
            .starts_with("audit request id"));
    }

    #[test]
    fn a_huge_request_count_is_refused_before_allocating() {
        let mut bytes = vec![TAG_BATCH];
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(LogCommand::decode(&bytes).is_err());
    }
}
