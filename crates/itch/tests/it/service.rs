//! The service end to end: a replica group of three nodes takes seeded order flow; the ITCH
//! service follows its committed stream and publishes over UDP; a consumer that loses every
//! fifth live packet ends, after the session ends, with the books that the same stream gives
//! through the in-process feed.

use bourse_cluster::client::PipelinedClient;
use bourse_cluster::tokio;
use bourse_cluster::{ClusterConfig, FsyncSetting, Node, StreamConsumer};
use bourse_core::{Command, Event};
use bourse_engine::workload::{Flow, FlowConfig};
use bourse_itch::consumer::Consumer;
use bourse_itch::feed::{Feed, FeedLimits};
use bourse_itch::mold::session_of;
use bourse_itch::net::{run_consumer, ConsumerLimits, ServeConfig};
use bourse_itch::service::{ItchService, ServiceConfig};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

type Books = Vec<(u16, Vec<(u64, bourse_core::Side, i64, i64)>)>;

fn books(c: &Consumer) -> Books {
    c.stocks()
        .iter()
        .map(|(l, s)| {
            let orders = s
                .book
                .orders()
                .map(|o| (o.order_id, o.side, o.price, o.qty))
                .collect();
            (*l, orders)
        })
        .collect()
}

#[test]
fn the_service_publishes_the_committed_stream_and_a_lossy_consumer_ends_complete() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        ClusterConfig::local(300, dir.path().to_path_buf(), bourse_testkit::free_ports());
    config.fsync = FsyncSetting::Never;
    config.orders_max = 8192;
    config.accounts_max = 1024;
    let nodes: Vec<Node> = rt.block_on(async {
        let mut v = Vec::new();
        for n in &config.nodes {
            v.push(Node::start(&config, n.id).await.expect("node starts"));
        }
        v
    });
    let addrs: Vec<SocketAddr> = config
        .nodes
        .iter()
        .map(|n| n.addr.parse().unwrap())
        .collect();
    let mut fc = FlowConfig::exchange_core(21);
    fc.accounts = 30;
    fc.live_orders_target = 60;
    let instruments = fc.instruments.clone();
    let mut flow = Flow::new(fc);

    let consumer_socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let serve = ServeConfig {
        session: session_of("SVC").unwrap(),
        dest: consumer_socket.local_addr().unwrap(),
        request_listen: "127.0.0.1:0".parse().unwrap(),
        limits: FeedLimits::default(),
        heartbeat_ms: 50,
        default_price_scale: 4,
    };
    let service = ItchService::start(ServiceConfig {
        nodes: addrs.clone(),
        from_position: 0,
        serve: serve.clone(),
        instruments: instruments.clone(),
        entries_max: None,
    })
    .unwrap();
    let server = service.request_addr();
    let consumer = std::thread::spawn(move || {
        let limits = ConsumerLimits {
            deadline_ms: 60_000,
            ..ConsumerLimits::default()
        };
        run_consumer(&consumer_socket, server, limits, |k, _| {
            k.is_none_or(|k| k % 5 != 0)
        })
    });

    // The flow, through the replica group; the last answer names the last entry.
    let last_index = rt.block_on(async {
        let ids = config
            .nodes
            .iter()
            .map(|n| (n.id, n.addr.parse().unwrap()))
            .collect();
        let mut client = PipelinedClient::start(ids, 1, 1, 256);
        let mut bodies = flow.setup();
        bodies.extend((0..1_500).map(|_| flow.next_command()));
        let mut last = 0;
        for (ts, body) in (1..).zip(bodies) {
            last = client.submit(&Command::new(ts, body)).await.unwrap();
        }
        loop {
            let a = tokio::time::timeout(LIMIT, client.next_answer())
                .await
                .expect("answers")
                .unwrap();
            if a.request_seq == last {
                return a.applied_index;
            }
        }
    });
    let deadline = Instant::now() + LIMIT;
    while service.report().0 <= last_index {
        assert!(
            Instant::now() < deadline,
            "the service follows the stream: {:?}",
            service.report()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = service.stop().unwrap();
    let (c, requests) = consumer.join().unwrap().unwrap();
    let s = c.stats();
    assert!(s.end_of_session && c.complete(), "{s:?} {report:?}");
    assert!(s.gaps_detected > 0 && requests > 0 && report.requests.messages_resent > 0);
    assert_eq!(
        s.book_errors + s.malformed_messages + s.malformed_packets,
        0,
        "{s:?}"
    );

    // The same stream through the in-process feed, without loss.
    let mut expected = Consumer::new(1 << 20);
    rt.block_on(async {
        let mut feed = Feed::new(serve.session, serve.limits, 4).unwrap();
        let mut packets = Vec::new();
        let mut send = |p: &[u8]| packets.push(p.to_vec());
        feed.start(0, &mut send);
        for d in &instruments {
            feed.define(d, 0, &mut send);
        }
        let mut stream = StreamConsumer::remote(addrs, 0);
        while stream.position() <= last_index {
            let e = tokio::time::timeout(LIMIT, stream.next())
                .await
                .expect("the stream")
                .unwrap();
            let events: Vec<Event> = e
                .requests()
                .filter(|r| r.applied_here())
                .flat_map(|r| r.events().map(|e| e.unwrap()).collect::<Vec<_>>())
                .collect();
            feed.publish(&events, &mut send);
        }
        for p in &packets {
            expected.on_datagram(p);
        }
    });
    let want = books(&expected);
    assert!(
        want.iter().map(|(_, o)| o.len()).sum::<usize>() > 10,
        "orders rest: {want:?}"
    );
    assert_eq!(books(&c), want);
    rt.block_on(async {
        for n in nodes {
            n.shutdown().await;
        }
    });
}
