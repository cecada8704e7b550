use std::collections::BTreeMap;

use super::*;

fn expand(src: &str, labels: &[(&str, &str)], value: f64) -> String {
    let labels: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let ext = BTreeMap::from([("dc".to_owned(), "eu-1".to_owned())]);
    let (data, vars) = alert_data(&labels, &ext, "https://strata.example/prefix", value);
    let query = |q: &str| -> std::result::Result<Vec<QuerySample>, String> {
        match q {
            "up" => Ok(vec![
                QuerySample { labels: BTreeMap::from([("instance".into(), "b".into())]), value: 0.0 },
                QuerySample { labels: BTreeMap::from([("instance".into(), "a".into())]), value: 1.0 },
            ]),
            "none" => Ok(vec![]),
            _ => Err(format!("unknown query {q}")),
        }
    };
    let ctx = Context { query: Some(&query), external_url: "https://strata.example/prefix" };
    match Template::parse(src) {
        Ok(t) => t.execute(data, &vars, &ctx).unwrap_or_else(|e| format!("ERROR: {e}")),
        Err(e) => format!("PARSE: {e}"),
    }
}

#[test]
fn variables_fields_and_pipelines() {
    let l = [("instance", "host:9100"), ("job", "node")];
    assert_eq!(expand("{{ $labels.instance }} of {{ .Labels.job }}", &l, 1.0), "host:9100 of node");
    assert_eq!(expand("{{ $value }} {{ .Value }}", &l, 0.5), "0.5 0.5");
    assert_eq!(expand("{{ $value }}", &l, 1e6), "1e+06");
    assert_eq!(expand("{{ $labels.missing }}|", &l, 1.0), "|");
    assert_eq!(expand("{{ $externalLabels.dc }} {{ $externalURL }}", &l, 1.0), "eu-1 https://strata.example/prefix");
    assert_eq!(expand("{{ $value | humanize }}", &l, 1234567.0), "1.235M");
    assert_eq!(expand("{{ $labels.instance | stripPort | toUpper }}", &l, 1.0), "HOST");
    assert_eq!(expand("{{ $x := 3 }}{{ $x }}{{ $x = \"y\" }}{{ $x }}", &l, 1.0), "3y");
    assert_eq!(expand("{{ printf \"%.2f%%\" $value }}", &l, 12.3456), "12.35%");
    assert_eq!(expand("{{ printf \"%s=%d %5.1f|%-4s|\" \"a\" 7 3.14159 \"b\" }}", &l, 0.0), "a=7   3.1|b   |");
    assert_eq!(expand("{{ (printf \"%s\" \"x\") }}", &l, 0.0), "x");
    assert_eq!(expand("{{/* a comment */}}ok", &l, 0.0), "ok");
    assert_eq!(expand("a  {{- \"b\" -}}  c", &l, 0.0), "abc");
    assert_eq!(expand("{{ `raw\\n` }}", &l, 0.0), "raw\\n");
    assert_eq!(expand("{{ \"esc\\n\" }}", &l, 0.0), "esc\n");
}

#[test]
fn control_structures() {
    let l = [("severity", "page"), ("instance", "a")];
    assert_eq!(expand("{{ if eq $labels.severity \"page\" }}P{{ else }}T{{ end }}", &l, 0.0), "P");
    assert_eq!(
        expand("{{ if gt $value 10.0 }}big{{ else if gt $value 1.0 }}mid{{ else }}small{{ end }}", &l, 5.0),
        "mid"
    );
    assert_eq!(expand("{{ if and $labels.severity (not $labels.x) }}y{{ end }}", &l, 0.0), "y");
    assert_eq!(
        expand("{{ range $k, $v := $labels }}{{ $k }}={{ $v }};{{ end }}", &l, 0.0),
        "instance=a;severity=page;"
    );
    assert_eq!(expand("{{ range query \"none\" }}x{{ else }}empty{{ end }}", &l, 0.0), "empty");
    assert_eq!(
        expand(
            "{{ range query \"up\" | sortByLabel \"instance\" }}{{ .Labels.instance }}:{{ .Value }} {{ end }}",
            &l,
            0.0
        ),
        "a:1 b:0 "
    );
    assert_eq!(expand("{{ with query \"up\" }}{{ . | first | label \"instance\" }}{{ end }}", &l, 0.0), "b");
    assert_eq!(expand("{{ with $labels.none }}x{{ else }}none{{ end }}", &l, 0.0), "none");
    assert_eq!(expand("{{ len $labels }} {{ index $labels \"instance\" }}", &l, 0.0), "2 a");
    assert_eq!(expand("{{ query \"up\" | len }}", &l, 0.0), "2");
}

#[test]
fn prometheus_functions() {
    let l: [(&str, &str); 0] = [];
    let cases: &[(&str, f64, &str)] = &[
        ("{{ humanize $value }}", 0.0, "0"),
        ("{{ humanize $value }}", 0.001234, "1.234m"),
        ("{{ humanize $value }}", 1000.0, "1k"),
        ("{{ humanize $value }}", 123.0, "123"),
        ("{{ humanize $value }}", -1500.0, "-1.5k"),
        ("{{ humanize1024 $value }}", 1048576.0, "1Mi"),
        ("{{ humanize1024 $value }}", 0.5, "0.5"),
        ("{{ humanizeDuration $value }}", 0.0, "0s"),
        ("{{ humanizeDuration $value }}", 90061.0, "1d 1h 1m 1s"),
        ("{{ humanizeDuration $value }}", 3725.0, "1h 2m 5s"),
        ("{{ humanizeDuration $value }}", 65.0, "1m 5s"),
        ("{{ humanizeDuration $value }}", 1.5, "1.5s"),
        ("{{ humanizeDuration $value }}", 0.0015, "1.5ms"),
        ("{{ humanizePercentage $value }}", 0.1234, "12.34%"),
        ("{{ humanizeTimestamp $value }}", 1435065584.128, "2015-06-23 13:19:44.128 +0000 UTC"),
        ("{{ humanize \"1234\" }}", 0.0, "1.234k"),
        ("{{ title \"hello wide world\" }}", 0.0, "Hello Wide World"),
        ("{{ reReplaceAll \"(a+)b\" \"x$1\" \"aab aab\" }}", 0.0, "xaa xaa"),
        ("{{ match \"^a.c$\" \"abc\" }}", 0.0, "true"),
        ("{{ stripDomain \"host.example.com:9100\" }}", 0.0, "host:9100"),
        ("{{ stripPort \"[::1]:9100\" }}", 0.0, "::1"),
        ("{{ parseDuration \"1h30m\" }}", 0.0, "5400"),
        ("{{ graphLink \"up == 0\" }}", 0.0, "/graph?g0.expr=up+%3D%3D+0&g0.tab=0"),
        ("{{ pathPrefix }}", 0.0, "/prefix"),
        ("{{ \"<b>\" | html }}", 0.0, "&lt;b&gt;"),
        ("{{ urlquery \"a b&c\" }}", 0.0, "a+b%26c"),
        ("{{ print 1 2 \"x\" 3 }}", 0.0, "1 2x3"),
        ("{{ (args 1 \"x\").arg1 }}", 0.0, "x"),
    ];
    for (src, v, want) in cases {
        assert_eq!(expand(src, &l, *v), *want, "{src} with {v}");
    }
}

#[test]
fn go_g_formats_as_go() {
    for (v, p, want) in [
        (1234.5, 4, "1234"),
        (12345.0, 4, "1.234e+04"),
        (9999.5, 4, "1e+04"),
        (0.0001234, 4, "0.0001234"),
        (0.00001234, 4, "1.234e-05"),
        (100.0, 4, "100"),
        (f64::INFINITY, 4, "+Inf"),
        (f64::NAN, 4, "NaN"),
    ] {
        assert_eq!(go_g(v, p), want, "{v} %.{p}g");
    }
}

#[test]
fn mistakes_are_errors_not_wrong_text() {
    let l: [(&str, &str); 0] = [];
    for (src, want) in [
        ("{{ $labels.a ", "PARSE: unclosed action"),
        ("{{ if 1 }}x", "PARSE: unexpected EOF"),
        ("{{ end }}", "PARSE: unexpected {{end}}"),
        ("{{ nosuch 1 }}", "PARSE: function \"nosuch\" not defined"),
        ("{{ template \"x\" }}", "PARSE: {{template}} is not supported"),
        ("{{ $undefined }}", "ERROR: undefined variable: $undefined"),
        ("{{ query \"bad\" }}", "ERROR: error executing query: unknown query bad"),
        ("{{ query \"none\" | first }}", "ERROR: first() called on vector with no elements"),
        ("{{ humanize \"x\" }}", "ERROR: strconv.ParseFloat"),
        ("{{ printf \"%d\" \"s\" }}", "%!d(string=s)"),
    ] {
        let got = expand(src, &l, 0.0);
        assert!(got.starts_with(want), "{src}: {got}");
    }
}

#[test]
fn huge_widths_are_capped() {
    let l: [(&str, &str); 0] = [];
    let got = expand("{{ printf \"%0999999999d\" 1 }}", &l, 0.0);
    assert_eq!(got.len(), MAX_WIDTH);
    assert!(expand("{{ range 3 }}x{{ end }}", &l, 0.0).starts_with("ERROR: range can't iterate over 3"));
}
