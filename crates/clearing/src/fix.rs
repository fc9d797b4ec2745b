//! Clearing data over FIX 4.4: RequestForPositions (AN) answered with a
//! RequestForPositionsAck (AO) and one PositionReport (AP) per position, on a port of the
//! clearing node's own (`[fix]` in its config), with the session layer, codec and dictionary
//! of `bourse_fix` and the dictionary in `fix44-clearing.xml`.
//!
//! Who may read what is the HTTP side's rule (`server::reader_of`): a Logon's SenderCompID
//! is a name in the node's credential store and its Password (554) that name's password;
//! roles `operator` and `viewer` read every account, `firm:N` firm N's accounts alone. A
//! wrong password, or a name without such a role, is answered with a Logout saying so. A
//! node with no credentials at all (kept on loopback by validation) lets every CompID read
//! everything, as its HTTP side does.
//!
//! Positions are queries, so a session keeps no state between connections: each connection
//! starts at sequence number 1 on both sides (the client logs on with ResetSeqNumFlag=Y or
//! from 1), and one connection per CompID at a time is allowed.
//!
//! What an answer holds (quantities in lots, amounts in cash with `CASH_SCALE` decimals):
//! - `SettlSessID=ITD` (intraday, the default), the live state, for the clearing business
//!   date the last end of day rolled to (before any: the cores' newest event's or today's):
//!   PosType `SOD` (the day's opening position), `TQ` (LongQty lots bought, ShortQty lots
//!   sold that day) and `TOT` (the net position as LongQty or ShortQty); PosAmt `CASH` (the
//!   account's cash on the instrument's core); futures: SettlPrice the last trade
//!   (SettlPriceType 2, theoretical), PriorSettlPrice the last run's, PosAmt `FMTM` (the
//!   whole mark-to-market since the position opened), `IMTM` (what is not paid yet: the
//!   next run's variation margin at that price), `SMTM` (the opening position from the
//!   day's opening settlement price to the mark) and `TVAR` (the day's trades from their
//!   prices to the mark); equities and FX: `DLV` (units to receive or deliver) and PosAmt
//!   `SETL` (cash to receive or pay) since the last run. Futures also carry PosAmt `IMR`
//!   (the position's initial margin: |lots| × the instrument's initial margin per lot) and
//!   `MCAL` (the margin call open on the account on that core, 0 when none) and `DEBT`
//!   (what earlier runs could not collect from the account on that core, 0 when nothing);
//!   all three are this venue's own PosAmtType values, FIX 4.4 having none for them.
//! - `SettlSessID=EOD`, the end-of-day run of that business date, from its saved plan:
//!   futures `FIN` (the position at the run's cut), SettlPrice the run's (type 1, final),
//!   PriorSettlPrice the run before's, PosAmt `IMTM` (the run's variation margin) and `IMR`
//!   (the initial margin of the position at the cut);
//!   equities and FX `DLV` and `SETL` (the obligations the run settled) and SettlDate (64,
//!   the business day they settle on, from the plan's obligation line; absent for a plan
//!   computed without a calendar).

use std::collections::BTreeSet;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bourse_core::{format_scaled, AccountId, InstrumentId, Market, Price, CASH_SCALE};
use bourse_fix::session::Inbound;
use bourse_fix::tags::{self, BusinessRejectReason};
use bourse_fix::time::{system_now_ms, UtcTimestamp};
use bourse_fix::{
    Action, Application, Dictionary, FrameBuffer, MemoryStore, OutMessage, OwnedMessage,
    QueueingApplication, Role, Session, SessionConfig, Tag,
};
use bourse_monitor::doorkeeper::{Doorkeeper, Pass};
use serde::Deserialize;

use crate::fees::FeeSchedule;
use crate::node::{Inner, Shared};
use crate::run::{RunKind, RunPlan};
use crate::server::{reader_of, Reader, Refusal};
use crate::state::{trade_value, value_to_cash_floor, ClearingPosition, ClearingState};

/// The clearing service's FIX 4.4 dictionary (QuickFIX XML format).
pub const CLEARING_FIX44_XML: &str = include_str!("fix44-clearing.xml");

/// The dictionary the clearing service and its clients validate with.
pub fn dictionary() -> Dictionary {
    Dictionary::from_xml(CLEARING_FIX44_XML).expect("the clearing FIX 4.4 dictionary is valid")
}

/// The FIX tags of clearing data.
pub mod tag {
    use bourse_fix::Tag;
    pub const ACCOUNT: Tag = 1;
    pub const SYMBOL: Tag = 55;
    pub const SETTL_DATE: Tag = 64;
    pub const PARTY_ID_SOURCE: Tag = 447;
    pub const PARTY_ID: Tag = 448;
    pub const PARTY_ROLE: Tag = 452;
    pub const NO_PARTY_IDS: Tag = 453;
    pub const ACCOUNT_TYPE: Tag = 581;
    pub const NO_POSITIONS: Tag = 702;
    pub const POS_TYPE: Tag = 703;
    pub const LONG_QTY: Tag = 704;
    pub const SHORT_QTY: Tag = 705;
    pub const POS_AMT_TYPE: Tag = 707;
    pub const POS_AMT: Tag = 708;
    pub const NO_POS_AMT: Tag = 753;
    pub const POS_REQ_ID: Tag = 710;
    pub const CLEARING_BUSINESS_DATE: Tag = 715;
    pub const SETTL_SESS_ID: Tag = 716;
    pub const POS_MAINT_RPT_ID: Tag = 721;
    pub const POS_REQ_TYPE: Tag = 724;
    pub const TOTAL_NUM_POS_REPORTS: Tag = 727;
    pub const POS_REQ_RESULT: Tag = 728;
    pub const POS_REQ_STATUS: Tag = 729;
    pub const SETTL_PRICE: Tag = 730;
    pub const SETTL_PRICE_TYPE: Tag = 731;
    pub const PRIOR_SETTL_PRICE: Tag = 734;
}

/// PosReqResult (728) values.
pub mod result {
    pub const VALID: u32 = 0;
    pub const INVALID: u32 = 1;
    pub const NO_POSITIONS: u32 = 2;
    pub const NOT_AUTHORIZED: u32 = 3;
    pub const NOT_SUPPORTED: u32 = 4;
    pub const OTHER: u32 = 99;
}

/// `[fix]` of a clearing node's config: the FIX acceptor for clearing data.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixSection {
    /// Where it listens (default 127.0.0.1:9461).
    #[serde(default = "fix_listen_default")]
    pub listen: SocketAddr,
    /// The service's CompID: a Logon's TargetCompID must be this.
    #[serde(default = "comp_id_default")]
    pub comp_id: String,
    /// Connections open at once; a newcomer past it displaces the connection that has waited
    /// longest to log on, or is closed if every one is logged on.
    #[serde(default = "connections_max_default")]
    pub connections_max: usize,
    /// Connections from one address not logged on yet at once; a newcomer past it displaces
    /// its own address's longest-waiting one.
    #[serde(default = "waiting_per_address_max_default")]
    pub waiting_per_address_max: usize,
    /// PositionReports one request may produce; a request for more is refused (ask per
    /// Symbol).
    #[serde(default = "reports_per_request_max_default")]
    pub reports_per_request_max: usize,
    /// A connection must have logged on within this time.
    #[serde(default = "logon_timeout_ms_default")]
    pub logon_timeout_ms: u64,
    /// The largest message taken.
    #[serde(default = "message_size_max_bytes_default")]
    pub message_size_max_bytes: usize,
}

fn fix_listen_default() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9461))
}
fn comp_id_default() -> String {
    "BOURSE-CLEARING".into()
}
fn connections_max_default() -> usize {
    64
}
fn waiting_per_address_max_default() -> usize {
    8
}
fn reports_per_request_max_default() -> usize {
    10_000
}
fn logon_timeout_ms_default() -> u64 {
    5_000
}
fn message_size_max_bytes_default() -> usize {
    16 * 1024
}

impl Default for FixSection {
    fn default() -> FixSection {
        FixSection {
            listen: fix_listen_default(),
            comp_id: comp_id_default(),
            connections_max: connections_max_default(),
            waiting_per_address_max: waiting_per_address_max_default(),
            reports_per_request_max: reports_per_request_max_default(),
            logon_timeout_ms: logon_timeout_ms_default(),
            message_size_max_bytes: message_size_max_bytes_default(),
        }
    }
}

impl FixSection {
    /// The listener's admission limits: a connection proves itself by logging on, within
    /// `logon_timeout_ms`.
    pub fn admission(&self) -> bourse_admission::Limits {
        bourse_admission::Limits::new(
            self.connections_max,
            self.waiting_per_address_max,
            self.logon_timeout_ms,
        )
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.comp_id.is_empty() || self.comp_id.len() > COMP_ID_BYTES_MAX {
            return Err(format!(
                "fix.comp_id must have 1 to {COMP_ID_BYTES_MAX} bytes"
            ));
        }
        if self.connections_max == 0 || self.reports_per_request_max == 0 {
            return Err("fix: connections_max and reports_per_request_max must be > 0".into());
        }
        self.admission().validate("fix")?;
        if self.logon_timeout_ms == 0 || self.message_size_max_bytes < 1024 {
            return Err(
                "fix: logon_timeout_ms must be > 0 and message_size_max_bytes >= 1024".into(),
            );
        }
        Ok(())
    }
}

/// The longest CompID taken.
const COMP_ID_BYTES_MAX: usize = 64;
/// How often a connection's session runs its timers (heartbeats, test requests).
const TICK_MS: u64 = 50;
/// A peer that stops reading is dropped after this long.
const WRITE_TIMEOUT_MS: u64 = 5_000;
/// Messages kept for resend per connection: answers are re-asked, not resent, so few.
const STORED_MESSAGES_MAX: usize = 1_024;

/// A running FIX acceptor; dropping it stops it.
pub struct FixServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FixServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, ends every connection, waits for them.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FixServer {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Ctx {
    shared: Arc<Shared>,
    section: FixSection,
    dictionary: Arc<Dictionary>,
    stop: Arc<AtomicBool>,
    /// CompIDs logged on now (one connection each).
    logged_on: Mutex<BTreeSet<String>>,
}

/// Binds `section.listen` and serves clearing data from `shared` on a thread of its own.
pub fn start(shared: Arc<Shared>, section: &FixSection) -> Result<FixServer, String> {
    section.validate()?;
    let listener = TcpListener::bind(section.listen)
        .map_err(|e| format!("fix: cannot listen on {}: {e}", section.listen))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("fix: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("fix: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let ctx = Arc::new(Ctx {
        shared,
        section: section.clone(),
        dictionary: Arc::new(dictionary()),
        stop: stop.clone(),
        logged_on: Mutex::new(BTreeSet::new()),
    });
    let thread = std::thread::Builder::new()
        .name("clearing-fix".into())
        .spawn(move || accept_loop(listener, ctx))
        .map_err(|e| format!("fix: {e}"))?;
    Ok(FixServer {
        addr,
        stop,
        thread: Some(thread),
    })
}

fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>) {
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    let door = Doorkeeper::new(
        "clearing_fix",
        ctx.section.admission(),
        Some(&ctx.shared.metrics.registry),
    );
    while !ctx.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                workers.retain(|w| !w.is_finished());
                // The venue's admission policy: a connection displaced for a newcomer sees
                // it at its next read tick (`Pass::is_closed`) and leaves.
                let Some(pass) = door.admit(peer) else {
                    let _ = stream.shutdown(Shutdown::Both);
                    continue;
                };
                let c = ctx.clone();
                let spawned = std::thread::Builder::new()
                    .name("clearing-fix-conn".into())
                    .spawn(move || serve_connection(&c, stream, &pass));
                if let Ok(w) = spawned {
                    workers.push(w);
                }
            }
            // The listener is non-blocking so that a stop is seen within a few ms.
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    for w in workers {
        let _ = w.join();
    }
}

/// Reads the first frame (the Logon) within the logon timeout; `None`: the connection ends.
fn read_logon(
    ctx: &Ctx,
    stream: &mut TcpStream,
    pending: &mut FrameBuffer,
    pass: &Pass,
) -> Option<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_millis(ctx.section.logon_timeout_ms);
    let mut buf = [0u8; 4096];
    loop {
        match pending.next_frame() {
            Ok(Some(frame)) => return Some(frame),
            Ok(None) => {}
            Err(_) => return None,
        }
        if pass.is_closed() || Instant::now() > deadline || ctx.stop.load(Ordering::SeqCst) {
            return None;
        }
        match stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => pending.push(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return None,
        }
    }
}

/// A Logout sent before any session exists (a refused Logon), saying why.
fn refusal(ctx: &Ctx, peer: &str, text: &str) -> Vec<u8> {
    let mut logout = OutMessage::new("5");
    logout.push(tags::TEXT, text);
    logout.set_header(tags::SENDER_COMP_ID, &ctx.section.comp_id);
    logout.set_header(tags::TARGET_COMP_ID, peer);
    logout.set_header_u64(tags::MSG_SEQ_NUM, 1);
    logout.set_header_with(tags::SENDING_TIME, |out| {
        UtcTimestamp(system_now_ms()).write_to(out)
    });
    logout.encode("FIX.4.4")
}

/// Who the Logon says it is and what it may read, or the Logout's text.
fn admit(ctx: &Ctx, logon: &[u8]) -> Result<(String, Reader), Option<(String, String)>> {
    let raw =
        bourse_fix::decode(logon, None, ctx.section.message_size_max_bytes).map_err(|_| None)?;
    // Not a Logon to this service at all: closed without a word, as the FIX acceptor does.
    if raw.begin_string() != b"FIX.4.4"
        || raw.msg_type() != b"A"
        || raw.get(tags::TARGET_COMP_ID) != Some(ctx.section.comp_id.as_bytes())
    {
        return Err(None);
    }
    let peer = raw
        .get_str(tags::SENDER_COMP_ID)
        .filter(|p| !p.is_empty() && p.len() <= COMP_ID_BYTES_MAX)
        .filter(|p| p.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or(None)?
        .to_string();
    let reader = if ctx.shared.credentials.is_empty() {
        Reader::Everyone
    } else {
        let password = raw.get_str(tags::PASSWORD).unwrap_or("");
        match reader_of(&ctx.shared.credentials, &peer, password) {
            Ok(r) => r,
            Err(Refusal::Invalid) => {
                return Err(Some((
                    peer,
                    "invalid credentials (SenderCompID, Password)".into(),
                )))
            }
            Err(Refusal::NoRole(why)) => return Err(Some((peer, why))),
        }
    };
    Ok((peer, reader))
}

fn serve_connection(ctx: &Ctx, mut stream: TcpStream, pass: &Pass) {
    let tick = Duration::from_millis(TICK_MS);
    if stream.set_read_timeout(Some(tick)).is_err()
        || stream
            .set_write_timeout(Some(Duration::from_millis(WRITE_TIMEOUT_MS)))
            .is_err()
    {
        return;
    }
    let _ = stream.set_nodelay(true);
    let mut pending = FrameBuffer::new(ctx.section.message_size_max_bytes);
    let Some(logon) = read_logon(ctx, &mut stream, &mut pending, pass) else {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    };
    let (peer, reader) = match admit(ctx, &logon) {
        Ok(admitted) => {
            pass.proven();
            admitted
        }
        Err(answer) => {
            if let Some((peer, text)) = answer {
                let _ = stream.write_all(&refusal(ctx, &peer, &text));
            }
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    };
    if !ctx.logged_on.lock().expect("sessions").insert(peer.clone()) {
        let text = format!("{peer} is already logged on");
        let _ = stream.write_all(&refusal(ctx, &peer, &text));
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    run_session(
        ctx,
        &mut stream,
        &peer,
        reader,
        &logon,
        pending.take_bytes(),
    );
    ctx.logged_on.lock().expect("sessions").remove(&peer);
    let _ = stream.shutdown(Shutdown::Both);
}

/// Drives one logged-on connection's session until it ends.
fn run_session(
    ctx: &Ctx,
    stream: &mut TcpStream,
    peer: &str,
    reader: Reader,
    logon: &[u8],
    rest: Vec<u8>,
) {
    let mut config = SessionConfig::new("FIX.4.4", &ctx.section.comp_id, peer, Role::Acceptor);
    config.reset_on_disconnect = true;
    config.message_size_max_bytes = ctx.section.message_size_max_bytes;
    let store = Box::new(MemoryStore::new(STORED_MESSAGES_MAX));
    let mut session = Session::new(config, ctx.dictionary.clone(), store);
    let mut app = PositionsApp {
        shared: ctx.shared.clone(),
        reader,
        reports_max: ctx.section.reports_per_request_max,
        report_prefix: format!("{peer}-{}", system_now_ms()),
        reports: 0,
    };
    let now = system_now_ms();
    session.on_connect(now);
    session.on_bytes(now, logon, &mut app);
    if !rest.is_empty() {
        session.on_bytes(now, &rest, &mut app);
    }
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let mut close = false;
        while let Some(action) = session.poll_action() {
            match action {
                Action::Send(bytes) => close |= stream.write_all(&bytes).is_err(),
                Action::Disconnect { .. } => close = true,
            }
        }
        while session.poll_event().is_some() {}
        if close || !session.is_connected() || ctx.stop.load(Ordering::SeqCst) {
            break;
        }
        let now = system_now_ms();
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => session.on_bytes(now, &buf[..n], &mut app),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
        session.on_tick(now, &mut app);
    }
    if session.is_connected() {
        session.on_disconnect(system_now_ms(), &mut app);
    }
}

/// The application behind a clearing FIX session: answers RequestForPositions.
struct PositionsApp {
    shared: Arc<Shared>,
    reader: Reader,
    reports_max: usize,
    /// PosMaintRptIDs are this prefix and a count, unique per connection.
    report_prefix: String,
    reports: u64,
}

impl Application for PositionsApp {
    fn on_app_message(
        &mut self,
        message: &Inbound<'_>,
        replies: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason> {
        if message.msg_type() != b"AN" {
            return Err(BusinessRejectReason::UnsupportedMessageType);
        }
        let request = PositionRequest::of(message);
        let inner = self.shared.inner.read().expect("state");
        let answer = answer(
            &inner,
            &request,
            self.reader,
            self.shared.business_day_offset_min,
            self.shared.clock.now_ns(),
            self.reports_max,
            self.shared.config.fees.as_ref(),
        );
        drop(inner);
        self.reply(&request, answer, replies);
        Ok(())
    }
}

/// What a RequestForPositions asks, as text.
struct PositionRequest {
    id: String,
    kind: String,
    account: String,
    date: String,
    session: String,
    symbol: Option<String>,
}

impl PositionRequest {
    fn of(m: &Inbound<'_>) -> PositionRequest {
        let text = |t: Tag| {
            m.get(t)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_default()
        };
        PositionRequest {
            id: text(tag::POS_REQ_ID),
            kind: text(tag::POS_REQ_TYPE),
            account: text(tag::ACCOUNT),
            date: text(tag::CLEARING_BUSINESS_DATE),
            session: m
                .get(tag::SETTL_SESS_ID)
                .map_or("ITD".into(), |v| String::from_utf8_lossy(v).into_owned()),
            symbol: m
                .get(tag::SYMBOL)
                .map(|v| String::from_utf8_lossy(v).into_owned()),
        }
    }
}

/// One PositionReport's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PositionLine {
    pub instrument: InstrumentId,
    pub symbol: String,
    pub price_scale: u8,
    /// The settlement price and its SettlPriceType (1 final, 2 theoretical).
    pub settlement: Option<(Price, u8)>,
    pub prior_settlement: Option<Price>,
    /// When the obligations the line reports settle (SettlDate, `YYYYMMDD`): an end-of-day
    /// equity or FX line whose run dated its obligations.
    pub settlement_date: Option<String>,
    /// (PosType, LongQty, ShortQty).
    pub quantities: Vec<(&'static str, i64, i64)>,
    /// (PosAmtType, amount in cash units).
    pub amounts: Vec<(&'static str, i128)>,
}

/// A whole answer: the firm of the account, and its lines; or a refusal (PosReqResult and
/// text).
struct Answer {
    firm: Option<u32>,
    lines: Result<Vec<PositionLine>, (u32, String)>,
}

/// The business date (`YYYYMMDD`) of a time, in the venue's local time.
pub fn business_date(ts_ns: u64, offset_min: i64) -> String {
    let ms = (ts_ns / 1_000_000) as i64 + offset_min * 60_000;
    let mut s = UtcTimestamp(ms).to_string();
    s.truncate(8);
    s
}

fn long_short(qty: i64) -> (i64, i64) {
    (qty.max(0), (-qty).max(0))
}

fn answer(
    inner: &Inner,
    r: &PositionRequest,
    reader: Reader,
    offset_min: i64,
    now_ns: u64,
    reports_max: usize,
    fees: Option<&FeeSchedule>,
) -> Answer {
    let refuse = |firm, code, text: String| Answer {
        firm,
        lines: Err((code, text)),
    };
    if r.kind != "0" {
        return refuse(
            None,
            result::NOT_SUPPORTED,
            format!("PosReqType {}: only 0 (positions) is served", r.kind),
        );
    }
    let Ok(account) = r.account.parse::<u32>().map(AccountId) else {
        return refuse(
            None,
            result::INVALID,
            format!("Account {:?} is not an account number", r.account),
        );
    };
    if bourse_fix::time::parse_utc_date(r.date.as_bytes()).is_none() {
        return refuse(
            None,
            result::INVALID,
            format!("ClearingBusinessDate {:?} is not a date YYYYMMDD", r.date),
        );
    }
    let state = &inner.state;
    let firm = state.firm_of(account);
    // A firm learns nothing of other accounts, not even whether they exist.
    if !reader.may_read(firm) {
        return refuse(
            None,
            result::NOT_AUTHORIZED,
            format!(
                "account {} belongs to another firm: a firm's session reads its own accounts only",
                account.0
            ),
        );
    }
    let firm = firm.map(|f| f.0);
    let lines = match r.session.as_str() {
        "ITD" => {
            let mut dates = vec![
                business_date(state.last_ts_ns(), offset_min),
                business_date(now_ns, offset_min),
            ];
            // After an end of day the live state is the next business day's: its date is
            // served, a date before it is the closed day's (EOD).
            if let Some(rolled) = state.business_date().map(|d| d.to_string()) {
                dates.retain(|d| *d > rolled);
                dates.insert(0, rolled);
            }
            if !dates.contains(&r.date) {
                return refuse(
                    firm,
                    result::NO_POSITIONS,
                    format!(
                        "intraday positions are for business date {}; ask SettlSessID=EOD \
                         for an earlier day",
                        dates.join(" or ")
                    ),
                );
            }
            intraday(state, fees, account)
        }
        "EOD" => match end_of_day(inner, account, &r.date, offset_min) {
            Ok(lines) => lines,
            Err(why) => return refuse(firm, result::NO_POSITIONS, why),
        },
        other => {
            return refuse(
                firm,
                result::INVALID,
                format!("SettlSessID {other:?}: ITD (intraday) or EOD (end of day)"),
            )
        }
    };
    let lines: Vec<PositionLine> = lines
        .into_iter()
        .filter(|l| r.symbol.as_ref().is_none_or(|s| *s == l.symbol))
        .collect();
    if lines.is_empty() {
        return refuse(
            firm,
            result::NO_POSITIONS,
            format!(
                "account {} has no position{} in that session",
                account.0,
                r.symbol
                    .as_ref()
                    .map_or(String::new(), |s| format!(" in {s}"))
            ),
        );
    }
    if lines.len() > reports_max {
        return refuse(
            firm,
            result::OTHER,
            format!(
                "{} positions are more than the {reports_max} reports one request may have: ask per Symbol",
                lines.len()
            ),
        );
    }
    Answer {
        firm,
        lines: Ok(lines),
    }
}

/// The account's positions in the live state (see the module documentation).
pub fn intraday(
    state: &ClearingState,
    fees: Option<&FeeSchedule>,
    account: AccountId,
) -> Vec<PositionLine> {
    let mut out = Vec::new();
    for (instrument, p) in state.account_positions(account) {
        let Some(def) = state.definition(instrument) else {
            continue;
        };
        let traded = state.instruments().get(&instrument);
        let (long, short) = long_short(p.qty);
        let (sod_long, sod_short) = long_short(p.sod.qty);
        let mut line = PositionLine {
            instrument,
            symbol: def.symbol.clone(),
            price_scale: def.price_scale,
            settlement: None,
            prior_settlement: traded.and_then(|s| s.settlement),
            settlement_date: None,
            quantities: vec![
                ("SOD", sod_long, sod_short),
                ("TQ", p.day_lots_bought(), p.day_lots_sold()),
                ("TOT", long, short),
            ],
            amounts: Vec::new(),
        };
        if def.market == Market::Futures {
            let mark = traded.and_then(|s| s.recent.back()).map(|t| t.price);
            line.settlement = mark.map(|m| (m, 2));
            if let Some(m) = mark {
                let amounts = futures_amounts(def, &p, m, traded.and_then(|s| s.sod_settlement));
                line.amounts.extend(amounts);
            }
        } else {
            let (receive, deliver) = long_short(p.securities_due);
            line.quantities.push(("DLV", receive, deliver));
            line.amounts.push(("SETL", p.cash_due.0));
        }
        // The collateral: the account's cash on the core that trades the instrument, and
        // the margin call open there.
        let core = traded.map_or(0, |s| s.core);
        let at_core = state
            .cash()
            .get(&(core, account))
            .copied()
            .unwrap_or_default();
        line.amounts.push(("CASH", at_core.cash.0));
        if def.market == Market::Futures {
            let im = state.position_initial_margin(instrument, p.qty);
            line.amounts.push(("IMR", im));
            line.amounts.push(("MCAL", at_core.margin_called.0));
            // What earlier runs could not collect from the account on that core.
            let debt = state.debts().get(&(core, account)).map_or(0, |d| d.0);
            line.amounts.push(("DEBT", debt));
        }
        let base = state.fee_bases().get(&(account, instrument));
        if let (Some(schedule), Some(base)) = (fees, base) {
            if let Some(rate) = schedule.rate_of(def) {
                line.amounts.push(("FEES", base.fee(def, rate)));
            }
        }
        out.push(line);
    }
    out
}

/// A futures position's amounts marked at `mark`: `FMTM` the whole mark-to-market since it
/// opened, `IMTM` what no run paid yet, and the day's variation split as FIX 4.4 does:
/// `SMTM` the start-of-day position from the day's opening settlement price `sod_settlement`
/// to the mark (0 before any end of day), `TVAR` the day's trades from their prices to the
/// mark. `SMTM + TVAR` is the day's variation: what the day's runs paid plus `IMTM`, but for
/// the rounding of each to cash.
pub fn futures_amounts(
    def: &bourse_core::Instrument,
    p: &ClearingPosition,
    mark: bourse_core::Price,
    sod_settlement: Option<bourse_core::Price>,
) -> Vec<(&'static str, i128)> {
    let value = |price, lots| trade_value(def, price, lots).ok();
    let (Some(marked), Some(day_marked)) = (value(mark, p.qty), value(mark, p.qty - p.sod.qty))
    else {
        return Vec::new();
    };
    let whole = value_to_cash_floor(def, marked - p.paid_value);
    let smtm = match sod_settlement {
        Some(s) => value(mark, p.sod.qty)
            .zip(value(s, p.sod.qty))
            .map_or(0, |(now, then)| value_to_cash_floor(def, now - then)),
        None => 0,
    };
    let tvar = value_to_cash_floor(def, day_marked - p.day_paid_value());
    vec![
        ("FMTM", whole),
        ("IMTM", whole - p.vm_paid.0),
        ("SMTM", smtm),
        ("TVAR", tvar),
    ]
}

/// The business date of a run: its slot on the schedule, else its cut's newest event.
fn run_date(plan: &RunPlan, offset_min: i64) -> String {
    business_date(plan.scheduled_ns.unwrap_or(plan.cut_ts_ns), offset_min)
}

/// The account's positions as the end-of-day run of `date` settled them.
fn end_of_day(
    inner: &Inner,
    account: AccountId,
    date: &str,
    offset_min: i64,
) -> Result<Vec<PositionLine>, String> {
    let eod = inner
        .runs
        .values()
        .rev()
        .map(|r| &r.plan)
        .find(|p| p.kind == RunKind::EndOfDay && run_date(p, offset_min) == date)
        .ok_or_else(|| format!("no end-of-day run for business date {date} here"))?;
    let state = &inner.state;
    let prior = |instrument: InstrumentId| {
        inner
            .runs
            .range(..eod.run_id)
            .rev()
            .find_map(|(_, r)| r.plan.prices.get(&instrument).copied())
    };
    let mut lines: Vec<PositionLine> = Vec::new();
    let line_of = |instrument: InstrumentId, lines: &mut Vec<PositionLine>| {
        if let Some(i) = lines.iter().position(|l| l.instrument == instrument) {
            return Some(i);
        }
        let def = state.definition(instrument)?;
        lines.push(PositionLine {
            instrument,
            symbol: def.symbol.clone(),
            price_scale: def.price_scale,
            settlement: eod.prices.get(&instrument).map(|&p| (p, 1)),
            prior_settlement: prior(instrument),
            settlement_date: None,
            quantities: Vec::new(),
            amounts: Vec::new(),
        });
        Some(lines.len() - 1)
    };
    for m in eod.margin.iter().filter(|m| m.account == account) {
        if let Some(i) = line_of(m.instrument, &mut lines) {
            let (long, short) = long_short(m.qty);
            lines[i].quantities.push(("FIN", long, short));
            lines[i].amounts.push(("IMTM", m.vm.0));
            let im = state.position_initial_margin(m.instrument, m.qty);
            lines[i].amounts.push(("IMR", im));
        }
    }
    for f in eod.fees.iter().filter(|f| f.account == account) {
        if let Some(i) = line_of(f.instrument, &mut lines) {
            lines[i].amounts.push(("FEES", f.fee.0));
        }
    }
    for o in eod.obligations.iter().filter(|o| o.account == account) {
        if let Some(i) = line_of(o.instrument, &mut lines) {
            let (receive, deliver) = long_short(o.securities);
            lines[i].quantities.push(("DLV", receive, deliver));
            lines[i].amounts.push(("SETL", o.cash.0));
            // The plan keeps the date as `YYYY-MM-DD`; FIX's LocalMktDate has no dashes.
            lines[i].settlement_date = o.settlement_date.as_ref().map(|d| d.replace('-', ""));
        }
    }
    lines.sort_by_key(|l| l.instrument);
    Ok(lines)
}

impl PositionsApp {
    fn next_report_id(&mut self) -> String {
        self.reports += 1;
        format!("{}-{}", self.report_prefix, self.reports)
    }

    fn reply(&mut self, r: &PositionRequest, answer: Answer, replies: &mut Vec<OutMessage>) {
        let (code, status, total, text) = match &answer.lines {
            Ok(lines) => (result::VALID, 0, lines.len(), None),
            Err((code, text)) => (*code, 2, 0, Some(text.as_str())),
        };
        let mut ack = OutMessage::new("AO");
        ack.push(tag::POS_MAINT_RPT_ID, self.next_report_id());
        ack.push(tag::POS_REQ_ID, &r.id);
        ack.push_u64(tag::TOTAL_NUM_POS_REPORTS, total as u64);
        ack.push_u64(tag::POS_REQ_RESULT, u64::from(code));
        ack.push_u64(tag::POS_REQ_STATUS, status);
        push_parties(&mut ack, answer.firm);
        ack.push(tag::ACCOUNT, &r.account);
        ack.push(tag::ACCOUNT_TYPE, "1");
        if let Some(text) = text {
            ack.push(tags::TEXT, text);
        }
        replies.push(ack);
        let Ok(lines) = answer.lines else {
            return;
        };
        for line in &lines {
            let id = self.next_report_id();
            replies.push(position_report(r, &id, answer.firm, total, line));
        }
    }
}

/// Parties: the firm (PartyRole 1, executing firm; PartyIDSource D, proprietary).
fn push_parties(m: &mut OutMessage, firm: Option<u32>) {
    match firm {
        Some(f) => {
            m.push_u64(tag::NO_PARTY_IDS, 1);
            m.push_u64(tag::PARTY_ID, u64::from(f));
            m.push(tag::PARTY_ID_SOURCE, "D");
            m.push(tag::PARTY_ROLE, "1");
        }
        None => {
            m.push_u64(tag::NO_PARTY_IDS, 0);
        }
    }
}

fn position_report(
    r: &PositionRequest,
    id: &str,
    firm: Option<u32>,
    total: usize,
    line: &PositionLine,
) -> OutMessage {
    let mut m = OutMessage::new("AP");
    m.push(tag::POS_MAINT_RPT_ID, id);
    m.push(tag::POS_REQ_ID, &r.id);
    m.push(tag::POS_REQ_TYPE, "0");
    m.push_u64(tag::TOTAL_NUM_POS_REPORTS, total as u64);
    m.push_u64(tag::POS_REQ_RESULT, u64::from(result::VALID));
    m.push(tag::CLEARING_BUSINESS_DATE, &r.date);
    m.push(tag::SETTL_SESS_ID, &r.session);
    push_parties(&mut m, firm);
    m.push(tag::ACCOUNT, &r.account);
    m.push(tag::ACCOUNT_TYPE, "1");
    m.push(tag::SYMBOL, &line.symbol);
    let price = |p: Price| format_scaled(i128::from(p.0), line.price_scale);
    if let Some((p, kind)) = line.settlement {
        m.push(tag::SETTL_PRICE, price(p));
        m.push_u64(tag::SETTL_PRICE_TYPE, u64::from(kind));
    }
    if let Some(p) = line.prior_settlement {
        m.push(tag::PRIOR_SETTL_PRICE, price(p));
    }
    if let Some(date) = &line.settlement_date {
        m.push(tag::SETTL_DATE, date);
    }
    m.push_u64(tag::NO_POSITIONS, line.quantities.len() as u64);
    for (kind, long, short) in &line.quantities {
        m.push(tag::POS_TYPE, kind);
        m.push_int(tag::LONG_QTY, i128::from(*long));
        m.push_int(tag::SHORT_QTY, i128::from(*short));
    }
    m.push_u64(tag::NO_POS_AMT, line.amounts.len() as u64);
    for (kind, amount) in &line.amounts {
        m.push(tag::POS_AMT_TYPE, kind);
        m.push(tag::POS_AMT, format_scaled(*amount, CASH_SCALE));
    }
    m
}

/// A blocking FIX client of the clearing service: logs on (ResetSeqNumFlag=Y, with a
/// password), asks for positions, logs out. Tests and `bourse clearing positions` use it.
pub struct PositionsClient {
    stream: TcpStream,
    session: Session,
    app: QueueingApplication,
    buf: Vec<u8>,
    next_request: u64,
}

/// What the service answered one request with: its ack and its reports.
#[derive(Clone, Debug)]
pub struct PositionsAnswer {
    pub ack: OwnedMessage,
    pub reports: Vec<OwnedMessage>,
}

impl PositionsAnswer {
    /// PosReqResult (0: the reports follow).
    pub fn result(&self) -> Option<u32> {
        field(&self.ack, tag::POS_REQ_RESULT).and_then(|v| v.parse().ok())
    }
}

/// A field of a received message as text.
pub fn field(m: &OwnedMessage, t: Tag) -> Option<&str> {
    m.get(t).and_then(|v| std::str::from_utf8(v).ok())
}

/// The entries of a repeating group (its `count` tag, then entries of the `members` tags,
/// each entry starting with `members[0]`), each as (tag, value) pairs, in order.
pub fn group(m: &OwnedMessage, count: Tag, members: &[Tag]) -> Vec<Vec<(Tag, String)>> {
    let mut out: Vec<Vec<(Tag, String)>> = Vec::new();
    let Some(start) = m.fields.iter().position(|(t, _)| *t == count) else {
        return out;
    };
    let n: usize = field(m, count).and_then(|v| v.parse().ok()).unwrap_or(0);
    for (t, v) in &m.fields[start + 1..] {
        if !members.contains(t) {
            break;
        }
        if *t == members[0] {
            if out.len() == n {
                break;
            }
            out.push(Vec::new());
        }
        match out.last_mut() {
            Some(entry) => entry.push((*t, String::from_utf8_lossy(v).into_owned())),
            None => break,
        }
    }
    out
}

impl PositionsClient {
    /// Connects to `addr` and logs on as `sender` to `target` with `password`.
    pub fn connect(
        addr: SocketAddr,
        sender: &str,
        target: &str,
        password: Option<&str>,
        timeout: Duration,
    ) -> io::Result<PositionsClient> {
        let mut config = SessionConfig::new(
            "FIX.4.4",
            sender,
            target,
            Role::Initiator { heart_bt_int_s: 30 },
        );
        config.reset_on_logon = true;
        config.logon_password = password.map(String::from);
        let store = Box::new(MemoryStore::new(STORED_MESSAGES_MAX));
        let session = Session::new(config, Arc::new(dictionary()), store);
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_millis(TICK_MS)))?;
        let mut client = PositionsClient {
            stream,
            session,
            app: QueueingApplication::new(1_000_000),
            buf: vec![0u8; 64 * 1024],
            next_request: 1,
        };
        client.session.on_connect(system_now_ms());
        client.pump()?;
        client.wait(timeout, |c| c.session.is_logged_on())?;
        Ok(client)
    }

    fn pump(&mut self) -> io::Result<()> {
        let mut closed = None;
        while let Some(action) = self.session.poll_action() {
            match action {
                Action::Send(bytes) => self.stream.write_all(&bytes)?,
                Action::Disconnect { reason } => closed = Some(reason),
            }
        }
        let mut events = Vec::new();
        while let Some(e) = self.session.poll_event() {
            events.push(e);
        }
        match closed {
            Some(reason) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("{reason} ({})", events.join("; ")),
            )),
            None => Ok(()),
        }
    }

    /// Reads and lets the session work until `done` holds, or `timeout` passes.
    fn wait(&mut self, timeout: Duration, done: impl Fn(&Self) -> bool) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        while !done(self) {
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no answer from the clearing service in time",
                ));
            }
            let now = system_now_ms();
            match self.stream.read(&mut self.buf) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the clearing service closed the connection",
                    ))
                }
                Ok(n) => {
                    let bytes = self.buf[..n].to_vec();
                    self.session.on_bytes(now, &bytes, &mut self.app);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e),
            }
            self.session.on_tick(now, &mut self.app);
            self.pump()?;
        }
        Ok(())
    }

    /// Sends a message built by the caller (a test sends malformed requests with it).
    pub fn send(&mut self, message: OutMessage) -> io::Result<()> {
        self.session
            .send_app(system_now_ms(), message)
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.pump()
    }

    /// The next application message received, within `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> io::Result<OwnedMessage> {
        self.wait(timeout, |c| !c.app.inbox.is_empty())?;
        Ok(self.app.inbox.pop_front().expect("a message"))
    }

    /// Asks for `account`'s positions on `date` (`YYYYMMDD`) in session `settl_sess_id` (ITD
    /// or EOD), optionally in one symbol, and waits for the ack and every report it announces.
    pub fn positions(
        &mut self,
        account: u32,
        date: &str,
        settl_sess_id: &str,
        symbol: Option<&str>,
        timeout: Duration,
    ) -> io::Result<PositionsAnswer> {
        let id = format!("req-{}", self.next_request);
        self.next_request += 1;
        let mut m = OutMessage::new("AN");
        m.push(tag::POS_REQ_ID, &id);
        m.push(tag::POS_REQ_TYPE, "0");
        m.push_u64(tag::ACCOUNT, u64::from(account));
        m.push(tag::ACCOUNT_TYPE, "1");
        if let Some(s) = symbol {
            m.push(tag::SYMBOL, s);
        }
        m.push(tag::CLEARING_BUSINESS_DATE, date);
        m.push(tag::SETTL_SESS_ID, settl_sess_id);
        m.push_with(60, |out| UtcTimestamp(system_now_ms()).write_to(out));
        self.send(m)?;
        let ack = self.recv(timeout)?;
        if ack.msg_type != "AO" || field(&ack, tag::POS_REQ_ID) != Some(id.as_str()) {
            return Err(io::Error::other(format!(
                "expected the RequestForPositionsAck of {id}, got {} {:?}",
                ack.msg_type,
                field(&ack, tags::TEXT)
            )));
        }
        let total: usize = field(&ack, tag::TOTAL_NUM_POS_REPORTS)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut reports = Vec::with_capacity(total);
        while reports.len() < total {
            reports.push(self.recv(timeout)?);
        }
        Ok(PositionsAnswer { ack, reports })
    }

    /// Logs out and waits (at most `timeout`) for the service's Logout.
    pub fn logout(mut self, timeout: Duration) -> io::Result<()> {
        self.session.logout(system_now_ms(), None);
        self.pump()?;
        let deadline = Instant::now() + timeout;
        while self.session.is_connected() && Instant::now() < deadline {
            match self.wait(Duration::from_millis(TICK_MS), |_| false) {
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                Err(_) => break,
                Ok(()) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clearing_dictionary_loads_and_knows_the_position_messages() {
        let d = dictionary();
        assert_eq!(d.begin_string, "FIX.4.4");
    }

    #[test]
    fn business_dates_are_local_dates() {
        // 2026-11-26 22:30 UTC is the 27th in Moscow (UTC+3).
        let ns = 1_795_732_200_000_000_000u64;
        assert_eq!(business_date(ns, 0), "20261126");
        assert_eq!(business_date(ns, 180), "20261127");
    }

    #[test]
    fn a_config_section_refuses_unknown_keys_and_empty_limits() {
        let s: FixSection = toml::from_str("listen = \"127.0.0.1:0\"").unwrap();
        assert_eq!(s.comp_id, "BOURSE-CLEARING");
        s.validate().unwrap();
        assert!(toml::from_str::<FixSection>("colour = 1").is_err());
        let zero: FixSection = toml::from_str("reports_per_request_max = 0").unwrap();
        assert!(zero.validate().is_err());
    }

    #[test]
    fn a_group_is_read_entry_by_entry() {
        let m = OwnedMessage {
            msg_type: "AP".into(),
            seq_num: 1,
            fields: vec![
                (702, b"2".to_vec()),
                (703, b"TQ".to_vec()),
                (704, b"7".to_vec()),
                (705, b"0".to_vec()),
                (703, b"TOT".to_vec()),
                (704, b"7".to_vec()),
                (753, b"1".to_vec()),
                (707, b"FMTM".to_vec()),
            ],
        };
        let g = group(&m, 702, &[703, 704, 705]);
        assert_eq!(g.len(), 2);
        assert_eq!(g[1], vec![(703, "TOT".into()), (704, "7".into())]);
        let amounts = group(&m, 753, &[707, 708]);
        assert_eq!(amounts, vec![vec![(707, "FMTM".to_string())]]);
    }
}
