//! Prometheus remote write 1.0 and remote read (samples) messages, declared with prost's derive
//! (field numbers and types as in Prometheus' `prompb/types.proto` and `remote.proto`), and the
//! snappy framing around them (the block format, not the stream format).

use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    /// Exemplars (3) and native histograms (4) are not stored yet; a series carrying histograms
    /// is counted as rejected rather than silently dropped.
    #[prost(message, repeated, tag = "4")]
    pub histograms: Vec<Histogram>,
}

/// Name and value are protobuf `string`s, decoded as `bytes` so that they are slices of the
/// request buffer instead of one allocation each; `Label::strs` checks the UTF-8 that protobuf
/// requires of a string.
#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(bytes = "bytes", tag = "1")]
    pub name: bytes::Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: bytes::Bytes,
}

impl Label {
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Label {
        Label { name: name.into().into(), value: value.into().into() }
    }

    /// Name and value as text; an error names the invalid field.
    pub fn strs(&self) -> Result<(&str, &str), String> {
        let name =
            std::str::from_utf8(&self.name).map_err(|_| format!("label name {:?} is not valid UTF-8", self.name))?;
        let value = std::str::from_utf8(&self.value)
            .map_err(|_| format!("value of label {name:?} is not valid UTF-8: {:?}", self.value))?;
        Ok((name, value))
    }
}

#[derive(Clone, Copy, PartialEq, Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// Only its presence matters for now (see `TimeSeries::histograms`).
#[derive(Clone, PartialEq, Message)]
pub struct Histogram {
    #[prost(int64, tag = "15")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct MetricMetadata {
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    #[prost(string, tag = "4")]
    pub help: String,
    #[prost(string, tag = "5")]
    pub unit: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ReadRequest {
    #[prost(message, repeated, tag = "1")]
    pub queries: Vec<Query>,
    #[prost(int32, repeated, tag = "2")]
    pub accepted_response_types: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Query {
    #[prost(int64, tag = "1")]
    pub start_timestamp_ms: i64,
    #[prost(int64, tag = "2")]
    pub end_timestamp_ms: i64,
    #[prost(message, repeated, tag = "3")]
    pub matchers: Vec<LabelMatcher>,
}

#[derive(Clone, PartialEq, Message)]
pub struct LabelMatcher {
    /// EQ = 0, NEQ = 1, RE = 2, NRE = 3.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub value: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ReadResponse {
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<QueryResult>,
}

#[derive(Clone, PartialEq, Message)]
pub struct QueryResult {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// Why a remote-write or remote-read body was refused; maps to an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("request body of {bytes} bytes exceeds the limit of {limit} bytes")]
    BodyTooLarge { bytes: usize, limit: usize },
    #[error("snappy: {0}")]
    Snappy(String),
    #[error("protobuf: {0}")]
    Protobuf(String),
}

/// Snappy-decompresses `body` (refusing to allocate more than `max_decompressed` bytes, judged
/// from the length header before decompressing) and decodes a protobuf message.
pub fn decode<M: Message + Default>(body: &[u8], max_decompressed: usize) -> Result<M, DecodeError> {
    let len = snap::raw::decompress_len(body).map_err(|e| DecodeError::Snappy(e.to_string()))?;
    if len > max_decompressed {
        return Err(DecodeError::BodyTooLarge { bytes: len, limit: max_decompressed });
    }
    let raw = snap::raw::Decoder::new().decompress_vec(body).map_err(|e| DecodeError::Snappy(e.to_string()))?;
    // From `Bytes`, so that `bytes` fields are slices of this buffer, not copies.
    M::decode(bytes::Bytes::from(raw)).map_err(|e| DecodeError::Protobuf(e.to_string()))
}

/// Encodes and snappy-compresses a message.
pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    snap::raw::Encoder::new().compress_vec(&msg.encode_to_vec()).expect("snappy compresses any input")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_named_errors() {
        let req = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![Label::new("__name__", "up")],
                samples: vec![Sample { value: 1.5, timestamp: 1000 }],
                histograms: vec![],
            }],
            metadata: vec![],
        };
        let body = encode(&req);
        assert_eq!(decode::<WriteRequest>(&body, 1 << 20).unwrap(), req);
        assert!(matches!(decode::<WriteRequest>(&body, 3), Err(DecodeError::BodyTooLarge { .. })));
        assert!(matches!(decode::<WriteRequest>(b"\x05\xff\x01", 1 << 20), Err(DecodeError::Snappy(_))));
        let garbage = snap::raw::Encoder::new().compress_vec(b"\x0a\x05\x0a\x03").unwrap();
        assert!(matches!(decode::<WriteRequest>(&garbage, 1 << 20), Err(DecodeError::Protobuf(_))));
        // A label value that is not UTF-8 decodes (as bytes) and is then named by `strs`.
        let mut raw = req.encode_to_vec();
        let at = raw.windows(2).position(|w| w == b"up").unwrap();
        raw[at] = 0xff;
        let bad = snap::raw::Encoder::new().compress_vec(&raw).unwrap();
        let got = decode::<WriteRequest>(&bad, 1 << 20).unwrap();
        let err = got.timeseries[0].labels[0].strs().unwrap_err();
        assert!(err.contains("value of label \"__name__\" is not valid UTF-8"), "{err}");
    }

    proptest! {
        /// Arbitrary bytes, raw or snappy-framed, never panic the decoder.
        #[test]
        fn arbitrary_bodies_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<WriteRequest>(&data, 1 << 20);
            let framed = snap::raw::Encoder::new().compress_vec(&data).unwrap();
            let _ = decode::<WriteRequest>(&framed, 1 << 20);
            let _ = decode::<ReadRequest>(&framed, 1 << 20);
        }
    }
}
