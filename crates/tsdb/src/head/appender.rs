//! Batched appends to the head: validate as samples arrive, apply and log at commit.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use strata_model::{FloatHistogram, HistogramError, Labels, LabelsError, SeriesRef};

use super::exemplars::{self, Exemplar, ExemplarError};
use super::series::{Appended, MemSeries, SampleError, SeriesState};
use super::Head;
use crate::error::Result;
use crate::hash::U64Map;
use crate::record::{self, RefExemplar, RefHistogram, RefSample};

/// Samples per WAL samples record: bounds record size (~20 B/sample → ~200 KiB).
const SAMPLES_PER_RECORD: usize = 10_000;
/// Histograms per WAL histograms record (each takes ~50 B plus 8 B per bucket).
const HISTOGRAMS_PER_RECORD: usize = 1_000;

/// Why one append was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    #[error("invalid label set: {0}")]
    InvalidLabels(LabelsError),
    #[error("unknown series reference {0}")]
    UnknownSeries(SeriesRef),
    #[error(transparent)]
    Sample(SampleError),
    #[error("write-ahead log: {0}")]
    Wal(String),
    #[error("invalid histogram: {0}")]
    InvalidHistogram(HistogramError),
    #[error(transparent)]
    Exemplar(ExemplarError),
}

/// What a commit stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommitOutcome {
    /// Samples stored and logged.
    pub appended: usize,
    /// Samples that passed validation at `append` but lost a race with a concurrent commit to
    /// the same series; not stored, not logged, not acknowledged.
    pub rejected: usize,
    pub first_rejection: Option<(SeriesRef, SampleError)>,
    /// Exemplars stored and logged (duplicates of a series' newest are not counted).
    pub exemplars_appended: usize,
    /// Of `appended`, the native histogram samples.
    pub histograms_appended: usize,
}

/// What an appender does with a late sample: one at or before its series' newest timestamp, or
/// older than the head takes in order (`Head::min_append_time`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfOrder {
    /// How far behind the head's newest sample a late sample may be, in milliseconds (later
    /// than that: refused as too old); 0 refuses every late sample, as Prometheus does unless
    /// `out_of_order_time_window` is set.
    pub window_ms: i64,
    /// Whether a sample at a stored timestamp with another value replaces it (Graphite's last
    /// write wins) or is refused as a duplicate (Prometheus' rule).
    pub replace: bool,
}

impl OutOfOrder {
    /// Late samples refused: Prometheus' default.
    pub const OFF: OutOfOrder = OutOfOrder { window_ms: 0, replace: false };
}

/// A value waiting for the commit. Floats stay unboxed: they are nearly every sample.
#[derive(Debug)]
enum PendingValue {
    Float(f64),
    Histogram(Box<FloatHistogram>),
}

/// One pending sample: series, timestamp, start time (0: none), value, and whether it goes to
/// the series' overlay (a late sample) rather than its in-order chunks.
type Pending = (Arc<MemSeries>, i64, i64, PendingValue, bool);

/// Buffers an appender fills, kept by each thread between its batches: a remote-write request
/// is a few thousand samples, and growing these afresh per request faulted in new pages each
/// time (and, under churn, left the allocator holding more than the head).
#[derive(Default)]
struct AppendBuffers {
    pending: Vec<Pending>,
    batch_max: U64Map<SeriesRef, i64>,
    logged: Vec<RefSample>,
}

/// Most entries a thread's kept `AppendBuffers` vector may hold (larger ones, from a big
/// import batch, are dropped after it).
const APPEND_BUFFERS_KEPT_ENTRIES: usize = 1 << 15;

thread_local! {
    static APPEND_BUFFERS: std::cell::RefCell<AppendBuffers> = std::cell::RefCell::default();
}

impl AppendBuffers {
    fn take() -> AppendBuffers {
        APPEND_BUFFERS.with_borrow_mut(std::mem::take)
    }

    /// Keeps emptied buffers for the thread's next batch, unless they grew too large.
    fn keep(mut self) {
        self.pending.clear();
        // A hash map's clear rewrites all its control bytes even when it holds nothing, and
        // small batches (a scrape, a carbon line) leave it empty.
        if !self.batch_max.is_empty() {
            self.batch_max.clear();
        }
        self.logged.clear();
        let largest = self.pending.capacity().max(self.batch_max.capacity()).max(self.logged.capacity());
        if largest <= APPEND_BUFFERS_KEPT_ENTRIES {
            APPEND_BUFFERS.with_borrow_mut(|b| *b = self);
        }
    }
}

/// A batch of appends. Dropping it without `commit` discards the samples (series created by it
/// stay, empty, until the head garbage-collects them).
#[derive(Debug)]
pub struct Appender<'h> {
    head: &'h Head,
    /// Keeps head truncation from removing series or raising the time limit under this batch.
    /// A thread must not hold two appenders at once (a waiting truncation would deadlock it).
    _gate: parking_lot::RwLockReadGuard<'h, ()>,
    pending: Vec<Pending>,
    /// Newest pending in-order timestamp per series, to tell late samples within the batch.
    batch_max: U64Map<SeriesRef, i64>,
    /// The thread's kept `logged` buffer, for the commit.
    logged: Vec<RefSample>,
    /// Oldest timestamp taken in order.
    min_t: i64,
    out_of_order: OutOfOrder,
    /// Oldest timestamp taken late, `out_of_order.window_ms` behind the newest sample of the
    /// head and of this batch so far (a batch into an empty head is not a window of its own);
    /// `i64::MAX` when late samples are refused.
    late_min_t: i64,
    /// The head's cut epoch, which late samples are stored under (`Head::begin_cut`).
    epoch: u64,
    /// Exemplars waiting for the commit, checked.
    exemplars: Vec<(Arc<MemSeries>, Exemplar)>,
    /// Where in `exemplars` each series' newest pending one is, for the order check.
    newest_exemplar: U64Map<SeriesRef, usize>,
}

impl<'h> Appender<'h> {
    pub(super) fn new(head: &'h Head, out_of_order: OutOfOrder) -> Self {
        let gate = head.gc_gate.read();
        let late_min_t = if out_of_order.window_ms > 0 && !head.opts.backfill {
            head.max_time().saturating_sub(out_of_order.window_ms)
        } else {
            i64::MAX
        };
        let AppendBuffers { pending, batch_max, logged } = AppendBuffers::take();
        Appender {
            head,
            _gate: gate,
            pending,
            batch_max,
            logged,
            min_t: head.min_append_time(),
            out_of_order,
            late_min_t,
            epoch: head.cut_epoch(),
            exemplars: Vec::new(),
            newest_exemplar: U64Map::default(),
        }
    }

    /// `append_exemplar` for the series with the label set `pairs`, which must exist (a sample
    /// of it in this batch or before): remote write sends exemplars apart from their samples.
    pub fn append_exemplar_pairs<N: AsRef<str>, V: AsRef<str>>(
        &mut self,
        pairs: &[(N, V)],
        e: Exemplar,
    ) -> Result<SeriesRef, AppendError> {
        let canonical = strata_model::pairs_are_canonical(pairs);
        let found = if canonical {
            let hash = strata_model::stable_hash_pairs(pairs.iter().map(|(n, v)| (n.as_ref(), v.as_ref())));
            self.head.find_pairs(pairs, hash)
        } else {
            let labels = Labels::try_from_pairs(pairs.iter().map(|(n, v)| (n.as_ref(), v.as_ref())))
                .map_err(AppendError::InvalidLabels)?;
            self.head.find_series(&labels)
        };
        let series = found.ok_or(AppendError::UnknownSeries(SeriesRef(0)))?;
        let r = series.series_ref;
        self.push_exemplar(series, e)?;
        Ok(r)
    }

    /// Adds an exemplar to the series `r` (one this batch or an earlier one appended to).
    /// Refused when its labels are too long or it is older than the series' newest exemplar
    /// (stored or in this batch); the head's capacity of 0 takes none, silently.
    pub fn append_exemplar(&mut self, r: SeriesRef, e: Exemplar) -> Result<(), AppendError> {
        if self.head.exemplars.capacity() == 0 {
            return Ok(());
        }
        // An exemplar follows its sample (a scrape, remote write): the series is the last one
        // pending, found without a lookup.
        let series = match self.pending.last() {
            Some((s, ..)) if s.series_ref == r => s.clone(),
            _ => self.head.series(r).ok_or(AppendError::UnknownSeries(r))?,
        };
        self.push_exemplar(series, e)
    }

    fn push_exemplar(&mut self, series: Arc<MemSeries>, e: Exemplar) -> Result<(), AppendError> {
        if self.head.exemplars.capacity() == 0 {
            return Ok(());
        }
        exemplars::validate(&e).map_err(AppendError::Exemplar)?;
        let r = series.series_ref;
        let verdict = match self.newest_exemplar.get(&r) {
            Some(&i) => exemplars::against_newest(&self.exemplars[i].1, &e),
            None => self.head.exemplars.check(r, &e),
        };
        match verdict {
            Ok(exemplars::Added::Duplicate) => Ok(()),
            Ok(exemplars::Added::Stored) => {
                self.newest_exemplar.insert(r, self.exemplars.len());
                self.exemplars.push((series, e));
                Ok(())
            }
            Err(err) => {
                self.head.exemplars.stats.out_of_order.fetch_add(1, Ordering::Relaxed);
                Err(AppendError::Exemplar(err))
            }
        }
    }

    /// Appends a sample to the series with `labels`, creating it if needed.
    pub fn append(&mut self, labels: &Labels, t: i64, v: f64) -> Result<SeriesRef, AppendError> {
        self.append_handle(labels, t, v).map(|s| s.series_ref)
    }

    /// Appends a sample to the series with the label set `pairs`, as a client sent them. When
    /// they are already canonical (sorted, unique, non-empty: what Prometheus sends) an existing
    /// series is found without building a `Labels`, the hot path of remote write; otherwise, or
    /// for a new series, this is `append`.
    pub fn append_pairs<N: AsRef<str>, V: AsRef<str>>(
        &mut self,
        pairs: &[(N, V)],
        t: i64,
        v: f64,
    ) -> Result<SeriesRef, AppendError> {
        self.append_pairs_with_start(pairs, t, 0, v)
    }

    /// `append_pairs` of a sample with a start time `st` (see `append_with_start`).
    pub fn append_pairs_with_start<N: AsRef<str>, V: AsRef<str>>(
        &mut self,
        pairs: &[(N, V)],
        t: i64,
        st: i64,
        v: f64,
    ) -> Result<SeriesRef, AppendError> {
        self.append_pairs_series(pairs, t, st, v).map(|s| s.series_ref)
    }

    /// `append_pairs`, returning the series itself for `append_to` (see `append_handle`).
    pub fn append_pairs_handle<N: AsRef<str>, V: AsRef<str>>(
        &mut self,
        pairs: &[(N, V)],
        t: i64,
        v: f64,
    ) -> Result<Arc<MemSeries>, AppendError> {
        self.append_pairs_series(pairs, t, 0, v)
    }

    fn append_pairs_series<N: AsRef<str>, V: AsRef<str>>(
        &mut self,
        pairs: &[(N, V)],
        t: i64,
        st: i64,
        v: f64,
    ) -> Result<Arc<MemSeries>, AppendError> {
        let mut missed = None;
        if strata_model::pairs_are_canonical(pairs) {
            self.check_too_old(t)?;
            let hash = strata_model::stable_hash_pairs(pairs.iter().map(|(n, v)| (n.as_ref(), v.as_ref())));
            if let Some(series) = self.head.find_pairs(pairs, hash) {
                self.push(series.clone(), t, st, PendingValue::Float(v))?;
                return Ok(series);
            }
            // Canonical pairs are the labels' order: the hash is theirs, and the series is
            // created without hashing and looking it up again.
            missed = Some(hash);
        }
        let labels = Labels::try_from_pairs(pairs.iter().map(|(n, v)| (n.as_ref(), v.as_ref())))
            .map_err(AppendError::InvalidLabels)?;
        self.append_labels_missed(&labels, missed, t, st, v)
    }

    /// Appends a float to the series with `labels` (validated, created if needed) and returns it.
    fn append_labels(&mut self, labels: &Labels, t: i64, st: i64, v: f64) -> Result<Arc<MemSeries>, AppendError> {
        self.append_labels_missed(labels, None, t, st, v)
    }

    /// `append_labels`; `missed`: the labels' hash, which a lookup has just missed.
    fn append_labels_missed(
        &mut self,
        labels: &Labels,
        missed: Option<u64>,
        t: i64,
        st: i64,
        v: f64,
    ) -> Result<Arc<MemSeries>, AppendError> {
        labels.validate().map_err(AppendError::InvalidLabels)?;
        // Before creating the series, so that a stream of too-old samples creates nothing.
        self.check_too_old(t)?;
        let (series, _) = match missed {
            Some(hash) => self.head.create_missing(labels, hash)?,
            None => self.head.get_or_create(labels)?,
        };
        self.push(series.clone(), t, st, PendingValue::Float(v))?;
        Ok(series)
    }

    /// `append`, returning the series itself: a caller that appends to the same series again
    /// and again (a scrape cache) keeps it and uses `append_to`, which skips the lookup by
    /// reference.
    pub fn append_handle(&mut self, labels: &Labels, t: i64, v: f64) -> Result<Arc<MemSeries>, AppendError> {
        self.append_labels(labels, t, 0, v)
    }

    /// `append` of a sample with a start time `st` (when its counter started counting, as
    /// OpenMetrics `_created` or OTLP give it; 0: none).
    pub fn append_with_start(&mut self, labels: &Labels, t: i64, st: i64, v: f64) -> Result<SeriesRef, AppendError> {
        self.append_labels(labels, t, st, v).map(|s| s.series_ref)
    }

    /// Appends a native histogram to the series with `labels`, creating it if needed. The
    /// histogram is validated first (an invalid one is refused with the reason).
    pub fn append_histogram(&mut self, labels: &Labels, t: i64, h: FloatHistogram) -> Result<SeriesRef, AppendError> {
        self.append_histogram_with_start(labels, t, 0, h)
    }

    /// `append_histogram` of a sample with a start time `st` (see `append_with_start`).
    pub fn append_histogram_with_start(
        &mut self,
        labels: &Labels,
        t: i64,
        st: i64,
        h: FloatHistogram,
    ) -> Result<SeriesRef, AppendError> {
        labels.validate().map_err(AppendError::InvalidLabels)?;
        if !h.is_stale() {
            h.validate().map_err(AppendError::InvalidHistogram)?;
        }
        self.check_too_old(t)?;
        let (series, _) = self.head.get_or_create(labels)?;
        let r = series.series_ref;
        self.push(series, t, st, PendingValue::Histogram(Box::new(h)))?;
        Ok(r)
    }

    /// Appends a sample to a series `append_handle` returned. `UnknownSeries` when the head has
    /// removed the series since (truncation of a series without samples): the caller must
    /// append by labels again.
    pub fn append_to(&mut self, series: &Arc<MemSeries>, t: i64, v: f64) -> Result<(), AppendError> {
        self.check_too_old(t)?;
        self.push(series.clone(), t, 0, PendingValue::Float(v))
    }

    /// Appends a sample to a series by the reference an earlier `append` returned.
    pub fn append_ref(&mut self, r: SeriesRef, t: i64, v: f64) -> Result<(), AppendError> {
        self.append_ref_with_start(r, t, 0, v)
    }

    /// `append_ref` of a sample with a start time `st` (see `append_with_start`).
    pub fn append_ref_with_start(&mut self, r: SeriesRef, t: i64, st: i64, v: f64) -> Result<(), AppendError> {
        self.check_too_old(t)?;
        // Consecutive samples of one series (a remote-write series, an import) reuse the series
        // the previous sample found, instead of a stripe lock and map lookup per sample.
        let series = match self.pending.last() {
            Some((s, ..)) if s.series_ref == r => s.clone(),
            _ => self.head.series(r).ok_or(AppendError::UnknownSeries(r))?,
        };
        self.push(series, t, st, PendingValue::Float(v))
    }

    fn check_too_old(&self, t: i64) -> Result<(), AppendError> {
        if t < self.min_t && t < self.late_min_t {
            self.head.stats.rejected_too_old.fetch_add(1, Ordering::Relaxed);
            return Err(AppendError::Sample(SampleError::TooOld { t, min_t: self.min_t.min(self.late_min_t) }));
        }
        Ok(())
    }

    fn push(&mut self, series: Arc<MemSeries>, t: i64, st: i64, v: PendingValue) -> Result<(), AppendError> {
        let r = series.series_ref;
        let verdict = match self.batch_max.get(&r) {
            Some(&latest) if t <= latest => {
                Err(if t == latest { SampleError::Duplicate { t } } else { SampleError::OutOfOrder { t, latest } })
            }
            Some(_) => Ok(Appended::Sample { chunk_created: false }),
            None => {
                let st = series.lock();
                // Truncation cannot run while this appender holds the gate, so a series not
                // removed now stays until the commit.
                if st.removed {
                    return Err(AppendError::UnknownSeries(r));
                }
                match &v {
                    PendingValue::Float(f) => st.appendable(t, *f),
                    PendingValue::Histogram(h) => st.appendable_histogram(t, h),
                }
            }
        };
        // Newer than the series' newest, but older than the head takes in order.
        let verdict = verdict.and_then(|a| match a {
            Appended::Sample { .. } if t < self.min_t => Err(SampleError::TooOld { t, min_t: self.min_t }),
            a => Ok(a),
        });
        let verdict = match verdict {
            Err(e) if self.may_be_late(t, &v, &e) => {
                let PendingValue::Float(f) = v else { unreachable!("only floats are taken late") };
                let checked = self.check_late(&series.lock(), t, f);
                match checked {
                    Ok(Appended::Same) => return Ok(()),
                    Ok(Appended::Sample { .. }) => {
                        self.pending.push((series, t, st, v, true));
                        return Ok(());
                    }
                    Err(e) => Err(e),
                }
            }
            v => v,
        };
        match verdict {
            Ok(Appended::Same) => Ok(()),
            Ok(Appended::Sample { .. }) => {
                self.batch_max.insert(r, t);
                self.pending.push((series, t, st, v, false));
                if self.late_min_t != i64::MAX {
                    self.late_min_t = self.late_min_t.max(t.saturating_sub(self.out_of_order.window_ms));
                }
                Ok(())
            }
            Err(e) => {
                // Late, and further back than the window: too old, whatever else it is.
                let e = match e {
                    SampleError::OutOfOrder { .. } if self.late_min_t != i64::MAX && t < self.late_min_t => {
                        SampleError::TooOld { t, min_t: self.late_min_t }
                    }
                    e => e,
                };
                self.count_rejection(&e);
                Err(AppendError::Sample(e))
            }
        }
    }

    /// Whether a sample refused in order for `e` may be taken late instead.
    fn may_be_late(&self, t: i64, v: &PendingValue, e: &SampleError) -> bool {
        t >= self.late_min_t
            && matches!(v, PendingValue::Float(_))
            && matches!(e, SampleError::OutOfOrder { .. } | SampleError::Duplicate { .. } | SampleError::TooOld { .. })
    }

    /// Whether the late sample `(t, v)` stores: under Prometheus' rule a timestamp already
    /// stored with another value is a duplicate, and with the same value a retry (`Same`).
    fn check_late(&self, state: &SeriesState, t: i64, v: f64) -> Result<Appended, SampleError> {
        if self.out_of_order.replace {
            return Ok(Appended::Sample { chunk_created: false });
        }
        match state.value_at(t) {
            Some(old) if old.to_bits() == v.to_bits() => Ok(Appended::Same),
            Some(_) => Err(SampleError::Duplicate { t }),
            None => Ok(Appended::Sample { chunk_created: false }),
        }
    }

    fn count_rejection(&self, e: &SampleError) {
        let c = match e {
            SampleError::OutOfOrder { .. } => &self.head.stats.rejected_out_of_order,
            SampleError::Duplicate { .. } => &self.head.stats.rejected_duplicate,
            SampleError::TooOld { .. } => &self.head.stats.rejected_too_old,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Makes room for `n` more samples (a caller that knows its batch size, like a scrape).
    pub fn reserve(&mut self, n: usize) {
        self.pending.reserve(n);
        self.batch_max.reserve(n);
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Applies the batch to memory, logs what was applied, and (under `Always`) waits for the
    /// fsync. Only the samples counted in `appended` are acknowledged.
    pub fn commit(mut self) -> Result<CommitOutcome> {
        let head = self.head;
        let range = head.opts.chunk_range_ms;
        let mut out = CommitOutcome::default();
        let mut logged = std::mem::take(&mut self.logged);
        logged.reserve(self.pending.len());
        let mut logged_histograms: Vec<RefHistogram> = Vec::new();
        let mut logged_late: Vec<RefSample> = Vec::new();
        let (mut min_t, mut max_t) = (i64::MAX, i64::MIN);
        let mut pending = std::mem::take(&mut self.pending);
        for (series, t, st, v, late) in pending.drain(..) {
            let res = {
                let mut state = series.lock();
                let store_late = |state: &mut SeriesState, f: f64| {
                    let res = self.check_late(state, t, f);
                    if res.is_ok_and(|a| a != Appended::Same) {
                        state.insert_late(t, f, self.epoch);
                    }
                    res.map(|a| (a, true))
                };
                match &v {
                    PendingValue::Float(f) if late => store_late(&mut state, *f),
                    PendingValue::Float(f) => match state.append_with_start(t, st, *f, range) {
                        // A concurrent commit to the series got there first.
                        Err(e) if self.may_be_late(t, &v, &e) => store_late(&mut state, *f),
                        res => res.map(|a| (a, false)),
                    },
                    PendingValue::Histogram(h) => {
                        state.append_histogram_with_start(t, st, h, range).map(|a| (a, false))
                    }
                }
            };
            match res {
                Ok((Appended::Sample { chunk_created }, late)) => {
                    if chunk_created {
                        head.stats.chunks_created.fetch_add(1, Ordering::Relaxed);
                    }
                    min_t = min_t.min(t);
                    max_t = max_t.max(t);
                    match v {
                        PendingValue::Float(v) if late => {
                            logged_late.push(RefSample { series: series.series_ref, t, st: 0, v })
                        }
                        PendingValue::Float(v) => logged.push(RefSample { series: series.series_ref, t, st, v }),
                        PendingValue::Histogram(h) => {
                            logged_histograms.push(RefHistogram { series: series.series_ref, t, st, h: *h })
                        }
                    }
                }
                Ok((Appended::Same, _)) => {}
                Err(e) => {
                    self.count_rejection(&e);
                    out.rejected += 1;
                    out.first_rejection.get_or_insert((series.series_ref, e));
                }
            }
        }
        let mut logged_exemplars: Vec<RefExemplar> = Vec::new();
        for (series, e) in std::mem::take(&mut self.exemplars) {
            let labels = || head.symbols.resolve(&series.labels);
            let (t, v, l) = (e.t, e.v, e.labels.clone());
            // A concurrent commit may have stored a newer one meanwhile: then this one goes.
            if let Ok(exemplars::Added::Stored) = head.exemplars.add(series.series_ref, labels, e) {
                logged_exemplars.push(RefExemplar { series: series.series_ref, t, v, labels: l });
            }
        }
        out.exemplars_appended = logged_exemplars.len();
        // The samples are in memory now, whatever the log says below: the head's time range
        // must cover them, or a head cut computed from it would truncate them away unwritten
        // (a failed commit's records go out ahead of the next one, which acknowledges them).
        if min_t <= max_t {
            head.note_time(min_t);
            head.note_time(max_t);
            head.changes.note_write(min_t, max_t);
        }
        if let Some(wal) = &head.wal {
            if !logged.is_empty()
                || !logged_histograms.is_empty()
                || !logged_late.is_empty()
                || !logged_exemplars.is_empty()
            {
                let mut records = Vec::with_capacity(logged.len().div_ceil(SAMPLES_PER_RECORD) + 1);
                for part in logged.chunks(SAMPLES_PER_RECORD) {
                    let mut rec = Vec::with_capacity(1 + 16 + part.len() * 12);
                    record::encode_samples(part, &mut rec);
                    records.push(rec);
                }
                for part in logged_histograms.chunks(HISTOGRAMS_PER_RECORD) {
                    let mut rec = Vec::new();
                    record::encode_histograms(part, &mut rec);
                    records.push(rec);
                }
                for part in logged_late.chunks(SAMPLES_PER_RECORD) {
                    let mut rec = Vec::with_capacity(1 + 16 + part.len() * 12);
                    record::encode_out_of_order_samples(part, &mut rec);
                    records.push(rec);
                }
                for part in logged_exemplars.chunks(HISTOGRAMS_PER_RECORD) {
                    let mut rec = Vec::new();
                    record::encode_exemplars(part, &mut rec);
                    records.push(rec);
                }
                let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
                wal.commit(&refs)?;
            }
        }
        out.appended = logged.len() + logged_histograms.len() + logged_late.len();
        out.histograms_appended = logged_histograms.len();
        head.stats.samples_appended_late.fetch_add(logged_late.len() as u64, Ordering::Relaxed);
        head.stats.samples_appended.fetch_add(out.appended as u64, Ordering::Relaxed);
        AppendBuffers { pending, batch_max: std::mem::take(&mut self.batch_max), logged }.keep();
        Ok(out)
    }
}
