//! Implementation of `cargo xtask …`: building the artefacts (the Wasm module, the native
//! dynamic module, the simulator) and running every test tier in the order a failure is
//! cheapest to find: native unit and integration tests, the core compiled to wasm32 under
//! the wasmtime runner and under `wasm-bindgen-test` in Node, then the Python client tests
//! against the simulator.

mod artefacts;
mod bench;
mod demo;
mod fuzz;
mod setup;
mod test;
mod up;

use std::process::ExitCode;

pub use artefacts::{workspace_root, Artefacts};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup   install what is missing: the wasm32 targets, Envoy 1.40.0, the Python clients, Node's
          wasm-bindgen test runner
  build   build the release artefacts: the Wasm module, the native module, the simulator
  test    run every test: native, wasm32, Python client tests, real-Envoy end-to-end [--workers N]
  up      the stack on the simulated pool until Ctrl-C: --flavor wasm|native|plain [--replicas N]
  demo    /rr vs the gateway picker on the calibration workload: [--flavor wasm|native] [--quick]
  bench   overhead | affinity [--workers 1,2,4,8] | ttft | soak | memory (`cargo xtask bench help`)
  fuzz    each fuzz target (or one) for N seconds on nightly: [TARGET] [--seconds N] | --build";

/// Entry point of the `xtask` binary.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup::ensure(true)
            .and_then(|_| setup::ensure_wasm_bindgen_test())
            .map(|_| ()),
        Some("build") => setup::ensure(false).and_then(|_| artefacts::build_all().map(|_| ())),
        Some("test") => test::run(&args[1..]),
        Some("up") => up::run(&args[1..]),
        Some("demo") => demo::run(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
