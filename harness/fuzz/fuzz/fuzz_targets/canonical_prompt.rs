//! libFuzzer entry point of the `canonical_prompt` target; the body and its assertions are
//! `infergate_fuzz::canonical_prompt`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::canonical_prompt(data));
