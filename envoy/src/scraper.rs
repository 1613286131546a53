//! The metrics scraper as a bootstrap extension (`extension_name: scraper`), driven by
//! `infergate_filters::scraper::Scraper`.
//!
//! Lifecycle on Envoy's main thread:
//! - `config_new`: parse the Wasm flavour's scraper JSON, define stats, and signal init
//!   complete at once (Envoy registers the init target before calling us; readiness must not
//!   wait for model servers that may be down — stale metrics are handled by the pickers).
//! - `server_initialized`: create the timer and fire it immediately (callouts before this
//!   point fail with ClusterNotFound).
//! - `timer_fired`: re-arm first, then one scraper tick (callouts through Envoy) inside
//!   [`crate::guard::catch`]. The timer is armed before the tick runs, so a tick that panics
//!   (contained, logged and counted as `infergate.scraper.tick_failures`) costs one round,
//!   never the scraping itself: a scraper that stopped would turn every `FailClose` pool
//!   into 503s for good.
//! - `http_callout_done`: feed the answer to the scraper, which publishes the encoded snapshot
//!   to the process-wide slot ([`crate::shared::SNAPSHOT`]) the pickers read.
//! - `shutdown`: delete the timer; the hook calls Envoy's completion callback exactly once.

use std::cell::{Cell, RefCell};

use infergate_filters::host::{
    CalloutOutcome, CalloutRequest, CalloutToken, Clock, ClusterMembership, HostError, HttpCallout,
    SnapshotSink, Stats,
};
use infergate_filters::scraper::Scraper;
use infergate_filters::stats::{StatKey, StatKind};
use scheduler_core::types::Millis;

use crate::abi::callbacks as cb;
use crate::abi::{
    BootstrapConfigEnvoyPtr, BootstrapTimerModulePtr, EnvoyBuffer, EnvoyHttpHeader, LabelBuffers,
    ModuleBuffer, ModuleHttpHeader, CALLOUT_INIT_SUCCESS, CALLOUT_SUCCESS, METRICS_SUCCESS,
};
use crate::stats::{DefineMetric, StatsRegistry};

/// Our object behind `bootstrap_extension_config_module_ptr`. Main thread only.
pub struct ScraperExtension {
    envoy: BootstrapConfigEnvoyPtr,
    scraper: RefCell<Scraper>,
    stats: StatsRegistry,
    timer: Cell<Option<BootstrapTimerModulePtr>>,
    /// The tick period, ms (fixed by the config; kept here so re-arming never needs the
    /// scraper, which a panicking tick may leave borrowed mid-unwind).
    period_ms: u64,
    /// This config's entry in the process's config registry (see `crate::shared`).
    _registration: crate::shared::Registration,
    /// Test builds: which tick to make panic.
    #[cfg(any(test, feature = "panic-injection"))]
    tick_panic: crate::panic_injection::TickPanic,
}

/// Defines metrics on the bootstrap config during `config_new`.
struct BootstrapDefiner {
    envoy: BootstrapConfigEnvoyPtr,
}

impl DefineMetric for BootstrapDefiner {
    fn define(&mut self, kind: StatKind, name: &str, labels: &[&str]) -> Option<usize> {
        let mut raw_labels = LabelBuffers::new(labels);
        let (ptr, count) = (raw_labels.as_mut_ptr(), raw_labels.count());
        let name = ModuleBuffer::from_bytes(name.as_bytes());
        let mut id = 0usize;
        // SAFETY: `envoy` is the live config pointer of the current config_new hook (main
        // thread); buffers borrow locals for the call; `id` is writable.
        let result = unsafe {
            match kind {
                StatKind::Counter => {
                    cb::envoy_dynamic_module_callback_bootstrap_extension_config_define_counter(
                        self.envoy, name, ptr, count, &mut id,
                    )
                }
                StatKind::Gauge => {
                    cb::envoy_dynamic_module_callback_bootstrap_extension_config_define_gauge(
                        self.envoy, name, ptr, count, &mut id,
                    )
                }
                // The scraper records no histogram (flow control's is the filters').
                StatKind::Histogram => return None,
            }
        };
        (result == METRICS_SUCCESS).then_some(id)
    }
}

impl ScraperExtension {
    /// Parses `config`, defines stats on `envoy` and signals init complete.
    pub(crate) fn new(
        envoy: BootstrapConfigEnvoyPtr,
        config: &[u8],
    ) -> Result<ScraperExtension, String> {
        #[allow(unused_mut)]
        let mut value = crate::router::config_json(config)?;
        #[cfg(any(test, feature = "panic-injection"))]
        let tick_panic = crate::panic_injection::TickPanic::from_config(&mut value)?;
        let scraper = Scraper::from_json(value)?;
        let registration =
            crate::shared::config_registry().register_scraper(scraper.endpoints())?;
        let stats = StatsRegistry::define(&mut BootstrapDefiner { envoy }, &scraper.stat_keys());
        // SAFETY: `envoy` is the config pointer of the running config_new hook; Envoy
        // registered its init target before calling us, so signalling now is allowed.
        unsafe {
            cb::envoy_dynamic_module_callback_bootstrap_extension_config_signal_init_complete(envoy)
        };
        Ok(ScraperExtension {
            envoy,
            period_ms: scraper.tick_period_ms(),
            scraper: RefCell::new(scraper),
            stats,
            timer: Cell::new(None),
            _registration: registration,
            #[cfg(any(test, feature = "panic-injection"))]
            tick_panic,
        })
    }

    /// Starts the scrape timer (from `server_initialized`; a second call does nothing).
    pub fn start(&self) {
        if self.timer.get().is_some() {
            return;
        }
        // SAFETY: main thread, config alive (we are called through it); we own the timer and
        // delete it exactly once in `stop`.
        let timer =
            unsafe { cb::envoy_dynamic_module_callback_bootstrap_extension_timer_new(self.envoy) };
        if timer.is_null() {
            crate::log::error("infergate: scraper could not create its timer");
            return;
        }
        self.timer.set(Some(timer));
        // SAFETY: `timer` was just created and is not deleted.
        unsafe { cb::envoy_dynamic_module_callback_bootstrap_extension_timer_enable(timer, 0) };
    }

    /// One tick: re-arm `timer` for the next one, then scrape (see the module doc).
    pub(crate) fn on_timer(&self, timer: BootstrapTimerModulePtr) {
        if self.timer.get() == Some(timer) {
            // SAFETY: `timer` is our live timer (checked against the one we own).
            unsafe {
                cb::envoy_dynamic_module_callback_bootstrap_extension_timer_enable(
                    timer,
                    self.period_ms,
                )
            };
        }
        let ticked = crate::guard::catch("scraper tick", || {
            #[cfg(any(test, feature = "panic-injection"))]
            self.tick_panic.tick();
            // A tick re-entered from inside a tick (it cannot happen on Envoy's main-thread
            // timer) is skipped rather than allowed to panic on the borrow.
            if let Ok(mut scraper) = self.scraper.try_borrow_mut() {
                scraper.on_tick(&mut self.host());
            }
        });
        if ticked.is_none() {
            // The unwind dropped the tick's borrow, so the scraper is reachable again.
            if let Ok(scraper) = self.scraper.try_borrow() {
                scraper.count_tick_failure(&mut self.host());
            }
        }
    }

    /// A callout finished; `headers`/`body` are Envoy's views, valid for this hook.
    pub fn on_callout_done(
        &self,
        callout_id: u64,
        result: u32,
        headers: &[EnvoyHttpHeader],
        body: &[EnvoyBuffer],
    ) {
        // Envoy's async client may answer a callout synchronously from inside the send (e.g.
        // 503 "no healthy upstream"), i.e. while `on_timer` still holds the scraper. That
        // nested answer is dropped: the outer dispatch already sees the send fail and counts
        // it as a failed scrape.
        let Ok(mut scraper) = self.scraper.try_borrow_mut() else {
            return;
        };
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
        scraper.on_callout_done(&mut self.host(), CalloutToken(callout_id), outcome);
    }

    /// Stops scraping: deletes the timer (once).
    pub fn stop(&self) {
        if let Some(timer) = self.timer.take() {
            // SAFETY: our live timer, taken out of the cell so it is deleted exactly once.
            unsafe { cb::envoy_dynamic_module_callback_bootstrap_extension_timer_delete(timer) };
        }
    }

    fn host(&self) -> ScraperHost<'_> {
        ScraperHost {
            envoy: self.envoy,
            stats: &self.stats,
        }
    }
}

impl Drop for ScraperExtension {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The scraper's host capabilities on the bootstrap config (main thread).
struct ScraperHost<'a> {
    envoy: BootstrapConfigEnvoyPtr,
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
        // SAFETY: main thread, live config pointer; `headers` borrows `request` for the call
        // and Envoy copies everything it keeps; `id` is writable.
        let result = unsafe {
            cb::envoy_dynamic_module_callback_bootstrap_extension_http_callout(
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
        self.update(StatKind::Counter, key, delta);
    }
    fn histogram_record(&mut self, key: &StatKey, value: u64) {
        // No histogram family is defined on the bootstrap extension: the scraper records
        // none, so a key reaching here resolves to nothing and is dropped like any unknown.
        self.update(StatKind::Histogram, key, value);
    }
    fn gauge_set(&mut self, key: &StatKey, value: u64) {
        self.update(StatKind::Gauge, key, value);
    }
    fn gauge_add(&mut self, key: &StatKey, delta: i64) {
        let Some((id, labels)) = self.stats.resolve(StatKind::Gauge, key) else {
            return;
        };
        let mut raw = LabelBuffers::new(&labels);
        let (ptr, count) = (raw.as_mut_ptr(), raw.count());
        let magnitude = delta.unsigned_abs();
        // SAFETY: main thread, live config pointer; `raw` borrows `labels` for the call. A
        // failed stat update is ignored (best effort).
        let _ = unsafe {
            if delta >= 0 {
                cb::envoy_dynamic_module_callback_bootstrap_extension_config_increment_gauge(
                    self.envoy, id, ptr, count, magnitude,
                )
            } else {
                cb::envoy_dynamic_module_callback_bootstrap_extension_config_decrement_gauge(
                    self.envoy, id, ptr, count, magnitude,
                )
            }
        };
    }
    fn log_error(&mut self, message: &str) {
        crate::log::error(message);
    }
}

impl ScraperHost<'_> {
    fn update(&self, kind: StatKind, key: &StatKey, value: u64) {
        let Some((id, labels)) = self.stats.resolve(kind, key) else {
            return;
        };
        let mut raw = LabelBuffers::new(&labels);
        let (ptr, count) = (raw.as_mut_ptr(), raw.count());
        // SAFETY: main thread, live config pointer; `raw` borrows `labels` for the call. A
        // failed stat update is ignored (best effort).
        let _ = unsafe {
            match kind {
                StatKind::Counter => {
                    cb::envoy_dynamic_module_callback_bootstrap_extension_config_increment_counter(
                        self.envoy, id, ptr, count, value,
                    )
                }
                StatKind::Gauge => {
                    cb::envoy_dynamic_module_callback_bootstrap_extension_config_set_gauge(
                        self.envoy, id, ptr, count, value,
                    )
                }
                StatKind::Histogram => return,
            }
        };
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
