//! The picker's shared state: one per Wasm VM or one per Envoy process (behind the
//! adapter's lock). Per pool it holds the compiled scheduler, the prefix index, the
//! in-flight load per endpoint and the session table; for all pools, the last decoded
//! metric snapshot. Its immutable part, the [`PickerPlans`], is handed out by `Arc` so the
//! request path can do its slow work (body parse, prefix hashing, stats) before and after
//! the lock: [`PickerShared::pick`] takes finished block hashes and reports no stats.
//!
//! Candidate rules, per endpoint of the pool, at `now`:
//! - *dead*: its last `maxConsecutiveFailures` scrapes failed → never a candidate;
//! - *fresh*: metrics present and scraped at most `staleAfterMs` ago → candidate with
//!   metrics;
//! - otherwise *unknown*.
//!
//! Some fresh → schedule over the fresh ones. None fresh: `FailClose` → reject (503),
//! `FailOpen` → schedule over the live (not dead) ones with unknown metrics, which the
//! core scores on in-proxy state only (prefix index, in-flight load). Only the pool's own
//! endpoints are ever candidates, so no request can be steered outside the pool.
//!
//! **Endpoints the scraper does not know.** The picker and the scraper are configured
//! separately (in Wasm they even run in different VMs), so a pool may list an endpoint the
//! scraper's `endpoints` lack: it would stay "unknown" forever. Each decoded snapshot is
//! compared with every pool's list; when the set of missing endpoints changes (the first
//! snapshot included), an [`UnscrapedReport`] is queued for the request path to turn into
//! the gauge `infergate.picker.unscraped_endpoints` and an error log line naming both
//! fields. A `FailClose` pool whose every live endpoint is missing from the snapshot
//! answers [`Rejection::Unscraped`] (503 `rejected-no-endpoints`, saying why) rather than
//! "stale metrics".

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use scheduler_core::scheduling::{Candidate, RequestView};
use scheduler_core::snapshot::SnapshotCache;
use scheduler_core::types::{BlockHash, InFlight, Millis, Tokens};

use super::config::{FailureMode, PickerConfig, PickerConfigError};
use super::lease::InFlightLease;
use super::plan::{PickerPlans, PoolPlan, UnscrapedReport};
use super::pool::PoolState;
use crate::host::{SnapshotFetch, SnapshotSource, SnapshotVersion};

/// Distinguishes [`PickerShared`] instances so a lease is only taken back by its issuer.
static NEXT_ISSUER: AtomicU64 = AtomicU64::new(1);

/// Index of a pool in [`PickerShared`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolId(pub usize);

/// What the picker needs from a parsed request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickRequest<'a> {
    /// The `model` the client asked for (an adapter or the base model).
    pub target_model: &'a str,
    /// The prompt's chained block hashes ([`PoolPlan::block_hashes`], computed before the
    /// state is locked).
    pub block_hashes: &'a [BlockHash],
    /// Estimated prompt tokens.
    pub prompt_tokens: Tokens,
    /// Requested output cap, if any (added to the in-flight token estimate).
    pub max_output_tokens: Option<u64>,
    /// The session id, if the pool has a session header and the request carries it.
    pub session: Option<&'a str>,
}

/// A successful pick.
#[derive(Debug, PartialEq, Eq)]
pub struct Picked {
    /// `ip:port` of the chosen endpoint.
    pub endpoint: String,
    /// The in-flight accounting to give back at the end of the request.
    pub lease: InFlightLease,
    /// Leading prompt blocks the endpoint already held.
    pub matched_blocks: usize,
    /// The prompt's full blocks considered.
    pub total_blocks: usize,
    /// Picked among endpoints with unknown metrics (`FailOpen` with none fresh).
    pub degraded: bool,
}

/// What [`PickerShared::refresh_snapshot`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotRefresh {
    /// No snapshot published, or the same version as last time.
    Unchanged,
    /// A new version was decoded (or carried no new data).
    Updated,
    /// A new version did not decode; the previous snapshot stays in use.
    Undecodable,
}

/// Why no endpoint was picked (all answered 503 `rejected-no-endpoints`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The pool is empty, every endpoint is dead, or the filters dropped every candidate.
    NoEndpoints,
    /// Metrics are stale or missing and the pool is `FailClose`.
    StaleMetrics,
    /// The pool is `FailClose` and a snapshot exists, but none of the pool's live
    /// endpoints is in it: the scraper is not configured to scrape them.
    Unscraped,
}

impl Rejection {
    /// The stat label of this reason.
    pub fn label(self) -> &'static str {
        match self {
            Rejection::NoEndpoints => "no_endpoints",
            Rejection::StaleMetrics => "stale_metrics",
            Rejection::Unscraped => "unscraped_endpoints",
        }
    }

    /// The message of the 503 this rejection answers.
    pub fn message(self) -> &'static str {
        match self {
            Rejection::NoEndpoints => "no endpoint of the pool can take this request",
            Rejection::StaleMetrics => "the pool's metrics are stale or missing",
            Rejection::Unscraped => {
                "no endpoint of the pool is scraped: the scraper's `endpoints` do not list \
                 the pool's endpoints"
            }
        }
    }
}

/// The picker's shared state (see the module doc).
#[derive(Debug)]
pub struct PickerShared {
    issuer: u64,
    plans: Arc<PickerPlans>,
    pools: Vec<PoolState>,
    snapshot: SnapshotCache,
    version: Option<SnapshotVersion>,
    /// Whether a snapshot was ever decoded (before that, no endpoint can be "unscraped").
    decoded_once: bool,
    /// Reports made by the last snapshot change, waiting for a host to emit them.
    unscraped_reports: Vec<UnscrapedReport>,
}

impl PickerShared {
    /// Build from a validated configuration.
    pub fn new(config: &PickerConfig) -> Result<PickerShared, PickerConfigError> {
        config.validate()?;
        let pools = config
            .pools
            .iter()
            .map(PoolState::new)
            .collect::<Result<Vec<_>, _>>()?;
        let issuer = NEXT_ISSUER.fetch_add(1, Ordering::Relaxed);
        let plans = config
            .pools
            .iter()
            .zip(&pools)
            .enumerate()
            .map(|(i, (cfg, state))| {
                Arc::new(PoolPlan::new(issuer, PoolId(i), cfg, &state.scheduler))
            })
            .collect();
        Ok(PickerShared {
            issuer,
            plans: Arc::new(PickerPlans::new(plans)),
            pools,
            snapshot: SnapshotCache::default(),
            version: None,
            decoded_once: false,
            unscraped_reports: Vec::new(),
        })
    }

    /// Parse, validate and build from JSON (the plugin config minus `role`).
    pub fn from_json(value: serde_json::Value) -> Result<PickerShared, PickerConfigError> {
        PickerShared::new(&PickerConfig::from_json(value)?)
    }

    /// The immutable per-pool plans; they never change for this state, so callers may
    /// keep them and read them without the state's lock.
    pub fn plans(&self) -> Arc<PickerPlans> {
        Arc::clone(&self.plans)
    }

    /// The plan of the pool serving `base_model`.
    pub fn pool_plan(&self, base_model: &str) -> Option<Arc<PoolPlan>> {
        self.plans.for_base_model(base_model)
    }

    /// The pool serving `base_model`.
    pub fn pool_for_base_model(&self, base_model: &str) -> Option<PoolId> {
        self.plans.for_base_model(base_model).map(|p| p.id())
    }

    /// The session header of `pool`, lower-case, if configured.
    pub fn session_header(&self, pool: PoolId) -> Option<&str> {
        self.plans.get(pool).and_then(|p| p.session_header())
    }

    /// Read the newest snapshot from the host; decode it only if it changed.
    pub fn refresh_snapshot<H: SnapshotSource + ?Sized>(&mut self, host: &H) -> SnapshotRefresh {
        let (version, bytes) = match host.snapshot_if_changed(self.version) {
            SnapshotFetch::Missing | SnapshotFetch::Unchanged => return SnapshotRefresh::Unchanged,
            SnapshotFetch::Changed { version, bytes } => (version, bytes),
        };
        self.version = Some(version);
        match self.snapshot.update(&bytes) {
            Ok(true) => {
                self.reindex();
                SnapshotRefresh::Updated
            }
            Ok(false) => SnapshotRefresh::Updated,
            Err(_) => SnapshotRefresh::Undecodable,
        }
    }

    /// The reports of pool endpoints missing from the snapshot made since the last call
    /// (see the module doc); the caller emits them with [`PoolPlan::report_unscraped`]
    /// after leaving the state.
    pub fn take_unscraped_reports(&mut self) -> Vec<UnscrapedReport> {
        core::mem::take(&mut self.unscraped_reports)
    }

    /// Map each pool endpoint to its snapshot record and apply LRU capacities; queue a
    /// report for each pool whose set of endpoints missing from the snapshot changed.
    fn reindex(&mut self) {
        let first = !self.decoded_once;
        self.decoded_once = true;
        let samples = &self.snapshot.snapshot().endpoints;
        for (p, pool) in self.pools.iter_mut().enumerate() {
            let before = pool.sample_of.clone();
            for (i, address) in pool.endpoints.iter().enumerate() {
                let found = samples.iter().position(|s| &s.address == address);
                if let Some(slot) = pool.sample_of.get_mut(i) {
                    *slot = found;
                }
                let metrics = found
                    .and_then(|f| samples.get(f))
                    .and_then(|s| s.metrics.as_ref());
                let cap = pool.scheduler.lru_capacity_for(metrics);
                if let Some(applied) = pool.capacity.get_mut(i) {
                    if *applied != Some(cap) {
                        pool.prefix.set_capacity(address, cap);
                        *applied = Some(cap);
                    }
                }
            }
            let missing = |of: &[Option<usize>]| -> Vec<usize> {
                (0..of.len())
                    .filter(|i| of.get(*i) == Some(&None))
                    .collect()
            };
            let now_missing = missing(&pool.sample_of);
            if first || now_missing != missing(&before) {
                self.unscraped_reports.push(UnscrapedReport {
                    pool: PoolId(p),
                    endpoints: now_missing
                        .iter()
                        .filter_map(|i| pool.endpoints.get(*i).cloned())
                        .collect(),
                });
            }
        }
    }

    /// Pick an endpoint of `plan`'s pool for `req`; on success the endpoint's in-flight
    /// load includes the request until the returned lease is released. The caller reports
    /// the outcome with [`PoolPlan::count_decision`] (after unlocking). A plan of another
    /// state is refused as `NoEndpoints`.
    pub fn pick(
        &mut self,
        plan: &PoolPlan,
        req: &PickRequest<'_>,
        now: Millis,
        random: u64,
    ) -> Result<Picked, Rejection> {
        let issuer = self.issuer;
        if plan.issuer != issuer {
            return Err(Rejection::NoEndpoints);
        }
        let pool = plan.id;
        let samples = &self.snapshot.snapshot().endpoints;
        let Some(state) = self.pools.get_mut(pool.0) else {
            return Err(Rejection::NoEndpoints);
        };

        // Classify endpoints: fresh (with metrics), live-unknown, dead.
        let mut fresh: Vec<Candidate<'_>> = Vec::with_capacity(state.endpoints.len());
        let mut fresh_idx: Vec<usize> = Vec::with_capacity(state.endpoints.len());
        let mut unknown: Vec<Candidate<'_>> = Vec::new();
        let mut unknown_idx: Vec<usize> = Vec::new();
        // Live endpoints with no record at all in a decoded snapshot.
        let mut unscraped = 0usize;
        for (i, address) in state.endpoints.iter().enumerate() {
            let sample = state
                .sample_of
                .get(i)
                .copied()
                .flatten()
                .and_then(|s| samples.get(s));
            let dead = sample.is_some_and(|s| {
                state.max_consecutive_failures > 0
                    && s.consecutive_failures >= state.max_consecutive_failures
            });
            if dead {
                continue;
            }
            let inflight = state.inflight.get(i).copied().unwrap_or_default();
            match sample.and_then(|s| s.fresh_metrics(now, state.stale_after_ms)) {
                Some(metrics) => {
                    fresh.push(Candidate {
                        address,
                        metrics: Some(metrics),
                        inflight,
                    });
                    fresh_idx.push(i);
                }
                None => {
                    if sample.is_none() && self.decoded_once {
                        unscraped += 1;
                    }
                    unknown.push(Candidate {
                        address,
                        metrics: None,
                        inflight,
                    });
                    unknown_idx.push(i);
                }
            }
        }
        let degraded = fresh.is_empty();
        let (candidates, index) = if !degraded {
            (fresh, fresh_idx)
        } else if unknown.is_empty() {
            return Err(Rejection::NoEndpoints);
        } else if state.failure_mode == FailureMode::FailClose {
            if unscraped == unknown.len() {
                return Err(Rejection::Unscraped);
            }
            return Err(Rejection::StaleMetrics);
        } else {
            (unknown, unknown_idx)
        };

        let hashes = req.block_hashes;
        let session_endpoint = req
            .session
            .and_then(|s| state.sessions.get(s))
            .and_then(|i| state.endpoints.get(i))
            .map(String::as_str);
        let view = RequestView {
            target_model: req.target_model,
            base_model: &plan.base_model,
            block_hashes: hashes,
            prompt_tokens: req.prompt_tokens,
            last_endpoint_for_session: session_endpoint,
        };
        let decision = state
            .scheduler
            .schedule(&view, &candidates, &state.prefix, random, now);
        let outcome = decision.picked().and_then(|c| {
            let endpoint = index.get(c).copied()?;
            Some((endpoint, decision.prefix_matched(c), decision.full_blocks()))
        });
        drop(decision);
        drop(candidates);
        let Some((endpoint, matched, total)) = outcome else {
            return Err(Rejection::NoEndpoints);
        };
        let Some(address) = state.endpoints.get(endpoint).cloned() else {
            return Err(Rejection::NoEndpoints);
        };

        // Record: prefix blocks, in-flight load, session.
        if !hashes.is_empty() {
            state.prefix.record(&address, hashes);
        }
        let tokens = Tokens(
            req.prompt_tokens
                .0
                .saturating_add(req.max_output_tokens.unwrap_or(0)),
        );
        if let Some(load) = state.inflight.get_mut(endpoint) {
            load.requests = load.requests.saturating_add(1);
            load.tokens = Tokens(load.tokens.0.saturating_add(tokens.0));
        }
        if let Some(session) = req.session {
            state.sessions.record(session, endpoint);
        }
        state.matched_blocks = state.matched_blocks.saturating_add(matched as u64);
        state.total_blocks = state.total_blocks.saturating_add(total as u64);
        Ok(Picked {
            endpoint: address,
            lease: InFlightLease {
                issuer,
                pool: pool.0,
                endpoint,
                tokens,
            },
            matched_blocks: matched,
            total_blocks: total,
            degraded,
        })
    }

    /// Give back a lease: the endpoint's in-flight load drops by the request. A lease of
    /// another (earlier) state is ignored: its counts died with that state.
    pub fn release(&mut self, lease: InFlightLease) {
        if lease.issuer != self.issuer {
            return;
        }
        let load = self
            .pools
            .get_mut(lease.pool)
            .and_then(|p| p.inflight.get_mut(lease.endpoint));
        if let Some(load) = load {
            load.requests = load.requests.saturating_sub(1);
            load.tokens = Tokens(load.tokens.0.saturating_sub(lease.tokens.0));
        }
    }

    /// In-flight load of endpoint `address` in `pool`.
    pub fn inflight(&self, pool: PoolId, address: &str) -> Option<InFlight> {
        let p = self.pools.get(pool.0)?;
        let i = p.endpoints.iter().position(|e| e == address)?;
        p.inflight.get(i).copied()
    }

    /// Matched ÷ total prompt blocks over every pick of `pool` so far (0 before any).
    pub fn prefix_hit_ratio(&self, pool: PoolId) -> f64 {
        self.pools.get(pool.0).map_or(0.0, |p| {
            if p.total_blocks == 0 {
                0.0
            } else {
                p.matched_blocks as f64 / p.total_blocks as f64
            }
        })
    }

    /// The pool's name.
    pub fn pool_name(&self, pool: PoolId) -> Option<&str> {
        self.plans.get(pool).map(|p| p.name())
    }

    /// Sessions remembered by `pool`.
    pub fn sessions(&self, pool: PoolId) -> usize {
        self.pools.get(pool.0).map_or(0, |p| p.sessions.len())
    }
}
