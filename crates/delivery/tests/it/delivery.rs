//! A delivery node over real replicated cores: no gap and no reordering for a client across
//! a core failover and a delivery-node crash and restart (checked against the cores' own
//! event logs), filters exact, a core that stops does not stall the merged cursor, a thousand
//! clients at once (half on each front), and bad input answered with a clear error on both the
//! HTTP and the binary front. The binary front answers the same records for the same cursor.
//! A client that fell behind the memory reads on from the cold data on disk, also after a
//! restart.

use crate::common;

use std::time::Duration;

use bourse_core::{AccountId, FirmId, InstrumentId};
use bourse_delivery::{
    AnyClient, ClientError, DeliveryClient, DeliveryConfig, Filter, Follow, PollRequest,
};
use bourse_wire::delivery::codec::error_code::ErrorCode;
use bourse_wire::delivery::{DecodedFrame as Decoded, FrameDecoder, Message};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_no_gap_and_no_reordering_across_a_core_failover_and_a_delivery_restart() {
    let mut a = Core::start(0, 11).await;
    let mut b = Core::start(1, 12).await;
    let state = tempfile::tempdir().unwrap();
    let config = delivery_config(&[&a, &b], Some(state.path().to_path_buf()));
    let node = start_delivery(config.clone()).await;
    // One client reads through both fronts in turn with the same cursor: they answer the
    // same records, and a cursor of one is good on the other.
    let mut client = AnyClient::http(node.addr());
    let mut binary = AnyClient::binary(node.binary_addr().unwrap());
    let mut got = Received::default();
    let all = Filter::default();

    a.run(400).await;
    b.run(400).await;
    got.poll(&mut client, all, 37).await;
    got.poll(&mut binary, all, 37).await;

    // Core A loses its leader; its stream is read from another node from the same index.
    a.kill_leader().await;
    a.run(400).await;
    b.run(200).await;
    got.poll(&mut binary, all, 37).await;
    got.poll(&mut client, all, 37).await;

    // The delivery node crashes (no final write of its state): it restarts from its last
    // periodic write, rebuilds the rest from the streams, and the client's cursor holds.
    stop_delivery(node, true).await;
    a.run(300).await;
    let node = start_delivery(config.clone()).await;
    let mut binary = AnyClient::binary(node.binary_addr().unwrap());
    b.run(300).await;
    let ends = [a.end_index().await, b.end_index().await];
    caught_up(&node, &ends).await;
    got.poll(&mut binary, all, 37).await;
    got.drain(&mut client, all, 37).await;
    assert!(got.answers > 10);

    for core in [&a, &b] {
        let log = core.event_log(ends[core.id as usize]).await;
        check_against_log(&got.records, core.id, &log, &all);
    }
    // A client starting now from no cursor reads the same picture (a snapshot), on either
    // front.
    for mut fresh_client in [
        AnyClient::http(node.addr()),
        AnyClient::binary(node.binary_addr().unwrap()),
    ] {
        let mut fresh = Received::default();
        fresh.drain(&mut fresh_client, all, 1000).await;
        for core in [&a, &b] {
            let log = core.event_log(ends[core.id as usize]).await;
            check_against_log(&fresh.records, core.id, &log, &all);
        }
    }
    stop_delivery(node, false).await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_are_exact_and_a_stopped_core_does_not_stall_the_cursor() {
    let mut a = Core::start(0, 21).await;
    let mut b = Core::start(1, 22).await;
    a.run(300).await;
    b.run(300).await;
    let node = start_delivery(delivery_config(&[&a, &b], None)).await;
    let mut client = AnyClient::http(node.addr());
    let mut binary = AnyClient::binary(node.binary_addr().unwrap());
    let ends = [a.end_index().await, b.end_index().await];
    caught_up(&node, &ends).await;
    let mut plain = Received::default();
    plain.drain(&mut client, Filter::default(), 100).await;

    // Core B stops altogether; core A goes on and its records still come.
    let b_end = ends[1];
    b.stop().await;
    a.run(300).await;
    let a_end = a.end_index().await;
    caught_up(&node, &[a_end, b_end]).await;
    plain.drain(&mut client, Filter::default(), 100).await;
    let log_a = a.event_log(a_end).await;
    check_against_log(&plain.records, 0, &log_a, &Filter::default());
    // The merged cursor moved on with core A while core B's part stayed where B stopped.
    // (A core commits entries of its own too, hash checks say, so the indexes read from a
    // node's status are lower bounds: compare with at least, never exactly.)
    let status = DeliveryClient::new(node.addr()).status().await.unwrap();
    let applied = |core: usize| status["cores"][core]["applied_index"].as_u64().unwrap();
    assert!(applied(0) >= a_end && applied(1) >= b_end, "{status}");

    let filters = [
        Filter {
            firm: Some(FirmId(2)),
            ..Filter::default()
        },
        Filter {
            account: Some(AccountId(1005)),
            ..Filter::default()
        },
        Filter {
            instrument: Some(InstrumentId(1)),
            firm: Some(FirmId(1)),
            ..Filter::default()
        },
    ];
    for f in filters {
        for front in [&mut client, &mut binary] {
            let mut got = Received::default();
            got.drain(front, f, 9).await;
            check_against_log(&got.records, 0, &log_a, &f);
        }
    }
    // The node's figures at /metrics agree with its status: every record sent counted once,
    // and its lag observed once; the binary reader's connection is open.
    let mut http = DeliveryClient::new(node.addr());
    let status = http.status().await.unwrap();
    let (code, body) = http.get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    let text = String::from_utf8(body).unwrap();
    let value = |series: &str| -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("{series} not in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let sent = status["rows_sent"].as_u64().unwrap();
    assert!(sent > 0);
    assert_eq!(value("bourse_delivery_records_sent_total"), sent);
    assert_eq!(value("bourse_delivery_lag_seconds_count"), sent);
    assert_eq!(
        value("bourse_delivery_records_written_total"),
        status["records_written"].as_u64().unwrap()
    );
    assert_eq!(
        value("bourse_listener_connections_open{listener=\"delivery_binary\"}"),
        1
    );
    stop_delivery(node, false).await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_polling_at_once_each_get_everything() {
    let clients: usize = std::env::var("BOURSE_DELIVERY_TEST_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let mut a = Core::start(0, 31).await;
    let node = start_delivery(delivery_config(&[&a], None)).await;
    let (addr, binary_addr) = (node.addr(), node.binary_addr().unwrap());
    // The clients poll while the core runs (long polls wake on each write), half of them
    // through each front.
    let mut tasks = Vec::new();
    for i in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut client = if i % 2 == 0 {
                AnyClient::http(addr)
            } else {
                AnyClient::binary(binary_addr)
            };
            let mut got = Received::default();
            let filter = if i % 5 == 0 {
                Filter::default()
            } else {
                Filter {
                    firm: Some(FirmId(1 + (i % 3) as u32)),
                    ..Filter::default()
                }
            };
            got.poll(&mut client, filter, 500).await;
            (got, client, filter)
        }));
    }
    a.run(300).await;
    let end = a.end_index().await;
    caught_up(&node, &[end]).await;
    let log = a.event_log(end).await;
    for t in tasks {
        let (mut got, mut client, filter) = t.await.unwrap();
        got.drain(&mut client, filter, 500).await;
        check_against_log(&got.records, 0, &log, &filter);
    }
    stop_delivery(node, false).await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_disturbs_nothing() {
    let mut a = Core::start(0, 41).await;
    a.run(100).await;
    let config = delivery_config(&[&a], None);
    let node = start_delivery(config.clone()).await;
    caught_up(&node, &[a.end_index().await]).await;
    let mut client = DeliveryClient::new(node.addr());
    let mut good_client = AnyClient::http(node.addr());
    let mut good = Received::default();
    good.poll(&mut good_client, Filter::default(), 10).await;
    let cursor = good.cursor.clone().unwrap();

    let foreign = {
        let mut other = config.clone();
        other.name = "another-venue".into();
        other.listen = format!("127.0.0.1:{}", bourse_testkit::free_port())
            .parse()
            .unwrap();
        let n = start_delivery(other).await;
        let mut c = AnyClient::http(n.addr());
        let mut r = Received::default();
        r.poll(&mut c, Filter::default(), 1).await;
        stop_delivery(n, false).await;
        r.cursor.unwrap()
    };
    let cases: Vec<(String, u16, &str, &str)> = vec![
        (
            "/v1/orders?cursor=zz".into(),
            400,
            "cursor_malformed",
            "not lowercase hex",
        ),
        (
            format!("/v1/orders?cursor={}", &cursor[..cursor.len() - 2]),
            400,
            "cursor_malformed",
            "checksum",
        ),
        (
            format!("/v1/orders?cursor={foreign}"),
            409,
            "cursor_foreign",
            "another delivery deployment",
        ),
        (
            "/v1/orders?colour=red".into(),
            400,
            "bad_request",
            "unknown field `colour`",
        ),
        (
            "/v1/orders?limit=0".into(),
            400,
            "bad_request",
            "limit 0 is outside",
        ),
        (
            "/v1/orders?limit=100000000".into(),
            400,
            "bad_request",
            "limit 100000000 is outside",
        ),
        ("/v1/orders?limit=ten".into(), 400, "bad_request", "limit"),
        (
            "/v1/orders?wait_us=99999999999".into(),
            400,
            "bad_request",
            "wait_us",
        ),
        (
            "/v1/orders?limit=5&min_rows=6".into(),
            400,
            "bad_request",
            "min_rows 6 is above limit 5",
        ),
        ("/v1/orders?firm=-1".into(), 400, "bad_request", "firm"),
        ("/v2/orders".into(), 404, "not_found", "GET /v1/orders"),
    ];
    for (path, status, code, says) in cases {
        let (got_status, body) = client.get(&path).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(got_status, status, "{path}: {body}");
        assert_eq!(body["error"]["code"], code, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{path}: {message}");
    }
    // The binary front refuses the same things with the same statuses and codes, and its
    // connection stays usable after a refused poll.
    let binary_addr = node.binary_addr().unwrap();
    let mut bin = bourse_delivery::BinaryClient::new(binary_addr);
    let request = |cursor: Option<&str>, limit: usize, min_rows: usize| PollRequest {
        cursor: cursor.map(str::to_string),
        filter: Filter::default(),
        limit: Some(limit),
        wait_us: Some(0),
        min_rows: Some(min_rows),
        since_ns: None,
    };
    let bin_cases = [
        (
            request(Some(&cursor[..cursor.len() - 2]), 10, 1),
            400,
            "cursor_malformed",
            "checksum",
        ),
        (
            request(Some(&foreign), 10, 1),
            409,
            "cursor_foreign",
            "another delivery deployment",
        ),
        (
            request(None, 100_000_000, 1),
            400,
            "bad_request",
            "limit 100000000 is outside",
        ),
        (
            request(None, 5, 6),
            400,
            "bad_request",
            "min_rows 6 is above limit 5",
        ),
    ];
    for (req, status, code, says) in bin_cases {
        match bin.poll(&req).await {
            Err(ClientError::Api { status: s, error }) => {
                assert_eq!((s, error.code.as_str()), (status, code), "{req:?}");
                assert!(error.message.contains(says), "{req:?}: {}", error.message);
            }
            other => panic!("{req:?}: {other:?}"),
        }
        let ok = bin.poll(&request(Some(&cursor), 1, 1)).await.unwrap();
        assert_eq!(ok.header.count, 1);
    }
    // Bytes that are not a frame get one error frame and the connection is closed; a
    // half-sent frame and a crowd of idle connections disturb no one.
    let mut garbage = tokio::net::TcpStream::connect(binary_addr).await.unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    garbage.read_to_end(&mut answer).await.unwrap();
    match FrameDecoder::default().decode(&answer).unwrap().unwrap() {
        Decoded {
            message: Message::DeliveryError(mut e),
            frame_bytes,
        } => {
            assert_eq!(frame_bytes, answer.len(), "one frame, then the close");
            assert_eq!(e.code(), ErrorCode::BadRequest);
            let at = e.message_decoder();
            let text = String::from_utf8_lossy(e.message_slice(at)).into_owned();
            assert!(text.contains("not a delivery frame"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    let idle_connections: usize = std::env::var("BOURSE_DELIVERY_TEST_IDLE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let mut idle = Vec::with_capacity(idle_connections);
    for i in 0..idle_connections {
        let mut c = tokio::net::TcpStream::connect(binary_addr).await.unwrap();
        if i % 2 == 0 {
            // The first half of a frame header, and nothing more.
            c.write_all(&[40, 0]).await.unwrap();
        }
        idle.push(c);
    }
    let ok = bin.poll(&request(Some(&cursor), 5, 1)).await.unwrap();
    assert_eq!(ok.header.count, 5);
    drop(idle);

    // A poll that waits for more than there is answers after its wait, with what there is.
    let (status, _) = client
        .get(&format!(
            "/v1/orders?cursor={cursor}&limit=10000&min_rows=10000&wait_us=1000"
        ))
        .await
        .unwrap();
    assert_eq!(status, 200);
    // Nothing was disturbed: the good client goes on where it was.
    a.run(50).await;
    let end = a.end_index().await;
    caught_up(&node, &[end]).await;
    good.drain(&mut good_client, Filter::default(), 10).await;
    check_against_log(
        &good.records,
        0,
        &a.event_log(end).await,
        &Filter::default(),
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    stop_delivery(node, false).await;
    a.stop().await;
}

/// Whether the connection was closed without a byte (refused on accept) after `bytes` were
/// sent, as opposed to answered.
async fn closed_unanswered(mut s: tokio::net::TcpStream, bytes: &[u8]) -> bool {
    let _ = s.write_all(bytes).await;
    let mut buf = [0u8; 256];
    match tokio::time::timeout(Duration::from_secs(60), s.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => false,
        Err(_) => panic!("neither answered nor closed"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection_of_a_front() {
    let mut a = Core::start(0, 51).await;
    a.run(10).await;
    let mut config = delivery_config(&[&a], None);
    config.limits.connections_per_address_max = 3;
    let node = start_delivery(config).await;
    let binary_addr = node.binary_addr().unwrap();
    let poll = PollRequest {
        cursor: None,
        filter: Filter::default(),
        limit: Some(10),
        wait_us: Some(0),
        min_rows: Some(0),
        since_ns: None,
    };
    // Three readers from 127.0.0.1 hold their connections open.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = AnyClient::binary(binary_addr);
        c.poll(&poll).await.expect("within the address's share");
        held.push(c);
    }
    // A fourth from the same address is let in, and the address's own connection that has
    // waited longest for its next request makes room: the address never holds more than three.
    let fourth = tokio::net::TcpStream::connect(binary_addr).await.unwrap();
    assert!(!closed_unanswered(fourth, b"garbage").await);
    // Another address is still served: its garbage gets an error frame, not a bare close.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let other = socket.connect(binary_addr).await.unwrap();
    assert!(!closed_unanswered(other, b"garbage").await);

    let mut http = DeliveryClient::new(node.addr());
    let (_, body) = http.get("/metrics").await.unwrap();
    let text = String::from_utf8(body).unwrap();
    let refused =
        "bourse_listener_refusals_total{listener=\"delivery_binary\",reason=\"address_share\"} 1";
    assert!(text.contains(refused), "{text}");

    // A reader that leaves gives its place back.
    drop(held.pop());
    // The server learns of the close asynchronously: wait for it (the deadline only guards
    // against a hang; the assertion is that the slot comes back at all).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut again = AnyClient::binary(binary_addr);
        if again.poll(&poll).await.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a slot came back once a reader left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop_delivery(node, false).await;
    a.stop().await;
}

/// A replica's config: it follows `primary`'s binary front for the cores given.
fn replica_config(primary: &bourse_delivery::DeliveryNode, cores: Vec<u32>) -> DeliveryConfig {
    DeliveryConfig {
        name: "test-venue".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        binary_listen: Some("127.0.0.1:0".parse().unwrap()),
        state_dir: None,
        persist_interval_ms: 1_000,
        threads: 2,
        cores: Vec::new(),
        follow: Some(Follow {
            primary: primary.binary_addr().unwrap(),
            cores,
            secondary_indexes: false,
            login: None,
            tls: None,
        }),
        cold: None,
        limits: bourse_delivery::Limits::default(),
        access: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_replica_answers_a_primarys_cursor_with_no_gap_and_refuses_filters() {
    let mut a = Core::start(0, 41).await;
    let mut b = Core::start(1, 42).await;
    a.run(300).await;
    b.run(300).await;
    let primary = start_delivery(delivery_config(&[&a, &b], None)).await;
    let replica = start_delivery(replica_config(&primary, vec![0, 1])).await;
    let all = Filter::default();

    // A client reads part of the picture on the primary, then goes on with the same cursor
    // on the replica, through both of its fronts, while both cores keep trading.
    let mut got = Received::default();
    got.poll(&mut AnyClient::http(primary.addr()), all, 50)
        .await;
    a.run(300).await;
    b.run(200).await;
    let ends = [a.end_index().await, b.end_index().await];
    caught_up(&primary, &ends).await;
    caught_up(&replica, &ends).await;
    let mut on_replica = AnyClient::binary(replica.binary_addr().unwrap());
    got.poll(&mut on_replica, all, 40).await;
    got.drain(&mut AnyClient::http(replica.addr()), all, 40)
        .await;
    for core in [&a, &b] {
        let log = core.event_log(ends[core.id as usize]).await;
        check_against_log(&got.records, core.id, &log, &all);
    }
    // A fresh client reads the same picture on either node.
    let mut from_primary = Received::default();
    from_primary
        .drain(&mut AnyClient::http(primary.addr()), all, 1000)
        .await;
    let mut from_replica = Received::default();
    from_replica
        .drain(&mut AnyClient::http(replica.addr()), all, 1000)
        .await;
    assert_eq!(from_primary.records, from_replica.records);

    // Filtered polls go to the primary: the replica refuses them by name on both fronts.
    let firm = Filter {
        firm: Some(FirmId(1)),
        ..Filter::default()
    };
    for mut front in [
        AnyClient::http(replica.addr()),
        AnyClient::binary(replica.binary_addr().unwrap()),
    ] {
        let req = PollRequest {
            filter: firm,
            ..PollRequest::default()
        };
        match front.poll(&req).await {
            Err(ClientError::Api { status, error }) => {
                assert_eq!((status, error.code.as_str()), (400, "filter_not_served"));
                assert!(error.message.contains("primary"), "{}", error.message);
            }
            other => panic!("a filtered poll at a replica: {other:?}"),
        }
    }
    let status = DeliveryClient::new(replica.addr()).status().await.unwrap();
    assert_eq!(status["role"], "replica", "{status}");
    assert_eq!(status["ready"], true, "{status}");
    stop_delivery(replica, false).await;

    // A replica whose primary is down has read nothing: it refuses every poll as catching
    // up, on both fronts, rather than answering an empty picture.
    let stopped_primary = replica_config(&primary, vec![0, 1]);
    stop_delivery(primary, false).await;
    let replica = start_delivery(stopped_primary).await;
    for mut front in [
        AnyClient::http(replica.addr()),
        AnyClient::binary(replica.binary_addr().unwrap()),
    ] {
        match front.poll(&PollRequest::default()).await {
            Err(ClientError::Api { status, error }) => {
                assert_eq!((status, error.code.as_str()), (503, "catching_up"));
            }
            other => panic!("a poll at a replica that read nothing: {other:?}"),
        }
    }
    stop_delivery(replica, false).await;
    a.stop().await;
    b.stop().await;
}

#[test]
fn a_replica_configuration_names_what_is_wrong() {
    let base = DeliveryConfig {
        name: "x".into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        binary_listen: None,
        state_dir: None,
        persist_interval_ms: 1_000,
        threads: 2,
        cores: Vec::new(),
        follow: Some(Follow {
            primary: "127.0.0.1:1".parse().unwrap(),
            cores: vec![0, 1],
            secondary_indexes: false,
            login: None,
            tls: None,
        }),
        cold: None,
        limits: bourse_delivery::Limits::default(),
        access: Default::default(),
    };
    assert!(base.validate().is_ok());
    let with_state = DeliveryConfig {
        state_dir: Some("/tmp/x".into()),
        ..base.clone()
    };
    assert!(with_state.validate().unwrap_err().contains("state_dir"));
    let twice = DeliveryConfig {
        follow: Some(Follow {
            cores: vec![1, 1],
            ..base.follow.clone().unwrap()
        }),
        ..base.clone()
    };
    assert!(twice.validate().unwrap_err().contains("twice"));
}

/// A node that keeps cold data: its evicted records on disk (`[cold]`).
fn cold_config(core: &Core, state_dir: std::path::PathBuf) -> DeliveryConfig {
    let mut c = delivery_config(&[core], Some(state_dir));
    c.limits.records_per_core_max = 64;
    c.cold = Some(bourse_delivery::cold::ColdConfig {
        segment_bytes: 64 << 10,
        ..Default::default()
    });
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_fell_behind_the_memory_reads_on_from_cold_data_with_no_gap() {
    let mut a = Core::start(0, 61).await;
    a.run(100).await;
    let state = tempfile::tempdir().unwrap();
    let config = cold_config(&a, state.path().to_path_buf());
    let node = start_delivery(config.clone()).await;
    caught_up(&node, &[a.end_index().await]).await;
    let mut http = AnyClient::http(node.addr());
    let mut reader = Received::default();
    reader.drain(&mut http, Filter::default(), 100).await;
    let behind = reader.clone();

    // The reader pauses while the core goes on far past the memory's bound.
    a.run(1_500).await;
    let end = a.end_index().await;
    caught_up(&node, &[end]).await;
    let status = DeliveryClient::new(node.addr()).status().await.unwrap();
    let cold = &status["cores"][0]["cold"];
    assert!(cold["records_written"].as_u64().unwrap() > 64, "{status}");
    let log = a.event_log(end).await;

    // It reads on over the binary front, from disk then memory: the whole picture, no gap.
    let mut binary = AnyClient::binary(node.binary_addr().unwrap());
    reader.drain(&mut binary, Filter::default(), 50).await;
    check_against_log(&reader.records, 0, &log, &Filter::default());

    // A read from a time, over HTTP: it starts at the first record of that time or later.
    let mid = log.values().nth(log.len() / 3).unwrap();
    let answer = DeliveryClient::new(node.addr())
        .poll(&PollRequest {
            since_ns: Some(mid.ts_ns()),
            limit: Some(10),
            ..Default::default()
        })
        .await
        .unwrap();
    // The store keeps each order's latest state only: the first record of that time or
    // later that nothing replaced.
    let mut latest = std::collections::BTreeMap::new();
    for r in log.values() {
        if let bourse_core::Event::OrderLog(l) = r.event {
            latest.insert(l.order_id, r.pos());
        }
    }
    let kept = |r: &&bourse_delivery::Record| match r.event {
        bourse_core::Event::OrderLog(l) => latest[&l.order_id] == r.pos(),
        _ => true,
    };
    let first = log
        .values()
        .filter(kept)
        .find(|r| r.ts_ns() >= mid.ts_ns())
        .unwrap();
    assert_eq!(answer.records[0].pos(), first.pos());
    assert!(answer.records.iter().all(|r| log.get(&r.pos()) == Some(r)));

    // Restarted, the node answers the paused reader's cursor the same from its files.
    stop_delivery(node, false).await;
    let node = start_delivery(config).await;
    let mut again = behind;
    let mut binary = AnyClient::binary(node.binary_addr().unwrap());
    again.drain(&mut binary, Filter::default(), 70).await;
    check_against_log(&again.records, 0, &log, &Filter::default());
    stop_delivery(node, false).await;
    a.stop().await;
}

/// Polls until one is refused; the refusal's status, code and message.
macro_rules! until_refused {
    ($client:expr, $req:expr) => {{
        let mut refused = None;
        for _ in 0..100_000 {
            match $client.poll($req).await {
                Ok(_) => {}
                Err(ClientError::Api { status, error }) => {
                    refused = Some((status, format!("{} {}", error.code, error.message)));
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        refused.expect("never refused")
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_polls_too_often_is_refused_and_no_other_is() {
    let mut a = Core::start(0, 71).await;
    a.run(20).await;
    let mut config = delivery_config(&[&a], None);
    config.limits.polls_per_second_per_connection_max = 1;
    let node = start_delivery(config).await;
    caught_up(&node, &[a.end_index().await]).await;
    let quick = PollRequest {
        limit: Some(10),
        wait_us: Some(0),
        ..Default::default()
    };
    // Polls in a tight loop on one connection of each front: the first is answered, and
    // before long (at most a second later) one is refused with what to do. The bound on
    // attempts only keeps a broken limit from looping for ever.
    let mut http = DeliveryClient::new(node.addr());
    let mut binary = AnyClient::binary(node.binary_addr().unwrap());
    http.poll(&quick).await.unwrap();
    binary.poll(&quick).await.unwrap();
    let refused_http = until_refused!(http, &quick);
    let (status, body) = refused_http;
    assert_eq!(status, 429, "{body}");
    assert!(
        body.contains("rate_limited") && body.contains("retry in"),
        "{body}"
    );
    let refused_binary = until_refused!(binary, &quick);
    assert!(
        refused_binary.1.contains("times a second"),
        "{}",
        refused_binary.1
    );
    // Another connection from the same address has its own budget.
    let mut other = DeliveryClient::new(node.addr());
    other.poll(&quick).await.unwrap();
    let status = other.status().await.unwrap();
    assert!(
        status["polls_refused_rate"].as_u64().unwrap() >= 2,
        "{status}"
    );
    stop_delivery(node, false).await;
    a.stop().await;
}
