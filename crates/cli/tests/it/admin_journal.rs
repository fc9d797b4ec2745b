//! The journal says who asked: an admin action on a replicated venue (one market, a
//! three-node core) carries its operator and request id into the log entry, and
//! `bourse journal requests` shows them in the journal of every replica, the same on all three.

use bourse_admin::AdminClient;
use bourse_auth::{hash_password_with, CredentialEntry, CredentialStore, HashCost};
use bourse_core::*;
use bourse_engine::fixtures::equity;
use bourse_loadgen::gateway::SessionProtocol;
use bourse_venue::{Backend, DeploymentSpec, LocalDeployment, MarketSpec};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::Arc;

const SBER: u32 = 1;

fn start(dir: &Path) -> LocalDeployment {
    let instrument = equity(SBER, "SBER", 10_000);
    let setup = vec![
        CommandBody::AddInstrument(instrument.clone()),
        CommandBody::AddAccount(AccountSpec {
            account: AccountId(1),
            firm: FirmId(7),
            may_short: true,
            stp: StpMode::None,
            stp_scope: StpScope::Account,
        }),
    ];
    let spec = DeploymentSpec {
        markets: vec![MarketSpec {
            name: "equities".into(),
            instruments: vec![instrument],
            setup,
        }],
        backend: Backend::Cluster,
        protocol: SessionProtocol::Binary,
        gateways: 1,
        worker_sessions: vec![vec![vec![1]]],
        data_dir: dir.join("venue"),
        orders_max: 1_000,
        accounts_max: 1_000,
        fsync: bourse_cluster::FsyncSetting::Never,
        market_data: false,
        monitor: None,
        extra_fix_sessions: Vec::new(),
        verbose: false,
        core_in_flight_max: None,
        bounds: None,
    };
    LocalDeployment::start(spec).expect("venue starts")
}

/// `bourse journal requests --audited` of one journal: its lines after the header.
fn audited_requests(journal: &Path) -> Vec<String> {
    let out = Process::new(env!("CARGO_BIN_EXE_bourse"))
        .args(["journal", "requests", "--audited"])
        .arg(journal)
        .output()
        .expect("bourse runs");
    assert!(
        out.status.success(),
        "bourse journal requests {}: {}",
        journal.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines().skip(1).map(str::to_string).collect()
}

#[test]
fn an_admin_action_shows_its_operator_and_request_id_in_every_replicas_journal() {
    let dir = tempfile::tempdir().unwrap();
    let mut deployment = start(dir.path());
    let entries = [CredentialEntry {
        name: "alice".into(),
        password_hash: hash_password_with("alice-pw", HashCost::TEST_ONLY).unwrap(),
        roles: vec!["operator".into()],
    }];
    let store = Arc::new(CredentialStore::from_entries(&entries).unwrap());
    let (_, admin) = deployment
        .start_admin(
            store,
            &dir.path().join("audit.jsonl"),
            "127.0.0.1:0".parse().unwrap(),
            None,
        )
        .expect("admin starts");
    let client = AdminClient::new(&admin.url())
        .unwrap()
        .with_credentials("alice", "alice-pw");
    let halt = json!({"action": "set_phase", "instrument": SBER, "phase": "halted"});
    let reply = client.action("halt-sber-1", &halt).expect("admin answers");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let deposit = json!({"action": "deposit", "market": "equities", "account": 1, "amount": 5});
    let reply = client.action("deposit-1", &deposit).expect("admin answers");
    assert_eq!(reply.status, 200, "{}", reply.body);
    // The nodes stop with every applied entry in their journals.
    drop(admin);
    deployment.stop();

    let core = dir.path().join("venue").join("core-0-equities");
    let mut journals: Vec<PathBuf> = std::fs::read_dir(&core)
        .unwrap()
        .map(|e| e.unwrap().path().join("journal"))
        .filter(|p| p.is_dir())
        .collect();
    journals.sort();
    assert_eq!(journals.len(), 3, "three replicas' journals in {core:?}");
    let listings: Vec<Vec<String>> = journals.iter().map(|j| audited_requests(j)).collect();
    for (journal, lines) in journals.iter().zip(&listings) {
        assert_eq!(lines.len(), 2, "{}: {lines:#?}", journal.display());
        let fields: Vec<&str> = lines[0].split_whitespace().collect();
        assert_eq!(&fields[3..5], ["alice", "halt-sber-1"], "{}", lines[0]);
        assert!(lines[0].contains(r#""cmd":"set_phase""#), "{}", lines[0]);
        let fields: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(&fields[3..5], ["alice", "deposit-1"], "{}", lines[1]);
        assert!(lines[1].contains(r#""cmd":"deposit""#), "{}", lines[1]);
    }
    assert!(
        listings.windows(2).all(|w| w[0] == w[1]),
        "replicas' journals differ: {listings:#?}"
    );
}
