//! Token-bucket quotas: per tenant x model request, token and concurrency limits.
//!
//! One [`QuotaState`] holds the buckets of one tenant x model limit ([`Limits`]): a request
//! bucket of capacity `rpm` and a token bucket of capacity `tpm`, both refilled
//! continuously at capacity / 60 per second, and a count of requests in flight checked
//! against `concurrency`. The stages keep one state per bucket key and update it with
//! compare-and-swap on its fixed-size encoding ([`QuotaState::encode`]), so the math here
//! is pure and deterministic: no floats, no clock (callers pass `now`).
//!
//! # Fixed point
//!
//! Levels are counted in *units*: one request or one token is [`UNITS_PER_TOKEN`] (60 000)
//! units, so a limit of `L` per minute refills exactly `L` units per millisecond. Refill
//! is then one multiplication, exact at any rate, with no remainder to carry. Levels are
//! `i128` (a `u64::MAX` limit times 60 000 fits with room to spare); every operation
//! saturates, so no input overflows.
//!
//! # Rules
//!
//! - [`QuotaState::admit`] refills to `now`, then checks rpm, then tpm, then concurrency.
//!   The first that fails rejects ([`Rejection`], with its reason, `retry-after` and the
//!   `x-ratelimit-*` values); a rejection changes nothing but the refill.
//! - rpm admits when at least one request is in the bucket; tpm when the balance covers the
//!   pre-debit. A pre-debit larger than the capacity is admitted when the bucket is full
//!   (and drives it negative), so a big request waits at most one refill period instead of
//!   being refused forever. A limit of 0 admits nothing.
//! - [`QuotaState::settle`] refunds `pre_debit - actual` (or charges the difference, so the
//!   token level may go negative) and ends the request's concurrency slot. A refund never
//!   lifts the level above the capacity: tokens refunded into a bucket that time has already
//!   refilled are dropped like any overflow.
//! - Refill never exceeds the capacity. A clock that goes backwards refills nothing, and the
//!   refill time does not move back with it, so the same interval is never counted twice.
//! - `retry_after_s` is the whole seconds (rounded up, at least 1) until the failing bucket
//!   would admit the same request: rpm, until one request is back; tpm, until the balance
//!   covers the pre-debit (or the bucket is full); concurrency, 1. An rpm or tpm of 0
//!   answers 60 (it never admits; a minute is the limits' own period).
//!
//! [`pre_debit`] computes a request's pre-debit (the prompt and every sequence the request
//! may generate); [`RateLimitInfo::headers`] writes OpenAI's
//! `x-ratelimit-*` headers.

mod bucket;
mod headers;

pub use bucket::{QuotaState, UNITS_PER_TOKEN};
pub use headers::{format_reset, RateLimitInfo};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_prop;

/// One limit entry's numbers (None = no limit of that kind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Requests per minute: capacity of the request bucket.
    pub rpm: Option<u64>,
    /// Tokens (prompt + completion) per minute: capacity of the token bucket.
    pub tpm: Option<u64>,
    /// Requests in flight at once.
    pub concurrency: Option<u64>,
}

/// Which limit refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuotaReason {
    /// The request bucket is empty.
    Rpm,
    /// The token bucket does not cover the pre-debit.
    Tpm,
    /// As many requests as allowed are in flight.
    Concurrency,
}

impl QuotaReason {
    /// The value of `x-llm-d-request-dropped-reason` for this rejection.
    pub fn dropped_reason(self) -> &'static str {
        match self {
            QuotaReason::Rpm => "rejected-quota-rpm",
            QuotaReason::Tpm => "rejected-quota-tpm",
            QuotaReason::Concurrency => "rejected-quota-concurrency",
        }
    }

    /// OpenAI's rate-limit error `type`: `requests` or `tokens` (concurrency counts as
    /// requests).
    pub fn openai_type(self) -> &'static str {
        match self {
            QuotaReason::Rpm | QuotaReason::Concurrency => "requests",
            QuotaReason::Tpm => "tokens",
        }
    }
}

/// A refused request: why, when to retry, and the bucket values to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The limit that refused.
    pub reason: QuotaReason,
    /// `retry-after`, whole seconds, at least 1.
    pub retry_after_s: u64,
    /// The `x-ratelimit-*` values at the time of the refusal.
    pub info: RateLimitInfo,
}

/// The pre-debit of a request: prompt estimate + min(output sequences × (requested max
/// output or the default), cap). `output_sequences` is how many sequences the engine may
/// generate (`n`, `best_of`, the prompts of a batch:
/// [`crate::request::ParsedRequest::output_sequences`]; 0 counts as 1). Saturates at
/// `u64::MAX`.
pub fn pre_debit(
    prompt_estimate: u64,
    requested_max_output: Option<u64>,
    default_max_output: u64,
    output_sequences: u32,
    cap: Option<u64>,
) -> u64 {
    let per_sequence = requested_max_output.unwrap_or(default_max_output);
    let output = per_sequence.saturating_mul(u64::from(output_sequences.max(1)));
    let output = cap.map_or(output, |cap| output.min(cap));
    prompt_estimate.saturating_add(output)
}
