//! `cargo xtask`: the project's automation, so a new user needs exactly two commands
//! (`cargo xtask demo` and `cargo xtask test`).
//!
//! This crate only orchestrates processes: it installs what is missing ([`setup`]), runs
//! cargo to build the artefacts ([`artefacts`]) and the test tiers ([`test`]), and drives
//! `cargo fuzz` ([`fuzz`]), and packages the release ([`dist`]). It depends on std and
//! anyhow, and for `dist` on sha2 and serde_json, so it starts without compiling the
//! harness. The commands that run the gateway's stack in-process (`up`,
//! `demo`, `bench`) live in the harness's `infergate-bench` binary, which [`stack`] builds
//! in release and hands the command line to.

mod artefacts;
mod dist;
mod fuzz;
mod setup;
mod stack;
mod test;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command> [options]

commands:
  setup   install what is missing: wasm32 targets, Envoy 1.40.0, Python clients, Node test runner
  build   build the release artefacts: the Wasm module, the native module, the simulator
  dist    dist/: both modules with sha256, the Wasm OCI image, Envoy version, examples [--out DIR]
  test    every test tier, real-Envoy end-to-end and a 1-minute soak: [--workers N] [--skip-python]
  up      the stack on a simulated pool until Ctrl-C: flavour, tenants, flow control (up --help)
  demo    /rr vs the gateway: [--scenario calibration|hotspot|tenants|canary] (demo --help)
  bench   overhead|affinity|ttft|soak|memory|flow|lora|pd|replicas, in release (`bench help`)
  fuzz    each fuzz target (or one) for N seconds on nightly: [TARGET] [--seconds N] | --build
  help    this list";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        "setup" => setup::ensure(true)
            .and_then(|_| setup::ensure_wasm_bindgen_test())
            .map(|_| ()),
        "build" => setup::ensure(false).and_then(|_| artefacts::build_all().map(|_| ())),
        "dist" => dist::run(rest),
        "test" => test::run(rest),
        "up" | "demo" | "bench" => stack::run(command, rest),
        "fuzz" => fuzz::run(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => {
            eprintln!("xtask: unknown command `{other}`\n{USAGE}");
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

#[cfg(test)]
mod tests {
    use super::USAGE;

    #[test]
    fn help_lists_every_command_on_one_line() {
        let commands: Vec<&str> = USAGE
            .lines()
            .skip_while(|l| *l != "commands:")
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(
            commands,
            ["setup", "build", "dist", "test", "up", "demo", "bench", "fuzz", "help"]
        );
        // Each line fits a terminal of 100 columns.
        for line in USAGE.lines() {
            assert!(line.len() <= 100, "{line}");
        }
    }
}
