//! `cargo xtask up --flavor wasm|native|plain [--replicas N] [--concurrency C]
//! [--sim-config FILE] [--tenants PATH] [--billing-log FILE] [--epp-config FILE]
//! [--objectives FILE]`: the launcher's `up`
//! (`infergate_harness::launch::up`) over the artefacts xtask built, which prints the
//! picker and baseline URLs (and the billing log's path) and stays up until SIGINT/SIGTERM.

use super::Mode;
use anyhow::Result;
use infergate_harness::launch::up::{stack_options, USAGE};
use infergate_harness::launch::{up_blocking, UpOptions};

/// Entry point of `cargo xtask up`.
pub fn run(args: &[String], mode: Mode) -> Result<()> {
    if args
        .iter()
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
    {
        println!("{USAGE}");
        return Ok(());
    }
    match mode {
        // Also reads the simulator config, the tenants, the EPP config and the objectives,
        // so a bad file fails before the modules are built.
        Mode::Check => UpOptions::parse(args)
            .and_then(|o| stack_options(&o))
            .map(drop),
        Mode::Run => up_blocking(args),
    }
}
