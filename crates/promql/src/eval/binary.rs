//! Binary operators over whole series: scalar/scalar, vector/scalar, and vector/vector with
//! Prometheus' matching (`on`, `ignoring`, `group_left`, `group_right`), set operators, and the
//! errors for ambiguous matches. Matching is done once per series signature, then step by step.

use std::collections::HashMap;

use strata_model::{Labels, LabelsBuilder};

use super::labels::{prom_labels_string, signature};
use super::{Ctx, Evaluator, Val};
use crate::ast::{Binary, BinaryOp, Cardinality, VectorMatching};
use crate::error::{exec, EvalError};
use crate::value::{Point, Series};

pub(super) fn eval(ev: &Evaluator, b: &Binary, ctx: &Ctx) -> Result<Val, EvalError> {
    if matches!(b.op, BinaryOp::TrimUpper | BinaryOp::TrimLower) {
        return Err(exec(format!(
            "operator {} applies to native histograms, which are not supported yet",
            b.op.as_str()
        )));
    }
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
    !matches!(b.op, BinaryOp::TrimUpper | BinaryOp::TrimLower)
        && matches!((b.lhs.value_type(), b.rhs.value_type()), (Vector, Scalar) | (Scalar, Vector))
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
        for out in vector_scalar(b, vec![series], &s, swap, ctx) {
            sink(out)?;
        }
        Ok(())
    })
}

/// Points held by a value, for the samples budget.
pub(super) fn held(v: &Val) -> usize {
    match v {
        Val::Vector(s) | Val::Matrix(s) => s.iter().map(|s| s.points.len()).sum(),
        _ => 0,
    }
}

fn is_arithmetic(op: BinaryOp) -> bool {
    !op.is_comparison() && !op.is_set()
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

fn vector_scalar(b: &Binary, mut v: Vec<Series>, s: &[f64], swap: bool, ctx: &Ctx) -> Vec<Series> {
    let drop = is_arithmetic(b.op) || b.return_bool;
    for series in &mut v {
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
    v.retain(|s| !s.points.is_empty());
    v
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
        for p in &s.points {
            steps[ctx.index(p.t)] = true;
        }
    }
    out
}

fn and_unless(mut l: Vec<Series>, r: &[Series], m: &VectorMatching, ctx: &Ctx, and: bool) -> Vec<Series> {
    let present = presence(r, m, ctx);
    for s in &mut l {
        let steps = present.get(&sig_key(&s.labels, m));
        s.points.retain(|p| steps.is_some_and(|st| st[ctx.index(p.t)]) == and);
    }
    l.retain(|s| !s.points.is_empty());
    l
}

fn or(mut l: Vec<Series>, r: Vec<Series>, m: &VectorMatching, ctx: &Ctx) -> Vec<Series> {
    let present = presence(&l, m, ctx);
    for mut s in r {
        let steps = present.get(&sig_key(&s.labels, m));
        s.points.retain(|p| !steps.is_some_and(|st| st[ctx.index(p.t)]));
        if !s.points.is_empty() {
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

fn point_at(points: &[Point], t: i64) -> Option<f64> {
    points.binary_search_by_key(&t, |p| p.t).ok().map(|i| points[i].f)
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
            for p in &one[i].points {
                let k = ctx.index(p.t);
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

    let mut out: Vec<Series> = Vec::new();
    let mut out_index: HashMap<Labels, usize> = HashMap::new();
    let drop_arith = is_arithmetic(b.op) || b.return_bool;
    let no_ones: Vec<usize> = Vec::new();
    let empty = Labels::empty();
    // `fill_right(v)` stands in for a missing "one"-side sample, `fill_left(v)` for a missing
    // "many"-side one (the sides after group_right's swap, as in Prometheus).
    let (fill_many, fill_one) = (b.fill_left, b.fill_right);
    let mut emit = |out: &mut Vec<Series>, labels: Labels, t: i64, fl: f64, fr: f64, dropped: bool| {
        let (mut val, mut keep) = elem(b.op, fl, fr);
        if b.return_bool {
            val = if keep { 1.0 } else { 0.0 };
            keep = true;
        }
        if !keep {
            return None;
        }
        let idx = *out_index.entry(labels.clone()).or_insert_with(|| {
            out.push(Series::new(labels, Vec::new()));
            out.len() - 1
        });
        out[idx].points.push(Point { t, f: val });
        out[idx].drop_name |= drop_arith || dropped;
        Some(idx)
    };
    for (ms, sig) in many.iter().zip(&many_sigs) {
        let ones = one_by_sig.get(sig).unwrap_or(&no_ones);
        if ones.is_empty() && fill_one.is_none() {
            continue;
        }
        ev.check("binary operation")?;
        let shared = many_count[sig] > 1 && m.card == Cardinality::OneToOne;
        // Result labels of the last "one" series this series matched (None: filled).
        let mut last: Option<(Option<usize>, Labels)> = None;
        for p in &ms.points {
            let k = ctx.index(p.t);
            let oi = match ones.len() {
                0 => None,
                1 => Some(ones[0]),
                _ => owner[sig.as_str()][k],
            };
            let found = oi.and_then(|oi| point_at(&one[oi].points, p.t).map(|of| (oi, of)));
            let (oi, of) = match (found, fill_one) {
                (Some((oi, of)), _) => (Some(oi), of),
                (None, Some(v)) => (None, v),
                (None, None) => continue,
            };
            // Checked before a comparison filters, so the error does not depend on values.
            if shared && oi.is_some() {
                let steps = matched.entry(sig.as_str()).or_insert_with(|| vec![false; ctx.n]);
                if steps[k] {
                    return Err(exec(
                        "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)",
                    ));
                }
                steps[k] = true;
            }
            let labels = match &last {
                Some((o, l)) if *o == oi => l.clone(),
                _ => {
                    let l = result_labels(&ms.labels, oi.map_or(&empty, |i| &one[i].labels), m);
                    last = Some((oi, l.clone()));
                    l
                }
            };
            let (fl, fr) = if swapped { (of, p.f) } else { (p.f, of) };
            emit(&mut out, labels, p.t, fl, fr, ms.drop_name);
        }
    }
    if let Some(fill) = fill_many {
        // "One"-side samples no "many"-side sample matched: a result labelled with the match
        // group's labels.
        let present = presence(&many, m, ctx);
        for o in &one {
            let steps = present.get(&sig_key(&o.labels, m));
            let labels = Labels::from_sorted_unchecked(signature(&o.labels, m.on, &m.labels));
            for p in &o.points {
                if steps.is_some_and(|st| st[ctx.index(p.t)]) {
                    continue;
                }
                let (fl, fr) = if swapped { (p.f, fill) } else { (fill, p.f) };
                emit(&mut out, labels.clone(), p.t, fl, fr, true);
            }
        }
    }
    for s in &mut out {
        if s.points.windows(2).any(|w| w[0].t >= w[1].t) {
            s.points.sort_by_key(|p| p.t);
            if s.points.windows(2).any(|w| w[0].t == w[1].t) {
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
