//! Graphite's retention schemas: `storage-schemas.conf` (which resolutions a path keeps, and
//! for how long) and `storage-aggregation.conf` (how a coarser resolution is computed from a
//! finer one, and how many known values it needs: `xFilesFactor`), in carbon's formats. The
//! first section whose `pattern` (a regular expression, searched in the path) matches wins.
//!
//! ```ini
//! [collectd]
//! pattern = ^collectd\.
//! retentions = 10s:1d,1m:30d,10m:5y
//!
//! [default]
//! pattern = .*
//! retentions = 60s:14d
//! ```
//!
//! A retention is `precision:duration`, each a number with an optional unit (`s`, `m`/`min`,
//! `h`, `d`, `w`, `y`; a bare number of the precision is seconds, a bare duration is a number
//! of points, as carbon reads them).

use std::fmt;

use regex::Regex;

/// One resolution: a point every `step_s` seconds, kept for `points` points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Archive {
    pub step_s: i64,
    pub points: i64,
}

impl Archive {
    pub fn retention_s(&self) -> i64 {
        self.step_s * self.points
    }
}

/// How a coarser archive's point is made from the finer archive's points in its interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregation {
    Average,
    Sum,
    Min,
    Max,
    Last,
    /// Whisper's `avg_zero`: unknown values count as 0.
    AvgZero,
    AbsMax,
    AbsMin,
}

impl Aggregation {
    pub fn parse(s: &str) -> Option<Aggregation> {
        Some(match s {
            "average" | "avg" => Aggregation::Average,
            "sum" => Aggregation::Sum,
            "min" => Aggregation::Min,
            "max" => Aggregation::Max,
            "last" => Aggregation::Last,
            "avg_zero" => Aggregation::AvgZero,
            "absmax" => Aggregation::AbsMax,
            "absmin" => Aggregation::AbsMin,
            _ => return None,
        })
    }

    /// Aggregates the known values of an interval of `slots` slots, whisper's way.
    pub fn apply(self, known: &[f64], slots: usize) -> f64 {
        match self {
            Aggregation::Average => known.iter().sum::<f64>() / known.len() as f64,
            Aggregation::Sum => known.iter().sum(),
            Aggregation::Min => known.iter().copied().fold(f64::INFINITY, f64::min),
            Aggregation::Max => known.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Aggregation::Last => *known.last().expect("aggregated only when a value is known"),
            Aggregation::AvgZero => known.iter().sum::<f64>() / slots as f64,
            Aggregation::AbsMax => known.iter().copied().fold(0.0, |a: f64, b| if b.abs() > a.abs() { b } else { a }),
            Aggregation::AbsMin => {
                known.iter().copied().reduce(|a, b| if b.abs() < a.abs() { b } else { a }).expect("a value is known")
            }
        }
    }
}

/// What `storage-schemas.conf` and `storage-aggregation.conf` say for one path.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Finest first, as carbon requires.
    pub archives: Vec<Archive>,
    pub aggregation: Aggregation,
    pub x_files_factor: f64,
}

impl Policy {
    pub fn max_retention_s(&self) -> i64 {
        self.archives.iter().map(Archive::retention_s).max().unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SchemaError {
    pub file: &'static str,
    pub line: usize,
    pub reason: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} line {}: {}", self.file, self.line, self.reason)
    }
}

#[derive(Debug, Clone)]
struct Rule<T> {
    name: String,
    pattern: Regex,
    value: T,
}

/// Both files, parsed; `policy` answers for a path.
#[derive(Debug, Clone)]
pub struct Schemas {
    retentions: Vec<Rule<Vec<Archive>>>,
    aggregations: Vec<Rule<(Aggregation, f64)>>,
    default_archives: Vec<Archive>,
}

/// A point a minute for 15 days (Strata's default retention), when no schema is configured or
/// none matches.
pub const DEFAULT_ARCHIVES: [Archive; 1] = [Archive { step_s: 60, points: 15 * 24 * 60 }];

impl Default for Schemas {
    fn default() -> Self {
        Schemas { retentions: Vec::new(), aggregations: Vec::new(), default_archives: DEFAULT_ARCHIVES.to_vec() }
    }
}

/// One `[name]` section: its `key = value` settings, each with its line.
struct Section {
    file: &'static str,
    line: usize,
    name: String,
    settings: Vec<(usize, String, String)>,
}

impl Section {
    fn err(&self, line: usize, reason: String) -> SchemaError {
        SchemaError { file: self.file, line, reason }
    }

    /// The setting `key`: its line and value.
    fn get(&self, key: &str) -> Option<(usize, &str)> {
        self.settings.iter().find(|(_, k, _)| k == key).map(|(l, _, v)| (*l, v.as_str()))
    }

    /// The `pattern` every section has, compiled.
    fn pattern(&self) -> Result<Regex, SchemaError> {
        let (line, p) = self
            .get("pattern")
            .ok_or_else(|| self.err(self.line, format!("section [{}] has no pattern", self.name)))?;
        Regex::new(p).map_err(|e| self.err(line, format!("pattern: {e}")))
    }
}

/// The `[name]` sections of a file; `#` and `;` start comments.
fn sections(text: &str, file: &'static str) -> Result<Vec<Section>, SchemaError> {
    let mut out: Vec<Section> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let err = |reason: String| SchemaError { file, line: i + 1, reason };
        if let Some(name) = line.strip_prefix('[') {
            let name = name.strip_suffix(']').ok_or_else(|| err(format!("section header {line:?} has no ']'")))?;
            out.push(Section { file, line: i + 1, name: name.trim().to_owned(), settings: Vec::new() });
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| err(format!("expected key = value, found {line:?}")))?;
        let section = out.last_mut().ok_or_else(|| err("a setting before any [section]".into()))?;
        section.settings.push((i + 1, k.trim().to_owned(), v.trim().to_owned()));
    }
    Ok(out)
}

/// Seconds in a unit as carbon names them.
fn unit_seconds(unit: &str) -> Option<i64> {
    Some(match unit {
        "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "m" | "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hour" | "hours" => 3600,
        "d" | "day" | "days" => 86_400,
        "w" | "week" | "weeks" => 7 * 86_400,
        "y" | "year" | "years" => 365 * 86_400,
        _ => return None,
    })
}

/// `10s:1d` (or `10:8640`, points) to an archive.
pub fn parse_retention(s: &str) -> Result<Archive, String> {
    let (p, d) = s.split_once(':').ok_or_else(|| format!("retention {s:?} is not precision:duration"))?;
    fn split(x: &str) -> (Option<i64>, &str) {
        let at = x.find(|c: char| !c.is_ascii_digit()).unwrap_or(x.len());
        let n = x[..at].parse::<i64>().ok().filter(|&n| n > 0);
        (n, &x[at..])
    }
    let (pn, pu) = split(p.trim());
    let step_s = match (pn, pu) {
        (Some(n), "") => n,
        (Some(n), u) => n * unit_seconds(u).ok_or_else(|| format!("unknown unit {u:?} in {s:?}"))?,
        _ => return Err(format!("precision {p:?} of {s:?} is not a positive number")),
    };
    let (dn, du) = split(d.trim());
    let points = match (dn, du) {
        (Some(n), "") => n,
        (Some(n), u) => n * unit_seconds(u).ok_or_else(|| format!("unknown unit {u:?} in {s:?}"))? / step_s,
        _ => return Err(format!("duration {d:?} of {s:?} is not a positive number")),
    };
    if points == 0 {
        return Err(format!("{s:?} keeps no point"));
    }
    Ok(Archive { step_s, points })
}

impl Schemas {
    /// Parses `storage-schemas.conf` and, if given, `storage-aggregation.conf`.
    pub fn parse(schemas: &str, aggregation: Option<&str>) -> Result<Schemas, SchemaError> {
        let mut retentions = Vec::new();
        for sec in sections(schemas, "storage-schemas.conf")? {
            let pattern = sec.pattern()?;
            let (rl, r) = sec
                .get("retentions")
                .ok_or_else(|| sec.err(sec.line, format!("section [{}] has no retentions", sec.name)))?;
            let archives = r
                .split(',')
                .map(|x| parse_retention(x.trim()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| sec.err(rl, e))?;
            for w in archives.windows(2) {
                // Carbon's (whisper's) rules: coarser archives after finer ones, each step a
                // multiple of the one before, and each keeping longer.
                if w[1].step_s <= w[0].step_s
                    || w[1].step_s % w[0].step_s != 0
                    || w[1].retention_s() <= w[0].retention_s()
                {
                    return Err(sec.err(rl, format!("archives {r:?}: each must be coarser (a multiple of the step before) and kept longer than the one before")));
                }
            }
            retentions.push(Rule { name: sec.name, pattern, value: archives });
        }
        let mut aggregations = Vec::new();
        for sec in sections(aggregation.unwrap_or(""), "storage-aggregation.conf")? {
            let pattern = sec.pattern()?;
            let xff = match sec.get("xFilesFactor") {
                None => 0.5,
                Some((l, v)) => v
                    .parse::<f64>()
                    .ok()
                    .filter(|x| (0.0..=1.0).contains(x))
                    .ok_or_else(|| sec.err(l, format!("xFilesFactor {v:?} is not a number in [0, 1]")))?,
            };
            let method = match sec.get("aggregationMethod") {
                None => Aggregation::Average,
                Some((l, v)) => {
                    Aggregation::parse(v).ok_or_else(|| sec.err(l, format!("unknown aggregationMethod {v:?}")))?
                }
            };
            aggregations.push(Rule { name: sec.name, pattern, value: (method, xff) });
        }
        Ok(Schemas { retentions, aggregations, default_archives: DEFAULT_ARCHIVES.to_vec() })
    }

    /// The policy for `path`: the first matching section of each file; carbon's defaults
    /// (average, 0.5) without an aggregation match, `DEFAULT_ARCHIVES` without a schema match.
    pub fn policy(&self, path: &str) -> Policy {
        let archives = self
            .retentions
            .iter()
            .find(|r| r.pattern.is_match(path))
            .map_or_else(|| self.default_archives.clone(), |r| r.value.clone());
        let (aggregation, x_files_factor) = self
            .aggregations
            .iter()
            .find(|r| r.pattern.is_match(path))
            .map_or((Aggregation::Average, 0.5), |r| r.value);
        Policy { archives, aggregation, x_files_factor }
    }

    /// Every archive after a section's first (the coarse ones, which whisper computes from
    /// finer ones), one per step, kept as long as the longest-kept archive of that step: what
    /// the rollup tiers answering `/render` for these schemas must hold. Finest first.
    pub fn coarse_archives(&self) -> Vec<Archive> {
        let mut longest: std::collections::BTreeMap<i64, i64> = std::collections::BTreeMap::new();
        let all = self.retentions.iter().map(|r| &r.value).chain(std::iter::once(&self.default_archives));
        for a in all.flat_map(|archives| archives.iter().skip(1)) {
            let keep = longest.entry(a.step_s).or_default();
            *keep = (*keep).max(a.retention_s());
        }
        longest.into_iter().map(|(step_s, keep)| Archive { step_s, points: (keep + step_s - 1) / step_s }).collect()
    }

    /// Each section's name and finest archive (read from raw samples, so kept only as long as
    /// the raw data).
    pub fn finest_archives(&self) -> Vec<(&str, Archive)> {
        self.retentions.iter().map(|r| (r.name.as_str(), r.value[0])).collect()
    }

    /// Every policy a path can get: each schema section's archives (and the default ones)
    /// with each aggregation section's method (and carbon's default, average at 0.5). A
    /// reader asks these whether any path could be answered some way before it looks at the
    /// paths.
    pub fn policies(&self) -> Vec<Policy> {
        let archives = self.retentions.iter().map(|r| &r.value).chain(std::iter::once(&self.default_archives));
        let aggregations: Vec<(Aggregation, f64)> =
            self.aggregations.iter().map(|r| r.value).chain(std::iter::once((Aggregation::Average, 0.5))).collect();
        archives
            .flat_map(|a| {
                aggregations.iter().map(|&(aggregation, x_files_factor)| Policy {
                    archives: a.clone(),
                    aggregation,
                    x_files_factor,
                })
            })
            .collect()
    }

    /// The names of the sections, for the log.
    pub fn section_names(&self) -> Vec<&str> {
        self.retentions.iter().map(|r| r.name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carbons_files_parse_and_the_first_match_wins() {
        let s = Schemas::parse(
            "# comment\n[carbon]\npattern = ^carbon\\.\nretentions = 60:90d\n\n[collectd]\npattern = ^collectd\\.\nretentions = 10s:1d,1m:30d,10m:5y\n[default]\npattern = .*\nretentions = 1min:14d\n",
            Some("[min]\npattern = \\.min$\nxFilesFactor = 0.1\naggregationMethod = min\n[default_average]\npattern = .*\nxFilesFactor = 0.5\naggregationMethod = average\n"),
        )
        .unwrap();
        let p = s.policy("collectd.host.cpu.min");
        assert_eq!(
            p.archives,
            [
                Archive { step_s: 10, points: 8640 },
                Archive { step_s: 60, points: 43200 },
                Archive { step_s: 600, points: 262_800 }
            ]
        );
        assert_eq!((p.aggregation, p.x_files_factor), (Aggregation::Min, 0.1));
        assert_eq!(s.policy("carbon.agents.x").archives, [Archive { step_s: 60, points: 90 * 1440 }]);
        assert_eq!(s.policy("other").archives, [Archive { step_s: 60, points: 14 * 1440 }]);
        assert_eq!(s.policy("other").aggregation, Aggregation::Average);
        assert_eq!(Schemas::default().policy("x").archives, DEFAULT_ARCHIVES);
        // The coarse archives of all sections, per step the longest kept.
        assert_eq!(
            s.coarse_archives(),
            [Archive { step_s: 60, points: 43200 }, Archive { step_s: 600, points: 262_800 }]
        );
        assert_eq!(Schemas::default().coarse_archives(), []);
        // Every path's policy is among `policies`.
        let all = s.policies();
        assert_eq!(all.len(), 4 * 3, "3 sections and the default, 2 aggregation sections and the default");
        for path in ["collectd.host.cpu.min", "carbon.agents.x", "other", "other.min"] {
            assert!(all.contains(&s.policy(path)), "{path}");
        }
    }

    #[test]
    fn mistakes_name_the_file_and_line() {
        let e = Schemas::parse("[a]\npattern = .*\nretentions = 10s:1x\n", None).unwrap_err();
        assert_eq!((e.file, e.line), ("storage-schemas.conf", 3));
        assert!(e.reason.contains("unknown unit"), "{e}");
        let e = Schemas::parse("[a]\npattern = (\nretentions = 10s:1d\n", None).unwrap_err();
        assert_eq!(e.line, 2);
        let e = Schemas::parse("[a]\npattern = .*\nretentions = 1m:1d,10s:30d\n", None).unwrap_err();
        assert!(e.reason.contains("coarser"), "{e}");
        let e = Schemas::parse("[a]\npattern = .*\n", None).unwrap_err();
        assert!(e.reason.contains("no retentions"), "{e}");
        let e = Schemas::parse("", Some("[a]\npattern = .*\naggregationMethod = mean\n")).unwrap_err();
        assert_eq!((e.file, e.line), ("storage-aggregation.conf", 3));
        assert!(Schemas::parse("pattern = x\n", None).is_err());
    }

    #[test]
    fn aggregations_as_whisper_computes_them() {
        let v = [1.0, -4.0, 2.0];
        assert_eq!(Aggregation::Average.apply(&v, 4), -1.0 / 3.0);
        assert_eq!(Aggregation::AvgZero.apply(&v, 4), -0.25);
        assert_eq!(Aggregation::Sum.apply(&v, 4), -1.0);
        assert_eq!(Aggregation::Min.apply(&v, 4), -4.0);
        assert_eq!(Aggregation::Max.apply(&v, 4), 2.0);
        assert_eq!(Aggregation::Last.apply(&v, 4), 2.0);
        assert_eq!(Aggregation::AbsMax.apply(&v, 4), -4.0);
        assert_eq!(Aggregation::AbsMin.apply(&v, 4), 1.0);
    }
}
