//! The queues: strict bands, the fairness and ordering policies, limits, TTLs, cancellation.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use super::{arrival, bands, drain, drain_flows, one_band};
use crate::flow::config::{BandConfig, FairnessPolicy, FlowControlConfig, OrderingPolicy};
use crate::flow::queues::{Arrival, FlowQueues, QueueKey, Refusal};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const RR: FairnessPolicy = FairnessPolicy::RoundRobin;
const GS: FairnessPolicy = FairnessPolicy::GlobalStrict;
const W: FairnessPolicy = FairnessPolicy::Weighted;
const FCFS: OrderingPolicy = OrderingPolicy::Fcfs;
const EDF: OrderingPolicy = OrderingPolicy::Edf;

fn seed_like() -> FlowQueues<u32> {
    FlowQueues::new(&bands(&[(0, RR, FCFS), (100, RR, FCFS), (-10, RR, FCFS)]))
}

fn put(q: &mut FlowQueues<u32>, a: Arrival<u32>) -> QueueKey {
    q.enqueue(a).unwrap_or_else(|_| panic!("refused"))
}

#[test]
fn a_priority_waits_in_its_band_else_the_nearest_lower_else_the_lowest() {
    let q = seed_like();
    assert_eq!(q.band_priorities().collect::<Vec<_>>(), [100, 0, -10]);
    for (p, band) in [
        (100, 100),
        (1000, 100),
        (99, 0),
        (0, 0),
        (-1, -10),
        (-10, -10),
        (-11, -10),
        (i32::MIN, -10),
        (i32::MAX, 100),
    ] {
        assert_eq!(q.band_for(p), band, "priority {p}");
    }
}

#[test]
fn strict_priority_a_later_high_priority_request_dispatches_first() {
    let mut q = seed_like();
    for i in 0..5 {
        put(&mut q, arrival(0, "t", i, i.into()));
    }
    put(&mut q, arrival(-10, "t", 50, 6));
    put(&mut q, arrival(100, "t", 99, 7));
    let d = q.dispatch(8).unwrap();
    assert_eq!((d.item, d.band_priority, d.queued_ms), (99, 100, 1));
    assert_eq!(drain(&mut q, 8), [0, 1, 2, 3, 4, 50]);
    assert!(q.is_empty());
    assert!(q.dispatch(9).is_none());
}

#[test]
fn round_robin_alternates_between_flows_whatever_their_queue_lengths() {
    let mut q = FlowQueues::new(&one_band(RR));
    for i in 0..4 {
        put(&mut q, arrival(0, "B", i, 0));
    }
    put(&mut q, arrival(0, "C", 10, 1));
    assert_eq!(drain_flows(&mut q, 2), ["B", "C", "B", "B", "B"]);
}

#[test]
fn round_robin_a_returning_flow_joins_the_back_of_the_round() {
    let mut q = FlowQueues::new(&one_band(RR));
    for i in 0..3 {
        put(&mut q, arrival(0, "A", i, 0));
        put(&mut q, arrival(0, "B", 10 + i, 0));
    }
    assert_eq!(q.dispatch(1).unwrap().flow, "A");
    // C arrives after A was served: B, then A's next turn... C joins behind A.
    put(&mut q, arrival(0, "C", 20, 1));
    assert_eq!(drain_flows(&mut q, 2), ["B", "A", "C", "B", "A", "B"]);
}

#[test]
fn global_strict_ignores_flows() {
    let mut q = FlowQueues::new(&one_band(GS));
    for i in 0..4 {
        put(&mut q, arrival(0, "B", i, 0));
    }
    put(&mut q, arrival(0, "C", 10, 1));
    assert_eq!(drain_flows(&mut q, 2), ["B", "B", "B", "B", "C"]);
    // With EDF the whole band is ordered by deadline.
    let mut q = FlowQueues::new(&bands(&[(0, GS, EDF)]));
    let mut a = arrival(0, "B", 1, 0);
    a.ttl_ms = Some(1000);
    put(&mut q, a);
    let mut a = arrival(0, "C", 2, 10);
    a.ttl_ms = Some(100);
    put(&mut q, a);
    assert_eq!(drain(&mut q, 20), [2, 1]);
}

#[test]
fn edf_orders_a_flow_by_deadline_then_arrival() {
    let mut q = FlowQueues::new(&bands(&[(0, RR, EDF)]));
    // (item, arrival, ttl): deadlines 1000+0, 500+100, default 60 s, 300+200, none, 500+100.
    for (item, now, ttl) in [
        (1, 0, Some(1000)),
        (2, 100, Some(500)),
        (3, 150, None),
        (4, 200, Some(300)),
        (5, 250, Some(0)),
        (6, 100, Some(500)),
    ] {
        let mut a = arrival(0, "f", item, now);
        a.ttl_ms = ttl;
        put(&mut q, a);
    }
    assert_eq!(drain(&mut q, 300), [4, 2, 6, 1, 3, 5]);
}

#[test]
fn fcfs_keeps_arrival_order_within_a_flow() {
    let mut q = FlowQueues::new(&one_band(RR));
    for (item, ttl) in [(1, Some(5000)), (2, Some(10)), (3, None)] {
        let mut a = arrival(0, "f", item, 0);
        a.ttl_ms = ttl;
        put(&mut q, a);
    }
    assert_eq!(drain(&mut q, 1), [1, 2, 3]);
}

fn limited(
    max_requests: u64,
    max_bytes: u64,
    band_requests: u64,
    band_bytes: u64,
) -> FlowQueues<u32> {
    FlowQueues::new(&FlowControlConfig {
        max_requests,
        max_bytes,
        bands: vec![
            BandConfig {
                priority: 10,
                max_requests: band_requests,
                max_bytes: band_bytes,
                fairness: RR,
                ordering: FCFS,
            },
            BandConfig {
                priority: 0,
                max_requests: 1000,
                max_bytes: u64::MAX,
                fairness: RR,
                ordering: FCFS,
            },
        ],
        ..FlowControlConfig::default()
    })
}

#[test]
fn a_full_band_refuses_at_once_and_hands_the_item_back() {
    let mut q = limited(u64::MAX, u64::MAX, 2, u64::MAX);
    put(&mut q, arrival(10, "a", 1, 0));
    put(&mut q, arrival(10, "b", 2, 0));
    assert_eq!(
        q.enqueue(arrival(10, "c", 3, 0)).unwrap_err(),
        (Refusal::Saturated, 3)
    );
    assert_eq!(q.band_len(10), 2);
    // Another band still has room.
    put(&mut q, arrival(0, "c", 4, 0));
    // A dispatch frees a place.
    assert_eq!(q.dispatch(1).unwrap().item, 1);
    put(&mut q, arrival(10, "c", 5, 1));
}

#[test]
fn global_and_byte_limits_refuse_too() {
    let mut q = limited(3, u64::MAX, 100, u64::MAX);
    put(&mut q, arrival(10, "a", 1, 0));
    put(&mut q, arrival(0, "a", 2, 0));
    put(&mut q, arrival(0, "a", 3, 0));
    assert!(q.enqueue(arrival(10, "a", 4, 0)).is_err());
    assert_eq!(q.len(), 3);

    let mut q = limited(u64::MAX, 250, 100, u64::MAX);
    put(&mut q, arrival(0, "a", 1, 0));
    put(&mut q, arrival(10, "a", 2, 0));
    assert_eq!(q.bytes(), 200);
    assert!(q.enqueue(arrival(10, "a", 3, 0)).is_err());
    let mut small = arrival(10, "a", 4, 0);
    small.bytes = 50;
    put(&mut q, small);
    assert_eq!(q.bytes(), 250);

    let mut q = limited(u64::MAX, u64::MAX, 100, 150);
    put(&mut q, arrival(10, "a", 1, 0));
    assert!(q.enqueue(arrival(10, "a", 2, 0)).is_err());
    assert_eq!(q.band_bytes(10), 100);
    let mut huge = arrival(0, "a", 3, 0);
    huge.bytes = u64::MAX - 100;
    put(&mut q, huge);
    assert_eq!(q.bytes(), u64::MAX);
    // A sum that would overflow is refused, not wrapped.
    assert!(q.enqueue(arrival(0, "a", 4, 0)).is_err());
}

#[test]
fn ttl_expires_when_now_minus_arrival_reaches_it() {
    let mut q = FlowQueues::new(&one_band(RR));
    let mut a = arrival(0, "a", 1, 1000);
    a.ttl_ms = Some(500);
    put(&mut q, a);
    put(&mut q, arrival(0, "a", 2, 1000)); // default 60 s
    let mut a = arrival(0, "b", 3, 1000);
    a.ttl_ms = Some(0); // none
    put(&mut q, a);
    assert_eq!(q.next_deadline_ms(), Some(1500));
    assert!(q.expire(1499).is_empty());
    let gone = q.expire(1500);
    assert_eq!(gone.len(), 1);
    assert_eq!(
        (gone[0].item, gone[0].queued_ms, gone[0].band_priority),
        (1, 500, 0)
    );
    assert_eq!(gone[0].flow, "a");
    assert_eq!(q.next_deadline_ms(), Some(61_000));
    assert_eq!(q.len(), 2);
    let gone = q.expire(u64::MAX);
    assert_eq!(gone.iter().map(|r| r.item).collect::<Vec<_>>(), [2]);
    assert_eq!(q.next_deadline_ms(), None);
    assert_eq!(drain(&mut q, u64::MAX), [3]);
}

#[test]
fn a_zero_default_ttl_means_none() {
    let mut q = FlowQueues::new(&FlowControlConfig {
        default_ttl_ms: 0,
        ..FlowControlConfig::default()
    });
    put(&mut q, arrival(0, "a", 1, 0));
    assert_eq!(q.next_deadline_ms(), None);
    assert!(q.expire(u64::MAX).is_empty());
}

#[test]
fn cancel_frees_the_place_and_the_bytes() {
    let mut q = limited(u64::MAX, u64::MAX, 2, u64::MAX);
    let k1 = put(&mut q, arrival(10, "a", 1, 0));
    let k2 = put(&mut q, arrival(10, "b", 2, 0));
    assert!(q.enqueue(arrival(10, "c", 3, 0)).is_err());
    let r = q.cancel(k1, 40).unwrap();
    assert_eq!(
        (r.item, r.queued_ms, r.band_priority, r.flow.as_str()),
        (1, 40, 10, "a")
    );
    assert_eq!((q.len(), q.bytes(), q.depth(10, "a")), (1, 100, 0));
    assert!(!q.contains(k1) && q.contains(k2));
    // Cancelled twice, or a key whose slot was reused: nothing.
    assert!(q.cancel(k1, 41).is_none());
    let k3 = put(&mut q, arrival(10, "c", 3, 1));
    assert!(q.cancel(k1, 42).is_none());
    assert!(q.contains(k3));
    assert!(q.cancel(QueueKey(u64::MAX), 0).is_none());
    // Its TTL went with it; the others are served in order.
    assert_eq!(drain(&mut q, 50), [2, 3]);
    assert!(q.cancel(k2, 51).is_none());
    assert_eq!(q.next_deadline_ms(), None);
}

#[test]
fn cancelling_a_flows_last_request_ends_its_turn() {
    let mut q = FlowQueues::new(&one_band(RR));
    put(&mut q, arrival(0, "A", 1, 0));
    let kb = put(&mut q, arrival(0, "B", 2, 0));
    put(&mut q, arrival(0, "A", 3, 0));
    q.cancel(kb, 1).unwrap();
    assert_eq!(drain_flows(&mut q, 2), ["A", "A"]);
    // B comes back at the end of the round.
    put(&mut q, arrival(0, "A", 4, 3));
    put(&mut q, arrival(0, "A", 5, 3));
    put(&mut q, arrival(0, "B", 6, 3));
    assert_eq!(drain(&mut q, 4), [4, 6, 5]);
}

#[test]
fn blocks_when_the_band_or_a_higher_one_has_a_queued_request() {
    let mut q = seed_like();
    assert!(!q.blocks(0));
    let k = put(&mut q, arrival(0, "a", 1, 0));
    assert!(q.blocks(0));
    assert!(q.blocks(50)); // waits in band 0
    assert!(q.blocks(-10));
    assert!(!q.blocks(100));
    q.cancel(k, 0).unwrap();
    put(&mut q, arrival(100, "a", 2, 0));
    assert!(q.blocks(100) && q.blocks(0) && q.blocks(-100));
}

#[test]
fn depths_per_band_and_flow() {
    let mut q = seed_like();
    put(&mut q, arrival(0, "a", 1, 0));
    put(&mut q, arrival(0, "a", 2, 0));
    put(&mut q, arrival(5, "b", 3, 0));
    put(&mut q, arrival(100, "a", 4, 0));
    assert_eq!(
        (q.depth(0, "a"), q.depth(0, "b"), q.depth(100, "a")),
        (2, 1, 1)
    );
    assert_eq!((q.depth(5, "b"), q.depth(0, "zz")), (0, 0));
    assert_eq!(
        (
            q.band_len(0),
            q.band_len(100),
            q.band_len(-10),
            q.band_len(7)
        ),
        (3, 1, 0, 0)
    );
    let mut flows: Vec<(String, usize)> = q.flow_depths(0).map(|(f, n)| (f.into(), n)).collect();
    flows.sort();
    assert_eq!(flows, [("a".into(), 2), ("b".into(), 1)]);
    assert_eq!(q.len(), 4);
    assert_eq!(q.bytes(), 400);
}

fn weighted(weights: &[(&str, u32)]) -> FlowQueues<u32> {
    FlowQueues::new(&FlowControlConfig {
        weights: weights.iter().map(|(f, w)| ((*f).into(), *w)).collect(),
        ..one_band(W)
    })
}

#[test]
fn weighted_serves_the_smallest_counter_first() {
    let mut q = weighted(&[("A", 3)]);
    for i in 0..8 {
        put(&mut q, arrival(0, "A", i, 0));
        put(&mut q, arrival(0, "B", 100 + i, 0));
    }
    // Each request is 10 tokens: A's counter grows by 10/3, B's by 10. Ties go to the flow
    // backlogged longest (A).
    let order: String = (0..8).map(|_| q.dispatch(1).unwrap().flow).collect();
    assert_eq!(order, "ABAAABAA");
    assert_eq!(q.virtual_counter(0, "B"), Some(20.0));
    let a = q.virtual_counter(0, "A").unwrap();
    assert!((a - 60.0 / 3.0).abs() < 1e-3, "{a}");
}

#[test]
fn weighted_counts_service_not_requests() {
    let mut q = weighted(&[]);
    for i in 0..10 {
        let mut a = arrival(0, "long", i, 0);
        a.service = 100;
        put(&mut q, a);
        put(&mut q, arrival(0, "short", 100 + i, 0));
    }
    // One 100-token request, then ten 10-token ones.
    let order: Vec<String> = (0..12).map(|_| q.dispatch(1).unwrap().flow).collect();
    let shorts = order.iter().filter(|f| *f == "short").count();
    assert_eq!(order[0], "long");
    assert_eq!(shorts, 10, "{order:?}");
}

#[test]
fn weighted_a_returning_flow_is_lifted_to_the_smallest_backlogged_counter() {
    let mut q = weighted(&[]);
    for i in 0..20 {
        put(&mut q, arrival(0, "A", i, 0));
    }
    for _ in 0..10 {
        q.dispatch(1).unwrap();
    }
    assert_eq!(q.virtual_counter(0, "A"), Some(100.0));
    // B was never backlogged: it starts at A's counter, not at 0 (no credit for idling),
    // so the two alternate instead of B taking ten turns in a row.
    put(&mut q, arrival(0, "B", 100, 2));
    put(&mut q, arrival(0, "B", 101, 2));
    assert_eq!(q.virtual_counter(0, "B"), Some(100.0));
    let order: String = (0..4).map(|_| q.dispatch(3).unwrap().flow).collect();
    assert_eq!(order, "ABAB");
}

#[test]
fn weighted_an_empty_band_lifts_a_returning_flow_to_the_largest_counter() {
    let mut q = weighted(&[]);
    put(&mut q, arrival(0, "A", 1, 0));
    put(&mut q, arrival(0, "B", 2, 0));
    let mut big = arrival(0, "B", 3, 0);
    big.service = 1000;
    put(&mut q, big);
    drain(&mut q, 1);
    assert_eq!(q.virtual_counter(0, "A"), Some(10.0));
    assert_eq!(q.virtual_counter(0, "B"), Some(1010.0));
    // Nobody is backlogged; A returns and is lifted to 1010, so B, returning next, does not
    // find A with 1000 tokens of credit.
    put(&mut q, arrival(0, "A", 4, 2));
    assert_eq!(q.virtual_counter(0, "A"), Some(1010.0));
    put(&mut q, arrival(0, "B", 5, 2));
    put(&mut q, arrival(0, "A", 6, 2));
    assert_eq!(drain_flows(&mut q, 3), ["A", "B", "A"]);
}

#[test]
fn charge_corrects_a_counter_and_never_goes_below_zero() {
    let mut q = weighted(&[("A", 2)]);
    for i in 0..4 {
        put(&mut q, arrival(0, "A", i, 0));
        put(&mut q, arrival(0, "B", 10 + i, 0));
    }
    let first = q.dispatch(1).unwrap();
    assert_eq!(first.flow, "A");
    assert_eq!(q.virtual_counter(0, "A"), Some(5.0));
    // The request turned out 100 tokens longer: A is now behind B.
    q.charge(0, "A", 100);
    assert_eq!(q.virtual_counter(0, "A"), Some(55.0));
    assert_eq!(q.dispatch(1).unwrap().flow, "B");
    assert_eq!(q.dispatch(1).unwrap().flow, "B");
    q.charge(0, "A", -1000);
    assert_eq!(q.virtual_counter(0, "A"), Some(0.0));
    assert_eq!(q.dispatch(1).unwrap().flow, "A");
    // Unknown band or flow: ignored.
    q.charge(7, "A", 5);
    q.charge(0, "nobody", 5);
    assert_eq!(q.virtual_counter(0, "nobody"), None);
}

#[test]
fn a_configuration_without_bands_gets_one() {
    let mut q: FlowQueues<u32> = FlowQueues::new(&FlowControlConfig {
        bands: Vec::new(),
        max_requests: 1,
        ..FlowControlConfig::default()
    });
    assert_eq!(q.band_for(42), 0);
    put(&mut q, arrival(-3, "a", 1, 0));
    assert!(q.enqueue(arrival(0, "a", 2, 0)).is_err());
    assert_eq!(drain(&mut q, 0), [1]);
}

#[test]
fn the_item_needs_no_clone() {
    struct Handle(#[allow(dead_code)] Vec<u8>);
    let mut q: FlowQueues<Handle> = FlowQueues::new(&one_band(RR));
    let k = q
        .enqueue(Arrival {
            priority: 0,
            flow: "x".into(),
            bytes: 1,
            service: 1,
            ttl_ms: None,
            now_ms: 0,
            item: Handle(vec![1]),
        })
        .map_err(|_| ())
        .unwrap();
    assert!(q.cancel(k, 0).is_some());
}
