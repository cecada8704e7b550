//! Label-set operations of evaluation: keeping and dropping labels, match signatures, and
//! printing label sets the way Prometheus' error messages do.

use std::fmt::Write;

use strata_model::{Label, Labels, METRIC_NAME};

/// `labels` without the named labels.
pub fn without(labels: &Labels, names: &[&str]) -> Labels {
    Labels::from_sorted_unchecked(labels.iter().filter(|l| !names.contains(&&*l.name)).cloned().collect())
}

/// Only the named labels of `labels`.
pub fn keep(labels: &Labels, names: &[&str]) -> Labels {
    Labels::from_sorted_unchecked(labels.iter().filter(|l| names.contains(&&*l.name)).cloned().collect())
}

/// The labels that decide matching: `on(names)` keeps only those; `ignoring(names)` (and no
/// modifier) drops those and the metric name.
pub fn signature(labels: &Labels, on: bool, names: &[String]) -> Vec<Label> {
    labels
        .iter()
        .filter(|l| {
            let listed = names.iter().any(|n| **n == *l.name);
            if on {
                listed
            } else {
                !listed && &*l.name != METRIC_NAME
            }
        })
        .cloned()
        .collect()
}

/// `{__name__="x", a="b"}`: Go's `labels.String()`, used in Prometheus' error messages.
pub fn prom_labels_string(labels: &Labels) -> String {
    let mut s = String::from("{");
    for (i, l) in labels.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&l.name);
        s.push('=');
        s.push_str(&go_quote(&l.value));
    }
    s.push('}');
    s
}

/// Go's `strconv.Quote` for valid UTF-8 strings.
pub fn go_quote(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            '\u{7}' => s.push_str("\\a"),
            '\u{8}' => s.push_str("\\b"),
            '\u{c}' => s.push_str("\\f"),
            '\u{b}' => s.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(s, "\\x{:02x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Go's `%q` of bytes that may not be UTF-8 (invalid bytes as `\xNN`).
pub fn go_quote_bytes(b: &[u8]) -> String {
    let mut s = String::from("\"");
    for chunk in b.utf8_chunks() {
        let q = go_quote(chunk.valid());
        s.push_str(&q[1..q.len() - 1]);
        for x in chunk.invalid() {
            let _ = write!(s, "\\x{x:02x}");
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_like_go() {
        let l = Labels::from_pairs([("__name__", "m"), ("a", "x\"y")]);
        assert_eq!(prom_labels_string(&l), r#"{__name__="m", a="x\"y"}"#);
        assert_eq!(go_quote_bytes(&[b'a', 0xc5, b'z']), r#""a\xc5z""#);
    }

    #[test]
    fn signatures() {
        let l = Labels::from_pairs([("__name__", "m"), ("a", "1"), ("b", "2")]);
        let names = |v: Vec<Label>| v.iter().map(|l| l.name.to_string()).collect::<Vec<_>>();
        assert_eq!(names(signature(&l, true, &["a".into()])), ["a"]);
        assert_eq!(names(signature(&l, false, &["a".into()])), ["b"]);
        assert_eq!(names(signature(&l, false, &[])), ["a", "b"]);
    }
}
