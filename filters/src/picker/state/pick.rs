//! The pick itself ([`PickerShared::pick_within`]), under the pool's lock (the lock order
//! is [`super`]'s; the precise index's lock is held for the schedule only): the candidate
//! slots (current, not unhealthy members, narrowed to the subset hint), the candidates
//! built from them with the snapshot's records and the in-flight load ([`gather`]), the
//! core's schedule over them ([`schedule`]), and the record of its choice ([`record`]):
//! the lease, the adapter memory, the prefix index, the session and the hit-ratio
//! counters. Stats are the caller's, after the lock.
//!
//! The candidates borrow the pool's state; the schedule hands its choice back as pool
//! slots ([`Choice`]), so the candidates are gone before the record writes the state.

use scheduler_core::metrics::EndpointMetrics;
use scheduler_core::scheduling::candidates::{
    pool_candidates, PoolCandidates, PoolEndpoint, Selection,
};
use scheduler_core::scheduling::{Decision, RequestView};
use scheduler_core::types::Millis;

use super::view::record_of;
use super::{lora, members, PickRequest, Picked, PickerShared, Rejection};
use crate::picker::disagg;
use crate::picker::plan::PoolPlan;
use crate::picker::pool::{Pool, PoolState};
use crate::precise::PreciseShared;

impl PickerShared {
    /// Pick an endpoint of `plan`'s pool for `req`; on success the endpoint's in-flight
    /// load includes the request until the returned lease is dropped. Locks only that
    /// pool. The caller reports the outcome with [`PoolPlan::count_decision`] (after
    /// unlocking). A plan of another state is refused as `NoEndpoints`.
    pub fn pick(
        &self,
        plan: &PoolPlan,
        req: &PickRequest<'_>,
        now: Millis,
        random: u64,
    ) -> Result<Picked, Rejection> {
        self.pick_within(plan, req, None, now, random)
    }

    /// [`PickerShared::pick`] among the pool endpoints `subset` (`ip:port`s: the request's
    /// subset hint) only; `None`: the whole pool. A subset with no current member of the
    /// pool is refused as `NoEndpoints`.
    pub fn pick_within(
        &self,
        plan: &PoolPlan,
        req: &PickRequest<'_>,
        subset: Option<&[String]>,
        now: Millis,
        random: u64,
    ) -> Result<Picked, Rejection> {
        if plan.issuer != self.inner.issuer {
            return Err(Rejection::NoEndpoints);
        }
        let Some(pool) = self.inner.pools.get(plan.id.0) else {
            return Err(Rejection::NoEndpoints);
        };
        let mut guard = pool.lock();
        self.sync(plan.id, &mut guard);
        let state = &mut *guard;
        let members = candidate_slots(state, subset);
        if members.is_empty() {
            return Err(Rejection::NoEndpoints);
        }
        let adapter = req.target_model != plan.base_model;
        // A pick of an adapter scores some candidates on owned copies of their metrics
        // (see `lora`); declared before the candidates, which borrow them.
        let mut seen = Vec::new();
        let candidates = gather(state, pool, &members, adapter, &mut seen, now)?;
        let choice = schedule(state, plan, req, &candidates, adapter, now, random);
        drop(candidates);
        record(state, pool, req, choice, now)
    }
}

/// The pool slots a pick may choose from, in slot order: the current members that are not
/// unhealthy, narrowed to `subset` when the request carries the hint (before any rule
/// runs, so its FailOpen "every member" means every member of the subset). A candidate's
/// position in this list is what the rules see; this list maps it back to its slot.
fn candidate_slots(state: &PoolState, subset: Option<&[String]>) -> Vec<usize> {
    match subset {
        None => (0..state.endpoints.len())
            .filter(|&i| members::candidate(state, i))
            .collect(),
        Some(subset) => {
            let mut slots: Vec<usize> = subset
                .iter()
                .filter_map(|a| members::member_slot(state, a))
                .filter(|&i| members::candidate(state, i))
                .collect();
            slots.sort_unstable();
            slots.dedup();
            slots
        }
    }
}

/// The pool slot of candidate `c`: `pool_index` maps it into `members`, the list handed to
/// the rules ([`candidate_slots`]).
fn slot_of(pool_index: &[usize], members: &[usize], c: usize) -> Option<usize> {
    pool_index
        .get(c)
        .and_then(|&listed| members.get(listed))
        .copied()
}

/// A pick's candidates: the core's set and the slots it was built from.
struct Candidates<'a> {
    set: PoolCandidates<'a>,
    members: &'a [usize],
}

impl Candidates<'_> {
    /// The pool slot of candidate `c`.
    fn slot(&self, c: usize) -> Option<usize> {
        slot_of(&self.set.pool_index, self.members, c)
    }
}

/// The candidates among `members` by the pool's rules at `now`, from their snapshot
/// records and in-flight load, with their prefill/decode roles and, for a pick of an
/// adapter, their metrics seen through the pool's adapter memory.
fn gather<'a>(
    state: &'a PoolState,
    pool: &Pool,
    members: &'a [usize],
    adapter: bool,
    seen_through_memory: &'a mut Vec<(usize, EndpointMetrics)>,
    now: Millis,
) -> Result<Candidates<'a>, Rejection> {
    let samples = state.snapshot.as_deref().map(|s| s.endpoints.as_slice());
    let endpoints = members.iter().filter_map(|&i| {
        Some(PoolEndpoint {
            address: state.endpoints.get(i)?,
            record: record_of(samples, state.sample_of.get(i).copied().flatten()),
            inflight: pool.load.get(i).unwrap_or_default(),
            // Read once per candidate below (the rules walk these endpoints twice).
            latency: None,
        })
    });
    let mut set = pool_candidates(endpoints, &state.rules, now)?;
    // A leaf lock per candidate: only for a config that reads the measured latency.
    if state.scheduler.uses_measured_latency() {
        for c in 0..set.candidates.len() {
            let observed =
                slot_of(&set.pool_index, members, c).and_then(|slot| pool.load.observed(slot, now));
            if let Some(cand) = set.candidates.get_mut(c) {
                cand.latency = observed;
            }
        }
    }
    let pool_index_of = |c: usize| slot_of(&set.pool_index, members, c);
    disagg::assign_roles(&mut set.candidates, &state.roles, pool_index_of);
    if adapter {
        see_through_memory(state, &mut set, members, seen_through_memory);
    }
    Ok(Candidates { set, members })
}

/// For each candidate whose scraped LoRA state the pool's memory of its endpoint adds to
/// ([`lora::augmented`]), keep the augmented copy in `seen` and point its metrics at it.
fn see_through_memory<'a>(
    state: &PoolState,
    set: &mut PoolCandidates<'a>,
    members: &[usize],
    seen: &'a mut Vec<(usize, EndpointMetrics)>,
) {
    for (c, cand) in set.candidates.iter().enumerate() {
        let memory = slot_of(&set.pool_index, members, c).and_then(|i| state.adapters.get(i));
        if let (Some(m), Some(memory)) = (cand.metrics, memory) {
            if let Some(augmented) = lora::augmented(m, memory) {
                seen.push((c, augmented));
            }
        }
    }
    let seen: &'a [(usize, EndpointMetrics)] = seen;
    for (c, metrics) in seen {
        if let Some(cand) = set.candidates.get_mut(*c) {
            cand.metrics = Some(metrics);
        }
    }
}

/// What the schedule chose, as pool slots: it borrows nothing of the candidates.
struct Choice {
    /// The picked slot, its matched prompt blocks and the prompt's full blocks considered.
    picked: Option<(usize, usize, usize)>,
    /// The picked endpoint's adapter slots, when the pick is of an adapter and the
    /// endpoint's LoRA state is scraped: the memory of what was sent there needs both.
    adapter_slots: Option<u32>,
    /// The slots to try next, at most the pool's `fallbacks`.
    fallbacks: Vec<usize>,
    /// The slot that prefills the prompt (see [`disagg`]).
    prefiller: Option<usize>,
    /// Picked among endpoints with unknown metrics.
    degraded: bool,
}

/// Run the pool's scheduler over `candidates` for `req`, against the precise index when
/// the pool has one (its lock held for the schedule only: the KV-event thread takes no
/// other lock, so the order pool → index is safe), else against the pool's prefix index.
fn schedule(
    state: &PoolState,
    plan: &PoolPlan,
    req: &PickRequest<'_>,
    candidates: &Candidates<'_>,
    adapter: bool,
    now: Millis,
    random: u64,
) -> Choice {
    let session_endpoint = req
        .session
        .and_then(|s| state.sessions.get(s))
        .and_then(|i| state.endpoints.get(i))
        .map(String::as_str);
    let view = RequestView {
        target_model: req.target_model,
        base_model: &plan.base_model,
        block_hashes: req.block_hashes,
        prompt_tokens: req.prompt_tokens,
        last_endpoint_for_session: session_endpoint,
    };
    let set = &candidates.set;
    let precise_guard = state.precise.as_deref().map(PreciseShared::lock_for_pick);
    if let Some(p) = &state.precise {
        // The engines' block size as scraped keys the next requests.
        if let Some(cache) = set.candidates.iter().find_map(|c| c.metrics?.cache) {
            p.learn_block_size(cache.block_size);
        }
    }
    let decision = match &precise_guard {
        Some(index) => {
            state
                .scheduler
                .schedule(&view, &set.candidates, &index.at(now), random, now)
        }
        None => state
            .scheduler
            .schedule(&view, &set.candidates, &state.prefix, random, now),
    };
    let choice = choose(&decision, candidates, plan, adapter);
    drop(decision);
    drop(precise_guard);
    choice
}

/// `decision`, the schedule over `candidates`, as pool slots.
fn choose(
    decision: &Decision<'_>,
    candidates: &Candidates<'_>,
    plan: &PoolPlan,
    adapter: bool,
) -> Choice {
    let pool_index_of = |c: usize| candidates.slot(c);
    let picked = decision.picked().and_then(|c| {
        let endpoint = pool_index_of(c)?;
        Some((endpoint, decision.prefix_matched(c), decision.full_blocks()))
    });
    let adapter_slots = decision
        .picked()
        .filter(|_| adapter)
        .and_then(|c| candidates.set.candidates.get(c))
        .and_then(|c| c.metrics)
        .and_then(|m| m.lora.as_ref())
        .map(|l| l.max);
    let fallbacks: Vec<usize> = decision
        .fallbacks()
        .iter()
        .filter_map(|&c| pool_index_of(c))
        .take(plan.fallbacks())
        .collect();
    Choice {
        picked,
        adapter_slots,
        fallbacks,
        prefiller: disagg::prefiller(decision, pool_index_of),
        degraded: candidates.set.selection != Selection::Fresh,
    }
}

/// Act on `choice`: the lease (the in-flight load of the request) and the adapter memory,
/// then the prompt's blocks (speculative ones in a precise index, until the engine's
/// events confirm them), the session and the hit-ratio counters.
fn record(
    state: &mut PoolState,
    pool: &Pool,
    req: &PickRequest<'_>,
    choice: Choice,
    now: Millis,
) -> Result<Picked, Rejection> {
    let Some((endpoint, matched, total)) = choice.picked else {
        return Err(Rejection::NoEndpoints);
    };
    let Some(address) = state.endpoints.get(endpoint).cloned() else {
        return Err(Rejection::NoEndpoints);
    };
    let Some(mut lease) = pool
        .load
        .take(endpoint, req.inflight_tokens(), req.prompt_tokens)
    else {
        return Err(Rejection::NoEndpoints);
    };
    if let (Some(slots), Some(memory)) = (choice.adapter_slots, state.adapters.get_mut(endpoint)) {
        lease.hold_adapter(memory.record(req.target_model, slots));
    }
    let prefiller = choice
        .prefiller
        .and_then(|i| state.endpoints.get(i).cloned());
    if !req.block_hashes.is_empty() {
        // The prefiller computed the prompt, so its cache holds it too (see `disagg`).
        for at in std::iter::once(&address).chain(prefiller.as_ref()) {
            match &state.precise {
                Some(p) => p.record_speculative(at, req.block_hashes, now),
                None => state.prefix.record(at, req.block_hashes),
            }
        }
    }
    if let Some(session) = req.session {
        state.sessions.record(session, endpoint);
    }
    state.matched_blocks = state.matched_blocks.saturating_add(matched as u64);
    state.total_blocks = state.total_blocks.saturating_add(total as u64);
    let fallbacks = choice
        .fallbacks
        .iter()
        .filter_map(|&i| state.endpoints.get(i).cloned())
        .collect();
    Ok(Picked {
        endpoint: address,
        fallbacks,
        prefiller,
        lease,
        matched_blocks: matched,
        total_blocks: total,
        degraded: choice.degraded,
        peer: false,
    })
}
