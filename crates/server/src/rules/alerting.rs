//! An alerting rule's alerts and their states, as Prometheus keeps them: each series of the
//! rule's result is an alert, pending until it has been active for `for`, then firing; an alert
//! whose series is gone is resolved (still sent, as resolved, for `RESOLVED_RETENTION_MS`), or
//! keeps firing for `keep_firing_for`. The state machine is separate from evaluation and I/O, so
//! its tests drive it with plain vectors and clocks.

use std::collections::{BTreeMap, HashMap};

use super::template::{alert_data, Context, Template};

/// How long a resolved alert is kept and re-sent as resolved (Prometheus' 15 minutes), so an
/// Alertmanager that missed the first resolution still learns of it.
pub const RESOLVED_RETENTION_MS: i64 = 15 * 60_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AlertState {
    Inactive,
    Pending,
    Firing,
}

impl AlertState {
    pub fn name(self) -> &'static str {
        match self {
            AlertState::Inactive => "inactive",
            AlertState::Pending => "pending",
            AlertState::Firing => "firing",
        }
    }
}

/// One alert. Times are Unix milliseconds; 0 is "never".
#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    /// The series' labels without `__name__`, the rule's labels expanded, and `alertname`.
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub state: AlertState,
    pub value: f64,
    pub active_at: i64,
    pub fired_at: i64,
    pub resolved_at: i64,
    pub last_sent_at: i64,
    pub valid_until: i64,
    pub keep_firing_since: i64,
}

impl Alert {
    /// Whether this evaluation sends it: never while pending; at once when resolved since the
    /// last send; otherwise once per `resend_delay`.
    fn needs_sending(&self, ts: i64, resend_delay_ms: i64) -> bool {
        if self.state == AlertState::Pending {
            return false;
        }
        if self.last_sent_at == 0 || self.resolved_at > self.last_sent_at {
            return true;
        }
        self.last_sent_at + resend_delay_ms < ts
    }
}

/// What one alerting rule needs to expand and judge its result.
#[derive(Debug)]
pub struct RuleSpec<'a> {
    pub name: &'a str,
    pub for_ms: i64,
    pub keep_firing_for_ms: i64,
    pub labels: &'a BTreeMap<String, Template>,
    pub annotations: &'a BTreeMap<String, Template>,
    pub external_labels: &'a BTreeMap<String, String>,
    pub external_url: &'a str,
    /// Alerts the rule may have active at once; 0: no limit.
    pub limit: usize,
}

/// The alerts of one rule, keyed by their label set.
#[derive(Clone, Debug, Default)]
pub struct AlertSet {
    pub alerts: HashMap<BTreeMap<String, String>, Alert>,
    /// Whether `ALERTS` and `ALERTS_FOR_STATE` are written: not until the `for` state has been
    /// restored after a start (the first evaluation's pending alerts would otherwise be written
    /// with the wrong active time).
    pub restored: bool,
}

/// A sample for `ALERTS` or `ALERTS_FOR_STATE`.
pub type OutputSample = (BTreeMap<String, String>, f64);

impl AlertSet {
    /// Takes the rule's result at `ts` (each series' labels and value) and moves every alert on;
    /// returns the `ALERTS` and `ALERTS_FOR_STATE` samples to write. An error (two series with
    /// the same labels once the rule's labels are applied; over the limit) leaves no alert
    /// active, as Prometheus does.
    pub fn eval(
        &mut self,
        spec: &RuleSpec<'_>,
        result: &[(BTreeMap<String, String>, f64)],
        ts: i64,
        ctx: &Context<'_>,
    ) -> Result<Vec<OutputSample>, String> {
        let mut current: HashMap<BTreeMap<String, String>, Alert> = HashMap::with_capacity(result.len());
        for (series, value) in result {
            let (data, vars) = alert_data(series, spec.external_labels, spec.external_url, *value);
            let expand = |t: &Template| -> String {
                t.execute(data.clone(), &vars, ctx).unwrap_or_else(|e| format!("<error expanding template: {e}>"))
            };
            let mut labels = series.clone();
            labels.remove("__name__");
            for (k, t) in spec.labels {
                let v = expand(t);
                if v.is_empty() {
                    labels.remove(k);
                } else {
                    labels.insert(k.clone(), v);
                }
            }
            labels.insert("alertname".to_owned(), spec.name.to_owned());
            let annotations: BTreeMap<String, String> =
                spec.annotations.iter().map(|(k, t)| (k.clone(), expand(t))).collect();
            if current.contains_key(&labels) {
                return Err("vector contains metrics with the same labelset after applying alert labels".into());
            }
            let alert = Alert {
                labels: labels.clone(),
                annotations,
                state: AlertState::Pending,
                value: *value,
                active_at: ts,
                fired_at: 0,
                resolved_at: 0,
                last_sent_at: 0,
                valid_until: 0,
                keep_firing_since: 0,
            };
            current.insert(labels, alert);
        }
        for (labels, a) in &current {
            if let Some(old) = self.alerts.get_mut(labels) {
                if old.state != AlertState::Inactive {
                    old.value = a.value;
                    old.annotations = a.annotations.clone();
                    continue;
                }
            }
            self.alerts.insert(labels.clone(), a.clone());
        }
        let mut out = Vec::new();
        let mut active = 0;
        let mut gone = Vec::new();
        for (labels, a) in self.alerts.iter_mut() {
            if !current.contains_key(labels) {
                let mut keep_firing = false;
                if a.state == AlertState::Firing && spec.keep_firing_for_ms > 0 {
                    if a.keep_firing_since == 0 {
                        a.keep_firing_since = ts;
                    }
                    keep_firing = ts - a.keep_firing_since < spec.keep_firing_for_ms;
                }
                if a.state == AlertState::Pending || (a.resolved_at != 0 && ts - a.resolved_at > RESOLVED_RETENTION_MS)
                {
                    gone.push(labels.clone());
                }
                if a.state != AlertState::Inactive && !keep_firing {
                    a.state = AlertState::Inactive;
                    a.resolved_at = ts;
                }
                if !keep_firing {
                    continue;
                }
            } else {
                a.keep_firing_since = 0;
            }
            active += 1;
            if a.state == AlertState::Pending && ts - a.active_at >= spec.for_ms {
                a.state = AlertState::Firing;
                a.fired_at = ts;
            }
            if self.restored {
                let mut l = a.labels.clone();
                l.insert("__name__".into(), "ALERTS_FOR_STATE".into());
                out.push((l.clone(), (a.active_at.div_euclid(1000)) as f64));
                l.insert("__name__".into(), "ALERTS".into());
                l.insert("alertstate".into(), a.state.name().into());
                out.push((l, 1.0));
            }
        }
        for g in gone {
            self.alerts.remove(&g);
        }
        if spec.limit > 0 && active > spec.limit {
            self.alerts.clear();
            return Err(format!("exceeded limit of {} with {active} alerts", spec.limit));
        }
        Ok(out)
    }

    /// The alerts this evaluation sends, marked as sent: firing ones valid for four times the
    /// larger of the resend delay and the interval (two missed evaluations or sends do not
    /// resolve them in Alertmanager), resolved ones ending at their resolution.
    pub fn to_send(&mut self, ts: i64, resend_delay_ms: i64, interval_ms: i64) -> Vec<Alert> {
        let mut out = Vec::new();
        for a in self.alerts.values_mut() {
            if a.needs_sending(ts, resend_delay_ms) {
                a.last_sent_at = ts;
                a.valid_until = ts + 4 * resend_delay_ms.max(interval_ms);
                out.push(a.clone());
            }
        }
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        out
    }

    /// Prometheus' `RestoreForState` for one rule: `last` finds, for an alert's labels, the
    /// last `ALERTS_FOR_STATE` sample before the restart (`(t, active since in seconds)`). An
    /// alert that had been pending for part of its `for` continues from there, shifted by the
    /// downtime, but fires no sooner than `grace_ms` after the restart.
    pub fn restore(
        &mut self,
        ts: i64,
        for_ms: i64,
        grace_ms: i64,
        mut last: impl FnMut(&BTreeMap<String, String>) -> Option<(i64, f64)>,
    ) {
        if for_ms < grace_ms {
            // Waiting out the grace period would hold it longer than its own `for`.
            self.restored = true;
            return;
        }
        for a in self.alerts.values_mut() {
            let Some((down_at, v)) = last(&a.labels) else { continue };
            if strata_model::is_stale_nan(v) || !v.is_finite() {
                continue;
            }
            let down_at = down_at.div_euclid(1000) * 1000;
            let mut active_at = (v as i64) * 1000;
            let spent = down_at - active_at;
            let remaining = for_ms - spent;
            if remaining <= 0 {
                // It was firing: the next evaluation fires it again if it still holds.
            } else if remaining < grace_ms {
                active_at = ts + grace_ms - for_ms;
            } else {
                active_at += ts - down_at;
            }
            a.active_at = active_at;
        }
        self.restored = true;
    }

    /// The rule's state for `/api/v1/rules`: the highest of its alerts'.
    pub fn state(&self) -> AlertState {
        self.alerts.values().map(|a| a.state).max().unwrap_or(AlertState::Inactive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(
        for_ms: i64,
        keep_ms: i64,
        labels: &'a BTreeMap<String, Template>,
        ann: &'a BTreeMap<String, Template>,
        ext: &'a BTreeMap<String, String>,
    ) -> RuleSpec<'a> {
        RuleSpec {
            name: "HighLoad",
            for_ms,
            keep_firing_for_ms: keep_ms,
            labels,
            annotations: ann,
            external_labels: ext,
            external_url: "http://strata:9090",
            limit: 0,
        }
    }

    fn series(instance: &str, v: f64) -> (BTreeMap<String, String>, f64) {
        (BTreeMap::from([("__name__".to_owned(), "load".to_owned()), ("instance".to_owned(), instance.to_owned())]), v)
    }

    const CTX: Context<'static> = Context { query: None, external_url: "http://strata:9090" };

    fn states(s: &AlertSet) -> Vec<(String, AlertState)> {
        let mut v: Vec<_> = s.alerts.values().map(|a| (a.labels["instance"].clone(), a.state)).collect();
        v.sort();
        v
    }

    #[test]
    fn pending_then_firing_then_resolved_then_forgotten() {
        let labels = BTreeMap::from([("severity".to_owned(), Template::parse("page").unwrap())]);
        let ann = BTreeMap::from([(
            "summary".to_owned(),
            Template::parse("{{ $labels.instance }} at {{ $value | humanize }}").unwrap(),
        )]);
        let ext = BTreeMap::new();
        let sp = spec(60_000, 0, &labels, &ann, &ext);
        let mut set = AlertSet { restored: true, ..Default::default() };
        let out = set.eval(&sp, &[series("a", 1500.0)], 0, &CTX).unwrap();
        assert_eq!(states(&set), vec![("a".into(), AlertState::Pending)]);
        let alerts: Vec<_> = out.iter().filter(|(l, _)| l["__name__"] == "ALERTS").collect();
        assert_eq!(alerts.len(), 1);
        assert_eq!(alerts[0].0["alertstate"], "pending");
        assert_eq!(alerts[0].0["severity"], "page");
        assert_eq!(alerts[0].0["alertname"], "HighLoad");
        assert_eq!(set.to_send(0, 60_000, 15_000), vec![], "pending alerts are not sent");
        set.eval(&sp, &[series("a", 2000.0)], 30_000, &CTX).unwrap();
        assert_eq!(states(&set), vec![("a".into(), AlertState::Pending)]);
        let out = set.eval(&sp, &[series("a", 2500.0)], 60_000, &CTX).unwrap();
        assert_eq!(states(&set), vec![("a".into(), AlertState::Firing)]);
        let for_state = out.iter().find(|(l, _)| l["__name__"] == "ALERTS_FOR_STATE").unwrap();
        assert_eq!(for_state.1, 0.0, "active since t=0");
        let sent = set.to_send(60_000, 60_000, 15_000);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].annotations["summary"], "a at 2.5k");
        assert_eq!(sent[0].valid_until, 60_000 + 240_000);
        assert_eq!(set.to_send(90_000, 60_000, 15_000), vec![], "not again before the resend delay");
        assert_eq!(set.to_send(120_001, 60_000, 15_000).len(), 1);
        // Gone: resolved, sent at once as resolved, kept 15 minutes.
        let out = set.eval(&sp, &[], 150_000, &CTX).unwrap();
        assert!(out.is_empty());
        assert_eq!(states(&set), vec![("a".into(), AlertState::Inactive)]);
        let sent = set.to_send(150_000, 60_000, 15_000);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].resolved_at, 150_000);
        set.eval(&sp, &[], 150_000 + RESOLVED_RETENTION_MS, &CTX).unwrap();
        assert_eq!(set.alerts.len(), 1);
        set.eval(&sp, &[], 150_001 + RESOLVED_RETENTION_MS, &CTX).unwrap();
        assert!(set.alerts.is_empty());
    }

    #[test]
    fn a_pending_alert_that_goes_away_is_dropped_and_a_new_one_starts_over() {
        let (l, a, e) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let sp = spec(60_000, 0, &l, &a, &e);
        let mut set = AlertSet { restored: true, ..Default::default() };
        set.eval(&sp, &[series("a", 1.0)], 0, &CTX).unwrap();
        set.eval(&sp, &[], 30_000, &CTX).unwrap();
        assert!(set.alerts.is_empty());
        set.eval(&sp, &[series("a", 1.0)], 45_000, &CTX).unwrap();
        set.eval(&sp, &[series("a", 1.0)], 90_000, &CTX).unwrap();
        assert_eq!(states(&set), vec![("a".into(), AlertState::Pending)], "45 s since it came back");
    }

    #[test]
    fn keep_firing_for_holds_a_firing_alert() {
        let (l, a, e) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let sp = spec(0, 60_000, &l, &a, &e);
        let mut set = AlertSet { restored: true, ..Default::default() };
        set.eval(&sp, &[series("a", 1.0)], 0, &CTX).unwrap();
        assert_eq!(states(&set), vec![("a".into(), AlertState::Firing)], "for 0 fires at once");
        let out = set.eval(&sp, &[], 30_000, &CTX).unwrap();
        assert_eq!(states(&set), vec![("a".into(), AlertState::Firing)]);
        assert_eq!(out.len(), 2, "still written as firing");
        set.eval(&sp, &[], 60_000, &CTX).unwrap();
        assert_eq!(states(&set), vec![("a".into(), AlertState::Firing)], "59.99 s of the minute");
        set.eval(&sp, &[], 90_000, &CTX).unwrap();
        assert_eq!(states(&set), vec![("a".into(), AlertState::Inactive)]);
    }

    #[test]
    fn duplicates_and_limits_are_errors_that_clear_the_alerts() {
        let l = BTreeMap::new();
        let (a, e) = (BTreeMap::new(), BTreeMap::new());
        let sp = spec(0, 0, &l, &a, &e);
        let mut set = AlertSet { restored: true, ..Default::default() };
        let mut other_name = series("a", 1.0);
        other_name.0.insert("__name__".into(), "other".into());
        let err = set.eval(&sp, &[series("a", 1.0), other_name], 0, &CTX).unwrap_err();
        assert!(err.contains("same labelset"), "{err}");
        let limited = RuleSpec { limit: 1, ..spec(0, 0, &l, &a, &e) };
        let err = set.eval(&limited, &[series("a", 1.0), series("b", 1.0)], 0, &CTX).unwrap_err();
        assert_eq!(err, "exceeded limit of 1 with 2 alerts");
        assert!(set.alerts.is_empty());
    }

    #[test]
    fn nothing_is_written_until_restored_and_restore_follows_prometheus() {
        let (l, a, e) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let hour = 3_600_000;
        let sp = spec(hour, 0, &l, &a, &e);
        let grace = 10 * 60_000;
        let restart = 100 * hour;
        let mut set = AlertSet::default();
        let out = set.eval(&sp, &[series("a", 1.0), series("b", 1.0), series("c", 1.0)], restart, &CTX).unwrap();
        assert!(out.is_empty(), "not written before the restore");
        // a: pending 20 min before going down 5 min ago → 40 min left, shifted by the 5 min.
        // b: pending 55 min → 5 min left, less than the grace: fires 10 min after the restart.
        // c: was firing → active time kept.
        set.restore(restart, hour, grace, |labels| match labels["instance"].as_str() {
            "a" => Some((restart - 5 * 60_000, ((restart - 25 * 60_000) / 1000) as f64)),
            "b" => Some((restart - 5 * 60_000, ((restart - 60 * 60_000) / 1000) as f64)),
            "c" => Some((restart - 5 * 60_000, ((restart - 3 * hour) / 1000) as f64)),
            _ => None,
        });
        assert!(set.restored);
        let active = |i: &str| set.alerts.values().find(|a| a.labels["instance"] == i).unwrap().active_at;
        assert_eq!(active("a"), restart - 20 * 60_000);
        assert_eq!(active("b"), restart + grace - hour);
        assert_eq!(active("c"), restart - 3 * hour);
        let out =
            set.eval(&sp, &[series("a", 1.0), series("b", 1.0), series("c", 1.0)], restart + 60_000, &CTX).unwrap();
        assert_eq!(out.len(), 6);
        assert_eq!(
            states(&set),
            vec![
                ("a".into(), AlertState::Pending),
                ("b".into(), AlertState::Pending),
                ("c".into(), AlertState::Firing)
            ]
        );
    }

    #[test]
    fn label_templates_see_the_series_and_value() {
        let labels = BTreeMap::from([
            ("where".to_owned(), Template::parse("{{ $labels.instance }}-{{ $externalLabels.dc }}").unwrap()),
            ("empty".to_owned(), Template::parse("{{ $labels.missing }}").unwrap()),
        ]);
        let ann = BTreeMap::from([("v".to_owned(), Template::parse("{{ .Value }} {{ $labels.__name__ }}").unwrap())]);
        let ext = BTreeMap::from([("dc".to_owned(), "eu".to_owned())]);
        let sp = spec(0, 0, &labels, &ann, &ext);
        let mut set = AlertSet { restored: true, ..Default::default() };
        set.eval(&sp, &[series("a", 0.25)], 0, &CTX).unwrap();
        let a = set.alerts.values().next().unwrap();
        assert_eq!(a.labels["where"], "a-eu");
        assert!(!a.labels.contains_key("empty"), "an empty label is no label");
        assert_eq!(a.annotations["v"], "0.25 load");
    }
}
