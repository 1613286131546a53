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

use super::filter::ALIVE;
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
pub(crate) fn pick(
    p: Picker,
    totals: &[f64],
    dropped_by: &[u16],
    rng: &mut SplitMix64,
) -> Vec<usize> {
    let alive = dropped_by.iter().filter(|d| **d == ALIVE).count();
    let rounds = alive.min(1 + p.max_fallbacks as usize);
    let mut chosen: Vec<usize> = Vec::with_capacity(rounds);
    while chosen.len() < rounds {
        let eligible = |c: usize| dropped_by.get(c) == Some(&ALIVE) && !chosen.contains(&c);
        let next = match p.kind {
            PickerKind::MaxScore => max_score(totals, &eligible, rng),
            PickerKind::WeightedRandom => weighted(totals, &eligible, rng),
            PickerKind::Random => nth_eligible(dropped_by.len(), &eligible, rng),
        };
        match next {
            Some(c) => chosen.push(c),
            None => break,
        }
    }
    chosen
}

fn max_score(
    totals: &[f64],
    eligible: &impl Fn(usize) -> bool,
    rng: &mut SplitMix64,
) -> Option<usize> {
    // A NaN total ranks below every number, so it can neither win nor poison the threshold.
    let total = |c: usize| match totals.get(c) {
        Some(t) if !t.is_nan() => *t,
        _ => f64::NEG_INFINITY,
    };
    let mut best = f64::NEG_INFINITY;
    let mut any = false;
    for c in 0..totals.len() {
        if eligible(c) {
            any = true;
            best = best.max(total(c));
        }
    }
    if !any {
        return None;
    }
    // An infinite best gives ∞ − ∞ = NaN, which nothing is ≥; then only a tie with the best counts.
    let floor = match best - TIE_EPSILON * best.abs().max(1.0) {
        f if f.is_nan() => best,
        f => f,
    };
    let is_top = |c: usize| eligible(c) && total(c) >= floor;
    nth_eligible(totals.len(), &is_top, rng)
}

fn weighted(
    totals: &[f64],
    eligible: &impl Fn(usize) -> bool,
    rng: &mut SplitMix64,
) -> Option<usize> {
    let weight = |t: f64| if t.is_nan() || t < 0.0 { 0.0 } else { t };
    let sum: f64 = totals
        .iter()
        .enumerate()
        .filter(|(c, _)| eligible(*c))
        .map(|(_, t)| weight(*t))
        .sum();
    if sum <= 0.0 || !sum.is_finite() {
        return nth_eligible(totals.len(), eligible, rng);
    }
    let target = rng.unit() * sum;
    let mut acc = 0.0;
    let mut last = None;
    for (c, t) in totals.iter().enumerate() {
        if !eligible(c) || weight(*t) <= 0.0 {
            continue;
        }
        acc += weight(*t);
        last = Some(c);
        if target < acc {
            return Some(c);
        }
    }
    // Rounding can leave `target` a hair above the accumulated sum.
    last
}

/// A uniformly random index among `0..n` satisfying `ok`.
fn nth_eligible(n: usize, ok: &impl Fn(usize) -> bool, rng: &mut SplitMix64) -> Option<usize> {
    let count = (0..n).filter(|c| ok(*c)).count();
    if count == 0 {
        return None;
    }
    let k = rng.below(count);
    (0..n).filter(|c| ok(*c)).nth(k)
}
