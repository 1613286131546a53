//! `infergate-bench`: the commands that run the gateway's stack in-process (the simulator,
//! the load generator, a real Envoy), with the command lines of `cargo xtask up|demo|bench`,
//! which builds this binary in release, builds the artefacts and then becomes it.
//!
//! `infergate-bench --check <command> [options]` only parses the options and exits (0 when
//! they are valid), so xtask can refuse a bad command line before the long module builds.

mod bench;
mod demo;
mod up;

use std::process::ExitCode;

const USAGE: &str = "usage: infergate-bench [--check] <command> [options] (what cargo xtask runs)
  up     the stack on a simulated pool until Ctrl-C (`up --help`)
  demo   /rr vs the picker on a chat workload (`demo --help`)
  bench  overhead | affinity | ttft | soak | memory (`bench help`)";

/// Whether a command runs or only checks its options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Parse the options, report the first bad one, do nothing else.
    Check,
    /// Do the work.
    Run,
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mode = if args.first().is_some_and(|a| a == "--check") {
        args.remove(0);
        Mode::Check
    } else {
        Mode::Run
    };
    let (command, rest) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        "up" => up::run(rest, mode),
        "demo" => demo::run(rest, mode),
        "bench" => bench::run(rest, mode),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => {
            eprintln!("infergate-bench: unknown command `{other}`\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("infergate-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
