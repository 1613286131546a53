//! The engine model of one replica: a plain state machine with no sockets and no clock.
//!
//! It follows vLLM's v1 scheduler where it matters for routing:
//! - **KV blocks** ([`BlockPool`]): capacity in blocks of `block_size` tokens; full blocks
//!   (prompt and generated tokens) are hashed (chained) and reusable by later requests with
//!   the same prefix; unreferenced blocks are evicted least recently freed first.
//! - **Continuous batching**: every step first advances the running sequences (one decode
//!   token each, or the next prefill chunk), then admits waiting requests in FCFS order while
//!   the step's token budget, `max_num_seqs` and free KV blocks allow. A request that does
//!   not fit in KV blocks the queue behind it (head-of-line, as vLLM); one whose LoRA adapter
//!   has no free slot is skipped. A running sequence that cannot get a block preempts the most
//!   recently admitted one, which later recomputes (its cached blocks usually survive).
//! - **Time**: a step lasts `prefill tokens ÷ prefill throughput` plus, if it decodes,
//!   `decode_base + decode_per_seq × decoding sequences`, plus any adapter load delay. A
//!   sequence whose computed tokens reach its length samples one token at the end of the step.
//!   A run-time [`Slowdown`] stretches the steps started after it is set.
//!
//! - **KV events** ([`cache_events`]): with the log enabled, blocks entering the cache (with
//!   their token ids, when the request was submitted with its bytes), evictions and resets
//!   are recorded for the caller to publish.
//!
//! The caller owns time: [`Engine::advance`] completes every step that ends by `now` and
//! starts the next one back to back, so late wake-ups never change the simulated timeline.

mod blocks;
pub mod cache_events;
mod config;
mod import;
mod slowdown;
mod stats;
mod step;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

pub use blocks::{BlockHash, BlockId, BlockPool};
pub use cache_events::CacheEvent;
pub use config::{EngineConfig, SchedulingPolicy};
pub use slowdown::{Slowdown, SlowdownError};
pub use stats::{EngineCounters, EngineStats, Histogram, TTFT_BUCKETS_S};

/// Simulated time in nanoseconds since the engine's epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SimTime(pub u64);

impl SimTime {
    /// The time `secs` seconds after the epoch (negative and NaN clamp to 0).
    pub fn from_secs_f64(secs: f64) -> Self {
        Self((secs.max(0.0) * 1e9) as u64)
    }

    /// Seconds since the epoch.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// This time plus `secs` seconds (at least one nanosecond later).
    pub fn plus_secs(self, secs: f64) -> Self {
        let ns = (secs.max(0.0) * 1e9) as u64;
        Self(self.0.saturating_add(ns.max(1)))
    }
}

/// Caller-chosen identity of a request inside one engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// What the engine needs to know about a request.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRequest {
    /// Prompt length in tokens (at least 1).
    pub prompt_tokens: u32,
    /// Chained hashes of the sequence's full blocks, in order: the prompt, then the
    /// completion the request will generate. Admission matches the blocks of what the
    /// sequence already holds (the prompt, plus the tokens generated before a preemption),
    /// never its last token; every block is registered in the prefix cache once its tokens
    /// are computed, generated ones included (vLLM's behaviour), so the next turn of a
    /// conversation hits its answer.
    pub block_hashes: Vec<BlockHash>,
    /// Tokens to generate (at least 1); the simulated model stops exactly there.
    pub output_tokens: u32,
    /// LoRA adapter, if the request targets one.
    pub lora: Option<String>,
    /// vLLM's request `priority` (lower is served first); used only under
    /// [`SchedulingPolicy::Priority`].
    pub priority: i32,
}

/// Why a request was refused at submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// Prompt + completion exceed the model length (the whole KV cache at most).
    TooLong {
        /// The limit in tokens.
        max_model_len: u32,
        /// Prompt + completion tokens asked for.
        requested: u64,
    },
    /// Zero prompt or zero output tokens.
    Empty,
    /// The id is already in use.
    DuplicateId,
    /// The request targets an adapter but the engine has no adapter slots.
    NoLoraSlots,
}

/// Token accounting of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u32,
}

/// Something observable happened to a request.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// Token number `index` (0 = first) was sampled at `at`.
    Token {
        /// The request.
        id: RequestId,
        /// Position in the completion.
        index: u32,
        /// Prompt tokens found cached (known from the first token on).
        cached_tokens: u32,
        /// When.
        at: SimTime,
    },
    /// The request generated its last token and released its blocks.
    Finished {
        /// The request.
        id: RequestId,
        /// Final usage.
        usage: Usage,
        /// When.
        at: SimTime,
    },
}

#[derive(Debug)]
struct Seq {
    req: EngineRequest,
    arrival: SimTime,
    blocks: Vec<BlockId>,
    computed: u32,
    generated: u32,
    cached_tokens: Option<u32>,
    hashed_blocks: usize,
    /// The sequence's bytes (prompt, then completion) whose 4-byte chunks are its tokens,
    /// if the submitter gave them: the token ids of the KV events' stores.
    content: Option<Arc<[u8]>>,
}

impl Seq {
    fn len(&self) -> u32 {
        self.req.prompt_tokens + self.generated
    }
}

#[derive(Debug)]
struct Step {
    end: SimTime,
    work: Vec<(RequestId, u32)>,
}

/// One replica's scheduler, KV cache and counters.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    pool: BlockPool,
    seqs: HashMap<RequestId, Seq>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    step: Option<Step>,
    /// Resident adapters, least recently used first.
    loaded_loras: Vec<String>,
    counters: EngineCounters,
    /// Applied to every step as it starts.
    slowdown: Slowdown,
}

impl Engine {
    /// An idle engine with an empty cache.
    pub fn new(cfg: EngineConfig) -> Self {
        let pool = BlockPool::new(cfg.num_blocks());
        Self {
            cfg,
            pool,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            step: None,
            loaded_loras: Vec::new(),
            counters: EngineCounters::default(),
            slowdown: Slowdown::NONE,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Queues a request arriving at `now`. Call [`Engine::advance`] with the same `now`
    /// first, so steps that ended before the arrival are not given the request.
    pub fn submit(
        &mut self,
        now: SimTime,
        id: RequestId,
        req: EngineRequest,
    ) -> Result<(), SubmitError> {
        self.submit_with_bytes(now, id, req, None)
    }

    /// [`Engine::submit`] with the sequence's bytes (prompt then completion, the bytes its
    /// `block_hashes` were cut from): the KV events' stores then carry the blocks' token ids
    /// (4-byte little-endian chunks). Blocks of a request without bytes are cached as usual
    /// but logged as no store.
    pub fn submit_with_bytes(
        &mut self,
        now: SimTime,
        id: RequestId,
        req: EngineRequest,
        content: Option<Arc<[u8]>>,
    ) -> Result<(), SubmitError> {
        if req.prompt_tokens == 0 || req.output_tokens == 0 {
            return Err(SubmitError::Empty);
        }
        let requested = u64::from(req.prompt_tokens) + u64::from(req.output_tokens);
        let max_model_len = self.cfg.effective_max_model_len();
        if requested > u64::from(max_model_len) {
            return Err(SubmitError::TooLong {
                max_model_len,
                requested,
            });
        }
        if req.lora.is_some() && self.cfg.max_loras == 0 {
            return Err(SubmitError::NoLoraSlots);
        }
        if self.seqs.contains_key(&id) {
            return Err(SubmitError::DuplicateId);
        }
        self.seqs.insert(
            id,
            Seq {
                req,
                arrival: now,
                blocks: Vec::new(),
                computed: 0,
                generated: 0,
                cached_tokens: None,
                hashed_blocks: 0,
                content,
            },
        );
        self.enqueue(id, false);
        if self.step.is_none() {
            self.start_step(now);
        }
        Ok(())
    }

    /// Drops a request (client gone), releasing its blocks. Returns whether it was known.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        let Some(mut seq) = self.seqs.remove(&id) else {
            return false;
        };
        self.waiting.retain(|w| *w != id);
        self.running.retain(|r| *r != id);
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
        self.counters.cancelled += 1;
        true
    }

    /// When the step in progress ends, if any: the next time [`Engine::advance`] has work.
    pub fn next_wakeup(&self) -> Option<SimTime> {
        self.step.as_ref().map(|s| s.end)
    }

    /// Completes every step ending at or before `now` (appending events to `out`) and keeps
    /// the engine busy while it has work.
    pub fn advance(&mut self, now: SimTime, out: &mut Vec<EngineEvent>) {
        loop {
            match self.step.as_ref().map(|s| s.end) {
                Some(end) if end <= now => {
                    self.finish_step(out);
                    self.start_step(end);
                }
                Some(_) => break,
                None => {
                    if !self.waiting.is_empty() || !self.running.is_empty() {
                        self.start_step(now);
                    }
                    break;
                }
            }
        }
    }

    /// Starts (or stops) logging cache changes for [`Engine::drain_cache_events`].
    pub fn set_cache_events(&mut self, enabled: bool) {
        self.pool.set_event_log(enabled);
    }

    /// Moves the cache changes logged since the last call, oldest first, to `out`.
    pub fn drain_cache_events(&mut self, out: &mut Vec<CacheEvent>) {
        self.pool.drain_events(out);
    }

    /// Forgets every cached block (vLLM's `reset_prefix_cache`, or a restarted engine's
    /// empty cache); running sequences keep their blocks. Logs `Cleared`.
    pub fn reset_prefix_cache(&mut self) {
        self.pool.clear_prefix_cache();
    }

    /// Runs the steps started from now on slower (or, with [`Slowdown::NONE`], at the
    /// configured speed again); the step in progress keeps its end.
    pub fn set_slowdown(&mut self, slowdown: Slowdown) {
        self.slowdown = slowdown;
    }

    /// The slowdown in effect.
    pub fn slowdown(&self) -> Slowdown {
        self.slowdown
    }

    /// A snapshot of queues, KV usage, adapters and counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_usage: self.pool.usage(),
            num_blocks: self.pool.num_blocks(),
            free_blocks: self.pool.num_free(),
            cached_blocks: self.pool.num_cached(),
            block_size: self.cfg.block_size,
            max_loras: self.cfg.max_loras,
            running_loras: self.loras_of(self.running.iter()),
            waiting_loras: self.loras_of(self.waiting.iter()),
            evictions: self.pool.evictions(),
            counters: self.counters.clone(),
        }
    }

    fn loras_of<'a>(&self, ids: impl Iterator<Item = &'a RequestId>) -> Vec<String> {
        let mut v: Vec<String> = ids
            .filter_map(|id| self.seqs.get(id).and_then(|s| s.req.lora.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Puts `id` in the waiting queue: at the tail (or, `preempted`, the head) under FCFS;
    /// after every request that comes first by (priority, arrival) under priority.
    fn enqueue(&mut self, id: RequestId, preempted: bool) {
        if self.cfg.scheduling_policy == SchedulingPolicy::Fcfs {
            if preempted {
                self.waiting.push_front(id);
            } else {
                self.waiting.push_back(id);
            }
            return;
        }
        let key = self.order_key(id);
        let pos = self
            .waiting
            .iter()
            .position(|w| self.order_key(*w) > key)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(pos, id);
    }

    /// (priority, arrival, id): the priority policy's order.
    fn order_key(&self, id: RequestId) -> (i32, SimTime, RequestId) {
        match self.seqs.get(&id) {
            Some(s) => (s.req.priority, s.arrival, id),
            None => (i32::MAX, SimTime(u64::MAX), id),
        }
    }

    /// Removes the running request to preempt and returns it with its index in `running`:
    /// the most recently admitted under FCFS, the last in (priority, arrival) order under
    /// priority.
    fn take_victim(&mut self) -> Option<(RequestId, usize)> {
        let pos = match self.cfg.scheduling_policy {
            SchedulingPolicy::Fcfs => self.running.len().checked_sub(1)?,
            SchedulingPolicy::Priority => (0..self.running.len()).max_by_key(|i| {
                self.order_key(self.running.get(*i).copied().unwrap_or(RequestId(0)))
            })?,
        };
        Some((self.running.remove(pos), pos))
    }

    fn blocks_for(&self, tokens: u32) -> usize {
        tokens.div_ceil(self.cfg.block_size.max(1)) as usize
    }
}
