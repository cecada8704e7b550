//! `/render` over Graphite's rollup tiers: a path whose fetch reads a coarse archive of its
//! retention schema (whisper's rule: the finest archive reaching back to `from`) is answered
//! from the left-closed tier that fits that archive (`strata_graphite::render::tier_fit`)
//! instead of its raw samples, so a month or a year of a path costs its tier's intervals,
//! not every point. Tiers hold the head's and unrolled blocks' samples too
//! (`Db::rollup_visit`), so the answer does not depend on how far rollup has got.

use std::sync::Arc;

use strata_graphite::render::{tier_fit, tier_serves, TierFit, TierInterval, TierNeeds};
use strata_graphite::schema::{Policy, Schemas};
use strata_model::{Labels, Matcher};
use strata_tsdb::chunkenc::rollup::{Column, ColumnSet};
use strata_tsdb::querier::ReadLimits;
use strata_tsdb::rollup::{Bucket, Closed, RollupTier, SeriesFilter};
use strata_tsdb::Db;

use super::graphite_api::graphite_series_name;

/// What each tier keeps for `schemas`: a right-closed tier (PromQL's) every series; a
/// left-closed one the Graphite paths whose schema reads it (`render::tier_serves`), so that a
/// path kept a month at 1 minute and a year at 1 hour costs no 10-minute buckets another
/// schema's tier would hold.
pub fn rollup_filter(schemas: Arc<Schemas>) -> SeriesFilter {
    SeriesFilter::new(move |tier, labels| {
        if tier.closed == Closed::Right {
            return true;
        }
        let Some((name, _)) = graphite_series_name(labels) else { return false };
        tier.interval_ms % 1000 == 0 && tier_serves(&schemas.policy(&name), tier.interval_ms / 1000)
    })
}

/// The database's left-closed tiers whose intervals are whole seconds, finest first.
pub(super) fn graphite_tiers(db: &Db) -> Vec<RollupTier> {
    db.rollup_tiers().into_iter().filter(|t| t.closed == Closed::Left && t.interval_ms % 1000 == 0).collect()
}

/// Which of `tiers` answers a fetch of a path under `policy` over `[from, until]` at `now`:
/// one that still holds `from` and fits the archive read, the coarsest exact one, else the
/// finest approximate one (closest to whisper's cascade). `None`: the finest archive is read,
/// or no tier fits; raw samples answer.
pub(super) fn pick_tier(tiers: &[RollupTier], policy: &Policy, from: i64, until: i64, now: i64) -> Option<usize> {
    let mut exact = None;
    let mut approximate = None;
    for (i, t) in tiers.iter().enumerate() {
        let holds_from = t.retention_ms == 0 || now.saturating_sub(from).saturating_mul(1000) <= t.retention_ms;
        if !holds_from {
            continue;
        }
        match tier_fit(policy, t.interval_ms / 1000, from, until, now) {
            Some(TierFit::Exact) => exact = Some(i),
            Some(TierFit::Approximate) if approximate.is_none() => approximate = Some(i),
            _ => {}
        }
    }
    exact.or(approximate)
}

/// A tier's bucket as the interval `/render` reads: left-closed, so the bucket ending at `end`
/// is the interval starting one step before.
fn interval_of(b: &Bucket, step_s: i64) -> TierInterval {
    TierInterval { start: b.end / 1000 - step_s, count: b.count, sum: b.sum, min: b.min, max: b.max, last: b.last.v }
}

/// The tier columns that hold what `needs` asks for (the count and the bucket ends always).
fn columns(needs: TierNeeds) -> ColumnSet {
    let mut columns = vec![Column::Count];
    for (needed, column) in
        [(needs.sum, Column::Sum), (needs.min, Column::Min), (needs.max, Column::Max), (needs.last, Column::Last)]
    {
        if needed {
            columns.push(column);
        }
    }
    ColumnSet::of(&columns)
}

/// Hands `answer` the intervals of `tier` over `[mint, maxt]` (ms) of each series `matchers`
/// select (with data there), in label order, in one buffer reused from series to series; of
/// the stored aggregates only those `needs` names are read (the others are zero).
/// `false` when a matching series holds native histograms (tiers do not: read raw instead).
pub(super) fn read_tier(
    db: &Db,
    (tier, needs): (&RollupTier, TierNeeds),
    matchers: &[Matcher],
    (mint, maxt): (i64, i64),
    limits: &ReadLimits<'_>,
    answer: &mut dyn FnMut(&Labels, &[TierInterval]),
) -> Result<bool, strata_tsdb::Error> {
    let step_s = tier.interval_ms / 1000;
    let mut intervals = Vec::new();
    let histograms = db.rollup_visit(tier.meta(), matchers, mint, maxt, columns(needs), limits, &mut |s| {
        intervals.clear();
        intervals.extend(s.buckets.iter().map(|b| interval_of(b, step_s)));
        answer(&s.labels, &intervals);
        Ok(())
    })?;
    Ok(histograms == 0)
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
        assert_eq!(pick_tier(&tiers, &policy(), now - 3600, now, now), None);
        // A week: the 1-minute archive, from the 1-minute tier (exact).
        assert_eq!(pick_tier(&tiers, &policy(), now - 7 * DAY, now, now), Some(0));
        // Ninety days: the 10-minute archive; the 1-minute tier no longer holds `from`.
        assert_eq!(pick_tier(&tiers, &policy(), now - 90 * DAY, now, now), Some(1));
        // The hourly tier fits no archive of this schema (3600 s does not divide 600 s).
        assert_eq!(pick_tier(&tiers[2..], &policy(), now - 90 * DAY, now, now), None);
        // Without the 1-minute tier a week's 1-minute archive has no tier (600 s is coarser).
        assert_eq!(pick_tier(&tiers[1..], &policy(), now - 7 * DAY, now, now), None);
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

    #[test]
    fn a_left_closed_bucket_is_the_interval_it_ends() {
        let s = strata_model::Sample { t: 1_800_000_059_000, v: 2.0 };
        let b = Bucket { end: 1_800_000_060_000, ..Bucket::of(s, 60_000) };
        let i = interval_of(&b, 60);
        assert_eq!((i.start, i.count, i.last), (1_800_000_000, 1, 2.0));
    }
}
