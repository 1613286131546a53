//! The filters crate's host capabilities, implemented on one Envoy HTTP stream.
//!
//! [`StreamHost`] lives for one hook call: it borrows the [`EnvoyStream`] of that call and the
//! config's [`StatsRegistry`]; on the body hook that completes the request, a filter that asks
//! for the body gets it copied out of Envoy's buffered and received slices then (a filter
//! that does not need it, such as a picker that picked from the router's handoff, costs no
//! copy). [`HostConfig`] is
//! what a filter config lends those hosts, and builds them the same way for every filter;
//! the `From` impls turn a filter step's [`FilterStatus`] into the status Envoy's hook expects.

use infergate_filters::host::{
    Clock, DynamicMetadata, HostError, LocalReply, Random, RequestBody, RequestHeaders,
    ResponseBody, ResponseHeaders, SnapshotFetch, SnapshotSource, SnapshotVersion, Stats,
    StreamState, UpstreamOverride,
};
use infergate_filters::reply::Reply;
use infergate_filters::stats::{StatKey, StatKind};
use infergate_filters::FilterStatus;
use scheduler_core::types::Millis;
use std::cell::Cell;

use crate::abi::{BodyKind, BodyStatus, HeaderKind, HeadersStatus, TrailersStatus};
use crate::host::EnvoyStream;
use crate::stats::StatsRegistry;

/// What one filter config lends the host of every hook call on its streams.
pub struct HostConfig {
    /// Counter ids defined on the filter config.
    pub stats: StatsRegistry,
    /// Whether `set_upstream_override` asks Envoy to fail rather than fall back.
    pub strict_override: bool,
}

impl HostConfig {
    /// Runs a headers step on a host without a body.
    pub fn headers_step<R>(
        &self,
        envoy: &mut EnvoyStream,
        step: impl FnOnce(&mut StreamHost<'_>) -> R,
    ) -> R {
        step(&mut StreamHost {
            envoy,
            stats: &self.stats,
            body_complete: false,
            strict_override: self.strict_override,
        })
    }

    /// Runs a body step. `step` gets the number of body bytes received so far; the host's
    /// body can be read at end of stream only (the filters only read it once it is complete).
    pub fn body_step<R>(
        &self,
        envoy: &mut EnvoyStream,
        end_of_stream: bool,
        step: impl FnOnce(&mut StreamHost<'_>, usize) -> R,
    ) -> R {
        let len = envoy.request_body_len();
        let mut host = StreamHost {
            envoy,
            stats: &self.stats,
            body_complete: end_of_stream,
            strict_override: self.strict_override,
        };
        step(&mut host, len)
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

/// Host capabilities for one hook call on one stream.
pub struct StreamHost<'a> {
    /// The Envoy stream of the current hook.
    pub envoy: &'a mut EnvoyStream,
    /// Counter ids of the stream's filter config.
    pub stats: &'a StatsRegistry,
    /// Whether the request body is complete (a body step at end of stream), and so readable.
    pub body_complete: bool,
    /// Whether `set_upstream_override` asks Envoy to fail rather than fall back.
    pub strict_override: bool,
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

impl RequestHeaders for StreamHost<'_> {
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

impl ResponseHeaders for StreamHost<'_> {
    fn response_header(&self, name: &str) -> Option<String> {
        self.envoy
            .header(HeaderKind::ResponseHeaders, name)
            .map(text)
    }
    fn response_headers(&self) -> Vec<(String, String)> {
        self.envoy
            .headers(HeaderKind::ResponseHeaders)
            .into_iter()
            .map(|(k, v)| (k, text(v)))
            .collect()
    }
    fn set_response_header(&mut self, name: &str, value: &str) {
        self.envoy
            .set_header(HeaderKind::ResponseHeaders, name, Some(value.as_bytes()));
    }
    fn add_response_header(&mut self, name: &str, value: &str) {
        self.envoy
            .add_header(HeaderKind::ResponseHeaders, name, value.as_bytes());
    }
    fn remove_response_header(&mut self, name: &str) {
        self.envoy
            .set_header(HeaderKind::ResponseHeaders, name, None);
    }
}

impl RequestBody for StreamHost<'_> {
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
        // At end of stream the body is split between what Envoy buffered and the last chunk:
        // empty the buffer and make the last chunk the whole new body.
        let size = self.envoy.body_size(BodyKind::BufferedRequest);
        if size > 0 && !self.envoy.replace_body(BodyKind::BufferedRequest, &[]) {
            return Err(HostError::Failed(
                "draining the buffered body failed".into(),
            ));
        }
        if !self.envoy.replace_body(BodyKind::ReceivedRequest, body) {
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

impl ResponseBody for StreamHost<'_> {
    fn response_chunk(&self, _len: usize) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.envoy
            .read_body_into(BodyKind::ReceivedResponse, &mut out);
        Some(out)
    }
}

impl LocalReply for StreamHost<'_> {
    fn send_local_reply(&mut self, reply: &Reply) {
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
}

impl Stats for StreamHost<'_> {
    fn counter_add(&mut self, key: &StatKey, delta: u64) {
        if let Some((id, labels)) = self.stats.resolve(StatKind::Counter, key) {
            self.envoy.increment_counter(id, &labels, delta);
        }
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        if let Some((id, labels)) = self.stats.resolve(StatKind::Gauge, key) {
            self.envoy.set_gauge(id, &labels, value);
        }
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        if delta == 0 {
            return;
        }
        if let Some((id, labels)) = self.stats.resolve(StatKind::Gauge, key) {
            self.envoy.add_gauge(id, &labels, delta);
        }
    }
    fn log_error(&mut self, message: &str) {
        crate::log::error(message);
    }
}

impl DynamicMetadata for StreamHost<'_> {
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

impl StreamState for StreamHost<'_> {
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

impl UpstreamOverride for StreamHost<'_> {
    fn set_upstream_override(&mut self, endpoint: &str) -> Result<(), HostError> {
        if self
            .envoy
            .set_upstream_override_host(endpoint, self.strict_override)
        {
            Ok(())
        } else {
            Err(HostError::Failed(format!(
                "Envoy refused override host {endpoint}"
            )))
        }
    }
}

impl Clock for StreamHost<'_> {
    fn now(&self) -> Millis {
        wall_clock()
    }
}

impl Random for StreamHost<'_> {
    fn random_u64(&mut self) -> u64 {
        thread_random()
    }
}

impl SnapshotSource for StreamHost<'_> {
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
