//! The one status type of the request side: what a stage answers the driver, and what the
//! driver answers the adapter for a host event.

/// The outcome of a request-side step. From a stage: go on, hold the request, or it was
/// answered. From the driver to the adapter, which maps it onto its host's statuses:
/// proxy-wasm `Action::Continue` / `Action::Pause`, Envoy dynamic modules' `Continue` /
/// `StopIteration*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterStatus {
    /// A stage: done with this part of the request, the next stage is due. The driver:
    /// the request side is done, let the stream go on (proxy-wasm `Action::Continue`).
    Continue,
    /// Hold the stream: a stage waits for a wake (or, from the driver, a stage waits for
    /// the body or a wake; in a body event, keep buffering: proxy-wasm `Action::Pause`,
    /// Envoy `StopIterationAndBuffer`).
    Pause,
    /// A local reply was sent through [`crate::host::LocalReply`]
    /// ([`crate::pipeline::reply`]); stop the filter chain (proxy-wasm `Action::Pause`
    /// after `send_http_response`).
    Replied,
}
