//! End-to-end tests through a real Envoy 1.40.0.
//!
//! - `plain`: the filter-free template: `/rr` round-robin, routing on
//!   `x-gateway-destination-endpoint` and `x-gateway-base-model-name`, unbuffered streams.
//! - `scrape_cluster`: the cluster the scraper calls through reaches the endpoint named in
//!   its call's header (proved with a Lua `httpCall`, which uses the same async client).
//! - `gateway`: one suite of test bodies, each run once per gateway flavour by
//!   [`for_each_flavour!`], which generates `gateway::wasm::<test>` and
//!   `gateway::native::<test>`. A flavour whose module is not built is skipped with a
//!   printed reason (CI builds the modules first).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../shared/clusters.rs"]
mod clusters;
#[path = "../shared/conversations.rs"]
mod conversations;
mod gateway;
#[path = "../shared/owner_trap.rs"]
mod owner_trap;
mod plain;
mod scrape_cluster;
mod support;
