//! Reports flow while requests keep coming: the event loop reads at most
//! `READ_BYTES_PER_TURN` per connection per turn, then hands over the core's answers and
//! writes the reports before it reads on. Checked in order, not in time: a core that answers
//! each order as it is submitted records how many reports the gateway had already written
//! when the burst's last order reached it.

use bourse_client::{FixClient, FixClientConfig};
use bourse_core::link::{CoreLink, CoreOutput, RequestKey, SubmitError};
use bourse_core::*;
use bourse_gateway::{GatewayConfig, GatewayStats};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

const BURST: u64 = 2_000;
const WAIT: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"
throttle_msgs_per_s = 1000000
[[instruments]]
instrument = 1
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 10
band_bps = 2000
reference_price = 10000
[[accounts]]
account = 101
firm = 1
[[fix_sessions]]
client_comp_id = "ALPHA"
firm = 1
accounts = [101]
"#;

/// A core that accepts every order at once, in `submit`, and notes, when the `BURST`-th
/// order arrives, how many reports the gateway had written by then.
struct InstantCore {
    outputs: Arc<Mutex<Vec<CoreOutput>>>,
    notify: Option<Arc<dyn Fn() + Send + Sync>>,
    orders: u64,
    stats: Arc<OnceLock<Arc<GatewayStats>>>,
    reports_before_last: Arc<AtomicU64>,
}

impl CoreLink for InstantCore {
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError> {
        if let CommandBody::NewOrder(o) = command.body {
            self.orders += 1;
            if self.orders == BURST {
                let written = self
                    .stats
                    .get()
                    .map_or(0, |s| s.reports_out.load(Ordering::Relaxed));
                self.reports_before_last.store(written, Ordering::Relaxed);
            }
            let accepted = Event::OrderAccepted {
                order_id: OrderId(self.orders),
                account: o.account,
                cl_ord_id: o.cl_ord_id,
                instrument: o.instrument,
                side: o.side,
                price: o.price,
                qty: o.qty,
                ts_ns: 1,
            };
            let mut out = self.outputs.lock().unwrap();
            out.push(CoreOutput::Event {
                key,
                event: accepted,
            });
        }
        self.outputs.lock().unwrap().push(CoreOutput::Done { key });
        if let Some(n) = &self.notify {
            n();
        }
        Ok(())
    }

    fn try_recv(&mut self) -> Option<CoreOutput> {
        let mut out = self.outputs.lock().unwrap();
        (!out.is_empty()).then(|| out.remove(0))
    }

    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>) {
        self.notify = Some(notify);
    }
}

#[test]
fn the_first_report_of_a_burst_is_written_before_its_last_order_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::from_toml(CONFIG).unwrap();
    config.gateway.store_dir = dir.path().to_path_buf();
    let stats = Arc::new(OnceLock::new());
    let reports_before_last = Arc::new(AtomicU64::new(u64::MAX));
    let core = InstantCore {
        outputs: Arc::default(),
        notify: None,
        orders: 0,
        stats: Arc::clone(&stats),
        reports_before_last: Arc::clone(&reports_before_last),
    };
    let gw = bourse_gateway::spawn(config, Box::new(core)).unwrap();
    let _ = stats.set(Arc::clone(gw.stats()));
    let cfg = FixClientConfig::new(gw.fix_addr().unwrap(), "ALPHA", "BOURSE");
    let mut alpha = FixClient::connect(&cfg).unwrap();
    // The burst: more bytes than one turn reads, sent without waiting for any answer.
    for i in 0..BURST {
        alpha
            .new_order(&format!("o{i}"), None, "SBER", true, 10, Some("99"), '0')
            .unwrap();
    }
    let mut reports = 0;
    while reports < BURST {
        match alpha.recv_type("8", WAIT).unwrap() {
            Some(_) => reports += 1,
            None => panic!("{reports} reports of {BURST}"),
        }
    }
    let before = reports_before_last.load(Ordering::Relaxed);
    assert!(
        before > 0 && before < BURST,
        "reports written before the last order was read: {before}"
    );
    alpha.logout(WAIT).unwrap();
}
