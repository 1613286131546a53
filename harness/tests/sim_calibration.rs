//! Calibration of the simulator against the routing question it exists for: on a pool of
//! 4 replicas (160k tokens of KV each, 16k tokens/s prefill) serving 64 conversations that
//! grow to about 8k tokens over 6 turns at concurrency 16, sending each conversation always
//! to the same replica must keep most of the prompt cached (> 80%) and cut the median TTFT by
//! at least 10× against random assignment, whose hit ratio must stay near or below 1/4.
//!
//! Runs at `--time-scale` 2 by default (about two minutes): at higher scales the fixed
//! per-request overhead of HTTP on a busy 2-core machine (a few ms of wall time) starts to
//! weigh on the sticky TTFT, which is only some 20 ms simulated. Set `INFERGATE_CALIBRATION_SCALE` to change
//! it. The real-time run is the ignored test `calibration_real_time`.

#![allow(clippy::expect_used)]

use infergate_harness::bench::calibration;
use infergate_harness::load::{self, Assign, Connections, LoadConfig, Summary, Target};
use infergate_harness::sim;

async fn run(assign: Assign, time_scale: f64) -> (Summary, u64) {
    // The same pool and workload `cargo xtask bench ttft` and the demo run.
    let sim = sim::start(calibration::sim_config(time_scale))
        .await
        .expect("simulator starts");
    let cfg = LoadConfig {
        workload: calibration::workload(false),
        targets: vec![Target {
            label: format!("{assign:?}"),
            urls: sim.base_urls(),
            assign,
            connections: Connections::KeepAlive,
        }],
        concurrency: 16,
        ..LoadConfig::default()
    };
    let reports = load::run(&cfg).await.expect("load runs");
    sim.shutdown().await;
    let report = reports.into_iter().next().expect("one report");
    let longest = report
        .records
        .iter()
        .map(|r| r.prompt_tokens)
        .max()
        .unwrap_or(0);
    (report.summary, longest)
}

async fn calibrate(time_scale: f64) {
    let (sticky, longest) = run(Assign::Sticky, time_scale).await;
    let (random, _) = run(Assign::Random, time_scale).await;
    print!(
        "time scale {time_scale}\n{}",
        load::table(&[sticky.clone(), random.clone()])
    );
    let ratio = random.ttft_p50_s / sticky.ttft_p50_s;
    println!("TTFT p50 random / sticky = {ratio:.1}x; longest prompt {longest} tokens");
    assert_eq!(sticky.ok, 384, "every request of the sticky run succeeds");
    assert_eq!(random.ok, 384, "every request of the random run succeeds");
    assert!(
        (7_000..=9_000).contains(&longest),
        "context should reach about 8k tokens, got {longest}"
    );
    assert!(
        sticky.cache_hit_ratio > 0.80,
        "sticky hit ratio {}",
        sticky.cache_hit_ratio
    );
    assert!(
        random.cache_hit_ratio < 0.30,
        "random hit ratio {} should be near or below 1/4",
        random.cache_hit_ratio
    );
    assert!(ratio >= 10.0, "TTFT p50 ratio {ratio:.2} < 10");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calibration_at_time_scale() {
    let scale = std::env::var("INFERGATE_CALIBRATION_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    calibrate(scale).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "real time: about 100 s"]
async fn calibration_real_time() {
    calibrate(1.0).await;
}
