//! [`WasmHost`]: the `filters::host` capabilities over proxy-wasm hostcalls, for the
//! context currently being called.
//!
//! Every hostcall goes through [`crate::abi::hostcalls`], which answers every host status
//! as a `Result` and never panics. Header values and properties are read as bytes; where a
//! filter trait wants a `String`, a value that is not UTF-8 (Envoy passes bytes above 0x7F
//! as they arrived) is converted lossily, so `caf\xe9` reads as `caf\u{fffd}`. A read
//! that finds nothing is "absent". A read the host *fails* (any status but `NotFound`) of
//! the request headers or body is also recorded ([`WasmHost::take_failure`]): the HTTP
//! contexts then fail the request closed with 500, because a filter that could not see
//! the headers cannot know it stripped the reserved ones; a local reply the filter sends
//! after such a read becomes that 500 too. Failed writes are ignored (or reported as
//! [`HostError`] where the trait can).
//!
//! What Envoy 1.40 offers a proxy-wasm filter for routing to the picked endpoint, as found
//! in Envoy's `source/extensions/common/wasm/` and
//! `source/extensions/load_balancing_policies/override_host/`:
//! - **Headers.** Request headers the filter sets are the ones the router and the pool
//!   cluster's `override_host` load-balancing policy read (its `header` source): the
//!   picker's ordered list `pick,fallback,...` in `x-gateway-destination-endpoint`.
//! - **Dynamic metadata: not settable.** The ABI has no metadata setter; `set_property`
//!   writes filter state under `wasm.<path>` (a `CelState`), not dynamic metadata. So
//!   `envoy.lb` metadata is left to the Envoy config: a `header_to_metadata` filter after
//!   the picker copies `x-gateway-destination-endpoint` into namespace `envoy.lb`, the
//!   policy's first source. [`WasmHost`] answers [`HostError::Unsupported`].
//! - **Per-stream state between two Wasm filters: `set_property` / `get_property` with the
//!   one-element path `[key]`.** Envoy's `Context::setProperty` stores the value as a
//!   bytes `CelState` under filter-state key `wasm.<key>` of the stream (read-only once
//!   set, filter-chain life span); `getProperty`'s top-level lookup of a name that is no
//!   built-in attribute reads the same `wasm.<key>` back, serialised as the raw bytes. So
//!   the picker reads what the router wrote on the same stream; a client cannot set it.
//! - **What routing chose, by property.** `["xds", "cluster_name"]` is the cluster of the
//!   stream's route (the one drawn by weighted clusters), but only as of the last time a
//!   filter made Envoy resolve the route: it is the stream info's upstream cluster, which a
//!   route-cache clear (the router's header edits) does not update and no proxy-wasm call
//!   refreshes. So the Envoy config puts a filter that resolves the route in front of the
//!   picker (a `header_mutation` filter with no mutations does: it reads its per-route
//!   config); without it, on 1.40, the picker sees the cluster matched before the router
//!   set the base model and finds every pool by base model (counted in
//!   `infergate.picker.pool_by_base_model`). `["upstream", "address"]` is the `ip:port` of
//!   the upstream host that answered; `["metadata", "filter_metadata", ns, key]` walks into
//!   the dynamic metadata and answers a string value as its bytes, a list of strings as a
//!   pairs map of its elements (names; values empty).
//! - **A cluster's hosts: not visible.** The ABI has no call that lists a cluster's members
//!   or their health (a filter sees only the upstream that answered its own request), so
//!   [`ClusterMembership`] answers `None`. The scraper follows its clusters with membership
//!   mode `admin` instead: a periodic callout to Envoy's admin `GET /clusters?format=json`
//!   through a cluster that points at the admin listener. Its limits: the membership is
//!   as old as the last poll (`membershipIntervalMs`, 100 ms by default, plus the callout's
//!   round trip), the admin listener must be reachable from Envoy itself (bound to
//!   loopback, never exposed), and the page lists every cluster, so its size grows with
//!   the whole configuration (the scraper reads at most 16 MiB of it).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use infergate_filters::host::{
    BodyBufferLimit, CalloutRequest, CalloutToken, Clock, ClusterMembership, DynamicMetadata,
    EditResponseHeaders, HostError, HttpCallout, LocalReply, Random, ReadMetadata, RequestBody,
    RequestHeaders, RequestWaker, ResetStream, ResponseChunk, ResponseHeaders, RouteRefresh,
    RoutedCluster, ServedUpstream, SnapshotFetch, SnapshotSink, SnapshotSource, SnapshotVersion,
    Stats, StreamState, UsageRecordSink, VerifiedJwt, WakeSignal, Waker,
};
use infergate_filters::reply::Reply;
use infergate_filters::stats::{StatKey, StatKind};
use scheduler_core::scheduling::pick::SplitMix64;
use scheduler_core::types::Millis;

use crate::abi::hostcalls;
use crate::abi::{BufferType, LogLevel, MapType, MetricType, Status};

/// The longest a root that buffers its streams' metrics lets them wait: its tick period is
/// at most this (a picker without a scraper otherwise ticks every 250 ms).
pub const METRICS_FLUSH_MS: u32 = 100;

/// The hash of the metric maps: fast, for keys that come from configuration.
type FastHash = std::hash::BuildHasherDefault<ahash::AHasher>;

/// What one metric did since the root's last flush ([`VmShared::flush_metrics`]).
#[derive(Clone, Copy, Debug, Default)]
struct PendingMetric {
    /// The value a gauge was last set to.
    set: Option<u64>,
    /// A counter's increments, or a gauge's moves since that set.
    add: i64,
}

/// Per-root state every context of the root shares: metric ids, the counter and gauge
/// moves not yet handed to Envoy, the RNG, settings.
#[derive(Debug)]
pub struct VmShared {
    /// Envoy's metric id by flattened key (looked up on every update: a fast hash, the keys
    /// come from configuration).
    metric_ids: RefCell<HashMap<String, u32, FastHash>>,
    /// Counter and gauge moves by metric id, kept for the root's next tick when the root
    /// ticks ([`VmShared::buffer_metrics`]): a request's updates then cost no hostcall,
    /// and moves that cancel out (a gauge's `-1` and `+1` in one pick) none at all.
    /// `None`: updates go to Envoy at once.
    pending: RefCell<Option<HashMap<u32, PendingMetric, FastHash>>>,
    rng: RefCell<SplitMix64>,
    /// Shared-data key of the snapshot.
    pub snapshot_key: String,
}

impl VmShared {
    /// Settings for this VM; the RNG is seeded from the clock and `salt`.
    pub fn new(snapshot_key: String, salt: u64) -> Self {
        let nanos = hostcalls::current_time_nanos().unwrap_or(0);
        VmShared {
            metric_ids: RefCell::new(HashMap::default()),
            pending: RefCell::new(None),
            rng: RefCell::new(SplitMix64::new(nanos ^ salt.rotate_left(32))),
            snapshot_key,
        }
    }

    /// From now on, keep counter and gauge updates for [`VmShared::flush_metrics`], which
    /// runs at the end of each of the root's ticks and of its scraper's callout answers,
    /// but not after a queue message (one per request at the state owner and at the
    /// worker it answers). So an update reaches Envoy by the root's next tick: the
    /// root's own (the owner's, the scraper's) as well as its streams'.
    pub fn buffer_metrics(&self) {
        if let Ok(mut pending) = self.pending.try_borrow_mut() {
            pending.get_or_insert_with(HashMap::default);
        }
    }

    /// Flushes, then sends later updates to Envoy at once: the root is going, and streams
    /// of it may outlive it with nobody left to flush for them.
    pub fn stop_buffering(&self) {
        self.flush_metrics();
        if let Ok(mut pending) = self.pending.try_borrow_mut() {
            *pending = None;
        }
    }

    /// Hands every metric that moved since the last flush to Envoy: a gauge's last set
    /// value, then its moves since; a counter's increments.
    pub fn flush_metrics(&self) {
        let Ok(mut pending) = self.pending.try_borrow_mut() else {
            return;
        };
        let Some(moved) = pending.as_mut() else {
            return;
        };
        for (&id, metric) in moved.iter() {
            if let Some(value) = metric.set {
                let _ = hostcalls::record_metric(id, value);
            }
            if metric.add != 0 {
                let _ = hostcalls::increment_metric(id, metric.add);
            }
        }
        moved.clear();
    }

    /// Counts `update` for metric `id`: kept for the next flush when buffering (`true`),
    /// else left to the caller to send at once (`false`).
    fn buffer(&self, id: u32, update: MetricUpdate) -> bool {
        let Ok(mut pending) = self.pending.try_borrow_mut() else {
            return false;
        };
        let Some(moved) = pending.as_mut() else {
            return false;
        };
        let metric = moved.entry(id).or_default();
        match update {
            MetricUpdate::Add(delta) => metric.add = metric.add.saturating_add(delta),
            MetricUpdate::Set(value) => {
                // A set supersedes the moves before it.
                metric.set = Some(value);
                metric.add = 0;
            }
        }
        true
    }

    /// Define the metric `key` now (it reads 0 until it moves); a host failure leaves it to
    /// be defined at its first use.
    pub fn define_metric(&self, key: &StatKey, kind: StatKind) {
        let kind = match kind {
            StatKind::Counter => MetricType::Counter,
            StatKind::Gauge => MetricType::Gauge,
            StatKind::Histogram => MetricType::Histogram,
        };
        let _ = self.metric_id(key, kind);
    }

    fn metric_id(&self, key: &StatKey, kind: MetricType) -> Option<u32> {
        let mut ids = self.metric_ids.try_borrow_mut().ok()?;
        if let Some(id) = ids.get(key.as_str()) {
            return Some(*id);
        }
        // Envoy hands out a new id per define call: cache it, one define per name per VM.
        let id = hostcalls::define_metric(kind, key.as_str()).ok()?;
        ids.insert(key.as_str().to_owned(), id);
        Some(id)
    }
}

/// Log through the host, ignoring a failure to log.
pub fn log(level: LogLevel, message: &str) {
    let _ = hostcalls::log(level, message);
}

/// Bytes as text for the filters' `&str` world: lossy where they are not UTF-8.
fn text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

thread_local! {
    /// Streams whose [`Waker`] fired, waiting for `exports` to resume them (a VM runs on
    /// one thread, and a waker of this VM is only ever woken on it).
    static WOKEN: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// The streams woken since the last call, in wake order.
pub fn take_woken() -> Vec<u32> {
    WOKEN
        .try_with(|w| {
            w.try_borrow_mut()
                .map(|mut w| std::mem::take(&mut *w))
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// Wakes one stream of this VM: `exports` makes it the effective context and resumes its
/// pipeline once the callback that woke it returns.
struct StreamWake(u32);

impl WakeSignal for StreamWake {
    fn wake(self: Box<Self>) {
        let _ = WOKEN.try_with(|w| {
            if let Ok(mut w) = w.try_borrow_mut() {
                w.push(self.0);
            }
        });
    }
}

/// The property (filter state `wasm.infergate.request_headers`) through which the router
/// hands the header edits it made after the headers went on to the `headers` role.
pub const HEADER_EDITS_PROPERTY: &str = "infergate.request_headers";

/// One edit of a request header made after the headers went on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HeaderEdit {
    /// Replace every value of the header with this one.
    Set(String, String),
    /// Add a value.
    Add(String, String),
    /// Remove the header.
    Remove(String),
}

/// The request headers of a stream that let them go before reading its body (Envoy's
/// default `allow_on_headers_stop_iteration`: Envoy no longer hands them to the filter): a
/// copy taken as they went on, which later reads see, and the edits made since, which the
/// `headers` role applies downstream.
#[derive(Debug, Default)]
pub struct PassedHeaders {
    headers: Vec<(String, String)>,
    edits: Vec<HeaderEdit>,
}

impl PassedHeaders {
    /// The copy of `headers` as they go on.
    pub fn new(headers: Vec<(String, String)>) -> PassedHeaders {
        PassedHeaders {
            headers,
            edits: Vec::new(),
        }
    }

    /// The edits made since, in order.
    pub fn edits(&self) -> &[HeaderEdit] {
        &self.edits
    }

    fn get(&self, name: &str) -> Option<String> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    }

    fn set(&mut self, name: &str, value: &str) {
        let name = name.to_ascii_lowercase();
        self.headers.retain(|(k, _)| *k != name);
        self.headers.push((name.clone(), value.to_owned()));
        self.edits.push(HeaderEdit::Set(name, value.to_owned()));
    }

    fn add(&mut self, name: &str, value: &str) {
        let name = name.to_ascii_lowercase();
        self.headers.push((name.clone(), value.to_owned()));
        self.edits.push(HeaderEdit::Add(name, value.to_owned()));
    }

    fn remove(&mut self, name: &str) {
        let name = name.to_ascii_lowercase();
        self.headers.retain(|(k, _)| *k != name);
        self.edits.push(HeaderEdit::Remove(name));
    }
}

/// Shared handle of a stream's [`PassedHeaders`].
pub type Passed = Rc<RefCell<PassedHeaders>>;

/// Apply `edits` to the current request headers (the `headers` role).
pub fn apply_header_edits(edits: &[HeaderEdit]) {
    for edit in edits {
        match edit {
            HeaderEdit::Set(name, value) => set_header(MapType::HttpRequestHeaders, name, value),
            HeaderEdit::Add(name, value) => add_header(MapType::HttpRequestHeaders, name, value),
            HeaderEdit::Remove(name) => remove_header(MapType::HttpRequestHeaders, name),
        }
    }
}

/// The capabilities of the current context.
pub struct WasmHost {
    vm: Rc<VmShared>,
    /// The HTTP stream this host serves (its waker resumes it); 0 for a root context.
    stream: u32,
    /// The request headers, once they went on before the body was read.
    passed: Option<Passed>,
    /// A waker was handed out during this callback.
    waker_issued: Cell<bool>,
    /// The size of the response chunk being delivered.
    chunk_len: usize,
    /// The first required read the host failed, if any (see the module doc).
    failure: Cell<Option<(&'static str, Status)>>,
    /// The host's clock as first read during this callback: one callback is one instant
    /// (a view lives for one callback), and each read is a hostcall.
    now: Cell<Option<Millis>>,
}

impl WasmHost {
    /// A host view for the root context being called now.
    pub fn new(vm: &Rc<VmShared>) -> Self {
        WasmHost::for_stream(vm, 0)
    }

    /// A host view for HTTP stream `context_id` (the effective context of its callbacks).
    pub fn for_stream(vm: &Rc<VmShared>, context_id: u32) -> Self {
        WasmHost {
            vm: Rc::clone(vm),
            stream: context_id,
            passed: None,
            waker_issued: Cell::new(false),
            chunk_len: 0,
            failure: Cell::new(None),
            now: Cell::new(None),
        }
    }

    /// This view reads and edits the copy of headers that already went on.
    pub fn with_passed_headers(mut self, passed: Option<Passed>) -> Self {
        self.passed = passed;
        self
    }

    /// Whether a stage took a waker during this callback (a pause that something else
    /// ends, not a wait for the body).
    pub fn waker_issued(&self) -> bool {
        self.waker_issued.get()
    }

    /// The response chunk being delivered is `len` bytes (`proxy_on_response_body`).
    pub fn set_chunk_len(&mut self, len: usize) {
        self.chunk_len = len;
    }

    /// The first required read the host failed since this view was made: what, and how.
    pub fn take_failure(&self) -> Option<(&'static str, Status)> {
        self.failure.take()
    }

    /// `result`'s value, or `None` after recording the failure (the first one is kept).
    fn required<T>(&self, what: &'static str, result: Result<T, Status>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(status) => {
                if self.failure.get().is_none() {
                    self.failure.set(Some((what, status)));
                }
                None
            }
        }
    }

    fn header(&self, map: MapType, name: &str) -> Option<String> {
        let value = hostcalls::header_map_value(map, name);
        self.required("header value", value).flatten().map(text)
    }

    fn headers(&self, map: MapType) -> Vec<(String, String)> {
        let pairs = self.required("header map", hostcalls::header_map_pairs(map));
        pairs
            .unwrap_or_default()
            .into_iter()
            .map(|(name, value)| (text(name), text(value)))
            .collect()
    }
}

fn set_header(map: MapType, name: &str, value: &str) {
    let _ = hostcalls::replace_header_map_value(map, name, value.as_bytes());
}

fn add_header(map: MapType, name: &str, value: &str) {
    let _ = hostcalls::add_header_map_value(map, name, value.as_bytes());
}

fn remove_header(map: MapType, name: &str) {
    let _ = hostcalls::remove_header_map_value(map, name);
}

fn failed(status: Status) -> HostError {
    HostError::Failed(format!("{status:?}"))
}

impl RequestHeaders for WasmHost {
    fn request_header(&self, name: &str) -> Option<String> {
        match &self.passed {
            Some(passed) => passed.try_borrow().ok()?.get(name),
            None => self.header(MapType::HttpRequestHeaders, name),
        }
    }
    fn request_headers(&self) -> Vec<(String, String)> {
        match &self.passed {
            Some(passed) => passed
                .try_borrow()
                .map(|p| p.headers.clone())
                .unwrap_or_default(),
            None => self.headers(MapType::HttpRequestHeaders),
        }
    }
    fn set_request_header(&mut self, name: &str, value: &str) {
        match &self.passed {
            Some(passed) => {
                if let Ok(mut p) = passed.try_borrow_mut() {
                    p.set(name, value);
                }
            }
            None => set_header(MapType::HttpRequestHeaders, name, value),
        }
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        match &self.passed {
            Some(passed) => {
                if let Ok(mut p) = passed.try_borrow_mut() {
                    p.add(name, value);
                }
            }
            None => add_header(MapType::HttpRequestHeaders, name, value),
        }
    }
    fn remove_request_header(&mut self, name: &str) {
        match &self.passed {
            Some(passed) => {
                if let Ok(mut p) = passed.try_borrow_mut() {
                    p.remove(name);
                }
            }
            None => remove_header(MapType::HttpRequestHeaders, name),
        }
    }
}

impl ResponseHeaders for WasmHost {
    fn response_header(&self, name: &str) -> Option<String> {
        // Response-side reads are best effort: nothing security-relevant depends on them.
        hostcalls::header_map_value(MapType::HttpResponseHeaders, name)
            .ok()
            .flatten()
            .map(text)
    }
}

impl EditResponseHeaders for WasmHost {
    fn set_response_header(&mut self, name: &str, value: &str) {
        set_header(MapType::HttpResponseHeaders, name, value);
    }
}

impl VerifiedJwt for WasmHost {
    fn verified_jwt_claim(&self, name: &str) -> Option<String> {
        use infergate_filters::jwt::{JWT_AUTHN_NAMESPACE, JWT_PAYLOAD_KEY};
        let payload = [
            "metadata",
            "filter_metadata",
            JWT_AUTHN_NAMESPACE,
            JWT_PAYLOAD_KEY,
        ];
        // Envoy walks the path into jwt_authn's verified payload; a string claim comes back
        // as its bytes. Any other type would come back in a binary form: not a match.
        let path = [payload[0], payload[1], payload[2], payload[3], name];
        if let Ok(Some(bytes)) = hostcalls::get_property(&path) {
            return String::from_utf8(bytes).ok();
        }
        // A host that cannot walk into the payload still says whether one is there; the
        // claims are then read from the token jwt_authn verified.
        let verified = matches!(hostcalls::get_property(&payload), Ok(Some(_)));
        if !verified {
            return None;
        }
        let authorization = self.request_header("authorization")?;
        infergate_filters::jwt::claim_of_verified_bearer(&authorization, name)
    }
}

/// The property the Wasm flavour leaves the billing record in; Envoy keeps it as the filter
/// state `wasm.infergate.usage` (proxy-wasm cannot set dynamic metadata), which access
/// loggers read as `%FILTER_STATE(wasm.infergate.usage:PLAIN)%`.
const USAGE_PROPERTY: &str = "infergate.usage";

impl UsageRecordSink for WasmHost {
    fn write_usage_record(&mut self, record: &str) -> Result<(), HostError> {
        hostcalls::set_property(&[USAGE_PROPERTY], record.as_bytes()).map_err(failed)
    }
}

/// proxy-wasm shared data as compare-and-swap cells: shared by every VM of one `vm_id` in
/// the Envoy process, so quota buckets kept here are one per process.
#[derive(Clone, Copy, Debug, Default)]
pub struct SharedDataCells;

impl infergate_filters::quotas::CasCells for SharedDataCells {
    fn load(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        hostcalls::get_shared_data(key).ok().flatten()
    }
    fn store(&self, key: &str, bytes: &[u8], version: u32) -> infergate_filters::quotas::CasWrite {
        use infergate_filters::quotas::CasWrite;
        match hostcalls::set_shared_data(key, bytes, version) {
            Ok(()) => CasWrite::Stored,
            Err(Status::CasMismatch) => CasWrite::Conflict,
            Err(_) => CasWrite::Failed,
        }
    }
}

impl RequestBody for WasmHost {
    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, start, len);
        self.required("request body", body).flatten()
    }
    fn replace_request_body(&mut self, body: &[u8]) -> Result<(), HostError> {
        // start 0 with a length past the end replaces the whole buffered body.
        hostcalls::set_buffer(BufferType::HttpRequestBody, 0, usize::MAX, body).map_err(failed)?;
        // Envoy forwards the headers as they are: a `content-length` of the old body would
        // leave the upstream waiting for bytes that never come (a chunked request has none).
        // The headers are still held while a stage reads the body, so the edit counts; when
        // they went on already, the edit goes with the others to the `headers` role.
        if self.passed.is_some() {
            if self.request_header("content-length").is_some() {
                self.set_request_header("content-length", &body.len().to_string());
            }
            return Ok(());
        }
        if let Ok(Some(_)) =
            hostcalls::header_map_value(MapType::HttpRequestHeaders, "content-length")
        {
            let len = body.len().to_string();
            hostcalls::replace_header_map_value(
                MapType::HttpRequestHeaders,
                "content-length",
                len.as_bytes(),
            )
            .map_err(failed)?;
        }
        Ok(())
    }
}

impl ResponseChunk for WasmHost {
    fn response_chunk(&self) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::HttpResponseBody, 0, self.chunk_len)
            .ok()
            .flatten()
    }
    fn replace_response_chunk(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        hostcalls::set_buffer(BufferType::HttpResponseBody, 0, self.chunk_len, bytes)
            .map_err(failed)?;
        self.chunk_len = bytes.len();
        Ok(())
    }
}

impl RequestWaker for WasmHost {
    fn request_waker(&mut self) -> Result<Waker, HostError> {
        if self.stream == 0 {
            return Err(HostError::Unsupported);
        }
        self.waker_issued.set(true);
        Ok(Waker::new(StreamWake(self.stream)))
    }
}

/// Envoy clears the route cache itself whenever a Wasm filter edits the request headers,
/// so the route is matched again with the model headers the router set.
impl RouteRefresh for WasmHost {
    fn refresh_route(&mut self) {}
}

/// The body buffer's size is the listener's `per_connection_buffer_limit_bytes` in the
/// Envoy config (set above the router's limit); a Wasm filter cannot raise it.
impl BodyBufferLimit for WasmHost {
    fn ensure_body_buffer(&mut self, _bytes: u64) {}
}

impl ResetStream for WasmHost {
    /// proxy-wasm's `proxy_close_stream` takes no details: Envoy records its own
    /// (`wasm_close_stream`), so `details` only reaches the log.
    fn reset_stream(&mut self, details: &str) {
        if let Err(status) = hostcalls::reset_http_stream() {
            log(
                LogLevel::Error,
                &format!("resetting the stream ({details}) failed: {status:?}"),
            );
        }
    }
}

impl LocalReply for WasmHost {
    fn send_local_reply(&mut self, reply: &Reply) {
        // An answer built on a read the host failed (a 400 for a body it did not hand
        // over) would blame the client: the request fails closed with 500 instead.
        let internal;
        let reply = if self.failure.get().is_some() {
            internal = Reply::internal("internal error in the gateway filter");
            &internal
        } else {
            reply
        };
        let headers: Vec<(&str, &str)> = reply
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if let Err(status) =
            hostcalls::send_local_response(u32::from(reply.status), &headers, &reply.body)
        {
            log(
                LogLevel::Error,
                &format!("send_local_response failed: {status:?}"),
            );
        }
    }
}

impl SnapshotSource for WasmHost {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        match hostcalls::get_shared_data(&self.vm.snapshot_key) {
            Ok(Some((bytes, cas))) => {
                let version = SnapshotVersion(u64::from(cas));
                // CAS 0 is "no version": always treat it as new.
                if known == Some(version) && cas != 0 {
                    SnapshotFetch::Unchanged
                } else {
                    SnapshotFetch::Changed { version, bytes }
                }
            }
            Ok(None) | Err(_) => SnapshotFetch::Missing,
        }
    }
}

impl SnapshotSink for WasmHost {
    fn publish_snapshot(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        hostcalls::set_shared_data(&self.vm.snapshot_key, bytes, 0).map_err(failed)
    }
}

impl Clock for WasmHost {
    fn now(&self) -> Millis {
        if let Some(now) = self.now.get() {
            return now;
        }
        let now = Millis(hostcalls::current_time_nanos().unwrap_or(0) / 1_000_000);
        self.now.set(Some(now));
        now
    }
}

impl Random for WasmHost {
    fn random_u64(&mut self) -> u64 {
        match self.vm.rng.try_borrow_mut() {
            Ok(mut rng) => rng.next_u64(),
            Err(_) => 0,
        }
    }
}

/// One counter or gauge update.
#[derive(Clone, Copy, Debug)]
enum MetricUpdate {
    /// Add to a counter, or move a gauge.
    Add(i64),
    /// Set a gauge.
    Set(u64),
}

impl Stats for WasmHost {
    fn counter_add(&mut self, key: &StatKey, delta: u64) {
        if delta == 0 {
            return;
        }
        if let Some(id) = self.vm.metric_id(key, MetricType::Counter) {
            let delta = i64::try_from(delta).unwrap_or(i64::MAX);
            if !self.vm.buffer(id, MetricUpdate::Add(delta)) {
                let _ = hostcalls::increment_metric(id, delta);
            }
        }
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        if let Some(id) = self.vm.metric_id(key, MetricType::Gauge) {
            if !self.vm.buffer(id, MetricUpdate::Set(value)) {
                let _ = hostcalls::record_metric(id, value);
            }
        }
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        // Envoy adds a signed increment to a gauge, so every VM's deltas sum in one stat.
        if delta == 0 {
            return;
        }
        if let Some(id) = self.vm.metric_id(key, MetricType::Gauge) {
            if !self.vm.buffer(id, MetricUpdate::Add(delta)) {
                let _ = hostcalls::increment_metric(id, delta);
            }
        }
    }
    fn histogram_record(&mut self, key: &StatKey, value: u64) {
        if let Some(id) = self.vm.metric_id(key, MetricType::Histogram) {
            let _ = hostcalls::record_metric(id, value);
        }
    }
    fn log_error(&mut self, message: &str) {
        log(LogLevel::Error, message);
    }
}

impl HttpCallout for WasmHost {
    fn dispatch_callout(&mut self, request: &CalloutRequest) -> Result<CalloutToken, HostError> {
        let headers: Vec<(&str, &str)> = request
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let timeout_ms = u32::try_from(request.timeout_ms).unwrap_or(u32::MAX);
        hostcalls::http_call(&request.cluster, &headers, &request.body, timeout_ms)
            .map(|token| CalloutToken(u64::from(token)))
            .map_err(failed)
    }
}

impl ClusterMembership for WasmHost {
    /// Never known: see the module doc (membership mode `admin` is the Wasm way).
    fn cluster_members(&self, _cluster: &str) -> Option<Vec<scheduler_core::snapshot::Member>> {
        None
    }
}

impl DynamicMetadata for WasmHost {
    fn set_metadata_string(
        &mut self,
        _ns: &str,
        _key: &str,
        _value: &str,
    ) -> Result<(), HostError> {
        Err(HostError::Unsupported)
    }
}

/// A string property, if present and non-empty.
fn string_property(path: &[&str]) -> Option<String> {
    let bytes = hostcalls::get_property(path).ok().flatten()?;
    (!bytes.is_empty()).then(|| text(bytes))
}

impl ReadMetadata for WasmHost {
    fn metadata_strings(&self, namespace: &str, key: &str) -> Option<Vec<String>> {
        let bytes = hostcalls::get_property(&["metadata", "filter_metadata", namespace, key])
            .ok()
            .flatten()?;
        Some(metadata_strings_of(bytes))
    }
}

/// A metadata value as Envoy serialises it for `get_property`: a string is its bytes, a
/// list is a pairs map of its elements (each element a name, every value empty). Names
/// end in a NUL byte there, and a string value never holds one, so a NUL tells the list
/// apart. Bytes that are neither are one (unusable) string: a hint that names nothing.
fn metadata_strings_of(bytes: Vec<u8>) -> Vec<String> {
    if bytes.contains(&0) {
        if let Some(pairs) = crate::abi::pairs::decode(&bytes) {
            return pairs.into_iter().map(|(name, _)| text(name)).collect();
        }
    }
    vec![text(bytes)]
}

impl RoutedCluster for WasmHost {
    fn routed_cluster(&mut self) -> Option<String> {
        string_property(&["xds", "cluster_name"])
    }
}

impl ServedUpstream for WasmHost {
    fn served_upstream(&self) -> Option<String> {
        string_property(&["upstream", "address"])
    }
}

impl StreamState for WasmHost {
    fn set_stream_state(&mut self, key: &str, value: &[u8]) -> Result<(), HostError> {
        hostcalls::set_property(&[key], value).map_err(failed)
    }
    fn stream_state(&self, key: &str) -> Option<Vec<u8>> {
        // Optional: a reader falls back to its own work when the state is not there.
        hostcalls::get_property(&[key]).ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_string_is_one_value_and_a_list_each_element() {
        assert_eq!(
            metadata_strings_of(b"10.0.0.1:80,10.0.0.2:80".to_vec()),
            ["10.0.0.1:80,10.0.0.2:80"]
        );
        let list = crate::abi::pairs::encode(&[("10.0.0.1:80", ""), ("10.0.0.2:80", "")]);
        assert_eq!(
            metadata_strings_of(list.unwrap_or_default()),
            ["10.0.0.1:80", "10.0.0.2:80"]
        );
        // Neither: one string that names no endpoint (the hint then admits nothing).
        assert_eq!(metadata_strings_of(vec![7, 0, 0]).len(), 1);
    }
}
