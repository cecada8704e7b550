use std::path::Path;

use strata_model::{Labels, MatchOp, Matcher, Sample};

use super::*;
use crate::compact::write_head_block;
use crate::head::{Head, HeadOptions};

fn m(op: MatchOp, n: &str, v: &str) -> Matcher {
    Matcher::new(op, n, v).unwrap()
}

/// A head with `n` series `{__name__="metric_<i%3>", i="<i>"}` sampled every 10 ms over [0, 1000).
fn head(n: usize) -> Head {
    let head = Head::in_memory(HeadOptions { chunk_range_ms: 1000, ..Default::default() });
    for t in (0..1000).step_by(10) {
        let mut app = head.appender();
        for i in 0..n {
            let l = Labels::from_pairs([("__name__", format!("metric_{}", i % 3)), ("i", i.to_string())]);
            app.append(&l, t, (i * 1000 + t as usize) as f64).unwrap();
        }
        app.commit().unwrap();
    }
    head
}

fn write(dir: &Path, head: &Head) -> Block {
    let meta = write_head_block(head, dir, 0, 1000).unwrap().expect("a block with data");
    assert_eq!(meta.stats.num_series, 50);
    assert_eq!(meta.stats.num_samples, 50 * 100);
    assert_eq!(meta.compaction.sources, vec![meta.ulid.clone()]);
    Block::open(&dir.join(&meta.ulid)).unwrap()
}

fn read_series(b: &Block, id: SeriesRef) -> (Labels, Vec<Sample>) {
    let data = b.data().unwrap();
    let mut metas = Vec::new();
    let labels = data.index.series(id, &mut metas).unwrap();
    let mut samples = Vec::new();
    for c in &metas {
        let mut it = crate::chunkenc::ChunkIterator::new(data.chunks.chunk(c.chunk).unwrap()).unwrap();
        it.decode_into(&mut samples);
        assert!(samples.last().unwrap().t <= c.maxt);
    }
    (labels, samples)
}

#[test]
fn a_block_holds_what_the_head_held_in_label_order() {
    let tmp = tempfile::tempdir().unwrap();
    let b = write(tmp.path(), &head(50));
    assert!(!tmp.path().join(format!("{}.tmp", b.ulid())).exists());
    let all = b.select_ids(&[]).unwrap();
    assert_eq!(all.len(), 50);
    let mut last: Option<Labels> = None;
    for id in all {
        let (labels, samples) = read_series(&b, id);
        let i: usize = labels.get("i").unwrap().parse().unwrap();
        assert_eq!(samples.len(), 100);
        for (k, s) in samples.iter().enumerate() {
            assert_eq!((s.t, s.v), (k as i64 * 10, (i * 1000 + k * 10) as f64));
        }
        assert!(last.as_ref().is_none_or(|l| *l < labels), "ids ascend in label order");
        last = Some(labels);
    }
    let ids = b.select_ids(&[m(MatchOp::Equal, "__name__", "metric_1"), m(MatchOp::RegexMatch, "i", "1.*")]).unwrap();
    let got: Vec<String> = ids.iter().map(|&id| read_series(&b, id).0.get("i").unwrap().to_owned()).collect();
    assert_eq!(got, ["1", "10", "13", "16", "19"]);
    let ids = b.select_ids(&[m(MatchOp::NotEqual, "__name__", "metric_0"), m(MatchOp::RegexNoMatch, "i", "[0-3].*")]);
    assert_eq!(ids.unwrap().len(), 11);
    assert!(b.select_ids(&[m(MatchOp::Equal, "nope", "x")]).unwrap().is_empty());
    let ix = &b.data().unwrap().index;
    assert_eq!(ix.label_names(), ["__name__", "i"]);
    assert_eq!(ix.label_values("__name__"), ["metric_0", "metric_1", "metric_2"]);
}

#[test]
fn deletions_are_tombstones_that_survive_reopening() {
    let tmp = tempfile::tempdir().unwrap();
    let b = write(tmp.path(), &head(50));
    assert_eq!(b.delete(&[m(MatchOp::Equal, "__name__", "metric_2")], 100, 199).unwrap(), 16);
    let reopened = Block::open(b.dir()).unwrap();
    assert_eq!(reopened.tombstones().len(), 16);
    assert!(reopened.tombstones().values().all(|v| v == &[(100, 199)]));
}

/// Flips one byte at `at` (from the end if negative) of `path`.
fn flip(path: &Path, at: i64) {
    let mut data = std::fs::read(path).unwrap();
    let i = if at < 0 { (data.len() as i64 + at) as usize } else { at as usize };
    data[i] ^= 0x40;
    std::fs::write(path, data).unwrap();
}

#[test]
fn a_corrupt_index_is_detected_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = write(tmp.path(), &head(50)).dir().to_owned();

    // The table of contents is checked on open.
    flip(&dir.join("index"), -10);
    let err = Block::open(&dir).unwrap().data().unwrap_err().to_string();
    assert!(err.contains("index: table of contents checksum mismatch"), "{err}");
    flip(&dir.join("index"), -10);

    // A series entry is checked when read: flip a byte inside the first one (after the symbols).
    let b = Block::open(&dir).unwrap();
    let first = b.select_ids(&[]).unwrap()[0];
    drop(b);
    flip(&dir.join("index"), (first.0 * index::SERIES_ALIGN) as i64 + 2);
    let b = Block::open(&dir).unwrap();
    let mut metas = Vec::new();
    let err = b.data().unwrap().index.series(first, &mut metas).unwrap_err();
    assert!(err.contains(&format!("series {}: checksum mismatch", first.0)), "{err}");
}
