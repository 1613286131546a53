//! `cargo xtask bench pressure`: the approximate and the precise prefix index on the same
//! workload when the working set is twice the pool's KV cache, so the engines evict blocks
//! the approximate index still believes cached.
//!
//! Two arms, each on a fresh simulated pool with the same prompts (salt), through the
//! native gateway (the precise index needs it):
//!
//! - `approx`: the gateway's default config (`approx-prefix-cache-producer`, placement,
//!   load scorers);
//! - `precise`: the same config with `precise-prefix-cache-producer` in place of the
//!   approximate producer, fed by the simulator's KV events.
//!
//! The workload is the calibration's (64 conversations × 6 turns, ~4,000-token system
//! prompts, 600-token answers, 16 in flight): its last turns hold ~8k tokens each, ~520k
//! tokens in all, over 4 replicas of [`KV_TOKENS_PER_REPLICA`] (260k in all). The report:
//! the cache-hit ratio the clients saw (`cached_tokens` of each usage), TTFT p50 / p95, and
//! the engine-side truth: the simulator's own prefix-cache lookups and hits in tokens and
//! its evictions, summed over the replicas. The verdict: the precise arm's engine-side hit
//! ratio and its TTFT p50 beat the approximate arm's.

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::calibration::{self, stack_options, wait_for_picker, DEFAULT_TIME_SCALE};
use super::cli::{parse_flags, time_scale, workers};
use super::report::table;
use crate::launch::{Flavor, PoolSpec, Stack, DEFAULT_MODEL};
use crate::load::runner::run_target;
use crate::load::{LoadConfig, Target, TargetReport};
use crate::sim::{self, SimConfig, SimHandle};

/// KV cache of each simulated replica, in tokens: the pool holds about half the workload's
/// working set.
pub const KV_TOKENS_PER_REPLICA: u32 = 65_000;

/// The simulator's KV events at each replica's HTTP port + this.
const EVENTS_OFFSET: u16 = 1000;

/// Requests in flight: the calibration's.
const CONCURRENCY: u32 = 16;

/// The options of `bench pressure`, and its flags.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct PressureOptions {
    /// Simulated seconds per real second.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_TIME_SCALE, value_parser = time_scale)]
    pub time_scale: f64,
    /// 3 turns per conversation instead of 6.
    #[arg(long)]
    pub quick: bool,
    /// Envoy worker threads.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = workers)]
    pub workers: u32,
}

impl Default for PressureOptions {
    fn default() -> Self {
        PressureOptions {
            time_scale: DEFAULT_TIME_SCALE,
            quick: false,
            workers: 1,
        }
    }
}

impl PressureOptions {
    /// Parses `--workers N`, `--time-scale S` and `--quick`.
    pub fn parse(args: &[String]) -> Result<Self> {
        parse_flags(args)
    }
}

/// The simulated pool: the calibration's, with a quarter of its KV and KV events on.
pub fn sim_config(time_scale: f64) -> SimConfig {
    let mut cfg = calibration::sim_config(time_scale);
    cfg.engine.kv_capacity_tokens = KV_TOKENS_PER_REPLICA;
    cfg.kv_events_port_offset = Some(EVENTS_OFFSET);
    cfg
}

/// The gateway's default scheduling config with `producer` as its prefix producer.
pub fn epp_config(producer: Value) -> Value {
    let mut cfg = infergate_filters::picker::config::default_epp_config();
    if let Some(first) = cfg
        .get_mut("plugins")
        .and_then(Value::as_array_mut)
        .and_then(|p| p.first_mut())
    {
        *first = producer;
    }
    cfg
}

/// Which prefix index an arm runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Index {
    /// `approx-prefix-cache-producer`.
    Approximate,
    /// `precise-prefix-cache-producer`.
    Precise,
}

impl Index {
    fn label(self) -> &'static str {
        match self {
            Index::Approximate => "approx",
            Index::Precise => "precise",
        }
    }

    fn producer(self) -> Value {
        match self {
            Index::Approximate => json!({"type": "approx-prefix-cache-producer"}),
            Index::Precise => json!({"type": "precise-prefix-cache-producer",
                "parameters": {"kvEventsPortOffset": EVENTS_OFFSET}}),
        }
    }
}

/// The simulator's own counters over an arm, summed over the replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineTruth {
    /// Prompt tokens looked up in the prefix caches.
    pub queried_tokens: u64,
    /// Of those, tokens found cached.
    pub hit_tokens: u64,
    /// Cached blocks evicted.
    pub evictions: u64,
}

impl EngineTruth {
    /// Hits ÷ lookups (0 with none).
    pub fn hit_ratio(&self) -> f64 {
        if self.queried_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.queried_tokens as f64
        }
    }
}

async fn engine_truth(sim: &SimHandle) -> Result<EngineTruth> {
    let mut t = EngineTruth::default();
    for i in 0..sim.addrs().len() {
        let s = sim.stats(i).await?;
        t.queried_tokens += s.counters.prefix_queries_tokens;
        t.hit_tokens += s.counters.prefix_hits_tokens;
        t.evictions += s.evictions;
    }
    Ok(t)
}

/// One arm's results.
#[derive(Debug)]
pub struct Arm {
    /// Its index.
    pub index: Index,
    /// Every request.
    pub report: TargetReport,
    /// The simulator's counters over the run.
    pub engine: EngineTruth,
}

/// Runs one arm on a fresh pool.
pub async fn run_arm(opts: &PressureOptions, index: Index) -> Result<Arm> {
    let sim = sim::start(sim_config(opts.time_scale))
        .await
        .context("starting the simulator")?;
    let result = async {
        let mut so = stack_options(&sim, Flavor::Native, opts.workers);
        let mut pool = PoolSpec::all(DEFAULT_MODEL);
        pool.picker_config = epp_config(index.producer());
        so.pools = vec![pool];
        let stack = Stack::start(so).await.context("starting the gateway")?;
        wait_for_picker(&stack, DEFAULT_MODEL, 4).await?;
        // The precise arm's subscriber polls its targets every second; let it join every
        // stream before the workload (a PUB socket drops what nobody receives yet).
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let before = engine_truth(&sim).await?;
        let cfg = LoadConfig {
            workload: calibration::workload(opts.quick),
            concurrency: CONCURRENCY,
            progress: true,
            ..LoadConfig::default()
        };
        let target = Target::balanced(index.label().to_owned(), vec![stack.picker_url()]);
        let report = run_target(&cfg, &target, 1).await?;
        let after = engine_truth(&sim).await?;
        drop(stack);
        Ok(Arm {
            index,
            report,
            engine: EngineTruth {
                queried_tokens: after.queried_tokens - before.queried_tokens,
                hit_tokens: after.hit_tokens - before.hit_tokens,
                evictions: after.evictions - before.evictions,
            },
        })
    }
    .await;
    sim.shutdown().await;
    result
}

/// Whether the precise arm beat the approximate one on the engine's hit ratio and TTFT p50.
pub fn precise_wins(approx: &Arm, precise: &Arm) -> bool {
    precise.engine.hit_ratio() > approx.engine.hit_ratio()
        && precise.report.summary.ttft_p50_s < approx.report.summary.ttft_p50_s
        && precise.report.summary.errors.is_empty()
}

/// Runs both arms and renders the report; the flag is [`precise_wins`].
pub async fn run(opts: &PressureOptions) -> Result<(String, bool)> {
    let approx = run_arm(opts, Index::Approximate).await?;
    let precise = run_arm(opts, Index::Precise).await?;
    let ok = precise_wins(&approx, &precise);
    Ok((report(opts, &[approx, precise], ok), ok))
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn ms(s: f64) -> String {
    format!("{:.1} ms", s * 1000.0)
}

/// The report: a title block, one column per arm, the verdict.
pub fn report(opts: &PressureOptions, arms: &[Arm], ok: bool) -> String {
    let w = calibration::workload(opts.quick);
    let mut header = vec!["index".to_string()];
    header.extend(arms.iter().map(|a| a.index.label().to_string()));
    let row = |label: &str, f: &dyn Fn(&Arm) -> String| {
        (label.to_string(), arms.iter().map(f).collect::<Vec<_>>())
    };
    let rows = vec![
        row("requests", &|a| a.report.summary.requests.to_string()),
        row("failed", &|a| {
            a.report.summary.errors.values().sum::<u64>().to_string()
        }),
        row("cache-hit ratio seen by clients", &|a| {
            pct(a.report.summary.cache_hit_ratio)
        }),
        row("cache-hit ratio, turns 2+", &|a| {
            pct(
                calibration::later_turns(&a.report.summary.label, &a.report.records)
                    .cache_hit_ratio,
            )
        }),
        row("engine: prefix-cache hits / lookups (tokens)", &|a| {
            format!("{} / {}", a.engine.hit_tokens, a.engine.queried_tokens)
        }),
        row("engine: hit ratio", &|a| pct(a.engine.hit_ratio())),
        row("engine: blocks evicted", &|a| {
            a.engine.evictions.to_string()
        }),
        row("TTFT p50", &|a| ms(a.report.summary.ttft_p50_s)),
        row("TTFT p95", &|a| {
            ms(super::replicas::ttft_p95_s(&a.report.records))
        }),
    ];
    format!(
        "approximate vs precise prefix index under cache pressure (native gateway, {} Envoy \
         worker(s))\nsimulated pool: 4 replicas x {KV_TOKENS_PER_REPLICA} tokens KV, time scale \
         {}; workload: {} conversations x {} turns, ~{}-token system prompts, concurrency \
         {CONCURRENCY} (working set about twice the pool's KV)\n\n{}\nverdict: precise beats \
         approx on the engine's hit ratio and TTFT p50 -> {}\n",
        opts.workers,
        opts.time_scale,
        w.conversations,
        w.turns,
        w.system_tokens,
        table(&header, &rows),
        if ok { "PASS" } else { "FAIL" }
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn options_and_configs() {
        assert_eq!(
            PressureOptions::parse(&[]).unwrap(),
            PressureOptions::default()
        );
        let o =
            PressureOptions::parse(&["--quick".into(), "--workers".into(), "4".into()]).unwrap();
        assert_eq!((o.quick, o.workers), (true, 4));
        assert!(PressureOptions::parse(&["--what".into()]).is_err());
        // Only the producer differs between the arms.
        let a = epp_config(Index::Approximate.producer());
        let p = epp_config(Index::Precise.producer());
        assert_eq!(a, infergate_filters::picker::config::default_epp_config());
        assert_eq!(p["plugins"][0]["type"], "precise-prefix-cache-producer");
        let rest = |v: &Value| v["plugins"].as_array().unwrap()[1..].to_vec();
        assert_eq!(rest(&a), rest(&p));
        assert!(scheduler_core::scheduling::Scheduler::from_value(p).is_ok());
        assert_eq!(sim_config(2.0).kv_events_port_offset, Some(EVENTS_OFFSET));
    }
}
