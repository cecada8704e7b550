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
    let meta = write_head_block(&crate::vfs::OsFs::shared(), head, dir, 0, 1000, crate::compact::HeadCut::ALL)
        .unwrap()
        .expect("a block with data");
    assert_eq!(meta.stats.num_series, 50);
    assert_eq!(meta.stats.num_samples, 50 * 100);
    assert_eq!(meta.compaction.sources, vec![meta.ulid.clone()]);
    Block::open(&dir.join(&meta.ulid)).unwrap()
}

fn read_series(b: &Block, id: SeriesRef) -> (Labels, Vec<Sample>) {
    let data = b.data().unwrap();
    let mut metas = Vec::new();
    let labels = data.index.series(id, &mut metas, &mut Default::default()).unwrap();
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

    // A series is checked when read (its page, once): flip a byte inside the first one (where
    // the TOC's second offset says the series start: the first frame of pages, compressed).
    let b = Block::open(&dir).unwrap();
    let first = b.select_ids(&[]).unwrap()[0];
    let second = b.select_ids(&[]).unwrap()[1];
    drop(b);
    let data = std::fs::read(dir.join("index")).unwrap();
    let toc = &data[data.len() - index::TOC_BYTES..];
    let series_at = u64::from_be_bytes(toc[8..16].try_into().unwrap());
    flip(&dir.join("index"), series_at as i64 + 2);
    let b = Block::open(&dir).unwrap();
    let mut metas = Vec::new();
    for id in [first, second] {
        let err = b.data().unwrap().index.series(id, &mut metas, &mut Default::default()).unwrap_err();
        assert!(
            err.contains(&format!("series {}: checksum mismatch in series page 0", id.0))
                || err.contains(&format!("series {}: series frame 0 does not decompress", id.0)),
            "{err}"
        );
    }
}

mod index_round_trip {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use proptest::prelude::*;
    use strata_model::{Labels, SeriesRef};

    use crate::block::chunks::ChunkRef;
    use crate::block::index::{ChunkMetaRef, IndexFile, IndexWriter};
    use crate::index::postings::{self, Postings};

    /// Series: label values from a small alphabet (so pairs repeat across series), and chunk
    /// metas as (gap before, span, bytes) steps so they never overlap and refs only grow.
    /// Label name → value ids, and chunk steps.
    type SeriesInput = (std::collections::BTreeMap<u8, u8>, Vec<(u32, u32, u32)>);

    fn series() -> impl Strategy<Value = Vec<SeriesInput>> {
        let labels = prop::collection::btree_map(0u8..6, 0u8..8, 1..5);
        let chunks = prop::collection::vec((1u32..100_000, 0u32..1_000_000, 4u32..5000), 0..20);
        prop::collection::vec((labels, chunks), 1..60)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn what_is_written_is_read_back(
            input in series(),
            t0 in -1_000_000_000_000i64..2_000_000_000_000,
            // Times in whole seconds or scrape intervals, as carbon and scrapers write them,
            // make a page's time unit more than a millisecond.
            unit in prop_oneof![Just(1i64), Just(1000), Just(15_000)],
            // Query ranges (start from t0, length) for the series' time bounds.
            ranges in prop::collection::vec((-1_000_000_000i64..30_000_000_000, 0i64..5_000_000_000), 1..12),
        ) {
            let t0 = t0 - t0.rem_euclid(unit);
            let mut sets: Vec<(Labels, Vec<ChunkMetaRef>)> = Vec::new();
            let mut seen = BTreeSet::new();
            let mut offset = 8u64;
            for (pairs, chunks) in input {
                let l = Labels::from_pairs(pairs.iter().map(|(n, v)| (format!("l{n}"), format!("v{v}"))));
                if !seen.insert(l.clone()) {
                    continue;
                }
                let mut t = t0;
                let metas = chunks
                    .iter()
                    .map(|&(gap, span, bytes)| {
                        let mint = t + gap as i64 * unit;
                        let maxt = mint + span as i64 * unit;
                        t = maxt;
                        offset += bytes as u64;
                        ChunkMetaRef { mint, maxt, chunk: ChunkRef::new(1 + (offset >> 29) as u32, (offset & ((1 << 29) - 1)) as u32) }
                    })
                    .collect();
                sets.push((l, metas));
            }
            sets.sort_by(|a, b| a.0.cmp(&b.0));
            let symbols: BTreeSet<Arc<str>> =
                sets.iter().flat_map(|(l, _)| l.iter().flat_map(|x| [x.name.clone(), x.value.clone()])).collect();
            let symbols: Vec<Arc<str>> = symbols.into_iter().collect();
            let tmp = tempfile::tempdir().unwrap();
            let path = tmp.path().join("index");
            let mut w = IndexWriter::create(&crate::vfs::OsFs, &path, &symbols).unwrap();
            for (l, metas) in &sets {
                w.add_series(l, metas).unwrap();
            }
            w.finish().unwrap();

            let ix = IndexFile::open(&crate::vfs::OsFs, &path).unwrap();
            let ids = postings::expand(Box::new(ix.all_postings().unwrap()));
            prop_assert_eq!(ids.len(), sets.len());
            let mut got = Vec::new();
            for (&id, (l, metas)) in ids.iter().zip(&sets) {
                prop_assert_eq!(&ix.series(id, &mut got, &mut Default::default()).unwrap(), l);
                prop_assert_eq!(&got, metas);
            }
            // In order and backwards through one cache: entries found from the last one read,
            // and from their page's start, whose first entry the others are relative to.
            let mut cache = Default::default();
            for (&id, (l, metas)) in ids.iter().zip(&sets).chain(ids.iter().zip(&sets).rev()) {
                prop_assert_eq!(&ix.series(id, &mut got, &mut cache).unwrap(), l);
                prop_assert_eq!(&got, metas);
            }
            // Every label pair's list holds exactly the series with that pair.
            for (i, (l, _)) in sets.iter().enumerate() {
                for x in l {
                    let mut p = ix.postings(&x.name, &x.value).unwrap().unwrap();
                    prop_assert_eq!(p.seek(ids[i]), Some(ids[i]));
                }
            }
            // Time bounds: a series with a chunk in range is never passed over, and one whose
            // chunks all lie more than a bounds unit away from the range always is.
            let hulls: Vec<Option<(i64, i64)>> =
                sets.iter().map(|(_, m)| Some((m.first()?.mint, m.last()?.maxt))).collect();
            let (base, top) = hulls.iter().flatten().fold((i64::MAX, i64::MIN), |(b, t), h| (b.min(h.0), t.max(h.1)));
            let bounds_unit = if base <= top { ((top as i128 - base as i128) / 65536 + 1) as i64 } else { 1 };
            // Left out when fewer than one series in 16 spans less than half of the block (one
            // without chunks counts as partial): then no series is passed over.
            let half = if base <= top { (top as i128 - base as i128) / 2 } else { 0 };
            let partial = hulls.iter().filter(|h| h.is_none_or(|(a, b)| (b as i128 - a as i128) < half)).count();
            let kept = partial * super::index::BOUNDS_PARTIAL_SHARE_MIN >= hulls.len();
            prop_assert_eq!(ix.time_filter(i64::MIN, i64::MAX).is_some(), kept);
            if let Some(everything) = ix.time_filter(i64::MIN, i64::MAX) {
            for (&id, hull) in ids.iter().zip(&hulls) {
                prop_assert_eq!(everything.may_overlap(id), hull.is_some());
            }
            // Random ranges, and ranges that end at a series' first sample or start at its last
            // (or one millisecond short of them), where rounding to bounds steps could go wrong.
            let mut queries: Vec<(i64, i64)> = ranges.iter().map(|&(from, len)| (t0 + from, t0 + from + len)).collect();
            let len = ranges[0].1;
            for &(first, last) in hulls.iter().flatten() {
                queries.extend([(last, last + len), (last + 1, last + 1 + len), (first - len, first), (first - len - 1, first - 1)]);
            }
            for (mint, maxt) in queries {
                let filter = ix.time_filter(mint, maxt).expect("kept time bounds");
                for ((&id, (_, metas)), hull) in ids.iter().zip(&sets).zip(&hulls) {
                    let may = filter.may_overlap(id);
                    if metas.iter().any(|c| c.maxt >= mint && c.mint <= maxt) {
                        prop_assert!(may, "series {} with a chunk in [{}, {}] passed over", id.0, mint, maxt);
                    }
                    match hull {
                        None => prop_assert!(!may),
                        Some((first, last)) if *last < mint - bounds_unit || *first > maxt + bounds_unit => {
                            prop_assert!(!may, "series {} over [{}, {}] kept for [{}, {}] (unit {})", id.0, first, last, mint, maxt, bounds_unit)
                        }
                        _ => {}
                    }
                }
                // The same filter as a postings cursor: alone (walked by `next`), and sought in
                // by an intersection with a label's postings, it keeps exactly those series.
                // (A superset: a long run of passed-over series yields its last one.)
                let kept: Vec<SeriesRef> = ids.iter().copied().filter(|&id| filter.may_overlap(id)).collect();
                let walked: Vec<SeriesRef> = {
                    let mut p = ix.overlap_postings(mint, maxt).expect("kept time bounds");
                    std::iter::from_fn(|| p.next()).take_while(|id| (id.0 as usize) < ids.len()).collect()
                };
                prop_assert!(walked.windows(2).all(|w| w[0] < w[1]));
                prop_assert_eq!(walked.iter().copied().filter(|&id| filter.may_overlap(id)).collect::<Vec<_>>(), kept);
                for value in ["v0", "v3"] {
                    let Some(label) = ix.postings("l0", value).unwrap() else { continue };
                    let all = postings::expand(Box::new(label.clone()));
                    let want: Vec<SeriesRef> = all.iter().copied().filter(|&id| filter.may_overlap(id)).collect();
                    let overlapping = ix.overlap_postings(mint, maxt).expect("kept time bounds");
                    let got = postings::expand(postings::intersect(vec![Box::new(label), Box::new(overlapping)]));
                    prop_assert!(got.iter().all(|id| all.contains(id)));
                    prop_assert_eq!(got.into_iter().filter(|&id| filter.may_overlap(id)).collect::<Vec<_>>(), want);
                }
            }
            }
            let want: Vec<SeriesRef> =
                sets.iter().zip(&ids).filter(|(s, _)| s.0.get("l0") == Some("v3")).map(|(_, id)| *id).collect();
            let got = ix.postings("l0", "v3").unwrap().map(|p| postings::expand(Box::new(p))).unwrap_or_default();
            prop_assert_eq!(got, want);
            // Several values of a name at once (some absent): the series with any of them.
            for (n, wanted) in [("l1", &["v0", "v2", "v5", "v9"][..]), ("l2", &["v7"][..]), ("l6", &["v1"][..])] {
                let want: Vec<SeriesRef> = sets
                    .iter()
                    .zip(&ids)
                    .filter(|(s, _)| s.0.get(n).is_some_and(|v| wanted.contains(&v)))
                    .map(|(_, id)| *id)
                    .collect();
                let lists = ix.postings_of_values(n, wanted).unwrap();
                let got = postings::expand(postings::merge(lists.into_iter().map(|p| Box::new(p) as Box<dyn Postings>).collect()));
                prop_assert_eq!(got, want);
            }
        }
    }

    /// Many values of one name asked at once are found in one walk over their rows, few far
    /// apart one by one: the same series either way, absent values skipped.
    #[test]
    fn postings_of_many_values_equal_those_of_each() {
        let names: Vec<String> = (0..3000).map(|i| format!("servers.host-{i:04}.load")).collect();
        let sets: Vec<Labels> = names.iter().map(|n| Labels::from_pairs([("__name__", n.clone())])).collect();
        let mut symbols: Vec<Arc<str>> = names.iter().map(|n| Arc::from(n.as_str())).collect();
        symbols.push(Arc::from("__name__"));
        symbols.sort();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("index");
        let mut w = IndexWriter::create(&crate::vfs::OsFs, &path, &symbols).unwrap();
        for l in &sets {
            w.add_series(l, &[]).unwrap();
        }
        w.finish().unwrap();
        let ix = IndexFile::open(&crate::vfs::OsFs, &path).unwrap();
        let ids = postings::expand(Box::new(ix.all_postings().unwrap()));
        let one_by_one = |wanted: &[&str]| -> Vec<SeriesRef> {
            wanted
                .iter()
                .filter_map(|v| ix.postings("__name__", v).unwrap())
                .flat_map(|p| postings::expand(Box::new(p)))
                .collect()
        };
        let absent = "servers.host-1500a.load";
        let cases: [Vec<&str>; 4] = [
            // A glob's worth: walked.
            names[100..1100].iter().map(String::as_str).collect(),
            // Every third of a range, with an absent one: walked.
            names[10..400].iter().step_by(3).map(String::as_str).chain([absent]).collect(),
            // Two far apart: looked up.
            vec![names[5].as_str(), names[2900].as_str()],
            vec![absent],
        ];
        for mut wanted in cases {
            wanted.sort_unstable();
            let lists = ix.postings_of_values("__name__", &wanted).unwrap();
            let got = postings::expand(postings::merge(
                lists.into_iter().map(|p| Box::new(p) as Box<dyn Postings>).collect(),
            ));
            let mut want = one_by_one(&wanted);
            want.sort_unstable();
            assert_eq!(got, want, "{} values", wanted.len());
            assert_eq!(got.len(), wanted.iter().filter(|v| **v != absent).count());
            assert!(got.iter().all(|id| ids.contains(id)));
        }
    }
}

/// The worked example of docs/format/block.md, byte for byte: series `{a="ab", x="y"}` with one
/// chunk over [1000, 2000] and `{a="ac", x="y"}` with one over [3000, 5000], the two chunks of
/// the group at byte 32 of segment 1.
#[test]
fn index_bytes_match_the_format_document() {
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("index");
    let symbols: Vec<Arc<str>> = ["a", "ab", "ac", "x", "y"].into_iter().map(Arc::from).collect();
    let mut w = index::IndexWriter::create(&crate::vfs::OsFs, &path, &symbols).unwrap();
    let chunk = |place: u32, mint, maxt| ChunkMetaRef { mint, maxt, chunk: ChunkRef::new(1, 0x100 + place) };
    let series = [
        (Labels::from_pairs([("a", "ab"), ("x", "y")]), chunk(0, 1000, 2000)),
        (Labels::from_pairs([("a", "ac"), ("x", "y")]), chunk(1, 3000, 5000)),
    ];
    for (labels, c) in &series {
        w.add_series(labels, &[*c]).unwrap();
    }
    w.finish().unwrap();
    let got: Vec<String> = std::fs::read(&path).unwrap().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(got, doc_example_hex("block.md", "index-example"), "index bytes:\n{}", got.join(" "));
    let ix = IndexFile::open(&crate::vfs::OsFs, &path).unwrap();
    let mut chunks = Vec::new();
    for (id, (labels, c)) in series.iter().enumerate().rev() {
        assert_eq!(&ix.series(SeriesRef(id as u64), &mut chunks, &mut index::ReadCache::default()).unwrap(), labels);
        assert_eq!(chunks, [*c]);
    }
}

/// Time bounds that cannot be read (a unit of 0, bounds for fewer series than the block has) and
/// frame rows that do not fit the pages make the index corrupt, named, however well their
/// section's checksum matches.
#[test]
fn damaged_time_bounds_are_reported() {
    let bytes: Vec<u8> =
        doc_example_hex("block.md", "index-example").iter().map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    // The page table section: its length at 0x33, its body from 0x37, its CRC after the body.
    let reopen = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = bytes.clone();
        let mut body = b[0x37..0x37 + 29].to_vec();
        edit(&mut body);
        let mut section = (body.len() as u32).to_be_bytes().to_vec();
        section.extend_from_slice(&body);
        section.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        b.splice(0x33..0x37 + 29 + 4, section);
        let toc_at = b.len() - index::TOC_BYTES;
        // The postings table moved with the page table's length.
        let shift = body.len() as i64 - 29;
        let table_at = u64::from_be_bytes(b[toc_at + 24..toc_at + 32].try_into().unwrap()) as i64 + shift;
        b[toc_at + 24..toc_at + 32].copy_from_slice(&(table_at as u64).to_be_bytes());
        let crc = crc32c::crc32c(&b[toc_at..toc_at + index::TOC_BYTES - 4]);
        let n = b.len();
        b[n - 4..].copy_from_slice(&crc.to_be_bytes());
        IndexFile::from_bytes(Path::new("b/index"), bytes::Bytes::from(b))
    };
    assert!(reopen(&|_| {}).is_ok(), "the example itself opens");
    // Body: count, the page row (15 bytes), the frame rows (3), base, unit, 8 bytes of bounds.
    let err = reopen(&|body| body[20] = 0).unwrap_err();
    assert!(err.contains("unit is 0"), "{err}");
    let err = reopen(&|body| body.truncate(body.len() - 4)).unwrap_err();
    assert!(err.contains("4 bytes of time bounds for 2 series"), "{err}");
    // The one frame claims two pages; then 19 compressed bytes of the 20 it has.
    let err = reopen(&|body| body[17] = 2).unwrap_err();
    assert!(err.contains("frame 0 holds 2 pages past the last"), "{err}");
    let err = reopen(&|body| body[18] = 19).unwrap_err();
    assert!(err.contains("frames do not cover the series exactly"), "{err}");
}

/// The bytes of the worked example after `<!-- marker -->` in `docs/format/<file>`: the first
/// code block's lines, each an offset then hex bytes, then an optional `# comment`.
pub(crate) fn doc_example_hex(file: &str, marker: &str) -> Vec<String> {
    let path = format!("{}/../../docs/format/{file}", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc.find(&format!("<!-- {marker} -->")).expect("marker in the document");
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with("```"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .flat_map(|l| l.split('#').next().unwrap().split_whitespace().skip(1).map(str::to_owned))
        .collect()
}

#[test]
fn name_regexes_use_the_blocks_names_file_and_old_blocks_without_one_still_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let b = write(tmp.path(), &head(50));
    let data = b.data().unwrap();
    let dict = data.names.as_ref().expect("a new block has a names file");
    assert_eq!(dict.names(), ["metric_0", "metric_1", "metric_2"]);
    let want = b.select_ids(&[m(MatchOp::Equal, "__name__", "metric_1")]).unwrap();
    assert_eq!(b.select_ids(&[m(MatchOp::RegexMatch, "__name__", ".*_1")]).unwrap(), want);
    assert_eq!(b.select_ids(&[m(MatchOp::RegexMatch, "__name__", "metric_[01]")]).unwrap().len(), 34);

    // Without the file (a block written before it existed), the same answers by scanning.
    std::fs::remove_file(b.dir().join(names::NAMES_FILE)).unwrap();
    let old = Block::open(b.dir()).unwrap();
    assert!(old.data().unwrap().names.is_none());
    assert_eq!(old.select_ids(&[m(MatchOp::RegexMatch, "__name__", ".*_1")]).unwrap(), want);

    // A damaged file is a corrupt block, named.
    std::fs::write(b.dir().join(names::NAMES_FILE), b"STNM\x01\x00\x00\x00junk").unwrap();
    let bad = Block::open(b.dir()).unwrap();
    let err = bad.data().unwrap_err().to_string();
    assert!(err.contains("names"), "{err}");
}

/// The version-1 example of `docs/format/block.md` as it was: such indexes still open and read.
#[test]
fn version_1_indexes_are_still_read() {
    let hex = "53 54 49 58 01 00 00 00 00 00 00 05 02 01 61 01 62 f8 2a 91 84 00 00 00 00 00 00 00 00 00 00 00 \
               0d 01 00 01 01 d0 0f e8 07 88 80 80 80 10 89 54 69 68 00 00 00 04 00 00 00 02 a9 5c 3b 30 \
               00 00 00 04 00 00 00 02 a9 5c 3b 30 00 00 00 04 01 00 01 3e 1a 1b 8f 9e \
               00 00 00 00 00 00 00 08 00 00 00 00 00 00 00 20 00 00 00 00 00 00 00 32 00 00 00 00 00 00 00 4a \
               7b 03 e0 4c";
    let bytes: Vec<u8> = hex.split_whitespace().map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    let ix = index::IndexFile::from_bytes(Path::new("v1/index"), bytes::Bytes::from(bytes.clone())).unwrap();
    let mut all = ix.all_postings().unwrap();
    assert_eq!(all.len(), 1);
    let id = crate::index::postings::Postings::next(&mut all).unwrap();
    assert_eq!(id.0, 2);
    let mut chunks = Vec::new();
    let labels = ix.series(id, &mut chunks, &mut index::ReadCache::default()).unwrap();
    assert_eq!(labels, Labels::from_pairs([("a", "b")]));
    assert_eq!(chunks, [ChunkMetaRef { mint: 1000, maxt: 2000, chunk: ChunkRef::new(1, 8) }]);
    assert_eq!(ix.pair_counts(), [("a".to_owned(), "b".to_owned(), 1)]);

    let mut unknown = bytes;
    unknown[4] = index::VERSION + 1;
    let err = index::IndexFile::from_bytes(Path::new("vN/index"), bytes::Bytes::from(unknown)).unwrap_err();
    assert!(err.contains(&format!("unknown index version {}", index::VERSION + 1)), "{err}");
}

/// The version-2 example of `docs/format/block.md` as it was: such indexes still open and read.
#[test]
fn version_2_indexes_are_still_read() {
    let hex = "53 54 49 58 02 00 00 00 00 00 00 05 02 01 61 01 62 f8 2a 91 84 00 00 00 \
               0c 01 00 01 01 00 e8 07 88 80 80 80 10 c6 40 1a 6a 00 00 00 03 01 03 00 f1 c2 99 9d \
               00 00 00 03 01 03 00 f1 c2 99 9d 00 00 00 04 01 00 01 34 71 f9 a7 a6 \
               00 00 00 00 00 00 00 08 00 00 00 00 00 00 00 18 00 00 00 00 00 00 00 29 \
               00 00 00 00 00 00 00 3f 00 00 00 00 00 00 03 e8 d4 47 d9 f2";
    let bytes: Vec<u8> = hex.split_whitespace().map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    let ix = index::IndexFile::from_bytes(Path::new("v2/index"), bytes::Bytes::from(bytes)).unwrap();
    let mut all = ix.all_postings().unwrap();
    let id = crate::index::postings::Postings::next(&mut all).unwrap();
    assert_eq!(id.0, 3);
    let mut chunks = Vec::new();
    let labels = ix.series(id, &mut chunks, &mut index::ReadCache::default()).unwrap();
    assert_eq!(labels, Labels::from_pairs([("a", "b")]));
    assert_eq!(chunks, [ChunkMetaRef { mint: 1000, maxt: 2000, chunk: ChunkRef::new(1, 8) }]);
    let mut p = ix.postings("a", "b").unwrap().unwrap();
    assert_eq!(crate::index::postings::Postings::next(&mut p), Some(id));
    assert_eq!(ix.label_values("a"), ["b"]);
}

/// The version-3 example of `docs/format/block.md` as it was: such indexes still open and read.
#[test]
fn version_3_indexes_are_still_read() {
    let hex = "53 54 49 58 03 00 00 00 00 00 00 0f 05 01 61 01 01 62 01 01 63 00 01 78 00 01 79 d4 e9 ff 01 09 \
               02 00 01 03 04 01 00 00 00 09 02 00 02 03 04 01 00 00 02 00 00 00 0d 02 14 80 82 80 80 10 d0 0f \
               98 bf 52 c5 b4 3b 84 11 00 00 00 03 02 00 00 2f 0b f1 77 00 00 00 0b 03 00 01 01 00 00 05 03 04 \
               90 01 b9 68 07 61 00 00 00 00 00 00 00 08 00 00 00 00 00 00 00 1f 00 00 00 00 00 00 00 33 00 00 \
               00 00 00 00 00 53 00 00 00 00 00 00 03 e8 e4 87 5a d7";
    let bytes: Vec<u8> = hex.split_whitespace().map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    let ix = index::IndexFile::from_bytes(Path::new("v3/index"), bytes::Bytes::from(bytes)).unwrap();
    let mut chunks = Vec::new();
    let mut cache = index::ReadCache::default();
    for (id, value, place) in [(1, "ac", 1), (0, "ab", 0)] {
        let labels = ix.series(SeriesRef(id), &mut chunks, &mut cache).unwrap();
        assert_eq!(labels, Labels::from_pairs([("a", value), ("x", "y")]));
        assert_eq!(chunks, [ChunkMetaRef { mint: 1000, maxt: 2000, chunk: ChunkRef::new(1, 0x100 + place) }]);
    }
    let mut p = ix.postings("a", "ac").unwrap().unwrap();
    assert_eq!(crate::index::postings::Postings::next(&mut p), Some(SeriesRef(1)));
    let p = ix.postings("x", "y").unwrap().unwrap();
    assert_eq!(crate::index::postings::expand(Box::new(p)), [SeriesRef(0), SeriesRef(1)]);
    assert_eq!(ix.label_values("a"), ["ab", "ac"]);
}

/// The version-4 example of `docs/format/block.md` as it was (no time bounds): such indexes
/// still open and read, and every series may overlap any range.
#[test]
fn version_4_indexes_are_still_read() {
    let hex = "53 54 49 58 04 00 00 00 00 00 00 0b 05 01 61 01 62 11 63 21 78 11 79 bb dd 34 dd 09 02 00 01 03 \
               04 01 00 00 00 09 02 00 02 00 00 01 02 02 02 00 00 00 10 02 14 80 82 80 80 10 d0 0f 00 e8 07 24 \
               6c 45 4c 7b 15 55 b7 00 00 00 03 02 00 00 2f 0b f1 77 00 00 00 09 03 01 01 01 00 04 04 8e 01 74 \
               ca 20 e5 00 00 00 00 00 00 00 08 00 00 00 00 00 00 00 1b 00 00 00 00 00 00 00 2f 00 00 00 00 00 \
               00 00 52 00 00 00 00 00 00 03 e8 ca fb c2 b9";
    let bytes: Vec<u8> = hex.split_whitespace().map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    let ix = index::IndexFile::from_bytes(Path::new("v4/index"), bytes::Bytes::from(bytes)).unwrap();
    assert!(ix.time_filter(0, 1).is_none(), "version 4 has no time bounds");
    let mut chunks = Vec::new();
    let mut cache = index::ReadCache::default();
    for (id, value, place, mint, maxt) in [(1, "ac", 1, 3000, 5000), (0, "ab", 0, 1000, 2000)] {
        let labels = ix.series(SeriesRef(id), &mut chunks, &mut cache).unwrap();
        assert_eq!(labels, Labels::from_pairs([("a", value), ("x", "y")]));
        assert_eq!(chunks, [ChunkMetaRef { mint, maxt, chunk: ChunkRef::new(1, 0x100 + place) }]);
    }
    let p = ix.postings("x", "y").unwrap().unwrap();
    assert_eq!(crate::index::postings::expand(Box::new(p)), [SeriesRef(0), SeriesRef(1)]);
}

/// Version 5 (time bounds always written) is still read: the worked example as version 5 wrote
/// it, its bounds kept.
#[test]
fn versions_5_and_6_indexes_are_still_read() {
    for version in ["05", "06"] {
        version_5_or_6_index_is_read(version);
    }
}

fn version_5_or_6_index_is_read(version: &str) {
    let hex = "53 54 49 58 VV 00 00 00 00 00 00 0b 05 01 61 01 62 11 63 21 78 11 79 bb dd 34 dd 09 02 00 01 03 \
               04 01 00 00 00 09 02 00 02 00 00 01 02 02 02 00 00 00 1a 02 14 80 82 80 80 10 d0 0f 00 e8 07 24 \
               6c 45 4c 00 01 00 00 03 e8 07 d0 0f a0 19 17 37 99 00 00 00 03 02 00 00 2f 0b f1 77 00 00 00 09 \
               03 01 01 01 00 04 04 a2 01 d8 df 61 83 00 00 00 00 00 00 00 08 00 00 00 00 00 00 00 1b 00 00 00 \
               00 00 00 00 2f 00 00 00 00 00 00 00 5c 00 00 00 00 00 00 03 e8 41 d6 28 7c";
    let hex = hex.replace("VV", version);
    let bytes: Vec<u8> = hex.split_whitespace().map(|h| u8::from_str_radix(h, 16).unwrap()).collect();
    let ix = index::IndexFile::from_bytes(Path::new("v5/index"), bytes::Bytes::from(bytes)).unwrap();
    let filter = ix.time_filter(2500, 2600).expect("version 5 has time bounds");
    assert!(!filter.may_overlap(SeriesRef(0)) && !filter.may_overlap(SeriesRef(1)));
    let filter = ix.time_filter(1500, 3000).expect("version 5 has time bounds");
    assert!(filter.may_overlap(SeriesRef(0)) && filter.may_overlap(SeriesRef(1)));
    let mut chunks = Vec::new();
    let labels = ix.series(SeriesRef(1), &mut chunks, &mut index::ReadCache::default()).unwrap();
    assert_eq!(labels, Labels::from_pairs([("a", "ac"), ("x", "y")]));
    assert_eq!(chunks, [ChunkMetaRef { mint: 3000, maxt: 5000, chunk: ChunkRef::new(1, 0x101) }]);
}

/// Time bounds are left out of a block whose series all span most of it (they would pass over
/// nothing), and kept once one series in `BOUNDS_PARTIAL_SHARE_MIN` spans less than half of it;
/// either way every series and chunk reads back.
#[test]
fn time_bounds_are_left_out_where_they_would_pass_over_nothing() {
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let n = 64usize;
    let write = |partial: usize, name: &str| {
        let path = tmp.path().join(name);
        let values: Vec<String> = (0..n).map(|i| format!("{i:03}")).collect();
        let mut symbols: Vec<Arc<str>> = values.iter().map(|v| Arc::from(v.as_str())).collect();
        symbols.push(Arc::from("s"));
        symbols.sort();
        let mut w = index::IndexWriter::create(&crate::vfs::OsFs, &path, &symbols).unwrap();
        let mut written = Vec::new();
        for (i, v) in values.iter().enumerate() {
            // Whole-block series start within a second of the block's start and end within a
            // second of its end (jittered scrapes); partial ones stop a third of the way in.
            let mint = 1_000_000 + (i as i64 % 3) * 300;
            let maxt = if i < partial { 1_000_000 + 200_000 } else { 1_600_000 - (i as i64 % 5) * 200 };
            let meta = ChunkMetaRef { mint, maxt, chunk: ChunkRef::new(1, 0x100 + i as u32) };
            let labels = Labels::from_pairs([("s", v.as_str())]);
            w.add_series(&labels, &[meta]).unwrap();
            written.push((labels, meta));
        }
        w.finish().unwrap();
        let ix = IndexFile::open(&crate::vfs::OsFs, &path).unwrap();
        let mut chunks = Vec::new();
        for (id, (labels, meta)) in written.iter().enumerate() {
            assert_eq!(
                &ix.series(SeriesRef(id as u64), &mut chunks, &mut index::ReadCache::default()).unwrap(),
                labels
            );
            assert_eq!(chunks, [*meta]);
        }
        (
            ix.time_filter(1_500_000, 1_600_000)
                .map(|f| (0..n as u64).filter(|&i| f.may_overlap(SeriesRef(i))).count()),
            std::fs::metadata(&path).unwrap().len(),
        )
    };
    let (none, bytes_without) = write(0, "steady");
    assert_eq!(none, None, "every series spans the block: no bounds");
    let few = n / index::BOUNDS_PARTIAL_SHARE_MIN;
    let (under, _) = write(few - 1, "few");
    assert_eq!(under, None, "fewer than one in 16 partial: no bounds");
    let (kept, bytes_with) = write(few, "churned");
    assert_eq!(kept, Some(n - few), "the partial series are passed over at the block's end");
    assert!(bytes_with >= bytes_without + 4 * n as u64 - 8, "{bytes_with} vs {bytes_without}");
}

/// The bounds as a postings cursor pass over at most `OVERLAP_SCAN_MAX` dead series in a row
/// before yielding one (so a selective matcher's intersection stops soon after its postings
/// end), and still lead to every series that may overlap.
#[test]
fn overlap_scans_stop_after_a_run_of_dead_series() {
    use crate::index::postings::Postings;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("index");
    let values: Vec<String> = (0..700).map(|i| format!("{i:03}")).collect();
    let mut symbols: Vec<Arc<str>> = values.iter().map(|v| Arc::from(v.as_str())).collect();
    symbols.push(Arc::from("s"));
    symbols.sort();
    let mut w = index::IndexWriter::create(&crate::vfs::OsFs, &path, &symbols).unwrap();
    for (i, v) in values.iter().enumerate() {
        // The first 600 stop a tenth of the way in; the last 100 span the block.
        let maxt = if i < 600 { 1_100_000 } else { 2_000_000 };
        let meta = ChunkMetaRef { mint: 1_000_000, maxt, chunk: ChunkRef::new(1, 0x100 + i as u32) };
        w.add_series(&Labels::from_pairs([("s", v.as_str())]), &[meta]).unwrap();
    }
    w.finish().unwrap();
    let ix = IndexFile::open(&crate::vfs::OsFs, &path).unwrap();
    let mut p = ix.overlap_postings(1_900_000, 2_000_000).expect("bounds kept: 600 of 700 partial");
    let scan = index::OVERLAP_SCAN_MAX;
    assert_eq!(p.seek(SeriesRef(0)), Some(SeriesRef(scan - 1)), "yields the last of a run of passed-over series");
    let filter = ix.time_filter(1_900_000, 2_000_000).unwrap();
    let walked: Vec<SeriesRef> = std::iter::from_fn(|| p.next()).take_while(|id| id.0 < 700).collect();
    let overlapping: Vec<SeriesRef> = walked.into_iter().filter(|&id| filter.may_overlap(id)).collect();
    assert_eq!(overlapping, (600..700).map(SeriesRef).collect::<Vec<_>>());
}

mod packed_postings {
    use super::*;
    use crate::index::postings::Postings;
    use proptest::prelude::*;

    fn list(ids: &[u32]) -> index::MmapPostings {
        // A postings section as the index holds it: `len | body | crc`, read back through a file.
        let mut body = Vec::new();
        index::encode_postings(ids, &mut body);
        let mut file = Vec::new();
        file.extend_from_slice(&(body.len() as u32).to_be_bytes());
        file.extend_from_slice(&body);
        file.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        index::MmapPostings::packed_for_tests(bytes::Bytes::from(file))
    }

    fn ids() -> impl Strategy<Value = Vec<u32>> {
        prop::collection::btree_set(prop_oneof![0u32..300, 0u32..100_000, any::<u32>()], 0..700)
            .prop_map(|s| s.into_iter().collect())
    }

    proptest! {
        #[test]
        fn next_returns_every_id(ids in ids()) {
            let mut p = list(&ids);
            prop_assert_eq!(p.len(), ids.len());
            let mut got = Vec::new();
            while let Some(id) = p.next() {
                got.push(id.0 as u32);
            }
            prop_assert_eq!(got, ids);
            prop_assert_eq!(p.at(), None);
            prop_assert_eq!(p.next(), None);
        }

        #[test]
        fn seeks_match_a_model(ids in ids(), targets in prop::collection::vec(any::<u32>(), 1..40), steps in prop::collection::vec(0usize..3, 40)) {
            let mut targets = targets;
            targets.sort_unstable();
            let mut p = list(&ids);
            let mut cur: Option<u32> = None;
            for (t, step) in targets.iter().zip(steps) {
                // Interleave next() with seeks, as intersections do.
                for _ in 0..step {
                    let want = match cur {
                        None => ids.first().copied(),
                        Some(c) => ids.iter().copied().find(|&x| x > c),
                    };
                    if cur.is_some() || want.is_some() {
                        let got = p.next().map(|s| s.0 as u32);
                        prop_assert_eq!(got, want);
                        cur = got;
                        if got.is_none() { return Ok(()); }
                    }
                }
                let floor = cur.map_or(*t, |c| c.max(*t));
                let want = ids.iter().copied().find(|&x| x >= floor);
                let got = p.seek(strata_model::SeriesRef(*t as u64)).map(|s| s.0 as u32);
                prop_assert_eq!(got, want, "seek {} from {:?}", t, cur);
                prop_assert_eq!(p.at().map(|s| s.0 as u32), want);
                cur = got;
                if got.is_none() { return Ok(()); }
            }
        }
    }

    #[test]
    fn dense_runs_take_a_bit_or_less_per_id() {
        let ids: Vec<u32> = (1000..11_000).collect();
        let mut body = Vec::new();
        index::encode_postings(&ids, &mut body);
        assert!(body.len() < 300, "{} bytes for 10,000 consecutive ids", body.len());
        let spread: Vec<u32> = (0..10_000).map(|i| i * 3000 + i % 7).collect();
        body.clear();
        index::encode_postings(&spread, &mut body);
        assert!(body.len() < 10_000 * 2, "{} bytes for ids 3000 apart", body.len());
    }
}
