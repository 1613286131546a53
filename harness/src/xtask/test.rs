//! `cargo xtask test`: every test tier, in the order a failure is cheapest to find.
//!
//! 1. the release artefacts (Wasm module, native module with the `panic-injection` test
//!    feature, simulator), which the end-to-end tests load into a real Envoy;
//! 2. `cargo test --workspace`: unit, property, fake-host, wasmtime-host and real-Envoy tests;
//! 3. the scheduling core's tests compiled to `wasm32-wasip1`, run by our wasmtime runner, so
//!    hashing and parsing are proven identical on the Wasm target;
//! 4. the Python tests: the simulator under the official `openai` client and
//!    `prometheus_client`'s parser.

use super::artefacts::{
    build_all, build_panic_injection_module, cargo, target_dir, workspace_root,
};
use anyhow::{bail, Context, Result};
use std::process::Command;

/// Runs every tier; `args` may hold `--skip-python` for machines without the Python deps.
pub fn run(args: &[String]) -> Result<()> {
    let skip_python = args.iter().any(|a| a == "--skip-python");
    super::setup::ensure(!skip_python)?;
    let mut artefacts = build_all()?;
    // The end-to-end suite's native runs load the test build, which can inject a panic.
    artefacts.native_module = build_panic_injection_module()?;
    let env = artefacts.env();
    cargo(&["test", "--workspace", "--no-fail-fast"], &env)?;

    cargo(
        &["build", "-p", "infergate-wasm-host", "--bin", "wasi-run"],
        &[],
    )?;
    let runner = target_dir().join("debug/wasi-run");
    cargo(
        &["test", "-p", "scheduler-core", "--target", "wasm32-wasip1"],
        &[("CARGO_TARGET_WASM32_WASIP1_RUNNER", runner)],
    )?;

    if !skip_python {
        eprintln!("xtask: pytest harness/python");
        let status = Command::new("python3")
            .args(["-m", "pytest", "-q", "harness/python"])
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .current_dir(workspace_root())
            .status()
            .context("running pytest")?;
        if !status.success() {
            bail!("python tests failed with {status}");
        }
    }
    eprintln!("xtask: all tests passed");
    Ok(())
}
