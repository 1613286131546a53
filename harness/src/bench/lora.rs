//! `cargo xtask bench lora`: how many LoRA adapter loads the picker saves against round
//! robin, with more adapters than slots on every replica.
//!
//! One simulated pool (4 replicas with 2 adapter slots each, 12 adapters, a 50 ms load per
//! adapter that is not resident) serves conversations whose `model` is an adapter drawn by
//! a Zipf law, the conversations of one adapter sharing its system prompt. The same
//! workload (the same adapter per conversation, distinct text per arm so no arm warms
//! another's cache) goes through Envoy's round-robin `/rr`, then through the gateway
//! picker of each flavour, whose pool config is the default scheduling plus the
//! `lora-affinity-scorer`. The simulator counts every admission that had to load an
//! adapter ([`crate::sim::engine::EngineCounters::lora_loads`]); an arm's figure is the count's
//! growth over the arm, per 1,000 requests. The bench fails unless every picker arm loads
//! at most a third as often as `/rr`, with no failed request.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::calibration::{stack_options, start_serving, CalibrationArgs};
use super::cli::parse_flags;
use super::report;
use crate::launch::{Flavor, PoolSpec, Stack};
use crate::load::runner::run_target;
use crate::load::workload::numbered_adapters;
use crate::load::{Assign, Connections, LoadConfig, Target, TargetReport, Workload};
use crate::sim::{self, EngineConfig, SimConfig, SimHandle};

/// Replicas of the pool.
pub const REPLICAS: u32 = 4;
/// Adapter slots per replica (vLLM's `max_loras`).
pub const MAX_LORAS: u32 = 2;
/// Adapters the workload spreads over by default: four times a replica's slots, as many
/// as the pool's slots in all (so a placement exists that never swaps one out).
pub const ADAPTERS: u32 = 8;
/// Tokens of the system prompt the conversations of one adapter share by default.
pub const ADAPTER_PREFIX_TOKENS: u32 = 1024;
/// Weight of the `lora-affinity-scorer` beside the default scorers (the prefix scorer
/// weighs 3, the load scorers 1 each).
pub const LORA_WEIGHT: f64 = 2.0;
/// The most loads a picker arm may make per load of `/rr` (the bench's criterion).
pub const MAX_LOAD_RATIO: f64 = 1.0 / 3.0;
/// Requests in flight at most.
pub const CONCURRENCY: u32 = 16;
/// The base model of the pool.
pub const BASE_MODEL: &str = crate::launch::DEFAULT_MODEL;

/// What the pool and the workload look like.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scenario {
    /// Adapters served and asked for.
    pub adapters: u32,
    /// Tokens of each adapter's shared system prompt (0: none, so only the LoRA scorer
    /// can bring an adapter's first turns together).
    pub adapter_prefix_tokens: u32,
    /// Weight of the LoRA scorer; 0 leaves it out of the picker's config.
    pub lora_weight: f64,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            adapters: ADAPTERS,
            adapter_prefix_tokens: ADAPTER_PREFIX_TOKENS,
            lora_weight: LORA_WEIGHT,
        }
    }
}

impl Scenario {
    /// The simulated pool: [`REPLICAS`] replicas serving the adapters on [`MAX_LORAS`]
    /// slots each, a 50 ms load for an adapter that is not resident.
    pub fn sim_config(&self, time_scale: f64) -> SimConfig {
        SimConfig {
            replicas: REPLICAS,
            models: vec![BASE_MODEL.into()],
            loras: numbered_adapters(self.adapters),
            time_scale,
            engine: EngineConfig {
                max_loras: MAX_LORAS,
                lora_load_ms: 50.0,
                ..EngineConfig::default()
            },
            ..SimConfig::default()
        }
    }

    /// The workload: conversations over the adapters (Zipf, exponent 1), each adapter's
    /// conversations sharing its system prompt, then 128 tokens of their own, 32-token
    /// questions and 48-token answers. `quick`: 96 conversations × 2 turns (192
    /// requests); else 200 × 5 (1,000).
    pub fn workload(&self, quick: bool) -> Workload {
        Workload {
            model: BASE_MODEL.into(),
            conversations: if quick { 96 } else { 200 },
            turns: if quick { 2 } else { 5 },
            system_tokens: 128,
            user_tokens: 32,
            max_tokens: 48,
            adapters: numbered_adapters(self.adapters),
            adapter_zipf: 1.0,
            adapter_prefix_tokens: self.adapter_prefix_tokens,
            ..Workload::default()
        }
    }

    /// The gateway's pool: the base model and every adapter on every replica, scheduled
    /// by [`picker_config`].
    pub fn pool_spec(&self) -> PoolSpec {
        PoolSpec {
            adapters: numbered_adapters(self.adapters),
            picker_config: picker_config(self.lora_weight),
            ..PoolSpec::all(BASE_MODEL)
        }
    }
}

/// The picker's pool config: the default scheduling plus `lora-affinity-scorer` at
/// `weight` (none at 0).
pub fn picker_config(weight: f64) -> Value {
    let mut cfg = infergate_filters::picker::config::default_epp_config();
    if weight <= 0.0 {
        return cfg;
    }
    if let Some(plugins) = cfg["plugins"].as_array_mut() {
        plugins.insert(0, json!({"type": "lora-affinity-scorer"}));
    }
    if let Some(profile) = cfg["schedulingProfiles"][0]["plugins"].as_array_mut() {
        let at = profile.len().saturating_sub(1);
        profile.insert(
            at,
            json!({"pluginRef": "lora-affinity-scorer", "weight": weight}),
        );
    }
    cfg
}

/// Σ adapter loads of every replica so far.
pub async fn lora_loads(sim: &SimHandle) -> Result<u64> {
    let mut total = 0;
    for k in 0..sim.addrs().len() {
        total += sim.stats(k).await?.counters.lora_loads;
    }
    Ok(total)
}

/// One arm's outcome.
#[derive(Debug)]
pub struct Arm {
    /// Column label.
    pub label: String,
    /// Adapter loads during the arm.
    pub loads: u64,
    /// The load generator's report.
    pub report: TargetReport,
    /// For each adapter, the replicas that served it (by the simulator's replica header).
    pub replicas_per_adapter: BTreeMap<String, BTreeSet<String>>,
}

impl Arm {
    /// Adapter loads per 1,000 requests sent.
    pub fn loads_per_thousand(&self) -> f64 {
        let n = self.report.summary.requests.max(1) as f64;
        self.loads as f64 * 1000.0 / n
    }

    /// Mean number of replicas each adapter was served on.
    pub fn mean_replicas_per_adapter(&self) -> f64 {
        let n = self.replicas_per_adapter.len().max(1) as f64;
        self.replicas_per_adapter
            .values()
            .map(|s| s.len() as f64)
            .sum::<f64>()
            / n
    }
}

/// Runs `workload` against `url` at [`CONCURRENCY`] (`salt` varies the text), counting the
/// adapter loads of `sim` over the run.
pub async fn run_arm(
    sim: &SimHandle,
    label: &str,
    url: String,
    workload: &Workload,
    salt: u64,
) -> Result<Arm> {
    let cfg = LoadConfig {
        workload: workload.clone(),
        concurrency: CONCURRENCY,
        progress: true,
        ..LoadConfig::default()
    };
    let target = Target {
        label: label.to_owned(),
        urls: vec![url],
        assign: Assign::Random,
        connections: Connections::KeepAlive,
    };
    let before = lora_loads(sim).await?;
    let report = run_target(&cfg, &target, salt).await?;
    let loads = lora_loads(sim).await? - before;
    let mut replicas_per_adapter: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in report.records.iter().filter(|r| r.ok()) {
        if let Some(replica) = &r.served_by {
            replicas_per_adapter
                .entry(workload.model_of(r.conversation).to_owned())
                .or_default()
                .insert(replica.clone());
        }
    }
    Ok(Arm {
        label: label.to_owned(),
        loads,
        report,
        replicas_per_adapter,
    })
}

/// Starts `flavor` with `workers` Envoy workers over `sim`, the pool of
/// [`Scenario::pool_spec`], and waits until the picker answers.
pub async fn start_stack(
    sim: &SimHandle,
    flavor: Flavor,
    workers: u32,
    scenario: &Scenario,
) -> Result<Stack> {
    let mut so = stack_options(sim, flavor, workers);
    so.pools = vec![scenario.pool_spec()];
    // Before the first snapshot the pool answers 503; one base-model answer is enough.
    let (stack, _) = start_serving(so, &format!("the {flavor} stack"), BASE_MODEL, 1).await?;
    Ok(stack)
}

/// Options of `bench lora`: the calibration commands' flags (`--quick`, `--time-scale`,
/// `--flavor`, `--workers`) and the scenario's (`--adapters N`, `--adapter-prefix-tokens
/// T`, `--lora-weight W`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraOptions {
    /// The shared flags.
    pub args: CalibrationArgs,
    /// The pool and workload.
    pub scenario: Scenario,
}

/// `bench lora`'s flags: both flavours and one Envoy worker by default.
#[derive(clap::Args, Clone, Debug, PartialEq)]
#[command(
    mut_arg("flavors", |a| a.default_value("wasm,native")),
    mut_arg("quick", |a| a.help("96 conversations x 2 turns instead of 200 x 5"))
)]
pub struct LoraFlags {
    /// The shared flags.
    #[command(flatten)]
    pub args: CalibrationArgs,
    /// Adapters served and asked for: more than a replica's 2 slots.
    #[arg(long, value_name = "N", default_value_t = ADAPTERS, value_parser = adapters)]
    pub adapters: u32,
    /// Tokens of each adapter's shared system prompt; 0: no shared prompt.
    #[arg(long, value_name = "T", default_value_t = ADAPTER_PREFIX_TOKENS)]
    pub adapter_prefix_tokens: u32,
    /// Weight of the lora-affinity-scorer; 0: no LoRA scorer.
    #[arg(long, value_name = "W", default_value_t = LORA_WEIGHT, value_parser = lora_weight)]
    pub lora_weight: f64,
}

/// `--adapters`: more than a replica's slots.
fn adapters(s: &str) -> Result<u32> {
    let n: u32 = s.trim().parse()?;
    if n <= MAX_LORAS {
        bail!("must be more than a replica's {MAX_LORAS} slots");
    }
    Ok(n)
}

/// `--lora-weight`: 0 or more.
fn lora_weight(s: &str) -> Result<f64> {
    let w: f64 = s.trim().parse()?;
    if w.is_nan() || w < 0.0 {
        bail!("must be 0 or more");
    }
    Ok(w)
}

impl LoraFlags {
    /// The run these flags ask for.
    pub fn options(self) -> LoraOptions {
        LoraOptions {
            args: self.args,
            scenario: Scenario {
                adapters: self.adapters,
                adapter_prefix_tokens: self.adapter_prefix_tokens,
                lora_weight: self.lora_weight,
            },
        }
    }
}

impl LoraOptions {
    /// Parses the flags; both flavours and one Envoy worker by default.
    pub fn parse(args: &[String]) -> Result<Self> {
        Ok(parse_flags::<LoraFlags>(args)?.options())
    }
}

/// `/rr` once (through the first flavour's Envoy), then the picker of every flavour, each
/// arm on a simulated pool of its own, so no arm starts with the adapters an earlier one
/// left resident; the report and whether every picker arm met the criterion.
pub async fn run(o: &LoraOptions) -> Result<(String, bool)> {
    let a = &o.args;
    let w = o.scenario.workload(a.quick);
    let workers = a.concurrencies.first().copied().unwrap_or(1);
    let mut arms = Vec::new();
    for (i, flavor) in a.flavors.iter().enumerate() {
        if i == 0 {
            let label = "/rr (round-robin)";
            arms.push(arm_on_fresh_pool(o, *flavor, workers, label, true, &w, 1).await?);
        }
        let label = format!("picker ({flavor})");
        let salt = i as u64 + 2;
        arms.push(arm_on_fresh_pool(o, *flavor, workers, &label, false, &w, salt).await?);
    }
    Ok(table(&w, o, &arms))
}

/// One arm over a simulator and an Envoy of its own: through `/rr` when `baseline`, else
/// through the picker.
async fn arm_on_fresh_pool(
    o: &LoraOptions,
    flavor: Flavor,
    workers: u32,
    label: &str,
    baseline: bool,
    w: &Workload,
    salt: u64,
) -> Result<Arm> {
    let sim = sim::start(o.scenario.sim_config(o.args.time_scale))
        .await
        .context("starting the simulator")?;
    let result = async {
        let stack = start_stack(&sim, flavor, workers, &o.scenario).await?;
        let url = if baseline {
            stack.baseline_url()
        } else {
            stack.picker_url()
        };
        run_arm(&sim, label, url, w, salt).await
    }
    .await;
    sim.shutdown().await;
    result
}

/// The report: one column per arm; the verdict line per picker arm.
pub fn table(w: &Workload, o: &LoraOptions, arms: &[Arm]) -> (String, bool) {
    let mut out = String::new();
    let sc = &o.scenario;
    let scorer = if sc.lora_weight > 0.0 {
        format!("lora-affinity-scorer weight {}", sc.lora_weight)
    } else {
        "no lora-affinity-scorer".to_owned()
    };
    let _ = writeln!(
        out,
        "LoRA adapter loads: {REPLICAS} replicas x {MAX_LORAS} adapter slots, {} adapters \
         (Zipf 1.0, {} tokens of system prompt shared per adapter), {} conversations x {} \
         turns, concurrency {CONCURRENCY}, time scale {}, Envoy --concurrency {}; the \
         picker: default scorers + {scorer}\n",
        sc.adapters,
        sc.adapter_prefix_tokens,
        w.conversations,
        w.turns,
        o.args.time_scale,
        o.args.concurrencies.first().copied().unwrap_or(1)
    );
    let mut header = vec![String::new()];
    header.extend(arms.iter().map(|arm| arm.label.clone()));
    let row = |name: &str, f: &dyn Fn(&Arm) -> String| -> (String, Vec<String>) {
        (name.to_owned(), arms.iter().map(f).collect())
    };
    let rows = vec![
        row("requests (failed)", &|x| {
            format!(
                "{} ({})",
                x.report.summary.requests,
                x.report.summary.requests - x.report.summary.ok
            )
        }),
        row("adapter loads", &|x| x.loads.to_string()),
        row("loads per 1,000 requests", &|x| {
            format!("{:.0}", x.loads_per_thousand())
        }),
        row("replicas per adapter (mean)", &|x| {
            format!("{:.2}", x.mean_replicas_per_adapter())
        }),
        row("TTFT p50 / p99", &|x| {
            format!(
                "{:.1} / {:.0} ms",
                x.report.summary.ttft_p50_s * 1000.0,
                x.report.summary.ttft_p99_s * 1000.0
            )
        }),
        row("cache-hit ratio", &|x| {
            format!("{:.1}%", x.report.summary.cache_hit_ratio * 100.0)
        }),
    ];
    out.push_str(&report::table(&header, &rows));
    let mut ok = true;
    let rr = arms.first();
    for arm in arms.iter().skip(1) {
        let Some(rr) = rr else { break };
        let fewer = if arm.loads == 0 {
            f64::INFINITY
        } else {
            rr.loads as f64 / arm.loads as f64
        };
        let met = (arm.loads as f64) <= rr.loads as f64 * MAX_LOAD_RATIO
            && arm.report.summary.ok == arm.report.summary.requests
            && rr.report.summary.ok == rr.report.summary.requests;
        ok &= met;
        let _ = writeln!(
            out,
            "\n{}: {:.1}x fewer adapter loads than /rr (criterion: at least 3x, no failed \
             request): {}",
            arm.label,
            fewer,
            if met { "met" } else { "MISSED" }
        );
    }
    (out, ok)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_has_more_adapters_than_slots_and_the_picker_scores_them() {
        let sc = Scenario::default();
        let s = sc.sim_config(2.0);
        assert!(s.loras.len() > s.engine.max_loras as usize);
        assert_eq!(s.replicas, REPLICAS);
        let w = sc.workload(true);
        assert_eq!(w.conversations * w.turns, 192);
        let full = sc.workload(false);
        assert_eq!(full.conversations * full.turns, 1000);
        assert_eq!(
            full.adapters, s.loras,
            "the workload asks for what the pool serves"
        );
        let cfg = picker_config(LORA_WEIGHT);
        let profile = cfg["schedulingProfiles"][0]["plugins"].as_array().unwrap();
        assert!(profile
            .iter()
            .any(|p| p["pluginRef"] == "lora-affinity-scorer" && p["weight"] == 2.0));
        assert_eq!(
            profile.last().unwrap()["pluginRef"],
            "max-score-picker",
            "the picker stays last"
        );
        assert_eq!(sc.pool_spec().adapters.len(), ADAPTERS as usize);
        assert!(!picker_config(0.0).to_string().contains("lora"));
        let strings = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = LoraOptions::parse(&strings(&[
            "--quick",
            "--lora-weight",
            "0",
            "--adapters",
            "12",
            "--adapter-prefix-tokens",
            "0",
        ]))
        .unwrap();
        assert!(o.args.quick);
        assert_eq!(
            o.scenario,
            Scenario {
                adapters: 12,
                adapter_prefix_tokens: 0,
                lora_weight: 0.0
            }
        );
        assert_eq!(o.args.flavors.len(), 2);
        assert!(LoraOptions::parse(&strings(&["--lora-weight", "-1"])).is_err());
        assert!(LoraOptions::parse(&strings(&["--adapters", "2"])).is_err());
    }
}
