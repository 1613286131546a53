//! How to build the artefacts: each is a `cargo build` of its crate. Where they land is
//! `infergate-artefacts` (the one definition of every artefact path, shared with the CLI,
//! the launcher and the tests), re-exported here.
//!
//! Beside the release modules (what `dist` ships) each module has two builds with extra
//! cargo features, each in a directory of its own: the test build ([`TEST_ARTEFACT_DIR`],
//! made by `cargo xtask test`) and the bench build ([`BENCH_ARTEFACT_DIR`], with the
//! `probe` filter that `bench overhead` runs as each host's floor, made before that bench
//! only). The release modules never have either's features.

use anyhow::{bail, Context, Result};
pub use infergate_artefacts::{
    target_dir, workspace_root, Artefacts, Service, BENCH_ARTEFACT_DIR, TEST_ARTEFACT_DIR,
};
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

/// Builds the release artefacts and returns where they are (the modules without the
/// `probe`: [`build_bench_modules`] makes the bench builds, for the one command that
/// loads them).
pub fn build_all() -> Result<Artefacts> {
    build_release()
}

/// Builds the release artefacts (no extra feature) and returns where they are.
fn build_release() -> Result<Artefacts> {
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

/// One module built with extra features (a test or a bench build), kept in a directory of
/// its own.
struct FeatureBuild<'a> {
    package: &'a str,
    /// `--target`, if not the host.
    target: Option<&'a str>,
    /// `--features`, comma-separated.
    feature: &'a str,
    /// The file cargo writes under `<target>[/<triple>]/release/`.
    file: &'a str,
    /// Where the build is kept: [`TEST_ARTEFACT_DIR`] or [`BENCH_ARTEFACT_DIR`].
    dir: &'a str,
}

impl FeatureBuild<'_> {
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

    /// Builds the module with its features under the release profile (only the module's
    /// own crate is compiled again: its dependencies are the release build's), copies it to
    /// its directory, then builds the production module again (its crate once more: cargo
    /// keeps one file per module), so `release/` keeps handing out the product. Checks that
    /// the two files differ. Returns the feature build's path.
    fn build(&self) -> Result<PathBuf> {
        self.cargo_build(true)?;
        let released = self.path_in("release");
        let kept = self.path_in(self.dir);
        if let Some(dir) = kept.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        // A copy, not a link: cargo's `release/` file is a hard link it replaces.
        std::fs::copy(&released, &kept)
            .with_context(|| format!("copying {} to {}", released.display(), kept.display()))?;
        self.cargo_build(false)?;
        let product =
            std::fs::read(&released).with_context(|| format!("reading {}", released.display()))?;
        let featured =
            std::fs::read(&kept).with_context(|| format!("reading {}", kept.display()))?;
        if product == featured {
            bail!(
                "{} with `{}` is byte for byte the production module: the feature did not \
                 build, or the product was not put back",
                self.package,
                self.feature
            );
        }
        Ok(kept)
    }
}

/// Builds the native module with the `panic-injection` test feature into
/// [`TEST_ARTEFACT_DIR`]; the production module in `<target>/release/` (which the demo, the
/// benchmarks and a user's packaging load) stays the product. Returns its path.
pub fn build_panic_injection_module() -> Result<PathBuf> {
    FeatureBuild {
        package: "infergate-envoy",
        target: None,
        feature: "panic-injection",
        file: NATIVE_FILE,
        dir: TEST_ARTEFACT_DIR,
    }
    .build()
}

/// Builds the Wasm module with its `test-stages` feature, and `probe` (the product-module
/// tests of `infergate-wasm-host` drive the `probe` role through it), into
/// `<target>/wasm32-wasip1/test-artefact/`, beside, never over, the release module. Returns
/// its path.
pub fn build_test_stages_wasm() -> Result<PathBuf> {
    FeatureBuild {
        package: "infergate-wasm",
        target: Some(WASM_TARGET),
        feature: "test-stages,probe",
        file: WASM_FILE,
        dir: TEST_ARTEFACT_DIR,
    }
    .build()
}

/// Builds both modules with their `probe` feature into [`BENCH_ARTEFACT_DIR`] (where
/// [`Artefacts::wasm_probe_module`] and [`Artefacts::native_probe_module`] find them), the
/// floors of `bench overhead`; the release modules stay without the probe.
pub fn build_bench_modules() -> Result<()> {
    for (package, target, file) in [
        ("infergate-wasm", Some(WASM_TARGET), WASM_FILE),
        ("infergate-envoy", None, NATIVE_FILE),
    ] {
        FeatureBuild {
            package,
            target,
            feature: "probe",
            file,
            dir: BENCH_ARTEFACT_DIR,
        }
        .build()?;
    }
    Ok(())
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
