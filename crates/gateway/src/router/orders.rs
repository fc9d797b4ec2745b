//! The order table as the outside sees it: answers to status requests (one order, or every
//! live order of a session) from the router's view of each order, the finished orders kept
//! for them, and the durable state ([`RouterState`]) a gateway saves at stop and loads at
//! start (`crate::recovery`).

use super::*;

/// Finished orders the router remembers for status requests by default, the oldest forgotten
/// first: a bound on memory (about 200 bytes each), and far more than a session asks about.
/// A gateway's `[gateway] finished_orders_kept` sets its own.
pub const FINISHED_ORDERS_KEPT: usize = 65_536;

/// One order as [`Router::export_state`] saves it and [`Router::import_state`] restores it:
/// flat, with its session named (not numbered), so that a restart with a changed session list
/// finds each order's owner or drops it knowingly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedOrder {
    pub session: String,
    pub order_id: OrderId,
    pub client: ClientId,
    /// The gateway's id of the order at the core (the latest, after replaces).
    pub internal: ClOrdId,
    pub core: u32,
    pub account: AccountId,
    pub instrument: InstrumentId,
    pub side: Side,
    pub ord_type: OrdType,
    pub tif: TimeInForce,
    pub price: Price,
    pub qty_lots: i64,
    pub cum_lots: i64,
    pub notional: i128,
    /// None: live in the core.
    pub finished: Option<Finished>,
}

/// An instrument the router learned from a core's stream (`InstrumentAdded`), as the state
/// keeps it: a gateway restarted on its state resumes the stream after the addition, so the
/// state is the only place it can learn the instrument from again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedInstrument {
    /// The core whose stream announced it (in `GatewayConfig::core_plan` order).
    pub core: u32,
    pub instrument: InstrumentId,
    pub definition: InstrumentDef,
}

/// The router's durable part: what a restarted gateway needs to answer status requests and to
/// route what the cores do to the orders' owners, and the instruments added at run time. `positions` are the cores' stream positions
/// ([`crate::CoreLink::stream_position`]) the state is exact at.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterState {
    pub next_internal: u64,
    pub positions: Vec<Option<u64>>,
    /// Live orders, by order id.
    pub live: Vec<SavedOrder>,
    /// Finished orders, oldest first.
    pub finished: Vec<SavedOrder>,
    /// Instruments learned from the cores' streams, in the order learned.
    pub instruments: Vec<SavedInstrument>,
}

impl Router {
    /// Finds the session's live order by client id or exchange id: its state, or, while the
    /// core has not yet accepted it, the state it was submitted with (and `true`).
    pub(super) fn status_of(
        &self,
        sref: SessionRef,
        client: Option<&ClientId>,
        order_id: Option<OrderId>,
    ) -> Option<(OrderId, OrderState, bool, Option<Finished>)> {
        let meta = self.sessions.get(sref.0 as usize)?;
        let by_id = order_id
            .and_then(|oid| self.orders.get(&oid).map(|o| (oid, o)))
            .filter(|(_, o)| o.owner == sref);
        if let Some((oid, o)) = by_id {
            return Some((oid, o.clone(), false, None));
        }
        let finished_by_id = order_id
            .and_then(|oid| self.finished.get(&oid).map(|f| (oid, f)))
            .filter(|(_, (o, _))| o.owner == sref);
        if let Some((oid, (o, how))) = finished_by_id {
            return Some((oid, o.clone(), false, Some(*how)));
        }
        let client = client?;
        if let Some(live) = meta.live.get(client) {
            if let Some(oid) = live.order_id {
                let o = self.orders.get(&oid).filter(|o| o.owner == sref)?;
                return Some((oid, o.clone(), false, None));
            }
            // Submitted, not yet answered: the state is in the pending request (bounded by
            // the requests in flight, and a status request is rare, so a scan is fine).
            return self.pending.values().find_map(|p| match p {
                Pending::New(o) if o.owner == sref && &o.client == client => {
                    Some((OrderId(0), o.clone(), true, None))
                }
                _ => None,
            });
        }
        let oid = *self.finished_by_client.get(&(sref, client.clone()))?;
        let (o, how) = self.finished.get(&oid)?;
        Some((oid, o.clone(), false, Some(*how)))
    }

    /// Remembers an order that ended, forgetting the oldest past the gateway's
    /// `finished_orders_kept`.
    pub(super) fn remember_finished(&mut self, order_id: OrderId, o: OrderState, how: Finished) {
        while self.finished_order.len() >= self.finished_orders_kept {
            let Some(old) = self.finished_order.pop_front() else {
                break;
            };
            if let Some((oo, _)) = self.finished.remove(&old) {
                self.finished_text_bytes -= text_bytes(&oo.client);
                let key = (oo.owner, oo.client);
                if self.finished_by_client.get(&key) == Some(&old) {
                    self.finished_by_client.remove(&key);
                }
            }
        }
        self.finished_by_client
            .insert((o.owner, o.client.clone()), order_id);
        self.finished_text_bytes += text_bytes(&o.client);
        match self.finished.insert(order_id, (o, how)) {
            None => self.finished_order.push_back(order_id),
            Some((old, _)) => self.finished_text_bytes -= text_bytes(&old.client),
        }
    }

    /// About the memory the finished orders take: the tables' slots by their capacity (a
    /// hash table's entry and control byte, the queue's order ids) and the text client ids,
    /// counted twice (in the order and in the by-client key). Not the allocator's overhead.
    pub fn finished_orders_bytes(&self) -> usize {
        use std::mem::size_of;
        let finished =
            self.finished.capacity() * (size_of::<(OrderId, (OrderState, Finished))>() + 1);
        let by_client = self.finished_by_client.capacity()
            * (size_of::<((SessionRef, ClientId), OrderId)>() + 1);
        let queue = self.finished_order.capacity() * size_of::<OrderId>();
        finished + by_client + queue + 2 * self.finished_text_bytes
    }

    /// Orders the router remembers as finished (for status requests).
    pub fn finished_orders(&self) -> usize {
        self.finished.len()
    }

    /// The router's durable state (see [`RouterState`]); `positions` are filled in by the
    /// caller from the links. Orders whose core has not yet accepted them (requests in
    /// flight) are not in it: the caller drains the cores first.
    pub fn export_state(&self) -> RouterState {
        let saved = |oid: OrderId, o: &OrderState, internal: ClOrdId, core: usize, f| SavedOrder {
            session: self.sessions[o.owner.0 as usize].name.clone(),
            order_id: oid,
            client: o.client.clone(),
            internal,
            core: core as u32,
            account: o.account,
            instrument: o.instrument,
            side: o.side,
            ord_type: o.ord_type,
            tif: o.tif,
            price: o.price,
            qty_lots: o.qty_lots,
            cum_lots: o.cum_lots,
            notional: o.notional,
            finished: f,
        };
        let mut live = Vec::new();
        for meta in &self.sessions {
            for l in meta.live.values() {
                let Some(oid) = l.order_id else { continue };
                if let Some(o) = self.orders.get(&oid) {
                    // A replace in flight leaves the old and the new id live; save the
                    // order once, under the id it has now.
                    if meta
                        .live
                        .get(&o.client)
                        .is_some_and(|x| x.internal == l.internal)
                    {
                        live.push(saved(oid, o, l.internal, l.core, None));
                    }
                }
            }
        }
        live.sort_by_key(|o| o.order_id);
        let finished = self
            .finished_order
            .iter()
            .filter_map(|oid| {
                let (o, how) = self.finished.get(oid)?;
                let core = self.core_of(o.instrument);
                Some(saved(*oid, o, ClOrdId(0), core, Some(*how)))
            })
            .collect();
        RouterState {
            next_internal: self.next_internal,
            positions: Vec::new(),
            live,
            finished,
            instruments: self.learned.clone(),
        }
    }

    /// Learns again the instruments a saved state kept (see [`SavedInstrument`]); one whose
    /// core is not configured any more is left out. Returns how many were left out.
    pub fn restore_instruments(&mut self, instruments: &[SavedInstrument]) -> usize {
        let mut left_out = 0;
        for s in instruments {
            let core = s.core as usize;
            if core < self.links.len() {
                self.learn_instrument(core, s.instrument, &s.definition);
            } else {
                left_out += 1;
            }
        }
        left_out
    }

    /// Restores a state [`Router::export_state`] saved: live orders (routed by order id from
    /// now on) and finished ones (for status requests). Returns how many orders were dropped
    /// because their session is no longer configured.
    pub fn import_state(&mut self, state: RouterState) -> usize {
        let by_name: HashMap<String, SessionRef> = self
            .sessions
            .iter()
            .enumerate()
            .map(|(i, m)| (m.name.clone(), SessionRef(i as u32)))
            .collect();
        let mut dropped = 0;
        self.next_internal = self.next_internal.max(state.next_internal);
        for s in state.live.into_iter().chain(state.finished) {
            let Some(&sref) = by_name.get(&s.session) else {
                dropped += 1;
                continue;
            };
            let o = OrderState {
                owner: sref,
                client: s.client.clone(),
                account: s.account,
                instrument: s.instrument,
                side: s.side,
                ord_type: s.ord_type,
                tif: s.tif,
                price: s.price,
                qty_lots: s.qty_lots,
                cum_lots: s.cum_lots,
                notional: s.notional,
            };
            match s.finished {
                Some(how) => self.remember_finished(s.order_id, o, how),
                None => {
                    self.sessions[sref.0 as usize].live.insert(
                        s.client,
                        LiveRef {
                            internal: s.internal,
                            account: s.account,
                            order_id: Some(s.order_id),
                            core: (s.core as usize).min(self.links.len().saturating_sub(1)),
                            instrument: s.instrument,
                            side: s.side,
                        },
                    );
                    self.orders.insert(s.order_id, o);
                }
            }
        }
        dropped
    }

    /// Answers an OrderStatusRequest from the gateway's view of the order: every event the
    /// gateway has turned into reports so far, so the answer never contradicts a report the
    /// session received before it. An order that is not live (unknown, or done and forgotten)
    /// is answered [`Report::StatusUnknown`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn order_status(
        &mut self,
        sref: SessionRef,
        client: Option<ClientId>,
        order_id: Option<OrderId>,
        symbol: Option<Box<str>>,
        side: Option<Side>,
        status_req_id: Option<Box<str>>,
        ts_ns: u64,
    ) {
        self.counters.status_requests += 1;
        let query = StatusQuery {
            status_req_id,
            mass: None,
            pending_new: false,
            finished: None,
        };
        match self.status_of(sref, client.as_ref(), order_id) {
            Some((oid, o, pending_new, finished)) => {
                let leaves = if pending_new {
                    o.qty_lots
                } else if finished.is_some() {
                    0
                } else {
                    (o.qty_lots - o.cum_lots).max(0)
                };
                let kind = ExecKind::Status(StatusQuery {
                    pending_new,
                    finished,
                    ..query
                });
                let mut report = Self::report_of(&o, oid, kind, leaves, ts_ns);
                if pending_new {
                    report.order_id = None;
                }
                self.outbox.push((sref, Report::Exec(report)));
            }
            None => {
                self.counters.gateway_rejects += 1;
                self.outbox.push((
                    sref,
                    Report::StatusUnknown {
                        client,
                        order_id,
                        symbol,
                        side,
                        query,
                        ts_ns,
                    },
                ))
            }
        }
    }

    /// Answers an OrderMassStatusRequest: one status report per live order of the session
    /// (of one instrument, if given), in order id order, the last flagged; none live: one
    /// [`Report::StatusUnknown`] with a count of 0.
    pub(super) fn mass_status(
        &mut self,
        sref: SessionRef,
        req_id: Box<str>,
        instrument: Option<InstrumentId>,
        ts_ns: u64,
    ) {
        self.counters.status_requests += 1;
        let Some(meta) = self.sessions.get(sref.0 as usize) else {
            return;
        };
        let mut found: Vec<(OrderId, OrderState)> = meta
            .live
            .values()
            .filter_map(|l| l.order_id)
            .filter_map(|oid| self.orders.get(&oid).map(|o| (oid, o.clone())))
            .filter(|(_, o)| o.owner == sref && instrument.is_none_or(|i| o.instrument == i))
            .collect();
        found.sort_unstable_by_key(|(oid, _)| *oid);
        let total = found.len() as u32;
        if total == 0 {
            self.outbox.push((
                sref,
                Report::StatusUnknown {
                    client: None,
                    order_id: None,
                    symbol: None,
                    side: None,
                    query: StatusQuery {
                        status_req_id: None,
                        mass: Some((req_id, 0, true)),
                        pending_new: false,
                        finished: None,
                    },
                    ts_ns,
                },
            ));
            return;
        }
        for (n, (oid, o)) in found.into_iter().enumerate() {
            let kind = ExecKind::Status(StatusQuery {
                status_req_id: None,
                mass: Some((req_id.clone(), total, n as u32 + 1 == total)),
                pending_new: false,
                finished: None,
            });
            let leaves = (o.qty_lots - o.cum_lots).max(0);
            let report = Self::report_of(&o, oid, kind, leaves, ts_ns);
            self.outbox.push((sref, Report::Exec(report)));
        }
    }
}

/// Heap bytes of a client id (a text id's characters; a numeric one has none).
fn text_bytes(client: &ClientId) -> usize {
    match client {
        ClientId::Text(t) => t.len(),
        ClientId::Num(_) => 0,
    }
}
