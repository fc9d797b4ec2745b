//! The reference reacting client against bourse's real FIX gateway (an in-process venue on
//! 127.0.0.1, as `bourse demo` runs it): fed an ITCH feed, it names each stock by the symbol
//! of the stock directory and writes Price(4) prices, which the gateway reads at the
//! instrument's own scale; fed bourse's SBE order log, it takes symbols and scales from the
//! instrument definitions. The gateway accepts every order (ExecutionReport New, no reject);
//! the same SBE feed without the definitions (the security id as Symbol) is rejected order for
//! order, so the acceptance is the names' doing.

use bourse_core::*;
use bourse_engine::fixtures::{equity, Driver};
use bourse_itch::feed::{Feed, FeedLimits};
use bourse_itch::mold::session_of;
use bourse_loadgen::gateway::SessionProtocol;
use bourse_t2t::client::{bind_feed, run_client, ClientConfig, ClientReport};
use bourse_t2t::gen::{synthetic, GenConfig, Sizes};
use bourse_t2t::order::{InstrumentName, OrderSpec};
use bourse_t2t::FeedFormat;
use bourse_venue::{Backend, DeploymentSpec, LocalDeployment, MarketSpec};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::AtomicBool;

const SBER: u32 = 1;
/// 100.00 at the equity's two decimals.
const REFERENCE_PRICE: i64 = 10_000;
/// The equity's lot.
const LOT: i64 = 10;

fn venue(dir: &std::path::Path, sessions: &[&str]) -> LocalDeployment {
    let def = equity(SBER, "SBER", REFERENCE_PRICE);
    let mut setup = vec![CommandBody::AddInstrument(def.clone())];
    // One account per session (firm 1, the sessions' firm), so the runs' ClOrdIDs, each
    // counting from 1, never meet on one account.
    for account in 1..=sessions.len() as u32 {
        setup.push(CommandBody::AddAccount(AccountSpec {
            account: AccountId(account),
            firm: FirmId(1),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        }));
        setup.push(CommandBody::Deposit {
            account: AccountId(account),
            amount: Cash(1_000_000_000_0000),
        });
    }
    let spec = DeploymentSpec {
        markets: vec![MarketSpec {
            name: "equities".into(),
            instruments: vec![def],
            setup,
        }],
        backend: Backend::InProcess,
        protocol: SessionProtocol::Fix,
        gateways: 1,
        worker_sessions: Vec::new(),
        data_dir: dir.join("venue"),
        orders_max: 10_000,
        accounts_max: 100,
        fsync: bourse_cluster::FsyncSetting::Never,
        market_data: false,
        monitor: None,
        extra_fix_sessions: (1..)
            .zip(sessions)
            .map(|(account, s)| (s.to_string(), vec![account]))
            .collect(),
        verbose: false,
        core_in_flight_max: None,
        bounds: None,
    };
    LocalDeployment::start(spec).expect("venue starts")
}

/// Runs the client on `packets` (sent to its feed socket over loopback) against the gateway
/// and waits for the answer to every order it sent.
fn run_against(
    gateway: SocketAddr,
    comp_id: &str,
    feed: FeedFormat,
    instruments: Vec<InstrumentName>,
    packets: &[Vec<u8>],
) -> ClientReport {
    let socket = bind_feed(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
    let target = socket.local_addr().unwrap();
    let mut cfg = ClientConfig::new(gateway);
    cfg.reactor.feed = feed;
    cfg.reactor.order = OrderSpec {
        sender_comp_id: comp_id.into(),
        target_comp_id: "BOURSE".into(),
        qty: LOT,
        price_scale: 0,
        instruments,
    };
    cfg.packets_max = Some(packets.len() as u64);
    // A hang guard only: the wait ends as soon as every order is answered.
    cfg.await_answers_ms = Some(60_000);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let client = s.spawn(|| run_client(&cfg, socket, &stop));
        // The socket is bound before the client logs on, so nothing sent is lost; a few
        // dozen small datagrams fit its receive buffer.
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        for p in packets {
            tx.send_to(p, target).unwrap();
        }
        client.join().unwrap().unwrap()
    })
}

/// An ITCH day of SBER from the engine: sells at 100.10, 100.05 and 100.02, then the best
/// one cancelled (the best ask moves four times).
fn itch_packets() -> Vec<Vec<u8>> {
    let def = equity(SBER, "SBER", REFERENCE_PRICE);
    let mut d = Driver::new(bourse_engine::EngineConfig::default());
    d.add_instrument(def.clone());
    d.add_account_spec(
        AccountSpec {
            account: AccountId(2),
            firm: FirmId(2),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        },
        1_000_000_000_0000,
    );
    let mut feed = Feed::new(session_of("GW").unwrap(), FeedLimits::default(), 4).unwrap();
    let mut packets = Vec::new();
    let mut send = |p: &[u8]| packets.push(p.to_vec());
    feed.start(d.ts_ns, &mut send);
    feed.define(&def, d.ts_ns, &mut send);
    let sell = |cl: u64, price: i64| {
        CommandBody::NewOrder(NewOrder {
            firm: None,
            account: AccountId(2),
            cl_ord_id: ClOrdId(cl),
            instrument: InstrumentId(SBER),
            side: Side::Sell,
            ord_type: OrdType::Limit,
            price: Price(price),
            qty: Qty(LOT),
            tif: TimeInForce::Day,
            expire_ts_ns: 0,
            display_qty: Qty(0),
        })
    };
    let mut best = None;
    for (cl, price) in [(1, 10_010), (2, 10_005), (3, 10_002)] {
        let ev = d.run(sell(cl, price)).to_vec();
        best = bourse_engine::fixtures::accepted_id(&ev);
        feed.publish(&ev, &mut send);
    }
    let cancel = CommandBody::Cancel(Cancel {
        account: AccountId(2),
        cl_ord_id: ClOrdId(4),
        target: OrderRef {
            order_id: best,
            orig_cl_ord_id: None,
        },
    });
    let ev = d.run(cancel).to_vec();
    feed.publish(&ev, &mut send);
    packets
}

fn assert_all_accepted(r: &ClientReport, orders: u64) {
    assert_eq!(r.stats.orders, orders, "{r:?}");
    let a = &r.answers;
    assert_eq!(
        (a.rejected, a.business_rejects, a.session_rejects),
        (0, 0, 0),
        "the gateway refused: {:?}",
        a.first_reject_text
    );
    assert_eq!(a.accepted, orders, "{a:?}");
}

#[test]
fn the_client_trades_through_the_real_fix_gateway_with_symbols_and_scales_from_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut venue = venue(dir.path(), &["T2TITCH", "T2TSBE", "T2TRAW"]);
    let gateway = venue.gateways()[0].fix_addr().unwrap();

    // ITCH: the symbol from the stock directory, Price(4) read at two decimals.
    let r = run_against(
        gateway,
        "T2TITCH",
        FeedFormat::Itch,
        Vec::new(),
        &itch_packets(),
    );
    assert_all_accepted(&r, 4);

    // SBE: the symbol and the scale from the instrument definitions.
    let sbe = synthetic(&GenConfig {
        packets: 40,
        instruments: 1,
        first_security_id: SBER,
        sizes: Sizes::parse("1-5").unwrap(),
        mid_price: REFERENCE_PRICE,
        ..GenConfig::default()
    })
    .unwrap();
    let names = vec![InstrumentName {
        security_id: SBER,
        symbol: "SBER".into(),
        price_scale: 2,
    }];
    let r = run_against(gateway, "T2TSBE", FeedFormat::Sbe, names, &sbe);
    let orders = r.stats.orders;
    assert!(orders >= 3, "the flow moved the best ask ({orders})");
    assert_all_accepted(&r, orders);

    // The same without definitions: Symbol "1" is no instrument of the venue's.
    let r = run_against(gateway, "T2TRAW", FeedFormat::Sbe, Vec::new(), &sbe);
    assert_eq!(r.stats.orders, orders);
    assert_eq!(r.answers.accepted, 0);
    assert_eq!(r.answers.rejected, orders, "{:?}", r.answers);
    venue.stop();
}
