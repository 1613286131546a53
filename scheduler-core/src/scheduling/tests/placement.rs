//! `rendezvous-placement-scorer`: the key, the rendezvous choice, the load bound, the
//! abstain rule, its parameters and its record.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use proptest::prelude::*;

use super::super::placement::{load_bound, rendezvous_weight, PlacementOutcome};
use super::super::{Candidate, Scheduler};
use super::{cand, hashes, m, req, sched, FakePrefix};
use crate::metrics::EndpointMetrics;
use crate::types::{BlockHash, InFlight, Millis};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn placement(params: &str) -> Scheduler {
    sched(&format!(
        r#"{{"plugins":[{{"type":"rendezvous-placement-scorer"{params}}}],
            "schedulingProfiles":[{{"name":"p","plugins":[{{"pluginRef":"rendezvous-placement-scorer"}}]}}]}}"#
    ))
}

const ADDRS: [&str; 4] = [
    "10.0.0.1:8000",
    "10.0.0.2:8000",
    "10.0.0.3:8000",
    "10.0.0.4:8000",
];

/// The candidate that scored 1 (`None` when every score is 0), and the outcome.
fn chosen<'a>(
    s: &Scheduler,
    blocks: &[BlockHash],
    c: &[Candidate<'a>],
    prefix: &FakePrefix,
) -> (Option<&'a str>, PlacementOutcome) {
    let d = s.schedule(&req(blocks), c, prefix, 7, Millis(0));
    let p = &d.profiles()[0];
    let ones: Vec<usize> = (0..c.len())
        .filter(|i| p.raw_score(0, *i) == Some(1.0))
        .collect();
    assert!(ones.len() <= 1, "{ones:?}");
    let note = p.placement(0).copied().expect("a placement note");
    (ones.first().map(|i| c[*i].address), note.outcome)
}

/// Candidates in `order`, the first with `busy` metrics, the others `idle`.
fn c_busy<'a>(
    order: &[&'a str],
    busy: &'a EndpointMetrics,
    idle: &'a EndpointMetrics,
) -> Vec<Candidate<'a>> {
    order
        .iter()
        .enumerate()
        .map(|(i, a)| cand(a, Some(if i == 0 { busy } else { idle })))
        .collect()
}

/// The heaviest address for `key`, the slow obvious way.
fn heaviest<'a>(key: BlockHash, addrs: &[&'a str]) -> &'a str {
    let mut best = addrs[0];
    for a in addrs {
        if rendezvous_weight(key, a) > rendezvous_weight(key, best) {
            best = a;
        }
    }
    best
}

#[test]
fn weight_is_a_fixed_function() {
    // Pinned: every replica, every target and every version must compute the same weight.
    assert_eq!(
        rendezvous_weight(BlockHash(1), "10.0.0.1:8000"),
        xxhash_rust::xxh3::xxh3_64_with_seed(b"10.0.0.1:8000", 1)
    );
    assert_eq!(
        rendezvous_weight(BlockHash(0x0123_4567_89ab_cdef), "a"),
        0xfcf3_69f9_e754_1d1b
    );
}

#[test]
fn chooses_the_heaviest_endpoint_for_the_key_block() {
    let s = placement("");
    let c: Vec<Candidate<'_>> = ADDRS.iter().map(|a| cand(a, None)).collect();
    let h = hashes(20);
    // Default keyBlocks 8: the key is block 7's hash.
    let (pick, outcome) = chosen(&s, &h, &c, &FakePrefix::default());
    assert_eq!(outcome, PlacementOutcome::Placed);
    assert_eq!(pick, Some(heaviest(h[7], &ADDRS)));
    let d = s.schedule(&req(&h), &c, &FakePrefix::default(), 0, Millis(0));
    assert_eq!(d.profiles()[0].placement(0).map(|n| n.key_blocks), Some(8));
    // A shorter prompt is keyed on its last full block.
    let (pick, _) = chosen(&s, &h[..3], &c, &FakePrefix::default());
    assert_eq!(pick, Some(heaviest(h[2], &ADDRS)));
}

#[test]
fn later_blocks_do_not_move_the_choice() {
    let s = placement(r#","parameters":{"keyBlocks":2}"#);
    let c: Vec<Candidate<'_>> = ADDRS.iter().map(|a| cand(a, None)).collect();
    let mut a = hashes(10);
    let first = chosen(&s, &a, &c, &FakePrefix::default()).0;
    // The conversation grows, its later blocks change: the key (block 1) does not.
    for (i, x) in a.iter_mut().enumerate().skip(2) {
        *x = BlockHash(1000 + i as u64);
    }
    a.extend(hashes(5));
    assert_eq!(chosen(&s, &a, &c, &FakePrefix::default()).0, first);
}

#[test]
fn order_seed_and_picker_randomness_do_not_matter() {
    let s = placement("");
    let h = hashes(9);
    let fwd: Vec<Candidate<'_>> = ADDRS.iter().map(|a| cand(a, None)).collect();
    let rev: Vec<Candidate<'_>> = ADDRS.iter().rev().map(|a| cand(a, None)).collect();
    let want = chosen(&s, &h, &fwd, &FakePrefix::default()).0;
    assert_eq!(chosen(&s, &h, &rev, &FakePrefix::default()).0, want);
    for seed in 0..20 {
        let d = s.schedule(&req(&h), &rev, &FakePrefix::default(), seed, Millis(0));
        assert_eq!(d.picked_address(), want);
    }
}

#[test]
fn the_bound_spills_to_the_next_heaviest() {
    let s = placement(r#","parameters":{"loadFactor":1.25}"#);
    let h = hashes(8);
    let key = h[7];
    let mut order: Vec<&str> = ADDRS.to_vec();
    order.sort_by_key(|a| core::cmp::Reverse(rendezvous_weight(key, a)));
    // Loads: first choice 10 (running 6 + waiting 4), others 0. Σ = 10, n = 4:
    // bound = ⌈1.25 × 11 / 4⌉ = 4, so 10 + 1 > 4: the second choice takes it.
    assert_eq!(load_bound(1.25, 10, 4), 4);
    let busy = m(4, 6, 0.1);
    let idle = m(0, 0, 0.1);
    let c = c_busy(&order, &busy, &idle);
    assert_eq!(chosen(&s, &h, &c, &FakePrefix::default()).0, Some(order[1]));
    // The default factor, 2: ⌈2 × 11 / 4⌉ = 6, still below 10 + 1.
    assert_eq!(load_bound(2.0, 10, 4), 6);
    assert_eq!(
        chosen(&placement(""), &h, &c, &FakePrefix::default()).0,
        Some(order[1])
    );
    // In-flight load counts when it exceeds the scraped load (between scrapes), and alone
    // without fresh metrics (which also keeps the shared rule: nothing says this proxy is
    // the only gateway).
    let mut c: Vec<Candidate<'_>> = order.iter().map(|a| cand(a, None)).collect();
    c[0].inflight = InFlight {
        requests: 3,
        ..InFlight::default()
    };
    c[1].inflight = InFlight {
        requests: 3,
        ..InFlight::default()
    };
    // Σ 6, bound ⌈1.25 × 7 / 4⌉ = 3: both loaded ones are out.
    assert_eq!(chosen(&s, &h, &c, &FakePrefix::default()).0, Some(order[2]));
    // A looser factor keeps the first choice.
    let loose = placement(r#","parameters":{"loadFactor":4}"#);
    assert_eq!(
        chosen(&loose, &h, &c, &FakePrefix::default()).0,
        Some(order[0])
    );
}

#[test]
fn a_prefix_known_elsewhere_wins() {
    let s = sched(
        r#"{"plugins":[{"type":"rendezvous-placement-scorer"},{"type":"prefix-cache-scorer"}],
            "schedulingProfiles":[{"name":"p","plugins":[
              {"pluginRef":"rendezvous-placement-scorer","weight":4},
              {"pluginRef":"prefix-cache-scorer","weight":3}]}]}"#,
    );
    let h = hashes(12);
    let c: Vec<Candidate<'_>> = ADDRS.iter().map(|a| cand(a, None)).collect();
    let choice = heaviest(h[7], &ADDRS);
    let other = ADDRS.iter().copied().find(|a| *a != choice).unwrap();
    // The index holds all 8 key blocks on another endpoint, none on the choice: abstain,
    // and the prefix scorer sends it there.
    let prefix = FakePrefix::with(&[(other, 10)]);
    let d = s.schedule(&req(&h), &c, &prefix, 0, Millis(0));
    let note = d.profiles()[0].placement(0).copied().unwrap();
    assert_eq!(note.outcome, PlacementOutcome::KnownElsewhere);
    assert_eq!(note.choice.map(|i| c[i].address), Some(choice));
    assert_eq!(d.picked_address(), Some(other));
    assert!((0..4).all(|i| d.profiles()[0].raw_score(0, i) == Some(0.0)));
    // Fewer than the key's blocks elsewhere: placement stands.
    let prefix = FakePrefix::with(&[(other, 7)]);
    assert_eq!(
        chosen(&s, &h, &c, &prefix),
        (Some(choice), PlacementOutcome::Placed)
    );
    // The choice holds them too: placement stands.
    let prefix = FakePrefix::with(&[(other, 10), (choice, 8)]);
    assert_eq!(chosen(&s, &h, &c, &prefix).1, PlacementOutcome::Placed);
}

#[test]
fn no_full_block_abstains() {
    let s = placement("");
    let c: Vec<Candidate<'_>> = ADDRS.iter().map(|a| cand(a, None)).collect();
    assert_eq!(
        chosen(&s, &[], &c, &FakePrefix::default()),
        (None, PlacementOutcome::NoFullBlock)
    );
}

#[test]
fn parameters_are_checked() {
    for (params, needle) in [
        (r#"{"keyBlocks":0}"#, "keyBlocks"),
        (r#"{"keyBlocks":1.5}"#, "keyBlocks"),
        (r#"{"loadFactor":0.5}"#, "loadFactor"),
        (r#"{"loadFactor":"x"}"#, "loadFactor"),
        (r#"{"keyBlock":3}"#, "keyBlock"),
        (r#"{"idleRule":"alone"}"#, "idleRule"),
        (r#"{"idleRule":1}"#, "idleRule"),
    ] {
        let cfg = format!(
            r#"{{"plugins":[{{"type":"rendezvous-placement-scorer","parameters":{params}}}]}}"#
        );
        let err = Scheduler::from_json_str(&cfg).err().map(|e| format!("{e}"));
        assert!(
            err.as_deref().is_some_and(|e| e.contains(needle)),
            "{params}: {err:?}"
        );
    }
    assert!(Scheduler::from_json_str(
        r#"{"plugins":[{"type":"rendezvous-placement-scorer","parameters":{"keyBlocks":1,"loadFactor":1}}]}"#
    )
    .is_ok());
    for rule in ["shared", "sole"] {
        let cfg = format!(
            r#"{{"plugins":[{{"type":"rendezvous-placement-scorer","parameters":{{"idleRule":"{rule}"}}}}]}}"#
        );
        assert!(Scheduler::from_json_str(&cfg).is_ok(), "{rule}");
    }
}

#[test]
fn the_record_shows_the_placement() {
    let s = placement("");
    let c: Vec<Candidate<'_>> = ADDRS.iter().map(|a| cand(a, None)).collect();
    let h = hashes(3);
    let d = s.schedule(&req(&h), &c, &FakePrefix::default(), 0, Millis(0));
    let v = serde_json::to_value(&d).unwrap();
    let p = &v["profiles"][0]["scorers"][0]["placement"];
    assert_eq!(p["key_blocks"], 3);
    assert_eq!(p["bound"], 1);
    assert_eq!(p["outcome"], "placed");
    assert_eq!(p["choice"], heaviest(h[2], &ADDRS));
}

#[test]
fn keys_spread_over_the_pool() {
    let s = placement(r#","parameters":{"keyBlocks":1}"#);
    let c: Vec<Candidate<'_>> = ADDRS.iter().map(|a| cand(a, None)).collect();
    let mut counts = [0u32; 4];
    for k in 0..2000u64 {
        let h = [BlockHash(k.wrapping_mul(0x9e37_79b9_7f4a_7c15))];
        let pick = chosen(&s, &h, &c, &FakePrefix::default()).0.unwrap();
        counts[ADDRS.iter().position(|a| *a == pick).unwrap()] += 1;
    }
    // 500 expected each; a fair hash stays well within ±20%.
    assert!(counts.iter().all(|n| (400..=600).contains(n)), "{counts:?}");
}

/// Place `keys` cold prompts one after another, each staying in flight, over 4 endpoints
/// whose scraped load is `scraped_per_own` × this proxy's in-flight requests (1: this
/// proxy is the only gateway; 4: it carries a quarter; 0: the scrapes have not seen the
/// burst yet, as on an idle pool). Requests placed per endpoint, and whether the last
/// placement counted as sole.
fn place_in_turn(keys: u64, scraped_per_own: u32) -> ([u32; 4], bool) {
    place_in_turn_with("", keys, scraped_per_own)
}

fn place_in_turn_with(params: &str, keys: u64, scraped_per_own: u32) -> ([u32; 4], bool) {
    let s = placement(params);
    let mut placed = [0u32; 4];
    let mut sole = false;
    for key in 1..=keys {
        let ms: Vec<EndpointMetrics> = placed
            .iter()
            .map(|p| m(0, p * scraped_per_own, 0.1))
            .collect();
        let c: Vec<Candidate<'_>> = ADDRS
            .iter()
            .zip(&ms)
            .zip(&placed)
            .map(|((a, mm), p)| Candidate {
                inflight: InFlight {
                    requests: *p,
                    ..InFlight::default()
                },
                ..cand(a, Some(mm))
            })
            .collect();
        let blocks = [BlockHash(key.wrapping_mul(0x9e37_79b9_7f4a_7c15))];
        let d = s.schedule(&req(&blocks), &c, &FakePrefix::default(), 7, Millis(0));
        let note = d.profiles()[0].placement(0).copied().expect("a note");
        sole = note.sole;
        let i = note.choice.expect("a choice");
        placed[i] += 1;
    }
    (placed, sole)
}

#[test]
fn a_sole_gateway_spreads_cold_prefixes_as_evenly_as_round_robin() {
    let (placed, sole) = place_in_turn(16, 1);
    assert!(sole);
    assert_eq!(placed, [4, 4, 4, 4]);
}

#[test]
fn a_sole_gateway_keeps_cold_prefills_apart() {
    // Equal requests everywhere; the heaviest weight's endpoint has a prefill in progress,
    // which weighs like one more request, so the cold prompt goes to the next heaviest.
    let s = placement("");
    let idle = m(0, 2, 0.1);
    let key = BlockHash(42);
    let first = heaviest(key, &ADDRS);
    let rest: Vec<&str> = ADDRS.iter().copied().filter(|a| *a != first).collect();
    let second = heaviest(key, &rest);
    let c: Vec<Candidate<'_>> = ADDRS
        .iter()
        .map(|a| Candidate {
            inflight: InFlight {
                requests: 2,
                prefilling: u32::from(*a == first),
                ..InFlight::default()
            },
            ..cand(a, Some(&idle))
        })
        .collect();
    assert_eq!(
        chosen(&s, &[key], &c, &FakePrefix::default()),
        (Some(second), PlacementOutcome::Placed)
    );
}

#[test]
fn one_of_several_gateways_keeps_the_wide_bound() {
    // A quarter of the pool's load: `loadFactor` 2 lets rendezvous variance through, which
    // is what keeps replicas agreeing.
    let (placed, sole) = place_in_turn(16, 4);
    assert!(!sole);
    assert_ne!(placed, [4, 4, 4, 4], "{placed:?}");
    assert!(placed.iter().all(|p| *p <= 8), "{placed:?}");
}

#[test]
fn an_idle_pool_keeps_the_shared_rule_by_default_and_balances_under_idle_rule_sole() {
    // The first burst lands before any scrape shows it: the scraped load stays 0.
    let (placed, sole) = place_in_turn(16, 0);
    assert!(!sole);
    assert_ne!(placed, [4, 4, 4, 4], "{placed:?}");
    let (placed, sole) = place_in_turn_with(r#","parameters":{"idleRule":"sole"}"#, 16, 0);
    assert!(sole);
    assert_eq!(placed, [4, 4, 4, 4]);
    // Once the scrapes show the load, `soleShare` decides, whatever the idle rule.
    let (placed, sole) = place_in_turn_with(r#","parameters":{"idleRule":"sole"}"#, 16, 4);
    assert!(!sole);
    assert_ne!(placed, [4, 4, 4, 4], "{placed:?}");
}

#[test]
fn under_idle_rule_sole_the_first_cold_prompt_still_goes_to_the_rendezvous_choice() {
    // Nothing in flight anywhere: every sole load is 0, and the heaviest weight wins, so a
    // fleet's gateways agree on a lone first request.
    let s = placement(r#","parameters":{"idleRule":"sole"}"#);
    let c: Vec<Candidate<'_>> = ADDRS.iter().map(|a| cand(a, None)).collect();
    let key = BlockHash(7);
    assert_eq!(
        chosen(&s, &[key], &c, &FakePrefix::default()),
        (Some(heaviest(key, &ADDRS)), PlacementOutcome::Placed)
    );
}

fn addresses(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.1.{}.{}:8000", i / 250, i % 250))
        .collect()
}

proptest! {
    /// Removing an endpoint that was not chosen never moves the choice (rendezvous
    /// hashing's minimal disruption), and removing the chosen one moves it to the
    /// next heaviest.
    #[test]
    fn removal_moves_only_what_it_must(key in any::<u64>(), n in 2usize..12, drop in 0usize..12) {
        let s = placement(r#","parameters":{"keyBlocks":1}"#);
        let addrs = addresses(n);
        let all: Vec<Candidate<'_>> = addrs.iter().map(|a| cand(a, None)).collect();
        let h = [BlockHash(key)];
        let before = chosen(&s, &h, &all, &FakePrefix::default()).0.unwrap();
        let drop = drop % n;
        let rest: Vec<Candidate<'_>> =
            all.iter().enumerate().filter(|(i, _)| *i != drop).map(|(_, c)| *c).collect();
        let after = chosen(&s, &h, &rest, &FakePrefix::default()).0.unwrap();
        if all[drop].address != before {
            prop_assert_eq!(after, before);
        } else {
            let names: Vec<&str> = rest.iter().map(|c| c.address).collect();
            prop_assert_eq!(after, heaviest(BlockHash(key), &names));
        }
    }

    /// Whatever the loads, the choice is under the bound, and no heavier candidate is.
    #[test]
    fn the_choice_is_the_heaviest_under_the_bound(
        key in any::<u64>(),
        loads in proptest::collection::vec((0u32..50, 0u32..50, 0u32..50), 1..10),
        factor in 1.0f64..3.0,
    ) {
        let cfg = format!(r#","parameters":{{"keyBlocks":1,"loadFactor":{factor}}}"#);
        let s = placement(&cfg);
        let addrs = addresses(loads.len());
        let ms: Vec<EndpointMetrics> = loads.iter().map(|(r, w, _)| m(*w, *r, 0.1)).collect();
        let c: Vec<Candidate<'_>> = addrs
            .iter()
            .zip(&ms)
            .zip(&loads)
            .map(|((a, mm), (_, _, inflight))| Candidate {
                inflight: InFlight { requests: *inflight, ..InFlight::default() },
                ..cand(a, Some(mm))
            })
            .collect();
        let load = |i: usize| {
            let (r, w, f) = loads[i];
            u64::from(r + w).max(u64::from(f))
        };
        let total: u64 = (0..loads.len()).map(load).sum();
        // A proxy carrying ≥ 75% of the scraped load is the sole gateway: least own
        // in-flight (no prefills in progress here), then weight; else the bounded
        // rendezvous.
        let own: u64 = loads.iter().map(|l| u64::from(l.2)).sum();
        let scraped: u64 = loads.iter().map(|l| u64::from(l.0 + l.1)).sum();
        let sole = scraped > 0 && own as f64 >= 0.75 * scraped as f64;
        let load = |i: usize| if sole { u64::from(loads[i].2) } else { load(i) };
        let bound = if sole {
            (0..loads.len()).map(load).min().unwrap() + 1
        } else {
            load_bound(factor, total, loads.len())
        };
        let pick = chosen(&s, &[BlockHash(key)], &c, &FakePrefix::default()).0.unwrap();
        let i = addrs.iter().position(|a| a == pick).unwrap();
        prop_assert!(load(i) < bound);
        let w = rendezvous_weight(BlockHash(key), pick);
        for (j, a) in addrs.iter().enumerate() {
            if load(j) < bound {
                prop_assert!(rendezvous_weight(BlockHash(key), a) <= w);
            }
        }
    }
}
