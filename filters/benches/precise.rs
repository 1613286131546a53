//! What the precise prefix index adds per request: the body tokenized with the simulator's
//! token model and cut into 16-token block keys (`PreciseShared::keys`), against the
//! approximate index's parse and byte hashing of the same body (`request::parse` +
//! `prefix::block_hashes`), on 32 KB and 128 KB chat bodies. With the `hf-tokenizer`
//! feature, also the Hugging Face tokenizer: the tiny one of `testdata/tokenizer/tiny`, or
//! the model directory `INFERGATE_HF_MODEL_DIR` names (its `tokenizer.json` and chat
//! template; e.g. a Qwen or Llama download).

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
    #[cfg(feature = "hf-tokenizer")]
    let hf = hf_index();
    let cfg = PrefixConfig::default();
    let mut group = c.benchmark_group("precise_keys");
    for kb in [32usize, 128] {
        let b = body(kb * 1024);
        group.throughput(Throughput::Bytes(b.len() as u64));
        group.bench_function(format!("sim_tokenizer_keys/{kb}KB"), |bench| {
            bench.iter(|| black_box(precise.keys(Api::ChatCompletions, "m", black_box(&b))))
        });
        #[cfg(feature = "hf-tokenizer")]
        group.bench_function(format!("hf_tokenizer_keys/{kb}KB"), |bench| {
            bench.iter(|| black_box(hf.keys(Api::ChatCompletions, "m", black_box(&b))))
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

/// The precise index with the Hugging Face tokenizer (see the module doc); prints the
/// directory and how long loading it took.
#[cfg(feature = "hf-tokenizer")]
fn hf_index() -> PreciseShared {
    let dir = std::env::var("INFERGATE_HF_MODEL_DIR").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/tokenizer/tiny").to_string()
    });
    let settings = PreciseSettings {
        tokenizer: json!({"type": "huggingface", "path": dir}),
        ..PreciseSettings::default()
    };
    let start = std::time::Instant::now();
    let index = match PreciseShared::new(&settings) {
        Ok(p) => p,
        Err(e) => panic!("bench precise index with {dir}: {e}"),
    };
    eprintln!("hf tokenizer {dir}: loaded in {:?}", start.elapsed());
    let probe = body(1024);
    if index.keys(Api::ChatCompletions, "m", &probe).is_empty() {
        panic!("the hf tokenizer gave no keys for a chat body");
    }
    index
}
