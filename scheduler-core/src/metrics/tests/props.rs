//! Property tests: the parser and the extractor never panic, whatever the bytes, and
//! escaped label values read back exactly.

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

use crate::metrics::exposition::{lines, parse_line, raw_lines, Line};
use crate::metrics::{extract, MetricNames};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// Lines built from the format's own alphabet reach much deeper than uniform bytes.
fn format_ish() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("vllm:num_requests_waiting".to_string()),
        Just("vllm:lora_requests_info".to_string()),
        Just("vllm:cache_config_info".to_string()),
        Just("sglang:token_usage".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("\"".to_string()),
        Just("\\".to_string()),
        Just("=".to_string()),
        Just(",".to_string()),
        Just(" ".to_string()),
        Just("\t".to_string()),
        Just("\n".to_string()),
        Just("\r\n".to_string()),
        Just("#".to_string()),
        Just("# HELP ".to_string()),
        Just("# TYPE ".to_string()),
        Just("NaN".to_string()),
        Just("+Inf".to_string()),
        Just("-Inf".to_string()),
        Just("block_size=\"16\"".to_string()),
        Just("num_gpu_blocks=\"9\"".to_string()),
        Just("max_lora=\"3\"".to_string()),
        Just("running_lora_adapters=\"a,b\"".to_string()),
        "[0-9.e+-]{1,8}",
        "[a-z_:]{1,6}",
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|parts| parts.concat())
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Bytes rich in line ends, so every alignment of `\n` within a word is hit.
fn newline_rich() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'a'), any::<u8>()],
        0..100,
    )
}

proptest! {
    #[test]
    fn raw_lines_match_a_plain_split(bytes in newline_rich()) {
        let fast: Vec<&[u8]> = raw_lines(&bytes).collect();
        let plain: Vec<&[u8]> = bytes
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .collect();
        prop_assert_eq!(fast, plain);
    }

    #[test]
    fn parser_and_extractor_never_panic_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = lines(&bytes).count();
        let _ = extract(&bytes, &MetricNames::default());
    }

    #[test]
    fn parser_never_panics_on_strings(text in any::<String>()) {
        for line in text.split('\n') {
            let _ = parse_line(line);
        }
        let _ = extract(text.as_bytes(), &MetricNames::default());
    }

    #[test]
    fn parser_never_panics_on_format_like_text(text in format_ish()) {
        for line in lines(text.as_bytes()) {
            if let Line::Sample(s) = line {
                // Reading labels back must not panic either.
                let _ = s.labels().count();
            }
        }
        let m = extract(text.as_bytes(), &MetricNames::default());
        if let Some(kv) = m.kv_cache_usage {
            prop_assert!((0.0..=1.0).contains(&kv));
        }
    }

    #[test]
    fn escaped_label_values_round_trip(
        values in prop::collection::vec(any::<String>(), 1..4),
        value in any::<f64>(),
    ) {
        let mut line = String::from("m{");
        for (i, v) in values.iter().enumerate() {
            line.push_str(&alloc::format!("l{i}=\"{}\",", escape(v)));
        }
        line.push_str(&alloc::format!("}} {value:?}"));
        let Line::Sample(s) = parse_line(&line) else {
            return Err(TestCaseError::fail(alloc::format!("not a sample: {line:?}")));
        };
        let read: Vec<String> = s.labels().map(|(_, v)| v.into_owned()).collect();
        prop_assert_eq!(read, values);
        prop_assert!(s.value == value || (s.value.is_nan() && value.is_nan()));
    }

    #[test]
    fn waiting_is_the_sum_of_usable_series(series in prop::collection::vec(0u32..10_000, 0..20)) {
        let mut page = String::new();
        for (i, v) in series.iter().enumerate() {
            page.push_str(&alloc::format!("vllm:num_requests_waiting{{engine=\"{i}\"}} {v}\n"));
        }
        page.push_str("vllm:num_requests_waiting{engine=\"bad\"} NaN\n");
        let m = extract(page.as_bytes(), &MetricNames::default());
        let expected = (!series.is_empty()).then(|| series.iter().sum::<u32>());
        prop_assert_eq!(m.waiting, expected);
    }
}
