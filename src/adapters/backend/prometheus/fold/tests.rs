use proptest::prelude::*;

use super::*;
use crate::adapters::backend::prometheus::response::{classify, QueryResult, Sample};

fn plan_all(texts: &[&str]) -> Vec<Fetch> {
    plan(texts, |_| false, FoldLimits::UNBOUNDED)
}

/// Members `{v}` of `template` for each value, quoted as PromQL strings.
fn members(template: &str, values: &[&str]) -> Vec<String> {
    values.iter().map(|v| template.replace("{v}", &format!("\"{}\"", quote_body(v)))).collect()
}

/// The one folded query `texts` plan into, which must take them all.
fn the_fold(texts: &[String]) -> FoldedQuery {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    match plan_all(&refs).as_slice() {
        [Fetch::Folded(folded)] => folded.clone(),
        other => panic!("expected one folded query for {texts:?}, got {other:?}"),
    }
}

/// The regex of a folded query's matcher on its label, decoded from the query's text.
fn regex_of(folded: &FoldedQuery) -> String {
    let tokens = tokenize(&folded.text).unwrap();
    let at = tokens
        .windows(3)
        .position(|w| w[0].text == folded.label && w[1].text == "=~" && w[2].kind == Kind::Str)
        .unwrap_or_else(|| panic!("no {}=~ in {}", folded.label, folded.text));
    unquote(tokens[at + 2].text).unwrap()
}

fn anchored(folded: &FoldedQuery) -> regex::Regex {
    regex::Regex::new(&format!("^(?:{})$", regex_of(folded))).unwrap()
}

#[test]
fn each_aggregation_folds_by_the_label_that_varies() {
    let values = ["web-1", "web-2", "web-3"];
    for (template, expected) in [
        (
            "sum(rate(http_requests_total{namespace=\"prod\",deployment={v}}[1m]))",
            "sum by (deployment)(rate(http_requests_total{namespace=\"prod\",deployment=~\"web-1|web-2|web-3\"}[1m]))",
        ),
        ("avg(load{d={v}})", "avg by (d)(load{d=~\"web-1|web-2|web-3\"})"),
        ("min (load{d={v}} )", "min by (d) (load{d=~\"web-1|web-2|web-3\"} )"),
        ("MAX(load{d={v}})", "MAX by (d)(load{d=~\"web-1|web-2|web-3\"})"),
        ("count(up{job=\"x\", d={v},})", "count by (d)(up{job=\"x\", d=~\"web-1|web-2|web-3\",})"),
        ("stddev(load{d={v}})", "stddev by (d)(load{d=~\"web-1|web-2|web-3\"})"),
        ("stdvar(load{d={v}})", "stdvar by (d)(load{d=~\"web-1|web-2|web-3\"})"),
        ("quantile(0.9, load{d={v}})", "quantile by (d)(0.9, load{d=~\"web-1|web-2|web-3\"})"),
        (
            "histogram_quantile(0.9, sum by (le) (rate(lat_bucket{d={v}}[5m])))",
            "histogram_quantile(0.9, sum by (d, le) (rate(lat_bucket{d=~\"web-1|web-2|web-3\"}[5m])))",
        ),
        (
            "histogram_quantile(0.9, sum(rate(lat_bucket{d={v}}[5m])) by (le))",
            "histogram_quantile(0.9, sum(rate(lat_bucket{d=~\"web-1|web-2|web-3\"}[5m])) by (d, le))",
        ),
        (
            "histogram_quantile(0.5, sum(rate(lat{d={v}}[5m])))",
            "histogram_quantile(0.5, sum by (d)(rate(lat{d=~\"web-1|web-2|web-3\"}[5m])))",
        ),
        (
            "max(clamp_min(irate(x_total{d={v}}[30s] offset 1m), 0))",
            "max by (d)(clamp_min(irate(x_total{d=~\"web-1|web-2|web-3\"}[30s] offset 1m), 0))",
        ),
        (
            "sum(quantile_over_time(0.5, x{d={v}}[5m]))",
            "sum by (d)(quantile_over_time(0.5, x{d=~\"web-1|web-2|web-3\"}[5m]))",
        ),
        ("avg(round(abs(x{d={v}}), 0.1))", "avg by (d)(round(abs(x{d=~\"web-1|web-2|web-3\"}), 0.1))"),
        (
            "sum(predict_linear(x{d={v}}[10m] @ end(), 60))",
            "sum by (d)(predict_linear(x{d=~\"web-1|web-2|web-3\"}[10m] @ end(), 60))",
        ),
        (
            "sum(clamp(increase(x{d={v}}[1h] offset -5m), -1, 1e3))",
            "sum by (d)(clamp(increase(x{d=~\"web-1|web-2|web-3\"}[1h] offset -5m), -1, 1e3))",
        ),
        ("sum(x:rate5m{d={v}} @ 1700000000)", "sum by (d)(x:rate5m{d=~\"web-1|web-2|web-3\"} @ 1700000000)"),
    ] {
        let folded = the_fold(&members(template, &values));
        assert_eq!(folded.text, expected, "{template}");
        let ordered: Vec<(String, usize)> = values.iter().enumerate().map(|(i, v)| (v.to_string(), i)).collect();
        assert_eq!(folded.members, ordered, "{template}");
        assert_eq!(folded.label, expected.split("by (").nth(1).unwrap().split([',', ')']).next().unwrap());
    }
}

#[test]
fn a_dated_shape_asks_each_groups_data_time_and_others_stay_undated() {
    let folded = the_fold(&members("sum(queue{ns=\"p\",d={v}})", &["a", "b"]));
    assert_eq!(folded.text, "sum by (d)(queue{ns=\"p\",d=~\"a|b\"})");
    assert_eq!(
        folded.sent,
        "(sum by (d)(queue{ns=\"p\",d=~\"a|b\"})) or label_replace(min by (d) (timestamp(queue{ns=\"p\",d=~\"a|b\"})), \
         \"watermarkd_sample\", \"time\", \"\", \"\")"
    );
    // Undated alone (rate, quantile, offsets), undated folded.
    for template in ["sum(rate(x{d={v}}[1m]))", "quantile(0.5, x{d={v}})", "sum(x{d={v}} offset 1m)"] {
        let folded = the_fold(&members(template, &["a", "b"]));
        assert_eq!(folded.sent, folded.text, "{template}");
    }
}

#[test]
fn what_would_compute_something_else_is_never_folded() {
    for template in [
        "topk(3, x{d={v}})",
        "bottomk(3, x{d={v}})",
        "limitk(2, x{d={v}})",
        "limit_ratio(0.5, x{d={v}})",
        "sum(topk(3, x{d={v}}))",
        "absent(x{d={v}})",
        "absent_over_time(x{d={v}}[5m])",
        "sum(absent(x{d={v}}))",
        "scalar(sum(x{d={v}}))",
        "sum(x{d={v}}) or vector(0)",
        "sum(x{d={v}} or vector(0))",
        "vector(1)",
        "sum(x{d={v}}) / sum(y{d={v}})",
        "sum(x{d={v}}) + 1",
        "sum(x{d={v}} * 2)",
        "sum(x{d={v}} > 0)",
        "sum(x{d={v}} and y)",
        "sum(x{d={v}} unless y)",
        "-sum(x{d={v}})",
        "(sum(x{d={v}}))",
        "sum without (pod) (x{d={v}})",
        "sum by (pod) (x{d={v}})",
        "sum(x{d={v}}) by (pod)",
        "sum(x{d={v}}) without (pod)",
        "sum by (d) (x{d={v}})",
        "sum(label_replace(x{d={v}}, \"d\", \"$1\", \"pod\", \"(.*)\"))",
        "sum(label_join(x{d={v}}, \"e\", \",\", \"pod\"))",
        "sum(max_over_time(x{d={v}}[5m:1m]))",
        "sum(x{d={v}})[5m:1m]",
        "sum(x{d={v}}) # a comment",
        "sum({d={v}})",
        "sum({__name__=\"x\",d={v}})",
        "sum(x{__name__=~\"x|y\",d={v}})",
        "count_values(\"v\", x{d={v}})",
        "sum(sort(x{d={v}}))",
        "sum(sum(x{d={v}}))",
        "sum(sum by (pod) (x{d={v}}))",
        "sum(no_such_function(x{d={v}}))",
        "sum(RATE(x{d={v}}[5m]))",
        "sum(clamp_min(x{d={v}}, scalar(y)))",
        "sum(rate(x{d={v}}))",
        "sum(x{d={v}}[5m])",
        "sum(x{d={v}, d=\"z\"})",
        "sum(x{d={v}} offset 1m offset 2m)",
        "histogram_quantile(0.9, sum by (le, pod) (rate(x{d={v}}[5m])))",
        "histogram_quantile(0.9, rate(x{d={v}}[5m]))",
        "histogram_quantile(0.9, max by (le) (x{d={v}}))",
        "sum(x{d={v}}) > 0",
        "sum(x{d={v}} @ foo())",
        "sum(x{d={v} or e=\"y\"})",
        "sum(x{\"d.e\"={v}})",
        "sum(x{d={v}})\n;",
    ] {
        let texts = members(template, &["a", "b", "c"]);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        assert_eq!(plan_all(&refs), [Fetch::Alone(0), Fetch::Alone(1), Fetch::Alone(2)], "{template}");
    }
}

#[test]
fn members_that_differ_elsewhere_or_not_on_a_plain_matcher_go_alone() {
    for texts in [
        // Regex and negative matchers on the varying label.
        ["sum(x{d=~\"a\"})", "sum(x{d=~\"b\"})"],
        ["sum(x{d!=\"a\"})", "sum(x{d!=\"b\"})"],
        ["sum(x{d!~\"a\"})", "sum(x{d!~\"b\"})"],
        ["sum(x{d=\"a\"})", "sum(x{d=~\"b\"})"],
        // Different offsets, ranges, functions, aggregations, parameters, metrics.
        ["sum(x{d=\"a\"} offset 5m)", "sum(x{d=\"b\"} offset 10m)"],
        ["sum(x{d=\"a\"} offset 5m)", "sum(x{d=\"b\"})"],
        ["sum(rate(x{d=\"a\"}[1m]))", "sum(rate(x{d=\"b\"}[5m]))"],
        ["sum(rate(x{d=\"a\"}[1m]))", "sum(irate(x{d=\"b\"}[1m]))"],
        ["sum(x{d=\"a\"})", "avg(x{d=\"b\"})"],
        ["quantile(0.9, x{d=\"a\"})", "quantile(0.5, x{d=\"b\"})"],
        ["sum(x{d=\"a\"})", "sum(y{d=\"b\"})"],
        // Two labels' values differ.
        ["sum(x{ns=\"p\",d=\"a\"})", "sum(x{ns=\"q\",d=\"b\"})"],
        // Other matchers differ in kind or order.
        ["sum(x{ns=~\"p\",d=\"a\"})", "sum(x{ns=\"p\",d=\"b\"})"],
        ["sum(x{ns=\"p\",d=\"a\"})", "sum(x{d=\"b\",ns=\"p\"})"],
        // An empty value matches series without the label: not a member.
        ["sum(x{d=\"\"})", "sum(x{d=\"b\"})"],
    ] {
        assert_eq!(plan_all(&texts), [Fetch::Alone(0), Fetch::Alone(1)], "{texts:?}");
    }
    // A single member gains nothing.
    assert_eq!(plan_all(&["sum(x{d=\"a\"})"]), [Fetch::Alone(0)]);
    assert_eq!(plan_all(&[]), []);
    // The same offsets fold.
    assert!(matches!(
        plan_all(&["sum(x{d=\"a\"} offset 5m)", "sum(x{d=\"b\"} offset 5m)"]).as_slice(),
        [Fetch::Folded(_)]
    ));
}

#[test]
fn with_two_varying_labels_the_one_that_gathers_most_is_chosen() {
    let texts = [
        "sum(x{ns=\"prod\",d=\"web-1\"})",
        "sum(x{ns=\"prod\",d=\"web-2\"})",
        "sum(x{ns=\"staging\",d=\"web-1\"})",
        "sum(x{ns=\"prod\",d=\"web-3\"})",
        "sum(y)",
    ];
    let plan = plan_all(&texts);
    let [Fetch::Folded(folded), Fetch::Alone(2), Fetch::Alone(4)] = plan.as_slice() else { panic!("{plan:?}") };
    assert_eq!(folded.label, "d");
    assert_eq!(folded.text, "sum by (d)(x{ns=\"prod\",d=~\"web-1|web-2|web-3\"})");
    assert_eq!(folded.members.iter().map(|(_, i)| *i).collect::<Vec<_>>(), [0, 1, 3]);

    let texts = [
        "sum(x{ns=\"a\",d=\"web\"})",
        "sum(x{ns=\"b\",d=\"web\"})",
        "sum(x{ns=\"c\",d=\"web\"})",
        "sum(x{ns=\"a\",d=\"api\"})",
    ];
    let plan = plan_all(&texts);
    let [Fetch::Folded(folded), Fetch::Alone(3)] = plan.as_slice() else { panic!("{plan:?}") };
    assert_eq!(folded.label, "ns");

    // A second pass folds what the first left, on the other label.
    let texts = [
        "sum(x{ns=\"prod\",d=\"web-1\"})",
        "sum(x{ns=\"prod\",d=\"web-2\"})",
        "sum(x{ns=\"prod\",d=\"web-3\"})",
        "sum(x{ns=\"dev\",d=\"api\"})",
        "sum(x{ns=\"qa\",d=\"api\"})",
    ];
    let plan = plan_all(&texts);
    let [Fetch::Folded(first), Fetch::Folded(second)] = plan.as_slice() else { panic!("{plan:?}") };
    assert_eq!((first.label.as_str(), second.label.as_str()), ("d", "ns"));
    assert_eq!(second.text, "sum by (ns)(x{ns=~\"dev|qa\",d=\"api\"})");
}

#[test]
fn texts_that_differ_only_in_spacing_share_their_value() {
    let texts = ["sum(x{d=\"a\"})", "sum( x{ d = \"a\" } )", "sum(x{d=\"b\"})"];
    let folded = the_fold(texts.map(String::from).as_ref());
    assert_eq!(regex_of(&folded), "a|b");
    assert_eq!(folded.members, [("a".to_string(), 0), ("a".to_string(), 1), ("b".to_string(), 2)]);
}

#[test]
fn values_are_escaped_for_the_regex_and_for_the_string() {
    let values = ["a.b", "x|y", "q\"uote", "back\\slash", "tab\there", "ünï", "(.*)", "$^[]{}+?", "'single'"];
    let folded = the_fold(&members("sum(x{d={v}})", &values));
    let regex = anchored(&folded);
    for value in values {
        assert!(regex.is_match(value), "{value:?} in {}", folded.text);
    }
    for other in ["aXb", "x", "y", "", "a.bc", "ab", "back\\\\slash", "anything"] {
        assert!(!regex.is_match(other), "{other:?} matched {}", folded.text);
    }
    // Every quote style and escape of the members is read as PromQL reads it.
    let texts =
        ["sum(x{d='it\\'s'})", "sum(x{d=`raw\\n`})", "sum(x{d=\"\\x41\\101\\u00e9\\U0001F600\"})", "sum(x{d=\"z\"})"];
    let folded = the_fold(texts.map(String::from).as_ref());
    let values: Vec<&str> = folded.members.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(values, ["it's", "raw\\n", "AAé😀", "z"]);
    let regex = anchored(&folded);
    assert!(values.iter().all(|v| regex.is_match(v)), "{}", folded.text);
}

#[test]
fn strings_are_read_as_promql_reads_them() {
    assert_eq!(unquote("\"a\\\"b\"").as_deref(), Some("a\"b"));
    assert_eq!(unquote("'a\\'b'").as_deref(), Some("a'b"));
    assert_eq!(unquote("`a\\b`").as_deref(), Some("a\\b"));
    assert_eq!(unquote("\"\\t\\n\\\\\"").as_deref(), Some("\t\n\\"));
    // What this does not know is not guessed.
    for literal in ["\"\\xff\"", "\"\\q\"", "\"\\'\"", "'\\\"'", "\"\\u12\"", "\"\\ud800\"", "\"\\400\""] {
        assert_eq!(unquote(literal), None, "{literal}");
    }
    assert!(tokenize("x{a=\"unterminated}").is_none());
    assert!(tokenize("x{a=\"line\nbreak\"}").is_none());
    let tokens = tokenize("rate(x[1h30m]) 1e-3 .5 0x1f").unwrap();
    let texts: Vec<&str> = tokens.iter().map(|t| t.text).collect();
    assert_eq!(texts, ["rate", "(", "x", "[", "1h30m", "]", ")", "1e-3", ".5", "0x1f"]);
}

#[test]
fn long_member_lists_split_under_the_size_limit_each_member_once() {
    let values: Vec<String> = (0..3_000).map(|i| format!("deployment-number-{i:05}")).collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    for template in ["sum(queue{namespace=\"prod\",deployment={v}})", "sum(rate(x{deployment={v}}[1m]))"] {
        let texts = members(template, &refs);
        let text_refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let plan = plan_all(&text_refs);
        assert!(plan.len() > 2, "{template}: {} requests", plan.len());
        let mut seen = Vec::new();
        for (n, fetch) in plan.iter().enumerate() {
            let Fetch::Folded(folded) = fetch else { panic!("{template}: {fetch:?} alone") };
            assert!(folded.sent.len() < MAX_FOLDED_BYTES, "{}", folded.sent.len());
            // Full but for the last: one more member would not have fitted.
            if n + 1 < plan.len() {
                assert!(folded.sent.len() + 2 * 24 >= MAX_FOLDED_BYTES, "{template}: only {} bytes", folded.sent.len());
            }
            seen.extend(folded.members.iter().map(|(_, i)| *i));
        }
        assert_eq!(seen, (0..values.len()).collect::<Vec<_>>(), "{template}");
    }
    // One member too long to share a query goes alone; the rest still fold.
    let long = "v".repeat(MAX_FOLDED_BYTES);
    let texts = members("sum(x{d={v}})", &[&long, "a", "b"]);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let plan = plan_all(&refs);
    assert_eq!(plan.len(), 2, "{:?}", plan.iter().map(|f| matches!(f, Fetch::Alone(_))).collect::<Vec<_>>());
    assert_eq!(plan.first(), Some(&Fetch::Alone(0)));
}

#[test]
fn a_fold_stays_within_its_regex_and_member_bounds() {
    // 300 deployments of 24-byte names: 7.5 KB of regex, over Mimir's 4,096 bytes for sharding.
    let values: Vec<String> = (0..300).map(|d| format!("checkout-service-web-{d:03}")).collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    let texts = members("sum(rate(x{namespace=\"prod\",deployment={v}}[1m]))", &refs);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let limits = FoldLimits { max_regex_bytes: 4_096, max_members: usize::MAX };
    let planned = plan(&texts, |_| false, limits);
    let folds: Vec<&FoldedQuery> = planned
        .iter()
        .map(|fetch| match fetch {
            Fetch::Folded(folded) => folded,
            Fetch::Alone(i) => panic!("{i} alone"),
        })
        .collect();
    assert_eq!(folds.len(), 2, "7.5 KB of regex in two");
    for (n, folded) in folds.iter().enumerate() {
        let regex = regex_of(folded);
        assert!(regex.len() <= 4_096, "{}", regex.len());
        // Full but for the last: one more member would have passed the bound.
        if n + 1 < folds.len() {
            assert!(regex.len() + 1 + 24 > 4_096, "only {} bytes", regex.len());
        }
    }
    let mut seen: Vec<usize> = folds.iter().flat_map(|f| f.members.iter().map(|(_, i)| *i)).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..300).collect::<Vec<_>>());
    // The bound is on the regex as the server reads it: escapes count, the string's quoting not.
    let dotted = members("sum(x{d={v}})", &["a.b", "c.d", "e\\f"]);
    let dotted: Vec<&str> = dotted.iter().map(String::as_str).collect();
    let exact = FoldLimits { max_regex_bytes: "a\\.b|c\\.d|e\\\\f".len(), max_members: usize::MAX };
    assert!(matches!(plan(&dotted, |_| false, exact).as_slice(), [Fetch::Folded(_)]));
    let short = FoldLimits { max_regex_bytes: exact.max_regex_bytes - 1, ..exact };
    assert!(matches!(plan(&dotted, |_| false, short).as_slice(), [Fetch::Folded(_), Fetch::Alone(2)]));
    // A value longer than the bound on its own goes alone.
    let long = "v".repeat(5_000);
    let texts = members("sum(x{d={v}})", &[&long, "a", "b"]);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert!(matches!(plan(&texts, |_| false, limits).as_slice(), [Fetch::Alone(0), Fetch::Folded(_)]));

    // By count: 300 members at most 128 a query.
    let texts = members("sum(rate(x{namespace=\"prod\",deployment={v}}[1m]))", &refs);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let counted = FoldLimits { max_regex_bytes: usize::MAX, max_members: 128 };
    let sizes: Vec<usize> = plan(&texts, |_| false, counted)
        .iter()
        .map(|fetch| match fetch {
            Fetch::Folded(folded) => folded.members.len(),
            Fetch::Alone(_) => 1,
        })
        .collect();
    assert_eq!(sizes, [128, 128, 44]);
}

#[test]
fn refused_shapes_go_alone_and_other_shapes_still_fold() {
    let texts = ["sum(x{d=\"a\"})", "sum(x{d=\"b\"})", "sum(y{d=\"a\"})", "sum(y{d=\"b\"})"];
    let plan = plan_all(&texts);
    let [Fetch::Folded(x), Fetch::Folded(_)] = plan.as_slice() else { panic!("{plan:?}") };
    let refused = x.shape.clone();
    let partly = super::plan(&texts, |shape| shape == refused, FoldLimits::UNBOUNDED);
    assert!(matches!(partly.as_slice(), [Fetch::Alone(0), Fetch::Alone(1), Fetch::Folded(_)]), "{partly:?}");
}

/// An instant-query answer with one series per `(value of d, sample value)`, and for a dated
/// query each series' data time.
fn answer_body(series: &[(&str, String)], dated: bool) -> String {
    let mut result: Vec<String> = Vec::new();
    for (label, value) in series {
        let label = serde_json::to_string(label).unwrap();
        result.push(format!(r#"{{"metric":{{"d":{label}}},"value":[100,"{value}"]}}"#));
        if dated {
            result.push(format!(r#"{{"metric":{{"d":{label},"watermarkd_sample":"time"}},"value":[100,"{value}"]}}"#));
        }
    }
    format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#, result.join(","))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the values, every member is planned exactly once; a folded query's regex
    /// matches exactly its members' values; and its answer maps back to exactly its members,
    /// each its own series, a member missing from the answer with none.
    #[test]
    fn folding_then_mapping_returns_exactly_the_members(
        values in proptest::collection::btree_set("[a-z0-9.|*\\\\\"'()\\[\\]{}^$+?é -]{1,10}", 1..40),
        shape in 0..3usize,
        missing in any::<proptest::sample::Index>(),
    ) {
        let template = ["sum(x{ns=\"p\",d={v}})", "max(rate(x_total{d={v}}[1m]))", "histogram_quantile(0.9, sum by (le) (x_bucket{d={v}}))"][shape];
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let texts = members(template, &values);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let plan = plan_all(&refs);
        let missing = *missing.get::<&str>(&values);

        let mut planned: Vec<usize> = Vec::new();
        for fetch in &plan {
            match fetch {
                Fetch::Alone(i) => planned.push(*i),
                Fetch::Folded(folded) => {
                    let regex = anchored(folded);
                    let mine: Vec<&str> = folded.members.iter().map(|(v, _)| v.as_str()).collect();
                    for value in &values {
                        prop_assert_eq!(regex.is_match(value), mine.contains(value), "{:?} in {}", value, folded.text);
                    }
                    for (value, i) in &folded.members {
                        prop_assert_eq!(values.get(*i).copied(), Some(value.as_str()));
                    }
                    // Every value answered, but one; in reverse order, position means nothing.
                    let mut series: Vec<(&str, String)> = Vec::new();
                    for (i, value) in values.iter().enumerate().rev() {
                        if *value != missing {
                            series.push((value, i.to_string()));
                        }
                    }
                    let dated = folded.sent != folded.text;
                    let body = answer_body(&series, dated);
                    let answer = classify(200, body.as_bytes(), "http://prom", Some(folded.label.as_str())).unwrap();
                    let parts = answer.split(mine.iter().copied()).unwrap();
                    prop_assert_eq!(parts.len(), mine.len());
                    for (value, i) in &folded.members {
                        let part = &parts[value.as_str()];
                        let QueryResult::Vector(samples) = &part.result else { panic!("{part:?}") };
                        if value == missing {
                            prop_assert!(samples.is_empty());
                            prop_assert!(part.sample_times.is_empty());
                        } else {
                            let own = Sample::Float { at_seconds: 100.0, value: i.to_string() };
                            prop_assert_eq!(samples.as_slice(), [own.clone()]);
                            prop_assert_eq!(part.sample_times.clone(), if dated { vec![own] } else { vec![] });
                        }
                    }
                    planned.extend(folded.members.iter().map(|(_, i)| *i));
                }
            }
        }
        planned.sort_unstable();
        prop_assert_eq!(planned, (0..values.len()).collect::<Vec<_>>());
        // Two members or more always fold: they differ only in the value of d.
        if values.len() > 1 {
            prop_assert!(plan.iter().all(|f| matches!(f, Fetch::Folded(_))), "{:?}", plan);
        }
    }

    /// The recogniser takes any text, and any jumble of PromQL's pieces, without panicking, and
    /// plans each exactly once.
    #[test]
    fn any_text_is_planned_without_panicking(
        mut texts in proptest::collection::vec(".{0,60}", 0..6),
        jumbles in proptest::collection::vec(proptest::collection::vec(proptest::sample::select(vec![
            "sum", "quantile", "histogram_quantile", "rate", "clamp_min", "by", "without", "le", "offset", "@",
            "(", ")", "{", "}", "[", "]", ",", "=", "=~", "!=", "x", "d", "\"a\"", "\"b\"", "'c'", "`d`",
            "\"\\x41\"", "0.5", "5m", "-", "+", " ", "start()", "or", "vector(0)", "#",
        ]), 0..24), 0..6),
    ) {
        texts.extend(jumbles.iter().map(|pieces| pieces.concat()));
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let plan = plan_all(&refs);
        let mut planned: Vec<usize> = plan.iter().flat_map(|f| match f {
            Fetch::Alone(i) => vec![*i],
            Fetch::Folded(folded) => folded.members.iter().map(|(_, i)| *i).collect(),
        }).collect();
        planned.sort_unstable();
        prop_assert_eq!(planned, (0..texts.len()).collect::<Vec<_>>());
    }
}
