//! The histogram chunk: native histograms of one series with one bucket layout.
//!
//! A chunk stores its layout once (schema, zero threshold, spans, custom bounds), then per
//! sample a delta-of-delta timestamp and every field (count, zero count, sum, each bucket)
//! XOR-coded against the same field of the previous sample, each with its own window. Counts of
//! a scraped histogram change little from one scrape to the next, so most fields cost a few bits.
//! A sample whose layout differs is expanded into the chunk's (missing buckets are zero); when
//! it brings new buckets the head re-encodes the chunk with the wider layout (`recode`). A
//! change of schema, zero threshold or custom bounds starts a new chunk.
//!
//! Byte layout: `docs/format/chunks.md`.

use strata_model::histogram::{layout_union, Span};
use strata_model::{CounterResetHint, FloatHistogram};

use super::bstream::{BitReader, BitWriter};
use super::start_time::StartTimeReader;
use super::xor::{read_dod, read_xor, write_dod, write_xor, NO_WINDOW};
use super::{ChunkError, Encoding, HEADER_BYTES, SAMPLES_MAX};

/// Offset of the counter-reset byte, right after the common header.
const RESET_BYTE: usize = HEADER_BYTES;
/// Where the bit stream (layout, then samples) starts.
const BODY_START: usize = HEADER_BYTES + 1;
/// Fields before the buckets: count, zero count, sum.
const FIXED_FIELDS: usize = 3;

/// What every sample of a chunk shares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Layout {
    pub schema: i32,
    pub zero_threshold: f64,
    pub positive: Vec<Span>,
    pub negative: Vec<Span>,
    pub custom_values: Vec<f64>,
}

impl Layout {
    pub fn of(h: &FloatHistogram) -> Layout {
        Layout {
            schema: h.schema,
            zero_threshold: h.zero_threshold,
            // Canonical spans (maximal runs), so that layouts compare by value.
            positive: layout_union(&h.positive_spans, &[]),
            negative: layout_union(&h.negative_spans, &[]),
            custom_values: h.custom_values.clone(),
        }
    }

    /// Whether samples of `h`'s kind can share a chunk with this layout (after expanding
    /// spans): same schema, zero threshold and custom bounds.
    pub fn compatible(&self, h: &FloatHistogram) -> bool {
        self.schema == h.schema
            && self.zero_threshold.to_bits() == h.zero_threshold.to_bits()
            && self.custom_values.len() == h.custom_values.len()
            && self.custom_values.iter().zip(&h.custom_values).all(|(a, b)| a.to_bits() == b.to_bits())
    }

    /// Whether every bucket of `h` has a place in this layout.
    pub fn covers(&self, h: &FloatHistogram) -> bool {
        layout_union(&self.positive, &h.positive_spans) == self.positive
            && layout_union(&self.negative, &h.negative_spans) == self.negative
    }

    /// This layout widened by `h`'s buckets.
    pub fn widened(&self, h: &FloatHistogram) -> Layout {
        Layout {
            positive: layout_union(&self.positive, &h.positive_spans),
            negative: layout_union(&self.negative, &h.negative_spans),
            ..self.clone()
        }
    }

    fn buckets(&self) -> (usize, usize) {
        let n = |s: &[Span]| s.iter().map(|s| s.length as usize).sum();
        (n(&self.positive), n(&self.negative))
    }
}

/// Counter-reset information kept per chunk (the byte after the header).
fn reset_byte(h: CounterResetHint) -> u8 {
    h.to_u8()
}

/// Appends histograms to a chunk. The bytes are a valid chunk after every append.
#[derive(Clone, Debug)]
pub struct HistogramAppender {
    w: BitWriter,
    layout: Layout,
    count: u16,
    t: i64,
    delta: u64,
    /// Bits of the previous sample's fields: count, zero count, sum, then positive and
    /// negative buckets.
    prev: Vec<u64>,
    windows: Vec<(u8, u8)>,
}

impl HistogramAppender {
    /// A new chunk with `layout`; `header` is the counter-reset knowledge of its first sample
    /// (`Gauge` makes it a gauge chunk).
    pub fn new(layout: Layout, header: CounterResetHint) -> Self {
        let mut w = BitWriter::with_bytes(vec![Encoding::Histogram as u8, 0, 0, reset_byte(header)]);
        w.write_varint(layout.schema as i64);
        w.write_bits(layout.zero_threshold.to_bits(), 64);
        for spans in [&layout.positive, &layout.negative] {
            w.write_uvarint(spans.len() as u64);
            for s in spans.iter() {
                w.write_varint(s.offset as i64);
                w.write_uvarint(s.length as u64);
            }
        }
        w.write_uvarint(layout.custom_values.len() as u64);
        for v in &layout.custom_values {
            w.write_bits(v.to_bits(), 64);
        }
        let (p, n) = layout.buckets();
        let fields = FIXED_FIELDS + p + n;
        HistogramAppender {
            w,
            layout,
            count: 0,
            t: 0,
            delta: 0,
            prev: vec![0; fields],
            windows: vec![(NO_WINDOW, 0); fields],
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn header(&self) -> CounterResetHint {
        CounterResetHint::from_u8(self.w.bytes()[RESET_BYTE]).unwrap_or_default()
    }

    pub fn num_samples(&self) -> usize {
        self.count as usize
    }

    pub fn bytes(&self) -> &[u8] {
        self.w.bytes()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.w.into_bytes()
    }

    pub fn is_full(&self) -> bool {
        self.count as usize >= SAMPLES_MAX
    }

    pub fn last_t(&self) -> i64 {
        self.t
    }

    /// The last appended histogram (meaningless when empty), with the hint a reader would see.
    pub fn last(&self) -> FloatHistogram {
        let hint = read_hint(self.header(), self.count.saturating_sub(1));
        materialize(&self.layout, &self.prev, hint)
    }

    /// Appends `h`, which must fit the layout (`compatible` and `covered`); a stale marker fits
    /// any layout. Timestamps must increase; both are invariants of the head, so asserted.
    pub fn append(&mut self, t: i64, h: &FloatHistogram) {
        assert!(!self.is_full(), "histogram chunk is full ({SAMPLES_MAX} samples)");
        debug_assert!(self.count == 0 || t > self.t, "timestamps must increase: {} after {}", t, self.t);
        let stale = h.is_stale();
        debug_assert!(
            stale || (self.layout.compatible(h) && self.layout.covers(h)),
            "histogram outside the chunk layout"
        );
        let mut vals = Vec::with_capacity(self.prev.len());
        vals.extend([h.count.to_bits(), h.zero_count.to_bits(), h.sum.to_bits()]);
        if stale {
            // Buckets are not written for a stale marker; they stay the XOR base.
            vals.extend_from_slice(&self.prev[FIXED_FIELDS..]);
        } else {
            expand_into(&self.layout.positive, h.bucket_pairs(true), &mut vals);
            expand_into(&self.layout.negative, h.bucket_pairs(false), &mut vals);
        }
        match self.count {
            0 => {
                self.w.write_varint(t);
                for v in &vals {
                    self.w.write_bits(*v, 64);
                }
            }
            n => {
                let delta = (t as u64).wrapping_sub(self.t as u64);
                if n == 1 {
                    self.w.write_uvarint(delta);
                } else {
                    write_dod(&mut self.w, delta.wrapping_sub(self.delta) as i64);
                }
                self.delta = delta;
                let fields = if stale { FIXED_FIELDS } else { vals.len() };
                for (i, v) in vals.iter().enumerate().take(fields) {
                    let (l, tr) = &mut self.windows[i];
                    write_xor(&mut self.w, self.prev[i], *v, l, tr);
                }
            }
        }
        self.prev = vals;
        self.t = t;
        self.count += 1;
        self.w.bytes_mut()[1..HEADER_BYTES].copy_from_slice(&self.count.to_be_bytes());
    }

    /// This chunk re-encoded with the wider `layout` (new buckets zero in earlier samples).
    pub fn recode(&self, layout: Layout) -> HistogramAppender {
        let mut out = HistogramAppender::new(layout, self.header());
        let mut it = HistogramIterator::new(self.bytes());
        while let Some((t, h)) = it.next() {
            out.append(t, &h);
        }
        debug_assert!(it.err().is_none());
        out
    }
}

/// Writes the counts of `pairs` at their places in `spans` (zero where absent) into `out`.
fn expand_into(spans: &[Span], pairs: impl Iterator<Item = (i32, f64)>, out: &mut Vec<u64>) {
    let mut pairs = pairs.peekable();
    let mut idx = 0i32;
    for (k, s) in spans.iter().enumerate() {
        idx = if k == 0 { s.offset } else { idx + s.offset };
        for _ in 0..s.length {
            let c = match pairs.peek() {
                Some(&(i, c)) if i == idx => {
                    pairs.next();
                    c
                }
                _ => 0.0,
            };
            out.push(c.to_bits());
            idx += 1;
        }
    }
    debug_assert!(pairs.next().is_none(), "a bucket outside the layout");
}

/// The hint a reader reports for sample `read` (0-based) of a chunk with this header: a gauge
/// chunk holds gauges; later samples of a counter chunk follow no reset (the head cuts a chunk
/// at every reset); the first one is unknown, because the chunk before it may have been
/// removed or another one inserted since (as Prometheus reasons, prometheus#15346).
fn read_hint(header: CounterResetHint, read: u16) -> CounterResetHint {
    match header {
        CounterResetHint::Gauge => CounterResetHint::Gauge,
        _ if read > 0 => CounterResetHint::NotReset,
        _ => CounterResetHint::Unknown,
    }
}

fn materialize(layout: &Layout, vals: &[u64], hint: CounterResetHint) -> FloatHistogram {
    let (p, _) = layout.buckets();
    let f = |i: usize| f64::from_bits(vals[i]);
    let sum = f(2);
    if strata_model::is_stale_nan(sum) {
        return FloatHistogram { hint, ..FloatHistogram::stale_marker() };
    }
    let buckets = |r: std::ops::Range<usize>| vals[r].iter().map(|b| f64::from_bits(*b)).collect::<Vec<f64>>();
    FloatHistogram {
        hint,
        schema: layout.schema,
        zero_threshold: layout.zero_threshold,
        zero_count: f(1),
        count: f(0),
        sum,
        positive_spans: layout.positive.clone(),
        negative_spans: layout.negative.clone(),
        positive_buckets: buckets(FIXED_FIELDS..FIXED_FIELDS + p),
        negative_buckets: buckets(FIXED_FIELDS + p..vals.len()),
        custom_values: layout.custom_values.clone(),
    }
}

/// Decodes a histogram chunk.
#[derive(Clone, Debug)]
pub struct HistogramIterator<B> {
    data: B,
    r: BitReader,
    header: CounterResetHint,
    layout: Layout,
    total: u16,
    read: u16,
    t: i64,
    delta: u64,
    vals: Vec<u64>,
    windows: Vec<(u8, u8)>,
    err: Option<ChunkError>,
    /// The start-time column, in a chunk that has one.
    start_times: Option<Box<StartTimeReader>>,
}

impl<B: AsRef<[u8]>> HistogramIterator<B> {
    /// Reads the chunk's start-time column along with its samples (see `start`).
    pub(super) fn with_start_times(mut self, column: StartTimeReader) -> Self {
        self.start_times = Some(Box::new(column));
        self
    }

    /// The start time of the sample `next` last returned; 0 when it has none.
    pub fn start(&self) -> i64 {
        self.start_times.as_ref().map_or(0, |c| c.last())
    }

    /// The caller has checked the encoding byte and the header.
    pub(super) fn new(data: B) -> Self {
        let d = data.as_ref();
        let total = u16::from_be_bytes([d[1], d[2]]);
        let mut it = HistogramIterator {
            header: d.get(RESET_BYTE).and_then(|b| CounterResetHint::from_u8(*b)).unwrap_or_default(),
            data,
            r: BitReader::new(BODY_START),
            layout: Layout::default(),
            total,
            read: 0,
            t: 0,
            delta: 0,
            vals: Vec::new(),
            windows: Vec::new(),
            err: None,
            start_times: None,
        };
        if it.read_layout().is_none() {
            it.err = Some(ChunkError::Truncated { sample: 0, samples: total as usize });
        }
        it
    }

    fn read_layout(&mut self) -> Option<()> {
        let d = self.data.as_ref();
        if d.len() < BODY_START {
            return None;
        }
        let r = &mut self.r;
        let schema = i32::try_from(r.read_varint(d)?).ok()?;
        let zero_threshold = f64::from_bits(r.read_bits(d, 64)?);
        let mut sides = [Vec::new(), Vec::new()];
        for side in &mut sides {
            let n = r.read_uvarint(d)? as usize;
            // Each span takes at least two bytes: a bound on what a corrupt count may allocate.
            if n > d.len() {
                return None;
            }
            for _ in 0..n {
                let offset = i32::try_from(r.read_varint(d)?).ok()?;
                let length = u32::try_from(r.read_uvarint(d)?).ok()?;
                side.push(Span { offset, length });
            }
        }
        let n = r.read_uvarint(d)? as usize;
        if n > d.len() {
            return None;
        }
        let custom_values = (0..n).map(|_| r.read_bits(d, 64).map(f64::from_bits)).collect::<Option<Vec<_>>>()?;
        let [positive, negative] = sides;
        self.layout = Layout { schema, zero_threshold, positive, negative, custom_values };
        let (p, n) = self.layout.buckets();
        // A bucket costs at least one bit per sample after the first, 64 in the first.
        if p + n > d.len() * 8 {
            return None;
        }
        self.vals = vec![0; FIXED_FIELDS + p + n];
        self.windows = vec![(0, 0); self.vals.len()];
        if r.overran(d) {
            return None;
        }
        Some(())
    }

    pub fn num_samples(&self) -> usize {
        self.total as usize
    }

    pub fn err(&self) -> Option<&ChunkError> {
        self.err.as_ref()
    }

    /// A float-only read of this chunk: ends iteration with `ChunkError::HistogramChunk`.
    pub(super) fn refuse_float_read<T>(&mut self) -> Option<T> {
        self.err.get_or_insert(ChunkError::HistogramChunk);
        None
    }

    fn decode_next(&mut self) -> Option<()> {
        let d = self.data.as_ref();
        let r = &mut self.r;
        match self.read {
            0 => {
                self.t = r.read_varint(d)?;
                for v in self.vals.iter_mut() {
                    *v = r.read_bits(d, 64)?;
                }
                return (!r.overran(d)).then_some(());
            }
            1 => self.delta = r.read_uvarint(d)?,
            _ => self.delta = self.delta.wrapping_add(read_dod(r, d) as u64),
        }
        self.t = (self.t as u64).wrapping_add(self.delta) as i64;
        for i in 0..self.vals.len() {
            if i == FIXED_FIELDS && strata_model::is_stale_nan(f64::from_bits(self.vals[2])) {
                break; // a stale marker carries no buckets
            }
            let (l, t) = &mut self.windows[i];
            if !read_xor(r, d, &mut self.vals[i], l, t) {
                return None;
            }
        }
        (!r.overran(d)).then_some(())
    }

    /// Advances to the next sample; `None` at the end or on a decoding error (see `err`).
    #[allow(clippy::should_implement_trait, reason = "a sample cursor with seek, like the XOR iterator")]
    pub fn next(&mut self) -> Option<(i64, FloatHistogram)> {
        if self.read >= self.total || self.err.is_some() {
            return None;
        }
        if self.decode_next().is_none() {
            self.err = Some(ChunkError::Truncated { sample: self.read as usize, samples: self.total as usize });
            return None;
        }
        if let Some(col) = &mut self.start_times {
            match col.next(self.data.as_ref(), self.t) {
                Some(_) => {}
                None => {
                    self.err = Some(ChunkError::Corrupt(format!("start-time column ends at sample {}", self.read)));
                    return None;
                }
            }
        }
        let hint = read_hint(self.header, self.read);
        self.read += 1;
        Some((self.t, materialize(&self.layout, &self.vals, hint)))
    }
}

#[cfg(test)]
mod tests {
    use strata_model::histogram::notation::parse;

    use super::*;
    use crate::chunkenc::{ChunkIterator, TypedValue};

    fn h(s: &str) -> FloatHistogram {
        parse(s).unwrap()
    }

    fn decode(bytes: &[u8]) -> Vec<(i64, FloatHistogram)> {
        let ChunkIterator::Histogram(mut it) = ChunkIterator::new(bytes).unwrap() else {
            panic!("not a histogram chunk")
        };
        let out: Vec<_> = std::iter::from_fn(|| it.next()).collect();
        assert!(it.err().is_none());
        out
    }

    #[test]
    fn round_trips_with_reader_hints() {
        let samples = [
            h("{{count:4 sum:5.5 z_bucket:1 z_bucket_w:0.001 buckets:[1 2] n_buckets:[0 0 1]}}"),
            h("{{count:7 sum:9.25 z_bucket:1 z_bucket_w:0.001 buckets:[2 3] n_buckets:[0 0 2]}}"),
            h("{{count:7 sum:9.25 z_bucket:1 z_bucket_w:0.001 buckets:[2 3] n_buckets:[0 0 2]}}"),
            h("{{count:9e300 sum:-1e-300 z_bucket:1 z_bucket_w:0.001 buckets:[2 NaN] n_buckets:[0 0 Inf]}}"),
        ];
        let mut a = HistogramAppender::new(Layout::of(&samples[0]), CounterResetHint::Reset);
        for (i, s) in samples.iter().enumerate() {
            a.append(1000 + 15_000 * i as i64 + (i as i64 % 2), s);
        }
        let got = decode(a.bytes());
        assert_eq!(got.len(), 4);
        for (i, (t, g)) in got.iter().enumerate() {
            assert_eq!(*t, 1000 + 15_000 * i as i64 + (i as i64 % 2));
            assert!(g.bit_eq(&samples[i]), "sample {i}");
            let want = if i == 0 { CounterResetHint::Unknown } else { CounterResetHint::NotReset };
            assert_eq!(g.hint, want);
        }
        assert!(a.last().bit_eq(&samples[3]));
        // A regular, slowly rising histogram costs a few bytes per sample.
        let mut a = HistogramAppender::new(Layout::of(&samples[0]), CounterResetHint::Unknown);
        for i in 0..120 {
            let mut s = samples[0].clone();
            s.count += i as f64;
            s.positive_buckets[1] += i as f64;
            a.append(i * 15_000, &s);
        }
        assert!(a.bytes().len() < 120 * 8, "{} bytes", a.bytes().len());
    }

    #[test]
    fn gauge_chunks_and_custom_buckets() {
        let g = h("{{schema:-53 custom_values:[0.5 1 +Inf] count:3 sum:1 buckets:[1 2] counter_reset_hint:gauge}}");
        let mut a = HistogramAppender::new(Layout::of(&g), CounterResetHint::Gauge);
        a.append(1, &g);
        a.append(2, &g);
        let got = decode(a.bytes());
        assert!(got.iter().all(|(_, x)| x.hint == CounterResetHint::Gauge && x.bit_eq(&g)));
    }

    #[test]
    fn narrower_samples_expand_and_recoding_widens() {
        let wide = h("{{count:3 buckets:[1 1 1]}}");
        let narrow = h("{{count:1 offset:1 buckets:[1]}}");
        let mut a = HistogramAppender::new(Layout::of(&wide), CounterResetHint::Unknown);
        a.append(1, &wide);
        assert!(a.layout().covers(&narrow));
        a.append(2, &narrow);
        let got = decode(a.bytes());
        assert_eq!(got[1].1.positive_buckets, vec![0.0, 1.0, 0.0]);
        // A sample with a bucket further out: the chunk is re-encoded with the union.
        let wider = h("{{count:5 offset:-2 buckets:[2 0 1 1 1]}}");
        assert!(!a.layout().covers(&wider));
        let mut b = a.recode(a.layout().widened(&wider));
        b.append(3, &wider);
        let got = decode(b.bytes());
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].1.positive_buckets, vec![0.0, 0.0, 1.0, 1.0, 1.0]);
        assert_eq!(got[1].1.positive_buckets, vec![0.0, 0.0, 0.0, 1.0, 0.0]);
        assert!(got[2].1.bit_eq(&wider));
    }

    #[test]
    fn stale_markers_keep_the_bucket_base() {
        let x = h("{{count:3 sum:2 buckets:[1 2]}}");
        let mut a = HistogramAppender::new(Layout::of(&x), CounterResetHint::Unknown);
        a.append(1, &x);
        a.append(2, &FloatHistogram::stale_marker());
        let mut y = x.clone();
        y.positive_buckets[0] = 5.0;
        a.append(3, &y);
        let got = decode(a.bytes());
        assert!(got[1].1.is_stale());
        assert!(got[2].1.bit_eq(&y));
        let typed: Vec<TypedValue> = {
            let mut it = ChunkIterator::new(a.bytes()).unwrap();
            std::iter::from_fn(|| it.next_typed().map(|s| s.value)).collect()
        };
        assert!(matches!(typed[1], TypedValue::Histogram(ref h) if h.is_stale()));
    }

    #[test]
    fn truncated_chunks_are_errors() {
        let x = h("{{count:3 sum:2 buckets:[1 2] n_buckets:[4]}}");
        let mut a = HistogramAppender::new(Layout::of(&x), CounterResetHint::Unknown);
        for t in 0..5 {
            a.append(t, &x);
        }
        let full = a.bytes().to_vec();
        for cut in HEADER_BYTES..full.len() {
            let Ok(ChunkIterator::Histogram(mut it)) = ChunkIterator::new(&full[..cut]) else { continue };
            while it.next().is_some() {}
            assert!(it.err().is_some(), "cut at {cut} of {}", full.len());
        }
    }
}
