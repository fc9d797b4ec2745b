//! Mutual TLS between the nodes and from their clients: a group whose links all run over TLS
//! commits, streams and fails over; a peer without a certificate of the venue's authority (one
//! of another authority, none, plain bytes, a handshake never finished) is refused before any
//! frame is read, counted by reason, and changes nothing. Certificates are made here (rcgen),
//! never committed. On the loopback's plain TCP, idle sockets beyond `connections_max` are
//! displaced and silent ones closed, so they never keep a real peer out.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bourse_cluster::net::{PeerConnection, Request, Response};
use bourse_cluster::transport::{self, Refusal};
use bourse_cluster::{Client, ClusterConfig, Node, TlsFiles};
use bourse_core::Command;
use bourse_engine::workload::Flow;
use bourse_testkit::certs::Authority;
use common::{addrs, converged, free_ports, small_flow};
use tokio_rustls::rustls;

const DEADLINE: Duration = Duration::from_secs(10);
const CONVERGE_LIMIT: Duration = Duration::from_secs(20);
/// A hang guard only: every wait below is for a condition.
const WAIT: Duration = Duration::from_secs(20);

/// The files of `who`'s certificate (signed by `authority`) and the authority's.
fn files(authority: &Authority, who: &str, ips: &[&str]) -> TlsFiles {
    let (cert_path, key_path) = authority.issue(who, ips);
    TlsFiles {
        ca_path: authority.ca_path(),
        cert_path,
        key_path,
    }
}

/// A group on loopback ports with `[tls]`: each node's certificate names 127.0.0.1.
fn tls_config(dir: &Path, venue: &Authority, nodes: usize) -> ClusterConfig {
    let mut c = ClusterConfig::local(31, dir.join("data"), free_ports());
    c.nodes.truncate(nodes);
    c.fsync = bourse_cluster::FsyncSetting::Never;
    c.hash_checkpoint_every_entries = 8;
    c.hash_check_interval_ms = 30;
    c.orders_max = 4096;
    c.accounts_max = 1024;
    for n in &c.nodes {
        venue.issue(&format!("node-{}", n.id), &["127.0.0.1"]);
    }
    let (cert_path, key_path) = venue.paths("node-{id}");
    c.tls = Some(TlsFiles {
        ca_path: venue.ca_path(),
        cert_path,
        key_path,
    });
    c
}

async fn start_all(config: &ClusterConfig) -> Vec<Node> {
    let mut nodes = Vec::new();
    for n in &config.nodes {
        nodes.push(Node::start(config, n.id).await.expect("node starts"));
    }
    nodes
}

/// This test process reaches the group as a gateway would: with a client certificate of the
/// venue's authority.
fn reach_over_tls(config: &ClusterConfig, venue: &Authority) {
    let nodes: Vec<SocketAddr> = addrs(config).into_iter().map(|(_, a)| a).collect();
    let files = files(venue, "gateway", &[]);
    transport::configure_client(&nodes, Some(&files)).unwrap();
}

async fn drive(client: &mut Client, flow: &mut Flow, setup: bool, count: usize) -> u64 {
    let mut acked = 0;
    if setup {
        for (i, body) in flow.setup().into_iter().enumerate() {
            client
                .submit(&Command::new(i as u64, body), DEADLINE)
                .await
                .expect("setup acknowledged");
            acked += 1;
        }
    }
    for i in 0..count {
        // With its events: they come over a TLS subscription to the committed stream.
        let (_, events) = client
            .submit_for_events(
                &Command::new(1_000 + i as u64, flow.next_command()),
                DEADLINE,
            )
            .await
            .expect("command acknowledged");
        flow.observe(&events);
        acked += 1;
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_mutual_tls_commit_stream_and_fail_over() {
    let dir = tempfile::tempdir().unwrap();
    let venue = Authority::new(dir.path(), "venue");
    let config = tls_config(dir.path(), &venue, 3);
    let mut nodes = start_all(&config).await;
    reach_over_tls(&config, &venue);
    let mut client = Client::new(addrs(&config), 1, 1);
    let mut flow = Flow::new(small_flow(31));
    let mut acked = drive(&mut client, &mut flow, true, 60).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    converged(&refs, CONVERGE_LIMIT).await;

    // The leader goes; the other two elect one over TLS and the client follows.
    let leader = client.current_node();
    let at = nodes.iter().position(|n| n.id() == leader).unwrap();
    nodes.remove(at).shutdown().await;
    acked += drive(&mut client, &mut flow, false, 60).await;
    let refs: Vec<&Node> = nodes.iter().collect();
    let statuses = converged(&refs, CONVERGE_LIMIT).await;
    for s in &statuses {
        assert_eq!(s.commands_applied, acked, "node {} applied each once", s.id);
        assert!(s.alarm.is_none(), "{:?}", s.alarm);
        assert_ne!(s.leader, Some(leader));
    }
    // No node refused another's certificate or identity. (A handshake cut short when the old
    // leader shut down, or one that timed out on a loaded machine, is a matter of timing, not
    // of who the peer is, and is not asserted.)
    for n in &nodes {
        for why in [
            Refusal::NoCertificate,
            Refusal::UntrustedCertificate,
            Refusal::NotTls,
            Refusal::NotANode,
        ] {
            assert_eq!(
                n.refusals().get(why),
                0,
                "node {} refused one of its own: {:?}",
                n.id(),
                n.refusals().all()
            );
        }
    }
    for n in nodes {
        n.shutdown().await;
    }
}

/// The count of refusals named `why` (a node's own reason, or its admission policy's).
fn count_of(node: &Node, why: &str) -> u64 {
    let all = node.refusals().all();
    all.iter()
        .find(|(name, _)| *name == why)
        .map_or(0, |(_, n)| *n)
}

/// Waits until `node` counted `want` refusals named `why`.
async fn refused(node: &Node, why: &str, want: u64) {
    let started = Instant::now();
    while count_of(node, why) < want {
        assert!(
            started.elapsed() < WAIT,
            "{why:?}: {:?}",
            node.refusals().all()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A client configuration that trusts the venue's authority (so the node's certificate
/// passes) and presents `own`, or nothing.
fn client_presenting(venue: &Authority, own: Option<&TlsFiles>) -> Arc<rustls::ClientConfig> {
    match own {
        Some(own) => TlsFiles {
            ca_path: venue.ca_path(),
            cert_path: own.cert_path.clone(),
            key_path: own.key_path.clone(),
        }
        .client_config()
        .unwrap(),
        None => {
            let roots = bourse_auth::tls::load_roots(&venue.ca_path(), "ca").unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            Arc::new(
                rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_root_certificates(roots)
                    .with_no_client_auth(),
            )
        }
    }
}

async fn status_with(addr: SocketAddr, tls: Option<Arc<rustls::ClientConfig>>) -> bool {
    let mut conn = PeerConnection::with_tls(addr, tls);
    matches!(
        conn.call(Request::Status, Duration::from_secs(5)).await,
        Ok(Response::Status(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_a_certificate_of_the_venue_s_authority_is_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let venue = Authority::new(dir.path(), "venue");
    let other = Authority::new(dir.path(), "other");
    let config = tls_config(dir.path(), &venue, 1);
    let node = Node::start(&config, 1).await.expect("node starts");
    let addr = config.addr_of(1).unwrap();
    let mut client = Client::new(addrs(&config), 1, 1);
    reach_over_tls(&config, &venue);
    let mut flow = Flow::new(small_flow(32));
    let acked = drive(&mut client, &mut flow, true, 5).await;
    let before = node.status().await;
    assert_eq!(before.commands_applied, acked);

    // A certificate of another authority.
    let foreign = files(&other, "intruder", &["127.0.0.1"]);
    assert!(!status_with(addr, Some(client_presenting(&venue, Some(&foreign)))).await);
    refused(&node, Refusal::UntrustedCertificate.name(), 1).await;
    // No certificate at all.
    assert!(!status_with(addr, Some(client_presenting(&venue, None))).await);
    refused(&node, Refusal::NoCertificate.name(), 1).await;
    // A plain-TCP client speaking the node protocol, and garbage.
    assert!(!status_with(addr, None).await);
    refused(&node, Refusal::NotTls.name(), 1).await;
    {
        use tokio::io::AsyncWriteExt;
        let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
        raw.write_all(&[0xff; 64]).await.unwrap();
        refused(&node, Refusal::NotTls.name(), 2).await;
    }
    // A connection that never says anything is dropped when its handshake time is up.
    let silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    refused(&node, Refusal::HandshakeTimeout.name(), 1).await;
    drop(silent);
    // A node that does not trust our peer's authority refuses the node too: a client that
    // trusts only another authority gives up on the node's certificate (its own check).
    let doubter = TlsFiles {
        ca_path: other.ca_path(),
        ..foreign.clone()
    };
    assert!(!status_with(addr, Some(doubter.client_config().unwrap())).await);

    // None of it changed the node, and the venue's own client is still served.
    let after = node.status().await;
    assert_eq!(after.commands_applied, before.commands_applied);
    assert_eq!(after.state_hash, before.state_hash);
    assert!(status_with(addr, transport::tls_for(addr)).await);
    client
        .submit(&Command::new(9_999, flow.next_command()), DEADLINE)
        .await
        .expect("the venue's client goes on");
    let counts = node.refusals().all();
    assert_eq!(node.refusals().get(Refusal::Busy), 0, "{counts:?}");
    node.shutdown().await;
}

/// Any certificate of the venue's authority may query and submit, but only one that names a
/// node of the group may speak raft: a gateway's link certificate asking for a vote is cut off
/// and counted, and nothing reaches raft.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_cannot_speak_raft_as_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let venue = Authority::new(dir.path(), "venue");
    let config = tls_config(dir.path(), &venue, 1);
    let node = Node::start(&config, 1).await.expect("node starts");
    let addr = config.addr_of(1).unwrap();
    reach_over_tls(&config, &venue);
    let vote = || {
        Request::Vote(openraft::raft::VoteRequest::new(
            openraft::Vote::new(0, 7),
            None,
        ))
    };
    // A link certificate, as a gateway's: the authority's, naming no host.
    let link = files(&venue, "gateway-link", &[]);
    let link = client_presenting(&venue, Some(&link));
    assert!(status_with(addr, Some(link.clone())).await, "it may query");
    let mut conn = PeerConnection::with_tls(addr, Some(link));
    let answer = conn.call(vote(), Duration::from_secs(5)).await;
    assert!(answer.is_err(), "cut off, not answered: {answer:?}");
    refused(&node, Refusal::NotANode.name(), 1).await;
    // A node's certificate (it names the node's host) is answered (a stale vote, refused by
    // raft itself without a change).
    let peer = files(&venue, "node-2", &["127.0.0.1"]);
    let mut conn = PeerConnection::with_tls(addr, Some(client_presenting(&venue, Some(&peer))));
    let answer = conn.call(vote(), Duration::from_secs(5)).await;
    assert!(matches!(answer, Ok(Response::Vote(_))), "{answer:?}");
    assert_eq!(node.refusals().get(Refusal::NotANode), 1);
    node.shutdown().await;
}

/// A node's port bounds its connections and closes silent ones: a hundred idle sockets (and
/// more opened while the test works) against `connections_max = 32` displace one another,
/// never a peer that speaks, and are closed once `first_frame_timeout_ms` passes; status
/// calls and the group's commits go on throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_never_keep_a_peer_out_of_a_node_s_port() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ClusterConfig::local(33, dir.path().join("data"), free_ports());
    config.fsync = bourse_cluster::FsyncSetting::Never;
    config.orders_max = 4096;
    config.accounts_max = 1024;
    config.connections_max = 32;
    config.first_frame_timeout_ms = 500;
    let nodes = start_all(&config).await;
    converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await;
    let addr = addrs(&config)[0].1;
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let mut client = Client::new(addrs(&config), 7, 1);
    let mut flow = Flow::new(small_flow(33));
    let mut acked = drive(&mut client, &mut flow, true, 5).await;
    for round in 0..10 {
        for _ in 0..20 {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        assert!(
            status_with(addr, None).await,
            "round {round}: node 1 did not answer"
        );
        acked += drive(&mut client, &mut flow, false, 2).await;
    }
    // Every socket comes from 127.0.0.1, which holds all 32 places: a newcomer displaces its
    // own address's longest-waiting connection (`address_share`).
    refused(&nodes[0], "address_share", 100).await;
    // The idle sockets still held are closed when their time runs out.
    refused(&nodes[0], "timeout", 1).await;
    assert_eq!(
        count_of(&nodes[0], "full"),
        0,
        "{:?}",
        nodes[0].refusals().all()
    );
    let statuses = converged(&nodes.iter().collect::<Vec<_>>(), CONVERGE_LIMIT).await;
    assert!(
        statuses[0].last_applied_index.unwrap_or(0) >= acked,
        "{statuses:?}"
    );
    drop(idle);
    for n in nodes {
        n.shutdown().await;
    }
}
