//! Carbon's plaintext protocol: one datapoint per line, `path value timestamp`, fields
//! separated by any run of spaces or tabs (carbon splits on whitespace), `\n` or `\r\n` at the
//! end. A line with only `path value` is taken at the time it arrives, as VictoriaMetrics and
//! go-carbon take it (carbon itself refuses it).

use super::{parse_float, timestamp_ms, CarbonPoint, PointError};
use crate::path::GraphitePath;

/// A line's fields, read and checked except for the path: the ingest path looks the path up
/// among the series it has seen before it pays for the path's own checks (`parse_path`: UTF-8
/// and `GraphitePath::parse`), which a path seen before passed already.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RawPoint<'a> {
    /// The path's bytes as sent, not yet checked.
    pub path: &'a [u8],
    /// Milliseconds since the epoch.
    pub t_ms: i64,
    pub value: f64,
}

impl RawPoint<'_> {
    /// The point with its path checked and parsed.
    pub fn parse_path(&self) -> Result<CarbonPoint, PointError> {
        let path = std::str::from_utf8(self.path).map_err(|_| PointError::NotUtf8)?;
        Ok(CarbonPoint { path: GraphitePath::parse(path)?, t_ms: self.t_ms, value: self.value })
    }

    /// The path for a log line (bytes that are not UTF-8 shown as replacement characters),
    /// checked only if it is written.
    pub fn path_display(&self) -> impl std::fmt::Display + '_ {
        LossyPath(self.path)
    }
}

struct LossyPath<'a>(&'a [u8]);

impl std::fmt::Display for LossyPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from_utf8_lossy(self.0))
    }
}

/// Parses one line (without its `\n`; a trailing `\r` is ignored).
pub fn parse_line(line: &[u8], now_ms: i64) -> Result<CarbonPoint, PointError> {
    parse_fields(line, now_ms)?.parse_path()
}

/// `parse_line` but for the path's checks, which are `RawPoint::parse_path`. Fields are split on
/// runs of ASCII whitespace, as `str::split_ascii_whitespace` splits them. Numbers as senders
/// write them (`42`, `-0.75`, whole seconds) are read by `decimal` and `whole_seconds`; any other
/// form by `parse_float`, Python's rules.
pub fn parse_fields(line: &[u8], now_ms: i64) -> Result<RawPoint<'_>, PointError> {
    let (path, value, ts) = match single_spaced(line) {
        Some((path, value, ts)) => (path, value, Some(ts)),
        None => split_fields(line)?,
    };
    let value = match decimal(value) {
        Some(v) => v,
        None => {
            let text = std::str::from_utf8(value).map_err(|_| PointError::NotUtf8)?;
            parse_float(text).ok_or_else(|| PointError::BadValue(text.to_owned()))?
        }
    };
    if value.is_nan() {
        return Err(PointError::NanValue);
    }
    let t_ms = match ts {
        Some(ts) => match whole_seconds(ts) {
            Some(seconds) => seconds * 1000,
            None => {
                let text = std::str::from_utf8(ts).map_err(|_| PointError::NotUtf8)?;
                parse_float(text)
                    .and_then(|seconds| timestamp_ms(seconds, now_ms))
                    .ok_or_else(|| PointError::BadTimestamp(text.to_owned()))?
            }
        },
        None => now_ms,
    };
    Ok(RawPoint { path, t_ms, value })
}

/// A line's path, value and timestamp (if it has one), as bytes.
type Fields<'a> = (&'a [u8], &'a [u8], Option<&'a [u8]>);

/// The fields of a line split as carbon splits it: on runs of ASCII whitespace, two or three
/// fields.
fn split_fields(line: &[u8]) -> Result<Fields<'_>, PointError> {
    let split = || line.split(u8::is_ascii_whitespace).filter(|f| !f.is_empty());
    let mut fields = split();
    let (Some(path), Some(value)) = (fields.next(), fields.next()) else {
        return Err(PointError::FieldCount(split().count()));
    };
    let ts = fields.next();
    if fields.next().is_some() {
        return Err(PointError::FieldCount(split().count()));
    }
    Ok((path, value, ts))
}

/// The three fields of a line as senders write it, `path value timestamp` with one space
/// between and no other byte at or below a space (but a last `\r`, of senders ending lines
/// with `\r\n`): what `split_fields` gives for such a line, found eight bytes at a time. `None`
/// for any other line (a tab, two spaces, a control byte, two fields), which `split_fields`
/// reads. With `lines`, this took `carbon_parse_bench` from 144-172 to 45-80 ns per line. The
/// short last chunk has a loop of its own: one loop over `chunks(8)` was ~20% slower there.
fn single_spaced(line: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut spaces = [0usize; 2];
    let mut found = 0;
    let mut note = |i: usize, b: u8| {
        if b != b' ' || found == 2 {
            return false;
        }
        spaces[found] = i;
        found += 1;
        true
    };
    let mut words = line.chunks_exact(8);
    for (w, word) in words.by_ref().enumerate() {
        if has_byte_below(u64::from_le_bytes(word.try_into().expect("eight bytes")), 0x21) {
            for (i, &b) in word.iter().enumerate() {
                if b <= b' ' && !note(w * 8 + i, b) {
                    return None;
                }
            }
        }
    }
    let tail_at = line.len() - words.remainder().len();
    for (i, &b) in words.remainder().iter().enumerate() {
        if b <= b' ' && !note(tail_at + i, b) {
            return None;
        }
    }
    let (a, b) = (spaces[0], spaces[1]);
    if found != 2 || a == 0 || b == a + 1 || b + 1 == line.len() {
        return None;
    }
    Some((&line[..a], &line[a + 1..b], &line[b + 1..]))
}

/// Whether a byte of `word` is below `n` (at most 128). Exact: the lowest such byte borrows
/// nothing from below and sets its top bit; with none, no byte borrows and only bytes of
/// 128 or more have a top bit, which `!word` clears.
fn has_byte_below(word: u64, n: u8) -> bool {
    debug_assert!(n <= 128);
    const ONES: u64 = u64::MAX / 255;
    word.wrapping_sub(ONES * u64::from(n)) & !word & (ONES * 128) != 0
}

/// Powers of ten a double holds exactly.
const EXACT_POWERS_OF_TEN: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20,
    1e21, 1e22,
];

/// A plain decimal (`[+-]digits[.digits]`, a digit at least) whose digits, read as one integer,
/// are below 2^53, with at most 22 after the point: that integer and the power of ten are both
/// exact doubles, so one division gives the correctly rounded value, what `str::parse` gives.
/// `None` for any other form (exponents, `inf`, long mantissas), read by `parse_float` instead.
fn decimal(field: &[u8]) -> Option<f64> {
    let (negative, digits) = match field.first()? {
        b'-' => (true, &field[1..]),
        b'+' => (false, &field[1..]),
        _ => (false, field),
    };
    let (mut mantissa, mut seen, mut fraction, mut point) = (0u64, 0usize, 0usize, false);
    for &b in digits {
        match b {
            b'0'..=b'9' => {
                mantissa = mantissa.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
                seen += 1;
                fraction += usize::from(point);
            }
            b'.' if !point => point = true,
            _ => return None,
        }
    }
    if seen == 0 || mantissa >= 1 << 53 || fraction >= EXACT_POWERS_OF_TEN.len() {
        return None;
    }
    let magnitude = mantissa as f64 / EXACT_POWERS_OF_TEN[fraction];
    Some(if negative { -magnitude } else { magnitude })
}

/// A timestamp of whole seconds, digits only, short enough that its milliseconds are exact in
/// a double (below 2^53 / 1000), so that `seconds * 1000` is what `timestamp_ms` computes.
/// `None` for any other form (fractions, `-1`, exponents), read by `parse_float`.
fn whole_seconds(field: &[u8]) -> Option<i64> {
    if field.is_empty() || field.len() > 12 || !field.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(field.iter().fold(0i64, |n, &b| n * 10 + i64::from(b - b'0')))
}

/// The lines of `buf`, split at each `\n` (which they leave out) as `buf.split` on `\n` splits
/// it, a last piece after the last `\n` included; the newlines are found by `memchr`, many
/// bytes at a time (the closure called for every byte it replaces was about a quarter of the
/// carbon reader's own time in `perf`, 1M paths × 10 points).
pub fn lines(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    let mut newlines = memchr::memchr_iter(b'\n', buf);
    std::iter::from_fn(move || {
        if start > buf.len() {
            return None;
        }
        let end = newlines.next().unwrap_or(buf.len());
        let line = &buf[start..end];
        start = end + 1;
        Some(line)
    })
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
        assert_eq!(raw, RawPoint { path: b"disk.used;host=a;dc=eu", t_ms: 1000, value: 3.0 });
        assert_eq!(parse_fields(b"a;b 1 1", NOW).unwrap().path, b"a;b");
        // Lines ending `\r\n` take the eight-byte split too; a `\r` inside a line does not.
        assert_eq!(single_spaced(b"a.b 1 2\r"), Some((&b"a.b"[..], &b"1"[..], &b"2"[..])));
        assert_eq!(parse_fields(b"a.b 1 2\r", NOW).unwrap(), RawPoint { path: b"a.b", t_ms: 2000, value: 1.0 });
        assert_eq!(single_spaced(b"a.b 1\r 2"), None);
        assert_eq!(single_spaced(b"a.b 1 \r"), None);
        // Numbers in the forms the fast readers leave to `parse_float`.
        for (field, want) in [
            ("1e3", 1000.0f64),
            ("+.5", 0.5),
            ("5.", 5.0),
            ("-0", -0.0),
            ("12345678901234567890", 1.2345678901234567e19),
        ] {
            let v = parse_fields(format!("a {field} 1").as_bytes(), NOW).unwrap().value;
            assert_eq!((v, v.is_sign_negative()), (want, want.is_sign_negative()), "{field}");
        }
        assert_eq!(parse_fields(b"a 1 9999999999999", NOW).unwrap().t_ms, 9_999_999_999_999_000);
        assert_eq!(parse_fields(b"a 1 0", NOW).unwrap().t_ms, 0);
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
            (b"a 1\xff 1", "not_utf8"),
            (b"a 1 1\xff", "not_utf8"),
            (b"a 1.2.3 1", "bad_value"),
            (b"a . 1", "bad_value"),
            (b"a - 1", "bad_value"),
        ] {
            let err = parse_line(line, NOW).unwrap_err();
            assert_eq!(err.reason(), want, "{:?}: {err}", String::from_utf8_lossy(line));
        }
        assert!(is_blank(b" \t\r"));
    }

    proptest::proptest! {
        /// Decimals as senders write them read as `str::parse` (Python's `float()`) reads them,
        /// bit for bit, fast path or not.
        #[test]
        fn decimals_read_as_the_standard_parser_reads_them(
            sign in proptest::sample::select(vec!["", "-", "+"]),
            whole in "[0-9]{0,20}",
            fraction in proptest::option::of("[0-9]{0,25}"),
        ) {
            let field = format!("{sign}{whole}{}", fraction.as_ref().map_or(String::new(), |f| format!(".{f}")));
            proptest::prop_assume!(!field.is_empty(), "an empty field is no field");
            let want = field.parse::<f64>().ok();
            let got = parse_fields(format!("a {field} 1").as_bytes(), NOW).ok().map(|p| p.value);
            proptest::prop_assert_eq!(got.map(f64::to_bits), want.map(f64::to_bits), "{}", field);
        }

        /// A line the eight-byte splitter reads is split as the general split splits it, and a
        /// line it leaves is one the general split reads otherwise (not three single-spaced
        /// fields). Lines drawn from bytes that matter: spaces, tabs, `\r`, other bytes at or
        /// below a space, bytes above 127, and ordinary ones, of lengths around the words.
        #[test]
        fn single_spaced_lines_split_as_carbon_splits_them(
            line in proptest::collection::vec(
                proptest::prop_oneof![
                    12 => proptest::sample::select(vec![b'a', b'.', b'1', b'9', b';', b'=', 0x21, 0x7f, 0x80, 0xff]),
                    3 => proptest::strategy::Just(b' '),
                    1 => proptest::sample::select(vec![b'\t', b'\r', b'\n', 0x0b, 0x0c, 0x01, 0x00]),
                ],
                0..40,
            ),
        ) {
            let general = split_fields(&line).ok();
            match single_spaced(&line) {
                Some((path, value, ts)) => proptest::prop_assert_eq!(general, Some((path, value, Some(ts)))),
                None => {
                    let text = line.strip_suffix(b"\r").unwrap_or(&line);
                    let three_single = text.iter().filter(|b| b.is_ascii_whitespace()).count() == 2
                        && general.is_some_and(|(_, _, ts)| ts.is_some())
                        && !text.iter().any(|&b| b < b' ')
                        && text.windows(2).all(|w| w != b"  ");
                    proptest::prop_assert!(!three_single, "left a single-spaced line: {:?}", line);
                }
            }
        }

        /// `lines` splits as `split` on `\n` splits.
        #[test]
        fn lines_split_at_newlines(buf in proptest::collection::vec(proptest::sample::select(vec![b'\n', b'a', b' ']), 0..200)) {
            let want: Vec<&[u8]> = buf.split(|&b| b == b'\n').collect();
            proptest::prop_assert_eq!(lines(&buf).collect::<Vec<_>>(), want);
        }

        /// `has_byte_below` says what a byte-by-byte look says.
        #[test]
        fn bytes_below_found_in_a_word(word in proptest::num::u64::ANY, n in 0u8..=128, at in 0usize..8, byte in proptest::num::u8::ANY) {
            let mut bytes = word.to_le_bytes();
            bytes[at] = byte;
            let word = u64::from_le_bytes(bytes);
            proptest::prop_assert_eq!(has_byte_below(word, n), bytes.iter().any(|&b| b < n));
        }

        /// Whole seconds give what the float reading gives.
        #[test]
        fn whole_seconds_read_as_the_float_reading_reads_them(seconds in "[0-9]{1,16}") {
            let want = parse_float(&seconds).and_then(|s| timestamp_ms(s, NOW));
            let got = parse_fields(format!("a 1 {seconds}").as_bytes(), NOW).ok().map(|p| p.t_ms);
            proptest::prop_assert_eq!(got, want, "{}", seconds);
        }
    }
}
