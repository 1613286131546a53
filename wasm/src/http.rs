//! The HTTP contexts: thin wrappers that hand each proxy-wasm callback to a `filters/`
//! state machine and turn its [`FilterStatus`] into an [`Action`].
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

use std::cell::RefCell;
use std::rc::Rc;

use infergate_filters::host::LocalReply;
use infergate_filters::picker::{PickerRequest, PickerShared};
use infergate_filters::reply::Reply;
use infergate_filters::router::{Router, RouterRequest};
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
fn fail_closed(vm: &VmShared, why: &str) -> Action {
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
    fn finish(&mut self, vm: &VmShared, host: &WasmHost<'_>, status: FilterStatus) -> Action {
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

    /// Fail closed for `why` and stay closed.
    fn fail(&mut self, vm: &VmShared, why: &str) -> Action {
        *self = Latch::Closed;
        fail_closed(vm, why)
    }
}

/// The body router for one request.
pub struct RouterContext {
    vm: Rc<VmShared>,
    router: Rc<Router>,
    req: RouterRequest,
    body_len: usize,
    latch: Latch,
}

impl RouterContext {
    /// A context for a new request.
    pub fn new(vm: Rc<VmShared>, router: Rc<Router>) -> Self {
        RouterContext {
            vm,
            router,
            req: RouterRequest::new(),
            body_len: 0,
            latch: Latch::Open,
        }
    }

    /// The body so far (`end_of_stream`: complete) to the router.
    fn body(&mut self, end_of_stream: bool) -> Action {
        if self.latch == Latch::Closed {
            return Action::Pause;
        }
        let mut host = WasmHost::new(&self.vm);
        let status =
            self.req
                .on_request_body(&self.router, &mut host, self.body_len, end_of_stream);
        self.latch.finish(&self.vm, &host, status)
    }
}

impl HttpHooks for RouterContext {
    fn on_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.latch == Latch::Closed {
            return Action::Pause;
        }
        let mut host = WasmHost::new(&self.vm);
        let status = self
            .req
            .on_request_headers(&self.router, &mut host, end_of_stream);
        self.latch.finish(&self.vm, &host, status)
    }

    fn on_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_len = body_size;
        self.body(end_of_stream)
    }

    fn on_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.body(true)
    }
}

/// The picker for one request. Its in-flight lease goes back at `on_log` (the request
/// completed or was reset) or, failing that, when the context is dropped.
pub struct PickerContext {
    vm: Rc<VmShared>,
    shared: Rc<RefCell<PickerShared>>,
    req: PickerRequest,
    body_len: usize,
    latch: Latch,
}

impl PickerContext {
    /// A context for a new request.
    pub fn new(vm: Rc<VmShared>, shared: Rc<RefCell<PickerShared>>) -> Self {
        PickerContext {
            vm,
            shared,
            req: PickerRequest::new(),
            body_len: 0,
            latch: Latch::Open,
        }
    }

    fn body(&mut self, end_of_stream: bool) -> Action {
        if self.latch == Latch::Closed {
            return Action::Pause;
        }
        let Ok(mut shared) = self.shared.try_borrow_mut() else {
            return self
                .latch
                .fail(&self.vm, "picker state busy (re-entrant call)");
        };
        let mut host = WasmHost::new(&self.vm);
        let status =
            self.req
                .on_request_body(&mut *shared, &mut host, self.body_len, end_of_stream);
        self.latch.finish(&self.vm, &host, status)
    }

    fn end(&mut self) {
        if !self.req.holds_lease() {
            return;
        }
        match self.shared.try_borrow_mut() {
            Ok(mut shared) => self
                .req
                .on_end_counted(&mut *shared, &mut WasmHost::new(&self.vm)),
            Err(_) => log(
                LogLevel::Error,
                "picker state busy at request end: lease kept",
            ),
        }
    }
}

impl HttpHooks for PickerContext {
    fn on_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.latch == Latch::Closed {
            return Action::Pause;
        }
        let Ok(mut shared) = self.shared.try_borrow_mut() else {
            return self
                .latch
                .fail(&self.vm, "picker state busy (re-entrant call)");
        };
        let mut host = WasmHost::new(&self.vm);
        let status = self
            .req
            .on_request_headers(&mut *shared, &mut host, end_of_stream);
        self.latch.finish(&self.vm, &host, status)
    }

    fn on_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.body_len = body_size;
        self.body(end_of_stream)
    }

    fn on_request_trailers(&mut self, _num_trailers: usize) -> Action {
        self.body(true)
    }

    fn on_log(&mut self) {
        self.end();
    }
}

impl Drop for PickerContext {
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
