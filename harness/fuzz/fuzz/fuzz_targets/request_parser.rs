//! libFuzzer entry point of the `request_parser` target; the body and its assertions are
//! `infergate_fuzz::request_parser`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| infergate_fuzz::request_parser(data));
