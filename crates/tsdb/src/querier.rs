//! The read path: `select(matchers)` over a time range returns series sorted by label set, each
//! with a sample iterator.
//!
//! Today it reads the head; persisted blocks join in the next milestone, each contributing its
//! chunks for a series, merged in time order.

use std::sync::Arc;

use strata_model::{Labels, Matcher, Sample};

use crate::chunkenc::{ChunkError, ChunkIterator};
use crate::head::{ChunkMeta, Head};
use crate::index::postings;

/// A cursor over samples in time order.
pub trait SampleIterator {
    /// The next sample.
    fn next(&mut self) -> Option<Sample>;
    /// The first sample with timestamp ≥ `t`; never moves backwards (if the last returned sample
    /// already qualifies it is returned again).
    fn seek(&mut self, t: i64) -> Option<Sample>;
    /// The error that ended iteration early, if any.
    fn err(&self) -> Option<&ChunkError>;
}

/// One selected series: its labels, its chunks overlapping the range, and deleted intervals.
#[derive(Debug, Clone)]
pub struct Series {
    pub labels: Labels,
    pub chunks: Vec<ChunkMeta>,
    deleted: Vec<(i64, i64)>,
    mint: i64,
    maxt: i64,
}

impl Series {
    /// Samples in the selected range, in time order.
    pub fn iter(&self) -> SeriesIterator<'_> {
        SeriesIterator { series: self, next_chunk: 0, cur: None, last: None, err: None }
    }

    /// All samples in the range (tests, export).
    pub fn samples(&self) -> Vec<Sample> {
        let mut it = self.iter();
        std::iter::from_fn(|| it.next()).collect()
    }
}

/// Iterates one series' chunks, clipped to the selected range, skipping deleted intervals.
#[derive(Debug)]
pub struct SeriesIterator<'a> {
    series: &'a Series,
    next_chunk: usize,
    cur: Option<ChunkIterator<&'a [u8]>>,
    last: Option<Sample>,
    err: Option<ChunkError>,
}

impl SeriesIterator<'_> {
    fn deleted(&self, t: i64) -> bool {
        self.series.deleted.iter().any(|&(a, b)| a <= t && t <= b)
    }

    /// Opens the next chunk whose range reaches `t`.
    fn open_chunk_reaching(&mut self, t: i64) -> bool {
        let chunks = &self.series.chunks;
        while self.next_chunk < chunks.len() && chunks[self.next_chunk].maxt < t {
            self.next_chunk += 1;
        }
        let Some(c) = chunks.get(self.next_chunk) else { return false };
        self.next_chunk += 1;
        match ChunkIterator::new(&c.data[..]) {
            Ok(it) => {
                self.cur = Some(it);
                true
            }
            Err(e) => {
                self.err = Some(e);
                false
            }
        }
    }

    fn advance(&mut self, t: i64) -> Option<Sample> {
        let mut t = t.max(self.series.mint);
        loop {
            if self.err.is_some() {
                return None;
            }
            if self.cur.is_none() && !self.open_chunk_reaching(t) {
                self.last = None;
                return None;
            }
            let found = {
                let it = self.cur.as_mut().expect("a chunk is open");
                let found = it.seek(t);
                if found.is_none() {
                    self.err = it.err().cloned();
                }
                found
            };
            match found {
                Some(s) if s.t > self.series.maxt => {
                    self.next_chunk = self.series.chunks.len();
                    self.cur = None;
                    self.last = None;
                    return None;
                }
                Some(s) if self.deleted(s.t) => match s.t.checked_add(1) {
                    Some(n) => t = n,
                    None => return None,
                },
                Some(s) => {
                    self.last = Some(s);
                    return Some(s);
                }
                None => self.cur = None,
            }
        }
    }

    fn advance_past(&mut self, t: i64) -> Option<Sample> {
        match t.checked_add(1) {
            Some(n) => self.advance(n),
            None => None,
        }
    }
}

impl SampleIterator for SeriesIterator<'_> {
    fn next(&mut self) -> Option<Sample> {
        match self.last {
            None if self.next_chunk == 0 && self.cur.is_none() => self.advance(i64::MIN),
            None => None,
            Some(s) => self.advance_past(s.t),
        }
    }

    fn seek(&mut self, t: i64) -> Option<Sample> {
        match self.last {
            Some(s) if s.t >= t => Some(s),
            None if self.next_chunk > 0 || self.cur.is_some() => None,
            _ => self.advance(t),
        }
    }

    fn err(&self) -> Option<&ChunkError> {
        self.err.as_ref()
    }
}

/// Reads the head over `[mint, maxt]` (inclusive, milliseconds).
#[derive(Debug)]
pub struct Querier<'a> {
    head: &'a Head,
    mint: i64,
    maxt: i64,
}

impl<'a> Querier<'a> {
    pub fn new(head: &'a Head, mint: i64, maxt: i64) -> Self {
        Querier { head, mint, maxt }
    }

    /// Series matching every matcher with at least one sample in range, sorted by labels.
    pub fn select(&self, matchers: &[Matcher]) -> Vec<Series> {
        let refs = postings::expand(self.head.postings_for(matchers));
        let mut found: Vec<(Arc<crate::head::MemSeries>, Vec<ChunkMeta>)> = Vec::with_capacity(refs.len());
        for r in refs {
            let Some(s) = self.head.series(r) else { continue };
            let chunks = s.state.lock().chunks(self.mint, self.maxt);
            if !chunks.is_empty() {
                found.push((s, chunks));
            }
        }
        let stones = self.head.tombstones_snapshot();
        let mut out: Vec<Series> = self.head.symbols.with(|get| {
            found
                .into_iter()
                .map(|(s, chunks)| {
                    let deleted = stones.as_ref().and_then(|t| t.get(&s.series_ref).cloned()).unwrap_or_default();
                    Series { labels: s.labels.resolve_with(get), chunks, deleted, mint: self.mint, maxt: self.maxt }
                })
                .collect()
        });
        out.sort_unstable_by(|a, b| a.labels.cmp(&b.labels));
        out
    }

    pub fn label_names(&self, matchers: &[Matcher]) -> Vec<String> {
        self.head.label_names(matchers)
    }

    pub fn label_values(&self, name: &str, matchers: &[Matcher]) -> Vec<String> {
        self.head.label_values(name, matchers)
    }
}

#[cfg(test)]
mod tests;
