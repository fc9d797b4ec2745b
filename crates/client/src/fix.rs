//! A FIX 4.4 initiator over a blocking TCP stream.

use crate::transport::{Stream, TlsClient};
use bourse_fix::echo::QueueingApplication;
use bourse_fix::session::{Action, Role, Session, SessionConfig};
use bourse_fix::time::system_now_ms;
use bourse_fix::{Dictionary, FileStore, MemoryStore, MessageStore, OutMessage, OwnedMessage, Tag};
use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Application messages received and not yet taken, at most.
const INBOX_MESSAGES_MAX: usize = 1_000_000;

pub type FixMessage = OwnedMessage;

#[derive(Clone, Debug)]
pub struct FixClientConfig {
    pub addr: SocketAddr,
    /// Our CompID (the gateway's `client_comp_id`).
    pub sender_comp_id: String,
    /// The gateway's CompID.
    pub target_comp_id: String,
    pub heart_bt_int_s: u32,
    /// Keep sequence numbers and sent messages here, to resume the session after a
    /// disconnect or restart; none keeps them in memory.
    pub store_dir: Option<PathBuf>,
    /// Start both sequence numbers from 1 at logon (ResetSeqNumFlag=Y).
    pub reset_on_logon: bool,
    pub logon_timeout: Duration,
    /// Password (554) sent on Logon, for a session whose gateway config has a `password_hash`.
    pub password: Option<String>,
    /// NewPassword (925) sent on Logon with `password`: the gateway changes the session's
    /// password to it once `password` is checked (or refuses the Logon saying why).
    pub new_password: Option<String>,
    /// Connect over TLS (the gateway's `fix_tls_listen`); none: plain TCP.
    pub tls: Option<TlsClient>,
}

impl FixClientConfig {
    pub fn new(addr: SocketAddr, sender_comp_id: &str, target_comp_id: &str) -> FixClientConfig {
        FixClientConfig {
            addr,
            sender_comp_id: sender_comp_id.into(),
            target_comp_id: target_comp_id.into(),
            heart_bt_int_s: 30,
            store_dir: None,
            reset_on_logon: false,
            logon_timeout: Duration::from_secs(5),
            password: None,
            new_password: None,
            tls: None,
        }
    }
}

/// A logged-on FIX session to the gateway.
pub struct FixClient {
    stream: Stream,
    session: Session,
    app: QueueingApplication,
    scratch: Vec<u8>,
    nonblocking: bool,
    closed: Option<String>,
}

pub fn dictionary() -> Dictionary {
    Dictionary::from_xml(crate::GATEWAY_FIX44_XML).expect("the gateway dictionary is valid")
}

impl FixClient {
    /// The session's socket, for a caller that sleeps on several sessions with poll(2) until
    /// one is readable (everything already read is returned by the reads before it).
    pub fn socket_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.stream.fd()
    }

    /// Connects, logs on and waits for the gateway's Logon.
    pub fn connect(config: &FixClientConfig) -> io::Result<FixClient> {
        let store: Box<dyn MessageStore> = match &config.store_dir {
            Some(dir) => Box::new(FileStore::open(dir, 1_000_000, false)?),
            None => Box::new(MemoryStore::new(1_000_000)),
        };
        let mut sc = SessionConfig::new(
            "FIX.4.4",
            &config.sender_comp_id,
            &config.target_comp_id,
            Role::Initiator {
                heart_bt_int_s: config.heart_bt_int_s,
            },
        );
        sc.reset_on_logon = config.reset_on_logon;
        sc.logon_password = config.password.clone();
        sc.logon_new_password = config.new_password.clone();
        let session = Session::new(sc, Arc::new(dictionary()), store);
        let stream = Stream::connect(&config.addr, config.logon_timeout, config.tls.as_ref())?;
        let mut client = FixClient {
            stream,
            session,
            app: QueueingApplication::new(INBOX_MESSAGES_MAX),
            scratch: vec![0u8; 64 * 1024],
            nonblocking: false,
            closed: None,
        };
        client.session.on_connect(system_now_ms());
        client.pump()?;
        let deadline = Instant::now() + config.logon_timeout;
        while !client.session.is_logged_on() {
            if let Some(reason) = &client.closed {
                return Err(io::Error::new(ErrorKind::ConnectionRefused, reason.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    ErrorKind::TimedOut,
                    "no Logon from the gateway",
                ));
            }
            client.read_once(Some(left.min(Duration::from_millis(100))))?;
        }
        Ok(client)
    }

    pub fn is_logged_on(&self) -> bool {
        self.session.is_logged_on() && self.closed.is_none()
    }

    /// Why the connection ended, once it has.
    pub fn closed_reason(&self) -> Option<&str> {
        self.closed.as_deref()
    }

    pub fn next_sender_seq_num(&self) -> u64 {
        self.session.next_sender_seq_num()
    }

    /// A second handle on the connection's socket (plain TCP only), for a driver that waits
    /// for readability elsewhere (epoll) rather than in [`FixClient::recv`]: a read timeout
    /// (SO_RCVTIMEO) is rounded up to a kernel tick, 4 ms at HZ=250, so a short `recv`
    /// timeout waits milliseconds. Reading or writing through it would break the session.
    pub fn try_clone_socket(&self) -> io::Result<std::net::TcpStream> {
        self.stream.try_clone_plain()
    }

    /// Reads without blocking from now on (for open-loop drivers).
    pub fn set_nonblocking(&mut self, on: bool) -> io::Result<()> {
        self.stream.set_nonblocking(on)?;
        self.nonblocking = on;
        Ok(())
    }

    /// Sends an application message; returns its MsgSeqNum.
    pub fn send(&mut self, message: OutMessage) -> io::Result<u64> {
        let seq = self
            .session
            .send_app(system_now_ms(), message)
            .map_err(|e| io::Error::new(ErrorKind::NotConnected, e.to_string()))?;
        self.pump()?;
        Ok(seq)
    }

    /// NewOrderSingle: `qty` in units, `price` as decimal text (none: market order).
    #[allow(clippy::too_many_arguments)]
    pub fn new_order(
        &mut self,
        cl_ord_id: &str,
        account: Option<u32>,
        symbol: &str,
        buy: bool,
        qty: i64,
        price: Option<&str>,
        tif: char,
    ) -> io::Result<u64> {
        let mut m = OutMessage::new("D");
        m.push(11, cl_ord_id);
        if let Some(a) = account {
            m.push(1, a.to_string());
        }
        m.push(55, symbol);
        m.push(54, if buy { "1" } else { "2" });
        m.push(
            60,
            bourse_fix::time::format_utc_timestamp_ms(system_now_ms()),
        );
        m.push(38, qty.to_string());
        match price {
            Some(p) => {
                m.push(40, "2");
                m.push(44, p);
            }
            None => {
                m.push(40, "1");
            }
        }
        m.push(59, tif.to_string());
        self.send(m)
    }

    pub fn cancel(
        &mut self,
        cl_ord_id: &str,
        orig_cl_ord_id: &str,
        symbol: &str,
        buy: bool,
    ) -> io::Result<u64> {
        let mut m = OutMessage::new("F");
        m.push(41, orig_cl_ord_id);
        m.push(11, cl_ord_id);
        m.push(55, symbol);
        m.push(54, if buy { "1" } else { "2" });
        m.push(
            60,
            bourse_fix::time::format_utc_timestamp_ms(system_now_ms()),
        );
        self.send(m)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn replace(
        &mut self,
        cl_ord_id: &str,
        orig_cl_ord_id: &str,
        symbol: &str,
        buy: bool,
        qty: i64,
        price: &str,
    ) -> io::Result<u64> {
        let mut m = OutMessage::new("G");
        m.push(41, orig_cl_ord_id);
        m.push(11, cl_ord_id);
        m.push(55, symbol);
        m.push(54, if buy { "1" } else { "2" });
        m.push(
            60,
            bourse_fix::time::format_utc_timestamp_ms(system_now_ms()),
        );
        m.push(38, qty.to_string());
        m.push(40, "2");
        m.push(44, price);
        self.send(m)
    }

    /// OrderMassCancelRequest: all orders (`symbol` none) or those of one symbol.
    pub fn mass_cancel(&mut self, cl_ord_id: &str, symbol: Option<&str>) -> io::Result<u64> {
        let mut m = OutMessage::new("q");
        m.push(11, cl_ord_id);
        match symbol {
            Some(s) => {
                m.push(530, "1");
                m.push(55, s);
            }
            None => {
                m.push(530, "7");
            }
        }
        m.push(
            60,
            bourse_fix::time::format_utc_timestamp_ms(system_now_ms()),
        );
        self.send(m)
    }

    /// OrderStatusRequest (H) for the order `cl_ord_id`; the gateway answers with an
    /// ExecutionReport ExecType=I (OrdStatus=8, OrdRejReason=5 for an order it does not have
    /// live), carrying `status_req_id` back in OrdStatusReqID (790).
    pub fn order_status(
        &mut self,
        cl_ord_id: &str,
        symbol: Option<&str>,
        buy: Option<bool>,
        status_req_id: Option<&str>,
    ) -> io::Result<u64> {
        let mut m = OutMessage::new("H");
        m.push(11, cl_ord_id);
        if let Some(id) = status_req_id {
            m.push(790, id);
        }
        if let Some(s) = symbol {
            m.push(55, s);
        }
        if let Some(b) = buy {
            m.push(54, if b { "1" } else { "2" });
        }
        self.send(m)
    }

    /// OrderMassStatusRequest (AF) for the session's live orders (all, or of one symbol); the
    /// gateway answers one ExecutionReport ExecType=I per order, with MassStatusReqID (584),
    /// TotNumReports (911) and LastRptRequested=Y (912) on the last; with no order, one
    /// report with TotNumReports=0.
    pub fn mass_status(&mut self, req_id: &str, symbol: Option<&str>) -> io::Result<u64> {
        let mut m = OutMessage::new("AF");
        m.push(584, req_id);
        match symbol {
            Some(s) => {
                m.push(585, "1");
                m.push(55, s);
            }
            None => {
                m.push(585, "7");
            }
        }
        self.send(m)
    }

    /// Sends an OrderMassStatusRequest and collects its answers (the status reports of the
    /// session's live orders, none if it has none), keeping other messages for `recv`.
    pub fn live_orders(
        &mut self,
        req_id: &str,
        symbol: Option<&str>,
        timeout: Duration,
    ) -> io::Result<Vec<FixMessage>> {
        self.mass_status(req_id, symbol)?;
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let pos = self
                .app
                .inbox
                .iter()
                .position(|m| m.msg_type == "8" && Self::field(m, 584) == Some(req_id));
            if let Some(pos) = pos {
                let Some(m) = self.app.inbox.remove(pos) else {
                    continue;
                };
                let last = Self::field(&m, 912) == Some("Y");
                if Self::field(&m, 911) != Some("0") {
                    out.push(m);
                }
                if last {
                    return Ok(out);
                }
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.closed.is_some() {
                return Err(io::Error::new(
                    ErrorKind::TimedOut,
                    format!("the mass status request {req_id} was not fully answered"),
                ));
            }
            self.read_once(Some(left.min(Duration::from_millis(100))))?;
        }
    }

    /// The next application message, waiting at most `timeout` (none: only what is buffered
    /// or readable without blocking, in non-blocking mode).
    pub fn recv(&mut self, timeout: Duration) -> io::Result<Option<FixMessage>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(m) = self.app.inbox.pop_front() {
                return Ok(Some(m));
            }
            if self.closed.is_some() {
                return Ok(None);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && !self.nonblocking {
                return Ok(None);
            }
            let got = self.read_once(Some(left.min(Duration::from_millis(100))))?;
            if self.nonblocking && got == 0 {
                if let Some(m) = self.app.inbox.pop_front() {
                    return Ok(Some(m));
                }
                if left.is_zero() {
                    return Ok(None);
                }
            }
        }
    }

    /// Waits for the next message of `msg_type`, keeping others in arrival order for later.
    pub fn recv_type(
        &mut self,
        msg_type: &str,
        timeout: Duration,
    ) -> io::Result<Option<FixMessage>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(pos) = self.app.inbox.iter().position(|m| m.msg_type == msg_type) {
                return Ok(self.app.inbox.remove(pos));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.closed.is_some() {
                return Ok(None);
            }
            self.read_once(Some(left.min(Duration::from_millis(100))))?;
        }
    }

    /// Lets the session's timers run (heartbeats, test requests) without reading.
    pub fn tick(&mut self) -> io::Result<()> {
        self.session.on_tick(system_now_ms(), &mut self.app);
        self.pump()
    }

    /// Sends Logout and waits (bounded) for the answer.
    pub fn logout(&mut self, timeout: Duration) -> io::Result<()> {
        self.session.logout(system_now_ms(), None);
        self.pump()?;
        let deadline = Instant::now() + timeout;
        while self.closed.is_none() && Instant::now() < deadline {
            self.read_once(Some(Duration::from_millis(50)))?;
        }
        Ok(())
    }

    /// Reads once (bounded by `timeout` when blocking) and drives the session. Returns the
    /// bytes read.
    fn read_once(&mut self, timeout: Option<Duration>) -> io::Result<usize> {
        if self.closed.is_some() {
            return Ok(0);
        }
        if !self.nonblocking {
            self.stream.set_read_timeout(Some(
                timeout
                    .unwrap_or(Duration::from_millis(100))
                    .max(Duration::from_micros(1)),
            ))?;
        }
        let now = system_now_ms();
        let n = match self.stream.read(&mut self.scratch) {
            Ok(0) => {
                self.session.on_disconnect(now, &mut self.app);
                self.closed = Some("connection closed by the gateway".into());
                return Ok(0);
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                self.session.on_tick(now, &mut self.app);
                self.pump()?;
                return Ok(0);
            }
            Err(e) => {
                self.session.on_disconnect(now, &mut self.app);
                self.closed = Some(e.to_string());
                return Ok(0);
            }
        };
        let bytes = self.scratch[..n].to_vec();
        self.on_read(now, &bytes)?;
        Ok(n)
    }

    /// Feeds bytes that another thread read from the connection (a blocking read on
    /// [`FixClient::try_clone_socket`]), for a driver that sends on one thread and reads on
    /// another, as the binary client's [`crate::binary::BinaryWriter`] allows: the session
    /// verifies them as if [`FixClient::recv`] had read them, and the application messages
    /// are then taken with `recv(Duration::ZERO)` (in blocking mode it reads nothing more).
    /// Empty `bytes` means the reader saw the connection end.
    pub fn feed(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.closed.is_some() {
            return Ok(());
        }
        let now = system_now_ms();
        if bytes.is_empty() {
            self.session.on_disconnect(now, &mut self.app);
            self.closed = Some("connection closed by the gateway".into());
            return Ok(());
        }
        self.on_read(now, bytes)
    }

    /// Drives the session with bytes read from the connection, then lets its timers run and
    /// writes what it answered.
    fn on_read(&mut self, now: i64, bytes: &[u8]) -> io::Result<()> {
        self.session.on_bytes(now, bytes, &mut self.app);
        self.session.on_tick(now, &mut self.app);
        self.pump()
    }

    fn pump(&mut self) -> io::Result<()> {
        while let Some(action) = self.session.poll_action() {
            match action {
                Action::Send(bytes) => {
                    if self.nonblocking {
                        // Writes are small; wait out a full socket buffer rather than lose bytes.
                        self.stream.set_nonblocking(false)?;
                        let r = self.stream.write_all(&bytes);
                        self.stream.set_nonblocking(true)?;
                        r?;
                    } else {
                        self.stream.write_all(&bytes)?;
                    }
                }
                Action::Disconnect { reason } => {
                    let _ = self.stream.shutdown();
                    self.closed = Some(reason);
                }
            }
        }
        while self.session.poll_event().is_some() {}
        Ok(())
    }

    /// A field of a message as text.
    pub fn field(m: &FixMessage, tag: Tag) -> Option<&str> {
        m.get(tag).and_then(|v| std::str::from_utf8(v).ok())
    }
}
