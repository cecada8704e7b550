//! `--web.config.file`: TLS and basic authentication for the HTTP API, in the format of
//! Prometheus' exporter-toolkit, so the file a Prometheus runs with works here unchanged:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: server.crt        # relative paths are relative to this file
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert   # or NoClientCert, VerifyClientCertIfGiven
//!   client_ca_file: ca.crt
//!   min_version: TLS12           # TLS12 or TLS13 (rustls speaks no older version)
//!   max_version: TLS13
//! http_server_config:
//!   headers:
//!     Strict-Transport-Security: max-age=31536000
//! basic_auth_users:
//!   alice: $2y$10$...            # bcrypt hashes (htpasswd -nBC 10 alice)
//! # Strata's addition, not in exporter-toolkit (promtool check web-config refuses the key):
//! # which users may do what. Without it every user above may do everything.
//! strata_authorization:
//!   read: [alice, grafana]       # queries, metadata, remote read, federate, export, /metrics
//!   write: [prometheus]          # remote write, import
//!   admin: [alice]               # /api/v1/admin/*, /-/reload, /-/quit
//! ```
//!
//! Without `cert_file` and `key_file` the server speaks plain HTTP (basic auth alone is
//! allowed, as in exporter-toolkit). The file and the certificate files are checked for
//! changes at most once a second, when a connection is accepted or a request authenticated,
//! and reloaded: certificates rotate without a restart. A file that no longer parses is
//! logged and the previous configuration stays in force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use axum::http::{HeaderName, HeaderValue};
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use tokio_rustls::TlsAcceptor;

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileText {
    #[serde(default)]
    tls_server_config: Option<TlsText>,
    #[serde(default)]
    http_server_config: Option<HttpText>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
    #[serde(default)]
    strata_authorization: Option<AuthorizationText>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthorizationText {
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
    #[serde(default)]
    admin: Vec<String>,
}

/// What a request does, for `strata_authorization`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Read,
    Write,
    Admin,
}

impl Role {
    /// The role a request needs: writes are remote write and import; admin is the admin API
    /// and the lifecycle endpoints; everything else reads.
    pub fn of(path: &str) -> Role {
        if path == "/api/v1/write" || path.starts_with("/api/v1/import/") {
            Role::Write
        } else if path.starts_with("/api/v1/admin/") || path == "/-/reload" || path == "/-/quit" {
            Role::Admin
        } else {
            Role::Read
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

/// Users allowed each role.
#[derive(Debug, Default)]
pub struct Authorization {
    read: std::collections::BTreeSet<String>,
    write: std::collections::BTreeSet<String>,
    admin: std::collections::BTreeSet<String>,
}

impl Authorization {
    pub fn allows(&self, user: &str, role: Role) -> bool {
        match role {
            Role::Read => &self.read,
            Role::Write => &self.write,
            Role::Admin => &self.admin,
        }
        .contains(user)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsText {
    #[serde(default)]
    cert_file: String,
    #[serde(default)]
    key_file: String,
    #[serde(default)]
    client_auth_type: Option<String>,
    #[serde(default)]
    client_ca_file: String,
    #[serde(default)]
    client_allowed_sans: Vec<String>,
    #[serde(default)]
    min_version: Option<String>,
    #[serde(default)]
    max_version: Option<String>,
    /// Go's cipher suite and curve names: rustls chooses its own safe set, so these are
    /// accepted and logged as ignored.
    #[serde(default)]
    cipher_suites: Vec<String>,
    #[serde(default)]
    curve_preferences: Vec<String>,
    #[serde(default)]
    prefer_server_cipher_suites: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpText {
    #[serde(default)]
    http2: Option<bool>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// Response headers the file may set: exporter-toolkit's list.
const SETTABLE_HEADERS: [&str; 5] = [
    "Content-Security-Policy",
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
];

/// One loaded configuration.
#[derive(Default)]
pub struct WebConfig {
    /// `None`: plain HTTP.
    pub tls: Option<TlsAcceptor>,
    /// User name → bcrypt hash; empty: no authentication.
    pub users: BTreeMap<String, String>,
    /// Added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `None`: every authenticated user may do everything.
    pub authorization: Option<Authorization>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("headers", &self.headers)
            .field("authorization", &self.authorization)
            .finish()
    }
}

impl WebConfig {
    /// Parses `text`; relative file names are resolved against `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<WebConfig, String> {
        let file: FileText = if text.trim().is_empty() {
            FileText::default()
        } else {
            yaml_serde::from_str(text).map_err(|e| e.to_string())?
        };
        let mut users = BTreeMap::new();
        for (user, hash) in file.basic_auth_users {
            if bcrypt_cost(&hash).is_none() {
                return Err(format!("basic_auth_users: the password of {user:?} is not a bcrypt hash"));
            }
            users.insert(user, hash);
        }
        let authorization = match file.strata_authorization {
            None => None,
            Some(a) => {
                if users.is_empty() {
                    return Err("strata_authorization: needs basic_auth_users (it names their users)".to_owned());
                }
                let mut out = Authorization::default();
                for (role, names, set) in [
                    ("read", a.read, &mut out.read),
                    ("write", a.write, &mut out.write),
                    ("admin", a.admin, &mut out.admin),
                ] {
                    for name in names {
                        if !users.contains_key(&name) {
                            return Err(format!("strata_authorization.{role}: {name:?} is not in basic_auth_users"));
                        }
                        set.insert(name);
                    }
                }
                Some(out)
            }
        };
        let mut headers = Vec::new();
        if let Some(http) = file.http_server_config {
            if http.http2 == Some(true) {
                tracing::info!("web config: http2 is not served (HTTP/1.1 only); ignored");
            }
            for (name, value) in http.headers {
                let Some(known) = SETTABLE_HEADERS.iter().find(|h| h.eq_ignore_ascii_case(&name)) else {
                    return Err(format!(
                        "http_server_config.headers: {name:?} can not be configured (allowed: {})",
                        SETTABLE_HEADERS.join(", ")
                    ));
                };
                let v = HeaderValue::from_str(&value)
                    .map_err(|_| format!("http_server_config.headers: invalid value for {known}: {value:?}"))?;
                headers.push((HeaderName::from_static(header_static(known)), v));
            }
        }
        let tls = match file.tls_server_config {
            Some(t) if !(t.cert_file.is_empty() && t.key_file.is_empty()) => Some(tls_acceptor(&t, dir)?),
            Some(t) if !t.client_ca_file.is_empty() => {
                return Err("tls_server_config: client_ca_file needs cert_file and key_file".to_owned())
            }
            _ => None,
        };
        Ok(WebConfig { tls, users, headers, authorization })
    }
}

/// The lower-case `'static` spelling of one of [`SETTABLE_HEADERS`].
fn header_static(name: &str) -> &'static str {
    match name {
        "Content-Security-Policy" => "content-security-policy",
        "Strict-Transport-Security" => "strict-transport-security",
        "X-Content-Type-Options" => "x-content-type-options",
        "X-Frame-Options" => "x-frame-options",
        _ => "x-xss-protection",
    }
}

/// The cost of a bcrypt hash (`$2a$`, `$2b$`, `$2x$` or `$2y$`, a cost, 53 characters of salt
/// and hash), or `None` if `hash` is not one.
fn bcrypt_cost(hash: &str) -> Option<u32> {
    let rest = ["$2a$", "$2b$", "$2x$", "$2y$"].iter().find_map(|p| hash.strip_prefix(p))?;
    let (cost, tail) = rest.split_once('$')?;
    (tail.len() == 53).then_some(())?;
    cost.parse().ok().filter(|c| (4..=31).contains(c))
}

fn tls_version(name: &str, what: &str) -> Result<Option<&'static rustls::SupportedProtocolVersion>, String> {
    match name {
        "TLS13" => Ok(Some(&rustls::version::TLS13)),
        "TLS12" => Ok(Some(&rustls::version::TLS12)),
        "TLS10" | "TLS11" => {
            tracing::warn!("web config: {what} {name} is below what rustls speaks; TLS 1.2 is the least offered");
            Ok(None)
        }
        other => Err(format!("tls_server_config.{what}: unknown TLS version {other:?} (TLS12 or TLS13)")),
    }
}

fn tls_acceptor(t: &TlsText, dir: &Path) -> Result<TlsAcceptor, String> {
    if t.cert_file.is_empty() || t.key_file.is_empty() {
        return Err("tls_server_config: cert_file and key_file must both be set".to_owned());
    }
    if !t.client_allowed_sans.is_empty() {
        return Err("tls_server_config: client_allowed_sans is not supported yet".to_owned());
    }
    if !t.cipher_suites.is_empty() || !t.curve_preferences.is_empty() || t.prefer_server_cipher_suites.is_some() {
        tracing::warn!("web config: cipher_suites, curve_preferences and prefer_server_cipher_suites are ignored (rustls picks from its own safe set)");
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join(&t.cert_file))
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("tls_server_config.cert_file {:?}: {e}", t.cert_file))?;
    if certs.is_empty() {
        return Err(format!("tls_server_config.cert_file {:?}: no certificate in it", t.cert_file));
    }
    let key = PrivateKeyDer::from_pem_file(dir.join(&t.key_file))
        .map_err(|e| format!("tls_server_config.key_file {:?}: {e}", t.key_file))?;
    let min = tls_version(t.min_version.as_deref().unwrap_or("TLS12"), "min_version")?;
    let max = tls_version(t.max_version.as_deref().unwrap_or("TLS13"), "max_version")?;
    let all = [&rustls::version::TLS12, &rustls::version::TLS13];
    let rank = |v: &rustls::SupportedProtocolVersion| if v.version == rustls::ProtocolVersion::TLSv1_3 { 1 } else { 0 };
    let lo = min.map_or(0, rank);
    let hi = max.map_or(0, rank);
    if lo > hi {
        return Err("tls_server_config: min_version is above max_version".to_owned());
    }
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        all.into_iter().filter(|v| (lo..=hi).contains(&rank(v))).collect();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| format!("tls_server_config: {e}"))?;
    let auth_type = t.client_auth_type.as_deref().unwrap_or("NoClientCert");
    let builder = match auth_type {
        "NoClientCert" if t.client_ca_file.is_empty() => builder.with_no_client_auth(),
        "NoClientCert" => {
            return Err("tls_server_config: client_ca_file is set but client_auth_type is NoClientCert".to_owned())
        }
        "RequireAndVerifyClientCert" | "VerifyClientCertIfGiven" => {
            if t.client_ca_file.is_empty() {
                return Err(format!("tls_server_config: client_auth_type {auth_type} needs client_ca_file"));
            }
            let mut roots = rustls::RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(dir.join(&t.client_ca_file))
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("tls_server_config.client_ca_file {:?}: {e}", t.client_ca_file))?;
            for ca in cas {
                roots.add(ca).map_err(|e| format!("tls_server_config.client_ca_file {:?}: {e}", t.client_ca_file))?;
            }
            let mut v = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if auth_type == "VerifyClientCertIfGiven" {
                v = v.allow_unauthenticated();
            }
            builder.with_client_cert_verifier(v.build().map_err(|e| format!("tls_server_config: {e}"))?)
        }
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err(format!(
                "tls_server_config: client_auth_type {auth_type} (a client certificate taken without verifying it) is not supported; use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
            ))
        }
        other => return Err(format!("tls_server_config: unknown client_auth_type {other:?}")),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| format!("tls_server_config: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// What the loaded configuration was read from: each file's modification time and length.
type Stamp = Vec<(PathBuf, Option<(SystemTime, u64)>)>;

/// `--web.config.file`, reloaded when it or a file it names changes.
#[derive(Debug)]
pub struct WebConfigFile {
    path: PathBuf,
    state: Mutex<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    config: Arc<WebConfig>,
    stamp: Stamp,
    checked: Instant,
}

/// How often the files are looked at for changes.
const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

impl WebConfigFile {
    /// Loads `path`; an error here stops the server from starting.
    pub fn load(path: &Path) -> Result<WebConfigFile, String> {
        let (config, stamp) = read(path)?;
        Ok(WebConfigFile {
            path: path.to_owned(),
            state: Mutex::new(Loaded { config: Arc::new(config), stamp, checked: Instant::now() }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration in force, reloaded first if a file changed.
    pub fn current(&self) -> Arc<WebConfig> {
        let mut st = self.state.lock();
        if st.checked.elapsed() >= RECHECK_INTERVAL {
            st.checked = Instant::now();
            let stamp = stamp_of(&self.path, &st.stamp);
            if stamp != st.stamp {
                match read(&self.path) {
                    Ok((config, stamp)) => {
                        tracing::info!(file = %self.path.display(), "web configuration reloaded");
                        st.config = Arc::new(config);
                        st.stamp = stamp;
                    }
                    Err(e) => {
                        // Keep serving with the last good configuration, and say so once per
                        // change (the stamp is taken so the same error is not logged again).
                        tracing::error!(file = %self.path.display(), error = %e, "web configuration not reloaded; the previous one stays in force");
                        st.stamp = stamp;
                    }
                }
            }
        }
        st.config.clone()
    }

    /// The TLS acceptor in force (`None`: plain HTTP).
    pub fn acceptor(&self) -> Option<TlsAcceptor> {
        self.current().tls.clone()
    }
}

fn read(path: &Path) -> Result<(WebConfig, Stamp), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let config = WebConfig::parse(&text, dir).map_err(|e| format!("{}: {e}", path.display()))?;
    // The files it names, for reloading when a certificate is replaced.
    let mut files = vec![path.to_owned()];
    if let Ok(FileText { tls_server_config: Some(t), .. }) = yaml_serde::from_str::<FileText>(&text) {
        for f in [&t.cert_file, &t.key_file, &t.client_ca_file] {
            if !f.is_empty() {
                files.push(dir.join(f));
            }
        }
    }
    let stamp = files.into_iter().map(|f| (f.clone(), file_stamp(&f))).collect();
    Ok((config, stamp))
}

fn file_stamp(f: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(f).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// The stamps of the same files now (the configuration file first, whose change may name
/// other files: reading it again finds them).
fn stamp_of(path: &Path, old: &Stamp) -> Stamp {
    let mut files: Vec<PathBuf> = old.iter().map(|(f, _)| f.clone()).collect();
    if files.is_empty() {
        files.push(path.to_owned());
    }
    files.into_iter().map(|f| (f.clone(), file_stamp(&f))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcrypt_hashes_are_recognised() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        assert_eq!(bcrypt_cost(&hash), Some(4));
        assert_eq!(bcrypt_cost(&hash.replacen("$04$", "$99$", 1)), None);
        assert_eq!(bcrypt_cost(&hash[..hash.len() - 1]), None);
        assert_eq!(bcrypt_cost(&hash.replacen("$2b$", "$2y$", 1)), Some(4));
        assert_eq!(bcrypt_cost("secret"), None);
    }

    #[test]
    fn plain_http_with_users_and_headers() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let text =
            format!("basic_auth_users:\n  alice: {hash}\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n");
        let c = WebConfig::parse(&text, Path::new(".")).unwrap();
        assert!(c.tls.is_none());
        assert_eq!(c.users.len(), 1);
        assert_eq!(c.headers[0].0.as_str(), "x-frame-options");
        assert!(WebConfig::parse("", Path::new(".")).unwrap().users.is_empty());
    }

    #[test]
    fn roles_by_path() {
        for (path, role) in [
            ("/api/v1/write", Role::Write),
            ("/api/v1/import/prometheus", Role::Write),
            ("/api/v1/admin/tsdb/delete_series", Role::Admin),
            ("/-/reload", Role::Admin),
            ("/-/quit", Role::Admin),
            ("/api/v1/query", Role::Read),
            ("/api/v1/read", Role::Read),
            ("/federate", Role::Read),
            ("/metrics", Role::Read),
            ("/-/healthy", Role::Read),
            ("/api/v1/writeX", Role::Read),
        ] {
            assert_eq!(Role::of(path), role, "{path}");
        }
    }

    #[test]
    fn mistakes_are_named() {
        let hash = bcrypt::hash("pw", 4).unwrap();
        let unknown_user = format!("basic_auth_users:\n  alice: {hash}\nstrata_authorization:\n  write: [bob]\n");
        for (text, want) in [
            ("basic_auth_users:\n  bob: plain\n", "not a bcrypt hash"),
            ("strata_authorization:\n  read: [bob]\n", "needs basic_auth_users"),
            (unknown_user.as_str(), "\"bob\" is not in basic_auth_users"),
            ("strata_authorization:\n  reader: [bob]\n", "unknown field"),
            ("tls_server_config:\n  cert_file: a.crt\n", "must both be set"),
            ("tls_srever_config: {}\n", "unknown field"),
            ("http_server_config:\n  headers:\n    Server: x\n", "can not be configured"),
            ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n", "nonexistent.crt"),
            ("tls_server_config:\n  client_ca_file: ca.crt\n", "needs cert_file"),
        ] {
            let err = WebConfig::parse(text, Path::new("/")).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
