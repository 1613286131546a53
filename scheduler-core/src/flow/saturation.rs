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

/// What one endpoint's scrapes taught about its batch: the most requests it ran while
/// others waited. An engine that makes requests wait is running all it can (its
/// `max_num_seqs`, or what its KV cache or token budget allows), and no engine publishes
/// that limit, so it is learned. A queue counts only when two snapshots in a row show it
/// (a request that arrived between two engine steps waits for one step, and is no sign
/// of a full batch), and only with at least one request running.
///
/// An endpoint is **full** when its occupancy (the larger of its scraped running plus
/// waiting and the requests this proxy has in flight there, which are current where the
/// scrape is not) reaches what it was seen to run: one more request would wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCapacity {
    /// The most requests seen running while requests waited (`None`: never seen).
    learned: Option<u32>,
    /// Whether the previous snapshot showed requests waiting.
    queued: bool,
}

impl BatchCapacity {
    /// Learn from one snapshot's figures (`None`: unknown, which also ends a queue run).
    pub fn observe(&mut self, waiting: Option<u32>, running: Option<u32>) {
        let queued = waiting.is_some_and(|w| w > 0);
        if let (true, true, Some(running)) = (queued, self.queued, running.filter(|&r| r > 0)) {
            self.learned = Some(self.learned.map_or(running, |seen| seen.max(running)));
        }
        self.queued = queued;
    }

    /// The learned capacity, if any.
    pub fn learned(&self) -> Option<u32> {
        self.learned
    }

    /// Whether an endpoint with `running` and `waiting` scraped and `in_flight` of this
    /// proxy's requests there is full (never, before a capacity is learned).
    pub fn is_full(&self, running: u32, waiting: u32, in_flight: u32) -> bool {
        let occupancy = running.saturating_add(waiting).max(in_flight);
        self.learned.is_some_and(|capacity| occupancy >= capacity)
    }
}
