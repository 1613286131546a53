//! Replays every seed of `testdata/fuzz/<target>/` through its target body, on stable, so
//! `cargo test` checks every input the fuzzer was ever started from or found a crash with;
//! and runs the hostile inputs too big for a corpus file (megabyte bodies and pages),
//! reporting the memory each took.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::path::PathBuf;

use infergate_fuzz::meter::peak_during;
use infergate_fuzz::{memory_bound, TARGETS};
use scheduler_core::request::{self, Api};

fn corpus_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz")
}

#[test]
fn every_seed_passes_its_target() {
    let mut total = 0;
    for (name, body) in TARGETS {
        let dir = corpus_root().join(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(files.len() >= 3, "{name}: only {} seeds", files.len());
        for f in &files {
            let data = std::fs::read(f).unwrap();
            let run = std::panic::catch_unwind(|| body(&data));
            assert!(run.is_ok(), "{name}: {} fails", f.display());
        }
        total += files.len();
    }
    println!("{total} seeds replayed");
}

/// A body of at least `n` bytes: `head`, then `item` repeated, then `tail`.
fn repeated(head: &str, item: &str, tail: &str, n: usize) -> Vec<u8> {
    let mut b = String::with_capacity(n + head.len() + tail.len() + item.len());
    b.push_str(head);
    while b.len() < n {
        b.push_str(item);
    }
    b.push_str(tail);
    b.into_bytes()
}

const MIB: usize = 1 << 20;

#[test]
fn hostile_bodies_take_memory_bounded_by_the_body() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "4 MiB of 1e308 in tools",
            repeated(r#"{"model":"m","tools":["#, "1e308,", "1]}", 4 * MIB),
        ),
        (
            "4 MiB of 0 in tools",
            repeated(r#"{"model":"m","tools":["#, "0,", "0]}", 4 * MIB),
        ),
        (
            "4 MiB of {} in tools",
            repeated(r#"{"model":"m","tools":["#, "{},", "{}]}", 4 * MIB),
        ),
        (
            "4 MiB of escaped newlines in a tool",
            repeated(r#"{"model":"m","tools":[""#, "\\n", "\"]}", 4 * MIB),
        ),
        (
            "4 MiB object in tools",
            repeated(
                r#"{"model":"m","tools":[{"#,
                r#""k":1e15,"#,
                r#""z":0}]}"#,
                4 * MIB,
            ),
        ),
        (
            "100k messages",
            repeated(
                r#"{"model":"m","messages":["#,
                r#"{"role":"user","content":"hi"},"#,
                "{}]}",
                3_300_000,
            ),
        ),
        (
            "4 MiB of token ids",
            repeated(r#"{"model":"m","prompt":["#, "0,", "0]}", 4 * MIB),
        ),
        (
            "4 MiB image part with text before its type",
            repeated(
                r#"{"model":"m","messages":[{"role":"user","content":[{"text":""#,
                "x",
                r#"","type":"image_url","image_url":{"url":"u"}}]}]}"#,
                4 * MIB,
            ),
        ),
        (
            "model of 1 MiB",
            repeated(r#"{"messages":[],"model":""#, "m", "\"}", MIB),
        ),
    ];
    for (name, body) in &cases {
        for api in [Api::ChatCompletions, Api::Completions] {
            let (parsed, peak) = peak_during(|| request::parse(api, body));
            let (stored, counted) = parsed
                .as_ref()
                .map_or((0, 0), |p| (p.prompt.len(), p.prompt_len));
            println!(
                "{name} ({api:?}): body {} B, peak {} B ({:.2}x), prompt stored {stored} B, counted {counted} B",
                body.len(),
                peak,
                peak as f64 / body.len() as f64
            );
            assert!(peak <= memory_bound(body.len()), "{name}: {peak} B");
            assert!(stored <= request::DEFAULT_MAX_PROMPT_BYTES);
        }
    }
}

#[test]
fn hostile_metrics_pages_take_memory_bounded_by_the_page() {
    let names = scheduler_core::metrics::MetricNames::default();
    let adapters = repeated(
        "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"",
        "a,",
        "\",waiting_lora_adapters=\"\"} 1\n",
        4 * MIB,
    );
    let series = repeated("", "vllm:num_requests_waiting{a=\"b\"} 1\n", "", 4 * MIB);
    let escapes = repeated(
        "vllm:cache_config_info{block_size=\"",
        "\\\\",
        "\"} 1\n",
        4 * MIB,
    );
    for (name, page) in [
        ("adapters", adapters),
        ("series", series),
        ("escapes", escapes),
    ] {
        let (_, peak) = peak_during(|| scheduler_core::metrics::extract(&page, &names));
        println!("metrics page of {name}: {} B, peak {peak} B", page.len());
        assert!(peak <= memory_bound(page.len()), "{name}: {peak} B");
    }
}

#[test]
fn hostile_usage_streams_take_memory_bounded_by_the_line_cap() {
    use scheduler_core::usage::{BodyKind, ClientWants, UsageTracker, MAX_LINE};
    // One 4 MiB data line; 4 MiB of tiny events; a 4 MiB JSON body of nested usage keys.
    let long_line = repeated(
        r#"data: {"choices":[{"delta":{"content":""#,
        "x",
        "\"}}]}\n\n",
        4 * MIB,
    );
    let many = repeated(
        "",
        "data: {\"choices\":[1],\"usage\":{\"prompt_tokens\":1}}\n\n",
        "",
        4 * MIB,
    );
    let body = repeated(
        r#"{"a":["#,
        r#"{"usage":{"prompt_tokens":1}},"#,
        "0]}",
        4 * MIB,
    );
    for (name, kind, data) in [
        ("long line", BodyKind::EventStream, &long_line),
        ("many events", BodyKind::EventStream, &many),
        ("nested usage body", BodyKind::Json, &body),
    ] {
        for wants in [
            ClientWants::default(),
            ClientWants {
                include_usage: true,
                continuous_usage: true,
                null_when_absent: false,
            },
        ] {
            let (_, peak) = peak_during(|| {
                let mut t = UsageTracker::new(kind, wants);
                let mut out = Vec::new();
                let chunks: Vec<&[u8]> = data.chunks(16 * 1024).collect();
                for (i, c) in chunks.iter().enumerate() {
                    t.feed(c, i + 1 == chunks.len(), &mut out);
                }
                t.report()
            });
            println!(
                "usage tracker, {name} ({wants:?}): {} B, peak {peak} B",
                data.len()
            );
            // One held line and one chunk's output, whatever the stream's length.
            assert!(
                peak <= 4 * MAX_LINE + 64 * 1024 + 8 * 16 * 1024,
                "{name}: {peak} B"
            );
        }
    }
}
