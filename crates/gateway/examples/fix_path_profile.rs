//! The gateway's FIX order path without sockets, for instruction counts (callgrind):
//! a client session sends NewOrderSingle and OrderCancelRequest alternately; the gateway's
//! side (session decode and validation, `FixApp` parsing into the router, the router, an
//! engine applied synchronously, the report rendered by `fix_front` and encoded and stored by
//! the session) runs in `gateway_side`, the one function worth collecting:
//!
//! ```text
//! cargo build --release -p bourse-gateway --example fix_path_profile
//! valgrind --tool=callgrind --toggle-collect='*gateway_side*' \
//!     target/release/examples/fix_path_profile 20000
//! ```
//! Instructions per request = the difference between two runs (N = 20,000 and 10,000) over
//! 10,000. Counts do not depend on the machine's load, unlike times. Sockets and the event
//! loop are left out. A second argument `monitor` turns the gateway's stage probes on (a
//! monitor sampling 1 request in 64, as `monitor_sample_every` defaults; a third argument N
//! samples 1 in N instead), for the cost of monitoring per request.

use bourse_core::{Command, Event};
use bourse_engine::{Engine, EngineConfig};
use bourse_fix::{
    Action, MemoryStore, OutMessage, QueueingApplication, Role, Session, SessionConfig,
};
use bourse_gateway::fix_front::{self, FixApp};
use bourse_gateway::router::{Report, Router, SessionRef};
use bourse_gateway::GatewayConfig;
use bourse_gateway::{CoreLink, CoreOutput, RequestKey, SubmitError};
use std::collections::VecDeque;
use std::sync::Arc;

/// A core applied at submit, in the caller's thread: deterministic instruction counts.
struct SyncCore {
    engine: Engine,
    events: Vec<Event>,
    out: VecDeque<CoreOutput>,
}

impl CoreLink for SyncCore {
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError> {
        self.events.clear();
        self.engine.apply(&command, &mut self.events);
        for &event in &self.events {
            if !matches!(event, Event::OrderLog(_)) {
                self.out.push_back(CoreOutput::Event { key, event });
            }
        }
        self.out.push_back(CoreOutput::Done { key });
        Ok(())
    }
    fn try_recv(&mut self) -> Option<CoreOutput> {
        self.out.pop_front()
    }
    fn set_notify(&mut self, _notify: Arc<dyn Fn() + Send + Sync>) {}
}

const CONFIG: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"
throttle_msgs_per_s = 100000000
[core]
bootstrap = true
[[instruments]]
instrument = 1
symbol = "SBER"
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
client_comp_id = "CLIENT"
firm = 1
accounts = [1]
"#;

struct Gateway {
    session: Session,
    router: Router,
    exec_ids: u64,
    /// The ExecID buffer, reused as the gateway's event loop does.
    exec_id: String,
    /// The message every report is rendered into, reused as the gateway's event loop does.
    out_msg: OutMessage,
}

fn pump(from: &mut Session, to: &mut Vec<u8>) {
    while let Some(a) = from.poll_action() {
        if let Action::Send(bytes) = a {
            to.extend_from_slice(&bytes);
        }
    }
}

/// Everything the gateway does for one inbound frame: returns the bytes it sends.
#[inline(never)]
fn gateway_side(g: &mut Gateway, now_ms: u64, inbound: &[u8], out: &mut Vec<u8>) {
    let mut app = FixApp {
        router: &mut g.router,
        sref: SessionRef(0),
        now_ms,
        now_ns: now_ms * 1_000_000,
    };
    g.session.on_bytes(now_ms as i64, inbound, &mut app);
    g.router.poll_core(usize::MAX);
    let outbox = g.router.take_outbox();
    // As the event loop does after delivery: sampled traces are recorded.
    for (_, t) in std::mem::take(&mut g.router.probes_mut().answered) {
        g.router.probes_mut().recorder.record(&t);
    }
    for (_, report) in &outbox {
        if matches!(report, Report::Exec(_)) {
            g.exec_ids += 1;
            fix_front::exec_id_into(&mut g.exec_id, "p", g.exec_ids);
        } else {
            g.exec_id.clear();
        }
        fix_front::render_into(&g.router, report, &g.exec_id, &mut g.out_msg);
        let _ = g.session.send_app_ref(now_ms as i64, &g.out_msg);
    }
    while g.session.poll_event().is_some() {}
    pump(&mut g.session, out);
}

fn main() {
    let requests: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let config = GatewayConfig::from_toml(CONFIG).expect("config");
    let core = SyncCore {
        engine: Engine::new(EngineConfig {
            orders_max: 1 << 16,
            ..EngineConfig::default()
        }),
        events: Vec::new(),
        out: VecDeque::new(),
    };
    let mut router = Router::new(&config, vec![Box::new(core)]);
    let monitor_on = std::env::args().nth(2).as_deref() == Some("monitor");
    let _monitor = monitor_on.then(|| {
        let m = bourse_monitor::Monitor::new(
            bourse_monitor::MonitorConfig {
                sample_every: std::env::args()
                    .nth(3)
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(bourse_gateway::config::Limits::default().monitor_sample_every),
                ..bourse_monitor::MonitorConfig::default()
            }
            .validated()
            .expect("monitor config"),
        );
        router.enable_probes(m.probes().recorder());
        m
    });
    bourse_gateway::bootstrap::bootstrap(&mut router, &config).expect("bootstrap");
    let dictionary = Arc::new(fix_front::dictionary());
    let mut sc = SessionConfig::new("FIX.4.4", "BOURSE", "CLIENT", Role::Acceptor);
    sc.check_latency = false;
    let mut g = Gateway {
        session: Session::new(
            sc,
            Arc::clone(&dictionary),
            Box::new(MemoryStore::new(1000)),
        ),
        router,
        exec_ids: 0,
        exec_id: String::new(),
        out_msg: OutMessage::default(),
    };
    let mut csc = SessionConfig::new(
        "FIX.4.4",
        "CLIENT",
        "BOURSE",
        Role::Initiator { heart_bt_int_s: 30 },
    );
    csc.check_latency = false;
    let mut client = Session::new(csc, dictionary, Box::new(MemoryStore::new(1000)));
    let mut capp = QueueingApplication::new(1 << 20);
    let now_ms = 1_700_000_000_000u64;
    client.on_connect(now_ms as i64);
    g.session.on_connect(now_ms as i64);
    let (mut to_gw, mut to_client) = (Vec::new(), Vec::new());
    pump(&mut client, &mut to_gw);
    gateway_side(&mut g, now_ms, &to_gw, &mut to_client);
    client.on_bytes(now_ms as i64, &to_client, &mut capp);
    assert!(client.is_logged_on() && g.session.is_logged_on(), "logon");
    let mut reports = 0u64;
    for i in 0..requests {
        let n = i / 2;
        let mut m;
        if i % 2 == 0 {
            m = OutMessage::new("D");
            m.push(11, format!("o{n}"));
            m.push(55, "SBER");
            m.push(54, "1");
            m.push(60, "20231114-22:13:20.000");
            m.push(38, "10");
            m.push(40, "2");
            m.push(44, "99.50");
        } else {
            m = OutMessage::new("F");
            m.push(41, format!("o{n}"));
            m.push(11, format!("c{n}"));
            m.push(55, "SBER");
            m.push(54, "1");
            m.push(60, "20231114-22:13:20.000");
        }
        client.send_app(now_ms as i64, m).expect("client send");
        to_gw.clear();
        to_client.clear();
        pump(&mut client, &mut to_gw);
        gateway_side(&mut g, now_ms, &to_gw, &mut to_client);
        client.on_bytes(now_ms as i64, &to_client, &mut capp);
        reports += capp.inbox.len() as u64;
        capp.inbox.clear();
    }
    assert_eq!(reports, requests, "one execution report per request");
    println!(
        "{requests} requests (new order / cancel alternately), {reports} reports, monitoring {}",
        if monitor_on { "on" } else { "off" }
    );
}
