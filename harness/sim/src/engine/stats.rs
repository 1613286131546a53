//! Counters and the TTFT histogram an engine keeps, read by `/metrics`.

/// Upper bounds (seconds) of the time-to-first-token histogram, as vLLM's.
pub const TTFT_BUCKETS_S: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// A cumulative-on-render histogram with fixed bucket bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); one extra slot for +Inf.
    pub counts: Vec<u64>,
    /// Sum of all observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; TTFT_BUCKETS_S.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }
}

impl Histogram {
    /// Records one value.
    pub fn observe(&mut self, value: f64) {
        let slot = TTFT_BUCKETS_S
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(TTFT_BUCKETS_S.len());
        if let Some(c) = self.counts.get_mut(slot) {
            *c += 1;
        }
        self.sum += value;
        self.count += 1;
    }
}

/// Monotonic counters of one engine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineCounters {
    /// Prompt tokens looked up in the prefix cache (one lookup per admission).
    pub prefix_queries_tokens: u64,
    /// Of those, tokens found cached.
    pub prefix_hits_tokens: u64,
    /// Prompt tokens of requests that generated their first token.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Sequences preempted for lack of KV blocks.
    pub preemptions: u64,
    /// Requests that generated all their tokens.
    pub finished: u64,
    /// Requests cancelled by their client.
    pub cancelled: u64,
    /// LoRA adapters loaded into a slot: every admission of a request whose adapter was
    /// not resident (the first use, or a use after the adapter was evicted for another),
    /// each costing `lora_load_ms`.
    pub lora_loads: u64,
    /// Time to first token in simulated seconds.
    pub ttft: Histogram,
}

/// A point-in-time view of one engine, for metrics and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineStats {
    /// Requests waiting for admission (including preempted ones).
    pub waiting: usize,
    /// Requests admitted and not finished.
    pub running: usize,
    /// Fraction of KV blocks referenced (0..1).
    pub kv_usage: f64,
    /// Total KV blocks.
    pub num_blocks: u32,
    /// Free KV blocks.
    pub free_blocks: u32,
    /// Blocks findable by prefix hash.
    pub cached_blocks: usize,
    /// Tokens per block.
    pub block_size: u32,
    /// Adapter slots.
    pub max_loras: u32,
    /// Adapters of running requests, sorted.
    pub running_loras: Vec<String>,
    /// Adapters of waiting requests, sorted.
    pub waiting_loras: Vec<String>,
    /// Cached blocks evicted so far.
    pub evictions: u64,
    /// Counters.
    pub counters: EngineCounters,
}
