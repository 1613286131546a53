#![no_std]
#![warn(missing_docs)]
//! The scheduling core of the in-Envoy inference gateway.
//!
//! Every routing decision is a pure function of data passed in: the parsed request, the
//! latest metric snapshot, the proxy's own state (prefix index, in-flight load), the current
//! time and a random value. No I/O, no clock, no global RNG, no threads; the same code runs
//! natively (dynamic module, harness) and on `wasm32-wasip1` (proxy-wasm).
//!
//! Module map:
//! - [`types`]: small newtypes shared by every module (`BlockHash`, `Tokens`, ...).
//! - [`config`]: the `EndpointPickerConfig` document and its errors, read by [`scheduling`]
//!   and [`flow`] (a leaf: it imports neither).
//! - [`request`]: one-pass parsing of OpenAI / Anthropic request bodies.
//! - [`prefix`]: chained block hashing of prompts and the approximate prefix index.
//! - [`metrics`]: the Prometheus text parser and the per-endpoint metrics it extracts.
//! - [`snapshot`]: the versioned binary snapshot the scraper publishes and the picker reads.
//! - [`scheduling`]: `EndpointPickerConfig` compiled into plugins and profiles, and the
//!   decision record.
//! - [`flow`]: flow control (admission and queueing while a pool is saturated).
//! - [`latency`]: per-endpoint estimates of the latency the gateway measures itself.

extern crate alloc;
#[cfg(test)]
extern crate std;

pub mod config;
pub mod flow;
pub mod kv_events;
pub mod latency;
pub mod metrics;
pub mod prefix;
pub mod quota;
pub mod request;
pub mod scheduling;
pub mod snapshot;
pub mod types;
pub mod usage;
