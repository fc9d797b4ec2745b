//! Optional TLS for the access servers (rustls, sans-I/O, driven by the mio loop).
//!
//! A gateway with `tls_cert_path` and `tls_key_path` (PEM) may open TLS listeners beside its
//! plain ones (`fix_tls_listen`, `binary_tls_listen`): the same sessions, the same protocols,
//! inside TLS 1.2 or 1.3. [`Transport`] is what a connection reads and writes through, plain
//! TCP or a rustls `ServerConnection` over it; the loop does not otherwise know which.
//!
//! Writing: plaintext goes into rustls only once the ciphertext of the previous write has left
//! (`WouldBlock` otherwise), so unsent output stays in the connection's own buffer, where the
//! slow-consumer limit sees it. A TLS failure (handshake, bad record, plain bytes on a TLS port)
//! reads as `ErrorKind::InvalidData`, which the loop counts as `tls_error`.

use rustls::{ServerConfig, ServerConnection};
use std::io::{self, ErrorKind, Read, Write};
use std::path::Path;
use std::sync::Arc;

/// The server side of TLS from a certificate chain and a private key in PEM files (the
/// venue's one loader, `bourse_auth::tls`).
pub fn server_config(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerConfig>, String> {
    bourse_auth::tls::server_config(cert_path, key_path)
}

/// A connection's byte stream: plain TCP, or TLS over it.
pub(crate) enum Transport {
    Plain(mio::net::TcpStream),
    Tls(mio::net::TcpStream, Box<ServerConnection>),
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, e)
}

impl Transport {
    pub(crate) fn tcp(&mut self) -> &mut mio::net::TcpStream {
        match self {
            Transport::Plain(s) | Transport::Tls(s, _) => s,
        }
    }

    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Transport::Tls(..))
    }

    /// Sends what rustls holds for the peer (handshake messages, encrypted records) until the
    /// socket would block. Ok(true): nothing is left.
    pub(crate) fn flush_tls(&mut self) -> io::Result<bool> {
        let Transport::Tls(s, c) = self else {
            return Ok(true);
        };
        while c.wants_write() {
            match c.write_tls(s) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

impl Read for Transport {
    /// Plaintext, as a socket gives it: `Ok(0)` at the end, `WouldBlock` when none is there.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (s, c) = match self {
            Transport::Plain(s) => return s.read(buf),
            Transport::Tls(s, c) => (s, c),
        };
        loop {
            match c.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            match c.read_tls(s) {
                Ok(0) => return Ok(0),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
            if let Err(e) = c.process_new_packets() {
                // Tell the peer why (the alert rustls queued), as far as the socket takes it.
                let _ = c.write_tls(s);
                return Err(tls_error(e));
            }
            while c.wants_write() {
                match c.write_tls(s) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Transport::Plain(s) = self {
            return s.write(buf);
        }
        if !self.flush_tls()? {
            return Err(ErrorKind::WouldBlock.into());
        }
        let Transport::Tls(_, c) = self else {
            return Ok(0);
        };
        if c.is_handshaking() {
            // Application data waits until the handshake is done (rustls would buffer it
            // without bound meanwhile); the loop writes again on the next writable event.
            return Err(ErrorKind::WouldBlock.into());
        }
        let n = c.writer().write(buf)?;
        self.flush_tls()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_tls().map(|_| ())
    }
}
