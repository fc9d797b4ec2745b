//! `bourse bench recovery`: how fast a node of a replica group comes back.
//!
//! Two parts, both on one thread, both through the code a node runs:
//!
//! - **Replay.** A journal of `--commands` commands is written the way a node writes it (each
//!   record is openraft's entry holding a batch of `--batch` client requests, from
//!   `--clients` clients, the exchange-core order flow generated against a shadow engine).
//!   Then, `--rounds` times each: opening the journal (recovery's scan of every segment);
//!   reading its entries; decoding them (openraft's entry and the batch's framing: commands
//!   stay in their binary form until applied); applying the batches to a fresh replicated
//!   state (each command decoded once, the engine, the idempotency table with each request's
//!   encoded events, and a hash checkpoint every 1,000 entries, as a node applies them); applying the same commands to a bare
//!   engine (what the engine alone costs); and the whole path in one pass (read, decode,
//!   apply: a restart's replay). Each prints commands/s and the time per entry (p50 … max).
//!   Every replay must end in the shadow engine's state hash.
//! - **Snapshot.** A replicated state with `--accounts` accounts and `--positions-per-account`
//!   positions each (built with admin commands and an order placed and cancelled per
//!   position, as `bench capacity` does) is snapshotted `--snapshot-rounds` times: encoding
//!   the canonical bytes, hashing them, writing them through the journal's `SnapshotStore`
//!   (write, fsync of the file, rename and fsync of the directory timed apart), loading the
//!   newest snapshot back (read and CRC check) and restoring a state from it (decode, rebuild
//!   the engine's tables, recompute and compare the hash).
//!
//! What is excluded: the network (a snapshot sent to a follower), openraft's own bookkeeping,
//! and building the workload. The machine is shared with other builds; the load average is
//! printed with the figures.
//!
//! Each replay stage runs in a function of its own (`open_pass`, `read_pass`, `decode_pass`,
//! `apply_pass`, `engine_pass`, `replay_pass`), so its instructions, which other load does not
//! change, can be counted alone, e.g. for the replicated apply:
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='bourse::bench::recovery::apply_pass' \
//!   ./target/release/bourse bench recovery --commands 200000 --accounts 0 --rounds 1
//! ```
//!
//! and the total divided by the commands (`--rounds 1`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Result};
use bourse_cluster::batch::BatchBuilder;
use bourse_cluster::storage::{entry_command, entry_payload};
use bourse_cluster::{Batch, ClientRequest, CommittedRequest, LogCommand, ReplicatedState};
use bourse_core::*;
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_engine::{Engine, EngineConfig};
use bourse_journal::{
    Config as JournalConfig, DirEntry, Fsync, Journal, OpenMode, RealStorage, SegmentFile,
    SnapshotMeta, SnapshotStore, Storage,
};
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;

use super::common::{self, histogram, record, Latency, Machine};

/// Hash checkpoints during replay, as the cluster's default `hash_checkpoint_every_entries`.
const CHECKPOINT_EVERY_ENTRIES: u64 = 1_000;
/// Journal records appended per call while writing the benchmark's journal.
const APPEND_CHUNK_ENTRIES: usize = 1_024;

#[derive(Args)]
pub struct RecoveryBenchArgs {
    /// Commands in the replayed journal.
    #[arg(long, default_value_t = 1_000_000)]
    commands: usize,
    /// Client requests per log entry (the smart batcher's batch).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Distinct clients (idempotency keys) the requests come from.
    #[arg(long, default_value_t = 8)]
    clients: u64,
    /// Measured replays of each kind.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Accounts in the snapshotted state (0 skips the snapshot part).
    #[arg(long, default_value_t = 1_000_000)]
    accounts: u32,
    /// Positions per account in the snapshotted state (each in another instrument).
    #[arg(long, default_value_t = 10)]
    positions_per_account: u32,
    /// Instruments in the snapshotted state.
    #[arg(long, default_value_t = 100)]
    instruments: u32,
    /// Snapshots written and restored.
    #[arg(long, default_value_t = 3)]
    snapshot_rounds: usize,
    /// Where the journal and snapshots go (a fresh directory inside it, removed afterwards);
    /// the system's temporary directory by default.
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print one JSON object per figure instead of tables.
    #[arg(long)]
    json: bool,
}

pub fn recovery(args: RecoveryBenchArgs) -> Result<()> {
    if args.commands == 0 || args.batch == 0 || args.clients == 0 || args.rounds == 0 {
        bail!("--commands, --batch, --clients and --rounds must be positive");
    }
    if args.batch > bourse_cluster::batch::REQUESTS_PER_BATCH_MAX as usize {
        bail!(
            "--batch may be at most {} (the cluster's batch limit)",
            bourse_cluster::batch::REQUESTS_PER_BATCH_MAX
        );
    }
    if args.accounts > 0 && (args.instruments == 0 || args.positions_per_account > args.instruments)
    {
        bail!("--instruments must be positive and at least --positions-per-account");
    }
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let work = common::ScratchDir::under(&base, "bench-recovery")?;
    let machine = Machine::this();
    if !args.json {
        println!(
            "bourse bench recovery — one thread; {} ({} cpus), version {}; load average at \
             start {:.2} (a shared machine: other builds and tests run beside it)",
            machine.model,
            machine.cpus,
            common::version(),
            machine.load_average_start
        );
    }
    replay(&args, &work.0)?;
    if args.accounts > 0 {
        snapshot(&args, &work.0)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Replay

fn engine_config() -> EngineConfig {
    EngineConfig {
        orders_max: 1 << 20,
        ..EngineConfig::default()
    }
}

/// The generated history: batches of requests and the shadow engine's final hash.
struct History {
    batches: Vec<Vec<ClientRequest>>,
    commands: u64,
    final_hash: u64,
}

fn generate(args: &RecoveryBenchArgs) -> Result<History> {
    let mut engine = Engine::new(engine_config());
    let mut flow = Flow::new(FlowConfig::exchange_core(args.seed));
    let mut events = Vec::with_capacity(1024);
    let mut ts = 1_000_000_000u64;
    let mut seqs = vec![0u64; args.clients as usize];
    let mut batches = Vec::with_capacity(args.commands / args.batch + 1);
    let mut batch = Vec::with_capacity(args.batch);
    let mut setup = flow.setup().into_iter();
    for i in 0..args.commands {
        ts += 1_000;
        let body = setup.next().unwrap_or_else(|| flow.next_command());
        let command = Command::new(ts, body);
        events.clear();
        engine.apply(&command, &mut events);
        flow.observe(&events);
        let client = i as u64 % args.clients;
        seqs[client as usize] += 1;
        batch.push(ClientRequest {
            client_id: client + 1,
            request_seq: seqs[client as usize],
            command,
        });
        if batch.len() == args.batch {
            batches.push(std::mem::replace(
                &mut batch,
                Vec::with_capacity(args.batch),
            ));
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    Ok(History {
        batches,
        commands: args.commands as u64,
        final_hash: engine.state_hash(),
    })
}

fn journal_config() -> JournalConfig {
    let mut config = JournalConfig::new(1, 1);
    config.fsync = Fsync::Never;
    config
}

/// Writes the history as a node's journal; returns its size in bytes.
fn write_journal(dir: &Path, history: &History) -> Result<u64> {
    let (mut journal, _) = Journal::open(dir, journal_config())?;
    let mut chunk = Vec::with_capacity(APPEND_CHUNK_ENTRIES);
    for (index, requests) in history.batches.iter().enumerate() {
        let payload = entry_payload(1, index as u64, LogCommand::batch(requests));
        chunk.push(bourse_journal::Entry {
            index: index as u64,
            term: 1,
            payload,
        });
        if chunk.len() == APPEND_CHUNK_ENTRIES {
            journal.append(&chunk)?;
            chunk.clear();
        }
    }
    journal.append(&chunk)?;
    journal.flush()?;
    let mut bytes = 0;
    for e in std::fs::read_dir(dir)? {
        bytes += e?.metadata()?.len();
    }
    Ok(bytes)
}

/// One replay figure: the time per entry and the whole pass.
struct Figure {
    name: &'static str,
    what: &'static str,
    per_entry: Histogram<u64>,
    total_ns: u64,
    commands: u64,
}

impl Figure {
    fn new(name: &'static str, what: &'static str) -> Figure {
        Figure {
            name,
            what,
            per_entry: histogram(),
            total_ns: 0,
            commands: 0,
        }
    }

    fn per_s(&self) -> f64 {
        self.commands as f64 / (self.total_ns.max(1) as f64 / 1e9)
    }
}

fn replay(args: &RecoveryBenchArgs, work: &Path) -> Result<()> {
    let t = Instant::now();
    let history = generate(args)?;
    let dir = work.join("journal");
    let journal_bytes = write_journal(&dir, &history)?;
    let entries = history.batches.len() as u64;
    if !args.json {
        println!(
            "\nreplay: {} commands in {} entries of {} requests from {} clients, journal {:.1} MiB \
             ({:.0} bytes per command), built in {:.1} s",
            common::count(history.commands),
            common::count(entries),
            args.batch,
            args.clients,
            journal_bytes as f64 / (1 << 20) as f64,
            journal_bytes as f64 / history.commands as f64,
            t.elapsed().as_secs_f64()
        );
    }

    let mut open = Figure::new(
        "open",
        "Journal::open: scan and check every segment (CRC, chain)",
    );
    let mut read = Figure::new(
        "read",
        "Journal::entries: read each record (payload copied out)",
    );
    let mut decode = Figure::new(
        "decode",
        "bincode of openraft's entry to the batch of requests",
    );
    let mut apply = Figure::new(
        "apply",
        "ReplicatedState::apply_batch + entry_applied: engine, idempotency table, outcomes",
    );
    let mut engine_only = Figure::new("engine", "Engine::apply alone over the same commands");
    let mut full = Figure::new(
        "replay",
        "read + decode + apply in one pass (a restart's replay)",
    );

    for _ in 0..args.rounds {
        let journal = open_pass(&dir, entries, &mut open)?;
        open.commands += history.commands;
        let payloads = read_pass(&journal, entries, &mut read)?;
        read.commands += history.commands;
        drop(journal);
        let batches = decode_pass(&payloads, &mut decode)?;
        decode.commands += history.commands;
        drop(payloads);
        let state = apply_pass(&batches, args.batch, &mut apply);
        apply.commands += history.commands;
        if state.engine().state_hash() != history.final_hash {
            bail!("the replicated replay ended in another state than the shadow engine");
        }
        drop(state);
        let engine = engine_pass(&history.batches, &mut engine_only);
        engine_only.commands += history.commands;
        if engine.state_hash() != history.final_hash {
            bail!("the engine replay ended in another state than the shadow engine");
        }
        drop(engine);
        drop(batches);
        let state = replay_pass(&dir, args.batch, &mut full)?;
        full.commands += history.commands;
        if state.engine().state_hash() != history.final_hash {
            bail!("the full replay ended in another state than the shadow engine");
        }
    }

    let figures = [&open, &read, &decode, &apply, &engine_only, &full];
    if args.json {
        for f in figures {
            println!(
                "{}",
                json!({"bench": "recovery", "scenario": format!("replay-{}", f.name),
                       "what": f.what, "commands": history.commands, "rounds": args.rounds,
                       "batch": args.batch, "commands_per_s": f.per_s().round(),
                       "per_entry_ns": Latency::of(&f.per_entry)})
            );
        }
    } else {
        println!(
            "  {:<8} {:>14} {:>10} {:>10} {:>10} {:>10}   time per entry of {} commands; {} rounds",
            "stage", "commands/s", "p50", "p99", "p99.9", "max", args.batch, args.rounds
        );
        for f in figures {
            let l = Latency::of(&f.per_entry);
            println!(
                "  {:<8} {:>14} {:>10} {:>10} {:>10} {:>10}   {}",
                f.name,
                common::count(f.per_s().round() as u64),
                common::ns(l.p50),
                common::ns(l.p99),
                common::ns(l.p999),
                common::ns(l.max),
                f.what
            );
        }
        println!(
            "  (open's time per entry is the scan divided by the entries; goal: replay ≥ \
             5,000,000 commands/s)"
        );
    }
    Ok(())
}

// Each stage is a function of its own, never inlined, so that callgrind can count the
// instructions of one stage alone (`--toggle-collect=bourse::bench::recovery::apply_pass`;
// see the module documentation): a figure that other processes on the machine do not change.

/// Opening the journal: recovery's scan of every segment.
#[inline(never)]
fn open_pass(dir: &Path, entries: u64, figure: &mut Figure) -> Result<Journal> {
    let t = Instant::now();
    let (journal, _) = Journal::open(dir, journal_config())?;
    let elapsed_ns = t.elapsed().as_nanos() as u64;
    figure.total_ns += elapsed_ns;
    record(&mut figure.per_entry, elapsed_ns / entries.max(1));
    Ok(journal)
}

/// Reading every record's payload.
#[inline(never)]
fn read_pass(journal: &Journal, entries: u64, figure: &mut Figure) -> Result<Vec<Vec<u8>>> {
    let mut payloads = Vec::with_capacity(entries as usize);
    let t = Instant::now();
    let mut last = t;
    for record_result in journal.entries(..)? {
        payloads.push(record_result?.payload);
        let now = Instant::now();
        record(&mut figure.per_entry, (now - last).as_nanos() as u64);
        last = now;
    }
    figure.total_ns += t.elapsed().as_nanos() as u64;
    Ok(payloads)
}

/// Decoding every payload (openraft's entry, then the batch's framing) into its batch.
#[inline(never)]
fn decode_pass(payloads: &[Vec<u8>], figure: &mut Figure) -> Result<Vec<Batch>> {
    let mut batches = Vec::with_capacity(payloads.len());
    let t = Instant::now();
    let mut last = t;
    for p in payloads {
        match entry_command(p).map_err(|e| anyhow!("decode: {e}"))? {
            Some(LogCommand::Batch(batch)) => batches.push(batch),
            other => bail!("unexpected entry {other:?}"),
        }
        let now = Instant::now();
        record(&mut figure.per_entry, (now - last).as_nanos() as u64);
        last = now;
    }
    figure.total_ns += t.elapsed().as_nanos() as u64;
    Ok(batches)
}

/// Applying the batches to a fresh replicated state, as a node applies committed entries.
#[inline(never)]
fn apply_pass(batches: &[Batch], batch: usize, figure: &mut Figure) -> ReplicatedState {
    let mut state = ReplicatedState::new(engine_config(), CHECKPOINT_EVERY_ENTRIES);
    let mut outcomes: Vec<CommittedRequest> = Vec::with_capacity(batch);
    let t = Instant::now();
    let mut last = t;
    for (index, requests) in (1u64..).zip(batches) {
        outcomes.clear();
        state.apply_batch(requests, index, &mut outcomes);
        state.entry_applied(index);
        let now = Instant::now();
        record(&mut figure.per_entry, (now - last).as_nanos() as u64);
        last = now;
    }
    figure.total_ns += t.elapsed().as_nanos() as u64;
    state
}

/// Applying the same commands to a bare engine: what the engine alone costs.
#[inline(never)]
fn engine_pass(batches: &[Vec<ClientRequest>], figure: &mut Figure) -> Engine {
    let mut engine = Engine::new(engine_config());
    let mut events = Vec::with_capacity(1024);
    let t = Instant::now();
    let mut last = t;
    for requests in batches {
        for r in requests {
            events.clear();
            engine.apply(&r.command, &mut events);
        }
        let now = Instant::now();
        record(&mut figure.per_entry, (now - last).as_nanos() as u64);
        last = now;
    }
    figure.total_ns += t.elapsed().as_nanos() as u64;
    engine
}

/// The whole path in one pass, as a restarting node replays its log after its snapshot:
/// open, read, decode, apply.
#[inline(never)]
fn replay_pass(dir: &Path, batch: usize, figure: &mut Figure) -> Result<ReplicatedState> {
    let t = Instant::now();
    let (journal, _) = Journal::open(dir, journal_config())?;
    let mut state = ReplicatedState::new(engine_config(), CHECKPOINT_EVERY_ENTRIES);
    let mut outcomes: Vec<CommittedRequest> = Vec::with_capacity(batch);
    let mut last = Instant::now();
    for record_result in journal.entries(..)? {
        let r = record_result?;
        let Some(LogCommand::Batch(requests)) =
            entry_command(&r.payload).map_err(|e| anyhow!("decode: {e}"))?
        else {
            bail!("unexpected entry at {}", r.index);
        };
        outcomes.clear();
        state.apply_batch(&requests, r.index, &mut outcomes);
        state.entry_applied(r.index);
        let now = Instant::now();
        record(&mut figure.per_entry, (now - last).as_nanos() as u64);
        last = now;
    }
    figure.total_ns += t.elapsed().as_nanos() as u64;
    Ok(state)
}

// ---------------------------------------------------------------------------------------
// Snapshot

/// Time spent in each kind of file operation, for the snapshot write's breakdown.
#[derive(Debug, Default)]
struct FileTimes {
    write_ns: AtomicU64,
    sync_ns: AtomicU64,
    read_ns: AtomicU64,
    dir_ns: AtomicU64,
}

impl FileTimes {
    fn take(&self) -> [u64; 4] {
        [
            self.write_ns.swap(0, Ordering::Relaxed),
            self.sync_ns.swap(0, Ordering::Relaxed),
            self.read_ns.swap(0, Ordering::Relaxed),
            self.dir_ns.swap(0, Ordering::Relaxed),
        ]
    }
}

fn timed<T>(counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    counter.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    out
}

/// The real file system, timing writes, fsyncs, reads and directory operations.
#[derive(Debug)]
struct TimedStorage {
    times: Arc<FileTimes>,
}

#[derive(Debug)]
struct TimedFile {
    inner: Box<dyn SegmentFile>,
    times: Arc<FileTimes>,
}

impl Storage for TimedStorage {
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        RealStorage.create_dir_all(path)
    }
    fn list_dir(&self, path: &Path) -> std::io::Result<Vec<DirEntry>> {
        RealStorage.list_dir(path)
    }
    fn open_file(&self, path: &Path, mode: OpenMode) -> std::io::Result<Box<dyn SegmentFile>> {
        Ok(Box::new(TimedFile {
            inner: RealStorage.open_file(path, mode)?,
            times: self.times.clone(),
        }))
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        RealStorage.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        timed(&self.times.dir_ns, || RealStorage.rename(from, to))
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        timed(&self.times.dir_ns, || RealStorage.sync_dir(path))
    }
}

impl SegmentFile for TimedFile {
    fn size_bytes(&self) -> std::io::Result<u64> {
        self.inner.size_bytes()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        timed(&self.times.read_ns, || {
            self.inner.read_exact_at(buf, offset)
        })
    }
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let times = self.times.clone();
        timed(&times.write_ns, || self.inner.write_all_at(buf, offset))
    }
    fn sync_data(&mut self) -> std::io::Result<()> {
        let times = self.times.clone();
        timed(&times.sync_ns, || self.inner.sync_data())
    }
    fn set_len(&mut self, len_bytes: u64) -> std::io::Result<()> {
        self.inner.set_len(len_bytes)
    }
}

/// Requests per batch while building the snapshotted state.
const BUILD_BATCH_REQUESTS: usize = 1_024;

/// Feeds commands of one client to a replicated state in batches.
struct Builder {
    state: ReplicatedState,
    batch: BatchBuilder,
    outcomes: Vec<CommittedRequest>,
    /// The log index the next batch would have.
    index: u64,
    seq: u64,
}

impl Builder {
    fn push(&mut self, body: CommandBody) {
        self.seq += 1;
        self.batch.push(&ClientRequest {
            client_id: 1,
            request_seq: self.seq,
            command: Command::new(self.seq, body),
        });
        if self.batch.len() == BUILD_BATCH_REQUESTS {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.outcomes.clear();
        let batch = std::mem::replace(
            &mut self.batch,
            BatchBuilder::with_capacity(BUILD_BATCH_REQUESTS),
        );
        self.index += 1;
        self.state
            .apply_batch(&batch.finish(), self.index, &mut self.outcomes);
    }
}

/// Builds the state with admin commands through the replicated state's own apply.
fn build_state(args: &RecoveryBenchArgs) -> Result<ReplicatedState> {
    let config = EngineConfig {
        orders_max: 1 << 16,
        accounts_max: args.accounts,
        instruments_max: args.instruments,
        levels_per_side_hint: 64,
        first_order_id: 1,
    };
    let mut b = Builder {
        state: ReplicatedState::new(config, u64::MAX),
        batch: BatchBuilder::with_capacity(BUILD_BATCH_REQUESTS),
        outcomes: Vec::with_capacity(BUILD_BATCH_REQUESTS),
        index: 0,
        seq: 0,
    };
    for i in 0..args.instruments {
        let instrument = bourse_engine::fixtures::equity(i + 1, &format!("I{i}"), 100_000);
        b.push(CommandBody::AddInstrument(instrument));
    }
    for a in 0..args.accounts {
        b.push(CommandBody::AddAccount(AccountSpec {
            account: AccountId(a + 1),
            firm: FirmId(a / 100 + 1),
            may_short: false,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        }));
        b.push(CommandBody::Deposit {
            account: AccountId(a + 1),
            amount: Cash(1_000_000_0000),
        });
    }
    // A position record is created the first time an account orders an instrument; an order
    // placed and cancelled (by the client's own order id) leaves an empty position behind.
    for a in 0..args.accounts {
        for p in 0..args.positions_per_account {
            let instrument = InstrumentId((a + p) % args.instruments + 1);
            let cl_ord_id = ClOrdId(u64::from(p) + 1);
            b.push(CommandBody::NewOrder(NewOrder {
                firm: None,
                account: AccountId(a + 1),
                cl_ord_id,
                instrument,
                side: Side::Buy,
                ord_type: OrdType::Limit,
                price: Price(90_000),
                qty: Qty(1),
                tif: TimeInForce::Day,
                expire_ts_ns: 0,
                display_qty: Qty(0),
            }));
            b.push(CommandBody::Cancel(Cancel {
                account: AccountId(a + 1),
                cl_ord_id: ClOrdId(0),
                target: OrderRef {
                    order_id: None,
                    orig_cl_ord_id: Some(cl_ord_id),
                },
            }));
        }
    }
    b.flush();
    let state = b.state;
    let counters = *state.engine().counters();
    let positions = state.engine().positions().count() as u64;
    let wanted = u64::from(args.accounts) * u64::from(args.positions_per_account);
    if state.engine().account_count() != args.accounts as usize || positions != wanted {
        bail!(
            "the built state has {} accounts and {positions} positions, not {} and {wanted} \
             (orders rejected: {})",
            state.engine().account_count(),
            args.accounts,
            counters.orders_rejected
        );
    }
    Ok(state)
}

fn snapshot(args: &RecoveryBenchArgs, work: &Path) -> Result<()> {
    let t = Instant::now();
    let state = build_state(args)?;
    let positions = u64::from(args.accounts) * u64::from(args.positions_per_account);
    if !args.json {
        println!(
            "\nsnapshot: {} accounts, {} positions over {} instruments, built in {:.1} s \
             (resident memory {:.1} GiB)",
            common::count(u64::from(args.accounts)),
            common::count(positions),
            args.instruments,
            t.elapsed().as_secs_f64(),
            common::rss_bytes() as f64 / (1u64 << 30) as f64
        );
    }
    let times = Arc::new(FileTimes::default());
    let storage: Arc<dyn Storage> = Arc::new(TimedStorage {
        times: times.clone(),
    });
    let (mut store, _) = SnapshotStore::open_with_storage(storage, work.join("snapshots"), 1, 2)?;
    let names = [
        "encode",
        "hash",
        "write",
        "fsync",
        "rename+dir",
        "load",
        "restore",
        "rehash",
        "checkpoint",
    ];
    let whats = [
        "ReplicatedState::snapshot: the canonical bytes",
        "xxh3-64 of the bytes (the state hash the snapshot records)",
        "SnapshotStore::write: writing the temporary file",
        "SnapshotStore::write: fdatasync of the temporary file",
        "SnapshotStore::write: rename into place, fsync of the directory",
        "SnapshotStore::latest: read the newest file and check its CRC",
        "ReplicatedState::restore: decode and rebuild the engine's tables",
        "state hash of the restored state, compared with the recorded one",
        "ReplicatedState::checkpoint_hash: one hash checkpoint (until session 3: encode + hash)",
    ];
    let mut h: Vec<Histogram<u64>> = names.iter().map(|_| histogram()).collect();
    let mut size_bytes = 0u64;
    for round in 0..args.snapshot_rounds {
        times.take();
        let t = Instant::now();
        let bytes = state.snapshot();
        record(&mut h[0], t.elapsed().as_nanos() as u64);
        size_bytes = bytes.len() as u64;
        let t = Instant::now();
        let hash = xxhash_rust::xxh3::xxh3_64(&bytes);
        record(&mut h[1], t.elapsed().as_nanos() as u64);
        store.write(
            SnapshotMeta {
                cluster_id: 1,
                last_index: round as u64 + 1,
                last_term: 1,
                state_hash: hash,
                chain_hash: 0,
            },
            &bytes,
        )?;
        let [write, sync, _, dir] = times.take();
        record(&mut h[2], write);
        record(&mut h[3], sync);
        record(&mut h[4], dir);
        drop(bytes);
        let t = Instant::now();
        let latest = store.latest()?;
        record(&mut h[5], t.elapsed().as_nanos() as u64);
        let snap = latest
            .snapshot
            .ok_or_else(|| anyhow!("the snapshot just written is not found"))?;
        let t = Instant::now();
        let restored = ReplicatedState::restore(&snap.data, CHECKPOINT_EVERY_ENTRIES)
            .map_err(|e| anyhow!("restore: {e}"))?;
        record(&mut h[6], t.elapsed().as_nanos() as u64);
        drop(snap.data);
        let t = Instant::now();
        let rehash = restored.state_hash();
        record(&mut h[7], t.elapsed().as_nanos() as u64);
        if rehash != snap.meta.state_hash || rehash != hash {
            bail!("the restored state's hash differs from the snapshot's");
        }
        // A checkpoint every `CHECKPOINT_EVERY_ENTRIES` entries: what it costs now (the output
        // digest folded with counters), timed over many calls since one is too short to time.
        const CHECKPOINT_CALLS: u64 = 10_000;
        let t = Instant::now();
        let mut fold = 0u64;
        for i in 0..CHECKPOINT_CALLS {
            fold ^= std::hint::black_box(&restored).checkpoint_hash(i);
        }
        std::hint::black_box(fold);
        record(
            &mut h[8],
            (t.elapsed().as_nanos() as u64 / CHECKPOINT_CALLS).max(1),
        );
        drop(restored);
    }
    if args.json {
        for (i, name) in names.iter().enumerate() {
            println!(
                "{}",
                json!({"bench": "recovery", "scenario": format!("snapshot-{name}"),
                       "what": whats[i], "accounts": args.accounts, "positions": positions,
                       "snapshot_bytes": size_bytes, "rounds": args.snapshot_rounds,
                       "ns": Latency::of(&h[i])})
            );
        }
    } else {
        println!(
            "  snapshot size {:.1} MiB ({:.1} bytes per position); {} rounds",
            size_bytes as f64 / (1 << 20) as f64,
            size_bytes as f64 / positions.max(1) as f64,
            args.snapshot_rounds
        );
        println!(
            "  {:<11} {:>10} {:>10} {:>10} {:>10}",
            "step", "p50", "p99", "max", "MB/s p50"
        );
        for (i, name) in names.iter().enumerate() {
            let l = Latency::of(&h[i]);
            println!(
                "  {:<11} {:>10} {:>10} {:>10} {:>10.0}   {}",
                name,
                common::ns(l.p50),
                common::ns(l.p99),
                common::ns(l.max),
                size_bytes as f64 / 1e6 / (l.p50.max(1) as f64 / 1e9),
                whats[i]
            );
        }
    }
    Ok(())
}
