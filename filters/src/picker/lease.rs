//! In-flight accounting that cannot leak or double count.
//!
//! A successful pick adds one request (and its estimated tokens) to the endpoint's
//! in-flight load and hands back an [`InFlightLease`]. The lease is not `Clone`; giving it
//! back ([`super::PickerShared::release`]) consumes it, so one pick is released at most
//! once by construction. The request keeps it in an `Option` and `take`s it on the first
//! end event (complete, reset or context drop), so it is released at least once as long
//! as the adapter reports any end event — adapters call `on_end_counted` from both their
//! end-of-stream hook and their context destructor (it also lowers the in-flight gauges
//! the pick raised).

use scheduler_core::types::Tokens;

/// Proof that one request is counted in an endpoint's in-flight load.
#[must_use = "a dropped lease leaks in-flight load: give it back with PickerShared::release"]
#[derive(Debug, PartialEq, Eq)]
pub struct InFlightLease {
    /// Identity of the [`super::PickerShared`] that issued it (a reconfigured state must
    /// not take back leases of its predecessor).
    pub(crate) issuer: u64,
    /// Pool index in the issuer.
    pub(crate) pool: usize,
    /// Endpoint index in the pool.
    pub(crate) endpoint: usize,
    /// Tokens added with the request.
    pub(crate) tokens: Tokens,
}

impl InFlightLease {
    /// The endpoint index (in its pool's list) this lease counts against.
    pub fn endpoint_index(&self) -> usize {
        self.endpoint
    }
}
