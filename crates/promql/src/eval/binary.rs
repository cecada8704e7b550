//! Binary operators over whole series: scalar/scalar, vector/scalar, and vector/vector with
//! Prometheus' matching (`on`, `ignoring`, `group_left`, `group_right`), set operators, and the
//! errors for ambiguous matches. Matching is done once per series signature, then step by step.

use std::collections::HashMap;
use std::sync::Arc;

use strata_model::{CounterResetHint, FloatHistogram, HistogramError, Labels, LabelsBuilder};

use super::labels::{prom_labels_string, signature};
use super::{Ctx, Evaluator, Val};
use crate::ast::{Binary, BinaryOp, Cardinality, VectorMatching};
use crate::error::{exec, EvalError};
use crate::value::{HPoint, Point, Series};

pub(super) fn eval(ev: &Evaluator, b: &Binary, ctx: &Ctx) -> Result<Val, EvalError> {
    let lhs = ev.eval(&b.lhs, ctx)?;
    let rhs = ev.eval(&b.rhs, ctx)?;
    let (held_l, held_r) = (held(&lhs), held(&rhs));
    let out = match (lhs, rhs) {
        (Val::Scalar(l), Val::Scalar(r)) => {
            Val::Scalar(l.iter().zip(&r).map(|(&a, &c)| b.op.apply_scalar(a, c)).collect())
        }

        (Val::Vector(l), Val::Vector(r)) => {
            let default = VectorMatching::default();
            let m = b.matching.as_ref().unwrap_or(&default);
            Val::Vector(match b.op {
                BinaryOp::And => and_unless(l, &r, m, ctx, true),
                BinaryOp::Unless => and_unless(l, &r, m, ctx, false),
                BinaryOp::Or => or(l, r, m, ctx),
                _ => vector_vector(ev, b, m, l, r, ctx)?,
            })
        }
        _ => return Err(exec("binary expression must contain only scalar and instant vector types")),
    };
    ev.release(held_l + held_r);
    ev.take(held(&out), "binary operation")?;
    Ok(out)
}

/// Whether the operation is a vector with a scalar (either side), which streams.
pub(super) fn streams(b: &Binary) -> bool {
    use crate::ast::ValueType::{Scalar, Vector};
    matches!((b.lhs.value_type(), b.rhs.value_type()), (Vector, Scalar) | (Scalar, Vector))
}

/// A vector with a scalar: the scalar is evaluated for all steps, then the vector's series
/// are combined with it one at a time as they stream.
pub(super) fn stream_vector_scalar(
    ev: &Evaluator,
    b: &Binary,
    ctx: &Ctx,
    sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
) -> Result<(), EvalError> {
    let swap = b.lhs.value_type() == crate::ast::ValueType::Scalar;
    let (vector, scalar) = if swap { (&b.rhs, &b.lhs) } else { (&b.lhs, &b.rhs) };
    let s = ev.eval_scalar(scalar, ctx)?;
    ev.stream(vector, ctx, &mut |series: Series| {
        for out in vector_scalar(ev, b, vec![series], &s, swap, ctx) {
            sink(out)?;
        }
        Ok(())
    })
}

/// Points held by a value, for the samples budget.
pub(super) fn held(v: &Val) -> usize {
    match v {
        Val::Vector(s) | Val::Matrix(s) => s.iter().map(Series::len).sum(),
        _ => 0,
    }
}

/// Arithmetic drops the metric name; comparisons, set operators and histogram trims keep it.
fn is_arithmetic(op: BinaryOp) -> bool {
    !op.is_comparison() && !op.is_set() && !is_trim(op)
}

fn is_trim(op: BinaryOp) -> bool {
    matches!(op, BinaryOp::TrimUpper | BinaryOp::TrimLower)
}

/// `(value, keep)` of one pair of floats: arithmetic always keeps; a comparison keeps the
/// left value when true.
fn elem(op: BinaryOp, l: f64, r: f64) -> (f64, bool) {
    if op.is_comparison() {
        (l, op.compare(l, r))
    } else {
        (op.apply_scalar(l, r), true)
    }
}

/// A sample of either kind, as an operand.
#[derive(Clone, Copy)]
enum Operand<'a> {
    F(f64),
    H(&'a Arc<FloatHistogram>),
}

impl Operand<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Operand::F(_) => "float",
            Operand::H(_) => "histogram",
        }
    }
}

/// A result sample of either kind.
enum Outcome {
    F(f64),
    H(Arc<FloatHistogram>),
}

/// `l op r` where at least one side is a histogram (Prometheus' `vectorElemBinop`): the value
/// and whether it is kept, or None when the operation is undefined for these kinds (an info
/// says so) or the histograms cannot be combined (a warning says so).
fn elem_histogram(ev: &Evaluator, b: &Binary, l: Operand, r: Operand) -> Option<(Outcome, bool)> {
    let pos = b.lhs.start;
    let incompatible = || {
        ev.info(
            pos,
            format!(
                "incompatible sample types encountered for binary operator {:?}: {} {} {}",
                b.op.as_str(),
                l.kind(),
                b.op.as_str(),
                r.kind()
            ),
        );
        None
    };
    let compacted = |mut h: FloatHistogram| {
        h.compact();
        Outcome::H(Arc::new(h))
    };
    match (l, r, b.op) {
        (Operand::F(f), Operand::H(h), BinaryOp::Mul) | (Operand::H(h), Operand::F(f), BinaryOp::Mul) => {
            let mut h = (**h).clone();
            h.mul(f);
            Some((compacted(h), true))
        }
        (Operand::H(h), Operand::F(cut), BinaryOp::TrimUpper | BinaryOp::TrimLower) => {
            Some((Outcome::H(Arc::new(super::native_histograms::trim(h, cut, b.op == BinaryOp::TrimUpper))), true))
        }
        (Operand::H(h), Operand::F(f), BinaryOp::Div) => {
            let mut h = (**h).clone();
            h.div(f);
            Some((compacted(h), true))
        }
        (Operand::H(x), Operand::H(y), BinaryOp::Add | BinaryOp::Sub) => {
            let mut h = (**x).clone();
            let r = if b.op == BinaryOp::Add { h.add(y) } else { h.sub(y) };
            match r {
                Ok(c) => {
                    if c.custom_bounds_reconciled {
                        let what = if b.op == BinaryOp::Add { "addition" } else { "subtraction" };
                        ev.info(pos, format!("mismatched custom buckets were reconciled during {what}"));
                    }
                    if c.counter_reset_collision {
                        let what = if b.op == BinaryOp::Add { "addition" } else { "subtraction" };
                        ev.warn(pos, format!("conflicting counter resets during histogram {what}"));
                    }
                }
                Err(HistogramError::IncompatibleSchema) | Err(_) => {
                    ev.warn(
                        pos,
                        format!("incompatible bucket layout encountered for binary operator {}", b.op.as_str()),
                    );
                    return None;
                }
            }
            if b.op == BinaryOp::Sub {
                h.hint = CounterResetHint::Gauge;
            }
            Some((compacted(h), true))
        }
        (Operand::H(x), Operand::H(y), BinaryOp::Eql | BinaryOp::Neq) => {
            let (mut p, mut q) = ((**x).clone(), (**y).clone());
            p.compact();
            q.compact();
            let equal = p.bit_eq(&q);
            Some((Outcome::H(x.clone()), equal == (b.op == BinaryOp::Eql)))
        }
        _ => incompatible(),
    }
}

fn vector_scalar(ev: &Evaluator, b: &Binary, mut v: Vec<Series>, s: &[f64], swap: bool, ctx: &Ctx) -> Vec<Series> {
    let drop = is_arithmetic(b.op) || b.return_bool;
    for series in &mut v {
        if !series.hists.is_empty() {
            let mut steps = ctx.walker();
            for p in std::mem::take(&mut series.hists) {
                let sv = s[steps.index(p.t)];
                let (l, r) = if swap { (Operand::F(sv), Operand::H(&p.h)) } else { (Operand::H(&p.h), Operand::F(sv)) };
                match elem_histogram(ev, b, l, r) {
                    Some((Outcome::H(h), true)) if !b.return_bool => series.hists.push(HPoint { t: p.t, h }),
                    Some((Outcome::F(f), true)) if !b.return_bool => series.points.push(Point { t: p.t, f }),
                    Some((_, keep)) if b.return_bool => {
                        series.points.push(Point { t: p.t, f: f64::from(u8::from(keep)) })
                    }
                    _ => {}
                }
            }
            series.points.sort_by_key(|p| p.t);
        }
        if arithmetic_in_place(b.op, swap, &mut series.points, s, ctx) {
            series.drop_name |= drop;
            continue;
        }
        let mut steps = ctx.walker();
        series.points.retain_mut(|p| {
            let sv = s[steps.index(p.t)];
            let (l, r) = if swap { (sv, p.f) } else { (p.f, sv) };
            let (mut val, mut keep) = elem(b.op, l, r);
            if b.op.is_comparison() && swap {
                // The vector's value is kept even when the scalar is on the left.
                val = p.f;
            }
            if b.return_bool {
                val = if keep { 1.0 } else { 0.0 };
                keep = true;
            }
            p.f = val;
            keep
        });
        series.drop_name |= drop;
    }
    v.retain(|s| !s.is_empty());
    v
}

/// `point op scalar` (or `scalar op point` when `swap`) for each point in place, for the four
/// IEEE operations, which keep every point: a loop with the operation chosen once, over the
/// scalar's steps alongside the points when they fill consecutive steps (`1 - x`, `x * 100`:
/// the common dashboard shapes), rather than a compaction deciding on each point. False,
/// having changed nothing, for other operations.
fn arithmetic_in_place(op: BinaryOp, swap: bool, points: &mut [Point], s: &[f64], ctx: &Ctx) -> bool {
    fn apply(points: &mut [Point], s: &[f64], ctx: &Ctx, f: impl Fn(f64, f64) -> f64) {
        match ctx.first_step(points) {
            None => {}
            Some((from, true)) => {
                for (p, &sv) in points.iter_mut().zip(&s[from..]) {
                    p.f = f(p.f, sv);
                }
            }
            Some((from, false)) => {
                let mut steps = ctx.walker_from(from);
                for p in points {
                    p.f = f(p.f, s[steps.index(p.t)]);
                }
            }
        }
    }
    // The operands in the order the general path passes them (NaN payloads depend on it).
    match (op, swap) {
        (BinaryOp::Add, false) => apply(points, s, ctx, |v, sv| v + sv),
        (BinaryOp::Add, true) => apply(points, s, ctx, |v, sv| sv + v),
        (BinaryOp::Sub, false) => apply(points, s, ctx, |v, sv| v - sv),
        (BinaryOp::Sub, true) => apply(points, s, ctx, |v, sv| sv - v),
        (BinaryOp::Mul, false) => apply(points, s, ctx, |v, sv| v * sv),
        (BinaryOp::Mul, true) => apply(points, s, ctx, |v, sv| sv * v),
        (BinaryOp::Div, false) => apply(points, s, ctx, |v, sv| v / sv),
        (BinaryOp::Div, true) => apply(points, s, ctx, |v, sv| sv / v),
        _ => return false,
    }
    true
}

/// A signature as a hashable key.
fn sig_key(labels: &Labels, m: &VectorMatching) -> String {
    let mut k = String::new();
    for l in signature(labels, m.on, &m.labels) {
        k.push_str(&l.name);
        k.push('\u{ff}');
        k.push_str(&l.value);
        k.push('\u{ff}');
    }
    k
}

/// For each signature, the steps at which some series with it has a point.
fn presence(series: &[Series], m: &VectorMatching, ctx: &Ctx) -> HashMap<String, Vec<bool>> {
    let mut out: HashMap<String, Vec<bool>> = HashMap::new();
    for s in series {
        let steps = out.entry(sig_key(&s.labels, m)).or_insert_with(|| vec![false; ctx.n]);
        for t in s.points.iter().map(|p| p.t).chain(s.hists.iter().map(|p| p.t)) {
            steps[ctx.index(t)] = true;
        }
    }
    out
}

fn and_unless(mut l: Vec<Series>, r: &[Series], m: &VectorMatching, ctx: &Ctx, and: bool) -> Vec<Series> {
    let present = presence(r, m, ctx);
    for s in &mut l {
        let steps = present.get(&sig_key(&s.labels, m));
        let kept = |t: i64| steps.is_some_and(|st| st[ctx.index(t)]) == and;
        s.points.retain(|p| kept(p.t));
        s.hists.retain(|p| kept(p.t));
    }
    l.retain(|s| !s.is_empty());
    l
}

fn or(mut l: Vec<Series>, r: Vec<Series>, m: &VectorMatching, ctx: &Ctx) -> Vec<Series> {
    let present = presence(&l, m, ctx);
    for mut s in r {
        let steps = present.get(&sig_key(&s.labels, m));
        let free = |t: i64| !steps.is_some_and(|st| st[ctx.index(t)]);
        s.points.retain(|p| free(p.t));
        s.hists.retain(|p| free(p.t));
        if !s.is_empty() {
            l.push(s);
        }
    }
    l
}

/// The labels of a result: the "many" side's labels, narrowed for one-to-one matching, plus
/// the `group_x(…)` labels copied from the "one" side.
fn result_labels(many: &Labels, one: &Labels, m: &VectorMatching) -> Labels {
    let mut b = LabelsBuilder::new(many);
    if m.card == Cardinality::OneToOne {
        let listed: Vec<String> =
            many.iter().map(|l| l.name.to_string()).filter(|n| m.labels.contains(n) != m.on).collect();
        for n in listed {
            b.del(&n);
        }
    }
    for name in &m.include {
        match one.get(name) {
            Some(v) => {
                b.set(name.as_str(), v);
            }
            None => {
                b.del(name);
            }
        }
    }
    b.build().unwrap_or_else(|_| many.clone())
}

/// The sample of either kind `s` has at step time `t`. `cursor` is where the float search
/// starts: the index after the last float found, so a series read in step order is walked,
/// not searched; a time before it (histograms come after all floats) searches from the start.
fn value_at<'a>(s: &'a Series, t: i64, cursor: &mut usize) -> Option<Operand<'a>> {
    let from = if *cursor > 0 && s.points.get(*cursor - 1).is_none_or(|p| p.t >= t) { 0 } else { *cursor };
    let rest = &s.points[from.min(s.points.len())..];
    // Usually the very next point; a gap of missing steps falls back to a search.
    let found = match rest.first() {
        Some(p) if p.t == t => Ok(0),
        _ => rest.binary_search_by_key(&t, |p| p.t),
    };
    if let Ok(i) = found {
        *cursor = from + i + 1;
        return Some(Operand::F(rest[i].f));
    }
    s.hists.binary_search_by_key(&t, |p| p.t).ok().map(|i| Operand::H(&s.hists[i].h))
}

/// The result series of a vector/vector operation, found by their labels.
#[derive(Default)]
struct Output {
    series: Vec<Series>,
    index: HashMap<Labels, usize>,
    /// Per series: a float point came at or before the one before it (pairs from several
    /// input series, or a repeat), so its points need sorting and checking at the end; noted
    /// as they come rather than found by reading every point of every result again.
    disordered: Vec<bool>,
}

impl Output {
    /// The index of the output series with `labels`, created empty if new.
    fn slot(&mut self, labels: &Labels) -> usize {
        let (series, disordered) = (&mut self.series, &mut self.disordered);
        *self.index.entry(labels.clone()).or_insert_with(|| {
            series.push(Series::new(labels.clone(), Vec::new()));
            disordered.push(false);
            series.len() - 1
        })
    }

    fn push(&mut self, idx: usize, t: i64, val: Outcome, drop_name: bool) {
        let s = &mut self.series[idx];
        match val {
            Outcome::F(f) => {
                self.disordered[idx] |= s.points.last().is_some_and(|p| p.t >= t);
                s.points.push(Point { t, f });
            }
            Outcome::H(h) => s.hists.push(HPoint { t, h }),
        }
        s.drop_name |= drop_name;
    }
}

/// Every sample of `s`: its floats, then its histograms (each in time order; results are put
/// in time order at the end).
fn operands(s: &Series) -> impl Iterator<Item = (i64, Operand<'_>)> {
    s.points.iter().map(|p| (p.t, Operand::F(p.f))).chain(s.hists.iter().map(|p| (p.t, Operand::H(&p.h))))
}

fn vector_vector(
    ev: &Evaluator,
    b: &Binary,
    m: &VectorMatching,
    l: Vec<Series>,
    r: Vec<Series>,
    ctx: &Ctx,
) -> Result<Vec<Series>, EvalError> {
    let swapped = m.card == Cardinality::OneToMany;
    let (many, one) = if swapped { (r, l) } else { (l, r) };
    let one_side = if swapped { "left" } else { "right" };

    let mut one_by_sig: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, s) in one.iter().enumerate() {
        one_by_sig.entry(sig_key(&s.labels, m)).or_default().push(i);
    }
    // Where a signature has several series on the "one" side, which one has a point at each
    // step; two at the same step is many-to-many matching, refused.
    let mut owner: HashMap<&str, Vec<Option<usize>>> = HashMap::new();
    for (sig, idx) in &one_by_sig {
        if idx.len() < 2 {
            continue;
        }
        let mut at: Vec<Option<usize>> = vec![None; ctx.n];
        for &i in idx {
            for t in one[i].points.iter().map(|p| p.t).chain(one[i].hists.iter().map(|p| p.t)) {
                let k = ctx.index(t);
                if let Some(prev) = at[k] {
                    let (a, c) = sorted_pair(&one[prev].labels, &one[i].labels);
                    let matched = Labels::from_sorted_unchecked(signature(&one[i].labels, m.on, &m.labels));
                    return Err(exec(format!(
                        "found duplicate series for the match group {} on the {one_side} hand-side of the operation: [{}, {}];many-to-many matching not allowed: matching labels must be unique on one side",
                        prom_labels_string(&matched),
                        prom_labels_string(a),
                        prom_labels_string(c),
                    )));
                }
                at[k] = Some(i);
            }
        }
        owner.insert(sig.as_str(), at);
    }

    let mut many_count: HashMap<String, usize> = HashMap::new();
    let many_sigs: Vec<String> = many.iter().map(|s| sig_key(&s.labels, m)).collect();
    for s in &many_sigs {
        *many_count.entry(s.clone()).or_default() += 1;
    }
    // One-to-one: which steps of a shared signature already produced a result.
    let mut matched: HashMap<&str, Vec<bool>> = HashMap::new();

    let mut out = Output::default();
    let drop_arith = is_arithmetic(b.op) || b.return_bool;
    let no_ones: Vec<usize> = Vec::new();
    let empty = Labels::empty();
    // `fill_right(v)` stands in for a missing "one"-side sample, `fill_left(v)` for a missing
    // "many"-side one (the sides after group_right's swap, as in Prometheus).
    let (fill_many, fill_one) = (b.fill_left, b.fill_right);
    // The value of a pair, None when it is filtered out or undefined for its kinds.
    let value = |l: Operand, r: Operand| -> Option<Outcome> {
        let (val, keep) = match (l, r) {
            (Operand::F(fl), Operand::F(fr)) => {
                let (v, k) = elem(b.op, fl, fr);
                (Outcome::F(v), k)
            }
            _ => elem_histogram(ev, b, l, r)?,
        };
        match b.return_bool {
            true => Some(Outcome::F(if keep { 1.0 } else { 0.0 })),
            false => keep.then_some(val),
        }
    };
    // Where each "one"-side series was last read: steps come in order, so each lookup starts
    // there instead of searching the whole series.
    let mut cursors = vec![0usize; one.len()];
    for (ms, sig) in many.iter().zip(&many_sigs) {
        let ones = one_by_sig.get(sig).unwrap_or(&no_ones);
        if ones.is_empty() && fill_one.is_none() {
            continue;
        }
        ev.check("binary operation")?;
        let shared = many_count[sig] > 1 && m.card == Cardinality::OneToOne;
        // The "one" series this series matched last (None: filled), the result's labels and,
        // once a point was kept, its output series: labels are built and looked up once per
        // pairing, not once per step.
        let mut pairing: Option<(Option<usize>, Labels, Option<usize>)> = None;
        for (t, mv) in operands(ms) {
            // The step's index only where it is needed (a division per point otherwise).
            let oi = match ones.len() {
                0 => None,
                1 => Some(ones[0]),
                _ => owner[sig.as_str()][ctx.index(t)],
            };
            let found = oi.and_then(|oi| value_at(&one[oi], t, &mut cursors[oi]).map(|of| (oi, of)));
            let (oi, of) = match (found, fill_one) {
                (Some((oi, of)), _) => (Some(oi), of),
                (None, Some(v)) => (None, Operand::F(v)),
                (None, None) => continue,
            };
            // Checked before a comparison filters, so the error does not depend on values.
            if shared && oi.is_some() {
                let steps = matched.entry(sig.as_str()).or_insert_with(|| vec![false; ctx.n]);
                let k = ctx.index(t);
                if steps[k] {
                    return Err(exec(
                        "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)",
                    ));
                }
                steps[k] = true;
            }
            if pairing.as_ref().is_none_or(|p| p.0 != oi) {
                pairing = Some((oi, result_labels(&ms.labels, oi.map_or(&empty, |i| &one[i].labels), m), None));
            }
            let (fl, fr) = if swapped { (of, mv) } else { (mv, of) };
            // Two floats (nearly every pair) without the call to `value`, whose answer came
            // back through memory: reading it stalled on the stores just made (two fifths of
            // this function's time for `a / b` over 500 series).
            let val = match (fl, fr) {
                (Operand::F(l), Operand::F(r)) if !b.return_bool => {
                    let (v, keep) = elem(b.op, l, r);
                    keep.then_some(Outcome::F(v))
                }
                _ => value(fl, fr),
            };
            if let Some(val) = val {
                let (_, labels, slot) = pairing.as_mut().expect("set above");
                let idx = *slot.get_or_insert_with(|| out.slot(labels));
                out.push(idx, t, val, drop_arith || ms.drop_name);
            }
        }
    }
    if let Some(fill) = fill_many {
        // "One"-side samples no "many"-side sample matched: a result labelled with the match
        // group's labels.
        let present = presence(&many, m, ctx);
        for o in &one {
            let steps = present.get(&sig_key(&o.labels, m));
            let labels = Labels::from_sorted_unchecked(signature(&o.labels, m.on, &m.labels));
            let mut slot = None;
            for (t, ov) in operands(o) {
                if steps.is_some_and(|st| st[ctx.index(t)]) {
                    continue;
                }
                let (fl, fr) = if swapped { (ov, Operand::F(fill)) } else { (Operand::F(fill), ov) };
                if let Some(val) = value(fl, fr) {
                    let idx = *slot.get_or_insert_with(|| out.slot(&labels));
                    out.push(idx, t, val, true);
                }
            }
        }
    }
    let Output { series: mut out, disordered, .. } = out;
    for (s, disordered) in out.iter_mut().zip(disordered) {
        debug_assert_eq!(disordered, s.points.windows(2).any(|w| w[0].t >= w[1].t));
        s.hists.sort_by_key(|p| p.t);
        let clash = !s.hists.is_empty() && s.hists.iter().any(|h| s.points.binary_search_by_key(&h.t, |p| p.t).is_ok());
        if clash || s.hists.windows(2).any(|w| w[0].t == w[1].t) || disordered {
            s.points.sort_by_key(|p| p.t);
            let clash = clash || s.hists.iter().any(|h| s.points.binary_search_by_key(&h.t, |p| p.t).is_ok());
            if clash || s.points.windows(2).any(|w| w[0].t == w[1].t) || s.hists.windows(2).any(|w| w[0].t == w[1].t) {
                return Err(exec(if m.card == Cardinality::OneToOne {
                    "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
                } else {
                    "multiple matches for labels: grouping labels must ensure unique matches"
                }));
            }
        }
    }
    Ok(out)
}

fn sorted_pair<'a>(a: &'a Labels, b: &'a Labels) -> (&'a Labels, &'a Labels) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-place arithmetic gives, bit for bit, what the general path's `elem` gives with
    /// the operands in the same order, over consecutive and gapped points, NaNs included; and
    /// leaves the points alone for operations it does not take.
    #[test]
    fn arithmetic_in_place_is_elem_in_place() {
        let ctx = Ctx { start: 1_000, step: 10_000, n: 12 };
        let scalar: Vec<f64> = (0..ctx.n).map(|i| if i == 5 { f64::NAN } else { 1.5 - i as f64 }).collect();
        let values = [3.0, -0.0, f64::NAN, 7.25, f64::INFINITY, 1e300, -2.0];
        for steps in [vec![0, 1, 2, 3, 4, 5, 6], vec![2, 3, 5, 8, 9, 10, 11], vec![], vec![11]] {
            let points: Vec<Point> =
                steps.iter().zip(values.iter().cycle()).map(|(&i, &f)| Point { t: ctx.ts(i), f }).collect();
            for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div] {
                for swap in [false, true] {
                    let mut got = points.clone();
                    assert!(arithmetic_in_place(op, swap, &mut got, &scalar, &ctx));
                    for (p, g) in points.iter().zip(&got) {
                        let sv = scalar[ctx.index(p.t)];
                        let (l, r) = if swap { (sv, p.f) } else { (p.f, sv) };
                        assert_eq!(g.f.to_bits(), elem(op, l, r).0.to_bits(), "{op:?} swap {swap} at {}", p.t);
                        assert_eq!(g.t, p.t);
                    }
                }
            }
            for op in [BinaryOp::Mod, BinaryOp::Pow, BinaryOp::Gtr] {
                let mut got = points.clone();
                assert!(!arithmetic_in_place(op, false, &mut got, &scalar, &ctx));
                assert!(got.iter().zip(&points).all(|(a, b)| a.f.to_bits() == b.f.to_bits()));
            }
        }
    }
}
