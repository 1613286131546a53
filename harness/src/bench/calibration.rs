//! The calibration workload of issue 3 through real gateway stacks: the demo, `bench ttft`
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

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::report::table;
use crate::launch::{client, Backends, EnvoyOptions, Flavor, PoolSpec, Stack, StackOptions};
use crate::load::runner::run_target;
use crate::load::{self, Assign, LoadConfig, Summary, Target, TargetReport, Workload};
use crate::sim::{self, EngineConfig, SimConfig, SimHandle};

/// Default simulated seconds per real second: the largest at which the fixed per-request
/// HTTP cost of this 2-core machine stays small against a ~28 ms simulated cached TTFT
/// (the simulator's own calibration test runs at the same scale).
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

/// The simulated pool of issue 3's calibration.
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

/// A whole run's results, one per [`RunSpec`], in order.
#[derive(Debug)]
pub struct Columns {
    /// The specs, as run.
    pub specs: Vec<RunSpec>,
    /// One report per spec.
    pub reports: Vec<TargetReport>,
}

/// Starts the simulated pool, runs every column in order, stops everything.
pub async fn run(time_scale: f64, quick: bool, specs: &[RunSpec]) -> Result<Columns> {
    let sim = sim::start(sim_config(time_scale))
        .await
        .context("starting the simulator")?;
    let result = run_on(&sim, quick, specs).await;
    sim.shutdown().await;
    result
}

async fn run_on(sim: &SimHandle, quick: bool, specs: &[RunSpec]) -> Result<Columns> {
    let cfg = LoadConfig {
        workload: workload(quick),
        concurrency: 16,
        progress: true,
        ..LoadConfig::default()
    };
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
                    let s = start_stack(sim, spec.flavor, spec.envoy_concurrency).await?;
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
            },
            None => Target {
                label: spec.label.clone(),
                urls: sim.base_urls(),
                assign: Assign::Sticky,
            },
        };
        // A distinct salt per column: distinct text, so no column warms another's cache.
        let report = run_target(&cfg, &target, i as u64 + 1).await?;
        reports.push(report);
    }
    drop(stack);
    Ok(Columns {
        specs: specs.to_vec(),
        reports,
    })
}

async fn start_stack(sim: &SimHandle, flavor: Flavor, workers: u32) -> Result<Stack> {
    let mut so = StackOptions::new(flavor, Backends::External(sim.addrs().to_vec()));
    so.pools = vec![PoolSpec::all(crate::launch::DEFAULT_MODEL)];
    so.envoy = EnvoyOptions {
        concurrency: workers,
        ..EnvoyOptions::default()
    };
    let stack = Stack::start(so)
        .await
        .with_context(|| format!("starting the {flavor} stack (--concurrency {workers})"))?;
    let waited = wait_for_picker(&stack).await?;
    eprintln!(
        "{flavor} Envoy (--concurrency {workers}) up: picker {}, baseline {}; the picker \
         answered 200 {} ms after Envoy was ready",
        stack.picker_url(),
        stack.baseline_url(),
        waited.as_millis()
    );
    Ok(stack)
}

/// Waits until a small request through the picker succeeds: Envoy's `/ready` comes before
/// the gateway's first metrics snapshot, and until then the picker rejects with 503
/// (`rejected-no-endpoints`), which would count as errors of the first column on a fresh
/// stack. Returns how long that took.
async fn wait_for_picker(stack: &Stack) -> Result<Duration> {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let body = serde_json::json!({
        "model": crate::launch::DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
    });
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(30) {
        // Several probes per round: with several Envoy workers each has its own picker.
        let mut ok = 0;
        for _ in 0..4 {
            match client::post_json(&url, &body, &[]).await {
                Ok(r) if r.status == 200 => ok += 1,
                Ok(r) => last = format!("{} {}", r.status, r.text().trim()),
                Err(e) => last = format!("{e:#}"),
            }
        }
        if ok == 4 {
            return Ok(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the picker at {url} did not answer 200 within 30 s: {last}")
}

impl Columns {
    /// The summaries, in column order.
    pub fn summaries(&self) -> Vec<Summary> {
        self.reports.iter().map(|r| r.summary.clone()).collect()
    }

    /// The summary of the first column with `route` (and `label`, if given).
    pub fn find(&self, route: Route, label: Option<&str>) -> Option<&Summary> {
        self.report(route, label).map(|r| &r.summary)
    }

    /// The whole-run and turns-2+ figures of the first column with `route` (and `label`).
    pub fn figures(&self, route: Route, label: Option<&str>) -> Option<Figures> {
        self.report(route, label).map(|r| Figures {
            all: r.summary.clone(),
            later: later_turns(&r.summary.label, &r.records),
        })
    }

    fn report(&self, route: Route, label: Option<&str>) -> Option<&TargetReport> {
        self.specs
            .iter()
            .zip(&self.reports)
            .find(|(s, _)| s.route == route && label.is_none_or(|l| s.label == l))
            .map(|(_, r)| r)
    }

    /// The load generator's side-by-side table, plus the figures of turns 2 and later (the
    /// only ones a router can make hit the cache) and how requests spread over replicas.
    pub fn table(&self) -> String {
        let mut out = load::table(&self.summaries());
        let mut header = vec!["target".to_string()];
        header.extend(self.specs.iter().map(|s| s.label.clone()));
        let spreads: Vec<BTreeMap<String, u64>> =
            self.reports.iter().map(|r| spread(&r.records)).collect();
        let mut replicas: Vec<&String> = spreads.iter().flat_map(|s| s.keys()).collect();
        replicas.sort();
        replicas.dedup();
        let mut rows: Vec<(String, Vec<String>)> = Vec::new();
        let later: Vec<Summary> = self
            .reports
            .iter()
            .map(|r| later_turns(&r.summary.label, &r.records))
            .collect();
        rows.push((
            "turns 2+: cache hit ratio".into(),
            later
                .iter()
                .map(|s| format!("{:.1}%", s.cache_hit_ratio * 100.0))
                .collect(),
        ));
        rows.push((
            "turns 2+: TTFT p50".into(),
            later
                .iter()
                .map(|s| format!("{:.1} ms", s.ttft_p50_s * 1000.0))
                .collect(),
        ));
        rows.extend(replicas.iter().map(|rep| {
            let cells = spreads
                .iter()
                .map(|s| s.get(*rep).copied().unwrap_or(0).to_string())
                .collect();
            (format!("requests on {rep}"), cells)
        }));
        if !rows.is_empty() {
            out.push('\n');
            out.push_str(&table(&header, &rows));
        }
        out
    }
}

/// The summary of turns 2 and later only (the first turn of a conversation can hit no
/// cache, whatever the router does); its duration and rates are not meaningful.
pub fn later_turns(label: &str, records: &[load::RequestRecord]) -> Summary {
    let later: Vec<load::RequestRecord> = records.iter().filter(|r| r.turn > 0).cloned().collect();
    Summary::from_records(label, &later, 0.0)
}

/// Successful requests per serving replica (the simulator's replica-address header).
pub fn spread(records: &[load::RequestRecord]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in records.iter().filter(|r| r.ok()) {
        let k = r.served_by.clone().unwrap_or_else(|| "unknown".into());
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

/// What the comparison lines need of one column: the whole run and its turns 2+.
#[derive(Clone, Debug)]
pub struct Figures {
    /// Every request.
    pub all: Summary,
    /// Turns 2 and later ([`later_turns`]).
    pub later: Summary,
}

/// `baseline ÷ picker` of TTFT p50 and the cache-hit ratios (whole run and turns 2+); with
/// `targets`, the issue-4 verdicts (TTFT ≥ 5× lower, hit ratio ≥ 85%).
pub fn comparison(label: &str, baseline: &Figures, picker: &Figures, targets: bool) -> String {
    let ratio = if picker.all.ttft_p50_s > 0.0 {
        baseline.all.ttft_p50_s / picker.all.ttft_p50_s
    } else {
        0.0
    };
    let verdict = |ok: bool, target: &str| match (targets, ok) {
        (false, _) => String::new(),
        (true, true) => format!(" (target {target}: met)"),
        (true, false) => format!(" (target {target}: MISSED)"),
    };
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    format!(
        "{label}: TTFT p50 /rr ÷ picker = {ratio:.1}×{}; cache-hit ratio {} vs /rr {}{}; \
         turns 2+: {} vs {}\n",
        verdict(ratio >= 5.0, "≥ 5×"),
        pct(picker.all.cache_hit_ratio),
        pct(baseline.all.cache_hit_ratio),
        verdict(picker.all.cache_hit_ratio >= 0.85, "≥ 85%"),
        pct(picker.later.cache_hit_ratio),
        pct(baseline.later.cache_hit_ratio),
    )
}

/// The flags the calibration commands share: `--time-scale S`, `--quick`,
/// `--flavor a[,b]`, `--concurrency a[,b]`.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationArgs {
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// The smaller workload.
    pub quick: bool,
    /// Gateway flavours.
    pub flavors: Vec<Flavor>,
    /// Envoy `--concurrency` values.
    pub concurrencies: Vec<u32>,
}

impl CalibrationArgs {
    /// Parses `args` over the given defaults; anything else is an error.
    pub fn parse(args: &[String], flavors: &[Flavor], concurrencies: &[u32]) -> Result<Self> {
        let mut out = CalibrationArgs {
            time_scale: DEFAULT_TIME_SCALE,
            quick: false,
            flavors: flavors.to_vec(),
            concurrencies: concurrencies.to_vec(),
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .with_context(|| format!("{name} needs a value"))
            };
            match arg.as_str() {
                "--quick" => out.quick = true,
                "--time-scale" => {
                    out.time_scale = value(arg)?.parse().context("--time-scale")?;
                    if out.time_scale.is_nan() || out.time_scale <= 0.0 {
                        bail!("--time-scale must be positive");
                    }
                }
                "--flavor" | "--flavour" | "--flavors" => {
                    out.flavors = list(&value(arg)?).context("--flavor")?;
                    if out.flavors.contains(&Flavor::Plain) {
                        bail!("--flavor: the picker needs wasm or native");
                    }
                }
                "--concurrency" => {
                    out.concurrencies = list(&value(arg)?).context("--concurrency")?
                }
                other => bail!(
                    "unknown argument `{other}` (expected --quick, --time-scale S, \
                     --flavor wasm,native, --concurrency 1,2)"
                ),
            }
        }
        if out.flavors.is_empty() || out.concurrencies.is_empty() {
            bail!("at least one flavour and one concurrency are needed");
        }
        Ok(out)
    }
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.parse::<T>().map_err(|e| anyhow::anyhow!("`{x}`: {e}")))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_parse() {
        let a = CalibrationArgs::parse(&[], &[Flavor::Wasm], &[2]).unwrap();
        assert_eq!(a.time_scale, DEFAULT_TIME_SCALE);
        assert_eq!(
            (a.flavors, a.concurrencies, a.quick),
            (vec![Flavor::Wasm], vec![2], false)
        );
        let a = CalibrationArgs::parse(
            &strings(&[
                "--flavor",
                "wasm,native",
                "--concurrency",
                "1,2,4",
                "--quick",
                "--time-scale",
                "4",
            ]),
            &[Flavor::Wasm],
            &[2],
        )
        .unwrap();
        assert_eq!(a.flavors, vec![Flavor::Wasm, Flavor::Native]);
        assert_eq!(a.concurrencies, vec![1, 2, 4]);
        assert!(a.quick);
        assert_eq!(a.time_scale, 4.0);
        for bad in [
            &["--flavor", "plain"][..],
            &["--time-scale", "0"],
            &["--concurrency", "x"],
            &["--what"],
        ] {
            assert!(
                CalibrationArgs::parse(&strings(bad), &[Flavor::Wasm], &[2]).is_err(),
                "{bad:?}"
            );
        }
    }

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

    #[test]
    fn comparison_states_ratios_and_verdicts() {
        let fig = |ttft: f64, hit: f64| Figures {
            all: Summary {
                ttft_p50_s: ttft,
                cache_hit_ratio: hit,
                ..Summary::default()
            },
            later: Summary {
                cache_hit_ratio: hit,
                ..Summary::default()
            },
        };
        let base = fig(1.0, 0.2);
        let v = comparison("wasm", &base, &fig(0.1, 0.9), true);
        assert!(
            v.contains("10.0×") && v.contains("met") && !v.contains("MISSED"),
            "{v}"
        );
        let v = comparison("w", &base, &fig(0.5, 0.5), true);
        assert_eq!(v.matches("MISSED").count(), 2, "{v}");
        assert!(!comparison("w", &base, &fig(0.5, 0.5), false).contains("target"));
    }

    #[test]
    fn later_turns_leave_the_first_out() {
        let rec = |turn: u32, prompt: u64, cached: u64| load::RequestRecord {
            status: 200,
            turn,
            ttft_s: Some(0.1),
            prompt_tokens: prompt,
            cached_tokens: cached,
            ..load::RequestRecord::default()
        };
        let s = later_turns("x", &[rec(0, 1000, 0), rec(1, 100, 90), rec(2, 100, 100)]);
        assert_eq!(s.requests, 2);
        assert!((s.cache_hit_ratio - 0.95).abs() < 1e-9);
    }

    #[test]
    fn spread_counts_successes_per_replica() {
        let rec = |s: &str, status: u16| load::RequestRecord {
            status,
            served_by: Some(s.into()),
            ..load::RequestRecord::default()
        };
        let m = spread(&[rec("a", 200), rec("a", 200), rec("b", 200), rec("b", 503)]);
        assert_eq!(m.get("a"), Some(&2));
        assert_eq!(m.get("b"), Some(&1));
    }
}
