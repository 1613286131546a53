//! Test-build-only panic injection (cargo feature `panic-injection`, never in a release
//! artefact): a request carrying `x-infergate-test-panic: <phase>` makes the filter panic in
//! that phase, so the end-to-end suite can show that the panicking request fails closed and
//! that Envoy keeps serving the next ones. Phases: `1` or `request-headers`, `request-body`,
//! `response-headers`.
#![allow(clippy::panic)]

use crate::abi::HeaderKind;
use crate::host::EnvoyStream;

/// The request header that asks for a panic.
pub const HEADER: &str = "x-infergate-test-panic";

/// Where to panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Do not panic.
    None,
    /// In `on_http_filter_request_headers`.
    RequestHeaders,
    /// In `on_http_filter_request_body`.
    RequestBody,
    /// In `on_http_filter_response_headers`.
    ResponseHeaders,
}

impl Phase {
    /// The phase the request asks for (and removes the header so it never reaches upstream).
    pub fn requested(envoy: &mut EnvoyStream) -> Phase {
        let Some(value) = envoy.header(HeaderKind::RequestHeaders, HEADER) else {
            return Phase::None;
        };
        envoy.set_header(HeaderKind::RequestHeaders, HEADER, None);
        match value.as_slice() {
            b"1" | b"request-headers" => Phase::RequestHeaders,
            b"request-body" => Phase::RequestBody,
            b"response-headers" => Phase::ResponseHeaders,
            _ => Phase::None,
        }
    }

    /// Panics if `self` is `phase`.
    pub fn fire_if(self, phase: Phase) {
        if self == phase {
            panic!("injected test panic ({phase:?})");
        }
    }
}
