//! The gateway's configuration, read from TOML (see `examples/gateway.toml`).

use bourse_auth::PasswordHashString;
use bourse_core::{AccountId, FirmId, Instrument, InstrumentId};
use serde::Deserialize;
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

/// Hard ceilings that no configuration can raise: they bound what one process may hold.
pub const SESSIONS_MAX: usize = 1_000;
pub const CONNECTIONS_MAX_CEILING: usize = 10_000;
pub const ACCOUNTS_PER_SESSION_MAX: usize = 255;
pub const FIX_MESSAGE_SIZE_MAX_BYTES_CEILING: usize = 1 << 20;
/// Trading cores one gateway routes to.
pub const CORES_MAX: usize = 64;
/// Nodes of one replicated core.
pub const CORE_NODES_MAX: usize = 7;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    #[serde(default)]
    pub gateway: Limits,
    #[serde(default)]
    pub core: CoreConfig,
    /// The trading cores and the instruments each owns; none: one in-process core that owns
    /// every instrument (see [`GatewayConfig::core_plan`]).
    #[serde(default)]
    pub cores: Vec<CoreEntry>,
    #[serde(default)]
    pub instruments: Vec<Instrument>,
    #[serde(default)]
    pub accounts: Vec<AccountConfig>,
    #[serde(default)]
    pub fix_sessions: Vec<FixSessionConfig>,
    #[serde(default)]
    pub binary_sessions: Vec<BinarySessionConfig>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Where FIX clients connect; none: no FIX listener.
    pub fix_listen: Option<SocketAddr>,
    /// Where binary clients connect; none: no binary listener.
    pub binary_listen: Option<SocketAddr>,
    /// Where FIX clients connect over TLS (needs `tls_cert_path` and `tls_key_path`); none:
    /// no FIX TLS listener.
    pub fix_tls_listen: Option<SocketAddr>,
    /// Where binary clients connect over TLS; none: no binary TLS listener.
    pub binary_tls_listen: Option<SocketAddr>,
    /// The TLS listeners' certificate chain (PEM, leaf first).
    pub tls_cert_path: Option<PathBuf>,
    /// The TLS listeners' private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub tls_key_path: Option<PathBuf>,
    /// Where the passwords FIX clients change on Logon (NewPassword, 925) are kept; its
    /// entries replace the sessions' configured `password_hash` at start
    /// (`crate::password_store`). None: passwords are read-only and a change is refused.
    pub password_store_path: Option<PathBuf>,
    /// FIX session stores (sequence numbers and sent messages), one directory per session.
    pub store_dir: PathBuf,
    /// fsync the FIX stores on every write.
    pub store_sync: bool,
    /// Open TCP connections at once, both protocols. When it is reached, a new connection
    /// displaces the oldest one not logged on yet; only when every open connection is a
    /// logged-on session is it refused.
    pub connections_max: usize,
    /// Connections not logged on (established) yet, both protocols: their own small quota.
    /// When it is full a new connection displaces the oldest of them, so strangers cannot
    /// keep a configured session from logging on (`docs/gateway.md`, "Admission").
    pub prelogon_connections_max: usize,
    /// Connections not logged on yet from one source address; more are refused at once.
    pub prelogon_per_address_max: usize,
    /// Default throttle of every session, application messages per second.
    pub throttle_msgs_per_s: u32,
    pub fix_message_size_max_bytes: usize,
    /// A connection whose unsent output exceeds this is a slow consumer and is closed.
    pub outbound_buffer_max_bytes: usize,
    /// A connection that has not logged on / established within this long is closed (short:
    /// a client logs on right after it connects).
    pub logon_timeout_ms: u64,
    /// Commands waiting for the core; beyond it requests are refused as "system busy".
    pub core_queue_depth: usize,
    /// Commands submitted to one core and not yet answered (the whole path: the link's
    /// queue, its pipeline to the replica group, the group itself, the committed stream
    /// back). Beyond it requests are refused at once as "system busy" (counted as busy
    /// rejects), so an overload is refused at the door instead of queueing: a request never
    /// waits behind more than this many others, about this many divided by the core's rate.
    pub core_in_flight_max: usize,
    /// Messages kept per session for retransmission (binary) or resend (FIX store).
    pub stored_messages_max: usize,
    /// Messages queued for a FIX session while it is logged off.
    pub offline_messages_max: usize,
    /// FIX SendingTime accuracy, as QuickFIX's MaxLatency.
    pub sending_time_tolerance_ms: i64,
    /// Live orders the gateway tracks for all sessions together.
    pub orders_max: usize,
    /// Finished orders remembered for status requests, all sessions together, the oldest
    /// forgotten first (about 200 bytes each).
    pub finished_orders_kept: usize,
    /// Where the gateway serves Prometheus `/metrics` and the dashboard (read-only; any
    /// address, `127.0.0.1:PORT` keeps them on the host); none: no monitoring, and the event
    /// loop keeps no probes.
    pub monitor_listen: Option<SocketAddr>,
    /// Stage probes record one request in this many (0: counters only, no probes). 64 by
    /// default, as on the trading core: a sampled request costs two clock reads and a few
    /// histogram records, so 1 in 64 keeps the probes' share of the path well under 1%.
    pub monitor_sample_every: u32,
}

/// Commands in flight to one core by default: about 0.2 s of work for a replicated core that
/// carries 20,000 commands/s on this project's 2-CPU machine, and ten times what its batching
/// needs in flight to reach that rate (20,000/s × a 10-20 ms round trip).
pub const CORE_IN_FLIGHT_MAX_DEFAULT: usize = 4_096;

/// The most finished orders a gateway may be told to remember (about 200 bytes each: some
/// 3 GiB), so that a typo cannot ask for more memory than a machine has.
pub const FINISHED_ORDERS_KEPT_CEILING: usize = 1 << 24;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fix_listen: None,
            binary_listen: None,
            fix_tls_listen: None,
            binary_tls_listen: None,
            tls_cert_path: None,
            tls_key_path: None,
            password_store_path: None,
            store_dir: PathBuf::from("gateway-store"),
            store_sync: false,
            connections_max: 256,
            prelogon_connections_max: 64,
            prelogon_per_address_max: 8,
            throttle_msgs_per_s: 10_000,
            fix_message_size_max_bytes: 8 * 1024,
            outbound_buffer_max_bytes: 8 << 20,
            logon_timeout_ms: 2_000,
            core_queue_depth: 16_384,
            core_in_flight_max: CORE_IN_FLIGHT_MAX_DEFAULT,
            stored_messages_max: 100_000,
            offline_messages_max: 100_000,
            sending_time_tolerance_ms: 120_000,
            orders_max: 1 << 20,
            finished_orders_kept: crate::router::FINISHED_ORDERS_KEPT,
            monitor_listen: None,
            monitor_sample_every: 64,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CoreConfig {
    /// Create the instruments and accounts of this file in the cores at start (an in-process
    /// core starts empty). Bootstrap is idempotent: an instrument or account the core already
    /// has is left as it is (and its cash is not deposited again), so a gateway restart in
    /// front of a replicated core adds nothing twice. A `[[cores]]` entry may override it.
    pub bootstrap: bool,
}

/// One trading core behind the gateway: the instruments it owns and how to reach it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CoreEntry {
    /// The core's name in logs and metrics ("equities").
    pub name: String,
    /// Instruments (by id) this core owns; each instrument of the file belongs to one core.
    #[serde(default)]
    pub instruments: Vec<InstrumentId>,
    /// The core runs inside the gateway's process (an engine on its own thread).
    #[serde(default)]
    pub in_process: bool,
    /// The client addresses of the core's replica group (`bourse node`), for a replicated core.
    #[serde(default)]
    pub nodes: Vec<SocketAddr>,
    /// The gateway's client id at the replicated core: the namespace of its idempotency keys.
    /// Two gateways in front of one core need different ids.
    pub client_id: Option<u64>,
    /// Overrides `[core] bootstrap` for this core.
    pub bootstrap: Option<bool>,
    /// Mutual TLS to the core's nodes (`tls = { ca_path, cert_path, key_path }`: the venue's
    /// authority, the gateway's certificate and key). Without it the link is plain TCP, which
    /// only loopback node addresses allow.
    #[serde(default)]
    pub tls: Option<bourse_auth::tls::TlsFiles>,
}

impl CoreEntry {
    /// Whether the gateway bootstraps this core, given the file's `[core]` default.
    pub fn bootstraps(&self, default: bool) -> bool {
        self.bootstrap.unwrap_or(default)
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountConfig {
    pub account: AccountId,
    pub firm: FirmId,
    /// Cash deposited at bootstrap, in cash units (10^-4).
    #[serde(default)]
    pub cash: i64,
    #[serde(default)]
    pub may_short: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixSessionConfig {
    /// The client's CompID (its SenderCompID, our TargetCompID).
    pub client_comp_id: String,
    /// Our CompID on this session (the client's TargetCompID).
    #[serde(default = "default_gateway_comp_id")]
    pub gateway_comp_id: String,
    pub firm: FirmId,
    /// Accounts the session may trade; the first is used when a message names none. None
    /// listed: the session trades every account of its `firm`, accounts added at run time
    /// included (the core checks the firm), and each order must name its account.
    #[serde(default)]
    pub accounts: Vec<AccountId>,
    /// A drop-copy session receives every execution report of its firm and may not trade.
    #[serde(default)]
    pub drop_copy: bool,
    /// Overrides the default throttle.
    pub throttle_msgs_per_s: Option<u32>,
    /// Source addresses the session may log on from; with `allowed_sources`, empty: any.
    #[serde(default)]
    pub allowed_addresses: Vec<IpAddr>,
    /// Source networks (CIDR, e.g. `"10.1.0.0/16"`) the session may log on from: the firm's
    /// registered networks. Their connections are never displaced by strangers from
    /// elsewhere, and keep a place of `connections_max` for the session (docs/admission.md).
    #[serde(default)]
    pub allowed_sources: Vec<String>,
    /// The Argon2id hash (PHC string, `bourse auth hash-password`) of the password the
    /// client must send in Logon's Password (554); none: no password is asked for.
    pub password_hash: Option<PasswordHashString>,
    /// The session logs on only over the FIX TLS listener (`fix_tls_listen`).
    #[serde(default)]
    pub tls_required: bool,
}

/// A session's registered networks: its `allowed_addresses` (each a network of one) and its
/// `allowed_sources`; empty: it may log on from anywhere.
pub fn allowed_networks(
    addresses: &[IpAddr],
    sources: &[String],
) -> Result<Vec<bourse_admission::Cidr>, String> {
    let one = addresses.iter().map(|a| a.to_string().parse());
    one.chain(sources.iter().map(|s| s.parse())).collect()
}

impl GatewayConfig {
    /// Every session's registered networks, and how many sessions have some (each keeps a
    /// place its networks alone may take).
    pub fn registered_networks(&self) -> (Vec<bourse_admission::Cidr>, usize) {
        let fix = self
            .fix_sessions
            .iter()
            .map(|s| (&s.allowed_addresses, &s.allowed_sources));
        let bin = self
            .binary_sessions
            .iter()
            .map(|s| (&s.allowed_addresses, &s.allowed_sources));
        let mut networks = Vec::new();
        let mut sessions = 0;
        for (addresses, sources) in fix.chain(bin) {
            let mine = allowed_networks(addresses, sources).unwrap_or_default();
            if !mine.is_empty() {
                sessions += 1;
            }
            for n in mine {
                if !networks.contains(&n) {
                    networks.push(n);
                }
            }
        }
        (networks, sessions)
    }

    /// The admission limits of the gateway's ports (one table for both, plain and TLS).
    pub fn admission(&self) -> bourse_admission::Limits {
        let g = &self.gateway;
        let (registered, registered_reserved) = self.registered_networks();
        bourse_admission::Limits {
            strangers_max: g.prelogon_connections_max.min(g.connections_max),
            registered,
            registered_reserved,
            ..bourse_admission::Limits::new(
                g.connections_max,
                g.prelogon_per_address_max,
                g.logon_timeout_ms,
            )
        }
    }
}

fn default_gateway_comp_id() -> String {
    "BOURSE".into()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BinarySessionConfig {
    /// Sent in Establish (at most 32 ASCII bytes).
    pub credentials: String,
    pub firm: FirmId,
    /// As a FIX session's `accounts`: a restriction to these, or, empty, every account of
    /// the firm (each order then names its account).
    #[serde(default)]
    pub accounts: Vec<AccountId>,
    pub throttle_msgs_per_s: Option<u32>,
    /// Source addresses the session may establish from; with `allowed_sources`, empty: any.
    #[serde(default)]
    pub allowed_addresses: Vec<IpAddr>,
    /// Source networks (CIDR) the session may establish from, as a FIX session's.
    #[serde(default)]
    pub allowed_sources: Vec<String>,
    /// The Argon2id hash (PHC string) of the password the client must send in Establish's
    /// `password` (schema version 2; at most 32 printable ASCII bytes); none: no password.
    pub password_hash: Option<PasswordHashString>,
    /// The session establishes only over the binary TLS listener (`binary_tls_listen`).
    #[serde(default)]
    pub tls_required: bool,
}

impl GatewayConfig {
    /// The cores as the gateway runs them: the `[[cores]]` of the file, or, without any, one
    /// in-process core named "core" that owns every instrument. Index `i` of this list is the
    /// core's index (its engine numbers orders from `i << ORDER_ID_CORE_SHIFT`).
    pub fn core_plan(&self) -> Vec<CoreEntry> {
        if !self.cores.is_empty() {
            return self.cores.clone();
        }
        vec![CoreEntry {
            name: "core".into(),
            instruments: self.instruments.iter().map(|i| i.instrument).collect(),
            in_process: true,
            nodes: Vec::new(),
            client_id: None,
            bootstrap: None,
            tls: None,
        }]
    }

    fn validate_cores(&self) -> Result<(), String> {
        if self.cores.is_empty() {
            return Ok(());
        }
        if self.cores.len() > CORES_MAX {
            return Err(format!("at most {CORES_MAX} cores"));
        }
        let defined: HashSet<InstrumentId> =
            self.instruments.iter().map(|i| i.instrument).collect();
        let mut owned: HashSet<InstrumentId> = HashSet::new();
        let mut names = HashSet::new();
        for c in &self.cores {
            if c.name.is_empty() || c.name.len() > 64 {
                return Err("cores: name must have 1 to 64 bytes".into());
            }
            if !names.insert(c.name.clone()) {
                return Err(format!("core {} defined twice", c.name));
            }
            match (c.in_process, c.nodes.is_empty()) {
                (true, false) => {
                    return Err(format!(
                        "core {}: either in_process = true or nodes, not both",
                        c.name
                    ))
                }
                (false, true) => {
                    return Err(format!(
                        "core {}: set in_process = true or the nodes of its replica group",
                        c.name
                    ))
                }
                _ => {}
            }
            if c.nodes.len() > CORE_NODES_MAX {
                return Err(format!("core {}: at most {CORE_NODES_MAX} nodes", c.name));
            }
            // Plain TCP never leaves the host: a node elsewhere is reached over mutual TLS.
            if c.tls.is_none() {
                if let Some(a) = c.nodes.iter().find(|a| !a.ip().is_loopback()) {
                    return Err(format!(
                        "core {}: node {a} is not on the loopback, so the link needs \
                         tls = {{ ca_path, cert_path, key_path }} (docs/deploy.md)",
                        c.name
                    ));
                }
            }
            if !c.nodes.is_empty() && c.client_id.is_none() {
                return Err(format!(
                    "core {}: a replicated core needs the link's client_id",
                    c.name
                ));
            }
            // The upper half of the id at the core is the gateway's restart epoch
            // (`crate::recovery`).
            if c.client_id
                .is_some_and(|id| id == 0 || id > u64::from(u32::MAX))
            {
                return Err(format!(
                    "core {}: client_id must be from 1 to {}",
                    c.name,
                    u32::MAX
                ));
            }
            for i in &c.instruments {
                if !defined.contains(i) {
                    return Err(format!(
                        "core {}: instrument {} is not defined in [[instruments]]",
                        c.name, i.0
                    ));
                }
                if !owned.insert(*i) {
                    return Err(format!("instrument {} belongs to more than one core", i.0));
                }
            }
        }
        if let Some(i) = self
            .instruments
            .iter()
            .find(|i| !owned.contains(&i.instrument))
        {
            return Err(format!(
                "instrument {} belongs to no core: list it in one [[cores]] entry",
                i.symbol
            ));
        }
        Ok(())
    }

    pub fn from_toml(text: &str) -> Result<GatewayConfig, String> {
        let config: GatewayConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        config.validate()?;
        Ok(config)
    }

    pub fn from_file(path: &std::path::Path) -> Result<GatewayConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Checks everything that would otherwise fail later, with a message naming the entry.
    pub fn validate(&self) -> Result<(), String> {
        let g = &self.gateway;
        if g.fix_listen.is_none()
            && g.binary_listen.is_none()
            && g.fix_tls_listen.is_none()
            && g.binary_tls_listen.is_none()
        {
            return Err(
                "gateway: set fix_listen, binary_listen, fix_tls_listen and/or binary_tls_listen"
                    .into(),
            );
        }
        let tls_listen = g.fix_tls_listen.is_some() || g.binary_tls_listen.is_some();
        let tls_files = (g.tls_cert_path.is_some(), g.tls_key_path.is_some());
        match (tls_listen, tls_files) {
            (true, (true, true)) | (false, (false, false)) => {}
            (true, _) => {
                return Err(
                    "gateway: fix_tls_listen/binary_tls_listen need tls_cert_path and tls_key_path"
                        .into(),
                )
            }
            (false, _) => {
                return Err(
                    "gateway: tls_cert_path and tls_key_path go with fix_tls_listen or binary_tls_listen"
                        .into(),
                )
            }
        }
        if g.connections_max == 0 || g.connections_max > CONNECTIONS_MAX_CEILING {
            return Err(format!(
                "gateway.connections_max must be in 1..={CONNECTIONS_MAX_CEILING}"
            ));
        }
        if g.prelogon_connections_max == 0 || g.prelogon_per_address_max == 0 {
            return Err(
                "gateway.prelogon_connections_max and prelogon_per_address_max must be positive"
                    .into(),
            );
        }
        if g.logon_timeout_ms == 0 || g.logon_timeout_ms > 60_000 {
            return Err("gateway.logon_timeout_ms must be in 1..=60000".into());
        }
        if g.fix_message_size_max_bytes < 256
            || g.fix_message_size_max_bytes > FIX_MESSAGE_SIZE_MAX_BYTES_CEILING
        {
            return Err(format!(
                "gateway.fix_message_size_max_bytes must be in 256..={FIX_MESSAGE_SIZE_MAX_BYTES_CEILING}"
            ));
        }
        if g.throttle_msgs_per_s == 0
            || g.core_queue_depth == 0
            || g.core_in_flight_max == 0
            || g.stored_messages_max == 0
        {
            return Err(
                "gateway: throttle, queue depth, core_in_flight_max and stored messages must be positive".into(),
            );
        }
        if g.finished_orders_kept == 0 || g.finished_orders_kept > FINISHED_ORDERS_KEPT_CEILING {
            return Err(format!(
                "gateway.finished_orders_kept = {}: must be in 1..={FINISHED_ORDERS_KEPT_CEILING}",
                g.finished_orders_kept
            ));
        }
        if let Some(a) = g.monitor_listen {
            // Any address the operator names: the endpoints only read (GET `/metrics`, the
            // dashboard and its event stream), nothing on them changes the gateway.
            if a.ip().is_multicast() {
                return Err(format!(
                    "gateway.monitor_listen = {a}: a multicast group cannot be listened on"
                ));
            }
        }
        if g.outbound_buffer_max_bytes < 64 * 1024 {
            return Err("gateway.outbound_buffer_max_bytes must be at least 65536".into());
        }
        if self.fix_sessions.len() + self.binary_sessions.len() > SESSIONS_MAX {
            return Err(format!("at most {SESSIONS_MAX} sessions"));
        }
        for s in &self.fix_sessions {
            allowed_networks(&s.allowed_addresses, &s.allowed_sources)
                .map_err(|e| format!("FIX session {}: allowed_sources: {e}", s.client_comp_id))?;
        }
        for s in &self.binary_sessions {
            allowed_networks(&s.allowed_addresses, &s.allowed_sources)
                .map_err(|e| format!("binary session {}: allowed_sources: {e}", s.credentials))?;
        }
        self.admission().validate("gateway")?;
        let mut symbols = HashSet::new();
        let mut ids: HashSet<InstrumentId> = HashSet::new();
        for i in &self.instruments {
            i.validate()
                .map_err(|e| format!("instrument {}: {e}", i.symbol))?;
            if !symbols.insert(i.symbol.clone()) || !ids.insert(i.instrument) {
                return Err(format!("instrument {} defined twice", i.symbol));
            }
        }
        self.validate_cores()?;
        let mut comp_ids = HashSet::new();
        for s in &self.fix_sessions {
            if s.client_comp_id.is_empty() || s.client_comp_id.len() > 64 {
                return Err("fix_sessions: client_comp_id must have 1 to 64 bytes".into());
            }
            if !comp_ids.insert((s.client_comp_id.clone(), s.gateway_comp_id.clone())) {
                return Err(format!("fix session {} defined twice", s.client_comp_id));
            }
            if s.accounts.len() > ACCOUNTS_PER_SESSION_MAX {
                return Err(format!(
                    "fix session {}: too many accounts",
                    s.client_comp_id
                ));
            }
            if s.throttle_msgs_per_s == Some(0) {
                return Err(format!("fix session {}: throttle 0", s.client_comp_id));
            }
            if s.tls_required && g.fix_tls_listen.is_none() {
                return Err(format!(
                    "fix session {}: tls_required without fix_tls_listen",
                    s.client_comp_id
                ));
            }
        }
        let mut creds = HashSet::new();
        for s in &self.binary_sessions {
            if s.credentials.is_empty()
                || s.credentials.len() > bourse_wire::order_entry::CREDENTIALS_BYTES
                || !s.credentials.bytes().all(|b| (0x21..0x7f).contains(&b))
            {
                return Err(
                    "binary_sessions: credentials must be 1 to 32 printable ASCII bytes".into(),
                );
            }
            if !creds.insert(s.credentials.clone()) {
                return Err(format!("binary session {} defined twice", s.credentials));
            }
            if s.accounts.len() > ACCOUNTS_PER_SESSION_MAX {
                return Err(format!(
                    "binary session {}: at most 255 accounts",
                    s.credentials
                ));
            }
            if s.throttle_msgs_per_s == Some(0) {
                return Err(format!("binary session {}: throttle 0", s.credentials));
            }
            if s.tls_required && g.binary_tls_listen.is_none() {
                return Err(format!(
                    "binary session {}: tls_required without binary_tls_listen",
                    s.credentials
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_config_is_valid() {
        let text = include_str!("../../../examples/gateway.toml");
        let c = GatewayConfig::from_toml(text).unwrap();
        assert_eq!(c.fix_sessions.len(), 3);
        assert_eq!(c.binary_sessions.len(), 2);
        assert!(c.fix_sessions[2].drop_copy);
    }

    #[test]
    fn a_misspelled_key_in_any_table_is_refused_naming_its_line_and_field() {
        let example = include_str!("../../../examples/gateway.toml");
        for (table, key) in [
            ("[gateway]", "fix_listen_adr"),
            ("[[instruments]]", "lot_sise"),
            ("[[accounts]]", "firmm"),
            ("[[fix_sessions]]", "sender_comp"),
            ("[[binary_sessions]]", "credential"),
        ] {
            let at = example.find(table).expect(table) + table.len();
            let text = format!("{}\n{key} = 1{}", &example[..at], &example[at..]);
            let line = text[..at].lines().count() + 1;
            let e = GatewayConfig::from_toml(&text).unwrap_err();
            assert!(
                e.contains(&format!("unknown field `{key}`")),
                "{table}: {e}"
            );
            assert!(e.contains(&format!("line {line}")), "{table}: {e}");
        }
    }

    const TWO_CORES: &str = r#"
[gateway]
fix_listen = "127.0.0.1:0"
[[cores]]
name = "equities"
instruments = [1]
in_process = true
[[cores]]
name = "fx"
instruments = [2]
nodes = ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]
client_id = 7
[[instruments]]
instrument = 1
symbol = "SBER"
market = "equity"
price_scale = 2
tick = 1
lot_size = 10
band_bps = 2000
reference_price = 25000
[[instruments]]
instrument = 2
symbol = "EURUSD"
market = "fx"
price_scale = 5
tick = 1
lot_size = 1000
band_bps = 500
reference_price = 108000
"#;

    #[test]
    fn a_core_off_the_loopback_is_reached_only_over_tls() {
        let remote = TWO_CORES.replace("127.0.0.1:7102", "10.1.0.12:7101");
        let err = GatewayConfig::from_toml(&remote).unwrap_err();
        assert!(
            err.contains("core fx: node 10.1.0.12:7101 is not on the loopback")
                && err.contains("tls"),
            "{err}"
        );
        let with_tls = remote.replace(
            "client_id = 7\n",
            "client_id = 7\ntls = { ca_path = \"ca.crt\", cert_path = \"gw.crt\", key_path = \"gw.key\" }\n",
        );
        let c = GatewayConfig::from_toml(&with_tls).unwrap();
        let tls = c.core_plan()[1].tls.clone().unwrap();
        assert_eq!(tls.cert_path, std::path::PathBuf::from("gw.crt"));
        let typo = with_tls.replace("key_path", "keypath");
        assert!(GatewayConfig::from_toml(&typo)
            .unwrap_err()
            .contains("keypath"));
    }

    #[test]
    fn cores_own_instruments_and_every_instrument_has_one_core() {
        let c = GatewayConfig::from_toml(TWO_CORES).unwrap();
        let plan = c.core_plan();
        assert_eq!(plan.len(), 2);
        assert_eq!(plan[1].nodes.len(), 3);
        assert_eq!(plan[1].client_id, Some(7));
        let orphan = TWO_CORES.replace("instruments = [2]", "instruments = []");
        let err = GatewayConfig::from_toml(&orphan).unwrap_err();
        assert!(err.contains("EURUSD belongs to no core"), "{err}");
        let twice = TWO_CORES.replace("instruments = [2]", "instruments = [2, 1]");
        let err = GatewayConfig::from_toml(&twice).unwrap_err();
        assert!(err.contains("more than one core"), "{err}");
        let no_id = TWO_CORES.replace("client_id = 7", "");
        let err = GatewayConfig::from_toml(&no_id).unwrap_err();
        assert!(err.contains("client_id"), "{err}");
        let neither = TWO_CORES.replace("in_process = true", "");
        let err = GatewayConfig::from_toml(&neither).unwrap_err();
        assert!(err.contains("in_process = true or the nodes"), "{err}");
        let unknown = TWO_CORES.replace("instruments = [1]", "instruments = [1, 9]");
        let err = GatewayConfig::from_toml(&unknown).unwrap_err();
        assert!(err.contains("instrument 9 is not defined"), "{err}");
    }

    #[test]
    fn without_cores_one_in_process_core_owns_everything() {
        let text = include_str!("../../../examples/gateway.toml");
        let c = GatewayConfig::from_toml(text).unwrap();
        let plan = c.core_plan();
        assert_eq!(plan.len(), 1);
        assert!(plan[0].in_process);
        assert_eq!(plan[0].instruments.len(), c.instruments.len());
    }

    #[test]
    fn the_monitor_listens_where_configured_but_not_on_a_group() {
        let text = "[gateway]\nfix_listen = \"127.0.0.1:0\"\nmonitor_listen = \"0.0.0.0:9100\"\n";
        let c = GatewayConfig::from_toml(text).unwrap();
        assert_eq!(
            c.gateway.monitor_listen,
            Some("0.0.0.0:9100".parse().unwrap())
        );
        let text = text.replace("0.0.0.0", "239.1.1.1");
        let err = GatewayConfig::from_toml(&text).unwrap_err();
        assert!(
            err.contains("monitor_listen") && err.contains("multicast"),
            "{err}"
        );
    }

    #[test]
    fn finished_orders_kept_defaults_to_the_router_bound_and_is_checked_at_start() {
        let base = "[gateway]\nfix_listen = \"127.0.0.1:0\"\n";
        let c = GatewayConfig::from_toml(base).unwrap();
        assert_eq!(
            c.gateway.finished_orders_kept,
            crate::router::FINISHED_ORDERS_KEPT
        );
        let c = GatewayConfig::from_toml(&format!("{base}finished_orders_kept = 100\n")).unwrap();
        assert_eq!(c.gateway.finished_orders_kept, 100);
        for bad in [0, FINISHED_ORDERS_KEPT_CEILING + 1] {
            let err = GatewayConfig::from_toml(&format!("{base}finished_orders_kept = {bad}\n"))
                .unwrap_err();
            assert!(
                err.contains(&format!("gateway.finished_orders_kept = {bad}")),
                "{err}"
            );
        }
    }

    #[test]
    fn tls_listeners_and_their_certificate_come_together() {
        let base = "[gateway]\nfix_listen = \"127.0.0.1:0\"\n";
        let no_files = format!("{base}fix_tls_listen = \"127.0.0.1:0\"\n");
        let err = GatewayConfig::from_toml(&no_files).unwrap_err();
        assert!(err.contains("need tls_cert_path and tls_key_path"), "{err}");
        let no_listener = format!("{base}tls_cert_path = \"c.pem\"\ntls_key_path = \"k.pem\"\n");
        let err = GatewayConfig::from_toml(&no_listener).unwrap_err();
        assert!(err.contains("go with fix_tls_listen"), "{err}");
        let tls_only = "[gateway]\nbinary_tls_listen = \"127.0.0.1:0\"\ntls_cert_path = \"c.pem\"\ntls_key_path = \"k.pem\"\n";
        assert!(GatewayConfig::from_toml(tls_only).is_ok());
    }

    #[test]
    fn a_password_hash_that_is_not_argon2id_is_refused_naming_the_field() {
        let text = r#"
[gateway]
fix_listen = "127.0.0.1:0"
[[fix_sessions]]
client_comp_id = "X"
firm = 1
accounts = [1]
password_hash = "secret"
"#;
        let err = GatewayConfig::from_toml(text).unwrap_err();
        assert!(
            err.contains("password_hash") || err.contains("PHC"),
            "{err}"
        );
    }

    #[test]
    fn a_trading_session_without_accounts_trades_for_its_whole_firm() {
        let text = r#"
[gateway]
fix_listen = "127.0.0.1:0"
binary_listen = "127.0.0.1:0"
[[fix_sessions]]
client_comp_id = "X"
firm = 1
[[binary_sessions]]
credentials = "B"
firm = 2
"#;
        let c = GatewayConfig::from_toml(text).expect("a session entitled by firm is valid");
        assert!(c.fix_sessions[0].accounts.is_empty());
        assert!(c.binary_sessions[0].accounts.is_empty());
    }
}
