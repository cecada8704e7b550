//! What carbon senders put on the wire: the plaintext protocol (`path value timestamp\n`, over
//! TCP and UDP) and the pickle protocol (4-byte big-endian length, then a pickled list of
//! `(path, (timestamp, value))`), decoded to points. The rules follow carbon 1.1's receivers:
//! values and timestamps are read as Python's `float()` reads them, a NaN value is dropped
//! (carbon drops them silently; here it is counted), a timestamp of -1 means "now".

pub mod pickle;
pub mod plaintext;

use crate::path::{GraphitePath, PathError};

/// One datapoint as received.
#[derive(Debug, Clone, PartialEq)]
pub struct CarbonPoint {
    pub path: GraphitePath,
    /// Milliseconds since the epoch (carbon's timestamps are seconds, fractions allowed).
    pub t_ms: i64,
    pub value: f64,
}

/// Why a line or a pickled datapoint was not taken; each is counted by reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PointError {
    #[error("expected `path value timestamp`, found {0} fields")]
    FieldCount(usize),
    #[error("the line is not UTF-8")]
    NotUtf8,
    #[error("value {0:?} is not a number")]
    BadValue(String),
    #[error("value is NaN (dropped, as carbon does)")]
    NanValue,
    #[error("timestamp {0:?} is not a number of seconds in range")]
    BadTimestamp(String),
    #[error("path: {0}")]
    BadPath(#[from] PathError),
    #[error("a pickled datapoint is not (path, (timestamp, value))")]
    BadShape,
}

impl PointError {
    /// A short stable name for the `reason` label of the counter.
    pub fn reason(&self) -> &'static str {
        match self {
            PointError::FieldCount(_) => "field_count",
            PointError::NotUtf8 => "not_utf8",
            PointError::BadValue(_) => "bad_value",
            PointError::NanValue => "nan_value",
            PointError::BadTimestamp(_) => "bad_timestamp",
            PointError::BadPath(_) => "bad_path",
            PointError::BadShape => "bad_shape",
        }
    }
}

/// Reads a number as Python's `float()` does for what carbon senders send: decimal and
/// exponent forms, `inf`, `nan`, a sign; surrounding whitespace.
pub(crate) fn parse_float(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok()
}

/// Seconds (as sent) to milliseconds; -1 (whatever its fraction, as carbon's `int(t) == -1`)
/// means `now_ms`. `None` if not finite or past what milliseconds in an i64 hold.
pub(crate) fn timestamp_ms(seconds: f64, now_ms: i64) -> Option<i64> {
    if !seconds.is_finite() {
        return None;
    }
    if seconds.trunc() == -1.0 {
        return Some(now_ms);
    }
    let ms = (seconds * 1000.0).round();
    (ms.abs() < 9.0e18).then_some(ms as i64)
}

/// A point from its three parts, checked.
pub(crate) fn point(
    path: &str,
    value: f64,
    seconds: f64,
    raw_ts: &str,
    now_ms: i64,
) -> Result<CarbonPoint, PointError> {
    if value.is_nan() {
        return Err(PointError::NanValue);
    }
    let t_ms = timestamp_ms(seconds, now_ms).ok_or_else(|| PointError::BadTimestamp(raw_ts.to_owned()))?;
    Ok(CarbonPoint { path: GraphitePath::parse(path)?, t_ms, value })
}
