//! libFuzzer entry point of the `flow_config` target; the body and its assertions are
//! `infergate_fuzz::flow_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::flow_config(data));
