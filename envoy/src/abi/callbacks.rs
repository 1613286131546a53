//! The `envoy_dynamic_module_callback_*` functions this module calls: implemented inside the
//! Envoy binary and resolved when Envoy `dlopen`s our `.so` (a Linux `cdylib` may leave them
//! undefined). Only the callbacks we actually use are declared; a unit test checks every name
//! here against the symbol list of the Envoy 1.40.0 binary (`testdata/`), because a missing
//! symbol is only found when first called, and then Envoy aborts.
//!
//! Every pointer argument follows the ownership rules in the parent module: `*_envoy_ptr`
//! values must be ones Envoy handed us and that are still alive; [`ModuleBuffer`]s and
//! [`ModuleHttpHeader`] arrays are borrowed only for the call; out-parameters must point to
//! writable memory of the stated size.

use super::{
    BodyKind, CalloutInitResult, EnvoyBuffer, EnvoyHttpHeader, FilterResetReason, HeaderKind,
    HostHealthRaw, HttpFilterConfigEnvoyPtr, HttpFilterConfigSchedulerPtr, HttpFilterEnvoyPtr,
    HttpFilterSchedulerPtr, LbEnvoyPtr, LogLevel, MetricsResult, ModuleBuffer, ModuleHttpHeader,
};

unsafe extern "C" {
    // ----- logging (any thread) -----

    /// Logs `message` under Envoy's `dynamic_modules` logger.
    pub fn envoy_dynamic_module_callback_log(level: LogLevel, message: ModuleBuffer);

    // ----- HTTP headers (stream's worker thread) -----

    /// Reads value `index` of header `key`; `result` gets an Envoy-owned view (empty if absent),
    /// `optional_size` (nullable) the number of values.
    pub fn envoy_dynamic_module_callback_http_get_header(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        header_type: HeaderKind,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;

    /// Number of entries in a header map (0 if the map is not available in this phase).
    pub fn envoy_dynamic_module_callback_http_get_headers_size(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        header_type: HeaderKind,
    ) -> usize;

    /// Fills `result_headers` (caller-allocated, at least `get_headers_size` slots) with
    /// Envoy-owned views of every entry.
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        header_type: HeaderKind,
        result_headers: *mut EnvoyHttpHeader,
    ) -> bool;

    /// Replaces every value of `key` with `value`; a NULL `value` removes the header.
    pub fn envoy_dynamic_module_callback_http_set_header(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        header_type: HeaderKind,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    /// Appends a value for `key`.
    pub fn envoy_dynamic_module_callback_http_add_header(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        header_type: HeaderKind,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    // ----- HTTP bodies -----

    /// Total bytes of the addressed body (0 if unavailable).
    pub fn envoy_dynamic_module_callback_http_get_body_size(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: BodyKind,
    ) -> usize;

    /// Number of slices of the addressed body.
    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: BodyKind,
    ) -> usize;

    /// Fills `result_buffer_vector` (caller-allocated, `get_body_chunks_size` slots) with
    /// Envoy-owned views of the slices.
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: BodyKind,
        result_buffer_vector: *mut EnvoyBuffer,
    ) -> bool;

    /// True when the request chunk of the current body hook *is* what an earlier filter
    /// buffered (that filter paused and resumed), so it must not be added to the buffer again.
    pub fn envoy_dynamic_module_callback_http_received_buffered_request_body(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
    ) -> bool;

    /// Drops the first `number_of_bytes` bytes of the addressed body.
    pub fn envoy_dynamic_module_callback_http_drain_body(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: BodyKind,
        number_of_bytes: usize,
    ) -> bool;

    /// Appends `data` (copied) to the addressed body.
    pub fn envoy_dynamic_module_callback_http_append_body(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        body_type: BodyKind,
        data: ModuleBuffer,
    ) -> bool;

    /// The stream's buffer limit in bytes (what Envoy buffers before answering 413 itself).
    pub fn envoy_dynamic_module_callback_http_get_buffer_limit(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
    ) -> u64;

    /// Sets the stream's buffer limit in bytes.
    pub fn envoy_dynamic_module_callback_http_set_buffer_limit(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        limit: u64,
    );

    // ----- local replies, stream control, routing -----

    /// Sends a local reply (headers and body are copied); the stream then ends.
    pub fn envoy_dynamic_module_callback_http_send_response(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        status_code: u32,
        headers_vector: *mut ModuleHttpHeader,
        headers_vector_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );

    /// Resets the downstream stream (used when a response is already under way).
    pub fn envoy_dynamic_module_callback_http_filter_reset_stream(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        reason: FilterResetReason,
        details: ModuleBuffer,
    );

    /// Forces Envoy to re-match the route (after a route-relevant header changed).
    pub fn envoy_dynamic_module_callback_http_clear_route_cache(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
    );

    /// Sets a string in the stream's dynamic metadata under `ns`/`key` (copied).
    pub fn envoy_dynamic_module_callback_http_set_dynamic_metadata_string(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        ns: ModuleBuffer,
        key: ModuleBuffer,
        value: ModuleBuffer,
    );

    /// The number of keys in namespace `ns` of the metadata `source` names (0: the
    /// namespace is absent). `source` 0 is the stream's dynamic metadata.
    pub fn envoy_dynamic_module_callback_http_get_metadata_keys_count(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        source: u32,
        ns: ModuleBuffer,
    ) -> usize;

    /// Reads the string under `ns`/`key` of the metadata `source` names (0: the stream's
    /// dynamic metadata); `result` gets an Envoy-owned view valid until the hook returns or
    /// a setter is called. `false` if absent or not a string.
    pub fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        source: u32,
        ns: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// Writes the number of elements of the list under `ns`/`key` to `result`; `false` if
    /// absent or not a list.
    pub fn envoy_dynamic_module_callback_http_get_metadata_list_size(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        source: u32,
        ns: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut usize,
    ) -> bool;

    /// Reads element `index` of the list under `ns`/`key` as a string view (as
    /// `get_metadata_string`); `false` if out of range or not a string.
    pub fn envoy_dynamic_module_callback_http_get_metadata_list_string(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        source: u32,
        ns: ModuleBuffer,
        key: ModuleBuffer,
        index: usize,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// The name of the cluster the stream's route chose (Envoy re-matches a cleared route
    /// first; with weighted clusters, the one drawn); `result` gets an Envoy-owned view
    /// valid until the hook returns or the route changes. `false` if no route or cluster.
    pub fn envoy_dynamic_module_callback_http_get_cluster_name(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// Reads the string attribute `attribute_id` (`envoy_dynamic_module_type_attribute_id`,
    /// an append-only C enum) of the stream; `result` gets an Envoy-owned view valid until
    /// the hook returns. `false` if the attribute is unavailable or not a string.
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        attribute_id: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    // ----- pause and resume -----

    /// Creates a scheduler for the stream (stream's worker thread, inside a hook). The module
    /// owns the result: `http_filter_scheduler_delete` frees it, from any thread.
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
    ) -> HttpFilterSchedulerPtr;

    /// From any thread: Envoy posts `on_http_filter_scheduled(event_id)` to the stream's worker
    /// thread; nothing happens if the stream is gone by then.
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: HttpFilterSchedulerPtr,
        event_id: u64,
    );

    /// Frees a scheduler made by `http_filter_scheduler_new` (any thread, exactly once).
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(
        scheduler: HttpFilterSchedulerPtr,
    );

    /// Restarts decoding of a stream a hook stopped (stream's worker thread).
    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
    );

    // ----- per-stream filter state (stream's worker thread) -----

    /// Stores `value` under filter-state key `key` of the stream (Envoy copies both into a
    /// read-only string object, filter-chain life span). `false` if the stream has no stream
    /// info or the key is already set read-only.
    pub fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    /// Reads the bytes of the string filter-state object under `key`; `result` gets an
    /// Envoy-owned view, valid until the current hook returns or a filter-state setter is
    /// called. `false` if absent or not a string object (e.g. written by another extension).
    pub fn envoy_dynamic_module_callback_http_get_filter_state_bytes(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;

    // ----- HTTP filter stats (define on the main thread in config_new only) -----

    /// Defines a counter named `name` (prefixed with the module's metrics namespace) with
    /// `label_names_length` label names; writes its id to `counter_id_ptr`.
    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        counter_id_ptr: *mut usize,
    ) -> MetricsResult;

    /// Adds `value` to a counter defined by this stream's config; the label count must match.
    pub fn envoy_dynamic_module_callback_http_filter_increment_counter(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    /// Defines a gauge like `http_filter_config_define_counter`; writes its id to
    /// `gauge_id_ptr`.
    pub fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        gauge_id_ptr: *mut usize,
    ) -> MetricsResult;

    /// Adds `value` to a gauge defined by this stream's config; the label count must match.
    pub fn envoy_dynamic_module_callback_http_filter_increment_gauge(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    /// Defines a histogram like `http_filter_config_define_counter`; writes its id to
    /// `histogram_id_ptr`.
    pub fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        histogram_id_ptr: *mut usize,
    ) -> MetricsResult;

    /// Records `value` in a histogram defined by this stream's config.
    pub fn envoy_dynamic_module_callback_http_filter_record_histogram_value(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    /// Subtracts `value` from a gauge defined by this stream's config.
    pub fn envoy_dynamic_module_callback_http_filter_decrement_gauge(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    /// Sets a gauge defined by this stream's config to `value`.
    pub fn envoy_dynamic_module_callback_http_filter_set_gauge(
        filter_envoy_ptr: HttpFilterEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    // ----- HTTP filter config on the main thread (the scraper, `crate::scraper`) -----
    //
    // Signatures as in Envoy 1.40's `abi.h`; the stat updates take the same arguments as
    // their per-stream counterparts above, with the config pointer in place of the stream's.

    /// Creates a scheduler that runs `on_http_filter_config_scheduled` on the main thread
    /// (main thread, once the config exists: Envoy calls config_new on a config it already
    /// shares, so this is allowed there). The module owns the result.
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
    ) -> HttpFilterConfigSchedulerPtr;

    /// From any thread: Envoy posts `on_http_filter_config_scheduled(event_id)` to the main
    /// thread; dropped if the config is gone by then.
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: HttpFilterConfigSchedulerPtr,
        event_id: u64,
    );

    /// Frees a scheduler made by `http_filter_config_scheduler_new` (exactly once, when no
    /// thread can commit on it any more).
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler: HttpFilterConfigSchedulerPtr,
    );

    /// Starts an HTTP request to `cluster_name` from the config (main thread; `:method`,
    /// `:path` and `host` are required); writes the callout id (unique within this config) to
    /// `callout_id_out`. Completion arrives in `on_http_filter_config_http_callout_done`;
    /// callouts still pending when the config is destroyed are cancelled without one.
    pub fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHttpHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> CalloutInitResult;

    /// Adds `value` to a counter this config defined.
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    /// Sets a gauge this config defined to `value`.
    pub fn envoy_dynamic_module_callback_http_filter_config_set_gauge(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    /// Adds `value` to a gauge this config defined.
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    /// Subtracts `value` from a gauge this config defined.
    pub fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
        filter_config_envoy_ptr: HttpFilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    // ----- load-balancer policy (the instance's own thread; see `LbEnvoyPtr`) -----

    /// The name of the cluster this LB instance balances; `result` gets an Envoy-owned view
    /// valid while the instance lives.
    pub fn envoy_dynamic_module_callback_lb_get_cluster_name(
        lb_envoy_ptr: LbEnvoyPtr,
        result: *mut EnvoyBuffer,
    );

    /// Number of priority levels of the cluster.
    pub fn envoy_dynamic_module_callback_lb_get_priority_set_size(
        lb_envoy_ptr: LbEnvoyPtr,
    ) -> usize;

    /// Number of hosts (every health) at `priority`.
    pub fn envoy_dynamic_module_callback_lb_get_hosts_count(
        lb_envoy_ptr: LbEnvoyPtr,
        priority: u32,
    ) -> usize;

    /// Number of healthy hosts at `priority`.
    pub fn envoy_dynamic_module_callback_lb_get_healthy_hosts_count(
        lb_envoy_ptr: LbEnvoyPtr,
        priority: u32,
    ) -> usize;

    /// Address (`ip:port`) of host `index` among all hosts at `priority`; false if none.
    pub fn envoy_dynamic_module_callback_lb_get_host_address(
        lb_envoy_ptr: LbEnvoyPtr,
        priority: u32,
        index: usize,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// Address of host `index` among the healthy hosts at `priority`; false if none.
    pub fn envoy_dynamic_module_callback_lb_get_healthy_host_address(
        lb_envoy_ptr: LbEnvoyPtr,
        priority: u32,
        index: usize,
        result: *mut EnvoyBuffer,
    ) -> bool;

    /// Coarse health of host `index` among all hosts at `priority` (raw, see
    /// [`HostHealthRaw`]).
    pub fn envoy_dynamic_module_callback_lb_get_host_health(
        lb_envoy_ptr: LbEnvoyPtr,
        priority: u32,
        index: usize,
    ) -> HostHealthRaw;
}
