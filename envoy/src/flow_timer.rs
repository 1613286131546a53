//! The timer of the process's flow-control queues: a thread per picker state with flow
//! control, every [`TICK`], expires the requests whose TTL passed and dispatches what a
//! new snapshot or a lease dropped without an end hook freed.
//!
//! Requests that end dispatch the next ones themselves (on their own worker, right after
//! giving their capacity back); this thread is for what no request end brings. It touches
//! no Envoy API: the verdicts it delivers wake each request through Envoy's per-stream
//! scheduler, which resumes it on its own worker. It holds the state weakly and ends with
//! it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use infergate_filters::host::{SnapshotFetch, SnapshotSource, SnapshotVersion};
use infergate_filters::picker::SharedPicker;

use crate::adapter::wall_clock;

/// How often the queues are looked at: a TTL ends at most this late.
pub const TICK: Duration = Duration::from_millis(10);

/// The process's published snapshot, read outside any stream (this timer, the KV-event
/// thread's targets).
pub(crate) struct ProcessSnapshot;

impl SnapshotSource for ProcessSnapshot {
    fn snapshot_if_changed(&self, known: Option<SnapshotVersion>) -> SnapshotFetch {
        crate::shared::SNAPSHOT.fetch_if_changed(known)
    }
}

/// Start the timer of `state` if any of its pools has flow control.
pub fn start(state: &Arc<SharedPicker>) {
    if !state.state().has_flow_control() {
        return;
    }
    let weak: Weak<SharedPicker> = Arc::downgrade(state);
    let spawned = std::thread::Builder::new()
        .name("infergate-flow".into())
        .spawn(move || {
            while let Some(state) = weak.upgrade() {
                let shared = state.state();
                shared.refresh_snapshot(&ProcessSnapshot);
                shared.run_flow_control(wall_clock().0);
                drop(state);
                std::thread::sleep(TICK);
            }
        });
    if let Err(e) = spawned {
        crate::log::error(&format!(
            "infergate: flow control: no timer thread ({e}): queued requests wait for a \
             request's end to be dispatched, and TTLs are not enforced"
        ));
    }
}
