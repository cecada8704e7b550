//! The vocabulary every Strata crate shares: label sets, label matchers, samples and series
//! references. No I/O happens here.
//!
//! The central choice: a series *is* its label set. The metric name is just the label
//! `__name__`, label sets are kept sorted by name so that equality, hashing and ordering are
//! plain slice operations, and an empty label value means "this label is absent" (Prometheus
//! semantics), so such labels are dropped when a set is built.

pub mod civil;
pub mod duration;
pub mod histogram;
pub mod labels;
pub mod matcher;
pub mod selector;

pub use duration::{format_duration_ms, parse_duration_ms};
pub use histogram::{kahan_inc, CounterResetHint, FloatHistogram, HistogramError};
pub use labels::{pairs_are_canonical, stable_hash_pairs, Label, Labels, LabelsBuilder, LabelsError, METRIC_NAME};
pub use matcher::{MatchOp, Matcher, MatcherError};
pub use selector::parse_selector;

/// Milliseconds since the Unix epoch, as Prometheus counts time.
pub type TimestampMs = i64;

/// One float sample of a series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub t: TimestampMs,
    pub v: f64,
}

impl Sample {
    pub fn new(t: TimestampMs, v: f64) -> Self {
        Sample { t, v }
    }

    /// Equality on the exact bit pattern of the value, so NaNs (and the stale marker) compare
    /// equal to themselves; what storage round-trips must preserve.
    pub fn bit_eq(&self, other: &Sample) -> bool {
        self.t == other.t && self.v.to_bits() == other.v.to_bits()
    }
}

/// The value Prometheus writes to mark a series stale: a NaN with this exact bit pattern.
pub const STALE_NAN_BITS: u64 = 0x7ff0_0000_0000_0002;

/// Whether `v` is the staleness marker (and not just any NaN).
pub fn is_stale_nan(v: f64) -> bool {
    v.to_bits() == STALE_NAN_BITS
}

/// Reference of a series inside one head or block. Head references are handed out
/// monotonically, which keeps in-memory postings lists sorted by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SeriesRef(pub u64);

impl std::fmt::Display for SeriesRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
