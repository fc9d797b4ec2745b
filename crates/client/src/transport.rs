//! The byte stream a client talks through: plain TCP, or TLS (rustls) over it.
//!
//! A gateway may serve a session only over TLS (`tls_required`). [`TlsClient`] is what a client
//! needs for that: the authorities it trusts (a PEM file read by the venue's one loader,
//! `bourse_auth::tls::load_roots`) and the name the gateway's certificate must carry. The
//! handshake is finished when [`Stream::connect`] returns, so a gateway whose certificate is
//! not trusted fails the connect, saying why, before any Logon is sent.

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How to reach a gateway over TLS: the trusted authorities and the gateway's name.
#[derive(Clone, Debug)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

impl TlsClient {
    /// Trusts the authorities of the PEM file `ca_path` and expects a certificate for
    /// `server_name` (a DNS name or an IP address).
    pub fn from_ca_file(ca_path: &Path, server_name: &str) -> Result<TlsClient, String> {
        let roots = bourse_auth::tls::load_roots(ca_path, "tls_ca")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        TlsClient::new(Arc::new(config), server_name)
    }

    /// Runs the handshake over the connected `tcp` (to `addr`), each read and write within
    /// `timeout`: a server whose certificate is not trusted, or does not carry the name,
    /// fails here, saying why. The stream keeps the read timeout.
    pub fn handshake(
        &self,
        mut tcp: TcpStream,
        addr: &SocketAddr,
        timeout: Duration,
    ) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
        let mut conn = ClientConnection::new(Arc::clone(&self.config), self.server_name.clone())
            .map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
        tcp.set_read_timeout(Some(timeout))?;
        tcp.set_write_timeout(Some(timeout))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)
                .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake with {addr}: {e}")))?;
        }
        tcp.set_write_timeout(None)?;
        Ok(StreamOwned::new(conn, tcp))
    }

    /// The rustls configuration (for an async connector: the delivery clients).
    pub fn config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }

    /// The name the server's certificate must carry.
    pub fn server_name(&self) -> ServerName<'static> {
        self.server_name.clone()
    }

    /// A client configuration made elsewhere, and the gateway's name.
    pub fn new(config: Arc<ClientConfig>, server_name: &str) -> Result<TlsClient, String> {
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| format!("TLS server name {server_name:?}: {e}"))?;
        Ok(TlsClient {
            config,
            server_name,
        })
    }
}

/// A connected stream, plain or TLS, with the socket calls the clients use.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// Connects within `timeout` and, over TLS, completes the handshake within it too.
    pub(crate) fn connect(
        addr: &SocketAddr,
        timeout: Duration,
        tls: Option<&TlsClient>,
    ) -> io::Result<Stream> {
        let tcp = TcpStream::connect_timeout(addr, timeout)?;
        tcp.set_nodelay(true)?;
        let Some(tls) = tls else {
            return Ok(Stream::Plain(tcp));
        };
        Ok(Stream::Tls(Box::new(tls.handshake(tcp, addr, timeout)?)))
    }

    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    /// The socket's descriptor, for a caller that waits on several sessions with poll(2).
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.tcp().as_fd()
    }

    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.tcp().set_nonblocking(on)
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.tcp().set_read_timeout(timeout)
    }

    /// Ends the connection (over TLS, says so to the peer first, as far as the socket takes it).
    pub(crate) fn shutdown(&mut self) -> io::Result<()> {
        if let Stream::Tls(s) = self {
            s.conn.send_close_notify();
            let _ = s.conn.complete_io(&mut s.sock);
        }
        self.tcp().shutdown(Shutdown::Both)
    }

    /// A second handle for writing from another thread: plain TCP only (a TLS session's state
    /// cannot be shared between two writers).
    pub(crate) fn try_clone_plain(&self) -> io::Result<TcpStream> {
        match self {
            Stream::Plain(s) => s.try_clone(),
            Stream::Tls(_) => Err(io::Error::new(
                ErrorKind::Unsupported,
                "a separate writer is available over plain TCP only",
            )),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}
