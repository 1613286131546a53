//! `infergate-bench`: the commands that run the gateway's stack in-process (the simulator,
//! the load generator, a real Envoy), with the command lines of `cargo xtask up|demo|bench`,
//! which builds this binary in release, builds the artefacts and then becomes it.
//!
//! `infergate-bench --check <command> [options]` only parses the options and exits (0 when
//! they are valid), so xtask can refuse a bad command line before the long module builds.
//!
//! Every command line is a clap derive: [`Cli`] here, the flags next to the options they
//! make (`infergate_harness::bench::*`, `infergate_harness::launch::UpOptions`).

mod bench;
mod demo;
mod up;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use infergate_harness::bench::cli::{lenient, DemoFlags, DEMO_SCENARIOS};
use infergate_harness::launch::UpOptions;
use std::process::ExitCode;

/// What cargo xtask runs for `up`, `demo` and `bench`.
#[derive(Debug, Parser)]
#[command(name = "infergate-bench", bin_name = "cargo xtask")]
struct Cli {
    /// Only parse the options and exit (0 when they are valid): xtask's check before its
    /// long build.
    #[arg(long, hide = true)]
    check: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The stack on a simulated pool until Ctrl-C
    ///
    /// The simulator and Envoy, for a person to poke at: prints `picker: URL` and
    /// `baseline: URL` (Envoy's round-robin /rr), with --gateways N `gateway K: URL` each,
    /// and with --tenants the billing log's path; stays up until SIGINT/SIGTERM and then
    /// stops cleanly.
    ///
    /// The pool and route flags split a model across pools: --pool names pools, --split
    /// weighs a model's traffic across them (per request, or with --sticky-split one pool
    /// per conversation), --canary-header sends tagged requests to one, --routes reads
    /// HTTPRoutes; a POOL is a --pool name or a pool index. --tenants, --billing-log,
    /// --epp-config, --objectives and --rewrites need a gateway flavour (not plain).
    /// --epp-config takes e.g. testdata/epp/epp-config-configmap.yaml (scheduling and flow
    /// control).
    #[command(verbatim_doc_comment)]
    Up(UpOptions),
    /// Round robin (/rr) vs the gateway picker on a chat workload, one of four scenarios
    #[command(after_long_help = DEMO_SCENARIOS)]
    Demo(DemoFlags),
    /// The benchmarks, in release (`bench help` lists them, `bench <name> --help` their
    /// flags).
    Bench {
        #[command(subcommand)]
        which: bench::Bench,
    },
}

/// Whether a command runs or only checks its options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Parse the options, report the first bad one, do nothing else.
    Check,
    /// Do the work.
    Run,
}

/// The command line's parser: [`Cli`], every (sub)command [`lenient`].
fn command() -> clap::Command {
    lenient(Cli::command())
}

fn main() -> ExitCode {
    let cli = match command()
        .try_get_matches()
        .and_then(|mut m| Cli::from_arg_matches_mut(&mut m))
    {
        Ok(cli) => cli,
        // Usage errors exit 2, `--help` 0, each with clap's text.
        Err(e) => e.exit(),
    };
    let mode = if cli.check { Mode::Check } else { Mode::Run };
    let result = match cli.command {
        Command::Up(opts) => up::run(opts, mode),
        Command::Demo(flags) => demo::run(&flags, mode),
        Command::Bench { which } => bench::run(which, mode),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("infergate-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let argv = std::iter::once("infergate-bench").chain(args.iter().copied());
        command()
            .try_get_matches_from(argv)
            .and_then(|mut m| Cli::from_arg_matches_mut(&mut m))
    }

    #[test]
    fn the_command_line_is_consistent() {
        command().debug_assert();
    }

    /// The command lines `.ci/run`, the docs and xtask use.
    #[test]
    fn the_documented_command_lines_parse() {
        for line in [
            &["--check", "demo", "--scenario", "canary", "--quick"][..],
            &["bench", "lora", "--quick"],
            &["bench", "pd", "--quick"],
            &[
                "bench",
                "overhead",
                "--quick",
                "--arms",
                "plain,wasm-floor,wasm,native-floor,native,extproc-null,extproc-parse",
            ],
            &[
                "bench",
                "affinity",
                "--workers",
                "1,2,4,8",
                "--flavor",
                "wasm,native",
                "--quick",
            ],
            &["bench", "soak", "--minutes", "1"],
            &[
                "bench",
                "replicas",
                "--gateways",
                "1,2",
                "--membership",
                "static",
            ],
            &[
                "up",
                "--flavor",
                "native",
                "--pool",
                "bf16=sim-model@0,1,2",
                "--pool",
                "fp8=sim-model@3",
                "--split",
                "sim-model=bf16:90,fp8:10",
                "--sticky-split",
                "--canary-header",
                "x-canary=fp8:fp8",
            ],
        ] {
            if let Err(e) = parse(line) {
                panic!("{line:?}: {e}");
            }
        }
        let cli = parse(&["--check", "up", "--pool", "a=m@0,1", "--pool", "b=m@2"]).unwrap();
        assert!(cli.check);
        match cli.command {
            Command::Up(o) => assert_eq!(o.pools.len(), 2, "repeatable, commas kept"),
            other => panic!("{other:?}"),
        }
        for bad in [
            &["bench", "overhead", "--bogus"][..],
            &["bench", "nope"],
            &["demo", "--scenario", "x"],
            &["up", "--gateways", "0"],
            &[],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    /// Every command's `--help` fits a terminal of 100 columns (clap does not wrap here).
    #[test]
    fn help_fits_100_columns() {
        fn walk(cmd: &mut clap::Command, path: &str) {
            let path = format!("{path} {}", cmd.get_name());
            for help in [cmd.render_help(), cmd.render_long_help()] {
                for line in help.to_string().lines() {
                    assert!(line.chars().count() <= 100, "{path}: {line}");
                }
            }
            for sub in cmd.get_subcommands_mut() {
                walk(sub, &path);
            }
        }
        let mut cmd = command();
        cmd.build();
        walk(&mut cmd, "");
    }

    /// The test that checks, and with `INFERGATE_BLESS=1` rewrites, the book's page.
    const REFERENCE_TEST: &str =
        "cargo test -p infergate-harness --bin infergate-bench cli_reference";

    /// `docs/src/cli/infergate-bench.md` is what this parser says.
    #[test]
    fn the_cli_reference_is_current() {
        let page = infergate_cli::reference::Page {
            title: "`cargo xtask up`, `demo` and `bench` (`infergate-bench`)",
            source: "harness/src/bin/infergate-bench/",
            test: REFERENCE_TEST,
            notes: &[],
        };
        let rendered = infergate_cli::reference::markdown(command(), &page);
        let path = infergate_artefacts::workspace_root().join("docs/src/cli/infergate-bench.md");
        if let Err(e) = infergate_cli::reference::check_or_bless(&path, &rendered, REFERENCE_TEST) {
            panic!("{e}");
        }
    }

    /// `--help` of every command lists its flags; `bench help` lists the benches.
    #[test]
    fn help_lists_every_command_and_flag() {
        let mut cmd = command();
        cmd.build();
        let bench = cmd.find_subcommand_mut("bench").unwrap();
        let list = bench.render_help().to_string();
        for name in [
            "overhead", "affinity", "ttft", "soak", "memory", "flow", "lora", "pd", "replicas",
            "pressure", "clusters",
        ] {
            assert!(list.contains(name), "{name} missing:\n{list}");
        }
        let overhead = bench.find_subcommand_mut("overhead").unwrap();
        let help = overhead.render_long_help().to_string();
        for flag in [
            "--connections",
            "--arms",
            "--profile [<DIR>]",
            "--quick",
            "--body-kb",
        ] {
            assert!(help.contains(flag), "{flag} missing:\n{help}");
        }
        let up = cmd.find_subcommand_mut("up").unwrap();
        let help = up.render_long_help().to_string();
        for flag in [
            "--flavor",
            "--replicas",
            "--pool <NAME=MODEL[@I,J]>",
            "--split <MODEL=POOL:W,POOL:W>",
            "--sticky-split",
            "--canary-header <NAME=VALUE:POOL>",
            "--rewrites",
            "--gateways <N>",
            "--global-quotas",
            "--static-membership",
        ] {
            assert!(help.contains(flag), "{flag} missing:\n{help}");
        }
        let demo = cmd.find_subcommand_mut("demo").unwrap();
        let help = demo.render_long_help().to_string();
        for word in [
            "calibration",
            "hotspot",
            "tenants",
            "canary",
            "--picker-config",
        ] {
            assert!(help.contains(word), "{word} missing:\n{help}");
        }
    }
}
