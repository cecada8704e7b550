//! Rules and alerts against real peers: Debian's Alertmanager receives and resolves our alerts;
//! Debian's promtool agrees with our rule file checks and template expansion; a restart keeps
//! how long alerts have been pending.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{free_port, http, which, Server};

/// Debian's Alertmanager on a free port, clustering off.
struct Alertmanager {
    port: u16,
    child: Child,
}

impl Alertmanager {
    fn start(dir: &Path) -> Alertmanager {
        let bin = which("prometheus-alertmanager");
        let cfg = dir.join("alertmanager.yml");
        std::fs::write(&cfg, "route:\n  receiver: blackhole\n  group_wait: 1s\nreceivers:\n  - name: blackhole\n")
            .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("alertmanager.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!("--storage.path={}", dir.join("am-data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--cluster.listen-address=")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus-alertmanager");
        let am = Alertmanager { port, child };
        wait_for(Duration::from_secs(30), "Alertmanager ready", || {
            matches!(support::try_http(port, "GET", "/-/ready", &[], b""), Ok((200, _)))
        });
        am
    }

    /// The alerts Alertmanager holds as active (resolved ones are not listed).
    fn alerts(&self) -> Vec<Value> {
        let (code, body) = http(self.port, "GET", "/api/v2/alerts", &[], b"");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap().as_array().unwrap().clone()
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn api(port: u16, path: &str) -> Value {
    let (code, body) = http(port, "GET", path, &[], b"");
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str::<Value>(&body).unwrap()["data"].clone()
}

const RULES: &str = r#"
groups:
  - name: self
    interval: 1s
    rules:
      - record: job:up:sum
        expr: sum by (job) (up)
      - alert: StrataIsUp
        expr: up{job="strata"} == 1
        for: 2s
        labels:
          severity: page
          team: "{{ $labels.job }}-oncall"
        annotations:
          summary: "{{ $labels.instance }} is up, value {{ $value }}"
"#;

fn config(port: u16, am_port: u16, rules: &str) -> String {
    format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n  external_labels: {{cluster: test}}\n\
         rule_files: ['{rules}']\n\
         alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n\
         scrape_configs:\n  - job_name: strata\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
}

#[test]
fn alerts_reach_a_real_alertmanager_and_resolve_when_the_rule_goes() {
    let dir = tempfile::tempdir().unwrap();
    let am = Alertmanager::start(dir.path());
    let port = free_port();
    let rules = dir.path().join("rules.yml");
    std::fs::write(&rules, RULES).unwrap();
    let cfg = dir.path().join("strata.yml");
    std::fs::write(&cfg, config(port, am.port, "rules.yml")).unwrap();
    let srv = Server::start_on(
        port,
        &dir.path().join("data"),
        &["--config", cfg.to_str().unwrap(), "--web.enable-lifecycle", "--rules.alert.resend-delay", "1s"],
    );
    let managers = api(srv.port, "/api/v1/alertmanagers");
    assert_eq!(
        managers["activeAlertmanagers"][0]["url"],
        format!("http://127.0.0.1:{}/api/v2/alerts", am.port),
        "{managers}"
    );

    // Pending for 2 s, then firing and sent.
    wait_for(Duration::from_secs(30), "the alert in Alertmanager", || !am.alerts().is_empty());
    let alerts = am.alerts();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    let a = &alerts[0];
    assert_eq!(a["labels"]["alertname"], "StrataIsUp");
    assert_eq!(a["labels"]["severity"], "page");
    assert_eq!(a["labels"]["team"], "strata-oncall");
    assert_eq!(a["labels"]["cluster"], "test", "external labels are added");
    assert_eq!(a["labels"]["instance"], format!("127.0.0.1:{port}"));
    assert_eq!(a["annotations"]["summary"], format!("127.0.0.1:{port} is up, value 1"));
    assert!(a["generatorURL"].as_str().unwrap().contains("/graph?g0.expr=up%7Bjob%3D%22strata%22%7D+%3D%3D+1"), "{a}");
    assert_eq!(a["status"]["state"], "active");

    // Our own view agrees, and the recording rule wrote its series.
    let alerts = api(srv.port, "/api/v1/alerts");
    assert_eq!(alerts["alerts"][0]["state"], "firing", "{alerts}");
    let rules_view = api(srv.port, "/api/v1/rules?type=record");
    assert_eq!(rules_view["groups"][0]["rules"].as_array().unwrap().len(), 1, "{rules_view}");
    assert_eq!(rules_view["groups"][0]["rules"][0]["health"], "ok");
    let q = api(srv.port, "/api/v1/query?query=job:up:sum");
    assert_eq!(q["result"][0]["value"][1], "1", "{q}");
    let q = api(srv.port, "/api/v1/query?query=ALERTS%7Balertstate%3D%22firing%22%7D");
    assert_eq!(q["result"].as_array().unwrap().len(), 1, "{q}");
    let (_, metrics) = http(srv.port, "GET", "/metrics", &[], b"");
    let sent_line = metrics.lines().find(|l| l.starts_with("strata_notifications_sent_total ")).unwrap();
    assert_ne!(sent_line, "strata_notifications_sent_total 0");

    // The alerting rule goes away with a reload: the alert is sent as resolved and
    // Alertmanager stops listing it; ALERTS gets a stale marker.
    std::fs::write(&rules, RULES.split("      - alert:").next().unwrap()).unwrap();
    let (code, body) = http(srv.port, "POST", "/-/reload", &[], b"");
    assert_eq!(code, 200, "{body}");
    wait_for(Duration::from_secs(30), "the alert resolved in Alertmanager", || am.alerts().is_empty());
    let alerts = api(srv.port, "/api/v1/alerts");
    assert_eq!(alerts["alerts"], serde_json::json!([]));
    let q = api(srv.port, "/api/v1/query?query=ALERTS");
    assert_eq!(q["result"], serde_json::json!([]), "stale after the rule went: {q}");
    let rules_view = api(srv.port, "/api/v1/rules");
    assert_eq!(rules_view["groups"][0]["rules"].as_array().unwrap().len(), 1);
}

#[test]
fn alertmanagers_are_found_by_http_discovery() {
    let dir = tempfile::tempdir().unwrap();
    let am = Alertmanager::start(dir.path());
    let port = free_port();
    let body = std::sync::Arc::new(std::sync::Mutex::new(format!(r#"[{{"targets": ["127.0.0.1:{}"]}}]"#, am.port)));
    let sd = support::http_sd_endpoint(body);
    std::fs::write(dir.path().join("rules.yml"), RULES).unwrap();
    let cfg = dir.path().join("strata.yml");
    let text = config(port, am.port, "rules.yml").replace(
        &format!("- static_configs:\n        - targets: ['127.0.0.1:{}']", am.port),
        &format!("- http_sd_configs:\n        - url: {sd}"),
    );
    assert!(text.contains("http_sd_configs"), "{text}");
    std::fs::write(&cfg, text).unwrap();
    let srv = Server::start_on(port, &dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let managers = api(srv.port, "/api/v1/alertmanagers");
    assert_eq!(
        managers["activeAlertmanagers"][0]["url"],
        format!("http://127.0.0.1:{}/api/v2/alerts", am.port),
        "{managers}"
    );
    wait_for(Duration::from_secs(30), "the alert in Alertmanager", || !am.alerts().is_empty());
}

#[test]
fn a_broken_rule_file_refuses_the_start_and_a_reload_keeps_the_running_rules() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yml");
    std::fs::write(&rules, "groups:\n  - name: g\n    rules:\n      - record: bad-name\n        expr: up\n").unwrap();
    let cfg = dir.path().join("strata.yml");
    std::fs::write(&cfg, "rule_files: ['rules.yml']\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port()), "--data-dir"])
        .arg(dir.path().join("d1"))
        .args(["--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("group \"g\", rule 1, \"bad-name\": invalid recording rule name"), "{err}");

    std::fs::write(&rules, "groups:\n  - name: g\n    rules:\n      - record: good\n        expr: vector(1)\n")
        .unwrap();
    let srv = Server::start(&dir.path().join("d2"), &["--config", cfg.to_str().unwrap(), "--web.enable-lifecycle"]);
    std::fs::write(&rules, "groups:\n  - name: g\n    rules:\n      - record: good\n        expr: sum(\n").unwrap();
    let (code, body) = http(srv.port, "POST", "/-/reload", &[], b"");
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("could not parse expression"), "{body}");
    let view = api(srv.port, "/api/v1/rules");
    assert_eq!(view["groups"][0]["rules"][0]["query"], "vector(1)", "the running rules stay: {view}");
}

#[test]
fn rule_file_checks_agree_with_promtool() {
    let promtool = which("promtool");
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        ("good", "groups:\n  - name: g\n    interval: 30s\n    rules:\n      - record: a:b\n        expr: sum(up)\n      - alert: A\n        expr: up == 0\n        for: 5m\n        keep_firing_for: 1m\n        labels: {s: '{{ $labels.job }}'}\n        annotations: {d: '{{ $value | humanize }}'}\n"),
        ("scalar", "groups:\n  - name: g\n    rules:\n      - record: one\n        expr: 1\n"),
        ("empty", "groups: []\n"),
        ("both", "groups:\n  - name: g\n    rules:\n      - record: a\n        alert: b\n        expr: up\n"),
        ("neither", "groups:\n  - name: g\n    rules:\n      - expr: up\n"),
        ("bad-name", "groups:\n  - name: g\n    rules:\n      - record: a-b\n        expr: up\n"),
        ("bad-expr", "groups:\n  - name: g\n    rules:\n      - record: a\n        expr: sum(up\n"),
        ("no-expr", "groups:\n  - name: g\n    rules:\n      - record: a\n"),
        ("for-on-record", "groups:\n  - name: g\n    rules:\n      - record: a\n        expr: up\n        for: 1m\n"),
        ("annotations-on-record", "groups:\n  - name: g\n    rules:\n      - record: a\n        expr: up\n        annotations: {x: y}\n"),
        ("bad-template", "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        annotations: {x: '{{ $labels.a '}\n"),
        ("unknown-function", "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        annotations: {x: '{{ nosuch 1 }}'}\n"),
        ("dup-group", "groups:\n  - name: g\n    rules: []\n  - name: g\n    rules: []\n"),
        ("no-group-name", "groups:\n  - rules: []\n"),
        ("unknown-field", "groups:\n  - name: g\n    rules:\n      - record: a\n        expr: up\n        bogus: 1\n"),
        ("bad-label", "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        labels: {0x: y}\n"),
        ("range-vector", "groups:\n  - name: g\n    rules:\n      - record: a\n        expr: up[5m]\n"),
        ("string", "groups:\n  - name: g\n    rules:\n      - record: a\n        expr: '\"s\"'\n"),
    ];
    for (name, text) in cases {
        let f = dir.path().join(format!("{name}.yml"));
        std::fs::write(&f, text).unwrap();
        let ours = Command::new(env!("CARGO_BIN_EXE_strata")).args(["check", "rules"]).arg(&f).output().unwrap();
        let theirs = Command::new(&promtool).args(["check", "rules"]).arg(&f).output().unwrap();
        assert_eq!(
            ours.status.success(),
            theirs.status.success(),
            "{name}: strata says\n{}{}\npromtool says\n{}{}",
            String::from_utf8_lossy(&ours.stdout),
            String::from_utf8_lossy(&ours.stderr),
            String::from_utf8_lossy(&theirs.stdout),
            String::from_utf8_lossy(&theirs.stderr)
        );
        if ours.status.success() {
            assert_eq!(String::from_utf8_lossy(&ours.stdout), String::from_utf8_lossy(&theirs.stdout), "{name}");
        }
    }
}

/// Templates as Prometheus' users write them; each expanded by our engine, then checked by
/// promtool's rule unit tests, which expand the same templates with Prometheus' own code.
const TEMPLATES: &[&str] = &[
    "{{ $labels.instance }} of {{ $labels.job }}",
    "{{ $value }}",
    "{{ .Value }} {{ .Labels.job }}",
    "{{ $value | humanize }}",
    "{{ humanize1024 $value }}",
    "{{ humanizeDuration $value }}",
    "{{ humanizePercentage 0.0123 }}",
    "{{ humanizeTimestamp $value }}",
    "{{ printf \"%.2f\" $value }}",
    "{{ printf \"%d items, %s, %5.1f|%-6s|\" 3 \"x\" 2.25 \"ab\" }}",
    "{{ $labels.instance | stripPort }} {{ stripDomain $labels.instance }}",
    "{{ toUpper $labels.job }} {{ toLower \"ABC\" }} {{ title \"hello world\" }}",
    "{{ reReplaceAll \"(.*):(.*)\" \"$2 on $1\" $labels.instance }}",
    "{{ if match \"^node\" $labels.job }}node{{ else }}other{{ end }}",
    "{{ if gt $value 1000.0 }}big{{ else if gt $value 10.0 }}mid{{ else }}small{{ end }}",
    "{{ range $k, $v := $labels }}{{ $k }}={{ $v }};{{ end }}",
    "{{ with query \"m\" }}{{ . | first | value | humanize }}{{ end }}",
    "{{ range query \"m\" }}{{ .Labels.instance }} {{ end }}",
    "{{ $x := \"a\" }}{{ $x = printf \"%s%s\" $x \"b\" }}{{ $x }}",
    "{{ len $labels }} {{ index $labels \"job\" }}",
    "{{- \"trimmed\" -}}   ",
    "{{ with $labels.missing }}x{{ else }}none{{ end }}",
    "{{ parseDuration \"1h30m\" }} {{ \"<b>\" | html }} {{ urlquery \"a b\" }}",
];

#[test]
fn templates_expand_as_promtool_expands_them() {
    use strata_server::rules::template::{alert_data, Context, QuerySample, Template};
    let promtool = which("promtool");
    let dir = tempfile::tempdir().unwrap();
    let value = 1_234_567.891;
    let labels: BTreeMap<String, String> =
        [("__name__", "m"), ("instance", "host-1.example.com:9100"), ("job", "node")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let mut alert_labels = labels.clone();
    alert_labels.remove("__name__");
    let sample = QuerySample { labels: labels.clone(), value };
    let query = |q: &str| -> Result<Vec<QuerySample>, String> {
        assert_eq!(q, "m");
        Ok(vec![sample.clone()])
    };
    let ctx = Context { query: Some(&query), external_url: "http://localhost:9090" };
    let (data, vars) = alert_data(&labels, &BTreeMap::new(), "http://localhost:9090", value);
    let mut rule =
        String::from("groups:\n  - name: t\n    rules:\n      - alert: T\n        expr: m > 0\n        annotations:\n");
    let mut expected = String::new();
    for (i, t) in TEMPLATES.iter().enumerate() {
        let ours = Template::parse(t).unwrap().execute(data.clone(), &vars, &ctx).unwrap();
        rule.push_str(&format!("          a{i:02}: {}\n", serde_json::to_string(t).unwrap()));
        expected.push_str(&format!("              a{i:02}: {}\n", serde_json::to_string(&ours).unwrap()));
    }
    std::fs::write(dir.path().join("rules.yml"), &rule).unwrap();
    let exp_labels: String = alert_labels.iter().map(|(k, v)| format!("              {k}: {v:?}\n")).collect();
    let test = format!(
        "rule_files: [rules.yml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n      - series: 'm{{instance=\"host-1.example.com:9100\", job=\"node\"}}'\n        values: '{value} {value} {value}'\n    alert_rule_test:\n      - eval_time: 1m\n        alertname: T\n        exp_alerts:\n          - exp_labels:\n{exp_labels}            exp_annotations:\n{expected}"
    );
    std::fs::write(dir.path().join("test.yml"), &test).unwrap();
    let out = Command::new(promtool).current_dir(dir.path()).args(["test", "rules", "test.yml"]).output().unwrap();
    assert!(
        out.status.success(),
        "promtool expands differently:\n{}{}\n{test}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn pending_time_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let rules = dir.path().join("rules.yml");
    std::fs::write(
        &rules,
        "groups:\n  - name: g\n    interval: 1s\n    rules:\n      - alert: Slow\n        expr: up == 1\n        for: 1h\n",
    )
    .unwrap();
    let cfg = dir.path().join("strata.yml");
    std::fs::write(
        &cfg,
        format!("global:\n  scrape_interval: 1s\nrule_files: ['rules.yml']\nscrape_configs:\n  - job_name: strata\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"),
    )
    .unwrap();
    let data = dir.path().join("data");
    let args = ["--config", cfg.to_str().unwrap(), "--rules.alert.for-grace-period", "1m"];
    let active_at = |srv: &Server| -> Option<String> {
        let v = api(srv.port, "/api/v1/alerts");
        v["alerts"][0]["activeAt"].as_str().map(str::to_owned)
    };
    let mut srv = Server::start_on(port, &data, &args);
    // Restored alerts are written from the second evaluation on; wait for ALERTS_FOR_STATE.
    wait_for(Duration::from_secs(30), "ALERTS_FOR_STATE", || {
        let q = api(srv.port, "/api/v1/query?query=ALERTS_FOR_STATE");
        !q["result"].as_array().unwrap().is_empty()
    });
    let first = active_at(&srv).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    srv.kill();
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let srv = Server::start_on(port, &data, &args);
    wait_for(Duration::from_secs(30), "the alert after the restart", || active_at(&srv).is_some());
    // The first evaluation after a start makes the alert pending anew; the restore right after
    // it moves its active time back to the first one plus the time Strata was down.
    wait_for(Duration::from_secs(10), "the restore", || {
        let rules = api(srv.port, "/api/v1/rules");
        rules["groups"][0]["lastEvaluation"].as_str().is_some_and(|t| !t.starts_with("0001"))
    });
    std::thread::sleep(Duration::from_millis(1500));
    let restored = active_at(&srv).unwrap();
    let secs = |t: &str| -> f64 {
        // 2026-11-26T20:08:52.073Z → seconds of the day are enough within a test's minutes.
        let hms = &t[11..t.len() - 1];
        let mut parts = hms.split(':');
        let h: f64 = parts.next().unwrap().parse().unwrap();
        let m: f64 = parts.next().unwrap().parse().unwrap();
        let s: f64 = parts.next().unwrap().parse().unwrap();
        h * 3600.0 + m * 60.0 + s
    };
    let shift = secs(&restored) - secs(&first);
    let downtime = down.elapsed().as_secs_f64();
    assert!(
        shift > 2.0 && shift < downtime + 4.0,
        "active time moved {shift:.1} s for {downtime:.1} s down: {first} → {restored}"
    );
}

/// One rule file, one scraped target, in Strata and in Debian's Prometheus 2.42: the recorded
/// series (names, labels from the rule, values, a rule reading an earlier rule's output in the
/// same evaluation) are the same in both.
#[test]
fn recording_rules_record_what_prometheus_records() {
    let prometheus = which("prometheus");
    let target = support::fixed_target(
        "text/plain; version=0.0.4",
        concat!(
            "# TYPE http_requests_total counter\n",
            "http_requests_total{code=\"200\",handler=\"/a\"} 10\n",
            "http_requests_total{code=\"500\",handler=\"/a\"} 2\n",
            "http_requests_total{code=\"200\",handler=\"/b\"} 7\n",
            "# TYPE latency_seconds histogram\n",
            "latency_seconds_bucket{le=\"0.1\"} 4\n",
            "latency_seconds_bucket{le=\"0.5\"} 9\n",
            "latency_seconds_bucket{le=\"+Inf\"} 10\n",
            "latency_seconds_sum 2.5\n",
            "latency_seconds_count 10\n",
            "# TYPE temp gauge\n",
            "temp{room=\"a\"} 21.5\n",
            "temp{room=\"b\"} 19\n",
        ),
    );
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("rec.yml"),
        r#"
groups:
  - name: rec
    interval: 1s
    rules:
      - record: code:http_requests:sum
        expr: sum by (code) (http_requests_total)
        labels:
          source: rules
      - record: handler:errors:ratio
        expr: sum by (handler) (http_requests_total{code="500"}) / sum by (handler) (http_requests_total)
      - record: job:latency_seconds:p90
        expr: histogram_quantile(0.9, sum by (job, le) (latency_seconds_bucket))
      - record: room:temp:warm
        expr: temp > 20
      - record: room:temp:shifted
        expr: temp + on (room) group_left () count by (room) (temp)
      - record: code:http_requests:sum_doubled
        expr: code:http_requests:sum * 2
"#,
    )
    .unwrap();
    let cfg = tmp.path().join("both.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['rec.yml']\n\
             scrape_configs:\n  - job_name: t\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let srv = Server::start(&tmp.path().join("strata"), &["--config", cfg.to_str().unwrap()]);
    let (prom, prom_port) = support::start_prometheus(&prometheus, &cfg, tmp.path(), &[]);
    let recorded = |port: u16| -> Vec<(BTreeMap<String, String>, String)> {
        let q = "%7B__name__%3D~%22.%2B%3A.%2B%22%7D"; // {__name__=~".+:.+"}
        let Ok((200, body)) = support::try_http(port, "GET", &format!("/api/v1/query?query={q}"), &[], b"") else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap();
        let mut out: Vec<(BTreeMap<String, String>, String)> = v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let labels =
                    r["metric"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()));
                (labels.collect(), r["value"][1].as_str().unwrap().to_owned())
            })
            .collect();
        out.sort();
        out
    };
    // code:http_requests:sum (2), handler:errors:ratio (1: /b has no 500s), the p90 (1), warm (1), shifted (2),
    // doubled (2).
    let deadline = Instant::now() + Duration::from_secs(60);
    let last = loop {
        let last = (recorded(srv.port), recorded(prom_port));
        if last.0.len() == 9 && last.1.len() == 9 {
            break last;
        }
        assert!(Instant::now() < deadline, "not every rule recorded: {last:#?}\n{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(prom);
    let (ours, theirs) = last;
    assert_eq!(ours, theirs, "Strata (left), Prometheus (right)");
    let doubled = ours.iter().find(|(l, _)| l["__name__"] == "code:http_requests:sum_doubled" && l["code"] == "200");
    assert_eq!(doubled.map(|(_, v)| v.as_str()), Some("34"), "{ours:?}");
    assert!(ours.iter().any(|(l, _)| l.get("source").is_some_and(|s| s == "rules")), "{ours:?}");
}
