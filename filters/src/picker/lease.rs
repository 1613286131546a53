//! In-flight accounting that cannot leak or double count, and what was measured there.
//!
//! Per endpoint slot: requests and estimated tokens in flight, those of them whose
//! response has not started (prefills in progress: [`InFlightLease::response_started`]),
//! and the latency measured at the slot's address ([`InFlightLease::observe`], a leaf lock
//! per slot).
//!
//! Each pool keeps its endpoints' in-flight load in a [`PoolLoad`]: counters shared by
//! `Arc` between the pool and every lease it issued (tower's `PendingRequests` handle is
//! the model: the lease holds a handle to the counter it raised). A successful pick adds
//! the request (and its estimated tokens) to the endpoint's load and returns an
//! [`InFlightLease`]; dropping the lease takes them back. The lease is not `Clone`, so a
//! pick is given back at most once; giving back is its `Drop`, so it is given back at
//! least once whatever path the request takes (complete, reset, local reply, a context
//! destroyed without any end event, a panic unwinding through the owner).
//!
//! **Why counters outside the pool's lock.** A lease may be dropped anywhere, including
//! on a thread that holds its pool's lock (in Wasm everything runs on one thread, and a
//! std `Mutex` there panics when locked twice). Giving back never takes a lock, so it can
//! neither deadlock nor panic. Picks read and raise the counts under the pool's lock, so
//! two picks of one pool never see the same load.
//!
//! **Slots.** The counters are per endpoint *slot*, fixed in number when the pool is built
//! (its static endpoints, or room for a followed cluster's members). A slot holds one
//! address at a time; the pool gives it another only when it is idle (nothing in flight,
//! no gauge decrement owed: `PoolLoad::assign`), so a lease, which names its slot and
//! carries the stat keys of the address it was taken for, always gives back to the address
//! it counted against, even after that member left the pool.
//!
//! **Gauges.** The pool's and the endpoint's `infergate.picker.inflight_requests` gauges
//! are host stats, reachable only through a request's host. The request raises them with
//! [`InFlightLease::raise_gauges`] right after the pick and lowers them with
//! [`InFlightLease::end`] when it ends with a host at hand. A lease dropped without `end`
//! owes its decrement: the [`PoolLoad`] keeps it and the next `raise_gauges` or `end` of
//! the pool pays it, so the gauges read the exact count again as soon as the pool sees
//! another request (and never go below it: an owed decrement was raised first).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use scheduler_core::latency::{LatencyEstimate, LatencySettings, Observation, ObservedLatency};
use scheduler_core::types::{InFlight, Millis, Tokens};

use super::state::lora::AdapterMark;
use super::timing::ResponseTiming;
use crate::host::Stats;
use crate::stats::StatKey;

/// The stat keys of one endpoint slot: its picks counter and its in-flight gauge, named by
/// the address the slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct SlotKeys {
    /// The address the keys name.
    pub(super) address: String,
    pub(super) picks: StatKey,
    pub(super) inflight: StatKey,
    /// The measured TTFT gauge (µs, the estimate's mean).
    pub(super) ttft: StatKey,
    /// The measured time-per-output-token gauge (µs).
    pub(super) tpot: StatKey,
}

impl SlotKeys {
    pub(super) fn new(pool: &str, address: &str) -> Arc<SlotKeys> {
        let labels = [("pool", pool), ("endpoint", address)];
        Arc::new(SlotKeys {
            address: address.to_owned(),
            picks: StatKey::new("infergate.picker.picks", &labels),
            inflight: StatKey::new(INFLIGHT, &labels),
            ttft: StatKey::new("infergate.picker.observed_ttft_us", &labels),
            tpot: StatKey::new("infergate.picker.observed_tpot_us", &labels),
        })
    }
}

const INFLIGHT: &str = "infergate.picker.inflight_requests";

/// The pool's in-flight gauge key.
pub(super) fn pool_inflight_key(pool: &str) -> StatKey {
    StatKey::new(INFLIGHT, &[("pool", pool)])
}

/// One endpoint slot's counters, and the keys of the address it holds.
#[derive(Debug, Default)]
struct EndpointLoad {
    requests: AtomicU32,
    tokens: AtomicU64,
    /// Requests counted in `requests` whose response has not started.
    prefilling: AtomicU32,
    /// Gauge decrements owed by leases dropped without [`InFlightLease::end`].
    owed: AtomicU32,
    /// The slot's stat keys (`None`: never assigned). A leaf lock: held only to clone or
    /// replace the `Arc`, never across any other call, so no path can take it twice.
    keys: Mutex<Option<Arc<SlotKeys>>>,
    /// The latency measured at the address the slot holds. A leaf lock like `keys`.
    latency: Mutex<LatencyEstimate>,
}

impl EndpointLoad {
    fn keys(&self) -> Option<Arc<SlotKeys>> {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn latency(&self) -> std::sync::MutexGuard<'_, LatencyEstimate> {
        self.latency.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The in-flight load of one pool's endpoint slots (see the module doc). Its slots are
/// fixed at build (the static endpoints, or room for a followed cluster's members); which
/// address a slot holds is the pool's to say, under its lock (`PoolLoad::assign`).
#[derive(Debug)]
pub struct PoolLoad {
    endpoints: Vec<EndpointLoad>,
    pool_gauge: StatKey,
    /// Set when some endpoint has an owed decrement, so paying costs one load otherwise.
    owes: AtomicBool,
    /// How the slots' measured-latency estimates are kept.
    latency: LatencySettings,
}

impl PoolLoad {
    /// `slots` slots, the first ones holding `initial`'s keys; in-flight gauges of the pool
    /// under `pool_gauge`; latency estimates kept by `latency`.
    pub(super) fn new(
        pool_gauge: StatKey,
        slots: usize,
        initial: &[Arc<SlotKeys>],
        latency: LatencySettings,
    ) -> Self {
        let endpoints = (0..slots.max(initial.len()))
            .map(|i| EndpointLoad {
                keys: Mutex::new(initial.get(i).cloned()),
                ..EndpointLoad::default()
            })
            .collect();
        PoolLoad {
            endpoints,
            pool_gauge,
            owes: AtomicBool::new(false),
            latency,
        }
    }

    /// Set the pool's and every assigned slot's in-flight gauge to the count held here (an
    /// absolute write, where requests write deltas): what a process's gauges read after the
    /// state that wrote their deltas went away (the Wasm owner's VM died and another VM's
    /// state took over), from the next publication on.
    pub fn publish_gauges<S: Stats + ?Sized>(&self, stats: &mut S) {
        stats.gauge_set(&self.pool_gauge, self.total_requests());
        for endpoint in &self.endpoints {
            if let Some(keys) = endpoint.keys() {
                let requests = endpoint.requests.load(Ordering::Relaxed);
                stats.gauge_set(&keys.inflight, u64::from(requests));
            }
        }
    }

    /// How many slots the pool has.
    pub(super) fn slots(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether slot `slot` has nothing in flight and no decrement owed, so it may hold
    /// another address.
    pub(super) fn idle(&self, slot: usize) -> bool {
        self.endpoints.get(slot).is_some_and(|e| {
            e.requests.load(Ordering::SeqCst) == 0 && e.owed.load(Ordering::SeqCst) == 0
        })
    }

    /// Give slot `slot` the keys of a new address; refused (`false`) unless it is
    /// [`PoolLoad::idle`], so no lease or owed decrement still names the old one.
    pub(super) fn assign(&self, slot: usize, keys: Arc<SlotKeys>) -> bool {
        let Some(e) = self.endpoints.get(slot) else {
            return false;
        };
        if !self.idle(slot) {
            return false;
        }
        *e.keys.lock().unwrap_or_else(PoisonError::into_inner) = Some(keys);
        // What was measured belongs to the old address.
        *e.latency() = LatencyEstimate::default();
        true
    }

    /// What a request sent now to slot `endpoint` should expect, from the latency measured
    /// there, if its estimate counts at `now`.
    pub fn observed(&self, endpoint: usize, now: Millis) -> Option<ObservedLatency> {
        let e = self.endpoints.get(endpoint)?;
        let requests = e.requests.load(Ordering::Relaxed);
        e.latency().view(&self.latency, now, requests)
    }

    /// The measured-latency estimate of slot `endpoint` (tests and diagnostics).
    pub fn latency_estimate(&self, endpoint: usize) -> Option<LatencyEstimate> {
        self.endpoints.get(endpoint).map(|e| *e.latency())
    }

    /// The load of endpoint slot `endpoint`.
    pub fn get(&self, endpoint: usize) -> Option<InFlight> {
        self.endpoints.get(endpoint).map(|e| InFlight {
            requests: e.requests.load(Ordering::Relaxed),
            tokens: Tokens(e.tokens.load(Ordering::Relaxed)),
            prefilling: e.prefilling.load(Ordering::Relaxed),
        })
    }

    /// The slot whose keys name `address` (a removed member's too, while it holds it),
    /// without the pool's lock.
    pub(super) fn slot_of(&self, address: &str) -> Option<usize> {
        self.endpoints
            .iter()
            .position(|e| e.keys().is_some_and(|k| k.address == address))
    }

    /// Requests in flight over every slot (tests and diagnostics).
    pub fn total_requests(&self) -> u64 {
        self.endpoints
            .iter()
            .map(|e| u64::from(e.requests.load(Ordering::SeqCst)))
            .sum()
    }

    /// Count one request of `tokens` (`prompt` of them its prompt's) against endpoint
    /// `endpoint`; `None` for an index the pool does not have.
    pub(super) fn take(
        self: &Arc<Self>,
        endpoint: usize,
        tokens: Tokens,
        prompt: Tokens,
    ) -> Option<InFlightLease> {
        let e = self.endpoints.get(endpoint)?;
        let before = e.requests.fetch_add(1, Ordering::SeqCst);
        e.tokens.fetch_add(tokens.0, Ordering::Relaxed);
        e.prefilling.fetch_add(1, Ordering::Relaxed);
        Some(InFlightLease {
            load: Arc::clone(self),
            endpoint,
            tokens,
            keys: e.keys(),
            gauged: false,
            adapter: None,
            inflight_at_dispatch: before,
            prompt,
            prefilling: true,
        })
    }

    /// Take one request off endpoint `endpoint`'s prefills in progress.
    fn prefill_done(&self, endpoint: usize) {
        if let Some(e) = self.endpoints.get(endpoint) {
            let _ = e
                .prefilling
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(1))
                });
        }
    }

    fn give_back(&self, endpoint: usize, tokens: Tokens) {
        let Some(e) = self.endpoints.get(endpoint) else {
            return;
        };
        // Saturating: every give-back matches one take, but a counter must never wrap.
        let _ = e
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(tokens.0))
            });
        let _ = e
            .requests
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(1))
            });
    }

    fn owe(&self, endpoint: usize) {
        if let Some(e) = self.endpoints.get(endpoint) {
            e.owed.fetch_add(1, Ordering::SeqCst);
            self.owes.store(true, Ordering::SeqCst);
        }
    }

    /// Move the pool's gauge and `keys`' endpoint gauge by `delta`.
    fn add_gauges<S: Stats + ?Sized>(&self, keys: Option<&SlotKeys>, delta: i64, stats: &mut S) {
        stats.gauge_add(&self.pool_gauge, delta);
        if let Some(keys) = keys {
            stats.gauge_add(&keys.inflight, delta);
        }
    }

    /// Lower the gauges by every decrement owed so far.
    fn pay_owed<S: Stats + ?Sized>(&self, stats: &mut S) {
        if !self.owes.swap(false, Ordering::SeqCst) {
            return;
        }
        for e in &self.endpoints {
            // The keys first: while a decrement is owed the slot keeps its address.
            let keys = e.keys();
            let owed = e.owed.swap(0, Ordering::SeqCst);
            if owed > 0 {
                self.add_gauges(keys.as_deref(), -i64::from(owed), stats);
            }
        }
    }

    /// Gauge decrements owed right now, over every endpoint (tests and diagnostics).
    pub fn owed_gauge_decrements(&self) -> u64 {
        self.endpoints
            .iter()
            .map(|e| u64::from(e.owed.load(Ordering::SeqCst)))
            .sum()
    }
}

/// Proof that one request is counted in an endpoint's in-flight load; dropping it gives
/// the load back (see the module doc).
#[must_use = "dropping a lease gives its in-flight load back at once"]
pub struct InFlightLease {
    load: Arc<PoolLoad>,
    /// Endpoint index in the pool.
    endpoint: usize,
    /// Tokens added with the request.
    tokens: Tokens,
    /// The keys of the address the slot held when the lease was taken.
    keys: Option<Arc<SlotKeys>>,
    /// Whether this lease raised the in-flight gauges and has not lowered them yet.
    gauged: bool,
    /// The request's LoRA adapter counted in flight at the picked endpoint (the picker's
    /// memory of what it sent there), given back with the lease.
    adapter: Option<AdapterMark>,
    /// Requests this process had in flight to the endpoint when this one was counted.
    inflight_at_dispatch: u32,
    /// The request's estimated prompt tokens.
    prompt: Tokens,
    /// Whether the request counts in its endpoint's prefills in progress (its response has
    /// not started).
    prefilling: bool,
}

impl InFlightLease {
    /// The endpoint slot (see the module doc) this lease counts against.
    pub fn endpoint_index(&self) -> usize {
        self.endpoint
    }

    /// The stat keys of the endpoint this lease counts against.
    pub(super) fn keys(&self) -> Option<&SlotKeys> {
        self.keys.as_deref()
    }

    /// Raise the pool's and the endpoint's in-flight gauges for this request (once; later
    /// calls do nothing), paying any decrement the pool owes first.
    pub fn raise_gauges<S: Stats + ?Sized>(&mut self, stats: &mut S) {
        if self.gauged {
            return;
        }
        self.load.pay_owed(stats);
        self.load.add_gauges(self.keys.as_deref(), 1, stats);
        self.gauged = true;
    }

    /// The request's response started (its first chunk passed): it no longer counts in
    /// its endpoint's prefills in progress. Later calls do nothing.
    pub fn response_started(&mut self) {
        if std::mem::take(&mut self.prefilling) {
            self.load.prefill_done(self.endpoint);
        }
    }

    /// The request ended at `now` having measured `timing` of its endpoint: fold it into
    /// the endpoint's latency estimate and set its measured-latency gauges. Nothing for a
    /// request that measured nothing, or whose slot holds another address by now.
    pub fn observe<S: Stats + ?Sized>(&self, timing: &ResponseTiming, now: Millis, stats: &mut S) {
        if timing.is_empty() {
            return;
        }
        let Some(e) = self.load.endpoints.get(self.endpoint) else {
            return;
        };
        let observation = Observation {
            at: now,
            ttft_ms: timing.ttft_ms(),
            tpot_ms: timing.tpot_ms(),
            inflight_at_dispatch: self.inflight_at_dispatch,
            prompt_tokens: self.prompt.0,
        };
        let (ttft, tpot) = {
            let mut estimate = e.latency();
            estimate.observe(&self.load.latency, &observation);
            (estimate.mean_ttft_ms(), estimate.mean_tpot_ms())
        };
        if let Some(keys) = &self.keys {
            let micros = |ms: f64| (ms * 1_000.0) as u64;
            if let Some(ttft) = ttft {
                stats.gauge_set(&keys.ttft, micros(ttft));
            }
            if let Some(tpot) = tpot {
                stats.gauge_set(&keys.tpot, micros(tpot));
            }
        }
    }

    /// The request ended with a host at hand: lower the gauges it raised (and any the
    /// pool owes), then give the load back.
    pub fn end<S: Stats + ?Sized>(mut self, stats: &mut S) {
        if self.gauged {
            self.load.add_gauges(self.keys.as_deref(), -1, stats);
            self.gauged = false;
        }
        self.load.pay_owed(stats);
    }

    /// Count this lease's request against endpoint `endpoint` of the same pool instead (it
    /// was served there, not where it was picked), moving the endpoint gauges with it when
    /// this lease raised them. `false`, and the lease unchanged, for an index the pool lacks.
    pub fn move_to<S: Stats + ?Sized>(&mut self, endpoint: usize, stats: &mut S) -> bool {
        if endpoint == self.endpoint {
            return true;
        }
        let Some(to) = self.load.endpoints.get(endpoint) else {
            return false;
        };
        to.requests.fetch_add(1, Ordering::SeqCst);
        to.tokens.fetch_add(self.tokens.0, Ordering::Relaxed);
        if self.prefilling {
            to.prefilling.fetch_add(1, Ordering::Relaxed);
            self.load.prefill_done(self.endpoint);
        }
        let to_keys = to.keys();
        self.load.give_back(self.endpoint, self.tokens);
        if self.gauged {
            // The pool's gauge stays: the request is still in flight in the pool.
            if let Some(from) = &self.keys {
                stats.gauge_add(&from.inflight, -1);
            }
            if let Some(to) = &to_keys {
                stats.gauge_add(&to.inflight, 1);
            }
        }
        self.keys = to_keys;
        // The mark counts the adapter at the endpoint that did not serve: let it go (the
        // serving endpoint's scrape shows the adapter soon enough).
        self.adapter = None;
        self.endpoint = endpoint;
        true
    }

    /// Hold `mark`, the request's adapter counted in flight at this lease's endpoint.
    pub(super) fn hold_adapter(&mut self, mark: AdapterMark) {
        self.adapter = Some(mark);
    }

    /// Give the load back; whoever raised the gauges lowers them.
    pub(super) fn gauges_lowered_by_caller(mut self) {
        self.gauged = false;
    }
}

impl Drop for InFlightLease {
    fn drop(&mut self) {
        // The debt first: a slot with a request in flight or a debt keeps its address, and
        // this order leaves no moment with neither.
        if self.gauged {
            self.load.owe(self.endpoint);
        }
        self.response_started();
        self.load.give_back(self.endpoint, self.tokens);
    }
}

impl PartialEq for InFlightLease {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.load, &other.load)
            && self.endpoint == other.endpoint
            && self.tokens == other.tokens
    }
}

impl Eq for InFlightLease {}

impl fmt::Debug for InFlightLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightLease")
            .field("endpoint", &self.endpoint)
            .field("tokens", &self.tokens)
            .field("gauged", &self.gauged)
            .finish()
    }
}
