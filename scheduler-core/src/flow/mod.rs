//! Flow control: admission and queueing of requests while a pool is saturated.
//!
//! (Being written: configuration, queues, fairness and ordering policies, saturation
//! detectors. The public API below is fixed; the bodies follow.)

pub mod config;
pub mod quantity;
pub mod queues;
pub mod saturation;

pub use config::{
    BandConfig, ConcurrencyMode, Detector, FairnessPolicy, FlowControlConfig, OrderingPolicy,
    UtilizationThresholds,
};
pub use queues::{Arrival, Dispatched, FlowQueues, QueueKey, Refusal, Removed};
