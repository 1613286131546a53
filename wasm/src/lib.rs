//! proxy-wasm adapter: one module, `infergate_wasm.wasm`, whose plugin configuration's
//! `role` makes it the body router, the endpoint picker (both HTTP filters) or the metrics
//! scraper (a singleton root context with ticks and HTTP callouts). All decisions live in
//! `infergate-filters` and `scheduler-core`; this crate maps proxy-wasm callbacks onto
//! their state machines and their host traits onto hostcalls.
//!
//! Build: `cargo build -p infergate-wasm --target wasm32-wasip1 --release`.
//!
//! Modules: [`config`] (plugin configuration JSON), [`host`] (the `filters` host traits
//! over hostcalls, and what Envoy lets a Wasm filter do for routing), [`http`] (router,
//! picker and fail-closed HTTP contexts), [`root`] (configuration, scraper ticks and
//! callouts).
//!
//! Panics: a panic aborts the Wasm VM, so no code here panics on input: hostcall errors are
//! handled (the SDK's `unwrap`ping helpers are not used), shared state is borrowed with
//! `try_borrow_mut`, and a request that meets an internal error or an unconfigured module
//! is failed closed with a 500 OpenAI-style error.

pub mod config;
pub mod host;
pub mod http;
pub mod root;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::Root::new(context_id))
    });
}}
