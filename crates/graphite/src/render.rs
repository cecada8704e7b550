//! `/render` without functions: the series a whisper file would give for the same points, and
//! graphite-web's output formats.
//!
//! Whisper keeps, per archive, one value per `step`-aligned interval: the finest archive takes
//! the last point written in the interval; each coarser archive aggregates the finer one's
//! values in its interval (the path's `aggregationMethod`) when at least `xFilesFactor` of them
//! are known. A fetch clamps `from`/`until` to `[now - max retention, now]`, picks the finest
//! archive whose retention reaches back to `from`, and answers the intervals from the first
//! after `from` to the first after `until` (whisper's `fromInterval`/`untilInterval`), `None`
//! where nothing is known. `fetch` computes exactly that from the raw samples.

use std::fmt::Write;

use crate::functions::series::{consolidate, Consolidation};
use crate::schema::{Aggregation, Policy};

/// A series as graphite-web's `TimeSeries`: values at `start`, `start + step`, … before `end`.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// Graphite's tags: `name` and the path's tags.
    pub tags: Vec<(String, String)>,
    pub start: i64,
    pub end: i64,
    pub step: i64,
    pub values: Vec<Option<f64>>,
    /// The target that selected the series (a glob, `seriesByTag(...)`): graphite-web groups a
    /// cluster server's series by it.
    pub path_expression: String,
    /// How many of `values` make one point (1 unless a function or `maxDataPoints` set it),
    /// how they fold, and the share of them that must be present (graphite-web's
    /// `valuesPerPoint`, `consolidationFunc`, `xFilesFactor`).
    pub values_per_point: usize,
    pub consolidation: Consolidation,
    pub x_files_factor: f64,
}

/// A fetch's answer: start, end, step and one value per step (`None`: unknown), as whisper's.
pub type Fetched = (i64, i64, i64, Vec<Option<f64>>);

/// What whisper answers for a fetch: the archive it reads and the intervals it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    /// Index of the archive read: the finest whose retention reaches back to `from`.
    archive: usize,
    step: i64,
    /// The first interval answered and the end of the last (whisper's `fromInterval`,
    /// `untilInterval`).
    from_interval: i64,
    until_interval: i64,
}

/// Whisper's fetch rules: `from`/`until` clamped to `[now - max retention, now]`, the finest
/// archive reaching back to `from`. `None` when the range is entirely outside the retention or
/// in the future.
fn plan(policy: &Policy, from: i64, until: i64, now: i64) -> Option<Plan> {
    assert!(!policy.archives.is_empty(), "a policy has an archive");
    let oldest = now - policy.max_retention_s();
    if from > now || until < oldest || from > until {
        return None;
    }
    let from = from.max(oldest);
    let until = until.min(now);
    let diff = now - from;
    let archive = policy.archives.iter().position(|a| a.retention_s() >= diff).unwrap_or(policy.archives.len() - 1);
    let step = policy.archives[archive].step_s;
    let from_interval = from - from.rem_euclid(step) + step;
    let mut until_interval = until - until.rem_euclid(step) + step;
    if from_interval == until_interval {
        until_interval += step;
    }
    Some(Plan { archive, step, from_interval, until_interval })
}

/// The `xFilesFactor` as whisper compares it: its header stores a 32-bit float, so 0.3 is
/// 0.30000001192…, and 3 known of 10 (0.29999999999999998) falls short of it.
fn whisper_xff(policy: &Policy) -> f64 {
    policy.x_files_factor as f32 as f64
}

/// Whisper's propagation: archive `to`'s values from archive `from`'s (sparse `(interval,
/// value)` in time order), each coarser interval aggregated from the finer values in it when at
/// least `xFilesFactor` of its slots are known.
fn cascade(policy: &Policy, mut level: Vec<(i64, f64)>, from: usize, to: usize) -> Vec<(i64, f64)> {
    let xff = whisper_xff(policy);
    for j in from + 1..=to {
        let (fine, coarse) = (policy.archives[j - 1].step_s, policy.archives[j].step_s);
        let slots = (coarse / fine) as usize;
        let mut next = Vec::with_capacity(level.len() / slots.max(1) + 1);
        let mut group: Vec<f64> = Vec::with_capacity(slots);
        let mut i = 0;
        while i < level.len() {
            let interval = level[i].0 - level[i].0.rem_euclid(coarse);
            group.clear();
            group.extend(level[i..].iter().take_while(|x| x.0 - x.0.rem_euclid(coarse) == interval).map(|x| x.1));
            i += group.len();
            if group.len() as f64 / slots as f64 >= xff {
                next.push((interval, policy.aggregation.apply(&group, slots)));
            }
        }
        level = next;
    }
    level
}

/// The plan's intervals laid out densely, `None` where nothing is known.
fn lay_out(plan: &Plan, level: Vec<(i64, f64)>) -> Fetched {
    let Plan { step, from_interval, until_interval, .. } = *plan;
    let n = ((until_interval - from_interval) / step) as usize;
    let mut values = vec![None; n];
    for (interval, v) in level {
        if interval >= from_interval && interval < until_interval {
            values[((interval - from_interval) / step) as usize] = Some(v);
        }
    }
    (from_interval, until_interval, step, values)
}

/// Whisper's answer for `samples` (`(ms, value)`, in time order) stored under `policy`,
/// fetched over `[from, until]` at `now` (epoch seconds). `None` when the range is entirely
/// outside the retention or in the future, as whisper answers.
pub fn fetch(samples: &[(i64, f64)], policy: &Policy, from: i64, until: i64, now: i64) -> Option<Fetched> {
    let plan = plan(policy, from, until, now)?;
    // The finest archive over the fetched range (aligned to the chosen step, which is a
    // multiple of every finer one), sparse: (interval, value).
    let (lo_ms, hi_ms) = (plan.from_interval.saturating_mul(1000), plan.until_interval.saturating_mul(1000));
    let first = samples.partition_point(|s| s.0 < lo_ms);
    let level = finest_level(policy, samples[first..].iter().take_while(|s| s.0 < hi_ms).copied());
    let level = cascade(policy, level, 0, plan.archive);
    Some(lay_out(&plan, level))
}

/// The finest archive's values for `samples` (`(ms, value)`, in time order), sparse: each
/// interval's last point.
fn finest_level(policy: &Policy, samples: impl Iterator<Item = (i64, f64)>) -> Vec<(i64, f64)> {
    let step0 = policy.archives[0].step_s;
    let mut level: Vec<(i64, f64)> = Vec::new();
    for (t_ms, v) in samples {
        let t = t_ms.div_euclid(1000);
        let interval = t - t.rem_euclid(step0);
        match level.last_mut() {
            Some(last) if last.0 == interval => last.1 = v,
            _ => level.push((interval, v)),
        }
    }
    level
}

/// The archive of `policy` whose value a left-closed tier of `tier_step` seconds keeps in its
/// buckets (`archive_value`): one coarser than the second, whose step is the tier's. The
/// tier's other aggregates give the finest two archives' values as they are; coarser ones
/// are whisper's averages of averages (or sums of sums, …), which only the finer archive's
/// values give exactly.
pub fn kept_archive(policy: &Policy, tier_step: i64) -> Option<usize> {
    policy.archives.iter().position(|a| a.step_s == tier_step).filter(|&k| k >= 2)
}

/// Whisper's value of archive `archive` for the interval starting at `start` (epoch seconds)
/// from the points stamped in it (`(ms, value)`, in time order, none outside): the cascade
/// from the finest archive up; `None` where the archive has no value (too few known).
pub fn archive_value(
    policy: &Policy,
    archive: usize,
    start: i64,
    samples: impl Iterator<Item = (i64, f64)>,
) -> Option<f64> {
    let level = cascade(policy, finest_level(policy, samples), 0, archive);
    debug_assert!(level.len() <= 1 && level.iter().all(|l| l.0 == start), "one interval's points");
    level.first().map(|l| l.1)
}

/// One interval of a left-closed rollup tier as `/render` reads it: the aggregates of a
/// series' points stamped in `[start, start + step)` (epoch seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierInterval {
    pub start: i64,
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
    /// Whisper's value for the interval where the tier keeps it (`archive_value`).
    pub archive: IntervalArchive,
}

/// A tier interval's archive value, as the tier stored it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum IntervalArchive {
    /// Not kept (another schema, data rolled up before archive values were kept, or an interval
    /// whose points came from several places).
    #[default]
    NotKept,
    /// Kept: the archive has no value for the interval.
    Unknown,
    Value(f64),
}

impl TierInterval {
    /// Adds the next interval's aggregates (all its points later than this one's).
    fn append(&mut self, next: &TierInterval) {
        self.archive = IntervalArchive::NotKept;
        self.count += next.count;
        self.sum += next.sum;
        self.min = self.min.min(next.min);
        self.max = self.max.max(next.max);
        self.last = next.last;
    }

    /// The archive value whisper's `method` gives for these points, read as `slots` slots of
    /// the finest archive (one point in each known slot).
    fn value(&self, method: Aggregation, slots: usize) -> f64 {
        match method {
            Aggregation::Average => self.sum / self.count as f64,
            Aggregation::Sum => self.sum,
            Aggregation::Min => self.min,
            Aggregation::Max => self.max,
            Aggregation::Last => self.last,
            Aggregation::AvgZero => self.sum / slots as f64,
            // The largest magnitude is the min's or the max's.
            Aggregation::AbsMax => {
                if self.min.abs() > self.max.abs() {
                    self.min
                } else {
                    self.max
                }
            }
            // Exact when the points share a sign; across zero the smallest magnitude may be
            // any point's, and the smaller of the ends' is an upper bound.
            Aggregation::AbsMin => {
                if self.min.abs() < self.max.abs() {
                    self.min
                } else {
                    self.max
                }
            }
        }
    }
}

/// How well a tier of `tier_step` seconds answers for a path under `policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TierFit {
    /// Its intervals divide the finest archive's, or are at most the second archive's: whisper's
    /// values follow exactly (the second archive's when each interval of the finest holds at
    /// most one point, as carbon senders send).
    Exact,
    /// The tier's interval is a coarser archive's step (`kept_archive`): whisper's values for
    /// that archive are kept in its buckets, and the read archive cascades from them exactly.
    /// Intervals rolled up without them are answered as `Approximate` ones.
    Archive,
    /// Coarser than the second archive: the read archive's value is aggregated over all its
    /// points at once instead of archive by archive, which differs only for `average`
    /// (or with an `xFilesFactor` above 0) where finer intervals are partly known.
    Approximate,
}

/// A tier read that needs each interval's archive value (`fetch_from_tier`, strict) met one the
/// tier does not keep: read a finer tier instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveNotKept;

/// The first archive a tier of `tier_step` seconds is read as (the finest archive at least as
/// coarse), if the tier's intervals divide it.
fn tier_archive(policy: &Policy, tier_step: i64) -> Option<usize> {
    let k = policy.archives.iter().position(|a| tier_step <= a.step_s)?;
    (tier_step > 0 && policy.archives[k].step_s % tier_step == 0).then_some(k)
}

/// Which of a tier interval's aggregates a read needs besides its count (the others may be left
/// zero): what `policy`'s aggregation reads, or the last point where the tier is read as the
/// finest archive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierNeeds {
    pub sum: bool,
    pub min: bool,
    pub max: bool,
    pub last: bool,
    /// The archive values (`TierInterval::archive`).
    pub archive: bool,
}

impl TierNeeds {
    /// What reading `policy`'s archives from a tier of `tier_step` seconds needs; `strict`: a
    /// tier that keeps archive values is read for them alone (`fetch_from_tier`'s `strict`).
    pub fn of(policy: &Policy, tier_step: i64, strict: bool) -> TierNeeds {
        let mut n = TierNeeds::default();
        if tier_archive(policy, tier_step) == Some(0) {
            n.last = true;
            return n;
        }
        if kept_archive(policy, tier_step).is_some() {
            n.archive = true;
            if strict {
                return n;
            }
        }
        match policy.aggregation {
            Aggregation::Average | Aggregation::Sum | Aggregation::AvgZero => n.sum = true,
            Aggregation::Min => n.min = true,
            Aggregation::Max => n.max = true,
            Aggregation::Last => n.last = true,
            Aggregation::AbsMax | Aggregation::AbsMin => (n.min, n.max) = (true, true),
        }
        n
    }

    /// What either read needs.
    pub fn union(self, other: TierNeeds) -> TierNeeds {
        TierNeeds {
            sum: self.sum || other.sum,
            min: self.min || other.min,
            max: self.max || other.max,
            last: self.last || other.last,
            archive: self.archive || other.archive,
        }
    }
}

/// Whether a tier of `tier_step` seconds can answer some coarse archive of `policy` (what a
/// tier keeps of a path: the same rule `tier_fit` reads by).
pub fn tier_serves(policy: &Policy, tier_step: i64) -> bool {
    policy.archives.len() >= 2 && tier_archive(policy, tier_step).is_some()
}

/// Whether the archive whisper reads for a fetch can come from a tier of `tier_step` seconds:
/// only coarse archives do (the finest is read from raw samples), when the tier's intervals
/// divide the archive's and line up with the archive cascade. `None`: read raw samples.
pub fn tier_fit(policy: &Policy, tier_step: i64, from: i64, until: i64, now: i64) -> Option<TierFit> {
    let (_, k) = tier_plan(policy, tier_step, from, until, now)?;
    Some(if k <= 1 {
        TierFit::Exact
    } else if kept_archive(policy, tier_step) == Some(k) {
        TierFit::Archive
    } else {
        TierFit::Approximate
    })
}

/// The fetch's plan and the archive the tier is read as, when the tier fits (`tier_fit`).
fn tier_plan(policy: &Policy, tier_step: i64, from: i64, until: i64, now: i64) -> Option<(Plan, usize)> {
    let plan = plan(policy, from, until, now)?;
    let k = tier_archive(policy, tier_step)?;
    (plan.archive > 0 && k <= plan.archive).then_some((plan, k))
}

/// Whisper's answer for a path under `policy`, fetched over `[from, until]` at `now`, from the
/// intervals of a left-closed tier of `tier_step` seconds (in time order) instead of raw
/// samples. `None` when the range is outside the retention, as `fetch`, or when the tier does
/// not fit the archive read (`tier_fit`). A tier that keeps archive values (`TierFit::Archive`)
/// is read from them; an interval without one is an error when `strict` (a finer tier answers
/// exactly), else answered from its aggregates as an approximate tier's.
pub fn fetch_from_tier(
    intervals: &[TierInterval],
    tier_step: i64,
    policy: &Policy,
    (from, until, now): (i64, i64, i64),
    strict: bool,
) -> Result<Option<Fetched>, ArchiveNotKept> {
    let Some((plan, k)) = tier_plan(policy, tier_step, from, until, now) else { return Ok(None) };
    let unit = policy.archives[k].step_s;
    let first = intervals.partition_point(|i| i.start < plan.from_interval);
    let last = first + intervals[first..].partition_point(|i| i.start < plan.until_interval);
    let within = &intervals[first..last];
    // Archive `k`'s values: the tier's intervals merged into its intervals (as they are when
    // the tier's interval is the archive's and each is there once: a month of hours is read
    // as it is stored).
    let merged: std::borrow::Cow<'_, [TierInterval]> = if unit == tier_step
        && within.windows(2).all(|w| w[0].start < w[1].start)
    {
        debug_assert!(within.iter().all(|i| i.start.rem_euclid(unit) == 0), "a tier's intervals are aligned to it");
        std::borrow::Cow::Borrowed(within)
    } else {
        let mut merged: Vec<TierInterval> = Vec::with_capacity(within.len() / (unit / tier_step).max(1) as usize + 1);
        for i in within {
            let start = i.start - i.start.rem_euclid(unit);
            match merged.last_mut() {
                Some(m) if m.start == start => m.append(i),
                _ => merged.push(TierInterval { start, ..*i }),
            }
        }
        std::borrow::Cow::Owned(merged)
    };
    let slots = (unit / policy.archives[0].step_s) as usize;
    // Archive `k`'s value from an interval's aggregates: exact for the finest two archives.
    let from_aggregates = |m: &TierInterval| {
        ((m.count as usize).min(slots) as f64 / slots as f64 >= whisper_xff(policy))
            .then(|| m.value(policy.aggregation, slots))
    };
    let level: Vec<(i64, f64)> = if k == 0 {
        // The finest archive keeps each interval's last point.
        merged.iter().map(|m| (m.start, m.last)).collect()
    } else if kept_archive(policy, tier_step) == Some(k) {
        let mut level = Vec::with_capacity(merged.len());
        for m in merged.iter() {
            let value = match m.archive {
                IntervalArchive::Value(v) => Some(v),
                IntervalArchive::Unknown => None,
                IntervalArchive::NotKept if strict => return Err(ArchiveNotKept),
                IntervalArchive::NotKept => from_aggregates(m),
            };
            level.extend(value.map(|v| (m.start, v)));
        }
        level
    } else {
        merged.iter().filter_map(|m| Some((m.start, from_aggregates(m)?))).collect()
    };
    let level = cascade(policy, level, k, plan.archive);
    Ok(Some(lay_out(&plan, level)))
}

impl Series {
    /// A series as fetched: one value per point, averaging if later consolidated.
    pub fn new(
        name: String,
        tags: Vec<(String, String)>,
        (start, end, step): (i64, i64, i64),
        values: Vec<Option<f64>>,
        path_expression: String,
        x_files_factor: f64,
    ) -> Series {
        Series {
            name,
            tags,
            start,
            end,
            step,
            values,
            path_expression,
            values_per_point: 1,
            consolidation: Consolidation::Average,
            x_files_factor,
        }
    }

    /// graphite-web's `maxDataPoints` for the JSON format: when the series has more points
    /// than that over `time_range` seconds, its start is nudged so consolidation bands stay put
    /// from one refresh to the next, and every `ceil(points / max)` values become one point
    /// (by the series' consolidation function); a maximum of 1 folds the whole series.
    pub fn consolidate(&mut self, max_data_points: usize, time_range: i64) {
        if max_data_points == 1 {
            self.values_per_point = self.values.len();
            return;
        }
        let points = time_range as f64 / self.step as f64;
        if max_data_points == 0 || max_data_points as f64 >= points {
            return;
        }
        let per_point = (points / max_data_points as f64).ceil() as usize;
        let seconds_per_point = per_point as i64 * self.step;
        let nudge = seconds_per_point + self.start.rem_euclid(self.step) - self.start.rem_euclid(seconds_per_point);
        self.start += nudge;
        // graphite-web drops one value fewer than the nudge spans (its `range(1, n)`).
        let lose = ((nudge / self.step) as usize).saturating_sub(1).min(self.values.len());
        self.values.drain(..lose);
        self.values_per_point = per_point;
    }

    /// The values folded into points (`values_per_point` of them each), the step widened to
    /// match: what every format writes.
    pub fn fold_points(&mut self) {
        if self.values_per_point > 1 {
            self.values = consolidate(&self.values, self.values_per_point, self.consolidation, self.x_files_factor);
            self.step *= self.values_per_point as i64;
        }
        self.values_per_point = 1;
    }

    /// The timestamps graphite-web pairs with the values: `start`, `start + step`, … up to
    /// `end` inclusive, as many as there are values or fewer.
    fn timestamps(&self, step: i64) -> impl Iterator<Item = i64> + '_ {
        (0..).map(move |i| self.start + i * step).take_while(|t| *t <= self.end)
    }
}

/// A float as Python's `repr` writes it (`1.0`, `0.5`, `1e+20`), which graphite-web's formats
/// carry.
pub fn py_float(v: f64) -> String {
    let mut out = String::new();
    write_py_float(&mut out, v);
    out
}

/// `py_float` appended to `out` (the JSON writer's loop: no string per value).
pub fn write_py_float(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("nan");
        return;
    }
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "inf" } else { "-inf" });
        return;
    }
    // Python writes plain digits for a decimal exponent from -4 to 15, where the shortest
    // round-trip digits come out the same way (with `.0` on integers); `write!` took a fifth of
    // a long render's time, ryu still 22% of a 7-day glob render's. zmij writes the same
    // digits faster; where it would write an exponent in this range, ryu (plain here) does.
    if v == 0.0 || (1e-4..1e16).contains(&v.abs()) {
        let mut buffer = zmij::Buffer::new();
        let shortest = buffer.format_finite(v);
        if shortest.as_bytes().contains(&b'e') {
            out.push_str(ryu::Buffer::new().format_finite(v));
        } else {
            out.push_str(shortest);
        }
    } else {
        // Shortest digits, in Python's exponent style: `1e+20`, `1.5e-07`.
        let s = format!("{v:e}");
        let (mantissa, e) = s.split_once('e').expect("{:e} has an exponent");
        let e: i32 = e.parse().expect("an integer exponent");
        let _ = write!(out, "{mantissa}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
    }
}

/// graphite-web's `format=json`: `[{"target", "tags", "datapoints": [[value, ts], …]}]`, with
/// `maxDataPoints` applied over the span from the earliest start to the latest end; whole.
pub fn to_json(series: &mut [Series], max_data_points: Option<usize>) -> String {
    let mut whole = String::new();
    write_json(series, max_data_points, usize::MAX, &mut |chunk| {
        if whole.is_empty() {
            whole = chunk;
        } else {
            whole.push_str(&chunk);
        }
        true
    });
    whole
}

/// `to_json` written in pieces of about `chunk_bytes` handed to `emit` as they fill (a response
/// sent while it is written, never held whole); writing stops when `emit` returns `false`
/// (the client went away).
pub fn write_json(
    series: &mut [Series],
    max_data_points: Option<usize>,
    chunk_bytes: usize,
    emit: &mut dyn FnMut(String) -> bool,
) {
    // graphite-web answers no series at all when every series is empty (its `any(data)`).
    if series.iter().all(|s| s.values.is_empty()) {
        emit("[]".into());
        return;
    }
    // The range maxDataPoints spreads over is the series' own, not the request's.
    let time_range =
        series.iter().map(|s| s.end).max().unwrap_or(0) - series.iter().map(|s| s.start).min().unwrap_or(0);
    // About 24 bytes a point (`[12.34, 1795759199], `): a month of hours of a thousand paths
    // is 23 MB, which grown by doubling was copied and faulted in again and again.
    let points: usize = series.iter().map(|s| s.values.len()).sum();
    let names: usize = series.iter().map(|s| 64 + 2 * s.name.len()).sum();
    let capacity = (2 + names + points.min(1 << 26) * 24).min(chunk_bytes.saturating_add(256));
    let mut out = String::with_capacity(capacity);
    // Hands the filled piece over; `false` when writing should stop.
    let mut flush = |out: &mut String| -> bool {
        if out.len() < chunk_bytes {
            return true;
        }
        let piece = std::mem::replace(out, String::with_capacity(capacity));
        emit(piece)
    };
    out.push('[');
    for (i, s) in series.iter_mut().enumerate() {
        if let Some(m) = max_data_points {
            s.consolidate(m, time_range);
        }
        s.fold_points();
        let step = s.step;
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str("{\"target\": ");
        out.push_str(&serde_json_string(&s.name));
        out.push_str(", \"tags\": {");
        for (k, (name, value)) in s.tags.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            let _ = write!(out, "{}: {}", serde_json_string(name), serde_json_string(value));
        }
        out.push_str("}, \"datapoints\": [");
        for (k, (v, t)) in s.values.iter().zip(s.timestamps(step)).enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            match v {
                Some(v) if v.is_finite() => {
                    out.push('[');
                    write_py_float(&mut out, *v);
                }
                // JSON has no infinities or NaN; graphite-web writes them as they come, which
                // JSON parsers refuse.
                _ => out.push_str("[null"),
            }
            out.push_str(", ");
            out.push_str(itoa::Buffer::new().format(t));
            out.push(']');
            if !flush(&mut out) {
                return;
            }
        }
        out.push_str("]}");
    }
    out.push(']');
    emit(out);
}

fn serde_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || !c.is_ascii() => {
                // Python's json.dumps escapes everything beyond ASCII (ensure_ascii).
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// graphite-web's `format=csv`: `name,YYYY-MM-DD HH:MM:SS,value` (UTC), empty for no value.
pub fn to_csv(series: &[Series], tz: &jiff::tz::TimeZone) -> String {
    let mut out = String::new();
    for s in series {
        for (i, v) in s.values.iter().enumerate() {
            let t = s.start + i as i64 * s.step;
            let _ = write!(out, "{},", csv_field(&s.name));
            match jiff::Timestamp::from_second(t) {
                Ok(ts) => {
                    let _ = write!(out, "{}", ts.to_zoned(tz.clone()).strftime("%Y-%m-%d %H:%M:%S"));
                }
                // Outside the years a calendar names (±9999): the epoch seconds.
                Err(_) => {
                    let _ = write!(out, "{t}");
                }
            }
            out.push(',');
            if let Some(v) = v {
                out.push_str(&py_float(*v));
            }
            out.push_str("\r\n");
        }
    }
    out
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// graphite-web's `format=pickle`, what it reads from its `CLUSTER_SERVERS`: a list of one
/// dict per series, as its `TimeSeries.getInfo()` writes them (`None` for gaps; values not
/// consolidated, `valuesPerPoint` 1).
pub fn to_pickle(series: &[Series]) -> Vec<u8> {
    let mut p = crate::pickle::Pickler::new();
    p.begin_list();
    for s in series {
        p.begin_dict();
        p.str("name").str(&s.name);
        p.str("start").int(s.start).str("end").int(s.end).str("step").int(s.step);
        p.str("values").begin_list();
        for v in &s.values {
            p.opt_float(*v);
        }
        p.end();
        p.str("pathExpression").str(&s.path_expression);
        p.str("valuesPerPoint").int(1).str("consolidationFunc").str("average").str("xFilesFactor").float(0.0);
        p.end();
    }
    p.end();
    p.finish()
}

/// graphite-web's `format=msgpack`: the pickle format's dicts, in MessagePack.
pub fn to_msgpack(series: &[Series]) -> Vec<u8> {
    let mut p = crate::msgpack::Packer::new();
    p.array(series.len());
    for s in series {
        p.map(9);
        p.str("name").str(&s.name);
        p.str("start").int(s.start).str("end").int(s.end).str("step").int(s.step);
        p.str("values").array(s.values.len());
        for v in &s.values {
            p.opt_float(*v);
        }
        p.str("pathExpression").str(&s.path_expression);
        p.str("valuesPerPoint").int(1).str("consolidationFunc").str("average").str("xFilesFactor").float(0.0);
    }
    p.finish()
}

/// graphite-web's `format=raw`: `name,start,end,step|v1,v2,None,…` per series.
pub fn to_raw(series: &[Series]) -> String {
    let mut out = String::new();
    for s in series {
        let _ = write!(out, "{},{},{},{}|", s.name, s.start, s.end, s.step);
        for (i, v) in s.values.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            match v {
                Some(v) => out.push_str(&py_float(*v)),
                None => out.push_str("None"),
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Aggregation, Archive};

    fn policy(archives: &[(i64, i64)], aggregation: Aggregation, xff: f64) -> Policy {
        Policy {
            archives: archives.iter().map(|&(step_s, points)| Archive { step_s, points }).collect(),
            aggregation,
            x_files_factor: xff,
        }
    }

    const NOW: i64 = 1_700_003_600;

    #[test]
    fn the_finest_archive_keeps_the_last_point_of_each_interval() {
        let p = policy(&[(60, 1440)], Aggregation::Average, 0.5);
        // 10 s data into a 60 s archive: the last of each minute.
        let samples: Vec<(i64, f64)> = (0..36).map(|i| ((1_700_000_000 + i * 10) * 1000, i as f64)).collect();
        let (start, end, step, values) = fetch(&samples, &p, 1_699_999_990, 1_700_000_400, NOW).unwrap();
        // whisper: fromInterval = 1699999980 + 60, untilInterval = 1700000400 - 0 + 60.
        assert_eq!((start, end, step), (1_700_000_040, 1_700_000_460, 60));
        assert_eq!(values.len(), 7);
        // 1700000040..: the minute [1700000040, 1700000100) holds points 4..=9, the last is 9.
        assert_eq!(values[..5], [Some(9.0), Some(15.0), Some(21.0), Some(27.0), Some(33.0)]);
        assert_eq!(values[5..], [Some(35.0), None]);
    }

    #[test]
    fn a_coarser_archive_aggregates_with_the_x_files_factor() {
        // 60 s for 1 h, 300 s for 1 day: a 2 h range reads the 300 s archive.
        let p = policy(&[(60, 60), (300, 288)], Aggregation::Sum, 0.5);
        let base = 1_699_996_200; // a multiple of 300
        let mut samples = Vec::new();
        // Five-minute slots: the first full (5 values), the second with 3 of 5, the third 2 of 5.
        for k in 0..5 {
            samples.push(((base + k * 60) * 1000, 1.0));
        }
        for k in 0..3 {
            samples.push(((base + 300 + k * 60) * 1000, 2.0));
        }
        for k in 0..2 {
            samples.push(((base + 600 + k * 60) * 1000, 4.0));
        }
        let (start, _, step, values) = fetch(&samples, &p, base - 300, base + 1200, NOW).unwrap();
        assert_eq!((start, step), (base, 300));
        assert_eq!(values[..4], [Some(5.0), Some(6.0), None, None]);
    }

    #[test]
    fn ranges_outside_the_retention_clamp_or_answer_nothing() {
        let p = policy(&[(60, 60)], Aggregation::Average, 0.5);
        assert_eq!(fetch(&[], &p, NOW + 10, NOW + 100, NOW), None);
        assert_eq!(fetch(&[], &p, NOW - 10_000, NOW - 7200, NOW), None);
        let (start, end, _, values) = fetch(&[], &p, NOW - 100_000, NOW + 1000, NOW).unwrap();
        // NOW is 20 s past a minute: the intervals after NOW - 3600 and after NOW.
        assert_eq!((start, end), (NOW - 3560, NOW + 40));
        assert!(values.iter().all(Option::is_none));
    }

    #[test]
    fn max_data_points_consolidates_as_graphite_web() {
        let values = (0..10).map(|i| Some(i as f64)).collect();
        let s = Series::new("a".into(), vec![], (600, 1200, 60), values, "a".into(), 0.0);
        let mut t = s.clone();
        t.consolidate(5, 600);
        t.fold_points();
        // 10 points, at most 5: two per point, 120 s apart; nudge = 120 + 0 - 0 = 120, one
        // value dropped.
        assert_eq!((t.step, t.start), (120, 720));
        assert_eq!(t.values, [Some(1.5), Some(3.5), Some(5.5), Some(7.5), Some(9.0)]);
        assert_eq!(
            to_json(&mut [s.clone()], Some(5)),
            r#"[{"target": "a", "tags": {}, "datapoints": [[1.5, 720], [3.5, 840], [5.5, 960], [7.5, 1080], [9.0, 1200]]}]"#
        );
        // consolidateBy's function and the series' xFilesFactor decide each point.
        let mut m = s.clone();
        (m.consolidation, m.values[3]) = (Consolidation::Max, None);
        // The point at 840 s folds 3 (now a gap) and 4.
        assert!(to_json(&mut [m.clone()], Some(5)).contains("[2.0, 720], [4.0, 840]"));
        m.x_files_factor = 1.0;
        assert!(to_json(&mut [m.clone()], Some(5)).contains("[null, 840]"));
        // A maximum of 1 folds the whole series; no series with values answers no series.
        assert!(to_json(&mut [s.clone()], Some(1)).contains("[[4.5, 600]]"));
        let mut empty = s.clone();
        empty.values.clear();
        assert_eq!(to_json(&mut [empty], None), "[]");
        // Written in pieces, the same bytes; a piece as soon as one is full; stopped when asked.
        for chunk_bytes in [1, 7, 64, 1 << 20] {
            let mut pieces = Vec::new();
            write_json(&mut [s.clone(), m.clone()], Some(5), chunk_bytes, &mut |p| {
                pieces.push(p);
                true
            });
            assert_eq!(pieces.concat(), to_json(&mut [s.clone(), m.clone()], Some(5)), "pieces of {chunk_bytes}");
            assert!(pieces[..pieces.len() - 1].iter().all(|p| p.len() >= chunk_bytes.min(1 << 10)));
        }
        let mut pieces = 0;
        write_json(&mut [s.clone(), m.clone()], None, 1, &mut |_| {
            pieces += 1;
            pieces < 2
        });
        assert_eq!(pieces, 2, "no piece after emit said stop");
    }

    #[test]
    fn formats_as_graphite_web_writes_them() {
        let tags = vec![("name".into(), "a.b".into())];
        let s = Series::new(
            "a.b".into(),
            tags,
            (1_700_000_040, 1_700_000_160, 60),
            vec![Some(1.0), None],
            "a.*".into(),
            0.0,
        );
        assert_eq!(to_raw(std::slice::from_ref(&s)), "a.b,1700000040,1700000160,60|1.0,None\n");
        let utc = jiff::tz::TimeZone::UTC;
        assert_eq!(
            to_csv(std::slice::from_ref(&s), &utc),
            "a.b,2023-11-14 22:14:00,1.0\r\na.b,2023-11-14 22:15:00,\r\n"
        );
        // Times in the request's zone, as graphite-web writes them in its TIME_ZONE.
        let berlin = crate::attime::time_zone("Europe/Berlin").unwrap();
        assert!(to_csv(std::slice::from_ref(&s), &berlin).starts_with("a.b,2023-11-14 23:14:00,1.0\r\n"));
        let pickled = to_pickle(std::slice::from_ref(&s));
        assert!(pickled.starts_with(b"\x80\x02](}(X\x04\x00\x00\x00nameX\x03\x00\x00\x00a.b"), "{pickled:?}");
        assert!(pickled.ends_with(b"ue."), "{pickled:?}");
        // MessagePack: the dict graphite-web's `TimeSeries.getInfo()` gives, key for key.
        let packed: serde_json::Value = rmp_serde::from_slice(&to_msgpack(std::slice::from_ref(&s))).unwrap();
        assert_eq!(
            packed,
            serde_json::json!([{
                "name": "a.b", "start": 1_700_000_040, "end": 1_700_000_160, "step": 60,
                "values": [1.0, null], "pathExpression": "a.*", "valuesPerPoint": 1,
                "consolidationFunc": "average", "xFilesFactor": 0.0,
            }])
        );
        assert_eq!(
            to_json(&mut [s], None),
            r#"[{"target": "a.b", "tags": {"name": "a.b"}, "datapoints": [[1.0, 1700000040], [null, 1700000100]]}]"#
        );
        assert_eq!(py_float(3.0), "3.0");
        assert_eq!(py_float(-0.0), "-0.0");
        assert_eq!(py_float(1e-4), "0.0001");
        assert_eq!(py_float(1e15), "1000000000000000.0");
        // Both ends of the plain range and every decade in it, as ryu writes them.
        for e in -4..16 {
            for m in [1.0, 1.5, 2.5e-16 + 1.0, 9.999_999_999_999_998, 1.234_567_890_123_456_7] {
                let v = m * 10f64.powi(e);
                if (1e-4..1e16).contains(&v) {
                    assert_eq!(py_float(v), ryu::Buffer::new().format_finite(v), "{v:e}");
                    assert_eq!(py_float(-v), ryu::Buffer::new().format_finite(-v), "{v:e}");
                }
            }
        }
        assert_eq!(py_float(1e20), "1e+20");
        assert_eq!(py_float(1.5e-7), "1.5e-07");
        assert_eq!(py_float(0.1), "0.1");
        assert_eq!(py_float(-3.0), "-3.0");
        // Where Python switches to an exponent, on the exact values around it.
        assert_eq!(py_float(9_999_999_999_999_998.0), "9999999999999998.0");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(0.000_099_99), "9.999e-05");
        assert_eq!(py_float(-0.0), "-0.0");
        // Exactly between two shortest strings (…909.625): Python's repr takes the even digit,
        // where Rust's `Display` writes …909.63.
        assert_eq!(py_float(f64::from_bits(14042032524596155752)), "-137751339213909.62");
    }

    proptest::proptest! {
        /// Where Python writes plain decimals, the digits written read back to the value and
        /// are as few as `Display`'s (both shortest), with `.0` on integers; they differ only
        /// where two shortest strings are equally near (then ryu and zmij, like Python, take
        /// the even digit), and they are ryu's.
        #[test]
        fn py_floats_are_shortest_plain_decimals(bits in proptest::prelude::any::<u64>(), small in -1e6f64..1e6) {
            for v in [f64::from_bits(bits), small, small.round(), small / 1e9] {
                if v.is_finite() && (v == 0.0 || (1e-4..1e16).contains(&v.abs())) {
                    let got = py_float(v);
                    let mut display = format!("{v}");
                    if !display.contains('.') {
                        display.push_str(".0");
                    }
                    proptest::prop_assert_eq!(got.parse::<f64>().unwrap().to_bits(), v.to_bits(), "{}", got);
                    proptest::prop_assert_eq!(got.len(), display.len(), "{} / {}", got, display);
                    proptest::prop_assert!(!got.contains('e'), "{}", got);
                    // zmij writes what ryu (plain in this range) writes.
                    let mut ryu = ryu::Buffer::new();
                    proptest::prop_assert_eq!(got.as_str(), ryu.format_finite(v));
                }
            }
        }
    }
}
