//! Writes the seed corpora of `testdata/fuzz/` (ignored; run by hand after changing it):
//!
//! ```text
//! cargo test -p infergate-fuzz --test seeds -- --ignored
//! ```
//!
//! Seeds are built from the project's own test data (request bodies, metrics pages, and
//! snapshot and handoff encodings made from them) plus a few hostile inputs written here.
//! The output is deterministic; files are named by what they hold, so a regenerated corpus
//! differs from the committed one only if this file or the test data changed. Crash
//! reproducers the fuzzer finds are added to the same directories by hand (`crash-*`) and
//! are not touched here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::path::{Path, PathBuf};

use infergate_filters::handoff::Handoff;
use scheduler_core::metrics::{extract, MetricNames};
use scheduler_core::request::{self, Api};
use scheduler_core::snapshot::{self, EndpointSample, Snapshot};
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
                endpoints: vec![endpoint(i, page)],
            };
            (format!("snapshot-{name}"), snapshot::encode(&s))
        })
        .collect();
    let mut all = Snapshot {
        taken_at: Millis(1_700_000_001_000),
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

    let d = dir("snapshot_codec");
    for (name, bytes) in snapshots(&pages) {
        write(&d, &name, &bytes);
    }
    write(
        &d,
        "hostile-huge-count",
        b"IGSN\x01\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\xff\xff\xff\xff\0\0\0\0\0\0\0\0\x00\x00",
    );

    let d = dir("handoff_codec");
    for (name, bytes) in handoffs(&bodies) {
        write(&d, &name, &bytes);
    }
    write(
        &d,
        "hostile-huge-count",
        b"IGH\x01\x10\0\0\0\x00\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x01\0b\x01\0t\xff\xff\xff\xff",
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
}
