//! Storage benchmarks, run with `cargo bench -p strata-tsdb --bench tsdb_bench [-- GROUP…]`.
//! Groups: `chunks` (ten-point chunks of carbon paths (also alone: `small_chunks`), bytes/sample and encode/decode speed of each chunk encoding on the
//! node-exporter recording, the same with jittered timestamps, and gauges with many decimals), `append` (1M series from
//! 20kseries.json, two threads; memory per series), `select` (two-matcher query over 1M series),
//! `wal` (append with the WAL on disk), `churn` (7 days on disk, with and without 60% of series
//! replaced every 15 minutes: query latency over blocks; `CACHE_BYTES=N` sets the chunk group
//! cache's budget, `CHURN_RUNS=N` the runs per query), `head_chunks` (head-resident queries with closed chunks on the heap, then
//! written out to head chunk files), `rollup` (rollup chunks: bytes and decode time per bucket), `names` (the head's names
//! dictionary: a delta of 1M Graphite host paths folded into a sorted list, lists merged, a
//! dictionary built; in carbon's arrival order and shuffled). Each figure is the median of several runs; the machine is
//! shared and noisy, so compare ratios from one run rather than absolute times across runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use strata_model::{Labels, MatchOp, Matcher, Sample, SeriesRef};
use strata_tsdb::chunkenc::{dense, ChunkIterator, XorAppender};
use strata_tsdb::head::{Head, HeadOptions};
use strata_tsdb::querier::Querier;
use strata_tsdb::wal::{FsyncPolicy, WalOptions};

/// Counts live heap bytes, so memory per series is measured, not estimated.
struct CountingAlloc;
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator and only adds bookkeeping.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE_BYTES.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

fn shared_data(name: &str) -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for up in [here.join("../../../shared/data"), here.join("../../shared/data")] {
        if up.join(name).exists() {
            return up.join(name);
        }
    }
    panic!("{name} not found next to the repository (../shared/data)");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Samples per series of the node-exporter recording, in time order.
fn load_recording() -> Vec<Vec<Sample>> {
    load_recording_keyed().into_values().collect()
}

/// The recording by series (its text key, `name{labels}`).
fn load_recording_keyed() -> BTreeMap<String, Vec<Sample>> {
    let f = std::fs::File::open(shared_data("node-exporter-600x10s.om.gz")).unwrap();
    let r = BufReader::new(flate2::read::GzDecoder::new(f));
    let mut series: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for line in r.lines() {
        let line = line.unwrap();
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let mut parts = line.rsplitn(3, ' ');
        let (ts, v, key) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        let t = (ts.parse::<f64>().unwrap() * 1000.0).round() as i64;
        let v: f64 = v.parse().unwrap_or_else(|_| panic!("value {v:?}"));
        series.entry(key.to_string()).or_default().push(Sample::new(t, v));
    }
    series
}

/// Where the bytes of dense chunks go: the metric names whose chunks take the most.
fn dense_bytes_by_metric() {
    let mut by_name: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut all = Vec::new();
    for (key, samples) in load_recording_keyed() {
        let name = key.split('{').next().unwrap().to_string();
        let chunks = encode(&samples, 240, dense::encode);
        chunks.iter().for_each(|c| all.extend_from_slice(c));
        let bytes: usize = chunks.iter().map(Vec::len).sum();
        let e = by_name.entry(name).or_default();
        e.0 += bytes;
        e.1 += samples.len();
    }
    let total: usize = by_name.values().map(|v| v.0).sum();
    // What a block-level compressor over groups of chunks would still save (not done yet).
    for group in [4096usize, 16384, 65536, 262_144] {
        for level in [1, 3, 9] {
            let z: usize = all.chunks(group).map(|g| zstd::bulk::compress(g, level).unwrap().len()).sum();
            println!(
                "  dense chunks in series order, zstd level {level} over {group}-byte groups: {:.3} of their size",
                z as f64 / all.len() as f64
            );
        }
    }
    let mut top: Vec<_> = by_name.into_iter().collect();
    top.sort_by_key(|(_, (b, _))| std::cmp::Reverse(*b));
    println!("  dense bytes by metric name (top 12 of {total} bytes):");
    for (name, (bytes, n)) in top.iter().take(12) {
        println!(
            "    {name:50} {bytes:>7} bytes {:5.1}%  {:.2} B/sample",
            100.0 * *bytes as f64 / total as f64,
            *bytes as f64 / *n as f64
        );
    }
}

fn encode_xor(samples: &[Sample]) -> Vec<u8> {
    let mut a = XorAppender::new();
    for s in samples {
        a.append(s.t, s.v);
    }
    a.into_bytes()
}

/// A chunk encoder: samples in, chunk bytes out.
type Encoder = fn(&[Sample]) -> Vec<u8>;

fn encode(samples: &[Sample], per_chunk: usize, enc: Encoder) -> Vec<Vec<u8>> {
    samples.chunks(per_chunk).map(enc).collect()
}

/// A small deterministic generator (xorshift), so every run measures the same data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The recording with every timestamp moved by up to ±`ms` (as a real scrape loop jitters),
/// kept strictly increasing.
fn jittered(rec: &[Vec<Sample>], ms: i64) -> Vec<Vec<Sample>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    rec.iter()
        .map(|s| {
            let mut prev = i64::MIN;
            s.iter()
                .map(|x| {
                    let t = (x.t + (rng.next() % (2 * ms as u64 + 1)) as i64 - ms).max(prev + 1);
                    prev = t;
                    Sample::new(t, x.v)
                })
                .collect()
        })
        .collect()
}

/// Gauges printed with many decimals (temperatures, ratios, latencies in seconds): a random walk
/// per series, each value rounded to 2–6 decimals as an exporter formats it.
fn decimal_gauges(rec: &[Vec<Sample>]) -> Vec<Vec<Sample>> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    rec.iter()
        .enumerate()
        .map(|(i, s)| {
            let decimals = 2 + (i % 5) as i32;
            let scale = 10f64.powi(decimals);
            let mut x = (rng.next() % 10_000) as f64;
            s.iter()
                .map(|p| {
                    x += ((rng.next() % 2001) as f64 - 1000.0) / 997.0;
                    Sample::new(p.t, (x * scale).round() / scale)
                })
                .collect()
        })
        .collect()
}

/// Ten-point dense chunks of carbon paths (a million paths × 10 points is what the Graphite
/// issue's benchmark writes as one block): whole-second timestamps 10 s apart, jittered by a
/// second either way, in milliseconds; values as `carbon_compare` sends them (decimals, large
/// integers stepping by the path, small random integers).
fn bench_small_chunks() {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let series: Vec<Vec<Sample>> = (0..200_000usize)
        .map(|p| {
            (0..10usize)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let t = (1_764_000_000 + 10 * i as i64 + (x % 3) as i64 - 1) * 1000;
                    let v = match p % 3 {
                        0 => ((p * 7 + i * 13) % 1000) as f64 / 10.0,
                        1 => (p * 1000 + i * (p % 17)) as f64,
                        _ => (x % 100) as f64,
                    };
                    Sample { t, v }
                })
                .collect()
        })
        .collect();
    let bytes: usize = series.iter().map(|s| dense::encode(s).len()).sum();
    let mut rates = Vec::new();
    for _ in 0..7 {
        let t0 = Instant::now();
        let mut n = 0;
        for s in &series {
            n += dense::encode(s).len();
        }
        std::hint::black_box(n);
        rates.push(t0.elapsed().as_nanos() as f64 / series.len() as f64);
    }
    println!(
        "chunks: carbon paths, {} series of 10 points: dense {:.2} bytes/point, encode {:.0} ns per chunk (median of 7, one thread)",
        series.len(),
        bytes as f64 / (10 * series.len()) as f64,
        median(rates)
    );
}

fn bench_chunks() {
    let rec = load_recording();
    let sets = [
        ("node-exporter recording", rec.clone()),
        ("same, timestamps jittered ±5 ms", jittered(&rec, 5)),
        ("gauges with 2-6 decimals", decimal_gauges(&rec)),
    ];
    let encodings: [(&str, Encoder); 2] = [("xor", encode_xor), ("dense", dense::encode)];
    for (name, data) in &sets {
        let total: usize = data.iter().map(Vec::len).sum();
        println!("chunks: {name}, {} series, {total} samples", data.len());
        if name.starts_with("node-exporter") {
            dense_bytes_by_metric();
        }
        for (enc_name, enc) in encodings {
            for per_chunk in [120usize, 240, 480] {
                let chunks: Vec<Vec<u8>> = data.iter().flat_map(|s| encode(s, per_chunk, enc)).collect();
                let bytes: usize = chunks.iter().map(Vec::len).sum();
                println!(
                    "  {enc_name:5} {per_chunk} samples/chunk: {:.3} bytes/sample ({bytes} bytes in {} chunks)",
                    bytes as f64 / total as f64,
                    chunks.len()
                );
            }
        }
        for (enc_name, enc) in encodings {
            let per_chunk = if enc_name == "xor" { 120 } else { 240 };
            let (mut encode_rate, mut next_rate, mut batch_rate) = (Vec::new(), Vec::new(), Vec::new());
            let chunks: Vec<Vec<u8>> = data.iter().flat_map(|s| encode(s, per_chunk, enc)).collect();
            for _ in 0..7 {
                let t0 = Instant::now();
                let mut n = 0;
                for s in data {
                    n += encode(s, per_chunk, enc).len();
                }
                std::hint::black_box(n);
                encode_rate.push(total as f64 / t0.elapsed().as_secs_f64());
                let t0 = Instant::now();
                let mut sum = 0u64;
                for _ in 0..10 {
                    for c in &chunks {
                        let mut it = ChunkIterator::new(&c[..]).unwrap();
                        while let Some(s) = it.next() {
                            sum = sum.wrapping_add(s.t as u64 ^ s.v.to_bits());
                        }
                    }
                }
                std::hint::black_box(sum);
                next_rate.push(10.0 * total as f64 / t0.elapsed().as_secs_f64());
                let t0 = Instant::now();
                let mut buf = Vec::with_capacity(512);
                for _ in 0..10 {
                    for c in &chunks {
                        buf.clear();
                        ChunkIterator::new(&c[..]).unwrap().decode_into(&mut buf);
                        sum = sum.wrapping_add(buf.len() as u64);
                    }
                }
                std::hint::black_box(sum);
                batch_rate.push(10.0 * total as f64 / t0.elapsed().as_secs_f64());
            }
            println!(
                "  {enc_name:5} {per_chunk}/chunk: encode {:.1}, decode next() {:.1}, decode whole chunk {:.1} M samples/s \
                 (medians of 7, one thread)",
                median(encode_rate) / 1e6,
                median(next_rate) / 1e6,
                median(batch_rate) / 1e6
            );
        }
    }
}

/// Rollup chunks: bytes and decode speed per bucket (into columns, as tier reads decode them), by buckets per chunk (a tier block of a
/// few hours holds a handful, a compacted one up to `SAMPLES_MAX`) and by the columns a reader
/// asks for (a plain selector's `last`; a maximum's `max`; an average's count and sum; `rate`'s
/// count, first, last and reset correction; all).
/// Series: a counter scraped every 60 s with ±250 ms jitter and a reset now and then, and a
/// decimal gauge, rolled up at 1 h. `ROLLUP_RUNS=N` sets the timed runs (7), each of 20
/// passes; with 1 the pass runs once (for counting instructions under callgrind).
/// `ROLLUP_SET=rate` decodes only that column set, `ROLLUP_SIZE=90` only chunks of that size,
/// `ROLLUP_SERIES=counter` only that series.
fn bench_rollup() {
    let env = |name: &str| std::env::var(name).ok();
    let runs_wanted: usize = env("ROLLUP_RUNS").and_then(|v| v.parse().ok()).unwrap_or(7);
    let passes = if runs_wanted == 1 { 1 } else { 20 };
    let (only_series, only_set) = (env("ROLLUP_SERIES"), env("ROLLUP_SET"));
    let only_size: Option<usize> = env("ROLLUP_SIZE").and_then(|v| v.parse().ok());
    use strata_tsdb::chunkenc::rollup::{decode_columns, encode, Column, ColumnSet};
    use strata_tsdb::rollup::{aggregate, BucketColumns};
    let (mut rng, mut counter, mut gauge) = (0x2545_f491_4f6c_dd1du64, 0.0f64, 20.0f64);
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut counters, mut gauges) = (Vec::new(), Vec::new());
    for i in 0..200 * 24 * 60i64 {
        let t = 1_700_000_000_000 + i * 60_000 + (next() % 501) as i64 - 250;
        counter = if next() % 5000 == 0 { 0.0 } else { counter + (next() % 21) as f64 };
        gauge += ((next() % 201) as f64 - 100.0) / 100.0;
        counters.push(Sample { t, v: counter });
        gauges.push(Sample { t, v: (gauge * 100.0).round() / 100.0 });
    }
    let sets: [(&str, &[Column]); 5] = [
        ("last", &[Column::Last]),
        ("max", &[Column::Max]),
        ("avg", &[Column::Count, Column::Sum]),
        ("rate", &[Column::Count, Column::First, Column::Last, Column::ResetCorrection]),
        ("all", &Column::ALL),
    ];
    for (name, samples) in [("counter", &counters), ("gauge", &gauges)]
        .into_iter()
        .filter(|(n, _)| only_series.as_deref().is_none_or(|o| o == *n))
    {
        let buckets = aggregate(samples, 3_600_000);
        for per_chunk in [6usize, 24, 90, 240].into_iter().filter(|n| only_size.is_none_or(|s| s == *n)) {
            let chunks: Vec<Vec<u8>> = buckets.chunks(per_chunk).map(encode).collect();
            let bytes: usize = chunks.iter().map(Vec::len).sum();
            let mut line = format!(
                "rollup: {name:7} {per_chunk:3} buckets/chunk: {:5.2} bytes/bucket; decode ns/bucket",
                bytes as f64 / buckets.len() as f64
            );
            for (set_name, columns) in sets.into_iter().filter(|(n, _)| only_set.as_deref().is_none_or(|o| o == *n)) {
                let want = ColumnSet::of(columns);
                let mut out = BucketColumns::new(want);
                let mut runs = Vec::new();
                for _ in 0..runs_wanted {
                    let t0 = Instant::now();
                    let mut sum = 0u64;
                    for _ in 0..passes {
                        for c in &chunks {
                            out.reset(want);
                            decode_columns(c, &mut out).unwrap();
                            sum = sum.wrapping_add(out.len() as u64);
                        }
                    }
                    std::hint::black_box(sum);
                    runs.push(t0.elapsed().as_secs_f64() * 1e9 / (passes * buckets.len()) as f64);
                }
                line += &format!(" {set_name} {:.1}", median(runs));
            }
            println!("{line}");
        }
    }
}

/// 1M label sets: each of the 20k real sets × 50 values of an extra `replica` label.
fn million_label_sets() -> Vec<Labels> {
    let f = std::fs::File::open(shared_data("20kseries.json")).unwrap();
    let base: Vec<Vec<(String, String)>> = BufReader::new(f)
        .lines()
        .map(|l| {
            let m: BTreeMap<String, String> = serde_json::from_str(&l.unwrap()).unwrap();
            m.into_iter().collect()
        })
        .collect();
    let mut out = Vec::with_capacity(base.len() * 50);
    for r in 0..50 {
        let replica = format!("r{r}");
        for b in &base {
            out.push(Labels::from_pairs(
                b.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain([("replica", replica.as_str())]),
            ));
        }
    }
    out
}

const THREADS: usize = 2;
const COMMIT_SERIES: usize = 1000;
const INTERVAL_MS: i64 = 15_000;

/// Appends `steps` samples to every series from `THREADS` threads; returns refs and elapsed time
/// for the first step (series creation) and the rest.
fn fill(head: &Head, sets: &[Labels], values: &[Vec<Sample>], steps: usize) -> (Duration, Duration) {
    let per_thread = sets.len().div_ceil(THREADS);
    let t0 = Instant::now();
    let refs: Vec<Vec<SeriesRef>> = std::thread::scope(|sc| {
        let hs: Vec<_> = sets
            .chunks(per_thread)
            .enumerate()
            .map(|(th, part)| {
                sc.spawn(move || {
                    let mut refs = Vec::with_capacity(part.len());
                    for (b, batch) in part.chunks(COMMIT_SERIES).enumerate() {
                        let mut app = head.appender();
                        for (k, l) in batch.iter().enumerate() {
                            let i = th * per_thread + b * COMMIT_SERIES + k;
                            let v = values[i % values.len()][0].v;
                            refs.push(app.append(l, 0, v).unwrap());
                        }
                        app.commit().unwrap();
                    }
                    refs
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let create = t0.elapsed();
    let t1 = Instant::now();
    std::thread::scope(|sc| {
        for (th, refs) in refs.iter().enumerate() {
            sc.spawn(move || {
                for step in 1..steps {
                    for (b, batch) in refs.chunks(COMMIT_SERIES).enumerate() {
                        let mut app = head.appender();
                        for (k, &r) in batch.iter().enumerate() {
                            let i = th * per_thread + b * COMMIT_SERIES + k;
                            let src = &values[i % values.len()];
                            app.append_ref(r, step as i64 * INTERVAL_MS, src[step % src.len()].v).unwrap();
                        }
                        app.commit().unwrap();
                    }
                }
            });
        }
    });
    (create, t1.elapsed())
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)).unwrap().parse().unwrap()
}

fn bench_append_and_select(groups: &[String]) {
    let sets = million_label_sets();
    let values = load_recording();
    let n = sets.len();
    let steps = 120;
    println!("append: {n} series (20kseries.json × 50 replicas), {THREADS} threads, {COMMIT_SERIES} series per commit, no WAL");
    let mut create_rates = Vec::new();
    let mut append_rates = Vec::new();
    let runs = 3;
    let mut kept: Option<Head> = None;
    for run in 0..runs {
        drop(kept.take());
        let before = live_bytes();
        let rss_before = rss_kib();
        let head = Head::in_memory(HeadOptions::default());
        let (create, rest) = fill(&head, &sets, &values, steps);
        create_rates.push(n as f64 / create.as_secs_f64());
        append_rates.push((n * (steps - 1)) as f64 / rest.as_secs_f64());
        // Measured on the first head of the process: later ones reuse pages freed by earlier ones.
        if run == 0 {
            let bytes = live_bytes() - before;
            println!(
                "  memory after {steps} samples/series: {:.0} bytes/series heap (counted), RSS grew {:.0} bytes/series",
                bytes as f64 / n as f64,
                (rss_kib() - rss_before) as f64 * 1024.0 / n as f64
            );
        }
        if run == runs - 1 {
            kept = Some(head);
        }
    }
    if let Some(head) = &kept {
        // Appends that name the series by labels (as remote write does), to existing series.
        let per_thread = n.div_ceil(THREADS);
        let t0 = Instant::now();
        std::thread::scope(|sc| {
            for part in sets.chunks(per_thread) {
                sc.spawn(move || {
                    for batch in part.chunks(COMMIT_SERIES) {
                        let mut app = head.appender();
                        for l in batch {
                            app.append(l, steps as i64 * INTERVAL_MS, 1.0).unwrap();
                        }
                        app.commit().unwrap();
                    }
                });
            }
        });
        println!(
            "  append by labels to existing series: {:.2} M samples/s (one pass)",
            n as f64 / t0.elapsed().as_secs_f64() / 1e6
        );
    }
    println!("  series creation (first sample): {:.2} M series/s (median of {runs})", median(create_rates) / 1e6);
    println!("  append by ref: {:.2} M samples/s (median of {runs})", median(append_rates) / 1e6);

    // Memory right after creation with one sample per series.
    drop(kept.take());
    let before = live_bytes();
    let head = Head::in_memory(HeadOptions::default());
    fill(&head, &sets, &values, 1);
    println!("  memory with 1 sample/series: {:.0} bytes/series heap", (live_bytes() - before) as f64 / n as f64);
    fill_rest(&head, &sets, &values);

    if groups.is_empty() || groups.iter().any(|g| g == "select") {
        bench_select(&head, &sets);
    }
}

/// Brings the 1-sample head up to 120 samples so selects read realistic chunks.
fn fill_rest(head: &Head, sets: &[Labels], values: &[Vec<Sample>]) {
    let mut app = head.appender();
    for step in 1..120 {
        for (i, l) in sets.iter().enumerate() {
            let src = &values[i % values.len()];
            app.append(l, step * INTERVAL_MS, src[step as usize % src.len()].v).unwrap();
            if app.len() >= 100_000 {
                std::mem::replace(&mut app, head.appender()).commit().unwrap();
            }
        }
    }
    app.commit().unwrap();
}

fn bench_select(head: &Head, sets: &[Labels]) {
    // The most common metric name, narrowed by a regex on the replica label.
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for l in sets {
        *counts.entry(l.metric_name().unwrap()).or_default() += 1;
    }
    let (name, _) = counts.iter().max_by_key(|(_, c)| **c).unwrap();
    let queries: Vec<(String, Vec<Matcher>)> = vec![
        (
            format!("{{__name__=\"{name}\", replica=~\"r1.*\"}}"),
            vec![
                Matcher::new(MatchOp::Equal, "__name__", *name).unwrap(),
                Matcher::new(MatchOp::RegexMatch, "replica", "r1.*").unwrap(),
            ],
        ),
        (
            format!("{{__name__=\"{name}\", replica=\"r7\"}}"),
            vec![
                Matcher::new(MatchOp::Equal, "__name__", *name).unwrap(),
                Matcher::new(MatchOp::Equal, "replica", "r7").unwrap(),
            ],
        ),
    ];
    println!("select: over {} series, last 30 min of 120 samples/series", head.num_series());
    for (text, ms) in queries {
        let mut lat = Vec::new();
        let mut n = 0;
        let mut samples = 0;
        for _ in 0..15 {
            let t0 = Instant::now();
            let res = Querier::new(head, 90 * INTERVAL_MS, 120 * INTERVAL_MS).select(&ms).unwrap();
            n = res.len();
            lat.push(t0.elapsed().as_secs_f64());
            samples = res.iter().map(|s| s.samples().len()).sum::<usize>();
        }
        println!(
            "  {text}: {n} series ({samples} samples when read), select {:.2} ms (median of 15)",
            median(lat) * 1e3
        );
    }
}

fn bench_wal() {
    let sets: Vec<Labels> = million_label_sets().into_iter().take(200_000).collect();
    let values = load_recording();
    for fsync in [FsyncPolicy::Interval(Duration::from_secs(1)), FsyncPolicy::Always] {
        let tmp = tempfile::tempdir().unwrap();
        let opts = HeadOptions { wal: WalOptions { fsync, ..Default::default() }, ..Default::default() };
        let (head, _) = Head::open(tmp.path(), opts).unwrap();
        let steps = 30;
        let (create, rest) = fill(&head, &sets, &values, steps);
        let bytes = head.wal().unwrap().stats.bytes_written.load(Ordering::Relaxed);
        println!(
            "wal {fsync:?}: {} series created in {:.2}s, append {:.2} M samples/s, {:.1} WAL bytes/sample",
            sets.len(),
            create.as_secs_f64(),
            (sets.len() * (steps - 1)) as f64 / rest.as_secs_f64() / 1e6,
            bytes as f64 / (sets.len() * steps) as f64
        );
        head.close().unwrap();
        drop(head);
        let t0 = Instant::now();
        let (head, _) = Head::open(tmp.path(), opts).unwrap();
        println!(
            "  replay: {:.2} M samples/s ({} series)",
            (sets.len() * steps) as f64 / t0.elapsed().as_secs_f64() / 1e6,
            head.num_series()
        );
    }
}

/// Active series at any time in the churn benchmark, and their scrape interval.
const CHURN_ACTIVE: usize = 2_000;
const CHURN_STEP_MS: i64 = 60_000;
const CHURN_DAYS: i64 = 7;

/// Writes 7 days of `CHURN_ACTIVE` series at 1-minute steps through a real `Db` (head, WAL,
/// head cuts, compaction). With `churn`, 60% of the series (all but ids `% 5 < 2`) get a new
/// `instance` every 15 minutes, as pods do on a busy cluster. Returns the series created.
fn build_churn_db(dir: &Path, churn: bool) -> usize {
    let db = strata_tsdb::Db::open(
        dir,
        strata_tsdb::DbOptions { compact_interval: None, retention_ms: 0, ..Default::default() },
    )
    .unwrap();
    let steps = CHURN_DAYS * 24 * 60;
    let mut created = std::collections::HashSet::new();
    let mut labels: Vec<Labels> = Vec::new();
    let mut generation = -1;
    for step in 0..steps {
        let t = step * CHURN_STEP_MS;
        let g = if churn { t / (15 * 60_000) } else { 0 };
        if g != generation {
            generation = g;
            labels = (0..CHURN_ACTIVE)
                .map(|i| {
                    let instance = if i % 5 < 2 { format!("i{i}") } else { format!("i{i}-g{g}") };
                    Labels::from_pairs([
                        ("__name__", format!("m{}", i % 10)),
                        ("job", format!("j{}", i % 7)),
                        ("instance", instance),
                    ])
                })
                .collect();
        }
        let mut app = db.appender();
        for (i, l) in labels.iter().enumerate() {
            let r = app.append(l, t, (step as usize * (i + 1)) as f64).unwrap();
            created.insert(r);
        }
        app.commit().unwrap();
        if step % 120 == 119 {
            db.compact().unwrap();
        }
    }
    db.compact().unwrap();
    db.close().unwrap();
    created.len()
}

fn bench_churn() {
    if let Some(b) = std::env::var("CACHE_BYTES").ok().and_then(|v| v.parse().ok()) {
        strata_tsdb::block::GroupCache::global().set_budget(b);
    }
    let tmp = tempfile::tempdir().unwrap();
    let end = CHURN_DAYS * 24 * 3600 * 1000;
    let m = |op, n: &str, v: &str| Matcher::new(op, n, v).unwrap();
    // (name, mint, maxt, matchers)
    let queries: Vec<(&str, i64, i64, Vec<Matcher>)> = vec![
        (
            "one stable series, 7 d",
            0,
            end,
            vec![m(MatchOp::Equal, "__name__", "m5"), m(MatchOp::Equal, "instance", "i5")],
        ),
        (
            "one stable series, last 1 h",
            end - 3_600_000,
            end,
            vec![m(MatchOp::Equal, "__name__", "m5"), m(MatchOp::Equal, "instance", "i5")],
        ),
        // In the head, which holds the last two hours or so: most generations of the churned
        // series it holds have stopped before the range.
        (
            "m3 of job j1, last 5 min",
            end - 300_000,
            end,
            vec![m(MatchOp::Equal, "__name__", "m3"), m(MatchOp::Equal, "job", "j1")],
        ),
        (
            "m3 of job j1, last 1 h",
            end - 3_600_000,
            end,
            vec![m(MatchOp::Equal, "__name__", "m3"), m(MatchOp::Equal, "job", "j1")],
        ),
        // Inside the compacted blocks, which hold every generation of the churned series:
        // most of what the matchers select has no sample in the hour.
        (
            "m3 of job j1, 1 h 3 days back",
            end - 72 * 3_600_000,
            end - 71 * 3_600_000,
            vec![m(MatchOp::Equal, "__name__", "m3"), m(MatchOp::Equal, "job", "j1")],
        ),
        (
            "stable instances i1.* of m1, last 6 h",
            end - 6 * 3_600_000,
            end,
            vec![m(MatchOp::Equal, "__name__", "m1"), m(MatchOp::RegexMatch, "instance", "i1[0-9]*")],
        ),
    ];
    let mut results: Vec<Vec<f64>> = Vec::new();
    for churn in [false, true] {
        let dir = tmp.path().join(if churn { "churn" } else { "steady" });
        let t0 = Instant::now();
        let created = build_churn_db(&dir, churn);
        let db = strata_tsdb::Db::open(
            &dir,
            strata_tsdb::DbOptions { compact_interval: None, retention_ms: 0, ..Default::default() },
        )
        .unwrap();
        let blocks = db.blocks();
        println!(
            "churn={churn}: {created} series created, {} blocks, {} bytes, built in {:.1?}",
            blocks.len(),
            blocks.iter().map(|b| b.bytes()).sum::<u64>(),
            t0.elapsed()
        );
        let mut row = Vec::new();
        // `CHURN_RUNS=N`: more runs per query (to profile one); `CHURN_IDS=1`: also time each
        // overlapping block's postings alone (`select_ids`).
        let runs: usize = std::env::var("CHURN_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(31);
        for (name, mint, maxt, ms) in &queries {
            let mut lat = Vec::new();
            let mut found = (0, 0);
            for _ in 0..runs {
                let t0 = Instant::now();
                let res = db.querier(*mint, *maxt).select(ms).unwrap();
                let samples: usize = res.iter().map(|s| s.samples().len()).sum();
                lat.push(t0.elapsed().as_secs_f64());
                found = (res.len(), samples);
            }
            if std::env::var("CHURN_IDS").is_ok() {
                for b in db.blocks().iter().filter(|b| b.overlaps(*mint, *maxt)) {
                    let mut l = Vec::new();
                    let mut n = 0;
                    for _ in 0..runs {
                        let t0 = Instant::now();
                        n = b.select_ids(ms).unwrap().len();
                        l.push(t0.elapsed().as_secs_f64());
                    }
                    println!("    block select_ids: {n} ids, {:.3} ms", median(l) * 1e3);
                }
            }
            let med = median(lat);
            println!("  {name}: {} series, {} samples, {:.3} ms (median of {runs})", found.0, found.1, med * 1e3);
            row.push(med);
        }
        results.push(row);
        drop(blocks);
        db.close().unwrap();
    }
    for (i, (name, _, _, _)) in queries.iter().enumerate() {
        println!("  churned/steady {name}: {:.2}x", results[1][i] / results[0][i]);
    }
}

/// The same head-resident data queried with closed chunks on the heap (XOR) and written out to
/// head chunk files (mapped, dense where smaller): 5,000 series × 2 h at a 15 s interval with
/// ±5 ms jitter, values like counters and gauges of a few decimals.
fn bench_head_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = strata_tsdb::DbOptions { compact_interval: None, retention_ms: 0, ..Default::default() };
    let db = strata_tsdb::Db::open(tmp.path(), opts).unwrap();
    let series: Vec<Labels> = (0..5_000)
        .map(|i| Labels::from_pairs([("__name__", format!("m{}", i % 50)), ("instance", format!("i{}", i / 50))]))
        .collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let end = 2 * 3600 * 1000;
    for step in 0..(end / INTERVAL_MS) {
        let mut app = db.appender();
        for (i, l) in series.iter().enumerate() {
            let t = step * INTERVAL_MS + (next() % 11) as i64 - 5;
            let v = if i % 2 == 0 { (step * (i as i64 % 7 + 1)) as f64 } else { (next() % 10_000) as f64 / 100.0 };
            app.append(l, t.max(0), v).unwrap();
        }
        app.commit().unwrap();
    }
    let m = |op, n: &str, v: &str| Matcher::new(op, n, v).unwrap();
    let queries: Vec<(&str, i64, Vec<Matcher>)> = vec![
        ("one series, 2 h", 0, vec![m(MatchOp::Equal, "__name__", "m5"), m(MatchOp::Equal, "instance", "i5")]),
        ("m3 (100 series), 2 h", 0, vec![m(MatchOp::Equal, "__name__", "m3")]),
        ("m3 (100 series), last 1 h", end - 3_600_000, vec![m(MatchOp::Equal, "__name__", "m3")]),
        ("all 5000 series, last 30 min", end - 1_800_000, vec![m(MatchOp::RegexMatch, "__name__", "m.*")]),
    ];
    let run = |label: &str| -> Vec<f64> {
        let mem = db.head().memory();
        println!("{label}: heap chunk bytes {}, chunk files {} bytes", mem.chunks, mem.chunk_files);
        queries
            .iter()
            .map(|(name, mint, ms)| {
                let mut lat = Vec::new();
                let mut found = 0;
                for _ in 0..31 {
                    let t0 = Instant::now();
                    let res = db.querier(*mint, end).select(ms).unwrap();
                    found = res.iter().map(|s| s.samples().len()).sum::<usize>();
                    lat.push(t0.elapsed().as_secs_f64());
                }
                let med = median(lat);
                println!("  {name}: {found} samples, {:.3} ms (median of 31)", med * 1e3);
                med
            })
            .collect()
    };
    let heap = run("closed chunks on the heap");
    db.head().persist_chunks().unwrap();
    let files = run("closed chunks in head chunk files");
    for (i, (name, _, _)) in queries.iter().enumerate() {
        println!("  files/heap {name}: {:.2}x", files[i] / heap[i]);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; anything else not starting with `-` selects groups.
    let groups: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let want = |g: &str| groups.is_empty() || groups.iter().any(|x| x == g);
    if want("chunks") || want("small_chunks") {
        bench_small_chunks();
    }
    if want("chunks") {
        bench_chunks();
    }
    if want("append") || want("select") {
        bench_append_and_select(&groups);
    }
    if want("wal") {
        bench_wal();
    }
    if want("churn") {
        bench_churn();
    }
    if want("head_chunks") {
        bench_head_chunks();
    }
    if want("rollup") {
        bench_rollup();
    }
    if want("names") {
        bench_names();
    }
}

/// `n` Graphite paths of a host tree (`servers.dc<D>.host-<NNNNN>.<metric>`, 100 metrics per
/// host over 5 data centres, as `carbon_compare` sends them), in the order a server takes them
/// from four connections (each connection's paths in order, the connections' batches of 400
/// lines interleaved), or shuffled.
fn host_paths(n: usize, shuffled: bool) -> Vec<String> {
    let mut metrics = Vec::new();
    for cpu in 0..8 {
        for k in ["user", "system", "idle", "iowait"] {
            metrics.push(format!("cpu.cpu{cpu}.{k}"));
        }
    }
    metrics
        .extend(["mem.free", "mem.used", "mem.cached", "mem.buffers", "load.1", "load.5", "load.15"].map(String::from));
    for eth in 0..4 {
        for k in ["rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors"] {
            metrics.push(format!("net.eth{eth}.{k}"));
        }
    }
    for dev in ["sda", "sdb", "sdc", "sdd", "sde", "sdf", "sdg", "sdh"] {
        for k in ["reads", "writes", "read_bytes", "write_bytes", "io_time"] {
            metrics.push(format!("disk.{dev}.{k}"));
        }
    }
    metrics.push("uptime".into());
    let all: Vec<String> = (0..)
        .flat_map(|h| (0..5).flat_map(move |dc| (0..100).map(move |m| (h, dc, m))))
        .take(n)
        .map(|(h, dc, m)| format!("servers.dc{dc}.host-{h:05}.{}", metrics[m]))
        .collect();
    if shuffled {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut out = all;
        for i in (1..out.len()).rev() {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            out.swap(i, (rng % (i as u64 + 1)) as usize);
        }
        return out;
    }
    let connections: Vec<Vec<&String>> = (0..4).map(|c| all.iter().skip(c).step_by(4).collect()).collect();
    let mut out = Vec::with_capacity(n);
    for batch in 0.. {
        let before = out.len();
        for c in &connections {
            out.extend(c.iter().skip(batch * 400).take(400).map(|s| s.to_string()));
        }
        if out.len() == before {
            break;
        }
    }
    out
}

fn bench_names() {
    use strata_tsdb::index::name_dict::{NameDelta, NameDict, NameList};
    let runs = 5;
    for (order, shuffled) in [("arrival", false), ("shuffled", true)] {
        let paths = host_paths(1_000_000, shuffled);
        let mut delta = NameDelta::default();
        for p in &paths {
            delta.add(p);
        }
        let mut half = NameDelta::default();
        for p in &paths[..paths.len() / 2] {
            half.add(p);
        }
        // As the head folds them while new names arrive: 4096 at a time (`DELTA_NAMES_MAX`).
        let deltas: Vec<NameDelta> = paths
            .chunks(4096)
            .map(|chunk| {
                let mut d = NameDelta::default();
                chunk.iter().for_each(|p| d.add(p));
                d
            })
            .collect();
        let (mut fold, mut small_folds, mut merge, mut build) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let t = Instant::now();
            let lists: Vec<NameList> = deltas.iter().map(NameList::from_delta).collect();
            small_folds.push(t.elapsed());
            drop(lists);
            let t = Instant::now();
            let list = NameList::from_delta(&delta);
            fold.push(t.elapsed());
            let other = NameList::from_delta(&half);
            let t = Instant::now();
            let merged = NameList::merge(&other, &list);
            merge.push(t.elapsed());
            let t = Instant::now();
            let dict = NameDict::union_lists(&[], &[&merged], &NameDelta::default());
            build.push(t.elapsed());
            assert_eq!(dict.len(), list.len());
        }
        let ns = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2].as_nanos() as f64 / paths.len() as f64
        };
        println!(
            "names {order:>8}: 1M paths folded {:>6.1} ns/path (4096 at a time {:>6.1} ns/path), merged with a list of half of them {:>6.1} ns/path, dictionary of the merge built {:>6.1} ns/path",
            ns(&mut fold),
            ns(&mut small_folds),
            ns(&mut merge),
            ns(&mut build)
        );
    }
}
