//! The clearing node's HTTP/JSON API (clearing data access).
//!
//! Queries. A node with credentials answers the account and firm queries only to them (HTTP
//! Basic): roles `operator` and `viewer` see every account, a role `firm:N` sees firm N's
//! accounts alone (another's: 403), no credentials: 401. A node without credentials (which
//! validation keeps on loopback) answers everyone.
//! - `GET /v1/accounts/{id}`: the account's firm, cash per core, and per instrument its
//!   position, average cost, realised P&L, variation margin paid and still open at the last
//!   trade price, and obligations since the last run; the clearing business date the last
//!   end of day rolled to, and per position the day's figures: the opening position
//!   (`sod_qty`), lots traded, realised P&L, variation margin paid, and for futures the
//!   day's variation as `start_of_day_mtm` and `trade_variation`;
//! - `GET /v1/firms/{id}?after=&limit=`: the firm's accounts (a page of at most
//!   `limits.accounts_per_answer_max`) with each one's totals, and the firm's totals over the
//!   page;
//! - `GET /v1/settlements/{date}?firm=`: the equity and FX obligations that settle on a
//!   business day (`YYYY-MM-DD`), summed per account and instrument over the runs that dated
//!   them there (see `settlement`), the accounts the reader may read (of one firm with
//!   `firm`), at most `limits.accounts_per_answer_max` lines;
//! - `GET /v1/runs`, `GET /v1/runs/{id}` (the report), `GET /v1/runs/{id}/plan` (what a
//!   standby reads);
//! - `GET /v1/status` (cut, the cores' ends, pending runs, feed errors), `GET /metrics`,
//!   `GET /healthz`.
//!
//! Operator actions (HTTP Basic, role `operator`, checked against the node's credential
//! store off the runtime's workers): `POST /v1/runs` (a [`RunRequest`]; a known `run_id`
//! resumes that run) and `POST /v1/takeover` (a standby becomes the primary). A node without
//! credentials (on loopback) takes them from any program of its host without credentials,
//! but not from a web page (a request with an `Origin` header: 403). Errors are
//! `{"error":{"code":..,"message":..}}` with 400, 401, 403, 404, 409 or 503.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bourse_core::{format_scaled, AccountId, FirmId, InstrumentId, Market, CASH_SCALE};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::fees::FeeSchedule;
use crate::node::{RunRequest, Shared};
use crate::state::{trade_value, value_to_cash_floor, ClearingState};

/// The role that may run clearings (and read every account).
pub const ROLE_OPERATOR: &str = "operator";
/// The role that may read every account.
pub const ROLE_VIEWER: &str = "viewer";
/// The role prefix of a firm's credentials: `firm:12` reads firm 12's accounts.
pub const ROLE_FIRM_PREFIX: &str = "firm:";

/// Whose clearing data a client may read (over HTTP or FIX).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reader {
    Everyone,
    Firm(FirmId),
}

impl Reader {
    pub(crate) fn may_read(self, firm: Option<FirmId>) -> bool {
        match self {
            Reader::Everyone => true,
            Reader::Firm(own) => firm == Some(own),
        }
    }
}

/// Why credentials read no clearing data.
pub(crate) enum Refusal {
    /// Unknown name or wrong password.
    Invalid,
    /// Right password, but no role that reads clearing data.
    NoRole(String),
}

/// The reader `name`'s credentials make, checked against the node's store (an Argon2 check:
/// run it off an async runtime's workers): roles `operator` and `viewer` read every account,
/// `firm:N` firm N's. The one rule for HTTP and FIX.
pub(crate) fn reader_of(
    store: &bourse_auth::CredentialStore,
    name: &str,
    password: &str,
) -> Result<Reader, Refusal> {
    let id = store.verify(name, password).map_err(|_| Refusal::Invalid)?;
    if id.has_role(ROLE_OPERATOR) || id.has_role(ROLE_VIEWER) {
        return Ok(Reader::Everyone);
    }
    id.roles
        .iter()
        .filter_map(|r| r.strip_prefix(ROLE_FIRM_PREFIX))
        .find_map(|f| f.parse::<u32>().ok())
        .map(|f| Reader::Firm(FirmId(f)))
        .ok_or_else(|| {
            Refusal::NoRole(format!(
                "{name} holds no role that reads clearing data ({ROLE_OPERATOR}, {ROLE_VIEWER} or {ROLE_FIRM_PREFIX}N)"
            ))
        })
}

/// The reader the request's credentials make: see the module documentation.
async fn reader(s: &Shared, headers: &HeaderMap) -> Result<Reader, Response> {
    if s.credentials.is_empty() {
        return Ok(Reader::Everyone);
    }
    let Some((name, password)) = bourse_admin::server::basic_credentials(headers) else {
        return Err(unauthenticated("credentials required (HTTP Basic)"));
    };
    let store = Arc::clone(&s.credentials);
    let check = tokio::task::spawn_blocking(move || reader_of(&store, &name, &password)).await;
    match check {
        Ok(Ok(reader)) => Ok(reader),
        Ok(Err(Refusal::NoRole(why))) => Err(error(StatusCode::FORBIDDEN, "refused", why)),
        _ => Err(unauthenticated("invalid credentials")),
    }
}

fn not_yours(what: &str) -> Response {
    error(
        StatusCode::FORBIDDEN,
        "refused",
        format!("{what} belongs to another firm: a firm's credentials read its own accounts only"),
    )
}

/// The largest body of a run request.
const RUN_BODY_BYTES_MAX: usize = 4 * 1024;

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = json!({ "error": { "code": code, "message": message.into() } });
    (status, axum::Json(body)).into_response()
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/accounts/{id}", get(account))
        .route("/v1/firms/{id}", get(firm))
        .route("/v1/settlements/{date}", get(settlements))
        .route("/v1/runs", get(runs).post(run))
        .route("/v1/runs/{id}", get(run_report))
        .route("/v1/runs/{id}/plan", get(run_plan))
        .route("/v1/takeover", post(takeover))
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .layer(DefaultBodyLimit::max(RUN_BODY_BYTES_MAX))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "not_found",
                "unknown path: see GET /v1/accounts/{id}, /v1/firms/{id}, /v1/runs, /v1/status",
            )
        })
        .with_state(shared)
}

fn cash(v: i128) -> String {
    format_scaled(v, CASH_SCALE)
}

/// One account's clearing data (and its totals in cash units, for firm sums).
fn account_json(
    state: &ClearingState,
    fees: Option<&FeeSchedule>,
    account: AccountId,
) -> (Value, [i128; 3]) {
    let mut positions = Vec::new();
    let mut totals = [0i128; 3]; // realised, variation margin paid, variation margin open
                                 // Initial margin per core, as a run would compute it now (`initial_margins`).
    let mut im_of_core: std::collections::BTreeMap<usize, i128> = Default::default();
    for (instrument, p) in state.account_positions(account) {
        let Some(def) = state.definition(instrument) else {
            continue;
        };
        let realised = value_to_cash_floor(def, p.realised_value);
        totals[0] += realised;
        let mut line = json!({
            "instrument": instrument.0,
            "market": def.market,
            "qty": p.qty,
            "lots_bought": p.lots_bought,
            "lots_sold": p.lots_sold,
            "cost": cash(value_to_cash_floor(def, p.cost_value)),
            "realised_pnl": cash(realised),
            "sod_qty": p.sod.qty,
            "day_lots_bought": p.day_lots_bought(),
            "day_lots_sold": p.day_lots_sold(),
            "day_realised_pnl": cash(value_to_cash_floor(def, p.day_realised_value())),
        });
        if def.market == Market::Futures {
            // Variation margin still open: the position marked to the instrument's last
            // trade, less what runs paid (what the next run would pay at that price).
            let last = state
                .instruments()
                .get(&instrument)
                .and_then(|s| s.recent.back())
                .map(|t| t.price);
            let open = last
                .and_then(|price| trade_value(def, price, p.qty).ok())
                .map(|marked| value_to_cash_floor(def, marked - p.paid_value) - p.vm_paid.0);
            totals[1] += p.vm_paid.0;
            totals[2] += open.unwrap_or(0);
            let im = state.position_initial_margin(instrument, p.qty);
            let core = state.instruments().get(&instrument).map_or(0, |s| s.core);
            *im_of_core.entry(core).or_default() += im;
            line["initial_margin"] = json!(cash(im));
            line["variation_margin_paid"] = json!(cash(p.vm_paid.0));
            line["variation_margin_open"] = json!(open.map(cash));
            line["mark_price"] = json!(last.map(|p| p.0));
            line["day_variation_margin_paid"] = json!(cash(p.day_vm_paid().0));
            // The day's variation split as FIX's SMTM and TVAR (see `fix::futures_amounts`).
            let sod_settlement = state
                .instruments()
                .get(&instrument)
                .and_then(|s| s.sod_settlement);
            line["sod_settlement_price"] = json!(sod_settlement.map(|p| p.0));
            if let Some(mark) = last {
                for (name, amount) in crate::fix::futures_amounts(def, &p, mark, sod_settlement) {
                    match name {
                        "SMTM" => line["start_of_day_mtm"] = json!(cash(amount)),
                        "TVAR" => line["trade_variation"] = json!(cash(amount)),
                        _ => {}
                    }
                }
            }
        } else {
            line["obligations"] =
                json!({ "securities": p.securities_due, "cash": cash(p.cash_due.0) });
        }
        positions.push(line);
    }
    let debts: BTreeMap<usize, i128> = state
        .account_debts(account)
        .into_iter()
        .map(|(core, d)| (core, d.0))
        .collect();
    let cash_lines: Vec<Value> = state
        .account_cash(account)
        .into_iter()
        .map(|(core, c)| {
            json!({
                "core": core,
                "cash": cash(c.cash.0),
                "deposited": cash(c.deposited.0),
                "withdrawn": cash(c.withdrawn.0),
                "initial_margin": cash(im_of_core.get(&core).copied().unwrap_or(0)),
                "margin_called": cash(c.margin_called.0),
                "debt": cash(debts.get(&core).copied().unwrap_or(0)),
            })
        })
        .collect();
    let v = json!({
        "account": account.0,
        "firm": state.firm_of(account).map(|f| f.0),
        "business_date": state.business_date(),
        "cash": cash_lines,
        "positions": positions,
        "realised_pnl": cash(totals[0]),
        "variation_margin_paid": cash(totals[1]),
        "variation_margin_open": cash(totals[2]),
        "initial_margin": cash(im_of_core.values().sum()),
        "margin_called": cash(state.account_cash(account).iter().map(|(_, c)| c.margin_called.0).sum()),
        "fees_paid": cash(state.fees_paid(account).0),
        "fees_due": cash(fees_due(state, fees, account)),
        // What runs could not collect: the next run debits it again.
        "debt": cash(debts.values().sum()),
    });
    (v, totals)
}

/// The fees the next run would charge `account` for what it traded since the last.
fn fees_due(state: &ClearingState, fees: Option<&FeeSchedule>, account: AccountId) -> i128 {
    let Some(schedule) = fees else {
        return 0;
    };
    state
        .fee_bases()
        .of_account(account)
        .filter_map(|(&(_, i), base)| {
            let def = state.definition(i)?;
            Some(base.fee(def, schedule.rate_of(def)?))
        })
        .sum()
}

fn cut_json(state: &ClearingState) -> Value {
    json!({ "cut": state.cut(), "as_of_ts_ns": state.last_ts_ns() })
}

async fn account(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<u32>,
) -> Response {
    let reader = match reader(&s, &headers).await {
        Ok(r) => r,
        Err(refusal) => return refusal,
    };
    let inner = s.inner.read().expect("state");
    let state = &inner.state;
    let account = AccountId(id);
    // A firm learns nothing of other accounts, not even whether they exist.
    if !reader.may_read(state.firm_of(account)) {
        return not_yours(&format!("account {id}"));
    }
    if state.firm_of(account).is_none() && state.account_positions(account).next().is_none() {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_account",
            format!("account {id} has neither been added nor traded on the cores clearing follows"),
        );
    }
    let (mut v, _) = account_json(state, s.config.fees.as_ref(), account);
    v["as_of"] = cut_json(state);
    axum::Json(v).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FirmParams {
    after: Option<u32>,
    limit: Option<usize>,
}

async fn firm(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<u32>,
    query: Result<Query<FirmParams>, QueryRejection>,
) -> Response {
    match reader(&s, &headers).await {
        Ok(r) if r.may_read(Some(FirmId(id))) => {}
        Ok(_) => return not_yours(&format!("firm {id}")),
        Err(refusal) => return refusal,
    }
    let params = match query {
        Ok(Query(p)) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e.body_text()),
    };
    let max = s.config.limits.accounts_per_answer_max;
    let limit = params.limit.unwrap_or(max);
    if limit == 0 || limit > max {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("limit must be 1..={max}, not {limit}"),
        );
    }
    let inner = s.inner.read().expect("state");
    let state = &inner.state;
    let mut accounts = Vec::new();
    let mut totals = [0i128; 3];
    let mut more = false;
    for a in state.firm_accounts(FirmId(id), params.after.map(AccountId)) {
        if accounts.len() == limit {
            more = true;
            break;
        }
        let (v, t) = account_json(state, s.config.fees.as_ref(), a);
        for (sum, x) in totals.iter_mut().zip(t) {
            *sum += x;
        }
        accounts.push(v);
    }
    if accounts.is_empty() && params.after.is_none() {
        return error(
            StatusCode::NOT_FOUND,
            "unknown_firm",
            format!("firm {id} has no account on the cores clearing follows"),
        );
    }
    let next_after = more.then(|| accounts.last().map(|a| a["account"].clone()));
    axum::Json(json!({
        "firm": id,
        "accounts": accounts,
        "next_after": next_after.flatten(),
        "page_totals": {
            "realised_pnl": cash(totals[0]),
            "variation_margin_paid": cash(totals[1]),
            "variation_margin_open": cash(totals[2]),
        },
        "as_of": cut_json(state),
    }))
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettlementParams {
    firm: Option<u32>,
}

async fn settlements(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(date): Path<String>,
    query: Result<Query<SettlementParams>, QueryRejection>,
) -> Response {
    let reader = match reader(&s, &headers).await {
        Ok(r) => r,
        Err(refusal) => return refusal,
    };
    let params = match query {
        Ok(Query(p)) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e.body_text()),
    };
    if let Some(f) = params.firm {
        if !reader.may_read(Some(FirmId(f))) {
            return not_yours(&format!("firm {f}"));
        }
    }
    if bourse_admin::schedule::day_of_date(&date).is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("{date:?} is not a date YYYY-MM-DD"),
        );
    }
    let inner = s.inner.read().expect("state");
    let state = &inner.state;
    // Per account and instrument: securities, cash, and the runs that dated them here.
    let mut sums: BTreeMap<(AccountId, InstrumentId), (i64, i128, Vec<u32>)> = BTreeMap::new();
    // The date index gives only that day's obligations; the sums stop growing one line past
    // the limit, since the answer is then a refusal, so the work and memory are bounded by
    // the day's obligations and the limit, not by every run kept.
    let max = s.config.limits.accounts_per_answer_max;
    for (run_id, o) in inner.obligations_on(&date) {
        let firm = state.firm_of(o.account);
        if !reader.may_read(firm) || params.firm.is_some_and(|f| firm != Some(FirmId(f))) {
            continue;
        }
        if sums.len() == max && !sums.contains_key(&(o.account, o.instrument)) {
            return error(
                StatusCode::BAD_REQUEST,
                "too_many",
                format!(
                    "more than {max} lines settle on {date}, more than one answer holds: ask per firm (?firm=N)"
                ),
            );
        }
        let sum = sums.entry((o.account, o.instrument)).or_default();
        sum.0 += o.securities;
        sum.1 += o.cash.0;
        sum.2.push(run_id);
    }
    let lines: Vec<Value> = sums
        .into_iter()
        .map(|((account, instrument), (securities, cash_due, runs))| {
            json!({
                "account": account.0,
                "firm": state.firm_of(account).map(|f| f.0),
                "instrument": instrument.0,
                "symbol": state.definition(instrument).map(|d| d.symbol.clone()),
                "securities": securities,
                "cash": cash(cash_due),
                "runs": runs,
            })
        })
        .collect();
    axum::Json(json!({ "settlement_date": date, "lines": lines })).into_response()
}

async fn runs(State(s): State<Arc<Shared>>) -> Response {
    let inner = s.inner.read().expect("state");
    let list: Vec<Value> = inner
        .runs
        .values()
        .map(|r| {
            json!({
                "run_id": r.plan.run_id,
                "kind": r.plan.kind,
                "cut": r.plan.cut,
                "movements": r.plan.movements.len(),
                "settled": inner.state.last_settled_run() >= r.plan.run_id,
                "pending_commands": r.report.as_ref().map(|rep| rep.pending),
            })
        })
        .collect();
    axum::Json(json!({ "runs": list })).into_response()
}

fn bad_run_id(text: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "bad_request",
        format!("run id {text:?} is not a number"),
    )
}

fn unknown_run(id: u32) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "unknown_run",
        format!("no run {id} here"),
    )
}

/// A run's report and plan list every firm's accounts: only readers of every account
/// (`operator`, `viewer`) read them; a firm's credentials read its own accounts instead.
async fn every_account_reader(s: &Shared, headers: &HeaderMap) -> Result<(), Response> {
    match reader(s, headers).await? {
        Reader::Everyone => Ok(()),
        Reader::Firm(_) => Err(error(
            StatusCode::FORBIDDEN,
            "refused",
            "a run's report and plan list every firm's accounts: operator or viewer \
             credentials read them; a firm reads its own at /v1/firms/{id} and /v1/accounts/{id}",
        )),
    }
}

async fn run_report(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(refused) = every_account_reader(&s, &headers).await {
        return refused;
    }
    let Ok(id) = id.parse::<u32>() else {
        return bad_run_id(&id);
    };
    let inner = s.inner.read().expect("state");
    match inner.runs.get(&id) {
        Some(r) => match &r.report {
            Some(report) => axum::Json(report).into_response(),
            None => error(
                StatusCode::NOT_FOUND,
                "no_report",
                format!("run {id} is known (read from the primary) but has no report here"),
            ),
        },
        None => unknown_run(id),
    }
}

async fn run_plan(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(refused) = every_account_reader(&s, &headers).await {
        return refused;
    }
    let Ok(id) = id.parse::<u32>() else {
        return bad_run_id(&id);
    };
    let plan = s
        .inner
        .read()
        .expect("state")
        .runs
        .get(&id)
        .map(|r| r.plan.clone());
    match plan {
        Some(p) => axum::Json(&*p).into_response(),
        None => unknown_run(id),
    }
}

async fn status(State(s): State<Arc<Shared>>) -> Response {
    let ends = s.stream_ends.lock().expect("ends").clone();
    let feeds = s.feed_errors.lock().expect("feed errors").clone();
    let inner = s.inner.read().expect("state");
    let runs: BTreeMap<u32, bool> = inner
        .runs
        .keys()
        .map(|&id| (id, inner.state.last_settled_run() >= id))
        .collect();
    axum::Json(json!({
        "cut": inner.state.cut(),
        "stream_ends": ends,
        "as_of_ts_ns": inner.state.last_ts_ns(),
        "positions": inner.state.positions().len(),
        "trades": inner.state.trades(),
        "last_settled_run": inner.state.last_settled_run(),
        "runs_settled": runs,
        "standby": s.is_standby(),
        "feed_errors": feeds,
        "limits": s.config.limits,
    }))
    .into_response()
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let mut text = String::with_capacity(8 * 1024);
    s.metrics.registry.render(&mut text);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        text,
    )
        .into_response()
}

/// Whether the request may act as an operator (run a clearing, take over). With credentials
/// in the config, it must carry an operator's (HTTP Basic). Without any, validation has kept
/// the node on a loopback address, so everyone who reaches it is a process of this host and
/// may act, except a web page (see [`web_page_refusal`]).
async fn operator(s: &Shared, headers: &HeaderMap) -> Result<(), Response> {
    if s.credentials.is_empty() {
        return web_page_refusal(headers).map_or(Ok(()), Err);
    }
    authenticate(s, headers).await
}

/// The refusal of an operator action sent by a web browser to a node without credentials.
/// A page from anywhere, open in a browser on this host, can post to a loopback address (a
/// cross-site form, or a host name rebound to 127.0.0.1), and nothing else would stop it
/// running a clearing. Browsers put an `Origin` header on every POST and let no page remove
/// it, while the command line and other programs send none, so its presence marks a page.
fn web_page_refusal(headers: &HeaderMap) -> Option<Response> {
    let origin = headers.get(header::ORIGIN)?;
    Some(error(
        StatusCode::FORBIDDEN,
        "refused",
        format!(
            "a request with an Origin header ({}) comes from a web page: this node has no \
             [[operators]], so it takes runs and takeovers only from programs on its host \
             (the command line, curl), never from a browser",
            String::from_utf8_lossy(origin.as_bytes())
        ),
    ))
}

/// Accepts the request if its credentials are right and hold the operator role.
async fn authenticate(s: &Shared, headers: &HeaderMap) -> Result<(), Response> {
    let Some((name, password)) = bourse_admin::server::basic_credentials(headers) else {
        return Err(unauthenticated("credentials required (HTTP Basic)"));
    };
    let store = Arc::clone(&s.credentials);
    let checked = name.clone();
    let check = tokio::task::spawn_blocking(move || {
        store
            .verify(&checked, &password)
            .map(|id| id.has_role(ROLE_OPERATOR))
    })
    .await;
    match check {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => Err(error(
            StatusCode::FORBIDDEN,
            "refused",
            format!("{name} does not hold the role {ROLE_OPERATOR}"),
        )),
        _ => Err(unauthenticated("invalid credentials")),
    }
}

fn unauthenticated(message: &str) -> Response {
    let mut r = error(StatusCode::UNAUTHORIZED, "refused", message);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"bourse clearing\""),
    );
    r
}

async fn run(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(refusal) = operator(&s, &headers).await {
        return refusal;
    }
    let request: RunRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", format!("run: {e}")),
    };
    // The run goes on in a task of its own, so that a client hanging up cannot stop it
    // half way (it would resume under its id, but need not).
    let task = tokio::spawn(async move { s.run(request).await });
    match task.await {
        Ok(Ok(report)) => axum::Json(report).into_response(),
        Ok(Err(e)) => {
            let status =
                StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            error(status, "run_refused", e.message)
        }
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "run_failed",
            e.to_string(),
        ),
    }
}

async fn takeover(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(refusal) = operator(&s, &headers).await {
        return refusal;
    }
    let was = s.is_standby();
    s.takeover();
    axum::Json(json!({ "standby": false, "was_standby": was })).into_response()
}

/// Serves until `stopped` changes, on the venue's HTTP accept loop with the node's
/// admission limits (`bourse_monitor::server::serve_admitted`).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, stopped: watch::Receiver<bool>) {
    let limits = &shared.config.limits;
    let door = bourse_monitor::doorkeeper::Doorkeeper::new(
        "clearing_http",
        limits.admission(),
        Some(&shared.metrics.registry),
    );
    let options = bourse_monitor::server::ServeOptions {
        header_read_timeout_ms: limits.header_read_timeout_ms,
        tls: None,
        send_buffer_bytes: None,
    };
    bourse_monitor::server::serve_admitted(listener, router(shared), door, options, stopped).await
}
