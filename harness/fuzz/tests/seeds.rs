//! Writes the seed corpora of `testdata/fuzz/` (ignored; run by hand after changing it):
//!
//! ```text
//! cargo test -p infergate-fuzz --test seeds -- --ignored
//! ```
//!
//! Seeds are built from the project's own test data (request bodies, metrics pages, and
//! snapshot and handoff encodings made from them; scheduling configurations with queue
//! operation scripts; worker/owner messages of picks prepared on the fake host) plus a few
//! hostile inputs written here.
//! The output is deterministic; files are named by what they hold, so a regenerated corpus
//! differs from the committed one only if this file or the test data changed. Crash
//! reproducers the fuzzer finds are added to the same directories by hand (`crash-*`) and
//! are not touched here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::path::{Path, PathBuf};

use infergate_filters::handoff::Handoff;
use scheduler_core::metrics::{extract, MetricNames};
use scheduler_core::request::{self, Api};
use scheduler_core::snapshot::{self, ClusterMembers, EndpointSample, Health, Member, Snapshot};
use scheduler_core::types::Millis;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(testdata().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn files_in(rel: &str, ext: &str) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(testdata().join(rel))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

/// A gateway's export page of a pool: its load and its members (one an IPv6 address, one
/// not an address at all).
const EXPORT_PAGE: &[u8] = b"infergate_pool_members 3\ninfergate_pool_ready_members 2\n\
llm_d_epp_average_queue_size 1.5\nllm_d_epp_average_kv_cache_utilization 0.25\n\
# TYPE infergate_pool_member gauge\ninfergate_pool_member{endpoint=\"10.0.0.1:8000\"} 1\n\
infergate_pool_member{endpoint=\"[fd00::2]:8000\"} 1\ninfergate_pool_member{endpoint=\"pod-3\"} 1\n";

fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::write(dir.join(name), data).unwrap();
}

fn request_bodies() -> Vec<(String, Vec<u8>)> {
    let mut bodies = files_in("requests", "json");
    bodies.push(("explain-request".into(), read("explain/request.json")));
    bodies
}

/// Hostile request bodies small enough for a corpus file.
fn hostile_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let floats = format!(r#"{{"model":"m","tools":[{}1e308]}}"#, "1e308,".repeat(600));
    let nested = format!(
        r#"{{"model":"m","tools":[{}1{}]}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let messages = format!(
        r#"{{"model":"m","messages":[{}{{}}]}}"#,
        r#"{"role":"user","content":"x"},"#.repeat(300)
    );
    vec![
        ("hostile-floats-in-tools", floats.into_bytes()),
        ("hostile-200-deep", nested.into_bytes()),
        ("hostile-many-messages", messages.into_bytes()),
        (
            "hostile-truncated",
            br#"{"model":"m","messages":[{"role":"user","content":"hel"#.to_vec(),
        ),
        (
            "hostile-invalid-utf8",
            b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}".to_vec(),
        ),
        (
            "hostile-escapes-in-tools",
            format!(r#"{{"model":"m","tools":["{}"]}}"#, "\\n\\u0000\\\"".repeat(100))
                .into_bytes(),
        ),
        (
            "hostile-text-before-type",
            br#"{"model":"m","messages":[{"role":"user","content":[{"text":"aaaa","type":"image_url","image_url":{"url":"u"}},{"text":"b","type":"tool_use","type":"image"}]}]}"#
                .to_vec(),
        ),
        (
            "hostile-repeated-keys",
            br#"{"model":"a","tools":[{"b":1,"a":2,"b":3}],"tools":[{"z":[1.5e-7,-0.0,1e15]}],"model":"b","messages":[{"content":"x","content":[{"type":"text","text":"1","text":"2"}]}]}"#
                .to_vec(),
        ),
        (
            "hostile-token-ids",
            format!(r#"{{"model":"m","prompt":[{}[0]]}}"#, "[0,4294967295],[],".repeat(200))
                .into_bytes(),
        ),
        (
            "hostile-output-multiplicity",
            format!(
                r#"{{"model":"m","n":18446744073709551615,"best_of":1e19,"n":4294967296,"prompt":[{}"z"]}}"#,
                r#""a","#.repeat(500)
            )
            .into_bytes(),
        ),
    ]
}

/// `canonical_prompt` input: mode byte, little-endian limit, then the bytes it embeds.
fn canonical(mode: u8, limit: u16, rest: &[u8]) -> Vec<u8> {
    let [lo, hi] = limit.to_le_bytes();
    [&[mode, lo, hi][..], rest].concat()
}

fn hostile_pages() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "hostile-many-adapters",
            format!(
                "vllm:lora_requests_info{{max_lora=\"2\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"\"}} 1.7e9\n",
                "a,".repeat(1500)
            )
            .into_bytes(),
        ),
        (
            "hostile-values",
            b"vllm:num_requests_waiting NaN\nvllm:num_requests_waiting{a=\"1\"} -3\nvllm:num_requests_running +Inf\nvllm:kv_cache_usage_perc 1e309\nvllm:kv_cache_usage_perc 7\n".to_vec(),
        ),
        (
            "hostile-escapes",
            b"vllm:cache_config_info{block_size=\"1\\\\6\",num_gpu_blocks=\"\\\"9\\n\"} 1\n{\"vllm:num_requests_waiting\",x=\"y\"} 4\n# TYPE\n# HELP x \\\n".to_vec(),
        ),
        (
            "hostile-garbage",
            b"\x00\xff{{{}}} 1 2 3\n\n\n=\"\"\nvllm:num_requests_waiting{\n".to_vec(),
        ),
    ]
}

fn snapshots(pages: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let names = MetricNames::default();
    let endpoint = |i: usize, page: &[u8]| EndpointSample {
        address: format!("10.0.0.{i}:8000"),
        scraped_at: Millis(1_700_000_000_000 + i as u64),
        consecutive_failures: 0,
        metrics: Some(extract(page, &names)),
    };
    let mut out: Vec<(String, Vec<u8>)> = pages
        .iter()
        .enumerate()
        .map(|(i, (name, page))| {
            let s = Snapshot {
                taken_at: Millis(1_700_000_000_500),
                clusters: Vec::new(),
                endpoints: vec![endpoint(i, page)],
            };
            (format!("snapshot-{name}"), snapshot::encode(&s))
        })
        .collect();
    let mut all = Snapshot {
        taken_at: Millis(1_700_000_001_000),
        clusters: Vec::new(),
        endpoints: pages
            .iter()
            .enumerate()
            .map(|(i, (_, p))| endpoint(i, p))
            .collect(),
    };
    all.endpoints.push(EndpointSample {
        address: "10.0.0.99:8000".into(),
        scraped_at: Millis(0),
        consecutive_failures: 7,
        metrics: None,
    });
    out.push((
        "snapshot-all-pages".into(),
        snapshot::encode_with_generation(&all, 42),
    ));
    // The members of two followed clusters, every health.
    all.clusters = vec![
        ClusterMembers {
            cluster: "llama-pool".into(),
            members: [Health::Healthy, Health::Degraded, Health::Unhealthy]
                .into_iter()
                .enumerate()
                .map(|(i, health)| Member {
                    address: format!("10.0.0.{i}:8000"),
                    health,
                })
                .collect(),
        },
        ClusterMembers {
            cluster: "empty-pool".into(),
            members: Vec::new(),
        },
    ];
    out.push((
        "snapshot-with-clusters".into(),
        snapshot::encode_with_generation(&all, 43),
    ));
    out.push((
        "snapshot-empty".into(),
        snapshot::encode(&Snapshot::default()),
    ));
    out
}

fn handoffs(bodies: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, body) in bodies {
        for (api, block) in [(Api::ChatCompletions, 16), (Api::Completions, 4)] {
            if let Ok(p) = request::parse(api, body) {
                let h = Handoff::from_parsed(&p, "base-model", block);
                if let Some(bytes) = h.encode() {
                    out.push((format!("handoff-{name}-{block}"), bytes));
                }
            }
        }
    }
    out
}

/// `usage_stream` input: mode byte (client wants, JSON body, end of stream alone, engine
/// writes `"usage":null`), chunking seed, then the body.
fn usage_input(mode: u8, seed: u8, body: &[u8]) -> Vec<u8> {
    [&[mode, seed][..], body].concat()
}

/// The response samples of `usage/` under each kind of client, and hostile streams.
fn usage_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, (name, mode)) in [
        ("vllm-chat-stream.sse", 0u8),
        ("vllm-chat-stream.sse", 1),
        ("vllm-chat-stream.sse", 3),
        ("vllm-chat-stream-cut.sse", 8),
        ("sglang-chat-stream.sse", 0),
        ("sglang-chat-stream.sse", 1),
        ("no-usage-stream.sse", 0),
        ("vllm-chat-completion.json", 4),
        ("anthropic-message.json", 12),
        // An engine that writes `"usage":null`: values replaced, not members cut.
        ("vllm-chat-stream.sse", 16),
        ("sglang-chat-stream.sse", 17),
        ("vllm-chat-stream-cut.sse", 24),
    ]
    .into_iter()
    .enumerate()
    {
        let stem = name.rsplit_once('.').map_or(name, |(s, _)| s);
        out.push((
            format!("{stem}-mode{mode}"),
            usage_input(mode, (i * 37 + 1) as u8, &read(&format!("usage/{name}"))),
        ));
    }
    let nested = format!(
        "data: {{\"choices\":[{{\"x\":{{{}\"usage\":{{\"prompt_tokens\":1}}}}}}],\"usage\":{{\"prompt_tokens\":2}}}}\n\n",
        "\"usage\":null,".repeat(20)
    );
    let hostile: Vec<(&str, Vec<u8>)> = vec![
        ("hostile-nested-usage", nested.into_bytes()),
        (
            "hostile-escapes",
            br#"data: {"choices":[{"delta":{"content":"\"usage\":{\\\"a\\\"}\\\\"}}],"usage" : {"completion_tokens":3} , "usage":null}"#
                .iter()
                .chain(b"\r\n\r\ndata: [DONE]\r\n\r\n")
                .copied()
                .collect(),
        ),
        (
            "hostile-numbers",
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":-1,\"completion_tokens\":1e3,\"input_tokens\":99999999999999999999,\"output_tokens\":9007199254740993,\"prompt_tokens_details\":{\"cached_tokens\":0.5}}}\n\n".to_vec(),
        ),
        (
            "hostile-events",
            b"event: usage\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n: c\ndata:{\"usage\":{},\"choices\":[0]}\n\ndata: [DONE]".to_vec(),
        ),
    ];
    for (mode, (name, body)) in hostile.into_iter().enumerate() {
        out.push((
            format!("{name}-nulls"),
            usage_input(mode as u8 | 16, 100 + mode as u8, &body),
        ));
        out.push((
            name.into(),
            usage_input(mode as u8, 200 + mode as u8, &body),
        ));
    }
    out
}

/// Bytes from a xorshift seeded by `seed`.
fn byte_source(seed: u64) -> impl FnMut() -> u8 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 24) as u8
    }
}

/// A `flow_config` enqueue: priority, flow, bytes (u16, large now and then), service, TTL.
fn enqueue_op(next: &mut impl FnMut() -> u8) -> [u8; 7] {
    let hi = next();
    [0, next(), next(), next(), hi & 0x83, next(), next()]
}

/// A `flow_config` operation script: `n` operations, half enqueues (mostly of small
/// bodies), then dispatches, cancels, clock steps and charges.
fn flow_script(seed: u64, n: usize) -> Vec<u8> {
    let mut next = byte_source(seed);
    let mut out = Vec::new();
    for _ in 0..n {
        match next() % 10 {
            0..=4 => out.extend(enqueue_op(&mut next)),
            5 | 6 => out.push(3),
            7 => out.extend([5, next()]),
            8 => out.extend([6, next() % 64]),
            _ => out.extend([7, next(), next(), next(), next()]),
        }
    }
    out
}

/// Bursts: 24 enqueues, then 24 dispatches, three times; so that many flows wait at once
/// and the fairness policies choose among them.
fn burst_script(seed: u64) -> Vec<u8> {
    let mut next = byte_source(seed);
    let mut out = Vec::new();
    for _ in 0..3 {
        for _ in 0..24 {
            out.extend(enqueue_op(&mut next));
        }
        out.extend([3; 24]);
    }
    out
}

/// An `EndpointPickerConfig` as compact JSON, then an operation script.
fn flow_input(config: &serde_json::Value, seed: u64) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(config).unwrap();
    bytes.extend(flow_script(seed, 160));
    bytes
}

fn yaml_to_json(text: &[u8]) -> serde_json::Value {
    serde_yaml_ng::from_slice(text).unwrap()
}

/// The configurations of `epp/` (the JSON ones verbatim too, without a script), variants of
/// the seed's flow control that exercise every policy and the limits, and hostile sections.
fn flow_config_seeds() -> Vec<(String, Vec<u8>)> {
    use serde_json::json;
    let mut out = Vec::new();
    let mut configs: Vec<(String, serde_json::Value)> = Vec::new();
    for (name, text) in files_in("epp", "json") {
        out.push((format!("{name}.json"), text.clone()));
        configs.push((name, serde_json::from_slice(&text).unwrap()));
    }
    for (name, text) in files_in("epp", "yaml") {
        let doc = yaml_to_json(&text);
        // The ConfigMap holds its EndpointPickerConfig as a string.
        let doc = match doc["data"]["epp-config.yaml"].as_str() {
            Some(inner) => yaml_to_json(inner.as_bytes()),
            None => doc,
        };
        configs.push((format!("{name}-yaml"), doc));
    }
    let seed = configs
        .iter()
        .find(|(n, _)| n == "seed-flow-control")
        .map(|(_, c)| c.clone())
        .unwrap();
    for (i, (name, config)) in configs.iter().enumerate() {
        out.push((format!("{name}-ops"), flow_input(config, i as u64 + 1)));
    }
    let with = |plugins: &[serde_json::Value], section: serde_json::Value| {
        let mut c = seed.clone();
        let list = c["plugins"].as_array_mut().unwrap();
        list.extend(plugins.iter().cloned());
        c["flowControl"] = section;
        c
    };
    let policies = [
        json!({"type": "weighted-fairness-policy"}),
        json!({"type": "global-strict-fairness-policy"}),
        json!({"type": "edf-ordering-policy"}),
    ];
    let variants: Vec<(&str, serde_json::Value)> = vec![
        (
            "small-limits",
            with(
                &[],
                json!({"maxRequests": 6, "maxBytes": "2Mi", "defaultRequestTTL": "50ms",
                "priorityBands": [
                    {"priority": 10, "maxRequests": 3, "maxBytes": "64k"},
                    {"priority": 0, "maxRequests": "2"},
                    {"priority": -10, "maxRequests": 1, "maxBytes": 1}]}),
            ),
        ),
        (
            "every-policy",
            with(
                &policies,
                json!({"defaultRequestTTL": "1.5s", "flows": [
                    {"fairnessId": "a", "weight": 3}, {"fairnessId": "b"},
                    {"fairnessId": "c", "weight": 1000000}],
                "priorityBands": [
                    {"priority": 5, "fairnessPolicyRef": "weighted-fairness-policy",
                     "orderingPolicyRef": "edf-ordering-policy", "maxRequests": 40},
                    {"priority": 0, "fairnessPolicyRef": "global-strict-fairness-policy",
                     "orderingPolicyRef": "edf-ordering-policy", "maxRequests": 40},
                    {"priority": -5, "fairnessPolicyRef": "global-strict-fairness-policy",
                     "maxBytes": "1Gi"}]}),
            ),
        ),
        (
            "no-ttl-utilization",
            with(
                &[json!({"type": "utilization-detector", "name": "util",
                    "parameters": {"queueDepthThreshold": 3, "kvCacheUtilThreshold": 0.5}})],
                json!({"defaultRequestTTL": 0, "saturationDetector": {"pluginRef": "util"},
                    "enableEviction": true}),
            ),
        ),
        ("no-section", {
            let mut c = seed.clone();
            c.as_object_mut().unwrap().remove("flowControl");
            c
        }),
        ("gate-off", {
            let mut c = seed.clone();
            c["featureGates"] = json!(["flowControl=false"]);
            c
        }),
    ];
    // One fault each, so that every one is reached (compiling stops at the first).
    let band = |fields: serde_json::Value| {
        let mut b = json!({"priority": 0});
        b.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        json!({"priorityBands": [b]})
    };
    let hostile: Vec<(&str, serde_json::Value)> = vec![
        (
            "hostile-huge-quantity",
            with(&[], json!({"maxBytes": "99999999999999999999Ei"})),
        ),
        (
            "hostile-huge-exponent",
            with(&[], json!({"maxRequests": "1e31"})),
        ),
        ("hostile-negative", with(&[], json!({"maxRequests": -1}))),
        (
            "hostile-negative-band-bytes",
            with(&[], band(json!({"maxBytes": "-5k"}))),
        ),
        (
            "hostile-fraction-quantity",
            with(&[], json!({"maxRequests": "1.5k", "maxBytes": "2.5Ki"})),
        ),
        (
            "hostile-fraction-count",
            with(&[], json!({"maxRequests": "0.5"})),
        ),
        (
            "hostile-repeated-duration",
            with(&[], json!({"defaultRequestTTL": "1h1h"})),
        ),
        (
            "hostile-negative-duration",
            with(&[], json!({"defaultRequestTTL": "-5s"})),
        ),
        (
            "hostile-duration-without-unit",
            with(&[], json!({"defaultRequestTTL": "1.5"})),
        ),
        (
            "hostile-unknown-policy",
            with(
                &[json!({"type": "lottery-fairness-policy"})],
                band(json!({"fairnessPolicyRef": "lottery-fairness-policy"})),
            ),
        ),
        (
            "hostile-dangling-detector",
            with(
                &[],
                json!({"saturationDetector": {"pluginRef": "no-such-detector"}}),
            ),
        ),
        (
            "hostile-ref-of-another-kind",
            with(&[], band(json!({"orderingPolicyRef": "queue-scorer"}))),
        ),
        (
            "hostile-duplicate-band",
            with(
                &[],
                json!({"priorityBands": [{"priority": 1}, {"priority": 1}]}),
            ),
        ),
        (
            "hostile-duplicate-flow",
            with(
                &[],
                json!({"flows": [{"fairnessId": "a"}, {"fairnessId": "a", "weight": 2}]}),
            ),
        ),
        (
            "hostile-zero-weight",
            with(&[], json!({"flows": [{"fairnessId": "a", "weight": 0}]})),
        ),
        (
            "hostile-eviction-string",
            with(&[], json!({"enableEviction": "yes"})),
        ),
        (
            "hostile-priority-beyond-i32",
            with(&[], band(json!({"priority": 2147483648_i64}))),
        ),
        ("hostile-unknown-field", with(&[], json!({"burst": 1}))),
        ("hostile-gate", {
            let mut c = seed.clone();
            c["featureGates"] = json!(["flowControl=maybe"]);
            c
        }),
    ];
    for (name, config) in &variants {
        let mut bytes = serde_json::to_vec(config).unwrap();
        bytes.extend(burst_script(name.len() as u64));
        out.push((format!("{name}-bursts"), bytes));
    }
    for (i, (name, config)) in variants.into_iter().chain(hostile).enumerate() {
        out.push((name.into(), flow_input(&config, 100 + i as u64)));
    }
    // A script without a document in front, and an almost empty one.
    out.push(("hostile-ops-only".into(), flow_script(7, 40)));
    out.push((
        "hostile-empty-config".into(),
        [
            &br#"{"featureGates":["flowControl"]}"#[..],
            &flow_script(8, 200),
        ]
        .concat(),
    ));
    out
}

/// The picker configuration of the `owner_messages` seeds: one pool with flow control and
/// a session header, so a prepared pick carries every field.
fn picker_config() -> serde_json::Value {
    use serde_json::json;
    let mut epp = infergate_filters::picker::config::default_epp_config();
    let plugins = epp["plugins"].as_array_mut().unwrap();
    plugins.push(json!({"type": "concurrency-detector", "parameters": {"maxConcurrency": 1}}));
    epp["featureGates"] = json!(["flowControl"]);
    epp["flowControl"] = json!({"defaultRequestTTL": "2s",
        "priorityBands": [{"priority": 0, "maxRequests": 2}]});
    json!({"pools": [{"pool": "p", "baseModel": "llama", "endpoints": ["10.0.0.1:8000"],
        "failureMode": "FailOpen", "sessionHeader": "x-session-id", "eppConfig": epp}]})
}

/// A pick prepared on the fake host as a Wasm worker's pick stage prepares it (the message
/// it sends the owner).
fn prepared_pick(
    body: &serde_json::Value,
    flow: Option<&str>,
    session: Option<&str>,
) -> (
    infergate_filters::picker::PoolId,
    infergate_filters::picker::PreparedPick,
) {
    use infergate_filters::fake::FakeHost;
    use infergate_filters::headers::{BASE_MODEL, FAIRNESS_ID};
    use infergate_filters::picker::{PickerShared, PreparedPick};
    use scheduler_core::request::Api;
    let local = PickerShared::from_json(picker_config()).unwrap();
    let text = body.to_string();
    let mut host = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", text.as_bytes())
        .now(1_700_000_000_123);
    if let Some(flow) = flow {
        host = host.request_header(FAIRNESS_ID, flow);
    }
    if let Some(session) = session {
        host = host.request_header("x-session-id", session);
    }
    let plan = local.plans().for_request(None, "llama").unwrap();
    let prepared =
        PreparedPick::new(&plan, Api::ChatCompletions, text.as_bytes(), &mut host).unwrap();
    (plan.id(), prepared)
}

/// Encodings of every message kind, and a few malformed ones.
fn owner_message_seeds() -> Vec<(String, Vec<u8>)> {
    use infergate_filters::flow::DropReason;
    use infergate_filters::picker::remote::{Released, StateKey, ToOwner, ToWorker};
    use infergate_filters::picker::timing::ResponseTiming;
    use infergate_filters::picker::Rejection;
    use serde_json::json;
    let config = serde_json::to_vec(&picker_config()).unwrap();
    let state = StateKey::of_config(&config);
    let chat = read("requests/chat-simple.json");
    let chat: serde_json::Value = serde_json::from_slice(&chat).unwrap();
    let long = json!({"model": "llama", "max_tokens": 64, "messages": [
        {"role": "system", "content": "You are a careful assistant. ".repeat(40)},
        {"role": "user", "content": "hello"}]});
    let (pool, plain) = prepared_pick(&chat, None, None);
    let (_, full) = prepared_pick(&long, Some("tenant-a"), Some("conversation-42"));
    let releases = vec![
        Released::lease(1),
        Released {
            lease: 2,
            service: 1234,
            timing: ResponseTiming {
                ttft_us: Some(41_000),
                tpot_us: Some(9_500),
            },
        },
    ];
    let owner: Vec<(&str, ToOwner)> = vec![
        ("hello", ToOwner::Hello { state, config }),
        (
            "pick",
            ToOwner::Pick {
                state,
                reply_queue: 7,
                ticket: 1,
                pool,
                prepared: plain.clone(),
                releases: Vec::new(),
                started: Vec::new(),
            },
        ),
        (
            "pick-with-releases",
            ToOwner::Pick {
                state,
                reply_queue: 7,
                ticket: 2,
                pool,
                prepared: full.clone(),
                releases: releases.clone(),
                started: vec![3, 4],
            },
        ),
        (
            "release",
            ToOwner::Release {
                state,
                reply_queue: 7,
                leases: releases,
                started: vec![5],
            },
        ),
        (
            "cancel",
            ToOwner::Cancel {
                state,
                reply_queue: 7,
                ticket: 2,
            },
        ),
        (
            "served",
            ToOwner::Served {
                state,
                lease: 9,
                endpoint: "10.0.0.2:8000".into(),
                block_hashes: full.block_hashes().iter().map(|h| h.0).collect(),
                session: Some("conversation-42".into()),
            },
        ),
    ];
    let endpoint = "10.0.0.1:8000".to_string();
    let worker: Vec<(&str, ToWorker)> = vec![
        (
            "picked",
            ToWorker::Picked {
                ticket: 1,
                lease: 9,
                endpoint: endpoint.clone(),
                fallbacks: vec!["10.0.0.2:8000".into()],
                prefiller: None,
                queued_ms: None,
                release_at_once: false,
                evictable: false,
                peer: false,
            },
        ),
        (
            "picked-prefiller",
            ToWorker::Picked {
                ticket: 12,
                lease: 13,
                endpoint: endpoint.clone(),
                fallbacks: vec!["10.0.0.2:8000".into()],
                prefiller: Some("10.0.0.4:8000".into()),
                queued_ms: None,
                release_at_once: false,
                evictable: false,
                peer: false,
            },
        ),
        (
            "picked-queued",
            ToWorker::Picked {
                ticket: 2,
                lease: 10,
                endpoint: endpoint.clone(),
                fallbacks: vec!["10.0.0.2:8000".into(), "10.0.0.3:8000".into()],
                prefiller: None,
                queued_ms: Some(1_250),
                release_at_once: true,
                evictable: false,
                peer: false,
            },
        ),
        (
            "picked-release-at-once",
            ToWorker::Picked {
                ticket: 8,
                lease: 11,
                endpoint,
                fallbacks: Vec::new(),
                prefiller: None,
                queued_ms: Some(0),
                release_at_once: true,
                evictable: true,
                peer: false,
            },
        ),
        ("evict", ToWorker::Evict { lease: 11 }),
        (
            "rejected-no-endpoints",
            ToWorker::Rejected {
                ticket: 3,
                rejection: Rejection::NoEndpoints,
            },
        ),
        (
            "rejected-stale",
            ToWorker::Rejected {
                ticket: 4,
                rejection: Rejection::StaleMetrics,
            },
        ),
        ("unknown-state", ToWorker::UnknownState { ticket: 5 }),
        ("queued", ToWorker::Queued { ticket: 6 }),
        (
            "dropped-evicted",
            ToWorker::Dropped {
                ticket: 14,
                reason: DropReason::Evicted,
                queued_ms: 0,
            },
        ),
        (
            "dropped-ttl",
            ToWorker::Dropped {
                ticket: 6,
                reason: DropReason::TtlExpired,
                queued_ms: 2_000,
            },
        ),
        (
            "dropped-cancelled",
            ToWorker::Dropped {
                ticket: 7,
                reason: DropReason::ContextCancelled,
                queued_ms: 30,
            },
        ),
    ];
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for (name, m) in owner {
        out.push((format!("to-owner-{name}"), m.encode().unwrap()));
    }
    for (name, m) in worker {
        out.push((format!("to-worker-{name}"), m.encode()));
    }
    // A release claiming 4 billion leases, a pick cut short, a cancel with a byte too many.
    let mut huge = vec![3u8];
    huge.extend(state.0.to_le_bytes());
    huge.extend(7u32.to_le_bytes());
    huge.extend(u32::MAX.to_le_bytes());
    huge.extend(7u64.to_le_bytes());
    out.push(("hostile-huge-count".into(), huge));
    let pick = &out[2].1;
    out.push((
        "hostile-truncated-pick".into(),
        pick[..pick.len() - 3].to_vec(),
    ));
    let mut trailing = out[4].1.clone();
    trailing.push(0);
    out.push(("hostile-trailing-byte".into(), trailing));
    out
}

/// Writes only the `flow_config` and `owner_messages` seeds (the others are untouched).
#[test]
#[ignore = "writes testdata/fuzz/flow_config and owner_messages; run by hand"]
fn write_flow_and_owner_seeds() {
    for (target, seeds) in [
        ("flow_config", flow_config_seeds()),
        ("owner_messages", owner_message_seeds()),
    ] {
        let d = testdata().join("fuzz").join(target);
        std::fs::create_dir_all(&d).unwrap();
        for (name, data) in seeds {
            write(&d, &name, &data);
        }
    }
}

/// A snapshot with no endpoints whose cluster count claims four billion clusters.
fn huge_cluster_count() -> Vec<u8> {
    let mut bytes = snapshot::encode(&Snapshot::default());
    let n = bytes.len();
    bytes[n - 4..].copy_from_slice(&u32::MAX.to_le_bytes());
    snapshot::reseal(&mut bytes);
    bytes
}

/// The `admin_clusters` seeds: Envoy's real answer, and hand-written shapes around it.
fn admin_cluster_seeds() -> Vec<(String, Vec<u8>)> {
    let real = read("membership/admin-clusters-envoy-1.40.0.json");
    let hosts = |n: usize| -> String {
        (0..n)
            .map(|i| {
                format!(
                    r#"{{"address":{{"socket_address":{{"address":"10.1.{}.{}","port_value":8000}}}},"health_status":{{"eds_health_status":"HEALTHY"}}}}"#,
                    i / 250,
                    i % 250
                )
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    vec![
        ("envoy-1.40.0-real.json".into(), real),
        (
            "every-flag.json".into(),
            br#"{"cluster_statuses":[{"name":"p","host_statuses":[
{"address":{"socket_address":{"address":"10.0.0.1","port_value":8000}},"health_status":{"failed_outlier_check":true}},
{"address":{"socket_address":{"address":"10.0.0.2","port_value":8000}},"health_status":{"pending_dynamic_removal":true}},
{"address":{"socket_address":{"address":"10.0.0.3","port_value":8000}},"health_status":{"failed_active_degraded_check":true}},
{"address":{"socket_address":{"address":"10.0.0.4","port_value":8000}},"health_status":{"eds_health_status":"TIMEOUT","pending_active_hc":true}},
{"address":{"socket_address":{"address":"fd00::5","port_value":8000}},"health_status":{"active_hc_timeout":true,"excluded_via_immediate_hc_fail":true}}]}]}"#
                .to_vec(),
        ),
        (
            "odd-hosts-and-duplicates.json".into(),
            br#"{"cluster_statuses":[{"name":"p","host_statuses":[{"address":{"pipe":{"path":"/s"}}},{"address":{"socket_address":{"address":"h.example","port_value":1}}},{"address":{"socket_address":{"address":"10.0.0.1","port_value":99999}}},{},{"address":{"socket_address":{"address":"10.0.0.1","port_value":1}}},{"address":{"socket_address":{"address":"10.0.0.1","port_value":1}}}]},{"name":"p"},{"name":"q","extra":[1,{"x":null}]}],"more":true}"#
                .to_vec(),
        ),
        (
            "many-hosts.json".into(),
            format!(r#"{{"cluster_statuses":[{{"name":"big","host_statuses":[{}]}}]}}"#, hosts(600))
                .into_bytes(),
        ),
        (
            "hostile-empty-objects".into(),
            format!(r#"{{"cluster_statuses":[{{"host_statuses":[{}{{}}]}}]}}"#, "{},".repeat(2000))
                .into_bytes(),
        ),
        ("hostile-wrong-types".into(), br#"{"cluster_statuses":[{"name":7,"host_statuses":"x"}]}"#.to_vec()),
    ]
}

/// Writes only the `snapshot_codec` and `admin_clusters` seeds (the others are untouched).
#[test]
#[ignore = "writes testdata/fuzz/snapshot_codec and admin_clusters; run by hand"]
fn write_snapshot_and_admin_seeds() {
    let pages = files_in("metrics", "txt");
    let snapshot_dir = testdata().join("fuzz/snapshot_codec");
    std::fs::create_dir_all(&snapshot_dir).unwrap();
    for (name, bytes) in snapshots(&pages) {
        write(&snapshot_dir, &name, &bytes);
    }
    write(
        &snapshot_dir,
        "hostile-huge-cluster-count",
        &huge_cluster_count(),
    );
    let admin_dir = testdata().join("fuzz/admin_clusters");
    std::fs::create_dir_all(&admin_dir).unwrap();
    for (name, data) in admin_cluster_seeds() {
        write(&admin_dir, &name, &data);
    }
}

/// `kv_events` seeds: the golden payloads of testdata/kv_events plus hostile ones (deep
/// nesting in an unknown field, huge declared counts, a topic frame).
fn kv_event_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = files_in("kv_events", "msgpack")
        .into_iter()
        .map(|(n, b)| (format!("{n}.msgpack"), b))
        .collect();
    let mut deep = vec![0x92, 0x00, 0x91, 0x92, 0xa1, b'X'];
    deep.extend(std::iter::repeat_n(0x91, 30));
    deep.push(0xc0);
    out.push(("hostile-deep-unknown-field".into(), deep));
    out.push((
        "hostile-huge-counts".into(),
        b"\x93\xcb\x00\x00\x00\x00\x00\x00\x00\x00\x91\x93\xacBlockRemoved\xdd\xff\xff\xff\xff\xc0\x00"
            .to_vec(),
    ));
    out.push(("topic".into(), b"kv@pod-1@meta-llama/Llama-3.1-8B".to_vec()));
    out
}

/// Writes only the `kv_events` seeds (the others are untouched).
#[test]
#[ignore = "writes testdata/fuzz/kv_events; run by hand"]
fn write_kv_events_seeds() {
    let d = testdata().join("fuzz/kv_events");
    std::fs::create_dir_all(&d).unwrap();
    for (name, data) in kv_event_seeds() {
        write(&d, &name, &data);
    }
}

/// Writes only the `usage_stream` seeds (the others are untouched).
#[test]
#[ignore = "writes testdata/fuzz/usage_stream; run by hand"]
fn write_usage_stream_seeds() {
    let d = testdata().join("fuzz/usage_stream");
    std::fs::create_dir_all(&d).unwrap();
    for (name, data) in usage_seeds() {
        write(&d, &name, &data);
    }
}

#[test]
#[ignore = "writes testdata/fuzz; run by hand"]
fn write_seed_corpora() {
    let root = testdata().join("fuzz");
    let dir = |t: &str| {
        let d = root.join(t);
        std::fs::create_dir_all(&d).unwrap();
        // Keep crash reproducers; rewrite everything generated.
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if !name.starts_with("crash-") {
                std::fs::remove_file(p).unwrap();
            }
        }
        d
    };
    let bodies = request_bodies();
    let pages = files_in("metrics", "txt");

    let d = dir("request_parser");
    for (name, body) in &bodies {
        write(&d, &format!("{name}.json"), body);
    }
    for (name, body) in hostile_bodies() {
        write(&d, name, &body);
    }

    let d = dir("canonical_prompt");
    for (i, (name, body)) in bodies.iter().enumerate() {
        // Whole bodies as chat, Anthropic and completions, cut at a few sizes.
        let mode = (i % 3) as u8 * 4;
        write(
            &d,
            &format!("body-{name}"),
            &canonical(mode, 64 + 40 * i as u16, body),
        );
    }
    let tools: &[(&str, &[u8])] = &[
        ("tools-function", br#"{"type":"function","function":{"name":"get_weather","description":"Weather.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}"#),
        ("tools-floats", b"1e308,-1e308,0.1,1.5e-7,1e15,2.0,-0.0,5e-324,123456.789,1.7976931348623157e308"),
        ("tools-nested", br#"{"b":[{"d":null,"c":true}],"a":{"\u0000":"\n\"\\","":[]}},[[[]]],"x""#),
    ];
    for (name, rest) in tools {
        write(&d, name, &canonical(1, 48, rest));
    }
    let parts: &[(&str, &[u8])] = &[
        ("parts-text-image", br#"{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}"#),
        ("parts-text-first", br#"{"text":"a long text that comes before its type","type":"tool_result","content":[1,2]},"bare""#),
        ("parts-anthropic", br#"{"type":"tool_use","id":"t1","name":"get","input":{"q":"x"},"cache_control":{"type":"ephemeral"}}"#),
    ];
    for (name, rest) in parts {
        write(&d, name, &canonical(2, 20, rest));
    }
    write(
        &d,
        "tool-calls",
        &canonical(
            3,
            30,
            br#"[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]"#,
        ),
    );

    let d = dir("prometheus_parser");
    for (name, page) in &pages {
        write(&d, &format!("{name}.txt"), page);
    }
    for (name, page) in hostile_pages() {
        write(&d, name, &page);
    }
    write(&d, "export-page-members.txt", EXPORT_PAGE);

    let d = dir("snapshot_codec");
    for (name, bytes) in snapshots(&pages) {
        write(&d, &name, &bytes);
    }
    write(
        &d,
        "hostile-huge-count",
        b"IGSN\x02\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\xff\xff\xff\xff\0\0\0\0\0\0\0\0\x00\x00",
    );
    write(&d, "hostile-huge-cluster-count", &huge_cluster_count());

    let d = dir("admin_clusters");
    for (name, data) in admin_cluster_seeds() {
        write(&d, &name, &data);
    }

    let d = dir("handoff_codec");
    for (name, bytes) in handoffs(&bodies) {
        write(&d, &name, &bytes);
    }
    write(
        &d,
        "hostile-huge-count",
        b"IGH\x02\x10\0\0\0\x00\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x01\0\0\0\x01\0b\x01\0t\xff\xff\xff\xff",
    );
    write(
        &d,
        "body-chat-simple.json",
        &read("requests/chat-simple.json"),
    );

    let d = dir("usage_stream");
    for (name, data) in usage_seeds() {
        write(&d, &name, &data);
    }

    let d = dir("flow_config");
    for (name, data) in flow_config_seeds() {
        write(&d, &name, &data);
    }

    let d = dir("owner_messages");
    for (name, data) in owner_message_seeds() {
        write(&d, &name, &data);
    }

    let d = dir("kv_events");
    for (name, data) in kv_event_seeds() {
        write(&d, &name, &data);
    }
}
