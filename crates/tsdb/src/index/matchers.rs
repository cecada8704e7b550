//! Turning label matchers into a postings cursor, for any index (the head's or a block's).
//!
//! A matcher that rejects the empty string selects series by the values it accepts (a union of
//! their lists); every such matcher is intersected. A matcher that accepts the empty string also
//! selects series *without* the label, so it is applied as a subtraction of the values it
//! rejects (`a!="x"` subtracts `a="x"`; `a=~".*"` subtracts nothing). With no matcher of the first
//! kind the intersection starts from all series.

use strata_model::Matcher;

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
    ix.postings_matching(&m.name, m.literal_prefix(), &|v| m.matches(v))
}
