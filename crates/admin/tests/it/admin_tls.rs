//! The admin API over HTTPS: with a certificate, the listener speaks TLS only; a client that
//! trusts the authority which signed it gets its answers, one that trusts another authority
//! or speaks plain HTTP gets none (and no password crosses in clear); without a certificate
//! the listener binds the loopback only.

use crate::common;

use bourse_admin::{AdminClient, AdminServer, AdminServerConfig, AdminService};
use bourse_auth::{hash_password_with, CredentialEntry, CredentialStore, HashCost};
use bourse_engine::{Engine, EngineConfig};
use bourse_testkit::certs::Authority;
use common::EngineVenue;
use std::net::SocketAddr;
use std::sync::Arc;

fn service(dir: &std::path::Path) -> (Arc<AdminService>, Arc<CredentialStore>) {
    let venue = Arc::new(EngineVenue::new(Engine::new(EngineConfig::default())));
    let service = Arc::new(AdminService::new(venue, &dir.join("audit.jsonl"), None).unwrap());
    let credentials = CredentialStore::from_entries(&[CredentialEntry {
        name: "alice".into(),
        password_hash: hash_password_with("alice-pw", HashCost::TEST_ONLY).unwrap(),
        roles: vec!["viewer".into()],
    }])
    .unwrap();
    (service, Arc::new(credentials))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_over_https_answers_clients_that_trust_its_authority_only() {
    let dir = tempfile::tempdir().unwrap();
    let venue_ca = Authority::new(dir.path(), "venue");
    let (cert, key) = venue_ca.issue("admin-api", &["127.0.0.1"]);
    let other_ca = Authority::new(dir.path(), "other");
    let (service, credentials) = service(dir.path());
    let mut config = AdminServerConfig::new("127.0.0.1:0".parse().unwrap());
    config.tls = Some(bourse_auth::tls::server_config(&cert, &key).unwrap());
    let server = AdminServer::start(service, credentials, config)
        .await
        .unwrap();
    let url = server.url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    let ca = venue_ca.ca_path();
    let other = other_ca.ca_path();
    let plain = format!("http://{}", server.addr());
    let answers = tokio::task::spawn_blocking(move || {
        let trusted = AdminClient::new(&url)
            .unwrap()
            .with_credentials("alice", "alice-pw")
            .with_ca_file(&ca)
            .unwrap()
            .get("/v1/instruments");
        let untrusted = AdminClient::new(&url)
            .unwrap()
            .with_credentials("alice", "alice-pw")
            .with_ca_file(&other)
            .unwrap()
            .get("/v1/instruments");
        let no_ca = AdminClient::new(&url)
            .unwrap()
            .with_credentials("alice", "alice-pw")
            .get("/v1/instruments");
        let in_clear = AdminClient::new(&plain)
            .unwrap()
            .with_credentials("alice", "alice-pw")
            .get("/v1/instruments");
        (trusted, untrusted, no_ca, in_clear)
    })
    .await
    .unwrap();
    let (trusted, untrusted, no_ca, in_clear) = answers;
    let trusted = trusted.expect("a client trusting the venue's authority is answered");
    assert_eq!(trusted.status, 200, "{trusted:?}");
    assert_eq!(
        trusted.body["markets"][0]["market"], "futures",
        "{trusted:?}"
    );
    let e = untrusted.expect_err("a certificate of another authority is not trusted");
    assert!(e.contains("TLS handshake"), "{e}");
    let e = no_ca.expect_err("https without a CA file");
    assert!(e.contains("CA file"), "{e}");
    assert!(
        in_clear.is_err(),
        "plain HTTP to the HTTPS listener is answered nothing: {in_clear:?}"
    );
}

#[tokio::test]
async fn plain_http_binds_the_loopback_only() {
    let dir = tempfile::tempdir().unwrap();
    let (service, credentials) = service(dir.path());
    let listen: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let e = AdminServer::start(service, credentials, AdminServerConfig::new(listen))
        .await
        .err()
        .expect("refused before binding");
    assert!(e.to_string().contains("only with TLS"), "{e}");
}
