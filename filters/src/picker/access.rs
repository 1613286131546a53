//! How a request reaches the shared picker state: the adapter chooses the locking.
//!
//! [`super::PickerRequest`] never holds the state across its slow work. It asks a
//! [`PickerAccess`] for the pool's immutable [`PoolPlan`] at headers time, parses the body
//! and hashes the prompt with that plan alone, and enters [`PickerAccess::with_state`] once
//! for the pick (and once more at the end, to give a lease back). So:
//!
//! - a Wasm VM (single-threaded) passes `&mut PickerShared` directly: no lock at all;
//! - an Envoy process (all workers share one state) passes `&SharedPicker`: the plans are
//!   read without locking and only the pick itself runs under the mutex, so one worker
//!   parsing a 128 KB body never stalls the others.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::plan::{PickerPlans, PoolPlan};
use super::state::PickerShared;

/// Access to the picker's shared state (see the module doc).
pub trait PickerAccess {
    /// Run `f` with exclusive access to the state. Keep `f` short: it is the critical
    /// section every worker contends for.
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R;

    /// The plan of the pool serving `base_model`. The default enters the state; accessors
    /// that keep the plans aside answer without it.
    fn plan_for(&mut self, base_model: &str) -> Option<Arc<PoolPlan>> {
        self.with_state(|s| s.pool_plan(base_model))
    }
}

impl PickerAccess for &mut PickerShared {
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R {
        f(self)
    }
}

/// A picker state shared by threads: its plans (read freely) and the state behind one
/// mutex.
#[derive(Debug)]
pub struct SharedPicker {
    plans: Arc<PickerPlans>,
    state: Mutex<PickerShared>,
}

impl SharedPicker {
    /// Share `state` between threads.
    pub fn new(state: PickerShared) -> SharedPicker {
        SharedPicker {
            plans: state.plans(),
            state: Mutex::new(state),
        }
    }

    /// Lock the state. A panic inside a pick leaves the state usable (every mutation is a
    /// whole-step update), so a poisoned lock is taken over rather than failing every later
    /// request.
    pub fn lock(&self) -> MutexGuard<'_, PickerShared> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The immutable per-pool plans.
    pub fn plans(&self) -> &PickerPlans {
        &self.plans
    }
}

impl PickerAccess for &SharedPicker {
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R {
        f(&mut self.lock())
    }

    fn plan_for(&mut self, base_model: &str) -> Option<Arc<PoolPlan>> {
        self.plans.for_base_model(base_model)
    }
}
