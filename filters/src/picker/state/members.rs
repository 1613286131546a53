//! A pool's membership, applied when the pool first sees a new snapshot generation.
//!
//! - A pool that **follows its cluster** (no static `endpoints`) takes the members of that
//!   cluster from the snapshot. A new member gets a slot: its own old one if it was a
//!   member before, else the slot of a removed member with nothing in flight and no
//!   gauge decrement owed, else a new slot (up to [`MAX_FOLLOWED_ENDPOINTS`]; past that a
//!   member is left out until a slot frees). A member gone stops being a candidate at
//!   once: its prefix-index entries, its sessions and its adapter memory are dropped, and
//!   its requests in flight end normally on their leases (the slot keeps its address, and
//!   its counters, until they have). A snapshot that does not carry the cluster says
//!   nothing about it: the last membership stays (an empty cluster is carried as one with
//!   no members).
//! - A pool with **static endpoints** keeps them, and takes the health of those the
//!   snapshot's cluster lists (any other stays healthy).
//!
//! Unhealthy members stay members (their slot, their index entries), but are never
//! candidates: [`candidate`] is what a pick asks.

use std::collections::HashMap;

use scheduler_core::flow::BatchCapacity;
use scheduler_core::snapshot::{ClusterMembers, Health};

use crate::picker::lease::{PoolLoad, SlotKeys};
use crate::picker::pool::{PoolState, MAX_FOLLOWED_ENDPOINTS};
use crate::picker::state::lora::AdapterMemory;

/// Whether slot `slot` may be picked: a current member that is not unhealthy.
pub(super) fn candidate(state: &PoolState, slot: usize) -> bool {
    state.member.get(slot).copied().unwrap_or(false)
        && state
            .health
            .get(slot)
            .is_some_and(|h| Health::is_candidate(*h))
}

/// The slot of `address` if it holds a current member.
pub(super) fn member_slot(state: &PoolState, address: &str) -> Option<usize> {
    let slot = state.endpoints.iter().position(|e| e == address)?;
    state
        .member
        .get(slot)
        .copied()
        .unwrap_or(false)
        .then_some(slot)
}

/// The current members of the pool.
pub(super) fn count(state: &PoolState) -> usize {
    state.member.iter().filter(|m| **m).count()
}

/// Apply `cluster` (the pool's cluster in the new snapshot, if carried) to `state`; `load`
/// is the pool's in-flight load (which slots are idle). True if the membership changed.
pub(super) fn apply(
    state: &mut PoolState,
    load: &PoolLoad,
    cluster: Option<&ClusterMembers>,
) -> bool {
    if !state.follows {
        apply_static_health(state, cluster);
        return false;
    }
    let Some(cluster) = cluster else {
        return false;
    };
    let mut wanted: HashMap<&str, Health> = HashMap::with_capacity(cluster.members.len());
    let mut order: Vec<&str> = Vec::with_capacity(cluster.members.len());
    for m in &cluster.members {
        if !wanted.contains_key(m.address.as_str()) {
            wanted.insert(m.address.as_str(), m.health);
            order.push(m.address.as_str());
        }
    }
    let mut changed = false;
    for slot in 0..state.endpoints.len() {
        let gone = state.member.get(slot).copied().unwrap_or(false)
            && state
                .endpoints
                .get(slot)
                .is_some_and(|a| !wanted.contains_key(a.as_str()));
        if gone {
            remove(state, slot);
            changed = true;
        }
    }
    for address in order {
        let health = wanted.get(address).copied().unwrap_or_default();
        if let Some(slot) = state.endpoints.iter().position(|e| e == address) {
            if let Some(m) = state.member.get_mut(slot) {
                changed |= !*m;
                *m = true;
            }
            if let Some(h) = state.health.get_mut(slot) {
                *h = health;
            }
            continue;
        }
        if join(state, load, address, health) {
            changed = true;
        }
    }
    changed
}

/// A static pool's health: each endpoint's as `cluster` lists it (the first listing of an
/// address counts), healthy when it is not listed or the cluster is not carried.
fn apply_static_health(state: &mut PoolState, cluster: Option<&ClusterMembers>) {
    let health: HashMap<&str, Health> = cluster
        .map(|c| {
            c.members
                .iter()
                .rev()
                .map(|m| (m.address.as_str(), m.health))
                .collect()
        })
        .unwrap_or_default();
    for (slot, address) in state.endpoints.iter().enumerate() {
        let h = health.get(address.as_str()).copied().unwrap_or_default();
        if let Some(at) = state.health.get_mut(slot) {
            *at = h;
        }
    }
}

/// Slot `slot` leaves the pool (see the module doc).
fn remove(state: &mut PoolState, slot: usize) {
    if let Some(m) = state.member.get_mut(slot) {
        *m = false;
    }
    if let Some(address) = state.endpoints.get(slot) {
        state.prefix.remove_endpoint(address);
        if let Some(p) = &state.precise {
            p.remove_endpoint(address);
        }
    }
    state.sessions.forget_endpoint(slot);
    if let Some(memory) = state.adapters.get_mut(slot) {
        *memory = AdapterMemory::default();
    }
    if let Some(c) = state.capacity.get_mut(slot) {
        *c = None;
    }
    if let Some(b) = state.batch.get_mut(slot) {
        *b = BatchCapacity::default();
    }
}

/// `address` joins the pool with `health`: in a removed member's idle slot, else a new
/// one. False when no slot is free.
fn join(state: &mut PoolState, load: &PoolLoad, address: &str, health: Health) -> bool {
    let keys = SlotKeys::new(&state.name, address);
    let reusable = (0..state.endpoints.len())
        .filter(|&slot| !state.member.get(slot).copied().unwrap_or(true))
        .find(|&slot| load.idle(slot));
    let role = state.role_config.role_of(address);
    match reusable {
        Some(slot) if load.assign(slot, std::sync::Arc::clone(&keys)) => {
            if let Some(a) = state.endpoints.get_mut(slot) {
                address.clone_into(a);
            }
            if let Some(m) = state.member.get_mut(slot) {
                *m = true;
            }
            if let Some(h) = state.health.get_mut(slot) {
                *h = health;
            }
            if let Some(r) = state.roles.get_mut(slot) {
                *r = role;
            }
            if let Some(s) = state.sample_of.get_mut(slot) {
                *s = None;
            }
            if let Some(c) = state.capacity.get_mut(slot) {
                *c = None;
            }
            if let Some(b) = state.batch.get_mut(slot) {
                *b = BatchCapacity::default();
            }
            if let Some(m) = state.adapters.get_mut(slot) {
                *m = AdapterMemory::default();
            }
            true
        }
        _ => {
            let slot = state.endpoints.len();
            if slot >= load.slots().min(MAX_FOLLOWED_ENDPOINTS) || !load.assign(slot, keys) {
                return false;
            }
            state.endpoints.push(address.to_owned());
            state.member.push(true);
            state.health.push(health);
            state.roles.push(role);
            state.sample_of.push(None);
            state.capacity.push(None);
            state.batch.push(BatchCapacity::default());
            state.adapters.push(AdapterMemory::default());
            true
        }
    }
}
