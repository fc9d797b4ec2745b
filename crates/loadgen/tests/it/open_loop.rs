//! The generator is open loop: a stall in the target shows in the latency of every command
//! scheduled during it (no coordinated omission), and the offered schedule is kept.

use bourse_core::{Command, Event};
use bourse_loadgen::flow::MarketFlow;
use bourse_loadgen::generator::{Live, Worker};
use bourse_loadgen::{Answer, Profile, SubmitError, Target};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PROFILE: &str = r#"
name = "stall"
[generator]
workers = 1
pacing = "uniform"
inflight_max = 100000
drain_timeout_s = 5

[[markets]]
name = "eq"
kind = "equity"
instruments = 2
accounts = 10

[mix]
limit = 1
market = 0
ioc = 0
fok = 0
cancel = 0
replace = 0

[[phases]]
name = "steady"
duration_s = 1
[phases.rate]
shape = "constant"
per_s = 2000
"#;

/// Answers at once, except that it stops answering for `stall` once `stall_at` has passed
/// (a core stuck in a long pause), then answers everything that waited.
struct StallingTarget {
    start: Instant,
    stall_at: Duration,
    stall: Duration,
    waiting: Vec<u64>,
}

impl Target for StallingTarget {
    fn submit(&mut self, tag: u64, _market: usize, _command: Command) -> Result<(), SubmitError> {
        self.waiting.push(tag);
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Answer>, wait: Duration) -> Result<usize, SubmitError> {
        let t = self.start.elapsed();
        if t >= self.stall_at && t < self.stall_at + self.stall {
            std::thread::sleep(wait.min(Duration::from_millis(1)));
            return Ok(0);
        }
        let n = self.waiting.len();
        let now = Instant::now();
        out.extend(self.waiting.drain(..).map(|tag| Answer {
            tag,
            market: 0,
            received: now,
            stages: None,
            events: Vec::<Event>::new(),
            busy: false,
        }));
        if n == 0 {
            std::thread::sleep(wait.min(Duration::from_micros(200)));
        }
        Ok(n)
    }
}

#[test]
fn a_stall_counts_in_the_latency_of_every_command_scheduled_during_it() {
    let profile = Profile::parse(PROFILE).unwrap();
    let flows = vec![MarketFlow::new(
        &profile.markets[0],
        0,
        &profile.mix,
        0,
        1,
        1,
    )];
    let start = Instant::now();
    let stall = Duration::from_millis(200);
    let mut target = StallingTarget {
        start,
        stall_at: Duration::from_millis(400),
        stall,
        waiting: Vec::new(),
    };
    let worker = Worker {
        index: 0,
        workers: 1,
        profile: Arc::new(profile),
        flows,
        live: Arc::new(Live::default()),
    };
    let rec = worker.run(&mut target, start).unwrap();
    // The schedule was kept: 2,000/s for 1 s, whatever the stall.
    assert!(
        (1_990..=2_010).contains(&rec.counts.sent),
        "{}",
        rec.counts.sent
    );
    assert_eq!(rec.counts.unanswered, 0);
    // About 400 commands were scheduled during the 200 ms stall; their latency grows from 0
    // to 200 ms, so the 90th percentile is past 50 ms and the maximum near the stall. A
    // closed-loop generator would have sent nothing during the stall and measured ~0.
    let p90 = rec.all.value_at_quantile(0.90);
    let max = rec.all.max();
    // Both are lower bounds only: a loaded machine adds to every latency, never takes away
    // from the stall, so an upper bound here would be a bound on the machine's load.
    assert!(p90 > 50_000_000, "p90 {p90} ns hides the stall");
    assert!(
        max >= 150_000_000,
        "max {max} ns should be at least about the stall"
    );
}

#[test]
fn seconds_past_series_seconds_max_count_in_the_totals_only() {
    // Two seconds at 2,000/s, keeping the series of the first second only.
    let text = PROFILE
        .replace(
            "drain_timeout_s = 5",
            "drain_timeout_s = 5\nseries_seconds_max = 1",
        )
        .replace("duration_s = 1", "duration_s = 2");
    let profile = Profile::parse(&text).unwrap();
    assert_eq!(profile.generator.series_seconds_max, 1);
    let flows = vec![MarketFlow::new(
        &profile.markets[0],
        0,
        &profile.mix,
        0,
        1,
        1,
    )];
    let start = Instant::now();
    // A target that never stalls (the stall lies past the run).
    let mut target = StallingTarget {
        start,
        stall_at: Duration::from_secs(3_600),
        stall: Duration::ZERO,
        waiting: Vec::new(),
    };
    let worker = Worker {
        index: 0,
        workers: 1,
        profile: Arc::new(profile),
        flows,
        live: Arc::new(Live::default()),
    };
    let rec = worker.run(&mut target, start).unwrap();
    // Every command of both seconds is in the totals and the latency histogram.
    assert!(
        (3_980..=4_020).contains(&rec.counts.sent),
        "{}",
        rec.counts.sent
    );
    assert_eq!(rec.counts.answered, rec.counts.sent);
    assert_eq!(rec.all.len(), rec.counts.answered);
    // The per-second series stop after the first second: one second, ten 100 ms windows.
    assert_eq!(rec.seconds.len(), 1, "{:?}", rec.seconds);
    assert!(rec.windows.len() <= 10, "{} windows", rec.windows.len());
    let offered = rec.seconds[0].offered;
    assert!((1_990..=2_010).contains(&offered), "{offered}");
    let timed = rec.seconds[0].latency.as_ref().map_or(0, |h| h.len());
    assert_eq!(
        timed, offered,
        "the kept second times every command scheduled in it"
    );
}
