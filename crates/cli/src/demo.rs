//! `bourse demo`: the whole venue on this machine, with simulated participants.
//!
//! One command, no setup: a trading core per market (equities, FX, futures), each a replica
//! group of three nodes (openraft over the journal) publishing market data, a gateway in front
//! of them routing by instrument, and a live dashboard. Simulated participants (the load
//! generator's flows: market makers' limit orders, takers' marketable orders, cancels,
//! replaces, mass cancels) trade through binary order entry sessions on the gateway, open
//! loop at `--rate` commands per second, until Ctrl-C or `--seconds N`. A FIX session named
//! `DEMO` is left free for a person to trade beside them with `bourse order`. At the end the
//! demo writes the load-test report (HTML, Markdown, JSON) into a directory it names, prints
//! the summary, and checks its figures against what the cores and the market data feed say.
//!
//! The dashboard is the gateway's monitor, served on 127.0.0.1:8088 (or a free port): its
//! sessions, request rates and queue depths, and `/metrics` for Prometheus.
//! `--in-process-cores` runs one engine per market inside the gateway instead of the
//! replicated cores, for a machine where the three replica groups are too much.

use anyhow::{anyhow, bail, Context, Result};
use bourse_core::{Event, Phase, Side};
use bourse_loadgen::profile::{Profile, PHASE_DURATION_S_MAX};
use bourse_loadgen::{report, RunOptions};
use bourse_monitor::{DashboardServer, Monitor, MonitorConfig};
use bourse_venue::{Backend, LocalDeployment};
use clap::Args;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct DemoArgs {
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    seconds: Option<u64>,
    /// Commands per second the participants send, all markets together.
    #[arg(long, default_value_t = 5_000)]
    rate: u64,
    /// Participant accounts per market.
    #[arg(long, default_value_t = 2_000)]
    accounts: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Port of the dashboard and /metrics on 127.0.0.1 (0: any free port). Without it, 8088,
    /// or any free port if 8088 is taken.
    #[arg(long)]
    dashboard_port: Option<u16>,
    /// Run without the dashboard and /metrics.
    #[arg(long)]
    no_dashboard: bool,
    /// One engine per market inside the gateway instead of replica groups of three nodes.
    #[arg(long)]
    in_process_cores: bool,
    /// Where the report goes (default: bourse-demo-<unix time> in the current directory).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep the dashboard serving this many seconds after the run ends (Ctrl-C ends it early).
    #[arg(long, default_value_t = 0)]
    linger_seconds: u64,
    /// Port of the data-delivery node (GetOrders) on 127.0.0.1 (0: any free port). Without
    /// it, 8700, or any free port if 8700 is taken.
    #[arg(long)]
    delivery_port: Option<u16>,
    /// Run without the data-delivery node.
    #[arg(long)]
    no_delivery: bool,
    /// Port of the clearing service's HTTP API on 127.0.0.1 (0: any free port). Without it,
    /// 8095, or any free port if 8095 is taken.
    #[arg(long)]
    clearing_port: Option<u16>,
    /// Run without the clearing service.
    #[arg(long)]
    no_clearing: bool,
    /// Also publish each replicated core's order log as TotalView-ITCH 5.0 over MoldUDP64 to
    /// 127.0.0.1:PORT+2i (core i), with its retransmission server on PORT+2i+1.
    #[arg(long)]
    itch_port: Option<u16>,
    /// Port of the admin API on 127.0.0.1 (0: any free port). Without it, 8090, or any free
    /// port if 8090 is taken.
    #[arg(long)]
    admin_port: Option<u16>,
    /// Run without the admin API.
    #[arg(long)]
    no_admin: bool,
    /// Play a MOEX trading day, compressed: the schedule driver issues the phases (the
    /// opening and closing auctions on equities and FX, open, the clearing pauses, closed)
    /// and the end of day through the admin path, from 09:48 Moscow time of a Monday on
    /// (docs/admin.md, "The trading day").
    #[arg(long)]
    day: bool,
    /// With --day: scheduled seconds per real second (60: a minute per hour).
    #[arg(long, default_value_t = 60)]
    day_speed: u64,
    /// With --day: the venue config whose `[schedule]` the day follows (calendar, and per
    /// market its sessions and end of day; docs/admin.md, "The trading day"). Without it,
    /// MOEX's day: equities and FX with their call auctions, futures without.
    #[arg(long)]
    schedule: Option<PathBuf>,
}

impl DemoArgs {
    /// The demo's venue for a benchmark at `rate`: every service on, on free ports, no output.
    pub(crate) fn quiet(rate: u64) -> DemoArgs {
        DemoArgs {
            seconds: None,
            rate,
            accounts: 2_000,
            seed: 1,
            dashboard_port: Some(0),
            no_dashboard: false,
            in_process_cores: false,
            out: None,
            linger_seconds: 0,
            delivery_port: Some(0),
            no_delivery: false,
            // The venue whose cost `bench venue` measures has no clearing service following
            // its streams (its figures stay comparable with earlier sessions'); a run of
            // `bourse demo` has one.
            clearing_port: Some(0),
            no_clearing: true,
            itch_port: None,
            admin_port: Some(0),
            no_admin: false,
            day: false,
            day_speed: 60,
            schedule: None,
        }
    }
}

/// With `--day`: drives the schedule on the deployment's runtime over a clock that runs
/// `speed` times faster than the wall clock from a Monday 09:48 Moscow time, printing each
/// transition as it is issued, until `stop` is set.
fn play_day(
    deployment: &LocalDeployment,
    service: Arc<bourse_admin::AdminService>,
    day: &DemoDay,
    (board, monitor): (Arc<Mutex<AuctionBoard>>, Option<Arc<Monitor>>),
    stop: Arc<AtomicBool>,
) -> Result<()> {
    use bourse_admin::schedule::{Schedule, ScheduleDriver};
    use bourse_clearing::Clock as _;
    let (speed, config_given) = (day.clock.speed, day.given);
    let schedule = Schedule::new(&day.config).map_err(|e| anyhow!(e))?;
    let clock = Arc::clone(&day.clock);
    let mut driver = ScheduleDriver::new(schedule, service, clock.start_ns);
    let rt = deployment
        .runtime_handle()
        .context("the deployment is stopped")?;
    println!(
        "  trading day: {} from 09:48 Moscow time, {speed}x faster",
        if config_given {
            "the --schedule day"
        } else {
            "a MOEX day (call auctions on equities and FX)"
        }
    );
    watch_auctions(deployment, &rt, &board, &stop);
    rt.spawn(async move {
        // The day starts before the first session: every market is closed until 09:50.
        for (due, outcome) in driver.enter_phase_in_force().await {
            println!(
                "  schedule in force since {} {:<9} {:?}: {outcome}",
                due.local, due.market, due.transition
            );
        }
        while !stop.load(Ordering::Relaxed) {
            tokio_sleep_ms(100).await;
            let simulated = clock.now_ns();
            // The board stamps what it reads with the schedule's local time (Moscow, UTC+3)
            // of the step that issued it: within one step (100 ms of real time) of the event.
            let minute = (simulated / MIN_NS + 180) % (24 * 60);
            if let Ok(mut b) = board.lock() {
                b.clock = format!("{:02}:{:02}", minute / 60, minute % 60);
            }
            for (due, outcome) in driver.step(simulated).await {
                println!(
                    "  schedule {} {:<9} {:?}: {outcome}",
                    &due.local[11..],
                    due.market,
                    due.transition
                );
            }
            if let (Some(m), Ok(b)) = (&monitor, board.lock()) {
                for (name, text) in b.figures() {
                    m.set_figure(&name, text);
                }
            }
        }
    });
    Ok(())
}

/// A minute in nanoseconds.
const MIN_NS: u64 = 60_000_000_000;

/// The day `--day` plays: its schedule, whether `--schedule` gave it, the file the clearing
/// service reads it from, and the compressed clock both follow.
struct DemoDay {
    config: bourse_admin::schedule::ScheduleConfig,
    given: bool,
    file: PathBuf,
    clock: Arc<DayClock>,
}

/// A clock that runs `speed` times faster than the wall clock from a Monday 09:48 Moscow
/// time (2026-11-23, two minutes before the opening auction): the schedule driver and the
/// clearing service read the same day.
struct DayClock {
    start_ns: u64,
    t0: Instant,
    speed: u64,
}

impl DayClock {
    fn monday_morning(speed: u64) -> DayClock {
        // Monday 2026-11-23 (day 20,780 since 1970-01-01), 09:48 in UTC+3.
        DayClock {
            start_ns: (20_780 * 24 * 60 + 9 * 60 + 48 - 180) * MIN_NS,
            t0: Instant::now(),
            speed,
        }
    }
}

impl bourse_clearing::Clock for DayClock {
    fn now_ns(&self) -> u64 {
        self.start_ns + self.t0.elapsed().as_nanos() as u64 * self.speed
    }
}

impl DemoDay {
    /// The day of `--schedule` (its file as given), else MOEX's day (call auctions on the
    /// equities and FX markets, none on futures, as SPECTRA), written into `out` for the
    /// clearing service to read.
    fn new(
        args: &DemoArgs,
        given: Option<bourse_admin::schedule::ScheduleConfig>,
        markets: &[&str],
        out: &std::path::Path,
    ) -> Result<DemoDay> {
        let clock = Arc::new(DayClock::monday_morning(args.day_speed));
        if let (Some(config), Some(file)) = (given, &args.schedule) {
            return Ok(DemoDay {
                config,
                given: true,
                file: file.clone(),
                clock,
            });
        }
        let with_auctions: Vec<(&str, bool)> =
            markets.iter().map(|m| (*m, *m != "futures")).collect();
        let config = bourse_admin::schedule::ScheduleConfig::moex(&with_auctions);
        std::fs::create_dir_all(out).with_context(|| format!("{}", out.display()))?;
        let file = out.join("venue-schedule.toml");
        std::fs::write(&file, schedule_toml(&config))
            .with_context(|| format!("{}", file.display()))?;
        Ok(DemoDay {
            config,
            given: false,
            file,
            clock,
        })
    }
}

/// A schedule as a venue config's `[schedule]` (the format docs/admin.md describes).
fn schedule_toml(config: &bourse_admin::schedule::ScheduleConfig) -> String {
    let quoted = |v: &[String]| {
        v.iter()
            .map(|d| format!("{d:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = format!(
        "# The day `bourse demo --day` plays (written by the demo for its clearing service).\n\
         [schedule]\nutc_offset_minutes = {}\nbusiness_days = [{}]\nholidays = [{}]\n\
         random_end_seed = {}\n",
        config.utc_offset_minutes,
        quoted(&config.business_days),
        quoted(&config.holidays),
        config.random_end_seed,
    );
    for m in &config.markets {
        let sessions: Vec<String> = m
            .sessions
            .iter()
            .map(|s| {
                // A phase's name as the config spells it (a JSON string is a TOML string).
                let phase = serde_json::to_string(&s.phase).unwrap_or_default();
                format!(
                    "{{ from = {:?}, to = {:?}, phase = {phase}, random_end_seconds = {} }}",
                    s.from, s.to, s.random_end_seconds
                )
            })
            .collect();
        text.push_str(&format!(
            "\n[[schedule.markets]]\nmarket = {:?}\nsessions = [{}]\nend_of_day = {:?}\n",
            m.market,
            sessions.join(", "),
            m.end_of_day
        ));
    }
    text
}

/// Default clearing port when none is given.
const CLEARING_PORT_DEFAULT: u16 = 8095;

/// The demo's clearing service on every replicated core (none for in-process cores or with
/// `--no-clearing`): the demo's operator (`password`) asks it for runs, and with `--day` it
/// runs by itself at the day's clearing pauses.
fn start_clearing(
    args: &DemoArgs,
    deployment: &mut LocalDeployment,
    out: &std::path::Path,
    password: &str,
    day: Option<&DemoDay>,
) -> Result<bool> {
    if args.no_clearing || args.in_process_cores {
        return Ok(false);
    }
    let operator = bourse_auth::CredentialEntry {
        name: DEMO_OPERATOR.into(),
        password_hash: bourse_auth::hash_password(password)?,
        roles: vec![bourse_clearing::server::ROLE_OPERATOR.into()],
    };
    let options = |port: u16| bourse_venue::ClearingOptions {
        state_dir: out.join("clearing"),
        listen: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        operators: vec![operator.clone()],
        schedule: day.map(|d| {
            let clock: Arc<dyn bourse_clearing::Clock> = d.clock.clone();
            (d.file.clone(), clock)
        }),
    };
    match args.clearing_port {
        Some(port) => deployment
            .start_clearing(options(port))
            .map_err(|e| anyhow!("{e:#} (try --clearing-port 0 or --no-clearing)"))?,
        None => deployment
            .start_clearing(options(CLEARING_PORT_DEFAULT))
            .or_else(|_| deployment.start_clearing(options(0)))?,
    }
    Ok(true)
}

/// What `--day` shows of the call auctions, read from each core's committed stream (the
/// events the feeds publish): per instrument in a call its latest indicative uncrossing, and
/// every uncrossing with its trades. The dashboard lists it as figures and the report ends
/// with the uncrossings.
#[derive(Default)]
pub(crate) struct AuctionBoard {
    /// Instrument id -> (market, symbol, price scale).
    names: BTreeMap<u32, (String, String, u8)>,
    /// Instrument id -> (auction phase, price, quantity, surplus, surplus side).
    indicative: BTreeMap<u32, (Phase, i64, i64, i64, Option<Side>)>,
    /// Instrument id -> auction trades since its last uncrossing.
    trades: BTreeMap<u32, u64>,
    /// Every uncrossing: the schedule's clock, instrument, auction, price, quantity, trades.
    uncrossings: Vec<(String, u32, Phase, i64, i64, u64)>,
    /// The schedule's local time (HH:MM) of the driver's current step.
    clock: String,
}

impl AuctionBoard {
    pub(crate) fn new(profile: &Profile) -> AuctionBoard {
        let mut names = BTreeMap::new();
        for (i, m) in profile.markets.iter().enumerate() {
            for inst in bourse_loadgen::flow::instruments(m, i) {
                names.insert(
                    inst.instrument.0,
                    (m.name.clone(), inst.symbol.clone(), inst.price_scale),
                );
            }
        }
        AuctionBoard {
            names,
            ..AuctionBoard::default()
        }
    }

    fn on_event(&mut self, e: &Event) {
        match *e {
            Event::PhaseChanged {
                instrument, phase, ..
            } if phase.is_auction() => {
                self.indicative.insert(instrument.0, (phase, 0, 0, 0, None));
            }
            Event::AuctionIndicative {
                instrument,
                price,
                qty,
                surplus,
                surplus_side,
                ..
            } => {
                if let Some(x) = self.indicative.get_mut(&instrument.0) {
                    *x = (x.0, price.0, qty.0, surplus.0, surplus_side);
                }
            }
            Event::Trade {
                instrument,
                auction: true,
                ..
            } => *self.trades.entry(instrument.0).or_insert(0) += 1,
            Event::AuctionUncrossed {
                instrument,
                auction,
                price,
                qty,
                ..
            } => {
                self.indicative.remove(&instrument.0);
                let trades = self.trades.remove(&instrument.0).unwrap_or(0);
                self.uncrossings.push((
                    self.clock.clone(),
                    instrument.0,
                    auction,
                    price.0,
                    qty.0,
                    trades,
                ));
            }
            _ => {}
        }
    }

    fn name(&self, id: u32) -> (&str, &str, u8) {
        self.names
            .get(&id)
            .map_or(("?", "?", 0), |(m, s, p)| (m.as_str(), s.as_str(), *p))
    }

    /// The dashboard's figures: per market in a call, its instruments in the call and the
    /// one with the most paired quantity; per market, its last uncrossing.
    fn figures(&self) -> Vec<(String, String)> {
        let mut by_market: BTreeMap<&str, (usize, Option<u32>)> = BTreeMap::new();
        for (&id, x) in &self.indicative {
            let (market, _, _) = self.name(id);
            let e = by_market.entry(market).or_insert((0, None));
            e.0 += 1;
            let best =
                e.1.and_then(|b| self.indicative.get(&b))
                    .map_or(-1, |b| b.2);
            if x.2 > best {
                e.1 = Some(id);
            }
        }
        let mut out = Vec::new();
        for (market, (count, best)) in by_market {
            let Some(id) = best else { continue };
            let (_, symbol, scale) = self.name(id);
            let (phase, price, qty, surplus, side) = self.indicative[&id];
            let text = if qty > 0 {
                format!(
                    "{count} in the call; {symbol} indicative {} x {} lots, imbalance {surplus}{}",
                    price_text(price, scale),
                    report::count(qty as u64),
                    side.map_or(String::new(), |s| format!(" {s:?}").to_lowercase())
                )
            } else {
                format!("{count} in the call; no cross yet")
            };
            out.push((format!("{} {market}", phase_name(phase)), text));
        }
        let mut last: BTreeMap<&str, (Phase, &str, usize, i64, u64)> = BTreeMap::new();
        for (clock, id, phase, _, qty, trades) in &self.uncrossings {
            let (market, _, _) = self.name(*id);
            let e = last.entry(market).or_insert((*phase, clock, 0, 0, 0));
            if e.0 != *phase || e.1 != clock {
                *e = (*phase, clock, 0, 0, 0);
            }
            e.2 += 1;
            e.3 += qty;
            e.4 += trades;
        }
        for (market, (phase, clock, n, qty, trades)) in last {
            out.push((
                format!("uncrossed {market}"),
                format!(
                    "{} at {clock}: {n} instruments, {} lots in {} trades",
                    phase_name(phase),
                    report::count(qty as u64),
                    report::count(trades)
                ),
            ));
        }
        out
    }

    /// The report's section: every uncrossing, or none.
    fn markdown(&self) -> String {
        let mut s = String::from(
            "\n## Call auctions\n\nThe uncrossings of the day (`demo --day`), from each core's \
             committed stream: the schedule's time (to the driver's step), the auction, its \
             price and what it executed.\n\n",
        );
        if self.uncrossings.is_empty() {
            s.push_str("None: the run ended before the first auction ended.\n");
            return s;
        }
        s.push_str("| time | market | instrument | auction | price | lots | trades |\n");
        s.push_str("|---|---|---|---|---:|---:|---:|\n");
        for (clock, id, phase, price, qty, trades) in &self.uncrossings {
            let (market, symbol, scale) = self.name(*id);
            s.push_str(&format!(
                "| {clock} | {market} | {symbol} | {} | {} | {} | {} |\n",
                phase_name(*phase),
                price_text(*price, scale),
                report::count(*qty as u64),
                report::count(*trades)
            ));
        }
        s
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::OpeningAuction => "opening auction",
        Phase::ClosingAuction => "closing auction",
        Phase::VolatilityAuction => "volatility auction",
        _ => "phase",
    }
}

/// A fixed-point price as text with its scale's decimals.
fn price_text(price: i64, scale: u8) -> String {
    let d = 10i64.pow(u32::from(scale));
    let sign = if price < 0 { "-" } else { "" };
    let p = price.unsigned_abs();
    if scale == 0 {
        return format!("{sign}{p}");
    }
    format!(
        "{sign}{}.{:0w$}",
        p / d as u64,
        p % d as u64,
        w = usize::from(scale)
    )
}

/// Follows one replica's committed stream per core (every replica applies the same entries)
/// and feeds the auction events into `board`, until `stop`.
fn watch_auctions(
    deployment: &LocalDeployment,
    rt: &bourse_cluster::tokio::runtime::Handle,
    board: &Arc<Mutex<AuctionBoard>>,
    stop: &Arc<AtomicBool>,
) {
    let mut seen = std::collections::BTreeSet::new();
    for (name, ring) in deployment.stream_rings() {
        let core = name.split('/').next().unwrap_or("").to_string();
        if !seen.insert(core) {
            continue;
        }
        let (board, stop) = (Arc::clone(board), Arc::clone(stop));
        rt.spawn(async move {
            let mut from = ring.next_index();
            while !stop.load(Ordering::Relaxed) {
                let Ok(mut sub) = ring.subscribe(from) else {
                    // Fell behind the ring: go on from what it keeps now.
                    from = ring.next_index();
                    continue;
                };
                while let Ok(entry) = sub.recv().await {
                    from = entry.index + 1;
                    let Ok(mut b) = board.lock() else { return };
                    for r in &entry.requests {
                        if r.kind != bourse_cluster::OutcomeKind::Applied {
                            continue;
                        }
                        if let Ok(events) = bourse_core::codec::decode_events(&r.events) {
                            for e in &events {
                                b.on_event(e);
                            }
                        }
                    }
                }
                tokio_sleep_ms(100).await;
                from = from.max(ring.oldest_kept());
            }
        });
    }
}

async fn tokio_sleep_ms(ms: u64) {
    bourse_cluster::tokio::time::sleep(Duration::from_millis(ms)).await
}

/// Default admin API port when none is given.
const ADMIN_PORT_DEFAULT: u16 = 8090;
/// The demo's operator (its password is made up at start and printed).
const DEMO_OPERATOR: &str = "admin";

/// The demo's admin API: its listener, the operator's password, the audit log's path and
/// the service (the schedule driver of `--day` acts through it).
type DemoAdmin = (
    bourse_admin::AdminServer,
    String,
    PathBuf,
    Arc<bourse_admin::AdminService>,
);

/// A password for the demo's operator, different in every run.
fn demo_password() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(bourse_loadgen::unix_ns());
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// The admin API over the replicated cores (none for in-process cores: see
/// `bourse_venue::VenueAdmin`), its audit log in the report's directory.
fn start_admin(
    args: &DemoArgs,
    deployment: &LocalDeployment,
    out: &std::path::Path,
    monitor: Option<Arc<Monitor>>,
) -> Result<Option<DemoAdmin>> {
    if args.no_admin || args.in_process_cores {
        return Ok(None);
    }
    let password = demo_password();
    let hash = bourse_auth::hash_password(&password)?;
    let mut store = bourse_auth::CredentialStore::new();
    store.insert(
        DEMO_OPERATOR,
        hash,
        vec![bourse_admin::ROLE_OPERATOR.to_string()],
    )?;
    let store = Arc::new(store);
    let audit = out.join("admin-audit.jsonl");
    let at = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let start =
        |port| deployment.start_admin(Arc::clone(&store), &audit, at(port), monitor.clone());
    let (service, server) = match args.admin_port {
        Some(port) => {
            start(port).map_err(|e| anyhow!("{e:#} (try --admin-port 0 or --no-admin)"))?
        }
        None => start(ADMIN_PORT_DEFAULT).or_else(|_| start(0))?,
    };
    Ok(Some((server, password, audit, service)))
}

/// Default delivery port when none is given.
const DELIVERY_PORT_DEFAULT: u16 = 8700;

/// Records the demo's delivery node keeps in memory per core; older ones go to disk.
const DEMO_DELIVERY_RECORDS_PER_CORE_MAX: usize = 100_000;

/// The demo's delivery readers: one that reads every firm, one that reads firm 1's records.
const DEMO_DELIVERY_VIEWER: &str = "viewer";
const DEMO_DELIVERY_FIRM: &str = "firm-1";
const DEMO_DELIVERY_FIRM_ID: u32 = 1;

/// The demo's delivery node and its readers' passwords (viewer, firm 1), made up at start.
type DemoDelivery = (bourse_delivery::DeliveryNode, String, String);

/// A delivery node over every replicated core of the deployment (none for in-process cores),
/// with two readers: the node asks for credentials as a venue's would, on the loopback too.
fn start_delivery(
    args: &DemoArgs,
    deployment: &LocalDeployment,
    data_dir: &std::path::Path,
) -> Result<Option<DemoDelivery>> {
    let cores: Vec<bourse_delivery::CoreSource> = deployment
        .node_addrs()
        .into_iter()
        .enumerate()
        .filter(|(_, (_, nodes))| !nodes.is_empty())
        .map(|(i, (_, nodes))| bourse_delivery::CoreSource {
            id: i as u32,
            nodes,
            tls: None,
        })
        .collect();
    if args.no_delivery || cores.is_empty() {
        return Ok(None);
    }
    let (viewer_password, firm_password) = (demo_password(), demo_password());
    let reader = |name: &str, password: &str, role: String| -> Result<_> {
        Ok(bourse_auth::CredentialEntry {
            name: name.into(),
            password_hash: bourse_auth::hash_password(password)?,
            roles: vec![role],
        })
    };
    let readers = vec![
        reader(
            DEMO_DELIVERY_VIEWER,
            &viewer_password,
            bourse_delivery::access::ROLE_VIEWER.into(),
        )?,
        reader(
            DEMO_DELIVERY_FIRM,
            &firm_password,
            format!(
                "{}{DEMO_DELIVERY_FIRM_ID}",
                bourse_delivery::access::ROLE_FIRM_PREFIX
            ),
        )?,
    ];
    let config = |port: u16| bourse_delivery::DeliveryConfig {
        name: "bourse-demo".into(),
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        binary_listen: None,
        // A small memory and cold data on disk, so that a demo of a few minutes already
        // answers `--since-seconds` reads from disk (docs/delivery.md); the state file is
        // written rarely, as the demo's cores have little CPU to spare.
        state_dir: Some(data_dir.join("delivery")),
        persist_interval_ms: 10_000,
        threads: 2,
        cores: cores.clone(),
        follow: None,
        cold: Some(bourse_delivery::cold::ColdConfig::default()),
        limits: bourse_delivery::Limits {
            records_per_core_max: DEMO_DELIVERY_RECORDS_PER_CORE_MAX,
            ..bourse_delivery::Limits::default()
        },
        access: bourse_delivery::AccessConfig {
            readers: readers.clone(),
            ..Default::default()
        },
    };
    let node = match args.delivery_port {
        Some(port) => bourse_delivery::DeliveryNode::start(config(port)),
        None => bourse_delivery::DeliveryNode::start(config(DELIVERY_PORT_DEFAULT))
            .or_else(|_| bourse_delivery::DeliveryNode::start(config(0))),
    }
    .map_err(|e| anyhow!("delivery node: {e} (try --delivery-port 0 or --no-delivery)"))?;
    Ok(Some((node, viewer_password, firm_password)))
}

/// With `--itch-port`: an ITCH feed per replicated core, fed from its committed stream from
/// the start, its stock directory from the profile's instruments.
fn start_itch(
    args: &DemoArgs,
    deployment: &LocalDeployment,
    profile: &Profile,
) -> Result<Vec<bourse_itch::service::ItchService>> {
    let Some(base) = args.itch_port else {
        return Ok(Vec::new());
    };
    let mut services = Vec::new();
    for (i, (name, nodes)) in deployment.node_addrs().into_iter().enumerate() {
        if nodes.is_empty() {
            continue;
        }
        let port = |k: u16| {
            base.checked_add(2 * i as u16 + k)
                .ok_or_else(|| anyhow!("--itch-port {base} leaves no room for core {i}"))
        };
        let instruments = profile
            .markets
            .iter()
            .position(|m| m.name == name)
            .map(|m| bourse_loadgen::flow::instruments(&profile.markets[m], m))
            .unwrap_or_default();
        let config = bourse_itch::service::ServiceConfig {
            nodes,
            from_position: 0,
            serve: bourse_itch::net::ServeConfig {
                session: bourse_itch::mold::session_of(&format!("DEMO{i}"))
                    .map_err(|e| anyhow!(e))?,
                dest: std::net::SocketAddr::from(([127, 0, 0, 1], port(0)?)),
                request_listen: std::net::SocketAddr::from(([127, 0, 0, 1], port(1)?)),
                limits: bourse_itch::feed::FeedLimits::default(),
                heartbeat_ms: 1_000,
                default_price_scale: 4,
            },
            instruments,
            entries_max: None,
        };
        let s = bourse_itch::service::ItchService::start(config)
            .map_err(|e| anyhow!("ITCH feed of core {name}: {e}"))?;
        println!(
            "  ITCH 5.0 of core {name}: udp 127.0.0.1:{}, retransmission on {}; follow it with: \
             bourse itch tail --listen 127.0.0.1:{} --request {}",
            port(0)?,
            s.request_addr(),
            port(0)?,
            s.request_addr()
        );
        services.push(s);
    }
    Ok(services)
}

/// Default dashboard port when none is given.
const DASHBOARD_PORT_DEFAULT: u16 = 8088;
/// Participant sessions (each trades a slice of the accounts).
const DEMO_SESSIONS: u32 = 4;
/// Accounts the person's FIX session `DEMO` may trade (they are funded like the others).
const HUMAN_ACCOUNTS: u32 = 5;

/// The demo's load profile: three markets, a realistic mix, one open-loop phase.
///
/// The journals group-commit (`batch`): an append that a commit waits for starts an fsync at
/// once when none is running, and appends arriving during it share the next one. Nothing is
/// acknowledged before an fsync covered it on a quorum, as under `always`, but one fsync serves
/// many appends (median round trip at 2,000 commands/s measured here: `batch` ~3.5-4 ms,
/// `always` ~7 ms, `never`, which is not durable, ~1.3 ms).
fn demo_profile(args: &DemoArgs) -> Result<Profile> {
    let seconds = match args.seconds {
        Some(s) => s as f64,
        // Until Ctrl-C, bounded by the longest phase a profile may have.
        None => PHASE_DURATION_S_MAX,
    };
    participants_profile(
        seconds,
        args.rate,
        args.accounts,
        args.seed,
        args.in_process_cores,
    )
}

/// The demo's participants as a load profile: `rate` commands/s for `seconds`, `accounts` per
/// market (`bourse soak` runs the same flow).
pub(crate) fn participants_profile(
    seconds: f64,
    rate: u64,
    accounts: u32,
    seed: u64,
    in_process_cores: bool,
) -> Result<Profile> {
    let text = format!(
        r#"
name = "demo"
description = "bourse demo: simulated participants on equities, FX and futures"
seed = {seed}

[target]
kind = "{kind}"
protocol = "binary"
sessions = {sessions}
queue_capacity = 16384
fsync = "batch"

[generator]
workers = 1
pacing = "poisson"
inflight_max = 65536
drain_timeout_s = 10

[[markets]]
name = "equities"
kind = "equity"
instruments = 20
accounts = {accounts}
share = 0.45
live_orders_target = 4000

[[markets]]
name = "fx"
kind = "fx"
instruments = 6
accounts = {accounts}
share = 0.2
live_orders_target = 1500
spread_ticks = 20

[[markets]]
name = "futures"
kind = "futures"
instruments = 8
accounts = {accounts}
share = 0.35
live_orders_target = 3000
spread_ticks = 30

[mix]
limit = 46
market = 0.5
ioc = 2
fok = 0.5
cancel = 44
replace = 7
mass_cancel = 0.05
crossing_share = 0.05

[[phases]]
name = "trading"
duration_s = {seconds}
[phases.rate]
shape = "constant"
per_s = {rate}
"#,
        seed = seed,
        kind = if in_process_cores {
            "gateway"
        } else {
            "cluster"
        },
        sessions = DEMO_SESSIONS,
        accounts = accounts,
        seconds = seconds,
        rate = rate,
    );
    let profile = Profile::parse(&text).map_err(|e| anyhow!("the demo's profile: {e}"))?;
    profile.check_runnable().map_err(|e| anyhow!(e))?;
    Ok(profile)
}

fn start_dashboard(args: &DemoArgs) -> Result<Option<(Arc<Monitor>, DashboardServer)>> {
    if args.no_dashboard {
        return Ok(None);
    }
    let monitor = Monitor::new(MonitorConfig {
        node_name: "demo gateway".into(),
        ..MonitorConfig::default()
    });
    let at = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let server = match args.dashboard_port {
        Some(port) => DashboardServer::start(monitor.clone(), at(port)).map_err(|e| {
            anyhow!("dashboard on 127.0.0.1:{port}: {e} (try --dashboard-port 0 or --no-dashboard)")
        })?,
        None => DashboardServer::start(monitor.clone(), at(DASHBOARD_PORT_DEFAULT))
            .or_else(|_| DashboardServer::start(monitor.clone(), at(0)))?,
    };
    Ok(Some((monitor, server)))
}

/// The demo's venue and its services (dashboard, delivery, ITCH, admin), as `run` starts them
/// before the participants trade; `bourse bench venue` starts the same.
pub(crate) struct DemoVenue {
    pub(crate) deployment: LocalDeployment,
    dashboard: Option<(Arc<Monitor>, DashboardServer)>,
    delivery: Option<DemoDelivery>,
    itch: Vec<bourse_itch::service::ItchService>,
    admin: Option<DemoAdmin>,
}

impl DemoVenue {
    /// Starts everything `args` asks for, data under `data_dir`, the admin's audit log in
    /// `out`; `verbose` prints the layout and how to reach each service.
    pub(crate) fn start(
        args: &DemoArgs,
        profile: &Profile,
        out: &std::path::Path,
        data_dir: &std::path::Path,
        verbose: bool,
    ) -> Result<DemoVenue> {
        let _ = std::fs::remove_dir_all(data_dir);
        let dashboard = start_dashboard(args)?;
        let backend = if args.in_process_cores {
            Backend::InProcess
        } else {
            Backend::Cluster
        };
        if verbose {
            println!(
                "bourse demo — equities, FX and futures, {}, behind one gateway",
                match backend {
                    Backend::Cluster => "each market a trading core replicated on 3 nodes",
                    Backend::InProcess => "each market an in-process trading core",
                }
            );
        }
        let t0 = Instant::now();
        let mut spec = crate::loadtest_cmd::deployment_spec(profile, data_dir.to_path_buf(), false);
        spec.monitor = dashboard.as_ref().map(|(m, _)| Arc::clone(m));
        // Entitled by firm (no account list): every account of firm 1 trades through it,
        // those an operator adds during the run included.
        spec.extra_fix_sessions = vec![("DEMO".into(), Vec::new())];
        let deployment = LocalDeployment::start(spec).context("starting the deployment")?;
        if verbose {
            println!(
                "  started in {:.1} s: {}",
                t0.elapsed().as_secs_f64(),
                deployment.describe()
            );
            print_layout(&deployment, profile, &dashboard);
        }
        let delivery = start_delivery(args, &deployment, data_dir)?;
        if let (Some((d, _, _)), Some((monitor, _))) = (&delivery, &dashboard) {
            let shared = Arc::clone(d.shared());
            monitor
                .delivery()
                .set_source(move || shared.counters.totals());
        }
        let itch = start_itch(args, &deployment, profile)?;
        if let (Some((d, viewer, firm)), true) = (&delivery, verbose) {
            println!(
                "  delivery: {}/v1/orders (every order's latest state by cursor), readers \
                 {DEMO_DELIVERY_VIEWER} (password {viewer}: every firm) and {DEMO_DELIVERY_FIRM} \
                 (password {firm}: firm {DEMO_DELIVERY_FIRM_ID}'s records only)\n\
                 \x20   export BOURSE_DELIVERY_PASSWORD={firm}\n\
                 \x20   bourse delivery tail --addr {} --user {DEMO_DELIVERY_FIRM}; what changed in \
                 the last minute, from memory and disk: add --since-seconds 60 --until-empty\n\
                 \x20   python3 examples/delivery_client.py --url {} --user {DEMO_DELIVERY_FIRM} \
                 --count 20",
                d.url(),
                d.addr(),
                d.url(),
            );
        }
        let admin = start_admin(
            args,
            &deployment,
            out,
            dashboard.as_ref().map(|(m, _)| Arc::clone(m)),
        )?;
        if let (Some((server, password, audit, _)), true) = (&admin, verbose) {
            println!(
                "  admin API: {} (operator {DEMO_OPERATOR}, password {password}); audit log {}\n\
                 \x20   export BOURSE_ADMIN_URL={} BOURSE_ADMIN_PASSWORD={password}\n\
                 \x20   bourse admin instruments | halt --instrument ID | resume --instrument ID | \
                 kill --firm ID | release --firm ID | account ID | add-account ... (docs/admin.md)",
                server.url(),
                audit.display(),
                server.url(),
            );
        }
        Ok(DemoVenue {
            deployment,
            dashboard,
            delivery,
            itch,
            admin,
        })
    }

    /// Stops the services, then the deployment; the dashboard stays up for the caller.
    pub(crate) fn stop(mut self) -> Result<Option<(Arc<Monitor>, DashboardServer)>> {
        drop(self.admin.take());
        if let Some((d, _, _)) = self.delivery.take() {
            d.stop().map_err(|e| anyhow!(e))?;
        }
        for s in self.itch.drain(..) {
            // Ends each session (End of Messages, end-of-session packet) before the cores stop.
            s.stop().map_err(|e| anyhow!(e))?;
        }
        self.deployment.stop();
        Ok(self.dashboard.take())
    }
}

pub fn run(args: DemoArgs) -> Result<()> {
    if args.rate == 0 || args.rate > 1_000_000 {
        bail!("--rate must be between 1 and 1,000,000 commands per second");
    }
    if args.accounts < DEMO_SESSIONS.max(HUMAN_ACCOUNTS) || args.accounts > 100_000 {
        bail!(
            "--accounts must be between {} and 100,000",
            DEMO_SESSIONS.max(HUMAN_ACCOUNTS)
        );
    }
    if args.seconds == Some(0) {
        bail!("--seconds must be at least 1");
    }
    if args.day_speed == 0 || args.day_speed > 86_400 {
        bail!("--day-speed must be between 1 and 86,400 scheduled seconds per second");
    }
    let profile = demo_profile(&args)?;
    // The schedule is checked against the demo's markets before anything starts.
    let schedule = match &args.schedule {
        None => None,
        Some(_) if !args.day => bail!("--schedule is the day of --day; give --day too"),
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--schedule {}", path.display()))?;
            let markets: Vec<&str> = profile.markets.iter().map(|m| m.name.as_str()).collect();
            let config = bourse_admin::schedule::ScheduleConfig::from_venue_toml(&text, &markets)
                .map_err(|e| anyhow!("--schedule {}: {e}", path.display()))?;
            Some(config)
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // A second Ctrl-C while stopping falls through to the default handler's exit.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst));
    }
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "bourse-demo-{}",
            bourse_loadgen::unix_ns() / 1_000_000_000
        ))
    });
    let data_dir = std::env::temp_dir().join(format!("bourse-demo-{}", std::process::id()));
    let mut venue = DemoVenue::start(&args, &profile, &out, &data_dir, true)?;
    let markets: Vec<&str> = profile.markets.iter().map(|m| m.name.as_str()).collect();
    let day = if args.day {
        Some(DemoDay::new(&args, schedule, &markets, &out)?)
    } else {
        None
    };
    let password = match &venue.admin {
        Some((_, password, _, _)) => password.clone(),
        None => demo_password(),
    };
    if start_clearing(&args, &mut venue.deployment, &out, &password, day.as_ref())? {
        if let Some(node) = venue.deployment.clearing_node() {
            println!(
                "  clearing: {} (operator {DEMO_OPERATOR}, the admin's password){}\n\
                 \x20   export BOURSE_CLEARING_PASSWORD={password}\n\
                 \x20   bourse clearing run --intermediate --service {}; reports under {} \
                 (docs/clearing.md)",
                node.url(),
                if day.is_some() {
                    ": runs at the day's clearing pauses (14:00 intermediate, 18:50 end of day)"
                } else {
                    ""
                },
                node.url(),
                out.join("clearing").display(),
            );
        }
    }
    let auctions = Arc::new(Mutex::new(AuctionBoard::new(&profile)));
    if let Some(day) = &day {
        let Some((_, _, _, service)) = &venue.admin else {
            bail!("--day needs the admin API (replicated cores, without --no-admin)");
        };
        play_day(
            &venue.deployment,
            Arc::clone(service),
            day,
            (
                Arc::clone(&auctions),
                venue.dashboard.as_ref().map(|(m, _)| Arc::clone(m)),
            ),
            Arc::clone(&stop),
        )?;
    }
    match args.seconds {
        Some(s) => println!(
            "  participants offer {} commands/s for {s} s (Ctrl-C stops early)\n",
            report::count(args.rate)
        ),
        None => println!(
            "  participants offer {} commands/s until Ctrl-C\n",
            report::count(args.rate)
        ),
    }
    let options = RunOptions {
        progress: false,
        version: crate::report::version().to_string(),
        ticker: true,
        stop: Some(Arc::clone(&stop)),
        live: None,
    };
    let result = bourse_loadgen::run_on(&profile, &options, &mut venue.deployment);
    // Ends the schedule driver (if --day) before the cores stop.
    stop.store(true, Ordering::SeqCst);
    let dashboard = venue.stop()?;
    let _ = std::fs::remove_dir_all(&data_dir);
    let results = result.map_err(|e| anyhow!(e))?;
    report::write(&out, &results, None, true)
        .map_err(|e| anyhow!("cannot write the report into {}: {e}", out.display()))?;
    if args.day {
        // The uncrossings end the report, and the summary names them.
        let section = auctions.lock().map(|b| b.markdown()).unwrap_or_default();
        let path = out.join(bourse_loadgen::report::REPORT_MD);
        let mut md = std::fs::read_to_string(&path).unwrap_or_default();
        md.push_str(&section);
        std::fs::write(&path, md)
            .with_context(|| format!("cannot add the auctions to {}", path.display()))?;
        if let Ok(b) = auctions.lock() {
            println!("\ncall auctions: {} uncrossings", b.uncrossings.len());
            for (name, text) in b.figures() {
                if name.starts_with("uncrossed") {
                    println!("  {name}: {text}");
                }
            }
        }
    }
    let t = &results.totals;
    let l = &results.latency_all;
    println!("\nsummary after {:.1} s", results.elapsed_s);
    println!(
        "  transactions (successful): {:>12}   max per second {:>10}",
        report::count(t.transactions),
        report::count(t.transactions_max_per_s)
    );
    println!(
        "  orders registered:         {:>12}   max per second {:>10}",
        report::count(t.orders),
        report::count(t.orders_max_per_s)
    );
    println!(
        "  trades:                    {:>12}   max per second {:>10}",
        report::count(t.trades),
        report::count(t.trades_max_per_s)
    );
    println!(
        "  round trip through the gateway, from the scheduled send: mean {}, median {}, 99% {}, 99.9% {}, max {}",
        report::ns(l.mean as f64),
        report::ns(l.p50 as f64),
        report::ns(l.p99 as f64),
        report::ns(l.p999 as f64),
        report::ns(l.max as f64),
    );
    let others = commands_of_others(&results.checks);
    for c in &results.checks {
        let (mark, note) = check_verdict(c, others);
        println!(
            "  {mark} {}: {} = {}{note}",
            c.name,
            report::count(c.expected),
            report::count(c.actual)
        );
    }
    print_sources(&results);
    let clearing_failed = print_clearing_runs(&results.clearing_runs);
    println!(
        "  report: {} (also report.md and results.json)",
        out.join(report::REPORT_HTML).display()
    );
    if let Some((_, server)) = &dashboard {
        if args.linger_seconds > 0 {
            println!(
                "\n  dashboard stays at {} for {} s (Ctrl-C ends it)",
                server.url(),
                args.linger_seconds
            );
            stop.store(false, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_secs(args.linger_seconds);
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let other: u64 = results.cores.iter().map(|c| c.commands_other).sum();
    if other > 0 {
        println!(
            "  note: {} commands came from other sessions (bourse order): the cores' counts \
             include them, so the checks that compare them with the participants' figures \
             cannot hold exactly; the market data, replica and forwarding checks still must",
            report::count(other)
        );
        let exact = |name: &str| {
            name.contains("market data")
                || name.contains("replica")
                || name.contains("forwarded")
                || name.contains("known source")
        };
        if results.checks.iter().any(|c| exact(&c.name) && !c.ok) {
            bail!("a cross-check failed (see above)");
        }
    } else if !results.checks_pass() {
        bail!("a cross-check failed (see above)");
    }
    if clearing_failed {
        bail!("a clearing run failed or did not balance (see above)");
    }
    Ok(())
}

/// One line per clearing run (the schedule's or an operator's): what it cleared, how long it
/// took and trading's 99th percentile before, during and after it. True when one failed or
/// its margin did not sum to zero; a run the demo's end cut short is only said to be.
fn print_clearing_runs(runs: &[bourse_loadgen::results::ClearingRunFigures]) -> bool {
    let mut failed = false;
    for f in runs {
        let r = &f.run;
        let bad = r.outcome == "failed" || !r.unbalanced_instruments.is_empty();
        failed |= bad;
        let p99 = |l: &bourse_loadgen::results::Latency| {
            if l.count == 0 {
                "-".to_string()
            } else {
                report::ns(l.p99 as f64)
            }
        };
        println!(
            "  {} clearing run {} ({}) at {:.1} s: {}{}, {} positions, {} movements in {:.2} s; \
             trading p99 before {}, during {}, after {}",
            if bad { "FAIL" } else { "ok  " },
            r.run_id,
            r.kind,
            f.started_s,
            r.outcome,
            r.error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default(),
            report::count(r.positions),
            report::count(r.movements),
            f.elapsed_s,
            p99(&f.latency_before),
            p99(&f.latency_during),
            p99(&f.latency_after),
        );
    }
    failed
}

/// The commands the cores applied by source, a source per line: an operator's actions and
/// a clearing run's movements show apart from the participants' commands.
fn print_sources(results: &bourse_loadgen::Results) {
    let lines = report::sources_lines(results);
    if lines.is_empty() {
        return;
    }
    println!("  commands the cores applied, by source:");
    for line in lines {
        println!("    {line}");
    }
}

fn print_layout(
    deployment: &LocalDeployment,
    profile: &Profile,
    dashboard: &Option<(Arc<Monitor>, DashboardServer)>,
) {
    let md = deployment.md_ports();
    for ((name, nodes), (_, md_port)) in deployment.node_addrs().iter().zip(&md) {
        let m = profile.markets.iter().position(|m| &m.name == name);
        let instruments = m
            .map(|i| bourse_loadgen::flow::instruments(&profile.markets[i], i))
            .unwrap_or_default();
        let symbols: Vec<&str> = instruments.iter().map(|i| i.symbol.as_str()).collect();
        let nodes_text = if nodes.is_empty() {
            "in-process engine".to_string()
        } else {
            format!(
                "nodes {}",
                nodes
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        println!(
            "  core {name:<9} {nodes_text}{}; {} instruments ({} .. {})",
            md_port.map_or(String::new(), |p| format!(
                "; market data on udp 127.255.255.255:{p}.. (`bourse md record --base-port {p}`)"
            )),
            symbols.len(),
            symbols.first().unwrap_or(&"-"),
            symbols.last().unwrap_or(&"-"),
        );
    }
    let mut fix = None;
    for g in deployment.gateways() {
        println!(
            "  gateway: binary order entry on {}, FIX 4.4 on {}",
            g.binary_addr().map_or("-".into(), |a| a.to_string()),
            g.fix_addr().map_or("-".into(), |a| a.to_string()),
        );
        fix = fix.or(g.fix_addr());
    }
    match dashboard {
        Some((_, server)) => println!(
            "  dashboard: {}  (Prometheus: {}metrics)",
            server.url(),
            server.url()
        ),
        None => println!("  dashboard: off"),
    }
    if let (Some(fix), Some(m)) = (fix, profile.markets.first()) {
        let first = bourse_loadgen::flow::instruments(m, 0);
        if let Some(i) = first.first() {
            let price = i.reference_price.0 as f64 / 10f64.powi(i.price_scale as i32);
            println!(
                "  trade beside the participants (FIX session DEMO, any account of firm 1):\n    \
                 bourse order --fix {fix} --sender DEMO send --account 1 --symbol {} --side buy --qty {} --price {:.*}",
                i.symbol,
                i.lot_size,
                i.price_scale as usize,
                price
            );
        }
    }
}

/// The loadgen check that counts commands of sessions other than the generator's.
const OTHERS_CHECK: &str = "no other session traded";
/// Checks whose core-side count includes what other sessions did, so that they cannot match
/// the generator's own count once someone trades beside the participants.
const CHECKS_COUNTING_OTHERS: [&str; 3] = [
    "trades in the report",
    "orders acknowledged",
    "every acknowledged order accounted for",
];

/// Commands of other sessions (someone trading beside the participants, as `DEMO`).
fn commands_of_others(checks: &[bourse_loadgen::results::Check]) -> u64 {
    checks
        .iter()
        .find(|c| c.name.starts_with(OTHERS_CHECK))
        .map_or(0, |c| c.actual)
}

/// How the summary shows a cross-check: `FAIL` only for what is a fault. Trading beside the
/// participants, which the demo invites, is not one: it is said, and the checks that it
/// makes incomparable are marked so instead of failing.
fn check_verdict(c: &bourse_loadgen::results::Check, others: u64) -> (&'static str, String) {
    if c.ok {
        return ("ok  ", String::new());
    }
    if others == 0 {
        return ("FAIL", String::new());
    }
    if c.name.starts_with(OTHERS_CHECK) {
        return (
            "note",
            format!(
                "\n         someone traded beside the participants ({others} commands, e.g. as \
                 DEMO): not a fault; the counts they add to are marked n/a"
            ),
        );
    }
    if CHECKS_COUNTING_OTHERS.iter().any(|p| c.name.starts_with(p)) {
        return (
            "n/a ",
            " (the cores' count includes the other sessions' orders and trades)".into(),
        );
    }
    ("FAIL", String::new())
}

#[cfg(test)]
mod summary_tests {
    use super::*;
    use bourse_loadgen::results::Check;

    fn check(name: &str, expected: u64, actual: u64) -> Check {
        Check {
            name: name.into(),
            expected,
            actual,
            ok: expected == actual,
        }
    }

    #[test]
    fn trading_beside_the_participants_is_said_not_failed() {
        let checks = vec![
            check("no other session traded on the cores (...)", 0, 12),
            check(
                "every command sent was answered (answers = commands sent)",
                5,
                5,
            ),
            check("trades in the report = trades the cores executed", 9, 7),
            check("orders acknowledged = orders the cores accepted", 20, 18),
            check(
                "the cores applied every command the gateways forwarded",
                30,
                29,
            ),
        ];
        let others = commands_of_others(&checks);
        assert_eq!(others, 12);
        let marks: Vec<&str> = checks.iter().map(|c| check_verdict(c, others).0).collect();
        // A command lost between gateway and core is still a fault.
        assert_eq!(marks, ["note", "ok  ", "n/a ", "n/a ", "FAIL"]);
        // Alone, the same mismatch is a failure.
        assert_eq!(check_verdict(&checks[2], 0).0, "FAIL");
    }
}
