//! Model-server metrics: what the picker needs to know about one endpoint, and the
//! Prometheus text parser that extracts it (DESIGN §5).
//!
//! CONTRACT STUB — owned by the metrics work; the types below are the agreed interface.

use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

/// The DESIGN §5 table for one endpoint. A metric the page did not carry is `None`.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct EndpointMetrics {
    /// Queued requests (`vllm:num_requests_waiting`, ...).
    #[serde(default)]
    pub waiting: Option<u32>,
    /// Running requests (`vllm:num_requests_running`, ...).
    #[serde(default)]
    pub running: Option<u32>,
    /// KV-cache utilisation in 0..=1 (`vllm:kv_cache_usage_perc`, ...).
    #[serde(default)]
    pub kv_cache_usage: Option<f64>,
    /// Block size and capacity (`vllm:cache_config_info`), if exposed.
    #[serde(default)]
    pub cache: Option<CacheConfig>,
    /// LoRA adapter state (`vllm:lora_requests_info`), if exposed.
    #[serde(default)]
    pub lora: Option<LoraState>,
}

/// KV-cache geometry of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CacheConfig {
    /// Tokens per KV block.
    pub block_size: u32,
    /// Number of KV blocks.
    pub num_blocks: u64,
}

/// LoRA adapters loaded (running) or waiting to load on an endpoint.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LoraState {
    /// Adapter slots (`max_lora`).
    pub max: u32,
    /// Adapters currently loaded and serving.
    #[serde(default)]
    pub running: Vec<String>,
    /// Adapters requested but not yet loaded.
    #[serde(default)]
    pub waiting: Vec<String>,
}
