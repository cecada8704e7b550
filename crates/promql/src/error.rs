//! Errors of parsing and evaluation, worded as Prometheus words them where clients or tests
//! match on the text.

/// A syntax or type error in a query, at a byte offset of the query text.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{msg}")]
pub struct ParseError {
    pub pos: usize,
    pub msg: String,
}

impl ParseError {
    pub fn at(pos: usize, msg: impl Into<String>) -> Self {
        ParseError { pos, msg: msg.into() }
    }

    /// `line:col: parse error: msg`, as Prometheus reports it (1-based, col in bytes).
    pub fn render(&self, query: &str) -> String {
        let (line, col) = line_col(query, self.pos);
        format!("{line}:{col}: parse error: {}", self.msg)
    }
}

/// 1-based line and 1-based byte column of a byte offset.
pub fn line_col(query: &str, pos: usize) -> (usize, usize) {
    let before = &query.as_bytes()[..pos.min(query.len())];
    let line = before.iter().filter(|&&c| c == b'\n').count() + 1;
    let col = pos - before.iter().rposition(|&c| c == b'\n').map_or(0, |p| p + 1) + 1;
    (line, col)
}

/// Why an evaluation failed; the variant decides the HTTP API's `errorType`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// Bad input discovered while evaluating (`errorType: bad_data` / `execution`).
    #[error("{0}")]
    Execution(String),
    /// The query would hold more samples than allowed at once.
    #[error("query processing would load too many samples into memory in {0}")]
    TooManySamples(&'static str),
    #[error("query timed out in {0}")]
    Timeout(&'static str),
    #[error("query was canceled in {0}")]
    Canceled(&'static str),
    /// The storage failed (corrupt block, too many series).
    #[error("{0}")]
    Storage(String),
    /// A rollup tier cannot answer this query after all (it found native histograms): the
    /// engine evaluates it again on raw data. Never returned by `Engine`'s entry points.
    #[error("rollup tier cannot answer the query: {0}")]
    RollupUnsuitable(&'static str),
}

pub fn exec(msg: impl Into<String>) -> EvalError {
    EvalError::Execution(msg.into())
}
