//! The simulator's calibration workload through real gateway stacks: the demo, `bench ttft`
//! and `bench affinity`.
//!
//! One simulated pool (4 replicas × 160k tokens of KV, 16k tokens/s prefill, a `--time-scale`
//! so the run fits in minutes) is started once and shared by every column of a run. Each
//! column ([`RunSpec`]) sends the whole multi-turn workload (64 conversations, ~8k tokens
//! of context after 6 turns, concurrency 16) to one route: Envoy's round-robin `/rr`
//! baseline, the gateway picker of a flavour at a given Envoy `--concurrency`, or — as the
//! ceiling — the replicas themselves with each conversation pinned to one replica. Columns
//! run one after the other, each with its own text (a different salt), so one column can
//! never warm another's prefix cache; consecutive columns on the same flavour and
//! concurrency share one Envoy.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use super::cli::CalibrationArgs;
pub use super::columns::{
    affinity_table, affinity_verdict, comparison, later_turns, spread, AffinityVerdict, Columns,
    Figures,
};
use crate::launch::{client, Backends, EnvoyOptions, Flavor, PoolSpec, Stack, StackOptions};
use crate::load::runner::run_target;
use crate::load::{Assign, Connections, LoadConfig, Target, Workload};
use crate::sim::{self, EngineConfig, SimConfig, SimHandle};

/// Default simulated seconds per real second: the largest at which the fixed per-request
/// HTTP cost of this 2-core machine stays small against a cached TTFT of some 20 ms
/// simulated (about 10 ms of wall time at this scale; the simulator's own calibration test
/// runs at the same scale).
pub const DEFAULT_TIME_SCALE: f64 = 2.0;

/// Which route a column sends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Envoy `/rr`: round-robin over every replica, no gateway filter.
    Baseline,
    /// Envoy `/`: the gateway filters pick the replica.
    Picker,
    /// Straight to the replicas, conversation `i` always on replica `i mod n` (the best a
    /// router can do for cache hits; no Envoy).
    Sticky,
}

/// One column: a route through an Envoy of some flavour and worker count.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSpec {
    /// Column label.
    pub label: String,
    /// Envoy flavour (ignored for [`Route::Sticky`]).
    pub flavor: Flavor,
    /// Envoy `--concurrency`.
    pub envoy_concurrency: u32,
    /// Where the requests go.
    pub route: Route,
}

impl RunSpec {
    /// A column on `route` through `flavor` with `workers` Envoy worker threads.
    pub fn new(label: impl Into<String>, flavor: Flavor, workers: u32, route: Route) -> Self {
        RunSpec {
            label: label.into(),
            flavor,
            envoy_concurrency: workers,
            route,
        }
    }
}

/// The simulated pool of the calibration.
pub fn sim_config(time_scale: f64) -> SimConfig {
    SimConfig {
        replicas: 4,
        time_scale,
        engine: EngineConfig {
            kv_capacity_tokens: 160_000,
            prefill_tokens_per_s: 16_000.0,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    }
}

/// The calibration workload; `quick` keeps every conversation but sends 3 turns instead of
/// 6 (half the requests, the same cache pressure on the first turns).
pub fn workload(quick: bool) -> Workload {
    Workload {
        conversations: 64,
        turns: if quick { 3 } else { 6 },
        ..Workload::default()
    }
}

/// Which workload a calibration command sends (`--workload`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// [`workload`]: 64 conversations × 6 turns with ~4,000-token system prompts of their
    /// own and 600-token answers.
    #[default]
    Calibration,
    /// Multi-turn chat as the platform's seed clients send it: 64 conversations × 6 turns
    /// with ~2,000-token system prompts, 128-token questions and 256-token answers.
    Seed,
    /// inference-perf's shared-prefix shape: 16 groups × 16 one-turn prompts, each group
    /// sharing a ~2,048-token system prompt, with 256-token questions and answers.
    SharedPrefix,
}

impl Shape {
    /// The workload (`quick`: 3 turns of the multi-turn ones, 8 prompts per group).
    pub fn workload(self, quick: bool) -> Workload {
        match self {
            Shape::Calibration => workload(quick),
            Shape::Seed => Workload {
                conversations: 64,
                turns: if quick { 3 } else { 6 },
                system_tokens: 2_000,
                user_tokens: 128,
                max_tokens: 256,
                ..Workload::default()
            },
            Shape::SharedPrefix => Workload {
                conversations: if quick { 128 } else { 256 },
                turns: 1,
                system_tokens: 0,
                prefix_groups: 16,
                group_prefix_tokens: 2_048,
                user_tokens: 256,
                max_tokens: 256,
                ..Workload::default()
            },
        }
    }

    /// How the workload is offered: 16 clients in a closed loop, each sending its next
    /// request when the last one ends, except shared-prefix, whose requests arrive at a
    /// seeded Poisson rate as inference-perf offers them (12 per second, about two thirds
    /// of what the pool serves to 16 closed-loop clients, at most 64 in flight). A closed
    /// loop of one-turn prompts of equal length runs in lock step: prompts that arrive
    /// together end together and arrive together again, on every route alike, which says
    /// more about the client than about the router.
    pub fn load(self, quick: bool) -> LoadConfig {
        let (concurrency, rate) = match self {
            Shape::SharedPrefix => (64, Some(12.0)),
            Shape::Calibration | Shape::Seed => (16, None),
        };
        LoadConfig {
            workload: self.workload(quick),
            concurrency,
            rate,
            progress: true,
            ..LoadConfig::default()
        }
    }

    /// The workload in a report's title block.
    pub fn describe(self, quick: bool) -> String {
        let w = self.workload(quick);
        match self {
            Shape::SharedPrefix => {
                format!(
                    "shared prefix: {} groups × {} one-turn prompts, ~{}-token group system \
                 prompts, {}-token questions and answers",
                    w.prefix_groups,
                    w.conversations / w.prefix_groups.max(1),
                    w.group_prefix_tokens,
                    w.user_tokens
                ) + ", Poisson arrivals at 12 requests/s (at most 64 in flight)"
            }
            Shape::Calibration | Shape::Seed => {
                format!(
                    "{}: {} conversations × {} turns, ~{}-token system prompts",
                    if self == Shape::Seed {
                        "seed-like"
                    } else {
                        "calibration"
                    },
                    w.conversations,
                    w.turns,
                    w.system_tokens
                ) + ", concurrency 16"
            }
        }
    }
}

/// Starts the simulated pool, runs every column in order with `load` (its targets are the
/// columns'), stops everything. The gateways' pool has `picker_config` as its `eppConfig`
/// (`null`: the built-in default).
pub async fn run(
    time_scale: f64,
    load: LoadConfig,
    picker_config: &serde_json::Value,
    specs: &[RunSpec],
) -> Result<Columns> {
    let sim = sim::start(sim_config(time_scale))
        .await
        .context("starting the simulator")?;
    let result = run_on(&sim, &load, picker_config, specs).await;
    sim.shutdown().await;
    result
}

async fn run_on(
    sim: &SimHandle,
    cfg: &LoadConfig,
    picker_config: &serde_json::Value,
    specs: &[RunSpec],
) -> Result<Columns> {
    let mut stack: Option<(Flavor, u32, Stack)> = None;
    let mut reports = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let url = match spec.route {
            Route::Sticky => None,
            Route::Baseline | Route::Picker => {
                let key = (spec.flavor, spec.envoy_concurrency);
                let reuse = matches!(&stack, Some((f, c, _)) if (*f, *c) == key);
                if !reuse {
                    // The previous Envoy stops before the next one starts.
                    drop(stack.take());
                    let s = start_stack(sim, spec.flavor, spec.envoy_concurrency, picker_config)
                        .await?;
                    stack = Some((spec.flavor, spec.envoy_concurrency, s));
                }
                let Some((_, _, s)) = &stack else {
                    bail!("no stack for column {}", spec.label);
                };
                Some(match spec.route {
                    Route::Baseline => s.baseline_url(),
                    _ => s.picker_url(),
                })
            }
        };
        let target = match url {
            Some(u) => Target {
                label: spec.label.clone(),
                urls: vec![u],
                assign: Assign::Random,
                connections: Connections::KeepAlive,
            },
            None => Target {
                label: spec.label.clone(),
                urls: sim.base_urls(),
                assign: Assign::Sticky,
                connections: Connections::KeepAlive,
            },
        };
        // A distinct salt per column: distinct text, so no column warms another's cache.
        let report = run_target(cfg, &target, i as u64 + 1).await?;
        if !report.summary.errors.is_empty() {
            if let Some((_, _, s)) = &stack {
                eprintln!(
                    "{}: requests failed; {}",
                    spec.label,
                    gateway_trouble(s).await
                );
            }
        }
        reports.push(report);
    }
    drop(stack);
    Ok(Columns {
        specs: specs.to_vec(),
        reports,
    })
}

async fn start_stack(
    sim: &SimHandle,
    flavor: Flavor,
    workers: u32,
    picker_config: &serde_json::Value,
) -> Result<Stack> {
    let mut so = stack_options(sim, flavor, workers);
    let mut pool = PoolSpec::all(crate::launch::DEFAULT_MODEL);
    pool.picker_config = picker_config.clone();
    so.pools = vec![pool];
    // Each probe is a new connection, which the kernel hands to some worker: with several
    // workers, several probes in a row make it likely that every worker answered once.
    let probes = (2 * workers).max(4);
    let what = format!("the {flavor} stack (--concurrency {workers})");
    let (stack, waited) = start_serving(so, &what, crate::launch::DEFAULT_MODEL, probes).await?;
    eprintln!(
        "{flavor} Envoy (--concurrency {workers}) up: picker {}, baseline {}; the picker \
         answered 200 {} ms after Envoy was ready",
        stack.picker_url(),
        stack.baseline_url(),
        waited.as_millis()
    );
    Ok(stack)
}

/// The options of a gateway stack of `flavor` in front of `sim`'s replicas with `workers`
/// Envoy workers; the caller adds its pools, routes and configs.
pub fn stack_options(sim: &SimHandle, flavor: Flavor, workers: u32) -> StackOptions {
    let mut so = StackOptions::new(flavor, Backends::External(sim.addrs().to_vec()));
    so.envoy = EnvoyOptions {
        concurrency: workers,
        ..EnvoyOptions::default()
    };
    so
}

/// Starts `so` (`what` names it in the error) and waits until `probes` requests in a row
/// for `model` through the picker answer 200 ([`wait_for_picker`]); the stack and how long
/// that wait took.
pub async fn start_serving(
    so: StackOptions,
    what: &str,
    model: &str,
    probes: u32,
) -> Result<(Stack, Duration)> {
    let stack = Stack::start(so)
        .await
        .with_context(|| format!("starting {what}"))?;
    let waited = wait_for_picker(&stack, model, probes).await?;
    Ok((stack, waited))
}

/// The gateway's counters that explain failed requests (the picker's rejections, failed
/// scrapes, snapshot and publish errors), one `name value` per non-zero counter.
async fn gateway_trouble(stack: &Stack) -> String {
    let stats = match stack.envoy().stats().await {
        Ok(s) => s,
        Err(e) => return format!("reading Envoy's stats: {e:#}"),
    };
    let lines: Vec<String> = stats
        .containing("infergate.")
        .filter(|(k, v)| {
            *v != 0
                && (k.contains("picker.rejects")
                    || k.contains("no_pool_rejects")
                    || (k.contains("scraper.scrapes") && !k.ends_with(".result.ok"))
                    || k.contains("snapshot_errors")
                    || k.contains("publish_errors")
                    || k.contains("tick_failures"))
        })
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if lines.is_empty() {
        "the gateway counted no rejection or failed scrape".into()
    } else {
        format!("gateway counters: {}", lines.join(", "))
    }
}

/// Waits until the scraper has published and small requests through the picker succeed:
/// Envoy's `/ready` comes before the gateway's first metrics snapshot, and until then the
/// picker rejects with 503 (`rejected-no-endpoints`), which would count as failed requests
/// of the first measurement on a fresh stack. `probes` requests for `model` in a row must answer 200.
/// Returns how long that took.
pub async fn wait_for_picker(stack: &Stack, model: &str, probes: u32) -> Result<Duration> {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
    });
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(30) {
        let published = match stack.envoy().stats().await {
            Ok(stats) => stats.sum_containing("infergate.scraper.publishes"),
            Err(e) => {
                last = format!("reading stats: {e:#}");
                0
            }
        };
        let mut ok = 0;
        if published > 0 {
            for _ in 0..probes {
                match client::post_json(&url, &body, &[]).await {
                    Ok(r) if r.status == 200 => ok += 1,
                    Ok(r) => last = format!("{} {}", r.status, r.text().trim()),
                    Err(e) => last = format!("{e:#}"),
                }
            }
        } else {
            last = "the scraper has not published yet".into();
        }
        if ok == probes {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the picker at {url} did not answer 200 within 30 s: {last}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn workload_is_the_issue_3_calibration() {
        let w = workload(false);
        assert_eq!((w.conversations, w.turns), (64, 6));
        let s = sim_config(2.0);
        assert_eq!(s.replicas, 4);
        assert_eq!(s.engine.kv_capacity_tokens, 160_000);
        assert_eq!(s.engine.prefill_tokens_per_s, 16_000.0);
        assert_eq!(workload(true).turns, 3);
    }
}
