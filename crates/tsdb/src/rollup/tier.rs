//! Rollup tiers as configured: an interval and how long its buckets are kept.

use std::fmt;

use strata_model::{format_duration_ms, parse_duration_ms, Labels};

use super::bucket::ArchiveRule;
use super::Closed;
use crate::block::RollupMeta;

/// Shortest rollup interval: finer than a scrape interval is no rollup.
pub const INTERVAL_MIN_MS: i64 = 1000;
/// At most this many tiers (each costs a pass per rolled-up block and a block list).
pub const TIERS_MAX: usize = 8;

/// One tier: buckets of `interval_ms`, closed on the side `closed` says (right for PromQL,
/// left for Graphite's intervals), deleted once older than `retention_ms` behind the newest
/// sample (0: kept forever).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollupTier {
    pub interval_ms: i64,
    pub retention_ms: i64,
    pub closed: Closed,
}

/// Which series a tier keeps when raw blocks are rolled up (every one without a filter): a
/// Graphite path is kept by the tiers its retention schema reads. Decided at rollup, so a
/// change applies to data rolled up from then on; blocks already written keep what they hold.
/// It may also give a rule for a series' archive values in a tier (`with_archive_rules`), which
/// rollup and reads of raw data not rolled up yet apply to whole buckets.
#[derive(Clone)]
pub struct SeriesFilter {
    keeps: std::sync::Arc<KeepsFn>,
    archive: Option<std::sync::Arc<ArchiveRuleFn>>,
}

type KeepsFn = dyn Fn(&RollupTier, &Labels) -> bool + Send + Sync;
type ArchiveRuleFn = dyn Fn(&RollupTier, &Labels) -> Option<ArchiveRule> + Send + Sync;

impl SeriesFilter {
    pub fn new(keeps: impl Fn(&RollupTier, &Labels) -> bool + Send + Sync + 'static) -> SeriesFilter {
        SeriesFilter { keeps: std::sync::Arc::new(keeps), archive: None }
    }

    /// The rule (if any) for the archive values of a series' buckets in a tier.
    pub fn with_archive_rules(
        mut self,
        rules: impl Fn(&RollupTier, &Labels) -> Option<ArchiveRule> + Send + Sync + 'static,
    ) -> SeriesFilter {
        self.archive = Some(std::sync::Arc::new(rules));
        self
    }

    pub fn keeps(&self, tier: &RollupTier, labels: &Labels) -> bool {
        (self.keeps)(tier, labels)
    }

    pub fn archive_rule(&self, tier: &RollupTier, labels: &Labels) -> Option<ArchiveRule> {
        self.archive.as_ref().and_then(|rules| rules(tier, labels))
    }
}

impl fmt::Debug for SeriesFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SeriesFilter")
    }
}

/// The suffix of a left-closed tier, in its name (`1m:30d:left`) and directory (`1m-left`).
const LEFT: &str = "left";

impl RollupTier {
    /// A right-closed tier, as PromQL reads.
    pub fn new(interval_ms: i64, retention_ms: i64) -> RollupTier {
        RollupTier { interval_ms, retention_ms, closed: Closed::Right }
    }

    /// A left-closed tier, as Graphite's `/render` reads.
    pub fn left(interval_ms: i64, retention_ms: i64) -> RollupTier {
        RollupTier { interval_ms, retention_ms, closed: Closed::Left }
    }

    /// What its blocks' meta says of the tier.
    pub fn meta(&self) -> RollupMeta {
        RollupMeta { interval_ms: self.interval_ms, closed: self.closed }
    }

    /// The tier's directory name under `rollups/`: its interval as a duration (`5m`, `1h`),
    /// `-left` after it for a left-closed tier.
    pub fn dir_name(&self) -> String {
        match self.closed {
            Closed::Right => format_duration_ms(self.interval_ms),
            Closed::Left => format!("{}-{LEFT}", format_duration_ms(self.interval_ms)),
        }
    }

    /// The tier a directory name names (kept forever), if it is one.
    pub fn from_dir_name(name: &str) -> Option<RollupTier> {
        let (interval, closed) = match name.strip_suffix(LEFT).and_then(|n| n.strip_suffix('-')) {
            Some(interval) => (interval, Closed::Left),
            None => (name, Closed::Right),
        };
        let interval_ms = parse_duration_ms(interval).ok().filter(|&ms| ms > 0)?;
        Some(RollupTier { interval_ms, retention_ms: 0, closed })
    }
}

impl fmt::Display for RollupTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keep = if self.retention_ms == 0 { "forever".into() } else { format_duration_ms(self.retention_ms) };
        write!(f, "{}:{keep}", format_duration_ms(self.interval_ms))?;
        if self.closed == Closed::Left {
            write!(f, ":{LEFT}")?;
        }
        Ok(())
    }
}

/// Parses tiers written as Graphite writes retentions, `interval:retention` separated by
/// commas (`5m:90d,1h:2y`; retention `0` or `forever` keeps the tier's buckets forever); an
/// empty string is no tier. `:left` after a tier makes it left-closed (`1m:30d:left`, what
/// Graphite's retention schemas read). Checked as whisper checks its archives, against the raw retention
/// `raw_retention_ms` (0 = forever): intervals increase from tier to tier and each divides the
/// next, and each tier is kept longer than the raw data and the finer tiers (forever only after
/// forever), so that the coarser the data, the further back it reaches. The error names the
/// offending tier.
pub fn parse_tiers(s: &str, raw_retention_ms: i64) -> Result<Vec<RollupTier>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(Vec::new());
    }
    let mut tiers: Vec<RollupTier> = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (spec, closed) = match part.strip_suffix(LEFT).and_then(|p| p.strip_suffix(':')) {
            Some(spec) => (spec, Closed::Left),
            None => (part, Closed::Right),
        };
        let (interval, retention) = spec
            .split_once(':')
            .ok_or_else(|| format!("rollup tier {part:?}: expected interval:retention[:left], e.g. 5m:90d"))?;
        let interval_ms = parse_duration_ms(interval.trim()).map_err(|e| format!("rollup tier {part:?}: {e}"))?;
        let retention_ms = match retention.trim() {
            "forever" => 0,
            r => parse_duration_ms(r).map_err(|e| format!("rollup tier {part:?}: {e}"))?,
        };
        tiers.push(RollupTier { interval_ms, retention_ms, closed });
    }
    check_tiers(&tiers, raw_retention_ms)?;
    Ok(tiers)
}

/// The rules `parse_tiers` states, for tiers built in code: right-closed and left-closed
/// tiers each form such a sequence.
pub fn check_tiers(tiers: &[RollupTier], raw_retention_ms: i64) -> Result<(), String> {
    if tiers.len() > TIERS_MAX {
        return Err(format!("{} rollup tiers configured; at most {TIERS_MAX}", tiers.len()));
    }
    for closed in [Closed::Right, Closed::Left] {
        let kind: Vec<RollupTier> = tiers.iter().filter(|t| t.closed == closed).copied().collect();
        check_sequence(&kind, raw_retention_ms)?;
    }
    Ok(())
}

fn check_sequence(tiers: &[RollupTier], raw_retention_ms: i64) -> Result<(), String> {
    // Kept forever sorts last.
    let span = |ms: i64| if ms == 0 { i64::MAX } else { ms };
    let mut finer_interval = 0;
    let mut finer_keep = span(raw_retention_ms);
    let mut finer_name = "raw data".to_string();
    for t in tiers {
        if t.interval_ms < INTERVAL_MIN_MS {
            return Err(format!(
                "rollup tier {t}: interval under the minimum of {}",
                format_duration_ms(INTERVAL_MIN_MS)
            ));
        }
        if t.retention_ms < 0 || (t.retention_ms > 0 && t.retention_ms < t.interval_ms) {
            return Err(format!("rollup tier {t}: retention shorter than its interval"));
        }
        if finer_interval > 0 && (t.interval_ms <= finer_interval || t.interval_ms % finer_interval != 0) {
            return Err(format!(
                "rollup tier {t}: its interval must be a multiple of the previous tier's ({}), larger",
                format_duration_ms(finer_interval)
            ));
        }
        // Longer than the finer data, as whisper's archives must be; forever after forever.
        let keep = span(t.retention_ms);
        if keep <= finer_keep && !(keep == i64::MAX && finer_keep == i64::MAX) {
            return Err(format!("rollup tier {t}: must be kept longer than {finer_name}"));
        }
        finer_interval = t.interval_ms;
        finer_keep = span(t.retention_ms);
        finer_name = format!("the {} tier", t.dir_name());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;

    #[test]
    fn graphite_style_tiers() {
        let tiers = parse_tiers("5m:90d, 1h:2y", 15 * DAY).unwrap();
        assert_eq!(tiers, vec![RollupTier::new(300_000, 90 * DAY), RollupTier::new(3_600_000, 730 * DAY)]);
        assert_eq!(tiers[0].dir_name(), "5m");
        assert_eq!(tiers[1].to_string(), "1h:2y");
        // Left-closed tiers (Graphite's) form their own sequence beside the right-closed ones.
        let tiers = parse_tiers("5m:90d,1m:30d:left,1h:2y,10m:1y:left", 15 * DAY).unwrap();
        assert_eq!(tiers[1], RollupTier::left(60_000, 30 * DAY));
        assert_eq!((tiers[1].dir_name(), tiers[1].to_string()), ("1m-left".into(), "1m:30d:left".into()));
        for t in &tiers {
            let back = RollupTier::from_dir_name(&t.dir_name()).unwrap();
            assert_eq!((back.interval_ms, back.closed, back.retention_ms), (t.interval_ms, t.closed, 0));
        }
        assert_eq!(RollupTier::from_dir_name("tmp"), None);
        assert!(parse_tiers("1h:90d:left,5m:2y:left", 15 * DAY).unwrap_err().contains("multiple of the previous"));
        assert_eq!(parse_tiers("", 15 * DAY).unwrap(), vec![]);
        assert_eq!(parse_tiers("1h:forever", 15 * DAY).unwrap()[0].retention_ms, 0);
    }

    #[test]
    fn wrong_tiers_are_named() {
        for (spec, want) in [
            ("5m", "expected interval:retention"),
            ("5x:90d", "invalid duration"),
            ("500ms:90d", "under the minimum"),
            ("5m:1m", "shorter than its interval"),
            ("1h:90d,5m:2y", "multiple of the previous"),
            ("5m:90d,7m:2y", "multiple of the previous"),
            ("5m:10d", "kept longer than raw data"),
            ("5m:90d,1h:30d", "kept longer than the 5m tier"),
            ("5m:forever,1h:2y", "kept longer than the 5m tier"),
        ] {
            let err = parse_tiers(spec, 15 * DAY).unwrap_err();
            assert!(err.contains(want), "{spec}: {err}");
        }
        assert!(parse_tiers("5m:90d", 0).unwrap_err().contains("kept longer than raw data"));
        assert_eq!(parse_tiers("5m:forever,1h:forever", 0).unwrap().len(), 2);
    }
}
