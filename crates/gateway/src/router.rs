//! Protocol-neutral order routing: sessions' [`Request`]s ([`Router::handle`]) become core
//! commands, core outputs ([`Router::poll_core`]) become [`Report`]s addressed to sessions
//! ([`Router::take_outbox`]). The FIX and binary front ends only parse and render; everything
//! about order identity, ownership and fills lives here, and the order table's status answers
//! and durable state in `orders`. The router's unit tests (`router/tests.rs`) drive it
//! against a fake link per core.
//!
//! Client order ids are the sessions' own (FIX text, binary numbers). The core sees gateway
//! numbers ([`ClOrdId`]) unique across all sessions, so two sessions trading one account can
//! never collide; the live mapping is kept per session and dropped when the order ends.
//!
//! Several cores: each instrument belongs to one core (`[[cores]]` in the config), and every
//! command goes to the core of its instrument; a cancel or replace goes where its order lives.
//! A mass cancel without an instrument goes to every core (one command per account and core)
//! and its OrderMassCancelReport adds up the answers. Order ids are unique across cores (each
//! core numbers from `core_index << ORDER_ID_CORE_SHIFT`), so events are routed by order id
//! whichever core sent them. Request keys are gateway-wide, so a core sees a subset of a
//! session's keys, still increasing.

mod orders;

pub use crate::reports::{
    Echo, ExecKind, ExecReport, Finished, GatewayReject, RejectCause, Report, StatusQuery,
};
pub use orders::{RouterState, SavedInstrument, SavedOrder, FINISHED_ORDERS_KEPT};

use crate::config::{GatewayConfig, Limits};
use bourse_core::link::{CoreLink, CoreOutput, RequestKey, SubmitError};
use bourse_core::*;
use bourse_fix::dictionary::DictHash;
use bourse_monitor::rate::TokenBucket as Throttle;
use bourse_monitor::{Stage, StageRecorder, Trace};
use std::collections::{HashMap, VecDeque};

/// A client's order id as it appears on its protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClientId {
    Text(Box<str>),
    Num(u64),
}

impl std::fmt::Display for ClientId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientId::Text(t) => f.write_str(t),
            ClientId::Num(n) => write!(f, "{n}"),
        }
    }
}

impl ClientId {
    pub fn num(&self) -> u64 {
        match self {
            ClientId::Num(n) => *n,
            ClientId::Text(t) => t.parse().unwrap_or(0),
        }
    }
}

/// Index of a session in the router's session table (FIX and binary alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionRef(pub u32);

impl SessionRef {
    fn key_session(self) -> u32 {
        self.0 + 1
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Fix(usize),
    Binary(usize),
}

#[derive(Clone, Copy, Debug)]
struct LiveRef {
    internal: ClOrdId,
    account: AccountId,
    order_id: Option<OrderId>,
    /// Index of the core that holds the order.
    core: usize,
    /// For a mass cancel's filters.
    instrument: InstrumentId,
    side: Side,
}

/// What the gateway knows about one session, whichever its protocol.
pub struct SessionMeta {
    pub name: String,
    pub proto: Proto,
    pub firm: FirmId,
    pub accounts: Vec<AccountId>,
    pub drop_copy: bool,
    pub throttle: Throttle,
    next_seq: u64,
    live: HashMap<ClientId, LiveRef>,
}

impl SessionMeta {
    pub fn live_orders(&self) -> usize {
        self.live.len()
    }
}

#[derive(Clone, Debug)]
struct OrderState {
    owner: SessionRef,
    client: ClientId,
    account: AccountId,
    instrument: InstrumentId,
    side: Side,
    ord_type: OrdType,
    tif: TimeInForce,
    price: Price,
    qty_lots: i64,
    cum_lots: i64,
    /// Sum of price × lots over fills, for the average price.
    notional: i128,
}

#[derive(Clone, Debug)]
enum Pending {
    New(OrderState),
    Cancel {
        owner: SessionRef,
        client: ClientId,
        orig: ClientId,
    },
    Replace {
        owner: SessionRef,
        client: ClientId,
        orig: ClientId,
    },
    MassCancel {
        owner: SessionRef,
        agg: u64,
        /// One order's cancel among the parts of a session-scope mass cancel (answered by
        /// OrderCancelled or CancelRejected), not a core's MassCancel (answered by
        /// MassCancelDone).
        one_order: bool,
    },
}

/// Whose orders a mass cancel reaches (FIX MassCancelRequestType 1 and 7: the session's;
/// 8 with Account: the account's; 8 without: the firm's; see `docs/gateway.md`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MassCancelScope {
    /// The requesting session's own orders.
    #[default]
    Session,
    /// Every order of the account (or of each account the session may trade), whichever
    /// session entered it.
    Account,
    /// Every order of the session's firm.
    Firm,
}

/// The filters of a mass cancel; none set matches every order in scope.
#[derive(Clone, Copy, Debug, Default)]
struct MassFilters {
    account: Option<AccountId>,
    instrument: Option<InstrumentId>,
    side: Option<Side>,
}

impl MassFilters {
    fn matches(&self, l: &LiveRef) -> bool {
        self.account.is_none_or(|a| a == l.account)
            && self.instrument.is_none_or(|i| i == l.instrument)
            && self.side.is_none_or(|s| s == l.side)
    }
}

/// Each account a session may trade, as mass cancel parties: its listed accounts, or its
/// whole firm for a session entitled by firm.
fn meta_accounts(meta: &SessionMeta) -> Vec<(Option<AccountId>, Option<FirmId>)> {
    if meta.accounts.is_empty() {
        return vec![(None, Some(meta.firm))];
    }
    meta.accounts.iter().map(|a| (Some(*a), None)).collect()
}

struct MassAgg {
    owner: SessionRef,
    client: ClientId,
    /// FIX MassCancelRequestType as sent ('1' by security, '7' all orders).
    request_type: u8,
    remaining: u32,
    total: u64,
    reject: Option<RejectReason>,
}

/// An instrument as the gateway needs it: to read and write prices and quantities.
#[derive(Clone, Debug)]
pub struct InstrumentInfo {
    pub id: InstrumentId,
    pub symbol: String,
    pub price_scale: u8,
    pub lot_size: i64,
    /// Index of the core that owns the instrument.
    pub core: usize,
}

impl InstrumentInfo {
    /// Lots from a quantity in units; None unless a positive multiple of the lot.
    pub fn lots(&self, units: i64) -> Option<i64> {
        (units > 0 && units % self.lot_size == 0).then(|| units / self.lot_size)
    }
    pub fn units(&self, lots: i64) -> i64 {
        lots.saturating_mul(self.lot_size)
    }
}

/// A new order as a front end parsed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewOrderRequest {
    pub client: ClientId,
    pub account: Option<AccountId>,
    pub instrument: InstrumentId,
    pub side: Side,
    pub ord_type: OrdType,
    pub price: Price,
    pub qty_lots: i64,
    pub tif: TimeInForce,
    pub expire_ts_ns: u64,
    pub display_lots: i64,
}

/// What the router counts, as plain integers: the event loop owns them and publishes them to
/// the monitor on its timer, so counting costs an add and no atomic operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouterCounters {
    pub new_orders: u64,
    pub cancels: u64,
    pub replaces: u64,
    pub mass_cancels: u64,
    pub status_requests: u64,
    /// FIX application messages received (the binary count is the event loop's).
    pub fix_requests_in: u64,
    /// Requests refused because a core's queue (or the order table) was full.
    pub busy_rejects: u64,
    /// Requests refused because a core's replica group had no quorum.
    pub no_quorum_rejects: u64,
    /// Requests refused by a session's throttle, by protocol.
    pub fix_throttle_rejects: u64,
    pub binary_throttle_rejects: u64,
    /// Requests refused by the gateway's own checks (unknown symbol, not authorized, ...).
    pub gateway_rejects: u64,
    /// Requests refused by a core.
    pub core_rejects: u64,
}

/// Sampled traces the router carries from the decoded request to its first report.
pub struct RouterProbes {
    /// The event loop's recorder (disabled unless a monitor with sampling is on).
    pub recorder: StageRecorder,
    /// When the bytes being handled were read from their socket (t0).
    pub read_t_ns: u64,
    /// The trace of the request being handled now, set by the front end when it is sampled;
    /// the submit that sends it to a core stamps t2 and keeps it under the request's key.
    pub current: Option<Trace>,
    /// Sampled requests waiting for the core's answer.
    in_flight: HashMap<RequestKey, Trace>,
    /// Reports in `outbox` (by index) that answer a sampled request, with its trace.
    pub answered: Vec<(usize, Trace)>,
    /// The time the current core output was received, for t5.
    now_ns: u64,
}

impl Default for RouterProbes {
    fn default() -> Self {
        RouterProbes {
            recorder: StageRecorder::disabled(),
            read_t_ns: 0,
            current: None,
            in_flight: HashMap::new(),
            answered: Vec::new(),
            now_ns: 0,
        }
    }
}

impl RouterProbes {
    /// Called once per decoded request: if the recorder samples it, starts its trace with t0
    /// (the socket read) and t1 (now). Always replaces the previous request's trace, so a
    /// request that never reached a core leaves nothing behind for the next one.
    #[inline]
    pub fn begin(&mut self, kind: CommandKind) {
        self.current = if self.recorder.sample() {
            let mut t = Trace::new(kind);
            t.stamp_at(Stage::SocketRead, self.read_t_ns);
            t.stamp(Stage::Decoded);
            Some(t)
        } else {
            None
        };
    }
}

/// Sampled requests in flight at most; past it new samples are dropped (a core that stopped
/// answering must not grow the table).
const TRACES_IN_FLIGHT_MAX: usize = 4_096;

pub struct Router {
    sessions: Vec<SessionMeta>,
    instruments: Vec<InstrumentInfo>,
    /// Instruments by symbol and by id, looked up for every order and report: hashed with the
    /// FIX dictionary's cheap unkeyed hash, since only the configuration and the cores'
    /// streams fill them (a peer only looks up), where SipHash cost a few hundred
    /// instructions a request.
    by_symbol: HashMap<String, usize, DictHash>,
    by_id: HashMap<InstrumentId, usize, DictHash>,
    /// Instruments learned from the cores' streams (saved in the state; see `orders`).
    learned: Vec<SavedInstrument>,
    drop_copies: HashMap<FirmId, Vec<SessionRef>>,
    /// Keyed by numbers the cores and the gateway assign (order ids, request keys), never by
    /// what a peer chooses: hashed with the cheap unkeyed DictHash, as the instrument tables.
    orders: HashMap<OrderId, OrderState, DictHash>,
    /// Orders no longer live, for status requests: by order id, by owner and client id
    /// (the latest order of that id), and in the order they finished (to forget the oldest).
    finished: HashMap<OrderId, (OrderState, Finished), DictHash>,
    finished_by_client: HashMap<(SessionRef, ClientId), OrderId>,
    finished_order: VecDeque<OrderId>,
    /// How many finished orders are kept (`Limits::finished_orders_kept`).
    finished_orders_kept: usize,
    /// Bytes of the text client ids of the finished orders (see `finished_orders_bytes`).
    finished_text_bytes: usize,
    pending: HashMap<RequestKey, Pending, DictHash>,
    mass: HashMap<u64, MassAgg>,
    next_mass: u64,
    next_internal: u64,
    next_admin_seq: u64,
    links: Vec<Box<dyn CoreLink>>,
    /// Commands submitted to each core and not yet answered (`Done`).
    in_flight: Vec<usize>,
    /// Past this many in flight to a core, requests are refused as busy (`Limits`).
    core_in_flight_max: usize,
    orders_max: usize,
    /// Reports waiting for delivery by the front ends.
    outbox: Vec<(SessionRef, Report)>,
    /// Administrative commands (session 0) answered: key and the core's reject, if any.
    admin_done: Vec<(RequestKey, Option<RejectReason>)>,
    admin_reject: HashMap<RequestKey, RejectReason>,
    /// Whether an administrative command's answer included an AccountAdded event.
    admin_accounts_added: Vec<RequestKey>,
    /// Application requests received from all sessions (throttled ones included).
    requests_in: u64,
    counters: RouterCounters,
    probes: RouterProbes,
    /// Whether probes are on (a monitor with sampling); off, no clock is read for them.
    probes_on: bool,
}

/// A session's request, protocol-neutral: what the FIX and the binary front make of a
/// message once parsed, handed to [`Router::handle`].
#[derive(Debug)]
pub enum Request {
    New(NewOrderRequest),
    Cancel {
        client: ClientId,
        /// The order's client id, and its exchange id if the request gave one (it wins).
        orig: ClientId,
        order_id: Option<OrderId>,
    },
    Replace {
        client: ClientId,
        orig: ClientId,
        order_id: Option<OrderId>,
        price: Option<Price>,
        qty_lots: Option<i64>,
    },
    /// Cancels the orders in `scope` matching the filters (`request_type` is echoed: FIX
    /// MassCancelRequestType).
    MassCancel {
        client: ClientId,
        request_type: u8,
        scope: MassCancelScope,
        account: Option<AccountId>,
        instrument: Option<InstrumentId>,
        side: Option<Side>,
    },
    /// The state of one order (FIX OrderStatusRequest): by exchange id or client id;
    /// `symbol` and `side` are echoed if the order is unknown.
    Status {
        client: Option<ClientId>,
        order_id: Option<OrderId>,
        symbol: Option<Box<str>>,
        side: Option<Side>,
        status_req_id: Option<Box<str>>,
    },
    /// The state of every live order of the session (FIX OrderMassStatusRequest).
    MassStatus {
        req_id: Box<str>,
        instrument: Option<InstrumentId>,
    },
}

/// Why a session's request was refused before it reached the router's routing: its
/// throttle's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttled {
    /// When the session may send again.
    pub retry_ms: u32,
    /// The session's rate.
    pub msgs_per_s: u32,
}

impl Router {
    /// A router in front of `links`, one per core of [`GatewayConfig::core_plan`], in order.
    pub fn new(config: &GatewayConfig, links: Vec<Box<dyn CoreLink>>) -> Router {
        let plan = config.core_plan();
        assert_eq!(
            plan.len(),
            links.len(),
            "one link per core of the configuration"
        );
        let core_of: HashMap<InstrumentId, usize> = plan
            .iter()
            .enumerate()
            .flat_map(|(c, e)| e.instruments.iter().map(move |&i| (i, c)))
            .collect();
        let limits: &Limits = &config.gateway;
        let mut sessions = Vec::new();
        let mut drop_copies: HashMap<FirmId, Vec<SessionRef>> = HashMap::new();
        for (i, s) in config.fix_sessions.iter().enumerate() {
            let sref = SessionRef(sessions.len() as u32);
            if s.drop_copy {
                drop_copies.entry(s.firm).or_default().push(sref);
            }
            sessions.push(SessionMeta {
                name: format!("FIX {}", s.client_comp_id),
                proto: Proto::Fix(i),
                firm: s.firm,
                accounts: s.accounts.clone(),
                drop_copy: s.drop_copy,
                throttle: Throttle::new(
                    s.throttle_msgs_per_s.unwrap_or(limits.throttle_msgs_per_s),
                ),
                next_seq: 0,
                live: HashMap::new(),
            });
        }
        for (i, s) in config.binary_sessions.iter().enumerate() {
            sessions.push(SessionMeta {
                name: format!("binary {}", s.credentials),
                proto: Proto::Binary(i),
                firm: s.firm,
                accounts: s.accounts.clone(),
                drop_copy: false,
                throttle: Throttle::new(
                    s.throttle_msgs_per_s.unwrap_or(limits.throttle_msgs_per_s),
                ),
                next_seq: 0,
                live: HashMap::new(),
            });
        }
        let instruments: Vec<InstrumentInfo> = config
            .instruments
            .iter()
            .map(|i| InstrumentInfo {
                id: i.instrument,
                symbol: i.symbol.clone(),
                price_scale: i.price_scale,
                lot_size: i.lot_size,
                core: core_of.get(&i.instrument).copied().unwrap_or(0),
            })
            .collect();
        let by_symbol = instruments
            .iter()
            .enumerate()
            .map(|(n, i)| (i.symbol.clone(), n))
            .collect();
        let by_id = instruments
            .iter()
            .enumerate()
            .map(|(n, i)| (i.id, n))
            .collect();
        Router {
            sessions,
            instruments,
            by_symbol,
            by_id,
            learned: Vec::new(),
            drop_copies,
            orders: HashMap::default(),
            finished: HashMap::default(),
            finished_by_client: HashMap::new(),
            finished_order: VecDeque::new(),
            finished_orders_kept: limits.finished_orders_kept.max(1),
            finished_text_bytes: 0,
            pending: HashMap::default(),
            mass: HashMap::new(),
            next_mass: 1,
            next_internal: 1,
            next_admin_seq: 0,
            in_flight: vec![0; links.len()],
            core_in_flight_max: limits.core_in_flight_max,
            links,
            orders_max: limits.orders_max,
            outbox: Vec::new(),
            admin_done: Vec::new(),
            admin_reject: HashMap::new(),
            admin_accounts_added: Vec::new(),
            requests_in: 0,
            counters: RouterCounters::default(),
            probes: RouterProbes::default(),
            probes_on: false,
        }
    }

    /// The links to the cores, in core order.
    pub fn links_mut(&mut self) -> &mut [Box<dyn CoreLink>] {
        &mut self.links
    }

    /// Handles one request of session `sref`: submits what it needs to the cores (or
    /// answers it at once); every answer comes as reports in the outbox
    /// ([`Router::take_outbox`]).
    pub fn handle(&mut self, sref: SessionRef, request: Request, ts_ns: u64) {
        match request {
            Request::New(req) => self.new_order(sref, req, ts_ns),
            Request::Cancel {
                client,
                orig,
                order_id,
            } => self.cancel(sref, client, orig, order_id, ts_ns),
            Request::Replace {
                client,
                orig,
                order_id,
                price,
                qty_lots,
            } => self.replace(sref, client, orig, order_id, price, qty_lots, ts_ns),
            Request::MassCancel {
                client,
                request_type,
                scope,
                account,
                instrument,
                side,
            } => {
                let filters = MassFilters {
                    account,
                    instrument,
                    side,
                };
                self.mass_cancel(sref, client, request_type, scope, filters, ts_ns)
            }
            Request::Status {
                client,
                order_id,
                symbol,
                side,
                status_req_id,
            } => self.order_status(sref, client, order_id, symbol, side, status_req_id, ts_ns),
            Request::MassStatus { req_id, instrument } => {
                self.mass_status(sref, req_id, instrument, ts_ns)
            }
        }
    }

    /// Counts a request a front end received (throttled or not) and, with probes on,
    /// begins its trace if it is of a sampled `kind` (none: a request that is not traced).
    pub fn note_request(&mut self, fix: bool, kind: Option<CommandKind>) {
        self.requests_in += 1;
        if fix {
            self.counters.fix_requests_in += 1;
        }
        if self.probes_on {
            match kind {
                Some(kind) => self.probes.begin(kind),
                None => self.probes.current = None,
            }
        }
    }

    /// Takes one message from session `sref`'s throttle: refused if the session is over
    /// its rate.
    pub fn throttle(&mut self, sref: SessionRef, now_ms: u64) -> Result<(), Throttled> {
        let meta = &mut self.sessions[sref.0 as usize];
        meta.throttle.take(now_ms).map_err(|retry_ms| Throttled {
            retry_ms,
            msgs_per_s: meta.throttle.msgs_per_s(),
        })
    }

    /// The session's configuration and state, if `sref` is one.
    pub fn session(&self, sref: SessionRef) -> Option<&SessionMeta> {
        self.sessions.get(sref.0 as usize)
    }

    /// Queues a report the router did not make itself (a front end's own reject) for the
    /// session, uncounted.
    pub fn report(&mut self, sref: SessionRef, report: Report) {
        self.outbox.push((sref, report));
    }

    /// Whether reports wait for delivery.
    pub fn has_reports(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The reports waiting for delivery, in order, each with its session; give the vector
    /// back with [`Router::recycle_outbox`] to reuse its allocation.
    pub fn take_outbox(&mut self) -> Vec<(SessionRef, Report)> {
        std::mem::take(&mut self.outbox)
    }

    /// Hands back an emptied outbox vector (kept if no report arrived meanwhile).
    pub fn recycle_outbox(&mut self, mut outbox: Vec<(SessionRef, Report)>) {
        if self.outbox.is_empty() {
            outbox.clear();
            self.outbox = outbox;
        }
    }

    /// Forgets the answers to earlier administrative commands.
    pub fn clear_admin_answers(&mut self) {
        self.admin_done.clear();
        self.admin_accounts_added.clear();
    }

    /// Administrative commands answered so far.
    pub fn admin_answered(&self) -> usize {
        self.admin_done.len()
    }

    /// Takes the answers to administrative commands: each key with the core's reject, if
    /// any, and the keys whose answer included an AccountAdded event.
    pub fn take_admin_answers(
        &mut self,
    ) -> (Vec<(RequestKey, Option<RejectReason>)>, Vec<RequestKey>) {
        (
            std::mem::take(&mut self.admin_done),
            std::mem::take(&mut self.admin_accounts_added),
        )
    }

    /// Application requests received from all sessions (throttled ones included).
    pub fn requests_in(&self) -> u64 {
        self.requests_in
    }

    pub fn counters(&self) -> &RouterCounters {
        &self.counters
    }

    /// Turns the probes on with the monitor's recorder.
    pub fn enable_probes(&mut self, recorder: StageRecorder) {
        self.probes.recorder = recorder;
        self.probes_on = true;
    }

    /// Whether probes are on (a monitor with sampling); off, no clock is read for them.
    pub fn probes_on(&self) -> bool {
        self.probes_on
    }

    pub fn probes_mut(&mut self) -> &mut RouterProbes {
        &mut self.probes
    }

    pub fn core_count(&self) -> usize {
        self.links.len()
    }

    /// Commands submitted to core `core` and not yet answered: the depth of its queue as the
    /// gateway sees it.
    pub fn core_in_flight(&self, core: usize) -> usize {
        self.in_flight.get(core).copied().unwrap_or(0)
    }

    fn core_of(&self, instrument: InstrumentId) -> usize {
        self.by_id
            .get(&instrument)
            .map_or(0, |&n| self.instruments[n].core)
    }

    pub fn instrument_by_symbol(&self, symbol: &[u8]) -> Option<&InstrumentInfo> {
        let symbol = std::str::from_utf8(symbol).ok()?;
        self.by_symbol.get(symbol).map(|&n| &self.instruments[n])
    }

    pub fn instrument(&self, id: InstrumentId) -> Option<&InstrumentInfo> {
        self.by_id.get(&id).map(|&n| &self.instruments[n])
    }

    /// Learns an instrument from its `InstrumentAdded` event on core `core`'s stream (an
    /// operator's addition at run time), so that both protocols route it from now on. An id
    /// already known (the configuration's, announced again by the bootstrap) is kept as it
    /// is; so is a symbol already taken by another id, which would otherwise make FIX orders
    /// ambiguous: that instrument stays reachable by id over binary only. Returns whether
    /// the instrument was new.
    pub fn learn_instrument(
        &mut self,
        core: usize,
        id: InstrumentId,
        definition: &InstrumentDef,
    ) -> bool {
        if self.by_id.contains_key(&id) {
            return false;
        }
        let n = self.instruments.len();
        let symbol = definition.symbol.as_str();
        if !self.by_symbol.contains_key(symbol) {
            self.by_symbol.insert(symbol.to_owned(), n);
        }
        self.by_id.insert(id, n);
        self.instruments.push(InstrumentInfo {
            id,
            symbol: symbol.to_owned(),
            price_scale: definition.price_scale,
            lot_size: definition.lot_size,
            core,
        });
        self.learned.push(SavedInstrument {
            core: core as u32,
            instrument: id,
            definition: *definition,
        });
        true
    }

    pub fn drop_copies_of(&self, firm: FirmId) -> &[SessionRef] {
        self.drop_copies.get(&firm).map_or(&[], Vec::as_slice)
    }

    /// Orders the gateway is tracking (live in the core, as far as it knows).
    pub fn tracked_orders(&self) -> usize {
        self.orders.len()
    }

    /// Requests submitted to the core and not yet answered.
    pub fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    /// Submits an administrative command (bootstrap) under session 0 to core `core`; its
    /// answer appears in [`Router::admin_done`].
    pub fn submit_admin(
        &mut self,
        core: usize,
        command: Command,
    ) -> Result<RequestKey, SubmitError> {
        let key = RequestKey {
            session: 0,
            seq: self.next_admin_seq + 1,
        };
        let link = self.links.get_mut(core).ok_or(SubmitError::Closed)?;
        link.submit(key, command)?;
        self.next_admin_seq += 1;
        self.in_flight[core] += 1;
        Ok(key)
    }

    fn next_key(&mut self, sref: SessionRef) -> RequestKey {
        let meta = &mut self.sessions[sref.0 as usize];
        meta.next_seq += 1;
        RequestKey {
            session: sref.key_session(),
            seq: meta.next_seq,
        }
    }

    /// The account a new order trades and the firm the core must find it in. A session that
    /// lists accounts trades those only (the first when the message names none); a session
    /// that lists none is entitled by firm: it trades any account of its firm, those added at
    /// run time included, which only the core can check (`NewOrder::firm`), and must name one.
    fn resolve_account(
        &self,
        sref: SessionRef,
        account: Option<AccountId>,
    ) -> Result<(AccountId, Option<FirmId>), GatewayReject> {
        let meta = &self.sessions[sref.0 as usize];
        if meta.accounts.is_empty() {
            return account
                .map(|a| (a, Some(meta.firm)))
                .ok_or(GatewayReject::AccountRequired);
        }
        match account {
            Some(a) if meta.accounts.contains(&a) => Ok((a, None)),
            Some(_) => Err(GatewayReject::NotAuthorized),
            None => Ok((meta.accounts[0], None)),
        }
    }

    fn submit(&mut self, core: usize, key: RequestKey, cmd: Command) -> Result<(), GatewayReject> {
        let Some(link) = self.links.get_mut(core) else {
            return Err(GatewayReject::CoreUnavailable);
        };
        // Admission: an overloaded core is refused here, before anything queues for it.
        if self.in_flight[core] >= self.core_in_flight_max {
            self.counters.busy_rejects += 1;
            return Err(GatewayReject::SystemBusy);
        }
        match link.submit(key, cmd) {
            Ok(()) => {
                self.in_flight[core] += 1;
                if let Some(mut trace) = self.probes.current.take() {
                    if self.probes.in_flight.len() < TRACES_IN_FLIGHT_MAX {
                        trace.stamp(Stage::ToSequencer);
                        self.probes.in_flight.insert(key, trace);
                    }
                }
                Ok(())
            }
            Err(SubmitError::Full) => {
                self.counters.busy_rejects += 1;
                Err(GatewayReject::SystemBusy)
            }
            Err(SubmitError::Closed) => Err(GatewayReject::CoreUnavailable),
            Err(SubmitError::NoQuorum) => {
                self.counters.no_quorum_rejects += 1;
                Err(GatewayReject::CoreNoQuorum)
            }
        }
    }

    /// A rejected new order, reported at once to the session.
    pub fn reject_new(
        &mut self,
        sref: SessionRef,
        req: &NewOrderRequest,
        cause: RejectCause,
        ts_ns: u64,
    ) {
        self.reject_new_echoing(sref, req, cause, ts_ns, None);
    }

    /// Rejects a new order, its report echoing `echo`, the request's fields as received.
    pub fn reject_new_echoing(
        &mut self,
        sref: SessionRef,
        req: &NewOrderRequest,
        cause: RejectCause,
        ts_ns: u64,
        echo: Option<Box<Echo>>,
    ) {
        if let RejectCause::Gateway(g) = cause {
            if g != GatewayReject::SystemBusy {
                self.counters.gateway_rejects += 1;
            }
        }
        let report = ExecReport {
            kind: ExecKind::Rejected(cause),
            order_id: None,
            client: req.client.clone(),
            account: req.account.unwrap_or_default(),
            instrument: req.instrument,
            side: req.side,
            ord_type: req.ord_type,
            tif: req.tif,
            price: req.price,
            qty_lots: req.qty_lots,
            cum_lots: 0,
            leaves_lots: 0,
            notional: 0,
            ts_ns,
            echo,
        };
        self.outbox.push((sref, Report::Exec(report)));
    }

    fn new_order(&mut self, sref: SessionRef, mut req: NewOrderRequest, ts_ns: u64) {
        self.counters.new_orders += 1;
        let meta = &self.sessions[sref.0 as usize];
        if meta.drop_copy {
            return self.reject_new(
                sref,
                &req,
                RejectCause::Gateway(GatewayReject::NotAuthorized),
                ts_ns,
            );
        }
        let (account, firm) = match self.resolve_account(sref, req.account) {
            Ok(entitled) => entitled,
            Err(why) => return self.reject_new(sref, &req, RejectCause::Gateway(why), ts_ns),
        };
        req.account = Some(account);
        if meta.live.contains_key(&req.client) {
            return self.reject_new(
                sref,
                &req,
                RejectCause::Gateway(GatewayReject::DuplicateClOrdId),
                ts_ns,
            );
        }
        if self.orders.len() + self.pending.len() >= self.orders_max {
            self.counters.busy_rejects += 1;
            return self.reject_new(
                sref,
                &req,
                RejectCause::Gateway(GatewayReject::SystemBusy),
                ts_ns,
            );
        }
        let internal = ClOrdId(self.next_internal);
        let cmd = Command::new(
            ts_ns,
            CommandBody::NewOrder(NewOrder {
                firm,
                account,
                cl_ord_id: internal,
                instrument: req.instrument,
                side: req.side,
                ord_type: req.ord_type,
                price: req.price,
                qty: Qty(req.qty_lots),
                tif: req.tif,
                expire_ts_ns: req.expire_ts_ns,
                display_qty: Qty(req.display_lots),
            }),
        );
        let key = self.next_key(sref);
        let core = self.core_of(req.instrument);
        if let Err(g) = self.submit(core, key, cmd) {
            return self.reject_new(sref, &req, RejectCause::Gateway(g), ts_ns);
        }
        self.next_internal += 1;
        self.sessions[sref.0 as usize].live.insert(
            req.client.clone(),
            LiveRef {
                internal,
                account,
                order_id: None,
                core,
                instrument: req.instrument,
                side: req.side,
            },
        );
        self.pending.insert(
            key,
            Pending::New(OrderState {
                owner: sref,
                client: req.client,
                account,
                instrument: req.instrument,
                side: req.side,
                ord_type: req.ord_type,
                tif: req.tif,
                price: req.price,
                qty_lots: req.qty_lots,
                cum_lots: 0,
                notional: 0,
            }),
        );
    }

    fn cancel_reject_now(
        &mut self,
        sref: SessionRef,
        client: ClientId,
        orig: ClientId,
        to: CancelRejectTo,
        cause: RejectCause,
        ts_ns: u64,
    ) {
        if let RejectCause::Gateway(g) = cause {
            if g != GatewayReject::SystemBusy {
                self.counters.gateway_rejects += 1;
            }
        }
        self.outbox.push((
            sref,
            Report::CancelReject {
                client,
                orig,
                order_id: None,
                to,
                cause,
                ts_ns,
            },
        ));
    }

    /// Finds a live order of the session by its client id or, failing that, by exchange id.
    /// The core's cancel of a live order by its internal client id, under the next internal
    /// id (the caller advances `next_internal` once the core took it).
    fn internal_cancel(&self, live: &LiveRef, ts_ns: u64) -> Command {
        Command::new(
            ts_ns,
            CommandBody::Cancel(Cancel {
                account: live.account,
                cl_ord_id: ClOrdId(self.next_internal),
                target: OrderRef {
                    order_id: None,
                    orig_cl_ord_id: Some(live.internal),
                },
            }),
        )
    }

    fn find_live(
        &self,
        sref: SessionRef,
        orig: &ClientId,
        order_id: Option<OrderId>,
    ) -> Option<(ClientId, LiveRef)> {
        let meta = &self.sessions[sref.0 as usize];
        if let Some(oid) = order_id {
            if let Some(o) = self.orders.get(&oid) {
                if o.owner == sref {
                    if let Some(l) = meta.live.get(&o.client) {
                        return Some((o.client.clone(), *l));
                    }
                }
            }
        }
        meta.live.get(orig).map(|l| (orig.clone(), *l))
    }

    fn cancel(
        &mut self,
        sref: SessionRef,
        client: ClientId,
        orig: ClientId,
        order_id: Option<OrderId>,
        ts_ns: u64,
    ) {
        self.counters.cancels += 1;
        let to = CancelRejectTo::Cancel;
        let Some((orig, live)) = self.find_live(sref, &orig, order_id) else {
            let cause = RejectCause::Gateway(GatewayReject::UnknownOrder);
            return self.cancel_reject_now(sref, client, orig, to, cause, ts_ns);
        };
        let cmd = self.internal_cancel(&live, ts_ns);
        let key = self.next_key(sref);
        if let Err(g) = self.submit(live.core, key, cmd) {
            return self.cancel_reject_now(sref, client, orig, to, RejectCause::Gateway(g), ts_ns);
        }
        self.next_internal += 1;
        self.pending.insert(
            key,
            Pending::Cancel {
                owner: sref,
                client,
                orig,
            },
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn replace(
        &mut self,
        sref: SessionRef,
        client: ClientId,
        orig: ClientId,
        order_id: Option<OrderId>,
        price: Option<Price>,
        qty_lots: Option<i64>,
        ts_ns: u64,
    ) {
        self.counters.replaces += 1;
        let to = CancelRejectTo::Replace;
        let Some((orig, live)) = self.find_live(sref, &orig, order_id) else {
            let cause = RejectCause::Gateway(GatewayReject::UnknownOrder);
            return self.cancel_reject_now(sref, client, orig, to, cause, ts_ns);
        };
        if self.sessions[sref.0 as usize].live.contains_key(&client) {
            let cause = RejectCause::Gateway(GatewayReject::DuplicateClOrdId);
            return self.cancel_reject_now(sref, client, orig, to, cause, ts_ns);
        }
        let internal = ClOrdId(self.next_internal);
        let cmd = Command::new(
            ts_ns,
            CommandBody::Replace(Replace {
                account: live.account,
                cl_ord_id: internal,
                target: OrderRef {
                    order_id: None,
                    orig_cl_ord_id: Some(live.internal),
                },
                price,
                qty: qty_lots.map(Qty),
            }),
        );
        let key = self.next_key(sref);
        if let Err(g) = self.submit(live.core, key, cmd) {
            return self.cancel_reject_now(sref, client, orig, to, RejectCause::Gateway(g), ts_ns);
        }
        self.next_internal += 1;
        self.sessions[sref.0 as usize]
            .live
            .insert(client.clone(), LiveRef { internal, ..live });
        self.pending.insert(
            key,
            Pending::Replace {
                owner: sref,
                client,
                orig,
            },
        );
    }

    /// Cancels the orders of `scope` matching the filters, answered by one report whose
    /// TotalAffectedOrders counts what was cancelled. Session scope: one cancel per live
    /// order of the session (the core knows no sessions), so the count is exactly the
    /// execution reports the session receives. Account and firm scope: one core MassCancel
    /// per account (or for the firm) and core; orders of other sessions are reported to
    /// their owners, and the count covers them too.
    fn mass_cancel(
        &mut self,
        sref: SessionRef,
        client: ClientId,
        request_type: u8,
        scope: MassCancelScope,
        filters: MassFilters,
        ts_ns: u64,
    ) {
        self.counters.mass_cancels += 1;
        let meta = &self.sessions[sref.0 as usize];
        // A session entitled by firm may name any account: the core's mass cancel is then
        // limited to the session's firm too, so another firm's account matches nothing.
        let allowed = !meta.drop_copy
            && filters
                .account
                .is_none_or(|a| meta.accounts.is_empty() || meta.accounts.contains(&a));
        let firm = meta.firm;
        let report_now = |router: &mut Router, reject: Option<RejectCause>| {
            router.outbox.push((
                sref,
                Report::MassCancel {
                    client: client.clone(),
                    request_type,
                    total: 0,
                    reject,
                    ts_ns,
                },
            ));
        };
        if !allowed {
            self.counters.gateway_rejects += 1;
            return report_now(
                self,
                Some(RejectCause::Gateway(GatewayReject::NotAuthorized)),
            );
        }
        let agg = self.next_mass;
        let (submitted, stopped) = match scope {
            MassCancelScope::Session => self.mass_cancel_own(sref, agg, &filters, ts_ns),
            MassCancelScope::Account | MassCancelScope::Firm => {
                let parties: Vec<(Option<AccountId>, Option<FirmId>)> =
                    match (scope, filters.account) {
                        (MassCancelScope::Account, Some(a)) => {
                            let meta = &self.sessions[sref.0 as usize];
                            vec![(Some(a), meta.accounts.is_empty().then_some(firm))]
                        }
                        (MassCancelScope::Account, None) => {
                            meta_accounts(&self.sessions[sref.0 as usize])
                        }
                        _ => vec![(filters.account, Some(firm))],
                    };
                self.mass_cancel_parties(sref, agg, &parties, &filters, ts_ns)
            }
        };
        if submitted == 0 {
            // Nothing matched (a report of 0), or the first part was refused: its reason (a
            // full queue, a core without a quorum) is the request's.
            return report_now(self, stopped.map(RejectCause::Gateway));
        }
        self.next_mass += 1;
        self.mass.insert(
            agg,
            MassAgg {
                owner: sref,
                client,
                request_type,
                remaining: submitted,
                total: 0,
                reject: None,
            },
        );
    }

    /// Session scope: a cancel for each live order of the session that matches. Returns the
    /// parts submitted and why the gateway stopped submitting, if it did.
    fn mass_cancel_own(
        &mut self,
        sref: SessionRef,
        agg: u64,
        filters: &MassFilters,
        ts_ns: u64,
    ) -> (u32, Option<GatewayReject>) {
        let mut targets: Vec<LiveRef> = self.sessions[sref.0 as usize]
            .live
            .values()
            .filter(|l| filters.matches(l))
            .copied()
            .collect();
        // In entry order, whatever the map's order, so cores see the same sequence each run.
        targets.sort_unstable_by_key(|l| l.internal.0);
        let mut submitted = 0u32;
        for live in targets {
            let cmd = self.internal_cancel(&live, ts_ns);
            let key = self.next_key(sref);
            if let Err(why) = self.submit(live.core, key, cmd) {
                return (submitted, Some(why));
            }
            self.next_internal += 1;
            self.pending.insert(
                key,
                Pending::MassCancel {
                    owner: sref,
                    agg,
                    one_order: true,
                },
            );
            submitted += 1;
        }
        (submitted, None)
    }

    /// Account or firm scope: a core MassCancel per party and core (the instrument's core,
    /// or every core without an instrument).
    fn mass_cancel_parties(
        &mut self,
        sref: SessionRef,
        agg: u64,
        parties: &[(Option<AccountId>, Option<FirmId>)],
        filters: &MassFilters,
        ts_ns: u64,
    ) -> (u32, Option<GatewayReject>) {
        let cores: Vec<usize> = match filters.instrument {
            Some(i) => vec![self.core_of(i)],
            None => (0..self.links.len()).collect(),
        };
        let mut submitted = 0u32;
        for &(account, firm) in parties {
            for &core in &cores {
                let cmd = Command::new(
                    ts_ns,
                    CommandBody::MassCancel(MassCancel {
                        cl_ord_id: ClOrdId(self.next_internal),
                        account,
                        firm,
                        instrument: filters.instrument,
                        side: filters.side,
                    }),
                );
                let key = self.next_key(sref);
                if let Err(why) = self.submit(core, key, cmd) {
                    return (submitted, Some(why));
                }
                self.next_internal += 1;
                self.pending.insert(
                    key,
                    Pending::MassCancel {
                        owner: sref,
                        agg,
                        one_order: false,
                    },
                );
                submitted += 1;
            }
        }
        (submitted, None)
    }

    pub fn business_reject(&mut self, sref: SessionRef, report: Report) {
        if let Report::BusinessReject {
            throttled_retry_ms, ..
        } = &report
        {
            if throttled_retry_ms.is_some() {
                match self.sessions.get(sref.0 as usize).map(|m| m.proto) {
                    Some(Proto::Binary(_)) => self.counters.binary_throttle_rejects += 1,
                    _ => self.counters.fix_throttle_rejects += 1,
                }
            } else {
                self.counters.gateway_rejects += 1;
            }
        }
        self.outbox.push((sref, report));
    }

    /// Drains what the cores have ready (at most `outputs_max` in all, taken from each core
    /// in turn so that a busy core cannot starve another), turning it into reports in
    /// `self.outbox`. Returns how many outputs were handled.
    pub fn poll_core(&mut self, outputs_max: usize) -> usize {
        let mut n = 0;
        if self.probes_on && !self.probes.in_flight.is_empty() {
            self.probes.now_ns = bourse_monitor::clock::now_ns();
        }
        let cores = self.links.len();
        // A share per core per round; rounds repeat while some core had output.
        let share = (outputs_max / cores.max(1)).max(1);
        loop {
            let mut progressed = false;
            for core in 0..cores {
                let mut taken = 0;
                while taken < share && n < outputs_max {
                    let Some(out) = self.links[core].try_recv() else {
                        break;
                    };
                    taken += 1;
                    n += 1;
                    match out {
                        CoreOutput::Done { key } => {
                            self.in_flight[core] = self.in_flight[core].saturating_sub(1);
                            self.on_done(key);
                        }
                        CoreOutput::Event { key, event } => {
                            // Whoever added it (an operator, another gateway, this one's
                            // bootstrap), an instrument is routable from its event on.
                            if let Event::InstrumentAdded {
                                instrument,
                                definition,
                                ..
                            } = event
                            {
                                self.learn_instrument(core, instrument, &definition);
                            }
                            self.on_event(key, event)
                        }
                    }
                }
                progressed |= taken > 0;
            }
            if !progressed || n >= outputs_max {
                break;
            }
        }
        n
    }

    fn on_done(&mut self, key: RequestKey) {
        if key.session == 0 {
            let reject = self.admin_reject.remove(&key);
            self.admin_done.push((key, reject));
            return;
        }
        if !self.probes.in_flight.is_empty() {
            if let Some(mut trace) = self.probes.in_flight.remove(&key) {
                // A request whose answer produced no report (none does today) still gives
                // its legs up to the core.
                trace.stamp_at(Stage::Processed, self.probes.now_ns);
                self.probes.recorder.record(&trace);
            }
        }
        self.pending.remove(&key);
    }

    /// Pushes a report; if it is the first answer to a sampled request, the trace follows it.
    fn push_report(&mut self, key: RequestKey, sref: SessionRef, report: Report) {
        if !self.probes.in_flight.is_empty() {
            if let Some(mut trace) = self.probes.in_flight.remove(&key) {
                trace.stamp_at(Stage::Processed, self.probes.now_ns);
                self.probes.answered.push((self.outbox.len(), trace));
            }
        }
        self.outbox.push((sref, report));
    }

    fn report_of(
        o: &OrderState,
        order_id: OrderId,
        kind: ExecKind,
        leaves: i64,
        ts_ns: u64,
    ) -> ExecReport {
        ExecReport {
            kind,
            order_id: Some(order_id),
            client: o.client.clone(),
            account: o.account,
            instrument: o.instrument,
            side: o.side,
            ord_type: o.ord_type,
            tif: o.tif,
            price: o.price,
            qty_lots: o.qty_lots,
            cum_lots: o.cum_lots,
            leaves_lots: leaves,
            notional: o.notional,
            ts_ns,
            echo: None,
        }
    }

    fn forget_live(&mut self, owner: SessionRef, client: &ClientId) {
        if let Some(meta) = self.sessions.get_mut(owner.0 as usize) {
            meta.live.remove(client);
        }
    }

    fn on_event(&mut self, key: RequestKey, event: Event) {
        if key.session == 0 {
            match event {
                Event::CommandRejected { reason, .. } | Event::OrderRejected { reason, .. } => {
                    self.admin_reject.insert(key, reason);
                }
                Event::AccountAdded { .. } => self.admin_accounts_added.push(key),
                _ => {}
            }
            return;
        }
        match event {
            Event::OrderAccepted {
                order_id,
                qty,
                ts_ns,
                ..
            } => {
                let Some(Pending::New(o)) = self.pending.get(&key) else {
                    return;
                };
                let o = o.clone();
                if let Some(meta) = self.sessions.get_mut(o.owner.0 as usize) {
                    if let Some(l) = meta.live.get_mut(&o.client) {
                        l.order_id = Some(order_id);
                    }
                }
                let report = Self::report_of(&o, order_id, ExecKind::New, qty.0, ts_ns);
                self.push_report(key, o.owner, Report::Exec(report));
                self.orders.insert(order_id, o);
            }
            Event::OrderRejected { reason, ts_ns, .. } => {
                let Some(Pending::New(o)) = self.pending.get(&key) else {
                    return;
                };
                let o = o.clone();
                self.counters.core_rejects += 1;
                self.forget_live(o.owner, &o.client);
                let mut report = Self::report_of(
                    &o,
                    OrderId(0),
                    ExecKind::Rejected(RejectCause::Core(reason)),
                    0,
                    ts_ns,
                );
                report.order_id = None;
                self.push_report(key, o.owner, Report::Exec(report));
            }
            Event::Trade {
                trade_id,
                price,
                qty,
                aggressor,
                buy,
                sell,
                ts_ns,
                ..
            } => {
                for (fill, side) in [(buy, Side::Buy), (sell, Side::Sell)] {
                    let Some(o) = self.orders.get_mut(&fill.order_id) else {
                        continue;
                    };
                    o.cum_lots = fill.qty_filled.0;
                    o.notional += i128::from(price.0) * i128::from(qty.0);
                    let kind = ExecKind::Trade {
                        trade_id,
                        last_px: price,
                        last_lots: qty.0,
                        aggressor: side == aggressor,
                    };
                    let report = Self::report_of(o, fill.order_id, kind, fill.qty_leaves.0, ts_ns);
                    let owner = o.owner;
                    self.push_report(key, owner, Report::Exec(report));
                    if fill.qty_leaves.0 == 0 {
                        if let Some(o) = self.orders.remove(&fill.order_id) {
                            self.forget_live(o.owner, &o.client);
                            self.remember_finished(fill.order_id, o, Finished::Filled);
                        }
                    }
                }
            }
            Event::OrderCancelled {
                order_id,
                qty_cancelled,
                reason,
                ts_ns,
                ..
            } => {
                let Some(o) = self.orders.remove(&order_id) else {
                    return;
                };
                self.forget_live(o.owner, &o.client);
                let by = match self.pending.get(&key) {
                    Some(Pending::Cancel { owner, client, .. }) if *owner == o.owner => {
                        Some(client.clone())
                    }
                    Some(Pending::MassCancel { owner, agg, .. }) if *owner == o.owner => {
                        self.mass.get(agg).map(|m| m.client.clone())
                    }
                    _ => None,
                };
                // A session-scope mass cancel reaches the core as one cancel per order; its
                // reports still say the order went in a mass cancel, as an account-wide one's do.
                let one_order_part = self.is_one_order_part(key);
                let reason = if one_order_part && reason == CancelReason::Requested {
                    CancelReason::MassCancel
                } else {
                    reason
                };
                let kind = ExecKind::Canceled {
                    by,
                    reason,
                    qty_lots: qty_cancelled.0,
                };
                let report = Self::report_of(&o, order_id, kind, 0, ts_ns);
                self.push_report(key, o.owner, Report::Exec(report));
                self.remember_finished(order_id, o, Finished::Canceled);
                if one_order_part {
                    self.mass_part_done(key, 1, None, ts_ns);
                }
            }
            Event::OrderReplaced {
                order_id,
                price,
                qty_total,
                qty_leaves,
                ts_ns,
                ..
            } => {
                let Some(Pending::Replace { client, orig, .. }) = self.pending.get(&key).cloned()
                else {
                    return;
                };
                let Some(o) = self.orders.get_mut(&order_id) else {
                    return;
                };
                o.client = client.clone();
                o.price = price;
                o.qty_lots = qty_total.0;
                let owner = o.owner;
                let report = Self::report_of(
                    o,
                    order_id,
                    ExecKind::Replaced { orig: orig.clone() },
                    qty_leaves.0,
                    ts_ns,
                );
                if let Some(meta) = self.sessions.get_mut(owner.0 as usize) {
                    meta.live.remove(&orig);
                    if let Some(l) = meta.live.get_mut(&client) {
                        l.order_id = Some(order_id);
                    }
                }
                self.push_report(key, owner, Report::Exec(report));
            }
            Event::OrderExpired {
                order_id, ts_ns, ..
            } => {
                let Some(o) = self.orders.remove(&order_id) else {
                    return;
                };
                self.forget_live(o.owner, &o.client);
                let report = Self::report_of(&o, order_id, ExecKind::Expired, 0, ts_ns);
                self.push_report(key, o.owner, Report::Exec(report));
                self.remember_finished(order_id, o, Finished::Expired);
            }
            Event::CancelRejected {
                order_id,
                reason,
                ts_ns,
                ..
            } => {
                // One order of a session-scope mass cancel that ended before its cancel came:
                // nothing to cancel, nothing counted.
                if self.is_one_order_part(key) {
                    return self.mass_part_done(key, 0, None, ts_ns);
                }
                let (owner, client, orig, to) = match self.pending.get(&key).cloned() {
                    Some(Pending::Cancel {
                        owner,
                        client,
                        orig,
                    }) => (owner, client, orig, CancelRejectTo::Cancel),
                    Some(Pending::Replace {
                        owner,
                        client,
                        orig,
                    }) => {
                        self.forget_live(owner, &client);
                        (owner, client, orig, CancelRejectTo::Replace)
                    }
                    _ => return,
                };
                self.counters.core_rejects += 1;
                self.push_report(
                    key,
                    owner,
                    Report::CancelReject {
                        client,
                        orig,
                        order_id,
                        to,
                        cause: RejectCause::Core(reason),
                        ts_ns,
                    },
                );
            }
            Event::MassCancelDone {
                orders_cancelled,
                ts_ns,
                ..
            } => {
                self.mass_part_done(key, orders_cancelled, None, ts_ns);
            }
            Event::CommandRejected { reason, ts_ns } => {
                let reject = (!self.is_one_order_part(key)).then_some(reason);
                self.mass_part_done(key, 0, reject, ts_ns);
            }
            _ => {}
        }
    }

    fn is_one_order_part(&self, key: RequestKey) -> bool {
        matches!(
            self.pending.get(&key),
            Some(Pending::MassCancel {
                one_order: true,
                ..
            })
        )
    }

    fn mass_part_done(
        &mut self,
        key: RequestKey,
        cancelled: u64,
        reject: Option<RejectReason>,
        ts_ns: u64,
    ) {
        let Some(Pending::MassCancel { agg, .. }) = self.pending.get(&key) else {
            return;
        };
        let agg_id = *agg;
        let Some(agg) = self.mass.get_mut(&agg_id) else {
            return;
        };
        agg.total += cancelled;
        if reject.is_some() {
            agg.reject = reject;
        }
        agg.remaining = agg.remaining.saturating_sub(1);
        if agg.remaining == 0 {
            if let Some(agg) = self.mass.remove(&agg_id) {
                // A partial failure of one account among several still reports what was done;
                // only a request that cancelled nothing and failed is a reject.
                let reject = match agg.reject {
                    Some(r) if agg.total == 0 => Some(RejectCause::Core(r)),
                    _ => None,
                };
                if reject.is_some() {
                    self.counters.core_rejects += 1;
                }
                self.push_report(
                    key,
                    agg.owner,
                    Report::MassCancel {
                        client: agg.client,
                        request_type: agg.request_type,
                        total: agg.total,
                        reject,
                        ts_ns,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
