//! Helpers for the monitoring tests: run `bourse demo` with its dashboard, speak just enough
//! HTTP/1.1 to talk to it, to Prometheus and to chromedriver, and find the real tools.
//! Used by `monitor_real_peers.rs` and `monitor_bad_input.rs` (as `support`); it holds no
//! tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Finds `tool` on the PATH, or fails the test saying how to install it: CI runs
/// scripts/install-test-tools.sh first, so a missing tool is a broken setup, not a skip.
pub fn require(tool: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(tool);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "`{tool}` is not installed: run scripts/install-test-tools.sh (as root) to install \
         prometheus, chromium and chromium-driver"
    );
}

pub use bourse_testkit::{free_port, free_port_block};

/// A child process that is asked to stop with SIGINT when dropped (so that a parent such as
/// `bourse cluster up` stops its own children), killed if it has not exited within 10 s.
pub struct Interruptible(pub Child);

impl Drop for Interruptible {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `bourse demo` with its dashboard on a free port; stdout lines collected as they come.
pub struct Demo {
    pub proc: Proc,
    pub addr: SocketAddr,
    pub lines: Arc<Mutex<Vec<String>>>,
    /// The demo writes its report here, not into the test's working directory.
    pub out: tempfile::TempDir,
}

impl Demo {
    pub fn start(args: &[&str]) -> Demo {
        let out = tempfile::tempdir().expect("a directory for the report");
        let mut child = Command::new(env!("CARGO_BIN_EXE_bourse"))
            .arg("demo")
            .args(["--dashboard-port", "0", "--accounts", "1000"])
            .arg("--out")
            .arg(out.path().join("report"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("bourse demo starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let proc = Proc(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = loop {
            let found = lines.lock().unwrap().iter().find_map(|l| {
                l.split("dashboard: http://")
                    .nth(1)
                    .and_then(|rest| rest.split('/').next())
                    .and_then(|a| a.parse::<SocketAddr>().ok())
            });
            if let Some(a) = found {
                break a;
            }
            assert!(
                Instant::now() < deadline,
                "the demo printed no dashboard URL: {:?}",
                lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        Demo {
            proc,
            addr,
            lines,
            out,
        }
    }

    /// Waits (bounded) until a stdout line contains `needle`; returns that line.
    pub fn wait_for_line(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no line with {needle:?} within {timeout:?}: {:?}",
                self.lines.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn output(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

/// One HTTP/1.1 request with `Connection: close`; returns (status, body). Bounded in size
/// and time. Handles `Content-Length` and chunked bodies (chromedriver, Prometheus).
pub fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(5)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    // Read until the body is complete by its own framing: some servers (chromedriver) keep
    // the connection open despite `Connection: close`.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(split) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..split]).to_ascii_lowercase();
            let body = &buf[split + 4..];
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok());
            let done = match length {
                Some(n) => body.len() >= n,
                None if head.contains("transfer-encoding: chunked") => {
                    body.windows(5).any(|w| w == b"0\r\n\r\n")
                }
                None => false,
            };
            if done {
                break;
            }
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 << 20 || Instant::now() > deadline {
            break;
        }
    }
    let Some(split) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return (0, String::new());
    };
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let mut rest = buf[split + 4..].to_vec();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        rest = dechunk(&rest);
    }
    (status, String::from_utf8_lossy(&rest).to_string())
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..eol])
                .split(';')
                .next()
                .unwrap_or("")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 || eol + 2 + size > b.len() {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
    out
}

/// The value of one exact series line (`name{labels}`) in a Prometheus text exposition.
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// Standard base64 (screenshots from WebDriver).
pub fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter_map(val) {
        acc = (acc << 6) | c as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// Parses "1,234" or "20,000" from the demo's table.
pub fn parse_count(s: &str) -> Option<u64> {
    s.replace(',', "").parse().ok()
}

/// Three `bourse node` processes of one replica group, each serving `/metrics` and its
/// dashboard on a free loopback port (parsed from the node's stderr).
pub struct NodeCluster {
    pub dir: tempfile::TempDir,
    pub config: std::path::PathBuf,
    pub nodes: Vec<(u64, SocketAddr)>,
    pub dashboards: Vec<(u64, SocketAddr)>,
    pub procs: Vec<(u64, Proc)>,
}

/// A monitor config for tests: frames and status polls twice a second, every append
/// sampled, nodes down after 2 s of silence.
pub const TEST_MONITOR_TOML: &str = "tick_ms = 500\nstatus_poll_ms = 500\nsample_every = 4\n\
                                     [alerts]\nnode_down_ms = 2000\n";

impl NodeCluster {
    pub fn start() -> NodeCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = [free_port(), free_port(), free_port()];
        let mut toml = format!(
            "cluster_id = 61\ndata_dir = \"{}\"\nfsync = \"always\"\n",
            dir.path().join("data").display()
        );
        for (i, p) in ports.iter().enumerate() {
            toml.push_str(&format!(
                "[[nodes]]\nid = {}\naddr = \"127.0.0.1:{p}\"\n",
                i + 1
            ));
        }
        // The nodes publish market data (to loopback ports nobody needs to read), so that the
        // leader's publication delay is measured: feeds on base..base+12, replay from base+20.
        let md_base = free_port_block(26);
        toml.push_str(&format!(
            "[marketdata]\nbase_port = {md_base}\nreplay_base_port = {}\n\
             replay_history_packets = 1000\nreplay_history_bytes = 1048576\n",
            md_base + 20
        ));
        let config = dir.path().join("cluster.toml");
        std::fs::write(&config, toml).unwrap();
        let monitor = dir.path().join("monitor.toml");
        std::fs::write(&monitor, TEST_MONITOR_TOML).unwrap();
        let mut procs = Vec::new();
        let mut dashboards = Vec::new();
        for id in 1..=3u64 {
            let mut child = Command::new(env!("CARGO_BIN_EXE_bourse"))
                .arg("node")
                .arg("--config")
                .arg(&config)
                .args(["--id", &id.to_string()])
                .args(["--monitor-listen", "127.0.0.1:0"])
                .arg("--monitor-config")
                .arg(&monitor)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("bourse node starts");
            let stderr = child.stderr.take().expect("piped stderr");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(addr) = line
                        .split("dashboard http://")
                        .nth(1)
                        .and_then(|rest| rest.split('/').next())
                        .and_then(|a| a.parse::<SocketAddr>().ok())
                    {
                        let _ = tx.send(addr);
                    }
                    eprintln!("[node {id}] {line}");
                }
            });
            procs.push((id, Proc(child)));
            let addr = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("the node printed its dashboard address");
            dashboards.push((id, addr));
        }
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u64 + 1, format!("127.0.0.1:{p}").parse().unwrap()))
            .collect();
        NodeCluster {
            dir,
            config,
            nodes,
            dashboards,
            procs,
        }
    }

    pub fn dashboard(&self, id: u64) -> SocketAddr {
        self.dashboards.iter().find(|(i, _)| *i == id).unwrap().1
    }

    /// The leader's id as the nodes' own metrics say (bounded wait).
    pub fn leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            for (id, addr) in &self.dashboards {
                let (_, text) = http(*addr, "GET", "/metrics", None);
                if metric_value(&text, &format!("bourse_raft_is_leader{{node=\"{id}\"}}"))
                    == Some(1.0)
                {
                    return *id;
                }
            }
            assert!(Instant::now() < deadline, "no leader within {timeout:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn kill(&mut self, id: u64) {
        self.procs.retain(|(i, _)| *i != id);
    }
}

/// Closed-loop load on a replica group from `clients` concurrent clients, on a thread of
/// its own, until stopped. Counts acknowledgements per 100 ms slot and tallies the events of
/// every acknowledged request the way the node's monitor counts them.
pub struct Load {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub acked: Arc<std::sync::atomic::AtomicU64>,
    pub tally: Arc<Mutex<bourse_monitor::core_probe::Tally>>,
    pub errors: Arc<std::sync::atomic::AtomicU64>,
}

impl Load {
    pub fn start(nodes: Vec<(u64, SocketAddr)>, clients: u64) -> Load {
        use bourse_cluster::tokio;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let tally = Arc::new(Mutex::new(bourse_monitor::core_probe::Tally::default()));
        let (s, a, e, t) = (stop.clone(), acked.clone(), errors.clone(), tally.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let flow_config = |seed| {
                    let mut f = bourse_engine::workload::FlowConfig::exchange_core(seed);
                    f.accounts = 100;
                    f
                };
                // Wait for a leader first (bounded), so setup does not race the election.
                let deadline = Instant::now() + Duration::from_secs(30);
                'leader: while Instant::now() < deadline {
                    for (_, addr) in &nodes {
                        if let Ok(st) =
                            bourse_cluster::client::node_status(*addr, Duration::from_millis(500))
                                .await
                        {
                            if st.leader == Some(st.id) {
                                break 'leader;
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let setup_flow = bourse_engine::workload::Flow::new(flow_config(1));
                let mut setup = bourse_cluster::Client::new(nodes.clone(), 1, 1);
                for body in setup_flow.setup() {
                    setup
                        .submit(&bourse_core::Command::new(0, body), Duration::from_secs(20))
                        .await
                        .expect("setup commands are acknowledged");
                }
                let mut tasks = Vec::new();
                for c in 0..clients {
                    let (s, a, e, t, nodes) =
                        (s.clone(), a.clone(), e.clone(), t.clone(), nodes.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut flow = bourse_engine::workload::Flow::new(flow_config(100 + c));
                        let mut client = bourse_cluster::Client::new(nodes, 100 + c, 1);
                        while !s.load(Ordering::Relaxed) {
                            let command = bourse_core::Command::new(0, flow.next_command());
                            let deadline = Duration::from_secs(10);
                            match client.submit_for_events(&command, deadline).await {
                                Ok((_, events)) => {
                                    flow.observe(&events);
                                    // A duplicate's events are read at the entry of its one
                                    // application, so every request counts exactly once.
                                    t.lock().unwrap().add_events(&events);
                                    a.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(_) => {
                                    e.fetch_add(1, Ordering::Relaxed);
                                    tokio::time::sleep(Duration::from_millis(50)).await;
                                }
                            }
                        }
                    }));
                }
                for t in tasks {
                    let _ = t.await;
                }
            });
        });
        Load {
            stop,
            thread: Some(thread),
            acked,
            tally,
            errors,
        }
    }

    /// Acknowledgements per second over `window` (measured, never asserted on timing).
    pub fn rate_over(&self, window: Duration) -> f64 {
        use std::sync::atomic::Ordering;
        let a = self.acked.load(Ordering::Relaxed);
        let t = Instant::now();
        std::thread::sleep(window);
        let b = self.acked.load(Ordering::Relaxed);
        (b - a) as f64 / t.elapsed().as_secs_f64()
    }

    pub fn stop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop();
    }
}
