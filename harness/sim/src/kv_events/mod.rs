//! vLLM's KV events, published by each simulated replica from its real cache over ZMQ PUB
//! (the `zeromq` crate, on the pool's tokio runtime).
//!
//! Off by default; `SimConfig::kv_events_port_offset` (`--kv-events-port-offset N`) turns it
//! on: replica K, serving HTTP on `IP:P`, binds its PUB socket at `tcp://IP:(P + N)`.
//!
//! Wire, as vLLM's `ZmqEventPublisher`: each message is three frames,
//! 1. topic `kv@<pod>@<model>`, pod = the replica's HTTP address `IP:PORT` (what the gateway
//!    knows the endpoint as), model = the pool's base model name;
//! 2. the sequence number, u64 big-endian, 0 for the first message, +1 per message;
//! 3. the msgpack payload ([`encode`]).
//!
//! Events come from the engine's [`crate::engine::cache_events`] log: `BlockStored` when a
//! block's tokens are computed and its hash enters the cache (and when prefill/decode
//! disaggregation imports it), `BlockRemoved` when allocation evicts it, `AllBlocksCleared`
//! on a prefix-cache reset (`POST /reset_prefix_cache`). Each batch of engine work (steps
//! completed at one wake-up, or one command) is one batch; batches queued behind a slow
//! socket or a pause are merged, up to [`publisher::MAX_EVENTS_PER_MESSAGE`] events.
//!
//! The simulator token model: token ids are the prompt bytes (chat serialization of
//! [`crate::prompt`], then the completion) in 4-byte little-endian chunks, so a block of
//! `block_size` tokens is `4 × block_size` bytes, exactly what its hash covers; `block_size`
//! in each `BlockStored` is the engine's block size in tokens.

pub mod encode;
pub mod publisher;

pub use encode::{encode_batch, BatchShape};
pub use publisher::{KvEventsControl, KvEventsStats, MAX_EVENTS_PER_MESSAGE};

/// The topic frame of a replica at `pod` serving `model`.
pub fn topic(pod: &str, model: &str) -> String {
    format!("kv@{pod}@{model}")
}
