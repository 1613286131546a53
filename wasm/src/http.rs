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

use infergate_filters::host::{Clock, LocalReply};
use infergate_filters::picker::{PickerRequest, PickerShared};
use infergate_filters::reply::Reply;
use infergate_filters::router::{Router, RouterRequest};
use infergate_filters::FilterStatus;

use crate::abi::{hostcalls, Action, BufferType, HttpHooks, LogLevel};
use crate::host::{log, VmShared, WasmHost};
use crate::owner::{Link, OwnerEvent, RemoteLease};
use infergate_filters::picker::remote::ToWorker;

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

/// The picker for one request.
///
/// With a link to the state owner (`crate::owner`), the request is prepared here and
/// picked by the owner: the context pauses until the answer, then routes and resumes, and
/// holds the owner's [`RemoteLease`] until the request ends. Without one, or when the owner
/// cannot be reached, it picks in the VM's own state and its in-flight lease goes back at
/// `on_log` (the request completed or was reset) or, failing that, when the context is
/// dropped.
pub struct PickerContext {
    vm: Rc<VmShared>,
    shared: Rc<RefCell<PickerShared>>,
    link: Option<Link>,
    context_id: u32,
    req: PickerRequest,
    body_len: usize,
    latch: Latch,
    /// The ticket of the pick waiting for the owner.
    waiting: Option<u64>,
    remote_lease: Option<RemoteLease>,
}

impl PickerContext {
    /// A context for a new request; `link` reaches the process's state owner.
    pub fn new(
        vm: Rc<VmShared>,
        shared: Rc<RefCell<PickerShared>>,
        link: Option<Link>,
        context_id: u32,
    ) -> Self {
        let req = if link.is_some() {
            PickerRequest::deferred()
        } else {
            PickerRequest::new()
        };
        PickerContext {
            vm,
            shared,
            link,
            context_id,
            req,
            body_len: 0,
            latch: Latch::Open,
            waiting: None,
            remote_lease: None,
        }
    }

    /// Run `f` on the request with this VM's state and a host, then send a pick the request
    /// left pending to the owner (or pick it here if the owner cannot take it).
    fn step(
        &mut self,
        f: impl FnOnce(&mut PickerRequest, &mut PickerShared, &mut WasmHost<'_>) -> FilterStatus,
    ) -> Action {
        if self.latch == Latch::Closed {
            return Action::Pause;
        }
        if self.waiting.is_some() {
            // Body data arriving while the owner decides: keep buffering it.
            return Action::Pause;
        }
        let Ok(mut shared) = self.shared.try_borrow_mut() else {
            return self
                .latch
                .fail(&self.vm, "picker state busy (re-entrant call)");
        };
        let mut host = WasmHost::new(&self.vm);
        let mut status = f(&mut self.req, &mut shared, &mut host);
        if let (Some((pool, prepared)), Some(link)) = (self.req.pending_pick(), &self.link) {
            let now = host.now().0;
            let submitted = match link.try_borrow_mut() {
                Ok(mut link) => {
                    let submitted = link.submit(self.context_id, pool, prepared, now);
                    if let Err(why) = &submitted {
                        link.fall_back(&self.vm, why);
                    }
                    submitted.ok()
                }
                Err(_) => None,
            };
            match submitted {
                Some(ticket) => self.waiting = Some(ticket),
                None => status = self.req.pick_here(&mut *shared, &mut host),
            }
        }
        self.latch.finish(&self.vm, &host, status)
    }

    fn body(&mut self, end_of_stream: bool) -> Action {
        let len = self.body_len;
        self.step(|req, shared, host| req.on_request_body(shared, host, len, end_of_stream))
    }

    /// Pick locally after all (the owner did not answer, or lost our state twice); resume.
    fn pick_here_and_resume(&mut self, why: &str) {
        if let Some(link) = &self.link {
            if let Ok(mut link) = link.try_borrow_mut() {
                link.fall_back(&self.vm, why);
            }
        }
        let status = match self.shared.try_borrow_mut() {
            Ok(mut shared) => {
                let mut host = WasmHost::new(&self.vm);
                let status = self.req.pick_here(&mut *shared, &mut host);
                self.latch.finish(&self.vm, &host, status)
            }
            Err(_) => self
                .latch
                .fail(&self.vm, "picker state busy (re-entrant call)"),
        };
        if status == Action::Continue {
            let _ = hostcalls::resume_http_request();
        }
    }

    fn end(&mut self) {
        if let (Some(ticket), Some(link)) = (self.waiting.take(), &self.link) {
            if let Ok(mut link) = link.try_borrow_mut() {
                link.forget(ticket);
            }
        }
        // Dropping the owner's lease sends its release.
        self.remote_lease = None;
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
        self.step(|req, shared, host| req.on_request_headers(shared, host, end_of_stream))
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

    fn on_owner_event(&mut self, event: OwnerEvent) -> Option<ToWorker> {
        let Some(ticket) = self.waiting else {
            return match event {
                OwnerEvent::Answer(answer) => Some(answer),
                OwnerEvent::TimedOut => None,
            };
        };
        let answer = match event {
            OwnerEvent::TimedOut => {
                self.waiting = None;
                self.pick_here_and_resume("the picker state owner did not answer in time");
                return None;
            }
            OwnerEvent::Answer(answer) => answer,
        };
        let mut host = WasmHost::new(&self.vm);
        let status = match &answer {
            ToWorker::UnknownState { .. } => {
                let resent = match (self.req.pending_pick(), &self.link) {
                    (Some((pool, prepared)), Some(link)) => link
                        .try_borrow_mut()
                        .is_ok_and(|mut link| link.resend(ticket, pool, prepared)),
                    _ => false,
                };
                if !resent {
                    self.waiting = None;
                    if let Some(link) = &self.link {
                        if let Ok(mut link) = link.try_borrow_mut() {
                            link.forget(ticket);
                        }
                    }
                    self.pick_here_and_resume("the picker state owner lost this worker's state");
                }
                return None;
            }
            ToWorker::Picked {
                lease, endpoint, ..
            } => {
                self.waiting = None;
                let Some(link) = &self.link else {
                    return Some(answer);
                };
                // Held from here on, so the request's end releases it whatever happens.
                self.remote_lease = Some(RemoteLease::new(*lease, Rc::clone(link)));
                self.req.on_answer(&mut host, Ok(endpoint))
            }
            ToWorker::Rejected { rejection, .. } => {
                self.waiting = None;
                self.req.on_answer(&mut host, Err(*rejection))
            }
        };
        // Not waiting after all: the lease (if any) is held and goes back at the end.
        let status = status?;
        if self.latch.finish(&self.vm, &host, status) == Action::Continue {
            let _ = hostcalls::resume_http_request();
        }
        None
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
