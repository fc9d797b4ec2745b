//! What the gateway's event loop counts and how it reaches the monitor: [`LoopCounters`]
//! (the loop's own plain integers; the router keeps [`RouterCounters`]) and
//! `GatewayMetrics`, the monitor's counters and gauges, to which the loop adds what was
//! counted since the last publication on its 20 ms timer, so a message costs an add and no
//! atomic operation. [`metric_names`] lists the gateway's metric names.

use crate::router::RouterCounters;
use crate::server::DisconnectReason;
use bourse_core::link::LinkCounters;
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
    /// The link to a replicated core (`bourse_core::link::LinkCounters`), by core.
    pub const LINK_REQUESTS_RESENT_TOTAL: &str = "bourse_gateway_core_link_requests_resent_total";
    pub const LINK_PROBES_TOTAL: &str = "bourse_gateway_core_link_probes_total";
    pub const LINK_NODE_SWITCHES_TOTAL: &str = "bourse_gateway_core_link_node_switches_total";
    pub const LINK_LEADER_PROBE_SWITCHES_TOTAL: &str =
        "bourse_gateway_core_link_leader_probe_switches_total";
    pub const LINK_STREAM_RESUBSCRIPTIONS_TOTAL: &str =
        "bourse_gateway_core_link_stream_resubscriptions_total";
    pub const LINK_REQUESTS_PENDING: &str = "bourse_gateway_core_link_requests_pending";
    pub const LINK_NO_QUORUM: &str = "bourse_gateway_core_link_no_quorum";
}

/// The series of one core's link (only for a link that has counters: a replicated core's),
/// and what was published last, so that each tick adds the difference.
pub(crate) struct LinkMetrics {
    resent: Counter,
    probes: Counter,
    node_switches: Counter,
    leader_probe_switches: Counter,
    resubscriptions: Counter,
    pending: Gauge,
    no_quorum: Gauge,
    last: LinkCounters,
}

impl LinkMetrics {
    fn new(monitor: &Monitor, core: &str) -> LinkMetrics {
        use metric_names::*;
        let r = monitor.registry();
        let labels = [("core", core)];
        LinkMetrics {
            resent: r.counter(
                LINK_REQUESTS_RESENT_TOTAL,
                "Requests the link to a replicated core sent again after a first send (failover, gap, timeout, probe).",
                &labels,
            ),
            probes: r.counter(
                LINK_PROBES_TOTAL,
                "Requests the link sent alone to learn whether a node leads with a quorum (quorum lost, or a node not known to lead).",
                &labels,
            ),
            node_switches: r.counter(
                LINK_NODE_SWITCHES_TOTAL,
                "Times the link moved its requests to another node of the replica group.",
                &labels,
            ),
            leader_probe_switches: r.counter(
                LINK_LEADER_PROBE_SWITCHES_TOTAL,
                "Times a leader probe found a newer leader while the link's requests waited.",
                &labels,
            ),
            resubscriptions: r.counter(
                LINK_STREAM_RESUBSCRIPTIONS_TOTAL,
                "Times the link subscribed again to the core's committed stream.",
                &labels,
            ),
            pending: r.gauge(
                LINK_REQUESTS_PENDING,
                "Requests handed to the replica group and not yet answered.",
                &labels,
            ),
            no_quorum: r.gauge(
                LINK_NO_QUORUM,
                "1 while the core's leader says it has no quorum (new orders are refused), else 0.",
                &labels,
            ),
            last: LinkCounters::default(),
        }
    }

    /// Adds what the link counted since the last call and sets the gauges.
    pub(crate) fn publish(&mut self, now: &LinkCounters) {
        let d = |now: u64, last: u64| now.saturating_sub(last);
        let last = self.last;
        self.resent
            .add(d(now.requests_resent, last.requests_resent));
        self.probes.add(d(now.probes, last.probes));
        self.node_switches
            .add(d(now.node_switches, last.node_switches));
        self.leader_probe_switches
            .add(d(now.leader_probe_switches, last.leader_probe_switches));
        self.resubscriptions
            .add(d(now.stream_resubscriptions, last.stream_resubscriptions));
        self.pending
            .set(now.requests_pending.min(i64::MAX as u64) as i64);
        self.no_quorum.set(i64::from(now.no_quorum));
        self.last = *now;
    }
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
    /// By core: `None` for a core whose link has no counters (an engine in process).
    pub(crate) core_links: Vec<Option<LinkMetrics>>,
    last_loop: LoopCounters,
    last_router: RouterCounters,
}

impl GatewayMetrics {
    /// `linked` says, by core, whether the core's link has counters to export.
    pub(crate) fn new(monitor: &Monitor, core_names: &[String], linked: &[bool]) -> GatewayMetrics {
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
            core_links: core_names
                .iter()
                .zip(linked)
                .map(|(n, &l)| l.then(|| LinkMetrics::new(monitor, n)))
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
