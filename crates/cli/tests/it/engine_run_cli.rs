//! `bourse engine run` as a user runs it: a capacity too large for the machine is refused
//! with a clear error before anything is allocated, and the default limits still start.

use std::path::Path;
use std::process::{Command, Output};

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");

fn engine_run(input: &Path, output: &Path, extra: &[&str]) -> Output {
    Command::new(BOURSE)
        .args(["engine", "run", "--input"])
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(extra)
        .output()
        .expect("bourse runs")
}

#[test]
fn an_orders_max_beyond_the_memory_is_refused_by_name_not_by_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "").unwrap();
    let output = dir.path().join("out.jsonl");
    // 4294967294 orders take some 800 GiB: the allocator used to abort (exit 134).
    let run = engine_run(&input, &output, &["--orders-max", "4294967294"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--orders-max 4294967294 needs "),
        "{stderr}"
    );
    assert!(stderr.contains("for the order table"), "{stderr}");
    assert!(stderr.contains("available; at most "), "{stderr}");
    assert!(!stderr.contains("memory allocation"), "{stderr}");
    assert!(!output.exists(), "refused before the output was created");
}

#[test]
fn the_default_limits_start_and_run_the_example_day() {
    let dir = tempfile::tempdir().unwrap();
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/trading-day.jsonl");
    let output = dir.path().join("out.jsonl");
    let run = engine_run(&input, &output, &["--summary"]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("state_hash"), "{stderr}");
    let events = std::fs::read_to_string(&output).unwrap();
    assert!(events.contains(r#""event":"trade""#), "{events}");
}
