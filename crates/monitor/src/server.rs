//! The HTTP server: dashboard page, event stream, `/metrics`, `/api/frame`, `/healthz`.
//!
//! It runs on a thread of its own with a current-thread tokio runtime, so the control plane
//! takes at most one core's worth of time and never runs on a hot thread. Its own accept loop
//! (instead of `axum::serve`) is there for the limits: connections past `connections_max` are
//! closed on accept, headers must arrive within `header_read_timeout_ms`, request heads are
//! capped at [`REQUEST_HEAD_BYTES_MAX`], each socket's send buffer is small, and an event-stream
//! client the dashboard cuts off as slow has its connection closed through a per-connection
//! [`Notify`].

use crate::dashboard::{tick, Dashboard, Subscription};
use crate::slots::ConnectionSlots;
use crate::Monitor;
use axum::extract::{Extension, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::stream::{self, StreamExt};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Notify, Semaphore};
use tower::ServiceExt;

/// The dashboard page: one self-contained file, no external resources.
pub const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// Request line and headers together may take at most this many bytes (hyper's minimum).
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;

/// Closes one connection when notified (the event stream found its client too slow).
#[derive(Clone)]
struct ConnKill(Arc<Notify>);

/// The running server; dropping it stops the server and joins its thread.
pub struct DashboardServer {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DashboardServer {
    /// Binds `addr` now (so a port in use is reported here) and serves on a new thread.
    /// Only loopback addresses are accepted: the dashboard has no authentication.
    pub fn start(monitor: Arc<Monitor>, addr: SocketAddr) -> std::io::Result<DashboardServer> {
        if !addr.ip().is_loopback() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the dashboard binds loopback addresses only (127.0.0.1 or ::1)",
            ));
        }
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("bourse-monitor".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    let sampler = tokio::spawn(sample(monitor.clone()));
                    serve(listener, monitor, rx).await;
                    sampler.abort();
                });
            })?;
        Ok(DashboardServer {
            addr,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}

impl Drop for DashboardServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn sample(monitor: Arc<Monitor>) {
    let mut every = tokio::time::interval(Duration::from_millis(monitor.config().tick_ms));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        tick(&monitor);
    }
}

pub fn router(monitor: Arc<Monitor>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/metrics", get(metrics))
        .route("/events", get(events))
        .route("/api/frame", get(frame))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(monitor)
}

async fn serve(listener: TcpListener, monitor: Arc<Monitor>, mut shutdown: oneshot::Receiver<()>) {
    let config = monitor.config().clone();
    let connections = Arc::new(Semaphore::new(config.connections_max));
    let refused = monitor.registry().counter(
        crate::names::HTTP_CONNECTIONS_REFUSED_TOTAL,
        "Connections closed on accept because the server was at its connection limit.",
        &[],
    );
    let app = router(monitor);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of file descriptors or similar: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            refused.inc();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(config.send_buffer_bytes);
        let kill = Arc::new(Notify::new());
        let app = app.clone();
        let conn_kill = ConnKill(kill.clone());
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(conn_kill.clone());
            app.clone().oneshot(req)
        });
        let timeout = Duration::from_millis(config.header_read_timeout_ms);
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .max_buf_size(REQUEST_HEAD_BYTES_MAX);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                _ = kill.notified() => {}
            }
        });
    }
}

/// Serves `app` until `stopped` changes, on an accept loop of its own for the limits that
/// `axum::serve` lacks: connections past `connections_max` are closed on accept, request
/// heads must arrive within `header_read_timeout_ms` and fit [`REQUEST_HEAD_BYTES_MAX`].
/// `connections_open` counts the connections open. The one such loop for a service's
/// HTTP/JSON API (data delivery, the admin API); [`serve_with_slots`] adds a limit per peer
/// address.
pub async fn serve_limited(
    listener: TcpListener,
    app: Router,
    connections_max: usize,
    header_read_timeout_ms: u64,
    connections_open: crate::metrics::Gauge,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    let slots = ConnectionSlots::new(connections_max, connections_max, connections_open);
    serve_with_slots(listener, app, slots, header_read_timeout_ms, stopped).await
}

/// [`serve_limited`] over TLS: every connection must complete a handshake with `tls` (the
/// server's certificate; `bourse_auth::tls::server_config`) within `header_read_timeout_ms`
/// before its request head is read, so a connection that never finishes one holds its slot
/// no longer than one that never sends a head. For an API whose requests carry passwords
/// and may cross a network (the admin API off the loopback).
pub async fn serve_limited_tls(
    listener: TcpListener,
    app: Router,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    connections_max: usize,
    header_read_timeout_ms: u64,
    connections_open: crate::metrics::Gauge,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    let slots = ConnectionSlots::new(connections_max, connections_max, connections_open);
    let tls = tokio_rustls::TlsAcceptor::from(tls);
    serve_accepted(
        listener,
        app,
        slots,
        header_read_timeout_ms,
        Some(tls),
        stopped,
    )
    .await
}

/// [`serve_limited`] with the connection limits of `slots` (in all and per peer address):
/// a connection without a slot is closed on accept. If the slots bound requests per second,
/// each connection's requests carry its [`crate::rate::ConnectionRate`] as an extension.
pub async fn serve_with_slots(
    listener: TcpListener,
    app: Router,
    slots: ConnectionSlots,
    header_read_timeout_ms: u64,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    serve_accepted(listener, app, slots, header_read_timeout_ms, None, stopped).await
}

/// [`serve_with_slots`] over TLS (`tls`: the server's certificate), the handshake within
/// `header_read_timeout_ms` as in [`serve_limited_tls`]: for an API with limits per peer
/// address whose requests carry passwords (data delivery off the loopback).
pub async fn serve_with_slots_tls(
    listener: TcpListener,
    app: Router,
    slots: ConnectionSlots,
    header_read_timeout_ms: u64,
    tls: Arc<tokio_rustls::rustls::ServerConfig>,
    stopped: tokio::sync::watch::Receiver<bool>,
) {
    let tls = tokio_rustls::TlsAcceptor::from(tls);
    serve_accepted(
        listener,
        app,
        slots,
        header_read_timeout_ms,
        Some(tls),
        stopped,
    )
    .await
}

/// The accept loop of [`serve_with_slots`] and [`serve_limited_tls`]: plain HTTP, or HTTP
/// after a TLS handshake with `tls`.
async fn serve_accepted(
    listener: TcpListener,
    app: Router,
    slots: ConnectionSlots,
    header_read_timeout_ms: u64,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let timeout = Duration::from_millis(header_read_timeout_ms);
    loop {
        let accepted = tokio::select! {
            _ = stopped.changed() => return,
            r = listener.accept() => r,
        };
        let Ok((stream, peer)) = accepted else {
            // Out of file descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(slot) = slots.try_take(peer.ip()) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let rate = slots.requests_per_s().map(crate::rate::ConnectionRate::new);
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            if let Some(rate) = &rate {
                req.extensions_mut().insert(rate.clone());
            }
            app.clone().oneshot(req)
        });
        let stopped = stopped.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tls {
                None => serve_connection(stream, service, timeout, stopped).await,
                Some(acceptor) => {
                    // A failed or late handshake closes the connection: nothing was read.
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(timeout, acceptor.accept(stream)).await
                    {
                        serve_connection(stream, service, timeout, stopped).await
                    }
                }
            }
        });
    }
}

/// Serves HTTP/1.1 on one connection until it ends or `stopped` changes.
async fn serve_connection<S, Svc>(
    stream: S,
    service: Svc,
    timeout: Duration,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    Svc: hyper::service::Service<hyper::Request<Incoming>, Response = Response, Error = Infallible>
        + Send
        + 'static,
    Svc::Future: Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeout)
        .max_buf_size(REQUEST_HEAD_BYTES_MAX);
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        _ = stopped.changed() => {}
    }
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        DASHBOARD_HTML,
    )
        .into_response()
}

async fn metrics(State(m): State<Arc<Monitor>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        m.render_metrics(),
    )
        .into_response()
}

async fn frame(State(m): State<Arc<Monitor>>) -> Response {
    match m.dashboard().latest() {
        Some(f) => (
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            f.to_string(),
        )
            .into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no frame yet\n").into_response(),
    }
}

async fn events(State(m): State<Arc<Monitor>>, kill: Option<Extension<ConnKill>>) -> Response {
    let kill = kill.map(|k| k.0 .0).unwrap_or_default();
    let Some(sub) = Dashboard::subscribe(&m, kill) else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            "too many dashboard clients\n",
        )
            .into_response();
    };
    let Subscription {
        history_json,
        rx,
        guard,
    } = sub;
    let hello = Event::default().event("hello").data(history_json);
    let frames = stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let f = rx.recv().await?;
        Some((
            Ok::<_, Infallible>(Event::default().event("frame").data(&*f)),
            (rx, guard),
        ))
    });
    let body = stream::once(async move { Ok::<_, Infallible>(hello) }).chain(frames);
    Sse::new(body)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
