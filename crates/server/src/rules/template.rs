//! Alert label and annotation templates: the part of Go's `text/template` that Prometheus rule
//! files use, with Prometheus' template functions.
//!
//! A rule file written for Prometheus must expand here to the same text, so the language is
//! Go's, not an invention: `{{ $labels.instance }}`, `{{ .Value }}`, pipelines
//! (`{{ $value | humanize }}`), `if`/`else if`/`else`, `range` (with `$i, $v :=`), `with`,
//! variables, comments and the `{{-`/`-}}` trim markers; Go's built-in functions (`and`, `or`,
//! `not`, `len`, `index`, `print*`, `eq`…`ge`, `html`, `js`, `urlquery`, `slice`) and
//! Prometheus' (`query`, `first`, `label`, `value`, `sortByLabel`, `humanize*`, `title`,
//! `toUpper`, `toLower`, `reReplaceAll`, `match`, `stripPort`, `stripDomain`, `toTime`,
//! `parseDuration`, `externalURL`, `pathPrefix`, `args`, `safeHtml`, `strvalue`,
//! `graphLink`, `tableLink`). What is not here (`define`, `template`, `block`, `break`,
//! `continue`) is refused when the rule file is loaded, with its position, never expanded
//! wrongly.
//!
//! As in Prometheus, the data is `.Labels`, `.ExternalLabels`, `.ExternalURL` and `.Value`,
//! with `$labels`, `$externalLabels`, `$externalURL` and `$value` declared ahead of the text.
//! A missing label reads as the empty string (`missingkey=zero`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use strata_promql::printer::go_float;

/// A template error, located by the byte offset in the template text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateError(pub String);

impl std::fmt::Display for TemplateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

type Result<T> = std::result::Result<T, TemplateError>;

fn err<T>(msg: impl Into<String>) -> Result<T> {
    Err(TemplateError(msg.into()))
}

/// One sample of a `query` result, as Prometheus' templates see it (`.Labels`, `.Value`).
#[derive(Debug, Clone, PartialEq)]
pub struct QuerySample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A value inside a template.
#[derive(Debug, Clone, PartialEq)]
pub enum TValue {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// A `map[string]string` (label sets).
    Map(Arc<BTreeMap<String, String>>),
    /// A struct with named fields (the template's data).
    Struct(Arc<BTreeMap<&'static str, TValue>>),
    Sample(Arc<QuerySample>),
    Samples(Arc<Vec<QuerySample>>),
    List(Arc<Vec<TValue>>),
}

impl TValue {
    /// Go's truth: false, 0, nil, and empty strings, maps and lists are false.
    fn truth(&self) -> bool {
        match self {
            TValue::Nil => false,
            TValue::Bool(b) => *b,
            TValue::Int(i) => *i != 0,
            TValue::Float(f) => *f != 0.0,
            TValue::Str(s) => !s.is_empty(),
            TValue::Map(m) => !m.is_empty(),
            TValue::Struct(_) | TValue::Sample(_) => true,
            TValue::Samples(s) => !s.is_empty(),
            TValue::List(l) => !l.is_empty(),
        }
    }

    /// Go's `%v`.
    fn print(&self, out: &mut String) {
        match self {
            TValue::Nil => out.push_str("<no value>"),
            TValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            TValue::Int(i) => {
                let _ = write!(out, "{i}");
            }
            TValue::Float(f) => out.push_str(&go_float(*f)),
            TValue::Str(s) => out.push_str(s),
            TValue::Map(m) => {
                out.push_str("map[");
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    let _ = write!(out, "{k}:{v}");
                }
                out.push(']');
            }
            TValue::Struct(_) => out.push_str("{...}"),
            TValue::Sample(s) => print_sample(s, out),
            TValue::Samples(v) => {
                out.push('[');
                for (i, s) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    print_sample(s, out);
                }
                out.push(']');
            }
            TValue::List(l) => {
                out.push('[');
                for (i, v) in l.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    v.print(out);
                }
                out.push(']');
            }
        }
    }

    fn to_text(&self) -> String {
        let mut s = String::new();
        self.print(&mut s);
        s
    }

    fn type_name(&self) -> &'static str {
        match self {
            TValue::Nil => "nil",
            TValue::Bool(_) => "bool",
            TValue::Int(_) => "int",
            TValue::Float(_) => "float64",
            TValue::Str(_) => "string",
            TValue::Map(_) => "map[string]string",
            TValue::Struct(_) => "struct",
            TValue::Sample(_) => "*sample",
            TValue::Samples(_) => "queryResult",
            TValue::List(_) => "[]interface {}",
        }
    }

    /// A number, as Prometheus' `convertToFloat` reads one (strings are parsed).
    fn to_float(&self) -> Result<f64> {
        match self {
            TValue::Float(f) => Ok(*f),
            TValue::Int(i) => Ok(*i as f64),
            TValue::Str(s) => {
                s.trim().parse::<f64>().or_else(|_| err(format!("strconv.ParseFloat: parsing {s:?}: invalid syntax")))
            }
            other => err(format!("can't convert {} to float", other.type_name())),
        }
    }
}

fn print_sample(s: &QuerySample, out: &mut String) {
    let _ = write!(out, "{{{} {}}}", TValue::Map(Arc::new(s.labels.clone())).to_text(), go_float(s.value));
}

// ---------------------------------------------------------------------------------------------
// Parsing

#[derive(Debug, Clone, PartialEq)]
enum Arg {
    /// `.A.B` (empty: the dot itself).
    Field(Vec<String>),
    /// `$x.A.B` (`$` alone is the data).
    Var(String, Vec<String>),
    Func(String),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Nil,
    /// `( pipeline ).A.B`
    Sub(Box<Pipeline>, Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
struct Command {
    args: Vec<Arg>,
}

#[derive(Debug, Clone, PartialEq)]
struct Pipeline {
    /// Variables declared (`:=`) or assigned (`=`).
    vars: Vec<String>,
    assign: bool,
    cmds: Vec<Command>,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Text(String),
    Action(Pipeline),
    If { branches: Vec<(Pipeline, Vec<Node>)>, otherwise: Vec<Node> },
    Range { pipe: Pipeline, body: Vec<Node>, otherwise: Vec<Node> },
    With { pipe: Pipeline, body: Vec<Node>, otherwise: Vec<Node> },
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    nodes: Vec<Node>,
}

/// An action's text with the offset where it starts, or plain text.
#[derive(Debug)]
enum Piece<'a> {
    Text(&'a str),
    Action(&'a str, usize),
}

/// Splits text and actions, applying the trim markers.
fn split(src: &str) -> Result<Vec<Piece<'_>>> {
    let mut out = Vec::new();
    let mut rest = 0;
    let mut trim_next = false;
    while rest < src.len() {
        let Some(open) = src[rest..].find("{{").map(|i| rest + i) else {
            let mut text = &src[rest..];
            if trim_next {
                text = text.trim_start();
            }
            out.push(Piece::Text(text));
            break;
        };
        let mut text = &src[rest..open];
        if trim_next {
            text = text.trim_start();
        }
        let mut inner_start = open + 2;
        if src[inner_start..].starts_with("- ")
            || src[inner_start..].starts_with("-\t")
            || src[inner_start..].starts_with("-\n")
        {
            text = text.trim_end();
            inner_start += 1;
        }
        out.push(Piece::Text(text));
        // The action ends at the first `}}` outside a string or comment.
        let close = find_close(src, inner_start)?;
        let mut inner_end = close;
        trim_next = false;
        if close > inner_start && src[..close].ends_with(" -")
            || src[..close].ends_with("\t-")
            || src[..close].ends_with("\n-")
        {
            inner_end -= 1;
            trim_next = true;
        }
        out.push(Piece::Action(&src[inner_start..inner_end], inner_start));
        rest = close + 2;
    }
    Ok(out)
}

fn find_close(src: &str, from: usize) -> Result<usize> {
    let b = src.as_bytes();
    let mut i = from;
    let trimmed = src[from..].trim_start();
    if trimmed.starts_with("/*") {
        let start = src.len() - trimmed.len();
        let Some(end) = src[start + 2..].find("*/") else {
            return err(format!("unclosed comment at offset {from}"));
        };
        let after = start + 2 + end + 2;
        let tail = src[after..].trim_start_matches(' ').trim_start_matches('-');
        if !tail.trim_start().starts_with("}}") {
            return err(format!("comment ends before closing delimiter at offset {after}"));
        }
        return Ok(src.len() - tail.trim_start().len());
    }
    while i + 1 < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    if b[i.min(b.len() - 1)] == b'\n' {
                        return err(format!("unterminated quoted string at offset {i}"));
                    }
                    i += 1;
                }
            }
            b'`' => {
                i += 1;
                while i < b.len() && b[i] != b'`' {
                    i += 1;
                }
            }
            b'}' if b[i + 1] == b'}' => return Ok(i),
            _ => {}
        }
        i += 1;
    }
    err(format!("unclosed action starting at offset {}", from.saturating_sub(2)))
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Field(Vec<String>),
    Var(String, Vec<String>),
    Ident(String),
    Str(String),
    Num(String),
    LParen,
    RParen,
    /// Fields after a `)`: `(…).A.B`.
    Chain(Vec<String>),
    Pipe,
    Declare,
    Assign,
    Comma,
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn lex_action(s: &str, at: usize) -> Result<Vec<Tok>> {
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    let fields = |i: &mut usize| -> Vec<String> {
        let mut out = Vec::new();
        while *i < chars.len() && chars[*i].1 == '.' {
            *i += 1;
            let start = *i;
            while *i < chars.len() && is_ident_char(chars[*i].1) {
                *i += 1;
            }
            let name: String = chars[start..*i].iter().map(|c| c.1).collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
        out
    };
    while i < chars.len() {
        let (off, c) = chars[i];
        match c {
            ' ' | '\t' | '\n' | '\r' => i += 1,
            '(' => {
                toks.push(Tok::LParen);
                i += 1;
            }
            ')' => {
                toks.push(Tok::RParen);
                i += 1;
                if i < chars.len() && chars[i].1 == '.' {
                    toks.push(Tok::Chain(fields(&mut i)));
                }
            }
            '|' => {
                toks.push(Tok::Pipe);
                i += 1;
            }
            ',' => {
                toks.push(Tok::Comma);
                i += 1;
            }
            ':' if chars.get(i + 1).map(|c| c.1) == Some('=') => {
                toks.push(Tok::Declare);
                i += 2;
            }
            '=' => {
                toks.push(Tok::Assign);
                i += 1;
            }
            '.' => toks.push(Tok::Field(fields(&mut i))),
            '$' => {
                i += 1;
                let start = i;
                while i < chars.len() && is_ident_char(chars[i].1) {
                    i += 1;
                }
                let name: String = chars[start..i].iter().map(|c| c.1).collect();
                toks.push(Tok::Var(name, fields(&mut i)));
            }
            '"' => {
                let mut out = String::new();
                i += 1;
                loop {
                    let Some(&(_, c)) = chars.get(i) else {
                        return err(format!("unterminated quoted string at offset {}", at + off));
                    };
                    i += 1;
                    match c {
                        '"' => break,
                        '\\' => {
                            let Some(&(_, e)) = chars.get(i) else {
                                return err(format!("unterminated quoted string at offset {}", at + off));
                            };
                            i += 1;
                            match e {
                                'n' => out.push('\n'),
                                't' => out.push('\t'),
                                'r' => out.push('\r'),
                                '\\' => out.push('\\'),
                                '"' => out.push('"'),
                                '\'' => out.push('\''),
                                _ => return err(format!("unknown escape sequence \\{e} at offset {}", at + off)),
                            }
                        }
                        c => out.push(c),
                    }
                }
                toks.push(Tok::Str(out));
            }
            '`' => {
                let start = i + 1;
                i += 1;
                while i < chars.len() && chars[i].1 != '`' {
                    i += 1;
                }
                if i >= chars.len() {
                    return err(format!("unterminated raw quoted string at offset {}", at + off));
                }
                toks.push(Tok::Str(chars[start..i].iter().map(|c| c.1).collect()));
                i += 1;
            }
            c if c.is_ascii_digit()
                || ((c == '-' || c == '+') && chars.get(i + 1).is_some_and(|c| c.1.is_ascii_digit())) =>
            {
                let start = i;
                i += 1;
                while i < chars.len()
                    && (chars[i].1.is_ascii_alphanumeric() || matches!(chars[i].1, '.' | '_' | '+' | '-'))
                {
                    // A sign only right after an exponent mark.
                    if matches!(chars[i].1, '+' | '-') && !matches!(chars[i - 1].1, 'e' | 'E') {
                        break;
                    }
                    i += 1;
                }
                toks.push(Tok::Num(chars[start..i].iter().map(|c| c.1).collect()));
            }
            c if c.is_alphabetic() || c == '_' => {
                let start = i;
                while i < chars.len() && is_ident_char(chars[i].1) {
                    i += 1;
                }
                toks.push(Tok::Ident(chars[start..i].iter().map(|c| c.1).collect()));
            }
            c => return err(format!("unexpected {c:?} in action at offset {}", at + off)),
        }
    }
    Ok(toks)
}

struct ActionParser {
    toks: Vec<Tok>,
    i: usize,
    at: usize,
}

impl ActionParser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i)
    }

    fn pipeline(&mut self, in_parens: bool) -> Result<Pipeline> {
        let mut vars = Vec::new();
        let mut assign = false;
        // `$x :=`, `$i, $v :=`, `$x =`.
        let mut j = self.i;
        let mut names = Vec::new();
        while let Some(Tok::Var(name, f)) = self.toks.get(j) {
            if !f.is_empty() {
                break;
            }
            names.push(format!("${name}"));
            match self.toks.get(j + 1) {
                Some(Tok::Comma) => j += 2,
                Some(Tok::Declare) | Some(Tok::Assign) => {
                    assign = self.toks[j + 1] == Tok::Assign;
                    vars = std::mem::take(&mut names);
                    self.i = j + 2;
                    break;
                }
                _ => break,
            }
        }
        let mut cmds = Vec::new();
        loop {
            let mut args = Vec::new();
            while let Some(t) = self.peek().cloned() {
                match t {
                    Tok::Pipe | Tok::RParen => break,
                    _ => {
                        self.i += 1;
                        args.push(self.operand(t)?);
                    }
                }
            }
            if args.is_empty() {
                return err(format!("missing value for command at offset {}", self.at));
            }
            cmds.push(Command { args });
            match self.peek() {
                Some(Tok::Pipe) => self.i += 1,
                Some(Tok::RParen) if in_parens => break,
                Some(Tok::RParen) => return err(format!("unexpected \")\" at offset {}", self.at)),
                _ => break,
            }
        }
        Ok(Pipeline { vars, assign, cmds })
    }

    fn operand(&mut self, t: Tok) -> Result<Arg> {
        Ok(match t {
            Tok::Field(f) => Arg::Field(f),
            Tok::Var(v, f) => Arg::Var(v, f),
            Tok::Str(s) => Arg::Str(s),
            Tok::Num(n) => parse_number(&n).ok_or_else(|| TemplateError(format!("bad number syntax: {n:?}")))?,
            Tok::Ident(id) => match id.as_str() {
                "true" => Arg::Bool(true),
                "false" => Arg::Bool(false),
                "nil" => Arg::Nil,
                _ if function_known(&id) => Arg::Func(id),
                _ => return err(format!("function {id:?} not defined")),
            },
            Tok::LParen => {
                let p = self.pipeline(true)?;
                if self.peek() != Some(&Tok::RParen) {
                    return err(format!("unclosed left paren in action at offset {}", self.at));
                }
                self.i += 1;
                let chain = match self.peek() {
                    Some(Tok::Chain(f)) => {
                        let f = f.clone();
                        self.i += 1;
                        f
                    }
                    _ => Vec::new(),
                };
                Arg::Sub(Box::new(p), chain)
            }
            other => return err(format!("unexpected {other:?} in operand at offset {}", self.at)),
        })
    }
}

fn parse_number(n: &str) -> Option<Arg> {
    let clean = n.replace('_', "");
    if let Some(hex) = clean.strip_prefix("0x").or_else(|| clean.strip_prefix("0X")) {
        return i64::from_str_radix(hex, 16).ok().map(Arg::Int);
    }
    if let Ok(i) = clean.parse::<i64>() {
        return Some(Arg::Int(i));
    }
    clean.parse::<f64>().ok().map(Arg::Float)
}

/// What ended a list of nodes.
enum Closer {
    Eof,
    End,
    Else(Option<Pipeline>),
}

impl Template {
    /// Parses `src`; errors name what is wrong and where.
    pub fn parse(src: &str) -> Result<Template> {
        let pieces = split(src)?;
        let mut it = pieces.into_iter().peekable();
        let (nodes, end) = parse_nodes(&mut it)?;
        match end {
            Closer::Eof => Ok(Template { nodes }),
            Closer::End => err("unexpected {{end}}"),
            Closer::Else(_) => err("unexpected {{else}}"),
        }
    }

    /// Expands the template over `data` (the `.` of the text, also `$`), with `vars` declared
    /// ahead of it.
    pub fn execute(&self, data: TValue, vars: &[(&str, TValue)], funcs: &Context<'_>) -> Result<String> {
        let mut ex = Exec { vars: Vec::new(), ctx: funcs, out: String::new(), steps: 0 };
        ex.vars.push(("$".to_owned(), data.clone()));
        for (k, v) in vars {
            ex.vars.push((format!("${k}"), v.clone()));
        }
        ex.nodes(&self.nodes, &data)?;
        Ok(ex.out)
    }
}

fn parse_nodes<'a>(it: &mut std::iter::Peekable<std::vec::IntoIter<Piece<'a>>>) -> Result<(Vec<Node>, Closer)> {
    let mut nodes = Vec::new();
    while let Some(p) = it.next() {
        let (src, at) = match p {
            Piece::Text(t) => {
                if !t.is_empty() {
                    nodes.push(Node::Text(t.to_owned()));
                }
                continue;
            }
            Piece::Action(s, at) => (s, at),
        };
        let trimmed = src.trim();
        if trimmed.starts_with("/*") {
            continue;
        }
        let toks = lex_action(src, at)?;
        let keyword = match toks.first() {
            Some(Tok::Ident(k)) => k.as_str(),
            None => return err(format!("missing value for command at offset {at}")),
            _ => "",
        };
        let mut rest = ActionParser { toks: toks[1.min(toks.len())..].to_vec(), i: 0, at };
        let whole = |toks: Vec<Tok>| ActionParser { toks, i: 0, at };
        match keyword {
            "end" => return Ok((nodes, Closer::End)),
            "else" => {
                if rest.toks.is_empty() {
                    return Ok((nodes, Closer::Else(None)));
                }
                // `else if …` / `else with …`
                match rest.toks.first() {
                    Some(Tok::Ident(k)) if k == "if" || k == "with" => {
                        let mut p = ActionParser { toks: rest.toks[1..].to_vec(), i: 0, at };
                        let pipe = p.pipeline(false)?;
                        return Ok((nodes, Closer::Else(Some(pipe))));
                    }
                    _ => return err(format!("unexpected tokens after else at offset {at}")),
                }
            }
            "if" | "with" | "range" => {
                let pipe = rest.pipeline(false)?;
                if rest.i < rest.toks.len() {
                    return err(format!("unexpected tokens in {keyword} at offset {at}"));
                }
                let (body, end) = parse_nodes(it)?;
                match keyword {
                    "if" => {
                        let mut branches = vec![(pipe, body)];
                        let mut end = end;
                        let otherwise = loop {
                            match end {
                                Closer::End => break Vec::new(),
                                Closer::Eof => {
                                    return err(format!("unexpected EOF: {{{{if}}}} at offset {at} has no {{{{end}}}}"))
                                }
                                Closer::Else(Some(p)) => {
                                    let (b, e) = parse_nodes(it)?;
                                    branches.push((p, b));
                                    end = e;
                                }
                                Closer::Else(None) => {
                                    let (b, e) = parse_nodes(it)?;
                                    if !matches!(e, Closer::End) {
                                        return err(format!("{{{{if}}}} at offset {at} has no {{{{end}}}}"));
                                    }
                                    break b;
                                }
                            }
                        };
                        nodes.push(Node::If { branches, otherwise });
                    }
                    _ => {
                        let otherwise = match end {
                            Closer::End => Vec::new(),
                            Closer::Eof => {
                                return err(format!(
                                    "unexpected EOF: {{{{{keyword}}}}} at offset {at} has no {{{{end}}}}"
                                ))
                            }
                            Closer::Else(Some(_)) if keyword == "range" => {
                                return err(format!("else if inside range at offset {at}"))
                            }
                            Closer::Else(Some(p)) => {
                                // `with … else with …` reads as a nested with.
                                let (b, e) = parse_nodes(it)?;
                                if !matches!(e, Closer::End | Closer::Else(None)) {
                                    return err(format!("{{{{with}}}} at offset {at} has no {{{{end}}}}"));
                                }
                                vec![Node::With { pipe: p, body: b, otherwise: Vec::new() }]
                            }
                            Closer::Else(None) => {
                                let (b, e) = parse_nodes(it)?;
                                if !matches!(e, Closer::End) {
                                    return err(format!("{{{{{keyword}}}}} at offset {at} has no {{{{end}}}}"));
                                }
                                b
                            }
                        };
                        if keyword == "range" {
                            if pipe.vars.len() > 2 {
                                return err(format!("too many declarations in range at offset {at}"));
                            }
                            nodes.push(Node::Range { pipe, body, otherwise });
                        } else {
                            nodes.push(Node::With { pipe, body, otherwise });
                        }
                    }
                }
            }
            "define" | "template" | "block" | "break" | "continue" => {
                return err(format!("{{{{{keyword}}}}} is not supported in Strata's templates (offset {at})"))
            }
            _ => {
                let mut p = whole(toks);
                let pipe = p.pipeline(false)?;
                if p.i < p.toks.len() {
                    return err(format!("unexpected {:?} in action at offset {at}", p.toks[p.i]));
                }
                nodes.push(Node::Action(pipe));
            }
        }
    }
    Ok((nodes, Closer::Eof))
}

// ---------------------------------------------------------------------------------------------
// Execution

/// Runs a PromQL query for `query "…"`.
pub type QueryFn<'a> = dyn Fn(&str) -> std::result::Result<Vec<QuerySample>, String> + 'a;

/// What a template's functions may reach: the `query` function's evaluation, the external URL.
pub struct Context<'a> {
    /// Runs a PromQL query at the rule's evaluation time (`query "…"`).
    pub query: Option<&'a QueryFn<'a>>,
    pub external_url: &'a str,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("external_url", &self.external_url).finish_non_exhaustive()
    }
}

/// Bound on the work one expansion may do (loop iterations and actions), so that a template
/// cannot hold a rule evaluation forever.
const MAX_STEPS: usize = 1_000_000;
/// Bound on one expansion's output.
const MAX_OUTPUT_BYTES: usize = 1 << 20;

struct Exec<'a, 'c> {
    vars: Vec<(String, TValue)>,
    ctx: &'a Context<'c>,
    out: String,
    steps: usize,
}

impl Exec<'_, '_> {
    fn step(&mut self) -> Result<()> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return err(format!("template expansion took more than {MAX_STEPS} steps"));
        }
        if self.out.len() > MAX_OUTPUT_BYTES {
            return err(format!("template expansion wrote more than {MAX_OUTPUT_BYTES} bytes"));
        }
        Ok(())
    }

    fn nodes(&mut self, nodes: &[Node], dot: &TValue) -> Result<()> {
        for n in nodes {
            self.step()?;
            match n {
                Node::Text(t) => self.out.push_str(t),
                Node::Action(p) => {
                    let v = self.pipeline(p, dot)?;
                    if p.vars.is_empty() {
                        v.print(&mut self.out);
                    }
                }
                Node::If { branches, otherwise } => {
                    let mark = self.vars.len();
                    let mut taken = false;
                    for (cond, body) in branches {
                        if self.pipeline(cond, dot)?.truth() {
                            self.nodes(body, dot)?;
                            taken = true;
                            break;
                        }
                    }
                    if !taken {
                        self.nodes(otherwise, dot)?;
                    }
                    self.vars.truncate(mark);
                }
                Node::With { pipe, body, otherwise } => {
                    let mark = self.vars.len();
                    let v = self.pipeline(pipe, dot)?;
                    if v.truth() {
                        self.nodes(body, &v)?;
                    } else {
                        self.nodes(otherwise, dot)?;
                    }
                    self.vars.truncate(mark);
                }
                Node::Range { pipe, body, otherwise } => {
                    let mark = self.vars.len();
                    let bare = Pipeline { vars: Vec::new(), assign: false, cmds: pipe.cmds.clone() };
                    let v = self.pipeline(&bare, dot)?;
                    let items: Vec<(TValue, TValue)> = match &v {
                        TValue::Samples(s) => s
                            .iter()
                            .enumerate()
                            .map(|(i, s)| (TValue::Int(i as i64), TValue::Sample(Arc::new(s.clone()))))
                            .collect(),
                        TValue::List(l) => {
                            l.iter().enumerate().map(|(i, v)| (TValue::Int(i as i64), v.clone())).collect()
                        }
                        TValue::Map(m) => {
                            m.iter().map(|(k, v)| (TValue::Str(k.clone()), TValue::Str(v.clone()))).collect()
                        }
                        TValue::Nil => Vec::new(),
                        other => return err(format!("range can't iterate over {}", other.to_text())),
                    };
                    if items.is_empty() {
                        self.nodes(otherwise, dot)?;
                    }
                    for (k, item) in items {
                        let inner = self.vars.len();
                        match pipe.vars.as_slice() {
                            [] => {}
                            [v] => self.vars.push((v.clone(), item.clone())),
                            [k_name, v_name] => {
                                self.vars.push((k_name.clone(), k));
                                self.vars.push((v_name.clone(), item.clone()));
                            }
                            _ => unreachable!("checked at parse"),
                        }
                        self.nodes(body, &item)?;
                        self.vars.truncate(inner);
                    }
                    self.vars.truncate(mark);
                }
            }
        }
        Ok(())
    }

    fn pipeline(&mut self, p: &Pipeline, dot: &TValue) -> Result<TValue> {
        let mut last: Option<TValue> = None;
        for c in &p.cmds {
            last = Some(self.command(c, dot, last)?);
        }
        let v = last.unwrap_or(TValue::Nil);
        for name in &p.vars {
            if p.assign {
                match self.vars.iter_mut().rev().find(|(n, _)| n == name) {
                    Some(slot) => slot.1 = v.clone(),
                    None => return err(format!("undefined variable: {name}")),
                }
            } else {
                self.vars.push((name.clone(), v.clone()));
            }
        }
        Ok(v)
    }

    fn command(&mut self, c: &Command, dot: &TValue, piped: Option<TValue>) -> Result<TValue> {
        self.step()?;
        match &c.args[0] {
            Arg::Func(name) => {
                let mut args = Vec::with_capacity(c.args.len());
                for a in &c.args[1..] {
                    args.push(self.arg(a, dot)?);
                }
                if let Some(p) = piped {
                    args.push(p);
                }
                // `and` and `or` stop at the first deciding argument, as Go's do (their
                // arguments are evaluated above: the difference shows only with side effects,
                // which no function here has).
                self.call(name, args)
            }
            first => {
                if c.args.len() > 1 || piped.is_some() {
                    return err(format!("can't give argument to non-function {first:?}"));
                }
                self.arg(first, dot)
            }
        }
    }

    fn arg(&mut self, a: &Arg, dot: &TValue) -> Result<TValue> {
        match a {
            Arg::Field(f) => fields(dot.clone(), f),
            Arg::Var(name, f) => {
                let key = format!("${name}");
                let Some((_, v)) = self.vars.iter().rev().find(|(n, _)| *n == key) else {
                    return err(format!("undefined variable: {key}"));
                };
                fields(v.clone(), f)
            }
            Arg::Func(name) => self.call(name, Vec::new()),
            Arg::Str(s) => Ok(TValue::Str(s.clone())),
            Arg::Int(i) => Ok(TValue::Int(*i)),
            Arg::Float(f) => Ok(TValue::Float(*f)),
            Arg::Bool(b) => Ok(TValue::Bool(*b)),
            Arg::Nil => Ok(TValue::Nil),
            Arg::Sub(p, f) => {
                let v = self.pipeline(p, dot)?;
                fields(v, f)
            }
        }
    }

    fn call(&mut self, name: &str, args: Vec<TValue>) -> Result<TValue> {
        let want = |n: usize| -> Result<()> {
            if args.len() != n {
                return err(format!("wrong number of args for {name}: want {n} got {}", args.len()));
            }
            Ok(())
        };
        let text = |i: usize| -> Result<String> {
            match &args[i] {
                TValue::Str(s) => Ok(s.clone()),
                other => err(format!("{name}: argument {} is {}, not a string", i + 1, other.type_name())),
            }
        };
        Ok(match name {
            "and" => {
                if args.is_empty() {
                    return err("wrong number of args for and: want at least 1 got 0");
                }
                args.iter().find(|v| !v.truth()).unwrap_or(args.last().expect("not empty")).clone()
            }
            "or" => {
                if args.is_empty() {
                    return err("wrong number of args for or: want at least 1 got 0");
                }
                args.iter().find(|v| v.truth()).unwrap_or(args.last().expect("not empty")).clone()
            }
            "not" => {
                want(1)?;
                TValue::Bool(!args[0].truth())
            }
            "len" => {
                want(1)?;
                TValue::Int(match &args[0] {
                    TValue::Str(s) => s.len(),
                    TValue::Map(m) => m.len(),
                    TValue::Samples(s) => s.len(),
                    TValue::List(l) => l.len(),
                    other => return err(format!("len of type {}", other.type_name())),
                } as i64)
            }
            "index" => {
                if args.is_empty() {
                    return err("wrong number of args for index: want at least 1 got 0");
                }
                let mut v = args[0].clone();
                for k in &args[1..] {
                    v = match (&v, k) {
                        (TValue::Map(m), TValue::Str(k)) => TValue::Str(m.get(k).cloned().unwrap_or_default()),
                        (TValue::Samples(s), TValue::Int(i)) => match s.get(*i as usize) {
                            Some(s) if *i >= 0 => TValue::Sample(Arc::new(s.clone())),
                            _ => return err(format!("index out of range: {i}")),
                        },
                        (TValue::List(l), TValue::Int(i)) => match l.get(*i as usize) {
                            Some(v) if *i >= 0 => v.clone(),
                            _ => return err(format!("index out of range: {i}")),
                        },
                        (v, k) => {
                            return err(format!("can't index item of type {} with {}", v.type_name(), k.type_name()))
                        }
                    };
                }
                v
            }
            "slice" => {
                if args.is_empty() {
                    return err("wrong number of args for slice: want at least 1 got 0");
                }
                let idx = |v: &TValue| match v {
                    TValue::Int(i) if *i >= 0 => Ok(*i as usize),
                    other => err(format!("cannot index slice with {}", other.to_text())),
                };
                match &args[0] {
                    TValue::Str(s) => {
                        let from = args.get(1).map(idx).transpose()?.unwrap_or(0);
                        let to = args.get(2).map(idx).transpose()?.unwrap_or(s.len());
                        match s.get(from..to) {
                            Some(sub) if from <= to => TValue::Str(sub.to_owned()),
                            _ => return err(format!("index out of range: {from}:{to}")),
                        }
                    }
                    other => return err(format!("can't slice item of type {}", other.type_name())),
                }
            }
            "print" => {
                // Go's Sprint: a space between operands when neither is a string.
                let mut out = String::new();
                for (i, a) in args.iter().enumerate() {
                    if i > 0 && !matches!(a, TValue::Str(_)) && !matches!(args[i - 1], TValue::Str(_)) {
                        out.push(' ');
                    }
                    a.print(&mut out);
                }
                TValue::Str(out)
            }
            "println" => {
                let parts: Vec<String> = args.iter().map(|a| a.to_text()).collect();
                TValue::Str(parts.join(" ") + "\n")
            }
            "printf" => {
                if args.is_empty() {
                    return err("wrong number of args for printf: want at least 1 got 0");
                }
                TValue::Str(sprintf(&text(0)?, &args[1..]))
            }
            "eq" | "ne" | "lt" | "le" | "gt" | "ge" => {
                if args.len() < 2 {
                    return err(format!("wrong number of args for {name}: want 2 got {}", args.len()));
                }
                if name == "eq" {
                    // Go's eq takes several: true if the first equals any other.
                    let mut any = false;
                    for b in &args[1..] {
                        any |= compare(&args[0], b)? == Some(std::cmp::Ordering::Equal);
                    }
                    return Ok(TValue::Bool(any));
                }
                want(2)?;
                let Some(ord) = compare(&args[0], &args[1])? else {
                    return err(format!("incompatible types for comparison in {name}"));
                };
                use std::cmp::Ordering::*;
                TValue::Bool(match name {
                    "ne" => ord != Equal,
                    "lt" => ord == Less,
                    "le" => ord != Greater,
                    "gt" => ord == Greater,
                    _ => ord != Less,
                })
            }
            "html" | "safeHtml" => {
                want(1)?;
                let s = args[0].to_text();
                if name == "safeHtml" {
                    TValue::Str(s)
                } else {
                    TValue::Str(html_escape(&s))
                }
            }
            "js" => {
                want(1)?;
                TValue::Str(js_escape(&args[0].to_text()))
            }
            "urlquery" => {
                let joined: String = args.iter().map(|a| a.to_text()).collect();
                TValue::Str(form_urlencoded::byte_serialize(joined.as_bytes()).collect())
            }
            "query" => {
                want(1)?;
                let q = text(0)?;
                let Some(run) = self.ctx.query else {
                    return err("query is not available here");
                };
                TValue::Samples(Arc::new(run(&q).map_err(|e| TemplateError(format!("error executing query: {e}")))?))
            }
            "first" => {
                want(1)?;
                match &args[0] {
                    TValue::Samples(s) => match s.first() {
                        Some(s) => TValue::Sample(Arc::new(s.clone())),
                        None => return err("first() called on vector with no elements"),
                    },
                    other => return err(format!("first: argument is {}, not a query result", other.type_name())),
                }
            }
            "label" => {
                want(2)?;
                let l = text(0)?;
                match &args[1] {
                    TValue::Sample(s) => TValue::Str(s.labels.get(&l).cloned().unwrap_or_default()),
                    other => return err(format!("label: argument 2 is {}, not a sample", other.type_name())),
                }
            }
            "value" => {
                want(1)?;
                match &args[0] {
                    TValue::Sample(s) => TValue::Float(s.value),
                    other => return err(format!("value: argument is {}, not a sample", other.type_name())),
                }
            }
            "strvalue" => {
                want(1)?;
                match &args[0] {
                    TValue::Sample(s) => TValue::Str(s.labels.get("__value__").cloned().unwrap_or_default()),
                    other => return err(format!("strvalue: argument is {}, not a sample", other.type_name())),
                }
            }
            "sortByLabel" => {
                want(2)?;
                let l = text(0)?;
                match &args[1] {
                    TValue::Samples(s) => {
                        let mut v = (**s).clone();
                        v.sort_by(|a, b| a.labels.get(&l).cmp(&b.labels.get(&l)));
                        TValue::Samples(Arc::new(v))
                    }
                    other => {
                        return err(format!("sortByLabel: argument 2 is {}, not a query result", other.type_name()))
                    }
                }
            }
            "args" => TValue::Struct(Arc::new(
                args.into_iter().enumerate().map(|(i, v)| (ARG_NAMES.get(i).copied().unwrap_or("argN"), v)).collect(),
            )),
            "reReplaceAll" => {
                want(3)?;
                // Unanchored, as Go's `ReplaceAllString`; Go's `$1`/`${name}` replacement syntax
                // is Rust's too (both read `$1x` as the group named `1x`).
                let re = regex::Regex::new(&text(0)?).map_err(|e| TemplateError(e.to_string()))?;
                TValue::Str(re.replace_all(&text(2)?, text(1)?.as_str()).into_owned())
            }
            "match" => {
                want(2)?;
                let re = regex::Regex::new(&text(0)?).map_err(|e| TemplateError(e.to_string()))?;
                TValue::Bool(re.is_match(&text(1)?))
            }
            "title" => {
                want(1)?;
                TValue::Str(title(&text(0)?))
            }
            "toUpper" => {
                want(1)?;
                TValue::Str(text(0)?.to_uppercase())
            }
            "toLower" => {
                want(1)?;
                TValue::Str(text(0)?.to_lowercase())
            }
            "stripPort" => {
                want(1)?;
                TValue::Str(strip_port(&text(0)?))
            }
            "stripDomain" => {
                want(1)?;
                TValue::Str(strip_domain(&text(0)?))
            }
            "graphLink" | "tableLink" => {
                want(1)?;
                let q: String = form_urlencoded::byte_serialize(text(0)?.as_bytes()).collect();
                let tab = if name == "graphLink" { 0 } else { 1 };
                TValue::Str(format!("/graph?g0.expr={q}&g0.tab={tab}"))
            }
            "externalURL" => TValue::Str(self.ctx.external_url.to_owned()),
            "pathPrefix" => {
                let path = self.ctx.external_url.split_once("://").map(|(_, r)| r).unwrap_or(self.ctx.external_url);
                TValue::Str(path.find('/').map(|i| path[i..].trim_end_matches('/').to_owned()).unwrap_or_default())
            }
            "humanize" => {
                want(1)?;
                TValue::Str(humanize(args[0].to_float()?))
            }
            "humanize1024" => {
                want(1)?;
                TValue::Str(humanize1024(args[0].to_float()?))
            }
            "humanizeDuration" => {
                want(1)?;
                TValue::Str(humanize_duration(args[0].to_float()?))
            }
            "humanizePercentage" => {
                want(1)?;
                TValue::Str(format!("{}%", go_g(args[0].to_float()? * 100.0, 4)))
            }
            "humanizeTimestamp" => {
                want(1)?;
                let v = args[0].to_float()?;
                if !v.is_finite() {
                    TValue::Str(go_g(v, 4))
                } else {
                    TValue::Str(go_time(v))
                }
            }
            "toTime" => {
                want(1)?;
                let v = args[0].to_float()?;
                if !v.is_finite() {
                    return err(format!("cannot convert {} to time.Time", go_float(v)));
                }
                TValue::Str(go_time(v))
            }
            "parseDuration" => {
                want(1)?;
                let ms = strata_model::parse_duration_ms(&text(0)?).map_err(TemplateError)?;
                TValue::Float(ms as f64 / 1000.0)
            }
            _ => return err(format!("function {name:?} not defined")),
        })
    }
}

const ARG_NAMES: [&str; 10] = ["arg0", "arg1", "arg2", "arg3", "arg4", "arg5", "arg6", "arg7", "arg8", "arg9"];

fn function_known(name: &str) -> bool {
    const KNOWN: &[&str] = &[
        "and",
        "or",
        "not",
        "len",
        "index",
        "slice",
        "print",
        "println",
        "printf",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "html",
        "safeHtml",
        "js",
        "urlquery",
        "query",
        "first",
        "label",
        "value",
        "strvalue",
        "sortByLabel",
        "args",
        "reReplaceAll",
        "match",
        "title",
        "toUpper",
        "toLower",
        "stripPort",
        "stripDomain",
        "graphLink",
        "tableLink",
        "externalURL",
        "pathPrefix",
        "humanize",
        "humanize1024",
        "humanizeDuration",
        "humanizePercentage",
        "humanizeTimestamp",
        "toTime",
        "parseDuration",
    ];
    KNOWN.contains(&name)
}

/// Follows `.A.B` from `v`: fields of the data and of samples, keys of label maps.
fn fields(mut v: TValue, names: &[String]) -> Result<TValue> {
    for n in names {
        v = match &v {
            TValue::Map(m) => TValue::Str(m.get(n).cloned().unwrap_or_default()),
            TValue::Struct(s) => match s.get(n.as_str()) {
                Some(f) => f.clone(),
                None => return err(format!("can't evaluate field {n}")),
            },
            TValue::Sample(s) => match n.as_str() {
                "Labels" => TValue::Map(Arc::new(s.labels.clone())),
                "Value" => TValue::Float(s.value),
                _ => return err(format!("can't evaluate field {n} in type *template.sample")),
            },
            TValue::Nil => TValue::Nil,
            other => return err(format!("can't evaluate field {n} in type {}", other.type_name())),
        };
    }
    Ok(v)
}

fn compare(a: &TValue, b: &TValue) -> Result<Option<std::cmp::Ordering>> {
    Ok(match (a, b) {
        (TValue::Int(x), TValue::Int(y)) => Some(x.cmp(y)),
        (TValue::Float(x), TValue::Float(y)) => x.partial_cmp(y),
        (TValue::Int(x), TValue::Float(y)) => (*x as f64).partial_cmp(y),
        (TValue::Float(x), TValue::Int(y)) => x.partial_cmp(&(*y as f64)),
        (TValue::Str(x), TValue::Str(y)) => Some(x.cmp(y)),
        (TValue::Bool(x), TValue::Bool(y)) => Some(x.cmp(y)),
        (TValue::Nil, TValue::Nil) => Some(std::cmp::Ordering::Equal),
        (x, y) => return err(format!("incompatible types for comparison: {} and {}", x.type_name(), y.type_name())),
    })
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '\0' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn js_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '"' => out.push_str("\\\""),
            '<' => out.push_str("\\u003C"),
            '>' => out.push_str("\\u003E"),
            '&' => out.push_str("\\u0026"),
            '=' => out.push_str("\\u003D"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Go's `strings.Title` as Prometheus uses it: the first letter of each word upper-cased.
fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_letter = false;
    for c in s.chars() {
        if !prev_letter && c.is_alphabetic() {
            out.extend(c.to_uppercase());
        } else {
            out.push(c);
        }
        prev_letter = c.is_alphanumeric() || c == '_' || c == '\'';
    }
    out
}

fn strip_port(s: &str) -> String {
    if let Some(rest) = s.strip_prefix('[') {
        if let Some(end) = rest.find(']') {
            return rest[..end].to_owned();
        }
    }
    match s.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.chars().all(|c| c.is_ascii_digit()) => host.to_owned(),
        _ => s.to_owned(),
    }
}

fn strip_domain(s: &str) -> String {
    if s.parse::<std::net::IpAddr>().is_ok() || s.starts_with('[') {
        return s.to_owned();
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (s, None),
    };
    if host.parse::<std::net::IpAddr>().is_ok() {
        return s.to_owned();
    }
    let short = host.split('.').next().unwrap_or(host);
    match port {
        Some(p) => format!("{short}:{p}"),
        None => short.to_owned(),
    }
}

/// Go's `%.{prec}g`: `prec` significant digits, trailing zeros dropped, exponent form when the
/// exponent is below -4 or at least `prec`.
pub fn go_g(v: f64, prec: usize) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let p = prec.max(1);
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{:.*e}", p - 1, v);
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent");
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s.to_owned()
        }
    };
    if exp < -4 || exp >= p as i32 {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{:.*}", (p as i32 - 1 - exp).max(0) as usize, v))
    }
}

/// Prometheus' `humanize`: SI prefixes, four significant digits.
pub fn humanize(mut v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return go_g(v, 4);
    }
    if v.abs() >= 1.0 {
        let mut prefix = "";
        for p in ["k", "M", "G", "T", "P", "E", "Z", "Y"] {
            if v.abs() < 1000.0 {
                break;
            }
            prefix = p;
            v /= 1000.0;
        }
        return format!("{}{prefix}", go_g(v, 4));
    }
    let (v, prefix) = small_si(v);
    format!("{}{prefix}", go_g(v, 4))
}

/// `v` (below 1 in magnitude) scaled up by thousands, with the SI prefix that undoes it.
fn small_si(mut v: f64) -> (f64, &'static str) {
    let mut prefix = "";
    for p in ["m", "u", "n", "p", "f", "a", "z", "y"] {
        if v.abs() >= 1.0 {
            break;
        }
        prefix = p;
        v *= 1000.0;
    }
    (v, prefix)
}

/// Prometheus' `humanize1024`: binary prefixes.
pub fn humanize1024(mut v: f64) -> String {
    if v.abs() <= 1.0 || !v.is_finite() {
        return go_g(v, 4);
    }
    let mut prefix = "";
    for p in ["ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"] {
        if v.abs() < 1024.0 {
            break;
        }
        prefix = p;
        v /= 1024.0;
    }
    format!("{}{prefix}", go_g(v, 4))
}

/// Prometheus' `humanizeDuration`: `1d 2h 3m 4s` from seconds, SI prefixes below a second.
pub fn humanize_duration(mut v: f64) -> String {
    if !v.is_finite() {
        return go_g(v, 4);
    }
    if v == 0.0 {
        return format!("{}s", go_g(v, 4));
    }
    if v.abs() >= 1.0 {
        let sign = if v < 0.0 { "-" } else { "" };
        v = v.abs();
        let d = v as i64;
        let (secs, mins, hours, days) = (d % 60, (d / 60) % 60, (d / 3600) % 24, d / 86_400);
        if days != 0 {
            return format!("{sign}{days}d {hours}h {mins}m {secs}s");
        }
        if hours != 0 {
            return format!("{sign}{hours}h {mins}m {secs}s");
        }
        if mins != 0 {
            return format!("{sign}{mins}m {secs}s");
        }
        return format!("{sign}{}s", go_g(v, 4));
    }
    let (v, prefix) = small_si(v);
    format!("{}{prefix}s", go_g(v, 4))
}

/// Go's `time.Time.String()` in UTC for a Unix time in seconds, at millisecond precision as
/// Prometheus converts it (`model.TimeFromUnixNano`): `2006-01-02 15:04:05.999 +0000 UTC`.
fn go_time(v: f64) -> String {
    // Go: int64(v * 1e9) truncates, then integer division to milliseconds truncates too.
    let ms = ((v * 1e9) as i64) / 1_000_000;
    let (secs, nanos) = (ms.div_euclid(1000), ms.rem_euclid(1000) * 1_000_000);
    let (y, m, d) = strata_model::civil::civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    let mut out = format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
    if nanos > 0 {
        out.push('.');
        out.push_str(format!("{nanos:09}").trim_end_matches('0'));
    }
    out.push_str(" +0000 UTC");
    out
}

/// The largest width or precision `printf` takes.
const MAX_WIDTH: usize = 4096;

/// Go's `fmt.Sprintf` for the verbs templates use: `%v %s %d %f %e %g %q %x %X %t %%`, with
/// flags `-+ 0#`, width and precision. A verb that does not fit its operand prints as Go
/// prints it (`%!d(string=x)`).
pub fn sprintf(format: &str, args: &[TValue]) -> String {
    let mut out = String::new();
    let mut it = format.chars().peekable();
    let mut next = 0;
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let (mut minus, mut plus, mut zero, mut space) = (false, false, false, false);
        while let Some(&f) = it.peek() {
            match f {
                '-' => minus = true,
                '+' => plus = true,
                '0' => zero = true,
                ' ' => space = true,
                '#' => {}
                _ => break,
            }
            it.next();
        }
        // Widths and precisions are capped: `%0999999999d` must not take a gigabyte.
        let mut width = None;
        while let Some(d) = it.peek().and_then(|c| c.to_digit(10)) {
            width = Some((width.unwrap_or(0) * 10 + d as usize).min(MAX_WIDTH));
            it.next();
        }
        let mut prec = None;
        if it.peek() == Some(&'.') {
            it.next();
            let mut p = 0;
            while let Some(d) = it.peek().and_then(|c| c.to_digit(10)) {
                p = (p * 10 + d as usize).min(MAX_WIDTH);
                it.next();
            }
            prec = Some(p);
        }
        let Some(verb) = it.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.get(next) else {
            let _ = write!(out, "%!{verb}(MISSING)");
            continue;
        };
        next += 1;
        let num_sign = |s: String, negative: bool| -> String {
            if negative || s.starts_with('-') {
                s
            } else if plus {
                format!("+{s}")
            } else if space {
                format!(" {s}")
            } else {
                s
            }
        };
        let bad = || format!("%!{verb}({}={})", arg.type_name(), arg.to_text());
        let body = match (verb, arg) {
            ('v', TValue::Float(f)) => num_sign(go_float(*f), false),
            ('v' | 's', _) => {
                let s = arg.to_text();
                match (verb, prec) {
                    ('s', Some(p)) => s.chars().take(p).collect(),
                    _ => s,
                }
            }
            ('q', TValue::Str(s)) => format!("{s:?}"),
            ('t', TValue::Bool(b)) => b.to_string(),
            ('d', TValue::Int(i)) => num_sign(i.to_string(), false),
            ('x', TValue::Int(i)) => format!("{i:x}"),
            ('X', TValue::Int(i)) => format!("{i:X}"),
            ('x', TValue::Str(s)) => s.bytes().map(|b| format!("{b:02x}")).collect(),
            ('f' | 'F', TValue::Float(_) | TValue::Int(_)) => {
                let f = arg.to_float().unwrap_or(f64::NAN);
                if f.is_finite() {
                    num_sign(format!("{:.*}", prec.unwrap_or(6), f), false)
                } else {
                    num_sign(go_float(f), false)
                }
            }
            ('e' | 'E', TValue::Float(_) | TValue::Int(_)) => {
                let f = arg.to_float().unwrap_or(f64::NAN);
                let s = if f.is_finite() {
                    let sci = format!("{:.*e}", prec.unwrap_or(6), f);
                    let (m, e) = sci.split_once('e').expect("exponent");
                    let e: i32 = e.parse().expect("exponent");
                    format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
                } else {
                    go_float(f)
                };
                num_sign(if verb == 'E' { s.to_uppercase() } else { s }, false)
            }
            ('g' | 'G', TValue::Float(_) | TValue::Int(_)) => {
                let f = arg.to_float().unwrap_or(f64::NAN);
                let s = match prec {
                    Some(p) => go_g(f, p),
                    None => go_float(f),
                };
                num_sign(if verb == 'G' { s.to_uppercase() } else { s }, false)
            }
            _ => bad(),
        };
        let len = body.chars().count();
        match width {
            Some(w) if w > len => {
                let pad = w - len;
                if minus {
                    out.push_str(&body);
                    out.extend(std::iter::repeat_n(' ', pad));
                } else if zero && !matches!(arg, TValue::Str(_)) {
                    let (sign, digits) = match body.strip_prefix(['-', '+']) {
                        Some(d) => (&body[..1], d),
                        None => ("", body.as_str()),
                    };
                    out.push_str(sign);
                    out.extend(std::iter::repeat_n('0', pad));
                    out.push_str(digits);
                } else {
                    out.extend(std::iter::repeat_n(' ', pad));
                    out.push_str(&body);
                }
            }
            _ => out.push_str(&body),
        }
    }
    if next < args.len() {
        out.push_str("%!(EXTRA ");
        let extra: Vec<String> = args[next..].iter().map(|a| format!("{}={}", a.type_name(), a.to_text())).collect();
        out.push_str(&extra.join(", "));
        out.push(')');
    }
    out
}

/// The data and variables Prometheus gives an alerting rule's templates.
pub fn alert_data(
    labels: &BTreeMap<String, String>,
    external_labels: &BTreeMap<String, String>,
    external_url: &str,
    value: f64,
) -> (TValue, Vec<(&'static str, TValue)>) {
    let l = TValue::Map(Arc::new(labels.clone()));
    let e = TValue::Map(Arc::new(external_labels.clone()));
    let u = TValue::Str(external_url.to_owned());
    let v = TValue::Float(value);
    let data = TValue::Struct(Arc::new(BTreeMap::from([
        ("Labels", l.clone()),
        ("ExternalLabels", e.clone()),
        ("ExternalURL", u.clone()),
        ("Value", v.clone()),
    ])));
    (data, vec![("labels", l), ("externalLabels", e), ("externalURL", u), ("value", v)])
}

#[cfg(test)]
mod tests;
