//! Picker tests against the fake host. Shared helpers here; [`routing`] covers pool
//! confinement, rejections and failure modes, [`state`] in-flight accounting, prefix and
//! session affinity, snapshot caching and thread safety, [`locking`] what runs inside the
//! shared state and what outside, [`gauges`] the in-flight gauges and the report of
//! endpoints the scraper does not cover, [`pools`] per-pool locks and leases that give
//! themselves back, [`endpoints`] the pool of the routed cluster, data-parallel ports,
//! fallbacks, the subset hint and the served endpoint, [`lora`] the memory of the LoRA
//! adapters sent to each endpoint, [`members`] pools that follow their cluster's
//! membership.

pub(super) use scheduler_core::metrics::EndpointMetrics;
pub(super) use scheduler_core::snapshot::{encode, EndpointSample, Snapshot};
pub(super) use scheduler_core::types::Millis;
pub(super) use serde_json::{json, Value};

pub(super) use super::*;
pub(super) use crate::fake::FakeHost;
pub(super) use crate::headers::{DESTINATION_ENDPOINT, DROPPED_REASON};
pub(super) use crate::host::SnapshotVersion;

pub(super) const A: &str = "10.0.0.1:8000";
pub(super) const B: &str = "10.0.0.2:8000";
pub(super) const C: &str = "10.0.0.3:8000";
pub(super) const NOW: u64 = 100_000;

pub(super) fn shared(pool: Value) -> PickerShared {
    match PickerShared::from_json(pool) {
        Ok(s) => s,
        Err(e) => unreachable!("test config must build: {e}"),
    }
}

pub(super) fn pool(endpoints: &[&str], extra: Value) -> Value {
    let mut v = json!({"pool": "p", "baseModel": "llama", "endpoints": endpoints});
    if let (Some(obj), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in extra {
            obj.insert(k.clone(), x.clone());
        }
    }
    v
}

pub(super) fn metrics(waiting: u32, kv: f64) -> EndpointMetrics {
    EndpointMetrics {
        waiting: Some(waiting),
        running: Some(0),
        kv_cache_usage: Some(kv),
        ..EndpointMetrics::default()
    }
}

/// A snapshot with every listed endpoint scraped at `at`.
pub(super) fn snapshot(at: u64, endpoints: &[(&str, EndpointMetrics)]) -> Vec<u8> {
    encode(&Snapshot {
        taken_at: Millis(at),
        clusters: Vec::new(),
        endpoints: endpoints
            .iter()
            .map(|(address, m)| EndpointSample {
                address: (*address).to_owned(),
                scraped_at: Millis(at),
                consecutive_failures: 0,
                metrics: Some(m.clone()),
            })
            .collect(),
    })
}

pub(super) fn fresh_all(endpoints: &[&str]) -> Vec<u8> {
    let list: Vec<(&str, EndpointMetrics)> =
        endpoints.iter().map(|e| (*e, metrics(0, 0.1))).collect();
    snapshot(NOW, &list)
}

pub(super) fn chat(content: &str) -> Vec<u8> {
    json!({"model": "llama", "messages": [{"role": "user", "content": content}]})
        .to_string()
        .into_bytes()
}

pub(super) fn host_for(body: &[u8], snapshot: Option<Vec<u8>>) -> FakeHost {
    let h = FakeHost::new()
        .request_header(BASE_MODEL, "llama")
        .post("/v1/chat/completions", body)
        .now(NOW);
    match snapshot {
        Some(bytes) => h.snapshot(1, bytes),
        None => h,
    }
}

/// Headers + one complete body callback.
pub(super) fn drive(
    shared: &mut PickerShared,
    host: &mut FakeHost,
    req: &mut PickerRequest,
) -> FilterStatus {
    let first = req.on_request_headers(&mut *shared, host, false);
    if first != FilterStatus::Pause {
        return first;
    }
    let len = host.body.len();
    req.on_request_body(shared, host, len, true)
}

pub(super) fn pick_one(
    shared: &mut PickerShared,
    host: &mut FakeHost,
) -> (FilterStatus, PickerRequest) {
    let mut req = PickerRequest::new();
    let status = drive(shared, host, &mut req);
    (status, req)
}

pub(super) fn requests_in_flight(shared: &PickerShared, address: &str) -> u32 {
    shared
        .inflight(PoolId(0), address)
        .map_or(u32::MAX, |l| l.requests)
}

mod endpoints;
mod gauges;
mod handoff;
mod locking;
mod lora;
mod members;
mod pools;
mod precise;
mod routing;
mod state;
