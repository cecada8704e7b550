//! Label sets: sorted by name, `__name__` included, no empty values, no duplicate names.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// The label that carries the metric name.
pub const METRIC_NAME: &str = "__name__";

/// Separator used when hashing, a byte that cannot occur in UTF-8 text.
const HASH_SEPARATOR: u8 = 0xff;

/// One label. Strings are reference-counted so that label sets handed out by queries can share
/// them with the head's symbol table instead of copying.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Label {
    pub name: Arc<str>,
    pub value: Arc<str>,
}

impl Label {
    pub fn new(name: impl Into<Arc<str>>, value: impl Into<Arc<str>>) -> Self {
        Label { name: name.into(), value: value.into() }
    }
}

impl fmt::Debug for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={:?}", self.name, self.value)
    }
}

/// Why a label set was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelsError {
    #[error("label set is empty")]
    Empty,
    #[error("label name is empty (value {value:?})")]
    EmptyName { value: String },
    #[error("duplicate label name {name:?}")]
    DuplicateName { name: String },
}

/// `Labels::stable_hash` of the label set these pairs form, computed from borrowed strings
/// (the pairs must already be in canonical order: see `pairs_are_canonical`).
pub fn stable_hash_pairs<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> u64 {
    // One-shot hashing of a joined buffer: same value as streaming the parts, much faster
    // for many short strings.
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|b| {
        let mut b = b.borrow_mut();
        b.clear();
        for (n, v) in pairs {
            b.extend_from_slice(n.as_bytes());
            b.push(HASH_SEPARATOR);
            b.extend_from_slice(v.as_bytes());
            b.push(HASH_SEPARATOR);
        }
        xxhash_rust::xxh3::xxh3_64(&b)
    })
}

/// Whether `pairs` already are a valid label set as `Labels` stores it: names strictly
/// ascending (so unique) and non-empty, values non-empty. Clients such as Prometheus send label
/// sets this way, which lets the write path look series up without building a `Labels`.
pub fn pairs_are_canonical<N: AsRef<str>, V: AsRef<str>>(pairs: &[(N, V)]) -> bool {
    !pairs.is_empty()
        && pairs.iter().all(|(n, v)| !n.as_ref().is_empty() && !v.as_ref().is_empty())
        && pairs.windows(2).all(|w| w[0].0.as_ref() < w[1].0.as_ref())
}

/// A sorted label set. Invariant: sorted by name, names unique and non-empty, values non-empty.
///
/// Immutable once built, and shared: a clone is one reference count, not a copy of the labels
/// with two counts per label. Queries clone a selected series' labels into each of its
/// results, on several threads at once; with a vector, each clone and drop also raised and
/// lowered the counts of the strings every series shares (`__name__`, `instance`) from those
/// threads.
#[derive(Clone, Eq)]
pub struct Labels(Arc<[Label]>);

impl Default for Labels {
    fn default() -> Self {
        Labels::empty()
    }
}

/// Equal by content (two sets that share their labels are equal without reading them), so
/// hashed by content too.
impl PartialEq for Labels {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl std::hash::Hash for Labels {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl Labels {
    /// An empty label set (the identity for building).
    pub fn empty() -> Self {
        Labels(Arc::from(Vec::new()))
    }

    /// Builds a validated label set from pairs in any order. Pairs with an empty value are
    /// dropped (an empty value means the label is absent).
    pub fn try_from_pairs<N, V>(pairs: impl IntoIterator<Item = (N, V)>) -> Result<Self, LabelsError>
    where
        N: Into<Arc<str>>,
        V: Into<Arc<str>>,
    {
        let mut v: Vec<Label> = Vec::new();
        for (n, val) in pairs {
            let l = Label::new(n, val);
            if l.name.is_empty() {
                return Err(LabelsError::EmptyName { value: l.value.to_string() });
            }
            if !l.value.is_empty() {
                v.push(l);
            }
        }
        Self::from_unsorted(v)
    }

    /// Like [`Labels::try_from_pairs`] but panics on invalid input; for tests and literals.
    pub fn from_pairs<N, V>(pairs: impl IntoIterator<Item = (N, V)>) -> Self
    where
        N: Into<Arc<str>>,
        V: Into<Arc<str>>,
    {
        Self::try_from_pairs(pairs).expect("valid label pairs")
    }

    fn from_unsorted(mut v: Vec<Label>) -> Result<Self, LabelsError> {
        v.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = v.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(LabelsError::DuplicateName { name: w[0].name.to_string() });
        }
        Ok(Labels(v.into()))
    }

    /// Wraps labels already known to be sorted, unique and non-empty (e.g. decoded from our own
    /// storage, which only ever stores valid sets). Checked in debug builds.
    pub fn from_sorted_unchecked(v: Vec<Label>) -> Self {
        Labels::from_sorted_iter_unchecked(v.into_iter())
    }

    /// `from_sorted_unchecked` of labels given one by one, with their count known: written
    /// straight into the shared allocation (one allocation, no vector first and no copy of it;
    /// a query's selection builds one set per series).
    pub fn from_sorted_iter_unchecked(labels: impl ExactSizeIterator<Item = Label>) -> Self {
        let set = Labels(labels.collect());
        debug_assert!(set.0.windows(2).all(|w| w[0].name < w[1].name), "labels not sorted/unique");
        debug_assert!(set.0.iter().all(|l| !l.name.is_empty() && !l.value.is_empty()));
        set
    }

    /// Checks the invariants; used on label sets that come from outside.
    pub fn validate(&self) -> Result<(), LabelsError> {
        if self.0.is_empty() {
            return Err(LabelsError::Empty);
        }
        for (i, l) in self.0.iter().enumerate() {
            if l.name.is_empty() {
                return Err(LabelsError::EmptyName { value: l.value.to_string() });
            }
            if i > 0 && self.0[i - 1].name >= l.name {
                return Err(LabelsError::DuplicateName { name: l.name.to_string() });
            }
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.binary_search_by(|l| (*l.name).cmp(name)).ok().map(|i| &*self.0[i].value)
    }

    /// The metric name, if any.
    pub fn metric_name(&self) -> Option<&str> {
        self.get(METRIC_NAME)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Label> {
        self.0.iter()
    }

    pub fn as_slice(&self) -> &[Label] {
        &self.0
    }

    /// A stable 64-bit hash: XXH3 over `name 0xff value 0xff` for each label in order. It
    /// depends only on the label strings, never on process state, so it may be persisted.
    pub fn stable_hash(&self) -> u64 {
        stable_hash_pairs(self.0.iter().map(|l| (&*l.name, &*l.value)))
    }
}

impl Ord for Labels {
    /// Prometheus' order: compare label by label, name first, then value; a set that is a prefix
    /// of another sorts first.
    fn cmp(&self, other: &Self) -> Ordering {
        // Strings shared between label sets (a reader's interned symbols) are equal without
        // reading their bytes.
        let cmp_str = |a: &Arc<str>, b: &Arc<str>| if Arc::ptr_eq(a, b) { Ordering::Equal } else { a.cmp(b) };
        if Arc::ptr_eq(&self.0, &other.0) {
            return Ordering::Equal;
        }
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            match cmp_str(&a.name, &b.name).then_with(|| cmp_str(&a.value, &b.value)) {
                Ordering::Equal => continue,
                o => return o,
            }
        }
        self.0.len().cmp(&other.0.len())
    }
}

impl PartialOrd for Labels {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Labels {
    /// `name{a="b", c="d"}` as Prometheus prints series.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(n) = self.metric_name() {
            f.write_str(n)?;
        }
        f.write_str("{")?;
        let mut first = true;
        for l in self.0.iter().filter(|l| &*l.name != METRIC_NAME) {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{}={:?}", l.name, &*l.value)?;
        }
        f.write_str("}")
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = &'a Label;
    type IntoIter = std::slice::Iter<'a, Label>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Builds a label set by setting and deleting labels on top of a base set.
#[derive(Debug, Default)]
pub struct LabelsBuilder {
    labels: Vec<Label>,
}

impl LabelsBuilder {
    pub fn new(base: &Labels) -> Self {
        LabelsBuilder { labels: base.0.to_vec() }
    }

    /// Sets `name` to `value`; an empty value deletes the label.
    pub fn set(&mut self, name: impl Into<Arc<str>>, value: impl Into<Arc<str>>) -> &mut Self {
        let l = Label::new(name, value);
        self.labels.retain(|x| x.name != l.name);
        if !l.value.is_empty() {
            self.labels.push(l);
        }
        self
    }

    pub fn del(&mut self, name: &str) -> &mut Self {
        self.labels.retain(|x| &*x.name != name);
        self
    }

    pub fn build(self) -> Result<Labels, LabelsError> {
        Labels::from_unsorted(self.labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_sorted_and_empty_values_dropped() {
        let l = Labels::from_pairs([("b", "2"), ("__name__", "up"), ("a", ""), ("c", "3")]);
        let names: Vec<&str> = l.iter().map(|l| &*l.name).collect();
        assert_eq!(names, ["__name__", "b", "c"]);
        assert_eq!(l.get("a"), None);
        assert_eq!(l.metric_name(), Some("up"));
        assert_eq!(l.to_string(), r#"up{b="2", c="3"}"#);
    }

    #[test]
    fn a_set_built_from_an_iterator_equals_one_built_from_a_vector() {
        let labels = [Label::new("__name__", "up"), Label::new("instance", "a:9100"), Label::new("job", "node")];
        let from_iter = Labels::from_sorted_iter_unchecked(labels.iter().cloned());
        let from_vec = Labels::from_sorted_unchecked(labels.to_vec());
        assert_eq!(from_iter, from_vec);
        assert_eq!(from_iter.as_slice(), &labels);
        assert_eq!(from_iter.stable_hash(), from_vec.stable_hash());
    }

    #[test]
    fn clones_share_their_labels_and_compare_by_content() {
        let a = Labels::from_pairs([("__name__", "up"), ("job", "a")]);
        let b = a.clone();
        assert!(std::ptr::eq(a.as_slice(), b.as_slice()), "a clone shares the labels");
        assert_eq!((a == b, a.cmp(&b)), (true, Ordering::Equal));
        let same = Labels::from_pairs([("job", "a"), ("__name__", "up")]);
        assert_eq!((a == same, a.cmp(&same)), (true, Ordering::Equal));
        let other = Labels::from_pairs([("__name__", "up"), ("job", "b")]);
        assert_eq!((a == other, a.cmp(&other)), (false, Ordering::Less));
        let mut changed = LabelsBuilder::new(&b);
        changed.set("job", "z");
        let changed = changed.build().unwrap();
        assert_eq!((a.get("job"), b.get("job"), changed.get("job")), (Some("a"), Some("a"), Some("z")));
        assert_eq!(Labels::default(), Labels::empty());
    }

    #[test]
    fn duplicate_and_empty_names_are_errors() {
        assert_eq!(
            Labels::try_from_pairs([("a", "1"), ("a", "2")]),
            Err(LabelsError::DuplicateName { name: "a".into() })
        );
        assert_eq!(Labels::try_from_pairs([("", "1")]), Err(LabelsError::EmptyName { value: "1".into() }));
        assert_eq!(Labels::empty().validate(), Err(LabelsError::Empty));
    }

    #[test]
    fn utf8_names_are_allowed() {
        let l = Labels::from_pairs([("__name__", "température.celsius"), ("région", "île")]);
        assert!(l.validate().is_ok());
        assert_eq!(l.get("région"), Some("île"));
    }

    #[test]
    fn hash_is_stable_and_separates_boundaries() {
        let a = Labels::from_pairs([("a", "bc")]);
        let b = Labels::from_pairs([("ab", "c")]);
        assert_ne!(a.stable_hash(), b.stable_hash());
        // Frozen value: the hash is persisted, so it must never change between versions.
        assert_eq!(Labels::from_pairs([("__name__", "up")]).stable_hash(), 0xb1de_cace_4493_c590);
    }

    #[test]
    fn ordering_is_label_by_label() {
        let a = Labels::from_pairs([("a", "1")]);
        let b = Labels::from_pairs([("a", "1"), ("b", "1")]);
        let c = Labels::from_pairs([("a", "2")]);
        let d = Labels::from_pairs([("b", "0")]);
        let mut v = vec![d.clone(), c.clone(), b.clone(), a.clone()];
        v.sort();
        assert_eq!(v, vec![a, b, c, d]);
    }

    #[test]
    fn builder_sets_and_deletes() {
        let base = Labels::from_pairs([("a", "1"), ("b", "2")]);
        let mut b = LabelsBuilder::new(&base);
        b.set("c", "3").set("a", "").del("b");
        assert_eq!(b.build().unwrap(), Labels::from_pairs([("c", "3")]));
    }
}
