//! A full scheduling decision (parse and hashing excluded): an 8k-token request (128 blocks)
//! over 16, 100 and 1000 endpoints with a warm prefix index, default-like config (utilization
//! filter, prefix + placement + queue + KV scorers, max-score picker with 2 fallbacks).
//! Targets: ≤ 10 µs for 16 endpoints, ≤ 40 µs for 100, ≤ 60 µs for 1000.
//!
//! `placement_scorer`: the cost of `rendezvous-placement-scorer` per pick, as the difference
//! between a profile with only that scorer and one with no scorer (both: picker, no prefix
//! index), over 4, 100 and 1000 endpoints.
//!
//! `latency_scorer`: the cost of `latency-observation-scorer` per pick: reading each
//! endpoint's measured-latency estimate at its in-flight load (what the picker does to
//! build the candidates) plus the scorer, as the difference between a profile with the
//! queue scorer and that scorer and one with the queue scorer alone, over 4, 100 and 1000
//! endpoints.
//!
//! Run: `cargo bench -p scheduler-core --bench pick`.

// A broken bench fixture should stop the bench loudly.
#![allow(clippy::panic)]

#[cfg(not(target_family = "wasm"))]
mod imp {
    use criterion::{black_box, criterion_group, Criterion};
    use scheduler_core::metrics::EndpointMetrics;
    use scheduler_core::prefix::{block_hashes, seed, PrefixIndex};
    use scheduler_core::scheduling::{Candidate, NoPrefixIndex, RequestView, Scheduler};
    use scheduler_core::types::{BlockHash, InFlight, Millis, Tokens};

    /// The JSON twin of `testdata/epp/default.yaml`, plus `rendezvous-placement-scorer`.
    const CONFIG: &str = r#"{
      "plugins": [
        {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 64, "maxPrefixTokensToMatch": 131072}},
        {"type": "inflight-load-producer"},
        {"type": "utilization-filter", "parameters": {"fallbackOnEmpty": true, "conditions": [
          {"metric": "kv-cache-utilization", "maxValue": 0.95}, {"metric": "waiting-queue", "maxValue": 64}]}},
        {"type": "prefix-cache-scorer"}, {"type": "rendezvous-placement-scorer"},
        {"type": "queue-scorer"}, {"type": "kv-cache-utilization-scorer"},
        {"type": "max-score-picker", "parameters": {"maxFallbacks": 2}}],
      "schedulingProfiles": [{"name": "default", "plugins": [
        {"pluginRef": "utilization-filter"}, {"pluginRef": "prefix-cache-scorer", "weight": 3},
        {"pluginRef": "rendezvous-placement-scorer", "weight": 5},
        {"pluginRef": "queue-scorer", "weight": 2}, {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
        {"pluginRef": "max-score-picker"}]}]}"#;

    /// Deterministic pseudo-random prompt bytes.
    fn prompt(state: &mut u64, bytes: usize) -> Vec<u8> {
        (0..bytes)
            .map(|_| {
                *state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                b' ' + ((*state >> 33) % 90) as u8
            })
            .collect()
    }

    struct Pool {
        scheduler: Scheduler,
        index: PrefixIndex,
        addresses: Vec<String>,
        metrics: Vec<EndpointMetrics>,
        request: Vec<BlockHash>,
    }

    /// `n` endpoints, each holding 16 unrelated 8k-token prompts (2048 blocks); endpoint
    /// `i` also holds the request's first `(i × 37) mod 129` blocks, so matches spread over
    /// the whole range (one full match, many partial, some none).
    fn pool(n: usize) -> Pool {
        let scheduler = match Scheduler::from_json_str(CONFIG) {
            Ok(s) => s,
            Err(e) => panic!("bench config: {e}"),
        };
        let cfg = scheduler.prefix_config();
        let mut index = scheduler.new_prefix_index();
        let s = seed("meta-llama/Llama-3.1-8B-Instruct", None);
        let mut state = 7u64;
        let prompt_bytes = 8192 * 4;
        let request_prompt = prompt(&mut state, prompt_bytes);
        let request = block_hashes(s, &request_prompt, &cfg);
        assert_eq!(request.len(), 128);
        let addresses: Vec<String> = (0..n)
            .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250))
            .collect();
        let mut metrics = Vec::with_capacity(n);
        for (i, a) in addresses.iter().enumerate() {
            for _ in 0..16 {
                index.record(a, &block_hashes(s, &prompt(&mut state, prompt_bytes), &cfg));
            }
            let shared = (i * 37) % 129;
            index.record(a, request.get(..shared).unwrap_or(&[]));
            metrics.push(EndpointMetrics {
                waiting: Some((i % 7) as u32),
                running: Some((i % 13) as u32),
                kv_cache_usage: Some((i % 10) as f64 / 10.0),
                ..EndpointMetrics::default()
            });
        }
        Pool {
            scheduler,
            index,
            addresses,
            metrics,
            request,
        }
    }

    fn bench_pick(c: &mut Criterion) {
        let mut group = c.benchmark_group("pick_8k_tokens");
        for n in [16usize, 100, 1000] {
            let p = pool(n);
            let candidates = candidates(&p.addresses, &p.metrics);
            let view = RequestView {
                target_model: "meta-llama/Llama-3.1-8B-Instruct",
                base_model: "meta-llama/Llama-3.1-8B-Instruct",
                block_hashes: &p.request,
                prompt_tokens: Tokens(8192),
                last_endpoint_for_session: None,
            };
            let mut random = 0u64;
            group.bench_function(format!("{n}_endpoints"), |b| {
                b.iter(|| {
                    random = random.wrapping_add(1);
                    let d = p.scheduler.schedule(
                        black_box(&view),
                        &candidates,
                        &p.index,
                        random,
                        Millis(0),
                    );
                    black_box(d.picked())
                })
            });
        }
        group.finish();
    }

    fn candidates<'a>(
        addresses: &'a [String],
        metrics: &'a [EndpointMetrics],
    ) -> Vec<Candidate<'a>> {
        addresses
            .iter()
            .zip(metrics)
            .enumerate()
            .map(|(i, (a, m))| Candidate {
                address: a,
                metrics: Some(m),
                inflight: InFlight {
                    requests: (i % 5) as u32,
                    tokens: Tokens((i % 5) as u64 * 9000),
                    prefilling: 0,
                },
                role: scheduler_core::scheduling::Role::Both,
                latency: None,
            })
            .collect()
    }

    fn compile(json: &str) -> Scheduler {
        match Scheduler::from_json_str(json) {
            Ok(s) => s,
            Err(e) => panic!("bench config: {e}"),
        }
    }

    /// `n` endpoints with no prefix index, queues of 0–6 waiting and 0–12 running.
    fn spread_pool(n: usize) -> (Vec<String>, Vec<EndpointMetrics>) {
        let addresses = (0..n)
            .map(|i| format!("10.0.{}.{}:8000", i / 250, i % 250))
            .collect();
        let metrics = (0..n)
            .map(|i| EndpointMetrics {
                waiting: Some((i % 7) as u32),
                running: Some((i % 13) as u32),
                ..EndpointMetrics::default()
            })
            .collect();
        (addresses, metrics)
    }

    fn bench_placement(c: &mut Criterion) {
        let with = compile(
            r#"{"plugins": [{"type": "rendezvous-placement-scorer"}, {"type": "max-score-picker"}]}"#,
        );
        let without = compile(r#"{"plugins": [{"type": "max-score-picker"}]}"#);
        let request: Vec<BlockHash> = (1..=128u64).map(|i| BlockHash(i * 0x9e37_79b9)).collect();
        let mut group = c.benchmark_group("placement_scorer");
        for n in [4usize, 100, 1000] {
            let (addresses, metrics) = spread_pool(n);
            let candidates = candidates(&addresses, &metrics);
            let view = RequestView {
                target_model: "m",
                base_model: "m",
                block_hashes: &request,
                prompt_tokens: Tokens(8192),
                last_endpoint_for_session: None,
            };
            for (arm, s) in [("placement", &with), ("no_scorer", &without)] {
                let mut random = 0u64;
                group.bench_function(format!("{arm}/{n}_endpoints"), |b| {
                    b.iter(|| {
                        random = random.wrapping_add(1);
                        let d = s.schedule(
                            black_box(&view),
                            &candidates,
                            &NoPrefixIndex,
                            random,
                            Millis(0),
                        );
                        black_box(d.picked())
                    })
                });
            }
        }
        group.finish();
    }

    fn bench_latency(c: &mut Criterion) {
        use scheduler_core::latency::{LatencyEstimate, LatencySettings, Observation};
        // Both profiles score the queue too, so neither picks among ties all along.
        let with = compile(
            r#"{"plugins": [{"type": "queue-scorer"}, {"type": "latency-observation-scorer", "parameters": {"tpotTokens": 20}}, {"type": "max-score-picker"}]}"#,
        );
        let without =
            compile(r#"{"plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}]}"#);
        let settings = LatencySettings::default();
        let now = Millis(100_000);
        let request: Vec<BlockHash> = (1..=128u64).map(|i| BlockHash(i * 0x9e37_79b9)).collect();
        let view = RequestView {
            target_model: "m",
            base_model: "m",
            block_hashes: &request,
            prompt_tokens: Tokens(8192),
            last_endpoint_for_session: None,
        };
        let mut group = c.benchmark_group("latency_scorer");
        for n in [4usize, 100, 1000] {
            let (addresses, metrics) = spread_pool(n);
            // Each endpoint measured over 32 responses at loads 0..8, slower where busier.
            let estimates: Vec<LatencyEstimate> = (0..n)
                .map(|i| {
                    let mut e = LatencyEstimate::default();
                    for k in 0..32u32 {
                        let load = k % 8;
                        e.observe(
                            &settings,
                            &Observation {
                                at: Millis(now.0 - 1000 + u64::from(k)),
                                ttft_ms: Some(20.0 + (i % 7) as f64 + 15.0 * f64::from(load)),
                                tpot_ms: Some(8.0 + (i % 3) as f64),
                                inflight_at_dispatch: load,
                                prompt_tokens: 4096,
                            },
                        );
                    }
                    e
                })
                .collect();
            if estimates
                .iter()
                .any(|e| e.view(&settings, now, 0).is_none())
            {
                panic!("bench fixture: an estimate does not count");
            }
            let base = candidates(&addresses, &metrics);
            for arm in ["latency", "queue_only"] {
                let mut candidates = base.clone();
                let mut random = 0u64;
                group.bench_function(format!("{arm}/{n}_endpoints"), |b| {
                    b.iter(|| {
                        random = random.wrapping_add(1);
                        let s = if arm == "latency" {
                            for (c, e) in candidates.iter_mut().zip(&estimates) {
                                c.latency = e.view(&settings, now, c.inflight.requests);
                            }
                            &with
                        } else {
                            &without
                        };
                        let d =
                            s.schedule(black_box(&view), &candidates, &NoPrefixIndex, random, now);
                        black_box(d.picked())
                    })
                });
            }
        }
        group.finish();
    }

    criterion_group!(benches, bench_pick, bench_placement, bench_latency);
}

#[cfg(not(target_family = "wasm"))]
criterion::criterion_main!(imp::benches);

#[cfg(target_family = "wasm")]
fn main() {}
