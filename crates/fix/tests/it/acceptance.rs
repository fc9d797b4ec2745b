//! Runs QuickFIX's FIX 4.4 session acceptance scripts against our acceptor.
//!
//! The scripts live outside the repository, in
//! `$BOURSE_SHARED_DIR/fix-acceptance/fix44/*.def` (default: `shared/` beside
//! the repository, found from CARGO_MANIFEST_DIR). Each script gets a fresh
//! acceptor with an empty store on an ephemeral 127.0.0.1 port. The format is
//! described in `fix-acceptance/README.md`. A missing script folder fails the
//! test: conformance must never be skipped silently.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bourse_fix::codec::{checksum, FrameBuffer, SOH};
use bourse_fix::time::{format_utc_timestamp_ms, system_now_ms};
use bourse_fix::{spawn_acceptor, AcceptorConfig};

/// Scripts we believe to be wrong for FIX 4.4, with the reason. They still
/// run and still count; this list only explains a failure. Empty: all 50
/// scripts agree with our reading of the specification.
const SCRIPTS_BELIEVED_WRONG: &[(&str, &str)] = &[];

/// How long to wait for an expected message. The slowest legitimate wait is
/// a TestRequest after 1.2 heartbeat intervals of 6 s.
const EXPECT_TIMEOUT: Duration = Duration::from_secs(20);
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Scripts run in parallel, each against its own acceptor.
const PARALLEL_SCRIPTS_MAX: usize = 12;

fn shared_dir() -> PathBuf {
    match std::env::var_os("BOURSE_SHARED_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"),
    }
}

#[derive(Debug)]
enum Step {
    Connect(u32),
    Close(u32),
    Send(u32, Vec<u8>),
    Expect(u32, Vec<u8>),
    ExpectDisconnect(u32),
    Sleep(Duration),
}

/// Splits an optional `N,` connection prefix off a script line's payload.
fn connection_prefix(payload: &[u8]) -> (u32, &[u8]) {
    let digits = payload.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits > 0 && payload.get(digits) == Some(&b',') {
        let n = std::str::from_utf8(&payload[..digits])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        (n, &payload[digits + 1..])
    } else {
        (1, payload)
    }
}

fn parse_script(bytes: &[u8]) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for (number, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let trimmed: &[u8] = {
            let start = line
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(line.len());
            &line[start..]
        };
        if trimmed.is_empty() || trimmed[0] == b'#' {
            continue;
        }
        let (kind, rest) = trimmed.split_at(1);
        let (conn, payload) = connection_prefix(rest);
        let step = match kind[0] {
            b'i' if payload == b"CONNECT" => Step::Connect(conn),
            b'i' if payload == b"DISCONNECT" => Step::Close(conn),
            b'e' if payload == b"DISCONNECT" => Step::ExpectDisconnect(conn),
            b'I' => Step::Send(conn, payload.to_vec()),
            b'E' => Step::Expect(conn, payload.to_vec()),
            _ if trimmed.starts_with(b"sleep(") => {
                let inner = &trimmed[6..trimmed
                    .iter()
                    .position(|&b| b == b')')
                    .unwrap_or(trimmed.len())];
                let seconds: f64 = std::str::from_utf8(inner)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .ok_or_else(|| format!("line {}: bad sleep", number + 1))?;
                Step::Sleep(Duration::from_secs_f64(seconds))
            }
            _ => {
                return Err(format!(
                    "line {}: cannot parse {:?}",
                    number + 1,
                    String::from_utf8_lossy(trimmed)
                ))
            }
        };
        steps.push(step);
    }
    Ok(steps)
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

/// Replaces `<TIME>`, `<TIME+n>` and `<TIME-n>` with one instant.
fn substitute_times(template: &[u8], now_ms: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(template.len() + 32);
    let mut i = 0;
    while i < template.len() {
        if template[i..].starts_with(b"<TIME") {
            if let Some(close) = template[i..].iter().position(|&b| b == b'>') {
                let inner = std::str::from_utf8(&template[i + 5..i + close]).unwrap_or("");
                let shift_s: i64 = if inner.is_empty() {
                    0
                } else {
                    inner.trim_start_matches('+').parse().unwrap_or(0)
                };
                out.extend_from_slice(format_utc_timestamp_ms(now_ms + shift_s * 1000).as_bytes());
                i += close + 1;
                continue;
            }
        }
        out.push(template[i]);
        i += 1;
    }
    out
}

/// Builds the bytes to send for an `I` line.
fn build_outbound(template: &[u8], now_ms: i64) -> Vec<u8> {
    if !template.starts_with(b"8=") {
        // Garbage on purpose: sent as written.
        return template.to_vec();
    }
    // Raw data from <RTRF> through </RTRF> is sent verbatim, SOHs and the
    // markers included: the markers are part of the value, whose length
    // the preceding length field (212=55) counts.
    const PLACEHOLDER: &[u8] = b"\x00RAWDATA\x00";
    let mut raw_data: Option<Vec<u8>> = None;
    let mut text = template.to_vec();
    if let (Some(start), Some(end)) = (find(&text, b"<RTRF>"), find(&text, b"</RTRF>")) {
        raw_data = Some(text[start..end + 7].to_vec());
        let mut replaced = text[..start].to_vec();
        replaced.extend_from_slice(PLACEHOLDER);
        replaced.extend_from_slice(&text[end + 7..]);
        text = replaced;
    }
    let text = substitute_times(&text, now_ms);
    let mut fields: Vec<Vec<u8>> = text.split(|&b| b == SOH).map(<[u8]>::to_vec).collect();
    if fields.last().is_some_and(Vec::is_empty) {
        fields.pop();
    }
    if let Some(data) = &raw_data {
        for f in &mut fields {
            *f = replace_all(f, PLACEHOLDER, data);
        }
    }
    let has_length = fields.iter().any(|f| f.starts_with(b"9="));
    let has_checksum = fields.iter().any(|f| f.starts_with(b"10="));
    let mut out = Vec::new();
    if has_length {
        for f in &fields {
            out.extend_from_slice(f);
            out.push(SOH);
        }
    } else {
        let mut body = Vec::new();
        for f in fields.iter().skip(1).filter(|f| !f.starts_with(b"10=")) {
            body.extend_from_slice(f);
            body.push(SOH);
        }
        out.extend_from_slice(&fields[0]);
        out.push(SOH);
        out.extend_from_slice(format!("9={}", body.len()).as_bytes());
        out.push(SOH);
        out.extend_from_slice(&body);
        if has_checksum {
            for f in fields.iter().filter(|f| f.starts_with(b"10=")) {
                out.extend_from_slice(f);
                out.push(SOH);
            }
        }
    }
    if !has_checksum {
        let sum = checksum(&out);
        out.extend_from_slice(format!("10={sum:03}").as_bytes());
        out.push(SOH);
    }
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn split_fields(message: &[u8]) -> Vec<(String, Vec<u8>)> {
    message
        .split(|&b| b == SOH)
        .filter(|f| !f.is_empty())
        .map(|f| match f.iter().position(|&b| b == b'=') {
            Some(eq) => (
                String::from_utf8_lossy(&f[..eq]).into_owned(),
                f[eq + 1..].to_vec(),
            ),
            None => (String::from_utf8_lossy(f).into_owned(), Vec::new()),
        })
        .filter(|(tag, _)| tag != "9" && tag != "10")
        .collect()
}

fn show(message: &[u8]) -> String {
    String::from_utf8_lossy(message).replace('\x01', "|")
}

/// Compares field by field, skipping 9 and 10 and ignoring the values of
/// 52, 122 and zero-timestamp fields (which must still be present).
fn compare(expected: &[u8], actual: &[u8]) -> Result<(), String> {
    let want = split_fields(expected);
    let got = split_fields(actual);
    let mismatch = || format!("expected {} but got {}", show(expected), show(actual));
    if want.len() != got.len() {
        return Err(mismatch());
    }
    for ((wt, wv), (gt, gv)) in want.iter().zip(&got) {
        if wt != gt {
            return Err(mismatch());
        }
        let any_value = wt == "52" || wt == "122" || wv.starts_with(b"00000000-00:00:00");
        if !any_value && wv != gv {
            return Err(mismatch());
        }
    }
    Ok(())
}

struct Connection {
    stream: TcpStream,
    frames: FrameBuffer,
}

impl Connection {
    fn open(port: u16) -> Result<Self, String> {
        let stream =
            TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
        stream.set_nodelay(true).ok();
        Ok(Connection {
            stream,
            frames: FrameBuffer::new(1 << 20),
        })
    }

    /// The next message, `Ok(None)` on EOF, `Err` on timeout.
    fn next_message(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, String> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 8192];
        loop {
            if let Some(frame) = self.frames.next_frame().map_err(|e| e.to_string())? {
                return Ok(Some(frame));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("timed out".into());
            }
            self.stream.set_read_timeout(Some(left)).ok();
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok(None),
                Ok(n) => self.frames.push(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(None),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }
}

fn run_script(path: &Path, spec: &Path, index: usize) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| format!("read script: {e}"))?;
    let steps = parse_script(&bytes)?;
    let store_dir = std::env::temp_dir().join(format!(
        "bourse-fix-acceptance-{}-{index}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&store_dir);
    let mut config = AcceptorConfig::new(
        "127.0.0.1:0".parse().expect("address"),
        "ISLD",
        "TW",
        store_dir.clone(),
        spec.to_path_buf(),
    );
    config.echo = true;
    config.reset_on_disconnect = true;
    let acceptor = spawn_acceptor(config).map_err(|e| format!("start acceptor: {e}"))?;
    let port = acceptor.local_addr().port();
    let result = execute(&steps, port);
    acceptor.shutdown();
    let _ = std::fs::remove_dir_all(&store_dir);
    result
}

fn execute(steps: &[Step], port: u16) -> Result<(), String> {
    let mut connections: std::collections::HashMap<u32, Connection> =
        std::collections::HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        let at = |e: String| format!("step {}: {e}", i + 1);
        match step {
            Step::Connect(n) => {
                connections.insert(*n, Connection::open(port).map_err(at)?);
            }
            Step::Close(n) => {
                if let Some(c) = connections.remove(n) {
                    let _ = c.stream.shutdown(std::net::Shutdown::Both);
                }
            }
            Step::Send(n, template) => {
                let c = connections
                    .get_mut(n)
                    .ok_or_else(|| at(format!("connection {n} not open")))?;
                let out = build_outbound(template, system_now_ms());
                // The acceptor may already have closed the connection; what
                // matters is what the next expectation sees.
                let _ = c.stream.write_all(&out);
            }
            Step::Expect(n, expected) => {
                let c = connections
                    .get_mut(n)
                    .ok_or_else(|| at(format!("connection {n} not open")))?;
                match c.next_message(EXPECT_TIMEOUT) {
                    Ok(Some(actual)) => compare(expected, &actual).map_err(at)?,
                    Ok(None) => {
                        return Err(at(format!(
                            "expected {} but the connection closed",
                            show(expected)
                        )))
                    }
                    Err(e) => return Err(at(format!("expected {} but {e}", show(expected)))),
                }
            }
            Step::ExpectDisconnect(n) => {
                let c = connections
                    .get_mut(n)
                    .ok_or_else(|| at(format!("connection {n} not open")))?;
                match c.next_message(DISCONNECT_TIMEOUT) {
                    Ok(None) => {
                        connections.remove(n);
                    }
                    Ok(Some(actual)) => {
                        return Err(at(format!(
                            "expected a disconnect but got {}",
                            show(&actual)
                        )))
                    }
                    Err(e) => return Err(at(format!("expected a disconnect but {e}"))),
                }
            }
            Step::Sleep(d) => std::thread::sleep(*d),
        }
    }
    Ok(())
}

/// A script's name, result and duration.
type ScriptOutcome = (String, Result<(), String>, Duration);

#[test]
fn quickfix_fix44_acceptance_scripts() {
    let base = shared_dir().join("fix-acceptance");
    let scripts_dir = base.join("fix44");
    let spec = base.join("spec/FIX44.xml");
    assert!(
        scripts_dir.is_dir() && spec.is_file(),
        "FIX acceptance scripts not found at {} (set BOURSE_SHARED_DIR to the folder holding fix-acceptance/)",
        scripts_dir.display()
    );
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(&scripts_dir)
        .expect("list scripts")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "def"))
        .collect();
    scripts.sort();
    assert!(
        !scripts.is_empty(),
        "no .def scripts in {}",
        scripts_dir.display()
    );

    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let results: Arc<Mutex<Vec<ScriptOutcome>>> = Arc::new(Mutex::new(Vec::new()));
    let scripts = Arc::new(scripts);
    let workers: Vec<_> = (0..PARALLEL_SCRIPTS_MAX.min(scripts.len()))
        .map(|_| {
            let (next, results, scripts, spec) = (
                Arc::clone(&next),
                Arc::clone(&results),
                Arc::clone(&scripts),
                spec.clone(),
            );
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(path) = scripts.get(i) else { break };
                let name = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let t0 = Instant::now();
                let result = run_script(path, &spec, i);
                let line = match &result {
                    Ok(()) => format!("ok    {name} ({} ms)", t0.elapsed().as_millis()),
                    Err(e) => {
                        let why = SCRIPTS_BELIEVED_WRONG
                            .iter()
                            .find(|(n, _)| *n == name)
                            .map(|(_, why)| format!(" [believed wrong for FIX 4.4: {why}]"))
                            .unwrap_or_default();
                        format!("FAIL  {name}: {e}{why}")
                    }
                };
                println!("{line}");
                results
                    .lock()
                    .expect("results")
                    .push((name, result, t0.elapsed()));
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let results = results.lock().expect("results");
    let failed: Vec<&String> = results
        .iter()
        .filter(|(_, r, _)| r.is_err())
        .map(|(n, _, _)| n)
        .collect();
    let passed = results.len() - failed.len();
    println!(
        "all scripts ran in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    println!("{passed} passed, {} failed", failed.len());
    assert!(failed.is_empty(), "failing scripts: {failed:?}");
}
