//! `bourse soak` end to end, briefly: the demo's participants trade for a few seconds with
//! small bounds, and the samples file has one row per sample with every column the header
//! names (the memory columns per role, the live heap where the binary counts it).

use std::process::Command;

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");

#[test]
fn a_short_soak_writes_a_row_per_sample_with_every_role_column() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("soak.tsv");
    let o = Command::new(BOURSE)
        .args([
            "soak",
            "--minutes",
            "0.1",
            "--rate",
            "500",
            "--sample-s",
            "1",
            "--small-bounds",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("run bourse");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "bourse soak failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&out).expect("the samples file");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split('\t').collect();
    for column in [
        "t_s",
        "load_1m",
        "commands",
        "rss_anon_mib",
        "live_heap_mib",
        "stream_rings_mib",
        "replay_history_mib",
        "gateway_resend_mib",
        "gateway_fix_stored_mib",
        "gateway_finished_orders_mib",
        "gateway_orders_tracked",
    ] {
        assert!(header.contains(&column), "{column} missing from {header:?}");
    }
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    // The first sample is taken as the load starts.
    assert!(!rows.is_empty(), "no samples:\n{text}");
    let mut commands_before = 0u64;
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{row:?}");
        let commands: u64 = row[col("commands")].parse().unwrap();
        assert!(commands >= commands_before, "{text}");
        commands_before = commands;
        assert!(
            row[col("rss_anon_mib")].parse::<f64>().unwrap() > 0.0,
            "{row:?}"
        );
        let live = row[col("live_heap_mib")];
        if cfg!(feature = "count-alloc") {
            assert!(live.parse::<f64>().unwrap() > 0.0, "{row:?}");
        } else {
            assert_eq!(live, "-", "a default build counts nothing");
        }
    }
    let transactions: u64 = stdout
        .lines()
        .find_map(|l| l.trim().split_once(" transactions, "))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary:\n{stdout}"));
    assert!(transactions > 0, "{stdout}");
    assert!(stdout.contains("second half"), "{stdout}");
}

/// `bourse soak --processes`, briefly: the venue as nine `bourse node` processes (three per
/// market), one `bourse gateway` and one `bourse loadgen-worker`. The command itself fails when
/// a process exits during the run or a command goes unacknowledged; here, besides its
/// success, every process has its columns and every server process a resident size in every
/// row. No slope is asserted: a few seconds of samples say nothing stable about growth.
#[test]
fn a_soak_as_processes_samples_every_role_and_acknowledges_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("soak.tsv");
    let o = Command::new(BOURSE)
        .args([
            "soak",
            "--processes",
            "--minutes",
            "0.1",
            "--rate",
            "200",
            "--sample-s",
            "1",
            "--small-bounds",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run bourse");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "bourse soak --processes failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        stdout.contains("every process ran to the end; every command acknowledged"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(&out).expect("the samples file");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a header").split('\t').collect();
    let mut servers: Vec<String> = (0..3)
        .flat_map(|c| (1..=3).map(move |n| format!("node-c{c}-n{n}")))
        .collect();
    servers.push("gateway".into());
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("{name} missing from {header:?}"))
    };
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split('\t').collect()).collect();
    // One row as the load starts and one after the generator has exited, at least.
    assert!(rows.len() >= 2, "{text}");
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{row:?}");
        for role in &servers {
            for what in ["rss_anon_mib", "vm_rss_mib"] {
                let v: f64 = row[col(&format!("{role}_{what}"))]
                    .parse()
                    .unwrap_or_else(|_| panic!("{role}_{what} in {row:?}"));
                assert!(v > 0.0, "{role}_{what} in {row:?}");
            }
        }
    }
    let loadgen = col("loadgen_rss_anon_mib");
    assert!(
        rows.iter()
            .any(|r| r[loadgen].parse::<f64>().is_ok_and(|v| v > 0.0)),
        "the generator was never sampled:\n{text}"
    );
    let commands: u64 = rows.last().unwrap()[col("commands")].parse().unwrap();
    assert!(commands > 0, "{text}");
    for role in servers.iter().chain(["loadgen".to_string()].iter()) {
        assert!(
            stdout
                .lines()
                .any(|l| l.trim_start().starts_with(role.as_str())),
            "no slope line for {role}:\n{stdout}"
        );
    }
}
