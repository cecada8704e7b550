//! Values produced by evaluation.

use std::sync::Arc;

use strata_model::{FloatHistogram, Labels};

/// One float at a timestamp (ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub t: i64,
    pub f: f64,
}

/// One native histogram at a timestamp (ms); shared, since windows and aggregations copy
/// points around far more often than they change them.
#[derive(Debug, Clone, PartialEq)]
pub struct HPoint {
    pub t: i64,
    pub h: Arc<FloatHistogram>,
}

/// A series of points: across the steps of a range evaluation (at most one point per step,
/// in step order), or the raw samples of a range-vector result. Float points and histogram
/// points are kept apart (a step has one or the other), so float-only work never looks at
/// histograms.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Labels,
    pub points: Vec<Point>,
    /// Histogram points, in step order; at steps where `points` has none.
    pub hists: Vec<HPoint>,
    /// The metric name is to be removed at the end of evaluation (delayed name removal): set by
    /// functions and arithmetic, so that a later `label_replace` can still read `__name__`.
    pub drop_name: bool,
}

impl Series {
    pub fn new(labels: Labels, points: Vec<Point>) -> Series {
        Series { labels, points, hists: Vec::new(), drop_name: false }
    }

    pub fn with_hists(labels: Labels, points: Vec<Point>, hists: Vec<HPoint>) -> Series {
        Series { labels, points, hists, drop_name: false }
    }

    /// Points of both kinds.
    pub fn len(&self) -> usize {
        self.points.len() + self.hists.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && self.hists.is_empty()
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

/// An annotation attached to a result (Prometheus' warnings and infos). Ordered warnings
/// first, then by message and position.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
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
