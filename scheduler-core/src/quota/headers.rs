//! OpenAI's `x-ratelimit-*` response headers.
//!
//! OpenAI writes the reset times as Go `time.Duration` strings (`"547ms"`, `"1s"`,
//! `"2m52.8s"`, `"6m0s"`, `"1h0m0s"`); [`format_reset`] writes the same form from
//! milliseconds, so clients that parse OpenAI's headers parse ours.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

/// OpenAI's x-ratelimit-* values for a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitInfo {
    /// `x-ratelimit-limit-requests` (None: no request limit, no request headers).
    pub limit_requests: Option<u64>,
    /// `x-ratelimit-remaining-requests`, clamped at 0.
    pub remaining_requests: u64,
    /// `x-ratelimit-reset-requests`: ms until the request bucket is full.
    pub reset_requests_ms: u64,
    /// `x-ratelimit-limit-tokens` (None: no token limit, no token headers).
    pub limit_tokens: Option<u64>,
    /// `x-ratelimit-remaining-tokens`, clamped at 0.
    pub remaining_tokens: u64,
    /// `x-ratelimit-reset-tokens`: ms until the token bucket is full.
    pub reset_tokens_ms: u64,
}

impl RateLimitInfo {
    /// (header name, value) pairs: x-ratelimit-limit-requests, -remaining-requests,
    /// -reset-requests, -limit-tokens, -remaining-tokens, -reset-tokens; only for the limits
    /// that exist.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(6);
        if let Some(limit) = self.limit_requests {
            out.push(("x-ratelimit-limit-requests", format!("{limit}")));
            out.push((
                "x-ratelimit-remaining-requests",
                format!("{}", self.remaining_requests),
            ));
            out.push((
                "x-ratelimit-reset-requests",
                format_reset(self.reset_requests_ms),
            ));
        }
        if let Some(limit) = self.limit_tokens {
            out.push(("x-ratelimit-limit-tokens", format!("{limit}")));
            out.push((
                "x-ratelimit-remaining-tokens",
                format!("{}", self.remaining_tokens),
            ));
            out.push((
                "x-ratelimit-reset-tokens",
                format_reset(self.reset_tokens_ms),
            ));
        }
        out
    }
}

/// A duration in Go's `time.Duration` string form at millisecond precision: `"0s"`,
/// `"120ms"`, `"1s"`, `"1.5s"`, `"6m0s"`, `"1h2m3.04s"`.
pub fn format_reset(ms: u64) -> String {
    if ms == 0 {
        return String::from("0s");
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let hours = ms / 3_600_000;
    let minutes = ms / 60_000 % 60;
    let seconds = ms / 1000 % 60;
    let millis = ms % 1000;
    let mut out = String::new();
    // Writing to a String cannot fail.
    if hours > 0 {
        let _ = write!(out, "{hours}h{minutes}m");
    } else if minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let _ = write!(out, "{seconds}");
    if millis > 0 {
        let fraction = format!("{millis:03}");
        let _ = write!(out, ".{}", fraction.trim_end_matches('0'));
    }
    out.push('s');
    out
}
