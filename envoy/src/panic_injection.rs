//! Test-build-only panic injection (cargo feature `panic-injection` and this crate's unit
//! tests, never in a release artefact):
//!
//! - a request carrying `x-infergate-test-panic: <phase>` makes the filter panic in that
//!   phase, so the end-to-end suite can show that the panicking request fails closed and
//!   that Envoy keeps serving the next ones. Phases: `1` or `request-headers`,
//!   `request-body`, `response-headers`;
//! - the scraper's config key `testPanicTicks`, a list of tick numbers counted from one,
//!   makes those ticks of the native scraper panic, so a test can show that scraping goes
//!   on after a panicking tick. A release build has no such key: its scraper config
//!   refuses it as an unknown field.
#![allow(clippy::panic)]

use std::cell::Cell;

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

/// The scraper config key listing the ticks that panic.
pub const SCRAPER_TICKS_KEY: &str = "testPanicTicks";

/// Which of the native scraper's ticks panic (main thread only).
#[derive(Debug, Default)]
pub struct TickPanic {
    at: Vec<u64>,
    ticks: Cell<u64>,
}

impl TickPanic {
    /// Takes [`SCRAPER_TICKS_KEY`] out of the scraper's JSON config (so the scraper never
    /// sees it); absent → no tick panics.
    pub fn from_config(config: &mut serde_json::Value) -> Result<TickPanic, String> {
        let Some(value) = config
            .as_object_mut()
            .and_then(|m| m.remove(SCRAPER_TICKS_KEY))
        else {
            return Ok(TickPanic::default());
        };
        let at = value
            .as_array()
            .map(|ticks| ticks.iter().filter_map(serde_json::Value::as_u64).collect())
            .ok_or_else(|| format!("{SCRAPER_TICKS_KEY} must be a list of tick numbers"))?;
        Ok(TickPanic {
            at,
            ticks: Cell::new(0),
        })
    }

    /// Counts one tick; panics if it is one of the chosen ones.
    pub fn tick(&self) {
        let n = self.ticks.get().saturating_add(1);
        self.ticks.set(n);
        if self.at.contains(&n) {
            panic!("injected test panic (scraper tick {n})");
        }
    }
}
