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
use crate::types::Millis;

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

/// A queue seen in two scrapes further apart than this is two queues, not one that
/// persisted (ms; the scraper's default interval is 50 ms).
pub const QUEUE_RUN_MAX_GAP_MS: u64 = 1_000;

/// A learned batch that nothing confirmed for this long is forgotten and learned again at
/// the next queue (ms): a value learned too low (a burst of long prompts that held back
/// a small batch) would otherwise keep spilling at it, and an endpoint restarted with a
/// larger batch at the same address would keep its old value.
pub const LEARNED_BATCH_TTL_MS: u64 = 60_000;

/// What one endpoint's scrapes taught about its batch: the most requests it ran while
/// others waited. An engine that makes requests wait is running all it can (its
/// `max_num_seqs`, or what its KV cache or token budget allows), and no engine publishes
/// that limit, so it is learned.
///
/// - A queue counts only when two distinct scrapes in a row (by their scrape time, at
///   most [`QUEUE_RUN_MAX_GAP_MS`] apart) show it, with at least one request running: a
///   request that arrived between two engine steps waits for one step, and is no sign of
///   a full batch. The same scrape seen again (a snapshot republished for another
///   endpoint's sake) teaches nothing.
/// - Once learned, a scrape that shows more running raises it, queue or not.
/// - A value neither raised nor confirmed by a queue for [`LEARNED_BATCH_TTL_MS`] is
///   forgotten.
///
/// An endpoint is **full** when its occupancy (the larger of its scraped running plus
/// waiting and the requests this proxy has in flight there, which are current where the
/// scrape is not) reaches what it was seen to run: one more request would wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCapacity {
    /// The batch, and the scrape time that last set or confirmed it.
    learned: Option<(u32, Millis)>,
    /// The last scrape observed: its time and whether requests waited.
    last: Option<(Millis, bool)>,
}

impl BatchCapacity {
    /// Learn from one scrape of the endpoint, taken at `scraped_at` (`None` figures:
    /// unknown, which ends a queue run).
    pub fn observe(&mut self, scraped_at: Millis, waiting: Option<u32>, running: Option<u32>) {
        let previous = self.last;
        if previous.is_some_and(|(at, _)| at == scraped_at) {
            return;
        }
        if self
            .learned
            .is_some_and(|(_, at)| scraped_at.since(at) > LEARNED_BATCH_TTL_MS)
        {
            self.learned = None;
        }
        let queued = waiting.is_some_and(|w| w > 0);
        let run = queued
            && previous.is_some_and(|(at, was_queued)| {
                was_queued && scraped_at.since(at) <= QUEUE_RUN_MAX_GAP_MS
            });
        let running = running.unwrap_or(0);
        self.learned = match self.learned {
            Some((batch, _)) if running > 0 && (run || running > batch) => {
                Some((batch.max(running), scraped_at))
            }
            None if run && running > 0 => Some((running, scraped_at)),
            kept => kept,
        };
        self.last = Some((scraped_at, queued));
    }

    /// The learned batch, if any.
    pub fn learned(&self) -> Option<u32> {
        self.learned.map(|(batch, _)| batch)
    }

    /// Whether an endpoint with `running` and `waiting` scraped and `in_flight` of this
    /// proxy's requests there is full (never, before a batch is learned).
    pub fn is_full(&self, running: u32, waiting: u32, in_flight: u32) -> bool {
        let occupancy = running.saturating_add(waiting).max(in_flight);
        self.learned().is_some_and(|batch| occupancy >= batch)
    }
}
