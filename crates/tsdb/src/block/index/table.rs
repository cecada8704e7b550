//! The index's postings table: one row per label pair, sorted by (name id, value id), saying
//! where the pair's series are. Byte layout: `docs/format/block.md`.
//!
//! Versions 3 and 4 write rows as deltas from the row before, starting afresh every
//! `TABLE_RESTART` rows, and a reader keeps only those restarts (16 bytes per 32 rows) and the
//! first row of each label name: a block of a million Graphite paths holds a million pairs, which
//! took 16 MB of memory per block read whole. Version 4 writes the commonest row of such a
//! block, the next path held by the next series, as one byte. Versions 1 and 2 store rows whole;
//! a reader keeps every row.

use std::ops::Range;

use crate::encoding::{put_uvarint, unzigzag, zigzag, DecodeError, Decoder};

/// Rows between restarts: a row is decoded from the restart before it, at most this many steps.
pub const TABLE_RESTART: usize = 32;

/// One row of the postings table: a label pair as symbol ids and where its series are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TableEntry {
    pub name: u32,
    pub value: u32,
    /// `offset << 1` of the pair's postings list, or `id << 1 | 1` of the one series that has it.
    pub target: u64,
}

/// How rows are written relative to the row before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RowFormat {
    /// Version 3: every row is `name delta | value | target`.
    Deltas,
    /// Version 4: as version 3 with the name delta plus one, and a row `0` for the next value of
    /// the same name held by the series after the name's previous single series.
    NextRows,
}

/// A version-3 or 4 row's decoding state: the row before (since the last restart) and the last
/// series of the name held alone.
#[derive(Clone, Copy, Debug, Default)]
struct RowState {
    prev: Option<(u32, u32)>,
    prev_single: u64,
}

/// Writes rows (sorted and unique) after their count.
pub(super) fn encode(rows: &[TableEntry], format: RowFormat, out: &mut Vec<u8>) {
    put_uvarint(out, rows.len() as u64);
    let mut state = RowState::default();
    // Version 4 writes name deltas plus one: 0 is the next row.
    let name_bias = u64::from(format == RowFormat::NextRows);
    for (i, e) in rows.iter().enumerate() {
        if i.is_multiple_of(TABLE_RESTART) {
            state = RowState::default();
        }
        match state.prev {
            Some((name, value))
                if format == RowFormat::NextRows
                    && name == e.name
                    && value.checked_add(1) == Some(e.value)
                    && e.target == (state.prev_single + 1) << 1 | 1 =>
            {
                // A path after a path, each held by one series: the next after the other.
                put_uvarint(out, 0);
                state.prev_single += 1;
                state.prev = Some((e.name, e.value));
                continue;
            }
            Some((name, value)) if name == e.name => {
                put_uvarint(out, name_bias);
                put_uvarint(out, (e.value - value - 1) as u64);
            }
            _ => {
                put_uvarint(out, (e.name - state.prev.map_or(0, |p| p.0)) as u64 + name_bias);
                put_uvarint(out, e.value as u64);
                state.prev_single = 0;
            }
        }
        if e.target & 1 == 1 {
            // One series, as the distance from the name's previous such series: the next path's
            // series is the next series, a byte.
            let id = e.target >> 1;
            let gap = id.wrapping_sub(state.prev_single) as i64;
            put_uvarint(out, zigzag(gap) << 1 | 1);
            state.prev_single = id;
        } else {
            put_uvarint(out, e.target);
        }
        state.prev = Some((e.name, e.value));
    }
}

/// Decodes the row after `state`.
fn decode_row(d: &mut Decoder<'_>, format: RowFormat, state: &mut RowState) -> Result<TableEntry, DecodeError> {
    let mut name_delta = d.uvarint("label name delta")?;
    if format == RowFormat::NextRows {
        if name_delta == 0 {
            let Some((name, value)) = state.prev else {
                return Err(DecodeError {
                    what: "postings table",
                    offset: d.offset(),
                    problem: "a next row at a restart",
                });
            };
            let value = value.checked_add(1).ok_or(DecodeError {
                what: "postings table",
                offset: d.offset(),
                problem: "symbol id over 32 bits",
            })?;
            state.prev_single = (state.prev_single + 1) & u32::MAX as u64;
            state.prev = Some((name, value));
            return Ok(TableEntry { name, value, target: state.prev_single << 1 | 1 });
        }
        name_delta -= 1;
    }
    let value = d.uvarint("label value symbol")?;
    let target = d.uvarint("postings target")?;
    let (name, value) = match state.prev {
        Some((name, prev)) if name_delta == 0 => (name as u64, (prev as u64).saturating_add(value).saturating_add(1)),
        _ => {
            state.prev_single = 0;
            (state.prev.map_or(0, |p| p.0 as u64).saturating_add(name_delta), value)
        }
    };
    let (Ok(name), Ok(value)) = (u32::try_from(name), u32::try_from(value)) else {
        return Err(DecodeError { what: "postings table", offset: d.offset(), problem: "symbol id over 32 bits" });
    };
    let target = if target & 1 == 1 {
        let coded = target >> 1;
        let gap = unzigzag(coded);
        state.prev_single = state.prev_single.wrapping_add(gap as u64) & u32::MAX as u64;
        state.prev_single << 1 | 1
    } else {
        target
    };
    state.prev = Some((name, value));
    Ok(TableEntry { name, value, target })
}

/// A restart: the file offset of row `k × TABLE_RESTART` and its value (`find` bisects the
/// restarts inside one name's rows by value).
#[derive(Clone, Copy, Debug)]
pub(super) struct Restart {
    offset: u64,
    value: u32,
}

/// Where a reader finds the postings table's rows.
#[derive(Debug)]
pub(super) enum PostingsTable {
    /// Versions 1 and 2: every row.
    Rows(Vec<TableEntry>),
    /// Versions 3 and 4: the rows stay in the mapped file; the restarts and each name's first
    /// row are kept.
    InPlace { rows: usize, restarts: Vec<Restart>, names: Vec<(u32, usize)>, format: RowFormat },
}

impl PostingsTable {
    /// Reads a version 1 or 2 table (`name uvarint | value uvarint | offset uvarint` rows).
    pub(super) fn parse_whole(body: &[u8], symbols: usize) -> Result<Self, String> {
        let mut d = Decoder::new(body);
        let mut rows = Vec::new();
        let mut read = || -> Result<(), DecodeError> {
            let n = d.uvarint("postings table count")?;
            for _ in 0..n {
                let name = d.uvarint("label name symbol")?;
                let value = d.uvarint("label value symbol")?;
                let offset = d.uvarint("postings offset")?;
                if name >= symbols as u64 || value >= symbols as u64 {
                    return Err(DecodeError {
                        what: "postings table",
                        offset: d.offset(),
                        problem: "refers to a symbol that does not exist",
                    });
                }
                rows.push(TableEntry { name: name as u32, value: value as u32, target: offset.saturating_mul(2) });
            }
            Ok(())
        };
        read().map_err(|e| e.to_string())?;
        if !rows.windows(2).all(|w| (w[0].name, w[0].value) < (w[1].name, w[1].value)) {
            return Err("not sorted".into());
        }
        Ok(PostingsTable::Rows(rows))
    }

    /// Reads a version-3 or 4 table whose body starts at byte `start` of the file: every row is
    /// decoded and checked (symbols exist, rows sorted), the restarts and names kept.
    pub(super) fn parse_in_place(start: usize, body: &[u8], symbols: usize, format: RowFormat) -> Result<Self, String> {
        let mut d = Decoder::new(body);
        let n = d.uvarint("postings table count").map_err(|e| e.to_string())?;
        let (mut restarts, mut names) = (Vec::new(), Vec::new());
        let mut state = RowState::default();
        let mut last: Option<(u32, u32)> = None;
        for i in 0..n as usize {
            if i.is_multiple_of(TABLE_RESTART) {
                state = RowState::default();
            }
            let at = (start + d.offset()) as u64;
            let e = decode_row(&mut d, format, &mut state).map_err(|e| e.to_string())?;
            if e.name as usize >= symbols || e.value as usize >= symbols {
                return Err(format!("row {i} refers to a symbol that does not exist"));
            }
            if last.is_some_and(|l| l >= (e.name, e.value)) {
                return Err("not sorted".into());
            }
            if i.is_multiple_of(TABLE_RESTART) {
                restarts.push(Restart { offset: at, value: e.value });
            }
            if last.is_none_or(|l| l.0 != e.name) {
                names.push((e.name, i));
            }
            last = Some((e.name, e.value));
        }
        if !d.is_empty() {
            return Err("bytes after the last row".into());
        }
        Ok(PostingsTable::InPlace { rows: n as usize, restarts, names, format })
    }

    pub(super) fn len(&self) -> usize {
        match self {
            PostingsTable::Rows(r) => r.len(),
            PostingsTable::InPlace { rows, .. } => *rows,
        }
    }

    /// The label name ids, ascending.
    pub(super) fn names(&self) -> Vec<u32> {
        match self {
            PostingsTable::Rows(r) => {
                let mut out: Vec<u32> = r.iter().map(|e| e.name).collect();
                out.dedup();
                out
            }
            PostingsTable::InPlace { names, .. } => names.iter().map(|n| n.0).collect(),
        }
    }

    /// The rows of name `name`.
    pub(super) fn name_rows(&self, name: u32) -> Range<usize> {
        match self {
            PostingsTable::Rows(r) => r.partition_point(|e| e.name < name)..r.partition_point(|e| e.name <= name),
            PostingsTable::InPlace { rows, names, .. } => match names.binary_search_by_key(&name, |n| n.0) {
                Ok(i) => names[i].1..names.get(i + 1).map_or(*rows, |n| n.1),
                Err(_) => 0..0,
            },
        }
    }

    /// Rows `range`, in order.
    pub(super) fn rows<'a>(&'a self, map: &'a [u8], range: Range<usize>) -> RowIter<'a> {
        let range = range.start.min(self.len())..range.end.min(self.len());
        let mut it =
            RowIter { table: self, map, next: range.start, end: range.end, d: None, state: RowState::default() };
        if let PostingsTable::InPlace { restarts, .. } = self {
            if range.start < range.end {
                // From the restart at or before the first row, skipping to it.
                let k = range.start / TABLE_RESTART;
                it.d = Some(Decoder::new(&map[restarts[k].offset as usize..]));
                it.next = k * TABLE_RESTART;
                for _ in it.next..range.start {
                    it.next();
                }
            }
        }
        it
    }

    /// The row of pair (`name`, `value`), if any.
    pub(super) fn find(&self, map: &[u8], name: u32, value: u32) -> Option<TableEntry> {
        let range = self.name_rows(name);
        match self {
            PostingsTable::Rows(r) => {
                r[range.clone()].binary_search_by_key(&value, |e| e.value).ok().map(|i| r[range.start + i])
            }
            PostingsTable::InPlace { restarts, .. } => {
                // The last restart inside the name's rows at or before the value, then a walk.
                let first = range.start.div_ceil(TABLE_RESTART);
                let last = range.end.div_ceil(TABLE_RESTART);
                let k = first + restarts[first..last].partition_point(|r| r.value <= value);
                let from = if k > first { (k - 1) * TABLE_RESTART } else { range.start };
                self.rows(map, from..range.end).take_while(|e| e.value <= value).find(|e| e.value == value)
            }
        }
    }
}

/// Rows of a postings table, decoded as they come (version 3) or copied (versions 1 and 2).
pub(super) struct RowIter<'a> {
    table: &'a PostingsTable,
    map: &'a [u8],
    next: usize,
    end: usize,
    d: Option<Decoder<'a>>,
    state: RowState,
}

impl Iterator for RowIter<'_> {
    type Item = TableEntry;

    fn next(&mut self) -> Option<TableEntry> {
        if self.next >= self.end {
            return None;
        }
        let row = self.next;
        self.next += 1;
        match self.table {
            PostingsTable::Rows(r) => Some(r[row]),
            PostingsTable::InPlace { restarts, format, .. } => {
                if row.is_multiple_of(TABLE_RESTART) {
                    self.state = RowState::default();
                    self.d = Some(Decoder::new(&self.map[restarts[row / TABLE_RESTART].offset as usize..]));
                }
                // Every row decoded when the table was opened: an error here is not possible
                // short of the mapped file changing; the rows end there.
                let e = decode_row(self.d.as_mut()?, *format, &mut self.state).ok();
                if e.is_none() {
                    self.next = self.end;
                }
                e
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Rows come back whole, by range and by pair; pairs that are not rows are not found.
        #[test]
        fn rows_read_back_by_range_and_pair(
            pairs in prop::collection::btree_set((0u32..6, 0u32..400), 0..300),
            // u64::MAX: the series after the previous single's, so next rows mix with the others.
            targets in prop::collection::vec(prop_oneof![(0u64..1 << 33).prop_map(|o| o << 1), (0u64..5000).prop_map(|id| id << 1 | 1), Just(u64::MAX)], 300),
            from in 0usize..300,
            len in 0usize..80,
            format in prop_oneof![Just(RowFormat::Deltas), Just(RowFormat::NextRows)],
        ) {
            let mut last_single = 0u64;
            let rows: Vec<TableEntry> = pairs
                .iter()
                .zip(&targets)
                .map(|(&(name, value), &target)| {
                    let target = if target == u64::MAX { (last_single + 1) << 1 | 1 } else { target };
                    if target & 1 == 1 {
                        last_single = target >> 1;
                    }
                    TableEntry { name, value, target }
                })
                .collect();
            let mut body = Vec::new();
            encode(&rows, format, &mut body);
            let t = PostingsTable::parse_in_place(0, &body, 400, format).unwrap();
            prop_assert_eq!(t.rows(&body, 0..rows.len()).collect::<Vec<_>>(), rows.clone());
            let range = from.min(rows.len())..(from + len).min(rows.len());
            prop_assert_eq!(t.rows(&body, range.clone()).collect::<Vec<_>>(), rows[range].to_vec());
            let mut names: Vec<u32> = rows.iter().map(|e| e.name).collect();
            names.dedup();
            prop_assert_eq!(t.names(), names);
            for name in 0..7 {
                let want: Vec<TableEntry> = rows.iter().filter(|e| e.name == name).copied().collect();
                prop_assert_eq!(t.rows(&body, t.name_rows(name)).collect::<Vec<_>>(), want);
                for value in [0, 1, 57, 200, 399, 400] {
                    prop_assert_eq!(t.find(&body, name, value), rows.iter().find(|e| (e.name, e.value) == (name, value)).copied());
                }
            }
            for e in rows.iter().step_by(7) {
                prop_assert_eq!(t.find(&body, e.name, e.value), Some(*e));
            }
        }
    }

    #[test]
    fn damaged_tables_are_refused_with_the_reason() {
        let rows = [TableEntry { name: 0, value: 3, target: 1 }, TableEntry { name: 0, value: 5, target: 8 }];
        let mut body = Vec::new();
        encode(&rows, RowFormat::NextRows, &mut body);
        assert!(PostingsTable::parse_in_place(0, &body, 4, RowFormat::NextRows)
            .unwrap_err()
            .contains("symbol that does not exist"));
        body.push(0);
        assert!(PostingsTable::parse_in_place(0, &body, 6, RowFormat::NextRows).unwrap_err().contains("bytes after"));
        // A next row needs a row before it.
        assert!(PostingsTable::parse_in_place(0, &[1, 0], 6, RowFormat::NextRows).unwrap_err().contains("next row"));
    }

    /// Consecutive paths held by consecutive series (a Graphite block) take a byte a row.
    #[test]
    fn next_rows_take_a_byte() {
        let rows: Vec<TableEntry> =
            (0..1000u32).map(|i| TableEntry { name: 0, value: 1 + i, target: (i as u64) << 1 | 1 }).collect();
        let (mut v3, mut v4) = (Vec::new(), Vec::new());
        encode(&rows, RowFormat::Deltas, &mut v3);
        encode(&rows, RowFormat::NextRows, &mut v4);
        // The count, a byte per row, and at most four more for each of the 32 restarts.
        assert!(v4.len() <= 2 + 1000 + 32 * 4, "{}", v4.len());
        assert!(v3.len() > 2 * v4.len(), "{} against {}", v3.len(), v4.len());
        let t = PostingsTable::parse_in_place(0, &v4, 1001, RowFormat::NextRows).unwrap();
        assert_eq!(t.rows(&v4, 0..1000).collect::<Vec<_>>(), rows);
        assert_eq!(t.find(&v4, 0, 777), Some(rows[776]));
    }
}
