//! The records the head writes to its write-ahead log: new series, samples, tombstones.
//!
//! A record is one type byte followed by a type-specific body (byte layout in
//! `docs/format/wal.md`). Series are logged once, when created, with their full label set;
//! samples then refer to them by reference only, which keeps the per-sample cost at a few
//! bytes. Records are self-contained so that a checkpoint can filter and rewrite them.

use strata_model::histogram::Span;
use strata_model::{CounterResetHint, FloatHistogram, Label, Labels, SeriesRef};

use crate::chunkenc::dense;
use crate::encoding::{gcd, put_bytes, put_uvarint, put_varint, unzigzag, zigzag, DecodeError, Decoder};

/// The first byte of every record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordType {
    Series = 1,
    Samples = 2,
    Tombstones = 3,
    Histograms = 4,
    /// Samples with start times: as `Samples`, and per sample its start time.
    SamplesWithStart = 5,
    /// Histograms with start times: as `Histograms`, and per sample its start time.
    HistogramsWithStart = 6,
    /// Float samples the head took out of order (into a series' overlay, `head::overlay`): as
    /// `Samples` without start times. Replay puts them back in the overlay in log order, so a
    /// later write of a timestamp still replaces an earlier one.
    OutOfOrderSamples = 7,
    /// Exemplars: per exemplar the series reference and time as in `Samples`, the value's bit
    /// pattern, then its labels (count, then name and value as length-prefixed bytes).
    Exemplars = 8,
    /// Float samples without start times, packed: each sample's reference and time as the
    /// difference from the previous sample's, its value as a decimal `i / 10^e` where it is one
    /// (`encode_samples`). Decoded as `Samples`.
    PackedSamples = 9,
}

/// A packed sample's value code `zigzag(i) << 4 | e` is the decimal `i / 10^e` for `e` up to
/// this; larger exponents cost more tries than the bytes they save.
const PACKED_EXPONENT_MAX: u64 = 9;
/// The value code of a value that is no such decimal: its 8 raw bytes follow.
const PACKED_RAW: u64 = 15;

/// A series and the reference the head gave it.
#[derive(Clone, Debug, PartialEq)]
pub struct RefSeries {
    pub series: SeriesRef,
    pub labels: Labels,
}

/// A sample of the series `series`, with its start time `st` (0: none).
#[derive(Clone, Copy, Debug)]
pub struct RefSample {
    pub series: SeriesRef,
    pub t: i64,
    pub st: i64,
    pub v: f64,
}

impl PartialEq for RefSample {
    /// Bit equality of values, so NaNs compare equal to themselves.
    fn eq(&self, o: &Self) -> bool {
        self.series == o.series && self.t == o.t && self.st == o.st && self.v.to_bits() == o.v.to_bits()
    }
}

/// A native histogram sample of the series `series`, with its start time `st` (0: none).
#[derive(Clone, Debug)]
pub struct RefHistogram {
    pub series: SeriesRef,
    pub t: i64,
    pub st: i64,
    pub h: FloatHistogram,
}

impl PartialEq for RefHistogram {
    /// Bit equality of counts, and the same hint.
    fn eq(&self, o: &Self) -> bool {
        self.series == o.series && self.t == o.t && self.st == o.st && self.h.hint == o.h.hint && self.h.bit_eq(&o.h)
    }
}

/// An exemplar of the series `series`.
#[derive(Clone, Debug)]
pub struct RefExemplar {
    pub series: SeriesRef,
    pub t: i64,
    pub v: f64,
    pub labels: Labels,
}

impl PartialEq for RefExemplar {
    fn eq(&self, o: &Self) -> bool {
        self.series == o.series && self.t == o.t && self.v.to_bits() == o.v.to_bits() && self.labels == o.labels
    }
}

/// Deletion of `series`' samples in `[mint, maxt]` (inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tombstone {
    pub series: SeriesRef,
    pub mint: i64,
    pub maxt: i64,
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Series(Vec<RefSeries>),
    Samples(Vec<RefSample>),
    Tombstones(Vec<Tombstone>),
    Histograms(Vec<RefHistogram>),
    OutOfOrderSamples(Vec<RefSample>),
    Exemplars(Vec<RefExemplar>),
}

/// A record body that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("empty record")]
    Empty,
    #[error("unknown record type {0}")]
    UnknownType(u8),
    #[error("{kind} record: {source}")]
    Malformed { kind: &'static str, source: DecodeError },
    #[error("series record: invalid label set for series {series}: {reason}")]
    InvalidLabels { series: u64, reason: String },
}

/// Appends a series record for `series` to `buf`.
pub fn encode_series<'a>(series: impl IntoIterator<Item = (SeriesRef, &'a Labels)>, buf: &mut Vec<u8>) {
    buf.push(RecordType::Series as u8);
    for (r, labels) in series {
        encode_series_entry(r, labels, buf);
    }
}

/// Appends one series' entry of a series record to `buf` (a series record is its type byte
/// and entries one after another: `Wal::buffer_entry`).
pub fn encode_series_entry(r: SeriesRef, labels: &Labels, buf: &mut Vec<u8>) {
    buf.extend_from_slice(&r.0.to_le_bytes());
    put_uvarint(buf, labels.len() as u64);
    for l in labels {
        put_bytes(buf, l.name.as_bytes());
        put_bytes(buf, l.value.as_bytes());
    }
}

/// Sets the reference of the series entry `encode_series_entry` wrote at the start of `entry`
/// (its first eight bytes): an entry can be encoded before its reference is handed out.
pub fn set_series_entry_ref(entry: &mut [u8], r: SeriesRef) {
    entry[..8].copy_from_slice(&r.0.to_le_bytes());
}

/// Appends a samples record to `buf`. Without start times it is a `PackedSamples` record: the
/// first sample's reference and time in full, the time unit (uvarint: the greatest common
/// divisor of the time differences, 1 if none), then per sample its reference and time as
/// zig-zag varint differences from the previous sample's, the time's in units (a remote-write
/// request or a carbon batch lists series in creation order, a scrape's samples share a time,
/// carbon's times are whole seconds: a byte each) and its value as a
/// uvarint code, `zigzag(i) << 4 | e` for the decimal `i / 10^e` (`e` ≤ 9), or 15 then the raw
/// 8 bytes. When any sample has a start time the record is a `SamplesWithStart` one, in
/// `encode_timed`'s layout: each sample's value, raw, is preceded by `t - st` as a zig-zag
/// varint.
pub fn encode_samples(samples: &[RefSample], buf: &mut Vec<u8>) {
    let put_v = |s: &RefSample, buf: &mut Vec<u8>| buf.extend_from_slice(&s.v.to_bits().to_le_bytes());
    if samples.iter().all(|s| s.st == 0) {
        encode_packed_samples(samples, buf);
    } else {
        let put = |s: &RefSample, buf: &mut Vec<u8>| {
            put_varint(buf, s.t.wrapping_sub(s.st));
            put_v(s, buf);
        };
        encode_timed(RecordType::SamplesWithStart, samples, |s| (s.series, s.t), put, buf);
    }
}

/// A `PackedSamples` record (layout at `encode_samples`).
fn encode_packed_samples(samples: &[RefSample], buf: &mut Vec<u8>) {
    buf.push(RecordType::PackedSamples as u8);
    let Some(first) = samples.first() else { return };
    buf.reserve(16 + samples.len() * 5);
    buf.extend_from_slice(&first.series.0.to_le_bytes());
    buf.extend_from_slice(&first.t.to_le_bytes());
    // Carbon's times are whole seconds: its jitter of a second or two then costs a byte, where
    // milliseconds take two. The search stops at 1 (jittered milliseconds divide no further).
    let unit = samples
        .windows(2)
        .try_fold(0u64, |g, p| match gcd(g, p[1].t.wrapping_sub(p[0].t).unsigned_abs()) {
            1 => None,
            g => Some(g),
        })
        .map_or(1, |g| g.max(1));
    put_uvarint(buf, unit);
    let (mut prev_ref, mut prev_t) = (first.series.0, first.t);
    for s in samples {
        put_varint(buf, s.series.0.wrapping_sub(prev_ref) as i64);
        let dt = s.t.wrapping_sub(prev_t);
        debug_assert_eq!(dt.unsigned_abs() % unit, 0);
        // `unit` divides `dt`; the one quotient that overflows, `i64::MIN / -1`, cannot occur.
        put_varint(buf, if unit == 1 { dt } else { dt / unit as i64 });
        (prev_ref, prev_t) = (s.series.0, s.t);
        match dense::as_decimal(s.v, PACKED_EXPONENT_MAX as usize) {
            Some((i, e)) => put_uvarint(buf, zigzag(i) << 4 | e as u64),
            None => {
                buf.push(PACKED_RAW as u8);
                buf.extend_from_slice(&s.v.to_bits().to_le_bytes());
            }
        }
    }
}

/// Decodes the body of a `PackedSamples` record (after the type byte), appending to `out`.
fn decode_packed_samples_into(body: &[u8], out: &mut Vec<RefSample>) -> Result<(), RecordError> {
    let m = malformed("packed samples");
    let mut d = Decoder::new(body);
    if d.is_empty() {
        return Ok(());
    }
    let mut r = d.u64_le("base series ref").map_err(&m)?;
    let mut t = d.u64_le("base timestamp").map_err(&m)? as i64;
    let at = d.offset();
    let unit = d.uvarint("time unit").map_err(&m)?;
    if unit == 0 {
        return Err(m(DecodeError { what: "time unit", offset: at, problem: "zero" }));
    }
    // At least three bytes a sample: the vector is sized once.
    out.reserve(d.remaining() / 3);
    while !d.is_empty() {
        r = r.wrapping_add(d.varint("series ref delta").map_err(&m)? as u64);
        t = t.wrapping_add(d.varint("timestamp delta").map_err(&m)?.wrapping_mul(unit as i64));
        let at = d.offset();
        let code = d.uvarint("value code").map_err(&m)?;
        let v = match code & 15 {
            PACKED_RAW => f64::from_bits(d.u64_le("value").map_err(&m)?),
            e if e <= PACKED_EXPONENT_MAX => dense::decimal_value(unzigzag(code >> 4), e as usize),
            _ => return Err(m(DecodeError { what: "value code", offset: at, problem: "unknown decimal exponent" })),
        };
        out.push(RefSample { series: SeriesRef(r), t, st: 0, v });
    }
    Ok(())
}

/// Appends an out-of-order samples record to `buf`: `encode_samples`' layout under its own type;
/// start times are not kept for late samples.
pub fn encode_out_of_order_samples(samples: &[RefSample], buf: &mut Vec<u8>) {
    let put_v = |s: &RefSample, buf: &mut Vec<u8>| buf.extend_from_slice(&s.v.to_bits().to_le_bytes());
    encode_timed(RecordType::OutOfOrderSamples, samples, |s| (s.series, s.t), put_v, buf);
}

/// A record of timestamped items (samples, histograms): the type byte, then, if there are
/// items, the first one's reference and time in full, and per item its reference and time as
/// zig-zag varint deltas from those, followed by its value as `put_value` writes it.
fn encode_timed<T>(
    kind: RecordType,
    items: &[T],
    key: impl Fn(&T) -> (SeriesRef, i64),
    put_value: impl Fn(&T, &mut Vec<u8>),
    buf: &mut Vec<u8>,
) {
    buf.push(kind as u8);
    let Some(first) = items.first() else { return };
    let (base_ref, base_t) = key(first);
    buf.extend_from_slice(&base_ref.0.to_le_bytes());
    buf.extend_from_slice(&base_t.to_le_bytes());
    for item in items {
        let (r, t) = key(item);
        put_varint(buf, r.0.wrapping_sub(base_ref.0) as i64);
        put_varint(buf, t.wrapping_sub(base_t));
        put_value(item, buf);
    }
}

/// Decodes what `encode_timed` wrote (after the type byte), appending to `out`; with
/// `with_start`, each value is preceded by its start time (see `encode_samples`).
fn decode_timed<T, V>(
    kind: &'static str,
    body: &[u8],
    with_start: bool,
    mut get_value: impl FnMut(&mut Decoder<'_>) -> Result<V, DecodeError>,
    make: impl Fn(SeriesRef, i64, i64, V) -> T,
    out: &mut Vec<T>,
) -> Result<(), RecordError> {
    let m = malformed(kind);
    let mut d = Decoder::new(body);
    if d.is_empty() {
        return Ok(());
    }
    let base_ref = d.u64_le("base series ref").map_err(&m)?;
    let base_t = d.u64_le("base timestamp").map_err(&m)? as i64;
    while !d.is_empty() {
        let dr = d.varint("series ref delta").map_err(&m)?;
        let dt = d.varint("timestamp delta").map_err(&m)?;
        let t = base_t.wrapping_add(dt);
        let st = if with_start { t.wrapping_sub(d.varint("start time").map_err(&m)?) } else { 0 };
        let v = get_value(&mut d).map_err(&m)?;
        out.push(make(SeriesRef(base_ref.wrapping_add(dr as u64)), t, st, v));
    }
    Ok(())
}

/// Appends a histograms record to `buf`: per sample the series reference and time as in a
/// samples record, then the histogram (`docs/format/wal.md`); with start times as
/// `encode_samples` does.
pub fn encode_histograms(samples: &[RefHistogram], buf: &mut Vec<u8>) {
    if samples.iter().all(|s| s.st == 0) {
        encode_timed(RecordType::Histograms, samples, |s| (s.series, s.t), |s, buf| put_histogram(buf, &s.h), buf);
    } else {
        let put = |s: &RefHistogram, buf: &mut Vec<u8>| {
            put_varint(buf, s.t.wrapping_sub(s.st));
            put_histogram(buf, &s.h);
        };
        encode_timed(RecordType::HistogramsWithStart, samples, |s| (s.series, s.t), put, buf);
    }
}

fn put_histogram(buf: &mut Vec<u8>, h: &FloatHistogram) {
    buf.push(h.hint.to_u8());
    put_varint(buf, h.schema as i64);
    for v in [h.zero_threshold, h.zero_count, h.count, h.sum] {
        buf.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    for (spans, buckets) in [(&h.positive_spans, &h.positive_buckets), (&h.negative_spans, &h.negative_buckets)] {
        put_uvarint(buf, spans.len() as u64);
        for s in spans.iter() {
            put_varint(buf, s.offset as i64);
            put_uvarint(buf, s.length as u64);
        }
        put_uvarint(buf, buckets.len() as u64);
        for b in buckets.iter() {
            buf.extend_from_slice(&b.to_bits().to_le_bytes());
        }
    }
    put_uvarint(buf, h.custom_values.len() as u64);
    for v in &h.custom_values {
        buf.extend_from_slice(&v.to_bits().to_le_bytes());
    }
}

fn get_histogram(d: &mut Decoder<'_>) -> Result<FloatHistogram, DecodeError> {
    let bad = |what, offset| DecodeError { what, offset, problem: "out of range" };
    let hint_at = d.offset();
    let hint = CounterResetHint::from_u8(d.u8("counter reset hint")?).ok_or(bad("counter reset hint", hint_at))?;
    let schema_at = d.offset();
    let schema = i32::try_from(d.varint("schema")?).map_err(|_| bad("schema", schema_at))?;
    let mut f = |what| d.u64_le(what).map(f64::from_bits);
    let (zero_threshold, zero_count, count, sum) = (f("zero threshold")?, f("zero count")?, f("count")?, f("sum")?);
    let mut sides: [(Vec<Span>, Vec<f64>); 2] = Default::default();
    for (spans, buckets) in &mut sides {
        let n = bounded_count(d, "span count", 2)?;
        for _ in 0..n {
            let at = d.offset();
            let offset = i32::try_from(d.varint("span offset")?).map_err(|_| bad("span offset", at))?;
            let at = d.offset();
            let length = u32::try_from(d.uvarint("span length")?).map_err(|_| bad("span length", at))?;
            spans.push(Span { offset, length });
        }
        let n = bounded_count(d, "bucket count", 8)?;
        for _ in 0..n {
            buckets.push(f64::from_bits(d.u64_le("bucket")?));
        }
    }
    let n = bounded_count(d, "custom value count", 8)?;
    let custom_values = (0..n).map(|_| d.u64_le("custom value").map(f64::from_bits)).collect::<Result<Vec<_>, _>>()?;
    let [(positive_spans, positive_buckets), (negative_spans, negative_buckets)] = sides;
    Ok(FloatHistogram {
        hint,
        schema,
        zero_threshold,
        zero_count,
        count,
        sum,
        positive_spans,
        negative_spans,
        positive_buckets,
        negative_buckets,
        custom_values,
    })
}

/// A count of items of at least `min_bytes` each, refused when the rest of the body cannot
/// hold them (before anything is allocated for them).
fn bounded_count(d: &mut Decoder<'_>, what: &'static str, min_bytes: usize) -> Result<usize, DecodeError> {
    let n = d.uvarint(what)?;
    if n > (d.remaining() / min_bytes) as u64 {
        return Err(DecodeError { what, offset: d.offset(), problem: "larger than the record" });
    }
    Ok(n as usize)
}

/// Decodes the body of a histograms record (after the type byte), appending to `out`;
/// `with_start` for a `HistogramsWithStart` record.
pub fn decode_histograms_into(body: &[u8], with_start: bool, out: &mut Vec<RefHistogram>) -> Result<(), RecordError> {
    decode_timed(
        "histograms",
        body,
        with_start,
        get_histogram,
        |series, t, st, h| RefHistogram { series, t, st, h },
        out,
    )
}

/// Appends an exemplars record to `buf` (layout at `RecordType::Exemplars`).
pub fn encode_exemplars(exemplars: &[RefExemplar], buf: &mut Vec<u8>) {
    let put = |e: &RefExemplar, buf: &mut Vec<u8>| {
        buf.extend_from_slice(&e.v.to_bits().to_le_bytes());
        put_uvarint(buf, e.labels.len() as u64);
        for l in &e.labels {
            put_bytes(buf, l.name.as_bytes());
            put_bytes(buf, l.value.as_bytes());
        }
    };
    encode_timed(RecordType::Exemplars, exemplars, |e| (e.series, e.t), put, buf);
}

fn get_exemplar_value(d: &mut Decoder<'_>) -> Result<(f64, Labels), DecodeError> {
    let v = f64::from_bits(d.u64_le("exemplar value")?);
    let n = bounded_count(d, "exemplar label count", 2)?;
    let mut pairs = Vec::with_capacity(n);
    for _ in 0..n {
        let name = d.str("exemplar label name")?;
        let value = d.str("exemplar label value")?;
        pairs.push((name, value));
    }
    let at = d.offset();
    let labels = Labels::try_from_pairs(pairs).map_err(|_| DecodeError {
        what: "exemplar labels",
        offset: at,
        problem: "not a valid label set",
    })?;
    Ok((v, labels))
}

/// Appends a tombstones record to `buf`.
pub fn encode_tombstones(stones: &[Tombstone], buf: &mut Vec<u8>) {
    buf.push(RecordType::Tombstones as u8);
    for s in stones {
        buf.extend_from_slice(&s.series.0.to_le_bytes());
        put_varint(buf, s.mint);
        put_varint(buf, s.maxt);
    }
}

/// The type of a record without decoding its body.
pub fn record_type(rec: &[u8]) -> Result<RecordType, RecordError> {
    match rec.first() {
        None => Err(RecordError::Empty),
        Some(1) => Ok(RecordType::Series),
        Some(2) => Ok(RecordType::Samples),
        Some(3) => Ok(RecordType::Tombstones),
        Some(4) => Ok(RecordType::Histograms),
        Some(5) => Ok(RecordType::SamplesWithStart),
        Some(6) => Ok(RecordType::HistogramsWithStart),
        Some(7) => Ok(RecordType::OutOfOrderSamples),
        Some(8) => Ok(RecordType::Exemplars),
        Some(9) => Ok(RecordType::PackedSamples),
        Some(&t) => Err(RecordError::UnknownType(t)),
    }
}

pub fn decode(rec: &[u8]) -> Result<Record, RecordError> {
    let body = &rec[1.min(rec.len())..];
    let kind = record_type(rec)?;
    match kind {
        RecordType::Series => decode_series(body).map(Record::Series),
        RecordType::Samples | RecordType::SamplesWithStart | RecordType::PackedSamples => {
            let mut out = Vec::new();
            decode_samples_into(kind, body, &mut out)?;
            Ok(Record::Samples(out))
        }
        RecordType::Tombstones => decode_tombstones(body).map(Record::Tombstones),
        RecordType::Histograms | RecordType::HistogramsWithStart => {
            let mut out = Vec::new();
            decode_histograms_into(body, kind == RecordType::HistogramsWithStart, &mut out)?;
            Ok(Record::Histograms(out))
        }
        RecordType::OutOfOrderSamples => {
            let mut out = Vec::new();
            decode_samples_into(kind, body, &mut out)?;
            Ok(Record::OutOfOrderSamples(out))
        }
        RecordType::Exemplars => {
            let mut out = Vec::new();
            decode_timed(
                "exemplars",
                body,
                false,
                get_exemplar_value,
                |series, t, _, (v, labels)| RefExemplar { series, t, v, labels },
                &mut out,
            )?;
            Ok(Record::Exemplars(out))
        }
    }
}

fn malformed(kind: &'static str) -> impl Fn(DecodeError) -> RecordError {
    move |source| RecordError::Malformed { kind, source }
}

fn decode_series(body: &[u8]) -> Result<Vec<RefSeries>, RecordError> {
    let m = malformed("series");
    let mut d = Decoder::new(body);
    let mut out = Vec::new();
    while !d.is_empty() {
        let r = d.u64_le("series ref").map_err(&m)?;
        let n = d.uvarint("label count").map_err(&m)?;
        // Each label takes at least two bytes: refuse counts the body cannot hold before allocating.
        if n > d.remaining() as u64 / 2 {
            return Err(m(crate::encoding::DecodeError {
                what: "label count",
                offset: d.offset(),
                problem: "larger than the record",
            }));
        }
        let mut pairs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let name = d.str("label name").map_err(&m)?;
            let value = d.str("label value").map_err(&m)?;
            pairs.push(Label::new(name, value));
        }
        let labels = Labels::try_from_pairs(pairs.into_iter().map(|l| (l.name, l.value)))
            .map_err(|e| RecordError::InvalidLabels { series: r, reason: e.to_string() })?;
        out.push(RefSeries { series: SeriesRef(r), labels });
    }
    Ok(out)
}

/// Decodes the body (after the type byte) of a float samples record of type `kind` (`Samples`,
/// `SamplesWithStart`, `PackedSamples` or `OutOfOrderSamples`), appending to `out` so that
/// replay can reuse one buffer.
pub fn decode_samples_into(kind: RecordType, body: &[u8], out: &mut Vec<RefSample>) -> Result<(), RecordError> {
    if kind == RecordType::PackedSamples {
        return decode_packed_samples_into(body, out);
    }
    debug_assert!(matches!(kind, RecordType::Samples | RecordType::SamplesWithStart | RecordType::OutOfOrderSamples));
    decode_timed(
        "samples",
        body,
        kind == RecordType::SamplesWithStart,
        |d| d.u64_le("value").map(f64::from_bits),
        |series, t, st, v| RefSample { series, t, st, v },
        out,
    )
}

fn decode_tombstones(body: &[u8]) -> Result<Vec<Tombstone>, RecordError> {
    let m = malformed("tombstones");
    let mut d = Decoder::new(body);
    let mut out = Vec::new();
    while !d.is_empty() {
        let series = SeriesRef(d.u64_le("series ref").map_err(&m)?);
        let mint = d.varint("mint").map_err(&m)?;
        let maxt = d.varint("maxt").map_err(&m)?;
        out.push(Tombstone { series, mint, maxt });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn samples_round_trip(
            raw in prop::collection::vec((any::<u64>(), any::<i64>(), any::<u64>()), 0..100),
            starts in prop::collection::vec(prop_oneof![Just(0i64), any::<i64>()], 100),
        ) {
            // Records without any start time, and with some.
            let samples: Vec<RefSample> = raw.iter().zip(&starts).map(|(&(r, t, v), &st)| {
                RefSample { series: SeriesRef(r), t, st, v: f64::from_bits(v) }
            }).collect();
            let mut buf = Vec::new();
            encode_samples(&samples, &mut buf);
            let with_start = samples.iter().any(|s| s.st != 0);
            let kind = if with_start { RecordType::SamplesWithStart } else { RecordType::PackedSamples };
            prop_assert_eq!(record_type(&buf).unwrap(), kind);
            prop_assert_eq!(decode(&buf).unwrap(), Record::Samples(samples.clone()));
            let samples: Vec<RefSample> = samples.into_iter().map(|s| RefSample { st: 0, ..s }).collect();
            let mut buf = Vec::new();
            encode_samples(&samples, &mut buf);
            prop_assert_eq!(decode(&buf).unwrap(), Record::Samples(samples.clone()));
            // Records of type 2, as earlier versions wrote them, still decode.
            let mut buf = Vec::new();
            encode_unpacked_samples(&samples, &mut buf);
            prop_assert_eq!(decode(&buf).unwrap(), Record::Samples(samples.clone()));
            let mut buf = Vec::new();
            encode_out_of_order_samples(&samples, &mut buf);
            prop_assert_eq!(decode(&buf).unwrap(), Record::OutOfOrderSamples(samples));
        }

        #[test]
        fn packed_samples_keep_every_value_bit(
            raw in prop::collection::vec((0u64..1000, -5000i64..5000, 0usize..6, any::<i64>(), any::<u64>()), 1..200),
        ) {
            // Decimals of every exponent up to the packed limit and past it, integers near 2^53,
            // and arbitrary bit patterns (NaN payloads, -0.0, infinities, subnormals).
            let samples: Vec<RefSample> = raw.iter().map(|&(r, t, kind, i, bits)| {
                let v = match kind {
                    0 => (i % 1_000_000) as f64 / 10f64.powi((bits % 12) as i32),
                    1 => (i >> 10) as f64,
                    2 => f64::from_bits(bits),
                    3 => [f64::NAN, -0.0, f64::INFINITY, f64::NEG_INFINITY, f64::MIN_POSITIVE / 3.0][(bits % 5) as usize],
                    4 => (i % 100_000) as f64 * 0.001,
                    _ => i as f64,
                };
                RefSample { series: SeriesRef(r * 7919), t: 1_700_000_000_000 + t * 1000, st: 0, v }
            }).collect();
            let mut buf = Vec::new();
            encode_samples(&samples, &mut buf);
            prop_assert_eq!(decode(&buf).unwrap(), Record::Samples(samples));
            // Cut anywhere, the record is an error or fewer samples, never a panic.
            for cut in [1, buf.len() / 2, buf.len() - 1] {
                if let Ok(Record::Samples(v)) = decode(&buf[..cut]) {
                    prop_assert!(v.len() < raw.len());
                }
            }
        }

        #[test]
        fn tombstones_round_trip(raw in prop::collection::vec((any::<u64>(), any::<i64>(), any::<i64>()), 0..20)) {
            let stones: Vec<Tombstone> = raw.iter().map(|&(r, a, b)| Tombstone { series: SeriesRef(r), mint: a, maxt: b }).collect();
            let mut buf = Vec::new();
            encode_tombstones(&stones, &mut buf);
            prop_assert_eq!(decode(&buf).unwrap(), Record::Tombstones(stones));
        }

        #[test]
        fn exemplars_round_trip(raw in prop::collection::vec((any::<u64>(), any::<i64>(), any::<u64>(), "[a-z_]{1,8}", ".{0,12}"), 0..30)) {
            let exemplars: Vec<RefExemplar> = raw.iter().map(|(r, t, v, name, value)| RefExemplar {
                series: SeriesRef(*r),
                t: *t,
                v: f64::from_bits(*v),
                labels: Labels::from_pairs([(name.as_str(), value.as_str())]),
            }).collect();
            let mut buf = Vec::new();
            encode_exemplars(&exemplars, &mut buf);
            prop_assert_eq!(decode(&buf).unwrap(), Record::Exemplars(exemplars));
        }

        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn histograms_round_trip_and_truncations_are_errors() {
        use strata_model::histogram::notation::parse;
        let hs = [
            "{{schema:3 count:9 sum:-2.5 z_bucket:1 z_bucket_w:0.001 offset:-3 buckets:[1 2 NaN] n_buckets:[4] counter_reset_hint:gauge}}",
            "{{schema:-53 custom_values:[0.1 1 10] count:3 buckets:[1 1 0 1]}}",
            "{{}}",
        ];
        let samples: Vec<RefHistogram> = hs
            .iter()
            .enumerate()
            .map(|(i, h)| RefHistogram {
                series: SeriesRef(10 - i as u64),
                t: 1000 * i as i64 - 5,
                st: if i == 1 { -7 } else { 0 },
                h: parse(h).unwrap(),
            })
            .collect();
        let mut buf = Vec::new();
        encode_histograms(&samples, &mut buf);
        assert_eq!(decode(&buf).unwrap(), Record::Histograms(samples));
        // A cut record either fails to decode or (cut between samples) yields fewer samples.
        for cut in 1..buf.len() {
            match decode(&buf[..cut]) {
                Ok(Record::Histograms(v)) => assert!(v.len() < 3, "cut {cut}"),
                Ok(other) => panic!("cut {cut}: {other:?}"),
                Err(e) => assert!(matches!(e, RecordError::Malformed { kind: "histograms", .. }), "cut {cut}: {e}"),
            }
        }
    }

    #[test]
    fn series_round_trip() {
        let a = Labels::from_pairs([("__name__", "up"), ("job", "node"), ("région", "île")]);
        let b = Labels::from_pairs([("__name__", "x")]);
        let mut buf = Vec::new();
        encode_series([(SeriesRef(7), &a), (SeriesRef(9), &b)], &mut buf);
        assert_eq!(
            decode(&buf).unwrap(),
            Record::Series(vec![
                RefSeries { series: SeriesRef(7), labels: a },
                RefSeries { series: SeriesRef(9), labels: b }
            ])
        );
    }

    /// An entry encoded before its reference was known, then given it, is the entry encoded
    /// with it.
    #[test]
    fn a_series_entry_takes_its_reference_afterwards() {
        let labels = Labels::from_pairs([("__name__", "servers.dc1.host-00001.cpu.user")]);
        let (mut late, mut direct) = (vec![RecordType::Series as u8], vec![RecordType::Series as u8]);
        encode_series_entry(SeriesRef(0), &labels, &mut late);
        set_series_entry_ref(&mut late[1..], SeriesRef(u64::MAX - 3));
        encode_series_entry(SeriesRef(u64::MAX - 3), &labels, &mut direct);
        assert_eq!(late, direct);
        assert_eq!(decode(&late).unwrap(), Record::Series(vec![RefSeries { series: SeriesRef(u64::MAX - 3), labels }]));
    }

    /// A samples record of type 2, as versions before packed records wrote them.
    fn encode_unpacked_samples(samples: &[RefSample], buf: &mut Vec<u8>) {
        let put_v = |s: &RefSample, buf: &mut Vec<u8>| buf.extend_from_slice(&s.v.to_bits().to_le_bytes());
        encode_timed(RecordType::Samples, samples, |s| (s.series, s.t), put_v, buf);
    }

    /// Byte-exact examples from docs/format/wal.md.
    #[test]
    fn doc_example_bytes() {
        let mut buf = Vec::new();
        encode_series([(SeriesRef(1), &Labels::from_pairs([("__name__", "up")]))], &mut buf);
        assert_eq!(hex(&buf), "01010000000000000001085f5f6e616d655f5f027570");
        let samples = [
            RefSample { series: SeriesRef(1), t: 1000, st: 0, v: 1.0 },
            RefSample { series: SeriesRef(2), t: 1500, st: 0, v: 0.0 },
        ];
        buf.clear();
        encode_unpacked_samples(&samples, &mut buf);
        assert_eq!(hex(&buf), "020100000000000000e8030000000000000000000000000000f03f02e8070000000000000000");
        assert_eq!(decode(&buf).unwrap(), Record::Samples(samples.to_vec()));
        let samples = [
            RefSample { series: SeriesRef(1), t: 1000, st: 0, v: 1.0 },
            RefSample { series: SeriesRef(2), t: 1500, st: 0, v: 0.25 },
            RefSample { series: SeriesRef(3), t: 1500, st: 0, v: -3.0 },
            RefSample { series: SeriesRef(5), t: 1500, st: 0, v: f64::NAN },
        ];
        buf.clear();
        encode_samples(&samples, &mut buf);
        assert_eq!(hex(&buf), "090100000000000000e803000000000000f4030000200202a20602005004000f000000000000f87f");
        assert_eq!(decode(&buf).unwrap(), Record::Samples(samples.to_vec()));
    }

    #[test]
    fn packed_samples_take_a_few_bytes_each() {
        // A scrape: consecutive references, one time, integers and short decimals.
        let samples: Vec<RefSample> = (0..1000)
            .map(|j| RefSample { series: SeriesRef(5000 + j), t: 1_700_000_000_123, st: 0, v: (j % 50) as f64 / 4.0 })
            .collect();
        let mut buf = Vec::new();
        encode_samples(&samples, &mut buf);
        assert!(buf.len() <= 17 + 5 * samples.len(), "{} bytes", buf.len());
        let mut old = Vec::new();
        encode_unpacked_samples(&samples, &mut old);
        assert!(old.len() >= 17 + 10 * samples.len(), "{} bytes", old.len());
        // After the base reference and time: a time unit of 1, a sample with both differences 0
        // and the value code 0x0a (exponent 10, past the limit): refused, not read. The same
        // with a time unit of 0: refused too.
        let mut bad = vec![RecordType::PackedSamples as u8];
        bad.extend_from_slice(&[0; 16]);
        bad.extend_from_slice(&[1, 0, 0, 0x0a]);
        let err = decode(&bad).unwrap_err();
        assert!(err.to_string().contains("unknown decimal exponent"), "{err}");
        bad[17] = 0;
        let err = decode(&bad).unwrap_err();
        assert!(err.to_string().contains("time unit"), "{err}");
        // With exponent 9, the limit, the sample is read.
        bad[17] = 1;
        bad[20] = 0x09;
        assert_eq!(
            decode(&bad).unwrap(),
            Record::Samples(vec![RefSample { series: SeriesRef(0), t: 0, st: 0, v: 0.0 }])
        );
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn corrupt_series_records_are_typed_errors() {
        let mut buf = Vec::new();
        encode_series([(SeriesRef(1), &Labels::from_pairs([("a", "b")]))], &mut buf);
        let cut = &buf[..buf.len() - 1];
        assert!(matches!(decode(cut), Err(RecordError::Malformed { kind: "series", .. })));
        assert_eq!(decode(&[10]), Err(RecordError::UnknownType(10)));
        assert_eq!(decode(&[]), Err(RecordError::Empty));
        // Duplicate label names inside a record are refused.
        let mut dup = vec![1u8];
        dup.extend_from_slice(&5u64.to_le_bytes());
        dup.extend_from_slice(&[2, 1, b'a', 1, b'x', 1, b'a', 1, b'y']);
        assert!(matches!(decode(&dup), Err(RecordError::InvalidLabels { series: 5, .. })));
    }
}
