//! `cargo xtask`: the project's automation, so a new user needs exactly two commands
//! (`cargo xtask demo` and `cargo xtask test`).
//!
//! This crate only orchestrates processes: it installs what is missing ([`setup`]), runs
//! cargo to build the artefacts ([`artefacts`]) and the test tiers ([`test`]), and drives
//! `cargo fuzz` ([`fuzz`]), and packages the release ([`dist`]). It depends on std, anyhow
//! and clap (its command line, [`Xtask`]), and for `dist` on sha2 and serde_json, so it
//! starts without compiling the harness. The commands that run the gateway's stack
//! in-process (`up`, `demo`, `bench`) live in the harness's `infergate-bench` binary, which
//! [`stack`] builds in release and hands the rest of the command line to, as it is.
//!
//! The book's reference of these commands (`docs/src/cli/xtask.md`) is generated from
//! [`Xtask`]; a test here keeps it current.

mod artefacts;
mod dist;
mod fuzz;
mod setup;
mod stack;
mod test;

use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;

/// The project's automation: installs, builds, tests, packages, runs the stack
///
/// Builds and runs everything else. Every command first installs what it needs and is
/// missing.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    arg_required_else_help = true
)]
struct Xtask {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install what is missing: wasm32 targets, Envoy 1.40.0, Python clients, Node test runner
    Setup,
    /// Build the release artefacts: the Wasm module, the native module, the simulator
    Build,
    /// dist/: both modules with sha256, the Wasm OCI image, Envoy version, examples
    #[command(long_about = dist::ABOUT, args_override_self = true)]
    Dist(dist::DistArgs),
    /// Every test tier, real-Envoy end-to-end and a 1-minute soak
    #[command(long_about = test::ABOUT, args_override_self = true)]
    Test(test::TestArgs),
    /// The stack on a simulated pool until Ctrl-C: flavour, tenants, flow control (up --help)
    #[command(long_about = UP_ABOUT, disable_help_flag = true)]
    Up(Passthrough),
    /// /rr vs the gateway: calibration, hotspot, tenants or canary (demo --help)
    #[command(long_about = DEMO_ABOUT, disable_help_flag = true)]
    Demo(Passthrough),
    /// The benchmarks: overhead, affinity, ttft, soak, memory, flow, lora, pd, … (bench help)
    #[command(long_about = BENCH_ABOUT, disable_help_flag = true)]
    Bench(Passthrough),
    /// Each fuzz target (or one) for N seconds on nightly, or only build them
    #[command(long_about = fuzz::ABOUT, args_override_self = true)]
    Fuzz(fuzz::FuzzArgs),
}

const UP_ABOUT: &str = "\
The stack on a simulated pool until Ctrl-C: flavour, tenants, flow control.

Runs `infergate-bench up` (built in release) with the rest of the command line, after
checking it and building the artefacts; `cargo xtask up --help` lists its options.";

const DEMO_ABOUT: &str = "\
/rr vs the gateway: calibration, hotspot, tenants or canary.

Runs `infergate-bench demo` (built in release) with the rest of the command line, after
checking it and building the artefacts; `cargo xtask demo --help` lists its options.";

const BENCH_ABOUT: &str = "\
The benchmarks, in release.

Runs `infergate-bench bench` (built in release) with the rest of the command line, after
checking it and building the artefacts; `cargo xtask bench help` lists the benchmarks,
`cargo xtask bench <name> --help` their options.";

/// The rest of the command line of `up`, `demo` and `bench`, for `infergate-bench`.
#[derive(Debug, Args)]
struct Passthrough {
    /// infergate-bench's options, passed on as they are (`--help` among them)
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "ARGS"
    )]
    args: Vec<String>,
}

fn main() -> ExitCode {
    // Usage errors exit 2 and `--help` 0, each with clap's text; no command prints the
    // usage and exits 2.
    let Xtask { command } = Xtask::parse();
    let result = match command {
        Command::Setup => setup::ensure(true)
            .and_then(|_| setup::ensure_wasm_bindgen_test())
            .map(|_| ()),
        Command::Build => setup::ensure(false).and_then(|_| artefacts::build_all().map(|_| ())),
        Command::Dist(args) => dist::run(args),
        Command::Test(args) => test::run(args),
        Command::Up(p) => stack::run("up", &p.args),
        Command::Demo(p) => stack::run("demo", &p.args),
        Command::Bench(p) => stack::run("bench", &p.args),
        Command::Fuzz(args) => fuzz::run(args),
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
    use super::*;
    use clap::CommandFactory;

    /// `cargo xtask ARGS`'s command, as `main` parses it.
    pub(crate) fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Xtask::try_parse_from(std::iter::once("xtask").chain(args.iter().copied()))
            .map(|x| x.command)
    }

    #[test]
    fn the_command_line_is_consistent() {
        Xtask::command().debug_assert();
    }

    #[test]
    fn help_lists_every_command_on_one_line() {
        let mut cmd = Xtask::command();
        let help = cmd.render_help().to_string();
        let commands: Vec<&str> = help
            .lines()
            .skip_while(|l| *l != "Commands:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(
            commands,
            ["setup", "build", "dist", "test", "up", "demo", "bench", "fuzz", "help"]
        );
        // Each line of every command's help fits a terminal of 100 columns.
        fn walk(cmd: &mut clap::Command) {
            let name = cmd.get_name().to_owned();
            for help in [cmd.render_help(), cmd.render_long_help()] {
                for line in help.to_string().lines() {
                    assert!(line.chars().count() <= 100, "{name}: {line}");
                }
            }
            for sub in cmd.get_subcommands_mut() {
                walk(sub);
            }
        }
        cmd.build();
        walk(&mut cmd);
    }

    /// `up`, `demo` and `bench` hand everything after them to infergate-bench, flags, help
    /// and `--` included.
    #[test]
    fn the_stack_commands_pass_their_arguments_on() {
        for line in [
            &["up", "--flavor", "native", "--pool", "a=m@0,1"][..],
            &["demo", "--help"],
            &["demo", "-h"],
            &["bench", "help"],
            &["bench", "soak", "--minutes", "1", "--help"],
            &["bench", "overhead", "--", "--quick"],
            &["bench"],
        ] {
            let args: Vec<String> = line[1..].iter().map(|s| s.to_string()).collect();
            let passed = match parse(line) {
                Ok(Command::Up(p) | Command::Demo(p) | Command::Bench(p)) => p.args,
                other => panic!("{line:?}: {other:?}"),
            };
            assert_eq!(passed, args, "{line:?}");
        }
    }

    #[test]
    fn no_command_or_an_unknown_one_is_a_usage_error() {
        for line in [&[][..], &["nope"], &["setup", "--x"]] {
            let err = parse(line).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{line:?}");
        }
        for line in [&["help"][..], &["--help"], &["-h"], &["help", "test"]] {
            let err = parse(line).unwrap_err();
            assert_eq!(err.exit_code(), 0, "{line:?}");
        }
    }

    /// The test that checks, and with `INFERGATE_BLESS=1` rewrites, the book's page.
    const REFERENCE_TEST: &str = "cargo test -p xtask cli_reference";

    /// `docs/src/cli/xtask.md` is what this parser says.
    #[test]
    fn the_cli_reference_is_current() {
        let page = infergate_cli::reference::Page {
            title: "`cargo xtask`",
            source: "harness/xtask/src/main.rs",
            test: REFERENCE_TEST,
            notes: &[
                (
                    "cargo xtask up",
                    "Its options: [`cargo xtask up`](infergate-bench.md#cargo-xtask-up).",
                ),
                (
                    "cargo xtask demo",
                    "Its options: [`cargo xtask demo`](infergate-bench.md#cargo-xtask-demo).",
                ),
                (
                    "cargo xtask bench",
                    "The benchmarks and their options: [`cargo xtask \
                     bench`](infergate-bench.md#cargo-xtask-bench).",
                ),
            ],
        };
        let rendered = infergate_cli::reference::markdown(Xtask::command(), &page);
        let path = artefacts::workspace_root().join("docs/src/cli/xtask.md");
        if let Err(e) = infergate_cli::reference::check_or_bless(&path, &rendered, REFERENCE_TEST) {
            panic!("{e}");
        }
    }
}
