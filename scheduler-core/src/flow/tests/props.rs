//! Property tests of the queues: weighted shares under saturation (also with unequal request
//! sizes), round-robin request counts, a returning flow's wait, and, for arbitrary sequences
//! of enqueues, dispatches, cancels, expiries and charges under every policy, that no request
//! is lost or duplicated, that limits always hold, that bands are strict and that a flow's
//! FCFS order is kept.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use proptest::prelude::*;

use super::{arrival, bands};
use crate::flow::config::{BandConfig, FairnessPolicy, FlowControlConfig, OrderingPolicy};
use crate::flow::queues::{Arrival, FlowQueues, QueueKey};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const FAIRNESS: [FairnessPolicy; 3] = [
    FairnessPolicy::RoundRobin,
    FairnessPolicy::GlobalStrict,
    FairnessPolicy::Weighted,
];
const ORDERING: [OrderingPolicy; 2] = [OrderingPolicy::Fcfs, OrderingPolicy::Edf];

/// A small deterministic generator for request sizes inside one case.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn in_range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Keeps flows A and B backlogged (refilled to `backlog` queued each) and dispatches `n`
/// times; returns the service each received and their dispatch counts.
fn saturate(
    fairness: FairnessPolicy,
    weights: &[(&str, u32)],
    sizes: [(u64, u64); 2],
    n: usize,
    seed: u64,
) -> ([u64; 2], [u64; 2]) {
    let mut q: FlowQueues<(usize, u64)> = FlowQueues::new(&FlowControlConfig {
        weights: weights.iter().map(|(f, w)| ((*f).into(), *w)).collect(),
        ..bands(&[(0, fairness, OrderingPolicy::Fcfs)])
    });
    let mut rng = Rng(seed | 1);
    let names = ["A", "B"];
    let backlog = 8;
    let mut service = [0u64; 2];
    let mut count = [0u64; 2];
    for now in 0..n as u64 {
        for (f, name) in names.iter().enumerate() {
            while q.depth(0, name) < backlog {
                let s = rng.in_range(sizes[f].0, sizes[f].1);
                let a = Arrival {
                    priority: 0,
                    flow: (*name).into(),
                    bytes: 1,
                    service: s,
                    ttl_ms: Some(0),
                    now_ms: now,
                    item: (f, s),
                };
                assert!(q.enqueue(a).is_ok());
            }
        }
        let d = q.dispatch(now).expect("backlogged");
        let (f, s) = d.item;
        service[f] += s;
        count[f] += 1;
    }
    (service, count)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn weighted_three_to_one_receive_service_three_to_one(
        seed in any::<u64>(),
        base in 20u64..400,
        spread in 0u64..200,
        a_longer in any::<bool>(),
    ) {
        // A's requests are as long as B's, or ten times longer.
        let factor = if a_longer { 10 } else { 1 };
        let a = (base * factor, (base + spread) * factor);
        let b = (base, base + spread);
        let (service, _) = saturate(
            FairnessPolicy::Weighted, &[("A", 3), ("B", 1)], [a, b], 4_000, seed);
        let ratio = service[0] as f64 / service[1] as f64;
        prop_assert!((ratio - 3.0).abs() <= 0.15, "A:B = {ratio} ({service:?})");
    }

    #[test]
    fn round_robin_gives_equal_request_counts(
        seed in any::<u64>(),
        a_longer in any::<bool>(),
    ) {
        let factor = if a_longer { 10 } else { 1 };
        let (_, count) = saturate(
            FairnessPolicy::RoundRobin, &[("A", 3)], [(100 * factor, 200 * factor), (100, 200)],
            2_001, seed);
        prop_assert!(count[0].abs_diff(count[1]) <= 1, "{count:?}");
    }

    #[test]
    fn a_returning_flow_is_served_within_one_round(
        flows in 1usize..12,
        served in 0usize..200,
        sizes in proptest::collection::vec(1u64..1000, 12),
        weighted in any::<bool>(),
    ) {
        let fairness = if weighted { FairnessPolicy::Weighted } else { FairnessPolicy::RoundRobin };
        let mut q: FlowQueues<u32> = FlowQueues::new(&bands(&[(0, fairness, OrderingPolicy::Fcfs)]));
        let name = |i: usize| format!("f{i}");
        for (i, &size) in sizes.iter().enumerate().take(flows) {
            for k in 0..400u32 {
                let mut a = arrival(0, &name(i), k, 0);
                a.service = size;
                prop_assert!(q.enqueue(a).is_ok());
            }
        }
        // The newcomer's flow has been idle (or never seen) while the others were served.
        for _ in 0..served {
            q.dispatch(1).expect("backlogged");
        }
        let mut a = arrival(0, "new", 9999, 2);
        a.service = 500;
        prop_assert!(q.enqueue(a).is_ok());
        let wait = (1..=flows + 1).find(|_| q.dispatch(3).is_some_and(|d| d.flow == "new"));
        prop_assert!(wait.is_some(), "not served within {} dispatches", flows + 1);
    }
}

/// One step of an arbitrary workload.
#[derive(Clone, Debug)]
enum Op {
    Enqueue {
        priority: i32,
        flow: u8,
        bytes: u64,
        service: u64,
        ttl: Option<u64>,
    },
    Dispatch,
    Cancel(usize),
    Advance(u64),
    Charge {
        band: usize,
        flow: u8,
        delta: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (-30i32..130, 0u8..5, 0u64..400, 0u64..2000,
              prop_oneof![Just(None), (0u64..300).prop_map(Some)])
            .prop_map(|(priority, flow, bytes, service, ttl)| Op::Enqueue {
                priority, flow, bytes, service, ttl }),
        3 => Just(Op::Dispatch),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (0u64..120).prop_map(Op::Advance),
        1 => (0usize..3, 0u8..5, -500i64..500)
            .prop_map(|(band, flow, delta)| Op::Charge { band, flow, delta }),
    ]
}

/// What the model knows of a queued request.
#[derive(Clone, Debug)]
struct Known {
    band: i32,
    flow: String,
    bytes: u64,
    seq: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_request_comes_out_exactly_once_and_limits_hold(
        policies in proptest::collection::vec((0usize..3, 0usize..2), 3),
        band_limits in proptest::collection::vec((1u64..12, 100u64..3000), 3),
        global in (1u64..30, 200u64..6000),
        default_ttl in prop_oneof![Just(0u64), 1u64..500],
        ops in proptest::collection::vec(op(), 0..300),
    ) {
        let priorities = [100, 0, -10];
        let config = FlowControlConfig {
            max_requests: global.0,
            max_bytes: global.1,
            default_ttl_ms: default_ttl,
            bands: (0..3)
                .map(|i| BandConfig {
                    priority: priorities[i],
                    max_requests: band_limits[i].0,
                    max_bytes: band_limits[i].1,
                    fairness: FAIRNESS[policies[i].0],
                    ordering: ORDERING[policies[i].1],
                })
                .collect(),
            weights: vec![("f0".into(), 3), ("f1".into(), 2)],
            ..FlowControlConfig::default()
        };
        let mut q: FlowQueues<u64> = FlowQueues::new(&config);
        let mut now = 0u64;
        let mut next_item = 0u64;
        let mut queued: BTreeMap<u64, Known> = BTreeMap::new();
        let mut keys: Vec<(QueueKey, u64)> = Vec::new();
        let mut out: BTreeMap<u64, &'static str> = BTreeMap::new();
        let mut refused = 0usize;
        let mut accepted = 0usize;
        // Per (band, flow): the sequence of the last FCFS-dispatched request.
        let mut last_fcfs: BTreeMap<(i32, String), u64> = BTreeMap::new();
        let band_cfg = |p: i32| config.bands.iter().find(|b| b.priority == p).cloned();

        let take = |item: u64, how: &'static str, out: &mut BTreeMap<u64, &'static str>,
                        queued: &mut BTreeMap<u64, Known>| -> Result<Known, TestCaseError> {
            prop_assert!(out.insert(item, how).is_none(), "item {item} came out twice");
            queued.remove(&item).ok_or_else(|| TestCaseError::fail(format!("{item} was not queued")))
        };

        for op in ops {
            match op {
                Op::Enqueue { priority, flow, bytes, service, ttl } => {
                    let band = q.band_for(priority);
                    let b = band_cfg(band).expect("a band");
                    let band_len = queued.values().filter(|k| k.band == band).count() as u64;
                    let band_bytes: u64 = queued.values().filter(|k| k.band == band).map(|k| k.bytes).sum();
                    let all_bytes: u64 = queued.values().map(|k| k.bytes).sum();
                    let fits = band_len < b.max_requests
                        && band_bytes + bytes <= b.max_bytes
                        && (queued.len() as u64) < config.max_requests
                        && all_bytes + bytes <= config.max_bytes;
                    let item = next_item;
                    next_item += 1;
                    let name = format!("f{flow}");
                    let r = q.enqueue(Arrival {
                        priority, flow: name.clone(), bytes, service, ttl_ms: ttl, now_ms: now, item,
                    });
                    match r {
                        Ok(key) => {
                            prop_assert!(fits, "accepted over a limit");
                            accepted += 1;
                            queued.insert(item, Known { band, flow: name, bytes, seq: item });
                            keys.push((key, item));
                        }
                        Err((_, back)) => {
                            prop_assert!(!fits, "refused although it fits");
                            prop_assert_eq!(back, item);
                            refused += 1;
                        }
                    }
                }
                Op::Dispatch => {
                    let highest = queued.values().map(|k| k.band).max();
                    match q.dispatch(now) {
                        None => prop_assert!(queued.is_empty()),
                        Some(d) => {
                            prop_assert_eq!(Some(d.band_priority), highest, "bands are strict");
                            let k = take(d.item, "dispatch", &mut out, &mut queued)?;
                            prop_assert_eq!(&k.flow, &d.flow);
                            prop_assert_eq!(k.band, d.band_priority);
                            let b = band_cfg(k.band).expect("a band");
                            if b.ordering == OrderingPolicy::Fcfs
                                && b.fairness != FairnessPolicy::GlobalStrict
                            {
                                let last = last_fcfs.insert((k.band, k.flow.clone()), k.seq);
                                prop_assert!(last.is_none_or(|l| l < k.seq), "FCFS order broken");
                                // Nothing older of the same flow is still queued.
                                prop_assert!(!queued.values().any(|o| o.band == k.band
                                    && o.flow == k.flow && o.seq < k.seq));
                            }
                        }
                    }
                }
                Op::Cancel(i) => {
                    if !keys.is_empty() {
                        let (key, item) = keys[i % keys.len()];
                        let was = queued.contains_key(&item);
                        match q.cancel(key, now) {
                            Some(r) => {
                                prop_assert!(was);
                                prop_assert_eq!(r.item, item);
                                take(item, "cancel", &mut out, &mut queued)?;
                            }
                            None => prop_assert!(!was, "a queued request could not be cancelled"),
                        }
                        prop_assert!(!q.contains(key));
                    }
                }
                Op::Advance(dt) => {
                    now += dt;
                    for r in q.expire(now) {
                        take(r.item, "expire", &mut out, &mut queued)?;
                    }
                    if let Some(t) = q.next_deadline_ms() {
                        prop_assert!(t > now);
                    }
                }
                Op::Charge { band, flow, delta } => {
                    q.charge(priorities[band], &format!("f{flow}"), delta);
                }
            }
            // The structures agree with the model after every step.
            prop_assert_eq!(q.len(), queued.len());
            prop_assert_eq!(q.is_empty(), queued.is_empty());
            prop_assert_eq!(q.bytes(), queued.values().map(|k| k.bytes).sum::<u64>());
            prop_assert!(q.len() as u64 <= config.max_requests);
            prop_assert!(q.bytes() <= config.max_bytes);
            for b in &config.bands {
                let n = queued.values().filter(|k| k.band == b.priority).count();
                prop_assert_eq!(q.band_len(b.priority), n);
                prop_assert!(n as u64 <= b.max_requests);
                prop_assert!(q.band_bytes(b.priority) <= b.max_bytes);
                for f in 0..5 {
                    let name = format!("f{f}");
                    let d = queued.values().filter(|k| k.band == b.priority && k.flow == name).count();
                    prop_assert_eq!(q.depth(b.priority, &name), d);
                }
            }
        }
        // Whatever is left comes out through expiry or dispatch, exactly once.
        for r in q.expire(u64::MAX - 1) {
            take(r.item, "expire", &mut out, &mut queued)?;
        }
        while let Some(d) = q.dispatch(u64::MAX) {
            take(d.item, "dispatch", &mut out, &mut queued)?;
        }
        prop_assert!(queued.is_empty());
        prop_assert!(q.is_empty() && q.bytes() == 0 && q.next_deadline_ms().is_none());
        prop_assert_eq!(out.len(), accepted);
        prop_assert_eq!(accepted + refused, next_item as usize);
    }
}
