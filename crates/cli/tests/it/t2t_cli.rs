//! `bourse t2t` end to end as a user runs it: a generated capture, the driver and the client
//! as two processes, the checks the driver prints, and clear errors for bad input.

use std::process::{Command, Stdio};

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

#[test]
fn drive_and_client_processes_agree_on_every_order() {
    drive_and_client_agree("sbe");
}

#[test]
fn drive_and_client_processes_agree_on_every_order_of_an_itch_capture() {
    drive_and_client_agree("itch");
}

/// `gen --format FEED`, then `drive --feed FEED` and `client --feed FEED` as two processes.
fn drive_and_client_agree(feed: &str) {
    let dir = tempfile::tempdir().unwrap();
    let capture = dir.path().join("gen.pcap");
    let both = dir.path().join("both.pcap");
    let gen = Command::new(BOURSE)
        .args([
            "t2t",
            "gen",
            "--format",
            feed,
            "--packets",
            "1500",
            "--updates",
            "1-16",
            "--out",
        ])
        .arg(&capture)
        .output()
        .unwrap();
    assert!(
        gen.status.success(),
        "{}",
        String::from_utf8_lossy(&gen.stderr)
    );
    let [md, fix] = bourse_testkit::free_ports::<2>();
    let driver = Command::new(BOURSE)
        .args([
            "t2t",
            "drive",
            "--feed",
            feed,
            "--json",
            "--timeout-ms",
            "20000",
            "--accept-timeout-ms",
            "60000",
        ])
        .arg("--capture")
        .arg(&capture)
        .args([
            "--target",
            &format!("127.0.0.1:{md}"),
            "--listen",
            &fix.to_string(),
        ])
        .arg("--out-pcap")
        .arg(&both)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = Command::new(BOURSE)
        .args([
            "t2t",
            "client",
            "--feed",
            feed,
            "--json",
            "--md",
            &md.to_string(),
        ])
        .args(["--fix", &format!("127.0.0.1:{fix}")])
        .output()
        .unwrap();
    let driver = driver.wait_with_output().unwrap();
    assert!(
        driver.status.success(),
        "driver: {}",
        String::from_utf8_lossy(&driver.stderr)
    );
    assert!(
        client.status.success(),
        "client: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    let d = json(&driver.stdout);
    let c = json(&client.stdout);
    assert_eq!(d["packets_sent"], 1500);
    assert!(d["orders_expected"].as_u64().unwrap() > 10);
    assert_eq!(d["orders_matching"], d["orders_expected"]);
    assert_eq!(d["orders_received"], d["orders_expected"]);
    assert_eq!(d["packets_wrong"], 0);
    assert_eq!(c["stats"]["orders"], d["orders_expected"]);
    assert_eq!(c["stats"]["packets"], 1500);
    assert!(std::fs::metadata(&both).unwrap().len() > 0);
}

#[test]
fn bad_input_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.pcap");
    let gen = Command::new(BOURSE)
        .args([
            "t2t",
            "gen",
            "--packets",
            "10",
            "--updates",
            "1-128",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!gen.status.success());
    assert!(
        String::from_utf8_lossy(&gen.stderr).contains("above the packet limit of 1472"),
        "{}",
        String::from_utf8_lossy(&gen.stderr)
    );
    let not_pcap = dir.path().join("not.pcap");
    std::fs::write(&not_pcap, b"this is not a capture at all, just text").unwrap();
    let drive = Command::new(BOURSE)
        .args([
            "t2t",
            "drive",
            "--target",
            "127.0.0.1:9",
            "--listen",
            "0",
            "--capture",
        ])
        .arg(&not_pcap)
        .output()
        .unwrap();
    assert!(!drive.status.success());
    assert!(
        String::from_utf8_lossy(&drive.stderr).contains("not a classic pcap file"),
        "{}",
        String::from_utf8_lossy(&drive.stderr)
    );
}

#[test]
fn a_client_limit_beyond_the_memory_is_refused_by_its_flag_not_by_an_abort() {
    let client = |extra: &[&str]| {
        let run = Command::new(BOURSE)
            .args(["t2t", "client", "--md", "0", "--fix", "127.0.0.1:9"])
            .args(extra)
            .output()
            .unwrap();
        (
            run.status.code(),
            String::from_utf8_lossy(&run.stderr).into_owned(),
        )
    };
    // Some 280 GiB of books, allocated and written at start, used to abort the process.
    let (code, stderr) = client(&["--orders-max", "4000000000"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--orders-max 4000000000 needs "),
        "{stderr}"
    );
    assert!(stderr.contains("available; at most "), "{stderr}");
    let (code, stderr) = client(&["--orders-max", &usize::MAX.to_string()]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--orders-max 18446744073709551615 is out of range"),
        "{stderr}"
    );
}
