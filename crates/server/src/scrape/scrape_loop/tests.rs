use super::*;
use crate::scrape::config::{resolve, GlobalConfig, ScrapeConfig};
use crate::scrape::discovery::static_groups;
use crate::scrape::target::targets_of;
use strata_model::{is_stale_nan, Matcher};
use strata_tsdb::DbOptions;

struct Fixture {
    _dir: tempfile::TempDir,
    db: Db,
    state: LoopState,
    stats: ScrapeStats,
}

fn fixture(job_yaml: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(dir.path(), DbOptions { compact_interval: None, ..Default::default() }).unwrap();
    let c: ScrapeConfig = yaml_serde::from_str(job_yaml).unwrap();
    let job = resolve(&GlobalConfig::default(), &[c], std::path::Path::new("/")).unwrap().remove(0);
    let (mut targets, _) = targets_of(&job, &static_groups(&job.static_configs));
    let target = targets.remove(0);
    let state = LoopState::new(Arc::new(job), Arc::new(target), 600_000);
    Fixture { _dir: dir, db, state, stats: ScrapeStats::default() }
}

const T0: i64 = 1_700_000_000_000;

impl Fixture {
    fn scrape(&mut self, t: i64, body: &str) -> (Option<String>, ScrapeCounts) {
        self.state.ingest(&self.db, &self.stats, t, Ok((body.as_bytes(), Format::Prometheus)), Duration::from_millis(5))
    }

    fn fail(&mut self, t: i64) -> (Option<String>, ScrapeCounts) {
        self.state.ingest(&self.db, &self.stats, t, Err("connection refused".into()), Duration::from_millis(5))
    }

    /// Every series with its samples (stale markers as the string "stale").
    fn dump(&self) -> Vec<(String, Vec<(i64, String)>)> {
        let q = self.db.querier(0, i64::MAX);
        let mut out = Vec::new();
        for s in q.select(&[Matcher::new(strata_model::MatchOp::RegexMatch, "__name__", ".+").unwrap()]).unwrap() {
            let samples = s
                .samples()
                .into_iter()
                .map(|x| (x.t, if is_stale_nan(x.v) { "stale".to_owned() } else { x.v.to_string() }))
                .collect();
            out.push((s.labels.to_string(), samples));
        }
        out
    }

    fn series(&self, labels: &str) -> Vec<(i64, String)> {
        self.dump()
            .into_iter()
            .find(|(l, _)| l == labels)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("no {labels} in {:#?}", self.dump()))
    }
}

const JOB: &str = "job_name: node\nstatic_configs:\n  - targets: ['h:1']\n";

#[test]
fn samples_get_target_labels_and_report_series() {
    let mut f = fixture(JOB);
    let (err, counts) = f.scrape(T0, "# TYPE a counter\n# HELP a Things.\na{x=\"1\"} 1\na{x=\"2\"} 2\nb 3\n");
    assert_eq!(err, None);
    assert_eq!(counts, ScrapeCounts { scraped: 3, post_relabel: 3, series_added: 3 });
    assert_eq!(f.series("a{instance=\"h:1\", job=\"node\", x=\"1\"}"), [(T0, "1".to_owned())]);
    assert_eq!(f.series("up{instance=\"h:1\", job=\"node\"}"), [(T0, "1".to_owned())]);
    assert_eq!(f.series("scrape_samples_scraped{instance=\"h:1\", job=\"node\"}"), [(T0, "3".to_owned())]);
    assert_eq!(f.series("scrape_series_added{instance=\"h:1\", job=\"node\"}"), [(T0, "3".to_owned())]);
    assert_eq!(f.series("scrape_duration_seconds{instance=\"h:1\", job=\"node\"}"), [(T0, "0.005".to_owned())]);
    let md = f.state.metadata.lock().get("a").cloned().unwrap();
    assert_eq!(md, Metadata { kind: "counter", help: "Things.".into(), unit: String::new() });

    // Changed metadata is picked up; a malformed comment fails the scrape with its line.
    f.scrape(T0 + 5_000, "# TYPE a gauge\n# HELP a Other\\nthings.\na{x=\"1\"} 1\na{x=\"2\"} 2\nb 3\n");
    let md = f.state.metadata.lock().get("a").cloned().unwrap();
    assert_eq!(md, Metadata { kind: "gauge", help: "Other\nthings.".into(), unit: String::new() });
    let (err, _) = f.scrape(T0 + 6_000, "a{x=\"1\"} 1\n# TYPE a wat\n");
    assert_eq!(err.as_deref(), Some("parse error: line 2: unknown metric type \"wat\""));

    // The second scrape finds every series in the cache: nothing new.
    let (_, counts) = f.scrape(T0 + 15_000, "a{x=\"1\"} 10\na{x=\"2\"} 20\nb 30\n");
    assert_eq!(counts.series_added, 0);
    assert_eq!(f.state.cached(), 3);
    let b: Vec<(i64, &str)> = vec![(T0, "3"), (T0 + 5_000, "3"), (T0 + 6_000, "stale"), (T0 + 15_000, "30")];
    let got = f.series("b{instance=\"h:1\", job=\"node\"}");
    assert_eq!(got.iter().map(|(t, v)| (*t, v.as_str())).collect::<Vec<_>>(), b);
}

#[test]
fn a_vanished_series_and_a_failed_scrape_are_marked_stale() {
    let mut f = fixture(JOB);
    f.scrape(T0, "a 1\nb 2\n");
    f.scrape(T0 + 10_000, "a 1\n");
    assert_eq!(
        f.series("b{instance=\"h:1\", job=\"node\"}"),
        [(T0, "2".to_owned()), (T0 + 10_000, "stale".to_owned())]
    );
    // Not marked again on the next scrape; and it may come back.
    f.scrape(T0 + 20_000, "a 1\nb 5\n");
    assert_eq!(
        f.series("b{instance=\"h:1\", job=\"node\"}"),
        [(T0, "2".to_owned()), (T0 + 10_000, "stale".to_owned()), (T0 + 20_000, "5".to_owned())]
    );
    let (err, _) = f.fail(T0 + 30_000);
    assert_eq!(err.as_deref(), Some("connection refused"));
    assert_eq!(f.series("a{instance=\"h:1\", job=\"node\"}").last().unwrap(), &(T0 + 30_000, "stale".to_owned()));
    assert_eq!(f.series("b{instance=\"h:1\", job=\"node\"}").last().unwrap(), &(T0 + 30_000, "stale".to_owned()));
    assert_eq!(f.series("up{instance=\"h:1\", job=\"node\"}").last().unwrap(), &(T0 + 30_000, "0".to_owned()));
    // A second failure writes no second marker.
    f.fail(T0 + 40_000);
    assert_eq!(f.series("a{instance=\"h:1\", job=\"node\"}").len(), 4);
    // The target's end: live series and the report series get a marker.
    f.scrape(T0 + 50_000, "a 7\n");
    f.state.end_of_run_staleness(&f.db, T0 + 55_000);
    assert_eq!(f.series("a{instance=\"h:1\", job=\"node\"}").last().unwrap(), &(T0 + 55_000, "stale".to_owned()));
    assert_eq!(f.series("up{instance=\"h:1\", job=\"node\"}").last().unwrap(), &(T0 + 55_000, "stale".to_owned()));
}

#[test]
fn a_bad_body_keeps_nothing_of_the_scrape() {
    let mut f = fixture(JOB);
    f.scrape(T0, "a 1\n");
    let (err, _) = f.scrape(T0 + 10_000, "a 2\nb{oops 1\n");
    assert!(err.as_deref().unwrap().starts_with("parse error: line 2:"), "{err:?}");
    // `a 2` was not kept; `a` was marked stale because the scrape failed.
    assert_eq!(
        f.series("a{instance=\"h:1\", job=\"node\"}"),
        [(T0, "1".to_owned()), (T0 + 10_000, "stale".to_owned())]
    );
    assert_eq!(f.series("up{instance=\"h:1\", job=\"node\"}").last().unwrap().1, "0");
}

#[test]
fn explicit_timestamps_are_honored_and_not_marked_stale() {
    let mut f = fixture(JOB);
    f.scrape(T0, "a 1 1699999999000\nb 2\n");
    f.scrape(T0 + 10_000, "");
    assert_eq!(f.series("a{instance=\"h:1\", job=\"node\"}"), [(1_699_999_999_000, "1".to_owned())]);
    assert_eq!(f.series("b{instance=\"h:1\", job=\"node\"}")[1], (T0 + 10_000, "stale".to_owned()));

    let mut f = fixture("job_name: node\nhonor_timestamps: false\nstatic_configs:\n  - targets: ['h:1']\n");
    f.scrape(T0, "a 1 1699999999000\n");
    assert_eq!(f.series("a{instance=\"h:1\", job=\"node\"}"), [(T0, "1".to_owned())]);
}

#[test]
fn metric_relabeling_drops_and_rewrites_and_limits_fail_the_scrape() {
    let mut f = fixture(concat!(
        "job_name: node\nsample_limit: 2\nstatic_configs:\n  - targets: ['h:1']\n",
        "metric_relabel_configs:\n  - source_labels: [__name__]\n    regex: go_.*\n    action: drop\n",
        "  - source_labels: [mode]\n    target_label: mode\n    action: uppercase\n",
    ));
    let (err, counts) = f.scrape(T0, "go_gc 1\ncpu{mode=\"idle\"} 2\ngo_x 3\nmem 4\n");
    assert_eq!(err, None);
    assert_eq!(counts, ScrapeCounts { scraped: 4, post_relabel: 2, series_added: 2 });
    assert_eq!(f.series("cpu{instance=\"h:1\", job=\"node\", mode=\"IDLE\"}").len(), 1);
    assert!(!f.dump().iter().any(|(l, _)| l.starts_with("go_")));
    assert_eq!(f.series("scrape_samples_post_metric_relabeling{instance=\"h:1\", job=\"node\"}")[0].1, "2");

    // Three samples left after relabeling exceed sample_limit 2: the scrape fails, nothing kept.
    let (err, _) = f.scrape(T0 + 10_000, "go_gc 1\ncpu{mode=\"idle\"} 2\nmem 4\nswap 5\n");
    assert_eq!(err.as_deref(), Some("sample limit exceeded (3 samples, limit 2)"));
    assert!(!f.dump().iter().any(|(l, _)| l.starts_with("swap")));
    assert_eq!(f.series("mem{instance=\"h:1\", job=\"node\"}")[1], (T0 + 10_000, "stale".to_owned()));

    // A new series that relabeling drops does not count against the limit, wherever it is.
    let (err, counts) = f.scrape(T0 + 20_000, "cpu{mode=\"idle\"} 2\nmem 4\ngo_new 1\n");
    assert_eq!(err, None);
    assert_eq!(counts.post_relabel, 2);

    let mut f = fixture("job_name: node\nlabel_limit: 3\nstatic_configs:\n  - targets: ['h:1']\n");
    let (err, _) = f.scrape(T0, "ok 1\nbig{a=\"1\",b=\"2\"} 1\n");
    assert_eq!(err.as_deref(), Some("label_limit exceeded (metric: big, number of labels: 5, limit: 3)"));
}

#[test]
fn clashing_labels_become_exported_unless_honored() {
    let mut f = fixture(JOB);
    f.scrape(T0, "a{job=\"other\",instance=\"i\",exported_job=\"x\"} 1\n");
    assert_eq!(
        f.series("a{exported_exported_job=\"other\", exported_instance=\"i\", exported_job=\"x\", instance=\"h:1\", job=\"node\"}").len(),
        1
    );
    let mut f = fixture("job_name: node\nhonor_labels: true\nstatic_configs:\n  - targets: ['h:1']\n");
    f.scrape(T0, "a{job=\"other\"} 1\n");
    assert_eq!(f.series("a{instance=\"h:1\", job=\"other\"}").len(), 1);
}

#[test]
fn out_of_order_samples_are_counted_not_fatal() {
    let mut f = fixture(JOB);
    f.scrape(T0, "a 1 1699999999000\n");
    let (err, _) = f.scrape(T0 + 10_000, "a 1 1699999990000\nb 1\nb 2\n");
    assert_eq!(err, None);
    assert_eq!(f.stats.out_of_order.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(f.stats.duplicate.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(f.series("b{instance=\"h:1\", job=\"node\"}"), [(T0 + 10_000, "1".to_owned())]);
}

#[test]
fn schedule_is_a_fixed_grid_spread_by_target() {
    assert_eq!(next_tick(1_000, 10_000, 3_000), 3_000);
    assert_eq!(next_tick(3_000, 10_000, 3_000), 13_000);
    assert_eq!(next_tick(12_999, 10_000, 3_000), 13_000);
    assert_eq!(
        format_for(Some("application/openmetrics-text; version=1.0.0; charset=utf-8"), None),
        Format::OpenMetrics
    );
    assert_eq!(format_for(Some("text/plain; version=0.0.4"), None), Format::Prometheus);
    assert_eq!(format_for(None, Some(ScrapeProtocol::OpenMetricsText1)), Format::OpenMetrics);
    assert_eq!(format_for(Some("application/json"), None), Format::Prometheus);
}

#[test]
fn series_churn_does_not_grow_the_cache() {
    // Every scrape exposes a new `pod` (a short-lived Kubernetes target's series): the cache
    // holds the current scrape's series only, and each old one is marked stale once.
    let mut f = fixture(JOB);
    for i in 0..50 {
        let body = format!("stable 1\nrequests{{pod=\"p{i}\"}} {i}\n");
        let (err, counts) = f.scrape(T0 + i * 10_000, &body);
        assert_eq!(err, None);
        assert_eq!(counts.series_added, if i == 0 { 2 } else { 1 });
        assert_eq!(f.state.cached(), 2);
    }
    let p7 = f.series("requests{instance=\"h:1\", job=\"node\", pod=\"p7\"}");
    assert_eq!(p7, [(T0 + 70_000, "7".to_owned()), (T0 + 80_000, "stale".to_owned())]);
    assert_eq!(f.series("stable{instance=\"h:1\", job=\"node\"}").len(), 50);
}
