//! libFuzzer entry point of the `tenant_objects` target; the body and its assertions are
//! `infergate_fuzz::tenant_objects`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::tenant_objects(data));
