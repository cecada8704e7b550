//! A human-readable report of an open data directory.

use std::fmt::Write;

use strata_tsdb::db::DbStatus;

/// Formats a millisecond timestamp as RFC 3339 (UTC), without pulling in a date crate.
/// The progress of this process' WAL replay (its one database), shown by
/// `/api/v1/status/walreplay` while the database opens.
pub fn wal_replay_progress() -> &'static strata_tsdb::wal::ReplayProgress {
    static PROGRESS: std::sync::OnceLock<strata_tsdb::wal::ReplayProgress> = std::sync::OnceLock::new();
    PROGRESS.get_or_init(Default::default)
}

pub fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = strata_model::civil::civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, ms.rem_euclid(1000))
}

pub fn render(s: &DbStatus) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "data directory: {}", s.dir.display());
    let _ = writeln!(o, "head series:    {}", s.series);
    match s.time_range {
        Some((a, b)) => {
            let _ = writeln!(o, "head time range: {} .. {}", format_ms(a), format_ms(b));
        }
        None => {
            let _ = writeln!(o, "head time range: (empty)");
        }
    }
    let _ = writeln!(
        o,
        "wal:            {} segment(s), {} bytes; replayed {} record(s) from {} segment(s){}",
        s.wal_segments.len(),
        s.wal_bytes,
        s.replay.records,
        s.replay.segments_read,
        s.replay.checkpoint.map(|c| format!(" after checkpoint {c}")).unwrap_or_default()
    );
    let m = &s.memory;
    let _ = writeln!(
        o,
        "head memory:    {} bytes: series {}, chunks {}, chunk index {}, symbols {}, postings {}, names {}",
        m.series + m.chunks + m.chunk_index + m.symbols + m.postings + m.names,
        m.series,
        m.chunks,
        m.chunk_index,
        m.symbols,
        m.postings,
        m.names
    );
    let _ = writeln!(o, "head chunks:    {} file(s), {} bytes (mapped, not heap)", s.chunk_files, m.chunk_files);
    let samples: u64 = s.blocks.iter().map(|b| b.stats.num_samples).sum();
    let _ = writeln!(o, "blocks:         {} holding {} samples in {} bytes", s.blocks.len(), samples, s.blocks_bytes);
    if let (Some(first), Some(last)) = (s.blocks.first(), s.blocks.last()) {
        let _ = writeln!(o, "blocks range:   {} .. {}", format_ms(first.min_time), format_ms(last.max_time));
    }
    for t in &s.tiers {
        let samples: u64 = t.blocks.iter().map(|b| b.stats.num_samples).sum();
        let range = match (t.blocks.iter().map(|b| b.min_time).min(), t.blocks.iter().map(|b| b.max_time).max()) {
            (Some(a), Some(b)) => format!(", {} .. {}", format_ms(a), format_ms(b)),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "rollup {:<8} {} block(s) holding {} buckets in {} bytes{range}",
            format!("{}:", t.tier),
            t.blocks.len(),
            samples,
            t.bytes
        );
    }
    if let Some((seg, off, why)) = &s.replay.cut {
        let _ = writeln!(o, "wal repaired:   cut segment {seg} at byte {off} ({why})");
    }
    for (title, rows) in [
        ("top metrics by series", &s.cardinality.by_metric),
        ("top label pairs by series", &s.cardinality.by_pair),
        ("top label names by series", &s.cardinality.by_label),
    ] {
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(o, "{title}:");
        for (name, n) in rows {
            let _ = writeln!(o, "  {n:>10}  {name}");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_tsdb::{Db, DbOptions};

    #[test]
    fn timestamps_format_as_rfc3339() {
        assert_eq!(format_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_ms(1_795_332_570_123), "2026-11-22T07:29:30.123Z");
        assert_eq!(format_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn report_shows_series_and_range() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Db::open(tmp.path(), DbOptions::default()).unwrap();
        let mut app = db.appender();
        let up = strata_model::Labels::from_pairs([("__name__", "up"), ("job", "node")]);
        app.append(&up, 1_000, 1.0).unwrap();
        app.append(&up, 2_000, 1.0).unwrap();
        app.commit().unwrap();
        let text = render(&db.status(5).unwrap());
        assert!(text.contains("head series:    1"), "{text}");
        assert!(text.contains("1970-01-01T00:00:01.000Z .. 1970-01-01T00:00:02.000Z"), "{text}");
        assert!(text.contains("job=node"), "{text}");
        assert!(
            text.contains("head memory:") && text.contains(", chunks ") && text.contains("head chunks:    0 file(s)"),
            "{text}"
        );
    }
}
