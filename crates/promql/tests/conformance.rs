//! Prometheus' own PromQL test files (vendored unchanged in `testdata/promql/`), run against
//! our engine. Prints passed/failed/skipped per file and in total.
//!
//! Cases that do not pass yet are listed in `tests/conformance_known_failures.txt`
//! (`file:line`). The test fails when a case outside that list fails, and also when a listed
//! case passes, so the list only ever shrinks. `PROMQL_UPDATE_KNOWN=1 cargo test -p
//! strata-promql --test conformance` rewrites the list from the current results.
//!
//! `PROMQL_TEST_FILE=path cargo test -p strata-promql --test conformance -- --ignored
//! --nocapture single_file` runs one file of one's own and prints every case's outcome.

mod promqltest;

use std::collections::BTreeSet;
use std::path::PathBuf;

use promqltest::Outcome;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/promql")
}

fn known_failures_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance_known_failures.txt")
}

/// A debugging aid, not a check: `PROMQL_TEST_FILE=path cargo test -p strata-promql --test
/// conformance -- --ignored --nocapture single_file`.
#[test]
#[ignore = "debugging aid: needs PROMQL_TEST_FILE"]
fn single_file_for_debugging() {
    let path = std::env::var_os("PROMQL_TEST_FILE").expect("set PROMQL_TEST_FILE to a test file");
    let text = std::fs::read_to_string(&path).expect("PROMQL_TEST_FILE");
    for r in promqltest::run_file(&text).expect("valid test file") {
        println!("{} {} {:?}", r.line, r.query, r.outcome);
    }
}

#[test]
fn prometheus_promql_test_files() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(testdata())
        .expect("testdata/promql")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "test"))
        .collect();
    files.sort();
    assert!(files.len() >= 21, "expected the 21 upstream test files, found {}", files.len());

    let known: BTreeSet<String> = std::fs::read_to_string(known_failures_path())
        .unwrap_or_default()
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();

    let (mut tp, mut tf, mut ts) = (0, 0, 0);
    let mut failing: Vec<(String, String, String)> = Vec::new();
    let mut skipped_reasons: std::collections::BTreeMap<(String, &'static str), usize> = Default::default();
    println!("{:<28} {:>7} {:>7} {:>7}", "file", "passed", "failed", "skipped");
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(f).unwrap();
        let results = match promqltest::run_file(&text) {
            Ok(r) => r,
            Err(e) => panic!("{name}: {e}"),
        };
        let (mut p, mut fl, mut s) = (0, 0, 0);
        for r in &results {
            match &r.outcome {
                Outcome::Passed => p += 1,
                Outcome::Failed(why) => {
                    fl += 1;
                    failing.push((format!("{name}:{}", r.line), r.query.clone(), why.clone()));
                }
                Outcome::Skipped(why) => {
                    s += 1;
                    *skipped_reasons.entry((name.clone(), why)).or_default() += 1;
                }
            }
        }
        println!("{name:<28} {p:>7} {fl:>7} {s:>7}");
        (tp, tf, ts) = (tp + p, tf + fl, ts + s);
    }
    println!("{:<28} {tp:>7} {tf:>7} {ts:>7}", "total");
    println!("\nskipped:");
    for ((file, why), n) in &skipped_reasons {
        println!("  {file}: {n} ({why})");
    }

    let failing_ids: BTreeSet<String> = failing.iter().map(|(id, _, _)| id.clone()).collect();
    if std::env::var_os("PROMQL_UPDATE_KNOWN").is_some() {
        let mut out = String::from(
            "# PromQL conformance cases that do not pass yet (file:line, query, first reason).\n# Regenerate: PROMQL_UPDATE_KNOWN=1 cargo test -p strata-promql --test conformance\n",
        );
        for (id, q, why) in &failing {
            let why: String = why.chars().take(160).collect();
            out.push_str(&format!("{id}\t{q}\t{}\n", why.replace('\n', " ")));
        }
        std::fs::write(known_failures_path(), out).unwrap();
        return;
    }
    let new: Vec<&(String, String, String)> = failing.iter().filter(|(id, _, _)| !known.contains(id)).collect();
    let fixed: Vec<&String> = known.iter().filter(|id| !failing_ids.contains(*id)).collect();
    for (id, q, why) in &new {
        println!("NEW FAILURE {id}: {q}\n    {why}");
    }
    for id in &fixed {
        println!("NOW PASSING (remove from the known list) {id}");
    }
    assert!(new.is_empty() && fixed.is_empty(), "{} new failures, {} fixed cases still listed", new.len(), fixed.len());
}
