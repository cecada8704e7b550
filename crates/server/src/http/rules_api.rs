//! `/api/v1/rules`, `/api/v1/alerts` and `/api/v1/alertmanagers`, in Prometheus' JSON shapes
//! (Grafana's alert list and the Prometheus UI read them), and the rule engine's `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::{RawQuery, State};
use serde_json::{json, Value};

use super::scrape_api::rfc3339;
use super::{success, ApiError, ApiResult, AppState, Params};
use crate::rules::alerting::{Alert, AlertState};
use crate::rules::{GroupState, RuleKind};

fn time(ms: i64) -> String {
    if ms <= 0 {
        return rfc3339(None);
    }
    rfc3339(Some(UNIX_EPOCH + Duration::from_millis(ms as u64)))
}

/// A value as Prometheus writes an alert's (`strconv.FormatFloat(v, 'e', -1, 64)`).
fn value_e(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let s = format!("{v:e}");
    let (m, e) = s.split_once('e').expect("{:e} has an exponent");
    let e: i32 = e.parse().expect("exponent");
    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
}

fn alert_json(a: &Alert) -> Value {
    let mut o = json!({
        "labels": a.labels,
        "annotations": a.annotations,
        "state": a.state.name(),
        "activeAt": time(a.active_at),
        "value": value_e(a.value),
    });
    if a.keep_firing_since > 0 {
        o["keepFiringSince"] = time(a.keep_firing_since).into();
    }
    o
}

/// Alerts that are pending or firing, in a stable order.
fn active_alerts(g: &GroupState, rule: usize) -> Vec<&Alert> {
    let mut v: Vec<&Alert> = g.rules[rule].alerts.alerts.values().filter(|a| a.state != AlertState::Inactive).collect();
    v.sort_by(|a, b| a.labels.cmp(&b.labels));
    v
}

pub(super) async fn rules(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let kind = match p.get("type").unwrap_or("") {
        "" => None,
        "alert" => Some(true),
        "record" => Some(false),
        other => {
            return Err(ApiError::bad_data(format!("invalid parameter \"type\": {other:?} (expected alert or record)")))
        }
    };
    let exclude_alerts = match p.get("exclude_alerts").unwrap_or("") {
        "" | "false" => false,
        "true" => true,
        other => return Err(ApiError::bad_data(format!("invalid parameter \"exclude_alerts\": {other:?}"))),
    };
    let names = p.all("rule_name[]");
    let groups_wanted = p.all("rule_group[]");
    let files = p.all("file[]");
    let mut out = Vec::new();
    for g in st.rules.get().map(|r| r.groups()).unwrap_or_default() {
        let g = g.lock();
        let file = g.def.file.display().to_string();
        if (!groups_wanted.is_empty() && !groups_wanted.contains(&g.def.name.as_str()))
            || (!files.is_empty() && !files.contains(&file.as_str()))
        {
            continue;
        }
        let mut rules = Vec::new();
        for (i, (def, state)) in g.def.rules.iter().zip(&g.rules).enumerate() {
            let is_alert = matches!(def.kind, RuleKind::Alerting { .. });
            if kind.is_some_and(|k| k != is_alert) || (!names.is_empty() && !names.contains(&def.name())) {
                continue;
            }
            let mut r = json!({
                "name": def.name(),
                "query": def.expr.to_string(),
                "labels": def.labels,
                "health": state.health.name(),
                "lastError": state.last_error,
                "evaluationTime": state.eval_seconds,
                "lastEvaluation": time(state.last_eval_ms),
            });
            if let RuleKind::Alerting { for_ms, keep_firing_for_ms, annotations, .. } = &def.kind {
                r["type"] = "alerting".into();
                r["state"] = state.alerts.state().name().into();
                r["duration"] = (*for_ms as f64 / 1000.0).into();
                r["keepFiringFor"] = (*keep_firing_for_ms as f64 / 1000.0).into();
                r["annotations"] = json!(annotations);
                if !exclude_alerts {
                    r["alerts"] = Value::Array(active_alerts(&g, i).into_iter().map(alert_json).collect());
                }
            } else {
                r["type"] = "recording".into();
            }
            rules.push(r);
        }
        if rules.is_empty() && (kind.is_some() || !names.is_empty()) {
            continue;
        }
        out.push(json!({
            "name": g.def.name,
            "file": file,
            "rules": rules,
            "interval": g.def.interval_ms as f64 / 1000.0,
            "limit": g.def.limit,
            "evaluationTime": g.eval_seconds,
            "lastEvaluation": time(g.last_eval_ms),
        }));
    }
    Ok(success(json!({"groups": out})))
}

pub(super) async fn alerts(State(st): State<Arc<AppState>>) -> ApiResult {
    let mut out = Vec::new();
    for g in st.rules.get().map(|r| r.groups()).unwrap_or_default() {
        let g = g.lock();
        for i in 0..g.rules.len() {
            out.extend(active_alerts(&g, i).into_iter().map(alert_json));
        }
    }
    Ok(success(json!({"alerts": out})))
}

pub(super) async fn alertmanagers(State(st): State<Arc<AppState>>) -> ApiResult {
    let (active, dropped) = st.rules.get().map(|r| r.notifier().alertmanagers()).unwrap_or_default();
    Ok(success(json!({
        "activeAlertmanagers": active.iter().map(|u| json!({"url": u})).collect::<Vec<_>>(),
        "droppedAlertmanagers": dropped.iter().map(|u| json!({"url": u})).collect::<Vec<_>>(),
    })))
}

/// A label value in the exposition format: quoted, with `\\`, `"` and newlines escaped.
fn quote(v: &str) -> String {
    format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
}

/// The rule engine's families for `/metrics` (Prometheus' `prometheus_rule_*` and
/// `prometheus_notifications_*`, under Strata's prefix).
pub fn render_metrics(o: &mut String, st: &AppState) {
    let Some(rules) = st.rules.get() else { return };
    let mut rows: BTreeMap<String, [f64; 6]> = BTreeMap::new();
    for g in rules.groups() {
        let g = g.lock();
        let key = format!("{};{}", g.def.file.display(), g.def.name);
        rows.insert(
            key,
            [
                g.evaluations as f64,
                g.failures as f64,
                g.iterations_missed as f64,
                g.eval_seconds,
                g.last_eval_ms as f64 / 1000.0,
                g.def.interval_ms as f64 / 1000.0,
            ],
        );
    }
    let families: [(&str, &str, &str); 6] = [
        ("strata_rule_group_iterations_total", "Evaluations of the rule group.", "counter"),
        (
            "strata_rule_group_evaluation_failures_total",
            "Evaluations of the rule group in which a rule failed.",
            "counter",
        ),
        (
            "strata_rule_group_iterations_missed_total",
            "Evaluations of the rule group skipped because the previous one overran the interval.",
            "counter",
        ),
        ("strata_rule_group_last_duration_seconds", "How long the rule group's last evaluation took.", "gauge"),
        ("strata_rule_group_last_evaluation_timestamp_seconds", "When the rule group was last evaluated.", "gauge"),
        ("strata_rule_group_interval_seconds", "The rule group's evaluation interval.", "gauge"),
    ];
    for (i, (name, help, kind)) in families.iter().enumerate() {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (key, v) in &rows {
            let _ = writeln!(o, "{name}{{rule_group={}}} {}", quote(key), v[i]);
        }
    }
    let n = rules.notifier();
    let m = &n.metrics;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed) as f64;
    for (name, help, kind, v) in [
        (
            "strata_notifications_sent_total",
            "Alerts sent to Alertmanagers (counted per Alertmanager).",
            "counter",
            load(&m.sent),
        ),
        (
            "strata_notifications_errors_total",
            "Alerts an Alertmanager did not take (counted per Alertmanager).",
            "counter",
            load(&m.errors),
        ),
        (
            "strata_notifications_dropped_total",
            "Alerts lost: the queue was full, or no Alertmanager took them.",
            "counter",
            load(&m.dropped),
        ),
        ("strata_notifications_queue_length", "Alerts waiting to be sent.", "gauge", n.queue_length() as f64),
        ("strata_notifications_queue_capacity", "Alerts the queue holds at most.", "gauge", n.capacity() as f64),
        (
            "strata_notifications_alertmanagers_discovered",
            "Alertmanagers alerts are sent to.",
            "gauge",
            n.alertmanagers().0.len() as f64,
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_prometheus_writes_them() {
        assert_eq!(value_e(1.0), "1e+00");
        assert_eq!(value_e(0.25), "2.5e-01");
        assert_eq!(value_e(1234.5), "1.2345e+03");
        assert_eq!(value_e(f64::NAN), "NaN");
        assert_eq!(time(0), "0001-01-01T00:00:00Z");
    }
}
