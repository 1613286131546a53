//! One pool's part of the picker state: its settings, compiled scheduler, prefix index,
//! in-flight load, sessions and stat keys.

use scheduler_core::prefix::{self, PrefixIndex};
use scheduler_core::scheduling::Scheduler;
use scheduler_core::types::{BlockHash, InFlight};

use super::config::{FailureMode, PickerConfigError, PoolConfig};
use super::sessions::SessionTable;
use super::state::{PickRequest, Rejection};
use crate::stats::StatKey;

/// Stat keys of one pool.
#[derive(Clone, Debug)]
pub(super) struct PoolStats {
    pub(super) decisions: StatKey,
    pub(super) picks: Vec<StatKey>,
    pub(super) reject_no_endpoints: StatKey,
    pub(super) reject_stale: StatKey,
    pub(super) prefix_matched_blocks: StatKey,
    pub(super) prefix_total_blocks: StatKey,
    pub(super) degraded_picks: StatKey,
}

impl PoolStats {
    fn new(pool: &str, endpoints: &[String]) -> Self {
        let p = [("pool", pool)];
        let reject = |reason| {
            StatKey::new(
                "infergate.picker.rejects",
                &[("pool", pool), ("reason", reason)],
            )
        };
        PoolStats {
            decisions: StatKey::new("infergate.picker.decisions", &p),
            picks: endpoints
                .iter()
                .map(|e| StatKey::new("infergate.picker.picks", &[("pool", pool), ("endpoint", e)]))
                .collect(),
            reject_no_endpoints: reject(Rejection::NoEndpoints.label()),
            reject_stale: reject(Rejection::StaleMetrics.label()),
            prefix_matched_blocks: StatKey::new("infergate.picker.prefix_matched_blocks", &p),
            prefix_total_blocks: StatKey::new("infergate.picker.prefix_total_blocks", &p),
            degraded_picks: StatKey::new("infergate.picker.fail_open_picks", &p),
        }
    }
}

/// One pool's state.
#[derive(Debug)]
pub(super) struct PoolState {
    pub(super) name: String,
    pub(super) base_model: String,
    pub(super) endpoints: Vec<String>,
    pub(super) failure_mode: FailureMode,
    pub(super) stale_after_ms: u64,
    pub(super) max_consecutive_failures: u32,
    pub(super) session_header: Option<String>,
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
    pub(super) stats: PoolStats,
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
            name: cfg.pool.clone(),
            base_model: cfg.base_model.clone(),
            endpoints: cfg.endpoints.clone(),
            failure_mode: cfg.failure_mode,
            stale_after_ms: cfg.stale_after_ms,
            max_consecutive_failures: cfg.max_consecutive_failures,
            session_header: cfg.session_header.as_ref().map(|h| h.to_ascii_lowercase()),
            scheduler,
            prefix,
            inflight: vec![InFlight::default(); n],
            sessions: SessionTable::new(cfg.max_sessions),
            sample_of: vec![None; n],
            capacity: vec![None; n],
            matched_blocks: 0,
            total_blocks: 0,
            stats: PoolStats::new(&cfg.pool, &cfg.endpoints),
        })
    }
}

/// The request's chained block hashes (empty when no profile reads the prefix index).
pub(super) fn block_hashes(scheduler: &Scheduler, req: &PickRequest<'_>) -> Vec<BlockHash> {
    if !scheduler.uses_prefix_index() {
        return Vec::new();
    }
    let seed = prefix::seed(req.target_model, req.cache_salt);
    prefix::block_hashes(seed, req.prompt, &scheduler.prefix_config())
}
