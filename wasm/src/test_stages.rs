//! The test stages of `filters::stages::testing` in the Wasm flavour: only a build with
//! the `test-stages` feature accepts the config key `testStages` (a list of stage names
//! the builder runs before the filter's own stages); a release build leaves the key in
//! place, so the filter's config parser refuses it as an unknown field.
//!
//! The pause stage wakes its request "from elsewhere": here a root's tick, which fires
//! each due wake from the root context (another context than the paused stream's), so the
//! stream is resumed through the same path the picker state owner's answers take.

#[cfg(not(feature = "test-stages"))]
use infergate_filters::stages::TestStages;

/// How often a root with test stages ticks to fire due wakes.
#[cfg(feature = "test-stages")]
pub const WAKE_TICK_MS: u32 = 20;

#[cfg(feature = "test-stages")]
mod enabled {
    use core::time::Duration;
    use std::cell::RefCell;

    use infergate_filters::host::Waker;
    use infergate_filters::stages::TestStages;

    use super::WAKE_TICK_MS;
    use crate::abi::hostcalls;

    thread_local! {
        /// Wakes to fire at a time (ms), in no particular order.
        static DUE: RefCell<Vec<(u64, Waker)>> = const { RefCell::new(Vec::new()) };
    }

    fn now_ms() -> u64 {
        hostcalls::current_time_nanos().unwrap_or(0) / 1_000_000
    }

    fn wake_later(waker: Waker, delay: Duration) {
        let at = now_ms().saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX));
        let _ = DUE.try_with(|d| {
            if let Ok(mut d) = d.try_borrow_mut() {
                d.push((at, waker));
            }
        });
    }

    /// Takes `testStages` out of `config`; ticks this root so due wakes fire.
    pub fn take(config: &mut serde_json::Value) -> Result<TestStages, String> {
        let stages = TestStages::take_from_config(config, wake_later)?;
        if !stages.is_empty() {
            hostcalls::set_tick_period_ms(WAKE_TICK_MS)
                .map_err(|s| format!("set_tick_period failed: {s:?}"))?;
        }
        Ok(stages)
    }

    /// Fire the wakes that are due.
    pub fn fire_due() {
        let now = now_ms();
        let due: Vec<Waker> = DUE
            .try_with(|d| {
                let Ok(mut d) = d.try_borrow_mut() else {
                    return Vec::new();
                };
                let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut *d)
                    .into_iter()
                    .partition(|(at, _)| *at <= now);
                *d = later;
                due.into_iter().map(|(_, w)| w).collect()
            })
            .unwrap_or_default();
        for waker in due {
            waker.wake();
        }
    }

    /// The request header that makes the VM elected owner trap (test builds only): how
    /// the end-to-end suite kills the owner's VM mid-load, wherever it runs (a worker's VM,
    /// or the main thread's, which no request reaches).
    pub const TRAP_OWNER_HEADER: &str = "x-infergate-test-trap-owner";

    /// The shared-data cell through which a request asks the owner to trap.
    const TRAP_OWNER_CELL: &str = "infergate.test.trap_owner";

    /// A request carrying [`TRAP_OWNER_HEADER`] asks the owner (at its next tick) to trap.
    pub fn trap_if_owner_asked() {
        let asked =
            hostcalls::header_map_value(crate::abi::MapType::HttpRequestHeaders, TRAP_OWNER_HEADER)
                .ok()
                .flatten()
                .is_some();
        if asked {
            let _ = hostcalls::set_shared_data(TRAP_OWNER_CELL, b"1", 0);
        }
    }

    /// The owner's tick: trap (the VM dies; Envoy's `FAIL_RELOAD` starts a fresh one, and
    /// another VM takes the lease over) when a request asked for it.
    pub fn trap_owner_if_asked() {
        let asked =
            matches!(hostcalls::get_shared_data(TRAP_OWNER_CELL), Ok(Some((v, _))) if v == b"1");
        if asked {
            let _ = hostcalls::set_shared_data(TRAP_OWNER_CELL, b"0", 0);
            crate::host::log(
                crate::abi::LogLevel::Warn,
                "infergate: test: trapping the owner's VM as asked",
            );
            #[cfg(target_arch = "wasm32")]
            core::arch::wasm32::unreachable();
        }
    }
}

#[cfg(feature = "test-stages")]
pub use enabled::{fire_due, take, trap_if_owner_asked, trap_owner_if_asked, TRAP_OWNER_HEADER};

/// Without the feature no request can trap the VM.
#[cfg(not(feature = "test-stages"))]
pub fn trap_if_owner_asked() {}

/// Without the feature the owner never traps.
#[cfg(not(feature = "test-stages"))]
pub fn trap_owner_if_asked() {}

/// Without the feature there are no test stages: the key stays for the parser to refuse.
#[cfg(not(feature = "test-stages"))]
pub fn take(_config: &mut serde_json::Value) -> Result<TestStages, String> {
    Ok(TestStages::none())
}

/// Without the feature nothing is ever due.
#[cfg(not(feature = "test-stages"))]
pub fn fire_due() {}
