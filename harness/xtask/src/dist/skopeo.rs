//! Reading an OCI image layout back with `skopeo` (Debian's `skopeo` package), a reader that
//! shares none of our code: `skopeo inspect --raw oci:<dir>:<tag>` prints the manifest as
//! stored, `--config --raw` the config blob.
//!
//! Plain `skopeo inspect` (no `--raw`) summarises container images only: for a manifest
//! whose config is not an OCI image config it fails with "unsupported image-specific
//! operation on artifact with type …", which is what a Wasm image is.

use super::oci::{self, Digest};
use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `skopeo` to run, when one is installed.
pub fn program() -> Option<PathBuf> {
    let program = PathBuf::from("skopeo");
    let runs = Command::new(&program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    runs.then_some(program)
}

/// `oci:<dir>:<tag>`, the reference of a tag in a layout (the path must not hold `:`).
pub fn reference(dir: &Path, tag: &str) -> Result<String> {
    let path = dir.to_str().context("the layout's path is not UTF-8")?;
    ensure!(
        !path.contains(':'),
        "{path}: skopeo's oci: references cannot name a path with `:`"
    );
    Ok(format!("oci:{path}:{tag}"))
}

/// Runs `skopeo` with `args`; the output whatever the exit status.
pub fn run(program: &Path, args: &[&str]) -> Result<Output> {
    Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {} {}", program.display(), args.join(" ")))
}

/// Runs `skopeo` with `args`, failing with its stderr on a non-zero exit; its stdout.
pub fn run_ok(program: &Path, args: &[&str]) -> Result<Vec<u8>> {
    let out = run(program, args)?;
    if !out.status.success() {
        bail!(
            "skopeo {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// The manifest of `oci:<dir>:<tag>` as skopeo reads it.
pub fn inspect_raw(program: &Path, dir: &Path, tag: &str) -> Result<Value> {
    let stdout = run_ok(program, &["inspect", "--raw", &reference(dir, tag)?])?;
    serde_json::from_slice(&stdout).context("skopeo inspect --raw: not JSON")
}

/// The config blob of `oci:<dir>:<tag>` as skopeo reads it.
pub fn inspect_config(program: &Path, dir: &Path, tag: &str) -> Result<Value> {
    let stdout = run_ok(
        program,
        &["inspect", "--config", "--raw", &reference(dir, tag)?],
    )?;
    serde_json::from_slice(&stdout).context("skopeo inspect --config --raw: not JSON")
}

/// Checks with skopeo that `oci:<dir>:<tag>` is a Wasm image whose Wasm layer is `module`:
/// the manifest and config media types, two layers, the Wasm layer's digest, and a config
/// of type `envoy_proxy`.
pub fn check(program: &Path, dir: &Path, tag: &str, module: &Digest) -> Result<()> {
    let manifest = inspect_raw(program, dir, tag)?;
    ensure!(
        manifest["mediaType"] == oci::MANIFEST_MEDIA_TYPE,
        "skopeo: manifest mediaType is {}",
        manifest["mediaType"]
    );
    ensure!(
        manifest["config"]["mediaType"] == oci::CONFIG_MEDIA_TYPE,
        "skopeo: config mediaType is {}",
        manifest["config"]["mediaType"]
    );
    let layers = manifest["layers"]
        .as_array()
        .context("skopeo: the manifest has no layers list")?;
    let wasm: Vec<&Value> = layers
        .iter()
        .filter(|l| l["mediaType"] == oci::WASM_LAYER_MEDIA_TYPE)
        .collect();
    ensure!(
        layers.len() == 2 && wasm.len() == 1,
        "skopeo: {} layers, {} of them Wasm; want 2 and 1",
        layers.len(),
        wasm.len()
    );
    ensure!(
        wasm[0]["digest"] == module.as_str(),
        "skopeo: the Wasm layer's digest is {}, the module's sha256 is {module}",
        wasm[0]["digest"]
    );
    let config = inspect_config(program, dir, tag)?;
    ensure!(
        config["type"] == "envoy_proxy",
        "skopeo: the config's type is {}",
        config["type"]
    );
    Ok(())
}
