//! A client of the binary (SBE) order entry protocol over a blocking TCP stream (or TLS over it).

use crate::transport::{Stream, TlsClient};
use bourse_wire::frame::encode_frame;
use bourse_wire::order_entry::codec::{
    aggressor_flag::AggressorFlag, cancel_order_codec::CancelOrderEncoder,
    establish_codec::EstablishEncoder, mass_cancel_codec::MassCancelEncoder,
    new_order_codec::NewOrderEncoder, ord_type::OrdType, replace_order_codec::ReplaceOrderEncoder,
    retransmit_request_codec::RetransmitRequestEncoder, sequence_codec::SequenceEncoder,
    side::Side, terminate_codec::TerminateEncoder, termination_code::TerminationCode,
    time_in_force::TimeInForce,
};
use bourse_wire::order_entry::{FrameDecoder, Message, FRAME_BYTES_MAX};
use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

pub use bourse_wire::order_entry::codec::{
    mass_cancel_scope::MassCancelScope, side::Side as BinSide, time_in_force::TimeInForce as BinTif,
};

/// A server message, decoded into owned values. Enum fields are their wire codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    EstablishmentAck {
        next_seq_no: u64,
        keepalive_interval_ms: u32,
    },
    EstablishmentReject {
        reason: u8,
    },
    Terminate {
        reason: u8,
    },
    Sequence {
        next_seq_no: Option<u64>,
    },
    Retransmission {
        next_seq_no: u64,
        count: u32,
    },
    NewOrderAck {
        cl_ord_id: u64,
        order_id: u64,
        leaves_qty: i64,
    },
    OrderReject {
        cl_ord_id: u64,
        reason: u16,
    },
    Execution {
        cl_ord_id: u64,
        order_id: u64,
        trade_id: u64,
        last_px: i64,
        last_qty: i64,
        leaves_qty: i64,
        cum_qty: i64,
        aggressor: bool,
    },
    CancelAck {
        cl_ord_id: Option<u64>,
        orig_cl_ord_id: u64,
        order_id: u64,
        canceled_qty: i64,
        reason: u8,
    },
    CancelReject {
        cl_ord_id: u64,
        reason: u8,
    },
    ReplaceAck {
        cl_ord_id: u64,
        orig_cl_ord_id: u64,
        order_id: u64,
        price: i64,
        qty: i64,
        leaves_qty: i64,
    },
    ReplaceReject {
        cl_ord_id: u64,
        reason: u16,
    },
    MassCancelAck {
        cl_ord_id: u64,
        canceled_count: u32,
        result: u8,
    },
    BusinessReject {
        ref_cl_ord_id: Option<u64>,
        reason: u8,
        retry_after_ms: u32,
    },
    /// A message a server never sends (a client request echoed back): kept, not fatal.
    Other {
        template_id: u16,
    },
}

/// A server message with its sequence number (server responses only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub seq: Option<u64>,
    pub response: Response,
}

fn decode(message: Message<'_>) -> Response {
    match message {
        Message::EstablishmentAck(m) => Response::EstablishmentAck {
            next_seq_no: m.next_seq_no(),
            keepalive_interval_ms: m.keepalive_interval_ms(),
        },
        Message::EstablishmentReject(m) => Response::EstablishmentReject {
            reason: m.reason() as u8,
        },
        Message::Terminate(m) => Response::Terminate {
            reason: m.reason() as u8,
        },
        Message::Sequence(m) => Response::Sequence {
            next_seq_no: m.next_seq_no(),
        },
        Message::Retransmission(m) => Response::Retransmission {
            next_seq_no: m.next_seq_no(),
            count: m.count(),
        },
        Message::NewOrderAck(m) => Response::NewOrderAck {
            cl_ord_id: m.cl_ord_id(),
            order_id: m.order_id(),
            leaves_qty: m.leaves_qty(),
        },
        Message::OrderReject(m) => Response::OrderReject {
            cl_ord_id: m.cl_ord_id(),
            reason: m.reason() as u16,
        },
        Message::ExecutionReport(m) => Response::Execution {
            cl_ord_id: m.cl_ord_id(),
            order_id: m.order_id(),
            trade_id: m.trade_id(),
            last_px: m.last_px(),
            last_qty: m.last_qty(),
            leaves_qty: m.leaves_qty(),
            cum_qty: m.cum_qty(),
            aggressor: m.aggressor() == AggressorFlag::Aggressor,
        },
        Message::CancelAck(m) => Response::CancelAck {
            cl_ord_id: m.cl_ord_id(),
            orig_cl_ord_id: m.orig_cl_ord_id(),
            order_id: m.order_id(),
            canceled_qty: m.canceled_qty(),
            reason: m.reason() as u8,
        },
        Message::CancelReject(m) => Response::CancelReject {
            cl_ord_id: m.cl_ord_id(),
            reason: m.reason() as u8,
        },
        Message::ReplaceAck(m) => Response::ReplaceAck {
            cl_ord_id: m.cl_ord_id(),
            orig_cl_ord_id: m.orig_cl_ord_id(),
            order_id: m.order_id(),
            price: m.price(),
            qty: m.qty(),
            leaves_qty: m.leaves_qty(),
        },
        Message::ReplaceReject(m) => Response::ReplaceReject {
            cl_ord_id: m.cl_ord_id(),
            reason: m.reason() as u16,
        },
        Message::MassCancelAck(m) => Response::MassCancelAck {
            cl_ord_id: m.cl_ord_id(),
            canceled_count: m.canceled_count(),
            result: m.result() as u8,
        },
        Message::BusinessReject(m) => Response::BusinessReject {
            ref_cl_ord_id: m.ref_cl_ord_id(),
            reason: m.reason() as u8,
            retry_after_ms: m.retry_after_ms(),
        },
        other => Response::Other {
            template_id: other.template_id() as u16,
        },
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Encodes a NewOrder frame into `buf`; returns its length.
#[allow(clippy::too_many_arguments)]
pub fn encode_new_order(
    buf: &mut [u8],
    cl_ord_id: u64,
    account: u32,
    instrument: u32,
    buy: bool,
    qty: i64,
    price: Option<i64>,
    tif: TimeInForce,
) -> Result<usize, bourse_wire::Error> {
    encode_frame(buf, |mut e: NewOrderEncoder| {
        e.cl_ord_id(cl_ord_id)
            .price_opt(price)
            .qty(qty)
            .display_qty_opt(None);
        e.expire_time_ns_opt(None)
            .account(account)
            .instrument_id(instrument);
        e.side(if buy { Side::Buy } else { Side::Sell });
        e.ord_type(if price.is_some() {
            OrdType::Limit
        } else {
            OrdType::Market
        });
        e.time_in_force(tif);
        e
    })
}

/// Encodes a CancelOrder frame (by `orig_cl_ord_id`) into `buf`; returns its length.
pub fn encode_cancel(
    buf: &mut [u8],
    cl_ord_id: u64,
    orig_cl_ord_id: u64,
    account: u32,
    instrument: u32,
) -> Result<usize, bourse_wire::Error> {
    encode_frame(buf, |mut e: CancelOrderEncoder| {
        e.cl_ord_id(cl_ord_id)
            .order_id_opt(None)
            .orig_cl_ord_id(orig_cl_ord_id);
        e.account(account).instrument_id(instrument);
        e
    })
}

/// A second handle on a session's connection that only writes requests, so that one thread
/// can send on schedule while another reads (an open-loop load generator).
pub struct BinaryWriter {
    stream: TcpStream,
    buf: [u8; FRAME_BYTES_MAX],
}

impl BinaryWriter {
    #[allow(clippy::too_many_arguments)]
    pub fn new_order(
        &mut self,
        cl_ord_id: u64,
        account: u32,
        instrument: u32,
        buy: bool,
        qty: i64,
        price: Option<i64>,
        tif: TimeInForce,
    ) -> io::Result<()> {
        let n = encode_new_order(
            &mut self.buf,
            cl_ord_id,
            account,
            instrument,
            buy,
            qty,
            price,
            tif,
        )
        .map_err(|e| io::Error::new(ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&self.buf[..n])
    }

    pub fn cancel(
        &mut self,
        cl_ord_id: u64,
        orig_cl_ord_id: u64,
        account: u32,
        instrument: u32,
    ) -> io::Result<()> {
        let n = encode_cancel(
            &mut self.buf,
            cl_ord_id,
            orig_cl_ord_id,
            account,
            instrument,
        )
        .map_err(|e| io::Error::new(ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&self.buf[..n])
    }
}

/// An established binary session.
pub struct BinaryClient {
    stream: Stream,
    inbuf: Vec<u8>,
    scratch: Vec<u8>,
    /// The sequence number the next server response will carry.
    pub expected_seq: u64,
    /// What the server said its next number was at Establish.
    pub server_next_seq_at_establish: u64,
    queue: VecDeque<Received>,
    nonblocking: bool,
    closed: bool,
    /// The client sends Sequence when it has sent nothing for this long (the server drops a
    /// session silent for three intervals).
    keepalive: Duration,
    last_sent: Instant,
}

impl BinaryClient {
    /// The session's socket, for a caller that sleeps on several sessions with poll(2) until
    /// one is readable (everything already read is returned by the reads before it).
    pub fn socket_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.fd()
    }

    /// Connects and establishes; `expected_seq` is the next response number the caller has
    /// not seen (1 for a new session).
    pub fn connect(
        addr: SocketAddr,
        credentials: &str,
        keepalive_ms: u32,
        expected_seq: u64,
    ) -> io::Result<BinaryClient> {
        Self::connect_with_password(addr, credentials, "", keepalive_ms, expected_seq)
    }

    /// [`BinaryClient::connect`] for a session that has a password (Establish's `password`,
    /// at most 32 bytes; empty: none).
    pub fn connect_with_password(
        addr: SocketAddr,
        credentials: &str,
        password: &str,
        keepalive_ms: u32,
        expected_seq: u64,
    ) -> io::Result<BinaryClient> {
        Self::establish(
            addr,
            None,
            credentials,
            password,
            keepalive_ms,
            expected_seq,
        )
    }

    /// [`BinaryClient::connect_with_password`] over TLS (the gateway's `binary_tls_listen`).
    pub fn connect_tls(
        addr: SocketAddr,
        tls: &TlsClient,
        credentials: &str,
        password: &str,
        keepalive_ms: u32,
        expected_seq: u64,
    ) -> io::Result<BinaryClient> {
        Self::establish(
            addr,
            Some(tls),
            credentials,
            password,
            keepalive_ms,
            expected_seq,
        )
    }

    fn establish(
        addr: SocketAddr,
        tls: Option<&TlsClient>,
        credentials: &str,
        password: &str,
        keepalive_ms: u32,
        expected_seq: u64,
    ) -> io::Result<BinaryClient> {
        if password.len() > bourse_wire::order_entry::PASSWORD_BYTES {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                "a binary session's password has at most 32 bytes",
            ));
        }
        let stream = Stream::connect(&addr, Duration::from_secs(5), tls)?;
        let mut c = BinaryClient {
            stream,
            inbuf: Vec::new(),
            scratch: vec![0u8; 64 * 1024],
            expected_seq,
            server_next_seq_at_establish: 0,
            queue: VecDeque::new(),
            nonblocking: false,
            closed: false,
            keepalive: Duration::from_millis(u64::from(keepalive_ms.max(1))),
            last_sent: Instant::now(),
        };
        let creds = credentials.as_bytes().to_vec();
        let password = password.as_bytes().to_vec();
        c.write(|buf| {
            encode_frame(buf, |mut e: EstablishEncoder| {
                e.timestamp_ns(now_ns()).keepalive_interval_ms(keepalive_ms);
                e.credentials_zero_padded(&creds);
                e.password_zero_padded(&password);
                e
            })
        })?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match c.recv(Duration::from_millis(100))? {
                Some(Received {
                    response: Response::EstablishmentAck { next_seq_no, .. },
                    ..
                }) => {
                    c.server_next_seq_at_establish = next_seq_no;
                    return Ok(c);
                }
                Some(Received { response, .. }) => {
                    return Err(io::Error::new(
                        ErrorKind::ConnectionRefused,
                        format!("{response:?}"),
                    ));
                }
                None if c.closed => break,
                None => {}
            }
        }
        Err(io::Error::new(ErrorKind::TimedOut, "no EstablishmentAck"))
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }

    pub fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        self.stream.set_nonblocking(on)?;
        self.nonblocking = on;
        Ok(())
    }

    fn write(
        &mut self,
        f: impl FnOnce(&mut [u8]) -> Result<usize, bourse_wire::Error>,
    ) -> io::Result<()> {
        let mut buf = [0u8; FRAME_BYTES_MAX];
        let n = f(&mut buf).map_err(|e| io::Error::new(ErrorKind::InvalidInput, e.to_string()))?;
        self.write_raw(&buf[..n])
    }

    /// Writes bytes as they are (tests use it to send what a correct client would not).
    pub fn write_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.last_sent = Instant::now();
        if self.nonblocking {
            self.stream.set_nonblocking(false)?;
            let r = self.stream.write_all(bytes);
            self.stream.set_nonblocking(true)?;
            r
        } else {
            self.stream.write_all(bytes)
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new_order(
        &mut self,
        cl_ord_id: u64,
        account: u32,
        instrument: u32,
        buy: bool,
        qty: i64,
        price: Option<i64>,
        tif: TimeInForce,
    ) -> io::Result<()> {
        self.write(|buf| {
            encode_new_order(buf, cl_ord_id, account, instrument, buy, qty, price, tif)
        })
    }

    /// A write-only handle on the same connection (see [`BinaryWriter`]). Heartbeats are
    /// still sent by [`BinaryClient::recv`] when this handle is used for requests.
    pub fn writer(&self) -> io::Result<BinaryWriter> {
        Ok(BinaryWriter {
            stream: self.stream.try_clone_plain()?,
            buf: [0u8; FRAME_BYTES_MAX],
        })
    }

    pub fn cancel(
        &mut self,
        cl_ord_id: u64,
        orig_cl_ord_id: u64,
        account: u32,
        instrument: u32,
    ) -> io::Result<()> {
        self.write(|buf| encode_cancel(buf, cl_ord_id, orig_cl_ord_id, account, instrument))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn replace(
        &mut self,
        cl_ord_id: u64,
        orig_cl_ord_id: u64,
        account: u32,
        instrument: u32,
        price: i64,
        qty: i64,
    ) -> io::Result<()> {
        self.write(|buf| {
            encode_frame(buf, |mut e: ReplaceOrderEncoder| {
                e.cl_ord_id(cl_ord_id)
                    .order_id_opt(None)
                    .orig_cl_ord_id(orig_cl_ord_id);
                e.price(price)
                    .qty(qty)
                    .display_qty_opt(None)
                    .account(account)
                    .instrument_id(instrument);
                e
            })
        })
    }

    /// Cancels the session's own live orders, of `account` and `instrument` when given.
    pub fn mass_cancel(
        &mut self,
        cl_ord_id: u64,
        account: Option<u32>,
        instrument: Option<u32>,
    ) -> io::Result<()> {
        self.mass_cancel_scoped(cl_ord_id, MassCancelScope::Session, account, instrument)
    }

    /// Cancels the live orders in `scope` (the session's own, the account's whichever session
    /// entered them, or the firm's; docs/gateway.md "Mass cancel scope").
    pub fn mass_cancel_scoped(
        &mut self,
        cl_ord_id: u64,
        scope: MassCancelScope,
        account: Option<u32>,
        instrument: Option<u32>,
    ) -> io::Result<()> {
        self.write(|buf| {
            encode_frame(buf, |mut e: MassCancelEncoder| {
                e.cl_ord_id(cl_ord_id)
                    .account_opt(account)
                    .instrument_id_opt(instrument)
                    .side_opt(None)
                    .scope(scope);
                e
            })
        })
    }

    pub fn retransmit(&mut self, from_seq_no: u64, count: u32) -> io::Result<()> {
        self.write(|buf| {
            encode_frame(buf, |mut e: RetransmitRequestEncoder| {
                e.timestamp_ns(now_ns())
                    .from_seq_no(from_seq_no)
                    .count(count);
                e
            })
        })
    }

    pub fn heartbeat(&mut self) -> io::Result<()> {
        self.write(|buf| {
            encode_frame(buf, |mut e: SequenceEncoder| {
                e.next_seq_no_opt(None);
                e
            })
        })
    }

    pub fn terminate(&mut self) -> io::Result<()> {
        self.write(|buf| {
            encode_frame(buf, |mut e: TerminateEncoder| {
                e.reason(TerminationCode::Finished);
                e
            })
        })
    }

    /// The next message, waiting at most `timeout` (in non-blocking mode: only what is
    /// readable now).
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Option<Received>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.queue.pop_front() {
                return Ok(Some(r));
            }
            if self.closed {
                return Ok(None);
            }
            if self.last_sent.elapsed() >= self.keepalive {
                self.heartbeat()?;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && !self.nonblocking {
                return Ok(None);
            }
            if !self.nonblocking {
                let slice = left.min(self.keepalive / 2).max(Duration::from_micros(1));
                self.stream.set_read_timeout(Some(slice))?;
            }
            match self.stream.read(&mut self.scratch) {
                Ok(0) => self.closed = true,
                Ok(n) => {
                    let bytes = self.scratch[..n].to_vec();
                    self.on_bytes(&bytes)?;
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) =>
                {
                    if self.nonblocking {
                        return Ok(self.queue.pop_front());
                    }
                }
                Err(_) => self.closed = true,
            }
        }
    }

    fn on_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.inbuf.extend_from_slice(bytes);
        let decoder = FrameDecoder::default();
        let mut pos = 0;
        // A Retransmission announces resent responses starting at its nextSeqNo.
        loop {
            match decoder.decode(&self.inbuf[pos..]) {
                Ok(Some(d)) => {
                    pos += d.frame_bytes;
                    let sequenced = d.message.template_id().is_server_response();
                    let response = decode(d.message);
                    let seq = if sequenced {
                        let s = self.expected_seq;
                        self.expected_seq += 1;
                        Some(s)
                    } else {
                        None
                    };
                    if let Response::Retransmission { next_seq_no, .. } = response {
                        self.expected_seq = next_seq_no;
                    }
                    self.queue.push_back(Received { seq, response });
                }
                Ok(None) => break,
                Err(e) => {
                    self.closed = true;
                    return Err(io::Error::new(ErrorKind::InvalidData, e.to_string()));
                }
            }
        }
        self.inbuf.drain(..pos);
        Ok(())
    }
}
