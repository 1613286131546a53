//! Builds the `testmod` fixture (once per test process) for the integration tests.
#![allow(dead_code)] // each integration-test crate uses part of these helpers

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The cargo target directory this test binary lives in (`<target>/debug/deps/<exe>`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// Builds `testmod/` for wasm32-wasip1 (release) into its own target dir; returns the .wasm.
pub fn testmod() -> &'static Path {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("testmod/Cargo.toml");
        let target = target_dir().join("wasm-host-testmod");
        let status = Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "--release",
                "--target",
                "wasm32-wasip1",
                "--manifest-path",
            ])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .status()
            .expect("running cargo to build testmod");
        assert!(status.success(), "building testmod failed");
        target.join("wasm32-wasip1/release/wasm_host_testmod.wasm")
    })
}

/// The project's proxy-wasm module (`wasm/`), built for wasm32-wasip1 (release, with the
/// bench build's `probe` role, which some tests load) into its own target dir, or taken from `$INFERGATE_WASM` when set (the prebuilt file `cargo xtask test`
/// names for every tier).
pub fn product_module() -> &'static Path {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        if let Some(path) = std::env::var_os(infergate_artefacts::WASM_ENV) {
            return PathBuf::from(path);
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
        let target = target_dir().join("wasm-host-product");
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--release", "-p", "infergate-wasm"])
            .args(["--features", "probe"])
            .args(["--target", "wasm32-wasip1", "--manifest-path"])
            .arg(&workspace)
            .arg("--target-dir")
            .arg(&target)
            .status()
            .expect("running cargo to build the wasm module");
        assert!(status.success(), "building infergate-wasm failed");
        target
            .join(infergate_artefacts::WASM_TARGET)
            .join("release")
            .join(infergate_artefacts::WASM_FILE)
    })
}

/// A file of the project's `testdata/`.
pub fn testdata(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub mod gateway;

/// A picker configuration that carries `scraper` (a scraper configuration's JSON text):
/// `testdata/filters/picker.json` with it as its `scraper`. A VM configured with it is a
/// candidate for the process-wide work, and the first to tick takes it.
pub fn picker_with_scraper(scraper: &str) -> String {
    let mut picker: serde_json::Value =
        serde_json::from_str(&testdata("filters/picker.json")).expect("picker.json");
    let scraper: serde_json::Value = serde_json::from_str(scraper).expect("a scraper config");
    picker["scraper"] = scraper;
    picker.to_string()
}
