//! `cargo xtask up --flavor wasm|native|plain [--replicas N] [--concurrency C]
//! [--sim-config FILE] [--tenants PATH] [--billing-log FILE] [--epp-config FILE]
//! [--objectives FILE] [--rewrites FILE] [--pool NAME=MODEL[@I,J]]...
//! [--split MODEL=POOL:W,POOL:W]... [--sticky-split] [--canary-header NAME=VALUE:POOL]...
//! [--routes FILE] [--gateways N]`: the launcher's `up` (`infergate_harness::launch::up`)
//! over the artefacts xtask built, which prints the picker and baseline URLs (and the
//! billing log's path) and stays up until SIGINT/SIGTERM.
//!
//! `--gateways N`: N Envoy gateways over the one simulated pool, each its own process with
//! its own ports, printed as `gateway K: URL` (and gateway 0's `baseline: URL`).
//!
//! The pool and route flags:
//! - `--rewrites FILE`: the router rewrites models with the file's `InferenceModelRewrite`
//!   objects (their `spec.poolRef.name` is a pool as `up` names it);
//! - `--pool NAME=MODEL[@I,J]`: a pool named NAME serving MODEL on those replica indices
//!   (every replica without `@`); given once or more, these replace the default pools (one
//!   per served model over every replica), and its Envoy cluster is `pool-<index>-<NAME>`;
//! - `--split MODEL=POOL:W,POOL:W`: MODEL's traffic split across pools by weight through
//!   Envoy's weighted clusters, per request, or with `--sticky-split` by
//!   `x-gateway-split-key` (one pool per conversation);
//! - `--canary-header NAME=VALUE:POOL`: requests carrying that header go to POOL, ahead
//!   of any split;
//! - `--routes FILE`: Gateway API `HTTPRoute` objects read verbatim, their `backendRefs`
//!   naming `--pool`s by name, with weights (`--sticky-split` applies to them too).
//!
//! POOL is a `--pool` name or a pool index. `--tenants`, `--billing-log`, `--epp-config`,
//! `--objectives` and `--rewrites` need a gateway flavour (not `plain`).

use super::Mode;
use anyhow::Result;
use infergate_harness::launch::up::stack_options;
use infergate_harness::launch::{up_blocking, UpOptions};

/// Entry point of `cargo xtask up`.
pub fn run(opts: UpOptions, mode: Mode) -> Result<()> {
    opts.check()?;
    match mode {
        // Also reads the simulator config, the tenants, the EPP config, the objectives, the
        // routes and the rewrites (checked against the pools), and lays out the pools and
        // splits, so a bad file or flag fails before the modules are built.
        Mode::Check => stack_options(&opts).map(drop),
        Mode::Run => up_blocking(opts),
    }
}
