//! The buckets of one tenant x model limit, their refill, admission, settlement and
//! fixed-size encoding.

use super::{Limits, QuotaReason, RateLimitInfo, Rejection};
use crate::types::Millis;

/// Units per request or token: a per-minute limit `L` refills `L` units per millisecond.
pub const UNITS_PER_TOKEN: i128 = 60_000;

/// `retry-after` for a limit of 0, which never admits: a minute, the limits' own period.
const RETRY_NEVER_S: u64 = 60;

/// First byte of an encoded state; a state written by another layout does not decode.
const ENCODING_VERSION: u8 = 1;

/// The state of one tenant x model bucket set. Fixed-size binary encoding (it is stored in
/// proxy-wasm shared data and updated with compare-and-swap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaState {
    /// Request bucket level, in units (meaningless without an rpm limit).
    requests: i128,
    /// Token bucket level, in units; negative after an under-estimate was charged.
    tokens: i128,
    /// Admitted requests not yet settled.
    in_flight: u64,
    /// The time the levels were last refilled to; never moves backwards.
    refilled_at: Millis,
}

/// Capacity of a bucket of `limit` per minute, in units.
fn capacity(limit: u64) -> i128 {
    i128::from(limit) * UNITS_PER_TOKEN
}

/// `level` refilled for `elapsed_ms` at `limit` per minute, never above the capacity.
fn refilled(level: i128, limit: u64, elapsed_ms: u64) -> i128 {
    let added = i128::from(elapsed_ms).saturating_mul(i128::from(limit));
    level.saturating_add(added).min(capacity(limit))
}

/// `a / b` rounded up, for `a >= 0`, `b > 0`.
fn ceil_div(a: i128, b: i128) -> i128 {
    a / b + i128::from(a % b != 0)
}

/// Milliseconds until `level` reaches `target` at `limit` per minute (0 when it has).
fn ms_until(level: i128, target: i128, limit: u64) -> u64 {
    if limit == 0 || level >= target {
        return 0;
    }
    let ms = ceil_div(target.saturating_sub(level), i128::from(limit));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// `retry-after` seconds until `level` reaches `target` at `limit` per minute.
fn retry_after(level: i128, target: i128, limit: u64) -> u64 {
    if limit == 0 {
        return RETRY_NEVER_S;
    }
    let ms = ms_until(level, target, limit);
    ms.div_ceil(1000).max(1)
}

/// Whole requests or tokens in `level`, clamped at 0.
fn whole(level: i128) -> u64 {
    u64::try_from((level / UNITS_PER_TOKEN).max(0)).unwrap_or(u64::MAX)
}

impl QuotaState {
    /// Bytes of [`QuotaState::encode`]: version, two `i128` levels, in-flight `u64`,
    /// refill time `u64`, little-endian.
    pub const ENCODED_LEN: usize = 1 + 16 + 16 + 8 + 8;

    /// Buckets full, nothing in flight, as of `now`.
    pub fn full(limits: &Limits, now: Millis) -> QuotaState {
        QuotaState {
            requests: limits.rpm.map_or(0, capacity),
            tokens: limits.tpm.map_or(0, capacity),
            in_flight: 0,
            refilled_at: now,
        }
    }

    /// Request bucket level in units ([`UNITS_PER_TOKEN`] per request).
    pub fn request_units(&self) -> i128 {
        self.requests
    }

    /// Token bucket level in units ([`UNITS_PER_TOKEN`] per token); may be negative.
    pub fn token_units(&self) -> i128 {
        self.tokens
    }

    /// Admitted requests not yet settled.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The time the levels were last refilled to.
    pub fn refilled_at(&self) -> Millis {
        self.refilled_at
    }

    /// Refills both buckets to `now` (nothing if the clock went backwards).
    pub fn refill(&mut self, limits: &Limits, now: Millis) {
        let elapsed = now.since(self.refilled_at);
        if let Some(rpm) = limits.rpm {
            self.requests = refilled(self.requests, rpm, elapsed);
        }
        if let Some(tpm) = limits.tpm {
            self.tokens = refilled(self.tokens, tpm, elapsed);
        }
        self.refilled_at = self.refilled_at.max(now);
    }

    /// Refill to `now`, then admit a request pre-debiting `debit_tokens`: checks rpm, then
    /// tpm, then concurrency; a rejection changes nothing but the refill.
    pub fn admit(
        &mut self,
        limits: &Limits,
        debit_tokens: u64,
        now: Millis,
    ) -> Result<RateLimitInfo, Rejection> {
        self.refill(limits, now);
        let reject = |state: &QuotaState, reason, retry_after_s| Rejection {
            reason,
            retry_after_s,
            info: state.info(limits, now),
        };
        if let Some(rpm) = limits.rpm {
            if rpm == 0 || self.requests < UNITS_PER_TOKEN {
                let retry = retry_after(self.requests, UNITS_PER_TOKEN, rpm);
                return Err(reject(self, QuotaReason::Rpm, retry));
            }
        }
        let debit_units = i128::from(debit_tokens) * UNITS_PER_TOKEN;
        if let Some(tpm) = limits.tpm {
            // A debit above the capacity needs a full bucket, not more than it can hold.
            let needed = debit_units.min(capacity(tpm));
            if tpm == 0 || self.tokens < needed {
                let retry = retry_after(self.tokens, needed, tpm);
                return Err(reject(self, QuotaReason::Tpm, retry));
            }
        }
        if let Some(concurrency) = limits.concurrency {
            if self.in_flight >= concurrency {
                return Err(reject(self, QuotaReason::Concurrency, 1));
            }
        }
        if limits.rpm.is_some() {
            self.requests = self.requests.saturating_sub(UNITS_PER_TOKEN);
        }
        if limits.tpm.is_some() {
            self.tokens = self.tokens.saturating_sub(debit_units);
        }
        self.in_flight = self.in_flight.saturating_add(1);
        Ok(self.info(limits, now))
    }

    /// The request admitted with `pre_debit` ended having consumed `actual` tokens: refund
    /// pre_debit - actual (negative: charge the difference), concurrency - 1. The refund
    /// never lifts the token level above the capacity.
    pub fn settle(&mut self, limits: &Limits, pre_debit: u64, actual: u64, now: Millis) {
        self.refill(limits, now);
        if let Some(tpm) = limits.tpm {
            let refund = (i128::from(pre_debit) - i128::from(actual)) * UNITS_PER_TOKEN;
            self.tokens = self.tokens.saturating_add(refund).min(capacity(tpm));
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The `x-ratelimit-*` values as of `now` (refilled for reporting; the state itself is
    /// not changed).
    pub fn info(&self, limits: &Limits, now: Millis) -> RateLimitInfo {
        let mut view = *self;
        view.refill(limits, now);
        let (remaining_requests, reset_requests_ms) = limits.rpm.map_or((0, 0), |rpm| {
            let remaining = whole(view.requests).min(rpm);
            (remaining, ms_until(view.requests, capacity(rpm), rpm))
        });
        let (remaining_tokens, reset_tokens_ms) = limits.tpm.map_or((0, 0), |tpm| {
            let remaining = whole(view.tokens).min(tpm);
            (remaining, ms_until(view.tokens, capacity(tpm), tpm))
        });
        RateLimitInfo {
            limit_requests: limits.rpm,
            remaining_requests,
            reset_requests_ms,
            limit_tokens: limits.tpm,
            remaining_tokens,
            reset_tokens_ms,
        }
    }

    /// The fixed-size encoding: version byte, then levels, in-flight and refill time.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0] = ENCODING_VERSION;
        out[1..17].copy_from_slice(&self.requests.to_le_bytes());
        out[17..33].copy_from_slice(&self.tokens.to_le_bytes());
        out[33..41].copy_from_slice(&self.in_flight.to_le_bytes());
        out[41..49].copy_from_slice(&self.refilled_at.0.to_le_bytes());
        out
    }

    /// Decodes [`QuotaState::encode`]'s bytes; `None` for any other length or version.
    pub fn decode(bytes: &[u8]) -> Option<QuotaState> {
        let bytes: &[u8; Self::ENCODED_LEN] = bytes.try_into().ok()?;
        if bytes[0] != ENCODING_VERSION {
            return None;
        }
        let (requests, rest) = bytes[1..].split_first_chunk::<16>()?;
        let (tokens, rest) = rest.split_first_chunk::<16>()?;
        let (in_flight, rest) = rest.split_first_chunk::<8>()?;
        let (refilled_at, _) = rest.split_first_chunk::<8>()?;
        Some(QuotaState {
            requests: i128::from_le_bytes(*requests),
            tokens: i128::from_le_bytes(*tokens),
            in_flight: u64::from_le_bytes(*in_flight),
            refilled_at: Millis(u64::from_le_bytes(*refilled_at)),
        })
    }
}
