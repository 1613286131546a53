//! The hotspot scenario (`cargo xtask demo --scenario hotspot`): one replica of the
//! calibration pool is kept at 95% KV usage or more by a few long-context requests sent
//! straight to it ([`hog`]), and the calibration's multi-turn chat workload runs through
//! Envoy's round-robin `/rr` and then through the picker. [`kv`] scrapes every replica's
//! `/metrics` all along, so the report can show that the replica stayed full during both
//! runs and that the others had room; [`report`] counts the new requests each replica
//! received (from the simulator's replica header on every answer), splits TTFT between the
//! full replica and the others, and states the verdicts.

pub mod hog;
pub mod kv;
pub mod report;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use self::hog::{Hog, HogPlan};
use self::kv::KvWatch;
use self::report::RunOutcome;
use super::calibration::{self, DEFAULT_TIME_SCALE};
use super::cli::{DemoFlags, Scenario, ScenarioArgs};
use crate::launch::{
    client, Backends, EnvoyOptions, Flavor, PoolSpec, Stack, StackOptions, DEFAULT_MODEL,
};
use crate::load::runner::run_target;
use crate::load::{Assign, Connections, LoadConfig, Target};
use crate::sim::engine::SchedulingPolicy;
use crate::sim::{self, EngineConfig, SimHandle};

/// The replica kept full.
pub const FULL_REPLICA: usize = 0;
/// KV usage the full replica must show during the runs.
pub const FULL_AT: f64 = 0.95;
/// KV usage the long prompts alone hold: [`FULL_AT`], so the answers growing and ending
/// never take the replica below it, and what is left (about 4.5%) has room for one chat
/// request at a time.
pub const PROMPTS_HOLD: f64 = 0.95;
/// Envoy worker threads by default.
pub const DEFAULT_WORKERS: u32 = 2;
/// The KV threshold of [`PickerChoice::KvFilter`].
pub const KV_FILTER_MAX: f64 = 0.9;

/// Which scheduling configuration the picker runs (`--picker-config default|kv-filter|latency`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PickerChoice {
    /// The pool sets no eppConfig: the picker's built-in default.
    Default,
    /// The default's scorers behind a utilization-filter at 0.9 KV usage.
    //
    // As an operator who wants no request on a full replica would write it
    // ([`kv_filter_config`]).
    KvFilter,
    /// The default's scorers and the measured-latency scorer.
    //
    // [`latency_scorer_config`].
    Latency,
}

impl PickerChoice {
    /// The pool's `eppConfig` (`null` for the built-in default).
    pub fn epp_config(self) -> serde_json::Value {
        match self {
            PickerChoice::Default => serde_json::Value::Null,
            PickerChoice::KvFilter => kv_filter_config(KV_FILTER_MAX),
            PickerChoice::Latency => latency_scorer_config(),
        }
    }

    /// How the report names it.
    pub fn describe(self) -> String {
        match self {
            PickerChoice::Default => {
                "the picker's default scheduling config (endpoints above 0.9 KV usage left out \
                 while any is below; prefix ×3, queue, KV and in-flight scorers)"
                    .into()
            }
            PickerChoice::KvFilter => format!(
                "an operator's config: the default's scorers behind a utilization-filter \
                 dropping endpoints above {KV_FILTER_MAX} KV usage"
            ),
            PickerChoice::Latency => "the picker's default scheduling config with \
                 latency-observation-scorer (weight 2) added: the TTFT the gateway measured"
                .into(),
        }
    }
}

/// The picker's built-in default config with its `utilization-filter` dropping endpoints
/// above `max_kv` KV usage (all of them kept when every one would go).
pub fn kv_filter_config(max_kv: f64) -> serde_json::Value {
    let mut config = infergate_filters::picker::config::default_epp_config();
    let filter = config["plugins"].as_array_mut().and_then(|plugins| {
        plugins
            .iter_mut()
            .find(|p| p["type"] == "utilization-filter")
    });
    if let Some(filter) = filter {
        filter["parameters"]["conditions"][0]["maxValue"] = max_kv.into();
    }
    config
}

/// The picker's built-in default config with `latency-observation-scorer` (weight 2) in
/// its profile: endpoints are also scored by the TTFT the gateway measured on them.
pub fn latency_scorer_config() -> serde_json::Value {
    let mut config = infergate_filters::picker::config::default_epp_config();
    if let Some(plugins) = config["plugins"].as_array_mut() {
        plugins.insert(2, serde_json::json!({"type": "latency-observer-producer"}));
        plugins.insert(3, serde_json::json!({"type": "latency-observation-scorer"}));
    }
    if let Some(profile) = config["schedulingProfiles"][0]["plugins"].as_array_mut() {
        let picker = profile.len().saturating_sub(1);
        profile.insert(
            picker,
            serde_json::json!({"pluginRef": "latency-observation-scorer", "weight": 2}),
        );
    }
    config
}

/// The scenario's flags.
#[derive(Clone, Debug, PartialEq)]
pub struct HotspotOptions {
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// 3 turns per conversation instead of 6.
    pub quick: bool,
    /// The picker's flavour.
    pub flavor: Flavor,
    /// Envoy worker threads.
    pub workers: u32,
    /// The picker's scheduling configuration.
    pub picker: PickerChoice,
}

impl HotspotOptions {
    /// The flags after `--scenario hotspot`.
    pub fn parse(args: &[String]) -> Result<Self> {
        Self::from_flags(&DemoFlags::parse_scenario(Scenario::Hotspot, args)?)
    }

    /// The scenario's options from `demo`'s flags.
    pub fn from_flags(flags: &DemoFlags) -> Result<Self> {
        let common = flags.scenario_args(ScenarioArgs {
            time_scale: DEFAULT_TIME_SCALE,
            quick: false,
            flavor: Flavor::Wasm,
            workers: DEFAULT_WORKERS,
        })?;
        Ok(HotspotOptions {
            time_scale: common.time_scale,
            quick: common.quick,
            flavor: common.flavor,
            workers: common.workers,
            picker: flags.picker_config.unwrap_or(PickerChoice::Default),
        })
    }
}

/// The calibration's conversations (their own ~4k-token system prompts, 64-token questions,
/// 600-token answers), 32 of them × 4 turns, or 16 × 3 with `quick`. The full replica has
/// room for one chat request of up to ~7k tokens (answer included) at a time, and round robin
/// sends it a quarter of them: the calibration's 64 conversations would keep `/rr` busy for
/// many minutes, and its turns 5 and 6 (~7.5–8k tokens with their answers) could only run
/// there by preempting each other, some until the client's timeout.
pub fn workload(quick: bool) -> crate::load::Workload {
    let mut w = calibration::workload(quick);
    (w.conversations, w.turns) = if quick { (16, 3) } else { (32, 4) };
    w
}

/// The simulated pool: the calibration's, with vLLM's priority scheduling policy, so the
/// long-context requests (priority [`HogPlan::PRIORITY`]) keep their place ahead of the
/// chat (priority 0, which among itself is served first come, first served).
pub fn sim_config(time_scale: f64) -> sim::SimConfig {
    let mut cfg = calibration::sim_config(time_scale);
    cfg.engine.scheduling_policy = SchedulingPolicy::Priority;
    cfg
}

/// Runs the scenario on a fresh simulated pool and returns the report.
pub async fn run(opts: &HotspotOptions) -> Result<String> {
    let cfg = sim_config(opts.time_scale);
    let engine = cfg.engine.clone();
    let sim = sim::start(cfg).await.context("starting the simulator")?;
    let result = run_on(&sim, &engine, opts).await;
    sim.shutdown().await;
    result
}

async fn run_on(sim: &SimHandle, engine: &EngineConfig, opts: &HotspotOptions) -> Result<String> {
    let replicas: Vec<String> = sim.addrs().iter().map(|a| a.to_string()).collect();
    let full_addr = *sim
        .addrs()
        .get(FULL_REPLICA)
        .context("the pool has no replica to fill")?;
    let full = full_addr.to_string();
    let watch = KvWatch::start(sim.base_urls());
    let stack = start_stack(sim, opts).await?;

    let plan = HogPlan::for_engine(engine, PROMPTS_HOLD);
    // One lane's request lasts this long in wall time; lanes start a fraction apart.
    let request_s = plan.request_sim_secs(engine, plan.lanes) / opts.time_scale;
    let stagger = Duration::from_secs_f64(request_s / f64::from(plan.lanes));
    eprintln!(
        "hotspot: filling replica {full} with {} long-context requests ({} prompt tokens, \
         {} answer tokens each, sent straight to it, repeated for the whole run); the prompts \
         alone hold {:.1}% of its KV cache",
        plan.lanes,
        plan.prompt_tokens,
        plan.output_tokens,
        plan.floor_usage() * 100.0
    );
    let hog = Hog::start(full_addr, DEFAULT_MODEL, plan, stagger).await?;
    let filled = wait_full(&watch, FULL_REPLICA, Duration::from_secs(60)).await;
    if let Err(e) = filled {
        hog.stop().await;
        return Err(e);
    }

    let load = LoadConfig {
        workload: workload(opts.quick),
        concurrency: 16,
        progress: true,
        ..LoadConfig::default()
    };
    let picker_label = format!("picker ({}, {} workers)", opts.flavor, opts.workers);
    let columns = [
        ("/rr (round-robin)".to_string(), stack.baseline_url()),
        (picker_label.clone(), stack.picker_url()),
    ];
    let mut outcomes = Vec::new();
    let mut picks_of_full = 0;
    for (i, (label, url)) in columns.iter().enumerate() {
        if let Err(e) = wait_full(&watch, FULL_REPLICA, Duration::from_secs(60)).await {
            hog.stop().await;
            return Err(e);
        }
        let picks_before = picks_to(&stack, &full).await;
        let from = watch.now();
        let target = Target {
            label: label.clone(),
            urls: vec![url.clone()],
            assign: Assign::Random,
            connections: Connections::KeepAlive,
        };
        let report = run_target(&load, &target, i as u64 + 1).await;
        let to = watch.now();
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                hog.stop().await;
                return Err(e);
            }
        };
        if *label == picker_label {
            picks_of_full = picks_to(&stack, &full).await - picks_before;
        }
        let samples = watch.samples();
        let others_kv_max = (0..replicas.len())
            .filter(|r| *r != FULL_REPLICA)
            .map(|r| kv::window(&samples, r, from, to).max)
            .fold(0.0, f64::max);
        outcomes.push(RunOutcome::new(
            label,
            report.summary.clone(),
            &report.records,
            &full,
            kv::window(&samples, FULL_REPLICA, from, to),
            others_kv_max,
        ));
    }
    let (hog_sent, hog_failed) = hog.counts();
    let hog_error = hog.last_error();
    hog.stop().await;
    let (_, scrape_failures) = watch.stop().await;
    drop(stack);

    let w = workload(opts.quick);
    let mut out = format!(
        "infergate demo, hotspot: one full replica, round-robin vs the gateway picker\n\
         simulated pool: 4 replicas × 160k tokens KV, 16k tokens/s prefill, vLLM's priority \
         scheduling, time scale {} (times are wall-clock); Envoy {} workers, {} picker with \
         {}\n\
         replica {full} kept full by {} long-context requests sent straight to it ({} prompt \
         + {} answer tokens each, priority {}, each lane's next request sent as the current \
         one ends; {} sent, {} failed); chat workload: {} conversations × {} turns, ~{}-token \
         system prompts, 600-token answers, concurrency 16, priority 0, through Envoy\n\n",
        opts.time_scale,
        opts.workers,
        opts.flavor,
        opts.picker.describe(),
        plan.lanes,
        plan.prompt_tokens,
        plan.output_tokens,
        HogPlan::PRIORITY,
        hog_sent,
        hog_failed,
        w.conversations,
        w.turns,
        w.system_tokens,
    );
    out.push_str(&report::render_table(&outcomes, &full, &replicas));
    out.push('\n');
    for o in &outcomes {
        let ok = o.full_kv.samples > 0 && o.full_kv.min >= FULL_AT;
        out.push_str(&format!(
            "{}: the full replica's KV usage over {} scrapes of its /metrics: min {:.1}%, mean \
             {:.1}% ({})\n",
            o.label,
            o.full_kv.samples,
            o.full_kv.min * 100.0,
            o.full_kv.mean * 100.0,
            if ok {
                format!("≥ {:.0}% throughout", FULL_AT * 100.0)
            } else {
                format!("BELOW {:.0}% at times", FULL_AT * 100.0)
            }
        ));
    }
    if let [rr, picker] = outcomes.as_slice() {
        out.push_str(&report::rr_tail_line(rr));
        out.push('\n');
        out.push_str(&report::picker_verdict(picker, &full, FULL_AT));
        out.push_str(&format!(
            " (the picker's own counter: {picks_of_full} picks of {full})\n"
        ));
        out.push_str(&format!(
            "TTFT p50 /rr ÷ picker = {:.1}×, p99 /rr ÷ picker = {:.1}×\n",
            ratio(rr.summary.ttft_p50_s, picker.summary.ttft_p50_s),
            ratio(rr.summary.ttft_p99_s, picker.summary.ttft_p99_s),
        ));
    }
    if scrape_failures > 0 {
        out.push_str(&format!("{scrape_failures} scrapes of /metrics failed\n"));
    }
    if let Some(e) = hog_error {
        out.push_str(&format!("last long-context request failure: {e}\n"));
    }
    let page = report::page(&outcomes, &out);
    let dir = super::html::run_dir("hotspot")?;
    out.push('\n');
    out.push_str(&super::html::write_run(&dir, &out, &page)?);
    out.push('\n');
    Ok(out)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Waits until `replica` has shown KV usage ≥ [`FULL_AT`] and an empty queue for one
/// second of scrapes in a row (after a run, round robin's leftovers must drain first).
async fn wait_full(watch: &KvWatch, replica: usize, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    let mut since: Option<Duration> = None;
    let mut last = None;
    while start.elapsed() < timeout {
        if let Some(s) = watch.latest(replica) {
            if last != Some(s.at) {
                last = Some(s.at);
                if s.kv >= FULL_AT && s.waiting == 0.0 {
                    let first = *since.get_or_insert(s.at);
                    if s.at - first >= Duration::from_secs(1) {
                        return Ok(());
                    }
                } else {
                    since = None;
                }
            }
        }
        tokio::time::sleep(kv::INTERVAL / 2).await;
    }
    let latest = watch.latest(replica);
    bail!(
        "replica {replica} did not settle at ≥ {:.0}% KV with an empty queue within {} s \
         (last scrape: {latest:?})",
        FULL_AT * 100.0,
        timeout.as_secs()
    )
}

/// The picker's count of picks of `endpoint` (Envoy's stat, summed over workers).
async fn picks_to(stack: &Stack, endpoint: &str) -> i64 {
    let flat: String = endpoint
        .chars()
        .map(|c| if matches!(c, '.' | ':') { '_' } else { c })
        .collect();
    let suffix = format!(".endpoint.{flat}");
    match stack.envoy().stats().await {
        Ok(stats) => stats
            .containing("infergate.picker.picks.")
            .filter(|(name, _)| name.ends_with(&suffix))
            .map(|(_, v)| v)
            .sum(),
        Err(_) => 0,
    }
}

async fn start_stack(sim: &SimHandle, opts: &HotspotOptions) -> Result<Stack> {
    let mut so = StackOptions::new(opts.flavor, Backends::External(sim.addrs().to_vec()));
    let mut pool = PoolSpec::all(DEFAULT_MODEL);
    pool.picker_config = opts.picker.epp_config();
    so.pools = vec![pool];
    so.envoy = EnvoyOptions {
        concurrency: opts.workers,
        ..EnvoyOptions::default()
    };
    let stack = Stack::start(so)
        .await
        .with_context(|| format!("starting the {} stack", opts.flavor))?;
    // Until every worker's picker has a snapshot it answers 503; probe until they all pass.
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let body = serde_json::json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
    });
    let probes = (2 * opts.workers).max(4);
    let start = Instant::now();
    loop {
        let mut ok = 0;
        for _ in 0..probes {
            if let Ok(r) = client::post_json(&url, &body, &[]).await {
                ok += u32::from(r.status == 200);
            }
        }
        if ok == probes {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the picker at {url} did not answer 200 within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "{} Envoy ({} workers) up: picker {}, baseline {}",
        opts.flavor,
        opts.workers,
        stack.picker_url(),
        stack.baseline_url()
    );
    Ok(stack)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_parse_with_defaults() {
        let o = HotspotOptions::parse(&[]).unwrap();
        assert_eq!((o.flavor, o.workers, o.quick), (Flavor::Wasm, 2, false));
        let o = HotspotOptions::parse(&strings(&[
            "--flavor",
            "native",
            "--workers",
            "4",
            "--quick",
            "--picker-config",
            "default",
        ]))
        .unwrap();
        assert_eq!(
            (o.flavor, o.workers, o.quick, o.picker),
            (Flavor::Native, 4, true, PickerChoice::Default)
        );
        for bad in [
            &["--flavor", "plain"][..],
            &["--workers", "0"],
            &["--picker-config", "x"],
            &["--time-scale", "-1"],
            &["--nope"],
        ] {
            assert!(HotspotOptions::parse(&strings(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn workload_is_the_calibration_one() {
        let (full, quick) = (workload(false), workload(true));
        assert_eq!((full.conversations, full.turns), (32, 4));
        assert_eq!((quick.conversations, quick.turns), (16, 3));
        let pool = sim_config(2.0);
        assert_eq!(pool.engine.scheduling_policy, SchedulingPolicy::Priority);
        assert_eq!(pool.engine.kv_capacity_tokens, 160_000);
        assert_eq!(
            full.system_tokens,
            calibration::workload(false).system_tokens
        );
    }

    #[test]
    fn latency_scorer_config_compiles() {
        let compiled = scheduler_core::scheduling::Scheduler::from_value(latency_scorer_config());
        assert!(compiled.is_ok(), "{:?}", compiled.err());
        assert!(compiled.is_ok_and(|s| s.uses_measured_latency()));
    }

    #[test]
    fn kv_filter_config_compiles() {
        let compiled = scheduler_core::scheduling::Scheduler::from_value(kv_filter_config(0.9));
        assert!(compiled.is_ok(), "{:?}", compiled.err());
        let config = kv_filter_config(0.8);
        let filter = config["plugins"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["type"] == "utilization-filter"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(filter["parameters"]["conditions"][0]["maxValue"], 0.8);
    }
}
