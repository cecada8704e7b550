use super::*;

#[test]
fn external_url_and_route_prefix_follow_prometheus() {
    assert_eq!(WebPaths::new(None, None).unwrap(), WebPaths::default());
    let p = WebPaths::new(Some("https://example.com/strata/"), None).unwrap();
    assert_eq!((p.route_prefix.as_str(), p.browser_base.as_str()), ("/strata", "/strata/"));
    // A proxy that strips its path: the server routes at /, browsers keep the proxy's path.
    let p = WebPaths::new(Some("http://example.com:8080/a/b"), Some("/")).unwrap();
    assert_eq!((p.route_prefix.as_str(), p.browser_base.as_str()), ("/", "/a/b/"));
    let p = WebPaths::new(None, Some("prom/")).unwrap();
    assert_eq!((p.route_prefix.as_str(), p.browser_base.as_str()), ("/prom", "/prom/"));
    assert_eq!(WebPaths::new(Some("http://h"), None).unwrap(), WebPaths::default());
}

#[test]
fn bad_paths_are_refused_with_the_flag_named() {
    for (url, prefix, what) in [
        (Some("example.com/x"), None, "--web.external-url"),
        (Some("ftp://h/x"), None, "--web.external-url"),
        (Some("http:///x"), None, "no host"),
        (Some("http://h/x?y"), None, "query or fragment"),
        (None, Some("/a\"><script>"), "--web.route-prefix"),
        (None, Some("/a//b"), "empty"),
        (None, Some("/a/../b"), "`..`"),
    ] {
        let err = WebPaths::new(url, prefix).unwrap_err();
        assert!(err.contains(what), "{url:?} {prefix:?}: {err}");
    }
}

#[test]
fn every_asset_the_document_names_is_embedded() {
    for src in INDEX_HTML.split("assets/").skip(1) {
        let name = &src[..src.find('"').unwrap()];
        assert!(ASSETS.iter().any(|(n, _, _)| *n == name), "{name} is not embedded");
    }
    assert!(INDEX_HTML.contains("<base href=\"{{BASE}}\">"));
}
