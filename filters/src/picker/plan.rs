//! The immutable half of the picker: per pool, what a request needs *before* it touches the
//! shared state — the pool's identity, its session header, how to hash a prompt into prefix
//! blocks — and the stat keys it reports under.
//!
//! A [`PoolPlan`] is built once with its [`super::PickerShared`] and never changes, so it is
//! shared by `Arc`: the request takes one at headers time and then parses its body, hashes
//! its prompt and emits its stats without holding the state's lock. Only the pick itself
//! (snapshot refresh, schedule, prefix record, in-flight lease) needs the pool's lock.

use std::sync::Arc;

use scheduler_core::prefix::{self, PrefixConfig};
use scheduler_core::scheduling::Scheduler;
use scheduler_core::types::BlockHash;

use super::admit::FlowPlan;
use super::config::PoolConfig;
use super::lease::{pool_inflight_key, SlotKeys};
use super::peers::PeerPlan;
use super::state::{Picked, PoolId, Rejection};
use crate::handoff::Handoff;
use crate::host::Stats;
use crate::precise::PreciseShared;
use crate::stats::{StatKey, StatKind};

/// Stat keys of one pool.
#[derive(Clone, Debug)]
struct PoolStats {
    decisions: StatKey,
    /// The picks counter and in-flight gauge of each static endpoint (a followed
    /// cluster's members get theirs when they join).
    slots: Vec<Arc<SlotKeys>>,
    reject_no_endpoints: StatKey,
    reject_stale: StatKey,
    prefix_matched_blocks: StatKey,
    prefix_total_blocks: StatKey,
    degraded_picks: StatKey,
    snapshot_errors: StatKey,
    handoff: StatKey,
    reject_unscraped: StatKey,
    /// Requests a retry moved off the pick to another endpoint of the pool.
    served_elsewhere: StatKey,
    /// Picks prefilled on another endpoint than the one that decodes them.
    disaggregated: StatKey,
    /// Requests matched to the pool by base model: the host could not tell the route's
    /// cluster, or no pool picks for it.
    by_base_model: StatKey,
    /// Gauge: requests in flight in the pool.
    inflight: StatKey,
    /// Gauge: pool endpoints absent from the scraper's snapshot.
    unscraped: StatKey,
    /// Gauge: the pool's current members (its candidates before any rule).
    members: StatKey,
    /// Gauges of the precise index, when the pool has one (`infergate.precise.*`).
    precise: Option<PreciseStats>,
}

/// Gauges of a pool's precise index, set at each decision from its counters (the thread
/// that applies the events cannot write Envoy stats).
#[derive(Clone, Debug)]
struct PreciseStats {
    blocks: StatKey,
    batches: StatKey,
    stored: StatKey,
    removed: StatKey,
    cleared: StatKey,
    stale: StatKey,
    decode_errors: StatKey,
    tokenize_errors: StatKey,
}

impl PreciseStats {
    fn new(pool: &str) -> Self {
        let p = [("pool", pool)];
        let event = |kind| {
            StatKey::new(
                "infergate.precise.events",
                &[("pool", pool), ("kind", kind)],
            )
        };
        PreciseStats {
            blocks: StatKey::new("infergate.precise.blocks", &p),
            batches: StatKey::new("infergate.precise.messages", &p),
            stored: event("block_stored"),
            removed: event("block_removed"),
            cleared: event("all_blocks_cleared"),
            stale: StatKey::new("infergate.precise.stale", &p),
            decode_errors: StatKey::new("infergate.precise.decode_errors", &p),
            tokenize_errors: StatKey::new("infergate.precise.tokenize_errors", &p),
        }
    }

    fn keys(&self) -> [&StatKey; 8] {
        [
            &self.blocks,
            &self.batches,
            &self.stored,
            &self.removed,
            &self.cleared,
            &self.stale,
            &self.decode_errors,
            &self.tokenize_errors,
        ]
    }

    fn report<S: Stats + ?Sized>(&self, index: &PreciseShared, stats: &mut S) {
        let c = index.counters();
        stats.gauge_set(&self.blocks, index.total_blocks() as u64);
        stats.gauge_set(&self.batches, c.batches);
        stats.gauge_set(&self.stored, c.stored_events);
        stats.gauge_set(&self.removed, c.removed_events);
        stats.gauge_set(&self.cleared, c.cleared_events);
        stats.gauge_set(&self.stale, c.stale);
        stats.gauge_set(&self.decode_errors, c.decode_errors);
        stats.gauge_set(&self.tokenize_errors, c.tokenize_errors);
    }
}

impl PoolStats {
    fn new(pool: &str, endpoints: &[String], precise: bool) -> Self {
        let p = [("pool", pool)];
        let reject = |reason| {
            StatKey::new(
                "infergate.picker.rejects",
                &[("pool", pool), ("reason", reason)],
            )
        };
        PoolStats {
            decisions: StatKey::new("infergate.picker.decisions", &p),
            slots: endpoints.iter().map(|e| SlotKeys::new(pool, e)).collect(),
            reject_no_endpoints: reject(Rejection::NoEndpoints.label()),
            reject_stale: reject(Rejection::StaleMetrics.label()),
            prefix_matched_blocks: StatKey::new("infergate.picker.prefix_matched_blocks", &p),
            prefix_total_blocks: StatKey::new("infergate.picker.prefix_total_blocks", &p),
            degraded_picks: StatKey::new("infergate.picker.fail_open_picks", &p),
            snapshot_errors: StatKey::new("infergate.picker.snapshot_errors", &[]),
            handoff: StatKey::new("infergate.picker.handoff", &p),
            served_elsewhere: StatKey::new("infergate.picker.served_by_fallback", &p),
            disaggregated: StatKey::new("infergate.picker.disaggregated_picks", &p),
            by_base_model: StatKey::new("infergate.picker.pool_by_base_model", &p),
            reject_unscraped: reject(Rejection::Unscraped.label()),
            inflight: pool_inflight_key(pool),
            unscraped: StatKey::new("infergate.picker.unscraped_endpoints", &p),
            members: StatKey::new("infergate.picker.pool_members", &p),
            precise: precise.then(|| PreciseStats::new(pool)),
        }
    }

    /// Every key of the pool, with its kind.
    fn keys(&self) -> impl Iterator<Item = (StatKind, &StatKey)> {
        let counters = [
            &self.decisions,
            &self.reject_no_endpoints,
            &self.reject_stale,
            &self.reject_unscraped,
            &self.prefix_matched_blocks,
            &self.prefix_total_blocks,
            &self.degraded_picks,
            &self.snapshot_errors,
            &self.handoff,
            &self.served_elsewhere,
            &self.disaggregated,
            &self.by_base_model,
        ]
        .into_iter()
        .chain(self.slots.iter().map(|k| &k.picks))
        .map(|k| (StatKind::Counter, k));
        let gauges = [&self.inflight, &self.unscraped, &self.members]
            .into_iter()
            .chain(self.slots.iter().map(|k| &k.inflight))
            .chain(self.precise.iter().flat_map(PreciseStats::keys))
            .map(|k| (StatKind::Gauge, k));
        counters.chain(gauges)
    }
}

/// One pool's immutable settings (see the module doc).
#[derive(Debug)]
pub struct PoolPlan {
    /// The [`super::PickerShared`] this plan belongs to.
    pub(super) issuer: u64,
    pub(super) id: PoolId,
    pub(super) name: String,
    pub(super) base_model: String,
    /// The Envoy cluster this pool picks for.
    cluster: String,
    /// The static endpoints (empty when the pool follows its cluster).
    endpoints: Vec<String>,
    /// Whether the pool picks among its cluster's members, not a static list.
    follows: bool,
    /// How many fallbacks follow the pick in the destination list.
    fallbacks: usize,
    /// A sample older than this (ms) counts as unknown.
    stale_after_ms: u64,
    /// The name the pool's load is published under for other clusters, when it is.
    export: Option<String>,
    /// Whether the export page lists the pool's members too (`exportMembers`).
    export_members: bool,
    /// The pool's peer clusters, when it has some.
    peers: Option<PeerPlan>,
    /// Whether this is the pool of another pool's peer gateways (never chosen for a
    /// request by its cluster or base model).
    peer_pool: bool,
    session_header: Option<String>,
    /// How prompts are cut into blocks; `None` when no profile reads the prefix index.
    hashing: Option<PrefixConfig>,
    stats: PoolStats,
    /// Flow control, when the pool's config enables it (the gate is process-wide state
    /// of its own; the plan only hands it out).
    flow: Option<FlowPlan>,
    /// The precise index, when the config declares `precise-prefix-cache-producer`: the
    /// request is then keyed by its tokens ([`PreciseShared::keys`]), not its bytes.
    precise: Option<Arc<PreciseShared>>,
}

impl PoolPlan {
    pub(super) fn new(
        issuer: u64,
        id: PoolId,
        cfg: &PoolConfig,
        scheduler: &Scheduler,
        flow: Option<FlowPlan>,
        precise: Option<Arc<PreciseShared>>,
    ) -> Self {
        PoolPlan {
            issuer,
            id,
            name: cfg.pool.clone(),
            base_model: cfg.base_model.clone(),
            cluster: cfg.cluster_name().to_owned(),
            endpoints: cfg.endpoints.clone(),
            follows: cfg.follows_cluster(),
            fallbacks: cfg.fallbacks,
            stale_after_ms: cfg.stale_after_ms,
            export: cfg
                .export
                .then(|| cfg.export_name.clone().unwrap_or_else(|| cfg.pool.clone())),
            export_members: cfg.export_members,
            peers: cfg
                .peers
                .as_ref()
                .zip(cfg.peers_pool)
                .map(|(peers, pool)| peers.plan(pool)),
            peer_pool: cfg.peer_of.is_some(),
            session_header: cfg.session_header.as_ref().map(|h| h.to_ascii_lowercase()),
            hashing: scheduler
                .uses_prefix_index()
                .then(|| scheduler.prefix_config()),
            stats: PoolStats::new(&cfg.pool, &cfg.endpoints, precise.is_some()),
            flow,
            precise,
        }
    }

    /// The pool's precise index, when it has one.
    pub fn precise(&self) -> Option<&Arc<PreciseShared>> {
        self.precise.as_ref()
    }

    /// The pool's flow control, if enabled.
    pub fn flow(&self) -> Option<&FlowPlan> {
        self.flow.as_ref()
    }

    /// How many prompt bytes this pool hashes at most: what a parse for it must keep (0
    /// when no profile reads the prefix index).
    pub fn max_prompt_bytes(&self) -> usize {
        if self.precise.is_some() {
            // Keyed from the body's tokens instead (`PreciseShared::keys`).
            return 0;
        }
        self.hashing
            .as_ref()
            .map_or(0, PrefixConfig::max_prompt_bytes)
    }

    /// The pool's index in its state.
    pub fn id(&self) -> PoolId {
        self.id
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The base model the pool serves.
    pub fn base_model(&self) -> &str {
        &self.base_model
    }

    /// The Envoy cluster this pool picks for.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// How many fallback endpoints follow the pick in the destination list.
    pub fn fallbacks(&self) -> usize {
        self.fallbacks
    }

    /// The pool's static endpoints (`ip:port`), in configuration order; empty when the
    /// pool follows its cluster ([`PoolPlan::follows_cluster`]), whose members come and go
    /// in the state.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Whether the pool picks among its cluster's members as the snapshot carries them.
    pub fn follows_cluster(&self) -> bool {
        self.follows
    }

    /// How old (ms) a sample may be and still count as known.
    pub fn stale_after_ms(&self) -> u64 {
        self.stale_after_ms
    }

    /// Whether the pool's load is published to the gateways of other clusters.
    pub fn exported(&self) -> bool {
        self.export.is_some()
    }

    /// Whether the export page lists the pool's candidate members (`exportMembers`).
    pub fn exports_members(&self) -> bool {
        self.export_members
    }

    /// The name the pool's load is published under (its export page's), when it is.
    pub fn export_name(&self) -> Option<&str> {
        self.export.as_deref()
    }

    /// The pool's peer clusters, when it has some.
    pub fn peers(&self) -> Option<&PeerPlan> {
        self.peers.as_ref()
    }

    /// Whether this is the pool of another pool's peer gateways.
    pub fn is_peer_pool(&self) -> bool {
        self.peer_pool
    }

    /// The session header, lower-case, if configured.
    pub fn session_header(&self) -> Option<&str> {
        self.session_header.as_deref()
    }

    /// The request's chained block hashes (empty when no profile reads the prefix index).
    /// Pure: the seed comes from the target model and `cache_salt`, the block size from the
    /// pool's `approx-prefix-cache-producer`.
    pub fn block_hashes(
        &self,
        target_model: &str,
        cache_salt: Option<&str>,
        prompt: &[u8],
    ) -> Vec<BlockHash> {
        let Some(cfg) = self.hashing else {
            return Vec::new();
        };
        prefix::block_hashes(prefix::seed(target_model, cache_salt), prompt, &cfg)
    }

    /// How many of `handoff`'s block hashes this pool would hash itself, or `None` if the
    /// handoff does not fit this pool (another base model, another block size, or cut
    /// shorter than this pool hashes). A pool that reads no prefix index keeps none.
    pub fn handoff_blocks(&self, handoff: &Handoff) -> Option<usize> {
        // A precise pool keys tokens, which the router's byte hashes are not.
        if handoff.base_model != self.base_model || self.precise.is_some() {
            return None;
        }
        match &self.hashing {
            None => Some(0),
            Some(cfg) => handoff.hashes_for(cfg).map(<[BlockHash]>::len),
        }
    }

    /// The block size this pool hashes prompts at; `None` when no profile reads the prefix
    /// index (then a handoff's hashes are not needed at all).
    pub fn block_size_tokens(&self) -> Option<u32> {
        self.hashing.map(|cfg| cfg.block_size_tokens)
    }

    /// Count a request picked from the router's handoff (no body read).
    pub fn count_handoff<S: Stats + ?Sized>(&self, stats: &mut S) {
        stats.counter_add(&self.stats.handoff, 1);
    }

    /// Count a request matched to this pool by its base model, not by the cluster of its
    /// route (the host could not tell it, or no pool's `cluster` is that cluster).
    pub fn count_by_base_model<S: Stats + ?Sized>(&self, stats: &mut S) {
        stats.counter_add(&self.stats.by_base_model, 1);
    }

    /// Count a request a retry moved off its pick to another endpoint of the pool.
    pub fn count_served_elsewhere<S: Stats + ?Sized>(&self, stats: &mut S) {
        stats.counter_add(&self.stats.served_elsewhere, 1);
    }

    /// Emit the stats of one decision of this pool.
    pub fn count_decision<S: Stats + ?Sized>(
        &self,
        outcome: &Result<Picked, Rejection>,
        stats: &mut S,
    ) {
        let s = &self.stats;
        stats.counter_add(&s.decisions, 1);
        if let (Some(keys), Some(index)) = (&s.precise, &self.precise) {
            keys.report(index, stats);
        }
        match outcome {
            Ok(picked) => {
                if let Some(keys) = picked.lease.keys() {
                    stats.counter_add(&keys.picks, 1);
                }
                if picked.degraded {
                    stats.counter_add(&s.degraded_picks, 1);
                }
                if picked.prefiller.is_some() {
                    stats.counter_add(&s.disaggregated, 1);
                }
                stats.counter_add(&s.prefix_matched_blocks, picked.matched_blocks as u64);
                stats.counter_add(&s.prefix_total_blocks, picked.total_blocks as u64);
            }
            Err(Rejection::NoEndpoints) => stats.counter_add(&s.reject_no_endpoints, 1),
            Err(Rejection::StaleMetrics) => stats.counter_add(&s.reject_stale, 1),
            Err(Rejection::Unscraped) => stats.counter_add(&s.reject_unscraped, 1),
        }
    }

    /// The pool's in-flight gauge key, for the pool's [`super::lease::PoolLoad`].
    pub(super) fn in_flight_gauge(&self) -> StatKey {
        self.stats.inflight.clone()
    }

    /// The stat keys of the static endpoints, in configuration order.
    pub(super) fn static_slot_keys(&self) -> &[Arc<SlotKeys>] {
        &self.stats.slots
    }

    /// Set the gauge of the pool's current members (`infergate.picker.pool_members`).
    pub fn report_members<S: Stats + ?Sized>(&self, members: usize, stats: &mut S) {
        stats.gauge_set(&self.stats.members, members as u64);
    }

    /// Report how many of the pool's endpoints the scraper's snapshot lacks (gauge
    /// `infergate.picker.unscraped_endpoints`) and log `message` when there is one.
    pub fn report_unscraped<S: Stats + ?Sized>(&self, report: &UnscrapedReport, stats: &mut S) {
        stats.gauge_set(&self.stats.unscraped, report.endpoints.len() as u64);
        self.report_members(report.members, stats);
        if report.cluster_missing {
            stats.log_error(&format!(
                "infergate: picker pool `{}` follows Envoy cluster `{}`, which the scraper's \
                 snapshot does not carry (add it to the scraper's `clusters`, or to its \
                 `published` for peers in Endpoint Mode): the pool has no members and \
                 answers 503 rejected-no-endpoints",
                self.name, self.cluster
            ));
        }
        if report.endpoints.is_empty() {
            return;
        }
        let list: Vec<String> = report.endpoints.iter().map(|e| format!("`{e}`")).collect();
        stats.log_error(&format!(
            "infergate: picker pool `{}`: {} of pools[{}].endpoints missing from the \
             scraper's snapshot (add them to the scraper's `endpoints`): {}; they have no \
             metrics, so a FailClose pool never picks them and answers 503 \
             rejected-no-endpoints when no other endpoint is scraped",
            self.name,
            report.endpoints.len(),
            self.id.0,
            list.join(", ")
        ));
    }

    /// Count a published snapshot that did not decode.
    pub fn count_snapshot_error<S: Stats + ?Sized>(&self, stats: &mut S) {
        stats.counter_add(&self.stats.snapshot_errors, 1);
    }
}

/// A pool's endpoints that a newly decoded snapshot has no record of (see
/// [`PoolPlan::report_unscraped`]); made when that set changes, the first snapshot included.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnscrapedReport {
    /// The pool.
    pub pool: PoolId,
    /// Its endpoints absent from the snapshot, in pool order.
    pub endpoints: Vec<String>,
    /// Its current members (static endpoints, or the followed cluster's members).
    pub members: usize,
    /// The pool follows its cluster but the snapshot does not carry that cluster (the
    /// scraper's `clusters` lack it): the pool has no members.
    pub cluster_missing: bool,
}

/// Every pool's plan, in pool order.
#[derive(Debug)]
pub struct PickerPlans {
    pub(super) pools: Vec<Arc<PoolPlan>>,
    /// Requests for a base model no pool serves.
    no_pool: StatKey,
}

impl Default for PickerPlans {
    fn default() -> Self {
        PickerPlans::new(Vec::new())
    }
}

impl PickerPlans {
    pub(super) fn new(pools: Vec<Arc<PoolPlan>>) -> Self {
        PickerPlans {
            pools,
            no_pool: StatKey::new("infergate.picker.no_pool_rejects", &[]),
        }
    }

    /// Count a request rejected because no pool serves its base model.
    pub fn count_no_pool<S: Stats + ?Sized>(&self, stats: &mut S) {
        stats.counter_add(&self.no_pool, 1);
    }

    /// The base models of every pool, in pool order.
    pub fn base_models(&self) -> impl Iterator<Item = &str> {
        self.pools.iter().map(|p| p.base_model.as_str())
    }

    /// The plan of the first pool serving `base_model`.
    pub fn for_base_model(&self, base_model: &str) -> Option<Arc<PoolPlan>> {
        self.pools
            .iter()
            .find(|p| p.base_model == base_model && !p.peer_pool)
            .map(Arc::clone)
    }

    /// The plan of the pool picking for Envoy cluster `cluster`.
    pub fn for_cluster(&self, cluster: &str) -> Option<Arc<PoolPlan>> {
        self.pools
            .iter()
            .find(|p| p.cluster == cluster && !p.peer_pool)
            .map(Arc::clone)
    }

    /// The plan for a request: the pool of the cluster Envoy's route chose, if the host
    /// told it and a pool has it; else the first pool serving the request's base model.
    pub fn for_request(&self, cluster: Option<&str>, base_model: &str) -> Option<Arc<PoolPlan>> {
        cluster
            .and_then(|c| self.for_cluster(c))
            .or_else(|| self.for_base_model(base_model))
    }

    /// Every pool's plan, in pool order.
    pub fn pools(&self) -> &[Arc<PoolPlan>] {
        &self.pools
    }

    /// The plan of pool `id`.
    pub fn get(&self, id: PoolId) -> Option<&Arc<PoolPlan>> {
        self.pools.get(id.0)
    }

    /// Every stat key the picker can emit for these pools, with its kind (a key shared by
    /// pools, such as `snapshot_errors`, once), so a host can define them all up front.
    pub fn stat_keys(&self) -> Vec<(StatKind, &StatKey)> {
        let mut keys: Vec<(StatKind, &StatKey)> = self
            .pools
            .iter()
            .flat_map(|p| p.stats.keys())
            .chain([(StatKind::Counter, &self.no_pool)])
            .collect();
        keys.sort_by(|a, b| a.1.cmp(b.1));
        keys.dedup_by(|a, b| a.1 == b.1);
        keys
    }
}
