//! The picker's shared state: one per Envoy process (native: shared by every worker; Wasm:
//! owned by the singleton service VM, [`super::remote`], with a VM-local one kept as the
//! fallback when the owner cannot be reached). It is a list of
//! pools, each with its own lock (`picker::pool`), and the last decoded metric snapshot
//! behind a lock of its own (`state::snapshot`); there is no lock across pools, so picks in
//! different pools never wait for each other. Its immutable part, the [`PickerPlans`], is
//! handed out by `Arc` so the request path does its slow work (body parse, prefix hashing,
//! stats) before and after any lock: [`PickerShared::pick`] takes finished block hashes and
//! reports no stats. Every method takes `&self`, so one state serves every thread, and a
//! [`PickerShared`] is a handle (clones share the state).
//!
//! Candidate rules (dead, fresh, unknown; fail open or close) are the core's
//! ([`scheduler_core::scheduling::candidates`]), applied here to the pool's endpoints and
//! their records in the snapshot at the request's `now`: the same functions `explain`
//! runs. Only the pool's own endpoints are ever candidates, so no request can be steered
//! outside the pool.
//!
//! **Membership.** A pool without static `endpoints` follows its Envoy cluster: when it
//! first sees a new snapshot generation, it takes the cluster's members and their health
//! from the snapshot (`members`): a new member gets an endpoint slot, a removed one stops
//! being a candidate at once and its prefix-index entries, sessions and adapter memory are
//! dropped while its leases end normally, and a slot is reused only once idle. A static
//! pool takes only the health of its endpoints from its cluster, if the snapshot carries
//! it. Unhealthy members are never candidates, so never a pick or a fallback; the gauge
//! `infergate.picker.pool_members` counts the members.
//!
//! **Endpoints the scraper does not know.** The picker and the scraper are configured
//! separately (in Wasm they even run in different VMs), so a pool may list an endpoint the
//! scraper's `endpoints` lack: it would stay "unknown" forever. When a pool first sees a
//! snapshot generation (at the refresh that decoded it, or at its next pick if its lock
//! was busy then), its endpoints are compared with the snapshot; when the set of missing
//! endpoints changes (the first snapshot included), an [`UnscrapedReport`] is queued for
//! the request path to turn into the gauge `infergate.picker.unscraped_endpoints` and an
//! error log line naming both fields. A `FailClose` pool whose every live endpoint is
//! missing from the snapshot answers [`Rejection::Unscraped`] (503
//! `rejected-no-endpoints`, saying why) rather than "stale metrics".
//!
//! **LoRA adapters.** vLLM's scrape lists only the adapters with running requests, so a
//! pool remembers per endpoint the adapters it sent there (`state::lora`): a pick of an adapter
//! scores the candidates with scraped LoRA state on copies of their metrics whose running
//! list adds the adapters in flight there and the most recent ones sent (at most the
//! endpoint's slots), so an idle adapter still loaded keeps its requests. A base-model pick
//! neither reads nor writes that memory.
//!
//! **Lock order.** A pool's lock, then the snapshot's or the report queue's; never two
//! pools at once (a refresh that finds a pool locked leaves its view to that pool's next
//! pick). A lease is given back without any lock ([`super::lease`]).

pub(super) mod lora;
mod members;
mod peers;
mod pick;
mod snapshot;
mod view;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use scheduler_core::flow::saturation::all_saturated;
use scheduler_core::flow::Detector;

use crate::precise::PreciseShared;
use scheduler_core::latency::ObservedLatency;
use scheduler_core::scheduling::candidates::NoCandidates;
use scheduler_core::snapshot::Snapshot;
use scheduler_core::types::{BlockHash, InFlight, Millis, Tokens};

use self::snapshot::SnapshotSlot;
use self::view::reindex;
use super::admit::{FlowPlan, Priorities};
use super::config::{PickerConfig, PickerConfigError};
use super::lease::InFlightLease;
use super::plan::{PickerPlans, PoolPlan, UnscrapedReport};
use super::pool::{compile, Pool, PoolState};
use crate::host::SnapshotSource;

/// Distinguishes [`PickerShared`] instances so a plan is only used with its own state.
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
    /// Requested output cap, if any (added to the in-flight token estimate once per output
    /// sequence).
    pub max_output_tokens: Option<u64>,
    /// How many sequences the engine may generate (`n`, `best_of`, the prompts of a batch;
    /// at least 1): the in-flight token estimate counts the output cap that many times.
    pub output_sequences: u32,
    /// The session id, if the pool has a session header and the request carries it.
    pub session: Option<&'a str>,
}

impl PickRequest<'_> {
    /// The output this request may generate: `output_sequences` × the output cap, else ×
    /// `default` per sequence (saturating).
    pub fn output_estimate(&self, default: u64) -> u64 {
        self.max_output_tokens
            .unwrap_or(default)
            .saturating_mul(u64::from(self.output_sequences.max(1)))
    }

    /// The request's in-flight token estimate: its prompt plus every sequence's output cap
    /// (an uncapped request counts its prompt only).
    pub fn inflight_tokens(&self) -> Tokens {
        Tokens(self.prompt_tokens.0.saturating_add(self.output_estimate(0)))
    }
}

/// A successful pick.
#[derive(Debug, PartialEq, Eq)]
pub struct Picked {
    /// `ip:port` of the chosen endpoint.
    pub endpoint: String,
    /// The pool endpoints to try next, in order, if the chosen one fails before answering
    /// (at most the pool's `fallbacks`).
    pub fallbacks: Vec<String>,
    /// The endpoint that prefills the prompt (`x-prefiller-host-port`) when the pool
    /// disaggregates and its decider said so (see [`super::disagg`]).
    pub prefiller: Option<String>,
    /// The in-flight accounting to give back at the end of the request.
    pub lease: InFlightLease,
    /// Leading prompt blocks the endpoint already held.
    pub matched_blocks: usize,
    /// The prompt's full blocks considered.
    pub total_blocks: usize,
    /// Picked among endpoints with unknown metrics (`FailOpen` with none fresh).
    pub degraded: bool,
    /// The endpoint is a peer cluster's gateway ([`crate::picker::peers`]): the request is
    /// routed through the pool's peers cluster.
    pub peer: bool,
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

impl From<NoCandidates> for Rejection {
    fn from(reason: NoCandidates) -> Self {
        match reason {
            NoCandidates::NoLiveEndpoints => Rejection::NoEndpoints,
            NoCandidates::StaleMetrics => Rejection::StaleMetrics,
            NoCandidates::Unscraped => Rejection::Unscraped,
        }
    }
}

/// One endpoint a precise index follows the KV events of ([`PickerShared::precise_targets`]).
#[derive(Clone, Debug)]
pub struct PreciseTarget {
    /// The pool's name.
    pub pool: String,
    /// The pool's base model: the model of events whose topic names none.
    pub base_model: String,
    /// The endpoint (`ip:port`), as the picker names it.
    pub endpoint: String,
    /// Where its engine publishes KV events (ZMQ PUB over TCP).
    pub events: std::net::SocketAddr,
    /// The index its events feed.
    pub index: Arc<PreciseShared>,
}

/// The picker's shared state (see the module doc). A handle: clones share one state, so
/// an accessor can hand out `&mut PickerShared` without exclusive access to the state.
#[derive(Clone, Debug)]
pub struct PickerShared {
    inner: Arc<Inner>,
}

/// What [`PickerShared`] handles share.
#[derive(Debug)]
struct Inner {
    issuer: u64,
    plans: Arc<PickerPlans>,
    pools: Vec<Pool>,
    snapshot: SnapshotSlot,
    /// Reports made by snapshot changes, waiting for a host to emit them.
    reports: Mutex<Vec<UnscrapedReport>>,
    /// Whether `reports` may be non-empty (spares the request path its lock).
    has_reports: AtomicBool,
}

impl PickerShared {
    /// Build from a validated configuration.
    pub fn new(config: &PickerConfig) -> Result<PickerShared, PickerConfigError> {
        config.validate()?;
        let issuer = NEXT_ISSUER.fetch_add(1, Ordering::Relaxed);
        let mut plans = Vec::with_capacity(config.pools.len());
        let mut pools = Vec::with_capacity(config.pools.len());
        let priorities = Arc::new(Priorities::from_objectives(&config.objectives)?);
        for (i, cfg) in config.pools.iter().enumerate() {
            let (scheduler, flow) = compile(cfg)?;
            let precise = super::pool::precise_of(cfg, &scheduler)?;
            let flow = flow.map(|flow| FlowPlan::new(&cfg.pool, flow, Arc::clone(&priorities)));
            let plan = PoolPlan::new(issuer, PoolId(i), cfg, &scheduler, flow, precise.clone());
            pools.push(Pool::new(
                cfg,
                scheduler,
                plan.in_flight_gauge(),
                plan.static_slot_keys(),
                precise,
            ));
            plans.push(Arc::new(plan));
        }
        Ok(PickerShared {
            inner: Arc::new(Inner {
                issuer,
                plans: Arc::new(PickerPlans::new(plans)),
                pools,
                snapshot: SnapshotSlot::default(),
                reports: Mutex::new(Vec::new()),
                has_reports: AtomicBool::new(false),
            }),
        })
    }

    /// Parse, validate and build from JSON (the plugin config minus `role`).
    pub fn from_json(value: serde_json::Value) -> Result<PickerShared, PickerConfigError> {
        PickerShared::new(&PickerConfig::from_json(value)?)
    }

    /// Write every pool's in-flight gauges as this state counts them (see
    /// `PoolLoad::publish_gauges`).
    pub fn publish_inflight_gauges<S: crate::host::Stats + ?Sized>(&self, stats: &mut S) {
        for pool in &self.inner.pools {
            pool.load.publish_gauges(stats);
        }
    }

    /// The immutable per-pool plans; they never change for this state, so callers may
    /// keep them and read them without any lock.
    pub fn plans(&self) -> Arc<PickerPlans> {
        Arc::clone(&self.inner.plans)
    }

    /// The plan of the pool serving `base_model`.
    pub fn pool_plan(&self, base_model: &str) -> Option<Arc<PoolPlan>> {
        self.inner.plans.for_base_model(base_model)
    }

    /// The pool serving `base_model`.
    pub fn pool_for_base_model(&self, base_model: &str) -> Option<PoolId> {
        self.inner.plans.for_base_model(base_model).map(|p| p.id())
    }

    /// The session header of `pool`, lower-case, if configured.
    pub fn session_header(&self, pool: PoolId) -> Option<&str> {
        self.inner.plans.get(pool).and_then(|p| p.session_header())
    }

    /// Read the newest snapshot from the host; decode it only if it changed. A new
    /// snapshot is mapped onto every pool whose lock is free now (the others map it at
    /// their next pick).
    pub fn refresh_snapshot<H: SnapshotSource + ?Sized>(&self, host: &H) -> SnapshotRefresh {
        let (refresh, new_generation) = self.inner.snapshot.refresh(host);
        if new_generation {
            for (i, pool) in self.inner.pools.iter().enumerate() {
                if let Some(mut state) = pool.try_lock() {
                    self.sync(PoolId(i), &mut state);
                }
            }
        }
        refresh
    }

    /// The reports of pool endpoints missing from the snapshot made since the last call
    /// (see the module doc); the caller emits them with [`PoolPlan::report_unscraped`]
    /// after leaving the state.
    pub fn take_unscraped_reports(&self) -> Vec<UnscrapedReport> {
        // A load first: the common "nothing to report" writes no shared cache line.
        if !self.inner.has_reports.load(Ordering::SeqCst)
            || !self.inner.has_reports.swap(false, Ordering::SeqCst)
        {
            return Vec::new();
        }
        core::mem::take(
            &mut *self
                .inner
                .reports
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Bring `state`'s view of the snapshot up to the current generation (one atomic load
    /// when it is).
    fn sync(&self, pool: PoolId, state: &mut PoolState) {
        if self.inner.snapshot.generation() == state.generation {
            return;
        }
        let (generation, snapshot) = self.inner.snapshot.current();
        state.generation = generation;
        state.snapshot = snapshot;
        let Some(snapshot) = state.snapshot.clone() else {
            return;
        };
        let plan = self.inner.plans.get(pool);
        let cluster = plan.and_then(|p| snapshot.cluster(p.cluster()));
        if let Some(p) = self.inner.pools.get(pool.0) {
            members::apply(state, &p.load, cluster);
        }
        // A followed cluster missing from a snapshot that carries others: the scraper does
        // not follow it (at start, before any membership is known, nothing is carried).
        let cluster_missing = state.follows && cluster.is_none() && !snapshot.clusters.is_empty();
        if let Some(report) = reindex(pool, state, &snapshot, cluster_missing) {
            let mut queue = self
                .inner
                .reports
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            queue.push(report);
            self.inner.has_reports.store(true, Ordering::SeqCst);
        }
        self.judge_utilization(pool, state, &snapshot);
    }

    /// Give a utilization detector of `pool` its verdict on the new `snapshot` (the pool's
    /// view of it just reindexed): saturated when every endpoint of the pool in it exceeds
    /// a threshold.
    fn judge_utilization(&self, pool: PoolId, state: &PoolState, snapshot: &Snapshot) {
        let Some(flow) = self.inner.plans.get(pool).and_then(|p| p.flow()) else {
            return;
        };
        let Detector::Utilization(thresholds) = flow.gate().config().detector else {
            return;
        };
        let samples = state
            .sample_of
            .iter()
            .flatten()
            .filter_map(|&i| snapshot.endpoints.get(i))
            .filter_map(|s| s.metrics.as_ref())
            .map(|m| {
                (
                    m.waiting.map_or(0.0, f64::from),
                    m.kv_cache_usage.unwrap_or(0.0),
                )
            });
        flow.gate()
            .set_utilization_saturated(all_saturated(&thresholds, samples));
    }

    /// Expire and dispatch the queues of every pool with flow control at `now_ms` (the
    /// host's timer, so a TTL ends on time and a capacity freed without a request end in
    /// sight is used). Remote waiters (the Wasm owner's) are the owner's to run.
    pub fn run_flow_control(&self, now_ms: u64) {
        for plan in self.inner.plans.pools() {
            if let Some(flow) = plan.flow() {
                // A process-memory state holds local waiters only.
                drop(flow.run(now_ms));
            }
        }
    }

    /// Whether any pool has flow control (its host then runs a timer).
    pub fn has_flow_control(&self) -> bool {
        self.inner.plans.pools().iter().any(|p| p.flow().is_some())
    }

    /// The slot of `address` in `plan`'s pool if it is a current member: what a lease
    /// moves to when a retry's fallback served ([`InFlightLease::move_to`]). Locks only
    /// that pool.
    pub fn member_slot(&self, plan: &PoolPlan, address: &str) -> Option<usize> {
        if plan.issuer != self.inner.issuer {
            return None;
        }
        let pool = self.inner.pools.get(plan.id.0)?;
        let mut guard = pool.lock();
        self.sync(plan.id, &mut guard);
        members::member_slot(&guard, address)
    }

    /// Moves `lease` to the slot of `address` when that is a current member of the
    /// lease's pool, under the pool's lock: between a lookup and a move made apart, a
    /// membership change could hand the slot to another address. `false`: not a member
    /// (or not this state's plan); the lease stays where it was.
    pub fn move_lease<S: crate::host::Stats + ?Sized>(
        &self,
        plan: &PoolPlan,
        lease: &mut InFlightLease,
        address: &str,
        stats: &mut S,
    ) -> bool {
        if plan.issuer != self.inner.issuer {
            return false;
        }
        let Some(pool) = self.inner.pools.get(plan.id.0) else {
            return false;
        };
        let mut guard = pool.lock();
        self.sync(plan.id, &mut guard);
        match members::member_slot(&guard, address) {
            Some(slot) => lease.move_to(slot, stats),
            None => false,
        }
    }

    /// Every endpoint whose KV events a pool with a precise index follows: the current
    /// members of each such pool, with where their engine publishes (`kvEventsPort`, or
    /// the endpoint's port + `kvEventsPortOffset`) and the index their events feed.
    /// Changes with membership; the KV-event thread polls it.
    pub fn precise_targets(&self) -> Vec<PreciseTarget> {
        let mut out = Vec::new();
        for plan in self.inner.plans.pools() {
            let Some(index) = plan.precise() else {
                continue;
            };
            let port = index.settings().events_port;
            for endpoint in self.members(plan.id) {
                let Ok(addr) = endpoint.parse::<std::net::SocketAddr>() else {
                    continue;
                };
                let Some(events_port) = port.for_endpoint(addr.port()) else {
                    continue;
                };
                out.push(PreciseTarget {
                    pool: plan.name.clone(),
                    base_model: plan.base_model.clone(),
                    events: std::net::SocketAddr::new(addr.ip(), events_port),
                    endpoint,
                    index: Arc::clone(index),
                });
            }
        }
        out
    }

    /// Whether some pool keeps a precise index (its config declares
    /// `precise-prefix-cache-producer`).
    pub fn has_precise(&self) -> bool {
        self.inner
            .plans
            .pools()
            .iter()
            .any(|p| p.precise().is_some())
    }

    /// The current members of `pool`, in slot order (tests and diagnostics).
    pub fn members(&self, pool: PoolId) -> Vec<String> {
        let Some(p) = self.inner.pools.get(pool.0) else {
            return Vec::new();
        };
        let mut guard = p.lock();
        self.sync(pool, &mut guard);
        let state = &*guard;
        state
            .endpoints
            .iter()
            .enumerate()
            .filter(|(i, _)| state.member.get(*i).copied().unwrap_or(false))
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// A request of `plan`'s pool was served by its endpoint `served` (`ip:port`), not
    /// where it was picked (a retry took a fallback): record its prompt blocks and its
    /// session for the endpoint that holds them now. The pick's own entries are left to age
    /// out of its LRU: the prefix index has no removal of single blocks, and a later pick
    /// that finds them there is wrong once at most. Locks only that pool; `false` for an
    /// endpoint that is no current member or a plan of another state.
    pub fn record_served(
        &self,
        plan: &PoolPlan,
        served: &str,
        block_hashes: &[BlockHash],
        session: Option<&str>,
    ) -> bool {
        if plan.issuer != self.inner.issuer {
            return false;
        }
        let Some(pool) = self.inner.pools.get(plan.id.0) else {
            return false;
        };
        let mut state = pool.lock();
        self.sync(plan.id, &mut state);
        let Some(slot) = members::member_slot(&state, served) else {
            return false;
        };
        let address = served.to_owned();
        let served = slot;
        if !block_hashes.is_empty() {
            // A precise index learns where the blocks went from the serving engine's own
            // events; only the approximate one is told here.
            if state.precise.is_none() {
                state.prefix.record(&address, block_hashes);
            }
        }
        if let Some(session) = session {
            state.sessions.record(session, served);
        }
        true
    }

    /// Give a lease back for a caller that lowers the in-flight gauges itself: the same
    /// as dropping it, except that no gauge decrement is owed. Requests use
    /// [`InFlightLease::end`] or simply drop the lease.
    pub fn release(&self, lease: InFlightLease) {
        lease.gauges_lowered_by_caller();
    }

    /// In-flight load of endpoint `address` in `pool` (a removed member's too, while its
    /// slot holds it), read without the pool's lock.
    pub fn inflight(&self, pool: PoolId, address: &str) -> Option<InFlight> {
        let p = self.inner.pools.get(pool.0)?;
        p.load.get(p.load.slot_of(address)?)
    }

    /// What a request sent to endpoint `address` of `pool` at `now` should expect from the
    /// latency this state measured there, when its estimate counts (tests and diagnostics).
    pub fn observed_latency(
        &self,
        pool: PoolId,
        address: &str,
        now: Millis,
    ) -> Option<ObservedLatency> {
        let p = self.inner.pools.get(pool.0)?;
        p.load.observed(p.load.slot_of(address)?, now)
    }

    /// Requests in flight in `pool`, over every slot (tests and diagnostics).
    pub fn inflight_total(&self, pool: PoolId) -> u64 {
        self.inner
            .pools
            .get(pool.0)
            .map_or(0, |p| p.load.total_requests())
    }

    /// Gauge decrements `pool` owes for leases dropped without an end (see
    /// [`super::lease`]).
    pub fn owed_gauge_decrements(&self, pool: PoolId) -> u64 {
        self.inner
            .pools
            .get(pool.0)
            .map_or(0, |p| p.load.owed_gauge_decrements())
    }

    /// Matched ÷ total prompt blocks over every pick of `pool` so far (0 before any).
    pub fn prefix_hit_ratio(&self, pool: PoolId) -> f64 {
        self.inner.pools.get(pool.0).map_or(0.0, |p| {
            let state = p.lock();
            if state.total_blocks == 0 {
                0.0
            } else {
                state.matched_blocks as f64 / state.total_blocks as f64
            }
        })
    }

    /// The pool's name.
    pub fn pool_name(&self, pool: PoolId) -> Option<&str> {
        self.inner.plans.get(pool).map(|p| p.name())
    }

    /// Sessions remembered by `pool`.
    pub fn sessions(&self, pool: PoolId) -> usize {
        self.inner
            .pools
            .get(pool.0)
            .map_or(0, |p| p.lock().sessions.len())
    }

    /// Whether `pool`'s lock is held right now (the one-thread test, run in Wasm).
    #[cfg(all(test, target_family = "wasm"))]
    pub(super) fn pool_is_locked(&self, pool: PoolId) -> bool {
        self.inner
            .pools
            .get(pool.0)
            .is_some_and(|p| p.try_lock().is_none())
    }

    /// Leading blocks of `hashes` the prefix index of `pool` holds for `endpoint` (tests).
    #[cfg(test)]
    pub(super) fn prefix_match(&self, pool: PoolId, endpoint: &str, hashes: &[BlockHash]) -> usize {
        self.inner
            .pools
            .get(pool.0)
            .map_or(0, |p| p.lock().prefix.match_endpoint(endpoint, hashes))
    }

    /// Hold the snapshot's lock (tests: what proceeds while it is busy).
    #[cfg(test)]
    pub(super) fn hold_snapshot(&self) -> impl Drop + '_ {
        self.inner.snapshot.hold()
    }

    /// Hold `pool`'s lock (tests: what proceeds while a pool is busy).
    #[cfg(test)]
    pub(super) fn hold_pool(&self, pool: PoolId) -> Option<std::sync::MutexGuard<'_, PoolState>> {
        self.inner.pools.get(pool.0).map(Pool::lock)
    }
}
