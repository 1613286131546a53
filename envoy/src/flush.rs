//! The main-thread flush of the filter configs' buffered counters and gauges
//! (`crate::stats`): one thread for the whole process commits [`FLUSH_EVENT`] every
//! [`FLUSH_PERIOD`] on the scheduler of every filter config that buffers; Envoy then runs
//! `on_http_filter_config_scheduled` on the main thread, where the config hands its pending
//! moves to Envoy through the config-level metric callbacks ([`ConfigMetrics`]).
//!
//! Why: each metric call into Envoy from a request costs a few hundred nanoseconds (the
//! ABI crossing, and for a labelled key Envoy's stat-name build and store lookup, about
//! 2 µs), and a request makes about ten. Buffered, a request pays an atomic add per update
//! of a key known at config time (a short lock for any other), and the main thread one call
//! per metric that moved in the period. The config's last flush runs as Envoy destroys it
//! (`HttpConfig::last_flush`).
//!
//! **No use after free.** The ticker commits only while it holds the list's lock, and a
//! config's [`FlushTicks`] leaves the list under that lock before it deletes its scheduler.
//! The thread starts with the first config that buffers and then sleeps out its periods for
//! the life of the process (a module is never unloaded).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::abi::callbacks as cb;
use crate::abi::{
    HttpFilterConfigEnvoyPtr, HttpFilterConfigSchedulerPtr, LabelBuffers, MetricsResult,
    ModuleBuffer,
};
use crate::filter::FilterConfigHandle;
use crate::stats::MetricSink;

/// The event id of a flush (the scraper's tick is `crate::scraper::TICK_EVENT`).
pub const FLUSH_EVENT: u64 = 2;

/// How often the buffered counters and gauges reach Envoy: also how far Envoy's stats may
/// trail the requests.
pub const FLUSH_PERIOD: Duration = Duration::from_millis(100);

/// A config scheduler in the ticker's list.
#[derive(Clone, Copy)]
struct SchedulerPtr(HttpFilterConfigSchedulerPtr);
// SAFETY: Envoy's config scheduler is made to be committed on from any thread; deletion is
// ordered by the list's lock (module doc).
unsafe impl Send for SchedulerPtr {}

/// The schedulers the ticker commits on.
struct Ticked {
    next_id: u64,
    schedulers: Vec<(u64, SchedulerPtr)>,
    started: bool,
}

static TICKED: Mutex<Ticked> = Mutex::new(Ticked {
    next_id: 0,
    schedulers: Vec::new(),
    started: false,
});

fn ticked() -> MutexGuard<'static, Ticked> {
    // Nothing panics while holding it; a poisoned list is still a valid list.
    TICKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// One config's place in the ticker's list, for as long as the config lives.
pub struct FlushTicks {
    id: u64,
    scheduler: SchedulerPtr,
}

// SAFETY: the scheduler is only committed on (any thread) and deleted once, in `Drop`,
// after it left the ticker's list (module doc).
unsafe impl Send for FlushTicks {}
// SAFETY: `FlushTicks` has no method that touches the scheduler through `&self`.
unsafe impl Sync for FlushTicks {}

impl FlushTicks {
    /// Has the config `envoy` (during its `on_http_filter_config_new`, main thread) flushed
    /// every [`FLUSH_PERIOD`]; `None` when Envoy gave no scheduler or no thread could be
    /// started, and the config's stats then go to Envoy at once.
    pub fn start(envoy: &FilterConfigHandle) -> Option<FlushTicks> {
        // SAFETY: the live config pointer of the running config_new hook; Envoy already
        // shares the config, so its scheduler can hold it weakly.
        let raw = unsafe {
            cb::envoy_dynamic_module_callback_http_filter_config_scheduler_new(envoy.raw())
        };
        if raw.is_null() {
            return None;
        }
        #[cfg(test)]
        crate::fake_envoy::mark_flush_scheduler(raw as usize);
        let scheduler = SchedulerPtr(raw);
        let mut list = ticked();
        if !list.started {
            let spawned = std::thread::Builder::new()
                .name("infergate-flush".into())
                .spawn(tick_loop);
            if let Err(e) = spawned {
                drop(list);
                crate::log::error(&format!("infergate: no stats flush thread: {e}"));
                // SAFETY: ours, never in the list, deleted once.
                unsafe {
                    cb::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(raw)
                };
                return None;
            }
            list.started = true;
        }
        let id = list.next_id;
        list.next_id += 1;
        list.schedulers.push((id, scheduler));
        Some(FlushTicks { id, scheduler })
    }
}

impl Drop for FlushTicks {
    fn drop(&mut self) {
        ticked().schedulers.retain(|(id, _)| *id != self.id);
        // SAFETY: out of the list (the lock above was released after the removal), so the
        // ticker can no longer commit on it; deleted exactly once.
        unsafe {
            cb::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.scheduler.0)
        };
    }
}

fn tick_loop() {
    loop {
        std::thread::sleep(FLUSH_PERIOD);
        let list = ticked();
        for (_, scheduler) in &list.schedulers {
            // SAFETY: in the list, under its lock: not deleted (module doc).
            unsafe {
                cb::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
                    scheduler.0,
                    FLUSH_EVENT,
                )
            };
        }
    }
}

/// The config-level metric callbacks of one filter config (main thread, inside one of its
/// config hooks): where a flush, and the scraper, move Envoy's stats.
pub struct ConfigMetrics {
    envoy: HttpFilterConfigEnvoyPtr,
}

/// The shape every config-level metric callback shares.
type ConfigMetricCall = unsafe extern "C" fn(
    HttpFilterConfigEnvoyPtr,
    usize,
    *mut ModuleBuffer,
    usize,
    u64,
) -> MetricsResult;

impl ConfigMetrics {
    /// Metrics of config `envoy`; use only inside one of that config's main-thread hooks.
    pub fn new(envoy: HttpFilterConfigEnvoyPtr) -> ConfigMetrics {
        ConfigMetrics { envoy }
    }

    /// Calls `callback` for metric `id` with `labels` and `value`.
    fn call(&self, callback: ConfigMetricCall, id: usize, labels: &[&str], value: u64) {
        let mut raw = LabelBuffers::new(labels);
        // SAFETY: main thread, live config pointer; `raw` borrows `labels` for the call. A
        // failed stat update is ignored (best effort).
        let _ = unsafe { callback(self.envoy, id, raw.as_mut_ptr(), raw.count(), value) };
    }
}

impl MetricSink for ConfigMetrics {
    fn counter_add(&mut self, id: usize, labels: &[&str], value: u64) {
        let increment = cb::envoy_dynamic_module_callback_http_filter_config_increment_counter;
        self.call(increment, id, labels, value);
    }

    fn gauge_set(&mut self, id: usize, labels: &[&str], value: u64) {
        self.call(
            cb::envoy_dynamic_module_callback_http_filter_config_set_gauge,
            id,
            labels,
            value,
        );
    }

    fn gauge_add(&mut self, id: usize, labels: &[&str], delta: i64) {
        let callback: ConfigMetricCall = if delta >= 0 {
            cb::envoy_dynamic_module_callback_http_filter_config_increment_gauge
        } else {
            cb::envoy_dynamic_module_callback_http_filter_config_decrement_gauge
        };
        self.call(callback, id, labels, delta.unsigned_abs());
    }
}
