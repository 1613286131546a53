//! The engines' KV-event streams, received natively: a ZMQ SUB client of our own (ZMTP 3.1,
//! NULL mechanism, over `std::net::TcpStream`, no async runtime) in one thread per process.
//!
//! - [`zmtp`]: the protocol as a sans-IO state machine over byte buffers.
//! - [`subscriber`]: the thread; one non-blocking connection per [`KvTarget`], a `poll(2)`
//!   loop, reconnect with backoff, per-connection sequence checking, bounded buffers.
//!
//! The thread calls the [`KvSink`] (deliver, stale, targets); it never runs on an Envoy worker
//! and a worker never waits for it. Each message of vLLM's publisher is three frames: topic
//! (`kv@<pod>@<model>`), sequence number (8 octets, big-endian, +1 per message), payload
//! (msgpack); [`KvSink::deliver`] gets them as they arrived, the payload undecoded.
//!
//! Staleness: events lost on a connection are never replayed. The sink is told
//! [`KvSink::stale`] when a sequence number is skipped, when an established connection is lost
//! (so the reconnect that follows starts from a forgotten endpoint), and when the subscriber
//! drops a connection that fell behind. A target removed from [`KvSink::targets`] is closed
//! without a `stale` call (the sink removed it itself).

pub mod subscriber;
pub mod zmtp;

pub use subscriber::{spawn, spawn_with, Config, Handle, Stats, StatsSnapshot};

use std::net::SocketAddr;

/// One endpoint's event stream to follow.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KvTarget {
    /// The pool the endpoint belongs to.
    pub pool: String,
    /// The endpoint as the picker names it (its `ip:port` serving address).
    pub endpoint: String,
    /// Where its engine publishes KV events (ZMQ PUB, TCP).
    pub events: SocketAddr,
}

/// Where the subscriber thread hands what it receives. Every method is called from the
/// subscriber thread only, one call at a time.
pub trait KvSink: Send + Sync + 'static {
    /// The streams to follow now; polled about once a second (a new target is connected, a
    /// missing one closed).
    fn targets(&self) -> Vec<KvTarget>;
    /// One message of `target`'s stream: its topic frame, sequence number and payload.
    fn deliver(&self, target: &KvTarget, topic: &[u8], seq: u64, payload: &[u8]);
    /// Events of `target` were lost (gap, lost connection, dropped for falling behind): forget
    /// what it was known to hold.
    fn stale(&self, target: &KvTarget);
}

#[cfg(test)]
mod tests;
