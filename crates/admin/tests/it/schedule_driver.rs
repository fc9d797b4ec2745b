//! The schedule driver over a simulated clock (no sleeps): stepping through a MOEX
//! derivatives day moves the core's phases as the schedule says, an order during the clearing
//! pause is refused with its own reason while the resting order stays, the end of day expires
//! Day orders, and stepping over the same instants again applies nothing twice.

use crate::common;

use bourse_admin::schedule::{Schedule, ScheduleConfig, ScheduleDriver};
use bourse_admin::AdminService;
use bourse_core::*;
use bourse_engine::fixtures::future;
use bourse_engine::{Engine, EngineConfig};
use common::{funded_engine, order, EngineVenue};
use std::sync::Arc;

const MIN_NS: u64 = 60_000_000_000;

/// Unix ns of Monday 2026-11-23 at `hh:mm` Moscow time (UTC+3).
fn monday(hh: u64, mm: u64) -> u64 {
    // 2026-11-23 is day 20_780 since 1970-01-01.
    (20_780 * 24 * 60 + hh * 60 + mm - 180) * MIN_NS
}

#[tokio::test]
async fn a_simulated_day_moves_the_phases_and_ends_the_day_once() {
    let venue = Arc::new(EngineVenue::new(funded_engine()));
    let dir = tempfile::tempdir().unwrap();
    let service =
        Arc::new(AdminService::new(venue.clone(), &dir.path().join("audit.jsonl"), None).unwrap());
    let schedule = Schedule::new(&ScheduleConfig::moex_derivatives(&["futures"])).unwrap();
    let mut driver = ScheduleDriver::new(schedule, Arc::clone(&service), monday(9, 0));
    let phase = |v: &EngineVenue| v.engine.lock().unwrap().phase(InstrumentId(1)).unwrap();

    // 10:00: open. A Day order rests.
    assert_eq!(driver.step(monday(10, 0)).await.len(), 1);
    assert_eq!(phase(&venue), Phase::Open);
    let resting = order(&mut venue.engine.lock().unwrap(), 1, 1, 99_000);
    assert!(
        matches!(resting[0], Event::OrderAccepted { .. }),
        "{resting:?}"
    );

    // 14:02: the intermediate clearing pause. A new order is refused with its own reason;
    // the resting one stays.
    let done = driver.step(monday(14, 2)).await;
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].1, "applied");
    assert_eq!(phase(&venue), Phase::Paused);
    let refused = order(&mut venue.engine.lock().unwrap(), 1, 2, 99_000);
    assert!(matches!(
        refused[0],
        Event::OrderRejected {
            reason: RejectReason::InstrumentPaused,
            ..
        }
    ));
    assert_eq!(venue.engine.lock().unwrap().live_orders(), 1);

    // 14:05 open again; 18:50 the end of day expires the Day order during the evening pause.
    driver.step(monday(14, 5)).await;
    assert_eq!(phase(&venue), Phase::Open);
    let done = driver.step(monday(18, 55)).await;
    assert_eq!(done.len(), 2, "{done:?}");
    assert_eq!(phase(&venue), Phase::Paused);
    assert_eq!(venue.engine.lock().unwrap().live_orders(), 0);

    // Evening session, then closed.
    driver.step(monday(23, 59)).await;
    assert_eq!(phase(&venue), Phase::Closed);
    let issued = venue.applied.lock().unwrap().len();
    assert_eq!(issued, 7);

    // A second driver over the same day (a restart) issues the same request ids: every one is
    // answered from the first run, nothing applies again.
    let schedule = Schedule::new(&ScheduleConfig::moex_derivatives(&["futures"])).unwrap();
    let mut again = ScheduleDriver::new(schedule, service, monday(9, 0));
    let done = again.step(monday(23, 59)).await;
    assert_eq!(done.len(), 7);
    assert_eq!(venue.applied.lock().unwrap().len(), issued);
}

/// A venue with one future (instrument 1) and the service over it.
fn venue_and_service(dir: &std::path::Path) -> (Arc<EngineVenue>, Arc<AdminService>) {
    let mut engine = Engine::new(EngineConfig::default());
    let mut out = Vec::new();
    engine.apply(
        &Command::new(0, CommandBody::AddInstrument(future(1, "SI", 100_000))),
        &mut out,
    );
    let venue = Arc::new(EngineVenue::new(engine));
    let service =
        Arc::new(AdminService::new(venue.clone(), &dir.join("audit.jsonl"), None).unwrap());
    (venue, service)
}

/// Started at 14:02 (in the intermediate clearing pause), the driver pauses the market at
/// once, under the request id of the 14:00 change, and its first step issues only what is
/// due after the start; a second driver started later the same pause applies nothing again.
/// Started on a Saturday, the market is closed (Friday's last session has ended).
#[tokio::test]
async fn a_driver_started_mid_day_puts_the_market_in_the_phase_of_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let (venue, service) = venue_and_service(dir.path());
    let phase = |v: &EngineVenue| v.engine.lock().unwrap().phase(InstrumentId(1)).unwrap();
    assert_eq!(
        phase(&venue),
        Phase::Open,
        "an added instrument starts open"
    );
    let schedule = || Schedule::new(&ScheduleConfig::moex_derivatives(&["futures"])).unwrap();

    let mut driver = ScheduleDriver::new(schedule(), Arc::clone(&service), monday(14, 2));
    let entered = driver.enter_phase_in_force().await;
    assert_eq!(entered.len(), 1, "{entered:?}");
    assert_eq!(entered[0].0.local, "2026-11-23 14:00");
    assert_eq!(entered[0].1, "applied");
    assert_eq!(phase(&venue), Phase::Paused);
    let done = driver.step(monday(14, 5)).await;
    assert_eq!(done.len(), 1, "only the 14:05 reopening is due: {done:?}");
    assert_eq!(phase(&venue), Phase::Open);
    assert_eq!(venue.applied.lock().unwrap().len(), 2);

    // A restart at 14:03 enters the same change: answered from the first run, not applied
    // over the reopening.
    let mut again = ScheduleDriver::new(schedule(), Arc::clone(&service), monday(14, 3));
    let entered = again.enter_phase_in_force().await;
    assert_eq!(entered[0].0.local, "2026-11-23 14:00");
    assert_eq!(venue.applied.lock().unwrap().len(), 2);
    assert_eq!(phase(&venue), Phase::Open);

    // Saturday 2026-11-28 at noon: Friday's 23:50 close is in force.
    let dir = tempfile::tempdir().unwrap();
    let (venue, service) = venue_and_service(dir.path());
    let saturday_noon = monday(12, 0) + 5 * 24 * 60 * MIN_NS;
    let mut weekend = ScheduleDriver::new(schedule(), service, saturday_noon);
    let entered = weekend.enter_phase_in_force().await;
    assert_eq!(entered.len(), 1, "{entered:?}");
    assert_eq!(entered[0].0.local, "2026-11-27 23:50");
    assert_eq!(phase(&venue), Phase::Closed);
}
