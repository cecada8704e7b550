//! `info(v, {selector})` (experimental): adds to each series of `v` the data labels of the info
//! series (by default `target_info`) that share its identifying labels (`instance`, `job`),
//! as of each step.

use std::collections::HashMap;

use strata_model::{is_stale_nan, Label, Labels, LabelsBuilder, MatchOp, Matcher, METRIC_NAME};

use super::{Ctx, Evaluator, Val};
use crate::ast::{Call, Expr, ExprKind};
use crate::error::{exec, EvalError};
use crate::value::{Point, Series};

const IDENTIFYING: [&str; 2] = ["instance", "job"];

/// An info series' points at the steps of the query (the value is irrelevant: presence and
/// sample time matter), with its labels.
struct InfoSeries {
    labels: Labels,
    /// Per step, the time of the newest sample in the lookback (None: absent or stale).
    seen: Vec<Option<i64>>,
}

/// The time shift the base expression applies (`@`, `offset`), so that info series are read
/// as of the same time as the base samples.
fn reference_time(e: &Expr, ev: &Evaluator) -> (Option<i64>, i64) {
    let mut found: Option<(Option<i64>, i64)> = None;
    fn inner_offset(e: &Expr, ev: &Evaluator) -> i64 {
        let mut off = 0;
        let mut done = false;
        e.walk(&mut |x| {
            if done {
                return;
            }
            if let ExprKind::Vector(v) = &x.kind {
                off = v.offset.as_ref().map_or(0, |d| ev.duration_ms(d));
                done = true;
            }
        });
        off
    }
    e.walk(&mut |x| {
        if found.is_some() {
            return;
        }
        match &x.kind {
            ExprKind::Vector(v) => {
                found = Some((ev.at_ms(v.at), v.offset.as_ref().map_or(0, |d| ev.duration_ms(d))));
            }
            ExprKind::Matrix(m) => {
                found = Some((ev.at_ms(m.vector.at), m.vector.offset.as_ref().map_or(0, |d| ev.duration_ms(d))));
            }
            ExprKind::Subquery(s) => {
                let off = s.offset.as_ref().map_or(0, |d| ev.duration_ms(d));
                found = Some(match s.at {
                    Some(a) => (ev.at_ms(Some(a)), off + inner_offset(&s.expr, ev)),
                    None => (None, off),
                });
            }
            _ => {}
        }
    });
    found.unwrap_or((None, 0))
}

pub(super) fn eval(ev: &Evaluator, call: &Call, ctx: &Ctx) -> Result<Val, EvalError> {
    let base = ev.eval_vector(&call.args[0], ctx)?;
    // The info selector: its __name__ matchers choose info metrics, the others are data
    // matchers, which both filter info series and name the labels to add.
    let default = [Matcher::equal(METRIC_NAME, "target_info")];
    let selector: &[Matcher] = match call.args.get(1).map(|a| &a.unparen().kind) {
        Some(ExprKind::Vector(v)) => &v.matchers,
        Some(_) => return Err(exec("info(): the second argument must be a series selector")),
        None => &default,
    };
    // Without __name__ matchers the info metric is target_info; with only negative ones, any
    // `*_info` metric they do not exclude.
    let name_matchers: Vec<Matcher> = {
        let mut n: Vec<Matcher> = selector.iter().filter(|m| m.name == METRIC_NAME).cloned().collect();
        if n.is_empty() {
            n = default.to_vec();
        } else if !n.iter().any(|m| matches!(m.op, MatchOp::Equal | MatchOp::RegexMatch)) {
            n.push(Matcher::new(MatchOp::RegexMatch, METRIC_NAME, ".+_info").expect("valid regex"));
        }
        n
    };
    let data_matchers: Vec<&Matcher> = selector.iter().filter(|m| m.name != METRIC_NAME).collect();
    let drop_unmatched = data_matchers.iter().any(|m| !m.matches_empty());

    let (at, offset) = reference_time(&call.args[0], ev);
    let lookback = ev.lookback();
    let time_at = |i: usize| at.unwrap_or(ctx.ts(i)) - offset;
    let (first, last) = ((0..ctx.n).map(time_at).min().unwrap_or(0), (0..ctx.n).map(time_at).max().unwrap_or(0));

    // Info series: all matching the name matchers and every data matcher that names a label
    // they have (a data matcher on a label they lack filters nothing here).
    let mut infos: Vec<InfoSeries> = Vec::new();
    let mut info_select = name_matchers.clone();
    info_select.extend(data_matchers.iter().filter(|m| !m.matches_empty()).map(|m| (*m).clone()));
    let mut histogram_info: Option<Labels> = None;
    ev.stream_raw(&info_select, first - lookback + 1, last, &mut |labels: &Labels, samples: &[Point], hists| {
        if !data_matchers.iter().all(|m| m.matches(labels.get(&m.name).unwrap_or(""))) {
            return;
        }
        if !hists.is_empty() {
            histogram_info.get_or_insert_with(|| labels.clone());
            return;
        }
        let seen = (0..ctx.n)
            .map(|i| {
                let t = time_at(i);
                let k = samples.partition_point(|p| p.t <= t);
                (k > 0).then(|| samples[k - 1]).filter(|p| p.t > t - lookback && !is_stale_nan(p.f)).map(|p| p.t)
            })
            .collect();
        infos.push(InfoSeries { labels: labels.clone(), seen });
    })?;
    if let Some(l) = histogram_info {
        // Info metrics are floats whose labels annotate other series; a histogram is not one.
        return Err(exec(format!("info series {l} has native histogram samples; info metrics must be floats")));
    }
    // Info series by their identifying labels.
    let mut by_id: HashMap<Vec<Label>, Vec<usize>> = HashMap::new();
    for (i, s) in infos.iter().enumerate() {
        for key in id_keys(&s.labels) {
            by_id.entry(key).or_default().push(i);
        }
    }

    let is_info = |l: &Labels| name_matchers.iter().all(|m| m.matches(l.get(METRIC_NAME).unwrap_or("")));
    let mut out: Vec<Series> = Vec::new();
    let mut index: HashMap<(Labels, bool), usize> = HashMap::new();
    for s in base {
        let key: Vec<Label> = s.labels.iter().filter(|l| IDENTIFYING.contains(&&*l.name)).cloned().collect();
        if is_info(&s.labels) || key.is_empty() {
            push(&mut out, &mut index, s.labels.clone(), s.drop_name, &s.points);
            continue;
        }
        let candidates = by_id.get(&key).map(Vec::as_slice).unwrap_or(&[]);
        let mut steps = ctx.walker();
        for p in &s.points {
            let i = steps.index(p.t);
            // Per info metric name, the series with the newest sample at this step.
            let mut chosen: HashMap<&str, (i64, usize)> = HashMap::new();
            for &c in candidates {
                let Some(t) = infos[c].seen[i] else { continue };
                let name = infos[c].labels.get(METRIC_NAME).unwrap_or("");
                if chosen.get(name).is_none_or(|&(bt, _)| t > bt) {
                    chosen.insert(name, (t, c));
                }
            }
            if chosen.is_empty() {
                if !drop_unmatched {
                    push(&mut out, &mut index, s.labels.clone(), s.drop_name, &[*p]);
                }
                continue;
            }
            let mut b = LabelsBuilder::new(&s.labels);
            let mut added: Vec<(String, String)> = Vec::new();
            for (_, c) in chosen.values() {
                for l in infos[*c].labels.iter() {
                    let n = &*l.name;
                    if n == METRIC_NAME || IDENTIFYING.contains(&n) || s.labels.get(n).is_some() {
                        continue;
                    }
                    if !data_matchers.is_empty() && !data_matchers.iter().any(|m| m.name == n) {
                        continue;
                    }
                    if let Some((_, v)) = added.iter().find(|(an, _)| an == n) {
                        if v != &*l.value {
                            return Err(exec(format!(
                                "info(): conflicting label {n}: {v:?} and {:?} from different info metrics",
                                &*l.value
                            )));
                        }
                        continue;
                    }
                    added.push((n.to_string(), l.value.to_string()));
                    b.set(n, &*l.value);
                }
            }
            let labels = b.build().map_err(|e| exec(e.to_string()))?;
            push(&mut out, &mut index, labels, s.drop_name, &[*p]);
        }
    }
    Ok(Val::Vector(out))
}

/// The identifying-label sets under which an info series can be found: all of its
/// identifying labels, and each one alone (for base series that carry only one).
fn id_keys(labels: &Labels) -> Vec<Vec<Label>> {
    let all: Vec<Label> = labels.iter().filter(|l| IDENTIFYING.contains(&&*l.name)).cloned().collect();
    let mut keys = vec![all.clone()];
    if all.len() > 1 {
        keys.extend(all.iter().map(|l| vec![l.clone()]));
    }
    keys
}

fn push(
    out: &mut Vec<Series>,
    index: &mut HashMap<(Labels, bool), usize>,
    labels: Labels,
    drop_name: bool,
    points: &[Point],
) {
    let i = *index.entry((labels.clone(), drop_name)).or_insert_with(|| {
        out.push(Series { labels, points: Vec::new(), hists: Vec::new(), drop_name });
        out.len() - 1
    });
    out[i].points.extend_from_slice(points);
}
