//! A fake Envoy for unit tests: defines every callback declared in `abi::callbacks` (so the
//! test binary links without Envoy) and records what the module asked for in a thread-local,
//! so the exported hooks can be driven exactly as Envoy would drive them.
//!
//! Test-only (`#[cfg(test)]`): the real `.so` never contains these definitions.
#![allow(clippy::missing_safety_doc)]

use crate::abi::{
    BodyKind, CalloutInitResult, EnvoyBuffer, EnvoyHttpHeader, FilterResetReason, HeaderKind,
    HttpFilterConfigEnvoyPtr, HttpFilterConfigSchedulerPtr, HttpFilterEnvoyPtr,
    HttpFilterSchedulerPtr, LogLevel, MetricsResult, ModuleBuffer, ModuleHttpHeader,
};
use std::cell::RefCell;

/// A local reply the module sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// HTTP status.
    pub status: u32,
    /// Headers as sent.
    pub headers: Vec<(String, String)>,
    /// Body as text.
    pub body: String,
    /// Response code details.
    pub details: String,
}

/// Everything the fake records for one test thread.
#[derive(Default, Debug)]
pub struct State {
    /// Log lines.
    pub logs: Vec<String>,
    /// Header maps by kind (0..=3).
    pub headers: [Vec<(String, Vec<u8>)>; 4],
    /// Bodies by kind (0..=3).
    pub bodies: [Vec<u8>; 4],
    /// Local replies sent.
    pub replies: Vec<Reply>,
    /// Stream resets requested.
    pub resets: usize,
    /// Calls that read body bytes (`get_body_chunks`).
    pub body_reads: usize,
    /// Route cache clears.
    pub route_cache_clears: usize,
    /// Dynamic metadata set (ns, key, value).
    pub metadata: Vec<(String, String, String)>,
    /// Counters and gauges defined (name); the id is the index.
    pub counters: Vec<String>,
    /// Counter increments and gauge sets (id, labels, value).
    pub increments: Vec<(usize, Vec<String>, u64)>,
    /// Gauge increments (positive) and decrements (negative): (id, labels, delta).
    pub gauge_moves: Vec<(usize, Vec<String>, i64)>,
    /// Config schedulers made (`http_filter_config_scheduler_new`): (config pointer,
    /// scheduler pointer).
    pub config_schedulers: Vec<(usize, usize)>,
    /// Config schedulers deleted, as their pointers.
    pub config_schedulers_deleted: Vec<usize>,
    /// The stats flush's config schedulers (`crate::flush`), live: kept out of
    /// `config_schedulers` and `config_schedulers_deleted`, which are the scraper's.
    pub flush_schedulers: Vec<usize>,
    /// Callouts started (cluster, headers).
    pub callouts: Vec<(String, Vec<(String, String)>)>,
    /// The config pointer each callout of `callouts` was started on.
    pub callout_configs: Vec<usize>,
    /// The stream's buffer limit (Envoy's default for a listener is 1 MiB).
    pub buffer_limit: u64,
    /// What `received_buffered_request_body` answers.
    pub received_is_buffered: bool,
    /// Filter state by key (bytes objects), as the stream's filters set it.
    pub filter_state: Vec<(String, Vec<u8>)>,
    /// When set, callouts fail to start with this result.
    pub callout_init_result: Option<CalloutInitResult>,
    /// Schedulers made on this thread (`http_filter_scheduler_new`), as their pointers.
    pub schedulers: Vec<usize>,
    /// `http_filter_continue_decoding` calls.
    pub continued: usize,
    /// Dynamic metadata the stream carries for the getters: (ns, key, strings; one string
    /// for a string value, `list` true for a list value).
    pub metadata_in: Vec<(String, String, bool, Vec<Vec<u8>>)>,
    /// The cluster the route chose (`get_cluster_name`); `None`: no route.
    pub cluster_name: Option<Vec<u8>>,
    /// Times `get_cluster_name` was called.
    pub cluster_name_reads: usize,
    /// String attributes by id (`filter_get_attribute_string`).
    pub attributes: Vec<(u32, Vec<u8>)>,
}

/// A fake scheduler: counts its commits (from any thread) until it is deleted.
pub struct FakeScheduler {
    /// Events committed so far.
    pub commits: std::sync::atomic::AtomicU64,
}

/// Schedulers deleted, process-wide (deletes may run on any thread).
pub static SCHEDULERS_DELETED: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// The commits of the scheduler at `ptr` (one [`State::schedulers`] entry, not yet deleted).
pub fn commits(ptr: usize) -> u64 {
    // SAFETY: the test passes a pointer the fake made and has not deleted.
    unsafe { &*(ptr as *const FakeScheduler) }
        .commits
        .load(std::sync::atomic::Ordering::SeqCst)
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Clears the recorder for this thread.
pub fn reset() {
    STATE.with(|s| *s.borrow_mut() = State::default());
}

/// Runs `f` on the recorder.
pub fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    STATE.with(|s| f(&mut s.borrow_mut()))
}

/// Log lines so far.
pub fn logs() -> Vec<String> {
    with(|s| s.logs.clone())
}

/// Sets request header `name` (lower-case) to `value`.
pub fn set_request_header(name: &str, value: &str) {
    with(|s| {
        s.headers[0].retain(|(k, _)| k != name);
        s.headers[0].push((name.to_string(), value.as_bytes().to_vec()));
    });
}

/// A request header's current value.
pub fn request_header(name: &str) -> Option<String> {
    with(|s| {
        s.headers[0]
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    })
}

/// A non-null pointer to use as `filter_envoy_ptr` / `config_envoy_ptr`; the fake ignores it.
pub fn dummy_ptr() -> *mut core::ffi::c_void {
    core::ptr::NonNull::<u8>::dangling().as_ptr().cast()
}

fn text(b: ModuleBuffer) -> String {
    if b.ptr.is_null() {
        return String::new();
    }
    // SAFETY: the module passes buffers that are valid for the call.
    let bytes = unsafe { core::slice::from_raw_parts(b.ptr.cast::<u8>(), b.length) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Copies the `n` headers the module lent for one callback (local replies, callouts).
///
/// # Safety
/// `headers` must point to `n` valid headers whose buffers live for the call.
unsafe fn module_headers(headers: *mut ModuleHttpHeader, n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            // SAFETY: `i < n`, per the caller's contract.
            let h = unsafe { *headers.add(i) };
            let k = ModuleBuffer {
                ptr: h.key_ptr,
                length: h.key_length,
            };
            let v = ModuleBuffer {
                ptr: h.value_ptr,
                length: h.value_length,
            };
            (text(k), text(v))
        })
        .collect()
}

fn envoy_buf(bytes: &[u8]) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: bytes.as_ptr().cast(),
        length: bytes.len(),
    }
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_log(_level: LogLevel, message: ModuleBuffer) {
    let line = text(message);
    let _ = STATE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            s.logs.push(line);
        }
    });
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_header(
    _f: HttpFilterEnvoyPtr,
    kind: HeaderKind,
    key: ModuleBuffer,
    result: *mut EnvoyBuffer,
    index: usize,
    optional_size: *mut usize,
) -> bool {
    let key = text(key);
    with(|s| {
        let values: Vec<&Vec<u8>> = s.headers[kind as usize]
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v)
            .collect();
        if !optional_size.is_null() {
            // SAFETY: the module passes a writable out-parameter.
            unsafe { *optional_size = values.len() };
        }
        let buf = values
            .get(index)
            .map_or(EnvoyBuffer::EMPTY, |v| envoy_buf(v));
        // SAFETY: as above. The view points into the thread-local, which lives while the test
        // thread does and is not mutated before the module copies it.
        unsafe { *result = buf };
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_headers_size(
    _f: HttpFilterEnvoyPtr,
    kind: HeaderKind,
) -> usize {
    with(|s| s.headers[kind as usize].len())
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_headers(
    _f: HttpFilterEnvoyPtr,
    kind: HeaderKind,
    result: *mut EnvoyHttpHeader,
) -> bool {
    with(|s| {
        for (i, (k, v)) in s.headers[kind as usize].iter().enumerate() {
            // SAFETY: the module allocated `get_headers_size` slots.
            unsafe {
                *result.add(i) = EnvoyHttpHeader {
                    key_ptr: k.as_ptr().cast(),
                    key_length: k.len(),
                    value_ptr: v.as_ptr().cast(),
                    value_length: v.len(),
                };
            }
        }
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_set_header(
    _f: HttpFilterEnvoyPtr,
    kind: HeaderKind,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    let key = text(key);
    let value = (!value.ptr.is_null()).then(|| text(value));
    with(|s| {
        let map = &mut s.headers[kind as usize];
        map.retain(|(k, _)| *k != key);
        if let Some(v) = value {
            map.push((key, v.into_bytes()));
        }
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_add_header(
    _f: HttpFilterEnvoyPtr,
    kind: HeaderKind,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    let (key, value) = (text(key), text(value));
    with(|s| s.headers[kind as usize].push((key, value.into_bytes())));
    true
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_size(
    _f: HttpFilterEnvoyPtr,
    kind: BodyKind,
) -> usize {
    with(|s| s.bodies[kind as usize].len())
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks_size(
    _f: HttpFilterEnvoyPtr,
    kind: BodyKind,
) -> usize {
    with(|s| usize::from(!s.bodies[kind as usize].is_empty()))
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks(
    _f: HttpFilterEnvoyPtr,
    kind: BodyKind,
    result: *mut EnvoyBuffer,
) -> bool {
    with(|s| {
        s.body_reads += 1;
        let body = &s.bodies[kind as usize];
        if !body.is_empty() {
            // SAFETY: the module allocated `get_body_chunks_size` (= 1) slots.
            unsafe { *result = envoy_buf(body) };
        }
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_received_buffered_request_body(
    _f: HttpFilterEnvoyPtr,
) -> bool {
    with(|s| s.received_is_buffered)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_drain_body(
    _f: HttpFilterEnvoyPtr,
    kind: BodyKind,
    n: usize,
) -> bool {
    with(|s| {
        let body = &mut s.bodies[kind as usize];
        let n = n.min(body.len());
        body.drain(..n);
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_append_body(
    _f: HttpFilterEnvoyPtr,
    kind: BodyKind,
    data: ModuleBuffer,
) -> bool {
    let data = text(data);
    with(|s| s.bodies[kind as usize].extend_from_slice(data.as_bytes()));
    true
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_send_response(
    _f: HttpFilterEnvoyPtr,
    status: u32,
    headers: *mut ModuleHttpHeader,
    n: usize,
    body: ModuleBuffer,
    details: ModuleBuffer,
) {
    // SAFETY: the module passes `n` valid headers.
    let hs = unsafe { module_headers(headers, n) };
    let reply = Reply {
        status,
        headers: hs,
        body: text(body),
        details: text(details),
    };
    with(|s| s.replies.push(reply));
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_reset_stream(
    _f: HttpFilterEnvoyPtr,
    _reason: FilterResetReason,
    _details: ModuleBuffer,
) {
    with(|s| s.resets += 1);
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
    _f: HttpFilterEnvoyPtr,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    let key = text(key);
    let value = if value.ptr.is_null() {
        Vec::new()
    } else {
        // SAFETY: the module passes buffers that are valid for the call.
        unsafe { core::slice::from_raw_parts(value.ptr.cast::<u8>(), value.length) }.to_vec()
    };
    // Like Envoy: the object is read-only once set.
    with(|s| {
        if s.filter_state.iter().any(|(k, _)| *k == key) {
            return false;
        }
        s.filter_state.push((key, value));
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_filter_state_bytes(
    _f: HttpFilterEnvoyPtr,
    key: ModuleBuffer,
    result: *mut EnvoyBuffer,
) -> bool {
    let key = text(key);
    with(|s| {
        let Some((_, v)) = s.filter_state.iter().find(|(k, _)| *k == key) else {
            return false;
        };
        // SAFETY: the module passes a writable out-parameter; the view points into the
        // thread-local, which lives while the test runs and is not mutated meanwhile.
        unsafe { *result = envoy_buf(v) };
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_clear_route_cache(_f: HttpFilterEnvoyPtr) {
    with(|s| s.route_cache_clears += 1);
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
    _f: HttpFilterEnvoyPtr,
    ns: ModuleBuffer,
    key: ModuleBuffer,
    value: ModuleBuffer,
) {
    let entry = (text(ns), text(key), text(value));
    with(|s| s.metadata.push(entry));
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_metadata_keys_count(
    _f: HttpFilterEnvoyPtr,
    source: u32,
    ns: ModuleBuffer,
) -> usize {
    let ns = text(ns);
    with(|s| {
        if source != 0 {
            return 0;
        }
        s.metadata.iter().filter(|(n, _, _)| *n == ns).count()
    })
}

/// The metadata entry `ns`/`key` of the stream (source 0 only).
fn metadata_entry<R>(
    source: u32,
    ns: ModuleBuffer,
    key: ModuleBuffer,
    f: impl FnOnce(Option<(bool, &Vec<Vec<u8>>)>) -> R,
) -> R {
    let (ns, key) = (text(ns), text(key));
    with(|s| {
        let entry = s
            .metadata_in
            .iter()
            .find(|(n, k, _, _)| source == 0 && *n == ns && *k == key)
            .map(|(_, _, list, values)| (*list, values));
        f(entry)
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_metadata_string(
    _f: HttpFilterEnvoyPtr,
    source: u32,
    ns: ModuleBuffer,
    key: ModuleBuffer,
    result: *mut EnvoyBuffer,
) -> bool {
    metadata_entry(source, ns, key, |entry| match entry {
        Some((false, values)) => {
            let buf = values.first().map_or(EnvoyBuffer::EMPTY, |v| envoy_buf(v));
            // SAFETY: a writable out-parameter; the view points into the thread-local,
            // which is not mutated before the module copies it.
            unsafe { *result = buf };
            true
        }
        _ => false,
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_metadata_list_size(
    _f: HttpFilterEnvoyPtr,
    source: u32,
    ns: ModuleBuffer,
    key: ModuleBuffer,
    result: *mut usize,
) -> bool {
    metadata_entry(source, ns, key, |entry| match entry {
        Some((true, values)) => {
            // SAFETY: a writable out-parameter.
            unsafe { *result = values.len() };
            true
        }
        _ => false,
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_metadata_list_string(
    _f: HttpFilterEnvoyPtr,
    source: u32,
    ns: ModuleBuffer,
    key: ModuleBuffer,
    index: usize,
    result: *mut EnvoyBuffer,
) -> bool {
    metadata_entry(source, ns, key, |entry| match entry {
        Some((true, values)) => match values.get(index) {
            Some(v) => {
                // SAFETY: as in `get_metadata_string`.
                unsafe { *result = envoy_buf(v) };
                true
            }
            None => false,
        },
        _ => false,
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_cluster_name(
    _f: HttpFilterEnvoyPtr,
    result: *mut EnvoyBuffer,
) -> bool {
    with(|s| {
        s.cluster_name_reads += 1;
        match &s.cluster_name {
            Some(name) => {
                // SAFETY: as in `get_metadata_string`.
                unsafe { *result = envoy_buf(name) };
                true
            }
            None => false,
        }
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
    _f: HttpFilterEnvoyPtr,
    attribute_id: u32,
    result: *mut EnvoyBuffer,
) -> bool {
    with(
        |s| match s.attributes.iter().find(|(id, _)| *id == attribute_id) {
            Some((_, value)) => {
                // SAFETY: as in `get_metadata_string`.
                unsafe { *result = envoy_buf(value) };
                true
            }
            None => false,
        },
    )
}

fn define_counter(name: ModuleBuffer, id: *mut usize) -> MetricsResult {
    let name = text(name);
    with(|s| {
        s.counters.push(name);
        // SAFETY: the module passes a writable out-parameter.
        unsafe { *id = s.counters.len() - 1 };
    });
    crate::abi::METRICS_SUCCESS
}

fn increment(id: usize, labels: *mut ModuleBuffer, n: usize, value: u64) -> MetricsResult {
    let mut ls = Vec::new();
    for i in 0..n {
        // SAFETY: the module passes `n` label buffers.
        ls.push(text(unsafe { *labels.add(i) }));
    }
    with(|s| s.increments.push((id, ls, value)));
    crate::abi::METRICS_SUCCESS
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_counter(
    _c: HttpFilterConfigEnvoyPtr,
    name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _n: usize,
    id: *mut usize,
) -> MetricsResult {
    define_counter(name, id)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_increment_counter(
    _f: HttpFilterEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    increment(id, labels, n, value)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
    _c: HttpFilterConfigEnvoyPtr,
    name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _n: usize,
    id: *mut usize,
) -> MetricsResult {
    define_counter(name, id)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
    _c: HttpFilterConfigEnvoyPtr,
    name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _n: usize,
    id: *mut usize,
) -> MetricsResult {
    define_counter(name, id)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
    _f: HttpFilterEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    increment(id, labels, n, value)
}

fn gauge_move(id: usize, labels: *mut ModuleBuffer, n: usize, delta: i64) -> MetricsResult {
    let mut ls = Vec::new();
    for i in 0..n {
        // SAFETY: the module passes `n` label buffers.
        ls.push(text(unsafe { *labels.add(i) }));
    }
    with(|s| s.gauge_moves.push((id, ls, delta)));
    crate::abi::METRICS_SUCCESS
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_increment_gauge(
    _f: HttpFilterEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    gauge_move(id, labels, n, value as i64)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_decrement_gauge(
    _f: HttpFilterEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    gauge_move(id, labels, n, -(value as i64))
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_set_gauge(
    _f: HttpFilterEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    increment(id, labels, n, value)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
    _c: HttpFilterConfigEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    increment(id, labels, n, value)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_set_gauge(
    _c: HttpFilterConfigEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    increment(id, labels, n, value)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
    _c: HttpFilterConfigEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    gauge_move(id, labels, n, value as i64)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
    _c: HttpFilterConfigEnvoyPtr,
    id: usize,
    labels: *mut ModuleBuffer,
    n: usize,
    value: u64,
) -> MetricsResult {
    gauge_move(id, labels, n, -(value as i64))
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_http_callout(
    c: HttpFilterConfigEnvoyPtr,
    id_out: *mut u64,
    cluster: ModuleBuffer,
    headers: *mut ModuleHttpHeader,
    n: usize,
    _body: ModuleBuffer,
    _timeout_ms: u64,
) -> CalloutInitResult {
    // SAFETY: the module passes `n` valid headers.
    let hs = unsafe { module_headers(headers, n) };
    let cluster = text(cluster);
    with(|s| {
        if let Some(r) = s.callout_init_result {
            return r;
        }
        s.callouts.push((cluster, hs));
        s.callout_configs.push(c as usize);
        // Ids count per config, from 1, as Envoy's do.
        let id = s
            .callout_configs
            .iter()
            .filter(|x| **x == c as usize)
            .count() as u64;
        // SAFETY: the module passes a writable out-parameter.
        unsafe { *id_out = id };
        crate::abi::CALLOUT_INIT_SUCCESS
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
    c: HttpFilterConfigEnvoyPtr,
) -> HttpFilterConfigSchedulerPtr {
    let raw = Box::into_raw(Box::new(FakeScheduler {
        commits: std::sync::atomic::AtomicU64::new(0),
    }));
    with(|s| s.config_schedulers.push((c as usize, raw as usize)));
    raw.cast()
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
    scheduler: HttpFilterConfigSchedulerPtr,
    _event_id: u64,
) {
    // SAFETY: the module commits only on schedulers it has not deleted.
    let scheduler = unsafe { &*scheduler.cast::<FakeScheduler>() };
    scheduler
        .commits
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Marks the config scheduler at `ptr`, just made, as the stats flush's (see
/// [`State::flush_schedulers`]).
pub fn mark_flush_scheduler(ptr: usize) {
    with(|s| {
        s.config_schedulers.retain(|(_, sched)| *sched != ptr);
        s.flush_schedulers.push(ptr);
    });
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
    scheduler: HttpFilterConfigSchedulerPtr,
) {
    with(|s| {
        let flush = s.flush_schedulers.len();
        s.flush_schedulers.retain(|p| *p != scheduler as usize);
        if s.flush_schedulers.len() == flush {
            s.config_schedulers_deleted.push(scheduler as usize);
        }
    });
    // SAFETY: made by `config_scheduler_new` above, deleted once by the module.
    drop(unsafe { Box::from_raw(scheduler.cast::<FakeScheduler>()) });
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_buffer_limit(
    _f: HttpFilterEnvoyPtr,
) -> u64 {
    with(|s| s.buffer_limit)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_set_buffer_limit(
    _f: HttpFilterEnvoyPtr,
    limit: u64,
) {
    with(|s| s.buffer_limit = limit);
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_new(
    _f: HttpFilterEnvoyPtr,
) -> HttpFilterSchedulerPtr {
    let raw = Box::into_raw(Box::new(FakeScheduler {
        commits: std::sync::atomic::AtomicU64::new(0),
    }));
    with(|s| s.schedulers.push(raw as usize));
    raw.cast()
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
    scheduler: HttpFilterSchedulerPtr,
    _event_id: u64,
) {
    // SAFETY: the module commits only on schedulers it has not deleted.
    let scheduler = unsafe { &*scheduler.cast::<FakeScheduler>() };
    scheduler
        .commits
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_delete(
    scheduler: HttpFilterSchedulerPtr,
) {
    // SAFETY: made by `scheduler_new` above, deleted once by the module.
    drop(unsafe { Box::from_raw(scheduler.cast::<FakeScheduler>()) });
    SCHEDULERS_DELETED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_continue_decoding(
    _f: HttpFilterEnvoyPtr,
) {
    with(|s| s.continued += 1);
}

// ----- load-balancer policy -----

/// A fake `DynamicModuleLoadBalancer`: a cluster name and its hosts per priority, each
/// `(address, in the healthy list, raw health value)`. Its [`FakeLb::ptr`] is what the
/// LB callbacks below take as `lb_envoy_ptr`.
pub struct FakeLb {
    inner: Box<FakeLbState>,
}

/// One fake host: address, in the healthy list, raw health value.
type FakeHost = (Vec<u8>, bool, u32);

struct FakeLbState {
    cluster: Vec<u8>,
    /// Hosts per priority.
    hosts: RefCell<Vec<Vec<FakeHost>>>,
}

impl FakeLb {
    /// An instance of `cluster` over `hosts`.
    pub fn new(cluster: &str, hosts: Vec<Vec<(&str, bool, u32)>>) -> FakeLb {
        let lb = FakeLb {
            inner: Box::new(FakeLbState {
                cluster: cluster.as_bytes().to_vec(),
                hosts: RefCell::new(Vec::new()),
            }),
        };
        lb.set_hosts(hosts);
        lb
    }

    /// Replaces the hosts (an EDS update or a health change).
    pub fn set_hosts(&self, hosts: Vec<Vec<(&str, bool, u32)>>) {
        *self.inner.hosts.borrow_mut() = hosts
            .into_iter()
            .map(|p| {
                p.into_iter()
                    .map(|(a, h, raw)| (a.as_bytes().to_vec(), h, raw))
                    .collect()
            })
            .collect();
    }

    /// The pointer Envoy would hand the module.
    pub fn ptr(&self) -> crate::abi::LbEnvoyPtr {
        let state: &FakeLbState = &self.inner;
        (state as *const FakeLbState).cast_mut().cast()
    }
}

/// # Safety
/// `lb` must be a [`FakeLb::ptr`] whose `FakeLb` is alive.
unsafe fn fake_lb<'a>(lb: crate::abi::LbEnvoyPtr) -> &'a FakeLbState {
    // SAFETY: per the contract.
    unsafe { &*lb.cast::<FakeLbState>() }
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_lb_get_cluster_name(
    lb: crate::abi::LbEnvoyPtr,
    result: *mut EnvoyBuffer,
) {
    // SAFETY: the module passes a live fake and a writable out-parameter.
    unsafe { *result = envoy_buf(&fake_lb(lb).cluster) };
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_lb_get_priority_set_size(
    lb: crate::abi::LbEnvoyPtr,
) -> usize {
    // SAFETY: a live fake.
    unsafe { fake_lb(lb) }.hosts.borrow().len()
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_lb_get_hosts_count(
    lb: crate::abi::LbEnvoyPtr,
    priority: u32,
) -> usize {
    // SAFETY: a live fake.
    let hosts = unsafe { fake_lb(lb) }.hosts.borrow();
    hosts.get(priority as usize).map_or(0, Vec::len)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_lb_get_healthy_hosts_count(
    lb: crate::abi::LbEnvoyPtr,
    priority: u32,
) -> usize {
    // SAFETY: a live fake.
    let hosts = unsafe { fake_lb(lb) }.hosts.borrow();
    hosts
        .get(priority as usize)
        .map_or(0, |p| p.iter().filter(|h| h.1).count())
}

/// Points `result` at host `index` of `priority` (of the healthy ones when `healthy`).
///
/// # Safety
/// A live fake; `result` writable.
unsafe fn fake_host_address(
    lb: crate::abi::LbEnvoyPtr,
    priority: u32,
    index: usize,
    healthy: bool,
    result: *mut EnvoyBuffer,
) -> bool {
    // SAFETY: per the contract.
    let state = unsafe { fake_lb(lb) };
    let hosts = state.hosts.borrow();
    let found = hosts
        .get(priority as usize)
        .and_then(|p| p.iter().filter(|h| h.1 || !healthy).nth(index))
        .map(|h| envoy_buf(&h.0));
    // SAFETY: the bytes live in the fake (not moved by the borrow ending); `result` writable.
    unsafe { *result = found.unwrap_or(EnvoyBuffer::EMPTY) };
    found.is_some()
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_lb_get_host_address(
    lb: crate::abi::LbEnvoyPtr,
    priority: u32,
    index: usize,
    result: *mut EnvoyBuffer,
) -> bool {
    // SAFETY: forwarded contract.
    unsafe { fake_host_address(lb, priority, index, false, result) }
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_lb_get_healthy_host_address(
    lb: crate::abi::LbEnvoyPtr,
    priority: u32,
    index: usize,
    result: *mut EnvoyBuffer,
) -> bool {
    // SAFETY: forwarded contract.
    unsafe { fake_host_address(lb, priority, index, true, result) }
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_lb_get_host_health(
    lb: crate::abi::LbEnvoyPtr,
    priority: u32,
    index: usize,
) -> u32 {
    // SAFETY: a live fake.
    let hosts = unsafe { fake_lb(lb) }.hosts.borrow();
    hosts
        .get(priority as usize)
        .and_then(|p| p.get(index))
        .map_or(0, |h| h.2)
}
