//! Basic authentication against `basic_auth_users` (bcrypt hashes), the optional per-role
//! `strata_authorization` (403 for a user without the role a path needs), and the configured
//! response headers, as a layer in front of every endpoint (exporter-toolkit guards every
//! path, `/-/healthy` and `/metrics` included).
//!
//! bcrypt is slow on purpose (tens of milliseconds at the usual cost of 10), and a remote
//! writer or scraper sends the same credentials with every request: a successful check is
//! remembered by a SHA-256 of the user, password and hash, so a request costs a hash, not a
//! bcrypt. Failures are never remembered. bcrypt runs on a blocking thread, never on the
//! async workers, and an unknown user costs a bcrypt as well, so timing does not tell which
//! users exist.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use super::config::Role;
use super::WebConfigFile;

/// Successful checks remembered; the set is emptied when it reaches this size (a server has a
/// handful of users, each with one password).
const REMEMBERED_MAX: usize = 1024;

/// The authentication layer's state.
#[derive(Debug)]
pub struct Authenticator {
    pub config: Arc<WebConfigFile>,
    remembered: Mutex<HashSet<[u8; 32]>>,
}

impl Authenticator {
    pub fn new(config: Arc<WebConfigFile>) -> Arc<Authenticator> {
        Arc::new(Authenticator { config, remembered: Mutex::new(HashSet::new()) })
    }

    /// Whether `user` with `password` is allowed by `users`.
    async fn check(&self, users: &std::collections::BTreeMap<String, String>, user: &str, password: &str) -> bool {
        // An unknown user is checked against a hash of the same cost, for the same time.
        let (hash, known) = match users.get(user) {
            Some(h) => (h.clone(), true),
            None => (users.values().next().cloned().unwrap_or_default(), false),
        };
        let key: [u8; 32] = {
            let mut h = Sha256::new();
            for part in [user.as_bytes(), b"\0", password.as_bytes(), b"\0", hash.as_bytes()] {
                h.update(part);
            }
            h.finalize().into()
        };
        if known && self.remembered.lock().contains(&key) {
            return true;
        }
        let password = password.to_owned();
        let ok = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
            .await
            .unwrap_or(false)
            && known;
        if ok {
            let mut r = self.remembered.lock();
            if r.len() >= REMEMBERED_MAX {
                r.clear();
            }
            r.insert(key);
        }
        ok
    }
}

/// `user:password` from an `Authorization: Basic …` header.
fn basic_credentials(req: &Request) -> Option<(String, String)> {
    let v = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(rest.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

/// The layer: 401 without valid credentials when users are configured; the configured
/// headers on every response.
pub async fn authenticate(State(auth): State<Arc<Authenticator>>, req: Request, next: Next) -> Response {
    let config = auth.config.current();
    let mut resp = if config.users.is_empty() {
        next.run(req).await
    } else {
        let user = match basic_credentials(&req) {
            Some((u, p)) if auth.check(&config.users, &u, &p).await => Some(u),
            _ => None,
        };
        let role = Role::of(req.uri().path());
        if let Some(user) = user {
            match &config.authorization {
                Some(a) if !a.allows(&user, role) => (
                    StatusCode::FORBIDDEN,
                    format!("user {user:?} may not {} here (strata_authorization in the web config)\n", role.name()),
                )
                    .into_response(),
                _ => next.run(req).await,
            }
        } else {
            let mut r = (StatusCode::UNAUTHORIZED, "Unauthorized\n").into_response();
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
            r
        }
    };
    for (name, value) in &config.headers {
        resp.headers_mut().insert(name.clone(), value.clone());
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(auth: Option<&str>) -> Request {
        let mut b = Request::builder().uri("/");
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    #[test]
    fn credentials_are_read_from_basic_only() {
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            basic_credentials(&request(Some(&format!("Basic {}", enc("alice:pa:ss"))))),
            Some(("alice".into(), "pa:ss".into()))
        );
        assert_eq!(basic_credentials(&request(Some(&format!("bearer {}", enc("a:b"))))), None);
        assert_eq!(basic_credentials(&request(Some("Basic !!!"))), None);
        assert_eq!(basic_credentials(&request(Some(&format!("Basic {}", enc("nocolon"))))), None);
        assert_eq!(basic_credentials(&request(None)), None);
    }

    #[tokio::test]
    async fn only_the_right_password_passes_and_success_is_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let path = dir.path().join("web.yml");
        std::fs::write(&path, format!("basic_auth_users:\n  alice: {hash}\n")).unwrap();
        let auth = Authenticator::new(Arc::new(WebConfigFile::load(&path).unwrap()));
        let users = auth.config.current().users.clone();
        assert!(!auth.check(&users, "alice", "wrong").await);
        assert!(!auth.check(&users, "bob", "s3cret").await);
        assert!(auth.remembered.lock().is_empty(), "failures are not remembered");
        assert!(auth.check(&users, "alice", "s3cret").await);
        assert_eq!(auth.remembered.lock().len(), 1);
        assert!(auth.check(&users, "alice", "s3cret").await);
        assert!(!auth.check(&users, "alice", "s3cret ").await);
    }
}
