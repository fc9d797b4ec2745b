//! The HTTP server: dashboard page, event stream, `/metrics`, `/api/frame`, `/healthz`.
//!
//! It runs on a thread of its own with a current-thread tokio runtime, so the control plane
//! takes at most one core's worth of time and never runs on a hot thread. [`serve_admitted`],
//! the accept loop of every HTTP listener of the venue, is there (instead of `axum::serve`) for
//! the limits: the venue's admission policy on accept ([`crate::doorkeeper`]), headers within
//! `header_read_timeout_ms`, request heads capped at [`REQUEST_HEAD_BYTES_MAX`], each socket's
//! send buffer small where asked, and an event-stream client the dashboard cuts off as slow
//! has its connection closed through a per-connection [`Notify`].

use crate::dashboard::{tick, Dashboard, Subscription};
use crate::doorkeeper::{Busy, Doorkeeper};
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
use tokio::sync::{oneshot, Notify};
use tower::ServiceExt;

/// The dashboard page: one self-contained file, no external resources.
pub const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// Request line and headers together may take at most this many bytes (hyper's minimum).
pub const REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;

/// Closes one connection when notified (the event stream found its client too slow).
#[derive(Clone)]
pub struct ConnKill(Arc<Notify>);

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

/// The dashboard's own listener: its connections admitted by the monitor's limits (the
/// dashboard and `/metrics` are read by browsers and Prometheus, each sending its request
/// right after connecting), counted as `listener="dashboard"`.
async fn serve(listener: TcpListener, monitor: Arc<Monitor>, shutdown: oneshot::Receiver<()>) {
    let config = monitor.config().clone();
    let door = Doorkeeper::new("dashboard", config.admission(), Some(monitor.registry()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = shutdown.await;
        let _ = stop.send(true);
    });
    let options = ServeOptions {
        header_read_timeout_ms: config.header_read_timeout_ms,
        tls: None,
        send_buffer_bytes: Some(config.send_buffer_bytes),
    };
    serve_admitted(listener, router(monitor), door, options, stopped).await
}

/// How [`serve_admitted`] serves each connection beyond its admission.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// A request head must arrive within this long (and, with TLS, the handshake before it).
    pub header_read_timeout_ms: u64,
    /// TLS with this server certificate (`bourse_auth::tls::server_config`), for an API whose
    /// requests carry passwords off the loopback; `None`: plain HTTP.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// Each socket's send buffer, bounding what a client that does not read holds.
    pub send_buffer_bytes: Option<usize>,
}

/// Serves `app` until `stopped` changes, on the one accept loop of every HTTP listener of the
/// venue (the dashboard and `/metrics`, the admin API, delivery's HTTP front, clearing's API),
/// which wraps hyper instead of `axum::serve` for the limits: each connection takes a
/// [`crate::doorkeeper::Pass`] of `door` on accept (the venue's admission policy: bounds in all and per address,
/// the longest-waiting idle connection displaced for a newcomer), proves itself with each
/// request head and waits again once the response is written; a request head must arrive
/// within `header_read_timeout_ms` and fit [`REQUEST_HEAD_BYTES_MAX`]. If `door` bounds
/// requests per second, each request carries its connection's [`crate::rate::ConnectionRate`]
/// as an extension; every request carries a [`ConnKill`] its handler may use to close the
/// connection.
pub async fn serve_admitted(
    listener: TcpListener,
    app: Router,
    door: Doorkeeper,
    options: ServeOptions,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let timeout = Duration::from_millis(options.header_read_timeout_ms);
    let tls = options.tls.clone().map(tokio_rustls::TlsAcceptor::from);
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
        let Some(pass) = door.admit(peer) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        if let Some(bytes) = options.send_buffer_bytes {
            let _ = socket2::SockRef::from(&stream).set_send_buffer_size(bytes);
        }
        let pass = Arc::new(pass);
        let kill = Arc::new(Notify::new());
        let app = app.clone();
        let rate = door.requests_per_s().map(crate::rate::ConnectionRate::new);
        let service = {
            let pass = Arc::clone(&pass);
            let conn_kill = ConnKill(kill.clone());
            hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                // The connection is busy from its request head until its response's body is
                // written, and may not be displaced meanwhile.
                let busy = pass.busy();
                req.extensions_mut().insert(conn_kill.clone());
                if let Some(rate) = &rate {
                    req.extensions_mut().insert(rate.clone());
                }
                let app = app.clone();
                async move {
                    let response = app.oneshot(req).await?;
                    Ok::<_, Infallible>(
                        response.map(|body| axum::body::Body::new(HeldBody { body, _busy: busy })),
                    )
                }
            })
        };
        let stopped = stopped.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let served = async {
                match tls {
                    None => serve_connection(stream, service, timeout).await,
                    Some(acceptor) => {
                        // A failed or late handshake closes the connection: nothing was read.
                        if let Ok(Ok(stream)) =
                            tokio::time::timeout(timeout, acceptor.accept(stream)).await
                        {
                            serve_connection(stream, service, timeout).await
                        }
                    }
                }
            };
            let mut stopped = stopped;
            tokio::select! {
                _ = served => {}
                _ = pass.closed() => {}
                _ = kill.notified() => {}
                _ = stopped.changed() => {}
            }
        });
        // Lets the connections just admitted read their requests before the next accepts,
        // so a flood of connections cannot displace a client that already sent its request.
        tokio::task::yield_now().await;
    }
}

/// A response's body holding its connection busy until it is written (or dropped).
struct HeldBody {
    body: axum::body::Body,
    _busy: Busy,
}

impl http_body::Body for HeldBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serves HTTP/1.1 on one connection until it ends.
async fn serve_connection<S, Svc>(stream: S, service: Svc, timeout: Duration)
where
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
    let _ = builder
        .serve_connection(TokioIo::new(stream), service)
        .await;
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
