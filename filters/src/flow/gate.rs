//! One pool's flow gate: the core's queues behind a lock, the admitted load beside it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use scheduler_core::flow::saturation::InFlightLoad;
use scheduler_core::flow::{
    Arrival, ConcurrencyMode, Detector, Dispatched, FlowControlConfig, FlowQueues, Need, QueueKey,
    Removed, VictimKey, Victims,
};

use super::Evictee;

/// A queued request: the host's item, and the load its ticket will count.
#[derive(Debug)]
pub struct Entry<T> {
    /// Tokens the request counts for the token-mode detector (prompt + output estimate).
    pub load_tokens: u64,
    /// The host's handle.
    pub item: T,
}

/// The load of the requests admitted and not yet ended, and those of them that may be
/// evicted.
#[derive(Debug, Default)]
struct GateLoad {
    requests: AtomicU64,
    tokens: AtomicU64,
    victims: Mutex<Victims<Evictee>>,
}

impl GateLoad {
    fn victims(&self) -> MutexGuard<'_, Victims<Evictee>> {
        // Every mutation is one call on the candidates: a poisoned lock holds a whole state.
        self.victims.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An admitted request's share of the pool's load; dropping it gives the share back (and
/// takes the request out of the eviction candidates).
#[derive(Debug)]
pub struct FlowTicket {
    load: Arc<GateLoad>,
    tokens: u64,
    victim: Option<VictimKey>,
}

impl FlowTicket {
    /// Offer the request for eviction, reached through `evictee`, as a request of `band`
    /// (only a sheddable band's request, and only once; `false` otherwise). The caller
    /// checks [`FlowGate::evicts`].
    pub fn make_evictable(&mut self, band: i32, evictee: Evictee) -> bool {
        if self.victim.is_some() {
            return false;
        }
        self.victim = self.load.victims().insert(band, self.tokens, evictee);
        self.victim.is_some()
    }
}

impl Drop for FlowTicket {
    fn drop(&mut self) {
        // Only what this ticket added is taken away, so the counts cannot underflow.
        self.load.requests.fetch_sub(1, Ordering::AcqRel);
        self.load.tokens.fetch_sub(self.tokens, Ordering::AcqRel);
        if let Some(key) = self.victim.take() {
            self.load.victims().remove(key);
        }
    }
}

/// What the gate answered an arriving request.
#[derive(Debug)]
pub enum Admission {
    /// Go now; hold the ticket until the request ends.
    Admitted(FlowTicket),
    /// Wait: the item is queued under `key`. With eviction on, `evict` are the admitted
    /// requests chosen to make room for it (already out of the candidates): the caller
    /// stops them.
    Queued {
        /// Where it waits.
        key: QueueKey,
        /// The requests to evict.
        evict: Vec<Evictee>,
    },
    /// Its band or the queues are full: answer 429 `rejected-saturated`.
    Refused,
}

/// One pool's flow control (module doc of [`crate::flow`]).
#[derive(Debug)]
pub struct FlowGate<T> {
    config: FlowControlConfig,
    queues: Mutex<FlowQueues<Entry<T>>>,
    load: Arc<GateLoad>,
    /// Requests queued (read without the lock: is there anything to dispatch?).
    queued: AtomicUsize,
    /// The utilization detector's verdict on the latest snapshot.
    utilization_saturated: AtomicBool,
}

impl<T> FlowGate<T> {
    /// A gate with empty queues.
    pub fn new(config: FlowControlConfig) -> FlowGate<T> {
        FlowGate {
            queues: Mutex::new(FlowQueues::new(&config)),
            config,
            load: Arc::default(),
            queued: AtomicUsize::new(0),
            utilization_saturated: AtomicBool::new(false),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FlowControlConfig {
        &self.config
    }

    /// Whether a request admitted in `band` is offered for eviction (`enableEviction`, and a
    /// sheddable band).
    pub fn evicts(&self, band: i32) -> bool {
        self.config.enable_eviction && Victims::<Evictee>::sheddable(band)
    }

    /// The priority of the band a request of `priority` waits in: its own band, else the
    /// nearest lower one, else the lowest.
    pub fn band_for(&self, priority: i32) -> i32 {
        self.config.band_for(priority)
    }

    fn lock(&self) -> MutexGuard<'_, FlowQueues<Entry<T>>> {
        // Every mutation of the queues is one core call: a poisoned lock holds whole states.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The admitted load, as the detector reads it.
    pub fn load(&self) -> InFlightLoad {
        InFlightLoad {
            requests: self.load.requests.load(Ordering::Acquire),
            tokens: self.load.tokens.load(Ordering::Acquire),
        }
    }

    /// Whether the pool counts as saturated now.
    pub fn saturated(&self) -> bool {
        match self.config.detector {
            Detector::Utilization(_) => self.utilization_saturated.load(Ordering::Acquire),
            Detector::Concurrency { .. } => self.config.detector.saturated_by_load(self.load()),
        }
    }

    /// Record the utilization detector's verdict on a new snapshot (ignored by a
    /// concurrency detector).
    pub fn set_utilization_saturated(&self, saturated: bool) {
        self.utilization_saturated
            .store(saturated, Ordering::Release);
    }

    /// Whether any request waits (no lock).
    pub fn has_queued(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    fn ticket(&self, tokens: u64) -> FlowTicket {
        self.load.requests.fetch_add(1, Ordering::AcqRel);
        self.load.tokens.fetch_add(tokens, Ordering::AcqRel);
        FlowTicket {
            load: Arc::clone(&self.load),
            tokens,
            victim: None,
        }
    }

    /// Admit `arrival` at once, queue it, or refuse it (module doc of [`crate::flow`]).
    /// `load_tokens` is what its ticket counts in token mode; `waiter` makes the item that
    /// waits in the queue, only when the request is not admitted at once (the common case
    /// pays for no item).
    pub fn admit(
        &self,
        arrival: Arrival<()>,
        load_tokens: u64,
        waiter: impl FnOnce() -> T,
    ) -> Admission {
        let mut queues = self.lock();
        if !queues.blocks(arrival.priority) && !self.saturated() {
            return Admission::Admitted(self.ticket(load_tokens));
        }
        let Arrival {
            priority,
            flow,
            bytes,
            service,
            ttl_ms,
            now_ms,
            item: (),
        } = arrival;
        let entry = Arrival {
            priority,
            flow,
            bytes,
            service,
            ttl_ms,
            now_ms,
            item: Entry {
                load_tokens,
                item: waiter(),
            },
        };
        match queues.enqueue(entry) {
            Ok(key) => {
                self.queued.store(queues.len(), Ordering::Release);
                drop(queues);
                // Only saturation evicts: a request merely behind others of its band or a
                // higher one waits for their dispatch.
                let evict = if self.saturated() {
                    self.victims_for(priority, load_tokens)
                } else {
                    Vec::new()
                };
                Admission::Queued { key, evict }
            }
            Err(_) => Admission::Refused,
        }
    }

    /// The admitted requests a request of `priority` queued now evicts (none without
    /// `enableEviction`, or when no lower sheddable band has any).
    fn victims_for(&self, priority: i32, load_tokens: u64) -> Vec<Evictee> {
        if !self.config.enable_eviction {
            return Vec::new();
        }
        let need = match self.config.detector {
            Detector::Concurrency {
                mode: ConcurrencyMode::Tokens,
                ..
            } => Need::Tokens(load_tokens),
            _ => Need::Requests(1),
        };
        self.load.victims().select(self.band_for(priority), need)
    }

    /// Take queued requests while the pool is not saturated, each with its ticket counted
    /// before the next is considered.
    pub fn dispatch(&self, now_ms: u64) -> Vec<(Dispatched<T>, FlowTicket)> {
        if !self.has_queued() {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut queues = self.lock();
        while !queues.is_empty() && !self.saturated() {
            let Some(d) = queues.dispatch(now_ms) else {
                break;
            };
            let ticket = self.ticket(d.item.load_tokens);
            out.push((
                Dispatched {
                    item: d.item.item,
                    band_priority: d.band_priority,
                    flow: d.flow,
                    queued_ms: d.queued_ms,
                },
                ticket,
            ));
        }
        self.queued.store(queues.len(), Ordering::Release);
        out
    }

    /// The request under `key` left (its client went away); `None` if it is no longer
    /// queued (dispatched or expired meanwhile).
    pub fn cancel(&self, key: QueueKey, now_ms: u64) -> Option<Removed<T>> {
        let mut queues = self.lock();
        let removed = queues.cancel(key, now_ms);
        self.queued.store(queues.len(), Ordering::Release);
        removed.map(unwrap_removed)
    }

    /// Take every request whose TTL has passed at `now_ms`.
    pub fn expire(&self, now_ms: u64) -> Vec<Removed<T>> {
        if !self.has_queued() {
            return Vec::new();
        }
        let mut queues = self.lock();
        let expired = queues.expire(now_ms);
        self.queued.store(queues.len(), Ordering::Release);
        expired.into_iter().map(unwrap_removed).collect()
    }

    /// Correct a flow's service by `delta` tokens once its request's real usage is known.
    pub fn charge(&self, band_priority: i32, flow: &str, delta: i64) {
        if delta != 0 {
            self.lock().charge(band_priority, flow, delta);
        }
    }
}

fn unwrap_removed<T>(r: Removed<Entry<T>>) -> Removed<T> {
    Removed {
        item: r.item.item,
        band_priority: r.band_priority,
        flow: r.flow,
        queued_ms: r.queued_ms,
    }
}
