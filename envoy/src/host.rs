//! A safe handle over Envoy's per-stream `filter_envoy_ptr`.
//!
//! [`EnvoyStream`] is created at the top of every HTTP hook from the pointer Envoy passed in and
//! dropped before the hook returns, so it can never outlive the stream. Everything it returns
//! is copied into module memory at once: Envoy's buffers are only valid until the hook returns
//! or until the next setter call, and copying removes that hazard from every caller.

use crate::abi::callbacks as cb;
use crate::abi::{
    BodyKind, EnvoyBuffer, EnvoyHttpHeader, FilterResetReason, HeaderKind, HttpFilterEnvoyPtr,
    LabelBuffers, ModuleBuffer, ModuleHttpHeader, METADATA_SOURCE_DYNAMIC,
};

/// The Envoy side of one HTTP stream, valid for the duration of one hook call.
pub struct EnvoyStream {
    raw: HttpFilterEnvoyPtr,
}

impl EnvoyStream {
    /// Wraps the pointer Envoy passed to the current hook.
    ///
    /// # Safety
    /// `raw` must be the `filter_envoy_ptr` of the current hook invocation, and the returned
    /// value must not be kept past the hook's return (it is not `Send`, and hooks drop it).
    pub unsafe fn from_hook(raw: HttpFilterEnvoyPtr) -> EnvoyStream {
        EnvoyStream { raw }
    }

    /// The `filter_envoy_ptr` this handle wraps (to reach the same stream again from its
    /// destroy hook, see `crate::pipeline`).
    pub fn raw(&self) -> HttpFilterEnvoyPtr {
        self.raw
    }

    /// First value of header `name` in `kind`, copied; `None` if absent.
    pub fn header(&self, kind: HeaderKind, name: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::EMPTY;
        let mut count = 0usize;
        // SAFETY: `raw` is live for this hook; `name` outlives the call; `out` and `count` are
        // writable locals. The returned view is copied before any other callback.
        let found = unsafe {
            cb::envoy_dynamic_module_callback_http_get_header(
                self.raw,
                kind,
                ModuleBuffer::from_bytes(name.as_bytes()),
                &mut out,
                0,
                &mut count,
            )
        };
        if !found || count == 0 || out.ptr.is_null() {
            return None;
        }
        // SAFETY: Envoy filled `out` with a view valid until the next setter; copied now.
        Some(unsafe { out.as_bytes() }.to_vec())
    }

    /// Every entry of a header map, copied, in Envoy's order.
    pub fn headers(&self, kind: HeaderKind) -> Vec<(String, Vec<u8>)> {
        // SAFETY: `raw` is live for this hook.
        let n = unsafe { cb::envoy_dynamic_module_callback_http_get_headers_size(self.raw, kind) };
        if n == 0 {
            return Vec::new();
        }
        let mut slots = vec![EnvoyHttpHeader::EMPTY; n];
        // SAFETY: `slots` has exactly the `n` entries Envoy reported for this map.
        let ok = unsafe {
            cb::envoy_dynamic_module_callback_http_get_headers(self.raw, kind, slots.as_mut_ptr())
        };
        if !ok {
            return Vec::new();
        }
        slots
            .iter()
            .map(|h| {
                // SAFETY: views filled by Envoy just above, copied before any setter call.
                let (k, v) = unsafe { h.as_pair() };
                (String::from_utf8_lossy(k).into_owned(), v.to_vec())
            })
            .collect()
    }

    /// Sets (replacing all values) or, with `None`, removes header `name`.
    pub fn set_header(&mut self, kind: HeaderKind, name: &str, value: Option<&[u8]>) -> bool {
        let value = value.map_or(ModuleBuffer::NULL, ModuleBuffer::from_bytes);
        // SAFETY: `raw` is live; both buffers borrow data that outlives the call (Envoy copies).
        unsafe {
            cb::envoy_dynamic_module_callback_http_set_header(
                self.raw,
                kind,
                ModuleBuffer::from_bytes(name.as_bytes()),
                value,
            )
        }
    }

    /// Appends a value for header `name`.
    pub fn add_header(&mut self, kind: HeaderKind, name: &str, value: &[u8]) -> bool {
        // SAFETY: as in `set_header`.
        unsafe {
            cb::envoy_dynamic_module_callback_http_add_header(
                self.raw,
                kind,
                ModuleBuffer::from_bytes(name.as_bytes()),
                ModuleBuffer::from_bytes(value),
            )
        }
    }

    /// Size in bytes of the addressed body (0 when unavailable).
    pub fn body_size(&self, kind: BodyKind) -> usize {
        // SAFETY: `raw` is live for this hook.
        unsafe { cb::envoy_dynamic_module_callback_http_get_body_size(self.raw, kind) }
    }

    /// Appends the addressed body's bytes to `out` (copied slice by slice).
    pub fn read_body_into(&self, kind: BodyKind, out: &mut Vec<u8>) {
        // SAFETY: `raw` is live for this hook.
        let n =
            unsafe { cb::envoy_dynamic_module_callback_http_get_body_chunks_size(self.raw, kind) };
        if n == 0 {
            return;
        }
        let mut slices = vec![EnvoyBuffer::EMPTY; n];
        // SAFETY: `slices` has the `n` entries Envoy reported.
        let ok = unsafe {
            cb::envoy_dynamic_module_callback_http_get_body_chunks(
                self.raw,
                kind,
                slices.as_mut_ptr(),
            )
        };
        if !ok {
            return;
        }
        for s in &slices {
            // SAFETY: views filled just above, copied before any setter call.
            out.extend_from_slice(unsafe { s.as_bytes() });
        }
    }

    /// Bytes of the request body seen so far, the current chunk included.
    pub fn request_body_len(&self) -> usize {
        if self.received_is_buffered() {
            self.body_size(BodyKind::ReceivedRequest)
        } else {
            self.body_size(BodyKind::BufferedRequest)
                .saturating_add(self.body_size(BodyKind::ReceivedRequest))
        }
    }

    /// The whole request body seen so far (buffered slices, then the current chunk), copied.
    pub fn request_body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.request_body_len());
        if !self.received_is_buffered() {
            self.read_body_into(BodyKind::BufferedRequest, &mut out);
        }
        self.read_body_into(BodyKind::ReceivedRequest, &mut out);
        out
    }

    fn received_is_buffered(&self) -> bool {
        // SAFETY: `raw` is live for this hook.
        unsafe { cb::envoy_dynamic_module_callback_http_received_buffered_request_body(self.raw) }
    }

    /// Replaces the addressed body with `bytes` (drain everything, then append).
    pub fn replace_body(&mut self, kind: BodyKind, bytes: &[u8]) -> bool {
        let size = self.body_size(kind);
        // SAFETY: `raw` is live; `bytes` outlives the call and Envoy copies it.
        unsafe {
            cb::envoy_dynamic_module_callback_http_drain_body(self.raw, kind, size)
                && cb::envoy_dynamic_module_callback_http_append_body(
                    self.raw,
                    kind,
                    ModuleBuffer::from_bytes(bytes),
                )
        }
    }

    /// Raises the stream's buffer limit to at least `bytes`, so Envoy buffers a body of that
    /// size instead of answering 413 on its own first.
    pub fn ensure_buffer_limit(&mut self, bytes: u64) {
        // SAFETY: `raw` is live for this hook.
        unsafe {
            if cb::envoy_dynamic_module_callback_http_get_buffer_limit(self.raw) < bytes {
                cb::envoy_dynamic_module_callback_http_set_buffer_limit(self.raw, bytes);
            }
        }
    }

    /// Sends a local reply and ends the stream. `details` shows up as the response code details
    /// in access logs.
    pub fn send_response(
        &mut self,
        status: u32,
        headers: &[(&str, &[u8])],
        body: &[u8],
        details: &str,
    ) {
        let mut raw_headers: Vec<ModuleHttpHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHttpHeader::new(k.as_bytes(), v))
            .collect();
        // SAFETY: `raw` is live; `raw_headers` borrows `headers`, and it, `body` and `details`
        // outlive the call; Envoy copies all of them.
        unsafe {
            cb::envoy_dynamic_module_callback_http_send_response(
                self.raw,
                status,
                raw_headers.as_mut_ptr(),
                raw_headers.len(),
                ModuleBuffer::from_bytes(body),
                ModuleBuffer::from_bytes(details.as_bytes()),
            )
        }
    }

    /// Resets the downstream stream (for failures after the response has started).
    pub fn reset_stream(&mut self, details: &str) {
        // SAFETY: `raw` is live; `details` outlives the call.
        unsafe {
            cb::envoy_dynamic_module_callback_http_filter_reset_stream(
                self.raw,
                FilterResetReason::LocalReset,
                ModuleBuffer::from_bytes(details.as_bytes()),
            )
        }
    }

    /// A new scheduler for this stream (see [`crate::scheduler`]); NULL if Envoy gave none.
    pub fn new_scheduler(&mut self) -> crate::abi::HttpFilterSchedulerPtr {
        // SAFETY: `raw` is live and this runs on the stream's worker thread inside a hook,
        // where Envoy reads the stream's dispatcher.
        unsafe { cb::envoy_dynamic_module_callback_http_filter_scheduler_new(self.raw) }
    }

    /// Restarts decoding of the stream a hook stopped (a paused request resumes).
    pub fn continue_decoding(&mut self) {
        // SAFETY: `raw` is live; called from a hook of the stream on its worker thread.
        unsafe { cb::envoy_dynamic_module_callback_http_filter_continue_decoding(self.raw) }
    }

    /// Makes Envoy re-match the route after route-relevant request headers changed.
    pub fn clear_route_cache(&mut self) {
        // SAFETY: `raw` is live; Envoy ignores the call outside the request path.
        unsafe { cb::envoy_dynamic_module_callback_http_clear_route_cache(self.raw) }
    }

    /// Sets `ns`/`key` = `value` in the stream's dynamic metadata.
    pub fn set_metadata_string(&mut self, ns: &str, key: &str, value: &str) {
        // SAFETY: `raw` is live; all three buffers outlive the call (Envoy copies).
        unsafe {
            cb::envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
                self.raw,
                ModuleBuffer::from_bytes(ns.as_bytes()),
                ModuleBuffer::from_bytes(key.as_bytes()),
                ModuleBuffer::from_bytes(value.as_bytes()),
            )
        }
    }

    /// The strings under `ns`/`key` of the stream's dynamic metadata, copied: a string as
    /// one element, a list element by element (its non-string elements skipped). `None`
    /// if absent or of another type.
    pub fn metadata_strings(&self, ns: &str, key: &str) -> Option<Vec<String>> {
        let (ns, key) = (
            ModuleBuffer::from_bytes(ns.as_bytes()),
            ModuleBuffer::from_bytes(key.as_bytes()),
        );
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: `raw` is live; `ns`/`key` borrow strings that outlive the call; `out` is a
        // writable local whose view is copied before any other callback.
        let found = unsafe {
            cb::envoy_dynamic_module_callback_http_get_metadata_string(
                self.raw,
                METADATA_SOURCE_DYNAMIC,
                ns,
                key,
                &mut out,
            )
        };
        if found {
            // SAFETY: filled by Envoy just above, copied now.
            return Some(vec![
                String::from_utf8_lossy(unsafe { out.as_bytes() }).into_owned()
            ]);
        }
        let mut size = 0usize;
        // SAFETY: as above; `size` is a writable local.
        let is_list = unsafe {
            cb::envoy_dynamic_module_callback_http_get_metadata_list_size(
                self.raw,
                METADATA_SOURCE_DYNAMIC,
                ns,
                key,
                &mut size,
            )
        };
        if !is_list {
            return None;
        }
        // A list is bounded by what the gateway's config wrote; cap it anyway.
        let mut values = Vec::with_capacity(size.min(1024));
        for index in 0..size.min(1024) {
            let mut item = EnvoyBuffer::EMPTY;
            // SAFETY: as above; `index` is below the size Envoy reported.
            let ok = unsafe {
                cb::envoy_dynamic_module_callback_http_get_metadata_list_string(
                    self.raw,
                    METADATA_SOURCE_DYNAMIC,
                    ns,
                    key,
                    index,
                    &mut item,
                )
            };
            if ok {
                // SAFETY: filled by Envoy just above, copied now.
                values.push(String::from_utf8_lossy(unsafe { item.as_bytes() }).into_owned());
            }
        }
        Some(values)
    }

    /// The cluster the stream's route chose, copied; `None` if there is no route or cluster.
    /// Envoy matches a route whose cache a filter cleared again first.
    pub fn cluster_name(&mut self) -> Option<String> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: `raw` is live for this hook; `out` is a writable local, copied at once.
        let found =
            unsafe { cb::envoy_dynamic_module_callback_http_get_cluster_name(self.raw, &mut out) };
        if !found {
            return None;
        }
        // SAFETY: filled by Envoy just above, copied before any other callback.
        Some(String::from_utf8_lossy(unsafe { out.as_bytes() }).into_owned())
    }

    /// The string attribute `id` of the stream, copied; `None` if unavailable.
    pub fn attribute_string(&self, id: u32) -> Option<String> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: `raw` is live for this hook; `out` is a writable local, copied at once.
        let found = unsafe {
            cb::envoy_dynamic_module_callback_http_filter_get_attribute_string(
                self.raw, id, &mut out,
            )
        };
        if !found {
            return None;
        }
        // SAFETY: filled by Envoy just above, copied before any other callback.
        Some(String::from_utf8_lossy(unsafe { out.as_bytes() }).into_owned())
    }

    /// Whether the stream's dynamic metadata has namespace `ns` with at least one key.
    pub fn has_metadata_namespace(&self, ns: &str) -> bool {
        // The C enum's first value: the stream's dynamic metadata.
        const DYNAMIC_METADATA: u32 = 0;
        // SAFETY: `raw` is live; `ns` outlives the call.
        let count = unsafe {
            cb::envoy_dynamic_module_callback_http_get_metadata_keys_count(
                self.raw,
                DYNAMIC_METADATA,
                ModuleBuffer::from_bytes(ns.as_bytes()),
            )
        };
        count > 0
    }

    /// Stores `value` under filter-state key `key` of this stream; `false` if Envoy refused.
    pub fn set_filter_state_bytes(&mut self, key: &str, value: &[u8]) -> bool {
        // SAFETY: `raw` is live; both buffers outlive the call and Envoy copies them.
        unsafe {
            cb::envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self.raw,
                ModuleBuffer::from_bytes(key.as_bytes()),
                ModuleBuffer::from_bytes(value),
            )
        }
    }

    /// The bytes of filter-state key `key` of this stream, copied; `None` if absent.
    pub fn filter_state_bytes(&self, key: &str) -> Option<Vec<u8>> {
        let mut out = EnvoyBuffer::EMPTY;
        // SAFETY: `raw` is live; `key` outlives the call; `out` is a writable local.
        let found = unsafe {
            cb::envoy_dynamic_module_callback_http_get_filter_state_bytes(
                self.raw,
                ModuleBuffer::from_bytes(key.as_bytes()),
                &mut out,
            )
        };
        if !found {
            return None;
        }
        if out.ptr.is_null() {
            return Some(Vec::new());
        }
        // SAFETY: Envoy filled `out` with a view valid until the next setter; copied now.
        Some(unsafe { out.as_bytes() }.to_vec())
    }

    /// Moves gauge `id` (defined on this stream's config): adds `delta` when positive,
    /// subtracts its magnitude when negative. Failures are ignored like counters'.
    pub fn add_gauge(&mut self, id: usize, labels: &[&str], delta: i64) {
        let mut raw_labels = LabelBuffers::new(labels);
        let magnitude = delta.unsigned_abs();
        // SAFETY: `raw` is live; `raw_labels` borrows `labels` for the call.
        let _ = unsafe {
            if delta >= 0 {
                cb::envoy_dynamic_module_callback_http_filter_increment_gauge(
                    self.raw,
                    id,
                    raw_labels.as_mut_ptr(),
                    raw_labels.count(),
                    magnitude,
                )
            } else {
                cb::envoy_dynamic_module_callback_http_filter_decrement_gauge(
                    self.raw,
                    id,
                    raw_labels.as_mut_ptr(),
                    raw_labels.count(),
                    magnitude,
                )
            }
        };
    }

    /// Records `value` in histogram `id` (defined on this stream's config).
    pub fn record_histogram(&mut self, id: usize, labels: &[&str], value: u64) {
        let mut raw_labels = LabelBuffers::new(labels);
        // SAFETY: `raw` is live; `raw_labels` borrows `labels` for the call.
        let _ = unsafe {
            cb::envoy_dynamic_module_callback_http_filter_record_histogram_value(
                self.raw,
                id,
                raw_labels.as_mut_ptr(),
                raw_labels.count(),
                value,
            )
        };
    }

    /// Sets gauge `id` (defined on this stream's config) to `value`.
    pub fn set_gauge(&mut self, id: usize, labels: &[&str], value: u64) {
        let mut raw_labels = LabelBuffers::new(labels);
        // SAFETY: `raw` is live; `raw_labels` borrows `labels` for the call.
        let _ = unsafe {
            cb::envoy_dynamic_module_callback_http_filter_set_gauge(
                self.raw,
                id,
                raw_labels.as_mut_ptr(),
                raw_labels.count(),
                value,
            )
        };
    }

    /// Adds `value` to counter `id` (defined by this stream's filter config) with label values.
    pub fn increment_counter(&mut self, id: usize, labels: &[&str], value: u64) {
        let mut raw_labels = LabelBuffers::new(labels);
        // SAFETY: `raw` is live; `raw_labels` borrows `labels` for the call. A failed metric
        // update is not worth failing a request for, so the result is ignored.
        let _ = unsafe {
            cb::envoy_dynamic_module_callback_http_filter_increment_counter(
                self.raw,
                id,
                raw_labels.as_mut_ptr(),
                raw_labels.count(),
                value,
            )
        };
    }
}
