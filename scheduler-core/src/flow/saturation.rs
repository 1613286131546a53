//! The saturation detectors as pure functions of the load and the latest snapshot.
//!
//! - `concurrency-detector`: the pool is saturated when this proxy's in-flight load on it
//!   (requests, or tokens in `tokens` mode) reaches `max × (1 + headroom)`. The host counts
//!   the load; nothing here reads a clock or a metric.
//! - `utilization-detector`: an endpoint is saturated when its waiting queue reaches the
//!   queue-depth threshold or its KV-cache utilization reaches the KV threshold; the pool is
//!   saturated when every candidate is. An unknown (NaN) value never reaches a threshold, so
//!   an endpoint with no metrics does not hold traffic back (whether it is a candidate at all
//!   is the pool's `failureMode`'s decision). No candidates → not saturated: the host answers
//!   503 `rejected-no-endpoints` instead of queueing.

use super::config::{ConcurrencyMode, Detector, UtilizationThresholds};

/// This proxy's in-flight load on one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlightLoad {
    /// Requests sent and not yet finished.
    pub requests: u64,
    /// Their tokens (each request's prompt estimate plus its output limit).
    pub tokens: u64,
}

impl Detector {
    /// Whether `load` saturates the pool, for the concurrency detector. The utilization
    /// detector reads the snapshot instead ([`all_saturated`]): here it is never saturated.
    pub fn saturated_by_load(&self, load: InFlightLoad) -> bool {
        match *self {
            Detector::Concurrency {
                max_concurrency,
                mode,
                headroom,
            } => {
                let measure = match mode {
                    ConcurrencyMode::Requests => load.requests,
                    ConcurrencyMode::Tokens => load.tokens,
                };
                measure as f64 >= max_concurrency as f64 * (1.0 + headroom)
            }
            Detector::Utilization(_) => false,
        }
    }

    /// Whether this detector decides from the snapshot (`utilization-detector`) rather than
    /// from the proxy's own load.
    pub fn reads_snapshot(&self) -> bool {
        matches!(self, Detector::Utilization(_))
    }
}

impl UtilizationThresholds {
    /// Whether one endpoint is saturated: its waiting queue or its KV-cache utilization
    /// reaches the threshold. NaN (unknown) never does.
    pub fn endpoint_saturated(&self, waiting_queue: f64, kv_cache_utilization: f64) -> bool {
        waiting_queue >= self.queue_depth || kv_cache_utilization >= self.kv_cache_utilization
    }
}

/// Whether every endpoint of `endpoints` (`(waiting queue, KV utilization)` each) is
/// saturated; an empty pool is not.
pub fn all_saturated(
    thresholds: &UtilizationThresholds,
    endpoints: impl IntoIterator<Item = (f64, f64)>,
) -> bool {
    let mut any = false;
    for (waiting, kv) in endpoints {
        if !thresholds.endpoint_saturated(waiting, kv) {
            return false;
        }
        any = true;
    }
    any
}
