//! The HTTP contexts: [`PipelineContext`] hands each proxy-wasm callback of a gateway
//! filter to its request pipeline (`filters::pipeline`) and turns the [`FilterStatus`] into
//! an [`Action`]; the others answer requests of a module without a usable configuration
//! or apply the router's header edits (the bench build's `probe` is `crate::probe`).
//!
//! `Pause` from the request-headers callback reaches Envoy as `StopAllIterationAndWatermark`
//! unless the plugin sets `allow_on_headers_stop_iteration: true` (which an Istio
//! `WasmPlugin` cannot): the filter then sees no body until it lets the headers go. So,
//! per [`HeadersMode`], the router lets them go and keeps its header edits for the
//! `headers` role ([`HeadersContext`]), and the picker stops at the headers only to wait
//! for the owner's answer. `Pause` from the body callback means "keep buffering".
//!
//! A request whose headers or body the host failed to hand over (any status but
//! `NotFound`, see `host`) is failed closed with 500 after the filter's callback; if the
//! filter answered it meanwhile, `host` already turned that answer into the 500. Once a
//! request is answered or failed closed, its context is [`Latch::Closed`]: every later
//! callback returns `Pause` without running the filter, so a reply the host refused to
//! send can never be followed by a body forwarded upstream.

use std::rc::Rc;

use infergate_filters::host::LocalReply;
use infergate_filters::pipeline::{Pipeline, Run};
use infergate_filters::reply::Reply;
use infergate_filters::FilterStatus;

use std::cell::RefCell;

use crate::abi::{hostcalls, Action, HttpHooks, LogLevel, MapType};
use crate::host::{
    apply_header_edits, log, HeaderEdit, Passed, PassedHeaders, VmShared, WasmHost,
    HEADER_EDITS_PROPERTY,
};

/// The drop reason of a request the picker could not pick without its body.
pub const REJECTED_NO_HANDOFF: &str = "rejected-no-handoff";

/// The proxy-wasm action for a filter status.
pub fn action(status: FilterStatus) -> Action {
    match status {
        FilterStatus::Continue => Action::Continue,
        FilterStatus::Pause | FilterStatus::Replied => Action::Pause,
    }
}

/// Fail the current request closed: 500 with an OpenAI error body.
fn fail_closed(vm: &Rc<VmShared>, why: &str) -> Action {
    log(LogLevel::Error, why);
    WasmHost::new(vm).send_local_reply(&Reply::internal("internal error in the gateway filter"));
    Action::Pause
}

/// Whether a request's filter still runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Latch {
    /// The filter sees the callbacks.
    #[default]
    Open,
    /// The request was answered or failed closed: hold everything.
    Closed,
}

impl Latch {
    /// The action for what the filter returned, or a 500 if the host failed a read it
    /// needed; closes the latch when the request was answered either way.
    fn finish(&mut self, vm: &Rc<VmShared>, host: &WasmHost, status: FilterStatus) -> Action {
        match (host.take_failure(), status) {
            (Some((what, why)), FilterStatus::Replied) => {
                *self = Latch::Closed;
                log(
                    LogLevel::Error,
                    &format!("the host failed to hand over the request's {what}: {why:?}"),
                );
                Action::Pause
            }
            (Some((what, why)), _) => {
                *self = Latch::Closed;
                fail_closed(
                    vm,
                    &format!("the host failed to hand over the request's {what}: {why:?}"),
                )
            }
            (None, FilterStatus::Replied) => {
                *self = Latch::Closed;
                Action::Pause
            }
            (None, status) => action(status),
        }
    }
}

/// The request pipeline every gateway filter of this module runs (its stages, chosen by the
/// plugin's role: the body router, or the picker).
pub type WasmPipeline = Pipeline<WasmHost>;

/// One request through its plugin's [`WasmPipeline`]: each callback goes to the run, and
/// its status becomes the [`Action`]. A stage that paused is woken through
/// [`HttpHooks::on_wake`] (from another context of this VM: the root that received the
/// picker state owner's answer, or a tick), and the stream is then resumed if the run says
/// so. The run ends at `on_log` (the stream completed or was reset) or, failing that,
/// when the context is dropped; everything the request holds (an in-flight lease) goes
/// with it.
pub struct PipelineContext {
    vm: Rc<VmShared>,
    pipeline: Rc<WasmPipeline>,
    run: Run,
    context_id: u32,
    body_len: usize,
    latch: Latch,
    mode: HeadersMode,
    /// The request headers, once they went on before the body (router, [`HeadersMode::Pass`]).
    passed: Option<Passed>,
}

/// What a filter does at the request headers when its stages wait for the body (module doc
/// of `crate::config`, `allowOnHeadersStopIteration`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadersMode {
    /// Stop there: Envoy still hands the body over (`allow_on_headers_stop_iteration`).
    Stop,
    /// Let the headers go (a buffer filter further on holds them), read the body, and leave
    /// the header edits in filter state for the `headers` role: the router.
    Pass,
    /// The body never comes while stopped: pick from the router's handoff alone, and
    /// answer 503 when none fits: the picker.
    HandoffOnly,
}

impl PipelineContext {
    /// A context for a new request (stream `context_id`) through `pipeline`.
    pub fn new(
        vm: Rc<VmShared>,
        pipeline: Rc<WasmPipeline>,
        context_id: u32,
        mode: HeadersMode,
    ) -> Self {
        PipelineContext {
            vm,
            pipeline,
            run: Run::new(),
            context_id,
            body_len: 0,
            latch: Latch::Open,
            mode,
            passed: None,
        }
    }

    fn host(&self) -> WasmHost {
        WasmHost::for_stream(&self.vm, self.context_id).with_passed_headers(self.passed.clone())
    }

    /// The stages wait for the body at the headers: what the mode makes of it.
    fn waiting_for_body(&mut self, host: &WasmHost) -> Action {
        match self.mode {
            HeadersMode::Stop => Action::Pause,
            HeadersMode::Pass => {
                let headers = hostcalls::header_map_pairs(MapType::HttpRequestHeaders)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            String::from_utf8_lossy(&k).into_owned(),
                            String::from_utf8_lossy(&v).into_owned(),
                        )
                    })
                    .collect();
                self.passed = Some(Rc::new(RefCell::new(PassedHeaders::new(headers))));
                Action::Continue
            }
            HeadersMode::HandoffOnly if host.waker_issued() => Action::Pause,
            HeadersMode::HandoffOnly => {
                self.latch = Latch::Closed;
                log(
                    LogLevel::Warn,
                    "infergate: picker: no handoff of the router fits this request's pool, \
                     and Envoy hands a filter that stops at the headers no body: answered \
                     503 (run the router before the picker, with the same instance)",
                );
                WasmHost::new(&self.vm).send_local_reply(&Reply::rejected(
                    REJECTED_NO_HANDOFF,
                    "the gateway's router did not hand this request over to the picker",
                ));
                Action::Pause
            }
        }
    }

    /// The body phase went on: hand the header edits made since the headers went on to
    /// the `headers` role.
    fn hand_over_header_edits(&self) {
        let Some(passed) = &self.passed else {
            return;
        };
        let Ok(passed) = passed.try_borrow() else {
            return;
        };
        if passed.edits().is_empty() {
            return;
        }
        match serde_json::to_vec(passed.edits()) {
            Ok(bytes) => {
                if let Err(status) = hostcalls::set_property(&[HEADER_EDITS_PROPERTY], &bytes) {
                    log(
                        LogLevel::Error,
                        &format!(
                            "infergate: router: handing the header edits on failed: {status:?}"
                        ),
                    );
                }
            }
            Err(e) => log(
                LogLevel::Error,
                &format!("infergate: router: header edits do not encode: {e}"),
            ),
        }
    }

    /// Run one request-side event unless the request was answered.
    fn request(
        &mut self,
        event: impl FnOnce(&mut Run, &WasmPipeline, &mut WasmHost) -> FilterStatus,
    ) -> Action {
        if self.latch == Latch::Closed {
            return Action::Pause;
        }
        let mut host = self.host();
        let status = event(&mut self.run, &self.pipeline, &mut host);
        self.latch.finish(&self.vm, &host, status)
    }

    fn body(&mut self, end_of_stream: bool) -> Action {
        let len = self.body_len;
        let action = self
            .request(|run, pipeline, host| run.request_body(pipeline, host, len, end_of_stream));
        if action == Action::Continue {
            self.hand_over_header_edits();
        }
        action
    }

    fn end(&mut self) {
        let mut host = self.host();
        self.run.end(&self.pipeline, &mut host);
    }
}

impl HttpHooks for PipelineContext {
    fn on_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        crate::test_stages::trap_if_owner_asked();
        if self.latch == Latch::Closed {
            return Action::Pause;
        }
        let mut host = self.host();
        let status = self
            .run
            .request_headers(&self.pipeline, &mut host, end_of_stream);
        let action = self.latch.finish(&self.vm, &host, status);
        if action == Action::Pause && self.latch == Latch::Open && !end_of_stream {
            return self.waiting_for_body(&host);
        }
        action
    }

    fn on_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_len = body_size;
        self.body(end_of_stream)
    }

    fn on_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.body(true)
    }

    fn on_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let mut host = self.host();
        self.run
            .response_headers(&self.pipeline, &mut host, end_of_stream);
        Action::Continue
    }

    fn on_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let mut host = self.host();
        host.set_chunk_len(body_size);
        self.run
            .response_chunk(&self.pipeline, &mut host, end_of_stream);
        Action::Continue
    }

    fn on_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.run.response_trailers();
        Action::Continue
    }

    fn on_log(&mut self) {
        self.end();
    }

    fn on_wake(&mut self) {
        if self.latch == Latch::Closed {
            return;
        }
        let mut host = self.host();
        let Some(status) = self.run.wake(&self.pipeline, &mut host) else {
            // Late or spurious: the stream stays as it is.
            return;
        };
        if self.latch.finish(&self.vm, &host, status) == Action::Continue {
            let _ = hostcalls::resume_http_request();
        }
    }
}

impl Drop for PipelineContext {
    fn drop(&mut self) {
        self.end();
    }
}

/// The `headers` role: applies the header edits the router made after the headers went
/// on (module doc of `crate::config`); Envoy resolves the route again on them.
pub struct HeadersContext;

impl HttpHooks for HeadersContext {
    fn on_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let edits = hostcalls::get_property(&[HEADER_EDITS_PROPERTY])
            .ok()
            .flatten()
            .and_then(|bytes| serde_json::from_slice::<Vec<HeaderEdit>>(&bytes).ok());
        if let Some(edits) = edits {
            apply_header_edits(&edits);
        }
        Action::Continue
    }
}

/// A request on a module that has no usable configuration: fail closed with 500.
pub struct FailClosedContext {
    vm: Rc<VmShared>,
}

impl FailClosedContext {
    /// A context that rejects its request.
    pub fn new(vm: Rc<VmShared>) -> Self {
        FailClosedContext { vm }
    }
}

impl HttpHooks for FailClosedContext {
    fn on_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        fail_closed(&self.vm, "gateway filter has no valid configuration")
    }
}
