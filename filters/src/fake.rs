//! A builder-style fake host implementing every capability trait in memory, so the filters
//! are tested without a proxy: build it with the request the test wants, drive a state
//! machine, then assert on what the filter did (headers, replies, stats, callouts).
//!
//! ```ignore
//! let mut host = FakeHost::new()
//!     .request_header(":path", "/v1/completions")
//!     .body(br#"{"model":"m","prompt":"hi"}"#)
//!     .now(1_000);
//! ```

use std::collections::BTreeMap;

use scheduler_core::types::Millis;

use crate::host::{
    BodyBufferLimit, CalloutRequest, CalloutToken, Clock, ClusterMembership, DynamicMetadata,
    EditResponseHeaders, HostError, HttpCallout, LocalReply, Random, ReadMetadata, RequestBody,
    RequestHeaders, RequestWaker, ResetStream, ResponseChunk, ResponseHeaders, RouteRefresh,
    RoutedCluster, ServedUpstream, SnapshotFetch, SnapshotSink, SnapshotSource, SnapshotVersion,
    Stats, StreamState, UsageRecordSink, VerifiedJwt, WakeSignal, Waker,
};
use crate::reply::Reply;
use crate::stats::StatKey;
use scheduler_core::scheduling::pick::SplitMix64;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// The in-memory host. Public fields are what tests assert on.
#[derive(Clone, Debug)]
pub struct FakeHost {
    /// Request headers, in order.
    pub request_headers: Vec<(String, String)>,
    /// Response headers, in order.
    pub response_headers: Vec<(String, String)>,
    /// The buffered request body.
    pub body: Vec<u8>,
    /// The response chunk passing now (stages may rewrite it).
    pub response_chunk: Vec<u8>,
    /// Local replies sent, in order.
    pub replies: Vec<Reply>,
    /// Stream resets asked for, with their details, in order.
    pub resets: Vec<String>,
    /// Wakers handed out by `request_waker`.
    pub wakers_made: u32,
    /// Times a waker of this host was woken (from any thread).
    pub wakes: Arc<AtomicU32>,
    /// Times `refresh_route` was called.
    pub route_refreshes: u32,
    /// The largest body buffer a stage asked for.
    pub body_buffer: u64,
    /// The clock.
    pub now: Millis,
    /// The random source.
    pub rng: SplitMix64,
    /// Counters by flattened name.
    pub counters: BTreeMap<String, u64>,
    /// Gauges by flattened name.
    pub gauges: BTreeMap<String, u64>,
    /// `gauge_add` calls that would have taken a gauge below zero (left unchanged).
    pub gauge_underflows: u32,
    /// Histogram values by flattened name, in recording order.
    pub histograms: BTreeMap<String, Vec<u64>>,
    /// Lines logged through `Stats::log_error`.
    pub error_logs: Vec<String>,
    /// The published snapshot, if any.
    pub snapshot: Option<(SnapshotVersion, Vec<u8>)>,
    /// How many times the snapshot bytes were copied out (to test version caching).
    pub snapshot_reads: std::cell::Cell<u32>,
    /// Callouts dispatched, with their tokens.
    pub callouts: Vec<(CalloutToken, CalloutRequest)>,
    /// Make `dispatch_callout` fail.
    pub fail_dispatch: bool,
    /// Dynamic metadata set, as `(namespace, key, value)`; `None` → unsupported host.
    pub metadata: Option<Vec<(String, String, String)>>,
    /// Per-stream state ([`StreamState`]) by key.
    pub stream_state: BTreeMap<String, Vec<u8>>,
    /// How many times the request body was read (to prove a path did not read it).
    pub body_reads: std::cell::Cell<u32>,
    /// The claims of the JWT Envoy's `jwt_authn` verified on this request, if any.
    pub verified_jwt: Option<BTreeMap<String, String>>,
    /// Billing records written, in order.
    pub usage_records: Vec<String>,
    /// Dynamic metadata the request carries for [`ReadMetadata`]: `(namespace, key)` → its
    /// strings (one for a string value, several for a list).
    pub request_metadata: BTreeMap<(String, String), Vec<String>>,
    /// The cluster Envoy's route chose (`None`: the host cannot tell).
    pub routed_cluster: Option<String>,
    /// Times [`RoutedCluster::routed_cluster`] was asked.
    pub cluster_reads: u32,
    /// The upstream host that served (`None`: the host cannot tell).
    pub served_upstream: Option<String>,
    /// The members of each cluster the host can tell ([`ClusterMembership`]); a cluster
    /// absent here is one the host cannot tell.
    pub cluster_members: BTreeMap<String, Vec<scheduler_core::snapshot::Member>>,
    next_token: u64,
}

impl Default for FakeHost {
    fn default() -> Self {
        FakeHost::new()
    }
}

impl FakeHost {
    /// An empty host: no headers, no body, clock at 0, metadata supported.
    pub fn new() -> Self {
        FakeHost {
            request_headers: Vec::new(),
            response_headers: Vec::new(),
            body: Vec::new(),
            response_chunk: Vec::new(),
            replies: Vec::new(),
            resets: Vec::new(),
            wakers_made: 0,
            wakes: Arc::new(AtomicU32::new(0)),
            route_refreshes: 0,
            body_buffer: 0,
            now: Millis(0),
            rng: SplitMix64::new(7),
            counters: BTreeMap::new(),
            gauges: BTreeMap::new(),
            gauge_underflows: 0,
            histograms: BTreeMap::new(),
            error_logs: Vec::new(),
            snapshot: None,
            snapshot_reads: std::cell::Cell::new(0),
            callouts: Vec::new(),
            fail_dispatch: false,
            metadata: Some(Vec::new()),
            stream_state: BTreeMap::new(),
            body_reads: std::cell::Cell::new(0),
            verified_jwt: None,
            usage_records: Vec::new(),
            request_metadata: BTreeMap::new(),
            routed_cluster: None,
            cluster_reads: 0,
            served_upstream: None,
            cluster_members: BTreeMap::new(),
            next_token: 1,
        }
    }

    /// The number of times a waker of this host was woken.
    pub fn woken(&self) -> u32 {
        self.wakes.load(Ordering::SeqCst)
    }

    /// Add a request header.
    pub fn request_header(mut self, name: &str, value: &str) -> Self {
        self.request_headers
            .push((name.to_owned(), value.to_owned()));
        self
    }

    /// A POST to `path` with a JSON body.
    pub fn post(self, path: &str, body: &[u8]) -> Self {
        self.request_header(":method", "POST")
            .request_header(":path", path)
            .body(body)
    }

    /// Set the buffered request body.
    pub fn body(mut self, body: &[u8]) -> Self {
        self.body = body.to_vec();
        self
    }

    /// Set the clock.
    pub fn now(mut self, ms: u64) -> Self {
        self.now = Millis(ms);
        self
    }

    /// Seed the random source.
    pub fn seed(mut self, seed: u64) -> Self {
        self.rng = SplitMix64::new(seed);
        self
    }

    /// Publish a snapshot as if a scraper had.
    pub fn snapshot(mut self, version: u64, bytes: Vec<u8>) -> Self {
        self.snapshot = Some((SnapshotVersion(version), bytes));
        self
    }

    /// The cluster Envoy's route chose for the request.
    pub fn routed_to(mut self, cluster: &str) -> Self {
        self.routed_cluster = Some(cluster.to_owned());
        self
    }

    /// Dynamic metadata `namespace`.`key` the request carries (one value: a string).
    pub fn with_metadata(mut self, namespace: &str, key: &str, values: &[&str]) -> Self {
        self.request_metadata.insert(
            (namespace.to_owned(), key.to_owned()),
            values.iter().map(|v| (*v).to_owned()).collect(),
        );
        self
    }

    /// First value of response header `name`.
    pub fn response(&self, name: &str) -> Option<&str> {
        self.response_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A host without dynamic metadata (like proxy-wasm on Envoy).
    pub fn without_metadata(mut self) -> Self {
        self.metadata = None;
        self
    }

    /// First value of request header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.request_headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A counter's value (0 if never incremented).
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// The last local reply.
    pub fn last_reply(&self) -> Option<&Reply> {
        self.replies.last()
    }

    /// Sum of the counters whose name starts with `prefix`.
    pub fn counter_sum(&self, prefix: &str) -> u64 {
        self.counters
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| *v)
            .sum()
    }
}

fn remove_all(map: &mut Vec<(String, String)>, name: &str) {
    map.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
}

fn first(map: &[(String, String)], name: &str) -> Option<String> {
    map.iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
}

impl RequestHeaders for FakeHost {
    fn request_header(&self, name: &str) -> Option<String> {
        first(&self.request_headers, name)
    }
    fn request_headers(&self) -> Vec<(String, String)> {
        self.request_headers.clone()
    }
    fn set_request_header(&mut self, name: &str, value: &str) {
        remove_all(&mut self.request_headers, name);
        self.request_headers
            .push((name.to_owned(), value.to_owned()));
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        self.request_headers
            .push((name.to_owned(), value.to_owned()));
    }
    fn remove_request_header(&mut self, name: &str) {
        remove_all(&mut self.request_headers, name);
    }
}

impl ResponseHeaders for FakeHost {
    fn response_header(&self, name: &str) -> Option<String> {
        first(&self.response_headers, name)
    }
}

impl EditResponseHeaders for FakeHost {
    fn set_response_header(&mut self, name: &str, value: &str) {
        remove_all(&mut self.response_headers, name);
        self.response_headers
            .push((name.to_owned(), value.to_owned()));
    }
}

impl VerifiedJwt for FakeHost {
    fn verified_jwt_claim(&self, name: &str) -> Option<String> {
        self.verified_jwt.as_ref()?.get(name).cloned()
    }
}

impl UsageRecordSink for FakeHost {
    fn write_usage_record(&mut self, record: &str) -> Result<(), HostError> {
        self.usage_records.push(record.to_owned());
        Ok(())
    }
}

impl RequestBody for FakeHost {
    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        self.body_reads.set(self.body_reads.get().saturating_add(1));
        if self.body.is_empty() {
            return None;
        }
        let end = start.saturating_add(len).min(self.body.len());
        self.body.get(start..end).map(<[u8]>::to_vec)
    }
    fn replace_request_body(&mut self, body: &[u8]) -> Result<(), HostError> {
        self.body = body.to_vec();
        Ok(())
    }
}

impl ResponseChunk for FakeHost {
    fn response_chunk(&self) -> Option<Vec<u8>> {
        Some(self.response_chunk.clone())
    }
    fn replace_response_chunk(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        self.response_chunk = bytes.to_vec();
        Ok(())
    }
}

impl LocalReply for FakeHost {
    fn send_local_reply(&mut self, reply: &Reply) {
        self.replies.push(reply.clone());
    }
}

impl ResetStream for FakeHost {
    fn reset_stream(&mut self, details: &str) {
        self.resets.push(details.to_owned());
    }
}

/// Counts its wake in the host's `wakes`.
struct FakeWake(Arc<AtomicU32>);

impl WakeSignal for FakeWake {
    fn wake(self: Box<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl RequestWaker for FakeHost {
    fn request_waker(&mut self) -> Result<Waker, HostError> {
        self.wakers_made += 1;
        Ok(Waker::new(FakeWake(Arc::clone(&self.wakes))))
    }
}

impl RouteRefresh for FakeHost {
    fn refresh_route(&mut self) {
        self.route_refreshes += 1;
    }
}

impl BodyBufferLimit for FakeHost {
    fn ensure_body_buffer(&mut self, bytes: u64) {
        self.body_buffer = self.body_buffer.max(bytes);
    }
}

impl SnapshotSource for FakeHost {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        match &self.snapshot {
            None => SnapshotFetch::Missing,
            Some((version, _)) if Some(*version) == known => SnapshotFetch::Unchanged,
            Some((version, bytes)) => {
                self.snapshot_reads.set(self.snapshot_reads.get() + 1);
                SnapshotFetch::Changed {
                    version: *version,
                    bytes: bytes.clone(),
                }
            }
        }
    }
}

impl SnapshotSink for FakeHost {
    fn publish_snapshot(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        let next = self.snapshot.as_ref().map_or(1, |(v, _)| v.0 + 1);
        self.snapshot = Some((SnapshotVersion(next), bytes.to_vec()));
        Ok(())
    }
}

impl Clock for FakeHost {
    fn now(&self) -> Millis {
        self.now
    }
}

impl Random for FakeHost {
    fn random_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }
}

impl Stats for FakeHost {
    fn counter_add(&mut self, key: &StatKey, delta: u64) {
        *self.counters.entry(key.as_str().to_owned()).or_insert(0) += delta;
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        self.gauges.insert(key.as_str().to_owned(), value);
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        let gauge = self.gauges.entry(key.as_str().to_owned()).or_insert(0);
        match gauge.checked_add_signed(delta) {
            Some(value) => *gauge = value,
            // A gauge driven below zero means a release without a matching take.
            None => self.gauge_underflows += 1,
        }
    }
    fn histogram_record(&mut self, key: &StatKey, value: u64) {
        self.histograms
            .entry(key.as_str().to_owned())
            .or_default()
            .push(value);
    }
    fn log_error(&mut self, message: &str) {
        self.error_logs.push(message.to_owned());
    }
}

impl HttpCallout for FakeHost {
    fn dispatch_callout(&mut self, request: &CalloutRequest) -> Result<CalloutToken, HostError> {
        if self.fail_dispatch {
            return Err(HostError::Failed("dispatch refused".to_owned()));
        }
        let token = CalloutToken(self.next_token);
        self.next_token += 1;
        self.callouts.push((token, request.clone()));
        Ok(token)
    }
}

impl DynamicMetadata for FakeHost {
    fn set_metadata_string(
        &mut self,
        namespace: &str,
        key: &str,
        value: &str,
    ) -> Result<(), HostError> {
        match &mut self.metadata {
            None => Err(HostError::Unsupported),
            Some(entries) => {
                entries.retain(|(n, k, _)| !(n == namespace && k == key));
                entries.push((namespace.to_owned(), key.to_owned(), value.to_owned()));
                Ok(())
            }
        }
    }
}

impl ReadMetadata for FakeHost {
    fn metadata_strings(&self, namespace: &str, key: &str) -> Option<Vec<String>> {
        self.request_metadata
            .get(&(namespace.to_owned(), key.to_owned()))
            .cloned()
    }
}

impl RoutedCluster for FakeHost {
    fn routed_cluster(&mut self) -> Option<String> {
        self.cluster_reads += 1;
        self.routed_cluster.clone()
    }
}

impl ServedUpstream for FakeHost {
    fn served_upstream(&self) -> Option<String> {
        self.served_upstream.clone()
    }
}

impl StreamState for FakeHost {
    fn set_stream_state(&mut self, key: &str, value: &[u8]) -> Result<(), HostError> {
        self.stream_state.insert(key.to_owned(), value.to_vec());
        Ok(())
    }
    fn stream_state(&self, key: &str) -> Option<Vec<u8>> {
        self.stream_state.get(key).cloned()
    }
}

impl ClusterMembership for FakeHost {
    fn cluster_members(&self, cluster: &str) -> Option<Vec<scheduler_core::snapshot::Member>> {
        self.cluster_members.get(cluster).cloned()
    }
}

/// Shared-data cells with proxy-wasm's compare-and-swap rules, in memory (a version per
/// write; version 0 writes whatever is there). `conflicts` makes the next writes lose a
/// race (another writer bumps the version first).
#[derive(Debug, Default)]
pub struct FakeCells {
    /// The cells: bytes and version.
    pub map: std::sync::Mutex<std::collections::HashMap<String, (Vec<u8>, u32)>>,
    /// Writes still to lose a race.
    pub conflicts: std::sync::atomic::AtomicUsize,
}

impl crate::quotas::CasCells for std::sync::Arc<FakeCells> {
    fn load(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.map.lock().ok()?.get(key).cloned()
    }
    fn store(&self, key: &str, bytes: &[u8], version: u32) -> crate::quotas::CasWrite {
        use crate::quotas::CasWrite;
        use std::sync::atomic::Ordering;
        let Ok(mut map) = self.map.lock() else {
            return CasWrite::Failed;
        };
        let current = map.get(key).map_or(0, |(_, v)| *v);
        if self.conflicts.load(Ordering::SeqCst) > 0 {
            self.conflicts.fetch_sub(1, Ordering::SeqCst);
            if let Some(entry) = map.get_mut(key) {
                entry.1 += 1;
            }
            return CasWrite::Conflict;
        }
        if version != 0 && version != current {
            return CasWrite::Conflict;
        }
        map.insert(key.to_owned(), (bytes.to_vec(), current + 1));
        CasWrite::Stored
    }
}
