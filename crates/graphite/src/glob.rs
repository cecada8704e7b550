//! Graphite's glob patterns, as graphite-web's finders read them: the pattern is split on `.`
//! into components, and each component matches one path component with `*` (any run of
//! characters), `?` (one character), `[abc]`, `[a-z0-9]`, `[!x]` or `[^x]` (one character
//! of, or not of, a set), `{a,b,c}` (one of several alternatives, which may hold wildcards),
//! mixed freely (`host-0[0-4]?`, `{cpu,mem}*`). No wildcard crosses a `.`.
//!
//! Matching is linear in the component for patterns without `*`, and the classic two-pointer
//! wildcard match (no backtracking explosion: `O(pattern × text)` at worst) with them. Brace
//! alternatives are expanded into several component patterns, at most `EXPANSIONS_MAX`.

use std::fmt;

/// Most alternatives a component's braces may expand to (`{a,b}{c,d}` is four).
pub const EXPANSIONS_MAX: usize = 1024;

/// Why a pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GlobError {
    #[error("empty pattern")]
    Empty,
    #[error("component {0:?}: unclosed '['")]
    UnclosedClass(String),
    #[error("component {0:?}: unbalanced '{{' or '}}'")]
    UnbalancedBraces(String),
    #[error("component {0:?}: braces expand to more than {EXPANSIONS_MAX} alternatives")]
    TooManyAlternatives(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Char(char),
    AnyChar,
    AnyRun,
    /// `negated`, inclusive ranges (a single character `c` is `(c, c)`).
    Class(bool, Vec<(char, char)>),
}

/// One component: any of its alternatives matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentGlob {
    alternatives: Vec<Vec<Token>>,
    /// The text the component was written as.
    source: String,
}

impl ComponentGlob {
    pub fn parse(source: &str) -> Result<ComponentGlob, GlobError> {
        let expanded = expand_braces(source)?;
        let mut alternatives = Vec::with_capacity(expanded.len());
        for alt in expanded {
            alternatives.push(tokens(&alt).ok_or_else(|| GlobError::UnclosedClass(source.to_owned()))?);
        }
        alternatives.dedup();
        Ok(ComponentGlob { alternatives, source: source.to_owned() })
    }

    /// The literal this component is, when it has no wildcard and one alternative: such
    /// components are looked up, not scanned.
    pub fn literal(&self) -> Option<String> {
        match self.alternatives.as_slice() {
            [one] => one.iter().map(|t| if let Token::Char(c) = t { Some(*c) } else { None }).collect(),
            _ => None,
        }
    }

    pub fn matches(&self, text: &str) -> bool {
        self.alternatives.iter().any(|alt| wildcard_match(alt, text))
    }

    /// Appends the regex matching what this component matches (never a `.`).
    fn push_regex(&self, out: &mut String) {
        out.push_str("(?:");
        for (i, alt) in self.alternatives.iter().enumerate() {
            if i > 0 {
                out.push('|');
            }
            for t in alt {
                match t {
                    Token::Char(c) => regex_syntax::escape_into(c.encode_utf8(&mut [0; 4]), out),
                    Token::AnyChar => out.push_str("[^.]"),
                    Token::AnyRun => out.push_str("[^.]*"),
                    Token::Class(negated, ranges) => {
                        out.push_str(if *negated { "[^." } else { "[" });
                        // A range written backwards (`[z-a]`) matches nothing, as in the matcher.
                        let mut any = false;
                        for &(lo, hi) in ranges.iter().filter(|(lo, hi)| lo <= hi) {
                            any = true;
                            regex_syntax::escape_into(lo.encode_utf8(&mut [0; 4]), out);
                            if lo != hi {
                                out.push('-');
                                regex_syntax::escape_into(hi.encode_utf8(&mut [0; 4]), out);
                            }
                        }
                        if *negated {
                            out.push(']');
                        } else if any {
                            out.push_str("&&[^.]]");
                        } else {
                            out.push_str("a&&b]");
                        }
                    }
                }
            }
        }
        out.push(')');
    }
}

impl fmt::Display for ComponentGlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// A whole pattern: one `ComponentGlob` per `.`-separated component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pub components: Vec<ComponentGlob>,
}

impl Glob {
    pub fn parse(pattern: &str) -> Result<Glob, GlobError> {
        if pattern.is_empty() {
            return Err(GlobError::Empty);
        }
        let components = pattern.split('.').map(ComponentGlob::parse).collect::<Result<Vec<_>, _>>()?;
        Ok(Glob { components })
    }

    /// Whether `path` has exactly as many components as the pattern and each matches.
    pub fn matches(&self, path: &str) -> bool {
        let mut parts = path.split('.');
        for c in &self.components {
            match parts.next() {
                Some(p) if c.matches(p) => {}
                _ => return false,
            }
        }
        parts.next().is_none()
    }

    /// The regex (the `regex` crate's syntax, matched against a whole path) that matches the
    /// paths this pattern matches: `*` is `[^.]*`, `?` is `[^.]`, a class excludes `.`, braces
    /// are alternations, components are joined by `\.`. Names indexes walk it.
    pub fn to_regex(&self) -> String {
        let mut out = String::new();
        for (i, c) in self.components.iter().enumerate() {
            if i > 0 {
                out.push_str(r"\.");
            }
            c.push_regex(&mut out);
        }
        out
    }

    /// The longest literal start of every path the pattern can match (whole literal
    /// components and the dots after them): where a sorted list of paths is searched from.
    pub fn literal_prefix(&self) -> String {
        let mut out = String::new();
        for c in &self.components {
            match c.literal() {
                Some(l) => {
                    out.push_str(&l);
                    out.push('.');
                }
                None => break,
            }
        }
        out
    }
}

/// `a{b,c}d{e,f}` to `abde`, `abdf`, `acde`, `acdf` (nesting allowed: `{a,b{c,d}}`).
fn expand_braces(s: &str) -> Result<Vec<String>, GlobError> {
    let unbalanced = || GlobError::UnbalancedBraces(s.to_owned());
    let Some(open) = s.find('{') else {
        if s.contains('}') {
            return Err(unbalanced());
        }
        return Ok(vec![s.to_owned()]);
    };
    // The matching close, and the top-level commas between.
    let (mut depth, mut close, mut commas) = (0usize, None, Vec::new());
    for (i, ch) in s[open..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            ',' if depth == 1 => commas.push(open + i),
            _ => {}
        }
    }
    let close = close.ok_or_else(unbalanced)?;
    let (head, tail) = (&s[..open], &s[close + 1..]);
    if head.contains('}') {
        return Err(unbalanced());
    }
    let mut bounds = vec![open];
    bounds.extend(&commas);
    bounds.push(close);
    let tails = expand_braces(tail)?;
    let mut out = Vec::new();
    for w in bounds.windows(2) {
        for alt in expand_braces(&s[w[0] + 1..w[1]])? {
            for t in &tails {
                if out.len() >= EXPANSIONS_MAX {
                    return Err(GlobError::TooManyAlternatives(s.to_owned()));
                }
                out.push(format!("{head}{alt}{t}"));
            }
        }
    }
    Ok(out)
}

/// The tokens of a brace-free component; `None` for an unclosed `[`.
fn tokens(s: &str) -> Option<Vec<Token>> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                // `**` is `*`.
                if out.last() != Some(&Token::AnyRun) {
                    out.push(Token::AnyRun);
                }
            }
            '?' => out.push(Token::AnyChar),
            '[' => {
                let mut j = i + 1;
                let negated = matches!(chars.get(j), Some('!' | '^'));
                if negated {
                    j += 1;
                }
                let mut ranges = Vec::new();
                // A `]` right after the opening (or its negation) is a member, as in fnmatch.
                let mut first = true;
                loop {
                    let c = *chars.get(j)?;
                    if c == ']' && !first {
                        break;
                    }
                    first = false;
                    if chars.get(j + 1) == Some(&'-') && chars.get(j + 2).is_some_and(|&e| e != ']') {
                        ranges.push((c, chars[j + 2]));
                        j += 3;
                    } else {
                        ranges.push((c, c));
                        j += 1;
                    }
                }
                out.push(Token::Class(negated, ranges));
                i = j;
            }
            c => out.push(Token::Char(c)),
        }
        i += 1;
    }
    Some(out)
}

fn token_matches(t: &Token, c: char) -> bool {
    match t {
        Token::Char(x) => *x == c,
        Token::AnyChar => true,
        Token::Class(negated, ranges) => ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negated,
        Token::AnyRun => unreachable!("handled by the matcher"),
    }
}

/// The two-pointer wildcard match: on a mismatch, go back to just after the last `*` and let
/// it take one more character. Each `*` only ever moves forward, so this is `O(p × t)`. Works
/// on byte offsets of `text`, a character at a time: nothing is allocated (a find runs it on
/// every component of every path it reads).
fn wildcard_match(pattern: &[Token], text: &str) -> bool {
    let char_at = |i: usize| text[i..].chars().next().expect("offset inside the text");
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        let c = char_at(t);
        if p < pattern.len() && pattern[p] == Token::AnyRun {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && token_matches(&pattern[p], c) {
            p += 1;
            t += c.len_utf8();
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + char_at(st).len_utf8();
            star = Some((sp, t));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|x| *x == Token::AnyRun)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        Glob::parse(pattern).unwrap().matches(path)
    }

    proptest::proptest! {
        /// The regex matches exactly what the glob matches.
        #[test]
        fn the_regex_matches_what_the_glob_matches(
            glob in "([ab.*?]|\\[!?[ab.]{0,2}(-[ab])?\\]|\\{[ab*]{0,2},[ab.]{0,2}\\}){1,6}",
            path in "[ab.]{0,7}",
        ) {
            if let Ok(g) = Glob::parse(&glob) {
                let re = regex::Regex::new(&format!("^(?s:{})$", g.to_regex())).unwrap();
                proptest::prop_assert_eq!(re.is_match(&path), g.matches(&path), "{} as {}", glob, g.to_regex());
            }
        }
    }

    #[test]
    fn globs_become_regexes_with_no_wildcard_crossing_a_dot() {
        let r = |g: &str| Glob::parse(g).unwrap().to_regex();
        assert_eq!(r("servers.*.load"), r"(?:servers)\.(?:[^.]*)\.(?:load)");
        assert_eq!(r("a{b,c}?"), r"(?:ab[^.]|ac[^.])");
        assert_eq!(r("[!x][a-c][z-a]"), r"(?:[^.x][a-c&&[^.]][a&&b])");
        assert_eq!(r("x+y"), r"(?:x\+y)");
    }

    #[test]
    fn graphite_globs_match_as_graphite_web_matches() {
        assert!(m("servers.dc1.host-00001.cpu", "servers.dc1.host-00001.cpu"));
        assert!(m("servers.*.host-00001.cpu", "servers.dc2.host-00001.cpu"));
        assert!(!m("servers.*", "servers.dc2.host-00001"), "a star does not cross a dot");
        assert!(m("*.*.*.net.eth0.rx_bytes", "a.b.c.net.eth0.rx_bytes"));
        assert!(m("servers.*.host-00042.{cpu,mem}.*", "servers.dc9.host-00042.mem.free"));
        assert!(!m("servers.*.host-00042.{cpu,mem}.*", "servers.dc9.host-00042.disk.free"));
        assert!(m("host-0[0-4]?", "host-042"));
        assert!(!m("host-0[0-4]?", "host-052"));
        assert!(m("host-[!0-4]*", "host-9"));
        assert!(m("host-[^0-4]*", "host-9x"));
        assert!(!m("host-[!0-4]*", "host-3"));
        assert!(m("{cpu,mem}*", "memory"));
        assert!(m("a{b,c{d,e}}f", "acef"));
        assert!(m("*user*", "cpu_user_time"));
        assert!(m("[]x]", "]"));
        assert!(m("*a*b*c", "xxaxxbxxc"));
        assert!(!m("*a*b*c", "xxaxxcxxb"));
        assert!(m("ü*", "über"), "UTF-8 components");
    }

    #[test]
    fn literal_prefixes_and_literals() {
        assert_eq!(Glob::parse("servers.dc1.*.cpu").unwrap().literal_prefix(), "servers.dc1.");
        assert_eq!(Glob::parse("*.cpu").unwrap().literal_prefix(), "");
        assert_eq!(Glob::parse("a.{b}.c").unwrap().literal_prefix(), "a.b.c.");
        assert_eq!(ComponentGlob::parse("{a,b}").unwrap().literal(), None);
    }

    #[test]
    fn mistakes_are_named() {
        assert_eq!(Glob::parse(""), Err(GlobError::Empty));
        assert_eq!(Glob::parse("a.[bc"), Err(GlobError::UnclosedClass("[bc".into())));
        assert_eq!(Glob::parse("a.{b,c"), Err(GlobError::UnbalancedBraces("{b,c".into())));
        assert_eq!(Glob::parse("a.b}c"), Err(GlobError::UnbalancedBraces("b}c".into())));
        let many = "{a,b,c,d}".repeat(6);
        assert!(matches!(Glob::parse(&many), Err(GlobError::TooManyAlternatives(_))));
    }

    /// A naive matcher by backtracking, the reference for the property test.
    fn naive(p: &[Token], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some(Token::AnyRun) => (0..=t.len()).any(|k| naive(&p[1..], &t[k..])),
            Some(tok) => !t.is_empty() && token_matches(tok, t[0]) && naive(&p[1..], &t[1..]),
        }
    }

    proptest::proptest! {
        #[test]
        fn the_linear_matcher_agrees_with_backtracking(p in "[aé*?]{0,8}", t in "[aé]{0,10}") {
            let toks = tokens(&p).unwrap();
            let chars: Vec<char> = t.chars().collect();
            proptest::prop_assert_eq!(wildcard_match(&toks, &t), naive(&toks, &chars));
        }
    }
}
