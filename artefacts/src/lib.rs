//! Where the workspace and its built artefacts are: the one definition of every artefact's
//! path, which `cargo xtask` builds to and the CLI, the launcher and the tests load from.
//!
//! - [`Artefacts`]: the release modules and the simulator (`cargo xtask build`), each
//!   overridden by its variable ([`WASM_ENV`], [`NATIVE_ENV`], [`SIM_ENV`]);
//! - [`TEST_ARTEFACT_DIR`]: the test-only builds of the modules (`cargo xtask test`),
//!   beside, never over, the release ones ([`test_artefact`]);
//! - [`BENCH_ARTEFACT_DIR`]: the bench builds of the modules, with the `probe` filter that
//!   `bench overhead` runs as each host's floor and the release modules do not have
//!   ([`Artefacts::wasm_probe_module`], [`Artefacts::native_probe_module`]);
//! - [`Service`]: the global rate-limit service and the external processor, outside the
//!   workspace's default members (`cargo build` needs no Debian package for them), built by
//!   `cargo xtask` when a test or a command needs them.
//!
//! std only: `cargo xtask` depends on it and must start without compiling the gateway.

use std::path::{Path, PathBuf};

/// The proxy-wasm module's file name.
pub const WASM_FILE: &str = "infergate_wasm.wasm";
/// The Envoy dynamic module's file name.
pub const NATIVE_FILE: &str = "libinfergate_envoy.so";
/// The engine simulator's binary (package `infergate-sim`).
pub const SIM_BINARY: &str = "infergate-sim";
/// The operator's tool, `infergate` (package [`CLI_PACKAGE`]).
pub const CLI_BINARY: &str = "infergate";
/// The package of [`CLI_BINARY`].
pub const CLI_PACKAGE: &str = "infergate-cli";
/// The target the Wasm module is built for.
pub const WASM_TARGET: &str = "wasm32-wasip1";

/// Names another proxy-wasm module than the release build.
pub const WASM_ENV: &str = "INFERGATE_WASM";
/// Names another native module than the release build.
pub const NATIVE_ENV: &str = "INFERGATE_NATIVE";
/// Names another simulator binary than the release (else debug) build.
pub const SIM_ENV: &str = "INFERGATE_SIM";

/// Where the test-only builds of the modules are kept: `<target>/test-artefact/` (and
/// `<target>/wasm32-wasip1/test-artefact/`), beside, never over, the release modules.
pub const TEST_ARTEFACT_DIR: &str = "test-artefact";

/// Where the bench builds of the modules are kept: `<target>/bench-artefact/` (and
/// `<target>/wasm32-wasip1/bench-artefact/`), beside, never over, the release modules. They
/// are built with the cargo feature `probe` (the measuring filter `bench overhead` runs as
/// each host's floor), which the release modules, and so `cargo xtask dist`, never have.
pub const BENCH_ARTEFACT_DIR: &str = "bench-artefact";

/// The workspace root (the directory holding the root `Cargo.toml`), one level above this
/// crate (`artefacts/`), as it was when the crate was compiled.
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

/// `<target>[/<triple>]/<profile_dir>/<file>`: where cargo (or `cargo xtask test`, for
/// [`TEST_ARTEFACT_DIR`]) puts `file`.
pub fn built(triple: Option<&str>, profile_dir: &str, file: &str) -> PathBuf {
    let mut path = target_dir();
    if let Some(triple) = triple {
        path.push(triple);
    }
    path.join(profile_dir).join(file)
}

/// A module's test-only build: `<target>[/<triple>]/test-artefact/<file>`.
pub fn test_artefact(triple: Option<&str>, file: &str) -> PathBuf {
    built(triple, TEST_ARTEFACT_DIR, file)
}

/// A module's bench build: `<target>[/<triple>]/bench-artefact/<file>`.
pub fn bench_artefact(triple: Option<&str>, file: &str) -> PathBuf {
    built(triple, BENCH_ARTEFACT_DIR, file)
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
        Artefacts {
            wasm_module: built(Some(WASM_TARGET), "release", WASM_FILE),
            native_module: built(None, "release", NATIVE_FILE),
            simulator: built(None, "release", SIM_BINARY),
        }
    }

    /// The variables through which tests and tools find the artefacts, with these paths.
    pub fn env(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            (WASM_ENV, self.wasm_module.clone()),
            (NATIVE_ENV, self.native_module.clone()),
            (SIM_ENV, self.simulator.clone()),
        ]
    }

    /// The proxy-wasm module to load: [`WASM_ENV`], else the release build.
    pub fn wasm_module() -> PathBuf {
        env_or(WASM_ENV, Self::locate().wasm_module)
    }

    /// The native module to load: [`NATIVE_ENV`], else the release build.
    pub fn native_module() -> PathBuf {
        env_or(NATIVE_ENV, Self::locate().native_module)
    }

    /// The proxy-wasm module's bench build, the one with the `probe` role
    /// ([`BENCH_ARTEFACT_DIR`]).
    pub fn wasm_probe_module() -> PathBuf {
        bench_artefact(Some(WASM_TARGET), WASM_FILE)
    }

    /// The native module's bench build, the one with the `probe` filter
    /// ([`BENCH_ARTEFACT_DIR`]).
    pub fn native_probe_module() -> PathBuf {
        bench_artefact(None, NATIVE_FILE)
    }
}

/// The path `var` names, else `default`.
pub fn env_or(var: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or(default)
}

/// A host binary of the workspace: the path `var` names, else cargo's release build of
/// `name`, else its debug build; `None` when neither is built.
pub fn find_binary(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    ["release", "debug"]
        .into_iter()
        .map(|profile| built(None, profile, name))
        .find(|p| p.is_file())
}

/// A service binary of the workspace outside its default members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// `infergate-ratelimit`: Envoy's global rate-limit service over limitador, which links
    /// RocksDB (Debian's `librocksdb-dev`, see `.cargo/config.toml`).
    RateLimit,
    /// `infergate-extproc`: the external processor `bench overhead` compares against.
    ExtProc,
}

impl Service {
    /// Both services.
    pub const ALL: [Service; 2] = [Service::RateLimit, Service::ExtProc];

    /// The package, which is also the binary's name.
    pub fn package(self) -> &'static str {
        match self {
            Service::RateLimit => "infergate-ratelimit",
            Service::ExtProc => "infergate-extproc",
        }
    }

    /// The variable naming another binary than the built one.
    pub fn env(self) -> &'static str {
        match self {
            Service::RateLimit => "INFERGATE_RATELIMIT",
            Service::ExtProc => "INFERGATE_EXTPROC",
        }
    }

    /// Where cargo puts the binary in `profile_dir` (`release` or `debug`).
    pub fn built(self, profile_dir: &str) -> PathBuf {
        built(None, profile_dir, self.package())
    }

    /// The binary to run: the variable's, else the release build, else the debug build;
    /// `None` when neither is built.
    pub fn find(self) -> Option<PathBuf> {
        find_binary(self.env(), self.package())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_paths_are_under_the_target_dir() {
        let target = target_dir();
        let a = Artefacts::locate();
        assert_eq!(
            a.wasm_module,
            target.join("wasm32-wasip1/release/infergate_wasm.wasm")
        );
        assert_eq!(
            a.native_module,
            target.join("release/libinfergate_envoy.so")
        );
        assert_eq!(a.simulator, target.join("release/infergate-sim"));
        assert_eq!(
            test_artefact(Some(WASM_TARGET), WASM_FILE),
            target.join("wasm32-wasip1/test-artefact/infergate_wasm.wasm")
        );
        assert_eq!(
            Artefacts::wasm_probe_module(),
            target.join("wasm32-wasip1/bench-artefact/infergate_wasm.wasm")
        );
        assert_eq!(
            Artefacts::native_probe_module(),
            target.join("bench-artefact/libinfergate_envoy.so")
        );
        assert_eq!(
            Service::RateLimit.built("debug"),
            target.join("debug/infergate-ratelimit")
        );
        assert!(workspace_root().join("Cargo.toml").is_file());
    }
}
