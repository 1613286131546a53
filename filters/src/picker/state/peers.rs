//! The cluster-level step of a pick ([`crate::picker::peers`] has the rule): this cluster's
//! pool, or the pool of its peer gateways. Each pool is looked at under its own lock, one
//! after the other (no lock across pools), then the chosen pool picks as always.

use scheduler_core::flow::UtilizationThresholds;
use scheduler_core::scheduling::candidates::{classify, EndpointClass};
use scheduler_core::types::{BlockHash, Millis};

use super::view::record_of;
use super::{members, PickRequest, Picked, PickerShared, Rejection};
use crate::picker::lease::PoolLoad;
use crate::picker::plan::PoolPlan;
use crate::picker::pool::PoolState;

/// One pool as the cluster-level step sees it.
#[derive(Debug, Default)]
struct ClusterView {
    /// The most leading prompt blocks any live candidate holds (this gateway's record).
    held: usize,
    /// Every live candidate with fresh figures is at a threshold or full (an unknown one
    /// never is).
    saturated: bool,
    /// The live candidates with fresh figures below both thresholds and not full.
    open: Vec<String>,
}

impl PickerShared {
    /// [`PickerShared::pick_within`] with the cluster-level step first, for a pool with
    /// peers and a request that did not come from a peer (`from_peer`) and carries no
    /// subset hint (which names local endpoints). A request the peers' pick cannot take
    /// (no open peer) stays here; one the pool here refuses (no live replica, stale
    /// metrics under `FailClose`) goes to an open peer if there is one, else gets the
    /// pool's answer.
    pub fn pick_routed(
        &self,
        plan: &PoolPlan,
        req: &PickRequest<'_>,
        subset: Option<&[String]>,
        from_peer: bool,
        now: Millis,
        random: u64,
    ) -> Result<Picked, Rejection> {
        let peers = match plan.peers() {
            Some(peers) if !from_peer && subset.is_none() => peers,
            _ => return self.pick_within(plan, req, subset, now, random),
        };
        let Some(peer_plan) = self.inner.plans.get(peers.pool).cloned() else {
            return self.pick_within(plan, req, subset, now, random);
        };
        let here = self.cluster_view(plan, req.block_hashes, &peers.spill, now);
        let there = self.cluster_view(&peer_plan, req.block_hashes, &peers.spill, now);
        let blocks = req.block_hashes.len();
        // A conversation a peer holds goes back there; one held here stays here, saturated
        // or not (its cache is here); a new one spills when this pool is saturated.
        let to_peer = if holds(there.held, blocks) && there.held > here.held {
            true
        } else {
            !holds(here.held, blocks) && here.saturated
        };
        let to_peers = || -> Result<Picked, Rejection> {
            let mut picked = self.pick_within(&peer_plan, req, Some(&there.open), now, random)?;
            picked.peer = true;
            picked.fallbacks.extend(peers.loopback.iter().cloned());
            Ok(picked)
        };
        if to_peer {
            if let Ok(picked) = to_peers() {
                return Ok(picked);
            }
        }
        // The pool's failure answer stands only when no peer can serve instead: a pool
        // with no live replica, or whose metrics are stale under `FailClose`, sends its
        // requests to an open peer rather than answer 503.
        self.pick_within(plan, req, None, now, random)
            .or_else(|rejection| to_peers().map_err(|_| rejection))
    }

    /// How `plan`'s pool looks to the cluster-level step at `now`. Locks only that pool.
    fn cluster_view(
        &self,
        plan: &PoolPlan,
        hashes: &[BlockHash],
        spill: &UtilizationThresholds,
        now: Millis,
    ) -> ClusterView {
        let Some(pool) = self.inner.pools.get(plan.id.0) else {
            return ClusterView::default();
        };
        let mut guard = pool.lock();
        self.sync(plan.id, &mut guard);
        view_of(&guard, &pool.load, hashes, spill, now)
    }
}

/// Whether a pool that holds `held` leading blocks of a prompt of `blocks` holds the
/// request's conversation: at least half its blocks, so a short prefix every request
/// shares (a system prompt) does not pin new conversations.
fn holds(held: usize, blocks: usize) -> bool {
    held > 0 && held * 2 >= blocks
}

/// The view of one pool's state and in-flight load (module doc).
fn view_of(
    state: &PoolState,
    load: &PoolLoad,
    hashes: &[BlockHash],
    spill: &UtilizationThresholds,
    now: Millis,
) -> ClusterView {
    let samples = state.snapshot.as_deref().map(|s| s.endpoints.as_slice());
    let mut view = ClusterView::default();
    // An empty pool is not saturated; one candidate below the thresholds makes it not.
    let mut any = false;
    let mut below = false;
    for slot in (0..state.endpoints.len()).filter(|&i| members::candidate(state, i)) {
        let record = record_of(samples, state.sample_of.get(slot).copied().flatten());
        let class = classify(record, &state.rules, now);
        let (Some(address), false) = (state.endpoints.get(slot), class == EndpointClass::Dead)
        else {
            continue;
        };
        if state.precise.is_none() && !hashes.is_empty() {
            view.held = view.held.max(state.prefix.match_endpoint(address, hashes));
        }
        any = true;
        // Unknown figures count as below every threshold (as the utilization detector
        // reads them), but only fresh ones open a peer.
        let EndpointClass::Fresh(metrics) = class else {
            below = true;
            continue;
        };
        let waiting = metrics.waiting.unwrap_or(0);
        let running = metrics.running.unwrap_or(0);
        let in_flight = load.get(slot).map_or(0, |l| l.requests);
        let full = state
            .batch
            .get(slot)
            .is_some_and(|b| b.is_full(running, waiting, in_flight));
        let at_threshold = spill.endpoint_saturated(
            metrics.waiting.map_or(f64::NAN, f64::from),
            metrics.kv_cache_usage.unwrap_or(f64::NAN),
        );
        if !full && !at_threshold {
            below = true;
            view.open.push(address.clone());
        }
    }
    view.saturated = any && !below;
    view
}
