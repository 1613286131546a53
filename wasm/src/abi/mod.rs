//! The proxy-wasm ABI 0.2.1 as this module speaks it: the hostcalls, codecs and ABI
//! numbers of the shared crate `infergate-wasm-abi` (which says why there is no SDK), and
//! this module's own exports.
//!
//! - [`exports`] (wasm32 only) holds the callbacks Envoy calls, the allocator Envoy
//!   writes returned values into, and the table of live contexts; a callback for an
//!   unknown context, or one arriving while another runs, is logged and answered safely.
//! - [`HttpHooks`] is what `exports` delivers to one HTTP stream's context.

#[cfg(target_arch = "wasm32")]
pub mod exports;

pub use infergate_wasm_abi::{
    hostcalls, pairs, Action, BufferType, LogLevel, MapType, MetricType, Status,
};

/// The callbacks of one HTTP stream context, as [`exports`] delivers them (each defaults
/// to going on unchanged). A context is dropped when Envoy deletes it.
pub trait HttpHooks {
    /// `proxy_on_request_headers`.
    fn on_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
    /// `proxy_on_request_body`: `body_size` is everything buffered so far.
    fn on_request_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
    /// `proxy_on_request_trailers`.
    fn on_request_trailers(&mut self, _num_trailers: usize) -> Action {
        Action::Continue
    }
    /// `proxy_on_log`: the stream completed or was reset.
    fn on_log(&mut self) {}
    /// `proxy_on_response_headers`.
    fn on_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
    /// `proxy_on_response_body`: `body_size` is this chunk.
    fn on_response_body(&mut self, _body_size: usize, _end_of_stream: bool) -> Action {
        Action::Continue
    }
    /// `proxy_on_response_trailers`.
    fn on_response_trailers(&mut self, _num_trailers: usize) -> Action {
        Action::Continue
    }
    /// A waker of this stream fired (delivered by `exports` after the callback that woke
    /// it, with this stream made the effective context).
    fn on_wake(&mut self) {}
}
