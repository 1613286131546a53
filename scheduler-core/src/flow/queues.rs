//! The queues of one pool: bands, flows, policies, limits and TTLs.

use alloc::string::String;
use core::marker::PhantomData;

use super::config::FlowControlConfig;

/// A request arriving at a saturated pool.
#[derive(Debug)]
pub struct Arrival<T> {
    /// Its priority (the objective's; 0 when none).
    pub priority: i32,
    /// Its fairness id (`default-flow` when none).
    pub flow: String,
    /// Its body size, counted against `maxBytes`.
    pub bytes: u64,
    /// Its estimated service in tokens: prompt + 2 × completion estimate.
    pub service: u64,
    /// Its TTL; `None`: the configuration's default.
    pub ttl_ms: Option<u64>,
    /// When it arrived.
    pub now_ms: u64,
    /// The host's handle (how to wake it, what to run when dispatched).
    pub item: T,
}

/// Names a queued request, to cancel it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey(pub u64);

/// Why a request could not be queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its band or the whole queue is full (`rejected-saturated`).
    Saturated,
}

/// A request taken from the queue to be served.
#[derive(Debug)]
pub struct Dispatched<T> {
    /// The host's handle.
    pub item: T,
    /// The band it waited in.
    pub band_priority: i32,
    /// Its flow.
    pub flow: String,
    /// How long it waited.
    pub queued_ms: u64,
}

/// A request that left the queue without being served (TTL, cancel).
#[derive(Debug)]
pub struct Removed<T> {
    /// The host's handle.
    pub item: T,
    /// The band it waited in.
    pub band_priority: i32,
    /// Its flow.
    pub flow: String,
    /// How long it waited.
    pub queued_ms: u64,
}

/// The queues of one pool.
#[derive(Debug)]
pub struct FlowQueues<T> {
    _items: PhantomData<T>,
}

impl<T> FlowQueues<T> {
    /// Empty queues for `config`.
    pub fn new(config: &FlowControlConfig) -> FlowQueues<T> {
        let _ = config;
        FlowQueues {
            _items: PhantomData,
        }
    }
}
