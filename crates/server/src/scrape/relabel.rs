//! Relabeling, as Prometheus' `relabel_configs` and `metric_relabel_configs` do it: an ordered
//! list of rules, each rewriting a label set or dropping it.
//!
//! Semantics follow Prometheus 3 (`model/relabel`): regexes are fully anchored and `.` matches
//! newlines (`^(?s:…)$`); the source value is the source labels' values joined by `separator`
//! (a missing label is the empty string); `replace` writes `replacement` with `$1`/`${name}`
//! expanded and deletes the target when the result is empty; `hashmod` takes the last 8 bytes of
//! the MD5 of the source value as a big-endian integer.

use std::collections::BTreeMap;

use md5::{Digest, Md5};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// A label set under relabeling: ordered by name, no empty values.
pub type LabelMap = BTreeMap<String, String>;

/// The relabel actions Prometheus knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Replace,
    Keep,
    Drop,
    KeepEqual,
    DropEqual,
    HashMod,
    LabelMap,
    LabelDrop,
    LabelKeep,
    Lowercase,
    Uppercase,
}

/// A regex compiled the way Prometheus anchors it; keeps its source text for display.
#[derive(Clone, Debug)]
pub struct AnchoredRegex {
    source: String,
    regex: regex::Regex,
}

impl AnchoredRegex {
    pub fn new(source: &str) -> Result<Self, String> {
        let regex =
            regex::Regex::new(&format!("^(?s:{source})$")).map_err(|e| format!("invalid regex {source:?}: {e}"))?;
        Ok(AnchoredRegex { source: source.to_owned(), regex })
    }

    pub fn is_match(&self, s: &str) -> bool {
        self.regex.is_match(s)
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl Default for AnchoredRegex {
    fn default() -> Self {
        AnchoredRegex::new("(.*)").expect("the default regex compiles")
    }
}

impl PartialEq for AnchoredRegex {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl<'de> Deserialize<'de> for AnchoredRegex {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        AnchoredRegex::new(&s).map_err(D::Error::custom)
    }
}

/// One rule, in the shape of Prometheus' YAML.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelabelConfig {
    #[serde(default)]
    pub source_labels: Vec<String>,
    #[serde(default = "default_separator")]
    pub separator: String,
    #[serde(default)]
    pub target_label: String,
    #[serde(default)]
    pub regex: AnchoredRegex,
    #[serde(default)]
    pub modulus: u64,
    #[serde(default = "default_replacement")]
    pub replacement: String,
    #[serde(default = "default_action")]
    pub action: Action,
}

fn default_separator() -> String {
    ";".into()
}
fn default_replacement() -> String {
    "$1".into()
}
fn default_action() -> Action {
    Action::Replace
}

impl Default for RelabelConfig {
    fn default() -> Self {
        RelabelConfig {
            source_labels: Vec::new(),
            separator: default_separator(),
            target_label: String::new(),
            regex: AnchoredRegex::default(),
            modulus: 0,
            replacement: default_replacement(),
            action: default_action(),
        }
    }
}

impl Action {
    /// The action's name as Prometheus writes it.
    pub fn name(self) -> &'static str {
        match self {
            Action::Replace => "replace",
            Action::Keep => "keep",
            Action::Drop => "drop",
            Action::KeepEqual => "keepequal",
            Action::DropEqual => "dropequal",
            Action::HashMod => "hashmod",
            Action::LabelMap => "labelmap",
            Action::LabelDrop => "labeldrop",
            Action::LabelKeep => "labelkeep",
            Action::Lowercase => "lowercase",
            Action::Uppercase => "uppercase",
        }
    }
}

impl RelabelConfig {
    /// The rule as Prometheus' API writes one (`/api/v1/targets/relabel_steps`).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "source_labels": self.source_labels,
            "separator": self.separator,
            "regex": self.regex.as_str(),
            "modulus": self.modulus,
            "target_label": self.target_label,
            "replacement": self.replacement,
            "action": self.action.name(),
        })
    }
}

/// Each rule's effect in turn, as Prometheus' relabel_steps shows it: the labels after the
/// rule and whether the set is still kept (once dropped, later steps show no labels).
pub fn steps(rules: &[RelabelConfig], mut ls: LabelMap) -> Vec<(LabelMap, bool)> {
    let mut keep = true;
    rules
        .iter()
        .map(|r| {
            if keep {
                keep = r.apply(&mut ls);
            }
            (if keep { ls.clone() } else { LabelMap::new() }, keep)
        })
        .collect()
}

/// Prometheus 3 validates label names as UTF-8 (as Strata stores them): any non-empty string
/// without NUL is a name relabeling may create.
fn is_valid_label_name(s: &str) -> bool {
    !s.is_empty() && !s.contains('\u{0}')
}

impl RelabelConfig {
    /// Checks the combinations Prometheus refuses; the message names the action and field.
    pub fn validate(&self) -> Result<(), String> {
        let a = self.action;
        let name = format!("{a:?}").to_lowercase();
        if self.modulus == 0 && a == Action::HashMod {
            return Err("relabel configuration for hashmod requires non-zero modulus".into());
        }
        let needs_target = matches!(
            a,
            Action::Replace
                | Action::HashMod
                | Action::Lowercase
                | Action::Uppercase
                | Action::KeepEqual
                | Action::DropEqual
        );
        if needs_target && self.target_label.is_empty() {
            return Err(format!("relabel configuration for {name} action requires 'target_label' value"));
        }
        // A template (`$1`) may expand into a valid name; a literal must be one.
        if needs_target && !self.target_label.contains('$') && !is_valid_label_name(&self.target_label) {
            return Err(format!("{:?} is invalid 'target_label' for {name} action", self.target_label));
        }
        if matches!(a, Action::KeepEqual | Action::DropEqual) {
            let d = RelabelConfig::default();
            if self.regex != d.regex
                || self.modulus != d.modulus
                || self.separator != d.separator
                || self.replacement != d.replacement
            {
                return Err(format!(
                    "{name} action requires only 'source_labels' and `target_label`, and no other fields"
                ));
            }
        }
        if matches!(a, Action::LabelDrop | Action::LabelKeep)
            && (!self.source_labels.is_empty()
                || !self.target_label.is_empty()
                || self.modulus != 0
                || self.separator != default_separator()
                || self.replacement != default_replacement())
        {
            return Err(format!("{name} action requires only 'regex', and no other fields"));
        }
        if a == Action::LabelMap && !self.replacement.contains('$') && !is_valid_label_name(&self.replacement) {
            return Err(format!("{:?} is invalid 'replacement' for labelmap action", self.replacement));
        }
        for s in &self.source_labels {
            if s.is_empty() {
                return Err("empty source label name in 'source_labels'".into());
            }
        }
        Ok(())
    }

    fn source_value(&self, ls: &LabelMap) -> String {
        let mut out = String::new();
        for (i, name) in self.source_labels.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.separator);
            }
            if let Some(v) = ls.get(name) {
                out.push_str(v);
            }
        }
        out
    }

    /// Applies this rule; `false` when the label set is dropped.
    pub fn apply(&self, ls: &mut LabelMap) -> bool {
        let val = || self.source_value(ls);
        match self.action {
            Action::Keep => self.regex.is_match(&val()),
            Action::Drop => !self.regex.is_match(&val()),
            Action::KeepEqual => ls.get(&self.target_label).map_or("", String::as_str) == val(),
            Action::DropEqual => ls.get(&self.target_label).map_or("", String::as_str) != val(),
            Action::Replace => {
                let v = val();
                let Some(caps) = self.regex.regex.captures(&v) else { return true };
                let mut target = String::new();
                caps.expand(&self.target_label, &mut target);
                if !is_valid_label_name(&target) {
                    return true;
                }
                let mut res = String::new();
                caps.expand(&self.replacement, &mut res);
                set(ls, target, res);
                true
            }
            Action::Lowercase => {
                set(ls, self.target_label.clone(), val().to_lowercase());
                true
            }
            Action::Uppercase => {
                set(ls, self.target_label.clone(), val().to_uppercase());
                true
            }
            Action::HashMod => {
                let digest = Md5::digest(val().as_bytes());
                let last8: [u8; 8] = digest[8..16].try_into().expect("an MD5 digest is 16 bytes");
                let m = u64::from_be_bytes(last8) % self.modulus;
                set(ls, self.target_label.clone(), m.to_string());
                true
            }
            Action::LabelMap => {
                let mut add = Vec::new();
                for (name, value) in ls.iter() {
                    if let Some(caps) = self.regex.regex.captures(name) {
                        let mut n = String::new();
                        caps.expand(&self.replacement, &mut n);
                        add.push((n, value.clone()));
                    }
                }
                for (n, v) in add {
                    set(ls, n, v);
                }
                true
            }
            Action::LabelDrop => {
                ls.retain(|name, _| !self.regex.is_match(name));
                true
            }
            Action::LabelKeep => {
                ls.retain(|name, _| self.regex.is_match(name));
                true
            }
        }
    }
}

fn set(ls: &mut LabelMap, name: String, value: String) {
    if value.is_empty() {
        ls.remove(&name);
    } else {
        ls.insert(name, value);
    }
}

/// Applies `rules` in order; `false` when one of them drops the label set (which is then left
/// as it was at that point).
pub fn process(rules: &[RelabelConfig], ls: &mut LabelMap) -> bool {
    rules.iter().all(|r| r.apply(ls))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(yaml: &str) -> Vec<RelabelConfig> {
        let r: Vec<RelabelConfig> = yaml_serde::from_str(yaml).unwrap();
        for x in &r {
            x.validate().unwrap();
        }
        r
    }

    fn map(pairs: &[(&str, &str)]) -> LabelMap {
        pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    fn run(yaml: &str, input: &[(&str, &str)]) -> Option<LabelMap> {
        let mut ls = map(input);
        process(&rules(yaml), &mut ls).then_some(ls)
    }

    // Cases from Prometheus' relabel_test.go, expected results as documented there.
    #[test]
    fn replace_with_captures_and_templates() {
        let out = run(
            "- source_labels: [a]\n  regex: f(.*)\n  target_label: d\n  replacement: ch${1}-ch${1}\n",
            &[("a", "foo"), ("b", "bar"), ("c", "baz")],
        );
        assert_eq!(out, Some(map(&[("a", "foo"), ("b", "bar"), ("c", "baz"), ("d", "choo-choo")])));

        // Source labels joined with the separator; no match leaves the set alone.
        let out = run(
            "- source_labels: [a, b]\n  regex: f(.*);(.*)r\n  target_label: a\n  replacement: b${1}${2}m\n- source_labels: [c, a]\n  regex: (b).*b(.*)ba(.*)\n  target_label: d\n  replacement: $1$2$2$3\n",
            &[("a", "foo"), ("b", "bar"), ("c", "baz")],
        );
        assert_eq!(out, Some(map(&[("a", "boobam"), ("b", "bar"), ("c", "baz"), ("d", "boooom")])));

        // An empty result deletes the target; a missing source label is "".
        let out = run("- source_labels: [a]\n  regex: (.*)\n  target_label: b\n", &[("b", "x")]);
        assert_eq!(out, Some(map(&[])));

        // The target may be a template; an invalid expanded name is skipped.
        let out =
            run("- source_labels: [a]\n  regex: (.*)\n  target_label: ${1}\n  replacement: x\n", &[("a", "some-name")]);
        assert_eq!(out, Some(map(&[("a", "some-name"), ("some-name", "x")])));
        let out = run("- source_labels: [a]\n  regex: (.*)\n  target_label: ${1}\n  replacement: x\n", &[("b", "y")]);
        assert_eq!(out, Some(map(&[("b", "y")])));

        // Anchored: a partial match is no match; `.` matches a newline.
        let out = run("- source_labels: [a]\n  regex: o\n  target_label: b\n  replacement: hit\n", &[("a", "foo")]);
        assert_eq!(out, Some(map(&[("a", "foo")])));
        let out = run("- source_labels: [a]\n  regex: a.b\n  target_label: c\n  replacement: hit\n", &[("a", "a\nb")]);
        assert_eq!(out.unwrap().get("c").map(String::as_str), Some("hit"));
    }

    #[test]
    fn keep_drop_and_equality() {
        let input = [("a", "foo"), ("b", "bar")];
        assert!(run("- source_labels: [a]\n  regex: f.*\n  action: drop\n", &input).is_none());
        assert!(run("- source_labels: [a]\n  regex: f.*\n  action: keep\n", &input).is_some());
        assert!(run("- source_labels: [a]\n  regex: b.*\n  action: keep\n", &input).is_none());
        // A missing label is the empty string, which `.*` matches.
        assert!(run("- source_labels: [z]\n  regex: .*\n  action: keep\n", &input).is_some());

        let same = [("a", "x"), ("b", "x")];
        assert!(run("- source_labels: [a]\n  target_label: b\n  action: keepequal\n", &same).is_some());
        assert!(run("- source_labels: [a]\n  target_label: b\n  action: keepequal\n", &input).is_none());
        assert!(run("- source_labels: [a]\n  target_label: b\n  action: dropequal\n", &same).is_none());
        assert!(run("- source_labels: [a]\n  target_label: b\n  action: dropequal\n", &input).is_some());
    }

    #[test]
    fn hashmod_matches_prometheus() {
        // relabel_test.go: "c"="baz" hashed modulo 1000 into "d" gives "976".
        let out = run(
            "- source_labels: [c]\n  target_label: d\n  action: hashmod\n  modulus: 1000\n",
            &[("a", "foo"), ("b", "bar"), ("c", "baz")],
        );
        assert_eq!(out.unwrap().get("d").map(String::as_str), Some("976"));
        // Checked with Python: int.from_bytes(md5(b"foo").digest()[8:], "big") % 1000 == 696.
        let out = run("- source_labels: [a]\n  target_label: h\n  action: hashmod\n  modulus: 1000\n", &[("a", "foo")]);
        assert_eq!(out.unwrap().get("h").map(String::as_str), Some("696"));
    }

    #[test]
    fn label_map_drop_keep_and_case() {
        let out = run(
            "- regex: __meta_(my.*)\n  action: labelmap\n",
            &[("__meta_my_bar", "aaa"), ("__meta_my_baz", "bbb"), ("__meta_other", "ccc")],
        );
        assert_eq!(
            out,
            Some(map(&[
                ("__meta_my_bar", "aaa"),
                ("__meta_my_baz", "bbb"),
                ("__meta_other", "ccc"),
                ("my_bar", "aaa"),
                ("my_baz", "bbb"),
            ]))
        );
        let out = run("- regex: (b.*)\n  action: labeldrop\n", &[("a", "1"), ("b1", "2"), ("b2", "3")]);
        assert_eq!(out, Some(map(&[("a", "1")])));
        let out = run("- regex: (b.*)\n  action: labelkeep\n", &[("a", "1"), ("b1", "2"), ("b2", "3")]);
        assert_eq!(out, Some(map(&[("b1", "2"), ("b2", "3")])));
        let out = run(
            "- source_labels: [a]\n  target_label: lo\n  action: lowercase\n- source_labels: [a]\n  target_label: up\n  action: uppercase\n",
            &[("a", "FoO")],
        );
        assert_eq!(out, Some(map(&[("a", "FoO"), ("lo", "foo"), ("up", "FOO")])));
    }

    #[test]
    fn invalid_rules_are_refused_with_a_reason() {
        let cases = [
            ("- source_labels: [a]\n  action: replace\n", "requires 'target_label'"),
            ("- source_labels: [a]\n  target_label: x\n  action: hashmod\n", "non-zero modulus"),
            ("- source_labels: [a]\n  target_label: \"a\\0b\"\n", "invalid 'target_label'"),
            ("- source_labels: [a]\n  target_label: b\n  regex: x\n  action: keepequal\n", "only 'source_labels'"),
            ("- source_labels: [a]\n  regex: x\n  action: labeldrop\n", "only 'regex'"),
        ];
        for (yaml, want) in cases {
            let r: Vec<RelabelConfig> = yaml_serde::from_str(yaml).unwrap();
            let e = r[0].validate().unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
        let e = yaml_serde::from_str::<Vec<RelabelConfig>>("- regex: '(unclosed'\n").unwrap_err().to_string();
        assert!(e.contains("invalid regex") && e.contains("line 1"), "{e}");
        let e = yaml_serde::from_str::<Vec<RelabelConfig>>("- action: explode\n").unwrap_err().to_string();
        assert!(e.contains("explode"), "{e}");
    }

    #[test]
    fn steps_show_each_rule_and_stop_at_a_drop() {
        let rules: Vec<RelabelConfig> = yaml_serde::from_str(
            "- source_labels: [a]\n  target_label: b\n- source_labels: [b]\n  regex: x\n  action: drop\n- target_label: c\n  replacement: never\n",
        )
        .unwrap();
        let steps = steps(&rules, LabelMap::from([("a".to_owned(), "x".to_owned())]));
        assert_eq!(steps[0], (LabelMap::from([("a".into(), "x".into()), ("b".into(), "x".into())]), true));
        assert_eq!(steps[1], (LabelMap::new(), false));
        assert_eq!(steps[2], (LabelMap::new(), false), "nothing after the drop");
        assert_eq!(rules[1].to_json()["action"], "drop");
        assert_eq!(rules[1].to_json()["regex"], "x");
    }
}
