//! One evaluation of a rule group: each rule in order (a later rule sees what an earlier one
//! wrote at the same timestamp, as in Prometheus), its result written through the head's
//! appender, series that a rule stopped producing marked stale, alerts moved on and sent.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use strata_model::{FloatHistogram, Labels, LabelsBuilder, Matcher, STALE_NAN_BITS};
use strata_promql::Value;
use strata_tsdb::Db;

use super::alerting::{AlertSet, RuleSpec};
use super::file::{GroupDef, RuleDef, RuleKind};
use super::notifier::{Notifier, NotifyAlert};
use super::template::{Context, QuerySample};

/// Runs a PromQL instant query the way the server runs `/api/v1/query`: same engine, limits,
/// deadline and concurrency slots.
pub trait RuleQuerier: Send + Sync {
    fn instant(&self, expr: &strata_promql::ast::Expr, t: i64) -> Result<Value, String>;
}

/// Settings every group shares.
#[derive(Clone, Debug)]
pub struct RuleOptions {
    /// `--rules.alert.resend-delay` (1m).
    pub resend_delay_ms: i64,
    /// `--rules.alert.for-outage-tolerance` (1h): how far back `for` state is restored from.
    pub outage_tolerance_ms: i64,
    /// `--rules.alert.for-grace-period` (10m): the least wait before a restored alert fires.
    pub for_grace_period_ms: i64,
    /// For alerts' generator URLs and templates.
    pub external_url: String,
    pub features: strata_promql::Features,
    pub max_depth: u32,
}

impl Default for RuleOptions {
    fn default() -> Self {
        RuleOptions {
            resend_delay_ms: 60_000,
            outage_tolerance_ms: 3_600_000,
            for_grace_period_ms: 600_000,
            external_url: "http://localhost:9090".into(),
            features: strata_promql::Features::default(),
            max_depth: strata_promql::parser::MAX_DEPTH_DEFAULT,
        }
    }
}

/// What groups evaluate against.
pub struct Env {
    pub db: Arc<Db>,
    pub querier: Arc<dyn RuleQuerier>,
    pub notifier: Arc<Notifier>,
    pub opts: RuleOptions,
    pub external_labels: Mutex<BTreeMap<String, String>>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env").field("opts", &self.opts).finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Health {
    #[default]
    Unknown,
    Ok,
    Err,
}

impl Health {
    pub fn name(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Ok => "ok",
            Health::Err => "err",
        }
    }
}

/// A rule's evaluation state.
#[derive(Debug, Default)]
pub struct RuleState {
    pub health: Health,
    pub last_error: String,
    /// Unix ms of the last evaluation; 0: never.
    pub last_eval_ms: i64,
    pub eval_seconds: f64,
    /// Series the last evaluation wrote, to mark stale those the next one does not.
    pub previous: HashSet<Labels>,
    /// Alerting rules' alerts.
    pub alerts: AlertSet,
}

/// A group and its rules' states.
#[derive(Debug)]
pub struct GroupState {
    /// Shared: each evaluation takes it without copying the parsed rules.
    pub def: Arc<GroupDef>,
    pub rules: Vec<RuleState>,
    pub last_eval_ms: i64,
    pub eval_seconds: f64,
    pub evaluations: u64,
    pub failures: u64,
    pub iterations_missed: u64,
    /// Restore alerts' `for` state after the first evaluation (set for groups loaded at start).
    pub should_restore: bool,
}

impl GroupState {
    pub fn new(def: GroupDef, should_restore: bool) -> GroupState {
        let rules = def
            .rules
            .iter()
            .map(|_| RuleState {
                alerts: AlertSet { restored: !should_restore, ..Default::default() },
                ..Default::default()
            })
            .collect();
        GroupState {
            def: Arc::new(def),
            rules,
            last_eval_ms: 0,
            eval_seconds: 0.0,
            evaluations: 0,
            failures: 0,
            iterations_missed: 0,
            should_restore,
        }
    }

    /// Takes over the state of the same rules (same kind, name and labels) from `old`, the
    /// group this one replaces at a reload; returns the series of old rules that are gone, to
    /// be marked stale.
    pub fn copy_state(&mut self, old: &mut GroupState) -> Vec<Labels> {
        let key = |r: &RuleDef| (matches!(r.kind, RuleKind::Alerting { .. }), r.name().to_owned(), r.labels.clone());
        let mut taken = vec![false; old.rules.len()];
        for (i, r) in self.def.rules.iter().enumerate() {
            let k = key(r);
            if let Some(j) = old.def.rules.iter().enumerate().position(|(j, o)| !taken[j] && key(o) == k) {
                taken[j] = true;
                let o = &mut old.rules[j];
                let n = &mut self.rules[i];
                n.previous = std::mem::take(&mut o.previous);
                n.alerts = std::mem::take(&mut o.alerts);
                n.alerts.restored = true;
                n.health = o.health;
                n.last_error = std::mem::take(&mut o.last_error);
                n.last_eval_ms = o.last_eval_ms;
                n.eval_seconds = o.eval_seconds;
            }
        }
        self.should_restore = false;
        self.evaluations = old.evaluations;
        self.failures = old.failures;
        self.iterations_missed = old.iterations_missed;
        old.rules.iter_mut().zip(taken).filter(|(_, t)| !t).flat_map(|(r, _)| std::mem::take(&mut r.previous)).collect()
    }

    /// Every series the group's rules last wrote (for stale markers when it is removed).
    pub fn all_series(&mut self) -> Vec<Labels> {
        self.rules.iter_mut().flat_map(|r| std::mem::take(&mut r.previous)).collect()
    }
}

/// A value a rule writes.
enum Out {
    Float(f64),
    Histogram(Box<FloatHistogram>),
}

/// Evaluates every rule of the group at `ts` (the aligned evaluation time, Unix ms).
pub fn eval_group(env: &Env, group: &Mutex<GroupState>, ts: i64) {
    let t0 = Instant::now();
    let def = group.lock().def.clone();
    let eval_ts = ts - def.query_offset_ms;
    let mut failed = false;
    for (i, rule) in def.rules.iter().enumerate() {
        let r0 = Instant::now();
        let result = env.querier.instant(&rule.expr, eval_ts);
        let outcome = match result {
            Err(e) => Err(e),
            Ok(value) => match &rule.kind {
                RuleKind::Recording { record } => recording_output(rule, record, value, def.limit),
                RuleKind::Alerting { .. } => {
                    let mut g = group.lock();
                    alerting_output(env, rule, &mut g.rules[i].alerts, value, eval_ts, def.limit)
                }
            },
        };
        let mut g = group.lock();
        let state = &mut g.rules[i];
        state.last_eval_ms = ts;
        match outcome {
            Err(e) => {
                failed = true;
                tracing::warn!(group = %def.name, rule = %rule.name(), error = %e, "rule evaluation failed");
                state.health = Health::Err;
                state.last_error = e;
            }
            Ok(samples) => {
                state.health = Health::Ok;
                state.last_error.clear();
                let current: HashSet<Labels> = samples.iter().map(|(l, _)| l.clone()).collect();
                let stale: Vec<Labels> = state.previous.difference(&current).cloned().collect();
                state.previous = current;
                drop(g);
                if let Err(e) = write(&env.db, &samples, &stale, eval_ts) {
                    let mut g = group.lock();
                    g.rules[i].health = Health::Err;
                    g.rules[i].last_error = e.clone();
                    failed = true;
                    tracing::warn!(group = %def.name, rule = %rule.name(), error = %e, "writing a rule's result failed");
                }
                g = group.lock();
                if let RuleKind::Alerting { .. } = rule.kind {
                    let sent = g.rules[i].alerts.to_send(ts, env.opts.resend_delay_ms, def.interval_ms);
                    if !sent.is_empty() {
                        env.notifier.enqueue(notify_alerts(&env.opts.external_url, &rule.expr, sent));
                    }
                }
            }
        }
        g.rules[i].eval_seconds = r0.elapsed().as_secs_f64();
    }
    let mut g = group.lock();
    if g.should_restore {
        g.should_restore = false;
        restore_for_state(env, &mut g, ts);
    }
    g.last_eval_ms = ts;
    g.eval_seconds = t0.elapsed().as_secs_f64();
    g.evaluations += 1;
    if failed {
        g.failures += 1;
    }
}

/// A recording rule's result as the series it writes: named `record`, with the rule's labels.
fn recording_output(rule: &RuleDef, record: &str, value: Value, limit: usize) -> Result<Vec<(Labels, Out)>, String> {
    let relabel = |l: &Labels| -> Result<Labels, String> {
        let mut b = LabelsBuilder::new(l);
        b.set("__name__", record);
        for (k, v) in &rule.labels {
            b.set(k.as_str(), v.as_str());
        }
        b.build().map_err(|e| e.to_string())
    };
    let mut out = Vec::new();
    match value {
        Value::Scalar { v, .. } => out.push((relabel(&Labels::empty())?, Out::Float(v))),
        Value::Vector(series) => {
            for s in series {
                let labels = relabel(&s.labels)?;
                if let Some(p) = s.points.first() {
                    out.push((labels, Out::Float(p.f)));
                } else if let Some(h) = s.hists.first() {
                    out.push((labels, Out::Histogram(Box::new((*h.h).clone()))));
                }
            }
        }
        other => return Err(format!("rule result is a {}, not an instant vector or scalar", other.type_name())),
    }
    let distinct: HashSet<&Labels> = out.iter().map(|(l, _)| l).collect();
    if distinct.len() != out.len() {
        return Err("vector contains metrics with the same labelset after applying rule labels".into());
    }
    if limit > 0 && out.len() > limit {
        return Err(format!("exceeded limit of {limit} with {} series", out.len()));
    }
    Ok(out)
}

fn alerting_output(
    env: &Env,
    rule: &RuleDef,
    alerts: &mut AlertSet,
    value: Value,
    eval_ts: i64,
    limit: usize,
) -> Result<Vec<(Labels, Out)>, String> {
    let RuleKind::Alerting { alert, for_ms, keep_firing_for_ms, .. } = &rule.kind else {
        unreachable!("called for alerting rules")
    };
    let result: Vec<(BTreeMap<String, String>, f64)> = match value {
        Value::Scalar { v, .. } => vec![(BTreeMap::new(), v)],
        Value::Vector(series) => series
            .into_iter()
            .filter_map(|s| {
                let f = s.points.first()?.f;
                Some((s.labels.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect(), f))
            })
            .collect(),
        other => return Err(format!("rule result is a {}, not an instant vector or scalar", other.type_name())),
    };
    let external_labels = env.external_labels.lock().clone();
    let spec = RuleSpec {
        name: alert,
        for_ms: *for_ms,
        keep_firing_for_ms: *keep_firing_for_ms,
        labels: &rule.label_templates,
        annotations: &rule.annotation_templates,
        external_labels: &external_labels,
        external_url: &env.opts.external_url,
        limit,
    };
    let query = |q: &str| -> Result<Vec<QuerySample>, String> {
        let expr = strata_promql::parser::parse_with_depth(q, env.opts.features, env.opts.max_depth)
            .map_err(|e| e.render(q))?;
        Ok(match env.querier.instant(&expr, eval_ts)? {
            Value::Scalar { v, .. } => vec![QuerySample { labels: BTreeMap::new(), value: v }],
            Value::Vector(series) => series
                .into_iter()
                .filter_map(|s| {
                    let value = s.points.first()?.f;
                    let labels = s.labels.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect();
                    Some(QuerySample { labels, value })
                })
                .collect(),
            other => return Err(format!("query result is a {}, not an instant vector or scalar", other.type_name())),
        })
    };
    let ctx = Context { query: Some(&query), external_url: &env.opts.external_url };
    let samples = alerts.eval(&spec, &result, eval_ts, &ctx)?;
    samples
        .into_iter()
        .map(|(l, v)| Ok((Labels::try_from_pairs(l).map_err(|e| e.to_string())?, Out::Float(v))))
        .collect()
}

/// Appends a rule's samples and stale markers in one commit. Samples the head refuses (out of
/// order, duplicates) are counted in the head's own metrics and logged, as Prometheus logs
/// them; they do not fail the rule.
fn write(db: &Db, samples: &[(Labels, Out)], stale: &[Labels], t: i64) -> Result<(), String> {
    if samples.is_empty() && stale.is_empty() {
        return Ok(());
    }
    let mut app = db.appender();
    let mut refused = 0usize;
    let mut first_refusal = None;
    for (l, v) in samples {
        let res = match v {
            Out::Float(f) => app.append(l, t, *f).map(|_| ()),
            Out::Histogram(h) => app.append_histogram(l, t, (**h).clone()).map(|_| ()),
        };
        if let Err(e) = res {
            refused += 1;
            first_refusal.get_or_insert_with(|| format!("{l}: {e}"));
        }
    }
    for l in stale {
        let _ = app.append(l, t, f64::from_bits(STALE_NAN_BITS));
    }
    app.commit().map_err(|e| format!("commit: {e}"))?;
    if let Some(first) = first_refusal {
        tracing::warn!(refused, first = %first, "rule evaluation results discarded by the head");
    }
    Ok(())
}

/// Writes stale markers for series of rules or groups that are gone.
pub fn mark_stale(db: &Db, series: &[Labels], t: i64) {
    if let Err(e) = write(db, &[], series, t) {
        tracing::warn!(error = %e, series = series.len(), "cannot write stale markers for removed rules");
    }
}

fn notify_alerts(
    external_url: &str,
    expr: &strata_promql::ast::Expr,
    sent: Vec<super::alerting::Alert>,
) -> Vec<NotifyAlert> {
    let q: String = form_urlencoded::byte_serialize(expr.to_string().as_bytes()).collect();
    let generator_url = format!("{}/graph?g0.expr={q}&g0.tab=1", external_url.trim_end_matches('/'));
    sent.into_iter()
        .map(|a| NotifyAlert {
            labels: a.labels,
            annotations: a.annotations,
            starts_at: a.fired_at,
            ends_at: if a.resolved_at != 0 { a.resolved_at } else { a.valid_until },
            generator_url: generator_url.clone(),
        })
        .collect()
}

/// Prometheus' `RestoreForState`: each alerting rule's pending alerts take their active time
/// from the `ALERTS_FOR_STATE` series written before the restart.
fn restore_for_state(env: &Env, g: &mut GroupState, ts: i64) {
    let mint = ts - env.opts.outage_tolerance_ms;
    for (rule, state) in g.def.rules.iter().zip(g.rules.iter_mut()) {
        let RuleKind::Alerting { for_ms, .. } = rule.kind else { continue };
        let q = env.db.querier(mint, ts);
        state.alerts.restore(ts, for_ms, env.opts.for_grace_period_ms, |labels| {
            let mut matchers = vec![Matcher::equal("__name__", "ALERTS_FOR_STATE")];
            matchers.extend(labels.iter().map(|(k, v)| Matcher::equal(k.as_str(), v.as_str())));
            let series = q.select(&matchers).ok()?;
            // The series with exactly the alert's labels (more labels are another alert's).
            let s = series.iter().find(|s| s.labels.len() == labels.len() + 1)?;
            s.samples().last().map(|x| (x.t, x.v))
        });
    }
}

/// The evaluation time at or before `now` for a group: multiples of the interval shifted by a
/// per-group offset, so groups spread over the interval instead of all running at once, and a
/// group keeps its phase across restarts (Prometheus' `EvalTimestamp`).
pub fn eval_timestamp(now: i64, interval_ms: i64, offset_ms: i64) -> i64 {
    let adj = now - offset_ms;
    adj - adj.rem_euclid(interval_ms) + offset_ms
}

/// The group's offset: a hash of its file and name, modulo the interval.
pub fn group_offset(def: &GroupDef) -> i64 {
    let key = format!("{};{}", def.file.display(), def.name);
    (xxhash_rust::xxh3::xxh3_64(key.as_bytes()) % def.interval_ms.max(1) as u64) as i64
}
