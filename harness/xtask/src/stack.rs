//! `cargo xtask up|demo|bench …`: the commands that run the gateway's stack (the simulator,
//! the load generator, Envoy) in-process. They live in the harness's `infergate-bench`
//! binary; this module builds it in release, checks the arguments with it, installs what is
//! missing and builds the artefacts, then replaces this process with it.
//!
//! Release, because a load client, a simulator and a fast backend measured in debug would
//! measure themselves. `exec`, so the binary takes this process's place (same pid, same
//! terminal): Ctrl-C and SIGTERM reach it directly and it shuts its stack down cleanly.

use crate::artefacts::{build_all, build_bench_modules, build_service, cargo, target_dir, Service};
use crate::setup;
use anyhow::{Context, Result};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// The harness binary that runs `up`, `demo` and `bench`, with the same command line.
const BINARY: &str = "infergate-bench";

/// Its first argument for a run that only checks the rest and exits (0: they are valid).
const CHECK_FLAG: &str = "--check";

/// Builds the harness binary in release and returns its path.
pub fn build_binary() -> Result<PathBuf> {
    cargo(
        &[
            "build",
            "--release",
            "-p",
            "infergate-harness",
            "--bin",
            BINARY,
        ],
        &[],
    )?;
    Ok(target_dir().join("release").join(BINARY))
}

/// Whether the command line asks for a usage text (which needs no artefacts).
fn wants_help(args: &[String]) -> bool {
    args.iter()
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "help"))
}

/// Whether `command` with `args` runs `bench overhead`.
fn runs_bench_overhead(command: &str, args: &[String]) -> bool {
    command == "bench" && args.first().is_some_and(|a| a == "overhead")
}

/// Runs `command` (`up`, `demo` or `bench`) with `args` in the release harness binary.
/// Returns only on failure.
pub fn run(command: &str, args: &[String]) -> Result<()> {
    let binary = build_binary()?;
    let mut env = Vec::new();
    if !wants_help(args) {
        // Bad arguments fail before the (long) build of the modules; the binary says why.
        let status = Command::new(&binary)
            .arg(CHECK_FLAG)
            .arg(command)
            .args(args)
            .status()
            .with_context(|| format!("running {}", binary.display()))?;
        if !status.success() {
            std::process::exit(status.code().unwrap_or(2));
        }
        setup::ensure(false)?;
        build_all()?;
        // The probe floors: only `bench overhead` loads the bench builds of the modules, and
        // the other commands need not pay two more builds of each module's crate.
        if runs_bench_overhead(command, args) {
            build_bench_modules()?;
        }
        // The rate-limit service is not a default member (it links Debian's librocksdb-dev).
        if args.iter().any(|a| a == "--global-quotas") {
            env.push(build_service(Service::RateLimit)?);
        }
    }
    eprintln!("xtask: continuing in {} {command}", binary.display());
    let err = Command::new(&binary)
        .arg(command)
        .args(args)
        .envs(env)
        .exec();
    Err(err).with_context(|| format!("running {}", binary.display()))
}

#[cfg(test)]
mod tests {
    use super::{runs_bench_overhead, wants_help};

    /// Only `bench overhead` builds the bench modules (the probe floors).
    #[test]
    fn only_the_overhead_bench_builds_the_probe() {
        assert!(runs_bench_overhead(
            "bench",
            &strings(&["overhead", "--quick"])
        ));
        assert!(runs_bench_overhead("bench", &strings(&["overhead"])));
        assert!(!runs_bench_overhead(
            "bench",
            &strings(&["lora", "--quick"])
        ));
        assert!(!runs_bench_overhead(
            "demo",
            &strings(&["--scenario", "overhead"])
        ));
        assert!(!runs_bench_overhead("bench", &[]));
    }

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn help_needs_no_artefacts() {
        assert!(wants_help(&strings(&["help"])));
        assert!(wants_help(&strings(&["--scenario", "hotspot", "--help"])));
        assert!(wants_help(&strings(&["-h"])));
        assert!(!wants_help(&strings(&["soak", "--minutes", "1"])));
        assert!(!wants_help(&[]));
    }
}
