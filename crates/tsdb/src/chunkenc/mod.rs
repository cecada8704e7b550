//! Chunk encodings: how the samples of one series are compressed together.
//!
//! Every chunk starts with one encoding byte, so readers dispatch on it and a denser encoding for
//! compacted blocks can be added later without touching existing data. Layout: `[encoding u8]
//! [sample count u16 BE][encoding-specific body]`; see `docs/format/chunks.md`.

pub mod bstream;
pub mod dense;
pub mod histogram;
pub mod rollup;
pub mod start_time;
pub mod xor;

pub use dense::DenseIterator;
pub use histogram::{HistogramAppender, HistogramIterator, Layout};
pub use start_time::StartTimeWriter;
use strata_model::{FloatHistogram, Sample};
pub use xor::{XorAppender, XorIterator};

/// A sample of either kind, as readers that handle both see it.
#[derive(Clone, Debug, PartialEq)]
pub enum TypedValue {
    Float(f64),
    Histogram(Box<FloatHistogram>),
}

/// A timestamped [`TypedValue`], with its start time (`st`, 0 when it has none; see
/// [`start_time`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TypedSample {
    pub t: i64,
    pub st: i64,
    pub value: TypedValue,
}

impl TypedSample {
    pub fn float(t: i64, v: f64) -> Self {
        TypedSample { t, st: 0, value: TypedValue::Float(v) }
    }

    pub fn histogram(t: i64, h: FloatHistogram) -> Self {
        TypedSample { t, st: 0, value: TypedValue::Histogram(Box::new(h)) }
    }

    /// The same sample with the start time `st`.
    pub fn with_start(self, st: i64) -> Self {
        TypedSample { st, ..self }
    }

    /// Same timestamp and start time, and bit-identical value.
    pub fn bit_eq(&self, other: &TypedSample) -> bool {
        self.t == other.t
            && self.st == other.st
            && match (&self.value, &other.value) {
                (TypedValue::Float(a), TypedValue::Float(b)) => a.to_bits() == b.to_bits(),
                (TypedValue::Histogram(a), TypedValue::Histogram(b)) => a.bit_eq(b),
                _ => false,
            }
    }
}

/// Bytes before the encoding-specific body: encoding (1) + sample count (2).
pub const HEADER_BYTES: usize = 3;

/// Samples per chunk before the head cuts a new one. 120 samples is 2 h at a 1-minute or 20 min
/// at a 10 s interval; past it the gain in bytes/sample is small (measured in the chunk bench:
/// 120 → 240 saves little on the node-exporter recording) while every query that needs one
/// sample must decode up to the whole chunk.
pub const SAMPLES_PER_CHUNK: usize = 120;

/// A chunk is also cut when it reaches this many bytes, so that a series with noisy values does
/// not produce multi-KiB chunks that every point lookup must decode.
pub const CHUNK_BYTES_TARGET: usize = 1024;

/// Hard limit of the u16 sample count in the header.
pub const SAMPLES_MAX: usize = u16::MAX as usize;

const _: () = assert!(SAMPLES_PER_CHUNK <= SAMPLES_MAX);

/// The encoding byte at offset 0 of every chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum Encoding {
    /// Delta-of-delta timestamps, Gorilla XOR floats.
    Xor = 1,
    /// Native histograms (float counts): the layout once, then every field XOR-coded.
    Histogram = 2,
    /// An XOR chunk followed by its samples' start times (`start_time`).
    XorWithStartTimes = 3,
    /// A histogram chunk followed by its samples' start times (`start_time`).
    HistogramWithStartTimes = 4,
    /// Float samples as blocks store them: integer-coded timestamps, decimal values as scaled
    /// integers, the rest XOR-coded (`dense`).
    Dense = 5,
    /// A run of rollup buckets of one series, one dense chunk per aggregate (`rollup`).
    Rollup = 6,
}

impl Encoding {
    pub fn from_byte(b: u8) -> Result<Self, ChunkError> {
        match b {
            1 => Ok(Encoding::Xor),
            2 => Ok(Encoding::Histogram),
            3 => Ok(Encoding::XorWithStartTimes),
            4 => Ok(Encoding::HistogramWithStartTimes),
            5 => Ok(Encoding::Dense),
            6 => Ok(Encoding::Rollup),
            other => Err(ChunkError::UnknownEncoding(other)),
        }
    }
}

/// A chunk that cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    #[error("unknown chunk encoding {0:#04x}")]
    UnknownEncoding(u8),
    #[error("chunk is {0} bytes, shorter than its {HEADER_BYTES}-byte header")]
    ShortHeader(usize),
    #[error("chunk data ends at sample {sample} of {samples}")]
    Truncated { sample: usize, samples: usize },
    /// A stored chunk failed its checksum or points outside its file (names file and offset).
    #[error("corrupt chunk: {0}")]
    Corrupt(String),
    /// A float-only reader met a histogram chunk (it must read typed samples instead).
    #[error("chunk holds native histograms; this reader handles float samples only")]
    HistogramChunk,
    /// A sample reader met a rollup chunk (aggregates, read with `rollup::decode`).
    #[error("chunk holds rollup aggregates, not samples")]
    RollupChunk,
}

/// A sample kind a whole chunk can be decoded into: float samples (histogram chunks refused)
/// or typed samples (either kind).
pub trait DecodedSample: Sized {
    fn decode_all<B: AsRef<[u8]>>(it: &mut ChunkIterator<B>, out: &mut Vec<Self>);
    fn t(&self) -> i64;
}

impl DecodedSample for Sample {
    fn decode_all<B: AsRef<[u8]>>(it: &mut ChunkIterator<B>, out: &mut Vec<Self>) {
        it.decode_into(out);
    }
    fn t(&self) -> i64 {
        self.t
    }
}

impl DecodedSample for TypedSample {
    fn decode_all<B: AsRef<[u8]>>(it: &mut ChunkIterator<B>, out: &mut Vec<Self>) {
        it.decode_typed_into(out);
    }
    fn t(&self) -> i64 {
        self.t
    }
}

/// `chunks` from the highest `rank` down (in their order within a rank): the order to hand
/// overlapping chunks to `decode_merged` so that at each timestamp the highest-ranked chunk's
/// sample is kept.
pub fn by_rank<T>(chunks: &[T], rank: impl Fn(&T) -> u64) -> impl Iterator<Item = &T> {
    let mut ranked: Vec<&T> = chunks.iter().collect();
    ranked.sort_by_key(|c| std::cmp::Reverse(rank(c)));
    ranked.into_iter()
}

/// Decodes overlapping chunks into `out` as one run: sorted by time, and of the samples sharing
/// a timestamp the one from the earliest chunk in `chunks` kept (the sort is stable).
pub fn decode_merged<S: DecodedSample, B: AsRef<[u8]>>(
    chunks: impl IntoIterator<Item = Result<B, ChunkError>>,
    out: &mut Vec<S>,
) -> Result<(), ChunkError> {
    for data in chunks {
        let mut it = ChunkIterator::new(data?)?;
        S::decode_all(&mut it, out);
        if let Some(e) = it.err() {
            return Err(e.clone());
        }
    }
    out.sort_by_key(S::t);
    out.dedup_by_key(|s| s.t());
    Ok(())
}

/// Iterates over the samples of one chunk, whatever its encoding.
#[derive(Clone, Debug)]
pub enum ChunkIterator<B> {
    Xor(XorIterator<B>),
    Histogram(HistogramIterator<B>),
    Dense(DenseIterator),
}

impl<B: AsRef<[u8]>> ChunkIterator<B> {
    /// Checks the header and dispatches on the encoding byte.
    pub fn new(data: B) -> Result<Self, ChunkError> {
        let d = data.as_ref();
        if d.len() < HEADER_BYTES {
            return Err(ChunkError::ShortHeader(d.len()));
        }
        match Encoding::from_byte(d[0])? {
            Encoding::Xor => Ok(ChunkIterator::Xor(XorIterator::new(data))),
            Encoding::Histogram => Ok(ChunkIterator::Histogram(HistogramIterator::new(data))),
            Encoding::XorWithStartTimes => {
                let column = start_time::StartTimeReader::new(d)?;
                Ok(ChunkIterator::Xor(XorIterator::new(data).with_start_times(column)))
            }
            Encoding::HistogramWithStartTimes => {
                let column = start_time::StartTimeReader::new(d)?;
                Ok(ChunkIterator::Histogram(HistogramIterator::new(data).with_start_times(column)))
            }
            Encoding::Dense => Ok(ChunkIterator::Dense(DenseIterator::new(d))),
            Encoding::Rollup => Err(ChunkError::RollupChunk),
        }
    }

    /// The next sample of either kind, with its start time.
    pub fn next_typed(&mut self) -> Option<TypedSample> {
        match self {
            ChunkIterator::Xor(x) => x.next().map(|s| TypedSample::float(s.t, s.v).with_start(x.start())),
            ChunkIterator::Histogram(h) => h.next().map(|(t, v)| TypedSample::histogram(t, v).with_start(h.start())),
            ChunkIterator::Dense(d) => d.next().map(|s| TypedSample::float(s.t, s.v)),
        }
    }

    /// Decodes every remaining sample, of either kind, into `out`.
    pub fn decode_typed_into(&mut self, out: &mut Vec<TypedSample>) {
        while let Some(s) = self.next_typed() {
            out.push(s);
        }
    }

    #[inline]
    #[allow(clippy::should_implement_trait, reason = "a sample cursor with seek, not a std Iterator")]
    /// The next float sample. A histogram chunk yields nothing and reports
    /// `ChunkError::HistogramChunk` from `err`: a float-only reader fails loudly on histogram
    /// data instead of skipping it.
    pub fn next(&mut self) -> Option<Sample> {
        match self {
            ChunkIterator::Xor(x) => x.next(),
            ChunkIterator::Histogram(h) => h.refuse_float_read(),
            ChunkIterator::Dense(d) => d.next(),
        }
    }

    /// Decodes every remaining float sample into `out` (the fast way to read a whole chunk);
    /// see `next` for histogram chunks.
    pub fn decode_into(&mut self, out: &mut Vec<Sample>) {
        match self {
            ChunkIterator::Xor(x) => x.decode_into(out),
            ChunkIterator::Histogram(h) => {
                h.refuse_float_read::<()>();
            }
            ChunkIterator::Dense(d) => d.decode_into(out),
        }
    }

    pub fn seek(&mut self, t: i64) -> Option<Sample> {
        match self {
            ChunkIterator::Xor(x) => x.seek(t),
            ChunkIterator::Histogram(h) => h.refuse_float_read(),
            ChunkIterator::Dense(d) => d.seek(t),
        }
    }

    pub fn num_samples(&self) -> usize {
        match self {
            ChunkIterator::Xor(x) => x.num_samples(),
            ChunkIterator::Histogram(h) => h.num_samples(),
            ChunkIterator::Dense(d) => d.num_samples(),
        }
    }

    /// The decoding error that ended iteration early, if any.
    pub fn err(&self) -> Option<&ChunkError> {
        match self {
            ChunkIterator::Xor(x) => x.err(),
            ChunkIterator::Histogram(h) => h.err(),
            ChunkIterator::Dense(d) => d.err(),
        }
    }
}

/// Sample count of a chunk, from its header.
pub fn num_samples(data: &[u8]) -> Result<usize, ChunkError> {
    if data.len() < HEADER_BYTES {
        return Err(ChunkError::ShortHeader(data.len()));
    }
    Encoding::from_byte(data[0])?;
    Ok(u16::from_be_bytes([data[1], data[2]]) as usize)
}

#[cfg(test)]
mod tests;
