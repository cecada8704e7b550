//! Graphite's time syntax for `from` and `until` (graphite-web's `parseATTime`), in UTC:
//! epoch seconds (`1700000000`), a reference and an offset (`now-2d`, `-1h`, `today+6h`,
//! `yesterday`, `midnight`, `noon`), an absolute time `HH:MM_YYYYMMDD` or a date `YYYYMMDD`.
//! Offset units as graphite-web reads them: `s`, `min` (or `m`), `h`, `d`, `w`, `mon` (30 days),
//! `y` (365 days), several in a row (`-1d12h`).

const DAY: i64 = 86_400;

/// Seconds of a unit, by graphite-web's prefixes (`mon` before `m`).
fn unit_seconds(unit: &str) -> Option<i64> {
    Some(if unit.starts_with('s') {
        1
    } else if unit.starts_with("min") {
        60
    } else if unit.starts_with('h') {
        3600
    } else if unit.starts_with('d') {
        DAY
    } else if unit.starts_with('w') {
        7 * DAY
    } else if unit.starts_with("mon") {
        30 * DAY
    } else if unit.starts_with('m') {
        60
    } else if unit.starts_with('y') {
        365 * DAY
    } else {
        return None;
    })
}

/// Days since the epoch of a civil date, and back (Howard Hinnant's algorithms).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYYMMDD` to the epoch second of its midnight.
fn date(s: &str) -> Option<i64> {
    if s.len() != 8 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (y, m, d) = (s[..4].parse().ok()?, s[4..6].parse().ok()?, s[6..].parse().ok()?);
    ((1..=12).contains(&m) && (1..=31).contains(&d)).then(|| days_from_civil(y, m, d) * DAY)
}

/// `HH:MM` to seconds into the day.
fn clock(s: &str) -> Option<i64> {
    let (h, m) = s.split_once(':')?;
    let (h, m): (i64, i64) = (h.parse().ok()?, m.parse().ok()?);
    ((0..24).contains(&h) && (0..60).contains(&m)).then_some(h * 3600 + m * 60)
}

fn reference(r: &str, now: i64) -> Option<i64> {
    let midnight = now - now.rem_euclid(DAY);
    Some(match r {
        "" | "now" => now,
        "today" | "midnight" => midnight,
        "yesterday" => midnight - DAY,
        "tomorrow" => midnight + DAY,
        "noon" => midnight + 12 * 3600,
        _ => {
            if let Some(d) = date(r) {
                d
            } else {
                midnight + clock(r)?
            }
        }
    })
}

fn offset(s: &str) -> Option<i64> {
    if s.is_empty() {
        return Some(0);
    }
    let (sign, mut rest) = match s.as_bytes()[0] {
        b'-' => (-1, &s[1..]),
        b'+' => (1, &s[1..]),
        _ => return None,
    };
    let mut total = 0i64;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let letters = rest.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(rest.len());
        let unit = unit_seconds(&rest[..letters])?;
        rest = &rest[letters..];
        total = total.checked_add(n.checked_mul(unit)?)?;
    }
    Some(sign * total)
}

/// Parses `s` at `now` (epoch seconds); `None` names nothing, the caller says which parameter.
pub fn parse_at_time(s: &str, now: i64) -> Option<i64> {
    let s: String = s.trim().to_ascii_lowercase().chars().filter(|c| !matches!(c, '_' | ',' | ' ')).collect();
    if s.is_empty() {
        return None;
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        // Eight digits that read as a date are a date, as for graphite-web.
        if let Some(d) = date(&s).filter(|_| s[..4].parse::<i64>().is_ok_and(|y| y > 1900)) {
            return Some(d);
        }
        return s.parse().ok();
    }
    if s.contains(':') && s.len() == 13 {
        return Some(date(&s[5..])? + clock(&s[..5])?);
    }
    let at = s.find(['+', '-']).unwrap_or(s.len());
    let (r, o) = s.split_at(at);
    reference(r, now)?.checked_add(offset(o)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2023-11-14 22:13:20 UTC.
    const NOW: i64 = 1_700_000_000;

    #[test]
    fn graphite_time_syntax() {
        assert_eq!(parse_at_time("1699990000", NOW), Some(1_699_990_000));
        assert_eq!(parse_at_time("-1h", NOW), Some(NOW - 3600));
        assert_eq!(parse_at_time("now-2d", NOW), Some(NOW - 2 * DAY));
        assert_eq!(parse_at_time("-1d12h", NOW), Some(NOW - DAY - 12 * 3600));
        assert_eq!(parse_at_time("-5min", NOW), Some(NOW - 300));
        assert_eq!(parse_at_time("-5m", NOW), Some(NOW - 300));
        assert_eq!(parse_at_time("-1mon", NOW), Some(NOW - 30 * DAY));
        assert_eq!(parse_at_time("-1y", NOW), Some(NOW - 365 * DAY));
        assert_eq!(parse_at_time("now", NOW), Some(NOW));
        assert_eq!(parse_at_time("today", NOW), Some(1_699_920_000));
        assert_eq!(parse_at_time("yesterday", NOW), Some(1_699_920_000 - DAY));
        assert_eq!(parse_at_time("20231114", NOW), Some(1_699_920_000));
        assert_eq!(parse_at_time("22:13_20231114", NOW), Some(NOW - 20));
        assert_eq!(parse_at_time("today+6h", NOW), Some(1_699_920_000 + 6 * 3600));
    }

    #[test]
    fn nonsense_is_refused() {
        for bad in ["", "later", "-1q", "25:00_20231114", "-h"] {
            assert_eq!(parse_at_time(bad, NOW), None, "{bad:?}");
        }
    }
}
