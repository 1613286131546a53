//! The queues of one pool: bands, flows, policies, limits and TTLs.
//!
//! # What is dispatched next
//!
//! 1. **Bands are strict**: the highest band with a queued request goes first, whatever
//!    waits below it. A request waits in the band of its priority, else in the nearest lower
//!    band, else (below every band) in the lowest one ([`FlowQueues::band_for`]).
//! 2. **Across the flows of a band**, its fairness policy:
//!    - `round-robin-fairness-policy`: the backlogged flows take turns, one request each, in
//!      the order they became backlogged; a flow that is served and still has requests goes
//!      to the back of the round, one that becomes backlogged again joins at the back (so it
//!      is served within one round). Flow B with 4 queued and C with 1, B first: B, C, B, B, B.
//!    - `global-strict-fairness-policy`: flows are ignored; the whole band is one queue in
//!      the band's ordering.
//!    - `weighted-fairness-policy`: **Virtual Token Counter** fairness (Y. Sheng et al.,
//!      "Fairness in Serving Large Language Models", OSDI 2024), weighted. Every flow of the
//!      band has a counter of the service it received divided by its weight:
//!      - when one of its requests is dispatched, `counter += service / weight`, where
//!        `service` is the request's estimate (prompt tokens + 2 × completion tokens) and the
//!        weight comes from `flowControl.flows` (1 when not listed);
//!      - the backlogged flow with the **smallest counter** goes next; on a tie, the one that
//!        has been backlogged longest;
//!      - a flow that **becomes backlogged** (its first queued request after being idle) has
//!        its counter lifted to `max(own, floor)`, where `floor` is the smallest counter among
//!        the band's backlogged flows, or, when none is backlogged, the largest counter the
//!        band has seen. Idle time therefore earns no credit (a returning flow cannot
//!        monopolise the band to "catch up"), and a flow keeps any lead it had;
//!      - [`FlowQueues::charge`] corrects a counter once the real service is known (the
//!        request's end: actual completion tokens instead of the estimate); the counter stays
//!        ≥ 0 and is not otherwise clamped, so an over-estimate is paid back in full.
//!
//!      With both flows always backlogged, each dispatch goes to the flow that is behind in
//!      service per weight, so flows of weights 3 and 1 receive service 3 : 1 (within one
//!      request's service), whatever their request sizes. Counters are fixed point (1/65,536
//!      of a token per unit of weight) in 128 bits: exact enough, and they never overflow.
//! 3. **Within a flow** (or a global-strict band), the ordering policy: `fcfs-ordering-policy`
//!    in arrival order; `edf-ordering-policy` by deadline = arrival + TTL (the request's own,
//!    else the default), ties in arrival order; a request without TTL comes after every
//!    deadline.
//!
//! # Limits, TTLs, cancellation
//!
//! [`FlowQueues::enqueue`] refuses a request that would take its band or the whole queue past
//! `maxRequests` or `maxBytes` (`rejected-saturated`). A request whose TTL passed
//! (`now − arrival ≥ ttl`; a TTL of 0 means none) is returned by [`FlowQueues::expire`]; a
//! host calls it before [`FlowQueues::dispatch`] and sleeps until
//! [`FlowQueues::next_deadline_ms`]. [`FlowQueues::cancel`] takes a request out (its client
//! left) and frees its place and bytes at once.
//!
//! # Cost
//!
//! Every structure is ordered and exact (no tombstones): per band a set of backlogged flows
//! keyed by their turn (round robin) or counter (weighted), per flow (or per global-strict
//! band) a set of requests keyed by deadline and arrival, and one set of expiry times.
//! Enqueue, dispatch, cancel and each expiry are O(log n); nothing scans the queue. Requests
//! live in a slab indexed by [`QueueKey`] (slot and generation, so a stale key matches
//! nothing). Flows are looked up by name once per enqueue (no allocation unless the flow is
//! new to the band) and keep their weight; a flow's state stays after it goes idle (its
//! counter must survive), so memory grows with the number of distinct fairness ids a band has
//! seen, not with time. Flow names come from the trusted auth stage; the name map uses fixed
//! hash keys (deterministic, like the prefix index's).

use alloc::collections::BTreeSet;
use alloc::string::String;
use alloc::vec::Vec;
use hashbrown::HashMap;

use super::config::{
    BandConfig, FairnessPolicy, FlowControlConfig, OrderingPolicy, DEFAULT_BAND_MAX_BYTES,
    DEFAULT_BAND_MAX_REQUESTS,
};

/// A request arriving at a saturated pool.
#[derive(Debug)]
pub struct Arrival<T> {
    /// Its priority (the objective's; 0 when none).
    pub priority: i32,
    /// Its fairness id (`default-flow` when none).
    pub flow: String,
    /// Its body size, counted against `maxBytes`.
    pub bytes: u64,
    /// Its estimated service in tokens: prompt + 2 × completion estimate.
    pub service: u64,
    /// Its TTL; `None`: the configuration's default. 0: none (it waits until dispatched or
    /// cancelled).
    pub ttl_ms: Option<u64>,
    /// When it arrived.
    pub now_ms: u64,
    /// The host's handle (how to wake it, what to run when dispatched).
    pub item: T,
}

/// Names a queued request, to cancel it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey(pub u64);

/// Why a request could not be queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Its band or the whole queue is full (`rejected-saturated`).
    Saturated,
}

/// A request taken from the queue to be served.
#[derive(Debug)]
pub struct Dispatched<T> {
    /// The host's handle.
    pub item: T,
    /// The band it waited in.
    pub band_priority: i32,
    /// Its flow.
    pub flow: String,
    /// How long it waited.
    pub queued_ms: u64,
}

/// A request that left the queue without being served (TTL, cancel).
#[derive(Debug)]
pub struct Removed<T> {
    /// The host's handle.
    pub item: T,
    /// The band it waited in.
    pub band_priority: i32,
    /// Its flow.
    pub flow: String,
    /// How long it waited.
    pub queued_ms: u64,
}

/// Fixed-point bits of a virtual counter: 1/65,536 of a token per unit of weight.
const COUNTER_SHIFT: u32 = 16;

/// No TTL: an expiry time no clock reaches.
const NEVER: u64 = u64::MAX;

/// Fixed keys of the flow-name maps (deterministic across processes).
const NAME_KEYS: [u64; 4] = [
    0x4528_21e6_38d0_1377,
    0xbe54_66cf_34e9_0c6c,
    0xc0ac_29b7_c97c_50dd,
    0x3f84_d5b5_b547_0917,
];

type NameMap<V> = HashMap<String, V, ahash::RandomState>;

fn name_map<V>() -> NameMap<V> {
    HashMap::with_hasher(ahash::RandomState::with_seeds(
        NAME_KEYS[0],
        NAME_KEYS[1],
        NAME_KEYS[2],
        NAME_KEYS[3],
    ))
}

/// A request's place in its lane: ordering key (deadline under EDF, else 0), arrival
/// sequence (unique), slab slot.
type LaneKey = (u64, u64, u32);

/// A backlogged flow's place among its band's flows: counter (weighted) or 0, the sequence
/// of its turn (round robin) or of its becoming backlogged (weighted), flow index.
type TurnKey = (u128, u64, u32);

/// One queued request.
#[derive(Debug)]
struct Queued<T> {
    item: T,
    flow: String,
    band: u32,
    flow_ix: u32,
    bytes: u64,
    service: u64,
    arrival_ms: u64,
    /// `NEVER` when it has no TTL.
    expiry_ms: u64,
    seq: u64,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    entry: Option<Queued<T>>,
}

/// One flow of one band.
#[derive(Debug)]
struct Flow {
    weight: u32,
    /// Virtual counter, fixed point (see `COUNTER_SHIFT`).
    counter: u128,
    /// Requests queued.
    live: usize,
    /// Its requests, unless the band is global strict.
    lane: BTreeSet<LaneKey>,
    /// Its key in the band's `turns` while backlogged (never under global strict).
    turn: Option<(u128, u64)>,
}

#[derive(Debug)]
struct Band {
    config: BandConfig,
    len: usize,
    bytes: u64,
    flows: Vec<Flow>,
    names: NameMap<u32>,
    /// The band's requests under global strict.
    shared: BTreeSet<LaneKey>,
    /// Backlogged flows, next first (round robin and weighted).
    turns: BTreeSet<TurnKey>,
    /// The largest counter any flow of the band has had.
    max_counter: u128,
}

impl Band {
    fn new(config: BandConfig) -> Band {
        Band {
            config,
            len: 0,
            bytes: 0,
            flows: Vec::new(),
            names: name_map(),
            shared: BTreeSet::new(),
            turns: BTreeSet::new(),
            max_counter: 0,
        }
    }

    fn lane_of(&mut self, flow_ix: u32) -> Option<&mut BTreeSet<LaneKey>> {
        if self.config.fairness == FairnessPolicy::GlobalStrict {
            Some(&mut self.shared)
        } else {
            self.flows.get_mut(flow_ix as usize).map(|f| &mut f.lane)
        }
    }

    fn order_key(&self, expiry_ms: u64) -> u64 {
        match self.config.ordering {
            OrderingPolicy::Fcfs => 0,
            OrderingPolicy::Edf => expiry_ms,
        }
    }
}

/// `service / weight` in counter units.
fn scaled(service: u64, weight: u32) -> u128 {
    (u128::from(service) << COUNTER_SHIFT) / u128::from(weight.max(1))
}

/// The queues of one pool.
#[derive(Debug)]
pub struct FlowQueues<T> {
    /// Highest priority first.
    bands: Vec<Band>,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    /// Requests with a TTL: (expiry, seq, slot).
    expiry: BTreeSet<(u64, u64, u32)>,
    len: usize,
    bytes: u64,
    max_requests: u64,
    max_bytes: u64,
    default_ttl_ms: u64,
    weights: NameMap<u32>,
    seq: u64,
}

impl<T> FlowQueues<T> {
    /// Empty queues for `config`. A configuration without bands gets one band of priority 0
    /// (round robin, FCFS, llm-d's band limits bounded by the global ones).
    pub fn new(config: &FlowControlConfig) -> FlowQueues<T> {
        let mut bands: Vec<BandConfig> = config.bands.clone();
        if bands.is_empty() {
            bands.push(BandConfig {
                priority: 0,
                max_requests: config.max_requests.min(DEFAULT_BAND_MAX_REQUESTS),
                max_bytes: config.max_bytes.min(DEFAULT_BAND_MAX_BYTES),
                fairness: FairnessPolicy::RoundRobin,
                ordering: OrderingPolicy::Fcfs,
            });
        }
        bands.sort_by_key(|b| core::cmp::Reverse(b.priority));
        bands.dedup_by_key(|b| b.priority);
        let mut weights = name_map();
        for (flow, w) in &config.weights {
            weights.insert(flow.clone(), (*w).max(1));
        }
        FlowQueues {
            bands: bands.into_iter().map(Band::new).collect(),
            slots: Vec::new(),
            free: Vec::new(),
            expiry: BTreeSet::new(),
            len: 0,
            bytes: 0,
            max_requests: config.max_requests,
            max_bytes: config.max_bytes,
            default_ttl_ms: config.default_ttl_ms,
            weights,
            seq: 0,
        }
    }

    fn band_index(&self, priority: i32) -> usize {
        super::config::band_position(&self.bands, |b| b.config.priority, priority)
    }

    fn exact_band(&self, band_priority: i32) -> Option<usize> {
        self.bands
            .iter()
            .position(|b| b.config.priority == band_priority)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The band a request of `priority` waits in: the band of that priority, else the nearest
    /// lower band, else (below every band) the lowest band.
    pub fn band_for(&self, priority: i32) -> i32 {
        self.bands
            .get(self.band_index(priority))
            .map_or(0, |b| b.config.priority)
    }

    /// The bands' priorities, highest first.
    pub fn band_priorities(&self) -> impl Iterator<Item = i32> + '_ {
        self.bands.iter().map(|b| b.config.priority)
    }

    /// Queues a request, or hands it back when its band or the whole queue is full.
    pub fn enqueue(&mut self, arrival: Arrival<T>) -> Result<QueueKey, (Refusal, T)> {
        let b = self.band_index(arrival.priority);
        let Some(band) = self.bands.get(b) else {
            return Err((Refusal::Saturated, arrival.item));
        };
        let fits = |len: usize, bytes: u64, max_requests: u64, max_bytes: u64| {
            (len as u64) < max_requests
                && bytes
                    .checked_add(arrival.bytes)
                    .is_some_and(|total| total <= max_bytes)
        };
        if !fits(
            band.len,
            band.bytes,
            band.config.max_requests,
            band.config.max_bytes,
        ) || !fits(self.len, self.bytes, self.max_requests, self.max_bytes)
        {
            return Err((Refusal::Saturated, arrival.item));
        }
        let ttl = arrival.ttl_ms.unwrap_or(self.default_ttl_ms);
        let expiry_ms = if ttl == 0 {
            NEVER
        } else {
            arrival.now_ms.saturating_add(ttl).min(NEVER - 1)
        };
        let seq = self.next_seq();
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let Ok(s) = u32::try_from(self.slots.len()) else {
                    return Err((Refusal::Saturated, arrival.item));
                };
                self.slots.push(Slot {
                    generation: 0,
                    entry: None,
                });
                s
            }
        };
        let weights = &self.weights;
        let band = &mut self.bands[b];
        let flow_ix = match band.names.get(arrival.flow.as_str()) {
            Some(&f) => f,
            None => {
                let f = u32::try_from(band.flows.len()).unwrap_or(u32::MAX);
                band.flows.push(Flow {
                    weight: weights.get(arrival.flow.as_str()).copied().unwrap_or(1),
                    counter: 0,
                    live: 0,
                    lane: BTreeSet::new(),
                    turn: None,
                });
                band.names.insert(arrival.flow.clone(), f);
                f
            }
        };
        let order = band.order_key(expiry_ms);
        if let Some(lane) = band.lane_of(flow_ix) {
            lane.insert((order, seq, slot));
        }
        band.len += 1;
        band.bytes += arrival.bytes;
        let fairness = band.config.fairness;
        let floor = band
            .turns
            .first()
            .map_or(band.max_counter, |&(counter, _, _)| counter);
        let turns = &mut band.turns;
        let max_counter = &mut band.max_counter;
        if let Some(flow) = band.flows.get_mut(flow_ix as usize) {
            flow.live += 1;
            if flow.live == 1 {
                let turn = match fairness {
                    FairnessPolicy::GlobalStrict => None,
                    FairnessPolicy::RoundRobin => Some((0, seq)),
                    FairnessPolicy::Weighted => {
                        flow.counter = flow.counter.max(floor);
                        *max_counter = (*max_counter).max(flow.counter);
                        Some((flow.counter, seq))
                    }
                };
                if let Some((c, s)) = turn {
                    turns.insert((c, s, flow_ix));
                }
                flow.turn = turn;
            }
        }
        if expiry_ms != NEVER {
            self.expiry.insert((expiry_ms, seq, slot));
        }
        self.len += 1;
        self.bytes += arrival.bytes;
        let entry = &mut self.slots[slot as usize];
        entry.entry = Some(Queued {
            item: arrival.item,
            flow: arrival.flow,
            band: b as u32,
            flow_ix,
            bytes: arrival.bytes,
            service: arrival.service,
            arrival_ms: arrival.now_ms,
            expiry_ms,
            seq,
        });
        Ok(QueueKey(
            (u64::from(entry.generation) << 32) | u64::from(slot),
        ))
    }

    /// Whether a request of `priority` must queue because a request waits in its band or a
    /// higher one (a new request never overtakes those).
    pub fn blocks(&self, priority: i32) -> bool {
        let i = self.band_index(priority);
        self.bands.iter().take(i + 1).any(|b| b.len > 0)
    }

    /// Takes the next request to serve, if any: from the highest non-empty band, by its
    /// fairness policy across flows and its ordering policy within the flow. Call
    /// [`FlowQueues::expire`] first so that a request past its TTL is not served.
    pub fn dispatch(&mut self, now_ms: u64) -> Option<Dispatched<T>> {
        let b = self.bands.iter().position(|b| b.len > 0)?;
        let band = &self.bands[b];
        let slot = match band.config.fairness {
            FairnessPolicy::GlobalStrict => band.shared.first()?.2,
            FairnessPolicy::RoundRobin | FairnessPolicy::Weighted => {
                let &(_, _, f) = band.turns.first()?;
                band.flows.get(f as usize)?.lane.first()?.2
            }
        };
        let q = self.detach(slot)?;
        let seq = self.next_seq();
        let band = &mut self.bands[b];
        let fairness = band.config.fairness;
        if let Some(flow) = band.flows.get_mut(q.flow_ix as usize) {
            flow.counter = flow.counter.saturating_add(scaled(q.service, flow.weight));
            band.max_counter = band.max_counter.max(flow.counter);
            // Still backlogged: its next turn.
            if let Some((counter, since)) = flow.turn {
                band.turns.remove(&(counter, since, q.flow_ix));
                let next = match fairness {
                    FairnessPolicy::Weighted => (flow.counter, since),
                    _ => (0, seq),
                };
                band.turns.insert((next.0, next.1, q.flow_ix));
                flow.turn = Some(next);
            }
        }
        Some(Dispatched {
            item: q.item,
            band_priority: band.config.priority,
            flow: q.flow,
            queued_ms: now_ms.saturating_sub(q.arrival_ms),
        })
    }

    /// Takes a request out of every structure, freeing its slot, place and bytes.
    fn detach(&mut self, slot: u32) -> Option<Queued<T>> {
        let s = self.slots.get_mut(slot as usize)?;
        let q = s.entry.take()?;
        s.generation = s.generation.wrapping_add(1);
        self.free.push(slot);
        if q.expiry_ms != NEVER {
            self.expiry.remove(&(q.expiry_ms, q.seq, slot));
        }
        self.len -= 1;
        self.bytes -= q.bytes;
        if let Some(band) = self.bands.get_mut(q.band as usize) {
            let order = band.order_key(q.expiry_ms);
            if let Some(lane) = band.lane_of(q.flow_ix) {
                lane.remove(&(order, q.seq, slot));
            }
            band.len -= 1;
            band.bytes -= q.bytes;
            if let Some(flow) = band.flows.get_mut(q.flow_ix as usize) {
                flow.live -= 1;
                if flow.live == 0 {
                    if let Some((counter, since)) = flow.turn.take() {
                        band.turns.remove(&(counter, since, q.flow_ix));
                    }
                }
            }
        }
        Some(q)
    }

    fn removed(&self, q: Queued<T>, now_ms: u64) -> Removed<T> {
        Removed {
            band_priority: self
                .bands
                .get(q.band as usize)
                .map_or(0, |b| b.config.priority),
            item: q.item,
            flow: q.flow,
            queued_ms: now_ms.saturating_sub(q.arrival_ms),
        }
    }

    /// Corrects the counter of `flow` in the band of priority `band_priority` by `delta`
    /// tokens of service (negative: it was charged too much), scaled by its weight as at
    /// dispatch. The counter never goes below 0. An unknown band or flow is ignored.
    pub fn charge(&mut self, band_priority: i32, flow: &str, delta: i64) {
        let Some(b) = self.exact_band(band_priority) else {
            return;
        };
        let band = &mut self.bands[b];
        let Some(&f) = band.names.get(flow) else {
            return;
        };
        let Some(state) = band.flows.get_mut(f as usize) else {
            return;
        };
        let amount = scaled(delta.unsigned_abs(), state.weight);
        let counter = if delta >= 0 {
            state.counter.saturating_add(amount)
        } else {
            state.counter.saturating_sub(amount)
        };
        if let Some((old, since)) = state.turn {
            if band.config.fairness == FairnessPolicy::Weighted {
                band.turns.remove(&(old, since, f));
                band.turns.insert((counter, since, f));
                state.turn = Some((counter, since));
            }
        }
        state.counter = counter;
        band.max_counter = band.max_counter.max(counter);
    }

    /// Takes out a queued request whose client left; `None` if `key` is not queued (already
    /// dispatched, expired or cancelled).
    pub fn cancel(&mut self, key: QueueKey, now_ms: u64) -> Option<Removed<T>> {
        let slot = u32::try_from(key.0 & u64::from(u32::MAX)).ok()?;
        let generation = u32::try_from(key.0 >> 32).ok()?;
        if self.slots.get(slot as usize)?.generation != generation {
            return None;
        }
        let q = self.detach(slot)?;
        Some(self.removed(q, now_ms))
    }

    /// Whether `key` is still queued.
    pub fn contains(&self, key: QueueKey) -> bool {
        let slot = (key.0 & u64::from(u32::MAX)) as usize;
        self.slots
            .get(slot)
            .is_some_and(|s| u64::from(s.generation) == key.0 >> 32 && s.entry.is_some())
    }

    /// Takes out every request whose TTL has passed (`now − arrival ≥ ttl`), earliest
    /// expiry first.
    pub fn expire(&mut self, now_ms: u64) -> Vec<Removed<T>> {
        let mut out = Vec::new();
        while let Some(&(expiry, _, slot)) = self.expiry.first() {
            if expiry > now_ms {
                break;
            }
            match self.detach(slot) {
                Some(q) => out.push(self.removed(q, now_ms)),
                // Unreachable while the structures agree; never loop on a stale entry.
                None => {
                    self.expiry.pop_first();
                }
            }
        }
        out
    }

    /// When the earliest TTL expires (so a host can sleep until then); `None` when no
    /// queued request has a TTL.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        self.expiry.first().map(|&(expiry, _, _)| expiry)
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Requests queued in all bands.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Body bytes queued in all bands.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Requests of `flow` queued in the band of priority `band_priority` (0 for an unknown
    /// band or flow).
    pub fn depth(&self, band_priority: i32, flow: &str) -> usize {
        self.exact_band(band_priority)
            .and_then(|b| {
                let band = &self.bands[b];
                let f = *band.names.get(flow)?;
                band.flows.get(f as usize).map(|f| f.live)
            })
            .unwrap_or(0)
    }

    /// Requests queued in the band of priority `band_priority` (0 for an unknown band).
    pub fn band_len(&self, band_priority: i32) -> usize {
        self.exact_band(band_priority)
            .map_or(0, |b| self.bands[b].len)
    }

    /// Body bytes queued in the band of priority `band_priority`.
    pub fn band_bytes(&self, band_priority: i32) -> u64 {
        self.exact_band(band_priority)
            .map_or(0, |b| self.bands[b].bytes)
    }

    /// Every flow the band of priority `band_priority` has seen, with its queued requests
    /// (for per-flow depth gauges; idle flows report 0).
    pub fn flow_depths(&self, band_priority: i32) -> impl Iterator<Item = (&str, usize)> + '_ {
        let band = self.exact_band(band_priority).map(|b| &self.bands[b]);
        band.into_iter().flat_map(|band| {
            band.names.iter().map(move |(name, &f)| {
                (
                    name.as_str(),
                    band.flows.get(f as usize).map_or(0, |f| f.live),
                )
            })
        })
    }

    /// The virtual counter of `flow` in band `band_priority`, in tokens of service per unit
    /// of weight (`None` for an unknown band or flow). Only the weighted policy orders by it;
    /// every policy keeps it.
    pub fn virtual_counter(&self, band_priority: i32, flow: &str) -> Option<f64> {
        let band = &self.bands[self.exact_band(band_priority)?];
        let f = band.flows.get(*band.names.get(flow)? as usize)?;
        Some(f.counter as f64 / f64::from(1u32 << COUNTER_SHIFT))
    }
}
