//! The FIX 4.4 front end: application messages (D, F, G, q, and the status requests H and AF)
//! parsed into router requests, and reports rendered as ExecutionReport (8, ExecType=I for
//! status), OrderCancelReject (9), BusinessMessageReject (j) and OrderMassCancelReport (r).

use crate::convert::{avg_px, parse_decimal, Decimal};
use crate::reports::Echo;
use crate::router::{
    ClientId, ExecKind, ExecReport, Finished, GatewayReject, InstrumentInfo, MassCancelScope,
    NewOrderRequest, RejectCause, Report, Request, Router, SessionRef, StatusQuery,
};
use bourse_core::*;
use bourse_fix::session::Inbound;
use bourse_fix::tags::BusinessRejectReason;
use bourse_fix::time::UtcTimestamp;
use bourse_fix::{Application, Dictionary, OutMessage};

/// The gateway's own FIX 4.4 dictionary (QuickFIX XML format).
pub const GATEWAY_FIX44_XML: &str = include_str!("fix44-gateway.xml");

/// The dictionary both the gateway and the client SDK validate with.
pub fn dictionary() -> Dictionary {
    Dictionary::from_xml(GATEWAY_FIX44_XML).expect("the built-in FIX 4.4 dictionary is valid")
}

/// Longest ClOrdID accepted, in bytes: ids are kept per live order.
pub const CL_ORD_ID_BYTES_MAX: usize = 64;

pub mod tag {
    pub const ACCOUNT: bourse_fix::Tag = 1;
    pub const AVG_PX: bourse_fix::Tag = 6;
    pub const CL_ORD_ID: bourse_fix::Tag = 11;
    pub const CUM_QTY: bourse_fix::Tag = 14;
    pub const EXEC_ID: bourse_fix::Tag = 17;
    pub const LAST_PX: bourse_fix::Tag = 31;
    pub const LAST_QTY: bourse_fix::Tag = 32;
    pub const ORDER_ID: bourse_fix::Tag = 37;
    pub const ORDER_QTY: bourse_fix::Tag = 38;
    pub const ORD_STATUS: bourse_fix::Tag = 39;
    pub const ORD_TYPE: bourse_fix::Tag = 40;
    pub const ORIG_CL_ORD_ID: bourse_fix::Tag = 41;
    pub const PRICE: bourse_fix::Tag = 44;
    pub const REF_SEQ_NUM: bourse_fix::Tag = 45;
    pub const SIDE: bourse_fix::Tag = 54;
    pub const SYMBOL: bourse_fix::Tag = 55;
    pub const TEXT: bourse_fix::Tag = 58;
    pub const TIME_IN_FORCE: bourse_fix::Tag = 59;
    pub const TRANSACT_TIME: bourse_fix::Tag = 60;
    pub const CXL_REJ_REASON: bourse_fix::Tag = 102;
    pub const ORD_REJ_REASON: bourse_fix::Tag = 103;
    pub const MAX_FLOOR: bourse_fix::Tag = 111;
    pub const EXPIRE_TIME: bourse_fix::Tag = 126;
    pub const EXEC_TYPE: bourse_fix::Tag = 150;
    pub const LEAVES_QTY: bourse_fix::Tag = 151;
    pub const REF_MSG_TYPE: bourse_fix::Tag = 372;
    pub const BUSINESS_REJECT_REF_ID: bourse_fix::Tag = 379;
    pub const BUSINESS_REJECT_REASON: bourse_fix::Tag = 380;
    pub const CXL_REJ_RESPONSE_TO: bourse_fix::Tag = 434;
    pub const MASS_CANCEL_REQUEST_TYPE: bourse_fix::Tag = 530;
    pub const MASS_CANCEL_RESPONSE: bourse_fix::Tag = 531;
    pub const MASS_CANCEL_REJECT_REASON: bourse_fix::Tag = 532;
    pub const TOTAL_AFFECTED_ORDERS: bourse_fix::Tag = 533;
    pub const MASS_STATUS_REQ_ID: bourse_fix::Tag = 584;
    pub const MASS_STATUS_REQ_TYPE: bourse_fix::Tag = 585;
    pub const ORD_STATUS_REQ_ID: bourse_fix::Tag = 790;
    pub const TOT_NUM_REPORTS: bourse_fix::Tag = 911;
    pub const LAST_RPT_REQUESTED: bourse_fix::Tag = 912;
}

/// The application behind one FIX session during one `on_bytes` call.
pub struct FixApp<'a> {
    pub router: &'a mut Router,
    pub sref: SessionRef,
    pub now_ms: u64,
    pub now_ns: u64,
}

fn text_of<'a>(m: &Inbound<'a>, t: bourse_fix::Tag) -> Option<&'a str> {
    m.get(t).and_then(|v| std::str::from_utf8(v).ok())
}

fn client_id(m: &Inbound<'_>, t: bourse_fix::Tag) -> Option<ClientId> {
    client_id_of(m.get(t))
}

fn side_of(v: Option<&[u8]>) -> Option<Side> {
    match v {
        Some(b"1") => Some(Side::Buy),
        Some(b"2") => Some(Side::Sell),
        _ => None,
    }
}

fn account_of(m: &Inbound<'_>) -> Result<Option<AccountId>, ()> {
    account_in(m.get(tag::ACCOUNT))
}

fn account_in(v: Option<&[u8]>) -> Result<Option<AccountId>, ()> {
    match v {
        None => Ok(None),
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
            .map(|a| Some(AccountId(a)))
            .ok_or(()),
    }
}

/// An instrument's numbers without its symbol, which a request already has: copying them is
/// free where cloning the symbol cost an allocation per order.
fn without_symbol(i: &InstrumentInfo) -> InstrumentInfo {
    InstrumentInfo {
        id: i.id,
        symbol: String::new(),
        price_scale: i.price_scale,
        lot_size: i.lot_size,
        core: i.core,
    }
}

/// The fields of an order request the application reads, found in one scan of the message
/// instead of one scan per tag: each the first occurrence of its tag, as `Inbound::get`
/// finds it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct OrderFields<'a> {
    account: Option<&'a [u8]>,
    cl_ord_id: Option<&'a [u8]>,
    order_id: Option<&'a [u8]>,
    order_qty: Option<&'a [u8]>,
    ord_type: Option<&'a [u8]>,
    orig_cl_ord_id: Option<&'a [u8]>,
    price: Option<&'a [u8]>,
    side: Option<&'a [u8]>,
    symbol: Option<&'a [u8]>,
    time_in_force: Option<&'a [u8]>,
    max_floor: Option<&'a [u8]>,
    expire_time: Option<&'a [u8]>,
}

impl<'a> OrderFields<'a> {
    fn of(fields: &[bourse_fix::Field<'a>]) -> Self {
        let mut f = OrderFields::default();
        for field in fields {
            let slot = match field.tag {
                tag::ACCOUNT => &mut f.account,
                tag::CL_ORD_ID => &mut f.cl_ord_id,
                tag::ORDER_ID => &mut f.order_id,
                tag::ORDER_QTY => &mut f.order_qty,
                tag::ORD_TYPE => &mut f.ord_type,
                tag::ORIG_CL_ORD_ID => &mut f.orig_cl_ord_id,
                tag::PRICE => &mut f.price,
                tag::SIDE => &mut f.side,
                tag::SYMBOL => &mut f.symbol,
                tag::TIME_IN_FORCE => &mut f.time_in_force,
                tag::MAX_FLOOR => &mut f.max_floor,
                tag::EXPIRE_TIME => &mut f.expire_time,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(field.value);
            }
        }
        f
    }
}

/// A ClOrdID (or OrigClOrdID) as the router keeps it: 1 to [`CL_ORD_ID_BYTES_MAX`] bytes of
/// UTF-8.
fn client_id_of(v: Option<&[u8]>) -> Option<ClientId> {
    let v = std::str::from_utf8(v?).ok()?;
    (!v.is_empty() && v.len() <= CL_ORD_ID_BYTES_MAX).then(|| ClientId::Text(v.into()))
}

impl FixApp<'_> {
    fn business_reject(
        &mut self,
        m: &Inbound<'_>,
        id: Option<ClientId>,
        text: String,
        retry: Option<u32>,
    ) {
        let report = Report::BusinessReject {
            ref_msg_type: String::from_utf8_lossy(m.msg_type()).into_owned(),
            ref_seq_num: m.seq_num(),
            ref_id: id,
            ref_template_id: 0,
            throttled_retry_ms: retry,
            text,
            ts_ns: self.now_ns,
        };
        self.router.business_reject(self.sref, report);
    }

    fn new_order(&mut self, m: &Inbound<'_>) {
        let f = OrderFields::of(&m.raw.fields);
        let Some(client) = client_id_of(f.cl_ord_id) else {
            return self.business_reject(m, None, "ClOrdID must have 1 to 64 bytes".into(), None);
        };
        let side = side_of(f.side);
        let ord_type = match f.ord_type {
            Some(b"1") => Some(OrdType::Market),
            Some(b"2") => Some(OrdType::Limit),
            _ => None,
        };
        let tif = match f.time_in_force {
            None | Some(b"0") => Some(TimeInForce::Day),
            Some(b"1") => Some(TimeInForce::Gtc),
            Some(b"2") => Some(TimeInForce::AtOpening),
            Some(b"3") => Some(TimeInForce::Ioc),
            Some(b"4") => Some(TimeInForce::Fok),
            Some(b"6") => Some(TimeInForce::Gtd),
            Some(b"7") => Some(TimeInForce::AtClose),
            // Good for auction: FIX 4.4 has no value for it; 'B' is the one later FIX
            // versions gave it.
            Some(b"B") => Some(TimeInForce::GoodForAuction),
            _ => None,
        };
        let instrument = self
            .router
            .instrument_by_symbol(f.symbol.unwrap_or(b""))
            .map(without_symbol);
        let account = account_in(f.account);
        let mut req = NewOrderRequest {
            client,
            account: account.ok().flatten(),
            instrument: instrument.as_ref().map_or(InstrumentId(0), |i| i.id),
            side: side.unwrap_or(Side::Buy),
            ord_type: ord_type.unwrap_or(OrdType::Limit),
            price: Price(0),
            qty_lots: 0,
            tif: tif.unwrap_or(TimeInForce::Day),
            expire_ts_ns: 0,
            display_lots: 0,
        };
        // A reject echoes what was sent, not what the gateway made of it.
        let echo = || {
            let field = |v: Option<&[u8]>| v.map(Box::<[u8]>::from);
            Some(Box::new(Echo {
                symbol: field(f.symbol),
                side: field(f.side),
                ord_type: field(f.ord_type),
                order_qty: field(f.order_qty),
                price: field(f.price),
            }))
        };
        let reject = |r: &mut Router, req: &NewOrderRequest, g: GatewayReject, ts| {
            r.reject_new_echoing(self.sref, req, RejectCause::Gateway(g), ts, echo())
        };
        let ts = self.now_ns;
        let Some(instrument) = instrument else {
            return reject(self.router, &req, GatewayReject::UnknownSymbol, ts);
        };
        if account.is_err() {
            return reject(self.router, &req, GatewayReject::NotAuthorized, ts);
        }
        if side.is_none() || ord_type.is_none() || tif.is_none() {
            return reject(self.router, &req, GatewayReject::UnsupportedValue, ts);
        }
        if let Some(qty) = f.order_qty.and_then(|v| parse_decimal(v, 0)) {
            req.qty_lots = instrument.lots(qty).unwrap_or(0);
        }
        if let Some(p) = f.price {
            match parse_decimal(p, instrument.price_scale) {
                Some(p) => req.price = Price(p),
                None => return reject(self.router, &req, GatewayReject::InvalidPrice, ts),
            }
        }
        if req.qty_lots <= 0 {
            return reject(self.router, &req, GatewayReject::InvalidQty, ts);
        }
        if req.ord_type == OrdType::Limit && f.price.is_none() {
            return reject(self.router, &req, GatewayReject::InvalidPrice, ts);
        }
        if let Some(v) = f.max_floor {
            match parse_decimal(v, 0).and_then(|u| instrument.lots(u)) {
                Some(l) => req.display_lots = l,
                None => return reject(self.router, &req, GatewayReject::InvalidQty, ts),
            }
        }
        if let Some(v) = f.expire_time {
            match bourse_fix::time::parse_utc_timestamp_ms(v) {
                Some(ms) if ms > 0 => req.expire_ts_ns = (ms as u64).saturating_mul(1_000_000),
                _ => return reject(self.router, &req, GatewayReject::InvalidField, ts),
            }
        }
        self.router.handle(self.sref, Request::New(req), ts);
    }

    fn cancel_or_replace(&mut self, m: &Inbound<'_>, replace: bool) {
        let to = if replace {
            CancelRejectTo::Replace
        } else {
            CancelRejectTo::Cancel
        };
        let f = OrderFields::of(&m.raw.fields);
        let (Some(client), Some(orig)) =
            (client_id_of(f.cl_ord_id), client_id_of(f.orig_cl_ord_id))
        else {
            return self.business_reject(
                m,
                None,
                "ClOrdID and OrigClOrdID must have 1 to 64 bytes".into(),
                None,
            );
        };
        let order_id = f
            .order_id
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|s| s.parse::<u64>().ok())
            .map(OrderId);
        let ts = self.now_ns;
        let reject = |r: &mut Router, g: GatewayReject| {
            r.report(
                self.sref,
                Report::CancelReject {
                    client: client.clone(),
                    orig: orig.clone(),
                    order_id,
                    to,
                    cause: RejectCause::Gateway(g),
                    ts_ns: ts,
                },
            )
        };
        if self.router.session(self.sref).is_some_and(|s| s.drop_copy) {
            return reject(self.router, GatewayReject::NotAuthorized);
        }
        if !replace {
            let cancel = Request::Cancel {
                client,
                orig,
                order_id,
            };
            return self.router.handle(self.sref, cancel, ts);
        }
        let Some(instrument) = self
            .router
            .instrument_by_symbol(f.symbol.unwrap_or(b""))
            .map(without_symbol)
        else {
            return reject(self.router, GatewayReject::UnknownSymbol);
        };
        let price = match f.price {
            None => None,
            Some(p) => match parse_decimal(p, instrument.price_scale) {
                Some(p) => Some(Price(p)),
                None => return reject(self.router, GatewayReject::InvalidPrice),
            },
        };
        let qty_lots = match m
            .get(tag::ORDER_QTY)
            .and_then(|v| parse_decimal(v, 0))
            .and_then(|u| instrument.lots(u))
        {
            Some(l) => l,
            None => return reject(self.router, GatewayReject::InvalidQty),
        };
        let replace = Request::Replace {
            client,
            orig,
            order_id,
            price,
            qty_lots: Some(qty_lots),
        };
        self.router.handle(self.sref, replace, ts);
    }

    fn mass_cancel(&mut self, m: &Inbound<'_>) {
        let Some(client) = client_id(m, tag::CL_ORD_ID) else {
            return self.business_reject(m, None, "ClOrdID must have 1 to 64 bytes".into(), None);
        };
        let ts = self.now_ns;
        let request_type = m
            .get(tag::MASS_CANCEL_REQUEST_TYPE)
            .and_then(|v| v.first().copied())
            .unwrap_or(b'0');
        let reject = |r: &mut Router, g: GatewayReject| {
            r.report(
                self.sref,
                Report::MassCancel {
                    client: client.clone(),
                    request_type,
                    total: 0,
                    reject: Some(RejectCause::Gateway(g)),
                    ts_ns: ts,
                },
            )
        };
        // MassCancelRequestType: 1 the session's orders in Symbol, 7 all the session's
        // orders, 8 ("orders for a party") every order of Account, or of the firm without
        // Account, whichever session entered them; Symbol and Side filter any of them.
        let symbol = m.get(tag::SYMBOL);
        let scope = match (request_type, m.get(tag::ACCOUNT)) {
            (b'1' | b'7', _) => MassCancelScope::Session,
            (b'8', Some(_)) => MassCancelScope::Account,
            (b'8', None) => MassCancelScope::Firm,
            _ => return reject(self.router, GatewayReject::UnsupportedValue),
        };
        let instrument = match (request_type, symbol) {
            (b'1', None) => return reject(self.router, GatewayReject::UnknownSymbol),
            (_, None) => None,
            (_, Some(s)) => match self.router.instrument_by_symbol(s) {
                Some(i) => Some(i.id),
                None => return reject(self.router, GatewayReject::UnknownSymbol),
            },
        };
        let Ok(account) = account_of(m) else {
            return reject(self.router, GatewayReject::NotAuthorized);
        };
        let side = side_of(m.get(tag::SIDE));
        let mass_cancel = Request::MassCancel {
            client: client.clone(),
            request_type,
            scope,
            account,
            instrument,
            side,
        };
        self.router.handle(self.sref, mass_cancel, ts);
    }
}

impl FixApp<'_> {
    /// OrderStatusRequest (H): by ClOrdID, or by OrderID when given.
    fn order_status(&mut self, m: &Inbound<'_>) {
        let client = client_id(m, tag::CL_ORD_ID);
        let order_id = text_of(m, tag::ORDER_ID)
            .and_then(|s| s.parse::<u64>().ok())
            .map(OrderId);
        if client.is_none() && order_id.is_none() {
            return self.business_reject(
                m,
                None,
                "OrderStatusRequest needs a ClOrdID of 1 to 64 bytes or an OrderID".into(),
                None,
            );
        }
        let symbol = text_of(m, tag::SYMBOL)
            .filter(|s| s.len() <= 64)
            .map(Box::from);
        let side = side_of(m.get(tag::SIDE));
        let req_id = text_of(m, tag::ORD_STATUS_REQ_ID)
            .filter(|s| s.len() <= 64)
            .map(Box::from);
        let ts = self.now_ns;
        let status = Request::Status {
            client,
            order_id,
            symbol,
            side,
            status_req_id: req_id,
        };
        self.router.handle(self.sref, status, ts);
    }

    /// OrderMassStatusRequest (AF): MassStatusReqType 7 (all orders) or 1 (one security).
    fn mass_status(&mut self, m: &Inbound<'_>) {
        let Some(req_id) =
            text_of(m, tag::MASS_STATUS_REQ_ID).filter(|s| !s.is_empty() && s.len() <= 64)
        else {
            return self.business_reject(
                m,
                None,
                "MassStatusReqID must have 1 to 64 bytes".into(),
                None,
            );
        };
        let instrument = match m.get(tag::MASS_STATUS_REQ_TYPE) {
            Some(b"7") => None,
            Some(b"1") => match self
                .router
                .instrument_by_symbol(m.get(tag::SYMBOL).unwrap_or(b""))
            {
                Some(i) => Some(i.id),
                None => {
                    return self.business_reject(
                        m,
                        Some(ClientId::Text(req_id.into())),
                        "unknown symbol".into(),
                        None,
                    )
                }
            },
            _ => {
                return self.business_reject(
                    m,
                    Some(ClientId::Text(req_id.into())),
                    "MassStatusReqType must be 7 (all orders) or 1 (one security)".into(),
                    None,
                )
            }
        };
        let ts = self.now_ns;
        let mass_status = Request::MassStatus {
            req_id: req_id.into(),
            instrument,
        };
        self.router.handle(self.sref, mass_status, ts);
    }
}

impl Application for FixApp<'_> {
    fn on_app_message(
        &mut self,
        m: &Inbound<'_>,
        _replies: &mut Vec<OutMessage>,
    ) -> Result<(), BusinessRejectReason> {
        let msg_type = m.msg_type();
        let kind = match msg_type {
            b"D" => Some(CommandKind::NewOrder),
            b"F" => Some(CommandKind::Cancel),
            b"G" => Some(CommandKind::Replace),
            b"q" => Some(CommandKind::MassCancel),
            _ => None,
        };
        self.router.note_request(true, kind);
        if !matches!(msg_type, b"D" | b"F" | b"G" | b"q" | b"H" | b"AF") {
            return Err(BusinessRejectReason::UnsupportedMessageType);
        }
        if let Err(t) = self.router.throttle(self.sref, self.now_ms) {
            let retry_ms = t.retry_ms;
            let text = format!(
                "throttle: more than {} messages/s; retry after {retry_ms} ms",
                t.msgs_per_s
            );
            let id = client_id(m, tag::CL_ORD_ID);
            self.business_reject(m, id, text, Some(retry_ms));
            return Ok(());
        }
        match msg_type {
            b"D" => self.new_order(m),
            b"F" => self.cancel_or_replace(m, false),
            b"G" => self.cancel_or_replace(m, true),
            b"H" => self.order_status(m),
            b"AF" => self.mass_status(m),
            _ => self.mass_cancel(m),
        }
        Ok(())
    }
}

fn ord_rej_reason(cause: RejectCause) -> u32 {
    use RejectReason::*;
    match cause {
        RejectCause::Core(r) => match r {
            UnknownInstrument => 1,
            // 2 = exchange closed; Text (58) names which of them it is.
            InstrumentHalted | InstrumentClosed | InstrumentPaused => 2,
            // 3 = order exceeds limit: every pre-trade risk refusal, an open margin call
            // included; Text (58) names which.
            InsufficientCollateral | InsufficientPosition | PositionLimit | MarginCallOpen => 3,
            UnknownOrder => 5,
            DuplicateClOrdId => 6,
            QtyNotPositive | QtyTooLarge => 13,
            InvalidTimeInForce
            | TimeInForceNotInPhase
            | DisplayQtyInvalid
            | ExpireTimeMissing
            | ExpireTimeInPast
            | ExpireTimeUnexpected => 11,
            _ => 99,
        },
        RejectCause::Gateway(g) => match g {
            GatewayReject::UnknownSymbol => 1,
            GatewayReject::DuplicateClOrdId => 6,
            GatewayReject::UnknownOrder => 5,
            GatewayReject::InvalidQty => 13,
            GatewayReject::UnsupportedValue => 11,
            _ => 99,
        },
    }
}

fn cxl_rej_reason(cause: RejectCause) -> u32 {
    match cause {
        RejectCause::Core(RejectReason::UnknownOrder)
        | RejectCause::Gateway(GatewayReject::UnknownOrder) => 1,
        RejectCause::Core(RejectReason::DuplicateClOrdId)
        | RejectCause::Gateway(GatewayReject::DuplicateClOrdId) => 6,
        _ => 99,
    }
}

fn side_code(side: Side) -> &'static str {
    match side {
        Side::Buy => "1",
        Side::Sell => "2",
    }
}

/// Renders the parts of an execution report every kind shares into `m` (emptied first).
pub fn render_exec_into(router: &Router, r: &ExecReport, exec_id: &str, m: &mut OutMessage) {
    let info = router.instrument(r.instrument);
    let scale = info.map_or(0, |i| i.price_scale);
    let lot = info.map_or(1, |i| i.lot_size);
    let symbol = info.map_or("?", |i| i.symbol.as_str());
    let units = |lots: i64| i128::from(lots) * i128::from(lot);
    m.reset("8");
    match r.order_id {
        Some(o) => m.push_u64(tag::ORDER_ID, o.0),
        None => m.push(tag::ORDER_ID, "NONE"),
    };
    let (exec_type, status): (&str, &str) = match &r.kind {
        ExecKind::New => ("0", "0"),
        ExecKind::Trade { .. } => ("F", if r.leaves_lots == 0 { "2" } else { "1" }),
        ExecKind::Canceled { .. } => ("4", "4"),
        ExecKind::Replaced { .. } => ("5", if r.cum_lots > 0 { "1" } else { "0" }),
        ExecKind::Expired => ("C", "C"),
        ExecKind::Rejected(_) => ("8", "8"),
        ExecKind::Status(q) if q.pending_new => ("I", "A"),
        ExecKind::Status(StatusQuery {
            finished: Some(how),
            ..
        }) => (
            "I",
            match how {
                Finished::Filled => "2",
                Finished::Canceled => "4",
                Finished::Expired => "C",
            },
        ),
        ExecKind::Status(_) => ("I", if r.cum_lots > 0 { "1" } else { "0" }),
    };
    match &r.kind {
        ExecKind::Canceled { by: Some(by), .. } => {
            push_client(m, tag::CL_ORD_ID, by);
            push_client(m, tag::ORIG_CL_ORD_ID, &r.client);
        }
        ExecKind::Replaced { orig } => {
            push_client(m, tag::CL_ORD_ID, &r.client);
            push_client(m, tag::ORIG_CL_ORD_ID, orig);
        }
        _ => {
            push_client(m, tag::CL_ORD_ID, &r.client);
        }
    }
    m.push(tag::EXEC_ID, exec_id);
    m.push(tag::EXEC_TYPE, exec_type);
    m.push(tag::ORD_STATUS, status);
    if let ExecKind::Rejected(cause) = &r.kind {
        m.push_u64(tag::ORD_REJ_REASON, u64::from(ord_rej_reason(*cause)));
        m.push(tag::TEXT, cause.text());
    }
    if let ExecKind::Canceled { reason, .. } = &r.kind {
        m.push_display(tag::TEXT, &format_args!("{reason:?}"));
    }
    m.push_u64(tag::ACCOUNT, u64::from(r.account.0));
    if let Some(echo) = &r.echo {
        push_echo(m, echo);
    } else {
        m.push(tag::SYMBOL, symbol);
        m.push(tag::SIDE, side_code(r.side));
        m.push_int(tag::ORDER_QTY, units(r.qty_lots));
        m.push(
            tag::ORD_TYPE,
            if r.ord_type == OrdType::Market {
                "1"
            } else {
                "2"
            },
        );
        if r.ord_type == OrdType::Limit {
            push_decimal(m, tag::PRICE, Decimal(i128::from(r.price.0), scale));
        }
    }
    // TradeID (1003) is not an ExecutionReport field in FIX 4.4 (QuickFIX/J rejects it); the
    // trade is identified by ExecID, unique per report.
    if let ExecKind::Trade {
        last_px, last_lots, ..
    } = &r.kind
    {
        m.push_int(tag::LAST_QTY, units(*last_lots));
        push_decimal(m, tag::LAST_PX, Decimal(i128::from(last_px.0), scale));
    }
    m.push_int(tag::LEAVES_QTY, units(r.leaves_lots));
    m.push_int(tag::CUM_QTY, units(r.cum_lots));
    push_decimal(m, tag::AVG_PX, avg_px(r.notional, r.cum_lots, scale));
    push_time(m, tag::TRANSACT_TIME, r.ts_ns);
    if let ExecKind::Status(q) = &r.kind {
        push_status_query(m, q);
    }
}

/// A ClOrdID as the client sent it, or the number the binary protocol carries.
fn push_client(m: &mut OutMessage, t: bourse_fix::Tag, id: &ClientId) {
    match id {
        ClientId::Text(text) => m.push(t, text.as_bytes()),
        ClientId::Num(n) => m.push_u64(t, *n),
    };
}

fn push_decimal(m: &mut OutMessage, t: bourse_fix::Tag, d: Decimal) {
    m.push_with(t, |out| d.write_to(out));
}

/// A UTCTimestamp field (milliseconds) from a time in nanoseconds.
fn push_time(m: &mut OutMessage, t: bourse_fix::Tag, ts_ns: u64) {
    m.push_with(t, |out| {
        UtcTimestamp((ts_ns / 1_000_000) as i64).write_to(out)
    });
}

/// A rejected request's fields as it sent them. Symbol and Side are required in an
/// ExecutionReport: a request without them (which the session layer refuses before it gets
/// here) would get the placeholders "[N/A]" and 7 (undisclosed).
fn push_echo(m: &mut OutMessage, echo: &Echo) {
    m.push(tag::SYMBOL, echo.symbol.as_deref().unwrap_or(b"[N/A]"));
    m.push(tag::SIDE, echo.side.as_deref().unwrap_or(b"7"));
    if let Some(q) = &echo.order_qty {
        m.push(tag::ORDER_QTY, q);
    }
    if let Some(t) = &echo.ord_type {
        m.push(tag::ORD_TYPE, t);
    }
    if let Some(p) = &echo.price {
        m.push(tag::PRICE, p);
    }
}

fn push_status_query(m: &mut OutMessage, q: &StatusQuery) {
    if let Some(id) = &q.status_req_id {
        m.push(tag::ORD_STATUS_REQ_ID, id.as_bytes());
    }
    if let Some((id, total, last)) = &q.mass {
        m.push(tag::MASS_STATUS_REQ_ID, id.as_bytes());
        m.push_display(tag::TOT_NUM_REPORTS, &total);
        m.push(tag::LAST_RPT_REQUESTED, if *last { "Y" } else { "N" });
    }
}

/// Writes the ExecID `<prefix>-<n>` into `out` (emptied first), digits by hand: one per
/// execution report, into a buffer the caller keeps.
pub fn exec_id_into(out: &mut String, prefix: &str, n: u64) {
    out.clear();
    out.push_str(prefix);
    out.push('-');
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        out.push(char::from(d));
    }
}

/// Renders a report as a FIX message. Execution reports need a unique ExecID.
pub fn render(router: &Router, report: &Report, exec_id: &str) -> OutMessage {
    let mut m = OutMessage::new("8");
    render_into(router, report, exec_id, &mut m);
    m
}

/// As [`render`], into `m` (emptied first): a driver that keeps one message for every report
/// allocates nothing per report once its buffers have grown.
pub fn render_into(router: &Router, report: &Report, exec_id: &str, m: &mut OutMessage) {
    match report {
        Report::Exec(r) => render_exec_into(router, r, exec_id, m),
        Report::CancelReject {
            client,
            orig,
            order_id,
            to,
            cause,
            ts_ns,
        } => {
            m.reset("9");
            match order_id {
                Some(o) => m.push_u64(tag::ORDER_ID, o.0),
                None => m.push(tag::ORDER_ID, "NONE"),
            };
            push_client(m, tag::CL_ORD_ID, client);
            push_client(m, tag::ORIG_CL_ORD_ID, orig);
            m.push(tag::ORD_STATUS, if order_id.is_some() { "0" } else { "8" });
            m.push(tag::TEXT, cause.text());
            push_time(m, tag::TRANSACT_TIME, *ts_ns);
            m.push_u64(tag::CXL_REJ_REASON, u64::from(cxl_rej_reason(*cause)));
            m.push(
                tag::CXL_REJ_RESPONSE_TO,
                if *to == CancelRejectTo::Cancel {
                    "1"
                } else {
                    "2"
                },
            );
        }
        Report::MassCancel {
            client,
            request_type,
            total,
            reject,
            ts_ns,
        } => {
            m.reset("r");
            push_client(m, tag::CL_ORD_ID, client);
            m.push_display(tag::ORDER_ID, &format_args!("MASS-{client}"));
            m.push(tag::MASS_CANCEL_REQUEST_TYPE, [*request_type]);
            match reject {
                Some(cause) => {
                    m.push(tag::MASS_CANCEL_RESPONSE, "0");
                    m.push(tag::MASS_CANCEL_REJECT_REASON, "99");
                    m.push(tag::TEXT, cause.text());
                }
                None => {
                    m.push(tag::MASS_CANCEL_RESPONSE, [*request_type]);
                }
            }
            m.push_display(tag::TOTAL_AFFECTED_ORDERS, &total);
            push_time(m, tag::TRANSACT_TIME, *ts_ns);
        }
        Report::StatusUnknown {
            client,
            order_id,
            symbol,
            side,
            query,
            ts_ns,
        } => {
            m.reset("8");
            match order_id {
                Some(o) => m.push_u64(tag::ORDER_ID, o.0),
                None => m.push(tag::ORDER_ID, "NONE"),
            };
            if let Some(c) = client {
                push_client(m, tag::CL_ORD_ID, c);
            }
            m.push(tag::EXEC_ID, exec_id);
            m.push(tag::EXEC_TYPE, "I");
            m.push(tag::ORD_STATUS, "8");
            let text = if query.mass.is_some() {
                "no open orders"
            } else {
                m.push(tag::ORD_REJ_REASON, "5");
                "unknown order: not a live order of this session"
            };
            m.push(tag::TEXT, text);
            // Symbol and Side are required in an ExecutionReport: the request's, else the
            // placeholders "[N/A]" and 7 (undisclosed) for a report about no order.
            m.push(tag::SYMBOL, symbol.as_deref().unwrap_or("[N/A]"));
            m.push(tag::SIDE, side.map_or("7", side_code));
            m.push(tag::LEAVES_QTY, "0");
            m.push(tag::CUM_QTY, "0");
            push_decimal(m, tag::AVG_PX, avg_px(0, 0, 0));
            push_time(m, tag::TRANSACT_TIME, *ts_ns);
            push_status_query(m, query);
        }
        Report::BusinessReject {
            ref_msg_type,
            ref_seq_num,
            ref_id,
            text,
            ..
        } => {
            m.reset("j");
            m.push_display(tag::REF_SEQ_NUM, &ref_seq_num);
            m.push(tag::TEXT, text);
            m.push(tag::REF_MSG_TYPE, ref_msg_type);
            if let Some(id) = ref_id {
                m.push_display(tag::BUSINESS_REJECT_REF_ID, &id);
            }
            // 0 = Other: FIX 4.4 has no code for a throttle; Text says what happened.
            m.push(tag::BUSINESS_REJECT_REASON, "0");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bourse_fix::Field;
    use proptest::prelude::*;

    const READ: [bourse_fix::Tag; 12] = [
        tag::ACCOUNT,
        tag::CL_ORD_ID,
        tag::ORDER_ID,
        tag::ORDER_QTY,
        tag::ORD_TYPE,
        tag::ORIG_CL_ORD_ID,
        tag::PRICE,
        tag::SIDE,
        tag::SYMBOL,
        tag::TIME_IN_FORCE,
        tag::MAX_FLOOR,
        tag::EXPIRE_TIME,
    ];

    proptest! {
        /// The one scan finds for every tag what a lookup of that tag finds: its first value,
        /// whatever the order, repeats and other tags of the message.
        #[test]
        fn one_scan_finds_what_a_lookup_per_tag_finds(
            fields in proptest::collection::vec(
                (prop_oneof![proptest::sample::select(READ.to_vec()), 1..200i32],
                 proptest::collection::vec(any::<u8>(), 0..4)),
                0..24),
        ) {
            let fields: Vec<Field<'_>> =
                fields.iter().map(|(t, v)| Field { tag: *t, value: v }).collect();
            let get = |t| fields.iter().find(|f| f.tag == t).map(|f| f.value);
            let f = OrderFields::of(&fields);
            let found = [
                f.account, f.cl_ord_id, f.order_id, f.order_qty, f.ord_type,
                f.orig_cl_ord_id, f.price, f.side, f.symbol, f.time_in_force,
                f.max_floor, f.expire_time,
            ];
            for (t, v) in READ.iter().zip(found) {
                prop_assert_eq!(v, get(*t), "tag {}", t);
            }
        }
    }
}
