//! Carbon's plaintext protocol: one datapoint per line, `path value timestamp`, fields
//! separated by any run of spaces or tabs (carbon splits on whitespace), `\n` or `\r\n` at the
//! end. A line with only `path value` is taken at the time it arrives, as VictoriaMetrics and
//! go-carbon take it (carbon itself refuses it).

use super::{parse_float, point, CarbonPoint, PointError};

/// Parses one line (without its `\n`; a trailing `\r` is ignored).
pub fn parse_line(line: &[u8], now_ms: i64) -> Result<CarbonPoint, PointError> {
    let line = std::str::from_utf8(line).map_err(|_| PointError::NotUtf8)?;
    let mut fields = line.split_ascii_whitespace();
    let (Some(path), Some(value)) = (fields.next(), fields.next()) else {
        return Err(PointError::FieldCount(line.split_ascii_whitespace().count()));
    };
    let ts = fields.next();
    if fields.next().is_some() {
        return Err(PointError::FieldCount(line.split_ascii_whitespace().count()));
    }
    let v = parse_float(value).ok_or_else(|| PointError::BadValue(value.to_owned()))?;
    match ts {
        Some(ts) => {
            let seconds = parse_float(ts).ok_or_else(|| PointError::BadTimestamp(ts.to_owned()))?;
            point(path, v, seconds, ts, now_ms)
        }
        None => point(path, v, -1.0, "", now_ms),
    }
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
