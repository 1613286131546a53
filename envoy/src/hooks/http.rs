//! The exported HTTP-filter hooks (`envoy_dynamic_module_on_http_filter_*`).
//!
//! Each hook turns Envoy's raw pointers back into our objects, runs the filter logic inside
//! [`guard::catch`], and on a panic fails only this request: a 500 local reply while the
//! request is still being decoded, a stream reset once the response is under way. The stream
//! is then marked failed and later hooks pass through without touching the logic again.
//!
//! Object lifetimes (who frees what):
//! - `on_http_filter_config_new` leaks a `Box<HttpConfig>`; `_config_destroy` drops it.
//! - `on_http_filter_new` leaks a `Box<HttpFilter>`; `_destroy` drops it. Per-request
//!   resources (in-flight counts) are released by the logic's `Drop`, so a panicking or
//!   reset stream can never leak them.

use crate::abi::{
    BodyStatus, EnvoyBuffer, EnvoyHttpHeader, HeadersStatus, HttpFilterConfigEnvoyPtr,
    HttpFilterConfigModulePtr, HttpFilterEnvoyPtr, HttpFilterModulePtr, LocalReplyStatus,
    TrailersStatus,
};
use crate::factory::HttpConfig;
use crate::filter::{FilterConfigHandle, HttpFilter, StreamLogic};
use crate::guard;
use crate::host::EnvoyStream;

/// Body of the 500 a panicking filter answers with: the OpenAI error shape of
/// `infergate_filters::reply::Reply::internal`, kept static so the panic path
/// allocates nothing.
const INTERNAL_ERROR_BODY: &[u8] =
    br#"{"error":{"message":"internal error in the gateway filter","type":"server_error","param":null,"code":"internal_error"}}"#;

std::thread_local! {
    /// The stream whose hook is running on this worker thread (NULL: none).
    static ACTIVE_STREAM: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks a stream's hook as running on this thread for as long as the value lives, so a
/// hook Envoy re-enters synchronously can tell (see `on_http_filter_stream_complete`).
struct ActiveHook {
    previous: usize,
}

impl ActiveHook {
    fn enter(module_ptr: HttpFilterModulePtr) -> ActiveHook {
        let previous = ACTIVE_STREAM.with(|a| a.replace(module_ptr as usize));
        ActiveHook { previous }
    }

    fn is_active(module_ptr: HttpFilterModulePtr) -> bool {
        !module_ptr.is_null() && ACTIVE_STREAM.with(|a| a.get() == module_ptr as usize)
    }
}

impl Drop for ActiveHook {
    fn drop(&mut self) {
        ACTIVE_STREAM.with(|a| a.set(self.previous));
    }
}

/// # Safety
/// `ptr` must be NULL or a pointer returned by `on_http_filter_new` and not yet destroyed.
unsafe fn stream<'a>(ptr: HttpFilterModulePtr) -> Option<&'a mut HttpFilter> {
    // SAFETY: per the contract, a non-null `ptr` is our live `Box<HttpFilter>`. Envoy calls
    // the hooks of one stream on one thread; the one hook it re-enters synchronously
    // (`stream_complete`) checks `ActiveHook` first, so the `&mut` is unique.
    unsafe { ptr.cast_mut().cast::<HttpFilter>().as_mut() }
}

/// Fails the request with a 500 local reply (request path).
fn fail_request(envoy: &mut EnvoyStream) {
    // A second panic here must not escape either; there is nothing more to do if it happens.
    let _ = guard::catch("fail_request", || {
        envoy.send_response(
            500,
            &[("content-type", b"application/json")],
            INTERNAL_ERROR_BODY,
            "infergate_filter_panic",
        );
    });
}

/// Fails the request by resetting the stream (response path: headers may be on the wire).
fn fail_response(envoy: &mut EnvoyStream) {
    let _ = guard::catch("fail_response", || {
        envoy.reset_stream("infergate_filter_panic")
    });
}

/// Runs one request-path hook body with panic containment; a panic answers a 500.
fn on_request<R: Copy>(
    hook: &'static str,
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
    stop: R,
    body: impl FnOnce(&mut HttpFilter, &mut EnvoyStream) -> R,
) -> R {
    // A request on an unknown or already failed stream must not go on: `stop` either way.
    guarded(hook, envoy_ptr, module_ptr, stop, stop, fail_request, body)
}

/// Runs one response-path hook body with panic containment; a panic resets the stream.
fn on_response<R: Copy>(
    hook: &'static str,
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
    pass: R,
    stop: R,
    body: impl FnOnce(&mut HttpFilter, &mut EnvoyStream) -> R,
) -> R {
    guarded(hook, envoy_ptr, module_ptr, pass, stop, fail_response, body)
}

/// The hook frame both paths share: returns `skipped` without running the logic when the
/// stream is unknown or already failed, and `panicked` after the logic panicked (the stream
/// is then marked failed and `fail` answers or resets it).
fn guarded<R: Copy>(
    hook: &'static str,
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
    skipped: R,
    panicked: R,
    fail: fn(&mut EnvoyStream),
    body: impl FnOnce(&mut HttpFilter, &mut EnvoyStream) -> R,
) -> R {
    // SAFETY: Envoy passes the pointers of the current stream to this hook.
    let (Some(state), mut envoy) = (unsafe { stream(module_ptr) }, unsafe {
        EnvoyStream::from_hook(envoy_ptr)
    }) else {
        return skipped;
    };
    if state.failed {
        return skipped;
    }
    let _active = ActiveHook::enter(module_ptr);
    match guard::catch(hook, || body(state, &mut envoy)) {
        Some(status) => status,
        None => {
            state.failed = true;
            fail(&mut envoy);
            panicked
        }
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy_ptr: HttpFilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> HttpFilterConfigModulePtr {
    guard::catch("on_http_filter_config_new", || {
        // SAFETY: Envoy guarantees both buffers for the duration of this hook; copied here.
        let (name, config) = unsafe { (name.as_bytes().to_vec(), config.as_bytes().to_vec()) };
        let name = String::from_utf8_lossy(&name).into_owned();
        let mut handle = FilterConfigHandle::new(config_envoy_ptr);
        match HttpConfig::new(&name, &config, &mut handle) {
            Ok(cfg) => Box::into_raw(Box::new(cfg)).cast_const().cast(),
            Err(e) => {
                crate::log::error(&format!("infergate: filter `{name}` rejected: {e}"));
                core::ptr::null()
            }
        }
    })
    .unwrap_or(core::ptr::null())
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(
    config: HttpFilterConfigModulePtr,
) {
    let _ = guard::catch("on_http_filter_config_destroy", || {
        if !config.is_null() {
            // SAFETY: `config` came from `Box::into_raw` in config_new and Envoy destroys it once.
            let config = unsafe { Box::from_raw(config.cast_mut().cast::<HttpConfig>()) };
            config.last_flush();
            drop(config);
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: HttpFilterConfigModulePtr,
    _filter_envoy_ptr: HttpFilterEnvoyPtr,
) -> HttpFilterModulePtr {
    guard::catch("on_http_filter_new", || {
        // SAFETY: `config` is our live `HttpConfig` (Envoy keeps it alive while streams exist);
        // it is `Sync`, so a shared reference from this worker thread is fine.
        let Some(config) = (unsafe { config.cast::<HttpConfig>().as_ref() }) else {
            return core::ptr::null();
        };
        let state = HttpFilter::new(config.new_stream());
        Box::into_raw(Box::new(state)).cast_const().cast()
    })
    // Creating the stream's logic panicked: a stream that answers 500 at its headers. (A
    // NULL here would leave the request waiting for Envoy's idle timeout.)
    .unwrap_or_else(|| {
        guard::catch("on_http_filter_new (fail-closed stream)", || {
            let state = HttpFilter::new(Box::new(FailClosedStream));
            Box::into_raw(Box::new(state)).cast_const().cast()
        })
        .unwrap_or(core::ptr::null())
    })
}

/// The logic of a stream whose real logic could not be created: it answers 500.
struct FailClosedStream;

impl StreamLogic for FailClosedStream {
    fn on_request_headers(
        &mut self,
        envoy: &mut EnvoyStream,
        _end_of_stream: bool,
    ) -> HeadersStatus {
        fail_request(envoy);
        HeadersStatus::StopIteration
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
    end_of_stream: bool,
) -> HeadersStatus {
    on_request(
        "on_http_filter_request_headers",
        envoy_ptr,
        module_ptr,
        HeadersStatus::StopIteration,
        |s, e| s.on_request_headers(e, end_of_stream),
    )
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
    end_of_stream: bool,
) -> BodyStatus {
    on_request(
        "on_http_filter_request_body",
        envoy_ptr,
        module_ptr,
        BodyStatus::StopIterationNoBuffer,
        |s, e| s.on_request_body(e, end_of_stream),
    )
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
) -> TrailersStatus {
    on_request(
        "on_http_filter_request_trailers",
        envoy_ptr,
        module_ptr,
        TrailersStatus::StopIteration,
        |s, e| s.on_request_trailers(e),
    )
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
    end_of_stream: bool,
) -> HeadersStatus {
    on_response(
        "on_http_filter_response_headers",
        envoy_ptr,
        module_ptr,
        HeadersStatus::Continue,
        HeadersStatus::StopIteration,
        |s, e| s.on_response_headers(e, end_of_stream),
    )
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
    end_of_stream: bool,
) -> BodyStatus {
    on_response(
        "on_http_filter_response_body",
        envoy_ptr,
        module_ptr,
        BodyStatus::Continue,
        BodyStatus::StopIterationNoBuffer,
        |s, e| s.on_response_body(e, end_of_stream),
    )
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
) -> TrailersStatus {
    on_response(
        "on_http_filter_response_trailers",
        envoy_ptr,
        module_ptr,
        TrailersStatus::Continue,
        TrailersStatus::StopIteration,
        |s, e| s.on_response_trailers(e),
    )
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
) {
    let _ = guard::catch("on_http_filter_stream_complete", || {
        // Envoy may call this synchronously from inside another hook of the same stream
        // (a local reply ends the stream). A second `&mut HttpFilter` would then alias the
        // outer hook's, so the work is skipped; `on_http_filter_destroy`, which 1.40 runs
        // after every hook has returned, gives the in-flight lease back instead.
        if ActiveHook::is_active(module_ptr) {
            return;
        }
        // SAFETY: pointers of the current stream, and no other hook of it is running.
        if let Some(state) = unsafe { stream(module_ptr) } {
            let mut envoy = unsafe { EnvoyStream::from_hook(envoy_ptr) };
            state.on_stream_complete(&mut envoy);
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module_ptr: HttpFilterModulePtr) {
    let _ = guard::catch("on_http_filter_destroy", || {
        if !module_ptr.is_null() {
            // SAFETY: `module_ptr` came from `Box::into_raw` in filter_new; destroyed once.
            drop(unsafe { Box::from_raw(module_ptr.cast_mut().cast::<HttpFilter>()) });
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> LocalReplyStatus {
    LocalReplyStatus::Continue
}

/// A paused request's wake, run by Envoy on the stream's worker thread: the stream resumes
/// its pipeline there (a panic answers 500 like any request-path hook).
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    envoy_ptr: HttpFilterEnvoyPtr,
    module_ptr: HttpFilterModulePtr,
    event_id: u64,
) {
    on_request(
        "on_http_filter_scheduled",
        envoy_ptr,
        module_ptr,
        (),
        |s, e| s.on_scheduled(e, event_id),
    );
}

// ----- config-level hooks (main thread): the scraper a config hosts (`crate::scraper`) -----

/// # Safety
/// `config` must be NULL or our live `HttpConfig` (from config_new, not yet destroyed).
unsafe fn hosted_scraper<'a>(
    config: HttpFilterConfigModulePtr,
) -> Option<&'a crate::scraper::Hosting> {
    // SAFETY: per the contract; a shared reference (the config is `Sync`).
    unsafe { config.cast::<HttpConfig>().as_ref() }?.scraper()
}

/// An event committed on a config's scheduler, on the main thread: the stats flush
/// (`crate::flush::FLUSH_EVENT`) or the scraper's tick.
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    config_envoy_ptr: HttpFilterConfigEnvoyPtr,
    config: HttpFilterConfigModulePtr,
    event_id: u64,
) {
    let _ = guard::catch("on_http_filter_config_scheduled", || {
        if event_id == crate::flush::FLUSH_EVENT {
            // SAFETY: Envoy runs config events only while the config lives.
            if let Some(config) = unsafe { config.cast::<HttpConfig>().as_ref() } {
                config.flush_stats(config_envoy_ptr);
            }
            return;
        }
        // SAFETY: Envoy runs config events only while the config lives.
        if let Some(hosting) = unsafe { hosted_scraper(config) } {
            crate::scraper::on_scheduled(hosting, event_id);
        }
    });
}

/// A callout a config started (the scraper's) finished, on the main thread. Envoy's arrays
/// are valid for this hook and NULL when empty (a failed callout).
#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy_ptr: HttpFilterConfigEnvoyPtr,
    config: HttpFilterConfigModulePtr,
    callout_id: u64,
    result: u32,
    headers: *mut EnvoyHttpHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
) {
    let _ = guard::catch("on_http_filter_config_http_callout_done", || {
        // SAFETY: Envoy answers a config's callouts only while the config lives.
        let Some(hosting) = (unsafe { hosted_scraper(config) }) else {
            return;
        };
        // SAFETY: Envoy's arrays, valid for this hook (see above).
        let (headers, body) = unsafe {
            (
                envoy_slice(headers.cast_const(), headers_size),
                envoy_slice(body_chunks.cast_const(), body_chunks_size),
            )
        };
        crate::scraper::on_callout_done(hosting, callout_id, result, headers, body);
    });
}

/// An Envoy array view as a slice for the duration of the hook.
///
/// # Safety
/// `ptr` must point to `len` valid elements for the duration of the hook, or be NULL.
unsafe fn envoy_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { core::slice::from_raw_parts(ptr, len) }
}

// ----- hooks Envoy requires but this module never triggers (no callouts or streams from
// HTTP filters, and no terminal filter): they do nothing. -----

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy_ptr: HttpFilterEnvoyPtr,
    _module_ptr: HttpFilterModulePtr,
) {
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "pipeline_tests.rs"]
mod pipeline_tests;

#[cfg(test)]
#[path = "scraper_tests.rs"]
mod scraper_tests;

#[cfg(test)]
mod active_hook_tests {
    use super::*;

    #[test]
    fn a_hook_marks_its_stream_active_until_it_returns() {
        let a = 0x10usize as HttpFilterModulePtr;
        let b = 0x20usize as HttpFilterModulePtr;
        assert!(!ActiveHook::is_active(a));
        {
            let _outer = ActiveHook::enter(a);
            assert!(ActiveHook::is_active(a));
            assert!(!ActiveHook::is_active(b));
            {
                let _inner = ActiveHook::enter(b);
                assert!(ActiveHook::is_active(b));
            }
            assert!(ActiveHook::is_active(a), "the outer hook is restored");
        }
        assert!(!ActiveHook::is_active(a));
        assert!(!ActiveHook::is_active(std::ptr::null()));
    }
}
