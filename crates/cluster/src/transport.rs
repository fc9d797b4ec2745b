//! The byte streams under the node protocol: plain TCP on the loopback, or mutual TLS
//! (rustls, ring) between any hosts, with certificates signed by the venue's authority.
//!
//! - [`TlsFiles`] (`[tls]` in `cluster.toml`, `tls` in a gateway's or a delivery node's core
//!   table): the authority and this process's certificate and key, PEM files.
//! - [`NodeStream`]: what a connection reads and writes, plain or TLS, split into halves for
//!   a reader and a writer task.
//! - [`dial`]: every connection a process opens to a node (a peer's RPCs, a gateway's link,
//!   the committed stream's consumers, status and admin calls) goes through it. A process
//!   names the nodes it reaches over TLS once ([`use_tls_for`]); a node off the loopback not
//!   so named is refused before any byte is sent, since plain TCP is for the loopback only.
//! - [`Acceptor`]: a node's side. Every connection takes a [`Pass`] of the venue's admission
//!   policy first (`bourse_monitor::doorkeeper`, listener `node`): at most `connections_max`,
//!   the connection that has waited longest for its first whole frame displaced for a
//!   newcomer, at most `waiting_per_address_max` such from one address, and a silent one
//!   closed after `first_frame_timeout_ms` (the node's connection task awaits
//!   [`Pass::closed`]). With TLS, every connection must complete a handshake with a
//!   certificate of the venue's authority within [`HANDSHAKE_TIMEOUT_MS`], at most
//!   [`HANDSHAKES_MAX`] at once; every refusal is counted by [`Refusal`] and logged with its
//!   reason (the first few of each kind, then one in [`REFUSALS_LOGGED_EVERY`]).
//! - [`PeerRole`]: whom an accepted connection speaks for. Any certificate of the venue's
//!   authority may submit, query and subscribe; only a node's may speak raft (append
//!   entries, votes, installing a snapshot). A node's certificate is one whose subjectAltName names one of
//!   the group's node hosts (as `docs/deploy.md` makes them); a gateway's or a service's link
//!   certificate names none. Plain TCP is on the loopback only, where every peer is trusted.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

pub use bourse_auth::tls::TlsFiles;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use bourse_monitor::doorkeeper::Doorkeeper;
pub use bourse_monitor::doorkeeper::Pass;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{self, ClientConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

/// How long a connect, and then a TLS handshake, may take before the node counts as
/// unreachable (a client) or the connection is dropped (a node).
pub const HANDSHAKE_TIMEOUT_MS: u64 = 2_000;
/// TLS handshakes a node runs at once; a connection arriving while all are taken is closed at
/// once and counted as `busy` (a flood of half-open handshakes cannot hold the node's memory).
pub const HANDSHAKES_MAX: usize = 64;
/// After the first [`REFUSALS_LOGGED_FIRST`] refusals of a kind, one in this many is logged.
pub const REFUSALS_LOGGED_EVERY: u64 = 1_000;
/// Refusals of each kind logged one by one before thinning out.
pub const REFUSALS_LOGGED_FIRST: u64 = 10;

/// The nodes this process reaches over TLS, and with which client configuration.
fn tls_book() -> &'static RwLock<BTreeMap<SocketAddr, Arc<ClientConfig>>> {
    static BOOK: OnceLock<RwLock<BTreeMap<SocketAddr, Arc<ClientConfig>>>> = OnceLock::new();
    BOOK.get_or_init(|| RwLock::new(BTreeMap::new()))
}

/// From now on, this process reaches the nodes at `nodes` over TLS with `config` (a process
/// has one identity in a venue: a gateway's, a delivery node's, a node's own). Called once at
/// start-up by whoever reads the configuration.
pub fn use_tls_for(nodes: &[SocketAddr], config: Arc<ClientConfig>) {
    let mut book = tls_book().write().expect("tls book lock");
    for addr in nodes {
        book.insert(*addr, config.clone());
    }
}

/// Loads `files` and reaches `nodes` over TLS with them (see [`use_tls_for`]); `None`: plain
/// TCP, which [`dial`] allows on the loopback only.
pub fn configure_client(nodes: &[SocketAddr], files: Option<&TlsFiles>) -> Result<(), String> {
    if let Some(files) = files {
        use_tls_for(nodes, files.client_config()?);
    }
    Ok(())
}

/// The client configuration this process uses for `addr`, if it reaches it over TLS.
pub fn tls_for(addr: SocketAddr) -> Option<Arc<ClientConfig>> {
    tls_book()
        .read()
        .expect("tls book lock")
        .get(&addr)
        .cloned()
}

/// Opens a connection to the node at `addr`: TLS if this process was told so
/// ([`use_tls_for`]), plain TCP on the loopback, refused otherwise.
pub async fn dial(addr: SocketAddr) -> io::Result<NodeStream> {
    dial_with(addr, tls_for(addr)).await
}

/// As [`dial`] with an explicit TLS client configuration (`None`: plain).
pub async fn dial_with(addr: SocketAddr, tls: Option<Arc<ClientConfig>>) -> io::Result<NodeStream> {
    if tls.is_none() {
        plain_allowed(addr)?;
    }
    let timeout = Duration::from_millis(crate::net::CONNECT_TIMEOUT_MS);
    let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
    tcp.set_nodelay(true)?;
    let Some(config) = tls else {
        return Ok(NodeStream::Plain(tcp));
    };
    let name = ServerName::IpAddress(addr.ip().into());
    let tls = tokio::time::timeout(
        Duration::from_millis(HANDSHAKE_TIMEOUT_MS),
        TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    Ok(NodeStream::Tls(Box::new(TlsStream::Client(tls))))
}

/// Plain TCP is for the loopback only.
fn plain_allowed(addr: SocketAddr) -> io::Result<()> {
    if addr.ip().is_loopback() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "plain TCP to {addr} refused: links off the loopback need TLS \
             (ca_path, cert_path, key_path; docs/deploy.md)"
        ),
    ))
}

/// One connection to or from a node.
pub enum NodeStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl NodeStream {
    /// A read half and a write half, for tasks of their own (plain TCP splits without a lock).
    pub fn into_split(self) -> (NodeReadHalf, NodeWriteHalf) {
        match self {
            NodeStream::Plain(s) => {
                let (r, w) = s.into_split();
                (NodeReadHalf::Plain(r), NodeWriteHalf::Plain(w))
            }
            NodeStream::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (NodeReadHalf::Tls(r), NodeWriteHalf::Tls(w))
            }
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, NodeStream::Tls(_))
    }
}

pub enum NodeReadHalf {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsStream<TcpStream>>),
}

pub enum NodeWriteHalf {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<TlsStream<TcpStream>>),
}

impl AsyncRead for NodeStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for NodeStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_flush(cx),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            NodeStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for NodeReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeReadHalf::Plain(s) => Pin::new(s).poll_read(cx, buf),
            NodeReadHalf::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for NodeWriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            NodeWriteHalf::Plain(s) => Pin::new(s).poll_write(cx, buf),
            NodeWriteHalf::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeWriteHalf::Plain(s) => Pin::new(s).poll_flush(cx),
            NodeWriteHalf::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            NodeWriteHalf::Plain(s) => Pin::new(s).poll_shutdown(cx),
            NodeWriteHalf::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Why a node refused a connection before reading any of its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// The peer presented no certificate.
    NoCertificate,
    /// The peer's certificate is not one the venue's authority signed (another authority,
    /// self-signed, expired, or otherwise invalid).
    UntrustedCertificate,
    /// The bytes were not TLS (a plain-TCP client, garbage).
    NotTls,
    /// The peer refused the node's certificate, or the handshake failed otherwise.
    HandshakeFailed,
    /// The peer did not finish its handshake within [`HANDSHAKE_TIMEOUT_MS`].
    HandshakeTimeout,
    /// [`HANDSHAKES_MAX`] handshakes were already under way.
    Busy,
    /// A peer whose certificate names no node of the group sent a raft request (append
    /// entries, vote, install snapshot): a client's identity cannot act as a replica.
    NotANode,
}

impl Refusal {
    pub const ALL: [Refusal; 7] = [
        Refusal::NoCertificate,
        Refusal::UntrustedCertificate,
        Refusal::NotTls,
        Refusal::HandshakeFailed,
        Refusal::HandshakeTimeout,
        Refusal::Busy,
        Refusal::NotANode,
    ];

    /// The reason's name in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::NoCertificate => "no_certificate",
            Refusal::UntrustedCertificate => "untrusted_certificate",
            Refusal::NotTls => "not_tls",
            Refusal::HandshakeFailed => "handshake_failed",
            Refusal::HandshakeTimeout => "handshake_timeout",
            Refusal::Busy => "busy",
            Refusal::NotANode => "not_a_node",
        }
    }

    /// The reason a failed handshake's error gives.
    fn of(e: &io::Error) -> Refusal {
        let tls = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
        match tls {
            Some(rustls::Error::NoCertificatesPresented) => Refusal::NoCertificate,
            Some(rustls::Error::InvalidCertificate(_)) => Refusal::UntrustedCertificate,
            Some(
                rustls::Error::InvalidMessage(_)
                | rustls::Error::InappropriateMessage { .. }
                | rustls::Error::InappropriateHandshakeMessage { .. },
            ) => Refusal::NotTls,
            _ => Refusal::HandshakeFailed,
        }
    }
}

/// Connections a node refused, by reason: its own (TLS and role) and its admission policy's.
#[derive(Debug)]
pub struct Refusals {
    counts: [AtomicU64; Refusal::ALL.len()],
    door: Doorkeeper,
}

impl Refusals {
    /// Counts one refusal and logs it (thinned out past the first few of its kind).
    pub fn count(&self, node: u64, why: Refusal, from: SocketAddr, detail: &str) {
        let n = self.counts[why as usize].fetch_add(1, Ordering::Relaxed) + 1;
        if n <= REFUSALS_LOGGED_FIRST || n.is_multiple_of(REFUSALS_LOGGED_EVERY) {
            eprintln!(
                "bourse node {node}: refused a connection from {from}: {} ({detail}; {n} so far)",
                why.name()
            );
        }
    }

    /// The count of one reason.
    pub fn get(&self, why: Refusal) -> u64 {
        self.counts[why as usize].load(Ordering::Relaxed)
    }

    /// The count of one reason of the admission policy (`full`, `displaced`, `timeout`, ...).
    pub fn admission(&self, why: bourse_admission::Refusal) -> u64 {
        self.door.refused(why)
    }

    /// Every reason's name with its count: [`Refusal::ALL`]'s, then the admission policy's.
    pub fn all(&self) -> Vec<(&'static str, u64)> {
        let own = Refusal::ALL.iter().map(|&r| (r.name(), self.get(r)));
        let admission = bourse_admission::Refusal::ALL
            .iter()
            .map(|&r| (r.name(), self.door.refused(r)));
        own.chain(admission).collect()
    }

    pub fn total(&self) -> u64 {
        self.all().iter().map(|(_, n)| n).sum()
    }
}

/// A node's side of its connections: plain, or TLS requiring a certificate of the venue's
/// authority.
#[derive(Clone)]
pub struct Acceptor {
    node: u64,
    tls: Option<TlsAcceptor>,
    handshakes: Arc<Semaphore>,
    refusals: Arc<Refusals>,
    door: Doorkeeper,
    /// The hosts of the group's nodes (IP addresses or DNS names, lower case), as their
    /// advertised addresses give them: a certificate naming one of them is a node's.
    node_hosts: Arc<Vec<String>>,
}

/// Whom an accepted connection speaks for (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerRole {
    /// A replica of the group (or any peer on the loopback): every request.
    Node,
    /// Another of the venue's processes (a gateway, a delivery or clearing service, a
    /// tool): submits, queries and subscriptions, never raft.
    Client,
}

impl Acceptor {
    /// `tls`: the node's server configuration (`None`: plain TCP, allowed on the loopback only;
    /// `ClusterConfig::validate` refuses any other address without `[tls]`). `node_hosts`: the
    /// hosts of the group's nodes' advertised addresses.
    pub fn new(
        node: u64,
        tls: Option<Arc<rustls::ServerConfig>>,
        node_hosts: Vec<String>,
        admission: bourse_admission::Limits,
    ) -> Acceptor {
        let door = Doorkeeper::new(&format!("bourse node {node}"), admission, None);
        Acceptor {
            node,
            tls: tls.map(TlsAcceptor::from),
            handshakes: Arc::new(Semaphore::new(HANDSHAKES_MAX)),
            refusals: Arc::new(Refusals {
                counts: Default::default(),
                door: door.clone(),
            }),
            door,
            node_hosts: Arc::new(
                node_hosts
                    .into_iter()
                    .map(|h| h.to_ascii_lowercase())
                    .collect(),
            ),
        }
    }

    /// The role of a peer that presented `certificate` (verified in the handshake).
    fn role_of(&self, certificate: Option<&[u8]>) -> PeerRole {
        let Some(der) = certificate else {
            return PeerRole::Client;
        };
        let (ips, dns) = bourse_auth::tls::names_in_certificate(der);
        let named = ips
            .iter()
            .map(|ip| ip.to_string())
            .chain(dns)
            .any(|name| self.node_hosts.contains(&name));
        if named {
            PeerRole::Node
        } else {
            PeerRole::Client
        }
    }

    pub fn refusals(&self) -> &Arc<Refusals> {
        &self.refusals
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A place for a connection just accepted from `from`, before its handshake (the venue's
    /// admission policy): when all `connections_max` are taken, the connection that has waited
    /// longest for its first whole frame is told to close (counted `displaced`) and its place
    /// given; if every connection has spoken, `None` (counted `full`), and the newcomer is
    /// dropped. Idle or slow sockets therefore never keep a real peer out: it speaks at once
    /// and so is never the longest-waiting for long.
    pub fn admit(&self, from: SocketAddr) -> Option<Pass> {
        self.door.admit(from)
    }

    /// Connections holding a place now.
    pub fn connections_open(&self) -> usize {
        self.door.open()
    }

    /// The accepted connection, after its handshake, and whom it speaks for; `None` if it was
    /// refused (counted and logged).
    pub async fn accept(&self, tcp: TcpStream, from: SocketAddr) -> Option<(NodeStream, PeerRole)> {
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return Some((NodeStream::Plain(tcp), PeerRole::Node));
        };
        let Ok(_permit) = self.handshakes.clone().try_acquire_owned() else {
            self.refusals.count(
                self.node,
                Refusal::Busy,
                from,
                "too many handshakes at once",
            );
            return None;
        };
        match tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), tls.accept(tcp))
            .await
        {
            Ok(Ok(s)) => {
                let role = self.role_of(
                    s.get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .map(|c| c.as_ref()),
                );
                Some((NodeStream::Tls(Box::new(TlsStream::Server(s))), role))
            }
            Ok(Err(e)) => {
                self.refusals
                    .count(self.node, Refusal::of(&e), from, &e.to_string());
                None
            }
            Err(_) => {
                self.refusals.count(
                    self.node,
                    Refusal::HandshakeTimeout,
                    from,
                    "no handshake in time",
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_tcp_is_allowed_on_the_loopback_only() {
        for ok in ["127.0.0.1:7001", "127.0.0.2:1", "[::1]:7001"] {
            assert!(plain_allowed(ok.parse().unwrap()).is_ok(), "{ok}");
        }
        for refused in ["10.1.0.11:7101", "0.0.0.0:7101", "[2001:db8::1]:7101"] {
            let e = plain_allowed(refused.parse().unwrap()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
            assert!(e.to_string().contains("need TLS"), "{e}");
        }
    }

    #[test]
    fn a_missing_or_empty_certificate_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.crt");
        std::fs::write(&empty, "").unwrap();
        let files = TlsFiles {
            ca_path: empty.clone(),
            cert_path: dir.path().join("none.crt"),
            key_path: dir.path().join("none.key"),
        };
        let e = files.server_config().unwrap_err();
        assert!(e.contains("ca_path") && e.contains("no certificate"), "{e}");
        let files = TlsFiles {
            ca_path: dir.path().join("missing-ca.crt"),
            ..files
        };
        let e = files.client_config().unwrap_err();
        assert!(e.contains("ca_path") && e.contains("missing-ca.crt"), "{e}");
    }
}
