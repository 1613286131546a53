//! Where the built artefacts live and how to build them: each is a `cargo build` of its
//! crate. The harness finds the same paths through its own `artefacts` module, or through
//! the variables of [`Artefacts::env`].

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (the directory holding the root `Cargo.toml`), two levels above this
/// crate (`harness/xtask/`).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .to_path_buf()
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
            "infergate-sim",
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

/// The cargo profile of test-only builds (`[profile.test-artefact]` in the root
/// `Cargo.toml`: release settings, its own output directory `<target>/test-artefact/`).
pub const TEST_PROFILE: &str = "test-artefact";

/// Builds the native module with the `panic-injection` test feature under the
/// [`TEST_PROFILE`] profile, so it lands in `<target>/test-artefact/` and never replaces the
/// production module in `<target>/release/` (which the demo, the benchmarks and a user's
/// packaging load). Returns its path.
pub fn build_panic_injection_module() -> Result<PathBuf> {
    cargo(
        &[
            "build",
            "--profile",
            TEST_PROFILE,
            "-p",
            "infergate-envoy",
            "--features",
            "panic-injection",
        ],
        &[],
    )?;
    let built = target_dir()
        .join(TEST_PROFILE)
        .join("libinfergate_envoy.so");
    if !built.exists() {
        bail!(
            "the panic-injection module is missing after the build: {}",
            built.display()
        );
    }
    Ok(built)
}

/// Builds the Wasm module with its `test-stages` feature under the [`TEST_PROFILE`] profile
/// (`<target>/wasm32-wasip1/test-artefact/`, beside, never over, the release module).
/// Returns its path.
pub fn build_test_stages_wasm() -> Result<PathBuf> {
    cargo(
        &[
            "build",
            "--profile",
            TEST_PROFILE,
            "-p",
            "infergate-wasm",
            "--target",
            "wasm32-wasip1",
            "--features",
            "test-stages",
        ],
        &[],
    )?;
    let built = target_dir()
        .join("wasm32-wasip1")
        .join(TEST_PROFILE)
        .join("infergate_wasm.wasm");
    if !built.exists() {
        bail!(
            "the test-stages Wasm module is missing after the build: {}",
            built.display()
        );
    }
    Ok(built)
}
