//! The binary, run as a user would.

use std::process::Command;

fn strata() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

#[test]
fn status_opens_a_fresh_data_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let out = strata().args(["status", "--data-dir", dir.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("head series:    0"), "{text}");
    assert!(dir.join("wal").is_dir() && dir.join("lock").is_file());
}

#[test]
fn bad_flags_are_named() {
    let out = strata().args(["status", "--wal-fsync", "sometimes"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sometimes"), "{err}");
}
