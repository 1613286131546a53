//! Unit and property tests of the scheduling module, with small builders shared below.

mod bounds;
mod candidates;
mod config;
mod disagg;
mod filters;
mod pickers;
mod placement;
mod prefix_scorer;
mod props;
mod real_index;
mod record;
mod scorers;

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use super::{Candidate, PrefixMatch, RequestView, Scheduler};
use crate::metrics::{EndpointMetrics, LoraState};
use crate::types::{BlockHash, InFlight, Millis, Tokens};

/// A prefix index stand-in: a fixed number of matched leading blocks per address.
#[derive(Default)]
pub(super) struct FakePrefix(pub Vec<(String, usize)>);

impl FakePrefix {
    pub(super) fn with(pairs: &[(&str, usize)]) -> Self {
        FakePrefix(pairs.iter().map(|(a, n)| (a.to_string(), *n)).collect())
    }
}

impl PrefixMatch for FakePrefix {
    fn matched_blocks(&self, endpoint: &str, hashes: &[BlockHash]) -> usize {
        let n = self
            .0
            .iter()
            .find(|(a, _)| a == endpoint)
            .map_or(0, |(_, n)| *n);
        n.min(hashes.len())
    }
}

/// Metrics with waiting / running / kv set.
pub(super) fn m(waiting: u32, running: u32, kv: f64) -> EndpointMetrics {
    EndpointMetrics {
        waiting: Some(waiting),
        running: Some(running),
        kv_cache_usage: Some(kv),
        ..EndpointMetrics::default()
    }
}

/// Metrics with LoRA state only.
pub(super) fn lora(max: u32, running: &[&str], waiting: &[&str]) -> EndpointMetrics {
    EndpointMetrics {
        lora: Some(LoraState {
            max,
            running: running.iter().map(|s| s.to_string()).collect(),
            waiting: waiting.iter().map(|s| s.to_string()).collect(),
        }),
        ..EndpointMetrics::default()
    }
}

/// A candidate at `address` with `metrics` and no in-flight load.
pub(super) fn cand<'a>(address: &'a str, metrics: Option<&'a EndpointMetrics>) -> Candidate<'a> {
    Candidate {
        address,
        metrics,
        inflight: InFlight::default(),
        role: super::Role::Both,
        latency: None,
    }
}

/// `n` distinct block hashes.
pub(super) fn hashes(n: u64) -> Vec<BlockHash> {
    (1..=n).map(BlockHash).collect()
}

/// A base-model request with `blocks` (block size 64) and 64 tokens per block.
pub(super) fn req(blocks: &[BlockHash]) -> RequestView<'_> {
    RequestView {
        target_model: "base",
        base_model: "base",
        block_hashes: blocks,
        prompt_tokens: Tokens(blocks.len() as u64 * 64),
        last_endpoint_for_session: None,
    }
}

/// Compiles a JSON config; panics (tests only) on error.
pub(super) fn sched(json: &str) -> Scheduler {
    match Scheduler::from_json_str(json) {
        Ok(s) => s,
        Err(e) => panic!("config rejected: {e}"),
    }
}

/// A config with one profile running exactly the given plugin types (weight 1 each).
pub(super) fn only(types: &[&str]) -> Scheduler {
    let plugins: Vec<String> = types
        .iter()
        .map(|t| alloc::format!(r#"{{"type":"{t}"}}"#))
        .collect();
    let refs: Vec<String> = types
        .iter()
        .map(|t| alloc::format!(r#"{{"pluginRef":"{t}"}}"#))
        .collect();
    sched(&alloc::format!(
        r#"{{"plugins":[{}],"schedulingProfiles":[{{"name":"p","plugins":[{}]}}]}}"#,
        plugins.join(","),
        refs.join(",")
    ))
}

/// Runs `s` with no prefix matches.
pub(super) fn run<'a>(
    s: &'a Scheduler,
    r: &RequestView<'a>,
    c: &'a [Candidate<'a>],
    seed: u64,
) -> super::Decision<'a> {
    s.schedule(r, c, &FakePrefix::default(), seed, Millis(0))
}
