//! The `flow_config` target: the flow-control configuration compiler
//! (`scheduler_core::flow::FlowControlConfig::compile`, with the scheduler compiled from the
//! same document) and the queues a compiled configuration sets up, on any bytes.
//!
//! Input: a JSON document (an `EndpointPickerConfig`), then a script: the bytes after the
//! document, read as queue operations ([`Op`]) run against `FlowQueues` of the compiled
//! configuration (the defaults when `featureGates` leaves flow control off) and against a
//! plain model of what is queued. Every operation's answer is checked against the model:
//! limits, strict bands, order within a flow, expiry times, and that every queued request
//! leaves exactly once. Every string and number of the document also goes through the
//! quantity and duration parsers.

use std::collections::{BTreeMap, VecDeque};

use scheduler_core::flow::config::MAX_BANDS;
use scheduler_core::flow::quantity::{parse_duration_ms, parse_quantity};
use scheduler_core::flow::{
    Arrival, BandConfig, FairnessPolicy, FlowControlConfig, FlowQueues, OrderingPolicy, QueueKey,
    DEFAULT_FLOW,
};
use scheduler_core::scheduling::{EndpointPickerConfig, Scheduler};
use serde_json::Value;

/// The most operations one input runs (each checks the whole model, so the cost of an
/// input stays quadratic in a bounded number).
const MAX_OPS: usize = 512;

/// The expiry of a request without TTL in the model (as the queues keep it).
const NEVER: u64 = u64::MAX;

/// Any bytes: a JSON document compiles to a flow-control configuration (and a scheduler) or
/// an error that says what is wrong, never a panic; a configuration that compiles keeps its
/// documented shape and drives queues that keep their promises (see the module doc).
pub fn flow_config(data: &[u8]) {
    let mut documents = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
    let Some(Ok(value)) = documents.next() else {
        return;
    };
    let script = data.get(documents.byte_offset()..).unwrap_or_default();
    check_scalars(&value);
    let cfg = match EndpointPickerConfig::from_value(value) {
        Ok(cfg) => cfg,
        Err(error) => return names_culprit(&error),
    };
    if let Err(error) = Scheduler::new(&cfg) {
        names_culprit(&error);
    }
    let flow = match FlowControlConfig::compile(&cfg) {
        Ok(Some(flow)) => flow,
        Ok(None) => FlowControlConfig::default(),
        Err(error) => return names_culprit(&error),
    };
    check_compiled(&flow);
    Run::new(&flow).script(script);
}

/// An error always says where (its message is never empty).
fn names_culprit(error: &impl std::fmt::Display) {
    assert!(!error.to_string().is_empty(), "an error without a message");
}

/// Every string (keys too) and number of the document through the quantity and duration
/// parsers: an answer or a message, and the values a plain number must give.
fn check_scalars(value: &Value) {
    match value {
        Value::String(s) => check_scalar_string(value, s),
        Value::Number(n) => {
            let quantity = parse_quantity(value);
            let duration = parse_duration_ms(value);
            for e in [quantity.as_ref().err(), duration.as_ref().err()]
                .into_iter()
                .flatten()
            {
                assert!(!e.is_empty(), "{n}: an error without a message");
            }
            if let Some(v) = n.as_u64() {
                assert_eq!(quantity, Ok(v), "the count {v}");
                let text = Value::String(v.to_string());
                assert_eq!(parse_quantity(&text), Ok(v), "the quantity \"{v}\"");
                // Seconds below 2^53 ms are exact.
                if v <= (1u64 << 53) / 1000 {
                    assert_eq!(duration, Ok(v * 1000), "{v} seconds");
                }
                let ms = Value::String(format!("{v}ms"));
                assert_eq!(parse_duration_ms(&ms), Ok(v), "\"{v}ms\"");
            } else if n.as_i64().is_some() {
                assert!(
                    quantity.is_err() && duration.is_err(),
                    "negative {n} accepted"
                );
            }
        }
        Value::Array(items) => items.iter().for_each(check_scalars),
        Value::Object(map) => {
            for (k, v) in map {
                check_scalar_string(&Value::String(k.clone()), k);
                check_scalars(v);
            }
        }
        Value::Null | Value::Bool(_) => {
            assert!(parse_quantity(value).is_err() && parse_duration_ms(value).is_err());
        }
    }
}

fn check_scalar_string(value: &Value, s: &str) {
    let quantity = parse_quantity(value);
    let duration = parse_duration_ms(value);
    for e in [quantity.as_ref().err(), duration.as_ref().err()]
        .into_iter()
        .flatten()
    {
        assert!(!e.is_empty(), "{s:?}: an error without a message");
    }
    // Plain digits are the number they spell (when it fits).
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        assert_eq!(
            quantity.as_ref().ok(),
            s.parse::<u64>().ok().as_ref(),
            "the quantity {s:?}"
        );
    }
    if s.trim_start().starts_with('-') {
        assert!(quantity.is_err(), "the negative quantity {s:?} accepted");
        assert!(duration.is_err(), "the negative duration {s:?} accepted");
    }
}

/// The documented shape of a compiled configuration.
fn check_compiled(flow: &FlowControlConfig) {
    assert!(!flow.bands.is_empty() && flow.bands.len() <= MAX_BANDS);
    assert!(
        flow.bands.windows(2).all(|w| w[0].priority > w[1].priority),
        "bands not strictly highest first: {:?}",
        flow.bands
    );
    for b in &flow.bands {
        // A limit of 0 means the default: a band is always bounded and never zero.
        assert!(b.max_requests > 0 && b.max_bytes > 0, "{b:?}");
    }
    assert!(flow.max_requests > 0 && flow.max_bytes > 0);
    for (i, (id, w)) in flow.weights.iter().enumerate() {
        assert!(!id.is_empty());
        assert!(
            (1..=scheduler_core::flow::config::MAX_FLOW_WEIGHT).contains(w),
            "{id}: {w}"
        );
        assert!(flow.weights[..i].iter().all(|(other, _)| other != id));
        assert_eq!(flow.weight_of(id), *w);
    }
}

/// The bytes of the script, read front to back.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.byte()?, self.byte()?]))
    }
}

/// One queue operation of the script: an opcode byte (modulo 8), then its operands.
#[derive(Debug)]
enum Op {
    /// Opcodes 0-2: priority, flow, bytes (`u16`), service, TTL.
    Enqueue,
    /// Opcodes 3-4.
    Dispatch,
    /// Opcode 5: a byte choosing a queued key, or (high bit) one that left.
    Cancel,
    /// Opcode 6: how far the clock moves, then expire.
    Expire,
    /// Opcode 7: band, flow, and a `u16` delta.
    Charge,
}

impl Op {
    fn of(code: u8) -> Op {
        match code % 8 {
            0..=2 => Op::Enqueue,
            3 | 4 => Op::Dispatch,
            5 => Op::Cancel,
            6 => Op::Expire,
            _ => Op::Charge,
        }
    }
}

/// What the model knows of one queued request.
#[derive(Debug)]
struct Held {
    id: u64,
    key: QueueKey,
    band: i32,
    flow: String,
    bytes: u64,
    /// [`NEVER`] without TTL.
    expiry: u64,
    /// Arrival order.
    seq: u64,
    arrival_ms: u64,
}

/// The queues under test and the model they are checked against.
struct Run<'c> {
    cfg: &'c FlowControlConfig,
    queues: FlowQueues<u64>,
    /// Queued requests, in arrival order.
    held: Vec<Held>,
    /// Keys of requests that left (a cancel of one finds nothing).
    gone: Vec<QueueKey>,
    now: u64,
    next_id: u64,
    /// Requests accepted by `enqueue`, and those that left (dispatched, cancelled, expired).
    accepted: u64,
    left: u64,
    priorities: Vec<i32>,
    flows: Vec<String>,
    /// Per round-robin band, its backlogged flows in turn order (next first).
    rounds: BTreeMap<i32, VecDeque<String>>,
}

impl<'c> Run<'c> {
    fn new(cfg: &'c FlowControlConfig) -> Run<'c> {
        // Each band's priority and its neighbours, and the extremes: exact, between and
        // beyond the bands.
        let mut priorities = vec![i32::MIN, i32::MAX];
        for b in &cfg.bands {
            priorities.extend([
                b.priority,
                b.priority.saturating_add(1),
                b.priority.saturating_sub(1),
            ]);
        }
        let mut flows: Vec<String> = [DEFAULT_FLOW, "a", "b", "c"].map(String::from).to_vec();
        flows.extend(cfg.weights.iter().take(16).map(|(id, _)| id.clone()));
        Run {
            cfg,
            queues: FlowQueues::new(cfg),
            held: Vec::new(),
            gone: Vec::new(),
            now: 1_000,
            next_id: 0,
            accepted: 0,
            left: 0,
            priorities,
            flows,
            rounds: BTreeMap::new(),
        }
    }

    fn script(mut self, bytes: &[u8]) {
        let mut s = Script(bytes);
        for _ in 0..MAX_OPS {
            let Some(code) = s.byte() else {
                break;
            };
            let done = match Op::of(code) {
                Op::Enqueue => self.enqueue(&mut s),
                Op::Dispatch => {
                    self.dispatch();
                    Some(())
                }
                Op::Cancel => self.cancel(&mut s),
                Op::Expire => self.expire(&mut s),
                Op::Charge => self.charge(&mut s),
            };
            if done.is_none() {
                break;
            }
            self.check_counts();
        }
        assert_eq!(
            self.accepted,
            self.left + self.queues.len() as u64,
            "a request neither left nor is counted"
        );
        // Everything still queued comes out, each once.
        for _ in 0..=self.held.len() {
            self.dispatch();
        }
        assert!(self.held.is_empty() && self.queues.is_empty());
        self.check_counts();
        assert_eq!(self.accepted, self.left);
    }

    /// The band a request of `priority` waits in: that priority's, else the nearest lower
    /// one, else the lowest.
    fn band_of(&self, priority: i32) -> &'c BandConfig {
        let bands = &self.cfg.bands;
        let lowest = &bands[bands.len() - 1];
        bands
            .iter()
            .find(|b| b.priority <= priority)
            .unwrap_or(lowest)
    }

    fn band_config(&self, priority: i32) -> Option<&'c BandConfig> {
        self.cfg.bands.iter().find(|b| b.priority == priority)
    }

    /// Takes `id` out of the model: it must be there (each request leaves once).
    fn take(&mut self, id: u64) -> Option<Held> {
        let at = self.held.iter().position(|h| h.id == id);
        assert!(
            at.is_some(),
            "request {id} left the queue but was not queued (or left twice)"
        );
        self.left += 1;
        let h = self.held.remove(at?);
        self.gone.push(h.key);
        assert!(
            !self.queues.contains(h.key),
            "{id} left but is still queued"
        );
        // A flow that goes idle leaves the round (and joins at the back when it returns).
        if self.depth_in(h.band, &h.flow) == 0 {
            if let Some(round) = self.rounds.get_mut(&h.band) {
                round.retain(|f| f != &h.flow);
            }
        }
        Some(h)
    }

    /// Requests of `flow` the model holds in `band`.
    fn depth_in(&self, band: i32, flow: &str) -> usize {
        self.held
            .iter()
            .filter(|h| h.band == band && h.flow == flow)
            .count()
    }

    /// The virtual counter of every flow with requests in `band`.
    fn backlogged_counters(&self, band: i32) -> Vec<(String, f64)> {
        let mut flows: Vec<&str> = self
            .held
            .iter()
            .filter(|h| h.band == band)
            .map(|h| h.flow.as_str())
            .collect();
        flows.sort_unstable();
        flows.dedup();
        flows
            .into_iter()
            .map(|f| {
                let c = self.queues.virtual_counter(band, f);
                assert!(c.is_some(), "backlogged flow {f} of band {band} unknown");
                (f.to_owned(), c.unwrap_or(f64::NAN))
            })
            .collect()
    }

    fn pick<T>(options: &[T], b: u8) -> &T {
        &options[usize::from(b) % options.len()]
    }

    fn enqueue(&mut self, s: &mut Script<'_>) -> Option<()> {
        let priority = *Self::pick(&self.priorities, s.byte()?);
        let flow = Self::pick(&self.flows, s.byte()?).clone();
        let raw = s.u16()?;
        // Small bodies, or (high bit) large ones that reach the byte limits, or the most.
        let bytes = match raw {
            u16::MAX => u64::MAX,
            r if r & 0x8000 != 0 => u64::from(r & 0x7fff) << 20,
            r => u64::from(r),
        };
        let service = match s.byte()? {
            u8::MAX => u64::MAX,
            v => u64::from(v) * 100,
        };
        let ttl_ms = match s.byte()? {
            0 => None,
            1 => Some(0),
            u8::MAX => Some(u64::MAX),
            v => Some(u64::from(v) * 10),
        };
        let band = self.band_of(priority);
        assert_eq!(self.queues.band_for(priority), band.priority, "{priority}");
        let waiting_here_or_above = self.held.iter().any(|h| h.band >= band.priority);
        assert_eq!(
            self.queues.blocks(priority),
            waiting_here_or_above,
            "blocks({priority})"
        );
        let (band_len, band_bytes) = self.totals(|h| h.band == band.priority);
        let (all_len, all_bytes) = self.totals(|_| true);
        let fits = band_len < band.max_requests
            && band_bytes + u128::from(bytes) <= u128::from(band.max_bytes)
            && all_len < self.cfg.max_requests
            && all_bytes + u128::from(bytes) <= u128::from(self.cfg.max_bytes);
        let idle = self.depth_in(band.priority, &flow) == 0;
        // Weighted: a flow that becomes backlogged is lifted to the least counter of the
        // backlogged ones, keeping any lead it had.
        let lift = (idle && band.fairness == FairnessPolicy::Weighted)
            .then(|| {
                let own = self
                    .queues
                    .virtual_counter(band.priority, &flow)
                    .unwrap_or(0.0);
                let others = self.backlogged_counters(band.priority);
                let floor = others.iter().map(|(_, c)| *c).reduce(f64::min)?;
                Some(own.max(floor))
            })
            .flatten();
        let id = self.next_id;
        self.next_id += 1;
        let answer = self.queues.enqueue(Arrival {
            priority,
            flow: flow.clone(),
            bytes,
            service,
            ttl_ms,
            now_ms: self.now,
            item: id,
        });
        match answer {
            Ok(key) => {
                assert!(fits, "accepted past a limit: {bytes} B at {priority}");
                assert!(self.queues.contains(key));
                let ttl = ttl_ms.unwrap_or(self.cfg.default_ttl_ms);
                let expiry = if ttl == 0 {
                    NEVER
                } else {
                    self.now.saturating_add(ttl).min(NEVER - 1)
                };
                self.accepted += 1;
                if let Some(lifted) = lift {
                    let counter = self.queues.virtual_counter(band.priority, &flow);
                    assert_eq!(counter, Some(lifted), "{flow} became backlogged");
                }
                if idle && band.fairness == FairnessPolicy::RoundRobin {
                    self.rounds
                        .entry(band.priority)
                        .or_default()
                        .push_back(flow.clone());
                }
                self.held.push(Held {
                    id,
                    key,
                    band: band.priority,
                    flow,
                    bytes,
                    expiry,
                    seq: id,
                    arrival_ms: self.now,
                });
            }
            Err((_, item)) => {
                assert!(!fits, "refused within the limits: {bytes} B at {priority}");
                assert_eq!(item, id, "a refusal hands back another request");
            }
        }
        Some(())
    }

    /// Requests and bytes of the held requests that `keep`.
    fn totals(&self, keep: impl Fn(&Held) -> bool) -> (u64, u128) {
        self.held
            .iter()
            .filter(|h| keep(h))
            .fold((0, 0), |(n, b), h| (n + 1, b + u128::from(h.bytes)))
    }

    fn dispatch(&mut self) {
        let top = self.held.iter().map(|h| h.band).max();
        let counters = top.map_or_else(Vec::new, |b| self.backlogged_counters(b));
        let Some(d) = self.queues.dispatch(self.now) else {
            assert!(
                self.held.is_empty(),
                "nothing dispatched from a non-empty queue"
            );
            return;
        };
        let h = self.held.iter().find(|h| h.id == d.item);
        assert!(h.is_some(), "dispatched {} which is not queued", d.item);
        let Some(h) = h else {
            return;
        };
        assert_eq!(d.band_priority, h.band, "dispatched from another band");
        assert_eq!(
            Some(h.band),
            top,
            "a lower band served while a higher one waits"
        );
        assert_eq!(d.flow, h.flow);
        assert_eq!(d.queued_ms, self.now - h.arrival_ms);
        // Within its flow (the whole band under global strict), the ordering policy's first.
        let band = self.band_config(h.band);
        assert!(band.is_some(), "band {} is not configured", h.band);
        let Some(band) = band else {
            return;
        };
        let order = |x: &Held| match band.ordering {
            OrderingPolicy::Fcfs => (0, x.seq),
            OrderingPolicy::Edf => (x.expiry, x.seq),
        };
        let strict = band.fairness == FairnessPolicy::GlobalStrict;
        let first = self
            .held
            .iter()
            .filter(|x| x.band == h.band && (strict || x.flow == h.flow))
            .map(order)
            .min();
        assert_eq!(first, Some(order(h)), "{:?} out of order", band.ordering);
        // Across flows, the fairness policy's next.
        match band.fairness {
            FairnessPolicy::RoundRobin => {
                let turn = self.rounds.get(&h.band).and_then(VecDeque::front);
                assert_eq!(turn, Some(&h.flow), "round robin: not this flow's turn");
            }
            FairnessPolicy::Weighted => {
                let mine = counters.iter().find(|(f, _)| f == &h.flow).map(|(_, c)| *c);
                let least = counters.iter().map(|(_, c)| *c).reduce(f64::min);
                assert!(
                    mine.is_some() && mine <= least,
                    "weighted: {} (counter {mine:?}) served before the least counter {least:?}",
                    h.flow
                );
            }
            FairnessPolicy::GlobalStrict => {}
        }
        let (band_priority, flow, fairness) = (h.band, h.flow.clone(), band.fairness);
        let _ = self.take(d.item);
        // Served and still backlogged: to the back of the round.
        if fairness == FairnessPolicy::RoundRobin && self.depth_in(band_priority, &flow) > 0 {
            if let Some(round) = self.rounds.get_mut(&band_priority) {
                round.rotate_left(1);
            }
        }
    }

    fn cancel(&mut self, s: &mut Script<'_>) -> Option<()> {
        let b = s.byte()?;
        if b & 0x80 == 0 && !self.held.is_empty() {
            let h = &self.held[usize::from(b) % self.held.len()];
            let (id, key) = (h.id, h.key);
            let r = self.queues.cancel(key, self.now);
            assert!(r.is_some(), "cancel of queued {id} found nothing");
            let Some(r) = r else {
                return Some(());
            };
            assert_eq!(r.item, id, "cancel took another request");
            let h = self.take(id)?;
            assert_eq!((r.band_priority, &r.flow), (h.band, &h.flow));
            assert_eq!(r.queued_ms, self.now - h.arrival_ms);
        } else if !self.gone.is_empty() {
            let key = *Self::pick(&self.gone, b);
            assert!(self.queues.cancel(key, self.now).is_none(), "{key:?} left");
        }
        Some(())
    }

    fn expire(&mut self, s: &mut Script<'_>) -> Option<()> {
        let step = match s.byte()? {
            u8::MAX => u64::MAX,
            v if v >= 200 => u64::from(v - 200) * 60_000,
            v => u64::from(v) * 5,
        };
        self.now = self.now.saturating_add(step);
        let now = self.now;
        let mut due: Vec<(u64, u64)> = self
            .held
            .iter()
            .filter(|h| h.expiry != NEVER && h.expiry <= now)
            .map(|h| (h.expiry, h.seq))
            .collect();
        due.sort_unstable();
        let removed = self.queues.expire(now);
        let mut seen = Vec::with_capacity(removed.len());
        for r in removed {
            let Some(h) = self.take(r.item) else {
                continue;
            };
            assert_eq!((r.band_priority, &r.flow), (h.band, &h.flow));
            assert_eq!(r.queued_ms, now - h.arrival_ms);
            seen.push((h.expiry, h.seq));
        }
        assert_eq!(
            seen, due,
            "expired at {now}: not exactly the due ones, earliest first"
        );
        Some(())
    }

    fn charge(&mut self, s: &mut Script<'_>) -> Option<()> {
        let band = *Self::pick(&self.priorities, s.byte()?);
        let flow = Self::pick(&self.flows, s.byte()?).clone();
        let delta = match s.u16()? {
            u16::MAX => i64::MIN,
            0xfffe => i64::MAX,
            v => i64::from(i16::from_le_bytes(v.to_le_bytes())) * 1000,
        };
        let before = self.queues.virtual_counter(band, &flow);
        self.queues.charge(band, &flow, delta);
        let after = self.queues.virtual_counter(band, &flow);
        assert_eq!(
            before.is_some(),
            after.is_some(),
            "charge made a flow appear or vanish"
        );
        if let (Some(b), Some(a)) = (before, after) {
            if delta >= 0 {
                assert!(a >= b, "charged {delta}: {b} → {a}");
            } else {
                assert!(a <= b && a >= 0.0, "charged {delta}: {b} → {a}");
            }
        }
        Some(())
    }

    /// The queues' counts against the model, and every limit.
    fn check_counts(&self) {
        let (len, bytes) = self.totals(|_| true);
        assert_eq!(self.queues.len() as u64, len);
        assert_eq!(u128::from(self.queues.bytes()), bytes);
        assert_eq!(self.queues.is_empty(), self.held.is_empty());
        assert!(len <= self.cfg.max_requests && bytes <= u128::from(self.cfg.max_bytes));
        for band in &self.cfg.bands {
            let (n, b) = self.totals(|h| h.band == band.priority);
            assert_eq!(self.queues.band_len(band.priority) as u64, n);
            assert_eq!(u128::from(self.queues.band_bytes(band.priority)), b);
            assert!(n <= band.max_requests && b <= u128::from(band.max_bytes));
        }
        for flow in &self.flows {
            for band in self.cfg.bands.iter().take(4) {
                let (n, _) = self.totals(|h| h.band == band.priority && &h.flow == flow);
                assert_eq!(self.queues.depth(band.priority, flow) as u64, n);
            }
        }
        let next = self
            .held
            .iter()
            .map(|h| h.expiry)
            .filter(|&e| e != NEVER)
            .min();
        assert_eq!(self.queues.next_deadline_ms(), next);
        for h in &self.held {
            assert!(self.queues.contains(h.key), "{} queued but not found", h.id);
        }
    }
}
