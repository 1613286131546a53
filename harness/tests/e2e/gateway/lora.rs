//! Both flavours: LoRA adapters placed by the picker through a real Envoy, over the engine
//! simulator, at the suite's Envoy worker count.
//!
//! The pool of `bench lora`: 4 replicas with 2 adapter slots each and 8 adapters, so no
//! replica can hold every adapter and round robin makes every replica load every adapter
//! over and over. The same many-adapter workload (each conversation for an adapter drawn
//! by a Zipf law, the conversations of one adapter sharing its system prompt; its
//! `--quick` size, 192 requests) goes through `/rr` and then through the picker, whose
//! pool has the `lora-affinity-scorer`; the simulator counts the admissions that had to
//! load an adapter. The picker must load at most a third as often as round
//! robin, serve each adapter on fewer replicas, and fail no request.

use super::tag;
use crate::support::gw::{self, Plan};
use infergate_harness::bench::lora;
use infergate_harness::launch::Flavor;
use infergate_harness::sim;

/// Simulated seconds per real second (the bench's default): the run stays well under a
/// minute per flavour.
const TIME_SCALE: f64 = 2.0;

for_each_flavour!(adapters_load_three_times_less_often_through_the_picker_than_round_robin);

async fn adapters_load_three_times_less_often_through_the_picker_than_round_robin(flavor: Flavor) {
    let scenario = lora::Scenario::default();
    let t = format!("{} x{}", tag(flavor), crate::support::workers());
    let w = scenario.workload(true);
    // Each arm on a pool of its own: an arm must not start with the adapters the other
    // left resident.
    let mut arms = Vec::new();
    let mut log = String::new();
    for (label, salt) in [("/rr", 1), ("picker", 2)] {
        let sim = sim::start(scenario.sim_config(TIME_SCALE)).await.unwrap();
        let plan = Plan::new(vec![scenario.pool_spec()]);
        let Some(stack) = gw::start_over(flavor, sim.addrs().to_vec(), plan).await else {
            return;
        };
        let url = if label == "/rr" {
            stack.baseline_url()
        } else {
            stack.picker_url()
        };
        arms.push(lora::run_arm(&sim, label, url, &w, salt).await.unwrap());
        log = stack.envoy().log_tail(20);
        drop(stack);
        sim.shutdown().await;
    }
    let [rr, picker] = <[lora::Arm; 2]>::try_from(arms).unwrap();
    let line = |a: &lora::Arm| {
        format!(
            "{}: {} requests, {} ok, {} adapter loads, {:.2} replicas per adapter, errors {:?}",
            a.label,
            a.report.summary.requests,
            a.report.summary.ok,
            a.loads,
            a.mean_replicas_per_adapter(),
            a.report.summary.errors
        )
    };
    let context = format!(
        "{t}\n{}\n{}\n--- envoy log:\n{}",
        line(&rr),
        line(&picker),
        log
    );
    for arm in [&rr, &picker] {
        assert_eq!(
            arm.report.summary.ok, arm.report.summary.requests,
            "no request may fail\n{context}"
        );
        assert_eq!(arm.report.summary.requests, 192, "{context}");
    }
    // Round robin must have had adapters to load, or the comparison says nothing.
    assert!(
        rr.loads >= 60,
        "round robin should load adapters often here\n{context}"
    );
    assert!(
        picker.loads * 3 <= rr.loads,
        "the picker must load adapters at least 3x less often than /rr\n{context}"
    );
    assert!(
        picker.mean_replicas_per_adapter() < rr.mean_replicas_per_adapter(),
        "the picker serves each adapter on fewer replicas\n{context}"
    );
    eprintln!("{t}\n{}\n{}", line(&rr), line(&picker));
}
