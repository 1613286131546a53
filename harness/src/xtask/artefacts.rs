//! Where the built artefacts live and how to build them.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (the directory holding the root `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The cargo target directory in use (`CARGO_TARGET_DIR` or `<root>/target`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Paths of the release artefacts the end-to-end tests and the demo load.
#[derive(Clone, Debug)]
pub struct Artefacts {
    /// The proxy-wasm module (`wasm32-wasip1`, release).
    pub wasm_module: PathBuf,
    /// The Envoy dynamic module (`libinfergate_envoy.so`, release).
    pub native_module: PathBuf,
    /// The engine simulator binary.
    pub simulator: PathBuf,
}

impl Artefacts {
    /// Where `build_all` puts the artefacts.
    pub fn locate() -> Self {
        let target = target_dir();
        Artefacts {
            wasm_module: target.join("wasm32-wasip1/release/infergate_wasm.wasm"),
            native_module: target.join("release/libinfergate_envoy.so"),
            simulator: target.join("release/infergate-sim"),
        }
    }

    /// Environment variables through which tests and tools find the artefacts.
    pub fn env(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("INFERGATE_WASM", self.wasm_module.clone()),
            ("INFERGATE_NATIVE", self.native_module.clone()),
            ("INFERGATE_SIM", self.simulator.clone()),
        ]
    }
}

/// Runs `cargo` with `args` in the workspace root, failing on a non-zero exit.
pub fn cargo(args: &[&str], envs: &[(&str, PathBuf)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(cargo)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_os_str())))
        .current_dir(workspace_root())
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed with {status}", args.join(" "));
    }
    Ok(())
}

/// Builds the release artefacts and returns where they are.
pub fn build_all() -> Result<Artefacts> {
    cargo(
        &[
            "build",
            "--release",
            "-p",
            "infergate-wasm",
            "--target",
            "wasm32-wasip1",
        ],
        &[],
    )?;
    cargo(&["build", "--release", "-p", "infergate-envoy"], &[])?;
    cargo(
        &[
            "build",
            "--release",
            "-p",
            "infergate-harness",
            "--bin",
            "infergate-sim",
        ],
        &[],
    )?;
    let artefacts = Artefacts::locate();
    for (name, path) in artefacts.env() {
        if !path.exists() {
            bail!(
                "{name}: expected artefact {} is missing after the build",
                path.display()
            );
        }
    }
    Ok(artefacts)
}

/// Builds the native module with the `panic-injection` test feature and copies it aside
/// (`<target>/test-artefacts/`), so the end-to-end suite can prove a panic fails one request
/// while the demo and benchmarks keep loading the production module. Returns its path.
pub fn build_panic_injection_module() -> Result<PathBuf> {
    cargo(
        &[
            "build",
            "--release",
            "-p",
            "infergate-envoy",
            "--features",
            "panic-injection",
        ],
        &[],
    )?;
    let built = target_dir().join("release/libinfergate_envoy.so");
    let dir = target_dir().join("test-artefacts");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let copy = dir.join("libinfergate_envoy_panic_injection.so");
    std::fs::copy(&built, &copy)
        .with_context(|| format!("copying {} to {}", built.display(), copy.display()))?;
    Ok(copy)
}
