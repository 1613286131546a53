//! KV blocks received from another replica: the decode side of prefill/decode
//! disaggregation.
//!
//! A replica that decodes a prompt another replica prefilled receives the prompt's KV
//! blocks over the KV connector instead of computing them. [`Engine::import_prefix`] puts
//! such blocks into the prefix cache (allocated, registered under their hashes, then
//! released to the free queue, as vLLM's connector leaves them once the transfer is done),
//! so that the request submitted right after finds them as a prefix hit and computes only
//! its last, partial block. Imported blocks are ordinary cached blocks: a later request with
//! the same prefix hits them too, and pressure evicts them least recently freed first.

use super::cache_events::token_ids;
use super::{BlockHash, Engine};
use crate::prompt::BYTES_PER_TOKEN;

impl Engine {
    /// Imports the full blocks of `hashes` (a prompt's chained block hashes, in order) into
    /// the prefix cache. Blocks already cached stay as they are (and are not counted);
    /// import stops at the first block that cannot be allocated (the cache is full of
    /// referenced blocks), since a chain with a hole cannot be hit past it. Returns the
    /// blocks imported. Does nothing when prefix caching is off.
    pub fn import_prefix(&mut self, hashes: &[BlockHash]) -> usize {
        self.import_prefix_bytes(hashes, None, None)
    }

    /// [`Engine::import_prefix`] with the prompt's bytes (and adapter), so the KV events'
    /// stores of the imported blocks carry their token ids.
    pub fn import_prefix_bytes(
        &mut self,
        hashes: &[BlockHash],
        content: Option<&[u8]>,
        lora: Option<&str>,
    ) -> usize {
        if !self.cfg.enable_prefix_caching {
            return 0;
        }
        let block_bytes = self.cfg.block_size.max(1) as usize * BYTES_PER_TOKEN;
        let mut imported = 0;
        for (b, hash) in hashes.iter().enumerate() {
            if !self
                .pool
                .lookup_prefix(core::slice::from_ref(hash))
                .is_empty()
            {
                continue;
            }
            let Some(ids) = self.pool.allocate(1) else {
                break;
            };
            for id in &ids {
                let bytes = content.and_then(|c| c.get(b * block_bytes..(b + 1) * block_bytes));
                if self.pool.register(*id, *hash) {
                    if let Some(bytes) = bytes {
                        let parent = b.checked_sub(1).and_then(|p| hashes.get(p)).copied();
                        self.pool.log_stored(*hash, parent, token_ids(bytes), lora);
                    }
                }
            }
            self.pool.release(&ids);
            imported += 1;
        }
        imported
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::{EngineConfig, EngineEvent, EngineRequest, RequestId, SimTime};
    use super::*;

    fn cfg() -> EngineConfig {
        EngineConfig {
            kv_capacity_tokens: 16 * 64,
            block_size: 16,
            prefill_tokens_per_s: 1000.0,
            decode_base_ms: 0.0,
            decode_per_seq_ms: 0.0,
            ..EngineConfig::default()
        }
    }

    fn request(blocks: u64) -> EngineRequest {
        EngineRequest {
            prompt_tokens: u32::try_from(blocks * 16).unwrap() + 1,
            block_hashes: (1..=blocks).map(BlockHash).collect(),
            output_tokens: 1,
            lora: None,
            priority: 0,
        }
    }

    /// Runs one request alone and returns when its first token came (simulated seconds).
    fn first_token_secs(engine: &mut Engine, id: u64, req: EngineRequest) -> f64 {
        engine.submit(SimTime(0), RequestId(id), req).unwrap();
        let mut out = Vec::new();
        let mut now = SimTime(0);
        while let Some(t) = engine.next_wakeup() {
            now = t;
            engine.advance(now, &mut out);
            if out.iter().any(|e| matches!(e, EngineEvent::Token { .. })) {
                break;
            }
        }
        now.as_secs_f64()
    }

    #[test]
    fn an_imported_prompt_is_a_prefix_hit_and_costs_no_prefill() {
        let cold = first_token_secs(&mut Engine::new(cfg()), 1, request(32));
        let mut warm = Engine::new(cfg());
        assert_eq!(warm.import_prefix(&request(32).block_hashes), 32);
        assert_eq!(
            warm.import_prefix(&request(32).block_hashes),
            0,
            "already cached"
        );
        let t = first_token_secs(&mut warm, 1, request(32));
        // Cold: 513 tokens at 1000/s; imported: only the last token is computed.
        assert!((cold - 0.513).abs() < 1e-6, "cold {cold}");
        assert!(t < 0.002, "imported {t}");
        assert_eq!(warm.stats().counters.prefix_hits_tokens, 512);
    }

    #[test]
    fn import_stops_when_no_block_is_free_and_is_off_without_prefix_caching() {
        let mut small = Engine::new(EngineConfig {
            kv_capacity_tokens: 16 * 4,
            ..cfg()
        });
        // Four blocks: the first two are evicted by the last two (least recently freed).
        assert_eq!(small.import_prefix(&request(6).block_hashes), 6);
        let mut off = Engine::new(EngineConfig {
            enable_prefix_caching: false,
            ..cfg()
        });
        assert_eq!(off.import_prefix(&request(4).block_hashes), 0);
    }
}
