//! `cargo xtask test`: every test tier, in the order a failure is cheapest to find.
//!
//! 1. the release artefacts (Wasm module, native module with the `panic-injection` test
//!    feature, simulator), which the end-to-end tests load into a real Envoy, and the
//!    services outside the default members (rate-limit service, external processor);
//! 2. `cargo test --workspace`: unit, property, fake-host, wasmtime-host and real-Envoy tests,
//!    the end-to-end stacks at `--workers N` Envoy workers (2 unless told), except the suites
//!    whose properties rest on state kept once per Envoy process ([`STATE_SUITES`]), which
//!    run next, once with Envoy at each of [`STATE_WORKERS`] workers;
//! 3. the scheduling core's tests compiled to `wasm32-wasip1`, run by our wasmtime runner, so
//!    hashing and parsing are proven identical on the Wasm target;
//! 4. the same tests under `wasm-bindgen-test` on `wasm32-unknown-unknown`, with Node as the
//!    host through `wasm-bindgen-test-runner`, checked to be every test the native build has;
//! 5. the Python tests: the simulator under the official `openai` client and
//!    `prometheus_client`'s parser;
//! 6. the soak's short form: one minute per flavour of the multi-turn workload with replica
//!    kills, client aborts and hostile requests, failing on any verdict (`bench soak`).

use crate::artefacts::{
    build_all, build_panic_injection_module, build_services, build_test_stages_wasm, cargo,
    target_dir, workspace_root,
};
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The target of the `wasm-bindgen-test` tier.
const WASM_BINDGEN_TARGET: &str = "wasm32-unknown-unknown";

/// The variable the end-to-end suite reads its Envoy worker count from (its `support`
/// module reads the same name).
const E2E_WORKERS_ENV: &str = "INFERGATE_E2E_WORKERS";

/// Envoy workers of the end-to-end stacks unless `--workers` says otherwise: more than one,
/// so state that a worker keeps to itself shows, and no more than this 2-core machine runs.
const DEFAULT_E2E_WORKERS: u32 = 2;

/// The end-to-end suites whose properties rest on state kept once per Envoy process: flow
/// control's queues; each pool's own picker state behind a split; adapter packing; the
/// prefix state that decides disaggregation; each pool's membership; several gateways over
/// one pool; one tenant's tokens shared by two gateways; the precise prefix index fed by the
/// engines' KV events. Each must hold at one worker and at several.
const STATE_SUITES: &[&str] = &[
    "gateway::flow::",
    "gateway::pools::",
    "gateway::lora::",
    "gateway::disagg::",
    "gateway::membership::",
    "gateway::replicas::",
    "gateway::global_quotas::",
    "gateway::precise::",
];

/// The Envoy worker counts the [`STATE_SUITES`] run at.
const STATE_WORKERS: [u32; 2] = [1, 4];

/// `cargo xtask test --help`'s text after its first line.
pub const ABOUT: &str = "\
Every test tier, real-Envoy end-to-end and a 1-minute soak.

In the order a failure is cheapest to find: the release artefacts; `cargo test --workspace`
(unit, property, fake-host, wasmtime-host and real-Envoy end-to-end tests), then the suites
whose properties rest on state kept once per Envoy process at 1 and at 4 Envoy workers; the
scheduling core's tests on wasm32-wasip1 and under wasm-bindgen-test; the Python tests; the
soak's short form (one minute per flavour, `bench soak --minutes 1`).";

/// What `cargo xtask test` was asked for.
#[derive(Debug, PartialEq, clap::Args)]
pub struct TestArgs {
    /// Leave out the Python tier (machines without the Python clients)
    #[arg(long)]
    skip_python: bool,
    /// Envoy workers of every end-to-end stack that does not pin its own (the state suites
    /// run at 1 and at 4)
    #[arg(
        verbatim_doc_comment,
        next_line_help = true,
        long = "workers",
        alias = "concurrency",
        value_name = "N",
        default_value_t = DEFAULT_E2E_WORKERS,
        value_parser = workers
    )]
    e2e_workers: u32,
}

/// `--workers N`: a worker count Envoy accepts.
fn workers(s: &str) -> std::result::Result<u32, String> {
    match s.parse::<u32>() {
        Ok(0) => Err("Envoy needs at least one worker".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("`{s}`: {e}")),
    }
}

/// Runs every tier; `--skip-python` for machines without the Python deps and `--workers N`
/// for the end-to-end suite's Envoy worker count.
pub fn run(args: TestArgs) -> Result<()> {
    let TestArgs {
        skip_python,
        e2e_workers,
    } = args;
    crate::setup::ensure(!skip_python)?;
    let wasm_bindgen_runner = crate::setup::ensure_wasm_bindgen_test()?;
    let mut artefacts = build_all()?;
    // The end-to-end suite loads the test builds: the native one can inject a panic, and
    // both accept the host-capability test stages.
    artefacts.native_module = build_panic_injection_module()?;
    artefacts.wasm_module = build_test_stages_wasm()?;
    let mut env = artefacts.env();
    // The services outside the default members: the global-quota and `bench overhead`
    // suites run them (`cargo test --workspace` would build the rate-limit service too, but
    // a suite must not depend on which binaries cargo happened to build first).
    env.extend(build_services()?);
    let with_workers = |workers: u32| {
        let mut test_env = env.clone();
        test_env.push((E2E_WORKERS_ENV, PathBuf::from(workers.to_string())));
        test_env
    };
    eprintln!(
        "xtask: end-to-end stacks at {e2e_workers} Envoy worker(s), the state suites at {STATE_WORKERS:?}"
    );
    let mut everything = vec!["test", "--workspace", "--no-fail-fast", "--"];
    for suite in STATE_SUITES {
        everything.extend(["--skip", suite]);
    }
    cargo(&everything, &with_workers(e2e_workers))?;
    // The same workspace selection, so the test build is the one just made.
    let mut state = vec![
        "test",
        "--workspace",
        "--no-fail-fast",
        "--test",
        "e2e",
        "--",
    ];
    state.extend(STATE_SUITES);
    for workers in STATE_WORKERS {
        eprintln!("xtask: the state suites with Envoy at {workers} worker(s)");
        cargo(&state, &with_workers(workers))?;
    }

    cargo(
        &["build", "-p", "infergate-wasm-host", "--bin", "wasi-run"],
        &[],
    )?;
    let runner = target_dir().join("debug/wasi-run");
    cargo(
        &["test", "-p", "scheduler-core", "--target", "wasm32-wasip1"],
        &[("CARGO_TARGET_WASM32_WASIP1_RUNNER", runner)],
    )?;
    wasm_bindgen_tier(wasm_bindgen_runner)?;

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
    soak_short_form()?;
    eprintln!("xtask: all tests passed");
    Ok(())
}

/// Runs the core's tests under `wasm-bindgen-test`, then checks that the tier knows every
/// test the native build has. A test module that lacks the `wasm_bindgen_test as test`
/// import still compiles for this target, but its tests are never registered with the
/// runner: they would silently not run.
fn wasm_bindgen_tier(runner: PathBuf) -> Result<()> {
    let env = [("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER", runner)];
    cargo(
        &[
            "test",
            "-p",
            "scheduler-core",
            "--target",
            WASM_BINDGEN_TARGET,
        ],
        &env,
    )?;
    let native = core_test_names(None, &[])?;
    let wasm = core_test_names(Some(WASM_BINDGEN_TARGET), &env)?;
    if native != wasm {
        let missing: Vec<&str> = native.difference(&wasm).map(String::as_str).collect();
        let extra: Vec<&str> = wasm.difference(&native).map(String::as_str).collect();
        bail!(
            "the wasm-bindgen-test tier knows {} of the core's {} tests; missing: [{}], \
             not native: [{}] (a test module without \
             `use wasm_bindgen_test::wasm_bindgen_test as test;`?)",
            wasm.len(),
            native.len(),
            missing.join(", "),
            extra.join(", ")
        );
    }
    eprintln!(
        "xtask: wasm-bindgen-test knows all {} of the core's unit tests",
        wasm.len()
    );
    Ok(())
}

/// The names of the core's unit tests (ignored ones included) as its test binary lists them,
/// built for `target` (the host when `None`).
fn core_test_names(target: Option<&str>, envs: &[(&str, PathBuf)]) -> Result<BTreeSet<String>> {
    let mut args = vec!["test", "-p", "scheduler-core", "--lib"];
    if let Some(target) = target {
        args.extend(["--target", target]);
    }
    args.extend(["--", "--list", "--format", "terse"]);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let out = Command::new(cargo)
        .args(&args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_os_str())))
        .current_dir(workspace_root())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo")?;
    if !out.status.success() {
        bail!("cargo {} failed with {}", args.join(" "), out.status);
    }
    let names: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect();
    if names.is_empty() {
        bail!("cargo {} listed no tests", args.join(" "));
    }
    Ok(names)
}

/// Minutes the soak runs per flavour here; `cargo xtask bench soak` runs 10 by default.
const SOAK_MINUTES: &str = "1";

/// `bench soak --minutes 1` in the release harness binary (the soak's clients and simulated
/// replicas share the machine with Envoy, so a debug build would measure itself), over the
/// release artefacts already built (the production native module, not the panic-injection
/// one); its verdicts fail the tier.
fn soak_short_form() -> Result<()> {
    let binary = crate::stack::build_binary()?;
    eprintln!("xtask: bench soak --minutes {SOAK_MINUTES}");
    let status = Command::new(&binary)
        .args(["bench", "soak", "--minutes", SOAK_MINUTES])
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("running {}", binary.display()))?;
    if !status.success() {
        bail!("the soak's short form failed with {status}");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> std::result::Result<TestArgs, clap::Error> {
        match crate::tests::parse(&[&["test"][..], args].concat()) {
            Ok(crate::Command::Test(args)) => Ok(args),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn arguments_parse() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.skip_python, a.e2e_workers), (false, DEFAULT_E2E_WORKERS));
        let a = parse(&["--workers", "4", "--skip-python"]).unwrap();
        assert_eq!((a.skip_python, a.e2e_workers), (true, 4));
        assert_eq!(parse(&["--concurrency", "1"]).unwrap().e2e_workers, 1);
        // A flag given twice: the last value, as before.
        let a = parse(&[
            "--workers",
            "4",
            "--workers",
            "3",
            "--skip-python",
            "--skip-python",
        ]);
        assert_eq!(a.unwrap().e2e_workers, 3);
        for bad in [
            &["--workers"][..],
            &["--workers", "0"],
            &["--workers", "x"],
            &["-v"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
