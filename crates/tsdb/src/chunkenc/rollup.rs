//! The rollup chunk (encoding 0x06): a run of one series' rollup buckets, stored as columns.
//!
//! Each aggregate is a column of its own, and each column is a dense chunk (`dense`): the
//! bucket ends are an exact grid (a few bytes per column for a whole chunk), counts and
//! changes are small integers, sums and extremes of decimal samples are decimals, and every
//! column gets the representation that suits it. The first and last sample columns carry the
//! samples' own timestamps. A reader that needs one aggregate (`last` for a plain selector,
//! `sum` and `count` for an average) decodes only those columns.
//!
//! Layout: `[0x06][bucket count u16 BE]`, then for each column in `Column` order its length as
//! an unsigned LEB128 varint and its bytes (`encoding::put_bytes`); the last two (a Graphite
//! archive's values) only in chunks where some bucket keeps one. The min and max columns may
//! repeat the first and last values instead, with patches (`Column::repeats`). The byte layout
//! is in `docs/format/rollup.md`.

use strata_model::Sample;

use super::dense::{self, ValueSink};
use super::{ChunkError, Encoding, HEADER_BYTES, SAMPLES_MAX};
use crate::encoding::{put_bytes, Decoder};
use crate::rollup::{ArchiveValue, Bucket, BucketColumns};

/// The columns, in the order they are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Column {
    Count = 0,
    Sum = 1,
    Min = 2,
    Max = 3,
    /// At the first sample's timestamp.
    First = 4,
    /// At the last sample's timestamp.
    Last = 5,
    /// What counter resets add to `last - first` (`Bucket::reset_correction`).
    ResetCorrection = 6,
    Changes = 7,
    Resets = 8,
    /// Whether the bucket has a Graphite archive value (`ArchiveValue`: 0 not kept, 1 unknown,
    /// 2 a value). This column and the next are written only when some bucket keeps one.
    ArchiveState = 9,
    /// The archive value (0 where there is none).
    Archive = 10,
}

pub const COLUMNS: usize = 11;
/// Columns every chunk holds; the archive pair follows only in chunks that keep archive values.
const COLUMNS_ALWAYS: usize = 9;

impl Column {
    pub const ALL: [Column; COLUMNS] = [
        Column::Count,
        Column::Sum,
        Column::Min,
        Column::Max,
        Column::First,
        Column::Last,
        Column::ResetCorrection,
        Column::Changes,
        Column::Resets,
        Column::ArchiveState,
        Column::Archive,
    ];

    fn of(self, b: &Bucket) -> Sample {
        let at_end = |v: f64| Sample { t: b.end, v };
        match self {
            Column::Count => at_end(b.count as f64),
            Column::Sum => at_end(b.sum),
            Column::Min => at_end(b.min),
            Column::Max => at_end(b.max),
            Column::First => b.first,
            Column::Last => b.last,
            Column::ResetCorrection => at_end(b.reset_correction),
            Column::Changes => at_end(b.changes as f64),
            Column::Resets => at_end(b.resets as f64),
            Column::ArchiveState => at_end(match b.archive {
                ArchiveValue::NotKept => 0.0,
                ArchiveValue::Unknown => 1.0,
                ArchiveValue::Value(_) => 2.0,
            }),
            Column::Archive => at_end(match b.archive {
                ArchiveValue::Value(v) => v,
                _ => 0.0,
            }),
        }
    }
}

/// Which columns a reader wants (bit `c` for `Column` `c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnSet(u16);

impl ColumnSet {
    pub const ALL: ColumnSet = ColumnSet((1 << COLUMNS) - 1);

    /// The aggregates `columns` name (the bucket ends come with every read: they are the count
    /// column's timestamps, read without its counts where `Count` is not asked for); the
    /// archive values need their states.
    pub fn of(columns: &[Column]) -> ColumnSet {
        let mut set = columns.iter().fold(0, |m, &c| m | 1 << c as u16);
        if set & (1 << Column::Archive as u16) != 0 {
            set |= 1 << Column::ArchiveState as u16;
        }
        ColumnSet(set)
    }

    pub fn has(self, c: Column) -> bool {
        self.0 & (1 << c as u16) != 0
    }
}

/// Encodes `buckets` (1..=`SAMPLES_MAX`, ends strictly increasing) as a rollup chunk.
pub fn encode(buckets: &[Bucket]) -> Vec<u8> {
    assert!(!buckets.is_empty() && buckets.len() <= SAMPLES_MAX, "a rollup chunk holds 1..={SAMPLES_MAX} buckets");
    debug_assert!(buckets.windows(2).all(|p| p[0].end < p[1].end && p[0].last.t < p[1].first.t));
    let mut out = vec![Encoding::Rollup as u8];
    out.extend_from_slice(&(buckets.len() as u16).to_be_bytes());
    let mut column = Vec::with_capacity(buckets.len());
    let archived = buckets.iter().any(|b| b.archive != ArchiveValue::NotKept);
    for c in Column::ALL.into_iter().take(if archived { COLUMNS } else { COLUMNS_ALWAYS }) {
        let repeats = c.repeats(buckets);
        if repeats.as_ref().is_some_and(|r| r.is_empty()) {
            put_bytes(&mut out, &[]);
            continue;
        }
        column.clear();
        column.extend(buckets.iter().map(|b| c.of(b)));
        let dense = dense::encode(&column);
        match repeats {
            Some(patched) if patched.len() < dense.len() => put_bytes(&mut out, &patched),
            _ => put_bytes(&mut out, &dense),
        }
    }
    out
}

/// The first byte of a min or max column written as the first or last values with patches
/// (`Column::repeats`); a dense chunk's is `Encoding::Dense`.
const REPEATS_PATCHED: u8 = 0x80;

/// A column that may be written as another's values (`Column::repeats`): the min as the
/// first samples' values, the max as the last samples'.
#[derive(Clone, Copy)]
struct Repeat {
    /// The column whose values it repeats.
    of: Column,
    /// A bucket's value in this column, and in the repeated one.
    value: fn(&Bucket) -> f64,
    repeated: fn(&Bucket) -> f64,
}

impl Column {
    /// How the column repeats another, for the min and max columns; `None` for the others.
    fn repeat(self) -> Option<Repeat> {
        match self {
            Column::Min => Some(Repeat { of: Column::First, value: |b| b.min, repeated: |b| b.first.v }),
            Column::Max => Some(Repeat { of: Column::Last, value: |b| b.max, repeated: |b| b.last.v }),
            _ => None,
        }
    }

    /// The min column as the first values, the max column as the last values, with the
    /// buckets where they differ (bit for bit) patched: empty where none does, else
    /// `[REPEATS_PATCHED][patches uvarint]` and per patch its bucket's index (the first as
    /// itself, each later one as its distance from the one before) and the value's 64 bits
    /// (little-endian). `None` for the other columns. A counter's buckets rise from their
    /// first sample to their last but where it resets: its min and max columns were a quarter
    /// of its tier bytes and repeated two others, where a chunk of a 1 h tier (up to 240
    /// buckets) now holds a patch or two.
    fn repeats(self, buckets: &[Bucket]) -> Option<Vec<u8>> {
        let Repeat { value, repeated, .. } = self.repeat()?;
        let differ = |b: &&Bucket| value(b).to_bits() != repeated(b).to_bits();
        let patches = buckets.iter().filter(differ).count();
        let mut out = Vec::new();
        if patches == 0 {
            return Some(out);
        }
        out.push(REPEATS_PATCHED);
        crate::encoding::put_uvarint(&mut out, patches as u64);
        let mut prev = 0;
        for (j, b) in buckets.iter().enumerate().filter(|(_, b)| differ(b)) {
            crate::encoding::put_uvarint(&mut out, (j - prev) as u64);
            out.extend_from_slice(&value(b).to_bits().to_le_bytes());
            prev = j;
        }
        Some(out)
    }
}

fn corrupt(what: &str) -> ChunkError {
    ChunkError::Corrupt(format!("rollup chunk: {what}"))
}

/// An integer column value back from its float (counts are exact below 2^53).
#[inline(always)]
fn count_of(v: f64) -> Result<u64, ChunkError> {
    // Cast there and back rather than `fract`, which baseline x86-64 (no SSE4.1 rounding)
    // computes in software: it was a tenth of decoding a Graphite tier's chunks. Through i64,
    // which it converts in one instruction (u64 takes a branch and two conversions: 6% of a
    // tier read's CPU). A NaN casts to 0, and an infinity to the end of i64: neither comes back.
    let count = count_bits(v);
    if (0..1 << 53).contains(&count) && count as f64 == v {
        Ok(count as u64)
    } else {
        Err(corrupt("count column holds a value that is no count"))
    }
}

/// A count column's value as an integer (`count_of` checks it).
#[inline(always)]
fn count_bits(v: f64) -> i64 {
    v as i64
}

/// Appends the whole numbers `ints` to `out` as counts; false if any is no count: the check
/// `is_count` makes of a float, for the float `i` converts to exactly below 2^53 (from there
/// on it is no count either way).
#[inline(always)]
fn push_int_counts(out: &mut Vec<u64>, ints: &[i64]) -> bool {
    // Two passes, each a vector loop: checked in the copy, the flag was stored back at every
    // value (the copy's loop is not inlined here, so it held the flag through a pointer), a
    // tenth of an average's tier read. A negative integer is a huge `u64`.
    out.extend(ints.iter().map(|&i| i as u64));
    ints.iter().fold(true, |whole, &i| whole & ((i as u64) < 1 << 53))
}

/// Whether `v` is a count (`count_of`), as a flag: folded over a whole column, the check does
/// not stop at the first value that is not (which only damage has) and stays out of the way of
/// the loop around it.
#[inline(always)]
fn is_count(v: f64) -> bool {
    count_of(v).is_ok()
}

/// The count column, which makes the buckets: each one's end (the column's timestamps) and
/// count (taken as the changes and resets columns take theirs).
struct NewBuckets<'a> {
    ends: &'a mut Vec<i64>,
    counts: PushCounts<'a>,
}

impl ValueSink for NewBuckets<'_> {
    #[inline(always)]
    fn extend(&mut self, times: &[i64], values: impl Iterator<Item = f64>) {
        self.ends.extend_from_slice(times);
        self.counts.extend(times, values);
    }

    #[inline(always)]
    fn extend_ints(&mut self, times: &[i64], ints: &[i64]) {
        self.ends.extend_from_slice(times);
        self.counts.extend_ints(times, ints);
    }

    fn patch(&mut self, j: usize, v: f64) {
        self.counts.patch(j, v);
    }
}

/// The first or last sample column: each bucket's sample, with its own timestamp.
struct PushSamples<'a> {
    out: &'a mut Vec<Sample>,
    start: usize,
}

impl ValueSink for PushSamples<'_> {
    #[inline(always)]
    fn extend(&mut self, times: &[i64], values: impl Iterator<Item = f64>) {
        self.out.extend(times.iter().zip(values).map(|(&t, v)| Sample { t, v }));
    }

    fn patch(&mut self, j: usize, v: f64) {
        self.out[self.start + j].v = v;
    }
}

/// The sum, min, max and reset correction columns.
struct PushValues<'a> {
    out: &'a mut Vec<f64>,
    start: usize,
}

impl ValueSink for PushValues<'_> {
    #[inline(always)]
    fn extend(&mut self, _times: &[i64], values: impl Iterator<Item = f64>) {
        self.out.extend(values);
    }

    fn patch(&mut self, j: usize, v: f64) {
        self.out[self.start + j] = v;
    }
}

/// The changes and resets columns: integers, checked to be counts.
struct PushCounts<'a> {
    out: &'a mut Vec<u64>,
    start: usize,
    whole: bool,
}

impl ValueSink for PushCounts<'_> {
    #[inline(always)]
    fn extend(&mut self, _times: &[i64], values: impl Iterator<Item = f64>) {
        let mut whole = true;
        self.out.extend(values.map(|v| {
            whole &= is_count(v);
            count_bits(v) as u64
        }));
        self.whole &= whole;
    }

    #[inline(always)]
    fn extend_ints(&mut self, _times: &[i64], ints: &[i64]) {
        self.whole &= push_int_counts(self.out, ints);
    }

    fn patch(&mut self, j: usize, v: f64) {
        self.whole &= is_count(v);
        self.out[self.start + j] = count_bits(v) as u64;
    }
}

/// The archive state column (0 not kept, 1 unknown, 2 a value, set by the next column).
struct ArchiveStates<'a> {
    out: &'a mut Vec<ArchiveValue>,
    start: usize,
    states: bool,
}

impl ArchiveStates<'_> {
    fn state(v: f64) -> Option<ArchiveValue> {
        match count_of(v) {
            Ok(0) => Some(ArchiveValue::NotKept),
            Ok(1) => Some(ArchiveValue::Unknown),
            Ok(2) => Some(ArchiveValue::Value(0.0)),
            _ => None,
        }
    }
}

impl ValueSink for ArchiveStates<'_> {
    fn extend(&mut self, _times: &[i64], values: impl Iterator<Item = f64>) {
        let mut states = true;
        self.out.extend(values.map(|v| {
            let s = ArchiveStates::state(v);
            states &= s.is_some();
            s.unwrap_or_default()
        }));
        self.states &= states;
    }

    fn patch(&mut self, j: usize, v: f64) {
        let s = ArchiveStates::state(v);
        self.states &= s.is_some();
        self.out[self.start + j] = s.unwrap_or_default();
    }
}

/// The archive value column, into the states its buckets have (the values of those without
/// one are zero, and dropped).
struct ArchiveValues<'a> {
    out: &'a mut [ArchiveValue],
    taken: usize,
}

impl ArchiveValues<'_> {
    fn set(a: &mut ArchiveValue, v: f64) {
        if let ArchiveValue::Value(x) = a {
            *x = v;
        }
    }
}

impl ValueSink for ArchiveValues<'_> {
    fn extend(&mut self, _times: &[i64], values: impl Iterator<Item = f64>) {
        for v in values {
            if let Some(a) = self.out.get_mut(self.taken) {
                ArchiveValues::set(a, v);
            }
            self.taken += 1;
        }
    }

    fn patch(&mut self, j: usize, v: f64) {
        ArchiveValues::set(&mut self.out[j], v);
    }
}

/// Fills a min or max column written as repeats (`Column::repeats`): `repeated`'s values (the
/// first or last samples of the same buckets), with the patches.
fn fill_repeats(c: Column, repeated: &[Sample], column: &[u8], out: &mut Vec<f64>) -> Result<(), ChunkError> {
    let start = out.len();
    out.extend(repeated.iter().map(|s| s.v));
    let values = &mut out[start..];
    let Some(patches) = column.get(1..) else { return Ok(()) };
    let damaged = |what: &str| corrupt(&format!("column {c:?}: {what}"));
    let mut d = Decoder::new(patches);
    let count = d.uvarint("patch count").map_err(|e| damaged(&e.to_string()))?;
    if count == 0 || count > values.len() as u64 {
        return Err(damaged("patch count out of range"));
    }
    let mut j = 0u64;
    for x in 0..count {
        let gap = d.uvarint("patch index").map_err(|e| damaged(&e.to_string()))?;
        if x > 0 && gap == 0 {
            return Err(damaged("patches out of order"));
        }
        j = j
            .checked_add(gap)
            .filter(|&j| j < values.len() as u64)
            .ok_or_else(|| damaged("patch index out of range"))?;
        let bits = d.u64_le("patch value").map_err(|e| damaged(&e.to_string()))?;
        values[j as usize] = f64::from_bits(bits);
    }
    if !d.is_empty() {
        return Err(damaged("bytes after the last patch"));
    }
    Ok(())
}

/// The bucket count a rollup chunk's header gives (0 for bytes that are no rollup chunk:
/// `decode` says what is wrong with them). For sizing buffers; nothing is checked.
pub fn bucket_count(data: &[u8]) -> usize {
    match data {
        [enc, hi, lo, ..] if *enc == Encoding::Rollup as u8 => u16::from_be_bytes([*hi, *lo]) as usize,
        _ => 0,
    }
}

/// Decodes the buckets of a rollup chunk into `out` (appended): the columns in `want` (and the
/// bucket ends); the others are left zero, except the first sample, which is the last one
/// where only that is wanted (`BucketColumns::bucket`). Every column's length and bucket count
/// is checked; on error `out` is as it was.
pub fn decode(data: &[u8], want: ColumnSet, out: &mut Vec<Bucket>) -> Result<(), ChunkError> {
    thread_local! {
        static COLUMNS: std::cell::RefCell<BucketColumns> = std::cell::RefCell::new(BucketColumns::default());
    }
    COLUMNS.with_borrow_mut(|columns| {
        columns.reset(want);
        decode_columns(data, columns)?;
        out.extend(columns.iter());
        Ok(())
    })
}

/// Decodes the buckets of a rollup chunk into `out` (appended), the columns it holds
/// (`BucketColumns::columns`) and no others. Every column's length and bucket count is
/// checked; on error `out` is as it was.
pub fn decode_columns(data: &[u8], out: &mut BucketColumns) -> Result<(), ChunkError> {
    if data.len() < HEADER_BYTES {
        return Err(ChunkError::ShortHeader(data.len()));
    }
    if data[0] != Encoding::Rollup as u8 {
        return Err(corrupt("not a rollup chunk"));
    }
    let n = u16::from_be_bytes([data[1], data[2]]) as usize;
    let start = out.len();
    out.reserve(n);
    let held = out.columns;
    let decoded = decode_columns_at(data, n, held, start, out);
    debug_assert!(decoded.is_err() || out.is_consistent(), "every column held was decoded");
    // Nothing of a damaged chunk is kept.
    if decoded.is_err() {
        out.truncate(start);
    }
    decoded
}

fn decode_columns_at(
    data: &[u8],
    n: usize,
    held: ColumnSet,
    start: usize,
    out: &mut BucketColumns,
) -> Result<(), ChunkError> {
    let mut columns = Decoder::new(&data[HEADER_BYTES..]);
    // Min or max columns written as repeats of the first or last samples, filled once those
    // are read; and those samples where they are not held themselves.
    let mut repeating: Vec<(Column, &[u8])> = Vec::new();
    let (mut first_scratch, mut last_scratch) = (None::<Vec<Sample>>, None::<Vec<Sample>>);
    // The count column and where its timestamps (the bucket ends) end: the columns stamped at
    // the ends hold the same bits there, and step over them (`dense::decode_values_into`).
    let mut ends: (&[u8], usize) = (&[], 0);
    let no_count = |c: Column| corrupt(&format!("{c:?} column holds a value that is no count"));
    for c in Column::ALL {
        // Chunks without archive values end after the ninth column.
        if c == Column::ArchiveState && columns.is_empty() {
            break;
        }
        let len = columns.uvarint("column length").map_err(|e| corrupt(&e.to_string()))? as usize;
        let column = columns.bytes(len, "column").map_err(|e| corrupt(&e.to_string()))?;
        if column.first().is_none_or(|&b| b == REPEATS_PATCHED) {
            let Some(repeat) = c.repeat() else {
                return Err(corrupt(&format!("column {c:?} is neither a dense chunk nor repeats another")));
            };
            if held.has(c) {
                if !held.has(repeat.of) {
                    match repeat.of {
                        Column::First => first_scratch = Some(Vec::with_capacity(n)),
                        _ => last_scratch = Some(Vec::with_capacity(n)),
                    }
                }
                repeating.push((c, column));
            }
            continue;
        }
        let scratch = match c {
            Column::First => first_scratch.as_mut(),
            Column::Last => last_scratch.as_mut(),
            _ => None,
        };
        // The ends (the count column's timestamps) are always read.
        if !held.has(c) && c != Column::Count && scratch.is_none() {
            continue;
        }
        if column.len() < HEADER_BYTES || column[0] != Encoding::Dense as u8 {
            return Err(corrupt("column is not a dense chunk"));
        }
        if u16::from_be_bytes([column[1], column[2]]) as usize != n {
            return Err(corrupt("column holds another bucket count"));
        }
        let damaged = |e: ChunkError| corrupt(&format!("column {c:?}: {e}"));
        let values = |out: &mut Vec<f64>| {
            dense::decode_values_into(column, ends, &mut PushValues { start: out.len(), out }).map_err(damaged)
        };
        let counts = |out: &mut Vec<u64>| {
            let mut sink = PushCounts { start: out.len(), out, whole: true };
            dense::decode_values_into(column, ends, &mut sink).map_err(damaged)?;
            if !sink.whole {
                return Err(no_count(c));
            }
            Ok(())
        };
        // Each column is decoded straight into its vector, one loop per column.
        match c {
            // The ends, with the counts where the reader wants them (their length is checked
            // with the other columns' below).
            Column::Count => {
                let times_end = if held.has(Column::Count) {
                    let counts = PushCounts { out: &mut out.counts, start, whole: true };
                    let mut sink = NewBuckets { ends: &mut out.ends, counts };
                    let times_end = dense::decode_into(column, &mut sink).map_err(damaged)?;
                    if !sink.counts.whole {
                        return Err(no_count(c));
                    }
                    times_end
                } else {
                    dense::decode_times_into(column, &mut out.ends).map_err(damaged)?
                };
                ends = (column, times_end);
                if out.ends.len() - start != n {
                    return Err(corrupt("count column holds another bucket count"));
                }
            }
            Column::First | Column::Last => {
                let samples = match (scratch, c) {
                    (Some(s), _) => s,
                    (None, Column::First) => &mut out.firsts,
                    (None, _) => &mut out.lasts,
                };
                dense::decode_into(column, &mut PushSamples { start: samples.len(), out: samples }).map_err(damaged)?;
            }
            Column::Sum => values(&mut out.sums)?,
            Column::Min => values(&mut out.mins)?,
            Column::Max => values(&mut out.maxs)?,
            Column::ResetCorrection => values(&mut out.reset_corrections)?,
            Column::Changes => counts(&mut out.changes)?,
            Column::Resets => counts(&mut out.resets)?,
            Column::ArchiveState => {
                let mut sink = ArchiveStates { out: &mut out.archives, start, states: true };
                dense::decode_values_into(column, ends, &mut sink).map_err(damaged)?;
                if !sink.states {
                    return Err(corrupt("archive state column holds no state"));
                }
            }
            Column::Archive => {
                let states = out.archives.get_mut(start..).unwrap_or_default();
                let mut sink = ArchiveValues { out: states, taken: 0 };
                dense::decode_values_into(column, ends, &mut sink).map_err(damaged)?;
                if sink.taken != n {
                    return Err(corrupt("archive column holds another bucket count"));
                }
            }
        }
    }
    if !columns.is_empty() {
        return Err(corrupt("bytes after the last column"));
    }
    for (c, column) in repeating {
        let (repeated, into) = match c {
            Column::Min => (first_scratch.as_deref().unwrap_or_else(|| &out.firsts[start..]), &mut out.mins),
            _ => (last_scratch.as_deref().unwrap_or_else(|| &out.lasts[start..]), &mut out.maxs),
        };
        if repeated.len() != n {
            return Err(corrupt(&format!("column {c:?} repeats a column that was not read whole")));
        }
        fill_repeats(c, repeated, column, into)?;
    }
    // Every column held, as long as the ends (a chunk from an older writer may lack the
    // archive columns: none kept).
    if held.has(Column::ArchiveState) && out.archives.len() == start {
        out.archives.resize(start + n, ArchiveValue::NotKept);
    }
    let whole = |len: usize, c: Column| {
        if held.has(c) && len != start + n {
            Err(corrupt(&format!("column {c:?} holds another bucket count")))
        } else {
            Ok(())
        }
    };
    whole(out.counts.len(), Column::Count)?;
    whole(out.sums.len(), Column::Sum)?;
    whole(out.mins.len(), Column::Min)?;
    whole(out.maxs.len(), Column::Max)?;
    whole(out.firsts.len(), Column::First)?;
    whole(out.lasts.len(), Column::Last)?;
    whole(out.reset_corrections.len(), Column::ResetCorrection)?;
    whole(out.changes.len(), Column::Changes)?;
    whole(out.resets.len(), Column::Resets)?;
    whole(out.archives.len(), Column::ArchiveState)?;
    let ends = &out.ends[start..];
    if held.has(Column::First) && out.firsts[start..].iter().zip(ends).any(|(s, &end)| s.t > end) {
        return Err(corrupt("a first sample after its bucket's end"));
    }
    if held.has(Column::Last) && out.lasts[start..].iter().zip(ends).any(|(s, &end)| s.t > end) {
        return Err(corrupt("a last sample after its bucket's end"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use strata_model::Sample;

    use super::*;
    use crate::rollup::aggregate;

    /// A counter's min and max columns repeat its first and last values: read alone, into
    /// columns, they are filled from those (not held themselves), with the patches.
    #[test]
    fn repeated_extremes_read_alone_into_columns() {
        let mut v = 0.0;
        let samples: Vec<Sample> = (0..4000)
            .map(|i| {
                v = if i % 700 == 699 { 1.0 } else { v + (i % 7) as f64 };
                Sample { t: i * 15_000 + 1, v }
            })
            .collect();
        let buckets = aggregate(&samples, 300_000);
        let chunk = encode(&buckets[..200]);
        for c in [Column::Min, Column::Max] {
            let set = ColumnSet::of(&[c]);
            let mut columns = BucketColumns::new(set);
            decode_columns(&chunk, &mut columns).unwrap();
            assert!(columns.is_consistent() && columns.lasts().is_empty() && columns.firsts().is_empty());
            assert_eq!(columns, BucketColumns::from_buckets(&buckets[..200], set), "{c:?}");
        }
        let lengths = column_lengths(&chunk);
        assert!(lengths[Column::Min as usize] < 100 && lengths[Column::Max as usize] < 100, "repeats: {lengths:?}");
    }

    #[test]
    fn counts_are_whole_non_negative_and_exact() {
        for (v, want) in
            [(0.0, Some(0)), (-0.0, Some(0)), (3.0, Some(3)), (9_007_199_254_740_991.0, Some((1 << 53) - 1))]
        {
            assert_eq!(count_of(v).ok(), want, "{v}");
        }
        for v in [2.5, -1.0, f64::NAN, f64::INFINITY, 9_007_199_254_740_992.0, 1e300, 0.1] {
            assert!(count_of(v).is_err(), "{v}");
        }
    }

    /// A counter's buckets without resets rise from their first sample to their last: the
    /// min and max columns are left empty, and every read gives them back; one reset inside a
    /// bucket makes the min column that bucket's patch (its min is no longer its first value).
    #[test]
    fn a_counters_extremes_are_its_first_and_last_values() {
        let mut counter = 0.0;
        let samples: Vec<Sample> = (0..600)
            .map(|i| {
                counter += (i * 13 % 21) as f64;
                Sample { t: 1_700_000_000_000 + i * 60_000 + i % 7, v: counter }
            })
            .collect();
        let buckets = aggregate(&samples, 300_000);
        let chunk = encode(&buckets);
        let lengths = column_lengths(&chunk);
        assert_eq!((lengths[Column::Min as usize], lengths[Column::Max as usize]), (0, 0));
        for want in [ColumnSet::ALL, ColumnSet::of(&[Column::Min]), ColumnSet::of(&[Column::Max, Column::Sum])] {
            let mut back = Vec::new();
            decode(&chunk, want, &mut back).unwrap();
            assert_eq!(back.len(), buckets.len());
            for (a, b) in back.iter().zip(&buckets) {
                assert_eq!(a.min.to_bits(), if want.has(Column::Min) { b.min.to_bits() } else { 0 });
                assert_eq!(a.max.to_bits(), if want.has(Column::Max) { b.max.to_bits() } else { 0 });
            }
        }
        let mut reset = samples.clone();
        // Inside a bucket, not its first sample.
        reset[303].v = 0.0;
        let buckets = aggregate(&reset, 300_000);
        let chunk = encode(&buckets);
        let lengths = column_lengths(&chunk);
        // The marker, one patch, its index (one byte) and value.
        assert_eq!(lengths[Column::Min as usize], 1 + 1 + 1 + 8);
        assert_eq!(lengths[Column::Max as usize], 0);
        let mut back = Vec::new();
        decode(&chunk, ColumnSet::of(&[Column::Min]), &mut back).unwrap();
        assert_eq!(
            back.iter().map(|b| b.min.to_bits()).collect::<Vec<_>>(),
            buckets.iter().map(|b| b.min.to_bits()).collect::<Vec<_>>()
        );
        assert!(back.iter().zip(&buckets).any(|(a, b)| a.min == 0.0 && b.first.v > 0.0));
    }

    /// A damaged patch list is refused, never read past or applied out of range.
    #[test]
    fn damaged_patches_are_refused() {
        let mut counter = 0.0;
        let mut samples: Vec<Sample> = (0..60)
            .map(|i| {
                counter += 5.0;
                Sample { t: 1_700_000_000_000 + i * 60_000, v: counter }
            })
            .collect();
        samples[33].v = 1.0;
        let chunk = encode(&aggregate(&samples, 300_000));
        let lengths = column_lengths(&chunk);
        let min_len = lengths[Column::Min as usize];
        assert_eq!(min_len, 11);
        // Where the min column's bytes start: after the count and sum columns and its length.
        let at = HEADER_BYTES + 1 + lengths[0] + 1 + lengths[1] + 1;
        assert_eq!(chunk[at], REPEATS_PATCHED);
        for (offset, byte, what) in
            [(1, 0, "patch count out of range"), (1, 2, "patch index"), (2, 200, "patch index out of range")]
        {
            let mut damaged = chunk.clone();
            damaged[at + offset] = byte;
            let err = decode(&damaged, ColumnSet::of(&[Column::Min]), &mut Vec::new()).unwrap_err();
            assert!(err.to_string().contains(what), "{err}");
        }
    }

    /// Only the min and max columns may be empty; any other is damage.
    #[test]
    fn an_empty_column_other_than_the_extremes_is_damage() {
        let buckets = aggregate(&[Sample { t: 1000, v: 1.5 }, Sample { t: 2000, v: 2.5 }], 60_000);
        let chunk = encode(&buckets);
        let lengths = column_lengths(&chunk);
        // Rebuild it with the sum column empty.
        let mut damaged = chunk[..HEADER_BYTES].to_vec();
        let mut at = HEADER_BYTES;
        for (c, &len) in Column::ALL.iter().zip(&lengths) {
            let mut d = Decoder::new(&chunk[at..]);
            d.uvarint("len").unwrap();
            let body = d.bytes(len, "column").unwrap();
            at = chunk.len() - d.remaining();
            put_bytes(&mut damaged, if *c == Column::Sum { &[] } else { body });
        }
        let err = decode(&damaged, ColumnSet::ALL, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("column Sum is neither a dense chunk nor repeats another"), "{err}");
    }

    /// Where a chunk's ninth column ends, if its first nine column lengths fit in it.
    fn nine_columns_end(chunk: &[u8]) -> Option<usize> {
        let mut d = Decoder::new(chunk.get(HEADER_BYTES..)?);
        for _ in 0..COLUMNS_ALWAYS {
            let len = d.uvarint("len").ok()?;
            d.bytes(usize::try_from(len).ok()?, "column").ok()?;
        }
        Some(chunk.len() - d.remaining())
    }

    /// Each column's length in a chunk, in `Column` order.
    fn column_lengths(chunk: &[u8]) -> Vec<usize> {
        let mut d = Decoder::new(&chunk[HEADER_BYTES..]);
        let mut out = Vec::new();
        while !d.is_empty() {
            let len = d.uvarint("len").unwrap() as usize;
            d.bytes(len, "column").unwrap();
            out.push(len);
        }
        out
    }

    fn series() -> impl Strategy<Value = Vec<Sample>> {
        prop::collection::vec((1i64..90_000, -1000i64..100_000, 0u8..6), 1..2000).prop_map(|steps| {
            let mut t = 1_700_000_000_000i64;
            steps
                .into_iter()
                .map(|(dt, x, kind)| {
                    t += dt;
                    let v = match kind {
                        0 => x as f64 / 3.0,
                        1 => f64::NAN,
                        _ => x as f64 / 100.0,
                    };
                    Sample { t, v }
                })
                .collect()
        })
    }

    fn same(a: &Bucket, b: &Bucket) -> bool {
        let bits = |x: f64| x.to_bits();
        (a.end, a.count, a.changes, a.resets, a.first.t, a.last.t)
            == (b.end, b.count, b.changes, b.resets, b.first.t, b.last.t)
            && [a.sum, a.min, a.max, a.first.v, a.last.v, a.reset_correction].map(bits)
                == [b.sum, b.min, b.max, b.first.v, b.last.v, b.reset_correction].map(bits)
    }

    proptest! {
        #[test]
        fn buckets_round_trip_bit_for_bit(samples in series(), interval in prop::sample::select(vec![10_000i64, 60_000, 300_000])) {
            let buckets = aggregate(&samples, interval);
            let chunk = encode(&buckets);
            let mut back = Vec::new();
            decode(&chunk, ColumnSet::ALL, &mut back).unwrap();
            prop_assert_eq!(back.len(), buckets.len());
            for (a, b) in back.iter().zip(&buckets) {
                prop_assert!(same(a, b), "{:?} vs {:?}", a, b);
            }
            // One column only: the ends and that column (the counts are not read: zero).
            let mut sums = Vec::new();
            decode(&chunk, ColumnSet::of(&[Column::Sum]), &mut sums).unwrap();
            for (a, b) in sums.iter().zip(&buckets) {
                prop_assert_eq!((a.end, a.count, a.sum.to_bits()), (b.end, 0, b.sum.to_bits()));
            }
            let mut averages = Vec::new();
            decode(&chunk, ColumnSet::of(&[Column::Count, Column::Sum]), &mut averages).unwrap();
            for (a, b) in averages.iter().zip(&buckets) {
                prop_assert_eq!((a.end, a.count, a.sum.to_bits()), (b.end, b.count, b.sum.to_bits()));
            }
            // The extremes alone, whether their columns are dense or repeat (`Column::repeats`).
            for (column, pick) in [(Column::Min, (|b: &Bucket| b.min) as fn(&Bucket) -> f64), (Column::Max, |b: &Bucket| b.max)] {
                let mut alone = Vec::new();
                decode(&chunk, ColumnSet::of(&[column]), &mut alone).unwrap();
                for (a, b) in alone.iter().zip(&buckets) {
                    prop_assert_eq!((a.end, pick(a).to_bits()), (b.end, pick(b).to_bits()), "{:?}", column);
                }
            }
            // The last samples without the first: each bucket's last sample stands for both.
            let mut lasts = Vec::new();
            decode(&chunk, ColumnSet::of(&[Column::Last]), &mut lasts).unwrap();
            for (a, b) in lasts.iter().zip(&buckets) {
                prop_assert_eq!((a.end, a.last.t, a.last.v.to_bits()), (b.end, b.last.t, b.last.v.to_bits()));
                prop_assert_eq!((a.first.t, a.first.v.to_bits()), (b.last.t, b.last.v.to_bits()));
            }
            // Into columns: each column alone, and in twos, is the whole decode's (compared as
            // text: NaNs are equal there).
            for (i, &c) in Column::ALL.iter().enumerate() {
                for set in [ColumnSet::of(&[c]), ColumnSet::of(&[c, Column::ALL[(i + 3) % COLUMNS]])] {
                    let mut columns = BucketColumns::new(set);
                    decode_columns(&chunk, &mut columns).unwrap();
                    prop_assert!(columns.is_consistent(), "{:?}", set);
                    let want = BucketColumns::from_buckets(&back, set);
                    prop_assert_eq!(format!("{columns:?}"), format!("{want:?}"));
                }
            }
        }

        /// Archive values (any bit pattern) and their states come back as written; a chunk
        /// whose buckets keep none is the nine-column layout, byte for byte, and reads as
        /// keeping none.
        #[test]
        fn archive_values_round_trip(samples in series(), kinds in prop::collection::vec((0u8..3, any::<u64>()), 1..64)) {
            let mut buckets = aggregate(&samples, 60_000);
            let bare = encode(&buckets);
            for (i, b) in buckets.iter_mut().enumerate() {
                let (kind, bits) = kinds[i % kinds.len()];
                b.archive = match kind {
                    0 => ArchiveValue::NotKept,
                    1 => ArchiveValue::Unknown,
                    _ => ArchiveValue::Value(f64::from_bits(bits)),
                };
            }
            let kept = buckets.iter().any(|b| b.archive != ArchiveValue::NotKept);
            let chunk = encode(&buckets);
            prop_assert_eq!(chunk == bare, !kept);
            let mut back = Vec::new();
            decode(&chunk, ColumnSet::ALL, &mut back).unwrap();
            let bits = |a: ArchiveValue| match a {
                ArchiveValue::Value(v) => (2, v.to_bits()),
                ArchiveValue::Unknown => (1, 0),
                ArchiveValue::NotKept => (0, 0),
            };
            for (a, b) in back.iter().zip(&buckets) {
                prop_assert!(same(a, b));
                prop_assert_eq!(bits(a.archive), bits(b.archive));
            }
            // Read for the archive values alone, and without them.
            let mut only = Vec::new();
            decode(&chunk, ColumnSet::of(&[Column::Archive]), &mut only).unwrap();
            prop_assert!(only.iter().zip(&buckets).all(|(a, b)| bits(a.archive) == bits(b.archive) && a.end == b.end));
            let mut without = Vec::new();
            decode(&chunk, ColumnSet::of(&[Column::Sum]), &mut without).unwrap();
            prop_assert!(without.iter().all(|a| a.archive == ArchiveValue::NotKept));
        }

        /// Columns stamped at the bucket ends step over timestamps with the count column's
        /// bits; one whose timestamps are other bits (another writer's, or other times: a
        /// reader skips them either way) has them read through, and its values are the same.
        #[test]
        fn end_stamped_columns_with_other_timestamps_read_the_same(samples in series(), shift in 1i64..100_000, which in 0usize..6) {
            let buckets = aggregate(&samples, 60_000);
            let stamped = [Column::Sum, Column::Min, Column::Max, Column::ResetCorrection, Column::Changes, Column::Resets];
            let moved = stamped[which];
            let mut chunk = vec![Encoding::Rollup as u8];
            chunk.extend_from_slice(&(buckets.len() as u16).to_be_bytes());
            for c in Column::ALL.into_iter().take(COLUMNS_ALWAYS) {
                let mut column: Vec<Sample> = buckets.iter().map(|b| c.of(b)).collect();
                if c == moved {
                    // Later times, spread out and jittered: another integer column, other
                    // bits, most often another length (still increasing: ends are a minute apart).
                    for (j, s) in column.iter_mut().enumerate() {
                        s.t += shift * (j as i64 + 1) + (j as i64 % 5) * 3;
                    }
                }
                put_bytes(&mut chunk, &dense::encode(&column));
            }
            let mut back = Vec::new();
            decode(&chunk, ColumnSet::ALL, &mut back).unwrap();
            prop_assert_eq!(back.len(), buckets.len());
            for (a, b) in back.iter().zip(&buckets) {
                prop_assert!(same(a, b), "{:?}: {:?} vs {:?}", moved, a, b);
            }
        }

        /// Damaged bytes are an error, never a panic.
        #[test]
        fn damage_is_an_error(samples in series(), at in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
            let mut buckets = aggregate(&samples, 60_000);
            // Half the cases with archive values (the two columns after the nine).
            if byte % 2 == 0 {
                for (i, b) in buckets.iter_mut().enumerate() {
                    b.archive = if i % 3 == 0 { ArchiveValue::Unknown } else { ArchiveValue::Value(i as f64 / 7.0) };
                }
            }
            let mut chunk = encode(&buckets);
            let i = at.index(chunk.len());
            chunk[i] = byte;
            let _ = decode(&chunk, ColumnSet::ALL, &mut Vec::new());
            let short = cut.index(chunk.len());
            // A chunk with archive values cut right after its ninth column is, byte for byte, a
            // chunk without them (the layout of `docs/format/rollup.md`): it may read. A cut there
            // is caught by the chunk segment's checksum, not by the chunk's own layout.
            let nine_columns = short == nine_columns_end(&chunk).unwrap_or(usize::MAX);
            prop_assert!(
                decode(&chunk[..short], ColumnSet::ALL, &mut Vec::new()).is_err() || short == chunk.len() || nine_columns
            );
        }
    }

    /// A count, changes or resets column holding a value that is no count (a fraction, a
    /// negative, NaN, 2^53; anywhere in the chunk) is damage, and nothing of the chunk is kept.
    #[test]
    fn counts_that_are_no_counts_are_damage() {
        let samples: Vec<Sample> =
            (0..3000).map(|i| Sample { t: 1_700_000_000_000 + i * 15_000, v: ((i * 7) % 50) as f64 }).collect();
        let buckets = aggregate(&samples, 60_000);
        let chunk_with = |bad: Option<(Column, usize, f64)>| {
            let mut chunk = vec![Encoding::Rollup as u8];
            chunk.extend_from_slice(&(buckets.len() as u16).to_be_bytes());
            for c in Column::ALL.into_iter().take(COLUMNS_ALWAYS) {
                let mut column: Vec<Sample> = buckets.iter().map(|b| c.of(b)).collect();
                if let Some((_, at, v)) = bad.filter(|(col, _, _)| *col == c) {
                    column[at].v = v;
                }
                put_bytes(&mut chunk, &dense::encode(&column));
            }
            chunk
        };
        let mut out = Vec::new();
        decode(&chunk_with(None), ColumnSet::ALL, &mut out).unwrap();
        assert_eq!(out.len(), buckets.len());
        for column in [Column::Count, Column::Changes, Column::Resets] {
            for at in [0, buckets.len() / 2, buckets.len() - 1] {
                // -1 is read as a whole number (`push_int_counts`), the others as floats (2^53
                // is past what a decimal column holds: its raw bits, patched in).
                for v in [2.5, -1.0, f64::NAN, 9_007_199_254_740_992.0] {
                    let mut out = vec![buckets[0]];
                    let err = decode(&chunk_with(Some((column, at, v))), ColumnSet::ALL, &mut out).unwrap_err();
                    assert!(err.to_string().contains("no count"), "{column:?} {at} {v}: {err}");
                    assert_eq!(out.len(), 1, "nothing of a damaged chunk is kept");
                }
            }
        }
    }

    #[test]
    fn a_regular_series_costs_little_per_bucket() {
        // A counter scraped every 15 s, one day at 5 min: 288 buckets.
        let samples: Vec<Sample> = (0..5760)
            .map(|i| Sample { t: 1_700_000_000_000 + i * 15_000 + (i % 7) * 3, v: (i * 1234) as f64 })
            .collect();
        let buckets = aggregate(&samples, 300_000);
        let chunk = encode(&buckets[..240]);
        // Nine aggregates per bucket; raw, the same 20 samples cost ~20-40 bytes in a dense chunk.
        assert!(chunk.len() < 240 * 12, "{} bytes for 240 buckets", chunk.len());
    }
}
