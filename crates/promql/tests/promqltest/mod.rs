//! A runner for Prometheus' PromQL test-file language (`testdata/promql/README.md` describes
//! it): `load`, `clear`, `eval instant|range` with expectations, checked against our engine
//! over a real in-memory head.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use strata_model::histogram::{notation, CUSTOM_BUCKETS_SCHEMA};
use strata_model::{is_stale_nan, FloatHistogram, Labels, STALE_NAN_BITS};
use strata_promql::ast::{ExprKind, ValueType};
use strata_promql::{Annotation, Engine, EngineOptions, Features, Value};
use strata_tsdb::head::{Head, HeadOptions};

/// What became of one `eval`.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Passed,
    Failed(String),
    Skipped(&'static str),
}

#[derive(Debug)]
pub struct CaseResult {
    pub line: usize,
    pub query: String,
    pub outcome: Outcome,
}

/// An expected (or loaded) value: a float or a stale marker, a native histogram (with
/// whether its counter reset hint was spelled out, and so is to be compared), or nothing.
#[derive(Debug, Clone)]
enum Expected {
    Float(f64),
    Missing,
    Histogram(Box<FloatHistogram>, bool),
}

#[derive(Debug)]
struct SeriesLine {
    labels: Labels,
    values: Vec<Expected>,
}

#[derive(Debug, Default)]
struct Expectations {
    fail: Option<Matcher>,
    warn: Vec<Matcher>,
    no_warn: bool,
    info: Vec<Matcher>,
    no_info: bool,
    ordered: bool,
    range_vector: Option<(i64, i64, i64)>,
    string: Option<String>,
    scalar: Option<f64>,
    series: Vec<SeriesLine>,
    legacy_warn: bool,
    legacy_info: bool,
}

#[derive(Debug)]
enum Matcher {
    Any,
    Exact(String),
    Regex(regex::Regex),
}

impl Matcher {
    fn matches(&self, s: &str) -> bool {
        match self {
            Matcher::Any => true,
            Matcher::Exact(e) => e == s,
            Matcher::Regex(r) => r.is_match(s),
        }
    }
}

fn parse_duration(s: &str) -> Result<i64, String> {
    strata_model::parse_duration_ms(s)
}

/// Runs one test file's text; returns one result per `eval`.
pub fn run_file(text: &str) -> Result<Vec<CaseResult>, String> {
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            let t = l.trim();
            if t.starts_with('#') {
                String::new()
            } else {
                t.to_string()
            }
        })
        .collect();
    let mut head = new_head();
    let mut results = Vec::new();
    // Why the storage cannot hold what was loaded since the last `clear`, if so.
    let mut unsupported_data: Option<&'static str> = None;
    // As upstream runs the files: start times used (`use-start-timestamps`).
    let engine =
        Engine::new(EngineOptions { max_samples: 10_000, use_start_timestamps: true, ..EngineOptions::default() });
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        if line.is_empty() {
            i += 1;
            continue;
        }
        let start = i;
        let mut end = i + 1;
        // `clear` has no body: the next line may start another command.
        while end < lines.len() && !lines[end].is_empty() && !line.starts_with("clear") {
            end += 1;
        }
        let body = &lines[start + 1..end];
        let word = line.split_whitespace().next().unwrap_or("");
        if word == "clear" {
            head = new_head();
            unsupported_data = None;
        } else if word.starts_with("load") {
            let nhcb = word == "load_with_nhcb";
            let interval =
                line.split_whitespace().nth(1).ok_or(format!("line {}: load without interval", start + 1))?;
            let interval = parse_duration(interval).map_err(|e| format!("line {}: {e}", start + 1))?;
            if let Some(why) = load(&head, interval, body, nhcb).map_err(|e| format!("line {}: {e}", start + 1))? {
                unsupported_data = Some(why);
            }
        } else if word.starts_with("eval") {
            let (query, outcome) = match run_eval(&engine, &head, line, body, unsupported_data) {
                Ok(x) => x,
                Err(e) => (line.clone(), Outcome::Failed(format!("bad test: {e}"))),
            };
            results.push(CaseResult { line: start + 1, query, outcome });
        } else {
            return Err(format!("line {}: unknown command {line:?}", start + 1));
        }
        i = end;
    }
    Ok(results)
}

fn new_head() -> Head {
    Head::in_memory(HeadOptions { backfill: true, ..HeadOptions::default() })
}

/// A loaded series: labels and timestamped values, each with its start time (0: none).
type LoadedSeries = (Labels, Vec<(i64, i64, Expected)>);

/// Loads series lines; returns why some data could not be stored, which then skips
/// evaluations (nothing at present).
fn load(head: &Head, interval: i64, body: &[String], nhcb: bool) -> Result<Option<&'static str>, String> {
    let unsupported = None;
    let mut series: Vec<LoadedSeries> = Vec::new();
    // The start-time offsets of an `@st` line, for the value line that follows it.
    let mut starts: Option<(Labels, Vec<Option<i64>>)> = None;
    for line in body {
        let (labels_text, rest) = split_series(line)?;
        if let Some(text) = labels_text.strip_suffix("@st") {
            starts = Some((parse_labels(text)?, parse_start_offsets(rest)?));
            continue;
        }
        let labels = parse_labels(labels_text)?;
        let values = parse_values(rest)?;
        let offsets = match starts.take() {
            Some((l, offsets)) if l == labels => {
                if offsets.len() != values.len() {
                    return Err(format!("{labels}: {} start times for {} values", offsets.len(), values.len()));
                }
                offsets
            }
            Some((l, _)) => return Err(format!("start times of {l} are not followed by its values")),
            None => vec![None; values.len()],
        };
        let samples: Vec<(i64, i64, Expected)> = values
            .into_iter()
            .zip(offsets)
            .enumerate()
            .filter(|(_, (v, _))| !matches!(v, Expected::Missing))
            .map(|(k, (v, off))| {
                let t = k as i64 * interval;
                (t, off.map_or(0, |o| t + o), v)
            })
            .collect();
        series.retain(|(l, _)| *l != labels);
        series.push((labels, samples));
    }
    if let Some((l, _)) = starts {
        return Err(format!("start times of {l} are not followed by its values"));
    }
    if nhcb {
        let converted = to_nhcb(&series)?;
        series.extend(converted);
    }
    let mut app = head.appender();
    for (labels, samples) in &series {
        for (t, st, v) in samples {
            let res = match v {
                Expected::Float(f) => app.append_with_start(labels, *t, *st, *f),
                Expected::Histogram(h, _) => app.append_histogram_with_start(labels, *t, *st, (**h).clone()),
                Expected::Missing => continue,
            };
            match res {
                Ok(_) => {}
                // A later load may repeat samples already there.
                Err(e) if e.to_string().contains("duplicate") => {}
                Err(e) => return Err(format!("appending {labels} @{t}: {e}")),
            }
        }
    }
    app.commit().map_err(|e| e.to_string())?;
    Ok(unsupported)
}

/// The native histograms with custom buckets (NHCB) that `load_with_nhcb` derives from the
/// classic histogram series loaded (README, section 3): one series per base name and labels
/// (without `le`), one histogram per timestamp where any of its parts has a sample.
fn to_nhcb(series: &[LoadedSeries]) -> Result<Vec<LoadedSeries>, String> {
    #[derive(Default)]
    struct Parts {
        /// `le` bound → samples (cumulative counts).
        buckets: BTreeMap<u64, (f64, BTreeMap<i64, f64>)>,
        count: BTreeMap<i64, f64>,
        sum: BTreeMap<i64, f64>,
    }
    let mut groups: BTreeMap<Labels, Parts> = BTreeMap::new();
    for (labels, samples) in series {
        let Some(name) = labels.metric_name() else { continue };
        let Some((base, part)) =
            ["_bucket", "_count", "_sum"].iter().find_map(|suf| name.strip_suffix(suf).map(|b| (b, *suf)))
        else {
            continue;
        };
        let mut b = strata_model::LabelsBuilder::new(labels);
        b.set("__name__", base).del("le");
        let key = b.build().map_err(|e| e.to_string())?;
        let floats: BTreeMap<i64, f64> = samples
            .iter()
            .filter_map(|(t, _, v)| match v {
                Expected::Float(f) => Some((*t, *f)),
                _ => None,
            })
            .collect();
        let parts = groups.entry(key).or_default();
        match part {
            "_bucket" => {
                let Some(le) = labels.get("le").and_then(|v| v.parse::<f64>().ok()).filter(|v| !v.is_nan()) else {
                    continue;
                };
                // Order bounds numerically (total order of the bits of non-NaN floats, mapped).
                let key = if le.is_sign_negative() { !le.to_bits() } else { le.to_bits() | (1 << 63) };
                parts.buckets.insert(key, (le, floats));
            }
            "_count" => parts.count = floats,
            _ => parts.sum = floats,
        }
    }
    let mut out = Vec::new();
    for (labels, parts) in groups {
        if parts.buckets.is_empty() {
            continue;
        }
        let mut times: Vec<i64> = parts.buckets.values().flat_map(|(_, s)| s.keys().copied()).collect();
        times.extend(parts.count.keys());
        times.extend(parts.sum.keys());
        times.sort_unstable();
        times.dedup();
        let mut samples = Vec::new();
        for t in times {
            let mut bounds = Vec::new();
            let mut counts = Vec::new();
            let mut prev = 0.0;
            let mut has_inf = false;
            for (le, s) in parts.buckets.values() {
                let Some(&c) = s.get(&t) else { continue };
                if c < prev {
                    return Err(format!("{labels}: bucket counts are not cumulative at {t}"));
                }
                if le.is_infinite() && *le > 0.0 {
                    has_inf = true;
                } else {
                    bounds.push(*le);
                }
                counts.push(c - prev);
                prev = c;
            }
            let total = prev;
            let count = parts.count.get(&t).copied().unwrap_or(total);
            if !has_inf {
                counts.push(count - total);
            } else if parts.count.contains_key(&t) && count != total {
                return Err(format!("{labels}: _count {count} differs from the +Inf bucket {total} at {t}"));
            }
            let (positive_spans, positive_buckets) = notation::dense(0, &counts);
            let h = FloatHistogram {
                schema: CUSTOM_BUCKETS_SCHEMA,
                count,
                sum: parts.sum.get(&t).copied().unwrap_or(0.0),
                positive_spans,
                positive_buckets,
                custom_values: bounds,
                ..FloatHistogram::default()
            };
            samples.push((t, 0, Expected::Histogram(Box::new(h), false)));
        }
        out.push((labels, samples));
    }
    Ok(out)
}

/// Splits `name{a="b"} 1 2 3` into the series part and the values part.
fn split_series(line: &str) -> Result<(&str, &str), String> {
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'{' {
        i += 1;
    }
    if i < b.len() && b[i] == b'{' {
        let mut quote: Option<u8> = None;
        while i < b.len() {
            let c = b[i];
            match quote {
                Some(q) => {
                    if c == b'\\' && q != b'`' {
                        i += 1;
                    } else if c == q {
                        quote = None;
                    }
                }
                None => {
                    if c == b'"' || c == b'\'' || c == b'`' {
                        quote = Some(c);
                    } else if c == b'}' {
                        i += 1;
                        break;
                    }
                }
            }
            i += 1;
        }
        // `@st` directly after the braces.
        while i < b.len() && !b[i].is_ascii_whitespace() {
            i += 1;
        }
    }
    Ok((&line[..i], line[i..].trim()))
}

fn parse_labels(s: &str) -> Result<Labels, String> {
    if s == "{}" {
        return Ok(Labels::empty());
    }
    let expr = strata_promql::parse_with(s, Features::all()).map_err(|e| format!("series {s:?}: {}", e.render(s)))?;
    let ExprKind::Vector(sel) = expr.kind else { return Err(format!("series {s:?} is not a selector")) };
    let pairs: Vec<(String, String)> = sel.matchers.iter().map(|m| (m.name.clone(), m.value.clone())).collect();
    Labels::try_from_pairs(pairs).map_err(|e| format!("series {s:?}: {e}"))
}

/// Value tokens of a load or expectation line.
fn parse_values(s: &str) -> Result<Vec<Expected>, String> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while !rest.is_empty() {
        if rest.starts_with("{{") {
            // The token runs to the first whitespace outside `{{ … }}`.
            let b = rest.as_bytes();
            let (mut k, mut depth) = (0, 0);
            while k < b.len() && (depth > 0 || !b[k].is_ascii_whitespace()) {
                if rest[k..].starts_with("{{") {
                    depth += 1;
                    k += 2;
                } else if rest[k..].starts_with("}}") {
                    depth -= 1;
                    k += 2;
                } else {
                    k += 1;
                }
            }
            let tok = &rest[..k];
            expand_histogram_token(tok, &mut out)?;
            rest = rest[k..].trim_start();
            continue;
        }
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let tok = &rest[..end];
        rest = rest[end..].trim_start();
        expand_token(tok, &mut out)?;
    }
    Ok(out)
}

/// The offsets of an `@st` line (README, section 3): `_` (none), `_xN` (N of them), a signed
/// duration, `<dur>xN` (N+1 equal), `<dur>+<dur>xN` / `<dur>-<dur>xN` (N+1 in steps).
fn parse_start_offsets(s: &str) -> Result<Vec<Option<i64>>, String> {
    let signed = |d: &str| -> Result<i64, String> {
        match d.strip_prefix('-') {
            Some(rest) => parse_duration(rest).map(|v| -v),
            None => parse_duration(d.strip_prefix('+').unwrap_or(d)),
        }
    };
    let mut out = Vec::new();
    for tok in s.split_whitespace() {
        let (body, times) = match tok.rsplit_once('x') {
            Some((b, n)) => (b, Some(n.parse::<usize>().map_err(|_| format!("bad start offset {tok:?}"))?)),
            None => (tok, None),
        };
        if body == "_" {
            out.extend(std::iter::repeat_n(None, times.unwrap_or(1)));
            continue;
        }
        // A step after the first duration: the next sign that is not the leading one.
        let split = body.char_indices().skip(1).find(|&(_, c)| c == '+' || c == '-').map(|(i, _)| i);
        match (split, times) {
            (Some(i), Some(n)) => {
                let (first, step) = (signed(&body[..i])?, signed(&body[i..])?);
                out.extend((0..=n as i64).map(|k| Some(first + k * step)));
            }
            (Some(_), None) => return Err(format!("bad start offset {tok:?}: a step needs xN")),
            (None, n) => {
                let v = signed(body)?;
                out.extend(std::iter::repeat_n(Some(v), n.map_or(1, |n| n + 1)));
            }
        }
    }
    Ok(out)
}

/// `{{A}}`, `{{A}}xN` (N+1 copies), `{{A}}+{{B}}xN` / `{{A}}-{{B}}xN` (A, A±B, A±2B, …).
fn expand_histogram_token(tok: &str, out: &mut Vec<Expected>) -> Result<(), String> {
    let first_end = tok.find("}}").ok_or_else(|| format!("bad histogram {tok:?}"))? + 2;
    let parse = |s: &str| notation::parse(s).map(|h| (h.clone(), s.contains("counter_reset_hint")));
    let (a, a_hint) = parse(&tok[..first_end])?;
    let rest = &tok[first_end..];
    if rest.is_empty() {
        out.push(Expected::Histogram(Box::new(a), a_hint));
        return Ok(());
    }
    let times = |n: &str| n.parse::<usize>().map_err(|_| format!("bad histogram repetition {tok:?}"));
    if let Some(n) = rest.strip_prefix('x') {
        for _ in 0..=times(n)? {
            out.push(Expected::Histogram(Box::new(a.clone()), a_hint));
        }
        return Ok(());
    }
    let (op, rest) = rest.split_at(1);
    let (b_text, n) = rest.rsplit_once('x').ok_or_else(|| format!("bad histogram series {tok:?}"))?;
    let (b, _) = parse(b_text)?;
    let mut cur = a;
    for k in 0..=times(n)? {
        if k > 0 {
            let r = if op == "+" { cur.add(&b) } else { cur.sub(&b) };
            r.map_err(|e| format!("{tok:?}: {e}"))?;
        }
        out.push(Expected::Histogram(Box::new(cur.clone()), a_hint));
    }
    Ok(())
}

fn parse_number(s: &str) -> Option<f64> {
    let lower = s.to_ascii_lowercase();
    match lower.trim_start_matches('+') {
        "inf" => return Some(if lower.starts_with('-') { f64::NEG_INFINITY } else { f64::INFINITY }),
        "-inf" => return Some(f64::NEG_INFINITY),
        "nan" => return Some(f64::NAN),
        _ => {}
    }
    if s.contains(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E') {
        return None;
    }
    s.parse().ok()
}

fn expand_token(tok: &str, out: &mut Vec<Expected>) -> Result<(), String> {
    if tok == "_" {
        out.push(Expected::Missing);
        return Ok(());
    }
    if tok == "stale" {
        out.push(Expected::Float(f64::from_bits(STALE_NAN_BITS)));
        return Ok(());
    }
    if let Some(n) = tok.strip_prefix("_x") {
        let n: usize = n.parse().map_err(|_| format!("bad token {tok:?}"))?;
        out.extend(std::iter::repeat_n(Expected::Missing, n));
        return Ok(());
    }
    if let Some(v) = parse_number(tok) {
        out.push(Expected::Float(v));
        return Ok(());
    }
    let (lhs, n) = tok.rsplit_once('x').ok_or_else(|| format!("bad token {tok:?}"))?;
    let n: usize = n.parse().map_err(|_| format!("bad token {tok:?}"))?;
    // `a+b`, `a-b` or `a` (a itself may start with a sign or hold an exponent sign).
    let bytes = lhs.as_bytes();
    let op_at =
        (1..bytes.len()).find(|&i| (bytes[i] == b'+' || bytes[i] == b'-') && !matches!(bytes[i - 1], b'e' | b'E'));
    let (a, b) = match op_at {
        Some(i) => {
            let a = parse_number(&lhs[..i]).ok_or_else(|| format!("bad token {tok:?}"))?;
            let b = parse_number(&lhs[i + 1..]).ok_or_else(|| format!("bad token {tok:?}"))?;
            (a, if bytes[i] == b'-' { -b } else { b })
        }
        None => (parse_number(lhs).ok_or_else(|| format!("bad token {tok:?}"))?, 0.0),
    };
    for k in 0..=n {
        out.push(Expected::Float(a + b * k as f64));
    }
    Ok(())
}

fn parse_header(line: &str) -> Result<(Header, String), String> {
    let mut words = line.splitn(2, char::is_whitespace);
    let cmd = words.next().unwrap_or("");
    let rest = words.next().unwrap_or("").trim_start();
    let legacy = match cmd {
        "eval" => Legacy::None,
        "eval_fail" => Legacy::Fail,
        "eval_warn" => Legacy::Warn,
        "eval_info" => Legacy::Info,
        "eval_ordered" => Legacy::Ordered,
        _ => return Err(format!("unknown command {cmd}")),
    };
    if let Some(r) = rest.strip_prefix("instant at ") {
        let r = r.trim_start();
        let (t, q) = r.split_once(char::is_whitespace).ok_or("missing query")?;
        let t = parse_time(t)?;
        return Ok((Header { kind: Kind::Instant(t), legacy }, q.trim().to_string()));
    }
    if let Some(r) = rest.strip_prefix("range from ") {
        let parts: Vec<&str> = r.splitn(6, char::is_whitespace).collect();
        if parts.len() < 6 || parts[1] != "to" || parts[3] != "step" {
            return Err(format!("bad range header {line:?}"));
        }
        let (s, e, st) = (parse_time(parts[0])?, parse_time(parts[2])?, parse_duration(parts[4])?);
        return Ok((Header { kind: Kind::Range(s, e, st), legacy }, parts[5].trim().to_string()));
    }
    Err(format!("bad eval header {line:?}"))
}

fn parse_time(s: &str) -> Result<i64, String> {
    parse_duration(s)
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Instant(i64),
    Range(i64, i64, i64),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Legacy {
    None,
    Fail,
    Warn,
    Info,
    Ordered,
}

#[derive(Debug)]
struct Header {
    kind: Kind,
    legacy: Legacy,
}

fn parse_expect_matcher(rest: &str) -> Result<Matcher, String> {
    let rest = rest.trim();
    if let Some(m) = rest.strip_prefix("msg:") {
        return Ok(Matcher::Exact(m.trim().to_string()));
    }
    if let Some(r) = rest.strip_prefix("regex:") {
        return regex::Regex::new(r.trim()).map(Matcher::Regex).map_err(|e| e.to_string());
    }
    if rest.is_empty() {
        return Ok(Matcher::Any);
    }
    Err(format!("bad expectation qualifier {rest:?}"))
}

fn parse_body(body: &[String], legacy: Legacy) -> Result<Expectations, String> {
    let mut x = Expectations::default();
    match legacy {
        Legacy::Fail => x.fail = Some(Matcher::Any),
        Legacy::Warn => x.legacy_warn = true,
        Legacy::Info => x.legacy_info = true,
        Legacy::Ordered => x.ordered = true,
        Legacy::None => {}
    }
    for line in body {
        let first = line.split_whitespace().next().unwrap_or("");
        if first == "expected_fail_message" {
            x.fail = Some(Matcher::Exact(line[first.len()..].trim().to_string()));
            continue;
        }
        if first == "expected_fail_regexp" {
            x.fail = Some(Matcher::Regex(regex::Regex::new(line[first.len()..].trim()).map_err(|e| e.to_string())?));
            continue;
        }
        if first == "expect" {
            let rest = line["expect".len()..].trim_start();
            let (kind, tail) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            match kind {
                "fail" => x.fail = Some(parse_expect_matcher(tail)?),
                "warn" => x.warn.push(parse_expect_matcher(tail)?),
                "no_warn" => x.no_warn = true,
                "info" => x.info.push(parse_expect_matcher(tail)?),
                "no_info" => x.no_info = true,
                "ordered" => x.ordered = true,
                "string" => {
                    let t = tail.trim();
                    let s = if t.len() >= 2 && (t.starts_with('"') || t.starts_with('`')) {
                        unquote_go(t)?
                    } else {
                        return Err(format!("bad expect string {t:?}"));
                    };
                    x.string = Some(s);
                }
                "range" => {
                    // expect range vector from <t1> to <t2> step <s>
                    let w: Vec<&str> = tail.split_whitespace().collect();
                    if w.len() != 7 || w[0] != "vector" || w[1] != "from" || w[3] != "to" || w[5] != "step" {
                        return Err(format!("bad expect range vector {line:?}"));
                    }
                    x.range_vector = Some((parse_time(w[2])?, parse_time(w[4])?, parse_duration(w[6])?));
                }
                _ => return Err(format!("unknown expectation {line:?}")),
            }
            continue;
        }
        if let Some(v) = parse_scalar_line(line) {
            x.scalar = Some(v);
            break;
        }
        let (labels, values) = split_series(line)?;
        x.series.push(SeriesLine { labels: parse_labels(labels)?, values: parse_values(values)? });
    }
    Ok(x)
}

fn parse_scalar_line(line: &str) -> Option<f64> {
    if line.contains(char::is_whitespace) {
        return None;
    }
    let l = line.to_ascii_lowercase();
    if let Some(h) = l.strip_prefix("0x").or_else(|| l.strip_prefix("+0x")) {
        return u64::from_str_radix(h, 16).ok().map(|v| v as f64);
    }
    parse_number(line)
}

fn unquote_go(t: &str) -> Result<String, String> {
    let toks = strata_promql::lexer::lex(t).map_err(|e| e.msg)?;
    match &toks[0].tok {
        strata_promql::lexer::Tok::Str(b) => String::from_utf8(b.clone()).map_err(|e| e.to_string()),
        _ => Err(format!("bad string {t:?}")),
    }
}

/// Float equality with the test language's tolerance (stale NaN only equals stale NaN).
fn float_eq(a: f64, e: f64) -> bool {
    const MIN_NORMAL: f64 = 2.2250738585072014e-308;
    if is_stale_nan(a) || is_stale_nan(e) {
        return is_stale_nan(a) && is_stale_nan(e);
    }
    if a.is_nan() && e.is_nan() {
        return true;
    }
    if a == e {
        return true;
    }
    let abs_sum = a.abs() + e.abs();
    if a == 0.0 || e == 0.0 || abs_sum < MIN_NORMAL {
        return (a - e).abs() < 1e-6 * MIN_NORMAL;
    }
    (a - e).abs() / abs_sum.min(f64::MAX) < 1e-6
}

fn uses_any(query: &str, names: &[&str]) -> bool {
    names.iter().any(|n| {
        let mut from = 0;
        while let Some(p) = query[from..].find(n) {
            let at = from + p;
            let before_ok =
                at == 0 || !query.as_bytes()[at - 1].is_ascii_alphanumeric() && query.as_bytes()[at - 1] != b'_';
            let after = query[at + n.len()..].trim_start();
            if before_ok && after.starts_with('(') {
                return true;
            }
            from = at + n.len();
        }
        false
    })
}

fn run_eval(
    engine: &Engine,
    head: &Head,
    line: &str,
    body: &[String],
    unsupported_data: Option<&'static str>,
) -> Result<(String, Outcome), String> {
    let (header, query) = parse_header(line)?;
    let x = parse_body(body, header.legacy)?;
    if let Some(why) = unsupported_data {
        return Ok((query, Outcome::Skipped(why)));
    }
    let expr = match strata_promql::parse_with(&query, Features::all()) {
        Ok(e) => e,
        Err(e) => {
            let msg = e.render(&query);
            return Ok((query, check_error(&x, &msg)));
        }
    };
    let outcome = evaluate(engine, head, &header, &x, &query, &expr);
    Ok((query, outcome))
}

fn evaluate(
    engine: &Engine,
    head: &Head,
    header: &Header,
    x: &Expectations,
    query: &str,
    expr: &strata_promql::ast::Expr,
) -> Outcome {
    let (result, annotations) = match header.kind {
        Kind::Instant(t) => {
            let t = x.range_vector.map_or(t, |(_, t2, _)| t2);
            match engine.instant(head, expr, t) {
                Ok(out) => (out.value, out.annotations),
                Err(e) => return check_error(x, &e.to_string()),
            }
        }
        Kind::Range(s, e, st) => match engine.range(head, expr, s, e, st) {
            Ok(out) => (out.value, out.annotations),
            Err(err) => return check_error(x, &err.to_string()),
        },
    };
    if x.fail.is_some() {
        return Outcome::Failed(format!("expected an error, got {}", describe(&result)));
    }
    if let Err(e) = check_annotations(x, &annotations, query) {
        return Outcome::Failed(e);
    }
    let check = match header.kind {
        Kind::Instant(t) => check_instant(x, &result, t),
        Kind::Range(s, _, st) => check_matrix(x, &result, s, st),
    };
    if let Err(e) = check {
        return Outcome::Failed(e);
    }
    // Range-mode cross-check of instant queries (README 6.4.3).
    if let Kind::Instant(t) = header.kind {
        let skip = x.range_vector.is_some()
            || x.string.is_some()
            || uses_any(query, &["start", "end", "range", "step"])
            || expr.value_type() == ValueType::String
            || expr.value_type() == ValueType::Matrix;
        if !skip {
            match engine.range(head, expr, t - 60_000, t + 60_000, 60_000) {
                Err(e) => return Outcome::Failed(format!("range-mode cross-check failed: {e}")),
                Ok(out) => {
                    if let Err(e) = cross_check(x, &out.value, t) {
                        return Outcome::Failed(format!("range-mode cross-check: {e}"));
                    }
                }
            }
        }
        // @-modifier variants (README 6.4.2): every selector and subquery pinned to the eval
        // time must give the same result from other evaluation times. Values only: the
        // annotations' positions refer to the rewritten text upstream.
        let t = x.range_vector.map_or(t, |(_, t2, _)| t2);
        if let Some(pinned) = pinned_to(expr, t) {
            let times = if t == 0 { vec![-1000, 0, 1000] } else { vec![-10 * t, 0, t / 5, t, 10 * t] };
            for at in times {
                let result = match engine.instant(head, &pinned, at) {
                    Ok(out) => out.value,
                    Err(e) => return Outcome::Failed(format!("@ variant evaluated at {at}ms failed: {e}")),
                };
                if let Err(e) = check_instant(x, &result, t) {
                    return Outcome::Failed(format!("@ variant evaluated at {at}ms: {e}"));
                }
            }
        }
    }
    Outcome::Passed
}

/// Functions whose result depends on the evaluation time even when their inputs are pinned.
const AT_UNSAFE_FUNCTIONS: &[&str] = &[
    "time",
    "timestamp",
    "minute",
    "hour",
    "day_of_week",
    "day_of_month",
    "day_of_year",
    "days_in_month",
    "month",
    "year",
    "predict_linear",
    "start",
    "end",
    "range",
    "step",
];

/// `expr` with `@ t` on every selector and subquery that has none (not inside a subquery
/// that has one), as the upstream harness rewrites it; None when the expression uses a
/// function that depends on the evaluation time.
fn pinned_to(expr: &strata_promql::ast::Expr, t: i64) -> Option<strata_promql::ast::Expr> {
    use strata_promql::ast::{At, ExprKind as K};
    let mut unsafe_fn = false;
    expr.walk(&mut |e| {
        if let K::Call(c) = &e.kind {
            unsafe_fn |= AT_UNSAFE_FUNCTIONS.contains(&c.func.name);
        }
    });
    if unsafe_fn {
        return None;
    }
    fn pin(e: &mut strata_promql::ast::Expr, t: i64) {
        match &mut e.kind {
            K::Vector(v) => {
                v.at.get_or_insert(At::Ms(t));
            }
            K::Matrix(m) => {
                m.vector.at.get_or_insert(At::Ms(t));
            }
            // A subquery gets the time; what is inside it keeps its own.
            K::Subquery(s) => {
                s.at.get_or_insert(At::Ms(t));
            }
            K::Paren(x) | K::Neg(x) | K::Pos(x) => pin(x, t),
            K::Binary(b) => {
                pin(&mut b.lhs, t);
                pin(&mut b.rhs, t);
            }
            K::Aggregate(a) => {
                if let Some(p) = &mut a.param {
                    pin(p, t);
                }
                pin(&mut a.expr, t);
            }
            K::Call(c) => c.args.iter_mut().for_each(|a| pin(a, t)),
            K::Number(_) | K::String(_) => {}
        }
    }
    let mut e = expr.clone();
    pin(&mut e, t);
    Some(e)
}

fn check_error(x: &Expectations, msg: &str) -> Outcome {
    match &x.fail {
        Some(m) if m.matches(msg) => Outcome::Passed,
        Some(_) => Outcome::Failed(format!("error text differs: got {msg:?}")),
        None => Outcome::Failed(format!("unexpected error: {msg}")),
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Scalar { v, .. } => format!("scalar {v}"),
        Value::String { s, .. } => format!("string {s:?}"),
        Value::Vector(s) => format!("vector of {} series", s.len()),
        Value::Matrix(s) => format!("matrix of {} series", s.len()),
    }
}

fn check_annotations(x: &Expectations, annotations: &[Annotation], query: &str) -> Result<(), String> {
    let warns: Vec<String> = annotations.iter().filter(|a| !a.info).map(|a| a.render(query)).collect();
    let infos: Vec<String> = annotations.iter().filter(|a| a.info).map(|a| a.render(query)).collect();
    for (kind, expected, none, legacy, got) in
        [("warning", &x.warn, x.no_warn, x.legacy_warn, &warns), ("info", &x.info, x.no_info, x.legacy_info, &infos)]
    {
        if none && !got.is_empty() {
            return Err(format!("expected no {kind}, got {got:?}"));
        }
        if legacy && got.is_empty() {
            return Err(format!("expected a {kind}, got none"));
        }
        if expected.is_empty() {
            continue;
        }
        if got.is_empty() {
            return Err(format!("expected a {kind}, got none"));
        }
        for m in expected.iter() {
            if !got.iter().any(|g| m.matches(g)) {
                return Err(format!("no {kind} matches {m:?}; got {got:?}"));
            }
        }
        for g in got.iter() {
            if !expected.iter().any(|m| m.matches(g)) {
                return Err(format!("unexpected {kind} {g:?}"));
            }
        }
    }
    Ok(())
}

fn check_instant(x: &Expectations, v: &Value, t: i64) -> Result<(), String> {
    if let Some(s) = &x.string {
        return match v {
            Value::String { s: got, .. } if got == s => Ok(()),
            other => Err(format!("expected string {s:?}, got {}", describe(other))),
        };
    }
    if let Some((t1, _, step)) = x.range_vector {
        return check_matrix(x, v, t1, step);
    }
    match v {
        Value::Scalar { v, .. } => match x.scalar {
            Some(e) if float_eq(*v, e) => Ok(()),
            Some(e) => Err(format!("expected scalar {e}, got {v}")),
            None => Err(format!("expected {} series, got scalar {v}", x.series.len())),
        },
        Value::Vector(series) => {
            if x.scalar.is_some() {
                return Err(format!("expected a scalar, got {}", describe(v)));
            }
            let got: Vec<(&Labels, Got)> = series
                .iter()
                .map(|s| {
                    let v = match (s.points.first(), s.hists.first()) {
                        (Some(p), _) => Got::F(p.f),
                        (None, Some(h)) => Got::H(&h.h),
                        (None, None) => Got::F(f64::NAN),
                    };
                    (&s.labels, v)
                })
                .collect();
            compare_vector(x, &got, t)
        }
        other => Err(format!("expected a vector, got {}", describe(other))),
    }
}

/// A result value: a float or a histogram.
#[derive(Debug, Clone, Copy)]
enum Got<'a> {
    F(f64),
    H(&'a FloatHistogram),
}

impl std::fmt::Display for Got<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Got::F(v) => write!(f, "{v}"),
            Got::H(h) => write!(f, "{}", notation::format(h)),
        }
    }
}

/// Whether a result value matches an expected one (README, sections 5 and 7).
fn value_eq(got: Got, e: &Expected) -> bool {
    match (got, e) {
        (Got::F(a), Expected::Float(b)) => float_eq(a, *b),
        (Got::H(a), Expected::Histogram(b, hint)) => histogram_eq(a, b, *hint),
        _ => false,
    }
}

fn histogram_eq(a: &FloatHistogram, e: &FloatHistogram, compare_hint: bool) -> bool {
    if compare_hint && a.hint != e.hint {
        return false;
    }
    let (mut a, mut e) = (a.clone(), e.clone());
    a.compact();
    e.compact();
    let floats = |x: &[f64], y: &[f64]| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| float_eq(*p, *q));
    a.schema == e.schema
        && a.zero_threshold == e.zero_threshold
        && float_eq(a.count, e.count)
        && float_eq(a.sum, e.sum)
        && float_eq(a.zero_count, e.zero_count)
        && a.positive_spans == e.positive_spans
        && a.negative_spans == e.negative_spans
        && floats(&a.positive_buckets, &e.positive_buckets)
        && floats(&a.negative_buckets, &e.negative_buckets)
        && (!a.uses_custom_buckets() || a.custom_values == e.custom_values)
}

fn show_expected(e: &Expected) -> String {
    match e {
        Expected::Float(f) => f.to_string(),
        Expected::Missing => "_".into(),
        Expected::Histogram(h, _) => notation::format(h),
    }
}

fn compare_vector(x: &Expectations, got: &[(&Labels, Got)], _t: i64) -> Result<(), String> {
    let missing = Expected::Missing;
    let expected: Vec<(&Labels, &Expected)> =
        x.series.iter().map(|s| (&s.labels, s.values.first().unwrap_or(&missing))).collect();
    if x.series.iter().any(|s| s.values.len() != 1) {
        return Err("bad test: instant expectation with other than one value".into());
    }
    let mut msg = String::new();
    for (l, v) in got {
        match expected.iter().find(|(el, _)| el == l) {
            None => {
                let _ = write!(msg, "unexpected series {l} {v}; ");
            }
            Some((_, e)) if !value_eq(*v, e) => {
                let _ = write!(msg, "{l}: expected {}, got {v}; ", show_expected(e));
            }
            _ => {}
        }
    }
    for (l, _) in &expected {
        if !got.iter().any(|(g, _)| g == l) {
            let _ = write!(msg, "missing series {l}; ");
        }
    }
    if msg.is_empty() && x.ordered {
        for (k, ((gl, _), (el, _))) in got.iter().zip(&expected).enumerate() {
            if gl != el {
                let _ = write!(msg, "order differs at {k}: got {gl}, expected {el}; ");
                break;
            }
        }
    }
    if msg.is_empty() {
        Ok(())
    } else {
        Err(msg)
    }
}

fn check_matrix(x: &Expectations, v: &Value, start: i64, step: i64) -> Result<(), String> {
    let Value::Matrix(series) = v else {
        return Err(format!("expected a matrix, got {}", describe(v)));
    };
    if x.ordered {
        return Err("expect ordered on a matrix result".into());
    }
    if x.scalar.is_some() {
        return Err("scalar expectation on a matrix result".into());
    }
    for w in series.windows(2) {
        if w[0].labels >= w[1].labels {
            return Err(format!("matrix not sorted by labels: {} before {}", w[0].labels, w[1].labels));
        }
    }
    let mut msg = String::new();
    for s in series {
        let got = merged_points(s);
        let Some(e) = x.series.iter().find(|e| e.labels == s.labels) else {
            let _ = write!(msg, "unexpected series {} {}; ", s.labels, show_got(&got));
            continue;
        };
        let expected: Vec<(i64, &Expected)> = e
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| !matches!(v, Expected::Missing))
            .map(|(k, v)| (start + k as i64 * step, v))
            .collect();
        let same =
            expected.len() == got.len() && expected.iter().zip(&got).all(|(a, b)| a.0 == b.0 && value_eq(b.1, a.1));
        if !same {
            let exp: Vec<String> = expected.iter().map(|(t, v)| format!("{t}:{}", show_expected(v))).collect();
            let _ = write!(msg, "{}: expected [{}], got {}; ", s.labels, exp.join(" "), show_got(&got));
        }
    }
    for e in &x.series {
        if !series.iter().any(|s| s.labels == e.labels) {
            let _ = write!(msg, "missing series {}; ", e.labels);
        }
    }
    if msg.is_empty() {
        Ok(())
    } else {
        Err(msg)
    }
}

fn cross_check(x: &Expectations, v: &Value, t: i64) -> Result<(), String> {
    let Value::Matrix(series) = v else { return Err(format!("range query gave {}", describe(v))) };
    for w in series.windows(2) {
        if w[0].labels >= w[1].labels {
            return Err("matrix not sorted by labels".into());
        }
    }
    if x.ordered {
        return Ok(());
    }
    let at_t: Vec<(&Labels, Got)> = series
        .iter()
        .filter_map(|s| merged_points(s).into_iter().find(|p| p.0 == t).map(|p| (&s.labels, p.1)))
        .collect();
    if let Some(e) = x.scalar {
        return match at_t.as_slice() {
            [(_, Got::F(v))] if float_eq(*v, e) => Ok(()),
            other => Err(format!("expected scalar {e}, got {other:?}")),
        };
    }
    compare_vector(x, &at_t, t)
}

/// A result series' points of both kinds, in time order.
fn merged_points(s: &strata_promql::Series) -> Vec<(i64, Got<'_>)> {
    let mut v: Vec<(i64, Got)> = s.points.iter().map(|p| (p.t, Got::F(p.f))).collect();
    v.extend(s.hists.iter().map(|p| (p.t, Got::H(&p.h))));
    v.sort_by_key(|p| p.0);
    v
}

fn show_got(v: &[(i64, Got)]) -> String {
    format!("[{}]", v.iter().map(|(t, g)| format!("{t}:{g}")).collect::<Vec<_>>().join(" "))
}
