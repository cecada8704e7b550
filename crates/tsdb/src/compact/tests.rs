//! Compaction, deletion and retention checked against a naive model: every sample ever
//! acknowledged, minus what was deleted, minus whole blocks retention dropped.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use strata_model::{Labels, MatchOp, Matcher};

use super::*;
use crate::db::{Db, DbOptions};
use crate::head::HeadOptions;

const RANGE: i64 = 1000;

fn opts(retention_ms: i64) -> DbOptions {
    DbOptions {
        head: HeadOptions { chunk_range_ms: RANGE, ..Default::default() },
        retention_ms,
        retention_bytes: 0,
        compact_interval: None,
        rollups: Vec::new(),
        rollup_filter: None,
        late_window_ms: 0,
    }
}

/// Samples by series label string, then timestamp (value bits).
type Model = BTreeMap<String, BTreeMap<i64, u64>>;

fn all() -> Vec<Matcher> {
    vec![Matcher::new(MatchOp::RegexMatch, "__name__", ".+").unwrap()]
}

/// What the database returns over `[mint, maxt]`, as a model; the same whether blocks are read
/// on one thread or several.
fn read(db: &Db, mint: i64, maxt: i64) -> Model {
    let serial = read_on(db, mint, maxt, 1);
    assert_eq!(read_on(db, mint, maxt, 3), serial, "blocks read on 3 threads, range [{mint}, {maxt}]");
    serial
}

fn read_on(db: &Db, mint: i64, maxt: i64, threads: usize) -> Model {
    let mut out = Model::new();
    let selected = db.querier(mint, maxt).parallelism(threads).select(&all()).unwrap();
    assert!(selected.windows(2).all(|w| w[0].labels < w[1].labels), "series come in label order, each once");
    for s in selected {
        let samples: BTreeMap<i64, u64> = s.samples().iter().map(|x| (x.t, x.v.to_bits())).collect();
        assert_eq!(samples.len(), s.samples().len(), "{}: duplicate timestamps", s.labels);
        // A series is selected when a chunk overlaps the range, though no sample may fall in it.
        if samples.is_empty() {
            continue;
        }
        assert!(out.insert(s.labels.to_string(), samples).is_none(), "{} returned twice", s.labels);
    }
    out
}

fn expect(model: &Model, mint: i64, maxt: i64) -> Model {
    model
        .iter()
        .map(|(k, v)| (k.clone(), v.range(mint..=maxt).map(|(t, b)| (*t, *b)).collect::<BTreeMap<_, _>>()))
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

fn check(db: &Db, model: &Model, rng: &mut impl Rng, hi: i64) {
    assert_eq!(read(db, i64::MIN, i64::MAX), expect(model, i64::MIN, i64::MAX));
    for _ in 0..5 {
        let a = rng.gen_range(-100..hi + 100);
        let b = a + rng.gen_range(0..4 * RANGE);
        let (got, want) = (read(db, a, b), expect(model, a, b));
        for (k, v) in &want {
            assert_eq!(got.get(k), Some(v), "range [{a}, {b}] series {k}");
        }
        assert_eq!(got.len(), want.len(), "range [{a}, {b}]");
    }
}

/// Appends series `x` at `ts`, value = time, one commit per sample (as a scraper would).
fn append_x(db: &Db, ts: impl Iterator<Item = i64>) {
    let l = Labels::from_pairs([("__name__", "x")]);
    for t in ts {
        let mut app = db.appender();
        app.append(&l, t, t as f64).unwrap();
        app.commit().unwrap();
    }
}

fn assert_no_overlap(db: &Db) {
    let blocks = db.blocks();
    for w in blocks.windows(2) {
        assert!(w[0].meta().max_time <= w[1].meta().min_time, "blocks overlap after compaction");
    }
}

#[test]
fn compaction_and_deletion_match_a_model() {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let mut db = Db::open(tmp.path(), opts(0)).unwrap();
    let mut model = Model::new();
    let series: Vec<Labels> =
        (0..30).map(|i| Labels::from_pairs([("__name__", format!("m{}", i % 4)), ("i", i.to_string())])).collect();
    let rounds = 300;
    for round in 0..rounds {
        let mut app = db.appender();
        for l in &series {
            if rng.gen_bool(0.7) {
                let t = round * 100 + rng.gen_range(0..100);
                let v: f64 = rng.gen_range(-1e6..1e6);
                app.append(l, t, v).unwrap();
                model.entry(l.to_string()).or_default().insert(t, v.to_bits());
            }
        }
        app.commit().unwrap();
        if rng.gen_bool(0.03) {
            let victim = &series[rng.gen_range(0..series.len())];
            let a = rng.gen_range(0..(round + 1) * 100);
            // Only the past: a tombstone also hides samples appended later inside its range.
            let b = (a + rng.gen_range(0..3000)).min(round * 100 + 99);
            let ms = [Matcher::new(MatchOp::Equal, "i", victim.get("i").unwrap()).unwrap()];
            db.delete(&ms, a, b).unwrap();
            if let Some(s) = model.get_mut(&victim.to_string()) {
                s.retain(|t, _| *t < a || *t > b);
            }
        }
        if round % 25 == 24 {
            db.compact().unwrap();
            assert_no_overlap(&db);
            check(&db, &model, &mut rng, round * 100);
        }
        if round % 100 == 99 {
            db.close().unwrap();
            db = Db::open(tmp.path(), opts(0)).unwrap();
            check(&db, &model, &mut rng, round * 100);
        }
    }
    model.retain(|_, v| !v.is_empty());
    db.clean_tombstones().unwrap();
    check(&db, &model, &mut rng, rounds * 100);
    let blocks = db.blocks();
    assert!(blocks.iter().all(|b| b.tombstones().is_empty()), "clean_tombstones rewrote every block");
    assert!(blocks.iter().any(|b| b.meta().compaction.level >= 3), "blocks were compacted twice over");
    let ranges = db.options().compaction_ranges();
    for b in blocks.iter() {
        let (lo, hi) = (b.meta().min_time, b.meta().max_time - 1);
        assert!(ranges.iter().any(|r| lo.div_euclid(*r) == hi.div_euclid(*r)), "block {lo}..{hi} fits one window");
    }
    db.close().unwrap();
}

#[test]
fn retention_drops_whole_blocks_only() {
    let tmp = tempfile::tempdir().unwrap();
    let retention = 5 * RANGE + 500;
    let db = Db::open(tmp.path(), opts(retention)).unwrap();
    append_x(&db, (0..20 * RANGE).step_by(50));
    let out = db.compact().unwrap();
    assert!(out.retention_deleted > 0, "{out:?}");
    let newest = 20 * RANGE - 50;
    let cutoff = newest - retention;
    let blocks = db.blocks();
    assert!(blocks.iter().all(|b| b.meta().max_time > cutoff), "every block reaches into the window");
    let oldest = blocks.first().map(|b| b.meta().min_time).unwrap();
    assert!(oldest <= cutoff, "the block straddling the cutoff stays");
    let got: Vec<i64> =
        db.querier(i64::MIN, i64::MAX).select(&all()).unwrap()[0].samples().iter().map(|s| s.t).collect();
    let want: Vec<i64> = (oldest..20 * RANGE).step_by(50).collect();
    assert_eq!(got, want);
    assert_eq!(
        db.stats().blocks_deleted_by_retention.load(std::sync::atomic::Ordering::Relaxed),
        out.retention_deleted as u64
    );
}

#[test]
fn retention_by_size_drops_oldest_blocks_first() {
    let tmp = tempfile::tempdir().unwrap();
    let mut o = opts(0);
    let db = Db::open(tmp.path(), o.clone()).unwrap();
    append_x(&db, (0..20 * RANGE).step_by(10));
    db.compact().unwrap();
    let before = db.blocks();
    assert!(
        before.len() >= 2,
        "{:?}",
        before.iter().map(|b| (b.meta().min_time, b.meta().max_time)).collect::<Vec<_>>()
    );
    let newest_bytes = before.last().unwrap().bytes();
    let wal = db.status(1).unwrap().wal_bytes;
    db.close().unwrap();
    // Slack for the segment the reopened WAL starts (a header of a few bytes).
    o.retention_bytes = newest_bytes + wal + 64;
    let db = Db::open(tmp.path(), o).unwrap();
    db.compact().unwrap();
    let after = db.blocks();
    assert_eq!(after.len(), 1, "only the newest block fits");
    assert_eq!(after[0].ulid(), before.last().unwrap().ulid());
}

#[test]
fn overlapping_blocks_are_merged_and_deduplicated() {
    let tmp = tempfile::tempdir().unwrap();
    let l = Labels::from_pairs([("__name__", "x")]);
    let a = Labels::from_pairs([("__name__", "only_a")]);
    // Two heads with overlapping ranges, as a backfill would produce.
    for (series, ts) in [(&[&l, &a][..], 0..1000), (&[&l][..], 500..1500)] {
        let h = Head::in_memory(HeadOptions { chunk_range_ms: 10 * RANGE, ..Default::default() });
        let mut app = h.appender();
        for t in ts.clone().step_by(10) {
            for s in series {
                app.append(s, t, t as f64).unwrap();
            }
        }
        app.commit().unwrap();
        write_head_block(&crate::vfs::OsFs::shared(), &h, tmp.path(), ts.start, ts.end, crate::compact::HeadCut::ALL)
            .unwrap()
            .unwrap();
    }
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    assert_eq!(db.blocks().len(), 2);
    // Label names and values come from the blocks' indexes (no matcher) or their series.
    let q = db.querier(0, 2000);
    assert_eq!(q.label_values("__name__", &[]).unwrap(), ["only_a", "x"]);
    let only_a = [Matcher::new(MatchOp::RegexMatch, "__name__", "o.*").unwrap()];
    assert_eq!(q.label_values("__name__", &only_a).unwrap(), ["only_a"]);
    assert_eq!(q.label_names(&only_a).unwrap(), ["__name__"]);
    assert!(db.querier(5000, 6000).label_values("__name__", &[]).unwrap().is_empty(), "no block in range");
    let read_x = |db: &Db| -> Vec<i64> {
        let got = db.querier(0, 2000).select(&[Matcher::new(MatchOp::Equal, "__name__", "x").unwrap()]).unwrap();
        got[0].samples().iter().map(|s| s.t).collect()
    };
    let want: Vec<i64> = (0..1500).step_by(10).collect();
    assert_eq!(read_x(&db), want, "the querier merges overlapping blocks");
    let out = db.compact().unwrap();
    assert_eq!(out.compactions, 1);
    let blocks = db.blocks();
    assert_eq!(blocks.len(), 1);
    assert_eq!((blocks[0].meta().min_time, blocks[0].meta().max_time), (0, 1500));
    assert_eq!(blocks[0].meta().stats.num_samples, 150 + 100);
    assert_eq!(blocks[0].meta().compaction.parents.len(), 2);
    assert_eq!(read_x(&db), want);
}

/// Copies block directory `from` to `to`, subdirectories (a block's `chunks/`) too.
fn copy_block_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        match e.file_type().unwrap().is_dir() {
            true => copy_block_dir(&e.path(), &target),
            false => _ = std::fs::copy(e.path(), target).unwrap(),
        }
    }
}

#[test]
fn inputs_a_crash_left_beside_their_compaction_are_removed_on_open_and_deletions_stay() {
    let tmp = tempfile::tempdir().unwrap();
    let aside = tempfile::tempdir().unwrap();
    let l = Labels::from_pairs([("__name__", "x")]);
    // Two overlapping blocks, kept aside too: what a crash between the compaction's rename and
    // its inputs' deletion leaves in place.
    let mut inputs = Vec::new();
    for ts in [0..1000, 500..1500] {
        let h = Head::in_memory(HeadOptions { chunk_range_ms: 10 * RANGE, ..Default::default() });
        let mut app = h.appender();
        for t in ts.clone().step_by(10) {
            app.append(&l, t, t as f64).unwrap();
        }
        app.commit().unwrap();
        let meta = write_head_block(&crate::vfs::OsFs::shared(), &h, tmp.path(), ts.start, ts.end, HeadCut::ALL)
            .unwrap()
            .unwrap();
        copy_block_dir(&tmp.path().join(&meta.ulid), &aside.path().join(&meta.ulid));
        inputs.push(meta.ulid);
    }
    let x = [Matcher::new(MatchOp::Equal, "__name__", "x").unwrap()];
    let read_x =
        |db: &Db| -> Vec<i64> { db.querier(0, 2000).select(&x).unwrap()[0].samples().iter().map(|s| s.t).collect() };
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    assert_eq!(db.compact().unwrap().compactions, 1);
    // Deleted after the compaction: only the output's tombstones know.
    db.delete(&x, 100, 199).unwrap();
    let want: Vec<i64> = (0..1500).step_by(10).filter(|t| !(100..200).contains(t)).collect();
    assert_eq!(read_x(&db), want);
    let output = db.blocks()[0].ulid().to_owned();
    db.close().unwrap();
    for ulid in &inputs {
        copy_block_dir(&aside.path().join(ulid), &tmp.path().join(ulid));
    }

    let db = Db::open(tmp.path(), opts(0)).unwrap();
    let blocks: Vec<String> = db.blocks().iter().map(|b| b.ulid().to_owned()).collect();
    assert_eq!(blocks, [output], "the compaction's inputs are not listed again");
    for ulid in &inputs {
        assert!(!tmp.path().join(ulid).exists(), "input {ulid} is removed on open");
    }
    assert_eq!(read_x(&db), want, "samples deleted after the compaction stay deleted");
}

#[test]
fn a_corrupt_block_is_reported_then_set_aside_and_the_rest_stays_queryable() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    append_x(&db, (0..5 * RANGE).step_by(10));
    db.compact().unwrap();
    let blocks = db.blocks();
    assert!(blocks.len() >= 2, "{} blocks", blocks.len());
    let victim = blocks[0].dir().to_owned();
    let (vmin, vmax) = (blocks[0].meta().min_time, blocks[0].meta().max_time);
    drop(blocks);
    db.close().unwrap();

    // Flip a byte inside the first chunk group (it starts at byte 32).
    let seg = victim.join("chunks/000001");
    let mut data = std::fs::read(&seg).unwrap();
    data[40] ^= 0xff;
    std::fs::write(&seg, data).unwrap();

    let db = Db::open(tmp.path(), opts(0)).unwrap();
    let s = db.querier(vmin, vmax - 1).select(&all()).unwrap();
    let mut it = s[0].iter();
    while crate::querier::SampleIterator::next(&mut it).is_some() {}
    let err = crate::querier::SampleIterator::err(&it).expect("the corruption is reported").to_string();
    assert!(err.contains("chunks/000001") && err.contains("checksum mismatch"), "{err}");
    assert_eq!(db.compact().unwrap().set_aside, 1);
    let mut aside = victim.clone().into_os_string();
    aside.push(".corrupt");
    assert!(std::path::Path::new(&aside).is_dir(), "the block is kept for an operator");
    let got = db.querier(i64::MIN, i64::MAX).select(&all()).unwrap();
    assert_eq!(got[0].samples().first().unwrap().t, vmax, "the other blocks and the head still answer");
}

#[test]
fn blocks_open_lazily_and_queries_touch_only_blocks_in_range() {
    let tmp = tempfile::tempdir().unwrap();
    // 200 blocks of one range each, written directly (as an import would).
    let l = Labels::from_pairs([("__name__", "x")]);
    for b in 0..200i64 {
        let h = Head::in_memory(HeadOptions { chunk_range_ms: RANGE, ..Default::default() });
        let mut app = h.appender();
        for t in (b * RANGE..(b + 1) * RANGE).step_by(100) {
            app.append(&l, t, t as f64).unwrap();
        }
        app.commit().unwrap();
        write_head_block(
            &crate::vfs::OsFs::shared(),
            &h,
            tmp.path(),
            b * RANGE,
            (b + 1) * RANGE,
            crate::compact::HeadCut::ALL,
        )
        .unwrap()
        .unwrap();
    }
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    let blocks = db.blocks();
    assert_eq!(blocks.len(), 200);
    assert!(blocks.iter().all(|b| !b.is_loaded()), "open reads only meta.json and tombstones");
    let got = db.querier(50 * RANGE + 10, 52 * RANGE - 10).select(&all()).unwrap();
    assert_eq!(got[0].samples().len(), 20 - 1);
    let loaded: Vec<i64> = blocks.iter().filter(|b| b.is_loaded()).map(|b| b.meta().min_time / RANGE).collect();
    assert_eq!(loaded, [50, 51], "only the blocks overlapping the range were mapped");
}

#[test]
fn a_snapshot_is_a_data_directory_holding_blocks_and_head() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    append_x(&db, (0..5 * RANGE).step_by(10));
    db.compact().unwrap();
    assert!(!db.blocks().is_empty() && db.head().time_range().is_some(), "data in blocks and in the head");
    let want = read(&db, i64::MIN, i64::MAX);
    let snap = db.snapshot(false).unwrap();
    assert!(snap.starts_with(tmp.path().join("snapshots")));
    // The snapshot opens on its own and holds everything; the original keeps working.
    let copy = Db::open(&snap, opts(0)).unwrap();
    assert_eq!(read(&copy, i64::MIN, i64::MAX), want);
    copy.close().unwrap();
    let without_head = db.snapshot(true).unwrap();
    let copy = Db::open(&without_head, opts(0)).unwrap();
    let got = read(&copy, i64::MIN, i64::MAX);
    assert!(got["x{}"].len() < want["x{}"].len(), "skip_head leaves the head's samples out");
    assert_eq!(read(&db, i64::MIN, i64::MAX), want);

    // A snapshot a crash interrupted is removed on the next open; finished ones stay.
    let torn = tmp.path().join("snapshots").join("20260101T000000Z-X.tmp");
    std::fs::create_dir_all(torn.join("01ABC")).unwrap();
    db.close().unwrap();
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    assert!(!torn.exists() && snap.exists() && without_head.exists());
    db.close().unwrap();
}

/// Native histograms next to floats: a counter whose buckets grow (chunk re-encoded), resets,
/// a gauge, a series switching kinds, staleness; read back exactly after WAL replay, head
/// truncation into blocks, and compaction (which re-encodes them).
/// Runs `check` on `db` (the head alone), after a reopen (WAL replay), after compaction into
/// blocks, and after another reopen and compaction.
fn check_through_replay_and_compaction(mut db: Db, dir: &std::path::Path, check: impl Fn(&Db, &str)) {
    check(&db, "head");
    db.close().unwrap();
    db = Db::open(dir, opts(0)).unwrap();
    check(&db, "after replay");
    db.compact().unwrap();
    assert!(!db.blocks().is_empty(), "the head was cut into blocks");
    check(&db, "blocks and head");
    db.close().unwrap();
    db = Db::open(dir, opts(0)).unwrap();
    db.compact().unwrap();
    check(&db, "after compaction and reopen");
    db.close().unwrap();
}

#[test]
fn histograms_survive_replay_blocks_and_compaction() {
    use crate::chunkenc::{TypedSample, TypedValue};
    use strata_model::histogram::notation::parse;
    use strata_model::{CounterResetHint, FloatHistogram, STALE_NAN_BITS};

    let tmp = tempfile::tempdir().unwrap();
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    let counter = Labels::from_pairs([("__name__", "h"), ("kind", "counter")]);
    let gauge = Labels::from_pairs([("__name__", "h"), ("kind", "gauge")]);
    let mixed = Labels::from_pairs([("__name__", "h"), ("kind", "mixed")]);
    let mut want: BTreeMap<String, Vec<TypedSample>> = BTreeMap::new();
    let mut add = |l: &Labels, s: TypedSample| want.entry(l.to_string()).or_default().push(s);
    for i in 0..60i64 {
        let t = i * 100;
        let mut app = db.appender();
        // The counter gains a bucket at i = 20 and resets at i = 40.
        let n = (if i < 40 { i } else { i - 40 }) as f64;
        let text = if !(20..40).contains(&i) {
            format!("{{{{count:{} sum:{} buckets:[{} {}]}}}}", 2.0 * n, n, n, n)
        } else {
            format!("{{{{count:{} sum:{} offset:-1 buckets:[1 {} {}]}}}}", 2.0 * n + 1.0, n, n, n)
        };
        let h = parse(&text).unwrap();
        app.append_histogram(&counter, t, h.clone()).unwrap();
        add(&counter, TypedSample::histogram(t, h));
        let g = parse(&format!("{{{{count:{} sum:-1 buckets:[{}] counter_reset_hint:gauge}}}}", i % 7, i % 7)).unwrap();
        app.append_histogram(&gauge, t, g.clone()).unwrap();
        add(&gauge, TypedSample::histogram(t, g));
        match i % 20 {
            0..=9 => {
                app.append(&mixed, t, i as f64).unwrap();
                add(&mixed, TypedSample::float(t, i as f64));
            }
            10 => {
                // Staleness after floats stays a float stale marker.
                app.append(&mixed, t, f64::from_bits(STALE_NAN_BITS)).unwrap();
                add(&mixed, TypedSample::float(t, f64::from_bits(STALE_NAN_BITS)));
            }
            11..=18 => {
                let h = parse(&format!("{{{{schema:-53 custom_values:[1 10] count:{i} buckets:[{i}]}}}}")).unwrap();
                app.append_histogram(&mixed, t, h.clone()).unwrap();
                add(&mixed, TypedSample::histogram(t, h));
            }
            _ => {
                // A stale NaN on a histogram series is stored as a histogram stale marker.
                app.append(&mixed, t, f64::from_bits(STALE_NAN_BITS)).unwrap();
                add(&mixed, TypedSample::histogram(t, FloatHistogram::stale_marker()));
            }
        }
        app.commit().unwrap();
    }
    // An invalid histogram is refused with the reason.
    let mut app = db.appender();
    let err = app.append_histogram(&counter, 10_000, parse("{{buckets:[1 -1]}}").unwrap()).unwrap_err();
    assert!(err.to_string().contains("observation count of -1"), "{err}");
    drop(app);

    let check = |db: &Db, stage: &str| {
        let got = db.querier(i64::MIN, i64::MAX).select(&all()).unwrap();
        assert_eq!(got.len(), 3, "{stage}");
        for s in got {
            let samples = s.typed_samples().unwrap();
            let w = &want[&s.labels.to_string()];
            assert_eq!(samples.len(), w.len(), "{stage}: {}", s.labels);
            let mut prev: Option<&FloatHistogram> = None;
            // Storage may widen a histogram's layout with empty buckets (a re-encoded chunk).
            let compacted = |x: &TypedSample| match &x.value {
                TypedValue::Histogram(h) => {
                    let mut h = h.clone();
                    h.compact();
                    TypedSample { t: x.t, st: x.st, value: TypedValue::Histogram(h) }
                }
                f => TypedSample { t: x.t, st: x.st, value: f.clone() },
            };
            for (g, e) in samples.iter().zip(w) {
                assert!(
                    compacted(g).bit_eq(&compacted(e)),
                    "{stage}: {} at {}: {:?} vs {:?}",
                    s.labels,
                    e.t,
                    g.value,
                    e.value
                );
                if let TypedValue::Histogram(h) = &g.value {
                    // Readers learn of resets from the hint or by comparing with the sample before.
                    let reset = prev.is_some_and(|p| !h.is_stale() && !p.is_stale() && h.detect_reset(p));
                    let expect_reset = s.labels == counter && g.t == 4000;
                    if s.labels == gauge {
                        assert_eq!(h.hint, CounterResetHint::Gauge, "{stage}");
                    } else {
                        assert_eq!(reset, expect_reset, "{stage}: {} at {}", s.labels, g.t);
                    }
                    prev = Some(h);
                } else {
                    prev = None;
                }
            }
        }
    };
    check_through_replay_and_compaction(db, tmp.path(), check);
}

#[test]
fn start_times_survive_replay_blocks_and_compaction() {
    use strata_model::histogram::notation::parse;

    let tmp = tempfile::tempdir().unwrap();
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    let name = |kind: &str| Labels::from_pairs([("__name__", "c"), ("kind", kind)]);
    // (labels, t, st) of every sample, in order per series.
    let mut want: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for i in 1..60i64 {
        let t = i * 100;
        let mut app = db.appender();
        // A cumulative counter restarting every 25 samples; a delta series; a series that
        // gains start times halfway through a chunk and loses them again; a histogram.
        let cumulative_st = (i / 25) * 2500 + 1;
        let some_st = if (10..30).contains(&i) { t - 7 } else { 0 };
        for (kind, st) in [("cumulative", cumulative_st), ("delta", t - 100), ("some", some_st), ("none", 0)] {
            app.append_with_start(&name(kind), t, st, i as f64).unwrap();
            want.entry(name(kind).to_string()).or_default().push((t, st));
        }
        let h = parse(&format!("{{{{count:{i} sum:{i} buckets:[{i}]}}}}")).unwrap();
        app.append_histogram_with_start(&name("histogram"), t, 50, h).unwrap();
        want.entry(name("histogram").to_string()).or_default().push((t, 50));
        app.commit().unwrap();
    }
    let check = |db: &Db, stage: &str| {
        let got: BTreeMap<String, Vec<(i64, i64)>> = db
            .querier(i64::MIN, i64::MAX)
            .select(&all())
            .unwrap()
            .into_iter()
            .map(|s| (s.labels.to_string(), s.typed_samples().unwrap().iter().map(|x| (x.t, x.st)).collect()))
            .collect();
        assert_eq!(got, want, "{stage}");
    };
    check_through_replay_and_compaction(db, tmp.path(), check);
}

/// Regression: a query that passed its series limit (or now its chunk limit, or was stopped by
/// its deadline) while
/// reading a block marked that block corrupt, and the next compaction set it aside: one query
/// over too many series took a block of data out of service.
#[test]
fn a_query_stopped_by_its_limits_leaves_blocks_in_service() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Db::open(tmp.path(), opts(0)).unwrap();
    let mut app = db.appender();
    for i in 0..3000 {
        let l = Labels::from_pairs([("__name__", "x".to_string()), ("i", i.to_string())]);
        for t in (0..3 * RANGE).step_by(100) {
            app.append(&l, t, 1.0).unwrap();
        }
    }
    app.commit().unwrap();
    db.compact().unwrap();
    assert!(!db.blocks().is_empty());
    for threads in [1, 3] {
        let err = db.querier(0, 3 * RANGE).parallelism(threads).limit_series(10).select(&all()).unwrap_err();
        assert!(matches!(err, crate::Error::TooManySeries { limit: 10 }), "{err}");
        let err = db.querier(0, 3 * RANGE).parallelism(threads).limit_chunks(100).select(&all()).unwrap_err();
        assert!(matches!(err, crate::Error::TooManyChunks { limit: 100 }), "{err}");
        let stop = || Some(crate::error::Stop::Timeout);
        let err = db.querier(0, 3 * RANGE).parallelism(threads).interrupt(&stop).select(&all()).unwrap_err();
        assert!(matches!(err, crate::Error::Stopped(crate::error::Stop::Timeout)), "{err}");
        let err = db.querier(0, 3 * RANGE).interrupt(&stop).label_values("i", &all()).unwrap_err();
        assert!(matches!(err, crate::Error::Stopped(_)), "{err}");
    }
    assert!(db.blocks().iter().all(|b| !b.is_corrupt()), "no block marked corrupt");
    assert_eq!(db.compact().unwrap().set_aside, 0);
    assert_eq!(db.querier(0, 3 * RANGE).select(&all()).unwrap().len(), 3000);
}

/// Writes with late points and rewrites of stored timestamps, some into ranges already cut into
/// blocks, under `rules`; checked against a model after compactions and reopens. Under
/// Graphite's rule (`replace`) the model keeps each timestamp's last written value; under
/// Prometheus' a rewrite with another value is refused and the first stays.
fn late_writes_match_a_model(rules: crate::head::OutOfOrder) {
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let tmp = tempfile::tempdir().unwrap();
    let options = DbOptions { head: HeadOptions { out_of_order: rules, ..opts(0).head }, ..opts(0) };
    let mut db = Db::open(tmp.path(), options.clone()).unwrap();
    let mut model = Model::new();
    let series: Vec<Labels> = (0..12).map(|i| Labels::from_pairs([("__name__", format!("late.m{i}"))])).collect();
    let (mut late, mut refused) = (0, 0);
    let rounds = 240;
    for round in 0..rounds {
        let mut app = db.appender();
        let mut batch: Vec<(String, i64, f64)> = Vec::new();
        let mut rewritten_in_blocks: Vec<(String, i64)> = Vec::new();
        for l in &series {
            for _ in 0..rng.gen_range(0..4) {
                let t = if rng.gen_bool(0.6) {
                    round * 100 + rng.gen_range(0..100)
                } else {
                    // Late: up to the window back; a third of them a timestamp already stored.
                    let stored = model.get(&l.to_string()).map(|m| m.keys().copied().collect::<Vec<_>>());
                    match stored.filter(|s| !s.is_empty() && rng.gen_bool(0.33)) {
                        Some(s) => s[rng.gen_range(0..s.len())],
                        None => round * 100 - rng.gen_range(0..rules.window_ms),
                    }
                };
                let v = f64::from(rng.gen_range(0..1000u16));
                let key = l.to_string();
                let was = model.get(&key).and_then(|m| m.get(&t)).copied();
                let pending = batch.iter().rev().find(|(k, bt, _)| *k == key && *bt == t).map(|b| b.2.to_bits());
                if pending.is_some() && !rules.replace {
                    // Refused at commit, not at append (the appender checks what is stored).
                    continue;
                }
                match app.append(l, t, v) {
                    Ok(_) => {
                        if !rules.replace {
                            // Prometheus' rule: only a new timestamp or the very same value, as
                            // far as the head can tell: a timestamp only blocks hold is not seen
                            // (nor is it by Prometheus), and the late value then wins.
                            let in_head = db.blocks().iter().all(|b| t >= b.meta().max_time);
                            let rewrite = pending.or(was).is_some_and(|b| b != v.to_bits());
                            assert!(!(rewrite && in_head), "{key} t={t}: a rewrite was taken");
                            if rewrite {
                                rewritten_in_blocks.push((key.clone(), t));
                            }
                        }
                        if pending.is_none() && was.is_some_and(|b| b != v.to_bits()) || t < round * 100 {
                            late += 1;
                        }
                        batch.push((key, t, v));
                    }
                    Err(crate::head::AppendError::Sample(
                        SampleError::Duplicate { .. } | SampleError::TooOld { .. } | SampleError::OutOfOrder { .. },
                    )) => refused += 1,
                    Err(e) => panic!("{key} t={t}: {e}"),
                }
            }
        }
        let outcome = app.commit().unwrap();
        assert_eq!(outcome.rejected, 0, "{outcome:?}");
        for (key, t, v) in batch {
            let replaced = rewritten_in_blocks.contains(&(key.clone(), t));
            let stored = model.entry(key).or_default();
            if rules.replace || replaced || !stored.contains_key(&t) {
                stored.insert(t, v.to_bits());
            }
        }
        if round % 20 == 19 {
            db.compact().unwrap();
            check(&db, &model, &mut rng, round * 100);
        }
        if round % 60 == 59 {
            db.close().unwrap();
            db = Db::open(tmp.path(), options.clone()).unwrap();
            check(&db, &model, &mut rng, round * 100);
        }
    }
    db.compact().unwrap();
    assert_no_overlap(&db);
    check(&db, &model, &mut rng, rounds * 100);
    assert!(late > 100 && refused > 0, "late {late}, refused {refused}");
    db.close().unwrap();
}

use crate::head::SampleError;

#[test]
fn late_writes_and_rewrites_keep_the_last_value_through_cuts_replay_and_compaction() {
    late_writes_match_a_model(crate::head::OutOfOrder { window_ms: 5 * RANGE, replace: true });
}

#[test]
fn late_writes_keep_the_first_value_under_prometheus_rules() {
    late_writes_match_a_model(crate::head::OutOfOrder { window_ms: 5 * RANGE, replace: false });
}
