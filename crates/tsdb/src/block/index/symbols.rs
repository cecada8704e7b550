//! The index's symbol table: every label name and value of a block, sorted bytewise and unique,
//! a symbol's id being its position. Byte layout: `docs/format/block.md`.
//!
//! Versions 3 and 4 store the symbols front-coded: in groups of `SYMBOL_GROUP`, the first whole
//! and each other one as the length of the prefix it shares with the one before and the rest.
//! Sorted label values share long prefixes (Graphite paths, pod names, URLs), so this takes a
//! fraction of the plain strings' bytes (10.3 bytes per path against 39.4 for 20k Graphite host
//! paths). Version 4 writes both lengths in one byte when they are short, as they nearly always
//! are (the next path drops a few bytes of the one before and adds a few): 9.4 bytes per path.
//! A reader keeps one offset per group in memory and decodes at most a group to reach a symbol.
//! Versions 1 and 2 store every symbol whole; a reader keeps each one's offset.

use std::borrow::Cow;
use std::sync::Arc;

use crate::encoding::{put_uvarint, Decoder};

/// Symbols per front-coded group: a lookup decodes at most this many; each group costs its first
/// symbol whole.
pub const SYMBOL_GROUP: usize = 16;

/// How a front-coded entry after a group's first says what it keeps of the symbol before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EntryFormat {
    /// Version 3: `shared uvarint | len uvarint | bytes`.
    SharedLen,
    /// Version 4: one byte, the bytes dropped from the end of the symbol before (high nibble) and
    /// the suffix length (low nibble), a nibble of 15 meaning 15 plus a uvarint that follows
    /// (dropped first); then the suffix.
    Nibbles,
}

/// Writes a version-3 or 4 symbol table body: the count, then the groups.
pub(super) fn encode_front_coded(symbols: &[Arc<str>], format: EntryFormat, out: &mut Vec<u8>) {
    put_uvarint(out, symbols.len() as u64);
    let mut prev: &[u8] = &[];
    for (i, s) in symbols.iter().enumerate() {
        let s = s.as_bytes();
        if i % SYMBOL_GROUP == 0 {
            put_uvarint(out, s.len() as u64);
            out.extend_from_slice(s);
        } else {
            let shared = s.iter().zip(prev).take_while(|(a, b)| a == b).count();
            let len = s.len() - shared;
            match format {
                EntryFormat::SharedLen => {
                    put_uvarint(out, shared as u64);
                    put_uvarint(out, len as u64);
                }
                EntryFormat::Nibbles => {
                    let dropped = prev.len() - shared;
                    out.push((dropped.min(15) << 4 | len.min(15)) as u8);
                    for n in [dropped, len] {
                        if n >= 15 {
                            put_uvarint(out, (n - 15) as u64);
                        }
                    }
                }
            }
            out.extend_from_slice(&s[shared..]);
        }
        prev = s;
    }
}

/// Where a reader finds each symbol in the mapped file.
#[derive(Debug)]
pub(super) enum SymbolTable {
    /// Versions 1 and 2: the offset and length of each symbol's bytes.
    Plain(Vec<(u32, u32)>),
    /// Versions 3 and 4: the offset of each group's first entry, the number of symbols and how
    /// the other entries are written.
    FrontCoded { groups: Vec<u32>, count: u32, format: EntryFormat },
}

impl SymbolTable {
    /// Reads a version 1 or 2 table whose body starts at byte `start` of the file.
    pub(super) fn parse_plain(start: usize, body: &[u8]) -> Result<Self, String> {
        let mut d = Decoder::new(body);
        let n = d.uvarint("symbol count").map_err(|e| e.to_string())?;
        let mut symbols = Vec::with_capacity(n.min(body.len() as u64) as usize);
        for _ in 0..n {
            let s = d.str("symbol").map_err(|e| e.to_string())?;
            let at = start + d.offset() - s.len();
            symbols.push((at as u32, s.len() as u32));
        }
        Ok(SymbolTable::Plain(symbols))
    }

    /// Reads a version 3 or 4 table whose body starts at byte `start` of the file, checking that
    /// every symbol decodes to UTF-8 and that they ascend strictly (lookups search them).
    pub(super) fn parse_front_coded(start: usize, body: &[u8], format: EntryFormat) -> Result<Self, String> {
        let mut d = Decoder::new(body);
        let n = d.uvarint("symbol count").map_err(|e| e.to_string())?;
        let count = u32::try_from(n).map_err(|_| format!("{n} symbols"))?;
        let mut groups = Vec::with_capacity((n as usize).min(body.len()).div_ceil(SYMBOL_GROUP));
        let (mut prev, mut cur) = (Vec::new(), Vec::new());
        for i in 0..n as usize {
            let at = start + d.offset();
            cur.clear();
            if i % SYMBOL_GROUP == 0 {
                groups.push(u32::try_from(at).map_err(|_| "symbol table past 4 GiB".to_string())?);
                let len = d.uvarint("symbol length").map_err(|e| e.to_string())?;
                cur.extend_from_slice(d.bytes(len as usize, "symbol").map_err(|e| e.to_string())?);
            } else {
                let (shared, len) = match format {
                    EntryFormat::SharedLen => {
                        let shared = d.uvarint("shared prefix").map_err(|e| e.to_string())?;
                        (shared, d.uvarint("suffix length").map_err(|e| e.to_string())?)
                    }
                    EntryFormat::Nibbles => {
                        let (dropped, len) = nibbles(&mut d).map_err(|e| e.to_string())?;
                        if dropped > prev.len() as u64 {
                            return Err(format!("symbol {i} drops {dropped} bytes of a {}-byte symbol", prev.len()));
                        }
                        (prev.len() as u64 - dropped, len)
                    }
                };
                if shared > prev.len() as u64 {
                    return Err(format!("symbol {i} shares {shared} bytes of a {}-byte symbol", prev.len()));
                }
                let shared = shared as usize;
                cur.extend_from_slice(&prev[..shared]);
                cur.extend_from_slice(d.bytes(len as usize, "symbol suffix").map_err(|e| e.to_string())?);
            }
            if std::str::from_utf8(&cur).is_err() {
                return Err(format!("symbol {i} is not UTF-8"));
            }
            if i > 0 && cur <= prev {
                return Err(format!("symbol {i} does not sort after the one before"));
            }
            std::mem::swap(&mut prev, &mut cur);
        }
        Ok(SymbolTable::FrontCoded { groups, count, format })
    }

    pub(super) fn len(&self) -> usize {
        match self {
            SymbolTable::Plain(s) => s.len(),
            SymbolTable::FrontCoded { count, .. } => *count as usize,
        }
    }

    /// The string of symbol `id` (`id` < `len()`), borrowed from `map` where it is stored whole.
    pub(super) fn get<'a>(&self, map: &'a [u8], id: u32) -> Cow<'a, str> {
        match self {
            SymbolTable::Plain(s) => {
                let (at, len) = s[id as usize];
                Cow::Borrowed(utf8(&map[at as usize..(at + len) as usize]))
            }
            SymbolTable::FrontCoded { groups, format, .. } => {
                let mut d = Decoder::new(&map[groups[id as usize / SYMBOL_GROUP] as usize..]);
                let whole = front_first(&mut d);
                let k = id as usize % SYMBOL_GROUP;
                if k == 0 {
                    return Cow::Borrowed(utf8(whole));
                }
                let mut buf = whole.to_vec();
                for _ in 0..k {
                    front_next(&mut d, *format, &mut buf);
                }
                Cow::Owned(String::from_utf8(buf).unwrap_or_else(|_| "\u{fffd}".into()))
            }
        }
    }

    /// Id of symbol `s`, by binary search.
    pub(super) fn lookup(&self, map: &[u8], s: &str) -> Option<u32> {
        match self {
            SymbolTable::Plain(_) => {
                let (mut lo, mut hi) = (0usize, self.len());
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    match (*self.get(map, mid as u32)).cmp(s) {
                        std::cmp::Ordering::Less => lo = mid + 1,
                        std::cmp::Ordering::Greater => hi = mid,
                        std::cmp::Ordering::Equal => return Some(mid as u32),
                    }
                }
                None
            }
            SymbolTable::FrontCoded { groups, count, format } => {
                // The last group whose first symbol is ≤ s, then a walk through it.
                let g =
                    groups.partition_point(|&at| front_first(&mut Decoder::new(&map[at as usize..])) <= s.as_bytes());
                let g = g.checked_sub(1)?;
                let mut d = Decoder::new(&map[groups[g] as usize..]);
                let mut buf = front_first(&mut d).to_vec();
                let in_group = (*count as usize - g * SYMBOL_GROUP).min(SYMBOL_GROUP);
                for k in 0..in_group {
                    if k > 0 {
                        front_next(&mut d, *format, &mut buf);
                    }
                    match buf.as_slice().cmp(s.as_bytes()) {
                        std::cmp::Ordering::Less => {}
                        std::cmp::Ordering::Equal => return Some((g * SYMBOL_GROUP + k) as u32),
                        std::cmp::Ordering::Greater => return None,
                    }
                }
                None
            }
        }
    }

    /// Calls `f` with the id and string of each symbol in `ids` (ascending), decoding each
    /// front-coded group once however many of its symbols are asked for.
    pub(super) fn for_each(&self, map: &[u8], ids: impl IntoIterator<Item = u32>, mut f: impl FnMut(u32, &str)) {
        match self {
            SymbolTable::Plain(_) => {
                for id in ids {
                    f(id, &self.get(map, id));
                }
            }
            SymbolTable::FrontCoded { .. } => {
                // One cursor for this walk (its file number matters only across calls).
                let mut cursor = SymbolCursor::default();
                for id in ids {
                    f(id, self.get_via(map, 0, id, &mut cursor));
                }
            }
        }
    }
}

/// Where the last symbol read through it was: a reader of series in label order asks for the
/// same or the next symbol at each label position (the next path, the same job), which then
/// costs one front-coded step, not a walk from its group's start.
#[derive(Debug, Default, Clone)]
pub(super) struct SymbolCursor {
    /// The opening of the index (`IndexFile::opened`) and the symbol in `buf`; `None`: nothing.
    at: Option<(u64, u32)>,
    /// Where the entry after it starts, in the mapped file.
    next: usize,
    buf: Vec<u8>,
}

impl SymbolTable {
    /// Symbol `id` of the index opened as `file`, through `cursor`: from the symbol it holds when
    /// that is in the same group and not after `id`.
    pub(super) fn get_via<'c>(&self, map: &[u8], file: u64, id: u32, cursor: &'c mut SymbolCursor) -> &'c str {
        let SymbolTable::FrontCoded { groups, format, .. } = self else {
            cursor.buf.clear();
            cursor.buf.extend_from_slice(self.get(map, id).as_bytes());
            cursor.at = None;
            return utf8(&cursor.buf);
        };
        let group = id as usize / SYMBOL_GROUP;
        let from = match cursor.at {
            Some((f, last)) if f == file && last as usize / SYMBOL_GROUP == group && last <= id => Some(last),
            _ => None,
        };
        // The decoder reads from `base` of the file.
        let (base, mut d, mut k) = match from {
            Some(last) => (cursor.next, Decoder::new(&map[cursor.next..]), last),
            None => {
                let base = groups[group] as usize;
                let mut d = Decoder::new(&map[base..]);
                cursor.buf.clear();
                cursor.buf.extend_from_slice(front_first(&mut d));
                (base, d, (group * SYMBOL_GROUP) as u32)
            }
        };
        while k < id {
            front_next(&mut d, *format, &mut cursor.buf);
            k += 1;
        }
        cursor.next = base + d.offset();
        cursor.at = Some((file, id));
        utf8(&cursor.buf)
    }
}

/// A group's first entry (checked when the table was opened, so read without errors).
fn front_first<'a>(d: &mut Decoder<'a>) -> &'a [u8] {
    let len = d.uvarint("symbol length").unwrap_or(0);
    d.bytes(len as usize, "symbol").unwrap_or(&[])
}

/// Replaces `buf` (the previous symbol) with the next entry's symbol (checked when the table
/// was opened, so read without errors).
fn front_next(d: &mut Decoder<'_>, format: EntryFormat, buf: &mut Vec<u8>) {
    let (shared, len) = match format {
        EntryFormat::SharedLen => {
            (d.uvarint("shared prefix").unwrap_or(0) as usize, d.uvarint("suffix length").unwrap_or(0))
        }
        EntryFormat::Nibbles => {
            let (dropped, len) = nibbles(d).unwrap_or((0, 0));
            (buf.len().saturating_sub(dropped as usize), len)
        }
    };
    buf.truncate(shared);
    buf.extend_from_slice(d.bytes(len as usize, "symbol suffix").unwrap_or(&[]));
}

/// A version-4 entry's lengths: the bytes dropped from the symbol before, and the suffix's.
fn nibbles(d: &mut Decoder<'_>) -> Result<(u64, u64), crate::encoding::DecodeError> {
    let b = d.bytes(1, "entry lengths")?[0];
    let mut dropped = (b >> 4) as u64;
    let mut len = (b & 15) as u64;
    if dropped == 15 {
        dropped = d.uvarint("bytes dropped")?.saturating_add(15);
    }
    if len == 15 {
        len = d.uvarint("suffix length")?.saturating_add(15);
    }
    Ok((dropped, len))
}

/// Bytes checked as UTF-8 when the table was opened.
fn utf8(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap_or("\u{fffd}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table_in(symbols: &[String], format: EntryFormat) -> (Vec<u8>, SymbolTable) {
        let arcs: Vec<Arc<str>> = symbols.iter().map(|s| Arc::from(s.as_str())).collect();
        let mut body = Vec::new();
        encode_front_coded(&arcs, format, &mut body);
        let t = SymbolTable::parse_front_coded(0, &body, format).unwrap();
        (body, t)
    }

    fn table(symbols: &[String]) -> (Vec<u8>, SymbolTable) {
        table_in(symbols, EntryFormat::SharedLen)
    }

    proptest! {
        /// Every symbol reads back by id, by lookup and in order; strings that are not symbols
        /// are not found. Multi-byte characters make shared prefixes end inside a character.
        #[test]
        fn front_coded_symbols_read_back(
            // Long runs of a letter make lengths past a nibble's 15.
            set in prop::collection::btree_set("(é|è|a|b|ab|\\.|x{14,40}){0,12}", 0..80),
            probes in prop::collection::vec("(é|è|a|b|ab|\\.|x{14,40}){0,12}", 0..20),
            format in prop_oneof![Just(EntryFormat::SharedLen), Just(EntryFormat::Nibbles)],
        ) {
            let symbols: Vec<String> = set.iter().cloned().collect();
            let (body, t) = table_in(&symbols, format);
            prop_assert_eq!(t.len(), symbols.len());
            for (i, s) in symbols.iter().enumerate() {
                prop_assert_eq!(&*t.get(&body, i as u32), s.as_str());
                prop_assert_eq!(t.lookup(&body, s), Some(i as u32));
            }
            for p in &probes {
                prop_assert_eq!(t.lookup(&body, p), symbols.iter().position(|s| s == p).map(|i| i as u32));
            }
            // Through a cursor, in any order of ids: the same strings.
            let mut cursor = SymbolCursor::default();
            for &i in probes.iter().map(|p| p.len() % symbols.len().max(1)).chain(0..symbols.len()).collect::<Vec<_>>().iter() {
                if i < symbols.len() {
                    prop_assert_eq!(t.get_via(&body, 7, i as u32, &mut cursor), symbols[i].as_str());
                }
            }
            let mut seen = Vec::new();
            t.for_each(&body, (0..symbols.len() as u32).filter(|i| i % 3 != 1), |id, s| seen.push((id, s.to_owned())));
            let want: Vec<(u32, String)> =
                symbols.iter().enumerate().filter(|(i, _)| i % 3 != 1).map(|(i, s)| (i as u32, s.clone())).collect();
            prop_assert_eq!(seen, want);
        }
    }

    #[test]
    fn damaged_tables_are_refused_with_the_reason() {
        let (mut body, _) = table(&["ab".into(), "ac".into()]);
        // "ac" is stored as shared 1, suffix "c": claim 5 shared bytes.
        let at = body.len() - 3;
        body[at] = 5;
        assert!(SymbolTable::parse_front_coded(0, &body, EntryFormat::SharedLen)
            .unwrap_err()
            .contains("shares 5 bytes"));
        let (mut body, _) = table(&["ab".into(), "ac".into()]);
        let last = body.len() - 1;
        body[last] = b'a';
        assert!(SymbolTable::parse_front_coded(0, &body, EntryFormat::SharedLen)
            .unwrap_err()
            .contains("does not sort after"));
        let (mut body, _) = table(&["a".into()]);
        body[2] = 0xff;
        assert!(SymbolTable::parse_front_coded(0, &body, EntryFormat::SharedLen).unwrap_err().contains("not UTF-8"));
        // Version 4: "ac" is one byte (drops 1, adds 1) then "c": claim 3 dropped bytes.
        let (mut body, _) = table_in(&["ab".into(), "ac".into()], EntryFormat::Nibbles);
        let at = body.len() - 2;
        assert_eq!(body[at], 0x11);
        body[at] = 0x31;
        assert!(SymbolTable::parse_front_coded(0, &body, EntryFormat::Nibbles).unwrap_err().contains("drops 3 bytes"));
    }

    /// Sorted Graphite paths: version 4's lengths take a byte where version 3's take two (but at
    /// each new host, where 15 bytes go and 15 come, three).
    #[test]
    fn nibbles_save_a_byte_per_path() {
        let paths: Vec<String> =
            (0..1000).map(|i| format!("servers.dc0.host-{:05}.cpu.cpu{}.user", i / 8, i % 8)).collect();
        let (v3, _) = table_in(&paths, EntryFormat::SharedLen);
        let (v4, t) = table_in(&paths, EntryFormat::Nibbles);
        // 937 entries after a group's first; 62 of them start a host (the other 62 hosts start groups).
        assert_eq!(v3.len() - v4.len(), 1000 - 63 - 2 * 62, "{} against {}", v3.len(), v4.len());
        assert_eq!(t.get(&v4, 999), paths[999]);
    }
}
