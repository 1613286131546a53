//! A pool's view of the decoded snapshot: which record belongs to which of its endpoints,
//! rebuilt when the pool first sees a new snapshot generation, with the prefix LRU
//! capacities that follow each endpoint's scraped KV capacity, and the report of the
//! pool's endpoints the snapshot lacks when that set changed.

use scheduler_core::scheduling::candidates::SnapshotRecord;
use scheduler_core::snapshot::{EndpointSample, Snapshot};

use super::PoolId;
use crate::picker::plan::UnscrapedReport;
use crate::picker::pool::PoolState;

/// An endpoint's record: `index` in the snapshot's list, if mapped.
pub(super) fn record_of<'a>(
    samples: Option<&'a [EndpointSample]>,
    index: Option<usize>,
) -> SnapshotRecord<'a> {
    match samples {
        None => SnapshotRecord::NoSnapshot,
        Some(list) => index
            .and_then(|i| list.get(i))
            .map_or(SnapshotRecord::Missing, SnapshotRecord::Present),
    }
}

/// Map each endpoint of `state` to its record in `snapshot` and apply LRU capacities;
/// the report to queue when the set of endpoints missing from it changed (or on the first
/// snapshot the pool sees).
pub(super) fn reindex(
    pool: PoolId,
    state: &mut PoolState,
    snapshot: &Snapshot,
) -> Option<UnscrapedReport> {
    let samples = &snapshot.endpoints;
    let mut missing = Vec::new();
    for (i, address) in state.endpoints.iter().enumerate() {
        let found = samples.iter().position(|s| &s.address == address);
        if let Some(slot) = state.sample_of.get_mut(i) {
            *slot = found;
        }
        if found.is_none() {
            missing.push(i);
        }
        let metrics = found
            .and_then(|f| samples.get(f))
            .and_then(|s| s.metrics.as_ref());
        let cap = state.scheduler.lru_capacity_for(metrics);
        if let Some(applied) = state.capacity.get_mut(i) {
            if *applied != Some(cap) {
                state.prefix.set_capacity(address, cap);
                *applied = Some(cap);
            }
        }
    }
    if state.reported_missing.as_ref() == Some(&missing) {
        return None;
    }
    let endpoints = missing
        .iter()
        .filter_map(|i| state.endpoints.get(*i).cloned())
        .collect();
    state.reported_missing = Some(missing);
    Some(UnscrapedReport { pool, endpoints })
}
