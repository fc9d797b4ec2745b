//! [`AdminClient`]: a blocking client of the admin API, just enough HTTP/1.1 for it (one
//! request per connection, `Connection: close`, the answer read to its end), over plain TCP
//! (`http://`, for a listener on the loopback) or TLS (`https://`, trusting the authorities
//! of a CA file). Used by `bourse admin`, the tests and the benchmark.

use base64ct::{Base64, Encoding};
use bourse_client::TlsClient;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

/// The largest answer read.
pub const ANSWER_BYTES_MAX: usize = 16 << 20;

/// A client for one admin API address and operator.
#[derive(Clone, Debug)]
pub struct AdminClient {
    addr: SocketAddr,
    /// `host:port` as the URL gives it: the `Host` header.
    hostport: String,
    /// The host as the URL gives it: the name the server's certificate must carry.
    host: String,
    https: bool,
    tls: Option<TlsClient>,
    authorization: Option<String>,
    timeout: Duration,
}

/// An answer: the HTTP status and the JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

/// One connection, plain or TLS.
trait Connection: Read + Write {}
impl<T: Read + Write> Connection for T {}

impl AdminClient {
    /// A client of `addr`: `host:port`, or a URL `http://host:port` or `https://host:port`
    /// (an `https` one needs [`AdminClient::with_ca_file`] before its first request).
    pub fn new(addr: &str) -> Result<AdminClient, String> {
        let (https, rest) = match addr.split_once("://") {
            Some(("http", rest)) => (false, rest),
            Some(("https", rest)) => (true, rest),
            Some((scheme, _)) => {
                return Err(format!(
                    "admin address {addr:?}: scheme {scheme:?} is not http or https"
                ))
            }
            None => (false, addr),
        };
        let hostport = rest.trim_end_matches('/');
        let resolved = hostport
            .to_socket_addrs()
            .map_err(|e| format!("admin address {hostport:?}: {e} (use HOST:PORT)"))?
            .next()
            .ok_or_else(|| format!("admin address {hostport:?}: resolves to no address"))?;
        let host = match hostport.rsplit_once(':') {
            Some((host, _)) => host.trim_start_matches('[').trim_end_matches(']'),
            None => hostport,
        };
        Ok(AdminClient {
            addr: resolved,
            hostport: hostport.to_string(),
            host: host.to_string(),
            https,
            tls: None,
            authorization: None,
            timeout: Duration::from_secs(600),
        })
    }

    /// Over `https`, trusts the authorities of the PEM file `ca_path` for the server's
    /// certificate, which must name the URL's host.
    pub fn with_ca_file(mut self, ca_path: &Path) -> Result<AdminClient, String> {
        self.tls = Some(TlsClient::from_ca_file(ca_path, &self.host)?);
        Ok(self)
    }

    /// Sends these credentials with every request (HTTP Basic).
    pub fn with_credentials(mut self, name: &str, password: &str) -> AdminClient {
        let plain = format!("{name}:{password}");
        let mut buf = vec![0u8; plain.len().div_ceil(3) * 4 + 4];
        let encoded = Base64::encode(plain.as_bytes(), &mut buf).unwrap_or_default();
        self.authorization = Some(format!("Basic {encoded}"));
        self
    }

    /// How long one request may take (connect, send, answer).
    pub fn with_timeout(mut self, timeout: Duration) -> AdminClient {
        self.timeout = timeout;
        self
    }

    pub fn get(&self, path: &str) -> Result<Reply, String> {
        self.request(
            "GET",
            path,
            None,
            "application/json",
            &mut std::io::empty(),
            0,
        )
    }

    /// Posts one action under `request_id`.
    pub fn action(&self, request_id: &str, action: &Value) -> Result<Reply, String> {
        let body = action.to_string();
        self.request(
            "POST",
            "/v1/actions",
            Some(request_id),
            "application/json",
            &mut body.as_bytes(),
            body.len() as u64,
        )
    }

    /// Posts a JSON body to `path` (another operator API on the same client: clearing's).
    pub fn post_json(
        &self,
        path: &str,
        request_id: Option<&str>,
        body: &Value,
    ) -> Result<Reply, String> {
        let body = body.to_string();
        self.request(
            "POST",
            path,
            request_id,
            "application/json",
            &mut body.as_bytes(),
            body.len() as u64,
        )
    }

    /// Streams `len` bytes of NDJSON from `body` to the bulk account addition.
    pub fn bulk_accounts(
        &self,
        request_id: &str,
        body: &mut dyn Read,
        len: u64,
    ) -> Result<Reply, String> {
        self.request(
            "POST",
            "/v1/accounts/bulk",
            Some(request_id),
            "application/x-ndjson",
            body,
            len,
        )
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        request_id: Option<&str>,
        content_type: &str,
        body: &mut dyn Read,
        len: u64,
    ) -> Result<Reply, String> {
        let fail = |e: std::io::Error| format!("admin API at {}: {e}", self.addr);
        if self.https && self.tls.is_none() {
            return Err(format!(
                "admin API at {}: an https URL needs the authority that signed the server's \
                 certificate (a CA file)",
                self.addr
            ));
        }
        let tcp = TcpStream::connect_timeout(&self.addr, self.timeout).map_err(fail)?;
        tcp.set_read_timeout(Some(self.timeout)).map_err(fail)?;
        tcp.set_write_timeout(Some(self.timeout)).map_err(fail)?;
        let mut stream: Box<dyn Connection> = match &self.tls {
            Some(tls) if self.https => {
                Box::new(tls.handshake(tcp, &self.addr, self.timeout).map_err(fail)?)
            }
            _ => Box::new(tcp),
        };
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\n",
            self.hostport
        );
        if let Some(a) = &self.authorization {
            head.push_str(&format!("Authorization: {a}\r\n"));
        }
        if let Some(id) = request_id {
            head.push_str(&format!("X-Request-Id: {id}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).map_err(fail)?;
        let sent = match std::io::copy(&mut body.take(len), &mut stream) {
            Ok(sent) => sent,
            // A server may answer before it has read the whole body (a refusal, a repeated
            // request id) and close: its answer, if it arrived, says more than the write's
            // error.
            Err(e) => return read_answer(&mut stream).map_err(|_| fail(e)),
        };
        if sent != len {
            return Err(format!("the body ended after {sent} of {len} bytes"));
        }
        read_answer(&mut stream).map_err(|e| match e {
            AnswerError::Io(e) => fail(e),
            AnswerError::Invalid(e) => e,
        })
    }
}

/// Why an answer could not be read.
enum AnswerError {
    Io(std::io::Error),
    Invalid(String),
}

/// Reads an answer to its end (the request asked the server to close after it) and parses it.
fn read_answer(stream: &mut dyn Connection) -> Result<Reply, AnswerError> {
    let mut answer = Vec::new();
    match stream
        .take(ANSWER_BYTES_MAX as u64 + 1)
        .read_to_end(&mut answer)
    {
        Ok(_) => {}
        // A TLS server that closes without its close_notify after answering: the answer
        // is whole if it parses.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(e) => return Err(AnswerError::Io(e)),
    }
    if answer.len() > ANSWER_BYTES_MAX {
        return Err(AnswerError::Invalid(format!(
            "answer longer than {ANSWER_BYTES_MAX} bytes"
        )));
    }
    parse_reply(&answer).map_err(AnswerError::Invalid)
}

fn parse_reply(bytes: &[u8]) -> Result<Reply, String> {
    let split = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no end of head")?;
    let head = std::str::from_utf8(&bytes[..split]).map_err(|_| "the answer head is not text")?;
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {:?}", head.lines().next()))?;
    let body = &bytes[split + 4..];
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()))
    };
    Ok(Reply { status, body })
}
