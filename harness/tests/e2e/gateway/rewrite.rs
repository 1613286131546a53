//! Both flavours: the model rewrite and its split, and `/v1/models`, through a real Envoy
//! over the engine simulator.
//!
//! One pool serves base `sim-model` and the adapters `support-assistant-v1` and `-v2`
//! (two simulated replicas); the router has the seed's `InferenceModelRewrite`: clients
//! ask for `support-assistant`, 90% of them get v1 and 10% v2. The simulator refuses a
//! model it does not serve and echoes the `model` it received in every response (and
//! every stream chunk), so a response says which target the engine was asked for.
//!
//! - Sticky (session header `x-session-id`): of 1,000 sessions of two turns, 10 ± 2% are on
//!   v2, and both turns of every session reach the same target. A client-sent
//!   `x-llm-d-model-name-rewrite` changes nothing. Every request is a tenant's (API key),
//!   so the billing record shows the sent model and the target; a stream shows the usage
//!   stage forcing usage on the rewritten body (the engine reports usage per chunk).
//! - Per request: the same sessions switch targets between turns.
//! - `GET /v1/models` lists every served name (the base model, both adapters, the
//!   rewrite's name), `GET /v1/models/{id}` answers one or 404; the official `openai`
//!   Python client lists, retrieves and completes through the gateway.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::tag;
use crate::support::gw::billing_records;
use crate::support::objects::{objective, tenant_quota};
use crate::support::workers;
use infergate_cli::config::bootstrap::pool_cluster_name;
use infergate_cli::config::rewrites::{Split, SplitMode};
use infergate_cli::config::tenancy::Tenancy;
use infergate_harness::launch::client::{get, post_json, request};
use infergate_harness::launch::{Backends, EnvoyOptions, Flavor, PoolSpec, Stack, StackOptions};
use infergate_harness::sim::SimConfig;

const BASE: &str = "sim-model";
const ALIAS: &str = "support-assistant";
const V1: &str = "support-assistant-v1";
const V2: &str = "support-assistant-v2";
const SESSION: &str = "x-session-id";
const KEY: &str = "sk-infergate-e2e-rewrite";
/// Requests in flight at once.
const IN_FLIGHT: usize = 32;

for_each_flavour!(
    a_sticky_rewrite_puts_a_tenth_of_sessions_on_the_canary_and_keeps_each_on_one_target,
    a_per_request_rewrite_switches_targets_within_sessions,
    v1_models_lists_every_served_name_and_the_openai_client_reads_it,
);

/// The seed's object, naming the launcher's pool.
fn seed_rewrite() -> Value {
    let path =
        infergate_artefacts::workspace_root().join("testdata/rewrite/inferencemodelrewrite.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut object: Value = serde_yaml_ng::from_str(&text).unwrap();
    object["spec"]["poolRef"]["name"] = json!(pool_cluster_name(0, BASE));
    object
}

fn billing_path(flavor: Flavor, what: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "infergate-e2e-rewrite-{}-{}-{what}.log",
        std::process::id(),
        tag(flavor)
    ));
    let _ = std::fs::remove_file(&path);
    path
}

/// The pool over two simulated replicas, the seed's rewrite with `split`, and optionally
/// a tenant (`KEY`) with a billing log. `None` when the flavour's module is not built.
async fn start(flavor: Flavor, split: Split, billing: Option<&str>) -> Option<Stack> {
    if crate::support::unbuilt(flavor) {
        return None;
    }
    let sim = SimConfig {
        replicas: 2,
        models: vec![BASE.into()],
        loras: vec![V1.into(), V2.into()],
        deterministic: true,
        output_tokens: 2,
        ..SimConfig::default()
    };
    let mut opts = StackOptions::new(flavor, Backends::InProcess(Box::new(sim)));
    opts.pools = vec![PoolSpec {
        adapters: vec![V1.into(), V2.into()],
        ..PoolSpec::all(BASE)
    }];
    opts.rewrites = vec![seed_rewrite()];
    opts.split = Some(split);
    opts.envoy = EnvoyOptions {
        concurrency: workers(),
        ..EnvoyOptions::default()
    };
    if let Some(what) = billing {
        let never = json!({"rpm": 1000000, "tpm": 1000000000, "concurrency": 100000});
        opts.tenancy = Tenancy {
            objects: vec![
                tenant_quota("tenant-rw", KEY, "standard", never, None),
                objective("standard", 0),
            ],
            jwt: None,
            billing_log: Some(billing_path(flavor, what)),
        };
    }
    Some(Stack::start(opts).await.unwrap())
}

/// One chat request of `session`'s turn `turn`.
#[derive(Clone, Debug)]
struct Turn {
    session: String,
    turn: u32,
    /// Extra request headers.
    headers: Vec<(String, String)>,
}

impl Turn {
    fn new(session: impl Into<String>, turn: u32) -> Turn {
        Turn {
            session: session.into(),
            turn,
            headers: Vec::new(),
        }
    }

    fn request_id(&self, t: &str) -> String {
        format!("rw-{t}-{}-{}", self.session, self.turn)
    }
}

/// Sends every turn (at most [`IN_FLIGHT`] at once), each a chat request for the
/// rewrite's name with the session header and the tenant's key; returns the model the
/// engine answered as, per turn, in order.
async fn send(stack: &Stack, t: &'static str, turns: &[Turn]) -> Vec<String> {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let gate = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut set = JoinSet::new();
    for (i, turn) in turns.iter().cloned().enumerate() {
        let url = url.clone();
        let gate = Arc::clone(&gate);
        set.spawn(async move {
            let _permit = gate.acquire_owned().await.unwrap();
            let body = json!({"model": ALIAS, "max_tokens": 1,
                "messages": [{"role": "user",
                              "content": format!("{} turn {}", turn.session, turn.turn)}]});
            let auth = format!("Bearer {KEY}");
            let id = turn.request_id(t);
            let mut headers: Vec<(&str, &str)> = vec![
                (SESSION, turn.session.as_str()),
                ("authorization", auth.as_str()),
                ("x-request-id", id.as_str()),
            ];
            headers.extend(turn.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            let resp = post_json(&url, &body, &headers).await.unwrap();
            assert_eq!(resp.status, 200, "{t}: {}: {}", id, resp.text());
            let model = resp.json().unwrap()["model"].as_str().unwrap().to_owned();
            (i, model)
        });
    }
    let mut models = vec![String::new(); turns.len()];
    while let Some(done) = set.join_next().await {
        let (i, model) = done.unwrap();
        models[i] = model;
    }
    models
}

pub(super) async fn a_sticky_rewrite_puts_a_tenth_of_sessions_on_the_canary_and_keeps_each_on_one_target(
    flavor: Flavor,
) {
    let t = tag(flavor);
    let split = Split {
        mode: SplitMode::Sticky,
        session_header: Some(SESSION.into()),
    };
    let Some(stack) = start(flavor, split, Some("sticky")).await else {
        return;
    };
    let started = Instant::now();
    const SESSIONS: usize = 1000;
    let first: Vec<Turn> = (0..SESSIONS)
        .map(|s| Turn::new(format!("s{s}"), 1))
        .collect();
    let second: Vec<Turn> = (0..SESSIONS)
        .map(|s| Turn::new(format!("s{s}"), 2))
        .collect();
    let one = send(&stack, t, &first).await;
    let two = send(&stack, t, &second).await;
    for (s, (a, b)) in one.iter().zip(&two).enumerate() {
        assert!(a == V1 || a == V2, "{t}: session {s} was answered as {a}");
        assert_eq!(a, b, "{t}: session s{s} moved between turns");
    }
    let on_v2: Vec<usize> = (0..SESSIONS).filter(|s| one[*s] == V2).collect();
    let share = on_v2.len() as f64 / SESSIONS as f64;
    assert!(
        (0.08..=0.12).contains(&share),
        "{t}: {} of {SESSIONS} sessions on the canary",
        on_v2.len()
    );

    // A client's rewrite header is stripped: each session keeps its target.
    let mut third = Vec::new();
    for s in (0..SESSIONS)
        .filter(|s| one[*s] == V1)
        .take(50)
        .chain(on_v2.iter().copied().take(50))
    {
        let mut turn = Turn::new(format!("s{s}"), 3);
        let other = if one[s] == V1 { V2 } else { V1 };
        turn.headers
            .push(("x-llm-d-model-name-rewrite".into(), other.into()));
        third.push((s, turn));
    }
    let turns: Vec<Turn> = third.iter().map(|(_, turn)| turn.clone()).collect();
    let three = send(&stack, t, &turns).await;
    for ((s, _), got) in third.iter().zip(&three) {
        assert_eq!(
            got, &one[*s],
            "{t}: a client's rewrite header moved session s{s}"
        );
    }

    // A stream: the usage stage forces usage on the rewritten body, which keeps the target.
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let s = on_v2[0];
    let session = format!("s{s}");
    let auth = format!("Bearer {KEY}");
    let stream_id = format!("rw-{t}-stream");
    let body = json!({"model": ALIAS, "max_tokens": 3, "stream": true,
                      "messages": [{"role": "user", "content": "a stream"}]});
    let headers = [
        (SESSION, session.as_str()),
        ("authorization", auth.as_str()),
        ("x-request-id", stream_id.as_str()),
    ];
    let resp = post_json(&url, &body, &headers).await.unwrap();
    assert_eq!(resp.status, 200, "{t}: {}", resp.text());
    let chunks: Vec<Value> = resp
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(!chunks.is_empty(), "{t}: {}", resp.text());
    for c in &chunks {
        assert_eq!(c["model"], V2, "{t}: {c}");
        // The client asked for no usage and sees none.
        assert!(c.get("usage").is_none_or(Value::is_null), "{t}: {c}");
    }

    // The billing record: the sent model and the engine's.
    let total = 2 * SESSIONS + third.len() + 1;
    let records = billing_records(&stack, total, Duration::from_secs(10)).await;
    assert_eq!(records.len(), total, "{t}");
    let mut seen = 0;
    for r in &records {
        let id = r["request_id"].as_str().unwrap_or_default();
        assert_eq!(r["model"], ALIAS, "{t}: {r}");
        if id == stream_id {
            assert_eq!(r["target_model"], V2, "{t}: {r}");
            assert_eq!(r["tokens_source"], "usage", "{t}: {r}");
            seen += 1;
            continue;
        }
        // `rw-<flavour>-s<session>-<turn>`.
        let session = id.rsplit('-').nth(1).unwrap_or_default();
        let s: usize = session.trim_start_matches('s').parse().unwrap();
        assert_eq!(r["target_model"], one[s].as_str(), "{t}: {r}");
        assert_eq!(r["outcome"], "complete", "{t}: {r}");
        seen += 1;
    }
    assert_eq!(seen, total);

    // The router counted every rewrite.
    let stats = stack.envoy().stats().await.unwrap();
    assert_eq!(
        stats.sum_containing("infergate.router.rewrites"),
        total as i64,
        "{t}"
    );
    eprintln!(
        "{t}: sticky: {} of {SESSIONS} sessions on the canary; {} requests in {:.1} s",
        on_v2.len(),
        total,
        started.elapsed().as_secs_f64()
    );
}

pub(super) async fn a_per_request_rewrite_switches_targets_within_sessions(flavor: Flavor) {
    let t = tag(flavor);
    let split = Split {
        mode: SplitMode::PerRequest,
        session_header: Some(SESSION.into()),
    };
    let Some(stack) = start(flavor, split, None).await else {
        return;
    };
    const SESSIONS: usize = 100;
    const TURNS: u32 = 4;
    let turns: Vec<Turn> = (0..SESSIONS)
        .flat_map(|s| (1..=TURNS).map(move |n| Turn::new(format!("s{s}"), n)))
        .collect();
    let models = send(&stack, t, &turns).await;
    let mut switched = 0;
    for s in 0..SESSIONS {
        let of_session: BTreeSet<&str> = models
            .iter()
            .skip(s * TURNS as usize)
            .take(TURNS as usize)
            .map(String::as_str)
            .collect();
        assert!(
            of_session.iter().all(|m| *m == V1 || *m == V2),
            "{t}: {of_session:?}"
        );
        switched += usize::from(of_session.len() > 1);
    }
    // 1 - 0.9⁴ - 0.1⁴ ≈ 34% of the sessions see both targets; sticky would be none.
    assert!(
        switched >= 15,
        "{t}: only {switched} of {SESSIONS} sessions switched"
    );
    let on_v2 = models.iter().filter(|m| *m == V2).count();
    let share = on_v2 as f64 / models.len() as f64;
    assert!(
        (0.05..=0.16).contains(&share),
        "{t}: {on_v2} of {} on v2",
        models.len()
    );
    eprintln!("{t}: per request: {switched} of {SESSIONS} sessions switched targets");
}

pub(super) async fn v1_models_lists_every_served_name_and_the_openai_client_reads_it(
    flavor: Flavor,
) {
    let t = tag(flavor);
    let split = Split::default();
    let Some(stack) = start(flavor, split, None).await else {
        return;
    };
    let base = stack.picker_url();
    let resp = get(&format!("{base}/v1/models")).await.unwrap();
    assert_eq!(resp.status, 200, "{t}: {}", resp.text());
    assert_eq!(resp.header("content-type"), Some("application/json"), "{t}");
    let list = resp.json().unwrap();
    assert_eq!(list["object"], "list", "{t}");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [BASE, ALIAS, V1, V2], "{t}");
    for m in list["data"].as_array().unwrap() {
        assert_eq!(m["object"], "model", "{t}");
        assert_eq!(m["owned_by"], "infergate", "{t}");
    }
    let resp = get(&format!("{base}/v1/models/{ALIAS}")).await.unwrap();
    assert_eq!(
        (resp.status, resp.json().unwrap()["id"].clone()),
        (200, json!(ALIAS)),
        "{t}"
    );
    let resp = get(&format!("{base}/v1/models/gpt-4")).await.unwrap();
    assert_eq!(resp.status, 404, "{t}");
    assert_eq!(
        resp.json().unwrap()["error"]["code"],
        "model_not_found",
        "{t}"
    );
    let url = format!("{base}/v1/models/{ALIAS}");
    let resp = request(hyper::Method::DELETE, &url, &[], bytes::Bytes::new())
        .await
        .unwrap();
    assert_eq!(resp.status, 405, "{t}");

    // The official client, as a user runs it.
    let script = r#"
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
ids = [m.id for m in client.models.list()]
one = client.models.retrieve(sys.argv[2]).id
reply = client.chat.completions.create(model=sys.argv[2], max_tokens=1,
    messages=[{"role": "user", "content": "hi"}])
print(json.dumps({"ids": ids, "one": one, "served_as": reply.model}))
"#;
    let out = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&base)
        .arg(ALIAS)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{t}: the openai client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ids"], json!([BASE, ALIAS, V1, V2]), "{t}");
    assert_eq!(v["one"], ALIAS, "{t}");
    let served = v["served_as"].as_str().unwrap_or_default();
    assert!(served == V1 || served == V2, "{t}: {v}");
}
