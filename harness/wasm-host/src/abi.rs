//! The proxy-wasm ABI 0.2.1 enumerations, as numbers on the wire and as Rust types.
//!
//! Values follow the ABI specification (`proxy-wasm/spec`, `abi-versions/v0.2.1`); an unknown
//! number is kept as-is (`Other`) or turned into `Status::BadArgument` by the host call that
//! received it, never a panic.

/// Result code of every host call (`proxy_status_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The key, buffer, metric or function does not exist.
    NotFound = 1,
    /// An argument is invalid (unknown enum value, map not available now, ...).
    BadArgument = 2,
    /// The host could not serialize a value.
    SerializationFailure = 3,
    /// The host could not parse an argument.
    ParseFailure = 4,
    /// A pointer/size pair points outside the module's memory.
    InvalidMemoryAccess = 6,
    /// A shared queue is empty.
    Empty = 7,
    /// Compare-and-swap value did not match.
    CasMismatch = 8,
    /// The host failed internally.
    InternalFailure = 10,
    /// The host does not implement this operation.
    Unimplemented = 12,
}

impl Status {
    /// The wire value.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Parses a wire value (for foreign-function handlers written by tests).
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::BadArgument,
            3 => Status::SerializationFailure,
            4 => Status::ParseFailure,
            6 => Status::InvalidMemoryAccess,
            7 => Status::Empty,
            8 => Status::CasMismatch,
            10 => Status::InternalFailure,
            12 => Status::Unimplemented,
            _ => return None,
        })
    }
}

/// What a stream callback asked the host to do (`proxy_action_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Forward what was processed.
    Continue,
    /// Stop iteration (buffer body chunks) until the module continues the stream.
    Pause,
    /// A value outside the 0.2.1 ABI, kept for the test to see.
    Other(u32),
}

impl Action {
    /// Parses the value a callback returned.
    pub fn from_code(code: u32) -> Self {
        match code {
            0 => Action::Continue,
            1 => Action::Pause,
            other => Action::Other(other),
        }
    }
}

/// Log level of `proxy_log` (`proxy_log_level_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// Trace.
    Trace = 0,
    /// Debug.
    Debug = 1,
    /// Info.
    Info = 2,
    /// Warn.
    Warn = 3,
    /// Error.
    Error = 4,
    /// Critical (panic hooks log at this level).
    Critical = 5,
}

impl LogLevel {
    /// Parses a wire value.
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => LogLevel::Trace,
            1 => LogLevel::Debug,
            2 => LogLevel::Info,
            3 => LogLevel::Warn,
            4 => LogLevel::Error,
            5 => LogLevel::Critical,
            _ => return None,
        })
    }
}

/// Which buffer a buffer call addresses (`proxy_buffer_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferType {
    /// Request body of the effective HTTP stream.
    HttpRequestBody,
    /// Response body of the effective HTTP stream.
    HttpResponseBody,
    /// TCP downstream data (not supported by this host).
    DownstreamData,
    /// TCP upstream data (not supported by this host).
    UpstreamData,
    /// Body of the HTTP call response being delivered.
    HttpCallResponseBody,
    /// gRPC message (not supported by this host).
    GrpcReceiveBuffer,
    /// The VM configuration.
    VmConfiguration,
    /// The plugin configuration, during `proxy_on_configure`.
    PluginConfiguration,
    /// Foreign-function arguments (not supported by this host).
    CallData,
}

impl BufferType {
    /// Parses a wire value.
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => BufferType::HttpRequestBody,
            1 => BufferType::HttpResponseBody,
            2 => BufferType::DownstreamData,
            3 => BufferType::UpstreamData,
            4 => BufferType::HttpCallResponseBody,
            5 => BufferType::GrpcReceiveBuffer,
            6 => BufferType::VmConfiguration,
            7 => BufferType::PluginConfiguration,
            8 => BufferType::CallData,
            _ => return None,
        })
    }
}

/// Which header map a map call addresses (`proxy_map_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MapType {
    /// Request headers of the effective HTTP stream.
    HttpRequestHeaders,
    /// Request trailers.
    HttpRequestTrailers,
    /// Response headers.
    HttpResponseHeaders,
    /// Response trailers.
    HttpResponseTrailers,
    /// gRPC initial metadata (not supported by this host).
    GrpcReceiveInitialMetadata,
    /// gRPC trailing metadata (not supported by this host).
    GrpcReceiveTrailingMetadata,
    /// Headers of the HTTP call response being delivered.
    HttpCallResponseHeaders,
    /// Trailers of the HTTP call response being delivered.
    HttpCallResponseTrailers,
}

impl MapType {
    /// Parses a wire value.
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => MapType::HttpRequestHeaders,
            1 => MapType::HttpRequestTrailers,
            2 => MapType::HttpResponseHeaders,
            3 => MapType::HttpResponseTrailers,
            4 => MapType::GrpcReceiveInitialMetadata,
            5 => MapType::GrpcReceiveTrailingMetadata,
            6 => MapType::HttpCallResponseHeaders,
            7 => MapType::HttpCallResponseTrailers,
            _ => return None,
        })
    }
}

/// Which stream `proxy_continue_stream` / `proxy_close_stream` addresses (`proxy_stream_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamType {
    /// The HTTP request direction.
    HttpRequest,
    /// The HTTP response direction.
    HttpResponse,
    /// TCP downstream.
    Downstream,
    /// TCP upstream.
    Upstream,
}

impl StreamType {
    /// Parses a wire value.
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => StreamType::HttpRequest,
            1 => StreamType::HttpResponse,
            2 => StreamType::Downstream,
            3 => StreamType::Upstream,
            _ => return None,
        })
    }
}

/// Kind of a metric defined by `proxy_define_metric` (`proxy_metric_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    /// Monotonic counter.
    Counter,
    /// Gauge (may go up and down).
    Gauge,
    /// Histogram (recorded values).
    Histogram,
}

impl MetricType {
    /// Parses a wire value.
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => MetricType::Counter,
            1 => MetricType::Gauge,
            2 => MetricType::Histogram,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for code in 0..16 {
            if let Some(status) = Status::from_code(code) {
                assert_eq!(status.code(), code);
            }
        }
        assert_eq!(Status::from_code(5), None);
        assert_eq!(Action::from_code(1), Action::Pause);
        assert_eq!(Action::from_code(7), Action::Other(7));
        assert_eq!(
            MapType::from_code(6),
            Some(MapType::HttpCallResponseHeaders)
        );
        assert_eq!(BufferType::from_code(9), None);
        assert_eq!(LogLevel::from_code(5), Some(LogLevel::Critical));
        assert!(LogLevel::Warn > LogLevel::Info);
    }
}
