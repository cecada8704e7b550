//! `render::fetch` against whisper itself (Debian's `python3-whisper`, the library carbon-cache
//! writes with and graphite-web reads through; `.ci/run` installs it): the same points, written
//! as carbon writes them (each as it arrives), fetched over many ranges, must give the same
//! start, end, step and values.

use std::process::Command;

use strata_graphite::render::fetch;
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

#[test]
fn fetch_answers_what_whisper_answers_for_the_same_points() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("reference.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let schemas: [&[(i64, i64)]; 3] =
        [&[(10, 360), (60, 1440), (300, 2016)], &[(60, 600)], &[(15, 240), (60, 120), (600, 144)]];
    let methods = [
        ("average", Aggregation::Average),
        ("sum", Aggregation::Sum),
        ("max", Aggregation::Max),
        ("last", Aggregation::Last),
        ("min", Aggregation::Min),
    ];
    let mut compared = 0;
    for (case, archives) in schemas.iter().enumerate() {
        for (m, &(method, aggregation)) in methods.iter().enumerate() {
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
            let mut queries = Vec::new();
            for _ in 0..12 {
                let now = end + rng.below(3600) as i64;
                let span = [600, 3600, 3 * 3600, 12 * 3600, 3 * 86_400][rng.below(5) as usize];
                let from = now - span - rng.below(3600) as i64;
                let until = now - rng.below(span as u64 / 2) as i64;
                queries.push((from, until, now));
            }
            queries.push((end + 100_000_000, end + 100_000_600, end));
            let scenario = serde_json::json!({
                "archives": archives, "xff": xff, "method": method,
                "points": points, "queries": queries,
            });
            let file = dir.path().join(format!("case-{case}-{m}.json"));
            std::fs::write(&file, scenario.to_string()).unwrap();
            let wsp = dir.path().join(format!("case-{case}-{m}.wsp"));
            let out = Command::new(&py).arg(&script).arg(&file).arg(&wsp).output().unwrap();
            assert!(out.status.success(), "whisper: {}", String::from_utf8_lossy(&out.stderr));
            let answers: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
            let policy = Policy {
                archives: archives.iter().map(|&(step_s, points)| Archive { step_s, points }).collect(),
                aggregation,
                x_files_factor: xff,
            };
            let samples: Vec<(i64, f64)> = points.iter().map(|&(t, v)| (t * 1000, v)).collect();
            for (q, want) in queries.iter().zip(&answers) {
                let got = fetch(&samples, &policy, q.0, q.1, q.2);
                let ctx = format!("schema {archives:?}, {method}, xff {xff}, query (from, until, now) {q:?}");
                if want.is_null() {
                    assert_eq!(got, None, "{ctx}");
                    continue;
                }
                let (start, end, step, values) =
                    got.unwrap_or_else(|| panic!("{ctx}: whisper answered, fetch did not"));
                let info: Vec<i64> = want[0].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
                assert_eq!((start, end, step), (info[0], info[1], info[2]), "{ctx}");
                let wanted: Vec<Option<f64>> =
                    want[1].as_array().unwrap().iter().map(serde_json::Value::as_f64).collect();
                assert_eq!(values.len(), wanted.len(), "{ctx}");
                for (i, (g, w)) in values.iter().zip(&wanted).enumerate() {
                    let same = match (g, w) {
                        (Some(g), Some(w)) => (g - w).abs() <= 1e-9 * w.abs().max(1.0),
                        (None, None) => true,
                        _ => false,
                    };
                    assert!(same, "{ctx}: value {i} (at {}): fetch {g:?}, whisper {w:?}", start + i as i64 * step);
                }
                compared += 1;
            }
        }
    }
    assert!(compared > 100, "only {compared} answers compared");
}
