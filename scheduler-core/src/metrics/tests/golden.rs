//! Golden pages from `testdata/metrics/` (see `testdata/README.md` for how each was made).
//! `include_str!` keeps these runnable on wasm32 without a filesystem.

use crate::metrics::{extract, EndpointMetrics, MetricNames};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn check(name: &str, page: &str, expected_json: &str) {
    let expected: EndpointMetrics = serde_json::from_str(expected_json).unwrap();
    let got = extract(page.as_bytes(), &MetricNames::default());
    assert_eq!(got, expected, "golden page {name}");
    // The same page with CRLF line ends reads the same.
    let crlf = page.replace('\n', "\r\n");
    assert_eq!(
        extract(crlf.as_bytes(), &MetricNames::default()),
        expected,
        "{name} CRLF"
    );
}

#[test]
fn vllm_0_10_with_lora() {
    check(
        "vllm-0.10-lora",
        include_str!("../../../../testdata/metrics/vllm-0.10-lora.txt"),
        include_str!("../../../../testdata/metrics/vllm-0.10-lora.expected.json"),
    );
}

#[test]
fn vllm_0_9_data_parallel() {
    check(
        "vllm-0.9-dp2",
        include_str!("../../../../testdata/metrics/vllm-0.9-dp2.txt"),
        include_str!("../../../../testdata/metrics/vllm-0.9-dp2.expected.json"),
    );
}

#[test]
fn sglang() {
    check(
        "sglang",
        include_str!("../../../../testdata/metrics/sglang.txt"),
        include_str!("../../../../testdata/metrics/sglang.expected.json"),
    );
}

#[test]
fn trtllm() {
    check(
        "trtllm",
        include_str!("../../../../testdata/metrics/trtllm.txt"),
        include_str!("../../../../testdata/metrics/trtllm.expected.json"),
    );
}

#[test]
fn every_line_of_every_golden_page_parses() {
    use crate::metrics::exposition::{lines, Line};
    for page in [
        include_str!("../../../../testdata/metrics/vllm-0.10-lora.txt"),
        include_str!("../../../../testdata/metrics/vllm-0.9-dp2.txt"),
        include_str!("../../../../testdata/metrics/sglang.txt"),
        include_str!("../../../../testdata/metrics/trtllm.txt"),
    ] {
        for (i, line) in lines(page.as_bytes()).enumerate() {
            assert!(
                !matches!(line, Line::Invalid | Line::Comment),
                "line {}: {line:?}",
                i + 1
            );
        }
    }
}
