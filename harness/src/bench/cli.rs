//! The benches' and demos' command lines as clap derive structs: the flags the
//! calibration commands share ([`CalibrationArgs`]: `demo`, `bench ttft|affinity|lora|pd`),
//! `demo`'s own ([`DemoFlags`]: `--scenario` and the flags of every scenario), the value
//! parsers they all use, and [`parse_flags`], which parses a flag list the way the
//! `infergate-bench` binary does (each options type's `parse(&[String])` goes through it).
//!
//! Every command is [`lenient`]: a flag given twice keeps its last value, as the
//! hand-written parsers did; a list flag (`value_delimiter = ','`) given twice gets both
//! lists.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Command, FromArgMatches, ValueEnum};

use super::calibration::DEFAULT_TIME_SCALE;
use super::hotspot::PickerChoice;
use crate::launch::Flavor;

/// `cmd` and its subcommands with every argument overriding itself (`--rounds 3 --rounds
/// 4` is 4, `--quick --quick` is accepted: clap refuses both by default), and each flag's
/// help on the lines under it (clap does not wrap help here; the doc comments are written
/// to fit 100 columns that way).
pub fn lenient(cmd: Command) -> Command {
    cmd.args_override_self(true)
        .mut_args(|a| a.next_line_help(true))
        .mut_subcommands(lenient)
}

/// Parses `args` (flags only, no program name) as `T`'s flags, as the binary does.
pub fn parse_flags<T: Args + FromArgMatches>(args: &[String]) -> Result<T> {
    parse_flags_with(args, |cmd| cmd)
}

/// [`parse_flags`] with `tweak` applied to the command first (e.g. other defaults through
/// `mut_arg`, as a subcommand's `#[command(mut_arg(..))]` does).
pub fn parse_flags_with<T: Args + FromArgMatches>(
    args: &[String],
    tweak: impl FnOnce(Command) -> Command,
) -> Result<T> {
    let cmd = lenient(tweak(T::augment_args(
        Command::new("flags").no_binary_name(true),
    )));
    let mut matches = cmd
        .try_get_matches_from(args)
        .map_err(|e| anyhow!("{}", e.render()))?;
    T::from_arg_matches_mut(&mut matches).map_err(|e| anyhow!("{}", e.render()))
}

// ---- Value parsers ----

/// A number of at least 1.
pub fn positive<T>(s: &str) -> Result<T>
where
    T: FromStr + PartialOrd + From<u8>,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let n: T = s.trim().parse()?;
    if n < T::from(1) {
        bail!("must be at least 1");
    }
    Ok(n)
}

/// Envoy worker threads: at least one.
pub fn workers(s: &str) -> Result<u32> {
    match s.trim().parse::<u32>()? {
        0 => bail!("Envoy needs at least one worker"),
        n => Ok(n),
    }
}

/// Simulated seconds per real second: a positive number.
pub fn time_scale(s: &str) -> Result<f64> {
    let v: f64 = s.trim().parse()?;
    if v.is_nan() || v <= 0.0 {
        bail!("must be positive");
    }
    Ok(v)
}

/// A positive finite number.
pub fn positive_finite(s: &str) -> Result<f64> {
    let v: f64 = s.trim().parse()?;
    if !(v > 0.0 && v.is_finite()) {
        bail!("must be positive");
    }
    Ok(v)
}

/// Seconds (a fraction allowed), 0 or more.
pub fn seconds(s: &str) -> Result<Duration> {
    let v: f64 = s.trim().parse()?;
    Ok(Duration::try_from_secs_f64(v)?)
}

/// A gateway flavour: `wasm` or `native` (the picker needs one of them).
pub fn gateway_flavor(s: &str) -> Result<Flavor> {
    match s.trim().parse::<Flavor>()? {
        Flavor::Plain => bail!("the picker needs wasm or native, not plain"),
        f => Ok(f),
    }
}

/// One item of a `--flavor` list that takes `both`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlavorArg {
    /// `wasm` or `native`.
    One(Flavor),
    /// `both`: wasm, then native.
    Both,
}

/// `wasm`, `native` or `both`.
pub fn flavor_or_both(s: &str) -> Result<FlavorArg> {
    if s.trim() == "both" {
        return Ok(FlavorArg::Both);
    }
    gateway_flavor(s)
        .map(FlavorArg::One)
        .map_err(|_| anyhow!("expected wasm, native or both"))
}

/// The flavours a `--flavor` list names, each once, in order; `default` when it is empty
/// (the flag not given).
pub fn flavors(list: &[FlavorArg], default: &[Flavor]) -> Vec<Flavor> {
    if list.is_empty() {
        return default.to_vec();
    }
    let mut out = Vec::new();
    for item in list {
        let named: &[Flavor] = match item {
            FlavorArg::One(f) => std::slice::from_ref(f),
            FlavorArg::Both => &[Flavor::Wasm, Flavor::Native],
        };
        for f in named {
            if !out.contains(f) {
                out.push(*f);
            }
        }
    }
    out
}

// ---- The calibration commands ----

/// The flags the calibration commands share: `--time-scale S`, `--quick`, `--flavor
/// a[,b]`, `--workers a[,b]` (Envoy's `--concurrency`, which is accepted as its other
/// name). Its defaults are `demo`'s (wasm, 1 worker); a command with others sets them with
/// `#[command(mut_arg("flavors", ..))]` / `mut_arg("concurrencies", ..)`.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct CalibrationArgs {
    /// Simulated seconds per real second.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_TIME_SCALE, value_parser = time_scale)]
    pub time_scale: f64,
    /// The smaller workload: 3 turns per conversation instead of 6.
    #[arg(long)]
    pub quick: bool,
    /// The workload (only `bench ttft` and `bench affinity` choose it: [`ShapedArgs`]).
    #[arg(skip)]
    pub workload: super::calibration::Shape,
    /// The picker's `idleRule` (`demo`, `bench ttft` and `bench affinity` choose it).
    #[arg(skip)]
    pub idle_rule: IdleRuleChoice,
    /// Gateway flavours, comma-separated: wasm, native.
    #[arg(
        long = "flavor",
        aliases = ["flavour", "flavors"],
        value_name = "FLAVOR,..",
        value_delimiter = ',',
        value_parser = gateway_flavor,
        default_value = "wasm"
    )]
    pub flavors: Vec<Flavor>,
    /// Envoy worker counts, comma-separated.
    #[arg(
        long = "workers",
        visible_alias = "concurrency",
        value_name = "N,..",
        value_delimiter = ',',
        value_parser = workers,
        default_value = "1"
    )]
    pub concurrencies: Vec<u32>,
}

/// `--workload`, for the commands that choose it (`bench ttft`, `affinity`, `replicas`).
#[derive(clap::Args, Clone, Copy, Debug, PartialEq)]
pub struct WorkloadFlag {
    /// The workload: calibration (64 x 6 turns, 4k-token system prompts), seed (64 x 6,
    /// 2k), shared-prefix (16 groups x 16 one-turn prompts) [default: calibration].
    #[arg(
        verbatim_doc_comment,
        long,
        value_enum,
        default_value = "calibration",
        hide_possible_values = true,
        hide_default_value = true
    )]
    pub workload: super::calibration::Shape,
}

/// The `idleRule` of the default config's `rendezvous-placement-scorer` in a run with one
/// gateway: how it places cold prompts while the pool shows no scraped load.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum IdleRuleChoice {
    /// The built-in default, which a fleet of gateways needs to agree on a first burst.
    Shared,
    /// As one gateway per pool should be configured: a first burst spreads evenly.
    #[default]
    Sole,
}

impl IdleRuleChoice {
    /// The pool's `eppConfig`: `config` (`null`: the built-in default) with every
    /// `rendezvous-placement-scorer` given this `idleRule`. `shared` leaves it as it is.
    pub fn apply(self, config: serde_json::Value) -> serde_json::Value {
        if self == IdleRuleChoice::Shared {
            return config;
        }
        let mut config = if config.is_null() {
            infergate_filters::picker::config::default_epp_config()
        } else {
            config
        };
        let plugins = config["plugins"].as_array_mut().into_iter().flatten();
        for p in plugins.filter(|p| p["type"] == "rendezvous-placement-scorer") {
            p["parameters"]["idleRule"] = "sole".into();
        }
        config
    }

    /// How a report names it.
    pub fn describe(self) -> &'static str {
        match self {
            IdleRuleChoice::Shared => "idleRule shared (the built-in default, for fleets)",
            IdleRuleChoice::Sole => "idleRule sole (one gateway per pool)",
        }
    }
}

/// `--idle-rule`, for the commands that run one gateway over the calibration pool.
#[derive(clap::Args, Clone, Copy, Debug, PartialEq)]
pub struct IdleRuleFlag {
    /// The picker's idleRule: how cold prompts are placed while the pool shows no load
    /// (sole: evenly, as one gateway per pool is configured; shared: the built-in default,
    /// which keeps a fleet's gateways agreeing) [default: sole].
    #[arg(
        verbatim_doc_comment,
        long,
        value_enum,
        default_value = "sole",
        hide_possible_values = true,
        hide_default_value = true
    )]
    pub idle_rule: IdleRuleChoice,
}

/// `bench ttft` and `bench affinity`: the calibration flags, `--workload` and
/// `--idle-rule`.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct ShapedArgs {
    /// The shared flags.
    #[command(flatten)]
    pub args: CalibrationArgs,
    /// The workload.
    #[command(flatten)]
    pub workload: WorkloadFlag,
    /// The placement rule on an idle pool.
    #[command(flatten)]
    pub idle_rule: IdleRuleFlag,
}

impl ShapedArgs {
    /// The shared flags with the workload and the idle rule chosen.
    pub fn into_args(self) -> CalibrationArgs {
        CalibrationArgs {
            workload: self.workload.workload,
            idle_rule: self.idle_rule.idle_rule,
            ..self.args
        }
    }
}

impl CalibrationArgs {
    /// Parses `args` with `demo`'s defaults (wasm, 1 worker).
    pub fn parse(args: &[String]) -> Result<Self> {
        parse_flags(args)
    }
}

// ---- `demo` ----

/// Which scenario `demo` runs (each described in `demo --help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// The calibration workload through /rr and through the picker.
    Calibration,
    /// One replica kept full by long-context requests sent straight to it.
    Hotspot,
    /// Two tenants with token quotas share one pool; then flow control saturated.
    Tenants,
    /// A 10% FP8 canary across two pools and by a model rewrite, then rolled back.
    Canary,
}

/// `demo --help`'s text after the flags: what each scenario measures.
pub const DEMO_SCENARIOS: &str = "\
Scenarios:
  calibration  (the default) the calibration workload through /rr and through the picker:
               TTFT and cache-hit ratios side by side
  hotspot      one replica kept at >= 95% KV usage by long-context requests sent straight to
               it; the same workload through /rr and through the picker: TTFT p50/p99, new
               requests per replica (none may reach the full replica through the picker),
               TTFT on the full replica vs the others, the full replica's KV min/mean
  tenants      tenants A (premium, short chats) and B (standard, a batch of 3k-token prompts,
               a third of A's tokens per minute) share 4 replicas; the same load through the
               gateway with tenancy, then through /rr, each on fresh replicas: A's TTFT
               p50/p99, B's 429s by reason, tokens billed per tenant (with sum pre_debit -
               sum refund = sum charged) next to the tokens the replicas served; then flow
               control on a saturated pool: A (weight 3) and B (weight 1) share a band,
               best-effort C's band overflows: service share per tenant, queue time per
               priority and C's 429s per 2 s window
  canary       the seed's third week, a 10% FP8 canary, split across two pools (Envoy's
               weighted clusters: stable = replicas 0-2, canary = replica 3) and inside one
               pool (a model rewrite: `assistant` -> sim-model / sim-model-fp8), each per
               request and sticky per conversation (x-session-id), on multi-turn
               conversations; then the two-pool sticky split rolled back to 0 halfway (a
               second Envoy, the old one drained): cache-hit ratio and TTFT p50 per build,
               the canary's share of conversations and requests, switches within
               conversations; exits non-zero if a check is missed (a sticky conversation
               switching, a failed request, a request on the canary after the rollback)

Every scenario writes report.txt and report.html (SVG charts, no network needed) into
<system temp dir>/infergate-demo-<scenario>-<pid>/ and prints where.";

impl Scenario {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Calibration => "calibration",
            Scenario::Hotspot => "hotspot",
            Scenario::Tenants => "tenants",
            Scenario::Canary => "canary",
        }
    }
}

/// `demo`'s flags: `--scenario` and the flags of every scenario. The shared ones default
/// per scenario; `--picker-config` is hotspot's, `--tenants` tenants'.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct DemoFlags {
    /// Which demo
    #[arg(long, value_enum, default_value_t = Scenario::Calibration)]
    pub scenario: Scenario,
    /// The scenario's shorter form (calibration and hotspot: 3 turns per conversation
    /// instead of 6; canary: 32 conversations x 4 turns instead of 64 x 6).
    #[arg(verbatim_doc_comment, long)]
    pub quick: bool,
    /// Simulated seconds per real second [default: 2; tenants: 1].
    #[arg(long, value_name = "S", value_parser = time_scale)]
    pub time_scale: Option<f64>,
    /// The gateway's flavour, wasm or native (calibration: a comma-separated list, one
    /// picker column each) [default: wasm; tenants: native].
    #[arg(
        verbatim_doc_comment,
        long,
        aliases = ["flavour", "flavors"],
        value_name = "FLAVOR",
        value_delimiter = ',',
        value_parser = gateway_flavor
    )]
    pub flavor: Vec<Flavor>,
    /// Envoy worker threads [default: 1; hotspot and tenants: 2].
    #[arg(long, visible_alias = "concurrency", value_name = "N", value_delimiter = ',', value_parser = workers)]
    pub workers: Vec<u32>,
    /// hotspot: the picker's scheduling configuration (kv-filter: a utilization-filter at
    /// 0.9 KV ahead of the default scorers; latency: the default plus the measured-latency
    /// scorer; default: the picker's built-in config)
    /// [default: default].
    #[arg(verbatim_doc_comment, long, value_enum)]
    pub picker_config: Option<PickerChoice>,
    /// calibration: the picker's idleRule, sole or shared (see bench ttft --help)
    /// [default: sole].
    #[arg(verbatim_doc_comment, long, value_enum, hide_possible_values = true)]
    pub idle_rule: Option<IdleRuleChoice>,
    /// tenants: TenantQuota objects giving the test keys of testdata/README.md to tenant-a,
    /// tenant-b and tenant-c, a directory or a file [default: testdata/tenants/demo].
    #[arg(verbatim_doc_comment, long, value_name = "PATH")]
    pub tenants: Option<PathBuf>,
}

/// The flags a one-stack scenario (`demo --scenario hotspot|tenants|canary`) shares, with
/// its defaults filled in: one flavour, one worker count.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScenarioArgs {
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// The scenario's shorter form.
    pub quick: bool,
    /// The gateway's flavour.
    pub flavor: Flavor,
    /// Envoy worker threads.
    pub workers: u32,
}

impl DemoFlags {
    /// Parses `demo`'s flags (`args` without the command).
    pub fn parse(args: &[String]) -> Result<Self> {
        parse_flags(args)
    }

    /// `--scenario NAME` and then `args`: what a scenario's own `parse` reads.
    pub fn parse_scenario(scenario: Scenario, args: &[String]) -> Result<Self> {
        let mut all = vec!["--scenario".to_string(), scenario.name().to_string()];
        all.extend_from_slice(args);
        Self::parse(&all)
    }

    /// Refuses the flags of the scenarios other than the one running.
    fn only_own_flags(&self) -> Result<()> {
        if self.picker_config.is_some() && self.scenario != Scenario::Hotspot {
            bail!("--picker-config is a flag of --scenario hotspot");
        }
        if self.tenants.is_some() && self.scenario != Scenario::Tenants {
            bail!("--tenants is a flag of --scenario tenants");
        }
        if self.idle_rule.is_some() && self.scenario != Scenario::Calibration {
            bail!("--idle-rule is a flag of --scenario calibration");
        }
        Ok(())
    }

    /// The calibration scenario's flags (several flavours, several worker counts: the
    /// demo uses the first).
    pub fn calibration(&self, workers: u32) -> Result<CalibrationArgs> {
        self.only_own_flags()?;
        Ok(CalibrationArgs {
            time_scale: self.time_scale.unwrap_or(DEFAULT_TIME_SCALE),
            quick: self.quick,
            workload: super::calibration::Shape::Calibration,
            idle_rule: self.idle_rule.unwrap_or_default(),
            flavors: if self.flavor.is_empty() {
                vec![Flavor::Wasm]
            } else {
                self.flavor.clone()
            },
            concurrencies: if self.workers.is_empty() {
                vec![workers]
            } else {
                self.workers.clone()
            },
        })
    }

    /// A one-stack scenario's shared flags over its `defaults`: one flavour and one worker
    /// count at most.
    pub fn scenario_args(&self, defaults: ScenarioArgs) -> Result<ScenarioArgs> {
        self.only_own_flags()?;
        let scenario = self.scenario.name();
        let flavor = match self.flavor.as_slice() {
            [] => defaults.flavor,
            [one] => *one,
            _ => bail!("--flavor: --scenario {scenario} runs one flavour"),
        };
        let workers = match self.workers.as_slice() {
            [] => defaults.workers,
            [one] => *one,
            _ => bail!("--workers: --scenario {scenario} runs one worker count"),
        };
        Ok(ScenarioArgs {
            time_scale: self.time_scale.unwrap_or(defaults.time_scale),
            quick: self.quick,
            flavor,
            workers,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn idle_rule_sole_sets_the_placement_scorers_rule_and_shared_leaves_the_config() {
        use scheduler_core::scheduling::Scheduler;
        assert!(IdleRuleChoice::Shared
            .apply(serde_json::Value::Null)
            .is_null());
        let sole = IdleRuleChoice::Sole.apply(serde_json::Value::Null);
        let placement = sole["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == "rendezvous-placement-scorer")
            .unwrap();
        assert_eq!(placement["parameters"]["idleRule"], "sole");
        assert!(Scheduler::from_value(sole).is_ok());
    }

    #[test]
    fn arguments_parse() {
        let a = CalibrationArgs::parse(&[]).unwrap();
        assert_eq!(a.time_scale, DEFAULT_TIME_SCALE);
        assert_eq!(
            (a.flavors, a.concurrencies, a.quick),
            (vec![Flavor::Wasm], vec![1], false)
        );
        let a = CalibrationArgs::parse(&strings(&[
            "--flavor",
            "wasm,native",
            "--concurrency",
            "1,2,4",
            "--quick",
            "--time-scale",
            "4",
        ]))
        .unwrap();
        assert_eq!(a.flavors, vec![Flavor::Wasm, Flavor::Native]);
        assert_eq!(a.concurrencies, vec![1, 2, 4]);
        assert!(a.quick);
        assert_eq!(a.time_scale, 4.0);
        let a = CalibrationArgs::parse(&strings(&["--workers", "1,2,4,8"])).unwrap();
        assert_eq!(a.concurrencies, vec![1, 2, 4, 8]);
        let a = CalibrationArgs::parse(&strings(&["--flavors", "native", "--quick", "--quick"]))
            .unwrap();
        assert_eq!(a.flavors, vec![Flavor::Native]);
        let a =
            CalibrationArgs::parse(&strings(&["--time-scale", "3", "--time-scale", "5"])).unwrap();
        assert_eq!(a.time_scale, 5.0, "the last value wins");
        for bad in [
            &["--flavor", "plain"][..],
            &["--time-scale", "0"],
            &["--concurrency", "x"],
            &["--workers", "1,0"],
            &["--workers"],
            &["--what"],
        ] {
            assert!(CalibrationArgs::parse(&strings(bad)).is_err(), "{bad:?}");
        }
    }

    /// Another command's defaults, as `#[command(mut_arg(..))]` sets them.
    #[test]
    fn defaults_can_be_set_per_command() {
        let a: CalibrationArgs = parse_flags_with(&[], |c| {
            c.mut_arg("flavors", |a| a.default_value("wasm,native"))
                .mut_arg("concurrencies", |a| a.default_value("1,2,4,8"))
        })
        .unwrap();
        assert_eq!(a.flavors, [Flavor::Wasm, Flavor::Native]);
        assert_eq!(a.concurrencies, [1, 2, 4, 8]);
    }

    #[test]
    fn flavor_lists_take_both() {
        let parse = |s: &str| {
            s.split(',')
                .map(flavor_or_both)
                .collect::<Result<Vec<_>>>()
                .map(|l| flavors(&l, &[Flavor::Native]))
        };
        assert_eq!(parse("both").unwrap(), [Flavor::Wasm, Flavor::Native]);
        assert_eq!(
            parse("native,both").unwrap(),
            [Flavor::Native, Flavor::Wasm]
        );
        assert_eq!(parse(" wasm").unwrap(), [Flavor::Wasm]);
        assert!(parse("plain").is_err());
        assert_eq!(flavors(&[], &[Flavor::Native]), [Flavor::Native]);
    }

    #[test]
    fn demo_flags_keep_to_their_scenario() {
        let d = DemoFlags::parse(&strings(&["--quick"])).unwrap();
        assert_eq!((d.scenario, d.quick), (Scenario::Calibration, true));
        let d =
            DemoFlags::parse(&strings(&["--flavor", "native", "--scenario", "hotspot"])).unwrap();
        assert_eq!(
            (d.scenario, d.flavor.as_slice()),
            (Scenario::Hotspot, &[Flavor::Native][..])
        );
        let c = DemoFlags::parse(&strings(&["--flavor", "wasm,native", "--workers", "2"]))
            .unwrap()
            .calibration(1)
            .unwrap();
        assert_eq!((c.flavors.len(), c.concurrencies.as_slice()), (2, &[2][..]));
        let defaults = ScenarioArgs {
            time_scale: 1.0,
            quick: false,
            flavor: Flavor::Wasm,
            workers: 1,
        };
        for bad in [&["--scenario", "x"][..], &["--scenario"]] {
            assert!(DemoFlags::parse(&strings(bad)).is_err(), "{bad:?}");
        }
        let d = DemoFlags::parse(&strings(&["--picker-config", "default"])).unwrap();
        assert!(d.calibration(1).is_err(), "hotspot's flag");
        let d = DemoFlags::parse(&strings(&["--scenario", "canary", "--tenants", "t"])).unwrap();
        assert!(d.scenario_args(defaults).is_err(), "tenants' flag");
        let d = DemoFlags::parse(&strings(&[
            "--scenario",
            "canary",
            "--flavor",
            "wasm,native",
        ]))
        .unwrap();
        assert!(d.scenario_args(defaults).is_err(), "one flavour");
    }
}
