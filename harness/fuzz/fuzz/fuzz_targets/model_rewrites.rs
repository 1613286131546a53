//! libFuzzer entry point of the `model_rewrites` target; the body and its assertions are
//! `infergate_fuzz::model_rewrites`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::model_rewrites(data));
