//! Both flavours: two gateway replicas (two Envoy processes, each with its own picker
//! state) over one simulated pool, as a production gateway runs behind an L4 balancer.
//!
//! The calibration workload's quick form (64 conversations × 3 turns over the calibration
//! pool) goes through both, every turn on a new connection to a gateway drawn at random
//! (`bench replicas`' arm, at the suite's worker count), and both gateways' pool clusters
//! read one set of EDS files, as the replicas of a production gateway read one EDS source.
//! Every request must succeed, both gateways must have picked for requests and accepted
//! one connection per request (each Envoy's own stats), and turns 2+ must find some of
//! their prompt cached: a turn that lands on the gateway of its conversation's previous
//! turn goes where its prefix is. The hit ratios are printed, not held to a figure:
//! nothing makes the two gateways agree on a placement yet.

use super::tag;
use infergate_harness::bench::{calibration, replicas};
use infergate_harness::launch::{Flavor, Membership};
use infergate_harness::sim;

/// Simulated seconds per real second (the benches' default).
const TIME_SCALE: f64 = 2.0;

/// Gateway replicas.
const GATEWAYS: usize = 2;

for_each_flavour!(two_gateways_over_one_pool_serve_every_turn);

async fn two_gateways_over_one_pool_serve_every_turn(flavor: Flavor) {
    if crate::support::unbuilt(flavor) {
        return;
    }
    let workers = crate::support::workers();
    let workload = calibration::workload(true);
    let sim = sim::start(calibration::sim_config(TIME_SCALE))
        .await
        .unwrap();
    let spec = replicas::ArmSpec {
        flavor,
        gateways: GATEWAYS,
        workers,
        membership: Membership::Eds,
    };
    let arm = replicas::run_arm(&sim, spec, &workload, 1).await;
    sim.shutdown().await;
    let arm = arm.unwrap();
    let summary = &arm.report.summary;
    let later = arm.later();
    let followed = arm.by_previous_gateway();
    let context = format!(
        "{} x{workers}, {GATEWAYS} gateways: {} requests, {} ok, errors {:?}; cache-hit \
         ratio {:.1}%, turns 2+ {:.1}% ({} cached of {} prompt tokens); turns 2+ on their \
         previous turn's gateway: {} at {:.1}%, on the other: {} at {:.1}%; picks per \
         gateway {:?}, connections per gateway {:?}, requests per base URL {:?}",
        tag(flavor),
        summary.requests,
        summary.ok,
        summary.errors,
        summary.cache_hit_ratio * 100.0,
        later.cache_hit_ratio * 100.0,
        later.cached_tokens,
        later.prompt_tokens,
        followed.same.requests,
        followed.same.hit_ratio() * 100.0,
        followed.other().requests,
        followed.other().hit_ratio() * 100.0,
        arm.picks_per_gateway,
        arm.connections_per_gateway,
        summary.by_url,
    );
    println!("{context}");
    let expected = u64::from(workload.conversations * workload.turns);
    assert_eq!(summary.requests, expected, "{context}");
    assert_eq!(
        summary.ok, expected,
        "every request must succeed\n{context}"
    );
    assert_eq!(arm.picks_per_gateway.len(), GATEWAYS, "{context}");
    for (k, (&picks, &connections)) in arm
        .picks_per_gateway
        .iter()
        .zip(&arm.connections_per_gateway)
        .enumerate()
    {
        assert!(picks > 0, "gateway {k} picked for no request\n{context}");
        assert!(
            connections > 0,
            "gateway {k} accepted no connection\n{context}"
        );
    }
    let picks: i64 = arm.picks_per_gateway.iter().sum();
    let connections: i64 = arm.connections_per_gateway.iter().sum();
    assert_eq!(
        picks,
        i64::try_from(expected).unwrap(),
        "each request is picked for once, by the gateway it reached\n{context}"
    );
    assert!(
        connections >= i64::try_from(expected).unwrap(),
        "every turn must come on a connection of its own\n{context}"
    );
    assert!(
        later.cached_tokens > 0,
        "turns 2+ must find some of their prompt cached\n{context}"
    );
}
