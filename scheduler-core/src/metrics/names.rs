//! Which metric names and labels carry the scraped metrics, per engine.
//!
//! [`MetricNames`] lists, for every field of [`super::EndpointMetrics`], the metric names
//! to look for, in priority order. The default is the union of vLLM, SGLang and TRT-LLM,
//! so one configuration serves a mixed pool. Deserializable from the picker config
//! (camelCase keys, unknown keys rejected so a typo is a config error); a key that is
//! given replaces that list, a key left out keeps its default.

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

use crate::snapshot::aggregate;

/// The metric names each [`super::EndpointMetrics`] field is read from.
///
/// Within a list, the first name that has at least one usable series on the page wins;
/// later names are fallbacks (e.g. vLLM's pre-0.10 `vllm:gpu_cache_usage_perc`) and are
/// never added to the first, so a page exporting both an old and a new name is not
/// double-counted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct MetricNames {
    /// Queued requests; series of the chosen name are summed.
    pub waiting: Vec<String>,
    /// Running requests; series of the chosen name are summed.
    pub running: Vec<String>,
    /// KV-cache utilisation 0..1; the maximum over series, clamped to [0, 1].
    pub kv_cache_usage: Vec<String>,
    /// Info-style metrics carrying block size and block count as label values.
    pub cache_info: Vec<CacheInfoSpec>,
    /// Gauges holding the block size directly (TRT-LLM); used when no `cache_info`
    /// metric is present. Maximum over series.
    pub cache_block_size: Vec<String>,
    /// Gauges holding the block count directly (TRT-LLM); paired with `cache_block_size`.
    /// Maximum over series.
    pub cache_num_blocks: Vec<String>,
    /// Info-style metrics carrying LoRA adapter state as label values.
    pub lora_info: Vec<LoraInfoSpec>,
}

/// An info metric (value ignored) whose labels hold the KV-cache geometry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CacheInfoSpec {
    /// Metric name, e.g. `vllm:cache_config_info`.
    pub name: String,
    /// Label holding tokens per block (`block_size`, SGLang `page_size`).
    pub block_size_label: String,
    /// Label holding the number of blocks (`num_gpu_blocks`, SGLang `num_pages`).
    pub num_blocks_label: String,
}

/// A gauge whose labels hold LoRA state and whose value is the time it was last set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoraInfoSpec {
    /// Metric name, e.g. `vllm:lora_requests_info`.
    pub name: String,
    /// Label holding the adapter slot count.
    #[serde(default = "default_max_lora_label")]
    pub max_label: String,
    /// Label holding the comma-separated running adapters.
    #[serde(default = "default_running_lora_label")]
    pub running_label: String,
    /// Label holding the comma-separated waiting adapters.
    #[serde(default = "default_waiting_lora_label")]
    pub waiting_label: String,
}

fn default_max_lora_label() -> String {
    "max_lora".to_string()
}

fn default_running_lora_label() -> String {
    "running_lora_adapters".to_string()
}

fn default_waiting_lora_label() -> String {
    "waiting_lora_adapters".to_string()
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

impl Default for MetricNames {
    /// The union of vLLM (≥ 0.10 and older), SGLang and TRT-LLM (`trtllm-serve`) names,
    /// and last the means a peer gateway publishes for its pool
    /// ([`crate::snapshot::aggregate`]), so a peer cluster scrapes as one endpoint.
    fn default() -> Self {
        MetricNames {
            waiting: strings(&[
                "vllm:num_requests_waiting",
                "sglang:num_queue_reqs",
                "trtllm_num_requests_waiting",
                aggregate::AVERAGE_QUEUE_SIZE,
            ]),
            running: strings(&[
                "vllm:num_requests_running",
                "sglang:num_running_reqs",
                "trtllm_num_requests_running",
                aggregate::AVERAGE_RUNNING,
            ]),
            kv_cache_usage: strings(&[
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "sglang:token_usage",
                "trtllm_kv_cache_utilization",
                aggregate::AVERAGE_KV_CACHE_UTILIZATION,
            ]),
            cache_info: vec![
                CacheInfoSpec {
                    name: "vllm:cache_config_info".to_string(),
                    block_size_label: "block_size".to_string(),
                    num_blocks_label: "num_gpu_blocks".to_string(),
                },
                CacheInfoSpec {
                    name: "sglang:cache_config_info".to_string(),
                    block_size_label: "page_size".to_string(),
                    num_blocks_label: "num_pages".to_string(),
                },
            ],
            cache_block_size: strings(&["trtllm_kv_cache_tokens_per_block"]),
            cache_num_blocks: strings(&["trtllm_kv_cache_max_blocks"]),
            lora_info: vec![LoraInfoSpec {
                name: "vllm:lora_requests_info".to_string(),
                max_label: default_max_lora_label(),
                running_label: default_running_lora_label(),
                waiting_label: default_waiting_lora_label(),
            }],
        }
    }
}

/// Which field a metric name feeds, and its priority index within that field's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Waiting(usize),
    Running(usize),
    KvUsage(usize),
    CacheInfo(usize),
    CacheBlockSize(usize),
    CacheNumBlocks(usize),
    LoraInfo(usize),
}

impl MetricNames {
    /// Every configured name, for building lookups.
    fn all_names(&self) -> impl Iterator<Item = &str> {
        let plain = [
            &self.waiting,
            &self.running,
            &self.kv_cache_usage,
            &self.cache_block_size,
            &self.cache_num_blocks,
        ];
        plain
            .into_iter()
            .flatten()
            .map(String::as_str)
            .chain(self.cache_info.iter().map(|s| s.name.as_str()))
            .chain(self.lora_info.iter().map(|s| s.name.as_str()))
    }

    /// A 64-bit set of configured name lengths (mod 64): a name whose length bit is clear
    /// cannot be configured, which rejects most foreign lines without comparing strings.
    pub(crate) fn length_mask(&self) -> u64 {
        self.all_names()
            .fold(0, |mask, name| mask | length_bit(name.len()))
    }

    /// The role of metric `name`, if any. A name listed twice keeps its first role.
    pub(crate) fn role_of(&self, name: &[u8]) -> Option<Role> {
        fn find<'a>(mut names: impl Iterator<Item = &'a str>, name: &[u8]) -> Option<usize> {
            names.position(|n| n.as_bytes() == name)
        }
        if let Some(i) = find(self.waiting.iter().map(String::as_str), name) {
            return Some(Role::Waiting(i));
        }
        if let Some(i) = find(self.running.iter().map(String::as_str), name) {
            return Some(Role::Running(i));
        }
        if let Some(i) = find(self.kv_cache_usage.iter().map(String::as_str), name) {
            return Some(Role::KvUsage(i));
        }
        if let Some(i) = find(self.cache_info.iter().map(|s| s.name.as_str()), name) {
            return Some(Role::CacheInfo(i));
        }
        if let Some(i) = find(self.cache_block_size.iter().map(String::as_str), name) {
            return Some(Role::CacheBlockSize(i));
        }
        if let Some(i) = find(self.cache_num_blocks.iter().map(String::as_str), name) {
            return Some(Role::CacheNumBlocks(i));
        }
        find(self.lora_info.iter().map(|s| s.name.as_str()), name).map(Role::LoraInfo)
    }
}

/// The bit of [`MetricNames::length_mask`] for a name of `len` bytes.
pub(crate) fn length_bit(len: usize) -> u64 {
    1u64 << (len % 64)
}
