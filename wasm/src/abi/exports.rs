//! The module's exports: initialisation, the allocator the host writes returned values
//! into, and the callbacks, dispatched to the live contexts.
//!
//! Contexts: Envoy creates a root context per plugin (`root_context_id == 0`), which is a
//! [`Root`], and an HTTP context per stream under its root, which the root builds
//! ([`Root::create_http_context`]). Both live in one per-VM table until
//! `proxy_on_delete`.
//!
//! Nothing here can panic on what the host sends: a callback for a context the table does
//! not hold is logged and answered with the safe default (a request's headers are failed
//! closed with 500: its filters never saw it); a callback that arrives while another one
//! runs (the table is borrowed) is refused the same way instead of aliasing state. Envoy
//! defers its own re-entrant deliveries (local replies, failed callouts) until the running
//! callback returns, so the refusal is a last resort, not a path requests take.
//!
//! Callbacks the module does not need (gRPC, foreign function events) are not exported:
//! Envoy then skips them instead of entering the VM. Nor is `proxy_on_done`: nothing here
//! finishes asynchronously, and a host that finds no such export takes every context as
//! done at once, which is what it would answer; that is one VM entry fewer per filter and
//! request. The response side is exported: the pipeline's stages observe (and may
//! rewrite) each response chunk as it passes. A local reply a filter sends runs the
//! response side too, but Envoy defers it until the running callback returns, so it never
//! re-enters the table.
//!
//! Wakes: a stage that paused a request is resumed when its waker fires; wakers of this
//! VM only record the stream ([`crate::host::take_woken`]), and every callback that may
//! wake one (a stream's, a root's, a stream's end and deletion), once its own work is
//! done, resumes the streams woken meanwhile ([`resume_woken`]).

use std::alloc::{alloc, Layout};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ptr::{null_mut, NonNull};

use infergate_filters::reply::Reply;

use super::{hostcalls, Action, HttpHooks, LogLevel};
use crate::host::take_woken;
use crate::root::Root;

/// The live contexts of this VM.
struct Contexts {
    roots: BTreeMap<u32, Root>,
    streams: BTreeMap<u32, Box<dyn HttpHooks>>,
}

thread_local! {
    static CONTEXTS: RefCell<Contexts> = const {
        RefCell::new(Contexts {
            roots: BTreeMap::new(),
            streams: BTreeMap::new(),
        })
    };
}

fn log(level: LogLevel, message: &str) {
    let _ = hostcalls::log(level, message);
}

/// Run `f` on the context table, or log and answer `refused` if it is in use.
fn with_contexts<R>(callback: &str, refused: R, f: impl FnOnce(&mut Contexts) -> R) -> R {
    let result = CONTEXTS.try_with(|cell| cell.try_borrow_mut().ok().map(|mut c| f(&mut c)));
    match result {
        Ok(Some(value)) => value,
        _ => {
            log(
                LogLevel::Error,
                &format!("infergate: {callback} arrived while another callback runs; refused"),
            );
            refused
        }
    }
}

/// Answer the current request 500: it reached no filter logic.
fn reject_request(why: &str) -> u32 {
    log(LogLevel::Error, &format!("infergate: {why}"));
    let reply = Reply::internal("internal error in the gateway filter");
    let headers: Vec<(&str, &str)> = reply
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let _ = hostcalls::send_local_response(u32::from(reply.status), &headers, &reply.body);
    Action::Pause as u32
}

#[cfg(target_os = "wasi")]
extern "C" {
    fn __wasm_call_ctors();
}

/// Module initialisation: static constructors, then a panic hook. No code path is meant
/// to panic; if one ever does, the hook leaves its message in Envoy's log before the VM
/// aborts.
#[no_mangle]
pub extern "C" fn _initialize() {
    #[cfg(target_os = "wasi")]
    // SAFETY: the linker-generated constructor runner, called once, before anything else.
    unsafe {
        __wasm_call_ctors();
    }
    std::panic::set_hook(Box::new(|info| {
        log(LogLevel::Critical, &format!("infergate: panic: {info}"));
    }));
}

/// The ABI version this module speaks.
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// A block of `size` bytes for the host to write a returned value into; null if memory is
/// exhausted. Adopted as a `Vec<u8>` by `hostcalls` (see its doc).
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    if size == 0 {
        // What an empty `Vec<u8>` holds; adopting it with capacity 0 frees nothing.
        return NonNull::<u8>::dangling().as_ptr();
    }
    match Layout::array::<u8>(size) {
        // SAFETY: a non-zero-sized layout.
        Ok(layout) => unsafe { alloc(layout) },
        Err(_) => null_mut(),
    }
}

/// A new root context (`root_context_id == 0`) or HTTP context of a root.
#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, root_context_id: u32) {
    with_contexts("proxy_on_context_create", (), |c| {
        if root_context_id == 0 {
            c.roots.insert(context_id, Root::new(context_id));
            return;
        }
        match c.roots.get_mut(&root_context_id) {
            Some(root) => {
                let stream = root.create_http_context(context_id);
                c.streams.insert(context_id, stream);
            }
            None => log(
                LogLevel::Error,
                &format!("infergate: context {context_id} of unknown root {root_context_id}"),
            ),
        }
    });
}

/// The VM started: nothing to do before configuration.
#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_root_context_id: u32, _vm_configuration_size: usize) -> u32 {
    1
}

/// The plugin configuration arrived; false refuses it (Envoy then rejects the plugin).
#[no_mangle]
pub extern "C" fn proxy_on_configure(root_context_id: u32, configuration_size: usize) -> u32 {
    with_contexts("proxy_on_configure", false, |c| {
        match c.roots.get_mut(&root_context_id) {
            Some(root) => root.on_configure(configuration_size),
            None => false,
        }
    })
    .into()
}

/// A tick of a root that set a tick period. A root that buffers its streams' counters and
/// gauges hands them to Envoy here, after the streams the tick resumed counted theirs, and
/// after each callout's answer (the scraper's), but not after a queue message: those come
/// once per request, to the state owner and to the worker it answers.
#[no_mangle]
pub extern "C" fn proxy_on_tick(root_context_id: u32) {
    with_contexts("proxy_on_tick", (), |c| {
        if let Some(root) = c.roots.get_mut(&root_context_id) {
            root.on_tick();
        }
        resume_woken(c);
        if let Some(root) = c.roots.get(&root_context_id) {
            root.flush_metrics();
        }
    });
}

/// Data arrived on a queue a root registered: the picker state owner answers the workers'
/// picks, a picker root takes the answers for its streams (and wakes them).
#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(root_context_id: u32, queue: u32) {
    with_contexts("proxy_on_queue_ready", (), |c| {
        if let Some(root) = c.roots.get_mut(&root_context_id) {
            root.on_queue_ready(queue);
        }
        resume_woken(c);
    });
}

/// Resume every stream whose waker fired during the callback that just ran, each made the
/// effective context first so its header edits, replies and resumption address it. A
/// stream that is gone is skipped (its wake is late).
fn resume_woken(c: &mut Contexts) {
    // A resumed stream may wake another (or itself again): bounded, in case of a loop.
    for _ in 0..4 {
        let woken = take_woken();
        if woken.is_empty() {
            return;
        }
        for context_id in woken {
            if let Some(stream) = c.streams.get_mut(&context_id) {
                let _ = hostcalls::set_effective_context(context_id);
                stream.on_wake();
            }
        }
    }
}

/// The answer (or failure: no headers) of an HTTP call the root context dispatched.
#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    context_id: u32,
    token: u32,
    num_headers: usize,
    body_size: usize,
    _num_trailers: usize,
) {
    with_contexts("proxy_on_http_call_response", (), |c| {
        match c.roots.get_mut(&context_id) {
            Some(root) => {
                root.on_http_call_response(token, num_headers, body_size);
                // A callout's answer comes once per scrape, not per request.
                root.flush_metrics();
            }
            None => log(
                LogLevel::Warn,
                &format!("infergate: HTTP call {token} answered to unknown context {context_id}"),
            ),
        }
    });
}

/// Run a stream callback; `missing` answers for a context the table does not hold.
fn on_stream(
    callback: &str,
    context_id: u32,
    missing: fn(&str) -> u32,
    f: impl FnOnce(&mut dyn HttpHooks) -> Action,
) -> u32 {
    let outcome = with_contexts(callback, None, |c| {
        let action = c
            .streams
            .get_mut(&context_id)
            .map(|stream| f(stream.as_mut()) as u32);
        resume_woken(c);
        action
    });
    match outcome {
        Some(action) => action,
        None => missing(&format!("{callback}: no context {context_id}")),
    }
}

/// Later callbacks of a stream that was failed closed at its headers: hold everything.
fn hold(_why: &str) -> u32 {
    Action::Pause as u32
}

/// `proxy_on_request_headers`.
#[no_mangle]
pub extern "C" fn proxy_on_request_headers(
    context_id: u32,
    num_headers: usize,
    end_of_stream: u32,
) -> u32 {
    on_stream(
        "proxy_on_request_headers",
        context_id,
        reject_request,
        |s| s.on_request_headers(num_headers, end_of_stream != 0),
    )
}

/// `proxy_on_request_body`.
#[no_mangle]
pub extern "C" fn proxy_on_request_body(
    context_id: u32,
    body_size: usize,
    end_of_stream: u32,
) -> u32 {
    on_stream("proxy_on_request_body", context_id, hold, |s| {
        s.on_request_body(body_size, end_of_stream != 0)
    })
}

/// `proxy_on_request_trailers`.
#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(context_id: u32, num_trailers: usize) -> u32 {
    on_stream("proxy_on_request_trailers", context_id, hold, |s| {
        s.on_request_trailers(num_trailers)
    })
}

/// `proxy_on_response_headers`.
#[no_mangle]
pub extern "C" fn proxy_on_response_headers(
    context_id: u32,
    num_headers: usize,
    end_of_stream: u32,
) -> u32 {
    on_stream("proxy_on_response_headers", context_id, pass, |s| {
        s.on_response_headers(num_headers, end_of_stream != 0)
    })
}

/// `proxy_on_response_body`: one chunk passing, unbuffered.
#[no_mangle]
pub extern "C" fn proxy_on_response_body(
    context_id: u32,
    body_size: usize,
    end_of_stream: u32,
) -> u32 {
    on_stream("proxy_on_response_body", context_id, pass, |s| {
        s.on_response_body(body_size, end_of_stream != 0)
    })
}

/// `proxy_on_response_trailers`.
#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(context_id: u32, num_trailers: usize) -> u32 {
    on_stream("proxy_on_response_trailers", context_id, pass, |s| {
        s.on_response_trailers(num_trailers)
    })
}

/// A response of a stream the table does not hold goes on unchanged.
fn pass(_why: &str) -> u32 {
    Action::Continue as u32
}

/// The stream completed or was reset.
#[no_mangle]
pub extern "C" fn proxy_on_log(context_id: u32) {
    with_contexts("proxy_on_log", (), |c| {
        if let Some(stream) = c.streams.get_mut(&context_id) {
            stream.on_log();
        }
        // A lease given back at the end may dispatch a queued request of this VM (the
        // owner runs here).
        resume_woken(c);
    });
}

/// Forget a context (its state drops here).
#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    // Dropped after the table is released, so a context's `Drop` runs outside the borrow.
    let removed = with_contexts("proxy_on_delete", (None, None), |c| {
        (c.streams.remove(&context_id), c.roots.remove(&context_id))
    });
    drop(removed);
    // The lease a dropped context gave back may have woken a queued stream of this VM.
    with_contexts("proxy_on_delete", (), resume_woken);
}
