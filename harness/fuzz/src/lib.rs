//! The bodies of the fuzz targets, one `pub fn(&[u8])` per target, each asserting that its
//! code never panics on the input and keeps the bounds it promises (output sizes, and the
//! memory a call may take, measured by [`meter`]).
//!
//! They live here, on stable, rather than in the cargo-fuzz crate (`fuzz/`, nightly), so
//! that `cargo test` replays every seed of `testdata/fuzz/<target>/` through the same
//! assertions (`tests/corpus.rs`) and a crash found by the fuzzer becomes a corpus file
//! that every later test run checks. [`TARGETS`] lists them by the names the cargo-fuzz
//! binaries and corpus directories use.

mod admin_clusters;
mod flow_config;
mod kv_events;
pub mod meter;
mod model_rewrites;
mod owner_messages;
mod targets;
mod tenant_objects;
mod usage_stream;

pub use admin_clusters::admin_clusters;
pub use flow_config::flow_config;
pub use kv_events::kv_events;
pub use model_rewrites::model_rewrites;
pub use owner_messages::owner_messages;
pub use targets::{
    canonical_prompt, handoff_codec, memory_bound, prometheus_parser, request_parser,
    snapshot_codec, EXPANSION,
};
pub use tenant_objects::tenant_objects;
pub use usage_stream::usage_stream;

/// One fuzz target: its name (cargo-fuzz binary and `testdata/fuzz/` directory) and body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("request_parser", request_parser),
    ("canonical_prompt", canonical_prompt),
    ("prometheus_parser", prometheus_parser),
    ("snapshot_codec", snapshot_codec),
    ("handoff_codec", handoff_codec),
    ("usage_stream", usage_stream),
    ("tenant_objects", tenant_objects),
    ("flow_config", flow_config),
    ("owner_messages", owner_messages),
    ("model_rewrites", model_rewrites),
    ("admin_clusters", admin_clusters),
    ("kv_events", kv_events),
];
