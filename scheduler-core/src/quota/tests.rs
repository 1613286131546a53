//! Unit tests of the quota buckets, the pre-debit and the rate-limit headers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use super::*;
use crate::types::Millis;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn limits(rpm: Option<u64>, tpm: Option<u64>, concurrency: Option<u64>) -> Limits {
    Limits {
        rpm,
        tpm,
        concurrency,
    }
}

const T0: Millis = Millis(1_000_000);

fn at(ms_after_t0: u64) -> Millis {
    Millis(T0.0 + ms_after_t0)
}

#[test]
fn dropped_reasons_and_types() {
    assert_eq!(QuotaReason::Rpm.dropped_reason(), "rejected-quota-rpm");
    assert_eq!(QuotaReason::Tpm.dropped_reason(), "rejected-quota-tpm");
    assert_eq!(
        QuotaReason::Concurrency.dropped_reason(),
        "rejected-quota-concurrency"
    );
    assert_eq!(QuotaReason::Rpm.openai_type(), "requests");
    assert_eq!(QuotaReason::Tpm.openai_type(), "tokens");
    assert_eq!(QuotaReason::Concurrency.openai_type(), "requests");
}

#[test]
fn pre_debit_takes_requested_or_default_capped() {
    assert_eq!(pre_debit(100, Some(50), 1024, 1, None), 150);
    assert_eq!(pre_debit(100, None, 1024, 1, None), 1124);
    assert_eq!(pre_debit(100, Some(5000), 1024, 1, Some(2048)), 2148);
    assert_eq!(pre_debit(100, None, 1024, 1, Some(10)), 110);
    assert_eq!(pre_debit(u64::MAX, Some(u64::MAX), 0, 1, None), u64::MAX);
}

#[test]
fn pre_debit_counts_every_output_sequence() {
    // n = 8 × max_completion_tokens 400: the engine may generate 3,200 tokens.
    assert_eq!(pre_debit(5, Some(400), 64, 8, None), 3205);
    assert_eq!(pre_debit(5, Some(400), 64, 8, Some(4000)), 3205);
    // The tenant's default per sequence, times the sequences.
    assert_eq!(pre_debit(5, None, 64, 8, None), 517);
    // The cap bounds the whole output part.
    assert_eq!(pre_debit(5, Some(400), 64, 16, Some(4000)), 4005);
    // 0 sequences count as one; huge counts saturate.
    assert_eq!(pre_debit(5, Some(400), 64, 0, None), 405);
    assert_eq!(pre_debit(5, Some(u64::MAX), 0, u32::MAX, None), u64::MAX);
    assert_eq!(pre_debit(5, Some(u64::MAX / 2), 0, 3, Some(7)), 12);
}

#[test]
fn full_bucket_reports_full_and_no_reset() {
    let l = limits(Some(60), Some(6000), Some(2));
    let s = QuotaState::full(&l, T0);
    let info = s.info(&l, T0);
    assert_eq!(
        info,
        RateLimitInfo {
            limit_requests: Some(60),
            remaining_requests: 60,
            reset_requests_ms: 0,
            limit_tokens: Some(6000),
            remaining_tokens: 6000,
            reset_tokens_ms: 0,
        }
    );
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn admit_debits_and_reports_after_the_debit() {
    let l = limits(Some(60), Some(6000), None);
    let mut s = QuotaState::full(&l, T0);
    let info = s.admit(&l, 600, T0).unwrap();
    assert_eq!(info.remaining_requests, 59);
    assert_eq!(info.remaining_tokens, 5400);
    // 60 rpm = 1 request per second back; 6000 tpm = 100 tokens per second back.
    assert_eq!(info.reset_requests_ms, 1000);
    assert_eq!(info.reset_tokens_ms, 6000);
    assert_eq!(s.in_flight(), 1);
}

#[test]
fn rpm_rejects_when_empty_then_admits_after_one_request_refills() {
    let l = limits(Some(2), None, None);
    let mut s = QuotaState::full(&l, T0);
    s.admit(&l, 0, T0).unwrap();
    s.admit(&l, 0, T0).unwrap();
    let before = s;
    let r = s.admit(&l, 0, T0).unwrap_err();
    assert_eq!(r.reason, QuotaReason::Rpm);
    // 2 rpm: one request every 30 s.
    assert_eq!(r.retry_after_s, 30);
    assert_eq!(r.info.remaining_requests, 0);
    assert_eq!(r.info.reset_requests_ms, 60_000);
    assert_eq!(s, before, "a rejection changes nothing");
    assert!(s.admit(&l, 0, at(29_999)).is_err());
    assert!(s.admit(&l, 0, at(30_000)).is_ok());
}

#[test]
fn tpm_rejects_a_debit_above_the_balance_and_names_the_wait() {
    let l = limits(None, Some(60_000), None); // 1000 tokens per second
    let mut s = QuotaState::full(&l, T0);
    s.admit(&l, 59_000, T0).unwrap();
    let r = s.admit(&l, 2500, T0).unwrap_err();
    assert_eq!(r.reason, QuotaReason::Tpm);
    assert_eq!(r.info.remaining_tokens, 1000);
    // 1500 tokens missing at 1000 per second: 1.5 s, rounded up.
    assert_eq!(r.retry_after_s, 2);
    assert!(s.admit(&l, 2500, at(1499)).is_err());
    assert!(s.admit(&l, 2500, at(1500)).is_ok());
}

#[test]
fn debit_above_capacity_is_admitted_only_when_full() {
    let l = limits(None, Some(1000), None);
    let mut s = QuotaState::full(&l, T0);
    s.admit(&l, 1, T0).unwrap();
    let r = s.admit(&l, 5000, T0).unwrap_err();
    assert_eq!(r.reason, QuotaReason::Tpm);
    // One token missing from a full bucket, at 1000/60 per second: 60 ms, so 1 s.
    assert_eq!(r.retry_after_s, 1);
    let info = s.admit(&l, 5000, at(60)).unwrap();
    assert_eq!(info.remaining_tokens, 0, "clamped at 0");
    assert_eq!(s.token_units(), (1000 - 5000) * UNITS_PER_TOKEN);
    // 5000 tokens owed: refilled at 1000 per minute, the next full bucket is 5 min away.
    assert_eq!(info.reset_tokens_ms, 300_000);
    let r = s.admit(&l, 1, at(60)).unwrap_err();
    assert_eq!(r.retry_after_s, 4 * 60 + 1);
}

#[test]
fn concurrency_counts_in_flight_and_settle_frees_a_slot() {
    let l = limits(None, None, Some(2));
    let mut s = QuotaState::full(&l, T0);
    s.admit(&l, 10, T0).unwrap();
    s.admit(&l, 10, T0).unwrap();
    let r = s.admit(&l, 10, T0).unwrap_err();
    assert_eq!(r.reason, QuotaReason::Concurrency);
    assert_eq!(r.retry_after_s, 1);
    s.settle(&l, 10, 7, at(5));
    assert_eq!(s.in_flight(), 1);
    assert!(s.admit(&l, 10, at(5)).is_ok());
    // No limits report no headers.
    assert!(r.info.headers().is_empty());
}

#[test]
fn checks_run_rpm_then_tpm_then_concurrency() {
    let l = limits(Some(1), Some(10), Some(0));
    let mut s = QuotaState::full(&l, T0);
    assert_eq!(
        s.admit(&l, 1, T0).unwrap_err().reason,
        QuotaReason::Concurrency
    );
    let mut s2 = QuotaState::full(&l, T0);
    assert_eq!(
        s2.admit(&l, 11, at(1)).unwrap_err().reason,
        QuotaReason::Concurrency
    );
    let l = limits(Some(1), Some(10), Some(5));
    s.admit(&l, 10, T0).unwrap();
    assert_eq!(s.admit(&l, 10, T0).unwrap_err().reason, QuotaReason::Rpm);
    let l2 = limits(Some(100), Some(10), Some(5));
    let mut s3 = QuotaState::full(&l2, T0);
    s3.admit(&l2, 10, T0).unwrap();
    assert_eq!(s3.admit(&l2, 1, T0).unwrap_err().reason, QuotaReason::Tpm);
}

#[test]
fn zero_limits_admit_nothing() {
    for l in [
        limits(Some(0), None, None),
        limits(None, Some(0), None),
        limits(None, None, Some(0)),
    ] {
        let mut s = QuotaState::full(&l, T0);
        let r = s.admit(&l, 0, at(10_000_000)).unwrap_err();
        let expected_retry = if l.concurrency.is_some() { 1 } else { 60 };
        assert_eq!(r.retry_after_s, expected_retry, "{l:?}");
    }
}

#[test]
fn settle_refunds_the_overestimate_and_charges_the_underestimate() {
    let l = limits(None, Some(6000), None);
    let mut s = QuotaState::full(&l, T0);
    s.admit(&l, 1000, T0).unwrap();
    s.settle(&l, 1000, 400, T0);
    assert_eq!(s.token_units(), 5600 * UNITS_PER_TOKEN);
    s.admit(&l, 1000, T0).unwrap();
    s.settle(&l, 1000, 7000, T0);
    assert_eq!(s.token_units(), (5600 - 7000) * UNITS_PER_TOKEN);
    assert_eq!(s.info(&l, T0).remaining_tokens, 0);
    assert_eq!(s.in_flight(), 0);
    // Settling with nothing in flight does not underflow.
    s.settle(&l, 0, 0, T0);
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn refund_never_lifts_above_capacity() {
    let l = limits(None, Some(6000), None);
    let mut s = QuotaState::full(&l, T0);
    s.admit(&l, 3000, T0).unwrap();
    // A minute later the bucket is full again; the refund is dropped.
    s.settle(&l, 3000, 0, at(60_000));
    assert_eq!(s.token_units(), 6000 * UNITS_PER_TOKEN);
}

#[test]
fn refill_is_exact_at_odd_rates() {
    // 7 tpm: 7 tokens in 60 000 ms, so exactly 1 token per 8571.43 ms.
    let l = limits(None, Some(7), None);
    let mut s = QuotaState::full(&l, T0);
    s.admit(&l, 7, T0).unwrap();
    assert_eq!(s.token_units(), 0);
    s.refill(&l, at(8571));
    assert_eq!(s.info(&l, at(8571)).remaining_tokens, 0);
    s.refill(&l, at(8572));
    assert_eq!(s.info(&l, at(8572)).remaining_tokens, 1);
    s.refill(&l, at(60_000));
    assert_eq!(s.token_units(), 7 * UNITS_PER_TOKEN);
    s.refill(&l, at(600_000));
    assert_eq!(s.token_units(), 7 * UNITS_PER_TOKEN, "capped at capacity");
}

#[test]
fn clock_going_backwards_refills_nothing_and_is_not_counted_twice() {
    let l = limits(Some(60), None, None); // one request per second
    let mut s = QuotaState::full(&l, at(10_000));
    for _ in 0..60 {
        s.admit(&l, 0, at(10_000)).unwrap();
    }
    assert!(s.admit(&l, 0, at(5_000)).is_err());
    assert_eq!(s.refilled_at(), at(10_000));
    assert!(s.admit(&l, 0, at(10_999)).is_err());
    assert!(s.admit(&l, 0, at(11_000)).is_ok());
}

#[test]
fn huge_limits_and_debits_do_not_overflow() {
    let l = limits(Some(u64::MAX), Some(u64::MAX), Some(u64::MAX));
    let mut s = QuotaState::full(&l, Millis(0));
    let info = s.admit(&l, u64::MAX, Millis(0)).unwrap();
    assert_eq!(info.remaining_tokens, 0);
    s.settle(&l, u64::MAX, 0, Millis(u64::MAX));
    assert_eq!(s.info(&l, Millis(u64::MAX)).remaining_tokens, u64::MAX);
    s.settle(&l, 0, u64::MAX, Millis(u64::MAX));
    s.settle(&l, 0, u64::MAX, Millis(u64::MAX));
    let r = s.admit(&l, u64::MAX, Millis(u64::MAX)).unwrap_err();
    assert_eq!(r.reason, QuotaReason::Tpm);
    assert!(r.retry_after_s >= 1);
    let small = limits(Some(1), Some(1), None);
    let mut s = QuotaState::full(&small, Millis(0));
    s.admit(&small, u64::MAX, Millis(0)).unwrap();
    let r = s.admit(&small, u64::MAX, Millis(0)).unwrap_err();
    assert_eq!(r.reason, QuotaReason::Rpm);
    s.refill(&small, Millis(u64::MAX));
    assert_eq!(s.request_units(), UNITS_PER_TOKEN);
    assert!(
        s.token_units() < 0,
        "a debt of u64::MAX tokens outlasts the clock"
    );
}

#[test]
fn encode_decode_round_trip_and_rejects_other_bytes() {
    let l = limits(Some(3), Some(100), Some(4));
    let mut s = QuotaState::full(&l, Millis(123_456));
    s.admit(&l, 250, Millis(123_456)).unwrap();
    let bytes = s.encode();
    assert_eq!(bytes.len(), QuotaState::ENCODED_LEN);
    assert_eq!(QuotaState::decode(&bytes), Some(s));
    assert_eq!(QuotaState::decode(&bytes[..48]), None);
    let mut longer = bytes.to_vec();
    longer.push(0);
    assert_eq!(QuotaState::decode(&longer), None);
    let mut wrong_version = bytes;
    wrong_version[0] = 2;
    assert_eq!(QuotaState::decode(&wrong_version), None);
    assert_eq!(QuotaState::decode(&[]), None);
}

#[test]
fn reset_format_matches_openai() {
    let cases: Vec<(u64, &str)> = vec![
        (0, "0s"),
        (1, "1ms"),
        (120, "120ms"),
        (547, "547ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (33_023, "33.023s"),
        (60_000, "1m0s"),
        (172_800, "2m52.8s"),
        (360_000, "6m0s"),
        (3_600_000, "1h0m0s"),
        (3_723_040, "1h2m3.04s"),
    ];
    for (ms, expected) in cases {
        assert_eq!(format_reset(ms), expected, "{ms} ms");
    }
    assert!(format_reset(u64::MAX).ends_with('s'));
}

#[test]
fn headers_only_for_limits_that_exist() {
    let info = RateLimitInfo {
        limit_requests: Some(3000),
        remaining_requests: 2999,
        reset_requests_ms: 20,
        limit_tokens: None,
        remaining_tokens: 0,
        reset_tokens_ms: 0,
    };
    let got: Vec<(&str, String)> = info.headers();
    assert_eq!(
        got,
        vec![
            ("x-ratelimit-limit-requests", String::from("3000")),
            ("x-ratelimit-remaining-requests", String::from("2999")),
            ("x-ratelimit-reset-requests", String::from("20ms")),
        ]
    );
    let both = RateLimitInfo {
        limit_tokens: Some(3_000_000),
        remaining_tokens: 2_998_976,
        reset_tokens_ms: 20_480,
        ..info
    };
    let names: Vec<&str> = both.headers().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        vec![
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ]
    );
    assert_eq!(both.headers()[5].1, "20.48s");
}

#[test]
fn encoding_layout_is_stable() {
    let l = limits(Some(2), Some(10), None);
    let mut s = QuotaState::full(&l, Millis(0x0102_0304));
    s.admit(&l, 12, Millis(0x0102_0304)).unwrap();
    let bytes = s.encode();
    let mut expected = vec![1u8];
    expected.extend_from_slice(&(UNITS_PER_TOKEN).to_le_bytes());
    expected.extend_from_slice(&(-2 * UNITS_PER_TOKEN).to_le_bytes());
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.extend_from_slice(&0x0102_0304u64.to_le_bytes());
    assert_eq!(bytes.to_vec(), expected);
    assert_eq!(QuotaState::ENCODED_LEN, 49);
}
