//! graphite-web's render functions (`render/functions.py`), evaluated over parsed targets
//! (`target`): each path expression is fetched once per request however many calls use it,
//! arguments are checked against what the function takes (a 400 naming the function and the
//! argument otherwise), and the results carry graphite-web's names and tags
//! (`sumSeries(servers.*.cpu)`, `scale(a.b,10)`).
//!
//! `FUNCTIONS` (listed in `docs/graphite.md`): graphite-web 1.1.8's whole list. By
//! family: the aggregations (`combine`), the aliases (`alias`), point-by-point transforms and
//! derivatives (`transform`), filters and sorts (`filter`), functions that evaluate their
//! argument again over other times (`window`), statistics and functions that evaluate new
//! targets (`calculate`), whole-list functions (`lists`), percentages, legends and
//! consolidation settings (`special`), generators (`generate`), and `template` expansion. Any
//! other name is refused by name.

mod alias;
mod calculate;
pub mod catalog;
mod combine;
mod filter;
mod generate;
mod lists;
pub mod series;
mod special;
mod template;
pub(crate) mod transform;
mod window;

use std::collections::HashMap;

pub use series::{Consolidation, Series};

use crate::target::{Call, Expr, Number};

/// Why a target could not be evaluated: a 400 for the request's author.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    #[error("unknown function {0}(); see docs/graphite.md for the functions Strata has")]
    UnknownFunction(String),
    #[error("{function}(): {message}")]
    BadArgument { function: String, message: String },
    #[error("{0}")]
    Fetch(String),
    #[error("template(): {0}")]
    Template(String),
    #[error("the target's path expressions name more than {0} series in all (counted once per use)")]
    TooManySeries(usize),
}

/// Fetches a path expression (a glob, or a `seriesByTag(...)` call as written) over
/// `[from, until]`, epoch seconds.
pub type Fetch<'f> = dyn FnMut(&str, i64, i64) -> Result<Vec<Series>, EvalError> + 'f;

/// The epoch seconds of the events (`crate::events`) with all of the tags (every event for
/// `None`) from `from` to `until`, both included, for `events(...)`.
pub type EventTimes<'f> = dyn Fn(Option<&[String]>, i64, i64) -> Vec<i64> + 'f;

/// What evaluation needs from the server: the request's range and its series.
pub struct Context<'f> {
    /// The range being evaluated, epoch seconds: the request's, or the shifted or widened one
    /// a function such as `timeShift` or `movingAverage` evaluates its argument over.
    pub from: i64,
    pub until: i64,
    /// The request's range: path expressions are fetched once per use over it, and afresh
    /// over any other.
    requested: (i64, i64),
    /// The request's `xFilesFactor` (graphite-web's `DEFAULT_XFILES_FACTOR` when absent, 0).
    pub x_files_factor: f64,
    /// Fetches a path expression (a glob, or a `seriesByTag(...)` call as written) over
    /// `[from, until]`.
    fetch: &'f mut Fetch<'f>,
    /// Path expressions fetched and still to be used again, with how many uses remain (only
    /// an expression used more than once is kept, and the last use takes it without a copy).
    fetched: HashMap<String, (usize, Vec<Series>)>,
    /// Uses of each path expression in the target being evaluated.
    uses: HashMap<String, usize>,
    /// Series handed to calls so far, and the most allowed: a path expression used many times
    /// is fetched once but copied per use.
    handed_out: usize,
    max_series: usize,
    /// The request's time zone (`tz`, else Graphite's own), in which functions align to days
    /// and hours and read dates, and whose daylight-saving time `timeShift(...,
    /// alignDST=true)` follows (graphite-web follows its server's zone there).
    pub(crate) time_zone: jiff::tz::TimeZone,
    /// The request's `now`, epoch seconds, for dates in arguments (`linearRegression`).
    pub(crate) now: i64,
    /// `stacked`'s running totals by stack name, kept across calls in the request.
    pub(crate) stacks: HashMap<String, Vec<f64>>,
    /// The request's `template[name]=value` parameters, which override a template's own.
    template: Vec<(String, String)>,
    /// The server's events, if it keeps them.
    pub(crate) events: Option<&'f EventTimes<'f>>,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("from", &self.from).field("until", &self.until).finish_non_exhaustive()
    }
}

impl<'f> Context<'f> {
    /// `max_series`: the most series all uses of path expressions may name together.
    pub fn new(from: i64, until: i64, x_files_factor: f64, max_series: usize, fetch: &'f mut Fetch<'f>) -> Context<'f> {
        Context {
            from,
            until,
            requested: (from, until),
            x_files_factor,
            fetch,
            fetched: HashMap::new(),
            uses: HashMap::new(),
            handed_out: 0,
            max_series,
            time_zone: jiff::tz::TimeZone::UTC,
            now: until,
            stacks: HashMap::new(),
            template: Vec::new(),
            events: None,
        }
    }

    /// Sets where `events(...)` finds events (without it, `events` is refused by name).
    pub fn with_events(mut self, events: &'f EventTimes<'f>) -> Context<'f> {
        self.events = Some(events);
        self
    }

    /// Sets the request's time zone (UTC unless set).
    pub fn with_time_zone(mut self, time_zone: jiff::tz::TimeZone) -> Context<'f> {
        self.time_zone = time_zone;
        self
    }

    /// Sets the request's `template[name]=value` parameters.
    pub fn with_template(mut self, template: Vec<(String, String)>) -> Context<'f> {
        self.template = template;
        self
    }

    /// Sets the request's `now` (`until` unless set).
    pub fn with_now(mut self, now: i64) -> Context<'f> {
        self.now = now;
        self
    }

    /// Epoch second `t` floored to the start of its `unit` (`"years"`, `"months"`,
    /// `"weeks"` with an optional ISO weekday digit, `"days"`, `"hours"`, `"minutes"`,
    /// `"seconds"`, by graphite-web's `getUnitString` prefixes) in the request's time zone,
    /// keeping `t`'s UTC offset as graphite-web's `datetime(..., tzinfo=s.tzinfo)` does.
    pub(crate) fn floor_to_unit(&self, t: i64, unit: &str) -> Option<i64> {
        let zoned = jiff::Timestamp::from_second(t).ok()?.to_zoned(self.time_zone.clone());
        let dt = zoned.datetime();
        let day = jiff::civil::DateTime::from(dt.date());
        let floored = if unit.starts_with('s') {
            dt.with().subsec_nanosecond(0).build().ok()?
        } else if unit.starts_with("min") {
            dt.with().second(0).subsec_nanosecond(0).build().ok()?
        } else if unit.starts_with('h') {
            dt.with().minute(0).second(0).subsec_nanosecond(0).build().ok()?
        } else if unit.starts_with('d') {
            day
        } else if unit.starts_with('w') {
            let target = unit.chars().last().and_then(|c| c.to_digit(10)).unwrap_or(1) as i64;
            let back = (i64::from(dt.date().weekday().to_monday_one_offset()) - target).rem_euclid(7);
            day.checked_sub(jiff::Span::new().days(back)).ok()?
        } else if unit.starts_with("mon") {
            jiff::civil::DateTime::from(dt.date().first_of_month())
        } else if unit.starts_with('y') {
            jiff::civil::date(dt.year(), 1, 1).at(0, 0, 0, 0)
        } else {
            return None;
        };
        Some(zoned.offset().to_timestamp(floored).ok()?.as_second())
    }

    /// Whether daylight-saving time is in effect at epoch second `t` in Graphite's time zone.
    fn is_dst(&self, t: i64) -> bool {
        jiff::Timestamp::from_second(t).is_ok_and(|ts| self.time_zone.to_offset_info(ts).dst().is_dst())
    }

    /// Counts the uses of every path expression in `expr` (graphite-web's
    /// `extractPathExpressions`, with multiplicity).
    fn count_uses(&mut self, expr: &Expr) {
        match expr {
            Expr::Path(p) => *self.uses.entry(p.clone()).or_default() += 1,
            Expr::Call(c) if c.name == "seriesByTag" => *self.uses.entry(c.raw.clone()).or_default() += 1,
            Expr::Call(c) => {
                for a in c.args.iter().chain(c.kwargs.iter().map(|(_, v)| v)) {
                    self.count_uses(a);
                }
            }
            _ => {}
        }
    }

    fn fetch(&mut self, path_expression: &str) -> Result<Vec<Series>, EvalError> {
        if (self.from, self.until) != self.requested {
            let s = (self.fetch)(path_expression, self.from, self.until)?;
            return self.hand_out(s);
        }
        let s = match self.fetched.remove(path_expression) {
            Some((1, s)) => s,
            Some((left, s)) => {
                self.fetched.insert(path_expression.to_owned(), (left - 1, s.clone()));
                s
            }
            None => {
                let s = (self.fetch)(path_expression, self.from, self.until)?;
                let uses = self.uses.get(path_expression).copied().unwrap_or(1);
                if uses > 1 {
                    self.fetched.insert(path_expression.to_owned(), (uses - 1, s.clone()));
                }
                s
            }
        };
        self.hand_out(s)
    }

    fn hand_out(&mut self, s: Vec<Series>) -> Result<Vec<Series>, EvalError> {
        self.handed_out += s.len();
        if self.handed_out > self.max_series {
            return Err(EvalError::TooManySeries(self.max_series));
        }
        Ok(s)
    }

    /// `expr` evaluated again over `[from, until]` (graphite-web's `evaluateTarget` over a
    /// copy of the request context with other times and nothing prefetched).
    pub(crate) fn evaluate_over(&mut self, expr: &Expr, from: i64, until: i64) -> Result<Vec<Series>, EvalError> {
        let saved = (self.from, self.until);
        (self.from, self.until) = (from, until);
        let evaluated = eval(expr, self);
        (self.from, self.until) = saved;
        match evaluated? {
            Arg::Series(s) => Ok(s),
            other => Err(EvalError::Fetch(format!("the first argument is {}, not a series list", describe(&other)))),
        }
    }
}

/// The series a target names.
pub fn evaluate(expr: &Expr, cx: &mut Context<'_>) -> Result<Vec<Series>, EvalError> {
    let expanded = template::expand(expr, &cx.template)?;
    let expr = &expanded;
    cx.count_uses(expr);
    match eval(expr, cx)? {
        Arg::Series(s) => Ok(s),
        Arg::SeriesLists(_) => Err(EvalError::BadArgument {
            function: "mapSeries".into(),
            message: "gives lists of series, which only reduceSeries() takes".into(),
        }),
        _ => Err(EvalError::Fetch("the target is a value, not a series".into())),
    }
}

/// An evaluated argument.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    Series(Vec<Series>),
    /// `mapSeries`' groups, for `reduceSeries`.
    SeriesLists(Vec<Vec<Series>>),
    String(String),
    Number(Number),
    Bool(bool),
    None,
}

fn eval(expr: &Expr, cx: &mut Context<'_>) -> Result<Arg, EvalError> {
    Ok(match expr {
        Expr::Path(p) => Arg::Series(cx.fetch(p)?),
        Expr::Call(c) if c.name == "seriesByTag" => Arg::Series(cx.fetch(&c.raw)?),
        Expr::Call(c) if c.name == "mapSeries" || c.name == "map" => {
            Arg::SeriesLists(lists::map_series(evaluate_args(c, cx)?)?)
        }
        Expr::Call(c) => Arg::Series(call(c, cx)?),
        Expr::Template { .. } => return Err(EvalError::Template("not expanded".into())),
        Expr::String(s) => Arg::String(s.clone()),
        Expr::Number(n) => Arg::Number(*n),
        Expr::Bool(b) => Arg::Bool(*b),
        Expr::None => Arg::None,
    })
}

/// Fewest points, over all the series a call works on, for which it spreads the work over the
/// cores: below it, starting threads costs more than it saves.
pub(crate) const PARALLEL_POINTS_MIN: usize = 1 << 18;

/// Something a function works on, by how many points it holds.
pub(crate) trait Points {
    fn points_held(&self) -> usize;
}

impl Points for Series {
    fn points_held(&self) -> usize {
        self.values.len()
    }
}

impl Points for &Series {
    fn points_held(&self) -> usize {
        self.values.len()
    }
}

impl Points for &mut Series {
    fn points_held(&self) -> usize {
        self.values.len()
    }
}

/// `f` over each item, in order: on one thread, or, when the items hold
/// `PARALLEL_POINTS_MIN` points or more, over the cores (`spread`). Each item's result is what
/// one thread would compute (nothing is re-associated across items).
pub(crate) fn per_series<T: Points + Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let points: usize = items.iter().map(Points::points_held).sum();
    if points < PARALLEL_POINTS_MIN {
        return items.into_iter().map(f).collect();
    }
    spread(items, f)
}

/// `f` over each item, the items split into one contiguous run per core, the results in the
/// items' order; a worker's panic goes on in the caller. For callers that have judged the work
/// worth the threads.
pub fn spread<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len());
    if threads <= 1 {
        return items.into_iter().map(f).collect();
    }
    let run = items.len().div_ceil(threads);
    let mut runs: Vec<Vec<T>> = Vec::with_capacity(threads);
    let mut rest = items.into_iter();
    loop {
        let chunk: Vec<T> = rest.by_ref().take(run).collect();
        if chunk.is_empty() {
            break;
        }
        runs.push(chunk);
    }
    let f = &f;
    std::thread::scope(|scope| {
        let workers: Vec<_> =
            runs.into_iter().map(|chunk| scope.spawn(move || chunk.into_iter().map(f).collect::<Vec<R>>())).collect();
        workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    })
}

/// The functions implemented, by graphite-web's names (aliases included).
pub const FUNCTIONS: &[&str] = &[
    "absolute",
    "add",
    "aggregate",
    "aggregateLine",
    "aggregateSeriesLists",
    "aggregateWithWildcards",
    "alias",
    "aliasByMetric",
    "aliasByNode",
    "aliasByTags",
    "aliasQuery",
    "aliasSub",
    "alpha",
    "applyByNode",
    "areaBetween",
    "asPercent",
    "averageAbove",
    "averageBelow",
    "averageOutsidePercentile",
    "averageSeries",
    "averageSeriesWithWildcards",
    "avg",
    "cactiStyle",
    "changed",
    "color",
    "consolidateBy",
    "constantLine",
    "countSeries",
    "cumulative",
    "currentAbove",
    "currentBelow",
    "dashed",
    "delay",
    "derivative",
    "diffSeries",
    "diffSeriesLists",
    "divideSeries",
    "divideSeriesLists",
    "drawAsInfinite",
    "events",
    "exclude",
    "exp",
    "exponentialMovingAverage",
    "fallbackSeries",
    "filterSeries",
    "grep",
    "group",
    "groupByNode",
    "groupByNodes",
    "groupByTags",
    "highest",
    "highestAverage",
    "highestCurrent",
    "highestMax",
    "hitcount",
    "holtWintersAberration",
    "holtWintersConfidenceArea",
    "holtWintersConfidenceBands",
    "holtWintersForecast",
    "identity",
    "integral",
    "interpolate",
    "invert",
    "isNonNull",
    "keepLastValue",
    "legendValue",
    "limit",
    "linearRegression",
    "lineWidth",
    "log",
    "logit",
    "lowest",
    "lowestAverage",
    "lowestCurrent",
    "map",
    "mapSeries",
    "maximumAbove",
    "maximumBelow",
    "maxSeries",
    "minimumAbove",
    "minimumBelow",
    "minMax",
    "minSeries",
    "mostDeviant",
    "movingAverage",
    "movingMax",
    "movingMedian",
    "movingMin",
    "movingSum",
    "movingWindow",
    "multiplySeries",
    "multiplySeriesLists",
    "multiplySeriesWithWildcards",
    "nonNegativeDerivative",
    "nPercentile",
    "offset",
    "offsetToZero",
    "pct",
    "percentileOfSeries",
    "perSecond",
    "pow",
    "powSeries",
    "randomWalk",
    "randomWalkFunction",
    "rangeOfSeries",
    "reduce",
    "reduceSeries",
    "removeAbovePercentile",
    "removeAboveValue",
    "removeBelowPercentile",
    "removeBelowValue",
    "removeBetweenPercentile",
    "removeEmptySeries",
    "round",
    "scale",
    "scaleToSeconds",
    "secondYAxis",
    "seriesByTag",
    "setXFilesFactor",
    "sigmoid",
    "sin",
    "sinFunction",
    "smartSummarize",
    "sortBy",
    "sortByMaxima",
    "sortByMinima",
    "sortByName",
    "sortByTotal",
    "squareRoot",
    "stacked",
    "stddevSeries",
    "stdev",
    "substr",
    "sum",
    "summarize",
    "sumSeries",
    "sumSeriesLists",
    "sumSeriesWithWildcards",
    "threshold",
    "time",
    "timeFunction",
    "timeShift",
    "timeSlice",
    "timeStack",
    "total",
    "transformNull",
    "unique",
    "useSeriesAbove",
    "weightedAverage",
    "xFilesFactor",
];

/// A call's arguments, evaluated.
fn evaluate_args<'c>(c: &'c Call, cx: &mut Context<'_>) -> Result<Args<'c>, EvalError> {
    if !FUNCTIONS.contains(&c.name.as_str()) {
        return Err(EvalError::UnknownFunction(c.name.clone()));
    }
    let mut args = Args { function: &c.name, positional: Vec::new(), keyword: Vec::new() };
    for a in &c.args {
        args.positional.push(eval(a, cx)?);
    }
    for (k, v) in &c.kwargs {
        args.keyword.push((k.clone(), eval(v, cx)?));
    }
    Ok(args)
}

fn call(c: &Call, cx: &mut Context<'_>) -> Result<Vec<Series>, EvalError> {
    let args = evaluate_args(c, cx)?;
    dispatch(&c.name, args, cx, &c.args)
}

/// Calls function `name` with evaluated `args`; `raw_args` are its arguments as written, which
/// the functions that evaluate their first argument again over other times need.
pub(crate) fn dispatch(
    name: &str,
    args: Args<'_>,
    cx: &mut Context<'_>,
    raw_args: &[Expr],
) -> Result<Vec<Series>, EvalError> {
    let first = || window::first_argument(raw_args, name);
    match name {
        "movingWindow" => window::moving(cx, args, &first()?, None),
        "movingAverage" => window::moving(cx, args, &first()?, Some("average")),
        "movingMedian" => window::moving(cx, args, &first()?, Some("median")),
        "movingSum" => window::moving(cx, args, &first()?, Some("sum")),
        "movingMin" => window::moving(cx, args, &first()?, Some("min")),
        "movingMax" => window::moving(cx, args, &first()?, Some("max")),
        "exponentialMovingAverage" => window::exponential_moving_average(cx, args, &first()?),
        "timeShift" => window::time_shift(cx, args, &first()?),
        "timeStack" => window::time_stack(cx, args, &first()?),
        "holtWintersForecast" => window::holt_winters_forecast(cx, args, &first()?),
        "holtWintersConfidenceBands" => window::holt_winters_confidence_bands(cx, args, &first()?),
        "holtWintersAberration" => window::holt_winters_aberration(cx, args, &first()?),
        "holtWintersConfidenceArea" => window::holt_winters_confidence_area(cx, args, &first()?),
        "areaBetween" => window::area_between(args),
        "group" => lists::group(args),
        "fallbackSeries" => lists::fallback_series(args),
        "aggregateSeriesLists" => lists::aggregate_series_lists(cx, args, None),
        "sumSeriesLists" => lists::aggregate_series_lists(cx, args, Some("sum")),
        "diffSeriesLists" => lists::aggregate_series_lists(cx, args, Some("diff")),
        "multiplySeriesLists" => lists::aggregate_series_lists(cx, args, Some("multiply")),
        "divideSeriesLists" => lists::divide_series_lists(cx, args),
        "weightedAverage" => lists::weighted_average(cx, args),
        "reduceSeries" | "reduce" => lists::reduce_series(cx, args),
        "removeAbovePercentile" => lists::remove_percentile(args, true),
        "removeBelowPercentile" => lists::remove_percentile(args, false),
        "removeBetweenPercentile" => lists::remove_between_percentile(args),
        "averageOutsidePercentile" => lists::average_outside_percentile(args),
        "aggregateLine" => lists::aggregate_line(cx, args),
        "stacked" => lists::stacked(cx, args),
        "timeSlice" => lists::time_slice(cx, args),
        "substr" => lists::substr(args),
        "aliasQuery" => lists::alias_query(cx, args),
        "randomWalk" | "randomWalkFunction" => lists::random_walk(cx, args),
        "stdev" => calculate::stdev(args),
        "linearRegression" => calculate::linear_regression(cx, args, &first()?),
        "mostDeviant" => calculate::most_deviant(args),
        "hitcount" => calculate::hitcount(cx, args, &first()?),
        "smartSummarize" => calculate::smart_summarize(cx, args, &first()?),
        "useSeriesAbove" => calculate::use_series_above(cx, args),
        "applyByNode" => calculate::apply_by_node(cx, args),
        "groupByTags" => calculate::group_by_tags(cx, args),
        "powSeries" => calculate::pow_series(cx, args),
        "minMax" => calculate::min_max(args),
        "interpolate" => calculate::interpolate(args),
        "exp" => transform::exp(args),
        "logit" => transform::logit(args),
        "sigmoid" => transform::sigmoid(args),
        "add" => transform::add(args),
        "round" => transform::round(args),
        "secondYAxis" => transform::renaming_graph_option(args, "secondYAxis"),
        "drawAsInfinite" => transform::renaming_graph_option(args, "drawAsInfinite"),
        "dashed" => transform::renaming_graph_option(args, "dashed"),
        "identity" => generate::identity(cx, args),
        "timeFunction" | "time" => generate::time_function(cx, args),
        "sinFunction" | "sin" => generate::sin_function(cx, args),
        "asPercent" | "pct" => special::as_percent(cx, args),
        "legendValue" => special::legend_value(args),
        "cactiStyle" => special::cacti_style(args),
        "consolidateBy" => special::consolidate_by(args, None),
        "cumulative" => special::consolidate_by(args, Some("sum")),
        "setXFilesFactor" | "xFilesFactor" => special::set_x_files_factor(cx, args),
        "events" => generate::events(cx, args),
        "aggregate" => combine::aggregate_call(cx, args),
        "sumSeries" | "sum" | "total" => combine::series_form(cx, args, "sum"),
        "averageSeries" | "avg" => combine::series_form(cx, args, "average"),
        "minSeries" => combine::series_form(cx, args, "min"),
        "maxSeries" => combine::series_form(cx, args, "max"),
        "diffSeries" => combine::series_form(cx, args, "diff"),
        "stddevSeries" => combine::series_form(cx, args, "stddev"),
        "rangeOfSeries" => combine::series_form(cx, args, "rangeOf"),
        "multiplySeries" => combine::multiply_series(cx, args),
        "alias" => alias::alias(args),
        "aliasByNode" => alias::alias_by_node(args),
        "aliasByMetric" => alias::alias_by_metric(args),
        "scale" => transform::scale(args),
        "offset" => transform::offset(args),
        "absolute" => transform::absolute(args),
        "derivative" => transform::derivative(args),
        "nonNegativeDerivative" => transform::non_negative(args, false),
        "perSecond" => transform::non_negative(args, true),
        "integral" => transform::integral(args),
        "keepLastValue" => transform::keep_last_value(args),
        "transformNull" => transform::transform_null(args),
        "removeBelowValue" => transform::remove_value(args, true),
        "removeAboveValue" => transform::remove_value(args, false),
        "invert" => transform::invert(args),
        "squareRoot" => transform::square_root(args),
        "isNonNull" => transform::is_non_null(args),
        "changed" => transform::changed(args),
        "offsetToZero" => transform::offset_to_zero(args),
        "delay" => transform::delay(args),
        "summarize" => transform::summarize(args),
        "aliasByTags" => alias::alias_by_tags(args),
        "aliasSub" => alias::alias_sub(args),
        "pow" => transform::pow(args),
        "log" => transform::logarithm(args),
        "scaleToSeconds" => transform::scale_to_seconds(args),
        "nPercentile" => transform::n_percentile(args),
        "percentileOfSeries" => combine::percentile_of_series(cx, args),
        "removeEmptySeries" => combine::remove_empty_series(args),
        "unique" => combine::unique(args),
        "color" => transform::graph_option(args, "theColor"),
        "lineWidth" => transform::graph_option(args, "width"),
        "alpha" => transform::graph_option(args, "alpha"),
        "divideSeries" => combine::divide_series(cx, args),
        "constantLine" => combine::constant_line(cx, args),
        "threshold" => combine::threshold(cx, args),
        "countSeries" => combine::count_series(cx, args),
        "groupByNode" => combine::group_by_nodes(cx, args, true),
        "groupByNodes" => combine::group_by_nodes(cx, args, false),
        "aggregateWithWildcards" => combine::with_wildcards(cx, args, None),
        "sumSeriesWithWildcards" => combine::with_wildcards(cx, args, Some("sum")),
        "averageSeriesWithWildcards" => combine::with_wildcards(cx, args, Some("average")),
        "multiplySeriesWithWildcards" => combine::with_wildcards(cx, args, Some("multiply")),
        "highest" => filter::highest(args, true, None),
        "lowest" => filter::highest(args, false, None),
        "highestCurrent" => filter::highest(args, true, Some("current")),
        "highestMax" => filter::highest(args, true, Some("max")),
        "highestAverage" => filter::highest(args, true, Some("average")),
        "lowestCurrent" => filter::highest(args, false, Some("current")),
        "lowestAverage" => filter::highest(args, false, Some("average")),
        "filterSeries" => filter::filter_series(args, None),
        "currentAbove" => filter::filter_series(args, Some(("last", ">"))),
        "currentBelow" => filter::filter_series(args, Some(("last", "<="))),
        "averageAbove" => filter::filter_series(args, Some(("average", ">"))),
        "averageBelow" => filter::filter_series(args, Some(("average", "<="))),
        "maximumAbove" => filter::filter_series(args, Some(("max", ">"))),
        "maximumBelow" => filter::filter_series(args, Some(("max", "<="))),
        "minimumAbove" => filter::filter_series(args, Some(("min", ">"))),
        "minimumBelow" => filter::filter_series(args, Some(("min", "<="))),
        "limit" => filter::limit(args),
        "exclude" => filter::grep(args, false),
        "grep" => filter::grep(args, true),
        "sortByName" => filter::sort_by_name(args),
        "sortBy" => filter::sort_by(args),
        "sortByMaxima" | "sortByMinima" | "sortByTotal" => filter::sort_by_fixed(args, name),
        // Answered by the tag index where it is written (`eval`), never called by name.
        "seriesByTag" => Err(EvalError::BadArgument {
            function: name.to_owned(),
            message: "selects series where it is written; it cannot be called by name".into(),
        }),
        "mapSeries" | "map" => Err(EvalError::BadArgument {
            function: name.to_owned(),
            message: "gives lists of series, which only reduceSeries() takes".into(),
        }),
        other => Err(EvalError::UnknownFunction(other.to_owned())),
    }
}

/// A call's evaluated arguments, taken by position or name as graphite-web's parameter
/// declarations allow.
pub(crate) struct Args<'c> {
    function: &'c str,
    positional: Vec<Arg>,
    keyword: Vec<(String, Arg)>,
}

impl Args<'_> {
    pub(crate) fn error(&self, message: impl Into<String>) -> EvalError {
        EvalError::BadArgument { function: self.function.to_owned(), message: message.into() }
    }

    /// The argument at `index` or named `name`, taken out (`None` when absent).
    pub(crate) fn take(&mut self, index: usize, name: &str) -> Option<Arg> {
        if let Some(i) = self.keyword.iter().position(|(k, _)| k == name) {
            return Some(self.keyword.remove(i).1);
        }
        self.positional.get_mut(index).map(|a| std::mem::replace(a, Arg::None)).filter(|a| *a != Arg::None)
    }

    pub(crate) fn series(&mut self, index: usize, name: &str) -> Result<Vec<Series>, EvalError> {
        match self.take(index, name) {
            Some(Arg::Series(s)) => Ok(s),
            Some(other) => Err(self.error(format!("{name} must be a series list, not {}", describe(&other)))),
            None => Err(self.error(format!("missing {name}"))),
        }
    }

    /// Every positional argument from `from` on, each a series list (`*seriesLists`).
    pub(crate) fn series_rest(&mut self, from: usize, name: &str) -> Result<Vec<Vec<Series>>, EvalError> {
        let rest: Vec<Arg> = self.positional.drain(from.min(self.positional.len())..).collect();
        rest.into_iter()
            .map(|a| match a {
                Arg::Series(s) => Ok(s),
                other => Err(self.error(format!("{name} must be series lists, not {}", describe(&other)))),
            })
            .collect()
    }

    /// Every positional argument from `from` on, each a string (`*tags`, `*valueTypes`).
    pub(crate) fn strings_rest(&mut self, from: usize, name: &str) -> Result<Vec<String>, EvalError> {
        let rest: Vec<Arg> = self.positional.drain(from.min(self.positional.len())..).collect();
        rest.into_iter()
            .map(|a| match a {
                Arg::String(s) => Ok(s),
                other => Err(self.error(format!("{name} must be strings, not {}", describe(&other)))),
            })
            .collect()
    }

    /// Every positional argument from `from` on, each a node number or a tag name (`*nodes`).
    pub(crate) fn nodes_rest(&mut self, from: usize, name: &str) -> Result<Vec<Arg>, EvalError> {
        let rest: Vec<Arg> = self.positional.drain(from.min(self.positional.len())..).collect();
        match rest.iter().find(|n| !matches!(n, Arg::Number(_) | Arg::String(_))) {
            Some(other) => {
                Err(self.error(format!("{name} must be node numbers or tag names, not {}", describe(other))))
            }
            None => Ok(rest),
        }
    }

    pub(crate) fn number(&mut self, index: usize, name: &str) -> Result<Option<Number>, EvalError> {
        match self.take(index, name) {
            None => Ok(None),
            Some(Arg::Number(n)) => Ok(Some(n)),
            Some(other) => Err(self.error(format!("{name} must be a number, not {}", describe(&other)))),
        }
    }

    pub(crate) fn required_number(&mut self, index: usize, name: &str) -> Result<Number, EvalError> {
        self.number(index, name)?.ok_or_else(|| self.error(format!("missing {name}")))
    }

    pub(crate) fn string(&mut self, index: usize, name: &str) -> Result<Option<String>, EvalError> {
        match self.take(index, name) {
            None => Ok(None),
            Some(Arg::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.error(format!("{name} must be a string, not {}", describe(&other)))),
        }
    }

    /// Refuses what is left: arguments the function does not take.
    pub(crate) fn finish(self) -> Result<(), EvalError> {
        if let Some((k, _)) = self.keyword.first() {
            return Err(self.error(format!("unexpected argument {k}=")));
        }
        if self.positional.iter().any(|a| *a != Arg::None) {
            return Err(self.error("too many arguments"));
        }
        Ok(())
    }
}

fn describe(a: &Arg) -> &'static str {
    match a {
        Arg::Series(_) => "a series list",
        Arg::SeriesLists(_) => "lists of series",
        Arg::String(_) => "a string",
        Arg::Number(_) => "a number",
        Arg::Bool(_) => "a boolean",
        Arg::None => "None",
    }
}

/// Python's `str` of a parsed number argument: `5`, `5.0`.
pub(crate) fn number_str(n: Number) -> String {
    match n {
        Number::Int(i) => i.to_string(),
        Number::Float(f) => crate::render::py_float(f),
    }
}

/// Python's `"%g" % v`: six significant digits, trailing zeros dropped, an exponent below 1e-4
/// and from 1e6 (graphite-web names series with it: `scale(a,0.5)`).
pub fn py_g(v: f64) -> String {
    py_g_precision(v, 6)
}

/// Python's `"%.<p>g" % v`: `p` significant digits (at least 1), trailing zeros dropped, an
/// exponent below 1e-4 and from 10^p.
pub(crate) fn py_g_precision(v: f64, p: usize) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let p = p.max(1);
    let sci = format!("{v:.*e}", p - 1);
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s.to_owned()
        }
    };
    if exp >= -4 && exp < p as i32 {
        trim(&format!("{v:.*}", (p as i32 - 1 - exp) as usize))
    } else {
        format!("{}e{}{:02}", trim(mantissa), if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

#[cfg(test)]
mod tests;
