//! The `model_rewrites` target: the model rewrite's two parsers on any bytes — the
//! `InferenceModelRewrite` compiler (`infergate_filters::rewrite::Rewrites::compile`) and
//! the body rewriter that replaces a request's `model` in place
//! (`infergate_filters::rewrite::body::rewrite_model`).

use infergate_filters::rewrite::body::rewrite_model;
use infergate_filters::rewrite::Rewrites;
use infergate_filters::router::PoolModels;
use serde_json::Value;

/// The target every rewrite writes: quotes and a backslash, so the replacement must be
/// escaped to stay JSON.
const TARGET: &str = "v2 \"fp8\" \\ canary";

/// The pools the objects are compiled against (the seed's pool and adapters).
fn pools() -> Vec<PoolModels> {
    vec![PoolModels {
        name: "llama-70b-bf16".into(),
        base_model: "llama".into(),
        adapters: vec!["support-assistant-v1".into(), "support-assistant-v2".into()],
        block_size_tokens: None,
    }]
}

/// Any bytes, twice:
/// - as a request body: the rewriter never panics, and when the body is a JSON object with
///   a string `model`, its answer is JSON whose top-level members are the original's with
///   `model` = the target (the parse a JSON reader would make of the original; any other
///   answer is `None`);
/// - as JSON `InferenceModelRewrite` objects (an array, or one object): the compiler answers
///   rules or an error naming where, never a panic; every rule it keeps chooses a target
///   the pool serves, sticky and per request.
pub fn model_rewrites(data: &[u8]) {
    body(data);
    objects(data);
}

fn body(data: &[u8]) {
    let rewritten = rewrite_model(data, TARGET);
    let original = serde_json::from_slice::<Value>(data).ok();
    let Some(mut want) = original
        .and_then(|v| match v {
            Value::Object(members) => Some(members),
            _ => None,
        })
        .filter(|members| members.get("model").is_some_and(Value::is_string))
    else {
        // Not a request the router would rewrite: whatever the scanner made of it, the
        // router only rewrites bodies it parsed first.
        return;
    };
    assert!(
        rewritten.is_some(),
        "a JSON object with a string model was not rewritten"
    );
    let out = rewritten.unwrap_or_default();
    let got = match serde_json::from_slice::<Value>(&out) {
        Ok(Value::Object(members)) => Some(members),
        _ => None,
    };
    assert!(got.is_some(), "the rewritten body is not a JSON object");
    let mut got = got.unwrap_or_default();
    assert_eq!(got.remove("model"), Some(Value::String(TARGET.into())));
    want.remove("model");
    assert_eq!(got, want, "the rewrite changed another member");
}

fn objects(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let objects = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    let pools = pools();
    let rewrites = match Rewrites::compile(&objects, &pools) {
        Ok(rewrites) => rewrites,
        Err(error) => {
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    let served = ["llama", "support-assistant-v1", "support-assistant-v2"];
    for target in rewrites.targets() {
        assert!(served.contains(&target), "target {target} is not served");
    }
    let text = String::from_utf8_lossy(data);
    for model in served
        .iter()
        .copied()
        .chain([text.as_ref(), "support-assistant"])
    {
        if let Some(rule) = rewrites.rule("llama", model) {
            for key in [None, Some(data), Some(&b""[..])] {
                let chosen = rule.choose(key, data.len() as u64);
                assert!(chosen.is_some_and(|t| t.weight > 0), "{model}: {chosen:?}");
            }
        }
    }
}
