//! [`DeliveryClient`]: a Rust client of the HTTP API, one keep-alive connection, just enough
//! HTTP/1.1 for it (`Content-Length` bodies, which is what the server sends); and
//! [`AnyClient`], either front's client behind one type.

use super::api::{ApiError, ClientError, PollAnswer, PollRequest};
use super::binary::BinaryClient;
use super::conn::{connect, Access, Conn};
use serde::Deserialize;
use std::net::SocketAddr;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The largest answer the client reads; a longer one is refused.
pub const ANSWER_BYTES_MAX: usize = 256 << 20;
/// The longest response head the client reads.
const HEAD_BYTES_MAX: usize = 16 * 1024;

/// A client of one delivery node.
pub struct DeliveryClient {
    addr: SocketAddr,
    conn: Option<BufReader<Conn>>,
    access: Access,
    /// The `Authorization` header value of `access.credentials`.
    authorization: Option<String>,
}

impl DeliveryClient {
    pub fn new(addr: SocketAddr) -> DeliveryClient {
        DeliveryClient {
            addr,
            conn: None,
            access: Access::default(),
            authorization: None,
        }
    }

    /// The same client over TLS and/or with credentials (sent as HTTP Basic with every
    /// request; the node checks them once and remembers the result for a while).
    pub fn with_access(mut self, access: Access) -> DeliveryClient {
        self.authorization = access
            .credentials
            .as_ref()
            .map(|(n, p)| bourse_auth::http_basic_value(n, p));
        self.access = access;
        self.conn = None;
        self
    }

    /// One GetOrders poll.
    pub async fn poll(&mut self, req: &PollRequest) -> Result<PollAnswer, ClientError> {
        let (status, body) = self.get(&req.path()).await?;
        if status != 200 {
            return Err(api_error(status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// The node's `/v1/status` document.
    pub async fn status(&mut self) -> Result<serde_json::Value, ClientError> {
        let (status, body) = self.get("/v1/status").await?;
        if status != 200 {
            return Err(api_error(status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// `GET path` on the kept connection (reconnecting once if the server closed it);
    /// returns the status and the body.
    pub async fn get(&mut self, path: &str) -> Result<(u16, Vec<u8>), ClientError> {
        let fresh = self.conn.is_none();
        match self.exchange(path).await {
            Ok(r) => Ok(r),
            Err(ClientError::Io(_)) if !fresh => {
                self.conn = None;
                self.exchange(path).await
            }
            Err(e) => Err(e),
        }
    }

    async fn exchange(&mut self, path: &str) -> Result<(u16, Vec<u8>), ClientError> {
        if self.conn.is_none() {
            let s = connect(self.addr, self.access.tls.as_ref()).await?;
            self.conn = Some(BufReader::new(s));
        }
        let conn = self.conn.as_mut().expect("connected");
        let result = request(conn, self.addr, path, self.authorization.as_deref()).await;
        if result.is_err() {
            self.conn = None;
        }
        result
    }
}

fn api_error(status: u16, body: &[u8]) -> ClientError {
    #[derive(Deserialize)]
    struct Wrapper {
        error: ApiError,
    }
    match serde_json::from_slice::<Wrapper>(body) {
        Ok(w) => ClientError::Api {
            status,
            error: w.error,
        },
        Err(_) => ClientError::Protocol(format!(
            "status {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )),
    }
}

async fn request(
    conn: &mut BufReader<Conn>,
    addr: SocketAddr,
    path: &str,
    authorization: Option<&str>,
) -> Result<(u16, Vec<u8>), ClientError> {
    let head = match authorization {
        Some(a) => format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {a}\r\n\r\n"),
        None => format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n"),
    };
    conn.get_mut().write_all(head.as_bytes()).await?;
    conn.get_mut().flush().await?;
    let mut line = String::new();
    let mut status = None;
    let mut length = None;
    let mut read = 0;
    loop {
        line.clear();
        let n = conn.read_line(&mut line).await?;
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        read += n;
        if read > HEAD_BYTES_MAX {
            return Err(ClientError::Protocol("response head too long".into()));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if status.is_none() {
            status = l
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse::<u16>().ok())
                .or(Some(0));
        } else if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse::<usize>().ok();
            }
        }
    }
    let status = status.filter(|s| *s != 0);
    let (Some(status), Some(length)) = (status, length) else {
        return Err(ClientError::Protocol(
            "no status line or no Content-Length".into(),
        ));
    };
    if length > ANSWER_BYTES_MAX {
        return Err(ClientError::Protocol(format!(
            "answer of {length} bytes is above {ANSWER_BYTES_MAX}"
        )));
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body).await?;
    Ok((status, body))
}

/// Either front's client behind one type: both take the same [`PollRequest`] and give the
/// same [`PollAnswer`] (cursors are the same bytes, in hex), so a program picks its front
/// with one argument.
pub enum AnyClient {
    Http(DeliveryClient),
    Binary(BinaryClient),
}

impl AnyClient {
    /// A client of the HTTP front at `addr`.
    pub fn http(addr: SocketAddr) -> AnyClient {
        AnyClient::Http(DeliveryClient::new(addr))
    }

    /// A client of the binary front at `addr`.
    pub fn binary(addr: SocketAddr) -> AnyClient {
        AnyClient::Binary(BinaryClient::new(addr))
    }

    /// The same client over TLS and/or with credentials (see [`Access`]).
    pub fn with_access(self, access: Access) -> AnyClient {
        match self {
            AnyClient::Http(c) => AnyClient::Http(c.with_access(access)),
            AnyClient::Binary(c) => AnyClient::Binary(c.with_access(access)),
        }
    }

    /// One GetOrders poll.
    pub async fn poll(&mut self, req: &PollRequest) -> Result<PollAnswer, ClientError> {
        match self {
            AnyClient::Http(c) => c.poll(req).await,
            AnyClient::Binary(c) => c.poll(req).await,
        }
    }
}
