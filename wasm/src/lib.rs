//! proxy-wasm adapter: one module, `infergate_wasm.wasm`, whose plugin configuration's
//! `role` makes it the body router or the endpoint picker (both HTTP filters); the pickers'
//! VMs elect one among them to run the process-wide scraper and picker state owner
//! ([`elected`]), so the module needs nothing a `WasmPlugin` cannot install. All decisions live in
//! `infergate-filters` and `scheduler-core`; this crate runs the pipeline the filters
//! crate's builder assembles for the role, maps proxy-wasm callbacks onto its events and
//! its host traits onto hostcalls.
//!
//! Build: `cargo build -p infergate-wasm --target wasm32-wasip1 --release`.
//!
//! Modules: [`abi`] (the proxy-wasm ABI spoken directly: hostcalls, header-map codec,
//! exports and the context table), [`config`] (plugin configuration JSON), [`host`] (the `filters` host traits
//! over hostcalls, and what Envoy lets a Wasm filter do for routing), [`http`] (router,
//! picker and fail-closed HTTP contexts), [`root`] (configuration, scraper ticks and
//! callouts). `probe`, the measuring role of `cargo xtask bench overhead`, exists only with
//! the cargo feature `probe` (the bench build; never in the release module).
//!
//! Panics: a panic aborts the Wasm VM (and with it every request of that Envoy worker),
//! so no code here panics on input or on a host answer. The module does not use the
//! `proxy-wasm` SDK, whose wrappers `unwrap` UTF-8 conversions and panic on unexpected
//! statuses: [`abi`] returns every hostcall status as a value and reads header values as
//! bytes (converted lossily where a filter wants text). Shared state is borrowed with
//! `try_borrow_mut`; a request that meets a failed host read, an internal error or an
//! unconfigured module is failed closed with a 500 OpenAI-style error.

pub mod abi;
pub mod config;
pub mod elected;
pub mod host;
pub mod http;
pub mod owner;
#[cfg(feature = "probe")]
pub mod probe;
pub mod root;
pub mod test_stages;
