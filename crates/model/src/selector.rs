//! Series selectors as Prometheus' `match[]` parameters and `promtool` take them:
//! `metric`, `metric{a="b", c=~"d.*"}`, `{__name__=~"x.+", e!="f"}`, quoted UTF-8 names
//! (`{"my.metric", "a.b"="c"}`). Values use Go string escapes (`\\`, `\"`, `\n`, `\t`).

use crate::{MatchOp, Matcher, METRIC_NAME};

/// Parses a selector into matchers. At least one matcher must reject the empty string, as in
/// Prometheus (`{a=~".*"}` would select every series).
pub fn parse_selector(s: &str) -> Result<Vec<Matcher>, String> {
    let mut p = P { s: s.trim(), pos: 0 };
    let mut out = Vec::new();
    if p.peek() != Some('{') {
        let name = p.ident().ok_or_else(|| format!("selector {s:?}: expected a metric name or '{{'"))?;
        out.push(Matcher::new(MatchOp::Equal, METRIC_NAME, name).map_err(|e| e.to_string())?);
    }
    if p.eat('{') {
        loop {
            p.ws();
            if p.eat('}') {
                break;
            }
            let name = if p.peek() == Some('"') {
                p.string()?
            } else {
                p.ident().map(str::to_owned).ok_or_else(|| p.err("a label name"))?
            };
            p.ws();
            let op = if p.eat_str("=~") {
                MatchOp::RegexMatch
            } else if p.eat_str("!~") {
                MatchOp::RegexNoMatch
            } else if p.eat_str("!=") {
                MatchOp::NotEqual
            } else if p.eat_str("=") {
                MatchOp::Equal
            } else if out.is_empty() && matches!(p.peek(), Some(',' | '}')) {
                // A quoted metric name standing alone: `{"my.metric"}`.
                out.push(Matcher::new(MatchOp::Equal, METRIC_NAME, name).map_err(|e| e.to_string())?);
                p.ws();
                p.eat(',');
                continue;
            } else {
                return Err(p.err("one of =, !=, =~, !~"));
            };
            p.ws();
            let value = p.string()?;
            out.push(Matcher::new(op, name, value).map_err(|e| e.to_string())?);
            p.ws();
            if !p.eat(',') {
                p.ws();
                if !p.eat('}') {
                    return Err(p.err("',' or '}'"));
                }
                break;
            }
        }
    }
    p.ws();
    if p.pos != p.s.len() {
        return Err(p.err("the end of the selector"));
    }
    if out.is_empty() || out.iter().all(Matcher::matches_empty) {
        return Err(format!("selector {s:?} must contain at least one matcher that does not match the empty string"));
    }
    Ok(out)
}

struct P<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> P<'a> {
    fn err(&self, want: &str) -> String {
        format!("selector {:?}: expected {want} at position {}", self.s, self.pos + 1)
    }
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }
    fn eat(&mut self, c: char) -> bool {
        self.eat_str(c.encode_utf8(&mut [0; 4]))
    }
    fn eat_str(&mut self, t: &str) -> bool {
        if self.s[self.pos..].starts_with(t) {
            self.pos += t.len();
            true
        } else {
            false
        }
    }
    fn ws(&mut self) {
        while let Some(c) = self.peek().filter(|c| c.is_whitespace()) {
            // Whitespace is not only ASCII: U+0085 or U+3000 take several bytes.
            self.pos += c.len_utf8();
        }
    }
    fn ident(&mut self) -> Option<&'a str> {
        let b = self.s.as_bytes();
        let start = self.pos;
        while self.pos < b.len()
            && (b[self.pos].is_ascii_alphabetic()
                || b[self.pos] == b'_'
                || b[self.pos] == b':'
                || (self.pos > start && b[self.pos].is_ascii_digit()))
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| &self.s[start..self.pos])
    }
    fn string(&mut self) -> Result<String, String> {
        let quote = match self.peek() {
            Some(q @ ('"' | '\'' | '`')) => q,
            _ => return Err(self.err("a quoted string")),
        };
        self.pos += 1;
        let mut out = String::new();
        let mut it = self.s[self.pos..].char_indices();
        while let Some((i, c)) = it.next() {
            if c == quote {
                self.pos += i + 1;
                return Ok(out);
            }
            if c == '\\' && quote != '`' {
                match it.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, 't')) => out.push('\t'),
                    Some((_, e @ ('\\' | '"' | '\''))) => out.push(e),
                    _ => return Err(self.err("a valid escape")),
                }
            } else {
                out.push(c);
            }
        }
        Err(self.err("a closing quote"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(s: &str) -> Vec<String> {
        parse_selector(s).unwrap().iter().map(|m| format!("{}{}{:?}", m.name, m.op.as_str(), m.value)).collect()
    }

    #[test]
    fn selectors() {
        assert_eq!(show("up"), ["__name__=\"up\""]);
        assert_eq!(show("up{job=~\"n.*\", i!='x'}"), ["__name__=\"up\"", "job=~\"n.*\"", "i!=\"x\""]);
        assert_eq!(show("{__name__=~\"a|b\"}"), ["__name__=~\"a|b\""]);
        assert_eq!(show("{\"my.metric\", \"a.b\"=\"c\\\"\"}"), ["__name__=\"my.metric\"", "a.b=\"c\\\"\""]);
        assert_eq!(show("x{}"), ["__name__=\"x\""]);
        for bad in ["", "{}", "{a=~\".*\"}", "up{a=b}", "up{a=\"b\"", "up{a~\"b\"}", "up extra", "{a=~\"(\"}"] {
            assert!(parse_selector(bad).is_err(), "{bad:?}");
        }
        let e = parse_selector("{a=~\".*\"}").unwrap_err();
        assert!(e.contains("does not match the empty string"), "{e}");
    }

    /// The promql fuzz target found it (artifact crash-776f0634…, `t\u{85}*`): whitespace past
    /// ASCII moved the position into the middle of a character, and the next slice panicked.
    #[test]
    fn fuzz_crash_multibyte_whitespace_is_skipped_whole() {
        assert!(parse_selector("t\u{85}*").is_err());
        assert_eq!(show("up{\u{85}job=\"a\"\u{2003}}"), ["__name__=\"up\"", "job=\"a\""]);
    }
}
