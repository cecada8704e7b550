//! What `/functions` lists (graphite-web's function catalog, which Grafana's Graphite data
//! source reads to offer functions and their parameters): for every function Strata has, its
//! group and parameters with graphite-web's parameter types (`seriesList`, `aggFunc`,
//! `nodeOrTag`...), written as a compact table: `name group param...`, a parameter being
//! `name:type`, then `!` (required), `*` (repeatable) or `=default` (a JSON value).

use serde_json::{json, Map, Value};

const TABLE: &str = r#"
absolute Transform seriesList:seriesList!
add Transform seriesList:seriesList! constant:float!
aggregate Combine seriesList:seriesList! func:aggFunc! xFilesFactor:float
aggregateLine Calculate seriesList:seriesList! func:aggFunc="average" keepStep:boolean=false
aggregateSeriesLists Combine seriesListFirstPos:seriesList! seriesListSecondPos:seriesList! func:aggFunc! xFilesFactor:float
aggregateWithWildcards Combine seriesList:seriesList! func:aggFunc! position:node*
alias Alias seriesList:seriesList! newName:string!
aliasByMetric Alias seriesList:seriesList!
aliasByNode Alias seriesList:seriesList! nodes:nodeOrTag!*
aliasByTags Alias seriesList:seriesList! tags:nodeOrTag!*
aliasQuery Alias seriesList:seriesList! search:string! replace:string! newName:string!
aliasSub Alias seriesList:seriesList! search:string! replace:string!
alpha Graph seriesList:seriesList! alpha:float!
applyByNode Combine seriesList:seriesList! nodeNum:nodeOrTag! templateFunction:string! newName:string
areaBetween Graph seriesList:seriesList!
asPercent Combine seriesList:seriesList! total:any nodes:nodeOrTag*
averageAbove FilterSeries seriesList:seriesList! n:float!
averageBelow FilterSeries seriesList:seriesList! n:float!
averageOutsidePercentile FilterSeries seriesList:seriesList! n:float!
averageSeries Combine seriesLists:seriesList!*
averageSeriesWithWildcards Combine seriesList:seriesList! position:node*
avg Combine seriesLists:seriesList!*
cactiStyle Special seriesList:seriesList! system:string units:string
changed Special seriesList:seriesList!
color Graph seriesList:seriesList! theColor:string!
consolidateBy Special seriesList:seriesList! consolidationFunc:string!
constantLine Special value:float!
countSeries Combine seriesLists:seriesList*
cumulative Special seriesList:seriesList!
currentAbove FilterSeries seriesList:seriesList! n:float!
currentBelow FilterSeries seriesList:seriesList! n:float!
dashed Graph seriesList:seriesList! dashLength:float=5
delay Transform seriesList:seriesList! steps:integer!
derivative Transform seriesList:seriesList!
diffSeries Combine seriesLists:seriesList!*
diffSeriesLists Combine seriesListFirstPos:seriesList! seriesListSecondPos:seriesList!
divideSeries Combine dividendSeriesList:seriesList! divisorSeries:seriesList!
divideSeriesLists Combine dividendSeriesList:seriesList! divisorSeriesList:seriesList!
drawAsInfinite Graph seriesList:seriesList!
events Special tags:string!*
exclude FilterSeries seriesList:seriesList! pattern:string!
exp Transform seriesList:seriesList!
exponentialMovingAverage Calculate seriesList:seriesList! windowSize:intOrInterval!
fallbackSeries Special seriesList:seriesList! fallback:seriesList!
filterSeries FilterSeries seriesList:seriesList! func:aggFunc! operator:string! threshold:float!
grep FilterSeries seriesList:seriesList! pattern:string!
group Combine seriesLists:seriesList*
groupByNode Combine seriesList:seriesList! nodeNum:nodeOrTag! callback:aggOrSeriesFunc="average"
groupByNodes Combine seriesList:seriesList! callback:aggOrSeriesFunc! nodes:nodeOrTag*
groupByTags Combine seriesList:seriesList! callback:aggOrSeriesFunc! tags:tag!*
highest FilterSeries seriesList:seriesList! n:integer! func:aggFunc="average"
highestAverage FilterSeries seriesList:seriesList! n:integer!
highestCurrent FilterSeries seriesList:seriesList! n:integer!
highestMax FilterSeries seriesList:seriesList! n:integer!
hitcount Transform seriesList:seriesList! intervalString:interval! alignToInterval:boolean=false
holtWintersAberration Calculate seriesList:seriesList! delta:integer=3 bootstrapInterval:interval="7d" seasonality:interval="1d"
holtWintersConfidenceArea Calculate seriesList:seriesList! delta:integer=3 bootstrapInterval:interval="7d" seasonality:interval="1d"
holtWintersConfidenceBands Calculate seriesList:seriesList! delta:integer=3 bootstrapInterval:interval="7d" seasonality:interval="1d"
holtWintersForecast Calculate seriesList:seriesList! bootstrapInterval:interval="7d" seasonality:interval="1d"
identity Calculate name:string!
integral Transform seriesList:seriesList!
interpolate Transform seriesList:seriesList! limit:intOrInf="__inf__"
invert Transform seriesList:seriesList!
isNonNull Transform seriesList:seriesList!
keepLastValue Transform seriesList:seriesList! limit:intOrInf="__inf__"
legendValue Alias seriesList:seriesList! valuesTypes:string*
limit FilterSeries seriesList:seriesList! n:integer!
linearRegression Calculate seriesList:seriesList! startSourceAt:date endSourceAt:date
lineWidth Graph seriesList:seriesList! width:float!
log Transform seriesList:seriesList! base:integer=10
logit Transform seriesList:seriesList!
lowest FilterSeries seriesList:seriesList! n:integer! func:aggFunc="average"
lowestAverage FilterSeries seriesList:seriesList! n:integer!
lowestCurrent FilterSeries seriesList:seriesList! n:integer!
map Combine seriesList:seriesList! mapNodes:nodeOrTag!*
mapSeries Combine seriesList:seriesList! mapNodes:nodeOrTag!*
maximumAbove FilterSeries seriesList:seriesList! n:float!
maximumBelow FilterSeries seriesList:seriesList! n:float!
maxSeries Combine seriesLists:seriesList!*
minimumAbove FilterSeries seriesList:seriesList! n:float!
minimumBelow FilterSeries seriesList:seriesList! n:float!
minMax Transform seriesList:seriesList!
minSeries Combine seriesLists:seriesList!*
mostDeviant FilterSeries seriesList:seriesList! n:integer!
movingAverage Calculate seriesList:seriesList! windowSize:intOrInterval! xFilesFactor:float
movingMax Calculate seriesList:seriesList! windowSize:intOrInterval! xFilesFactor:float
movingMedian Calculate seriesList:seriesList! windowSize:intOrInterval! xFilesFactor:float
movingMin Calculate seriesList:seriesList! windowSize:intOrInterval! xFilesFactor:float
movingSum Calculate seriesList:seriesList! windowSize:intOrInterval! xFilesFactor:float
movingWindow Calculate seriesList:seriesList! windowSize:intOrInterval! func:aggFunc="average" xFilesFactor:float
multiplySeries Combine seriesLists:seriesList!*
multiplySeriesLists Combine seriesListFirstPos:seriesList! seriesListSecondPos:seriesList!
multiplySeriesWithWildcards Combine seriesList:seriesList! position:node*
nonNegativeDerivative Transform seriesList:seriesList! maxValue:float minValue:float
nPercentile Calculate seriesList:seriesList! n:float!
offset Transform seriesList:seriesList! factor:float!
offsetToZero Transform seriesList:seriesList!
pct Combine seriesList:seriesList! total:any nodes:nodeOrTag*
percentileOfSeries Combine seriesList:seriesList! n:float! interpolate:boolean=false
perSecond Transform seriesList:seriesList! maxValue:float minValue:float
pow Transform seriesList:seriesList! factor:float!
powSeries Combine seriesLists:seriesList!*
randomWalk Special name:string! step:integer=60
randomWalkFunction Special name:string! step:integer=60
rangeOfSeries Combine seriesLists:seriesList!*
reduce Combine seriesLists:seriesLists! reduceFunction:string! reduceNode:node! reduceMatchers:string!*
reduceSeries Combine seriesLists:seriesLists! reduceFunction:string! reduceNode:node! reduceMatchers:string!*
removeAbovePercentile FilterData seriesList:seriesList! n:float!
removeAboveValue FilterData seriesList:seriesList! n:float!
removeBelowPercentile FilterData seriesList:seriesList! n:float!
removeBelowValue FilterData seriesList:seriesList! n:float!
removeBetweenPercentile FilterSeries seriesList:seriesList! n:float!
removeEmptySeries FilterSeries seriesList:seriesList! xFilesFactor:float
round Transform seriesList:seriesList! precision:integer=0
scale Transform seriesList:seriesList! factor:float!
scaleToSeconds Transform seriesList:seriesList! seconds:float!
secondYAxis Graph seriesList:seriesList!
seriesByTag Special tagExpressions:string!*
setXFilesFactor Special seriesList:seriesList! xFilesFactor:float!
sigmoid Transform seriesList:seriesList!
sin Transform name:string! amplitude:integer=1 step:integer=60
sinFunction Transform name:string! amplitude:integer=1 step:integer=60
smartSummarize Transform seriesList:seriesList! intervalString:interval! func:aggFunc="sum" alignTo:string
sortBy Sorting seriesList:seriesList! func:aggFunc="average" reverse:boolean=false
sortByMaxima Sorting seriesList:seriesList!
sortByMinima Sorting seriesList:seriesList!
sortByName Sorting seriesList:seriesList! natural:boolean=false reverse:boolean=false
sortByTotal Sorting seriesList:seriesList!
squareRoot Transform seriesList:seriesList!
stacked Graph seriesLists:seriesList! stack:string
stddevSeries Combine seriesLists:seriesList!*
stdev Calculate seriesList:seriesList! points:integer! windowTolerance:float=0.1
substr Special seriesList:seriesList! start:node=0 stop:node=0
sum Combine seriesLists:seriesList!*
summarize Transform seriesList:seriesList! intervalString:interval! func:aggFunc="sum" alignToFrom:boolean=false
sumSeries Combine seriesLists:seriesList!*
sumSeriesLists Combine seriesListFirstPos:seriesList! seriesListSecondPos:seriesList!
sumSeriesWithWildcards Combine seriesList:seriesList! position:node*
threshold Graph value:float! label:string color:string
time Transform name:string! step:integer=60
timeFunction Transform name:string! step:integer=60
timeShift Transform seriesList:seriesList! timeShift:interval! resetEnd:boolean=true alignDst:boolean=false
timeSlice Transform seriesList:seriesList! startSliceAt:date! endSliceAt:date="now"
timeStack Transform seriesList:seriesList! timeShiftUnit:interval="1d" timeShiftStart:integer=0 timeShiftEnd:integer=7
total Combine seriesLists:seriesList!*
transformNull Transform seriesList:seriesList! default:float=0 referenceSeries:seriesList
unique FilterSeries seriesLists:seriesList!*
useSeriesAbove FilterSeries seriesList:seriesList! value:float! search:string! replace:string!
weightedAverage Combine seriesListAvg:seriesList! seriesListWeight:seriesList! nodes:nodeOrTag*
xFilesFactor Special seriesList:seriesList! xFilesFactor:float!
"#;

/// graphite-web's names of its groups (the table writes them without spaces).
fn group_name(g: &str) -> &str {
    match g {
        "FilterSeries" => "Filter Series",
        "FilterData" => "Filter Data",
        other => other,
    }
}

/// `(name, group, params)` of every listed function.
fn entries() -> impl Iterator<Item = (&'static str, &'static str, Vec<Value>)> {
    TABLE.lines().filter(|l| !l.trim().is_empty()).map(|line| {
        let mut words = line.split_whitespace();
        let name = words.next().expect("a name");
        let group = group_name(words.next().expect("a group"));
        let params = words
            .map(|p| {
                let (p, default) = match p.split_once('=') {
                    Some((p, d)) => (p, Some(serde_json::from_str::<Value>(d).expect("a JSON default"))),
                    None => (p, None),
                };
                let (pname, kind) = p.split_once(':').expect("name:type");
                let kind_clean = kind.trim_end_matches(['!', '*']);
                let mut v = json!({"name": pname, "type": kind_clean});
                if kind.contains('!') {
                    v["required"] = json!(true);
                }
                if let Some(d) = default {
                    v["default"] = d;
                }
                if kind.contains('*') {
                    v["multiple"] = json!(true);
                }
                if pname == "operator" {
                    v["options"] = json!(["!=", "<", "<=", "=", ">", ">="]);
                }
                if pname == "consolidationFunc" {
                    v["options"] = json!(["sum", "average", "avg", "avg_zero", "min", "max", "first", "last"]);
                }
                v
            })
            .collect();
        (name, group, params)
    })
}

/// One function's entry, as graphite-web's `functionInfo` writes it.
fn info(name: &str, group: &str, params: Vec<Value>) -> Value {
    let args: Vec<String> = params
        .iter()
        .map(|p| {
            let n = p["name"].as_str().unwrap_or_default();
            if p.get("multiple").is_some() {
                format!("*{n}")
            } else if let Some(d) = p.get("default") {
                let d = d.to_string();
                format!("{n}={}", if d == INFINITY_MARK { "inf" } else { &d })
            } else {
                n.to_owned()
            }
        })
        .collect();
    json!({
        "name": name,
        "function": format!("{name}({})", args.join(", ")),
        "description": format!("graphite-web's {name}, as Strata evaluates it (docs/graphite.md)."),
        "module": "strata.graphite.functions",
        "group": group,
        "params": params,
    })
}

/// An infinite default, which JSON cannot spell: written `1e9999` as graphite-web writes it
/// (its readers take it for infinity).
const INFINITY_MARK: &str = "\"__inf__\"";

fn to_text(v: &Value) -> String {
    v.to_string().replace(INFINITY_MARK, "1e9999")
}

/// `/functions` as JSON text: every function by name, or by group (`grouped`), or only
/// `group`'s.
pub fn list(grouped: bool, group: Option<&str>) -> String {
    to_text(&list_value(grouped, group))
}

fn list_value(grouped: bool, group: Option<&str>) -> Value {
    let mut out = Map::new();
    for (name, g, params) in entries() {
        if group.is_some_and(|want| want != g) {
            continue;
        }
        let entry = info(name, g, params);
        if grouped {
            out.entry(g.to_owned()).or_insert_with(|| json!({}))[name] = entry;
        } else {
            out.insert(name.to_owned(), entry);
        }
    }
    Value::Object(out)
}

/// `/functions/<name>` as JSON text; `None` for a function Strata does not have.
pub fn details(name: &str) -> Option<String> {
    details_value(name).map(|v| to_text(&v))
}

fn details_value(name: &str) -> Option<Value> {
    entries().find(|(n, ..)| *n == name).map(|(n, g, p)| info(n, g, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_lists_exactly_the_functions_evaluated() {
        let listed: Vec<&str> = entries().map(|(n, ..)| n).collect();
        let mut want = super::super::FUNCTIONS.to_vec();
        want.sort_unstable_by_key(|n| n.to_lowercase());
        let mut got = listed.clone();
        got.sort_unstable_by_key(|n| n.to_lowercase());
        assert_eq!(got, want);
        let s = details_value("summarize").unwrap();
        assert_eq!(s["function"], "summarize(seriesList, intervalString, func=\"sum\", alignToFrom=false)");
        assert_eq!(s["params"][1], json!({"name": "intervalString", "type": "interval", "required": true}));
        assert_eq!(details_value("sumSeries").unwrap()["params"][0]["multiple"], true);
        assert_eq!(list_value(true, None)["Filter Series"]["limit"]["group"], "Filter Series");
        assert_eq!(list_value(false, Some("Alias")).as_object().unwrap().len(), 7);
        assert!(details("nosuch").is_none());
        let keep = details("keepLastValue").unwrap();
        assert!(keep.contains(r#""default":1e9999"#), "{keep}");
        assert_eq!(details_value("keepLastValue").unwrap()["function"], "keepLastValue(seriesList, limit=inf)");
    }
}
