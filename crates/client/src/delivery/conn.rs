//! How a delivery client reaches its node: plain TCP (a node on the loopback), or TLS over it
//! (a node elsewhere, which refuses plain TCP), and the credentials it logs on with.

use crate::transport::TlsClient;
use std::net::SocketAddr;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// A connected byte stream, plain or TLS.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

pub(crate) type Conn = Box<dyn Stream>;

/// What a client brings to a node besides its address: TLS (the authorities it trusts and
/// the node's name) and credentials from the venue's credential store.
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub tls: Option<TlsClient>,
    /// (name, password).
    pub credentials: Option<(String, String)>,
}

/// Connects to `addr`, then runs the TLS handshake if `tls` is given: a node whose
/// certificate is not trusted, or does not carry the expected name, fails here.
pub(crate) async fn connect(addr: SocketAddr, tls: Option<&TlsClient>) -> std::io::Result<Conn> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    match tls {
        None => Ok(Box::new(tcp)),
        Some(t) => {
            let connector = tokio_rustls::TlsConnector::from(t.config());
            let stream = connector.connect(t.server_name(), tcp).await.map_err(|e| {
                std::io::Error::new(e.kind(), format!("TLS handshake with {addr}: {e}"))
            })?;
            Ok(Box::new(stream))
        }
    }
}
