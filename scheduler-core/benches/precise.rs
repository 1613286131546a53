//! The precise prefix index: KV event batches decoded and applied per second, and memory
//! per stored block.
//!
//! The stream: batches of 16 events as an engine publishes them under load — 8 `BlockStored`
//! of 4 blocks × 16 tokens (every other one a new prompt, the rest continuing the previous
//! event's chain), interleaved with 8 `BlockRemoved` of 4 older blocks — encoded both ways
//! vLLM releases do (positional arrays; tagged maps). 4096 distinct batches are cycled into
//! an index bounded at 1024 blocks (the stream keeps about 2048 live), so stores also evict
//! and some removals miss.
//!
//! Run: `cargo bench -p scheduler-core --bench precise`.
#![allow(clippy::panic)] // a bench fails loudly on a payload it built itself

#[cfg(not(target_family = "wasm"))]
mod imp {
    use criterion::{black_box, criterion_group, Criterion, Throughput};
    use scheduler_core::kv_events::{decode_batch, EngineBlockHash, KvEvent};
    use scheduler_core::prefix::precise::{kv_seed, token_block_keys, Applied, PreciseIndex};
    use scheduler_core::types::Millis;

    const EVENTS_PER_BATCH: u64 = 16;
    const BATCHES: usize = 4096;
    const BLOCK: u32 = 16;
    const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
    const EP: &str = "10.0.0.1:8000";

    fn uint(o: &mut Vec<u8>, v: u64) {
        match v {
            0..=0x7f => o.push(v as u8),
            0x80..=0xffff => {
                o.push(0xcd);
                o.extend_from_slice(&(v as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                o.push(0xce);
                o.extend_from_slice(&(v as u32).to_be_bytes());
            }
            _ => {
                o.push(0xcf);
                o.extend_from_slice(&v.to_be_bytes());
            }
        }
    }
    fn str(o: &mut Vec<u8>, s: &str) {
        o.push(0xa0 | s.len() as u8);
        o.extend_from_slice(s.as_bytes());
    }
    fn array(o: &mut Vec<u8>, n: usize) {
        if n < 16 {
            o.push(0x90 | n as u8);
        } else {
            o.push(0xdc);
            o.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }

    /// Field names (map encoding) or nothing (positional), then the value.
    fn field(o: &mut Vec<u8>, maps: bool, name: &str) {
        if maps {
            str(o, name);
        }
    }

    fn encode(events: &[KvEvent], maps: bool) -> Vec<u8> {
        let mut o = Vec::new();
        array(&mut o, 3);
        o.push(0xcb);
        o.extend_from_slice(&1.7e9f64.to_be_bytes());
        array(&mut o, events.len());
        for ev in events {
            match ev {
                KvEvent::BlockStored {
                    block_hashes,
                    parent,
                    token_ids,
                    block_size,
                    ..
                } => {
                    if maps {
                        o.push(0x88);
                        str(&mut o, "type");
                    } else {
                        array(&mut o, 8);
                    }
                    str(&mut o, "BlockStored");
                    field(&mut o, maps, "block_hashes");
                    array(&mut o, block_hashes.len());
                    block_hashes.iter().for_each(|h| uint(&mut o, h.0));
                    field(&mut o, maps, "parent_block_hash");
                    match parent {
                        Some(p) => uint(&mut o, p.0),
                        None => o.push(0xc0),
                    }
                    field(&mut o, maps, "token_ids");
                    array(&mut o, token_ids.len());
                    token_ids.iter().for_each(|t| uint(&mut o, u64::from(*t)));
                    field(&mut o, maps, "block_size");
                    uint(&mut o, u64::from(*block_size));
                    field(&mut o, maps, "lora_id");
                    o.push(0xc0);
                    field(&mut o, maps, "medium");
                    str(&mut o, "GPU");
                    field(&mut o, maps, "lora_name");
                    o.push(0xc0);
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    if maps {
                        o.push(0x83);
                        str(&mut o, "type");
                    } else {
                        array(&mut o, 3);
                    }
                    str(&mut o, "BlockRemoved");
                    field(&mut o, maps, "block_hashes");
                    array(&mut o, block_hashes.len());
                    block_hashes.iter().for_each(|h| uint(&mut o, h.0));
                    field(&mut o, maps, "medium");
                    str(&mut o, "GPU");
                }
                KvEvent::AllBlocksCleared => {
                    array(&mut o, 1);
                    str(&mut o, "AllBlocksCleared");
                }
            }
        }
        o.push(0);
        o
    }

    /// The synthetic stream (module doc), as event lists.
    fn stream() -> Vec<Vec<KvEvent>> {
        let mut next_hash = 1u64 << 40;
        let mut last: Option<u64> = None;
        let mut tok = 100u32;
        let mut out = Vec::with_capacity(BATCHES);
        for b in 0..BATCHES {
            let mut evs = Vec::with_capacity(EVENTS_PER_BATCH as usize);
            for e in 0..8 {
                let parent = if e % 2 == 0 { None } else { last };
                let hashes: Vec<EngineBlockHash> = (0..4)
                    .map(|_| {
                        next_hash += 0x9e37_79b9;
                        EngineBlockHash(next_hash)
                    })
                    .collect();
                last = hashes.last().map(|h| h.0);
                let token_ids: Vec<u32> = (0..4 * BLOCK)
                    .map(|_| {
                        tok = tok.wrapping_mul(1_103_515_245).wrapping_add(12_345) % 150_000;
                        tok
                    })
                    .collect();
                evs.push(KvEvent::BlockStored {
                    block_hashes: hashes,
                    parent: parent.map(EngineBlockHash),
                    token_ids,
                    block_size: BLOCK,
                    lora_name: None,
                });
                // Removes 4 blocks stored about 64 batches earlier.
                let old = next_hash.wrapping_sub(64 * 32 * 0x9e37_79b9);
                evs.push(KvEvent::BlockRemoved {
                    block_hashes: (0..4u64)
                        .map(|i| EngineBlockHash(old + i * 0x9e37_79b9))
                        .collect(),
                });
            }
            let _ = b;
            out.push(evs);
        }
        out
    }

    fn add(total: &mut Applied, a: Applied) {
        total.stored += a.stored;
        total.removed += a.removed;
        total.evicted += a.evicted;
        total.skipped += a.skipped;
    }

    fn decode_apply(c: &mut Criterion) {
        let events = stream();
        let mut g = c.benchmark_group("kv_events_decode_apply");
        g.throughput(Throughput::Elements(EVENTS_PER_BATCH));
        for maps in [false, true] {
            let payloads: Vec<Vec<u8>> = events.iter().map(|e| encode(e, maps)).collect();
            let bytes: usize = payloads.iter().map(Vec::len).sum();
            let name = if maps { "tagged_maps" } else { "positional" };
            eprintln!(
                "{name}: {} batches, {:.0} bytes per batch",
                payloads.len(),
                bytes as f64 / payloads.len() as f64
            );
            let mut index = PreciseIndex::new(1024);
            let mut total = Applied::default();
            for p in &payloads {
                for ev in &decode_batch(p).unwrap_or_else(|e| panic!("{e}")).events {
                    add(&mut total, index.apply(EP, MODEL, ev));
                }
            }
            eprintln!("{name}: one pass applied {total:?}");
            let mut i = 0usize;
            g.bench_function(name, |b| {
                b.iter(|| {
                    i = (i + 1) % payloads.len();
                    let batch =
                        decode_batch(black_box(&payloads[i])).unwrap_or_else(|e| panic!("{e}"));
                    for ev in &batch.events {
                        black_box(index.apply(EP, MODEL, ev));
                    }
                })
            });
            let mut j = 0usize;
            g.bench_function(format!("{name}_decode_only"), |b| {
                b.iter(|| {
                    j = (j + 1) % payloads.len();
                    decode_batch(black_box(&payloads[j])).map(|b| b.events.len())
                })
            });
        }
        g.finish();
    }

    fn matching(c: &mut Criterion) {
        // One endpoint holding an 8k-token conversation (512 blocks of 16) among 262144 blocks.
        let mut index = PreciseIndex::new(262_144);
        let tokens: Vec<u32> = (0..8192u32)
            .map(|i| i.wrapping_mul(2_654_435_761) % 150_000)
            .collect();
        let keys = token_block_keys(kv_seed(MODEL), &tokens, BLOCK, 8192);
        let ev = KvEvent::BlockStored {
            block_hashes: (0..512).map(|i| EngineBlockHash(7 << 50 | i)).collect(),
            parent: None,
            token_ids: tokens.clone(),
            block_size: BLOCK,
            lora_name: None,
        };
        index.apply(EP, MODEL, &ev);
        memory_fill(&mut index, 262_144 - 512);
        eprintln!(
            "one endpoint: {} blocks, {} bytes, {:.1} bytes per stored block",
            index.stored_blocks(EP),
            index.memory_bytes(),
            index.memory_bytes() as f64 / index.stored_blocks(EP) as f64
        );
        assert_eq!(index.matched_blocks(EP, &keys, Millis(0)), 512);
        c.bench_function("precise_match_8k_tokens_512_blocks", |b| {
            b.iter(|| index.matched_blocks(black_box(EP), black_box(&keys), Millis(0)))
        });
        c.bench_function("precise_token_block_keys_8k_tokens", |b| {
            b.iter(|| token_block_keys(kv_seed(MODEL), black_box(&tokens), BLOCK, 8192))
        });
    }

    /// Stores `n` more single-block prompts of distinct tokens on `EP`.
    fn memory_fill(index: &mut PreciseIndex, n: u64) {
        for i in 0..n {
            let ev = KvEvent::BlockStored {
                block_hashes: vec![EngineBlockHash(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))],
                parent: None,
                token_ids: (0..BLOCK)
                    .map(|t| (i as u32).wrapping_add(t << 20))
                    .collect(),
                block_size: BLOCK,
                lora_name: None,
            };
            index.apply(EP, MODEL, &ev);
        }
    }

    criterion_group!(benches, decode_apply, matching);
}

#[cfg(not(target_family = "wasm"))]
criterion::criterion_main!(imp::benches);

#[cfg(target_family = "wasm")]
fn main() {}
