//! libFuzzer entry point of the `admin_clusters` target; the body and its assertions are
//! `infergate_fuzz::admin_clusters`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::admin_clusters(data));
