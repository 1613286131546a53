//! One pool of the picker: its endpoints, its mutable state behind its own lock, and its
//! in-flight load beside the lock.
//!
//! [`PoolState`] is what a pick reads and writes: the candidate rules, the compiled
//! scheduler, the prefix index, the session table, and the pool's view of the current
//! metric snapshot (which record belongs to which endpoint, and which snapshot that view
//! was built from). Picks of one pool are serialised by its lock; picks of different pools
//! never wait for each other. The in-flight load is a [`PoolLoad`] of counters outside the
//! lock, so a lease given back never takes it (see [`super::lease`]). The immutable part a
//! request needs outside any lock (name, base model, session header, hashing, stat keys)
//! is the pool's [`super::plan::PoolPlan`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use scheduler_core::flow::{BatchCapacity, FlowControlConfig};
use scheduler_core::prefix::PrefixIndex;

use crate::precise::PreciseShared;
use scheduler_core::scheduling::candidates::CandidateRules;
use scheduler_core::scheduling::config::{ConfigError, EndpointPickerConfig};
use scheduler_core::scheduling::{Role, Scheduler};
use scheduler_core::snapshot::{Health, Snapshot};

use super::config::{PickerConfigError, PoolConfig};
use super::disagg::EndpointRoles;
use super::lease::{PoolLoad, SlotKeys};
use super::sessions::SessionTable;
use super::state::lora::AdapterMemory;
use crate::stats::StatKey;

/// Endpoint slots a pool that follows its cluster has room for: the most members it
/// tracks at once, counting removed ones whose requests are still in flight.
pub const MAX_FOLLOWED_ENDPOINTS: usize = 1024;

/// One pool's state under its lock.
///
/// Every per-endpoint vector is indexed by *slot*: a static pool's slots are its
/// configured endpoints; a pool that follows its cluster gives each new member a slot
/// (a removed member's, once nothing is in flight there, else a new one), and a slot
/// keeps its index for as long as it holds its address, so a lease, a session or a
/// snapshot record that names a slot never names another endpoint.
#[derive(Debug)]
pub(super) struct PoolState {
    /// Per slot: the address it holds (or last held).
    pub(super) endpoints: Vec<String>,
    /// Per slot: whether it holds a current member (a removed one is never a candidate).
    pub(super) member: Vec<bool>,
    /// Per slot: its health as the snapshot's cluster reports it (healthy when the pool's
    /// cluster is not carried). An unhealthy member is never a candidate.
    pub(super) health: Vec<Health>,
    /// Whether the pool follows its cluster's members (no static `endpoints`).
    pub(super) follows: bool,
    /// The pool's name (the stat keys of members that join).
    pub(super) name: String,
    /// `endpointRoles`, for the roles of members that join.
    pub(super) role_config: EndpointRoles,
    pub(super) rules: CandidateRules,
    pub(super) scheduler: Scheduler,
    pub(super) prefix: PrefixIndex,
    /// The precise index, when the pool's config declares `precise-prefix-cache-producer`
    /// (then `prefix` is unused); shared with the plan and the KV-event thread.
    pub(super) precise: Option<Arc<PreciseShared>>,
    pub(super) sessions: SessionTable,
    /// Per endpoint: its prefill/decode role (`endpointRoles`).
    pub(super) roles: Vec<Role>,
    /// The snapshot generation `sample_of` and `capacity` were built from (0: none yet).
    pub(super) generation: u64,
    /// That snapshot (the pool's picks read it without the snapshot's lock).
    pub(super) snapshot: Option<Arc<Snapshot>>,
    /// Per endpoint: its record's index in that snapshot.
    pub(super) sample_of: Vec<Option<usize>>,
    /// Per endpoint: the prefix LRU capacity last applied.
    pub(super) capacity: Vec<Option<u32>>,
    /// Per endpoint: the batch it was seen to run while requests waited (see
    /// [`BatchCapacity`]); learned only where `learns_batch`.
    pub(super) batch: Vec<BatchCapacity>,
    /// Whether the endpoints' figures are their own (not a Parent Mode peers pool, whose
    /// endpoints are gateways publishing means over a whole cluster's replicas).
    pub(super) learns_batch: bool,
    /// Per endpoint: the LoRA adapters the pool sent there (see [`super::state::lora`]).
    pub(super) adapters: Vec<AdapterMemory>,
    /// What was last reported (see `super::state::view`): the static endpoints missing
    /// from the snapshot, the member count and whether the followed cluster is missing
    /// (`None`: no report yet).
    pub(super) reported_missing: Option<(Vec<usize>, usize, bool)>,
    pub(super) matched_blocks: u64,
    pub(super) total_blocks: u64,
}

impl PoolState {
    fn new(
        cfg: &PoolConfig,
        scheduler: Scheduler,
        precise: Option<Arc<PreciseShared>>,
    ) -> PoolState {
        let prefix = scheduler.new_prefix_index();
        let n = cfg.endpoints.len();
        PoolState {
            endpoints: cfg.endpoints.clone(),
            member: vec![true; n],
            health: vec![Health::Healthy; n],
            follows: cfg.follows_cluster(),
            name: cfg.pool.clone(),
            role_config: cfg.endpoint_roles.clone(),
            rules: cfg.candidate_rules(),
            scheduler,
            prefix,
            precise,
            sessions: SessionTable::new(cfg.max_sessions),
            roles: cfg.endpoint_roles.resolve_validated(&cfg.endpoints),
            generation: 0,
            snapshot: None,
            sample_of: vec![None; n],
            capacity: vec![None; n],
            batch: vec![BatchCapacity::default(); n],
            learns_batch: cfg.peer_of.is_none() || cfg.follows_cluster(),
            adapters: (0..n).map(|_| AdapterMemory::default()).collect(),
            reported_missing: None,
            matched_blocks: 0,
            total_blocks: 0,
        }
    }
}

/// One pool: its state behind its own lock, and its in-flight load.
#[derive(Debug)]
pub(super) struct Pool {
    state: Mutex<PoolState>,
    pub(super) load: Arc<PoolLoad>,
}

/// The pool's precise index, when its config declares `precise-prefix-cache-producer`
/// (its tokenizer is loaded now: a missing file is a config error).
pub(super) fn precise_of(
    cfg: &PoolConfig,
    scheduler: &Scheduler,
) -> Result<Option<Arc<PreciseShared>>, PickerConfigError> {
    let Some(settings) = scheduler.precise_settings() else {
        return Ok(None);
    };
    PreciseShared::new(settings)
        .map(|p| Some(Arc::new(p)))
        .map_err(|e| PickerConfigError::Scheduler {
            pool: cfg.pool.clone(),
            error: format!("precise-prefix-cache-producer: {e}"),
        })
}

/// Compile a pool's scheduling config (its own, or the default), and its flow control
/// when the config enables it.
pub(super) fn compile(
    cfg: &PoolConfig,
) -> Result<(Scheduler, Option<FlowControlConfig>), PickerConfigError> {
    let epp = cfg
        .epp_config
        .clone()
        .unwrap_or_else(super::config::default_epp_config);
    let error = |e: ConfigError| PickerConfigError::Scheduler {
        pool: cfg.pool.clone(),
        error: e.to_string(),
    };
    let epp = EndpointPickerConfig::from_value(epp).map_err(error)?;
    let scheduler = Scheduler::new(&epp).map_err(error)?;
    let flow = FlowControlConfig::compile(&epp).map_err(error)?;
    Ok((scheduler, flow))
}

impl Pool {
    /// A pool of `cfg` scheduled by `scheduler`, its in-flight load reported under the
    /// pool gauge `gauge` and the static endpoints' `slots` keys (the plan's).
    pub(super) fn new(
        cfg: &PoolConfig,
        scheduler: Scheduler,
        gauge: StatKey,
        slots: &[Arc<SlotKeys>],
        precise: Option<Arc<PreciseShared>>,
    ) -> Pool {
        let room = if cfg.follows_cluster() {
            MAX_FOLLOWED_ENDPOINTS
        } else {
            slots.len()
        };
        let latency = scheduler.latency_settings();
        Pool {
            state: Mutex::new(PoolState::new(cfg, scheduler, precise)),
            load: Arc::new(PoolLoad::new(gauge, room, slots, latency)),
        }
    }

    /// Lock the pool. Every mutation of the state is a whole step, so a lock poisoned by a
    /// panic is taken over rather than failing every later request.
    pub(super) fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lock the pool if no one holds it.
    pub(super) fn try_lock(&self) -> Option<MutexGuard<'_, PoolState>> {
        match self.state.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}
