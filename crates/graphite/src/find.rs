//! `/metrics/find`: the nodes a glob names, one level of the path tree, from a sorted list of
//! paths. A node is a leaf when a path ends at it and a branch when longer paths go through
//! it; when it is both, the leaf wins (as graphite-web merges its finders' nodes), but it stays
//! expandable by a glob one level deeper.
//!
//! The paths are searched from the glob's literal start (binary search in the sorted list), so
//! `servers.dc1.*` reads only the `servers.dc1` paths; a glob that starts with a wildcard reads
//! them all. The server answers finds from the names index instead (`strata_tsdb`'s
//! `index::name_dict`); this is the reference that index is property-tested against.

use std::borrow::Cow;

use crate::glob::Glob;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node<'a> {
    /// The node's full path (`servers.dc1`): borrowed from the index that found it (a find
    /// of ten thousand nodes allocates no string per node), or owned.
    path: Cow<'a, str>,
    /// Where the name (the last component) starts in `path`: found once, as the node is made.
    /// A find of ten thousand nodes asks for each name twice (sorted by name, then written),
    /// and finding it each time was an eighth of a leading-star `completer` find.
    name_at: usize,
    pub is_leaf: bool,
}

impl<'a> Node<'a> {
    pub fn new(path: impl Into<Cow<'a, str>>, is_leaf: bool) -> Node<'a> {
        let path = path.into();
        // `memrchr`, not `rsplit('.')`: its char searcher compares each candidate with `memcmp`.
        let name_at = memchr::memrchr(b'.', path.as_bytes()).map_or(0, |dot| dot + 1);
        Node { path, name_at, is_leaf }
    }

    /// The node's full path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The last component (`dc1`), the node's name in graphite-web's answers.
    pub fn name(&self) -> &str {
        &self.path[self.name_at..]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    #[error("the query matches more than {0} nodes")]
    TooManyNodes(usize),
}

/// The nodes `glob` matches among `paths` (sorted, unique), sorted by path; at most `limit`.
pub fn find<S: AsRef<str>>(glob: &Glob, paths: &[S], limit: usize) -> Result<Vec<Node<'static>>, FindError> {
    let n = glob.components.len();
    let prefix = glob.literal_prefix();
    let start_at = prefix.trim_end_matches('.');
    let first = paths.partition_point(|p| p.as_ref() < start_at);
    let mut out: Vec<Node<'static>> = Vec::new();
    for path in &paths[first..] {
        let path = path.as_ref();
        if !path.starts_with(start_at) {
            break;
        }
        // The first n components and whether the path goes on.
        let mut end = 0;
        let mut count = 0;
        for (i, b) in path.bytes().enumerate() {
            if b == b'.' {
                count += 1;
                if count == n {
                    end = i;
                    break;
                }
            }
        }
        let (node, is_leaf) = if count == n {
            (&path[..end], false)
        } else if count + 1 == n {
            (path, true)
        } else {
            continue;
        };
        if !glob.matches(node) {
            continue;
        }
        // Paths are sorted, but `a.b` (leaf), `a.b-c`, `a.b.x` (branch `a.b`) do not keep a
        // node's paths together: look the node up among the last ones found.
        match out.binary_search_by(|x| (*x.path).cmp(node)) {
            Ok(i) => out[i].is_leaf |= is_leaf,
            Err(i) => {
                if out.len() >= limit {
                    return Err(FindError::TooManyNodes(limit));
                }
                out.insert(i, Node::new(node.to_owned(), is_leaf));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATHS: [&str; 9] = [
        "a.b",
        "a.b-c.d",
        "a.b.x",
        "a.b.y",
        "servers.dc1.host-1.cpu",
        "servers.dc1.host-1.mem",
        "servers.dc1.host-2.cpu",
        "servers.dc2.host-1.cpu",
        "up",
    ];

    fn found(glob: &str) -> Vec<(String, bool)> {
        let g = Glob::parse(glob).unwrap();
        find(&g, &PATHS, 100).unwrap().into_iter().map(|n| (n.path().to_owned(), n.is_leaf)).collect()
    }

    #[test]
    fn a_nodes_name_is_its_last_component() {
        for (path, name) in [("servers.dc1.host-1", "host-1"), ("up", "up"), ("a.", ""), ("", ""), ("é.ü", "ü")] {
            let node = Node::new(path, true);
            assert_eq!((node.path(), node.name()), (path, name));
            assert_eq!(Node::new(path.to_owned(), false).name(), name);
        }
    }

    fn nodes(list: &[(&str, bool)]) -> Vec<(String, bool)> {
        list.iter().map(|(p, l)| (p.to_string(), *l)).collect()
    }

    #[test]
    fn one_level_of_the_tree() {
        assert_eq!(found("*"), nodes(&[("a", false), ("servers", false), ("up", true)]));
        assert_eq!(found("servers.*"), nodes(&[("servers.dc1", false), ("servers.dc2", false)]));
        assert_eq!(
            found("servers.dc1.host-1.*"),
            nodes(&[("servers.dc1.host-1.cpu", true), ("servers.dc1.host-1.mem", true)])
        );
        assert_eq!(
            found("servers.*.host-1.cpu"),
            nodes(&[("servers.dc1.host-1.cpu", true), ("servers.dc2.host-1.cpu", true)])
        );
        assert_eq!(
            found("*.*.*.cpu"),
            nodes(&[
                ("servers.dc1.host-1.cpu", true),
                ("servers.dc1.host-2.cpu", true),
                ("servers.dc2.host-1.cpu", true)
            ])
        );
        // `a.b` is a leaf and a branch: the leaf wins, and `a.b.*` still lists its children.
        assert_eq!(found("a.*"), nodes(&[("a.b", true), ("a.b-c", false)]));
        assert_eq!(found("a.b.*"), nodes(&[("a.b.x", true), ("a.b.y", true)]));
        assert_eq!(found("a.b"), nodes(&[("a.b", true)]));
        assert_eq!(found("servers.dc3.*"), nodes(&[]));
        assert_eq!(found("servers.{dc2,dc1}.host-[2-9]"), nodes(&[("servers.dc1.host-2", false)]));
    }

    #[test]
    fn the_limit_is_an_error_naming_it() {
        let g = Glob::parse("*.*").unwrap();
        assert_eq!(find(&g, &PATHS, 2), Err(FindError::TooManyNodes(2)));
    }

    proptest::proptest! {
        /// Against the obvious definition: every prefix of every path, filtered by the glob.
        #[test]
        fn agrees_with_filtering_every_prefix(
            mut paths in proptest::collection::vec("[ab]{1,2}(\\.[ab]{1,2}){0,3}", 0..30),
            glob in "(\\*|a|b|\\?|[ab]\\*)(\\.(\\*|a|b|ab|\\?|\\*b)){0,3}",
        ) {
            paths.sort();
            paths.dedup();
            let g = Glob::parse(&glob).unwrap();
            let got = find(&g, &paths, usize::MAX).unwrap();
            let mut want: std::collections::BTreeMap<String, bool> = Default::default();
            let n = g.components.len();
            for p in &paths {
                let parts: Vec<&str> = p.split('.').collect();
                if parts.len() >= n {
                    let node = parts[..n].join(".");
                    if g.matches(&node) {
                        *want.entry(node).or_default() |= parts.len() == n;
                    }
                }
            }
            let want: Vec<Node> = want.into_iter().map(|(path, is_leaf)| Node::new(path, is_leaf)).collect();
            proptest::prop_assert_eq!(got, want);
        }
    }
}
