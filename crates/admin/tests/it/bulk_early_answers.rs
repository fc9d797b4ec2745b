//! A bulk account addition answered before its body is read (a repeated request id, a line
//! that stops it, a refused operator) reaches its client as that answer, whatever the size of
//! the body still being sent: the server reads the rest before it closes, so that the
//! connection is not reset under a client still writing (CI saw a retried bulk addition end in
//! "Broken pipe" instead of its answer).

use crate::common;

use bourse_admin::client::Reply;
use bourse_admin::{AdminClient, AdminServer, AdminServerConfig, AdminService};
use bourse_auth::{hash_password_with, CredentialEntry, CredentialStore, HashCost};
use bourse_engine::{Engine, EngineConfig};
use common::EngineVenue;
use std::sync::Arc;

/// Lines in the large bodies: far more bytes (~4 MB) than the sockets' buffers hold, so the
/// client is still writing when the server answers.
const LARGE_BODY_LINES: u64 = 100_000;

fn credentials() -> Arc<CredentialStore> {
    let entry = |name: &str, role: &str| CredentialEntry {
        name: name.into(),
        password_hash: hash_password_with(&format!("{name}-pw"), HashCost::TEST_ONLY).unwrap(),
        roles: vec![role.into()],
    };
    Arc::new(
        CredentialStore::from_entries(&[entry("olga", "operator"), entry("vera", "viewer")])
            .unwrap(),
    )
}

fn lines(from: u64, count: u64) -> String {
    (from..from + count)
        .map(|a| format!("{{\"account\":{a},\"firm\":9,\"cash\":1000}}\n"))
        .collect()
}

fn post(url: &str, user: &str, id: &str, body: &str) -> Result<Reply, String> {
    AdminClient::new(url)
        .unwrap()
        .with_credentials(user, &format!("{user}-pw"))
        .bulk_accounts(id, &mut body.as_bytes(), body.len() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_addition_answered_early_reaches_its_client_whatever_the_body_left() {
    let dir = tempfile::tempdir().unwrap();
    let venue = Arc::new(EngineVenue::new(Engine::new(EngineConfig::default())));
    let service =
        Arc::new(AdminService::new(venue, &dir.path().join("audit.jsonl"), None).unwrap());
    let config = AdminServerConfig::new("127.0.0.1:0".parse().unwrap());
    let server = AdminServer::start(service, credentials(), config)
        .await
        .unwrap();
    let url = server.url();
    tokio::task::spawn_blocking(move || {
        let first = post(&url, "olga", "bulk-1", &lines(1_000, 10)).unwrap();
        assert_eq!(first.status, 200, "{first:?}");
        assert_eq!(first.body["accounts_added"], 10, "{first:?}");

        // The same request id again, now with a large body: answered from the first run.
        let large = lines(10_000, LARGE_BODY_LINES);
        let again = post(&url, "olga", "bulk-1", &large).expect("the retry's answer");
        assert_eq!(again.status, 200, "{again:?}");
        assert_eq!(again.body["retried"], true, "{again:?}");
        assert_eq!(again.body["accounts_added"], 10, "{again:?}");

        // A broken first line stops the stream there; the rest is not added.
        let broken = format!("{{\"account\":1,\"frim\":9}}\n{large}");
        let stopped = post(&url, "olga", "bulk-2", &broken).expect("the refusal");
        assert_eq!(stopped.status, 400, "{stopped:?}");
        let error = stopped.body["error"].as_str().unwrap();
        assert!(error.contains("line 1"), "{stopped:?}");

        // A viewer may not add accounts, and a wrong password is not an operator.
        let viewer = post(&url, "vera", "bulk-3", &large).expect("the refusal");
        assert_eq!(viewer.status, 403, "{viewer:?}");
        let stranger = AdminClient::new(&url)
            .unwrap()
            .with_credentials("olga", "wrong")
            .bulk_accounts("bulk-4", &mut large.as_bytes(), large.len() as u64)
            .expect("the refusal");
        assert_eq!(stranger.status, 401, "{stranger:?}");

        // The server still answers, and holds the first ten accounts only.
        let after = post(&url, "olga", "bulk-5", &lines(1_000, 10)).unwrap();
        assert_eq!(after.body["accounts_existing"], 10, "{after:?}");
        assert_eq!(after.body["accounts_added"], 0, "{after:?}");
    })
    .await
    .unwrap();
}
