//! A FIX client changes its session's password on Logon (NewPassword, 925): with a password
//! store the change is checked (the old password first), written to the store, and holds after
//! a restart; without one the Logon is refused saying passwords are read-only. Whoever does
//! not know the old password learns nothing, whether the session exists or not.

use crate::common;

use bourse_auth::HashCost;
use bourse_client::{FixClient, FixClientConfig};
use std::path::Path;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

fn config(store: Option<&Path>) -> String {
    let hash = bourse_auth::hash_password_with("alpha old", HashCost::TEST_ONLY).unwrap();
    let store_line = store
        .map(|p| format!("password_store_path = \"{}\"\n", p.display()))
        .unwrap_or_default();
    common::CONFIG
        .replace(
            "connections_max = 64\n",
            &format!("connections_max = 64\nmonitor_listen = \"127.0.0.1:0\"\n{store_line}"),
        )
        .replace(
            "client_comp_id = \"ALPHA\"\n",
            &format!("client_comp_id = \"ALPHA\"\npassword_hash = \"{hash}\"\n"),
        )
}

fn metric(gw: &common::TestGateway, reason: &str) -> u64 {
    let text = gw.handle.monitor().unwrap().render_metrics();
    let key = format!("bourse_gateway_disconnects_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

fn logon(
    gw: &common::TestGateway,
    sender: &str,
    password: &str,
    new_password: Option<&str>,
) -> Result<FixClient, String> {
    let mut c = FixClientConfig::new(gw.handle.fix_addr().unwrap(), sender, "BOURSE");
    c.password = Some(password.into());
    c.new_password = new_password.map(str::to_string);
    // Each logon here is a new client with its numbers in memory: start both sides from 1.
    c.reset_on_logon = true;
    FixClient::connect(&c).map_err(|e| e.to_string())
}

#[test]
fn a_new_password_replaces_the_old_one_in_the_store_and_holds_after_a_restart() {
    let files = tempfile::tempdir().unwrap();
    let store = files.path().join("passwords.toml");
    let text = config(Some(&store));
    let gw = common::start_with(&text);

    // The old password must be right for the change to happen.
    let guess = logon(&gw, "ALPHA", "guess", Some("alpha new"))
        .err()
        .expect("refused");
    assert!(guess.contains("Invalid password"), "{guess}");
    assert!(!store.exists(), "nothing is written for a wrong password");

    let mut alpha = logon(&gw, "ALPHA", "alpha old", Some("alpha new")).unwrap();
    alpha
        .new_order("o1", None, "SBER", true, 10, Some("100.00"), '0')
        .unwrap();
    assert!(alpha.recv_type("8", WAIT).unwrap().is_some());
    alpha.logout(WAIT).unwrap();
    assert!(common::eventually(WAIT, || metric(&gw, "logout") >= 1));

    let old = logon(&gw, "ALPHA", "alpha old", None)
        .err()
        .expect("refused");
    assert!(old.contains("Invalid password"), "{old}");
    logon(&gw, "ALPHA", "alpha new", None)
        .unwrap()
        .logout(WAIT)
        .unwrap();
    let on_disk = std::fs::read_to_string(&store).unwrap();
    assert!(on_disk.contains("client_comp_id = \"ALPHA\""), "{on_disk}");
    assert!(!on_disk.contains("alpha new"), "only the hash is kept");
    drop(gw);

    // A new gateway from the same configuration reads the store: the change holds.
    let again = common::start_with(&text);
    let old = logon(&again, "ALPHA", "alpha old", None)
        .err()
        .expect("refused");
    assert!(old.contains("Invalid password"), "{old}");
    logon(&again, "ALPHA", "alpha new", None)
        .unwrap()
        .logout(WAIT)
        .unwrap();
}

#[test]
fn without_a_store_a_change_is_refused_as_read_only_after_the_old_password_is_checked() {
    let gw = common::start_with(&config(None));
    let refused = logon(&gw, "ALPHA", "alpha old", Some("alpha new"))
        .err()
        .expect("refused");
    assert!(refused.contains("read-only"), "{refused}");
    assert!(common::eventually(WAIT, || metric(&gw, "logon_refused") == 1));
    // A wrong old password is told only that; so is a session that does not exist.
    let wrong = logon(&gw, "ALPHA", "guess", Some("alpha new"))
        .err()
        .expect("refused");
    let ghost = logon(&gw, "GHOST", "guess", Some("alpha new"))
        .err()
        .expect("refused");
    assert!(wrong.contains("Invalid password"), "{wrong}");
    assert!(ghost.contains("Invalid password"), "{ghost}");
    // Nothing changed.
    logon(&gw, "ALPHA", "alpha old", None)
        .unwrap()
        .logout(WAIT)
        .unwrap();
}

#[test]
fn a_session_without_a_password_cannot_be_given_one_by_its_client() {
    let files = tempfile::tempdir().unwrap();
    let store = files.path().join("passwords.toml");
    let gw = common::start_with(&config(Some(&store)));
    let refused = logon(&gw, "BETA", "anything", Some("mine now"))
        .err()
        .expect("refused");
    assert!(refused.contains("no password to change"), "{refused}");
    assert!(!store.exists());
}
