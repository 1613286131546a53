//! `cargo xtask up --flavor wasm|native|plain [--replicas N] [--concurrency C]
//! [--sim-config FILE]`: builds the artefacts, then runs the launcher's `up`
//! (`crate::launch::up`), which prints the picker and baseline URLs and stays up until
//! SIGINT/SIGTERM.

use super::bench::prepare;
use crate::launch::{up_blocking, UpOptions};
use anyhow::Result;

/// Entry point of `cargo xtask up`.
pub fn run(args: &[String]) -> Result<()> {
    // Bad arguments fail before the build.
    UpOptions::parse(args)?;
    prepare()?;
    up_blocking(args)
}
