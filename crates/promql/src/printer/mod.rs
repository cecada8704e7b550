//! PromQL text from a syntax tree, as Prometheus writes it: `Display` for [`Expr`] is its
//! `String()` (one line, matchers sorted, `sum by (job) (x)`), and [`pretty`] is its
//! `Pretty()`, what `/api/v1/format_query` answers: nodes longer than 100 bytes are split over
//! indented lines. Printing what the parser read reads back as the same tree, and the
//! Prometheus compatibility test compares the text with Prometheus' own.
//!
//! One deliberate difference: Prometheus drops `ignoring () group_left ()` (no labels) when
//! printing, which changes the query's meaning; it is kept here.

use std::fmt::{self, Display, Formatter, Write as _};

use crate::ast::{
    Aggregate, At, Binary, Cardinality, Duration, DurationExpr, Expr, ExprKind, RangeMode, VectorSelector,
};
use crate::eval::labels::go_quote;
use crate::lexer::{is_ident_char, is_ident_start};

/// Lines longer than this are split (Prometheus' `maxCharactersPerLine`).
const LINE_MAX: usize = 100;
const INDENT: &str = "  ";

impl Display for Expr {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExprKind::Number(v) => f.write_str(&go_float(*v)),
            ExprKind::String(Ok(s)) => f.write_str(&go_quote(s)),
            ExprKind::String(Err(b)) => f.write_str(&crate::eval::labels::go_quote_bytes(b)),
            ExprKind::Vector(v) => write_selector(f, v, None),
            ExprKind::Matrix(m) => write_selector(f, &m.vector, Some(&m.range)),
            ExprKind::Subquery(s) => {
                write!(f, "{}[{}:", s.expr, duration(&s.range))?;
                if let Some(step) = &s.step {
                    f.write_str(&duration(step))?;
                }
                f.write_char(']')?;
                write_at_offset(f, s.at, s.offset.as_ref())
            }
            ExprKind::Paren(e) => write!(f, "({e})"),
            ExprKind::Neg(e) => write!(f, "-{e}"),
            ExprKind::Pos(e) => write!(f, "+{e}"),
            ExprKind::Binary(b) => write!(f, "{} {} {}", b.lhs, operator(b), b.rhs),
            ExprKind::Aggregate(a) => {
                f.write_str(&aggregate_head(a))?;
                f.write_char('(')?;
                if let Some(p) = &a.param {
                    write!(f, "{p}, ")?;
                }
                write!(f, "{})", a.expr)
            }
            ExprKind::Call(c) => {
                write!(f, "{}(", c.func.name)?;
                for (i, a) in c.args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_char(')')
            }
        }
    }
}

/// `expr` as Prometheus' `format_query` writes it: on one line when it fits in 100 bytes,
/// else split at its operators, calls, aggregations and parentheses, two spaces per level.
pub fn pretty(expr: &Expr) -> String {
    pretty_at(expr, 0)
}

fn pretty_at(e: &Expr, level: usize) -> String {
    let indent = INDENT.repeat(level);
    let line = e.to_string();
    let fits = line.len() <= LINE_MAX;
    match &e.kind {
        _ if fits && !matches!(e.kind, ExprKind::Neg(_) | ExprKind::Pos(_) | ExprKind::Subquery(_)) => {
            format!("{indent}{line}")
        }
        // As Prometheus: a subquery that fits is written without its indent.
        ExprKind::Subquery(_) if fits => line,
        ExprKind::Subquery(s) => {
            let mut suffix = format!("[{}:", duration(&s.range));
            if let Some(step) = &s.step {
                suffix.push_str(&duration(step));
            }
            suffix.push(']');
            let mut out = pretty_at(&s.expr, level) + &suffix;
            let _ = write_at_offset_string(&mut out, s.at, s.offset.as_ref());
            out
        }
        ExprKind::Neg(inner) => format!("{indent}-{}", pretty_at(inner, level).trim()),
        ExprKind::Pos(inner) => format!("{indent}+{}", pretty_at(inner, level).trim()),
        ExprKind::Paren(inner) => format!("{indent}(\n{}\n{indent})", pretty_at(inner, level + 1)),
        ExprKind::Binary(b) => {
            format!("{}\n{indent}{}\n{}", pretty_at(&b.lhs, level + 1), operator(b), pretty_at(&b.rhs, level + 1))
        }
        ExprKind::Aggregate(a) => {
            let mut out = format!("{indent}{}(\n", aggregate_head(a));
            if let Some(p) = &a.param {
                out.push_str(&pretty_at(p, level + 1));
                out.push_str(",\n");
            }
            out.push_str(&pretty_at(&a.expr, level + 1));
            out.push('\n');
            out.push_str(&indent);
            out.push(')');
            out
        }
        ExprKind::Call(c) => {
            let args: Vec<String> = c.args.iter().map(|a| pretty_at(a, level + 1)).collect();
            format!("{indent}{}(\n{}\n{indent})", c.func.name, args.join(",\n"))
        }
        // Leaves are never split.
        _ => format!("{indent}{line}"),
    }
}

/// Whether the lexer reads `s` as one identifier (`colons`: as a metric name, which may hold
/// `:`); empty: no name.
fn is_ident(s: &str, colons: bool) -> bool {
    let colon = |c: u8| colons && c == b':';
    let b = s.as_bytes();
    b.first().is_some_and(|&c| is_ident_start(c) || colon(c)) && b[1..].iter().all(|&c| is_ident_char(c) || colon(c))
}

/// Whether `s` is written bare as a metric name; empty: no name.
fn is_metric_name(s: &str) -> bool {
    s.is_empty() || is_ident(s, true)
}

/// A label name, quoted when it is not an identifier (`"service.name"`).
fn label_name(s: &str) -> String {
    if is_ident(s, false) {
        s.to_owned()
    } else {
        go_quote(s)
    }
}

fn label_list(names: &[String]) -> String {
    names.iter().map(|n| label_name(n)).collect::<Vec<_>>().join(", ")
}

/// `sum`, `sum by (a, b) `, `sum without (a) `: what precedes the parenthesis.
fn aggregate_head(a: &Aggregate) -> String {
    let mut s = a.op.name().to_owned();
    if a.without {
        let _ = write!(s, " without ({}) ", label_list(&a.grouping));
    } else if !a.grouping.is_empty() {
        let _ = write!(s, " by ({}) ", label_list(&a.grouping));
    }
    s
}

/// The operator with `bool`, vector matching and fill modifiers: `/ on (job) group_left (x)`.
fn operator(b: &Binary) -> String {
    let mut s = b.op.as_str().to_owned();
    if b.return_bool {
        s.push_str(" bool");
    }
    if let Some(m) = &b.matching {
        let grouped = matches!(m.card, Cardinality::ManyToOne | Cardinality::OneToMany);
        if m.on || !m.labels.is_empty() || grouped {
            let _ = write!(s, " {} ({})", if m.on { "on" } else { "ignoring" }, label_list(&m.labels));
        }
        if grouped {
            let side = if m.card == Cardinality::ManyToOne { "left" } else { "right" };
            let _ = write!(s, " group_{side} ({})", label_list(&m.include));
        }
    }
    match (b.fill_left, b.fill_right) {
        (Some(l), Some(r)) if l.to_bits() == r.to_bits() => {
            let _ = write!(s, " fill({})", go_float(l));
        }
        (l, r) => {
            if let Some(l) = l {
                let _ = write!(s, " fill_left({})", go_float(l));
            }
            if let Some(r) = r {
                let _ = write!(s, " fill_right({})", go_float(r));
            }
        }
    }
    s
}

/// `name{a="b",c=~"d"}` (the name's own matcher left out, the others sorted as text), then
/// `[range]`, `@`, `offset` and the range mode.
fn write_selector(f: &mut Formatter<'_>, v: &VectorSelector, range: Option<&Duration>) -> fmt::Result {
    let name = v.name.as_deref().unwrap_or("");
    let mut matchers: Vec<String> = v
        .matchers
        .iter()
        .filter(|m| !(m.name == "__name__" && m.op == strata_model::MatchOp::Equal && m.value == name))
        .map(|m| format!("{}{}{}", label_name(&m.name), m.op.as_str(), go_quote(&m.value)))
        .collect();
    matchers.sort();
    if is_metric_name(name) {
        f.write_str(name)?;
        if !matchers.is_empty() {
            write!(f, "{{{}}}", matchers.join(","))?;
        }
    } else {
        // A name that is not an identifier is written quoted, first inside the braces, as
        // Prometheus 3 writes UTF-8 names.
        matchers.insert(0, go_quote(name));
        write!(f, "{{{}}}", matchers.join(","))?;
    }
    if let Some(r) = range {
        write!(f, "[{}]", duration(r))?;
    }
    write_at_offset(f, v.at, v.offset.as_ref())?;
    match v.mode {
        RangeMode::Plain => Ok(()),
        RangeMode::Anchored => f.write_str(" anchored"),
        RangeMode::Smoothed => f.write_str(" smoothed"),
    }
}

fn write_at_offset(f: &mut Formatter<'_>, at: Option<At>, offset: Option<&Duration>) -> fmt::Result {
    let mut s = String::new();
    write_at_offset_string(&mut s, at, offset)?;
    f.write_str(&s)
}

fn write_at_offset_string(s: &mut String, at: Option<At>, offset: Option<&Duration>) -> fmt::Result {
    match at {
        Some(At::Ms(ms)) => write!(s, " @ {:.3}", ms as f64 / 1000.0)?,
        Some(At::Start) => s.push_str(" @ start()"),
        Some(At::End) => s.push_str(" @ end()"),
        None => {}
    }
    match offset {
        Some(Duration::Ms(ms)) if *ms > 0 => write!(s, " offset {}", strata_model::format_duration_ms(*ms))?,
        Some(Duration::Ms(ms)) if *ms < 0 => write!(s, " offset -{}", strata_model::format_duration_ms(-*ms))?,
        Some(Duration::Ms(_)) | None => {}
        Some(d @ Duration::Expr(_)) => write!(s, " offset {}", duration(d))?,
    }
    Ok(())
}

/// A duration as written in a range or offset: `5m`, or a duration expression in parentheses.
fn duration(d: &Duration) -> String {
    match d {
        Duration::Ms(ms) => strata_model::format_duration_ms(*ms),
        Duration::Expr(e) => format!("({})", duration_expr(e)),
    }
}

fn duration_expr(e: &DurationExpr) -> String {
    match e {
        DurationExpr::Seconds(s) => go_float(*s),
        DurationExpr::Step => "step()".to_owned(),
        DurationExpr::Range => "range()".to_owned(),
        DurationExpr::Neg(x) => format!("-{}", duration_operand(x)),
        DurationExpr::Binary(op, a, b) => format!("{} {} {}", duration_operand(a), op.as_str(), duration_operand(b)),
        DurationExpr::MinOf(a, b) => format!("min_of({}, {})", duration_expr(a), duration_expr(b)),
        DurationExpr::MaxOf(a, b) => format!("max_of({}, {})", duration_expr(a), duration_expr(b)),
    }
}

/// An operand of a duration operator, parenthesized when it is an operation itself.
fn duration_operand(e: &DurationExpr) -> String {
    match e {
        DurationExpr::Binary(..) | DurationExpr::Neg(_) => format!("({})", duration_expr(e)),
        _ => duration_expr(e),
    }
}

/// A float as Prometheus writes a number literal (Go's `%v`, `strconv.FormatFloat(v, 'g', -1,
/// 64)`): the shortest digits that read back, in exponent form when the exponent is below -4
/// or 6 and up (`1e+06`, `1e-07`, `123456`).
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // Rust's `{:e}` gives the shortest digits that read back: `d.ddde±x`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent");
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    format!("{v}")
}

#[cfg(test)]
mod tests;
