//! libFuzzer entry point of the `snapshot_codec` target; the body and its assertions are
//! `infergate_fuzz::snapshot_codec`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::snapshot_codec(data));
