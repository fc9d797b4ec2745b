//! A replicated core for the end-to-end test of a gateway restart (here and not in the
//! gateway's tests because it needs the cluster, which the gateway must not depend on): three in-process `bourse node`s on
//! loopback, and gateways in front of them started the way `bourse gateway` starts them
//! (links with this run's epoch, resuming where the saved order state is exact).

use bourse_cluster::link::{ClusterLink, ClusterLinkConfig};
use bourse_cluster::tokio;
use bourse_cluster::{ClusterConfig, FsyncSetting, Node};
use bourse_gateway::recovery::Recovery;
use bourse_gateway::{CoreLink, GatewayConfig, GatewayHandle};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Three replica nodes of one core, with their runtime.
pub struct Group {
    pub rt: tokio::runtime::Runtime,
    pub nodes: Vec<Node>,
    pub config: ClusterConfig,
    _dir: tempfile::TempDir,
}

impl Group {
    pub fn start() -> Group {
        let dir = tempfile::tempdir().unwrap();
        let mut config = ClusterConfig::local(
            3,
            dir.path().to_path_buf(),
            bourse_testkit::free_ports::<3>(),
        );
        config.fsync = FsyncSetting::Never;
        config.orders_max = 8192;
        config.accounts_max = 1024;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let nodes = rt.block_on(async {
            let mut nodes = Vec::new();
            for n in &config.nodes {
                nodes.push(Node::start(&config, n.id).await.unwrap());
            }
            nodes
        });
        let group = Group {
            rt,
            nodes,
            config,
            _dir: dir,
        };
        group.wait_for_leader(Duration::from_secs(30));
        group
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.config
            .nodes
            .iter()
            .map(|n| n.addr.parse().unwrap())
            .collect()
    }

    fn wait_for_leader(&self, limit: Duration) {
        let started = Instant::now();
        loop {
            for n in &self.nodes {
                let s = self.rt.block_on(n.status());
                if s.leader == Some(s.id) {
                    return;
                }
            }
            assert!(started.elapsed() < limit, "no leader");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn shutdown(self) {
        let Group { rt, nodes, .. } = self;
        rt.block_on(async {
            for n in nodes {
                n.shutdown().await;
            }
        });
    }
}

/// `text` with one replicated core (instrument 1) behind `client_id`, stores in `dir`.
pub fn gateway_config(text: &str, group: &Group, client_id: u64, dir: &Path) -> GatewayConfig {
    let nodes: Vec<String> = group.addrs().iter().map(|a| format!("\"{a}\"")).collect();
    let text = format!(
        "{text}\n[[cores]]\nname = \"equities\"\ninstruments = [1]\nnodes = [{}]\nclient_id = {client_id}\n",
        nodes.join(", ")
    );
    let mut config = GatewayConfig::from_toml(&text).unwrap();
    config.gateway.store_dir = dir.to_path_buf();
    config
}

/// Starts a gateway in front of the group as `bourse gateway` does: a fresh link epoch, the
/// stream resumed where the saved order state is exact.
pub fn start_gateway(config: GatewayConfig) -> GatewayHandle {
    let recovery = Recovery::open(&config).unwrap();
    let mut links: Vec<Box<dyn CoreLink>> = Vec::new();
    for (index, core) in config.core_plan().iter().enumerate() {
        let c = ClusterLinkConfig {
            from_index: recovery.resume_index(index),
            ..ClusterLinkConfig::new(
                core.nodes.clone(),
                recovery.link_client_id(core.client_id.unwrap()),
                config.gateway.core_queue_depth,
            )
        };
        links.push(Box::new(ClusterLink::start(c).unwrap()));
    }
    bourse_gateway::spawn_cores(config, links, None).unwrap()
}
