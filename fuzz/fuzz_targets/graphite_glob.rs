//! Graphite globs as `/metrics/find` and `/render` take them from a URL: the first line is a
//! pattern, the other lines paths. Parsing never panics; a parsed glob matches a path exactly
//! when `find` lists it as a node over that path alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_graphite::find::find;
use strata_graphite::glob::Glob;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut lines = text.split('\n');
    let Some(Ok(glob)) = lines.next().map(Glob::parse) else { return };
    let mut paths: Vec<&str> = lines.filter(|p| !p.is_empty()).collect();
    paths.sort_unstable();
    paths.dedup();
    let nodes = find(&glob, &paths, usize::MAX).expect("no limit");
    for p in &paths {
        let listed = nodes.iter().any(|n| n.path() == *p && n.is_leaf);
        assert_eq!(glob.matches(p), listed, "{p:?}");
    }
    assert!(nodes.windows(2).all(|w| w[0].path() < w[1].path()), "nodes sorted and unique");
});
