//! The HTTP contexts: [`PipelineContext`] hands each proxy-wasm callback of a gateway
//! filter to its request pipeline (`filters::pipeline`) and turns the [`FilterStatus`] into
//! an [`Action`]; the others answer requests of a module without a usable configuration,
//! pass requests through the scraper's plugin, or run the `probe`.
//!
//! `Pause` from the request-headers callback needs the plugin's
//! `allow_on_headers_stop_iteration: true` in Envoy (else the body never arrives); `Pause`
//! from the body callback means "keep buffering".
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

use crate::abi::{hostcalls, Action, BufferType, HttpHooks, LogLevel};
use crate::host::{log, VmShared, WasmHost};

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
}

impl PipelineContext {
    /// A context for a new request (stream `context_id`) through `pipeline`.
    pub fn new(vm: Rc<VmShared>, pipeline: Rc<WasmPipeline>, context_id: u32) -> Self {
        PipelineContext {
            vm,
            pipeline,
            run: Run::new(),
            context_id,
            body_len: 0,
            latch: Latch::Open,
        }
    }

    fn host(&self) -> WasmHost {
        WasmHost::for_stream(&self.vm, self.context_id)
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
        self.request(|run, pipeline, host| run.request_body(pipeline, host, len, end_of_stream))
    }

    fn end(&mut self) {
        let mut host = self.host();
        self.run.end(&self.pipeline, &mut host);
    }
}

impl HttpHooks for PipelineContext {
    fn on_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.request(|run, pipeline, host| run.request_headers(pipeline, host, end_of_stream))
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

/// A request seen by a module configured as the scraper: not its business, pass through.
pub struct PassThroughContext;

impl HttpHooks for PassThroughContext {}

/// The `probe` role: holds the request until its body is complete, copies the body into the
/// VM, and lets it go on unchanged (see `config`); what any body-based filter costs at least.
#[derive(Default)]
pub struct ProbeContext {
    body_len: usize,
}

impl ProbeContext {
    fn read_body(body_size: usize) {
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size);
        // Whatever the host answered, the request goes on unchanged: the probe only reads.
        core::hint::black_box(&body);
    }
}

impl HttpHooks for ProbeContext {
    fn on_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_len = body_size;
        if !end_of_stream {
            return Action::Pause;
        }
        ProbeContext::read_body(body_size);
        Action::Continue
    }

    fn on_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // Trailers end the request: the buffered body is complete.
        ProbeContext::read_body(self.body_len);
        Action::Continue
    }
}
