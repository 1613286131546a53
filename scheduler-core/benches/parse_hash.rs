//! Parse + prefix-hash of realistic multi-turn chat bodies of 32k tokens (~128 KB) and 8k
//! tokens (~32 KB): the work the picker does once per request before scheduling.
//! Target: ≥ 2 GB/s for parse + hash (≤ 65 µs at 128 KB).
//!
//! Run: `cargo bench -p scheduler-core --bench parse_hash`.

#[cfg(not(target_family = "wasm"))]
mod imp {
    use criterion::{black_box, criterion_group, Criterion, Throughput};
    use scheduler_core::prefix::{block_hashes, seed, PrefixConfig};
    use scheduler_core::request::{parse, Api};
    use serde_json::json;

    /// Deterministic pseudo-random chat text: English and code words, a newline every ~12
    /// words, and now and then a quoted word, a tab, a backslash or a non-ASCII word
    /// ("—", "’", "café", "データ"), so JSON escapes appear every ~60 bytes.
    fn text(state: &mut u64, bytes: usize) -> String {
        const WORDS: &[&str] = &[
            "the",
            "model",
            "request",
            "cache",
            "prefix",
            "token",
            "endpoint",
            "latency",
            "function",
            "returns",
            "value",
            "error",
            "config",
            "def",
            "let",
            "x",
            "=",
            "{",
            "}",
            "if",
            "else",
            "for",
            "in",
            "self",
            "async",
            "await",
            "vLLM",
            "KV",
            "block",
            "route",
            "and",
            "of",
            "to",
            "a",
            "is",
            "that",
            "with",
            "we",
            "can",
            "use",
            "this",
            "when",
            "fn",
            "main()",
            "return",
            "None",
            "i32",
            "Vec<u8>",
            "println!",
            "import",
            "numpy",
            "server",
            "queue",
            "scheduler",
            "throughput",
            "GPU",
            "memory",
            "batch",
            "size",
        ];
        const RARE: &[&str] = &[
            "\"quoted\"",
            "\t",
            "C:\\path",
            "—",
            "’s",
            "café",
            "naïve",
            "→",
            "データ",
        ];
        let mut s = String::with_capacity(bytes + 16);
        while s.len() < bytes {
            *state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (*state >> 33) as usize;
            if r.is_multiple_of(12) {
                s.push('\n');
            } else if r.is_multiple_of(29) {
                s.push_str(RARE[(r / 29) % RARE.len()]);
                s.push(' ');
            } else {
                s.push_str(WORDS[(r / 12) % WORDS.len()]);
                s.push(' ');
            }
        }
        s
    }

    /// A multi-turn chat body whose canonical prompt is about `prompt_bytes` bytes, with a
    /// system prompt, alternating turns and two tools after the messages.
    pub fn chat_body(prompt_bytes: usize) -> Vec<u8> {
        let mut state = 42u64;
        let mut messages = vec![json!({"role": "system", "content": text(&mut state, 4_000)})];
        let mut total = 4_000;
        let mut turn = 0;
        while total < prompt_bytes {
            let (role, len) = if turn % 2 == 0 {
                ("user", 1_500)
            } else {
                ("assistant", 6_000)
            };
            messages.push(json!({"role": role, "content": text(&mut state, len)}));
            total += len;
            turn += 1;
        }
        let body = json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "messages": messages,
            "max_completion_tokens": 1024,
            "temperature": 0.7,
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
                {"type": "function", "function": {"name": "search", "description": "Search the web.",
                 "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}
            ],
        });
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// Parse, hash and both, on one chat body whose canonical prompt is about `kb` KiB.
    fn bench_body(c: &mut Criterion, name: &str, kb: usize) {
        let body = chat_body(kb * 1024);
        let cfg = PrefixConfig::default();
        let parsed = match parse(Api::ChatCompletions, &body) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("bench body rejected: {e:?}");
                return;
            }
        };
        eprintln!(
            "{name}: body {} bytes, canonical prompt {} bytes, {} estimated tokens, {} blocks",
            body.len(),
            parsed.prompt.len(),
            parsed.prompt_tokens.0,
            block_hashes(0, &parsed.prompt, &cfg).len()
        );
        let mut g = c.benchmark_group("parse_hash");
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(format!("{name}/parse+hash"), |b| {
            b.iter(|| {
                let p = parse(Api::ChatCompletions, black_box(&body));
                p.map(|p| block_hashes(seed(&p.model, p.cache_salt.as_deref()), &p.prompt, &cfg))
            })
        });
        g.bench_function(format!("{name}/parse"), |b| {
            b.iter(|| parse(Api::ChatCompletions, black_box(&body)))
        });
        g.throughput(Throughput::Bytes(parsed.prompt.len() as u64));
        g.bench_function(format!("{name}/hash"), |b| {
            b.iter(|| block_hashes(black_box(7), black_box(&parsed.prompt), &cfg))
        });
        g.finish();
    }

    fn parse_hash(c: &mut Criterion) {
        bench_body(c, "chat_32k_tokens", 128);
        bench_body(c, "chat_8k_tokens", 32);
    }

    criterion_group!(benches, parse_hash);
}

#[cfg(not(target_family = "wasm"))]
criterion::criterion_main!(imp::benches);

#[cfg(target_family = "wasm")]
fn main() {}
