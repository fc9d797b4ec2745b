//! Binary (SBE) order entry through the gateway, end to end with an in-process engine.

use crate::common;

use bourse_client::binary::BinTif;
use bourse_client::{BinaryClient, Received, Response};
use bourse_core::link::{CoreLink, CoreOutput, LinkCounters, RequestKey, SubmitError};
use bourse_core::Command;
use bourse_gateway::metrics::metric_names;
use bourse_gateway::{GatewayConfig, GatewayHandle};
use bourse_wire::order_entry::codec::business_reject_reason::BusinessRejectReason;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn next(c: &mut BinaryClient) -> Received {
    loop {
        let r = c.recv(WAIT).unwrap().expect("a response");
        if !matches!(r.response, Response::Sequence { .. }) {
            return r;
        }
    }
}

#[test]
fn orders_trade_and_each_side_gets_acks_and_fills() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let mut a = BinaryClient::connect(addr, "alpha-bin", 1000, 1).unwrap();
    let mut b = BinaryClient::connect(addr, "beta-bin", 1000, 1).unwrap();
    assert_eq!(a.server_next_seq_at_establish, 1);
    a.new_order(1, 101, 1, false, 100, Some(10_050), BinTif::Day)
        .unwrap();
    let ack = next(&mut a);
    assert_eq!(ack.seq, Some(1));
    let Response::NewOrderAck {
        cl_ord_id: 1,
        order_id,
        leaves_qty: 100,
    } = ack.response
    else {
        panic!("{ack:?}")
    };
    b.new_order(7, 201, 1, true, 30, Some(10_100), BinTif::Day)
        .unwrap();
    assert!(matches!(
        next(&mut b).response,
        Response::NewOrderAck { cl_ord_id: 7, .. }
    ));
    let fill = next(&mut b);
    assert_eq!(
        fill.response,
        Response::Execution {
            cl_ord_id: 7,
            order_id: order_id + 1,
            trade_id: 1,
            last_px: 10_050,
            last_qty: 30,
            leaves_qty: 0,
            cum_qty: 30,
            aggressor: true
        }
    );
    let passive = next(&mut a);
    assert!(matches!(
        passive.response,
        Response::Execution {
            cl_ord_id: 1,
            leaves_qty: 70,
            aggressor: false,
            ..
        }
    ));

    a.replace(2, 1, 101, 1, 10_200, 80).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::ReplaceAck {
            cl_ord_id: 2,
            orig_cl_ord_id: 1,
            leaves_qty: 50,
            ..
        }
    ));
    a.cancel(3, 2, 101, 1).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::CancelAck {
            cl_ord_id: Some(3),
            orig_cl_ord_id: 2,
            canceled_qty: 50,
            ..
        }
    ));
    a.cancel(4, 2, 101, 1).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::CancelReject {
            cl_ord_id: 4,
            reason: 1
        }
    ));

    for id in 10..13 {
        a.new_order(id, 101, 1, true, 10, Some(9_900), BinTif::Day)
            .unwrap();
        next(&mut a);
    }
    a.mass_cancel(20, None, None).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            next(&mut a).response,
            Response::CancelAck { reason: 1, .. }
        ));
    }
    assert!(matches!(
        next(&mut a).response,
        Response::MassCancelAck {
            cl_ord_id: 20,
            canceled_count: 3,
            result: 0
        }
    ));
}

#[test]
fn a_reconnecting_client_recovers_missed_responses_by_retransmission() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let mut a = BinaryClient::connect(addr, "alpha-bin", 1000, 1).unwrap();
    a.new_order(1, 101, 1, false, 10, Some(10_000), BinTif::Day)
        .unwrap();
    assert_eq!(next(&mut a).seq, Some(1));
    a.terminate().unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::Terminate { reason: 0 }
    ));
    drop(a);
    // While alpha is away its order trades: the fill is sequenced and kept.
    let mut b = BinaryClient::connect(addr, "beta-bin", 1000, 1).unwrap();
    b.new_order(1, 201, 1, true, 10, Some(10_000), BinTif::Day)
        .unwrap();
    next(&mut b);
    next(&mut b);
    let mut a = BinaryClient::connect(addr, "alpha-bin", 1000, 2).unwrap();
    assert_eq!(
        a.server_next_seq_at_establish, 3,
        "one response (the fill) was missed"
    );
    a.retransmit(2, 10).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::Retransmission {
            next_seq_no: 2,
            count: 1
        }
    ));
    let fill = next(&mut a);
    assert_eq!(fill.seq, Some(2));
    assert!(matches!(
        fill.response,
        Response::Execution {
            cl_ord_id: 1,
            leaves_qty: 0,
            ..
        }
    ));
}

#[test]
fn bad_credentials_and_a_second_connection_are_refused() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let err = BinaryClient::connect(addr, "nobody", 1000, 1)
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("EstablishmentReject { reason: 1 }"),
        "{err}"
    );
    let _a = BinaryClient::connect(addr, "alpha-bin", 1000, 1).unwrap();
    let err = BinaryClient::connect(addr, "alpha-bin", 1000, 1)
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .contains("EstablishmentReject { reason: 2 }"),
        "{err}"
    );
    let err = BinaryClient::connect(addr, "beta-bin", 5, 1).err().unwrap();
    assert!(
        err.to_string()
            .contains("EstablishmentReject { reason: 3 }"),
        "{err}"
    );
}

#[test]
fn garbage_on_an_established_session_is_terminated_as_an_invalid_frame() {
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    let mut a = BinaryClient::connect(addr, "alpha-bin", 1000, 1).unwrap();
    // Bytes that are not a frame: the gateway terminates with InvalidFrame (3).
    a.write_raw(&[0xff; 16]).unwrap();
    assert!(matches!(
        next(&mut a).response,
        Response::Terminate { reason: 3 }
    ));
}

/// Rests a buy of 10 at `price` for account 201 and returns once it is acknowledged.
fn rest(c: &mut BinaryClient, id: u64, price: i64) {
    c.new_order(id, 201, 1, true, 10, Some(price), BinTif::Day)
        .unwrap();
    assert!(matches!(
        next(c).response,
        Response::NewOrderAck { cl_ord_id, .. } if cl_ord_id == id
    ));
}

/// The CancelAcks a session receives before its MassCancelAck, and that ack's count and result.
fn mass_cancel_answer(c: &mut BinaryClient, id: u64) -> (usize, u32, u8) {
    let mut cancels = 0;
    loop {
        match next(c).response {
            Response::CancelAck { reason: 1, .. } => cancels += 1,
            Response::MassCancelAck {
                cl_ord_id,
                canceled_count,
                result,
            } if cl_ord_id == id => return (cancels, canceled_count, result),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_binary_mass_cancel_reaches_the_account_or_the_firm_when_it_asks() {
    use bourse_client::binary::MassCancelScope;
    let gw = common::start();
    let addr = gw.handle.binary_addr().unwrap();
    // Two sessions of firm 2 share account 201.
    let mut beta = BinaryClient::connect(addr, "beta-bin", 1000, 1).unwrap();
    let mut other = BinaryClient::connect(addr, "flood", 1000, 1).unwrap();

    rest(&mut beta, 1, 9_000);
    rest(&mut other, 1, 9_001);
    rest(&mut other, 2, 9_002);
    // Session scope (the default): beta's own order only.
    beta.mass_cancel(2, Some(201), None).unwrap();
    assert_eq!(mass_cancel_answer(&mut beta, 2), (1, 1, 0));

    // Account scope: every order of 201, whoever entered it; beta hears of its own only.
    rest(&mut beta, 3, 9_003);
    beta.mass_cancel_scoped(4, MassCancelScope::Account, Some(201), None)
        .unwrap();
    assert_eq!(mass_cancel_answer(&mut beta, 4), (1, 3, 0));
    for _ in 0..2 {
        assert!(matches!(
            next(&mut other).response,
            Response::CancelAck { reason: 1, .. }
        ));
    }

    // Firm scope: the firm's orders.
    rest(&mut other, 3, 9_004);
    beta.mass_cancel_scoped(5, MassCancelScope::Firm, None, None)
        .unwrap();
    assert_eq!(mass_cancel_answer(&mut beta, 5), (0, 1, 0));
    assert!(matches!(
        next(&mut other).response,
        Response::CancelAck { reason: 1, .. }
    ));

    // A scope outside the enum is refused by name.
    beta.mass_cancel_scoped(6, MassCancelScope::NullVal, None, None)
        .unwrap();
    assert_eq!(mass_cancel_answer(&mut beta, 6), (0, 0, 5));
}

/// An in-process engine behind a stand-in for a replicated core's link: while `lost` is set,
/// it refuses every command as a link to a group without a quorum does
/// (`SubmitError::NoQuorum`), and it reports the counters the test puts in `counters`, as
/// `bourse_cluster::link::ClusterLink` reports its own.
struct QuorumCore {
    inner: Box<dyn CoreLink>,
    lost: Arc<AtomicBool>,
    counters: Arc<Mutex<LinkCounters>>,
}

impl CoreLink for QuorumCore {
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError> {
        if self.lost.load(Ordering::SeqCst) {
            return Err(SubmitError::NoQuorum);
        }
        self.inner.submit(key, command)
    }

    fn try_recv(&mut self) -> Option<CoreOutput> {
        self.inner.try_recv()
    }

    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>) {
        self.inner.set_notify(notify);
    }

    fn link_counters(&self) -> Option<LinkCounters> {
        let mut c = *self.counters.lock().unwrap();
        c.no_quorum = self.lost.load(Ordering::SeqCst);
        Some(c)
    }
}

/// The value of the series `name{core="core"}` on the gateway's /metrics, if it is there.
fn link_metric(gw: &GatewayHandle, name: &str) -> Option<u64> {
    let text = gw.monitor().unwrap().render_metrics();
    let key = format!("{name}{{core=\"core\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map(|v| v.trim().parse::<f64>().unwrap() as u64)
}

#[test]
fn a_core_without_a_quorum_is_refused_to_binary_clients_as_core_no_quorum_and_shown_on_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let text = common::CONFIG.replace(
        "connections_max = 64\n",
        "connections_max = 64\nmonitor_listen = \"127.0.0.1:0\"\n",
    );
    let mut config = GatewayConfig::from_toml(&text).unwrap();
    config.gateway.store_dir = dir.path().to_path_buf();
    config.gateway.core_queue_depth = 4096;
    let lost = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Mutex::new(LinkCounters::default()));
    let links = bourse_engine::in_process::engine_links(
        config.core_plan().len(),
        common::engine_config(),
        config.gateway.core_queue_depth,
    )
    .into_iter()
    .map(|inner| {
        Box::new(QuorumCore {
            inner,
            lost: lost.clone(),
            counters: counters.clone(),
        }) as Box<dyn CoreLink>
    })
    .collect();
    let gw = bourse_gateway::spawn_cores(config, links, None).unwrap();
    let metric = |name: &str, want: u64| {
        assert!(
            common::eventually(WAIT, || link_metric(&gw, name) == Some(want)),
            "{name}: {:?}, want {want}",
            link_metric(&gw, name)
        );
    };
    metric(metric_names::LINK_NO_QUORUM, 0);
    metric(metric_names::LINK_REQUESTS_RESENT_TOTAL, 0);

    let mut a = BinaryClient::connect(gw.binary_addr().unwrap(), "alpha-bin", 1000, 1).unwrap();
    a.new_order(1, 101, 1, false, 10, Some(10_050), BinTif::Day)
        .unwrap();
    assert!(
        matches!(
            next(&mut a).response,
            Response::NewOrderAck { cl_ord_id: 1, .. }
        ),
        "the first order is taken"
    );

    // The quorum is lost: new orders, cancels and replaces are refused unprocessed with the
    // reason of their own, naming the request.
    lost.store(true, Ordering::SeqCst);
    *counters.lock().unwrap() = LinkCounters {
        requests_resent: 3,
        probes: 4,
        node_switches: 2,
        leader_probe_switches: 1,
        stream_resubscriptions: 1,
        requests_pending: 1,
        no_quorum: false,
    };
    let no_quorum = u8::from(BusinessRejectReason::CoreNoQuorum);
    a.new_order(2, 101, 1, false, 10, Some(10_050), BinTif::Day)
        .unwrap();
    assert_eq!(
        next(&mut a).response,
        Response::BusinessReject {
            ref_cl_ord_id: Some(2),
            reason: no_quorum,
            retry_after_ms: 0,
        }
    );
    a.cancel(3, 1, 101, 1).unwrap();
    assert_eq!(
        next(&mut a).response,
        Response::BusinessReject {
            ref_cl_ord_id: Some(3),
            reason: no_quorum,
            retry_after_ms: 0,
        }
    );
    // The operator sees it and what the link did on /metrics.
    metric(metric_names::LINK_NO_QUORUM, 1);
    metric(metric_names::LINK_REQUESTS_RESENT_TOTAL, 3);
    metric(metric_names::LINK_PROBES_TOTAL, 4);
    metric(metric_names::LINK_NODE_SWITCHES_TOTAL, 2);
    metric(metric_names::LINK_LEADER_PROBE_SWITCHES_TOTAL, 1);
    metric(metric_names::LINK_STREAM_RESUBSCRIPTIONS_TOTAL, 1);
    metric(metric_names::LINK_REQUESTS_PENDING, 1);
    let refused = gw.monitor().unwrap().registry().counter_sum_where(
        metric_names::REJECTS_TOTAL,
        "cause",
        "no_quorum",
    );
    assert_eq!(refused, Some(2));

    // The quorum is back: orders go in again, and the counters only grow.
    lost.store(false, Ordering::SeqCst);
    *counters.lock().unwrap() = LinkCounters {
        requests_resent: 5,
        probes: 6,
        node_switches: 2,
        leader_probe_switches: 1,
        stream_resubscriptions: 2,
        requests_pending: 0,
        no_quorum: false,
    };
    a.new_order(4, 101, 1, false, 10, Some(10_050), BinTif::Day)
        .unwrap();
    assert!(
        matches!(
            next(&mut a).response,
            Response::NewOrderAck { cl_ord_id: 4, .. }
        ),
        "an order after the quorum's return is taken"
    );
    metric(metric_names::LINK_NO_QUORUM, 0);
    metric(metric_names::LINK_REQUESTS_RESENT_TOTAL, 5);
    metric(metric_names::LINK_PROBES_TOTAL, 6);
    metric(metric_names::LINK_STREAM_RESUBSCRIPTIONS_TOTAL, 2);
    metric(metric_names::LINK_REQUESTS_PENDING, 0);
}
