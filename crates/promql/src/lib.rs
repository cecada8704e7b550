//! PromQL for Strata: parse, then evaluate step-vectorized over `strata_tsdb::querier`.
//!
//! - `lexer`, `parser`, `ast`: the language, type-checked at parse time, with Prometheus' error
//!   wording; experimental syntax sits behind [`parser::Features`].
//! - `functions`: the signature table.

pub mod ast;
pub mod error;
pub mod functions;
pub mod lexer;
pub mod parser;
pub mod printer;

pub use error::{EvalError, ParseError};
pub use parser::{parse, parse_with, Features};
pub mod eval;
pub mod value;

pub use eval::{
    map_rollup_with, release_idle_memory, Engine, EngineOptions, QueryOutput, QueryStats, RollupMapFn,
    SourceResolution, Storage,
};
pub use value::{Annotation, Point, Series, Value};
