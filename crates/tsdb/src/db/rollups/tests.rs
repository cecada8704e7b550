//! Rollup tiers end to end on a real directory: raw blocks rolled up as they settle, raw
//! retention waiting for the tiers, the reader equal to aggregating every sample, lineage
//! surviving a reopen, deletions, late data and tier retention.

use std::collections::{BTreeMap, BTreeSet};

use strata_model::{FloatHistogram, Labels, MatchOp, Matcher, Sample};

use super::*;
use crate::chunkenc::rollup::ColumnSet;
use crate::db::DbOptions;
use crate::head::{HeadOptions, OutOfOrder};
use crate::querier::ReadLimits;
use crate::rollup::{aggregate_closed, ArchiveRule, ArchiveValue, Closed, SeriesFilter};

const MIN: i64 = 60_000;
/// PromQL's right-closed tiers and a left-closed one of the same interval (Graphite's).
const TIERS: [RollupTier; 3] = [
    RollupTier { interval_ms: 10_000, retention_ms: 120 * MIN, closed: Closed::Right },
    RollupTier { interval_ms: 30_000, retention_ms: 0, closed: Closed::Right },
    RollupTier { interval_ms: 10_000, retention_ms: 0, closed: Closed::Left },
];

fn opts(retention_ms: i64, tiers: &[RollupTier]) -> DbOptions {
    DbOptions {
        head: HeadOptions {
            chunk_range_ms: MIN,
            out_of_order: OutOfOrder { window_ms: 10 * MIN, replace: false },
            ..HeadOptions::default()
        },
        retention_ms,
        retention_bytes: 0,
        compact_interval: None,
        rollups: tiers.to_vec(),
        rollup_filter: None,
        late_window_ms: 0,
    }
}

fn series(i: usize) -> Labels {
    Labels::from_pairs([("__name__", "m".to_string()), ("i", i.to_string())])
}

/// Every float series (a matching histogram series makes a tier read return nothing).
fn all() -> Vec<Matcher> {
    vec![Matcher::new(MatchOp::Equal, "__name__", "m").unwrap(), Matcher::new(MatchOp::NotEqual, "i", "99").unwrap()]
}

/// Counter with resets, gauge, a series with NaN values, a sparse one.
fn value(i: usize, t: i64) -> f64 {
    let k = t / 1000;
    match i {
        0 => (k % 700) as f64 * 3.0,
        1 => ((k * 7919) % 1000) as f64 / 10.0,
        2 if k % 13 == 0 => f64::NAN,
        _ => k as f64 * 0.25,
    }
}

type Model = BTreeMap<usize, BTreeMap<i64, f64>>;

/// Appends a sample per second (jittered like scrapes) for each series in `[from, to)`, the
/// sparse series 3 every 20 s, and a histogram series (never rolled up), compacting every 30 s.
fn run(db: &Db, model: &mut Model, from: i64, to: i64) {
    let mut t = from;
    while t < to {
        let mut app = db.appender();
        for i in 0..4usize {
            if i == 3 && t % 20_000 != 0 {
                continue;
            }
            let at = t + (i as i64 * 37 + t / 1000 * 13) % 300;
            app.append(&series(i), at, value(i, at)).unwrap();
            model.entry(i).or_default().insert(at, value(i, at));
        }
        let h = FloatHistogram { count: 1.0, sum: 1.0, ..Default::default() };
        app.append_histogram(&series(99), t, h).unwrap();
        app.commit().unwrap();
        t += 1000;
        if t % 30_000 == 0 {
            db.compact().unwrap();
        }
    }
}

/// Imports samples of series `i` at `times` (value `v`) as a backfill does, into `model` too.
fn import_backfill(db: &Db, model: &mut Model, i: usize, times: impl Iterator<Item = i64>, v: f64) {
    let backfill = crate::head::Head::in_memory(HeadOptions { chunk_range_ms: MIN, ..Default::default() });
    let mut app = backfill.appender();
    for t in times {
        app.append(&series(i), t, v).unwrap();
        model.entry(i).or_default().insert(t, v);
    }
    app.commit().unwrap();
    db.import_head(&backfill).unwrap();
}

/// `opts` with the head refusing out-of-order samples: later data comes by backfill only.
fn in_order_opts(retention_ms: i64, tiers: &[RollupTier]) -> DbOptions {
    DbOptions {
        head: HeadOptions { out_of_order: OutOfOrder::OFF, ..opts(0, tiers).head },
        ..opts(retention_ms, tiers)
    }
}

fn close(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// The tier's answer over `[mint, maxt]` equals aggregating the model's samples of the
/// buckets that range covers.
fn check(db: &Db, model: &Model, tier: RollupTier, mint: i64, maxt: i64) {
    check_with(db, model, &all(), tier, mint, maxt);
}

/// `check` of the series `matchers` select (`model` holds those only).
fn check_with(db: &Db, model: &Model, matchers: &[Matcher], tier: RollupTier, mint: i64, maxt: i64) {
    let (interval, closed) = (tier.interval_ms, tier.closed);
    let selection =
        db.rollup_select(tier.meta(), matchers, mint, maxt, ColumnSet::ALL, &ReadLimits::default()).unwrap();
    let got = selection.series;
    assert!(got.windows(2).all(|p| p[0].labels < p[1].labels), "series in label order, each once");
    // Mapped, on this thread alone (the selection above took the decoding workers): the same
    // series and buckets, in the same order.
    let mut mapped = Vec::new();
    let one_thread = ReadLimits { threads: 1, ..ReadLimits::default() };
    // (NaN values compared by their bits.)
    let brief = |s: &RollupSeries| -> (Labels, Vec<(i64, u64, i64, u64)>) {
        (s.labels.clone(), s.buckets.iter().map(|b| (b.end, b.count, b.last.t, b.last.v.to_bits())).collect())
    };
    let histograms = db
        .rollup_map(tier.meta(), matchers, mint, maxt, ColumnSet::ALL, &one_thread, &brief, &mut |m| {
            mapped.push(m);
            Ok(())
        })
        .unwrap();
    let selected: Vec<_> = got.iter().map(brief).collect();
    assert_eq!((histograms, &mapped), (selection.histogram_series, &selected));
    let (first_end, last_end) = (closed.bucket_end(mint, interval), closed.bucket_end(maxt, interval));
    let mut want_series = 0;
    for (i, samples) in model {
        let (lo, hi) = (closed.span(first_end, interval).0, closed.span(last_end, interval).1);
        let samples: Vec<Sample> = samples.range(lo..=hi).map(|(&t, &v)| Sample { t, v }).collect();
        let want = aggregate_closed(&samples, interval, closed);
        if want.is_empty() {
            continue;
        }
        want_series += 1;
        let s = got.iter().find(|s| s.labels == series(*i)).unwrap_or_else(|| panic!("series {i} missing"));
        assert_eq!(s.buckets.len(), want.len(), "series {i} at {interval}");
        for (g, w) in s.buckets.iter().zip(&want) {
            assert_eq!(
                (g.end, g.count, g.first.t, g.last.t, g.changes, g.resets),
                (w.end, w.count, w.first.t, w.last.t, w.changes, w.resets),
                "series {i}"
            );
            for (x, y) in [(g.min, w.min), (g.max, w.max), (g.first.v, w.first.v), (g.last.v, w.last.v)] {
                assert!(x.to_bits() == y.to_bits() || x == y, "series {i}: {g:?} vs {w:?}");
            }
            assert!(close(g.sum, w.sum) && close(g.reset_correction, w.reset_correction), "series {i}: {g:?} vs {w:?}");
        }
    }
    assert_eq!(got.len(), want_series);
}

#[test]
fn tiers_hold_what_raw_retention_deleted_and_answer_as_raw_did() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let db = Db::open(tmp.path(), opts(10 * MIN, &TIERS)).unwrap();
    run(&db, &mut model, 0, 40 * MIN);
    let raw = db.blocks();
    assert!(raw[0].meta().min_time >= 20 * MIN, "raw retention deleted old blocks: {:?}", raw[0].meta());
    let status = db.status(1).unwrap();
    for t in &status.tiers {
        assert!(t.blocks[0].min_time == 0, "the tier holds the oldest data: {:?}", t.blocks[0]);
        assert!(t.bytes > 0);
    }
    assert!(db.stats().rollup_blocks_written.load(Ordering::Relaxed) > 0);
    assert!(db.stats().rollup_histogram_series_skipped.load(Ordering::Relaxed) > 0);
    // Where raw data is read (the head), a matching histogram series is reported, and nothing
    // else: the reader must read raw data.
    let with_histograms = vec![Matcher::new(MatchOp::Equal, "__name__", "m").unwrap()];
    let got =
        db.rollup_select(TIERS[0].meta(), &with_histograms, 39 * MIN, 40 * MIN, ColumnSet::ALL, &ReadLimits::default());
    let got = got.unwrap();
    assert_eq!((got.histogram_series, got.series.len()), (1, 0));
    for tier in TIERS {
        check(&db, &model, tier, 0, 40 * MIN);
        // Windows that start and end inside buckets and blocks.
        check(&db, &model, tier, 7 * MIN + 4_321, 33 * MIN + 17);
    }
    db.close().unwrap();

    // Reopened: the same lineage, the same answers.
    let db = Db::open(tmp.path(), opts(10 * MIN, &TIERS)).unwrap();
    for tier in TIERS {
        check(&db, &model, tier, 0, 40 * MIN);
    }
    // Tier merges (raw sources gone) and more data keep the answers.
    run(&db, &mut model, 40 * MIN, 70 * MIN);
    assert!(db.stats().rollup_compactions.load(Ordering::Relaxed) > 0);
    for tier in TIERS {
        check(&db, &model, tier, 0, 70 * MIN);
    }
    assert!(matches!(
        db.rollup_select(RollupTier::left(30_000, 0).meta(), &all(), 0, MIN, ColumnSet::ALL, &ReadLimits::default()),
        Err(Error::NoSuchTier { tier }) if tier == RollupTier::left(30_000, 0).meta()
    ));
}

#[test]
fn series_only_raw_data_holds_come_in_label_order_among_the_tiers() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let db = Db::open(tmp.path(), opts(0, &TIERS)).unwrap();
    run(&db, &mut model, 0, 12 * MIN);
    assert!(db.status(1).unwrap().tiers.iter().all(|t| !t.blocks.is_empty()), "rolled up");
    // New series, in the head only, whose labels sort between the rolled-up ones ("0" < "1" <
    // "10" < "2" < "25" < "3" < "4"), and after them.
    for t in (12 * MIN..14 * MIN).step_by(1000) {
        let mut app = db.appender();
        for i in [10usize, 25, 4] {
            app.append(&series(i), t + 7, value(i, t + 7)).unwrap();
            model.entry(i).or_default().insert(t + 7, value(i, t + 7));
        }
        app.commit().unwrap();
    }
    for tier in TIERS {
        check(&db, &model, tier, 0, 14 * MIN);
        check(&db, &model, tier, 11 * MIN, 14 * MIN);
    }
}

#[test]
fn late_samples_into_rolled_up_ranges_replace_the_rollup() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    // Raw data kept 30 min: compaction ranges 1 and 3 min, so blocks settle after 3 min.
    let db = Db::open(tmp.path(), opts(30 * MIN, &TIERS[1..])).unwrap();
    run(&db, &mut model, 0, 12 * MIN);
    // Raw blocks are rolled up as they are cut, and the tier's blocks merged along with them
    // (1-minute blocks into 3-minute ones) while the raw data is still there.
    let tier = &db.status(1).unwrap().tiers[0];
    assert!(tier.blocks.iter().any(|b| b.max_time - b.min_time == 3 * MIN), "{:?}", tier.blocks);
    assert!(db.stats().rollup_compactions.load(Ordering::Relaxed) > 0);
    assert_eq!(db.blocks().len(), tier.blocks.len(), "the tier keeps the raw blocks' partition");
    check(&db, &model, TIERS[1], 0, 12 * MIN);
    // Late samples into the rolled-up minutes 2 to 5 (inside the out-of-order window of the head
    // they are not, so they come as a backfill, as `import` writes them).
    let backfill = crate::head::Head::in_memory(HeadOptions { chunk_range_ms: MIN, ..Default::default() });
    let mut app = backfill.appender();
    for t in (2 * MIN + 500..5 * MIN).step_by(1000) {
        app.append(&series(0), t, 5.0).unwrap();
        model.get_mut(&0).unwrap().insert(t, 5.0);
    }
    app.commit().unwrap();
    db.import_head(&backfill).unwrap();
    // Read before compaction: the late raw blocks are read with the raw data they overlap.
    check(&db, &model, TIERS[1], 0, 12 * MIN);
    db.compact().unwrap();
    check(&db, &model, TIERS[1], 0, 12 * MIN);
    let replaced = db.status(1).unwrap().tiers[0].blocks.iter().filter(|b| b.min_time < 5 * MIN).count();
    assert!(replaced > 0, "the late range is rolled up again");
    db.close().unwrap();
    let db = Db::open(tmp.path(), opts(30 * MIN, &TIERS[1..])).unwrap();
    check(&db, &model, TIERS[1], 0, 12 * MIN);
}

#[test]
fn late_head_samples_send_only_their_series_blocks_through_the_raw_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let db = Db::open(tmp.path(), opts(0, &TIERS[1..2])).unwrap();
    run(&db, &mut model, 0, 12 * MIN);
    let raw_blocks_read = || db.stats().rollup_raw_blocks_read.load(Ordering::Relaxed);
    let only = |i: usize| {
        vec![
            Matcher::new(MatchOp::Equal, "__name__", "m").unwrap(),
            Matcher::new(MatchOp::Equal, "i", i.to_string()).unwrap(),
        ]
    };
    let model_of = |model: &Model, i: usize| Model::from([(i, model[&i].clone())]);
    // Settled minutes: every block there is rolled up, none is read raw.
    let before = raw_blocks_read();
    check(&db, &model, TIERS[1], 0, 6 * MIN);
    assert_eq!(raw_blocks_read(), before, "rolled-up blocks are read from the tier");
    // A late sample of series 0 into a rolled-up block (inside the head's out-of-order window).
    let late = 4 * MIN + 250;
    let mut app = db.appender();
    app.append(&series(0), late, 1234.5).unwrap();
    app.commit().unwrap();
    model.get_mut(&0).unwrap().insert(late, 1234.5);
    // Series 1 has no head samples back there: its read still takes the tier's buckets.
    let before = raw_blocks_read();
    check_with(&db, &model_of(&model, 1), &only(1), TIERS[1], 0, 6 * MIN);
    assert_eq!(raw_blocks_read(), before, "another series' late sample leaves this read on the tier");
    // Series 0's read (and any read that selects it) merges its block's samples with the late one.
    check_with(&db, &model_of(&model, 0), &only(0), TIERS[1], 0, 6 * MIN);
    assert!(raw_blocks_read() > before, "the late sample's block is read raw");
    check(&db, &model, TIERS[1], 0, 6 * MIN);
    // Compaction merges the late sample and rolls the block up again: no raw read after it.
    db.compact().unwrap();
    let before = raw_blocks_read();
    check(&db, &model, TIERS[1], 0, 6 * MIN);
    assert_eq!(raw_blocks_read(), before, "rolled up again with the late sample");
}

#[test]
fn deletions_remove_every_bucket_they_touch() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let db = Db::open(tmp.path(), opts(5 * MIN, &TIERS)).unwrap();
    run(&db, &mut model, 0, 20 * MIN);
    let only = |i: usize| vec![Matcher::new(MatchOp::Equal, "i", i.to_string()).unwrap()];
    db.delete(&only(1), 3 * MIN + 5_000, 3 * MIN + 5_000).unwrap();
    let got = db
        .rollup_select(TIERS[0].meta(), &only(1), 0, 20 * MIN, ColumnSet::ALL, &ReadLimits::default())
        .unwrap()
        .series;
    let ends: Vec<i64> = got[0].buckets.iter().map(|b| b.end).collect();
    assert!(!ends.contains(&(3 * MIN + 10_000)), "the touched bucket is gone");
    assert!(ends.contains(&(3 * MIN)) && ends.contains(&(3 * MIN + 20_000)), "its neighbours stay");
    // Tier merges drop it for good.
    run(&db, &mut model, 20 * MIN, 40 * MIN);
    let got = db
        .rollup_select(TIERS[0].meta(), &only(1), 0, 20 * MIN, ColumnSet::ALL, &ReadLimits::default())
        .unwrap()
        .series;
    assert!(!got[0].buckets.iter().any(|b| b.end == 3 * MIN + 10_000));
}

#[test]
fn tier_retention_deletes_old_tier_blocks_only() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let tiers = [RollupTier::new(10_000, 20 * MIN), RollupTier::new(30_000, 0)];
    let db = Db::open(tmp.path(), opts(5 * MIN, &tiers)).unwrap();
    run(&db, &mut model, 0, 60 * MIN);
    let status = db.status(1).unwrap();
    assert!(status.tiers[0].blocks[0].min_time >= 30 * MIN, "{:?}", status.tiers[0].blocks[0]);
    assert_eq!(status.tiers[1].blocks[0].min_time, 0);
    assert!(db.stats().rollup_blocks_deleted_by_retention.load(Ordering::Relaxed) > 0);
    check(&db, &model, tiers[1], 0, 60 * MIN);
    check(&db, &model, tiers[0], 45 * MIN, 60 * MIN);
}

#[test]
fn a_series_filter_keeps_only_the_series_a_tier_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    // The left-closed tier keeps series 1 only (as a Graphite schema maps paths onto tiers);
    // the right-closed one every series.
    let tiers = [RollupTier::new(30_000, 0), RollupTier::left(30_000, 0)];
    let mut o = opts(5 * MIN, &tiers);
    o.rollup_filter =
        Some(SeriesFilter::new(|tier, labels| tier.closed == Closed::Right || labels.get("i") == Some("1")));
    let db = Db::open(tmp.path(), o).unwrap();
    run(&db, &mut model, 0, 30 * MIN);
    // Raw data before minute 20 or so is gone; the right-closed tier holds every series.
    assert!(db.blocks().iter().all(|b| b.meta().min_time > 10 * MIN), "raw retention ran");
    check(&db, &model, tiers[0], 0, 30 * MIN);
    let got = db.rollup_select(tiers[1].meta(), &all(), 0, 10 * MIN, ColumnSet::ALL, &ReadLimits::default()).unwrap();
    let kept: Vec<&str> = got.series.iter().filter_map(|s| s.labels.get("i")).collect();
    assert_eq!(kept, ["1"], "only the kept series has buckets where only the tier holds data");
    // Series 1's buckets are all there.
    let (interval, closed) = (tiers[1].interval_ms, tiers[1].closed);
    let hi = closed.span(closed.bucket_end(10 * MIN, interval), interval).1;
    let want: Vec<Sample> = model[&1].range(0..=hi).map(|(&t, &v)| Sample { t, v }).collect();
    let want = aggregate_closed(&want, interval, closed);
    assert_eq!(got.series[0].buckets.len(), want.len());
}

/// An archive rule (what Graphite's schemas give a tier whose interval is a coarse archive's
/// step) is applied to buckets whole: in tier blocks, through tier compaction and raw
/// retention, and in the raw data a read aggregates; every value it kept is the rule over all
/// the bucket's samples, and a bucket made of parts keeps none.
#[test]
fn archive_values_are_the_rule_over_whole_buckets() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    // Blocks start on whole minutes: 10-second buckets are never cut, 40-second ones are at
    // every other minute.
    let tiers = [RollupTier::left(10_000, 0), RollupTier::left(40_000, 0)];
    let mut o = opts(5 * MIN, &tiers);
    // A rule that sees every sample: their number and the first one's time; none for fewer
    // than three samples (an archive without a value there).
    let rule =
        |_end: i64, samples: &[Sample]| (samples.len() >= 3).then(|| samples.len() as f64 * 1e13 + samples[0].t as f64);
    o.rollup_filter =
        Some(SeriesFilter::new(|_, _| true).with_archive_rules(move |_, labels| {
            (labels.get("i") != Some("0")).then(|| Arc::new(rule) as ArchiveRule)
        }));
    let db = Db::open(tmp.path(), o).unwrap();
    run(&db, &mut model, 0, 30 * MIN);
    assert!(db.blocks().iter().all(|b| b.meta().min_time > 10 * MIN), "raw retention ran");
    for tier in tiers {
        let got = db.rollup_select(tier.meta(), &all(), 0, 30 * MIN, ColumnSet::ALL, &ReadLimits::default()).unwrap();
        let (mut kept, mut unknown, mut not_kept) = (0, 0, 0);
        for s in &got.series {
            let i: usize = s.labels.get("i").unwrap().parse().unwrap();
            for b in &s.buckets {
                let (lo, hi) = tier.closed.span(b.end, tier.interval_ms);
                let samples: Vec<Sample> = model[&i].range(lo..=hi).map(|(&t, &v)| Sample { t, v }).collect();
                match b.archive {
                    ArchiveValue::NotKept => not_kept += 1,
                    _ if i == 0 => panic!("series 0 has no rule: {b:?}"),
                    ArchiveValue::Unknown => {
                        assert_eq!(rule(b.end, &samples), None, "series {i}: {b:?}");
                        unknown += 1;
                    }
                    ArchiveValue::Value(v) => {
                        assert_eq!(Some(v), rule(b.end, &samples), "series {i}: {b:?}");
                        kept += 1;
                    }
                }
            }
        }
        let counts = format!("tier {tier}: {kept} kept, {unknown} unknown, {not_kept} not kept");
        if tier.interval_ms == 10_000 {
            // Series 1 and 2 keep every value, the sparse series 3 (a sample every 20 s) none
            // (unknown), series 0 none (no rule).
            assert_eq!((kept, unknown, not_kept), (360, 90, 180), "{counts}");
        } else {
            // 45 buckets a series, 15 of them cut by a block boundary.
            assert_eq!((kept + unknown, not_kept), (3 * 30, 45 + 3 * 15), "{counts}");
        }
    }
}

/// Tier blocks whose raw blocks are at the largest raw range are merged into coarse blocks
/// while the raw blocks remain (fewer blocks and chunks to read), and dropped and rolled up
/// again one raw block at a time when late data reaches one of those raw blocks or retention
/// deletes one; the answers stay the samples' all along.
#[test]
fn coarse_tier_blocks_over_remaining_raw_blocks_answer_as_the_samples_do() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    // Raw kept 30 min: raw ranges 1 and 3 min, so the tiers' coarse windows are 9 min.
    let tiers = &TIERS[..2];
    let db = Db::open(tmp.path(), opts(30 * MIN, tiers)).unwrap();
    run(&db, &mut model, 0, 45 * MIN);
    let raw_sources: std::collections::HashSet<String> =
        db.blocks().iter().flat_map(|b| b.meta().compaction.sources.clone()).collect();
    let coarse = |db: &Db| -> Vec<(usize, BlockMeta)> {
        let status = db.status(1).unwrap();
        let raw: Vec<BlockMeta> = db.blocks().iter().map(|b| b.meta().clone()).collect();
        let mut out = Vec::new();
        for (k, t) in status.tiers.iter().enumerate() {
            for b in &t.blocks {
                let theirs =
                    raw.iter().filter(|r| r.compaction.sources.iter().any(|s| b.compaction.sources.contains(s)));
                if theirs.count() > 1 {
                    out.push((k, b.clone()));
                }
            }
        }
        out
    };
    let merged = coarse(&db);
    assert!(
        (0..tiers.len()).all(|k| merged.iter().any(|(t, b)| *t == k && b.max_time - b.min_time == 9 * MIN)),
        "each tier holds a coarse block over remaining raw blocks: {merged:?}"
    );
    assert!(merged.iter().all(|(_, b)| b.compaction.sources.iter().all(|s| raw_sources.contains(s))));
    assert!(
        db.stats().rollup_coarse_blocks_dropped.load(Ordering::Relaxed) > 0,
        "retention reached a coarse block's raw blocks and dropped it"
    );
    for tier in tiers {
        check(&db, &model, *tier, 0, 45 * MIN);
        check(&db, &model, *tier, 19 * MIN + 4_321, 44 * MIN + 17);
    }

    // Late samples into the middle raw block of a coarse block.
    let (_, target) = merged.iter().find(|(t, _)| *t == 1).unwrap().clone();
    let late_from = target.min_time + 3 * MIN + 500;
    let backfill = crate::head::Head::in_memory(HeadOptions { chunk_range_ms: MIN, ..Default::default() });
    let mut app = backfill.appender();
    for t in (late_from..late_from + 2 * MIN).step_by(1000) {
        app.append(&series(0), t, 5.0).unwrap();
        model.get_mut(&0).unwrap().insert(t, 5.0);
    }
    app.commit().unwrap();
    db.import_head(&backfill).unwrap();
    // Before compaction the late block and the raw block it overlaps are read raw, and so are
    // the coarse block's other raw blocks.
    for tier in tiers {
        check(&db, &model, *tier, 0, 45 * MIN);
    }
    let dropped = db.stats().rollup_coarse_blocks_dropped.load(Ordering::Relaxed);
    db.compact().unwrap();
    assert!(db.stats().rollup_coarse_blocks_dropped.load(Ordering::Relaxed) > dropped, "the late data dropped it");
    assert!(!db.status(1).unwrap().tiers[1].blocks.iter().any(|b| b.ulid == target.ulid));
    for tier in tiers {
        check(&db, &model, *tier, 0, 45 * MIN);
        check(&db, &model, *tier, target.min_time + 17, target.max_time - 17);
    }
    db.close().unwrap();

    // Reopened, and on until retention has passed every block above.
    let db = Db::open(tmp.path(), opts(30 * MIN, tiers)).unwrap();
    for tier in tiers {
        check(&db, &model, *tier, 0, 45 * MIN);
    }
    run(&db, &mut model, 45 * MIN, 90 * MIN);
    for tier in tiers {
        check(&db, &model, *tier, 0, 90 * MIN);
    }
    assert!(!coarse(&db).is_empty(), "newer coarse blocks");
}

/// Rolling up, merging and dropping tier blocks notes their ranges in the change log for
/// readers of tiers (a result cache keeping answers from tiers), not for readers of samples.
#[test]
fn tier_block_changes_are_noted_for_tier_readers_only() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let db = Db::open(tmp.path(), opts(0, &TIERS)).unwrap();
    let seen = db.changes().seq();
    run(&db, &mut model, 0, 10 * MIN);
    assert!(db.stats().rollup_blocks_written.load(Ordering::Relaxed) > 0);
    let oldest = db.status(1).unwrap().tiers.iter().map(|t| t.blocks[0].min_time).min().unwrap();
    assert_eq!(db.changes().changed_in_tiers_since(seen), Some(oldest));
    assert_eq!(db.changes().changed_since(seen), None, "no sample changed");
    let later = db.changes().seq();
    run(&db, &mut model, 10 * MIN, 20 * MIN);
    let changed = db.changes().changed_in_tiers_since(later).expect("newer blocks rolled up");
    assert!(changed >= 5 * MIN, "only the newer blocks' ranges: {changed}");
}

/// The blocks of `db`'s tiers that hold the sources of more than one remaining raw block
/// (merged ahead of raw compaction), each with its tier's index.
fn merged_over_raw(db: &Db) -> Vec<(usize, BlockMeta)> {
    let raw: Vec<BlockMeta> = db.blocks().iter().map(|b| b.meta().clone()).collect();
    let mut out = Vec::new();
    for (k, t) in db.status(1).unwrap().tiers.iter().enumerate() {
        for b in &t.blocks {
            let theirs = raw.iter().filter(|r| r.compaction.sources.iter().any(|s| b.compaction.sources.contains(s)));
            if theirs.count() > 1 {
                out.push((k, b.clone()));
            }
        }
    }
    out
}

#[test]
fn tier_blocks_of_a_filling_raw_window_are_merged_ahead_of_raw_compaction() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    // Raw kept 2 h: raw ranges 1, 3 and 9 min; late samples refused, so raw blocks settle as
    // they leave the head. Both tiers' filling windows are the 9-minute one.
    let tiers = &TIERS[..2];
    let in_order = |late_window_ms| DbOptions { late_window_ms, ..in_order_opts(120 * MIN, tiers) };
    let db = Db::open(tmp.path(), in_order(0)).unwrap();
    // Minutes 0-8: raw blocks of 3, 3 and 1 minutes, but in the oldest raw window, which
    // retention reaches first: left as raw cut it.
    run(&db, &mut model, 0, 8 * MIN);
    assert!(db.blocks().len() >= 3);
    assert_eq!(merged_over_raw(&db), Vec::new());
    // Minutes 18-25: raw blocks of 3, 1 and 1 minutes while the window fills.
    run(&db, &mut model, 8 * MIN, 25 * MIN);
    let merged = merged_over_raw(&db);
    for k in 0..tiers.len() {
        let mine: Vec<&BlockMeta> = merged.iter().filter(|(t, _)| *t == k).map(|(_, b)| b).collect();
        assert!(
            mine.iter().any(|b| b.min_time == 18 * MIN && b.max_time > 21 * MIN && b.max_time <= 27 * MIN),
            "tier {k} merged the filling window's blocks: {mine:?}"
        );
    }
    for tier in tiers {
        check(&db, &model, *tier, 0, 25 * MIN);
        check(&db, &model, *tier, 17 * MIN + 4_321, 24 * MIN + 17);
    }
    // Raw compaction catches up (3-minute, then 9-minute merges of the blocks the tiers merged
    // with others): the tiers hold those blocks' samples, nothing is dropped or rolled up again.
    let written = db.stats().rollup_blocks_written.load(Ordering::Relaxed);
    run(&db, &mut model, 25 * MIN, 52 * MIN);
    let stats = db.stats();
    assert_eq!(stats.rollup_coarse_blocks_dropped.load(Ordering::Relaxed), 0);
    // One rollup per raw block cut since (a block a minute, give or take the head's span).
    let cut = stats.rollup_blocks_written.load(Ordering::Relaxed) - written;
    assert!(cut <= 28 * tiers.len() as u64, "{cut} tier blocks written for 27 raw blocks");
    for tier in tiers {
        check(&db, &model, *tier, 0, 52 * MIN);
    }

    // Late samples into a raw block a merged tier block (of the window filling again, minutes
    // 45-52) holds with others: that tier block is dropped, its raw blocks rolled up again,
    // the answers still every sample's.
    let (_, target) = merged_over_raw(&db).into_iter().find(|(_, b)| b.min_time == 45 * MIN).unwrap();
    let late_from = target.min_time + 500;
    import_backfill(&db, &mut model, 0, (late_from..late_from + MIN).step_by(1000), 5.0);
    db.compact().unwrap();
    assert!(db.stats().rollup_coarse_blocks_dropped.load(Ordering::Relaxed) > 0, "the late data dropped it");
    for tier in tiers {
        check(&db, &model, *tier, 0, 52 * MIN);
        check(&db, &model, *tier, target.min_time + 17, target.max_time - 17);
    }
    db.close().unwrap();

    // Writers that may write 30 minutes late (carbon's window): nothing that recent merged.
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let db = Db::open(tmp.path(), in_order(30 * MIN)).unwrap();
    run(&db, &mut model, 0, 43 * MIN);
    assert_eq!(merged_over_raw(&db), Vec::new());
    for tier in tiers {
        check(&db, &model, *tier, 0, 43 * MIN);
    }
}

/// A raw block the head's samples reach into (a backfill of the newest minute) is not
/// settled: the head's next cut overlaps it and raw compaction merges the two, so its tier
/// blocks wait for that instead of being merged with others (a merged block would be dropped
/// and its raw blocks rolled up again when raw compaction merges it).
#[test]
fn tier_blocks_of_a_raw_block_the_head_reaches_into_wait_for_raw_compaction() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let tiers = &TIERS[..2];
    let db = Db::open(tmp.path(), in_order_opts(120 * MIN, tiers)).unwrap();
    // The filling window of minutes 18-27 holds raw blocks 18-21 and 21-22; the head 22-23.
    run(&db, &mut model, 0, 23 * MIN);
    assert_eq!(db.head().time_range().map(|(lo, _)| lo), Some(22 * MIN));
    import_backfill(&db, &mut model, 5, (22 * MIN + 30_000..23 * MIN).step_by(1000), 1.5);
    db.compact().unwrap();
    // Three tier blocks in the window, one of them over the head's minute: none merged.
    let in_window = |db: &Db| -> Vec<Vec<(i64, usize)>> {
        let tiers = db.status(1).unwrap().tiers;
        tiers
            .iter()
            .map(|t| {
                let mine = t.blocks.iter().filter(|b| b.min_time >= 18 * MIN && b.max_time <= 27 * MIN);
                mine.map(|b| (b.min_time, b.compaction.sources.len())).collect()
            })
            .collect()
    };
    for blocks in in_window(&db) {
        assert_eq!(blocks, [(18 * MIN, 3), (21 * MIN, 1), (22 * MIN, 1)]);
    }
    // The head's cut overlaps the backfill and raw compaction merges them (then the window):
    // the tiers follow without dropping anything, and answer every sample.
    run(&db, &mut model, 23 * MIN, 30 * MIN);
    assert_eq!(db.stats().rollup_coarse_blocks_dropped.load(Ordering::Relaxed), 0);
    for blocks in in_window(&db) {
        assert_eq!(blocks, [(18 * MIN, 10)], "the window as raw compaction merged it");
    }
    for tier in tiers {
        check(&db, &model, *tier, 0, 30 * MIN);
    }
}

/// A raw block shorter than the largest raw range (its window's other minutes had no data) is
/// settled but not final: a backfill into its window makes raw compaction merge it again. Its
/// tier blocks are therefore kept out of coarse blocks, so that a coarse block still holds
/// exactly the sources of the raw blocks it shares sources with after that merge (what
/// retention's roll-up and the coarse rule read a coarse block as).
#[test]
fn tier_blocks_of_a_raw_block_shorter_than_its_window_stay_out_of_coarse_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let mut model = Model::new();
    let tiers = &TIERS[1..2];
    let db = Db::open(tmp.path(), in_order_opts(120 * MIN, tiers)).unwrap();
    assert_eq!(db.inner.opts.compaction_ranges(), [MIN, 3 * MIN, 9 * MIN]);
    // Raw window 27-36 holds only minutes 27-30; the coarse window 27-54 the windows after.
    run(&db, &mut model, 0, 30 * MIN);
    run(&db, &mut model, 36 * MIN, 70 * MIN);
    let raw: Vec<(i64, i64)> = db.blocks().iter().map(|b| (b.meta().min_time, b.meta().max_time)).collect();
    assert!(raw.contains(&(27 * MIN, 30 * MIN)), "a short raw block: {raw:?}");
    let coarse = |db: &Db| -> Vec<BlockMeta> {
        let blocks = db.status(1).unwrap().tiers[0].blocks.clone();
        blocks.into_iter().filter(|b| b.max_time - b.min_time > 9 * MIN).collect()
    };
    assert!(!coarse(&db).is_empty(), "the coarse window's settled blocks merged");
    // The backfill: raw compaction merges it with minutes 27-30.
    import_backfill(&db, &mut model, 5, (31 * MIN..32 * MIN).step_by(1000), 2.5);
    run(&db, &mut model, 70 * MIN, 75 * MIN);
    let raw: Vec<(i64, i64)> = db.blocks().iter().map(|b| (b.meta().min_time, b.meta().max_time)).collect();
    assert!(raw.contains(&(27 * MIN, 32 * MIN)), "the backfill merged with minutes 27-30: {raw:?}");
    for c in coarse(&db) {
        let mine: BTreeSet<&String> = c.compaction.sources.iter().collect();
        let blocks = db.blocks();
        let theirs: BTreeSet<&String> = blocks
            .iter()
            .filter(|r| r.meta().compaction.sources.iter().any(|s| mine.contains(s)))
            .flat_map(|r| &r.meta().compaction.sources)
            .collect();
        assert_eq!(mine, theirs, "coarse block {}-{} min", c.min_time / MIN, c.max_time / MIN);
    }
    check(&db, &model, tiers[0], 0, 75 * MIN);
}

/// Over many windows, the steady state the filling-window merges reach: fewer tier blocks
/// over the newest raw windows than raw compaction leaves there (what a month's read of an
/// hourly tier pays per block). Scaled down: 1-minute raw blocks and ranges 1, 3, 9 and 27 min
/// (as 2 h blocks and 2, 6, 18, 54 h), a 30 s tier whose filling window is 27 min (54 of its
/// intervals, as 54 h for an hourly tier).
#[test]
fn filling_window_merges_keep_fewer_tier_blocks_than_raw_over_the_newest_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let tier = TIERS[1];
    let db = Db::open(tmp.path(), in_order_opts(0, &[tier])).unwrap();
    let (mut raw_blocks, mut tier_blocks, mut rounds) = (0, 0, 0);
    let mut t = 0;
    while t < 300 * MIN {
        let mut app = db.appender();
        app.append(&series(0), t, value(0, t)).unwrap();
        app.commit().unwrap();
        t += 10_000;
        if t % MIN == 0 {
            db.compact().unwrap();
            if t >= 120 * MIN {
                // The newest 50 min: 50 raw block ranges, as the newest 100 h of 2 h blocks.
                let newest = |b: &BlockMeta| b.max_time > t - 50 * MIN;
                raw_blocks += db.blocks().iter().filter(|b| newest(b.meta())).count();
                tier_blocks += db.status(1).unwrap().tiers[0].blocks.iter().filter(|b| newest(b)).count();
                rounds += 1;
            }
        }
    }
    let (raw, tiered) = (raw_blocks as f64 / rounds as f64, tier_blocks as f64 / rounds as f64);
    println!("blocks over the newest 50 min, mean of {rounds} rounds: raw {raw:.2}, tier {tiered:.2}");
    assert!(tiered < raw - 1.0, "raw {raw:.2}, tier {tiered:.2}");
}
