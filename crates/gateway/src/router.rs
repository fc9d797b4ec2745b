//! Protocol-neutral order routing: sessions' requests become core commands, core outputs
//! become [`Report`]s addressed to sessions. The FIX and binary front ends only parse and
//! render; everything about order identity, ownership and fills lives here.
//!
//! Client order ids are the sessions' own (FIX text, binary numbers). The core sees gateway
//! numbers ([`ClOrdId`]) unique across all sessions, so two sessions trading one account can
//! never collide; the live mapping is kept per session and dropped when the order ends.

use crate::config::{GatewayConfig, Limits};
use crate::core_link::{CoreLink, CoreOutput, RequestKey, SubmitError};
use crate::throttle::Throttle;
use bourse_core::*;
use std::collections::HashMap;

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

/// Index of a session in [`Router::sessions`] (FIX and binary alike).
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
    },
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

/// Why the gateway itself refused a request before it reached the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatewayReject {
    NotAuthorized,
    UnknownSymbol,
    InvalidPrice,
    InvalidQty,
    InvalidField,
    UnsupportedValue,
    DuplicateClOrdId,
    UnknownOrder,
    /// The queue to the core is full, or the gateway's order table is.
    SystemBusy,
    CoreUnavailable,
}

impl GatewayReject {
    pub fn text(self) -> &'static str {
        match self {
            GatewayReject::NotAuthorized => "not authorized for this account or session",
            GatewayReject::UnknownSymbol => "unknown symbol",
            GatewayReject::InvalidPrice => "invalid price for the instrument's scale and type",
            GatewayReject::InvalidQty => "quantity must be a positive multiple of the lot size",
            GatewayReject::InvalidField => "invalid field value",
            GatewayReject::UnsupportedValue => "unsupported value",
            GatewayReject::DuplicateClOrdId => "duplicate ClOrdID among the session's live orders",
            GatewayReject::UnknownOrder => "unknown order",
            GatewayReject::SystemBusy => "system busy, retry",
            GatewayReject::CoreUnavailable => "trading core unavailable",
        }
    }
}

/// Why a request was refused: by the core (a specific [`RejectReason`]) or by the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectCause {
    Core(RejectReason),
    Gateway(GatewayReject),
}

impl RejectCause {
    pub fn text(self) -> String {
        match self {
            RejectCause::Core(r) => format!("{r:?}"),
            RejectCause::Gateway(g) => g.text().to_string(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecKind {
    New,
    Trade {
        trade_id: TradeId,
        last_px: Price,
        last_lots: i64,
        aggressor: bool,
    },
    Canceled {
        /// The id of the request that cancelled it (cancel or mass cancel), if one did.
        by: Option<ClientId>,
        reason: CancelReason,
        qty_lots: i64,
    },
    Replaced {
        orig: ClientId,
    },
    Expired,
    Rejected(RejectCause),
}

/// One execution report, with the order's state after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecReport {
    pub kind: ExecKind,
    pub order_id: Option<OrderId>,
    pub client: ClientId,
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub side: Side,
    pub ord_type: OrdType,
    pub tif: TimeInForce,
    pub price: Price,
    pub qty_lots: i64,
    pub cum_lots: i64,
    pub leaves_lots: i64,
    pub notional: i128,
    pub ts_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    Exec(ExecReport),
    CancelReject {
        client: ClientId,
        orig: ClientId,
        order_id: Option<OrderId>,
        to: CancelRejectTo,
        cause: RejectCause,
        ts_ns: u64,
    },
    MassCancel {
        client: ClientId,
        request_type: u8,
        total: u64,
        reject: Option<RejectCause>,
        ts_ns: u64,
    },
    /// The request was not processed at all (throttle, unsupported, busy).
    BusinessReject {
        ref_msg_type: String,
        ref_seq_num: u64,
        ref_id: Option<ClientId>,
        /// Binary template id of the refused request.
        ref_template_id: u16,
        throttled_retry_ms: Option<u32>,
        text: String,
        ts_ns: u64,
    },
}

/// An instrument as the gateway needs it: to read and write prices and quantities.
#[derive(Clone, Debug)]
pub struct InstrumentInfo {
    pub id: InstrumentId,
    pub symbol: String,
    pub price_scale: u8,
    pub lot_size: i64,
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

pub struct Router {
    pub sessions: Vec<SessionMeta>,
    pub instruments: Vec<InstrumentInfo>,
    by_symbol: HashMap<String, usize>,
    by_id: HashMap<InstrumentId, usize>,
    drop_copies: HashMap<FirmId, Vec<SessionRef>>,
    orders: HashMap<OrderId, OrderState>,
    pending: HashMap<RequestKey, Pending>,
    mass: HashMap<u64, MassAgg>,
    next_mass: u64,
    next_internal: u64,
    next_admin_seq: u64,
    link: Box<dyn CoreLink>,
    orders_max: usize,
    /// Reports waiting for delivery by the front ends.
    pub outbox: Vec<(SessionRef, Report)>,
    /// Commands the core refused during bootstrap (admin session), for the operator.
    pub admin_rejects: Vec<RejectReason>,
    /// Application requests received from all sessions (throttled ones included).
    pub requests_in: u64,
}

impl Router {
    pub fn new(config: &GatewayConfig, link: Box<dyn CoreLink>) -> Router {
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
            drop_copies,
            orders: HashMap::new(),
            pending: HashMap::new(),
            mass: HashMap::new(),
            next_mass: 1,
            next_internal: 1,
            next_admin_seq: 0,
            link,
            orders_max: limits.orders_max,
            outbox: Vec::new(),
            admin_rejects: Vec::new(),
            requests_in: 0,
        }
    }

    pub fn link_mut(&mut self) -> &mut dyn CoreLink {
        self.link.as_mut()
    }

    pub fn instrument_by_symbol(&self, symbol: &[u8]) -> Option<&InstrumentInfo> {
        let symbol = std::str::from_utf8(symbol).ok()?;
        self.by_symbol.get(symbol).map(|&n| &self.instruments[n])
    }

    pub fn instrument(&self, id: InstrumentId) -> Option<&InstrumentInfo> {
        self.by_id.get(&id).map(|&n| &self.instruments[n])
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

    /// Submits an administrative command (bootstrap) under session 0.
    pub fn submit_admin(&mut self, command: Command) -> Result<(), SubmitError> {
        self.next_admin_seq += 1;
        let key = RequestKey {
            session: 0,
            seq: self.next_admin_seq,
        };
        self.link.submit(key, command)
    }

    fn next_key(&mut self, sref: SessionRef) -> RequestKey {
        let meta = &mut self.sessions[sref.0 as usize];
        meta.next_seq += 1;
        RequestKey {
            session: sref.key_session(),
            seq: meta.next_seq,
        }
    }

    fn resolve_account(&self, sref: SessionRef, account: Option<AccountId>) -> Option<AccountId> {
        let meta = &self.sessions[sref.0 as usize];
        match account {
            Some(a) => meta.accounts.contains(&a).then_some(a),
            None => meta.accounts.first().copied(),
        }
    }

    fn submit(&mut self, key: RequestKey, cmd: Command) -> Result<(), GatewayReject> {
        match self.link.submit(key, cmd) {
            Ok(()) => Ok(()),
            Err(SubmitError::Full) => Err(GatewayReject::SystemBusy),
            Err(SubmitError::Closed) => Err(GatewayReject::CoreUnavailable),
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
        };
        self.outbox.push((sref, Report::Exec(report)));
    }

    pub fn new_order(&mut self, sref: SessionRef, mut req: NewOrderRequest, ts_ns: u64) {
        let meta = &self.sessions[sref.0 as usize];
        if meta.drop_copy {
            return self.reject_new(
                sref,
                &req,
                RejectCause::Gateway(GatewayReject::NotAuthorized),
                ts_ns,
            );
        }
        let Some(account) = self.resolve_account(sref, req.account) else {
            return self.reject_new(
                sref,
                &req,
                RejectCause::Gateway(GatewayReject::NotAuthorized),
                ts_ns,
            );
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
        if let Err(g) = self.submit(key, cmd) {
            return self.reject_new(sref, &req, RejectCause::Gateway(g), ts_ns);
        }
        self.next_internal += 1;
        self.sessions[sref.0 as usize].live.insert(
            req.client.clone(),
            LiveRef {
                internal,
                account,
                order_id: None,
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

    pub fn cancel(
        &mut self,
        sref: SessionRef,
        client: ClientId,
        orig: ClientId,
        order_id: Option<OrderId>,
        ts_ns: u64,
    ) {
        let to = CancelRejectTo::Cancel;
        let Some((orig, live)) = self.find_live(sref, &orig, order_id) else {
            let cause = RejectCause::Gateway(GatewayReject::UnknownOrder);
            return self.cancel_reject_now(sref, client, orig, to, cause, ts_ns);
        };
        let cmd = Command::new(
            ts_ns,
            CommandBody::Cancel(Cancel {
                account: live.account,
                cl_ord_id: ClOrdId(self.next_internal),
                target: OrderRef {
                    order_id: None,
                    orig_cl_ord_id: Some(live.internal),
                },
            }),
        );
        let key = self.next_key(sref);
        if let Err(g) = self.submit(key, cmd) {
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
    pub fn replace(
        &mut self,
        sref: SessionRef,
        client: ClientId,
        orig: ClientId,
        order_id: Option<OrderId>,
        price: Option<Price>,
        qty_lots: Option<i64>,
        ts_ns: u64,
    ) {
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
        if let Err(g) = self.submit(key, cmd) {
            return self.cancel_reject_now(sref, client, orig, to, RejectCause::Gateway(g), ts_ns);
        }
        self.next_internal += 1;
        self.sessions[sref.0 as usize].live.insert(
            client.clone(),
            LiveRef {
                internal,
                account: live.account,
                order_id: live.order_id,
            },
        );
        self.pending.insert(
            key,
            Pending::Replace {
                owner: sref,
                client,
                orig,
            },
        );
    }

    /// Cancels the session's orders matching the filters: one core command per account.
    #[allow(clippy::too_many_arguments)]
    pub fn mass_cancel(
        &mut self,
        sref: SessionRef,
        client: ClientId,
        request_type: u8,
        account: Option<AccountId>,
        instrument: Option<InstrumentId>,
        side: Option<Side>,
        ts_ns: u64,
    ) {
        let meta = &self.sessions[sref.0 as usize];
        let accounts: Vec<AccountId> = match account {
            Some(a) if meta.accounts.contains(&a) => vec![a],
            Some(_) => Vec::new(),
            None => meta.accounts.clone(),
        };
        let report_now = |router: &mut Router, cause: RejectCause| {
            router.outbox.push((
                sref,
                Report::MassCancel {
                    client: client.clone(),
                    request_type,
                    total: 0,
                    reject: Some(cause),
                    ts_ns,
                },
            ));
        };
        if accounts.is_empty() || meta.drop_copy {
            return report_now(self, RejectCause::Gateway(GatewayReject::NotAuthorized));
        }
        let agg = self.next_mass;
        self.next_mass += 1;
        let mut submitted = 0u32;
        for account in accounts {
            let cmd = Command::new(
                ts_ns,
                CommandBody::MassCancel(MassCancel {
                    cl_ord_id: ClOrdId(self.next_internal),
                    account: Some(account),
                    firm: None,
                    instrument,
                    side,
                }),
            );
            let key = self.next_key(sref);
            if self.submit(key, cmd).is_err() {
                break;
            }
            self.next_internal += 1;
            self.pending
                .insert(key, Pending::MassCancel { owner: sref, agg });
            submitted += 1;
        }
        if submitted == 0 {
            return report_now(self, RejectCause::Gateway(GatewayReject::SystemBusy));
        }
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

    pub fn business_reject(&mut self, sref: SessionRef, report: Report) {
        self.outbox.push((sref, report));
    }

    /// Drains what the core has ready (at most `outputs_max`), turning it into reports in
    /// `self.outbox`. Returns how many outputs were handled.
    pub fn poll_core(&mut self, outputs_max: usize) -> usize {
        let mut n = 0;
        while n < outputs_max {
            let Some(out) = self.link.try_recv() else {
                break;
            };
            n += 1;
            match out {
                CoreOutput::Done { key } => {
                    self.pending.remove(&key);
                }
                CoreOutput::Event { key, event } => self.on_event(key, event),
            }
        }
        n
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
        }
    }

    fn forget_live(&mut self, owner: SessionRef, client: &ClientId) {
        if let Some(meta) = self.sessions.get_mut(owner.0 as usize) {
            meta.live.remove(client);
        }
    }

    fn on_event(&mut self, key: RequestKey, event: Event) {
        if key.session == 0 {
            if let Event::CommandRejected { reason, .. } | Event::OrderRejected { reason, .. } =
                event
            {
                if self.admin_rejects.len() < 1024 {
                    self.admin_rejects.push(reason);
                }
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
                self.outbox.push((o.owner, Report::Exec(report)));
                self.orders.insert(order_id, o);
            }
            Event::OrderRejected { reason, ts_ns, .. } => {
                let Some(Pending::New(o)) = self.pending.get(&key) else {
                    return;
                };
                let o = o.clone();
                self.forget_live(o.owner, &o.client);
                let mut report = Self::report_of(
                    &o,
                    OrderId(0),
                    ExecKind::Rejected(RejectCause::Core(reason)),
                    0,
                    ts_ns,
                );
                report.order_id = None;
                self.outbox.push((o.owner, Report::Exec(report)));
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
                    self.outbox.push((owner, Report::Exec(report)));
                    if fill.qty_leaves.0 == 0 {
                        if let Some(o) = self.orders.remove(&fill.order_id) {
                            self.forget_live(o.owner, &o.client);
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
                    Some(Pending::MassCancel { owner, agg }) if *owner == o.owner => {
                        self.mass.get(agg).map(|m| m.client.clone())
                    }
                    _ => None,
                };
                let kind = ExecKind::Canceled {
                    by,
                    reason,
                    qty_lots: qty_cancelled.0,
                };
                let report = Self::report_of(&o, order_id, kind, 0, ts_ns);
                self.outbox.push((o.owner, Report::Exec(report)));
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
                self.outbox.push((owner, Report::Exec(report)));
            }
            Event::OrderExpired {
                order_id, ts_ns, ..
            } => {
                let Some(o) = self.orders.remove(&order_id) else {
                    return;
                };
                self.forget_live(o.owner, &o.client);
                let report = Self::report_of(&o, order_id, ExecKind::Expired, 0, ts_ns);
                self.outbox.push((o.owner, Report::Exec(report)));
            }
            Event::CancelRejected {
                order_id,
                reason,
                ts_ns,
                ..
            } => {
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
                self.outbox.push((
                    owner,
                    Report::CancelReject {
                        client,
                        orig,
                        order_id,
                        to,
                        cause: RejectCause::Core(reason),
                        ts_ns,
                    },
                ));
            }
            Event::MassCancelDone {
                orders_cancelled,
                ts_ns,
                ..
            } => {
                self.mass_part_done(key, orders_cancelled, None, ts_ns);
            }
            Event::CommandRejected { reason, ts_ns } => {
                self.mass_part_done(key, 0, Some(reason), ts_ns);
            }
            _ => {}
        }
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
                self.outbox.push((
                    agg.owner,
                    Report::MassCancel {
                        client: agg.client,
                        request_type: agg.request_type,
                        total: agg.total,
                        reject,
                        ts_ns,
                    },
                ));
            }
        }
    }
}
