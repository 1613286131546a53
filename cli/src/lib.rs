//! `infergate`, the operator's command-line tool, as a library: what the binary runs and
//! what the harness's launcher and tests share with it.
//!
//! - [`render`]: the user's Kubernetes objects as a gateway (an Envoy bootstrap, Istio or
//!   Envoy Gateway manifests), `infergate render`;
//! - [`explain`]: one scheduling decision offline, `infergate explain`;
//! - [`config`]: the gateway's Envoy configuration from a flavour and its pools (templates,
//!   bootstrap values, routes, tenants, objectives, EDS files), the one renderer `render` and
//!   the launcher use.
//!
//! Artefact paths (the modules' default locations) come from `infergate-artefacts`.
//! Without tokio, hyper, the simulator or the load generator: `cargo install --path cli`
//! builds the tool alone.

pub mod config;
pub mod explain;
pub mod render;
