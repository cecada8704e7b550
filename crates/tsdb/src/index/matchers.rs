//! Turning label matchers into a postings cursor, for any index (the head's or a block's).
//!
//! A matcher that rejects the empty string selects series by the values it accepts (a union of
//! their lists); every such matcher is intersected. A matcher that accepts the empty string also
//! selects series *without* the label, so it is applied as a subtraction of the values it
//! rejects (`a!="x"` subtracts `a="x"`; `a=~".*"` subtracts nothing). With no matcher of the first
//! kind the intersection starts from all series.

use strata_model::{MatchOp, Matcher, METRIC_NAME};

use super::name_dict::{cached_pattern, NamePattern, LEAF};
use super::postings::{intersect, merge, without, BoxPostings};

/// What `postings_for_matchers` needs from an index.
pub trait IndexReader {
    /// Union of the lists of `name=v` for each `v` in `values`.
    fn postings(&self, name: &str, values: &[&str]) -> BoxPostings;
    /// Union of the lists of every value of `name` accepted by `accept`. `prefix` is a literal
    /// every accepted value starts with ("" if unknown), so sorted indexes can skip ahead.
    fn postings_matching(&self, name: &str, prefix: &str, accept: &dyn Fn(&str) -> bool) -> BoxPostings;
    /// Every series.
    fn all_postings(&self) -> BoxPostings;
    /// Calls `visit(node, flags)` for the metric names and path nodes `pattern` matches
    /// (`name_dict`); false, visiting nothing, when the index keeps no names dictionary.
    fn search_names(&self, _pattern: &NamePattern, _visit: &mut dyn FnMut(&[u8], u8) -> bool) -> bool {
        false
    }
}

/// Postings of the series matching all `matchers`.
pub fn postings_for_matchers(ix: &dyn IndexReader, matchers: &[Matcher]) -> BoxPostings {
    let mut positive = Vec::new();
    let mut negative = Vec::new();
    for m in matchers {
        if m.matches_empty() {
            negative.push(postings_for_matcher(ix, &m.inverse()));
        } else {
            positive.push(postings_for_matcher(ix, m));
        }
    }
    if positive.is_empty() {
        positive.push(ix.all_postings());
    }
    let p = intersect(positive);
    if negative.is_empty() {
        p
    } else {
        without(p, merge(negative))
    }
}

/// Series whose value of `m.name` is accepted by `m` (never series lacking the label).
fn postings_for_matcher(ix: &dyn IndexReader, m: &Matcher) -> BoxPostings {
    if let Some(set) = m.set_matches() {
        let set: Vec<&str> = set.into_iter().filter(|v| !v.is_empty()).collect();
        return ix.postings(&m.name, &set);
    }
    if m.op == MatchOp::RegexMatch && m.name == METRIC_NAME {
        if let Some(p) = names_matching(ix, &m.value) {
            return p;
        }
    }
    ix.postings_matching(&m.name, m.literal_prefix(), &|v| m.matches(v))
}

/// The series of the metric names `regex` matches, found by walking the names dictionary
/// (which enters only the branches the regex can match in, either way round) instead of
/// testing every name; `None` when the index has no dictionary or the regex is too complex for
/// one (the caller scans).
fn names_matching(ix: &dyn IndexReader, regex: &str) -> Option<BoxPostings> {
    let pattern = cached_pattern(regex).ok()?;
    let mut names: Vec<String> = Vec::new();
    let found = ix.search_names(&pattern, &mut |node, flags| {
        if flags & LEAF != 0 {
            names.push(String::from_utf8_lossy(node).into_owned());
        }
        true
    });
    if !found {
        return None;
    }
    names.sort_unstable();
    names.dedup();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Some(ix.postings(METRIC_NAME, &names))
}
