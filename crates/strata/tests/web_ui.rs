//! The web UI in a real browser: Debian's chromium, headless, driven through WebDriver by
//! Debian's chromedriver (`.ci/run` installs both), against a running `strata serve` with data.
//! Each check reads what the page drew (the DOM, the canvas' pixels), not what the API says.
//!
//! With `STRATA_UI_SCREENSHOTS=<dir>` the pages are also saved there as PNGs.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use support::{free_port, http, now_ms, remote_write_body, which, Server, TestSeries};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
const TAB: &str = "\u{E004}";

/// A chromium session through chromedriver, ended and stopped on drop.
struct Browser {
    port: u16,
    session: String,
    driver: Child,
}

impl Browser {
    fn start() -> Browser {
        let port = free_port();
        let driver = Command::new(which("chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, body)) = driver_http(port, "GET", "/status", b"") {
                if serde_json::from_str::<Value>(&body).is_ok_and(|v| v["value"]["ready"] == true) {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "chromedriver did not answer on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": which("chromium"),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"],
            },
        }}});
        let mut b = Browser { port, session: String::new(), driver };
        let v = b.call("POST", "/session", &caps);
        b.session = v["sessionId"].as_str().expect("a WebDriver session").to_owned();
        b
    }

    /// One WebDriver command; its `value`, or a failed test naming the error.
    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        let path = if self.session.is_empty() { path.to_owned() } else { format!("/session/{}{path}", self.session) };
        let body = if body.is_null() { Vec::new() } else { body.to_string().into_bytes() };
        let (status, text) =
            driver_http(self.port, method, &path, &body).unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{method} {path}: {status} {text}"));
        assert!(status == 200, "{method} {path}: {status} {}", v["value"]);
        v["value"].clone()
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", &json!({ "url": url }));
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page.
    fn js(&self, script: &str, args: Value) -> Value {
        self.call("POST", "/execute/sync", &json!({"script": script, "args": args}))
    }

    /// Polls `script` until it returns something other than null or false; fails naming
    /// `what`, with the page's text, after 60 s.
    fn wait(&self, what: &str, script: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.js(script, json!([]));
            if !v.is_null() && v != json!(false) {
                return v;
            }
            if Instant::now() > deadline {
                let text = self.js("return document.body.innerText", json!([]));
                panic!("timed out waiting for {what}; the page shows:\n{}", text.as_str().unwrap_or(""));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn element(&self, css: &str) -> String {
        let v = self.call("POST", "/element", &json!({"using": "css selector", "value": css}));
        v[ELEMENT].as_str().unwrap_or_else(|| panic!("no element {css}")).to_owned()
    }

    /// Types `text` into the element as a user would (key events, so the page's handlers run).
    fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.call("POST", &format!("/element/{id}/value"), &json!({ "text": text }));
    }

    fn click(&self, css: &str) {
        let id = self.element(css);
        self.call("POST", &format!("/element/{id}/click"), &json!({}));
    }

    /// Moves the mouse over `element` through `offsets` (from its centre); with `press`, the
    /// button is held from the first to the last (a drag).
    fn pointer(&self, element: &str, offsets: &[(i64, i64)], press: bool) {
        let origin = json!({ ELEMENT: element });
        let mut actions = Vec::new();
        for (i, (x, y)) in offsets.iter().enumerate() {
            actions.push(json!({"type": "pointerMove", "duration": 50, "origin": origin, "x": x, "y": y}));
            if press && i == 0 {
                actions.push(json!({"type": "pointerDown", "button": 0}));
            }
        }
        if press {
            actions.push(json!({"type": "pointerUp", "button": 0}));
        }
        let mouse =
            json!({"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"}, "actions": actions});
        self.call("POST", "/actions", &json!({ "actions": [mouse] }));
    }

    /// Saves the page as `name.png` under `STRATA_UI_SCREENSHOTS`, when set.
    fn screenshot(&self, name: &str) {
        let Ok(dir) = std::env::var("STRATA_UI_SCREENSHOTS") else { return };
        let png = self.call("GET", "/screenshot", &Value::Null);
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap()).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), bytes).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = driver_http(self.port, "DELETE", &format!("/session/{}", self.session), b"");
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One request to chromedriver, which keeps connections open whatever the request says: the
/// answer is read by its length.
fn driver_http(port: u16, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, String)> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut length = 0;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut out = vec![0; length];
    r.read_exact(&mut out)?;
    Ok((status, String::from_utf8_lossy(&out).into_owned()))
}

fn write(srv: &Server, series: &[TestSeries<'_>]) {
    write_under(srv, "", series);
}

/// Remote write to a server whose routes are under `prefix` (`""`: none).
fn write_under(srv: &Server, prefix: &str, series: &[TestSeries<'_>]) {
    let body = remote_write_body(series);
    let (status, text) = http(
        srv.port,
        "POST",
        &format!("{prefix}/api/v1/write"),
        &[("Content-Type", "application/x-protobuf"), ("Content-Encoding", "snappy")],
        &body,
    );
    assert_eq!(status, 204, "{text}");
}

/// Five series over the last hour, a point a minute; series k's last value is 10 k + 6.
fn demo_series(now: i64) -> Vec<TestSeries<'static>> {
    (0..5)
        .map(|k| {
            let samples = (0..60).map(|i| (now - (59 - i) * 60_000, (10 * k + (i + 2) % 7) as f64)).collect();
            (
                vec![("__name__", "ui_demo".to_owned()), ("instance", format!("i-{k}")), ("job", "demo".to_owned())],
                samples,
            )
        })
        .collect()
}

/// Pixels of the canvas in `.chart` whose colour is within a few steps of `rgb`.
const COUNT_PIXELS: &str = r#"
    const c = document.querySelector('.chart canvas');
    if (!c) return null;
    const [r, g, b] = arguments[0];
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 0; i < d.length; i += 4)
        if (Math.abs(d[i] - r) < 8 && Math.abs(d[i + 1] - g) < 8 && Math.abs(d[i + 2] - b) < 8) n++;
    return n;
"#;

#[test]
fn query_page_graph_table_errors_and_completion() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let now = now_ms();
    write(&srv, &demo_series(now));
    let base = format!("http://127.0.0.1:{}", srv.port);
    let b = Browser::start();

    // `/` opens the query page.
    b.open(&format!("{base}/"));
    b.wait(
        "the query page",
        "return location.pathname === '/query' && document.querySelector('textarea.expr') !== null",
    );

    // A range graph: a canvas with the series drawn, a legend row per series.
    b.open(&format!("{base}/query?g0.expr=ui_demo&g0.tab=graph&g0.range_input=1h"));
    let rows = b.wait(
        "the legend",
        "const r = [...document.querySelectorAll('.legend div')].map(d => d.textContent); return r.length === 5 ? r : null",
    );
    let mut legend: Vec<String> = rows.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect();
    legend.sort();
    let want: Vec<String> = (0..5).map(|k| format!("ui_demo{{instance=\"i-{k}\", job=\"demo\"}}")).collect();
    assert_eq!(legend, want);
    // The first series' colour (#2759c4) is drawn: a line across the plot, not a stray pixel.
    let drawn = b.js(COUNT_PIXELS, json!([[0x27, 0x59, 0xc4]])).as_u64().unwrap();
    assert!(drawn > 200, "{drawn} pixels of the first series' colour");
    let stats = b.wait(
        "the stats line",
        "const s = document.querySelector('.stats').textContent; return s.includes('Samples read') ? s : null",
    );
    assert!(stats.as_str().unwrap().contains("Result series: 5"), "{stats}");
    b.screenshot("query-graph");

    // Hovering shows the nearest series' value at the pointer.
    let canvas = b.element(".chart canvas");
    b.pointer(&canvas, &[(0, 0)], false);
    let tip = b.wait(
        "the tooltip",
        "const t = document.querySelector('.chart .tip'); return t.style.display === 'block' ? t.textContent : null",
    );
    assert!(
        tip.as_str().unwrap().contains("ui_demo{instance=\"i-") && tip.as_str().unwrap().contains("value: "),
        "{tip}"
    );

    // Isolating a series from the legend hides the others' colour.
    b.click(".legend div:nth-child(2)");
    let first = b.js(COUNT_PIXELS, json!([[0x27, 0x59, 0xc4]])).as_u64().unwrap();
    assert!(first < drawn / 4, "the first series still drawn with {first} pixels after isolating the second");

    // Dragging across the graph zooms into that time range: the URL keeps it.
    let canvas = b.element(".chart canvas");
    b.pointer(&canvas, &[(-200, 0), (200, 0)], true);
    let range = b.wait(
        "the zoomed range in the URL",
        "const q = new URLSearchParams(location.search); return q.get('g0.range_input') !== '1h' && q.get('g0.end_input') ? q.get('g0.range_input') : null",
    );
    let zoomed = range.as_str().unwrap();
    // 400 of the plot's ~1300 pixels: about a third of the hour, and no hours left in it.
    assert!(zoomed.contains('m') && !zoomed.contains('h'), "zoomed to {zoomed}");

    // A second panel, with its own state in the URL.
    b.click("main > button");
    b.wait("two panels", "return document.querySelectorAll('.panel').length === 2");
    b.type_into(".panel:nth-child(2) textarea.expr", "count(ui_demo)");
    let url = b.wait("the second panel in the URL", "const q = new URLSearchParams(location.search); return q.get('g1.expr') === 'count(ui_demo)' ? location.search : null");
    b.open(&format!("{base}/query{}", url.as_str().unwrap()));
    let exprs = b.wait(
        "both panels from the link",
        "const t = [...document.querySelectorAll('textarea.expr')].map(t => t.value); return t.length === 2 ? t : null",
    );
    assert_eq!(exprs, json!(["ui_demo", "count(ui_demo)"]));

    // The instant table: a row per series with its latest value.
    b.open(&format!("{base}/query?g0.expr=ui_demo&g0.tab=table"));
    let cells = b.wait(
        "the table",
        "const r = [...document.querySelectorAll('tbody tr')].map(tr => [...tr.cells].map(c => c.textContent)); return r.length === 5 ? r : null",
    );
    let mut cells: Vec<(String, String)> = cells
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_owned(), r[1].as_str().unwrap().to_owned()))
        .collect();
    cells.sort();
    for (k, (series, value)) in cells.iter().enumerate() {
        assert_eq!(series, &want[k]);
        assert_eq!(value, &(10 * k + 61 % 7).to_string(), "{series}");
    }
    b.screenshot("query-table");

    // A syntax error is shown at its position, as typed (no Execute).
    b.open(&format!("{base}/query"));
    b.wait("the editor", "return document.querySelector('textarea.expr') !== null");
    b.type_into("textarea.expr", "sum(rate(ui_demo[5m])");
    let marked = b.wait(
        "the marked error",
        "const m = document.querySelector('.syntax mark'); return m ? [m.previousSibling ? m.previousSibling.textContent.length : 0, document.querySelector('.syntax-box .error').textContent] : null",
    );
    assert_eq!(marked[0], 21, "the mark sits after the 21 characters typed: {marked}");
    assert!(marked[1].as_str().unwrap().contains("column 22"), "{marked}");
    assert!(b.js("return document.querySelector('textarea.expr').classList.contains('invalid')", json!([])) == true);
    b.screenshot("query-syntax-error");
    // Closing the call clears it.
    b.type_into("textarea.expr", ")");
    b.wait("the error to clear", "return document.querySelector('.syntax mark') === null");

    // Format writes the expression as Prometheus would.
    b.open(&format!("{base}/query?g0.expr=sum(rate(ui_demo%7Bjob%3D%22demo%22%7D%5B5m%5D))by(instance)&g0.tab=table"));
    b.wait("the editor", "return document.querySelector('textarea.expr') !== null");
    b.click("main .panel .row button:nth-of-type(1)");
    let text = b.wait(
        "the formatted expression",
        "const t = document.querySelector('textarea.expr').value; return t.includes(' by ') ? t : null",
    );
    assert_eq!(text, "sum by (instance) (rate(ui_demo{job=\"demo\"}[5m]))");

    // Completion: metric names, then label names inside braces, then label values.
    b.open(&format!("{base}/query"));
    b.wait("the editor", "return document.querySelector('textarea.expr') !== null");
    b.type_into("textarea.expr", "ui_de");
    b.wait(
        "a metric name offered",
        "return [...document.querySelectorAll('.complete div')].some(d => d.textContent.startsWith('ui_demo'))",
    );
    b.type_into("textarea.expr", TAB);
    assert_eq!(b.js("return document.querySelector('textarea.expr').value", json!([])), "ui_demo");
    b.type_into("textarea.expr", "{inst");
    b.wait(
        "a label name offered",
        "return [...document.querySelectorAll('.complete div')].some(d => d.textContent.startsWith('instance'))",
    );
    b.type_into("textarea.expr", TAB);
    b.type_into("textarea.expr", "=\"i-");
    let values = b.wait(
        "label values offered",
        "const v = [...document.querySelectorAll('.complete div')].map(d => d.firstChild.textContent); return v.length === 5 ? v : null",
    );
    assert_eq!(values, json!(["i-0", "i-1", "i-2", "i-3", "i-4"]));
    b.type_into("textarea.expr", TAB);
    assert_eq!(b.js("return document.querySelector('textarea.expr').value", json!([])), "ui_demo{instance=\"i-0\"");
    b.screenshot("query-completion");
}

#[test]
fn operator_pages_and_graphite() {
    let dir = tempfile::tempdir().unwrap();
    // The built-in configuration scrapes the server itself: one target, up.
    let srv = Server::start_builtin_config(&dir.path().join("data"));
    let now = now_ms();
    let graphite: Vec<TestSeries<'_>> = ["servers.web1.cpu", "servers.web1.mem", "servers.web2.cpu"]
        .iter()
        .map(|p| (vec![("__name__", p.to_string())], (0..30).map(|i| (now - (29 - i) * 60_000, i as f64)).collect()))
        .collect();
    write(&srv, &graphite);
    let base = format!("http://127.0.0.1:{}", srv.port);
    let b = Browser::start();

    b.open(&format!("{base}/targets"));
    let row = b.wait(
        "the self-scrape target up",
        "const b = document.querySelector('.badge.up'); return b ? b.closest('tr').textContent : null",
    );
    assert!(row.as_str().unwrap().contains(&format!("127.0.0.1:{}/metrics", srv.port)), "{row}");
    b.screenshot("targets");

    b.open(&format!("{base}/service-discovery"));
    let sd =
        b.wait("discovered labels", "const t = document.querySelector('main table'); return t ? t.textContent : null");
    assert!(sd.as_str().unwrap().contains("__address__"), "{sd}");
    b.screenshot("service-discovery");

    b.open(&format!("{base}/tsdb-status"));
    let text = b.wait(
        "the head's series",
        "const t = document.querySelector('main table'); return t ? document.querySelector('main').innerText : null",
    );
    let text = text.as_str().unwrap();
    for part in ["Head", "Write-ahead log", "Head memory", "Blocks", "Top 10 series count by metric names"] {
        assert!(text.contains(part), "{part} missing from:\n{text}");
    }
    b.screenshot("tsdb-status");

    b.open(&format!("{base}/config"));
    let yaml =
        b.wait("the configuration", "const p = document.querySelector('main pre'); return p ? p.textContent : null");
    assert!(yaml.as_str().unwrap().contains("scrape_configs"), "{yaml}");
    b.open(&format!("{base}/flags"));
    let flags = b.wait("the flags", "const t = document.querySelector('main table'); return t ? t.textContent : null");
    assert!(flags.as_str().unwrap().contains("web.route-prefix"), "{flags}");
    b.screenshot("flags");
    b.open(&format!("{base}/status"));
    let status = b.wait("runtime and build information", "const t = document.querySelectorAll('main table'); return t.length === 2 ? document.querySelector('main').innerText : null");
    assert!(status.as_str().unwrap().contains(env!("CARGO_PKG_VERSION")), "{status}");
    b.screenshot("status");

    // Graphite: open the tree down to a leaf, which graphs it.
    b.open(&format!("{base}/graphite"));
    b.wait(
        "the tree's root",
        "return [...document.querySelectorAll('.tree span')].some(s => s.textContent === 'servers')",
    );
    b.js("[...document.querySelectorAll('.tree span')].find(s => s.textContent === 'servers').click()", json!([]));
    b.wait(
        "servers' children",
        "return [...document.querySelectorAll('.tree span')].some(s => s.textContent === 'web1')",
    );
    b.js("[...document.querySelectorAll('.tree span')].find(s => s.textContent === 'web1').click()", json!([]));
    b.wait(
        "web1's leaves",
        "return [...document.querySelectorAll('.tree span.leaf')].some(s => s.textContent === 'mem')",
    );
    b.js("[...document.querySelectorAll('.tree span.leaf')].find(s => s.textContent === 'mem').click()", json!([]));
    let legend = b
        .wait("the rendered graph", "const d = document.querySelector('.legend div'); return d ? d.textContent : null");
    assert_eq!(legend, "servers.web1.mem");
    assert!(b.js(COUNT_PIXELS, json!([[0x27, 0x59, 0xc4]])).as_u64().unwrap() > 200);
    assert_eq!(b.js("return new URLSearchParams(location.search).get('target')", json!([])), "servers.web1.mem");
    b.screenshot("graphite");
}

#[test]
fn under_a_route_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start_under_prefix(&dir.path().join("data"), "/strata", &[]);
    write_under(&srv, "/strata", &demo_series(now_ms()));
    let b = Browser::start();
    b.open(&format!("http://127.0.0.1:{}/", srv.port));
    b.wait("the redirect into the prefix", "return location.pathname === '/strata/query'");
    b.open(&format!("http://127.0.0.1:{}/strata/query?g0.expr=sum(ui_demo)&g0.tab=graph", srv.port));
    let legend = b.wait(
        "the graph under the prefix",
        "const d = document.querySelector('.legend div'); return d ? d.textContent : null",
    );
    assert_eq!(legend, "{}");
    let (status, _) = http(srv.port, "GET", "/query", &[], b"");
    assert_eq!(status, 404, "pages are only under the prefix");
    for bare in ["/strata", "/strata/"] {
        let (status, head, _) = support::http_with_head(srv.port, "GET", bare, &[], b"");
        assert_eq!(status, 302, "{bare}");
        assert!(head.to_ascii_lowercase().contains("location: /strata/query"), "{bare}: {head}");
    }
}

/// Issue 22's size: 1,000 series × 1,440 points drawn, and how long the page took (printed,
/// not asserted: timings belong to benchmarks).
#[test]
fn a_thousand_series_graph() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let end = now_ms() / 60_000 * 60_000;
    let start = end - 1439 * 60_000;
    // In time order, an hour of every series per request: the head takes samples up to an
    // hour behind its newest.
    for hour in 0..24 {
        let series: Vec<TestSeries<'_>> = (0..1000)
            .map(|k| {
                let samples = (hour * 60..(hour + 1) * 60)
                    .map(|i| (start + i * 60_000, ((k * 7 + i) % 100) as f64 + k as f64))
                    .collect();
                (vec![("__name__", "big".to_owned()), ("k", k.to_string())], samples)
            })
            .collect();
        write(&srv, &series);
    }
    let b = Browser::start();
    let url = format!(
        "http://127.0.0.1:{}/query?g0.expr=big&g0.tab=graph&g0.range_input=1d&g0.end_input={}&g0.res_type=fixed&g0.res_step=60",
        srv.port,
        end / 1000
    );
    b.open(&url);
    let stats = b.wait(
        "1000 series drawn",
        "const s = document.querySelector('.stats').textContent; return document.querySelectorAll('.legend div').length === 1000 && s.includes('Render time') ? s : null",
    );
    let points = b.js("return document.querySelectorAll('.legend div').length", json!([]));
    assert_eq!(points, 1000);
    println!("1000 series × 1440 points: {}", stats.as_str().unwrap());
    b.screenshot("thousand-series");
}

#[test]
fn alerts_and_rules_pages() {
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    std::fs::write(
        dir.path().join("rules.yml"),
        "groups:\n  - name: ui\n    interval: 1s\n    rules:\n      - record: job:up:sum\n        expr: sum by (job) (up)\n      - alert: StrataUp\n        expr: up == 1\n        labels: {severity: info}\n        annotations: {summary: '{{ $labels.instance }} answers'}\n      - alert: NeverFires\n        expr: up == 2\n        for: 5m\n",
    )
    .unwrap();
    let cfg = dir.path().join("strata.yml");
    std::fs::write(
        &cfg,
        format!("global:\n  scrape_interval: 1s\nrule_files: ['rules.yml']\nscrape_configs:\n  - job_name: strata\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"),
    )
    .unwrap();
    let srv = Server::start_on(port, &dir.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    let base = format!("http://127.0.0.1:{}", srv.port);
    let b = Browser::start();

    // The alert fires at the second evaluation (the first restores state); reload until then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        b.open(&format!("{base}/alerts"));
        let firing = b.wait(
            "the alerts page",
            "return document.querySelector('details[data-rule]') ? (document.querySelector('details[data-rule=\"StrataUp\"] .badge.firing') ? 'firing' : 'not yet') : null",
        );
        if firing == "firing" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "StrataUp never shown firing");
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    b.js("document.querySelector('details[data-rule=\"StrataUp\"]').open = true", json!([]));
    let text = b.js("return document.querySelector('details[data-rule=\"StrataUp\"]').innerText", json!([]));
    let text = text.as_str().unwrap();
    assert!(text.contains(&format!("127.0.0.1:{port} answers")), "{text}");
    assert!(text.contains("severity=\"info\""), "{text}");
    let inactive =
        b.js("return document.querySelector('details[data-rule=\"NeverFires\"] .badge').textContent", json!([]));
    assert_eq!(inactive, "INACTIVE");
    b.screenshot("alerts");

    b.open(&format!("{base}/rules"));
    let rules = b.wait(
        "the rules page",
        "const t = document.querySelector('[data-group=\"ui\"] table'); return t ? t.innerText : null",
    );
    let rules = rules.as_str().unwrap();
    assert!(rules.contains("record: job:up:sum") && rules.contains("sum by (job) (up)"), "{rules}");
    assert!(rules.contains("alert: NeverFires") && rules.contains("OK"), "{rules}");
    b.screenshot("rules");
}
