//! Prefix-index matching for an 8k-token request (128 blocks of 64 tokens) over 16 and 100
//! endpoints whose LRUs are full (31,250 blocks each) of other traffic, plus the index's
//! memory per stored block.
//!
//! Scenarios: `typical` — a 2k-token system prompt is cached everywhere and 7.5k tokens of
//! this conversation on 2 endpoints; `all_full` — every endpoint holds the whole request
//! (worst case for matching); `miss` — no endpoint holds any of it.
//!
//! `prefix_few_holders`: the same request over 10 and 1000 endpoints, each holding 4096
//! blocks of other traffic, of which only 3 hold the request (120 of its 128 blocks): the
//! index's sparse answer (`holders`) must cost the same at both sizes; `match_endpoints`
//! (one answer per endpoint, as the scheduler needs) adds one name lookup per endpoint.
//! Also prints the index's memory per million stored blocks.
//!
//! `prefix_record_*`: recording a request: one of 128 new blocks into a full LRU, a
//! conversation's next turn (120 blocks stored, 8 new), the same request again.
//!
//! Run: `cargo bench -p scheduler-core --bench prefix_index`.

#[cfg(not(target_family = "wasm"))]
mod imp {
    use criterion::{black_box, criterion_group, BenchmarkId, Criterion};
    use scheduler_core::prefix::{block_hashes, seed, PrefixConfig, PrefixIndex};
    use scheduler_core::types::BlockHash;
    use xxhash_rust::xxh3::xxh3_64;

    /// A synthetic chain of `n` hashes that shares the first `shared` of `base`.
    fn chain(base: &[BlockHash], shared: usize, n: usize, tag: u64) -> Vec<BlockHash> {
        let mut out: Vec<BlockHash> = base.iter().take(shared).copied().collect();
        while out.len() < n {
            let i = out.len() as u64;
            out.push(BlockHash(xxh3_64(
                &[tag.to_le_bytes(), i.to_le_bytes()].concat(),
            )));
        }
        out
    }

    /// An index over `n` endpoints, each filled to capacity with other 128-block requests
    /// that share the request's system prompt (first `system_blocks`), then the scenario.
    fn warm_index(n: usize, request: &[BlockHash], scenario: &str) -> (PrefixIndex, Vec<String>) {
        let cfg = PrefixConfig::default();
        let mut index = PrefixIndex::new(cfg);
        let names: Vec<String> = (0..n)
            .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250 + 1))
            .collect();
        let system_blocks = if scenario == "miss" { 0 } else { 32 };
        let per_endpoint = cfg.lru_capacity_per_server as usize / 128 + 1;
        for (e, name) in names.iter().enumerate() {
            for r in 0..per_endpoint {
                let other = chain(request, system_blocks, 128, (e * 1_000_003 + r) as u64);
                index.record(name, &other);
            }
            match scenario {
                "all_full" => index.record(name, request),
                "typical" if e == 3 || e == n / 2 => index.record(name, &request[..120]),
                _ => {}
            }
        }
        (index, names)
    }

    fn prefix_match(c: &mut Criterion) {
        let cfg = PrefixConfig::default();
        let prompt: Vec<u8> = (0..8192 * 4)
            .map(|i: u32| b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26)
            .collect();
        let request = block_hashes(
            seed("meta-llama/Llama-3.1-8B-Instruct", None),
            &prompt,
            &cfg,
        );
        assert_eq!(request.len(), 128);
        let mut g = c.benchmark_group("prefix_match_8k_tokens");
        for scenario in ["typical", "all_full", "miss"] {
            for n in [16usize, 100] {
                let (index, names) = warm_index(n, &request, scenario);
                if scenario == "typical" {
                    eprintln!(
                        "{n} endpoints: {} blocks stored, {} bytes, {:.1} bytes per stored block",
                        index.total_blocks(),
                        index.memory_bytes(),
                        index.memory_bytes() as f64 / index.total_blocks() as f64
                    );
                }
                let eps: Vec<&str> = names.iter().map(String::as_str).collect();
                let mut out = Vec::with_capacity(n);
                index.match_endpoints(&eps, &request, &mut out);
                eprintln!(
                    "{scenario}/{n}: matched blocks {:?}",
                    &out[..out.len().min(8)]
                );
                g.bench_with_input(BenchmarkId::new(scenario, n), &n, |b, _| {
                    b.iter(|| {
                        index.match_endpoints(black_box(&eps), black_box(&request), &mut out);
                        out.len()
                    })
                });
            }
        }
        g.finish();
    }

    fn prefix_record(c: &mut Criterion) {
        let cfg = PrefixConfig::default();
        let mut index = PrefixIndex::new(cfg);
        let base: Vec<BlockHash> = chain(&[], 0, 128, 1);
        for r in 0..300 {
            index.record("10.0.0.1:8000", &chain(&base, 32, 128, r + 10));
        }
        let mut r = 1_000_000u64;
        c.bench_function("prefix_record_8k_tokens_full_lru", |b| {
            b.iter(|| {
                r += 1;
                let req = chain(&base, 32, 128, r);
                index.record(black_box("10.0.0.1:8000"), &req);
            })
        });
    }

    /// A conversation's next turn: its 120 blocks stored by the previous turn (behind a
    /// system prompt another request touched since), plus 8 new ones; and the same request
    /// again (a retry, or a client resending), all 128 stored.
    fn prefix_record_next_turn(c: &mut Criterion) {
        let cfg = PrefixConfig::default();
        let base: Vec<BlockHash> = chain(&[], 0, 128, 1);
        let turn = chain(&base, 32, 128, 42);
        let setup = || {
            let mut index = PrefixIndex::new(cfg);
            for r in 0..100 {
                index.record("10.0.0.1:8000", &chain(&base, 32, 128, r + 10));
            }
            index.record("10.0.0.1:8000", &turn[..120]);
            index.record("10.0.0.1:8000", &chain(&base, 32, 128, 7));
            index
        };
        c.bench_function("prefix_record_next_turn_128_blocks", |b| {
            b.iter_batched(
                setup,
                |mut index| {
                    index.record(black_box("10.0.0.1:8000"), &turn);
                    index
                },
                criterion::BatchSize::LargeInput,
            )
        });
        c.bench_function("prefix_record_same_turn_128_blocks", |b| {
            let mut index = setup();
            index.record("10.0.0.1:8000", &turn);
            b.iter(|| index.record(black_box("10.0.0.1:8000"), &turn))
        });
    }

    /// `n` endpoints with 32 other 128-block requests each; endpoints 1, 3 and `n / 2` also
    /// hold the request's first 120 blocks.
    fn few_holders_index(n: usize, request: &[BlockHash]) -> (PrefixIndex, Vec<String>) {
        let mut index = PrefixIndex::new(PrefixConfig::default());
        let names: Vec<String> = (0..n)
            .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250 + 1))
            .collect();
        for (e, name) in names.iter().enumerate() {
            for r in 0..32 {
                index.record(name, &chain(&[], 0, 128, (e * 1_000_003 + r) as u64 + 7));
            }
            if e == 1 || e == 3 || e == n / 2 {
                index.record(name, &request[..120]);
            }
        }
        (index, names)
    }

    fn prefix_few_holders(c: &mut Criterion) {
        let request = chain(&[], 0, 128, u64::MAX);
        let mut g = c.benchmark_group("prefix_few_holders");
        for n in [10usize, 1000] {
            let (index, names) = few_holders_index(n, &request);
            let mib = index.memory_bytes() as f64 / (1024.0 * 1024.0);
            eprintln!(
                "{n} endpoints: {} blocks, {} heads, {:.1} bytes per block, {:.1} MiB per million blocks",
                index.total_blocks(),
                index.total_heads(),
                index.memory_bytes() as f64 / index.total_blocks() as f64,
                mib * 1e6 / index.total_blocks() as f64
            );
            let eps: Vec<&str> = names.iter().map(String::as_str).collect();
            let mut out = Vec::with_capacity(n);
            index.match_endpoints(&eps, &request, &mut out);
            assert_eq!(out.iter().filter(|m| **m == 120).count(), 3);
            g.bench_with_input(BenchmarkId::new("match_endpoints", n), &n, |b, _| {
                b.iter(|| {
                    index.match_endpoints(black_box(&eps), black_box(&request), &mut out);
                    out.len()
                })
            });
            holders_arm(&mut g, &index, &request, n);
        }
        g.finish();
    }

    fn holders_arm(
        g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        index: &PrefixIndex,
        request: &[BlockHash],
        n: usize,
    ) {
        let mut found = Vec::new();
        index.holders(request, &mut found);
        assert_eq!(found.len(), 3);
        g.bench_with_input(BenchmarkId::new("holders", n), &n, |b, _| {
            b.iter(|| {
                index.holders(black_box(request), &mut found);
                found.len()
            })
        });
    }

    criterion_group!(
        benches,
        prefix_match,
        prefix_record,
        prefix_record_next_turn,
        prefix_few_holders
    );
}

#[cfg(not(target_family = "wasm"))]
criterion::criterion_main!(imp::benches);

#[cfg(target_family = "wasm")]
fn main() {}
