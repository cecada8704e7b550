//! Test helper for `tests/crash.rs`: appends a fixed workload to a data directory from several
//! threads with `Always` fsync, printing one line per acknowledged commit, until it is done or
//! killed. On start it resumes each series after its newest stored sample, so successive runs
//! against one directory (each killed at a random moment) complete the workload together.
//!
//! With `BLOCK_STEPS`, the block range is that many steps and the compactor runs every few
//! milliseconds, so kills also land in block writes, head truncation, WAL checkpoints and
//! compactions. Threads then move through the steps together (a barrier per step), as
//! scrapes do, so no thread falls behind the head's append window.
//!
//! With `RETENTION_STEPS` as well, raw blocks older than that are deleted and two rollup
//! tiers (`ROLLUP_TIERS`) are kept, so kills also land in rollups, tier merges and the raw
//! retention that waits for them.
//!
//! Usage: `strata-crash-writer DATA_DIR SERIES STEPS THREADS BATCH [BLOCK_STEPS [RETENTION_STEPS]]`
//! Output: `READY <samples present>`, then `A <thread> <batch> <step>` per commit, then `DONE`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use strata_model::{Labels, MatchOp, Matcher, SeriesRef};
use strata_tsdb::head::HeadOptions;
use strata_tsdb::wal::{FsyncPolicy, WalOptions};
use strata_tsdb::{Db, DbOptions};

/// Scrape interval of the workload.
const STEP_MS: i64 = 15_000;

/// The rollup tiers of the retention workload: 4 and 20 steps, kept forever (`tests/crash.rs`
/// checks them).
fn rollup_tiers() -> Vec<strata_tsdb::rollup::RollupTier> {
    [4, 20].map(|n| strata_tsdb::rollup::RollupTier::new(n * STEP_MS, 0)).to_vec()
}

fn labels(series: usize) -> Labels {
    Labels::from_pairs([
        ("__name__", format!("crash_metric_{}", series % 100)),
        ("series", series.to_string()),
        ("shard", (series % 7).to_string()),
    ])
}

/// The value of `series` at `step`; the stale marker now and then so it is covered too.
fn value(series: usize, step: usize) -> f64 {
    if step % 97 == 96 {
        f64::from_bits(strata_model::STALE_NAN_BITS)
    } else {
        (series * 1000 + step) as f64
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (dir, series, steps, threads, batch, block_steps, retention_steps) = match &args[..] {
        [_, d, s, st, th, b] => (d, s, st, th, b, None, None),
        [_, d, s, st, th, b, bs] => (d, s, st, th, b, Some(bs.parse::<i64>().expect("BLOCK_STEPS")), None),
        [_, d, s, st, th, b, bs, rs] => (
            d,
            s,
            st,
            th,
            b,
            Some(bs.parse::<i64>().expect("BLOCK_STEPS")),
            Some(rs.parse::<i64>().expect("RETENTION_STEPS")),
        ),
        _ => {
            eprintln!("usage: strata-crash-writer DATA_DIR SERIES STEPS THREADS BATCH [BLOCK_STEPS [RETENTION_STEPS]]");
            std::process::exit(2);
        }
    };
    let dir = PathBuf::from(dir);
    let n_series: usize = series.parse().expect("SERIES");
    let n_steps: usize = steps.parse().expect("STEPS");
    let n_threads: usize = threads.parse().expect("THREADS");
    let batch: usize = batch.parse().expect("BATCH");

    let mut opts = DbOptions {
        head: HeadOptions {
            wal: WalOptions { fsync: FsyncPolicy::Always, segment_bytes: 16 << 20, compression: true, progress: None },
            ..Default::default()
        },
        ..Default::default()
    };
    if let Some(bs) = block_steps {
        opts.head.chunk_range_ms = bs * STEP_MS;
        opts.compact_interval = Some(std::time::Duration::from_millis(5));
        opts.retention_ms = 0;
    }
    if let Some(rs) = retention_steps {
        opts.retention_ms = rs * STEP_MS;
        opts.rollups = rollup_tiers();
    }
    let db = Arc::new(Db::open(&dir, opts).expect("open data dir"));

    // Resume: the next step of each series is one past its newest stored sample.
    let mut next_step = vec![0usize; n_series];
    let mut present = 0usize;
    let all = Matcher::new(MatchOp::RegexMatch, "__name__", "crash_metric_.*").expect("regex");
    for s in db.querier(i64::MIN, i64::MAX).select(&[all]).expect("select") {
        let id: usize = s.labels.get("series").expect("series label").parse().expect("numeric");
        let samples = s.samples();
        present += samples.len();
        next_step[id] = samples.last().map_or(0, |x| (x.t / STEP_MS) as usize + 1);
    }
    let out = Arc::new(Mutex::new(std::io::stdout()));
    writeln!(out.lock().unwrap(), "READY {present}").unwrap();
    let first_step = next_step.iter().copied().min().unwrap_or(n_steps);
    let next_step = Arc::new(next_step);
    let barrier = Arc::new(std::sync::Barrier::new(n_threads));

    let workers: Vec<_> = (0..n_threads)
        .map(|th| {
            let (db, out, next_step, barrier) = (db.clone(), out.clone(), next_step.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mine: Vec<usize> = (th..n_series).step_by(n_threads).collect();
                let mut refs: Vec<Option<SeriesRef>> = vec![None; mine.len()];
                for step in first_step..n_steps {
                    if block_steps.is_some() {
                        barrier.wait();
                    }
                    for (b, part) in mine.chunks(batch).enumerate() {
                        let mut app = db.appender();
                        for (k, &s) in part.iter().enumerate() {
                            if next_step[s] > step {
                                continue;
                            }
                            let t = step as i64 * STEP_MS;
                            let slot = &mut refs[b * batch + k];
                            match slot {
                                Some(r) => app.append_ref(*r, t, value(s, step)).expect("append by ref"),
                                None => *slot = Some(app.append(&labels(s), t, value(s, step)).expect("append")),
                            }
                        }
                        let outcome = app.commit().expect("commit");
                        assert_eq!(outcome.rejected, 0, "no races: each series has one writer");
                        writeln!(out.lock().unwrap(), "A {th} {b} {step}").unwrap();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    writeln!(out.lock().unwrap(), "DONE").unwrap();
}
