//! Prometheus remote write 1.0 and remote read (samples) messages, declared with prost's derive
//! (field numbers and types as in Prometheus' `prompb/types.proto` and `remote.proto`), and the
//! snappy framing around them (the block format, not the stream format).
//!
//! Incoming write requests (1.0 and 2.0) are read in place by `read_write_request*` into a
//! `WriteBatch`, without prost: no allocation per series or label. The prost messages decode
//! remote-read requests and encode everything (responses, tests, benchmarks).

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub exemplars: Vec<Exemplar>,
    #[prost(message, repeated, tag = "4")]
    pub histograms: Vec<Histogram>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Exemplar {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(double, tag = "2")]
    pub value: f64,
    #[prost(int64, tag = "3")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

impl Label {
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Label {
        Label { name: name.into(), value: value.into() }
    }
}

#[derive(Clone, Copy, PartialEq, Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// A native histogram (`prompb.Histogram`, the same message in remote write 2.0). Integer
/// histograms carry counts as deltas between adjacent buckets (`*_deltas`, `*_int`), float
/// ones as absolute counts (`*_counts`, `*_float`).
#[derive(Clone, PartialEq, Message)]
pub struct Histogram {
    #[prost(uint64, optional, tag = "1")]
    pub count_int: Option<u64>,
    #[prost(double, optional, tag = "2")]
    pub count_float: Option<f64>,
    #[prost(double, tag = "3")]
    pub sum: f64,
    #[prost(sint32, tag = "4")]
    pub schema: i32,
    #[prost(double, tag = "5")]
    pub zero_threshold: f64,
    #[prost(uint64, optional, tag = "6")]
    pub zero_count_int: Option<u64>,
    #[prost(double, optional, tag = "7")]
    pub zero_count_float: Option<f64>,
    #[prost(message, repeated, tag = "8")]
    pub negative_spans: Vec<BucketSpan>,
    #[prost(sint64, repeated, tag = "9")]
    pub negative_deltas: Vec<i64>,
    #[prost(double, repeated, tag = "10")]
    pub negative_counts: Vec<f64>,
    #[prost(message, repeated, tag = "11")]
    pub positive_spans: Vec<BucketSpan>,
    #[prost(sint64, repeated, tag = "12")]
    pub positive_deltas: Vec<i64>,
    #[prost(double, repeated, tag = "13")]
    pub positive_counts: Vec<f64>,
    /// 0 unknown, 1 reset, 2 not reset, 3 gauge.
    #[prost(int32, tag = "14")]
    pub reset_hint: i32,
    #[prost(int64, tag = "15")]
    pub timestamp: i64,
    #[prost(double, repeated, tag = "16")]
    pub custom_values: Vec<f64>,
}

#[derive(Clone, Copy, PartialEq, Message)]
pub struct BucketSpan {
    #[prost(sint32, tag = "1")]
    pub offset: i32,
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

impl Histogram {
    /// The message for a stored histogram (float counts), as remote read returns it.
    pub fn from_float(t: i64, h: &strata_model::FloatHistogram) -> Histogram {
        let spans = |s: &[strata_model::histogram::Span]| {
            s.iter().map(|s| BucketSpan { offset: s.offset, length: s.length }).collect()
        };
        Histogram {
            count_float: Some(h.count),
            sum: h.sum,
            schema: h.schema,
            zero_threshold: h.zero_threshold,
            zero_count_float: Some(h.zero_count),
            negative_spans: spans(&h.negative_spans),
            negative_counts: h.negative_buckets.clone(),
            positive_spans: spans(&h.positive_spans),
            positive_counts: h.positive_buckets.clone(),
            reset_hint: h.hint.to_u8() as i32,
            timestamp: t,
            custom_values: h.custom_values.clone(),
            ..Histogram::default()
        }
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct MetricMetadata {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    #[prost(string, tag = "4")]
    pub help: String,
    #[prost(string, tag = "5")]
    pub unit: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ReadRequest {
    #[prost(message, repeated, tag = "1")]
    pub queries: Vec<Query>,
    #[prost(int32, repeated, tag = "2")]
    pub accepted_response_types: Vec<i32>,
}

/// `ReadRequest.accepted_response_types` values.
pub const RESPONSE_SAMPLES: i32 = 0;
pub const RESPONSE_STREAMED_XOR_CHUNKS: i32 = 1;

/// One frame's message of a streamed read (`prompb.ChunkedReadResponse`).
#[derive(Clone, PartialEq, Message)]
pub struct ChunkedReadResponse {
    #[prost(message, repeated, tag = "1")]
    pub chunked_series: Vec<ChunkedSeries>,
    /// Which query of the request the series answer.
    #[prost(int64, tag = "2")]
    pub query_index: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ChunkedSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub chunks: Vec<Chunk>,
}

/// `prompb.Chunk`: Prometheus' chunk bytes (for XOR: the big-endian sample count, then the
/// bit stream).
#[derive(Clone, PartialEq, Message)]
pub struct Chunk {
    #[prost(int64, tag = "1")]
    pub min_time_ms: i64,
    #[prost(int64, tag = "2")]
    pub max_time_ms: i64,
    /// UNKNOWN = 0, XOR = 1, HISTOGRAM = 2, FLOAT_HISTOGRAM = 3.
    #[prost(int32, tag = "3")]
    pub r#type: i32,
    #[prost(bytes = "vec", tag = "4")]
    pub data: Vec<u8>,
}

/// Samples per chunk of a streamed read, as Prometheus cuts them.
pub const STREAMED_CHUNK_SAMPLES: usize = 120;

/// Float samples as Prometheus XOR chunks of at most `STREAMED_CHUNK_SAMPLES`. Strata's XOR
/// body is Prometheus' bit for bit (`docs/format/chunks.md`); Prometheus' chunk bytes are ours
/// without the leading encoding byte.
pub fn xor_chunks(samples: &[Sample]) -> Vec<Chunk> {
    samples
        .chunks(STREAMED_CHUNK_SAMPLES)
        .map(|part| {
            let mut app = strata_tsdb::chunkenc::XorAppender::new();
            for s in part {
                app.append(s.timestamp, s.value);
            }
            let bytes = app.into_bytes();
            debug_assert_eq!(bytes[0], strata_tsdb::chunkenc::Encoding::Xor as u8);
            let (min_time_ms, max_time_ms) = (part[0].timestamp, part[part.len() - 1].timestamp);
            Chunk { min_time_ms, max_time_ms, r#type: 1, data: bytes[1..].to_vec() }
        })
        .collect()
}

/// Appends one frame of a streamed read to `out`: the message's length as a uvarint, its
/// CRC-32C (Castagnoli) big-endian, then the message.
pub fn put_frame(msg: &ChunkedReadResponse, out: &mut Vec<u8>) {
    let data = msg.encode_to_vec();
    prost::encoding::encode_varint(data.len() as u64, out);
    out.extend_from_slice(&crc32c::crc32c(&data).to_be_bytes());
    out.extend_from_slice(&data);
}

#[derive(Clone, PartialEq, Message)]
pub struct Query {
    #[prost(int64, tag = "1")]
    pub start_timestamp_ms: i64,
    #[prost(int64, tag = "2")]
    pub end_timestamp_ms: i64,
    #[prost(message, repeated, tag = "3")]
    pub matchers: Vec<LabelMatcher>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LabelMatcher {
    /// EQ = 0, NEQ = 1, RE = 2, NRE = 3.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ReadResponse {
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<QueryResult>,
}

#[derive(Clone, PartialEq, Message)]
pub struct QueryResult {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// Why a remote-write or remote-read body was refused; maps to an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("request body of {bytes} bytes exceeds the limit of {limit} bytes")]
    BodyTooLarge { bytes: usize, limit: usize },
    #[error("snappy: {0}")]
    Snappy(String),
    #[error("protobuf: {0}")]
    Protobuf(String),
}

/// Snappy-decompresses `body`, refusing to allocate more than `max_decompressed` bytes (judged
/// from the length header, before decompressing).
pub fn decompress(body: &[u8], max_decompressed: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    decompress_into(body, max_decompressed, &mut out)?;
    Ok(out)
}

/// `decompress` into `out` (replacing what it held), reusing its capacity.
pub fn decompress_into(body: &[u8], max_decompressed: usize, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    let len = snap::raw::decompress_len(body).map_err(|e| DecodeError::Snappy(e.to_string()))?;
    if len > max_decompressed {
        return Err(DecodeError::BodyTooLarge { bytes: len, limit: max_decompressed });
    }
    out.clear();
    out.resize(len, 0);
    let n = snap::raw::Decoder::new().decompress(body, out).map_err(|e| DecodeError::Snappy(e.to_string()))?;
    out.truncate(n);
    Ok(())
}

/// `decompress`, then decodes a protobuf message.
pub fn decode<M: Message + Default>(body: &[u8], max_decompressed: usize) -> Result<M, DecodeError> {
    let raw = decompress(body, max_decompressed)?;
    M::decode(&raw[..]).map_err(|e| DecodeError::Protobuf(e.to_string()))
}

/// Encodes and snappy-compresses a message.
pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    snap::raw::Encoder::new().compress_vec(&msg.encode_to_vec()).expect("snappy compresses any input")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn v2_symbol_references_are_checked() {
        let mut req = v2::request(&[(vec![("__name__", "up")], vec![(1, 1.0)])]);
        assert!(read_write_request_v2(&req.encode_to_vec()).is_ok());
        req.timeseries[0].labels_refs.push(99);
        let err = read_write_request_v2(&req.encode_to_vec()).unwrap_err().to_string();
        assert!(err.contains("odd number"), "{err}");
        req.timeseries[0].labels_refs.push(1);
        let err = read_write_request_v2(&req.encode_to_vec()).unwrap_err().to_string();
        assert!(err.contains("symbol reference 99 out of range"), "{err}");
    }

    #[test]
    fn v2_start_times_per_sample_and_from_the_legacy_series_field() {
        let mut req = v2::request(&[
            (vec![("__name__", "none")], vec![(1000, 1.0)]),
            (vec![("__name__", "own")], vec![(1000, 1.0), (2000, 2.0), (3000, 3.0)]),
            (vec![("__name__", "legacy")], vec![(1000, 1.0), (2000, 2.0)]),
        ]);
        // Nothing has a start time: no column at all.
        let raw = req.encode_to_vec();
        assert!(read_write_request_v2(&raw).unwrap().sample_starts.is_empty());
        req.timeseries[1].samples[0].start_timestamp = 500;
        req.timeseries[1].samples[2].start_timestamp = 2500;
        req.timeseries[2].created_timestamp = 700;
        req.timeseries[2].samples[1].start_timestamp = 1500;
        let raw = req.encode_to_vec();
        let b = read_write_request_v2(&raw).unwrap();
        // Parallel to the samples; a sample's own start time wins over the series' one.
        assert_eq!(b.sample_starts, vec![0, 500, 0, 2500, 700, 1500]);
        assert_eq!(b.series[2].samples, 4..6);
    }

    #[test]
    fn round_trip_and_named_errors() {
        let req = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![Label::new("__name__", "up")],
                samples: vec![Sample { value: 1.5, timestamp: 1000 }],
                histograms: vec![],
                exemplars: vec![],
            }],
            metadata: vec![],
        };
        let body = encode(&req);
        assert_eq!(decode::<WriteRequest>(&body, 1 << 20).unwrap(), req);
        assert!(matches!(decode::<WriteRequest>(&body, 3), Err(DecodeError::BodyTooLarge { .. })));
        assert!(matches!(decode::<WriteRequest>(b"\x05\xff\x01", 1 << 20), Err(DecodeError::Snappy(_))));
        let garbage = snap::raw::Encoder::new().compress_vec(b"\x0a\x05\x0a\x03").unwrap();
        assert!(matches!(decode::<WriteRequest>(&garbage, 1 << 20), Err(DecodeError::Protobuf(_))));
        // A label value that is not UTF-8: prost refuses the string; the in-place reader hands
        // the bytes on, for the HTTP layer to refuse that one series by name.
        let mut raw = req.encode_to_vec();
        let at = raw.windows(2).position(|w| w == b"up").unwrap();
        raw[at] = 0xff;
        let bad = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
        assert!(matches!(decode::<WriteRequest>(&bad, 1 << 20), Err(DecodeError::Protobuf(_))));
        assert_eq!(read_write_request(&raw).unwrap().labels[0].1, b"\xffp");
    }

    proptest! {
        /// Arbitrary bytes, raw or snappy-framed, never panic the decoder.
        #[test]
        fn arbitrary_bodies_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<WriteRequest>(&data, 1 << 20);
            let framed = snap::raw::Encoder::new().compress_vec(&data).unwrap();
            let _ = decode::<WriteRequest>(&framed, 1 << 20);
            let _ = decode::<ReadRequest>(&framed, 1 << 20);
        }
    }
}

/// A remote-write request read in place: every label string and sample stays in (or is copied
/// flat from) the decompressed buffer, with no allocation per series or per label. This is the
/// ingestion hot path; `WriteRequest` (prost) remains for encoding and for tests.
#[derive(Debug, Default)]
pub struct WriteBatch<'a> {
    /// Every series' labels, back to back: `(name, value)` as raw bytes (UTF-8 not yet checked).
    pub labels: Vec<(&'a [u8], &'a [u8])>,
    /// Every series' samples, back to back.
    pub samples: Vec<strata_model::Sample>,
    /// Every series' native histograms, back to back, with their timestamps.
    pub histograms: Vec<(i64, strata_model::FloatHistogram)>,
    /// Start times (0: none; remote write 2.0 only) parallel to `samples` and to
    /// `histograms`; each empty when none of its samples has one.
    pub sample_starts: Vec<i64>,
    pub histogram_starts: Vec<i64>,
    pub series: Vec<SeriesSpan>,
    /// Metadata entries, decoded with prost (rare, small).
    pub metadata: Vec<MetricMetadata>,
    /// Every series' exemplars, back to back: their labels (a range of `exemplar_labels`),
    /// timestamp and value.
    pub exemplars: Vec<(std::ops::Range<usize>, i64, f64)>,
    pub exemplar_labels: Vec<(&'a [u8], &'a [u8])>,
}

impl WriteBatch<'_> {
    /// Empties the batch but keeps its buffers, now free to borrow from another request's bytes:
    /// the ingestion path decodes every request into the same few buffers instead of growing
    /// fresh ones (each growth of a buffer this size faulted in new pages).
    pub fn recycle<'b>(self) -> WriteBatch<'b> {
        let WriteBatch {
            mut labels,
            mut samples,
            mut histograms,
            mut sample_starts,
            mut histogram_starts,
            mut series,
            mut metadata,
            mut exemplars,
            exemplar_labels,
        } = self;
        exemplars.clear();
        labels.clear();
        samples.clear();
        histograms.clear();
        sample_starts.clear();
        histogram_starts.clear();
        series.clear();
        metadata.clear();
        WriteBatch {
            labels: reborrow_empty(labels),
            samples,
            histograms,
            sample_starts,
            histogram_starts,
            series,
            metadata,
            exemplars,
            exemplar_labels: reborrow_empty({
                let mut l = exemplar_labels;
                l.clear();
                l
            }),
        }
    }

    /// Bytes of buffer capacity held (for a caller that bounds what it keeps between requests).
    pub fn capacity_bytes(&self) -> usize {
        use std::mem::size_of_val;
        self.labels.capacity() * size_of_val(&(&b""[..], &b""[..]))
            + self.samples.capacity() * std::mem::size_of::<strata_model::Sample>()
            + self.histograms.capacity() * std::mem::size_of::<(i64, strata_model::FloatHistogram)>()
            + (self.sample_starts.capacity() + self.histogram_starts.capacity()) * 8
            + self.series.capacity() * std::mem::size_of::<SeriesSpan>()
            + self.metadata.capacity() * std::mem::size_of::<MetricMetadata>()
            + self.exemplars.capacity() * std::mem::size_of::<(std::ops::Range<usize>, i64, f64)>()
            + self.exemplar_labels.capacity() * size_of_val(&(&b""[..], &b""[..]))
    }
}

/// An empty vector of borrowed pairs, with its allocation, for pairs of another lifetime (the
/// layouts are equal, so collecting in place reuses the allocation).
pub fn reborrow_empty<'a, 'b, T: ?Sized>(v: Vec<(&'a T, &'a T)>) -> Vec<(&'b T, &'b T)> {
    debug_assert!(v.is_empty());
    v.into_iter().map(|_| unreachable!("emptied before")).collect()
}

/// One series of a `WriteBatch`: ranges into its `labels` and `samples`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesSpan {
    pub labels: std::ops::Range<usize>,
    pub samples: std::ops::Range<usize>,
    pub histograms: std::ops::Range<usize>,
    pub exemplars: std::ops::Range<usize>,
}

/// Protobuf wire reader over a byte slice; every read is bounds-checked.
struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Wire<'a> {
    fn err(&self, what: &str) -> DecodeError {
        DecodeError::Protobuf(format!("{what} at byte {}", self.pos))
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or_else(|| self.err("truncated varint"))?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(self.err("varint longer than 10 bytes"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(self.varint()?).map_err(|_| self.err("length overflows"))?;
        let end =
            self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| self.err("length past the end"))?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    /// Repeated scalars: packed (one length-delimited field) or one value per field.
    fn repeated<T>(
        &mut self,
        wire: u8,
        one: impl Fn(&mut Wire<'a>) -> Result<T, DecodeError>,
        out: &mut Vec<T>,
    ) -> Result<(), DecodeError> {
        if wire == 2 {
            let mut p = Wire { buf: self.bytes()?, pos: 0 };
            while p.pos < p.buf.len() {
                out.push(one(&mut p)?);
            }
            Ok(())
        } else {
            out.push(one(self)?);
            Ok(())
        }
    }

    fn sint(&mut self) -> Result<i64, DecodeError> {
        let v = self.varint()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }

    fn fixed64(&mut self) -> Result<u64, DecodeError> {
        let end =
            self.pos.checked_add(8).filter(|&e| e <= self.buf.len()).ok_or_else(|| self.err("truncated fixed64"))?;
        let v = u64::from_le_bytes(self.buf[self.pos..end].try_into().expect("8 bytes"));
        self.pos = end;
        Ok(v)
    }

    /// The next field's (number, wire type), or `None` at the end.
    fn key(&mut self) -> Result<Option<(u64, u8)>, DecodeError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let k = self.varint()?;
        let field = k >> 3;
        if field == 0 {
            return Err(self.err("field number 0"));
        }
        Ok(Some((field, (k & 7) as u8)))
    }

    fn skip(&mut self, wire: u8) -> Result<(), DecodeError> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.fixed64().map(drop),
            2 => self.bytes().map(drop),
            5 => {
                let end = self
                    .pos
                    .checked_add(4)
                    .filter(|&e| e <= self.buf.len())
                    .ok_or_else(|| self.err("truncated fixed32"))?;
                self.pos = end;
                Ok(())
            }
            w => Err(self.err(&format!("unsupported wire type {w}"))),
        }
    }
}

/// Reads a `prometheus.WriteRequest` in place (see `WriteBatch`). Field numbers and types as in
/// `prompb`; unknown fields are skipped as protobuf requires.
pub fn read_write_request(raw: &[u8]) -> Result<WriteBatch<'_>, DecodeError> {
    read_write_request_into(raw, WriteBatch::default())
}

/// `read_write_request` into the buffers of `out` (an empty batch, `WriteBatch::recycle`).
pub fn read_write_request_into<'a>(raw: &'a [u8], mut out: WriteBatch<'a>) -> Result<WriteBatch<'a>, DecodeError> {
    debug_assert!(out.series.is_empty() && out.labels.is_empty(), "decoding into a batch that holds series");
    let mut w = Wire { buf: raw, pos: 0 };
    while let Some((field, wire)) = w.key()? {
        match (field, wire) {
            (1, 2) => {
                let ts = w.bytes()?;
                read_series(ts, &mut out)?;
            }
            (3, 2) => {
                let md = w.bytes()?;
                out.metadata.push(MetricMetadata::decode(md).map_err(|e| DecodeError::Protobuf(e.to_string()))?);
            }
            // 2.0's symbols and timeseries: skipping them, as protobuf would, loses the data
            // without a word, so say what happened instead.
            (4 | 5, 2) => {
                return Err(DecodeError::Protobuf(
                    "this is a remote write 2.0 request (io.prometheus.write.v2.Request) sent as 1.0: \
                     set Content-Type: application/x-protobuf;proto=io.prometheus.write.v2.Request"
                        .into(),
                ))
            }
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok(out)
}

/// A `Histogram` message (the same in 1.0 and 2.0) as a float histogram: integer counts are
/// turned from deltas into absolute counts. The result is not validated here (the appender
/// does, and names what is wrong).
/// A histogram message: its timestamp, start time (field 17, remote write 2.0; 0: none) and
/// value.
fn read_histogram(buf: &[u8]) -> Result<(i64, i64, strata_model::FloatHistogram), DecodeError> {
    use strata_model::histogram::Span;
    let mut w = Wire { buf, pos: 0 };
    let mut h = strata_model::FloatHistogram::default();
    let (mut t, mut st) = (0i64, 0i64);
    let (mut pos_deltas, mut neg_deltas): (Vec<i64>, Vec<i64>) = (Vec::new(), Vec::new());
    let span = |w: &mut Wire<'_>| -> Result<Span, DecodeError> {
        let mut s = Wire { buf: w.bytes()?, pos: 0 };
        let mut out = Span::default();
        while let Some((f, wt)) = s.key()? {
            match (f, wt) {
                (1, 0) => out.offset = i32::try_from(s.sint()?).map_err(|_| s.err("span offset out of range"))?,
                (2, 0) => out.length = u32::try_from(s.varint()?).map_err(|_| s.err("span length out of range"))?,
                (_, wt) => s.skip(wt)?,
            }
        }
        Ok(out)
    };
    let double = |w: &mut Wire<'_>| w.fixed64().map(f64::from_bits);
    while let Some((field, wire)) = w.key()? {
        match (field, wire) {
            (1, 0) => h.count = w.varint()? as f64,
            (2, 1) => h.count = double(&mut w)?,
            (3, 1) => h.sum = double(&mut w)?,
            (4, 0) => h.schema = i32::try_from(w.sint()?).map_err(|_| w.err("schema out of range"))?,
            (5, 1) => h.zero_threshold = double(&mut w)?,
            (6, 0) => h.zero_count = w.varint()? as f64,
            (7, 1) => h.zero_count = double(&mut w)?,
            (8, 2) => h.negative_spans.push(span(&mut w)?),
            (9, 0 | 2) => w.repeated(wire, Wire::sint, &mut neg_deltas)?,
            (10, 1 | 2) => w.repeated(wire, |w| w.fixed64().map(f64::from_bits), &mut h.negative_buckets)?,
            (11, 2) => h.positive_spans.push(span(&mut w)?),
            (12, 0 | 2) => w.repeated(wire, Wire::sint, &mut pos_deltas)?,
            (13, 1 | 2) => w.repeated(wire, |w| w.fixed64().map(f64::from_bits), &mut h.positive_buckets)?,
            (14, 0) => {
                h.hint = strata_model::CounterResetHint::from_u8(w.varint()? as u8)
                    .ok_or_else(|| w.err("unknown histogram reset hint"))?
            }
            (15, 0) => t = w.varint()? as i64,
            (16, 1 | 2) => w.repeated(wire, |w| w.fixed64().map(f64::from_bits), &mut h.custom_values)?,
            (17, 0) => st = w.varint()? as i64,
            (_, wire) => w.skip(wire)?,
        }
    }
    // Integer buckets: each delta is against the previous bucket's count.
    for (deltas, buckets) in [(&pos_deltas, &mut h.positive_buckets), (&neg_deltas, &mut h.negative_buckets)] {
        let mut c = 0i64;
        for d in deltas {
            c = c.wrapping_add(*d);
            buckets.push(c as f64);
        }
    }
    Ok((t, st, h))
}

/// Records the start time `st` of the item just pushed as the `n`-th: `starts` stays empty
/// until one has a start time, then is filled with zeros up to it.
fn push_start(starts: &mut Vec<i64>, n: usize, st: i64) {
    if st != 0 || !starts.is_empty() {
        push_start_at(starts, n - 1, st);
    }
}

/// Sets the start time of item `i` (`starts` grows with zeros to reach it).
fn push_start_at(starts: &mut Vec<i64>, i: usize, st: i64) {
    if starts.len() <= i {
        starts.resize(i + 1, 0);
    }
    starts[i] = st;
}

/// A `Sample` message (the same in 1.0 and 2.0): value (1, double), timestamp (2, int64).
fn read_sample(buf: &[u8]) -> Result<strata_model::Sample, DecodeError> {
    let mut s = Wire { buf, pos: 0 };
    let (mut v, mut t) = (0f64, 0i64);
    while let Some((f, wt)) = s.key()? {
        match (f, wt) {
            (1, 1) => v = f64::from_bits(s.fixed64()?),
            (2, 0) => t = s.varint()? as i64,
            (_, wt) => s.skip(wt)?,
        }
    }
    Ok(strata_model::Sample::new(t, v))
}

/// A label message (1.0): name (1) and value (2).
fn read_label(buf: &[u8]) -> Result<(&[u8], &[u8]), DecodeError> {
    let mut l = Wire { buf, pos: 0 };
    let (mut name, mut value): (&[u8], &[u8]) = (&[], &[]);
    while let Some((f, wt)) = l.key()? {
        match (f, wt) {
            (1, 2) => name = l.bytes()?,
            (2, 2) => value = l.bytes()?,
            (_, wt) => l.skip(wt)?,
        }
    }
    Ok((name, value))
}

/// Resolves a 2.0 symbol reference (for an error, the reader where it was found).
type SymbolOf<'s, 'a> = &'s dyn Fn(u64, &Wire<'_>) -> Result<&'a [u8], DecodeError>;

/// An exemplar message: labels (1: `Label` messages in 1.0, symbol references in 2.0), value
/// (2, double), timestamp (3, int64).
fn read_exemplar<'a>(
    buf: &'a [u8],
    out: &mut WriteBatch<'a>,
    symbol: SymbolOf<'_, 'a>,
    v2: bool,
) -> Result<(), DecodeError> {
    let mut w = Wire { buf, pos: 0 };
    let l0 = out.exemplar_labels.len();
    let mut refs: Vec<u64> = Vec::new();
    let (mut v, mut t) = (0f64, 0i64);
    while let Some((f, wt)) = w.key()? {
        match (f, wt) {
            (1, 2) if !v2 => out.exemplar_labels.push(read_label(w.bytes()?)?),
            (1, 0 | 2) if v2 => w.repeated(wt, Wire::varint, &mut refs)?,
            (2, 1) => v = f64::from_bits(w.fixed64()?),
            (3, 0) => t = w.varint()? as i64,
            (_, wt) => w.skip(wt)?,
        }
    }
    if !refs.len().is_multiple_of(2) {
        return Err(w.err("odd number of exemplar label references"));
    }
    for pair in refs.chunks(2) {
        out.exemplar_labels.push((symbol(pair[0], &w)?, symbol(pair[1], &w)?));
    }
    out.exemplars.push((l0..out.exemplar_labels.len(), t, v));
    Ok(())
}

fn read_series<'a>(buf: &'a [u8], out: &mut WriteBatch<'a>) -> Result<(), DecodeError> {
    let (l0, s0, h0, e0) = (out.labels.len(), out.samples.len(), out.histograms.len(), out.exemplars.len());
    let mut w = Wire { buf, pos: 0 };
    while let Some((field, wire)) = w.key()? {
        match (field, wire) {
            (1, 2) => out.labels.push(read_label(w.bytes()?)?),
            (2, 2) => {
                out.samples.push(read_sample(w.bytes()?)?);
            }
            (3, 2) => read_exemplar(w.bytes()?, out, &|_, w| Err(w.err("no symbols in 1.0")), false)?,
            (4, 2) => {
                // 1.0 histograms have no start time.
                let (t, _, h) = read_histogram(w.bytes()?)?;
                out.histograms.push((t, h));
            }
            (_, wire) => w.skip(wire)?,
        }
    }
    out.series.push(SeriesSpan {
        labels: l0..out.labels.len(),
        samples: s0..out.samples.len(),
        histograms: h0..out.histograms.len(),
        exemplars: e0..out.exemplars.len(),
    });
    Ok(())
}

/// Reads a remote write 2.0 `io.prometheus.write.v2.Request` in place into the same
/// `WriteBatch` as 1.0: labels are resolved from the request's symbol table (`symbols`,
/// field 4; `timeseries`, field 5, each with `labels_refs` as packed or repeated uint32 pairs,
/// `samples` in field 2, histograms in field 3, metadata in field 5). An out-of-range symbol
/// reference or an odd number of references is a decoding error.
pub fn read_write_request_v2(raw: &[u8]) -> Result<WriteBatch<'_>, DecodeError> {
    read_write_request_v2_into(raw, WriteBatch::default())
}

/// `read_write_request_v2` into the buffers of `out` (an empty batch, `WriteBatch::recycle`).
pub fn read_write_request_v2_into<'a>(raw: &'a [u8], mut out: WriteBatch<'a>) -> Result<WriteBatch<'a>, DecodeError> {
    debug_assert!(out.series.is_empty() && out.labels.is_empty(), "decoding into a batch that holds series");
    let mut symbols: Vec<&[u8]> = Vec::new();
    let mut series: Vec<&[u8]> = Vec::new();
    let mut w = Wire { buf: raw, pos: 0 };
    while let Some((field, wire)) = w.key()? {
        match (field, wire) {
            (4, 2) => symbols.push(w.bytes()?),
            (5, 2) => series.push(w.bytes()?),
            (_, wire) => w.skip(wire)?,
        }
    }
    let sym = |r: u64, w: &Wire<'_>| -> Result<&[u8], DecodeError> {
        symbols.get(r as usize).copied().ok_or_else(|| w.err(&format!("symbol reference {r} out of range")))
    };
    for buf in series {
        let (l0, s0, h0, e0) = (out.labels.len(), out.samples.len(), out.histograms.len(), out.exemplars.len());
        let mut refs: Vec<u64> = Vec::new();
        let mut w = Wire { buf, pos: 0 };
        let mut metadata: Option<(i32, u64, u64)> = None;
        // The series' start time in drafts before 2.0-rc.4 (field 6), for samples without one.
        let mut legacy_start = 0i64;
        while let Some((field, wire)) = w.key()? {
            match (field, wire) {
                (1, 2) => {
                    let mut p = Wire { buf: w.bytes()?, pos: 0 };
                    while p.pos < p.buf.len() {
                        refs.push(p.varint()?);
                    }
                }
                (1, 0) => refs.push(w.varint()?),
                (2, 2) => {
                    let mut s = Wire { buf: w.bytes()?, pos: 0 };
                    let (mut v, mut t, mut st) = (0f64, 0i64, 0i64);
                    while let Some((f, wt)) = s.key()? {
                        match (f, wt) {
                            (1, 1) => v = f64::from_bits(s.fixed64()?),
                            (2, 0) => t = s.varint()? as i64,
                            (3, 0) => st = s.varint()? as i64,
                            (_, wt) => s.skip(wt)?,
                        }
                    }
                    out.samples.push(strata_model::Sample::new(t, v));
                    push_start(&mut out.sample_starts, out.samples.len(), st);
                }
                (3, 2) => {
                    let (t, st, h) = read_histogram(w.bytes()?)?;
                    out.histograms.push((t, h));
                    push_start(&mut out.histogram_starts, out.histograms.len(), st);
                }
                (4, 2) => read_exemplar(w.bytes()?, &mut out, &sym, true)?,
                (6, 0) => legacy_start = w.varint()? as i64,
                (5, 2) => {
                    let mut m = Wire { buf: w.bytes()?, pos: 0 };
                    let (mut kind, mut help, mut unit) = (0i32, 0u64, 0u64);
                    while let Some((f, wt)) = m.key()? {
                        match (f, wt) {
                            (1, 0) => kind = m.varint()? as i32,
                            (3, 0) => help = m.varint()?,
                            (4, 0) => unit = m.varint()?,
                            (_, wt) => m.skip(wt)?,
                        }
                    }
                    metadata = Some((kind, help, unit));
                }
                (_, wire) => w.skip(wire)?,
            }
        }
        if legacy_start != 0 {
            for (starts, n0, n) in
                [(&mut out.sample_starts, s0, out.samples.len()), (&mut out.histogram_starts, h0, out.histograms.len())]
            {
                for i in n0..n {
                    if starts.get(i).is_none_or(|&st| st == 0) {
                        push_start_at(starts, i, legacy_start);
                    }
                }
            }
        }
        if !refs.len().is_multiple_of(2) {
            return Err(w.err("odd number of label references"));
        }
        let mut name = None;
        for pair in refs.chunks(2) {
            let (n, v) = (sym(pair[0], &w)?, sym(pair[1], &w)?);
            if n == b"__name__" {
                name = Some(v);
            }
            out.labels.push((n, v));
        }
        if let (Some((kind, help, unit)), Some(name)) = (metadata, name) {
            // v2 types: 0 unknown, 1 counter, 2 gauge, 3 histogram, 4 gaugehistogram, 5 summary,
            // 6 info, 7 stateset — the same numbers as 1.0's.
            if kind != 0 || help != 0 || unit != 0 {
                out.metadata.push(MetricMetadata {
                    r#type: kind,
                    metric_family_name: String::from_utf8_lossy(name).into_owned(),
                    help: String::from_utf8_lossy(sym(help, &w)?).into_owned(),
                    unit: String::from_utf8_lossy(sym(unit, &w)?).into_owned(),
                });
            }
        }
        out.series.push(SeriesSpan {
            labels: l0..out.labels.len(),
            samples: s0..out.samples.len(),
            histograms: h0..out.histograms.len(),
            exemplars: e0..out.exemplars.len(),
        });
    }
    // Parallel to the samples to the end, once any has a start time.
    if !out.sample_starts.is_empty() {
        out.sample_starts.resize(out.samples.len(), 0);
    }
    if !out.histogram_starts.is_empty() {
        out.histogram_starts.resize(out.histograms.len(), 0);
    }
    Ok(out)
}

/// Remote write 2.0 messages, for encoding (tests, benchmarks): `io.prometheus.write.v2`.
pub mod v2 {
    use prost::Message;

    #[derive(Clone, PartialEq, Message)]
    pub struct Request {
        #[prost(string, repeated, tag = "4")]
        pub symbols: Vec<String>,
        #[prost(message, repeated, tag = "5")]
        pub timeseries: Vec<TimeSeries>,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct TimeSeries {
        #[prost(uint32, repeated, tag = "1")]
        pub labels_refs: Vec<u32>,
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub histograms: Vec<super::Histogram>,
        #[prost(message, repeated, tag = "4")]
        pub exemplars: Vec<Exemplar>,
        #[prost(message, optional, tag = "5")]
        pub metadata: Option<Metadata>,
        /// Drafts before 2.0-rc.4: the series' start time (later moved to each sample).
        #[prost(int64, tag = "6")]
        pub created_timestamp: i64,
    }

    /// A 2.0 exemplar: labels as symbol references.
    #[derive(Clone, PartialEq, Message)]
    pub struct Exemplar {
        #[prost(uint32, repeated, tag = "1")]
        pub labels_refs: Vec<u32>,
        #[prost(double, tag = "2")]
        pub value: f64,
        #[prost(int64, tag = "3")]
        pub timestamp: i64,
    }

    /// A 2.0 sample: 1.0's with a start time (0: none).
    #[derive(Clone, PartialEq, Message)]
    pub struct Sample {
        #[prost(double, tag = "1")]
        pub value: f64,
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
        #[prost(int64, tag = "3")]
        pub start_timestamp: i64,
    }

    #[derive(Clone, PartialEq, Message)]
    pub struct Metadata {
        #[prost(int32, tag = "1")]
        pub r#type: i32,
        #[prost(uint32, tag = "3")]
        pub help_ref: u32,
        #[prost(uint32, tag = "4")]
        pub unit_ref: u32,
    }

    /// Label pairs and `(timestamp ms, value)` samples of one series.
    pub type SeriesInput<'a> = (Vec<(&'a str, &'a str)>, Vec<(i64, f64)>);

    /// Builds a request from label sets, interning strings (symbol 0 is "", as the spec asks).
    pub fn request(series: &[SeriesInput<'_>]) -> Request {
        let mut symbols: Vec<String> = vec![String::new()];
        let mut index = std::collections::HashMap::new();
        let mut intern = |s: &str| -> u32 {
            *index.entry(s.to_owned()).or_insert_with(|| {
                symbols.push(s.to_owned());
                (symbols.len() - 1) as u32
            })
        };
        let timeseries = series
            .iter()
            .map(|(labels, samples)| TimeSeries {
                labels_refs: labels.iter().flat_map(|(n, v)| [intern(n), intern(v)]).collect(),
                samples: samples.iter().map(|&(t, v)| Sample { value: v, timestamp: t, start_timestamp: 0 }).collect(),
                histograms: Vec::new(),
                exemplars: vec![],
                metadata: None,
                created_timestamp: 0,
            })
            .collect();
        Request { symbols, timeseries }
    }
}

#[cfg(test)]
mod batch_tests {
    use super::*;
    use proptest::prelude::*;

    /// Integer or float histograms with arbitrary spans and counts (not necessarily valid ones:
    /// the reader must carry them over exactly; validation comes later).
    fn arb_histogram() -> impl Strategy<Value = Histogram> {
        let spans =
            prop::collection::vec((-5i32..5, 0u32..4).prop_map(|(offset, length)| BucketSpan { offset, length }), 0..3);
        (
            any::<i64>(),
            any::<bool>(),
            spans.clone(),
            spans,
            prop::collection::vec(-3i64..5, 0..6),
            -4i32..9,
            0i32..4,
            any::<f64>(),
        )
            .prop_map(|(t, int, pos, neg, counts, schema, hint, sum)| {
                let mut h = Histogram {
                    timestamp: t,
                    schema,
                    sum,
                    reset_hint: hint,
                    zero_threshold: 0.001,
                    positive_spans: pos,
                    negative_spans: neg,
                    ..Histogram::default()
                };
                if int {
                    h.count_int = Some(counts.iter().map(|c| c.unsigned_abs()).sum());
                    h.zero_count_int = Some(1);
                    h.positive_deltas = counts.clone();
                    h.negative_deltas = counts;
                } else {
                    h.count_float = Some(counts.iter().sum::<i64>() as f64);
                    h.zero_count_float = Some(0.5);
                    h.positive_counts = counts.iter().map(|c| *c as f64).collect();
                    h.custom_values = vec![1.0, 2.5];
                }
                h
            })
    }

    /// What `read_histogram` must make of a message.
    fn expected(h: &Histogram) -> strata_model::FloatHistogram {
        let cumulative = |d: &[i64]| {
            let mut c = 0i64;
            d.iter()
                .map(|x| {
                    c += x;
                    c as f64
                })
                .collect::<Vec<f64>>()
        };
        let spans = |s: &[BucketSpan]| {
            s.iter().map(|s| strata_model::histogram::Span { offset: s.offset, length: s.length }).collect()
        };
        strata_model::FloatHistogram {
            hint: strata_model::CounterResetHint::from_u8(h.reset_hint as u8).unwrap(),
            schema: h.schema,
            zero_threshold: h.zero_threshold,
            zero_count: h.zero_count_int.map(|c| c as f64).or(h.zero_count_float).unwrap_or(0.0),
            count: h.count_int.map(|c| c as f64).or(h.count_float).unwrap_or(0.0),
            sum: h.sum,
            positive_spans: spans(&h.positive_spans),
            negative_spans: spans(&h.negative_spans),
            positive_buckets: if h.positive_deltas.is_empty() {
                h.positive_counts.clone()
            } else {
                cumulative(&h.positive_deltas)
            },
            negative_buckets: if h.negative_deltas.is_empty() {
                h.negative_counts.clone()
            } else {
                cumulative(&h.negative_deltas)
            },
            custom_values: h.custom_values.clone(),
        }
    }

    fn arb_request() -> impl Strategy<Value = WriteRequest> {
        let label = ("[a-z_]{0,6}", "\\PC{0,6}").prop_map(|(n, v)| Label::new(n, v));
        let sample = (any::<i64>(), any::<f64>()).prop_map(|(t, v)| Sample { value: v, timestamp: t });
        let series = (
            prop::collection::vec(label, 0..5),
            prop::collection::vec(sample, 0..5),
            prop::collection::vec(arb_histogram(), 0..2),
        )
            .prop_map(|(labels, samples, histograms)| TimeSeries {
                labels,
                samples,
                histograms,
                exemplars: vec![],
            });
        let md = ("[a-z]{0,5}", 0..8i32).prop_map(|(n, t)| MetricMetadata {
            r#type: t,
            metric_family_name: n,
            help: "h".into(),
            unit: String::new(),
        });
        (prop::collection::vec(series, 0..6), prop::collection::vec(md, 0..2))
            .prop_map(|(timeseries, metadata)| WriteRequest { timeseries, metadata })
    }

    proptest! {
        /// The in-place reader sees exactly what prost decodes.
        #[test]
        fn in_place_reader_agrees_with_prost(req in arb_request()) {
            let raw = req.encode_to_vec();
            // Compare with what prost reads back (its encoder drops a -0.0 value as a default).
            let req = WriteRequest::decode(&raw[..]).unwrap();
            let b = read_write_request(&raw).unwrap();
            prop_assert_eq!(b.series.len(), req.timeseries.len());
            prop_assert_eq!(&b.metadata, &req.metadata);
            for (span, ts) in b.series.iter().zip(&req.timeseries) {
                let labels: Vec<(&[u8], &[u8])> = ts.labels.iter().map(|l| (l.name.as_bytes(), l.value.as_bytes())).collect();
                prop_assert_eq!(&b.labels[span.labels.clone()], &labels[..]);
                let samples: Vec<(i64, u64)> = ts.samples.iter().map(|s| (s.timestamp, s.value.to_bits())).collect();
                let got: Vec<(i64, u64)> = b.samples[span.samples.clone()].iter().map(|s| (s.t, s.v.to_bits())).collect();
                prop_assert_eq!(got, samples);
                let got = &b.histograms[span.histograms.clone()];
                prop_assert_eq!(got.len(), ts.histograms.len());
                for ((t, g), h) in got.iter().zip(&ts.histograms) {
                    prop_assert_eq!(*t, h.timestamp);
                    let e = expected(h);
                    prop_assert!(g.bit_eq(&e) && g.hint == e.hint, "{:?} vs {:?}", g, e);
                }
            }
        }

        /// Decoding into a recycled batch (the buffers a thread keeps between requests) reads
        /// exactly what decoding afresh does, with nothing of the earlier request left over,
        /// in either protocol; and the recycled batch keeps its buffers.
        #[test]
        fn recycled_batch_reads_like_a_fresh_one(a in arb_request(), b in arb_request()) {
            let (raw_a, raw_b) = (a.encode_to_vec(), b.encode_to_vec());
            let first = read_write_request(&raw_a).unwrap();
            let kept = first.labels.capacity();
            let recycled = first.recycle();
            prop_assert_eq!(recycled.labels.capacity(), kept);
            let again = read_write_request_into(&raw_b, recycled).unwrap();
            prop_assert_eq!(format!("{again:?}"), format!("{:?}", read_write_request(&raw_b).unwrap()));
            let v2_raw = v2::request(&[(vec![("__name__", "up")], vec![(1, 2.0)])]).encode_to_vec();
            let v2_again = read_write_request_v2_into(&v2_raw, again.recycle()).unwrap();
            prop_assert_eq!(format!("{v2_again:?}"), format!("{:?}", read_write_request_v2(&v2_raw).unwrap()));
        }

        /// Arbitrary bytes give an error or a batch, never a panic.
        #[test]
        fn in_place_reader_never_panics(data in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = read_write_request(&data);
            let _ = read_write_request_v2(&data);
        }

        /// A 2.0 request reads back to the same label sets and samples as the 1.0 form.
        #[test]
        fn v2_reads_like_v1(req in arb_request()) {
            let series: Vec<v2::SeriesInput> = req
                .timeseries
                .iter()
                .map(|ts| {
                    let l = ts.labels.iter().map(|l| (l.name.as_str(), l.value.as_str())).collect();
                    (l, ts.samples.iter().map(|s| (s.timestamp, s.value)).collect())
                })
                .collect();
            let raw = v2::request(&series).encode_to_vec();
            let b = read_write_request_v2(&raw).unwrap();
            prop_assert_eq!(b.series.len(), series.len());
            for (span, (labels, samples)) in b.series.iter().zip(&series) {
                let want: Vec<(&[u8], &[u8])> = labels.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())).collect();
                prop_assert_eq!(&b.labels[span.labels.clone()], &want[..]);
                let got: Vec<(i64, u64)> = b.samples[span.samples.clone()].iter().map(|s| (s.t, s.v.to_bits())).collect();
                // prost leaves a -0.0 value out as a default, so it reads back as 0.0.
                let want: Vec<(i64, u64)> = samples.iter().map(|&(t, v)| (t, if v == 0.0 { 0 } else { v.to_bits() })).collect();
                prop_assert_eq!(got, want);
            }
        }
    }
}
