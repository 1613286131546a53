//! The `probe` role (`{"role": "probe"}`, no other key): a measuring tool, not part of the
//! gateway, compiled only with the crate's `probe` feature (the bench build).
//!
//! It holds each request until its body is complete, copies the body into the VM and lets
//! the request go on unchanged: the least any body-based filter (such as the router) does.
//! `cargo xtask bench overhead` builds the module with `--features probe` and runs this role
//! in front of the plain routes as the Wasm floor, so the gateway's overhead can be read
//! against what merely reading the body costs. A release module refuses the role as it
//! refuses any unknown one (`crate::config`).

use crate::abi::{hostcalls, Action, BufferType, HttpHooks};

/// The `probe` role: holds the request until its body is complete, copies the body into the
/// VM, and lets it go on unchanged (module doc); what any body-based filter costs at least.
#[derive(Default)]
pub struct ProbeContext {
    body_len: usize,
}

impl ProbeContext {
    fn read_body(body_size: usize) {
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size);
        // Whatever the host answered, the request goes on unchanged: the probe only reads.
        core::hint::black_box(&body);
    }
}

impl HttpHooks for ProbeContext {
    fn on_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_len = body_size;
        if !end_of_stream {
            return Action::Pause;
        }
        ProbeContext::read_body(body_size);
        Action::Continue
    }

    fn on_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // Trailers end the request: the buffered body is complete.
        ProbeContext::read_body(self.body_len);
        Action::Continue
    }
}
