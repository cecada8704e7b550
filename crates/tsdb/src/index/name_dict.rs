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
//! direction is learned per pattern from the work of its walks (`NamePattern::direction`).
//!
//! Names the head has gained since its dictionaries were built are kept unsorted in a
//! `NameDelta` and searched by running the automaton over each; sorting them both ways
//! (`sorted_order`, a radix sort of slices of one buffer) is what turns them into a dictionary,
//! or into a `NameList` (`list`): the same nodes in sorted arrays, what the head folds new names
//! into between two builds of its dictionary, as those merge far cheaper than tries build.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use fst::Streamer;
use parking_lot::Mutex;
use regex_automata::dfa::{dense, Automaton as _};
use regex_automata::nfa::thompson;
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

mod list;
pub use list::NameList;

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
    /// The dictionary of `names` (any order, duplicates allowed).
    pub fn build<'a>(names: impl IntoIterator<Item = &'a str>) -> NameDict {
        let mut delta = NameDelta::default();
        for name in names {
            delta.add(name);
        }
        NameDict::union(&[], &delta)
    }

    /// The dictionary of the nodes of `dicts` and of `delta`'s names (flags merged). The
    /// dictionaries' tries are read in order and merged with the delta's nodes, sorted by
    /// radix (`sorted_order`) both ways round: no comparison sort of the whole, and the
    /// nodes are slices of the delta's names (read backwards for the reversed trie), not a key
    /// each. The forward trie is built on a second thread while the reversed nodes are sorted.
    pub fn union(dicts: &[&NameDict], delta: &NameDelta) -> NameDict {
        NameDict::union_lists(dicts, &[], delta)
    }

    /// `union` with the nodes of `lists` too.
    pub fn union_lists(dicts: &[&NameDict], lists: &[&NameList], delta: &NameDelta) -> NameDict {
        let forward_nodes = delta.nodes(false);
        let (forward, reversed) = crate::workers::scope(|scope| {
            let forward = scope.spawn(|| union_maps(dicts.iter().map(|d| &d.forward), lists, &forward_nodes, false));
            let reversed_nodes = delta.nodes(true);
            let reversed = union_maps(dicts.iter().map(|d| &d.reversed), lists, &reversed_nodes, true);
            (forward.join().expect("the forward trie's build does not panic"), reversed)
        });
        debug_assert_eq!(forward.len(), reversed.len(), "both tries hold every node");
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
    pub fn search(&self, pattern: &NamePattern, mut visit: impl FnMut(&[u8], u8) -> bool) {
        let reversed = pattern.direction();
        let work = if reversed {
            // Nodes found backwards are sorted afterwards: a few steps each.
            let mut found = 0u64;
            let work = walk(
                self.reversed.as_fst(),
                &pattern.backward,
                unreversing(|k, f| {
                    found += 1;
                    visit(k, f)
                }),
            );
            work + REVERSED_SORT_WORK * found
        } else {
            walk(self.forward.as_fst(), &pattern.forward, visit)
        };
        pattern.walked(reversed, work, self.len());
    }
}

/// `visit` for keys found in a reversed trie: each key is turned back the right way first.
fn unreversing(mut visit: impl FnMut(&[u8], u8) -> bool) -> impl FnMut(&[u8], u8) -> bool {
    let mut buf = Vec::new();
    move |key, flags| {
        buf.clear();
        extend_reversed(&mut buf, key);
        visit(&buf, flags)
    }
}

/// Appends `bytes` last byte first, eight at a time (a byte swap of each word from the end):
/// a reversed walk turns every key it finds around, and a byte-at-a-time loop was a tenth of
/// a leading-star find.
fn extend_reversed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len());
    let mut words = bytes.rchunks_exact(8);
    for word in &mut words {
        let w = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        out.extend_from_slice(&w.swap_bytes().to_le_bytes());
    }
    out.extend(words.remainder().iter().rev());
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
    /// The node starts a path component and its matches are being recorded for `Memo`: the
    /// number of matches recorded when the walk entered it.
    recording_from: Option<usize>,
}

/// Matches found under component starts, kept so that a subtree met again is answered by
/// copying instead of walking it again. A minimized trie shares equal subtrees: every host
/// under `servers.dc1.*` with the same metrics below it points at one node, and so does every
/// host's `.dc1.servers` tail in the reversed trie; `*.*.*.net.eth0.rx_bytes` walks that tail
/// once, not once per host. Only nodes reached by a `.` are looked up (a lookup costs about
/// what a transition does, and component boundaries are where subtrees repeat).
#[derive(Default)]
struct Memo {
    /// The keys of the matches recorded, back to back.
    keys: Vec<u8>,
    /// Per match recorded: where its key ends in `keys`, and its output.
    found: Vec<(usize, u64)>,
    /// Per (node, automaton state) walked whole: the matches recorded under it, and the key
    /// length and output at the node.
    subtrees: foldhash::HashMap<(fst::raw::CompiledAddr, StateID), Subtree>,
    /// Frames on the walk's stack that are recording.
    recording: usize,
}

#[derive(Clone, Copy)]
struct Subtree {
    found: (usize, usize),
    key_len: usize,
    out: u64,
}

impl Memo {
    /// Empty, keeping the buffers' capacity.
    fn clear(&mut self) {
        self.keys.clear();
        self.found.clear();
        self.subtrees.clear();
        self.recording = 0;
    }

    /// Records a match if a frame is recording.
    fn record(&mut self, key: &[u8], out: u64) {
        if self.recording > 0 {
            self.keys.extend_from_slice(key);
            self.found.push((self.keys.len(), out));
        }
    }

    /// Visits again, under `key` with output `out`, the matches of a subtree walked before;
    /// false when `visit` stops the walk.
    fn replay(&mut self, sub: Subtree, key: &[u8], out: u64, visit: &mut impl FnMut(&[u8], u8) -> bool) -> bool {
        for i in sub.found.0..sub.found.1 {
            let begin = if i == 0 { 0 } else { self.found[i - 1].0 };
            let (end, found_out) = self.found[i];
            let start = self.keys.len();
            self.keys.extend_from_slice(key);
            self.keys.extend_from_within(begin + sub.key_len..end);
            let value = found_out.wrapping_sub(sub.out).wrapping_add(out);
            if !visit(&self.keys[start..], value as u8) {
                return false;
            }
            if self.recording > 0 {
                self.found.push((self.keys.len(), value));
            } else {
                self.keys.truncate(start);
            }
        }
        true
    }
}

/// Depth-first walk of `trie` together with `dfa`: a transition is followed only if the
/// automaton stays alive on its byte. Where the automaton can go on with only a few bytes (a
/// literal run, a short alternation) those are looked up in the node; elsewhere every
/// transition of the node is tried. Subtrees under a component start are walked once per
/// automaton state (`Memo`). Visits keys in order.
/// Returns the walk's work: transitions tried plus matches replayed.
fn walk(trie: &fst::raw::Fst<Bytes>, dfa: &CompiledDfa, mut visit: impl FnMut(&[u8], u8) -> bool) -> u64 {
    let start = start_state(&dfa.dfa);
    let mut key: Vec<u8> = Vec::new();
    if trie.root().is_final() && dfa.matches_at_end(start) && !visit(&key, trie.root().final_output().value() as u8) {
        return 1;
    }
    let mut memo = KEPT_MEMO.with(RefCell::take);
    let work = walk_with(trie, dfa, &mut memo, &mut key, start, visit);
    memo.clear();
    if memo.keys.capacity() <= MEMO_KEPT_BYTES_MAX && memo.subtrees.capacity() <= MEMO_KEPT_SUBTREES_MAX {
        KEPT_MEMO.with(|kept| kept.replace(memo));
    }
    work
}

/// A memo's buffers are kept for the thread's next walk up to these sizes: a find of thousands
/// of nodes then writes into pages it already has instead of faulting in fresh ones.
const MEMO_KEPT_BYTES_MAX: usize = 4 << 20;
const MEMO_KEPT_SUBTREES_MAX: usize = 1 << 16;

/// Subtrees one walk remembers at most (about 48 bytes each). A walk through many distinct
/// subtrees that match little (`*.*.*.nothing` over ten million irregular paths) would
/// otherwise hold an entry per trie node it entered at a component start; past this it walks
/// new subtrees without recording them (replays of those recorded go on). Tests run with a
/// small cap, so that the larger of them walk both ways.
const MEMO_SUBTREES_MAX: usize = if cfg!(test) { 4 } else { 1 << 18 };

thread_local! {
    static KEPT_MEMO: RefCell<Memo> = RefCell::default();
}

/// `walk` with the memo's buffers lent by the thread.
fn walk_with(
    trie: &fst::raw::Fst<Bytes>,
    dfa: &CompiledDfa,
    memo: &mut Memo,
    key: &mut Vec<u8>,
    start: StateID,
    mut visit: impl FnMut(&[u8], u8) -> bool,
) -> u64 {
    let mut work = 0u64;
    let root = trie.root();
    let live = dfa.live_bytes(start);
    let mut stack = vec![Frame {
        node: root,
        state: start,
        live,
        out: fst::raw::Output::zero(),
        key_len: 0,
        next: 0,
        recording_from: None,
    }];
    while let Some(top) = stack.last_mut() {
        work += 1;
        let transition = match top.live {
            Some(bytes) => match bytes.get(top.next) {
                Some(&b) => {
                    top.next += 1;
                    match top.node.find_input(b) {
                        Some(i) => Some(top.node.transition(i)),
                        None => continue,
                    }
                }
                None => None,
            },
            None if top.next < top.node.len() => {
                top.next += 1;
                Some(top.node.transition(top.next - 1))
            }
            None => None,
        };
        let Some(transition) = transition else {
            let done = stack.pop().expect("the loop runs on a non-empty stack");
            if let Some(first) = done.recording_from {
                memo.recording -= 1;
                let sub = Subtree { found: (first, memo.found.len()), key_len: done.key_len, out: done.out.value() };
                memo.subtrees.insert((done.node.addr(), done.state), sub);
            }
            continue;
        };
        let state = dfa.dfa.next_state(top.state, transition.inp);
        if dfa.dfa.is_dead_state(state) {
            continue;
        }
        let out = top.out.cat(transition.out);
        key.truncate(top.key_len);
        key.push(transition.inp);
        let node = trie.node(transition.addr);
        let mut recording_from = None;
        if transition.inp == b'.' {
            if let Some(&sub) = memo.subtrees.get(&(node.addr(), state)) {
                work += (sub.found.1 - sub.found.0) as u64;
                if !memo.replay(sub, key, out.value(), &mut visit) {
                    return work;
                }
                continue;
            }
            if memo.subtrees.len() < MEMO_SUBTREES_MAX {
                recording_from = Some(memo.found.len());
                memo.recording += 1;
            }
        }
        if node.is_final() && dfa.matches_at_end(state) {
            let value = out.cat(node.final_output()).value();
            if !visit(key, value as u8) {
                return work;
            }
            memo.record(key, value);
        }
        stack.push(Frame {
            node,
            state,
            live: dfa.live_bytes(state),
            out,
            key_len: key.len(),
            next: 0,
            recording_from,
        });
    }
    work
}

/// Nodes with their flags gathered from several searches (in any order, repeated), kept back
/// to back in one buffer: a find of ten thousand nodes allocates a few times instead of once
/// per node, and sorting compares slices of one buffer instead of chasing a pointer per key.
#[derive(Debug, Default, Clone)]
pub struct NodeSet {
    bytes: Vec<u8>,
    nodes: Vec<NodeEntry>,
}

/// A node: a slice of a `NodeSet`'s (or `SortedNodes`') buffer, 16 bytes.
#[derive(Debug, Clone, Copy)]
struct NodeEntry {
    start: usize,
    len: u32,
    flags: u8,
}

impl NodeEntry {
    /// `bytes[start..end]`: a node is a metric name or part of one, far shorter than 4 GiB (a
    /// series' labels fit a WAL record: `wal::segment::RECORD_BYTES_MAX`).
    fn new(start: usize, end: usize, flags: u8) -> NodeEntry {
        let len = u32::try_from(end - start).expect("a node is shorter than 4 GiB");
        NodeEntry { start, len, flags }
    }

    fn end(self) -> usize {
        self.start + self.len as usize
    }

    fn key(self, bytes: &[u8]) -> &[u8] {
        &bytes[self.start..self.end()]
    }
}

impl NodeSet {
    /// Empty, with room for `nodes` nodes of `bytes` bytes in all.
    pub fn with_capacity(nodes: usize, bytes: usize) -> NodeSet {
        NodeSet { bytes: Vec::with_capacity(bytes), nodes: Vec::with_capacity(nodes) }
    }

    /// Bytes of the nodes' text held (repeats included until `merge_repeats` packs them).
    pub fn text_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn push(&mut self, node: &[u8], flags: u8) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(node);
        self.nodes.push(NodeEntry::new(start, self.bytes.len(), flags));
    }

    /// Entries held, repeats included until `merge_repeats`.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    fn key(&self, e: &NodeEntry) -> &[u8] {
        e.key(&self.bytes)
    }

    /// The `i`th node held.
    pub fn node(&self, i: usize) -> &[u8] {
        self.key(&self.nodes[i])
    }

    /// Makes the `i`th entry `node` with `flags`. The old node's bytes stay in the buffer
    /// until a `merge_repeats` packs it.
    pub fn replace(&mut self, i: usize, node: &[u8], flags: u8) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(node);
        self.nodes[i] = NodeEntry::new(start, self.bytes.len(), flags);
    }

    /// Adds `flags` to the `i`th entry's (the same node met again).
    pub fn add_flags(&mut self, i: usize, flags: u8) {
        self.nodes[i].flags |= flags;
    }

    /// Sorts the nodes and keeps one entry per node with its flags merged. The bytes of dropped
    /// repeats stay in the buffer until they outweigh the rest: then it is rewritten.
    pub fn merge_repeats(&mut self) {
        self.nodes = merged_in_order(&self.bytes, &mut self.nodes, false, &mut SortBuffers::default());
        let live: usize = self.nodes.iter().map(|e| e.len as usize).sum();
        if self.bytes.len() > 2 * live {
            let mut packed = Vec::with_capacity(live);
            for e in &mut self.nodes {
                let start = packed.len();
                packed.extend_from_slice(e.key(&self.bytes));
                e.start = start;
            }
            self.bytes = packed;
        }
    }

    /// The nodes in the order held (sorted after `merge_repeats`).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[u8], u8)> {
        self.nodes.iter().map(|e| (self.key(e), e.flags))
    }

    /// `iter` as text. Names are UTF-8 and nodes end before a `.`, so the buffer is checked
    /// once as a whole instead of node by node; a node that is not UTF-8 after all (a damaged
    /// block) comes out with replacement characters.
    pub fn iter_text(&self) -> impl ExactSizeIterator<Item = (std::borrow::Cow<'_, str>, u8)> {
        let whole = std::str::from_utf8(&self.bytes).ok();
        self.nodes.iter().map(move |e| {
            let text = match whole.and_then(|w| w.get(e.start..e.end())) {
                Some(text) => std::borrow::Cow::Borrowed(text),
                None => String::from_utf8_lossy(self.key(e)),
            };
            (text, e.flags)
        })
    }
}

/// The working buffers of `sorted_order` (and the node list `NameDelta::nodes_sorted_in`
/// fills), kept from one run of `NAMES_PER_RUN` names to the next and from one order to the
/// other: a fold of a burst of a million new carbon paths sorts eight runs each way, and each
/// run's buffers (about 8 MiB) freed and allocated again came back from the allocator as
/// fresh pages (it returns freed pages to the OS after 10 ms): the kernel's zeroing of them
/// was over a third of the fold's CPU time in `perf`.
#[derive(Debug, Default)]
struct SortBuffers {
    order: Vec<u32>,
    /// `repeats[p]`: the key at `order[p]` is the one at `order[p - 1]` again.
    repeats: Vec<bool>,
    keys: Vec<u128>,
    scratch: Vec<u128>,
    runs: Vec<(usize, usize, usize)>,
}

/// `nodes` (keys in `bytes`, read last byte first if `reversed`) sorted, one entry per key
/// with the flags of its repeats merged; `nodes` is left empty (its buffer kept, to be filled
/// again) or, if it was already in order, taken.
fn merged_in_order(
    bytes: &[u8],
    nodes: &mut Vec<NodeEntry>,
    reversed: bool,
    buffers: &mut SortBuffers,
) -> Vec<NodeEntry> {
    if nodes.len() < 2 || (!reversed && nodes.windows(2).all(|w| w[0].key(bytes) < w[1].key(bytes))) {
        return std::mem::take(nodes);
    }
    /// Appends `e`, or merges its flags into the last entry if `repeats` says it is that key.
    fn keep(merged: &mut Vec<NodeEntry>, e: NodeEntry, repeats: impl FnOnce(&NodeEntry) -> bool) {
        match merged.last_mut() {
            Some(last) if repeats(last) => last.flags |= e.flags,
            _ => merged.push(e),
        }
    }
    let mut merged: Vec<NodeEntry> = Vec::with_capacity(nodes.len());
    if u32::try_from(nodes.len()).is_ok() {
        sorted_order(bytes, nodes, reversed, buffers);
        // The sort tells repeats apart, so keys are not compared again here: that was a
        // memcmp of two nodes' whole (long, shared) prefixes per entry.
        for (&i, &repeat) in buffers.order.iter().zip(&buffers.repeats) {
            let e = nodes[i as usize];
            keep(&mut merged, e, |last| {
                debug_assert!(!repeat || last.key(bytes) == e.key(bytes), "a repeat is its first's key");
                repeat
            });
        }
    } else {
        // More entries than the radix sort indexes (past 64 GiB of them): compared in place.
        nodes.sort_unstable_by(|a, b| match reversed {
            false => a.key(bytes).cmp(b.key(bytes)),
            true => a.key(bytes).iter().rev().cmp(b.key(bytes).iter().rev()),
        });
        for &e in nodes.iter() {
            keep(&mut merged, e, |last| last.key(bytes) == e.key(bytes));
        }
    }
    nodes.clear();
    merged
}

/// The entries' indexes in key order (keys read last byte first if `reversed`), in
/// `buffers.order`, and which of them repeat the key before (`buffers.repeats`); fewer than
/// 2^32 entries. Keys are sorted eight bytes at a time: by the first eight as one integer,
/// then each run of keys that agree on them by the next eight, and so on. Sorting integers
/// beats comparing byte strings, and paths that share long prefixes (`servers.dc1.host-…`)
/// are told apart within a word or two.
fn sorted_order(bytes: &[u8], nodes: &[NodeEntry], reversed: bool, buffers: &mut SortBuffers) {
    let n = nodes.len();
    debug_assert!(u32::try_from(n).is_ok(), "indexes fit in 32 bits");
    // A word's key: its eight bytes (zero-padded), then how many of them the node has
    // (so `a` sorts before `a\0`), then the entry's index; equal words with 8 bytes
    // leave the run undecided, equal words with fewer are the same key.
    let word_key = |i: u32, depth: usize| -> u128 {
        let e = &nodes[i as usize];
        let left = (e.len as usize).saturating_sub(depth);
        let word = key_word(bytes, e, depth, reversed);
        (u128::from(word) << 40) | ((left.min(8) as u128) << 32) | u128::from(i)
    };
    let SortBuffers { order, repeats, keys, scratch, runs } = buffers;
    order.clear();
    order.extend(0..n as u32);
    repeats.clear();
    repeats.resize(n, false);
    // Runs still to sort: (start, end, depth), an explicit stack (paths can be long).
    runs.clear();
    runs.push((0, n, 0));
    while let Some((start, end, depth)) = runs.pop() {
        keys.clear();
        keys.extend(order[start..end].iter().map(|&i| word_key(i, depth)));
        // A word every key of the run shares (a common prefix) needs no sort.
        if keys.iter().all(|k| k >> 32 == keys[0] >> 32) {
            match keys[0] >> 32 & 0xff == 8 {
                true => runs.push((start, end, depth + 8)),
                false => repeats[start + 1..end].fill(true),
            }
            continue;
        }
        sort_words(keys, scratch);
        for (slot, k) in order[start..end].iter_mut().zip(keys.iter()) {
            *slot = *k as u32;
        }
        let mut i = 0;
        while i < keys.len() {
            let word = keys[i] >> 32;
            let same = keys[i..].iter().take_while(|k| *k >> 32 == word).count();
            if same > 1 {
                match word & 0xff == 8 {
                    true => runs.push((start + i, start + i + same, depth + 8)),
                    false => repeats[start + i + 1..start + i + same].fill(true),
                }
            }
            i += same;
        }
    }
}

/// The eight bytes of `e`'s key from `depth` bytes in (from its end if `reversed`), the first
/// read as the most significant; past the key's end, zeros. Read as one unaligned word of
/// `bytes` and masked where the key has fewer than eight bytes left and the buffer has eight
/// around them (all but its first and last few keys): copying those bytes one by one was a
/// call to `memcpy` per key, a tenth of the sort's `perf` samples (a fold of 1M paths).
fn key_word(bytes: &[u8], e: &NodeEntry, depth: usize, reversed: bool) -> u64 {
    let left = (e.len as usize).saturating_sub(depth);
    // The high `left` bytes of a word (`left` < 8).
    let high = |left: usize| u64::MAX.checked_shl(8 * (8 - left) as u32).unwrap_or(0);
    let word = |at: usize| -> [u8; 8] { bytes[at..at + 8].try_into().expect("eight bytes") };
    match reversed {
        // The eight bytes ending `depth` bytes before the key's end, last one first: in
        // little-endian order the last byte is the most significant.
        true => {
            let end = e.start + left;
            match (left >= 8, end >= 8) {
                (true, _) => u64::from_le_bytes(word(end - 8)),
                (false, true) => u64::from_le_bytes(word(end - 8)) & high(left),
                (false, false) => {
                    let mut w = [0u8; 8];
                    w.iter_mut().zip(bytes[e.start..end].iter().rev()).for_each(|(w, b)| *w = *b);
                    u64::from_be_bytes(w)
                }
            }
        }
        false => {
            let at = e.start + depth;
            match (left >= 8, at + 8 <= bytes.len()) {
                (true, _) => u64::from_be_bytes(word(at)),
                (false, true) => u64::from_be_bytes(word(at)) & high(left),
                (false, false) => {
                    let mut w = [0u8; 8];
                    w.iter_mut().zip(&bytes[at.min(e.end())..e.end()]).for_each(|(w, b)| *w = *b);
                    u64::from_be_bytes(w)
                }
            }
        }
    }
}

/// Runs shorter than this are sorted by comparisons; longer ones by radix.
const RADIX_SORT_MIN: usize = 128;

/// Sorts `sorted_order`'s keys by their word and length (bits 32 to 104; the entry
/// index below is left in any order). Long runs by a least-significant-digit radix sort over
/// those nine bytes, skipping every byte all keys share: paths under one prefix differ in a
/// few bytes of each word (`dc2.host`, `-00042.n`), so most of the nine passes are skipped and
/// the rest cost two reads and a write per key, where comparison sorts cost a dozen
/// comparisons per key.
fn sort_words(keys: &mut Vec<u128>, scratch: &mut Vec<u128>) {
    if keys.len() < RADIX_SORT_MIN {
        keys.sort_unstable_by_key(|k| k >> 32);
        return;
    }
    // A digit's shift is a whole number of bytes from bit 32, so each digit lies within one
    // half of the key: shifting that half is one instruction where a shift of the u128 by a
    // variable amount is four.
    let digit = |k: u128, d: usize| {
        let shift = 32 + 8 * d;
        let half = if shift >= 64 { (k >> 64) as u64 } else { k as u64 };
        (half >> (shift % 64)) as u8 as usize
    };
    // The bits in which some key differs from the first: digits without any are skipped.
    let differing = keys.iter().fold(0u128, |acc, &k| acc | (k ^ keys[0])) >> 32;
    scratch.clear();
    scratch.resize(keys.len(), 0);
    let (mut from, mut to) = (&mut keys[..], &mut scratch[..]);
    let mut in_scratch = false;
    for d in (0..9).filter(|d| (differing >> (8 * d)) as u8 != 0) {
        // Counts, then in place where each digit's keys go (u32: fewer than 2^32 keys, and a
        // quarter of the bytes to clear per pass, which short runs notice).
        let mut next = [0u32; 256];
        for &k in from.iter() {
            next[digit(k, d)] += 1;
        }
        let mut at = 0;
        for slot in next.iter_mut() {
            (*slot, at) = (at, at + *slot);
        }
        for &k in from.iter() {
            let b = digit(k, d);
            to[next[b] as usize] = k;
            next[b] += 1;
        }
        std::mem::swap(&mut from, &mut to);
        in_scratch = !in_scratch;
    }
    if in_scratch {
        std::mem::swap(keys, scratch);
    }
}

/// An fst map of every key of `maps`, `lists` and `runs` (all sorted the same way:
/// `reversed` or not) with their flags merged.
fn union_maps<'a>(
    maps: impl Iterator<Item = &'a fst::Map<Bytes>>,
    lists: &[&NameList],
    runs: &[SortedNodes],
    reversed: bool,
) -> fst::Map<Bytes> {
    let mut op = fst::map::OpBuilder::new();
    for m in maps {
        op.push(m.stream());
    }
    for nodes in runs {
        debug_assert_eq!(nodes.reversed, reversed);
        let keys = nodes.nodes.iter().map(|e| (e.key(nodes.bytes), e.flags));
        op.push(NodeStream { nodes: keys, reversed, key: Vec::new() });
    }
    for list in lists {
        op.push(NodeStream { nodes: list.nodes(reversed), reversed, key: Vec::new() });
    }
    let mut union = op.union();
    let mut builder = fst::MapBuilder::memory();
    while let Some((key, values)) = union.next() {
        let flags = values.iter().fold(0, |f, v| f | v.value);
        builder.insert(key, flags).expect("a union streams its keys sorted and once each");
    }
    let bytes = builder.into_inner().expect("an in-memory fst build cannot fail on I/O");
    fst::Map::new(Bytes::from(bytes)).expect("a just-built fst is valid")
}

/// Sorted nodes (as written, with their flags) as an fst stream, reversed keys turned around,
/// for `union_maps`. Each key is copied into `key`: a stream hands out keys that live as long
/// as its borrow, which the nodes' own slices cannot be made to (`OpBuilder::push`).
struct NodeStream<I> {
    nodes: I,
    reversed: bool,
    key: Vec<u8>,
}

impl<'a, 's, I: Iterator<Item = (&'s [u8], u8)>> fst::Streamer<'a> for NodeStream<I> {
    type Item = (&'a [u8], u64);

    fn next(&'a mut self) -> Option<(&'a [u8], u64)> {
        let (key, flags) = self.nodes.next()?;
        self.key.clear();
        match self.reversed {
            false => self.key.extend_from_slice(key),
            true => extend_reversed(&mut self.key, key),
        }
        Some((&self.key, u64::from(flags)))
    }
}

/// Why a pattern could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("invalid pattern {pattern:?}: {reason}")]
    Invalid { pattern: String, reason: String },
    #[error("pattern {0:?} compiles to an automaton over the size limit")]
    TooComplex(String),
}

/// The work a reversed walk is charged per node found, for sorting it afterwards.
const REVERSED_SORT_WORK: u64 = 4;
/// Once both directions of a pattern have been walked, every this many walks take the
/// direction not preferred, so that the choice follows the data.
const PROBE_EVERY: u64 = 32;

/// A regex (whole-string match, `.` matching any character) compiled to a DFA in both
/// directions, and which direction to walk.
#[derive(Debug)]
pub struct NamePattern {
    forward: CompiledDfa,
    backward: CompiledDfa,
    /// The first guess: walk the reversed trie when the pattern's literal end is longer than
    /// its literal start (`*.*.*.net.eth0.rx_bytes`).
    reverse: bool,
    /// Set by tests: always walk this way.
    pinned: Option<bool>,
    /// The work of the last walk each way (forward, reversed) per node of the dictionary
    /// walked, as f64 bits (0: not walked yet), and the walks so far. The guess above is
    /// often wrong: on hosts that all have the same metrics a leading-star glob walks the
    /// shared subtree once forwards (the walk replays it per host) and costs a third of the
    /// reversed walk, which finds the nodes out of order; on hosts that differ the reversed
    /// walk costs a fifth. So the first two walks try both, and later walks take the cheaper,
    /// trying the other again now and then (`PROBE_EVERY`).
    work_per_node: [AtomicU64; 2],
    walks: AtomicU64,
    /// Nodes and bytes the last search with this pattern found (`found_last`): compiled
    /// patterns are cached and dashboards repeat their finds, so the next search sizes its
    /// buffers once instead of growing them (a tenth of a 10,000-node find).
    last_found: (AtomicUsize, AtomicUsize),
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
            pinned: None,
            work_per_node: Default::default(),
            walks: AtomicU64::new(0),
            last_found: Default::default(),
        })
    }

    /// Which way the next walk goes: `true` for the reversed trie.
    fn direction(&self) -> bool {
        if let Some(pinned) = self.pinned {
            return pinned;
        }
        let n = self.walks.fetch_add(1, Ordering::Relaxed);
        let [forward, reversed] = self.known_work();
        match (forward, reversed) {
            (None, None) => self.reverse,
            // Try the other way once.
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(f), Some(r)) => (r < f) != (n % PROBE_EVERY == PROBE_EVERY - 1),
        }
    }

    /// The last walk's work per node each way, if walked.
    fn known_work(&self) -> [Option<f64>; 2] {
        self.work_per_node.each_ref().map(|w| Some(f64::from_bits(w.load(Ordering::Relaxed))).filter(|w| *w > 0.0))
    }

    /// Records a walk's work over a dictionary of `nodes` nodes.
    fn walked(&self, reversed: bool, work: u64, nodes: usize) {
        let per_node = (work.max(1) as f64 / nodes.max(1) as f64).max(f64::MIN_POSITIVE);
        self.work_per_node[reversed as usize].store(per_node.to_bits(), Ordering::Relaxed);
    }

    /// What the last search with this pattern found: (nodes, bytes of their text).
    pub fn found_last(&self) -> (usize, usize) {
        (self.last_found.0.load(Ordering::Relaxed), self.last_found.1.load(Ordering::Relaxed))
    }

    /// Records what a search found, for `found_last`.
    pub fn record_found(&self, nodes: usize, bytes: usize) {
        self.last_found.0.store(nodes, Ordering::Relaxed);
        self.last_found.1.store(bytes, Ordering::Relaxed);
    }

    /// Whether searches walk the reversed trie: the cheaper way of the two last walked, or
    /// before both were, the guess from the pattern's literal ends.
    pub fn walks_reversed(&self) -> bool {
        match (self.pinned, self.known_work()) {
            (Some(pinned), _) => pinned,
            (None, [Some(f), Some(r)]) => r < f,
            (None, _) => self.reverse,
        }
    }

    /// The same pattern always walked the given way (tests check both ways agree).
    #[cfg(test)]
    fn walking(mut self, reversed: bool) -> Self {
        self.pinned = Some(reversed);
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

/// Names gained since a dictionary was built, in the order they came, back to back. Taking a
/// name is a copy into one buffer: keeping the new nodes sorted both ways (two ordered maps,
/// an insert per new node in each) was two fifths of series creation during a burst of new
/// paths, on the carbon connections' threads. They are sorted once, in the background, when
/// folded into a list or a dictionary (`NameList::from_delta`, `NameDict::union`); until then
/// a search runs the automaton over each name, resuming from the bytes it shares with the
/// previous one (a sender's paths come grouped by host), which the bounded size of a delta
/// (`head::names`) keeps cheap.
#[derive(Debug, Default, Clone)]
pub struct NameDelta {
    bytes: Vec<u8>,
    /// Where each name ends in `bytes` (it starts where the previous one ends).
    ends: Vec<usize>,
}

impl NameDelta {
    /// Takes `name` (a name taken before, or one a dictionary has, is taken again: a search
    /// may visit its nodes twice, and a fold merges them).
    pub fn add(&mut self, name: &str) {
        self.bytes.extend_from_slice(name.as_bytes());
        self.ends.push(self.bytes.len());
    }

    /// The name taken last.
    pub fn last(&self) -> Option<&[u8]> {
        let end = *self.ends.last()?;
        let start = self.ends.len().checked_sub(2).map_or(0, |i| self.ends[i]);
        Some(&self.bytes[start..end])
    }

    /// Names taken.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * std::mem::size_of::<usize>()
    }

    /// The names, as taken.
    fn names(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(start, &end)| &self.bytes[start..end])
    }

    /// Calls `visit(node, flags)` for the nodes of the names that `pattern` matches, in the
    /// order the names came; a node several names share is visited once per run of names
    /// sharing it, a node both a leaf and a branch once as each. `visit` returns false to stop.
    pub fn search(&self, pattern: &NamePattern, mut visit: impl FnMut(&[u8], u8) -> bool) {
        let dfa = &pattern.forward;
        let mut prev: &[u8] = &[];
        // The automaton's state after each of the previous name's first bytes (`states[i]`
        // after `i` bytes; as many as it lived through).
        let mut states: Vec<StateID> = vec![start_state(&dfa.dfa)];
        for name in self.names() {
            let shared = common_prefix_len(name, prev).min(states.len() - 1);
            states.truncate(shared + 1);
            prev = name;
            let mut alive = true;
            // Branches ending before `shared` were the previous name's too: visited then.
            for (i, &b) in name.iter().enumerate().skip(shared) {
                if b == b'.' && dfa.matches_at_end(states[i]) && !visit(&name[..i], BRANCH) {
                    return;
                }
                let next = dfa.dfa.next_state(states[i], b);
                if dfa.dfa.is_dead_state(next) {
                    alive = false;
                    break;
                }
                states.push(next);
            }
            if alive && dfa.matches_at_end(states[name.len()]) && !visit(name, LEAF) {
                return;
            }
        }
    }

    /// Every node of the names with its flags, in sorted runs (by bytes, or by bytes last
    /// first if `reversed`), each node once per run, each run from `NAMES_PER_RUN` names: the
    /// sort's scratch space is bounded by a run's, not the delta's (building from a million
    /// names peaked at +147 MiB sorted whole, +93 MiB in runs), and the runs are merged by the
    /// union that reads
    /// them. A node is a slice of a name (a branch is its start), so the entries point into
    /// the names' buffer and no key is copied.
    fn nodes(&self, reversed: bool) -> Vec<SortedNodes<'_>> {
        self.nodes_sorted_in(reversed, &mut SortBuffers::default())
    }

    /// `nodes`, sorted in `buffers` (kept for a caller that sorts again: both ways round).
    fn nodes_sorted_in(&self, reversed: bool, buffers: &mut SortBuffers) -> Vec<SortedNodes<'_>> {
        let mut runs = Vec::with_capacity(self.len().div_ceil(NAMES_PER_RUN));
        let mut nodes = Vec::new();
        let (mut start, mut prev): (usize, &[u8]) = (0, &[]);
        for (k, (name, &end)) in self.names().zip(&self.ends).enumerate() {
            if k % NAMES_PER_RUN == 0 {
                if k > 0 {
                    runs.push(SortedNodes::of(&self.bytes, &mut nodes, reversed, buffers));
                }
                nodes.reserve(NAMES_PER_RUN.min(self.len() - k) * 5 / 4);
            }
            // A branch the previous name had (the same bytes up to its dot) is not repeated.
            let shared = common_prefix_len(name, prev);
            for (i, _) in name.iter().enumerate().skip(shared).filter(|(_, &b)| b == b'.') {
                nodes.push(NodeEntry::new(start, start + i, BRANCH));
            }
            nodes.push(NodeEntry::new(start, end, LEAF));
            (start, prev) = (end, name);
        }
        if !nodes.is_empty() {
            runs.push(SortedNodes::of(&self.bytes, &mut nodes, reversed, buffers));
        }
        runs
    }
}

/// Names whose nodes `NameDelta::nodes` sorts together (tests use small runs, so that their
/// deltas are merged from several).
const NAMES_PER_RUN: usize = if cfg!(test) { 7 } else { 1 << 17 };

/// Nodes sorted and unique, their keys slices of one buffer (`NameDelta::nodes`), read last
/// byte first if `reversed`.
struct SortedNodes<'a> {
    bytes: &'a [u8],
    nodes: Vec<NodeEntry>,
    reversed: bool,
}

impl SortedNodes<'_> {
    /// `nodes` sorted (the buffer left empty, to be filled again; see `merged_in_order`).
    fn of<'a>(
        bytes: &'a [u8],
        nodes: &mut Vec<NodeEntry>,
        reversed: bool,
        buffers: &mut SortBuffers,
    ) -> SortedNodes<'a> {
        SortedNodes { bytes, nodes: merged_in_order(bytes, nodes, reversed, buffers), reversed }
    }
}

/// How many bytes `a` and `b` start with in common.
fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    let words = a.chunks_exact(8).zip(b.chunks_exact(8)).take_while(|(x, y)| x == y).count();
    let from = words * 8;
    from + a[from..].iter().zip(&b[from..]).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

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
        let mut delta = NameDelta::default();
        for n in &NAMES[3..] {
            delta.add(n);
        }
        assert_eq!(delta.len(), 5);
        assert_eq!(
            found_in_delta(&delta, r"[^.]*\.[^.]*\.[^.]*\.cpu"),
            owned(&[("servers.dc1.host-1.cpu", LEAF), ("servers.dc2.host-1.cpu", LEAF)])
        );
        // A branch several names share is visited once while they come one after another.
        assert_eq!(
            found_in_delta(&delta, r"servers\.dc1(\..*)?"),
            owned(&[
                ("servers.dc1", BRANCH),
                ("servers.dc1.host-1", BRANCH),
                ("servers.dc1.host-1.cpu", LEAF),
                ("servers.dc1.host-1.mem", LEAF)
            ])
        );
        assert_eq!(found_in_delta(&delta, r"ünï"), owned(&[("ünï", BRANCH)]));
        assert_eq!(found_in_delta(&delta, "servers"), owned(&[("servers", BRANCH)]));
        assert_eq!(found_in_delta(&delta, "nothing.*"), owned(&[]));
        // A name that is also a branch is visited as each.
        delta.add("servers.dc1");
        assert_eq!(found_in_delta(&delta, r"servers\.dc1"), owned(&[("servers.dc1", LEAF), ("servers.dc1", BRANCH)]));
    }

    /// Every key of one of `dict`'s tries with its flags, in the trie's order.
    fn trie_keys(dict: &NameDict, reversed: bool) -> Vec<(String, u8)> {
        let mut stream = if reversed { dict.reversed.stream() } else { dict.forward.stream() };
        let mut out = Vec::new();
        while let Some((k, f)) = stream.next() {
            out.push((String::from_utf8_lossy(k).into_owned(), f as u8));
        }
        out
    }

    #[test]
    fn a_delta_holds_its_nodes_once_sorted_both_ways() {
        let mut delta = NameDelta::default();
        // More names than a run holds in tests: the runs' nodes are merged.
        for n in ["b.y", "a.x", "b.x", "a.x", "a", "a.b-c.d", "c", "b.y", "a.x"] {
            delta.add(n);
        }
        assert!(delta.nodes(false).len() > 1);
        let dict = NameDict::union(&[], &delta);
        assert_eq!(
            trie_keys(&dict, false),
            owned(&[
                ("a", LEAF | BRANCH),
                ("a.b-c", BRANCH),
                ("a.b-c.d", LEAF),
                ("a.x", LEAF),
                ("b", BRANCH),
                ("b.x", LEAF),
                ("b.y", LEAF),
                ("c", LEAF)
            ])
        );
        assert_eq!(
            trie_keys(&dict, true),
            owned(&[
                ("a", LEAF | BRANCH),
                ("b", BRANCH),
                ("c", LEAF),
                ("c-b.a", BRANCH),
                ("d.c-b.a", LEAF),
                ("x.a", LEAF),
                ("x.b", LEAF),
                ("y.b", LEAF)
            ])
        );
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

    /// Every node of `names` the `regex` crate matches whole, with its flags merged.
    pub(super) fn nodes_matching(names: &[String], re: &str) -> BTreeMap<String, u8> {
        let r = regex::Regex::new(&format!("^(?s:{re})$")).unwrap();
        let mut want: BTreeMap<String, u8> = BTreeMap::new();
        for n in names {
            for_each_node(n.as_bytes(), |node, flags| {
                let node = std::str::from_utf8(node).unwrap();
                if r.is_match(node) {
                    *want.entry(node.to_owned()).or_default() |= flags;
                }
            });
        }
        want
    }

    /// `hosts` hosts under two data centres with the given metrics each: host trees that
    /// repeat (the trie shares them, the walk's memo replays them) and some that differ.
    pub(super) fn host_names(hosts: usize) -> Vec<String> {
        let mut out = Vec::new();
        for h in 0..hosts {
            for dc in ["dc1", "dc2"] {
                for m in ["cpu.user", "cpu.system", "net.eth0.rx", "net.eth0.tx", "net.eth1.rx", "load.1"] {
                    // Every seventh host lacks eth1, every eleventh has a metric of its own.
                    if m.contains("eth1") && h % 7 == 0 {
                        continue;
                    }
                    out.push(format!("servers.{dc}.host-{h:03}.{m}"));
                }
                if h % 11 == 0 {
                    out.push(format!("servers.{dc}.host-{h:03}.own.h{h}"));
                }
            }
        }
        out
    }

    /// A leading-star glob walks whichever way was cheaper: forwards when every host has the
    /// metric (each host is entered once either way, and a backward walk sorts what it found
    /// too), backwards when few hosts have it (a forward walk enters every host to find out).
    #[test]
    fn searches_settle_on_the_cheaper_direction() {
        let metrics: Vec<String> = (0..40).map(|m| format!("m{m}.value")).chain(["net.eth0.rx_bytes".into()]).collect();
        let everywhere: Vec<String> =
            (0..400).flat_map(|h| metrics.iter().map(move |m| format!("servers.dc1.host-{h:04}.{m}"))).collect();
        // One host in forty has the metric, and hosts differ in theirs.
        let rare: Vec<String> = (0..400)
            .flat_map(|h| {
                let own = (0..40).map(move |m| format!("servers.dc1.host-{h:04}.m{}.value", h * 40 + m));
                own.chain((h % 40 == 0).then(|| format!("servers.dc1.host-{h:04}.net.eth0.rx_bytes")))
            })
            .collect();
        let leading_star = r"[^.]*\.[^.]*\.[^.]*\.net\.eth0\.rx_bytes";
        for (names, found_want, want_reversed) in [(&everywhere, 400, false), (&rare, 10, true)] {
            let dict = NameDict::build(names.iter().map(String::as_str));
            let p = NamePattern::new(leading_star).unwrap();
            assert!(p.walks_reversed(), "the first guess: the longer literal end");
            let mut directions = Vec::new();
            for _ in 0..3 * PROBE_EVERY {
                let mut found = 0;
                dict.search(&p, |_, _| {
                    found += 1;
                    true
                });
                assert_eq!(found, found_want);
                directions.push(p.walks_reversed());
            }
            assert_eq!(p.walks_reversed(), want_reversed, "{:?}", p.known_work());
            // Settled after both were walked, apart from a probe now and then.
            let other = directions[2..].iter().filter(|&&d| d != want_reversed).count();
            assert!(other <= 3, "{directions:?}");
        }
    }

    #[test]
    fn shared_subtrees_are_replayed_with_their_own_prefixes() {
        let names = host_names(120);
        let dict = NameDict::build(names.iter().map(String::as_str));
        for re in [
            r"[^.]*\.[^.]*\.[^.]*\.net\.eth1\.rx",
            r"servers\.[^.]*\.[^.]*\.[^.]*",
            r"[^.]*\.dc2\.[^.]*\.(cpu|own)\..*",
            r".*\.rx",
        ] {
            let want = nodes_matching(&names, re);
            assert!(want.len() > 100, "{re}: {} nodes, too few to repeat a subtree", want.len());
            for reversed in [false, true] {
                let p = NamePattern::new(re).unwrap().walking(reversed);
                let mut visits = Vec::new();
                dict.search(&p, |k, f| {
                    visits.push((String::from_utf8(k.to_vec()).unwrap(), f));
                    true
                });
                let got: BTreeMap<String, u8> = visits.iter().cloned().collect();
                assert_eq!(got.len(), visits.len(), "{re}: a node visited twice");
                assert_eq!(got, want, "{re}, reversed {reversed}");
                // Stopped after five visits, replayed or walked: exactly five.
                let mut count = 0;
                dict.search(&p, |_, _| {
                    count += 1;
                    count < 5
                });
                assert_eq!(count, 5, "{re}: the walk stops when told");
            }
        }
    }

    #[test]
    fn a_union_holds_the_nodes_of_all_with_their_flags_merged() {
        let names = host_names(30);
        let (first, rest) = names.split_at(names.len() / 3);
        let (second, third) = rest.split_at(rest.len() / 2);
        let one = NameDict::build(first.iter().map(String::as_str));
        let two = NameDict::build(second.iter().map(String::as_str).chain(["a.b.c"]));
        let mut delta = NameDelta::default();
        for n in third.iter().map(String::as_str).chain(["servers", "a.b.c", "a.b"]) {
            delta.add(n);
        }
        let union = NameDict::union(&[&one, &two], &delta);
        let whole = NameDict::build(names.iter().map(String::as_str).chain(["servers", "a.b.c", "a.b"]));
        assert_eq!(found(&union, ".*"), found(&whole, ".*"));
        assert_eq!(union.get(b"servers"), Some(LEAF | BRANCH), "a branch that became a leaf too");
        assert_eq!(union.get(b"a.b"), Some(LEAF | BRANCH), "a leaf that is a branch in another part");
        assert_eq!(union.len(), whole.len());
        let (f, r) = union.as_bytes();
        assert_eq!((f, r), whole.as_bytes(), "the same tries, byte for byte");
    }

    #[test]
    fn a_delta_visits_each_match_once_when_names_come_grouped() {
        let mut delta = NameDelta::default();
        for n in host_names(40) {
            delta.add(&n);
        }
        // Most names lie under a prefix the automaton dies on (every host's cpu and net): the
        // walk resumes where the previous name left off, and dies again at once.
        for (re, count) in [(r"servers\.dc1\.[^.]*\.load\.1", 40), (r"servers\.dc2\.host-03[0-9]\.own\..*", 1)] {
            for reversed in [false, true] {
                let p = NamePattern::new(re).unwrap().walking(reversed);
                let mut visits = Vec::new();
                delta.search(&p, |k, _| {
                    visits.push(String::from_utf8(k.to_vec()).unwrap());
                    true
                });
                assert_eq!(visits.len(), count, "{re}, reversed {reversed}: {visits:?}");
                assert!(visits.iter().all(|v| regex::Regex::new(&format!("^{re}$")).unwrap().is_match(v)));
            }
        }
    }

    #[test]
    fn a_node_set_sorts_merges_and_packs() {
        let mut set = NodeSet::default();
        for (k, f) in [("b", LEAF), ("a.b", BRANCH), ("a", BRANCH), ("a.b", LEAF), ("a\0", LEAF), ("a", BRANCH)] {
            set.push(k.as_bytes(), f);
        }
        set.merge_repeats();
        let got: Vec<(&[u8], u8)> = set.iter().collect();
        assert_eq!(
            got,
            vec![(&b"a"[..], BRANCH), (&b"a\0"[..], LEAF), (&b"a.b"[..], LEAF | BRANCH), (&b"b"[..], LEAF)]
        );
        // Many repeats: the buffer is rewritten once they outweigh the nodes kept.
        for _ in 0..10 {
            set.push(b"a.b", LEAF);
        }
        set.merge_repeats();
        assert_eq!(set.len(), 4);
        assert!(set.bytes.len() <= 2 * (1 + 2 + 3 + 1), "{} bytes kept", set.bytes.len());
    }

    #[test]
    fn a_node_that_is_not_utf8_reads_as_replacement_characters() {
        let mut set = NodeSet::default();
        set.push("é".as_bytes(), LEAF);
        set.push(b"a\xff", LEAF);
        set.push(&"é".as_bytes()[..1], BRANCH);
        let text: Vec<(String, u8)> = set.iter_text().map(|(k, f)| (k.into_owned(), f)).collect();
        assert_eq!(text, vec![("é".into(), LEAF), ("a\u{fffd}".into(), LEAF), ("\u{fffd}".into(), BRANCH)]);
    }

    proptest! {
        /// The radix sort orders keys by bits 32 to 104 as a comparison sort does, whichever
        /// digits differ (an odd or even number of passes) and wherever the run is long enough
        /// for it; the index bits below go along with their keys.
        #[test]
        fn radix_sorted_words_are_in_key_order(
            words in proptest::collection::vec((0u64..4, any::<u64>(), 0u8..9), RADIX_SORT_MIN..RADIX_SORT_MIN * 4),
            mask in any::<u64>(),
        ) {
            let keys: Vec<u128> = words
                .iter()
                .enumerate()
                .map(|(i, &(high, low, left))| {
                    let word = (u128::from(high) << 62) | u128::from(low & mask);
                    (word << 40) | (u128::from(left) << 32) | i as u128
                })
                .collect();
            let mut sorted = keys.clone();
            sort_words(&mut sorted, &mut Vec::new());
            let mut want = keys.clone();
            want.sort_by_key(|k| (k >> 32, *k as u32));
            prop_assert!(sorted.windows(2).all(|w| w[0] >> 32 <= w[1] >> 32), "sorted by word and length");
            sorted.sort_by_key(|k| (k >> 32, *k as u32));
            prop_assert_eq!(sorted, want, "the same keys, each with its index");
        }

        #[test]
        fn extend_reversed_reverses(prefix in proptest::collection::vec(any::<u8>(), 0..4), bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut out = prefix.clone();
            extend_reversed(&mut out, &bytes);
            let want: Vec<u8> = prefix.iter().copied().chain(bytes.iter().rev().copied()).collect();
            prop_assert_eq!(out, want);
        }

        /// A key's word, read in place and masked, is its bytes from `depth` on (from the
        /// end if reversed) zero-padded: wherever the key lies in the buffer.
        #[test]
        fn key_words_are_the_keys_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 1..40),
            at in any::<proptest::sample::Index>(),
            len in any::<proptest::sample::Index>(),
            depth in any::<proptest::sample::Index>(),
        ) {
            let start = at.index(bytes.len());
            let len = len.index(bytes.len() - start + 1);
            let depth = depth.index(len + 1);
            let e = NodeEntry::new(start, start + len, LEAF);
            let key = &bytes[start..start + len];
            for reversed in [false, true] {
                let read: Vec<u8> = match reversed {
                    false => key[depth..].to_vec(),
                    true => key[..len - depth].iter().rev().copied().collect(),
                };
                let mut want = [0u8; 8];
                want.iter_mut().zip(&read).for_each(|(w, b)| *w = *b);
                prop_assert_eq!(key_word(&bytes, &e, depth, reversed), u64::from_be_bytes(want), "reversed {}", reversed);
            }
        }

        /// A delta's nodes, either way round, are what a map of every node of every name
        /// holds, with its flags, in order.
        #[test]
        fn a_delta_sorts_its_nodes_both_ways(names in proptest::collection::vec("[ab.\\x00\\xff]{0,12}", 0..300)) {
            let mut delta = NameDelta::default();
            let mut want: BTreeMap<Vec<u8>, u8> = BTreeMap::new();
            for n in &names {
                delta.add(n);
                for_each_node(n.as_bytes(), |node, f| *want.entry(node.to_vec()).or_default() |= f);
            }
            let dict = NameDict::union(&[], &delta);
            for reversed in [false, true] {
                let got: Vec<(Vec<u8>, u8)> = {
                    let mut stream = if reversed { dict.reversed.stream() } else { dict.forward.stream() };
                    let mut out = Vec::new();
                    while let Some((k, f)) = stream.next() {
                        out.push((k.to_vec(), f as u8));
                    }
                    out
                };
                let mut expected: Vec<(Vec<u8>, u8)> = want
                    .iter()
                    .map(|(k, &f)| (if reversed { k.iter().rev().copied().collect() } else { k.clone() }, f))
                    .collect();
                expected.sort();
                prop_assert_eq!(got, expected, "reversed {}", reversed);
            }
        }

        /// A node set holds what a map merging the flags of every node pushed would, in order.
        #[test]
        fn a_node_set_agrees_with_a_map(
            pushes in proptest::collection::vec(("(servers\\.dc[12]\\.host-0{0,12}[0-9]|[ab\\x00\\xff]{0,3})", 1u8..4), 0..400),
            merge_every in 1usize..60,
        ) {
            let mut set = NodeSet::default();
            let mut want: BTreeMap<Vec<u8>, u8> = BTreeMap::new();
            for (i, (k, f)) in pushes.iter().enumerate() {
                set.push(k.as_bytes(), *f);
                *want.entry(k.as_bytes().to_vec()).or_default() |= f;
                if i % merge_every == 0 {
                    set.merge_repeats();
                }
            }
            set.merge_repeats();
            let got: Vec<(Vec<u8>, u8)> = set.iter().map(|(k, f)| (k.to_vec(), f)).collect();
            let text: Vec<(String, u8)> = set.iter_text().map(|(k, f)| (k.into_owned(), f)).collect();
            let want_text: Vec<(String, u8)> =
                want.iter().map(|(k, f)| (String::from_utf8_lossy(k).into_owned(), *f)).collect();
            prop_assert_eq!(text, want_text);
            prop_assert_eq!(got, want.into_iter().collect::<Vec<_>>());
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
            let want = nodes_matching(&names, &re);
            let dict = NameDict::build(names.iter().map(String::as_str));
            for reversed in [false, true] {
            let p = NamePattern::new(&re).unwrap().walking(reversed);
            let mut visits: Vec<(String, u8)> = Vec::new();
            dict.search(&p, |k, f| { visits.push((String::from_utf8(k.to_vec()).unwrap(), f)); true });
            if !reversed {
                prop_assert!(visits.is_sorted_by(|a, b| a.0 < b.0), "a forward walk visits in order: {:?}", visits);
            }
            let got: BTreeMap<String, u8> = visits.iter().cloned().collect();
            prop_assert_eq!(got.len(), visits.len(), "a node visited twice: {:?}", visits);
            prop_assert_eq!(&got, &want);
            // Half in a base dictionary, half in a delta: their union.
            let base = NameDict::build(names[..split].iter().map(String::as_str));
            let mut delta = NameDelta::default();
            for n in &names[split..] {
                delta.add(n);
            }
            let mut got: BTreeMap<String, u8> = BTreeMap::new();
            base.search(&p, |k, f| { *got.entry(String::from_utf8(k.to_vec()).unwrap()).or_default() |= f; true });
            delta.search(&p, |k, f| {
                *got.entry(String::from_utf8(k.to_vec()).unwrap()).or_default() |= f;
                true
            });
            prop_assert_eq!(&got, &want);
            // The union of the two is one dictionary holding every node.
            let union = NameDict::union(&[&base], &delta);
            let mut visits: Vec<(String, u8)> = Vec::new();
            union.search(&p, |k, f| { visits.push((String::from_utf8(k.to_vec()).unwrap(), f)); true });
            let got: BTreeMap<String, u8> = visits.iter().cloned().collect();
            prop_assert_eq!(got.len(), visits.len(), "a node visited twice in a union: {:?}", visits);
            prop_assert_eq!(&got, &want);
            for n in &names {
                prop_assert_eq!(p.is_match(n.as_bytes()), r.is_match(n));
            }
            }
        }
    }
}
