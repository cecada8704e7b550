//! The web UI, served by `strata serve` itself: a query page (PromQL editor, table, graphs),
//! operator pages (alerts, rules, targets, service discovery, TSDB status, configuration, flags, runtime and
//! build information) and a Graphite page (metric tree and `/render` graphs).
//!
//! It is our own plain HTML, CSS and JavaScript, with no dependencies and no build step: the
//! files under `assets/` are what the browser runs, embedded in the binary at compile time, so
//! `cargo build` needs nothing but crates and the server needs nothing but itself. Every page
//! is the same document; `app.js` draws the page its path names and reads the data from the
//! HTTP API like any other client.
//!
//! Behind a reverse proxy the browser reaches the server under a path of its own
//! (`--web.external-url`), which need not be the path the server routes (`--web.route-prefix`,
//! when the proxy strips its path). The document carries the browser's path as its `<base>`,
//! and the pages use relative URLs only, so both work.

use std::sync::Arc;

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

#[cfg(test)]
mod tests;

/// Paths that draw a page (each serves the same document).
pub const PAGES: &[&str] = &[
    "/query",
    "/graph",
    "/targets",
    "/service-discovery",
    "/tsdb-status",
    "/config",
    "/flags",
    "/status",
    "/graphite",
    "/alerts",
    "/rules",
];

/// The embedded files: name under `/assets/`, content type, contents.
const ASSETS: &[(&str, &str, &str)] = &[
    ("app.js", "text/javascript; charset=utf-8", include_str!("assets/app.js")),
    ("query.js", "text/javascript; charset=utf-8", include_str!("assets/query.js")),
    ("chart.js", "text/javascript; charset=utf-8", include_str!("assets/chart.js")),
    ("pages.js", "text/javascript; charset=utf-8", include_str!("assets/pages.js")),
    ("style.css", "text/css; charset=utf-8", include_str!("assets/style.css")),
];

const INDEX_HTML: &str = include_str!("assets/index.html");

/// Where a browser reaches the server, from `--web.external-url` and `--web.route-prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebPaths {
    /// The path the server's routes are under: `/` or `/prefix` (no trailing slash).
    pub route_prefix: String,
    /// The path browsers use, ending in `/`: the document's `<base>` and redirects' target.
    pub browser_base: String,
}

impl Default for WebPaths {
    fn default() -> Self {
        WebPaths { route_prefix: "/".to_owned(), browser_base: "/".to_owned() }
    }
}

impl WebPaths {
    /// Prometheus' rules: the route prefix defaults to the external URL's path; without an
    /// external URL, browsers use the route prefix.
    pub fn new(external_url: Option<&str>, route_prefix: Option<&str>) -> Result<WebPaths, String> {
        let external_path = match external_url {
            None | Some("") => None,
            Some(u) => Some(external_url_path(u)?),
        };
        let route_prefix = match route_prefix {
            Some(p) => clean_path(p, "--web.route-prefix")?,
            None => external_path.clone().unwrap_or_else(|| "/".to_owned()),
        };
        let browser = external_path.unwrap_or_else(|| route_prefix.clone());
        let browser_base = if browser.ends_with('/') { browser } else { format!("{browser}/") };
        Ok(WebPaths { route_prefix, browser_base })
    }
}

/// The path of an absolute `http(s)://host[:port][/path]` URL, cleaned (no trailing slash).
fn external_url_path(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("--web.external-url {url:?}: must be an absolute http:// or https:// URL"))?;
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if host.is_empty() {
        return Err(format!("--web.external-url {url:?}: no host"));
    }
    if path.contains(['?', '#']) {
        return Err(format!("--web.external-url {url:?}: a query or fragment has no place in it"));
    }
    clean_path(if path.is_empty() { "/" } else { path }, "--web.external-url")
}

/// `p` with one leading and no trailing slash; refused when it holds characters that would
/// need escaping in a URL or in HTML (it is written into the document's `<base>`).
fn clean_path(p: &str, flag: &str) -> Result<String, String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "/-._~!$()*+,;=:@%".contains(c);
    if let Some(bad) = p.chars().find(|&c| !ok(c)) {
        return Err(format!("{flag} {p:?}: {bad:?} is not allowed in the path"));
    }
    let trimmed = p.trim_matches('/');
    if trimmed.split('/').any(|s| s.is_empty() || s == "." || s == "..") && !trimmed.is_empty() {
        return Err(format!("{flag} {p:?}: empty, `.` or `..` path segments"));
    }
    Ok(format!("/{trimmed}"))
}

/// The UI's routes, relative to the route prefix; `paths.browser_base` goes into every page.
pub fn routes<S: Clone + Send + Sync + 'static>(paths: &WebPaths) -> Router<S> {
    let base = paths.browser_base.clone();
    let index: Arc<str> = INDEX_HTML.replace("{{BASE}}", &base).into();
    let home = format!("{base}query");
    let mut router = Router::new().route("/", get(move || std::future::ready(redirect(&home))));
    for page in PAGES {
        let index = index.clone();
        router = router.route(page, get(move || std::future::ready(document(&index))));
    }
    router.route("/assets/{name}", get(asset))
}

/// Puts `app` (its paths relative to the prefix) under `paths.route_prefix`; `/` and the
/// prefix with a trailing slash redirect to the UI there, as Prometheus does (the bare prefix
/// is the UI's own `/`).
pub fn mount(app: Router, paths: &WebPaths) -> Router {
    if paths.route_prefix == "/" {
        return app;
    }
    let home = format!("{}query", paths.browser_base);
    let home2 = home.clone();
    Router::new()
        .route("/", get(move || std::future::ready(redirect(&home))))
        .route(&format!("{}/", paths.route_prefix), get(move || std::future::ready(redirect(&home2))))
        .nest(&paths.route_prefix, app)
}

fn redirect(to: &str) -> Response {
    match HeaderValue::from_str(to) {
        Ok(location) => (StatusCode::FOUND, [(header::LOCATION, location)]).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "bad redirect target\n").into_response(),
    }
}

fn document(index: &str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
            // The document names the assets; it must be fetched again after an upgrade.
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        index.to_owned(),
    )
        .into_response()
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
                // Small, and an upgraded server must not run with last version's scripts.
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, format!("no asset {name:?}\n")).into_response(),
    }
}
