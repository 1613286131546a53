//! The metrics scraper, hosted by the HTTP filter configs that carry it (no bootstrap
//! extension: Istio never installs one), driven by `infergate_filters::scraper::Scraper`.
//!
//! **Where it comes from.** A `picker` filter config (or the `picker` part of a `gateway`
//! config) may carry `"scraper": {...}`, the scraper's JSON (a `role` in it is ignored). The
//! filter takes it out before it reads the picker config and calls [`host`] from its
//! `config_new`, on the main thread. Every config that carries a scraper is one of its
//! *hosts*; the configs carrying the same scraper JSON (router and picker filters, several
//! listeners, an ECDS update that replaces a config) share **one running scraper per
//! process**, keyed by that JSON's text.
//!
//! **How it runs.** The oldest live host is the active one. A thread per running scraper
//! (the *ticker*) sleeps the scrape period and commits an event on the active host's config
//! scheduler (`http_filter_config_scheduler_commit`); Envoy then calls
//! `on_http_filter_config_scheduled` on the main thread, where [`on_scheduled`] runs one
//! tick inside [`crate::guard::catch`]: the callouts go out through
//! `http_filter_config_http_callout` on the active host's config, and each answer comes back
//! in `on_http_filter_config_http_callout_done` ([`on_callout_done`]), which feeds the
//! scraper; it publishes the encoded snapshot to the process-wide slot
//! ([`crate::shared::SNAPSHOT`]) the pickers read. The first tick is committed at once; a
//! callout before the server has initialized its clusters fails with `ClusterNotFound`,
//! which costs one failed round. A tick that panics (contained, logged and counted as
//! `infergate.scraper.tick_failures`) costs one round, never the scraping itself: the
//! ticker does not depend on the tick.
//!
//! **Hand-over.** Envoy destroys a config when the last user lets go of it (an ECDS update,
//! a listener drained), on whichever thread that is, and cancels the config's pending
//! callouts without answering them. When the active host goes, the next live host takes
//! over at once: the scraper forgets the callouts the old host will never answer (the new
//! host's callout ids may reuse theirs), and the ticker commits a tick on the new host's
//! scheduler right away, so no more than one tick is missed. When the last host goes, the
//! ticker is stopped and joined, and the scraper is dropped.
//!
//! **No use after free.** A host's scheduler is deleted only once no thread can commit on
//! it: the ticker commits only while it holds its slot's lock, and a scheduler leaves that
//! slot (under the lock) before it is deleted.
//!
//! Stats (`infergate.scraper.*`) are defined on every host's config in its `config_new`
//! (Envoy allows no definition later) and updated on the active host's: stats of one name
//! are one stat in Envoy's store, so they carry on across a hand-over.
//!
//! Several distinct scraper configs may run at once (an update that changes the scraper
//! overlaps the config it replaces); they publish into the one process snapshot, so a
//! process is meant to carry one scraper config, and a second one is logged.

use std::cell::Cell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use infergate_filters::host::{
    CalloutOutcome, CalloutRequest, CalloutToken, Clock, ClusterMembership, HostError, HttpCallout,
    SnapshotSink, Stats,
};
use infergate_filters::scraper::Scraper;
use infergate_filters::stats::{StatKey, StatKind};
use scheduler_core::types::Millis;

use crate::abi::callbacks as cb;
use crate::abi::{
    EnvoyBuffer, EnvoyHttpHeader, HttpFilterConfigEnvoyPtr, HttpFilterConfigSchedulerPtr,
    ModuleBuffer, ModuleHttpHeader, CALLOUT_INIT_SUCCESS, CALLOUT_SUCCESS,
};
use crate::filter::FilterConfigHandle;
use crate::flush::ConfigMetrics;
use crate::stats::{MetricSink, StatsRegistry};

/// The event id of a tick (the only event the scraper's schedulers carry).
pub const TICK_EVENT: u64 = 1;

/// A filter config's membership among its scraper's hosts; dropping it (with the config)
/// leaves, handing the scraper over or stopping it.
#[derive(Debug)]
pub struct Hosting {
    key: String,
    host: u64,
}

impl Drop for Hosting {
    fn drop(&mut self) {
        leave(&self.key, self.host);
    }
}

/// Takes the scraper's JSON out of a picker config (`scraper`), if it carries one.
pub fn take_scraper(value: &mut serde_json::Value) -> Option<serde_json::Value> {
    value.as_object_mut()?.remove("scraper")
}

/// A config pointer Envoy handed us. Envoy keeps it alive until the config's destroy hook,
/// which removes its host (and with it this copy) first.
#[derive(Clone, Copy, Debug)]
struct ConfigPtr(HttpFilterConfigEnvoyPtr);
// SAFETY: an address only; it is passed to Envoy callbacks on the main thread, as long as the
// config lives (see above).
unsafe impl Send for ConfigPtr {}

/// A config scheduler we own (see the module doc for when it is deleted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SchedulerPtr(HttpFilterConfigSchedulerPtr);
// SAFETY: Envoy's scheduler is made to be committed on from any thread; deletion is ordered
// by the ticker slot's lock (module doc).
unsafe impl Send for SchedulerPtr {}

/// One config hosting a scraper.
struct Host {
    id: u64,
    envoy: ConfigPtr,
    scheduler: SchedulerPtr,
    /// The scraper's stats, defined on this config.
    stats: StatsRegistry,
}

impl Drop for Host {
    fn drop(&mut self) {
        // SAFETY: our scheduler, deleted exactly once (the host is dropped once), and by then
        // out of the ticker's slot (`leave` switches the ticker before dropping the host, and
        // a scraper's last host is dropped after its ticker was joined).
        unsafe {
            cb::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.scheduler.0)
        };
    }
}

/// The ticker thread's shared slot.
struct TickerSlot {
    /// The active host's scheduler (`None` once stopping).
    scheduler: Option<SchedulerPtr>,
    /// Commit a tick without waiting out the period (start, hand-over).
    now: bool,
    stop: bool,
}

struct TickerShared {
    slot: Mutex<TickerSlot>,
    wake: Condvar,
}

impl TickerShared {
    fn lock(&self) -> MutexGuard<'_, TickerSlot> {
        // Every update is a plain assignment: a poisoned lock is still consistent.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The thread that commits one tick per period on the active host's scheduler.
struct Ticker {
    shared: Arc<TickerShared>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Starts the thread; its first tick is committed at once.
    fn start(scheduler: SchedulerPtr, period_ms: u64) -> Result<Ticker, String> {
        let shared = Arc::new(TickerShared {
            slot: Mutex::new(TickerSlot {
                scheduler: Some(scheduler),
                now: true,
                stop: false,
            }),
            wake: Condvar::new(),
        });
        let period = Duration::from_millis(period_ms.max(1));
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("infergate-scrape".into())
                .spawn(move || tick_loop(&shared, period))
                .map_err(|e| format!("scraper: no ticker thread: {e}"))?
        };
        Ok(Ticker {
            shared,
            thread: Some(thread),
        })
    }

    /// Points the ticker at another scheduler and has it commit a tick there at once.
    fn switch(&self, scheduler: SchedulerPtr) {
        let mut slot = self.shared.lock();
        slot.scheduler = Some(scheduler);
        slot.now = true;
        drop(slot);
        self.shared.wake.notify_all();
    }
}

impl Drop for Ticker {
    /// Stops the thread and waits for it: afterwards nothing commits on any scheduler.
    fn drop(&mut self) {
        {
            let mut slot = self.shared.lock();
            slot.stop = true;
            slot.scheduler = None;
        }
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                crate::log::error("infergate: scraper ticker thread panicked");
            }
        }
    }
}

fn tick_loop(shared: &TickerShared, period: Duration) {
    let mut slot = shared.lock();
    loop {
        if !slot.now {
            let deadline = Instant::now() + period;
            while !slot.stop && !slot.now {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                slot = shared
                    .wake
                    .wait_timeout(slot, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        }
        if slot.stop {
            return;
        }
        slot.now = false;
        if let Some(scheduler) = slot.scheduler {
            // SAFETY: the scheduler is in the slot, and we hold the slot's lock: it cannot be
            // deleted before we let go (module doc). Committing is allowed from any thread.
            unsafe {
                cb::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
                    scheduler.0,
                    TICK_EVENT,
                )
            };
        }
    }
}

/// One running scraper and its hosts.
struct Running {
    key: String,
    // Field order is drop order: the ticker is joined before the hosts delete their
    // schedulers.
    ticker: Ticker,
    /// Live hosts, oldest first; the first is the active one.
    hosts: Vec<Host>,
    scraper: Scraper,
    /// The scraper's entry in the process's config registry (see `crate::shared`).
    _registration: crate::shared::Registration,
    /// Test builds: which tick to make panic.
    #[cfg(any(test, feature = "panic-injection"))]
    tick_panic: crate::panic_injection::TickPanic,
}

/// The process's running scrapers.
#[derive(Default)]
struct Scrapers {
    next_host: u64,
    running: Vec<Running>,
}

/// The process's scrapers. Unit tests run on many threads at once, each acting as its own
/// Envoy process, so under `cfg(test)` every thread gets its own.
#[cfg(not(test))]
fn scrapers() -> &'static Mutex<Scrapers> {
    static SCRAPERS: Mutex<Scrapers> = Mutex::new(Scrapers {
        next_host: 0,
        running: Vec::new(),
    });
    &SCRAPERS
}

/// See the non-test twin.
#[cfg(test)]
fn scrapers() -> &'static Mutex<Scrapers> {
    thread_local! {
        static SCRAPERS: &'static Mutex<Scrapers> = Box::leak(Box::default());
    }
    SCRAPERS.with(|s| *s)
}

thread_local! {
    /// Set while this thread runs scraper code under the registry's lock, so a hook Envoy
    /// would re-enter synchronously from a callout is dropped instead of deadlocking.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on the registry (locked), unless this thread is already inside it.
fn with_scrapers<R>(f: impl FnOnce(&mut Scrapers) -> R) -> Option<R> {
    if INSIDE.with(Cell::get) {
        return None;
    }
    // A panic is caught inside (`guard::catch` around the tick) before it can unwind through
    // the guard; should one poison the lock anyway, the scrapers are still whole values.
    let mut scrapers = scrapers().lock().unwrap_or_else(PoisonError::into_inner);
    INSIDE.with(|i| i.set(true));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            INSIDE.with(|i| i.set(false));
        }
    }
    let _reset = Reset;
    Some(f(&mut scrapers))
}

/// Makes the config being created (`envoy`, inside its `config_new`) a host of the scraper
/// `value` configures: the scraper starts if no live config carries the same JSON yet.
pub fn host(envoy: &mut FilterConfigHandle, value: serde_json::Value) -> Result<Hosting, String> {
    let mut value = match value {
        value @ serde_json::Value::Object(_) => value,
        _ => return Err("`scraper` must be an object".into()),
    };
    if let Some(map) = value.as_object_mut() {
        map.remove("role");
    }
    let key = value.to_string();
    #[cfg(any(test, feature = "panic-injection"))]
    let tick_panic = crate::panic_injection::TickPanic::from_config(&mut value)?;
    let mut scraper = Scraper::from_json(value)?;
    let stats = StatsRegistry::define(envoy, &scraper.stat_keys(), false);
    // SAFETY: the live config pointer of the running config_new hook (main thread); Envoy
    // already shares the config, so its scheduler can hold it weakly.
    let scheduler =
        unsafe { cb::envoy_dynamic_module_callback_http_filter_config_scheduler_new(envoy.raw()) };
    if scheduler.is_null() {
        return Err("scraper: Envoy made no config scheduler".into());
    }
    let period_ms = scraper.tick_period_ms();
    with_scrapers(|scrapers| {
        let id = scrapers.next_host;
        scrapers.next_host = id.wrapping_add(1);
        let host = Host {
            id,
            envoy: ConfigPtr(envoy.raw()),
            scheduler: SchedulerPtr(scheduler),
            stats,
        };
        if let Some(running) = scrapers.running.iter_mut().find(|r| r.key == key) {
            running.hosts.push(host);
            return Ok(id);
        }
        // On an error below, `host` is dropped and deletes its scheduler, never committed on.
        let registration =
            crate::shared::config_registry().register_scraper(scraper.endpoints())?;
        let ticker = Ticker::start(host.scheduler, period_ms)?;
        if !scrapers.running.is_empty() {
            // An update that changed the scraper: the running one's snapshot stays until
            // this one has scraped every endpoint, rather than an empty one.
            scraper.hold_first_publish();
            crate::log::error(&format!(
                "infergate: scraper: {} scraper configs run at once and publish into one \
                 snapshot; every filter config of a process should carry the same scraper",
                scrapers.running.len() + 1
            ));
        }
        scrapers.running.push(Running {
            key: key.clone(),
            ticker,
            hosts: vec![host],
            scraper,
            _registration: registration,
            #[cfg(any(test, feature = "panic-injection"))]
            tick_panic,
        });
        Ok(id)
    })
    .unwrap_or_else(|| Err("scraper: a config was created from inside a scraper hook".into()))
    .map(|host| Hosting { key, host })
}

/// Host `host` of the scraper `key` goes (its config is being destroyed, on any thread).
fn leave(key: &str, host: u64) {
    let left = with_scrapers(|scrapers| {
        let at = scrapers.running.iter().position(|r| r.key == key)?;
        let running = scrapers.running.get_mut(at)?;
        let index = running.hosts.iter().position(|h| h.id == host)?;
        let gone = running.hosts.remove(index);
        if running.hosts.is_empty() {
            // Joins the ticker, then drops the scraper (the last host already left).
            drop(scrapers.running.remove(at));
        } else if index == 0 {
            if let Some(next) = running.hosts.first() {
                running.scraper.forget_outstanding();
                running.ticker.switch(next.scheduler);
            }
        }
        // Out of the ticker's slot by now (switched, or the ticker joined).
        Some(gone)
    });
    drop(left);
}

/// The event `event_id` Envoy ran on the main thread for the config whose hosting this is.
pub fn on_scheduled(hosting: &Hosting, event_id: u64) {
    if event_id != TICK_EVENT {
        return;
    }
    let _ = with_scrapers(|scrapers| {
        let Some(running) = scrapers.running.iter_mut().find(|r| r.key == hosting.key) else {
            return;
        };
        // A tick committed on a host before the hand-over is run by the active host only.
        let Some(active) = running.hosts.first().filter(|h| h.id == hosting.host) else {
            return;
        };
        let mut host = ScraperHost {
            envoy: active.envoy.0,
            stats: &active.stats,
        };
        let scraper = &mut running.scraper;
        #[cfg(any(test, feature = "panic-injection"))]
        let tick_panic = &running.tick_panic;
        let ticked = crate::guard::catch("scraper tick", || {
            #[cfg(any(test, feature = "panic-injection"))]
            tick_panic.tick();
            scraper.on_tick(&mut host);
        });
        if ticked.is_none() {
            scraper.count_tick_failure(&mut host);
        }
    });
}

/// A callout of the config whose hosting this is finished; `headers`/`body` are Envoy's
/// views, valid for the hook.
pub fn on_callout_done(
    hosting: &Hosting,
    callout_id: u64,
    result: u32,
    headers: &[EnvoyHttpHeader],
    body: &[EnvoyBuffer],
) {
    let _ = with_scrapers(|scrapers| {
        let Some(running) = scrapers.running.iter_mut().find(|r| r.key == hosting.key) else {
            return;
        };
        // Only the active host has callouts the scraper waits for.
        let Some(active) = running.hosts.first().filter(|h| h.id == hosting.host) else {
            return;
        };
        let scraper = &mut running.scraper;
        let outcome = if result == CALLOUT_SUCCESS {
            let status = headers
                .iter()
                .find_map(|h| {
                    // SAFETY: Envoy's header views are valid for the duration of this hook.
                    let (k, v) = unsafe { h.as_pair() };
                    (k == b":status").then(|| std::str::from_utf8(v).ok()?.parse::<u16>().ok())?
                })
                .unwrap_or(0);
            // The chunks' lengths are known before anything is copied: a page over
            // `maxMetricsPageBytes` is refused without a copy.
            let body_bytes = body
                .iter()
                .fold(0usize, |sum, chunk| sum.saturating_add(chunk.length));
            scraper.callout_outcome(status, body_bytes, || {
                let mut bytes = Vec::with_capacity(body_bytes);
                for chunk in body {
                    // SAFETY: Envoy's body views are valid for the duration of this hook.
                    bytes.extend_from_slice(unsafe { chunk.as_bytes() });
                }
                bytes
            })
        } else {
            CalloutOutcome::Failed
        };
        let mut host = ScraperHost {
            envoy: active.envoy.0,
            stats: &active.stats,
        };
        scraper.on_callout_done(&mut host, CalloutToken(callout_id), outcome);
    });
}

/// The scraper's host capabilities on the active host's config (main thread).
struct ScraperHost<'a> {
    envoy: HttpFilterConfigEnvoyPtr,
    stats: &'a StatsRegistry,
}

impl HttpCallout for ScraperHost<'_> {
    fn dispatch_callout(&mut self, request: &CalloutRequest) -> Result<CalloutToken, HostError> {
        let mut headers: Vec<ModuleHttpHeader> = request
            .headers
            .iter()
            .map(|(k, v)| ModuleHttpHeader::new(k.as_bytes(), v.as_bytes()))
            .collect();
        let mut id = 0u64;
        // SAFETY: main thread, live config pointer (its host is registered); `headers` borrows
        // `request` for the call and Envoy copies everything it keeps; `id` is writable.
        let result = unsafe {
            cb::envoy_dynamic_module_callback_http_filter_config_http_callout(
                self.envoy,
                &mut id,
                ModuleBuffer::from_bytes(request.cluster.as_bytes()),
                headers.as_mut_ptr(),
                headers.len(),
                ModuleBuffer::from_bytes(&request.body),
                request.timeout_ms,
            )
        };
        if result == CALLOUT_INIT_SUCCESS {
            Ok(CalloutToken(id))
        } else {
            Err(HostError::Failed(format!(
                "callout not started (init result {result})"
            )))
        }
    }
}

impl Clock for ScraperHost<'_> {
    fn now(&self) -> Millis {
        crate::adapter::wall_clock()
    }
}

impl Stats for ScraperHost<'_> {
    fn counter_add(&mut self, key: &StatKey, delta: u64) {
        if let Some((id, labels)) = self.stats.resolve(StatKind::Counter, key) {
            ConfigMetrics::new(self.envoy).counter_add(id, &labels, delta);
        }
    }
    fn histogram_record(&mut self, _key: &StatKey, _value: u64) {
        // The scraper records no histogram; a key reaching here is dropped like any unknown.
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        if let Some((id, labels)) = self.stats.resolve(StatKind::Gauge, key) {
            ConfigMetrics::new(self.envoy).gauge_set(id, &labels, value);
        }
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        if let Some((id, labels)) = self.stats.resolve(StatKind::Gauge, key) {
            ConfigMetrics::new(self.envoy).gauge_add(id, &labels, delta);
        }
    }
    fn log_error(&mut self, message: &str) {
        crate::log::error(message);
    }
}

impl SnapshotSink for ScraperHost<'_> {
    fn publish_snapshot(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        crate::shared::SNAPSHOT.publish(bytes.to_vec());
        Ok(())
    }
}

impl ClusterMembership for ScraperHost<'_> {
    /// The pool cluster's hosts and health from the `infergate-membership` LB policy's
    /// registry, as its instances last saw them (see [`crate::membership`]).
    fn cluster_members(&self, cluster: &str) -> Option<Vec<scheduler_core::snapshot::Member>> {
        crate::membership::REGISTRY.members(cluster)
    }
}

/// The scrapers running in this (test) process: each one's host ids, active first.
#[cfg(test)]
pub(crate) fn running_hosts() -> Vec<Vec<u64>> {
    with_scrapers(|s| {
        s.running
            .iter()
            .map(|r| r.hosts.iter().map(|h| h.id).collect())
            .collect()
    })
    .unwrap_or_default()
}
