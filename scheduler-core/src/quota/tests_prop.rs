//! Property tests of the quota buckets: conservation over any sequence of admits and
//! settles, exact refill, `retry-after` that is enough and not more, and the encoding.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use super::*;
use crate::types::Millis;
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// One step of a random schedule.
#[derive(Clone, Debug)]
enum Op {
    /// Advance the clock by this many ms (negative: backwards), then admit this debit.
    Admit { dt: i64, debit: u64 },
    /// Advance the clock, then settle the in-flight request at this index (modulo) with
    /// this actual usage.
    Settle { dt: i64, which: usize, actual: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (-2_000i64..20_000, 0u64..5_000).prop_map(|(dt, debit)| Op::Admit { dt, debit }),
        (-2_000i64..20_000, any::<usize>(), 0u64..8_000)
            .prop_map(|(dt, which, actual)| { Op::Settle { dt, which, actual } }),
    ]
}

fn limit() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![
        1 => Just(None),
        4 => (1u64..20_000).prop_map(Some),
        1 => Just(Some(u64::MAX)),
    ]
}

fn move_clock(now: Millis, dt: i64) -> Millis {
    if dt >= 0 {
        Millis(now.0.saturating_add(dt.unsigned_abs()))
    } else {
        Millis(now.0.saturating_sub(dt.unsigned_abs()))
    }
}

fn cap(limit: Option<u64>) -> i128 {
    limit.map_or(0, |l| i128::from(l) * UNITS_PER_TOKEN)
}

/// Checks one refill step against the rate and the capacity; returns the units added.
fn checked_refill(before: i128, after: i128, limit: Option<u64>, elapsed: u64) -> i128 {
    let Some(l) = limit else {
        assert_eq!(after, before, "no limit, no refill");
        return 0;
    };
    let added = after - before;
    let at_rate = i128::from(elapsed).saturating_mul(i128::from(l));
    assert!(added >= 0, "refill never removes");
    assert!(added <= at_rate, "refill at most the rate");
    assert!(after <= cap(limit), "refill never above capacity");
    assert!(
        added == at_rate || after == cap(limit),
        "short of the rate only at capacity"
    );
    added
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// For any schedule, each level's final value is the initial one plus the refills
    /// minus the debits plus the refunds (capped at capacity, as documented), and in-flight
    /// counts admits minus settles.
    #[test]
    fn conservation(rpm in limit(), tpm in limit(), concurrency in prop::option::of(0u64..6),
                    ops in prop::collection::vec(op(), 1..80)) {
        let l = Limits { rpm, tpm, concurrency };
        let mut now = Millis(1_000_000);
        let mut s = QuotaState::full(&l, now);
        let (start_req, start_tok) = (s.request_units(), s.token_units());
        let (mut refilled_req, mut refilled_tok) = (0i128, 0i128);
        let (mut admitted, mut debited) = (0i128, 0i128);
        let (mut refunded, mut dropped_at_cap) = (0i128, 0i128);
        let mut in_flight: Vec<u64> = Vec::new();
        let mut latest = now;
        for op in ops {
            let dt = match op { Op::Admit { dt, .. } | Op::Settle { dt, .. } => dt };
            now = move_clock(now, dt);
            let elapsed = now.since(latest);
            latest = latest.max(now);
            let before = s;
            s.refill(&l, now);
            refilled_req += checked_refill(before.request_units(), s.request_units(), rpm, elapsed);
            refilled_tok += checked_refill(before.token_units(), s.token_units(), tpm, elapsed);
            let refilled = s;
            match op {
                Op::Admit { debit, .. } => match s.admit(&l, debit, now) {
                    Ok(_) => {
                        admitted += 1;
                        in_flight.push(debit);
                        if tpm.is_some() {
                            debited += i128::from(debit) * UNITS_PER_TOKEN;
                        }
                    }
                    Err(_) => prop_assert_eq!(s, refilled, "a rejection changes nothing"),
                },
                Op::Settle { which, actual, .. } => {
                    if in_flight.is_empty() {
                        continue;
                    }
                    let pre = in_flight.swap_remove(which % in_flight.len());
                    s.settle(&l, pre, actual, now);
                    if tpm.is_some() {
                        let refund = (i128::from(pre) - i128::from(actual)) * UNITS_PER_TOKEN;
                        let applied = s.token_units() - refilled.token_units();
                        prop_assert!(applied <= refund);
                        if applied < refund {
                            prop_assert_eq!(s.token_units(), cap(tpm), "only the cap drops a refund");
                        }
                        refunded += refund;
                        dropped_at_cap += refund - applied;
                    }
                }
            }
            prop_assert_eq!(s.in_flight(), in_flight.len() as u64);
        }
        let req_debits = if rpm.is_some() { admitted * UNITS_PER_TOKEN } else { 0 };
        prop_assert_eq!(s.request_units(), start_req + refilled_req - req_debits);
        prop_assert_eq!(
            s.token_units(),
            start_tok + refilled_tok - debited + refunded - dropped_at_cap
        );
    }

    /// From an empty bucket, refill after t ms is exactly t x limit units (capped), and
    /// refilling in pieces is the same as refilling at once.
    #[test]
    fn refill_at_the_exact_rate(tpm in 1u64..10_000_000, t in 0u64..200_000,
                                cuts in prop::collection::vec(0u64..200_000, 0..8)) {
        let l = Limits { rpm: None, tpm: Some(tpm), concurrency: None };
        let t0 = Millis(500);
        let mut s = QuotaState::full(&l, t0);
        s.admit(&l, tpm, t0).unwrap();
        prop_assert_eq!(s.token_units(), 0);
        let mut pieces = s;
        let mut at = Vec::from_iter(cuts.into_iter().map(|c| c % (t + 1)));
        at.sort_unstable();
        for c in at {
            pieces.refill(&l, Millis(t0.0 + c));
        }
        pieces.refill(&l, Millis(t0.0 + t));
        s.refill(&l, Millis(t0.0 + t));
        let expected = (i128::from(t) * i128::from(tpm)).min(cap(Some(tpm)));
        prop_assert_eq!(s.token_units(), expected);
        prop_assert_eq!(pieces, s);
        let info = s.info(&l, Millis(t0.0 + t));
        prop_assert_eq!(i128::from(info.remaining_tokens), expected / UNITS_PER_TOKEN);
    }

    /// `retry_after_s` later, the bucket that refused a request admits it (the other may
    /// still refuse: each answer names its own bucket's wait), and (when that is more than
    /// a second) not a second earlier.
    #[test]
    fn retry_after_is_enough_and_tight(rpm in prop::option::of(1u64..5_000),
                                       tpm in 1u64..100_000,
                                       debits in prop::collection::vec(0u64..150_000, 1..40),
                                       gap in 0u64..3_000) {
        let l = Limits { rpm, tpm: Some(tpm), concurrency: None };
        let mut now = Millis(10_000);
        let mut s = QuotaState::full(&l, now);
        for debit in debits {
            now = Millis(now.0 + gap);
            let Err(r) = s.admit(&l, debit, now) else { continue };
            prop_assert!(r.retry_after_s >= 1);
            let later = Millis(now.0 + r.retry_after_s * 1000);
            let mut probe = s;
            if let Err(again) = probe.admit(&l, debit, later) {
                prop_assert_eq!(r.reason, QuotaReason::Rpm, "{:?} after {} s", r, r.retry_after_s);
                prop_assert_eq!(again.reason, QuotaReason::Tpm);
            }
            if r.retry_after_s > 1 {
                let mut early = s;
                let sooner = Millis(later.0 - 1000);
                prop_assert_eq!(early.admit(&l, debit, sooner).map_err(|e| e.reason), Err(r.reason));
            }
        }
    }

    /// Remaining values never exceed the limit, and never underflow.
    #[test]
    fn info_is_within_the_limits(bytes in prop::collection::vec(any::<u8>(), 48),
                                 rpm in limit(), tpm in limit(), now in any::<u64>()) {
        let mut encoded = vec![1u8];
        encoded.extend_from_slice(&bytes);
        let s = QuotaState::decode(&encoded).unwrap();
        let l = Limits { rpm, tpm, concurrency: None };
        let info = s.info(&l, Millis(now));
        prop_assert!(info.remaining_requests <= rpm.unwrap_or(0));
        prop_assert!(info.remaining_tokens <= tpm.unwrap_or(0));
        prop_assert_eq!(info.headers().len(), 3 * (usize::from(rpm.is_some()) + usize::from(tpm.is_some())));
    }

    /// Every state survives the encoding; any bytes decode without panicking, and what
    /// decodes re-encodes to the same bytes.
    #[test]
    fn encoding_round_trips(bytes in prop::collection::vec(any::<u8>(), 0..80),
                            debit in any::<u64>(), now in any::<u64>()) {
        if let Some(s) = QuotaState::decode(&bytes) {
            prop_assert_eq!(&s.encode()[..], &bytes[..]);
            let l = Limits { rpm: Some(10), tpm: Some(1000), concurrency: Some(3) };
            let mut s = s;
            let _ = s.admit(&l, debit, Millis(now));
            s.settle(&l, debit, debit / 2, Millis(now));
            prop_assert_eq!(QuotaState::decode(&s.encode()), Some(s));
        }
        let l = Limits { rpm: Some(now % 100), tpm: Some(debit), concurrency: None };
        let mut s = QuotaState::full(&l, Millis(now));
        let _ = s.admit(&l, debit, Millis(now));
        prop_assert_eq!(QuotaState::decode(&s.encode()), Some(s));
    }
}
