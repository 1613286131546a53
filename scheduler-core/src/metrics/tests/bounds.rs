//! Memory bounds of extraction: what one page can make the extractor keep.

use alloc::string::String;

use crate::metrics::{extract, MetricNames, MAX_ADAPTERS};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn adapter_lists_are_cut_at_the_bound() {
    let mut names = String::new();
    for i in 0..3 * MAX_ADAPTERS {
        names.push_str(&alloc::format!("a{i},"));
    }
    let page = alloc::format!(
        "vllm:lora_requests_info{{max_lora=\"4\",running_lora_adapters=\"{names}\",waiting_lora_adapters=\"x,,y\"}} 1.7e9\n"
    );
    let m = extract(page.as_bytes(), &MetricNames::default());
    let lora = m.lora.unwrap();
    assert_eq!(lora.running.len(), MAX_ADAPTERS);
    assert_eq!(lora.running.first().map(String::as_str), Some("a0"));
    assert_eq!(lora.waiting, ["x", "y"]);
}
