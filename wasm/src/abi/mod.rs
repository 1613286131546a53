//! The proxy-wasm ABI 0.2.1, spoken by this module itself (no SDK).
//!
//! Why not the `proxy-wasm` SDK: its hostcall wrappers `unwrap` UTF-8 conversions of header
//! values and `panic!` on every status they do not expect, its extern declarations return
//! a Rust enum (a status number outside it is undefined behaviour), and its dispatcher
//! `expect`s on context ids and callout tokens. A panic aborts the VM that the router and
//! the picker of one Envoy worker share, so one request with a byte above 0x7F in a header
//! value took every later request on that worker down. Here:
//!
//! - [`hostcalls`] declares every import the module uses and returns `Result<_, Status>`
//!   for every status number, known or not; values come back as bytes.
//! - [`pairs`] (de)serialises header maps and property paths with bounds checks, so a
//!   short or garbled buffer from the host is an error, never an out-of-bounds index.
//! - [`exports`] (wasm32 only) holds the callbacks Envoy calls, the allocator Envoy
//!   writes returned values into, and the table of live contexts; a callback for an
//!   unknown context, or one arriving while another runs, is logged and answered safely.
//!
//! The enumerations below carry the ABI's numbers.

#[cfg(target_arch = "wasm32")]
pub mod exports;
pub mod hostcalls;
pub mod pairs;

/// A hostcall's failure: the status number the host answered instead of `Ok` (0).
///
/// The numbering is the proxy-wasm C++ host's (`WasmResult`), which Envoy uses; any other
/// number is kept in [`Status::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// 1: no such key, value, buffer, metric or function.
    NotFound,
    /// 2: an argument is invalid, or the map or buffer is not available now.
    BadArgument,
    /// 3: the host could not serialise the value.
    SerializationFailure,
    /// 4: the host could not parse an argument (or the module could not parse the answer).
    ParseFailure,
    /// 5: a bad expression.
    BadExpression,
    /// 6: a pointer/size pair outside the module's memory.
    InvalidMemoryAccess,
    /// 7: an empty queue.
    Empty,
    /// 8: the compare-and-swap value did not match.
    CasMismatch,
    /// 9: a result of an unexpected type.
    ResultMismatch,
    /// 10: the host failed internally.
    InternalFailure,
    /// 11: the connection broke.
    BrokenConnection,
    /// 12: the host does not implement this call.
    Unimplemented,
    /// Any other number.
    Other(u32),
}

impl Status {
    /// `Ok(())` for 0, else the status.
    pub fn check(code: u32) -> Result<(), Status> {
        Err(match code {
            0 => return Ok(()),
            1 => Status::NotFound,
            2 => Status::BadArgument,
            3 => Status::SerializationFailure,
            4 => Status::ParseFailure,
            5 => Status::BadExpression,
            6 => Status::InvalidMemoryAccess,
            7 => Status::Empty,
            8 => Status::CasMismatch,
            9 => Status::ResultMismatch,
            10 => Status::InternalFailure,
            11 => Status::BrokenConnection,
            12 => Status::Unimplemented,
            other => Status::Other(other),
        })
    }
}

/// `proxy_log_level_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// 2.
    Info = 2,
    /// 3.
    Warn = 3,
    /// 4.
    Error = 4,
    /// 5.
    Critical = 5,
}

/// `proxy_map_type_t`: which header map a call addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapType {
    /// Request headers of the current stream.
    HttpRequestHeaders = 0,
    /// Response headers of the current stream.
    HttpResponseHeaders = 2,
    /// Headers of the HTTP call response being delivered.
    HttpCallResponseHeaders = 6,
}

/// `proxy_buffer_type_t`: which buffer a call addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferType {
    /// Request body of the current stream (what is buffered so far).
    HttpRequestBody = 0,
    /// Response body chunk of the current stream.
    HttpResponseBody = 1,
    /// Body of the HTTP call response being delivered.
    HttpCallResponseBody = 4,
    /// The plugin configuration, during `proxy_on_configure`.
    PluginConfiguration = 7,
}

/// `proxy_metric_type_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    /// A monotonic counter.
    Counter = 0,
    /// A gauge.
    Gauge = 1,
    /// A histogram.
    Histogram = 2,
}

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

/// What a stream callback tells the host (`proxy_action_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Go on with the filter chain.
    Continue = 0,
    /// Stop iteration: hold the headers, or keep buffering the body.
    Pause = 1,
}
