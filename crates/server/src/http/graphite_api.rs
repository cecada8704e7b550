//! Graphite's HTTP API, as graphite-web serves it (also under `/graphite/`, and with the
//! trailing slash graphite-web's cluster requests carry): `/metrics/find` in graphite-web's
//! `treejson` (its default, what Grafana's Graphite data source reads), `completer`, `json`,
//! `pickle` and `msgpack` formats, `/metrics/expand`, `/metrics/index.json`, the tag endpoints,
//! and `/render` of paths, globs, `seriesByTag` and functions over them in the `json`, `csv`,
//! `raw`, `pickle` and `msgpack` formats (`pickle`, or `msgpack` when configured so, is what
//! graphite-web reads from the servers in its `CLUSTER_SERVERS`). Paths are the `__name__` of
//! stored series (`docs/graphite.md`); reads go through the same slots, deadline and limits as
//! PromQL's.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::http::{HeaderMap, Method};
use axum::response::IntoResponse;
use serde_json::{json, Value};
use strata_graphite::attime::{parse_at_time, time_zone, TimeZone};
use strata_graphite::carbonapi;
use strata_graphite::find::Node;
use strata_graphite::functions::{self, Series as FnSeries};
use strata_graphite::glob::Glob;
use strata_graphite::render::{
    to_csv, to_json, to_msgpack, to_pickle, to_raw, write_json, Fetched, Series as RenderSeries,
};
use strata_graphite::schema::Policy;
use strata_graphite::tagexpr::{parse_all, series_by_tag_args, TagExpr, TagOp};
use strata_graphite::target::{self, Expr};
use strata_model::{Labels, MatchOp, Matcher, METRIC_NAME};
use strata_tsdb::index::name_dict::{cached_pattern, NamePattern, NodeSet, LEAF};
use strata_tsdb::querier::Querier;

use super::graphite_tiers::{answer_from_tiers, graphite_tiers, pick_tiers};
use super::{
    db, limited_querier, params, read_body, read_limits, run_query, streamed_body, ApiError, ApiResult, AppState,
    Limits, Params, RESPONSE_CHUNK_BYTES, STREAMED_RESPONSE_POINTS,
};

/// A glob from a request parameter; a 400 naming the parameter and the component.
fn parse_glob(param: &str, text: &str) -> Result<Glob, ApiError> {
    Glob::parse(text).map_err(|e| ApiError::bad_data(format!("{param} {text:?}: {e}")))
}

/// Every path (`__name__` value) the querier sees, sorted.
fn all_paths(q: &Querier<'_>) -> Result<Vec<String>, ApiError> {
    q.label_values("__name__", &[]).map_err(|e| ApiError::execution(e.to_string()))
}

/// The compiled form of `glob` the names indexes walk; a 400 for a glob too complex for one.
fn glob_pattern(param: &str, glob: &Glob) -> Result<Arc<NamePattern>, ApiError> {
    cached_pattern(&glob.to_regex()).map_err(|e| ApiError::bad_data(format!("{param}: {e}")))
}

/// The nodes `pattern` (a glob's) names, from the names indexes of the head and the blocks
/// the querier reads, sorted; at most `--query.max-series` of them.
fn nodes_of(q: &Querier<'_>, pattern: &NamePattern, limits: &Limits) -> Result<NodeSet, ApiError> {
    q.find_names(pattern, limits.max_query_series).map_err(|e| ApiError::execution(e.to_string()))
}

/// The nodes of a set, their paths borrowed from it.
fn as_nodes(set: &NodeSet) -> Vec<Node<'_>> {
    set.iter_text().map(|(path, flags)| Node::new(path, flags & LEAF != 0)).collect()
}

/// A request's clock: the time zone its times are read in (`tz`, else `--graphite.time-zone`)
/// and `now` (graphite-web passes its own to its cluster servers, so that all answer alike).
fn request_clock(st: &AppState, p: &Params) -> Result<(TimeZone, i64), ApiError> {
    let tz = match p.get("tz").filter(|s| !s.is_empty()) {
        None => st.graphite_time_zone.lock().clone(),
        Some(name) => time_zone(name).map_err(|e| ApiError::bad_data(format!("tz: {e}")))?,
    };
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let now = match p.get("now").filter(|s| !s.is_empty()) {
        None => clock,
        Some(s) => parse_at_time(s, clock, &tz)
            .ok_or_else(|| ApiError::bad_data(format!("now={s:?} is not a time Graphite understands")))?,
    };
    Ok((tz, now))
}

/// graphite-web's order of a find's nodes: by name (the last component), nodes of one name by
/// path (graphite-web lists those in random order). The nodes come sorted by path, so a find
/// whose nodes share one name (`*.*.*.net.eth0.rx_bytes`) is only checked.
///
/// Each node's name is found once, and the nodes are placed by a counting sort over the
/// ranks of their distinct names: a find's names repeat (`servers.dc2.*.load.1*` gives 4000
/// nodes of two names), and sorting the nodes by comparing their names was a quarter of such
/// a `completer` find.
fn by_name(nodes: &mut Vec<Node>) {
    let names: Vec<&str> = nodes.iter().map(Node::name).collect();
    if names.windows(2).all(|w| w[0] <= w[1]) {
        return;
    }
    // Each distinct name's id (in the order first met), then its rank among them.
    let mut ids: std::collections::HashMap<&str, usize, foldhash::fast::RandomState> = Default::default();
    let id_of: Vec<usize> = names
        .iter()
        .map(|&name| {
            let next = ids.len();
            *ids.entry(name).or_insert(next)
        })
        .collect();
    let mut distinct: Vec<(&str, usize)> = ids.into_iter().collect();
    distinct.sort_unstable();
    let mut rank_of = vec![0; distinct.len()];
    for (rank, &(_, id)) in distinct.iter().enumerate() {
        rank_of[id] = rank;
    }
    // Where each rank's nodes start, then the nodes placed in path order within their rank.
    let mut next = vec![0usize; distinct.len() + 1];
    for &id in &id_of {
        next[rank_of[id] + 1] += 1;
    }
    for r in 1..next.len() {
        next[r] += next[r - 1];
    }
    let mut order = vec![0; nodes.len()];
    for (i, &id) in id_of.iter().enumerate() {
        let slot = &mut next[rank_of[id]];
        order[*slot] = i;
        *slot += 1;
    }
    let mut taken: Vec<Option<Node>> = std::mem::take(nodes).into_iter().map(Some).collect();
    nodes.extend(order.into_iter().map(|i| taken[i].take().expect("each node is placed once")));
}

/// `from` or `until` of a find, in milliseconds: Graphite's time syntax (epoch seconds as
/// Grafana sends them, `-1h`, `now-2d`, `HH:MM_YYYYMMDD`); absent or `-1` is no bound.
fn find_bound(p: &Params, name: &str, (tz, now): &(TimeZone, i64), unbounded: i64) -> Result<i64, ApiError> {
    match p.get(name) {
        None | Some("" | "-1") => Ok(unbounded),
        Some(s) => parse_at_time(s, *now, tz)
            .map(|seconds| seconds.saturating_mul(1000))
            .ok_or_else(|| ApiError::bad_data(format!("{name}={s:?} is not a time Graphite understands"))),
    }
}

/// An integer parameter as graphite-web reads one (`leavesOnly`, `wildcards`, `position`…): a
/// 400 naming it when it is not an integer.
fn int_param(p: &Params, name: &str, default: i64) -> Result<i64, ApiError> {
    match p.get(name) {
        None => Ok(default),
        Some(s) => s.trim().parse::<i64>().map_err(|_| ApiError::bad_data(format!("{name}={s:?} is not an integer"))),
    }
}

/// The glob a `completer` find searches, as graphite-web rewrites it: `..` is `*.`, a trailing
/// `*` is added (the user is still typing the last component), and with `automatic_variants`
/// a component with commas but no braces becomes an alternation (`a,b` is `{a,b}`).
fn completer_query(query: &str, automatic_variants: bool) -> String {
    let mut q = query.replace("..", "*.");
    if !q.ends_with('*') {
        q.push('*');
    }
    if automatic_variants {
        q = q
            .split('.')
            .map(|part| if part.contains(',') && !part.contains('{') { format!("{{{part}}}") } else { part.to_owned() })
            .collect::<Vec<_>>()
            .join(".");
    }
    q
}

/// `/metrics/find`: the nodes `query` (a glob) names, in the `format` asked; a protobuf body is
/// carbonapi v3's `MultiGlobRequest`, several queries answered at once.
pub(super) async fn find(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let (v3_request, p) = if is_protobuf(&method, &headers) {
        let what = "carbonapi_v3_pb MultiGlobRequest";
        (Some(protobuf_body::<carbonapi::MultiGlobRequest>(&st, body, what).await?), Params::from_query(raw))
    } else {
        // Grafana posts its finds as a form.
        (None, params(&st, &method, raw, &headers, body).await?)
    };
    let format =
        p.get("format").unwrap_or(if v3_request.is_some() { "carbonapi_v3_pb" } else { "treejson" }).to_owned();
    if !matches!(
        format.as_str(),
        "treejson"
            | "completer"
            | "json"
            | "nodelist"
            | "pickle"
            | "msgpack"
            | "protobuf"
            | "carbonapi_v2_pb"
            | "carbonapi_v3_pb"
    ) {
        return Err(ApiError::bad_data(format!(
            "format {format:?} is not supported: use treejson (the default), completer, json, nodelist, \
             pickle, msgpack, protobuf (carbonapi_v2_pb) or carbonapi_v3_pb"
        )));
    }
    let jsonp = jsonp_param(&p)?;
    let wildcards = int_param(&p, "wildcards", 0)? != 0;
    let leaves_only = int_param(&p, "leavesOnly", 0)? != 0;
    let position = int_param(&p, "position", -1)?;
    let automatic_variants = int_param(&p, "automatic_variants", 0)? != 0;
    let queries: Vec<String> = match &v3_request {
        Some(r) => r.metrics.clone(),
        None => p.get("query").filter(|q| !q.is_empty()).map(str::to_owned).into_iter().collect(),
    };
    if queries.is_empty() {
        return Err(ApiError::bad_data("missing parameter \"query\""));
    }
    let searched: Vec<String> = if format == "completer" {
        queries.iter().map(|q| completer_query(q, automatic_variants)).collect()
    } else {
        queries.clone()
    };
    let patterns =
        searched.iter().map(|q| glob_pattern("query", &parse_glob("query", q)?)).collect::<Result<Vec<_>, _>>()?;
    let (from, until) = match &v3_request {
        // 0: no bound, as carbonapi sends it for a find without a range.
        Some(r) => (
            if r.start_time == 0 { i64::MIN } else { r.start_time.saturating_mul(1000) },
            if r.stop_time == 0 { i64::MAX } else { r.stop_time.saturating_mul(1000) },
        ),
        None => {
            let clock = request_clock(&st, &p)?;
            (find_bound(&p, "from", &clock, i64::MIN)?, find_bound(&p, "until", &clock, i64::MAX)?)
        }
    };
    let db = db(&st)?;
    let st2 = st.clone();
    // treejson answers the first node of each name: only those are kept as the walk meets
    // nodes (not with `wildcards`, which asks whether more than one node matched, nor
    // `leavesOnly`, which picks the first leaf).
    let first_of_each_name = format == "treejson" && !wildcards && !leaves_only;
    let found = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, from, until);
        let limit = st2.limits.max_query_series;
        let nodes_of = |pattern: &Arc<NamePattern>| {
            if first_of_each_name { q.find_first_of_each_name(pattern, limit) } else { q.find_names(pattern, limit) }
                .map_err(|e| ApiError::execution(e.to_string()))
        };
        patterns.iter().map(nodes_of).collect::<Result<Vec<_>, _>>()
    })
    .await?;
    let nodes_of_set = |set| {
        let mut nodes = as_nodes(set);
        if leaves_only {
            nodes.retain(|n| n.is_leaf);
        }
        nodes
    };
    if format == "carbonapi_v3_pb" {
        let per_query: Vec<_> = queries.into_iter().zip(found.iter().map(nodes_of_set)).collect();
        return Ok(protobuf(carbonapi::find_v3(&per_query)));
    }
    let (query, mut nodes) = (&queries[0], nodes_of_set(&found[0]));
    if !matches!(format.as_str(), "protobuf" | "carbonapi_v2_pb") {
        by_name(&mut nodes);
    }
    let interval = || data_interval(&st);
    let jsonp = jsonp.as_deref();
    Ok(match format.as_str() {
        "completer" => json_or_jsonp(completer(&nodes, wildcards), jsonp),
        "nodelist" => json_or_jsonp(node_list(&nodes, position)?, jsonp),
        "json" => json_or_jsonp(nodes_json(&nodes, interval()), jsonp),
        "pickle" => ([(header::CONTENT_TYPE, "application/pickle")], pickle_nodes(&nodes, interval())).into_response(),
        "msgpack" => {
            ([(header::CONTENT_TYPE, "application/x-msgpack")], msgpack_nodes(&nodes, interval())).into_response()
        }
        "protobuf" | "carbonapi_v2_pb" => protobuf(carbonapi::find_v2(query, &nodes)),
        _ => json_or_jsonp(tree_json(&nodes, query, wildcards), jsonp),
    })
}

/// A protobuf answer (carbonapi's formats).
fn protobuf(body: Vec<u8>) -> axum::response::Response {
    ([(header::CONTENT_TYPE, "application/x-protobuf")], body).into_response()
}

/// The span a leaf has data for (graphite-web's `intervals` of a find's leaves; it picks among
/// cluster servers holding one path by them): from the oldest sample stored to now, seconds.
fn data_interval(st: &AppState) -> (i64, i64) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let Ok(db) = db(st) else { return (now, now) };
    let head = db.head().time_range().map(|(min, _)| min);
    let blocks = db.blocks().first().map(|b| b.meta().min_time);
    let oldest = head.into_iter().chain(blocks).min().map_or(now, |ms| ms.div_euclid(1000));
    (oldest.min(now), now)
}

/// graphite-web's find `format=json`: per node its path and whether it is a leaf, and for a
/// leaf its intervals, sorted by path.
fn nodes_json(nodes: &[Node], (start, end): (i64, i64)) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + nodes.len() * 96);
    out.push(b'[');
    for (i, n) in nodes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"path\":");
        json_string(&mut out, &[n.path()]);
        if n.is_leaf {
            let _ = write!(out, ",\"is_leaf\":true,\"intervals\":[{{\"start\":{start},\"end\":{end}}}]}}");
        } else {
            out.extend_from_slice(b",\"is_leaf\":false}");
        }
    }
    out.push(b']');
    out
}

/// Appends the concatenation of `parts` as one JSON string.
fn json_string(out: &mut Vec<u8>, parts: &[&str]) {
    out.push(b'"');
    for part in parts {
        escaped(out, part.as_bytes(), needs_escape(part.as_bytes()));
    }
    out.push(b'"');
}

/// Whether `bytes` hold a character a JSON string must escape.
fn needs_escape(bytes: &[u8]) -> bool {
    // Without an early exit the check runs many bytes per instruction.
    bytes.iter().fold(false, |any, &b| any | (b == b'"') | (b == b'\\') | (b < 0x20))
}

/// Appends `bytes` as the inside of a JSON string (escaped where `needs_escape` said so).
fn escaped(out: &mut Vec<u8>, bytes: &[u8], needs_escape: bool) {
    if !needs_escape {
        out.extend_from_slice(bytes);
        return;
    }
    for &b in bytes {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => {
                let _ = write!(out, "\\u{b:04x}");
            }
            _ => out.push(b),
        }
    }
}

/// graphite-web's find `format=pickle`, what it reads from its `CLUSTER_SERVERS`: a list of
/// dicts as `nodes_json`'s, intervals as `(start, end)` tuples.
fn pickle_nodes(nodes: &[Node], (start, end): (i64, i64)) -> Vec<u8> {
    let mut p = strata_graphite::pickle::Pickler::new();
    p.begin_list();
    for n in nodes {
        p.begin_dict().str("path").str(n.path()).str("is_leaf").bool(n.is_leaf);
        if n.is_leaf {
            p.str("intervals").begin_list().begin_tuple().int(start).int(end).end().end();
        }
        p.end();
    }
    p.end();
    p.finish()
}

/// graphite-web's find `format=msgpack`: the pickle format's dicts, intervals as
/// `[start, end]` arrays, in MessagePack.
fn msgpack_nodes(nodes: &[Node], (start, end): (i64, i64)) -> Vec<u8> {
    let mut p = strata_graphite::msgpack::Packer::new();
    p.array(nodes.len());
    for n in nodes {
        p.map(if n.is_leaf { 3 } else { 2 });
        p.str("path").str(n.path()).str("is_leaf").bool(n.is_leaf);
        if n.is_leaf {
            p.str("intervals").array(1).array(2).int(start).int(end);
        }
    }
    p.finish()
}

/// `/metrics/expand`: the paths every `query` glob matches (branches too unless
/// `leavesOnly=1`), one sorted list, or per query with `groupByExpr=1`, as graphite-web answers.
pub(super) async fn expand(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let flag = |name: &str| p.get(name).is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let (leaves_only, group) = (flag("leavesOnly"), flag("groupByExpr"));
    let jsonp = jsonp_param(&p)?;
    let queries: Vec<String> = p.all("query").into_iter().filter(|q| !q.is_empty()).map(str::to_owned).collect();
    if queries.is_empty() {
        return Err(ApiError::bad_data("missing parameter \"query\""));
    }
    let patterns =
        queries.iter().map(|q| glob_pattern("query", &parse_glob("query", q)?)).collect::<Result<Vec<_>, _>>()?;
    let db = db(&st)?;
    let st2 = st.clone();
    let found = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, i64::MIN, i64::MAX);
        let mut out = Vec::with_capacity(patterns.len());
        for pattern in &patterns {
            let nodes = nodes_of(&q, pattern, &st2.limits)?;
            let paths = nodes.iter().filter(|(_, flags)| flags & LEAF != 0 || !leaves_only);
            out.push(paths.map(|(path, _)| String::from_utf8_lossy(path).into_owned()).collect::<Vec<_>>());
        }
        Ok(out)
    })
    .await?;
    let results = if group {
        Value::Object(queries.into_iter().zip(found).map(|(q, paths)| (q, json!(paths))).collect())
    } else {
        let all: std::collections::BTreeSet<String> = found.into_iter().flatten().collect();
        json!(all)
    };
    Ok(json_or_jsonp(json!({ "results": results }).to_string().into_bytes(), jsonp.as_deref()))
}

/// `/metrics/index.json`: every path, sorted, as graphite-web lists its index.
pub(super) async fn index_json(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let jsonp = jsonp_param(&Params::from_query(raw))?;
    let db = db(&st)?;
    let st2 = st.clone();
    let paths = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, i64::MIN, i64::MAX);
        let paths = all_paths(&q)?;
        if paths.len() > st2.limits.max_query_series {
            return Err(ApiError::execution(format!(
                "the index holds more than {} paths (--query.max-series)",
                st2.limits.max_query_series
            )));
        }
        Ok(paths)
    })
    .await?;
    Ok(json_or_jsonp(json!(paths).to_string().into_bytes(), jsonp.as_deref()))
}

/// graphite-web's `treejson` of nodes in name order (`by_name`): one object per node name (the
/// first node of each name), branches before leaves, each `id` the query's text up to its last
/// dot followed by the name (graphite-web builds ids from the query, so a glob's ids keep its
/// wildcards); with `wildcards`, a `*` node first when more than one node matched.
fn tree_json(nodes: &[Node], query: &str, wildcards: bool) -> Vec<u8> {
    // An id is the query up to its last dot, and the node's name.
    let base = query.rsplit_once('.').map_or("", |(b, _)| &query[..b.len() + 1]);
    let mut out = Vec::with_capacity(2 + nodes.len() * 128);
    let node = |out: &mut Vec<u8>, text: &str, leaf: bool| {
        if out.len() > 1 {
            out.push(b',');
        }
        let branch = u8::from(!leaf);
        let _ = write!(out, "{{\"allowChildren\":{branch},\"expandable\":{branch},\"id\":");
        json_string(out, &[base, text]);
        let _ = write!(out, ",\"leaf\":{},\"text\":", u8::from(leaf));
        json_string(out, &[text]);
        out.push(b'}');
    };
    out.push(b'[');
    if nodes.len() > 1 && wildcards {
        node(&mut out, "*", nodes.iter().all(|n| n.is_leaf));
    }
    // In name order (`by_name`) a name's nodes are adjacent: the first of each is kept.
    debug_assert!(nodes.windows(2).all(|w| w[0].name() <= w[1].name()), "nodes not in name order");
    let mut leaves = Vec::new();
    let mut previous: Option<&str> = None;
    for n in nodes {
        let name = n.name();
        if previous == Some(name) {
            continue;
        }
        previous = Some(name);
        if n.is_leaf {
            leaves.push(name);
        } else {
            node(&mut out, name, false);
        }
    }
    for name in leaves {
        node(&mut out, name, true);
    }
    out.push(b']');
    out
}

/// graphite-web's `completer`: a branch's path ends with a dot; with `wildcards`, a `*` entry
/// last when more than one node matched.
fn completer(nodes: &[Node], wildcards: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + nodes.len() * 96);
    out.extend_from_slice(b"{\"metrics\":[");
    for (i, n) in nodes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // The name is the path's end: one check for escapes serves both.
        let escape = needs_escape(n.path().as_bytes());
        out.extend_from_slice(b"{\"path\":\"");
        escaped(&mut out, n.path().as_bytes(), escape);
        out.extend_from_slice(if n.is_leaf { b"\",\"name\":\"" } else { b".\",\"name\":\"" });
        escaped(&mut out, n.name().as_bytes(), escape);
        out.extend_from_slice(if n.is_leaf { b"\",\"is_leaf\":\"1\"}" } else { b"\",\"is_leaf\":\"0\"}" });
    }
    if nodes.len() > 1 && wildcards {
        out.extend_from_slice(b",{\"name\":\"*\"}");
    }
    out.extend_from_slice(b"]}");
    out
}

/// graphite-web's `nodelist`: the distinct path components at `position` (Python's
/// indexing: -1, the default, is the last) of the found nodes, sorted, as `{"nodes": [...]}`.
/// A node without that component is a 400 (graphite-web fails the request).
fn node_list(nodes: &[Node], position: i64) -> Result<Vec<u8>, ApiError> {
    let mut found = std::collections::BTreeSet::new();
    for n in nodes {
        let parts: Vec<&str> = n.path().split('.').collect();
        let at = if position < 0 { parts.len() as i64 + position } else { position };
        let part = usize::try_from(at).ok().and_then(|i| parts.get(i)).ok_or_else(|| {
            ApiError::bad_data(format!("position={position}: {:?} has {} components", n.path(), parts.len()))
        })?;
        found.insert(*part);
    }
    Ok(serde_json::to_vec(&json!({ "nodes": found })).expect("strings serialize"))
}

/// Whether a request's body is a protobuf message (carbonapi's v3 requests).
fn is_protobuf(method: &Method, headers: &HeaderMap) -> bool {
    *method == Method::POST
        && headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-protobuf") || v.starts_with("application/protobuf"))
}

/// A protobuf request body of type `M`; a 400 naming the message when it does not decode.
async fn protobuf_body<M: prost::Message + Default>(st: &AppState, body: Body, what: &str) -> Result<M, ApiError> {
    let bytes = read_body(st, body).await?;
    M::decode(bytes).map_err(|e| ApiError::bad_data(format!("the body is not a {what}: {e}")))
}

/// One target of a render and the range it is read over (seconds): the request's `from` and
/// `until` for every target, or each target's own in a carbonapi v3 request.
struct Target {
    text: String,
    selection: Selection,
    from: i64,
    until: i64,
}

/// What `target` selects: a glob, or `seriesByTag(...)`; a 400 naming it otherwise.
fn selection_of(t: &str) -> Result<Selection, ApiError> {
    let bad = |what: String| ApiError::bad_data(format!("target {t:?}: {what}"));
    match target::parse(t).map_err(|e| bad(e.to_string()))? {
        Expr::Path(path) => {
            let regex = parse_glob("target", &path)?.to_regex();
            let matcher = Matcher::new(MatchOp::RegexMatch, METRIC_NAME, regex).map_err(|e| bad(e.to_string()))?;
            Ok(Selection::Glob(matcher))
        }
        Expr::Call(call) if call.name == "seriesByTag" => {
            let args =
                series_by_tag_args(&call.raw).unwrap_or_else(|| Ok(Vec::new())).map_err(|e| bad(e.to_string()))?;
            let matchers = tag_matchers(&args).map_err(|e| bad(e.message))?;
            Ok(Selection::Tags(matchers))
        }
        Expr::Call(call) if !functions::FUNCTIONS.contains(&call.name.as_str()) => Err(bad(format!(
            "{}() is not a Graphite function (docs/graphite.md lists the functions Strata has)",
            call.name
        ))),
        e @ (Expr::Call(_) | Expr::Template { .. }) => Ok(Selection::Functions(e)),
        _ => Err(bad("a value, not a series".into())),
    }
}

/// `/render`: every `target` (a path, a glob, functions over them), over `from`..`until` in Graphite's time
/// syntax (default the last 24 hours), at the resolution the path's retention schema gives for
/// that range, as whisper would answer for the same points (`strata_graphite::render`). A
/// POST's form body counts as the query string (Grafana posts its renders); a protobuf body is
/// carbonapi v3's `MultiFetchRequest`, each target with its own range.
pub(super) async fn render(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let (v3_request, p) = if is_protobuf(&method, &headers) {
        let what = "carbonapi_v3_pb MultiFetchRequest";
        (Some(protobuf_body::<carbonapi::MultiFetchRequest>(&st, body, what).await?), Params::from_query(raw))
    } else {
        (None, params(&st, &method, raw, &headers, body).await?)
    };
    let format = p.get("format").unwrap_or(if v3_request.is_some() { "carbonapi_v3_pb" } else { "json" }).to_owned();
    if !matches!(
        format.as_str(),
        "json" | "csv" | "raw" | "pickle" | "msgpack" | "protobuf" | "carbonapi_v2_pb" | "carbonapi_v3_pb"
    ) {
        return Err(ApiError::bad_data(format!(
            "format {format:?} is not supported: use json (the default here), csv, raw, pickle, msgpack, \
             protobuf (carbonapi_v2_pb) or carbonapi_v3_pb"
        )));
    }
    let (tz, now) = request_clock(&st, &p)?;
    let at = |name: &str, default: &str| {
        let text = p.get(name).filter(|s| !s.is_empty()).unwrap_or(default);
        parse_at_time(text, now, &tz)
            .ok_or_else(|| ApiError::bad_data(format!("{name}={text:?} is not a time Graphite understands")))
    };
    let check = |from: i64, until: i64| {
        if from >= until {
            return Err(ApiError::bad_data(format!("from ({from}) is not before until ({until})")));
        }
        Ok(())
    };
    // Only JSON answers are wrapped (graphite-web's other formats ignore it), but a bad
    // callback is refused whatever the format.
    let jsonp = jsonp_param(&p)?;
    let max_data_points = match p.get("maxDataPoints").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 1.0)
                .ok_or_else(|| ApiError::bad_data(format!("maxDataPoints={s:?} is not a positive number")))?
                as usize,
        ),
    };
    let mut targets = Vec::new();
    match &v3_request {
        Some(request) => {
            for m in &request.metrics {
                check(m.start_time, m.stop_time)?;
                let text = if m.path_expression.is_empty() { &m.name } else { &m.path_expression };
                targets.push(Target {
                    text: text.clone(),
                    selection: selection_of(&m.name)?,
                    from: m.start_time,
                    until: m.stop_time,
                });
            }
        }
        None => {
            let (from, until) = (at("from", "-24h")?, at("until", "now")?);
            check(from, until)?;
            for t in p.all("target").into_iter().filter(|t| !t.is_empty()) {
                targets.push(Target { text: t.to_owned(), selection: selection_of(t)?, from, until });
            }
        }
    }
    let x_files_factor = match p.get("xFilesFactor").filter(|s| !s.is_empty()) {
        None => 0.0,
        Some(s) => s
            .parse::<f64>()
            .ok()
            .filter(|v| (0.0..=1.0).contains(v))
            .ok_or_else(|| ApiError::bad_data(format!("xFilesFactor={s:?} is not a number from 0 to 1")))?,
    };
    // `template[name]=value`: values for the targets' `template(...)` variables.
    let template: Vec<(String, String)> =
        p.0.iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("template[")?.strip_suffix(']')?.to_owned(), v.clone())))
            .collect();
    let schemas = st.graphite_schemas.lock().clone();
    let db = db(&st)?;
    let tiers = graphite_tiers(&db);
    let st2 = st.clone();
    let request_tz = tz.clone();
    let events = st.graphite_events.get().cloned();
    let (mut series, requested) = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let execution = |e: &dyn std::fmt::Display| ApiError::execution(e.to_string());
        let (mut out, mut requested) = (Vec::new(), Vec::new());
        for target in &targets {
            let (from, until) = (target.from, target.until);
            // The series a glob or a tag selection names over `[from, until]` (the target's
            // range, or the one a function such as `timeShift` asks for), as whisper would
            // answer for them.
            let fetch = |selection: &Selection,
                         path_expression: &str,
                         from: i64,
                         until: i64|
             -> Result<Vec<RenderSeries>, ApiError> {
                let (mint, maxt) =
                    (from.saturating_mul(1000), until.saturating_add(RENDER_SLACK_S).saturating_mul(1000));
                let querier = || limited_querier(&db, &st2.limits, &stop, mint, maxt);
                let matchers: &[Matcher] = match selection {
                    // The `__name__` regex is answered by walking the names indexes.
                    Selection::Glob(matcher) => std::slice::from_ref(matcher),
                    Selection::Tags(matchers) => matchers,
                    Selection::Functions(_) => unreachable!("functions are evaluated, not fetched"),
                };
                // Where a tier may answer some path over this range, the series are listed
                // first without their raw chunks (a year of raw chunk references could pass
                // `--query.max-samples` though the tier answers); those left to raw samples
                // are selected with their chunks after.
                let tiers_may_answer =
                    schemas.policies().iter().any(|p| !pick_tiers(&tiers, p, from, until, now).is_empty());
                let mut selected = if tiers_may_answer { querier().labels_only() } else { querier() }
                    .select(matchers)
                    .map_err(|e| execution(&e))?;
                // By path, as graphite-web lists a glob's series (label order puts tags first).
                selected.sort_by(|a, b| a.labels.get(METRIC_NAME).cmp(&b.labels.get(METRIC_NAME)));
                // Each series' policy, and the tier that answers it (`None`: its raw samples).
                let mut named: Vec<Option<PathSeries>> = selected
                    .iter()
                    .map(|s| {
                        let (name, tags) = graphite_series_name(&s.labels)?;
                        let policy = schemas.policy(&name);
                        Some(PathSeries { name, tags, policy })
                    })
                    .collect();
                // Each series' answer, first those tiers give: whisper's from the tier's intervals
                // (`None` inside: outside the retention).
                let candidates: Vec<(&Labels, Option<&Policy>)> =
                    selected.iter().zip(&named).map(|(s, n)| (&s.labels, n.as_ref().map(|n| &n.policy))).collect();
                let limits = read_limits(&st2.limits, &stop);
                let (mut answers, moved_on) =
                    answer_from_tiers(&db, &tiers, &candidates, matchers, (mint, maxt), (from, until, now), &limits)
                        .map_err(|e| execution(&e))?;
                st2.metrics.graphite_render_tier_archive_missing.fetch_add(moved_on, Ordering::Relaxed);
                // The rest: each series decoded and laid on its schema's intervals, spread over
                // the cores when there are enough to pay for the threads.
                let raw: Vec<usize> =
                    (0..selected.len()).filter(|&i| answers[i].is_none() && named[i].is_some()).collect();
                let with_chunks = if tiers_may_answer && !raw.is_empty() {
                    querier().select(matchers).map_err(|e| execution(&e))?
                } else {
                    Vec::new()
                };
                let chunks_of: HashMap<&Labels, &strata_tsdb::querier::Series> =
                    with_chunks.iter().map(|s| (&s.labels, s)).collect();
                let read_raw = |i: usize| -> Option<Fetched> {
                    let series = if tiers_may_answer {
                        // A series gone since it was listed (deleted meanwhile) is left out.
                        chunks_of.get(&selected[i].labels).copied()?
                    } else {
                        &selected[i]
                    };
                    let samples: Vec<(i64, f64)> = series.samples().iter().map(|x| (x.t, x.v)).collect();
                    let policy = &named[i].as_ref().expect("only named series are read").policy;
                    strata_graphite::render::fetch(&samples, policy, from, until, now)
                };
                let raw_fetched: Vec<Option<Fetched>> = if raw.len() < PARALLEL_READ_MIN {
                    raw.iter().map(|&i| read_raw(i)).collect()
                } else {
                    functions::spread(raw.clone(), read_raw)
                };
                let metrics = &st2.metrics;
                metrics.graphite_render_series_raw.fetch_add(raw.len() as u64, Ordering::Relaxed);
                let tier_answered = answers.iter().filter(|f| f.is_some()).count();
                metrics.graphite_render_series_tier.fetch_add(tier_answered as u64, Ordering::Relaxed);
                for (i, fetched) in raw.into_iter().zip(raw_fetched) {
                    answers[i] = Some(fetched);
                }
                // In path order, each answer moved into its series.
                Ok(answers
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, fetched)| {
                        let (start, end, step, values) = fetched??;
                        let PathSeries { name, tags, .. } = named[i].take()?;
                        let range = (start, end, step);
                        Some(RenderSeries::new(name, tags, range, values, path_expression.to_owned(), x_files_factor))
                    })
                    .collect())
            };
            let series = match &target.selection {
                Selection::Functions(expr) => {
                    let event_times = |tags: Option<&[String]>, from: i64, until: i64| -> Vec<i64> {
                        events.as_ref().map_or_else(Vec::new, |e| e.times(tags, from, until))
                    };
                    // A fetch's own error (a limit, the deadline) is answered as it is, not as a
                    // mistake in the target.
                    let mut fetch_error: Option<ApiError> = None;
                    let mut fetch_expression =
                        |pe: &str, from: i64, until: i64| -> Result<Vec<FnSeries>, functions::EvalError> {
                            let fetched = selection_of(pe).and_then(|selection| fetch(&selection, pe, from, until));
                            match fetched {
                                Ok(fetched) => Ok(fetched.into_iter().map(into_function_series).collect()),
                                Err(e) => {
                                    let message = e.message.clone();
                                    fetch_error = Some(e);
                                    Err(functions::EvalError::Fetch(message))
                                }
                            }
                        };
                    let max_series = st2.limits.max_query_series;
                    let mut cx =
                        functions::Context::new(from, until, x_files_factor, max_series, &mut fetch_expression)
                            .with_time_zone(request_tz.clone())
                            .with_now(now)
                            .with_template(template.clone());
                    if events.is_some() {
                        cx = cx.with_events(&event_times);
                    }
                    let evaluated = functions::evaluate(expr, &mut cx);
                    drop(cx);
                    match evaluated {
                        Ok(evaluated) => evaluated.into_iter().map(from_function_series).collect(),
                        Err(_) if fetch_error.is_some() => return Err(fetch_error.expect("checked")),
                        Err(e @ functions::EvalError::TooManySeries(_)) => {
                            return Err(ApiError::execution(format!("target {:?}: {e}", target.text)))
                        }
                        Err(e) => return Err(ApiError::bad_data(format!("target {:?}: {e}", target.text))),
                    }
                }
                selection => fetch(selection, &target.text, from, until)?,
            };
            requested.extend(series.iter().map(|_| (from, until)));
            out.extend(series);
        }
        Ok((out, requested))
    })
    .await?;
    if format != "json" {
        // Only JSON applies maxDataPoints; the others write the points as functions left them.
        series.iter_mut().for_each(RenderSeries::fold_points);
    }
    let (body, content_type) = match format.as_str() {
        "csv" => (to_csv(&series, &tz).into_bytes(), "text/csv"),
        "raw" => (to_raw(&series).into_bytes(), "text/plain"),
        "pickle" => (to_pickle(&series), "application/pickle"),
        "msgpack" => (to_msgpack(&series), "application/x-msgpack"),
        "protobuf" | "carbonapi_v2_pb" => (carbonapi::render_v2(&series), "application/x-protobuf"),
        "carbonapi_v3_pb" => (carbonapi::render_v3(&series, &requested), "application/x-protobuf"),
        _ if series.iter().map(|s| s.values.len()).sum::<usize>() >= STREAMED_RESPONSE_POINTS => {
            return Ok(streamed_json(series, max_data_points, jsonp));
        }
        _ => return Ok(json_or_jsonp(to_json(&mut series, max_data_points).into_bytes(), jsonp.as_deref())),
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

/// A large render's JSON (or JSONP), written on a blocking thread and sent piece by piece as it
/// is written, as PromQL's large results are: the async workers stay free of the writing, and
/// a month of a thousand paths (17 MB) is never held whole nor faulted in at once.
fn streamed_json(
    mut series: Vec<RenderSeries>,
    max_data_points: Option<usize>,
    jsonp: Option<String>,
) -> axum::response::Response {
    let content_type = if jsonp.is_some() { "text/javascript" } else { "application/json" };
    let body = streamed_body(move |send| {
        if let Some(callback) = &jsonp {
            if !send(format!("{callback}(").into_bytes()) {
                return;
            }
        }
        let mut sending = true;
        write_json(&mut series, max_data_points, RESPONSE_CHUNK_BYTES, &mut |piece| {
            sending = send(piece.into_bytes());
            sending
        });
        if sending && jsonp.is_some() {
            send(b")".to_vec());
        }
    });
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Fewest series a fetch spreads over several threads.
const PARALLEL_READ_MIN: usize = 32;

/// Past `until`, the seconds of samples a render reads: whisper answers the interval after
/// `until`, up to a day long for the coarsest archives in use.
const RENDER_SLACK_S: i64 = 86_400;

/// A selected series as Graphite names it, with its retention policy.
#[derive(Clone)]
struct PathSeries {
    name: String,
    tags: Vec<(String, String)>,
    policy: Policy,
}

/// What a render target selects.
enum Selection {
    /// A glob, as the regex matcher on `__name__` it becomes.
    Glob(Matcher),
    Tags(Vec<Matcher>),
    /// Functions over path expressions (`strata_graphite::functions`).
    Functions(Expr),
}

/// The Graphite name and tags of a series: its `__name__` as the path, and `;tag=value` for
/// every other label, in tag order (Graphite 1.1's canonical tagged form); `tags` holds `name`
/// and the others, sorted. `None` for a series without `__name__`.
pub(super) fn graphite_series_name(labels: &Labels) -> Option<(String, Vec<(String, String)>)> {
    let path = labels.get("__name__")?;
    let mut name = path.to_owned();
    let mut tags: Vec<(String, String)> = vec![("name".into(), path.to_owned())];
    for l in labels.iter().filter(|l| &*l.name != "__name__") {
        name.push(';');
        name.push_str(&l.name);
        name.push('=');
        name.push_str(&l.value);
        tags.push((l.name.to_string(), l.value.to_string()));
    }
    tags.sort();
    Some((name, tags))
}

/// `/functions`: the render functions Strata evaluates, with their parameters as graphite-web
/// lists them (Grafana's Graphite data source reads this); `grouped=1` by group, `group=` one.
pub(super) async fn functions(RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let grouped = p.get("grouped").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    Ok(json_bytes(functions::catalog::list(grouped, p.get("group")).into_bytes()))
}

/// `/functions/<name>`: one function's entry; 404 for one Strata does not have.
pub(super) async fn function_details(axum::extract::Path(name): axum::extract::Path<String>) -> ApiResult {
    match functions::catalog::details(&name) {
        Some(v) => Ok(json_bytes(v.into_bytes())),
        None => Err(ApiError::not_found(format!("Function not found: {name}"))),
    }
}

/// A fetched series as the functions take it.
fn into_function_series(s: RenderSeries) -> FnSeries {
    let tags = s.tags.into_iter().collect();
    FnSeries::fetched(s.name, tags, (s.start, s.end, s.step), s.values, s.path_expression, s.x_files_factor)
}

/// A function's result as the formats write it, still with its values per point and how they
/// fold (`maxDataPoints` may change the former, `consolidateBy` set the latter).
fn from_function_series(s: FnSeries) -> RenderSeries {
    RenderSeries {
        tags: s.tags.into_iter().collect(),
        name: s.name,
        start: s.start,
        end: s.end,
        step: s.step,
        values: s.values,
        path_expression: s.path_expression,
        values_per_point: s.values_per_point,
        consolidation: s.consolidation,
        x_files_factor: s.x_files_factor,
    }
}

/// Tag expressions as matchers; a 400 naming what is wrong.
fn tag_matchers<S: AsRef<str>>(exprs: &[S]) -> Result<Vec<Matcher>, ApiError> {
    let parsed = parse_all(exprs).map_err(|e| ApiError::bad_data(e.to_string()))?;
    parsed
        .iter()
        .map(|TagExpr { label, op, value }| {
            let op = match op {
                TagOp::Equal => MatchOp::Equal,
                TagOp::NotEqual => MatchOp::NotEqual,
                TagOp::RegexMatch => MatchOp::RegexMatch,
                TagOp::RegexNoMatch => MatchOp::RegexNoMatch,
            };
            Matcher::new(op, label.as_str(), value.as_str()).map_err(|e| ApiError::bad_data(format!("{label}: {e}")))
        })
        .collect()
}

/// The tag's name as Graphite spells it (`__name__` is `name`).
fn tag_name(label: &str) -> &str {
    if label == "__name__" {
        "name"
    } else {
        label
    }
}

/// A JSON response.
fn json_response(v: Value) -> axum::response::Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// JSON written directly (a find's nodes: building a `Value` per node took longer than
/// finding them).
fn json_bytes(body: Vec<u8>) -> axum::response::Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// graphite-web's `jsonp` parameter of its JSON answers (find, expand, index.json, render,
/// events), checked to be a JavaScript function name (`is_callback_name`): graphite-web writes
/// whatever it is given into the script, which lets a link run script in the page that loads
/// it. Checked before the query runs.
pub(super) fn jsonp_param(p: &Params) -> Result<Option<String>, ApiError> {
    match p.get("jsonp") {
        None | Some("") => Ok(None),
        Some(callback) if is_callback_name(callback) => Ok(Some(callback.to_owned())),
        Some(callback) => Err(ApiError::bad_data(format!(
            "jsonp={callback:?} is not a JavaScript function name (letters, digits, _, $ and dots)"
        ))),
    }
}

/// A JSON answer, or with a JSONP callback `callback(json)` as `text/javascript`, as
/// graphite-web wraps it.
pub(super) fn json_or_jsonp(body: Vec<u8>, jsonp: Option<&str>) -> axum::response::Response {
    match jsonp {
        None => json_bytes(body),
        Some(callback) => {
            let mut wrapped = Vec::with_capacity(callback.len() + body.len() + 2);
            wrapped.extend_from_slice(callback.as_bytes());
            wrapped.push(b'(');
            wrapped.extend_from_slice(&body);
            wrapped.push(b')');
            ([(header::CONTENT_TYPE, "text/javascript")], wrapped).into_response()
        }
    }
}

/// A JSONP callback as scripts name them: letters, digits, `_`, `$`, dots between names, at
/// most 128 bytes. Anything else would let a request write script into the answer.
fn is_callback_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.split('.').all(|part| {
            part.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        })
}

/// graphite-web's autocomplete limit.
const AUTOCOMPLETE_LIMIT: usize = 100;

/// `filter`: a regular expression anchored at the start, as graphite-web applies it.
fn filter_param(p: &Params) -> Result<Option<regex::Regex>, ApiError> {
    match p.get("filter").filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(f) => {
            regex::Regex::new(&format!("^(?:{f})")).map(Some).map_err(|e| ApiError::bad_data(format!("filter: {e}")))
        }
    }
}

/// The label a tag is stored as (`name` is `__name__`).
fn label_of_tag(tag: &str) -> String {
    if tag == "name" {
        "__name__".to_owned()
    } else {
        tag.to_owned()
    }
}

fn limit_param(p: &Params, default: usize) -> Result<usize, ApiError> {
    match p.get("limit").filter(|s| !s.is_empty()) {
        None => Ok(default),
        Some(s) => s.parse().map_err(|_| ApiError::bad_data(format!("limit={s:?} is not a whole number"))),
    }
}

/// `/tags`: every tag name (`name` for the path), as `[{"tag": …}]`; `filter` is a regular
/// expression anchored at the start, `limit` a count.
pub(super) async fn tags(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let filter = filter_param(&p)?;
    let limit = limit_param(&p, usize::MAX)?;
    let db = db(&st)?;
    let st2 = st.clone();
    let names = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, i64::MIN, i64::MAX);
        q.label_names(&[]).map_err(|e| ApiError::execution(e.to_string()))
    })
    .await?;
    let mut tags: Vec<&str> =
        names.iter().map(|n| tag_name(n)).filter(|t| filter.as_ref().is_none_or(|f| f.is_match(t))).collect();
    tags.sort_unstable();
    tags.truncate(limit);
    Ok(json_response(Value::Array(tags.into_iter().map(|t| json!({ "tag": t })).collect())))
}

/// `/tags/{tag}`: the tag's values and how many series hold each, `{"tag", "values": [{"count",
/// "value"}]}`; `filter` and `limit` as for `/tags`.
pub(super) async fn tag_details(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(tag): axum::extract::Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult {
    let p = Params::from_query(raw);
    let filter = filter_param(&p)?;
    let limit = limit_param(&p, usize::MAX)?;
    let label = label_of_tag(&tag);
    let db = db(&st)?;
    let st2 = st.clone();
    let counts = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, i64::MIN, i64::MAX);
        let m =
            Matcher::new(MatchOp::RegexMatch, label.as_str(), ".+").map_err(|e| ApiError::execution(e.to_string()))?;
        let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
        for s in q.select(&[m]).map_err(|e| ApiError::execution(e.to_string()))? {
            if let Some(v) = s.labels.get(&label) {
                *counts.entry(v.to_owned()).or_default() += 1;
            }
        }
        Ok(counts)
    })
    .await?;
    let values: Vec<Value> = counts
        .into_iter()
        .filter(|(v, _)| filter.as_ref().is_none_or(|f| f.is_match(v)))
        .take(limit)
        .map(|(v, n)| json!({"count": n, "value": v}))
        .collect();
    Ok(json_response(json!({"tag": tag, "values": values})))
}

/// The tag expressions of a request: every `expr`, or every `expr[]` when there is no `expr`
/// (graphite-web reads both spellings).
fn exprs_param(p: &Params) -> Vec<&str> {
    let plain = p.all("expr");
    if plain.is_empty() {
        p.all("expr[]")
    } else {
        plain
    }
}

/// `/version`: the graphite-web version whose API Strata answers (Grafana's Graphite data
/// source reads it to pick the functions and features it offers), as graphite-web writes it.
pub(super) async fn version() -> axum::response::Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], "1.1.8\n").into_response()
}

/// `/tags/findSeries?expr=…&expr=…` (or `expr[]=…`, as jQuery sends lists): the series
/// matching every expression, by their Graphite names, sorted.
pub(super) async fn find_series(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let matchers = tag_matchers(&exprs_param(&p))?;
    let db = db(&st)?;
    let st2 = st.clone();
    let mut names = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, i64::MIN, i64::MAX);
        let series = q.select(&matchers).map_err(|e| ApiError::execution(e.to_string()))?;
        Ok(series.iter().filter_map(|s| graphite_series_name(&s.labels)).map(|(n, _)| n).collect::<Vec<_>>())
    })
    .await?;
    names.sort_unstable();
    Ok(json_response(json!(names)))
}

/// `/tags/autoComplete/tags` (`tagPrefix`) and `/tags/autoComplete/values` (`tag`,
/// `valuePrefix`): tag names, or one tag's values, among the series matching the `expr`s (all
/// series without), sorted, at most `limit` (100).
pub(super) async fn auto_complete(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(what): axum::extract::Path<String>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let exprs = exprs_param(&p);
    let matchers = if exprs.is_empty() { Vec::new() } else { tag_matchers(&exprs)? };
    let limit = limit_param(&p, AUTOCOMPLETE_LIMIT)?;
    let (values_of, prefix) = match what.as_str() {
        "tags" => (None, p.get("tagPrefix").unwrap_or("").to_owned()),
        "values" => {
            let tag = p
                .get("tag")
                .filter(|t| !t.is_empty())
                .ok_or_else(|| ApiError::bad_data("missing parameter \"tag\""))?;
            (Some(label_of_tag(tag)), p.get("valuePrefix").unwrap_or("").to_owned())
        }
        other => return Err(ApiError::bad_data(format!("/tags/autoComplete/{other}: expected tags or values"))),
    };
    // Tags already constrained by the expressions are not offered again.
    let used: Vec<String> = matchers.iter().map(|m| tag_name(&m.name).to_owned()).collect();
    let want_values = values_of.is_some();
    let db = db(&st)?;
    let st2 = st.clone();
    let found = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, i64::MIN, i64::MAX);
        let e = |e: strata_tsdb::error::Error| ApiError::execution(e.to_string());
        let out: Vec<String> = match &values_of {
            Some(label) => q.label_values(label, &matchers).map_err(e)?,
            None => q.label_names(&matchers).map_err(e)?.iter().map(|n| tag_name(n).to_owned()).collect(),
        };
        Ok(out)
    })
    .await?;
    let mut found: Vec<String> =
        found.into_iter().filter(|x| x.starts_with(prefix.as_str()) && (want_values || !used.contains(x))).collect();
    found.sort_unstable();
    found.truncate(limit);
    Ok(json_response(json!(found)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonp_callbacks_are_names_only() {
        for ok in ["cb", "jQuery123_456", "a.b.c", "$x", "_"] {
            assert!(is_callback_name(ok), "{ok}");
        }
        for bad in ["", "a(b)", "alert(1);x", "a..b", "1a", "a b", "<script>", &"x".repeat(129)] {
            assert!(!is_callback_name(bad), "{bad}");
        }
    }
    use strata_graphite::find::find as reference_find;
    use strata_tsdb::head::{Head, HeadOptions};

    #[test]
    fn find_answers_are_the_json_graphite_web_writes() {
        let node = |path: &'static str, is_leaf: bool| Node::new(path, is_leaf);
        let nodes = [node("a.b\"c", false), node("a.d\\\n", true), node("a.é", true)];
        let parse = |b: Vec<u8>| serde_json::from_slice::<Value>(&b).unwrap();
        assert_eq!(
            parse(completer(&nodes, true)),
            json!({"metrics": [
                {"path": "a.b\"c.", "name": "b\"c", "is_leaf": "0"},
                {"path": "a.d\\\n", "name": "d\\\n", "is_leaf": "1"},
                {"path": "a.é", "name": "é", "is_leaf": "1"},
                {"name": "*"},
            ]})
        );
        let leaf = |text: &str| json!({"text": text, "id": format!("a.{text}"), "allowChildren": 0, "expandable": 0, "leaf": 1});
        assert_eq!(
            parse(tree_json(&nodes, "a.*", false)),
            json!([
                {"text": "b\"c", "id": "a.b\"c", "allowChildren": 1, "expandable": 1, "leaf": 0},
                leaf("d\\\n"),
                leaf("é"),
            ])
        );
        assert_eq!(parse(tree_json(&[node("top", true)], "t*", false))[0]["id"], "top");
        let packed: Value = rmp_serde::from_slice(&msgpack_nodes(&nodes[..2], (10, 20))).unwrap();
        assert_eq!(
            packed,
            json!([
                {"path": "a.b\"c", "is_leaf": false},
                {"path": "a.d\\\n", "is_leaf": true, "intervals": [[10, 20]]},
            ])
        );
        assert_eq!(
            parse(nodes_json(&nodes[..2], (10, 20))),
            json!([
                {"path": "a.b\"c", "is_leaf": false},
                {"path": "a.d\\\n", "is_leaf": true, "intervals": [{"start": 10, "end": 20}]},
            ])
        );
    }

    #[test]
    fn found_nodes_are_ordered_by_name_then_path() {
        let node = |path: &'static str| Node::new(path, true);
        let mut nodes = vec![node("a.x.zz"), node("a.y.b"), node("b.a.zz"), node("b.b.a")];
        by_name(&mut nodes);
        let paths: Vec<&str> = nodes.iter().map(|n| n.path()).collect();
        assert_eq!(paths, ["b.b.a", "a.y.b", "a.x.zz", "b.a.zz"]);
    }

    proptest::proptest! {
        /// The nodes come out as a stable sort by name leaves them, whatever their order and
        /// however often names repeat.
        #[test]
        fn found_nodes_are_a_stable_sort_by_name(paths in proptest::collection::vec("[ab]{1,2}(\\.[abc]{0,3}){0,3}", 0..60)) {
            let mut nodes: Vec<Node> = paths.iter().enumerate().map(|(i, p)| Node::new(p.as_str(), i % 2 == 0)).collect();
            let mut want = nodes.clone();
            want.sort_by(|a, b| a.name().cmp(b.name()));
            by_name(&mut nodes);
            proptest::prop_assert_eq!(nodes, want);
        }
    }

    #[test]
    fn completer_queries_are_rewritten_as_graphite_web_does() {
        // Python's `replace("..", "*.")`: the first dot goes (graphite-web's own behaviour).
        assert_eq!(completer_query("servers..cpu", false), "servers*.cpu*");
        assert_eq!(completer_query("servers.*", false), "servers.*");
        assert_eq!(completer_query("a.b,c.{d,e}", true), "a.{b,c}.{d,e}*");
        assert_eq!(completer_query("a.b,c", false), "a.b,c*");
    }

    #[test]
    fn a_first_of_each_name_find_counts_names_against_the_limit() {
        let head = Head::in_memory(HeadOptions::default());
        let mut app = head.appender();
        for host in 0..50 {
            for metric in ["rx", "tx", "drops"] {
                app.append(
                    &Labels::from_pairs([(METRIC_NAME, format!("h{host:02}.net.{metric}").as_str())]),
                    1000,
                    1.0,
                )
                .unwrap();
            }
        }
        app.commit().unwrap();
        let q = Querier::new(&head, i64::MIN, i64::MAX);
        let pattern = glob_pattern("query", &Glob::parse("*.net.*").unwrap()).unwrap();
        let got = q.find_first_of_each_name(&pattern, 3).unwrap();
        let nodes = as_nodes(&got);
        let paths: Vec<&str> = nodes.iter().map(|n| n.path()).collect();
        assert_eq!(paths, ["h00.net.drops", "h00.net.rx", "h00.net.tx"], "150 nodes, three names");
        assert!(matches!(q.find_first_of_each_name(&pattern, 2), Err(strata_tsdb::Error::TooManySeries { limit: 2 })));
        assert!(q.find_names(&pattern, 149).is_err(), "the full find counts every node");
    }

    #[test]
    fn finds_stop_when_the_query_is_interrupted() {
        let head = Head::in_memory(HeadOptions::default());
        let mut app = head.appender();
        for host in 0..2000 {
            app.append(&Labels::from_pairs([(METRIC_NAME, format!("h{host:04}.load").as_str())]), 1000, 1.0).unwrap();
        }
        app.commit().unwrap();
        let stop = || Some(strata_tsdb::error::Stop::Timeout);
        let q = Querier::new(&head, i64::MIN, i64::MAX).interrupt(&stop);
        let pattern = glob_pattern("query", &Glob::parse("*.load").unwrap()).unwrap();
        let stopped = |r: strata_tsdb::Result<_>| matches!(r, Err(strata_tsdb::Error::Stopped(_)));
        assert!(stopped(q.find_names(&pattern, usize::MAX)), "2,000 nodes: the interrupt is asked");
        assert!(stopped(q.find_first_of_each_name(&pattern, usize::MAX)));
        let q = Querier::new(&head, i64::MIN, i64::MAX);
        assert_eq!(q.find_first_of_each_name(&pattern, usize::MAX).unwrap().len(), 1, "one name");
    }

    proptest::proptest! {
        /// A find through the head's names index (dictionary and delta) lists exactly the
        /// nodes the reference finder lists by reading every path.
        #[test]
        fn indexed_find_equals_the_reference_finder(
            paths in proptest::collection::vec("[ab]{1,2}(\\.[ab]{1,2}){0,3}", 1..30),
            built in 0usize..30,
            glob in "(\\*|a|b|\\?|[ab]\\*|\\{a,b\\*\\}|\\[!a\\])(\\.(\\*|a|b|ab|\\?|\\*b|\\[ab\\]b)){0,3}",
        ) {
            let head = Head::in_memory(HeadOptions::default());
            for (i, p) in paths.iter().enumerate() {
                let mut app = head.appender();
                app.append(&Labels::from_pairs([(METRIC_NAME, p.as_str())]), 1000, 1.0).unwrap();
                app.commit().unwrap();
                if i == built {
                    head.rebuild_names();
                }
            }
            let mut sorted = paths.clone();
            sorted.sort();
            sorted.dedup();
            let g = Glob::parse(&glob).unwrap();
            let want = reference_find(&g, &sorted, usize::MAX).unwrap();
            let q = Querier::new(&head, i64::MIN, i64::MAX);
            let limits = Limits { max_query_series: usize::MAX, ..Limits::default() };
            let got = nodes_of(&q, &glob_pattern("query", &g).unwrap(), &limits).map_err(|e| e.message).unwrap();
            proptest::prop_assert_eq!(as_nodes(&got), want.clone());
            // treejson's walk: the first node of each name, as the full find lists them.
            let mut firsts: Vec<Node> = Vec::new();
            for n in want {
                if !firsts.iter().any(|f| f.name() == n.name()) {
                    firsts.push(n);
                }
            }
            let got = q.find_first_of_each_name(&glob_pattern("query", &g).unwrap(), usize::MAX).unwrap();
            proptest::prop_assert_eq!(as_nodes(&got), firsts);
        }
    }
}
