//! Functions that evaluate their first argument again over other times, as graphite-web's do
//! with a copy of the request context: the moving windows and `exponentialMovingAverage` (from
//! a window earlier, so the first points have a full window behind them), `timeShift` and
//! `timeStack` (shifted ranges), and the Holt-Winters family (a bootstrap interval earlier).
//! The first evaluation, over the request's range, still decides what graphite-web takes from
//! it: the largest step, or the start and end the shifted series are laid over.

use super::combine::AggFunc;
use super::transform::{py_round, time_offset};
use super::{number_str, per_series, Arg, Args, Context, EvalError, Series};
use crate::target::{Expr, Number};

/// A window or shift argument (`ParamTypes.intOrInterval`): a number of points or an interval
/// string such as `"5min"`.
enum WindowSize {
    Points(Number),
    Interval(String, i64),
}

impl WindowSize {
    fn take(args: &mut Args<'_>, index: usize) -> Result<WindowSize, EvalError> {
        match args.take(index, "windowSize") {
            Some(Arg::Number(n)) if n.as_f64() >= 1.0 && n.as_f64() < 1e9 => Ok(WindowSize::Points(n)),
            Some(Arg::String(s)) => match time_offset(&s).map(i64::abs) {
                Some(seconds) if seconds > 0 => Ok(WindowSize::Interval(s, seconds)),
                _ => Err(args.error(format!("windowSize {s:?} is not an interval such as \"5min\""))),
            },
            Some(_) => Err(args.error("windowSize must be a number of points (at least 1) or an interval string")),
            None => Err(args.error("missing windowSize")),
        }
    }

    /// Seconds of data needed before the range (`previewSeconds`): an interval's length, or
    /// the points' count times the largest step among `series`.
    fn preview_seconds(&self, series: &[Series]) -> i64 {
        match self {
            WindowSize::Interval(_, seconds) => *seconds,
            WindowSize::Points(n) => series.iter().map(|s| s.step).max().unwrap_or(1).saturating_mul(n.as_f64() as i64),
        }
    }

    /// Points in the window of a series with `step`.
    fn points(&self, step: i64) -> usize {
        match self {
            WindowSize::Interval(_, seconds) => (seconds / step.max(1)) as usize,
            WindowSize::Points(n) => n.as_f64() as usize,
        }
    }

    /// As graphite-web writes it in the new name: `5` or `"5min"`.
    fn in_name(&self) -> String {
        match self {
            WindowSize::Interval(s, _) => format!("\"{s}\""),
            WindowSize::Points(n) => number_str(*n),
        }
    }

    /// As graphite-web stores it in the tags (`str(windowSize)`).
    fn in_tag(&self) -> String {
        match self {
            WindowSize::Interval(s, _) => s.clone(),
            WindowSize::Points(n) => number_str(*n),
        }
    }
}

/// The first positional argument as written (graphite-web's `requestContext['args'][0]`).
pub(crate) fn first_argument(args: &[Expr], function: &str) -> Result<Expr, EvalError> {
    args.first()
        .cloned()
        .ok_or_else(|| EvalError::BadArgument { function: function.to_owned(), message: "missing seriesList".into() })
}

/// `movingWindow(seriesList, windowSize, func='average', xFilesFactor=None)` and its named
/// forms (`movingAverage`, `movingMedian`, `movingSum`, `movingMin`, `movingMax`, `func` fixed):
/// each point becomes `func` of the window of points before it (not itself), a gap unless the
/// window's present points reach `xFilesFactor` (the series' own when not given).
pub(crate) fn moving(
    cx: &mut Context<'_>,
    mut args: Args<'_>,
    first: &Expr,
    fixed: Option<&str>,
) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let window = WindowSize::take(&mut args, 1)?;
    let (func_name, xff_index) = match fixed {
        Some(f) => (f.to_owned(), 2),
        None => (args.string(2, "func")?.unwrap_or_else(|| "average".into()), 3),
    };
    let func = AggFunc::parse(&func_name)
        .ok_or_else(|| args.error(format!("Unsupported aggregation function: {func_name}")))?;
    let x_files_factor = args.number(xff_index, "xFilesFactor")?.map(Number::as_f64);
    args.finish()?;
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let preview = window.preview_seconds(&series);
    let preview_list = cx.evaluate_over(first, cx.from.saturating_sub(preview), cx.until)?;
    let tag_name = format!("moving{}{}", func_name[..1].to_uppercase(), &func_name[1..]);
    // Each point folds its whole window, as graphite-web does (sums in its order): bound the
    // work so one request cannot hold a thread for minutes.
    let work: usize = preview_list.iter().map(|s| s.values.len().saturating_mul(window.points(s.step))).sum();
    if work > MOVING_WINDOW_WORK_MAX {
        return Err(args_error(
            &tag_name,
            format!("windows of {} over these series fold more than {MOVING_WINDOW_WORK_MAX} values", window.in_tag()),
        ));
    }
    Ok(per_series(preview_list, |mut s| {
        let points = window.points(s.step);
        let mut window_values = Vec::with_capacity(points);
        let xff = x_files_factor.unwrap_or(s.x_files_factor);
        let values = (points..s.values.len().max(points))
            .map(|i| {
                window_values.clear();
                window_values.extend(s.values[i - points..i].iter().flatten().map(|v| Some(*v)));
                let present = window_values.len();
                (present > 0 && present as f64 / points as f64 >= xff).then(|| func.apply(&window_values)).flatten()
            })
            .collect();
        s.tags.insert(tag_name.clone(), window.in_tag());
        let name = format!("{tag_name}({},{})", s.name, window.in_name());
        Series { name, start: s.start.saturating_add(preview), values, values_per_point: 1, ..s }
    }))
}

/// Most values one moving-window call folds in all (points × window, over its series).
const MOVING_WINDOW_WORK_MAX: usize = 500_000_000;

fn args_error(function: &str, message: String) -> EvalError {
    EvalError::BadArgument { function: function.to_owned(), message }
}

/// `exponentialMovingAverage(seriesList, windowSize)`: `ema = c·value + (1−c)·ema` with
/// `c = 2 / (window + 1)` (the window in seconds for an interval, as graphite-web computes it),
/// seeded with the average of the first window, rounded to six decimals; gaps stay gaps.
pub(crate) fn exponential_moving_average(
    cx: &mut Context<'_>,
    mut args: Args<'_>,
    first: &Expr,
) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let window = WindowSize::take(&mut args, 1)?;
    args.finish()?;
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let preview = window.preview_seconds(&series);
    let constant = 2.0
        / (match &window {
            WindowSize::Interval(_, seconds) => *seconds,
            WindowSize::Points(n) => n.as_f64() as i64,
        } as f64
            + 1.0);
    let preview_list = cx.evaluate_over(first, cx.from.saturating_sub(preview), cx.until)?;
    Ok(per_series(preview_list, |mut s| {
        let points = window.points(s.step).min(s.values.len());
        let seed = AggFunc::Average.apply(&s.values[..points]).unwrap_or(0.0);
        let mut ema = seed;
        let mut values = vec![Some(py_round(ema, 6))];
        for v in &s.values[points..] {
            values.push(v.map(|v| {
                ema = constant * v + (1.0 - constant) * ema;
                py_round(ema, 6)
            }));
        }
        s.tags.insert("exponentialMovingAverage".into(), window.in_tag());
        let name = format!("exponentialMovingAverage({},{})", s.name, window.in_name());
        Series { name, start: s.start.saturating_add(preview), values, values_per_point: 1, ..s }
    }))
}

/// An interval argument with graphite-web's default sign for shifts: a bare `1d` means back.
fn shift_argument(args: &mut Args<'_>, index: usize, name: &str, default: &str) -> Result<(String, i64), EvalError> {
    let mut text = args.string(index, name)?.unwrap_or_else(|| default.to_owned());
    if text.starts_with(|c: char| c.is_ascii_digit()) {
        text.insert(0, '-');
    }
    let seconds =
        time_offset(&text).ok_or_else(|| args.error(format!("{name} {text:?} is not an interval such as \"1d\"")))?;
    Ok((text, seconds))
}

fn bool_argument(args: &mut Args<'_>, index: usize, name: &str, default: bool) -> Result<bool, EvalError> {
    match args.take(index, name) {
        None => Ok(default),
        Some(Arg::Bool(b)) => Ok(b),
        Some(_) => Err(args.error(format!("{name} must be true or false"))),
    }
}

/// `timeShift(seriesList, timeShift, resetEnd=True, alignDST=False)`: the series over the
/// range shifted by the interval, laid over the first series' start (and its end, with
/// `resetEnd`); with `alignDST` the shift gains or loses the hour by which the daylight-saving
/// state of Graphite's time zone differs between the two ranges.
pub(crate) fn time_shift(cx: &mut Context<'_>, mut args: Args<'_>, first: &Expr) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let (shift_text, shift) = shift_argument(&mut args, 1, "timeShift", "")?;
    let reset_end = bool_argument(&mut args, 2, "resetEnd", true)?;
    let align_dst = bool_argument(&mut args, 3, "alignDst", false)?;
    args.finish()?;
    let Some(base) = series.first() else { return Ok(Vec::new()) };
    let (mut from, mut until) = (cx.from.saturating_add(shift), cx.until.saturating_add(shift));
    if align_dst {
        let dst = |t: i64| cx.is_dst(t);
        let (request_dst, shifted_dst) = ((dst(cx.from), dst(cx.until)), (dst(from), dst(until)));
        let hour = match (request_dst, shifted_dst) {
            ((true, true), (false, false)) => 3600,
            ((false, false), (true, true)) => -3600,
            _ => 0,
        };
        (from, until) = (from + hour, until + hour);
    }
    let shifted = cx.evaluate_over(first, from, until)?;
    Ok(shifted
        .into_iter()
        .map(|mut s| {
            s.tags.insert("timeShift".into(), shift_text.clone());
            s.name = format!("timeShift({}, \"{shift_text}\")", s.name);
            s.end = if reset_end { base.end } else { s.end - s.start + base.start };
            s.start = base.start;
            s
        })
        .collect())
}

/// Most ranges one `timeStack` evaluates: each is a full evaluation of its argument.
const TIME_STACK_MAX: i64 = 1000;

/// `timeStack(seriesList, timeShiftUnit='1d', timeShiftStart=0, timeShiftEnd=7)`: the series
/// over the range shifted by each multiple of the unit from `timeShiftStart` up to (not
/// including) `timeShiftEnd`, all laid over the first series' start and end.
pub(crate) fn time_stack(cx: &mut Context<'_>, mut args: Args<'_>, first: &Expr) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let (unit_text, unit) = shift_argument(&mut args, 1, "timeShiftUnit", "1d")?;
    let start = args.number(2, "timeShiftStart")?.map_or(0, |n| n.as_f64() as i64);
    let end = args.number(3, "timeShiftEnd")?.map_or(7, |n| n.as_f64() as i64);
    args.finish()?;
    if end - start > TIME_STACK_MAX {
        return Err(EvalError::BadArgument {
            function: "timeStack".into(),
            message: format!("more than {TIME_STACK_MAX} shifts ({start} to {end})"),
        });
    }
    let Some(base) = series.first() else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for shift in start..end {
        let delta = unit.saturating_mul(shift);
        for mut s in cx.evaluate_over(first, cx.from.saturating_add(delta), cx.until.saturating_add(delta))? {
            s.tags.insert("timeShiftUnit".into(), unit_text.clone());
            s.tags.insert("timeShift".into(), shift.to_string());
            let name = format!("timeShift({}, {unit_text}, {shift})", s.name);
            super::transform::rename(&mut s, name);
            (s.start, s.end) = (base.start, base.end);
            out.push(s);
        }
    }
    Ok(out)
}

/// Holt-Winters' predictions and deviations for `values` (graphite-web's
/// `holtWintersAnalysis`, alpha = gamma = 0.1, beta = 0.0035): a gap predicts nothing for the
/// point after it and resets the level to the next value.
fn holt_winters_analysis(values: &[Option<f64>], season_length: usize) -> (Vec<Option<f64>>, Vec<Option<f64>>) {
    const ALPHA: f64 = 0.1;
    const GAMMA: f64 = 0.1;
    const BETA: f64 = 0.0035;
    let n = values.len();
    let (mut intercepts, mut slopes, mut seasonals) =
        (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut predictions, mut deviations) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let earlier = |list: &[f64], i: usize| if i >= season_length { list[i - season_length] } else { 0.0 };
    let mut next_prediction: Option<f64> = None;
    for (i, actual) in values.iter().enumerate() {
        let Some(actual) = *actual else {
            intercepts.push(None);
            slopes.push(0.0);
            seasonals.push(0.0);
            predictions.push(next_prediction);
            deviations.push(0.0);
            next_prediction = None;
            continue;
        };
        let (last_intercept, last_slope, prediction) = if i == 0 {
            (actual, 0.0, Some(actual))
        } else {
            (intercepts[i - 1].unwrap_or(actual), slopes[i - 1], next_prediction)
        };
        let last_seasonal = earlier(&seasonals, i);
        // `season_length` is at least 2 (checked by the callers), so this is an earlier point.
        let next_last_seasonal = earlier(&seasonals, i + 1);
        let last_seasonal_deviation = earlier(&deviations, i);
        let intercept = ALPHA * (actual - last_seasonal) + (1.0 - ALPHA) * (last_intercept + last_slope);
        let slope = BETA * (intercept - last_intercept) + (1.0 - BETA) * last_slope;
        let seasonal = GAMMA * (actual - intercept) + (1.0 - GAMMA) * last_seasonal;
        next_prediction = Some(intercept + slope + next_last_seasonal);
        let deviation = GAMMA * (actual - prediction.unwrap_or(0.0)).abs() + (1.0 - GAMMA) * last_seasonal_deviation;
        intercepts.push(Some(intercept));
        slopes.push(slope);
        seasonals.push(seasonal);
        predictions.push(prediction);
        deviations.push(deviation);
    }
    (predictions, deviations.into_iter().map(Some).collect())
}

/// A series widened by the bootstrap interval, with its forecast and deviations over the
/// request's range.
type Analysed = (Series, Vec<Option<f64>>, Vec<Option<f64>>);

/// The Holt-Winters arguments after the series: `delta` (bands only), `bootstrapInterval`,
/// `seasonality`.
struct HoltWinters {
    delta: f64,
    bootstrap: i64,
    seasonality: i64,
}

impl HoltWinters {
    /// A Holt-Winters call's arguments: the series list (evaluated over the request's range)
    /// and the rest.
    fn arguments(mut args: Args<'_>, with_delta: bool) -> Result<(Vec<Series>, HoltWinters), EvalError> {
        let series = args.series(0, "seriesList")?;
        let hw = HoltWinters::take(&mut args, with_delta)?;
        args.finish()?;
        Ok((series, hw))
    }

    fn take(args: &mut Args<'_>, with_delta: bool) -> Result<HoltWinters, EvalError> {
        let offset = usize::from(with_delta);
        let delta = if with_delta { args.number(1, "delta")?.map_or(3.0, Number::as_f64) } else { 3.0 };
        let mut interval = |index: usize, name: &str, default: &str| {
            let text = args.string(index, name)?.unwrap_or_else(|| default.to_owned());
            time_offset(&text).ok_or_else(|| args.error(format!("{name} {text:?} is not an interval such as \"7d\"")))
        };
        let bootstrap = interval(1 + offset, "bootstrapInterval", "7d")?;
        let seasonality = interval(2 + offset, "seasonality", "1d")?;
        Ok(HoltWinters { delta, bootstrap, seasonality })
    }

    /// The series over the range widened by the bootstrap interval, each with its forecast and
    /// deviation over the request's range.
    fn analyse(&self, cx: &mut Context<'_>, first: &Expr, function: &str) -> Result<Vec<Analysed>, EvalError> {
        let preview_list = cx.evaluate_over(first, cx.from.saturating_sub(self.bootstrap), cx.until)?;
        per_series(preview_list, |mut s| {
            let season_length = self.seasonality.div_euclid(s.step.max(1));
            if season_length < 2 {
                return Err(EvalError::BadArgument {
                    function: function.to_owned(),
                    message: format!("seasonality must span at least two points of {} s", s.step),
                });
            }
            let (mut predictions, mut deviations) = holt_winters_analysis(&s.points(), season_length as usize);
            s.tags.insert("holtWintersForecast".into(), "1".into());
            s.tags.insert("holtWintersDeviation".into(), "1".into());
            let skip = (self.bootstrap.div_euclid(s.step.max(1)).max(0) as usize).min(predictions.len());
            predictions.drain(..skip);
            deviations.drain(..skip);
            Ok((s, predictions, deviations))
        })
        .into_iter()
        .collect()
    }

    /// The lower and upper confidence bands, named and tagged as graphite-web does (both
    /// carry every tag, graphite-web's shared tag dictionary).
    fn bands(&self, cx: &mut Context<'_>, first: &Expr, function: &str) -> Result<Vec<Series>, EvalError> {
        let mut out = Vec::new();
        for (mut s, forecast, deviation) in self.analyse(cx, first, function)? {
            let band = |sign: f64| -> Vec<Option<f64>> {
                forecast
                    .iter()
                    .zip(&deviation)
                    .map(|(f, d)| Some(f.as_ref()? + sign * self.delta * d.as_ref()?))
                    .collect()
            };
            let (lower, upper) = (band(-1.0), band(1.0));
            s.tags.insert("holtWintersConfidenceUpper".into(), "1".into());
            s.tags.insert("holtWintersConfidenceLower".into(), "1".into());
            let start = s.start.saturating_add(self.bootstrap);
            for (what, values) in [("Lower", lower), ("Upper", upper)] {
                let name = format!("holtWintersConfidence{what}({})", s.name);
                out.push(Series { name, start, values, values_per_point: 1, ..s.clone() });
            }
        }
        Ok(out)
    }
}

/// `holtWintersForecast(seriesList, bootstrapInterval='7d', seasonality='1d')`.
pub(crate) fn holt_winters_forecast(
    cx: &mut Context<'_>,
    args: Args<'_>,
    first: &Expr,
) -> Result<Vec<Series>, EvalError> {
    let (_, hw) = HoltWinters::arguments(args, false)?;
    Ok(hw
        .analyse(cx, first, "holtWintersForecast")?
        .into_iter()
        .map(|(s, forecast, _)| {
            let name = format!("holtWintersForecast({})", s.name);
            Series {
                path_expression: name.clone(),
                name,
                start: s.start.saturating_add(hw.bootstrap),
                values: forecast,
                values_per_point: 1,
                ..s
            }
        })
        .collect())
}

/// `holtWintersConfidenceBands(seriesList, delta=3, bootstrapInterval='7d', seasonality='1d')`:
/// the forecast minus and plus `delta` deviations, lower band first.
pub(crate) fn holt_winters_confidence_bands(
    cx: &mut Context<'_>,
    args: Args<'_>,
    first: &Expr,
) -> Result<Vec<Series>, EvalError> {
    let (_, hw) = HoltWinters::arguments(args, true)?;
    hw.bands(cx, first, "holtWintersConfidenceBands")
}

/// `holtWintersAberration(seriesList, delta=3, ...)`: how far each point lies above the upper
/// band or below the lower one, 0 inside them or where the point is a gap.
pub(crate) fn holt_winters_aberration(
    cx: &mut Context<'_>,
    args: Args<'_>,
    first: &Expr,
) -> Result<Vec<Series>, EvalError> {
    let (series, hw) = HoltWinters::arguments(args, true)?;
    let bands = hw.bands(cx, first, "holtWintersAberration")?;
    let band = |name: String| bands.iter().find(|b| b.name == name).map(|b| &b.values);
    Ok(series
        .into_iter()
        .map(|mut s| {
            let lower = band(format!("holtWintersConfidenceLower({})", s.name));
            let upper = band(format!("holtWintersConfidenceUpper({})", s.name));
            let at = |b: Option<&Vec<Option<f64>>>, i: usize| b.and_then(|b| b.get(i).copied().flatten());
            let values = s
                .values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    Some(match (*v, at(upper, i), at(lower, i)) {
                        (None, _, _) => 0.0,
                        (Some(x), Some(u), _) if x > u => x - u,
                        (Some(x), _, Some(l)) if x < l => x - l,
                        _ => 0.0,
                    })
                })
                .collect();
            s.tags.insert("holtWintersAberration".into(), "1".into());
            let name = format!("holtWintersAberration({})", s.name);
            Series { path_expression: name.clone(), name, values, values_per_point: 1, ..s }
        })
        .collect())
}

/// `holtWintersConfidenceArea(seriesList, delta=3, ...)`: the bands as `areaBetween` pairs
/// them (one series only, as graphite-web's `areaBetween` requires).
pub(crate) fn holt_winters_confidence_area(
    cx: &mut Context<'_>,
    args: Args<'_>,
    first: &Expr,
) -> Result<Vec<Series>, EvalError> {
    let (_, hw) = HoltWinters::arguments(args, true)?;
    let bands = hw.bands(cx, first, "holtWintersConfidenceArea")?;
    let mut area = area_between_pair(bands, "holtWintersConfidenceArea")?;
    for s in &mut area {
        s.tags.remove("areaBetween");
        s.tags.insert("holtWintersConfidenceArea".into(), "1".into());
        s.path_expression = s.name.clone();
    }
    Ok(area)
}

/// graphite-web's `areaBetween` on exactly two series (lower, upper): both named
/// `<function>(<upper's path expression>)`, sharing the upper's tags.
pub(crate) fn area_between_pair(mut series: Vec<Series>, function: &str) -> Result<Vec<Series>, EvalError> {
    if series.len() != 2 {
        return Err(EvalError::BadArgument {
            function: function.to_owned(),
            message: format!("needs exactly 2 series, not {}", series.len()),
        });
    }
    series[1].tags.insert("areaBetween".into(), "1".into());
    let name = format!("{function}({})", series[1].path_expression);
    series[0].tags = series[1].tags.clone();
    for s in &mut series {
        s.name = name.clone();
    }
    Ok(series)
}

/// `areaBetween(seriesList)`: for graphs, the area between two series; the data unchanged.
pub(crate) fn area_between(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    args.finish()?;
    area_between_pair(series, "areaBetween")
}
