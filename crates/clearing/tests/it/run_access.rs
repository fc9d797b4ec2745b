//! Who may ask a clearing service for a run, checked over HTTP on loopback against the
//! service of `examples/clearing.toml`, whose cores need not be up: every answer here is
//! given before a run would reach a core. That a service without operators runs a clearing
//! end to end is in `service.rs`, against a real core.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;

use bourse_admin::AdminClient;
use bourse_auth::{hash_password_with, CredentialEntry, HashCost};
use bourse_clearing::{load_instruments, ClearingConfig, ClearingNode};
use serde_json::{json, Value};

/// The example service on a port of its own and a temporary state directory, so that a
/// test neither collides with a running example nor writes into the repository.
fn example(state_dir: &Path) -> ClearingConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/clearing.toml");
    let mut config = ClearingConfig::load(Path::new(path)).unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.state_dir = state_dir.to_path_buf();
    config
}

fn start(config: ClearingConfig) -> ClearingNode {
    let defs = load_instruments(&config.instruments).unwrap();
    ClearingNode::start(config, defs).unwrap()
}

/// Posts `body` as a web page open in a browser would: with an `Origin` header, which
/// browsers add to every POST (the AdminClient, like the command line, sends none).
fn post_from_a_web_page(node: &ClearingNode, path: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut stream = TcpStream::connect(node.addr()).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nOrigin: https://example.com\r\n\
         Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        node.addr(),
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply.split(' ').nth(1).unwrap().parse().unwrap();
    let (_, json) = reply.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(json).unwrap())
}

fn runs_known(node: &ClearingNode) -> usize {
    let reply = AdminClient::new(&node.url())
        .unwrap()
        .get("/v1/runs")
        .unwrap();
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.body["runs"].as_array().unwrap().len()
}

#[test]
fn the_example_service_starts_without_operators_and_answers_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let config = example(dir.path());
    assert!(
        config.operators.is_empty(),
        "the example has no credentials"
    );
    let node = start(config);
    let status = AdminClient::new(&node.url())
        .unwrap()
        .get("/v1/status")
        .unwrap();
    assert_eq!(status.status, 200, "{:?}", status.body);
    assert_eq!(status.body["standby"], false);
    node.stop().unwrap();
}

#[test]
fn without_operators_a_run_or_takeover_posted_by_a_web_page_is_refused_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(example(dir.path()));
    let (status, body) = post_from_a_web_page(&node, "/v1/runs", &json!({ "kind": "end_of_day" }));
    assert_eq!(status, 403, "{body}");
    let why = body["error"]["message"].as_str().unwrap();
    assert!(why.contains("Origin header"), "{why}");
    assert!(why.contains("no [[operators]]"), "{why}");
    assert_eq!(runs_known(&node), 0, "the page's run was not computed");
    let (status, body) = post_from_a_web_page(&node, "/v1/takeover", &json!({}));
    assert_eq!(status, 403, "{body}");
    node.stop().unwrap();
}

#[test]
fn with_operators_a_run_request_without_credentials_is_refused_with_401() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = example(dir.path());
    config.operators.push(CredentialEntry {
        name: "admin".into(),
        password_hash: hash_password_with("admin-pw", HashCost::TEST_ONLY).unwrap(),
        roles: vec!["operator".into()],
    });
    let node = start(config);
    let ask = json!({ "kind": "intermediate" });
    let reply = AdminClient::new(&node.url())
        .unwrap()
        .post_json("/v1/runs", None, &ask)
        .unwrap();
    assert_eq!(reply.status, 401, "{:?}", reply.body);
    assert_eq!(
        reply.body["error"]["message"],
        "credentials required (HTTP Basic)"
    );
    // A wrong password is no better, and a web page's request is refused for want of
    // credentials, as any other: the rule for pages is only for nodes without credentials.
    let wrong = AdminClient::new(&node.url())
        .unwrap()
        .with_credentials("admin", "guess")
        .post_json("/v1/runs", None, &ask)
        .unwrap();
    assert_eq!(wrong.status, 401, "{:?}", wrong.body);
    assert_eq!(post_from_a_web_page(&node, "/v1/runs", &ask).0, 401);
    assert_eq!(runs_known(&node), 0);
    node.stop().unwrap();
}
