//! Query results written straight into Prometheus' JSON, without building a JSON tree: a
//! 24 h range over thousands of series is millions of points, and a tree of small
//! allocations cost more than the evaluation itself.

use std::fmt::Write;

use strata_model::{FloatHistogram, Labels};
use strata_promql::{Annotation, Value};

/// A JSON string literal.
pub fn string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let esc = match c {
            '"' => "\\\"",
            '\\' => "\\\\",
            '\n' => "\\n",
            '\r' => "\\r",
            '\t' => "\\t",
            c if (c as u32) < 0x20 => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
        if esc.is_empty() {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push_str(esc);
        }
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Milliseconds as Prometheus writes times: seconds, with up to three decimals.
pub fn seconds(out: &mut String, ms: i64) {
    if ms < 0 {
        out.push('-');
    }
    let abs = ms.unsigned_abs();
    let (s, frac) = (abs / 1000, abs % 1000);
    let _ = write!(out, "{s}");
    if frac != 0 {
        let mut f = format!("{frac:03}");
        while f.ends_with('0') {
            f.pop();
        }
        out.push('.');
        out.push_str(&f);
    }
}

/// A sample value as Prometheus writes it: a string, `NaN`, `+Inf`, `-Inf`, or the shortest
/// decimal that reads back to the same float.
pub fn float(out: &mut String, v: f64) {
    out.push('"');
    sample_value(out, v);
    out.push('"');
}

/// A sample value as Prometheus prints it, unquoted (also the text exposition's form).
pub fn sample_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

fn point(out: &mut String, t: i64, v: f64) {
    out.push('[');
    seconds(out, t);
    out.push(',');
    float(out, v);
    out.push(']');
}

/// A native histogram as Prometheus' API writes it: count, sum, and the populated buckets as
/// `[boundary rule, lower, upper, count]`, the rule 0 for `(a,b]`, 1 for `[a,b)`, 2 for `(a,b)`
/// and 3 for `[a,b]`.
fn histogram(out: &mut String, h: &FloatHistogram) {
    out.push_str(r#"{"count":"#);
    float(out, h.count);
    out.push_str(r#","sum":"#);
    float(out, h.sum);
    let mut first = true;
    for b in h.all_buckets().iter().filter(|b| b.count != 0.0) {
        out.push_str(if first { r#","buckets":["# } else { "," });
        first = false;
        let rule = match (b.lower_inclusive, b.upper_inclusive) {
            (false, true) => 0,
            (true, false) => 1,
            (false, false) => 2,
            (true, true) => 3,
        };
        let _ = write!(out, "[{rule},");
        float(out, b.lower);
        out.push(',');
        float(out, b.upper);
        out.push(',');
        float(out, b.count);
        out.push(']');
    }
    if !first {
        out.push(']');
    }
    out.push('}');
}

fn histogram_point(out: &mut String, t: i64, h: &FloatHistogram) {
    out.push('[');
    seconds(out, t);
    out.push(',');
    histogram(out, h);
    out.push(']');
}

fn labels(out: &mut String, l: &Labels) {
    out.push('{');
    for (i, x) in l.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        string(out, &x.name);
        out.push(':');
        string(out, &x.value);
    }
    out.push('}');
}

/// The whole success response of `/api/v1/query` or `/api/v1/query_range`.
pub fn response(value: &Value, annotations: &[Annotation], query: &str) -> String {
    let points: usize = match value {
        Value::Vector(s) | Value::Matrix(s) => s.iter().map(|s| s.points.len() + 8 * s.hists.len()).sum(),
        _ => 1,
    };
    let mut out = String::with_capacity(64 + points * 32);
    out.push_str(r#"{"status":"success","data":{"resultType":"#);
    match value {
        Value::Scalar { t, v } => {
            out.push_str(r#""scalar","result":"#);
            point(&mut out, *t, *v);
        }
        Value::String { t, s } => {
            out.push_str(r#""string","result":["#);
            seconds(&mut out, *t);
            out.push(',');
            string(&mut out, s);
            out.push(']');
        }
        Value::Vector(series) => {
            out.push_str(r#""vector","result":["#);
            let mut first = true;
            for s in series {
                if s.is_empty() {
                    continue;
                }
                if !first {
                    out.push(',');
                }
                first = false;
                out.push_str(r#"{"metric":"#);
                labels(&mut out, &s.labels);
                match (s.points.first(), s.hists.first()) {
                    (Some(p), _) => {
                        out.push_str(r#","value":"#);
                        point(&mut out, p.t, p.f);
                    }
                    (None, Some(h)) => {
                        out.push_str(r#","histogram":"#);
                        histogram_point(&mut out, h.t, &h.h);
                    }
                    (None, None) => unreachable!("empty series are skipped"),
                }
                out.push('}');
            }
            out.push(']');
        }
        Value::Matrix(series) => {
            out.push_str(r#""matrix","result":["#);
            for (i, s) in series.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(r#"{"metric":"#);
                labels(&mut out, &s.labels);
                if !s.points.is_empty() || s.hists.is_empty() {
                    out.push_str(r#","values":["#);
                    for (j, p) in s.points.iter().enumerate() {
                        if j > 0 {
                            out.push(',');
                        }
                        point(&mut out, p.t, p.f);
                    }
                    out.push(']');
                }
                if !s.hists.is_empty() {
                    out.push_str(r#","histograms":["#);
                    for (j, p) in s.hists.iter().enumerate() {
                        if j > 0 {
                            out.push(',');
                        }
                        histogram_point(&mut out, p.t, &p.h);
                    }
                    out.push(']');
                }
                out.push('}');
            }
            out.push(']');
        }
    }
    out.push('}');
    for (key, info) in [("warnings", false), ("infos", true)] {
        let list: Vec<String> = annotations.iter().filter(|a| a.info == info).map(|a| a.render(query)).collect();
        if list.is_empty() {
            continue;
        }
        let _ = write!(out, r#","{key}":["#);
        for (i, a) in list.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            string(&mut out, a);
        }
        out.push(']');
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_promql::{Point, Series};

    #[test]
    fn parses_back_as_the_same_json() {
        let l = Labels::from_pairs([("__name__", "m"), ("path", "/a\"b\\c\n\u{1}")]);
        let v = Value::Matrix(vec![Series::new(
            l,
            vec![
                Point { t: 1_435_781_451_781, f: 1.5 },
                Point { t: 1_435_781_452_000, f: f64::NAN },
                Point { t: -1500, f: f64::NEG_INFINITY },
                Point { t: 0, f: 1e21 },
            ],
        )]);
        let a = [Annotation { info: true, msg: "x".into(), pos: 0 }];
        let s = response(&v, &a, "m");
        let j: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(j["data"]["result"][0]["metric"]["path"], "/a\"b\\c\n\u{1}");
        let values = &j["data"]["result"][0]["values"];
        assert_eq!(values[0][0].as_f64(), Some(1_435_781_451.781));
        assert_eq!(values[0][1], "1.5");
        assert_eq!(values[1][0].as_f64(), Some(1_435_781_452.0));
        assert_eq!(values[1][1], "NaN");
        assert_eq!(values[2][0].as_f64(), Some(-1.5));
        assert_eq!(values[2][1], "-Inf");
        assert_eq!(values[3][1], "1000000000000000000000");
        assert_eq!(j["infos"][0], "PromQL info: x (1:1)");
        let s = response(&Value::Scalar { t: 1000, v: 2.0 }, &[], "2");
        assert_eq!(s, r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#);
    }

    #[test]
    fn histograms_as_prometheus_writes_them() {
        use std::sync::Arc;
        use strata_model::histogram::notation::parse;
        use strata_promql::value::HPoint;
        let h =
            Arc::new(parse("{{count:5 sum:7.5 z_bucket:1 z_bucket_w:0.001 buckets:[1 0 2] n_buckets:[1]}}").unwrap());
        let l = Labels::from_pairs([("__name__", "h")]);
        let v = Value::Vector(vec![Series::with_hists(l.clone(), vec![], vec![HPoint { t: 1500, h: h.clone() }])]);
        assert_eq!(
            response(&v, &[], "h"),
            concat!(
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"h"},"#,
                r#""histogram":[1.5,{"count":"5","sum":"7.5","buckets":[[1,"-1","-0.5","1"],[3,"-0.001","0.001","1"],"#,
                r#"[0,"0.5","1","1"],[0,"2","4","2"]]}]}]}}"#
            )
        );
        // A range result with both kinds has both keys.
        let m = Value::Matrix(vec![Series::with_hists(l, vec![Point { t: 0, f: 1.0 }], vec![HPoint { t: 1000, h }])]);
        let j: serde_json::Value = serde_json::from_str(&response(&m, &[], "h")).unwrap();
        assert_eq!(j["data"]["result"][0]["values"][0][1], "1");
        assert_eq!(j["data"]["result"][0]["histograms"][0][1]["count"], "5");
    }
}
