//! Graphite find over the names indexes, on a host-shaped tree of dotted paths:
//! `servers.dc<D>.host-<NNNNN>.<metric>` with 100 metrics per host (cpu per core, memory, load,
//! network per interface, disk per device), 5 data centres, as many hosts as the path count
//! needs.
//!
//! Reports, for `--paths` paths: the dictionary's build time, peak memory and size; then the
//! median and p90 latency of four finds (an exact path, a prefixed glob, a leading-star glob, a
//! glob with braces) through
//! - `dict`: a built dictionary (what a block's `names` file is, mapped),
//! - `head`: the head's dictionaries with the last 1/16 of the names folded into levels a few
//!   thousand at a time and the rest in its delta (as between two rebuilds),
//! - `scan`: the reference finder reading every path from the glob's literal start (what
//!   find did before the index).
//!
//! `cargo bench -p strata --bench graphite_find -- --paths 1000000` (add `--build-only` for the
//! 10M build figures, `--irregular` for hosts that each lack some metrics: regular hosts share
//! their whole subtree, which the tries store once; `--rebuild` times the head's whole names
//! rebuild, what its background maintenance runs after a burst of new paths, instead of the
//! finds; `--in-levels` leaves every path in the head's levels, as a burst does until that
//! rebuild).

use std::time::{Duration, Instant};

mod common;

use strata_graphite::find::find as reference_find;
use strata_graphite::glob::Glob;
use strata_model::{Labels, METRIC_NAME};
use strata_tsdb::head::{Head, HeadOptions};
use strata_tsdb::index::name_dict::{NameDict, NamePattern};
use strata_tsdb::querier::Querier;

const QUERIES: [&str; 4] = [
    "servers.dc3.host-00042.cpu.cpu3.user",
    "servers.dc2.*.load.1",
    "*.*.*.net.eth0.rx_bytes",
    "servers.*.host-00042.{cpu,mem}.*",
];

/// `n` paths; `irregular`: each host lacks a pseudo-random fifth of the metrics (as real
/// hosts differ), so hosts share no subtree and the tries cannot fold them together.
fn paths(n: usize, irregular: bool) -> Vec<String> {
    let metrics = common::host_metrics();
    let per_host = if irregular { metrics.len() * 4 / 5 } else { metrics.len() };
    let hosts = n.div_ceil(5 * per_host);
    let mut out = Vec::with_capacity(n);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    'all: for h in 0..hosts {
        for dc in 0..5 {
            for m in &metrics {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if irregular && x.is_multiple_of(5) {
                    continue;
                }
                if out.len() == n {
                    break 'all;
                }
                out.push(format!("servers.dc{dc}.host-{h:05}.{m}"));
            }
        }
    }
    out
}

/// Peak resident memory since the last reset, in bytes (Linux), and a reset.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn time_per_call(mut f: impl FnMut() -> usize) -> (Duration, Duration, usize) {
    let mut found = 0;
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < 20 || (started.elapsed() < Duration::from_secs(2) && times.len() < 2000) {
        let t = Instant::now();
        found = f();
        times.push(t.elapsed());
    }
    times.sort();
    (times[times.len() / 2], times[times.len() * 9 / 10], found)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let n: usize = arg("--paths").and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let build_only = args.iter().any(|a| a == "--build-only");
    let irregular = args.iter().any(|a| a == "--irregular");

    let paths = paths(n, irregular);
    let path_bytes: usize = paths.iter().map(String::len).sum();
    println!("{n} paths, {:.1} MiB of path text", path_bytes as f64 / (1 << 20) as f64);
    reset_peak_rss();
    let before = peak_rss();
    let t = Instant::now();
    let dict = NameDict::build(paths.iter().map(String::as_str));
    let build = t.elapsed();
    let peak = peak_rss().saturating_sub(before);
    println!(
        "build: {:.2} s, peak +{:.0} MiB while building, {} nodes, {:.1} KiB of tries ({:.2} bytes per path)",
        build.as_secs_f64(),
        peak as f64 / (1 << 20) as f64,
        dict.len(),
        dict.bytes() as f64 / 1024.0,
        dict.bytes() as f64 / n as f64
    );
    if build_only {
        return;
    }

    let head = Head::in_memory(HeadOptions::default());
    // `--in-levels`: every name folded into levels as it came (what a burst of new paths
    // leaves until the rebuild after it), instead of the last sixteenth.
    let in_delta = if args.iter().any(|a| a == "--in-levels") { n } else { n / 16 };
    let t = Instant::now();
    for (i, p) in paths.iter().enumerate() {
        if i == n - in_delta {
            head.rebuild_names();
        }
        let mut app = head.appender();
        app.append(&Labels::from_pairs([(METRIC_NAME, p.as_str())]), 1000, 1.0).expect("append");
        app.commit().expect("commit");
        // What the background maintenance does meanwhile (once a second in a server): fold
        // each few thousand new names into a level.
        if i > n - in_delta && i % 4096 == 0 {
            head.maintain_names();
        }
    }
    let names = head.names_stats();
    println!(
        "head: {n} series in {:.1} s; names dictionaries {} nodes in {}, delta {} names",
        t.elapsed().as_secs_f64(),
        names.dictionary_nodes,
        names.dictionaries,
        names.delta_names
    );
    // What the head's background maintenance does once the delta has grown: a whole rebuild.
    if args.iter().any(|a| a == "--rebuild") {
        reset_peak_rss();
        let before = peak_rss();
        let t = Instant::now();
        head.rebuild_names();
        println!(
            "head names rebuild: {:.2} s, peak +{:.0} MiB",
            t.elapsed().as_secs_f64(),
            peak_rss().saturating_sub(before) as f64 / (1 << 20) as f64
        );
        return;
    }
    let mut sorted = paths.clone();
    sorted.sort();

    println!("{:<40} {:>8} {:>12} {:>12} {:>12}", "find", "nodes", "dict p50/p90", "head p50/p90", "scan p50/p90");
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for q in QUERIES {
        let glob = Glob::parse(q).expect("glob");
        let pattern = NamePattern::new(&glob.to_regex()).expect("pattern");
        let (d50, d90, found) = time_per_call(|| {
            let mut k = 0;
            dict.search(&pattern, |_, _| {
                k += 1;
                true
            });
            k
        });
        let (h50, h90, head_found) = time_per_call(|| {
            let q = Querier::new(&head, i64::MIN, i64::MAX);
            q.find_names(&pattern, usize::MAX).expect("find").len()
        });
        let (s50, s90, scan_found) =
            time_per_call(|| reference_find(&glob, &sorted, usize::MAX).expect("reference find").len());
        assert_eq!((found, head_found), (scan_found, scan_found), "{q}: the three ways disagree");
        println!(
            "{q:<40} {found:>8} {:>5.3}/{:<6.3} {:>5.3}/{:<6.3} {:>5.1}/{:<6.1} ms{}",
            ms(d50),
            ms(d90),
            ms(h50),
            ms(h90),
            ms(s50),
            ms(s90),
            if pattern.walks_reversed() { " (reversed walk)" } else { "" }
        );
    }
}
