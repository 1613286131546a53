//! Benchmarks of the metrics path: decoding the snapshot the picker reads on every
//! request (16 and 100 endpoints), the header check that lets it skip re-decoding, and
//! extracting a realistic vLLM page (what the scraper does per endpoint per round).
//!
//! Run: `cargo bench -p scheduler-core --bench snapshot`.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use scheduler_core::metrics::{extract, CacheConfig, EndpointMetrics, LoraState, MetricNames};
use scheduler_core::snapshot::{
    decode, encode_with_generation, read_header, EndpointSample, Snapshot, SnapshotCache,
};
use scheduler_core::types::Millis;

const VLLM_PAGE: &str = include_str!("../../testdata/metrics/vllm-0.10-lora.txt");

/// A pool of `n` endpoints with every field present, as a busy vLLM pool would look;
/// every fourth endpoint has LoRA adapters.
fn pool(n: u32) -> Snapshot {
    let endpoints = (0..n)
        .map(|i| EndpointSample {
            address: format!("10.0.{}.{}:8000", i / 250, i % 250 + 1),
            scraped_at: Millis(1_756_392_103_000 + u64::from(i)),
            consecutive_failures: 0,
            metrics: Some(EndpointMetrics {
                waiting: Some(i % 7),
                running: Some(8 + i % 13),
                kv_cache_usage: Some(f64::from(i % 100) / 100.0),
                cache: Some(CacheConfig {
                    block_size: 16,
                    num_blocks: 27_544,
                }),
                lora: (i % 4 == 0).then(|| LoraState {
                    max: 4,
                    running: vec!["sql-lora".into(), "summarize-lora".into()],
                    waiting: vec!["tweet-lora".into()],
                }),
            }),
        })
        .collect();
    Snapshot {
        taken_at: Millis(1_756_392_103_500),
        clusters: Vec::new(),
        endpoints,
    }
}

fn snapshot_benches(c: &mut Criterion) {
    for n in [16u32, 100] {
        let bytes = encode_with_generation(&pool(n), 7);
        let mut group = c.benchmark_group(format!("snapshot/{n}_endpoints"));
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_function("decode", |b| b.iter(|| decode(black_box(&bytes))));
        group.bench_function("read_header", |b| b.iter(|| read_header(black_box(&bytes))));
        // What the picker pays per request: an unchanged snapshot is a header compare.
        let mut cache = SnapshotCache::default();
        let _ = cache.update(&bytes);
        group.bench_function("cache_unchanged", |b| {
            b.iter(|| cache.update(black_box(&bytes)))
        });
        // A new generation of the same pool: decoded into the cache's spare buffers.
        let other = encode_with_generation(&pool(n), 8);
        let mut flip = false;
        group.bench_function("cache_redecode", |b| {
            b.iter(|| {
                flip = !flip;
                cache.update(black_box(if flip { &other } else { &bytes }))
            })
        });
        let snap = pool(n);
        group.bench_function("encode", |b| {
            b.iter(|| encode_with_generation(black_box(&snap), 7))
        });
        group.finish();
    }
}

fn metrics_benches(c: &mut Criterion) {
    let names = MetricNames::default();
    let mut group = c.benchmark_group("metrics");
    group.throughput(Throughput::Bytes(VLLM_PAGE.len() as u64));
    group.bench_function("extract_vllm_page", |b| {
        b.iter(|| extract(black_box(VLLM_PAGE.as_bytes()), &names))
    });
    group.finish();
}

criterion_group!(benches, snapshot_benches, metrics_benches);
criterion_main!(benches);
