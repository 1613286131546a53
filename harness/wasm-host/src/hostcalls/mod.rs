//! The host functions the module imports, registered on a wasmtime `Linker`.
//!
//! `env` holds the proxy-wasm ABI 0.2.1 calls the Rust `proxy-wasm` 0.2.x SDK imports (it
//! imports all of them, used or not, through its trait vtables; the product module imports
//! the few it uses); `wasi_snapshot_preview1`
//! holds the small WASI subset a proxy host gives a plugin. Split by capability:
//! [`context`] (lifecycle, logging, time, ticks, buffers, properties, foreign functions),
//! [`http`] (header maps, stream control, local replies, HTTP/gRPC calls),
//! [`data`] (shared data, shared queues, metrics), [`wasi`].

mod context;
mod data;
mod http;
mod wasi;

use crate::state::HostState;
use wasmtime::Linker;

/// Registers every host function of this host on `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    context::add(linker)?;
    http::add(linker)?;
    data::add(linker)?;
    wasi::add(linker)?;
    Ok(())
}
