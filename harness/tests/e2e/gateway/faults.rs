//! The fault suite: hostile clients, failing engines and abrupt disconnects through the
//! real Envoy. Every scenario checks the client's answer, that Envoy still serves a normal
//! request afterwards, and that nothing is left in flight (Envoy's active requests and the
//! picker's in-flight gauges; `support::settle`).
//!
//! - [`hostile`]: header values with bytes 0x80–0xFF, control bytes and 56/64 KiB, 100
//!   duplicate steering headers, on inference and pass-through paths, over HTTP/1.1 and
//!   HTTP/2; bodies that are truncated, deeply nested, huge in `tools`, `messages` or
//!   `model`, or not UTF-8; a body trickled in (408) or abandoned half-way;
//! - [`engines`]: a replica killed mid-stream, one that accepts and never answers,
//!   `/metrics` that hangs, fails, is huge or is garbage, an engine whose SSE is malformed;
//! - [`clients`]: clients that abort mid-stream (HTTP/1.1 and HTTP/2), and 2,000 streams
//!   held open at once, with Envoy's memory before, during and after.

mod clients;
mod engines;
mod hostile;

pub(super) use clients::aborted_and_held_streams_leave_nothing_in_flight;
pub(super) use engines::failing_engines_are_avoided_and_envoy_keeps_serving;
pub(super) use hostile::hostile_requests_are_answered_and_envoy_keeps_serving;

use crate::support::gw::picker_pool;
use infergate_harness::launch::PluginConfigs;

/// The model every fault stack serves.
pub(super) const MODEL: &str = "model-a";

/// The session header the fault stacks configure, so hostile values reach session hashing.
pub(super) const SESSION_HEADER: &str = "x-session-id";

/// Gives `model`'s picker pool the session header (hashed into its session table).
pub(super) fn with_sessions(plugins: &mut PluginConfigs, model: &str) {
    picker_pool(plugins, model)["sessionHeader"] = SESSION_HEADER.into();
}
