//! Our own bindings to the Envoy 1.40 dynamic-module C ABI (`abi.h`, ABI "v0.2.0").
//!
//! Only what this crate uses is declared: the `#[repr(C)]` buffer and header types, the
//! enums the hooks return or pass to Envoy, the opaque pointer types, and (in
//! [`callbacks`]) the `extern "C"` callbacks Envoy offers. Layouts were written from the
//! header's text, not copied from any SDK.
//!
//! Ownership vocabulary used below:
//! - *Envoy-owned* (`*_envoy_ptr`, [`EnvoyBuffer`]): Envoy allocates and frees it; the module
//!   may only read it for the time the header says (usually: until the current hook returns
//!   or until the module calls any setter on the same object).
//! - *module-owned* (`*_module_ptr`, [`ModuleBuffer`]): the module allocates it and frees it
//!   when Envoy says the object is gone (the matching `*_destroy` hook), or, for buffers passed
//!   into a callback, keeps it alive until that callback returns.
//!
//! C enums are `int`-sized. Enums the module *produces* are Rust `#[repr(C)]` enums; values
//! Envoy *hands in* (callout results, reset reasons) stay raw `u32`s so an unknown value from
//! a newer Envoy can never be an invalid Rust enum.

use core::ffi::{c_char, c_void};
use core::marker::PhantomData;

#[cfg(not(target_family = "wasm"))]
pub mod callbacks;

/// The ABI version this module is written against, NUL-terminated for
/// `envoy_dynamic_module_on_program_init`.
pub const ABI_VERSION: &core::ffi::CStr = c"v0.2.0";

/// Envoy's `DynamicModuleHttpFilterConfig`. Envoy-owned; valid from `on_http_filter_config_new`
/// until `on_http_filter_config_destroy` returns. Only used on the main thread except for
/// metric callbacks that explicitly allow the config pointer.
pub type HttpFilterConfigEnvoyPtr = *mut c_void;
/// Our per-filter-config object (a leaked `Box`). Module-owned; Envoy hands it back to every
/// `on_http_filter_new` on any worker thread (so it must be `Sync`) and frees nothing: we drop
/// it in `on_http_filter_config_destroy`.
pub type HttpFilterConfigModulePtr = *const c_void;
/// Envoy's `DynamicModuleHttpFilter` for one HTTP stream. Envoy-owned; valid until
/// `on_http_filter_destroy`. Only usable on the worker thread that runs the stream.
pub type HttpFilterEnvoyPtr = *mut c_void;
/// Our per-stream filter object (a leaked `Box`). Module-owned; dropped in
/// `on_http_filter_destroy`.
pub type HttpFilterModulePtr = *const c_void;

/// A stream's scheduler (`http_filter_scheduler_new`). Allocated by Envoy, owned by the
/// module, which frees it exactly once with `http_filter_scheduler_delete`, from any thread.
/// Committing on it is allowed from any thread, also after its stream is gone (a no-op).
pub type HttpFilterSchedulerPtr = *mut c_void;

/// A filter config's main-thread scheduler (`http_filter_config_scheduler_new`). Allocated by
/// Envoy, owned by the module, which frees it exactly once with
/// `http_filter_config_scheduler_delete`, and never while another thread may still commit on
/// it. Committing is allowed from any thread; an event committed after its config is gone is
/// dropped by Envoy (it holds the config weakly).
pub type HttpFilterConfigSchedulerPtr = *mut c_void;

/// Envoy's `DynamicModuleLbConfig`. Envoy-owned; valid from `on_lb_config_new` until
/// `on_lb_config_destroy`. Main thread only (this module defines no LB metrics).
pub type LbConfigEnvoyPtr = *mut c_void;
/// Our LB-policy config (a leaked `Box`). Module-owned; Envoy hands it to every `on_lb_new`
/// on any thread (so it must be `Sync`); dropped in `on_lb_config_destroy`.
pub type LbConfigModulePtr = *const c_void;
/// Envoy's `DynamicModuleLoadBalancer`: one per worker thread and one on the main thread, each
/// over that thread's copy of the cluster's priority set. Envoy-owned; it lives from
/// `on_lb_new` until `on_lb_destroy`, but the header promises it only for the duration of
/// each hook, so the module uses it inside the hook that handed it in, and nowhere else.
pub type LbEnvoyPtr = *mut c_void;
/// Our per-instance LB object (a leaked `Box`). Module-owned; dropped in `on_lb_destroy`.
pub type LbModulePtr = *const c_void;
/// Envoy's `LoadBalancerContext` of one host choice. Envoy-owned; valid during
/// `on_lb_choose_host` only, and may be NULL.
pub type LbContextEnvoyPtr = *mut c_void;

/// `envoy_dynamic_module_type_host_health` as Envoy returns it (raw). The stored copies of the
/// header disagree on the order of `Healthy` and `Unhealthy` (0 and 2), but agree that
/// `Degraded` is 1; this module therefore tells healthy hosts by the healthy-host list and
/// reads only `Degraded` from this value (see `crate::membership`).
pub type HostHealthRaw = u32;
/// `Degraded`: serving, but healthy hosts are preferred.
pub const HOST_HEALTH_DEGRADED: HostHealthRaw = 1;

/// A byte range inside Envoy's memory. Envoy-owned; valid only as long as the hook or callback
/// that produced it says (at most until the current hook returns, and never across a setter
/// call on the same headers/body). `ptr` may be NULL when `length` is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EnvoyBuffer {
    /// First byte (Envoy-owned, read-only).
    pub ptr: *const c_char,
    /// Length in bytes.
    pub length: usize,
}

impl EnvoyBuffer {
    /// An empty buffer, for out-parameters Envoy will fill.
    pub const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: core::ptr::null(),
        length: 0,
    };

    /// Views the bytes.
    ///
    /// # Safety
    /// `ptr..ptr+length` must be readable Envoy memory for the chosen lifetime `'a`, which must
    /// not outlast the validity window of the hook/callback that produced the buffer.
    pub unsafe fn as_bytes<'a>(&self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            return &[];
        }
        // SAFETY: non-null and the caller guarantees the range is readable for 'a.
        unsafe { core::slice::from_raw_parts(self.ptr.cast::<u8>(), self.length) }
    }
}

/// A byte range inside the module's memory, lent to Envoy for the duration of one callback
/// (Envoy copies what it keeps). Module-owned.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModuleBuffer {
    /// First byte (module-owned; must stay alive until the callback returns).
    pub ptr: *const c_char,
    /// Length in bytes.
    pub length: usize,
}

impl ModuleBuffer {
    /// Borrows `bytes` for one callback. The returned value must not outlive `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr().cast::<c_char>(),
            length: bytes.len(),
        }
    }

    /// The NULL buffer, meaning "absent" (e.g. a header value of NULL removes the header).
    pub const NULL: ModuleBuffer = ModuleBuffer {
        ptr: core::ptr::null(),
        length: 0,
    };
}

/// Metric label names or values lent to Envoy for one callback, as the `(array, count)` pair
/// the define, increment and set callbacks take (a NULL array when there are none).
pub struct LabelBuffers<'a> {
    raw: Vec<ModuleBuffer>,
    /// The buffers point into these strings.
    _labels: PhantomData<&'a str>,
}

impl<'a> LabelBuffers<'a> {
    /// Borrows every label; the result must not outlive them.
    pub fn new(labels: &[&'a str]) -> LabelBuffers<'a> {
        LabelBuffers {
            raw: labels
                .iter()
                .map(|l| ModuleBuffer::from_bytes(l.as_bytes()))
                .collect(),
            _labels: PhantomData,
        }
    }

    /// The array to pass to Envoy: NULL for no labels.
    pub fn as_mut_ptr(&mut self) -> *mut ModuleBuffer {
        if self.raw.is_empty() {
            core::ptr::null_mut()
        } else {
            self.raw.as_mut_ptr()
        }
    }

    /// How many labels the array holds.
    pub fn count(&self) -> usize {
        self.raw.len()
    }
}

/// One header owned by the module, lent to Envoy for one callback (local replies, callouts).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModuleHttpHeader {
    /// Header name bytes (module-owned).
    pub key_ptr: *const c_char,
    /// Header name length.
    pub key_length: usize,
    /// Header value bytes (module-owned).
    pub value_ptr: *const c_char,
    /// Header value length.
    pub value_length: usize,
}

impl ModuleHttpHeader {
    /// Borrows a name/value pair; must not outlive either slice.
    pub fn new(key: &[u8], value: &[u8]) -> ModuleHttpHeader {
        ModuleHttpHeader {
            key_ptr: key.as_ptr().cast::<c_char>(),
            key_length: key.len(),
            value_ptr: value.as_ptr().cast::<c_char>(),
            value_length: value.len(),
        }
    }
}

/// One header inside Envoy's header map. Envoy-owned; same validity as [`EnvoyBuffer`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EnvoyHttpHeader {
    /// Header name bytes (Envoy-owned).
    pub key_ptr: *const c_char,
    /// Header name length.
    pub key_length: usize,
    /// Header value bytes (Envoy-owned).
    pub value_ptr: *const c_char,
    /// Header value length.
    pub value_length: usize,
}

impl EnvoyHttpHeader {
    /// An empty slot, for arrays Envoy will fill.
    pub const EMPTY: EnvoyHttpHeader = EnvoyHttpHeader {
        key_ptr: core::ptr::null(),
        key_length: 0,
        value_ptr: core::ptr::null(),
        value_length: 0,
    };

    /// The name and value as byte slices.
    ///
    /// # Safety
    /// Same contract as [`EnvoyBuffer::as_bytes`].
    pub unsafe fn as_pair<'a>(&self) -> (&'a [u8], &'a [u8]) {
        let key = EnvoyBuffer {
            ptr: self.key_ptr,
            length: self.key_length,
        };
        let value = EnvoyBuffer {
            ptr: self.value_ptr,
            length: self.value_length,
        };
        // SAFETY: forwarded caller contract.
        unsafe { (key.as_bytes(), value.as_bytes()) }
    }
}

/// Which header map a header callback addresses (`envoy_dynamic_module_type_http_header_type`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderKind {
    /// Request headers.
    RequestHeaders = 0,
    /// Request trailers.
    RequestTrailers = 1,
    /// Response headers.
    ResponseHeaders = 2,
    /// Response trailers.
    ResponseTrailers = 3,
}

/// Which body a body callback addresses (`envoy_dynamic_module_type_http_body_type`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// The request chunk delivered to the current body hook.
    ReceivedRequest = 0,
    /// What Envoy has buffered of the request so far.
    BufferedRequest = 1,
    /// The response chunk delivered to the current body hook.
    ReceivedResponse = 2,
    /// What Envoy has buffered of the response so far.
    BufferedResponse = 3,
}

/// Log levels of `envoy_dynamic_module_callback_log` (Envoy's `spdlog` levels).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    /// trace
    Trace = 0,
    /// debug
    Debug = 1,
    /// info
    Info = 2,
    /// warn
    Warn = 3,
    /// error
    Error = 4,
    /// critical
    Critical = 5,
}

/// What a headers hook tells Envoy (`FilterHeadersStatus`). Used for request and response.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadersStatus {
    /// Pass the headers on.
    Continue = 0,
    /// Hold the headers; later body data still reaches this filter.
    StopIteration = 1,
    /// Continue, but do not end the stream here.
    ContinueAndDontEndStream = 2,
    /// Hold headers and buffer everything after them.
    StopAllIterationAndBuffer = 3,
    /// Hold headers and apply watermarks to what follows.
    StopAllIterationAndWatermark = 4,
}

/// What a body hook tells Envoy (`FilterDataStatus`). Used for request and response.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyStatus {
    /// Pass the data on.
    Continue = 0,
    /// Keep buffering (the request body router waits for end of stream this way).
    StopIterationAndBuffer = 1,
    /// Keep buffering with watermarks.
    StopIterationAndWatermark = 2,
    /// Hold without buffering.
    StopIterationNoBuffer = 3,
}

/// What a trailers hook tells Envoy (`FilterTrailersStatus`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrailersStatus {
    /// Pass the trailers on.
    Continue = 0,
    /// Hold them.
    StopIteration = 1,
}

/// What `on_http_filter_local_reply` tells Envoy (`LocalErrorStatus`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalReplyStatus {
    /// Send the local reply.
    Continue = 0,
    /// Reset the stream instead.
    ContinueAndResetStream = 1,
}

/// Reason passed to `http_filter_reset_stream`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterResetReason {
    /// A local codec-level reset.
    LocalReset = 0,
    /// A local refused-stream reset (the client may retry).
    LocalRefusedStreamReset = 1,
}

/// `envoy_dynamic_module_type_http_callout_init_result` as Envoy returns it (raw, see module doc).
pub type CalloutInitResult = u32;
/// The callout was started; `on_*_http_callout_done` will follow.
pub const CALLOUT_INIT_SUCCESS: CalloutInitResult = 0;
/// The cluster does not exist (or the server is not initialized yet).
pub const CALLOUT_INIT_CLUSTER_NOT_FOUND: CalloutInitResult = 2;

/// `envoy_dynamic_module_type_http_callout_result` as Envoy passes it (raw).
pub type CalloutResult = u32;
/// The callout got a response (any status).
pub const CALLOUT_SUCCESS: CalloutResult = 0;

/// `envoy_dynamic_module_type_attribute_id` (raw, append-only in the header): the value of
/// `upstream.address`, the `ip:port` of the upstream host of the stream's last attempt.
pub const ATTRIBUTE_UPSTREAM_ADDRESS: u32 = 41;

/// `envoy_dynamic_module_type_metadata_source` (raw): the stream's dynamic metadata.
pub const METADATA_SOURCE_DYNAMIC: u32 = 0;

/// `envoy_dynamic_module_type_metrics_result` (raw); 0 is success.
pub type MetricsResult = u32;
/// The metric operation succeeded.
pub const METRICS_SUCCESS: MetricsResult = 0;

#[cfg(test)]
mod tests;
