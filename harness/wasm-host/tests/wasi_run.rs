//! `wasi-run` as a cargo runner: the `testbin/` fixture's tests and command, built for
//! wasm32-wasip1 and run through it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // helpers outside #[test] fns

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const RUNNER: &str = env!("CARGO_BIN_EXE_wasi-run");

fn manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testbin/Cargo.toml")
}

fn target() -> PathBuf {
    common::target_dir().join("wasi-run-testbin")
}

fn cargo(args: &[&str], fail: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(args)
        .args(["--quiet", "--target", "wasm32-wasip1", "--manifest-path"])
        .arg(manifest())
        .arg("--target-dir")
        .arg(target())
        .env("CARGO_TARGET_WASM32_WASIP1_RUNNER", RUNNER);
    if fail {
        cmd.env("WASI_RUN_TEST_FAIL", "1");
    }
    cmd.output().expect("running cargo")
}

#[test]
fn cargo_test_on_wasm32_runs_through_the_runner() {
    let out = cargo(&["test", "--lib"], false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("3 passed"), "{stdout}");

    let out = cargo(&["test", "--lib"], true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // A failing assertion is a panic, an abort on wasm32-wasip1, mapped to 134 like SIGABRT.
    assert!(stderr.contains("exit status: 134"), "{stderr}");
}

#[test]
fn exit_code_args_and_stdout_pass_through() {
    let out = cargo(&["build", "--bin", "exit-with"], false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wasm = target().join("wasm32-wasip1/debug/exit-with.wasm");
    let out = Command::new(RUNNER)
        .arg(&wasm)
        .args(["7", "hello", "wasm"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "args: hello wasm\n");
    let out = Command::new(RUNNER).arg(&wasm).arg("0").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn an_unloadable_module_exits_101() {
    let out = Command::new(RUNNER)
        .arg("/nonexistent.wasm")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(101));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.wasm"));
    let out = Command::new(RUNNER).output().unwrap();
    assert_eq!(out.status.code(), Some(101));
}
