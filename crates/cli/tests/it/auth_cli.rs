//! `bourse auth hash-password` as an operator runs it: the password on standard input.

use std::io::Write;
use std::process::{Command, Stdio};

const BOURSE: &str = env!("CARGO_BIN_EXE_bourse");

fn hash_password(stdin: &[u8], args: &[&str]) -> std::process::Output {
    let mut child = Command::new(BOURSE)
        .args(["auth", "hash-password"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn hash_password_prints_a_hash_that_verifies_the_password_read_from_stdin() {
    let out = hash_password(
        b"correct horse\n",
        &["--memory-kib", "64", "--iterations", "1"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let hash = bourse_auth::PasswordHashString::parse(text.trim_end()).unwrap();
    assert!(
        hash.as_str().starts_with("$argon2id$v=19$m=64,t=1,p=1$"),
        "{text}"
    );
    assert_eq!(hash.verify("correct horse"), Ok(()));
    assert!(hash.verify("correct horse\n").is_err());
}

#[test]
fn hash_password_refuses_an_empty_or_multi_line_input_with_a_reason() {
    let out = hash_password(b"\n", &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("empty"));
    let out = hash_password(b"a\nb\n", &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than one line"));
}
