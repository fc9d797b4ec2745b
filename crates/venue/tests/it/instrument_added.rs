//! An instrument added by an operator while the venue runs is tradable end to end: on a
//! replicated venue (two markets, three nodes each) with market data and an ITCH feed of the
//! futures core, `add_instrument` through the admin API makes the gateway route it over FIX
//! (by symbol) and binary (by id), the two sessions trade it against each other, the market
//! data instruments channel defines it, and the ITCH feed gives it a stock directory entry:
//! all learned from the `InstrumentAdded` event on the committed stream, none configured.
//! And a gateway that crashed after the addition (its saved state deleted), whose stream
//! starts past it, learns it from its core's answer to its link's instruments query and
//! trades it from its first message.

use bourse_admin::AdminClient;
use bourse_auth::{hash_password_with, CredentialEntry, CredentialStore, HashCost};
use bourse_client::binary::{BinaryClient, Received, Response};
use bourse_client::fix::{FixClient, FixClientConfig};
use bourse_core::*;
use bourse_engine::fixtures::{equity, future};
use bourse_itch::net::{run_consumer, ConsumerLimits, ServeConfig};
use bourse_itch::service::{ItchService, ServiceConfig};
use bourse_loadgen::gateway::SessionProtocol;
use bourse_marketdata::udp::{FeedAddrs, UdpSubscriber};
use bourse_marketdata::{Channel, SubscriberConfig};
use bourse_venue::{Backend, DeploymentSpec, LocalDeployment, MarketSpec};
use serde_json::json;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SBER: u32 = 1;
const SI: u32 = 2;
/// The instrument the operator adds to the futures market while the venue runs.
const RTS: u32 = 3;
const CASH: i128 = 100_000_000_0000;
const WAIT: Duration = Duration::from_secs(10);

fn market(name: &str, instrument: Instrument) -> MarketSpec {
    let mut setup = vec![CommandBody::AddInstrument(instrument.clone())];
    for account in [1, 2] {
        setup.push(CommandBody::AddAccount(AccountSpec {
            account: AccountId(account),
            firm: FirmId(account),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        }));
        setup.push(CommandBody::Deposit {
            account: AccountId(account),
            amount: Cash(CASH),
        });
    }
    MarketSpec {
        name: name.into(),
        instruments: vec![instrument],
        setup,
    }
}

fn binary_wait<T>(b: &mut BinaryClient, mut pick: impl FnMut(&Response) -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Some(Received { response, .. }) = b.recv(Duration::from_millis(100)).unwrap() {
            if let Some(v) = pick(&response) {
                return v;
            }
        }
    }
    panic!("no such binary answer in time");
}

/// Sends a Day limit buy and returns its acknowledgement's order id, or the reject reason.
fn binary_buy(b: &mut BinaryClient, cl: u64, instrument: u32, price: i64) -> Result<u64, u16> {
    b.new_order(
        cl,
        1,
        instrument,
        true,
        1,
        Some(price),
        bourse_wire::order_entry::codec::time_in_force::TimeInForce::Day,
    )
    .unwrap();
    binary_wait(b, |r| match *r {
        Response::NewOrderAck {
            cl_ord_id,
            order_id,
            ..
        } if cl_ord_id == cl => Some(Ok(order_id)),
        Response::OrderReject { cl_ord_id, reason } if cl_ord_id == cl => Some(Err(reason)),
        _ => None,
    })
}

/// The ExecType (150) of the next execution report for `cl_ord_id` that is one of `wanted`.
fn fix_reports_until(f: &mut FixClient, cl_ord_id: &str, wanted: &[&str]) -> String {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let Some(m) = f.recv_type("8", Duration::from_millis(200)).unwrap() else {
            continue;
        };
        let exec_type = FixClient::field(&m, 150).unwrap_or("");
        if FixClient::field(&m, 11) == Some(cl_ord_id) && wanted.contains(&exec_type) {
            return exec_type.to_string();
        }
    }
    panic!("no execution report {wanted:?} for {cl_ord_id}");
}

#[test]
fn an_instrument_added_at_run_time_trades_over_fix_and_binary_and_is_published() {
    let dir = tempfile::tempdir().unwrap();
    let spec = DeploymentSpec {
        markets: vec![
            market("equities", equity(SBER, "SBER", 10_000)),
            market("futures", future(SI, "SI", 100_000)),
        ],
        backend: Backend::Cluster,
        protocol: SessionProtocol::Binary,
        gateways: 1,
        worker_sessions: vec![vec![vec![1, 2]]],
        data_dir: dir.path().join("venue"),
        orders_max: 10_000,
        accounts_max: 10_000,
        fsync: bourse_cluster::FsyncSetting::Never,
        market_data: true,
        monitor: None,
        extra_fix_sessions: vec![("OPS".into(), vec![1, 2])],
        verbose: false,
        core_in_flight_max: None,
        bounds: None,
    };
    let mut deployment = LocalDeployment::start(spec).expect("venue starts");
    let entry = CredentialEntry {
        name: "alice".into(),
        password_hash: hash_password_with("alice-pw", HashCost::TEST_ONLY).unwrap(),
        roles: vec!["operator".into()],
    };
    let store = Arc::new(CredentialStore::from_entries(&[entry]).unwrap());
    let (_, admin) = deployment
        .start_admin(
            store,
            &dir.path().join("audit.jsonl"),
            "127.0.0.1:0".parse().unwrap(),
            None,
        )
        .expect("admin starts");
    let ops = AdminClient::new(&admin.url())
        .unwrap()
        .with_credentials("alice", "alice-pw");

    // The futures core's ITCH feed, configured with SI only, from the stream's start.
    let futures_nodes = deployment
        .node_addrs()
        .into_iter()
        .find(|(name, _)| name == "futures")
        .unwrap()
        .1;
    let itch_socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let itch = ItchService::start(ServiceConfig {
        nodes: futures_nodes.clone(),
        from_position: 0,
        serve: ServeConfig {
            session: bourse_itch::mold::session_of("OPS").unwrap(),
            dest: itch_socket.local_addr().unwrap(),
            request_listen: "127.0.0.1:0".parse().unwrap(),
            limits: bourse_itch::feed::FeedLimits::default(),
            heartbeat_ms: 50,
            default_price_scale: 4,
        },
        instruments: vec![future(SI, "SI", 100_000)],
        entries_max: None,
    })
    .expect("ITCH feed starts");
    let itch_server = itch.request_addr();
    let itch_consumer = std::thread::spawn(move || {
        let limits = ConsumerLimits {
            deadline_ms: 60_000,
            ..ConsumerLimits::default()
        };
        run_consumer(&itch_socket, itch_server, limits, |_, _| true)
    });

    // Before the addition the gateway knows no instrument 3.
    let binary_addr: SocketAddr = deployment.gateways()[0].binary_addr().unwrap();
    let mut bin = BinaryClient::connect(binary_addr, "W0S0", 30_000, 1).expect("establish");
    assert!(binary_buy(&mut bin, 1, RTS, 110_000).is_err());

    let rts = future(RTS, "RTS", 110_000);
    let r = ops
        .action(
            "add-rts",
            &json!({"action": "add_instrument", "market": "futures", "instrument": rts}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);

    // FIX sells by symbol, binary buys by id: they trade. The gateway learns the instrument
    // from the stream its link reads, which may come a little after the admin's answer, so
    // the first FIX order is retried until it is no longer refused as unknown.
    let fix_addr = deployment.gateways()[0].fix_addr().unwrap();
    let mut fix = FixClient::connect(&FixClientConfig::new(fix_addr, "OPS", "BOURSE")).unwrap();
    let deadline = Instant::now() + WAIT;
    let mut attempt = 0;
    let sell = loop {
        attempt += 1;
        let cl = format!("S{attempt}");
        fix.new_order(&cl, Some(2), "RTS", false, 1, Some("110000"), '0')
            .unwrap();
        match fix_reports_until(&mut fix, &cl, &["0", "8"]).as_str() {
            "0" => break cl,
            _ => {
                assert!(Instant::now() < deadline, "RTS never routable over FIX");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let bought = binary_buy(&mut bin, 2, RTS, 110_000).expect("binary buy accepted");
    let (px, qty) = binary_wait(&mut bin, |r| match *r {
        Response::Execution {
            order_id,
            last_px,
            last_qty,
            ..
        } if order_id == bought => Some((last_px, last_qty)),
        _ => None,
    });
    assert_eq!((px, qty), (110_000, 1));
    assert_eq!(fix_reports_until(&mut fix, &sell, &["F"]), "F");

    // Market data: the futures core's instruments channel defines RTS.
    let md_base = deployment
        .md_ports()
        .into_iter()
        .find(|(name, _)| name == "futures")
        .and_then(|(_, p)| p)
        .unwrap();
    let mut md = UdpSubscriber::bind(
        &FeedAddrs::localhost(md_base),
        &[Channel::Instruments],
        SubscriberConfig::default(),
        false,
    )
    .unwrap();
    let deadline = Instant::now() + WAIT;
    while md.sub.by_symbol("RTS").is_none() {
        assert!(
            Instant::now() < deadline,
            "RTS never defined on market data"
        );
        if md.poll_once(&mut |_, _, _, _| {}) == 0 {
            let _ = md.wait_readable(50);
        }
    }
    let view = md.sub.by_symbol("RTS").unwrap();
    assert_eq!((view.id, view.tick), (RTS, 10));

    // ITCH: once the feed has followed the stream past the trade, it ends its session; its
    // consumer saw RTS's stock directory and the trade's execution.
    let rt = deployment.runtime_handle().unwrap();
    let applied = rt
        .block_on(bourse_cluster::client::node_status(futures_nodes[0], WAIT))
        .unwrap()
        .last_applied_index
        .expect("the node applied the trade");
    let deadline = Instant::now() + WAIT;
    while itch.report().0 <= applied {
        assert!(
            Instant::now() < deadline,
            "ITCH behind: {:?}",
            itch.report()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    itch.stop().unwrap();
    let (consumer, _) = itch_consumer.join().unwrap().unwrap();
    let stocks: Vec<[u8; 8]> = consumer.stocks().values().map(|s| s.stock).collect();
    assert!(stocks.contains(b"RTS     "), "{stocks:?}");
    deployment.stop();
}

/// Starts a gateway in front of the futures core (`nodes`) as `bourse gateway` does: its
/// links take this run's client id and resume where its saved order state (if any) is exact.
/// A FIX session (CRASH, account 2) and a binary one (CBIN, account 1); SI only configured.
fn start_own_gateway(
    nodes: &[SocketAddr],
    store: &std::path::Path,
) -> bourse_gateway::GatewayHandle {
    use bourse_cluster::link::{ClusterLink, ClusterLinkConfig};
    use bourse_gateway::config::{BinarySessionConfig, CoreEntry, FixSessionConfig};
    use bourse_gateway::{recovery::Recovery, CoreLink, GatewayConfig};
    let mut config = GatewayConfig::from_toml(
        "[gateway]\nbinary_listen = \"127.0.0.1:0\"\nfix_listen = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    config.gateway.store_dir = store.to_path_buf();
    config.instruments = vec![future(SI, "SI", 100_000)];
    config.cores = vec![CoreEntry {
        name: "futures".into(),
        instruments: vec![InstrumentId(SI)],
        in_process: false,
        nodes: nodes.to_vec(),
        client_id: Some(50),
        bootstrap: Some(false),
        tls: None,
    }];
    config.fix_sessions.push(FixSessionConfig {
        client_comp_id: "CRASH".into(),
        gateway_comp_id: "BOURSE".into(),
        firm: FirmId(2),
        accounts: vec![AccountId(2)],
        drop_copy: false,
        throttle_msgs_per_s: None,
        allowed_addresses: Vec::new(),
        allowed_sources: Vec::new(),
        password_hash: None,
        tls_required: false,
    });
    config.binary_sessions.push(BinarySessionConfig {
        credentials: "CBIN".into(),
        firm: FirmId(1),
        accounts: vec![AccountId(1)],
        throttle_msgs_per_s: None,
        allowed_addresses: Vec::new(),
        allowed_sources: Vec::new(),
        password_hash: None,
        tls_required: false,
    });
    config.validate().unwrap();
    let recovery = Recovery::open(&config).unwrap();
    let link = ClusterLink::start(ClusterLinkConfig {
        from_index: recovery.resume_index(0),
        ..ClusterLinkConfig::new(
            nodes.to_vec(),
            recovery.link_client_id(50),
            config.gateway.core_queue_depth,
        )
    })
    .unwrap();
    let links: Vec<Box<dyn CoreLink>> = vec![Box::new(link)];
    bourse_gateway::spawn_cores(config, links, None).unwrap()
}

#[test]
fn a_gateway_that_crashed_learns_an_instrument_added_at_run_time_from_its_core() {
    let dir = tempfile::tempdir().unwrap();
    let spec = DeploymentSpec {
        markets: vec![
            market("equities", equity(SBER, "SBER", 10_000)),
            market("futures", future(SI, "SI", 100_000)),
        ],
        backend: Backend::Cluster,
        protocol: SessionProtocol::Binary,
        gateways: 1,
        worker_sessions: vec![vec![vec![1, 2]]],
        data_dir: dir.path().join("venue"),
        orders_max: 10_000,
        accounts_max: 10_000,
        fsync: bourse_cluster::FsyncSetting::Never,
        market_data: false,
        monitor: None,
        extra_fix_sessions: Vec::new(),
        verbose: false,
        core_in_flight_max: None,
        bounds: None,
    };
    let mut deployment = LocalDeployment::start(spec).expect("venue starts");
    let entry = CredentialEntry {
        name: "alice".into(),
        password_hash: hash_password_with("alice-pw", HashCost::TEST_ONLY).unwrap(),
        roles: vec!["operator".into()],
    };
    let store = Arc::new(CredentialStore::from_entries(&[entry]).unwrap());
    let (_, admin) = deployment
        .start_admin(
            store,
            &dir.path().join("audit.jsonl"),
            "127.0.0.1:0".parse().unwrap(),
            None,
        )
        .expect("admin starts");
    let ops = AdminClient::new(&admin.url())
        .unwrap()
        .with_credentials("alice", "alice-pw");
    let futures_nodes = deployment
        .node_addrs()
        .into_iter()
        .find(|(name, _)| name == "futures")
        .unwrap()
        .1;
    let gateway_store = dir.path().join("own-gateway");
    let gateway = start_own_gateway(&futures_nodes, &gateway_store);

    // The operator adds RTS while the gateway runs; the admin answers once it committed.
    let rts = future(RTS, "RTS", 110_000);
    let r = ops
        .action(
            "add-rts",
            &json!({"action": "add_instrument", "market": "futures", "instrument": rts}),
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);

    // The gateway crashes: whatever it saved is gone. Started again, its link's stream
    // starts after the leader's last applied entry, past RTS's addition, so only the core's
    // answer to the link's instruments query can teach it RTS.
    gateway.shutdown();
    std::fs::remove_dir_all(&gateway_store).unwrap();
    let gateway = start_own_gateway(&futures_nodes, &gateway_store);

    // FIX by symbol: accepted at the first attempt (the gateway learned RTS before serving).
    let fix_addr = gateway.fix_addr().unwrap();
    let mut fix = FixClient::connect(&FixClientConfig::new(fix_addr, "CRASH", "BOURSE")).unwrap();
    fix.new_order("C1", Some(2), "RTS", false, 1, Some("110000"), '0')
        .unwrap();
    assert_eq!(fix_reports_until(&mut fix, "C1", &["0", "8"]), "0");
    // Binary by id: the buy trades against it.
    let mut bin = BinaryClient::connect(gateway.binary_addr().unwrap(), "CBIN", 30_000, 1)
        .expect("establish");
    let bought = binary_buy(&mut bin, 1, RTS, 110_000).expect("binary buy accepted");
    let (px, qty) = binary_wait(&mut bin, |r| match *r {
        Response::Execution {
            order_id,
            last_px,
            last_qty,
            ..
        } if order_id == bought => Some((last_px, last_qty)),
        _ => None,
    });
    assert_eq!((px, qty), (110_000, 1));
    assert_eq!(fix_reports_until(&mut fix, "C1", &["F"]), "F");
    drop((fix, bin));
    gateway.shutdown();
    deployment.stop();
}
