//! Group evaluation over a real database and the real PromQL engine.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use strata_model::{Labels, Matcher};
use strata_promql::{Engine, EngineOptions, Value};
use strata_tsdb::{Db, DbOptions};

use super::alerting::AlertState;
use super::file::{parse_file, LoadOptions};
use super::group::{eval_group, Env, GroupState, Health, RuleOptions, RuleQuerier};
use super::notifier::Notifier;

struct EngineQuerier(Arc<Db>);

impl RuleQuerier for EngineQuerier {
    fn instant(&self, expr: &strata_promql::ast::Expr, t: i64) -> Result<Value, String> {
        Engine::new(EngineOptions::default()).instant(&*self.0, expr, t).map(|o| o.value).map_err(|e| e.to_string())
    }
}

const MIN: i64 = 60_000;

fn env(db: &Arc<Db>) -> Env {
    Env {
        db: db.clone(),
        querier: Arc::new(EngineQuerier(db.clone())),
        notifier: Notifier::new(100),
        opts: RuleOptions::default(),
        external_labels: Mutex::new([("dc".to_owned(), "eu".to_owned())].into()),
    }
}

fn group(text: &str, restore: bool) -> Mutex<GroupState> {
    let mut defs = parse_file(Path::new("rules.yml"), text, &LoadOptions::default()).unwrap();
    Mutex::new(GroupState::new(defs.remove(0), restore))
}

fn open() -> (tempfile::TempDir, Arc<Db>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = DbOptions { compact_interval: None, ..Default::default() };
    let db = Arc::new(Db::open(dir.path(), opts).unwrap());
    (dir, db)
}

fn up(db: &Db, t: i64, values: &[(&str, f64)]) {
    let mut app = db.appender();
    for (instance, v) in values {
        app.append(&Labels::from_pairs([("__name__", "up"), ("job", "node"), ("instance", instance)]), t, *v).unwrap();
    }
    app.commit().unwrap();
}

/// Raw samples of the series matching `selector`, by their labels' text.
fn samples(db: &Db, matchers: &[Matcher]) -> Vec<(String, Vec<(i64, f64)>)> {
    let mut out: Vec<_> = db
        .querier(i64::MIN / 2, i64::MAX / 2)
        .select(matchers)
        .unwrap()
        .iter()
        .map(|s| (s.labels.to_string(), s.samples().iter().map(|x| (x.t, x.v)).collect()))
        .collect();
    out.sort_by(|a: &(String, Vec<(i64, f64)>), b| a.0.cmp(&b.0));
    out
}

fn name(n: &str) -> Vec<Matcher> {
    vec![Matcher::equal("__name__", n)]
}

#[test]
fn recording_rules_write_in_order_and_mark_gone_series_stale() {
    let (_dir, db) = open();
    let env = env(&db);
    let g = group(
        r#"
groups:
  - name: rec
    labels: {source: rules}
    rules:
      - record: instance:up:doubled
        expr: up * 2
      - record: job:up:sum
        expr: sum by (job) (instance:up:doubled)
      - record: one
        expr: "1"
"#,
        false,
    );
    let t0 = 1_000 * MIN;
    up(&db, t0 - 10_000, &[("a", 1.0), ("b", 1.0)]);
    eval_group(&env, &g, t0);
    assert_eq!(
        samples(&db, &name("instance:up:doubled")),
        vec![
            (r#"instance:up:doubled{instance="a", job="node", source="rules"}"#.into(), vec![(t0, 2.0)]),
            (r#"instance:up:doubled{instance="b", job="node", source="rules"}"#.into(), vec![(t0, 2.0)]),
        ]
    );
    // The second rule saw the first rule's output of the same evaluation.
    assert_eq!(
        samples(&db, &name("job:up:sum")),
        vec![(r#"job:up:sum{job="node", source="rules"}"#.into(), vec![(t0, 4.0)])]
    );
    assert_eq!(samples(&db, &name("one")), vec![(r#"one{source="rules"}"#.into(), vec![(t0, 1.0)])]);
    // b goes away (its sample falls out of the lookback): its recorded series gets a stale marker.
    let t1 = t0 + 10 * MIN;
    up(&db, t1 - 10_000, &[("a", 1.0)]);
    eval_group(&env, &g, t1);
    let doubled = samples(&db, &name("instance:up:doubled"));
    assert_eq!(doubled[0].1, vec![(t0, 2.0), (t1, 2.0)]);
    assert_eq!(doubled[1].1.len(), 2);
    assert!(strata_model::is_stale_nan(doubled[1].1[1].1), "{doubled:?}");
    assert_eq!(doubled[1].1[1].0, t1);
    let s = g.lock();
    assert!(s.rules.iter().all(|r| r.health == Health::Ok));
    assert_eq!((s.evaluations, s.failures, s.last_eval_ms), (2, 0, t1));
}

#[test]
fn a_failing_rule_is_reported_and_the_others_still_run() {
    let (_dir, db) = open();
    let env = env(&db);
    let g = group(
        r#"
groups:
  - name: g
    rules:
      - record: dup
        expr: label_replace(up, "instance", "x", "", "")
      - record: fine
        expr: up
"#,
        false,
    );
    let t0 = 1_000 * MIN;
    up(&db, t0 - 1_000, &[("a", 1.0), ("b", 1.0)]);
    eval_group(&env, &g, t0);
    let s = g.lock();
    assert_eq!(s.rules[0].health, Health::Err);
    assert!(s.rules[0].last_error.contains("same labelset"), "{}", s.rules[0].last_error);
    assert_eq!(s.rules[1].health, Health::Ok);
    assert_eq!(s.failures, 1);
    assert_eq!(samples(&db, &name("fine")).len(), 2);
    assert!(samples(&db, &name("dup")).is_empty());
}

const ALERT_RULES: &str = r#"
groups:
  - name: alerts
    interval: 1m
    rules:
      - alert: InstanceDown
        expr: up == 0
        for: 5m
        labels: {severity: page}
        annotations:
          summary: "{{ $labels.instance }} of {{ $labels.job }} down ({{ $externalLabels.dc }})"
          count: "{{ with query \"count(up == 0)\" }}{{ . | first | value }}{{ end }} down"
"#;

#[test]
fn alerts_go_pending_then_firing_are_written_and_sent() {
    let (_dir, db) = open();
    let env = env(&db);
    let g = group(ALERT_RULES, false);
    let t0 = 1_000 * MIN;
    for k in 0..=6 {
        let t = t0 + k * MIN;
        up(&db, t - 5_000, &[("a", 0.0), ("b", 1.0)]);
        eval_group(&env, &g, t);
        let state = g.lock().rules[0].alerts.state();
        let want = if k < 5 { AlertState::Pending } else { AlertState::Firing };
        assert_eq!(state, want, "after {k} minutes");
        if k == 0 {
            assert_eq!(env.notifier.queue_length(), 0, "pending alerts are not sent");
        }
    }
    let alerts = samples(&db, &name("ALERTS"));
    assert_eq!(alerts.len(), 2, "{alerts:?}");
    assert_eq!(
        alerts[0].0,
        r#"ALERTS{alertname="InstanceDown", alertstate="firing", instance="a", job="node", severity="page"}"#
    );
    assert_eq!(alerts[0].1, vec![(t0 + 5 * MIN, 1.0), (t0 + 6 * MIN, 1.0)]);
    assert_eq!(alerts[1].1.len(), 6, "pending for 5 evaluations, then stale: {alerts:?}");
    assert!(strata_model::is_stale_nan(alerts[1].1[5].1));
    let for_state = samples(&db, &name("ALERTS_FOR_STATE"));
    assert_eq!(for_state.len(), 1);
    assert!(for_state[0].1.iter().all(|&(_, v)| v == (t0 / 1000) as f64));
    // Sent once when it fired (the resend delay is 1 minute: not at +6 min exactly).
    assert_eq!(env.notifier.queue_length(), 1);
    {
        let s = g.lock();
        let a = s.rules[0].alerts.alerts.values().next().unwrap();
        assert_eq!(a.annotations["summary"], "a of node down (eu)");
        assert_eq!(a.annotations["count"], "1 down");
    }
    // Recovery: resolved at once, sent as resolved, ALERTS marked stale.
    let t = t0 + 7 * MIN;
    up(&db, t - 5_000, &[("a", 1.0), ("b", 1.0)]);
    eval_group(&env, &g, t);
    assert_eq!(g.lock().rules[0].alerts.state(), AlertState::Inactive);
    assert_eq!(env.notifier.queue_length(), 2);
    let alerts = samples(&db, &name("ALERTS"));
    let last = alerts[0].1.last().unwrap();
    assert_eq!(last.0, t);
    assert!(strata_model::is_stale_nan(last.1));
}

#[test]
fn a_restart_restores_how_long_alerts_have_been_pending() {
    let (_dir, db) = open();
    let t0 = 1_000 * MIN;
    {
        let env = env(&db);
        let g = group(ALERT_RULES, false);
        for k in 0..3 {
            let t = t0 + k * MIN;
            up(&db, t - 5_000, &[("a", 0.0)]);
            eval_group(&env, &g, t);
        }
    }
    // Down for two minutes; the new process restores: active since t0 shifted by the downtime,
    // so the alert fires 5 minutes of pending time after t0, not 5 minutes after the restart.
    // (The grace period must be below the rule's `for` for a restore to happen at all.)
    let mut env = env(&db);
    env.opts.for_grace_period_ms = MIN;
    let g = group(ALERT_RULES, true);
    let restart = t0 + 4 * MIN;
    up(&db, restart - 5_000, &[("a", 0.0)]);
    eval_group(&env, &g, restart);
    let active_at = g.lock().rules[0].alerts.alerts.values().next().unwrap().active_at;
    assert_eq!(active_at, t0 + 2 * MIN, "t0 plus the two minutes down");
    assert!(g.lock().rules[0].alerts.restored);
    // Without a restore the alert would have become pending again at the restart.
    let fresh = group(ALERT_RULES, false);
    eval_group(&env, &fresh, restart);
    assert_eq!(fresh.lock().rules[0].alerts.alerts.values().next().unwrap().active_at, restart);
}

#[test]
fn a_changed_group_keeps_the_state_of_unchanged_rules() {
    let (_dir, db) = open();
    let env = env(&db);
    let old = group(ALERT_RULES, false);
    let t0 = 1_000 * MIN;
    up(&db, t0 - 5_000, &[("a", 0.0)]);
    eval_group(&env, &old, t0);
    let changed = ALERT_RULES
        .replace("interval: 1m", "interval: 30s")
        .replace("\n      - alert", "\n      - record: kept\n        expr: up\n      - alert");
    let new = group(&changed, false);
    let stale = new.lock().copy_state(&mut old.lock());
    assert!(stale.is_empty());
    let s = new.lock();
    assert_eq!(s.rules[1].alerts.alerts.values().next().unwrap().active_at, t0);
    assert!(s.rules[0].alerts.alerts.is_empty());
}
