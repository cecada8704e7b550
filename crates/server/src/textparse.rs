//! Parser for the Prometheus text exposition format (0.0.4) and OpenMetrics text (1.0): what
//! targets serve, what `/api/v1/import/prometheus` and `strata tsdb import` read.
//!
//! The two differ where it matters for storage: OpenMetrics timestamps are seconds (with a
//! fraction), Prometheus' are integer milliseconds; OpenMetrics ends with `# EOF` and may carry
//! an exemplar after a sample's ` # ` (`Parser::exemplar` reads it). Label values are unescaped (`\\`, `\"`, `\n`);
//! quoted metric and label names (UTF-8 names, `{"my.metric", "a.b"="c"}`) are accepted.

use strata_model::{Label, Labels, LabelsError, METRIC_NAME};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Prometheus,
    OpenMetrics,
}

/// Metric family type from `# TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    Summary,
    Info,
    StateSet,
    Unknown,
}

impl MetricType {
    /// The name `# TYPE` and `/api/v1/metadata` use.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::GaugeHistogram => "gaugehistogram",
            MetricType::Summary => "summary",
            MetricType::Info => "info",
            MetricType::StateSet => "stateset",
            MetricType::Unknown => "unknown",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "counter" => MetricType::Counter,
            "gauge" => MetricType::Gauge,
            "histogram" => MetricType::Histogram,
            "gaugehistogram" => MetricType::GaugeHistogram,
            "summary" => MetricType::Summary,
            "info" => MetricType::Info,
            "stateset" => MetricType::StateSet,
            "unknown" | "untyped" => MetricType::Unknown,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Sample { labels: Labels, value: f64, timestamp_ms: Option<i64> },
    Type { family: String, kind: MetricType },
    Help { family: String, text: String },
    Unit { family: String, unit: String },
    Eof,
}

/// A line that cannot be parsed, with its 1-based number.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// Parses `text` line by line.
#[derive(Debug)]
pub struct Parser<'a> {
    lines: std::str::Lines<'a>,
    line: usize,
    format: Format,
    /// `# EOF` seen.
    done: bool,
    /// The iterator has returned its last item.
    finished: bool,
}

impl<'a> Parser<'a> {
    pub fn new(text: &'a str, format: Format) -> Self {
        Parser { lines: text.lines(), line: 0, format, done: false, finished: false }
    }

    fn err(&self, message: impl Into<String>) -> ParseError {
        ParseError { line: self.line, message: message.into() }
    }

    fn comment<'l>(&self, rest: &'l str) -> Result<Option<RawEntry<'l>>, ParseError> {
        let rest = rest.trim_start();
        if self.format == Format::OpenMetrics && rest == "EOF" {
            return Ok(Some(RawEntry::Eof));
        }
        let mut parts = rest.splitn(3, ' ');
        let (kw, family, arg) = (parts.next().unwrap_or(""), parts.next(), parts.next());
        let Some(family) = family else { return Ok(None) };
        match kw {
            "TYPE" => {
                let t = arg.unwrap_or("").trim();
                let kind = MetricType::parse(t).ok_or_else(|| self.err(format!("unknown metric type {t:?}")))?;
                Ok(Some(RawEntry::Type { family, kind }))
            }
            "HELP" => Ok(Some(RawEntry::Help { family, text: unescape_help(arg.unwrap_or("")) })),
            "UNIT" => Ok(Some(RawEntry::Unit { family, unit: arg.unwrap_or("").trim() })),
            _ => Ok(None),
        }
    }

    /// Splits a sample line into its series text (name and labels, as written) and the parsed
    /// value and timestamp, without building labels: a scraper keys its cache by the series
    /// text and parses labels only for series it has not seen (`series_labels`).
    /// The exemplar text (after ` # `) is returned unparsed, for `exemplar`.
    #[allow(clippy::type_complexity, reason = "a private tuple of the line's parts")]
    fn split_sample<'l>(&self, line: &'l str) -> Result<(&'l str, f64, Option<i64>, Option<&'l str>), ParseError> {
        let end = series_end(line).map_err(|m| self.err(m))?;
        let (series, tail) = line.split_at(end);
        let mut c = Cursor { s: tail, pos: 0 };
        if !c.skip_spaces() {
            return Err(self.err(format!("expected a space before the value at column {}", end + 1)));
        }
        let value_str = c.token();
        let value = parse_float(value_str).ok_or_else(|| self.err(format!("invalid value {value_str:?}")))?;
        c.skip_spaces();
        let mut timestamp_ms = None;
        let rest = c.rest();
        if !rest.is_empty() && !rest.starts_with('#') {
            let ts = c.token();
            timestamp_ms = Some(self.timestamp(ts)?);
            c.skip_spaces();
            let rest = c.rest();
            let exemplar = self.format == Format::OpenMetrics && rest.starts_with('#');
            if !rest.is_empty() && !exemplar {
                return Err(self.err(format!("unexpected text after the timestamp: {rest:?}")));
            }
        }
        let rest = c.rest();
        let exemplar = match rest.strip_prefix('#') {
            Some(e) if self.format == Format::OpenMetrics => Some(e.trim()),
            Some(_) => return Err(self.err(format!("unexpected text after the value: {rest:?}"))),
            None => None,
        };
        Ok((series, value, timestamp_ms, exemplar))
    }

    /// A sample's or exemplar's timestamp in milliseconds: integer milliseconds in Prometheus'
    /// format, seconds with a fraction in OpenMetrics.
    fn timestamp(&self, ts: &str) -> Result<i64, ParseError> {
        Ok(match self.format {
            Format::Prometheus => ts.parse::<i64>().map_err(|_| self.err(format!("invalid timestamp {ts:?}")))?,
            Format::OpenMetrics => {
                let secs = parse_float(ts)
                    .filter(|s| s.is_finite())
                    .ok_or_else(|| self.err(format!("invalid timestamp {ts:?}")))?;
                let ms = (secs * 1000.0).round();
                if ms.abs() > 9.0e15 {
                    return Err(self.err(format!("timestamp {ts:?} is out of range")));
                }
                ms as i64
            }
        })
    }

    /// An OpenMetrics exemplar, the text after a sample's ` # `: `{labels} value [timestamp]`
    /// (timestamp in seconds). Label names as in a series, no metric name.
    pub fn exemplar(&self, text: &str) -> Result<(Labels, f64, Option<i64>), ParseError> {
        let mut c = Cursor { s: text, pos: 0 };
        if !c.eat('{') {
            return Err(self.err(format!("exemplar: expected '{{' in {text:?}")));
        }
        let mut labels: Vec<Label> = Vec::new();
        loop {
            c.skip_spaces();
            if c.eat('}') {
                break;
            }
            let key = if c.peek() == Some('"') {
                c.quoted().map_err(|m| self.err(format!("exemplar: {m}")))?
            } else {
                c.name().ok_or_else(|| self.err(format!("exemplar: expected a label name in {text:?}")))?.to_owned()
            };
            c.skip_spaces();
            if !c.eat('=') {
                return Err(self.err(format!("exemplar: label {key:?}: expected '='")));
            }
            c.skip_spaces();
            if c.peek() != Some('"') {
                return Err(self.err(format!("exemplar: label {key:?}: expected a quoted value")));
            }
            let value = c.quoted().map_err(|m| self.err(format!("exemplar: {m}")))?;
            labels.push(Label::new(key, value));
            c.skip_spaces();
            if c.eat(',') {
                continue;
            }
            if c.eat('}') {
                break;
            }
            return Err(self.err(format!("exemplar: expected ',' or '}}' in {text:?}")));
        }
        let labels = Labels::try_from_pairs(labels.into_iter().map(|l| (l.name, l.value)))
            .map_err(|e: LabelsError| self.err(format!("exemplar: {e}")))?;
        if !c.skip_spaces() {
            return Err(self.err(format!("exemplar: expected a space before the value in {text:?}")));
        }
        let v = c.token();
        let value = parse_float(v).ok_or_else(|| self.err(format!("exemplar: invalid value {v:?}")))?;
        c.skip_spaces();
        let ts = c.token();
        let timestamp_ms = if ts.is_empty() { None } else { Some(self.timestamp(ts)?) };
        c.skip_spaces();
        if !c.rest().is_empty() {
            return Err(self.err(format!("exemplar: unexpected text {:?}", c.rest())));
        }
        Ok((labels, value, timestamp_ms))
    }

    /// The label set of a series text that `parse_line_raw` returned (on the same line, so that
    /// an error carries its number).
    pub fn series_labels(&self, series: &str) -> Result<Labels, ParseError> {
        let mut c = Cursor { s: series, pos: 0 };
        let mut labels: Vec<Label> = Vec::new();
        let mut name: Option<String> = None;
        if c.peek() != Some('{') {
            name = Some(c.name().ok_or_else(|| self.err("expected a metric name"))?.to_owned());
        }
        if c.eat('{') {
            loop {
                c.skip_spaces();
                if c.eat('}') {
                    break;
                }
                let key = if c.peek() == Some('"') {
                    c.quoted().map_err(|m| self.err(m))?
                } else {
                    c.name()
                        .ok_or_else(|| self.err(format!("expected a label name at column {}", c.pos + 1)))?
                        .to_owned()
                };
                c.skip_spaces();
                if c.eat('=') {
                    c.skip_spaces();
                    if c.peek() != Some('"') {
                        return Err(self.err(format!("label {key:?}: expected a quoted value")));
                    }
                    let value = c.quoted().map_err(|m| self.err(m))?;
                    labels.push(Label::new(key, value));
                } else if name.is_none() {
                    // `{"metric.name", …}`: a quoted name alone is the metric name.
                    name = Some(key);
                } else {
                    return Err(self.err(format!("label {key:?}: expected '='")));
                }
                c.skip_spaces();
                if c.eat(',') {
                    continue;
                }
                if c.eat('}') {
                    break;
                }
                return Err(self.err(format!("expected ',' or '}}' at column {}", c.pos + 1)));
            }
        }
        if !c.rest().is_empty() {
            return Err(self.err(format!("expected a space before the value at column {}", c.pos + 1)));
        }
        let name = name.ok_or_else(|| self.err("missing metric name"))?;
        if labels.iter().any(|l| &*l.name == METRIC_NAME) {
            return Err(self.err("label __name__ given besides the metric name"));
        }
        labels.push(Label::new(METRIC_NAME, name));
        Labels::try_from_pairs(labels.into_iter().map(|l| (l.name, l.value)))
            .map_err(|e: LabelsError| self.err(e.to_string()))
    }
}

/// Where the series text of a sample line ends: after the name, or after the `{…}` that
/// follows it (quoted strings skipped, so a `}` or space inside a label value does not end it).
fn series_end(line: &str) -> Result<usize, String> {
    let b = line.as_bytes();
    let mut i = memchr::memchr3(b' ', b'\t', b'{', b).unwrap_or(b.len());
    if i < b.len() && b[i] == b'{' {
        i += 1;
        loop {
            let j = memchr::memchr2(b'"', b'}', &b[i..]).ok_or("expected ',' or '}' before the end of the line")?;
            i += j;
            if b[i] == b'}' {
                return Ok(i + 1);
            }
            let start = i;
            i += 1;
            loop {
                let unterminated = || format!("unterminated quoted string starting at column {}", start + 1);
                let j = memchr::memchr2(b'\\', b'"', b.get(i..).ok_or_else(unterminated)?).ok_or_else(unterminated)?;
                i += j;
                if b[i] == b'"' {
                    i += 1;
                    break;
                }
                i += 2; // an escape and the byte it escapes
            }
        }
    }
    Ok(i)
}

/// One line as `Parser::parse_line_raw` returns it: borrowed from the line (nothing is
/// allocated for a scraper's steady state), samples with their series text unparsed.
#[derive(Clone, Debug, PartialEq)]
pub enum RawEntry<'l> {
    /// `exemplar`: the text after ` # ` (OpenMetrics), for `Parser::exemplar`.
    Sample {
        series: &'l str,
        value: f64,
        timestamp_ms: Option<i64>,
        exemplar: Option<&'l str>,
    },
    Type {
        family: &'l str,
        kind: MetricType,
    },
    Help {
        family: &'l str,
        text: std::borrow::Cow<'l, str>,
    },
    Unit {
        family: &'l str,
        unit: &'l str,
    },
    Eof,
}

impl Parser<'_> {
    /// Parses one line (the caller numbers lines by calling in order): `None` for blank lines
    /// and plain comments.
    pub fn parse_line(&mut self, line: &str) -> Option<Result<Entry, ParseError>> {
        let raw = match self.parse_line_raw(line)? {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        Some(match raw {
            RawEntry::Sample { series, value, timestamp_ms, .. } => {
                self.series_labels(series).map(|labels| Entry::Sample { labels, value, timestamp_ms })
            }
            RawEntry::Type { family, kind } => Ok(Entry::Type { family: family.to_owned(), kind }),
            RawEntry::Help { family, text } => Ok(Entry::Help { family: family.to_owned(), text: text.into_owned() }),
            RawEntry::Unit { family, unit } => Ok(Entry::Unit { family: family.to_owned(), unit: unit.to_owned() }),
            RawEntry::Eof => Ok(Entry::Eof),
        })
    }

    /// Counts a line the caller handles itself (a scraper skips unchanged comment lines), so
    /// that later errors still carry the right line number.
    pub fn skip_line(&mut self) {
        self.line += 1;
    }

    /// The number of the line parsed (or skipped) last.
    pub fn line_number(&self) -> usize {
        self.line
    }

    /// Parses a comment line (`# HELP`, `# TYPE`, `# UNIT`) given with its line number; `None`
    /// for a plain comment. The line is not counted.
    pub fn parse_comment<'l>(&self, line_number: usize, line: &'l str) -> Result<Option<RawEntry<'l>>, ParseError> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let rest =
            line.strip_prefix('#').ok_or_else(|| ParseError { line: line_number, message: "not a comment".into() })?;
        self.comment(rest).map_err(|e| ParseError { line: line_number, message: e.message })
    }

    /// `parse_line`, with a sample's labels left as written (see `split_sample`).
    pub fn parse_line_raw<'l>(&mut self, line: &'l str) -> Option<Result<RawEntry<'l>, ParseError>> {
        self.line += 1;
        if self.done {
            return Some(Err(self.err("text after # EOF")));
        }
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            return None;
        }
        match line.strip_prefix('#') {
            Some(rest) => match self.comment(rest) {
                Ok(None) => None,
                Ok(Some(RawEntry::Eof)) => {
                    self.done = true;
                    Some(Ok(RawEntry::Eof))
                }
                other => other.transpose(),
            },
            None => Some(self.split_sample(line.trim_start()).map(|(series, value, timestamp_ms, exemplar)| {
                RawEntry::Sample { series, value, timestamp_ms, exemplar }
            })),
        }
    }

    /// Call after the last line: an OpenMetrics text must have ended with `# EOF`.
    pub fn finish(&self) -> Result<(), ParseError> {
        if self.format == Format::OpenMetrics && !self.done {
            // The last line (line 1 of an empty text).
            return Err(ParseError { line: self.line.max(1), message: "missing # EOF at the end".into() });
        }
        Ok(())
    }
}

impl Iterator for Parser<'_> {
    type Item = Result<Entry, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.finished {
                return None;
            }
            let Some(line) = self.lines.next() else {
                self.finished = true;
                return self.finish().err().map(Err);
            };
            if let Some(res) = self.parse_line(line) {
                if res.is_err() {
                    self.finished = true;
                }
                return Some(res);
            }
        }
    }
}

/// HELP text with `\\` and `\n` unescaped; borrowed when there is nothing to unescape.
fn unescape_help(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.contains('\\') {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(ch) = it.next() {
        if ch == '\\' {
            match it.next() {
                Some('n') => out.push('\n'),
                Some(o) => out.push(o),
                None => out.push('\\'),
            }
        } else {
            out.push(ch);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Go's `strconv.ParseFloat` forms that exposition formats use: decimals, exponents, `NaN`,
/// `+Inf`, `-Inf` (any case).
fn parse_float(s: &str) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    // Numbers first (nearly every value), without allocating.
    if s.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) {
        return s.parse().ok();
    }
    if s.eq_ignore_ascii_case("nan") {
        Some(f64::NAN)
    } else if s.eq_ignore_ascii_case("+inf") || s.eq_ignore_ascii_case("inf") {
        Some(f64::INFINITY)
    } else if s.eq_ignore_ascii_case("-inf") {
        Some(f64::NEG_INFINITY)
    } else {
        None
    }
}

struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn eat(&mut self, ch: char) -> bool {
        if self.peek() == Some(ch) {
            self.pos += ch.len_utf8();
            true
        } else {
            false
        }
    }

    /// Skips spaces and tabs; whether any were skipped. (Bytewise: continuation bytes of UTF-8
    /// are never ASCII, so the position stays on a character boundary.)
    fn skip_spaces(&mut self) -> bool {
        let b = self.s.as_bytes();
        let start = self.pos;
        while self.pos < b.len() && matches!(b[self.pos], b' ' | b'\t') {
            self.pos += 1;
        }
        self.pos > start
    }

    /// `[a-zA-Z_:][a-zA-Z0-9_:]*`
    fn name(&mut self) -> Option<&'a str> {
        let bytes = self.s.as_bytes();
        let start = self.pos;
        while self.pos < bytes.len() {
            let b = bytes[self.pos];
            let ok = b.is_ascii_alphabetic() || b == b'_' || b == b':' || (self.pos > start && b.is_ascii_digit());
            if !ok {
                break;
            }
            self.pos += 1;
        }
        (self.pos > start).then(|| &self.s[start..self.pos])
    }

    /// A double-quoted string with `\\`, `\"` and `\n` escapes.
    fn quoted(&mut self) -> Result<String, String> {
        let start = self.pos;
        if !self.eat('"') {
            return Err(format!("expected '\"' at column {}", self.pos + 1));
        }
        let mut out = String::new();
        let mut chars = self.s[self.pos..].char_indices();
        while let Some((i, ch)) = chars.next() {
            match ch {
                '"' => {
                    self.pos += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, '\\')) => out.push('\\'),
                    Some((_, '"')) => out.push('"'),
                    Some((_, other)) => return Err(format!("invalid escape \\{other} in a quoted string")),
                    None => break,
                },
                other => out.push(other),
            }
        }
        Err(format!("unterminated quoted string starting at column {}", start + 1))
    }

    /// Up to the next space or tab (bytewise, as `skip_spaces`).
    fn token(&mut self) -> &'a str {
        let b = self.s.as_bytes();
        let start = self.pos;
        while self.pos < b.len() && !matches!(b[self.pos], b' ' | b'\t') {
            self.pos += 1;
        }
        &self.s[start..self.pos]
    }

    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(text: &str, f: Format) -> Vec<(String, f64, Option<i64>)> {
        Parser::new(text, f)
            .filter_map(|e| match e.unwrap() {
                Entry::Sample { labels, value, timestamp_ms } => Some((labels.to_string(), value, timestamp_ms)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn prometheus_text() {
        let text = "# HELP http_requests_total The total.\n# TYPE http_requests_total counter\n\
            http_requests_total{method=\"post\",code=\"200\"} 1027 1395066363000\n\
            http_requests_total{method=\"post\",code=\"400\"}    3 1395066363000\n\
            msdos_file_access_time_seconds{path=\"C:\\\\DIR\\\\FILE.TXT\",error=\"Cannot find file:\\n\\\"FILE.TXT\\\"\"} 1.458255915e9\n\
            metric_without_timestamp_and_labels 12.47\n\
            something_weird{problem=\"division by zero\"} +Inf -3982045\n";
        let got = samples(text, Format::Prometheus);
        assert_eq!(got[0], ("http_requests_total{code=\"200\", method=\"post\"}".into(), 1027.0, Some(1395066363000)));
        assert_eq!(got[1].1, 3.0);
        assert_eq!(
            got[2].0,
            "msdos_file_access_time_seconds{error=\"Cannot find file:\\n\\\"FILE.TXT\\\"\", path=\"C:\\\\DIR\\\\FILE.TXT\"}"
        );
        assert_eq!(got[3], ("metric_without_timestamp_and_labels{}".into(), 12.47, None));
        assert_eq!(got[4].1, f64::INFINITY);
        assert_eq!(got[4].2, Some(-3982045));
        let meta: Vec<Entry> = Parser::new(text, Format::Prometheus).take(2).map(Result::unwrap).collect();
        assert_eq!(meta[1], Entry::Type { family: "http_requests_total".into(), kind: MetricType::Counter });
    }

    #[test]
    fn openmetrics_seconds_exemplars_and_eof() {
        let text = "# TYPE a counter\n# UNIT a seconds\na_total{x=\"1\"} 5 1795332570.123 # {trace_id=\"abc\"} 1 1.0\n\
            {\"my.metric\",\"a.b\"=\"c\"} NaN 1.5\n# EOF\n";
        let got = samples(text, Format::OpenMetrics);
        assert_eq!(got[0], ("a_total{x=\"1\"}".into(), 5.0, Some(1795332570123)));
        assert_eq!(got[1].0, "my.metric{a.b=\"c\"}");
        assert!(got[1].1.is_nan());
        assert_eq!(got[1].2, Some(1500));
        let err = Parser::new("a 1 1\n", Format::OpenMetrics).last().unwrap().unwrap_err();
        assert_eq!(err.to_string(), "line 1: missing # EOF at the end");
    }

    #[test]
    fn exemplars_are_read_with_or_without_their_timestamp() {
        let mut p = Parser::new("", Format::OpenMetrics);
        let exemplar_of = |p: &mut Parser<'_>, line: &str| match p.parse_line_raw(line).unwrap().unwrap() {
            RawEntry::Sample { exemplar, .. } => exemplar.map(str::to_owned),
            other => panic!("{other:?}"),
        };
        let e = exemplar_of(&mut p, "a_bucket{le=\"1\"} 8 # {trace_id=\"b\",span_id=\"s\"} 0.5 1700000000.5").unwrap();
        let (labels, v, t) = p.exemplar(&e).unwrap();
        assert_eq!(labels.to_string(), "{span_id=\"s\", trace_id=\"b\"}");
        assert_eq!((v, t), (0.5, Some(1_700_000_000_500)));
        // After a timestamp, and without one of its own.
        let e = exemplar_of(&mut p, "a_total 3 1700000000 # {trace_id=\"c\"} 1").unwrap();
        assert_eq!(p.exemplar(&e).unwrap().2, None);
        assert_eq!(exemplar_of(&mut p, "a_total 3"), None);
        for (bad, want) in [
            ("trace_id=\"x\"} 1", "expected '{'"),
            ("{trace_id=\"x\"}", "expected a space before the value"),
            ("{trace_id=\"x\"} one", "invalid value"),
            ("{trace_id=x} 1", "expected a quoted value"),
            ("{trace_id=\"x\"} 1 2 3", "unexpected text"),
        ] {
            let err = p.exemplar(bad).unwrap_err().to_string();
            assert!(err.contains(want), "{bad}: {err}");
        }
        // The Prometheus format has no exemplars: text after the value is an error there.
        let mut p = Parser::new("", Format::Prometheus);
        assert!(p.parse_line_raw("a 1 # {x=\"y\"} 1").unwrap().is_err());
    }

    proptest::proptest! {
        /// Arbitrary text, and arbitrary mutations of a valid exposition, never panic the parser
        /// (it returns entries or a line-numbered error).
        #[test]
        fn arbitrary_input_never_panics(
            junk in "\\PC{0,200}",
            cut in 0usize..200,
            byte in 0usize..200,
            with in proptest::prelude::any::<char>(),
        ) {
            for f in [Format::Prometheus, Format::OpenMetrics] {
                for r in Parser::new(&junk, f) {
                    let _ = r;
                }
            }
            let valid = "# TYPE a counter\na_total{x=\"1\",y=\"\\\"q\"} 1.5e3 1795332570.123 # {t=\"x\"} 1\n{\"u.v\"} NaN\n# EOF\n";
            let mut m: Vec<char> = valid.chars().collect();
            m.truncate(cut.min(m.len()));
            if !m.is_empty() {
                let i = byte % m.len();
                m[i] = with;
            }
            let m: String = m.into_iter().collect();
            for f in [Format::Prometheus, Format::OpenMetrics] {
                for r in Parser::new(&m, f) {
                    if let Err(e) = r {
                        proptest::prop_assert!(e.line >= 1);
                    }
                }
            }
        }
    }

    #[test]
    fn errors_name_the_line_and_problem() {
        let bad = [
            ("a{b=\"1\" 1", "expected ',' or '}'"),
            ("a{b=1} 1", "expected a quoted value"),
            ("a{b=\"1\"} x", "invalid value \"x\""),
            ("a 1 12.5", "invalid timestamp \"12.5\""),
            ("a{b=\"1\",b=\"2\"} 1", "duplicate"),
            ("a{b=\"\\q\"} 1", "invalid escape"),
            ("a{b=\"1} 1", "unterminated"),
            ("a 1 2 3", "unexpected text"),
            ("# TYPE a wat", "unknown metric type"),
            ("{} 1", "missing metric name"),
        ];
        for (line, want) in bad {
            let text = format!("ok 1\n{line}\n");
            let err = Parser::new(&text, Format::Prometheus).find_map(|e| e.err()).expect(line);
            assert_eq!(err.line, 2, "{line}");
            assert!(err.message.contains(want), "{line}: {err}");
        }
    }
}
