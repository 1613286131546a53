//! `cargo xtask demo --scenario canary`: the seed's third week, an FP8 build of the model
//! going out as a 10% canary, split per request against split per conversation, in the
//! two ways the gateway can split.
//!
//! - **Two pools** (the seed's `HTTPRoute`): the stable pool is replicas 0–2, the canary
//!   pool replica 3, both serving `sim-model`; Envoy's weighted clusters send 90% / 10% of
//!   it, drawn per request or from the router's `x-gateway-split-key` (a hash of
//!   `x-session-id`), and each pool's picker works inside its own pool. The canary
//!   answered a request if replica 3 did.
//! - **One pool, a model rewrite**: clients ask for `assistant`; an `InferenceModelRewrite`
//!   sends 90% to the stable build (`sim-model`) and 10% to the FP8 build
//!   (`sim-model-fp8`) on the same 4 replicas, whose prefix caches keep the two builds
//!   apart (their KV differs); drawn per request, or sticky on `x-session-id`. The canary
//!   answered a request if the answer names `sim-model-fp8`.
//!
//! The pool is the calibration's (4 replicas, 160k tokens of KV each), the workload
//! multi-turn conversations whose prompts share a preamble, each sending `x-session-id` on
//! every turn. Per request, a conversation's turn on the canary finds none of the
//! conversation cached there, and its next turn on the stable build finds its history cut
//! at the turn it missed; sticky, a conversation keeps one build and its cache.
//!
//! **Rollback under load**: the two-pool sticky split again, and halfway through, the
//! canary's weight goes to 0. The route is part of Envoy's bootstrap and the launcher runs
//! Envoy without hot restart, so the rollback is a blue/green swap: a second Envoy with the
//! weight at 0 runs over the same replicas (started before the arm, idle), the client sends
//! every request from halfway on to it, the old Envoy finishes what it has (its drain is
//! timed) and is stopped. No request may fail, and no request sent after the swap may
//! reach the canary. The new Envoy's picker starts with an empty prefix index, which the
//! figures after the swap show.
//!
//! Each arm has its own Envoy and its own text (no arm warms another's cache) on one
//! simulated pool. The report gives per arm and build the cache-hit ratio and TTFT p50
//! (all turns and turns 2+), the canary's share of conversations and of requests, and the
//! rollback's figures; `report.txt` and `report.html` are written as for every scenario.

pub mod drive;
pub mod figures;
pub mod report;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::calibration::{stack_options, start_serving};
use super::cli::{DemoFlags, Scenario, ScenarioArgs};
use figures::Canary;

use crate::launch::{Flavor, PoolSpec, RouteSpec, Stack, StackOptions};
use crate::load::Workload;
use crate::sim::{self, SimConfig, SimHandle};
use infergate_cli::config::rewrites::{Split, SplitMode};

/// The name clients ask for when a rewrite splits it.
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
/// The replica of the canary pool (the stable pool has the others).
const CANARY_REPLICA: usize = 3;

/// Where the split happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Envoy's weighted clusters across a stable and a canary pool.
    Pools,
    /// A model rewrite inside one pool.
    Rewrite,
}

/// One arm: where it splits and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArmSpec {
    /// Column label.
    pub label: &'static str,
    /// Where the split happens.
    pub layout: Layout,
    /// One build per conversation (else a draw per request).
    pub sticky: bool,
}

/// The arms compared, in order; the rollback arm is the first sticky one again.
pub const ARMS: [ArmSpec; 4] = [
    ArmSpec {
        label: "2 pools, per request",
        layout: Layout::Pools,
        sticky: false,
    },
    ArmSpec {
        label: "2 pools, sticky",
        layout: Layout::Pools,
        sticky: true,
    },
    ArmSpec {
        label: "rewrite, per request",
        layout: Layout::Rewrite,
        sticky: false,
    },
    ArmSpec {
        label: "rewrite, sticky",
        layout: Layout::Rewrite,
        sticky: true,
    },
];

/// The rollback's arm: the two-pool sticky split.
pub const ROLLBACK: ArmSpec = ArmSpec {
    label: "2 pools, sticky, rolled back",
    layout: Layout::Pools,
    sticky: true,
};

impl ArmSpec {
    /// The model the arm's clients ask for.
    pub fn client_model(&self) -> &'static str {
        match self.layout {
            Layout::Pools => STABLE,
            Layout::Rewrite => CLIENT_MODEL,
        }
    }

    /// How the arm's canary answers are told apart, over `sim`'s replicas.
    pub fn canary(&self, sim: &SimHandle) -> Canary {
        match self.layout {
            Layout::Pools => Canary::Replica(
                sim.addrs()
                    .get(CANARY_REPLICA)
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
            ),
            Layout::Rewrite => Canary::Model(CANARY.into()),
        }
    }

    /// The stack's pools, routes, rewrites and split for a canary weight of `canary`
    /// out of 100.
    pub fn configure(&self, so: &mut StackOptions, canary: u32) {
        let canary = canary.min(100);
        match self.layout {
            Layout::Pools => {
                so.pools = vec![
                    PoolSpec::on(STABLE, &[0, 1, 2]).named("stable"),
                    PoolSpec::on(STABLE, &[CANARY_REPLICA]).named("fp8"),
                ];
                let route = RouteSpec::split(STABLE, &[(0, 100 - canary), (1, canary)]);
                so.routes = vec![if self.sticky { route.sticky() } else { route }];
            }
            Layout::Rewrite => {
                so.pools = vec![PoolSpec {
                    adapters: vec![CANARY.into()],
                    ..PoolSpec::all(STABLE)
                }];
                so.rewrites = vec![rewrite(canary)];
            }
        }
        so.split = Some(split(self.sticky));
    }
}

/// Options of the canary scenario: the one-stack scenarios' flags.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CanaryOptions {
    /// The shared flags.
    pub args: ScenarioArgs,
}

impl CanaryOptions {
    /// Parses `--quick`, `--time-scale S`, `--flavor wasm|native`, `--workers N`.
    pub fn parse(args: &[String]) -> Result<Self> {
        Self::from_flags(&DemoFlags::parse_scenario(Scenario::Canary, args)?)
    }

    /// The scenario's options from `demo`'s flags.
    pub fn from_flags(flags: &DemoFlags) -> Result<Self> {
        let args = flags.scenario_args(ScenarioArgs {
            time_scale: super::calibration::DEFAULT_TIME_SCALE,
            quick: false,
            flavor: Flavor::Wasm,
            workers: DEFAULT_WORKERS,
        })?;
        Ok(CanaryOptions { args })
    }
}

/// The pool: 4 replicas of the calibration serving both builds.
pub fn sim_config(time_scale: f64) -> SimConfig {
    SimConfig {
        models: vec![STABLE.into(), CANARY.into()],
        ..super::calibration::sim_config(time_scale)
    }
}

/// The conversations: a 512-token preamble every conversation shares, then a 2000-token
/// system prompt of its own, 64-token questions and 200-token answers; 64 conversations
/// × 6 turns (`quick`: 32 × 4), asking for `model`.
pub fn workload(quick: bool, model: &str) -> Workload {
    Workload {
        model: model.into(),
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

/// Starts a gateway over `sim` for `arm` with the canary at `canary` out of 100, and waits
/// until it answers the arm's model.
pub async fn start_stack(
    sim: &SimHandle,
    o: &CanaryOptions,
    arm: &ArmSpec,
    canary: u32,
) -> Result<Stack> {
    let mut so = stack_options(sim, o.args.flavor, o.args.workers);
    arm.configure(&mut so, canary);
    let what = format!("the gateway of `{}`", arm.label);
    let (stack, _) = start_serving(so, &what, arm.client_model(), 1).await?;
    Ok(stack)
}

/// Everything the demo measured.
#[derive(Debug)]
pub struct Outcome {
    /// Each arm of [`ARMS`]: its figures and its requests.
    pub arms: Vec<(figures::Arm, Vec<drive::Sent>)>,
    /// The rollback's arm.
    pub rollback_arm: (figures::Arm, Vec<drive::Sent>),
    /// The rollback's own figures.
    pub rollback: figures::Rollback,
}

/// Runs every arm on one simulated pool and renders the report (text and HTML); the
/// text, and whether every check of [`report::verdicts`] held.
pub async fn run(o: &CanaryOptions) -> Result<(String, bool)> {
    let sim = sim::start(sim_config(o.args.time_scale))
        .await
        .context("starting the simulator")?;
    let result = measure(&sim, o).await;
    sim.shutdown().await;
    let outcome = result?;
    let ok = report::verdicts(&outcome).iter().all(|(_, held)| *held);
    let mut text = report::text(o, &outcome);
    let page = report::page(&outcome, &text);
    let dir = super::html::run_dir("canary")?;
    text.push('\n');
    text.push_str(&super::html::write_run(&dir, &text, &page)?);
    Ok((text, ok))
}

/// The arms, one after the other, then the rollback.
pub async fn measure(sim: &SimHandle, o: &CanaryOptions) -> Result<Outcome> {
    let mut arms = Vec::new();
    for (i, arm) in ARMS.iter().enumerate() {
        let stack = start_stack(sim, o, arm, CANARY_WEIGHT).await?;
        eprintln!("canary demo: {}, {CANARY_WEIGHT}% on the canary", arm.label);
        let w = workload(o.args.quick, arm.client_model());
        let (_, task) = drive::start(w, i as u64 + 1, arm.label, &stack.picker_url(), CONCURRENCY)?;
        let sent = task.await.context("the client task")??;
        arms.push((figures::Arm::of(arm.label, &sent, &arm.canary(sim)), sent));
        drop(stack);
    }
    eprintln!(
        "canary demo: {}: the canary's weight to 0 halfway through",
        ROLLBACK.label
    );
    let (rollback, sent) = with_rollback(sim, o, ARMS.len() as u64 + 1).await?;
    let rollback_arm = (
        figures::Arm::of(ROLLBACK.label, &sent, &ROLLBACK.canary(sim)),
        sent,
    );
    Ok(Outcome {
        arms,
        rollback_arm,
        rollback,
    })
}

/// [`ROLLBACK`]'s arm with the canary rolled back once half the requests are done: a
/// second Envoy with the canary at 0, the client moved to it, the old one drained and
/// stopped. `salt` varies the text.
async fn with_rollback(
    sim: &SimHandle,
    o: &CanaryOptions,
    salt: u64,
) -> Result<(figures::Rollback, Vec<drive::Sent>)> {
    let old = start_stack(sim, o, &ROLLBACK, CANARY_WEIGHT).await?;
    let old_url = old.picker_url();
    // The rolled-back gateway is brought up beforehand (an Envoy takes a second or two to
    // start here, during which the old one keeps serving), idle until the client moves.
    let new = start_stack(sim, o, &ROLLBACK, 0).await?;
    let w = workload(o.args.quick, ROLLBACK.client_model());
    let (drive, task) = drive::start(w, salt, "rollback", &old_url, CONCURRENCY)?;
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
    let canary = ROLLBACK.canary(sim);
    Ok((figures::Rollback::of(&sent, &canary, at_s, drain_s), sent))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::launch::Backends;

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
            infergate_cli::config::bootstrap::pool_cluster_name(0, STABLE)
        );
        let s = split(true);
        assert_eq!(
            s.to_json(),
            json!({"mode": "sticky", "sessionHeader": "x-session-id"})
        );
        assert_eq!(split(false).to_json(), json!({"mode": "perRequest"}));
        assert_eq!(sim_config(2.0).models, vec![STABLE, CANARY]);
        let mut so = StackOptions::new(Flavor::Wasm, Backends::External(Vec::new()));
        ARMS[1].configure(&mut so, CANARY_WEIGHT);
        assert_eq!(so.pools.len(), 2);
        assert_eq!(
            so.routes,
            vec![RouteSpec::split(STABLE, &[(0, 90), (1, 10)]).sticky()]
        );
        ROLLBACK.configure(&mut so, 0);
        assert_eq!(so.routes[0].backends, vec![(0, 100), (1, 0)]);
        let mut so = StackOptions::new(Flavor::Wasm, Backends::External(Vec::new()));
        ARMS[2].configure(&mut so, CANARY_WEIGHT);
        assert_eq!(so.pools[0].adapters, vec![CANARY]);
        assert_eq!(so.rewrites.len(), 1);
        assert_eq!(so.split.unwrap().mode, SplitMode::PerRequest);
        assert_eq!(ARMS[2].client_model(), CLIENT_MODEL);
        assert_eq!(workload(true, STABLE).conversations, 32);
        let o =
            CanaryOptions::parse(&["--quick".into(), "--flavor".into(), "native".into()]).unwrap();
        assert!(o.args.quick && o.args.flavor == Flavor::Native);
        assert!(CanaryOptions::parse(&["--bogus".into()]).is_err());
    }
}
