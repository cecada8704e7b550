//! On-disk size of persisted blocks, Strata against Prometheus, on the node-exporter recording
//! replicated to N instances (an `instance` label per copy).
//!
//! `cargo bench -p strata --bench storage_compare [-- INSTANCES] [rotate] [jitter=MS]
//! [minutes=M]` (default 100 identical copies; `rotate` makes each copy read its values from
//! another point of the recording, `jitter=5` moves every timestamp by up to ±5 ms, `minutes=20`
//! keeps the first 20 minutes: many series with few samples each). Writes the
//! replicated OpenMetrics file once, imports it with Strata (2 h blocks, then all blocks merged
//! into one, as compaction ends up doing), and, if `promtool` is on the PATH (Debian's
//! `prometheus` package), with `promtool tsdb create-blocks-from openmetrics` (2 h blocks), and
//! into Debian's `victoria-metrics` (its import API, then `/internal/force_merge`). Prints bytes
//! per sample for each and the ratios.

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use strata_server::import::import_reader;
use strata_server::textparse::Format;
use strata_tsdb::block::Block;
use strata_tsdb::{Db, DbOptions};

mod common;

const RECORDING: &str = "../../testdata/node-exporter-600x10s.om.gz";

/// Imports the OpenMetrics file into a VictoriaMetrics started here (Debian's
/// `victoria-metrics`) through `/api/v1/import/prometheus` (timestamps rewritten to integer
/// milliseconds, 256k lines a request), flushes and force-merges it, and returns the bytes of
/// its data directory; `None` when it is not installed.
fn victoria_metrics_bytes(file: &Path, dir: &Path) -> Option<u64> {
    let mut peer = common::start("victoria-metrics", dir, &[])?;
    let input = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(file).unwrap());
    let mut body = String::with_capacity(64 << 20);
    let mut lines = 0;
    let send = |body: &mut String| {
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", peer.port)).unwrap();
        write!(
            conn,
            "POST /api/v1/import/prometheus HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        conn.write_all(body.as_bytes()).unwrap();
        let mut r = std::io::BufReader::new(conn);
        let (status, resp) = common::read_response(&mut r).unwrap();
        assert!(status < 300, "VictoriaMetrics import: {status} {}", String::from_utf8_lossy(&resp));
        body.clear();
    };
    for line in input.lines() {
        let line = line.unwrap();
        if line.starts_with('#') {
            continue;
        }
        let (rest, ts) = line.rsplit_once(' ').unwrap();
        let ms = (ts.parse::<f64>().unwrap() * 1000.0).round() as i64;
        body.push_str(rest);
        body.push(' ');
        body.push_str(&ms.to_string());
        body.push('\n');
        lines += 1;
        if lines % 262_144 == 0 {
            send(&mut body);
        }
    }
    if !body.is_empty() {
        send(&mut body);
    }
    common::get(peer.port, "/internal/force_flush");
    common::get(peer.port, "/internal/force_merge");
    common::wait_idle(peer.child.id(), std::time::Duration::from_secs(600));
    let bytes = strata_tsdb::block::dir_bytes(&dir.join("data"));
    let _ = peer.child.kill();
    let _ = peer.child.wait();
    Some(bytes)
}

/// Bytes of every file under the block directories (those with a `meta.json`) of `dir`.
fn blocks_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("meta.json").exists())
        .map(|e| strata_tsdb::block::dir_bytes(&e.path()))
        .sum()
}

/// How the copies of the recording differ from each other.
#[derive(Clone, Copy, Debug, Default)]
struct Variation {
    /// Instance `i` reads each series' values starting `37 × i` samples later (wrapping, so a
    /// counter resets once, as on a restart): copies are not byte-identical, as real hosts are not.
    rotate: bool,
    /// Every timestamp moved by up to ± this many milliseconds, as a real scrape loop jitters.
    jitter_ms: i64,
    /// Only the first this many minutes of the recording (0: all of it).
    minutes: usize,
}

/// Splits a sample line into its series key, value and timestamp text.
fn split_line(l: &str) -> (&str, &str, &str) {
    let mut parts = l.rsplitn(3, ' ');
    let ts = parts.next().unwrap();
    let v = parts.next().unwrap();
    (parts.next().unwrap(), v, ts)
}

/// Writes the recording with `instances` copies of every series, family by family (OpenMetrics
/// wants a family's samples together). Returns the sample count.
fn write_replicated(out: &Path, instances: usize, var: Variation) -> u64 {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORDING);
    let f = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(f));
    let mut families: Vec<(Vec<String>, Vec<String>)> = Vec::new();
    for line in reader.lines() {
        let line = line.unwrap();
        if line == "# EOF" {
            break;
        }
        if line.starts_with("# TYPE") || families.is_empty() {
            families.push((Vec::new(), Vec::new()));
        }
        let fam = families.last_mut().unwrap();
        if line.starts_with('#') {
            fam.0.push(line);
        } else {
            fam.1.push(line);
        }
    }
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(out).unwrap());
    let mut samples = 0u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for (headers, lines) in &families {
        for h in headers {
            writeln!(w, "{h}").unwrap();
        }
        // Each line's place in its series, and each series' values in time order.
        let mut values: std::collections::HashMap<&str, Vec<&str>> = Default::default();
        let places: Vec<usize> = lines
            .iter()
            .map(|l| {
                let (key, v, _) = split_line(l);
                let vs = values.entry(key).or_default();
                vs.push(v);
                vs.len() - 1
            })
            .collect();
        for i in 0..instances {
            let inst = format!("instance=\"host-{i:05}:9100\"");
            for (l, &j) in lines.iter().zip(&places) {
                // The recording scrapes every 10 s.
                if var.minutes > 0 && j >= var.minutes * 6 {
                    continue;
                }
                let (key, v, ts) = split_line(l);
                let v = if var.rotate {
                    let vs = &values[key];
                    vs[(j + 37 * i) % vs.len()]
                } else {
                    v
                };
                let ts = if var.jitter_ms > 0 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let ms = (ts.parse::<f64>().unwrap() * 1000.0).round() as i64
                        + (rng % (2 * var.jitter_ms as u64 + 1)) as i64
                        - var.jitter_ms;
                    format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
                } else {
                    ts.to_string()
                };
                match key.find('{') {
                    Some(b) if key[b..].starts_with("{}") => writeln!(w, "{}{{{inst}}} {v} {ts}", &key[..b]),
                    Some(b) => writeln!(w, "{}{{{inst},{} {v} {ts}", &key[..b], &key[b + 1..]),
                    None => writeln!(w, "{key}{{{inst}}} {v} {ts}"),
                }
                .unwrap();
                samples += 1;
            }
        }
    }
    writeln!(w, "# EOF").unwrap();
    w.flush().unwrap();
    samples
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let instances: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(100);
    let var = Variation {
        rotate: args.iter().any(|a| a == "rotate"),
        jitter_ms: args.iter().find_map(|a| a.strip_prefix("jitter=")?.parse().ok()).unwrap_or(0),
        minutes: args.iter().find_map(|a| a.strip_prefix("minutes=")?.parse().ok()).unwrap_or(0),
    };
    println!("copies: {var:?}");
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("replicated.om");
    let t0 = Instant::now();
    let samples = write_replicated(&file, instances, var);
    println!(
        "{instances} instances: {samples} samples, {} bytes of OpenMetrics text (written in {:.1?})",
        std::fs::metadata(&file).unwrap().len(),
        t0.elapsed()
    );

    let ours = tmp.path().join("strata");
    let db = Db::open(&ours, DbOptions { compact_interval: None, ..Default::default() }).unwrap();
    let t0 = Instant::now();
    let input = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(&file).unwrap());
    let out = import_reader(&db, input, Format::OpenMetrics).unwrap();
    let import_time = t0.elapsed();
    assert_eq!(out.samples, samples);
    let blocks: Vec<Arc<Block>> = db.blocks().iter().cloned().collect();
    let strata_2h = blocks_bytes(&ours);
    let merged_dir = tmp.path().join("strata-merged");
    std::fs::create_dir_all(&merged_dir).unwrap();
    let t0 = Instant::now();
    strata_tsdb::compact::merge_blocks(&merged_dir, &blocks).unwrap().unwrap();
    let merge_time = t0.elapsed();
    let strata_merged = blocks_bytes(&merged_dir);
    drop(blocks);
    db.close().unwrap();
    let per = |b: u64| b as f64 / samples as f64;
    println!(
        "strata 2h blocks:     {strata_2h:>12} bytes  {:.3} bytes/sample  (import {import_time:.1?})",
        per(strata_2h)
    );
    println!(
        "strata merged block:  {strata_merged:>12} bytes  {:.3} bytes/sample  (merge {merge_time:.1?})",
        per(strata_merged)
    );
    for block in std::fs::read_dir(&merged_dir).unwrap().flatten() {
        let chunks = strata_tsdb::block::dir_bytes(&block.path().join("chunks"));
        let index = std::fs::metadata(block.path().join("index")).map_or(0, |m| m.len());
        println!(
            "  of which chunks {chunks} bytes ({:.3} bytes/sample), index {index} bytes ({:.3} bytes/sample)",
            per(chunks),
            per(index)
        );
    }

    let prom = tmp.path().join("prometheus");
    let t0 = Instant::now();
    match Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics", "-q"])
        .arg(&file)
        .arg(&prom)
        .status()
    {
        Ok(s) if s.success() => {
            let b = blocks_bytes(&prom);
            println!(
                "prometheus 2h blocks: {b:>12} bytes  {:.3} bytes/sample  (promtool {:.1?})",
                per(b),
                t0.elapsed()
            );
            println!("ratio strata/prometheus at 2h blocks: {:.3}", strata_2h as f64 / b as f64);
        }
        Ok(s) => println!("promtool failed: {s}"),
        Err(e) => println!("promtool not run ({e}); install Debian's prometheus package to compare"),
    }
    let t0 = Instant::now();
    match victoria_metrics_bytes(&file, &tmp.path().join("victoria-metrics")) {
        Some(b) => {
            println!(
                "victoria-metrics:     {b:>12} bytes  {:.3} bytes/sample  (import, force_merge and idle {:.1?})",
                per(b),
                t0.elapsed()
            );
            println!("ratio strata merged/victoria-metrics: {:.3}", strata_merged as f64 / b as f64);
        }
        None => println!("victoria-metrics not found on the PATH; skipped"),
    }
}
