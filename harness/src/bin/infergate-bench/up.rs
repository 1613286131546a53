//! `cargo xtask up --flavor wasm|native|plain [--replicas N] [--concurrency C]
//! [--sim-config FILE]`: the launcher's `up` (`infergate_harness::launch::up`) over the
//! artefacts xtask built, which prints the picker and baseline URLs and stays up until
//! SIGINT/SIGTERM.

use super::Mode;
use anyhow::Result;
use infergate_harness::launch::{up_blocking, UpOptions};

/// Entry point of `cargo xtask up`.
pub fn run(args: &[String], mode: Mode) -> Result<()> {
    match mode {
        Mode::Check => UpOptions::parse(args).map(drop),
        Mode::Run => up_blocking(args),
    }
}
