//! carbonapi's protobuf formats, as go-carbon serves them to carbonapi (and carbonapi to its
//! own clients): `carbonapi_v2_pb` (also called `protobuf`), for `/render` and `/metrics/find`
//! requested with query parameters, and the answers of `carbonapi_v3_pb`.
//!
//! The messages are written by hand with prost's derive from go-graphite/protocol's
//! `carbonapi_v2_pb.proto` and `carbonapi_v3_pb.proto` (field numbers and types as there): a
//! few small messages do not need a build step.

use prost::Message;

use crate::find::Node;
use crate::render::Series;

/// `carbonapi_v3_pb.FetchRequest`: one target (`name`) over its own range, seconds.
#[derive(Clone, PartialEq, Message)]
pub struct FetchRequest {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int64, tag = "2")]
    pub start_time: i64,
    #[prost(int64, tag = "3")]
    pub stop_time: i64,
    #[prost(bool, tag = "4")]
    pub high_precision_timestamps: bool,
    #[prost(string, tag = "5")]
    pub path_expression: String,
}

/// What carbonapi POSTs to a v3 backend's `/render/?format=carbonapi_v3_pb`.
#[derive(Clone, PartialEq, Message)]
pub struct MultiFetchRequest {
    #[prost(message, repeated, tag = "1")]
    pub metrics: Vec<FetchRequest>,
}

/// What carbonapi POSTs to a v3 backend's `/metrics/find/?format=carbonapi_v3_pb`.
#[derive(Clone, PartialEq, Message)]
pub struct MultiGlobRequest {
    #[prost(string, repeated, tag = "1")]
    pub metrics: Vec<String>,
    #[prost(int64, tag = "2")]
    pub start_time: i64,
    #[prost(int64, tag = "3")]
    pub stop_time: i64,
    #[prost(bool, tag = "4")]
    pub high_precision_timestamps: bool,
}

/// `carbonapi_v2_pb.FetchResponse`: a gap is a `0` value with `is_absent` set.
#[derive(Clone, PartialEq, Message)]
pub struct FetchResponseV2 {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub start_time: i32,
    #[prost(int32, tag = "3")]
    pub stop_time: i32,
    #[prost(int32, tag = "4")]
    pub step_time: i32,
    #[prost(double, repeated, tag = "5")]
    pub values: Vec<f64>,
    #[prost(bool, repeated, tag = "6")]
    pub is_absent: Vec<bool>,
}

#[derive(Clone, PartialEq, Message)]
pub struct MultiFetchResponseV2 {
    #[prost(message, repeated, tag = "1")]
    pub metrics: Vec<FetchResponseV2>,
}

#[derive(Clone, PartialEq, Message)]
pub struct GlobMatch {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(bool, tag = "2")]
    pub is_leaf: bool,
}

/// The nodes one query found (`name` is the query), in both versions.
#[derive(Clone, PartialEq, Message)]
pub struct GlobResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub matches: Vec<GlobMatch>,
}

/// `carbonapi_v3_pb.FetchResponse`: a gap is a NaN value.
#[derive(Clone, PartialEq, Message)]
pub struct FetchResponseV3 {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub path_expression: String,
    #[prost(string, tag = "3")]
    pub consolidation_func: String,
    #[prost(int64, tag = "4")]
    pub start_time: i64,
    #[prost(int64, tag = "5")]
    pub stop_time: i64,
    #[prost(int64, tag = "6")]
    pub step_time: i64,
    #[prost(float, tag = "7")]
    pub x_files_factor: f32,
    #[prost(bool, tag = "8")]
    pub high_precision_timestamps: bool,
    #[prost(double, repeated, tag = "9")]
    pub values: Vec<f64>,
    #[prost(string, repeated, tag = "10")]
    pub applied_functions: Vec<String>,
    #[prost(int64, tag = "11")]
    pub request_start_time: i64,
    #[prost(int64, tag = "12")]
    pub request_stop_time: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct MultiFetchResponseV3 {
    #[prost(message, repeated, tag = "1")]
    pub metrics: Vec<FetchResponseV3>,
}

#[derive(Clone, PartialEq, Message)]
pub struct MultiGlobResponseV3 {
    #[prost(message, repeated, tag = "1")]
    pub metrics: Vec<GlobResponse>,
}

/// A series' end as a 32-bit time (v2's field), saturated: whisper's times fit until 2038.
fn time32(t: i64) -> i32 {
    t.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

/// `/render?format=carbonapi_v2_pb` (or `protobuf`).
pub fn render_v2(series: &[Series]) -> Vec<u8> {
    let metrics = series
        .iter()
        .map(|s| FetchResponseV2 {
            name: s.name.clone(),
            start_time: time32(s.start),
            stop_time: time32(s.end),
            step_time: time32(s.step),
            values: s.values.iter().map(|v| v.unwrap_or(0.0)).collect(),
            is_absent: s.values.iter().map(Option::is_none).collect(),
        })
        .collect();
    MultiFetchResponseV2 { metrics }.encode_to_vec()
}

/// `/render?format=carbonapi_v3_pb`; `requested[i]` is the range (seconds) series `i` was
/// requested over.
pub fn render_v3(series: &[Series], requested: &[(i64, i64)]) -> Vec<u8> {
    assert_eq!(series.len(), requested.len(), "a requested range per series");
    let metrics = series
        .iter()
        .zip(requested)
        .map(|(s, &(from, until))| FetchResponseV3 {
            name: s.name.clone(),
            path_expression: s.path_expression.clone(),
            consolidation_func: "average".into(),
            start_time: s.start,
            stop_time: s.end,
            step_time: s.step,
            x_files_factor: 0.0,
            high_precision_timestamps: false,
            values: s.values.iter().map(|v| v.unwrap_or(f64::NAN)).collect(),
            applied_functions: Vec::new(),
            request_start_time: from,
            request_stop_time: until,
        })
        .collect();
    MultiFetchResponseV3 { metrics }.encode_to_vec()
}

fn glob_response(query: &str, nodes: &[Node]) -> GlobResponse {
    GlobResponse {
        name: query.to_owned(),
        matches: nodes.iter().map(|n| GlobMatch { path: n.path().to_string(), is_leaf: n.is_leaf }).collect(),
    }
}

/// `/metrics/find?format=carbonapi_v2_pb` (or `protobuf`): the nodes of one query.
pub fn find_v2(query: &str, nodes: &[Node]) -> Vec<u8> {
    glob_response(query, nodes).encode_to_vec()
}

/// `/metrics/find?format=carbonapi_v3_pb`: the nodes of each query.
pub fn find_v3(found: &[(String, Vec<Node>)]) -> Vec<u8> {
    MultiGlobResponseV3 { metrics: found.iter().map(|(q, nodes)| glob_response(q, nodes)).collect() }.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Series {
        Series::new("a.b".into(), vec![], (60, 240, 60), vec![Some(1.5), None, Some(-2.0)], "a.*".into(), 0.0)
    }

    #[test]
    fn v2_marks_gaps_absent_and_v3_as_nan() {
        let v2 = MultiFetchResponseV2::decode(&render_v2(&[series()])[..]).unwrap();
        let m = &v2.metrics[0];
        assert_eq!((m.name.as_str(), m.start_time, m.stop_time, m.step_time), ("a.b", 60, 240, 60));
        assert_eq!((m.values.clone(), m.is_absent.clone()), (vec![1.5, 0.0, -2.0], vec![false, true, false]));
        let v3 = MultiFetchResponseV3::decode(&render_v3(&[series()], &[(50, 250)])[..]).unwrap();
        let m = &v3.metrics[0];
        assert_eq!((m.path_expression.as_str(), m.request_start_time, m.request_stop_time), ("a.*", 50, 250));
        assert!(m.values[1].is_nan() && m.values[0] == 1.5);
    }

    #[test]
    fn find_answers_carry_the_query_and_its_nodes() {
        let nodes = vec![Node::new("a.b", true), Node::new("a.c", false)];
        let v2 = GlobResponse::decode(&find_v2("a.*", &nodes)[..]).unwrap();
        assert_eq!(v2.name, "a.*");
        assert_eq!(
            v2.matches,
            [GlobMatch { path: "a.b".into(), is_leaf: true }, GlobMatch { path: "a.c".into(), is_leaf: false }]
        );
        let v3 = MultiGlobResponseV3::decode(&find_v3(&[("a.*".into(), nodes)])[..]).unwrap();
        assert_eq!(v3.metrics[0], v2);
    }

    /// A field-by-field check of the wire bytes against the .proto's numbering: field 1
    /// (`metrics`, length-delimited) holding field 1 (`name`), 2..4 (varints), 5 (packed
    /// doubles), 6 (packed bools).
    #[test]
    fn v2_bytes_follow_the_proto_field_numbers() {
        let mut s = series();
        s.values = vec![None];
        let bytes = render_v2(&[s]);
        let want: Vec<u8> = [
            &[0x0a, 25][..],
            &[0x0a, 3],
            b"a.b",
            &[0x10, 60, 0x18, 0xf0, 0x01, 0x20, 60],
            &[0x2a, 8, 0, 0, 0, 0, 0, 0, 0, 0],
            &[0x32, 1, 1],
        ]
        .concat();
        assert_eq!(bytes, want);
    }
}
