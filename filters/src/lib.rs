#![warn(missing_docs)]
//! Host-agnostic filter logic of the gateway: the request pipeline and its stages (the body
//! router, the picker), and the scraper loop, written against small host traits so the
//! proxy-wasm adapter (`wasm/`) and the dynamic-module adapter (`envoy/`) stay thin.
//!
//! # Design
//!
//! - **One request pipeline.** Every feature is a [`pipeline::Stage`] ([`stages`]). One
//!   builder per filter role ([`stages::build`]) assembles a filter's stages from its
//!   configuration; an adapter calls it and runs the pipeline it gets
//!   ([`pipeline::Pipeline`] + one [`pipeline::Run`] per request), never naming a stage.
//!   Where Envoy must match the route again between stages (the router's model header picks
//!   the pool cluster), the pipeline is hosted in two Envoy filters, `router` then `picker`;
//!   the parse and the prompt's block hashes cross between them once, as the [`handoff`].
//! - **Capabilities, not a host object.** [`host`] declares one small trait per capability
//!   (request headers and body, response headers and chunks, local reply, waker, snapshot
//!   source, clock, random, stats, callouts, dynamic metadata, ...). A
//!   stage asks for the traits it uses as bounds on the host type, so an adapter implements
//!   exactly what its host offers and a test fake exactly what a test drives.
//! - **One status, not host statuses.** A stage answers a [`FilterStatus`] (`Continue`,
//!   `Pause`, `Replied`), and the driver answers the adapter the same type, which the
//!   adapter maps onto its host: proxy-wasm `Action::Continue` / `Action::Pause`, Envoy
//!   dynamic modules' `Continue` / `StopIteration*`.
//! - **Per-request data lives in the request's context** ([`pipeline::RequestContext`]),
//!   each stage's under a type of its own, and is dropped with the request whatever path it
//!   ends by; every stage's `on_end` runs exactly once.
//! - **Shared state**: [`picker::PickerShared`] (prefix index, in-flight counts, sessions,
//!   decoded snapshot; each pool behind its own lock) and [`scraper::Scraper`]. One lives
//!   per Envoy process in the native flavour; the Wasm flavour reaches one owner through
//!   the singleton service.
//! - **In-flight accounting cannot leak or double count**: a pick returns an
//!   [`picker::InFlightLease`] (not `Clone`), held by the pick stage's
//!   [`stages::pick::Picking`] in the context; it is given back at the request's end, or
//!   gives itself back when dropped.
//! - **No decisions here that belong to the core**: endpoint choice is
//!   `scheduler_core::scheduling`; this crate turns host events into core calls and core
//!   results into headers, replies and stats.
//! - **No panics**: no `unwrap`/`expect`/indexing on input-derived data. A config error is
//!   returned to the adapter (which refuses to start); a request-time internal error becomes
//!   a 500 OpenAI-style reply.
//!
//! Module map: [`pipeline`] (stage trait, context, driver), [`stages`] (route, pick,
//! tenancy and test stages, and the builder), [`host`] (capability traits), [`status`]
//! (what a stage and the driver return), [`reply`]
//! (OpenAI error replies), [`stats`] (stat names and families), [`headers`] (wire names and
//! client-header stripping), [`handoff`] (router → picker per-stream handoff), [`router`]
//! (the body router's configuration and decisions; [`rewrite`], the model rewrite and its
//! sticky split), [`picker`] (the endpoint picker's state, configuration and decisions;
//! with [`flow`], the flow-control gate it asks before it picks), [`scraper`]
//! (metrics scraper; [`membership`], the pool membership it follows), [`tenants`] and
//! [`rewrite`] read the platform's Kubernetes objects
//! through [`objects`] (field by field, errors naming object and path),
//! [`consistency`] (checks between separately loaded configs), `fake` (a builder-style
//! fake host for tests; feature `fake-host` exports it). `benches/filters.rs` measures the
//! router and the picker on an 8k-token body.

pub mod billing;
pub(crate) mod codec;
pub mod consistency;
pub mod election;
pub mod flow;
pub mod handoff;
pub mod headers;
pub mod host;
pub mod jwt;
pub mod membership;
pub mod objects;
pub mod picker;
pub mod pipeline;
pub mod precise;
pub mod quotas;
pub mod reply;
pub mod rewrite;
pub mod router;
pub mod scraper;
pub mod stages;
pub mod stats;
pub mod status;
pub mod tenants;
pub mod tokenize;

#[cfg(any(test, feature = "fake-host"))]
pub mod fake;

pub use status::FilterStatus;
