//! The dictionary of metric names (`__name__` values) and the nodes of their dotted path tree,
//! searched by a regex DFA: what Graphite's find and PromQL's regexes on `__name__` walk instead
//! of every name.
//!
//! Every name is a *leaf* node, and every prefix of it that ends before a `.` is a *branch*
//! node (`servers.dc1.host-1.cpu` gives leaf `servers.dc1.host-1.cpu` and branches `servers`,
//! `servers.dc1`, `servers.dc1.host-1`). The nodes are kept twice, as finite state transducers
//! (`fst` maps from node to its flags): once as written, once with their bytes reversed. A
//! pattern is compiled to a deterministic automaton, forwards and backwards, and walked together
//! with one of the two: the walk enters only the branches of the trie the automaton can still
//! match in, so `servers.dc1.*` reads the `servers.dc1` subtree, and `*.*.*.net.eth0.rx_bytes`
//! walks the reversed trie from `setyb_xr.0hte.ten.` instead of visiting every name. The
//! direction is the one with the longer literal run at its start (`NamePattern::reverse`).
//!
//! The same walk serves sorted in-memory maps (`search_sorted`), for names the head has gained
//! since its dictionary was last built: on a key where the automaton dies, the walk jumps past
//! every key sharing the dead prefix.

use std::collections::{btree_map, BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use fst::Streamer;
use parking_lot::Mutex;
use regex_automata::dfa::{dense, Automaton as _};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

/// The node is a name.
pub const LEAF: u8 = 1;
/// Longer names continue below the node.
pub const BRANCH: u8 = 2;

/// Most bytes one compiled direction of a pattern may take; a pattern past it is refused
/// (`PatternError::TooComplex`) and its caller scans instead.
pub const PATTERN_BYTES_MAX: usize = 8 << 20;

/// The two tries of one set of names.
#[derive(Clone)]
pub struct NameDict {
    forward: fst::Map<Bytes>,
    reversed: fst::Map<Bytes>,
}

impl std::fmt::Debug for NameDict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NameDict").field("nodes", &self.len()).field("bytes", &self.bytes()).finish()
    }
}

impl Default for NameDict {
    fn default() -> Self {
        NameDict::build(std::iter::empty::<&str>())
    }
}

/// Calls `f(node, flags)` for every node of `name`: its branches, shortest first, then the leaf.
pub fn for_each_node<'a>(name: &'a [u8], mut f: impl FnMut(&'a [u8], u8)) {
    for (i, &b) in name.iter().enumerate() {
        if b == b'.' {
            f(&name[..i], BRANCH);
        }
    }
    f(name, LEAF);
}

impl NameDict {
    /// The dictionary of `names` (any order, duplicates allowed; sorted is fastest). The two
    /// tries are built on two threads.
    pub fn build<'a>(names: impl IntoIterator<Item = &'a str>) -> NameDict {
        // Nodes borrow from the names: 24 bytes per node besides the tries. A branch the
        // previous name already had (same bytes up to its dot) is not repeated, so sorted
        // names give nodes nearly in order, which the stable sort below merges in linear time.
        let mut nodes: Vec<(&[u8], u8)> = Vec::new();
        let mut prev: &[u8] = &[];
        for name in names {
            let name = name.as_bytes();
            let common = name.iter().zip(prev).take_while(|(a, b)| a == b).count();
            for (i, &b) in name.iter().enumerate().skip(common) {
                if b == b'.' {
                    nodes.push((&name[..i], BRANCH));
                }
            }
            nodes.push((name, LEAF));
            prev = name;
        }
        nodes.sort();
        dedup_or_flags(&mut nodes);
        let mut by_reversed = nodes.clone();
        let (forward, reversed) = std::thread::scope(|scope| {
            let forward = scope.spawn(|| build_map(nodes.iter().copied(), false));
            by_reversed.sort_unstable_by(|a, b| cmp_reversed(a.0, b.0));
            let reversed = build_map(by_reversed.iter().copied(), true);
            (forward.join().expect("the forward trie's build does not panic"), reversed)
        });
        NameDict { forward, reversed }
    }

    /// A dictionary from the two serialized tries (`as_bytes`); `Err` names what is wrong.
    pub fn from_bytes(forward: Bytes, reversed: Bytes) -> Result<NameDict, String> {
        let forward = fst::Map::new(forward).map_err(|e| format!("forward names trie: {e}"))?;
        let reversed = fst::Map::new(reversed).map_err(|e| format!("reversed names trie: {e}"))?;
        if forward.len() != reversed.len() {
            return Err(format!("names tries disagree: {} nodes forward, {} reversed", forward.len(), reversed.len()));
        }
        Ok(NameDict { forward, reversed })
    }

    /// The serialized forward and reversed tries.
    pub fn as_bytes(&self) -> (&[u8], &[u8]) {
        (self.forward.as_fst().as_bytes(), self.reversed.as_fst().as_bytes())
    }

    /// Number of nodes (leaves and branches; a node that is both counts once).
    pub fn len(&self) -> usize {
        self.forward.len()
    }

    pub fn is_empty(&self) -> bool {
        self.forward.is_empty()
    }

    /// Bytes of both tries.
    pub fn bytes(&self) -> usize {
        self.forward.as_fst().as_bytes().len() + self.reversed.as_fst().as_bytes().len()
    }

    /// The flags of `node`, if it is one.
    pub fn get(&self, node: &[u8]) -> Option<u8> {
        self.forward.get(node).map(|v| v as u8)
    }

    /// Every leaf (name), in order.
    pub fn names(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut stream = self.forward.stream();
        while let Some((k, v)) = stream.next() {
            if v as u8 & LEAF != 0 {
                out.push(String::from_utf8_lossy(k).into_owned());
            }
        }
        out
    }

    /// Calls `visit(node, flags)` for every node `pattern` matches, in no particular order
    /// (forward order when walked forwards); `visit` returns false to stop.
    pub fn search(&self, pattern: &NamePattern, visit: impl FnMut(&[u8], u8) -> bool) {
        if pattern.reverse {
            walk(self.reversed.as_fst(), &pattern.backward, unreversing(visit));
        } else {
            walk(self.forward.as_fst(), &pattern.forward, visit);
        }
    }
}

/// `visit` for keys found in a reversed trie: each key is turned back the right way first.
fn unreversing(mut visit: impl FnMut(&[u8], u8) -> bool) -> impl FnMut(&[u8], u8) -> bool {
    let mut buf = Vec::new();
    move |key, flags| {
        buf.clear();
        buf.extend(key.iter().rev());
        visit(&buf, flags)
    }
}

/// One node on the walk's path: where it is in the trie and in the automaton, and which of
/// its next bytes comes next.
struct Frame<'f, 'd> {
    node: fst::raw::Node<'f>,
    state: StateID,
    /// The bytes that keep the automaton alive from `state`, when there are few.
    live: Option<&'d [u8]>,
    out: fst::raw::Output,
    key_len: usize,
    /// Index of the next transition to try, or of the next of the state's live bytes.
    next: usize,
}

/// Depth-first walk of `trie` together with `dfa`: a transition is followed only if the
/// automaton stays alive on its byte. Where the automaton can go on with only a few bytes (a
/// literal run, a short alternation) those are looked up in the node; elsewhere every
/// transition of the node is tried. Visits keys in order.
fn walk(trie: &fst::raw::Fst<Bytes>, dfa: &CompiledDfa, mut visit: impl FnMut(&[u8], u8) -> bool) {
    let start = start_state(&dfa.dfa);
    let root = trie.root();
    let mut key: Vec<u8> = Vec::new();
    if root.is_final() && dfa.matches_at_end(start) && !visit(&key, root.final_output().value() as u8) {
        return;
    }
    let live = dfa.live_bytes(start);
    let mut stack = vec![Frame { node: root, state: start, live, out: fst::raw::Output::zero(), key_len: 0, next: 0 }];
    while let Some(top) = stack.last_mut() {
        let transition = match top.live {
            Some(bytes) => {
                let Some(&b) = bytes.get(top.next) else {
                    stack.pop();
                    continue;
                };
                top.next += 1;
                match top.node.find_input(b) {
                    Some(i) => top.node.transition(i),
                    None => continue,
                }
            }
            None => {
                if top.next >= top.node.len() {
                    stack.pop();
                    continue;
                }
                let t = top.node.transition(top.next);
                top.next += 1;
                t
            }
        };
        let state = dfa.dfa.next_state(top.state, transition.inp);
        if dfa.dfa.is_dead_state(state) {
            continue;
        }
        let out = top.out.cat(transition.out);
        key.truncate(top.key_len);
        key.push(transition.inp);
        let node = trie.node(transition.addr);
        if node.is_final() && dfa.matches_at_end(state) && !visit(&key, out.cat(node.final_output()).value() as u8) {
            return;
        }
        stack.push(Frame { node, state, live: dfa.live_bytes(state), out, key_len: key.len(), next: 0 });
    }
}

/// Orders byte strings by their reversed bytes (last byte first), eight bytes at a time.
fn cmp_reversed(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let (mut i, mut j) = (a.len(), b.len());
    while i >= 8 && j >= 8 {
        // Little-endian: the last byte of each group is the most significant.
        let x = u64::from_le_bytes(a[i - 8..i].try_into().expect("8 bytes"));
        let y = u64::from_le_bytes(b[j - 8..j].try_into().expect("8 bytes"));
        if x != y {
            return x.cmp(&y);
        }
        i -= 8;
        j -= 8;
    }
    a[..i].iter().rev().cmp(b[..j].iter().rev())
}

/// Merges the flags of equal adjacent nodes (sorted input): one entry per node.
pub fn dedup_or_flags<K: PartialEq>(nodes: &mut Vec<(K, u8)>) {
    nodes.dedup_by(|later, kept| {
        if later.0 == kept.0 {
            kept.1 |= later.1;
            true
        } else {
            false
        }
    });
}

/// An fst map of `nodes` (sorted as they will be inserted: by bytes, or by reversed bytes).
fn build_map<'a>(nodes: impl Iterator<Item = (&'a [u8], u8)>, reversed: bool) -> fst::Map<Bytes> {
    let mut builder = fst::MapBuilder::memory();
    let mut key = Vec::new();
    for (node, flags) in nodes {
        let k = if reversed {
            key.clear();
            key.extend(node.iter().rev());
            &key[..]
        } else {
            node
        };
        builder.insert(k, u64::from(flags)).expect("nodes are sorted and unique in insertion order");
    }
    let bytes = builder.into_inner().expect("an in-memory fst build cannot fail on I/O");
    fst::Map::new(Bytes::from(bytes)).expect("a just-built fst is valid")
}

/// Why a pattern could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("invalid pattern {pattern:?}: {reason}")]
    Invalid { pattern: String, reason: String },
    #[error("pattern {0:?} compiles to an automaton over the size limit")]
    TooComplex(String),
}

/// A regex (whole-string match, `.` matching any character) compiled to a DFA in both
/// directions, and which direction to walk.
#[derive(Clone, Debug)]
pub struct NamePattern {
    forward: CompiledDfa,
    backward: CompiledDfa,
    /// Walk the reversed trie: the pattern's literal end is longer than its literal start.
    reverse: bool,
}

impl NamePattern {
    /// Compiles `regex` (the syntax of the `regex` crate, as PromQL's matchers use it).
    pub fn new(regex: &str) -> Result<NamePattern, PatternError> {
        let hir = regex_syntax::ParserBuilder::new()
            .dot_matches_new_line(true)
            .build()
            .parse(regex)
            .map_err(|e| PatternError::Invalid { pattern: regex.to_owned(), reason: e.to_string() })?;
        let prefix = literal_len(&hir, regex_syntax::hir::literal::ExtractKind::Prefix);
        let suffix = literal_len(&hir, regex_syntax::hir::literal::ExtractKind::Suffix);
        Ok(NamePattern {
            forward: CompiledDfa::new(compile(regex, &hir, false)?),
            backward: CompiledDfa::new(compile(regex, &hir, true)?),
            reverse: suffix > prefix,
        })
    }

    /// Whether searches walk the reversed trie.
    pub fn walks_reversed(&self) -> bool {
        self.reverse
    }

    /// The same pattern walked the given way (tests check both ways agree).
    #[cfg(test)]
    fn walking(mut self, reversed: bool) -> Self {
        self.reverse = reversed;
        self
    }

    /// Whether the whole of `s` matches.
    pub fn is_match(&self, s: &[u8]) -> bool {
        self.forward.run(s).is_ok_and(|state| self.forward.matches_at_end(state))
    }
}

/// Compiled patterns kept for reuse: a query compiles its pattern once, not once per block.
const PATTERN_CACHE_ENTRIES: usize = 64;

/// `NamePattern::new(regex)`, from a small cache of recent patterns (failures included, so a
/// pattern over the size limit is not determinized again by every query that uses it).
pub fn cached_pattern(regex: &str) -> Result<Arc<NamePattern>, PatternError> {
    type Cache = Mutex<VecDeque<(Box<str>, Result<Arc<NamePattern>, PatternError>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Cache::default);
    if let Some((_, hit)) = cache.lock().iter().find(|(k, _)| &**k == regex) {
        return hit.clone();
    }
    let compiled = NamePattern::new(regex).map(Arc::new);
    let mut c = cache.lock();
    if c.len() >= PATTERN_CACHE_ENTRIES {
        c.pop_front();
    }
    c.push_back((regex.into(), compiled.clone()));
    compiled
}

/// The shortest literal every match starts (or ends) with, in bytes; 0 when there is none.
fn literal_len(hir: &regex_syntax::hir::Hir, kind: regex_syntax::hir::literal::ExtractKind) -> usize {
    let mut extractor = regex_syntax::hir::literal::Extractor::new();
    extractor.kind(kind);
    let seq = extractor.extract(hir);
    seq.literals().map_or(0, |lits| lits.iter().map(|l| l.len()).min().unwrap_or(0))
}

fn compile(regex: &str, hir: &regex_syntax::hir::Hir, reverse: bool) -> Result<dense::DFA<Vec<u32>>, PatternError> {
    let config = dense::Config::new()
        .match_kind(MatchKind::All)
        .start_kind(regex_automata::dfa::StartKind::Anchored)
        .dfa_size_limit(Some(PATTERN_BYTES_MAX))
        .determinize_size_limit(Some(PATTERN_BYTES_MAX));
    let too_complex = || PatternError::TooComplex(regex.to_owned());
    let thompson = thompson::Config::new()
        .reverse(reverse)
        .which_captures(thompson::WhichCaptures::None)
        .nfa_size_limit(Some(PATTERN_BYTES_MAX));
    let nfa = thompson::Compiler::new().configure(thompson).build_from_hir(hir).map_err(|e| match e.size_limit() {
        Some(_) => too_complex(),
        None => PatternError::Invalid { pattern: regex.to_owned(), reason: e.to_string() },
    })?;
    dense::Builder::new().configure(config).build_from_nfa(&nfa).map_err(|e| {
        if e.is_size_limit_exceeded() {
            too_complex()
        } else {
            PatternError::Invalid { pattern: regex.to_owned(), reason: e.to_string() }
        }
    })
}

fn start_state(dfa: &dense::DFA<Vec<u32>>) -> StateID {
    dfa.start_state(&start::Config::new().anchored(Anchored::Yes))
        .expect("an anchored start state exists: the DFA is built with StartKind::Anchored and no look-behind")
}

/// States of a DFA from which at most this many bytes keep it alive have them listed.
const LIVE_BYTES_LISTED_MAX: usize = 4;
/// States examined for their live bytes when a pattern is compiled (256 transitions each).
const STATES_EXAMINED_MAX: usize = 4096;

/// A DFA and, for its states with few ways on, the bytes that keep it alive (so a walk looks
/// them up in a trie node instead of trying the node's every transition).
#[derive(Clone, Debug)]
struct CompiledDfa {
    dfa: dense::DFA<Vec<u32>>,
    few_live_bytes: foldhash::HashMap<StateID, Box<[u8]>>,
}

impl CompiledDfa {
    fn new(dfa: dense::DFA<Vec<u32>>) -> CompiledDfa {
        let mut few_live_bytes = foldhash::HashMap::default();
        let mut seen = foldhash::HashSet::default();
        let mut todo = vec![start_state(&dfa)];
        while let Some(s) = todo.pop() {
            if seen.len() >= STATES_EXAMINED_MAX || !seen.insert(s) {
                continue;
            }
            let mut live = Vec::new();
            for b in 0..=255u8 {
                let next = dfa.next_state(s, b);
                if !dfa.is_dead_state(next) && !dfa.is_quit_state(next) {
                    live.push(b);
                    todo.push(next);
                }
            }
            if live.len() <= LIVE_BYTES_LISTED_MAX {
                few_live_bytes.insert(s, live.into_boxed_slice());
            }
        }
        CompiledDfa { dfa, few_live_bytes }
    }

    /// The bytes that keep the automaton alive from `s`, ascending, when there are few.
    fn live_bytes(&self, s: StateID) -> Option<&[u8]> {
        self.few_live_bytes.get(&s).map(|b| &b[..])
    }

    /// The state after reading `input` from the start, or the offset of the byte on which the
    /// automaton died.
    fn run(&self, input: &[u8]) -> Result<StateID, usize> {
        let mut state = start_state(&self.dfa);
        for (i, &b) in input.iter().enumerate() {
            state = self.dfa.next_state(state, b);
            if self.dfa.is_dead_state(state) {
                return Err(i);
            }
        }
        Ok(state)
    }

    /// Whether the input read so far, ending here, matches.
    fn matches_at_end(&self, s: StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(s))
    }
}

/// Nodes gained since a dictionary was built, kept sorted both ways so that they are searched
/// as the dictionary is.
#[derive(Debug, Default, Clone)]
pub struct NameDelta {
    forward: BTreeMap<Box<[u8]>, u8>,
    reversed: BTreeMap<Box<[u8]>, u8>,
}

impl NameDelta {
    /// Adds the nodes of `name` that `base` lacks (or has without their flag).
    ///
    /// The nodes are taken longest first, and the walk stops at the first one `base` or the
    /// delta already has with its flag: every ancestor of a known node is known as a branch (a
    /// name brings all its nodes), so a new path under a known host costs one or two lookups,
    /// not one per component in two ordered maps.
    /// `frozen`: another delta known beside `base` (the one a running rebuild reads).
    pub fn add(&mut self, base: &NameDict, frozen: Option<&NameDelta>, name: &str) {
        let name = name.as_bytes();
        let (mut end, mut flags) = (name.len(), LEAF);
        loop {
            let node = &name[..end];
            let has = |have: u8| have & flags == flags;
            if base.get(node).is_some_and(has) || frozen.is_some_and(|d| d.forward.get(node).copied().is_some_and(has))
            {
                return;
            }
            // One walk down the map to look and to insert (an owned key costs less than a
            // second walk comparing long shared prefixes).
            match self.forward.entry(node.into()) {
                btree_map::Entry::Occupied(mut o) => {
                    if has(*o.get()) {
                        return;
                    }
                    *o.get_mut() |= flags;
                }
                btree_map::Entry::Vacant(v) => {
                    v.insert(flags);
                }
            }
            let rev: Box<[u8]> = node.iter().rev().copied().collect();
            *self.reversed.entry(rev).or_default() |= flags;
            match node.iter().rposition(|&b| b == b'.') {
                Some(dot) => (end, flags) = (dot, BRANCH),
                None => return,
            }
        }
    }

    pub fn len(&self) -> usize {
        self.forward.len()
    }

    pub fn is_empty(&self) -> bool {
        self.forward.is_empty()
    }

    /// `NameDict::search` over these nodes.
    pub fn search(&self, pattern: &NamePattern, visit: impl FnMut(&[u8], u8) -> bool) {
        if pattern.reverse {
            search_sorted(&self.reversed, &pattern.backward, unreversing(visit));
        } else {
            search_sorted(&self.forward, &pattern.forward, visit);
        }
    }
}

/// The keys of `map` that `dfa` matches whole. A key on which the automaton dies after `i`
/// bytes rules out every key starting with those `i + 1` bytes: the walk continues after them.
fn search_sorted(map: &BTreeMap<Box<[u8]>, u8>, dfa: &CompiledDfa, mut visit: impl FnMut(&[u8], u8) -> bool) {
    let mut from: Vec<u8> = Vec::new();
    loop {
        let Some((key, &flags)) = map.range::<[u8], _>((Bound::Included(&from[..]), Bound::Unbounded)).next() else {
            return;
        };
        match dfa.run(key) {
            Ok(state) => {
                if dfa.matches_at_end(state) && !visit(key, flags) {
                    return;
                }
                // The next key: the smallest one greater than this.
                from.clear();
                from.extend_from_slice(key);
                from.push(0);
            }
            Err(i) => {
                // Past every key starting with key[..=i]: drop trailing 0xff bytes, add one.
                from.clear();
                from.extend_from_slice(&key[..=i]);
                while from.last() == Some(&0xff) {
                    from.pop();
                }
                match from.last_mut() {
                    Some(b) => *b += 1,
                    None => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 8] = [
        "a.b",
        "a.b-c.d",
        "a.b.x",
        "servers.dc1.host-1.cpu",
        "servers.dc1.host-1.mem",
        "servers.dc2.host-1.cpu",
        "up",
        "ünï.cödé",
    ];

    /// The nodes `search` visits for `re`, sorted.
    fn collect(re: &str, search: impl FnOnce(&NamePattern, &mut dyn FnMut(&[u8], u8) -> bool)) -> Vec<(String, u8)> {
        let p = NamePattern::new(re).unwrap();
        let mut out = Vec::new();
        search(&p, &mut |k, f| {
            out.push((String::from_utf8(k.to_vec()).unwrap(), f));
            true
        });
        out.sort();
        out
    }

    fn found(dict: &NameDict, re: &str) -> Vec<(String, u8)> {
        collect(re, |p, visit| dict.search(p, visit))
    }

    fn found_in_delta(delta: &NameDelta, re: &str) -> Vec<(String, u8)> {
        collect(re, |p, visit| delta.search(p, visit))
    }

    fn owned(v: &[(&str, u8)]) -> Vec<(String, u8)> {
        v.iter().map(|&(k, f)| (k.to_owned(), f)).collect()
    }

    #[test]
    fn nodes_carry_leaf_and_branch_flags() {
        let d = NameDict::build(NAMES.iter().copied());
        assert_eq!(d.get(b"a"), Some(BRANCH));
        assert_eq!(d.get(b"a.b"), Some(LEAF | BRANCH));
        assert_eq!(d.get(b"up"), Some(LEAF));
        assert_eq!(d.get(b"servers.dc1.host-1"), Some(BRANCH));
        assert_eq!(d.get(b"servers.dc"), None);
        assert_eq!(d.names(), NAMES.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        // 8 leaves; branches a, a.b (also a leaf), a.b-c, servers, servers.dc1, servers.dc2,
        // servers.dc1.host-1, servers.dc2.host-1, ünï.
        assert_eq!(d.len(), 8 + 8);
    }

    #[test]
    fn searches_both_ways_find_the_same_nodes() {
        let d = NameDict::build(NAMES.iter().copied());
        let one_level = r"servers\.[^.]*";
        assert!(!NamePattern::new(one_level).unwrap().walks_reversed());
        assert_eq!(found(&d, one_level), owned(&[("servers.dc1", BRANCH), ("servers.dc2", BRANCH)]));
        let leading_star = r"[^.]*\.[^.]*\.[^.]*\.cpu";
        assert!(NamePattern::new(leading_star).unwrap().walks_reversed());
        assert_eq!(
            found(&d, leading_star),
            owned(&[("servers.dc1.host-1.cpu", LEAF), ("servers.dc2.host-1.cpu", LEAF)])
        );
        assert_eq!(found(&d, r"[^.]*\.c.*"), owned(&[("ünï.cödé", LEAF)]));
        assert_eq!(found(&d, r"a\.b"), owned(&[("a.b", LEAF | BRANCH)]));
        assert_eq!(found(&d, "nope|x.*"), owned(&[]));
    }

    #[test]
    fn a_delta_is_searched_like_a_dictionary() {
        let base = NameDict::build(NAMES[..3].iter().copied());
        let mut delta = NameDelta::default();
        for n in &NAMES[3..] {
            delta.add(&base, None, n);
        }
        delta.add(&base, None, "a.b"); // already there: nothing added
        assert!(!delta.forward.contains_key(&b"a.b"[..]));
        assert_eq!(
            found_in_delta(&delta, r"[^.]*\.[^.]*\.[^.]*\.cpu"),
            owned(&[("servers.dc1.host-1.cpu", LEAF), ("servers.dc2.host-1.cpu", LEAF)])
        );
        assert_eq!(
            found_in_delta(&delta, r"servers\.dc1(\..*)?"),
            owned(&[
                ("servers.dc1", BRANCH),
                ("servers.dc1.host-1", BRANCH),
                ("servers.dc1.host-1.cpu", LEAF),
                ("servers.dc1.host-1.mem", LEAF)
            ])
        );
        // Known in a frozen delta (a rebuild's): not added again.
        let mut next = NameDelta::default();
        next.add(&base, Some(&delta), "servers.dc1.host-1.cpu");
        assert!(next.is_empty());
        next.add(&base, Some(&delta), "servers.dc1.host-1.disk");
        assert_eq!(next.len(), 1);
    }

    #[test]
    fn serialized_tries_round_trip_and_bad_bytes_are_refused() {
        let d = NameDict::build(NAMES.iter().copied());
        let (f, r) = d.as_bytes();
        let back = NameDict::from_bytes(Bytes::copy_from_slice(f), Bytes::copy_from_slice(r)).unwrap();
        assert_eq!(found(&back, ".*"), found(&d, ".*"));
        assert!(NameDict::from_bytes(Bytes::from_static(b"junk"), Bytes::copy_from_slice(r)).is_err());
        let other = NameDict::build(["x"]);
        assert!(NameDict::from_bytes(Bytes::copy_from_slice(f), Bytes::copy_from_slice(other.as_bytes().1)).is_err());
    }

    #[test]
    fn patterns_too_big_or_invalid_are_typed_errors() {
        assert!(matches!(NamePattern::new("a("), Err(PatternError::Invalid { .. })));
        assert!(matches!(NamePattern::new(r"\w{200}[^a]{100}"), Err(PatternError::TooComplex(_))));
    }

    proptest! {
        #[test]
        fn reversed_order_is_the_order_of_the_reversed_bytes(a in "[a-c.]{0,20}", b in "[a-c.]{0,20}") {
            let rev = |s: &str| s.bytes().rev().collect::<Vec<u8>>();
            prop_assert_eq!(cmp_reversed(a.as_bytes(), b.as_bytes()), rev(&a).cmp(&rev(&b)));
        }

        /// Either direction, dictionary or delta: exactly the nodes the `regex` crate matches.
        #[test]
        fn agrees_with_the_regex_crate(
            names in proptest::collection::vec("[ab.é]{0,6}", 0..40),
            re in proptest::collection::vec(
                proptest::sample::select(vec!["a", "b", r"\.", "é", "[^.]", ".*", "[ab]*", "(a|b.)", "(é|)"]),
                1..6,
            ).prop_map(|parts| parts.concat()),
            split in 0usize..40,
        ) {
            let split = split.min(names.len());
            let r = regex::Regex::new(&format!("^(?s:{re})$")).unwrap();
            let mut want: BTreeMap<String, u8> = BTreeMap::new();
            for n in &names {
                for_each_node(n.as_bytes(), |node, flags| {
                    let node = std::str::from_utf8(node).unwrap();
                    if r.is_match(node) {
                        *want.entry(node.to_owned()).or_default() |= flags;
                    }
                });
            }
            let dict = NameDict::build(names.iter().map(String::as_str));
            for reversed in [false, true] {
            let p = NamePattern::new(&re).unwrap().walking(reversed);
            let mut got: BTreeMap<String, u8> = BTreeMap::new();
            dict.search(&p, |k, f| { got.insert(String::from_utf8(k.to_vec()).unwrap(), f); true });
            prop_assert_eq!(&got, &want);
            // Half in a base dictionary, half in a delta: their union.
            let base = NameDict::build(names[..split].iter().map(String::as_str));
            let mut delta = NameDelta::default();
            for n in &names[split..] {
                delta.add(&base, None, n);
            }
            let mut got: BTreeMap<String, u8> = BTreeMap::new();
            base.search(&p, |k, f| { *got.entry(String::from_utf8(k.to_vec()).unwrap()).or_default() |= f; true });
            delta.search(&p, |k, f| { *got.entry(String::from_utf8(k.to_vec()).unwrap()).or_default() |= f; true });
            prop_assert_eq!(&got, &want);
            for n in &names {
                prop_assert_eq!(p.is_match(n.as_bytes()), r.is_match(n));
            }
            }
        }
    }
}
