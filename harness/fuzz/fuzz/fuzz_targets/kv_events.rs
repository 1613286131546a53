//! libFuzzer entry point of the `kv_events` target; the body and its assertions are
//! `infergate_fuzz::kv_events`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::kv_events(data));
