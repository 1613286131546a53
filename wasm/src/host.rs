//! [`WasmHost`]: the `filters::host` capabilities over proxy-wasm hostcalls, for the
//! context currently being called.
//!
//! Every hostcall goes through `proxy_wasm::hostcalls` directly (not the SDK's trait
//! helpers, which `unwrap` host errors and would abort the VM): an error becomes "absent"
//! for reads and is ignored (or reported as [`HostError`]) for writes.
//!
//! What Envoy 1.40 offers a proxy-wasm filter for routing to the picked endpoint, as found
//! in Envoy's `source/extensions/common/wasm/` and `source/extensions/clusters/original_dst/`:
//! - **Headers.** Request headers the filter sets are the ones the router and the
//!   `ORIGINAL_DST` load balancer read (`use_http_header` + `http_header_name`).
//! - **Dynamic metadata: not settable.** The ABI has no metadata setter; `set_property`
//!   writes filter state under `wasm.<path>` (a `CelState`), not dynamic metadata. So
//!   `envoy.lb` metadata is left to the Envoy config: a `header_to_metadata` filter after
//!   the picker copies `x-gateway-destination-endpoint` into namespace `envoy.lb`.
//!   [`WasmHost`] answers [`HostError::Unsupported`].
//! - **Filter state via the `set_envoy_filter_state` foreign function.** Envoy registers a
//!   filter-state factory for [`ORIGINAL_DST_FILTER_STATE`]; the `ORIGINAL_DST` load
//!   balancer checks that key *before* its metadata key and header. The picker sets it
//!   (an `ip:port` string) as its upstream override, so the pick holds even if some later
//!   filter rewrote the header.
//! - **Per-stream state between two Wasm filters: `set_property` / `get_property` with the
//!   one-element path `[key]`.** Envoy's `Context::setProperty` stores the value as a
//!   bytes `CelState` under filter-state key `wasm.<key>` of the stream (read-only once
//!   set, filter-chain life span); `getProperty`'s top-level lookup of a name that is no
//!   built-in attribute reads the same `wasm.<key>` back, serialised as the raw bytes. So
//!   the picker reads what the router wrote on the same stream; a client cannot set it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use infergate_filters::host::{
    CalloutRequest, CalloutToken, Clock, DynamicMetadata, HostError, HttpCallout, LocalReply,
    Random, RequestBody, RequestHeaders, ResponseBody, ResponseHeaders, Resume, SnapshotFetch,
    SnapshotSink, SnapshotSource, SnapshotVersion, Stats, StreamState, UpstreamOverride,
};
use infergate_filters::reply::Reply;
use infergate_filters::stats::StatKey;
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};
use scheduler_core::scheduling::pick::SplitMix64;
use scheduler_core::types::Millis;

/// The `ORIGINAL_DST` cluster's filter-state key (Envoy's well-known filter state).
pub const ORIGINAL_DST_FILTER_STATE: &str = "envoy.network.transport_socket.original_dst_address";

/// Per-VM state every context of the module shares: metric ids, the RNG, settings.
#[derive(Debug)]
pub struct VmShared {
    metric_ids: RefCell<HashMap<String, u32>>,
    rng: RefCell<SplitMix64>,
    /// Shared-data key of the snapshot.
    pub snapshot_key: String,
    /// Whether to set the `ORIGINAL_DST` filter state.
    pub filter_state_override: bool,
}

impl VmShared {
    /// Settings for this VM; the RNG is seeded from the clock and `salt`.
    pub fn new(snapshot_key: String, filter_state_override: bool, salt: u64) -> Self {
        let nanos = hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64);
        VmShared {
            metric_ids: RefCell::new(HashMap::new()),
            rng: RefCell::new(SplitMix64::new(nanos ^ salt.rotate_left(32))),
            snapshot_key,
            filter_state_override,
        }
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

/// The capabilities of the current context.
pub struct WasmHost<'a> {
    vm: &'a VmShared,
}

impl<'a> WasmHost<'a> {
    /// A host view for the context being called now.
    pub fn new(vm: &'a VmShared) -> Self {
        WasmHost { vm }
    }
}

fn map_get(map: MapType, name: &str) -> Option<String> {
    hostcalls::get_map_value(map, name).ok().flatten()
}

fn map_all(map: MapType) -> Vec<(String, String)> {
    hostcalls::get_map(map).unwrap_or_default()
}

impl RequestHeaders for WasmHost<'_> {
    fn request_header(&self, name: &str) -> Option<String> {
        map_get(MapType::HttpRequestHeaders, name)
    }
    fn request_headers(&self) -> Vec<(String, String)> {
        map_all(MapType::HttpRequestHeaders)
    }
    fn set_request_header(&mut self, name: &str, value: &str) {
        let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, name, Some(value));
    }
    fn add_request_header(&mut self, name: &str, value: &str) {
        let _ = hostcalls::add_map_value(MapType::HttpRequestHeaders, name, value);
    }
    fn remove_request_header(&mut self, name: &str) {
        let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, name);
    }
}

impl ResponseHeaders for WasmHost<'_> {
    fn response_header(&self, name: &str) -> Option<String> {
        map_get(MapType::HttpResponseHeaders, name)
    }
    fn response_headers(&self) -> Vec<(String, String)> {
        map_all(MapType::HttpResponseHeaders)
    }
    fn set_response_header(&mut self, name: &str, value: &str) {
        let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, name, Some(value));
    }
    fn add_response_header(&mut self, name: &str, value: &str) {
        let _ = hostcalls::add_map_value(MapType::HttpResponseHeaders, name, value);
    }
    fn remove_response_header(&mut self, name: &str) {
        let _ = hostcalls::remove_map_value(MapType::HttpResponseHeaders, name);
    }
}

impl RequestBody for WasmHost<'_> {
    fn request_body(&self, start: usize, len: usize) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::HttpRequestBody, start, len)
            .ok()
            .flatten()
    }
    fn replace_request_body(&mut self, body: &[u8]) -> Result<(), HostError> {
        // start 0 with a length past the end replaces the whole buffered body.
        hostcalls::set_buffer(BufferType::HttpRequestBody, 0, usize::MAX, body)
            .map_err(|s| HostError::Failed(format!("{s:?}")))
    }
}

impl ResponseBody for WasmHost<'_> {
    fn response_chunk(&self, len: usize) -> Option<Vec<u8>> {
        hostcalls::get_buffer(BufferType::HttpResponseBody, 0, len)
            .ok()
            .flatten()
    }
}

impl LocalReply for WasmHost<'_> {
    fn send_local_reply(&mut self, reply: &Reply) {
        let headers: Vec<(&str, &str)> = reply
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        if let Err(status) =
            hostcalls::send_http_response(u32::from(reply.status), headers, Some(&reply.body))
        {
            log(
                LogLevel::Error,
                &format!("send_http_response failed: {status:?}"),
            );
        }
    }
}

impl Resume for WasmHost<'_> {
    fn resume_request(&mut self) {
        let _ = hostcalls::resume_http_request();
    }
}

impl SnapshotSource for WasmHost<'_> {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        match hostcalls::get_shared_data(&self.vm.snapshot_key) {
            Ok((Some(bytes), cas)) => {
                let version = SnapshotVersion(u64::from(cas.unwrap_or(0)));
                if known == Some(version) && cas.is_some() {
                    SnapshotFetch::Unchanged
                } else {
                    SnapshotFetch::Changed { version, bytes }
                }
            }
            _ => SnapshotFetch::Missing,
        }
    }
}

impl SnapshotSink for WasmHost<'_> {
    fn publish_snapshot(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        hostcalls::set_shared_data(&self.vm.snapshot_key, Some(bytes), None)
            .map_err(|s| HostError::Failed(format!("{s:?}")))
    }
}

impl Clock for WasmHost<'_> {
    fn now(&self) -> Millis {
        let ms = hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Millis(ms)
    }
}

impl Random for WasmHost<'_> {
    fn random_u64(&mut self) -> u64 {
        match self.vm.rng.try_borrow_mut() {
            Ok(mut rng) => rng.next_u64(),
            Err(_) => 0,
        }
    }
}

impl Stats for WasmHost<'_> {
    fn counter_add(&mut self, key: &StatKey, delta: u64) {
        if delta == 0 {
            return;
        }
        if let Some(id) = self.vm.metric_id(key, MetricType::Counter) {
            let _ = hostcalls::increment_metric(id, i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        if let Some(id) = self.vm.metric_id(key, MetricType::Gauge) {
            let _ = hostcalls::record_metric(id, value);
        }
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        // Envoy adds a signed increment to a gauge, so every VM's deltas sum in one stat.
        if delta == 0 {
            return;
        }
        if let Some(id) = self.vm.metric_id(key, MetricType::Gauge) {
            let _ = hostcalls::increment_metric(id, delta);
        }
    }
    fn log_error(&mut self, message: &str) {
        log(LogLevel::Error, message);
    }
}

impl HttpCallout for WasmHost<'_> {
    fn dispatch_callout(&mut self, request: &CalloutRequest) -> Result<CalloutToken, HostError> {
        let headers: Vec<(&str, &str)> = request
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let body = (!request.body.is_empty()).then_some(request.body.as_slice());
        hostcalls::dispatch_http_call(
            &request.cluster,
            headers,
            body,
            Vec::new(),
            Duration::from_millis(request.timeout_ms),
        )
        .map(|token| CalloutToken(u64::from(token)))
        .map_err(|s| HostError::Failed(format!("{s:?}")))
    }
}

impl DynamicMetadata for WasmHost<'_> {
    fn set_metadata_string(
        &mut self,
        _ns: &str,
        _key: &str,
        _value: &str,
    ) -> Result<(), HostError> {
        Err(HostError::Unsupported)
    }
}

impl UpstreamOverride for WasmHost<'_> {
    fn set_upstream_override(&mut self, endpoint: &str) -> Result<(), HostError> {
        if !self.vm.filter_state_override {
            return Err(HostError::Unsupported);
        }
        let args = set_filter_state_args(ORIGINAL_DST_FILTER_STATE, endpoint);
        hostcalls::call_foreign_function("set_envoy_filter_state", Some(&args))
            .map(|_| ())
            .map_err(|s| HostError::Failed(format!("{s:?}")))
    }
}

impl StreamState for WasmHost<'_> {
    fn set_stream_state(&mut self, key: &str, value: &[u8]) -> Result<(), HostError> {
        hostcalls::set_property(vec![key], Some(value))
            .map_err(|s| HostError::Failed(format!("{s:?}")))
    }
    fn stream_state(&self, key: &str) -> Option<Vec<u8>> {
        hostcalls::get_property(vec![key]).ok().flatten()
    }
}

/// The protobuf `SetEnvoyFilterStateArguments { string path = 1; string value = 2; }`
/// (Envoy's `set_envoy_filter_state.proto`); the life span field is left at its default
/// (filter chain), which covers the router's upstream selection.
pub fn set_filter_state_args(path: &str, value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + value.len() + 12);
    for (tag, text) in [(0x0a_u8, path), (0x12_u8, value)] {
        out.push(tag);
        push_varint(&mut out, text.len() as u64);
        out.extend_from_slice(text.as_bytes());
    }
    out
}

fn push_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_state_arguments_are_protobuf_fields_1_and_2() {
        let args = set_filter_state_args("k", "1.2.3.4:80");
        let mut expected = vec![0x0a, 1, b'k', 0x12, 10];
        expected.extend_from_slice(b"1.2.3.4:80");
        assert_eq!(args, expected);
    }

    #[test]
    fn long_fields_use_multi_byte_varints() {
        let long = "x".repeat(300);
        let args = set_filter_state_args(&long, "");
        // 300 = 0b1_0010_1100 → 0xac 0x02.
        assert_eq!(args.get(..3), Some(&[0x0a, 0xac, 0x02][..]));
        assert_eq!(args.len(), 3 + 300 + 2);
    }
}
