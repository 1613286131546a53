//! `cargo xtask demo --scenario canary`: the seed's third week, an FP8 build of the model
//! going out as a 10% canary, split per request against split per conversation.
//!
//! Clients ask for `assistant`; an `InferenceModelRewrite` sends 90% of it to the stable
//! build (`sim-model`) and 10% to the FP8 build (`sim-model-fp8`), both served by the same
//! 4 simulated replicas (the calibration's, 160k tokens of KV each), whose prefix caches
//! keep the two builds apart (their KV differs). The workload is multi-turn conversations
//! whose prompts share a preamble, each sending `x-session-id` on every turn.
//!
//! - **Per request** (llm-d's split): every turn draws its version, so a conversation's
//!   turn on the canary finds none of the conversation cached there, and the next turn on
//!   the stable build finds its history cut at the turn it missed.
//! - **Sticky** (the router's `split: {mode: sticky, sessionHeader: x-session-id}`): a
//!   conversation hashes to one version and keeps it, so both builds serve their
//!   conversations from cache.
//! - **Rollback under load**: the sticky split again, and halfway through, the canary's
//!   weight goes to 0. The gateway's configuration is part of Envoy's bootstrap and the
//!   launcher runs Envoy without hot restart, so the rollback is a blue/green swap: a second
//!   Envoy with the weight at 0 runs over the same replicas (started before the arm, idle),
//!   the client sends every request from halfway on to it, the old Envoy finishes what it
//!   has (its drain is timed) and is stopped. No request may fail, and no request sent
//!   after the swap may reach the canary. The new Envoy's picker starts with an empty
//!   prefix index, which the figures after the swap show.
//!
//! Each arm has its own Envoy and its own text (no arm warms another's cache) on one
//! simulated pool. The report gives per arm and version the cache-hit ratio and TTFT p50
//! (all turns and turns 2+), the canary's share of conversations and of requests, and the
//! rollback's figures; `report.txt` and `report.html` are written as for every scenario.

pub mod drive;
pub mod figures;
pub mod report;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::cli::ScenarioArgs;
use crate::launch::stack::{Split, SplitMode};
use crate::launch::{client, Backends, EnvoyOptions, Flavor, PoolSpec, Stack, StackOptions};
use crate::load::Workload;
use crate::sim::{self, EngineConfig, SimConfig, SimHandle};

/// The name clients ask for.
pub const CLIENT_MODEL: &str = "assistant";
/// The stable build (the pool's base model).
pub const STABLE: &str = crate::launch::DEFAULT_MODEL;
/// The canary build.
pub const CANARY: &str = "sim-model-fp8";
/// The canary's weight out of 100.
pub const CANARY_WEIGHT: u32 = 10;
/// Requests in flight at most.
pub const CONCURRENCY: usize = 16;
/// The demo's default Envoy workers (one: the simulator and the client need the other
/// core of a 2-core machine).
pub const DEFAULT_WORKERS: u32 = 1;
/// The router pool's name, which the rewrite object's `poolRef` names (the launcher names
/// the pool after its Envoy cluster).
const POOL_NAME: &str = "pool-0-sim-model";

/// Options of the canary scenario: the one-stack scenarios' flags.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CanaryOptions {
    /// The shared flags.
    pub args: ScenarioArgs,
}

impl CanaryOptions {
    /// Parses `--quick`, `--time-scale S`, `--flavor wasm|native`, `--workers N`.
    pub fn parse(args: &[String]) -> Result<Self> {
        let defaults = ScenarioArgs {
            time_scale: super::calibration::DEFAULT_TIME_SCALE,
            quick: false,
            flavor: Flavor::Wasm,
            workers: DEFAULT_WORKERS,
        };
        let expected = "--quick, --time-scale S, --flavor wasm|native, --workers N";
        let args = defaults.parse(args, "the canary split", expected, |_, _| Ok(false))?;
        Ok(CanaryOptions { args })
    }
}

/// The pool: 4 replicas of the calibration serving both builds.
pub fn sim_config(time_scale: f64) -> SimConfig {
    SimConfig {
        replicas: 4,
        models: vec![STABLE.into(), CANARY.into()],
        time_scale,
        engine: EngineConfig {
            kv_capacity_tokens: 160_000,
            prefill_tokens_per_s: 16_000.0,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    }
}

/// The conversations: a 512-token preamble every conversation shares, then a 2000-token
/// system prompt of its own, 64-token questions and 200-token answers; 64 conversations
/// × 6 turns (`quick`: 32 × 4).
pub fn workload(quick: bool) -> Workload {
    Workload {
        model: CLIENT_MODEL.into(),
        conversations: if quick { 32 } else { 64 },
        turns: if quick { 4 } else { 6 },
        shared_prefix_tokens: 512,
        system_tokens: 2000,
        user_tokens: 64,
        max_tokens: 200,
        ..Workload::default()
    }
}

/// The `InferenceModelRewrite`: `assistant` → the stable build at `100 - canary` and the
/// canary at `canary`.
pub fn rewrite(canary: u32) -> Value {
    json!({
        "apiVersion": "llm-d.ai/v1alpha2",
        "kind": "InferenceModelRewrite",
        "metadata": {"name": "assistant-fp8-canary"},
        "spec": {
            "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool",
                        "name": POOL_NAME},
            "rules": [{
                "matches": [{"model": {"type": "Exact", "value": CLIENT_MODEL}}],
                "targets": [
                    {"modelRewrite": STABLE, "weight": 100 - canary.min(100)},
                    {"modelRewrite": CANARY, "weight": canary.min(100)}
                ]
            }]
        }
    })
}

/// The split setting of an arm.
pub fn split(sticky: bool) -> Split {
    Split {
        mode: if sticky {
            SplitMode::Sticky
        } else {
            SplitMode::PerRequest
        },
        session_header: sticky.then(|| drive::SESSION_HEADER.to_owned()),
    }
}

/// Starts a gateway over `sim` with the split and the canary at `canary` out of 100, and
/// waits until it answers `assistant`.
pub async fn start_stack(
    sim: &SimHandle,
    o: &CanaryOptions,
    sticky: bool,
    canary: u32,
) -> Result<Stack> {
    let mut so = StackOptions::new(o.args.flavor, Backends::External(sim.addrs().to_vec()));
    so.pools = vec![PoolSpec {
        adapters: vec![CANARY.into()],
        ..PoolSpec::all(STABLE)
    }];
    so.rewrites = vec![rewrite(canary)];
    so.split = Some(split(sticky));
    so.envoy = EnvoyOptions {
        concurrency: o.args.workers,
        ..EnvoyOptions::default()
    };
    let stack = Stack::start(so)
        .await
        .context("starting the canary's gateway")?;
    wait_ready(&stack).await?;
    Ok(stack)
}

/// Waits until the scraper has published and a request for `assistant` answers 200.
async fn wait_ready(stack: &Stack) -> Result<()> {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let body = json!({"model": CLIENT_MODEL, "max_tokens": 1,
                      "messages": [{"role": "user", "content": "ping"}]});
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(30) {
        let published = stack
            .envoy()
            .stats()
            .await
            .map(|s| s.sum_containing("infergate.scraper.publishes"))
            .unwrap_or(0);
        if published > 0 {
            match client::post_json(&url, &body, &[]).await {
                Ok(r) if r.status == 200 => return Ok(()),
                Ok(r) => last = format!("{} {}", r.status, r.text().trim()),
                Err(e) => last = format!("{e:#}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the gateway at {url} did not answer 200 within 30 s: {last}")
}

/// Everything the demo measured.
#[derive(Debug)]
pub struct Outcome {
    /// The per-request arm.
    pub per_request: figures::Arm,
    /// The sticky arm.
    pub sticky: figures::Arm,
    /// The sticky arm with the rollback halfway.
    pub rollback_arm: figures::Arm,
    /// The rollback's own figures.
    pub rollback: figures::Rollback,
    /// Every request of each arm, for the charts (per request, sticky, rollback).
    pub sent: [Vec<drive::Sent>; 3],
}

/// Runs the three arms on one simulated pool and renders the report (text and HTML).
pub async fn run(o: &CanaryOptions) -> Result<String> {
    let sim = sim::start(sim_config(o.args.time_scale))
        .await
        .context("starting the simulator")?;
    let result = measure(&sim, o).await;
    sim.shutdown().await;
    let outcome = result?;
    let mut text = report::text(o, &outcome);
    let page = report::page(&outcome, &text);
    let dir = super::html::run_dir("canary")?;
    text.push('\n');
    text.push_str(&super::html::write_run(&dir, &text, &page)?);
    Ok(text)
}

/// The three arms, one after the other.
pub async fn measure(sim: &SimHandle, o: &CanaryOptions) -> Result<Outcome> {
    let w = workload(o.args.quick);
    let mut arms = Vec::new();
    let mut sent = Vec::new();
    for (i, (label, sticky)) in [("per request", false), ("sticky", true)]
        .into_iter()
        .enumerate()
    {
        let stack = start_stack(sim, o, sticky, CANARY_WEIGHT).await?;
        eprintln!("canary demo: {label} split, 10% on {CANARY}");
        let (_, task) = drive::start(
            w.clone(),
            i as u64 + 1,
            label,
            &stack.picker_url(),
            CONCURRENCY,
        )?;
        let s = task.await.context("the client task")??;
        arms.push(figures::Arm::of(label, &s, CANARY));
        sent.push(s);
        drop(stack);
    }
    eprintln!("canary demo: sticky split, canary weight to 0 halfway through");
    let (rollback, s) = with_rollback(sim, o, &w).await?;
    let rollback_arm = figures::Arm::of("sticky, rolled back", &s, CANARY);
    sent.push(s);
    let mut arms = arms.into_iter();
    let (Some(per_request), Some(sticky)) = (arms.next(), arms.next()) else {
        bail!("an arm is missing");
    };
    let mut sent = sent.into_iter();
    let (Some(a), Some(b), Some(c)) = (sent.next(), sent.next(), sent.next()) else {
        bail!("an arm's requests are missing");
    };
    Ok(Outcome {
        per_request,
        sticky,
        rollback_arm,
        rollback,
        sent: [a, b, c],
    })
}

/// The sticky split with the canary rolled back once half the requests are done: a new
/// Envoy with the canary at 0, the client moved to it, the old one drained and stopped.
async fn with_rollback(
    sim: &SimHandle,
    o: &CanaryOptions,
    w: &Workload,
) -> Result<(figures::Rollback, Vec<drive::Sent>)> {
    let old = start_stack(sim, o, true, CANARY_WEIGHT).await?;
    let old_url = old.picker_url();
    // The rolled-back gateway is brought up beforehand (an Envoy takes a second or two to
    // start here, during which the old one keeps serving), idle until the client moves.
    let new = start_stack(sim, o, true, 0).await?;
    let (drive, task) = drive::start(w.clone(), 3, "rollback", &old_url, CONCURRENCY)?;
    drive.wait_done(drive.total / 2).await;
    let at_s = drive.elapsed_s();
    drive.retarget(&new.picker_url())?;
    let drained = Instant::now();
    drive
        .wait_drained(&old_url, Duration::from_secs(120))
        .await?;
    let drain_s = drained.elapsed().as_secs_f64();
    drop(old);
    eprintln!(
        "canary demo: rolled back at {at_s:.1} s; the old Envoy drained in {:.0} ms and stopped",
        drain_s * 1000.0
    );
    let sent = task.await.context("the client task")??;
    drop(new);
    Ok((figures::Rollback::of(&sent, CANARY, at_s, drain_s), sent))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_rewrite_splits_assistant_ninety_ten_and_rolls_back_to_zero() {
        let r = rewrite(CANARY_WEIGHT);
        let t = &r["spec"]["rules"][0]["targets"];
        assert_eq!(
            (t[0]["weight"].as_u64(), t[1]["weight"].as_u64()),
            (Some(90), Some(10))
        );
        assert_eq!(t[1]["modelRewrite"], CANARY);
        assert_eq!(rewrite(0)["spec"]["rules"][0]["targets"][1]["weight"], 0);
        assert_eq!(
            r["spec"]["poolRef"]["name"],
            crate::launch::bootstrap::pool_cluster_name(0, STABLE)
        );
        let s = split(true);
        assert_eq!(
            s.to_json(),
            json!({"mode": "sticky", "sessionHeader": "x-session-id"})
        );
        assert_eq!(split(false).to_json(), json!({"mode": "perRequest"}));
        assert_eq!(sim_config(2.0).models, vec![STABLE, CANARY]);
        let o =
            CanaryOptions::parse(&["--quick".into(), "--flavor".into(), "native".into()]).unwrap();
        assert!(o.args.quick && o.args.flavor == Flavor::Native);
        assert!(CanaryOptions::parse(&["--bogus".into()]).is_err());
    }
}
