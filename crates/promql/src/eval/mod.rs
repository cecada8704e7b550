//! Step-vectorized evaluation.
//!
//! Every node is evaluated once for all the steps of a query: a node's result is a list of
//! series, each with at most one point per step, and a scalar is one float per step. A selector
//! therefore reads each series once across the whole range and slides a window over its samples
//! (no re-seek per step); series are processed in parallel across cores; binary operators and
//! aggregations then combine whole series step by step.
//!
//! Semantics are Prometheus 3's: lookback windows and range windows are left-open
//! (`(t - 5m, t]`), stale markers end a series, `@` pins a selector to one time, and the
//! metric name is removed at the end of evaluation (delayed name removal), so
//! `label_replace(rate(x[1m]), "a", "$1", "__name__", "(.*)")` still sees the name.

mod aggregate;
mod binary;
mod functions;
mod info;
pub(crate) mod labels;
mod native_histograms;
pub(crate) mod point_buffers;
mod range_functions;
pub(crate) mod range_histograms;
mod rollup;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration as StdDuration, Instant};

use std::sync::Arc;

use strata_model::{is_stale_nan, CounterResetHint, Labels, Matcher, METRIC_NAME};
use strata_tsdb::chunkenc::TypedValue;
use strata_tsdb::querier::Series as StoredSeries;

use crate::ast::*;
use crate::error::{exec, EvalError};
use crate::value::{Annotation, HPoint, Point, Series, Value};

pub use labels::prom_labels_string;
pub use rollup::SourceResolution;
use strata_tsdb::chunkenc::rollup::ColumnSet;
use strata_tsdb::db::RollupSeries;
use strata_tsdb::rollup::RollupTier;

/// Where series come from.
pub trait Storage: Sync {
    /// Series matching all matchers with samples in `[mint, maxt]`, sorted by labels.
    fn select(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<StoredSeries>, EvalError>;

    /// `select` for a reader that uses only each series' newest sample at or before `maxt`
    /// (an instant selector at one time): a storage may leave the older samples out (the
    /// head's `Querier::newest_only`).
    fn select_newest(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<StoredSeries>, EvalError> {
        self.select(matchers, mint, maxt)
    }

    /// The rollup tiers it has, finest first.
    fn rollup_tiers(&self) -> Vec<RollupTier> {
        Vec::new()
    }

    /// About how many values label `name` has among recent series (`None`: unknown).
    fn label_value_count(&self, _name: &str) -> Option<usize> {
        None
    }

    /// The tier of `interval_ms`'s buckets for the series matching `matchers`, the aggregates
    /// in `columns` (`Db::rollup_map`): each series turned into a result by `map` (on the
    /// decoding workers, in parallel), the results handed to `sink` in label order. Returns
    /// the number of matching series of native histograms instead when there are any.
    #[allow(clippy::too_many_arguments, reason = "a selection's range and its consumer")]
    fn map_rollup(
        &self,
        interval_ms: i64,
        _matchers: &[Matcher],
        _mint: i64,
        _maxt: i64,
        _columns: ColumnSet,
        _map: &RollupMapFn<'_>,
        _sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
    ) -> Result<usize, EvalError> {
        Err(EvalError::Storage(format!("no rollup tier of {interval_ms} ms")))
    }
}

/// What evaluation makes of one series' tier buckets (run on the decoding workers).
pub type RollupMapFn<'a> = dyn Fn(&RollupSeries) -> Result<Option<Series>, EvalError> + Sync + 'a;

impl Storage for strata_tsdb::head::Head {
    fn select(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<StoredSeries>, EvalError> {
        strata_tsdb::querier::Querier::new(self, mint, maxt)
            .select(matchers)
            .map_err(|e| EvalError::Storage(e.to_string()))
    }

    fn select_newest(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<StoredSeries>, EvalError> {
        strata_tsdb::querier::Querier::new(self, mint, maxt)
            .newest_only()
            .select(matchers)
            .map_err(|e| EvalError::Storage(e.to_string()))
    }

    fn label_value_count(&self, name: &str) -> Option<usize> {
        Some(strata_tsdb::head::Head::label_value_count(self, name))
    }
}

impl Storage for strata_tsdb::Db {
    fn select(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<StoredSeries>, EvalError> {
        self.querier(mint, maxt).select(matchers).map_err(|e| EvalError::Storage(e.to_string()))
    }

    fn select_newest(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<StoredSeries>, EvalError> {
        self.querier(mint, maxt).newest_only().select(matchers).map_err(|e| EvalError::Storage(e.to_string()))
    }

    fn label_value_count(&self, name: &str) -> Option<usize> {
        Some(self.head().label_value_count(name))
    }

    fn rollup_tiers(&self) -> Vec<RollupTier> {
        strata_tsdb::Db::rollup_tiers(self)
    }

    fn map_rollup(
        &self,
        interval_ms: i64,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        columns: ColumnSet,
        map: &RollupMapFn<'_>,
        sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
    ) -> Result<usize, EvalError> {
        map_rollup_with(self, interval_ms, matchers, mint, maxt, columns, &Default::default(), map, sink)
            .map_err(|e| EvalError::Storage(e.to_string()))?
    }
}

/// Frees the buffers evaluation keeps for the next query: the shared point buffers, and this
/// thread's own. For a thread that has gone idle (the server calls it from the worker pool's
/// idle hook), so that an idle server does not hold a busy one's memory.
pub fn release_idle_memory() {
    point_buffers::POOL.clear();
    aggregate::release_thread_buffers();
}

/// `Db::rollup_map` with a consumer that fails with the engine's errors: the first one (from
/// `map` or `sink`) stops the read and is returned as it is (`Ok(Err(e))`); storage errors are
/// the outer ones.
#[allow(clippy::too_many_arguments, reason = "Db::rollup_map's arguments")]
pub fn map_rollup_with(
    db: &strata_tsdb::Db,
    interval_ms: i64,
    matchers: &[Matcher],
    mint: i64,
    maxt: i64,
    columns: ColumnSet,
    limits: &strata_tsdb::querier::ReadLimits<'_>,
    map: &RollupMapFn<'_>,
    sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
) -> Result<Result<usize, EvalError>, strata_tsdb::Error> {
    let mut failed: Option<EvalError> = None;
    // PromQL's windows `(t - r, t]` are answered by right-closed tiers only.
    let tier = strata_tsdb::block::RollupMeta { interval_ms, closed: strata_tsdb::rollup::Closed::Right };
    let out = db.rollup_map(tier, matchers, mint, maxt, columns, limits, map, &mut |mapped| {
        mapped.and_then(|s| s.map_or(Ok(()), &mut *sink)).map_err(|e| {
            failed = Some(e);
            strata_tsdb::Error::Stopped(strata_tsdb::error::Stop::Canceled)
        })
    });
    match (out, failed) {
        (_, Some(e)) => Ok(Err(e)),
        (Ok(n), None) => Ok(Ok(n)),
        (Err(e), None) => Err(e),
    }
}

/// Engine settings; the defaults are Prometheus'.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// How far back an instant selector looks for a sample.
    pub lookback_ms: i64,
    /// Resolution of a subquery written without one (`x[1h:]`).
    pub subquery_step_ms: i64,
    /// Most points a query may hold at once.
    pub max_samples: usize,
    pub timeout: StdDuration,
    /// Threads used to evaluate selectors over many series.
    pub parallelism: usize,
    /// Read samples' start times (`use-start-timestamps`, experimental in Prometheus too):
    /// `rate`, `increase`, `irate` and `resets` find the resets they reveal and rate delta
    /// series by them, and `start_timestamp()` returns them.
    pub use_start_timestamps: bool,
    /// Which rollup tiers a query may be answered from (`eval::rollup`).
    pub max_source_resolution: SourceResolution,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            lookback_ms: 5 * 60 * 1000,
            subquery_step_ms: 60 * 1000,
            max_samples: 50_000_000,
            timeout: StdDuration::from_secs(120),
            parallelism: std::thread::available_parallelism().map_or(1, |n| n.get()),
            use_start_timestamps: false,
            max_source_resolution: SourceResolution::Auto,
        }
    }
}

/// A query's result and its annotations.
#[derive(Debug, Clone)]
pub struct QueryOutput {
    pub value: Value,
    pub annotations: Vec<Annotation>,
    pub stats: QueryStats,
}

/// What an evaluation read and held (Prometheus' `stats.samples`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueryStats {
    /// Samples read from storage (buckets, when a rollup tier answered), counting each time a
    /// selector reads them.
    pub samples_read: usize,
    /// The most points the evaluation held at once (what `max_samples` limits).
    pub peak_samples: usize,
}

#[derive(Debug, Clone, Default)]
pub struct Engine {
    pub opts: EngineOptions,
}

/// Below this many series a selector is evaluated on the calling thread.
const PARALLEL_SERIES_MIN: usize = 512;

/// How many series ahead of its read a loop over a selection asks for a series' chunk list and
/// labels, and then for its first chunk's bytes (`StoredSeries::prefetch`, `prefetch_data`):
/// each is an allocation of its own, and waiting for the first touch of each was most of what
/// `read_floats` itself cost in a one-step count over 180k head series (`perf annotate`).
const PREFETCH_LIST_AHEAD: usize = 8;
const PREFETCH_DATA_AHEAD: usize = 4;

/// The prefetches for the `k`-th of the reads `at(0..end)` of `stored`: the chunk list and labels
/// of the read `PREFETCH_LIST_AHEAD` later, the chunk bytes of the one `PREFETCH_DATA_AHEAD` later.
fn prefetch_ahead(stored: &[StoredSeries], at: impl Fn(usize) -> usize, k: usize, end: usize) {
    if k + PREFETCH_LIST_AHEAD < end {
        stored[at(k + PREFETCH_LIST_AHEAD)].prefetch();
    }
    if k + PREFETCH_DATA_AHEAD < end {
        stored[at(k + PREFETCH_DATA_AHEAD)].prefetch_data();
    }
}

/// Points a selection worker's batch of mapped series holds, about, before it hands them to
/// the consumer at once: 32 series of a day at a 60 s step. Fewer points per series make
/// larger batches (an instant query's series hold one point each), between these bounds, so
/// that handing over (a wake-up of the consumer per batch) stays a small part of the work.
const PIPELINE_POINTS: usize = 32 * 1440;
const PIPELINE_BATCH_MIN: usize = 32;
const PIPELINE_BATCH_MAX: usize = 1024;
/// Batches a selection worker may hold ahead of the consumer.
const PIPELINE_DEPTH: usize = 2;
/// Groups are dealt to the workers of a grouped selection only if no worker gets more than
/// this fraction above an even share of the series (in eighths); otherwise the pipeline, whose
/// workers take batches in turn, spreads the work better (three groups on two workers).
const GROUPS_UNEVEN_EIGHTHS: usize = 1;
/// A selection whose series hold this many steps in all is mapped on background threads
/// (`strata_tsdb::workers::background`), as one of `BACKGROUND_SERIES` series is: 10,000 series
/// over a day at a 60 s step. Small in this crate's tests, so that their selections take that
/// path too.
const BACKGROUND_POINTS: usize = if cfg!(test) { 4096 } else { 16 << 20 };
/// A range query is evaluated in time slices (`eval_in_time_slices`) only with at least this
/// many steps per slice.
const SLICE_STEPS_MIN: usize = 120;
/// An accumulating aggregation with at least this many groups per thread (as the head's label
/// values count them) folds on the selection's workers rather than in time slices.
const GROUPS_PER_THREAD: usize = 8;

/// Aggregations over fewer steps than this are folded by the pipeline's consumer.
const GROUPED_STEPS_MIN: usize = 8;

/// Reads one selected series into a reused buffer and maps it to its result, if any.
type MapOne<'f> = dyn Fn(&StoredSeries, &mut SeriesBuf) -> Result<Option<Series>, EvalError> + Sync + 'f;

/// Where a stream of series goes.
pub(crate) enum Feed<'s> {
    /// One consumer, in label order.
    Series(&'s mut dyn FnMut(Series) -> Result<(), EvalError>),
    /// An aggregation's parts, fed on the selection's workers (see `GroupSink`).
    Groups(&'s dyn GroupSink),
}

/// An aggregation fed on the selection's workers. Its groups are dealt to parts, one part per
/// worker; a part gets all the members of its groups, each on that worker and in label order.
/// So every group folds its members in the order one consumer would, and its sums are the same
/// to the last bit, while the points of a member are folded where they were computed, not sent
/// to another core, and no single consumer folds for all the workers.
pub(crate) trait GroupSink: Sync {
    /// A grouper of the aggregation's input by its groups' labels (the stream's result for a
    /// selected series has that series' labels).
    fn grouper(&self) -> aggregate::Grouper;
    /// Called once, before any `put`: the groups, numbered by first appearance in the
    /// selection, and how many parts they are dealt to.
    fn start(&self, groups: Vec<Labels>, parts: usize);
    /// The result for the selection's `index`-th series, a member of group `group`, dealt to
    /// `part`. Each part is fed from one thread at a time, with its members in selection order.
    fn put(&self, part: usize, group: usize, index: usize, s: Series) -> Result<(), EvalError>;
}

/// The order part `part` of a grouped selection takes its series in (indexes of `stored`).
/// Any order that keeps each group's members in selection order folds every group as one
/// consumer would; of three such orders (selection order, group after group, and the groups'
/// first members, then their second ones, …) it is the one where most neighbours seem to
/// share their timestamps, since a range function reuses the window plan of the series before
/// for a series with the same timestamps, as a scrape's series have. Group after group suits
/// `sum by (instance)`; the members in turn suit `sum by (device)`, whose groups each hold one
/// series per instance; selection order suits buckets of a histogram, which sit together.
fn part_order(stored: &[StoredSeries], group_of: &[usize], part_of: &[usize], part: usize) -> Vec<usize> {
    let in_selection: Vec<usize> = (0..stored.len()).filter(|&i| part_of[group_of[i]] == part).collect();
    let mut members_before = vec![0usize; part_of.len()];
    let rank: Vec<usize> = in_selection
        .iter()
        .map(|&i| {
            let g = group_of[i];
            members_before[g] += 1;
            members_before[g] - 1
        })
        .collect();
    let ranks = rank.iter().max().map_or(0, |r| r + 1);
    let by_group = stable_sort_by_key(&in_selection, |k| group_of[in_selection[k]], part_of.len());
    let by_rank = stable_sort_by_key(&in_selection, |k| rank[k], ranks);
    let alike = |order: &[usize]| order.windows(2).filter(|p| same_times(&stored[p[0]], &stored[p[1]])).count();
    let (a, b, c) = (alike(&in_selection), alike(&by_group), alike(&by_rank));
    if a >= b && a >= c {
        in_selection
    } else if b >= c {
        by_group
    } else {
        by_rank
    }
}

/// `items` ordered by `key` of their positions (below `keys`), equal keys in their order.
fn stable_sort_by_key(items: &[usize], key: impl Fn(usize) -> usize, keys: usize) -> Vec<usize> {
    let mut starts = vec![0usize; keys + 1];
    for k in 0..items.len() {
        starts[key(k) + 1] += 1;
    }
    for j in 0..keys {
        starts[j + 1] += starts[j];
    }
    let mut out = vec![0usize; items.len()];
    for (k, &item) in items.iter().enumerate() {
        let slot = &mut starts[key(k)];
        out[*slot] = item;
        *slot += 1;
    }
    out
}

/// Whether two selected series seem to hold samples at the same times: their chunks in range
/// start and end together (series of one scrape target do; staggered targets' do not).
fn same_times(a: &StoredSeries, b: &StoredSeries) -> bool {
    let ends = |s: &StoredSeries| (s.chunks.first().map(|c| c.mint), s.chunks.last().map(|c| c.maxt), s.chunks.len());
    ends(a) == ends(b)
}

/// Deals groups of `sizes[g]` members to `parts` parts (largest group first, each to the part
/// with the fewest members so far), or `None` if that leaves one part over an even share by
/// more than `GROUPS_UNEVEN_EIGHTHS` eighths.
fn deal_groups(sizes: &[usize], parts: usize) -> Option<Vec<usize>> {
    assert!(parts > 0, "dealing to no part");
    let total: usize = sizes.iter().sum();
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&g| std::cmp::Reverse(sizes[g]));
    let mut loads = vec![0usize; parts];
    let mut part_of = vec![0usize; sizes.len()];
    for g in order {
        let (p, _) = loads.iter().enumerate().min_by_key(|&(p, &l)| (l, p)).expect("at least one part");
        part_of[g] = p;
        loads[p] += sizes[g];
    }
    let most = loads.iter().copied().max().unwrap_or(0);
    // most ≤ (1 + k/8) · total / parts
    (most * parts * 8 <= total * (8 + GROUPS_UNEVEN_EIGHTHS)).then_some(part_of)
}

impl Engine {
    pub fn new(opts: EngineOptions) -> Engine {
        Engine { opts }
    }

    /// Evaluates `expr` at one time.
    pub fn instant(&self, st: &dyn Storage, expr: &Expr, t: i64) -> Result<QueryOutput, EvalError> {
        self.instant_with_cancel(st, expr, t, None)
    }

    pub fn instant_with_cancel(
        &self,
        st: &dyn Storage,
        expr: &Expr,
        t: i64,
        cancel: Option<&AtomicBool>,
    ) -> Result<QueryOutput, EvalError> {
        self.evaluate(st, expr, t, t, 0, cancel, |ev| {
            let ctx = Ctx { start: t, step: 1, n: 1 };
            let expr = &with_stats_selectors(expr);
            let v = ev.eval(expr, &ctx)?;
            Ok(match v {
                Val::Scalar(s) => Value::Scalar { t, v: s[0] },
                Val::Str(s) => Value::String { t, s },
                Val::Vector(series) => {
                    let series = ev.finish_names(series)?;
                    Value::Vector(series)
                }
                Val::Matrix(mut series) => {
                    series.sort_by(|a, b| a.labels.cmp(&b.labels));
                    Value::Matrix(series)
                }
            })
        })
    }

    /// Runs `run` on an evaluator over a rollup tier when the planner finds one that answers
    /// `expr` (noting it in an info annotation), else, or when the tier turns out unable to
    /// (`RollupUnsuitable`), on raw data with the same deadline.
    #[allow(clippy::too_many_arguments, reason = "the query's range and its evaluation, passed through")]
    fn evaluate(
        &self,
        st: &dyn Storage,
        expr: &Expr,
        start: i64,
        end: i64,
        step: i64,
        cancel: Option<&AtomicBool>,
        run: impl Fn(&Evaluator) -> Result<Value, EvalError>,
    ) -> Result<QueryOutput, EvalError> {
        let mut ev = Evaluator::new(self, st, start, end, step, cancel);
        if let Some(tier) = ev.plan_tier(expr, start, step, &promql_tiers(st)) {
            ev.tier = Some(tier);
            match run(&ev) {
                Err(EvalError::RollupUnsuitable(_)) => {}
                Err(e) => return Err(e),
                Ok(value) => {
                    let buckets = ev.buckets_read.load(Ordering::Relaxed);
                    // Without the count read (it is in the stats): the result cache compares
                    // the annotations of the steps it kept with those of the steps it adds.
                    ev.info(
                        0,
                        format!(
                            "answered from the {} rollup tier; max_source_resolution=raw reads raw samples",
                            strata_model::format_duration_ms(tier.interval_ms)
                        ),
                    );
                    let stats = QueryStats { samples_read: buckets, peak_samples: ev.peak.load(Ordering::Relaxed) };
                    return Ok(QueryOutput { value, annotations: ev.into_annotations(), stats });
                }
            }
            let deadline = ev.deadline;
            ev = Evaluator::new(self, st, start, end, step, cancel);
            ev.deadline = deadline;
        }
        let value = run(&ev)?;
        let stats = QueryStats {
            samples_read: ev.samples_read.load(Ordering::Relaxed),
            peak_samples: ev.peak.load(Ordering::Relaxed),
        };
        Ok(QueryOutput { value, annotations: ev.into_annotations(), stats })
    }

    /// The rollup tier the planner picks for a range query of `expr` from `start` at `step`
    /// (`None`: raw data), before evaluating it: a tier that turns out unable to answer (native
    /// histograms match) falls back to raw data then. The choice depends on the start only
    /// through its alignment to the tiers' intervals, which every later step of the same range
    /// shares (`start + k * step`, with the step a multiple of the interval): the steps of a
    /// range evaluated in parts are planned as the whole range is.
    pub fn planned_tier(&self, st: &dyn Storage, expr: &Expr, start: i64, step: i64) -> Option<RollupTier> {
        let tiers = promql_tiers(st);
        if tiers.is_empty() {
            return None;
        }
        Evaluator::new(self, st, start, start, step, None).plan_tier(expr, start, step, &tiers)
    }

    /// Evaluates `expr` at `start, start+step, … ≤ end`; the result is a matrix sorted by labels.
    pub fn range(
        &self,
        st: &dyn Storage,
        expr: &Expr,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<QueryOutput, EvalError> {
        self.range_with_cancel(st, expr, start, end, step, None)
    }

    pub fn range_with_cancel(
        &self,
        st: &dyn Storage,
        expr: &Expr,
        start: i64,
        end: i64,
        step: i64,
        cancel: Option<&AtomicBool>,
    ) -> Result<QueryOutput, EvalError> {
        if step <= 0 {
            return Err(exec("zero or negative query resolution step widths are not accepted"));
        }
        if end < start {
            return Err(exec("end timestamp must not be before start time"));
        }
        match expr.value_type() {
            ValueType::Scalar | ValueType::Vector => {}
            t => {
                return Err(exec(format!(
                    "invalid expression type \"{}\" for range query, must be Scalar or instant Vector",
                    t.name()
                )))
            }
        }
        let n = ((end - start) / step) as usize + 1;
        self.evaluate(st, expr, start, end, step, cancel, |ev| {
            let ctx = Ctx { start, step, n };
            let expr = &with_stats_selectors(expr);
            let slices = ev.threads().min(n / SLICE_STEPS_MIN);
            let value = if slices > 1 && ev.tier.is_none() && gains_from_time_slices(expr, st, slices) {
                ev.eval_in_time_slices(expr, &ctx, slices)?
            } else {
                ev.eval(expr, &ctx)?
            };
            let series = match value {
                Val::Scalar(s) => {
                    vec![Series::new(
                        Labels::empty(),
                        s.iter().enumerate().map(|(i, &f)| Point { t: ctx.ts(i), f }).collect(),
                    )]
                }
                Val::Vector(series) => ev.finish_names(series)?,
                _ => return Err(exec("range query must evaluate to a scalar or an instant vector")),
            };
            let mut series: Vec<Series> = series.into_iter().filter(|s| !s.is_empty()).collect();
            series.sort_by(|a, b| a.labels.cmp(&b.labels));
            Ok(Value::Matrix(series))
        })
    }
}

/// The tiers PromQL may read: left-closed ones (Graphite's) do not cut PromQL's windows
/// `(t - r, t]`.
fn promql_tiers(st: &dyn Storage) -> Vec<RollupTier> {
    st.rollup_tiers().into_iter().filter(|t| t.closed.is_right()).collect()
}

/// Whether a range query of `expr` is better evaluated in `slices` time slices than with its
/// selections spread over the threads: an aggregation (or a function of one, as
/// `histogram_quantile(0.99, sum by (le) (…))`), whose answer holds few series so that joining
/// the slices costs little, and which does not fold on the selection's workers, because it
/// orders or picks series (`topk`, `quantile`) or has fewer groups than `GROUPS_PER_THREAD`
/// times the slices, as far as the storage's label values tell (`sum`, `sum by (device)`).
/// Dealt groups did better than slices for `sum by (instance)` over 131k series (750 against
/// 785 ms), slices did better for `sum by (device)` (3 groups, 20.0 against 16.4 ms) and for
/// `topk` (29.4 against 25.4 ms).
fn gains_from_time_slices(expr: &Expr, st: &dyn Storage, slices: usize) -> bool {
    let few_groups = |a: &Aggregate| {
        if !aggregate::is_accumulating(a.op) {
            return true;
        }
        if a.without {
            return false;
        }
        let mut groups = 1usize;
        for name in &a.grouping {
            // No value in the head says nothing (data only in blocks): not sliced.
            match st.label_value_count(name) {
                Some(n) if n > 0 => groups = groups.saturating_mul(n),
                _ => return false,
            }
        }
        groups < GROUPS_PER_THREAD * slices
    };
    match &expr.unparen().kind {
        ExprKind::Aggregate(a) => few_groups(a),
        ExprKind::Call(c) => {
            c.args.iter().any(|e| matches!(&e.unparen().kind, ExprKind::Aggregate(a) if few_groups(a)))
        }
        _ => false,
    }
}

/// `expr` with `stats_only` set on the selectors whose histograms only feed
/// `histogram_count`, `histogram_sum` or `histogram_avg`: the nearest enclosing function of
/// those or of the bucket readers (`histogram_quantile`, `histogram_fraction`, …) decides;
/// other functions and aggregations pass the decision through; a binary operator's sides and
/// a subquery start afresh (Prometheus reads a subquery's samples by seeking, without the
/// statistics-only reader).
fn with_stats_selectors(expr: &Expr) -> Expr {
    fn mark(e: &mut Expr, stats: bool) {
        match &mut e.kind {
            ExprKind::Vector(sel) => sel.stats_only = stats,
            ExprKind::Matrix(m) => m.vector.stats_only = stats,
            ExprKind::Subquery(s) => mark(&mut s.expr, false),
            ExprKind::Paren(x) | ExprKind::Neg(x) | ExprKind::Pos(x) => mark(x, stats),
            ExprKind::Binary(b) => {
                mark(&mut b.lhs, false);
                mark(&mut b.rhs, false);
            }
            ExprKind::Aggregate(a) => {
                if let Some(p) = &mut a.param {
                    mark(p, false);
                }
                mark(&mut a.expr, stats);
            }
            ExprKind::Call(c) => {
                let stats = match c.func.name {
                    "histogram_count" | "histogram_sum" | "histogram_avg" => true,
                    "histogram_quantile"
                    | "histogram_quantiles"
                    | "histogram_fraction"
                    | "histogram_stddev"
                    | "histogram_stdvar" => false,
                    _ => stats,
                };
                c.args.iter_mut().for_each(|a| mark(a, stats));
            }
            ExprKind::Number(_) | ExprKind::String(_) => {}
        }
    }
    let mut e = expr.clone();
    mark(&mut e, false);
    e
}

/// The steps a node is evaluated at: `start + i*step` for `i < n`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ctx {
    pub start: i64,
    pub step: i64,
    pub n: usize,
}

impl Ctx {
    pub fn ts(&self, i: usize) -> i64 {
        self.start + i as i64 * self.step
    }

    pub fn end(&self) -> i64 {
        self.ts(self.n - 1)
    }

    /// The step index of timestamp `t` (which must be one of the steps).
    pub fn index(&self, t: i64) -> usize {
        ((t - self.start) / self.step) as usize
    }

    /// Room for the points a series with these samples can have: one per step its samples
    /// (each valid for `window` after it) can reach, all steps when pinned by `@`. Sized once
    /// rather than grown step by step, and not the whole range for a short-lived series.
    pub fn points_capacity(&self, samples: &[Point], window: i64, pinned: bool) -> usize {
        let span = samples.first().zip(samples.last()).map(|(a, b)| (a.t, b.t));
        self.capacity_for_span(span, window, pinned)
    }

    /// `points_capacity` for data from `first` to `last` (`None`: no data).
    pub fn capacity_for_span(&self, span: Option<(i64, i64)>, window: i64, pinned: bool) -> usize {
        match span {
            Some((first, last)) if !pinned => {
                let span = last.saturating_sub(first).saturating_add(window);
                usize::try_from(span / self.step.max(1) + 1).unwrap_or(usize::MAX).min(self.n)
            }
            Some(_) => self.n,
            None => 0,
        }
    }

    /// Finds step indexes of increasing timestamps without a division each.
    pub fn walker(&self) -> StepWalker<'_> {
        StepWalker { ctx: self, i: 0 }
    }

    /// Where `points` (at step times, in order, as a series' are) start, and whether they fill
    /// consecutive steps from there (a series present throughout its span: its k-th point is
    /// at step `from + k`); `None` for no points. Two divisions per series, so that loops over
    /// its points count or walk to their steps (`walker_from`) rather than divide for each
    /// (that division was most of a 30-day quantile's transposition).
    #[inline]
    pub fn first_step(&self, points: &[Point]) -> Option<(usize, bool)> {
        let (first, last) = (points.first()?, points.last()?);
        let from = self.index(first.t);
        Some((from, self.index(last.t) - from + 1 == points.len()))
    }

    /// A walker over the steps from `from` on (`first_step`'s).
    pub fn walker_from(&self, from: usize) -> StepWalker<'_> {
        StepWalker { ctx: self, i: from }
    }

    /// Calls `f` with each point's step index and the point, counted or walked (`first_step`).
    #[inline]
    pub fn each_step<'p>(&self, points: &'p [Point], mut f: impl FnMut(usize, &'p Point)) {
        match self.first_step(points) {
            None => {}
            Some((from, true)) => {
                for (k, p) in points.iter().enumerate() {
                    debug_assert_eq!(self.ts(from + k), p.t, "points are at step times, in order");
                    f(from + k, p);
                }
            }
            Some((from, false)) => {
                let mut steps = self.walker_from(from);
                for p in points {
                    f(steps.index(p.t), p);
                }
            }
        }
    }
}

/// Step indexes of a series' points, which come in step order.
#[derive(Debug)]
pub(crate) struct StepWalker<'a> {
    ctx: &'a Ctx,
    i: usize,
}

impl StepWalker<'_> {
    #[inline]
    pub fn index(&mut self, t: i64) -> usize {
        while self.ctx.ts(self.i) < t {
            self.i += 1;
        }
        debug_assert_eq!(self.ctx.ts(self.i), t, "points are at step times, in order");
        self.i
    }
}

/// An intermediate value: per-step scalars, or series with at most one point per step.
#[derive(Debug)]
pub(crate) enum Val {
    Scalar(Vec<f64>),
    Str(String),
    Vector(Vec<Series>),
    /// Raw samples of a range selector or subquery (only as an instant query's result).
    Matrix(Vec<Series>),
}

/// The time window a range selector or subquery reads at each step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RangeSpec {
    pub range: i64,
    pub offset: i64,
    pub at: Option<i64>,
    pub mode: RangeMode,
}

impl RangeSpec {
    /// The window's end at step time `t`.
    pub fn end_at(&self, t: i64) -> i64 {
        self.at.unwrap_or(t) - self.offset
    }
}

pub(crate) struct Evaluator<'a> {
    engine: &'a Engine,
    st: &'a dyn Storage,
    /// The query's own start and end (for `@ start()`, `@ end()`, `range()`), and its step.
    query_start: i64,
    query_end: i64,
    query_step: i64,
    deadline: Instant,
    cancel: Option<&'a AtomicBool>,
    held: AtomicUsize,
    pub annotations: parking_lot::Mutex<Vec<Annotation>>,
    /// The rollup tier selectors read, if the planner picked one.
    tier: Option<RollupTier>,
    /// Buckets read from the tier.
    buckets_read: AtomicUsize,
    /// Raw samples read from storage.
    samples_read: AtomicUsize,
    /// The most points `held` reached.
    peak: AtomicUsize,
}

impl<'a> Evaluator<'a> {
    fn new(
        engine: &'a Engine,
        st: &'a dyn Storage,
        start: i64,
        end: i64,
        step: i64,
        cancel: Option<&'a AtomicBool>,
    ) -> Evaluator<'a> {
        Evaluator {
            engine,
            st,
            query_start: start,
            query_end: end,
            query_step: step,
            deadline: Instant::now() + engine.opts.timeout,
            cancel,
            held: AtomicUsize::new(0),
            annotations: parking_lot::Mutex::new(Vec::new()),
            tier: None,
            buckets_read: AtomicUsize::new(0),
            samples_read: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// The annotations raised, in one order (sorted): workers evaluating series in parallel
    /// raise them in any order, and the result cache compares the sets of two evaluations.
    fn into_annotations(self) -> Vec<Annotation> {
        let mut out = self.annotations.into_inner();
        out.sort();
        out
    }

    pub fn warn(&self, pos: usize, msg: impl Into<String>) {
        self.annotate(false, pos, msg.into());
    }

    pub fn info(&self, pos: usize, msg: impl Into<String>) {
        self.annotate(true, pos, msg.into());
    }

    fn annotate(&self, info: bool, pos: usize, msg: String) {
        let mut a = self.annotations.lock();
        if !a.iter().any(|x| x.msg == msg && x.pos == pos && x.info == info) {
            a.push(Annotation { info, msg, pos });
        }
    }

    /// Fails once the deadline has passed or the query was cancelled.
    pub fn check(&self, stage: &'static str) -> Result<(), EvalError> {
        if self.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(EvalError::Canceled(stage));
        }
        if Instant::now() > self.deadline {
            return Err(EvalError::Timeout(stage));
        }
        Ok(())
    }

    /// Accounts for `n` more points held; fails past the query's samples limit.
    pub fn take(&self, n: usize, stage: &'static str) -> Result<(), EvalError> {
        let now = self.held.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
        if now > self.engine.opts.max_samples {
            return Err(EvalError::TooManySamples(stage));
        }
        Ok(())
    }

    pub fn release(&self, n: usize) {
        self.held.fetch_sub(n.min(self.held.load(Ordering::Relaxed)), Ordering::Relaxed);
    }

    /// The threads this evaluation may use from the calling thread: one inside a time slice
    /// (`workers::serial`: the slices are the parallelism), else `EngineOptions::parallelism`.
    pub(crate) fn threads(&self) -> usize {
        strata_tsdb::workers::threads_here(self.engine.opts.parallelism)
    }

    /// Evaluates `e` over `ctx` cut into `slices` consecutive runs of steps, each on its own
    /// thread with no further parallelism, and joins the pieces. Every step of a range query
    /// is computed from the data alone (the result cache splices pieces evaluated apart on the
    /// same ground; query-wide `@ start()`/`@ end()` stay the whole query's here), so the
    /// answer is the one evaluation over the whole range gives. A slice reads only its part
    /// of the range: blocks are divided between the threads, no series' points cross to
    /// another core, and no consumer folds for the others.
    fn eval_in_time_slices(&self, e: &Expr, ctx: &Ctx, slices: usize) -> Result<Val, EvalError> {
        let per = ctx.n.div_ceil(slices);
        let pieces: Vec<Ctx> = (0..ctx.n)
            .step_by(per)
            .map(|first| Ctx { start: ctx.ts(first), step: ctx.step, n: per.min(ctx.n - first) })
            .collect();
        let vals: Vec<Result<Val, EvalError>> = strata_tsdb::workers::scope(|scope| {
            let handles: Vec<_> = pieces
                .iter()
                .map(|piece| {
                    scope.spawn(move || {
                        let _one_thread = strata_tsdb::workers::serial();
                        self.eval(e, piece)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        let mut joined: Option<Val> = None;
        for v in vals {
            joined = Some(match (joined, v?) {
                (None, v) => v,
                (Some(Val::Scalar(mut a)), Val::Scalar(b)) => {
                    a.extend(b);
                    Val::Scalar(a)
                }
                (Some(Val::Vector(mut a)), Val::Vector(b)) => {
                    // The same series in later slices: its later points.
                    let mut at: HashMap<(Labels, bool), usize> =
                        a.iter().enumerate().map(|(i, s)| ((s.labels.clone(), s.drop_name), i)).collect();
                    for s in b {
                        match at.entry((s.labels.clone(), s.drop_name)) {
                            std::collections::hash_map::Entry::Occupied(e) => {
                                let earlier = &mut a[*e.get()];
                                earlier.points.extend(s.points);
                                earlier.hists.extend(s.hists);
                            }
                            std::collections::hash_map::Entry::Vacant(e) => {
                                e.insert(a.len());
                                a.push(s);
                            }
                        }
                    }
                    Val::Vector(a)
                }
                _ => return Err(exec("time slices of a range query evaluated to different types")),
            });
        }
        joined.ok_or_else(|| exec("a range query with no step"))
    }

    pub(crate) fn lookback(&self) -> i64 {
        self.engine.opts.lookback_ms
    }

    fn duration_ms(&self, d: &Duration) -> i64 {
        d.ms(self.query_step, self.query_end - self.query_start)
    }

    fn at_ms(&self, at: Option<At>) -> Option<i64> {
        at.map(|a| match a {
            At::Ms(ms) => ms,
            At::Start => self.query_start,
            At::End => self.query_end,
        })
    }

    pub(crate) fn eval(&self, e: &Expr, ctx: &Ctx) -> Result<Val, EvalError> {
        self.check("query evaluation")?;
        match &e.kind {
            ExprKind::Number(n) => Ok(Val::Scalar(vec![*n; ctx.n])),
            ExprKind::String(s) => match s {
                Ok(s) => Ok(Val::Str(s.clone())),
                Err(b) => Err(exec(format!("invalid UTF-8 in string {}", labels::go_quote_bytes(b)))),
            },
            ExprKind::Paren(inner) | ExprKind::Pos(inner) => self.eval(inner, ctx),
            ExprKind::Neg(inner) if inner.value_type() == ValueType::Scalar => {
                let mut v = self.eval_scalar(inner, ctx)?;
                v.iter_mut().for_each(|x| *x = -*x);
                Ok(Val::Scalar(v))
            }
            // Selectors, negation, range and element-wise functions, vector/scalar operations.
            _ if e.value_type() == ValueType::Vector && self.streams(e) => {
                Ok(Val::Vector(self.collect("query evaluation", |sink| self.stream(e, ctx, sink))?))
            }
            ExprKind::Matrix(_) | ExprKind::Subquery(_) => {
                // Only an instant query's top level asks for raw range samples.
                let spec = self.range_spec(e)?;
                let t_end = spec.end_at(ctx.start);
                let window = |labels: &Labels, samples: &[Point], hists: &[HPoint], _: Starts<'_>, _drop: bool| {
                    let inside = |t: i64| t > t_end - spec.range && t <= t_end;
                    let points: Vec<Point> = samples.iter().copied().filter(|p| inside(p.t)).collect();
                    let hists: Vec<HPoint> = hists.iter().filter(|p| inside(p.t)).cloned().collect();
                    Some(Series::with_hists(labels.clone(), points, hists))
                };
                Ok(Val::Matrix(
                    self.collect("query evaluation", |sink| self.stream_range(e, ctx, window, Feed::Series(sink)))?,
                ))
            }
            ExprKind::Vector(_) | ExprKind::Neg(_) => Err(exec("selector or negation of a non-vector")),
            ExprKind::Binary(b) => binary::eval(self, b, ctx),
            ExprKind::Aggregate(a) => aggregate::eval(self, a, ctx),
            ExprKind::Call(c) => functions::eval(self, c, e, ctx),
        }
    }

    /// Whether `stream` handles `e` itself (rather than evaluating it whole).
    fn streams(&self, e: &Expr) -> bool {
        match &e.kind {
            ExprKind::Vector(_) => true,
            ExprKind::Call(c) => range_functions::is_range_function(c.func.name) || functions::is_elementwise(c),
            ExprKind::Neg(inner) => inner.value_type() == ValueType::Vector,
            ExprKind::Binary(b) => binary::streams(b),
            _ => false,
        }
    }

    /// Evaluates an expression that must produce a vector.
    pub(crate) fn eval_vector(&self, e: &Expr, ctx: &Ctx) -> Result<Vec<Series>, EvalError> {
        match self.eval(e, ctx)? {
            Val::Vector(v) => Ok(v),
            other => Err(exec(format!("expected instant vector, got {}", val_name(&other)))),
        }
    }

    pub(crate) fn eval_scalar(&self, e: &Expr, ctx: &Ctx) -> Result<Vec<f64>, EvalError> {
        match self.eval(e, ctx)? {
            Val::Scalar(v) => Ok(v),
            other => Err(exec(format!("expected scalar, got {}", val_name(&other)))),
        }
    }

    pub(crate) fn eval_string(&self, e: &Expr, ctx: &Ctx) -> Result<String, EvalError> {
        match self.eval(e, ctx)? {
            Val::Str(s) => Ok(s),
            other => Err(exec(format!("expected string, got {}", val_name(&other)))),
        }
    }

    /// Reads the series a selector matches in `[mint, maxt]`, maps each through `f` and hands
    /// the results to `out`. `f` runs in parallel over batches of series, so memory holds a few
    /// batches of results (sized by the `steps` each result may hold), not the whole
    /// selection. Stale markers are kept (instant selectors need them).
    #[allow(clippy::too_many_arguments, reason = "a selection, how it is read, and its consumer")]
    fn for_each_selected<F>(
        &self,
        matchers: &[Matcher],
        stats_only: bool,
        newest_only: bool,
        (mint, maxt): (i64, i64),
        steps: usize,
        f: F,
        out: Feed<'_>,
    ) -> Result<(), EvalError>
    where
        F: Fn(&Labels, &[Point], &[HPoint], Starts<'_>) -> Option<Series> + Sync,
    {
        let stored = if newest_only {
            self.st.select_newest(matchers, mint, maxt)?
        } else {
            self.st.select(matchers, mint, maxt)?
        };
        // A heavy selection is mapped on background threads, as the storage read it.
        let heavy = stored.len() >= strata_tsdb::querier::BACKGROUND_SERIES
            || stored.len().saturating_mul(steps) >= BACKGROUND_POINTS;
        let _background = strata_tsdb::workers::background(heavy);
        let starts = self.engine.opts.use_start_timestamps;
        // Reads one series and maps it; `buf` is reused across series.
        let one = |s: &StoredSeries, buf: &mut SeriesBuf| -> Result<Option<Series>, EvalError> {
            read_series(s, buf)?;
            self.samples_read.fetch_add(buf.floats.len() + buf.hists.len(), Ordering::Relaxed);
            if stats_only {
                resolve_reset_hints(&mut buf.hists);
            }
            Ok(f(&s.labels, &buf.floats, &buf.hists, buf.starts()).filter(|r| !r.is_empty()))
        };
        let new_buf = || SeriesBuf { read_starts: starts, ..SeriesBuf::default() };
        let groups = match out {
            Feed::Series(sink) => {
                return self.map_in_order(&stored, None, (steps, heavy), &one, &new_buf, &mut |_, s| sink(s))
            }
            Feed::Groups(groups) => groups,
        };
        // Each series' group, numbered by first appearance.
        let mut grouper = groups.grouper();
        let mut sizes: Vec<usize> = Vec::new();
        let group_of: Vec<usize> = stored
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if let Some(ahead) = stored.get(i + PREFETCH_LIST_AHEAD) {
                    ahead.prefetch();
                }
                let (g, new) = grouper.assign_labels(&s.labels);
                if new {
                    sizes.push(0);
                }
                sizes[g] += 1;
                g
            })
            .collect();
        let labels = grouper.into_groups();
        let threads = self.threads();
        let dealt =
            (threads > 1 && stored.len() >= PARALLEL_SERIES_MIN).then(|| deal_groups(&sizes, threads)).flatten();
        let Some(part_of) = dealt else {
            // One part, fed by the pipeline's consumer.
            groups.start(labels, 1);
            let order = part_order(&stored, &group_of, &vec![0; sizes.len()], 0);
            return self.map_in_order(&stored, Some(&order), (steps, heavy), &one, &new_buf, &mut |i, s| {
                groups.put(0, group_of[i], i, s)
            });
        };
        groups.start(labels, threads);
        let failed = AtomicBool::new(false);
        strata_tsdb::workers::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|w| {
                    let (stored, group_of, part_of, one, new_buf, failed) =
                        (&stored, &group_of, &part_of, &one, &new_buf, &failed);
                    scope.spawn(move || -> Result<(), EvalError> {
                        let order = part_order(stored, group_of, part_of, w);
                        let mut buf = new_buf();
                        for (k, &i) in order.iter().enumerate() {
                            if k % 256 == 0 && failed.load(Ordering::Relaxed) {
                                return Ok(());
                            }
                            prefetch_ahead(stored, |k| order[k], k, order.len());
                            let r = (if k % 256 == 0 { self.check("series selection") } else { Ok(()) })
                                .and_then(|()| one(&stored[i], &mut buf))
                                .and_then(|r| r.map_or(Ok(()), |r| groups.put(w, group_of[i], i, r)));
                            if r.is_err() {
                                failed.store(true, Ordering::Relaxed);
                                return r;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            let mut first_error = Ok(());
            for h in handles {
                match h.join() {
                    Ok(r) => first_error = first_error.and(r),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            first_error
        })
    }

    /// Maps `stored` through `one` and hands the results to `sink` in selection order (or in
    /// `order`, indexes of `stored`), with each result's index in `stored`. `heavy`: the
    /// selection is mapped in the background (`BACKGROUND_POINTS`), which takes a worker even
    /// when this evaluation may use one thread only.
    fn map_in_order(
        &self,
        stored: &[StoredSeries],
        order: Option<&[usize]>,
        (steps, heavy): (usize, bool),
        one: &MapOne<'_>,
        new_buf: &(dyn Fn() -> SeriesBuf + Sync),
        sink: &mut dyn FnMut(usize, Series) -> Result<(), EvalError>,
    ) -> Result<(), EvalError> {
        let threads = self.threads();
        let at = |k: usize| order.map_or(k, |o| o[k]);
        // A heavy selection on one thread (a time slice's) is still mapped in the background:
        // by one background worker, this thread consuming (the sink need not be `Send`).
        let stand_in = threads == 1 && heavy;
        if (threads == 1 && !stand_in) || stored.len() < PARALLEL_SERIES_MIN {
            let mut buf = new_buf();
            for k in 0..stored.len() {
                if k % 256 == 0 {
                    self.check("series selection")?;
                }
                prefetch_ahead(stored, at, k, stored.len());
                let i = at(k);
                if let Some(r) = one(&stored[i], &mut buf)? {
                    sink(i, r)?;
                }
            }
            return Ok(());
        }
        // Worker w maps batches w, w+T, w+2T, … of consecutive series into a small bounded
        // channel; this thread takes from the workers in turn, so results arrive in selection
        // order (deterministic sums) while the consumer overlaps with reading and only a few
        // batches are held at once. Batches, not single series, so that handing results over
        // costs a wake-up per batch.
        let batch = (PIPELINE_POINTS / steps.max(1)).clamp(PIPELINE_BATCH_MIN, PIPELINE_BATCH_MAX);
        let n_batches = stored.len().div_ceil(batch);
        strata_tsdb::workers::scope(|scope| {
            let mut rxs = Vec::with_capacity(threads);
            for w in 0..threads {
                type Mapped = Result<Vec<(usize, Series)>, EvalError>;
                let (tx, rx) = std::sync::mpsc::sync_channel::<Mapped>(PIPELINE_DEPTH);
                rxs.push(rx);
                scope.spawn(move || {
                    let mut buf = new_buf();
                    for b in (w..n_batches).step_by(threads) {
                        let range = b * batch..((b + 1) * batch).min(stored.len());
                        let r = self.check("series selection").and_then(|()| {
                            let mut out = Vec::with_capacity(range.len());
                            let end = range.end;
                            for k in range {
                                prefetch_ahead(stored, at, k, end);
                                let i = at(k);
                                out.extend(one(&stored[i], &mut buf)?.map(|r| (i, r)));
                            }
                            Ok(out)
                        });
                        let failed = r.is_err();
                        if tx.send(r).is_err() || failed {
                            return;
                        }
                    }
                });
            }
            for b in 0..n_batches {
                match rxs[b % threads].recv() {
                    Ok(Ok(batch)) => batch.into_iter().try_for_each(|(i, s)| sink(i, s))?,
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(exec("evaluation worker stopped")),
                }
            }
            Ok(())
        })
    }

    /// Every series matching `matchers` with its raw samples in `[mint, maxt]` (stale markers
    /// kept), one at a time on this thread.
    pub(crate) fn stream_raw(
        &self,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        f: &mut RawSeriesFn<'_>,
    ) -> Result<(), EvalError> {
        let mut buf = SeriesBuf::default();
        for s in self.st.select(matchers, mint, maxt)? {
            self.check("series selection")?;
            read_series(&s, &mut buf)?;
            self.samples_read.fetch_add(buf.floats.len() + buf.hists.len(), Ordering::Relaxed);
            f(&s.labels, &buf.floats, &buf.hists);
        }
        Ok(())
    }

    /// Collects a stream into a vector value, counting its points against the samples limit.
    pub(crate) fn collect(
        &self,
        stage: &'static str,
        produce: impl FnOnce(&mut dyn FnMut(Series) -> Result<(), EvalError>) -> Result<(), EvalError>,
    ) -> Result<Vec<Series>, EvalError> {
        let mut out = Vec::new();
        produce(&mut |s: Series| {
            self.take(s.len(), stage)?;
            out.push(s);
            Ok(())
        })?;
        Ok(out)
    }

    /// Evaluates an instant-vector expression series by series, without holding all of them
    /// when the expression allows: selectors, range functions, element-wise functions and
    /// operations with a scalar stream; anything else is evaluated whole and then fed out.
    pub(crate) fn stream(
        &self,
        e: &Expr,
        ctx: &Ctx,
        sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
    ) -> Result<(), EvalError> {
        self.check("query evaluation")?;
        match &e.kind {
            ExprKind::Paren(inner) | ExprKind::Pos(inner) => self.stream(inner, ctx, sink),
            ExprKind::Vector(sel) => self.stream_selector(sel, e.start, ctx, SelectorValue::Value, sink),
            ExprKind::Call(c) if range_functions::is_range_function(c.func.name) => {
                range_functions::stream(self, c, ctx, sink)
            }
            ExprKind::Call(c) if functions::is_elementwise(c) => functions::stream_elementwise(self, c, ctx, sink),
            ExprKind::Neg(inner) if inner.value_type() == ValueType::Vector => self.stream(inner, ctx, &mut |mut s| {
                s.points.iter_mut().for_each(|p| p.f = -p.f);
                for p in &mut s.hists {
                    Arc::make_mut(&mut p.h).mul(-1.0);
                }
                s.drop_name = true;
                sink(s)
            }),
            ExprKind::Binary(b) if binary::streams(b) => binary::stream_vector_scalar(self, b, ctx, sink),
            _ => {
                let v = self.eval_vector(e, ctx)?;
                let held: usize = v.iter().map(Series::len).sum();
                for s in v {
                    sink(s)?;
                }
                self.release(held);
                Ok(())
            }
        }
    }

    /// Streams `e` into an aggregation's parts on the selection's workers (see `GroupSink`)
    /// where each selected series maps to one result with its labels: a selector, or a range
    /// function of a range selector alone, read from raw data. Returns false, having read
    /// nothing, for anything else.
    pub(crate) fn stream_grouped(&self, e: &Expr, ctx: &Ctx, groups: &dyn GroupSink) -> Result<bool, EvalError> {
        // An instant query's series hold a point each: folding them is little work, and
        // numbering the groups before the workers start would hold them up for longer.
        if self.tier.is_some() || ctx.n < GROUPED_STEPS_MIN {
            return Ok(false);
        }
        match &e.kind {
            ExprKind::Paren(inner) | ExprKind::Pos(inner) => self.stream_grouped(inner, ctx, groups),
            ExprKind::Vector(sel) => {
                self.check("query evaluation")?;
                self.stream_selector_to(sel, e.start, ctx, SelectorValue::Value, Feed::Groups(groups))?;
                Ok(true)
            }
            ExprKind::Call(c)
                if range_functions::is_range_function(c.func.name)
                    && c.args.len() == 1
                    && matches!(c.args[0].unparen().kind, ExprKind::Matrix(_)) =>
            {
                self.check("query evaluation")?;
                range_functions::stream_to(self, c, ctx, Feed::Groups(groups))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// An instant-vector selector at every step: the newest sample in `(t - lookback, t]`,
    /// unless it is a stale marker; `value` says what of the sample each point holds.
    pub(crate) fn stream_selector(
        &self,
        sel: &VectorSelector,
        pos: usize,
        ctx: &Ctx,
        value: SelectorValue,
        sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
    ) -> Result<(), EvalError> {
        self.stream_selector_to(sel, pos, ctx, value, Feed::Series(sink))
    }

    /// `stream_selector`, to either kind of output.
    fn stream_selector_to(
        &self,
        sel: &VectorSelector,
        pos: usize,
        ctx: &Ctx,
        value: SelectorValue,
        out: Feed<'_>,
    ) -> Result<(), EvalError> {
        if value == SelectorValue::StartTime && !self.engine.opts.use_start_timestamps {
            // Without start times read there is nothing to return (as in Prometheus).
            return Ok(());
        }
        if let Some(tier) = self.tier {
            let Feed::Series(sink) = out else {
                return Err(exec("a tier's selection cannot be grouped on its workers"));
            };
            return self.stream_selector_from_tier(tier, sel, ctx, value, sink);
        }
        let keep_sample_time = value == SelectorValue::SampleTime;
        let offset = sel.offset.as_ref().map_or(0, |d| self.duration_ms(d));
        let at = self.at_ms(sel.at);
        let lookback = self.engine.opts.lookback_ms;
        let end_at = |t: i64| at.unwrap_or(t) - offset;
        let (first, last) = (end_at(ctx.start), end_at(ctx.end()));
        let smoothed = sel.mode == RangeMode::Smoothed;
        let maxt = if smoothed { last + lookback } else { last };
        let per_series = |labels: &Labels, samples: &[Point], hsamples: &[HPoint], starts: Starts<'_>| {
            let mut points = point_buffers::POOL.take(ctx.points_capacity(samples, lookback, at.is_some()));
            if hsamples.is_empty() && !smoothed && value == SelectorValue::Value {
                newest_float_at_steps(samples, ctx, end_at, lookback, &mut points);
                return Some(Series::new(labels.clone(), points));
            }
            let mut hists = Vec::new();
            let (mut j, mut k) = (0usize, 0usize);
            for i in 0..ctx.n {
                let te = end_at(ctx.ts(i));
                // samples[..j] and hsamples[..k] are all ≤ te.
                while j < samples.len() && samples[j].t <= te {
                    j += 1;
                }
                while k < hsamples.len() && hsamples[k].t <= te {
                    k += 1;
                }
                if smoothed {
                    if hsamples.is_empty() {
                        if let Some(v) = range_functions::smoothed_value(samples, j, te, lookback) {
                            points.push(Point { t: ctx.ts(i), f: v });
                        }
                    } else {
                        let notes =
                            range_histograms::Notes { ev: self, pos, metric: labels.get(METRIC_NAME).unwrap_or("") };
                        match range_histograms::smoothed_sample(samples, j, hsamples, k, te, lookback, &notes) {
                            Some(range_histograms::Out::Float(f)) => points.push(Point { t: ctx.ts(i), f }),
                            Some(range_histograms::Out::Hist(h)) => hists.push(HPoint { t: ctx.ts(i), h }),
                            None => {}
                        }
                    }
                    continue;
                }
                // The newest sample of either kind.
                let float = j.checked_sub(1).map(|j| samples[j]);
                let hist = k.checked_sub(1).map(|k| &hsamples[k]);
                match (float, hist) {
                    (Some(s), h) if h.is_none_or(|h| h.t < s.t) => {
                        if s.t <= te - lookback || is_stale_nan(s.f) {
                            continue;
                        }
                        let f = match value {
                            SelectorValue::Value => s.f,
                            SelectorValue::SampleTime => s.t as f64 / 1000.0,
                            SelectorValue::StartTime => starts.float(j - 1) as f64 / 1000.0,
                        };
                        points.push(Point { t: ctx.ts(i), f });
                    }
                    (_, Some(h)) => {
                        if h.t <= te - lookback || h.h.is_stale() {
                            continue;
                        }
                        if value == SelectorValue::StartTime {
                            points.push(Point { t: ctx.ts(i), f: starts.hist(k - 1) as f64 / 1000.0 });
                        } else if keep_sample_time {
                            points.push(Point { t: ctx.ts(i), f: h.t as f64 / 1000.0 });
                        } else {
                            hists.push(HPoint { t: ctx.ts(i), h: h.h.clone() });
                        }
                    }
                    _ => {}
                }
            }
            Some(Series::with_hists(labels.clone(), points, hists))
        };
        // Every step reads the newest sample at or before one and the same time: the only
        // sample of each series that matters (not so for the start times, or smoothing).
        let newest_only = (ctx.n == 1 || at.is_some()) && !smoothed && value != SelectorValue::StartTime;
        self.for_each_selected(
            &sel.matchers,
            sel.stats_only,
            newest_only,
            (first - lookback + 1, maxt),
            ctx.n,
            per_series,
            out,
        )
    }

    /// The window a range selector or subquery reads at each step.
    pub(crate) fn range_spec(&self, e: &Expr) -> Result<RangeSpec, EvalError> {
        match &e.unparen().kind {
            ExprKind::Matrix(m) => Ok(RangeSpec {
                range: self.duration_ms(&m.range),
                offset: m.vector.offset.as_ref().map_or(0, |d| self.duration_ms(d)),
                at: self.at_ms(m.vector.at),
                mode: m.vector.mode,
            }),
            ExprKind::Subquery(sq) => Ok(RangeSpec {
                range: self.duration_ms(&sq.range),
                offset: sq.offset.as_ref().map_or(0, |d| self.duration_ms(d)),
                at: self.at_ms(sq.at),
                mode: RangeMode::Plain,
            }),
            _ => Err(exec("expected a range vector")),
        }
    }

    /// Maps each series of a range selector or subquery through `f`, with its samples (stale
    /// markers removed) covering every window the steps of `ctx` need, and feeds the results
    /// to `sink`. Selector series are read and mapped in parallel batches.
    pub(crate) fn stream_range<F>(&self, e: &Expr, ctx: &Ctx, f: F, out: Feed<'_>) -> Result<(), EvalError>
    where
        F: Fn(&Labels, &[Point], &[HPoint], Starts<'_>, bool) -> Option<Series> + Sync,
    {
        let spec = self.range_spec(e)?;
        let (first, last) = (spec.end_at(ctx.start), spec.end_at(ctx.end()));
        match &e.unparen().kind {
            ExprKind::Matrix(m) => {
                // Anchored and smoothed windows also look at samples just outside the range.
                let lookback = self.engine.opts.lookback_ms;
                let (mint, maxt) = match spec.mode {
                    RangeMode::Plain => (first - spec.range + 1, last),
                    RangeMode::Anchored => (first - spec.range - lookback, last),
                    RangeMode::Smoothed => (first - spec.range - lookback, last + lookback),
                };
                let per_series = |labels: &Labels, samples: &[Point], hists: &[HPoint], starts: Starts<'_>| {
                    let stale_h = hists.iter().any(|p| p.h.is_stale());
                    let (kept_h, kept_hst): (Vec<HPoint>, Vec<i64>);
                    let (hists, hist_starts) = if stale_h {
                        let keep = |i: &usize| !hists[*i].h.is_stale();
                        kept_h = (0..hists.len()).filter(keep).map(|i| hists[i].clone()).collect();
                        kept_hst = (0..starts.hists.len()).filter(keep).map(|i| starts.hists[i]).collect();
                        (&kept_h[..], &kept_hst[..])
                    } else {
                        (hists, starts.hists)
                    };
                    if samples.iter().any(|p| is_stale_nan(p.f)) {
                        let keep = |i: &usize| !is_stale_nan(samples[*i].f);
                        let kept: Vec<Point> = (0..samples.len()).filter(keep).map(|i| samples[i]).collect();
                        let kept_st: Vec<i64> =
                            (0..starts.floats.len()).filter(keep).map(|i| starts.floats[i]).collect();
                        f(labels, &kept, hists, Starts { floats: &kept_st, hists: hist_starts }, false)
                    } else {
                        f(labels, samples, hists, Starts { floats: starts.floats, hists: hist_starts }, false)
                    }
                };
                self.for_each_selected(
                    &m.vector.matchers,
                    m.vector.stats_only,
                    false,
                    (mint, maxt),
                    ctx.n,
                    per_series,
                    out,
                )
            }
            ExprKind::Subquery(sq) => {
                let Feed::Series(sink) = out else {
                    return Err(exec("a subquery's series cannot be grouped on the selection's workers"));
                };
                let step = match &sq.step {
                    Some(d) => self.duration_ms(d),
                    None => self.engine.opts.subquery_step_ms,
                };
                if step <= 0 {
                    return Err(exec(format!("subquery step must be positive, got {step}ms")));
                }
                // The first step-aligned time after the first window's start (Go's truncating
                // division, as Prometheus aligns).
                let lo = first - spec.range;
                let mut start = step * (lo / step);
                if start <= lo {
                    start += step;
                }
                if start > last {
                    return Ok(());
                }
                let sub = Ctx { start, step, n: ((last - start) / step) as usize + 1 };
                let inner = match self.eval(&sq.expr, &sub)? {
                    Val::Vector(v) => self.finish_names_keep(v),
                    Val::Scalar(s) => vec![Series::new(
                        Labels::empty(),
                        s.iter().enumerate().map(|(i, &f)| Point { t: sub.ts(i), f }).collect(),
                    )],
                    _ => return Err(exec("subquery of something that is not an instant vector")),
                };
                let held: usize = inner.iter().map(Series::len).sum();
                for mut s in inner {
                    // A window function over many steps of a series is long work: asked
                    // before each (a clock read, nothing next to it).
                    self.check("query evaluation")?;
                    s.points.retain(|p| !is_stale_nan(p.f));
                    // The steps of a subquery are not a series' successive samples: a counter
                    // reset hint read from storage says nothing about the step before, so
                    // resets are found by comparing (gauges stay gauges).
                    for p in &mut s.hists {
                        if matches!(p.h.hint, CounterResetHint::Reset | CounterResetHint::NotReset) {
                            Arc::make_mut(&mut p.h).hint = CounterResetHint::Unknown;
                        }
                    }
                    // Start times are a stored sample's; a subquery's steps have none.
                    if let Some(r) = f(&s.labels, &s.points, &s.hists, Starts::default(), s.drop_name) {
                        if !r.is_empty() {
                            sink(r)?;
                        }
                    }
                }
                self.release(held);
                Ok(())
            }
            _ => Err(exec("expected a range vector")),
        }
    }

    /// Removes `__name__` from series marked for it. Series left with the same labels are
    /// merged when their points do not share a step (`-{job="a"}` over two metrics that take
    /// turns); sharing one is an error, as in Prometheus.
    fn finish_names(&self, series: Vec<Series>) -> Result<Vec<Series>, EvalError> {
        let series = self.finish_names_keep(series);
        merge_same_labels(series)
    }

    /// Drops names where marked, without the uniqueness check (subquery inputs).
    fn finish_names_keep(&self, mut series: Vec<Series>) -> Vec<Series> {
        for s in &mut series {
            if s.drop_name {
                // With the type-and-unit labels of metadata, they go with the name.
                s.labels = labels::without(&s.labels, &[METRIC_NAME, "__type__", "__unit__"]);
                s.drop_name = false;
            }
        }
        series
    }
}

/// What `stream_raw` hands each series to: labels, float samples, histogram samples.
pub(crate) type RawSeriesFn<'a> = dyn FnMut(&Labels, &[Point], &[HPoint]) + 'a;

/// What each point of an instant selector holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SelectorValue {
    /// The sample's value.
    Value,
    /// The sample's timestamp in seconds (`timestamp()`).
    SampleTime,
    /// The sample's start time in seconds, 0 when it has none (`start_timestamp()`).
    StartTime,
}

/// Start times of a series' samples (0: none), parallel to its floats and its histograms;
/// each side is empty when none of its samples has one (or start times are not read).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Starts<'a> {
    pub floats: &'a [i64],
    pub hists: &'a [i64],
}

impl Starts<'_> {
    /// The start time of float sample `i`.
    pub fn float(&self, i: usize) -> i64 {
        self.floats.get(i).copied().unwrap_or(0)
    }

    /// The start time of histogram sample `i`.
    pub fn hist(&self, i: usize) -> i64 {
        self.hists.get(i).copied().unwrap_or(0)
    }
}

/// A series' samples, floats and histograms apart, reused across series.
#[derive(Default)]
struct SeriesBuf {
    floats: Vec<Point>,
    /// Samples as `read_floats` appends them, before they become `floats`.
    dense: Vec<strata_model::Sample>,
    hists: Vec<HPoint>,
    /// Whether to keep start times (the engine uses them).
    read_starts: bool,
    /// Start times parallel to `floats` and `hists`; each stays empty until a sample of its
    /// kind has one (then it is filled with zeros up to it).
    float_starts: Vec<i64>,
    hist_starts: Vec<i64>,
}

impl SeriesBuf {
    fn starts(&self) -> Starts<'_> {
        Starts { floats: &self.float_starts, hists: &self.hist_starts }
    }
}

/// An instant selector's value at each step of `ctx` over float samples only: the newest
/// sample at or before the step's time (`end_at`), unless older than `lookback` or a stale
/// marker. Range queries evaluate this for every series and step (a plain selector, `a / b`,
/// `count by` over a selection), so the walk avoids the branch that mispredicts: with steps
/// denser than samples (a 60 s step over 2-minute scrapes) the next sample is reached at an
/// irregular fraction of the steps, which a loop guarded by that comparison mispredicts at
/// most of them; a conditional add takes the first step forward without a branch, and the
/// loop after it is entered only where samples are denser than steps (predictably so).
fn newest_float_at_steps(
    samples: &[Point],
    ctx: &Ctx,
    end_at: impl Fn(i64) -> i64,
    lookback: i64,
    points: &mut Vec<Point>,
) {
    let Some(first) = samples.first() else { return };
    let mut j = 0usize;
    for i in 0..ctx.n {
        let te = end_at(ctx.ts(i));
        if te < first.t {
            continue;
        }
        // samples[..j] are all <= te afterwards.
        let next_t = samples.get(j).map_or(i64::MAX, |s| s.t);
        j += usize::from(next_t <= te);
        while j < samples.len() && samples[j].t <= te {
            j += 1;
        }
        let s = samples[j - 1];
        if s.t > te - lookback && !is_stale_nan(s.f) {
            points.push(Point { t: ctx.ts(i), f: s.f });
        }
    }
}

/// Records start time `st` of the sample just pushed as the `n`-th of its kind.
fn push_start(starts: &mut Vec<i64>, n: usize, st: i64) {
    if st != 0 || !starts.is_empty() {
        starts.resize(n - 1, 0);
        starts.push(st);
    }
}

/// A stored series' samples in its selected range, into `buf` (cleared first).
fn read_series(s: &StoredSeries, buf: &mut SeriesBuf) -> Result<(), EvalError> {
    buf.floats.clear();
    buf.hists.clear();
    buf.float_starts.clear();
    buf.hist_starts.clear();
    let read_starts = buf.read_starts;
    // Plain floats (no start times: chunks with them are left to `visit`), a chunk at a time.
    let failed = |e| EvalError::Storage(format!("reading series {}: {e}", s.labels));
    buf.dense.clear();
    if s.read_floats(&mut buf.dense).map_err(failed)? {
        buf.floats.extend(buf.dense.iter().map(|s| Point { t: s.t, f: s.v }));
        return Ok(());
    }
    s.visit(|x| match x.value {
        TypedValue::Float(f) => {
            buf.floats.push(Point { t: x.t, f });
            if read_starts {
                push_start(&mut buf.float_starts, buf.floats.len(), x.st);
            }
        }
        TypedValue::Histogram(h) => {
            buf.hists.push(HPoint { t: x.t, h: Arc::new(*h) });
            if read_starts {
                push_start(&mut buf.hist_starts, buf.hists.len(), x.st);
            }
        }
    })
    .map_err(failed)?;
    // Pad to full length: a series whose later samples lack start times.
    if !buf.float_starts.is_empty() {
        buf.float_starts.resize(buf.floats.len(), 0);
    }
    if !buf.hist_starts.is_empty() {
        buf.hist_starts.resize(buf.hists.len(), 0);
    }
    Ok(())
}

/// What statistics-only reading does to counter reset hints: an unknown hint is resolved
/// against the histogram read before it (reset or not), so a chunk's first sample says
/// whether it follows a reset.
fn resolve_reset_hints(hists: &mut [HPoint]) {
    let mut prev: Option<Arc<strata_model::FloatHistogram>> = None;
    for p in hists.iter_mut() {
        if p.h.is_stale() {
            continue;
        }
        if p.h.hint == CounterResetHint::Unknown {
            if let Some(q) = &prev {
                let reset = p.h.detect_reset(q);
                Arc::make_mut(&mut p.h).hint = if reset { CounterResetHint::Reset } else { CounterResetHint::NotReset };
            }
        }
        prev = Some(p.h.clone());
    }
}

/// Merges series with equal labels (keeping the order of first appearance); fails when two of
/// them have a point at the same step.
fn merge_same_labels(series: Vec<Series>) -> Result<Vec<Series>, EvalError> {
    let mut idx: Vec<usize> = (0..series.len()).collect();
    idx.sort_by(|&a, &b| series[a].labels.cmp(&series[b].labels).then(a.cmp(&b)));
    if idx.windows(2).all(|w| series[w[0]].labels != series[w[1]].labels) {
        return Ok(series);
    }
    let mut slots: Vec<Option<Series>> = series.into_iter().map(Some).collect();
    let mut k = 0;
    while k < idx.len() {
        let first = idx[k];
        let mut j = k + 1;
        while j < idx.len() && slots[idx[j]].as_ref().map(|s| &s.labels) == slots[first].as_ref().map(|s| &s.labels) {
            let other = slots[idx[j]].take().expect("each index once");
            let into = slots[first].as_mut().expect("kept");
            let times = |s: &Series| {
                let mut t: Vec<i64> = s.points.iter().map(|p| p.t).chain(s.hists.iter().map(|p| p.t)).collect();
                t.sort_unstable();
                t
            };
            if times_overlap(&times(into), &times(&other)) {
                return Err(exec("vector cannot contain metrics with the same labelset"));
            }
            into.points.extend(other.points);
            into.points.sort_by_key(|p| p.t);
            into.hists.extend(other.hists);
            into.hists.sort_by_key(|p| p.t);
            j += 1;
        }
        k = j;
    }
    Ok(slots.into_iter().flatten().collect())
}

fn times_overlap(a: &[i64], b: &[i64]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

fn val_name(v: &Val) -> &'static str {
    match v {
        Val::Scalar(_) => "scalar",
        Val::Str(_) => "string",
        Val::Vector(_) => "instant vector",
        Val::Matrix(_) => "range vector",
    }
}

#[cfg(test)]
mod tests;
