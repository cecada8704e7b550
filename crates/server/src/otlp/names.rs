//! OpenTelemetry names to Prometheus names, as Prometheus' OTLP receiver translates them
//! (`otlp.translation_strategy`): metric names get their unit and type suffixes (`_seconds`,
//! `_bytes`, `_total`, `_ratio`) and, escaped, characters outside `[a-zA-Z0-9_:]` become `_`;
//! attribute names become label names the same way.

use serde::Deserialize;

/// Prometheus' `otlp.translation_strategy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum TranslationStrategy {
    /// Escape to `[a-zA-Z0-9_:]` and add suffixes (Prometheus' default).
    #[default]
    UnderscoreEscapingWithSuffixes,
    /// Keep UTF-8 names and add suffixes.
    NoUTF8EscapingWithSuffixes,
    /// Names and attributes exactly as sent.
    NoTranslation,
}

/// What a metric is, for its suffixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    /// A monotonic sum.
    Counter,
    /// A non-monotonic sum (a gauge to Prometheus).
    UpDownSum,
    Histogram,
    Summary,
}

/// The Prometheus word for an OpenTelemetry unit (UCUM, as the semantic conventions use).
fn unit_word(unit: &str) -> &str {
    match unit {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "1" => "",
        "%" => "percent",
        other => other,
    }
}

/// The word after `per_` for the part of a unit after `/`.
fn per_unit_word(unit: &str) -> &str {
    match unit {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        other => other,
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == ':'
}

/// A unit word made of name characters, runs of others folded to one `_`, none leading.
fn clean_unit(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == ':' || c == '_' {
            out.push(c);
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    while out.contains("__") {
        out = out.replace("__", "_");
    }
    out.trim_start_matches('_').to_owned()
}

/// The unit suffixes of a name: the main unit's word and `per_<word>`, each left out when
/// empty, written in braces (`{requests}`: an annotation, not a unit) or already in the name.
fn unit_suffixes(unit: &str, tokens: &[String], clean: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut parts = unit.splitn(2, '/');
    let main = parts.next().unwrap_or("").trim();
    let per = parts.next().unwrap_or("").trim();
    let word = |w: &str| if clean { clean_unit(w) } else { w.to_owned() };
    let mut main_word = String::new();
    if !main.is_empty() && !main.contains(['{', '}']) {
        main_word = word(unit_word(main));
        if tokens.contains(&main_word) {
            main_word.clear();
        }
    }
    let mut per_word = String::new();
    if !per.is_empty() && !per.contains(['{', '}']) {
        let w = word(per_unit_word(per));
        if !w.is_empty() {
            per_word = format!("per_{w}");
            if tokens.contains(&per_word) {
                per_word.clear();
            }
        }
    }
    if !per_word.is_empty() {
        main_word = main_word.trim_end_matches('_').to_owned();
    }
    if !main_word.is_empty() {
        out.push(main_word);
    }
    if !per_word.is_empty() {
        out.push(per_word);
    }
    out
}

/// The Prometheus metric name of an OpenTelemetry metric (histograms' and summaries' base name:
/// `_bucket`, `_sum`, `_count` are added by the caller).
pub fn metric_name(name: &str, unit: &str, kind: Kind, strategy: TranslationStrategy) -> String {
    match strategy {
        TranslationStrategy::NoTranslation => name.to_owned(),
        TranslationStrategy::UnderscoreEscapingWithSuffixes => {
            let mut tokens: Vec<String> =
                name.split(|c: char| !is_name_char(c)).filter(|t| !t.is_empty()).map(str::to_owned).collect();
            let suffixes = unit_suffixes(unit, &tokens, true);
            tokens.extend(suffixes);
            add_type_suffixes(&mut tokens, unit, kind);
            let joined = tokens.join("_");
            if joined.starts_with(|c: char| c.is_ascii_digit()) {
                format!("_{joined}")
            } else {
                joined
            }
        }
        TranslationStrategy::NoUTF8EscapingWithSuffixes => {
            let mut tokens: Vec<String> = name.split('_').filter(|t| !t.is_empty()).map(str::to_owned).collect();
            let suffixes = unit_suffixes(unit, &tokens, false);
            tokens.extend(suffixes);
            add_type_suffixes(&mut tokens, unit, kind);
            tokens.join("_")
        }
    }
}

fn add_type_suffixes(tokens: &mut Vec<String>, unit: &str, kind: Kind) {
    if kind == Kind::Counter {
        tokens.retain(|t| t != "total");
        tokens.push("total".into());
    }
    if unit == "1" && kind == Kind::Gauge {
        tokens.retain(|t| t != "ratio");
        tokens.push("ratio".into());
    }
}

/// The Prometheus label name of an attribute: characters outside `[a-zA-Z0-9_]` become `_`; a
/// leading digit gets `key_` before it, a single leading `_` gets `key` (`__` is kept).
pub fn label_name(name: &str, strategy: TranslationStrategy) -> String {
    if strategy != TranslationStrategy::UnderscoreEscapingWithSuffixes || name.is_empty() {
        return name.to_owned();
    }
    let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if clean.starts_with(|c: char| c.is_ascii_digit()) {
        format!("key_{clean}")
    } else if clean.starts_with('_') && !clean.starts_with("__") {
        format!("key{clean}")
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_follow_prometheus() {
        use Kind::*;
        let s = TranslationStrategy::UnderscoreEscapingWithSuffixes;
        for (name, unit, kind, want) in [
            ("http.server.request.duration", "s", Histogram, "http_server_request_duration_seconds"),
            ("http.server.requests", "{request}", Counter, "http_server_requests_total"),
            ("system.memory.usage", "By", UpDownSum, "system_memory_usage_bytes"),
            ("system.cpu.utilization", "1", Gauge, "system_cpu_utilization_ratio"),
            ("requests_total", "1", Counter, "requests_total"),
            ("throughput", "By/s", Gauge, "throughput_bytes_per_second"),
            ("latency_seconds", "s", Gauge, "latency_seconds"),
            ("queue-depth", "", Gauge, "queue_depth"),
            ("2xx.responses", "", Counter, "_2xx_responses_total"),
            ("temp", "Cel", Gauge, "temp_celsius"),
            ("odd__name", "", Gauge, "odd_name"),
        ] {
            assert_eq!(metric_name(name, unit, kind, s), want, "{name} [{unit}]");
        }
        assert_eq!(
            metric_name("http.server.duration", "ms", Histogram, TranslationStrategy::NoUTF8EscapingWithSuffixes),
            "http.server.duration_milliseconds"
        );
        assert_eq!(metric_name("a.b", "s", Counter, TranslationStrategy::NoTranslation), "a.b");
    }

    #[test]
    fn label_names_follow_prometheus() {
        let s = TranslationStrategy::UnderscoreEscapingWithSuffixes;
        for (name, want) in [
            ("http.method", "http_method"),
            ("k8s.pod.name", "k8s_pod_name"),
            ("0abc", "key_0abc"),
            ("_private", "key_private"),
            ("__reserved", "__reserved"),
            ("ok_name", "ok_name"),
        ] {
            assert_eq!(label_name(name, s), want);
        }
        assert_eq!(label_name("http.method", TranslationStrategy::NoTranslation), "http.method");
    }
}
