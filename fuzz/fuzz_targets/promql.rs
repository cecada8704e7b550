//! PromQL queries and `match[]` selectors, with every experimental syntax enabled: a parse
//! error or a tree, never a panic or a stack overflow (the parser bounds nesting).
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_promql::parser::{parse_with, Features};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(e) = parse_with(text, Features::all()) {
        assert!(e.height <= strata_promql::parser::MAX_DEPTH_DEFAULT);
        let _ = e.value_type();
    }
    let _ = strata_model::parse_selector(text);
});
