//! `bourse bench gateway`: door-to-door round trips through the FIX and binary gateways over
//! loopback, open loop and at saturation, with monitoring off or on, beside a TCP echo round
//! trip; over in-process cores or a replica group.

use super::common::{self, Latency};
use anyhow::{anyhow, Context, Result};
use bourse_client::binary::BinTif;
use bourse_client::{BinaryClient, FixClient, FixClientConfig, Response};
use bourse_gateway::GatewayConfig;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct GatewayBenchArgs {
    /// Offered rates, transactions per second (open loop), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10000,50000,100000")]
    rates: Vec<u64>,
    /// Seconds per rate.
    #[arg(long, default_value_t = 2)]
    seconds: u64,
    /// Requests in flight in the saturation run.
    #[arg(long, default_value_t = 256)]
    window: usize,
    /// Protocols to measure: fix, binary.
    #[arg(long, value_delimiter = ',', default_value = "binary,fix")]
    protocols: Vec<String>,
    /// One JSON object per scenario instead of a table.
    #[arg(long)]
    json: bool,
    /// Gateway monitoring during the runs: off, on (counters, probes sampled 1 in
    /// --sample-every, /metrics served), or both (every scenario twice, off then on).
    #[arg(long, default_value = "off")]
    monitor: String,
    /// With monitoring on, stage probes record one request in this many (the gateway's
    /// default, `monitor_sample_every`).
    #[arg(long, default_value_t = 64)]
    sample_every: u32,
    /// The core behind the gateway: `in-process` (an engine on a thread: the access server's
    /// own cost) or `replicated` (three `bourse node`s in this process on loopback, fsync
    /// never, reached through a ClusterLink: the figure includes replication).
    #[arg(long, default_value = "in-process")]
    core: String,
    /// Runs of every scenario per monitoring mode. With `--monitor both` the runs interleave
    /// (off, on, on, off, off, on, ...) so that a drift of the machine's load falls on both
    /// modes alike, and a summary compares the medians over the runs.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// How the FIX client is driven: `split` (a sender thread writes on schedule, the reading
    /// thread blocks in the socket read: the binary client's shape) or `one-thread` (the
    /// earlier driver: one thread sends and, between sends, waits for a readiness thread's
    /// signal; kept to show what that shape adds to FIX's figures).
    #[arg(long, default_value = "split")]
    fix_driver: String,
}

/// One scenario's result, for the summary over repeated runs.
struct Row {
    monitor: bool,
    scenario: String,
    throughput_per_s: f64,
    p50_ns: u64,
    p99_ns: u64,
}

/// Per scenario: the median over the runs of throughput, p50 and p99, monitoring off and on,
/// and the change with monitoring on.
fn print_monitor_summary(rows: &[Row], repeats: usize) {
    println!(
        "monitoring off vs on, median of {repeats} interleaved runs per mode (fresh gateway per run):"
    );
    println!(
        "  {:<22} {:>12} {:>12} {:>8} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8}",
        "scenario",
        "tput off/s",
        "tput on/s",
        "change",
        "p50 off",
        "p50 on",
        "change",
        "p99 off",
        "p99 on",
        "change"
    );
    let mut scenarios: Vec<&str> = rows.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    scenarios.sort_unstable();
    scenarios.dedup();
    for sc in scenarios {
        let pick = |on: bool, f: &dyn Fn(&Row) -> f64| {
            common::median(
                rows.iter()
                    .filter(|r| r.scenario == sc && r.monitor == on)
                    .map(f)
                    .collect(),
            )
        };
        let (t0, t1) = (
            pick(false, &|r| r.throughput_per_s),
            pick(true, &|r| r.throughput_per_s),
        );
        let (a0, a1) = (
            pick(false, &|r| r.p50_ns as f64),
            pick(true, &|r| r.p50_ns as f64),
        );
        let (p0, p1) = (
            pick(false, &|r| r.p99_ns as f64),
            pick(true, &|r| r.p99_ns as f64),
        );
        let pct = |a: f64, b: f64| format!("{:+.1}%", (b / a.max(1.0) - 1.0) * 100.0);
        println!(
            "  {:<22} {:>12} {:>12} {:>8} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8}",
            sc,
            common::count(t0.round() as u64),
            common::count(t1.round() as u64),
            pct(t0, t1),
            common::ns(a0 as u64),
            common::ns(a1 as u64),
            pct(a0, a1),
            common::ns(p0 as u64),
            common::ns(p1 as u64),
            pct(p0, p1),
        );
    }
}

/// A replica group of three nodes on loopback for `bench gateway --core replicated`.
struct BenchGroup {
    rt: bourse_cluster::tokio::runtime::Runtime,
    nodes: Vec<bourse_cluster::Node>,
    addrs: Vec<SocketAddr>,
    dir: PathBuf,
}

impl BenchGroup {
    fn start() -> Result<BenchGroup> {
        use bourse_cluster::{ClusterConfig, FsyncSetting, Node};
        let dir =
            std::env::temp_dir().join(format!("bourse-bench-gateway-group-{}", std::process::id()));
        let mut config = ClusterConfig::local(98, dir.clone(), common::free_ports()?);
        config.fsync = FsyncSetting::Never;
        let rt = bourse_cluster::tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("tokio runtime")?;
        let mut nodes = Vec::new();
        for n in &config.nodes {
            nodes.push(
                rt.block_on(Node::start(&config, n.id))
                    .map_err(|e| anyhow!("node {}: {e}", n.id))?,
            );
        }
        let addrs = config
            .nodes
            .iter()
            .map(|n| n.addr.parse().context("node address"))
            .collect::<Result<Vec<SocketAddr>>>()?;
        Ok(BenchGroup {
            rt,
            nodes,
            addrs,
            dir,
        })
    }

    fn stop(self) {
        let BenchGroup { rt, nodes, dir, .. } = self;
        rt.block_on(async {
            for n in nodes {
                n.shutdown().await;
            }
        });
        let _ = std::fs::remove_dir_all(dir);
    }
}

const BENCH_CONFIG: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"
binary_listen = "127.0.0.1:0"
throttle_msgs_per_s = 10000000
core_queue_depth = 65536
# The bench measures the path, not admission: no busy refusal below the queue's own bound.
core_in_flight_max = 65536
outbound_buffer_max_bytes = 67108864

[core]
bootstrap = true

[[instruments]]
instrument = 1
symbol = "BENCH"
market = "equity"
price_scale = 2
tick = 1
lot_size = 1
band_bps = 5000
reference_price = 10000

[[accounts]]
account = 1
firm = 1
cash = 100000000000000
may_short = true

[[fix_sessions]]
client_comp_id = "BENCH"
firm = 1
accounts = [1]

[[binary_sessions]]
credentials = "bench"
firm = 1
accounts = [1]
"#;

/// After the last send, responses are awaited at most this long.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// One client of the benchmark (FIX; the binary client has its own split driver): sends
/// request `i` and reports which request a response answers. Requests alternate: even = new
/// buy order, odd = cancel of the order before.
trait BenchClient {
    fn send(&mut self, i: u64) -> Result<()>;
    /// Indices of requests answered, waiting at most `wait` for the first answer.
    fn poll(&mut self, answered: &mut Vec<u64>, wait: Duration) -> Result<()>;
}

/// The FIX client in nonblocking mode, woken by [`Readable`] when its socket has bytes.
struct FixBench {
    client: FixClient,
    readable: Readable,
}

impl FixBench {
    fn new(mut client: FixClient) -> Result<FixBench> {
        client.set_nonblocking(true)?;
        let readable = Readable::start(client.try_clone_socket()?)?;
        Ok(FixBench { client, readable })
    }

    /// Takes every message already readable, without waiting.
    fn drain(&mut self, answered: &mut Vec<u64>) -> Result<()> {
        while let Some(m) = self.client.recv(Duration::ZERO)? {
            if let Some(i) = FixClient::field(&m, 11).and_then(|v| v.parse::<u64>().ok()) {
                answered.push(i);
            }
        }
        Ok(())
    }
}

impl BenchClient for FixBench {
    fn send(&mut self, i: u64) -> Result<()> {
        if i.is_multiple_of(2) {
            let price = format!("{}.{:02}", 90 + i / 2 % 5, i / 2 % 100);
            self.client
                .new_order(&i.to_string(), None, "BENCH", true, 1, Some(&price), '0')?;
        } else {
            self.client
                .cancel(&i.to_string(), &(i - 1).to_string(), "BENCH", true)?;
        }
        Ok(())
    }
    fn poll(&mut self, answered: &mut Vec<u64>, wait: Duration) -> Result<()> {
        self.drain(answered)?;
        if !answered.is_empty() {
            return Ok(());
        }
        match self.readable.woken.recv_timeout(wait) {
            Ok(()) => {
                self.drain(answered)?;
                // One acknowledgement per wake-up: the watcher waits for it before it looks
                // again, so it never spins on bytes this thread has not read yet.
                let _ = self.readable.drained.send(());
                Ok(())
            }
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(anyhow!("the FIX connection's watcher ended"))
            }
        }
    }
}

/// A thread that waits in epoll (no timeout to round) for the FIX socket to become readable
/// and says so on a channel, whose timed wait (a futex) is precise: the driver can sleep until
/// the next send is due and still wake at once for an answer. Reading with a socket timeout
/// instead rounded every short wait up to a kernel tick (4 ms here), which made FIX at an
/// open-loop 10,000/s look milliseconds slower than binary.
struct Readable {
    woken: mpsc::Receiver<()>,
    drained: mpsc::SyncSender<()>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Readable {
    /// Polls `socket` (a second handle on the client's connection, nonblocking like it).
    fn start(socket: std::net::TcpStream) -> Result<Readable> {
        let (wake, woken) = mpsc::sync_channel(1);
        let (drained, drained_rx) = mpsc::sync_channel::<()>(1);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let mut poll = mio::Poll::new()?;
        let mut socket = mio::net::TcpStream::from_std(socket);
        poll.registry()
            .register(&mut socket, mio::Token(0), mio::Interest::READABLE)?;
        std::thread::Builder::new()
            .name("bench-fix-wake".into())
            .spawn(move || {
                let mut events = mio::Events::with_capacity(4);
                while !stopping.load(Ordering::Acquire) {
                    // The timeout only lets the thread see `stop`.
                    if poll
                        .poll(&mut events, Some(Duration::from_millis(200)))
                        .is_err()
                    {
                        return;
                    }
                    if events.is_empty() {
                        continue;
                    }
                    if wake.send(()).is_err() || drained_rx.recv().is_err() {
                        return;
                    }
                }
                drop(socket);
            })
            .context("FIX wake thread")?;
        Ok(Readable {
            woken,
            drained,
            stop,
        })
    }
}

impl Drop for Readable {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

struct RunResult {
    latency: Latency,
    sent: u64,
    answered: u64,
    throughput_per_s: f64,
    /// Open loop: how late the client began to send each request against its schedule
    /// (the driver's wake-up; already inside `latency`, which counts from the schedule).
    sent_late: Option<Latency>,
    /// Open loop: how long the client's send call took (building the request, the protocol
    /// session's own work, the socket write; also inside `latency`).
    send_call: Option<Latency>,
}

/// Open loop at `rate` (latency from each request's scheduled time), or, with `rate` none,
/// saturation: as fast as a window of `window` requests in flight allows.
fn drive(
    client: &mut dyn BenchClient,
    rate: Option<u64>,
    seconds: u64,
    window: usize,
    first: u64,
) -> Result<RunResult> {
    let start = Instant::now();
    let run_ns = seconds * 1_000_000_000;
    let total = rate.map(|r| r * seconds);
    let mut scheduled_ns: Vec<u64> = Vec::new();
    let mut h: Histogram<u64> = common::histogram();
    let mut late: Histogram<u64> = common::histogram();
    let mut call: Histogram<u64> = common::histogram();
    let mut answered = Vec::new();
    let mut done = 0u64;
    let mut last_answer = start;
    let mut sent = 0u64;
    loop {
        let now_ns = start.elapsed().as_nanos() as u64;
        let more = match total {
            Some(t) => sent < t,
            None => now_ns < run_ns,
        };
        if !more && done >= sent {
            break;
        }
        if !more && last_answer.elapsed() > DRAIN_TIMEOUT {
            break;
        }
        // Send everything that is due (open loop) or what the window allows (saturation).
        while match (rate, total) {
            (Some(r), Some(t)) => sent < t && sent * 1_000_000_000 / r <= now_ns,
            _ => now_ns < run_ns && (sent - done) < window as u64,
        } {
            let due = match rate {
                Some(r) => sent * 1_000_000_000 / r,
                None => start.elapsed().as_nanos() as u64,
            };
            scheduled_ns.push(due);
            let began = start.elapsed().as_nanos() as u64;
            client.send(first + sent)?;
            if rate.is_some() {
                common::record(&mut late, began.saturating_sub(due));
                common::record(
                    &mut call,
                    (start.elapsed().as_nanos() as u64).saturating_sub(began),
                );
            }
            sent += 1;
        }
        // Block in the socket read until the next send is due (or an answer comes), so the
        // client does not take a core from the gateway and the engine by spinning.
        let now_ns = start.elapsed().as_nanos() as u64;
        let wait_ns = match (rate, total) {
            (Some(r), Some(t)) if sent < t => (sent * 1_000_000_000 / r).saturating_sub(now_ns),
            _ => 1_000_000,
        };
        answered.clear();
        client.poll(&mut answered, Duration::from_nanos(wait_ns.max(1_000)))?;
        if answered.is_empty() {
            continue;
        }
        let now_ns = start.elapsed().as_nanos() as u64;
        last_answer = Instant::now();
        for &i in &answered {
            if let Some(&due) = i
                .checked_sub(first)
                .and_then(|k| scheduled_ns.get(k as usize))
            {
                common::record(&mut h, now_ns.saturating_sub(due));
                done += 1;
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    Ok(RunResult {
        latency: Latency::of(&h),
        sent,
        answered: done,
        throughput_per_s: done as f64 / elapsed.max(1e-9),
        sent_late: rate.map(|_| Latency::of(&late)),
        send_call: rate.map(|_| Latency::of(&call)),
    })
}

/// What the sender thread of [`drive_split`] calls to write request `k` of the run (0, 1, ...;
/// even = new buy order, odd = cancel of the order before).
type SendRequest = Box<dyn FnMut(u64) -> std::io::Result<()> + Send>;

/// What the reading thread of [`drive_split`] calls: waits (a bounded blocking read, about
/// 20 ms at most) for answers and pushes the run index `k` of each request answered.
type ReadAnswers<'a> = &'a mut dyn FnMut(&mut Vec<u64>) -> Result<()>;

/// The client split in two, the same for both protocols: a sender thread writes each request
/// at its scheduled time (sleeping while the next one is far, yielding when it is near) and
/// this thread reads the answers in blocking reads, so neither waits on the other nor on a
/// timer tick. Also measures how late each request left against its schedule (open loop):
/// that part of the latency is the client's, not the gateway's.
fn drive_split(
    mut send: SendRequest,
    read: ReadAnswers<'_>,
    rate: Option<u64>,
    seconds: u64,
    window: usize,
) -> Result<RunResult> {
    use std::sync::atomic::AtomicU64;
    let start = Instant::now();
    let run_ns = seconds * 1_000_000_000;
    let total = rate.map(|r| r * seconds);
    let answered = Arc::new(AtomicU64::new(0));
    let sent_count = Arc::new(AtomicU64::new(0));
    // Send times of requests (saturation), indexed from `first`; open loop computes them.
    let sent_at: Arc<Vec<AtomicU64>> = Arc::new(if rate.is_none() {
        (0..(run_ns / 1_000).min(50_000_000))
            .map(|_| AtomicU64::new(0))
            .collect()
    } else {
        Vec::new()
    });
    let (answered_s, sent_s, sent_at_s) = (
        Arc::clone(&answered),
        Arc::clone(&sent_count),
        Arc::clone(&sent_at),
    );
    type Histograms = (Histogram<u64>, Histogram<u64>);
    let sender = std::thread::spawn(move || -> std::io::Result<Histograms> {
        let mut late: Histogram<u64> = common::histogram();
        let mut call: Histogram<u64> = common::histogram();
        let mut i = 0u64;
        loop {
            let now_ns = start.elapsed().as_nanos() as u64;
            let due = match (rate, total) {
                (Some(r), Some(t)) => {
                    if i >= t {
                        return Ok((late, call));
                    }
                    let due = i * 1_000_000_000 / r;
                    if due > now_ns {
                        let gap = due - now_ns;
                        if gap > 200_000 {
                            std::thread::sleep(Duration::from_nanos(gap - 100_000));
                        } else {
                            std::thread::yield_now();
                        }
                        continue;
                    }
                    Some(due)
                }
                _ => {
                    if now_ns >= run_ns || i as usize >= sent_at_s.len() {
                        return Ok((late, call));
                    }
                    if i - answered_s.load(Ordering::Acquire) >= window as u64 {
                        std::thread::yield_now();
                        continue;
                    }
                    sent_at_s[i as usize].store(now_ns, Ordering::Release);
                    None
                }
            };
            let began = start.elapsed().as_nanos() as u64;
            send(i)?;
            if let Some(due) = due {
                common::record(&mut late, began.saturating_sub(due));
                common::record(
                    &mut call,
                    (start.elapsed().as_nanos() as u64).saturating_sub(began),
                );
            }
            i += 1;
            sent_s.store(i, Ordering::Release);
        }
    });
    let mut h: Histogram<u64> = common::histogram();
    let mut done = 0u64;
    let mut last_answer = Instant::now();
    let mut got = Vec::new();
    loop {
        let sent = sent_count.load(Ordering::Acquire);
        if sender.is_finished() && done >= sent {
            break;
        }
        if sender.is_finished() && last_answer.elapsed() > DRAIN_TIMEOUT {
            break;
        }
        got.clear();
        read(&mut got)?;
        if got.is_empty() {
            continue;
        }
        let now_ns = start.elapsed().as_nanos() as u64;
        for &k in &got {
            let due = match rate {
                Some(r) => k * 1_000_000_000 / r,
                None => sent_at
                    .get(k as usize)
                    .map_or(now_ns, |a| a.load(Ordering::Acquire)),
            };
            common::record(&mut h, now_ns.saturating_sub(due));
            done += 1;
        }
        answered.store(done, Ordering::Release);
        last_answer = Instant::now();
    }
    let (late, call) = sender
        .join()
        .map_err(|_| anyhow!("sender thread panicked"))??;
    let elapsed = start.elapsed().as_secs_f64();
    Ok(RunResult {
        latency: Latency::of(&h),
        sent: sent_count.load(Ordering::Acquire),
        answered: done,
        throughput_per_s: done as f64 / elapsed.max(1e-9),
        sent_late: rate.map(|_| Latency::of(&late)),
        send_call: rate.map(|_| Latency::of(&call)),
    })
}

/// The binary client in [`drive_split`]: request `k` has ClOrdID `first + k + 1`.
fn drive_binary_split(
    client: &mut BinaryClient,
    rate: Option<u64>,
    seconds: u64,
    window: usize,
    first: u64,
) -> Result<RunResult> {
    let mut writer = client.writer()?;
    let send: SendRequest = Box::new(move |k| {
        let id = first + k + 1;
        if k.is_multiple_of(2) {
            let price = 9_000 + (k / 2 % 500) as i64;
            writer.new_order(id, 1, 1, true, 1, Some(price), BinTif::Day)
        } else {
            writer.cancel(id, id - 1, 1, 1)
        }
    });
    let mut read = |got: &mut Vec<u64>| -> Result<()> {
        let Some(r) = client.recv(Duration::from_millis(20))? else {
            return Ok(());
        };
        let id = match r.response {
            Response::NewOrderAck { cl_ord_id, .. }
            | Response::OrderReject { cl_ord_id, .. }
            | Response::CancelReject { cl_ord_id, .. } => cl_ord_id,
            Response::CancelAck {
                cl_ord_id: Some(id),
                ..
            } => id,
            Response::BusinessReject {
                ref_cl_ord_id: Some(id),
                ..
            } => id,
            _ => return Ok(()),
        };
        if let Some(k) = id.checked_sub(first + 1) {
            got.push(k);
        }
        Ok(())
    };
    drive_split(send, &mut read, rate, seconds, window)
}

/// The FIX client in [`drive_split`], shaped as the binary one: the sender thread builds and
/// writes each request through the session (under its lock: sequence numbers and the store
/// are the session's), this thread blocks in a read on a second handle of the socket and
/// feeds what it read to the session ([`FixClient::feed`]). Request `k` has ClOrdID
/// `first + k` (`first` is even).
fn drive_fix_split(
    client: FixClient,
    rate: Option<u64>,
    seconds: u64,
    window: usize,
    first: u64,
) -> Result<(RunResult, FixClient)> {
    use std::io::Read;
    let mut socket = client.try_clone_socket()?;
    // The read timeout only lets this thread see that the run ended; an answer wakes the
    // read at once.
    socket.set_read_timeout(Some(Duration::from_millis(20)))?;
    let client = Arc::new(std::sync::Mutex::new(client));
    let sending = Arc::clone(&client);
    let send: SendRequest = Box::new(move |k| {
        let i = first + k;
        let mut c = sending
            .lock()
            .map_err(|_| std::io::Error::other("the FIX client's lock is poisoned"))?;
        if k.is_multiple_of(2) {
            let price = format!("{}.{:02}", 90 + k / 2 % 5, k / 2 % 100);
            c.new_order(&i.to_string(), None, "BENCH", true, 1, Some(&price), '0')?;
        } else {
            c.cancel(&i.to_string(), &(i - 1).to_string(), "BENCH", true)?;
        }
        Ok(())
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = |got: &mut Vec<u64>| -> Result<()> {
        let n = match socket.read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(())
            }
            Err(e) => return Err(e.into()),
        };
        let mut c = client
            .lock()
            .map_err(|_| anyhow!("the FIX client's lock is poisoned"))?;
        c.feed(&buf[..n])?;
        while let Some(m) = c.recv(Duration::ZERO)? {
            if let Some(k) = FixClient::field(&m, 11)
                .and_then(|v| v.parse::<u64>().ok())
                .and_then(|i| i.checked_sub(first))
            {
                got.push(k);
            }
        }
        if n == 0 {
            return Err(anyhow!(
                "the gateway closed the FIX connection: {}",
                c.closed_reason().unwrap_or("no reason given")
            ));
        }
        Ok(())
    };
    let r = drive_split(send, &mut read, rate, seconds, window)?;
    let client = Arc::try_unwrap(client)
        .map_err(|_| anyhow!("the FIX sender still holds the client"))?
        .into_inner()
        .map_err(|_| anyhow!("the FIX client's lock is poisoned"))?;
    Ok((r, client))
}

/// Requests in flight at most in the saturation run (a gateway session's own limits are
/// far below; this only refuses absurd values).
const WINDOW_MAX: usize = 1 << 20;

pub fn bench(args: GatewayBenchArgs) -> Result<()> {
    let modes: Vec<bool> = match args.monitor.as_str() {
        "off" => vec![false],
        "on" => vec![true],
        "both" => vec![false, true],
        other => return Err(anyhow!("--monitor must be off, on or both, not {other}")),
    };
    if !matches!(args.core.as_str(), "in-process" | "replicated") {
        return Err(anyhow!(
            "--core must be in-process or replicated, not {}",
            args.core
        ));
    }
    if !matches!(args.fix_driver.as_str(), "split" | "one-thread") {
        return Err(anyhow!(
            "--fix-driver must be split or one-thread, not {}",
            args.fix_driver
        ));
    }
    // A window of 0 would make the saturation run send nothing and report it as a figure.
    if args.window == 0 || args.window > WINDOW_MAX {
        return Err(anyhow!("--window must be in 1..={WINDOW_MAX}"));
    }
    let machine = common::Machine::this();
    let echo = Latency::of(&common::echo_baseline()?);
    if !args.json {
        println!(
            "bench gateway: door-to-door round trip (client write -> response read) over loopback,"
        );
        println!(
            "{}; requests alternate new order / cancel.",
            if args.core == "replicated" {
                "replicated core (3 nodes in this process, fsync never, via ClusterLink)"
            } else {
                "in-process core (not replicated)"
            }
        );
        println!(
            "TCP echo baseline: p50 {} p99 {}",
            common::ns(echo.p50),
            common::ns(echo.p99)
        );
    }
    let repeats = args.repeats.max(1);
    let mut rows = Vec::new();
    for run in 0..repeats {
        // Interleaved: the mode that goes first alternates from run to run.
        let mut order = modes.clone();
        if run % 2 == 1 {
            order.reverse();
        }
        for monitor in order {
            rows.extend(bench_mode(&args, monitor, &echo, &machine)?);
        }
    }
    if modes.len() == 2 && !args.json {
        print_monitor_summary(&rows, repeats);
    }
    Ok(())
}

/// Every scenario of `args` against a fresh gateway, with its monitoring on or off.
fn bench_mode(
    args: &GatewayBenchArgs,
    monitor: bool,
    echo: &Latency,
    machine: &common::Machine,
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let echo = *echo;
    let dir = std::env::temp_dir().join(format!(
        "bourse-bench-gateway-{}-{monitor}",
        std::process::id()
    ));
    let group = if args.core == "replicated" {
        Some(BenchGroup::start()?)
    } else {
        None
    };
    let text = match &group {
        Some(g) => format!(
            "{BENCH_CONFIG}\n[[cores]]\nname = \"bench\"\ninstruments = [1]\nnodes = [{}]\nclient_id = 1\n",
            g.addrs
                .iter()
                .map(|a| format!("\"{a}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => BENCH_CONFIG.to_string(),
    };
    let mut config = GatewayConfig::from_toml(&text).map_err(|e| anyhow!(e))?;
    config.gateway.store_dir = dir.clone();
    if monitor {
        config.gateway.monitor_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        config.gateway.monitor_sample_every = args.sample_every;
    }
    let handle = crate::gateway_cmd::start(config, 1 << 20)?;
    let mode = if monitor { "on" } else { "off" };
    if !args.json {
        println!(
            "monitoring {mode}{}",
            if monitor {
                format!(
                    " (counters, probes 1 in {}, /metrics on {})",
                    args.sample_every,
                    handle
                        .monitor_addr()
                        .map_or("-".to_string(), |a| a.to_string())
                )
            } else {
                String::new()
            }
        );
        println!(
            "  {:<8} {:>12} {:>12} {:>10} {:>16} {:>16} {:>16} {:>16} {:>10} {:>20}",
            "proto",
            "offered/s",
            "achieved/s",
            "answered",
            "p50 (×echo)",
            "p90 (×echo)",
            "p99 (×echo)",
            "p99.9 (×echo)",
            "max",
            "late/send call p50"
        );
    }
    let mut next_id = 0u64;
    for proto in &args.protocols {
        let mut binary: Option<BinaryClient> = None;
        let mut fix_split: Option<FixClient> = None;
        let mut client: Option<Box<dyn BenchClient>> = match proto.as_str() {
            "binary" => {
                let addr: SocketAddr = handle
                    .binary_addr()
                    .ok_or_else(|| anyhow!("no binary listener"))?;
                binary = Some(BinaryClient::connect(addr, "bench", 60_000, 1)?);
                None
            }
            "fix" => {
                let addr = handle
                    .fix_addr()
                    .ok_or_else(|| anyhow!("no FIX listener"))?;
                let mut cfg = FixClientConfig::new(addr, "BENCH", "BOURSE");
                cfg.reset_on_logon = true;
                let c = FixClient::connect(&cfg)?;
                if args.fix_driver == "split" {
                    fix_split = Some(c);
                    None
                } else {
                    Some(Box::new(FixBench::new(c)?))
                }
            }
            other => return Err(anyhow!("unknown protocol {other} (fix, binary)")),
        };
        let mut scenarios: Vec<Option<u64>> = args.rates.iter().map(|&r| Some(r)).collect();
        scenarios.push(None);
        for rate in scenarios {
            // Even start so new/cancel pairs line up.
            next_id += next_id % 2;
            let r = match (binary.as_mut(), client.as_mut(), fix_split.take()) {
                (Some(b), _, _) => drive_binary_split(b, rate, args.seconds, args.window, next_id)?,
                (None, Some(c), _) => drive(c.as_mut(), rate, args.seconds, args.window, next_id)?,
                (None, None, Some(f)) => {
                    let (r, f) = drive_fix_split(f, rate, args.seconds, args.window, next_id)?;
                    fix_split = Some(f);
                    r
                }
                (None, None, None) => return Err(anyhow!("no client")),
            };
            next_id += r.sent;
            let l = &r.latency;
            rows.push(Row {
                monitor,
                scenario: format!(
                    "{proto}-{}",
                    rate.map_or("saturation".to_string(), |r| r.to_string())
                ),
                throughput_per_s: r.throughput_per_s,
                p50_ns: l.p50,
                p99_ns: l.p99,
            });
            let ratio = |v: u64, base: u64| v as f64 / base.max(1) as f64;
            if args.json {
                let fix_driver = (proto.as_str() == "fix").then_some(args.fix_driver.as_str());
                let o = json!({
                    "bench": "gateway",
                    "monitor": mode,
                    "core": args.core,
                    "scenario": format!("{proto}-{}", rate.map_or("saturation".to_string(), |r| r.to_string())),
                    "protocol": proto,
                    "offered_per_s": rate,
                    "throughput_per_s": r.throughput_per_s.round() as u64,
                    "sent": r.sent,
                    "answered": r.answered,
                    "latency_ns": l,
                    "fix_driver": fix_driver,
                    "sent_late_ns": r.sent_late,
                    "send_call_ns": r.send_call,
                    "latency_over_echo": {
                        "p50": ratio(l.p50, echo.p50), "p90": ratio(l.p90, echo.p90),
                        "p99": ratio(l.p99, echo.p99), "p999": ratio(l.p999, echo.p999),
                    },
                    "baseline": {"echo_rtt_ns": {"p50": echo.p50, "p90": echo.p90, "p99": echo.p99, "p999": echo.p999}},
                    "machine": machine,
                    "version": common::version(),
                });
                println!("{o}");
            } else {
                let cell = |v: u64, base: u64| format!("{} ({:.1})", common::ns(v), ratio(v, base));
                println!(
                    "  {:<8} {:>12} {:>12} {:>10} {:>16} {:>16} {:>16} {:>16} {:>10} {:>20}",
                    proto,
                    rate.map_or("saturation".to_string(), common::count),
                    common::count(r.throughput_per_s.round() as u64),
                    common::count(r.answered),
                    cell(l.p50, echo.p50),
                    cell(l.p90, echo.p90),
                    cell(l.p99, echo.p99),
                    cell(l.p999, echo.p999),
                    common::ns(l.max),
                    match (r.sent_late, r.send_call) {
                        (Some(late), Some(call)) =>
                            format!("{} / {}", common::ns(late.p50), common::ns(call.p50)),
                        _ => "-".to_string(),
                    },
                );
            }
        }
    }
    handle.shutdown();
    if let Some(g) = group {
        g.stop();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(rows)
}
