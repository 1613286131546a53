//! The filters crate's host capabilities, implemented on one Envoy HTTP stream.
//!
//! [`StreamHost`] lives as long as its stream's pipeline run and is re-bound to the stream's
//! `filter_envoy_ptr` at the top of every hook ([`StreamHost::bind`]), so every capability
//! call goes to the stream of the hook that is running. On the body hook that completes the
//! request, a stage that asks for the body gets it copied out of Envoy's buffered and received
//! slices then (a stage that does not need it, such as a picker that picked from the router's
//! handoff, costs no copy). [`HostConfig`] is what a filter config lends every stream's host;
//! the `From` impls turn the pipeline's [`FilterStatus`] into the status Envoy's hook
//! expects.

use std::sync::Arc;

use infergate_filters::host::{
    BodyBufferLimit, Clock, DynamicMetadata, EditResponseHeaders, HostError, LocalReply, Random,
    ReadMetadata, RequestBody, RequestHeaders, RequestWaker, ResetStream, ResponseChunk,
    ResponseHeaders, RouteRefresh, RoutedCluster, ServedUpstream, SnapshotFetch, SnapshotSource,
    SnapshotVersion, Stats, StreamState, UsageRecordSink, VerifiedJwt, Waker,
};
use infergate_filters::reply::Reply;
use infergate_filters::stats::{StatKey, StatKind};
use infergate_filters::FilterStatus;
use scheduler_core::types::Millis;
use std::cell::Cell;

use crate::abi::{BodyKind, BodyStatus, HeaderKind, HeadersStatus, TrailersStatus};
use crate::host::EnvoyStream;
use crate::scheduler::Scheduler;
use crate::stats::StatsRegistry;

/// What one filter config lends the host of every stream.
pub struct HostConfig {
    /// The metrics defined on the filter config, and their moves not yet flushed.
    pub stats: StatsRegistry,
    /// The config's place in the flush ticker's list (`None`: stats go to Envoy at once).
    pub flush: Option<crate::flush::FlushTicks>,
}

/// Which hook a [`StreamHost`] is serving, for the capabilities valid in only some.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookKind {
    /// A request-body (or request-trailers) hook: the current chunk is readable.
    RequestBody,
    /// A response-body hook: the chunk passing now is readable and rewritable.
    ResponseBody,
    /// Any other hook (headers, a scheduled resume, the end).
    Other,
}

/// Host capabilities on one stream (see the module doc).
pub struct StreamHost {
    envoy: EnvoyStream,
    config: Arc<HostConfig>,
    hook: HookKind,
    /// Whether the request body is complete (seen at end of stream), and so readable.
    body_complete: bool,
    /// Made on the first pause, shared with every waker handed out.
    scheduler: Option<Arc<Scheduler>>,
    /// The local reply this stream's stages sent, if one did. Envoy never runs a module's
    /// response hooks for that module's own local reply, so the pipeline delivers its
    /// headers to the stages itself (`crate::pipeline`), answered from here.
    sent_reply: Option<SentReply>,
    /// Inside a scheduled event, a local reply or reset is held here until the run ended
    /// ([`StreamHost::defer_stops`]).
    deferring: bool,
    deferred: Option<DeferredStop>,
}

/// A local reply or reset a stage asked for while stops were deferred.
#[derive(Debug)]
enum DeferredStop {
    Reply(Reply),
    Reset(String),
}

/// A local reply as sent: its status and headers.
#[derive(Clone, Debug)]
struct SentReply {
    status: u16,
    headers: Vec<(String, String)>,
}

impl StreamHost {
    /// A host for a new stream; [`StreamHost::bind`] it before the first call.
    pub fn new(config: Arc<HostConfig>) -> StreamHost {
        StreamHost {
            // SAFETY: NULL is never called through: every hook binds its own pointer first.
            envoy: unsafe { EnvoyStream::from_hook(core::ptr::null_mut()) },
            config,
            hook: HookKind::Other,
            body_complete: false,
            scheduler: None,
            sent_reply: None,
            deferring: false,
            deferred: None,
        }
    }

    /// Hold a local reply or reset a stage asks for until [`StreamHost::apply_deferred_stop`]
    /// (`on`), or send them at once (off). Outside the request path's own hooks (a scheduled
    /// event), Envoy completes and logs the stream inside the call that stops it, re-entering
    /// no hook of this module: the run must end first, so that what it leaves for the access
    /// log (the billing record) is there.
    pub fn defer_stops(&mut self, on: bool) {
        self.deferring = on;
    }

    /// Whether a stop waits for [`StreamHost::apply_deferred_stop`].
    pub fn has_deferred_stop(&self) -> bool {
        self.deferred.is_some()
    }

    /// Send the local reply or reset held since [`StreamHost::defer_stops`], if any.
    pub fn apply_deferred_stop(&mut self) {
        self.deferring = false;
        match self.deferred.take() {
            Some(DeferredStop::Reply(reply)) => self.send_now(&reply),
            Some(DeferredStop::Reset(details)) => self.envoy.reset_stream(&details),
            None => {}
        }
    }

    fn send_now(&mut self, reply: &Reply) {
        let headers: Vec<(&str, &[u8])> = reply
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        self.envoy.send_response(
            u32::from(reply.status),
            &headers,
            &reply.body,
            "infergate_local_reply",
        );
    }

    /// Whether a stage of this stream sent a local reply.
    pub fn sent_local_reply(&self) -> bool {
        self.sent_reply.is_some()
    }

    /// Points the host at the stream of the hook now running (`hook`: which kind).
    pub fn bind(&mut self, envoy: &EnvoyStream, hook: HookKind) {
        // SAFETY: the pointer of the running hook's stream; the host is only used inside
        // this hook (or the destroy hook of the same stream, see `crate::pipeline`).
        self.envoy = unsafe { EnvoyStream::from_hook(envoy.raw()) };
        self.hook = hook;
    }

    /// Whether a hook ever bound the host (the destroy path needs a stream to talk to).
    pub fn is_bound(&self) -> bool {
        !self.envoy.raw().is_null()
    }

    /// The request body is complete (a body event at end of stream, or headers that ended
    /// the request).
    pub fn mark_body_complete(&mut self) {
        self.body_complete = true;
    }

    /// The stream of the last bound hook.
    pub fn envoy(&mut self) -> &mut EnvoyStream {
        &mut self.envoy
    }
}

impl From<FilterStatus> for HeadersStatus {
    /// A paused or answered request stops header iteration.
    fn from(status: FilterStatus) -> HeadersStatus {
        match status {
            FilterStatus::Continue => HeadersStatus::Continue,
            FilterStatus::Pause | FilterStatus::Replied => HeadersStatus::StopIteration,
        }
    }
}

impl From<FilterStatus> for BodyStatus {
    /// A paused request keeps buffering its body; an answered one drops it.
    fn from(status: FilterStatus) -> BodyStatus {
        match status {
            FilterStatus::Continue => BodyStatus::Continue,
            FilterStatus::Pause => BodyStatus::StopIterationAndBuffer,
            FilterStatus::Replied => BodyStatus::StopIterationNoBuffer,
        }
    }
}

impl From<FilterStatus> for TrailersStatus {
    /// A paused or answered request stops at its trailers.
    fn from(status: FilterStatus) -> TrailersStatus {
        match status {
            FilterStatus::Continue => TrailersStatus::Continue,
            FilterStatus::Pause | FilterStatus::Replied => TrailersStatus::StopIteration,
        }
    }
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl RequestHeaders for StreamHost {
    fn request_header(&self, name: &str) -> Option<String> {
        self.envoy
            .header(HeaderKind::RequestHeaders, name)
            .map(text)
    }
    fn request_headers(&self) -> Vec<(String, String)> {
        self.envoy
            .headers(HeaderKind::RequestHeaders)
            .into_iter()
            .map(|(k, v)| (k, text(v)))
            .collect()
    }
    fn set_request_header(&mut self, name: &str, value: &str) {
        self.envoy
            .set_header(HeaderKind::RequestHeaders, name, Some(value.as_bytes()));
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        self.envoy
            .add_header(HeaderKind::RequestHeaders, name, value.as_bytes());
    }
    fn remove_request_header(&mut self, name: &str) {
        self.envoy
            .set_header(HeaderKind::RequestHeaders, name, None);
    }
}

impl ResponseHeaders for StreamHost {
    fn response_header(&self, name: &str) -> Option<String> {
        if let Some(reply) = &self.sent_reply {
            if name == ":status" {
                return Some(reply.status.to_string());
            }
            return reply
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone());
        }
        self.envoy
            .header(HeaderKind::ResponseHeaders, name)
            .map(text)
    }
}

impl EditResponseHeaders for StreamHost {
    fn set_response_header(&mut self, name: &str, value: &str) {
        self.envoy
            .set_header(HeaderKind::ResponseHeaders, name, Some(value.as_bytes()));
    }
}

impl VerifiedJwt for StreamHost {
    fn verified_jwt_claim(&self, name: &str) -> Option<String> {
        // The ABI reads only top-level metadata values, not jwt_authn's nested payload: its
        // presence says the bearer token was verified, and the claims are read from it.
        if !self
            .envoy
            .has_metadata_namespace(infergate_filters::jwt::JWT_AUTHN_NAMESPACE)
        {
            return None;
        }
        let authorization = self.request_header("authorization")?;
        infergate_filters::jwt::claim_of_verified_bearer(&authorization, name)
    }
}

/// Where the native flavour leaves the billing record: dynamic metadata, which every Envoy
/// access logger can read (`%DYNAMIC_METADATA(infergate.usage:record)%`).
const USAGE_NAMESPACE: &str = "infergate.usage";

impl UsageRecordSink for StreamHost {
    fn write_usage_record(&mut self, record: &str) -> Result<(), HostError> {
        self.envoy
            .set_metadata_string(USAGE_NAMESPACE, "record", record);
        Ok(())
    }
}

impl RequestBody for StreamHost {
    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        if !self.body_complete {
            return None;
        }
        // One copy out of Envoy, cut to the asked range in place.
        let mut body = self.envoy.request_body();
        let end = start.saturating_add(len).min(body.len());
        if start > end {
            return None;
        }
        body.truncate(end);
        body.drain(..start);
        Some(body)
    }
    fn replace_request_body(&mut self, body: &[u8]) -> Result<(), HostError> {
        if !self.body_complete {
            return Err(HostError::Failed(
                "the request body is not complete yet".into(),
            ));
        }
        // In the body hook that ends the request, the body is split between what Envoy
        // buffered and the last chunk: empty the buffer and make the last chunk the whole
        // new body. Elsewhere (a resume after the body was held) Envoy holds all of it in
        // its buffer.
        let (drain, write) = if self.hook == HookKind::RequestBody {
            (Some(BodyKind::BufferedRequest), BodyKind::ReceivedRequest)
        } else {
            (None, BodyKind::BufferedRequest)
        };
        if let Some(kind) = drain {
            if self.envoy.body_size(kind) > 0 && !self.envoy.replace_body(kind, &[]) {
                return Err(HostError::Failed(
                    "draining the buffered body failed".into(),
                ));
            }
        }
        if !self.envoy.replace_body(write, body) {
            return Err(HostError::Failed(
                "replacing the request body failed".into(),
            ));
        }
        let len = body.len().to_string();
        self.envoy.set_header(
            HeaderKind::RequestHeaders,
            "content-length",
            Some(len.as_bytes()),
        );
        Ok(())
    }
}

impl ResponseChunk for StreamHost {
    fn response_chunk(&self) -> Option<Vec<u8>> {
        if self.hook != HookKind::ResponseBody {
            return None;
        }
        let mut out = Vec::new();
        self.envoy
            .read_body_into(BodyKind::ReceivedResponse, &mut out);
        Some(out)
    }
    fn replace_response_chunk(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        if self.hook != HookKind::ResponseBody {
            return Err(HostError::Failed("no response chunk is passing".into()));
        }
        if self.envoy.replace_body(BodyKind::ReceivedResponse, bytes) {
            Ok(())
        } else {
            Err(HostError::Failed("Envoy refused the chunk rewrite".into()))
        }
    }
}

impl RequestWaker for StreamHost {
    fn request_waker(&mut self) -> Result<Waker, HostError> {
        if self.scheduler.is_none() {
            self.scheduler = Scheduler::new(&mut self.envoy);
        }
        match &self.scheduler {
            Some(scheduler) => Ok(scheduler.waker()),
            None => Err(HostError::Failed("Envoy gave no scheduler".into())),
        }
    }
}

impl RouteRefresh for StreamHost {
    fn refresh_route(&mut self) {
        self.envoy.clear_route_cache();
    }
}

impl BodyBufferLimit for StreamHost {
    fn ensure_body_buffer(&mut self, bytes: u64) {
        self.envoy.ensure_buffer_limit(bytes);
    }
}

impl ResetStream for StreamHost {
    fn reset_stream(&mut self, details: &str) {
        if self.deferring {
            self.deferred = Some(DeferredStop::Reset(details.to_owned()));
        } else {
            self.envoy.reset_stream(details);
        }
    }
}

impl LocalReply for StreamHost {
    fn send_local_reply(&mut self, reply: &Reply) {
        self.sent_reply = Some(SentReply {
            status: reply.status,
            headers: reply.headers.clone(),
        });
        if self.deferring {
            self.deferred = Some(DeferredStop::Reply(reply.clone()));
        } else {
            self.send_now(reply);
        }
    }
}

impl Stats for StreamHost {
    fn counter_add(&mut self, key: &StatKey, delta: u64) {
        // Adding nothing is a no-op, not worth a call into Envoy.
        if delta == 0 {
            return;
        }
        let stats = &self.config.stats;
        if stats.buffered() {
            stats.counter_add(key, delta);
        } else if let Some((id, labels)) = stats.resolve(StatKind::Counter, key) {
            self.envoy.increment_counter(id, &labels, delta);
        }
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        let stats = &self.config.stats;
        if stats.buffered() {
            stats.gauge_set(key, value);
        } else if let Some((id, labels)) = stats.resolve(StatKind::Gauge, key) {
            self.envoy.set_gauge(id, &labels, value);
        }
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        if delta == 0 {
            return;
        }
        let stats = &self.config.stats;
        if stats.buffered() {
            stats.gauge_add(key, delta);
        } else if let Some((id, labels)) = stats.resolve(StatKind::Gauge, key) {
            self.envoy.add_gauge(id, &labels, delta);
        }
    }
    fn histogram_record(&mut self, key: &StatKey, value: u64) {
        if let Some((id, labels)) = self.config.stats.resolve(StatKind::Histogram, key) {
            self.envoy.record_histogram(id, &labels, value);
        }
    }
    fn log_error(&mut self, message: &str) {
        crate::log::error(message);
    }
}

impl DynamicMetadata for StreamHost {
    fn set_metadata_string(
        &mut self,
        namespace: &str,
        key: &str,
        value: &str,
    ) -> Result<(), HostError> {
        self.envoy.set_metadata_string(namespace, key, value);
        Ok(())
    }
}

impl ReadMetadata for StreamHost {
    fn metadata_strings(&self, namespace: &str, key: &str) -> Option<Vec<String>> {
        self.envoy.metadata_strings(namespace, key)
    }
}

impl RoutedCluster for StreamHost {
    fn routed_cluster(&mut self) -> Option<String> {
        self.envoy.cluster_name()
    }
}

impl ServedUpstream for StreamHost {
    fn served_upstream(&self) -> Option<String> {
        // `upstream.address`: the upstream host of the last attempt (the one that answered).
        self.envoy
            .attribute_string(crate::abi::ATTRIBUTE_UPSTREAM_ADDRESS)
            .filter(|address| !address.is_empty())
    }
}

impl StreamState for StreamHost {
    fn set_stream_state(&mut self, key: &str, value: &[u8]) -> Result<(), HostError> {
        if self.envoy.set_filter_state_bytes(key, value) {
            Ok(())
        } else {
            Err(HostError::Failed(format!(
                "Envoy refused filter state {key}"
            )))
        }
    }
    fn stream_state(&self, key: &str) -> Option<Vec<u8>> {
        self.envoy.filter_state_bytes(key)
    }
}

impl Clock for StreamHost {
    fn now(&self) -> Millis {
        wall_clock()
    }
}

impl Random for StreamHost {
    fn random_u64(&mut self) -> u64 {
        thread_random()
    }
}

impl SnapshotSource for StreamHost {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        crate::shared::SNAPSHOT.fetch_if_changed(known)
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn wall_clock() -> Millis {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Millis(ms)
}

thread_local! {
    /// One generator state per worker thread: no lock on the request path. Seeded lazily.
    static RNG: Cell<Option<u64>> = const { Cell::new(None) };
}

/// A random `u64` (SplitMix64 step) from this thread's generator, seeded from std's
/// per-process random hasher keys, the clock and the thread id.
pub fn thread_random() -> u64 {
    RNG.with(|cell| {
        let state = cell.get().unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hash, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            std::thread::current().id().hash(&mut h);
            wall_clock().0.hash(&mut h);
            h.finish()
        });
        let state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        cell.set(Some(state));
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}
