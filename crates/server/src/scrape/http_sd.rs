//! `http_sd_configs`: targets from an HTTP endpoint, as Prometheus' HTTP service discovery reads
//! them. Every `refresh_interval` (60s) the URL is fetched; the answer must be 200 with
//! `Content-Type: application/json` and a body in file_sd's JSON shape (`[{"targets": […],
//! "labels": {…}}]`). Each group gets `__meta_url`. A failed fetch or a bad answer keeps the
//! targets the endpoint last gave, logged and counted, as for files.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::config::{resolve_auth, Auth, Authorization, BasicAuth, PromDuration, TlsConfig};
use super::discovery::{parse_file, TargetGroup};

pub const HTTP_SD_REFRESH_DEFAULT: PromDuration = PromDuration(60_000);

/// Longest a fetch may take (the refresh interval when that is shorter, but never less than
/// `MIN_FETCH_TIMEOUT`).
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
const MIN_FETCH_TIMEOUT: Duration = Duration::from_secs(1);

/// Most bytes of an answer read (Prometheus reads without bound; a target list of a million
/// entries is under this).
const MAX_BODY_BYTES: usize = 64 << 20;

/// One `http_sd_configs` entry as written.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSdConfig {
    pub url: String,
    pub refresh_interval: Option<PromDuration>,
    pub basic_auth: Option<BasicAuth>,
    pub authorization: Option<Authorization>,
    #[serde(default)]
    pub tls_config: TlsConfig,
    pub follow_redirects: Option<bool>,
    pub proxy_url: Option<String>,
}

/// An `http_sd_configs` entry checked, secrets read, paths resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpSd {
    pub url: String,
    pub refresh: Duration,
    pub auth: Auth,
    pub tls: TlsConfig,
    pub follow_redirects: bool,
    pub proxy_url: Option<String>,
}

impl HttpSdConfig {
    pub fn resolve(&self, base: &std::path::Path, err: &dyn Fn(&str) -> String) -> Result<HttpSd, String> {
        let url =
            reqwest::Url::parse(&self.url).map_err(|e| err(&format!("http_sd_configs url {:?}: {e}", self.url)))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(err(&format!("http_sd_configs url {:?}: the scheme must be http or https", self.url)));
        }
        let refresh = self.refresh_interval.unwrap_or(HTTP_SD_REFRESH_DEFAULT);
        if refresh.0 <= 0 {
            return Err(err("http_sd_configs refresh_interval must be above zero"));
        }
        let mut tls = self.tls_config.clone();
        for f in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file].into_iter().flatten() {
            *f = base.join(&*f);
        }
        Ok(HttpSd {
            url: self.url.clone(),
            refresh: refresh.as_duration(),
            auth: resolve_auth(self.basic_auth.as_ref(), self.authorization.as_ref(), base, err)?,
            tls,
            follow_redirects: self.follow_redirects.unwrap_or(true),
            proxy_url: self.proxy_url.clone(),
        })
    }
}

/// One endpoint and what it last gave.
#[derive(Debug)]
pub struct HttpDiscovery {
    sd: HttpSd,
    client: Option<reqwest::Client>,
    rt: tokio::runtime::Handle,
    last_fetch: Option<Instant>,
    groups: Vec<TargetGroup>,
    /// Failed fetches or bad answers so far, for `/metrics`.
    pub errors: u64,
}

impl HttpDiscovery {
    pub fn new(sd: &HttpSd, rt: tokio::runtime::Handle) -> Self {
        let client = match super::scrape_loop::build_http_client(&sd.tls, sd.follow_redirects, sd.proxy_url.as_deref())
        {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(url = %sd.url, error = %e, "http_sd: cannot build the HTTP client");
                None
            }
        };
        HttpDiscovery { sd: sd.clone(), client, rt, last_fetch: None, groups: Vec::new(), errors: 0 }
    }

    /// Fetches the endpoint when its refresh interval has passed; `Some(groups)` when the
    /// target groups changed.
    pub fn poll(&mut self) -> Option<Vec<TargetGroup>> {
        if self.last_fetch.is_some_and(|t| t.elapsed() < self.sd.refresh) {
            return None;
        }
        self.last_fetch = Some(Instant::now());
        match self.fetch() {
            Ok(groups) if groups != self.groups => {
                self.groups = groups;
                Some(self.groups.clone())
            }
            Ok(_) => None,
            Err(e) => {
                self.errors += 1;
                tracing::warn!(url = %self.sd.url, error = %e, "http_sd: cannot read targets; keeping the last good ones");
                None
            }
        }
    }

    pub fn groups(&self) -> Vec<TargetGroup> {
        self.groups.clone()
    }

    fn fetch(&self) -> Result<Vec<TargetGroup>, String> {
        let client = self.client.clone().ok_or("no HTTP client (see the error at start)")?;
        let mut req = client
            .get(&self.sd.url)
            .header(reqwest::header::ACCEPT, "application/json")
            .timeout(FETCH_TIMEOUT.min(self.sd.refresh.max(MIN_FETCH_TIMEOUT)));
        match &self.sd.auth {
            Auth::None => {}
            Auth::Basic { username, password } => req = req.basic_auth(username, Some(password)),
            Auth::Header { kind, credentials } => {
                req = req.header(reqwest::header::AUTHORIZATION, format!("{kind} {credentials}"))
            }
        }
        // On a thread of its own: the caller may be a runtime's thread, where blocking on the
        // runtime is not allowed.
        let rt = self.rt.clone();
        let body = std::thread::scope(|s| {
            s.spawn(move || {
                rt.block_on(async move {
                    let resp = req.send().await.map_err(|e| super::scrape_loop::error_chain(&e))?;
                    if resp.status() != reqwest::StatusCode::OK {
                        return Err(format!("server returned HTTP status {}", resp.status()));
                    }
                    let ct =
                        resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
                    if ct.split(';').next().unwrap_or("").trim() != "application/json" {
                        return Err(format!("unsupported content type {ct:?}: expected application/json"));
                    }
                    let mut resp = resp;
                    let mut body = Vec::new();
                    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
                        body.extend_from_slice(&chunk);
                        if body.len() > MAX_BODY_BYTES {
                            return Err(format!("answer larger than {MAX_BODY_BYTES} bytes"));
                        }
                    }
                    Ok(body)
                })
            })
            .join()
            .unwrap_or_else(|_| Err("the fetch panicked".into()))
        })?;
        let text = String::from_utf8(body).map_err(|_| "the answer is not UTF-8".to_owned())?;
        let mut groups = parse_file(std::path::Path::new("http_sd.json"), &text)?;
        for (i, g) in groups.iter_mut().enumerate() {
            g.labels.remove("__meta_filepath");
            g.labels.insert("__meta_url".into(), self.sd.url.clone());
            g.source = format!("{}:{i}", self.sd.url);
        }
        Ok(groups)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// A one-route HTTP server answering each request with the next of `answers` (the last
    /// repeats): (status, content type, body). Counts requests and keeps the last one's head.
    fn serve(answers: Vec<(u16, &'static str, String)>) -> (String, Arc<AtomicUsize>, Arc<parking_lot::Mutex<String>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/targets", listener.local_addr().unwrap());
        let (n, head) = (Arc::new(AtomicUsize::new(0)), Arc::new(parking_lot::Mutex::new(String::new())));
        let (n2, head2) = (n.clone(), head.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                // The whole head, so that closing does not reset a connection with unread bytes.
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(k) => got.extend_from_slice(&buf[..k]),
                    }
                }
                *head2.lock() = String::from_utf8_lossy(&got).into_owned();
                let i = n2.fetch_add(1, Ordering::SeqCst);
                let (code, ct, body) = &answers[i.min(answers.len() - 1)];
                let _ = write!(
                    conn,
                    "HTTP/1.1 {code} X\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (url, n, head)
    }

    fn discovery(url: &str, auth: Auth, rt: &tokio::runtime::Runtime) -> HttpDiscovery {
        let sd = HttpSd {
            url: url.to_owned(),
            refresh: Duration::from_millis(1),
            auth,
            tls: TlsConfig::default(),
            follow_redirects: true,
            proxy_url: None,
        };
        HttpDiscovery::new(&sd, rt.handle().clone())
    }

    #[test]
    fn targets_come_from_the_endpoint_and_survive_its_failures() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let good = r#"[{"targets": ["10.0.0.1:9100", "10.0.0.2:9100"], "labels": {"env": "prod"}}]"#.to_owned();
        let (url, n, head) = serve(vec![
            (200, "application/json", good.clone()),
            (200, "application/json", good),
            (500, "application/json", "oops".into()),
            (200, "text/plain", "[]".into()),
            (200, "application/json", "not json".into()),
            (200, "application/json", "[]".into()),
        ]);
        let mut d = discovery(&url, Auth::Basic { username: "u".into(), password: "p".into() }, &rt);
        let first = d.poll();
        assert_eq!(d.errors, 0);
        let groups = first.expect("the first answer is a change");
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].targets.len(), 2);
        assert_eq!(groups[0].labels["env"], "prod");
        assert_eq!(groups[0].labels["__meta_url"], url);
        assert!(head.lock().contains("authorization: Basic dTpw"), "{}", head.lock());
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(d.poll(), None, "the same answer is no change");
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(2));
            assert_eq!(d.poll(), None, "a failure keeps the last targets");
        }
        assert_eq!(d.errors, 3);
        assert_eq!(d.groups().len(), 1);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(d.poll(), Some(vec![]), "an empty list empties");
        assert_eq!(n.load(Ordering::SeqCst), 6);
    }

    #[test]
    fn configuration_mistakes_are_named() {
        let err = |m: &str| format!("job \"x\": {m}");
        for (yaml, want) in [
            ("url: ftp://a/b\n", "the scheme must be http or https"),
            ("url: 'not a url'\n", "http_sd_configs url"),
            ("url: http://a/\nrefresh_interval: 0s\n", "refresh_interval must be above zero"),
        ] {
            let c: HttpSdConfig = yaml_serde::from_str(yaml).unwrap();
            let e = c.resolve(std::path::Path::new("."), &err).unwrap_err();
            assert!(e.contains(want) && e.starts_with("job \"x\""), "{e}");
        }
    }
}
