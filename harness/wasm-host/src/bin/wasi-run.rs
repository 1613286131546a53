//! `wasi-run <file.wasm> [args...]`: runs a `wasm32-wasip1` command module (such as a cargo
//! test binary) under wasmtime with WASI preview 1, and exits with the module's exit code.
//!
//! Meant as a cargo target runner, so `cargo test --target wasm32-wasip1` runs the tests:
//!
//! ```text
//! CARGO_TARGET_WASM32_WASIP1_RUNNER=/path/to/wasi-run cargo test -p scheduler-core --target wasm32-wasip1
//! ```
//!
//! The module gets this process's stdio, environment and arguments (its `argv[0]` is the
//! module path, then `args...`) and these directories:
//!
//! - the current directory as `.`, so relative paths work (cargo runs a test in its package
//!   directory);
//! - under their own absolute names, the top-level directory (e.g. `/work`) holding the
//!   current directory and the one holding `CARGO_MANIFEST_DIR`, plus `/tmp` and every
//!   directory listed in `WASI_RUN_DIRS` (colon-separated), so absolute paths such as
//!   `concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/x")` work, `..` included.
//!
//! WASI preview 1 has no working directory: the C library matches a path against the
//! preopened names, longest first, and `.` matches every relative path. Preopening `/` itself
//! would capture relative paths too, which is why whole top-level directories are preopened
//! instead; the cost is that a relative path whose first component names one of them
//! (`work/...`) resolves as absolute.
//!
//! Exit status: the module's `proc_exit` code, 0 when `_start` returns, 134 (like SIGABRT)
//! when it traps — a panic is an abort on `wasm32-wasip1`, so the first failing test ends the
//! run — and 101 when the module cannot be loaded.

use anyhow::{anyhow, Context as _, Result};
use infergate_wasm_host::engine::load_module_with;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use wasmtime::{Config, Engine, Linker, OptLevel, Store};
use wasmtime_wasi::p1::{self, WasiP1Ctx};
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

const LOAD_FAILURE: u8 = 101;
const TRAP: u8 = 134;

fn main() -> ExitCode {
    match run() {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("wasi-run: {error:#}");
            ExitCode::from(LOAD_FAILURE)
        }
    }
}

fn engine() -> Result<Engine> {
    let mut config = Config::new();
    // `WASI_RUN_OPT=speed` optimises the module's code; the default favours compile time,
    // which dominates for test binaries.
    let speed = std::env::var("WASI_RUN_OPT").is_ok_and(|v| v == "speed");
    config.cranelift_opt_level(if speed {
        OptLevel::Speed
    } else {
        OptLevel::None
    });
    Engine::new(&config).map_err(|e| anyhow!("{e:?}"))
}

/// The directories preopened under their absolute names (see the module doc).
fn absolute_preopens(cwd: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let extra = std::env::var_os("WASI_RUN_DIRS").unwrap_or_default();
    let candidates = [Some(cwd.to_path_buf()), manifest]
        .into_iter()
        .flatten()
        .filter_map(|p| top_level(&p))
        .chain(std::iter::once(PathBuf::from("/tmp")))
        .chain(std::env::split_paths(&extra));
    for dir in candidates {
        if dir.is_absolute() && dir.is_dir() && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// `/a` for `/a/b/c`; `None` for `/` or a relative path.
fn top_level(path: &Path) -> Option<PathBuf> {
    let mut components = path.components();
    match (components.next(), components.next()) {
        (Some(Component::RootDir), Some(Component::Normal(first))) => {
            Some(Path::new("/").join(first))
        }
        _ => None,
    }
}

fn run() -> Result<u8> {
    let mut argv = std::env::args().skip(1);
    let wasm = PathBuf::from(
        argv.next()
            .ok_or_else(|| anyhow!("usage: wasi-run <file.wasm> [args...]"))?,
    );
    let mut guest_args = vec![wasm.display().to_string()];
    guest_args.extend(argv);

    let engine = engine()?;
    let module = load_module_with(&engine, &wasm)?;
    let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
    p1::add_to_linker_sync(&mut linker, |ctx| ctx).map_err(|e| anyhow!("{e:?}"))?;

    let cwd = std::env::current_dir().context("current directory")?;
    let mut builder = WasiCtxBuilder::new();
    builder.inherit_stdio().inherit_env().args(&guest_args);
    builder
        .preopened_dir(&cwd, ".", FsPerms::ReadWrite)
        .map_err(|e| anyhow!("preopening {}: {e:?}", cwd.display()))?;
    for dir in absolute_preopens(&cwd) {
        if let Some(name) = dir.to_str() {
            builder
                .preopened_dir(&dir, name, FsPerms::ReadWrite)
                .map_err(|e| anyhow!("preopening {name}: {e:?}"))?;
        }
    }
    let mut store = Store::new(&engine, builder.build_p1());

    let instance = linker
        .instantiate(&mut store, &module)
        .map_err(|e| anyhow!("instantiating {}: {e:?}", wasm.display()))?;
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(|e| {
            anyhow!(
                "{} is not a WASI command (no `_start`): {e:?}",
                wasm.display()
            )
        })?;
    match start.call(&mut store, ()) {
        Ok(()) => Ok(0),
        Err(error) => match error.downcast_ref::<I32Exit>() {
            Some(exit) => Ok(u8::try_from(exit.0).unwrap_or(1)),
            None => {
                eprintln!("wasi-run: {} trapped: {error:?}", wasm.display());
                Ok(TRAP)
            }
        },
    }
}
