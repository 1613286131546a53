//! Response-side usage tracking on realistic vLLM-shaped streams: 2,000 content chunks of
//! one token each (~330-byte events with continuous usage), the final usage-only chunk and
//! `[DONE]`, fed as the engine flushes them (one event per chunk) and as 1,460-byte TCP
//! segments (and once with a distinct id per event, the worst case for the tracker's
//! shared-prefix shortcut), also for a client of an engine that writes `"usage":null`;
//! and a 200 KB non-streamed completion body. Target: ≥ 1 GB/s through
//! `UsageTracker::feed` in every mode.
//!
//! Run: `cargo bench -p scheduler-core --bench usage` (`-- --quick` for a short run).

#[cfg(not(target_family = "wasm"))]
mod imp {
    use criterion::{black_box, criterion_group, Criterion, Throughput};
    use scheduler_core::usage::{BodyKind, ClientWants, Forward, UsageTracker};

    const WORDS: &[&str] = &[
        " the",
        " model",
        " returns",
        " a",
        " token",
        ",",
        " and",
        " then",
        " we",
        " can",
        " use",
        " cache",
        ".",
        "\\n",
        " K",
        "V",
        " café",
        " —",
        " データ",
        " \\\"quoted\\\"",
    ];

    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// A vLLM 0.x chat stream with continuous usage, one event per element. `distinct_ids`:
    /// every event with its own id, so no event starts with the bytes of the one before
    /// (the tracker's shared-prefix shortcut never applies; engines do not do this).
    fn vllm_stream(chunks: usize, distinct_ids: bool) -> Vec<Vec<u8>> {
        let mut state = 0x9e37_79b9_7f4a_7c15;
        let head = |i: usize| {
            let id = if distinct_ids {
                format!("chatcmpl-{i:032x}")
            } else {
                "chatcmpl-3f1c9a5e2b7d4c8e9a0b1c2d3e4f5a6b".to_string()
            };
            format!(
                r#"{{"id":"{id}","object":"chat.completion.chunk","created":1764590000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{{"index":0,"delta":"#
            )
        };
        let prompt: u64 = 1834;
        let mut out = Vec::with_capacity(chunks + 2);
        for i in 0..chunks {
            let delta = if i == 0 {
                r#"{"role":"assistant","content":""}"#.to_string()
            } else {
                let w = WORDS[(next(&mut state) % WORDS.len() as u64) as usize];
                format!(r#"{{"content":"{w}"}}"#)
            };
            let finish = if i + 1 == chunks {
                r#""length""#
            } else {
                "null"
            };
            let done = i as u64;
            out.push(
                format!(
                    "data: {}{delta},\"logprobs\":null,\"finish_reason\":{finish}}}],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{done}}}}}\n\n",
                    head(i),
                    prompt + done
                )
                .into_bytes(),
            );
        }
        out.push(
            format!(
                "data: {{\"id\":\"chatcmpl-3f1c9a5e2b7d4c8e9a0b1c2d3e4f5a6b\",\"object\":\"chat.completion.chunk\",\"created\":1764590000,\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{chunks}}}}}\n\n",
                prompt + chunks as u64
            )
            .into_bytes(),
        );
        out.push(b"data: [DONE]\n\n".to_vec());
        out
    }

    /// A non-streamed chat completion with `bytes` of generated text.
    fn json_body(bytes: usize) -> Vec<u8> {
        let mut state = 7;
        let mut text = String::new();
        while text.len() < bytes {
            text.push_str(WORDS[(next(&mut state) % WORDS.len() as u64) as usize]);
        }
        format!(
            r#"{{"id":"chatcmpl-1","object":"chat.completion","created":1764590000,"model":"meta-llama/Llama-3.1-8B-Instruct","choices":[{{"index":0,"message":{{"role":"assistant","content":"{text}","tool_calls":[]}},"logprobs":null,"finish_reason":"stop","stop_reason":null}}],"usage":{{"prompt_tokens":1834,"total_tokens":51834,"completion_tokens":50000,"prompt_tokens_details":{{"cached_tokens":1024}}}},"prompt_logprobs":null}}"#
        )
        .into_bytes()
    }

    fn feed_all(kind: BodyKind, wants: ClientWants, chunks: &[Vec<u8>], out: &mut Vec<u8>) -> u64 {
        let mut t = UsageTracker::new(kind, wants);
        let mut sent = 0u64;
        for (i, c) in chunks.iter().enumerate() {
            sent += match t.feed(black_box(c), i + 1 == chunks.len(), out) {
                Forward::Unchanged => c.len() as u64,
                Forward::Replaced => out.len() as u64,
            };
        }
        sent + t.report().usage.completion_tokens
    }

    fn usage(c: &mut Criterion) {
        let events = vllm_stream(2000, false);
        let distinct = vllm_stream(2000, true);
        let stream: Vec<u8> = events.concat();
        let segments: Vec<Vec<u8>> = stream.chunks(1460).map(<[u8]>::to_vec).collect();
        let body = json_body(200_000);
        let body_segments: Vec<Vec<u8>> = body.chunks(16 * 1024).map(<[u8]>::to_vec).collect();
        let all = ClientWants {
            include_usage: true,
            continuous_usage: true,
            null_when_absent: false,
        };
        let none = ClientWants::default();
        let final_only = ClientWants {
            include_usage: true,
            continuous_usage: false,
            null_when_absent: false,
        };
        // A client of an engine that writes `"usage":null`: each chunk's value replaced.
        let nulls = ClientWants {
            null_when_absent: true,
            ..none
        };
        eprintln!(
            "stream: {} events, {} bytes ({} per event); body {} bytes",
            events.len(),
            stream.len(),
            stream.len() / events.len(),
            body.len()
        );

        let mut g = c.benchmark_group("usage");
        g.throughput(Throughput::Bytes(stream.len() as u64));
        let mut out = Vec::with_capacity(64 * 1024);
        for (name, wants, chunks) in [
            ("sse/observe/per_event", all, &events),
            ("sse/observe/tcp_segments", all, &segments),
            ("sse/rewrite_none/per_event", none, &events),
            ("sse/rewrite_none/tcp_segments", none, &segments),
            ("sse/rewrite_final_only/per_event", final_only, &events),
            ("sse/rewrite_none/distinct_ids", none, &distinct),
            ("sse/rewrite_nulls/per_event", nulls, &events),
            ("sse/rewrite_nulls/tcp_segments", nulls, &segments),
        ] {
            g.bench_function(name, |b| {
                b.iter(|| feed_all(BodyKind::EventStream, wants, chunks, &mut out))
            });
        }
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function("json/observe/16k_chunks", |b| {
            b.iter(|| feed_all(BodyKind::Json, none, &body_segments, &mut out))
        });
        g.finish();
    }

    criterion_group!(benches, usage);
}

#[cfg(not(target_family = "wasm"))]
criterion::criterion_main!(imp::benches);

#[cfg(target_family = "wasm")]
fn main() {}
