//! A recursive-descent PromQL parser with precedence climbing, type-checking as it builds, with
//! Prometheus' grammar and error wording.
//!
//! Binding, loosest first: `or`; `and`/`unless`; comparisons; `+ -`; `* / % atan2`; `^`
//! (right-associative). Unary minus binds like `*`, so `-2^2` is `-(2^2)`. Postfix modifiers
//! (`[range]`, `[range:step]`, `offset`, `@`, `anchored`, `smoothed`) bind tightest.

use strata_model::{MatchOp, Matcher, METRIC_NAME};

use crate::ast::*;
use crate::error::ParseError;
use crate::functions;
use crate::lexer::{lex, Tok, Token};

/// Language features that Prometheus keeps behind feature flags; off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// `promql-experimental-functions`: sort_by_label, info, limitk, limit_ratio, …
    pub experimental_functions: bool,
    /// `promql-duration-expr`: arithmetic in ranges, offsets and steps; `step()`, `range()`…
    pub duration_expressions: bool,
    /// `promql-extended-range-selectors`: `anchored` and `smoothed`.
    pub extended_range_selectors: bool,
    /// `promql-binop-fill-modifiers`: `fill(v)`, `fill_left(v)`, `fill_right(v)`.
    pub fill_modifiers: bool,
    /// `use-start-timestamps`: evaluation reads samples' start times (not a syntax change;
    /// the engine takes it from here, see `EngineOptions::use_start_timestamps`).
    pub use_start_timestamps: bool,
}

impl Features {
    pub fn all() -> Features {
        Features {
            experimental_functions: true,
            duration_expressions: true,
            extended_range_selectors: true,
            fill_modifiers: true,
            use_start_timestamps: true,
        }
    }
}

/// How deeply a query may nest, by default: parentheses, operators, calls, aggregations and
/// subqueries inside one another, and the terms of an operator chain (`a + b + c` is a tree of
/// height 3). Prometheus sets no limit; its Go parser and evaluator grow their stacks. Ours
/// recurse on fixed thread stacks, so the limit is what keeps one query from overflowing one:
/// `tests/deep_queries.rs` parses and evaluates trees of this height on a thread stack half
/// of [`QUERY_THREAD_STACK_BYTES`]. Hand-written queries nest a dozen levels; generated `or`
/// chains of a few hundred terms still fit.
pub const MAX_DEPTH_DEFAULT: u32 = 1000;

/// Stack for the threads that parse and evaluate queries at [`MAX_DEPTH_DEFAULT`]: measured,
/// a level of nesting takes up to about 4 KiB of stack to parse (release build) and 2 KiB to
/// evaluate, so 1000 levels need about 4 MiB; this leaves four times that. Only the pages a
/// query touches are ever committed.
pub const QUERY_THREAD_STACK_BYTES: usize = 16 << 20;

/// Parses a query with Prometheus' default (stable) language.
pub fn parse(input: &str) -> Result<Expr, ParseError> {
    parse_with(input, Features::default())
}

pub fn parse_with(input: &str, features: Features) -> Result<Expr, ParseError> {
    parse_with_depth(input, features, MAX_DEPTH_DEFAULT)
}

/// Parses with the nesting limit `max_depth` (see [`MAX_DEPTH_DEFAULT`]): deeper queries are
/// refused with an error at the place where the limit was passed.
pub fn parse_with_depth(input: &str, features: Features, max_depth: u32) -> Result<Expr, ParseError> {
    let toks = lex(input)?;
    let mut p = Parser { toks, i: 0, features, info_selector: false, depth: 0, max_depth, duration_nodes: 0 };
    if p.peek() == &Tok::Eof {
        return Err(ParseError::at(0, "no expression found in input"));
    }
    let e = p.expr(0)?;
    if p.peek() != &Tok::Eof {
        return Err(p.unexpected("end of input"));
    }
    Ok(e)
}

struct Parser {
    toks: Vec<Token>,
    i: usize,
    features: Features,
    /// Parsing the data-label selector of `info()`, which may match the empty string only.
    info_selector: bool,
    /// Calls of `expr` and `duration_unary` now under way: the parser's own recursion.
    depth: u32,
    max_depth: u32,
    /// Nodes of the duration expression being parsed (its height is at most this).
    duration_nodes: u32,
}

fn is_aggregator(name: &str) -> bool {
    AggregateOp::from_name(name).is_some()
}

impl Parser {
    fn peek(&self) -> &Tok {
        &self.toks[self.i].tok
    }

    fn peek_at(&self, k: usize) -> &Tok {
        &self.toks[(self.i + k).min(self.toks.len() - 1)].tok
    }

    fn pos(&self) -> usize {
        self.toks[self.i].pos
    }

    /// The end of the previous token (its start; good enough for spans of diagnostics).
    fn last_end(&self) -> usize {
        self.toks[self.i.saturating_sub(1)].pos + 1
    }

    fn next(&mut self) -> Tok {
        let t = self.toks[self.i].tok.clone();
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
        t
    }

    fn describe(t: &Tok) -> String {
        match t {
            Tok::Ident(s) | Tok::MetricIdent(s) => format!("identifier {s:?}"),
            Tok::Number(n) => format!("number \"{n}\""),
            Tok::Duration(_) => "duration".into(),
            Tok::Str(_) => "string".into(),
            Tok::Eof => "end of input".into(),
            other => format!("{other:?}"),
        }
    }

    fn unexpected(&self, expected: &str) -> ParseError {
        ParseError::at(self.pos(), format!("unexpected {}, expected {expected}", Self::describe(self.peek())))
    }

    fn expect(&mut self, t: Tok, what: &str) -> Result<(), ParseError> {
        if self.peek() == &t {
            self.next();
            Ok(())
        } else {
            Err(self.unexpected(what))
        }
    }

    fn ident_is(&self, word: &str) -> bool {
        matches!(self.peek(), Tok::Ident(s) if s.eq_ignore_ascii_case(word))
    }

    fn binary_op(&self) -> Option<BinaryOp> {
        Some(match self.peek() {
            Tok::Add => BinaryOp::Add,
            Tok::Sub => BinaryOp::Sub,
            Tok::Mul => BinaryOp::Mul,
            Tok::Div => BinaryOp::Div,
            Tok::Mod => BinaryOp::Mod,
            Tok::Pow => BinaryOp::Pow,
            Tok::EqlEql => BinaryOp::Eql,
            Tok::Neq => BinaryOp::Neq,
            Tok::Gtr => BinaryOp::Gtr,
            Tok::Lss => BinaryOp::Lss,
            Tok::Gte => BinaryOp::Gte,
            Tok::Lte => BinaryOp::Lte,
            Tok::TrimUpper => BinaryOp::TrimUpper,
            Tok::TrimLower => BinaryOp::TrimLower,
            Tok::Ident(s) => match s.to_ascii_lowercase().as_str() {
                "and" => BinaryOp::And,
                "or" => BinaryOp::Or,
                "unless" => BinaryOp::Unless,
                "atan2" => BinaryOp::Atan2,
                _ => return None,
            },
            _ => return None,
        })
    }

    /// The error for a query nested deeper than the limit, at `pos`.
    fn too_deep(&self, pos: usize) -> ParseError {
        ParseError::at(
            pos,
            format!(
                "query is nested too deeply: more than {} levels of parentheses, operators, calls or subqueries",
                self.max_depth
            ),
        )
    }

    /// One more level of the parser's recursion, refused past the limit; `ascend` undoes it.
    fn descend(&mut self) -> Result<(), ParseError> {
        if self.depth >= self.max_depth {
            return Err(self.too_deep(self.pos()));
        }
        self.depth += 1;
        Ok(())
    }

    fn ascend(&mut self) {
        debug_assert!(self.depth > 0, "ascend without descend");
        self.depth -= 1;
    }

    /// A node over `kind`, refused if it makes the tree higher than the limit.
    fn node(&self, kind: ExprKind, start: usize, end: usize) -> Result<Expr, ParseError> {
        self.checked_height(Expr::new(kind, start, end))
    }

    fn checked_height(&self, e: Expr) -> Result<Expr, ParseError> {
        if e.height > self.max_depth {
            return Err(self.too_deep(e.start));
        }
        Ok(e)
    }

    fn expr(&mut self, min_prec: u8) -> Result<Expr, ParseError> {
        self.descend()?;
        let e = self.binary_chain(min_prec);
        self.ascend();
        e
    }

    /// Operands joined by operators that bind at least as tightly as `min_prec`. A chain is
    /// parsed in a loop, not by recursion, but the tree it builds grows one level per
    /// operator: `node` bounds that height.
    fn binary_chain(&mut self, min_prec: u8) -> Result<Expr, ParseError> {
        let mut lhs = self.unary()?;
        while let Some(op) = self.binary_op() {
            let prec = op.precedence();
            if prec < min_prec {
                break;
            }
            let op_pos = self.pos();
            self.next();
            let placeholder = || Expr::new(ExprKind::Number(0.0), op_pos, op_pos);
            let mut b = Binary {
                op,
                lhs: placeholder(),
                rhs: placeholder(),
                return_bool: false,
                matching: None,
                fill_left: None,
                fill_right: None,
            };
            self.binary_modifiers(&mut b, op_pos)?;
            let next_min = if op == BinaryOp::Pow { prec } else { prec + 1 };
            let rhs = self.expr(next_min)?;
            b.lhs = lhs;
            b.rhs = rhs;
            lhs = self.checked_height(check_binary(b, op_pos)?)?;
        }
        Ok(lhs)
    }

    /// `bool`, `on(…)`/`ignoring(…)`, `group_left(…)`/`group_right(…)`, `fill…(v)` after an
    /// operator.
    fn binary_modifiers(&mut self, b: &mut Binary, op_pos: usize) -> Result<(), ParseError> {
        if self.ident_is("bool") {
            if !b.op.is_comparison() {
                return Err(ParseError::at(self.pos(), "bool modifier can only be used on comparison operators"));
            }
            self.next();
            b.return_bool = true;
        }
        let mut m: Option<VectorMatching> = None;
        if self.ident_is("on") || self.ident_is("ignoring") {
            let on = self.ident_is("on");
            self.next();
            let labels = self.grouping_labels()?;
            m = Some(VectorMatching { on, labels, ..Default::default() });
            if self.ident_is("group_left") || self.ident_is("group_right") {
                let left = self.ident_is("group_left");
                let at = self.pos();
                self.next();
                if b.op.is_set() {
                    return Err(ParseError::at(at, format!("no grouping allowed for \"{}\" operation", b.op.as_str())));
                }
                let include = if self.peek() == &Tok::LParen { self.grouping_labels()? } else { Vec::new() };
                let mm = m.as_mut().expect("set above");
                for l in &include {
                    if mm.on && mm.labels.contains(l) {
                        return Err(ParseError::at(
                            at,
                            format!("label \"{l}\" must not occur in ON and GROUP clause at once"),
                        ));
                    }
                }
                mm.card = if left { Cardinality::ManyToOne } else { Cardinality::OneToMany };
                mm.include = include;
            }
        } else if self.ident_is("group_left") || self.ident_is("group_right") {
            return Err(self.unexpected("\"on\" or \"ignoring\" before grouping"));
        }
        // `fill(`… is a modifier; a bare `fill` is a metric name (`x + fill`).
        while self.peek_at(1) == &Tok::LParen {
            let which = if self.ident_is("fill") {
                0
            } else if self.ident_is("fill_left") {
                1
            } else if self.ident_is("fill_right") {
                2
            } else {
                break;
            };
            if !self.features.fill_modifiers {
                return Err(ParseError::at(self.pos(), "binary operator fill modifiers are not enabled"));
            }
            self.next();
            self.expect(Tok::LParen, "\"(\" after fill modifier")?;
            let neg = if self.peek() == &Tok::Sub {
                self.next();
                true
            } else {
                if self.peek() == &Tok::Add {
                    self.next();
                }
                false
            };
            let Tok::Number(v) = self.next() else {
                return Err(ParseError::at(self.last_end(), "fill modifier expects a number"));
            };
            let v = if neg { -v } else { v };
            self.expect(Tok::RParen, "\")\"")?;
            if which != 2 {
                b.fill_left = Some(v);
            }
            if which != 1 {
                b.fill_right = Some(v);
            }
        }
        if (b.fill_left.is_some() || b.fill_right.is_some()) && b.op.is_set() {
            return Err(ParseError::at(op_pos, format!("fill modifiers are not allowed for \"{}\"", b.op.as_str())));
        }
        b.matching = m;
        Ok(())
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        let start = self.pos();
        match self.peek() {
            Tok::Sub | Tok::Add => {
                let neg = self.peek() == &Tok::Sub;
                self.next();
                let e = self.expr(BinaryOp::Pow.precedence())?;
                let end = e.end;
                match e.value_type() {
                    ValueType::Scalar | ValueType::Vector => {}
                    t => {
                        return Err(ParseError::at(
                            start,
                            format!(
                                "unary expression only allowed on expressions of type scalar or instant vector, got {}",
                                t.name()
                            ),
                        ))
                    }
                }
                // As Prometheus: the sign of a number literal is folded into it.
                if let ExprKind::Number(n) = e.kind {
                    return Ok(Expr::new(ExprKind::Number(if neg { -n } else { n }), start, end));
                }
                let kind = if neg { ExprKind::Neg(Box::new(e)) } else { ExprKind::Pos(Box::new(e)) };
                self.node(kind, start, end)
            }
            _ => {
                let p = self.primary()?;
                self.postfix(p)
            }
        }
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        let start = self.pos();
        let tok = self.peek().clone();
        let kind = match tok {
            Tok::Number(n) => {
                self.next();
                ExprKind::Number(n)
            }
            Tok::Duration(ms) => {
                self.next();
                ExprKind::Number(ms as f64 / 1000.0)
            }
            Tok::Str(bytes) => {
                self.next();
                ExprKind::String(String::from_utf8(bytes).map_err(|e| e.into_bytes()))
            }
            Tok::LParen => {
                self.next();
                let e = self.expr(0)?;
                self.expect(Tok::RParen, "\")\"")?;
                ExprKind::Paren(Box::new(e))
            }
            Tok::LBrace => ExprKind::Vector(self.selector(None)?),
            Tok::MetricIdent(name) => {
                self.next();
                ExprKind::Vector(self.selector(Some(name))?)
            }
            Tok::Ident(name) => {
                let lower = name.to_ascii_lowercase();
                if is_aggregator(&lower) {
                    self.next();
                    ExprKind::Aggregate(Box::new(self.aggregate(&lower, start)?))
                } else if self.peek_at(1) == &Tok::LParen {
                    self.next();
                    ExprKind::Call(self.call(&name, start)?)
                } else if matches!(
                    lower.as_str(),
                    "by" | "without"
                        | "on"
                        | "ignoring"
                        | "group_left"
                        | "group_right"
                        | "offset"
                        | "bool"
                        | "and"
                        | "or"
                        | "unless"
                        | "atan2"
                ) {
                    return Err(self.unexpected("expression"));
                } else {
                    self.next();
                    ExprKind::Vector(self.selector(Some(name))?)
                }
            }
            _ => return Err(self.unexpected("expression")),
        };
        self.node(kind, start, self.last_end())
    }

    fn postfix(&mut self, mut e: Expr) -> Result<Expr, ParseError> {
        loop {
            let at = self.pos();
            match self.peek() {
                Tok::LBracket => {
                    self.next();
                    let range = self.duration_expr()?;
                    if self.peek() == &Tok::Colon {
                        self.next();
                        let step = if self.peek() == &Tok::RBracket { None } else { Some(self.duration_expr()?) };
                        self.expect(Tok::RBracket, "\"]\"")?;
                        if e.value_type() != ValueType::Vector {
                            return Err(ParseError::at(
                                at,
                                format!(
                                    "subquery is only allowed on instant vector, got {} instead",
                                    e.value_type().name()
                                ),
                            ));
                        }
                        let start = e.start;
                        let subquery = Subquery { expr: e, range, step, offset: None, at: None };
                        e = self.node(ExprKind::Subquery(Box::new(subquery)), start, self.last_end())?;
                        continue;
                    }
                    self.expect(Tok::RBracket, "\"]\" or \":\"")?;
                    let start = e.start;
                    let ExprKind::Vector(vector) = e.kind else {
                        return Err(ParseError::at(at, "ranges only allowed for vector selectors"));
                    };
                    if vector.offset.is_some() || vector.at.is_some() {
                        return Err(ParseError::at(at, "no offset or @ modifiers allowed before range"));
                    }
                    e = Expr::new(ExprKind::Matrix(MatrixSelector { vector, range }), start, self.last_end());
                }
                Tok::Ident(w) if w.eq_ignore_ascii_case("offset") => {
                    self.next();
                    let d = self.offset_duration()?;
                    let slot = match &mut e.kind {
                        ExprKind::Vector(v) => &mut v.offset,
                        ExprKind::Matrix(m) => &mut m.vector.offset,
                        ExprKind::Subquery(s) => &mut s.offset,
                        _ => {
                            return Err(ParseError::at(
                                at,
                                "offset modifier must be preceded by an instant vector selector or range vector selector or a subquery",
                            ))
                        }
                    };
                    if slot.is_some() {
                        return Err(ParseError::at(at, "offset may not be set multiple times"));
                    }
                    *slot = Some(d);
                    e.end = self.last_end();
                }
                Tok::At => {
                    self.next();
                    let a = self.at_modifier()?;
                    let slot = match &mut e.kind {
                        ExprKind::Vector(v) => &mut v.at,
                        ExprKind::Matrix(m) => &mut m.vector.at,
                        ExprKind::Subquery(s) => &mut s.at,
                        _ => {
                            return Err(ParseError::at(
                                at,
                                "@ modifier must be preceded by an instant vector selector or range vector selector or a subquery",
                            ))
                        }
                    };
                    if slot.is_some() {
                        return Err(ParseError::at(at, "@ <timestamp> may not be set multiple times"));
                    }
                    *slot = Some(a);
                    e.end = self.last_end();
                }
                Tok::Ident(w) if w.eq_ignore_ascii_case("anchored") || w.eq_ignore_ascii_case("smoothed") => {
                    let mode =
                        if w.eq_ignore_ascii_case("anchored") { RangeMode::Anchored } else { RangeMode::Smoothed };
                    if !self.features.extended_range_selectors {
                        return Err(ParseError::at(
                            at,
                            "extended range selectors (anchored, smoothed) are not enabled",
                        ));
                    }
                    self.next();
                    let v = match &mut e.kind {
                        ExprKind::Vector(v) => v,
                        ExprKind::Matrix(m) => &mut m.vector,
                        _ => {
                            return Err(ParseError::at(
                                at,
                                "anchored and smoothed modifiers must follow a vector selector",
                            ));
                        }
                    };
                    v.mode = mode;
                    e.end = self.last_end();
                }
                _ => return Ok(e),
            }
        }
    }

    fn at_modifier(&mut self) -> Result<At, ParseError> {
        let at = self.pos();
        if self.ident_is("start") || self.ident_is("end") {
            let start = self.ident_is("start");
            self.next();
            self.expect(Tok::LParen, "\"(\"")?;
            self.expect(Tok::RParen, "\")\"")?;
            return Ok(if start { At::Start } else { At::End });
        }
        let neg = match self.peek() {
            Tok::Sub => {
                self.next();
                true
            }
            Tok::Add => {
                self.next();
                false
            }
            _ => false,
        };
        let secs = match self.next() {
            Tok::Number(n) => n,
            Tok::Duration(ms) => ms as f64 / 1000.0,
            _ => return Err(ParseError::at(at, "unexpected token after @, expected timestamp or start() or end()")),
        };
        let secs = if neg { -secs } else { secs };
        let ms = secs * 1000.0;
        if !ms.is_finite() || ms.abs() > i64::MAX as f64 {
            return Err(ParseError::at(at, format!("timestamp out of bounds for @ modifier: {secs}")));
        }
        Ok(At::Ms(ms.round() as i64))
    }

    /// The duration after `offset`: an optionally signed literal, or with duration expressions
    /// a parenthesised expression or a duration function.
    fn offset_duration(&mut self) -> Result<Duration, ParseError> {
        let at = self.pos();
        self.duration_nodes = 0;
        let e = self.duration_unary(true)?;
        self.finish_duration(e, at)
    }

    fn duration_expr(&mut self) -> Result<Duration, ParseError> {
        let at = self.pos();
        self.duration_nodes = 0;
        let e = self.duration_binary(0)?;
        self.finish_duration(e, at)
    }

    /// One more node in the duration expression being parsed: its evaluation recurses per
    /// level, and a tree has no more levels than nodes.
    fn duration_node(&mut self, at: usize) -> Result<(), ParseError> {
        self.duration_nodes += 1;
        if self.duration_nodes > self.max_depth {
            return Err(self.too_deep(at));
        }
        Ok(())
    }

    /// Literals stay literals; anything else needs the duration-expression feature.
    fn finish_duration(&mut self, e: DurationExpr, at: usize) -> Result<Duration, ParseError> {
        match simple_duration(&e) {
            Some(ms) => Ok(Duration::Ms(ms)),
            None if self.features.duration_expressions => Ok(Duration::Expr(Box::new(e))),
            None => Err(ParseError::at(at, "duration expressions are not enabled")),
        }
    }

    fn duration_binary(&mut self, min_prec: u8) -> Result<DurationExpr, ParseError> {
        let mut lhs = self.duration_unary(false)?;
        loop {
            let op = match self.peek() {
                Tok::Add => BinaryOp::Add,
                Tok::Sub => BinaryOp::Sub,
                Tok::Mul => BinaryOp::Mul,
                Tok::Div => BinaryOp::Div,
                Tok::Mod => BinaryOp::Mod,
                Tok::Pow => BinaryOp::Pow,
                _ => break,
            };
            let prec = op.precedence();
            if prec < min_prec {
                break;
            }
            let at = self.pos();
            self.next();
            let rhs = self.duration_binary(if op == BinaryOp::Pow { prec } else { prec + 1 })?;
            self.duration_node(at)?;
            lhs = DurationExpr::Binary(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    /// A signed duration primary. After `offset` (`primary_only`), only a primary is taken, so
    /// `x offset 5m + 1` is `(x offset 5m) + 1`.
    /// Every cycle of the duration parsers' recursion passes through here: one level.
    fn duration_unary(&mut self, primary_only: bool) -> Result<DurationExpr, ParseError> {
        self.descend()?;
        let e = self.duration_signed(primary_only);
        self.ascend();
        e
    }

    fn duration_signed(&mut self, primary_only: bool) -> Result<DurationExpr, ParseError> {
        let at = self.pos();
        self.duration_node(at)?;
        match self.peek() {
            Tok::Sub => {
                self.next();
                let e = if primary_only {
                    self.duration_unary(true)?
                } else {
                    self.duration_binary(BinaryOp::Pow.precedence())?
                };
                Ok(match e {
                    DurationExpr::Seconds(s) => DurationExpr::Seconds(-s),
                    e => DurationExpr::Neg(Box::new(e)),
                })
            }
            Tok::Add => {
                self.next();
                if primary_only {
                    self.duration_unary(true)
                } else {
                    self.duration_binary(BinaryOp::Pow.precedence())
                }
            }
            _ => self.duration_primary(),
        }
    }

    fn duration_primary(&mut self) -> Result<DurationExpr, ParseError> {
        let at = self.pos();
        match self.next() {
            Tok::Duration(ms) => Ok(DurationExpr::Seconds(ms as f64 / 1000.0)),
            Tok::Number(n) => Ok(DurationExpr::Seconds(n)),
            Tok::LParen => {
                let e = self.duration_binary(0)?;
                self.expect(Tok::RParen, "\")\"")?;
                Ok(e)
            }
            Tok::Ident(name) => {
                let lower = name.to_ascii_lowercase();
                self.expect(Tok::LParen, "\"(\"")?;
                let e = match lower.as_str() {
                    "step" => DurationExpr::Step,
                    "range" => DurationExpr::Range,
                    "min_of" | "max_of" => {
                        let a = self.duration_binary(0)?;
                        self.expect(Tok::Comma, "\",\"")?;
                        let b = self.duration_binary(0)?;
                        if lower == "min_of" {
                            DurationExpr::MinOf(Box::new(a), Box::new(b))
                        } else {
                            DurationExpr::MaxOf(Box::new(a), Box::new(b))
                        }
                    }
                    _ => return Err(ParseError::at(at, format!("unexpected function {name:?} in duration"))),
                };
                self.expect(Tok::RParen, "\")\"")?;
                Ok(e)
            }
            _ => {
                self.i -= 1;
                Err(self.unexpected("duration"))
            }
        }
    }

    /// `{…}` after an optional metric name.
    fn selector(&mut self, name: Option<String>) -> Result<VectorSelector, ParseError> {
        let start = self.pos();
        let mut matchers = Vec::new();
        let mut name = name;
        if let Some(n) = &name {
            matchers.push(Matcher::equal(METRIC_NAME, n.clone()));
        }
        if self.peek() == &Tok::LBrace {
            self.next();
            loop {
                if self.peek() == &Tok::RBrace {
                    self.next();
                    break;
                }
                let at = self.pos();
                let label = match self.next() {
                    Tok::Ident(s) => s,
                    Tok::Str(b) => {
                        let s = String::from_utf8(b).map_err(|_| ParseError::at(at, "invalid UTF-8 in label name"))?;
                        if matches!(self.peek(), Tok::Comma | Tok::RBrace) {
                            // A bare quoted string is the metric name.
                            if name.is_some() {
                                return Err(ParseError::at(at, "metric name must not be set twice"));
                            }
                            matchers.push(Matcher::equal(METRIC_NAME, s.clone()));
                            name = Some(s);
                            if self.peek() == &Tok::Comma {
                                self.next();
                            }
                            continue;
                        }
                        s
                    }
                    _ => {
                        self.i -= 1;
                        return Err(self.unexpected("label matching"));
                    }
                };
                let op = match self.next() {
                    Tok::Assign => MatchOp::Equal,
                    Tok::Neq => MatchOp::NotEqual,
                    Tok::EqRegex => MatchOp::RegexMatch,
                    Tok::NeqRegex => MatchOp::RegexNoMatch,
                    _ => {
                        self.i -= 1;
                        return Err(self.unexpected("label matching operator"));
                    }
                };
                let vpos = self.pos();
                let Tok::Str(value) = self.next() else {
                    self.i -= 1;
                    return Err(self.unexpected("string"));
                };
                let value =
                    String::from_utf8(value).map_err(|_| ParseError::at(vpos, "invalid UTF-8 in label value"))?;
                if label == METRIC_NAME
                    && name.is_some()
                    && op == MatchOp::Equal
                    && matchers.iter().any(|m| m.name == METRIC_NAME)
                {
                    return Err(ParseError::at(at, "metric name must not be set twice"));
                }
                let m = Matcher::new(op, label, value).map_err(|e| ParseError::at(vpos, e.to_string()))?;
                matchers.push(m);
                match self.peek() {
                    Tok::Comma => {
                        self.next();
                    }
                    Tok::RBrace => {}
                    _ => return Err(self.unexpected("\",\" or \"}\"")),
                }
            }
        }
        if matchers.iter().all(|m| m.matches_empty()) && !self.info_selector {
            return Err(ParseError::at(start, "vector selector must contain at least one non-empty matcher"));
        }
        Ok(VectorSelector { name, matchers, offset: None, at: None, mode: RangeMode::Plain, stats_only: false })
    }

    /// `(a, b, "c.d")`, trailing comma allowed.
    fn grouping_labels(&mut self) -> Result<Vec<String>, ParseError> {
        self.expect(Tok::LParen, "\"(\"")?;
        let mut out = Vec::new();
        loop {
            let at = self.pos();
            match self.next() {
                Tok::RParen => return Ok(out),
                Tok::Ident(s) => out.push(s),
                Tok::Str(b) => {
                    out.push(String::from_utf8(b).map_err(|_| ParseError::at(at, "invalid UTF-8 in label name"))?)
                }
                _ => {
                    self.i -= 1;
                    return Err(self.unexpected("label"));
                }
            }
            match self.peek() {
                Tok::Comma => {
                    self.next();
                }
                Tok::RParen => {}
                _ => return Err(self.unexpected("\",\" or \")\"")),
            }
        }
    }

    fn aggregate(&mut self, name: &str, start: usize) -> Result<Aggregate, ParseError> {
        let op = AggregateOp::from_name(name).expect("caller checked");
        if matches!(op, AggregateOp::LimitK | AggregateOp::LimitRatio) && !self.features.experimental_functions {
            return Err(ParseError::at(
                start,
                format!("limitk() and limit_ratio() are experimental and must be enabled ({name})"),
            ));
        }
        let mut grouping = Vec::new();
        let mut without = false;
        let mut have_grouping = false;
        if self.ident_is("by") || self.ident_is("without") {
            without = self.ident_is("without");
            self.next();
            grouping = self.grouping_labels()?;
            have_grouping = true;
        }
        self.expect(Tok::LParen, "\"(\"")?;
        let mut args = Vec::new();
        loop {
            if self.peek() == &Tok::RParen {
                self.next();
                break;
            }
            args.push(self.expr(0)?);
            match self.peek() {
                Tok::Comma => {
                    self.next();
                }
                Tok::RParen => {}
                _ => return Err(self.unexpected("\",\" or \")\"")),
            }
        }
        if !have_grouping && (self.ident_is("by") || self.ident_is("without")) {
            without = self.ident_is("without");
            self.next();
            grouping = self.grouping_labels()?;
        }
        let want = if op.param_type().is_some() { 2 } else { 1 };
        if args.len() != want {
            return Err(ParseError::at(
                start,
                format!(
                    "wrong number of arguments for aggregate expression provided, expected {want}, got {}",
                    args.len()
                ),
            ));
        }
        let expr = args.pop().expect("counted");
        let param = args.pop();
        if expr.value_type() != ValueType::Vector {
            return Err(ParseError::at(
                expr.start,
                format!("expected type instant vector in aggregation expression, got {}", expr.value_type().name()),
            ));
        }
        if let (Some(p), Some(t)) = (&param, op.param_type()) {
            if p.value_type() != t {
                return Err(ParseError::at(
                    p.start,
                    format!("expected type {} in aggregation parameter, got {}", t.name(), p.value_type().name()),
                ));
            }
        }
        Ok(Aggregate { op, expr, param, grouping, without })
    }

    fn call(&mut self, name: &str, start: usize) -> Result<Call, ParseError> {
        let func = functions::lookup(name)
            .ok_or_else(|| ParseError::at(start, format!("unknown function with name {name:?}")))?;
        if func.experimental && !self.features.experimental_functions {
            return Err(ParseError::at(start, format!("function {name:?} is experimental and not enabled")));
        }
        self.expect(Tok::LParen, "\"(\"")?;
        let mut args = Vec::new();
        loop {
            if self.peek() == &Tok::RParen {
                self.next();
                break;
            }
            self.info_selector = func.name == "info" && args.len() == 1;
            let arg = self.expr(0);
            self.info_selector = false;
            args.push(arg?);
            match self.peek() {
                Tok::Comma => {
                    self.next();
                }
                Tok::RParen => {}
                _ => return Err(self.unexpected("\",\" or \")\"")),
            }
        }
        let n = args.len();
        let (min, max) = (func.min_args(), func.max_args());
        if n < min || max.is_some_and(|m| n > m) {
            let msg = match max {
                Some(m) if m == min => format!("expected {m} argument(s) in call to {name:?}, got {n}"),
                Some(m) if n > m => format!("expected at most {m} argument(s) in call to {name:?}, got {n}"),
                _ => format!("expected at least {min} argument(s) in call to {name:?}, got {n}"),
            };
            return Err(ParseError::at(start, msg));
        }
        for (i, a) in args.iter().enumerate() {
            let want = func.arg_type(i);
            if a.value_type() != want {
                return Err(ParseError::at(
                    a.start,
                    format!(
                        "expected type {} in call to function {name:?}, got {}",
                        want.name(),
                        a.value_type().name()
                    ),
                ));
            }
        }
        Ok(Call { func, args })
    }
}

/// A duration that is a plain literal, in ms.
fn simple_duration(e: &DurationExpr) -> Option<i64> {
    match e {
        DurationExpr::Seconds(s) => Some((s * 1000.0).round() as i64),
        _ => None,
    }
}

fn check_binary(b: Binary, op_pos: usize) -> Result<Expr, ParseError> {
    let (lt, rt) = (b.lhs.value_type(), b.rhs.value_type());
    let ok = |t: ValueType| matches!(t, ValueType::Scalar | ValueType::Vector);
    if !ok(lt) || !ok(rt) {
        return Err(ParseError::at(op_pos, "binary expression must contain only scalar and instant vector types"));
    }
    let both_vectors = lt == ValueType::Vector && rt == ValueType::Vector;
    if b.op.is_comparison() && !b.return_bool && lt == ValueType::Scalar && rt == ValueType::Scalar {
        return Err(ParseError::at(op_pos, "comparisons between scalars must use BOOL modifier"));
    }
    if b.op.is_set() && !both_vectors {
        return Err(ParseError::at(
            op_pos,
            format!("set operator \"{}\" not allowed in binary scalar expression", b.op.as_str()),
        ));
    }
    let mut b = b;
    if both_vectors {
        let m = b.matching.get_or_insert_with(VectorMatching::default);
        if b.op.is_set() {
            m.card = Cardinality::ManyToMany;
        }
    } else if b.matching.as_ref().is_some_and(|m| !m.labels.is_empty() || m.on || m.card != Cardinality::OneToOne) {
        return Err(ParseError::at(op_pos, "vector matching only allowed between instant vectors"));
    } else {
        b.matching = None;
    }
    let (start, end) = (b.lhs.start, b.rhs.end);
    Ok(Expr::new(ExprKind::Binary(Box::new(b)), start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> Expr {
        parse_with(s, Features::all()).unwrap_or_else(|e| panic!("{s}: {}", e.render(s)))
    }

    fn err(s: &str) -> String {
        parse_with(s, Features::all()).map(|e| format!("{e:?}")).expect_err(s).msg
    }

    #[test]
    fn precedence() {
        let e = ok("1 + 2 * 3 ^ 2 ^ 2");
        let ExprKind::Binary(b) = &e.kind else { panic!() };
        assert_eq!(b.op, BinaryOp::Add);
        let e = ok("-2 ^ 2");
        assert!(matches!(e.kind, ExprKind::Neg(_)), "{e:?}");
        let e = ok("a or b and c");
        let ExprKind::Binary(b) = &e.kind else { panic!() };
        assert_eq!(b.op, BinaryOp::Or);
    }

    #[test]
    fn selectors_and_modifiers() {
        let e = ok(r#"rate(foo{a="b", c=~"d.*",}[5m] offset 1m @ 100)"#);
        let ExprKind::Call(c) = &e.kind else { panic!() };
        let ExprKind::Matrix(m) = &c.args[0].kind else { panic!() };
        assert_eq!(m.range, Duration::Ms(300_000));
        assert_eq!(m.vector.offset, Some(Duration::Ms(60_000)));
        assert_eq!(m.vector.at, Some(At::Ms(100_000)));
        assert_eq!(m.vector.matchers.len(), 3);
        ok(r#"{"some.metric", "label.x"="y"}"#);
        ok("sum by (a) (x) + on(b) group_left(c) y");
        ok("sum(x) without (a,)");
        ok("max_over_time(rate(x[1m])[10m:])");
        ok("x offset -5m");
        ok("x[2m*15]");
        ok("x offset (100 + 2) @ start()");
    }

    #[test]
    fn errors_are_prometheus_worded() {
        assert_eq!(err("{}"), "vector selector must contain at least one non-empty matcher");
        assert_eq!(err("rate(x)"), "expected type range vector in call to function \"rate\", got instant vector");
        assert_eq!(err("1 > 2"), "comparisons between scalars must use BOOL modifier");
        assert_eq!(err("x + on(a) 1"), "vector matching only allowed between instant vectors");
        assert_eq!(err("x and 1"), "set operator \"and\" not allowed in binary scalar expression");
        assert_eq!(err("foo(x)"), "unknown function with name \"foo\"");
        assert_eq!(err("(x)[5m]"), "ranges only allowed for vector selectors");
        assert_eq!(err("x offset 1m offset 2m"), "offset may not be set multiple times");
        assert!(parse("sort_by_label(x, \"a\")").is_err(), "experimental functions are off by default");
    }
}
