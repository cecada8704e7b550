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
//! Version 7 stores the groups in zstd frames of about 16 KiB (`frames`), which also share what
//! front coding cannot (a metric's name under every host): 0.5 bytes per path for the same 20k
//! paths. Versions 1 and 2 store every symbol whole; a reader keeps each one's offset.

use std::borrow::Cow;
use std::sync::Arc;

use super::frames::{self, FrameRow, FrameWriter};
use crate::block::chunks::{decompress_group, Group};
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

/// Writes a version-3 to 6 symbol table body: the count, then the groups (for tests: a writer
/// writes version 7).
#[cfg(test)]
pub(super) fn encode_front_coded(symbols: &[Arc<str>], format: EntryFormat, out: &mut Vec<u8>) {
    put_uvarint(out, symbols.len() as u64);
    for group in symbols.chunks(SYMBOL_GROUP) {
        encode_group(group, format, out);
    }
}

/// Writes a version-7 symbol table body: the count, the frame rows, then the frames, each
/// holding whole groups of version 4's entries.
pub(super) fn encode_framed(symbols: &[Arc<str>], out: &mut Vec<u8>) -> std::io::Result<()> {
    let mut frames = FrameWriter::new()?;
    let mut stored = Vec::new();
    for group in symbols.chunks(SYMBOL_GROUP) {
        encode_group(group, EntryFormat::Nibbles, frames.raw());
        stored.extend(frames.unit_done()?.unwrap_or_default());
    }
    stored.extend(frames.finish()?.unwrap_or_default());
    put_uvarint(out, symbols.len() as u64);
    frames.rows(true, out);
    out.extend_from_slice(&stored);
    Ok(())
}

/// One group: its first symbol whole, each other front-coded against the one before.
fn encode_group(group: &[Arc<str>], format: EntryFormat, out: &mut Vec<u8>) {
    let mut prev: &[u8] = &[];
    for (i, s) in group.iter().enumerate() {
        let s = s.as_bytes();
        if i == 0 {
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
    /// Versions 3 to 7: the offset of each group's first entry (in the file; version 7: in its
    /// frame's raw bytes), the number of symbols, how the other entries are written, and
    /// (version 7) the frames.
    FrontCoded { groups: Vec<u32>, count: u32, format: EntryFormat, frames: Option<Box<SymbolFrames>> },
}

/// Version 7's symbol frames: where each is, its first group, and this reader's key space in
/// the group cache that keeps them decompressed.
#[derive(Debug)]
pub(super) struct SymbolFrames {
    rows: Vec<FrameRow>,
    first_group: Vec<u32>,
    /// Each frame's first symbol, so a lookup picks its frame without decompressing others.
    first_symbols: Vec<Box<[u8]>>,
    key: u64,
}

/// The bytes a group's offset counts from: the mapped file (or a frame stored as it is in it),
/// or a decompressed frame.
enum GroupBytes<'a> {
    Mapped(&'a [u8]),
    Frame(Arc<Group>),
}

impl std::ops::Deref for GroupBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            GroupBytes::Mapped(b) => b,
            GroupBytes::Frame(f) => f.bytes(),
        }
    }
}

impl SymbolFrames {
    /// The frame that holds group `g`.
    fn frame_of(&self, g: usize) -> usize {
        self.first_group.partition_point(|&first| first as usize <= g) - 1
    }

    /// The groups of frame `f`, of `groups` in all.
    fn groups_of(&self, f: usize, groups: usize) -> std::ops::Range<usize> {
        self.first_group[f] as usize..self.first_group.get(f + 1).map_or(groups, |&g| g as usize)
    }

    /// Frame `f`'s raw bytes. They decompressed when the table was opened, so a failure now is
    /// the file changing under its mapping: the symbol reads as empty (and its entry as
    /// damaged) rather than as another one.
    fn bytes<'a>(&self, map: &'a [u8], f: usize) -> GroupBytes<'a> {
        let row = &self.rows[f];
        if !row.compressed {
            return GroupBytes::Mapped(&map[row.file_at..row.file_at + row.file_len]);
        }
        match frames::read(map, row, (self.key, frames::SYMBOL_FRAMES, f as u32)) {
            Ok(frame) => GroupBytes::Frame(frame),
            Err(_) => GroupBytes::Mapped(&[]),
        }
    }
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

    /// Reads a version 3 to 6 table whose body starts at byte `start` of the file, checking that
    /// every symbol decodes to UTF-8 and that they ascend strictly (lookups search them).
    pub(super) fn parse_front_coded(start: usize, body: &[u8], format: EntryFormat) -> Result<Self, String> {
        let mut d = Decoder::new(body);
        let n = d.uvarint("symbol count").map_err(|e| e.to_string())?;
        let count = u32::try_from(n).map_err(|_| format!("{n} symbols"))?;
        let mut groups = Vec::with_capacity((n as usize).min(body.len()).div_ceil(SYMBOL_GROUP));
        let mut parser = FrontParser { format, next: 0, prev: Vec::new(), cur: Vec::new() };
        parser.entries(&mut d, count as usize, start, &mut groups)?;
        Ok(SymbolTable::FrontCoded { groups, count, format, frames: None })
    }

    /// Reads a version 7 table whose body starts at byte `start` of `map` (the file),
    /// decompressing every frame once to check its symbols as `parse_front_coded` does. `key`
    /// is the reader's key space in the group cache.
    pub(super) fn parse_framed(map: &[u8], start: usize, body: &[u8], key: u64) -> Result<Self, String> {
        let mut d = Decoder::new(body);
        let err = |e: crate::encoding::DecodeError| e.to_string();
        let n = d.uvarint("symbol count").map_err(err)?;
        let count = u32::try_from(n).map_err(|_| format!("{n} symbols"))?;
        let group_count = (count as usize).div_ceil(SYMBOL_GROUP);
        let frame_count = d.uvarint("frame count").map_err(err)?;
        if frame_count > group_count as u64 {
            return Err(format!("{frame_count} frames for {group_count} groups"));
        }
        let mut rows = Vec::with_capacity(frame_count as usize);
        let mut first_group = Vec::with_capacity(frame_count as usize);
        let mut in_frames = 0u64;
        for f in 0..frame_count {
            let groups = d.uvarint("groups in the frame").map_err(err)?;
            let raw = d.uvarint("frame raw length").map_err(err)?;
            let stored = d.uvarint("frame length").map_err(err)?;
            if groups == 0 || raw > frames::FRAME_RAW_MAX {
                return Err(format!("symbol frame {f}: {groups} groups in {raw} bytes"));
            }
            first_group.push(in_frames as u32);
            in_frames = in_frames.saturating_add(groups);
            let file_len = if stored == 0 { raw } else { stored };
            rows.push(FrameRow {
                file_at: 0,
                file_len: file_len as usize,
                compressed: stored != 0,
                raw_at: 0,
                raw_len: raw as usize,
            });
        }
        if in_frames != group_count as u64 {
            return Err(format!("frames hold {in_frames} of {group_count} groups"));
        }
        let mut file_at = start + d.offset();
        for row in &mut rows {
            row.file_at = file_at;
            file_at = file_at
                .checked_add(row.file_len)
                .filter(|&e| e <= start + body.len())
                .ok_or("a symbol frame runs past the table")?;
        }
        if file_at != start + body.len() {
            return Err("symbol frames do not fill the table".into());
        }
        let mut groups = Vec::with_capacity(group_count);
        let mut first_symbols = Vec::with_capacity(rows.len());
        let mut parser = FrontParser { format: EntryFormat::Nibbles, next: 0, prev: Vec::new(), cur: Vec::new() };
        for (f, row) in rows.iter().enumerate() {
            let stored = &map[row.file_at..row.file_at + row.file_len];
            let raw = if row.compressed {
                decompress_group(stored, row.raw_len)
                    .filter(|r| r.len() == row.raw_len)
                    .ok_or_else(|| format!("symbol frame {f} does not decompress to its {} bytes", row.raw_len))?
            } else {
                stored.to_vec()
            };
            let frame_groups = rows.get(f + 1).map_or(group_count as u32, |_| first_group[f + 1]) - first_group[f];
            let symbols = (frame_groups as usize * SYMBOL_GROUP).min(count as usize - parser.next);
            let mut fd = Decoder::new(&raw);
            parser.entries(&mut fd, symbols, 0, &mut groups).map_err(|e| format!("symbol frame {f}: {e}"))?;
            if !fd.is_empty() {
                return Err(format!("symbol frame {f}: bytes after its groups"));
            }
            first_symbols.push(front_first(&mut Decoder::new(&raw)).into());
        }
        let frames = Some(Box::new(SymbolFrames { rows, first_group, first_symbols, key }));
        Ok(SymbolTable::FrontCoded { groups, count, format: EntryFormat::Nibbles, frames })
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
                let g = id as usize / SYMBOL_GROUP;
                let k = id as usize % SYMBOL_GROUP;
                let at = groups[g] as usize;
                // The k-th symbol after the group's first, decoded into a new string.
                let walk = |mut d: Decoder<'_>, whole: &[u8]| {
                    let mut buf = whole.to_vec();
                    for _ in 0..k {
                        front_next(&mut d, *format, &mut buf);
                    }
                    String::from_utf8(buf).unwrap_or_else(|_| "\u{fffd}".into())
                };
                match self.group_bytes(map, g) {
                    GroupBytes::Mapped(bytes) => {
                        let mut d = Decoder::new(bytes.get(at..).unwrap_or(&[]));
                        let whole = front_first(&mut d);
                        if k == 0 {
                            return Cow::Borrowed(utf8(whole));
                        }
                        Cow::Owned(walk(d, whole))
                    }
                    GroupBytes::Frame(frame) => {
                        let mut d = Decoder::new(frame.bytes().get(at..).unwrap_or(&[]));
                        let whole = front_first(&mut d);
                        Cow::Owned(walk(d, whole))
                    }
                }
            }
        }
    }

    /// The bytes group `g`'s offset counts from (front-coded tables).
    fn group_bytes<'a>(&self, map: &'a [u8], g: usize) -> GroupBytes<'a> {
        match self {
            SymbolTable::FrontCoded { frames: Some(frames), .. } => frames.bytes(map, frames.frame_of(g)),
            _ => GroupBytes::Mapped(map),
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
            SymbolTable::FrontCoded { groups, count, format, frames } => {
                // The last group whose first symbol is ≤ s (version 7: within the last frame
                // whose first symbol is), then a walk through it.
                let (range, bytes) = match frames {
                    Some(frames) => {
                        let f =
                            frames.first_symbols.partition_point(|first| **first <= *s.as_bytes()).checked_sub(1)?;
                        (frames.groups_of(f, groups.len()), frames.bytes(map, f))
                    }
                    None => (0..groups.len(), GroupBytes::Mapped(map)),
                };
                let first = |g: usize| front_first(&mut Decoder::new(bytes.get(groups[g] as usize..).unwrap_or(&[])));
                let (mut lo, mut hi) = (range.start, range.end);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if first(mid) <= s.as_bytes() {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                let g = lo.checked_sub(1).filter(|&g| g >= range.start)?;
                let mut d = Decoder::new(bytes.get(groups[g] as usize..).unwrap_or(&[]));
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
    /// Where the entry after it starts, in the mapped file (version 7: in its frame).
    next: usize,
    buf: Vec<u8>,
    /// Version 7: the decompressed frame the symbol is in (`None` when the file holds it), with
    /// the opening and the frame's groups: the next symbol is mostly in the same frame, which
    /// is then taken from here, not from the group cache.
    frame: Option<(u64, std::ops::Range<usize>, Arc<Group>)>,
    /// The reader's shared string for the symbol at `at`, once it kept one (`keep_shared`):
    /// series in label order repeat most of their neighbour's names and values, which then
    /// cost neither decoding nor a lookup among the reader's strings.
    shared: Option<Arc<str>>,
}

impl SymbolCursor {
    /// The shared string kept for symbol `id` of the index opened as `file`, if the cursor is
    /// at that symbol.
    pub(super) fn shared(&self, file: u64, id: u32) -> Option<&Arc<str>> {
        self.shared.as_ref().filter(|_| self.at == Some((file, id)))
    }

    /// Keeps `s` as the shared string of the symbol the cursor is at (read by `get_via`).
    pub(super) fn keep_shared(&mut self, s: Arc<str>) {
        self.shared = Some(s);
    }
}

impl SymbolTable {
    /// Symbol `id` of the index opened as `file`, through `cursor`: from the symbol it holds when
    /// that is in the same group and not after `id`.
    pub(super) fn get_via<'c>(&self, map: &[u8], file: u64, id: u32, cursor: &'c mut SymbolCursor) -> &'c str {
        // The kept string is of the symbol the cursor leaves.
        cursor.shared = None;
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
        let SymbolCursor { at, next, buf, frame, .. } = cursor;
        let frames = match self {
            SymbolTable::FrontCoded { frames: Some(frames), .. } => Some(frames),
            _ => None,
        };
        let held = matches!(&*frame, Some((f, groups, _)) if *f == file && groups.contains(&group));
        let mapped = if held {
            None
        } else {
            match self.group_bytes(map, group) {
                GroupBytes::Frame(f) => {
                    let groups = frames.map_or(0..0, |frames| frames.groups_of(frames.frame_of(group), groups.len()));
                    *frame = Some((file, groups, f));
                    None
                }
                bytes => {
                    *frame = None;
                    Some(bytes)
                }
            }
        };
        let bytes: &[u8] = match (&mapped, &*frame) {
            (Some(bytes), _) => bytes,
            (None, Some((_, _, f))) => f.bytes(),
            (None, None) => unreachable!("a group's bytes are mapped or in the cursor's frame"),
        };
        // The decoder reads from `base` of `bytes`.
        let (base, mut d, mut k) = match from {
            Some(last) => (*next, Decoder::new(bytes.get(*next..).unwrap_or(&[])), last),
            None => {
                let base = groups[group] as usize;
                let mut d = Decoder::new(bytes.get(base..).unwrap_or(&[]));
                buf.clear();
                buf.extend_from_slice(front_first(&mut d));
                (base, d, (group * SYMBOL_GROUP) as u32)
            }
        };
        while k < id {
            front_next(&mut d, *format, buf);
            k += 1;
        }
        *next = base + d.offset();
        *at = Some((file, id));
        utf8(buf)
    }
}

/// Checks front-coded entries as they are read, the symbol before carried from call to call
/// (version 7 reads each frame's groups by one call).
struct FrontParser {
    format: EntryFormat,
    /// The next symbol's number.
    next: usize,
    prev: Vec<u8>,
    cur: Vec<u8>,
}

impl FrontParser {
    /// Reads `n` entries from `d`, pushing each group's offset (`d`'s offset plus `base`) to
    /// `groups`, and checks that each is UTF-8 and sorts after the one before.
    fn entries(&mut self, d: &mut Decoder<'_>, n: usize, base: usize, groups: &mut Vec<u32>) -> Result<(), String> {
        let FrontParser { format, next, prev, cur } = self;
        for i in *next..*next + n {
            let at = base + d.offset();
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
                        let (dropped, len) = nibbles(d).map_err(|e| e.to_string())?;
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
            if std::str::from_utf8(cur).is_err() {
                return Err(format!("symbol {i} is not UTF-8"));
            }
            if i > 0 && cur <= prev {
                return Err(format!("symbol {i} does not sort after the one before"));
            }
            std::mem::swap(prev, cur);
        }
        *next += n;
        Ok(())
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

    /// A cursor gives back the shared string kept for the symbol it is at, and only for that
    /// symbol of that file: reading another symbol through it drops the string.
    #[test]
    fn a_cursor_keeps_the_shared_string_of_its_symbol_only() {
        let symbols: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let (body, t) = table_in(&symbols, EntryFormat::Nibbles);
        let mut cursor = SymbolCursor::default();
        assert_eq!(t.get_via(&body, 7, 1, &mut cursor), "b");
        cursor.keep_shared(Arc::from("b"));
        assert_eq!(cursor.shared(7, 1).map(|s| &**s), Some("b"));
        assert!(cursor.shared(8, 1).is_none(), "another file's symbol 1");
        assert!(cursor.shared(7, 2).is_none(), "another symbol");
        assert_eq!(t.get_via(&body, 7, 2, &mut cursor), "c");
        assert!(cursor.shared(7, 2).is_none(), "symbol 2 read, but no string kept for it");
        assert!(cursor.shared(7, 1).is_none());
    }

    fn framed_table(symbols: &[String]) -> (Vec<u8>, SymbolTable) {
        let arcs: Vec<Arc<str>> = symbols.iter().map(|s| Arc::from(s.as_str())).collect();
        let mut body = Vec::new();
        encode_framed(&arcs, &mut body).unwrap();
        let t = SymbolTable::parse_framed(&body, 0, &body, crate::block::chunks::next_reader_id()).unwrap();
        (body, t)
    }

    proptest! {
        /// Version 7: symbols over many frames (compressed, and stored as they are where zstd
        /// does not shrink them) read back by id, by lookup, through a cursor and in order, the
        /// same as version 4's; strings between frames' first symbols are not found.
        #[test]
        fn framed_symbols_read_back(
            // Host-like paths (they compress) and random words (they may not), enough for frames.
            hosts in 0usize..400,
            words in prop::collection::btree_set("[a-zé]{1,30}", 0..1500),
            probes in prop::collection::vec("[a-z]{0,8}", 0..20),
        ) {
            let mut set: std::collections::BTreeSet<String> = words;
            for h in 0..hosts {
                for m in ["cpu.user", "cpu.system", "mem.free", "load.1"] {
                    set.insert(format!("servers.dc{}.host-{h:05}.{m}", h % 3));
                }
            }
            let symbols: Vec<String> = set.into_iter().collect();
            let (body, t) = framed_table(&symbols);
            let (v4, t4) = table_in(&symbols, EntryFormat::Nibbles);
            prop_assert_eq!(t.len(), symbols.len());
            let SymbolTable::FrontCoded { frames: Some(frames), .. } = &t else { panic!("a framed table") };
            if symbols.len() > 3000 {
                prop_assert!(frames.rows.len() > 1);
            }
            for (i, s) in symbols.iter().enumerate() {
                prop_assert_eq!(&*t.get(&body, i as u32), s.as_str());
                prop_assert_eq!(t.lookup(&body, s), Some(i as u32));
            }
            for p in probes.iter().chain(frames.first_symbols.iter().map(|f| {
                // Just before a frame's first symbol: in the frame before, or nowhere.
                let mut s = String::from_utf8(f.to_vec()).unwrap();
                s.pop();
                s
            }).collect::<Vec<_>>().iter()) {
                prop_assert_eq!(t.lookup(&body, p), t4.lookup(&v4, p), "{:?}", p);
            }
            let mut cursor = SymbolCursor::default();
            let ids: Vec<usize> = (0..symbols.len()).chain((0..symbols.len()).rev().step_by(7)).collect();
            for i in ids {
                prop_assert_eq!(t.get_via(&body, 3, i as u32, &mut cursor), symbols[i].as_str());
            }
            let mut seen = Vec::new();
            t.for_each(&body, (0..symbols.len() as u32).filter(|i| i % 5 != 1), |id, s| seen.push((id, s.to_owned())));
            prop_assert_eq!(seen.len(), symbols.len() - symbols.len().saturating_add(3) / 5);
            prop_assert!(seen.iter().all(|(id, s)| symbols[*id as usize] == *s));
        }
    }

    /// Version 7: frame rows that do not fit the groups or the body are refused, named.
    #[test]
    fn damaged_frames_are_refused_with_the_reason() {
        let symbols: Vec<String> = (0..40).map(|i| format!("s{i:03}")).collect();
        let (body, _) = framed_table(&symbols);
        // count 40, 1 frame: 3 groups, raw length (2 bytes), stored.
        assert_eq!(body[..3], [40, 1, 3]);
        let parse = |b: &[u8]| SymbolTable::parse_framed(b, 0, b, 1).unwrap_err();
        let mut b = body.clone();
        b[2] = 2;
        assert!(parse(&b).contains("frames hold 2 of 3 groups"), "{}", parse(&b));
        let mut b = body.clone();
        b.push(0);
        assert!(parse(&b).contains("do not fill the table"), "{}", parse(&b));
        let mut b = body.clone();
        let last = b.len() - 1;
        b[last] ^= 0x55;
        assert!(parse(&b).contains("symbol frame 0"), "{}", parse(&b));
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
