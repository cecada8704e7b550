//! A step-aligned cache of range query results (what Thanos' query-frontend and
//! VictoriaMetrics' rollup result cache do for dashboards): a dashboard refreshing the same
//! query with its window moved by a few steps evaluates only the steps it has not seen.
//!
//! A result is kept per query text, step, phase (start modulo step) and lookback, as the
//! points of the steps at least `delay` behind the wall clock when it was evaluated (newer
//! steps may still receive samples, so they are never kept). A later request with the same key
//! whose start is not before the kept one takes the kept steps it covers and evaluates the
//! rest; the two are merged series by series. Each step of a range query is evaluated on its
//! own, so the merged answer is the one a whole evaluation gives, point for point, as long as
//! the query holds nothing that reads the query's own start or end ([`cacheable`]).
//!
//! Annotations (Prometheus' warnings and infos) are kept with a result. Those the engine
//! raises only grow with the steps evaluated (a series that is not a counter, a bucket out of
//! order: each raised if some step meets it), so the kept steps' annotations hold those of any
//! steps among them. A refresh whose new steps raise exactly the kept annotations therefore
//! answers exactly them, as a whole evaluation would; when they differ it is evaluated whole.
//! The engine sorts annotations, so that equal sets are equal lists.
//!
//! Data can still change behind the kept steps: a sender running late, out-of-order or
//! backfilled writes, deletions, retention. The database notes such changes
//! (`strata_tsdb::changes`, watching writes from `delay` back); a kept result is cut back to
//! the steps before the oldest change made after it was evaluated.
//!
//! Memory is bounded (`max_bytes`, least recently used results dropped first).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_promql::ast::{Duration, Expr, ExprKind};
use strata_promql::{Annotation, Series};
use strata_tsdb::changes::ChangeLog;

#[cfg(test)]
mod tests;

/// What identifies results that can be combined: the steps of one query at one resolution.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct CacheKey {
    /// The query as the printer writes it, so spellings of one query share results.
    pub query: String,
    pub step_ms: i64,
    /// The start modulo the step: only results on the same grid combine.
    pub phase_ms: i64,
    pub lookback_ms: i64,
}

impl CacheKey {
    pub fn new(expr: &Expr, start: i64, step_ms: i64, lookback_ms: i64) -> CacheKey {
        assert!(step_ms > 0, "a range query has a positive step");
        CacheKey { query: expr.to_string(), step_ms, phase_ms: start.rem_euclid(step_ms), lookback_ms }
    }
}

/// The kept steps of one result.
#[derive(Debug)]
struct Entry {
    /// First and last kept step.
    first: i64,
    last: i64,
    /// The database's change number when the result was evaluated (or last checked).
    seq: u64,
    /// Shared with requests reading it, so that they copy their steps out without the lock.
    series: Arc<Vec<Series>>,
    /// The annotations of the evaluation (sorted): those of the kept steps, or more.
    annotations: Vec<Annotation>,
    bytes: usize,
    /// For least-recently-used eviction.
    used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<CacheKey, Entry>,
    bytes: usize,
    clock: u64,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Requests answered wholly from kept steps.
    pub hits: AtomicU64,
    /// Requests that took kept steps and evaluated the rest.
    pub partial_hits: AtomicU64,
    /// Cacheable requests with nothing kept for them.
    pub misses: AtomicU64,
    /// Requests the cache could not serve (asked off, a query reading its own start or end,
    /// rollup tiers).
    pub bypassed: AtomicU64,
    /// Results dropped to stay within the size.
    pub evictions: AtomicU64,
    /// Kept results cut back or dropped because data behind them changed.
    pub invalidations: AtomicU64,
}

#[derive(Debug)]
pub struct QueryCache {
    max_bytes: usize,
    delay_ms: i64,
    inner: Mutex<Inner>,
    pub stats: CacheStats,
}

/// Kept steps for a request: the series' points from its start through `last`.
#[derive(Debug)]
pub struct Cached {
    pub last: i64,
    pub series: Vec<Series>,
    /// The annotations kept with them (sorted): those of these steps, or more.
    pub annotations: Vec<Annotation>,
}

impl QueryCache {
    pub fn new(max_bytes: usize, delay_ms: i64) -> QueryCache {
        assert!(delay_ms > 0, "steps newer than a positive delay are never kept");
        QueryCache { max_bytes, delay_ms, inner: Mutex::new(Inner::default()), stats: CacheStats::default() }
    }

    pub fn delay_ms(&self) -> i64 {
        self.delay_ms
    }

    /// Bytes of the kept results (estimated: points, histograms and labels).
    pub fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }

    pub fn entries(&self) -> usize {
        self.inner.lock().entries.len()
    }

    /// The kept steps of `key` from `start` to at most `end`, after cutting away what changed
    /// since they were evaluated; `None` when none apply (nothing kept, kept from a later
    /// start, or all changed).
    pub fn get(&self, key: &CacheKey, start: i64, end: i64, changes: &ChangeLog) -> Option<Cached> {
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let clock = inner.clock;
        let entry = inner.entries.get_mut(key)?;
        entry.used = clock;
        // The number first: a change made while looking is then seen next time.
        let seq = changes.seq();
        if let Some(changed) = changes.changed_since(entry.seq) {
            self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
            if changed <= entry.first {
                let gone = inner.entries.remove(key).expect("found above");
                inner.bytes -= gone.bytes;
                return None;
            }
            // The last step before the change.
            let last = entry.first + (changed - 1 - entry.first) / key.step_ms * key.step_ms;
            if last < entry.last {
                entry.last = last;
                let series = Arc::make_mut(&mut entry.series);
                for s in series.iter_mut() {
                    s.points.retain(|p| p.t <= last);
                    s.hists.retain(|p| p.t <= last);
                }
                series.retain(|s| !s.is_empty());
                let bytes = size_of_series(&entry.series);
                let before = entry.bytes;
                entry.bytes = bytes;
                inner.bytes = inner.bytes - before + bytes;
            }
        }
        let entry = inner.entries.get_mut(key).expect("kept above");
        entry.seq = seq;
        if entry.first > start || entry.last < start {
            return None;
        }
        let last = entry.last.min(end);
        let kept = entry.series.clone();
        let annotations = entry.annotations.clone();
        drop(inner);
        let spare = usize::try_from((end - last) / key.step_ms).unwrap_or(0);
        let series = kept.iter().filter_map(|s| slice(s, start, last, spare)).collect();
        Some(Cached { last, series, annotations })
    }

    /// Keeps the steps of `series` (a range result from `start`, evaluated when the database's
    /// change number was `seq` and the wall clock `now`) that are at least the delay old, with
    /// the result's `annotations` (sorted).
    #[allow(clippy::too_many_arguments, reason = "a result and the clock and log it was evaluated at")]
    pub fn put(
        &self,
        key: CacheKey,
        start: i64,
        end: i64,
        now: i64,
        seq: u64,
        series: &[Series],
        annotations: &[Annotation],
    ) {
        debug_assert!(annotations.is_sorted(), "the engine sorts annotations");
        let horizon = now - self.delay_ms;
        if horizon <= start {
            return;
        }
        // The last step strictly before the horizon, and not after the end.
        let last = (start + (horizon - 1 - start) / key.step_ms * key.step_ms).min(end);
        let kept: Vec<Series> = series.iter().filter_map(|s| slice(s, start, last, 0)).collect();
        let bytes =
            size_of_series(&kept) + annotations.iter().map(|a| a.msg.len() + 48).sum::<usize>() + key.query.len() + 64;
        if bytes > self.max_bytes {
            return;
        }
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let used = inner.clock;
        let entry =
            Entry { first: start, last, seq, series: Arc::new(kept), annotations: annotations.to_vec(), bytes, used };
        if let Some(old) = inner.entries.insert(key, entry) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        while inner.bytes > self.max_bytes {
            let oldest = inner.entries.iter().min_by_key(|(_, e)| e.used).map(|(k, _)| k.clone()).expect("bytes held");
            let gone = inner.entries.remove(&oldest).expect("found");
            inner.bytes -= gone.bytes;
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `s` restricted to steps in `[from, to]`, or `None` when it has none there; with room for
/// `spare` more points (the steps a refresh appends, so that they do not copy it again).
fn slice(s: &Series, from: i64, to: i64, spare: usize) -> Option<Series> {
    // Points are in time order: the range is found by bisection and copied at once.
    let (a, b) = (s.points.partition_point(|p| p.t < from), s.points.partition_point(|p| p.t <= to));
    let mut points = Vec::with_capacity(b.saturating_sub(a) + spare);
    points.extend_from_slice(&s.points[a..b.max(a)]);
    let (a, b) = (s.hists.partition_point(|p| p.t < from), s.hists.partition_point(|p| p.t <= to));
    let hists = s.hists[a..b.max(a)].to_vec();
    (!points.is_empty() || !hists.is_empty()).then(|| Series {
        labels: s.labels.clone(),
        points,
        hists,
        drop_name: s.drop_name,
    })
}

fn size_of_series(series: &[Series]) -> usize {
    series
        .iter()
        .map(|s| {
            64 + s.labels.iter().map(|l| l.name.len() + l.value.len() + 16).sum::<usize>()
                + s.points.len() * std::mem::size_of::<strata_promql::Point>()
                + s.hists.len() * 256
        })
        .sum()
}

/// Kept steps followed by newly evaluated ones, series by series in label order (both are
/// sorted by labels, as range results are).
pub fn merge(kept: Vec<Series>, fresh: Vec<Series>) -> Vec<Series> {
    let mut out = Vec::with_capacity(kept.len().max(fresh.len()));
    let mut a = kept.into_iter().peekable();
    let mut b = fresh.into_iter().peekable();
    loop {
        match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => match x.labels.cmp(&y.labels) {
                std::cmp::Ordering::Less => out.push(a.next().expect("peeked")),
                std::cmp::Ordering::Greater => out.push(b.next().expect("peeked")),
                std::cmp::Ordering::Equal => {
                    let mut x = a.next().expect("peeked");
                    let y = b.next().expect("peeked");
                    debug_assert!(x.points.last().is_none_or(|p| y.points.first().is_none_or(|q| p.t < q.t)));
                    x.points.extend(y.points);
                    x.hists.extend(y.hists);
                    out.push(x);
                }
            },
            (Some(_), None) => out.push(a.next().expect("peeked")),
            (None, Some(_)) => out.push(b.next().expect("peeked")),
            (None, None) => return out,
        }
    }
}

/// Whether each step of `expr` depends only on its own time: no `@` (which reads one time for
/// every step, `start()` and `end()` the query's own), no negative offset (which reads samples
/// after the step, still arriving), and no duration expression (`range()` is the query's).
pub fn cacheable(expr: &Expr) -> bool {
    let mut ok = true;
    let plain = |d: &Option<Duration>| match d {
        None => true,
        Some(Duration::Ms(ms)) => *ms >= 0,
        Some(Duration::Expr(_)) => false,
    };
    expr.walk(&mut |e| {
        ok &= match &e.kind {
            ExprKind::Vector(v) => v.at.is_none() && plain(&v.offset),
            ExprKind::Matrix(m) => {
                m.vector.at.is_none() && plain(&m.vector.offset) && matches!(m.range, Duration::Ms(_))
            }
            ExprKind::Subquery(s) => {
                s.at.is_none()
                    && plain(&s.offset)
                    && matches!(s.range, Duration::Ms(_))
                    && matches!(s.step, None | Some(Duration::Ms(_)))
            }
            _ => true,
        };
    });
    ok
}

/// How a request went through the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Hit,
    PartialHit,
    Miss,
}

/// Evaluates the range query `expr` over `[start, end]` through the cache: kept steps are
/// taken, the rest evaluated by `eval(from)` (the same query from step `from` to `end`), the
/// result kept for the next request. `now` is the wall clock in ms, `changes` the database's.
/// Kept steps with annotations answer only when steps evaluated now raise exactly the same
/// (the new steps, or for a request wholly kept its last step): see the module's comment.
#[allow(clippy::too_many_arguments, reason = "a range query and the clock and log it is cached against")]
pub fn evaluate_range(
    cache: &QueryCache,
    changes: &ChangeLog,
    key: CacheKey,
    start: i64,
    end: i64,
    now: i64,
    eval: &mut dyn FnMut(i64) -> Result<strata_promql::QueryOutput, strata_promql::EvalError>,
) -> Result<(strata_promql::QueryOutput, Outcome), strata_promql::EvalError> {
    use strata_promql::{QueryOutput, Value};
    let step = key.step_ms;
    // Before anything is read: changes from here on are seen by the next request.
    let seq = changes.seq();
    let whole = |eval: &mut dyn FnMut(i64) -> _| {
        cache.stats.misses.fetch_add(1, Ordering::Relaxed);
        let out: QueryOutput = eval(start)?;
        if let Value::Matrix(series) = &out.value {
            cache.put(key.clone(), start, end, now, seq, series, &out.annotations);
        }
        Ok((out, Outcome::Miss))
    };
    match cache.get(&key, start, end, changes) {
        Some(kept) if kept.last >= end => {
            // Statistics are of the work done: none for a hit, unless its last step was
            // evaluated to check the annotations.
            let mut stats = Default::default();
            if !kept.annotations.is_empty() {
                let last = eval(end)?;
                if last.annotations != kept.annotations {
                    return whole(eval);
                }
                stats = last.stats;
            }
            cache.stats.hits.fetch_add(1, Ordering::Relaxed);
            let value = Value::Matrix(kept.series);
            Ok((QueryOutput { value, annotations: kept.annotations, stats }, Outcome::Hit))
        }
        Some(kept) => {
            let fresh = eval(kept.last + step)?;
            let Value::Matrix(series) = fresh.value else {
                return whole(eval);
            };
            if fresh.annotations != kept.annotations {
                return whole(eval);
            }
            cache.stats.partial_hits.fetch_add(1, Ordering::Relaxed);
            let merged = merge(kept.series, series);
            cache.put(key, start, end, now, seq, &merged, &fresh.annotations);
            let value = Value::Matrix(merged);
            Ok((QueryOutput { value, annotations: fresh.annotations, stats: fresh.stats }, Outcome::PartialHit))
        }
        None => whole(eval),
    }
}
