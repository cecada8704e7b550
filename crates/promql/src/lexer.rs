//! PromQL tokens. Keywords are not tokens of their own: `by`, `offset`, `and`… are identifiers
//! here and the parser decides from context, so that they stay usable as label names
//! (`{on="x"}`, `sum by (offset)`), as Prometheus allows.

use crate::error::ParseError;

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// A name without `:`: metric name, label name, function, keyword.
    Ident(String),
    /// A name containing `:` (recording rule style); only valid as a metric name.
    MetricIdent(String),
    Number(f64),
    /// A duration literal such as `5m` or `1h30m`, in milliseconds.
    Duration(i64),
    /// A string literal; bytes, since `"\xff"` is a valid Go-style literal that is not UTF-8.
    Str(Vec<u8>),
    LParen,
    RParen,
    LBrace,
    RBrace,
    LBracket,
    RBracket,
    Comma,
    Colon,
    At,
    Add,
    Sub,
    Mul,
    Div,
    Mod,
    Pow,
    EqlEql,
    Neq,
    Gtr,
    Lss,
    Gte,
    Lte,
    Assign,
    EqRegex,
    NeqRegex,
    /// `</`: keep a native histogram's buckets below a bound.
    TrimUpper,
    /// `>/`: keep a native histogram's buckets above a bound.
    TrimLower,
    Eof,
}

/// A token and the byte offset where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    pub tok: Tok,
    pub pos: usize,
}

pub fn lex(input: &str) -> Result<Vec<Token>, ParseError> {
    let b = input.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let simple = |t: Tok, n: usize| (t, n);
        let (tok, len) = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'#' => {
                // A comment runs to the end of the line.
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'(' => simple(Tok::LParen, 1),
            b')' => simple(Tok::RParen, 1),
            b'{' => simple(Tok::LBrace, 1),
            b'}' => simple(Tok::RBrace, 1),
            b'[' => simple(Tok::LBracket, 1),
            b']' => simple(Tok::RBracket, 1),
            b',' => simple(Tok::Comma, 1),
            b'@' => simple(Tok::At, 1),
            b'+' => simple(Tok::Add, 1),
            b'-' => simple(Tok::Sub, 1),
            b'*' => simple(Tok::Mul, 1),
            b'/' => simple(Tok::Div, 1),
            b'%' => simple(Tok::Mod, 1),
            b'^' => simple(Tok::Pow, 1),
            b'=' => match b.get(i + 1) {
                Some(b'=') => simple(Tok::EqlEql, 2),
                Some(b'~') => simple(Tok::EqRegex, 2),
                _ => simple(Tok::Assign, 1),
            },
            b'!' => match b.get(i + 1) {
                Some(b'=') => simple(Tok::Neq, 2),
                Some(b'~') => simple(Tok::NeqRegex, 2),
                _ => return Err(ParseError::at(i, "unexpected character after '!'")),
            },
            b'>' => match b.get(i + 1) {
                Some(b'=') => simple(Tok::Gte, 2),
                Some(b'/') => simple(Tok::TrimLower, 2),
                _ => simple(Tok::Gtr, 1),
            },
            b'<' => match b.get(i + 1) {
                Some(b'=') => simple(Tok::Lte, 2),
                Some(b'/') => simple(Tok::TrimUpper, 2),
                _ => simple(Tok::Lss, 1),
            },
            b'"' | b'\'' | b'`' => {
                let (s, n) = lex_string(input, i)?;
                (Tok::Str(s), n)
            }
            b':' if !b.get(i + 1).is_some_and(|&n| is_ident_start(n)) => simple(Tok::Colon, 1),
            c if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) => {
                lex_number_or_duration(input, i)?
            }
            c if is_ident_start(c) || c == b':' => {
                let mut j = i + 1;
                while j < b.len() && (is_ident_char(b[j]) || b[j] == b':') {
                    j += 1;
                }
                let word = &input[i..j];
                let lower = word.to_ascii_lowercase();
                let tok = if lower == "inf" {
                    Tok::Number(f64::INFINITY)
                } else if lower == "nan" {
                    Tok::Number(f64::NAN)
                } else if word.contains(':') {
                    Tok::MetricIdent(word.to_string())
                } else {
                    Tok::Ident(word.to_string())
                };
                (tok, j - i)
            }
            _ => {
                let ch = input[i..].chars().next().unwrap_or('?');
                return Err(ParseError::at(i, format!("unexpected character: {ch:?}")));
            }
        };
        out.push(Token { tok, pos: start });
        i += len;
    }
    out.push(Token { tok: Tok::Eof, pos: input.len() });
    Ok(out)
}

pub(crate) fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

pub(crate) fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

const DURATION_UNITS: &[u8] = b"smhdwy";

/// A number (`1`, `1.5`, `.5`, `1e-3`, `0x1F`) or a duration (`5m`, `1h30m`, `10ms`).
fn lex_number_or_duration(input: &str, start: usize) -> Result<(Tok, usize), ParseError> {
    let b = input.as_bytes();
    let mut j = start;
    let digits = |j: &mut usize| {
        let s = *j;
        while *j < b.len() && b[*j].is_ascii_digit() {
            *j += 1;
        }
        *j > s
    };
    // Duration: digits followed by a unit letter, repeated.
    {
        let mut k = start;
        let mut any = false;
        loop {
            let d0 = k;
            if !digits(&mut k) {
                break;
            }
            let unit_len = if b.get(k) == Some(&b'm') && b.get(k + 1) == Some(&b's') {
                2
            } else if b.get(k).is_some_and(|c| DURATION_UNITS.contains(c)) {
                1
            } else {
                k = d0;
                break;
            };
            k += unit_len;
            any = true;
        }
        if any && !b.get(k).is_some_and(|&c| is_ident_char(c) || c == b'.') {
            let text = &input[start..k];
            let ms = strata_model::parse_duration_ms(text).map_err(|e| ParseError::at(start, e))?;
            return Ok((Tok::Duration(ms), k - start));
        }
    }
    if b[j] == b'0' && matches!(b.get(j + 1), Some(b'x') | Some(b'X')) {
        j += 2;
        let s = j;
        while j < b.len() && b[j].is_ascii_hexdigit() {
            j += 1;
        }
        let v = u64::from_str_radix(&input[s..j], 16)
            .map_err(|_| ParseError::at(start, format!("bad number {:?}", &input[start..j])))?;
        return Ok((Tok::Number(v as f64), j - start));
    }
    digits(&mut j);
    if b.get(j) == Some(&b'.') {
        j += 1;
        digits(&mut j);
    }
    if matches!(b.get(j), Some(b'e') | Some(b'E')) {
        let mut k = j + 1;
        if matches!(b.get(k), Some(b'+') | Some(b'-')) {
            k += 1;
        }
        if digits(&mut k) {
            j = k;
        }
    }
    if b.get(j).is_some_and(|&c| is_ident_char(c)) {
        let mut k = j;
        while k < b.len() && is_ident_char(b[k]) {
            k += 1;
        }
        return Err(ParseError::at(start, format!("bad number or duration syntax: {:?}", &input[start..k])));
    }
    let v: f64 =
        input[start..j].parse().map_err(|_| ParseError::at(start, format!("bad number {:?}", &input[start..j])))?;
    Ok((Tok::Number(v), j - start))
}

/// A Go-style string literal: `"…"` and `'…'` with backslash escapes, `` `…` `` raw.
fn lex_string(input: &str, start: usize) -> Result<(Vec<u8>, usize), ParseError> {
    let b = input.as_bytes();
    let quote = b[start];
    let mut out = Vec::new();
    let mut j = start + 1;
    let unterminated = || ParseError::at(start, "unterminated quoted string");
    if quote == b'`' {
        while j < b.len() && b[j] != b'`' {
            out.push(b[j]);
            j += 1;
        }
        if j >= b.len() {
            return Err(unterminated());
        }
        return Ok((out, j + 1 - start));
    }
    loop {
        let Some(&c) = b.get(j) else { return Err(unterminated()) };
        if c == quote {
            return Ok((out, j + 1 - start));
        }
        if c == b'\n' {
            return Err(unterminated());
        }
        if c != b'\\' {
            out.push(c);
            j += 1;
            continue;
        }
        let Some(&e) = b.get(j + 1) else { return Err(unterminated()) };
        j += 2;
        let bad = |what: &str| ParseError::at(j, format!("invalid escape sequence in string: {what}"));
        match e {
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'\\' => out.push(b'\\'),
            b'\'' | b'"' if e == quote => out.push(e),
            b'x' => {
                let h = input.get(j..j + 2).ok_or_else(|| bad("\\x"))?;
                out.push(u8::from_str_radix(h, 16).map_err(|_| bad(h))?);
                j += 2;
            }
            b'0'..=b'7' => {
                let o = input.get(j - 1..j + 2).ok_or_else(|| bad("octal"))?;
                let v = u32::from_str_radix(o, 8).map_err(|_| bad(o))?;
                if v > 255 {
                    return Err(bad(o));
                }
                out.push(v as u8);
                j += 2;
            }
            b'u' | b'U' => {
                let n = if e == b'u' { 4 } else { 8 };
                let h = input.get(j..j + n).ok_or_else(|| bad("\\u"))?;
                let v = u32::from_str_radix(h, 16).map_err(|_| bad(h))?;
                let ch = char::from_u32(v).ok_or_else(|| bad(h))?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                j += n;
            }
            _ => return Err(bad(&(e as char).to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s).unwrap().into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn numbers_and_durations() {
        assert_eq!(toks("5m"), vec![Tok::Duration(300_000), Tok::Eof]);
        assert_eq!(toks("1h30m"), vec![Tok::Duration(5_400_000), Tok::Eof]);
        assert_eq!(toks("10ms"), vec![Tok::Duration(10), Tok::Eof]);
        assert_eq!(toks("1e3"), vec![Tok::Number(1000.0), Tok::Eof]);
        assert_eq!(toks(".5"), vec![Tok::Number(0.5), Tok::Eof]);
        assert_eq!(toks("2."), vec![Tok::Number(2.0), Tok::Eof]);
        assert_eq!(toks("0x1F"), vec![Tok::Number(31.0), Tok::Eof]);
        assert_eq!(toks("12.34e-6"), vec![Tok::Number(12.34e-6), Tok::Eof]);
        assert!(lex("5mx").is_err());
    }

    #[test]
    fn strings_follow_go_rules() {
        assert_eq!(toks(r#""a\"b\n""#), vec![Tok::Str(b"a\"b\n".to_vec()), Tok::Eof]);
        assert_eq!(toks(r"'a\'b'"), vec![Tok::Str(b"a'b".to_vec()), Tok::Eof]);
        assert_eq!(toks(r"`a\n`"), vec![Tok::Str(b"a\\n".to_vec()), Tok::Eof]);
        assert_eq!(toks(r#""a\xc5z""#), vec![Tok::Str(vec![b'a', 0xc5, b'z']), Tok::Eof]);
        assert_eq!(toks(r#""\u00e9""#), vec![Tok::Str("é".as_bytes().to_vec()), Tok::Eof]);
        assert!(lex(r#""abc"#).is_err());
    }

    #[test]
    fn operators_and_names() {
        assert_eq!(
            toks("a:b{c=~\"x\"} != 1"),
            vec![
                Tok::MetricIdent("a:b".into()),
                Tok::LBrace,
                Tok::Ident("c".into()),
                Tok::EqRegex,
                Tok::Str(b"x".to_vec()),
                Tok::RBrace,
                Tok::Neq,
                Tok::Number(1.0),
                Tok::Eof
            ]
        );
        assert_eq!(toks("x[5m:1m]")[2..6], [Tok::Duration(300_000), Tok::Colon, Tok::Duration(60_000), Tok::RBracket]);
    }
}
