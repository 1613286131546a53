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

/// Where the test-only builds of the modules are kept: `<target>/test-artefact/` (and
/// `<target>/wasm32-wasip1/test-artefact/`), beside, never over, the release modules.
pub const TEST_ARTEFACT_DIR: &str = "test-artefact";

/// One module built with a test-only feature.
struct TestBuild<'a> {
    package: &'a str,
    /// `--target`, if not the host.
    target: Option<&'a str>,
    feature: &'a str,
    /// The file cargo writes under `<target>[/<triple>]/release/`.
    file: &'a str,
}

impl TestBuild<'_> {
    /// `<target>[/<triple>]/<dir>/<file>`.
    fn path_in(&self, dir: &str) -> PathBuf {
        let mut path = target_dir();
        if let Some(triple) = self.target {
            path.push(triple);
        }
        path.join(dir).join(self.file)
    }

    fn cargo_build(&self, with_feature: bool) -> Result<()> {
        let mut args = vec!["build", "--release", "-p", self.package];
        if let Some(triple) = self.target {
            args.extend(["--target", triple]);
        }
        if with_feature {
            args.extend(["--features", self.feature]);
        }
        cargo(&args, &[])
    }

    /// Builds the module with its test feature under the release profile (only the module's
    /// own crate is compiled again: its dependencies are the release build's), copies it to
    /// [`TEST_ARTEFACT_DIR`], then builds the production module again, which cargo still has
    /// (it only puts it back in place), so `release/` keeps handing out the product. Checks
    /// that the two files differ. Returns the test build's path.
    fn build(&self) -> Result<PathBuf> {
        self.cargo_build(true)?;
        let released = self.path_in("release");
        let test = self.path_in(TEST_ARTEFACT_DIR);
        if let Some(dir) = test.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // A copy, not a link: cargo's `release/` file is a hard link it replaces.
        std::fs::copy(&released, &test)
            .with_context(|| format!("copying {} to {}", released.display(), test.display()))?;
        self.cargo_build(false)?;
        let product =
            std::fs::read(&released).with_context(|| format!("reading {}", released.display()))?;
        let tested = std::fs::read(&test).with_context(|| format!("reading {}", test.display()))?;
        if product == tested {
            bail!(
                "{} with `{}` is byte for byte the production module: the test feature did \
                 not build, or the product was not put back",
                self.package,
                self.feature
            );
        }
        Ok(test)
    }
}

/// Builds the native module with the `panic-injection` test feature into
/// [`TEST_ARTEFACT_DIR`]; the production module in `<target>/release/` (which the demo, the
/// benchmarks and a user's packaging load) stays the product. Returns its path.
pub fn build_panic_injection_module() -> Result<PathBuf> {
    TestBuild {
        package: "infergate-envoy",
        target: None,
        feature: "panic-injection",
        file: "libinfergate_envoy.so",
    }
    .build()
}

/// Builds the Wasm module with its `test-stages` feature into
/// `<target>/wasm32-wasip1/test-artefact/`, beside, never over, the release module. Returns
/// its path.
pub fn build_test_stages_wasm() -> Result<PathBuf> {
    TestBuild {
        package: "infergate-wasm",
        target: Some("wasm32-wasip1"),
        feature: "test-stages",
        file: "infergate_wasm.wasm",
    }
    .build()
}
