//! Waking a paused request from any thread: the stream's Envoy scheduler behind the
//! filters' [`Waker`].
//!
//! A stream that pauses takes a scheduler once (`http_filter_scheduler_new`, inside a hook
//! on its worker thread) and shares it, in an `Arc`, between itself and every waker it hands
//! out. A wake commits an event on it from whatever thread holds the waker; Envoy posts the
//! event to the stream's own worker, which runs `on_http_filter_scheduled` there, where the
//! pipeline resumes and decoding continues. A commit after the stream is gone does nothing
//! (Envoy's scheduler holds the stream weakly), so a waker may outlive its request. The
//! scheduler is deleted when the last holder drops it, whichever thread that is: deleting it
//! while another thread may still commit would be a use after free, which the `Arc` rules
//! out.

use std::sync::Arc;

use infergate_filters::host::{WakeSignal, Waker};

use crate::abi::callbacks as cb;
use crate::abi::HttpFilterSchedulerPtr;
use crate::host::EnvoyStream;

/// The event id every wake commits: a stream has one pause at a time, and the pipeline
/// treats a wake as "look again" (a late or repeated one changes nothing).
pub const WAKE_EVENT: u64 = 1;

/// A stream's scheduler, deleted with its last holder.
#[derive(Debug)]
pub struct Scheduler {
    raw: HttpFilterSchedulerPtr,
}

// SAFETY: Envoy's scheduler is made for other threads: `commit` posts to the stream's
// dispatcher (thread-safe), and `delete` frees an object that holds only a weak reference to
// the stream and a dispatcher reference, from any thread.
unsafe impl Send for Scheduler {}
// SAFETY: as above; `commit` takes the scheduler by pointer and is safe to call concurrently.
unsafe impl Sync for Scheduler {}

impl Scheduler {
    /// The scheduler of `envoy`'s stream (inside a hook, on its worker); `None` if Envoy
    /// gave none.
    pub fn new(envoy: &mut EnvoyStream) -> Option<Arc<Scheduler>> {
        let raw = envoy.new_scheduler();
        (!raw.is_null()).then(|| Arc::new(Scheduler { raw }))
    }

    /// Ask Envoy to run `on_http_filter_scheduled(event)` on the stream's worker.
    pub fn commit(&self, event: u64) {
        // SAFETY: `raw` came from `http_filter_scheduler_new` and is deleted only in `Drop`,
        // after every holder (this one included) is gone.
        unsafe { cb::envoy_dynamic_module_callback_http_filter_scheduler_commit(self.raw, event) }
    }

    /// A waker that commits [`WAKE_EVENT`] on this scheduler.
    pub fn waker(self: &Arc<Scheduler>) -> Waker {
        Waker::new(SchedulerWake(Arc::clone(self)))
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // SAFETY: the last holder is going: nobody can commit on `raw` any more.
        unsafe { cb::envoy_dynamic_module_callback_http_filter_scheduler_delete(self.raw) }
    }
}

/// A wake through a stream's scheduler.
struct SchedulerWake(Arc<Scheduler>);

impl WakeSignal for SchedulerWake {
    fn wake(self: Box<Self>) {
        self.0.commit(WAKE_EVENT);
    }
}
