//! How to build the artefacts: each is a `cargo build` of its crate. Where they land is
//! `infergate-artefacts` (the one definition of every artefact path, shared with the CLI,
//! the launcher and the tests), re-exported here.

use anyhow::{bail, Context, Result};
pub use infergate_artefacts::{target_dir, workspace_root, Artefacts, Service, TEST_ARTEFACT_DIR};
use infergate_artefacts::{NATIVE_FILE, WASM_FILE, WASM_TARGET};
use std::path::PathBuf;
use std::process::Command;

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
            WASM_TARGET,
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
        infergate_artefacts::built(self.target, dir, self.file)
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
        file: NATIVE_FILE,
    }
    .build()
}

/// Builds the Wasm module with its `test-stages` feature into
/// `<target>/wasm32-wasip1/test-artefact/`, beside, never over, the release module. Returns
/// its path.
pub fn build_test_stages_wasm() -> Result<PathBuf> {
    TestBuild {
        package: "infergate-wasm",
        target: Some(WASM_TARGET),
        feature: "test-stages",
        file: WASM_FILE,
    }
    .build()
}

/// Builds `service` (outside the workspace's default members: `cargo build` alone does not)
/// and returns the variable naming it with its path. The rate-limit service (which links
/// Debian's librocksdb-dev) in the dev profile, whose dependencies `cargo test` builds
/// anyway; the external processor in release, as `bench overhead` runs it.
pub fn build_service(service: Service) -> Result<(&'static str, PathBuf)> {
    let release = service == Service::ExtProc;
    let mut args = vec!["build", "-p", service.package()];
    if release {
        args.push("--release");
    }
    cargo(&args, &[])?;
    let path = service.built(if release { "release" } else { "debug" });
    if !path.is_file() {
        bail!("{} is missing after its build", path.display());
    }
    Ok((service.env(), path))
}

/// Builds both services ([`build_service`]) and returns the variables naming them.
pub fn build_services() -> Result<Vec<(&'static str, PathBuf)>> {
    Service::ALL.into_iter().map(build_service).collect()
}
