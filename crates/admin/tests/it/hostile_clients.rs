//! Idle, trickling and reopening sockets from many loopback addresses cannot keep an operator
//! out of the admin API (issue 40: 66 idle sockets used to reset every request): each newcomer
//! displaces the connection that has waited longest for its request, and an operator's
//! request, sent as it connects, is answered every time.

use crate::common::EngineVenue;
use bourse_admin::{AdminClient, AdminServer, AdminServerConfig, AdminService};
use bourse_auth::{hash_password_with, CredentialEntry, CredentialStore, HashCost};
use bourse_engine::{Engine, EngineConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

/// Hostile sockets held at once, and the loopback addresses they come from.
const IDLE_SOCKETS: usize = 400;
const ADDRESSES: usize = 20;
/// Operator requests, each after another burst of reopened sockets.
const REQUESTS: usize = 10;
const REOPENED_PER_REQUEST: usize = 60;

/// A connection to `to` from `127.0.0.<host>`.
async fn connect_from(host: usize, to: SocketAddr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    let from: SocketAddr = format!("127.0.0.{}:0", 2 + host % 250).parse().unwrap();
    socket.bind(from).ok()?;
    socket.connect(to).await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_reopening_sockets_never_keep_an_operator_out() {
    let dir = tempfile::tempdir().unwrap();
    let venue = Arc::new(EngineVenue::new(Engine::new(EngineConfig::default())));
    let service =
        Arc::new(AdminService::new(venue, &dir.path().join("audit.jsonl"), None).unwrap());
    let entry = CredentialEntry {
        name: "olga".into(),
        password_hash: hash_password_with("olga-pw", HashCost::TEST_ONLY).unwrap(),
        roles: vec!["operator".into()],
    };
    let credentials = Arc::new(CredentialStore::from_entries(&[entry]).unwrap());
    let config = AdminServerConfig::new("127.0.0.1:0".parse().unwrap());
    let server = AdminServer::start(service, credentials, config)
        .await
        .unwrap();
    let addr = server.addr();

    // Idle sockets, and every third trickling the first bytes of a request head.
    let mut hostile = Vec::new();
    for i in 0..IDLE_SOCKETS {
        if let Some(mut s) = connect_from(i % ADDRESSES, addr).await {
            if i % 3 == 0 {
                let _ = s.write_all(b"GET /v1/instr").await;
            }
            hostile.push(s);
        }
    }
    let url = server.url();
    for round in 0..REQUESTS {
        for i in 0..REOPENED_PER_REQUEST {
            if let Some(s) = connect_from(round * 7 + i, addr).await {
                hostile.push(s);
            }
        }
        let url = url.clone();
        let reply = tokio::task::spawn_blocking(move || {
            AdminClient::new(&url)
                .unwrap()
                .with_credentials("olga", "olga-pw")
                .get("/v1/instruments")
        })
        .await
        .unwrap();
        let reply = reply.unwrap_or_else(|e| panic!("request {round} not answered: {e}"));
        assert_eq!(reply.status, 200, "request {round}: {reply:?}");
    }
    drop(hostile);
    server.stop();
}
