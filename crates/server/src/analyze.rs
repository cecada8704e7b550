//! `strata tsdb analyze` and `strata tsdb dump`: what an operator reads to understand a data
//! directory, in the spirit of `promtool tsdb analyze` / `dump`.

use std::collections::HashMap;
use std::fmt::Write;

use strata_model::Matcher;
use strata_tsdb::chunkenc::TypedValue;
use strata_tsdb::Db;

use crate::status::format_ms;

/// Blocks table, then cardinality tables for one block (`ulid`, or the newest).
/// Each rollup tier: its blocks, buckets and bytes, and over the time where raw blocks hold the
/// same data, how many fewer points a query reads from it and what it costs beside raw data.
fn rollup_savings(out: &mut String, db: &Db, raw: &[std::sync::Arc<strata_tsdb::block::Block>]) {
    let tiers = db.tier_status();
    if tiers.is_empty() {
        return;
    }
    writeln!(out, "rollup tiers:").unwrap();
    for t in &tiers {
        let buckets: u64 = t.blocks.iter().map(|b| b.stats.num_samples).sum();
        let range = match (t.blocks.iter().map(|b| b.min_time).min(), t.blocks.iter().map(|b| b.max_time).max()) {
            (Some(a), Some(b)) => format!("{} .. {}", format_ms(a), format_ms(b)),
            _ => "empty".into(),
        };
        writeln!(out, "  {}: {} blocks, {range}, {buckets} buckets in {} bytes", t.tier, t.blocks.len(), t.bytes)
            .unwrap();
        // Where both hold the same data: the blocks of the time both cover.
        let lo = t
            .blocks
            .iter()
            .map(|b| b.min_time)
            .min()
            .unwrap_or(0)
            .max(raw.first().map_or(i64::MAX, |b| b.meta().min_time));
        let hi = t
            .blocks
            .iter()
            .map(|b| b.max_time)
            .max()
            .unwrap_or(0)
            .min(raw.iter().map(|b| b.meta().max_time).max().unwrap_or(i64::MIN));
        let inside = |min: i64, max: i64| min >= lo && max <= hi;
        let (raw_samples, raw_bytes) = raw
            .iter()
            .filter(|b| inside(b.meta().min_time, b.meta().max_time))
            .fold((0u64, 0u64), |(s, by), b| (s + b.meta().stats.num_samples, by + b.bytes()));
        let tier_buckets: u64 =
            t.blocks.iter().filter(|b| inside(b.min_time, b.max_time)).map(|b| b.stats.num_samples).sum();
        if raw_samples > 0 && tier_buckets > 0 {
            let tier_bytes = t.bytes as f64 * tier_buckets as f64 / buckets.max(1) as f64;
            writeln!(
                out,
                "    where raw blocks hold the same time: {raw_samples} samples in {raw_bytes} bytes against {tier_buckets} buckets in about {:.0} bytes: {:.1}× fewer points to read, {:.1}% of the raw bytes",
                tier_bytes,
                raw_samples as f64 / tier_buckets as f64,
                100.0 * tier_bytes / raw_bytes.max(1) as f64
            )
            .unwrap();
        }
    }
}

pub fn analyze(db: &Db, ulid: Option<&str>, limit: usize) -> Result<String, String> {
    let mut out = String::new();
    let blocks = db.blocks();
    let (mut samples, mut bytes) = (0u64, 0u64);
    writeln!(out, "{} blocks", blocks.len()).unwrap();
    writeln!(
        out,
        "{:<26} {:<24} {:<24} {:>10} {:>12} {:>10} {:>5} {:>12} {:>8}",
        "ULID", "MIN TIME", "MAX TIME", "SERIES", "SAMPLES", "CHUNKS", "LEVEL", "BYTES", "B/SAMPLE"
    )
    .unwrap();
    for b in blocks.iter() {
        let m = b.meta();
        samples += m.stats.num_samples;
        bytes += b.bytes();
        writeln!(
            out,
            "{:<26} {:<24} {:<24} {:>10} {:>12} {:>10} {:>5} {:>12} {:>8.3}",
            m.ulid,
            format_ms(m.min_time),
            format_ms(m.max_time),
            m.stats.num_series,
            m.stats.num_samples,
            m.stats.num_chunks,
            m.compaction.level,
            b.bytes(),
            b.bytes() as f64 / m.stats.num_samples.max(1) as f64
        )
        .unwrap();
    }
    writeln!(
        out,
        "total: {samples} samples in {bytes} bytes ({:.3} bytes/sample)",
        bytes as f64 / samples.max(1) as f64
    )
    .unwrap();
    rollup_savings(&mut out, db, &blocks);
    let head = db.head();
    writeln!(
        out,
        "head: {} series, range {:?}",
        head.num_series(),
        head.time_range().map(|(a, b)| (format_ms(a), format_ms(b)))
    )
    .unwrap();

    let block = match ulid {
        Some(u) => blocks.iter().find(|b| b.ulid() == u).ok_or_else(|| format!("no block {u}"))?,
        None => match blocks.last() {
            Some(b) => b,
            None => return Ok(out),
        },
    };
    let ix = &block.data().map_err(|e| e.to_string())?.index;
    let pairs = ix.pair_counts();
    let mut values_per_name: HashMap<&str, usize> = HashMap::new();
    let mut entries = 0usize;
    for (n, _, c) in &pairs {
        *values_per_name.entry(n).or_default() += 1;
        entries += c;
    }
    writeln!(
        out,
        "\nblock {}: {} label names, {} label pairs, {} postings entries",
        block.ulid(),
        values_per_name.len(),
        pairs.len(),
        entries
    )
    .unwrap();
    let per_series = |b: u64| b as f64 / block.meta().stats.num_series.max(1) as f64;
    let files = strata_tsdb::block::dir_bytes(block.dir());
    let chunks = strata_tsdb::block::dir_bytes(&block.dir().join("chunks"));
    let index = ix.bytes();
    writeln!(
        out,
        "bytes: {files} in all: chunks {chunks}, index {index} ({:.1} per series), other files {}",
        per_series(index),
        files.saturating_sub(chunks + index)
    )
    .unwrap();
    if let Some(s) = ix.section_sizes() {
        writeln!(
            out,
            "index bytes per series: symbols {:.1}, series entries {:.1}, page table and time bounds {:.1}, postings lists {:.1}, postings table {:.1}",
            per_series(s.symbols),
            per_series(s.series),
            per_series(s.page_table),
            per_series(s.postings),
            per_series(s.postings_table)
        )
        .unwrap();
    }
    let mut by_values: Vec<(String, usize)> = values_per_name.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    table(&mut out, "Highest cardinality labels (distinct values)", &mut by_values, limit);
    let mut metrics: Vec<(String, usize)> =
        pairs.iter().filter(|(n, _, _)| *n == "__name__").map(|(_, v, c)| (v.to_string(), *c)).collect();
    table(&mut out, "Highest cardinality metric names (series)", &mut metrics, limit);
    let mut common: Vec<(String, usize)> = pairs.iter().map(|(n, v, c)| (format!("{n}={v}"), *c)).collect();
    table(&mut out, "Most common label pairs (series)", &mut common, limit);
    Ok(out)
}

fn table(out: &mut String, title: &str, rows: &mut [(String, usize)], limit: usize) {
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    writeln!(out, "\n{title}:").unwrap();
    for (k, c) in rows.iter().take(limit) {
        writeln!(out, "{c:>10} {k}").unwrap();
    }
}

/// Writes every sample of the series matching `matchers` in `[mint, maxt]` as
/// `labels value timestamp_ms` lines; a native histogram's value is its text form
/// (`{count:…, sum:…, buckets…}`), as promtool prints it.
pub fn dump(db: &Db, matchers: &[Matcher], mint: i64, maxt: i64, w: &mut dyn std::io::Write) -> Result<u64, String> {
    let mut n = 0;
    for s in db.querier(mint, maxt).select(matchers).map_err(|e| e.to_string())? {
        let labels = s.labels.to_string();
        let mut written = Ok(());
        s.visit(|x| {
            if written.is_ok() {
                written = match x.value {
                    TypedValue::Float(v) => writeln!(w, "{labels} {v} {}", x.t),
                    TypedValue::Histogram(h) => writeln!(w, "{labels} {h} {}", x.t),
                };
                n += 1;
            }
        })
        .map_err(|e| format!("{labels}: {e}"))?;
        written.map_err(|e| e.to_string())?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use strata_model::histogram::notation::parse;
    use strata_model::{Labels, MatchOp};
    use strata_tsdb::DbOptions;

    use super::*;

    #[test]
    fn dump_writes_floats_and_histograms() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Db::open(tmp.path(), DbOptions { compact_interval: None, ..Default::default() }).unwrap();
        let mut app = db.appender();
        app.append(&Labels::from_pairs([("__name__", "f")]), 1000, 1.5).unwrap();
        let h = parse("{{count:3 sum:2.5 buckets:[1 2]}}").unwrap();
        app.append_histogram(&Labels::from_pairs([("__name__", "h")]), 2000, h).unwrap();
        app.commit().unwrap();
        let mut out = Vec::new();
        let all = [Matcher::new(MatchOp::RegexMatch, "__name__", ".+").unwrap()];
        assert_eq!(dump(&db, &all, i64::MIN, i64::MAX, &mut out).unwrap(), 2);
        assert_eq!(String::from_utf8(out).unwrap(), "f{} 1.5 1000\nh{} {count:3, sum:2.5, (0.5,1]:1, (1,2]:2} 2000\n");
    }
}
