//! Rule files (`rule_files`): groups, rules, PromQL expressions and the alert templates in
//! them, then each template expanded over sample data, as an evaluation would.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use strata_server::rules::file::{parse_file, LoadOptions};
use strata_server::rules::template::{alert_data, Context, QuerySample, Template};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let labels = BTreeMap::from([("instance".to_owned(), "a:9100".to_owned()), ("job".to_owned(), "node".to_owned())]);
    let (data, vars) = alert_data(&labels, &BTreeMap::new(), "http://localhost:9090", 1.5);
    let query = |_: &str| -> Result<Vec<QuerySample>, String> {
        Ok(vec![QuerySample { labels: labels.clone(), value: 2.0 }])
    };
    let ctx = Context { query: Some(&query), external_url: "http://localhost:9090" };
    // The text as a template on its own, and as a rule file.
    if let Ok(t) = Template::parse(text) {
        let _ = t.execute(data.clone(), &vars, &ctx);
    }
    if let Ok(groups) = parse_file(std::path::Path::new("rules.yml"), text, &LoadOptions::default()) {
        for g in &groups {
            for r in &g.rules {
                for t in r.label_templates.values().chain(r.annotation_templates.values()) {
                    let _ = t.execute(data.clone(), &vars, &ctx);
                }
            }
        }
    }
});
