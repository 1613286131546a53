//! Which endpoints of a pool may be scheduled at `now`: the candidate rules shared by the
//! gateway's picker and by `infergate explain`, so both classify a pool the same way.
//!
//! Each endpoint of the pool is classified from its record in the last decoded metric
//! snapshot ([`SnapshotRecord`]) and the pool's [`CandidateRules`]:
//!
//! - [`EndpointClass::Dead`]: its last `max_consecutive_failures` scrapes failed (0 turns
//!   the rule off) → never a candidate;
//! - [`EndpointClass::Fresh`]: metrics present and scraped at most `stale_after_ms` ago
//!   (a `scraped_at` in the future counts as fresh) → candidate with its metrics;
//! - [`EndpointClass::Unknown`]: live, but no usable metrics (never scraped successfully,
//!   stale, or no snapshot decoded yet);
//! - [`EndpointClass::Unscraped`]: a snapshot exists but has no record of the endpoint at
//!   all (the scraper is not configured to scrape it); otherwise treated as unknown.
//!
//! Then [`select`] chooses the candidate set: some fresh → the fresh ones
//! ([`Selection::Fresh`]); none fresh and some live → with [`FailureMode::FailOpen`] the
//! live ones with unknown metrics ([`Selection::Degraded`], scored on in-proxy state only:
//! prefix index, in-flight load), with [`FailureMode::FailClose`] a rejection
//! ([`NoCandidates::Unscraped`] when every live endpoint is missing from the snapshot,
//! else [`NoCandidates::StaleMetrics`]); none live (every endpoint's scrapes keep failing:
//! the metrics are unavailable, not the endpoints) → with [`FailureMode::FailOpen`] every
//! member of the pool ([`Selection::EveryMember`], on in-proxy state only; Envoy's own
//! health and outlier state still apply), with [`FailureMode::FailClose`]
//! [`NoCandidates::NoLiveEndpoints`]; an empty pool is always
//! [`NoCandidates::NoLiveEndpoints`].
//! Only the pool's own endpoints are ever classified, so no rule can steer a request
//! outside its pool.
//!
//! [`pool_candidates`] runs both steps and builds the scheduler's [`Candidate`] list with
//! each candidate's index in the pool.

use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use super::Candidate;
use crate::latency::ObservedLatency;
use crate::metrics::EndpointMetrics;
use crate::snapshot::{EndpointSample, DEFAULT_MAX_AGE_MS};
use crate::types::{InFlight, Millis};

/// Consecutive failed scrapes that make an endpoint dead unless configured otherwise.
pub const DEFAULT_MAX_CONSECUTIVE_FAILURES: u32 = 3;

/// What to do when no endpoint of the pool has fresh metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureMode {
    /// Reject the request (the gateway answers 503). The default.
    #[default]
    FailClose,
    /// Schedule over the live endpoints by in-proxy state only (prefix index, in-flight).
    FailOpen,
}

/// A pool's thresholds for classifying its endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CandidateRules {
    /// A sample older than this (ms) has unknown metrics.
    pub stale_after_ms: u64,
    /// This many failed scrapes in a row make an endpoint dead (0: never dead).
    pub max_consecutive_failures: u32,
    /// What to do when no endpoint is fresh.
    pub failure_mode: FailureMode,
}

impl Default for CandidateRules {
    fn default() -> Self {
        CandidateRules {
            stale_after_ms: DEFAULT_MAX_AGE_MS,
            max_consecutive_failures: DEFAULT_MAX_CONSECUTIVE_FAILURES,
            failure_mode: FailureMode::FailClose,
        }
    }
}

/// What the last decoded snapshot says about one endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SnapshotRecord<'a> {
    /// No snapshot has been decoded yet.
    NoSnapshot,
    /// A snapshot exists but has no record of this endpoint.
    Missing,
    /// The endpoint's record.
    Present(&'a EndpointSample),
}

impl<'a> SnapshotRecord<'a> {
    /// The record of `address` in `endpoints` (a decoded snapshot's list).
    pub fn find(endpoints: &'a [EndpointSample], address: &str) -> SnapshotRecord<'a> {
        endpoints
            .iter()
            .find(|s| s.address == address)
            .map_or(SnapshotRecord::Missing, SnapshotRecord::Present)
    }
}

/// One endpoint's class at `now` (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EndpointClass<'a> {
    /// Too many failed scrapes in a row: never a candidate.
    Dead,
    /// Fresh metrics.
    Fresh(&'a EndpointMetrics),
    /// Live, metrics unknown or stale.
    Unknown,
    /// Live, absent from an existing snapshot.
    Unscraped,
}

impl EndpointClass<'_> {
    /// A short name for records and logs: `dead`, `fresh`, `unknown`, `unscraped`.
    pub fn label(&self) -> &'static str {
        match self {
            EndpointClass::Dead => "dead",
            EndpointClass::Fresh(_) => "fresh",
            EndpointClass::Unknown => "unknown",
            EndpointClass::Unscraped => "unscraped",
        }
    }

    /// Live but without usable metrics ([`EndpointClass::Unknown`] or
    /// [`EndpointClass::Unscraped`]).
    pub fn is_unknown(&self) -> bool {
        matches!(self, EndpointClass::Unknown | EndpointClass::Unscraped)
    }
}

/// Classify one endpoint from its snapshot record at `now`.
pub fn classify<'a>(
    record: SnapshotRecord<'a>,
    rules: &CandidateRules,
    now: Millis,
) -> EndpointClass<'a> {
    let sample = match record {
        SnapshotRecord::NoSnapshot => return EndpointClass::Unknown,
        SnapshotRecord::Missing => return EndpointClass::Unscraped,
        SnapshotRecord::Present(sample) => sample,
    };
    if rules.max_consecutive_failures > 0
        && sample.consecutive_failures >= rules.max_consecutive_failures
    {
        return EndpointClass::Dead;
    }
    match sample.fresh_metrics(now, rules.stale_after_ms) {
        Some(metrics) => EndpointClass::Fresh(metrics),
        None => EndpointClass::Unknown,
    }
}

/// Which classes make up the candidate set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// The endpoints with fresh metrics.
    Fresh,
    /// None is fresh and the pool fails open: the live endpoints, metrics unknown.
    Degraded,
    /// None is live (every endpoint's scrapes keep failing) and the pool fails open: every
    /// member, metrics unknown.
    EveryMember,
}

impl Selection {
    /// Whether an endpoint of `class` is a candidate under this selection.
    pub fn admits(self, class: &EndpointClass<'_>) -> bool {
        match self {
            Selection::Fresh => matches!(class, EndpointClass::Fresh(_)),
            Selection::Degraded => class.is_unknown(),
            Selection::EveryMember => true,
        }
    }
}

/// Why a pool has no candidate at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoCandidates {
    /// The pool is empty, or every endpoint is dead and the pool fails close.
    NoLiveEndpoints,
    /// No endpoint is fresh and the pool fails close.
    StaleMetrics,
    /// No endpoint is fresh, the pool fails close, and no live endpoint is in the
    /// snapshot at all.
    Unscraped,
}

/// Choose the candidate set from every endpoint's class (see the module doc).
pub fn select<'a>(
    classes: impl IntoIterator<Item = EndpointClass<'a>>,
    mode: FailureMode,
) -> Result<Selection, NoCandidates> {
    let mut unknown = 0usize;
    let mut unscraped = 0usize;
    let mut dead = 0usize;
    for class in classes {
        match class {
            EndpointClass::Fresh(_) => return Ok(Selection::Fresh),
            EndpointClass::Dead => dead += 1,
            EndpointClass::Unknown => unknown += 1,
            EndpointClass::Unscraped => unscraped += 1,
        }
    }
    if unknown + unscraped == 0 {
        return match mode {
            FailureMode::FailOpen if dead > 0 => Ok(Selection::EveryMember),
            _ => Err(NoCandidates::NoLiveEndpoints),
        };
    }
    match mode {
        FailureMode::FailOpen => Ok(Selection::Degraded),
        FailureMode::FailClose if unknown == 0 => Err(NoCandidates::Unscraped),
        FailureMode::FailClose => Err(NoCandidates::StaleMetrics),
    }
}

/// One endpoint of a pool as [`pool_candidates`] reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolEndpoint<'a> {
    /// `ip:port`.
    pub address: &'a str,
    /// Its record in the last decoded snapshot.
    pub record: SnapshotRecord<'a>,
    /// What this proxy has in flight to it.
    pub inflight: InFlight,
    /// The latency this proxy measured there, when its estimate counts.
    pub latency: Option<ObservedLatency>,
}

/// A pool's candidate set, ready for [`super::Scheduler::schedule`].
#[derive(Clone, Debug, PartialEq)]
pub struct PoolCandidates<'a> {
    /// Which classes were admitted.
    pub selection: Selection,
    /// The candidates, in pool order.
    pub candidates: Vec<Candidate<'a>>,
    /// Each candidate's index in the pool (parallel to `candidates`).
    pub pool_index: Vec<usize>,
}

/// Classify every endpoint, choose the set, and build the scheduler's candidates (fresh
/// ones with their metrics, degraded ones without). The endpoints are walked twice
/// (classifying is a few compares), so the only allocations are the two result lists.
pub fn pool_candidates<'a, I>(
    endpoints: I,
    rules: &CandidateRules,
    now: Millis,
) -> Result<PoolCandidates<'a>, NoCandidates>
where
    I: IntoIterator<Item = PoolEndpoint<'a>>,
    I::IntoIter: Clone,
{
    let endpoints = endpoints.into_iter();
    let selection = select(
        endpoints.clone().map(|e| classify(e.record, rules, now)),
        rules.failure_mode,
    )?;
    let (lower, _) = endpoints.size_hint();
    let mut candidates = Vec::with_capacity(lower);
    let mut pool_index = Vec::with_capacity(lower);
    for (i, endpoint) in endpoints.enumerate() {
        let class = classify(endpoint.record, rules, now);
        if !selection.admits(&class) {
            continue;
        }
        let metrics = match class {
            EndpointClass::Fresh(m) => Some(m),
            _ => None,
        };
        candidates.push(Candidate {
            address: endpoint.address,
            metrics,
            inflight: endpoint.inflight,
            // Roles are the pool's configuration; the host sets them (see `super::roles`).
            role: super::Role::Both,
            latency: endpoint.latency,
        });
        pool_index.push(i);
    }
    Ok(PoolCandidates {
        selection,
        candidates,
        pool_index,
    })
}
