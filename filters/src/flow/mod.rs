//! Flow control: who waits, and who goes next, while a pool is saturated.
//!
//! A pool whose `EndpointPickerConfig` names the `flowControl` feature gate has a
//! [`FlowGate`]. The picker asks it before every pick:
//!
//! - **Not saturated, and nothing of the same or a higher priority waiting**: admitted at
//!   once (work-conserving). The request holds a [`FlowTicket`] until it ends; the ticket
//!   is the load the concurrency detector counts.
//! - **Otherwise** it waits in the pool's queues (the core's
//!   [`scheduler_core::flow::FlowQueues`]: strict priority bands, the band's fairness policy
//!   across flows, its ordering policy within a flow), held inside Envoy: the filter pauses.
//! - **Dispatch** happens when capacity frees: a ticket given back, or a new snapshot that
//!   lifts the utilization detector. [`FlowGate::dispatch`] takes queued requests while the
//!   pool is not saturated, each with its ticket already counted, so no request admitted in
//!   between can take the capacity it was dispatched for. The request then resumes on its
//!   own worker and is picked for.
//! - **Evicted** (`enableEviction`): a request queued while the pool is saturated may evict
//!   admitted requests of lower, sheddable (negative) bands ([`Evictee`],
//!   [`scheduler_core::flow::eviction`]). An evicted request whose response has not started
//!   gets 429 `evicted-by-priority`; one whose response has started is reset, and billed for
//!   what it generated.
//! - **Refused** at once when its band or the queues are full (429 `rejected-saturated`),
//!   after its TTL (429 `rejected-ttl-expired`), or when the client leaves
//!   (`rejected-context-cancelled`, nothing sent upstream). No engine has seen any of them,
//!   so a client may retry safely.
//!
//! The gate lives with the picker state, once per Envoy process: native workers share it
//! in memory; in the Wasm flavour it is the state owner's, and a queued request is a
//! message the owner answers when it dispatches ([`crate::picker::remote`]).
//!
//! The ticket gives its load back on drop, without the gate's lock (a ticket may be dropped
//! on a thread that holds it); whoever ends a request calls [`FlowGate::dispatch`]
//! afterwards, and the host's timer does too, so a ticket dropped elsewhere delays a
//! dispatch by one tick at most.

mod evict;
mod gate;
mod slot;

pub use evict::{EvictSignal, Evictee};
pub use gate::{Admission, Entry, FlowGate, FlowTicket};
pub use slot::{QueueSlot, Verdict};

/// The per-stream state key under which the picker leaves how long a request waited in
/// its pool's queue (decimal milliseconds), for the billing record.
pub const QUEUED_MS_STATE: &str = "infergate.flow.queued_ms";

/// Leave how long the request waited in the stream's state, for the billing record (best
/// effort: only the record's `queued_ms` is lost if the host refuses).
pub fn record_queued_ms<H: crate::host::StreamState + ?Sized>(host: &mut H, queued_ms: u64) {
    let _ = host.set_stream_state(QUEUED_MS_STATE, queued_ms.to_string().as_bytes());
}

/// The per-stream state key under which the picker leaves why it stopped an admitted
/// request (`evicted-by-priority`), for the billing record's outcome.
pub const EVICTED_STATE: &str = "infergate.flow.evicted";

/// The per-stream state key under which the usage stage's settlement leaves the service a
/// request received (decimal prompt + 2 × completion tokens), for the weighted policy to
/// correct the estimate it charged at dispatch.
pub const SERVICE_STATE: &str = "infergate.flow.service";

/// The service a request received by its usage: prompt + 2 × completion tokens.
pub fn service_of(prompt_tokens: u64, completion_tokens: u64) -> u64 {
    prompt_tokens.saturating_add(completion_tokens.saturating_mul(2))
}

/// Read a decimal number another filter left in the stream's state.
pub fn read_state_number<H: crate::host::StreamState + ?Sized>(host: &H, key: &str) -> Option<u64> {
    let bytes = host.stream_state(key)?;
    std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
}

/// The fairness id of a request that carries none.
pub const DEFAULT_FLOW: &str = "default-flow";

/// The completion estimate of a request that sets no output limit, in tokens: what the
/// weighted policy charges and the token-mode detector counts until the request's usage
/// is known.
pub const DEFAULT_OUTPUT_ESTIMATE: u64 = 256;

/// Why a request left the queue without being served (the `x-llm-d-request-dropped-reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Its band or the queues were full.
    Saturated,
    /// It waited longer than its TTL.
    TtlExpired,
    /// The client left while it waited.
    ContextCancelled,
    /// It was admitted, and a request of a higher band evicted it before its response
    /// started.
    Evicted,
}

impl DropReason {
    /// The wire value (`x-llm-d-request-dropped-reason`, the rejections' stat label).
    pub fn wire(self) -> &'static str {
        match self {
            DropReason::Saturated => "rejected-saturated",
            DropReason::TtlExpired => "rejected-ttl-expired",
            DropReason::ContextCancelled => "rejected-context-cancelled",
            DropReason::Evicted => scheduler_core::flow::EVICTED_BY_PRIORITY,
        }
    }

    /// The message of the 429.
    pub fn message(self) -> &'static str {
        match self {
            DropReason::Saturated => {
                "the pool is saturated and this request's priority band is full; retry later"
            }
            DropReason::TtlExpired => {
                "the pool stayed saturated for longer than this request may wait; retry later"
            }
            DropReason::ContextCancelled => "the client left while the request was queued",
            DropReason::Evicted => {
                "a request of a higher priority needed the capacity this sheddable request \
                 held; retry later"
            }
        }
    }
}
