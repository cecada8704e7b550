//! Range results kept as the JSON text Prometheus' API writes for them, for the result cache:
//! an answer from kept steps is then copied, not formatted again. Formatting the points was
//! nearly all of a cache hit's cost (a day of 3,000 series at a one-minute step is 4.3M
//! points, 74 MB of JSON, written in about as much CPU time as evaluating them).
//!
//! A series keeps its labels (results are merged by them), its object's opening text
//! (`{"metric":{…}`) and its points each as the text written for it after a comma
//! (`,[1796072040,"0.5"]`), with where each starts. A point's time is read back from its text
//! when a window is cut, so a point costs its text and four bytes.

use std::ops::Range;

use strata_model::Labels;
use strata_promql::Series;

use super::{histogram_point, open_series, value_point, weight, Chunks, Gone, Stamps};

/// Points as the text written for them, each after a comma, and where each starts.
#[derive(Clone, Debug, Default, PartialEq)]
struct KeptPoints {
    text: String,
    /// Offset in `text` of each point's comma; the points' times ascend.
    starts: Vec<u32>,
    /// The first and the last point's time (when there are points). Every window cut reads
    /// them; read back from the text, they were two more places of it to fetch per cut (a
    /// full hit of 3,000 series × 20 steps took 12% longer).
    bounds: Option<(i64, i64)>,
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
        self.bounds = (self.len() > 0).then(|| (self.time(0), self.time(self.len() - 1)));
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
    }

    fn bytes(&self) -> usize {
        self.text.len() + 4 * self.starts.len() + std::mem::size_of::<Option<(i64, i64)>>()
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

#[cfg(test)]
mod tests {
    use super::*;

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
