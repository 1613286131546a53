//! Unit and property tests of flow control, with small builders shared below.

mod config;
mod props;
mod quantity;
mod queues;
mod saturation;

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use super::config::{BandConfig, FairnessPolicy, FlowControlConfig, OrderingPolicy};
use super::queues::{Arrival, FlowQueues};
use crate::scheduling::config::{ConfigError, EndpointPickerConfig};

/// Compiles the flow-control configuration of a JSON `EndpointPickerConfig`.
pub(super) fn compile(json: &str) -> Result<Option<FlowControlConfig>, ConfigError> {
    let cfg = EndpointPickerConfig::from_json_str(json).expect("EndpointPickerConfig shape");
    FlowControlConfig::compile(&cfg)
}

/// A configuration of the given bands (any order), no global limits, 60 s TTL.
pub(super) fn bands(list: &[(i32, FairnessPolicy, OrderingPolicy)]) -> FlowControlConfig {
    FlowControlConfig {
        bands: list
            .iter()
            .map(|&(priority, fairness, ordering)| BandConfig {
                priority,
                max_requests: 100_000,
                max_bytes: u64::MAX,
                fairness,
                ordering,
            })
            .collect(),
        ..FlowControlConfig::default()
    }
}

/// One band of priority 0 with `fairness`, FCFS.
pub(super) fn one_band(fairness: FairnessPolicy) -> FlowControlConfig {
    bands(&[(0, fairness, OrderingPolicy::Fcfs)])
}

/// An arrival of `item` at `now_ms`: 100 bytes, 10 tokens, default TTL.
pub(super) fn arrival(priority: i32, flow: &str, item: u32, now_ms: u64) -> Arrival<u32> {
    Arrival {
        priority,
        flow: flow.to_string(),
        bytes: 100,
        service: 10,
        ttl_ms: None,
        now_ms,
        item,
    }
}

/// Dispatches everything, returning the items in order.
pub(super) fn drain(q: &mut FlowQueues<u32>, now_ms: u64) -> Vec<u32> {
    let mut out = Vec::new();
    while let Some(d) = q.dispatch(now_ms) {
        out.push(d.item);
    }
    out
}

/// Dispatches everything, returning the flows in order.
pub(super) fn drain_flows(q: &mut FlowQueues<u32>, now_ms: u64) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(d) = q.dispatch(now_ms) {
        out.push(d.flow);
    }
    out
}
