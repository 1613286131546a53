//! Filter semantics. A filter narrows the candidates still alive in a profile; it records
//! its own position in `dropped_by` for each endpoint it drops, and a [`FilterNote`] saying
//! which branch fired.
//!
//! Missing metrics: a filter only drops an endpoint on evidence. An endpoint whose metrics
//! are unknown (no snapshot, or the metric is absent or NaN) passes `utilization-filter`,
//! counts as not overloaded, and its waiting queue counts as empty in the TTFT estimate.
//! Stale or missing snapshots are the pool's `failureMode` decision, taken
//! before scheduling; inside the scheduler, "unknown" must not mean "unroutable".
//!
//! TTFT estimate (`prefix-cache-affinity-filter`), in milliseconds:
//! `waiting × queuedRequestMs + uncached_prompt_tokens × 1000 ÷ prefillTokensPerSecond`,
//! where `uncached_prompt_tokens = prompt_tokens − matched_blocks × blockSizeTokens`
//! (floored at 0). It is deliberately crude: it only has to rank the sticky set against the
//! rest, and both terms are what dominates TTFT on a loaded engine. When this proxy has
//! measured the endpoint lately ([`crate::latency`]), the estimate is the larger of that
//! and the TTFT it measured (predicted at the endpoint's current in-flight load): a
//! replica that holds the prefix but has slowed down (a noisy neighbour, a throttled GPU)
//! shows no queue, yet answers late, and loses the sticky set once it is worse than the
//! best other by more than `maxTTFTPenaltyMs`.

use serde::Serialize;

use super::input::{Ctx, ALIVE};
use super::plugins::{PrefixAffinityFilter, UtilizationFilter, UtilizationMetric};
use super::roles::Phase;

/// Which branch of a filter fired for one request (part of the decision record).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "note", rename_all = "kebab-case")]
pub enum FilterNote {
    /// The filter ran normally (it may have dropped nothing).
    Applied,
    /// Every candidate would have been dropped; `fallbackOnEmpty` kept them all.
    FallbackOnEmpty,
    /// No candidate reached the threshold without being overloaded: nothing dropped.
    NoSticky,
    /// Only the sticky set was kept.
    Sticky {
        /// Best estimated TTFT in the sticky set.
        sticky_ttft_ms: f64,
        /// Best estimated TTFT among the others (absent when all were sticky).
        best_other_ttft_ms: Option<f64>,
    },
    /// The sticky set was too slow: affinity broken, nothing dropped.
    AffinityBroken {
        /// Best estimated TTFT in the sticky set.
        sticky_ttft_ms: f64,
        /// Best estimated TTFT among the others.
        best_other_ttft_ms: f64,
    },
}

/// Drops the candidates whose role cannot serve `phase` (`decode-filter`, `prefill-filter`,
/// and, with `ROLE_DROPPED` as the position, the disaggregation handler's own restriction).
pub(crate) fn role(
    phase: Phase,
    ctx: &Ctx<'_, '_>,
    pos: u16,
    dropped_by: &mut [u16],
) -> FilterNote {
    for (c, d) in dropped_by.iter_mut().enumerate() {
        if *d == ALIVE && !ctx.cands.get(c).is_some_and(|cand| cand.role.serves(phase)) {
            *d = pos;
        }
    }
    FilterNote::Applied
}

/// Runs `utilization-filter` at profile position `pos`.
pub(crate) fn utilization(
    f: &UtilizationFilter,
    ctx: &Ctx<'_, '_>,
    pos: u16,
    dropped_by: &mut [u16],
) -> FilterNote {
    let exceeds = |c: usize| {
        f.conditions.iter().any(|cond| {
            let value = ctx
                .cands
                .get(c)
                .and_then(|cand| cand.metrics)
                .and_then(|m| match cond.metric {
                    UtilizationMetric::KvCacheUtilization => m.kv_cache_usage,
                    UtilizationMetric::WaitingQueue => m.waiting.map(f64::from),
                    UtilizationMetric::RunningRequests => m.running.map(f64::from),
                });
            // NaN compares false: an unreadable value is not evidence of overload.
            value.is_some_and(|v| v > cond.max_value)
        })
    };
    let mut alive = 0usize;
    let mut survivors = 0usize;
    for (c, d) in dropped_by.iter().enumerate() {
        if *d == ALIVE {
            alive += 1;
            if !exceeds(c) {
                survivors += 1;
            }
        }
    }
    if alive > 0 && survivors == 0 && f.fallback_on_empty {
        return FilterNote::FallbackOnEmpty;
    }
    for (c, d) in dropped_by.iter_mut().enumerate() {
        if *d == ALIVE && exceeds(c) {
            *d = pos;
        }
    }
    FilterNote::Applied
}

/// Runs `prefix-cache-affinity-filter` at profile position `pos`.
pub(crate) fn prefix_affinity(
    f: &PrefixAffinityFilter,
    ctx: &Ctx<'_, '_>,
    pos: u16,
    dropped_by: &mut [u16],
) -> FilterNote {
    if ctx.full_blocks == 0 {
        return FilterNote::NoSticky;
    }
    let sticky = |c: usize| {
        let ratio = ctx.matched(c) as f64 / ctx.full_blocks as f64;
        ratio >= f.threshold && !overloaded(f, ctx, c)
    };
    let mut best_sticky: Option<f64> = None;
    let mut best_other: Option<f64> = None;
    for (c, d) in dropped_by.iter().enumerate() {
        if *d != ALIVE {
            continue;
        }
        let t = ttft_ms(f, ctx, c);
        let slot = if sticky(c) {
            &mut best_sticky
        } else {
            &mut best_other
        };
        *slot = Some(slot.map_or(t, |b| b.min(t)));
    }
    let Some(sticky_ttft_ms) = best_sticky else {
        return FilterNote::NoSticky;
    };
    if let Some(other) = best_other {
        if sticky_ttft_ms - other > f.max_ttft_penalty_ms {
            return FilterNote::AffinityBroken {
                sticky_ttft_ms,
                best_other_ttft_ms: other,
            };
        }
    }
    for (c, d) in dropped_by.iter_mut().enumerate() {
        if *d == ALIVE && !sticky(c) {
            *d = pos;
        }
    }
    FilterNote::Sticky {
        sticky_ttft_ms,
        best_other_ttft_ms: best_other,
    }
}

fn overloaded(f: &PrefixAffinityFilter, ctx: &Ctx<'_, '_>, c: usize) -> bool {
    let Some(m) = ctx.cands.get(c).and_then(|cand| cand.metrics) else {
        return false;
    };
    m.waiting
        .is_some_and(|w| u64::from(w) > f.max_waiting_queue)
        || m.kv_cache_usage
            .is_some_and(|k| k > f.max_kv_cache_utilization)
}

/// The documented TTFT estimate for candidate `c`, in milliseconds.
pub(crate) fn ttft_ms(f: &PrefixAffinityFilter, ctx: &Ctx<'_, '_>, c: usize) -> f64 {
    let waiting = ctx
        .cands
        .get(c)
        .and_then(|cand| cand.metrics)
        .and_then(|m| m.waiting)
        .unwrap_or(0);
    let cached = (ctx.matched(c) as u64).saturating_mul(u64::from(ctx.block_size_tokens));
    let uncached = ctx.req.prompt_tokens.0.saturating_sub(cached);
    let formula = f64::from(waiting) * f.queued_request_ms
        + uncached as f64 * 1000.0 / f.prefill_tokens_per_second;
    let measured = ctx
        .cands
        .get(c)
        .and_then(|cand| cand.latency)
        .map_or(0.0, |l| l.ttft_ms);
    formula.max(measured)
}
