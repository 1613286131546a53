//! Host-agnostic filter logic of the gateway: per-request state machines of the body router
//! and the picker, and the scraper loop, written against small host traits so the proxy-wasm
//! adapter (`wasm/`) and the dynamic-module adapter (`envoy/`) stay thin.
