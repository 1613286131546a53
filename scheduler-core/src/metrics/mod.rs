//! Model-server metrics: what the picker needs to know about one endpoint, and the
//! Prometheus text parser that extracts it.
//!
//! - [`exposition`]: a tolerant line reader for the Prometheus text format (never panics,
//!   skips what it cannot read).
//! - [`names`]: [`MetricNames`], the configurable metric and label names per field
//!   (default: vLLM, SGLang and TRT-LLM together).
//! - [`extract()`]: one page → one [`EndpointMetrics`], with the aggregation rules
//!   (sum / max / newest, unusable values as missing) documented in [`mod@extract`].
//!
//! ```
//! use scheduler_core::metrics::{extract, MetricNames};
//! let page = b"vllm:num_requests_waiting{model_name=\"m\"} 3\nvllm:kv_cache_usage_perc 0.5\n";
//! let m = extract(page, &MetricNames::default());
//! assert_eq!(m.waiting, Some(3));
//! assert_eq!(m.kv_cache_usage, Some(0.5));
//! assert_eq!(m.running, None);
//! ```

use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

pub mod exposition;
pub mod extract;
pub mod names;

// A test fails by panicking on a broken fixture; the crate-wide ban is for product code.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;

pub use extract::{extract, MAX_ADAPTERS};
pub use names::{CacheInfoSpec, LoraInfoSpec, MetricNames};

/// The scraped metrics of one endpoint. A metric the page did not carry is `None`.
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

impl EndpointMetrics {
    /// True when the page carried none of the metrics (probably not an engine we know, or
    /// a misconfigured [`MetricNames`]).
    pub fn is_empty(&self) -> bool {
        self.waiting.is_none()
            && self.running.is_none()
            && self.kv_cache_usage.is_none()
            && self.cache.is_none()
            && self.lora.is_none()
    }
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
