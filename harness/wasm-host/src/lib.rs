//! A proxy-wasm host on wasmtime, for testing the built `.wasm` module without Envoy.
//!
//! It implements the proxy-wasm ABI 0.2.1 as the Rust `proxy-wasm` 0.2.x SDK imports it (the
//! `testmod` fixture) and as the product module speaks it without the SDK, with Envoy's observable behaviour where the ABI leaves room (header-map availability,
//! body-buffer edits, shared-data CAS, HTTP-call checks), plus the WASI subset a proxy gives
//! a plugin. Tests load a module, configure plugins, and drive requests, ticks and HTTP calls:
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use infergate_wasm_host::{Action, Host, HttpCallResponse};
//! let host = Host::load("target/wasm32-wasip1/release/module.wasm")?;
//! host.configure_plugin("picker", r#"{"pool": "a"}"#)?;
//! let s = host.new_http_stream()?;
//! assert_eq!(s.request_headers(&[(":path", "/v1/chat/completions")], false)?, Action::Pause);
//! s.request_body(br#"{"model": "m"}"#, true)?;
//! let upstream = s.upstream_request_headers();
//! for call in host.pending_http_calls() {
//!     host.respond_http_call(call.token, HttpCallResponse::new(200, "metrics"))?;
//! }
//! s.done()?;
//! # Ok(()) }
//! ```
//!
//! A host in trouble is part of the test API: header values are bytes (a test can send
//! `caf\xe9` or control bytes, as Envoy passes them), any hostcall can be made to answer an
//! error status or garbled bytes ([`Host::inject_fault`]), and a callout can be lost
//! ([`Host::drop_http_call`]).
//!
//! Modules: [`host`], [`builder`] and [`stream`] are the test API; [`state`] holds what tests inspect;
//! `hostcalls` implements the imports; [`shared`] is the cross-VM shared data; [`engine`]
//! caches compiled modules per process; the `wasi-run` binary runs WASI command modules
//! (cargo test binaries built for `wasm32-wasip1`).

pub mod abi;
pub mod builder;
pub mod engine;
pub mod headers;
pub mod host;
mod hostcalls;
mod memory;
mod runtime;
pub mod shared;
pub mod state;
pub mod stream;

pub use abi::{Action, LogLevel, MetricType, Status};
pub use builder::HostBuilder;
pub use headers::HeaderMap;
pub use host::Host;
pub use shared::SharedData;
pub use state::{
    ForeignCall, HostcallFault, HttpCall, HttpCallResponse, LocalResponse, LogLine, Metric,
    StreamState,
};
pub use stream::HttpStream;
