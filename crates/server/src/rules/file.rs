//! Prometheus' rule file format: groups of recording and alerting rules, read and checked as
//! Prometheus (and `promtool check rules`) check them, so a file Prometheus loads loads here and
//! a file it refuses is refused with the same kind of message, naming the file, the group and
//! the rule.
//!
//! ```yaml
//! groups:
//!   - name: example
//!     interval: 30s          # default: global.evaluation_interval
//!     limit: 0               # series a rule may produce (0: no limit)
//!     query_offset: 0s       # evaluate this far in the past (late data)
//!     labels: {team: sre}    # added to every rule's output
//!     rules:
//!       - record: job:http_requests:rate5m
//!         expr: sum by (job) (rate(http_requests_total[5m]))
//!       - alert: HighErrorRate
//!         expr: job:http_errors:ratio > 0.05
//!         for: 10m
//!         keep_firing_for: 5m
//!         labels: {severity: page}
//!         annotations:
//!           summary: "{{ $labels.job }} errors at {{ $value | humanizePercentage }}"
//! ```

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};
use strata_promql::ast::Expr;

use super::template::Template;
use crate::scrape::config::PromDuration;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    groups: Vec<RawGroup>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    #[serde(default)]
    name: String,
    interval: Option<PromDuration>,
    query_offset: Option<PromDuration>,
    #[serde(default)]
    limit: i64,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    rules: Vec<RawRule>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct RawRule {
    record: Option<String>,
    alert: Option<String>,
    #[serde(default, deserialize_with = "scalar_text")]
    expr: String,
    #[serde(rename = "for")]
    for_: Option<PromDuration>,
    keep_firing_for: Option<PromDuration>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// `expr: 1` is a YAML number, and Prometheus takes it as the query `1`.
fn scalar_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        S(String),
        I(i64),
        F(f64),
        B(bool),
    }
    Ok(match Scalar::deserialize(d)? {
        Scalar::S(s) => s,
        Scalar::I(i) => i.to_string(),
        Scalar::F(f) => f.to_string(),
        Scalar::B(b) => b.to_string(),
    })
}

/// What a rule computes.
#[derive(Debug, Clone, PartialEq)]
pub enum RuleKind {
    /// Writes the result as series named `record`.
    Recording { record: String },
    /// Raises alerts named `alert` for each series of the result.
    Alerting {
        alert: String,
        /// How long an alert stays pending before it fires.
        for_ms: i64,
        /// How long a firing alert keeps firing after its condition cleared.
        keep_firing_for_ms: i64,
        annotations: BTreeMap<String, String>,
    },
}

/// A checked rule.
#[derive(Debug, Clone)]
pub struct RuleDef {
    pub kind: RuleKind,
    /// The expression as written.
    pub expr_text: String,
    pub expr: Expr,
    /// The rule's labels, with the group's labels under them.
    pub labels: BTreeMap<String, String>,
    /// Parsed templates of the labels and annotations (alerting rules), by name.
    pub label_templates: BTreeMap<String, Template>,
    pub annotation_templates: BTreeMap<String, Template>,
}

impl PartialEq for RuleDef {
    /// Two rules are the same rule when they are written the same (the parsed forms follow).
    fn eq(&self, other: &RuleDef) -> bool {
        self.kind == other.kind && self.expr_text == other.expr_text && self.labels == other.labels
    }
}

impl RuleDef {
    pub fn name(&self) -> &str {
        match &self.kind {
            RuleKind::Recording { record } => record,
            RuleKind::Alerting { alert, .. } => alert,
        }
    }
}

/// A checked group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupDef {
    pub name: String,
    /// The file it came from, as Prometheus names it in `/api/v1/rules`.
    pub file: PathBuf,
    pub interval_ms: i64,
    pub query_offset_ms: i64,
    /// Series (recording) or alerts (alerting) a rule may produce; 0: no limit.
    pub limit: usize,
    pub rules: Vec<RuleDef>,
}

/// Options the checks depend on.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub default_interval_ms: i64,
    pub features: strata_promql::Features,
    pub max_depth: u32,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            default_interval_ms: 60_000,
            features: strata_promql::Features::default(),
            max_depth: strata_promql::parser::MAX_DEPTH_DEFAULT,
        }
    }
}

/// Reads and checks one rule file; every error found is returned (as promtool lists them), each
/// naming the file.
pub fn load_file(path: &Path, opts: &LoadOptions) -> Result<Vec<GroupDef>, Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{}: {e}", path.display())])?;
    parse_file(path, &text, opts)
}

/// Checks the text of a rule file read from `path`.
pub fn parse_file(path: &Path, text: &str, opts: &LoadOptions) -> Result<Vec<GroupDef>, Vec<String>> {
    let shown = path.display();
    let raw: RawFile = if text.trim().is_empty() {
        RawFile::default()
    } else {
        yaml_serde::from_str(text).map_err(|e| vec![format!("{shown}: {e}")])?
    };
    let mut errors = Vec::new();
    let mut groups = Vec::new();
    let mut names = HashSet::new();
    for g in raw.groups {
        if g.name.is_empty() {
            errors.push(format!("{shown}: group name should not be empty"));
            continue;
        }
        if !names.insert(g.name.clone()) {
            errors.push(format!("{shown}: {}: repeated in the same file", g.name));
            continue;
        }
        let gerr = |msg: String| format!("{shown}: group {:?}: {msg}", g.name);
        let interval_ms = match g.interval {
            None => opts.default_interval_ms,
            Some(d) if d.0 > 0 => d.0,
            Some(_) => {
                errors.push(gerr("interval must be above zero".into()));
                continue;
            }
        };
        if g.limit < 0 {
            errors.push(gerr(format!("limit {} is negative", g.limit)));
        }
        for name in g.labels.keys() {
            if let Err(e) = check_label_name(name) {
                errors.push(gerr(e));
            }
        }
        let mut rules = Vec::new();
        for (i, r) in g.rules.into_iter().enumerate() {
            let index = i + 1;
            match check_rule(r, &g.labels, opts) {
                Ok(rule) => rules.push(rule),
                Err(es) => {
                    for (name, e) in es {
                        errors.push(format!("{shown}: group {:?}, rule {index}, {name:?}: {e}", g.name));
                    }
                }
            }
        }
        groups.push(GroupDef {
            name: g.name,
            file: path.to_path_buf(),
            interval_ms,
            query_offset_ms: g.query_offset.map(|d| d.0).unwrap_or(0),
            limit: g.limit.max(0) as usize,
            rules,
        });
    }
    if errors.is_empty() {
        Ok(groups)
    } else {
        Err(errors)
    }
}

fn check_label_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        || name.as_bytes()[0].is_ascii_digit()
    {
        return Err(format!("invalid label name: {name}"));
    }
    Ok(())
}

fn is_metric_name(name: &str) -> bool {
    !name.is_empty()
        && !name.as_bytes()[0].is_ascii_digit()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Prometheus' `RuleNode.Validate` and template checks; errors are (rule name, message).
fn check_rule(
    r: RawRule,
    group_labels: &BTreeMap<String, String>,
    opts: &LoadOptions,
) -> Result<RuleDef, Vec<(String, String)>> {
    let name = r.record.clone().or_else(|| r.alert.clone()).unwrap_or_default();
    let mut errs: Vec<String> = Vec::new();
    match (&r.record, &r.alert) {
        (Some(_), Some(_)) => errs.push("only one of 'record' and 'alert' must be set".into()),
        (None, None) => errs.push("one of 'record' or 'alert' must be set".into()),
        _ => {}
    }
    if r.record.as_deref() == Some("") {
        errs.push("field 'record' must be set".into());
    }
    if r.alert.as_deref() == Some("") {
        errs.push("field 'alert' must be set".into());
    }
    let expr = if r.expr.trim().is_empty() {
        errs.push("field 'expr' must be set in rule".into());
        None
    } else {
        match strata_promql::parser::parse_with_depth(&r.expr, opts.features, opts.max_depth) {
            Ok(e) => Some(e),
            Err(e) => {
                errs.push(format!("could not parse expression: {}", e.render(&r.expr)));
                None
            }
        }
    };
    if let Some(record) = &r.record {
        if !r.annotations.is_empty() {
            errs.push("invalid field 'annotations' in recording rule".into());
        }
        if r.for_.is_some() {
            errs.push("invalid field 'for' in recording rule".into());
        }
        if r.keep_firing_for.is_some() {
            errs.push("invalid field 'keep_firing_for' in recording rule".into());
        }
        if !record.is_empty() && !is_metric_name(record) {
            errs.push(format!("invalid recording rule name: {record}"));
        }
        // An expression of another type (a range vector, a string) loads, as in Prometheus,
        // and fails at each evaluation with the rule marked unhealthy: a file Prometheus runs
        // must not stop Strata from starting.
    }
    for k in r.labels.keys() {
        if let Err(e) = check_label_name(k) {
            errs.push(e);
        }
        if k == "__name__" {
            errs.push("invalid label name: __name__".into());
        }
    }
    for k in r.annotations.keys() {
        if k.is_empty() {
            errs.push("invalid annotation name: empty".into());
        }
    }
    let mut label_templates = BTreeMap::new();
    let mut annotation_templates = BTreeMap::new();
    if r.alert.is_some() {
        for (k, v) in &r.labels {
            match Template::parse(v) {
                Ok(t) => {
                    label_templates.insert(k.clone(), t);
                }
                Err(e) => errs.push(format!("template: label {k:?}: {e}")),
            }
        }
        for (k, v) in &r.annotations {
            match Template::parse(v) {
                Ok(t) => {
                    annotation_templates.insert(k.clone(), t);
                }
                Err(e) => errs.push(format!("template: annotation {k:?}: {e}")),
            }
        }
    }
    if !errs.is_empty() {
        return Err(errs.into_iter().map(|e| (name.clone(), e)).collect());
    }
    let mut labels = group_labels.clone();
    labels.extend(r.labels);
    let kind = match (r.record, r.alert) {
        (Some(record), None) => RuleKind::Recording { record },
        (None, Some(alert)) => RuleKind::Alerting {
            alert,
            for_ms: r.for_.map(|d| d.0).unwrap_or(0),
            keep_firing_for_ms: r.keep_firing_for.map(|d| d.0).unwrap_or(0),
            annotations: r.annotations,
        },
        _ => unreachable!("checked above"),
    };
    Ok(RuleDef {
        kind,
        expr_text: r.expr,
        expr: expr.expect("checked above"),
        labels,
        label_templates,
        annotation_templates,
    })
}

/// Expands `rule_files` globs, relative to `base`, in order and without repeats; a glob that
/// matches nothing is not an error (Prometheus' rule).
pub fn expand_globs(patterns: &[String], base: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in patterns {
        let full = base.join(p);
        let pattern = full.to_string_lossy().into_owned();
        let paths = glob::glob(&pattern).map_err(|e| format!("rule_files: invalid pattern {p:?}: {e}"))?;
        let mut found: Vec<PathBuf> = paths.filter_map(|r| r.ok()).collect();
        found.sort();
        for f in found {
            if !out.contains(&f) {
                out.push(f);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<GroupDef>, Vec<String>> {
        parse_file(Path::new("rules.yml"), text, &LoadOptions::default())
    }

    #[test]
    fn a_prometheus_rule_file_loads() {
        let groups = parse(
            r#"
groups:
  - name: example
    interval: 30s
    labels: {team: sre}
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
      - alert: Down
        expr: up == 0
        for: 5m
        keep_firing_for: 1m
        labels: {severity: page, team: db}
        annotations:
          summary: "{{ $labels.instance }} down"
  - name: other
    rules:
      - record: one
        expr: 1
"#,
        )
        .unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].interval_ms, 30_000);
        assert_eq!(groups[1].interval_ms, 60_000);
        assert_eq!(groups[0].rules[0].name(), "job:up:sum");
        assert_eq!(groups[0].rules[0].labels, BTreeMap::from([("team".to_owned(), "sre".to_owned())]));
        assert_eq!(
            groups[0].rules[1].labels,
            BTreeMap::from([("severity".to_owned(), "page".to_owned()), ("team".to_owned(), "db".to_owned())])
        );
        match &groups[0].rules[1].kind {
            RuleKind::Alerting { for_ms, keep_firing_for_ms, .. } => {
                assert_eq!((*for_ms, *keep_firing_for_ms), (300_000, 60_000))
            }
            k => panic!("{k:?}"),
        }
        assert_eq!(groups[1].rules[0].expr_text, "1");
    }

    #[test]
    fn mistakes_are_named_with_file_group_and_rule() {
        let cases: &[(&str, &str)] = &[
            ("groups:\n  - name: g\n    rules:\n      - record: a\n        alert: b\n        expr: up\n", "only one of 'record' and 'alert'"),
            ("groups:\n  - name: g\n    rules:\n      - expr: up\n", "one of 'record' or 'alert' must be set"),
            ("groups:\n  - name: g\n    rules:\n      - record: a\n        expr: sum(\n", "could not parse expression"),
            ("groups:\n  - name: g\n    rules:\n      - record: a-b\n        expr: up\n", "invalid recording rule name: a-b"),
            ("groups:\n  - name: g\n    rules:\n      - record: a\n        expr: up\n        for: 1m\n", "invalid field 'for' in recording rule"),
            ("groups:\n  - name: g\n    rules:\n      - record: a\n        expr: up\n        annotations: {x: y}\n", "invalid field 'annotations'"),
            ("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        annotations: {x: '{{ $labels.a '}\n", "template: annotation \"x\""),
            ("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        labels: {0bad: x}\n", "invalid label name: 0bad"),
            ("groups:\n  - name: g\n    rules: []\n  - name: g\n    rules: []\n", "g: repeated in the same file"),
            ("groups:\n  - rules: []\n", "group name should not be empty"),
            ("groups:\n  - name: g\n    rules:\n      - record: a\n        expr: up\n        bogus: 1\n", "unknown field `bogus`"),
            ("groups:\n  - name: g\n    interval: 0s\n    rules: []\n", "interval must be above zero"),
        ];
        for (text, want) in cases {
            let errs = parse(text).unwrap_err();
            assert!(errs.iter().any(|e| e.contains(want) && e.starts_with("rules.yml")), "{text}\n{errs:?}");
        }
        let errs = parse("groups:\n  - name: g\n    rules:\n      - record: a\n        expr: up\n      - record: b-c\n        expr: up\n").unwrap_err();
        assert_eq!(errs, vec!["rules.yml: group \"g\", rule 2, \"b-c\": invalid recording rule name: b-c".to_owned()]);
    }

    #[test]
    fn globs_expand_in_order_without_repeats() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["b.yml", "a.yml", "c.rules"] {
            std::fs::write(dir.path().join(f), "").unwrap();
        }
        let got = expand_globs(&["*.yml".into(), "a.yml".into(), "*.none".into()], dir.path()).unwrap();
        assert_eq!(got, vec![dir.path().join("a.yml"), dir.path().join("b.yml")]);
    }
}
