//! A gateway's Envoy configuration, from a flavour and a description of its pools: what
//! `infergate render` writes and what the harness's launcher starts Envoy on, one renderer
//! for both (what the tests run is what users get).
//!
//! - [`template`]: placeholder substitution on the templates in `envoy/config/` (compiled
//!   into the binary: an installed `infergate` needs no checkout); [`bootstrap`]: the values
//!   each flavour's template needs (pools, endpoints, plugin configurations) and the render;
//! - [`routes`]: the routes to the pools (weighted splits, header-targeted rules);
//!   [`rewrites`]: the router's model rewrites and how a split is drawn;
//! - [`tenancy`]: tenants, JWT verification and the billing log, and the loader of the
//!   platform's objects; [`global_quotas`]: the tenants' limits in a global rate-limit
//!   service shared by several gateways;
//! - [`epp`]: an operator's `EndpointPickerConfig` (or the `ConfigMap` holding it) and
//!   `InferenceObjective` files, and the objectives in the picker's configuration;
//! - [`eds`]: the pool clusters' members from Envoy's file-based EDS (membership `Eds`);
//! - [`peers`]: the peers file, where each cluster of a ClusterSet runs its gateway.

pub mod bootstrap;
pub mod eds;
pub mod epp;
pub mod global_quotas;
pub mod peers;
pub mod rewrites;
pub mod routes;
pub mod template;
pub mod tenancy;

pub use bootstrap::{
    BootstrapParams, ClientTimeouts, FailureMode, Flavor, GatewaySettings, PluginConfigs, Pool,
};
pub use eds::{EdsDir, EdsHealth, EdsHost, Membership};
pub use routes::RouteSpec;
pub use tenancy::{load_objects, read_billing_log, JwtProvider, Tenancy};
