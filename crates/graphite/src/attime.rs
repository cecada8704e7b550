//! Graphite's time syntax for `from` and `until` (graphite-web's `parseATTime`): epoch seconds
//! (`1700000000`), a reference and an offset (`now-2d`, `-1h`, `today+6h`, `yesterday`,
//! `midnight`, `noon`), an absolute time `HH:MM_YYYYMMDD` or a date `YYYYMMDD`. Offset units as
//! graphite-web reads them: `s`, `min` (or `m`), `h`, `d`, `w`, `mon` (30 days), `y` (365 days),
//! several in a row (`-1d12h`). Days, dates and clock times are read in a time zone (the
//! request's `tz`, else the server's), as graphite-web reads them in its `TIME_ZONE`.

use jiff::civil::Date;
pub use jiff::tz::TimeZone;

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

/// `YYYYMMDD` as a date.
fn date(s: &str) -> Option<Date> {
    if s.len() != 8 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Date::new(s[..4].parse().ok()?, s[4..6].parse().ok()?, s[6..].parse().ok()?).ok()
}

/// `HH:MM` as hour and minute.
fn clock(s: &str) -> Option<(i8, i8)> {
    let (h, m) = s.split_once(':')?;
    let (h, m): (i8, i8) = (h.parse().ok()?, m.parse().ok()?);
    ((0..24).contains(&h) && (0..60).contains(&m)).then_some((h, m))
}

/// The epoch second of `hour:minute` on `day` in `tz` (a time a DST change skips is taken
/// after the change, as Python's datetimes take it).
fn local(tz: &TimeZone, day: Date, (hour, minute): (i8, i8)) -> Option<i64> {
    Some(day.at(hour, minute, 0, 0).to_zoned(tz.clone()).ok()?.timestamp().as_second())
}

fn reference(r: &str, now: i64, tz: &TimeZone) -> Option<i64> {
    let today = jiff::Timestamp::from_second(now).ok()?.to_zoned(tz.clone()).date();
    match r {
        "" | "now" => Some(now),
        "today" | "midnight" => local(tz, today, (0, 0)),
        "yesterday" => local(tz, today.yesterday().ok()?, (0, 0)),
        "tomorrow" => local(tz, today.tomorrow().ok()?, (0, 0)),
        "noon" => local(tz, today, (12, 0)),
        _ => match date(r) {
            Some(d) => local(tz, d, (0, 0)),
            None => local(tz, today, clock(r)?),
        },
    }
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

/// Parses `s` at `now` (epoch seconds), reading days and clock times in `tz`; `None` names
/// nothing, the caller says which parameter.
pub fn parse_at_time(s: &str, now: i64, tz: &TimeZone) -> Option<i64> {
    let s: String = s.trim().to_ascii_lowercase().chars().filter(|c| !matches!(c, '_' | ',' | ' ')).collect();
    if s.is_empty() {
        return None;
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        // Eight digits that read as a date are a date, as for graphite-web.
        if let Some(d) = date(&s).filter(|d| d.year() > 1900) {
            return local(tz, d, (0, 0));
        }
        return s.parse().ok();
    }
    if s.contains(':') && s.len() == 13 {
        return local(tz, date(&s[5..])?, clock(&s[..5])?);
    }
    let at = s.find(['+', '-']).unwrap_or(s.len());
    let (r, o) = s.split_at(at);
    reference(r, now, tz)?.checked_add(offset(o)?)
}

/// A time zone by its IANA name (`Europe/Berlin`, `UTC`), for `tz` and the server's default.
pub fn time_zone(name: &str) -> Result<TimeZone, String> {
    TimeZone::get(name).map_err(|e| format!("unknown time zone {name:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2023-11-14 22:13:20 UTC.
    const NOW: i64 = 1_700_000_000;

    fn parse_utc(s: &str, now: i64) -> Option<i64> {
        parse_at_time(s, now, &TimeZone::UTC)
    }

    #[test]
    fn graphite_time_syntax() {
        assert_eq!(parse_utc("1699990000", NOW), Some(1_699_990_000));
        assert_eq!(parse_utc("-1h", NOW), Some(NOW - 3600));
        assert_eq!(parse_utc("now-2d", NOW), Some(NOW - 2 * DAY));
        assert_eq!(parse_utc("-1d12h", NOW), Some(NOW - DAY - 12 * 3600));
        assert_eq!(parse_utc("-5min", NOW), Some(NOW - 300));
        assert_eq!(parse_utc("-5m", NOW), Some(NOW - 300));
        assert_eq!(parse_utc("-1mon", NOW), Some(NOW - 30 * DAY));
        assert_eq!(parse_utc("-1y", NOW), Some(NOW - 365 * DAY));
        assert_eq!(parse_utc("now", NOW), Some(NOW));
        assert_eq!(parse_utc("today", NOW), Some(1_699_920_000));
        assert_eq!(parse_utc("yesterday", NOW), Some(1_699_920_000 - DAY));
        assert_eq!(parse_utc("20231114", NOW), Some(1_699_920_000));
        assert_eq!(parse_utc("22:13_20231114", NOW), Some(NOW - 20));
        assert_eq!(parse_utc("today+6h", NOW), Some(1_699_920_000 + 6 * 3600));
    }

    #[test]
    fn days_and_clock_times_are_read_in_the_time_zone() {
        let berlin = time_zone("Europe/Berlin").unwrap();
        // 2023-11-14 23:13:20 in Berlin (UTC+1): its midnight was an hour before UTC's.
        assert_eq!(parse_at_time("today", NOW, &berlin), Some(1_699_920_000 - 3600));
        assert_eq!(parse_at_time("22:13_20231114", NOW, &berlin), Some(NOW - 20 - 3600));
        assert_eq!(parse_at_time("20231114", NOW, &berlin), Some(1_699_920_000 - 3600));
        // Summer time: UTC+2.
        assert_eq!(parse_at_time("12:00_20230701", NOW, &berlin), Some(1_688_205_600));
        // An hour later in UTC, Berlin is already on the 15th.
        assert_eq!(parse_at_time("today", NOW + 3600, &berlin), Some(1_699_920_000 + 23 * 3600));
        // Relative times and epoch seconds know no zone.
        assert_eq!(parse_at_time("-1h", NOW, &berlin), Some(NOW - 3600));
        assert_eq!(parse_at_time("1699990000", NOW, &berlin), Some(1_699_990_000));
        assert!(time_zone("Mars/Olympus").unwrap_err().contains("Mars/Olympus"));
    }

    #[test]
    fn nonsense_is_refused() {
        for bad in ["", "later", "-1q", "25:00_20231114", "-h"] {
            assert_eq!(parse_utc(bad, NOW), None, "{bad:?}");
        }
    }
}
