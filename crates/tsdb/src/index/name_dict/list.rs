//! A set of names' nodes in two sorted arrays (by bytes, and by bytes read last first): what
//! the head folds recent names into between two builds of its main dictionary.
//!
//! A `NameDict` is small (its tries share every repeated subtree: a million host-shaped paths
//! take a few KiB to a few MiB) but building one costs over half a microsecond per node and trie;
//! while a burst of a million new carbon paths arrived, building the head's levels and main
//! dictionary over and over was a third of the server's CPU. Two `NameList`s merge in one
//! comparison per node, at the price of holding the names' text plus 16 bytes per node.
//!
//! A search runs the pattern's automaton over the keys in order, resuming each from the bytes
//! it shares with the one before (as a trie walk shares a path's prefix). Where the automaton
//! dies on a key's byte, no key sharing the prefix up to that byte can match: the walk skips
//! them with a galloping search, or, when the automaton lives on only a few bytes there,
//! straight to the first key with the next of them. So `servers.dc2.*` reads the keys under
//! `servers.dc2.` and `*.*.*.net.eth0.rx_bytes` reads, in the reversed order, those ending in
//! `.net.eth0.rx_bytes`.

use std::cmp::Ordering;
use std::sync::OnceLock;

use regex_automata::dfa::Automaton as _;

use super::{
    common_prefix_len, merged_in_order, start_state, CompiledDfa, NameDelta, NamePattern, NodeEntry, SortBuffers,
    SortedNodes, BRANCH, LEAF,
};

/// The nodes of a set of names, sorted both ways.
#[derive(Debug, Default, Clone)]
pub struct NameList {
    /// The names, back to back (a node is a name or the start of one).
    text: Vec<u8>,
    forward: Vec<Node>,
    /// Sorted when first read (`reversed`): only a search for names by their ends (a leading
    /// star) and the main dictionary's rebuild read it. While a burst of new carbon paths
    /// is folded into levels, neither usually comes, and sorting every fold's nodes both ways
    /// and merging both orders level into level was half of the folds' work (a fifth of the
    /// server's CPU while a million new paths arrived, in `perf`).
    reversed: OnceLock<Vec<Node>>,
}

/// A node: `text[start..start + len]` and its flags, in 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Node(u64);

const FLAG_BITS: u32 = 2;
/// A name is shorter than a WAL record (`wal::segment::RECORD_BYTES_MAX`, 64 MiB).
const LEN_BITS: u32 = 26;
/// 64 GiB of names' text: more than a head holds.
const START_BITS: u32 = 64 - LEN_BITS - FLAG_BITS;

impl Node {
    fn new(start: usize, len: usize, flags: u8) -> Node {
        assert!(
            (start as u64) < 1 << START_BITS && (len as u64) < 1 << LEN_BITS,
            "a node lies in the first 64 GiB of text and is shorter than 64 MiB (start {start}, length {len})"
        );
        debug_assert!(flags & !(LEAF | BRANCH) == 0, "two flags");
        Node(((start as u64) << (LEN_BITS + FLAG_BITS)) | ((len as u64) << FLAG_BITS) | u64::from(flags))
    }

    fn start(self) -> usize {
        (self.0 >> (LEN_BITS + FLAG_BITS)) as usize
    }

    fn len(self) -> usize {
        ((self.0 >> FLAG_BITS) & ((1 << LEN_BITS) - 1)) as usize
    }

    fn flags(self) -> u8 {
        (self.0 & ((1 << FLAG_BITS) - 1)) as u8
    }

    fn key(self, text: &[u8]) -> &[u8] {
        &text[self.start()..self.start() + self.len()]
    }

    fn with_flags(self, flags: u8) -> Node {
        Node(self.0 | u64::from(flags))
    }

    /// The same node in a text `by` bytes further on.
    fn shifted(self, by: usize) -> Node {
        Node::new(self.start() + by, self.len(), self.flags())
    }
}

impl NameList {
    /// The nodes of `delta`'s names (the reversed order is sorted when first read).
    pub fn from_delta(delta: &NameDelta) -> NameList {
        let text = delta.bytes.clone();
        let mut runs: Vec<Vec<Node>> = delta
            .nodes_sorted_in(false, &mut SortBuffers::default())
            .into_iter()
            .map(|run: SortedNodes<'_>| run.nodes.iter().map(|e| Node::new(e.start, e.len as usize, e.flags)).collect())
            .collect();
        // The runs (of `NAMES_PER_RUN` names each) merged two by two.
        while runs.len() > 1 {
            let mut merged = Vec::with_capacity(runs.len().div_ceil(2));
            let mut pairs = runs.into_iter();
            while let Some(a) = pairs.next() {
                merged.push(match pairs.next() {
                    Some(b) => merge::<Forward>(&text, &a, &b, 0),
                    None => a,
                });
            }
            runs = merged;
        }
        NameList { forward: runs.pop().unwrap_or_default(), text, reversed: OnceLock::new() }
    }

    /// The nodes of both, flags merged where both have a node.
    pub fn merge(a: &NameList, b: &NameList) -> NameList {
        let mut text = Vec::with_capacity(a.text.len() + b.text.len());
        text.extend_from_slice(&a.text);
        text.extend_from_slice(&b.text);
        let forward = merge::<Forward>(&text, &a.forward, &b.forward, a.text.len());
        // Kept where a search has read either side's (the other, usually the newest and
        // smallest level, sorted now): a leading-star find during a burst of new paths would
        // otherwise sort the whole merged level again after every fold. Neither read: sorted
        // when read.
        let reversed = match a.reversed.get().is_some() || b.reversed.get().is_some() {
            true => OnceLock::from(merge::<Backward>(&text, a.reversed(), b.reversed(), a.text.len())),
            false => OnceLock::new(),
        };
        NameList { text, forward, reversed }
    }

    /// The nodes by bytes read last first, sorted on the first call.
    fn reversed(&self) -> &[Node] {
        self.reversed.get_or_init(|| {
            let mut entries: Vec<NodeEntry> =
                self.forward.iter().map(|n| NodeEntry::new(n.start(), n.start() + n.len(), n.flags())).collect();
            let sorted = merged_in_order(&self.text, &mut entries, true, &mut SortBuffers::default());
            debug_assert_eq!(sorted.len(), self.forward.len(), "the forward order holds each node once");
            sorted.iter().map(|e| Node::new(e.start, e.len as usize, e.flags)).collect()
        })
    }

    /// Number of nodes (leaves and branches; a node that is both counts once).
    pub fn len(&self) -> usize {
        self.forward.len()
    }

    pub fn is_empty(&self) -> bool {
        self.forward.is_empty()
    }

    /// Heap bytes held.
    pub fn bytes(&self) -> usize {
        let reversed = self.reversed.get().map_or(0, Vec::capacity);
        self.text.capacity() + (self.forward.capacity() + reversed) * std::mem::size_of::<Node>()
    }

    /// The nodes with their flags, by bytes (`reversed`: by bytes read last first), each
    /// given as written.
    pub(super) fn nodes(&self, reversed: bool) -> impl ExactSizeIterator<Item = (&[u8], u8)> {
        let nodes = if reversed { self.reversed() } else { &self.forward };
        nodes.iter().map(|n| (n.key(&self.text), n.flags()))
    }

    /// Calls `visit(node, flags)` for every node `pattern` matches (in order when walked
    /// forwards); `visit` returns false to stop. The direction is the pattern's guess from
    /// its literal ends: a list has no shared subtrees to make the other way cheaper, as a
    /// trie's memo does.
    pub fn search(&self, pattern: &NamePattern, visit: impl FnMut(&[u8], u8) -> bool) {
        match pattern.pinned.unwrap_or(pattern.reverse) {
            false => walk::<Forward>(&self.text, &self.forward, &pattern.forward, visit),
            true => walk::<Backward>(&self.text, self.reversed(), &pattern.backward, visit),
        };
    }
}

/// `a` and `b` (each sorted in order `O`, one entry per key) as one, the flags of a key in
/// both merged. `a`'s keys are in `text`, `b`'s in `text[b_at..]` (a merge of two lists
/// appends the second's text to the first's): they come out pointing into `text`.
fn merge<O: KeyOrder>(text: &[u8], a: &[Node], b: &[Node], b_at: usize) -> Vec<Node> {
    let b_text = &text[b_at..];
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match O::cmp(a[i].key(text), b[j].key(b_text)) {
            Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            Ordering::Greater => {
                out.push(b[j].shifted(b_at));
                j += 1;
            }
            Ordering::Equal => {
                out.push(a[i].with_flags(b[j].flags()));
                (i, j) = (i + 1, j + 1);
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend(b[j..].iter().map(|n| n.shifted(b_at)));
    debug_assert!(out.windows(2).all(|w| O::cmp(w[0].key(text), w[1].key(text)) == Ordering::Less));
    out
}

/// How keys are read: first byte first (`Forward`) or last byte first (`Backward`). Keys are
/// always slices of the text as written; a probe is a key's start already read in the order.
trait KeyOrder {
    /// The `i`th byte read.
    fn byte(key: &[u8], i: usize) -> u8;
    fn cmp(a: &[u8], b: &[u8]) -> Ordering;
    /// How `key` read in this order compares with `probe`.
    fn cmp_probe(key: &[u8], probe: &[u8]) -> Ordering;
    /// Whether `key` read in this order starts with `probe`.
    fn starts_with(key: &[u8], probe: &[u8]) -> bool;
    /// How many bytes `a` and `b` read in this order start with in common.
    fn shared(a: &[u8], b: &[u8]) -> usize;
    /// Appends the first `n` bytes of `key` read in this order.
    fn push_start(key: &[u8], n: usize, out: &mut Vec<u8>);
}

struct Forward;
struct Backward;

impl KeyOrder for Forward {
    fn byte(key: &[u8], i: usize) -> u8 {
        key[i]
    }

    fn cmp(a: &[u8], b: &[u8]) -> Ordering {
        a.cmp(b)
    }

    fn cmp_probe(key: &[u8], probe: &[u8]) -> Ordering {
        key.cmp(probe)
    }

    fn starts_with(key: &[u8], probe: &[u8]) -> bool {
        key.starts_with(probe)
    }

    fn shared(a: &[u8], b: &[u8]) -> usize {
        common_prefix_len(a, b)
    }

    fn push_start(key: &[u8], n: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&key[..n]);
    }
}

/// The eight bytes ending `from_end` bytes before `key`'s end, as an integer whose most
/// significant byte is the last of them: comparing two such integers compares the bytes
/// read last first.
fn word_from_end(key: &[u8], from_end: usize) -> u64 {
    let end = key.len() - from_end;
    u64::from_le_bytes(key[end - 8..end].try_into().expect("eight bytes"))
}

impl KeyOrder for Backward {
    fn byte(key: &[u8], i: usize) -> u8 {
        key[key.len() - 1 - i]
    }

    fn cmp(a: &[u8], b: &[u8]) -> Ordering {
        let mut done = 0;
        while a.len() - done >= 8 && b.len() - done >= 8 {
            let (x, y) = (word_from_end(a, done), word_from_end(b, done));
            if x != y {
                return x.cmp(&y);
            }
            done += 8;
        }
        a[..a.len() - done].iter().rev().cmp(b[..b.len() - done].iter().rev())
    }

    fn cmp_probe(key: &[u8], probe: &[u8]) -> Ordering {
        key.iter().rev().cmp(probe.iter())
    }

    fn starts_with(key: &[u8], probe: &[u8]) -> bool {
        key.len() >= probe.len() && key.iter().rev().zip(probe).all(|(a, b)| a == b)
    }

    fn shared(a: &[u8], b: &[u8]) -> usize {
        let mut done = 0;
        while a.len() - done >= 8 && b.len() - done >= 8 {
            let diff = word_from_end(a, done) ^ word_from_end(b, done);
            if diff != 0 {
                return done + (diff.leading_zeros() / 8) as usize;
            }
            done += 8;
        }
        done + a[..a.len() - done]
            .iter()
            .rev()
            .zip(b[..b.len() - done].iter().rev())
            .take_while(|(x, y)| x == y)
            .count()
    }

    fn push_start(key: &[u8], n: usize, out: &mut Vec<u8>) {
        out.extend(key[key.len() - n..].iter().rev());
    }
}

/// The pattern's automaton run over `nodes` (sorted in order `O`) as over a trie: each key from
/// the bytes it shares with the one before; the keys sharing a prefix on which the automaton
/// died are skipped. Returns the work: bytes read by the automaton plus keys probed.
fn walk<O: KeyOrder>(text: &[u8], nodes: &[Node], dfa: &CompiledDfa, mut visit: impl FnMut(&[u8], u8) -> bool) -> u64 {
    let mut work = 0u64;
    // `states[d]`: the automaton's state after the first `d` bytes of the last key read, as
    // far as it lived through them.
    let mut states = vec![start_state(&dfa.dfa)];
    let mut prev: &[u8] = &[];
    let mut probe: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < nodes.len() {
        let node = nodes[i];
        let key = node.key(text);
        let shared = O::shared(key, prev).min(states.len() - 1);
        states.truncate(shared + 1);
        prev = key;
        let mut died_on = None;
        for d in shared..key.len() {
            let b = O::byte(key, d);
            let next = dfa.dfa.next_state(states[d], b);
            work += 1;
            if dfa.dfa.is_dead_state(next) {
                died_on = Some(b);
                break;
            }
            states.push(next);
        }
        let Some(b) = died_on else {
            if dfa.matches_at_end(states[key.len()]) && !visit(key, node.flags()) {
                return work;
            }
            i += 1;
            continue;
        };
        // The automaton died on byte `d` of this key: no key starting with its first `d + 1`
        // bytes matches; if it lives on only a few bytes after the first `d`, none starting
        // with those and a byte below the next of them either.
        let d = states.len() - 1;
        probe.clear();
        O::push_start(key, d, &mut probe);
        let key_at = |j: usize| nodes[j].key(text);
        i = match dfa.live_bytes(states[d]).map(|live| live.iter().copied().find(|&l| l > b)) {
            Some(Some(next_live)) => {
                probe.push(next_live);
                gallop(i + 1, nodes.len(), &mut work, |j| O::cmp_probe(key_at(j), &probe) != Ordering::Less)
            }
            Some(None) => gallop(i + 1, nodes.len(), &mut work, |j| !O::starts_with(key_at(j), &probe)),
            None => {
                probe.push(b);
                gallop(i + 1, nodes.len(), &mut work, |j| !O::starts_with(key_at(j), &probe))
            }
        };
    }
    work
}

/// The first index in `from..n` at which `past` holds (`n` if none), `past` being false up to
/// some index and true from there: probed at doubling distances, then bisected. Skips are
/// mostly short (a host's few metrics), sometimes the whole list.
fn gallop(from: usize, n: usize, work: &mut u64, past: impl Fn(usize) -> bool) -> usize {
    let (mut lo, mut hi) = (from, n);
    let mut step = 1;
    while lo < n {
        let at = (lo + step - 1).min(n - 1);
        *work += 1;
        if past(at) {
            hi = at;
            break;
        }
        lo = at + 1;
        step *= 2;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        *work += 1;
        if past(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::super::tests::{host_names, nodes_matching};
    use super::super::{NameDict, NamePattern};
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn delta_of<'a>(names: impl IntoIterator<Item = &'a str>) -> NameDelta {
        let mut delta = NameDelta::default();
        for n in names {
            delta.add(n);
        }
        delta
    }

    /// What a search visits, in the order visited, checked to visit each node once.
    fn visits(list: &NameList, p: &NamePattern) -> Vec<(String, u8)> {
        let mut out: Vec<(String, u8)> = Vec::new();
        list.search(p, |k, f| {
            out.push((String::from_utf8(k.to_vec()).unwrap(), f));
            true
        });
        let once: BTreeMap<_, _> = out.iter().cloned().collect();
        assert_eq!(once.len(), out.len(), "a node visited twice: {out:?}");
        out
    }

    #[test]
    fn nodes_sorted_both_ways_with_flags() {
        let list = NameList::from_delta(&delta_of(["a.b.c", "a.b", "x.b", "a.b.c", "ünï.b"]));
        let forward: Vec<_> = list.nodes(false).map(|(k, f)| (String::from_utf8(k.to_vec()).unwrap(), f)).collect();
        let leaf_branch = LEAF | BRANCH;
        assert_eq!(
            forward,
            [
                ("a".into(), BRANCH),
                ("a.b".into(), leaf_branch),
                ("a.b.c".into(), LEAF),
                ("x".into(), BRANCH),
                ("x.b".into(), LEAF),
                ("ünï".into(), BRANCH),
                ("ünï.b".into(), LEAF)
            ]
        );
        let reversed: Vec<_> = list.nodes(true).map(|(k, _)| String::from_utf8(k.to_vec()).unwrap()).collect();
        // Read last byte first: "a", "b.a", "b.x", "b.ïnü", "c.b.a", "x", "ïnü".
        assert_eq!(reversed, ["a", "a.b", "x.b", "ünï.b", "a.b.c", "x", "ünï"]);
        assert_eq!(list.len(), 7);
    }

    #[test]
    fn a_merge_holds_the_nodes_of_both() {
        let names = host_names(40);
        let (first, second) = names.split_at(names.len() / 3);
        let a = NameList::from_delta(&delta_of(first.iter().map(String::as_str).chain(["a.b"])));
        let b = NameList::from_delta(&delta_of(second.iter().map(String::as_str).chain(["a.b.c", "servers"])));
        let whole =
            NameList::from_delta(&delta_of(names.iter().map(String::as_str).chain(["a.b", "a.b.c", "servers"])));
        // The reversed order sorted on read (neither side had it), then merged (one side had
        // it, then both).
        let merged = NameList::merge(&a, &b);
        assert!(merged.reversed.get().is_none(), "not sorted before it is read");
        for reversed in [false, true] {
            assert!(merged.nodes(reversed).eq(whole.nodes(reversed)), "reversed: {reversed}");
        }
        for side in [&a, &b] {
            side.reversed();
            let merged = NameList::merge(&a, &b);
            assert!(merged.reversed.get().is_some(), "kept as a side had it");
            assert!(merged.nodes(true).eq(whole.nodes(true)));
        }
        let servers = merged.nodes(false).find(|(k, _)| *k == b"servers").unwrap();
        assert_eq!(servers.1, LEAF | BRANCH, "a branch in one, a leaf in the other");
    }

    #[test]
    fn globs_skip_what_they_cannot_match() {
        let names = host_names(300);
        let list = NameList::from_delta(&delta_of(names.iter().map(String::as_str)));
        let nodes = list.len() as u64;
        for (re, reversed) in [(r"servers\.dc2\.host-042\.[^.]*", false), (r"[^.]*\.[^.]*\.[^.]*\.own\.h77", true)] {
            let p = NamePattern::new(re).unwrap().walking(reversed);
            let work = match reversed {
                false => walk::<Forward>(&list.text, &list.forward, &p.forward, |_, _| true),
                true => walk::<Backward>(&list.text, list.reversed(), &p.backward, |_, _| true),
            };
            assert!(work < nodes / 20, "{re}: work {work} over {nodes} nodes");
            let want: BTreeMap<String, u8> = nodes_matching(&names, re);
            assert!(!want.is_empty());
            assert_eq!(visits(&list, &p).into_iter().collect::<BTreeMap<_, _>>(), want);
        }
    }

    #[test]
    fn a_search_stops_when_asked() {
        let names = host_names(10);
        let list = NameList::from_delta(&delta_of(names.iter().map(String::as_str)));
        let p = NamePattern::new(".*").unwrap();
        let mut seen = 0;
        list.search(&p, |_, _| {
            seen += 1;
            seen < 5
        });
        assert_eq!(seen, 5);
    }

    proptest! {
        /// Both directions visit exactly the nodes the `regex` crate matches, each once
        /// (forwards in order); so do a merge of two lists and a dictionary built from lists.
        #[test]
        fn agrees_with_the_regex_crate(
            names in proptest::collection::vec("[ab.é]{0,6}", 0..60),
            re in proptest::collection::vec(
                proptest::sample::select(vec!["a", "b", r"\.", "é", "[^.]", ".*", "[ab]*", "(a|b.)", "(é|)", "[b-z]", "(ab|ba)"]),
                1..6,
            ).prop_map(|parts| parts.concat()),
            split in 0usize..60,
        ) {
            let split = split.min(names.len());
            let want = nodes_matching(&names, &re);
            let whole = NameList::from_delta(&delta_of(names.iter().map(String::as_str)));
            let merged = NameList::merge(
                &NameList::from_delta(&delta_of(names[..split].iter().map(String::as_str))),
                &NameList::from_delta(&delta_of(names[split..].iter().map(String::as_str))),
            );
            for reversed in [false, true] {
                prop_assert!(merged.nodes(reversed).eq(whole.nodes(reversed)));
                let p = NamePattern::new(&re).unwrap().walking(reversed);
                let got = visits(&whole, &p);
                if !reversed {
                    prop_assert!(got.is_sorted_by(|a, b| a.0 < b.0), "a forward walk visits in order: {:?}", got);
                }
                prop_assert_eq!(got.into_iter().collect::<BTreeMap<_, _>>(), want.clone());
            }
            let base = NameDict::build(names[..split].iter().map(String::as_str));
            let lists = [NameList::from_delta(&delta_of(names[split..].iter().map(String::as_str)))];
            let union = NameDict::union_lists(&[&base], &lists.iter().collect::<Vec<_>>(), &NameDelta::default());
            let all = NameDict::build(names.iter().map(String::as_str));
            prop_assert_eq!(union.as_bytes(), all.as_bytes());
        }

        #[test]
        fn backward_comparisons_agree_with_reversed_bytes(
            a in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), any::<u8>()], 0..30),
            b in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), any::<u8>()], 0..30),
        ) {
            let (ra, rb): (Vec<u8>, Vec<u8>) = (a.iter().rev().copied().collect(), b.iter().rev().copied().collect());
            prop_assert_eq!(Backward::cmp(&a, &b), ra.cmp(&rb));
            prop_assert_eq!(Backward::shared(&a, &b), common_prefix_len(&ra, &rb));
            prop_assert_eq!(Backward::cmp_probe(&a, &rb), ra.cmp(&rb));
            prop_assert_eq!(Backward::starts_with(&a, &rb), ra.starts_with(&rb));
        }
    }
}
