//! libFuzzer entry point of the `owner_messages` target; the body and its assertions are
//! `infergate_fuzz::owner_messages`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::owner_messages(data));
