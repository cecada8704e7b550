//! Graphite paths, plain (`sys.cpu.load.host-1`) and tagged (`disk.used;dc=eu;host=a`), by
//! Graphite 1.1's rules (carbon's `TaggedSeries`): the name comes first and may not be empty;
//! each tag is `name=value`; a tag name may not be empty nor hold any of `;!^=`; a value may
//! not be empty, hold `;`, or start with `~`. Tags are kept sorted by name (a later duplicate
//! wins, as in carbon's dictionary), so that the same series always has the same path:
//! `GraphitePath::canonical` is carbon's `TaggedSeries.format`.

use std::fmt;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("empty metric name")]
    EmptyName,
    #[error("tag segment {0:?} is not name=value")]
    BadSegment(String),
    #[error("character {ch:?} is not allowed in tag name {tag:?}")]
    BadTagChar { tag: String, ch: char },
    #[error("tag {0:?} has an empty value")]
    EmptyValue(String),
    #[error("the value of tag {0:?} holds ';' or starts with '~'")]
    BadValue(String),
    #[error("the metric name {0:?} holds a control character or a space")]
    BadNameChar(String),
}

/// A parsed path: its name and its tags sorted by tag name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphitePath {
    pub name: String,
    pub tags: Vec<(String, String)>,
}

/// Characters a tag name may not hold.
const PROHIBITED_TAG_CHARS: [char; 4] = [';', '!', '^', '='];

impl GraphitePath {
    pub fn parse(path: &str) -> Result<GraphitePath, PathError> {
        let mut segments = path.split(';');
        let name = segments.next().unwrap_or_default();
        if name.is_empty() {
            return Err(PathError::EmptyName);
        }
        if name.chars().any(|c| c.is_control() || c == ' ') {
            return Err(PathError::BadNameChar(name.to_owned()));
        }
        let mut tags: Vec<(String, String)> = Vec::new();
        for segment in segments {
            let Some((tag, value)) = segment.split_once('=') else {
                return Err(PathError::BadSegment(segment.to_owned()));
            };
            if tag.is_empty() {
                return Err(PathError::BadSegment(segment.to_owned()));
            }
            if let Some(ch) = tag.chars().find(|c| PROHIBITED_TAG_CHARS.contains(c)) {
                return Err(PathError::BadTagChar { tag: tag.to_owned(), ch });
            }
            if value.is_empty() {
                return Err(PathError::EmptyValue(tag.to_owned()));
            }
            if value.starts_with('~') {
                return Err(PathError::BadValue(tag.to_owned()));
            }
            // `name` is the metric itself in Graphite's tag model: a `name=` tag in the path
            // would be overwritten by carbon, so it is dropped here too.
            if tag == "name" {
                continue;
            }
            match tags.iter_mut().find(|(t, _)| t == tag) {
                Some(existing) => existing.1 = value.to_owned(),
                None => tags.push((tag.to_owned(), value.to_owned())),
            }
        }
        tags.sort();
        Ok(GraphitePath { name: name.to_owned(), tags })
    }

    pub fn is_tagged(&self) -> bool {
        !self.tags.is_empty()
    }
}

impl fmt::Display for GraphitePath {
    /// The canonical spelling: name, then `;tag=value` in tag order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        for (t, v) in &self.tags {
            write!(f, ";{t}={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_tagged_paths_take_one_canonical_spelling() {
        let p = GraphitePath::parse("sys.cpu.load.host-1").unwrap();
        assert!(!p.is_tagged());
        assert_eq!(p.to_string(), "sys.cpu.load.host-1");
        let p = GraphitePath::parse("disk.used;host=a;dc=eu;host=b").unwrap();
        assert_eq!(p.tags, [("dc".into(), "eu".into()), ("host".into(), "b".into())]);
        assert_eq!(p.to_string(), "disk.used;dc=eu;host=b");
        // A value may hold '=' (only the first one splits).
        assert_eq!(GraphitePath::parse("m;q=a=b").unwrap().tags, [("q".into(), "a=b".into())]);
        assert_eq!(GraphitePath::parse("m;name=other").unwrap().to_string(), "m");
    }

    #[test]
    fn mistakes_are_named() {
        for (path, want) in [
            ("", PathError::EmptyName),
            (";a=b", PathError::EmptyName),
            ("m;novalue", PathError::BadSegment("novalue".into())),
            ("m;=v", PathError::BadSegment("=v".into())),
            ("m;a!b=v", PathError::BadTagChar { tag: "a!b".into(), ch: '!' }),
            ("m;a^b=v", PathError::BadTagChar { tag: "a^b".into(), ch: '^' }),
            ("m;a=", PathError::EmptyValue("a".into())),
            ("m;a=~x", PathError::BadValue("a".into())),
            ("m\tx", PathError::BadNameChar("m\tx".into())),
        ] {
            assert_eq!(GraphitePath::parse(path), Err(want), "{path:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn the_canonical_spelling_parses_to_itself(s in "[a-z.]{1,8}(;[a-z]{1,3}=[a-z=.]{1,4}){0,4}") {
            let p = GraphitePath::parse(&s).unwrap();
            let again = GraphitePath::parse(&p.to_string()).unwrap();
            proptest::prop_assert_eq!(p, again);
        }
    }
}
