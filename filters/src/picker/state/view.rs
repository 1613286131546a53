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

/// Map each endpoint slot of `state` to its record in `snapshot` and apply LRU
/// capacities; the report to queue when what it reports changed (or on the first snapshot
/// the pool sees): the static endpoints missing from the snapshot (a followed cluster's
/// new members are scraped within a round, so they are not reported), the member count,
/// and `cluster_missing`.
pub(super) fn reindex(
    pool: PoolId,
    state: &mut PoolState,
    snapshot: &Snapshot,
    cluster_missing: bool,
) -> Option<UnscrapedReport> {
    let samples = &snapshot.endpoints;
    let by_address: std::collections::HashMap<&str, usize> = samples
        .iter()
        .enumerate()
        .rev()
        .map(|(i, s)| (s.address.as_str(), i))
        .collect();
    let mut missing = Vec::new();
    for (i, address) in state.endpoints.iter().enumerate() {
        let member = state.member.get(i).copied().unwrap_or(false);
        let found = by_address.get(address.as_str()).copied().filter(|_| member);
        if let Some(slot) = state.sample_of.get_mut(i) {
            *slot = found;
        }
        if !member {
            continue;
        }
        if found.is_none() && !state.follows {
            missing.push(i);
        }
        let sample = found.and_then(|f| samples.get(f));
        let metrics = sample.and_then(|s| s.metrics.as_ref());
        if let (true, Some(sample), Some(batch)) =
            (state.learns_batch, sample, state.batch.get_mut(i))
        {
            batch.observe(
                sample.scraped_at,
                metrics.and_then(|m| m.waiting),
                metrics.and_then(|m| m.running),
            );
        }
        let cap = state.scheduler.lru_capacity_for(metrics);
        if let Some(applied) = state.capacity.get_mut(i) {
            if *applied != Some(cap) {
                state.prefix.set_capacity(address, cap);
                *applied = Some(cap);
            }
        }
    }
    let members = super::members::count(state);
    let reported = (missing, members, cluster_missing);
    if state.reported_missing.as_ref() == Some(&reported) {
        return None;
    }
    let endpoints = reported
        .0
        .iter()
        .filter_map(|i| state.endpoints.get(*i).cloned())
        .collect();
    state.reported_missing = Some(reported);
    Some(UnscrapedReport {
        pool,
        endpoints,
        members,
        cluster_missing,
    })
}
