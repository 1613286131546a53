//! The `probe` filter (`filter_name: probe`): a measuring tool, not part of the gateway,
//! compiled only with the crate's `probe` feature (the bench build).
//!
//! It holds each request until its body is complete, copies the body out of Envoy, and lets
//! the request go on unchanged: the least any body-based filter (such as the router) does.
//! `cargo xtask bench overhead` builds the module with `--features probe` and runs it in
//! front of the plain routes as the native floor, so the gateway's overhead can be read
//! against what merely reading the body costs. Config: empty or `{}`. A release module
//! refuses the name as it refuses any unknown one (`crate::factory`).

use crate::abi::{BodyStatus, HeadersStatus, TrailersStatus};
use crate::filter::{StreamFactory, StreamLogic};
use crate::host::EnvoyStream;

/// The probe's config: nothing to hold.
pub struct ProbeFactory;

impl ProbeFactory {
    /// Accepts only an empty config.
    pub fn new(config: &[u8]) -> Result<ProbeFactory, String> {
        let empty = config.iter().all(u8::is_ascii_whitespace)
            || serde_json::from_slice::<serde_json::Value>(config)
                .ok()
                .and_then(|v| v.as_object().map(serde_json::Map::is_empty))
                .unwrap_or(false);
        if empty {
            Ok(ProbeFactory)
        } else {
            Err("the probe filter takes no settings (config must be empty or {})".to_owned())
        }
    }
}

impl StreamFactory for ProbeFactory {
    fn new_stream(&self) -> Box<dyn StreamLogic> {
        Box::new(ProbeStream)
    }
}

struct ProbeStream;

impl StreamLogic for ProbeStream {
    fn on_request_headers(
        &mut self,
        _envoy: &mut EnvoyStream,
        end_of_stream: bool,
    ) -> HeadersStatus {
        if end_of_stream {
            HeadersStatus::Continue
        } else {
            HeadersStatus::StopIteration
        }
    }

    fn on_request_body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> BodyStatus {
        if !end_of_stream {
            return BodyStatus::StopIterationAndBuffer;
        }
        core::hint::black_box(envoy.request_body());
        BodyStatus::Continue
    }

    fn on_request_trailers(&mut self, envoy: &mut EnvoyStream) -> TrailersStatus {
        // Trailers end the request: the buffered body is complete.
        core::hint::black_box(envoy.request_body());
        TrailersStatus::Continue
    }
}
