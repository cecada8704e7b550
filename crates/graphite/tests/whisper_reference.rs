//! `render::fetch` against whisper itself (Debian's `python3-whisper`, the library carbon-cache
//! writes with and graphite-web reads through; `.ci/run` installs it): the same points, written
//! as carbon writes them (each as it arrives), fetched over many ranges, must give the same
//! start, end, step and values.

use std::process::Command;

use strata_graphite::render::{
    archive_value, fetch, fetch_from_tier, kept_archive, tier_fit, ArchiveNotKept, IntervalArchive, TierFit,
    TierInterval, TierNeeds,
};
use strata_graphite::schema::{Aggregation, Archive, Policy};

/// Debian's interpreter, which has the package (a `python3` earlier on the PATH may not).
fn python() -> String {
    for p in ["/usr/bin/python3", "python3"] {
        let ok = Command::new(p).args(["-c", "import whisper"]).output().is_ok_and(|o| o.status.success());
        if ok {
            return p.to_owned();
        }
    }
    panic!("python3 with the whisper module not found: install Debian's python3-whisper (.ci/run does)");
}

/// A small deterministic generator (xorshift), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const SCRIPT: &str = r#"
import json, sys, whisper
sc = json.load(open(sys.argv[1]))
path = sys.argv[2]
whisper.create(path, [tuple(a) for a in sc["archives"]], xFilesFactor=sc["xff"], aggregationMethod=sc["method"])
for t, v in sc["points"]:
    # As carbon-cache writes: each point soon after it arrives.
    whisper.update_many(path, [(t, v)], now=t + 1)
out = []
for f, u, n in sc["queries"]:
    r = whisper.fetch(path, f, u, now=n)
    out.append(None if r is None else [list(r[0]), r[1]])
print(json.dumps(out))
"#;

/// `n` fetches (from, until, now) around `end`: `now` up to an hour after it, spans picked
/// from `spans`, `from` up to an hour earlier still, `until` up to half the span before `now`.
fn random_queries(rng: &mut Rng, end: i64, spans: &[i64], n: usize) -> Vec<(i64, i64, i64)> {
    (0..n)
        .map(|_| {
            let now = end + rng.below(3600) as i64;
            let span = spans[rng.below(spans.len() as u64) as usize];
            let from = now - span - rng.below(3600) as i64;
            let until = now - rng.below(span as u64 / 2) as i64;
            (from, until, now)
        })
        .collect()
}

/// The aggregation methods compared, as whisper names them.
const METHODS: [(&str, Aggregation); 5] = [
    ("average", Aggregation::Average),
    ("sum", Aggregation::Sum),
    ("max", Aggregation::Max),
    ("last", Aggregation::Last),
    ("min", Aggregation::Min),
];

/// A policy of `archives` (step, points), as a whisper file created with them.
fn policy(archives: &[(i64, i64)], aggregation: Aggregation, x_files_factor: f64) -> Policy {
    let archives = archives.iter().map(|&(step_s, points)| Archive { step_s, points }).collect();
    Policy { archives, aggregation, x_files_factor }
}

type Answer = Option<strata_graphite::render::Fetched>;

/// Whisper's answers for `points` written as carbon writes them, to `queries` (from, until, now).
#[allow(clippy::too_many_arguments, reason = "one whisper file's whole scenario")]
fn whisper_answers(
    py: &str,
    dir: &std::path::Path,
    name: &str,
    archives: &[(i64, i64)],
    xff: f64,
    method: &str,
    points: &[(i64, f64)],
    queries: &[(i64, i64, i64)],
) -> Vec<serde_json::Value> {
    let script = dir.join("reference.py");
    if !script.exists() {
        std::fs::write(&script, SCRIPT).unwrap();
    }
    let scenario = serde_json::json!({
        "archives": archives, "xff": xff, "method": method,
        "points": points, "queries": queries,
    });
    let file = dir.join(format!("{name}.json"));
    std::fs::write(&file, scenario.to_string()).unwrap();
    let wsp = dir.join(format!("{name}.wsp"));
    let out = Command::new(py).arg(&script).arg(&file).arg(&wsp).output().unwrap();
    assert!(out.status.success(), "whisper: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Whether `got` is whisper's answer `want` (values within float rounding); the difference if not.
fn differs(got: &Answer, want: &serde_json::Value) -> Option<String> {
    if want.is_null() {
        return got.as_ref().map(|_| "whisper answered nothing, fetch did".to_owned());
    }
    let Some((start, end, step, values)) = got else { return Some("whisper answered, fetch did not".into()) };
    let info: Vec<i64> = want[0].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
    if (*start, *end, *step) != (info[0], info[1], info[2]) {
        return Some(format!("(start, end, step) {:?}, whisper {info:?}", (start, end, step)));
    }
    let wanted: Vec<Option<f64>> = want[1].as_array().unwrap().iter().map(serde_json::Value::as_f64).collect();
    if values.len() != wanted.len() {
        return Some(format!("{} values, whisper {}", values.len(), wanted.len()));
    }
    for (i, (g, w)) in values.iter().zip(&wanted).enumerate() {
        let same = match (g, w) {
            (Some(g), Some(w)) => (g - w).abs() <= 1e-9 * w.abs().max(1.0),
            (None, None) => true,
            _ => false,
        };
        if !same {
            return Some(format!("value {i} (at {}): fetch {g:?}, whisper {w:?}", start + i as i64 * step));
        }
    }
    None
}

/// Left-closed tier intervals of `step` seconds over `points` (seconds, in time order), with
/// the archive values a tier keeps for `policy` (`kept_archive`) computed as rollup does.
fn tier_intervals(points: &[(i64, f64)], step: i64, policy: &Policy) -> Vec<TierInterval> {
    let mut out: Vec<TierInterval> = Vec::new();
    for &(t, v) in points {
        let start = t - t.rem_euclid(step);
        match out.last_mut() {
            Some(i) if i.start == start => {
                i.count += 1;
                i.sum += v;
                i.min = i.min.min(v);
                i.max = i.max.max(v);
                i.last = v;
            }
            _ => out.push(TierInterval {
                start,
                count: 1,
                sum: v,
                min: v,
                max: v,
                last: v,
                archive: IntervalArchive::NotKept,
            }),
        }
    }
    if let Some(k) = kept_archive(policy, step) {
        for i in &mut out {
            let inside = points.iter().filter(|p| p.0 >= i.start && p.0 < i.start + step).map(|&(t, v)| (t * 1000, v));
            i.archive =
                archive_value(policy, k, i.start, inside).map_or(IntervalArchive::Unknown, IntervalArchive::Value);
        }
    }
    out
}

/// Whisper files read over their coarse archives answer from a left-closed rollup tier what
/// they answer from every point: exactly for tiers no coarser than the second archive (the
/// points one per finest interval, several stamped exactly on an interval's start, some
/// missing), for a tier whose interval is a coarser archive's step exactly from the archive
/// values it keeps (and, read strictly, refused where it has none), and for other coarser tiers
/// exactly where `tier_fit` says the cascade does not matter (no `xFilesFactor`, a method other
/// than `average`), close otherwise.
#[test]
fn tier_reads_answer_what_whisper_answers() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x51_7cc1_b727_220a);
    // Each schema's archives (step, points) and the tier steps read for it.
    type Case = (&'static [(i64, i64)], &'static [i64]);
    let schemas: [Case; 2] = [
        (&[(10, 360), (60, 1440), (300, 2016)], &[5, 10, 30, 60, 300]),
        (&[(15, 240), (60, 120), (600, 144)], &[15, 60, 300, 600]),
    ];
    let (mut exact, mut approximate, mut approximate_same, mut archived) = (0, 0, 0, 0);
    for (case, (archives, tiers)) in schemas.iter().enumerate() {
        for (m, &(method, aggregation)) in METHODS.iter().enumerate() {
            let xff = [0.0, 0.5, 0.0, 0.3][(case + m) % 4];
            let step0 = archives[0].0;
            let start: i64 = 1_700_000_000 - 1_700_000_000 % step0;
            let mut points: Vec<(i64, f64)> = Vec::new();
            let mut t = start;
            while t < start + 8 * 3600 {
                // Most slots known; a quarter of the points on the slot's start; an hour missing.
                if rng.below(10) >= 2 && !(start + 3 * 3600..start + 4 * 3600).contains(&t) {
                    let v = (rng.below(2_000_000) as f64 - 1_000_000.0) / 1000.0;
                    let at = if rng.below(4) == 0 { t } else { t + rng.below(step0 as u64) as i64 };
                    points.push((at, v));
                }
                t += step0;
            }
            let end = points.last().unwrap().0;
            let queries = random_queries(&mut rng, end, &[3600, 3 * 3600, 12 * 3600, 3 * 86_400], 16);
            let name = format!("tier-{case}-{m}");
            let answers = whisper_answers(&py, dir.path(), &name, archives, xff, method, &points, &queries);
            let policy = policy(archives, aggregation, xff);
            let samples: Vec<(i64, f64)> = points.iter().map(|&(t, v)| (t * 1000, v)).collect();
            for &tier in tiers.iter() {
                // Only the aggregates `TierNeeds` names are read from a tier: the rest zeroed.
                let needs = TierNeeds::of(&policy, tier, false);
                let intervals: Vec<TierInterval> = tier_intervals(&points, tier, &policy)
                    .into_iter()
                    .map(|i| TierInterval {
                        sum: if needs.sum { i.sum } else { 0.0 },
                        min: if needs.min { i.min } else { 0.0 },
                        max: if needs.max { i.max } else { 0.0 },
                        last: if needs.last { i.last } else { 0.0 },
                        ..i
                    })
                    .collect();
                for (q, want) in queries.iter().zip(&answers) {
                    let Some(fit) = tier_fit(&policy, tier, q.0, q.1, q.2) else { continue };
                    let got = fetch_from_tier(&intervals, tier, &policy, *q, true).expect("every archive value kept");
                    let ctx = format!("schema {archives:?}, tier {tier}s, {method}, xff {xff}, query {q:?}");
                    let difference = differs(&got, want);
                    // Raw samples too, points on interval starts included.
                    let raw = differs(&fetch(&samples, &policy, q.0, q.1, q.2), want);
                    assert_eq!(raw, None, "raw samples, {ctx}");
                    match fit {
                        TierFit::Exact => {
                            assert_eq!(difference, None, "{ctx}");
                            exact += 1;
                        }
                        TierFit::Approximate if xff == 0.0 && aggregation != Aggregation::Average => {
                            assert_eq!(difference, None, "{ctx}");
                            approximate_same += 1;
                        }
                        TierFit::Approximate => approximate += 1,
                        TierFit::Archive => {
                            assert_eq!(difference, None, "{ctx}");
                            archived += 1;
                            // Without archive values (data rolled up before they were kept): a
                            // strict read is refused, a lenient one answers as an approximate
                            // tier, which is whisper's where the cascade does not matter.
                            let bare: Vec<TierInterval> = intervals
                                .iter()
                                .map(|i| TierInterval { archive: IntervalArchive::NotKept, ..*i })
                                .collect();
                            let lenient = fetch_from_tier(&bare, tier, &policy, *q, false).expect("lenient");
                            if xff == 0.0 && aggregation != Aggregation::Average {
                                assert_eq!(differs(&lenient, want), None, "lenient, {ctx}");
                            }
                            let answered = lenient.is_some_and(|l| l.3.iter().any(Option::is_some));
                            if answered {
                                assert_eq!(
                                    fetch_from_tier(&bare, tier, &policy, *q, true),
                                    Err(ArchiveNotKept),
                                    "{ctx}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        exact > 100 && approximate_same > 10 && approximate > 10 && archived > 20,
        "{exact} {approximate_same} {approximate} {archived}"
    );
}

#[test]
fn fetch_answers_what_whisper_answers_for_the_same_points() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let schemas: [&[(i64, i64)]; 3] =
        [&[(10, 360), (60, 1440), (300, 2016)], &[(60, 600)], &[(15, 240), (60, 120), (600, 144)]];
    let mut compared = 0;
    for (case, archives) in schemas.iter().enumerate() {
        for (m, &(method, aggregation)) in METHODS.iter().enumerate() {
            let xff = [0.0, 0.5, 1.0, 0.3][(case + m) % 4];
            let start: i64 = 1_700_000_000 + rng.below(1000) as i64;
            let step0 = archives[0].0;
            // Six hours of points one step apart, some missing, some moved inside their
            // interval, now and then two in one interval (the later one wins in both).
            let mut points: Vec<(i64, f64)> = Vec::new();
            let mut t = start;
            while t < start + 6 * 3600 {
                if rng.below(10) >= 3 {
                    let v = (rng.below(2_000_000) as f64 - 1_000_000.0) / 1000.0;
                    let at = t + rng.below(step0 as u64) as i64;
                    if points.last().is_none_or(|p| p.0 < at) {
                        points.push((at, v));
                    }
                }
                t += step0;
            }
            let end = points.last().unwrap().0;
            let mut queries = random_queries(&mut rng, end, &[600, 3600, 3 * 3600, 12 * 3600, 3 * 86_400], 12);
            queries.push((end + 100_000_000, end + 100_000_600, end));
            let name = format!("case-{case}-{m}");
            let answers = whisper_answers(&py, dir.path(), &name, archives, xff, method, &points, &queries);
            let policy = policy(archives, aggregation, xff);
            let samples: Vec<(i64, f64)> = points.iter().map(|&(t, v)| (t * 1000, v)).collect();
            for (q, want) in queries.iter().zip(&answers) {
                let got = fetch(&samples, &policy, q.0, q.1, q.2);
                let ctx = format!("schema {archives:?}, {method}, xff {xff}, query (from, until, now) {q:?}");
                assert_eq!(differs(&got, want), None, "{ctx}");
                compared += 1;
            }
        }
    }
    assert!(compared > 100, "only {compared} answers compared");
}
