//! Where the workspace and the built artefacts are: the release paths `cargo xtask build`
//! (the `xtask` crate's `artefacts` module) writes to, which the launcher loads unless the
//! `INFERGATE_WASM` / `INFERGATE_NATIVE` / `INFERGATE_SIM` variables name others.

use std::path::{Path, PathBuf};

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
    /// Where `cargo xtask build` puts the artefacts.
    pub fn locate() -> Self {
        let target = target_dir();
        Artefacts {
            wasm_module: target.join("wasm32-wasip1/release/infergate_wasm.wasm"),
            native_module: target.join("release/libinfergate_envoy.so"),
            simulator: target.join("release/infergate-sim"),
        }
    }
}
