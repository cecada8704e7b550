//! `/render` over Graphite's rollup tiers: a path whose fetch reads a coarse archive of its
//! retention schema (whisper's rule: the finest archive reaching back to `from`) is answered
//! from the left-closed tier that fits that archive (`strata_graphite::render::tier_fit`)
//! instead of its raw samples, so a month or a year of a path costs its tier's intervals,
//! not every point. Tiers hold the head's and unrolled blocks' samples too
//! (`Db::rollup_map`), so the answer does not depend on how far rollup has got.

use std::collections::HashMap;
use std::sync::Arc;

use strata_graphite::render::{
    archive_value, fetch_from_tier, kept_archive, tier_fit, tier_serves, ArchiveNotKept, Fetched, IntervalArchive,
    TierFit, TierInterval, TierNeeds,
};
use strata_graphite::schema::{Policy, Schemas};
use strata_model::{Labels, Matcher};
use strata_tsdb::chunkenc::rollup::{Column, ColumnSet};
use strata_tsdb::db::RollupSeries;
use strata_tsdb::querier::ReadLimits;
use strata_tsdb::rollup::{ArchiveRule, ArchiveValue, Bucket, Closed, RollupTier, SeriesFilter};
use strata_tsdb::Db;

use super::graphite_api::graphite_series_name;

/// What each tier keeps for `schemas`: a right-closed tier (PromQL's) every series; a
/// left-closed one the Graphite paths whose schema reads it (`render::tier_serves`), so that a
/// path kept a month at 1 minute and a year at 1 hour costs no 10-minute buckets another
/// schema's tier would hold. A left-closed tier whose interval is a coarse archive's step also
/// keeps that archive's values (whisper's cascade of averages of averages, `kept_archive`), so
/// the archive is read from it exactly.
pub fn rollup_filter(schemas: Arc<Schemas>) -> SeriesFilter {
    let keeps_schemas = schemas.clone();
    SeriesFilter::new(move |tier, labels| {
        if tier.closed == Closed::Right {
            return true;
        }
        let Some((name, _)) = graphite_series_name(labels) else { return false };
        tier.interval_ms % 1000 == 0 && tier_serves(&keeps_schemas.policy(&name), tier.interval_ms / 1000)
    })
    .with_archive_rules(move |tier, labels| archive_rule(&schemas, tier, labels))
}

/// The rule for a path's archive values in a left-closed tier, where its schema has an archive
/// of the tier's step coarser than the second.
fn archive_rule(schemas: &Schemas, tier: &RollupTier, labels: &Labels) -> Option<ArchiveRule> {
    if tier.closed == Closed::Right || tier.interval_ms % 1000 != 0 {
        return None;
    }
    let (name, _) = graphite_series_name(labels)?;
    let policy = schemas.policy(&name);
    let step_s = tier.interval_ms / 1000;
    let archive = kept_archive(&policy, step_s)?;
    Some(Arc::new(move |end_ms: i64, samples: &[strata_model::Sample]| {
        archive_value(&policy, archive, end_ms / 1000 - step_s, samples.iter().map(|s| (s.t, s.v)))
    }))
}

/// The database's left-closed tiers whose intervals are whole seconds, finest first.
pub(super) fn graphite_tiers(db: &Db) -> Vec<RollupTier> {
    db.rollup_tiers().into_iter().filter(|t| t.closed == Closed::Left && t.interval_ms % 1000 == 0).collect()
}

/// Which of `tiers` answer a fetch of a path under `policy` over `[from, until]` at `now`, in
/// the order to try them: of those that still hold `from` and fit the archive read, the
/// coarsest that keeps archive values (exact where it has them), then the coarsest exact one,
/// else the finest approximate one (closest to whisper's cascade). Every one but the last is
/// read strictly (`fetch_from_tier`): a path whose intervals lack archive values there is read
/// from the next. Empty: the finest archive is read, or no tier fits; raw samples answer.
pub(super) fn pick_tiers(tiers: &[RollupTier], policy: &Policy, from: i64, until: i64, now: i64) -> Vec<usize> {
    let (mut archive, mut exact, mut approximate) = (None, None, None);
    for (i, t) in tiers.iter().enumerate() {
        let holds_from = t.retention_ms == 0 || now.saturating_sub(from).saturating_mul(1000) <= t.retention_ms;
        if !holds_from {
            continue;
        }
        match tier_fit(policy, t.interval_ms / 1000, from, until, now) {
            Some(TierFit::Archive) => archive = Some(i),
            Some(TierFit::Exact) => exact = Some(i),
            Some(TierFit::Approximate) if approximate.is_none() => approximate = Some(i),
            _ => {}
        }
    }
    archive.into_iter().chain(exact.or(approximate)).collect()
}

/// A tier's bucket as the interval `/render` reads: left-closed, so the bucket ending at `end`
/// is the interval starting one step before.
fn interval_of(b: &Bucket, step_s: i64) -> TierInterval {
    let archive = match b.archive {
        ArchiveValue::NotKept => IntervalArchive::NotKept,
        ArchiveValue::Unknown => IntervalArchive::Unknown,
        ArchiveValue::Value(v) => IntervalArchive::Value(v),
    };
    TierInterval {
        start: b.end / 1000 - step_s,
        count: b.count,
        sum: b.sum,
        min: b.min,
        max: b.max,
        last: b.last.v,
        archive,
    }
}

/// The tier columns that hold what `needs` asks for (the count and the bucket ends always).
fn columns(needs: TierNeeds) -> ColumnSet {
    let mut columns = vec![Column::Count];
    for (needed, column) in [
        (needs.sum, Column::Sum),
        (needs.min, Column::Min),
        (needs.max, Column::Max),
        (needs.last, Column::Last),
        (needs.archive, Column::Archive),
    ] {
        if needed {
            columns.push(column);
        }
    }
    ColumnSet::of(&columns)
}

/// What `answer` makes of the intervals of `tier` over `[mint, maxt]` (ms) of each series
/// `matchers` select (with data there), handed to `sink` in label order; `answer` runs on the
/// tier's decoding workers, in parallel. Of the stored aggregates only those `needs` names are
/// read (the others are zero). `false` when a matching series holds native histograms (tiers
/// do not: read raw instead).
fn read_tier<T: Send>(
    db: &Db,
    (tier, needs): (&RollupTier, TierNeeds),
    matchers: &[Matcher],
    (mint, maxt): (i64, i64),
    limits: &ReadLimits<'_>,
    answer: &(dyn Fn(&Labels, &[TierInterval]) -> Option<T> + Sync),
    sink: &mut dyn FnMut(T),
) -> Result<bool, strata_tsdb::Error> {
    let step_s = tier.interval_ms / 1000;
    let map = |s: &RollupSeries| {
        let intervals: Vec<TierInterval> = s.buckets.iter().map(|b| interval_of(&b, step_s)).collect();
        answer(&s.labels, &intervals)
    };
    let histograms = db.rollup_map(tier.meta(), matchers, mint, maxt, columns(needs), limits, &map, &mut |t| {
        t.map(&mut *sink);
        Ok(())
    })?;
    Ok(histograms == 0)
}

/// `answer_from_tiers`' answers, and how many times a series moved on from a tier lacking
/// archive values.
pub(super) type TierAnswers = (Vec<Option<Option<Fetched>>>, u64);

/// Whisper's answers for `series` (each one's labels, and its path's schema where it is a
/// Graphite path) over `[from, until]` at `now` from the tiers that fit them (`pick_tiers`),
/// read over `[mint, maxt]` (ms) for the series `matchers` select. Per series: `None` where
/// raw samples must answer (no tier fits, or native histograms met), else whisper's answer
/// (itself `None` outside the retention); a series a tier has no data for answers as from no
/// points.
pub(super) fn answer_from_tiers(
    db: &Db,
    tiers: &[RollupTier],
    series: &[(&Labels, Option<&Policy>)],
    matchers: &[Matcher],
    (mint, maxt): (i64, i64),
    (from, until, now): (i64, i64, i64),
    limits: &ReadLimits<'_>,
) -> Result<TierAnswers, strata_tsdb::Error> {
    let n = series.len();
    let mut moved_on = 0;
    let mut answers: Vec<Option<Option<Fetched>>> = vec![None; n];
    // The tiers to try for each series, in order, and which is next.
    let picks: Vec<Vec<usize>> =
        series.iter().map(|(_, p)| p.map_or_else(Vec::new, |p| pick_tiers(tiers, p, from, until, now))).collect();
    if picks.iter().all(Vec::is_empty) {
        return Ok((answers, moved_on));
    }
    let mut next_pick = vec![0usize; n];
    // Answered by a tier, or left to raw samples (native histograms met).
    let mut settled = vec![false; n];
    let index: HashMap<&Labels, usize> = series.iter().enumerate().map(|(i, s)| (s.0, i)).collect();
    let policy = |i: usize| series[i].1.expect("series with picks have a schema");
    // Strict where another tier is left to try.
    let strict = |i: usize, next_pick: &[usize]| next_pick[i] + 1 < picks[i].len();
    // Coarsest first: a series a tier cannot answer exactly moves on to the next of its picks
    // (finer, read later in the pass; another pass where it is not).
    let mut passes = 0;
    while (0..n).any(|i| !settled[i] && next_pick[i] < picks[i].len()) {
        passes += 1;
        assert!(passes <= tiers.len() + 1, "each pass settles a series or moves it to its next pick");
        for (t, tier) in tiers.iter().enumerate().rev() {
            let due = |i: usize, next_pick: &[usize]| !settled[i] && picks[i].get(next_pick[i]) == Some(&t);
            let picked: Vec<usize> = (0..n).filter(|&i| due(i, &next_pick)).collect();
            if picked.is_empty() {
                continue;
            }
            let step_s = tier.interval_ms / 1000;
            let needs = picked.iter().fold(TierNeeds::default(), |acc, &i| {
                acc.union(TierNeeds::of(policy(i), step_s, strict(i, &next_pick)))
            });
            let mut not_kept = vec![false; n];
            let answer = |labels: &Labels, intervals: &[TierInterval]| {
                let &i = index.get(labels).filter(|&&i| due(i, &next_pick))?;
                Some((i, fetch_from_tier(intervals, step_s, policy(i), (from, until, now), strict(i, &next_pick))))
            };
            let mut keep = |(i, fetched)| match fetched {
                Ok(fetched) => answers[i] = Some(fetched),
                Err(ArchiveNotKept) => not_kept[i] = true,
            };
            let answered = read_tier(db, (tier, needs), matchers, (mint, maxt), limits, &answer, &mut keep)?;
            for &i in &picked {
                if not_kept[i] {
                    next_pick[i] += 1;
                    moved_on += 1;
                    continue;
                }
                settled[i] = true;
                answers[i] = match answers[i].take() {
                    // Series with native histograms make the tier answer nothing: read raw.
                    _ if !answered => None,
                    None => {
                        let nothing = fetch_from_tier(&[], step_s, policy(i), (from, until, now), false);
                        Some(nothing.expect("no interval to lack an archive value"))
                    }
                    done => done,
                };
            }
        }
    }
    Ok((answers, moved_on))
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_graphite::schema::{Aggregation, Archive};

    const DAY: i64 = 86_400;

    fn policy() -> Policy {
        let archives = vec![
            Archive { step_s: 10, points: DAY / 10 },
            Archive { step_s: 60, points: 30 * DAY / 60 },
            Archive { step_s: 600, points: 365 * DAY / 600 },
        ];
        Policy { archives, aggregation: Aggregation::Average, x_files_factor: 0.5 }
    }

    #[test]
    fn the_tier_that_holds_from_and_fits_the_archive_read_is_picked() {
        let tiers = [
            RollupTier::left(60_000, 30 * DAY * 1000),
            RollupTier::left(600_000, 365 * DAY * 1000),
            RollupTier::left(3_600_000, 0),
        ];
        let now = 1_800_000_000;
        // The last hour: the finest archive, read raw.
        assert!(pick_tiers(&tiers, &policy(), now - 3600, now, now).is_empty());
        // A week: the 1-minute archive, from the 1-minute tier (exact).
        assert_eq!(pick_tiers(&tiers, &policy(), now - 7 * DAY, now, now), [0]);
        // Ninety days: the 10-minute archive, from the 10-minute tier's archive values; the
        // 1-minute tier no longer holds `from`.
        assert_eq!(pick_tiers(&tiers, &policy(), now - 90 * DAY, now, now), [1]);
        // The hourly tier fits no archive of this schema (3600 s does not divide 600 s).
        assert!(pick_tiers(&tiers[2..], &policy(), now - 90 * DAY, now, now).is_empty());
        // Without the 1-minute tier a week's 1-minute archive has no tier (600 s is coarser).
        assert!(pick_tiers(&tiers[1..], &policy(), now - 7 * DAY, now, now).is_empty());
        // A 1-minute tier kept as long: the archive values first, the exact tier where a path's
        // intervals lack them.
        let kept = [RollupTier::left(60_000, 0), tiers[1]];
        assert_eq!(pick_tiers(&kept, &policy(), now - 90 * DAY, now, now), [1, 0]);
    }

    #[test]
    fn a_left_closed_tier_keeps_the_paths_whose_schema_it_serves() {
        let schemas = Schemas::parse(
            "[fine]\npattern = ^fine\\.\nretentions = 10s:1d,1m:30d,10m:1y\n\
             [hourly]\npattern = ^hourly\\.\nretentions = 60s:1d,1h:1y\n\
             [flat]\npattern = .*\nretentions = 60s:15d\n",
            None,
        )
        .unwrap();
        let filter = rollup_filter(Arc::new(schemas));
        let path = |p: &str| Labels::from_pairs([("__name__", p.to_string())]);
        let (one_minute, ten_minutes) = (RollupTier::left(60_000, 0), RollupTier::left(600_000, 0));
        assert!(filter.keeps(&one_minute, &path("fine.a")) && filter.keeps(&ten_minutes, &path("fine.a")));
        // Ten-minute buckets add up to hours: the hourly archive may read them.
        assert!(filter.keeps(&ten_minutes, &path("hourly.a")));
        // No coarse archive: no tier; nor a tier coarser than every archive.
        assert!(!filter.keeps(&one_minute, &path("flat.a")));
        assert!(!filter.keeps(&RollupTier::left(86_400_000, 0), &path("fine.a")));
        // A tagged path is matched as Graphite names it; a series without a name is no path.
        let tagged = Labels::from_pairs([("__name__", "fine.b".to_string()), ("dc", "x".to_string())]);
        assert!(filter.keeps(&one_minute, &tagged));
        assert!(!filter.keeps(&one_minute, &Labels::from_pairs([("job", "x".to_string())])));
        // PromQL's tiers keep everything.
        assert!(filter.keeps(&RollupTier::new(60_000, 0), &path("flat.a")));
    }

    /// Ten days of three paths in a database with the schema's tiers, rolled up as the server
    /// does (blocks, then the head's last hours): a render of them over the hourly archive is
    /// whisper's, bit for bit, from the hourly tier alone (its archive values: the path with
    /// gaps averages 10-minute averages), and with the hourly tier's archive values unread a
    /// strict read moves on to the 10-minute tier and gives the same.
    #[test]
    fn the_hourly_archive_is_read_from_the_hourly_tier_exactly() {
        use strata_graphite::render::fetch;
        use strata_tsdb::db::DbOptions;

        let schemas =
            Arc::new(Schemas::parse("[default]\npattern = .*\nretentions = 60s:1d,10m:7d,1h:1y\n", None).unwrap());
        let tiers = [RollupTier::left(600_000, 0), RollupTier::left(3_600_000, 0)];
        let tmp = tempfile::tempdir().unwrap();
        let opts = DbOptions {
            retention_ms: 0,
            compact_interval: None,
            rollups: tiers.to_vec(),
            rollup_filter: Some(rollup_filter(schemas.clone())),
            ..Default::default()
        };
        let db = Db::open(tmp.path(), opts).unwrap();
        let names = ["a.load", "b.load", "c.load"];
        let start = 1_800_000_000; // a whole hour
        let end = start + 10 * DAY;
        let mut samples: Vec<Vec<(i64, f64)>> = vec![Vec::new(); names.len()];
        for hour in 0..(end - start) / 3600 {
            let mut app = db.appender();
            for minute in 0..60 {
                let k = hour * 60 + minute;
                for (p, name) in names.iter().enumerate() {
                    // `c` misses every third minute and now and then most of a 10-minute span.
                    if p == 2 && (k % 3 == 0 || (k % 97 < 7 && minute % 10 > 2)) {
                        continue;
                    }
                    let t = (start + k * 60 + (k * 7 + p as i64) % 59) * 1000;
                    let v = ((k * 37 + p as i64 * 11) % 1000) as f64 / 8.0 - 20.0;
                    app.append(&Labels::from_pairs([("__name__", name.to_string())]), t, v).unwrap();
                    samples[p].push((t, v));
                }
            }
            app.commit().unwrap();
            if hour % 6 == 5 {
                db.compact().unwrap();
            }
        }
        assert!(db.head().time_range().is_some(), "the last hours are still in the head");
        let matcher = [Matcher::new(strata_model::MatchOp::RegexMatch, "__name__", ".*\\.load").unwrap()];
        let labels: Vec<Labels> = names.iter().map(|n| Labels::from_pairs([("__name__", n.to_string())])).collect();
        let policy = schemas.policy("a.load");
        let candidates: Vec<(&Labels, Option<&Policy>)> = labels.iter().map(|l| (l, Some(&policy))).collect();
        let (now, from) = (end, end - 9 * DAY);
        let read = |tiers: &[RollupTier]| {
            let limits = ReadLimits::default();
            let range = (from * 1000, now * 1000);
            answer_from_tiers(&db, tiers, &candidates, &matcher, range, (from, now, now), &limits).unwrap()
        };
        let (hourly_alone, moved_on) = read(&tiers[1..]);
        assert_eq!(moved_on, 0);
        let (both, moved_on) = read(&tiers);
        assert_eq!(moved_on, 0, "every interval has its archive value");
        for (p, samples) in samples.iter().enumerate() {
            let want = fetch(samples, &policy, from, now, now).unwrap();
            assert_eq!(want.2, 3600, "the hourly archive is read");
            let bits = |f: &Fetched| f.3.iter().map(|v| v.map(f64::to_bits)).collect::<Vec<_>>();
            let got = hourly_alone[p].clone().expect("a tier answers").expect("within the retention");
            assert_eq!((got.0, got.1, got.2), (want.0, want.1, want.2));
            assert_eq!(bits(&got), bits(&want), "{}", names[p]);
            let got = both[p].clone().unwrap().unwrap();
            assert_eq!(bits(&got), bits(&want), "{}", names[p]);
        }
        // The path with gaps is where the archive values matter: from the hourly tier's sums and
        // counts its hourly averages differ.
        let c = &samples[2];
        let approximate: Vec<TierInterval> = db
            .rollup_select(
                tiers[1].meta(),
                &matcher[..],
                from * 1000,
                now * 1000,
                ColumnSet::ALL,
                &ReadLimits::default(),
            )
            .unwrap()
            .series[2]
            .buckets
            .iter()
            .map(|b| TierInterval { archive: IntervalArchive::NotKept, ..interval_of(&b, 3600) })
            .collect();
        let lenient = fetch_from_tier(&approximate, 3600, &policy, (from, now, now), false).unwrap().unwrap();
        assert_ne!(lenient.3, fetch(c, &policy, from, now, now).unwrap().3);
        assert_eq!(fetch_from_tier(&approximate, 3600, &policy, (from, now, now), true), Err(ArchiveNotKept));
    }

    #[test]
    fn a_left_closed_bucket_is_the_interval_it_ends() {
        let s = strata_model::Sample { t: 1_800_000_059_000, v: 2.0 };
        let b = Bucket { end: 1_800_000_060_000, ..Bucket::of(s, 60_000) };
        let i = interval_of(&b, 60);
        assert_eq!((i.start, i.count, i.last), (1_800_000_000, 1, 2.0));
    }
}
