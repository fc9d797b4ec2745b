//! A gateway with an in-process engine, for the gateway's end-to-end tests (driven over its
//! sockets by the client SDK).

#![allow(dead_code)]

use bourse_engine::EngineConfig;
use bourse_gateway::{GatewayConfig, GatewayHandle};
use std::time::{Duration, Instant};

pub const CONFIG: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"
binary_listen = "127.0.0.1:0"
connections_max = 64
throttle_msgs_per_s = 1000
logon_timeout_ms = 1000
outbound_buffer_max_bytes = 262144

[core]
bootstrap = true

[[instruments]]
instrument = 1
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 10
band_bps = 2000
reference_price = 10000

[[accounts]]
account = 101
firm = 1
cash = 100000000000
may_short = true

[[accounts]]
account = 201
firm = 2
cash = 100000000000
may_short = true

[[accounts]]
account = 301
firm = 3
cash = 10000
may_short = true

[[fix_sessions]]
client_comp_id = "ALPHA"
firm = 1
accounts = [101]

[[fix_sessions]]
client_comp_id = "BETA"
firm = 2
accounts = [201]

[[fix_sessions]]
client_comp_id = "POOR"
firm = 3
accounts = [301]

[[fix_sessions]]
client_comp_id = "SLOW"
firm = 2
accounts = [201]
throttle_msgs_per_s = 2

[[fix_sessions]]
client_comp_id = "ALPHA-DC"
firm = 1
drop_copy = true

[[binary_sessions]]
credentials = "alpha-bin"
firm = 1
accounts = [101]

[[binary_sessions]]
credentials = "flood"
firm = 2
accounts = [201]
throttle_msgs_per_s = 10000000

[[binary_sessions]]
credentials = "beta-bin"
firm = 2
accounts = [201]
"#;

pub struct TestGateway {
    pub handle: GatewayHandle,
    pub dir: tempfile::TempDir,
}

pub fn start() -> TestGateway {
    start_with(CONFIG)
}

pub fn start_with(text: &str) -> TestGateway {
    let dir = tempfile::tempdir().unwrap();
    let mut config = GatewayConfig::from_toml(text).unwrap();
    config.gateway.store_dir = dir.path().to_path_buf();
    config.gateway.core_queue_depth = 4096;
    let links = bourse_engine::in_process::engine_links(
        config.core_plan().len(),
        engine_config(),
        config.gateway.core_queue_depth,
    );
    let handle = bourse_gateway::spawn_cores(config, links, None).unwrap();
    TestGateway { handle, dir }
}

/// The engines behind the test gateways: room for every test's orders, small tables.
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        orders_max: 100_000,
        instruments_max: 16,
        accounts_max: 1_000,
        levels_per_side_hint: 16,
        first_order_id: 1,
    }
}

/// Waits until `f` holds, at most `timeout`.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}
