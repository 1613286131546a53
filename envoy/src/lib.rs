//! The Envoy dynamic-module adapter (native `.so`, `libinfergate_envoy.so`): the body router,
//! the endpoint picker and the metrics scraper of `infergate_filters`, loaded into Envoy
//! 1.40 through its C ABI ("v0.2.0") with our own bindings.
//!
//! Unlike the proxy-wasm flavour (one VM, hence one prefix index and one set of in-flight
//! counts, per worker), the module is loaded once per Envoy process: the scraper's snapshot,
//! the prefix index and the in-flight counts are shared by every worker thread.
//!
//! Module map:
//! - [`abi`]: `#[repr(C)]` types, hook return enums and the `extern "C"` callbacks we use.
//! - [`guard`]: panic containment at every exported hook; [`log`]: Envoy's logger.
//! - [`host`]: a safe handle over one stream's `filter_envoy_ptr`; [`adapter`]: the filters'
//!   host capabilities on it; [`scheduler`]: the waker of a paused request; [`stats`]: Envoy
//!   metrics for the filters' stat keys, buffered in the module; [`flush`]: the thread and
//!   main-thread event that hand them to Envoy.
//! - [`filter`]: the per-stream objects behind Envoy's HTTP filter pointers and what a
//!   filter kind implements; [`factory`]: the config object, which picks the filter kind
//!   by `filter_name`; [`pipeline`]: the one generic adapter that runs a pipeline the
//!   filters crate's builder assembled; [`router`] and [`picker`]: the configs of the two
//!   HTTP filters (`filter_name` `router` / `picker`), each a role of that builder;
//!   [`gateway`]: both in one filter (`gateway`); `probe`: a measuring filter (`probe`)
//!   that only buffers and reads the body, in the bench build only (feature `probe`).
//! - [`scraper`]: the metrics scraper, one per process, hosted by the filter configs that
//!   carry it (the picker's `scraper`): ticks from a config scheduler on the main thread,
//!   callouts on the active config, hand-over when that config goes. No bootstrap extension.
//! - [`membership`]: the load-balancer policy `infergate-membership` (the fallback of each
//!   pool cluster's `override_host` policy) and the registry of the clusters' hosts and
//!   health it keeps, which the scraper follows.
//! - [`flow_timer`]: the thread that expires and dispatches flow control's queues.
//! - [`kv_events`]: the engines' KV-event streams (our own ZMQ SUB client, one thread).
//! - [`precise`]: that thread's feed of the picker's precise prefix indexes.
//! - [`shared`]: process-wide state shared by all workers.
//! - `hooks`: the exported `envoy_dynamic_module_on_*` functions.
//!
//! Cargo feature `panic-injection` (test builds only; this crate's unit tests too) adds
//! `panic_injection`; `test-stages` (which it implies) lets a filter config list the filters
//! crate's test stages under `testStages`. Cargo feature `probe` (the bench build that
//! `cargo xtask bench overhead` loads for its native floor, never the release module) adds
//! the `probe` filter; without it `filter_name: probe` is refused as any unknown name is. On
//! a wasm
//! target only the ABI types compile (the callbacks are Envoy symbols, not Wasm imports).

pub mod abi;
#[cfg(not(target_family = "wasm"))]
pub mod adapter;
#[cfg(not(target_family = "wasm"))]
pub mod factory;
#[cfg(not(target_family = "wasm"))]
pub mod filter;
#[cfg(not(target_family = "wasm"))]
pub mod flow_timer;
#[cfg(not(target_family = "wasm"))]
pub mod flush;
#[cfg(not(target_family = "wasm"))]
pub mod gateway;
#[cfg(not(target_family = "wasm"))]
pub mod guard;
#[cfg(not(target_family = "wasm"))]
pub mod host;
#[cfg(not(target_family = "wasm"))]
pub mod kv_events;
#[cfg(not(target_family = "wasm"))]
pub mod log;
#[cfg(not(target_family = "wasm"))]
pub mod membership;
#[cfg(all(any(test, feature = "panic-injection"), not(target_family = "wasm")))]
pub mod panic_injection;
#[cfg(not(target_family = "wasm"))]
pub mod picker;
#[cfg(not(target_family = "wasm"))]
pub mod pipeline;
#[cfg(not(target_family = "wasm"))]
pub mod precise;
#[cfg(all(feature = "probe", not(target_family = "wasm")))]
pub mod probe;
#[cfg(not(target_family = "wasm"))]
pub mod router;
#[cfg(not(target_family = "wasm"))]
pub mod scheduler;
#[cfg(not(target_family = "wasm"))]
pub mod scraper;
#[cfg(not(target_family = "wasm"))]
pub mod shared;
#[cfg(not(target_family = "wasm"))]
pub mod stats;

#[cfg(not(target_family = "wasm"))]
mod hooks;

#[cfg(test)]
mod fake_envoy;

/// Called once when Envoy loads the module: installs the panic hook and returns the ABI
/// version this module was written for.
#[cfg(not(target_family = "wasm"))]
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_program_init() -> *const core::ffi::c_char {
    guard::install_panic_hook();
    abi::ABI_VERSION.as_ptr()
}
