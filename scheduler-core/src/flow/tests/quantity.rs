//! Kubernetes quantities and Go durations.

use serde_json::{json, Value};

use crate::flow::quantity::{parse_duration_ms, parse_quantity};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn q(v: Value) -> Result<u64, alloc::string::String> {
    parse_quantity(&v)
}

fn d(v: Value) -> Result<u64, alloc::string::String> {
    parse_duration_ms(&v)
}

#[test]
fn quantities_accept_numbers_and_kubernetes_suffixes() {
    assert_eq!(q(json!(500)), Ok(500));
    assert_eq!(q(json!(0)), Ok(0));
    assert_eq!(q(json!(1e3)), Ok(1000));
    assert_eq!(q(json!("500")), Ok(500));
    assert_eq!(q(json!("1k")), Ok(1000));
    assert_eq!(q(json!("2M")), Ok(2_000_000));
    assert_eq!(q(json!("3G")), Ok(3_000_000_000));
    assert_eq!(q(json!("1T")), Ok(1_000_000_000_000));
    assert_eq!(q(json!("1P")), Ok(1_000_000_000_000_000));
    assert_eq!(q(json!("1E")), Ok(1_000_000_000_000_000_000));
    assert_eq!(q(json!("1Ki")), Ok(1024));
    assert_eq!(q(json!("10Gi")), Ok(10 * (1 << 30)));
    assert_eq!(q(json!("1Mi")), Ok(1 << 20));
    assert_eq!(q(json!("1Ti")), Ok(1 << 40));
    assert_eq!(q(json!("1Pi")), Ok(1 << 50));
    assert_eq!(q(json!("1Ei")), Ok(1 << 60));
    assert_eq!(q(json!("1.5k")), Ok(1500));
    assert_eq!(q(json!("0.5Ki")), Ok(512));
    assert_eq!(q(json!("1e3")), Ok(1000));
    assert_eq!(q(json!(" 7 ")), Ok(7));
    assert_eq!(q(json!("+7")), Ok(7));
    assert_eq!(q(json!("15Ei")), Ok(15 << 60));
}

#[test]
fn quantities_refuse_negatives_fractions_overflow_and_garbage() {
    for bad in [
        json!(-1),
        json!(-0.5),
        json!(1.5),
        json!("-1"),
        json!("0.5"),
        json!("1.0001k"),
        json!("16Ei"),
        json!("18446744073709551616"),
        json!("99999999999999999999999999999999999999999999"),
        json!("1e40"),
        json!("1x"),
        json!("k"),
        json!(""),
        json!("1..5"),
        json!("1.2.3"),
        json!("100m"),
        json!("1 k"),
        json!(true),
        json!(null),
        json!([1]),
        json!(1e300),
    ] {
        let r = q(bad.clone());
        assert!(r.is_err(), "{bad} gave {r:?}");
    }
    let msg = q(json!("12q")).unwrap_err();
    assert!(msg.contains("\"12q\"") && msg.contains("suffix"), "{msg}");
    assert!(q(json!(-3)).unwrap_err().contains("negative"));
    assert!(q(json!("0.5")).unwrap_err().contains("whole"));
    assert!(q(json!("16Ei")).unwrap_err().contains("too large"));
}

#[test]
fn durations_accept_go_forms_and_seconds() {
    assert_eq!(d(json!("60s")), Ok(60_000));
    assert_eq!(d(json!("500ms")), Ok(500));
    assert_eq!(d(json!("1m30s")), Ok(90_000));
    assert_eq!(d(json!("2h")), Ok(7_200_000));
    assert_eq!(d(json!("1.5s")), Ok(1500));
    assert_eq!(d(json!("1h2m3s4ms")), Ok(3_723_004));
    assert_eq!(d(json!("0")), Ok(0));
    assert_eq!(d(json!("0s")), Ok(0));
    assert_eq!(d(json!(".5s")), Ok(500));
    // Rounded up to whole milliseconds: a positive duration never becomes 0.
    assert_eq!(d(json!("1us")), Ok(1));
    assert_eq!(d(json!("1500us")), Ok(2));
    assert_eq!(d(json!("1µs")), Ok(1));
    assert_eq!(d(json!("1000000ns")), Ok(1));
    assert_eq!(d(json!(60)), Ok(60_000));
    assert_eq!(d(json!(1.5)), Ok(1500));
    assert_eq!(d(json!(0.0001)), Ok(1));
    assert_eq!(d(json!(0)), Ok(0));
}

#[test]
fn durations_refuse_garbage_negatives_and_overflow() {
    for bad in [
        json!("60"),
        json!("s"),
        json!(""),
        json!("-1s"),
        json!("1d"),
        json!("1s garbage"),
        json!("1..5s"),
        json!("99999999999999999999999h"),
        json!(-1),
        json!(1e300),
        json!(true),
        json!(null),
        json!({"seconds": 1}),
    ] {
        let r = d(bad.clone());
        assert!(r.is_err(), "{bad} gave {r:?}");
    }
    assert!(d(json!("60")).unwrap_err().contains("missing unit"));
    assert!(d(json!("3d")).unwrap_err().contains("unknown unit"));
    assert!(d(json!("-1s")).unwrap_err().contains("negative"));
}
