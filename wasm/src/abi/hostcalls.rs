//! The hostcalls the module imports (module `env`), each behind a safe function that
//! returns `Result<_, Status>` for every status number and never panics.
//!
//! Ownership of returned memory: a hostcall that returns bytes has the host call the
//! module's `proxy_on_memory_allocate(size)` (see `exports`), write the bytes there and
//! store the pointer and size through the two out-pointers. That block was allocated with
//! the global allocator as `size` bytes of alignment 1, which is exactly the allocation of
//! a `Vec<u8>` of capacity `size`, so [`take_returned`] adopts it as one and frees it when
//! the `Vec` drops. A null pointer is "no bytes". The host is trusted to report the size it
//! asked for (Envoy and the test host do); nothing here can check a lying host.
//!
//! Sizes and enumerations cross the ABI as `u32` on wasm32 (`usize` is 32 bits there).
//! Values that are "absent" by design (`NotFound` from a lookup) come back as `Ok(None)`.

use core::ptr::{null, null_mut};

use super::pairs::{self, Pairs};
use super::{BufferType, LogLevel, MapType, MetricType, Status};

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message: *const u8, message_len: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        buffer: u32,
        start: usize,
        size: usize,
        data: *const u8,
        data_len: usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(
        map: u32,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_len: usize) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_close_stream(stream: u32) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_len: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
        cas: u32,
    ) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, return_id: *mut u32)
        -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_http_call(
        upstream: *const u8,
        upstream_len: usize,
        headers: *const u8,
        headers_len: usize,
        body: *const u8,
        body_len: usize,
        trailers: *const u8,
        trailers_len: usize,
        timeout_ms: u32,
        return_token: *mut u32,
    ) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_len: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_set_property(
        path: *const u8,
        path_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_register_shared_queue(name: *const u8, name_len: usize, return_token: *mut u32)
        -> u32;
    fn proxy_resolve_shared_queue(
        vm_id: *const u8,
        vm_id_len: usize,
        name: *const u8,
        name_len: usize,
        return_token: *mut u32,
    ) -> u32;
    fn proxy_enqueue_shared_queue(token: u32, data: *const u8, data_len: usize) -> u32;
    fn proxy_dequeue_shared_queue(
        token: u32,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
}

/// `proxy_stream_type_t` of the request direction.
const STREAM_HTTP_REQUEST: u32 = 0;

/// Adopt a block the host returned (module doc).
///
/// # Safety
/// `data` is null or a block of exactly `size` bytes that the host obtained from
/// `proxy_on_memory_allocate(size)` and handed over; it is not used elsewhere.
unsafe fn take_returned(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() {
        return Vec::new();
    }
    // SAFETY: per the contract above, `data` is a global-allocator block of `size` bytes,
    // alignment 1, fully written by the host: the allocation of a `Vec<u8>` of that capacity.
    unsafe { Vec::from_raw_parts(data, size, size) }
}

/// Run a hostcall that returns bytes through two out-pointers; the bytes on `Ok`.
fn returning_bytes(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Result<Vec<u8>, Status> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    let code = call(&mut data, &mut size);
    // Adopt whatever was returned even on an error status, so nothing leaks.
    // SAFETY: the host sets the out-pointers only to a block it allocated for us.
    let bytes = unsafe { take_returned(data, size) };
    Status::check(code).map(|()| bytes)
}

/// `Ok(None)` for `NotFound`, the other errors as they are.
fn absent_if_not_found<T>(result: Result<T, Status>) -> Result<Option<T>, Status> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(Status::NotFound) => Ok(None),
        Err(status) => Err(status),
    }
}

/// Log `message` at `level`.
pub fn log(level: LogLevel, message: &str) -> Result<(), Status> {
    // SAFETY: pointer and length of a live `&str`.
    Status::check(unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) })
}

/// The host's wall clock, nanoseconds since the Unix epoch.
pub fn current_time_nanos() -> Result<u64, Status> {
    let mut nanos: u64 = 0;
    // SAFETY: a valid out-pointer to a `u64` on our stack.
    Status::check(unsafe { proxy_get_current_time_nanoseconds(&mut nanos) }).map(|()| nanos)
}

/// Ask for `proxy_on_tick` every `period_ms` milliseconds (0 stops ticks).
pub fn set_tick_period_ms(period_ms: u32) -> Result<(), Status> {
    // SAFETY: no pointers.
    Status::check(unsafe { proxy_set_tick_period_milliseconds(period_ms) })
}

/// Up to `max` bytes of `buffer` from `start`; `None` if the host has no such buffer.
pub fn get_buffer(buffer: BufferType, start: usize, max: usize) -> Result<Option<Vec<u8>>, Status> {
    absent_if_not_found(returning_bytes(|data, size| {
        // SAFETY: valid out-pointers (see `returning_bytes`).
        unsafe { proxy_get_buffer_bytes(buffer as u32, start, max, data, size) }
    }))
}

/// Replace `size` bytes of `buffer` at `start` with `value`.
pub fn set_buffer(
    buffer: BufferType,
    start: usize,
    size: usize,
    value: &[u8],
) -> Result<(), Status> {
    // SAFETY: pointer and length of a live slice.
    Status::check(unsafe {
        proxy_set_buffer_bytes(buffer as u32, start, size, value.as_ptr(), value.len())
    })
}

/// Every pair of `map`, as bytes. A buffer that does not decode is `ParseFailure`.
pub fn header_map_pairs(map: MapType) -> Result<Pairs, Status> {
    let bytes = returning_bytes(|data, size| {
        // SAFETY: valid out-pointers (see `returning_bytes`).
        unsafe { proxy_get_header_map_pairs(map as u32, data, size) }
    })?;
    pairs::decode(&bytes).ok_or(Status::ParseFailure)
}

/// The first value of `key` in `map`, as bytes; `None` if absent.
pub fn header_map_value(map: MapType, key: &str) -> Result<Option<Vec<u8>>, Status> {
    absent_if_not_found(returning_bytes(|data, size| {
        // SAFETY: a live `&str` and valid out-pointers.
        unsafe { proxy_get_header_map_value(map as u32, key.as_ptr(), key.len(), data, size) }
    }))
}

/// Set `key` to exactly `value` in `map`.
pub fn replace_header_map_value(map: MapType, key: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: live slices.
    Status::check(unsafe {
        proxy_replace_header_map_value(
            map as u32,
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Append one value of `key` to `map`.
pub fn add_header_map_value(map: MapType, key: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: live slices.
    Status::check(unsafe {
        proxy_add_header_map_value(
            map as u32,
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Remove every value of `key` from `map`.
pub fn remove_header_map_value(map: MapType, key: &str) -> Result<(), Status> {
    // SAFETY: a live `&str`.
    Status::check(unsafe { proxy_remove_header_map_value(map as u32, key.as_ptr(), key.len()) })
}

/// Answer the current request locally.
pub fn send_local_response(
    status_code: u32,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(), Status> {
    let headers = pairs::encode(headers).ok_or(Status::BadArgument)?;
    // SAFETY: live slices; no details string (null, 0).
    Status::check(unsafe {
        proxy_send_local_response(
            status_code,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

/// Continue the current request after a pause.
pub fn resume_http_request() -> Result<(), Status> {
    // SAFETY: no pointers.
    Status::check(unsafe { proxy_continue_stream(STREAM_HTTP_REQUEST) })
}

/// Reset the current HTTP stream (Envoy: the decoder callbacks' `resetStream`, after the
/// callback returns; the response code details read `wasm_close_stream`).
pub fn reset_http_stream() -> Result<(), Status> {
    // SAFETY: no pointers.
    Status::check(unsafe { proxy_close_stream(STREAM_HTTP_REQUEST) })
}

/// The shared value under `key` and its CAS; `None` if the key is absent.
pub fn get_shared_data(key: &str) -> Result<Option<(Vec<u8>, u32)>, Status> {
    let mut cas: u32 = 0;
    let bytes = absent_if_not_found(returning_bytes(|data, size| {
        // SAFETY: a live `&str` and valid out-pointers.
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), data, size, &mut cas) }
    }))?;
    Ok(bytes.map(|bytes| (bytes, cas)))
}

/// Store `value` under `key`; `cas` 0 writes unconditionally.
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> Result<(), Status> {
    // SAFETY: live slices.
    Status::check(unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    })
}

/// Define (or look up) the metric `name`; its id.
pub fn define_metric(kind: MetricType, name: &str) -> Result<u32, Status> {
    let mut id: u32 = 0;
    // SAFETY: a live `&str` and a valid out-pointer.
    Status::check(unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) })
        .map(|()| id)
}

/// Add `delta` to a counter or gauge.
pub fn increment_metric(id: u32, delta: i64) -> Result<(), Status> {
    // SAFETY: no pointers.
    Status::check(unsafe { proxy_increment_metric(id, delta) })
}

/// Set a gauge (or record a histogram value).
pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    // SAFETY: no pointers.
    Status::check(unsafe { proxy_record_metric(id, value) })
}

/// Dispatch an HTTP call through cluster `upstream`; its token. The answer arrives as
/// `proxy_on_http_call_response` on the calling root context.
pub fn http_call(
    upstream: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u32,
) -> Result<u32, Status> {
    let headers = pairs::encode(headers).ok_or(Status::BadArgument)?;
    let no_trailers: [(&str, &str); 0] = [];
    let trailers = pairs::encode(&no_trailers).ok_or(Status::BadArgument)?;
    let mut token: u32 = 0;
    // SAFETY: live slices and a valid out-pointer.
    Status::check(unsafe {
        proxy_http_call(
            upstream.as_ptr(),
            upstream.len(),
            headers.as_ptr(),
            headers.len(),
            body.as_ptr(),
            body.len(),
            trailers.as_ptr(),
            trailers.len(),
            timeout_ms,
            &mut token,
        )
    })
    .map(|()| token)
}

/// The property at `path`, as bytes; `None` if absent.
pub fn get_property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let path = pairs::property_path(path);
    absent_if_not_found(returning_bytes(|data, size| {
        // SAFETY: a live slice and valid out-pointers.
        unsafe { proxy_get_property(path.as_ptr(), path.len(), data, size) }
    }))
}

/// Set the property at `path` to `value`.
pub fn set_property(path: &[&str], value: &[u8]) -> Result<(), Status> {
    let path = pairs::property_path(path);
    // SAFETY: live slices.
    Status::check(unsafe {
        proxy_set_property(path.as_ptr(), path.len(), value.as_ptr(), value.len())
    })
}

/// Register (or take over) the queue `name` of this VM's `vm_id`; its token. Envoy then
/// calls `proxy_on_queue_ready` of the registering root, on its thread, when data arrives.
pub fn register_shared_queue(name: &str) -> Result<u32, Status> {
    let mut token: u32 = 0;
    // SAFETY: a live `&str` and a valid out-pointer.
    Status::check(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut token) })
        .map(|()| token)
}

/// The token of queue `name` registered by a VM of `vm_id`; `None` if there is none.
pub fn resolve_shared_queue(vm_id: &str, name: &str) -> Result<Option<u32>, Status> {
    let mut token: u32 = 0;
    // SAFETY: live `&str`s and a valid out-pointer.
    let code = unsafe {
        proxy_resolve_shared_queue(
            vm_id.as_ptr(),
            vm_id.len(),
            name.as_ptr(),
            name.len(),
            &mut token,
        )
    };
    absent_if_not_found(Status::check(code).map(|()| token))
}

/// Append `value` to the queue `token` (of any VM).
pub fn enqueue_shared_queue(token: u32, value: &[u8]) -> Result<(), Status> {
    // SAFETY: pointer and length of a live slice.
    Status::check(unsafe { proxy_enqueue_shared_queue(token, value.as_ptr(), value.len()) })
}

/// The oldest value of this VM's queue `token`; `None` once it is empty.
pub fn dequeue_shared_queue(token: u32) -> Result<Option<Vec<u8>>, Status> {
    match returning_bytes(|data, size| {
        // SAFETY: valid out-pointers (see `returning_bytes`).
        unsafe { proxy_dequeue_shared_queue(token, data, size) }
    }) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(Status::Empty) => Ok(None),
        Err(status) => Err(status),
    }
}

/// Make `context_id` (an HTTP stream of this VM) the context later hostcalls of this
/// callback address: how a root's callback edits and resumes a paused stream.
pub fn set_effective_context(context_id: u32) -> Result<(), Status> {
    // SAFETY: no pointers.
    Status::check(unsafe { proxy_set_effective_context(context_id) })
}
