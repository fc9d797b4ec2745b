//! `bourse admin serve --config admin.toml`: the admin API as a process of its own, for a
//! deployment of separate `bourse node` and `bourse gateway` processes (`docs/admin.md`).
//!
//! It serves the same HTTP API as the admin service inside `bourse demo`: actions go to each
//! market's replica group through cluster clients of its own (with the audit trailer), and
//! queries are answered by the group's leader over the node protocol
//! (`bourse_cluster::query::Query`). With a `[schedule]`, the schedule driver issues the
//! trading day's phase changes and end of day at their times on the wall clock.
//!
//! The config (TOML; an unknown key is refused by name; relative paths are read from the
//! config file's directory):
//!
//! ```toml
//! listen = "127.0.0.1:8090"            # port 0 takes a free one (printed); loopback unless tls
//! tls = { cert_path = "admin-api.crt", key_path = "admin-api.key" }  # optional: HTTPS
//! credentials_path = "operators.toml"  # [[operators]] name, password_hash, roles
//! audit_log_path = "admin-audit.jsonl"
//! [[cores]]                            # one per market, as the gateway's [[cores]]
//! name = "equities"                    # the market's name in actions and answers
//! instruments = [1, 2]                 # optional; each instrument in one core at most
//! nodes = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
//! client_id = 4611686018427387904      # optional: the admin's first client id (it uses two)
//! tls = { ca_path = "venue-ca.crt", cert_path = "admin.crt", key_path = "admin.key" }
//!                                      # optional; required for nodes off the loopback
//! [schedule]                           # optional: bourse_admin::schedule::ScheduleConfig
//! ```

use anyhow::{anyhow, bail, Context, Result};
use bourse_admin::schedule::{Schedule, ScheduleConfig, ScheduleDriver};
use bourse_admin::{AdminServer, AdminServerConfig, AdminService};
use bourse_auth::tls::TlsFiles;
use bourse_auth::{CredentialEntry, CredentialStore};
use bourse_cluster::admission::BULK_CLIENT_ID_MIN;
use bourse_cluster::tokio;
use bourse_venue::{VenueAdmin, ADMIN_CLIENT_ID_BASE, ADMIN_LANES};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The most cores (markets) one admin service serves.
pub const ADMIN_CORES_MAX: usize = 64;
/// The most nodes of one core.
pub const ADMIN_CORE_NODES_MAX: usize = 15;
/// How often the service looks for a stop and the schedule driver at the clock.
const POLL_MS: u64 = 100;

/// `admin.toml`; see the module documentation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// HTTPS on the listener; without it `listen` must be a loopback address.
    #[serde(default)]
    pub tls: Option<ListenerTls>,
    pub credentials_path: PathBuf,
    pub audit_log_path: PathBuf,
    pub cores: Vec<ServeCore>,
    #[serde(default)]
    pub schedule: Option<ScheduleConfig>,
}

/// The listener's certificate (chain, its own first) and key, PEM files. Operators' clients
/// check it against the authority that signed it (`bourse admin --ca`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTls {
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

/// One market's replica group.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeCore {
    pub name: String,
    /// The instruments the core owns, as the gateway's entry lists them. The service asks
    /// every core for an instrument it acts on, so this only has to be consistent.
    #[serde(default)]
    pub instruments: Vec<u32>,
    pub nodes: Vec<SocketAddr>,
    /// The first of the admin's two client ids at this core (`bourse_venue::ADMIN_LANES`);
    /// default `ADMIN_CLIENT_ID_BASE + 1000 × the core's place in the file`.
    pub client_id: Option<u64>,
    /// Mutual TLS to the nodes, as the gateway's `[[cores]]` entry takes it (relative paths
    /// from the config file's directory); needed for nodes off the loopback.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
}

/// The operators' credential store file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperatorsFile {
    operators: Vec<CredentialEntry>,
}

impl ServeConfig {
    /// Reads and checks the config; errors name the key (and TOML's line) that is wrong.
    pub fn parse(text: &str) -> Result<ServeConfig, String> {
        let config: ServeConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        if !self.listen.ip().is_loopback() && self.tls.is_none() {
            return Err(format!(
                "listen: {} is not a loopback address, and plain HTTP binds 127.0.0.1 or ::1 \
                 only (operators' passwords must not cross a network in clear); give tls \
                 (cert_path, key_path)",
                self.listen
            ));
        }
        if self.cores.is_empty() || self.cores.len() > ADMIN_CORES_MAX {
            return Err(format!(
                "cores: {} given, 1 to {ADMIN_CORES_MAX} allowed",
                self.cores.len()
            ));
        }
        let mut names = BTreeSet::new();
        let mut instruments = BTreeSet::new();
        let mut ids = BTreeSet::new();
        for (n, c) in self.cores.iter().enumerate() {
            let at = format!("cores[{n}]");
            if c.name.is_empty() || c.name.len() > 64 {
                return Err(format!("{at}.name: must have 1 to 64 bytes"));
            }
            if !names.insert(c.name.as_str()) {
                return Err(format!("{at}.name: market {:?} given twice", c.name));
            }
            if c.nodes.is_empty() || c.nodes.len() > ADMIN_CORE_NODES_MAX {
                return Err(format!(
                    "{at}.nodes: {} given, 1 to {ADMIN_CORE_NODES_MAX} allowed",
                    c.nodes.len()
                ));
            }
            if c.tls.is_none() {
                if let Some(a) = c.nodes.iter().find(|a| !a.ip().is_loopback()) {
                    return Err(format!(
                        "{at}.nodes: {a} is not a loopback address, and plain TCP goes to \
                         loopback nodes only; give {at}.tls (ca_path, cert_path, key_path)"
                    ));
                }
            }
            if let Some(i) = c.instruments.iter().find(|&&i| !instruments.insert(i)) {
                return Err(format!("{at}.instruments: instrument {i} is in two cores"));
            }
            let id = self.client_base(n);
            // TOML's integers end at i64::MAX, below clearing runs' ids (`0xC1EA << 48` on).
            if id < BULK_CLIENT_ID_MIN || id.checked_add(ADMIN_LANES as u64).is_none() {
                return Err(format!(
                    "{at}.client_id: {id} is not an admin client id ({BULK_CLIENT_ID_MIN} on)"
                ));
            }
            for lane in 0..ADMIN_LANES as u64 {
                if !ids.insert(id + lane) {
                    return Err(format!(
                        "{at}.client_id: {id} overlaps another core's ids (each core takes \
                         {ADMIN_LANES})"
                    ));
                }
            }
        }
        if let Some(s) = &self.schedule {
            let markets: Vec<&str> = self.cores.iter().map(|c| c.name.as_str()).collect();
            s.check(&markets)?;
        }
        Ok(())
    }

    /// Core `n`'s first admin client id.
    fn client_base(&self, n: usize) -> u64 {
        self.cores[n]
            .client_id
            .unwrap_or(ADMIN_CLIENT_ID_BASE + 1_000 * n as u64)
    }
}

/// Reads the operators' credential store (`[[operators]]` entries).
fn load_credentials(path: &Path) -> Result<CredentialStore> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let file: OperatorsFile =
        toml::from_str(&text).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    if file.operators.is_empty() {
        bail!("{}: no [[operators]]", path.display());
    }
    CredentialStore::from_entries(&file.operators).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Runs the service until interrupted.
pub fn serve(config_path: &Path) -> Result<()> {
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("read {}", config_path.display()))?;
    let config =
        ServeConfig::parse(&text).map_err(|e| anyhow!("{}: {e}", config_path.display()))?;
    let base = config_path.parent().unwrap_or(Path::new("."));
    let credentials = Arc::new(load_credentials(&base.join(&config.credentials_path))?);
    let audit_path = base.join(&config.audit_log_path);
    // Every connection to a node (the clients, the committed stream, status and queries)
    // dials through `bourse_cluster::transport`, which takes TLS for the nodes named here, as
    // `bourse gateway` does for its cores.
    for (n, c) in config.cores.iter().enumerate() {
        let tls = c.tls.as_ref().map(|t| TlsFiles {
            ca_path: base.join(&t.ca_path),
            cert_path: base.join(&t.cert_path),
            key_path: base.join(&t.key_path),
        });
        bourse_cluster::transport::configure_client(&c.nodes, tls.as_ref())
            .map_err(|e| anyhow!("{}: cores[{n}].tls: {e}", config_path.display()))?;
    }
    let cores = config
        .cores
        .iter()
        .enumerate()
        .map(|(n, c)| (c.name.clone(), c.nodes.clone(), config.client_base(n)))
        .collect();
    let venue = Arc::new(VenueAdmin::remote(cores));
    let mut server_config = AdminServerConfig::new(config.listen);
    if let Some(t) = &config.tls {
        let tls =
            bourse_auth::tls::server_config(&base.join(&t.cert_path), &base.join(&t.key_path))
                .map_err(|e| anyhow!("{}: tls: {e}", config_path.display()))?;
        server_config.tls = Some(tls);
    }
    let stop = crate::cluster_cmd::stop_flag();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async {
        let service = Arc::new(
            AdminService::new(venue, &audit_path, None)
                .with_context(|| format!("audit log {}", audit_path.display()))?,
        );
        let server = AdminServer::start(Arc::clone(&service), credentials, server_config)
            .await
            .with_context(|| format!("admin API on {}", config.listen))?;
        println!(
            "admin API: {} ({} market(s)); audit log {}",
            server.url(),
            config.cores.len(),
            audit_path.display()
        );
        let mut driver = match &config.schedule {
            Some(s) => {
                let schedule = Schedule::new(s).map_err(|e| anyhow!("schedule: {e}"))?;
                println!("schedule: driving the trading day from now on the wall clock");
                let mut driver = ScheduleDriver::new(
                    schedule,
                    Arc::clone(&service),
                    bourse_admin::service::unix_ns(),
                );
                // Started mid-day, each market goes to the phase the schedule says now.
                for (due, outcome) in driver.enter_phase_in_force().await {
                    println!(
                        "schedule in force since {} {} {:?}: {outcome}",
                        due.local, due.market, due.transition
                    );
                }
                Some(driver)
            }
            None => None,
        };
        while !stop.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
            if let Some(d) = &mut driver {
                for (due, outcome) in d.step(bourse_admin::service::unix_ns()).await {
                    println!(
                        "schedule {} {} {:?}: {outcome}",
                        due.local, due.market, due.transition
                    );
                }
            }
        }
        server.stop();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen = "127.0.0.1:0"
credentials_path = "operators.toml"
audit_log_path = "audit.jsonl"
[[cores]]
name = "equities"
instruments = [1, 2]
nodes = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
[[cores]]
name = "fx"
nodes = ["127.0.0.1:7101"]
client_id = 4611686018427392000
"#;

    #[test]
    fn a_good_config_reads_with_default_and_given_client_ids() {
        let c = ServeConfig::parse(GOOD).unwrap();
        assert_eq!(c.client_base(0), ADMIN_CLIENT_ID_BASE);
        assert_eq!(c.client_base(1), 4_611_686_018_427_392_000);
        assert!(c.schedule.is_none());
    }

    #[test]
    fn a_listener_off_the_loopback_is_taken_with_tls_and_refused_without() {
        let remote = GOOD.replace("127.0.0.1:0", "0.0.0.0:8443");
        let e = ServeConfig::parse(&remote).unwrap_err();
        assert!(
            e.contains("listen: 0.0.0.0:8443") && e.contains("tls"),
            "{e}"
        );
        let tls = "tls = { cert_path = \"api.crt\", key_path = \"api.key\" }\nlisten =";
        let c = ServeConfig::parse(&remote.replace("listen =", tls)).unwrap();
        assert_eq!(c.tls.unwrap().key_path, Path::new("api.key"));
    }

    #[test]
    fn nodes_off_the_loopback_are_taken_with_tls_and_refused_without() {
        let tls =
            "tls = { ca_path = \"ca.crt\", cert_path = \"admin.crt\", key_path = \"admin.key\" }";
        let remote = GOOD.replace("127.0.0.1:7101", "10.1.1.1:7101");
        let with_tls = remote.replace(
            "client_id = 4611686018427392000",
            &format!("client_id = 4611686018427392000\n{tls}"),
        );
        let c = ServeConfig::parse(&with_tls).unwrap();
        assert_eq!(
            c.cores[1].tls.as_ref().unwrap().cert_path,
            Path::new("admin.crt")
        );
        let e = ServeConfig::parse(&remote).unwrap_err();
        assert!(
            e.contains("cores[1].nodes: 10.1.1.1:7101") && e.contains("cores[1].tls"),
            "{e}"
        );
    }

    #[test]
    fn a_bad_config_is_refused_naming_the_key() {
        let cases = [
            (GOOD.replace("listen =", "listn ="), "listn"),
            (GOOD.replace("127.0.0.1:0", "10.0.0.1:80"), "listen: 10.0.0.1:80"),
            (GOOD.replace("127.0.0.1:7101", "10.1.1.1:7101"), "cores[1].nodes"),
            (GOOD.replace("name = \"fx\"", "name = \"equities\""), "cores[1].name"),
            (GOOD.replace("4611686018427392000", "5"), "cores[1].client_id"),
            (GOOD.replace("4611686018427392000", "4611686018427387905"), "cores[1].client_id"),
            (
                GOOD.replace("nodes = [\"127.0.0.1:7101\"]", "nodes = [\"127.0.0.1:7101\"]\ninstruments = [2]"),
                "cores[1].instruments",
            ),
            (
                format!("{GOOD}[schedule]\n[[schedule.markets]]\nmarket = \"futures\"\nsessions = []\nend_of_day = \"18:50\"\n"),
                "schedule.markets",
            ),
        ];
        for (text, named) in cases {
            let e = ServeConfig::parse(&text).unwrap_err();
            assert!(e.contains(named), "{named}: {e}");
        }
    }
}
