//! `cargo xtask demo [--flavor wasm|native] [--quick] [--time-scale S]`: the README's main
//! command. Builds the artefacts, brings the gateway up on the simulated pool of the
//! calibration, sends the multi-turn workload to Envoy's round-robin `/rr` and then through
//! the picker, prints the two side by side with the TTFT and cache-hit ratios, and stops
//! Envoy and the simulator.

use super::bench::{compare_with_baseline, prepare};
use crate::bench::calibration::{CalibrationArgs, Route, RunSpec};
use crate::launch::Flavor;
use anyhow::Result;

/// Envoy worker threads of the demo. One: on a 2-core machine the simulator and the load
/// generator need the other core, and a Wasm picker keeps its prefix index per worker, so
/// with more workers each sees only part of a conversation (`bench affinity` shows it).
const DEMO_WORKERS: u32 = 1;

/// Entry point of `cargo xtask demo`.
pub fn run(args: &[String]) -> Result<()> {
    // Bad arguments fail before the build.
    let a = CalibrationArgs::parse(args, &[Flavor::Wasm], &[DEMO_WORKERS])?;
    prepare()?;
    let mut specs = Vec::new();
    let workers = a.concurrencies.first().copied().unwrap_or(DEMO_WORKERS);
    for &f in &a.flavors {
        if specs.is_empty() {
            specs.push(RunSpec::new(
                "/rr (round-robin)",
                f,
                workers,
                Route::Baseline,
            ));
        }
        specs.push(RunSpec::new(
            format!("picker ({f})"),
            f,
            workers,
            Route::Picker,
        ));
    }
    eprintln!(
        "demo: the same multi-turn workload through Envoy's round-robin route, then through \
         the gateway picker (Envoy --concurrency {})",
        workers
    );
    let (out, _) = compare_with_baseline(
        "infergate demo: round-robin vs the gateway picker",
        &a,
        &specs,
        false,
    )?;
    println!("\n{out}");
    eprintln!("demo: Envoy and the simulator stopped");
    Ok(())
}
