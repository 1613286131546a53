//! Everything the host keeps while a module runs, and the records tests inspect.
//!
//! [`HostState`] is the wasmtime `Store` data: host calls read and write it through their
//! `Caller`, the [`crate::Host`] API reads it between callbacks. Per-stream state lives in
//! [`StreamState`]; the "effective context" decides which stream or root a host call touches.

use crate::abi::{LogLevel, MetricType, Status};
use crate::headers::HeaderMap;
use crate::shared::SharedData;
use std::collections::{BTreeMap, HashMap};
use wasmtime::{Memory, TypedFunc};

/// One line the module logged (`proxy_log`, or stdout/stderr through WASI `fd_write`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Level (stdout is `Info`, stderr is `Error`, as the ABI says).
    pub level: LogLevel,
    /// Effective context when it was logged.
    pub context_id: u32,
    /// The message.
    pub message: String,
}

/// An HTTP call the module dispatched with `proxy_http_call`, waiting for the test's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    /// Token the module received.
    pub token: u32,
    /// Context that made the call (it receives the response).
    pub context_id: u32,
    /// Upstream (Envoy cluster) name.
    pub upstream: String,
    /// Request headers (`:method`, `:path`, `:authority`, ...).
    pub headers: HeaderMap,
    /// Request body.
    pub body: Vec<u8>,
    /// Request trailers.
    pub trailers: HeaderMap,
    /// Timeout in milliseconds (0: none).
    pub timeout_ms: u32,
    /// Host time when it was sent.
    pub sent_at_ms: u64,
}

impl HttpCall {
    /// The `:path` header.
    pub fn path(&self) -> Option<String> {
        self.headers.get(":path")
    }
}

/// The answer a test gives to an [`HttpCall`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpCallResponse {
    /// Headers (a `:status` header is added from `status` when absent).
    pub headers: HeaderMap,
    /// Body.
    pub body: Vec<u8>,
    /// Trailers.
    pub trailers: HeaderMap,
}

impl HttpCallResponse {
    /// A response with this status and body and no other header.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        let mut headers = HeaderMap::new();
        headers.add(":status", status.to_string().as_bytes());
        Self {
            headers,
            body: body.into(),
            trailers: HeaderMap::new(),
        }
    }
}

/// A reply the module sent with `proxy_send_local_response`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status code.
    pub status: u32,
    /// Status code details.
    pub details: String,
    /// Body.
    pub body: Vec<u8>,
    /// Headers.
    pub headers: HeaderMap,
    /// gRPC status (-1: none).
    pub grpc_status: i32,
}

impl LocalResponse {
    /// The body as lossy UTF-8.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A call the module made with `proxy_call_foreign_function`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignCall {
    /// Function name.
    pub name: String,
    /// Arguments.
    pub arguments: Vec<u8>,
    /// Effective context.
    pub context_id: u32,
    /// Status returned to the module.
    pub status: Status,
}

/// A foreign function a test registers: arguments in, results (or a status) out.
pub type ForeignFunction = Box<dyn FnMut(&[u8]) -> Result<Vec<u8>, Status> + Send>;

/// How a hostcall answers in place of its normal behaviour, for tests of a host in
/// trouble: Envoy answers `BadArgument`, `NotFound`, `InternalFailure` and others where its
/// state says so, and a module must survive each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostcallFault {
    /// Return this status number (any `u32`, also ones outside the ABI) and do nothing.
    Status(u32),
    /// Answer `Ok` with these bytes as the returned value (for calls that return bytes:
    /// header maps, header values, buffers, properties, shared data), e.g. a garbled map.
    Bytes(Vec<u8>),
}

/// A metric defined by the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    /// Name as defined.
    pub name: String,
    /// Kind.
    pub kind: MetricType,
    /// Current value (counters and gauges; last recorded value for histograms).
    pub value: u64,
    /// Every value recorded into a histogram.
    pub recorded: Vec<u64>,
}

/// One direction (request or response) of an HTTP stream.
#[derive(Debug, Clone, Default)]
pub struct Direction {
    /// Headers as the module left them (delivered by the test, edited by the module).
    pub headers: Option<HeaderMap>,
    /// Trailers, if delivered.
    pub trailers: Option<HeaderMap>,
    /// Body bytes held back while the module pauses (what `get_buffer_bytes` reads).
    pub buffered: Vec<u8>,
    /// Body bytes already forwarded (upstream for requests, downstream for responses).
    pub forwarded: Vec<u8>,
    /// The headers as they were when the host forwarded them (`None` while held).
    pub forwarded_headers: Option<HeaderMap>,
    /// Whether the module called `proxy_continue_stream` for this direction since the last
    /// callback returned.
    pub continue_requested: bool,
    /// Header writes after the headers were already forwarded: Envoy ignores them.
    pub late_header_writes: Vec<String>,
    /// Whether the module closed (reset) this direction.
    pub closed: bool,
    /// Whether the last body chunk has been delivered.
    pub end_of_stream: bool,
}

/// State of one HTTP stream context.
#[derive(Debug, Clone, Default)]
pub struct StreamState {
    /// Root context it belongs to.
    pub root_context_id: u32,
    /// The request direction.
    pub request: Direction,
    /// The response direction.
    pub response: Direction,
    /// Local reply, if the module sent one.
    pub local_response: Option<LocalResponse>,
    /// Properties set by the module or the test for this stream.
    pub properties: BTreeMap<Vec<String>, Vec<u8>>,
    /// Whether `proxy_on_done` returned false: the host waits for `proxy_done`.
    pub awaiting_done: bool,
    /// Whether the module called `proxy_done` for this context.
    pub done_called: bool,
    /// Whether the context was deleted.
    pub deleted: bool,
}

/// State of one root (plugin) context.
#[derive(Debug, Clone, Default)]
pub struct RootState {
    /// Its root id (`plugin_root_id`).
    pub root_id: String,
    /// Tick period in milliseconds (0: no ticks).
    pub tick_period_ms: u32,
    /// Host time at which the next tick is due.
    pub next_tick_ms: u64,
}

/// The wasmtime store data: the whole host-side state of one module instance.
pub struct HostState {
    /// The module's memory, set right after instantiation.
    pub(crate) memory: Option<Memory>,
    /// The module's allocator (`proxy_on_memory_allocate`, else `malloc`).
    pub(crate) alloc: Option<TypedFunc<u32, u32>>,
    /// Context the current host call acts on.
    pub(crate) effective_context: u32,
    /// Root contexts by id.
    pub(crate) roots: BTreeMap<u32, RootState>,
    /// HTTP stream contexts by id (deleted ones are kept for the test to inspect).
    pub(crate) streams: BTreeMap<u32, StreamState>,
    /// Streams that asked the host to act once the running callback returns (a
    /// `proxy_continue_stream`, a `proxy_done`): only these are visited then, not every
    /// stream ever opened.
    pub(crate) to_settle: Vec<u32>,
    /// Last context id handed out.
    pub(crate) last_context_id: u32,
    /// VM id (`plugin_vm_id`).
    pub(crate) vm_id: String,
    /// This host's id among the hosts of the process (who registered a shared queue).
    pub(crate) host_id: u64,
    /// VM configuration (readable during `proxy_on_vm_start`, and after, like Envoy).
    pub(crate) vm_config: Vec<u8>,
    /// Plugin configuration, readable only during `proxy_on_configure`.
    pub(crate) plugin_config: Option<Vec<u8>>,
    /// The HTTP call response being delivered, readable only during the callback.
    pub(crate) call_response: Option<HttpCallResponse>,
    /// Whether the call being delivered failed (what `proxy_get_status` reports).
    pub(crate) call_failed: bool,
    /// Calls waiting for an answer, in dispatch order.
    pub(crate) pending_calls: Vec<HttpCall>,
    /// Calls cancelled because their context went away.
    pub(crate) cancelled_calls: Vec<HttpCall>,
    /// Last http call token handed out.
    pub(crate) last_call_token: u32,
    /// Upstreams `proxy_http_call` accepts (`None`: any).
    pub(crate) clusters: Option<Vec<String>>,
    /// Host time in nanoseconds since the Unix epoch.
    pub(crate) now_ns: u64,
    /// State of the deterministic random generator (WASI `random_get`).
    pub(crate) rng: u64,
    /// Log level reported by `proxy_get_log_level`.
    pub(crate) log_level: LogLevel,
    /// Every line logged.
    pub(crate) logs: Vec<LogLine>,
    /// Whether to echo log lines to stderr as they arrive.
    pub(crate) echo_logs: bool,
    /// Metrics in definition order; the id is the index + 1.
    pub(crate) metrics: Vec<Metric>,
    /// Host-level properties (set by the test, or by the module from a root context).
    pub(crate) properties: BTreeMap<Vec<String>, Vec<u8>>,
    /// Shared data scope.
    pub(crate) shared: SharedData,
    /// Foreign functions the test registered.
    pub(crate) foreign_functions: HashMap<String, ForeignFunction>,
    /// Every foreign-function call the module made.
    pub(crate) foreign_calls: Vec<ForeignCall>,
    /// Injected answers by hostcall name (`proxy_get_header_map_value`, ...).
    pub(crate) faults: HashMap<String, HostcallFault>,
    /// Environment variables the module sees through WASI.
    pub(crate) env: Vec<(String, String)>,
    /// Exit code if the module called WASI `proc_exit`.
    pub(crate) exit_code: Option<u32>,
    /// Unfinished last line written to stdout (fd 1) and stderr (fd 2).
    pub(crate) partial_output: [Vec<u8>; 2],
}

impl HostState {
    /// A fresh state.
    pub(crate) fn new(vm_id: String, shared: SharedData) -> Self {
        static NEXT_HOST_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let host_id = NEXT_HOST_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            memory: None,
            alloc: None,
            effective_context: 0,
            roots: BTreeMap::new(),
            streams: BTreeMap::new(),
            to_settle: Vec::new(),
            last_context_id: 0,
            vm_id,
            host_id,
            vm_config: Vec::new(),
            plugin_config: None,
            call_response: None,
            call_failed: false,
            pending_calls: Vec::new(),
            cancelled_calls: Vec::new(),
            last_call_token: 0,
            clusters: None,
            // 2026-01-01T00:00:00Z: a realistic wall clock unless the test sets one.
            now_ns: 1_767_225_600_000 * 1_000_000,
            // Deterministic, but distinct per host, as two Envoy VMs' random draws are.
            rng: 0x9E37_79B9_7F4A_7C15 ^ host_id.wrapping_mul(0xBF58_476D_1CE4_E5B9),
            log_level: LogLevel::Trace,
            logs: Vec::new(),
            echo_logs: std::env::var_os("WASM_HOST_ECHO_LOGS").is_some(),
            metrics: Vec::new(),
            properties: BTreeMap::new(),
            shared,
            foreign_functions: HashMap::new(),
            foreign_calls: Vec::new(),
            faults: HashMap::new(),
            env: Vec::new(),
            exit_code: None,
            partial_output: [Vec::new(), Vec::new()],
        }
    }

    /// Records a log line.
    pub(crate) fn log(&mut self, level: LogLevel, message: String) {
        if self.echo_logs {
            eprintln!(
                "[wasm {:?} ctx={}] {}",
                level, self.effective_context, message
            );
        }
        self.logs.push(LogLine {
            level,
            context_id: self.effective_context,
            message,
        });
    }

    /// The injected answer of hostcall `name`, if a test set one.
    pub(crate) fn fault(&self, name: &str) -> Option<HostcallFault> {
        if self.faults.is_empty() {
            return None;
        }
        self.faults.get(name).cloned()
    }

    /// The stream the effective context designates, if it is a stream.
    pub(crate) fn effective_stream(&mut self) -> Option<&mut StreamState> {
        self.streams.get_mut(&self.effective_context)
    }

    /// The effective stream, noted for the host to settle after the running callback.
    pub(crate) fn effective_stream_to_settle(&mut self) -> Option<&mut StreamState> {
        let id = self.effective_context;
        let stream = self.streams.get_mut(&id)?;
        self.to_settle.push(id);
        Some(stream)
    }

    /// The root context the effective context belongs to.
    pub(crate) fn effective_root(&self) -> Option<&RootState> {
        let id = self.root_of(self.effective_context)?;
        self.roots.get(&id)
    }

    /// The root context id of `context_id` (itself when it is a root).
    pub(crate) fn root_of(&self, context_id: u32) -> Option<u32> {
        if self.roots.contains_key(&context_id) {
            return Some(context_id);
        }
        self.streams.get(&context_id).map(|s| s.root_context_id)
    }

    /// Appends WASI output of stdout (`stderr == false`) or stderr, logging whole lines.
    pub(crate) fn write_output(&mut self, stderr: bool, bytes: &[u8]) {
        let level = if stderr {
            LogLevel::Error
        } else {
            LogLevel::Info
        };
        let mut pending = std::mem::take(&mut self.partial_output[usize::from(stderr)]);
        pending.extend_from_slice(bytes);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line);
            self.log(level, text.trim_end().to_string());
        }
        self.partial_output[usize::from(stderr)] = pending;
    }

    /// Next pseudo-random 64-bit value (xorshift64*): deterministic across runs.
    pub(crate) fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Current host time in milliseconds.
    pub(crate) fn now_ms(&self) -> u64 {
        self.now_ns / 1_000_000
    }
}
