//! libFuzzer entry point of the `usage_stream` target; the body and its assertions are
//! `infergate_fuzz::usage_stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::usage_stream(data));
