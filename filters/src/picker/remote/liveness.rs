//! The owner's view of which workers are alive, and the end of the leases of those that
//! are not.
//!
//! A lease goes back when its request ends, by the worker that holds it. A worker VM that
//! dies (Envoy reloads a VM after a trap; a configuration update destroys a root whose
//! messages were still batched) never sends those releases, and the owner would count its
//! requests in flight forever. So liveness is per worker, never per request:
//!
//! - every message a worker sends with its reply queue (a pick, a release, a cancel) says
//!   it is alive; a worker that sent none for [`HEARTBEAT_MS`] sends an empty release at
//!   its tick (a busy worker's picks cost no message of their own);
//! - at its tick, the owner ends every lease of a holder it has not heard from for
//!   [`HOLDER_TTL_MS`], like a release (gauges lowered, flow capacity given back), and
//!   takes the holder's queued picks out of their queues. Each expired lease is counted in
//!   [`LEASES_EXPIRED`]. A request, however long, keeps its lease as long as its worker
//!   lives.
//!
//! A holder that was only stalled longer than the TTL loses its leases early: the counts
//! read low until its requests end, and its late releases are unknown ids, ignored.

use std::collections::HashMap;

use super::{Answers, Owner, Released, StateKey};
use crate::host::{Clock, SnapshotSource, Stats};
use crate::stats::StatKey;

/// How long a worker stays silent at most: past it, its next tick sends an empty release.
pub const HEARTBEAT_MS: u64 = 400;

/// How long the owner keeps the leases of a holder it does not hear from: several
/// heartbeats, so only a dead (or badly stalled) worker loses them.
pub const HOLDER_TTL_MS: u64 = 2_000;

/// Counter of leases the owner ended because their holder went silent.
pub const LEASES_EXPIRED: &str = "infergate.owner.leases_expired";

/// When the owner last heard from each holder (a worker's reply queue).
#[derive(Debug, Default)]
pub(super) struct Holders {
    heard_ms: HashMap<u32, u64>,
}

impl Holders {
    /// `holder` spoke at `now_ms`.
    pub(super) fn heard(&mut self, holder: u32, now_ms: u64) {
        self.heard_ms.insert(holder, now_ms);
    }

    /// Forget and return the holders silent for [`HOLDER_TTL_MS`] at `now_ms`.
    fn take_silent(&mut self, now_ms: u64) -> Vec<u32> {
        let silent: Vec<u32> = self
            .heard_ms
            .iter()
            .filter(|(_, &heard)| now_ms.saturating_sub(heard) >= HOLDER_TTL_MS)
            .map(|(&holder, _)| holder)
            .collect();
        for holder in &silent {
            self.heard_ms.remove(holder);
        }
        silent
    }
}

impl Owner {
    /// End every lease, and cancel every queued pick, of the holders silent for
    /// [`HOLDER_TTL_MS`]; the answers for the requests their freed capacity dispatches go
    /// to `answers`.
    pub(super) fn expire_silent_holders<H: SnapshotSource + Stats + Clock + ?Sized>(
        &mut self,
        host: &mut H,
        answers: &mut Answers,
    ) {
        let silent = self.holders.take_silent(host.now().0);
        if silent.is_empty() {
            return;
        }
        let mut expired = 0u64;
        let keys: Vec<StateKey> = self.states.keys().copied().collect();
        for key in keys {
            let Some(state) = self.states.get(&key) else {
                continue;
            };
            let queued: Vec<(u32, u64)> = state
                .waiting
                .keys()
                .filter(|(queue, _)| silent.contains(queue))
                .copied()
                .collect();
            let leases: Vec<Released> = state
                .leases
                .iter()
                .filter(|(_, kept)| silent.contains(&kept.holder))
                .map(|(&id, _)| Released::lease(id))
                .collect();
            // Out of the queues first, so the capacity freed below goes to the living.
            for (queue, ticket) in queued {
                self.cancel(host, key, queue, ticket);
            }
            expired += leases.len() as u64;
            self.release_all(host, key, &leases, answers);
        }
        if expired > 0 {
            host.counter_add(&StatKey::new(LEASES_EXPIRED, &[]), expired);
            host.log_error(&format!(
                "infergate: picker state owner: {expired} lease(s) of {} worker(s) silent for \
                 {HOLDER_TTL_MS} ms expired (the worker's VM died or stalled)",
                silent.len()
            ));
        }
    }
}
