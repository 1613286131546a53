//! Scorer semantics. Each scorer writes a raw score in [0, 1] for every candidate still
//! alive in the profile (NaN and out-of-range values are clamped: NaN → 0).
//!
//! "Linear" scorers (`queue-scorer`, `running-requests-scorer`, `inflight-load-scorer`,
//! `token-load-scorer`) rank the remaining candidates: least loaded → 1, most loaded → 0,
//! linear in between; all equal → 1 for all.
//!
//! `prefix-cache-scorer`, with `m` the candidate's matched leading blocks, `t` the request's
//! full blocks considered for matching, `b` the prefix producer's `blockSizeTokens`, `w`
//! its `matchLengthWeight` and `s` its `matchLengthScaleTokens`:
//!
//! ```text
//! score = w · min(1, m·b / s)² + (1 − w) · m / t        (0 when t = 0)
//! ```
//!
//! This is llm-d-router's formula (its `prefix-cache-scorer`,
//! `pkg/epp/framework/plugins/scheduling/scorer/prefix/plugin.go`, and the README beside
//! it), with its defaults (`w` 0, `s` 8192). The ratio term prefers the endpoint holding
//! more of *this* prompt, the length term the one holding more tokens of it, squared because
//! prefill attention grows quadratically with prompt length, so a long cached prefix saves
//! more than its ratio says. The scale is in tokens and the index counts blocks, so matched
//! tokens are `m·b`: a scale below one block saturates on the first matched block. With
//! `w = 0` the length term is not computed and the score is exactly the ratio. One
//! difference: llm-d checks `s > 0` only when `w > 0`; here a scale below 1 is always a
//! config error.
//!
//! `latency-observation-scorer` reads what this proxy measured ([`crate::latency`]): each
//! candidate's cost is its predicted TTFT for a request sent now (at its current in-flight
//! load) plus `tpotTokens` × its measured time per output token, and its score is
//! `(best + 1) / (cost + 1)`, costs in ms and `best` the lowest cost among the alive
//! candidates: 1 for the fastest, ½ for one twice as slow (beyond the 1 ms that keeps
//! sub-millisecond noise from counting). A candidate without a fresh estimate scores 1,
//! as good as the best, so an endpoint the picker has not measured lately is tried again,
//! and with no estimate anywhere every candidate scores 1 (the scorer has no opinion).
//! llm-d's scorer of that name (llm-d-router, unreleased) differs: it keeps a window of
//! TTFT samples per endpoint and predicts from its percentiles, piecewise linear in the
//! in-flight load; normalises min-max (fastest 1, slowest 0, however close they are);
//! tries cold endpoints at an `explorationRate`; and measures nothing but TTFT. Here the
//! estimate is a weighted line (constant memory per endpoint), the ratio keeps endpoints
//! within noise of each other alike, a stale estimate (not an exploration draw) makes an
//! endpoint try again, and the time per output token can count.
//!
//! Missing metrics: a scorer that needs a scraped metric gives 0 to an endpoint whose value
//! is unknown (and leaves it out of the linear ranking's min/max), so an endpoint we know
//! nothing about is still routable but never preferred over one that reports being idle.
//! In-flight load is the proxy's own bookkeeping and is always known.

use super::input::{Ctx, ALIVE};
use super::placement::{self, PlacementNote};
use super::plugins::{LatencyScorer, PrefixCacheScorer, Scorer};

/// Clamps a raw score into [0, 1]; NaN → 0.
pub fn clamp_score(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// Writes scorer `s`'s raw scores for the alive candidates into `out` (one slot per
/// candidate); `rendezvous-placement-scorer` also says what it chose and why.
pub(crate) fn score(
    s: Scorer,
    ctx: &Ctx<'_, '_>,
    dropped_by: &[u16],
    out: &mut [f64],
) -> Option<PlacementNote> {
    let metrics = |c: usize| ctx.cands.get(c).and_then(|cand| cand.metrics);
    match s {
        Scorer::Placement(p) => return Some(placement::score(p, ctx, dropped_by, out)),
        Scorer::PrefixCache(p) => each(dropped_by, out, |c| {
            prefix_cache(p, ctx.matched(c), ctx.full_blocks, ctx.block_size_tokens)
        }),
        Scorer::KvCacheUtilization => each(dropped_by, out, |c| {
            metrics(c)
                .and_then(|m| m.kv_cache_usage)
                .map_or(0.0, |k| 1.0 - k)
        }),
        Scorer::Queue => linear(dropped_by, out, |c| {
            metrics(c).and_then(|m| m.waiting).map(f64::from)
        }),
        Scorer::RunningRequests => linear(dropped_by, out, |c| {
            metrics(c).and_then(|m| m.running).map(f64::from)
        }),
        Scorer::InflightLoad => linear(dropped_by, out, |c| {
            ctx.cands
                .get(c)
                .map(|cand| f64::from(cand.inflight.requests))
        }),
        Scorer::TokenLoad => linear(dropped_by, out, |c| {
            ctx.cands.get(c).map(|cand| cand.inflight.tokens.0 as f64)
        }),
        Scorer::SessionAffinity => each(dropped_by, out, |c| {
            let hit = ctx
                .req
                .last_endpoint_for_session
                .zip(ctx.cands.get(c))
                .is_some_and(|(last, cand)| last == cand.address);
            if hit {
                1.0
            } else {
                0.0
            }
        }),
        Scorer::LoraAffinity => lora(ctx, dropped_by, out),
        Scorer::LatencyObservation(p) => observed_latency(p, ctx, dropped_by, out),
    }
    None
}

/// `latency-observation-scorer` (see the module doc).
fn observed_latency(p: LatencyScorer, ctx: &Ctx<'_, '_>, dropped_by: &[u16], out: &mut [f64]) {
    let cost = |c: usize| {
        let l = ctx.cands.get(c)?.latency?;
        Some(l.ttft_ms + f64::from(p.tpot_tokens) * l.tpot_ms.unwrap_or(0.0))
    };
    let best = dropped_by
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == ALIVE)
        .filter_map(|(c, _)| cost(c))
        .fold(f64::INFINITY, f64::min);
    each(dropped_by, out, |c| match cost(c) {
        None => 1.0,
        Some(v) => (best + 1.0) / (v + 1.0),
    });
}

/// `prefix-cache-scorer`'s raw score for a candidate holding `matched_blocks` of the
/// request's `full_blocks`, at `block_size_tokens` per block (see the module doc).
pub fn prefix_cache(
    p: PrefixCacheScorer,
    matched_blocks: usize,
    full_blocks: usize,
    block_size_tokens: u32,
) -> f64 {
    if full_blocks == 0 {
        return 0.0;
    }
    let ratio = matched_blocks as f64 / full_blocks as f64;
    let w = p.match_length_weight;
    // Skipping the length term keeps the default score bit-for-bit the plain ratio.
    if w <= 0.0 {
        return ratio;
    }
    let tokens = matched_blocks as f64 * f64::from(block_size_tokens);
    let length = (tokens / p.match_length_scale.0.max(1) as f64).min(1.0);
    w * length * length + (1.0 - w) * ratio
}

fn each(dropped_by: &[u16], out: &mut [f64], f: impl Fn(usize) -> f64) {
    for (c, (d, o)) in dropped_by.iter().zip(out.iter_mut()).enumerate() {
        if *d == ALIVE {
            *o = clamp_score(f(c));
        }
    }
}

fn linear(dropped_by: &[u16], out: &mut [f64], load: impl Fn(usize) -> Option<f64>) {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for (c, d) in dropped_by.iter().enumerate() {
        if *d == ALIVE {
            if let Some(v) = load(c).filter(|v| !v.is_nan()) {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
    }
    let span = hi - lo;
    each(dropped_by, out, |c| match load(c).filter(|v| !v.is_nan()) {
        None => 0.0,
        Some(_) if span <= 0.0 => 1.0,
        Some(v) => (hi - v) / span,
    });
}

/// `lora-affinity-scorer`. An endpoint exposing no LoRA state cannot be shown to
/// serve the adapter and scores 0 (unless the request is for the base model).
fn lora(ctx: &Ctx<'_, '_>, dropped_by: &[u16], out: &mut [f64]) {
    let wanted = ctx.req.target_model;
    if wanted == ctx.req.base_model {
        return each(dropped_by, out, |_| 1.0);
    }
    each(dropped_by, out, |c| {
        let Some(l) = ctx
            .cands
            .get(c)
            .and_then(|cand| cand.metrics)
            .and_then(|m| m.lora.as_ref())
        else {
            return 0.0;
        };
        if l.running.iter().any(|a| a == wanted) {
            1.0
        } else if l.waiting.iter().any(|a| a == wanted) {
            0.6
        } else if (l.running.len() as u64) < u64::from(l.max) {
            0.8
        } else {
            0.0
        }
    });
}
