//! The extraction rules of `metrics::extract`: sums, maxima, priorities, missing values.

use alloc::string::ToString;
use alloc::vec;

use crate::metrics::{
    extract, CacheConfig, CacheInfoSpec, EndpointMetrics, LoraState, MetricNames,
};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn ex(page: &str) -> EndpointMetrics {
    extract(page.as_bytes(), &MetricNames::default())
}

#[test]
fn empty_and_foreign_pages_yield_nothing() {
    assert!(ex("").is_empty());
    assert!(ex("# HELP x y\nnode_load1 0.5\n").is_empty());
    assert_eq!(ex(""), EndpointMetrics::default());
}

#[test]
fn waiting_and_running_are_summed_across_series() {
    let m = ex(concat!(
        "vllm:num_requests_waiting{engine=\"0\"} 2\n",
        "vllm:num_requests_waiting{engine=\"1\"} 3\n",
        "vllm:num_requests_running{engine=\"0\"} 4.0\n",
        "vllm:num_requests_running{engine=\"1\"} 0\n",
    ));
    assert_eq!(m.waiting, Some(5));
    assert_eq!(m.running, Some(4));
}

#[test]
fn counts_round_and_saturate() {
    assert_eq!(ex("vllm:num_requests_waiting 2.6\n").waiting, Some(3));
    assert_eq!(ex("vllm:num_requests_waiting 2.4\n").waiting, Some(2));
    assert_eq!(
        ex("vllm:num_requests_waiting 1e30\n").waiting,
        Some(u32::MAX)
    );
    assert_eq!(ex("vllm:num_requests_waiting 0\n").waiting, Some(0));
}

#[test]
fn kv_usage_takes_the_max_and_is_clamped() {
    let m = ex(
        "vllm:kv_cache_usage_perc{engine=\"0\"} 0.2\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.7\n",
    );
    assert_eq!(m.kv_cache_usage, Some(0.7));
    assert_eq!(ex("sglang:token_usage 1.5\n").kv_cache_usage, Some(1.0));
}

#[test]
fn nan_negative_and_infinite_values_are_missing() {
    for bad in ["NaN", "-1", "+Inf", "-Inf"] {
        let page = alloc::format!(
            "vllm:num_requests_waiting {bad}\nvllm:kv_cache_usage_perc {bad}\nvllm:num_requests_running {bad}\n"
        );
        let m = ex(&page);
        assert_eq!(m.waiting, None, "{bad}");
        assert_eq!(m.running, None, "{bad}");
        assert_eq!(m.kv_cache_usage, None, "{bad}");
    }
    // A bad series is dropped, the good ones still count.
    let m = ex("vllm:num_requests_waiting{e=\"0\"} NaN\nvllm:num_requests_waiting{e=\"1\"} 4\n");
    assert_eq!(m.waiting, Some(4));
}

#[test]
fn old_vllm_kv_name_is_a_fallback_not_an_addend() {
    assert_eq!(
        ex("vllm:gpu_cache_usage_perc 0.3\n").kv_cache_usage,
        Some(0.3)
    );
    // Both present (vLLM 0.9): the new name wins wherever it appears on the page.
    let m = ex("vllm:gpu_cache_usage_perc 0.9\nvllm:kv_cache_usage_perc 0.4\n");
    assert_eq!(m.kv_cache_usage, Some(0.4));
    // The new name with only unusable values falls back to the old one.
    let m = ex("vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 0.25\n");
    assert_eq!(m.kv_cache_usage, Some(0.25));
}

#[test]
fn histogram_series_of_a_wanted_family_are_ignored() {
    let m = ex(concat!(
        "# TYPE vllm:num_requests_waiting gauge\n",
        "vllm:num_requests_waiting_bucket{le=\"1\"} 100\n",
        "vllm:num_requests_waiting_sum 100\n",
        "vllm:num_requests_waiting 1\n",
    ));
    assert_eq!(m.waiting, Some(1));
}

#[test]
fn cache_config_from_vllm_info_labels() {
    let m = ex(
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\",swap_space=\"4\"} 1.0\n",
    );
    assert_eq!(
        m.cache,
        Some(CacheConfig {
            block_size: 16,
            num_blocks: 2048
        })
    );
    let m = ex("vllm:cache_config_info{block_size=\"32.0\",num_gpu_blocks=\"100\"} 1\n");
    assert_eq!(
        m.cache,
        Some(CacheConfig {
            block_size: 32,
            num_blocks: 100
        })
    );
}

#[test]
fn cache_config_skips_unsized_and_bad_series() {
    let page = concat!(
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n",
        "vllm:cache_config_info{block_size=\"0\",num_gpu_blocks=\"5\"} 1\n",
        "vllm:cache_config_info{block_size=\"16.5\",num_gpu_blocks=\"5\"} 1\n",
        "vllm:cache_config_info{num_gpu_blocks=\"5\"} 1\n",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"7\"} NaN\n",
    );
    assert_eq!(ex(page).cache, None);
    let page =
        alloc::format!("{page}vllm:cache_config_info{{block_size=\"8\",num_gpu_blocks=\"9\"}} 1\n");
    assert_eq!(
        ex(&page).cache,
        Some(CacheConfig {
            block_size: 8,
            num_blocks: 9
        })
    );
}

#[test]
fn cache_config_from_sglang_labels() {
    let m = ex("sglang:cache_config_info{page_size=\"64\",num_pages=\"5000\"} 1\n");
    assert_eq!(
        m.cache,
        Some(CacheConfig {
            block_size: 64,
            num_blocks: 5000
        })
    );
}

#[test]
fn cache_config_from_gauges_needs_both() {
    let both = "trtllm_kv_cache_tokens_per_block 32\ntrtllm_kv_cache_max_blocks 9216\n";
    assert_eq!(
        ex(both).cache,
        Some(CacheConfig {
            block_size: 32,
            num_blocks: 9216
        })
    );
    assert_eq!(ex("trtllm_kv_cache_tokens_per_block 32\n").cache, None);
    assert_eq!(
        ex("trtllm_kv_cache_tokens_per_block 0\ntrtllm_kv_cache_max_blocks 9\n").cache,
        None
    );
    // The info metric wins over the gauges.
    let page = alloc::format!(
        "{both}vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"10\"}} 1\n"
    );
    assert_eq!(
        ex(&page).cache,
        Some(CacheConfig {
            block_size: 16,
            num_blocks: 10
        })
    );
}

#[test]
fn lora_newest_series_wins_regardless_of_order() {
    let old = "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"\",running_lora_adapters=\"a\"} 100\n";
    let new = "vllm:lora_requests_info{max_lora=\"4\",waiting_lora_adapters=\"c\",running_lora_adapters=\"a, b,\"} 200\n";
    let expected = LoraState {
        max: 4,
        running: vec!["a".to_string(), "b".to_string()],
        waiting: vec!["c".to_string()],
    };
    assert_eq!(
        ex(&alloc::format!("{old}{new}")).lora.as_ref(),
        Some(&expected)
    );
    assert_eq!(
        ex(&alloc::format!("{new}{old}")).lora.as_ref(),
        Some(&expected)
    );
}

#[test]
fn lora_ties_keep_the_first_and_bad_series_are_skipped() {
    let page = concat!(
        "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"first\"} 5\n",
        "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"second\"} 5\n",
        "vllm:lora_requests_info{max_lora=\"x\",running_lora_adapters=\"bad-max\"} 9\n",
        "vllm:lora_requests_info{running_lora_adapters=\"no-max\"} 9\n",
        "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"nan\"} NaN\n",
    );
    let lora = ex(page).lora;
    assert_eq!(lora.map(|l| l.running), Some(vec!["first".to_string()]));
}

#[test]
fn lora_with_no_adapters() {
    let m = ex("vllm:lora_requests_info{max_lora=\"8\",waiting_lora_adapters=\"\",running_lora_adapters=\"\"} 1\n");
    assert_eq!(
        m.lora,
        Some(LoraState {
            max: 8,
            running: vec![],
            waiting: vec![]
        })
    );
}

#[test]
fn garbage_lines_do_not_disturb_good_ones() {
    let m = ex(concat!(
        "vllm:num_requests_waiting{broken 7\n",
        "vllm:num_requests_waiting 2\n",
        "\u{1}\u{2}garbage\n",
        "vllm:num_requests_waiting{a=\"1\"} three\n",
        "vllm:num_requests_running 1 2 3\n",
        "vllm:num_requests_running 6\r\n",
    ));
    assert_eq!(m.waiting, Some(2));
    assert_eq!(m.running, Some(6));
}

#[test]
fn quoted_name_samples_are_read() {
    let m = ex("{\"vllm:num_requests_waiting\",engine=\"0\"} 4\n");
    assert_eq!(m.waiting, Some(4));
}

#[test]
fn custom_names_replace_defaults() {
    let names: MetricNames = serde_json::from_str(
        r#"{"waiting": ["my_queue"], "cacheInfo": [{"name": "my_info", "blockSizeLabel": "bs", "numBlocksLabel": "nb"}]}"#,
    )
    .unwrap();
    assert_eq!(names.waiting, ["my_queue"]);
    assert_eq!(
        names.running,
        MetricNames::default().running,
        "unset keys keep defaults"
    );
    assert_eq!(
        names.cache_info,
        [CacheInfoSpec {
            name: "my_info".into(),
            block_size_label: "bs".into(),
            num_blocks_label: "nb".into()
        }]
    );
    let page = b"vllm:num_requests_waiting 9\nmy_queue 3\nmy_info{bs=\"4\",nb=\"5\"} 1\n";
    let m = extract(page, &names);
    assert_eq!(m.waiting, Some(3));
    assert_eq!(
        m.cache,
        Some(CacheConfig {
            block_size: 4,
            num_blocks: 5
        })
    );
}

#[test]
fn config_rejects_unknown_keys_and_fills_lora_label_defaults() {
    assert!(serde_json::from_str::<MetricNames>(r#"{"wating": ["x"]}"#).is_err());
    let names: MetricNames = serde_json::from_str(r#"{"loraInfo": [{"name": "l"}]}"#).unwrap();
    let spec = &names.lora_info[0];
    assert_eq!(
        (spec.max_label.as_str(), spec.running_label.as_str()),
        ("max_lora", "running_lora_adapters")
    );
    // The default serializes and reads back to itself.
    let json = serde_json::to_string(&MetricNames::default()).unwrap();
    assert_eq!(
        serde_json::from_str::<MetricNames>(&json).unwrap(),
        MetricNames::default()
    );
}
