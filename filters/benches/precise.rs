//! What the precise prefix index adds per request: the body tokenized with the simulator's
//! token model and cut into 16-token block keys (`PreciseShared::keys`), against the
//! approximate index's parse and byte hashing of the same body (`request::parse` +
//! `prefix::block_hashes`), on 32 KB and 128 KB chat bodies.

// A broken bench fixture should stop the bench loudly.
#![allow(clippy::panic)]

use criterion::{black_box, Criterion, Throughput};
use infergate_filters::precise::PreciseShared;
use scheduler_core::prefix::precise::PreciseSettings;
use scheduler_core::prefix::{block_hashes, seed, PrefixConfig};
use scheduler_core::request::{self, Api};
use serde_json::json;

fn body(bytes: usize) -> Vec<u8> {
    let system = "the assistant answers in full sentences. ".repeat(bytes / 41);
    json!({"model": "m", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": "what is the weather like?"}
    ]})
    .to_string()
    .into_bytes()
}

pub fn bench(c: &mut Criterion) {
    let precise = match PreciseShared::new(&PreciseSettings::default()) {
        Ok(p) => p,
        Err(e) => panic!("bench precise index: {e}"),
    };
    let cfg = PrefixConfig::default();
    let mut group = c.benchmark_group("precise_keys");
    for kb in [32usize, 128] {
        let b = body(kb * 1024);
        group.throughput(Throughput::Bytes(b.len() as u64));
        group.bench_function(format!("sim_tokenizer_keys/{kb}KB"), |bench| {
            bench.iter(|| black_box(precise.keys(Api::ChatCompletions, "m", black_box(&b))))
        });
        group.bench_function(format!("approx_parse_and_hash/{kb}KB"), |bench| {
            bench.iter(|| {
                let parsed = request::parse_with_limit(
                    Api::ChatCompletions,
                    black_box(&b),
                    cfg.max_prompt_bytes(),
                );
                parsed.map(|p| block_hashes(seed("m", None), &p.prompt, &cfg))
            })
        });
    }
    group.finish();
}
