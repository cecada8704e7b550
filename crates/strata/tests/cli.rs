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

/// The recording in `../shared/data`: 604 series, 357,446 samples over 100 minutes at 10 s.
const RECORDING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/node-exporter-600x10s.om.gz");

fn run_ok(args: &[&str]) -> String {
    let out = strata().args(args).output().unwrap();
    assert!(out.status.success(), "strata {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn import_analyze_and_dump_the_node_exporter_recording() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let d = dir.to_str().unwrap();
    let text = run_ok(&["tsdb", "import", "openmetrics", RECORDING, d]);
    assert!(text.contains("imported 357446 samples of 604 series into 2 blocks"), "{text}");

    let text = run_ok(&["tsdb", "analyze", d, "--limit", "3"]);
    assert!(text.contains("2 blocks") && text.contains("total: 357446 samples"), "{text}");
    assert!(text.contains("66 node_interrupts_total"), "{text}");
    // The block's bytes by file, and its index's by section.
    assert!(text.contains("bytes: ") && text.contains("index bytes per series: symbols "), "{text}");

    let text = run_ok(&["tsdb", "dump", d, "--match", "node_load1"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 600, "one sample per scrape");
    assert_eq!(lines[0], "node_load1{} 4.3 1795332570000");
    let text = run_ok(&["tsdb", "dump", d, "--match", "{__name__=~\"node_load.*\"}", "--min-time", "1795338000000"]);
    assert_eq!(text.lines().count(), 3 * 57, "three series, the last 57 scrapes each");

    // Bad input is refused with its line number, and nothing is written.
    let bad = tmp.path().join("bad.om");
    std::fs::write(&bad, "a 1 5\na{b=\"1\" 2 6\n# EOF\n").unwrap();
    let out = strata().args(["tsdb", "import", "openmetrics", bad.to_str().unwrap(), d]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2:"), "{err}");
    let text = run_ok(&["status", "--data-dir", d]);
    assert!(text.contains("blocks:         2 holding 357446 samples"), "{text}");
}

#[test]
fn serve_refuses_a_bad_config_file_naming_the_line_and_field() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("strata.yml");
    std::fs::write(&cfg, "storage:\n  retention: 30d\nlimits:\n  query_max_sries: 5\n").unwrap();
    let out = strata()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir", tmp.path().join("d").to_str().unwrap()])
        .args(["--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("strata.yml") && err.contains("unknown field `query_max_sries`") && err.contains("line 4"),
        "{err}"
    );
    std::fs::write(&cfg, "storage:\n  retention: soon\n").unwrap();
    let out = strata().args(["serve", "--config", cfg.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("retention: invalid duration \"soon\""), "{err}");
}

/// Regression: importing 30 days of history applied the default 15-day retention in the same
/// run and deleted half of what it had just imported, without a word.
#[test]
fn an_import_keeps_everything_it_imported_and_says_retention_is_the_servers() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let d = dir.to_str().unwrap();
    let file = tmp.path().join("history.om");
    let day = 86_400i64;
    let start = 1_700_000_000i64;
    let mut text = String::new();
    for t in (0..30 * day).step_by(3600) {
        text.push_str(&format!("old_metric {} {}\n", t / 3600, start + t));
    }
    text.push_str("# EOF\n");
    std::fs::write(&file, text).unwrap();
    let out = run_ok(&["tsdb", "import", "openmetrics", file.to_str().unwrap(), d]);
    assert!(out.contains("imported 720 samples of 1 series"), "{out}");
    assert!(out.contains("applies no retention") && out.contains("30.0 days"), "{out}");
    let dumped = run_ok(&["tsdb", "dump", d, "--match", "old_metric"]);
    assert_eq!(dumped.lines().count(), 720, "every imported sample is still there");
    let status = run_ok(&["status", "--data-dir", d]);
    assert!(status.contains("holding 720 samples"), "{status}");
}
