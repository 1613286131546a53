//! Picker semantics and the request-local PRNG.
//!
//! The caller's RNG draws one `u64` per request; everything random in a decision (ties,
//! weighted and uniform draws, fallback order) comes from a [`SplitMix64`] seeded with it,
//! so a decision is reproducible from its inputs.
//!
//! After the pick, the same rule is applied again to the remaining candidates, up to
//! `maxFallbacks` times, to produce the ordered fallback list (for the
//! `x-gateway-destination-endpoint` header): next-highest totals for `max-score-picker`,
//! weighted draws without replacement for `weighted-random-picker`, uniform draws for
//! `random-picker`.

use alloc::vec::Vec;

use super::input::ALIVE;
use super::plugins::{Picker, PickerKind};

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny, fast, well-mixed generator; ample for
/// tie-breaking and weighted draws, and identical on every target.
#[derive(Clone, Copy, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0), by multiply-shift (bias < n / 2^64).
    pub fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Totals within this relative distance of the best count as a tie (float sums of equal
/// scores in a different order may differ in the last bits).
const TIE_EPSILON: f64 = 1e-9;

/// Runs picker `p` over the alive candidates: the pick first, then up to `maxFallbacks`
/// fallbacks in order (empty when no candidate is alive).
///
/// Cost: one pass to gather the contenders, then per round one to three passes over the
/// contenders only. For `max-score-picker` the contenders are the alive candidates whose
/// total reaches the tie floor of the `rounds`-th best total: no round's tie set can
/// reach below it (the floor only rises with the best total, and round `r`'s best is at
/// least the `r + 1`-th best overall), so the choices, and the random draws behind them,
/// are exactly those of a scan over every candidate in every round.
pub(crate) fn pick(
    p: Picker,
    totals: &[f64],
    dropped_by: &[u16],
    rng: &mut SplitMix64,
) -> Vec<usize> {
    let alive = dropped_by.iter().filter(|d| **d == ALIVE).count();
    let rounds = alive.min(1 + p.max_fallbacks as usize);
    let mut chosen: Vec<usize> = Vec::with_capacity(rounds);
    if rounds == 0 {
        return chosen;
    }
    // Contenders in candidate order, so every draw sees them in the order a full scan would.
    let mut pool: Vec<(usize, f64)> = match p.kind {
        PickerKind::MaxScore => {
            let floor = tie_floor(kth_best(totals, dropped_by, rounds));
            alive_totals(totals, dropped_by)
                .map(|(c, t)| (c, rank_total(t)))
                .filter(|&(_, t)| t >= floor)
                .collect()
        }
        PickerKind::WeightedRandom => alive_totals(totals, dropped_by).collect(),
        PickerKind::Random => dropped_by
            .iter()
            .enumerate()
            .filter(|(_, d)| **d == ALIVE)
            .map(|(c, _)| (c, 0.0))
            .collect(),
    };
    while chosen.len() < rounds {
        let next = match p.kind {
            PickerKind::MaxScore => max_score(&pool, rng),
            PickerKind::WeightedRandom => weighted(&pool, rng),
            PickerKind::Random => uniform(pool.len(), rng),
        };
        match next {
            Some(i) if i < pool.len() => chosen.push(pool.remove(i).0),
            _ => break,
        }
    }
    chosen
}

/// The alive candidates with their totals, in candidate order.
fn alive_totals<'t>(
    totals: &'t [f64],
    dropped_by: &'t [u16],
) -> impl Iterator<Item = (usize, f64)> + 't {
    totals
        .iter()
        .zip(dropped_by)
        .enumerate()
        .filter(|(_, (_, d))| **d == ALIVE)
        .map(|(c, (t, _))| (c, *t))
}

/// A total as `max-score-picker` ranks it: NaN ranks below every number, so it can neither
/// win nor poison the threshold.
fn rank_total(t: f64) -> f64 {
    if t.is_nan() {
        f64::NEG_INFINITY
    } else {
        t
    }
}

/// The lowest total that ties with `best`. Non-decreasing in `best`, and never above it.
fn tie_floor(best: f64) -> f64 {
    // An infinite best gives ∞ − ∞ = NaN, which nothing is ≥; then only a tie with the best counts.
    match best - TIE_EPSILON * best.abs().max(1.0) {
        f if f.is_nan() => best,
        f => f,
    }
}

/// The `k`-th best ranked total among the alive candidates (`k` ≥ 1, at most the alive
/// count; −∞ otherwise), keeping only the best `k` seen so far.
fn kth_best(totals: &[f64], dropped_by: &[u16], k: usize) -> f64 {
    let mut best: Vec<f64> = Vec::with_capacity(k);
    for (_, t) in alive_totals(totals, dropped_by) {
        let t = rank_total(t);
        if best.len() == k {
            match best.last() {
                Some(&low) if t > low => {
                    best.pop();
                }
                _ => continue,
            }
        }
        let at = best.iter().position(|&b| t > b).unwrap_or(best.len());
        best.insert(at, t);
    }
    match best.get(k.wrapping_sub(1)) {
        Some(&t) if best.len() == k => t,
        _ => f64::NEG_INFINITY,
    }
}

/// Position (in `pool`) of a uniformly random contender among those tying with the best.
fn max_score(pool: &[(usize, f64)], rng: &mut SplitMix64) -> Option<usize> {
    if pool.is_empty() {
        return None;
    }
    let best = pool.iter().fold(f64::NEG_INFINITY, |b, &(_, t)| b.max(t));
    let floor = tie_floor(best);
    let count = pool.iter().filter(|(_, t)| *t >= floor).count();
    if count == 0 {
        return None;
    }
    let k = rng.below(count);
    pool.iter()
        .enumerate()
        .filter(|(_, (_, t))| *t >= floor)
        .nth(k)
        .map(|(i, _)| i)
}

/// Position (in `pool`) of a draw with probability ∝ total (uniform when no total is
/// positive, or their sum is not finite).
fn weighted(pool: &[(usize, f64)], rng: &mut SplitMix64) -> Option<usize> {
    let weight = |t: f64| if t.is_nan() || t < 0.0 { 0.0 } else { t };
    let sum: f64 = pool.iter().map(|&(_, t)| weight(t)).sum();
    if sum <= 0.0 || !sum.is_finite() {
        return uniform(pool.len(), rng);
    }
    let target = rng.unit() * sum;
    let mut acc = 0.0;
    let mut last = None;
    for (i, &(_, t)) in pool.iter().enumerate() {
        if weight(t) <= 0.0 {
            continue;
        }
        acc += weight(t);
        last = Some(i);
        if target < acc {
            return Some(i);
        }
    }
    // Rounding can leave `target` a hair above the accumulated sum.
    last
}

/// A uniformly random position among `0..n` (`None` when `n` is 0).
fn uniform(n: usize, rng: &mut SplitMix64) -> Option<usize> {
    if n == 0 {
        return None;
    }
    Some(rng.below(n))
}

#[cfg(test)]
pub(crate) mod reference;
