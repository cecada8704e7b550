//! Range results kept as the JSON text Prometheus' API writes for them, for the result cache:
//! an answer from kept steps is then copied, not formatted again. Formatting the points was
//! nearly all of a cache hit's cost (a day of 3,000 series at a one-minute step is 4.3M
//! points, 74 MB of JSON, written in about as much CPU time as evaluating them).
//!
//! A series keeps its labels (results are merged by them), its object's opening text
//! (`{"metric":{…}`) and its points each as the text written for it after a comma
//! (`,[1796072040,"0.5"]`), with where each starts. A point's time is read back from its text
//! when a window is cut, so a point costs its text and four bytes.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use flate2::{Compress, Compression, FlushCompress};
use strata_model::Labels;
use strata_promql::{Annotation, Series};

use super::{histogram_point, open_series, value_point, weight, Chunks, Gone, Stamps};
use crate::http::gzip::{deflate_piece, deflate_then_flush, stored_blocks, CrcPiece, HEADER, LAST_BLOCK};

/// Points per group deflated on its own for gzip answers (`gzip`): a group refers to nothing
/// outside it, so its deflated text is made once and sent in every answer whose window holds
/// it, and only the points at a window's two ends (fewer than a group each) are sent stored.
/// Smaller groups deflate worse on their own and cost a compressor's full flush each (most
/// of a group's deflating); larger ones leave more points at the ends.
const GROUP_POINTS: u64 = 64;

/// A group's text (with the comma after it) as raw deflate blocks ended by a full flush
/// (byte-aligned, referring to nothing before them), and its CRC, joined to an answer's
/// without reading the text again.
#[derive(Debug)]
struct Deflated {
    bytes: Box<[u8]>,
    crc: CrcPiece,
}

/// Points as the text written for them, each after a comma, and where each starts.
#[derive(Clone, Debug, Default)]
struct KeptPoints {
    text: String,
    /// Offset in `text` of each point's comma; the points' times ascend.
    starts: Vec<u32>,
    /// The first and the last point's time (when there are points). Every window cut reads
    /// them; read back from the text, they were two more places of it to fetch per cut (a
    /// full hit of 3,000 series × 20 steps took 12% longer).
    bounds: Option<(i64, i64)>,
    /// Points dropped from the front since these were first written: point `i` is number
    /// `dropped + i` for good, and group `g` (for gzip answers, `gzip`) is the points numbered
    /// `g * GROUP_POINTS` up to the next group's.
    dropped: u64,
    /// The deflated text of each whole group (all its points here), made after a refresh's
    /// gzip answer or by one that needs only a few: `deflated[k]` is group
    /// `deflated_first + k`. Points are only ever
    /// dropped at either end or appended, so a group that stays whole keeps its text.
    deflated: VecDeque<OnceLock<Arc<Deflated>>>,
    deflated_first: u64,
}

/// Equal points are equal whatever has been deflated of them, and however many were dropped
/// before them.
impl PartialEq for KeptPoints {
    fn eq(&self, other: &KeptPoints) -> bool {
        (&self.text, &self.starts, self.bounds) == (&other.text, &other.starts, other.bounds)
    }
}

impl KeptPoints {
    fn len(&self) -> usize {
        self.starts.len()
    }

    /// Appends a point: a comma, then what `write` writes.
    fn push(&mut self, write: impl FnOnce(&mut String)) {
        let start = u32::try_from(self.text.len()).expect("a series' text stays below 4 GiB (at most 11,000 steps)");
        self.starts.push(start);
        self.text.push(',');
        write(&mut self.text);
        let t = self.time(self.len() - 1);
        self.bounds = Some((self.bounds.map_or(t, |b| b.0), t));
    }

    fn end_of(&self, i: usize) -> usize {
        self.starts.get(i).map_or(self.text.len(), |&s| s as usize)
    }

    /// The time of point `i`, read back from its text (`,[<seconds>,…`).
    fn time(&self, i: usize) -> i64 {
        parse_seconds(&self.text.as_bytes()[self.starts[i] as usize + 2..])
    }

    /// The first point at or after `t`. Kept points are mostly a range query's steps, an even
    /// grid: the guess from the first and last point's times is checked with two reads and
    /// searched from only when wrong. (A binary search's dozen reads, each in another place of
    /// text no cache holds, were most of an answer's cost.)
    fn position(&self, t: i64) -> usize {
        let n = self.len();
        if n == 0 {
            return 0;
        }
        let (first, last) = self.bounds.expect("points have bounds");
        debug_assert_eq!((first, last), (self.time(0), self.time(n - 1)));
        if t <= first {
            return 0;
        }
        if t > last {
            return n;
        }
        // ceil((t - first) / step) on a grid of step (last - first) / (n - 1); first < t ≤ last.
        let (span, from_first) = (i128::from(last) - i128::from(first), i128::from(t) - i128::from(first));
        let guess = ((from_first * (n as i128 - 1) + span - 1) / span) as usize;
        debug_assert!((1..n).contains(&guess));
        if self.time(guess) >= t && self.time(guess - 1) < t {
            return guess;
        }
        // Off the grid: a binary search over points 1..n-1 (the first is before `t`, the last
        // at or after it).
        let (mut lo, mut hi) = (1, n - 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.time(mid) < t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The points in `[from, to]`.
    fn window(&self, from: i64, to: i64) -> Range<usize> {
        let start = self.position(from);
        let end = if to == i64::MAX { self.len() } else { self.position(to + 1) };
        start..end.max(start)
    }

    /// The text of points `r`, without the first one's comma: the inside of a JSON array.
    fn inside(&self, r: Range<usize>) -> &str {
        if r.is_empty() {
            return "";
        }
        &self.text[self.starts[r.start] as usize + 1..self.end_of(r.end)]
    }

    /// Keeps only points `r`.
    fn keep(&mut self, r: Range<usize>) {
        let (from, to) = (self.end_of(r.start), self.end_of(r.end));
        self.text.truncate(to);
        self.starts.truncate(r.end);
        if r.start > 0 {
            self.text.drain(..from);
            self.starts.drain(..r.start);
            let shift = from as u32;
            self.starts.iter_mut().for_each(|s| *s -= shift);
        }
        self.dropped += r.start as u64;
        self.bounds = (self.len() > 0).then(|| (self.time(0), self.time(self.len() - 1)));
        self.regroup();
    }

    /// The groups wholly here: `first..end` (empty when none is).
    fn whole_groups(&self) -> Range<u64> {
        let first = self.dropped.div_ceil(GROUP_POINTS);
        first..((self.dropped + self.len() as u64) / GROUP_POINTS).max(first)
    }

    /// Fits `deflated` to the groups wholly here after points were dropped or appended: those
    /// no longer whole go (a group cut at the end is deflated again once it is whole again,
    /// with the points appended then), new whole ones get an empty slot.
    fn regroup(&mut self) {
        let whole = self.whole_groups();
        let kept =
            self.deflated_first.max(whole.start)..(self.deflated_first + self.deflated.len() as u64).min(whole.end);
        if kept.is_empty() {
            self.deflated.clear();
            self.deflated_first = whole.start;
        } else {
            self.deflated.drain(..(kept.start - self.deflated_first) as usize);
            self.deflated.truncate((kept.end - kept.start) as usize);
            self.deflated_first = kept.start;
        }
        let missing = (whole.end - self.deflated_first) as usize - self.deflated.len();
        self.deflated.extend(std::iter::repeat_with(OnceLock::new).take(missing));
        debug_assert_eq!(
            (self.deflated_first, self.deflated_first + self.deflated.len() as u64),
            (whole.start, whole.end)
        );
    }

    /// Local index range of group `g` (whole here).
    fn group_points(&self, g: u64) -> Range<usize> {
        let start = (g * GROUP_POINTS - self.dropped) as usize;
        start..start + GROUP_POINTS as usize
    }

    /// The slot of group `g`'s deflated text, and its text: its points without the first
    /// one's comma (`[…],[…]`). What is deflated is that text and a comma after it, which an
    /// answer sends only where a point follows the group.
    fn group(&self, g: u64) -> (&OnceLock<Arc<Deflated>>, &str) {
        let r = self.group_points(g);
        let text = &self.text[self.starts[r.start] as usize + 1..self.end_of(r.end)];
        (&self.deflated[(g - self.deflated_first) as usize], text)
    }

    /// The groups that a gzip answer of points `r` sends deflated: those wholly inside `r`
    /// and followed by a point of it (whose comma ends the group's deflated text).
    fn groups_inside(&self, r: Range<usize>) -> Range<u64> {
        if r.is_empty() {
            return 0..0;
        }
        let first = (self.dropped + r.start as u64).div_ceil(GROUP_POINTS);
        first..((self.dropped + r.end as u64 - 1) / GROUP_POINTS).max(first)
    }

    /// Appends `other`'s points, which all come after these.
    fn append(&mut self, other: KeptPoints) {
        debug_assert!(self.len() == 0 || other.len() == 0 || self.time(self.len() - 1) < other.time(0));
        let shift = u32::try_from(self.text.len()).expect("a series' text stays below 4 GiB (at most 11,000 steps)");
        self.text.push_str(&other.text);
        self.starts.extend(other.starts.into_iter().map(|s| s + shift));
        self.bounds = match (self.bounds, other.bounds) {
            (Some((first, _)), Some((_, last))) => Some((first, last)),
            (mine, theirs) => mine.or(theirs),
        };
        self.regroup();
    }

    fn bytes(&self) -> usize {
        let deflated: usize = self.deflated.iter().map(|d| 16 + d.get().map_or(0, |d| 48 + d.bytes.len())).sum();
        self.text.len() + 4 * self.starts.len() + std::mem::size_of::<Option<(i64, i64)>>() + deflated
    }
}

/// Milliseconds from the seconds `super::seconds` writes (up to three decimals) at the start
/// of `text`, up to the first byte that is not part of them.
fn parse_seconds(text: &[u8]) -> i64 {
    let (negative, text) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let mut ms: u64 = 0;
    // Digits after the point; none yet when `None`.
    let mut decimals = None;
    for &b in text {
        match b {
            b'0'..=b'9' => {
                ms = ms.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
                decimals = decimals.map(|d| d + 1);
            }
            b'.' => decimals = Some(0),
            _ => break,
        }
    }
    let decimals = decimals.unwrap_or(0);
    debug_assert!(decimals <= 3, "times are written to the millisecond");
    ms = ms.wrapping_mul(10u64.pow(3 - decimals));
    // `i64::MIN`'s magnitude does not fit an `i64`: negated as an unsigned number.
    if negative {
        ms.wrapping_neg() as i64
    } else {
        ms as i64
    }
}

/// A series of a range result as its JSON text.
#[derive(Clone, Debug, PartialEq)]
pub struct KeptSeries {
    pub labels: Labels,
    /// `{"metric":{…}`: the series object up to its points.
    head: String,
    values: KeptPoints,
    hists: KeptPoints,
}

impl KeptSeries {
    /// The text Prometheus' API writes for `s`.
    pub fn new(s: &Series) -> KeptSeries {
        let mut stamps = Stamps::new(s.points.len());
        KeptSeries::written_with(s, &mut stamps)
    }

    fn written_with(s: &Series, stamps: &mut Stamps) -> KeptSeries {
        let mut head = String::new();
        open_series(&mut head, &s.labels, &mut true);
        let mut values = KeptPoints::default();
        values.text.reserve(s.points.len() * 24);
        values.starts.reserve_exact(s.points.len());
        stamps.learn_step(&s.points);
        for p in &s.points {
            values.push(|out| value_point(out, stamps, p));
        }
        let mut hists = KeptPoints::default();
        for p in &s.hists {
            hists.push(|out| histogram_point(out, p.t, &p.h));
        }
        values.regroup();
        hists.regroup();
        KeptSeries { labels: s.labels.clone(), head, values, hists }
    }

    pub fn is_empty(&self) -> bool {
        self.values.len() == 0 && self.hists.len() == 0
    }

    /// Points kept, a histogram counted as several (as `super::points` counts): at least
    /// those of any window.
    pub fn weight(&self) -> usize {
        self.values.len() + 8 * self.hists.len()
    }

    /// Keeps only the points in `[from, to]`.
    pub fn keep(&mut self, from: i64, to: i64) {
        let values = self.values.window(from, to);
        self.values.keep(values);
        let hists = self.hists.window(from, to);
        self.hists.keep(hists);
    }

    /// Appends the points of `later` (the same series, all its points after these).
    pub fn append(&mut self, later: KeptSeries) {
        debug_assert_eq!(self.labels, later.labels);
        self.values.append(later.values);
        self.hists.append(later.hists);
    }

    /// Memory held, roughly.
    pub fn bytes(&self) -> usize {
        64 + self.labels.iter().map(|l| l.name.len() + l.value.len() + 16).sum::<usize>()
            + self.head.len()
            + self.values.bytes()
            + self.hists.bytes()
    }

    /// The series object with its points in `[from, to]`, after a comma unless it is the
    /// `first`, as `super::series_object` writes it; nothing when it has no points there.
    fn write(&self, w: &mut Chunks<'_>, from: i64, to: i64, first: &mut bool) -> Result<(), Gone> {
        let (values, hists) = (self.values.window(from, to), self.hists.window(from, to));
        if values.is_empty() && hists.is_empty() {
            return Ok(());
        }
        let (values_text, hists_text) = (self.values.inside(values.clone()), self.hists.inside(hists.clone()));
        w.room(self.head.len() + values_text.len() + hists_text.len() + 32)?;
        let out = &mut w.buf;
        if !std::mem::take(first) {
            out.push(',');
        }
        out.push_str(&self.head);
        if !values.is_empty() || hists.is_empty() {
            out.push_str(r#","values":["#);
            out.push_str(values_text);
            out.push(']');
        }
        if !hists.is_empty() {
            out.push_str(r#","histograms":["#);
            out.push_str(hists_text);
            out.push(']');
        }
        out.push('}');
        w.check()
    }
}

/// The text of `series` (a range result), written by up to `threads` threads when it is large
/// (formatting its values is most of the work).
pub fn keep_series(series: &[Series], threads: usize) -> Vec<KeptSeries> {
    let total: usize = series.iter().map(weight).sum();
    let threads = threads.clamp(1, 1 + total / super::PARALLEL_BATCH_POINTS);
    let longest = series.iter().map(|s| s.points.len()).max().unwrap_or(0);
    if threads == 1 {
        let mut stamps = Stamps::new(longest);
        return series.iter().map(|s| KeptSeries::written_with(s, &mut stamps)).collect();
    }
    // Consecutive runs of about equal points, one per thread.
    let mut parts = Vec::with_capacity(threads);
    let (mut start, mut points) = (0, 0);
    for (i, s) in series.iter().enumerate() {
        points += weight(s);
        if points * threads >= total * (parts.len() + 1) && parts.len() + 1 < threads {
            parts.push(start..i + 1);
            start = i + 1;
        }
    }
    parts.push(start..series.len());
    strata_tsdb::workers::scope(|scope| {
        let written: Vec<_> = parts
            .into_iter()
            .map(|part| {
                scope.spawn(move || {
                    let mut stamps = Stamps::new(longest);
                    series[part].iter().map(|s| KeptSeries::written_with(s, &mut stamps)).collect::<Vec<_>>()
                })
            })
            .collect();
        written.into_iter().flat_map(|w| w.join().expect("a writing thread panicked")).collect()
    })
}

/// A matrix result of the points of `series` in `[from, to]`; series without any there are
/// left out.
pub(super) fn matrix(w: &mut Chunks<'_>, series: &[KeptSeries], from: i64, to: i64) -> Result<(), Gone> {
    w.buf.push_str(r#""matrix","result":["#);
    let mut first = true;
    for s in series {
        s.write(w, from, to, &mut first)?;
    }
    w.buf.push(']');
    Ok(())
}

/// Kept points deflated on their own can only be used for a gzip answer when more than this
/// share of its points' text is in whole groups; below it (short windows), the answer is
/// compressed whole, by several threads.
const GZIP_GROUPED_SHARE: f64 = 0.5;

/// Stored text (series' labels, the points at windows' ends) shorter than this is sent as it
/// is; longer runs of it (between groups, e.g. many short series in a row) are deflated.
const STORED_MAX: usize = 4096;

/// Sends, through `send` in pieces of about `chunk` bytes, the gzip of the success response
/// `super::render` writes for `Body::Kept(series, from, to)`: each whole group of points in a
/// window is sent as its deflated text, made once and kept with the points (by up to
/// `threads` threads when an answer needs many), the rest as stored or freshly deflated
/// blocks. A refresh's gzip answer is then a copy of deflated text, where compressing it
/// again cost several times its evaluation. Returns false, having sent nothing, when too
/// little of the answer is in whole groups (`GZIP_GROUPED_SHARE`) or most of its groups are
/// not deflated yet.
#[allow(clippy::too_many_arguments, reason = "what `super::render` takes, and where the gzip goes")]
pub fn gzip(
    series: &[KeptSeries],
    from: i64,
    to: i64,
    annotations: &[Annotation],
    query: &str,
    stats: Option<&str>,
    chunk: usize,
    threads: usize,
    send: &mut dyn FnMut(Vec<u8>) -> bool,
) -> bool {
    let windows: Vec<_> = series.iter().map(|s| (s.values.window(from, to), s.hists.window(from, to))).collect();
    let total: usize = series
        .iter()
        .zip(&windows)
        .map(|(s, (v, h))| s.values.inside(v.clone()).len() + s.hists.inside(h.clone()).len())
        .sum();
    let (mut grouped, mut groups, mut missing) = (0usize, 0usize, Vec::new());
    each_group(series, &windows, |slot, text| {
        grouped += text.len();
        groups += 1;
        if slot.get().is_none() {
            missing.push((slot, text));
        }
    });
    // Most groups not deflated yet (a result just evaluated, or refreshed for the first
    // time): deflating them one by one, a flush that clears the compressor's memory each, is
    // slower than compressing the whole answer on several threads (a day of 600 series: 80 ms
    // of CPU against 47), so the answer is compressed whole, and a refresh's groups are
    // deflated after it is sent (`deflate_groups_of`), for the next refreshes.
    if (grouped as f64) <= total as f64 * GZIP_GROUPED_SHARE || missing.len() * 2 > groups {
        return false;
    }
    deflate_groups(&missing, threads);
    let mut out = GzipOut::new(chunk, send);
    if write_gzip(&mut out, series, &windows, annotations, query, stats).is_ok() {
        out.finish();
    }
    true
}

/// Deflates the groups a gzip answer of `series` in `[from, to]` would send that are not
/// deflated yet (on up to `threads` threads): after an answer `gzip` left to be compressed
/// whole, so that the next refresh finds them.
pub fn deflate_groups_of(series: &[KeptSeries], from: i64, to: i64, threads: usize) {
    let windows: Vec<_> = series.iter().map(|s| (s.values.window(from, to), s.hists.window(from, to))).collect();
    let mut missing = Vec::new();
    each_group(series, &windows, |slot, text| {
        if slot.get().is_none() {
            missing.push((slot, text));
        }
    });
    deflate_groups(&missing, threads);
}

/// Visits the groups a gzip answer of each series' `windows` (values, histograms) sends
/// deflated: each one's slot and text.
fn each_group<'a>(
    series: &'a [KeptSeries],
    windows: &[(Range<usize>, Range<usize>)],
    mut visit: impl FnMut(&'a OnceLock<Arc<Deflated>>, &'a str),
) {
    for (s, (values, hists)) in series.iter().zip(windows) {
        for (points, r) in [(&s.values, values), (&s.hists, hists)] {
            for g in points.groups_inside(r.clone()) {
                let (slot, text) = points.group(g);
                visit(slot, text);
            }
        }
    }
}

/// Deflates the text of each slot not filled yet, on up to `threads` threads.
fn deflate_groups(missing: &[(&OnceLock<Arc<Deflated>>, &str)], threads: usize) {
    let deflate_all = |part: &[(&OnceLock<Arc<Deflated>>, &str)]| {
        let mut compress = Compress::new(Compression::fast(), false);
        let mut with_comma = String::new();
        for (slot, text) in part {
            slot.get_or_init(|| {
                with_comma.clear();
                with_comma.push_str(text);
                with_comma.push(',');
                let text = with_comma.as_bytes();
                let bytes = deflate_then_flush(&mut compress, text, FlushCompress::Full).into();
                Arc::new(Deflated { bytes, crc: CrcPiece::of(text) })
            });
        }
    };
    // Starting a thread (and its compressor) costs about a few dozen groups' deflating.
    let threads = strata_tsdb::workers::threads_here(threads).min(missing.len() / 32).max(1);
    if threads == 1 {
        return deflate_all(missing);
    }
    strata_tsdb::workers::scope(|scope| {
        for part in missing.chunks(missing.len().div_ceil(threads)) {
            scope.spawn(move || deflate_all(part));
        }
    });
}

fn write_gzip(
    out: &mut GzipOut<'_>,
    series: &[KeptSeries],
    windows: &[(Range<usize>, Range<usize>)],
    annotations: &[Annotation],
    query: &str,
    stats: Option<&str>,
) -> Result<(), Gone> {
    out.text(r#"{"status":"success","data":{"resultType":"matrix","result":["#)?;
    let mut first = true;
    for (s, (values, hists)) in series.iter().zip(windows) {
        if values.is_empty() && hists.is_empty() {
            continue;
        }
        if !std::mem::take(&mut first) {
            out.text(",")?;
        }
        out.text(&s.head)?;
        if !values.is_empty() || hists.is_empty() {
            out.text(r#","values":["#)?;
            out.points(&s.values, values.clone())?;
            out.text("]")?;
        }
        if !hists.is_empty() {
            out.text(r#","histograms":["#)?;
            out.points(&s.hists, hists.clone())?;
            out.text("]")?;
        }
        out.text("}")?;
    }
    out.text("]")?;
    // The rest as the plain answer ends.
    let mut ignore = |_: String| true;
    let mut rest = Chunks { buf: String::new(), chunk: usize::MAX, emit: &mut ignore };
    super::finish(&mut rest, annotations, query, stats)?;
    out.text(&rest.buf)
}

/// A gzip stream written as stored text, fresh deflate blocks and kept deflated groups.
struct GzipOut<'a> {
    out: Vec<u8>,
    /// Text not written yet: stored or deflated once a group follows or it is long enough.
    pending: String,
    /// Of the text written so far (not `pending`).
    crc: CrcPiece,
    compress: Option<Compress>,
    chunk: usize,
    send: &'a mut dyn FnMut(Vec<u8>) -> bool,
}

impl<'a> GzipOut<'a> {
    fn new(chunk: usize, send: &'a mut dyn FnMut(Vec<u8>) -> bool) -> GzipOut<'a> {
        let mut out = Vec::with_capacity(chunk + chunk / 8);
        out.extend_from_slice(&HEADER);
        GzipOut { out, pending: String::new(), crc: CrcPiece::empty(), compress: None, chunk, send }
    }

    fn text(&mut self, text: &str) -> Result<(), Gone> {
        self.pending.push_str(text);
        if self.pending.len() >= self.chunk {
            self.write_pending();
            return self.check();
        }
        Ok(())
    }

    /// Points `r` without the first one's comma (`KeptPoints::inside`): their groups as kept
    /// deflated (each with the comma of the point after it), the rest as text.
    fn points(&mut self, points: &KeptPoints, r: Range<usize>) -> Result<(), Gone> {
        let groups = points.groups_inside(r.clone());
        if groups.is_empty() {
            return self.text(points.inside(r));
        }
        let (first, last) = (points.group_points(groups.start).start, points.group_points(groups.end - 1).end);
        debug_assert!(r.start <= first && last < r.end, "a point follows the groups");
        let text_of = |from: usize, to: usize| &points.text[points.starts[from] as usize + 1..to];
        if first > r.start {
            // Up to the first group's comma.
            self.text(text_of(r.start, points.starts[first] as usize + 1))?;
        }
        for g in groups {
            let (slot, text) = points.group(g);
            let deflated = slot.get().expect("the groups of an answer are deflated before it is written");
            debug_assert_eq!(deflated.crc.len, text.len() as u64 + 1);
            self.write_pending();
            self.crc.append(&deflated.crc);
            self.out.extend_from_slice(&deflated.bytes);
            self.check()?;
        }
        self.text(text_of(last, points.end_of(r.end)))
    }

    /// Writes the pending text: stored when short, else deflated.
    fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        self.crc.append(&CrcPiece::of(self.pending.as_bytes()));
        if self.pending.len() < STORED_MAX {
            stored_blocks(&mut self.out, self.pending.as_bytes());
        } else {
            let compress = self.compress.get_or_insert_with(|| Compress::new(Compression::fast(), false));
            self.out.extend_from_slice(&deflate_piece(compress, self.pending.as_bytes()));
        }
        self.pending.clear();
    }

    fn check(&mut self) -> Result<(), Gone> {
        if self.out.len() >= self.chunk {
            let full = std::mem::replace(&mut self.out, Vec::with_capacity(self.chunk + self.chunk / 8));
            if !(self.send)(full) {
                return Err(Gone);
            }
        }
        Ok(())
    }

    fn finish(mut self) {
        self.write_pending();
        self.out.extend_from_slice(&LAST_BLOCK);
        // gzip keeps the length modulo 2^32.
        self.out.extend_from_slice(&self.crc.crc.to_le_bytes());
        self.out.extend_from_slice(&(self.crc.len as u32).to_le_bytes());
        (self.send)(self.out);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use strata_model::histogram::notation::parse;
    use strata_promql::value::HPoint;
    use strata_promql::Point;

    use super::*;

    /// Series `i` with points at the steps (of a minute) in `steps`, every third with a few
    /// histogram points among them.
    fn series(i: usize, steps: Range<i64>) -> Series {
        let labels = Labels::from_pairs([("__name__", "m"), ("i", &format!("{i:03}"))]);
        let points = steps
            .clone()
            .filter(|k| k % 5 != 2)
            .map(|k| Point { t: k * 60_000, f: (i as i64 * k) as f64 / 7.0 })
            .collect();
        let mut s = Series::new(labels, points);
        if i % 3 == 1 {
            let h = Arc::new(parse("{{count:5 sum:7.5 buckets:[1 0 2]}}").unwrap());
            s.hists = steps.filter(|k| k % 5 == 2).map(|k| HPoint { t: k * 60_000, h: h.clone() }).collect();
        }
        s
    }

    fn gunzip(bytes: &[u8]) -> String {
        let mut out = String::new();
        flate2::read::GzDecoder::new(bytes).read_to_string(&mut out).expect("a valid gzip stream");
        out
    }

    /// What `gzip` sends, in pieces of `chunk` bytes, or None when it declined.
    fn gzipped(kept: &[KeptSeries], from: i64, to: i64, chunk: usize, threads: usize) -> Option<Vec<u8>> {
        let annotations = [Annotation { msg: "a \"warning\"".into(), info: false, pos: 0 }];
        let mut out = Vec::new();
        let sent = gzip(kept, from, to, &annotations, "m", Some(r#"{"x":1}"#), chunk, threads, &mut |piece| {
            assert!(!piece.is_empty());
            out.extend_from_slice(&piece);
            true
        });
        sent.then_some(out)
    }

    fn plain(kept: &[KeptSeries], from: i64, to: i64) -> String {
        let annotations = [Annotation { msg: "a \"warning\"".into(), info: false, pos: 0 }];
        super::super::response(super::super::Body::Kept(kept, from, to), &annotations, "m", Some(r#"{"x":1}"#))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 64, ..Default::default() })]

        /// A gzip answer from kept deflated groups reads back as the plain answer, for any
        /// window, after the kept points were cut at both ends and appended to (as refreshes
        /// do), with groups deflated by earlier answers and by this one, in any piece size.
        #[test]
        fn a_gzip_answer_from_deflated_groups_is_the_plain_answer(
            n in 1usize..12,
            len in 1i64..700,
            refreshes in proptest::collection::vec((0i64..200, 0i64..80, -3i64..300, 0i64..400), 1..6),
            chunk in proptest::sample::select(vec![1usize, 300, 4096, 1 << 20]),
            threads in 1usize..4,
        ) {
            let mut kept: Vec<KeptSeries> = (0..n).map(|i| KeptSeries::new(&series(i, 0..len))).collect();
            let mut end = len;
            for (cut_front, cut_back, from, span) in refreshes {
                // Drop steps at both ends, then append new ones after what is left.
                let (first, last) = (cut_front.min(end), (end - 1 - cut_back).max(0));
                for s in &mut kept {
                    s.keep(first * 60_000, last * 60_000);
                }
                let more = cut_back + 1 + from.rem_euclid(50);
                for (i, s) in kept.iter_mut().enumerate() {
                    s.append(KeptSeries::new(&series(i, last + 1..last + 1 + more)));
                }
                end = last + 1 + more;
                let (from, to) = (from * 60_000, (from + span) * 60_000);
                let want = plain(&kept, from, to);
                // Declined while most groups are not deflated; answered once they are.
                if let Some(gz) = gzipped(&kept, from, to, chunk, threads) {
                    proptest::prop_assert_eq!(&gunzip(&gz), &want);
                }
                deflate_groups_of(&kept, from, to, threads);
                if let Some(gz) = gzipped(&kept, from, to, chunk, threads) {
                    proptest::prop_assert_eq!(gunzip(&gz), want);
                }
                // The whole window, which has the most groups, some deflated for an earlier
                // window or refresh and some not.
                if let Some(gz) = gzipped(&kept, i64::MIN, i64::MAX, chunk, threads) {
                    proptest::prop_assert_eq!(gunzip(&gz), plain(&kept, i64::MIN, i64::MAX));
                }
            }
        }
    }

    /// Long windows are answered from deflated groups (the cache's refreshes do that), kept
    /// with the points: a second answer deflates nothing again; a short window is left to the
    /// compression of the whole answer.
    #[test]
    fn long_windows_are_sent_from_groups_deflated_once() {
        let kept: Vec<KeptSeries> = (0..4).map(|i| KeptSeries::new(&series(i, 0..1440))).collect();
        let before: usize = kept.iter().map(KeptSeries::bytes).sum();
        // Nothing deflated yet: left to be compressed whole, the groups deflated after.
        assert!(gzipped(&kept, 0, 1439 * 60_000, 1 << 20, 2).is_none());
        deflate_groups_of(&kept, 0, 1439 * 60_000, 2);
        let first = gzipped(&kept, 0, 1439 * 60_000, 1 << 20, 2).expect("mostly whole groups");
        let deflated_now = || -> Vec<Arc<Deflated>> {
            kept.iter().flat_map(|s| s.values.deflated.iter().filter_map(|d| d.get().cloned())).collect()
        };
        let deflated = deflated_now();
        // Every whole group but the last, which no point follows.
        assert_eq!(deflated.len(), 4 * (1440 / 5 * 4 / GROUP_POINTS as usize - 1));
        assert!(kept.iter().map(KeptSeries::bytes).sum::<usize>() > before, "deflated text is counted");
        let second = gzipped(&kept, 0, 1439 * 60_000, 1 << 20, 2).expect("mostly whole groups");
        assert_eq!(first, second);
        let again = deflated_now();
        assert_eq!(again.len(), deflated.len());
        assert!(again.iter().zip(&deflated).all(|(a, b)| Arc::ptr_eq(a, b)), "deflated once");
        // The compressed answer is much smaller than the text, stored ends and all.
        assert!(first.len() * 3 < plain(&kept, 0, 1439 * 60_000).len());
        assert!(gzipped(&kept, 0, 60 * 60_000, 1 << 20, 2).is_none(), "no whole group");
    }

    /// Once the receiver is gone, nothing more is sent.
    #[test]
    fn a_gzip_answer_stops_when_the_receiver_is_gone() {
        let kept: Vec<KeptSeries> = (0..20).map(|i| KeptSeries::new(&series(i, 0..1440))).collect();
        deflate_groups_of(&kept, i64::MIN, i64::MAX, 1);
        let mut sends = 0;
        assert!(gzip(&kept, i64::MIN, i64::MAX, &[], "m", None, 1000, 1, &mut |_| {
            sends += 1;
            sends < 3
        }));
        assert_eq!(sends, 3);
    }

    proptest::proptest! {
        /// Times read back from their text are the times written, to the millisecond, at the
        /// extremes too.
        #[test]
        fn times_read_back_as_written(t in proptest::num::i64::ANY, small in -5_000i64..5_000) {
            for t in [t, small, i64::MIN, i64::MAX, 0] {
                let mut s = String::new();
                super::super::seconds(&mut s, t);
                s.push_str(",\"1\"]");
                proptest::prop_assert_eq!(parse_seconds(s.as_bytes()), t, "{}", s);
            }
        }

        /// Where a time falls among kept points is where it falls among their times: for
        /// points on an even grid, on a grid with gaps (the guess misses), anywhere, and for
        /// times before, between, on and after them.
        #[test]
        fn a_position_is_the_first_point_at_or_after_a_time(
            kind in 0u8..3,
            step in 1i64..100_000,
            base in -1_000_000_000i64..1_000_000_000,
            picks in proptest::collection::btree_set(0i64..400, 0..60),
            asked in proptest::collection::vec(-500i64..500, 1..20),
        ) {
            let times: Vec<i64> = match kind {
                0 => (0..picks.len() as i64).map(|k| base + k * step).collect(),
                1 => picks.iter().map(|k| base + k * step).collect(),
                _ => picks.iter().map(|k| base + k * k * 37 % 100_003 * step).collect::<std::collections::BTreeSet<_>>().into_iter().collect(),
            };
            let mut kept = KeptPoints::default();
            for &t in &times {
                kept.push(|out| {
                    out.push('[');
                    super::super::seconds(out, t);
                    out.push_str(",\"1\"]");
                });
            }
            for a in asked {
                let t = base + a * step + a % 3;
                proptest::prop_assert_eq!(kept.position(t), times.partition_point(|&x| x < t), "{}", t);
            }
        }
    }
}
