//! `infergate`, the operator's command-line tool, as a library: what the binary runs and
//! what the harness's launcher and tests share with it.
//!
//! - [`render`]: the user's Kubernetes objects as a gateway (an Envoy bootstrap, Istio or
//!   Envoy Gateway manifests), `infergate render`;
//! - [`explain`]: one scheduling decision offline, `infergate explain`;
//! - [`catalogue`]: the scheduling plugins' reference, generated from the code,
//!   `infergate plugins` (and the book's `docs/src/generated/plugins.md`);
//! - [`config`]: the gateway's Envoy configuration from a flavour and its pools (templates,
//!   bootstrap values, routes, tenants, objectives, EDS files), the one renderer `render` and
//!   the launcher use;
//! - [`reference`]: the book's command-line reference pages, generated from a clap
//!   parser (this tool's, `cargo xtask`'s, `infergate-bench`'s), and the test that keeps
//!   each committed page current.
//!
//! Artefact paths (the modules' default locations) come from `infergate-artefacts`.
//! Without tokio, hyper, the simulator or the load generator: `cargo install --path cli`
//! builds the tool alone.

pub mod catalogue;
pub mod config;
pub mod explain;
pub mod reference;
pub mod render;
