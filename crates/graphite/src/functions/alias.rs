//! Renaming: `alias`, `aliasByNode`, `aliasByMetric` (graphite-web's "Alias" group).

use super::{Arg, Args, EvalError, Series};
use crate::target::{self, Expr};

/// `alias(seriesList, newName)`: every series takes the name.
pub(crate) fn alias(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let name = args.string(1, "newName")?.ok_or_else(|| args.error("missing newName"))?;
    args.finish()?;
    for s in &mut series {
        s.name = name.clone();
    }
    Ok(series)
}

/// `aliasByNode(seriesList, *nodes)`: the name becomes the given nodes of the path (negative
/// from the end) or values of tags, joined by dots; a name that is a function call is read
/// from its first path expression.
pub(crate) fn alias_by_node(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let nodes = args.nodes_rest(1, "nodes")?;
    if nodes.is_empty() {
        return Err(args.error("missing nodes"));
    }
    args.finish()?;
    for s in &mut series {
        s.name = agg_key(s, &nodes);
    }
    Ok(series)
}

/// `aliasByMetric(seriesList)`: the last node of the path (graphite-web's `substr(-1)`, which
/// reads inside the innermost call and stops at its first comma).
pub(crate) fn alias_by_metric(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    args.finish()?;
    for s in &mut series {
        let left = s.name.rfind('(').map_or(0, |i| i + 1);
        let right = s.name.find(')').unwrap_or(s.name.len());
        let clean = s.name.get(left..right.max(left)).unwrap_or("");
        let last = clean.rsplit('.').next().unwrap_or("");
        s.name = last.split(',').next().unwrap_or("").to_owned();
    }
    Ok(series)
}

/// graphite-web's `aggKey`: the nodes (or tags) of a series joined by dots.
pub(crate) fn agg_key(s: &Series, nodes: &[Arg]) -> String {
    let path = if s.name.ends_with(')') { first_path_expression(&s.name) } else { None };
    let path = path.as_deref().unwrap_or(&s.name);
    let parts: Vec<&str> = path.split(';').next().unwrap_or("").split('.').collect();
    nodes
        .iter()
        .map(|n| {
            let index = match n {
                Arg::Number(n) => {
                    let f = n.as_f64();
                    (f.fract() == 0.0).then_some(f as i64)
                }
                _ => None,
            };
            let node = index.and_then(|i| {
                let i = if i < 0 { parts.len() as i64 + i } else { i };
                usize::try_from(i).ok().and_then(|i| parts.get(i)).copied()
            });
            match node {
                Some(part) => part.to_owned(),
                None => {
                    let tag = match n {
                        Arg::String(t) => t.clone(),
                        Arg::Number(n) => n.to_string(),
                        _ => String::new(),
                    };
                    s.tags.get(&tag).cloned().unwrap_or_default()
                }
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The first path expression in `name` read as a target (`sumSeries(a.b.c)` → `a.b.c`),
/// graphite-web's `_getFirstPathExpression`.
fn first_path_expression(name: &str) -> Option<String> {
    let mut e = target::parse(name).ok()?;
    loop {
        match e {
            Expr::Path(p) => return Some(p),
            Expr::Call(mut c) if !c.args.is_empty() => e = c.args.swap_remove(0),
            _ => return None,
        }
    }
}

/// `aliasByTags(seriesList, *tags)`: `aliasByNode` with tag names (or nodes).
pub(crate) fn alias_by_tags(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    alias_by_node(args)
}

/// `aliasSub(seriesList, search, replace)`: the name with every match of `search` replaced,
/// as Python's `re.sub` does (`\1` and `\g<name>` in the replacement). The pattern is Rust's
/// regex syntax, which lacks lookaround and backreferences in the pattern.
pub(crate) fn alias_sub(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let search = args.string(1, "search")?.ok_or_else(|| args.error("missing search"))?;
    let replace = args.string(2, "replace")?.ok_or_else(|| args.error("missing replace"))?;
    args.finish()?;
    let re = regex::RegexBuilder::new(&search)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| EvalError::BadArgument { function: "aliasSub".into(), message: format!("search: {e}") })?;
    let replacement = python_replacement(&replace);
    for s in &mut series {
        s.name = re.replace_all(&s.name, replacement.as_str()).into_owned();
    }
    Ok(series)
}

/// A Python `re.sub` replacement in the `regex` crate's syntax: `\1` and `\g<1>`/`\g<name>` become
/// `${1}`/`${name}`, `\\` a backslash, `\n` and `\t` their characters, `$` is escaped.
pub(crate) fn python_replacement(py: &str) -> String {
    let mut out = String::new();
    let mut chars = py.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '$' => out.push_str("$$"),
            '\\' => match chars.peek().copied() {
                Some(d) if d.is_ascii_digit() => {
                    let mut group = String::new();
                    while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                        group.push(d);
                        chars.next();
                        if group.len() == 2 {
                            break;
                        }
                    }
                    out.push_str(&format!("${{{group}}}"));
                }
                Some('g') => {
                    chars.next();
                    if chars.peek() == Some(&'<') {
                        chars.next();
                        let name: String = chars.by_ref().take_while(|c| *c != '>').collect();
                        out.push_str(&format!("${{{name}}}"));
                    } else {
                        out.push_str("\\g");
                    }
                }
                Some('n') => {
                    chars.next();
                    out.push('\n');
                }
                Some('t') => {
                    chars.next();
                    out.push('\t');
                }
                Some('\\') => {
                    chars.next();
                    out.push('\\');
                }
                _ => out.push('\\'),
            },
            c => out.push(c),
        }
    }
    out
}
