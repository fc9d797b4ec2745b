//! The call auctions' times in force reach the core over both protocols: FIX TimeInForce 2
//! (at the opening), 7 (at the close) and B (good for auction), binary AtTheOpening (2),
//! AtTheClose (7) and GoodForAuction (11); one outside its phase is refused as an invalid
//! time in force.

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
/// The key of the injected `SetPhase`, apart from every session's.
const INJECTED: RequestKey = RequestKey {
    session: u32::MAX,
    seq: 1,
};

/// The in-process engine, with instrument 1 put in its opening auction just before the first
/// order reaches it (after the gateway's bootstrap added it), as the schedule would.
struct AuctionCore {
    inner: Box<dyn CoreLink>,
    called: bool,
}

impl CoreLink for AuctionCore {
    fn submit(&mut self, key: RequestKey, command: Command) -> Result<(), SubmitError> {
        if !self.called && matches!(command.body, CommandBody::NewOrder(_)) {
            self.called = true;
            let phase = Command {
                ts_ns: command.ts_ns,
                body: CommandBody::SetPhase {
                    instrument: Some(InstrumentId(1)),
                    phase: Phase::OpeningAuction,
                },
            };
            self.inner.submit(INJECTED, phase)?;
        }
        self.inner.submit(key, command)
    }

    fn try_recv(&mut self) -> Option<CoreOutput> {
        loop {
            match self.inner.try_recv()? {
                CoreOutput::Event { key, .. } | CoreOutput::Done { key } if key == INJECTED => {}
                out => return Some(out),
            }
        }
    }

    fn set_notify(&mut self, notify: Arc<dyn Fn() + Send + Sync>) {
        self.inner.set_notify(notify);
    }
}

fn next_response(c: &mut BinaryClient) -> Response {
    loop {
        let r = c.recv(WAIT).unwrap().expect("a response");
        if !matches!(r.response, Response::Sequence { .. }) {
            return r.response;
        }
    }
}

#[test]
fn auction_times_in_force_are_taken_in_their_phase_and_refused_outside_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::from_toml(common::CONFIG).unwrap();
    config.gateway.store_dir = dir.path().to_path_buf();
    let links = bourse_engine::in_process::engine_links(
        config.core_plan().len(),
        common::engine_config(),
        config.gateway.core_queue_depth,
    )
    .into_iter()
    .map(|inner| {
        Box::new(AuctionCore {
            inner,
            called: false,
        }) as Box<dyn CoreLink>
    })
    .collect();
    let gw = bourse_gateway::spawn_cores(config, links, None).unwrap();

    // Binary, in the opening auction: at the opening and good for auction rest; at the close
    // is refused.
    let mut b = BinaryClient::connect(gw.binary_addr().unwrap(), "alpha-bin", 1000, 1).unwrap();
    b.new_order(1, 101, 1, false, 10, Some(10_050), BinTif::AtTheOpening)
        .unwrap();
    let ack = next_response(&mut b);
    assert!(
        matches!(ack, Response::NewOrderAck { cl_ord_id: 1, .. }),
        "{ack:?}"
    );
    b.new_order(2, 101, 1, false, 10, Some(10_060), BinTif::GoodForAuction)
        .unwrap();
    let ack = next_response(&mut b);
    assert!(
        matches!(ack, Response::NewOrderAck { cl_ord_id: 2, .. }),
        "{ack:?}"
    );
    b.new_order(3, 101, 1, false, 10, Some(10_060), BinTif::AtTheClose)
        .unwrap();
    assert_eq!(
        next_response(&mut b),
        Response::OrderReject {
            cl_ord_id: 3,
            reason: u16::from(OrderRejectReason::InvalidTimeInForce),
        }
    );

    // FIX: 2 and B are taken, 7 refused with the reason in Text.
    let cfg = FixClientConfig::new(gw.fix_addr().unwrap(), "BETA", "BOURSE");
    let mut beta = FixClient::connect(&cfg).unwrap();
    for (id, tif, accepted) in [("o1", '2', true), ("o2", 'B', true), ("o3", '7', false)] {
        beta.new_order(id, Some(201), "SBER", true, 10, Some("99"), tif)
            .unwrap();
        let report = beta
            .recv_type("8", WAIT)
            .unwrap()
            .expect("an execution report");
        let f = |tag: u32| {
            FixClient::field(&report, tag as _)
                .unwrap_or("")
                .to_string()
        };
        assert_eq!(f(11), id);
        if accepted {
            assert_eq!((f(150), f(39)), ("0".into(), "0".into()), "{tif}");
        } else {
            assert_eq!((f(150), f(39)), ("8".into(), "8".into()), "{tif}");
            assert!(f(58).contains("TimeInForceNotInPhase"), "{}", f(58));
        }
    }
}
