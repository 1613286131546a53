//! libFuzzer entry point of the `prometheus_parser` target; the body and its assertions are
//! `infergate_fuzz::prometheus_parser`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::prometheus_parser(data));
