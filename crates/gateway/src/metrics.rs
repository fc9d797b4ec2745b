//! What the gateway's event loop counts and how it reaches the monitor: [`LoopCounters`]
//! (the loop's own plain integers; the router keeps [`RouterCounters`]) and
//! `GatewayMetrics`, the monitor's counters and gauges, to which the loop adds what was
//! counted since the last publication on its 20 ms timer, so a message costs an add and no
//! atomic operation. [`metric_names`] lists the gateway's metric names.

use crate::router::RouterCounters;
use crate::server::DisconnectReason;
use bourse_monitor::{Counter, Gauge, Monitor};

/// What the event loop counts itself, in plain integers (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopCounters {
    /// Messages written, by protocol (FIX includes session-level messages).
    pub fix_msgs_out: u64,
    pub binary_msgs_out: u64,
    /// Binary application messages received (requests, throttled ones included; the FIX
    /// count is the router's, see [`RouterCounters::fix_requests_in`]).
    pub binary_msgs_in: u64,
    /// Execution reports sent (drop copies included) and status reports among them.
    pub exec_reports: u64,
    /// FIX session-level Rejects (35=3) sent.
    pub session_rejects: u64,
    pub disconnects: [u64; DisconnectReason::ALL.len()],
}

/// Metric names of the gateway (the monitor's [`bourse_monitor::names`] has the shared ones).
pub mod metric_names {
    pub const MESSAGES_TOTAL: &str = "bourse_gateway_messages_total";
    pub const REQUESTS_TOTAL: &str = "bourse_gateway_requests_total";
    pub const EXEC_REPORTS_TOTAL: &str = "bourse_gateway_execution_reports_total";
    pub const REJECTS_TOTAL: &str = bourse_monitor::names::GATEWAY_REJECTS_TOTAL;
    pub const DISCONNECTS_TOTAL: &str = "bourse_gateway_disconnects_total";
    pub const CONNECTIONS: &str = "bourse_gateway_connections";
    pub const ORDERS_TRACKED: &str = "bourse_gateway_orders_tracked";
}

/// The monitor's handles for everything the loop publishes, and what was published last.
pub(crate) struct GatewayMetrics {
    fix_in: Counter,
    fix_out: Counter,
    binary_in: Counter,
    binary_out: Counter,
    new_orders: Counter,
    cancels: Counter,
    replaces: Counter,
    mass_cancels: Counter,
    status_requests: Counter,
    exec_reports: Counter,
    busy_rejects: Counter,
    no_quorum_rejects: Counter,
    gateway_rejects: Counter,
    core_rejects: Counter,
    session_rejects: Counter,
    fix_throttle: Counter,
    binary_throttle: Counter,
    disconnects: Vec<Counter>,
    pub(crate) fix_sessions: Gauge,
    pub(crate) binary_sessions: Gauge,
    pub(crate) connections: Gauge,
    pub(crate) orders_tracked: Gauge,
    pub(crate) core_queues: Vec<Gauge>,
    last_loop: LoopCounters,
    last_router: RouterCounters,
}

impl GatewayMetrics {
    pub(crate) fn new(monitor: &Monitor, core_names: &[String]) -> GatewayMetrics {
        use metric_names::*;
        let r = monitor.registry();
        let msgs = |proto: &str, dir: &str| {
            r.counter(
                MESSAGES_TOTAL,
                "Messages through the gateway by protocol and direction (in: application requests; out: every message written).",
                &[("protocol", proto), ("direction", dir)],
            )
        };
        let req = |kind: &str| {
            r.counter(
                REQUESTS_TOTAL,
                "Requests by kind, whatever their outcome.",
                &[("kind", kind)],
            )
        };
        let rej = |cause: &str| {
            r.counter(
                REJECTS_TOTAL,
                "Requests refused, by cause (busy: overload, a core's in-flight bound or queue or the order table was full).",
                &[("cause", cause)],
            )
        };
        let fix = monitor.sessions("fix");
        let sbe = monitor.sessions("sbe");
        GatewayMetrics {
            fix_in: msgs("fix", "in"),
            fix_out: msgs("fix", "out"),
            binary_in: msgs("sbe", "in"),
            binary_out: msgs("sbe", "out"),
            new_orders: req("new_order"),
            cancels: req("cancel"),
            replaces: req("replace"),
            mass_cancels: req("mass_cancel"),
            status_requests: req("status"),
            exec_reports: r.counter(
                EXEC_REPORTS_TOTAL,
                "Execution reports sent, drop copies included.",
                &[],
            ),
            busy_rejects: rej("busy"),
            no_quorum_rejects: rej("no_quorum"),
            gateway_rejects: rej("gateway"),
            core_rejects: rej("core"),
            session_rejects: rej("fix_session_reject"),
            fix_throttle: fix.throttle_rejects,
            binary_throttle: sbe.throttle_rejects,
            disconnects: DisconnectReason::ALL
                .iter()
                .map(|d| {
                    r.counter(
                        DISCONNECTS_TOTAL,
                        "Connections the gateway closed, by reason.",
                        &[("reason", d.name())],
                    )
                })
                .collect(),
            fix_sessions: fix.active,
            binary_sessions: sbe.active,
            connections: r.gauge(CONNECTIONS, "Open TCP connections, both protocols.", &[]),
            orders_tracked: r.gauge(
                ORDERS_TRACKED,
                "Live orders the gateway tracks for its sessions.",
                &[],
            ),
            core_queues: core_names
                .iter()
                .map(|n| monitor.queue_depth(&format!("gateway_to_core_{n}")))
                .collect(),
            last_loop: LoopCounters::default(),
            last_router: RouterCounters::default(),
        }
    }

    /// Adds what was counted since the last call.
    pub(crate) fn publish(&mut self, l: &LoopCounters, rc: &RouterCounters) {
        let d = |now: u64, last: u64| now.saturating_sub(last);
        let (pl, pr) = (self.last_loop, self.last_router);
        self.fix_in.add(d(rc.fix_requests_in, pr.fix_requests_in));
        self.fix_out.add(d(l.fix_msgs_out, pl.fix_msgs_out));
        self.binary_in.add(d(l.binary_msgs_in, pl.binary_msgs_in));
        self.binary_out
            .add(d(l.binary_msgs_out, pl.binary_msgs_out));
        self.exec_reports.add(d(l.exec_reports, pl.exec_reports));
        self.session_rejects
            .add(d(l.session_rejects, pl.session_rejects));
        for (i, c) in self.disconnects.iter().enumerate() {
            c.add(d(l.disconnects[i], pl.disconnects[i]));
        }
        self.new_orders.add(d(rc.new_orders, pr.new_orders));
        self.cancels.add(d(rc.cancels, pr.cancels));
        self.replaces.add(d(rc.replaces, pr.replaces));
        self.mass_cancels.add(d(rc.mass_cancels, pr.mass_cancels));
        self.status_requests
            .add(d(rc.status_requests, pr.status_requests));
        self.busy_rejects.add(d(rc.busy_rejects, pr.busy_rejects));
        self.no_quorum_rejects
            .add(d(rc.no_quorum_rejects, pr.no_quorum_rejects));
        self.gateway_rejects
            .add(d(rc.gateway_rejects, pr.gateway_rejects));
        self.core_rejects.add(d(rc.core_rejects, pr.core_rejects));
        self.fix_throttle
            .add(d(rc.fix_throttle_rejects, pr.fix_throttle_rejects));
        self.binary_throttle
            .add(d(rc.binary_throttle_rejects, pr.binary_throttle_rejects));
        self.last_loop = *l;
        self.last_router = *rc;
    }
}
