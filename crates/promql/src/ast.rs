//! The syntax tree of a PromQL expression, type-checked by the parser.

use strata_model::Matcher;

/// What an expression evaluates to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    Scalar,
    Vector,
    Matrix,
    String,
}

impl ValueType {
    pub fn name(self) -> &'static str {
        match self {
            ValueType::Scalar => "scalar",
            ValueType::Vector => "instant vector",
            ValueType::Matrix => "range vector",
            ValueType::String => "string",
        }
    }
}

/// An expression and the byte range of the query text it came from.
#[derive(Debug, Clone)]
pub struct Expr {
    pub kind: ExprKind,
    pub start: usize,
    pub end: usize,
    /// Nodes on the longest path from this one down to a leaf (1 for a leaf). Evaluation,
    /// cloning and dropping recurse once per level, so the parser refuses trees higher than
    /// its limit (`parser::MAX_DEPTH_DEFAULT`) instead of letting a query overflow a thread's
    /// stack; [`Expr::new`] keeps it right for nodes built elsewhere.
    pub height: u32,
}

#[derive(Debug, Clone)]
pub enum ExprKind {
    Number(f64),
    /// A string literal; `Err` holds bytes that are not UTF-8 (valid syntax, refused where used
    /// as a label name or value).
    String(Result<String, Vec<u8>>),
    Vector(VectorSelector),
    Matrix(MatrixSelector),
    Subquery(Box<Subquery>),
    Paren(Box<Expr>),
    /// Unary minus.
    Neg(Box<Expr>),
    /// Unary plus before anything but a number literal: evaluates as its operand, kept (as
    /// Prometheus keeps it) so that the query prints back as written.
    Pos(Box<Expr>),
    Binary(Box<Binary>),
    Aggregate(Box<Aggregate>),
    Call(Call),
}

/// `@ <time>`, `@ start()`, `@ end()`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum At {
    Ms(i64),
    Start,
    End,
}

/// How a range selector's window is read (experimental extended range selectors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RangeMode {
    #[default]
    Plain,
    /// `anchored`: the window's start takes the last sample before it.
    Anchored,
    /// `smoothed`: values at the window's edges are interpolated.
    Smoothed,
}

#[derive(Debug, Clone)]
pub struct VectorSelector {
    /// The metric name as written before `{` (also present as a `__name__` matcher).
    pub name: Option<String>,
    pub matchers: Vec<Matcher>,
    pub offset: Option<Duration>,
    pub at: Option<At>,
    pub mode: RangeMode,
    /// Set by the engine, not the parser: the histograms this selector reads are used only for
    /// their count and sum (under `histogram_count`, `histogram_sum`, `histogram_avg`), so
    /// their counter reset hints are resolved as they are read, as Prometheus' statistics-only
    /// reading does.
    pub stats_only: bool,
}

#[derive(Debug, Clone)]
pub struct MatrixSelector {
    pub vector: VectorSelector,
    pub range: Duration,
}

#[derive(Debug, Clone)]
pub struct Subquery {
    pub expr: Expr,
    pub range: Duration,
    /// None: the default resolution (the engine's default subquery step).
    pub step: Option<Duration>,
    pub offset: Option<Duration>,
    pub at: Option<At>,
}

/// A duration: a literal, or (experimental) an arithmetic expression over literals, `step()`,
/// `range()`, `min_of`, `max_of`, evaluated per query.
#[derive(Debug, Clone, PartialEq)]
pub enum Duration {
    /// Milliseconds (may be negative for offsets).
    Ms(i64),
    /// A number of seconds (numbers in durations are seconds).
    Expr(Box<DurationExpr>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum DurationExpr {
    /// A literal in seconds.
    Seconds(f64),
    Step,
    Range,
    Neg(DurationNode),
    Binary(BinaryOp, DurationNode, DurationNode),
    MinOf(DurationNode, DurationNode),
    MaxOf(DurationNode, DurationNode),
}

pub type DurationNode = Box<DurationExpr>;

impl DurationExpr {
    /// Seconds, given the query's step and range (both in ms).
    pub fn eval_seconds(&self, step_ms: i64, range_ms: i64) -> f64 {
        match self {
            DurationExpr::Seconds(s) => *s,
            DurationExpr::Step => step_ms as f64 / 1000.0,
            DurationExpr::Range => range_ms as f64 / 1000.0,
            DurationExpr::Neg(e) => -e.eval_seconds(step_ms, range_ms),
            DurationExpr::Binary(op, a, b) => {
                op.apply_scalar(a.eval_seconds(step_ms, range_ms), b.eval_seconds(step_ms, range_ms))
            }
            DurationExpr::MinOf(a, b) => a.eval_seconds(step_ms, range_ms).min(b.eval_seconds(step_ms, range_ms)),
            DurationExpr::MaxOf(a, b) => a.eval_seconds(step_ms, range_ms).max(b.eval_seconds(step_ms, range_ms)),
        }
    }
}

impl Duration {
    /// Milliseconds, given the query's step and range.
    pub fn ms(&self, step_ms: i64, range_ms: i64) -> i64 {
        match self {
            Duration::Ms(ms) => *ms,
            Duration::Expr(e) => (e.eval_seconds(step_ms, range_ms) * 1000.0).round() as i64,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    Atan2,
    Eql,
    Neq,
    Gtr,
    Lss,
    Gte,
    Lte,
    And,
    Or,
    Unless,
    /// `</` and `>/`: native-histogram bucket trimming.
    TrimUpper,
    TrimLower,
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eql | BinaryOp::Neq | BinaryOp::Gtr | BinaryOp::Lss | BinaryOp::Gte | BinaryOp::Lte)
    }

    pub fn is_set(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or | BinaryOp::Unless)
    }

    /// Binding strength; higher binds tighter.
    pub fn precedence(self) -> u8 {
        match self {
            BinaryOp::Or => 1,
            BinaryOp::And | BinaryOp::Unless => 2,
            BinaryOp::Eql | BinaryOp::Neq | BinaryOp::Gtr | BinaryOp::Lss | BinaryOp::Gte | BinaryOp::Lte => 3,
            BinaryOp::Add | BinaryOp::Sub => 4,
            BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Mod
            | BinaryOp::Atan2
            | BinaryOp::TrimUpper
            | BinaryOp::TrimLower => 5,
            BinaryOp::Pow => 6,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            BinaryOp::Div => "/",
            BinaryOp::Mod => "%",
            BinaryOp::Pow => "^",
            BinaryOp::Atan2 => "atan2",
            BinaryOp::Eql => "==",
            BinaryOp::Neq => "!=",
            BinaryOp::Gtr => ">",
            BinaryOp::Lss => "<",
            BinaryOp::Gte => ">=",
            BinaryOp::Lte => "<=",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Unless => "unless",
            BinaryOp::TrimUpper => "</",
            BinaryOp::TrimLower => ">/",
        }
    }

    /// Arithmetic on two floats; comparisons give 1 or 0. Set operators are not scalar ops.
    pub fn apply_scalar(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Mod => a % b,
            BinaryOp::Pow => a.powf(b),
            BinaryOp::Atan2 => a.atan2(b),
            _ => {
                if self.compare(a, b) {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }

    /// The comparison as a predicate (false for non-comparisons).
    pub fn compare(self, a: f64, b: f64) -> bool {
        match self {
            BinaryOp::Eql => a == b,
            BinaryOp::Neq => a != b,
            BinaryOp::Gtr => a > b,
            BinaryOp::Lss => a < b,
            BinaryOp::Gte => a >= b,
            BinaryOp::Lte => a <= b,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cardinality {
    OneToOne,
    ManyToOne,
    OneToMany,
    ManyToMany,
}

/// `on`/`ignoring` and `group_left`/`group_right` of a binary operation between vectors.
#[derive(Debug, Clone)]
pub struct VectorMatching {
    pub card: Cardinality,
    /// `on(...)` when true, `ignoring(...)` when false.
    pub on: bool,
    pub labels: Vec<String>,
    /// Labels copied from the "one" side (`group_left(...)`).
    pub include: Vec<String>,
}

impl Default for VectorMatching {
    fn default() -> Self {
        VectorMatching { card: Cardinality::OneToOne, on: false, labels: Vec::new(), include: Vec::new() }
    }
}

#[derive(Debug, Clone)]
pub struct Binary {
    pub op: BinaryOp,
    pub lhs: Expr,
    pub rhs: Expr,
    /// `bool` after a comparison.
    pub return_bool: bool,
    /// Present when both sides are vectors.
    pub matching: Option<VectorMatching>,
    /// `fill_left(v)` / `fill_right(v)` (experimental): values used for a side without a match.
    pub fill_left: Option<f64>,
    pub fill_right: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateOp {
    Sum,
    Avg,
    Count,
    Min,
    Max,
    Group,
    Stddev,
    Stdvar,
    TopK,
    BottomK,
    CountValues,
    Quantile,
    LimitK,
    LimitRatio,
}

impl AggregateOp {
    pub fn from_name(s: &str) -> Option<AggregateOp> {
        Some(match s.to_ascii_lowercase().as_str() {
            "sum" => AggregateOp::Sum,
            "avg" => AggregateOp::Avg,
            "count" => AggregateOp::Count,
            "min" => AggregateOp::Min,
            "max" => AggregateOp::Max,
            "group" => AggregateOp::Group,
            "stddev" => AggregateOp::Stddev,
            "stdvar" => AggregateOp::Stdvar,
            "topk" => AggregateOp::TopK,
            "bottomk" => AggregateOp::BottomK,
            "count_values" => AggregateOp::CountValues,
            "quantile" => AggregateOp::Quantile,
            "limitk" => AggregateOp::LimitK,
            "limit_ratio" => AggregateOp::LimitRatio,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            AggregateOp::Sum => "sum",
            AggregateOp::Avg => "avg",
            AggregateOp::Count => "count",
            AggregateOp::Min => "min",
            AggregateOp::Max => "max",
            AggregateOp::Group => "group",
            AggregateOp::Stddev => "stddev",
            AggregateOp::Stdvar => "stdvar",
            AggregateOp::TopK => "topk",
            AggregateOp::BottomK => "bottomk",
            AggregateOp::CountValues => "count_values",
            AggregateOp::Quantile => "quantile",
            AggregateOp::LimitK => "limitk",
            AggregateOp::LimitRatio => "limit_ratio",
        }
    }

    /// The type of the parameter, for the operators that take one.
    pub fn param_type(self) -> Option<ValueType> {
        match self {
            AggregateOp::TopK
            | AggregateOp::BottomK
            | AggregateOp::Quantile
            | AggregateOp::LimitK
            | AggregateOp::LimitRatio => Some(ValueType::Scalar),
            AggregateOp::CountValues => Some(ValueType::String),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Aggregate {
    pub op: AggregateOp,
    pub expr: Expr,
    pub param: Option<Expr>,
    pub grouping: Vec<String>,
    pub without: bool,
}

#[derive(Debug, Clone)]
pub struct Call {
    pub func: &'static crate::functions::Function,
    pub args: Vec<Expr>,
}

impl Expr {
    /// A node over `kind`, its height taken from its children's.
    pub fn new(kind: ExprKind, start: usize, end: usize) -> Expr {
        let below = match &kind {
            ExprKind::Number(_) | ExprKind::String(_) | ExprKind::Vector(_) | ExprKind::Matrix(_) => 0,
            ExprKind::Subquery(s) => s.expr.height,
            ExprKind::Paren(e) | ExprKind::Neg(e) | ExprKind::Pos(e) => e.height,
            ExprKind::Binary(b) => b.lhs.height.max(b.rhs.height),
            ExprKind::Aggregate(a) => a.expr.height.max(a.param.as_ref().map_or(0, |p| p.height)),
            ExprKind::Call(c) => c.args.iter().map(|a| a.height).max().unwrap_or(0),
        };
        Expr { kind, start, end, height: below.saturating_add(1) }
    }

    pub fn value_type(&self) -> ValueType {
        match &self.kind {
            ExprKind::Number(_) => ValueType::Scalar,
            ExprKind::String(_) => ValueType::String,
            ExprKind::Vector(_) => ValueType::Vector,
            ExprKind::Matrix(_) | ExprKind::Subquery(_) => ValueType::Matrix,
            ExprKind::Paren(e) | ExprKind::Neg(e) | ExprKind::Pos(e) => e.value_type(),
            ExprKind::Binary(b) => {
                if b.lhs.value_type() == ValueType::Scalar && b.rhs.value_type() == ValueType::Scalar {
                    ValueType::Scalar
                } else {
                    ValueType::Vector
                }
            }
            ExprKind::Aggregate(_) => ValueType::Vector,
            ExprKind::Call(c) => c.func.returns,
        }
    }

    /// Strips parentheses.
    pub fn unparen(&self) -> &Expr {
        match &self.kind {
            ExprKind::Paren(e) => e.unparen(),
            _ => self,
        }
    }

    /// Calls `f` on this node and every node below it, parents first.
    pub fn walk(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match &self.kind {
            ExprKind::Subquery(s) => s.expr.walk(f),
            ExprKind::Paren(e) | ExprKind::Neg(e) | ExprKind::Pos(e) => e.walk(f),
            ExprKind::Binary(b) => {
                b.lhs.walk(f);
                b.rhs.walk(f);
            }
            ExprKind::Aggregate(a) => {
                if let Some(p) = &a.param {
                    p.walk(f);
                }
                a.expr.walk(f);
            }
            ExprKind::Call(c) => c.args.iter().for_each(|a| a.walk(f)),
            _ => {}
        }
    }
}
