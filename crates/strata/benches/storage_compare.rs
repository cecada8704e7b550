//! On-disk size of persisted blocks, Strata against Prometheus, on the node-exporter recording
//! replicated to N instances (an `instance` label per copy).
//!
//! `cargo bench -p strata --bench storage_compare [-- INSTANCES]` (default 100). Writes the
//! replicated OpenMetrics file once, imports it with Strata (2 h blocks, then all blocks merged
//! into one, as compaction ends up doing), and, if `promtool` is on the PATH (Debian's
//! `prometheus` package), with `promtool tsdb create-blocks-from openmetrics` (2 h blocks).
//! Prints bytes per sample for each and the ratio.

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use strata_server::import::import_reader;
use strata_server::textparse::Format;
use strata_tsdb::block::Block;
use strata_tsdb::{Db, DbOptions};

const RECORDING: &str = "../../testdata/node-exporter-600x10s.om.gz";

/// Bytes of every file under the block directories (those with a `meta.json`) of `dir`.
fn blocks_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("meta.json").exists())
        .map(|e| strata_tsdb::block::dir_bytes(&e.path()))
        .sum()
}

/// Writes the recording with `instances` copies of every series, family by family (OpenMetrics
/// wants a family's samples together). Returns the sample count.
fn write_replicated(out: &Path, instances: usize) -> u64 {
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
    for (headers, lines) in &families {
        for h in headers {
            writeln!(w, "{h}").unwrap();
        }
        for i in 0..instances {
            let inst = format!("instance=\"host-{i:05}:9100\"");
            for l in lines {
                match l.find('{') {
                    Some(b) if l[b..].starts_with("{}") => writeln!(w, "{}{{{inst}}}{}", &l[..b], &l[b + 2..]),
                    Some(b) => writeln!(w, "{}{{{inst},{}", &l[..b], &l[b + 1..]),
                    None => {
                        let sp = l.find(' ').unwrap();
                        writeln!(w, "{}{{{inst}}}{}", &l[..sp], &l[sp..])
                    }
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
    let instances: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(100);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("replicated.om");
    let t0 = Instant::now();
    let samples = write_replicated(&file, instances);
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
}
