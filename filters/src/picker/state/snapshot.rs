//! The picker's decoded metric snapshot, behind its own small lock.
//!
//! It is read from the host only when the host's version changed, decoded only when the
//! header says the bytes did, and handed to the pools as an `Arc` with a generation
//! number (1 for the first decoded snapshot, then one more per new content, also kept in
//! an atomic): a pool whose generation is current picks from the `Arc` it keeps, after
//! one atomic load; one that is behind takes the new `Arc` and rebuilds its view (which
//! record is whose). Decoding reuses the buffers of the snapshot before last whenever no
//! pool still holds it, so a stable pool re-decodes without allocating. The lock is never
//! held while a pool's lock is taken, so it orders after every pool lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use scheduler_core::snapshot::{decode_into, read_header, Snapshot, SnapshotHeader};

use super::SnapshotRefresh;
use crate::host::{SnapshotFetch, SnapshotSource, SnapshotVersion};

/// The last decoded snapshot and how it was obtained.
#[derive(Debug, Default)]
struct Slot {
    version: Option<SnapshotVersion>,
    header: Option<SnapshotHeader>,
    current: Option<Arc<Snapshot>>,
    /// The buffers of the snapshot before `current`, decoded into next time.
    spare: Option<Arc<Snapshot>>,
    generation: u64,
}

/// The shared decoded snapshot (see the module doc).
#[derive(Debug, Default)]
pub(super) struct SnapshotSlot {
    slot: Mutex<Slot>,
    /// `slot.generation`, readable without the lock (a pool up to date skips it).
    generation: AtomicU64,
    /// `slot.version`, readable without the lock ([`encode_version`]).
    known: AtomicU64,
}

/// A known version as an atomic's value: 0 for none, else the version + 1 (the version
/// `u64::MAX` reads as none, which only costs a fetch that the slot then finds known).
fn encode_version(version: SnapshotVersion) -> u64 {
    version.0.wrapping_add(1)
}

fn version_of(value: u64) -> Option<SnapshotVersion> {
    value.checked_sub(1).map(SnapshotVersion)
}

/// A decoded snapshot and its generation.
pub(super) type CurrentSnapshot = (u64, Option<Arc<Snapshot>>);

impl SnapshotSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        // Every update is a whole step (the swap happens after a successful decode).
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Read the host's snapshot if its version changed; decode it if its content did.
    /// Returns what happened and whether a new generation exists. The common case, an
    /// unchanged version, takes no lock: the known version is an atomic, and only a
    /// changed one is taken to the slot (where a thread that lost the race to another
    /// finds it already known).
    pub(super) fn refresh<H: SnapshotSource + ?Sized>(&self, host: &H) -> (SnapshotRefresh, bool) {
        let known = version_of(self.known.load(Ordering::Acquire));
        let (version, bytes) = match host.snapshot_if_changed(known) {
            SnapshotFetch::Missing | SnapshotFetch::Unchanged => {
                return (SnapshotRefresh::Unchanged, false)
            }
            SnapshotFetch::Changed { version, bytes } => (version, bytes),
        };
        let mut slot = self.lock();
        if slot.version == Some(version) {
            return (SnapshotRefresh::Unchanged, false);
        }
        slot.version = Some(version);
        // `known` is published only once this version's snapshot is in place (or known to
        // add nothing): a thread that sees it skips the host and takes `current`, which must
        // then be this version's. Published before the decode, a pick racing the very
        // first snapshot found "unchanged" and no snapshot at all, and answered 503.
        let known = encode_version(version);
        let Ok(header) = read_header(&bytes) else {
            self.known.store(known, Ordering::Release);
            return (SnapshotRefresh::Undecodable, false);
        };
        if slot.header == Some(header) {
            self.known.store(known, Ordering::Release);
            return (SnapshotRefresh::Updated, false);
        }
        let mut spare = slot
            .spare
            .take()
            .and_then(|mut s| Arc::get_mut(&mut s).is_some().then_some(s))
            .unwrap_or_default();
        let Some(target) = Arc::get_mut(&mut spare) else {
            self.known.store(known, Ordering::Release);
            return (SnapshotRefresh::Undecodable, false);
        };
        let outcome = match decode_into(&bytes, target) {
            Ok(header) => {
                slot.header = Some(header);
                slot.spare = slot.current.replace(spare);
                slot.generation = slot.generation.saturating_add(1);
                self.generation.store(slot.generation, Ordering::Release);
                (SnapshotRefresh::Updated, true)
            }
            Err(_) => {
                slot.spare = Some(spare);
                (SnapshotRefresh::Undecodable, false)
            }
        };
        self.known.store(known, Ordering::Release);
        outcome
    }

    /// Hold the slot's lock (tests: what proceeds without it).
    #[cfg(test)]
    pub(super) fn hold(&self) -> impl Drop + '_ {
        self.lock()
    }

    /// The current generation (0 before the first decode), without the lock.
    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current snapshot and its generation (0 and `None` before the first decode).
    pub(super) fn current(&self) -> CurrentSnapshot {
        let slot = self.lock();
        (slot.generation, slot.current.clone())
    }
}
