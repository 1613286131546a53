//! One process-wide wasmtime engine, and compiled modules cached in memory and on disk.
//!
//! Compiling a module is the slow part of a test (Cranelift, in a debug build of wasmtime);
//! instantiating is cheap. So every `Host` of a test process shares one engine; a module file
//! is compiled once per process (keyed by path, size and modification time, so a rebuilt
//! module is picked up); and the compiled code is kept on disk, keyed by a hash of the wasm
//! bytes and of the engine's compatibility hash (wasmtime version and settings), so the next
//! test process skips the compile. The disk cache lives in `$WASM_HOST_CACHE_DIR`, else
//! `<temp dir>/infergate-wasm-host-cache`; `WASM_HOST_CACHE_DIR=off` disables it.

use anyhow::{anyhow, Context as _, Result};
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::SystemTime;
use wasmtime::{Config, Engine, Module, OptLevel};

/// Converts a wasmtime error (its own type in wasmtime 48) into an `anyhow` error, keeping
/// the whole chain and any wasm backtrace.
pub(crate) fn wt(error: wasmtime::Error) -> anyhow::Error {
    anyhow!("{error:?}")
}

/// The shared engine.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut config = Config::new();
        // Tests run callbacks a few thousand times at most: compile time dominates.
        config.cranelift_opt_level(OptLevel::None);
        Engine::new(&config).unwrap_or_else(|_| Engine::default())
    })
}

type CacheKey = (PathBuf, u64, Option<SystemTime>);

/// Compiles (or fetches from the caches) the module at `path` for the shared engine.
pub fn load_module(path: &Path) -> Result<Module> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Module>>> = OnceLock::new();
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let key = (path.to_path_buf(), meta.len(), meta.modified().ok());
    // Held while compiling: parallel tests asking for the same module wait for one compile.
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(module) = cache.get(&key) {
        return Ok(module.clone());
    }
    let module = load_module_with(engine(), path)?;
    cache.insert(key, module.clone());
    Ok(module)
}

/// Compiles the module at `path` for `engine`, through the disk cache.
pub fn load_module_with(engine: &Engine, path: &Path) -> Result<Module> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let Some(dir) = cache_dir() else {
        return compile(engine, &bytes, path);
    };
    let mut hasher = DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    bytes.hash(&mut hasher);
    let file = dir.join(format!("{:016x}-{}.cwasm", hasher.finish(), bytes.len()));
    if file.is_file() {
        // SAFETY: files in the cache directory are only ever written below, by
        // `Module::serialize` for an engine with the same compatibility hash (part of the
        // name), and appear atomically through a rename, so the file holds code wasmtime
        // compiled for this engine; wasmtime still checks its header and version.
        if let Ok(module) = unsafe { Module::deserialize_file(engine, &file) } {
            return Ok(module);
        }
    }
    let module = compile(engine, &bytes, path)?;
    if let Ok(serialized) = module.serialize() {
        // Best effort: a cache that cannot be written only costs the next compile.
        let tmp = file.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_ok() && std::fs::write(&tmp, serialized).is_ok() {
            let _ = std::fs::rename(&tmp, &file);
        }
    }
    Ok(module)
}

fn compile(engine: &Engine, bytes: &[u8], path: &Path) -> Result<Module> {
    Module::new(engine, bytes)
        .map_err(wt)
        .with_context(|| format!("compiling {}", path.display()))
}

fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("WASM_HOST_CACHE_DIR") {
        Some(dir) if dir == "off" => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => Some(std::env::temp_dir().join("infergate-wasm-host-cache")),
    }
}
