//! The same PromQL queries over the same samples, once while they are in the head and once
//! after they were written to a block: `cargo bench -p strata-promql --bench head_vs_block
//! [-- INSTANCES [MINUTES]]` (default 1000 instances × 20 minutes).
//!
//! The shape is a node-exporter fleet seen by dashboards: per instance 50 counters and 50
//! gauges scraped every 15 s with ±5 ms of jitter (100 series per instance), then range queries at
//! a 60 s step over the whole window and one instant query over every series. A second data set
//! replaces 60% of the instances every 5 minutes (churn), so most series a selector finds have
//! no samples in the last minutes. Each figure is the median of several runs; the machine is
//! shared and noisy, so compare the ratio column, not absolute times across runs.
//! `HEAD_VS_BLOCK_STAMPS=scrape` stamps samples as Prometheus does instead: every sample of
//! one scrape of an instance has that scrape's time (±5 ms of jitter per scrape), and each
//! instance is scraped at its own offset within the 15 s, so series of one instance share
//! timestamps and series of different instances do not.
//! `HEAD_VS_BLOCK_SCRAPE_S=n` scrapes every n seconds instead of 15.
//! `HEAD_VS_BLOCK_QUERY=text` runs only the queries that contain `text`, `HEAD_VS_BLOCK_RUNS=n`
//! each n times (15), `HEAD_VS_BLOCK_SET=churn` (or `steady`) loads only that data set, `HEAD_VS_BLOCK_SELECT=1` also times the selection of `{job="node"}` over
//! the last 5 minutes alone, and dropping it.

use std::time::Instant;

use strata_model::{Labels, Matcher};
use strata_promql::{parse, Engine, EngineOptions, EvalError, Storage};
use strata_tsdb::head::{Appender, Head, HeadOptions};
use strata_tsdb::querier::Series as StoredSeries;
use strata_tsdb::{Db, DbOptions};

/// The scrape interval: 15 s, or `HEAD_VS_BLOCK_SCRAPE_S` seconds.
static SCRAPE_MS: std::sync::LazyLock<i64> = std::sync::LazyLock::new(|| {
    std::env::var("HEAD_VS_BLOCK_SCRAPE_S").ok().and_then(|s| s.parse::<i64>().ok()).map_or(15_000, |s| s * 1000)
});
const COUNTERS: usize = 50;
const GAUGES: usize = 50;

/// (time, series index, value).
type Point = (i64, u32, f64);

struct DataSet {
    name: &'static str,
    /// Every series' labels, live or replaced.
    series: Vec<Labels>,
    /// The samples in scrape order.
    samples: Vec<Point>,
    end: i64,
}

fn xorshift(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

fn instance_series(instance: &str, out: &mut Vec<Labels>) {
    for c in 0..COUNTERS {
        out.push(Labels::from_pairs([
            ("__name__", format!("node_counter_{c}_total")),
            ("instance", instance.to_string()),
            ("job", "node".to_string()),
            ("device", format!("eth{}", c % 3)),
        ]));
    }
    for g in 0..GAUGES {
        out.push(Labels::from_pairs([
            ("__name__", format!("node_gauge_{g}")),
            ("instance", instance.to_string()),
            ("job", "node".to_string()),
        ]));
    }
}

/// `instances` live for the whole window; with `churn_every_ms`, 60% of them are replaced by
/// new ones (new `instance` values) at each period.
fn generate(
    name: &'static str,
    instances: usize,
    minutes: i64,
    churn_every_ms: Option<i64>,
    per_scrape: bool,
) -> DataSet {
    let end = minutes * 60_000;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut series = Vec::new();
    let mut samples = Vec::new();
    let per = COUNTERS + GAUGES;
    // Live instance slots: each slot holds the index of its first series.
    let mut slots: Vec<usize> = Vec::new();
    let mut next_instance = 0usize;
    let mut new_instance = |series: &mut Vec<Labels>| {
        let first = series.len();
        instance_series(&format!("10.0.{}.{}:9100", next_instance / 250, next_instance % 250), series);
        next_instance += 1;
        first
    };
    for _ in 0..instances {
        slots.push(new_instance(&mut series));
    }
    let mut last_churn = 0;
    let mut t = 0;
    while t <= end {
        if let Some(every) = churn_every_ms {
            if t - last_churn >= every {
                last_churn = t;
                for slot in slots.iter_mut().take(instances * 6 / 10) {
                    *slot = new_instance(&mut series);
                }
            }
        }
        for (slot, &first) in slots.iter().enumerate() {
            // With `per_scrape`: the instance's offset within the interval and this scrape's
            // jitter, for all its samples.
            let offset = slot as i64 * *SCRAPE_MS / instances as i64;
            let scrape_at = t + offset + (xorshift(&mut seed) % 11) as i64 - 5;
            for k in 0..per {
                let at = match per_scrape {
                    true => scrape_at.max(0),
                    false => (t + (xorshift(&mut seed) % 11) as i64 - 5).max(0),
                };
                let v = if k < COUNTERS {
                    (t / *SCRAPE_MS) as f64 * (k as f64 + 1.0) * 100.0 + (xorshift(&mut seed) % 100) as f64
                } else {
                    (xorshift(&mut seed) % 10_000) as f64 / 100.0
                };
                samples.push((at, (first + k) as u32, v));
            }
        }
        t += *SCRAPE_MS;
    }
    DataSet { name, series, samples, end }
}

/// Appends the data set's samples a scrape per commit.
fn fill<'a>(appender: &dyn Fn() -> Appender<'a>, data: &DataSet) {
    for scrape in data.samples.chunk_by(|a, b| a.0 / *SCRAPE_MS == b.0 / *SCRAPE_MS) {
        let mut app = appender();
        for &(t, i, v) in scrape {
            app.append(&data.series[i as usize], t, v).unwrap();
        }
        app.commit().unwrap();
    }
}

/// The database as the server reads it: blocks (and large head selections) on as many threads
/// as the engine evaluates on.
struct Parallel<'a>(&'a Db);

impl Storage for Parallel<'_> {
    fn select(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<StoredSeries>, EvalError> {
        let threads = EngineOptions::default().parallelism;
        self.0.querier(mint, maxt).parallelism(threads).select(matchers).map_err(|e| EvalError::Storage(e.to_string()))
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<i64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let instances = args.first().copied().unwrap_or(1000) as usize;
    let minutes = args.get(1).copied().unwrap_or(20);
    // Generated lazily would save little: both are small next to loading them.
    let per_scrape = std::env::var("HEAD_VS_BLOCK_STAMPS").is_ok_and(|s| s == "scrape");
    let sets = [
        generate("steady", instances, minutes, None, per_scrape),
        generate("churn (60% of instances replaced every 5 min)", instances / 5, minutes, Some(5 * 60_000), per_scrape),
    ];
    let queries = [
        ("range", "sum by (instance) (rate(node_counter_7_total[5m]))"),
        ("range", "rate(node_counter_7_total[5m])"),
        ("range", "node_gauge_3"),
        ("range", "max by (device) (rate(node_counter_1_total{instance=~\"10.0.1.*\"}[5m]))"),
        // A host's dashboard: every counter of one instance (one scrape's timestamps).
        ("range", "sum by (device) (rate({__name__=~\"node_counter_.*\", instance=\"10.0.0.7:9100\"}[5m]))"),
        ("range", "sum by (instance) (rate({__name__=~\"node_counter_.*\"}[5m]))"),
        ("range", "count by (job) ({__name__=~\"node_counter_.*\"})"),
        ("instant", "count({job=\"node\"})"),
        ("instant", "sum(node_gauge_9)"),
    ];
    let engine = Engine::new(EngineOptions::default());
    let only_set = std::env::var("HEAD_VS_BLOCK_SET").unwrap_or_default();
    for data in sets.iter().filter(|d| d.name.starts_with(only_set.as_str())) {
        println!(
            "{}: {} series, {} samples, {} minutes",
            data.name,
            data.series.len(),
            data.samples.len(),
            data.end / 60_000
        );
        let head_dir = tempfile::tempdir().unwrap();
        let block_dir = tempfile::tempdir().unwrap();
        let opts = || DbOptions { compact_interval: None, retention_ms: 0, ..Default::default() };
        let in_head = Db::open(head_dir.path(), opts()).unwrap();
        let in_block = Db::open(block_dir.path(), opts()).unwrap();
        let staging = Head::in_memory(HeadOptions::default());
        let t0 = Instant::now();
        fill(&|| in_head.appender(), data);
        println!("  loaded into the head in {:.1} s", t0.elapsed().as_secs_f64());
        fill(&|| staging.appender(), data);
        let blocks = in_block.import_head(&staging).unwrap();
        drop(staging);
        println!("  written to {} block(s)", blocks.len());
        println!("  {:<80} {:>10} {:>10} {:>11}", "query", "head ms", "block ms", "head/block");
        // `HEAD_VS_BLOCK_QUERY=text` runs only the queries containing it (for a profiler).
        let only = std::env::var("HEAD_VS_BLOCK_QUERY").unwrap_or_default();
        let runs: usize = std::env::var("HEAD_VS_BLOCK_RUNS").ok().and_then(|r| r.parse().ok()).unwrap_or(15);
        for (kind, q) in queries.iter().filter(|(_, q)| q.contains(only.as_str())) {
            let expr = parse(q).unwrap();
            let run = |db: &Db| -> (f64, usize) {
                let mut lat = Vec::new();
                let mut points = 0;
                for _ in 0..runs {
                    let t0 = Instant::now();
                    let out = if *kind == "range" {
                        engine.range(&Parallel(db), &expr, 0, data.end, 60_000).unwrap()
                    } else {
                        engine.instant(&Parallel(db), &expr, data.end).unwrap()
                    };
                    lat.push(t0.elapsed().as_secs_f64() * 1e3);
                    points = out.stats.samples_read;
                }
                (median(lat), points)
            };
            if std::env::var("HEAD_VS_BLOCK_SELECT").is_ok() {
                let ms = vec![Matcher::new(strata_model::MatchOp::Equal, "job", "node").unwrap()];
                for (name, db) in [("head", &in_head), ("block", &in_block)] {
                    let mut sel = Vec::new();
                    let mut dropt = Vec::new();
                    for _ in 0..runs {
                        let t0 = Instant::now();
                        let r = Parallel(db).select(&ms, data.end - 300_000, data.end).unwrap();
                        sel.push(t0.elapsed().as_secs_f64() * 1e3);
                        let t0 = Instant::now();
                        drop(r);
                        dropt.push(t0.elapsed().as_secs_f64() * 1e3);
                    }
                    println!("  select {name}: {:.2} ms, drop {:.2} ms", median(sel), median(dropt));
                }
            }
            let (h, h_read) = run(&in_head);
            let (b, b_read) = run(&in_block);
            assert_eq!(h_read, b_read, "{q}: the head and the block read different samples");
            println!("  {:<80} {h:>10.2} {b:>10.2} {:>10.2}x", format!("{kind} {q}"), h / b);
        }
    }
}
