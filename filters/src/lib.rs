//! Host-agnostic filter logic of the gateway: the per-request state machines of the body
//! router and the picker, and the scraper loop, written against small host traits so the
//! proxy-wasm adapter (`wasm/`) and the dynamic-module adapter (`envoy/`) stay thin.
//!
//! # Design
//!
//! - **Capabilities, not a host object.** [`host`] declares one small trait per capability
//!   (request headers, request body, local reply, snapshot source, clock, random, stats,
//!   callouts, dynamic metadata, upstream override, ...). Each entry point asks only for the
//!   traits it uses, as generic bounds (`fn on_request_body<H: RequestHeaders + RequestBody +
//!   LocalReply>(&mut self, host: &mut H, ..)`), so an adapter implements exactly what its
//!   host offers and a test fake implements exactly what a test drives.
//! - **Per-request state machines return a [`FilterStatus`]** (`Continue`, `Pause`,
//!   `Replied`). Adapters map it onto their host: proxy-wasm `Action::Continue` /
//!   `Action::Pause` (a paused body callback means "buffer"), Envoy dynamic modules'
//!   `Continue` / `StopIteration*`. `Replied` means a local reply was already sent through
//!   [`host::LocalReply`]; the adapter stops the filter chain.
//! - **Shared state is a plain struct with `&mut` methods**: [`picker::PickerShared`] (prefix
//!   index, in-flight counts, sessions, decoded snapshot) and [`scraper::Scraper`]. One lives
//!   per Wasm VM (owned in an `Rc<RefCell<_>>` by the proxy-wasm root context) or one per
//!   Envoy process (behind a `Mutex` in the dynamic module). The adapter picks the lock;
//!   nothing in here is `Sync`-aware or blocks.
//! - **In-flight accounting cannot leak or double count**: a pick returns an
//!   [`picker::InFlightLease`] (not `Clone`, `#[must_use]`), held by the request's
//!   [`picker::PickerRequest`]; [`picker::PickerRequest::on_end_counted`] gives it back by
//!   value exactly once, whichever of "complete" and "reset" (or the context drop) comes
//!   first, and moves the in-flight gauges back with it.
//! - **No decisions here that belong to the core**: endpoint choice is
//!   `scheduler_core::scheduling`; this crate turns host events into core calls and core
//!   results into headers, replies and stats.
//! - **No panics**: no `unwrap`/`expect`/indexing on input-derived data. A config error is
//!   returned to the adapter (which refuses to start); a request-time internal error becomes
//!   a 500 OpenAI-style reply.
//!
//! Module map: [`host`] (capability traits), [`status`] (what a callback returns),
//! [`reply`] (OpenAI error replies), [`stats`] (stat names and families), [`headers`]
//! (wire names and client-header stripping), [`handoff`] (router → picker per-stream
//! handoff), [`router`] (body router), [`picker`]
//! (endpoint picker), [`scraper`] (metrics scraper), [`consistency`] (checks between
//! separately loaded configs), [`fake`] (a builder-style fake host
//! for tests; feature `fake-host` exports it). `benches/filters.rs` measures the router
//! and the picker on an 8k-token body.

pub(crate) mod codec;
pub mod consistency;
pub mod handoff;
pub mod headers;
pub mod host;
pub mod picker;
pub mod pipeline;
pub mod reply;
pub mod router;
pub mod scraper;
pub mod stages;
pub mod stats;
pub mod status;

#[cfg(any(test, feature = "fake-host"))]
pub mod fake;

pub use status::FilterStatus;
