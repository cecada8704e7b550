//! Values produced by evaluation.

use strata_model::Labels;

/// One float at a timestamp (ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub t: i64,
    pub f: f64,
}

/// A series of points: across the steps of a range evaluation (at most one point per step,
/// in step order), or the raw samples of a range-vector result.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Labels,
    pub points: Vec<Point>,
    /// The metric name is to be removed at the end of evaluation (delayed name removal): set by
    /// functions and arithmetic, so that a later `label_replace` can still read `__name__`.
    pub drop_name: bool,
}

impl Series {
    pub fn new(labels: Labels, points: Vec<Point>) -> Series {
        Series { labels, points, drop_name: false }
    }
}

/// The result of a query.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Scalar {
        t: i64,
        v: f64,
    },
    String {
        t: i64,
        s: String,
    },
    /// An instant vector: one point per series, at the evaluation time.
    Vector(Vec<Series>),
    /// A range query's result, or an instant query of a range vector; sorted by labels.
    Matrix(Vec<Series>),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Scalar { .. } => "scalar",
            Value::String { .. } => "string",
            Value::Vector(_) => "vector",
            Value::Matrix(_) => "matrix",
        }
    }
}

/// An annotation attached to a result (Prometheus' warnings and infos).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotation {
    pub info: bool,
    pub msg: String,
    /// Byte offset in the query of the expression it refers to.
    pub pos: usize,
}

impl Annotation {
    /// `PromQL warning: <msg> (<line>:<col>)`, as Prometheus renders it.
    pub fn render(&self, query: &str) -> String {
        let (l, c) = crate::error::line_col(query, self.pos);
        let kind = if self.info { "info" } else { "warning" };
        format!("PromQL {kind}: {} ({l}:{c})", self.msg)
    }
}
