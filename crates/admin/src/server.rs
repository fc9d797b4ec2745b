//! [`AdminServer`]: the admin API's listener.
//!
//! Routes (JSON answers; every one but `/healthz` needs an operator's credentials as HTTP
//! Basic, checked against a `bourse_auth::CredentialStore` off the runtime's workers, since
//! a check costs tens of milliseconds by design):
//!
//! - `POST /v1/actions`: one [`Action`](crate::Action) (role `operator`), `X-Request-Id`
//!   required;
//! - `POST /v1/accounts/bulk`: NDJSON, one [`NewAccount`](crate::NewAccount) per line,
//!   streamed (role `operator`), `X-Request-Id` required;
//! - `GET /v1/instruments`, `GET /v1/instruments/{id}/book`, `GET /v1/accounts/{id}`: queries
//!   (role `operator` or `viewer`);
//! - `GET /healthz`.
//!
//! A request without valid credentials is answered 401, one whose operator lacks the role
//! 403; both are counted (`bourse_admin_auth_refused_total`) and audited. The listener binds
//! the loopback over plain HTTP, or any address over HTTPS ([`AdminServerConfig::tls`]).

use crate::service::{AdminService, Answer};
use crate::Action;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use bourse_auth::CredentialStore;
use bourse_core::{AccountId, InstrumentId};
use bourse_monitor::doorkeeper::Doorkeeper;
use bourse_monitor::server::{serve_admitted, ServeOptions};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The role that may change the venue (every action).
pub const ROLE_OPERATOR: &str = "operator";
/// The role that may only query.
pub const ROLE_VIEWER: &str = "viewer";
/// The header that carries a request's id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
/// The largest body of one action.
pub const ACTION_BODY_BYTES_MAX: usize = 64 * 1024;

/// The listener's limits.
#[derive(Clone, Debug)]
pub struct AdminServerConfig {
    /// Where to listen: a loopback address, or any with [`AdminServerConfig::tls`] (the
    /// operators' passwords cross no network in clear).
    pub listen: SocketAddr,
    /// Connections open at once; a newcomer past it displaces the connection that has waited
    /// longest for its request (an idle socket), so idle sockets never keep an operator out.
    pub connections_max: usize,
    /// Connections from one address waiting for their request at once; a newcomer past it
    /// displaces its own address's longest-waiting one.
    pub waiting_per_address_max: usize,
    /// The time a connection has to send its request head (and, with TLS, to finish the
    /// handshake before it).
    pub header_read_timeout_ms: u64,
    /// The server's certificate and key (`bourse_auth::tls::server_config`): the API speaks
    /// HTTPS only.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl AdminServerConfig {
    pub fn new(listen: SocketAddr) -> AdminServerConfig {
        AdminServerConfig {
            listen,
            connections_max: 64,
            waiting_per_address_max: 16,
            header_read_timeout_ms: 5_000,
            tls: None,
        }
    }

    /// The listener's admission limits (`bourse_admission`).
    pub fn admission(&self) -> bourse_admission::Limits {
        bourse_admission::Limits::new(
            self.connections_max,
            self.waiting_per_address_max,
            self.header_read_timeout_ms,
        )
    }
}

struct Shared {
    service: Arc<AdminService>,
    credentials: Arc<CredentialStore>,
}

/// The running listener; [`AdminServer::stop`] (or dropping it) stops it.
pub struct AdminServer {
    addr: SocketAddr,
    https: bool,
    stop: watch::Sender<bool>,
}

impl AdminServer {
    /// Binds `config.listen` and serves on the current tokio runtime.
    pub async fn start(
        service: Arc<AdminService>,
        credentials: Arc<CredentialStore>,
        config: AdminServerConfig,
    ) -> std::io::Result<AdminServer> {
        if !config.listen.ip().is_loopback() && config.tls.is_none() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the admin API binds {} only with TLS (operators' passwords must not \
                     cross a network in clear); plain HTTP binds loopback addresses only",
                    config.listen
                ),
            ));
        }
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = watch::channel(false);
        let app = router(Arc::new(Shared {
            service: Arc::clone(&service),
            credentials,
        }));
        let limits = config.admission();
        limits
            .validate("admin API")
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let door = Doorkeeper::new("admin", limits, service.registry());
        let https = config.tls.is_some();
        let options = ServeOptions {
            header_read_timeout_ms: config.header_read_timeout_ms,
            tls: config.tls,
            send_buffer_bytes: None,
        };
        tokio::spawn(serve_admitted(listener, app, door, options, stopped));
        Ok(AdminServer { addr, https, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://ADDR` with TLS, `http://ADDR` without.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route(
            "/v1/actions",
            post(action).layer(DefaultBodyLimit::max(ACTION_BODY_BYTES_MAX)),
        )
        // A bulk stream is bounded by its line count and read a batch at a time.
        .route(
            "/v1/accounts/bulk",
            post(bulk).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/instruments", get(instruments))
        .route("/v1/instruments/{id}/book", get(book))
        .route("/v1/accounts/{id}", get(account))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(shared)
}

fn respond(answer: Answer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut body = answer.body.to_string();
    body.push('\n');
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Reads HTTP Basic credentials: (name, password). Public for the other operator APIs
/// (clearing's run API) that check the same credential store.
pub fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    bourse_auth::http_basic(headers.get(header::AUTHORIZATION)?.to_str().ok()?)
}

/// The operator's name if the credentials are right and hold one of `roles`; otherwise the
/// refusal (401 or 403), counted and audited.
async fn authenticate(
    s: &Shared,
    headers: &HeaderMap,
    roles: &'static [&'static str],
    what: &str,
) -> Result<String, Response> {
    let Some((name, password)) = basic_credentials(headers) else {
        s.service.refused("", what, "unauthenticated");
        return Err(unauthenticated("credentials required (HTTP Basic)"));
    };
    let store = Arc::clone(&s.credentials);
    let checked_name = name.clone();
    let check = tokio::task::spawn_blocking(move || {
        store
            .verify(&checked_name, &password)
            .map(|id| roles.iter().any(|r| id.has_role(r)))
    })
    .await;
    match check {
        Ok(Ok(true)) => Ok(name),
        Ok(Ok(false)) => {
            s.service.refused(&name, what, "unauthorised");
            Err(respond(Answer::error(
                403,
                "refused",
                format!("{name} holds none of the roles {roles:?} this request needs"),
            )))
        }
        _ => {
            s.service.refused(&name, what, "unauthenticated");
            Err(unauthenticated("invalid credentials"))
        }
    }
}

fn unauthenticated(message: &str) -> Response {
    let mut r = respond(Answer::error(401, "refused", message));
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Basic realm=\"bourse admin\""),
    );
    r
}

fn request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

async fn action(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let operator = match authenticate(&s, &headers, &[ROLE_OPERATOR], "action").await {
        Ok(name) => name,
        Err(refusal) => return refusal,
    };
    let Some(id) = request_id(&headers) else {
        return respond(s.service.invalid_input(
            &operator,
            "",
            format!("the {REQUEST_ID_HEADER} header is required: a retry under the same id applies once"),
        ));
    };
    match serde_json::from_slice::<Action>(&body) {
        Ok(a) => respond(s.service.run(&operator, &id, a).await),
        Err(e) => respond(
            s.service
                .invalid_input(&operator, &id, format!("action: {e}")),
        ),
    }
}

async fn bulk(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let operator = match authenticate(&s, &headers, &[ROLE_OPERATOR], "add_accounts_bulk").await {
        Ok(name) => name,
        Err(refusal) => {
            crate::service::discard_rest(body.into_data_stream()).await;
            return refusal;
        }
    };
    let Some(id) = request_id(&headers) else {
        crate::service::discard_rest(body.into_data_stream()).await;
        return respond(s.service.invalid_input(
            &operator,
            "",
            format!("the {REQUEST_ID_HEADER} header is required"),
        ));
    };
    respond(
        s.service
            .bulk(&operator, &id, body.into_data_stream())
            .await,
    )
}

async fn instruments(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(refusal) =
        authenticate(&s, &headers, &[ROLE_OPERATOR, ROLE_VIEWER], "instruments").await
    {
        return refusal;
    }
    respond(s.service.instruments().await)
}

async fn book(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<u32>) -> Response {
    if let Err(refusal) = authenticate(&s, &headers, &[ROLE_OPERATOR, ROLE_VIEWER], "book").await {
        return refusal;
    }
    respond(s.service.book(InstrumentId(id)).await)
}

async fn account(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(id): Path<u32>,
) -> Response {
    if let Err(refusal) = authenticate(&s, &headers, &[ROLE_OPERATOR, ROLE_VIEWER], "account").await
    {
        return refusal;
    }
    respond(s.service.account(AccountId(id)).await)
}
