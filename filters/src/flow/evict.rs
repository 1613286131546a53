//! Evicting an admitted request (`enableEviction`): how the gate reaches a victim, and the
//! signal that stops it on its own worker.
//!
//! The gate keeps an [`Evictee`] for each admitted request of a sheddable band
//! ([`scheduler_core::flow::eviction`] decides which are chosen). Choosing one does not stop
//! it: the chooser hands the evictee to its host, which reaches the request where it runs.
//!
//! - **In this process's memory** ([`Evictee::Local`]: the native flavour): the request's
//!   [`EvictSignal`] is raised and its waker fired; the request's worker runs its pipeline's
//!   signal entry point, where the pick stage answers 429 `evicted-by-priority` if the
//!   response has not started, and resets the stream if it has.
//! - **At a Wasm worker** ([`Evictee::Remote`]): the state owner sends the holder an
//!   eviction message naming the lease; the worker's link raises the signal of the stream
//!   that holds that lease, and the stream acts the same way.

use std::sync::{Arc, Mutex, PoisonError};

use crate::host::Waker;

/// How the gate reaches an admitted request to evict it.
#[derive(Clone, Debug)]
pub enum Evictee {
    /// A request of this process's memory: raise its signal.
    Local(Arc<EvictSignal>),
    /// A Wasm worker's request at the state owner: tell the holder.
    Remote {
        /// The holder's reply queue.
        reply_queue: u32,
        /// The owner's lease id of the request.
        lease: u64,
    },
}

#[derive(Debug, Default)]
struct SignalState {
    raised: bool,
    waker: Option<Waker>,
}

/// The flag an evicted request is stopped by, and the waker that makes it look.
#[derive(Debug, Default)]
pub struct EvictSignal {
    state: Mutex<SignalState>,
}

impl EvictSignal {
    /// A signal not raised, with no waker yet.
    pub fn new() -> Arc<EvictSignal> {
        Arc::default()
    }

    /// Wake `waker` when the signal is raised. `false` if it already is (the request acts
    /// at once; the waker is dropped unused).
    pub fn arm(&self, waker: Waker) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.raised {
            return false;
        }
        state.waker = Some(waker);
        true
    }

    /// Raise the signal and wake the request (outside the lock).
    pub fn raise(&self) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.raised = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Whether the signal was raised.
    pub fn raised(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .raised
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(Arc<AtomicUsize>);

    impl crate::host::WakeSignal for Count {
        fn wake(self: Box<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn raising_wakes_an_armed_request_once() {
        let woken = Arc::new(AtomicUsize::new(0));
        let signal = EvictSignal::new();
        assert!(signal.arm(Waker::new(Count(Arc::clone(&woken)))));
        assert!(!signal.raised());
        signal.raise();
        signal.raise();
        assert!(signal.raised());
        assert_eq!(woken.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_signal_raised_before_it_is_armed_refuses_the_waker() {
        let woken = Arc::new(AtomicUsize::new(0));
        let signal = EvictSignal::new();
        signal.raise();
        assert!(!signal.arm(Waker::new(Count(Arc::clone(&woken)))));
        assert_eq!(woken.load(Ordering::SeqCst), 0);
    }
}
