//! The endpoint picker: for a request the body router has tagged
//! with `x-gateway-base-model-name`, choose one endpoint of that model's pool and route
//! the request to it.
//!
//! This module is the picker's state, configuration and decisions; the pick stage
//! ([`crate::stages::pick`]) runs them for each request: it finds the pool, prepares the
//! request ([`PreparedPick`]: the prompt's blocks, the subset hint), picks through
//! `pick_counted` (which refreshes the snapshot and picks with
//! [`PickerShared::pick_within`]), routes to the ordered list `pick,fallback,...`, and at
//! the request's end gives the in-flight lease back.
//! The gauges `infergate.picker.inflight_requests.pool.<p>` and
//! `….pool.<p>.endpoint.<e>` move by +1 when a lease is taken and −1 when it is given back,
//! so they read 0 whenever no request is in flight, in both flavours (in Wasm every VM's
//! deltas add up in the one Envoy stat).
//!
//! **Locking.** The shared state is reached through a [`PickerAccess`], entered only for
//! the pick itself and to move a lease. Everything slow happens outside: the pool's
//! immutable [`PoolPlan`] is taken at headers time, the body is read, parsed and hashed
//! into prefix blocks with it ([`PreparedPick`]), and headers, replies and stats are written
//! after the state is released.

pub mod access;
pub mod admit;
pub mod config;
pub mod disagg;
pub mod lease;
pub mod peers;
pub mod plan;
mod pool;
pub mod prepare;
pub mod remote;
pub mod sessions;
pub mod state;
pub mod timing;

use crate::host::{
    Clock, DynamicMetadata, EditResponseHeaders, LocalReply, Random, ReadMetadata, RequestBody,
    RequestHeaders, ResetStream, ResponseHeaders, RoutedCluster, ServedUpstream, SnapshotSource,
    Stats, StreamState,
};
use scheduler_core::types::BlockHash;

pub use access::{PickerAccess, SharedPicker};
pub use config::{FailureMode, PickerConfig, PickerConfigError, PoolConfig};
pub use lease::InFlightLease;
pub use plan::{PickerPlans, PoolPlan, UnscrapedReport};
pub use prepare::PreparedPick;
pub use state::{
    PickRequest, Picked, PickerShared, PoolId, PreciseTarget, Rejection, SnapshotRefresh,
};

/// Everything the pick stage needs from the host.
pub trait PickerHost:
    RequestHeaders
    + RequestBody
    + LocalReply
    + ResetStream
    + SnapshotSource
    + Clock
    + Random
    + Stats
    + DynamicMetadata
    + ReadMetadata
    + RoutedCluster
    + ServedUpstream
    + EditResponseHeaders
    + ResponseHeaders
    + StreamState
{
}

impl<T> PickerHost for T where
    T: RequestHeaders
        + RequestBody
        + LocalReply
        + ResetStream
        + SnapshotSource
        + Clock
        + Random
        + Stats
        + DynamicMetadata
        + ReadMetadata
        + RoutedCluster
        + ServedUpstream
        + EditResponseHeaders
        + ResponseHeaders
        + StreamState
        + ?Sized
{
}

/// Where the response says the request went, when it was not the pick.
#[derive(Debug, PartialEq, Eq)]
pub struct ServedElsewhere {
    /// `ip:port` of the endpoint that served (the state that holds the lease checks that
    /// it is a current member of the pool).
    pub endpoint: String,
    /// The prompt's blocks, to record for it.
    pub block_hashes: Vec<BlockHash>,
    /// The request's session, to remember it there.
    pub session: Option<String>,
}

/// The part of a pick that needs the state, and its stats: refresh the snapshot, pick,
/// report endpoints the snapshot lacks, count the decision, and raise the in-flight gauges
/// for a lease taken. The picker's own requests and the Wasm flavour's state owner
/// ([`remote::Owner`]) both pick through here.
pub(crate) fn pick_counted<S: PickerAccess, H: SnapshotSource + Stats + ?Sized>(
    mut shared: S,
    host: &mut H,
    plan: &PoolPlan,
    prepared: &PreparedPick,
) -> Result<Picked, Rejection> {
    let req = prepared.request();
    let (refresh, outcome, reports, plans) = shared.with_shared(|state| {
        let refresh = state.refresh_snapshot(&*host);
        let outcome = state.pick_routed(
            plan,
            &req,
            prepared.subset(),
            prepared.from_peer(),
            prepared.now,
            prepared.random,
        );
        let reports = state.take_unscraped_reports();
        // Only when there is something to report: the plans' `Arc` costs an atomic.
        let plans = (!reports.is_empty()).then(|| state.plans());
        (refresh, outcome, reports, plans)
    });
    if refresh == SnapshotRefresh::Undecodable {
        plan.count_snapshot_error(host);
    }
    if let Some(plans) = plans {
        for report in &reports {
            if let Some(p) = plans.get(report.pool) {
                p.report_unscraped(report, host);
            }
        }
    }
    plan.count_decision(&outcome, host);
    let mut outcome = outcome;
    if let Ok(picked) = &mut outcome {
        picked.lease.raise_gauges(host);
    }
    outcome
}

#[cfg(test)]
mod tests;
