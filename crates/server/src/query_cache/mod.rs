//! A step-aligned cache of range query results (what Thanos' query-frontend and
//! VictoriaMetrics' rollup result cache do for dashboards): a dashboard refreshing the same
//! query with its window moved by a few steps evaluates only the steps it has not seen.
//!
//! A result is kept per query text, step, phase (start modulo step), lookback and source
//! (raw data or the rollup tier the planner reads, `CacheKey::tier_ms`), as the
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
//!
//! Series are kept as the JSON text of their points (`query_json::KeptSeries`): an answer
//! from kept steps copies their text rather than formatting each value again, which was
//! nearly all of a hit's work. They are shared, not copied: an answer is written from the
//! same text the cache holds (`Answer::Shared`, the series restricted to the request's
//! window), and a refresh takes it back from the cache, drops the steps that were too new to
//! keep, appends the text of the new steps in place and keeps the result again. Steps before
//! the request's start stay until they are a quarter of what is kept (so a window moving by a
//! step does not move every point).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_promql::ast::{Duration, Expr, ExprKind};
use strata_promql::{Annotation, QueryOutput, QueryStats, Value};
use strata_tsdb::changes::ChangeLog;

use crate::query_json::{keep_series, KeptSeries};

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
    /// The interval of the rollup tier the planner answers the query from (0: raw data).
    /// Results of different sources are never combined; those of a tier are cut back by
    /// changes to the tier's blocks too (`ChangeLog::changed_in_tiers_since`).
    pub tier_ms: i64,
}

impl CacheKey {
    pub fn new(expr: &Expr, start: i64, step_ms: i64, lookback_ms: i64) -> CacheKey {
        assert!(step_ms > 0, "a range query has a positive step");
        CacheKey { query: expr.to_string(), step_ms, phase_ms: start.rem_euclid(step_ms), lookback_ms, tier_ms: 0 }
    }

    /// The key of results the planner answers from the tier of `interval_ms`.
    pub fn from_tier(self, interval_ms: i64) -> CacheKey {
        assert!(interval_ms > 0, "a tier has a positive interval");
        CacheKey { tier_ms: interval_ms, ..self }
    }
}

/// The kept steps of one result.
#[derive(Debug)]
struct Entry {
    /// First and last kept step. The series may hold points after `last` (steps too new to
    /// keep when they were evaluated, or cut back by a change): those are never answered.
    first: i64,
    last: i64,
    /// The database's change number when the result was evaluated (or last checked).
    seq: u64,
    /// Shared with the answers written from it.
    series: Arc<Vec<KeptSeries>>,
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
    /// Requests the cache could not serve (asked off, a query reading its own start or end).
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

/// Kept steps for a request: the series' points from `first` through `last` are the kept
/// result's (points outside that are not).
#[derive(Debug)]
pub struct Cached {
    pub first: i64,
    pub last: i64,
    pub series: Arc<Vec<KeptSeries>>,
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
        let changed =
            if key.tier_ms > 0 { changes.changed_in_tiers_since(entry.seq) } else { changes.changed_since(entry.seq) };
        if let Some(changed) = changed {
            self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
            if changed <= entry.first {
                let gone = inner.entries.remove(key).expect("found above");
                inner.bytes -= gone.bytes;
                return None;
            }
            // The last step before the change; the points after it are left to be cut off
            // by the refresh that appends to them.
            let last = entry.first + (changed - 1 - entry.first) / key.step_ms * key.step_ms;
            entry.last = entry.last.min(last);
        }
        let entry = inner.entries.get_mut(key).expect("kept above");
        entry.seq = seq;
        if entry.first > start || entry.last < start {
            return None;
        }
        Some(Cached {
            first: entry.first,
            last: entry.last.min(end),
            series: entry.series.clone(),
            annotations: entry.annotations.clone(),
        })
    }

    /// Drops the result of `key` if it still is `series`, so that the caller holds the only
    /// reference to them (and can append to them in place) unless an answer is being written
    /// from them.
    fn release(&self, key: &CacheKey, series: &Arc<Vec<KeptSeries>>) {
        let mut inner = self.inner.lock();
        if inner.entries.get(key).is_some_and(|e| Arc::ptr_eq(&e.series, series)) {
            let gone = inner.entries.remove(key).expect("found");
            inner.bytes -= gone.bytes;
        }
    }

    /// Keeps the steps of `series` (a range result from `start` to `end`, evaluated when the
    /// database's change number was `seq` and the wall clock `now`) that are at least the
    /// delay old, with the result's `annotations` (sorted). The series are shared, not copied.
    #[allow(clippy::too_many_arguments, reason = "a result and the clock and log it was evaluated at")]
    pub fn put(
        &self,
        key: CacheKey,
        start: i64,
        end: i64,
        now: i64,
        seq: u64,
        series: Arc<Vec<KeptSeries>>,
        annotations: &[Annotation],
    ) {
        debug_assert!(annotations.is_sorted(), "the engine sorts annotations");
        let horizon = now - self.delay_ms;
        if horizon <= start {
            return;
        }
        // The last step strictly before the horizon, and not after the end.
        let last = (start + (horizon - 1 - start) / key.step_ms * key.step_ms).min(end);
        let bytes = series.iter().map(KeptSeries::bytes).sum::<usize>()
            + annotations.iter().map(|a| a.msg.len() + 48).sum::<usize>()
            + key.query.len()
            + 64;
        if bytes > self.max_bytes {
            return;
        }
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let used = inner.clock;
        let entry = Entry { first: start, last, seq, series, annotations: annotations.to_vec(), bytes, used };
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

/// Kept steps followed by newly evaluated ones, series by series in label order (both are
/// sorted by labels, as range results are).
pub fn merge(kept: Vec<KeptSeries>, fresh: Vec<KeptSeries>) -> Vec<KeptSeries> {
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
                    x.append(b.next().expect("peeked"));
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

/// A range query's answer through the cache.
#[derive(Debug)]
pub enum Answer {
    /// The evaluation's output, not kept (not a matrix).
    Output(QueryOutput),
    /// Series shared with the cache: the answer is their points in `[from, to]` (series
    /// without any there are left out).
    /// `refresh`: some of its steps were kept from an earlier request.
    Shared {
        series: Arc<Vec<KeptSeries>>,
        from: i64,
        to: i64,
        annotations: Vec<Annotation>,
        stats: QueryStats,
        refresh: bool,
    },
}

impl From<QueryOutput> for Answer {
    fn from(out: QueryOutput) -> Answer {
        Answer::Output(out)
    }
}

impl Answer {
    pub fn annotations(&self) -> &[Annotation] {
        match self {
            Answer::Output(out) => &out.annotations,
            Answer::Shared { annotations, .. } => annotations,
        }
    }

    pub fn stats(&self) -> &QueryStats {
        match self {
            Answer::Output(out) => &out.stats,
            Answer::Shared { stats, .. } => stats,
        }
    }

    /// The kept series a refresh (an answer partly or wholly from kept steps) is written
    /// from, and its window (for work after the answer that pays off only if it is refreshed
    /// again).
    pub fn refreshed(&self) -> Option<(Arc<Vec<KeptSeries>>, i64, i64)> {
        match self {
            Answer::Shared { series, from, to, refresh: true, .. } => Some((series.clone(), *from, *to)),
            _ => None,
        }
    }

    /// What is written for it.
    pub fn body(&self) -> crate::query_json::Body<'_> {
        match self {
            Answer::Output(out) => crate::query_json::Body::Value(&out.value),
            Answer::Shared { series, from, to, .. } => crate::query_json::Body::Kept(series, *from, *to),
        }
    }
}

/// Evaluates the range query `expr` over `[start, end]` through the cache: kept steps are
/// taken, the rest evaluated by `eval(from)` (the same query from step `from` to `end`), the
/// result kept for the next request. `now` is the wall clock in ms, `changes` the database's;
/// up to `threads` threads write the text of new steps.
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
    threads: usize,
    eval: &mut dyn FnMut(i64) -> Result<QueryOutput, strata_promql::EvalError>,
) -> Result<(Answer, Outcome), strata_promql::EvalError> {
    let step = key.step_ms;
    // Before anything is read: changes from here on are seen by the next request.
    let seq = changes.seq();
    let shared = |series: Arc<Vec<KeptSeries>>, annotations, stats, refresh| Answer::Shared {
        series,
        from: start,
        to: end,
        annotations,
        stats,
        refresh,
    };
    let whole = |eval: &mut dyn FnMut(i64) -> _| {
        cache.stats.misses.fetch_add(1, Ordering::Relaxed);
        let out: QueryOutput = eval(start)?;
        let QueryOutput { value: Value::Matrix(series), annotations, stats } = out else {
            return Ok((Answer::Output(out), Outcome::Miss));
        };
        let series = Arc::new(keep_series(&series, threads));
        cache.put(key.clone(), start, end, now, seq, series.clone(), &annotations);
        Ok((shared(series, annotations, stats, false), Outcome::Miss))
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
            Ok((shared(kept.series, kept.annotations, stats, true), Outcome::Hit))
        }
        Some(kept) => {
            let fresh = eval(kept.last + step)?;
            let Value::Matrix(fresh_series) = fresh.value else {
                return whole(eval);
            };
            if fresh.annotations != kept.annotations {
                return whole(eval);
            }
            cache.stats.partial_hits.fetch_add(1, Ordering::Relaxed);
            // The kept series, taken from the cache (copied only while an answer is being
            // written from them), without the steps too new to be kept, and without the steps
            // before the start once they are a quarter of what is kept.
            cache.release(&key, &kept.series);
            let mut held = Arc::try_unwrap(kept.series).unwrap_or_else(|shared| (*shared).clone());
            let first = if (start - kept.first) * 4 > kept.last - kept.first { start } else { kept.first };
            for s in &mut held {
                s.keep(first, kept.last);
            }
            held.retain(|s| !s.is_empty());
            let merged = Arc::new(merge(held, keep_series(&fresh_series, threads)));
            cache.put(key, first, end, now, seq, merged.clone(), &fresh.annotations);
            Ok((shared(merged, fresh.annotations, fresh.stats, true), Outcome::PartialHit))
        }
        None => whole(eval),
    }
}
