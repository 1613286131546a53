//! One pool's mutable part of the picker state: its candidate settings, compiled
//! scheduler, prefix index, in-flight load and sessions. The immutable part a request needs
//! outside the lock (name, base model, session header, hashing, stat keys) is its
//! [`super::plan::PoolPlan`].

use scheduler_core::prefix::PrefixIndex;
use scheduler_core::scheduling::Scheduler;
use scheduler_core::types::InFlight;

use super::config::{FailureMode, PickerConfigError, PoolConfig};
use super::sessions::SessionTable;

/// One pool's state.
#[derive(Debug)]
pub(super) struct PoolState {
    pub(super) endpoints: Vec<String>,
    pub(super) failure_mode: FailureMode,
    pub(super) stale_after_ms: u64,
    pub(super) max_consecutive_failures: u32,
    pub(super) scheduler: Scheduler,
    pub(super) prefix: PrefixIndex,
    pub(super) inflight: Vec<InFlight>,
    pub(super) sessions: SessionTable,
    /// Per endpoint: its record's index in the current snapshot.
    pub(super) sample_of: Vec<Option<usize>>,
    /// Per endpoint: the prefix LRU capacity last applied.
    pub(super) capacity: Vec<Option<u32>>,
    pub(super) matched_blocks: u64,
    pub(super) total_blocks: u64,
}

impl PoolState {
    pub(super) fn new(cfg: &PoolConfig) -> Result<PoolState, PickerConfigError> {
        let epp = cfg
            .epp_config
            .clone()
            .unwrap_or_else(super::config::default_epp_config);
        let scheduler = Scheduler::from_value(epp).map_err(|e| PickerConfigError::Scheduler {
            pool: cfg.pool.clone(),
            error: e.to_string(),
        })?;
        let prefix = scheduler.new_prefix_index();
        let n = cfg.endpoints.len();
        Ok(PoolState {
            endpoints: cfg.endpoints.clone(),
            failure_mode: cfg.failure_mode,
            stale_after_ms: cfg.stale_after_ms,
            max_consecutive_failures: cfg.max_consecutive_failures,
            scheduler,
            prefix,
            inflight: vec![InFlight::default(); n],
            sessions: SessionTable::new(cfg.max_sessions),
            sample_of: vec![None; n],
            capacity: vec![None; n],
            matched_blocks: 0,
            total_blocks: 0,
        })
    }
}
