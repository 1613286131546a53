//! Where a request queued in process memory waits for its verdict (the native flavour, and
//! the Wasm flavour's VM-local fallback state): the gate's item.

use std::sync::{Arc, Mutex, PoisonError};

use super::{DropReason, FlowTicket};
use crate::host::Waker;

/// How a queued request's wait ended.
#[derive(Debug)]
pub enum Verdict {
    /// Dispatched: pick for it, holding this ticket until it ends.
    Dispatched {
        /// Its share of the pool's load.
        ticket: FlowTicket,
        /// How long it waited.
        queued_ms: u64,
    },
    /// Left the queue unserved.
    Dropped {
        /// Why.
        reason: DropReason,
        /// How long it waited.
        queued_ms: u64,
    },
}

#[derive(Debug, Default)]
struct SlotState {
    waker: Option<Waker>,
    verdict: Option<Verdict>,
}

/// A queued request's mailbox: the dispatcher delivers the verdict and wakes the request.
#[derive(Debug, Default)]
pub struct QueueSlot {
    state: Mutex<SlotState>,
}

impl QueueSlot {
    /// An empty slot.
    pub fn new() -> Arc<QueueSlot> {
        Arc::default()
    }

    /// Wake `waker` when the verdict arrives. `false` if it is already in (the request
    /// goes on at once; the waker is dropped unused).
    pub fn wait(&self, waker: Waker) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.verdict.is_some() {
            return false;
        }
        state.waker = Some(waker);
        true
    }

    /// Deliver the verdict and wake the request (outside the slot's lock).
    pub fn deliver(&self, verdict: Verdict) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.verdict = Some(verdict);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Take the verdict, once it is in.
    pub fn take(&self) -> Option<Verdict> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .verdict
            .take()
    }
}
