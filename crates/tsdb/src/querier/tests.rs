use super::*;
use crate::head::HeadOptions;
use strata_model::MatchOp;

fn head_with(samples: &[(i64, f64)]) -> Head {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    for &(t, v) in samples {
        app.append(&Labels::from_pairs([("__name__", "s")]), t, v).unwrap();
    }
    app.commit().unwrap();
    head
}

fn sel(head: &Head, mint: i64, maxt: i64) -> Vec<Series> {
    Querier::new(head, mint, maxt).select(&[Matcher::new(MatchOp::Equal, "__name__", "s").unwrap()]).unwrap()
}

#[test]
fn iterator_spans_chunks_and_clips_to_range() {
    let samples: Vec<(i64, f64)> = (0..1000).map(|i| (i * 10, i as f64)).collect();
    let head = head_with(&samples);
    let s = &sel(&head, 1995, 7005)[0];
    assert!(s.chunks.len() >= 2, "range spans several chunks");
    let got: Vec<i64> = s.samples().iter().map(|s| s.t).collect();
    let want: Vec<i64> = (200..=700).map(|i| i * 10).collect();
    assert_eq!(got, want);
}

#[test]
fn seek_moves_forward_only_and_across_chunks() {
    let samples: Vec<(i64, f64)> = (0..1000).map(|i| (i * 10, i as f64)).collect();
    let head = head_with(&samples);
    let s = &sel(&head, i64::MIN, i64::MAX)[0];
    let mut it = s.iter();
    assert_eq!(it.seek(5005).map(|s| s.t), Some(5010));
    assert_eq!(it.seek(100).map(|s| s.t), Some(5010), "seek never moves back");
    assert_eq!(it.next().map(|s| s.t), Some(5020));
    assert_eq!(it.seek(9990).map(|s| s.t), Some(9990));
    assert_eq!(it.next(), None);
    assert_eq!(it.seek(0), None);
    assert!(it.err().is_none());
}

#[test]
fn series_without_samples_in_range_are_not_selected() {
    let head = head_with(&[(100, 1.0)]);
    assert!(sel(&head, 200, 300).is_empty());
    assert_eq!(sel(&head, 100, 100).len(), 1);
}

/// A series that ended is passed over from the second after its newest sample by the bound it
/// keeps outside its lock (and before that by the check under it); once it takes a sample
/// again it is selected again.
#[test]
fn an_ended_series_is_passed_over_until_it_takes_a_sample_again() {
    let head = head_with(&[(100_000, 1.0), (100_500, 2.0)]);
    assert_eq!(sel(&head, 100_500, 100_500).len(), 1);
    assert!(sel(&head, 100_501, 300_000).is_empty(), "under the lock");
    assert!(sel(&head, 101_001, 300_000).is_empty(), "by the bound");
    let mut app = head.appender();
    app.append(&Labels::from_pairs([("__name__", "s")]), 250_000, 3.0).unwrap();
    app.commit().unwrap();
    let got = sel(&head, 101_001, 300_000);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].samples().iter().map(|s| (s.t, s.v)).collect::<Vec<_>>(), vec![(250_000, 3.0)]);
}

#[test]
fn select_stops_at_the_series_limit() {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    for i in 0..10 {
        app.append(&Labels::from_pairs([("__name__", "s"), ("i", &i.to_string())]), 100, 1.0).unwrap();
    }
    app.commit().unwrap();
    let all = [Matcher::new(MatchOp::Equal, "__name__", "s").unwrap()];
    assert_eq!(Querier::new(&head, 0, 200).limit_series(10).select(&all).unwrap().len(), 10);
    let err = Querier::new(&head, 0, 200).limit_series(9).select(&all).unwrap_err();
    assert!(matches!(err, crate::Error::TooManySeries { limit: 9 }), "{err}");
    assert_eq!(err.to_string(), "the query selects more than 9 series");
    // Series without samples in range do not count.
    assert_eq!(Querier::new(&head, 200, 300).limit_series(1).select(&all).unwrap().len(), 0);
}

proptest::proptest! {
    /// Merging sources (each a sorted subset of the same series) gives every series once, in
    /// label order, with the every copy's deleted ranges and every copy's chunks in
    /// start order.
    #[test]
    fn merging_sources_keeps_label_order_and_joins_copies(
        membership in proptest::collection::vec(proptest::collection::vec(proptest::bool::ANY, 5), 0..30),
    ) {
        // Series k is `s{k="…"}` (zero-padded, so string order is numeric order); source j
        // holds it when membership[k][j], with one chunk starting at 10 * (5 - j): later
        // sources hold older chunks, as blocks after the head do.
        let series_labels = |k: usize| Labels::from_pairs([("__name__", "s"), ("k", &format!("{k:03}"))]);
        let chunk = |j: usize| QueryChunk { mint: 10 * (5 - j as i64), maxt: 10 * (5 - j as i64) + 5, data: ChunkData::Mem(vec![j as u8].into()), rank: 0 };
        let sources: Vec<Vec<Series>> = (0..5)
            .map(|j| {
                membership
                    .iter()
                    .enumerate()
                    .filter(|(_, m)| m[j])
                    .map(|(k, _)| Series { labels: series_labels(k), chunks: vec![chunk(j)], deleted: vec![(j as i64, j as i64)], mint: 0, maxt: 100 })
                    .collect()
            })
            .collect();
        let merged = merge_sorted(sources);
        let want: Vec<(Labels, Vec<u8>)> = membership
            .iter()
            .enumerate()
            .filter(|(_, m)| m.iter().any(|&x| x))
            .map(|(k, m)| (series_labels(k), (0..5).rev().filter(|&j| m[j]).map(|j| j as u8).collect()))
            .collect();
        let got: Vec<(Labels, Vec<u8>)> = merged
            .iter()
            .map(|s| {
                assert!(s.chunks.is_sorted_by_key(|c| c.mint));
                let from: Vec<u8> = s.chunks.iter().map(|c| c.data.bytes().unwrap()[0]).collect();
                let mut deleted: Vec<u8> = s.deleted.iter().map(|d| d.0 as u8).collect();
                deleted.sort_unstable_by(|a, b| b.cmp(a));
                assert_eq!(deleted, from, "every copy's deleted ranges are kept");
                (s.labels.clone(), from)
            })
            .collect();
        proptest::prop_assert_eq!(got, want);
    }
}

proptest::proptest! {
    /// Label sets ordered by their symbols' ranks are in `Labels`' order, and resolve to themselves: names and values
    /// drawn from strings that are prefixes of each other (and the empty value), sets of
    /// different lengths, interned in any order.
    #[test]
    fn ranked_labels_order_and_resolve_label_sets(
        sets in proptest::collection::vec(
            proptest::collection::btree_map(
                proptest::sample::select(vec!["__name__", "a", "ab", "b", "instance", "z"]),
                proptest::sample::select(vec!["", "0", "00", "1", "a", "ab", "b", "host-01", "host-1"]),
                0..5,
            ),
            0..40,
        ),
    ) {
        let symbols = crate::head::symbols::Symbols::default();
        let labels: Vec<Labels> = sets.iter().map(|m| Labels::from_pairs(m.iter().map(|(n, v)| (*n, *v)))).collect();
        let packed: Vec<_> = labels.iter().map(|l| symbols.intern_labels(l)).collect();
        let mut ranked = RankedLabels::default();
        for p in &packed {
            ranked.add(p);
        }
        symbols.with(|get| ranked.rank(get));
        let order = ranked.order();
        let got: Vec<&Labels> = order.iter().map(|&i| &labels[i as usize]).collect();
        let mut want: Vec<&Labels> = labels.iter().collect();
        want.sort();
        proptest::prop_assert_eq!(got, want);
        // Each set resolves to its labels.
        for (i, l) in labels.iter().enumerate() {
            proptest::prop_assert_eq!(&ranked.labels(i as u32), l);
        }
    }
}

proptest::proptest! {
    /// Many symbols (so few ranks fit in a packed word) and long sets (so runs outlast it and
    /// are compared past it): the order is still `Labels`' order.
    #[test]
    fn ranked_labels_order_long_sets_of_many_symbols(
        sets in proptest::collection::vec(
            (0usize..10, proptest::collection::btree_map(0u32..16, 0u32..700, 0..10)),
            0..60,
        ),
    ) {
        let symbols = crate::head::symbols::Symbols::default();
        // Up to nine labels every set of that length shares, then its own: long runs agree on
        // all their packed ranks and differ past them.
        let labels: Vec<Labels> = sets
            .iter()
            .map(|(shared, own)| {
                let shared = (0..*shared as u32).map(|n| (n, n));
                Labels::from_pairs(
                    shared.chain(own.iter().map(|(n, v)| (n + 10, *v))).map(|(n, v)| (format!("l{n:02}"), format!("v{v}"))),
                )
            })
            .collect();
        let packed: Vec<_> = labels.iter().map(|l| symbols.intern_labels(l)).collect();
        let mut ranked = RankedLabels::default();
        for p in &packed {
            ranked.add(p);
        }
        symbols.with(|get| ranked.rank(get));
        let got: Vec<&Labels> = ranked.order().iter().map(|&i| &labels[i as usize]).collect();
        let mut want: Vec<&Labels> = labels.iter().collect();
        want.sort();
        proptest::prop_assert_eq!(got, want);
    }
}

/// A selection large enough to be split over threads finds what one thread finds: the same
/// series in the same order with the same samples, open chunks (copied into the shared
/// buffer), closed chunks and late samples alike.
#[test]
fn head_selection_on_threads_equals_one_thread() {
    let late = crate::head::OutOfOrder { window_ms: 1_000_000, replace: false };
    let head = Head::in_memory(HeadOptions { out_of_order: late, ..HeadOptions::default() });
    let n = 3 * HEAD_PARALLEL_SERIES_MIN + 17;
    // Labels whose order differs from creation order, so the parts' merge matters.
    let labels = |i: usize| Labels::from_pairs([("__name__", "s"), ("k", &format!("{:06}", (i * 7919) % n))]);
    for round in 0..300i64 {
        let mut app = head.appender();
        for i in 0..n {
            // Every tenth series stops early (no open chunk in range at the end); every
            // thirteenth gets a late sample.
            if i % 10 == 0 && round > 100 {
                continue;
            }
            app.append(&labels(i), round * 1000 + (i % 7) as i64, (round * i as i64) as f64).unwrap();
        }
        app.commit().unwrap();
    }
    let mut app = head.appender();
    for i in (0..n).step_by(13) {
        app.append(&labels(i), 150_500, -1.0).unwrap();
    }
    app.commit().unwrap();
    let all = [Matcher::new(MatchOp::Equal, "__name__", "s").unwrap()];
    for (mint, maxt) in [(0, 400_000), (150_000, 151_000), (250_000, 299_999)] {
        let one = Querier::new(&head, mint, maxt).select(&all).unwrap();
        let three = Querier::new(&head, mint, maxt).parallelism(3).select(&all).unwrap();
        assert_eq!(one.len(), three.len(), "[{mint}, {maxt}]");
        assert!(!one.is_empty());
        for (a, b) in one.iter().zip(&three) {
            assert_eq!(a.labels, b.labels);
            assert_eq!(a.samples(), b.samples(), "{}", a.labels);
        }
    }
}

/// Open chunks are copied into buffers of `ARENA_BLOCK` bytes: a selection whose open chunks
/// fill several of them reads back every sample written, on one thread and on several.
#[test]
fn open_chunks_spanning_several_copy_buffers_read_back_whole() {
    let head = Head::in_memory(HeadOptions::default());
    let n = 1500;
    let labels = |i: usize| Labels::from_pairs([("__name__", "s"), ("k", &format!("{i:05}"))]);
    // Values whose XOR leaves most mantissa bits: about ten bytes a sample.
    let value = |i: usize, k: i64| ((i as f64) + 1.0).sqrt() * (k as f64 + 0.1).ln();
    for k in 0..100i64 {
        let mut app = head.appender();
        for i in 0..n {
            app.append(&labels(i), k * 10_000 + (i % 3) as i64, value(i, k)).unwrap();
        }
        app.commit().unwrap();
    }
    let all = [Matcher::new(MatchOp::Equal, "__name__", "s").unwrap()];
    for threads in [1, 2] {
        let got = Querier::new(&head, 0, 1_000_000).parallelism(threads).select(&all).unwrap();
        assert_eq!(got.len(), n);
        let mut copied = std::collections::HashSet::new();
        for (i, s) in got.iter().enumerate() {
            assert_eq!(s.labels, labels(i));
            let want: Vec<Sample> =
                (0..100).map(|k| Sample { t: k * 10_000 + (i % 3) as i64, v: value(i, k) }).collect();
            assert_eq!(s.samples(), want, "{}", s.labels);
            for c in &s.chunks {
                if let ChunkData::Mem(HeadChunkBytes::Mapped { file, .. }) = &c.data {
                    copied.insert(Arc::as_ptr(file));
                }
            }
        }
        assert!(copied.len() > 3, "the open chunks filled {} buffers", copied.len());
    }
}

#[test]
fn a_labels_only_selection_lists_the_series_without_their_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = crate::DbOptions { compact_interval: None, retention_ms: 0, ..crate::DbOptions::default() };
    let db = crate::Db::open(tmp.path(), opts).unwrap();
    // Series 0-4 in a block (imported), 3-7 in the head; 8 only before the range.
    let imported = Head::in_memory(HeadOptions { backfill: true, ..HeadOptions::default() });
    let labels = |i: usize| Labels::from_pairs([("__name__", "s"), ("i", &i.to_string())]);
    let mut app = imported.appender();
    for i in 0..5 {
        for t in 0..100 {
            app.append(&labels(i), 1_000 + t * 1000, t as f64).unwrap();
        }
    }
    app.append(&labels(8), 10, 1.0).unwrap();
    app.commit().unwrap();
    db.import_head(&imported).unwrap();
    let mut app = db.head().appender();
    for i in 3..8 {
        app.append(&labels(i), 200_000, 1.0).unwrap();
    }
    app.commit().unwrap();
    let all = [Matcher::new(MatchOp::Equal, "__name__", "s").unwrap()];
    let full = db.querier(500, 300_000).select(&all).unwrap();
    let listed = db.querier(500, 300_000).labels_only().limit_chunks(0).select(&all).unwrap();
    let names = |v: &[Series]| v.iter().map(|s| s.labels.clone()).collect::<Vec<_>>();
    assert_eq!(names(&listed), names(&full));
    assert_eq!(listed.len(), 8);
    assert!(listed.iter().all(|s| s.chunks.is_empty()));
    // The same selection with chunks is over the limit.
    let err = db.querier(500, 300_000).limit_chunks(0).select(&all).unwrap_err();
    assert!(matches!(err, crate::Error::TooManyChunks { .. }), "{err}");
}

proptest::proptest! {
    /// Reading a series of dense and XOR chunks chunk by chunk gives exactly what `visit`
    /// hands over, for ranges that clip the first and last chunk or miss chunks; and with a
    /// histogram chunk in the range, overlapping chunks or deletions it declines and appends
    /// nothing.
    #[test]
    fn plain_floats_are_what_visit_reads(
        gaps in proptest::collection::vec(1i64..5_000, 1..400),
        per_chunk in 1usize..130,
        mint in -1_000i64..400_000,
        span in 0i64..2_000_000,
        other_chunk in proptest::option::of((0usize..4, proptest::bool::ANY)),
        overlap in proptest::bool::ANY,
        deleted in proptest::bool::ANY,
    ) {
        use crate::chunkenc::{dense, xor::XorAppender};
        let mut t = 0;
        let samples: Vec<Sample> = gaps.iter().enumerate().map(|(i, g)| { t += g; Sample { t, v: (i % 7) as f64 * 0.1 } }).collect();
        let mut chunks: Vec<QueryChunk> = samples
            .chunks(per_chunk)
            .enumerate()
            .map(|(k, part)| {
                let bytes = match other_chunk {
                    // The head's XOR chunks, read as well; a histogram's header byte, not.
                    Some((at, xor)) if at == k => {
                        let mut c = XorAppender::new();
                        part.iter().for_each(|s| c.append(s.t, s.v));
                        let mut b = c.bytes().to_vec();
                        if !xor {
                            b[0] = Encoding::Histogram as u8;
                        }
                        b
                    }
                    _ => dense::encode(part),
                };
                QueryChunk {
                    mint: part[0].t,
                    maxt: part[part.len() - 1].t,
                    data: ChunkData::Mem(HeadChunkBytes::from(&bytes[..])),
                    rank: 0,
                }
            })
            .collect();
        if overlap && chunks.len() > 1 {
            chunks[1].mint = chunks[0].maxt;
        }
        let series = Series {
            labels: Labels::from_pairs([("a", "b")]),
            chunks,
            deleted: if deleted { vec![(mint, mint + 10)] } else { Vec::new() },
            mint,
            maxt: mint + span,
        };
        let mut got = vec![Sample { t: -1, v: 0.0 }];
        let fast = series.read_floats(&mut got).unwrap();
        let declines = deleted || (overlap && series.chunks.len() > 1)
            || other_chunk.is_some_and(|(k, xor)| {
                !xor && series.chunks.get(k).is_some_and(|c| c.maxt >= mint && c.mint <= mint + span)
            });
        proptest::prop_assert_eq!(fast, !declines);
        if fast {
            let mut want = vec![Sample { t: -1, v: 0.0 }];
            series
                .visit(|s| match s.value {
                    crate::chunkenc::TypedValue::Float(v) => want.push(Sample { t: s.t, v }),
                    crate::chunkenc::TypedValue::Histogram(_) => panic!("only floats were written"),
                })
                .unwrap();
            proptest::prop_assert_eq!(got, want);
        } else {
            proptest::prop_assert_eq!(got.len(), 1);
        }
    }
}

#[test]
fn block_selections_through_the_series_cache_are_reads_from_the_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let db = crate::Db::open(dir.path(), crate::DbOptions::default()).unwrap();
    // 300 series over three hours (two blocks, several chunks of each series in each), a fifth
    // of them ending after the first hour.
    let source = Head::in_memory(HeadOptions::default());
    let mut app = source.appender();
    for s in 0..300i64 {
        let job = if s % 3 == 0 { "a" } else { "b" };
        let labels = Labels::from_pairs([("__name__", "m"), ("i", format!("{s:03}").as_str()), ("job", job)]);
        let end = if s % 5 == 0 { 3_600_000 } else { 3 * 3_600_000 };
        for t in (0..end).step_by(10_000) {
            app.append(&labels, t + s, (t / 1000 + s) as f64).unwrap();
        }
    }
    app.commit().unwrap();
    db.import_head(&source).unwrap();
    assert!(db.blocks().len() >= 2, "the data spans blocks");
    let m = |op, name: &str, value: &str| Matcher::new(op, name, value).unwrap();
    // Tombstones are read per query, past the cache.
    db.delete(&[m(MatchOp::RegexMatch, "i", "01.")], 1_000_000, 2_000_000).unwrap();
    let selections = [
        vec![m(MatchOp::Equal, "__name__", "m")],
        vec![m(MatchOp::Equal, "job", "a")],
        vec![m(MatchOp::RegexMatch, "i", "0[0-4].")],
    ];
    let ranges =
        [(i64::MIN, i64::MAX), (0, 100), (3_000_000, 4_000_000), (7_300_000, 7_400_000), (9_000_000, 9_900_000)];
    let hits_before = SeriesCache::global().stats().2;
    let fingerprint = |series: Vec<Series>| -> Vec<(Labels, Vec<Sample>, usize)> {
        series.into_iter().map(|s| (s.labels.clone(), s.samples(), s.chunks.len())).collect()
    };
    for matchers in &selections {
        for &(mint, maxt) in &ranges {
            for threads in [1, 2] {
                for labels_only in [false, true] {
                    let querier = |cached: bool| {
                        let q = db.querier(mint, maxt).parallelism(threads);
                        let q = if labels_only { q.labels_only() } else { q };
                        if cached {
                            q
                        } else {
                            q.without_series_cache()
                        }
                    };
                    let direct = fingerprint(querier(false).select(matchers).unwrap());
                    // The first read keeps the entries, the second finds them.
                    for round in 0..2 {
                        let cached = fingerprint(querier(true).select(matchers).unwrap());
                        assert_eq!(
                            cached, direct,
                            "{matchers:?} in [{mint}, {maxt}], {threads} threads, round {round}"
                        );
                    }
                }
            }
        }
    }
    assert!(SeriesCache::global().stats().2 > hits_before, "the second reads were served by the cache");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 64, ..Default::default() })]

    /// A `newest_only` selection finds, of every series, the same newest sample in range as a
    /// whole selection read through (deletions applied): over series of one to a few chunks,
    /// with stale markers, late samples (some rewriting the newest timestamp, as carbon's
    /// last write wins does), deletions, and ranges before, inside and after the samples.
    #[test]
    fn a_newest_only_selection_finds_the_newest_sample_a_whole_one_does(
        series in proptest::collection::vec(
            (
                proptest::collection::vec((1i64..20_000, proptest::bool::weighted(0.05)), 0..300),
                proptest::option::weighted(0.3, (0i64..3_000_000, proptest::bool::ANY)),
                proptest::option::weighted(0.3, (0i64..100_000, 0i64..100_000)),
            ),
            1..8,
        ),
        mint in -10_000i64..3_000_000,
        span in 0i64..1_000_000,
    ) {
        let head = Head::in_memory(HeadOptions::default());
        let labels = |i: usize| Labels::from_pairs([("__name__", "s"), ("i", &i.to_string())]);
        let late_rules = crate::head::OutOfOrder { window_ms: i64::MAX / 4, replace: true };
        let mut newest_t = vec![0; series.len()];
        for (i, (gaps, late, _)) in series.iter().enumerate() {
            let mut app = head.appender_with(late_rules);
            let mut t = 0;
            for (k, &(gap, stale)) in gaps.iter().enumerate() {
                t += gap;
                let v = if stale { f64::from_bits(strata_model::STALE_NAN_BITS) } else { (k % 11) as f64 * 0.5 };
                app.append(&labels(i), t, v).unwrap();
            }
            app.commit().unwrap();
            if let Some((at, rewrite_newest)) = *late {
                // A late sample, or a new value at the newest timestamp.
                let at = if rewrite_newest && t > 0 { t } else { at.min(t.max(1)) };
                let mut app = head.appender_with(late_rules);
                app.append(&labels(i), at, -1.0).unwrap();
                app.commit().unwrap();
            }
            newest_t[i] = t;
        }
        // Deletions reaching back from around the newest sample: a deleted newest sample
        // leaves an older one the newest.
        for (i, (_, _, deleted)) in series.iter().enumerate() {
            if let Some((back, len)) = *deleted {
                let m = [Matcher::new(MatchOp::Equal, "i", i.to_string()).unwrap()];
                head.delete(&m, newest_t[i] - back, newest_t[i] - back + len).unwrap();
            }
        }
        let all = [Matcher::new(MatchOp::Equal, "__name__", "s").unwrap()];
        let maxt = mint + span;
        // Each series' newest sample in range, as (labels, time, value bits).
        let newest = |selected: Vec<Series>| -> Vec<(Labels, i64, u64)> {
            selected
                .into_iter()
                .filter_map(|s| {
                    let mut last = None;
                    s.visit(|x| {
                        if let crate::chunkenc::TypedValue::Float(v) = x.value {
                            last = Some((x.t, v.to_bits()));
                        }
                    })
                    .unwrap();
                    last.map(|(t, v)| (s.labels.clone(), t, v))
                })
                .collect()
        };
        let whole = newest(Querier::new(&head, mint, maxt).select(&all).unwrap());
        let only = newest(Querier::new(&head, mint, maxt).newest_only().select(&all).unwrap());
        proptest::prop_assert_eq!(only, whole);
    }
}
