//! [`AdminService`]: runs operators' actions against an [`AdminVenue`].
//!
//! Each action becomes commands for the cores it concerns (`plan`), submitted through the
//! venue's sequenced path and answered once they committed, with what each core said. A
//! request carries a request id: the first request under an id runs (on a task of its own, so
//! that a client hanging up cannot stop it half way), every later request under the same id
//! waits for that run and gets its answer, and a different request under a used id is refused
//! (`409`). Finished answers are kept for [`REQUEST_IDS_MAX`] ids and are written to the audit
//! log, which is read back at start, so a retry after a restart is answered from it too.

use crate::action::{Action, NewAccount};
use crate::audit::{AuditLog, AuditRecord};
use crate::venue::{AdminVenue, Asker, Query, QueryAnswer};
use bourse_core::*;
use bourse_monitor::admin::{AdminEntry, ADMIN_RECENT_MAX};
use bourse_monitor::names;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Request ids whose answers are kept (oldest forgotten first).
pub const REQUEST_IDS_MAX: usize = 65_536;
/// The longest request id accepted.
pub const REQUEST_ID_BYTES_MAX: usize = 128;
/// Events shown per market in an answer; the rest are counted.
pub const EVENTS_PER_MARKET_SHOWN_MAX: usize = 64;
/// Live orders an account query lists per market.
pub const ORDERS_PER_QUERY_MAX: usize = bourse_cluster::query::ACCOUNT_ANSWER_ORDERS_MAX;
/// Accounts a bulk addition submits to the cores at a time (the memory it holds is bounded
/// by two such batches, the one submitted and the one read meanwhile, whatever the length of
/// the stream). Large, because each batch waits for its additions before its deposits.
pub const BULK_BATCH_ACCOUNTS: usize = 65_536;
/// The longest line of a bulk addition.
pub const BULK_LINE_BYTES_MAX: usize = 4_096;
/// The most lines one bulk addition may carry.
pub const BULK_LINES_MAX: u64 = 20_000_000;
/// Distinct errors a bulk answer lists (every one is counted).
pub const BULK_ERRORS_SHOWN_MAX: usize = 16;
/// The most of a bulk body read and thrown away after an answer given before the body was
/// read (a repeated request id, a refusal, a line that stopped it).
pub const BULK_DISCARD_BYTES_MAX: u64 = 64 << 20;
/// How long that reading may take.
pub const BULK_DISCARD_MS_MAX: u64 = 5_000;

/// One core's answer to submitted commands: each command's events, or why it is unknown.
type CoreAnswer = Result<Vec<Vec<Event>>, String>;

/// What the service answers: an HTTP status and a JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

impl Answer {
    pub fn new(status: u16, body: Value) -> Answer {
        Answer { status, body }
    }

    /// An error answer: `{"outcome": kind, "error": message}`.
    pub fn error(status: u16, kind: &str, message: impl Into<String>) -> Answer {
        Answer::new(status, json!({ "outcome": kind, "error": message.into() }))
    }

    pub fn outcome(&self) -> &str {
        self.body["outcome"].as_str().unwrap_or("unknown")
    }
}

/// What the service reports to the venue's monitor: counters on `/metrics` and, for the
/// dashboard's admin panel, each audited request.
struct Metrics {
    monitor: Arc<bourse_monitor::Monitor>,
}

impl Metrics {
    fn count(&self, action: &str, outcome: &str) {
        self.monitor
            .registry()
            .counter(
                names::ADMIN_REQUESTS_TOTAL,
                "Admin API requests answered, by action and outcome.",
                &[("action", action), ("outcome", outcome)],
            )
            .inc();
    }

    fn refused(&self, reason: &str) {
        self.monitor
            .registry()
            .counter(
                names::ADMIN_AUTH_REFUSED_TOTAL,
                "Admin API requests refused before they ran: unauthenticated or unauthorised.",
                &[("reason", reason)],
            )
            .inc();
    }

    /// Counts the refusals the cores gave in `answer`: a bulk or single account addition
    /// says them as `rejected: {reason: count}`, any other action as `rejections: [{reason}]`.
    fn rejects(&self, answer: &Answer) {
        let add = |reason: &str, n: u64| {
            self.monitor
                .registry()
                .counter(
                    names::ADMIN_REJECTS_TOTAL,
                    "Admin commands a core refused, by reject reason.",
                    &[("reason", reason)],
                )
                .add(n);
        };
        if let Some(by_reason) = answer.body["rejected"].as_object() {
            for (reason, n) in by_reason {
                add(reason, n.as_u64().unwrap_or(0));
            }
        }
        if let Some(list) = answer.body["rejections"].as_array() {
            for r in list {
                add(r["reason"].as_str().unwrap_or("unknown"), 1);
            }
        }
    }

    /// Hands an audited request to the dashboard.
    fn show(&self, record: &AuditRecord) {
        self.monitor.admin().record(AdminEntry {
            ts_ns: record.ts_ns,
            operator: record.operator.clone(),
            request_id: record.request_id.clone(),
            action: record.action.clone(),
            outcome: record.outcome.clone(),
            status: record.status,
        });
    }
}

/// One request id's slot: the answer once the run finished. The run holds the lock until
/// then, so a retry waits on it.
type Slot = Arc<tokio::sync::Mutex<Option<Answer>>>;

struct RequestTable {
    slots: HashMap<String, (u64, Slot)>,
    order: VecDeque<String>,
}

impl RequestTable {
    fn forget_oldest(&mut self) {
        while self.slots.len() > REQUEST_IDS_MAX {
            let Some(id) = self.order.pop_front() else {
                return;
            };
            let running = self
                .slots
                .get(&id)
                .is_some_and(|(_, slot)| slot.try_lock().is_err());
            if running {
                // Still running: keep it, try the next oldest.
                self.order.push_back(id);
                if self.order.len() <= 1 {
                    return;
                }
                continue;
            }
            self.slots.remove(&id);
        }
    }
}

/// Runs actions; see the module documentation.
pub struct AdminService {
    venue: Arc<dyn AdminVenue>,
    markets: Vec<String>,
    requests: Mutex<RequestTable>,
    audit: Mutex<AuditLog>,
    metrics: Option<Metrics>,
}

/// Unix time in nanoseconds: the time stamp on the commands this service submits (the
/// core reads no clock; as a gateway does, the service stamps what it sends).
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A fingerprint of a request: the same request retried has the same one.
pub fn fingerprint(request: &Value) -> u64 {
    xxhash_rust::xxh3::xxh3_64(request.to_string().as_bytes())
}

/// Checks a request id's form: 1 to [`REQUEST_ID_BYTES_MAX`] printable ASCII bytes.
pub fn check_request_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > REQUEST_ID_BYTES_MAX
        || !id.bytes().all(|b| (0x21..0x7f).contains(&b))
    {
        return Err(format!(
            "request id: 1 to {REQUEST_ID_BYTES_MAX} printable ASCII bytes without spaces"
        ));
    }
    Ok(())
}

impl AdminService {
    /// The venue's metrics registry, if the service reports to a monitor (the admin
    /// listener's refusals are counted there).
    pub fn registry(&self) -> Option<&bourse_monitor::metrics::Registry> {
        self.metrics.as_ref().map(|m| m.monitor.registry())
    }

    /// A service over `venue`, auditing into `audit` (whose earlier answers it remembers).
    pub fn new(
        venue: Arc<dyn AdminVenue>,
        audit_path: &std::path::Path,
        monitor: Option<Arc<bourse_monitor::Monitor>>,
    ) -> std::io::Result<AdminService> {
        let (audit, earlier) = AuditLog::open(audit_path)?;
        let mut table = RequestTable {
            slots: HashMap::new(),
            order: VecDeque::new(),
        };
        let metrics = monitor.map(|monitor| Metrics { monitor });
        if let Some(m) = &metrics {
            // The dashboard opens with the newest requests of earlier runs.
            for r in &earlier[earlier.len().saturating_sub(ADMIN_RECENT_MAX)..] {
                m.show(r);
            }
        }
        for r in earlier {
            // Refused, invalid and conflicting requests ran nothing: their ids keep (or
            // never had) the answer of the request that ran under them.
            if r.outcome == "refused" || r.outcome == "invalid" || r.outcome == "conflict" {
                continue;
            }
            let slot = Arc::new(tokio::sync::Mutex::new(Some(Answer::new(
                r.status, r.answer,
            ))));
            if table
                .slots
                .insert(r.request_id.clone(), (r.fingerprint, slot))
                .is_none()
            {
                table.order.push_back(r.request_id);
            }
            table.forget_oldest();
        }
        Ok(AdminService {
            markets: venue.markets(),
            venue,
            requests: Mutex::new(table),
            audit: Mutex::new(audit),
            metrics,
        })
    }

    pub fn markets(&self) -> &[String] {
        &self.markets
    }

    pub fn audit_path(&self) -> std::path::PathBuf {
        self.audit.lock().expect("audit lock").path().to_path_buf()
    }

    /// Counts and audits a request refused before it ran (no or wrong credentials, a role
    /// missing): `reason` is `unauthenticated` or `unauthorised`.
    pub fn refused(&self, claimed: &str, what: &str, reason: &str) {
        if let Some(m) = &self.metrics {
            m.refused(reason);
        }
        self.write_audit(AuditRecord {
            ts_ns: unix_ns(),
            operator: claimed.to_string(),
            request_id: String::new(),
            action: what.to_string(),
            request: Value::Null,
            outcome: "refused".into(),
            status: if reason == "unauthenticated" {
                401
            } else {
                403
            },
            answer: json!({ "reason": reason }),
            fingerprint: 0,
        });
    }

    fn write_audit(&self, record: AuditRecord) {
        if let Some(m) = &self.metrics {
            m.show(&record);
        }
        if let Err(e) = self.audit.lock().expect("audit lock").append(&record) {
            eprintln!("admin: could not write the audit log: {e}");
        }
    }

    fn market_index(&self, name: &str) -> Result<usize, Answer> {
        self.markets.iter().position(|m| m == name).ok_or_else(|| {
            Answer::error(
                400,
                "invalid",
                format!(
                    "market: no market {name:?} (markets: {})",
                    self.markets.join(", ")
                ),
            )
        })
    }

    /// Runs `action` for `operator` under `request_id` (see the module documentation).
    pub async fn run(self: &Arc<Self>, operator: &str, request_id: &str, action: Action) -> Answer {
        let request = serde_json::to_value(&action).unwrap_or(Value::Null);
        let name = action.name();
        if let Err(e) = check_request_id(request_id).and_then(|()| action.check()) {
            let answer = Answer::error(400, "invalid", e);
            self.finish(operator, request_id, name, request, 0, &answer);
            return answer;
        }
        let this = Arc::clone(self);
        let (who, id) = (operator.to_string(), request_id.to_string());
        self.once(operator, request_id, name, request, move || async move {
            let asker = Asker {
                operator: &who,
                request_id: &id,
            };
            this.execute(&action, asker).await
        })
        .await
    }

    /// Runs `work` once per request id: a retry (same fingerprint) gets the first run's
    /// answer, another request under the same id a `409`.
    pub(crate) async fn once<F, Fut>(
        self: &Arc<Self>,
        operator: &str,
        request_id: &str,
        name: &str,
        request: Value,
        work: F,
    ) -> Answer
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Answer> + Send + 'static,
    {
        let print = fingerprint(&request);
        let (slot, guard) = {
            let mut table = self.requests.lock().expect("request table lock");
            match table.slots.get(request_id) {
                Some((p, _)) if *p != print => {
                    drop(table);
                    let answer = Answer::error(
                        409,
                        "conflict",
                        format!("request id {request_id:?} was used for another request"),
                    );
                    self.finish(operator, request_id, name, request, print, &answer);
                    return answer;
                }
                Some((_, slot)) => (Arc::clone(slot), None),
                None => {
                    let slot: Slot = Arc::new(tokio::sync::Mutex::new(None));
                    let guard = Arc::clone(&slot)
                        .try_lock_owned()
                        .expect("a new slot is free");
                    table
                        .slots
                        .insert(request_id.to_string(), (print, Arc::clone(&slot)));
                    table.order.push_back(request_id.to_string());
                    table.forget_oldest();
                    (slot, Some(guard))
                }
            }
        };
        if let Some(mut guard) = guard {
            // The first run: on a task of its own, so that it finishes (and is audited) even
            // if the client that asked hangs up.
            let this = Arc::clone(self);
            let operator = operator.to_string();
            let request_id = request_id.to_string();
            let name = name.to_string();
            let task = tokio::spawn(async move {
                let answer = work().await;
                this.finish(&operator, &request_id, &name, request, print, &answer);
                *guard = Some(answer.clone());
                answer
            });
            return task.await.unwrap_or_else(|e| {
                Answer::error(500, "unavailable", format!("the action's task failed: {e}"))
            });
        }
        let done = slot.lock().await;
        let mut answer = done.clone().unwrap_or_else(|| {
            Answer::error(
                500,
                "unavailable",
                "the first run of this request id failed",
            )
        });
        answer.body["retried"] = Value::Bool(true);
        answer
    }

    fn finish(
        &self,
        operator: &str,
        request_id: &str,
        action: &str,
        request: Value,
        print: u64,
        answer: &Answer,
    ) {
        if let Some(m) = &self.metrics {
            m.count(action, answer.outcome());
            m.rejects(answer);
        }
        self.write_audit(AuditRecord {
            ts_ns: unix_ns(),
            operator: operator.to_string(),
            request_id: request_id.to_string(),
            action: action.to_string(),
            request,
            outcome: answer.outcome().to_string(),
            status: answer.status,
            answer: answer.body.clone(),
            fingerprint: print,
        });
    }

    /// The cores an action goes to, and the command each gets.
    fn plan(&self, action: &Action) -> Result<Vec<(usize, CommandBody)>, Answer> {
        let every = |body: CommandBody| -> Vec<(usize, CommandBody)> {
            (0..self.markets.len()).map(|c| (c, body.clone())).collect()
        };
        Ok(match action {
            Action::AddInstrument { market, instrument } => {
                vec![(
                    self.market_index(market)?,
                    CommandBody::AddInstrument(instrument.clone()),
                )]
            }
            Action::AddAccount(_) => unreachable!("account additions have a plan of their own"),
            Action::Deposit {
                market,
                account,
                amount,
            } => vec![(
                self.market_index(market)?,
                CommandBody::Deposit {
                    account: *account,
                    amount: *amount,
                },
            )],
            Action::Withdraw {
                market,
                account,
                amount,
            } => vec![(
                self.market_index(market)?,
                CommandBody::Withdraw {
                    account: *account,
                    amount: *amount,
                },
            )],
            Action::SetCollateral {
                market,
                account,
                amount,
            } => vec![(
                self.market_index(market)?,
                CommandBody::SetCollateral {
                    account: *account,
                    amount: *amount,
                },
            )],
            Action::MarginCall {
                market,
                account,
                amount,
            } => vec![(
                self.market_index(market)?,
                CommandBody::MarginCall {
                    account: *account,
                    amount: *amount,
                },
            )],
            Action::SetPhase {
                market,
                instrument,
                phase,
            } => {
                let body = CommandBody::SetPhase {
                    instrument: *instrument,
                    phase: *phase,
                };
                match market {
                    Some(m) => vec![(self.market_index(m)?, body)],
                    // One instrument: every core is asked, the one that has it applies it.
                    None => every(body),
                }
            }
            Action::KillSwitch {
                firm,
                account,
                engaged,
            } => every(CommandBody::KillSwitch {
                firm: *firm,
                account: *account,
                engaged: *engaged,
            }),
            Action::EndOfDay { market } => match market {
                Some(m) => vec![(self.market_index(m)?, CommandBody::EndOfDay)],
                None => every(CommandBody::EndOfDay),
            },
        })
    }

    async fn execute(&self, action: &Action, asker: Asker<'_>) -> Answer {
        if let Action::AddAccount(a) = action {
            return self
                .add_accounts(std::slice::from_ref(a), asker)
                .await
                .into_answer(false);
        }
        let ts = unix_ns();
        let plan = match self.plan(action) {
            Ok(p) => p,
            Err(answer) => return answer,
        };
        let runs = plan.into_iter().map(|(core, body)| async move {
            let result = self
                .venue
                .submit(core, vec![Command::new(ts, body)], true, asker)
                .await;
            (core, result)
        });
        let results = futures_util::future::join_all(runs).await;
        let one_instrument = matches!(
            action,
            Action::SetPhase {
                instrument: Some(_),
                market: None,
                ..
            }
        );
        self.summarise(results, one_instrument)
    }

    /// One answer from each core's events: `applied` when no core refused, `rejected` (422)
    /// with the reasons when one did, `unavailable` (503) when a core did not answer. For a
    /// phase change of one instrument sent to every core, the cores without it are left out.
    fn summarise(&self, results: Vec<(usize, CoreAnswer)>, one_instrument: bool) -> Answer {
        let mut markets = Vec::new();
        let mut reasons = Vec::new();
        let mut unavailable = Vec::new();
        let mut applied_in = 0usize;
        for (core, result) in results {
            let name = self.markets[core].clone();
            match result {
                Err(e) => {
                    unavailable.push(format!("{name}: {e}"));
                    markets.push(json!({ "market": name, "error": e }));
                }
                Ok(per_command) => {
                    let events: Vec<Event> = per_command.into_iter().flatten().collect();
                    let rejected = events.iter().find_map(|e| match e {
                        Event::CommandRejected { reason, .. } => Some(*reason),
                        _ => None,
                    });
                    if one_instrument && rejected == Some(RejectReason::UnknownInstrument) {
                        continue;
                    }
                    match rejected {
                        Some(r) => reasons.push(json!({ "market": name, "reason": r })),
                        None => applied_in += 1,
                    }
                    markets.push(market_events(&name, &events));
                }
            }
        }
        if one_instrument && applied_in == 0 && reasons.is_empty() && unavailable.is_empty() {
            reasons.push(json!({ "market": null, "reason": RejectReason::UnknownInstrument }));
        }
        let (status, outcome) = if !unavailable.is_empty() {
            (503, "unavailable")
        } else if !reasons.is_empty() {
            (422, "rejected")
        } else {
            (200, "applied")
        };
        let mut body = json!({ "outcome": outcome, "markets": markets });
        if !reasons.is_empty() {
            body["rejections"] = Value::Array(reasons);
        }
        if !unavailable.is_empty() {
            body["error"] = Value::String(format!(
                "no answer from {}: the action may or may not have applied there; query before \
                 sending it again under a new request id",
                unavailable.join("; ")
            ));
        }
        Answer::new(status, body)
    }

    /// Adds accounts: in each core concerned, one command per account that adds it with its
    /// `cash` (`add_funded_account`: unordered, so independent accounts may be spread over
    /// several clients). An account that exists already is counted as such and gets no
    /// deposit, so a bulk addition sent again (after a broken connection, say) adds what is
    /// missing and deposits nothing twice; and since addition and deposit are one command,
    /// no account is ever left added but unfunded.
    pub(crate) async fn add_accounts(
        &self,
        accounts: &[NewAccount],
        asker: Asker<'_>,
    ) -> AccountsTally {
        let mut tally = AccountsTally::default();
        let mut per_core: Vec<Vec<&NewAccount>> = vec![Vec::new(); self.markets.len()];
        for a in accounts {
            match &a.markets {
                None => per_core.iter_mut().for_each(|v| v.push(a)),
                Some(names) => {
                    for n in names {
                        match self.markets.iter().position(|m| m == n) {
                            Some(c) => per_core[c].push(a),
                            None => tally.error(format!(
                                "account {}: no market {n:?} (markets: {})",
                                a.account,
                                self.markets.join(", ")
                            )),
                        }
                    }
                }
            }
        }
        let ts = unix_ns();
        let runs = per_core
            .into_iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
            .map(
                |(core, list)| async move { (core, self.add_in_core(core, list, ts, asker).await) },
            );
        for (core, result) in futures_util::future::join_all(runs).await {
            match result {
                Ok(t) => tally.merge(t),
                Err(e) => tally
                    .unavailable
                    .push(format!("{}: {e}", self.markets[core])),
            }
        }
        tally
    }

    async fn add_in_core(
        &self,
        core: usize,
        list: Vec<&NewAccount>,
        ts: u64,
        asker: Asker<'_>,
    ) -> Result<AccountsTally, String> {
        let mut tally = AccountsTally::default();
        let adds = list
            .iter()
            .map(|a| {
                let body = CommandBody::AddFundedAccount {
                    spec: a.spec(),
                    cash: a.cash,
                };
                Command::new(ts, body)
            })
            .collect();
        let t = std::time::Instant::now();
        let answers = self.venue.submit(core, adds, false, asker).await?;
        tally.additions_ns = t.elapsed().as_nanos() as u64;
        for (a, events) in list.iter().zip(&answers) {
            match reject_of(events) {
                None => {
                    tally.added += 1;
                    let deposited = events.iter().any(|e| {
                        matches!(
                            e,
                            Event::CashChanged {
                                reason: CashReason::Deposit,
                                ..
                            }
                        )
                    });
                    tally.funded += u64::from(deposited);
                }
                Some(RejectReason::DuplicateAccount) => tally.existing += 1,
                Some(r) => tally.reject(a.account, r),
            }
        }
        Ok(tally)
    }

    // ----- queries -----

    /// Every market's instruments with their phase, and the kill switches engaged.
    pub async fn instruments(&self) -> Answer {
        self.query_all(Query::Phases, |answer| {
            let QueryAnswer::Phases(p) = answer else {
                return Err("the core answered another query".into());
            };
            let instruments: Vec<Value> = p
                .instruments
                .iter()
                .map(|i| {
                    json!({
                        "instrument": i.instrument,
                        "symbol": i.symbol,
                        "market": i.market,
                        "phase": i.phase,
                        "reference_price": i.reference_price,
                    })
                })
                .collect();
            Ok(json!({
                "instruments": instruments,
                "kill_switches": {
                    "firms": p.suspended_firms,
                    "accounts": p.suspended_accounts,
                },
            }))
        })
        .await
    }

    /// One account's balances, positions and live orders (at most
    /// [`ORDERS_PER_QUERY_MAX`] per market), market by market.
    pub async fn account(&self, account: AccountId) -> Answer {
        let query = Query::Account { account: account.0 };
        self.query_all(query, |answer| {
            let QueryAnswer::Account(a) = answer else {
                return Err("the core answered another query".into());
            };
            let Some(v) = a.balances else {
                return Ok(Value::Null);
            };
            let positions: Vec<Value> = a
                .positions
                .iter()
                .map(|p| json!({ "instrument": p.instrument, "qty": p.qty, "cost": Cash(p.cost) }))
                .collect();
            let orders: Vec<Value> = a
                .orders
                .iter()
                .map(|o| {
                    json!({
                        "order_id": o.order_id, "cl_ord_id": o.cl_ord_id,
                        "instrument": o.instrument, "side": o.side, "price": o.price,
                        "qty_total": o.qty_total, "qty_filled": o.qty_filled,
                        "qty_leaves": o.qty_leaves, "tif": o.tif,
                    })
                })
                .collect();
            Ok(json!({
                "firm": v.firm, "cash": Cash(v.cash), "cash_reserved": Cash(v.cash_reserved),
                "margin_locked": Cash(v.margin_locked), "cash_free": Cash(v.cash_free),
                "kill_switch_engaged": v.kill_switch_engaged,
                "positions": positions, "orders": orders, "orders_truncated": a.orders_truncated,
            }))
        })
        .await
    }

    /// One instrument's order-level book (bids then asks, best first, then time; at most
    /// `bourse_cluster::query::BOOK_ANSWER_ORDERS_MAX` orders), market by market: `null` in a
    /// market whose core does not hold the instrument.
    pub async fn book(&self, instrument: InstrumentId) -> Answer {
        let query = Query::Book {
            instrument: instrument.0,
        };
        self.query_all(query, |answer| {
            let QueryAnswer::Book(b) = answer else {
                return Err("the core answered another query".into());
            };
            if !b.known {
                return Ok(Value::Null);
            }
            let orders: Vec<Value> = b
                .orders
                .iter()
                .map(|o| {
                    json!({
                        "order_id": o.order_id, "side": o.side, "price": o.price,
                        "qty": o.qty_display,
                    })
                })
                .collect();
            Ok(json!({
                "instrument": b.instrument, "applied_before_index": b.next_index,
                "orders_total": b.orders_total, "orders_truncated": b.orders_truncated,
                "orders": orders,
            }))
        })
        .await
    }

    /// Asks every core `query` and renders each answer with `render`, market by market.
    async fn query_all<F>(&self, query: Query, render: F) -> Answer
    where
        F: Fn(&QueryAnswer) -> Result<Value, String>,
    {
        let reads = (0..self.markets.len())
            .map(|core| async move { (core, self.venue.query(core, query).await) });
        let mut markets = Vec::new();
        for (core, result) in futures_util::future::join_all(reads).await {
            match result.and_then(|answer| render(&answer)) {
                Ok(v) => markets.push(json!({ "market": self.markets[core], "state": v })),
                Err(e) => {
                    return Answer::error(
                        503,
                        "unavailable",
                        format!("market {}: {e}", self.markets[core]),
                    )
                }
            }
        }
        Answer::new(200, json!({ "outcome": "ok", "markets": markets }))
    }
}

fn reject_of(events: &[Event]) -> Option<RejectReason> {
    events.iter().find_map(|e| match e {
        Event::CommandRejected { reason, .. } => Some(*reason),
        _ => None,
    })
}

fn market_events(name: &str, events: &[Event]) -> Value {
    let shown: Vec<&Event> = events
        .iter()
        .filter(|e| !matches!(e, Event::OrderLog(_)))
        .take(EVENTS_PER_MARKET_SHOWN_MAX)
        .collect();
    json!({ "market": name, "events": shown, "events_total": events.len() })
}

/// What an account addition did, over every core it went to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccountsTally {
    /// Account additions applied (one per account and core).
    pub added: u64,
    /// Accounts a core had already (no deposit made).
    pub existing: u64,
    /// Deposits applied.
    pub funded: u64,
    /// Refusals by reason.
    pub rejected: BTreeMap<String, u64>,
    /// The first refusals and input errors, as text.
    pub errors: Vec<String>,
    pub errors_total: u64,
    /// Cores that did not answer.
    pub unavailable: Vec<String>,
    /// Time spent submitting the (funded) additions, summed over the cores (which run side
    /// by side): where a bulk addition's time goes.
    pub additions_ns: u64,
}

impl AccountsTally {
    fn error(&mut self, e: String) {
        self.errors_total += 1;
        if self.errors.len() < BULK_ERRORS_SHOWN_MAX {
            self.errors.push(e);
        }
    }

    fn reject(&mut self, account: AccountId, r: RejectReason) {
        let name = serde_json::to_value(r)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        *self.rejected.entry(name.clone()).or_default() += 1;
        self.error(format!("account {account}: {name}"));
    }

    pub(crate) fn merge(&mut self, o: AccountsTally) {
        self.added += o.added;
        self.existing += o.existing;
        self.funded += o.funded;
        for (k, v) in o.rejected {
            *self.rejected.entry(k).or_default() += v;
        }
        for e in o.errors {
            if self.errors.len() < BULK_ERRORS_SHOWN_MAX {
                self.errors.push(e);
            }
        }
        self.errors_total += o.errors_total;
        self.unavailable.extend(o.unavailable);
        self.additions_ns += o.additions_ns;
    }

    /// The answer: `applied` (200) when nothing was refused, `rejected` (422) otherwise,
    /// `unavailable` (503) when a core did not answer. `one` words a single addition.
    pub(crate) fn into_answer(self, bulk: bool) -> Answer {
        let (status, outcome) = if !self.unavailable.is_empty() {
            (503, "unavailable")
        } else if self.errors_total > 0 {
            (422, "rejected")
        } else {
            (200, "applied")
        };
        let mut body = json!({
            "outcome": outcome,
            "accounts_added": self.added,
            "accounts_existing": self.existing,
            "deposits": self.funded,
            "rejected": self.rejected,
            "errors": self.errors,
            "errors_total": self.errors_total,
        });
        if bulk {
            body["bulk"] = Value::Bool(true);
        }
        if !self.unavailable.is_empty() {
            body["error"] = Value::String(format!(
                "no answer from {}: some additions may not have applied; send the same request \
                 again under a new request id (existing accounts are skipped and get no \
                 second deposit)",
                self.unavailable.join("; ")
            ));
        }
        Answer::new(status, body)
    }
}

impl AdminService {
    /// Answers and audits a request whose body could not be read as an action.
    pub fn invalid_input(&self, operator: &str, request_id: &str, message: String) -> Answer {
        let answer = Answer::error(400, "invalid", message);
        self.finish(operator, request_id, "unknown", Value::Null, 0, &answer);
        answer
    }

    /// A bulk account addition: `body` is a stream of NDJSON chunks, one [`NewAccount`] per
    /// line (blank lines skipped), read and submitted [`BULK_BATCH_ACCOUNTS`] at a time, so
    /// that a stream of millions holds one batch in memory. A line that does not parse stops
    /// the stream there (the answer names it and counts what was added before); what the cores
    /// refused is counted by reason and does not stop it. Runs once per request id.
    pub async fn bulk<S, B, E>(
        self: &Arc<Self>,
        operator: &str,
        request_id: &str,
        body: S,
    ) -> Answer
    where
        S: futures_util::Stream<Item = Result<B, E>> + Send + Unpin + 'static,
        B: AsRef<[u8]> + Send,
        E: std::fmt::Display + Send,
    {
        if let Err(e) = check_request_id(request_id) {
            discard_rest(body).await;
            return self.invalid_input(operator, request_id, e);
        }
        let this = Arc::clone(self);
        let request = json!({ "action": "add_accounts_bulk" });
        let (who, id) = (operator.to_string(), request_id.to_string());
        // The body goes to the run if this request id runs; otherwise (a repeat, a conflict)
        // it is still here after the answer.
        let holder = Arc::new(Mutex::new(Some(body)));
        let taken = Arc::clone(&holder);
        let answer = self
            .once(
                operator,
                request_id,
                "add_accounts_bulk",
                request,
                move || async move {
                    let asker = Asker {
                        operator: &who,
                        request_id: &id,
                    };
                    let body = taken.lock().expect("bulk body lock").take();
                    let body = body.expect("a request id runs once");
                    this.run_bulk(body, asker).await
                },
            )
            .await;
        let unread = holder.lock().expect("bulk body lock").take();
        if let Some(body) = unread {
            discard_rest(body).await;
        }
        answer
    }

    /// Reads the stream a batch at a time; while one batch is submitted, the next is read and
    /// parsed (so at most two batches are held).
    async fn run_bulk<S, B, E>(&self, body: S, asker: Asker<'_>) -> Answer
    where
        S: futures_util::Stream<Item = Result<B, E>> + Send + Unpin,
        B: AsRef<[u8]> + Send,
        E: std::fmt::Display + Send,
    {
        let started = std::time::Instant::now();
        let mut tally = AccountsTally::default();
        let mut reader = BulkReader::new(body);
        let mut read_ns = 0u64;
        let mut submit_ns = 0u64;
        let t = std::time::Instant::now();
        let mut next = reader.next_batch().await;
        read_ns += t.elapsed().as_nanos() as u64;
        while let Some(batch) = next.take().filter(|b| !b.is_empty()) {
            let t = std::time::Instant::now();
            let (done, (following, following_ns)) =
                futures_util::future::join(self.add_accounts(&batch, asker), async {
                    let t = std::time::Instant::now();
                    let b = reader.next_batch().await;
                    (b, t.elapsed().as_nanos() as u64)
                })
                .await;
            submit_ns += t.elapsed().as_nanos() as u64;
            read_ns += following_ns;
            tally.merge(done);
            if !tally.unavailable.is_empty() {
                break;
            }
            next = following;
        }
        let elapsed_ms = started.elapsed().as_millis() as u64;
        let added = tally.added;
        let timing = json!({
            "read_and_parse_ms": read_ns / 1_000_000,
            "submit_ms": submit_ns / 1_000_000,
            "additions_ms": tally.additions_ns / 1_000_000,
        });
        let mut answer = tally.into_answer(true);
        answer.body["lines"] = json!(reader.lines);
        answer.body["elapsed_ms"] = json!(elapsed_ms);
        answer.body["time"] = timing;
        answer.body["accounts_added_per_s"] = json!(added.saturating_mul(1000) / elapsed_ms.max(1));
        if let Some((status, e)) = reader.stop {
            discard_rest(reader.body).await;
            answer.status = status;
            answer.body["outcome"] = json!("invalid");
            answer.body["error"] = json!(format!(
                "{e}; the lines before it were submitted (see the counts), nothing after it"
            ));
        }
        answer
    }
}

/// Reads and throws away what is left of a request body that was answered before it was read,
/// up to [`BULK_DISCARD_BYTES_MAX`] and [`BULK_DISCARD_MS_MAX`]. A server that closes a
/// connection with unread bytes in its receive buffer resets it, and the reset can reach the
/// client before the answer does (or while it is still writing): the client would see a broken
/// connection instead of a refusal, or of the answer to its retry.
pub(crate) async fn discard_rest<S, B, E>(mut body: S)
where
    S: futures_util::Stream<Item = Result<B, E>> + Unpin,
    B: AsRef<[u8]>,
{
    use futures_util::StreamExt;
    let read = async {
        let mut bytes = 0u64;
        while let Some(Ok(chunk)) = body.next().await {
            bytes += chunk.as_ref().len() as u64;
            if bytes > BULK_DISCARD_BYTES_MAX {
                break;
            }
        }
    };
    let limit = std::time::Duration::from_millis(BULK_DISCARD_MS_MAX);
    // Past either limit the connection is closed as it stands.
    let _ = tokio::time::timeout(limit, read).await;
}

/// A bulk addition's body read into batches of [`BULK_BATCH_ACCOUNTS`] accounts.
struct BulkReader<S> {
    body: S,
    line: Vec<u8>,
    lines: u64,
    /// Why reading stopped early (the status and the message), once it did.
    stop: Option<(u16, String)>,
    ended: bool,
}

impl<S, B, E> BulkReader<S>
where
    S: futures_util::Stream<Item = Result<B, E>> + Send + Unpin,
    B: AsRef<[u8]> + Send,
    E: std::fmt::Display + Send,
{
    fn new(body: S) -> BulkReader<S> {
        BulkReader {
            body,
            line: Vec::with_capacity(256),
            lines: 0,
            stop: None,
            ended: false,
        }
    }

    /// The next batch (empty once the body ended or a line stopped it). A chunk is read
    /// whole, so a batch may run past [`BULK_BATCH_ACCOUNTS`] by one chunk's lines.
    async fn next_batch(&mut self) -> Option<Vec<NewAccount>> {
        use futures_util::StreamExt;
        let mut batch: Vec<NewAccount> = Vec::with_capacity(BULK_BATCH_ACCOUNTS);
        while !self.ended && batch.len() < BULK_BATCH_ACCOUNTS {
            let chunk = match self.body.next().await {
                None => {
                    self.ended = true;
                    if !self.line.is_empty() {
                        self.lines += 1;
                        if let Err(e) = take_line(&mut self.line, &mut batch, self.lines) {
                            self.stop = Some((400, e));
                        }
                    }
                    break;
                }
                Some(Err(e)) => {
                    self.stop = Some((400, format!("the request body broke off: {e}")));
                    self.ended = true;
                    break;
                }
                Some(Ok(chunk)) => chunk,
            };
            if let Err(e) = self.take_chunk(chunk.as_ref(), &mut batch) {
                self.stop = Some((400, e));
                self.ended = true;
            }
        }
        Some(batch)
    }

    fn take_chunk(&mut self, chunk: &[u8], batch: &mut Vec<NewAccount>) -> Result<(), String> {
        for &b in chunk {
            if b != b'\n' {
                if self.line.len() == BULK_LINE_BYTES_MAX {
                    return Err(format!(
                        "line {}: longer than {BULK_LINE_BYTES_MAX} bytes",
                        self.lines + 1
                    ));
                }
                self.line.push(b);
                continue;
            }
            self.lines += 1;
            take_line(&mut self.line, batch, self.lines)?;
            if self.lines > BULK_LINES_MAX {
                return Err(format!("more than {BULK_LINES_MAX} lines"));
            }
        }
        Ok(())
    }
}

/// Parses one bulk line into `batch` (a blank line is skipped).
fn take_line(line: &mut Vec<u8>, batch: &mut Vec<NewAccount>, number: u64) -> Result<(), String> {
    let text = std::str::from_utf8(line).map_err(|_| format!("line {number}: not UTF-8"))?;
    let text = text.trim();
    if !text.is_empty() {
        let account: NewAccount =
            serde_json::from_str(text).map_err(|e| format!("line {number}: {e}"))?;
        account.check().map_err(|e| format!("line {number}: {e}"))?;
        batch.push(account);
    }
    line.clear();
    Ok(())
}
