//! The records the head writes to its write-ahead log: new series, samples, tombstones.
//!
//! A record is one type byte followed by a type-specific body (byte layout in
//! `docs/format/wal.md`). Series are logged once, when created, with their full label set;
//! samples then refer to them by reference only, which keeps the per-sample cost at a few
//! bytes. Records are self-contained so that a checkpoint can filter and rewrite them.

use strata_model::{Label, Labels, SeriesRef};

use crate::encoding::{put_bytes, put_uvarint, put_varint, DecodeError, Decoder};

/// The first byte of every record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordType {
    Series = 1,
    Samples = 2,
    Tombstones = 3,
}

/// A series and the reference the head gave it.
#[derive(Clone, Debug, PartialEq)]
pub struct RefSeries {
    pub series: SeriesRef,
    pub labels: Labels,
}

/// A sample of the series `series`.
#[derive(Clone, Copy, Debug)]
pub struct RefSample {
    pub series: SeriesRef,
    pub t: i64,
    pub v: f64,
}

impl PartialEq for RefSample {
    /// Bit equality of values, so NaNs compare equal to themselves.
    fn eq(&self, o: &Self) -> bool {
        self.series == o.series && self.t == o.t && self.v.to_bits() == o.v.to_bits()
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
        buf.extend_from_slice(&r.0.to_le_bytes());
        put_uvarint(buf, labels.len() as u64);
        for l in labels {
            put_bytes(buf, l.name.as_bytes());
            put_bytes(buf, l.value.as_bytes());
        }
    }
}

/// Appends a samples record to `buf`: the first sample's reference and time in full, the rest as
/// zig-zag varint deltas from them, values as raw 8-byte bit patterns.
pub fn encode_samples(samples: &[RefSample], buf: &mut Vec<u8>) {
    buf.push(RecordType::Samples as u8);
    let Some(first) = samples.first() else { return };
    buf.extend_from_slice(&first.series.0.to_le_bytes());
    buf.extend_from_slice(&first.t.to_le_bytes());
    for s in samples {
        put_varint(buf, s.series.0.wrapping_sub(first.series.0) as i64);
        put_varint(buf, s.t.wrapping_sub(first.t));
        buf.extend_from_slice(&s.v.to_bits().to_le_bytes());
    }
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
        Some(&t) => Err(RecordError::UnknownType(t)),
    }
}

pub fn decode(rec: &[u8]) -> Result<Record, RecordError> {
    let body = &rec[1.min(rec.len())..];
    match record_type(rec)? {
        RecordType::Series => decode_series(body).map(Record::Series),
        RecordType::Samples => {
            let mut out = Vec::new();
            decode_samples_into(body, &mut out)?;
            Ok(Record::Samples(out))
        }
        RecordType::Tombstones => decode_tombstones(body).map(Record::Tombstones),
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

/// Decodes the body of a samples record (after the type byte), appending to `out` so that replay
/// can reuse one buffer.
pub fn decode_samples_into(body: &[u8], out: &mut Vec<RefSample>) -> Result<(), RecordError> {
    let m = malformed("samples");
    let mut d = Decoder::new(body);
    if d.is_empty() {
        return Ok(());
    }
    let base_ref = d.u64_le("base series ref").map_err(&m)?;
    let base_t = d.u64_le("base timestamp").map_err(&m)? as i64;
    while !d.is_empty() {
        let dr = d.varint("series ref delta").map_err(&m)?;
        let dt = d.varint("timestamp delta").map_err(&m)?;
        let v = d.u64_le("value").map_err(&m)?;
        out.push(RefSample {
            series: SeriesRef(base_ref.wrapping_add(dr as u64)),
            t: base_t.wrapping_add(dt),
            v: f64::from_bits(v),
        });
    }
    Ok(())
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
        fn samples_round_trip(raw in prop::collection::vec((any::<u64>(), any::<i64>(), any::<u64>()), 0..100)) {
            let samples: Vec<RefSample> = raw.iter().map(|&(r, t, v)| RefSample { series: SeriesRef(r), t, v: f64::from_bits(v) }).collect();
            let mut buf = Vec::new();
            encode_samples(&samples, &mut buf);
            prop_assert_eq!(decode(&buf).unwrap(), Record::Samples(samples));
        }

        #[test]
        fn tombstones_round_trip(raw in prop::collection::vec((any::<u64>(), any::<i64>(), any::<i64>()), 0..20)) {
            let stones: Vec<Tombstone> = raw.iter().map(|&(r, a, b)| Tombstone { series: SeriesRef(r), mint: a, maxt: b }).collect();
            let mut buf = Vec::new();
            encode_tombstones(&stones, &mut buf);
            prop_assert_eq!(decode(&buf).unwrap(), Record::Tombstones(stones));
        }

        #[test]
        fn garbage_is_an_error_not_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
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

    /// Byte-exact example from docs/format/wal.md.
    #[test]
    fn doc_example_bytes() {
        let mut buf = Vec::new();
        encode_series([(SeriesRef(1), &Labels::from_pairs([("__name__", "up")]))], &mut buf);
        assert_eq!(hex(&buf), "01010000000000000001085f5f6e616d655f5f027570");
        buf.clear();
        encode_samples(
            &[RefSample { series: SeriesRef(1), t: 1000, v: 1.0 }, RefSample { series: SeriesRef(2), t: 1500, v: 0.0 }],
            &mut buf,
        );
        assert_eq!(hex(&buf), "020100000000000000e8030000000000000000000000000000f03f02e8070000000000000000");
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
        assert_eq!(decode(&[9]), Err(RecordError::UnknownType(9)));
        assert_eq!(decode(&[]), Err(RecordError::Empty));
        // Duplicate label names inside a record are refused.
        let mut dup = vec![1u8];
        dup.extend_from_slice(&5u64.to_le_bytes());
        dup.extend_from_slice(&[2, 1, b'a', 1, b'x', 1, b'a', 1, b'y']);
        assert!(matches!(decode(&dup), Err(RecordError::InvalidLabels { series: 5, .. })));
    }
}
