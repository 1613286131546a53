//! The picker as first written (one scan over every candidate per round), kept as the
//! reference the contender-based [`super::pick`] must agree with, draw for draw.

use alloc::vec::Vec;
use proptest::prelude::*;

use super::super::input::ALIVE;
use super::super::plugins::{Picker, PickerKind};
use super::{SplitMix64, TIE_EPSILON};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Runs picker `p` over the alive candidates: the pick first, then up to `maxFallbacks`
/// fallbacks in order (empty when no candidate is alive).
fn reference_pick(
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

/// A total drawn from a small set, so ties, near-ties (within and beyond the tie
/// epsilon), NaN, infinities and negatives all occur often.
fn total() -> impl Strategy<Value = f64> {
    prop_oneof![
        (0u8..4).prop_map(f64::from),
        (0u8..4).prop_map(|x| f64::from(x) + 1e-12),
        (0u8..4).prop_map(|x| f64::from(x) * (1.0 - 5e-10)),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        (-3i8..0).prop_map(f64::from),
        (0.0f64..10.0),
    ]
}

proptest! {
    #[test]
    fn contender_picker_agrees_with_full_scans(
        cands in proptest::collection::vec((total(), 0u8..4), 0..40),
        kind in 0u8..3,
        max_fallbacks in 0u32..6,
        seed in any::<u64>(),
    ) {
        let kind = [PickerKind::MaxScore, PickerKind::WeightedRandom, PickerKind::Random]
            [usize::from(kind)];
        let p = Picker { kind, max_fallbacks };
        let totals: Vec<f64> = cands.iter().map(|c| c.0).collect();
        // A quarter of the candidates dropped by some filter.
        let dropped: Vec<u16> = cands.iter().map(|c| if c.1 == 0 { 0 } else { ALIVE }).collect();
        let (mut a, mut b) = (SplitMix64::new(seed), SplitMix64::new(seed));
        prop_assert_eq!(super::pick(p, &totals, &dropped, &mut a), reference_pick(p, &totals, &dropped, &mut b));
        // The generator is left in the same state, so a later profile draws the same.
        prop_assert_eq!(a.next_u64(), b.next_u64());
    }
}
