//! The host capabilities the filters use, one small trait per capability.
//!
//! Both adapters implement these: the proxy-wasm one with its own raw hostcalls (`wasm/src/abi`)
//! in the current context, the dynamic-module one with the Envoy ABI callbacks on its filter
//! pointer. Header names are lower-case on the wire and in every call here. Calls that can
//! fail on the host return [`HostError`]; the filters treat a failed *optional* call
//! (metadata) as best effort and a failed required one as an internal error (500).
//!
//! The traits are what the pipeline's stages use: request headers and body (read, replace),
//! response headers (read) and each response chunk (read, rewrite) as it passes, local
//! replies, a waker to pause and resume a request, route refresh, the body buffer cap, the
//! snapshot, clock, randomness, stats, callouts, metadata and per-stream state. A capability
//! nobody calls is not declared: an adapter implements only what a stage or the scraper uses.

use scheduler_core::types::Millis;

use crate::reply::Reply;
use crate::stats::StatKey;

/// Why a host call did not do what was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostError {
    /// This host cannot do that at all (e.g. proxy-wasm has no dynamic-metadata setter).
    Unsupported,
    /// The host refused or failed the call; the text says what it reported.
    Failed(String),
}

/// Read and edit the request headers (pseudo-headers such as `:path` included).
pub trait RequestHeaders {
    /// First value of request header `name`, if present.
    fn request_header(&self, name: &str) -> Option<String>;
    /// Every request header as `(name, value)`, in wire order.
    fn request_headers(&self) -> Vec<(String, String)>;
    /// Replace every value of `name` with `value`.
    fn set_request_header(&mut self, name: &str, value: &str);
    /// Append one more value of `name`.
    fn add_request_header(&mut self, name: &str, value: &str);
    /// Remove every value of `name`.
    fn remove_request_header(&mut self, name: &str);
}

/// Read the response headers (response-side stages decide by them, e.g. on
/// `content-type`).
pub trait ResponseHeaders {
    /// First value of response header `name`, if present.
    fn response_header(&self, name: &str) -> Option<String>;
}

/// Set response headers while the response headers pass (rate-limit headers on admitted
/// responses).
pub trait EditResponseHeaders {
    /// Replace every value of response header `name` with `value`.
    fn set_response_header(&mut self, name: &str, value: &str);
}

/// The claims of the JWT that Envoy's own `jwt_authn` filter verified on this request. The
/// gateway never checks a signature itself: a host answers only when `jwt_authn` left its
/// verified payload in the request's dynamic metadata (namespace
/// `envoy.filters.http.jwt_authn`, key `jwt_payload`).
pub trait VerifiedJwt {
    /// The string claim `name` of the verified JWT; `None` when no JWT was verified on this
    /// request or the claim is absent or not a string.
    fn verified_jwt_claim(&self, name: &str) -> Option<String>;
}

/// Where the per-request billing record goes for Envoy's access loggers to ship (native:
/// dynamic metadata `infergate.usage` / `record`; proxy-wasm, which cannot set dynamic
/// metadata: the filter state `wasm.infergate.usage`).
pub trait UsageRecordSink {
    /// Store `record` (one JSON object) as this request's billing record.
    fn write_usage_record(&mut self, record: &str) -> Result<(), HostError>;
}

/// The request body the host has buffered so far (the filter paused until end of stream).
pub trait RequestBody {
    /// Up to `len` bytes of the buffered body from `start`; `None` if there is no body.
    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>>;
    /// Replace the whole buffered body once it is complete (the adapter fixes
    /// `content-length`, so the upstream reads exactly `body`).
    fn replace_request_body(&mut self, body: &[u8]) -> Result<(), HostError>;
}

/// The response body, one chunk at a time while it streams through unbuffered: read and
/// rewrite the chunk of the current response-body event. A rewrite that changes a chunk's
/// length is for streamed (length-less) responses: a `content-length` already sent stays.
pub trait ResponseChunk {
    /// The bytes of the chunk passing now, `None` if the host cannot hand them over.
    fn response_chunk(&self) -> Option<Vec<u8>>;
    /// Send `bytes` on in place of the chunk passing now.
    fn replace_response_chunk(&mut self, bytes: &[u8]) -> Result<(), HostError>;
}

/// Answer the request locally instead of forwarding it.
pub trait LocalReply {
    /// Send `reply` to the client; the filter then returns [`crate::FilterStatus::Replied`].
    fn send_local_reply(&mut self, reply: &Reply);
}

/// Stop a request whose response has started: nothing can be answered any more.
pub trait ResetStream {
    /// Reset the stream in both directions (the client sees it cut off); `details` says
    /// why, where the host records it (Envoy's response code details).
    fn reset_stream(&mut self, details: &str);
}

/// What a [`Waker`] does when woken: tell the host to resume the request it was made for.
pub trait WakeSignal: Send {
    /// Resume the request (a no-op once the request is gone).
    fn wake(self: Box<Self>);
}

/// A one-shot handle that resumes a paused request, from any thread (native: the
/// stream's scheduler, which runs the resume on the worker that owns the stream) or from
/// another context (Wasm). A stage takes one before it answers
/// [`crate::FilterStatus::Pause`], hands it to whatever it waits for, and is resumed
/// through [`crate::pipeline::Stage::on_resume`] on the request's own thread.
pub struct Waker {
    signal: Box<dyn WakeSignal>,
}

impl core::fmt::Debug for Waker {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Waker")
    }
}

impl Waker {
    /// A waker sending `signal`.
    pub fn new(signal: impl WakeSignal + 'static) -> Waker {
        Waker {
            signal: Box::new(signal),
        }
    }

    /// Resume the request.
    pub fn wake(self) {
        self.signal.wake();
    }
}

/// Pause a request and resume it later (flow-control queueing, an answer from elsewhere).
pub trait RequestWaker {
    /// A waker for the current request.
    fn request_waker(&mut self) -> Result<Waker, HostError>;
}

/// Make the host match the route again after a stage changed route-relevant request
/// headers (dynamic modules: clear the route cache; proxy-wasm does it on every header
/// edit).
pub trait RouteRefresh {
    /// Re-match the route on the current request headers.
    fn refresh_route(&mut self);
}

/// The host's own cap on a buffered request body, below which a stage's limit must fit
/// (Envoy answers a plain-text 413 itself once a buffered body passes the stream's buffer
/// limit).
pub trait BodyBufferLimit {
    /// Let the host buffer at least `bytes` of this request's body.
    fn ensure_body_buffer(&mut self, bytes: u64);
}

/// A version number of a published snapshot: proxy-wasm's shared-data CAS, or a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnapshotVersion(pub u64);

/// What [`SnapshotSource::snapshot_if_changed`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotFetch {
    /// Nothing was ever published.
    Missing,
    /// The published version is the one the caller already holds.
    Unchanged,
    /// A different version: its encoded bytes.
    Changed {
        /// The version of `bytes`.
        version: SnapshotVersion,
        /// The encoded snapshot (`scheduler_core::snapshot::encode`).
        bytes: Vec<u8>,
    },
}

/// Read the newest published metric snapshot (proxy-wasm shared data, or a process-wide
/// slot in the native flavour).
pub trait SnapshotSource {
    /// The newest snapshot if its version differs from `known` (so an unchanged snapshot
    /// costs no copy and no decode where the host can tell cheaply).
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch;
}

/// Publish an encoded metric snapshot for the pickers to read.
pub trait SnapshotSink {
    /// Store `bytes` as the newest snapshot.
    fn publish_snapshot(&mut self, bytes: &[u8]) -> Result<(), HostError>;
}

/// The host's clock.
pub trait Clock {
    /// Milliseconds since the Unix epoch (any fixed origin works: only differences matter).
    fn now(&self) -> Millis;
}

/// A source of random numbers (tie-breaking and random pickers).
pub trait Random {
    /// A uniformly distributed `u64`.
    fn random_u64(&mut self) -> u64;
}

/// Counters and gauges, and the error log line that explains a counted problem. Keys are
/// built once at configuration time ([`StatKey`]); the adapter maps a key to its host's
/// metric id (and may cache that mapping).
pub trait Stats {
    /// Add `delta` to the counter `key`.
    fn counter_add(&mut self, key: &StatKey, delta: u64);
    /// Set the gauge `key` to `value`.
    fn gauge_set(&mut self, key: &StatKey, value: u64);
    /// Add the signed `delta` to the gauge `key`. Gauges that several independent states
    /// feed (in-flight counts: one picker state per Wasm VM, one Envoy stat for all VMs)
    /// move only by deltas, so the host's value is the sum over every state.
    fn gauge_add(&mut self, key: &StatKey, delta: i64);
    /// Record `value` in the histogram `key`.
    fn histogram_record(&mut self, key: &StatKey, value: u64);
    /// Log `message` at error level: a problem an operator must fix (a configuration
    /// inconsistency, a failing scraper), reported next to the stat that counts it.
    fn log_error(&mut self, message: &str);
}

/// One outbound HTTP request (a scrape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CalloutRequest {
    /// The Envoy cluster to send it through.
    pub cluster: String,
    /// Request headers, pseudo-headers (`:method`, `:path`, `:authority`) included.
    pub headers: Vec<(String, String)>,
    /// Request body (empty for a GET).
    pub body: Vec<u8>,
    /// Give up after this many milliseconds.
    pub timeout_ms: u64,
}

/// The host's handle of a dispatched callout, echoed back with its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CalloutToken(pub u64);

/// How a callout ended, as the adapter reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CalloutOutcome {
    /// A response arrived (any status).
    Response {
        /// HTTP status code (`:status`).
        status: u16,
        /// The response body.
        body: Vec<u8>,
    },
    /// A response arrived whose body is larger than the receiver accepts; the adapter did
    /// not copy it (see `crate::scraper::Scraper::callout_outcome`).
    TooLarge {
        /// HTTP status code (`:status`).
        status: u16,
        /// The body's length as the host reported it.
        body_bytes: usize,
    },
    /// No response: connection failure, reset or timeout.
    Failed,
}

/// Send outbound HTTP requests; responses come back to the caller through its adapter.
pub trait HttpCallout {
    /// Dispatch `request`; the returned token identifies its outcome later.
    fn dispatch_callout(&mut self, request: &CalloutRequest) -> Result<CalloutToken, HostError>;
}

/// Set per-request dynamic metadata (string values).
pub trait DynamicMetadata {
    /// Set `namespace`.`key` = `value` in the request's dynamic metadata.
    fn set_metadata_string(
        &mut self,
        namespace: &str,
        key: &str,
        value: &str,
    ) -> Result<(), HostError>;
}

/// Read the request's dynamic metadata (what the gateway's own config, such as Envoy's
/// `set_metadata` filter, or an earlier filter left there; never a client).
pub trait ReadMetadata {
    /// The value of `namespace`.`key`: a string as one element, a list of strings element by
    /// element. `None` when absent, of another type, or unreadable on this host.
    fn metadata_strings(&self, namespace: &str, key: &str) -> Option<Vec<String>>;
}

/// The cluster Envoy's route chose for this request (with weighted clusters, the one drawn
/// for it), matched on the request's current headers.
pub trait RoutedCluster {
    /// The cluster's name; `None` when the host cannot tell (no route, or no way to ask).
    fn routed_cluster(&mut self) -> Option<String>;
}

/// The upstream host that actually served the request (a retry may have moved it off the
/// pick), read while the response headers pass.
pub trait ServedUpstream {
    /// `ip:port` of the upstream host the response came from; `None` when there was none
    /// (a local reply) or the host cannot tell.
    fn served_upstream(&self) -> Option<String>;
}

/// Per-stream state shared by the filters of one request (Envoy filter state): the router
/// leaves the picker a [`crate::handoff::Handoff`] here. Only filters write it, never a
/// client.
pub trait StreamState {
    /// Store `value` under `key` for the rest of this stream.
    fn set_stream_state(&mut self, key: &str, value: &[u8]) -> Result<(), HostError>;
    /// The bytes stored under `key` on this stream, if any.
    fn stream_state(&self, key: &str) -> Option<Vec<u8>>;
}

/// The members of an Envoy cluster as the host sees them (native: the cluster's hosts and
/// their health, from the dynamic-module load-balancer policy). The scraper follows its
/// configured clusters through this in membership mode `host`.
pub trait ClusterMembership {
    /// The members of `cluster` (`ip:port` and health); `None` when this host cannot tell
    /// (no such cluster known yet, or no way to ask), which keeps the last membership.
    fn cluster_members(&self, cluster: &str) -> Option<Vec<scheduler_core::snapshot::Member>>;
}

/// A host that cannot see any cluster's members.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoClusterMembership;

impl ClusterMembership for NoClusterMembership {
    fn cluster_members(&self, _cluster: &str) -> Option<Vec<scheduler_core::snapshot::Member>> {
        None
    }
}
