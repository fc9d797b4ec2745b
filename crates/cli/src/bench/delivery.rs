//! `bourse bench delivery`: the data-delivery store (seed 003).
//!
//! Events come from a real engine running an order flow (new orders, cancels, replaces,
//! trades; 200 accounts in 20 firms), generated ahead. Scenario `store-writes`: records/s
//! written into the store on one thread with no readers, through the writer's real path (the
//! write lock, the entry's decode, the indexes, the readers' wake-up); per-entry apply time.
//! Scenario `readers`: a writer thread writes at `--rate` records/s (each entry stamped with
//! its scheduled time, so a writer that falls behind shows in the lag) while N readers poll
//! over loopback through each front of `--fronts` (HTTP/JSON, SBE over TCP), 20% unfiltered
//! and the rest filtered by firm, each from its own cursor in a tight loop: lag (receive time
//! − scheduled write time of each record) mean, p50 … max, records per answer, share of
//! empty answers, with the wait (`wait_us` 500) and without it (`wait_us` 0). HTTP readers
//! decode only each record's time stamp (a client that reads the header first); binary
//! readers decode every record. Writer, server and readers share this machine's cores.
//! Scenario `cold-reads`: the same writes into a store that keeps an eighth of its records
//! in memory and the rest on disk (`[cold]`: the eviction's disk writes are in the write rate),
//! then one reader reads everything from the origin in answers of 1,000 records through the
//! store's query (no network), and again from a store that holds it all in memory: records/s
//! and the time of one answer, from disk and from memory.

use super::common::{self, histogram, record, Latency, Machine};
use anyhow::{anyhow, Result};
use bourse_cluster::consumer::EntryView;
use bourse_cluster::stream::{CommittedEntry, CommittedRequest};
use bourse_cluster::{tokio, OutcomeKind};
use bourse_core::{Command, Event, FirmId};
use bourse_delivery::node::Shared;
use bourse_delivery::{
    BinaryClient, DeliveryClient, Filter, Limits, PollRequest, Store, StoreConfig,
};
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::{Engine, EngineConfig};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct DeliveryBenchArgs {
    /// Commands run through the engine to make the events (the records written are about
    /// twice as many).
    #[arg(long, default_value_t = 400_000)]
    commands: usize,
    /// Commands per committed entry (a replicated core's batch).
    #[arg(long, default_value_t = 32)]
    entry_commands: usize,
    /// Reader counts of the `readers` scenario.
    #[arg(long, value_delimiter = ',', default_values_t = vec![10usize, 100])]
    readers: Vec<usize>,
    /// Records per second the writer offers in the `readers` scenario.
    #[arg(long, default_value_t = 100_000)]
    rate: u64,
    /// Seconds measured per `readers` scenario.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// The fronts the readers poll through: `http` (JSON long poll), `binary` (SBE over TCP).
    #[arg(long, value_delimiter = ',', default_values_t = vec![Front::Http, Front::Binary])]
    fronts: Vec<Front>,
    /// Also run a peer in the same invocation: `tarantool` (../shared/peers/tarantool-delivery).
    #[arg(long)]
    peer: Option<String>,
    /// One JSON object per scenario.
    #[arg(long)]
    json: bool,
}

/// The front a reader polls through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Front {
    Http,
    Binary,
}

impl std::fmt::Display for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Front::Http => "http",
            Front::Binary => "binary",
        })
    }
}

/// One entry's requests as events, restamped and encoded when written.
type EntryEvents = Vec<Vec<Event>>;

fn generate(commands: usize, per_entry: usize) -> Vec<EntryEvents> {
    let mut config = FlowConfig::exchange_core(7);
    config.accounts = 200;
    config.live_orders_target = 2_000;
    let mut flow = Flow::new(config);
    let mut engine = Engine::new(EngineConfig::default());
    let mut out = Vec::new();
    let mut events = Vec::new();
    for body in flow.setup() {
        engine.apply(&Command::new(0, body), &mut events);
    }
    let mut entry = vec![std::mem::take(&mut events)];
    for i in 0..commands {
        events.clear();
        engine.apply(&Command::new(i as u64, flow.next_command()), &mut events);
        flow.observe(&events);
        entry.push(events.clone());
        if entry.len() >= per_entry {
            out.push(std::mem::take(&mut entry));
        }
    }
    out
}

fn entry(index: u64, requests: &EntryEvents, ts_ns: Option<u64>) -> EntryView {
    let requests = requests
        .iter()
        .enumerate()
        .map(|(i, events)| {
            let mut events = events.clone();
            if let Some(ts) = ts_ns {
                for e in &mut events {
                    *e.ts_ns_mut() = ts;
                }
            }
            CommittedRequest {
                client_id: 1,
                request_seq: index * 1_000 + i as u64,
                kind: OutcomeKind::Applied,
                applied_index: index,
                events: bourse_core::codec::encode_events(&events),
                audit: None,
            }
        })
        .collect();
    EntryView::new(Arc::new(CommittedEntry {
        index,
        requests,
        market_data_flush_ns: None,
    }))
}

fn shared() -> Arc<Shared> {
    let store = Store::new(&StoreConfig {
        deployment: "bench".into(),
        cores: vec![0],
        records_per_core_max: Limits::default().records_per_core_max,
        secondary_indexes: true,
    });
    // Every reader of the bench connects from 127.0.0.1: the per-address share is the whole.
    let limits = Limits {
        connections_per_address_max: Limits::default().connections_max,
        ..Limits::default()
    };
    Shared::new(store, limits)
}

/// The writer's path for one entry: the write lock, the apply, the readers' wake-up.
fn write(shared: &Shared, e: &EntryView) -> usize {
    let n = shared
        .store
        .write()
        .expect("store")
        .apply_entry(0, e)
        .expect("entries in order");
    if n > 0 {
        shared.changed.send_modify(|v| *v += 1);
    }
    n
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

pub fn bench(args: DeliveryBenchArgs) -> Result<()> {
    let machine = Machine::this();
    let started = Instant::now();
    let entries = generate(args.commands, args.entry_commands.max(1));
    if !args.json {
        println!(
            "delivery: {} entries of {} commands generated in {:.1} s; load: {}",
            entries.len(),
            args.entry_commands,
            started.elapsed().as_secs_f64(),
            loadavg()
        );
    }
    store_writes(&args, &entries, &machine)?;
    cold_reads(&args, &entries, &machine)?;
    for &front in &args.fronts {
        for &n in &args.readers {
            for wait_us in [500u64, 0] {
                readers(&args, &entries, front, n, wait_us, &machine)?;
            }
        }
    }
    if let Some(peer) = &args.peer {
        peer_run(peer, &args)?;
    }
    Ok(())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn store_writes(
    args: &DeliveryBenchArgs,
    entries: &[EntryEvents],
    machine: &Machine,
) -> Result<()> {
    // Encoding is the core's work, done ahead; the store's work is timed.
    let views: Vec<EntryView> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| entry(i as u64, e, None))
        .collect();
    let shared = shared();
    let mut h = histogram();
    let mut records = 0u64;
    let t = Instant::now();
    for v in &views {
        let s = Instant::now();
        records += write(&shared, v) as u64;
        record(&mut h, s.elapsed().as_nanos() as u64);
    }
    let secs = t.elapsed().as_secs_f64();
    let per_s = (records as f64 / secs).round() as u64;
    let l = Latency::of(&h);
    let stats = shared.store.read().expect("store").stats();
    if args.json {
        println!(
            "{}",
            json!({
                "bench": "delivery", "scenario": "store-writes", "offered_per_s": null,
                "throughput_per_s": per_s, "records": records, "entries": views.len(),
                "entry_apply_ns": l, "records_kept": stats[0].records,
                "machine": machine, "version": common::version(),
            })
        );
    } else {
        println!(
            "\nstore-writes (one thread, no readers): {} records in {} entries, {:.2} s: {} records/s",
            common::count(records),
            common::count(views.len() as u64),
            secs,
            common::count(per_s)
        );
        println!(
            "  records kept {} (latest states, trades, rejects)",
            common::count(stats[0].records as u64)
        );
        println!("{}", common::latency_header());
        println!("{}", common::latency_row("entry apply", &l));
    }
    Ok(())
}

/// Records per answer of the `cold-reads` scenario.
const COLD_READ_ROWS: usize = 1_000;

/// How long the readers scenario waits for every reader's first answer before the writer
/// starts without the ones that are not there yet.
const READERS_READY_WAIT_MAX: Duration = Duration::from_secs(60);

/// Writes every entry into `store` (timed), then reads everything from the origin in answers
/// of [`COLD_READ_ROWS`] (each timed): (records written, write seconds, records read, read
/// seconds, answer times).
fn write_then_read_all(
    store: &mut Store,
    views: &[EntryView],
) -> (u64, f64, u64, f64, Histogram<u64>) {
    let t = Instant::now();
    let mut written = 0u64;
    for v in views {
        written += store.apply_entry(0, v).expect("entries in order") as u64;
    }
    let write_s = t.elapsed().as_secs_f64();
    let mut h = histogram();
    let mut cursor = Some(store.cursor(&[bourse_delivery::Pos::START]));
    let mut read = 0u64;
    let t = Instant::now();
    loop {
        let s = Instant::now();
        let start = store.resolve(cursor.as_ref()).expect("the origin is kept");
        let a = store.query_start(&start, &Filter::default(), COLD_READ_ROWS);
        let next = store.cursor_after(&start, &a.next);
        record(&mut h, s.elapsed().as_nanos() as u64);
        if a.records.is_empty() && cursor.as_ref() == Some(&next) {
            break;
        }
        read += a.records.len() as u64;
        cursor = Some(next);
    }
    (written, write_s, read, t.elapsed().as_secs_f64(), h)
}

fn cold_reads(args: &DeliveryBenchArgs, entries: &[EntryEvents], machine: &Machine) -> Result<()> {
    let views: Vec<EntryView> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| entry(i as u64, e, None))
        .collect();
    let dir = std::env::temp_dir().join(format!("bourse-bench-cold-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = |records_per_core_max| StoreConfig {
        deployment: "bench".into(),
        cores: vec![0],
        records_per_core_max,
        secondary_indexes: true,
    };
    let mut whole = Store::new(&config(usize::MAX / 2));
    let (written, memory_write_s, memory_read, memory_read_s, memory_h) =
        write_then_read_all(&mut whole, &views);
    // An eighth of what the store keeps in memory: most of a read from the origin comes
    // from disk.
    let memory_max = (whole.stats()[0].records / 8).max(1_000);
    drop(whole);
    let mut cold = Store::new(&config(memory_max));
    cold.attach_cold(&dir, &bourse_delivery::cold::ColdConfig::default())
        .map_err(|e| anyhow!(e))?;
    let (_, cold_write_s, cold_read, cold_read_s, cold_h) = write_then_read_all(&mut cold, &views);
    let on_disk = cold.stats()[0]
        .cold
        .as_ref()
        .map_or(0, |c| c.records_written);
    drop(cold);
    let _ = std::fs::remove_dir_all(&dir);
    let per_s = |n: u64, s: f64| (n as f64 / s.max(1e-9)).round() as u64;
    let (cold_l, memory_l) = (Latency::of(&cold_h), Latency::of(&memory_h));
    if args.json {
        println!(
            "{}",
            json!({
                "bench": "delivery", "scenario": "cold-reads", "records": written,
                "records_on_disk": on_disk, "records_in_memory_max": memory_max,
                "writes_per_s_cold": per_s(written, cold_write_s),
                "writes_per_s_memory": per_s(written, memory_write_s),
                "reads_per_s_cold": per_s(cold_read, cold_read_s),
                "reads_per_s_memory": per_s(memory_read, memory_read_s),
                "answer_ns_cold": cold_l, "answer_ns_memory": memory_l,
                "rows_per_answer": COLD_READ_ROWS,
                "machine": machine, "version": common::version(),
            })
        );
    } else {
        println!(
            "\ncold-reads: {} records written, {} evicted to disk (memory keeps {}); \
             writes {} records/s with cold data, {} without",
            common::count(written),
            common::count(on_disk),
            common::count(memory_max as u64),
            common::count(per_s(written, cold_write_s)),
            common::count(per_s(written, memory_write_s))
        );
        println!(
            "  read from the origin, {} records per answer: {} records/s from disk and memory \
             ({} records), {} records/s from memory alone ({} records)",
            COLD_READ_ROWS,
            common::count(per_s(cold_read, cold_read_s)),
            common::count(cold_read),
            common::count(per_s(memory_read, memory_read_s)),
            common::count(memory_read)
        );
        println!("{}", common::latency_header());
        println!("{}", common::latency_row("answer, disk", &cold_l));
        println!("{}", common::latency_row("answer, memory", &memory_l));
    }
    Ok(())
}

/// What a reader decodes of an answer: the header's count and each record's time stamp.
#[derive(Deserialize)]
struct LagAnswer {
    header: LagHeader,
    records: Vec<LagRecord>,
}

#[derive(Deserialize)]
struct LagHeader {
    next_cursor: String,
    count: usize,
}

#[derive(Deserialize)]
struct LagRecord {
    ts_ns: u64,
}

#[derive(Default)]
struct ReaderResult {
    lag: Option<Histogram<u64>>,
    batch: Option<Histogram<u64>>,
    answers: u64,
    empty: u64,
    records: u64,
    errors: u64,
}

/// What one answer told a reader: the next cursor, the count, each record's time.
struct Lags {
    next_cursor: String,
    count: usize,
    ts_ns: Vec<u64>,
}

/// One poll through `front`: an HTTP reader decodes the header and each record's time stamp
/// only (a client that reads the header first); a binary reader decodes every record.
async fn poll_once(
    http: &mut DeliveryClient,
    binary: &mut BinaryClient,
    front: Front,
    req: &PollRequest,
) -> Option<Lags> {
    match front {
        Front::Http => {
            let Ok((200, body)) = http.get(&req.path()).await else {
                return None;
            };
            let a = serde_json::from_slice::<LagAnswer>(&body).ok()?;
            Some(Lags {
                next_cursor: a.header.next_cursor,
                count: a.header.count,
                ts_ns: a.records.iter().map(|r| r.ts_ns).collect(),
            })
        }
        Front::Binary => {
            let a = binary.poll(req).await.ok()?;
            Some(Lags {
                next_cursor: a.header.next_cursor,
                count: a.header.count,
                ts_ns: a.records.iter().map(|r| r.ts_ns()).collect(),
            })
        }
    }
}

async fn reader(
    addr: std::net::SocketAddr,
    front: Front,
    filter: Filter,
    wait_us: u64,
    stop: Arc<AtomicBool>,
    ready: Arc<AtomicUsize>,
) -> ReaderResult {
    let mut client = DeliveryClient::new(addr);
    let mut binary = BinaryClient::new(addr);
    let mut lag = histogram();
    let mut batch = histogram();
    let mut r = ReaderResult::default();
    // Start from the live end: the first answer (a snapshot) is not timed.
    let mut req = PollRequest {
        cursor: None,
        filter,
        limit: Some(1_000),
        wait_us: Some(wait_us),
        min_rows: Some(1),
        since_ns: None,
    };
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        let Some(a) = poll_once(&mut client, &mut binary, front, &req).await else {
            r.errors += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let received = now_ns();
        req.cursor = Some(a.next_cursor);
        if first {
            first = false;
            ready.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        r.answers += 1;
        r.records += a.count as u64;
        if a.count == 0 {
            r.empty += 1;
        }
        record(&mut batch, a.count as u64);
        for ts_ns in a.ts_ns {
            record(&mut lag, received.saturating_sub(ts_ns));
        }
    }
    r.lag = Some(lag);
    r.batch = Some(batch);
    r
}

fn readers(
    args: &DeliveryBenchArgs,
    entries: &[EntryEvents],
    front: Front,
    n: usize,
    wait_us: u64,
    machine: &Machine,
) -> Result<()> {
    let shared = shared();
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-delivery-server")
        .enable_all()
        .build()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (stop_server, stopped) = tokio::sync::watch::channel(false);
    {
        let _g = server_rt.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        match front {
            Front::Http => server_rt.spawn(bourse_delivery::server::serve(
                listener,
                shared.clone(),
                stopped,
            )),
            Front::Binary => server_rt.spawn(bourse_delivery::binary::serve(
                listener,
                shared.clone(),
                stopped,
            )),
        };
    }
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-delivery-readers")
        .enable_all()
        .build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let ready = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let filter = if i % 5 == 0 {
                Filter::default()
            } else {
                Filter {
                    firm: Some(FirmId(1 + (i % 20) as u32)),
                    ..Filter::default()
                }
            };
            client_rt.spawn(reader(
                addr,
                front,
                filter,
                wait_us,
                stop.clone(),
                ready.clone(),
            ))
        })
        .collect();
    // The writer: paced at `rate` records/s, each entry stamped with its scheduled time.
    let rate = args.rate.max(1) as f64;
    let duration = Duration::from_secs_f64(args.seconds);
    let writer_shared = shared.clone();
    let views_needed = entries.len();
    let entries = entries.to_vec();
    // Every reader connects and takes its first answer (on the empty store: nothing) before
    // the writer starts, so the run measures readers that follow the writer, not a thousand
    // connections opening and reading from the origin at once. Bounded: a reader that cannot
    // connect is counted as an error and the run starts without it.
    let warm_up = Instant::now();
    while ready.load(Ordering::Relaxed) < n && warm_up.elapsed() < READERS_READY_WAIT_MAX {
        std::thread::sleep(Duration::from_millis(5));
    }
    let warm_up_s = warm_up.elapsed().as_secs_f64();
    let readers_ready = ready.load(Ordering::Relaxed);
    let writer = std::thread::Builder::new()
        .name("bench-delivery-writer".into())
        .spawn(move || {
            let start = Instant::now();
            let start_ns = now_ns();
            let mut written = 0u64;
            let mut index = 0u64;
            while start.elapsed() < duration && (index as usize) < views_needed {
                let due_ns = (written as f64 / rate * 1e9) as u64;
                let ahead = Duration::from_nanos(due_ns).saturating_sub(start.elapsed());
                if !ahead.is_zero() {
                    std::thread::sleep(ahead.min(Duration::from_micros(200)));
                    continue;
                }
                let e = entry(index, &entries[index as usize], Some(start_ns + due_ns));
                written += write(&writer_shared, &e) as u64;
                index += 1;
            }
            (written, start.elapsed())
        })?;
    let (written, elapsed) = writer.join().map_err(|_| anyhow!("writer panicked"))?;
    stop.store(true, Ordering::Relaxed);
    let results: Vec<ReaderResult> = client_rt.block_on(async {
        let mut v = Vec::new();
        for t in tasks {
            v.push(t.await.unwrap_or_default());
        }
        v
    });
    let _ = stop_server.send(true);
    client_rt.shutdown_timeout(Duration::from_secs(2));
    server_rt.shutdown_timeout(Duration::from_secs(2));
    let mut lag = histogram();
    let mut batch = histogram();
    let (mut answers, mut empty, mut records, mut errors) = (0, 0, 0, 0);
    for r in &results {
        if let Some(h) = &r.lag {
            lag.add(h).map_err(|e| anyhow!("{e:?}"))?;
        }
        if let Some(h) = &r.batch {
            batch.add(h).map_err(|e| anyhow!("{e:?}"))?;
        }
        answers += r.answers;
        empty += r.empty;
        records += r.records;
        errors += r.errors;
    }
    let written_per_s = (written as f64 / elapsed.as_secs_f64()).round() as u64;
    let l = Latency::of(&lag);
    let b = Latency::of(&batch);
    let empty_share = if answers == 0 {
        0.0
    } else {
        empty as f64 / answers as f64
    };
    if args.json {
        println!(
            "{}",
            json!({
                "bench": "delivery", "scenario": format!("readers-{front}-{n}-wait-{wait_us}us"),
                "front": front.to_string(),
                "offered_per_s": args.rate, "throughput_per_s": written_per_s,
                "readers": n, "wait_us": wait_us, "lag_ns": l,
                "batch_records": {"mean": b.mean, "p50": b.p50, "p99": b.p99, "max": b.max},
                "answers": answers, "empty_share": (empty_share * 1e4).round() / 1e4,
                "records_received": records, "errors": errors,
                "readers_ready": readers_ready, "warm_up_s": warm_up_s,
                "machine": machine, "version": common::version(),
            })
        );
    } else {
        println!(
            "\nreaders {n} on {front} (20% unfiltered), wait_us {wait_us}: offered {} records/s, written {} records/s; load {}",
            common::count(args.rate),
            common::count(written_per_s),
            loadavg()
        );
        println!(
            "  answers {} ({:.1}% empty), records per answer mean {} p50 {} p99 {} max {}, records received {}, errors {}",
            common::count(answers),
            empty_share * 100.0,
            b.mean,
            b.p50,
            b.p99,
            b.max,
            common::count(records),
            errors
        );
        println!(
            "  lag mean {}; {readers_ready} of {n} readers connected and answered before the writer started ({warm_up_s:.2} s)",
            common::ns(l.mean)
        );
        println!("{}", common::latency_header());
        println!("{}", common::latency_row("lag", &l));
    }
    Ok(())
}

fn peer_run(peer: &str, args: &DeliveryBenchArgs) -> Result<()> {
    if peer != "tarantool" {
        return Err(anyhow!(
            "unknown peer `{peer}`: the one peer is `tarantool`"
        ));
    }
    let dir = std::path::Path::new("../shared/peers/tarantool-delivery");
    let have = std::process::Command::new("tarantool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have || !dir.join("run.sh").is_file() {
        println!(
            "\npeer tarantool: not run ({}); install it with `apt-get install tarantool` and run \
             from the repository's root, beside ../shared/peers/tarantool-delivery",
            if have {
                "the peer's scripts are not at ../shared/peers/tarantool-delivery"
            } else {
                "tarantool is not installed"
            }
        );
        return Ok(());
    }
    let scratch = common::ScratchDir::new("tarantool-delivery")?;
    // run.sh writes under `$PWD/$RESULTS_DIR`, so the scratch directory is named relative
    // to the peer's folder.
    let dir = dir.canonicalize()?;
    let up = "../".repeat(dir.components().count() - 1);
    let results = format!(
        "{up}{}",
        scratch.0.display().to_string().trim_start_matches('/')
    );
    let seconds = args.seconds.ceil().max(1.0) as u64;
    let run = |env: &[(&str, String)]| -> Result<()> {
        let mut c = std::process::Command::new("./run.sh");
        c.current_dir(&dir)
            .env("RESULTS_DIR", &results)
            .env("DURATION", seconds.to_string())
            .env("WARMUP", "1");
        for (k, v) in env {
            c.env(k, v);
        }
        let status = c.status()?;
        if !status.success() {
            return Err(anyhow!("tarantool peer run failed: {status}"));
        }
        Ok(())
    };
    run(&[("RATE", "0".into()), ("LABEL", "max".into())])?;
    run(&[
        ("RATE", "0".into()),
        ("BATCH", args.entry_commands.to_string()),
        ("LABEL", "max-batched".into()),
    ])?;
    for &n in &args.readers {
        for wait_us in [500u64, 0] {
            run(&[
                ("RATE", args.rate.to_string()),
                ("READERS", n.to_string()),
                ("UNFILTERED", (n / 5).max(1).to_string()),
                ("WAIT_US", wait_us.to_string()),
                ("MODE", "sleep".into()),
                ("LABEL", format!("r{n}-wait{wait_us}")),
            ])?;
        }
    }
    let table = std::process::Command::new("python3")
        .arg("table.py")
        .arg(scratch.0.join("all.jsonl"))
        .current_dir(&dir)
        .output()?;
    println!(
        "\npeer tarantool:\n{}",
        String::from_utf8_lossy(&table.stdout)
    );
    Ok(())
}
