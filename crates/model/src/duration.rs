//! Prometheus duration strings: `[0-9]+(ms|s|m|h|d|w|y)`, several units in decreasing order
//! (`1h30m`), as used by flags, the HTTP API and PromQL.

/// Milliseconds per unit; a year is 365 days, as in Prometheus.
const UNITS: [(&str, i64); 7] = [
    ("y", 365 * 24 * 3600 * 1000),
    ("w", 7 * 24 * 3600 * 1000),
    ("d", 24 * 3600 * 1000),
    ("h", 3600 * 1000),
    ("m", 60 * 1000),
    ("s", 1000),
    ("ms", 1),
];

/// Parses a duration into milliseconds. The error names what is wrong.
pub fn parse_duration_ms(s: &str) -> Result<i64, String> {
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if s == "0" {
        return Ok(0);
    }
    let bad = || format!("invalid duration {s:?}: expected e.g. 15d, 1h30m, 500ms");
    let mut rest = s;
    let mut total: i64 = 0;
    let mut last_unit = usize::MAX;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let n: i64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        // "ms" before "m" so that the longer unit wins.
        let (i, len) = if rest.starts_with("ms") {
            (6, 2)
        } else {
            let i = UNITS.iter().position(|(u, _)| u.len() == 1 && rest.starts_with(u)).ok_or_else(bad)?;
            (i, 1)
        };
        if last_unit != usize::MAX && i <= last_unit {
            return Err(format!("invalid duration {s:?}: units must be in decreasing order, each once"));
        }
        last_unit = i;
        rest = &rest[len..];
        total = n
            .checked_mul(UNITS[i].1)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("duration {s:?} is too long"))?;
    }
    Ok(total)
}

/// Formats milliseconds as a Prometheus duration, largest units first (`90000` → `1m30s`,
/// `0` → `0s`; years and weeks only when whole, so `90d` stays `90d`); `parse_duration_ms` reads it back. Negative durations get a leading `-`.
pub fn format_duration_ms(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    if ms < 0 {
        out.push('-');
    }
    let mut rest = ms.unsigned_abs();
    for (unit, size) in UNITS {
        let size = size as u64;
        // Years and weeks only when they are whole: `90d`, not `12w6d`.
        let whole_only = matches!(unit, "y" | "w");
        if rest >= size && (!whole_only || rest.is_multiple_of(size)) {
            out.push_str(&format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatted_durations_read_back() {
        for ms in
            [1, 999, 1000, 60_000, 90_000, 300_000, 3_600_000, 86_400_000, 90 * 86_400_000, 2 * 365 * 86_400_000 + 1]
        {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms), "{}", format_duration_ms(ms));
        }
        assert_eq!(format_duration_ms(300_000), "5m");
        assert_eq!(format_duration_ms(90_000), "1m30s");
        assert_eq!(format_duration_ms(2 * 365 * 86_400_000), "2y");
        assert_eq!(format_duration_ms(90 * 86_400_000), "90d");
        assert_eq!(format_duration_ms(14 * 86_400_000), "2w");
    }

    #[test]
    fn prometheus_durations() {
        assert_eq!(parse_duration_ms("15d"), Ok(15 * 86_400_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("1m5s10ms"), Ok(65_010));
        assert_eq!(parse_duration_ms("2y"), Ok(2 * 365 * 86_400_000));
        assert_eq!(parse_duration_ms("0"), Ok(0));
        for bad in ["", "5", "h", "1x", "1m1h", "1h1h", "-1h", "1.5h"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(parse_duration_ms("99999999999y").unwrap_err().contains("too long"));
    }
}
