//! Choosing one target of a rule by its weights: sticky (one target per key, by weighted
//! rendezvous hashing) or per request (a fresh weighted draw).
//!
//! **Sticky.** Every target `t` of weight `w > 0` scores `-w / ln(u(key, t))`, where
//! `u(key, t)` in (0, 1) comes from a fixed 64-bit hash of the key and the target's name;
//! the highest score wins. Each target then wins a share `w / Σw` of the keys, and a key's
//! winner depends only on the key and the targets' names and weights: no state, the same
//! answer in every worker and process, on wasm32 as on x86_64. Raising one target's weight
//! only raises its scores, so the keys that move, move onto it; a weight 0 target never
//! scores, so setting a canary to 0 (a rollback) moves exactly its keys back.
//!
//! The hash is XXH3-64 with its default secret and seed 0 (the prefix hash's function,
//! never a randomly keyed hasher), over
//! `"infergate-split-v1" ‖ le8(len(key)) ‖ key ‖ le8(len(target)) ‖ target`; its top 53 bits
//! `b` give `u = (b + 0.5) / 2⁵³`.
//!
//! **Split key.** [`split_key`] is the value of `x-gateway-split-key`, for Envoy's weighted
//! clusters to hash on: XXH3-64 of `"infergate-split-key-v1" ‖ key`.

use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

/// Domain separator of the rendezvous hash; bump the version if the algorithm changes.
const SPLIT_DOMAIN: &[u8] = b"infergate-split-v1";
/// Domain separator of the split-key header's hash.
const SPLIT_KEY_DOMAIN: &[u8] = b"infergate-split-key-v1";

/// How a rule's weights are applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SplitMode {
    /// One target per sticky key; per request only when there is no key.
    #[default]
    Sticky,
    /// A fresh weighted draw for every request (llm-d's behaviour).
    PerRequest,
}

/// The router's `split` setting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SplitConfig {
    /// Sticky (default) or per request.
    #[serde(default)]
    pub mode: SplitMode,
    /// The request header whose value is the sticky key (e.g. `x-session-id`); without it
    /// (or when a request lacks it) the fairness id the auth stage set is the key.
    #[serde(default)]
    pub session_header: Option<String>,
}

/// A target's name and weight, as the choice needs them.
pub trait Weighted {
    /// The target model name.
    fn name(&self) -> &str;
    /// Its weight (0: never chosen).
    fn weight(&self) -> u32;
}

/// The fixed hash of (`key`, `target`), see the module doc.
fn pair_hash(key: &[u8], target: &str) -> u64 {
    let mut buf = Vec::with_capacity(SPLIT_DOMAIN.len() + 16 + key.len() + target.len());
    buf.extend_from_slice(SPLIT_DOMAIN);
    buf.extend_from_slice(&(key.len() as u64).to_le_bytes());
    buf.extend_from_slice(key);
    buf.extend_from_slice(&(target.len() as u64).to_le_bytes());
    buf.extend_from_slice(target.as_bytes());
    xxh3_64(&buf)
}

/// `h` mapped into the open interval (0, 1).
fn unit(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// The index of the target `key` sticks to, `None` if every weight is 0.
pub fn choose_sticky<T: Weighted>(key: &[u8], targets: &[T]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, t) in targets.iter().enumerate() {
        if t.weight() == 0 {
            continue;
        }
        // ln(u) < 0 for u in (0, 1): the score is positive, larger for larger weights.
        let score = -f64::from(t.weight()) / unit(pair_hash(key, t.name())).ln();
        if best.is_none_or(|(_, s)| score > s) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

/// The index of the target a uniform draw `draw` picks by weight, `None` if every weight
/// is 0.
pub fn choose_by_draw<T: Weighted>(draw: u64, targets: &[T]) -> Option<usize> {
    let total: u64 = targets.iter().map(|t| u64::from(t.weight())).sum();
    if total == 0 {
        return None;
    }
    // Multiply-shift instead of `%`: no modulo bias worth naming, and no division.
    let mut at = ((u128::from(draw) * u128::from(total)) >> 64) as u64;
    for (i, t) in targets.iter().enumerate() {
        let w = u64::from(t.weight());
        if at < w {
            return Some(i);
        }
        at -= w;
    }
    None
}

/// The `x-gateway-split-key` value of a sticky key.
pub fn split_key(key: &[u8]) -> u64 {
    let mut buf = Vec::with_capacity(SPLIT_KEY_DOMAIN.len() + key.len());
    buf.extend_from_slice(SPLIT_KEY_DOMAIN);
    buf.extend_from_slice(key);
    xxh3_64(&buf)
}
