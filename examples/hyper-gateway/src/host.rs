//! The filters' host capabilities on one request of this proxy ([`Host`]), and what every
//! request and the scraper share ([`Shared`]: the snapshot slot, the stats, the callouts'
//! answers). Each trait is a few lines over plain data: headers are `(name, value)` lists
//! with the pseudo-headers (`:method`, `:path`, `:authority`, `:status`) in them, the body is
//! a buffer, and what Envoy would keep in filter state or dynamic metadata is a map.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use infergate_filters::headers::DESTINATION_ENDPOINT;
use infergate_filters::host::*;
use infergate_filters::reply::Reply;
use infergate_filters::stats::StatKey;
use scheduler_core::snapshot::Member;
use scheduler_core::types::Millis;
use tokio::sync::{mpsc, Notify};

/// A scrape's answer: its status and body, or `None` when none came.
pub type Answer = (CalloutToken, Option<(u16, Vec<u8>)>);

/// What the requests and the scraper share.
pub struct Shared {
    /// The newest encoded snapshot and its version (0: none yet).
    snapshot: RwLock<(u64, Vec<u8>)>,
    /// Counters and gauges by flattened name.
    stats: Mutex<BTreeMap<String, i64>>,
    /// Where a scrape's task sends its answer, for the scraper loop.
    pub(crate) answers: mpsc::UnboundedSender<Answer>,
    callouts: AtomicU64,
}

impl Shared {
    pub(crate) fn new(answers: mpsc::UnboundedSender<Answer>) -> Shared {
        let (snapshot, stats) = (RwLock::new((0, Vec::new())), Mutex::default());
        Shared {
            snapshot,
            stats,
            answers,
            callouts: AtomicU64::new(0),
        }
    }

    /// Every stat written so far, by flattened name.
    pub fn stats(&self) -> BTreeMap<String, i64> {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update(&self, key: &StatKey, f: impl FnOnce(&mut i64)) {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        f(stats.entry(key.as_str().to_owned()).or_default());
    }
}

impl SnapshotSource for Shared {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        let slot = self.snapshot.read().unwrap_or_else(PoisonError::into_inner);
        match slot.0 {
            0 => SnapshotFetch::Missing,
            v if known == Some(SnapshotVersion(v)) => SnapshotFetch::Unchanged,
            v => SnapshotFetch::Changed {
                version: SnapshotVersion(v),
                bytes: slot.1.clone(),
            },
        }
    }
}

/// One request's side of the host (the scraper uses one too).
pub struct Host {
    pub(crate) shared: Arc<Shared>,
    pub(crate) request: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) body_complete: bool,
    pub(crate) response: Vec<(String, String)>,
    pub(crate) chunk: Option<Vec<u8>>,
    pub(crate) reply: Option<Reply>,
    pub(crate) served: Option<String>,
    pub(crate) woken: Arc<Notify>,
    state: HashMap<String, Vec<u8>>,
    metadata: HashMap<(String, String), String>,
}

impl Host {
    pub(crate) fn new(shared: Arc<Shared>, request: Vec<(String, String)>) -> Host {
        Host {
            shared,
            request,
            body: Vec::new(),
            body_complete: false,
            response: Vec::new(),
            chunk: None,
            reply: None,
            served: None,
            woken: Arc::default(),
            state: HashMap::new(),
            metadata: HashMap::new(),
        }
    }
}

fn first(headers: &[(String, String)], name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

fn set(headers: &mut Vec<(String, String)>, name: &str, value: &str) {
    headers.retain(|(k, _)| k != name);
    headers.push((name.to_owned(), value.to_owned()));
}

impl RequestHeaders for Host {
    fn request_header(&self, name: &str) -> Option<String> {
        first(&self.request, name)
    }
    fn request_headers(&self) -> Vec<(String, String)> {
        self.request.clone()
    }
    fn set_request_header(&mut self, name: &str, value: &str) {
        set(&mut self.request, name, value);
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        self.request.push((name.to_owned(), value.to_owned()));
    }
    fn remove_request_header(&mut self, name: &str) {
        self.request.retain(|(k, _)| k != name);
    }
}

impl RequestBody for Host {
    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        let end = start.saturating_add(len).min(self.body.len());
        self.body_complete
            .then(|| self.body.get(start..end).map(<[u8]>::to_vec))?
    }
    fn replace_request_body(&mut self, body: &[u8]) -> Result<(), HostError> {
        self.body = body.to_vec();
        set(&mut self.request, "content-length", &body.len().to_string());
        Ok(())
    }
}

impl ResponseHeaders for Host {
    fn response_header(&self, name: &str) -> Option<String> {
        first(&self.response, name)
    }
}

impl EditResponseHeaders for Host {
    fn set_response_header(&mut self, name: &str, value: &str) {
        set(&mut self.response, name, value);
    }
}

impl ResponseChunk for Host {
    fn response_chunk(&self) -> Option<Vec<u8>> {
        self.chunk.clone()
    }
    fn replace_response_chunk(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        self.chunk = Some(bytes.to_vec());
        Ok(())
    }
}

/// This host delivers no wake after a request is routed, so no stage resets a stream here
/// (flow control's eviction, the one user, needs a host that does: Envoy's).
impl ResetStream for Host {
    fn reset_stream(&mut self, _details: &str) {}
}

impl LocalReply for Host {
    fn send_local_reply(&mut self, reply: &Reply) {
        self.reply = Some(reply.clone());
    }
}

struct Wake(Arc<Notify>);

impl WakeSignal for Wake {
    fn wake(self: Box<Self>) {
        self.0.notify_one();
    }
}

impl RequestWaker for Host {
    fn request_waker(&mut self) -> Result<Waker, HostError> {
        Ok(Waker::new(Wake(Arc::clone(&self.woken))))
    }
}

/// No route table: the picker finds the pool by the base model the router set.
impl RouteRefresh for Host {
    fn refresh_route(&mut self) {}
}

impl RoutedCluster for Host {
    fn routed_cluster(&mut self) -> Option<String> {
        None
    }
}

/// The whole body is buffered; the router answers 413 past its own limit.
impl BodyBufferLimit for Host {
    fn ensure_body_buffer(&mut self, _bytes: u64) {}
}

/// No JWT filter in front of this proxy: API keys only.
impl VerifiedJwt for Host {
    fn verified_jwt_claim(&self, _name: &str) -> Option<String> {
        None
    }
}

/// The billing record, one JSON line on stdout (tenancy only).
impl UsageRecordSink for Host {
    fn write_usage_record(&mut self, record: &str) -> Result<(), HostError> {
        println!("{record}");
        Ok(())
    }
}

impl SnapshotSource for Host {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        self.shared.snapshot_if_changed(known)
    }
}

impl SnapshotSink for Host {
    fn publish_snapshot(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        let mut slot = self
            .shared
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *slot = (slot.0 + 1, bytes.to_vec());
        Ok(())
    }
}

impl Clock for Host {
    fn now(&self) -> Millis {
        let since = std::time::UNIX_EPOCH.elapsed().unwrap_or_default();
        Millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }
}

impl Random for Host {
    fn random_u64(&mut self) -> u64 {
        // Each `RandomState` has fresh keys: a well-mixed u64 per call, no generator to keep.
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    }
}

impl Stats for Host {
    fn counter_add(&mut self, key: &StatKey, delta: u64) {
        self.shared
            .update(key, |v| *v = v.saturating_add_unsigned(delta));
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        self.shared
            .update(key, |v| *v = i64::try_from(value).unwrap_or(i64::MAX));
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        self.shared.update(key, |v| *v = v.saturating_add(delta));
    }
    fn histogram_record(&mut self, _key: &StatKey, _value: u64) {}
    fn log_error(&mut self, message: &str) {
        eprintln!("infergate: {message}");
    }
}

impl DynamicMetadata for Host {
    fn set_metadata_string(&mut self, ns: &str, key: &str, value: &str) -> Result<(), HostError> {
        self.metadata
            .insert((ns.to_owned(), key.to_owned()), value.to_owned());
        Ok(())
    }
}

impl ReadMetadata for Host {
    fn metadata_strings(&self, ns: &str, key: &str) -> Option<Vec<String>> {
        self.metadata
            .get(&(ns.to_owned(), key.to_owned()))
            .map(|v| vec![v.clone()])
    }
}

impl ServedUpstream for Host {
    fn served_upstream(&self) -> Option<String> {
        self.served.clone()
    }
}

impl StreamState for Host {
    fn set_stream_state(&mut self, key: &str, value: &[u8]) -> Result<(), HostError> {
        self.state.insert(key.to_owned(), value.to_vec());
        Ok(())
    }
    fn stream_state(&self, key: &str) -> Option<Vec<u8>> {
        self.state.get(key).cloned()
    }
}

/// A scrape goes straight to the address in `x-gateway-destination-endpoint` (what Envoy's
/// ORIGINAL_DST scrape cluster does); its answer comes back to the scraper loop.
impl HttpCallout for Host {
    fn dispatch_callout(&mut self, request: &CalloutRequest) -> Result<CalloutToken, HostError> {
        let token = CalloutToken(self.shared.callouts.fetch_add(1, Ordering::Relaxed));
        let addr = first(&request.headers, DESTINATION_ENDPOINT);
        let path = first(&request.headers, ":path").unwrap_or_default();
        let (answers, timeout) = (self.shared.answers.clone(), request.timeout_ms);
        tokio::spawn(async move {
            let get = crate::get(addr.unwrap_or_default(), path);
            let answer = tokio::time::timeout(std::time::Duration::from_millis(timeout), get);
            let _ = answers.send((token, answer.await.ok().flatten()));
        });
        Ok(token)
    }
}

/// The pools list their endpoints: no cluster to follow.
impl ClusterMembership for Host {
    fn cluster_members(&self, _cluster: &str) -> Option<Vec<Member>> {
        None
    }
}
