//! Where the quota buckets live: once per Envoy process, whatever the worker count, so a
//! tenant's concurrency of 2 admits exactly 2 at 4 workers as at 1.
//!
//! A [`QuotaStore`] admits and settles against one bucket set, named by a key
//! (`tenant/model`, see [`crate::tenants::Tenants::bucket_key`]). The bucket arithmetic is
//! the core's ([`scheduler_core::quota::QuotaState`]); a store only keeps the states:
//!
//! - [`MemoryQuotas`]: a process-wide map behind a lock (the native flavour, whose workers
//!   share the module's memory).
//! - [`CasQuotas`]: states kept in cells updated by compare-and-swap (proxy-wasm's shared
//!   data, which every worker VM of one `vm_id` shares: each VM's own memory would divide
//!   the quota by the worker count). An update that lost a race reads again and retries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use scheduler_core::quota::{Limits, QuotaState, RateLimitInfo, Rejection};
use scheduler_core::types::Millis;

/// One process's quota buckets.
pub trait QuotaStore: Send + Sync {
    /// Admit one request pre-debiting `debit` tokens from the bucket set `key`, or say why
    /// not (nothing is debited then).
    fn admit(
        &self,
        key: &str,
        limits: &Limits,
        debit: u64,
        now: Millis,
    ) -> Result<RateLimitInfo, Rejection>;

    /// A request admitted on `key` with `pre_debit` ended having used `actual` tokens.
    fn settle(&self, key: &str, limits: &Limits, pre_debit: u64, actual: u64, now: Millis);
}

/// Buckets in this process's memory, behind one lock (held for a few arithmetic steps).
#[derive(Debug, Default)]
pub struct MemoryQuotas {
    buckets: Mutex<HashMap<String, QuotaState>>,
}

impl MemoryQuotas {
    /// The process's buckets, shared by every filter config and worker. A config reload
    /// keeps them: a new config must not hand a tenant a fresh minute of quota.
    pub fn process() -> Arc<MemoryQuotas> {
        static PROCESS: OnceLock<Arc<MemoryQuotas>> = OnceLock::new();
        Arc::clone(PROCESS.get_or_init(Arc::default))
    }

    fn with_state<T>(
        &self,
        key: &str,
        limits: &Limits,
        now: Millis,
        f: impl FnOnce(&mut QuotaState) -> T,
    ) -> T {
        // A panic elsewhere while holding the lock leaves whole states behind (every update
        // is a copy-and-assign of plain numbers), so a poisoned lock is still usable.
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let state = match buckets.get_mut(key) {
            Some(state) => state,
            None => buckets
                .entry(key.to_owned())
                .or_insert_with(|| QuotaState::full(limits, now)),
        };
        f(state)
    }
}

impl QuotaStore for MemoryQuotas {
    fn admit(
        &self,
        key: &str,
        limits: &Limits,
        debit: u64,
        now: Millis,
    ) -> Result<RateLimitInfo, Rejection> {
        self.with_state(key, limits, now, |s| s.admit(limits, debit, now))
    }

    fn settle(&self, key: &str, limits: &Limits, pre_debit: u64, actual: u64, now: Millis) {
        self.with_state(key, limits, now, |s| {
            s.settle(limits, pre_debit, actual, now)
        });
    }
}

/// The outcome of a compare-and-swap write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CasWrite {
    /// Written.
    Stored,
    /// The cell changed since it was read: read again.
    Conflict,
    /// The host refused the write.
    Failed,
}

/// Cells of bytes with a version, written only if the version is still the one read
/// (proxy-wasm shared data: `proxy_get_shared_data` / `proxy_set_shared_data` with `cas`).
pub trait CasCells: Send + Sync {
    /// The bytes of cell `key` and their version; `None` if the cell does not exist.
    fn load(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Write `bytes` to `key` if its version is still `version` (0: the cell is new).
    fn store(&self, key: &str, bytes: &[u8], version: u32) -> CasWrite;
}

/// How often an update retries after losing a race before it gives up. Races last as long
/// as a few arithmetic steps on another worker, so a handful of retries always suffices in
/// practice; the bound only keeps a broken host from spinning a worker.
const MAX_CAS_ATTEMPTS: usize = 64;

/// Buckets in compare-and-swap cells, one cell per bucket set, under `prefix`.
#[derive(Debug)]
pub struct CasQuotas<C> {
    cells: C,
    prefix: String,
}

impl<C: CasCells> CasQuotas<C> {
    /// Buckets stored in `cells` under `prefix` + key.
    pub fn new(cells: C, prefix: &str) -> CasQuotas<C> {
        CasQuotas {
            cells,
            prefix: prefix.to_owned(),
        }
    }

    fn cell(&self, key: &str) -> String {
        let mut cell = String::with_capacity(self.prefix.len() + key.len());
        cell.push_str(&self.prefix);
        cell.push_str(key);
        cell
    }

    /// Create the cell of `key` with full buckets if it does not exist yet (at config
    /// time, so that two workers' first requests cannot both create it).
    pub fn ensure(&self, key: &str, limits: &Limits, now: Millis) {
        let cell = self.cell(key);
        if self.cells.load(&cell).is_none() {
            let _ = self
                .cells
                .store(&cell, &QuotaState::full(limits, now).encode(), 0);
        }
    }

    /// Read-modify-write of one cell; `update` answers the result and whether the state
    /// must be written. After the retry budget, or if the host refuses writes, the last
    /// computed answer stands (the request is neither lost nor blocked by a host failure).
    fn update<T>(
        &self,
        key: &str,
        limits: &Limits,
        now: Millis,
        mut update: impl FnMut(&mut QuotaState) -> (T, bool),
    ) -> T {
        let cell = self.cell(key);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (mut state, version) = match self.cells.load(&cell) {
                Some((bytes, version)) => (
                    QuotaState::decode(&bytes).unwrap_or_else(|| QuotaState::full(limits, now)),
                    version,
                ),
                None => (QuotaState::full(limits, now), 0),
            };
            let (answer, write) = update(&mut state);
            if !write || attempt >= MAX_CAS_ATTEMPTS {
                return answer;
            }
            match self.cells.store(&cell, &state.encode(), version) {
                CasWrite::Stored | CasWrite::Failed => return answer,
                CasWrite::Conflict => continue,
            }
        }
    }
}

impl<C: CasCells> QuotaStore for CasQuotas<C> {
    fn admit(
        &self,
        key: &str,
        limits: &Limits,
        debit: u64,
        now: Millis,
    ) -> Result<RateLimitInfo, Rejection> {
        // A rejection changes nothing but the refill, which any later reader recomputes
        // from the time: it need not be written.
        self.update(key, limits, now, |s| {
            let answer = s.admit(limits, debit, now);
            let write = answer.is_ok();
            (answer, write)
        })
    }

    fn settle(&self, key: &str, limits: &Limits, pre_debit: u64, actual: u64, now: Millis) {
        self.update(key, limits, now, |s| {
            s.settle(limits, pre_debit, actual, now);
            ((), true)
        });
    }
}

#[cfg(test)]
mod tests;
