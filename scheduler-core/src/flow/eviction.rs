//! Which in-flight requests a blocked request may evict (`enableEviction: true`).
//!
//! The rules, as llm-d's flow controller defines eviction:
//!
//! - **Who may be evicted.** Only requests admitted in a *sheddable* band (priority below 0),
//!   and only for a request of a strictly higher band. A band of priority 0 or above is
//!   never evicted, whatever waits.
//! - **When.** A request that arrives while the pool is saturated and is queued asks for
//!   victims once, at that moment. A request admitted at once evicts nothing.
//! - **The order.** The lowest band first; within a band, the request admitted most recently
//!   first (it has received the least service, so the least work is lost).
//! - **How many.** Enough to free the capacity the waiting request needs (one request; in
//!   token mode, its tokens), and never more than [`MAX_VICTIMS_PER_DECISION`] for one
//!   waiting request. A victim is taken out of the candidates when chosen, so two waiting
//!   requests never evict the same one.
//!
//! The host keeps [`Victims`] beside the pool's admitted load: each admitted request of a
//! sheddable band is inserted with its handle, removed when it ends, and a queued request's
//! [`Victims::select`] returns the handles the host then uses to stop those requests (a 429
//! `evicted-by-priority` before their response started, a reset stream after).

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::cmp::Reverse;

/// The most requests one waiting request may evict.
pub const MAX_VICTIMS_PER_DECISION: usize = 2;

/// The wire name of an eviction (`x-llm-d-request-dropped-reason`, the billing outcome).
pub const EVICTED_BY_PRIORITY: &str = "evicted-by-priority";

/// Where one eviction candidate sits in [`Victims`]: its band and its admission order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VictimKey {
    band: i32,
    /// Later admissions sort first within a band.
    order: Reverse<u64>,
}

/// What a waiting request needs freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// One request's slot (the request-counting and utilization detectors).
    Requests(u64),
    /// This many tokens (the token-counting detector).
    Tokens(u64),
}

#[derive(Debug)]
struct Candidate<T> {
    tokens: u64,
    handle: T,
}

/// The eviction candidates of one pool: admitted requests of sheddable bands, each with the
/// host's handle `T` (module doc).
#[derive(Debug)]
pub struct Victims<T> {
    candidates: BTreeMap<VictimKey, Candidate<T>>,
    next: u64,
}

impl<T> Default for Victims<T> {
    fn default() -> Self {
        Victims {
            candidates: BTreeMap::new(),
            next: 0,
        }
    }
}

impl<T> Victims<T> {
    /// No candidates.
    pub fn new() -> Victims<T> {
        Victims::default()
    }

    /// Whether a request admitted in `band` may ever be evicted.
    pub fn sheddable(band: i32) -> bool {
        band < 0
    }

    /// Add a request admitted now in `band` (it must be [`Victims::sheddable`]; `None`
    /// otherwise), counting `tokens` in token mode.
    pub fn insert(&mut self, band: i32, tokens: u64, handle: T) -> Option<VictimKey> {
        if !Self::sheddable(band) {
            return None;
        }
        let key = VictimKey {
            band,
            order: Reverse(self.next),
        };
        self.next = self.next.wrapping_add(1);
        self.candidates.insert(key, Candidate { tokens, handle });
        Some(key)
    }

    /// The request under `key` ended (or was chosen already): no longer a candidate.
    pub fn remove(&mut self, key: VictimKey) -> Option<T> {
        self.candidates.remove(&key).map(|c| c.handle)
    }

    /// Candidates left.
    pub fn len(&self) -> usize {
        self.candidates.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.candidates.is_empty()
    }

    /// The victims for a request waiting in `band` that needs `need` freed, taken out of
    /// the candidates, in eviction order (module doc). Empty when no candidate sits in a
    /// lower sheddable band.
    pub fn select(&mut self, band: i32, need: Need) -> Vec<T> {
        let mut chosen = Vec::new();
        let mut freed = 0u64;
        let wanted = match need {
            Need::Requests(n) | Need::Tokens(n) => n.max(1),
        };
        while chosen.len() < MAX_VICTIMS_PER_DECISION && freed < wanted {
            let Some((&key, _)) = self.candidates.first_key_value() else {
                break;
            };
            if key.band >= band {
                break;
            }
            let Some(candidate) = self.candidates.remove(&key) else {
                break;
            };
            freed = freed.saturating_add(match need {
                Need::Requests(_) => 1,
                Need::Tokens(_) => candidate.tokens,
            });
            chosen.push(candidate.handle);
        }
        chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn only_sheddable_bands_are_candidates() {
        let mut v = Victims::new();
        assert!(v.insert(0, 10, "zero").is_none());
        assert!(v.insert(5, 10, "high").is_none());
        assert!(v.insert(-1, 10, "low").is_some());
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn lowest_band_then_most_recent_first() {
        let mut v = Victims::new();
        v.insert(-1, 1, "a(-1)");
        v.insert(-5, 1, "b(-5)");
        v.insert(-1, 1, "c(-1)");
        v.insert(-5, 1, "d(-5)");
        assert_eq!(v.select(0, Need::Requests(1)), ["d(-5)"]);
        assert_eq!(v.select(0, Need::Requests(1)), ["b(-5)"]);
        assert_eq!(v.select(0, Need::Requests(1)), ["c(-1)"]);
        assert_eq!(v.select(0, Need::Requests(1)), ["a(-1)"]);
        assert!(v.select(0, Need::Requests(1)).is_empty());
    }

    #[test]
    fn only_strictly_lower_bands_are_evicted() {
        let mut v = Victims::new();
        v.insert(-2, 1, "x");
        assert!(v.select(-2, Need::Requests(1)).is_empty(), "same band");
        assert!(v.select(-3, Need::Requests(1)).is_empty(), "lower waiter");
        assert_eq!(
            v.select(-1, Need::Requests(1)),
            ["x"],
            "higher sheddable waiter"
        );
    }

    #[test]
    fn tokens_are_freed_up_to_the_need_within_the_cap() {
        let mut v = Victims::new();
        for name in ["a", "b", "c"] {
            v.insert(-1, 100, name);
        }
        assert_eq!(v.select(0, Need::Tokens(150)), ["c", "b"]);
        v.insert(-1, 100, "d");
        assert_eq!(
            v.select(0, Need::Tokens(1_000)).len(),
            MAX_VICTIMS_PER_DECISION
        );
        assert!(v.is_empty());
    }

    mod props {
        use super::super::*;
        use alloc::collections::BTreeSet;
        use proptest::prelude::*;

        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        use wasm_bindgen_test::wasm_bindgen_test as test;

        /// One step: admit a request of a band with tokens, end the `i`-th live one, or a
        /// waiter of a band asks for victims (in requests or in tokens).
        #[derive(Clone, Debug)]
        enum Op {
            Admit(i32, u64),
            End(usize),
            Select(i32, bool, u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (-4i32..3, 1u64..500).prop_map(|(b, t)| Op::Admit(b, t)),
                (0usize..32).prop_map(Op::End),
                (-4i32..3, any::<bool>(), 0u64..1200).prop_map(|(b, tok, n)| Op::Select(b, tok, n)),
            ]
        }

        proptest! {
            /// Whatever the sequence: a victim is sheddable and below the waiter's band, is
            /// chosen once and only while admitted, at most two per decision, lowest band
            /// then latest admission first, and no more than the need calls for.
            #[test]
            fn victims_follow_the_rules(ops in proptest::collection::vec(op(), 0..80)) {
                let mut v: Victims<u64> = Victims::new();
                // Live candidates: id → (key, band, tokens, admission order).
                let mut live: Vec<(u64, VictimKey, i32, u64)> = Vec::new();
                let mut chosen: BTreeSet<u64> = BTreeSet::new();
                let mut next = 0u64;
                for op in ops {
                    match op {
                        Op::Admit(band, tokens) => {
                            next += 1;
                            match v.insert(band, tokens, next) {
                                Some(key) => live.push((next, key, band, tokens)),
                                None => prop_assert!(band >= 0),
                            }
                        }
                        Op::End(i) => {
                            if !live.is_empty() {
                                let (id, key, ..) = live.remove(i % live.len());
                                prop_assert_eq!(v.remove(key), Some(id));
                            }
                        }
                        Op::Select(band, tokens, n) => {
                            let need = if tokens { Need::Tokens(n) } else { Need::Requests(n) };
                            let mut eligible: Vec<_> = live
                                .iter()
                                .filter(|c| c.2 < band)
                                .copied()
                                .collect();
                            eligible.sort_by_key(|c| (c.2, core::cmp::Reverse(c.0)));
                            let got = v.select(band, need);
                            prop_assert!(got.len() <= MAX_VICTIMS_PER_DECISION);
                            let want = n.max(1);
                            let mut freed = 0u64;
                            for (k, id) in got.iter().enumerate() {
                                prop_assert_eq!(Some(*id), eligible.get(k).map(|c| c.0));
                                prop_assert!(freed < want, "no victim beyond the need");
                                freed += if tokens { eligible[k].3 } else { 1 };
                                prop_assert!(chosen.insert(*id), "chosen once");
                            }
                            if got.len() < MAX_VICTIMS_PER_DECISION && freed < want {
                                prop_assert_eq!(got.len(), eligible.len(), "stops only when none is left");
                            }
                            live.retain(|c| !got.contains(&c.0));
                        }
                    }
                    prop_assert_eq!(v.len(), live.len());
                }
            }
        }
    }

    #[test]
    fn a_removed_request_is_never_chosen() {
        let mut v = Victims::new();
        let a = v.insert(-1, 1, "a");
        v.insert(-1, 1, "b");
        if let Some(a) = a {
            assert_eq!(v.remove(a), Some("a"));
            assert_eq!(v.remove(a), None);
        }
        assert_eq!(v.select(0, Need::Requests(5)), ["b"]);
    }
}
