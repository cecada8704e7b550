//! A query's syntax without evaluating it: `/api/v1/parse_query` answers the syntax tree as
//! JSON, in the shape Prometheus' API gives it (its `translateAST`: `{"type":
//! "vectorSelector", ...}` nodes, durations in milliseconds), and `/api/v1/format_query` the
//! query formatted as Prometheus formats it (`strata_promql::printer::pretty`); both answer a
//! parse error with its `line:col` position. The web UI checks a query with the first as it is
//! typed and formats it with the second.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method};
use serde_json::{json, Value};
use strata_model::Matcher;
use strata_promql::ast::{At, Cardinality, Duration, Expr, ExprKind, ValueType, VectorSelector};

use super::{params, parse_promql, success, ApiError, ApiResult, AppState};

pub(super) async fn parse_query(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let expr = parsed(&st, method, raw, &headers, body).await?;
    Ok(success(tree(&expr)))
}

pub(super) async fn format_query(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let expr = parsed(&st, method, raw, &headers, body).await?;
    Ok(success(Value::String(strata_promql::printer::pretty(&expr))))
}

/// The request's `query`, parsed with the server's features and depth limit.
async fn parsed(
    st: &AppState,
    method: Method,
    raw: Option<String>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Expr, ApiError> {
    let p = params(st, &method, raw, headers, body).await?;
    let q = p.query()?;
    parse_promql(st, q)
}

/// The node and its children, as Prometheus names them.
pub fn tree(e: &Expr) -> Value {
    match &e.kind {
        ExprKind::Number(n) => json!({"type": "numberLiteral", "val": go_float(*n)}),
        ExprKind::String(s) => json!({
            "type": "stringLiteral",
            "val": match s { Ok(s) => s.clone(), Err(b) => String::from_utf8_lossy(b).into_owned() },
        }),
        ExprKind::Vector(v) => {
            let mut node = selector(v);
            node["type"] = json!("vectorSelector");
            node
        }
        ExprKind::Matrix(m) => {
            let mut node = selector(&m.vector);
            node["type"] = json!("matrixSelector");
            node["range"] = json!(ms(&m.range));
            node
        }
        ExprKind::Subquery(s) => json!({
            "type": "subquery",
            "expr": tree(&s.expr),
            "range": ms(&s.range),
            "offset": s.offset.as_ref().map_or(0, ms),
            "step": s.step.as_ref().map_or(0, ms),
            "timestamp": timestamp(s.at),
            "startOrEnd": start_or_end(s.at),
        }),
        ExprKind::Paren(inner) => json!({"type": "parenExpr", "expr": tree(inner)}),
        ExprKind::Neg(inner) => json!({"type": "unaryExpr", "op": "-", "expr": tree(inner)}),
        ExprKind::Pos(inner) => json!({"type": "unaryExpr", "op": "+", "expr": tree(inner)}),
        ExprKind::Binary(b) => json!({
            "type": "binaryExpr",
            "op": b.op.as_str(),
            "lhs": tree(&b.lhs),
            "rhs": tree(&b.rhs),
            "matching": b.matching.as_ref().map(|m| json!({
                "card": match m.card {
                    Cardinality::OneToOne => "one-to-one",
                    Cardinality::ManyToOne => "many-to-one",
                    Cardinality::OneToMany => "one-to-many",
                    Cardinality::ManyToMany => "many-to-many",
                },
                "labels": m.labels,
                "on": m.on,
                "include": m.include,
            })),
            "bool": b.return_bool,
        }),
        ExprKind::Aggregate(a) => json!({
            "type": "aggregation",
            "op": a.op.name(),
            "expr": tree(&a.expr),
            "param": a.param.as_ref().map(tree),
            "grouping": a.grouping,
            "without": a.without,
        }),
        ExprKind::Call(c) => json!({
            "type": "call",
            "func": {
                "name": c.func.name,
                "argTypes": c.func.args.iter().map(|t| type_name(*t)).collect::<Vec<_>>(),
                "variadic": c.func.variadic,
                "returnType": type_name(c.func.returns),
            },
            "args": c.args.iter().map(tree).collect::<Vec<_>>(),
        }),
    }
}

fn selector(v: &VectorSelector) -> Value {
    json!({
        "name": v.name.clone().unwrap_or_default(),
        "matchers": v.matchers.iter().map(matcher).collect::<Vec<_>>(),
        "offset": v.offset.as_ref().map_or(0, ms),
        "timestamp": timestamp(v.at),
        "startOrEnd": start_or_end(v.at),
    })
}

fn matcher(m: &Matcher) -> Value {
    json!({"type": m.op.as_str(), "name": m.name, "value": m.value})
}

/// A duration in milliseconds; a duration expression (experimental) counts `step()` and
/// `range()` as 0, as nothing is evaluated here.
fn ms(d: &Duration) -> i64 {
    d.ms(0, 0)
}

fn timestamp(at: Option<At>) -> Value {
    match at {
        Some(At::Ms(ms)) => json!(ms),
        _ => Value::Null,
    }
}

fn start_or_end(at: Option<At>) -> Value {
    match at {
        Some(At::Start) => json!("start"),
        Some(At::End) => json!("end"),
        _ => Value::Null,
    }
}

/// Go's names of value types (`parser.ValueType`).
fn type_name(t: ValueType) -> &'static str {
    match t {
        ValueType::Scalar => "scalar",
        ValueType::Vector => "vector",
        ValueType::Matrix => "matrix",
        ValueType::String => "string",
    }
}

/// A float as Go's `strconv.FormatFloat(v, 'f', -1, 64)` writes it.
fn go_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(q: &str) -> Value {
        tree(&strata_promql::parser::parse(q).unwrap())
    }

    #[test]
    fn a_query_becomes_prometheus_nodes() {
        let t = parsed(r#"sum by (job) (rate(http_requests_total{code=~"5.."}[5m] offset 1m))"#);
        assert_eq!(t["type"], "aggregation");
        assert_eq!(t["op"], "sum");
        assert_eq!(t["grouping"], json!(["job"]));
        assert_eq!(t["without"], false);
        let call = &t["expr"];
        assert_eq!(call["type"], "call");
        assert_eq!(call["func"]["name"], "rate");
        assert_eq!(call["func"]["argTypes"], json!(["matrix"]));
        assert_eq!(call["func"]["returnType"], "vector");
        let m = &call["args"][0];
        assert_eq!(m["type"], "matrixSelector");
        assert_eq!(m["name"], "http_requests_total");
        assert_eq!(m["range"], 300_000);
        assert_eq!(m["offset"], 60_000);
        let matchers = m["matchers"].as_array().unwrap();
        assert!(matchers.contains(&json!({"type": "=~", "name": "code", "value": "5.."})), "{matchers:?}");
        assert!(matchers.contains(&json!({"type": "=", "name": "__name__", "value": "http_requests_total"})));
    }

    #[test]
    fn binary_matching_subqueries_and_literals() {
        let t = parsed("a / on (x) group_left (y) b > bool 2");
        assert_eq!(t["type"], "binaryExpr");
        assert_eq!(t["op"], ">");
        assert_eq!(t["bool"], true);
        assert_eq!(t["rhs"], json!({"type": "numberLiteral", "val": "2"}));
        let div = &t["lhs"];
        assert_eq!(div["matching"], json!({"card": "many-to-one", "labels": ["x"], "on": true, "include": ["y"]}));
        let s = parsed("-(max_over_time(up[1h:30s] @ end()))");
        assert_eq!(s["type"], "unaryExpr");
        let sub = &s["expr"]["expr"]["args"][0];
        assert_eq!(sub["type"], "subquery");
        assert_eq!((sub["range"].clone(), sub["step"].clone()), (json!(3_600_000), json!(30_000)));
        assert_eq!(sub["startOrEnd"], "end");
        assert_eq!(
            parsed(r#"label_replace(up, "a", "b", "c", "d")"#)["args"][1],
            json!({"type": "stringLiteral", "val": "a"})
        );
    }
}
