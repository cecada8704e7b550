//! Crash tests with a real process: `strata-crash-writer` appends a workload from several threads
//! with `Always` fsync and reports each acknowledged commit; we SIGKILL it at a random moment,
//! reopen the directory and check that every acknowledged sample is there, exact and not
//! duplicated, and that nothing else is corrupt. Repeated for many trials on one directory, so
//! every run also replays what the previous ones left (torn tails included) and keeps appending
//! to it.
//!
//! Three workloads: 100k series × 240 samples into the head (WAL replay under load); 5k series
//! with a block range of 10 steps and the compactor running every 5 ms, so kills land while
//! blocks are written, the head and WAL are truncated, and blocks are compacted; and the same
//! with a raw retention of 60 steps and two rollup tiers, so kills also land while raw blocks
//! are rolled up, tier blocks merged and raw blocks deleted once the tiers hold them: no
//! sample may then be lost from the tiers either.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use strata_model::{MatchOp, Matcher};
use strata_tsdb::chunkenc::rollup::ColumnSet;
use strata_tsdb::rollup::RollupTier;
use strata_tsdb::{Db, DbOptions};

const STEP_MS: i64 = 15_000;

#[derive(Clone, Copy)]
struct Workload {
    series: usize,
    steps: usize,
    threads: usize,
    batch: usize,
    kills: usize,
    block_steps: Option<usize>,
    /// Raw retention, with rollup tiers of `ROLLUP_STEPS` (the writer's).
    retention_steps: Option<usize>,
}

/// The writer's rollup tiers, in steps.
const ROLLUP_STEPS: [i64; 2] = [4, 20];

fn tier(steps: i64) -> RollupTier {
    RollupTier::new(steps * STEP_MS, 0)
}

fn value_bits(series: usize, step: usize) -> u64 {
    if step % 97 == 96 {
        strata_model::STALE_NAN_BITS
    } else {
        ((series * 1000 + step) as f64).to_bits()
    }
}

/// Acknowledged step per series, from the writer's `A th batch step` lines.
fn apply_ack(w: &Workload, line: &str, acked: &mut [Option<usize>]) {
    let f: Vec<usize> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap()).collect();
    let (th, b, step) = (f[0], f[1], f[2]);
    let mine: Vec<usize> = (th..w.series).step_by(w.threads).collect();
    for &s in mine.chunks(w.batch).nth(b).unwrap() {
        acked[s] = Some(acked[s].map_or(step, |a| a.max(step)));
    }
}

/// Every series holds steps 0..=k exactly once with the exact values, and k covers the ack.
///
/// With rollups, raw samples older than the retention may be gone: each series' raw samples
/// are then its newest steps, and every tier's buckets must aggregate all its steps.
fn verify(w: &Workload, dir: &std::path::Path, acked: &[Option<usize>]) -> usize {
    let rollups: Vec<RollupTier> = match w.retention_steps {
        Some(_) => ROLLUP_STEPS.iter().map(|&n| tier(n)).collect(),
        None => Vec::new(),
    };
    let opts = DbOptions { compact_interval: None, retention_ms: 0, rollups, ..Default::default() };
    let db = Db::open(dir, opts).expect("the data dir reopens after a crash");
    let mut last_step = vec![None; w.series];
    let mut seen = vec![false; w.series];
    let mut total = 0;
    let all = Matcher::new(MatchOp::RegexMatch, "__name__", "crash_metric_.*").unwrap();
    for s in db.querier(i64::MIN, i64::MAX).select(&[all]).unwrap() {
        let id: usize = s.labels.get("series").unwrap().parse().unwrap();
        assert!(!seen[id], "series {id} returned twice");
        seen[id] = true;
        let samples = s.samples();
        // Raw data starts at step 0, unless retention deleted the oldest (the tiers hold them).
        let first =
            if w.retention_steps.is_some() { samples.first().map_or(0, |x| (x.t / STEP_MS) as usize) } else { 0 };
        for (k, x) in samples.iter().enumerate() {
            let step = first + k;
            assert_eq!(x.t, step as i64 * STEP_MS, "series {id}: gap or duplicate at position {step}");
            assert_eq!(x.v.to_bits(), value_bits(id, step), "series {id} step {step}: corrupt value");
        }
        let newest = first + samples.len();
        if let Some(a) = acked[id] {
            assert!(newest > a, "series {id}: acknowledged step {a} lost (has steps up to {newest})");
        }
        last_step[id] = newest.checked_sub(1);
        total += newest;
    }
    if w.retention_steps.is_some() {
        verify_tiers(&db, &last_step);
    }
    for (id, a) in acked.iter().enumerate() {
        assert!(a.is_none() || seen[id], "series {id} with acknowledged samples is missing");
    }
    // The head accepts new appends after recovery (then we drop them by not committing).
    let mut app = db.appender();
    app.append(&strata_model::Labels::from_pairs([("__name__", "probe")]), i64::MAX / 2, 1.0).unwrap();
    drop(app);
    db.close().unwrap();
    total
}

/// Every tier's buckets of each series aggregate exactly its steps `0..=last_step`.
fn verify_tiers(db: &Db, last_step: &[Option<usize>]) {
    let all = Matcher::new(MatchOp::RegexMatch, "__name__", "crash_metric_.*").unwrap();
    for n in ROLLUP_STEPS {
        let interval = n * STEP_MS;
        let got = db
            .rollup_select(
                tier(n).meta(),
                std::slice::from_ref(&all),
                0,
                i64::MAX / 2,
                ColumnSet::ALL,
                &Default::default(),
            )
            .unwrap();
        let mut found = 0;
        for s in &got.series {
            let id: usize = s.labels.get("series").unwrap().parse().unwrap();
            let last = last_step[id].unwrap_or_else(|| panic!("series {id} is in the tier but has no raw data"));
            let samples: Vec<strata_model::Sample> = (0..=last)
                .map(|step| strata_model::Sample { t: step as i64 * STEP_MS, v: f64::from_bits(value_bits(id, step)) })
                .collect();
            let want = strata_tsdb::rollup::aggregate(&samples, interval);
            assert_eq!(s.buckets.len(), want.len(), "series {id}: {n}-step buckets");
            for (g, x) in s.buckets.iter().zip(&want) {
                assert_eq!(
                    (g.end, g.count, g.first, g.last, g.min, g.max),
                    (x.end, x.count, x.first, x.last, x.min, x.max),
                    "series {id}"
                );
                assert_eq!(g.sum, x.sum, "series {id}: integer sums are exact");
            }
            found += 1;
        }
        assert_eq!(found, last_step.iter().filter(|s| s.is_some()).count(), "every series is in the {n}-step tier");
    }
}

#[test]
fn acknowledged_samples_survive_sigkill() {
    run(Workload {
        series: 100_000,
        steps: 240,
        threads: 4,
        batch: 1_000,
        kills: 20,
        block_steps: None,
        retention_steps: None,
    });
}

#[test]
fn acknowledged_samples_survive_sigkill_during_block_writes_and_compaction() {
    run(Workload {
        series: 5_000,
        steps: 1_200,
        threads: 2,
        batch: 500,
        kills: 50,
        block_steps: Some(10),
        retention_steps: None,
    });
}

#[test]
fn acknowledged_samples_survive_sigkill_during_rollups_and_raw_retention() {
    run(Workload {
        series: 1_000,
        steps: 1_200,
        threads: 2,
        batch: 250,
        kills: 25,
        block_steps: Some(10),
        retention_steps: Some(60),
    });
}

fn run(w: Workload) {
    let tmp = tempfile::tempdir().unwrap();
    let seed: u64 = std::env::var("STRATA_CRASH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    eprintln!("crash test seed {seed} (set STRATA_CRASH_SEED to repeat)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut acked: Vec<Option<usize>> = vec![None; w.series];
    let mut killed = 0;

    let mut trial = 0;
    let mut generation = 0;
    while killed < w.kills {
        trial += 1;
        let dir = tmp.path().join(format!("data{generation}"));
        let mut args = vec![
            dir.to_str().unwrap().to_owned(),
            w.series.to_string(),
            w.steps.to_string(),
            w.threads.to_string(),
            w.batch.to_string(),
        ];
        args.extend(w.block_steps.map(|b| b.to_string()));
        args.extend(w.retention_steps.map(|r| r.to_string()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata-crash-writer"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the writer");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until it has replayed, then let it run for a random while.
        let ready = rx.recv_timeout(Duration::from_secs(120)).expect("writer became ready");
        assert!(ready.starts_with("READY"), "unexpected first line {ready:?}");
        let run_for = Duration::from_millis(rng.gen_range(50..1500));
        let deadline = Instant::now() + run_for;
        let mut done = false;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(line) if line == "DONE" => {
                    done = true;
                    break;
                }
                Ok(line) => apply_ack(&w, &line, &mut acked),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!("writer exited early: {:?}", child.wait()),
            }
        }
        if !done {
            child.kill().expect("SIGKILL the writer");
            killed += 1;
        }
        child.wait().unwrap();
        // Acks printed before the kill are acknowledged too.
        reader.join().unwrap();
        for line in rx.try_iter() {
            if line.starts_with("A ") {
                apply_ack(&w, &line, &mut acked);
            }
        }
        // Evidence that kills land mid-write: block directories the crash left half-written.
        let torn = std::fs::read_dir(&dir)
            .map(|rd| rd.flatten().filter(|e| e.file_name().to_string_lossy().contains(".tmp")).count())
            .unwrap_or(0);
        let total = verify(&w, &dir, &acked);
        let acked_total: usize = acked.iter().map(|a| a.map_or(0, |s| s + 1)).sum();
        let count_blocks = |d: &std::path::Path| {
            std::fs::read_dir(d).map_or(0, |rd| rd.flatten().filter(|e| e.path().join("meta.json").exists()).count())
        };
        let blocks = count_blocks(&dir);
        let tier_blocks: Vec<usize> =
            ROLLUP_STEPS.iter().map(|n| count_blocks(&dir.join("rollups").join(tier(*n).dir_name()))).collect();
        eprintln!(
            "trial {trial}: ran {run_for:?}, {acked_total} samples acknowledged, {total} present, {blocks} blocks, \
             {tier_blocks:?} rollup blocks, {torn} half-written block dirs at the kill"
        );
        if done {
            // The workload finished before enough kills: start over in a fresh directory.
            assert_eq!(total, w.series * w.steps, "a finished run holds the whole workload (raw or rolled up)");
            generation += 1;
            acked.iter_mut().for_each(|a| *a = None);
        }
    }
}
