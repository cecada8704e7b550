//! Time and duration parameters of Prometheus' HTTP API: a time is float Unix seconds or RFC 3339;
//! a duration (`step`, `timeout`) is float seconds or a Prometheus duration (`5m`).

use strata_model::parse_duration_ms;

/// Milliseconds since the epoch from `1435781451.781` or `2015-07-01T20:10:51.781Z`
/// (any offset). Errors name the input.
pub fn parse_time_ms(s: &str) -> Result<i64, String> {
    if let Ok(f) = s.parse::<f64>() {
        if !f.is_finite() || f.abs() > 9.2e15 {
            return Err(format!("cannot parse {s:?} to a valid timestamp: out of range"));
        }
        return Ok((f * 1000.0).round() as i64);
    }
    parse_rfc3339_ms(s).ok_or_else(|| format!("cannot parse {s:?} to a valid timestamp"))
}

/// Milliseconds from `1.5` (seconds) or `1m30s`; must be positive.
pub fn parse_duration_param_ms(s: &str) -> Result<i64, String> {
    let ms = match s.parse::<f64>() {
        Ok(f) if f.is_finite() && f.abs() < 9.2e15 => (f * 1000.0).round() as i64,
        Ok(_) => return Err(format!("cannot parse {s:?} to a valid duration: out of range")),
        Err(_) => parse_duration_ms(s).map_err(|e| format!("cannot parse {s:?} to a valid duration: {e}"))?,
    };
    Ok(ms)
}

fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes().all(|c| c.is_ascii_digit()).then(|| t.parse().ok())?
    };
    let (y, mo, d, h, mi, sec) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut pos = 19;
    let mut ms = 0i64;
    if b.get(pos) == Some(&b'.') {
        let start = pos + 1;
        pos = start;
        while pos < b.len() && b[pos].is_ascii_digit() {
            pos += 1;
        }
        if pos == start {
            return None;
        }
        let frac = &s[start..pos.min(start + 3)];
        ms = frac.parse::<i64>().ok()? * 10i64.pow(3 - frac.len() as u32);
    }
    let offset_min = match b.get(pos)? {
        b'Z' | b'z' if pos + 1 == b.len() => 0,
        c @ (b'+' | b'-') if pos + 6 == b.len() && b[pos + 3] == b':' => {
            let v = num(pos + 1..pos + 3)? * 60 + num(pos + 4..pos + 6)?;
            if *c == b'+' {
                v
            } else {
                -v
            }
        }
        _ => return None,
    };
    let days = strata_model::civil::days_from_civil(y, mo as u32, d as u32);
    Some(((days * 86_400 + h * 3600 + mi * 60 + sec - offset_min * 60) * 1000) + ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::format_ms;

    #[test]
    fn times_like_prometheus() {
        assert_eq!(parse_time_ms("1435781451.781"), Ok(1_435_781_451_781));
        assert_eq!(parse_time_ms("1435781451"), Ok(1_435_781_451_000));
        assert_eq!(parse_time_ms("2015-07-01T20:10:51.781Z"), Ok(1_435_781_451_781));
        assert_eq!(parse_time_ms("2015-07-01T22:10:51.781+02:00"), Ok(1_435_781_451_781));
        assert_eq!(parse_time_ms("2015-07-01T20:10:51Z"), Ok(1_435_781_451_000));
        assert_eq!(parse_time_ms("1969-12-31T23:59:59Z"), Ok(-1000));
        for bad in ["", "yesterday", "2015-13-01T00:00:00Z", "2015-07-01T20:10:51", "NaN", "1e300"] {
            assert!(parse_time_ms(bad).is_err(), "{bad:?}");
        }
        // Round trip with the status formatter over a range of dates.
        for ms in [0, 951_782_400_123, 4_102_444_800_000, -62_135_596_800_000] {
            assert_eq!(parse_time_ms(&format_ms(ms)), Ok(ms), "{}", format_ms(ms));
        }
    }

    #[test]
    fn durations_like_prometheus() {
        assert_eq!(parse_duration_param_ms("15"), Ok(15_000));
        assert_eq!(parse_duration_param_ms("0.5"), Ok(500));
        assert_eq!(parse_duration_param_ms("1m30s"), Ok(90_000));
        assert!(parse_duration_param_ms("1x").unwrap_err().contains("\"1x\""));
    }
}
