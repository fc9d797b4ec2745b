//! [`DeliveryClient`]: a Rust client of the HTTP API, one keep-alive connection, just enough
//! HTTP/1.1 for it (`Content-Length` bodies, which is what the server sends). Used by
//! `bourse delivery tail`, the benchmark and the tests. It is not yet in the SDK
//! (`bourse-client`): this crate depends on the cluster (the consumer API), which the SDK
//! should not pull in; the client and the record types want a crate of their own first.

use crate::record::{Filter, Record};
use crate::server::{AnswerHeader, ApiError};
use serde::Deserialize;
use std::fmt::Write as _;
use std::net::SocketAddr;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The largest answer the client reads; a longer one is refused.
pub const ANSWER_BYTES_MAX: usize = 256 << 20;
/// The longest response head the client reads.
const HEAD_BYTES_MAX: usize = 16 * 1024;

/// One GetOrders request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollRequest {
    /// The cursor of the last answer; `None` reads a snapshot of the current state first.
    pub cursor: Option<String>,
    pub filter: Filter,
    pub limit: Option<usize>,
    pub wait_us: Option<u64>,
    pub min_rows: Option<usize>,
    /// Start at this time (ns since the epoch) instead of a cursor: HTTP only; the answer's
    /// cursor then serves either front.
    pub since_ns: Option<u64>,
}

impl PollRequest {
    /// The path and query string of this request.
    pub fn path(&self) -> String {
        let mut q = String::from("/v1/orders?");
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                let _ = write!(q, "{k}={v}&");
            }
        };
        add("cursor", self.cursor.clone());
        add("firm", self.filter.firm.map(|f| f.0.to_string()));
        add("account", self.filter.account.map(|a| a.0.to_string()));
        add(
            "instrument",
            self.filter.instrument.map(|i| i.0.to_string()),
        );
        add("limit", self.limit.map(|v| v.to_string()));
        add("wait_us", self.wait_us.map(|v| v.to_string()));
        add("min_rows", self.min_rows.map(|v| v.to_string()));
        add("since_ns", self.since_ns.map(|v| v.to_string()));
        q.pop();
        q
    }
}

/// One GetOrders answer.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct PollAnswer {
    pub header: AnswerHeader,
    pub records: Vec<Record>,
}

#[derive(Debug)]
pub enum ClientError {
    Io(std::io::Error),
    /// The server answered with an error (status and its JSON error).
    Api {
        status: u16,
        error: ApiError,
    },
    /// The answer is not what the API sends.
    Protocol(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "{e}"),
            ClientError::Api { status, error } => {
                write!(f, "{status} {}: {}", error.code, error.message)
            }
            ClientError::Protocol(why) => write!(f, "unexpected answer: {why}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> ClientError {
        ClientError::Io(e)
    }
}

/// A client of one delivery node.
pub struct DeliveryClient {
    addr: SocketAddr,
    conn: Option<BufReader<TcpStream>>,
}

impl DeliveryClient {
    pub fn new(addr: SocketAddr) -> DeliveryClient {
        DeliveryClient { addr, conn: None }
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
            let s = TcpStream::connect(self.addr).await?;
            s.set_nodelay(true)?;
            self.conn = Some(BufReader::new(s));
        }
        let conn = self.conn.as_mut().expect("connected");
        let result = request(conn, self.addr, path).await;
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
    conn: &mut BufReader<TcpStream>,
    addr: SocketAddr,
    path: &str,
) -> Result<(u16, Vec<u8>), ClientError> {
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    conn.get_mut().write_all(head.as_bytes()).await?;
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
    Binary(crate::binary::BinaryClient),
}

impl AnyClient {
    /// A client of the HTTP front at `addr`.
    pub fn http(addr: SocketAddr) -> AnyClient {
        AnyClient::Http(DeliveryClient::new(addr))
    }

    /// A client of the binary front at `addr`.
    pub fn binary(addr: SocketAddr) -> AnyClient {
        AnyClient::Binary(crate::binary::BinaryClient::new(addr))
    }

    /// One GetOrders poll.
    pub async fn poll(&mut self, req: &PollRequest) -> Result<PollAnswer, ClientError> {
        match self {
            AnyClient::Http(c) => c.poll(req).await,
            AnyClient::Binary(c) => c.poll(req).await,
        }
    }
}
