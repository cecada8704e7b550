//! The signature of every PromQL function: argument types, optional arguments, result type.
//! Evaluation lives in `eval::functions`; this table is what the parser type-checks against.

use crate::ast::ValueType::{self, Matrix as M, Scalar as S, String as Str, Vector as V};

#[derive(Debug, PartialEq, Eq)]
pub struct Function {
    pub name: &'static str,
    /// All argument types; with `variadic == -1` the last one repeats.
    pub args: &'static [ValueType],
    /// How many trailing arguments are optional; -1: the last one repeats without bound.
    pub variadic: i32,
    pub returns: ValueType,
    /// Behind Prometheus' `--enable-feature=promql-experimental-functions`.
    pub experimental: bool,
}

impl Function {
    pub fn min_args(&self) -> usize {
        if self.variadic < 0 {
            self.args.len() - 1
        } else {
            self.args.len() - self.variadic as usize
        }
    }

    pub fn max_args(&self) -> Option<usize> {
        (self.variadic >= 0).then_some(self.args.len())
    }

    /// The expected type of argument `i`.
    pub fn arg_type(&self, i: usize) -> ValueType {
        self.args[i.min(self.args.len() - 1)]
    }
}

const fn f(name: &'static str, args: &'static [ValueType], variadic: i32, returns: ValueType) -> Function {
    Function { name, args, variadic, returns, experimental: false }
}

const fn x(name: &'static str, args: &'static [ValueType], variadic: i32, returns: ValueType) -> Function {
    Function { name, args, variadic, returns, experimental: true }
}

pub static FUNCTIONS: &[Function] = &[
    f("abs", &[V], 0, V),
    f("absent", &[V], 0, V),
    f("absent_over_time", &[M], 0, V),
    f("acos", &[V], 0, V),
    f("acosh", &[V], 0, V),
    f("asin", &[V], 0, V),
    f("asinh", &[V], 0, V),
    f("atan", &[V], 0, V),
    f("atanh", &[V], 0, V),
    f("avg_over_time", &[M], 0, V),
    f("ceil", &[V], 0, V),
    f("changes", &[M], 0, V),
    f("clamp", &[V, S, S], 0, V),
    f("clamp_max", &[V, S], 0, V),
    f("clamp_min", &[V, S], 0, V),
    f("cos", &[V], 0, V),
    f("cosh", &[V], 0, V),
    f("count_over_time", &[M], 0, V),
    f("day_of_month", &[V], 1, V),
    f("day_of_week", &[V], 1, V),
    f("day_of_year", &[V], 1, V),
    f("days_in_month", &[V], 1, V),
    f("deg", &[V], 0, V),
    f("delta", &[M], 0, V),
    f("deriv", &[M], 0, V),
    x("double_exponential_smoothing", &[M, S, S], 0, V),
    x("end", &[], 0, S),
    f("exp", &[V], 0, V),
    x("first_over_time", &[M], 0, V),
    f("floor", &[V], 0, V),
    f("histogram_avg", &[V], 0, V),
    f("histogram_count", &[V], 0, V),
    f("histogram_fraction", &[S, S, V], 0, V),
    f("histogram_quantile", &[S, V], 0, V),
    x("histogram_quantiles", &[V, Str, S], -1, V),
    f("histogram_stddev", &[V], 0, V),
    f("histogram_stdvar", &[V], 0, V),
    f("histogram_sum", &[V], 0, V),
    f("hour", &[V], 1, V),
    f("idelta", &[M], 0, V),
    f("increase", &[M], 0, V),
    x("info", &[V, V], 1, V),
    f("irate", &[M], 0, V),
    f("label_join", &[V, Str, Str, Str], -1, V),
    f("label_replace", &[V, Str, Str, Str, Str], 0, V),
    f("last_over_time", &[M], 0, V),
    f("ln", &[V], 0, V),
    f("log10", &[V], 0, V),
    f("log2", &[V], 0, V),
    x("mad_over_time", &[M], 0, V),
    x("max_of", &[S, S], 0, S),
    f("max_over_time", &[M], 0, V),
    x("min_of", &[S, S], 0, S),
    f("min_over_time", &[M], 0, V),
    f("minute", &[V], 1, V),
    f("month", &[V], 1, V),
    f("pi", &[], 0, S),
    f("predict_linear", &[M, S], 0, V),
    f("present_over_time", &[M], 0, V),
    f("quantile_over_time", &[S, M], 0, V),
    f("rad", &[V], 0, V),
    x("range", &[], 0, S),
    f("rate", &[M], 0, V),
    f("resets", &[M], 0, V),
    f("round", &[V, S], 1, V),
    f("scalar", &[V], 0, S),
    f("sgn", &[V], 0, V),
    f("sin", &[V], 0, V),
    f("sinh", &[V], 0, V),
    f("sort", &[V], 0, V),
    x("sort_by_label", &[V, Str], -1, V),
    x("sort_by_label_desc", &[V, Str], -1, V),
    f("sort_desc", &[V], 0, V),
    f("sqrt", &[V], 0, V),
    x("start", &[], 0, S),
    x("start_timestamp", &[V], 0, V),
    f("stddev_over_time", &[M], 0, V),
    f("stdvar_over_time", &[M], 0, V),
    x("step", &[], 0, S),
    f("sum_over_time", &[M], 0, V),
    f("tan", &[V], 0, V),
    f("tanh", &[V], 0, V),
    f("time", &[], 0, S),
    f("timestamp", &[V], 0, V),
    x("ts_of_first_over_time", &[M], 0, V),
    x("ts_of_last_over_time", &[M], 0, V),
    x("ts_of_max_over_time", &[M], 0, V),
    x("ts_of_min_over_time", &[M], 0, V),
    f("vector", &[S], 0, V),
    f("year", &[V], 1, V),
];

pub fn lookup(name: &str) -> Option<&'static Function> {
    FUNCTIONS.iter().find(|f| f.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_and_unique() {
        for w in FUNCTIONS.windows(2) {
            assert!(w[0].name < w[1].name, "{} before {}", w[0].name, w[1].name);
        }
    }

    #[test]
    fn optional_arguments() {
        let round = lookup("round").unwrap();
        assert_eq!((round.min_args(), round.max_args()), (1, Some(2)));
        let join = lookup("label_join").unwrap();
        assert_eq!((join.min_args(), join.max_args()), (3, None));
        assert_eq!(join.arg_type(7), Str);
        let year = lookup("year").unwrap();
        assert_eq!((year.min_args(), year.max_args()), (0, Some(1)));
    }
}
