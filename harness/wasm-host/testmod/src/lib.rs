//! A proxy-wasm test fixture for the `infergate-wasm-host` harness.
//!
//! It exercises every host call the harness implements, in ways a test can observe:
//!
//! - root id `poller` (a service like the scraper): on every tick it sends an HTTP call to the
//!   configured upstream; the answer's body is published to shared data under `snapshot`
//!   (with compare-and-swap), its `:status` under `snapshot-status`; failures are counted.
//! - any other root id (an HTTP filter): edits request/response headers, buffers and rewrites
//!   the request body, streams the response body, sends local replies, pauses on an HTTP call
//!   and resumes when it is answered, reads and writes properties and shared data, calls a
//!   foreign function and records metrics.
//!
//! The plugin configuration is `key=value` lines: `tick_ms`, `upstream`, `path`.
//! Nothing here is product logic: it only gives the host something real to drive.

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel, MetricType, Status};
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|context_id| -> Box<dyn RootContext> {
        Box::new(Root { context_id, ..Root::default() })
    });
}}

/// Metric ids defined by a root context and shared with its HTTP contexts.
#[derive(Clone, Copy, Default)]
struct Metrics {
    requests: u32,
    inflight: u32,
    body_bytes: u32,
    scrapes_ok: u32,
    scrapes_failed: u32,
}

#[derive(Default)]
struct Root {
    context_id: u32,
    role: String,
    vm_config: String,
    upstream: String,
    path: String,
    metrics: Metrics,
    /// How many HTTP contexts this root created (shared so `on_log` can count down).
    live_streams: Rc<Cell<u32>>,
}

fn read_role() -> String {
    hostcalls::get_property(vec!["plugin_root_id"])
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

fn define(kind: MetricType, name: &str) -> u32 {
    hostcalls::define_metric(kind, name).unwrap_or(0)
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        num_headers: usize,
        body_size: usize,
        _n: usize,
    ) {
        if num_headers == 0 {
            let _ = hostcalls::increment_metric(self.metrics.scrapes_failed, 1);
            return;
        }
        let status = self
            .get_http_call_response_header(":status")
            .unwrap_or_default();
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        // Publish with compare-and-swap, retrying once on a lost race, like a real scraper.
        for _ in 0..2 {
            let (_, cas) = self.get_shared_data("snapshot");
            if self.set_shared_data("snapshot", Some(&body), cas).is_ok() {
                break;
            }
        }
        let _ = self.set_shared_data("snapshot-status", Some(status.as_bytes()), None);
        let _ = hostcalls::increment_metric(self.metrics.scrapes_ok, 1);
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, _size: usize) -> bool {
        self.vm_config = self
            .get_vm_configuration()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        log::info!("vm started with config '{}'", self.vm_config);
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        self.role = read_role();
        let config = self
            .get_plugin_configuration()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        if config.contains("reject") {
            return false;
        }
        for line in config.lines() {
            match line.split_once('=') {
                Some(("tick_ms", v)) => {
                    let ms = v.trim().parse().unwrap_or(0);
                    self.set_tick_period(Duration::from_millis(ms));
                }
                Some(("upstream", v)) => self.upstream = v.trim().to_string(),
                Some(("path", v)) => self.path = v.trim().to_string(),
                _ => {}
            }
        }
        let prefix = format!("testmod.{}", self.role);
        self.metrics = Metrics {
            requests: define(MetricType::Counter, &format!("{prefix}.requests")),
            inflight: define(MetricType::Gauge, &format!("{prefix}.inflight")),
            body_bytes: define(MetricType::Histogram, &format!("{prefix}.body_bytes")),
            scrapes_ok: define(MetricType::Counter, &format!("{prefix}.scrapes_ok")),
            scrapes_failed: define(MetricType::Counter, &format!("{prefix}.scrapes_failed")),
        };
        log::info!("configured root {} as '{}'", self.context_id, self.role);
        true
    }

    fn on_tick(&mut self) {
        let path = self.path.clone();
        let headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", "pool"),
        ];
        match self.dispatch_http_call(
            &self.upstream,
            headers,
            None,
            vec![],
            Duration::from_millis(40),
        ) {
            Ok(token) => log::debug!("tick: call {token} sent"),
            Err(status) => {
                log::warn!("tick: dispatch failed: {status:?}");
                let _ = hostcalls::increment_metric(self.metrics.scrapes_failed, 1);
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        self.live_streams.set(self.live_streams.get() + 1);
        let _ = hostcalls::record_metric(self.metrics.inflight, u64::from(self.live_streams.get()));
        Some(Box::new(Filter {
            context_id,
            metrics: self.metrics,
            vm_config: self.vm_config.clone(),
            upstream: self.upstream.clone(),
            live_streams: Rc::clone(&self.live_streams),
            response_bytes: 0,
            defer_done: false,
            read_status: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Filter {
    context_id: u32,
    metrics: Metrics,
    vm_config: String,
    upstream: String,
    live_streams: Rc<Cell<u32>>,
    response_bytes: usize,
    /// Keep the context alive after the stream ends until the HTTP call is answered.
    defer_done: bool,
    /// Read the call's `:status` even when the call failed (a bug Envoy punishes).
    read_status: bool,
}

impl Context for Filter {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        num_headers: usize,
        body_size: usize,
        _n: usize,
    ) {
        let body = self
            .get_http_call_response_body(0, body_size)
            .unwrap_or_default();
        let verdict = if num_headers == 0 {
            "failed".to_string()
        } else {
            String::from_utf8_lossy(&body).into_owned()
        };
        self.set_http_request_header("x-call-result", Some(&verdict));
        if self.read_status {
            // Without headers (a failed call) Envoy answers BadArgument and the SDK panics.
            let status = self
                .get_http_call_response_header(":status")
                .unwrap_or_default();
            self.set_http_request_header("x-call-status", Some(&status));
        }
        if self.defer_done {
            self.done();
        } else {
            self.resume_http_request();
        }
    }

    fn on_done(&mut self) -> bool {
        !self.defer_done
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, num_headers: usize, end_of_stream: bool) -> Action {
        let _ = hostcalls::increment_metric(self.metrics.requests, 1);
        // Strip every client header of our private namespace, like the product strips x-gateway-*.
        for (name, _) in self.get_http_request_headers() {
            if name.starts_with("x-private-") {
                self.remove_http_request_header(&name);
            }
        }
        self.add_http_request_header("x-seen-headers", &num_headers.to_string());
        self.set_http_request_header("x-context-id", Some(&self.context_id.to_string()));
        if !self.vm_config.is_empty() {
            self.set_http_request_header("x-vm-config", Some(&self.vm_config));
        }
        let now = self
            .get_current_time()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.set_http_request_header("x-now-ms", Some(&now.as_millis().to_string()));
        if let Some(path) = self.get_property(vec!["request", "path"]) {
            self.set_http_request_header("x-property-path", Some(&String::from_utf8_lossy(&path)));
        }
        self.set_property(vec!["testmod", "stage"], Some(b"headers"));

        if self.get_http_request_header("x-panic").is_some() {
            panic!("asked to panic");
        }
        if let Some(code) = self.get_http_request_header("x-reply") {
            let status = code.parse().unwrap_or(500);
            self.send_http_response(
                status,
                vec![("content-type", "application/json"), ("x-reason", "asked")],
                Some(b"{\"error\":\"asked\"}"),
            );
            return Action::Pause;
        }
        if self.get_http_request_header("x-ffi").is_some() {
            let result = match hostcalls::call_foreign_function("testmod_probe", Some(b"args")) {
                Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
                Ok(None) => "ok-empty".to_string(),
                Err(Status::NotFound) => "not-found".to_string(),
                Err(other) => format!("{other:?}"),
            };
            self.set_http_request_header("x-ffi-result", Some(&result));
        }
        self.defer_done = self.get_http_request_header("x-defer-done").is_some();
        self.read_status = self.get_http_request_header("x-read-status").is_some();
        if self.get_http_request_header("x-call").is_some() {
            let headers = vec![
                (":method", "GET"),
                (":path", "/decide"),
                (":authority", "pool"),
            ];
            return match self.dispatch_http_call(
                &self.upstream,
                headers,
                Some(b"q"),
                vec![],
                Duration::from_millis(100),
            ) {
                Ok(_) => Action::Pause,
                Err(_) => {
                    self.send_http_response(503, vec![], Some(b"no upstream"));
                    Action::Pause
                }
            };
        }
        if self.get_http_request_header("x-cas-incr").is_some() {
            // Atomic counter in shared data: read, increment, write with the cas; retry on races.
            for _ in 0..8 {
                let (value, cas) = self.get_shared_data("counter");
                let n: u64 = value
                    .and_then(|v| String::from_utf8(v).ok())
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if self
                    .set_shared_data(
                        "counter",
                        Some((n + 1).to_string().as_bytes()),
                        cas.or(Some(0)),
                    )
                    .is_ok()
                {
                    self.set_http_request_header("x-counter", Some(&(n + 1).to_string()));
                    break;
                }
            }
        }
        if let (Some(snapshot), _) = self.get_shared_data("snapshot") {
            self.set_http_request_header("x-snapshot", Some(&String::from_utf8_lossy(&snapshot)));
        }
        if end_of_stream {
            Action::Continue
        } else {
            // Buffer the whole body before deciding, as the body router does.
            Action::Pause
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, body_size).unwrap_or_default();
        let _ = hostcalls::record_metric(self.metrics.body_bytes, body.len() as u64);
        self.set_http_request_header("x-body-len", Some(&body.len().to_string()));
        if body.starts_with(b"upper:") {
            let upper = body.to_ascii_uppercase();
            self.set_http_request_body(0, body_size, &upper);
        }
        self.set_property(vec!["testmod", "stage"], Some(b"body"));
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.set_http_response_header("server", Some("testmod"));
        // Too late to steer routing: the host must record it as a late write.
        self.set_http_request_header("x-late", Some("1"));
        self.remove_http_response_header("x-upstream-secret");
        let status = self.get_http_response_header(":status").unwrap_or_default();
        self.add_http_response_header("x-saw-status", &status);
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        // Streamed through chunk by chunk: count, never buffer; append a trailer line at the end.
        self.response_bytes += body_size;
        if end_of_stream {
            let marker = format!("\n[bytes={}]", self.response_bytes);
            self.set_http_response_body(body_size, 0, marker.as_bytes());
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.live_streams
            .set(self.live_streams.get().saturating_sub(1));
        let _ = hostcalls::record_metric(self.metrics.inflight, u64::from(self.live_streams.get()));
        log::info!(
            "stream {} done after {} response bytes",
            self.context_id,
            self.response_bytes
        );
    }
}
