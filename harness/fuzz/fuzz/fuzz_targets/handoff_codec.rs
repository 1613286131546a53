//! libFuzzer entry point of the `handoff_codec` target; the body and its assertions are
//! `infergate_fuzz::handoff_codec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::handoff_codec(data));
