//! Scorer semantics. Each scorer writes a raw score in [0, 1] for every candidate still
//! alive in the profile (NaN and out-of-range values are clamped: NaN → 0).
//!
//! "Linear" scorers (`queue-scorer`, `running-requests-scorer`, `inflight-load-scorer`,
//! `token-load-scorer`) rank the remaining candidates: least loaded → 1, most loaded → 0,
//! linear in between; all equal → 1 for all.
//!
//! Missing metrics: a scorer that needs a scraped metric gives 0 to an endpoint whose value
//! is unknown (and leaves it out of the linear ranking's min/max), so an endpoint we know
//! nothing about is still routable but never preferred over one that reports being idle.
//! In-flight load is the proxy's own bookkeeping and is always known.

use super::filter::ALIVE;
use super::plugins::Scorer;
use super::run::Ctx;

/// Clamps a raw score into [0, 1]; NaN → 0.
pub fn clamp_score(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// Writes scorer `s`'s raw scores for the alive candidates into `out` (one slot per candidate).
pub(crate) fn score(s: Scorer, ctx: &Ctx<'_, '_>, dropped_by: &[u16], out: &mut [f64]) {
    let metrics = |c: usize| ctx.cands.get(c).and_then(|cand| cand.metrics);
    match s {
        Scorer::PrefixCache => each(dropped_by, out, |c| {
            if ctx.full_blocks == 0 {
                0.0
            } else {
                ctx.matched(c) as f64 / ctx.full_blocks as f64
            }
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
    }
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
