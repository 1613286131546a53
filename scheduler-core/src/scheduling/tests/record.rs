//! The decision record's JSON: the keys the CLI and operators read.

use super::{cand, hashes, m, req, sched, FakePrefix};
use crate::types::Millis;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn record_serializes_filters_scores_totals_and_pick() {
    let s = sched(
        r#"{"plugins": [
        {"type": "utilization-filter", "name": "util", "parameters": {"conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.8}]}},
        {"type": "prefix-cache-scorer"}, {"type": "queue-scorer"}],
        "schedulingProfiles": [{"name": "main", "plugins": [{"pluginRef": "util"},
            {"pluginRef": "prefix-cache-scorer", "weight": 2}, {"pluginRef": "queue-scorer"}]}]}"#,
    );
    let (a, b, hot) = (m(1, 0, 0.2), m(3, 0, 0.3), m(0, 0, 0.9));
    let c = [
        cand("10.0.0.1:8000", Some(&a)),
        cand("10.0.0.2:8000", Some(&b)),
        cand("10.0.0.3:8000", Some(&hot)),
    ];
    let h = hashes(4);
    let prefix = FakePrefix::with(&[("10.0.0.2:8000", 4), ("10.0.0.3:8000", 4)]);
    let d = s.schedule(&req(&h), &c, &prefix, 9, Millis(5));
    let v = match serde_json::to_value(&d) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(v["picked"], "10.0.0.2:8000");
    assert_eq!(v["fallbacks"], serde_json::json!(["10.0.0.1:8000"]));
    assert_eq!(v["profile"], "main");
    assert_eq!(v["request"]["full_blocks"], 4);
    assert_eq!(v["candidates"][1]["prefix_matched_blocks"], 4);
    assert_eq!(v["candidates"][0]["metrics_known"], true);
    let p = &v["profiles"][0];
    assert_eq!(p["filters"][0]["plugin"], "util");
    assert_eq!(
        p["filters"][0]["dropped"],
        serde_json::json!(["10.0.0.3:8000"])
    );
    assert_eq!(p["filters"][0]["outcome"]["note"], "applied");
    let prefix_scores = &p["scorers"][0]["scores"];
    assert_eq!(p["scorers"][0]["weight"], 2.0);
    assert_eq!(prefix_scores["10.0.0.2:8000"]["raw"], 1.0);
    assert_eq!(prefix_scores["10.0.0.2:8000"]["weighted"], 2.0);
    assert!(
        prefix_scores.get("10.0.0.3:8000").is_none(),
        "dropped endpoints are not scored"
    );
    assert_eq!(p["scorers"][1]["scores"]["10.0.0.1:8000"]["raw"], 1.0);
    assert_eq!(p["totals"]["10.0.0.1:8000"], 1.0);
    assert_eq!(p["totals"]["10.0.0.2:8000"], 2.0);
    assert_eq!(p["picker"]["type"], "max-score-picker");
    assert_eq!(p["picked"], "10.0.0.2:8000");
}

#[test]
fn empty_decision_serializes_picked_null() {
    let s = sched("{}");
    let h = hashes(1);
    let d = s.schedule(&req(&h), &[], &FakePrefix::default(), 0, Millis(0));
    let v = serde_json::to_value(&d).ok();
    assert_eq!(v.as_ref().map(|v| v["picked"].is_null()), Some(true));
    assert_eq!(
        v.map(|v| v["profiles"][0]["totals"].clone()),
        Some(serde_json::json!({}))
    );
}
