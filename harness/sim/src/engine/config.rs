//! Parameters of one simulated engine replica, with vLLM-like defaults.

use serde::Deserialize;

/// Everything that shapes one replica's timing and memory; see each field's default.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// KV cache capacity in tokens (rounded down to whole blocks). Default 160 000.
    pub kv_capacity_tokens: u32,
    /// Tokens per KV block (vLLM default 16).
    pub block_size: u32,
    /// Most sequences running at once (vLLM `max_num_seqs`, default 256).
    pub max_num_seqs: u32,
    /// Token budget of one engine step (vLLM `max_num_batched_tokens`, chunked prefill; default 8192).
    pub max_num_batched_tokens: u32,
    /// Prefill throughput in tokens per second (default 16 000).
    pub prefill_tokens_per_s: f64,
    /// Fixed time of a decode step in milliseconds (default 6).
    pub decode_base_ms: f64,
    /// Extra decode-step time per running sequence in milliseconds (default 0.08).
    pub decode_per_seq_ms: f64,
    /// LoRA adapters that can be active at once (vLLM `max_loras`, default 4).
    pub max_loras: u32,
    /// Time to load an adapter that is not resident, in milliseconds (default 50).
    pub lora_load_ms: f64,
    /// Whether prompt blocks are cached and reused (default true).
    pub enable_prefix_caching: bool,
    /// Longest prompt + completion accepted; 0 means the KV capacity (default 0).
    pub max_model_len: u32,
    /// Order of the waiting queue and choice of preemption victims (vLLM
    /// `--scheduling-policy`, default `fcfs`).
    pub scheduling_policy: SchedulingPolicy,
}

/// How waiting requests are ordered and which running one is preempted (vLLM's
/// `--scheduling-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulingPolicy {
    /// Arrival order; a preempted request goes back to the head of the queue and the most
    /// recently admitted one is preempted first.
    #[default]
    Fcfs,
    /// By the request's `priority` (lower first), then arrival; the running request with
    /// the highest (priority, arrival) is preempted first, and a preempted one rejoins the
    /// queue in that order.
    Priority,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kv_capacity_tokens: 160_000,
            block_size: 16,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            prefill_tokens_per_s: 16_000.0,
            decode_base_ms: 6.0,
            decode_per_seq_ms: 0.08,
            max_loras: 4,
            lora_load_ms: 50.0,
            enable_prefix_caching: true,
            max_model_len: 0,
            scheduling_policy: SchedulingPolicy::Fcfs,
        }
    }
}

impl EngineConfig {
    /// Number of KV blocks of the replica (at least one).
    pub fn num_blocks(&self) -> u32 {
        (self.kv_capacity_tokens / self.block_size.max(1)).max(1)
    }

    /// The effective longest prompt + completion, in tokens.
    pub fn effective_max_model_len(&self) -> u32 {
        let cap = self.num_blocks() * self.block_size.max(1);
        if self.max_model_len == 0 {
            cap
        } else {
            self.max_model_len.min(cap)
        }
    }
}
