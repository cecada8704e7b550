//! Label matchers (`=`, `!=`, `=~`, `!~`) with Prometheus semantics.
//!
//! Regexes are fully anchored and `.` matches newlines, as in Prometheus. A matcher is applied to
//! the empty string for series that lack the label, so `{a=~".*"}` also selects series without
//! `a` and `{a!=""}` requires `a`. Regexes are analysed once at construction so that the common
//! shapes (a literal, an alternation of literals, a literal prefix, `.*`, `.+`) are answered
//! without running the regex engine, and so that an index can look up the listed values directly
//! instead of scanning every value of the label.

use std::fmt;
use std::sync::Arc;

use regex_syntax::hir::{Class, Hir, HirKind};

/// How a matcher compares a label value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchOp {
    Equal,
    NotEqual,
    RegexMatch,
    RegexNoMatch,
}

impl MatchOp {
    pub fn as_str(self) -> &'static str {
        match self {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::RegexMatch => "=~",
            MatchOp::RegexNoMatch => "!~",
        }
    }

    fn inverse(self) -> MatchOp {
        match self {
            MatchOp::Equal => MatchOp::NotEqual,
            MatchOp::NotEqual => MatchOp::Equal,
            MatchOp::RegexMatch => MatchOp::RegexNoMatch,
            MatchOp::RegexNoMatch => MatchOp::RegexMatch,
        }
    }
}

/// A regex that did not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MatcherError {
    #[error("invalid regular expression {pattern:?} for label {name:?}: {reason}")]
    InvalidRegex { name: String, pattern: String, reason: String },
}

/// Classes with at most this many characters are expanded into a literal set, so `a|b|c`
/// (which the regex parser folds into the class `[a-c]`) still takes the set fast path.
const SMALL_CLASS_CHARS_MAX: u32 = 16;
/// Alternations with more literals than this are matched through a sorted set.
const LITERAL_SET_LINEAR_MAX: usize = 8;

/// What a regex reduces to after analysis.
#[derive(Clone, Debug)]
enum RegexShape {
    /// `.*`: everything, including the empty string.
    Any,
    /// `.+`: every non-empty string.
    NonEmpty,
    /// A finite set of literals, sorted and deduplicated (`a|b|c`, `foo`, `` ``).
    Literals(Vec<String>),
    /// `prefix.*`.
    Prefix(String),
    /// Anything else; `prefix` is a literal every match must start with (may be empty).
    General { prefix: String, re: regex::Regex },
}

/// A compiled, anchored regex with fast paths.
#[derive(Clone, Debug)]
pub struct RegexMatcher {
    shape: RegexShape,
}

impl RegexMatcher {
    pub fn new(pattern: &str) -> Result<Self, String> {
        Self::with_size_limit(pattern, None)
    }

    /// `new`, its compiled program limited to `size_limit` bytes if given (else the regex
    /// crate's default limit).
    fn with_size_limit(pattern: &str, size_limit: Option<usize>) -> Result<Self, String> {
        let anchored = format!("^(?s:{pattern})$");
        let mut builder = regex::RegexBuilder::new(&anchored);
        if let Some(limit) = size_limit {
            builder.size_limit(limit);
        }
        let re = builder.build().map_err(|e| e.to_string())?;
        let hir = regex_syntax::ParserBuilder::new()
            .dot_matches_new_line(true)
            .build()
            .parse(pattern)
            .map_err(|e| e.to_string())?;
        let shape = match analyze(&hir) {
            Some(Analysis::Literals(mut v)) => {
                v.sort();
                v.dedup();
                RegexShape::Literals(v)
            }
            Some(Analysis::Any) => RegexShape::Any,
            Some(Analysis::NonEmpty) => RegexShape::NonEmpty,
            Some(Analysis::Prefix(p)) => RegexShape::Prefix(p),
            Some(Analysis::PrefixThenGeneral(prefix)) => RegexShape::General { prefix, re },
            None => RegexShape::General { prefix: String::new(), re },
        };
        Ok(RegexMatcher { shape })
    }

    pub fn is_match(&self, v: &str) -> bool {
        match &self.shape {
            RegexShape::Any => true,
            RegexShape::NonEmpty => !v.is_empty(),
            RegexShape::Literals(set) if set.len() <= LITERAL_SET_LINEAR_MAX => set.iter().any(|s| s == v),
            RegexShape::Literals(set) => set.binary_search_by(|s| s.as_str().cmp(v)).is_ok(),
            RegexShape::Prefix(p) => v.starts_with(p.as_str()),
            RegexShape::General { prefix, re } => v.starts_with(prefix.as_str()) && re.is_match(v),
        }
    }

    /// The exact set of strings this regex matches, when it is a small finite set.
    pub fn set_matches(&self) -> Option<&[String]> {
        match &self.shape {
            RegexShape::Literals(v) => Some(v),
            _ => None,
        }
    }

    /// A literal every match starts with ("" when unknown).
    pub fn literal_prefix(&self) -> &str {
        match &self.shape {
            RegexShape::Prefix(p) | RegexShape::General { prefix: p, .. } => p,
            _ => "",
        }
    }
}

enum Analysis {
    Any,
    NonEmpty,
    Literals(Vec<String>),
    Prefix(String),
    PrefixThenGeneral(String),
}

fn analyze(hir: &Hir) -> Option<Analysis> {
    match hir.kind() {
        HirKind::Empty => Some(Analysis::Literals(vec![String::new()])),
        HirKind::Capture(c) => analyze(&c.sub),
        HirKind::Literal(l) => Some(Analysis::Literals(vec![String::from_utf8(l.0.to_vec()).ok()?])),
        HirKind::Class(c) => class_literals(c).map(Analysis::Literals),
        HirKind::Alternation(subs) => {
            let mut all = Vec::new();
            for s in subs {
                match analyze(s)? {
                    Analysis::Literals(v) => all.extend(v),
                    _ => return None,
                }
            }
            Some(Analysis::Literals(all))
        }
        HirKind::Repetition(r) if r.max.is_none() && is_any_char(&r.sub) => match r.min {
            0 => Some(Analysis::Any),
            1 => Some(Analysis::NonEmpty),
            _ => None,
        },
        HirKind::Concat(parts) => {
            let HirKind::Literal(l) = parts.first()?.kind() else {
                return None;
            };
            let prefix = String::from_utf8(l.0.to_vec()).ok()?;
            match &parts[1..] {
                [rest] if matches!(analyze(rest), Some(Analysis::Any)) => Some(Analysis::Prefix(prefix)),
                _ => Some(Analysis::PrefixThenGeneral(prefix)),
            }
        }
        _ => None,
    }
}

fn class_literals(c: &Class) -> Option<Vec<String>> {
    let Class::Unicode(u) = c else { return None };
    let count: u32 = u.ranges().iter().map(|r| r.end() as u32 - r.start() as u32 + 1).sum();
    if count > SMALL_CLASS_CHARS_MAX {
        return None;
    }
    let mut out = Vec::new();
    for r in u.ranges() {
        for cp in r.start() as u32..=r.end() as u32 {
            out.push(char::from_u32(cp)?.to_string());
        }
    }
    Some(out)
}

/// Whether `hir` is `.` with dot-matches-newline: a class of every Unicode scalar value.
fn is_any_char(hir: &Hir) -> bool {
    match hir.kind() {
        HirKind::Class(Class::Unicode(u)) => {
            // Ranges are over chars, so one range may span the surrogate gap.
            let ranges = u.ranges();
            ranges.first().is_some_and(|r| r.start() == '\0')
                && ranges.last().is_some_and(|r| r.end() == char::MAX)
                && ranges.windows(2).all(|w| {
                    w[0].end() as u32 + 1 >= w[1].start() as u32
                        || (w[0].end() as u32 + 1 == 0xD800 && w[1].start() as u32 == 0xE000)
                })
        }
        _ => false,
    }
}

/// Patterns of at most this many bytes are kept compiled (`compiled`).
const REGEX_CACHE_PATTERN_MAX: usize = 4096;
/// At most this many compiled patterns are kept (a dashboard's worth); the cache is emptied
/// when it would hold more.
const REGEX_CACHE_ENTRIES: usize = 64;
/// Only patterns whose compiled program fits in this many bytes are kept (the regex crate
/// allows 10 MiB to any one): what the cache holds stays within 64 MiB of programs, plus each
/// kept regex's matching caches, which grow only as far as its matches need (a lazy DFA's
/// states). Dashboards' patterns (`eth.*|ifb.*`, a variable's `host-(a|b|c)`) take kilobytes.
const REGEX_CACHE_PROGRAM_MAX: usize = 1 << 20;

/// The `RegexMatcher` of `pattern`, compiled once per process while the cache keeps it: a
/// dashboard asks the same queries at every refresh, and compiling their regexes was 5% of
/// the CPU of a refresh answered from the result cache (a matcher over 1,500 series, one new
/// step to evaluate). Bounded in entries and pattern size; a pattern that fails is not kept.
fn compiled(pattern: &str) -> Result<Arc<RegexMatcher>, String> {
    type Cache = std::sync::Mutex<std::collections::HashMap<String, Arc<RegexMatcher>>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let lock = || cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(re) = lock().get(pattern) {
        return Ok(re.clone());
    }
    let small = (pattern.len() <= REGEX_CACHE_PATTERN_MAX)
        .then(|| RegexMatcher::with_size_limit(pattern, Some(REGEX_CACHE_PROGRAM_MAX)).ok())
        .flatten();
    // A large or invalid one is compiled with the default limit (and its error), and not kept.
    let Some(small) = small else { return RegexMatcher::new(pattern).map(Arc::new) };
    let re = Arc::new(small);
    {
        let mut kept = lock();
        if kept.len() >= REGEX_CACHE_ENTRIES {
            kept.clear();
        }
        kept.insert(pattern.to_owned(), re.clone());
    }
    Ok(re)
}

/// A label matcher: `name op value`.
#[derive(Clone)]
pub struct Matcher {
    pub op: MatchOp,
    pub name: String,
    pub value: String,
    re: Option<Arc<RegexMatcher>>,
}

impl Matcher {
    pub fn new(op: MatchOp, name: impl Into<String>, value: impl Into<String>) -> Result<Self, MatcherError> {
        let (name, value) = (name.into(), value.into());
        let re =
            match op {
                MatchOp::RegexMatch | MatchOp::RegexNoMatch => Some(compiled(&value).map_err(|reason| {
                    MatcherError::InvalidRegex { name: name.clone(), pattern: value.clone(), reason }
                })?),
                _ => None,
            };
        Ok(Matcher { op, name, value, re })
    }

    /// `name="value"`; never fails.
    pub fn equal(name: impl Into<String>, value: impl Into<String>) -> Self {
        Matcher { op: MatchOp::Equal, name: name.into(), value: value.into(), re: None }
    }

    /// Whether a label value (empty for an absent label) satisfies the matcher.
    pub fn matches(&self, v: &str) -> bool {
        match self.op {
            MatchOp::Equal => self.value == v,
            MatchOp::NotEqual => self.value != v,
            MatchOp::RegexMatch => self.regex().is_match(v),
            MatchOp::RegexNoMatch => !self.regex().is_match(v),
        }
    }

    /// Whether series *without* this label match.
    pub fn matches_empty(&self) -> bool {
        self.matches("")
    }

    /// The matcher selecting exactly the values this one rejects.
    pub fn inverse(&self) -> Matcher {
        Matcher { op: self.op.inverse(), name: self.name.clone(), value: self.value.clone(), re: self.re.clone() }
    }

    /// For `=` and positive regexes reducing to a finite set: the exact values matched. An index
    /// uses it to look up postings directly instead of scanning all values of the label.
    pub fn set_matches(&self) -> Option<Vec<&str>> {
        match self.op {
            MatchOp::Equal => Some(vec![self.value.as_str()]),
            MatchOp::RegexMatch => self.regex().set_matches().map(|v| v.iter().map(String::as_str).collect()),
            _ => None,
        }
    }

    /// For positive regexes: a literal prefix every matching value has ("" if none).
    pub fn literal_prefix(&self) -> &str {
        match self.op {
            MatchOp::RegexMatch => self.regex().literal_prefix(),
            _ => "",
        }
    }

    fn regex(&self) -> &RegexMatcher {
        self.re.as_deref().expect("regex matchers always carry a compiled regex")
    }
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        self.op == other.op && self.name == other.name && self.value == other.value
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{:?}", self.name, self.op.as_str(), self.value)
    }
}

impl fmt::Debug for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn m(op: MatchOp, v: &str) -> Matcher {
        Matcher::new(op, "a", v).unwrap()
    }

    #[test]
    fn empty_value_semantics() {
        assert!(m(MatchOp::RegexMatch, ".*").matches_empty());
        assert!(!m(MatchOp::NotEqual, "").matches_empty());
        assert!(m(MatchOp::Equal, "").matches_empty());
        assert!(!m(MatchOp::RegexMatch, ".+").matches_empty());
        assert!(m(MatchOp::NotEqual, "x").matches_empty());
        assert!(m(MatchOp::RegexMatch, "").matches_empty());
        assert!(!m(MatchOp::RegexMatch, "").matches("x"));
    }

    #[test]
    fn regexes_are_fully_anchored() {
        let r = m(MatchOp::RegexMatch, "foo|bar");
        assert!(r.matches("foo") && r.matches("bar"));
        assert!(!r.matches("foobar") && !r.matches("xfoo") && !r.matches("fo"));
        let r = m(MatchOp::RegexMatch, "b.r");
        assert!(r.matches("bar") && r.matches("b\nr") && !r.matches("barx"));
        assert!(!m(MatchOp::RegexNoMatch, "foo.*").matches("foobar"));
        assert!(m(MatchOp::RegexNoMatch, "foo.*").matches("xfoo"));
    }

    #[test]
    fn fast_paths_are_taken() {
        let r = m(MatchOp::RegexMatch, "a|b|c");
        assert_eq!(r.set_matches(), Some(vec!["a", "b", "c"]));
        let r = m(MatchOp::RegexMatch, "api|web(?:)|db");
        assert_eq!(r.set_matches(), Some(vec!["api", "db", "web"]));
        assert_eq!(m(MatchOp::RegexMatch, r"a\.b").set_matches(), Some(vec!["a.b"]));
        assert_eq!(m(MatchOp::RegexMatch, "foo.*").literal_prefix(), "foo");
        assert_eq!(m(MatchOp::RegexMatch, "foo[0-9]+").literal_prefix(), "foo");
        assert!(m(MatchOp::RegexMatch, "foo[0-9]+").matches("foo12"));
        assert!(!m(MatchOp::RegexMatch, "foo[0-9]+").matches("foo"));
        assert!(matches!(RegexMatcher::new(".*").unwrap().shape, RegexShape::Any));
        assert!(matches!(RegexMatcher::new(".+").unwrap().shape, RegexShape::NonEmpty));
        assert!(m(MatchOp::RegexMatch, "(?i)FOO").matches("foo"));
    }

    #[test]
    fn invalid_regex_is_a_typed_error() {
        let e = Matcher::new(MatchOp::RegexMatch, "job", "a(").unwrap_err();
        assert!(e.to_string().contains("job") && e.to_string().contains("a("), "{e}");
    }

    #[test]
    fn matchers_of_one_pattern_share_its_compiled_regex() {
        let (a, b) = (m(MatchOp::RegexMatch, "eth.*|ifb[0-9]+"), m(MatchOp::RegexNoMatch, "eth.*|ifb[0-9]+"));
        assert!(Arc::ptr_eq(a.re.as_ref().unwrap(), b.re.as_ref().unwrap()));
        assert!(a.matches("eth0") && a.matches("ifb12") && !a.matches("lo") && !b.matches("eth0"));
        // A pattern past the kept size is compiled each time, and matches the same.
        let long = format!("{}|x", "a".repeat(REGEX_CACHE_PATTERN_MAX));
        let (c, d) = (m(MatchOp::RegexMatch, &long), m(MatchOp::RegexMatch, &long));
        assert!(!Arc::ptr_eq(c.re.as_ref().unwrap(), d.re.as_ref().unwrap()));
        assert!(c.matches("x") && !c.matches("a"));
        // So is one whose program is past the kept size (Unicode word characters, repeated).
        let big = r"\w{120}";
        assert!(RegexMatcher::with_size_limit(big, Some(REGEX_CACHE_PROGRAM_MAX)).is_err());
        let (e, f) = (m(MatchOp::RegexMatch, big), m(MatchOp::RegexMatch, big));
        assert!(!Arc::ptr_eq(e.re.as_ref().unwrap(), f.re.as_ref().unwrap()));
        assert!(e.matches(&"x".repeat(120)) && !e.matches("x"));
        // A failed pattern is not kept: it fails again, with its message.
        for _ in 0..2 {
            assert!(Matcher::new(MatchOp::RegexMatch, "job", "b(").unwrap_err().to_string().contains("b("));
        }
    }

    #[test]
    fn inverse_rejects_what_the_original_accepts() {
        let r = m(MatchOp::RegexMatch, "x|y").inverse();
        assert_eq!(r.op, MatchOp::RegexNoMatch);
        assert!(!r.matches("x") && r.matches("z"));
    }

    proptest! {
        /// Every fast path agrees with the plain anchored regex.
        #[test]
        fn fast_paths_agree_with_regex(
            pattern in prop::sample::select(vec![
                "", ".*", ".+", "a", "a|b", "ab|cd|e", "a.*", "ab.*", "a[bc]+", "(a|b)c", "[a-c]",
                ".*a", "a?", "(?i)ab", "a|", "x.*y", r"\d+", "ab(c|d)",
            ]),
            input in "[abcdxy0-9\n]{0,5}",
        ) {
            let plain = regex::Regex::new(&format!("^(?s:{pattern})$")).unwrap();
            let fast = RegexMatcher::new(pattern).unwrap();
            prop_assert_eq!(fast.is_match(&input), plain.is_match(&input), "pattern {:?}", pattern);
        }
    }
}
