//! One engine step: scheduling running and waiting sequences under the token budget, KV
//! blocks, `max_num_seqs` and adapter slots (with preemption when blocks run out), and
//! applying the step's results when it ends.

use super::cache_events::token_ids;
use super::{Engine, EngineEvent, RequestId, SimTime, Step, Usage};
use crate::prompt::BYTES_PER_TOKEN;

impl Engine {
    /// Builds the next step at time `at` from running and waiting requests.
    pub(super) fn start_step(&mut self, at: SimTime) {
        let mut budget = self.cfg.max_num_batched_tokens.max(1);
        let mut work = Vec::new();
        // Whether each entry of `work` is a decode (so a preempted one can be taken back).
        let mut work_is_decode = Vec::new();
        let mut prefill_tokens: u64 = 0;
        let mut decodes: u32 = 0;
        let mut extra_ms = 0.0;
        let mut preempted = false;

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let Some(&id) = self.running.get(i) else {
                break;
            };
            let Some((need, is_decode, have, computed)) = self.seqs.get(&id).map(|s| {
                (
                    s.len() - s.computed,
                    s.generated > 0 && s.len() - s.computed == 1,
                    s.blocks.len(),
                    s.computed,
                )
            }) else {
                self.running.remove(i);
                continue;
            };
            let n = need.min(budget);
            let want = self.blocks_for(computed + n).saturating_sub(have);
            let mut scheduled = false;
            loop {
                let want32 = u32::try_from(want).unwrap_or(u32::MAX);
                if want == 0 {
                    scheduled = true;
                    break;
                }
                if let Some(fresh) = self.pool.allocate(want32) {
                    if let Some(s) = self.seqs.get_mut(&id) {
                        s.blocks.extend(fresh);
                    }
                    scheduled = true;
                    break;
                }
                // Out of blocks: preempt the policy's victim.
                let Some((victim, at)) = self.take_victim() else {
                    break;
                };
                self.preempt(victim);
                preempted = true;
                if victim == id {
                    break;
                }
                if at < i {
                    // Already given work this step (priority policy only): take it back.
                    i -= 1;
                    if let Some(k) = work.iter().position(|(w, _)| *w == victim) {
                        let (_, taken) = work.remove(k);
                        budget += taken;
                        if work_is_decode.remove(k) {
                            decodes -= 1;
                        } else {
                            prefill_tokens -= u64::from(taken);
                        }
                    }
                }
            }
            if scheduled {
                work.push((id, n));
                work_is_decode.push(is_decode);
                budget -= n;
                if is_decode {
                    decodes += 1;
                } else {
                    prefill_tokens += u64::from(n);
                }
                i += 1;
            }
        }

        if !preempted {
            let mut idx = 0;
            while budget > 0
                && self.running.len() < self.cfg.max_num_seqs as usize
                && idx < self.waiting.len()
            {
                let Some(&id) = self.waiting.get(idx) else {
                    break;
                };
                match self.try_admit(id, budget) {
                    Admit::Scheduled { tokens, lora_load } => {
                        self.waiting.remove(idx);
                        self.running.push(id);
                        work.push((id, tokens));
                        budget -= tokens;
                        prefill_tokens += u64::from(tokens);
                        if lora_load {
                            extra_ms += self.cfg.lora_load_ms;
                            self.counters.lora_loads += 1;
                        }
                    }
                    Admit::SkipLora => idx += 1,
                    Admit::NoBlocks => break,
                }
            }
        }

        if work.is_empty() {
            self.step = None;
            return;
        }
        let mut secs = prefill_tokens as f64 / self.cfg.prefill_tokens_per_s.max(1e-9);
        if decodes > 0 {
            secs += (self.cfg.decode_base_ms + self.cfg.decode_per_seq_ms * f64::from(decodes))
                / 1000.0;
        }
        secs += extra_ms / 1000.0;
        let secs = self.slowdown.step_secs(secs, prefill_tokens > 0);
        self.step = Some(Step {
            end: at.plus_secs(secs),
            work,
        });
    }

    /// Tries to admit waiting request `id` with at most `budget` tokens this step.
    fn try_admit(&mut self, id: RequestId, budget: u32) -> Admit {
        let bs = self.cfg.block_size.max(1);
        let Some(seq) = self.seqs.get(&id) else {
            return Admit::NoBlocks;
        };
        let mut lora_load = false;
        if let Some(lora) = &seq.req.lora {
            let running = self.loras_of(self.running.iter());
            if !running.contains(lora) && running.len() >= self.cfg.max_loras as usize {
                return Admit::SkipLora;
            }
            lora_load = !self.loaded_loras.contains(lora);
        }
        let len = seq.len();
        // The last token is always recomputed, so at most (len - 1) tokens can hit.
        let max_hit_blocks = (((len - 1) / bs) as usize).min(seq.req.block_hashes.len());
        let hit = if self.cfg.enable_prefix_caching {
            self.pool
                .lookup_prefix(seq.req.block_hashes.get(..max_hit_blocks).unwrap_or(&[]))
        } else {
            Vec::new()
        };
        let hit_tokens = u32::try_from(hit.len()).unwrap_or(u32::MAX) * bs;
        let n = (len - hit_tokens).min(budget);
        let new_blocks = self.blocks_for(hit_tokens + n).saturating_sub(hit.len());
        let available = self.pool.num_free() - self.pool.count_free(&hit);
        let new_blocks32 = u32::try_from(new_blocks).unwrap_or(u32::MAX);
        if new_blocks32 > available {
            return Admit::NoBlocks;
        }
        self.pool.touch(&hit);
        let Some(fresh) = self.pool.allocate(new_blocks32) else {
            self.pool.release(&hit);
            return Admit::NoBlocks;
        };
        let lora = seq.req.lora.clone();
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.blocks = hit.iter().copied().chain(fresh).collect();
            seq.computed = hit_tokens;
            seq.hashed_blocks = hit.len();
            if seq.cached_tokens.is_none() {
                seq.cached_tokens = Some(hit_tokens);
            }
        }
        self.counters.prefix_queries_tokens += u64::from(len);
        self.counters.prefix_hits_tokens += u64::from(hit_tokens);
        if let Some(lora) = lora {
            self.loaded_loras.retain(|l| *l != lora);
            self.loaded_loras.push(lora);
            let running = self.loras_of(self.running.iter());
            while self.loaded_loras.len() > self.cfg.max_loras as usize {
                let Some(pos) = self.loaded_loras.iter().position(|l| !running.contains(l)) else {
                    break;
                };
                self.loaded_loras.remove(pos);
            }
        }
        Admit::Scheduled {
            tokens: n,
            lora_load,
        }
    }

    /// Moves a running sequence back to the head of the queue, freeing its blocks.
    fn preempt(&mut self, id: RequestId) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            self.pool.release(&seq.blocks);
            seq.blocks.clear();
            seq.computed = 0;
            seq.hashed_blocks = 0;
            self.counters.preemptions += 1;
            self.enqueue(id, true);
        }
    }

    /// Applies the step in progress: computed tokens, newly full prompt blocks, sampled tokens.
    pub(super) fn finish_step(&mut self, out: &mut Vec<EngineEvent>) {
        let Some(step) = self.step.take() else { return };
        let at = step.end;
        let bs = self.cfg.block_size.max(1);
        let block_bytes = bs as usize * BYTES_PER_TOKEN;
        for (id, n) in step.work {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            seq.computed += n;
            if self.cfg.enable_prefix_caching {
                let full = ((seq.computed / bs) as usize).min(seq.req.block_hashes.len());
                for b in seq.hashed_blocks..full {
                    if let (Some(block), Some(hash)) =
                        (seq.blocks.get(b), seq.req.block_hashes.get(b))
                    {
                        if self.pool.register(*block, *hash) && self.pool.event_log_enabled() {
                            let bytes = seq
                                .content
                                .as_deref()
                                .and_then(|c| c.get(b * block_bytes..(b + 1) * block_bytes));
                            if let Some(bytes) = bytes {
                                let parent = b
                                    .checked_sub(1)
                                    .and_then(|p| seq.req.block_hashes.get(p))
                                    .copied();
                                self.pool.log_stored(
                                    *hash,
                                    parent,
                                    token_ids(bytes),
                                    seq.req.lora.as_deref(),
                                );
                            }
                        }
                    }
                }
                seq.hashed_blocks = seq.hashed_blocks.max(full);
            }
            if seq.computed < seq.len() {
                continue;
            }
            let index = seq.generated;
            seq.generated += 1;
            self.counters.generation_tokens += 1;
            let cached_tokens = seq.cached_tokens.unwrap_or(0);
            if index == 0 {
                let ttft = at.0.saturating_sub(seq.arrival.0) as f64 / 1e9;
                self.counters.ttft.observe(ttft);
                // vLLM counts a request's prompt once its prefill produced a token, so a
                // request cancelled later still counts.
                self.counters.prompt_tokens += u64::from(seq.req.prompt_tokens);
            }
            out.push(EngineEvent::Token {
                id,
                index,
                cached_tokens,
                at,
            });
            if seq.generated >= seq.req.output_tokens {
                let usage = Usage {
                    prompt_tokens: seq.req.prompt_tokens,
                    completion_tokens: seq.generated,
                    cached_tokens,
                };
                let blocks = std::mem::take(&mut seq.blocks);
                self.pool.release(&blocks);
                self.seqs.remove(&id);
                self.running.retain(|r| *r != id);
                self.counters.finished += 1;
                out.push(EngineEvent::Finished { id, usage, at });
            }
        }
    }
}

enum Admit {
    Scheduled { tokens: u32, lora_load: bool },
    SkipLora,
    NoBlocks,
}
