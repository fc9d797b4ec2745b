//! An order refused because the account has a margin call open carries that reason in both
//! protocols: `MarginCallOpen` (25) in the binary OrderReject, OrdRejReason 3 (order exceeds
//! limit, as every pre-trade risk refusal) with Text `MarginCallOpen` over FIX.

use crate::common;

use bourse_client::binary::BinTif;
use bourse_client::{BinaryClient, FixClient, FixClientConfig, Response};
use bourse_core::link::{CoreLink, CoreOutput, RequestKey, SubmitError};
use bourse_core::*;
use bourse_gateway::GatewayConfig;
use bourse_wire::order_entry::codec::order_reject_reason::OrderRejectReason;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);
/// The account the call is opened on (firm 2: FIX session BETA, binary session beta-bin).
const CALLED: u32 = 201;
/// The key of the injected `MarginCall`: a session id no gateway session has, so its
/// outputs can be told apart and kept from the gateway.
const INJECTED: RequestKey = RequestKey {
    session: u32::MAX,
    seq: 1,
};

/// The in-process engine, with a margin call opened on `CALLED` just before the first order
/// reaches it (after the gateway's bootstrap created the account), as clearing's run would
/// through the sequenced path.
struct CalledCore {
    inner: Box<dyn CoreLink>,
    called: bool,
}

impl CoreLink for CalledCore {
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError> {
        if !self.called && matches!(command.body, CommandBody::NewOrder(_)) {
            self.called = true;
            let call = Command {
                ts_ns: command.ts_ns,
                body: CommandBody::MarginCall {
                    account: AccountId(CALLED),
                    amount: Cash(1_000_0000),
                },
            };
            self.inner.submit(INJECTED, call)?;
        }
        self.inner.submit(key, command)
    }

    fn try_recv(&mut self) -> Option<CoreOutput> {
        loop {
            match self.inner.try_recv()? {
                CoreOutput::Event { key, event } if key == INJECTED => {
                    assert!(matches!(event, Event::MarginCallSet { .. }), "{event:?}");
                }
                CoreOutput::Done { key } if key == INJECTED => {}
                out => return Some(out),
            }
        }
    }

    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>) {
        self.inner.set_notify(notify);
    }
}

#[test]
fn an_order_refused_for_an_open_margin_call_says_so_over_binary_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::from_toml(common::CONFIG).unwrap();
    config.gateway.store_dir = dir.path().to_path_buf();
    config.gateway.core_queue_depth = 4096;
    let links = bourse_engine::in_process::engine_links(
        config.core_plan().len(),
        common::engine_config(),
        config.gateway.core_queue_depth,
    )
    .into_iter()
    .map(|inner| {
        Box::new(CalledCore {
            inner,
            called: false,
        }) as Box<dyn CoreLink>
    })
    .collect();
    let gw = bourse_gateway::spawn_cores(config, links, None).unwrap();

    // Binary: the account is flat, so any order would increase its exposure.
    let mut b = BinaryClient::connect(gw.binary_addr().unwrap(), "beta-bin", 1000, 1).unwrap();
    b.new_order(1, CALLED, 1, true, 10, Some(10_000), BinTif::Day)
        .unwrap();
    let reject = loop {
        let r = b.recv(WAIT).unwrap().expect("a response");
        if !matches!(r.response, Response::Sequence { .. }) {
            break r.response;
        }
    };
    assert_eq!(
        reject,
        Response::OrderReject {
            cl_ord_id: 1,
            reason: u16::from(OrderRejectReason::MarginCallOpen),
        }
    );
    assert_eq!(u16::from(OrderRejectReason::MarginCallOpen), 25);

    // FIX: the same refusal as a Rejected ExecutionReport.
    let cfg = FixClientConfig::new(gw.fix_addr().unwrap(), "BETA", "BOURSE");
    let mut beta = FixClient::connect(&cfg).unwrap();
    beta.new_order("m1", Some(CALLED), "SBER", false, 10, Some("100"), '0')
        .unwrap();
    let rej = beta
        .recv_type("8", WAIT)
        .unwrap()
        .expect("an execution report");
    let f = |tag: u32| FixClient::field(&rej, tag as _).unwrap_or("").to_string();
    assert_eq!(
        (f(150), f(39), f(11)),
        ("8".into(), "8".into(), "m1".into())
    );
    assert_eq!((f(103), f(58)), ("3".into(), "MarginCallOpen".into()));

    // Another account is untouched.
    let mut alpha = BinaryClient::connect(gw.binary_addr().unwrap(), "alpha-bin", 1000, 1).unwrap();
    alpha
        .new_order(2, 101, 1, false, 10, Some(10_050), BinTif::Day)
        .unwrap();
    let ack = loop {
        let r = alpha.recv(WAIT).unwrap().expect("a response");
        if !matches!(r.response, Response::Sequence { .. }) {
            break r.response;
        }
    };
    assert!(
        matches!(ack, Response::NewOrderAck { cl_ord_id: 2, .. }),
        "{ack:?}"
    );
}
