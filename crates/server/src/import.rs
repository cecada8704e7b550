//! Backfill: samples with timestamps from a text file become blocks, like
//! `promtool tsdb create-blocks-from openmetrics`.

use strata_tsdb::block::BlockMeta;
use strata_tsdb::head::{Head, HeadOptions};
use strata_tsdb::Db;

use crate::textparse::{Entry, Format, Parser};

#[derive(Debug, Clone, Default)]
pub struct ImportOutcome {
    pub samples: u64,
    pub series: u64,
    pub blocks: Vec<BlockMeta>,
}

/// Parses `text` and writes its samples into `db` as blocks. Every sample needs a timestamp,
/// and each series' samples must come in time order; the first violation aborts the import
/// with its line number, before anything is written.
pub fn import_text(db: &Db, text: &str, format: Format) -> Result<ImportOutcome, String> {
    import_reader(db, text.as_bytes(), format)
}

/// `import_text` reading lines from `input` as it goes; only the parsed samples are held in
/// memory (compressed, in a head of the import's own) until the blocks are written.
pub fn import_reader(db: &Db, mut input: impl std::io::BufRead, format: Format) -> Result<ImportOutcome, String> {
    let opts = HeadOptions { chunk_range_ms: db.options().head.chunk_range_ms, backfill: true, ..Default::default() };
    let head = Head::in_memory(opts);
    let mut samples = 0u64;
    let mut app = head.appender();
    let mut pending = 0;
    let mut parser = Parser::new("", format);
    let mut line = String::new();
    let mut line_no = 0usize;
    loop {
        line.clear();
        let n = input.read_line(&mut line).map_err(|e| format!("read line {}: {e}", line_no + 1))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let Some(entry) = parser.parse_line(line.trim_end_matches('\n')) else { continue };
        let Entry::Sample { labels, value, timestamp_ms } = entry.map_err(|e| e.to_string())? else { continue };
        let Some(t) = timestamp_ms else {
            return Err(format!("line {line_no}: {labels} has no timestamp: an import needs one on every sample"));
        };
        app.append(&labels, t, value).map_err(|e| format!("line {line_no}: {labels} at {t}: {e}"))?;
        samples += 1;
        pending += 1;
        if pending == 100_000 {
            app.commit().map_err(|e| e.to_string())?;
            app = head.appender();
            pending = 0;
        }
    }
    app.commit().map_err(|e| e.to_string())?;
    parser.finish().map_err(|e| e.to_string())?;
    let blocks = db.import_head(&head).map_err(|e| e.to_string())?;
    Ok(ImportOutcome { samples, series: head.num_series(), blocks })
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::{MatchOp, Matcher};
    use strata_tsdb::DbOptions;

    #[test]
    fn imports_into_blocks_and_refuses_bad_input_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Db::open(tmp.path(), DbOptions { compact_interval: None, ..Default::default() }).unwrap();
        let text = "# TYPE a gauge\na{x=\"1\"} 1 0\na{x=\"1\"} 2 7200.5\nb 3 10\n# EOF\n";
        let out = import_text(&db, text, Format::OpenMetrics).unwrap();
        assert_eq!((out.samples, out.series, out.blocks.len()), (3, 2, 2));
        let got = db.querier(0, i64::MAX).select(&[Matcher::new(MatchOp::Equal, "x", "1").unwrap()]).unwrap();
        let ts: Vec<i64> = got[0].samples().iter().map(|s| s.t).collect();
        assert_eq!(ts, [0, 7_200_500]);

        let err = import_text(&db, "a 1 5\na 1 4\n# EOF\n", Format::OpenMetrics).unwrap_err();
        assert!(err.contains("out of order"), "{err}");
        let err = import_text(&db, "a 1\n# EOF\n", Format::OpenMetrics).unwrap_err();
        assert!(err.contains("no timestamp"), "{err}");
        let err = import_text(&db, "a{ 1 5\n# EOF\n", Format::OpenMetrics).unwrap_err();
        assert!(err.starts_with("line 1:"), "{err}");
        assert_eq!(db.blocks().len(), 2, "failed imports wrote nothing");
    }
}
