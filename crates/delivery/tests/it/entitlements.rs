//! Per-firm entitlements (issue 37, item 1) and deployment identity and cursors from the
//! future (item 2): a firm's reader tries every route to another firm's records and never
//! gets one; credentials are checked once and refusals counted by reason; a fresh store's
//! cursors are another store's strangers; a cursor ahead of the node waits or is refused.

use crate::common::*;
use bourse_auth::{hash_password_with, CredentialEntry, HashCost};
use bourse_core::{AccountId, Event, FirmId};
use bourse_delivery::record::{WITHHELD_ACCOUNT, WITHHELD_CL_ORD_ID};
use bourse_delivery::{
    Access, AccessConfig, AnyClient, BinaryClient, ClientError, Cursor, DeliveryClient,
    DeliveryConfig, Filter, Follow, FollowLogin, PollRequest, Pos, Record, ServerTls,
};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const OURS: FirmId = FirmId(1);
const THEIRS: FirmId = FirmId(2);

fn entry(name: &str, password: &str, role: &str) -> CredentialEntry {
    CredentialEntry {
        name: name.into(),
        password_hash: hash_password_with(password, HashCost::TEST_ONLY).unwrap(),
        roles: vec![role.into()],
    }
}

fn readers() -> AccessConfig {
    AccessConfig {
        readers: vec![
            entry("viewer", "vpw", "viewer"),
            entry("ours", "opw", "firm:1"),
            entry("theirs", "tpw", "firm:2"),
            entry("nobody", "npw", "trader"),
        ],
        ..AccessConfig::default()
    }
}

fn login(name: &str, password: &str) -> Access {
    Access {
        tls: None,
        credentials: Some((name.into(), password.into())),
    }
}

/// Every record a reader of firm `OURS` got is its own: its orders and rejects, and trades
/// with it on a side, the other side withheld unless it is its own too.
fn all_ours(records: &[Record]) {
    for r in records {
        match &r.event {
            Event::Trade { buy, sell, .. } => {
                assert!(r.firms.contains(&Some(OURS)), "{r:?}");
                for (side, firm) in [buy, sell].into_iter().zip(r.firms) {
                    if firm != Some(OURS) {
                        assert_eq!(firm, None, "{r:?}");
                        assert_eq!(side.account, WITHHELD_ACCOUNT, "{r:?}");
                        assert_eq!(side.cl_ord_id, WITHHELD_CL_ORD_ID, "{r:?}");
                    }
                }
            }
            _ => assert_eq!(r.firms, [Some(OURS); 2], "{r:?}"),
        }
    }
}

fn positions(records: &[Record]) -> BTreeSet<(u32, Pos)> {
    records.iter().map(|r| (r.core, r.pos())).collect()
}

/// Reads everything from `cursor` on (none: a snapshot), asking with `filter`.
async fn read_all(client: &mut AnyClient, filter: Filter, cursor: Option<String>) -> Received {
    let mut got = Received {
        cursor,
        ..Received::default()
    };
    got.drain(client, filter, 500).await;
    got
}

fn refusal(e: ClientError) -> (u16, String) {
    match e {
        ClientError::Api { status, error } => (status, error.code),
        other => panic!("not a refusal: {other}"),
    }
}

async fn refused(client: &mut AnyClient, req: &PollRequest) -> (u16, String) {
    refusal(client.poll(req).await.expect_err("refused"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firms_reader_never_sees_another_firms_order_by_any_route() {
    let mut a = Core::start(0, 71).await;
    // In steps, so that the flow learns what rests and crosses it (trades between firms).
    for _ in 0..15 {
        a.run(100).await;
    }
    let state = tempfile::tempdir().unwrap();
    let mut config = delivery_config(&[&a], Some(state.path().to_path_buf()));
    // A small memory, so that the oldest records are read from cold data.
    config.limits.records_per_core_max = 64;
    config.cold = Some(bourse_delivery::cold::ColdConfig {
        segment_bytes: 64 << 10,
        ..Default::default()
    });
    config.access = readers();
    let node = start_delivery(config.clone()).await;
    caught_up(&node, &[a.end_index().await]).await;
    let http = |who: &str, pw: &str| AnyClient::http(node.addr()).with_access(login(who, pw));
    let bin = |who: &str, pw: &str| {
        AnyClient::binary(node.binary_addr().unwrap()).with_access(login(who, pw))
    };

    // The viewer reads everything; what firm 1 may read is what matches its firm.
    let mut viewer = http("viewer", "vpw");
    let everything = read_all(&mut viewer, Filter::default(), None).await;
    let ours_filter = Filter {
        firm: Some(OURS),
        ..Filter::default()
    };
    let own: Vec<Record> = everything
        .records
        .iter()
        .filter(|r| r.matches(&ours_filter))
        .copied()
        .collect();
    assert!(own.len() > 10 && own.len() < everything.records.len());
    let their_account = everything
        .records
        .iter()
        .find_map(|r| match &r.event {
            Event::OrderLog(l) if l.firm == THEIRS => Some(l.account),
            _ => None,
        })
        .expect("firm 2 has orders");
    // The whole history, from the origin: the cold data, then memory.
    let origin = {
        let c = Cursor::decode(everything.cursor.as_ref().unwrap()).unwrap();
        Cursor {
            parts: vec![(0, Pos::START)],
            floors: Vec::new(),
            ..c
        }
        .encode()
    };
    let stats = node.shared().store.read().unwrap().stats();
    assert!(stats[0].evicted > 0, "{stats:?}");
    let history = read_all(&mut viewer, Filter::default(), Some(origin.clone())).await;
    let between = |r: &&Record| {
        matches!(r.event, Event::Trade { .. })
            && r.firms.contains(&Some(OURS))
            && r.firms.iter().any(|f| *f != Some(OURS))
    };
    assert!(
        history.records.iter().any(|r| between(&r)),
        "the flow traded between firms"
    );
    let own_history: Vec<Record> = history
        .records
        .iter()
        .filter(|r| r.matches(&ours_filter))
        .copied()
        .collect();

    // Every front, every filter: firm 1's records only, and all of them.
    for mut client in [http("ours", "opw"), bin("ours", "opw")] {
        let got = read_all(&mut client, Filter::default(), None).await;
        all_ours(&got.records);
        // A snapshot holds each order once, in its latest state: the same positions as the
        // viewer's matching records.
        assert_eq!(positions(&got.records), positions(&own));
        let by_account = Filter {
            account: Some(their_account),
            ..Filter::default()
        };
        let got = read_all(&mut client, by_account, None).await;
        all_ours(&got.records);
        for r in &got.records {
            assert!(matches!(r.event, Event::Trade { .. }), "{r:?}");
        }
        let req = PollRequest {
            filter: Filter {
                firm: Some(THEIRS),
                ..Filter::default()
            },
            ..PollRequest::default()
        };
        assert_eq!(
            refused(&mut client, &req).await,
            (403, "not_entitled".into())
        );
    }

    // A cursor taken from another firm's session (and one from the origin, which reads the
    // cold data) gives firm 1's records only.
    let mut theirs = http("theirs", "tpw");
    let mut t = Received::default();
    t.poll(&mut theirs, Filter::default(), 5).await;
    all_theirs_sanity(&t.records);
    let mut ours = http("ours", "opw");
    let got = read_all(&mut ours, Filter::default(), t.cursor.clone()).await;
    all_ours(&got.records);
    let from_cold = read_all(&mut ours, Filter::default(), Some(origin)).await;
    all_ours(&from_cold.records);
    assert_eq!(positions(&from_cold.records), positions(&own_history));
    assert!(from_cold.records.iter().any(|r| between(&r)));
    // From a time (the cold data again, as far as it keeps the flow's old times).
    let since = PollRequest {
        since_ns: Some(1),
        limit: Some(1000),
        wait_us: Some(0),
        ..PollRequest::default()
    };
    let mut plain_http =
        AnyClient::Http(DeliveryClient::new(node.addr()).with_access(login("ours", "opw")));
    match plain_http.poll(&since).await {
        Ok(answer) => all_ours(&answer.records),
        Err(e) => assert_eq!(refusal(e), (410, "cursor_too_old".into())),
    }

    // A read replica with secondary indexes, logged on at its primary as a viewer, applies
    // the same entitlement to its own readers.
    let mut replica_config = DeliveryConfig {
        name: config.name.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        binary_listen: Some("127.0.0.1:0".parse().unwrap()),
        state_dir: None,
        persist_interval_ms: 1_000,
        threads: 2,
        cores: Vec::new(),
        follow: Some(Follow {
            primary: node.binary_addr().unwrap(),
            cores: vec![0],
            secondary_indexes: true,
            login: Some(FollowLogin {
                name: "viewer".into(),
                password: "vpw".into(),
            }),
            tls: None,
        }),
        cold: None,
        limits: Default::default(),
        access: readers(),
    };
    replica_config.limits.records_per_core_max = 1 << 20;
    let replica = start_delivery(replica_config).await;
    let started = Instant::now();
    while !replica.shared().is_ready() {
        assert!(started.elapsed() < LIMIT, "the replica never got ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for mut client in [
        AnyClient::http(replica.addr()).with_access(login("ours", "opw")),
        AnyClient::binary(replica.binary_addr().unwrap()).with_access(login("ours", "opw")),
    ] {
        let got = read_all(&mut client, Filter::default(), None).await;
        all_ours(&got.records);
        assert!(!got.records.is_empty());
        let req = PollRequest {
            filter: Filter {
                firm: Some(THEIRS),
                ..Filter::default()
            },
            ..PollRequest::default()
        };
        assert_eq!(
            refused(&mut client, &req).await,
            (403, "not_entitled".into())
        );
    }

    // A replica logged on with a firm's credentials would hold a firm's picture: it stops,
    // saying why, and never gets ready.
    let mut firm_replica_config = replica.shared().limits.clone();
    firm_replica_config.records_per_core_max = 1 << 20;
    let firm_replica = start_delivery(DeliveryConfig {
        name: config.name.clone(),
        listen: "127.0.0.1:0".parse().unwrap(),
        binary_listen: None,
        state_dir: None,
        persist_interval_ms: 1_000,
        threads: 2,
        cores: Vec::new(),
        follow: Some(Follow {
            primary: node.binary_addr().unwrap(),
            cores: vec![0],
            secondary_indexes: true,
            login: Some(FollowLogin {
                name: "ours".into(),
                password: "opw".into(),
            }),
            tls: None,
        }),
        cold: None,
        limits: firm_replica_config,
        access: readers(),
    })
    .await;
    let started = Instant::now();
    loop {
        let why = firm_replica.shared().feed_errors.lock().unwrap()[0].clone();
        if why.as_deref().is_some_and(|w| w.starts_with("stopped")) {
            assert!(why.unwrap().contains("viewer's or operator's"));
            break;
        }
        assert!(started.elapsed() < LIMIT, "the firm's replica went on");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!firm_replica.shared().is_ready());
    stop_delivery(firm_replica, false).await;

    // No credentials, wrong ones, a role that reads nothing, a poll before the Logon.
    let req = PollRequest::default();
    let mut anonymous = AnyClient::http(node.addr());
    assert_eq!(
        refused(&mut anonymous, &req).await,
        (401, "unauthenticated".into())
    );
    assert_eq!(
        refused(&mut http("ours", "wrong"), &req).await,
        (401, "unauthenticated".into())
    );
    assert_eq!(
        refused(&mut http("nobody", "npw"), &req).await,
        (403, "not_entitled".into())
    );
    assert_eq!(
        refused(&mut bin("ours", "wrong"), &req).await,
        (401, "unauthenticated".into())
    );
    let mut no_logon = AnyClient::binary(node.binary_addr().unwrap());
    assert_eq!(
        refused(&mut no_logon, &req).await,
        (401, "unauthenticated".into())
    );
    let mut status = DeliveryClient::new(node.addr());
    assert_eq!(status.get("/v1/status").await.unwrap().0, 401);
    assert_eq!(status.get("/metrics").await.unwrap().0, 401);
    let mut status = DeliveryClient::new(node.addr()).with_access(login("viewer", "vpw"));
    let s = status.status().await.unwrap();
    assert!(
        s["refusals"]["unauthenticated"].as_u64().unwrap() >= 5,
        "{s}"
    );
    assert!(s["refusals"]["not_entitled"].as_u64().unwrap() >= 3, "{s}");
    let (code, metrics) = status.get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(
        metrics.contains("bourse_delivery_refusals_total{reason=\"not_entitled\"}"),
        "{metrics}"
    );

    // The binary Logon says whose records the credentials read.
    let mut b = BinaryClient::new(node.binary_addr().unwrap()).with_access(login("ours", "opw"));
    b.poll(&PollRequest {
        limit: Some(1),
        wait_us: Some(0),
        ..PollRequest::default()
    })
    .await
    .unwrap();
    let logon = b.logon().unwrap();
    assert!(!logon.all_firms);
    assert_eq!(logon.firms, vec![OURS]);

    stop_delivery(replica, false).await;
    stop_delivery(node, false).await;
    a.stop().await;
}

/// Firm 2's reader gets firm 2's records (the other side of the same rule).
fn all_theirs_sanity(records: &[Record]) {
    for r in records {
        assert!(r.firms.contains(&Some(THEIRS)), "{r:?}");
        if let Event::OrderLog(l) = &r.event {
            assert_ne!(l.account, AccountId(u32::MAX));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fronts_speak_tls_when_the_node_has_a_certificate() {
    let mut a = Core::start(0, 72).await;
    a.run(100).await;
    let dir = tempfile::tempdir().unwrap();
    let authority = bourse_testkit::certs::Authority::new(dir.path(), "delivery");
    let (cert_path, key_path) = authority.issue("node", &["127.0.0.1"]);
    let mut config = delivery_config(&[&a], None);
    config.access = readers();
    config.access.tls = Some(ServerTls {
        cert_path,
        key_path,
    });
    let node = start_delivery(config).await;
    caught_up(&node, &[a.end_index().await]).await;
    let tls = bourse_delivery::TlsClient::from_ca_file(&authority.ca_path(), "127.0.0.1").unwrap();
    let access = Access {
        tls: Some(tls),
        credentials: Some(("ours".into(), "opw".into())),
    };
    for mut client in [
        AnyClient::http(node.addr()).with_access(access.clone()),
        AnyClient::binary(node.binary_addr().unwrap()).with_access(access.clone()),
    ] {
        let got = read_all(&mut client, Filter::default(), None).await;
        assert!(!got.records.is_empty());
        all_ours(&got.records);
    }
    // Plain TCP gets no answer.
    let mut plain = AnyClient::http(node.addr()).with_access(login("ours", "opw"));
    assert!(matches!(
        plain.poll(&PollRequest::default()).await,
        Err(ClientError::Io(_) | ClientError::Protocol(_))
    ));
    let mut plain =
        AnyClient::binary(node.binary_addr().unwrap()).with_access(login("ours", "opw"));
    assert!(plain.poll(&PollRequest::default()).await.is_err());
    stop_delivery(node, false).await;
    a.stop().await;
}

/// The end cursor of a node: a poll that reads everything.
async fn end_cursor(client: &mut AnyClient) -> String {
    read_all(client, Filter::default(), None)
        .await
        .cursor
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_store_refuses_the_cursors_of_the_one_before_and_a_restart_keeps_them() {
    let mut a = Core::start(0, 73).await;
    a.run(100).await;
    let end = [a.end_index().await];
    let state = tempfile::tempdir().unwrap();
    let config = delivery_config(&[&a], Some(state.path().to_path_buf()));
    let node = start_delivery(config.clone()).await;
    caught_up(&node, &end).await;
    let cursor = end_cursor(&mut AnyClient::http(node.addr())).await;
    stop_delivery(node, false).await;

    // The same store restarted: its cursors hold.
    let node = start_delivery(config.clone()).await;
    caught_up(&node, &end).await;
    let mut client = AnyClient::http(node.addr());
    let req = PollRequest {
        cursor: Some(cursor.clone()),
        wait_us: Some(0),
        ..PollRequest::default()
    };
    client
        .poll(&req)
        .await
        .expect("the same store knows its cursor");
    stop_delivery(node, false).await;

    // Today's fresh run of the same deployment (same name, same cores, a new store) and a
    // node without a state file: yesterday's cursor is foreign on both fronts.
    let fresh = tempfile::tempdir().unwrap();
    for state_dir in [Some(fresh.path().to_path_buf()), None] {
        let node = start_delivery(delivery_config(&[&a], state_dir)).await;
        caught_up(&node, &end).await;
        for mut c in [
            AnyClient::http(node.addr()),
            AnyClient::binary(node.binary_addr().unwrap()),
        ] {
            assert_eq!(refused(&mut c, &req).await, (409, "cursor_foreign".into()));
        }
        stop_delivery(node, false).await;
    }
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_ahead_of_the_node_waits_for_it_or_is_refused() {
    let mut a = Core::start(0, 74).await;
    a.run(100).await;
    let config = delivery_config(&[&a], None);
    let node = start_delivery(config).await;
    caught_up(&node, &[a.end_index().await]).await;
    let mut http = AnyClient::http(node.addr());
    let end = Cursor::decode(&end_cursor(&mut http).await).unwrap();
    let at = |index: u64| {
        Cursor {
            parts: vec![(0, Pos::entry_start(index))],
            ..end.clone()
        }
        .encode()
    };
    let applied = node.applied_indexes()[0];
    // Far ahead, no wait: refused at once, on both fronts.
    let far = PollRequest {
        cursor: Some(at(applied + 1_000_000)),
        wait_us: Some(0),
        ..PollRequest::default()
    };
    assert_eq!(refused(&mut http, &far).await, (409, "cursor_ahead".into()));
    let mut bin = AnyClient::binary(node.binary_addr().unwrap());
    assert_eq!(refused(&mut bin, &far).await, (409, "cursor_ahead".into()));
    // Just ahead, with a wait: answered once the node has applied that far.
    let near = PollRequest {
        cursor: Some(at(applied + 1)),
        wait_us: Some(10_000_000),
        ..PollRequest::default()
    };
    let waiting = tokio::spawn(async move { bin.poll(&near).await });
    a.run(50).await;
    let answer = tokio::time::timeout(LIMIT, waiting)
        .await
        .expect("the poll is answered")
        .unwrap()
        .expect("answered once the node got there");
    let next = Cursor::decode(&answer.header.next_cursor).unwrap();
    assert!(next.parts[0].1 >= Pos::entry_start(applied + 1));
    let s = DeliveryClient::new(node.addr()).status().await.unwrap();
    assert!(s["refusals"]["cursor_ahead"].as_u64().unwrap() >= 2, "{s}");
    stop_delivery(node, false).await;
    a.stop().await;
}
