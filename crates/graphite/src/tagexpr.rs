//! Graphite's tag expressions, as `seriesByTag(...)` and `/tags/findSeries?expr=` take them:
//! `tag=value`, `tag!=value`, `tag=~regex`, `tag!=~regex`. Graphite anchors a regular
//! expression at the start of the value only (`re.match`), so `=~cpu` is `cpu.*` in
//! Prometheus' fully anchored terms; the tag `name` is the path's name, `__name__` here.

/// How a tag expression compares, as Prometheus' matcher operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagOp {
    Equal,
    NotEqual,
    RegexMatch,
    RegexNoMatch,
}

/// One expression, translated: the label, the operator, and the value or the fully anchored
/// regular expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagExpr {
    pub label: String,
    pub op: TagOp,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagExprError {
    #[error("tag expression {0:?} is not tag=value, tag!=value, tag=~regex or tag!=~regex")]
    Malformed(String),
    #[error("no tag expression given")]
    Empty,
    #[error("seriesByTag needs at least one expression that matches a non-empty value (tag=value or tag=~regex)")]
    NothingPositive,
}

impl TagExpr {
    pub fn parse(expr: &str) -> Result<TagExpr, TagExprError> {
        let malformed = || TagExprError::Malformed(expr.to_owned());
        let at = expr.find(['=', '!']).ok_or_else(malformed)?;
        let (tag, rest) = expr.split_at(at);
        let (op, value) = if let Some(v) = rest.strip_prefix("!=~") {
            (TagOp::RegexNoMatch, v)
        } else if let Some(v) = rest.strip_prefix("!=") {
            (TagOp::NotEqual, v)
        } else if let Some(v) = rest.strip_prefix("=~") {
            (TagOp::RegexMatch, v)
        } else if let Some(v) = rest.strip_prefix('=') {
            (TagOp::Equal, v)
        } else {
            return Err(malformed());
        };
        let tag = tag.trim();
        if tag.is_empty() {
            return Err(malformed());
        }
        let label = if tag == "name" { "__name__".to_owned() } else { tag.to_owned() };
        let value = match op {
            TagOp::RegexMatch | TagOp::RegexNoMatch => format!("(?:{value}).*"),
            _ => value.to_owned(),
        };
        Ok(TagExpr { label, op, value })
    }

    /// Whether this expression can only match a series that has the tag (graphite-web's rule
    /// for the expressions a query needs one of).
    fn is_positive(&self) -> bool {
        match self.op {
            TagOp::Equal => !self.value.is_empty(),
            // `=~` with a pattern that matches "" (like `.*`) selects everything.
            TagOp::RegexMatch => !self.value.starts_with("(?:.*)") && self.value != "(?:).*",
            _ => false,
        }
    }
}

/// The arguments of `seriesByTag('a=b', "c=~d")` (quotes of either kind, commas between), or
/// `/tags/findSeries`'s `expr` values. At least one must be positive.
pub fn parse_all<S: AsRef<str>>(exprs: &[S]) -> Result<Vec<TagExpr>, TagExprError> {
    if exprs.is_empty() {
        return Err(TagExprError::Empty);
    }
    let parsed = exprs.iter().map(|e| TagExpr::parse(e.as_ref())).collect::<Result<Vec<_>, _>>()?;
    if !parsed.iter().any(TagExpr::is_positive) {
        return Err(TagExprError::NothingPositive);
    }
    Ok(parsed)
}

/// The expressions of a `seriesByTag(...)` target, `None` if the target is not one.
pub fn series_by_tag_args(target: &str) -> Option<Result<Vec<String>, TagExprError>> {
    let inner = target.trim().strip_prefix("seriesByTag(")?.strip_suffix(')')?;
    let mut out = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let quote = rest.chars().next().filter(|c| *c == '\'' || *c == '"');
        let Some(q) = quote else {
            return Some(Err(TagExprError::Malformed(rest.to_owned())));
        };
        let Some(end) = rest[1..].find(q) else {
            return Some(Err(TagExprError::Malformed(rest.to_owned())));
        };
        out.push(rest[1..1 + end].to_owned());
        rest = rest[end + 2..].trim_start();
        if let Some(r) = rest.strip_prefix(',') {
            rest = r.trim_start();
        } else if !rest.is_empty() {
            return Some(Err(TagExprError::Malformed(rest.to_owned())));
        }
    }
    Some(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_translate_to_prometheus_matchers() {
        let e = |s: &str| TagExpr::parse(s).unwrap();
        assert_eq!(e("dc=eu"), TagExpr { label: "dc".into(), op: TagOp::Equal, value: "eu".into() });
        assert_eq!(e("name=disk.used").label, "__name__");
        assert_eq!(e("dc!=eu").op, TagOp::NotEqual);
        assert_eq!(e("host=~web").value, "(?:web).*", "anchored at the start only");
        assert_eq!(e("host!=~web|db").value, "(?:web|db).*");
        assert_eq!(e("dc!=").value, "");
        assert!(TagExpr::parse("dc").is_err());
        assert!(TagExpr::parse("=eu").is_err());
    }

    #[test]
    fn a_query_needs_a_positive_expression() {
        assert!(parse_all(&["dc=eu", "host!=a"]).is_ok());
        assert_eq!(parse_all(&["host!=a"]), Err(TagExprError::NothingPositive));
        assert_eq!(parse_all(&["dc=~.*"]), Err(TagExprError::NothingPositive));
        assert_eq!(parse_all::<&str>(&[]), Err(TagExprError::Empty));
    }

    #[test]
    fn series_by_tag_arguments() {
        assert_eq!(
            series_by_tag_args("seriesByTag('name=disk.used', \"dc=~e,u\")").unwrap().unwrap(),
            ["name=disk.used", "dc=~e,u"]
        );
        assert_eq!(series_by_tag_args("a.b.*"), None);
        assert!(series_by_tag_args("seriesByTag('a=b' 'c=d')").unwrap().is_err());
        assert!(series_by_tag_args("seriesByTag('a=b)").unwrap().is_err());
    }
}
