//! `template(expr, args...)`: the target with `$name` in its path expressions filled in, as
//! graphite-web's evaluator does it: a template's keyword arguments by name, its positional
//! ones as `$1`, `$2`..., then the request's `template[name]=value` parameters over both. A
//! path that is exactly `$name` becomes the value itself (a number, or a string argument);
//! otherwise every `$name` in it is replaced by the value's text, in that order.

use super::EvalError;
use crate::target::{Call, Expr, Number};

/// A template's value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    String(String),
    Number(Number),
}

impl Value {
    /// As Python's `str` writes it into a path.
    fn text(&self) -> String {
        match self {
            Value::String(s) => s.clone(),
            Value::Number(n) => super::number_str(*n),
        }
    }

    /// What a path that is exactly `$name` becomes: a number, a string that reads as one
    /// (graphite-web's `^-?[\d.]+$`) as a float, or the string.
    fn as_argument(&self) -> Expr {
        match self {
            Value::Number(n) => Expr::Number(*n),
            Value::String(s) => {
                let numeric = {
                    let digits = s.strip_prefix('-').unwrap_or(s);
                    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')
                };
                match numeric.then(|| s.parse::<f64>().ok()).flatten() {
                    Some(f) => Expr::Number(Number::Float(f)),
                    None => Expr::String(s.clone()),
                }
            }
        }
    }
}

/// `expr` with its templates expanded; `request` holds the request's `template[...]`
/// parameters.
pub(crate) fn expand(expr: &Expr, request: &[(String, String)]) -> Result<Expr, EvalError> {
    expand_with(expr, request, &[])
}

/// `expand` with `outer`, the replacements in effect (from an enclosing template).
fn expand_with(expr: &Expr, request: &[(String, String)], outer: &[(String, Value)]) -> Result<Expr, EvalError> {
    Ok(match expr {
        Expr::Template { expr, args, kwargs } => {
            let mut replacements: Vec<(String, Value)> = Vec::new();
            let mut set = |name: String, value: Value| match replacements.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => replacements.push((name, value)),
            };
            for (name, v) in kwargs {
                set(name.clone(), scalar(v)?);
            }
            for (i, v) in args.iter().enumerate() {
                set((i + 1).to_string(), scalar(v)?);
            }
            for (name, v) in request {
                set(name.clone(), Value::String(v.clone()));
            }
            expand_with(expr, request, &replacements)?
        }
        Expr::Path(p) if !outer.is_empty() => {
            let mut path = p.clone();
            for (name, value) in outer {
                if path == format!("${name}") {
                    return Ok(value.as_argument());
                }
                path = path.replace(&format!("${name}"), &value.text());
            }
            Expr::Path(path)
        }
        Expr::Call(c) => Expr::Call(Call {
            name: c.name.clone(),
            args: c.args.iter().map(|a| expand_with(a, request, outer)).collect::<Result<_, _>>()?,
            kwargs: c
                .kwargs
                .iter()
                .map(|(k, v)| Ok((k.clone(), expand_with(v, request, outer)?)))
                .collect::<Result<_, EvalError>>()?,
            raw: c.raw.clone(),
        }),
        other => other.clone(),
    })
}

/// A template argument: only strings and numbers are allowed.
fn scalar(e: &Expr) -> Result<Value, EvalError> {
    match e {
        Expr::String(s) => Ok(Value::String(s.clone())),
        Expr::Number(n) => Ok(Value::Number(*n)),
        _ => Err(EvalError::Template("only string and numeric arguments are allowed".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::parse;

    /// The expansion of `target`, calls compared without their text as written (which
    /// expansion keeps: graphite-web fetches `seriesByTag` by it, unexpanded).
    fn expanded(target: &str, request: &[(&str, &str)]) -> Expr {
        let request: Vec<(String, String)> = request.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        without_raw(expand(&parse(target).unwrap(), &request).unwrap())
    }

    fn without_raw(e: Expr) -> Expr {
        match e {
            Expr::Call(c) => Expr::Call(Call {
                args: c.args.into_iter().map(without_raw).collect(),
                kwargs: c.kwargs.into_iter().map(|(k, v)| (k, without_raw(v))).collect(),
                raw: String::new(),
                ..c
            }),
            other => other,
        }
    }

    fn parsed(target: &str) -> Expr {
        without_raw(parse(target).unwrap())
    }

    #[test]
    fn templates_fill_paths_and_arguments_as_graphite_web_does() {
        assert_eq!(expanded("template(a.$host.cpu, host='web1')", &[]), parsed("a.web1.cpu"));
        assert_eq!(expanded("template(a.$1.$2, 'x', 3)", &[]), parsed("a.x.3"));
        assert_eq!(expanded("template(scale(a.b, $f), f=2.5)", &[]), parsed("scale(a.b, 2.5)"));
        assert_eq!(expanded("template(alias(a.b, $n), n='x')", &[]), parsed("alias(a.b, 'x')"));
        // The request's template[...] parameters win; a numeric string becomes a float.
        assert_eq!(
            expanded("template(scale(a.$h, $f), h='x', f=2)", &[("h", "y"), ("f", "3")]),
            parsed("scale(a.y, 3.0)")
        );
        assert!(parse("template(a.$x, x=b.c)").is_err(), "template arguments are literals");
    }
}
