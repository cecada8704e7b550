//! Query results written straight into Prometheus' JSON, without building a JSON tree: a
//! 24 h range over thousands of series is millions of points, and a tree of small
//! allocations cost more than the evaluation itself.

use std::fmt::Write;

use strata_model::{FloatHistogram, Labels};
use strata_promql::{Annotation, Point, Series, Value};

mod kept;
pub use kept::{keep_series, KeptSeries};

/// A JSON string literal.
pub fn string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let esc = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(esc);
        }
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Milliseconds as Prometheus writes times: seconds, with up to three decimals.
pub fn seconds(out: &mut String, ms: i64) {
    if ms < 0 {
        out.push('-');
    }
    let abs = ms.unsigned_abs();
    let (s, frac) = (abs / 1000, abs % 1000);
    out.push_str(itoa::Buffer::new().format(s));
    if frac != 0 {
        let digits = [b'0' + (frac / 100) as u8, b'0' + (frac / 10 % 10) as u8, b'0' + (frac % 10) as u8];
        let len = if frac % 100 == 0 {
            1
        } else if frac % 10 == 0 {
            2
        } else {
            3
        };
        out.push('.');
        out.push_str(std::str::from_utf8(&digits[..len]).expect("ASCII digits"));
    }
}

/// A sample value as Prometheus writes it: a string, `NaN`, `+Inf`, `-Inf`, or the shortest
/// decimal that reads back to the same float.
pub fn float(out: &mut String, v: f64) {
    out.push('"');
    sample_value(out, v);
    out.push('"');
}

/// Integers below this are written from an `i64` (exactly, and the same as a float would be).
const EXACT_INTEGER: f64 = 1e15;

/// Magnitudes zmij writes without an exponent (its decimal exponents -5 to 15), with a margin
/// at both ends so that no rounding at a bound matters; the test
/// `plain_range_values_are_written_without_exponent_by_zmij` checks the bounds' neighbours.
const PLAIN_RANGE: std::ops::Range<f64> = 1e-4..1e15;

/// A sample value as Prometheus prints it, unquoted (also the text exposition's form): Go's
/// `strconv.FormatFloat(v, 'f', -1, 64)`, the shortest decimal that reads back to the same
/// float, never with an exponent (which is also what Rust's `Display` writes).
pub fn sample_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v == v.trunc() && v.abs() < EXACT_INTEGER {
        // Counters, byte counts and the like: the common case, without the digit search.
        if v == 0.0 && v.is_sign_negative() {
            out.push_str("-0");
        } else {
            out.push_str(itoa::Buffer::new().format(v as i64));
        }
    } else {
        let mut buffer = zmij::Buffer::new();
        let shortest = buffer.format_finite(v);
        // zmij writes a decimal exponent from -5 to 15 in plain digits (`FIXED_DEC_EXP`), so a
        // value in `PLAIN_RANGE` never has one: not looked for (the search was 2% of a wide
        // answer's CPU). Outside it, the `e` comes at the end (`1e-7`, `1.2345e21`, `5e-324`),
        // among the last five bytes.
        let plain =
            PLAIN_RANGE.contains(&v.abs()) || !shortest.as_bytes()[shortest.len().saturating_sub(5)..].contains(&b'e');
        if !plain {
            plain_decimal(out, shortest);
        } else {
            // Already plain (`12.34`, `0.001234`; an integer past `EXACT_INTEGER` ends in
            // `.0`): most values a query returns, written as they are.
            out.push_str(shortest.strip_suffix(".0").unwrap_or(shortest));
        }
    }
}

/// Rewrites a shortest round-trip decimal as zmij writes it (`1.5`, `1e-7`, `1.2345e21`,
/// `-3.0`) without an exponent or a trailing `.0`: `0.0000001`, `1234500000000000000000`.
fn plain_decimal(out: &mut String, s: &str) {
    let (negative, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (mantissa, exponent) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().expect("an exponent is an integer")),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    // The significant digits (at most 17, plus zeros zmij may write around them) and where
    // the decimal point falls among them.
    let mut buf = [0u8; 48];
    let mut len = 0;
    let mut point = int.len() as i32 + exponent;
    for &d in int.as_bytes().iter().chain(frac.as_bytes()) {
        if len == 0 && d == b'0' {
            point -= 1;
            continue;
        }
        buf[len] = d;
        len += 1;
    }
    while len > 0 && buf[len - 1] == b'0' {
        len -= 1;
    }
    let digits = std::str::from_utf8(&buf[..len]).expect("ASCII digits");
    if negative {
        out.push('-');
    }
    if digits.is_empty() {
        out.push('0');
    } else if point <= 0 {
        out.push_str("0.");
        (0..-point).for_each(|_| out.push('0'));
        out.push_str(digits);
    } else if point as usize >= len {
        out.push_str(digits);
        (len..point as usize).for_each(|_| out.push('0'));
    } else {
        out.push_str(&digits[..point as usize]);
        out.push('.');
        out.push_str(&digits[point as usize..]);
    }
}

fn point(out: &mut String, t: i64, v: f64) {
    out.push('[');
    seconds(out, t);
    out.push(',');
    float(out, v);
    out.push(']');
}

/// Most slots of `Stamps`: a range query has at most 11,000 steps (Prometheus' limit).
const STAMP_SLOTS_MAX: usize = 16384;

/// The text that opens a point, `[<seconds>,"`, kept per timestamp while a matrix is written:
/// a range query's series share one grid of steps, so each step's text is written once and
/// copied for every series, where formatting the timestamp (itoa, then a copy of a length
/// known only at run time, and four single-byte pushes) was a fifth of writing a point.
/// Direct-mapped by the timestamp in steps (the first series' step), so a grid of up to
/// `STAMP_SLOTS_MAX` steps never collides; points off a grid (the raw samples of a range
/// vector) only overwrite slots.
struct Stamps {
    /// Per slot: the timestamp held (`i64::MIN`: none) and where its text is in `text`.
    slots: Vec<(i64, u32, u32)>,
    /// The grid's step in milliseconds, once a series of two points has shown it.
    step: Option<i64>,
    /// The last timestamp opened and its slot: the next step's slot is the one after it,
    /// without the division (`div_euclid` was 1.1% of a 720,000-point answer's CPU, a fifth
    /// of `value_point`'s own time, in a profile).
    last: Option<(i64, usize)>,
    text: String,
}

impl Stamps {
    /// Room for series of up to `longest` points.
    fn new(longest: usize) -> Stamps {
        let slots = longest.next_power_of_two().clamp(1, STAMP_SLOTS_MAX);
        Stamps { slots: vec![(i64::MIN, 0, 0); slots], step: None, last: None, text: String::new() }
    }

    /// Takes the step of a series' first two points as the grid's, if none yet.
    fn learn_step(&mut self, points: &[strata_promql::Point]) {
        if let (None, [a, b, ..]) = (self.step, points) {
            self.step = Some(b.t.saturating_sub(a.t).max(1));
            self.last = None;
        }
    }

    /// Writes `[<seconds of t>,"`.
    #[inline]
    fn open_point(&mut self, out: &mut String, t: i64) {
        let step = self.step.unwrap_or(1000);
        let mask = self.slots.len() - 1;
        let slot = match self.last {
            Some((before, slot)) if before.checked_add(step) == Some(t) => (slot + 1) & mask,
            _ => (t.div_euclid(step) as usize) & mask,
        };
        debug_assert_eq!(slot, (t.div_euclid(step) as usize) & mask);
        self.last = Some((t, slot));
        let (held, start, end) = self.slots[slot];
        if held == t && t != i64::MIN {
            out.push_str(&self.text[start as usize..end as usize]);
            return;
        }
        if self.text.len() > self.slots.len() * 64 {
            // Points off the grid have cycled through the slots: start the text again.
            self.text.clear();
            self.slots.fill((i64::MIN, 0, 0));
        }
        let start = self.text.len();
        self.text.push('[');
        seconds(&mut self.text, t);
        self.text.push_str(",\"");
        self.slots[slot] = (t, start as u32, self.text.len() as u32);
        out.push_str(&self.text[start..]);
    }
}

/// A native histogram as Prometheus' API writes it: count, sum, and the populated buckets as
/// `[boundary rule, lower, upper, count]`, the rule 0 for `(a,b]`, 1 for `[a,b)`, 2 for `(a,b)`
/// and 3 for `[a,b]`.
fn histogram(out: &mut String, h: &FloatHistogram) {
    out.push_str(r#"{"count":"#);
    float(out, h.count);
    out.push_str(r#","sum":"#);
    float(out, h.sum);
    let mut first = true;
    for b in h.all_buckets().iter().filter(|b| b.count != 0.0) {
        out.push_str(if first { r#","buckets":["# } else { "," });
        first = false;
        let rule = match (b.lower_inclusive, b.upper_inclusive) {
            (false, true) => 0,
            (true, false) => 1,
            (false, false) => 2,
            (true, true) => 3,
        };
        let _ = write!(out, "[{rule},");
        float(out, b.lower);
        out.push(',');
        float(out, b.upper);
        out.push(',');
        float(out, b.count);
        out.push(']');
    }
    if !first {
        out.push(']');
    }
    out.push('}');
}

/// A float point of a range result, `[<seconds>,"<value>"]`, its opening kept in `stamps`.
#[inline]
fn value_point(out: &mut String, stamps: &mut Stamps, p: &Point) {
    stamps.open_point(out, p.t);
    sample_value(out, p.f);
    out.push_str("\"]");
}

fn histogram_point(out: &mut String, t: i64, h: &FloatHistogram) {
    out.push('[');
    seconds(out, t);
    out.push(',');
    histogram(out, h);
    out.push(']');
}

fn labels(out: &mut String, l: &Labels) {
    out.push('{');
    for (i, x) in l.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        string(out, &x.name);
        out.push(':');
        string(out, &x.value);
    }
    out.push('}');
}

/// What a response holds: a value, or a matrix's points in `[from, to]` (series without any
/// there left out) from the text the result cache keeps.
#[derive(Clone, Copy, Debug)]
pub enum Body<'a> {
    Value(&'a Value),
    Kept(&'a [KeptSeries], i64, i64),
}

impl<'a> From<(&'a [KeptSeries], i64, i64)> for Body<'a> {
    fn from((series, from, to): (&'a [KeptSeries], i64, i64)) -> Body<'a> {
        Body::Kept(series, from, to)
    }
}

impl<'a> From<&'a Value> for Body<'a> {
    fn from(value: &'a Value) -> Body<'a> {
        Body::Value(value)
    }
}

/// The whole success response of `/api/v1/query` or `/api/v1/query_range`, in one string.
pub fn response<'a>(body: impl Into<Body<'a>>, annotations: &[Annotation], query: &str, stats: Option<&str>) -> String {
    // With no chunk size, the whole response is the one piece written (sized up front).
    let mut whole = None;
    render(body, annotations, query, stats, usize::MAX, 1, &mut |piece| {
        whole = Some(piece);
        true
    });
    whole.expect("a response is never empty")
}

/// Sends the gzip of `render`'s response for kept series from their kept deflated groups
/// (`kept::gzip`, several times cheaper than compressing the text); false, having sent
/// nothing, when `body` is not kept series, too little of it is in whole groups or most of
/// its groups are not deflated yet (then `deflate_kept_groups` after sending it otherwise).
#[allow(clippy::too_many_arguments, reason = "what `render` takes, and where the gzip goes")]
pub fn gzip_kept<'a>(
    body: impl Into<Body<'a>>,
    annotations: &[Annotation],
    query: &str,
    stats: Option<&str>,
    chunk: usize,
    threads: usize,
    send: &mut dyn FnMut(Vec<u8>) -> bool,
) -> bool {
    match body.into() {
        Body::Kept(series, from, to) => kept::gzip(series, from, to, annotations, query, stats, chunk, threads, send),
        Body::Value(_) => false,
    }
}

/// After an answer `gzip_kept` declined because most of its groups were not deflated yet
/// (and that was compressed whole): deflates them for the next refreshes.
pub fn deflate_kept_groups(body: Body<'_>, threads: usize) {
    if let Body::Kept(series, from, to) = body {
        kept::deflate_groups_of(series, from, to, threads);
    }
}

/// Points a response holds (at most, for kept series), a histogram counted as several (for
/// sizing what it is written into).
pub fn points<'a>(body: impl Into<Body<'a>>) -> usize {
    match body.into() {
        Body::Value(Value::Vector(s) | Value::Matrix(s)) => s.iter().map(weight).sum(),
        Body::Value(_) => 1,
        // At most: reading where a window starts in each series costs more than it saves.
        Body::Kept(series, ..) => series.iter().map(KeptSeries::weight).sum(),
    }
}

/// Where a response is written: a buffer handed to `emit` whenever it holds `chunk` bytes or
/// more, so a large response is sent while the rest is written and never held whole.
struct Chunks<'a> {
    buf: String,
    chunk: usize,
    emit: &'a mut dyn FnMut(String) -> bool,
}

/// The receiver of a response's chunks went away (the client disconnected): stop writing.
struct Gone;

impl Chunks<'_> {
    /// Hands the buffer on once it is full.
    fn check(&mut self) -> Result<(), Gone> {
        if self.buf.len() >= self.chunk {
            let full = std::mem::replace(&mut self.buf, String::with_capacity(self.chunk + self.chunk / 8));
            if !(self.emit)(full) {
                return Err(Gone);
            }
        }
        Ok(())
    }

    /// Makes room for `n` more bytes: hands the buffer on first when they would not fit (so a
    /// large piece of kept text is copied once, never again by a buffer growing around it).
    /// A response written whole (no chunk size) grows instead.
    fn room(&mut self, n: usize) -> Result<(), Gone> {
        if self.chunk != usize::MAX && !self.buf.is_empty() && self.buf.len() + n > self.buf.capacity() {
            let next = String::with_capacity((self.chunk + self.chunk / 8).max(n));
            if !(self.emit)(std::mem::replace(&mut self.buf, next)) {
                return Err(Gone);
            }
        }
        Ok(())
    }

    /// Adds a written piece: handed on as it is when nothing waits before it and it is full
    /// (no copy), else appended.
    fn put(&mut self, piece: String) -> Result<(), Gone> {
        if self.buf.is_empty() && piece.len() >= self.chunk {
            return if (self.emit)(piece) { Ok(()) } else { Err(Gone) };
        }
        self.buf.push_str(&piece);
        self.check()
    }

    fn finish(self) {
        if !self.buf.is_empty() {
            (self.emit)(self.buf);
        }
    }
}

/// Writes the success response of `/api/v1/query` or `/api/v1/query_range` in pieces of about
/// `chunk` bytes, each handed to `emit`; stops early when `emit` says the receiver is gone. A
/// large matrix is written by up to `threads` threads (`matrix_in_parallel`).
pub fn render<'a>(
    body: impl Into<Body<'a>>,
    annotations: &[Annotation],
    query: &str,
    stats: Option<&str>,
    chunk: usize,
    threads: usize,
    emit: &mut dyn FnMut(String) -> bool,
) {
    let body = body.into();
    let capacity = if chunk == usize::MAX { 64 + points(body) * 32 } else { chunk + chunk / 8 };
    let mut w = Chunks { buf: String::with_capacity(capacity), chunk, emit };
    if render_into(&mut w, body, annotations, query, stats, threads).is_ok() {
        w.finish();
    }
}

/// `stats`, when given, is a JSON object written as `data.stats` (Prometheus' `stats=all`).
fn render_into(
    w: &mut Chunks<'_>,
    body: Body<'_>,
    annotations: &[Annotation],
    query: &str,
    stats: Option<&str>,
    threads: usize,
) -> Result<(), Gone> {
    w.buf.push_str(r#"{"status":"success","data":{"resultType":"#);
    let value = match body {
        Body::Value(value) => value,
        Body::Kept(series, from, to) => {
            kept::matrix(w, series, from, to)?;
            return finish(w, annotations, query, stats);
        }
    };
    match value {
        Value::Scalar { t, v } => {
            w.buf.push_str(r#""scalar","result":"#);
            point(&mut w.buf, *t, *v);
        }
        Value::String { t, s } => {
            let out = &mut w.buf;
            out.push_str(r#""string","result":["#);
            seconds(out, *t);
            out.push(',');
            string(out, s);
            out.push(']');
        }
        Value::Vector(series) => {
            w.buf.push_str(r#""vector","result":["#);
            let mut first = true;
            for s in series {
                if s.is_empty() {
                    continue;
                }
                let out = &mut w.buf;
                open_series(out, &s.labels, &mut first);
                match (s.points.first(), s.hists.first()) {
                    (Some(p), _) => {
                        out.push_str(r#","value":"#);
                        point(out, p.t, p.f);
                    }
                    (None, Some(h)) => {
                        out.push_str(r#","histogram":"#);
                        histogram_point(out, h.t, &h.h);
                    }
                    (None, None) => unreachable!("empty series are skipped"),
                }
                out.push('}');
                w.check()?;
            }
            w.buf.push(']');
        }
        Value::Matrix(series) => matrix(w, series, threads)?,
    }
    finish(w, annotations, query, stats)
}

/// Opens a result's series object (after a comma unless it is the `first`) with its labels.
fn open_series(out: &mut String, l: &Labels, first: &mut bool) {
    if !std::mem::take(first) {
        out.push(',');
    }
    out.push_str(r#"{"metric":"#);
    labels(out, l);
}

/// A matrix result.
fn matrix(w: &mut Chunks<'_>, series: &[Series], threads: usize) -> Result<(), Gone> {
    w.buf.push_str(r#""matrix","result":["#);
    let longest = series.iter().map(|s| s.points.len()).max().unwrap_or(0);
    let total: usize = series.iter().map(weight).sum();
    if threads > 1 && total >= 2 * PARALLEL_BATCH_POINTS {
        matrix_in_parallel(w, series, longest, threads)?;
    } else {
        let mut stamps = Stamps::new(longest);
        let mut first = true;
        for s in series {
            series_object(w, s, &mut stamps, &mut first)?;
        }
    }
    w.buf.push(']');
    Ok(())
}

/// Points a batch of series written by one thread of `matrix_in_parallel` holds at least (but
/// for the last), a histogram counted as several (`weight`): about 400 KB of text.
const PARALLEL_BATCH_POINTS: usize = 16 * 1024;

/// The points of `s`, a histogram counted as several (as `points` counts).
fn weight(s: &Series) -> usize {
    s.points.len() + 8 * s.hists.len()
}

/// `matrix`'s series objects written by `threads` threads: formatting the values is most of
/// writing a large result (a quarter of a 30-day, 1000-series `increase` from a tier, all of
/// it on one thread after the evaluation). Consecutive series are cut into batches of about
/// `PARALLEL_BATCH_POINTS`; thread `k` writes batches `k`, `k + threads`, … into pieces of
/// `w.chunk` bytes, and this thread hands the pieces on in batch order, so the response is the
/// bytes one thread would write. Each series object is written after a comma; the response's
/// first loses it.
fn matrix_in_parallel(w: &mut Chunks<'_>, series: &[Series], longest: usize, threads: usize) -> Result<(), Gone> {
    let mut batches = Vec::new();
    let (mut start, mut points) = (0, 0);
    for (i, s) in series.iter().enumerate() {
        points += weight(s);
        if points >= PARALLEL_BATCH_POINTS {
            batches.push(start..i + 1);
            (start, points) = (i + 1, 0);
        }
    }
    if start < series.len() {
        batches.push(start..series.len());
    }
    let chunk = w.chunk;
    strata_tsdb::workers::scope(|scope| {
        let mut receivers = Vec::with_capacity(threads);
        for k in 0..threads {
            // Two batches written ahead per thread at most.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<String>>(2);
            receivers.push(rx);
            let batches = &batches;
            scope.spawn(move || {
                let mut stamps = Stamps::new(longest);
                for batch in batches.iter().skip(k).step_by(threads) {
                    let mut pieces = Vec::new();
                    let mut emit = |piece: String| {
                        pieces.push(piece);
                        true
                    };
                    let mut out = Chunks { buf: String::with_capacity(chunk.min(1 << 20)), chunk, emit: &mut emit };
                    for s in &series[batch.clone()] {
                        // Never `Gone`: the pieces are only collected.
                        let _ = series_object(&mut out, s, &mut stamps, &mut false);
                    }
                    out.finish();
                    if tx.send(pieces).is_err() {
                        // The writer stopped: the receiver went away.
                        return;
                    }
                }
            });
        }
        let mut first = true;
        for b in 0..batches.len() {
            // A writing thread ends only after its last batch, or once this one stopped.
            let pieces = receivers[b % threads].recv().expect("a writing thread panicked");
            for mut piece in pieces {
                if std::mem::take(&mut first) {
                    debug_assert!(piece.starts_with(','));
                    piece.remove(0);
                }
                w.put(piece)?;
            }
        }
        Ok(())
    })
}

/// One series object of a matrix (after a comma unless it is the `first`) with its points.
fn series_object(w: &mut Chunks<'_>, s: &Series, stamps: &mut Stamps, first: &mut bool) -> Result<(), Gone> {
    let (points, hists) = (&s.points, &s.hists);
    open_series(&mut w.buf, &s.labels, first);
    if !points.is_empty() || hists.is_empty() {
        w.buf.push_str(r#","values":["#);
        stamps.learn_step(points);
        for (j, p) in points.iter().enumerate() {
            let out = &mut w.buf;
            if j > 0 {
                out.push(',');
            }
            value_point(out, stamps, p);
            w.check()?;
        }
        w.buf.push(']');
    }
    if !hists.is_empty() {
        w.buf.push_str(r#","histograms":["#);
        for (j, p) in hists.iter().enumerate() {
            let out = &mut w.buf;
            if j > 0 {
                out.push(',');
            }
            histogram_point(out, p.t, &p.h);
            w.check()?;
        }
        w.buf.push(']');
    }
    w.buf.push('}');
    Ok(())
}

/// The end of a success response: statistics asked for, warnings and infos.
fn finish(w: &mut Chunks<'_>, annotations: &[Annotation], query: &str, stats: Option<&str>) -> Result<(), Gone> {
    let out = &mut w.buf;
    if let Some(stats) = stats {
        out.push_str(r#","stats":"#);
        out.push_str(stats);
    }
    out.push('}');
    for (key, info) in [("warnings", false), ("infos", true)] {
        let list: Vec<String> = annotations.iter().filter(|a| a.info == info).map(|a| a.render(query)).collect();
        if list.is_empty() {
            continue;
        }
        let _ = write!(out, r#","{key}":["#);
        for (i, a) in list.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            string(out, a);
        }
        out.push(']');
    }
    out.push('}');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_promql::{Point, Series};

    fn shown(v: f64) -> String {
        let mut s = String::new();
        sample_value(&mut s, v);
        s
    }

    #[test]
    fn sample_values_as_go_formats_them() {
        for (v, want) in [
            (0.0, "0"),
            (-0.0, "-0"),
            (1.0, "1"),
            (-3.0, "-3"),
            (1.5, "1.5"),
            (0.1, "0.1"),
            (1e-7, "0.0000001"),
            (-2.5e-5, "-0.000025"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000"),
            (1.2345e21, "1234500000000000000000"),
            (999_999_999_999_999.9, "999999999999999.9"),
            (5e-324, &format!("0.{}5", "0".repeat(323))),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
        ] {
            assert_eq!(shown(v), want, "{v:e}");
        }
    }

    /// `sample_value` skips looking for an exponent in `PLAIN_RANGE`: zmij must write none
    /// there, at its bounds and their neighbours (and at zmij's own bounds, 1e-5 and 1e16,
    /// just outside it), and across it.
    #[test]
    fn plain_range_values_are_written_without_exponent_by_zmij() {
        let has_exponent = |v: f64| zmij::Buffer::new().format_finite(v).contains('e');
        for bound in [PLAIN_RANGE.start, PLAIN_RANGE.end, 1e-5, 1e16] {
            for v in [bound.next_down(), bound, bound.next_up()] {
                for v in [v, -v] {
                    let inside = PLAIN_RANGE.contains(&v.abs());
                    assert!(!(inside && has_exponent(v)), "{v:e}");
                    // Inside or out, the value is written plain and reads back.
                    let s = shown(v);
                    assert!(!s.contains('e') && s.parse::<f64>().unwrap() == v, "{v:e}: {s}");
                }
            }
        }
        // Magnitudes across the range, a few hundred per decade.
        let mut v = PLAIN_RANGE.start;
        while v < PLAIN_RANGE.end {
            assert!(!has_exponent(v) && !has_exponent(v.next_down().max(PLAIN_RANGE.start)), "{v:e}");
            v *= 1.0 + 1.0 / 97.0;
        }
        // Just below the range zmij does write exponents: the check is still needed there.
        assert!(has_exponent(9e-6) && has_exponent(2e16));
    }

    /// Values whose shortest decimals tie (two candidates equally near), as Go 1.26's
    /// `strconv.FormatFloat(v, 'f', -1, 64)` writes them: it rounds the tie to even, where
    /// Rust's `Display` rounds it up (`…783.3`).
    #[test]
    #[allow(clippy::excessive_precision, reason = "the exact values, halfway between two shortest decimals")]
    fn ties_round_as_in_go() {
        for (v, go) in [
            (-1229591586589783.25, "-1229591586589783.2"),
            (1229591586589783.25, "1229591586589783.2"),
            (2251799813685248.75, "2251799813685249"),
            (4503599627370495.5, "4503599627370495.5"),
            (123456789.123456789, "123456789.12345679"),
            (2.0 / 3.0, "0.6666666666666666"),
        ] {
            assert_eq!(shown(v), go);
        }
        assert_eq!(shown(f64::MAX), format!("17976931348623157{}", "0".repeat(292)));
    }

    proptest::proptest! {
        /// Every finite float is written without an exponent, reads back to the same bits,
        /// and has no more significant digits than Rust's shortest `Display`.
        #[test]
        fn sample_values_round_trip_shortest(bits in proptest::num::u64::ANY, int in -1e16f64..1e16) {
            let significant = |s: &str| s.bytes().filter(u8::is_ascii_digit).skip_while(|&d| d == b'0').count();
            for v in [f64::from_bits(bits), int, int.trunc(), int / 1e9] {
                if v.is_finite() {
                    let s = shown(v);
                    proptest::prop_assert!(!s.contains(['e', 'E']), "{}", s);
                    proptest::prop_assert_eq!(s.parse::<f64>().unwrap().to_bits(), v.to_bits(), "{}", s);
                    let display = format!("{v}");
                    let trimmed = |s: &str| significant(s.trim_end_matches('0').trim_end_matches('.'));
                    proptest::prop_assert!(trimmed(&s) <= trimmed(&display), "{} vs {}", s, display);
                }
            }
        }
    }

    proptest::proptest! {
        /// zmij's plain output written as it is reads the same as every output rewritten
        /// digit by digit (what all values went through before): fractions, decimals of a few
        /// places, integers past `EXACT_INTEGER`, any bits.
        #[test]
        fn plain_shortest_decimals_are_written_as_rewritten(
            bits in proptest::num::u64::ANY,
            n in -1_000_000_000i64..1_000_000_000,
            divisor in proptest::sample::select(vec![3.0, 7.0, 10.0, 100.0, 977.0, 1e6, 1e-3]),
            big in 1e15f64..1e22,
        ) {
            for v in [f64::from_bits(bits), n as f64 / divisor, -(n as f64) / divisor, big, big.trunc(), -big.trunc()] {
                if v.is_finite() && (v != v.trunc() || v.abs() >= EXACT_INTEGER) {
                    let mut rewritten = String::new();
                    plain_decimal(&mut rewritten, zmij::Buffer::new().format_finite(v));
                    proptest::prop_assert_eq!(shown(v), rewritten);
                }
            }
        }
    }

    proptest::proptest! {
        /// A point opened from the kept timestamps reads as one written whole, for series on a
        /// grid (with gaps, shifted, of another step than the first series'), off it, and at
        /// the extremes, with enough distinct timestamps to cycle the kept text.
        #[test]
        fn kept_timestamps_open_points_as_written_whole(
            base in -2_000_000_000_000i64..20_000_000_000_000,
            step in 1i64..200_000,
            series in proptest::collection::vec(
                // (kind, grid step, any time): kinds 0–3 a step of the grid, 4 any time,
                // 5 and 6 the extremes.
                proptest::collection::vec((0u8..7, 0i64..20_000, proptest::num::i64::ANY), 0..400),
                1..12,
            ),
        ) {
            let series: Vec<Vec<strata_promql::Point>> = series
                .iter()
                .map(|s| {
                    s.iter()
                        .map(|&(kind, k, t)| match kind {
                            0..=3 => base + k * step,
                            4 => t,
                            5 => i64::MIN,
                            _ => i64::MAX,
                        })
                        .map(|t| strata_promql::Point { t, f: 0.0 })
                        .collect()
                })
                .collect();
            let mut stamps = Stamps::new(series.iter().map(Vec::len).max().unwrap_or(0));
            for points in &series {
                stamps.learn_step(points);
                for p in points {
                    let mut kept = String::new();
                    stamps.open_point(&mut kept, p.t);
                    let mut whole = String::from("[");
                    seconds(&mut whole, p.t);
                    whole.push_str(",\"");
                    proptest::prop_assert_eq!(kept, whole);
                }
            }
        }
    }

    /// Series on one grid (with gaps, starting anywhere on it) write each timestamp's text
    /// once: every step has a slot of its own, also when it is reached from the step before.
    #[test]
    fn a_grid_of_steps_writes_each_timestamp_once() {
        for (base, step) in [(1_700_000_000_000i64, 60_000i64), (-7_000, 15_000), (1, 1), (5, 3_600_000)] {
            let steps = 300;
            let mut stamps = Stamps::new(steps);
            let mut distinct = std::collections::BTreeSet::new();
            for s in 0..40i64 {
                let points: Vec<strata_promql::Point> = (0..steps as i64)
                    .filter(|k| (k + s) % 7 != 0 && *k >= s % 5)
                    .map(|k| strata_promql::Point { t: base + k * step, f: 0.0 })
                    .collect();
                stamps.learn_step(&points);
                for p in &points {
                    stamps.open_point(&mut String::new(), p.t);
                    distinct.insert(p.t);
                }
            }
            let written: usize = distinct
                .iter()
                .map(|&t| {
                    let mut whole = String::from("[");
                    seconds(&mut whole, t);
                    whole.len() + 2
                })
                .sum();
            assert_eq!(stamps.text.len(), written, "base {base}, step {step}");
        }
    }

    #[test]
    fn seconds_keep_up_to_three_decimals() {
        for (ms, want) in [
            (0, "0"),
            (1500, "1.5"),
            (-1500, "-1.5"),
            (1_435_781_451_781, "1435781451.781"),
            (10, "0.01"),
            (-7, "-0.007"),
            (120_000, "120"),
        ] {
            let mut s = String::new();
            seconds(&mut s, ms);
            assert_eq!(s, want);
        }
    }

    #[test]
    fn parses_back_as_the_same_json() {
        let l = Labels::from_pairs([("__name__", "m"), ("path", "/a\"b\\c\n\u{1}")]);
        let v = Value::Matrix(vec![Series::new(
            l,
            vec![
                Point { t: 1_435_781_451_781, f: 1.5 },
                Point { t: 1_435_781_452_000, f: f64::NAN },
                Point { t: -1500, f: f64::NEG_INFINITY },
                Point { t: 0, f: 1e21 },
            ],
        )]);
        let a = [Annotation { info: true, msg: "x".into(), pos: 0 }];
        let s = response(&v, &a, "m", None);
        let j: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(j["data"]["result"][0]["metric"]["path"], "/a\"b\\c\n\u{1}");
        let values = &j["data"]["result"][0]["values"];
        assert_eq!(values[0][0].as_f64(), Some(1_435_781_451.781));
        assert_eq!(values[0][1], "1.5");
        assert_eq!(values[1][0].as_f64(), Some(1_435_781_452.0));
        assert_eq!(values[1][1], "NaN");
        assert_eq!(values[2][0].as_f64(), Some(-1.5));
        assert_eq!(values[2][1], "-Inf");
        assert_eq!(values[3][1], "1000000000000000000000");
        assert_eq!(j["infos"][0], "PromQL info: x (1:1)");
        let s = response(&Value::Scalar { t: 1000, v: 2.0 }, &[], "2", None);
        assert_eq!(s, r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#);
    }

    /// Written in pieces, a response is the same bytes, each piece about the size asked for;
    /// when the receiver goes away, writing stops.
    #[test]
    fn chunked_rendering_is_the_whole_response_in_pieces() {
        let series = |i: i64| {
            let l = Labels::from_pairs([("__name__", "m"), ("i", &i.to_string())]);
            Series::new(l, (0..500).map(|k| Point { t: k * 15_000, f: (i * k) as f64 / 7.0 }).collect())
        };
        let v = Value::Matrix((0..20).map(series).collect());
        let a = [Annotation { info: false, msg: "w".into(), pos: 0 }];
        let whole = response(&v, &a, "m", None);
        for chunk in [1, 100, 4096, 1 << 20] {
            let mut pieces = Vec::new();
            render(&v, &a, "m", None, chunk, 1, &mut |p| {
                pieces.push(p);
                true
            });
            assert_eq!(pieces.concat(), whole, "chunk {chunk}");
            // A piece ends at the first point boundary at or after `chunk` bytes.
            assert!(
                pieces.iter().rev().skip(1).all(|p| p.len() >= chunk && p.len() < chunk.max(100) + 100),
                "chunk {chunk}"
            );
        }
        let mut taken = 0;
        render(&v, &a, "m", None, 4096, 1, &mut |_| {
            taken += 1;
            taken < 3
        });
        assert_eq!(taken, 3, "nothing is written after the receiver is gone");
    }

    /// Series of a test matrix: series `i` has points at steps `[i mod 7, i mod 7 + len)`, len
    /// varying across batches (of `matrix_in_parallel` and `keep_series`), and every eleventh
    /// has histograms too.
    fn test_matrix(n: i64) -> Vec<Series> {
        use std::sync::Arc;
        use strata_model::histogram::notation::parse;
        use strata_promql::value::HPoint;
        let h =
            Arc::new(parse("{{count:5 sum:7.5 z_bucket:1 z_bucket_w:0.001 buckets:[1 0 2] n_buckets:[1]}}").unwrap());
        let series = |i: i64| {
            let l = Labels::from_pairs([("__name__", "m"), ("i", &format!("{i:03}"))]);
            let from = i % 7;
            let len = [1, 3000, 20_000, 5, 9000][i as usize % 5];
            let points: Vec<Point> =
                (from..from + len).map(|k| Point { t: k * 60_000, f: (i * k) as f64 / 7.0 + 0.1 }).collect();
            let mut s = Series::new(l, points);
            if i % 11 == 3 {
                s.hists = (0..3).map(|k| HPoint { t: (from + k) * 60_000, h: h.clone() }).collect();
            }
            s
        };
        (0..n).map(series).collect()
    }

    fn written(body: Body<'_>, chunk: usize, threads: usize) -> String {
        let mut pieces = Vec::new();
        render(body, &[], "m", None, chunk, threads, &mut |p| {
            pieces.push(p);
            true
        });
        pieces.concat()
    }

    /// Written by several threads, a large matrix is the bytes one thread writes, with and
    /// without histograms; when the receiver goes away, writing stops and the threads end.
    #[test]
    fn a_matrix_written_in_parallel_is_the_matrix_written_by_one_thread() {
        let v = Value::Matrix(test_matrix(40));
        let serial = written(Body::Value(&v), usize::MAX, 1);
        serde_json::from_str::<serde_json::Value>(&serial).expect("valid JSON");
        for threads in [2, 3, 8] {
            assert_eq!(
                written(Body::Value(&v), crate::http::RESPONSE_CHUNK_BYTES, threads),
                serial,
                "{threads} threads"
            );
        }
        let mut taken = 0;
        render(&v, &[], "m", None, 4096, 2, &mut |_| {
            taken += 1;
            taken < 3
        });
        assert_eq!(taken, 3, "nothing is written after the receiver is gone");
    }

    /// A matrix's kept text (written by one thread or several), answered for a window, is the
    /// matrix of the points in that window written directly: for windows that leave out the
    /// first series, series in the middle and the last (which have no points there), that
    /// start or end between points, with and without histograms; and after cutting the kept
    /// text to a window and appending the rest again.
    #[test]
    fn kept_text_answers_a_window_as_its_points_written() {
        let all = test_matrix(40);
        let window = |from: i64, to: i64| {
            let mut series = all.clone();
            for s in &mut series {
                s.points.retain(|p| (from..=to).contains(&p.t));
                s.hists.retain(|p| (from..=to).contains(&p.t));
            }
            series.retain(|s| !s.is_empty());
            Value::Matrix(series)
        };
        for threads in [1, 2, 5] {
            let kept = keep_series(&all, threads);
            assert_eq!(kept, all.iter().map(KeptSeries::new).collect::<Vec<_>>(), "{threads} threads");
            for (from, to) in [
                (i64::MIN, i64::MAX),
                (6 * 60_000, 2_000 * 60_000),
                (2_500 * 60_000 - 1, 10_000 * 60_000 + 1),
                (9_500 * 60_000, 30_000 * 60_000),
                (0, 3 * 60_000),
                (4 * 60_000 + 1, 5 * 60_000 - 1),
            ] {
                let direct = written(Body::Value(&window(from, to)), usize::MAX, 1);
                for chunk in [usize::MAX, crate::http::RESPONSE_CHUNK_BYTES] {
                    assert_eq!(written(Body::Kept(&kept, from, to), chunk, 1), direct, "[{from}, {to}]");
                }
                // Cut to the window, then the points after it appended again.
                let mut cut = kept.clone();
                let mut rest = kept.clone();
                for (c, r) in cut.iter_mut().zip(&mut rest) {
                    c.keep(from, to);
                    r.keep(to.saturating_add(1), i64::MAX);
                }
                assert_eq!(written(Body::Kept(&cut, i64::MIN, i64::MAX), usize::MAX, 1), direct, "[{from}, {to}]");
                for (c, r) in cut.iter_mut().zip(rest) {
                    c.append(r);
                }
                let after = written(Body::Value(&window(from, i64::MAX)), usize::MAX, 1);
                assert_eq!(written(Body::Kept(&cut, i64::MIN, i64::MAX), usize::MAX, 1), after, "[{from}, ..]");
            }
        }
    }

    #[test]
    fn histograms_as_prometheus_writes_them() {
        use std::sync::Arc;
        use strata_model::histogram::notation::parse;
        use strata_promql::value::HPoint;
        let h =
            Arc::new(parse("{{count:5 sum:7.5 z_bucket:1 z_bucket_w:0.001 buckets:[1 0 2] n_buckets:[1]}}").unwrap());
        let l = Labels::from_pairs([("__name__", "h")]);
        let v = Value::Vector(vec![Series::with_hists(l.clone(), vec![], vec![HPoint { t: 1500, h: h.clone() }])]);
        assert_eq!(
            response(&v, &[], "h", None),
            concat!(
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"h"},"#,
                r#""histogram":[1.5,{"count":"5","sum":"7.5","buckets":[[1,"-1","-0.5","1"],[3,"-0.001","0.001","1"],"#,
                r#"[0,"0.5","1","1"],[0,"2","4","2"]]}]}]}}"#
            )
        );
        // A range result with both kinds has both keys.
        let m = Value::Matrix(vec![Series::with_hists(l, vec![Point { t: 0, f: 1.0 }], vec![HPoint { t: 1000, h }])]);
        let j: serde_json::Value = serde_json::from_str(&response(&m, &[], "h", None)).unwrap();
        assert_eq!(j["data"]["result"][0]["values"][0][1], "1");
        assert_eq!(j["data"]["result"][0]["histograms"][0][1]["count"], "5");
    }
}
