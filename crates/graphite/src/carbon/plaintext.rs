//! Carbon's plaintext protocol: one datapoint per line, `path value timestamp`, fields
//! separated by any run of spaces or tabs (carbon splits on whitespace), `\n` or `\r\n` at the
//! end. A line with only `path value` is taken at the time it arrives, as VictoriaMetrics and
//! go-carbon take it (carbon itself refuses it).

use super::{parse_float, timestamp_ms, CarbonPoint, PointError};
use crate::path::GraphitePath;

/// A line's fields, read and checked except for the path: the ingest path looks the path up
/// among the series it has seen before it pays for the path's own checks (`GraphitePath::parse`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawPoint<'a> {
    pub path: &'a str,
    /// Milliseconds since the epoch.
    pub t_ms: i64,
    pub value: f64,
}

impl RawPoint<'_> {
    /// The point with its path checked and parsed.
    pub fn parse_path(&self) -> Result<CarbonPoint, PointError> {
        Ok(CarbonPoint { path: GraphitePath::parse(self.path)?, t_ms: self.t_ms, value: self.value })
    }
}

/// Parses one line (without its `\n`; a trailing `\r` is ignored).
pub fn parse_line(line: &[u8], now_ms: i64) -> Result<CarbonPoint, PointError> {
    parse_fields(line, now_ms)?.parse_path()
}

/// `parse_line` but for the path's checks, which are `RawPoint::parse_path`.
pub fn parse_fields(line: &[u8], now_ms: i64) -> Result<RawPoint<'_>, PointError> {
    let line = std::str::from_utf8(line).map_err(|_| PointError::NotUtf8)?;
    let mut fields = line.split_ascii_whitespace();
    let (Some(path), Some(value)) = (fields.next(), fields.next()) else {
        return Err(PointError::FieldCount(line.split_ascii_whitespace().count()));
    };
    let ts = fields.next();
    if fields.next().is_some() {
        return Err(PointError::FieldCount(line.split_ascii_whitespace().count()));
    }
    let value = parse_float(value).ok_or_else(|| PointError::BadValue(value.to_owned()))?;
    if value.is_nan() {
        return Err(PointError::NanValue);
    }
    let t_ms = match ts {
        Some(ts) => parse_float(ts)
            .and_then(|seconds| timestamp_ms(seconds, now_ms))
            .ok_or_else(|| PointError::BadTimestamp(ts.to_owned()))?,
        None => now_ms,
    };
    Ok(RawPoint { path, t_ms, value })
}

/// Whether `line` is blank (skipped, not counted).
pub fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_123_456;

    #[test]
    fn lines_as_carbon_reads_them() {
        let p = parse_line(b"sys.cpu.load 0.5 1700000000", NOW).unwrap();
        assert_eq!((p.path.to_string().as_str(), p.value, p.t_ms), ("sys.cpu.load", 0.5, 1_700_000_000_000));
        let p = parse_line(b"a.b\t\t-1e3   1700000000.25\r", NOW).unwrap();
        assert_eq!((p.value, p.t_ms), (-1000.0, 1_700_000_000_250));
        assert_eq!(parse_line(b"a 1 -1", NOW).unwrap().t_ms, NOW);
        assert_eq!(parse_line(b"a 1", NOW).unwrap().t_ms, NOW);
        assert_eq!(parse_line(b"a inf 1", NOW).unwrap().value, f64::INFINITY);
        let p = parse_line(b"disk.used;host=a;dc=eu 3 1", NOW).unwrap();
        assert_eq!(p.path.to_string(), "disk.used;dc=eu;host=a");
        // The fields alone, the path as sent.
        let raw = parse_fields(b"disk.used;host=a;dc=eu 3 1", NOW).unwrap();
        assert_eq!(raw, RawPoint { path: "disk.used;host=a;dc=eu", t_ms: 1000, value: 3.0 });
        assert_eq!(parse_fields(b"a;b 1 1", NOW).unwrap().path, "a;b");
    }

    #[test]
    fn mistakes_are_named() {
        for (line, want) in [
            (&b"a"[..], "field_count"),
            (b"a 1 2 3", "field_count"),
            (b"a x 1", "bad_value"),
            (b"a nan 1", "nan_value"),
            (b"a 1 later", "bad_timestamp"),
            (b"a 1 1e300", "bad_timestamp"),
            (b"a 1 inf", "bad_timestamp"),
            (b"a;b 1 1", "bad_path"),
            (b"\xff 1 1", "not_utf8"),
        ] {
            let err = parse_line(line, NOW).unwrap_err();
            assert_eq!(err.reason(), want, "{:?}: {err}", String::from_utf8_lossy(line));
        }
        assert!(is_blank(b" \t\r"));
    }
}
