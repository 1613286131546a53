//! Flow control: admission and queueing of requests while a pool is saturated.
//!
//! Pure and host-agnostic, like the rest of the core: the host owns the clock, the
//! in-flight counts, the snapshot and the paused requests; this module decides.
//!
//! - [`config`]: the `flowControl` section of an `EndpointPickerConfig` (behind
//!   `featureGates: [flowControl]`) compiled into a [`FlowControlConfig`], with its defaults.
//! - [`quantity`]: Kubernetes quantities (`"1k"`, `"10Gi"`) and durations (`"60s"`).
//! - [`saturation`]: whether the pool is saturated (concurrency and utilization detectors).
//! - [`eviction`]: which in-flight requests of sheddable bands a queued request may
//!   evict (`enableEviction`), and in what order ([`Victims`]).
//! - [`queues`]: the bands, flows and their fairness and ordering policies, limits, TTLs and
//!   cancellation ([`FlowQueues`]).
//!
//! A host's admission step: not saturated and [`FlowQueues::blocks`] false → admit at once;
//! else [`FlowQueues::enqueue`] (a refusal is 429 `rejected-saturated`) and pause. When
//! capacity frees (a lease ends, a new snapshot), [`FlowQueues::expire`] (429
//! `rejected-ttl-expired`), then [`FlowQueues::dispatch`] while the pool is not saturated;
//! a client that leaves is [`FlowQueues::cancel`]led (`rejected-context-cancelled`); when the
//! real service of a weighted flow's request is known, [`FlowQueues::charge`] corrects it.

pub mod config;
pub mod eviction;
pub mod quantity;
pub mod queues;
pub mod saturation;

pub use config::{
    BandConfig, ConcurrencyMode, Detector, FairnessPolicy, FlowControlConfig, FlowPlugin,
    OrderingPolicy, UtilizationThresholds, DEFAULT_FLOW,
};
pub use eviction::{Need, VictimKey, Victims, EVICTED_BY_PRIORITY};
pub use queues::{Arrival, Dispatched, FlowQueues, QueueKey, Refusal, Removed};
pub use saturation::{all_saturated, BatchCapacity, InFlightLoad};

// Tests may panic on a broken fixture: that is how a test fails.
#[cfg(test)]
#[allow(clippy::panic)]
mod tests;
