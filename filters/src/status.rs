//! What a filter callback tells its adapter to do next.

/// The outcome of one filter callback, mapped by each adapter onto its host's statuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterStatus {
    /// Let the stream go on (proxy-wasm `Action::Continue`).
    Continue,
    /// Hold the stream: from a header callback, wait for the body; from a body callback,
    /// keep buffering (proxy-wasm `Action::Pause`, Envoy `StopIterationAndBuffer`).
    Pause,
    /// A local reply was sent through [`crate::host::LocalReply`]; stop the filter chain
    /// (proxy-wasm `Action::Pause` after `send_http_response`).
    Replied,
}
