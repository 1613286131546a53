//! How a request reaches the shared picker state.
//!
//! The pick stage ([`crate::stages::pick`]) never holds any lock across its slow work. It asks a
//! [`PickerAccess`] for the pool's immutable [`PoolPlan`] at headers time, parses the body
//! and hashes the prompt with that plan alone, and enters [`PickerAccess::with_state`] once
//! for the pick. The state locks what it touches itself (the pool picked from, briefly the
//! snapshot; see [`super::state`]), and the request's end gives its lease back without
//! entering the state at all ([`super::lease`]). So:
//!
//! - a Wasm VM (single-threaded) passes `&mut PickerShared` or `&PickerShared`: its locks
//!   are never contended;
//! - an Envoy process (all workers share one state) passes `&SharedPicker`: the plans are
//!   read without locking, only the pick runs under its pool's lock, and workers picking
//!   in different pools never wait for each other; one worker parsing a 128 KB body never
//!   stalls the others.

use std::sync::Arc;

use super::plan::{PickerPlans, PoolPlan};
use super::state::PickerShared;

/// Access to the picker's shared state (see the module doc).
pub trait PickerAccess {
    /// Run `f` with the state. Keep `f` short: the pick inside it holds its pool's lock.
    /// The state locks what it touches itself; `&mut` only lets a VM-local accessor pass
    /// its own handle.
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R;

    /// Run `f` with a shared reference to the state: what the pick needs (every method of
    /// the state takes `&self`). The default goes through [`PickerAccess::with_state`];
    /// a process-wide accessor answers without touching the state's handle, so workers
    /// share no written cache line outside the pool they pick in.
    fn with_shared<R>(&mut self, f: impl FnOnce(&PickerShared) -> R) -> R {
        self.with_state(|state| f(state))
    }

    /// The plan for a request routed to Envoy cluster `cluster` (when the host can tell)
    /// with base model `base_model` ([`PickerPlans::for_request`]). The default enters the
    /// state; accessors that keep the plans aside answer without it.
    fn plan_for(&mut self, cluster: Option<&str>, base_model: &str) -> Option<Arc<PoolPlan>> {
        self.with_state(|s| s.plans().for_request(cluster, base_model))
    }
}

impl PickerAccess for &mut PickerShared {
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R {
        f(self)
    }
}

impl PickerAccess for &PickerShared {
    /// Passes a clone of the handle (one reference count).
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R {
        f(&mut PickerShared::clone(self))
    }

    fn with_shared<R>(&mut self, f: impl FnOnce(&PickerShared) -> R) -> R {
        f(self)
    }
}

/// A picker state shared by threads: its plans, kept aside so a request reads them without
/// entering the state, and the state (which locks per pool).
#[derive(Debug)]
pub struct SharedPicker {
    plans: Arc<PickerPlans>,
    state: PickerShared,
}

impl SharedPicker {
    /// Share `state` between threads.
    pub fn new(state: PickerShared) -> SharedPicker {
        SharedPicker {
            plans: state.plans(),
            state,
        }
    }

    /// The state. There is no lock to take: each pool has its own, taken by the pick.
    pub fn state(&self) -> &PickerShared {
        &self.state
    }

    /// The state, as before pools had their own locks: kept so adapters written against
    /// the one-mutex state still read it (nothing is locked).
    pub fn lock(&self) -> &PickerShared {
        &self.state
    }

    /// The immutable per-pool plans.
    pub fn plans(&self) -> &PickerPlans {
        &self.plans
    }
}

impl PickerAccess for &SharedPicker {
    /// Passes a clone of the state's handle (one reference count): the pools lock
    /// themselves.
    fn with_state<R>(&mut self, f: impl FnOnce(&mut PickerShared) -> R) -> R {
        f(&mut self.state.clone())
    }

    fn with_shared<R>(&mut self, f: impl FnOnce(&PickerShared) -> R) -> R {
        f(&self.state)
    }

    fn plan_for(&mut self, cluster: Option<&str>, base_model: &str) -> Option<Arc<PoolPlan>> {
        self.plans.for_request(cluster, base_model)
    }
}
