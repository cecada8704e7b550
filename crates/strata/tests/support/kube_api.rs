//! A stand-in Kubernetes API server for discovery tests: objects loaded from a recorded
//! `kubectl get … -o json` list, served as the real API server serves them to a list (one
//! page, with the list's resourceVersion) and to a watch (a chunked stream of
//! `{"type": …, "object": …}` lines from a resourceVersion on). The test changes objects
//! (each change is a watch event), ends every open watch (clients must resume from their last
//! resourceVersion), and compacts the event history (a watch from before it answers 410
//! Gone, so clients must list again), as an API server does when etcd compacts.
//!
//! HTTP/1.1 by hand, one request per connection (`Connection: close`): enough for kube's
//! client and client-go alike.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

/// Where each kind is served, by its `kind`.
const KINDS: &[(&str, &str, &str, bool)] = &[
    // (kind, API group path, plural, namespaced)
    ("Pod", "/api/v1", "pods", true),
    ("Service", "/api/v1", "services", true),
    ("Endpoints", "/api/v1", "endpoints", true),
    ("Node", "/api/v1", "nodes", false),
    ("EndpointSlice", "/apis/discovery.k8s.io/v1", "endpointslices", true),
    ("Ingress", "/apis/networking.k8s.io/v1", "ingresses", true),
];

fn api_version(group: &str) -> String {
    group.trim_start_matches("/api/").trim_start_matches("/apis/").trim_start_matches('/').to_owned()
}

#[derive(Default)]
struct State {
    rv: u64,
    /// (plural, namespace, name) → object.
    objects: BTreeMap<(String, String, String), Value>,
    /// (resourceVersion, plural, event type, object).
    events: Vec<(u64, String, &'static str, Value)>,
    /// Watches from a resourceVersion below this are answered 410 Gone.
    oldest_watchable: u64,
    /// Bumped to end every open watch.
    generation: u64,
    /// Request lines received, for assertions.
    requests: Vec<String>,
    /// `Authorization` headers received.
    authorizations: Vec<String>,
}

#[derive(Clone)]
pub struct FakeApiServer {
    pub url: String,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl FakeApiServer {
    /// Serves the objects of a `List` (as `kubectl get … -o json` prints it).
    pub fn start(list: &Value) -> FakeApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = FakeApiServer { url, state: Arc::new((Mutex::new(State::default()), Condvar::new())) };
        {
            let mut st = server.state.0.lock().unwrap();
            st.rv = 100;
            for item in list["items"].as_array().expect("a List's items") {
                let (plural, key) = Self::key_of(item);
                let mut item = item.clone();
                st.rv += 1;
                item["metadata"]["resourceVersion"] = json!(st.rv.to_string());
                st.objects.insert((plural, key.0, key.1), item);
            }
            st.oldest_watchable = st.rv;
        }
        let s = server.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let s = s.clone();
                std::thread::spawn(move || s.serve(conn));
            }
        });
        server
    }

    fn key_of(obj: &Value) -> (String, (String, String)) {
        let kind = obj["kind"].as_str().expect("every object has its kind");
        let plural = KINDS.iter().find(|k| k.0 == kind).unwrap_or_else(|| panic!("kind {kind} not served")).2;
        let meta = &obj["metadata"];
        let ns = meta["namespace"].as_str().unwrap_or("").to_owned();
        (plural.to_owned(), (ns, meta["name"].as_str().unwrap().to_owned()))
    }

    /// Adds or replaces an object: a watch event ADDED or MODIFIED.
    pub fn apply(&self, obj: Value) {
        let (plural, (ns, name)) = Self::key_of(&obj);
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap();
        st.rv += 1;
        let mut obj = obj;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let kind =
            if st.objects.insert((plural.clone(), ns, name), obj.clone()).is_some() { "MODIFIED" } else { "ADDED" };
        let rv = st.rv;
        st.events.push((rv, plural, kind, obj));
        cv.notify_all();
    }

    /// Removes an object: a watch event DELETED.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let plural = KINDS.iter().find(|k| k.0 == kind).unwrap().2.to_owned();
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap();
        let mut obj = st.objects.remove(&(plural.clone(), namespace.into(), name.into())).expect("object to delete");
        st.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let rv = st.rv;
        st.events.push((rv, plural, "DELETED", obj));
        cv.notify_all();
    }

    /// An object as served now.
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Value {
        let plural = KINDS.iter().find(|k| k.0 == kind).unwrap().2.to_owned();
        self.state.0.lock().unwrap().objects[&(plural, namespace.to_owned(), name.to_owned())].clone()
    }

    /// Ends every open watch: clients resume from their last resourceVersion.
    pub fn end_watches(&self) {
        let (lock, cv) = &*self.state;
        lock.lock().unwrap().generation += 1;
        cv.notify_all();
    }

    /// Deletes an object with no watch event for it, forgets the event history and ends every
    /// open watch, all at once: as when a client's watch was down while the object went and
    /// etcd compacted meanwhile. Every client's next watch gets 410 Gone; only a new list
    /// shows the object gone.
    pub fn delete_unseen(&self, kind: &str, namespace: &str, name: &str) {
        let plural = KINDS.iter().find(|k| k.0 == kind).unwrap().2.to_owned();
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap();
        st.objects.remove(&(plural, namespace.into(), name.into())).expect("object to delete");
        st.rv += 1;
        st.oldest_watchable = st.rv;
        st.events.clear();
        st.generation += 1;
        cv.notify_all();
    }

    /// The `Authorization` headers received so far.
    pub fn authorizations(&self) -> Vec<String> {
        self.state.0.lock().unwrap().authorizations.clone()
    }

    /// The request lines received so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.0.lock().unwrap().requests.clone()
    }

    fn serve(&self, conn: TcpStream) {
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            return;
        }
        let request = line.trim_end().to_owned();
        let mut authorization = None;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                break;
            }
            if let Some((name, value)) = h.split_once(':') {
                if name.eq_ignore_ascii_case("authorization") {
                    authorization = Some(value.trim().to_owned());
                }
            }
        }
        {
            let mut st = self.state.0.lock().unwrap();
            st.requests.push(request.clone());
            st.authorizations.extend(authorization);
        }
        let target = request.split(' ').nth(1).unwrap_or("/").to_owned();
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let params: BTreeMap<String, String> = form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        let mut conn = conn;
        if path == "/version" {
            let body = json!({"major": "1", "minor": "29", "gitVersion": "v1.29.4", "platform": "linux/amd64"});
            return respond(&mut conn, 200, &body);
        }
        let Some((plural, namespace)) = route(path) else {
            let body = status(404, "NotFound", &format!("the server could not find the requested resource ({path})"));
            return respond(&mut conn, 404, &body);
        };
        let matches = |obj: &Value| {
            namespace.as_ref().is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
                && params.get("labelSelector").is_none_or(|s| label_selector_matches(s, &obj["metadata"]["labels"]))
                && params.get("fieldSelector").is_none_or(|s| field_selector_matches(s, obj))
        };
        let watching = params.get("watch").is_some_and(|w| w == "true" || w == "1");
        if !watching {
            let st = self.state.0.lock().unwrap();
            let items: Vec<Value> =
                st.objects.iter().filter(|((p, _, _), o)| *p == plural && matches(o)).map(|(_, o)| o.clone()).collect();
            let (kind, group, _, _) = KINDS.iter().find(|k| k.2 == plural).unwrap();
            let body = json!({
                "kind": format!("{kind}List"),
                "apiVersion": api_version(group),
                "metadata": {"resourceVersion": st.rv.to_string()},
                "items": items,
            });
            drop(st);
            return respond(&mut conn, 200, &body);
        }
        let from: u64 = params.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let _ = write!(
            conn,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        );
        let (lock, cv) = &*self.state;
        let mut st = lock.lock().unwrap();
        if from < st.oldest_watchable {
            let gone = status(410, "Expired", &format!("too old resource version: {from} ({})", st.oldest_watchable));
            drop(st);
            let _ = chunk(&mut conn, &json!({"type": "ERROR", "object": gone}));
            let _ = conn.write_all(b"0\r\n\r\n");
            return;
        }
        let generation = st.generation;
        let mut sent_up_to = from;
        loop {
            let pending: Vec<Value> = st
                .events
                .iter()
                .filter(|(rv, p, _, o)| *rv > sent_up_to && *p == plural && matches(o))
                .map(|(_, _, kind, o)| json!({"type": kind, "object": o}))
                .collect();
            sent_up_to = st.rv;
            drop(st);
            for e in &pending {
                if chunk(&mut conn, e).is_err() {
                    return;
                }
            }
            st = lock.lock().unwrap();
            if st.generation != generation {
                break;
            }
            st = cv.wait_timeout(st, Duration::from_millis(200)).unwrap().0;
            if st.generation != generation {
                break;
            }
        }
        drop(st);
        let _ = conn.write_all(b"0\r\n\r\n");
    }
}

/// `(plural, namespace)` of an API path: `/api/v1/pods`, `/api/v1/namespaces/x/pods`,
/// `/apis/discovery.k8s.io/v1/namespaces/x/endpointslices`.
fn route(path: &str) -> Option<(String, Option<String>)> {
    for (_, group, plural, namespaced) in KINDS {
        let Some(rest) = path.strip_prefix(group) else { continue };
        if rest == format!("/{plural}") {
            return Some((plural.to_string(), None));
        }
        if *namespaced {
            let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
            if parts.len() == 3 && parts[0] == "namespaces" && parts[2] == *plural {
                return Some((plural.to_string(), Some(parts[1].to_owned())));
            }
        }
    }
    None
}

/// Equality selectors (`a=b`, `a==b`, `a!=b`), existence (`a`, `!a`), comma-separated.
fn label_selector_matches(sel: &str, labels: &Value) -> bool {
    sel.split(',').filter(|r| !r.is_empty()).all(|req| {
        let get = |k: &str| labels.get(k.trim()).and_then(Value::as_str);
        if let Some((k, v)) = req.split_once("!=") {
            get(k) != Some(v.trim())
        } else if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
            get(k) == Some(v.trim())
        } else if let Some(k) = req.strip_prefix('!') {
            get(k).is_none()
        } else {
            get(req).is_some()
        }
    })
}

/// `metadata.name`, `metadata.namespace` and `spec.nodeName`, with `=` and `!=`.
fn field_selector_matches(sel: &str, obj: &Value) -> bool {
    sel.split(',').filter(|r| !r.is_empty()).all(|req| {
        let (k, v, eq) = match req.split_once("!=") {
            Some((k, v)) => (k, v, false),
            None => {
                let (k, v) = req.split_once('=').expect("field selectors here are k=v or k!=v");
                (k, v.trim_start_matches('='), true)
            }
        };
        let got = match k {
            "metadata.name" => obj["metadata"]["name"].as_str(),
            "metadata.namespace" => obj["metadata"]["namespace"].as_str(),
            "spec.nodeName" => obj["spec"]["nodeName"].as_str(),
            other => panic!("field selector {other} not supported by the stand-in"),
        };
        (got.unwrap_or("") == v) == eq
    })
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn respond(conn: &mut TcpStream, code: u16, body: &Value) {
    let b = body.to_string();
    let _ = write!(
        conn,
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
        b.len()
    );
}

fn chunk(conn: &mut TcpStream, v: &Value) -> std::io::Result<()> {
    let line = format!("{v}\n");
    write!(conn, "{:x}\r\n{line}\r\n", line.len())?;
    conn.flush()
}
