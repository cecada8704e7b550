//! Graphite's target language, as graphite-web 1.1 parses it (`render/grammar_unsafe.py`):
//! path expressions with globs (`servers.*.cpu.{user,system}`), function calls nested to any
//! depth with positional then keyword arguments (`summarize(a.b, "1h", func="max")`), strings
//! in single or double quotes, numbers (`-1`, `0.5`, `1e3`), `true`/`false`, `none`, `inf`,
//! piped calls (`a.b | scale(2) | alias("x")`, the same as nesting them), `template(...)` with
//! `$variables`, and `seriesByTag(...)`.
//!
//! Where graphite-web's grammar is silent this parser follows it: a string keeps its
//! backslashes as written (graphite-web strips only the quotes); a number is a number only when
//! `,`, `)` or the end follows it (`1.2.3` and `404s` are paths); a keyword likewise. Unlike
//! graphite-web, text left over after a whole expression is an error rather than ignored, and
//! every error names the position and what was found there.

use std::fmt;

/// A parsed target or argument.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A path expression: a path, a glob, or a `$variable` a template fills in. Escaped
    /// characters (`\(`) are kept without their backslash, as graphite-web keeps them.
    Path(String),
    Call(Call),
    /// `template(expr, args...)`: `expr` with `$name` (or `$1`, `$2`... for positional
    /// arguments) replaced.
    Template {
        expr: Box<Expr>,
        args: Vec<Expr>,
        kwargs: Vec<(String, Expr)>,
    },
    /// The text between the quotes, backslashes kept.
    String(String),
    Number(Number),
    Bool(bool),
    None,
}

/// A number as graphite-web keeps it: Python's `int` or `float` (a function may tell them
/// apart, and `str()` of each differs in series names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(i64),
    Float(f64),
}

impl Number {
    pub fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    pub args: Vec<Expr>,
    pub kwargs: Vec<(String, Expr)>,
    /// The call as written (`seriesByTag` is fetched by it, as graphite-web fetches it).
    pub raw: String,
}

/// Why a target did not parse: where, and what was there.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at position {pos} of the target (found {found})")]
pub struct ParseError {
    /// Byte offset into the target.
    pub pos: usize,
    pub what: String,
    /// The text there, shortened, or "the end".
    pub found: String,
}

/// Nesting deeper than this is refused: a target is a short human-written expression, and a
/// recursive evaluator must not run out of stack on a hostile one.
pub const MAX_DEPTH: usize = 100;

/// Parses one target.
pub fn parse(target: &str) -> Result<Expr, ParseError> {
    let mut p = Parser { s: target, pos: 0, depth: 0 };
    p.skip_ws();
    if p.at_end() {
        return Err(p.error("an empty target"));
    }
    let e = p.expression()?;
    p.skip_ws();
    if !p.at_end() {
        return Err(p.error("text after the end of the expression"));
    }
    Ok(e)
}

/// Characters that end a path element (graphite-web's `symbols`) besides whitespace.
const SYMBOLS: &[u8] = b"(){},.'\"\\|";

struct Parser<'s> {
    s: &'s str,
    pos: usize,
    depth: usize,
}

impl<'s> Parser<'s> {
    fn rest(&self) -> &'s str {
        &self.s[self.pos..]
    }

    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn error(&self, what: &str) -> ParseError {
        let rest = self.rest();
        let found = if rest.is_empty() {
            "the end".to_owned()
        } else {
            let cut: String = rest.chars().take(20).collect();
            let more = if cut.len() < rest.len() { "…" } else { "" };
            format!("{cut:?}{more}")
        };
        ParseError { pos: self.pos, what: what.to_owned(), found }
    }

    /// `(template | call | path) ( '|' call )*`
    fn expression(&mut self) -> Result<Expr, ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error(&format!("nesting deeper than {MAX_DEPTH}")));
        }
        self.skip_ws();
        let mut e = match self.identifier_before_paren() {
            Some("template") => self.template()?,
            Some(_) => Expr::Call(self.call()?),
            None => Expr::Path(self.path()?),
        };
        loop {
            let save = self.pos;
            self.skip_ws();
            if self.peek() != Some(b'|') {
                self.pos = save;
                break;
            }
            self.pos += 1;
            self.skip_ws();
            if self.identifier_before_paren().is_none() {
                return Err(self.error("a function call after '|'"));
            }
            let mut call = self.call()?;
            // `x | f(a)` is `f(x, a)`.
            call.args.insert(0, e);
            e = Expr::Call(call);
        }
        self.depth -= 1;
        Ok(e)
    }

    /// The identifier at the cursor if `(` follows it (optionally after spaces).
    fn identifier_before_paren(&self) -> Option<&'s str> {
        self.identifier_then('(')
    }

    /// The identifier (letters, digits, `_`; not starting with a digit) at the cursor, if
    /// `next` follows it, optionally after spaces.
    fn identifier_then(&self, next: char) -> Option<&'s str> {
        let rest = self.rest();
        let b = rest.as_bytes();
        if !b.first().is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_') {
            return None;
        }
        let len = b.iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
        rest[len..].trim_start().starts_with(next).then(|| &rest[..len])
    }

    fn call(&mut self) -> Result<Call, ParseError> {
        let start = self.pos;
        let name = self.identifier_before_paren().expect("checked by the caller");
        self.pos += name.len();
        self.skip_ws();
        self.pos += 1; // '('
        let (args, kwargs) = self.arguments(false)?;
        Ok(Call { name: name.to_owned(), args, kwargs, raw: self.s[start..self.pos].to_owned() })
    }

    /// `template(call | path [, literal args | , literal kwargs])`
    fn template(&mut self) -> Result<Expr, ParseError> {
        self.pos += "template".len();
        self.skip_ws();
        self.pos += 1; // '('
        self.skip_ws();
        let inner = match self.identifier_before_paren() {
            Some(_) => Expr::Call(self.call()?),
            None => Expr::Path(self.path()?),
        };
        self.skip_ws();
        let (args, kwargs) = match self.peek() {
            Some(b',') => {
                self.pos += 1;
                self.arguments(true)?
            }
            Some(b')') => {
                self.pos += 1;
                (Vec::new(), Vec::new())
            }
            _ => return Err(self.error("',' or ')' in template(...)")),
        };
        Ok(Expr::Template { expr: Box::new(inner), args, kwargs })
    }

    /// The arguments after `(` up to and including `)`: positional ones first, then keyword
    /// ones. `literal`: only strings and numbers (a template's).
    #[allow(clippy::type_complexity)]
    fn arguments(&mut self, literal: bool) -> Result<(Vec<Expr>, Vec<(String, Expr)>), ParseError> {
        let (mut args, mut kwargs) = (Vec::new(), Vec::new());
        self.skip_ws();
        if self.peek() == Some(b')') && !literal {
            self.pos += 1;
            return Ok((args, kwargs));
        }
        loop {
            self.skip_ws();
            match self.keyword_name() {
                Some(name) => {
                    self.pos += name.len();
                    self.skip_ws();
                    self.pos += 1; // '='
                    let v = self.argument(literal)?;
                    kwargs.push((name.to_owned(), v));
                }
                None if !kwargs.is_empty() => {
                    return Err(self.error("a keyword argument (name=value): positional ones come first"));
                }
                None => args.push(self.argument(literal)?),
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b')') => {
                    self.pos += 1;
                    return Ok((args, kwargs));
                }
                _ => return Err(self.error("',' or ')' after an argument")),
            }
        }
    }

    /// `name` if the cursor is at `name =` (a keyword argument).
    fn keyword_name(&self) -> Option<&'s str> {
        self.identifier_then('=')
    }

    fn argument(&mut self, literal: bool) -> Result<Expr, ParseError> {
        self.skip_ws();
        match self.peek() {
            None => return Err(self.error("an argument")),
            Some(q @ (b'"' | b'\'')) => return self.string(q),
            _ => {}
        }
        if let Some(n) = self.number() {
            return Ok(Expr::Number(n));
        }
        if literal {
            return Err(self.error("a string or a number (template arguments are literals)"));
        }
        for (word, value) in [("true", Expr::Bool(true)), ("false", Expr::Bool(false)), ("none", Expr::None)] {
            if self.keyword(word) {
                return Ok(value);
            }
        }
        if self.keyword("inf") {
            return Ok(Expr::Number(Number::Float(f64::INFINITY)));
        }
        self.expression()
    }

    /// Whether a case-insensitive `word` is at the cursor as a whole argument; consumes it.
    fn keyword(&mut self, word: &str) -> bool {
        let rest = self.rest();
        let whole = rest.len() >= word.len()
            && rest.as_bytes()[..word.len()].eq_ignore_ascii_case(word.as_bytes())
            && Self::ends_argument(&rest[word.len()..]);
        if whole {
            self.pos += word.len();
        }
        whole
    }

    /// Whether `rest` starts where an argument may end: `,`, `)`, the end (after spaces).
    fn ends_argument(rest: &str) -> bool {
        let t = rest.trim_start();
        t.is_empty() || t.starts_with(',') || t.starts_with(')')
    }

    /// A number followed by the end of its argument, as graphite-web reads one: `-?\d+`, with
    /// `.\d+`, with an exponent.
    fn number(&mut self) -> Option<Number> {
        let rest = self.rest();
        let b = rest.as_bytes();
        let digits = |from: usize| b[from.min(b.len())..].iter().take_while(|c| c.is_ascii_digit()).count();
        let mut i = usize::from(b.first() == Some(&b'-'));
        let int_digits = digits(i);
        if int_digits == 0 {
            return None;
        }
        i += int_digits;
        let mut float = false;
        if b.get(i) == Some(&b'.') && digits(i + 1) > 0 {
            i += 1 + digits(i + 1);
            float = true;
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            let sign = usize::from(b.get(i + 1) == Some(&b'-'));
            let exp = digits(i + 1 + sign);
            if exp > 0 {
                i += 1 + sign + exp;
                float = true;
            }
        }
        if !Self::ends_argument(&rest[i..]) {
            return None;
        }
        let text = &rest[..i];
        let n = if float {
            Number::Float(text.parse().ok()?)
        } else {
            match text.parse::<i64>() {
                Ok(v) => Number::Int(v),
                // Python's ints have no bound; past i64 the value as a float is what a
                // function computes with anyway.
                Err(_) => Number::Float(text.parse().ok()?),
            }
        };
        self.pos += i;
        Some(n)
    }

    fn string(&mut self, quote: u8) -> Result<Expr, ParseError> {
        let start = self.pos;
        let b = self.s.as_bytes();
        let mut i = self.pos + 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'\n' | b'\r' => break,
                c if c == quote => {
                    self.pos = i + 1;
                    return Ok(Expr::String(self.s[start + 1..i].to_owned()));
                }
                _ => i += 1,
            }
        }
        Err(self.error("a closing quote for this string"))
    }

    /// A path expression: elements of metric characters, `\`-escaped symbols and `{a,b}`
    /// alternatives, joined by dots.
    fn path(&mut self) -> Result<String, ParseError> {
        let mut out = String::new();
        let start = self.pos;
        loop {
            let element_start = out.len();
            while let Some(c) = self.rest().chars().next() {
                match c {
                    '\\' => {
                        let next = self.rest()[1..].chars().next();
                        match next {
                            Some(e) if e.is_ascii() && SYMBOLS.contains(&(e as u8)) || e == '=' => {
                                out.push(e);
                                self.pos += 1 + e.len_utf8();
                            }
                            _ => return Err(self.error("an escaped symbol after '\\'")),
                        }
                    }
                    '{' => {
                        let close = self.rest().find('}').ok_or_else(|| self.error("a closing '}'"))?;
                        let inner = &self.rest()[1..close];
                        if inner.bytes().any(|b| b.is_ascii_whitespace() || b"(){.'\"\\|".contains(&b)) {
                            return Err(self.error("a list of path parts inside '{...}'"));
                        }
                        out.push_str(&self.rest()[..=close]);
                        self.pos += close + 1;
                    }
                    c if c.is_whitespace() || c.is_control() || (c.is_ascii() && SYMBOLS.contains(&(c as u8))) => break,
                    c => {
                        out.push(c);
                        self.pos += c.len_utf8();
                    }
                }
            }
            if out.len() == element_start {
                return Err(if self.pos == start {
                    self.error("a path, a function call or a value")
                } else {
                    self.error("a path element after '.'")
                });
            }
            if self.peek() == Some(b'.') {
                out.push('.');
                self.pos += 1;
            } else {
                return Ok(out);
            }
        }
    }
}

impl fmt::Display for Number {
    /// As Python's `str()` writes the value (series names quote arguments this way).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Float(v) => f.write_str(&crate::render::py_float(*v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> Expr {
        Expr::Path(s.to_owned())
    }

    fn call(name: &str, args: Vec<Expr>, raw: &str) -> Expr {
        Expr::Call(Call { name: name.to_owned(), args, kwargs: Vec::new(), raw: raw.to_owned() })
    }

    #[test]
    fn paths_calls_and_literals() {
        assert_eq!(parse("servers.*.cpu.{user,system}").unwrap(), path("servers.*.cpu.{user,system}"));
        assert_eq!(parse("a.b[0-9]?.c;tag=v").unwrap(), path("a.b[0-9]?.c;tag=v"));
        assert_eq!(
            parse("aliasByNode(sumSeries(servers.*.cpu.user), 1)").unwrap(),
            call(
                "aliasByNode",
                vec![
                    call("sumSeries", vec![path("servers.*.cpu.user")], "sumSeries(servers.*.cpu.user)"),
                    Expr::Number(Number::Int(1))
                ],
                "aliasByNode(sumSeries(servers.*.cpu.user), 1)"
            )
        );
        let Expr::Call(c) = parse(r#"summarize( a.b , "1h", func='max', alignToFrom=True)"#).unwrap() else { panic!() };
        assert_eq!(c.args, [path("a.b"), Expr::String("1h".into())]);
        assert_eq!(c.kwargs, [("func".into(), Expr::String("max".into())), ("alignToFrom".into(), Expr::Bool(true))]);
        let Expr::Call(c) = parse("f(-1, 0.5, 1e3, 2.5E-1, none, inf, FALSE, 1.2.3, 404s, -)").unwrap() else {
            panic!()
        };
        assert_eq!(
            c.args,
            [
                Expr::Number(Number::Int(-1)),
                Expr::Number(Number::Float(0.5)),
                Expr::Number(Number::Float(1000.0)),
                Expr::Number(Number::Float(0.25)),
                Expr::None,
                Expr::Number(Number::Float(f64::INFINITY)),
                Expr::Bool(false),
                path("1.2.3"),
                path("404s"),
                path("-"),
            ]
        );
        // A string keeps its backslashes; an escaped symbol in a path loses its backslash.
        assert_eq!(
            parse(r#"alias(a, "x\"y")"#).unwrap(),
            call("alias", vec![path("a"), Expr::String(r#"x\"y"#.into())], r#"alias(a, "x\"y")"#)
        );
        assert_eq!(parse(r"a\(b\).c").unwrap(), path("a(b).c"));
        assert_eq!(parse("f()").unwrap(), call("f", vec![], "f()"));
    }

    #[test]
    fn pipes_nest_and_templates_keep_their_arguments() {
        assert_eq!(
            parse("a.b | scale(2) |alias('x')").unwrap(),
            call(
                "alias",
                vec![
                    call("scale", vec![path("a.b"), Expr::Number(Number::Int(2))], "scale(2)"),
                    Expr::String("x".into())
                ],
                "alias('x')"
            )
        );
        assert_eq!(
            parse("template(sumSeries($host.cpu), host='web1')").unwrap(),
            Expr::Template {
                expr: Box::new(call("sumSeries", vec![path("$host.cpu")], "sumSeries($host.cpu)")),
                args: vec![],
                kwargs: vec![("host".into(), Expr::String("web1".into()))],
            }
        );
        let Expr::Call(c) = parse(r#"seriesByTag('name=cpu', "dc=~eu.*")"#).unwrap() else { panic!() };
        assert_eq!(c.raw, r#"seriesByTag('name=cpu', "dc=~eu.*")"#);
    }

    #[test]
    fn mistakes_name_their_position() {
        for (target, pos, what) in [
            ("", 0, "an empty target"),
            ("sumSeries(a.b", 13, "',' or ')'"),
            ("sumSeries(a.b))", 14, "text after"),
            ("f(x=1, a.b)", 7, "positional ones come first"),
            ("alias(a, 'x)", 9, "closing quote"),
            ("a..b", 2, "a path element"),
            ("a.{b,c", 2, "closing '}'"),
            ("f(,)", 2, "a path, a function call or a value"),
            ("a | b", 4, "a function call after '|'"),
            ("template(a, b.c)", 12, "literals"),
        ] {
            let e = parse(target).unwrap_err();
            assert_eq!(e.pos, pos, "{target:?}: {e}");
            assert!(e.to_string().contains(what), "{target:?}: {e}");
        }
        let deep = format!("{}a{}", "f(".repeat(MAX_DEPTH + 1), ")".repeat(MAX_DEPTH + 1));
        assert!(parse(&deep).unwrap_err().to_string().contains("nesting deeper"));
    }

    proptest::proptest! {
        /// Whatever the input, an expression or an error: never a panic.
        #[test]
        fn any_text_parses_or_fails_cleanly(s in "[a-z0-9(){},.'\"\\\\| =*$-]{0,40}") {
            let _ = parse(&s);
        }
    }
}
