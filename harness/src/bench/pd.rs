//! `cargo xtask bench pd`: prefill/decode disaggregation against aggregated serving on a
//! long-prompt workload, through a real Envoy.
//!
//! One simulated pool of [`REPLICAS`] replicas (the default engine: 16k tokens/s of
//! prefill, 6 ms + 0.08 ms per sequence per decode step) serves conversations with a
//! 6,000-token system prompt of their own, 64-token questions and 256-token answers, two
//! turns each, [`CONCURRENCY`] in flight (`--clients N`). The same workload (distinct text per arm, so no
//! arm warms another's cache) goes through the gateway picker twice per flavour:
//!
//! - **no PD**: the default scheduling over every replica (each prefills and decodes);
//! - **PD**: `disagg-profile-handler` with `prefix-based-pd-decider` (`nonCachedTokens`
//!   [`NON_CACHED_TOKENS`]), the first `--prefill N` replicas (default 1) of role `prefill`,
//!   the others `decode`: a first turn is prefilled on a prefill replica and its KV moved
//!   (the simulator's transfer model: 1 ms + 5 ms per 1k tokens), a second turn, cached on
//!   its decode replica, is decoded there alone.
//!
//! Reported per arm: TTFT p50/p90/p99 and mean, end-to-end p50, output tokens/s and
//! requests/s, and the share of requests prefilled remotely (the prefill replicas'
//! finished requests over the arm: in the PD arm they serve nothing else).

use std::fmt::Write;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::calibration::{stack_options, start_serving, CalibrationArgs};
use super::cli::{parse_flags, positive};
use super::report;
use crate::launch::{Flavor, GatewaySettings, PluginConfigs, PoolSpec, Stack};
use crate::load::runner::run_target;
use crate::load::{Assign, Connections, LoadConfig, Target, TargetReport, Workload};
use crate::sim::{self, SimConfig, SimHandle};

/// Replicas of the pool (both arms use all of them).
pub const REPLICAS: u32 = 4;
/// Prefill replicas of the PD arm unless `--prefill` says otherwise.
pub const PREFILL_REPLICAS: u32 = 1;
/// The decider's threshold: prompts with at least this many uncached tokens on their
/// decode pick are prefilled elsewhere.
pub const NON_CACHED_TOKENS: u64 = 1024;
/// Requests in flight at most unless `--clients` says otherwise.
pub const CONCURRENCY: u32 = 8;
/// The base model of the pool.
pub const BASE_MODEL: &str = crate::launch::DEFAULT_MODEL;

/// The simulated pool.
pub fn sim_config(time_scale: f64) -> SimConfig {
    SimConfig {
        replicas: REPLICAS,
        models: vec![BASE_MODEL.into()],
        time_scale,
        ..SimConfig::default()
    }
}

/// The long-prompt workload: 6,000-token system prompts (one per conversation), 64-token
/// questions, 256-token answers, 2 turns; `quick`: 16 conversations, else 64.
pub fn workload(quick: bool) -> Workload {
    Workload {
        model: BASE_MODEL.into(),
        conversations: if quick { 16 } else { 64 },
        turns: 2,
        system_tokens: 6000,
        user_tokens: 64,
        max_tokens: 256,
        ignore_eos: true,
        ..Workload::default()
    }
}

/// The PD arm's scheduling: decode by prefix affinity and load, prefill by queue and load.
pub fn pd_epp_config() -> Value {
    json!({
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "prefix-based-pd-decider",
             "parameters": {"nonCachedTokens": NON_CACHED_TOKENS}},
            {"type": "disagg-profile-handler",
             "parameters": {"deciders": {"prefill": "prefix-based-pd-decider"}}},
            {"type": "prefix-cache-scorer"},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "inflight-load-scorer"},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [
            {"name": "decode", "plugins": [
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "kv-cache-utilization-scorer"},
                {"pluginRef": "inflight-load-scorer"},
                {"pluginRef": "max-score-picker"}]},
            {"name": "prefill", "plugins": [
                {"pluginRef": "queue-scorer"},
                {"pluginRef": "inflight-load-scorer"},
                {"pluginRef": "max-score-picker"}]}
        ]
    })
}

/// `endpointRoles` of the PD arm: the first `prefill` replicas prefill, the rest decode.
pub fn roles(addrs: &[std::net::SocketAddr], prefill: u32) -> Value {
    let mut roles = serde_json::Map::new();
    for (i, a) in addrs.iter().enumerate() {
        let role = if (i as u64) < u64::from(prefill) {
            "prefill"
        } else {
            "decode"
        };
        roles.insert(a.to_string(), Value::from(role));
    }
    Value::Object(roles)
}

/// One arm's outcome.
#[derive(Debug)]
pub struct Arm {
    /// Column label.
    pub label: String,
    /// The load generator's report.
    pub report: TargetReport,
    /// Requests prefilled on a prefill replica (0 in an aggregated arm).
    pub remote_prefills: u64,
}

/// Finished requests of the first `n` replicas.
async fn finished(sim: &SimHandle, n: u32) -> Result<u64> {
    let mut total = 0;
    for k in 0..n as usize {
        total += sim.stats(k).await?.counters.finished;
    }
    Ok(total)
}

/// Starts `flavor` over `sim`: with `pd`, the PD scheduling and roles (`prefill` prefill
/// replicas); else the default scheduling. Waits until the picker answers.
pub async fn start_stack(
    sim: &SimHandle,
    flavor: Flavor,
    workers: u32,
    pd: Option<u32>,
) -> Result<Stack> {
    let addrs = sim.addrs().to_vec();
    let mut so = stack_options(sim, flavor, workers);
    let spec = PoolSpec {
        picker_config: if pd.is_some() {
            pd_epp_config()
        } else {
            Value::Null
        },
        ..PoolSpec::all(BASE_MODEL)
    };
    if let Some(prefill) = pd {
        let pool = spec.resolve(&addrs)?;
        let mut plugins = PluginConfigs::for_pools(&[pool], &GatewaySettings::default());
        let Some(entry) = plugins.picker["pools"]
            .as_array_mut()
            .and_then(|pools| pools.first_mut())
        else {
            bail!("the generated picker config has no pool");
        };
        entry["endpointRoles"] = roles(&addrs, prefill);
        so.plugins = Some(plugins);
    }
    so.pools = vec![spec];
    let (stack, _) = start_serving(so, &format!("the {flavor} stack"), BASE_MODEL, 1).await?;
    Ok(stack)
}

/// Runs the workload through `stack`'s picker (`salt` varies the text), counting the
/// first `prefill` replicas' finished requests as remote prefills when `pd`.
async fn run_arm(
    sim: &SimHandle,
    stack: &Stack,
    label: String,
    workload: &Workload,
    salt: u64,
    pd: Option<u32>,
    clients: u32,
) -> Result<Arm> {
    let cfg = LoadConfig {
        workload: workload.clone(),
        concurrency: clients,
        progress: true,
        ..LoadConfig::default()
    };
    let target = Target {
        label: label.clone(),
        urls: vec![stack.picker_url()],
        assign: Assign::Random,
        connections: Connections::KeepAlive,
    };
    let prefill = pd.unwrap_or(0);
    let before = finished(sim, prefill).await?;
    let report = run_target(&cfg, &target, salt).await?;
    let remote_prefills = finished(sim, prefill).await? - before;
    Ok(Arm {
        label,
        report,
        remote_prefills,
    })
}

/// Options of `bench pd`: the calibration commands' flags (`--quick`, `--time-scale`,
/// `--flavor`, `--workers`), `--prefill N` and `--clients N`.
#[derive(Clone, Debug, PartialEq)]
pub struct PdOptions {
    /// The shared flags.
    pub args: CalibrationArgs,
    /// Prefill replicas of the PD arm (1..REPLICAS-1).
    pub prefill: u32,
    /// Requests in flight at most.
    pub clients: u32,
}

/// `bench pd`'s flags: the Wasm flavour and one Envoy worker by default.
#[derive(clap::Args, Clone, Debug, PartialEq)]
#[command(mut_arg("quick", |a| a.help("16 conversations instead of 64")))]
pub struct PdFlags {
    /// The shared flags.
    #[command(flatten)]
    pub args: CalibrationArgs,
    /// Prefill replicas of the PD arm, 1..=3 (the others decode).
    #[arg(long, value_name = "N", default_value_t = PREFILL_REPLICAS, value_parser = prefill)]
    pub prefill: u32,
    /// Requests in flight at most.
    #[arg(long, value_name = "N", default_value_t = CONCURRENCY, value_parser = positive::<u32>)]
    pub clients: u32,
}

/// `--prefill`: 1..REPLICAS.
fn prefill(s: &str) -> Result<u32> {
    let n: u32 = s.trim().parse()?;
    if n == 0 || n >= REPLICAS {
        bail!("must be in 1..={}", REPLICAS - 1);
    }
    Ok(n)
}

impl PdFlags {
    /// The run these flags ask for.
    pub fn options(self) -> PdOptions {
        PdOptions {
            args: self.args,
            prefill: self.prefill,
            clients: self.clients,
        }
    }
}

impl PdOptions {
    /// Parses the flags; the Wasm flavour and one Envoy worker by default.
    pub fn parse(args: &[String]) -> Result<Self> {
        Ok(parse_flags::<PdFlags>(args)?.options())
    }
}

/// For every flavour: no PD, then PD, on one simulated pool; the report and the criteria
/// it misses ([`misses`]).
pub async fn run(o: &PdOptions) -> Result<(String, Vec<String>)> {
    let sim = sim::start(sim_config(o.args.time_scale))
        .await
        .context("starting the simulator")?;
    let result = run_on(&sim, o).await;
    sim.shutdown().await;
    result
}

async fn run_on(sim: &SimHandle, o: &PdOptions) -> Result<(String, Vec<String>)> {
    let a = &o.args;
    let w = workload(a.quick);
    let workers = a.concurrencies.first().copied().unwrap_or(1);
    let mut arms = Vec::new();
    let mut salt = 1;
    for flavor in &a.flavors {
        for pd in [None, Some(o.prefill)] {
            let stack = start_stack(sim, *flavor, workers, pd).await?;
            let label = match pd {
                None => format!("no PD ({flavor})"),
                Some(p) => format!("PD {p}P:{}D ({flavor})", REPLICAS - p),
            };
            arms.push(run_arm(sim, &stack, label, &w, salt, pd, o.clients).await?);
            salt += 1;
        }
    }
    Ok((table(&w, o, &arms), misses(&arms)))
}

/// What a run must show: no failed request in any arm, no remote prefill without
/// disaggregation, and some with it (the workload's first turns are long and uncached).
pub fn misses(arms: &[Arm]) -> Vec<String> {
    let mut missed = Vec::new();
    for arm in arms {
        let s = &arm.report.summary;
        if s.ok != s.requests {
            missed.push(format!(
                "{}: {} failed requests",
                arm.label,
                s.requests - s.ok
            ));
        }
        let disaggregated = arm.label.starts_with("PD ");
        if disaggregated && arm.remote_prefills == 0 {
            missed.push(format!("{}: nothing was prefilled remotely", arm.label));
        }
        if !disaggregated && arm.remote_prefills > 0 {
            missed.push(format!(
                "{}: {} remote prefills without disaggregation",
                arm.label, arm.remote_prefills
            ));
        }
    }
    missed
}

/// The report: one column per arm.
pub fn table(w: &Workload, o: &PdOptions, arms: &[Arm]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "PD vs no PD: {REPLICAS} replicas, {} conversations x {} turns of a {}-token system \
         prompt + {}-token questions, {}-token answers, concurrency {}, time scale \
         {}, Envoy --concurrency {}; PD: nonCachedTokens {NON_CACHED_TOKENS}, KV transfer \
         1 ms + 5 ms per 1k tokens (simulated)\n",
        w.conversations,
        w.turns,
        w.system_tokens,
        w.user_tokens,
        w.max_tokens,
        o.clients,
        o.args.time_scale,
        o.args.concurrencies.first().copied().unwrap_or(1)
    );
    let mut header = vec![String::new()];
    header.extend(arms.iter().map(|arm| arm.label.clone()));
    let ms = |s: f64| format!("{:.0} ms", s * 1000.0);
    let row = |name: &str, f: &dyn Fn(&Arm) -> String| -> (String, Vec<String>) {
        (name.to_owned(), arms.iter().map(f).collect())
    };
    let rows = vec![
        row("requests (failed)", &|x| {
            let s = &x.report.summary;
            format!("{} ({})", s.requests, s.requests - s.ok)
        }),
        row("prefilled remotely", &|x| {
            let n = x.report.summary.requests.max(1) as f64;
            format!(
                "{} ({:.0}%)",
                x.remote_prefills,
                x.remote_prefills as f64 * 100.0 / n
            )
        }),
        row("TTFT p50", &|x| ms(x.report.summary.ttft_p50_s)),
        row("TTFT p90", &|x| ms(x.report.summary.ttft_p90_s)),
        row("TTFT p99", &|x| ms(x.report.summary.ttft_p99_s)),
        row("TTFT mean", &|x| ms(x.report.summary.ttft_mean_s)),
        row("end-to-end p50", &|x| ms(x.report.summary.e2e_p50_s)),
        row("output tokens/s", &|x| {
            format!("{:.0}", x.report.summary.output_tokens_per_s)
        }),
        row("requests/s", &|x| {
            format!("{:.2}", x.report.summary.requests_per_s)
        }),
    ];
    out.push_str(&report::table(&header, &rows));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_pd_config_compiles_and_the_roles_split_the_pool() {
        let s = scheduler_core::scheduling::Scheduler::from_value(pd_epp_config()).unwrap();
        assert!(s.disaggregates());
        let addrs: Vec<std::net::SocketAddr> = (0..4)
            .map(|i| format!("127.0.0.1:{}", 9000 + i).parse().unwrap())
            .collect();
        let r = roles(&addrs, 1);
        assert_eq!(r["127.0.0.1:9000"], "prefill");
        assert_eq!(r["127.0.0.1:9003"], "decode");
        assert_eq!(workload(true).conversations * workload(true).turns, 32);
        let o = PdOptions::parse(&["--prefill".into(), "2".into(), "--quick".into()]).unwrap();
        assert_eq!((o.prefill, o.clients), (2, CONCURRENCY));
        assert!(o.args.quick);
        assert!(PdOptions::parse(&["--prefill".into(), "4".into()]).is_err());
    }
}
