//! `cargo xtask bench replicas`: the calibration workload through 1, 2 and 4 gateway
//! replicas, each flavour, and what prefix affinity is left when a conversation's turns are
//! spread over several Envoy processes that each keep their own picker state.
//!
//! An arm is one [`Fleet`] of N gateways (each Envoy with `--workers` worker threads) over
//! a fresh calibration pool (4 simulated replicas × 160k tokens of KV), and the load
//! generator in front of them as an L4 balancer ([`Target::balanced`]: every turn on a new
//! connection to a gateway drawn at random, seeded). A turn finds its prefix cached only
//! if the gateway it lands on sends it where the conversation's earlier turns went: the
//! gateway of the turn before knows where that was (its prefix index); a gateway that
//! served an earlier turn knows where a shorter prefix went; one new to the conversation
//! places the turn by load and KV usage alone, and finds the conversation's cache only by
//! chance. The report is each arm's hit ratio (Σ cached ÷ Σ prompt, all turns and turns
//! 2+), TTFT p50 / p95 and failed requests, each against the flavour's 1-gateway arm as a
//! ratio, with the share of turns 2+ that landed on the previous turn's gateway, on
//! another gateway that had served an earlier turn of the conversation, or on one new to
//! it, and the hit ratio of each group.
//!
//! What makes the gateways agree is the default config's `rendezvous-placement-scorer`: a
//! conversation no gateway's index knows is placed by its first blocks, the same on every
//! gateway, so a gateway new to a conversation sends its turn where the first turn went.
//! The verdict ([`verdicts`]) holds every N-gateway arm to the flavour's 1-gateway figures:
//! cache-hit ratio of turns 2+ at least [`MIN_HIT_RATIO`] of it, TTFT p50 at most
//! [`MAX_TTFT_P50`] of it.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};

use super::calibration::{self, stack_options, wait_for_picker, DEFAULT_TIME_SCALE};
use super::cli::{flavor_or_both, flavors, parse_flags, positive, time_scale, workers, FlavorArg};
use super::report::table;
use crate::launch::{Flavor, Fleet, Membership, PoolSpec, DEFAULT_MODEL};
use crate::load::runner::run_target;
use crate::load::summary::percentile;
use crate::load::{LoadConfig, RequestRecord, Summary, Target, TargetReport, Workload};
use crate::sim::{self, SimHandle};

/// The gateway counts compared by default.
pub const DEFAULT_GATEWAYS: [usize; 3] = [1, 2, 4];

/// An N-gateway arm's turns 2+ cache-hit ratio must reach this share of the 1-gateway arm's.
pub const MIN_HIT_RATIO: f64 = 0.95;

/// An N-gateway arm's TTFT p50 may reach at most this multiple of the 1-gateway arm's.
pub const MAX_TTFT_P50: f64 = 1.15;

/// Requests in flight: the calibration's.
const CONCURRENCY: u32 = 16;

/// The options of `bench replicas`.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicasOptions {
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// 3 turns per conversation instead of 6.
    pub quick: bool,
    /// The workload.
    pub workload: calibration::Shape,
    /// Gateway flavours, one arm per flavour × gateway count.
    pub flavors: Vec<Flavor>,
    /// Gateway counts.
    pub gateways: Vec<usize>,
    /// Envoy worker threads of every gateway.
    pub workers: u32,
    /// Where the gateways' pool clusters take their members from: EDS (the default; every
    /// gateway reads the same files, as in production) or STATIC lists.
    pub membership: Membership,
}

impl Default for ReplicasOptions {
    fn default() -> Self {
        ReplicasOptions {
            time_scale: DEFAULT_TIME_SCALE,
            quick: false,
            workload: calibration::Shape::Calibration,
            flavors: vec![Flavor::Wasm, Flavor::Native],
            gateways: DEFAULT_GATEWAYS.to_vec(),
            workers: 1,
            membership: Membership::Eds,
        }
    }
}

/// `bench replicas`'s flags.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct ReplicasFlags {
    /// Simulated seconds per real second.
    #[arg(long, value_name = "S", default_value_t = DEFAULT_TIME_SCALE, value_parser = time_scale)]
    pub time_scale: f64,
    /// 3 turns per conversation instead of 6.
    #[arg(long)]
    pub quick: bool,
    /// The workload.
    #[command(flatten)]
    pub workload: super::cli::WorkloadFlag,
    /// Gateway flavours, one arm per flavour x gateway count, comma-separated: wasm,
    /// native or both [default: both].
    #[arg(
        verbatim_doc_comment,
        long,
        aliases = ["flavour", "flavors"],
        value_name = "FLAVOR",
        value_delimiter = ',',
        value_parser = flavor_or_both
    )]
    pub flavor: Vec<FlavorArg>,
    /// Gateway counts, comma-separated.
    #[arg(
        long,
        value_name = "N,..",
        value_delimiter = ',',
        value_parser = positive::<usize>,
        default_value = "1,2,4"
    )]
    pub gateways: Vec<usize>,
    /// Envoy worker threads of every gateway.
    #[arg(long, visible_alias = "concurrency", value_name = "N", default_value_t = 1, value_parser = workers)]
    pub workers: u32,
    /// Where the gateways' pool clusters take their members from: eds (every gateway
    /// reads the same files, as in production) or static lists.
    #[arg(verbatim_doc_comment, long, value_name = "eds|static", default_value = "eds", value_parser = membership)]
    pub membership: Membership,
}

/// `--membership eds|static`.
fn membership(s: &str) -> Result<Membership> {
    match s.trim() {
        "eds" => Ok(Membership::Eds),
        "static" => Ok(Membership::Static),
        m => bail!("`{m}` is neither eds nor static"),
    }
}

impl ReplicasFlags {
    /// The run these flags ask for.
    pub fn options(self) -> ReplicasOptions {
        let d = ReplicasOptions::default();
        ReplicasOptions {
            time_scale: self.time_scale,
            quick: self.quick,
            workload: self.workload.workload,
            flavors: flavors(&self.flavor, &d.flavors),
            gateways: self.gateways,
            workers: self.workers,
            membership: self.membership,
        }
    }
}

impl ReplicasOptions {
    /// Parses `--flavor wasm|native|both` (or a list), `--gateways 1,2,4`, `--workers N`,
    /// `--membership eds|static`, `--time-scale S` and `--quick`.
    pub fn parse(args: &[String]) -> Result<Self> {
        Ok(parse_flags::<ReplicasFlags>(args)?.options())
    }
}

/// One arm's results.
#[derive(Debug)]
pub struct Arm {
    /// The gateways' flavour.
    pub flavor: Flavor,
    /// How many gateways the turns were spread over.
    pub gateways: usize,
    /// Every request of the workload.
    pub report: TargetReport,
    /// Requests each gateway's picker picked for during the run (Envoy's
    /// `infergate.picker.picks`, gateway 0 first).
    pub picks_per_gateway: Vec<i64>,
    /// Client connections each gateway's listener accepted during the run (gateway 0
    /// first): one per request, when every turn came on a connection of its own.
    pub connections_per_gateway: Vec<i64>,
}

impl Arm {
    /// The figures of turns 2 and later.
    pub fn later(&self) -> Summary {
        calibration::later_turns(&self.report.summary.label, &self.report.records)
    }

    /// TTFT p95 of the successful requests, seconds.
    pub fn ttft_p95_s(&self) -> f64 {
        ttft_p95_s(&self.report.records)
    }

    /// Failed requests.
    pub fn failed(&self) -> u64 {
        self.report.summary.errors.values().sum()
    }

    /// Turns 2+ split by the gateway they went to: their conversation's previous turn's, one
    /// that served an earlier turn of it, or one that served none.
    pub fn by_previous_gateway(&self) -> Followed {
        followed(&self.report.records)
    }
}

/// TTFT p95 of the successful requests of `records`, seconds.
pub fn ttft_p95_s(records: &[RequestRecord]) -> f64 {
    let mut ttft: Vec<f64> = records
        .iter()
        .filter(|r| r.ok())
        .filter_map(|r| r.ttft_s)
        .collect();
    ttft.sort_by(f64::total_cmp);
    percentile(&ttft, 95.0)
}

/// Turns 2+ by where they went relative to the turns before them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Followed {
    /// Turns sent to the gateway of the conversation's previous turn.
    pub same: Tally,
    /// Turns sent to another gateway that served an earlier turn of the conversation (its
    /// prefix index knows where a shorter prefix of the conversation went).
    pub earlier: Tally,
    /// Turns sent to a gateway that served no earlier turn of the conversation.
    pub unseen: Tally,
}

impl Followed {
    /// Every turn not sent to the previous turn's gateway.
    pub fn other(&self) -> Tally {
        Tally {
            requests: self.earlier.requests + self.unseen.requests,
            prompt: self.earlier.prompt + self.unseen.prompt,
            cached: self.earlier.cached + self.unseen.cached,
        }
    }

    /// Every turn 2+.
    pub fn requests(&self) -> u64 {
        self.same.requests + self.earlier.requests + self.unseen.requests
    }
}

/// Requests and their prompt and cached tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests.
    pub requests: u64,
    /// Σ prompt tokens.
    pub prompt: u64,
    /// Σ cached prompt tokens.
    pub cached: u64,
}

impl Tally {
    fn add(&mut self, r: &RequestRecord) {
        self.requests += 1;
        self.prompt += r.prompt_tokens;
        self.cached += r.cached_tokens;
    }

    /// Σ cached ÷ Σ prompt (0 with no prompt token).
    pub fn hit_ratio(&self) -> f64 {
        if self.prompt == 0 {
            0.0
        } else {
            self.cached as f64 / self.prompt as f64
        }
    }
}

/// Splits turns 2+ of `records` by whether each went to the base URL its conversation's
/// previous turn went to, to one an earlier turn went to, or to neither.
pub fn followed(records: &[RequestRecord]) -> Followed {
    let mut by_turn: BTreeMap<(u32, u32), &RequestRecord> = BTreeMap::new();
    for r in records {
        by_turn.insert((r.conversation, r.turn), r);
    }
    let mut out = Followed::default();
    for (&(conversation, turn), r) in &by_turn {
        let Some(previous) = turn
            .checked_sub(1)
            .and_then(|t| by_turn.get(&(conversation, t)))
        else {
            continue;
        };
        let seen = (0..turn).any(|t| {
            by_turn
                .get(&(conversation, t))
                .is_some_and(|e| e.url == r.url)
        });
        if previous.url == r.url {
            out.same.add(r);
        } else if seen {
            out.earlier.add(r);
        } else {
            out.unseen.add(r);
        }
    }
    out
}

/// Each gateway's `infergate.picker.picks` and the connections its gateway listener
/// accepted, in gateway order.
async fn counters(fleet: &Fleet) -> Result<Vec<(i64, i64)>> {
    let mut out = Vec::with_capacity(fleet.len());
    for (k, g) in fleet.gateways().iter().enumerate() {
        let stats = g
            .envoy()
            .stats()
            .await
            .with_context(|| format!("reading gateway {k}'s stats"))?;
        // `listener.<ip>_<port>.downstream_cx_total`: the listener on its loopback port
        // (not the admin listener, nor the per-worker copies).
        let connections = stats
            .iter()
            .filter(|(name, _)| {
                name.starts_with("listener.127.0.0.1_")
                    && name.ends_with(".downstream_cx_total")
                    && !name.contains(".worker_")
            })
            .map(|(_, v)| v)
            .sum();
        out.push((stats.sum_containing("infergate.picker.picks"), connections));
    }
    Ok(out)
}

/// The gateways of one arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArmSpec {
    /// Their flavour.
    pub flavor: Flavor,
    /// How many.
    pub gateways: usize,
    /// Envoy worker threads of each.
    pub workers: u32,
    /// Where their pool clusters take their members from.
    pub membership: Membership,
}

/// Runs `workload` (text salted by `salt`) through the gateways `spec` describes over
/// `sim`'s replicas, each turn on a new connection to a gateway drawn at random.
pub async fn run_arm(
    sim: &SimHandle,
    spec: ArmSpec,
    workload: &Workload,
    salt: u64,
) -> Result<Arm> {
    let ArmSpec {
        flavor,
        gateways,
        workers,
        membership,
    } = spec;
    let mut so = stack_options(sim, flavor, workers);
    so.membership = membership;
    so.pools = vec![PoolSpec::all(DEFAULT_MODEL)];
    let fleet = Fleet::start(so, gateways)
        .await
        .with_context(|| format!("starting {gateways} {flavor} gateway(s)"))?;
    // Each probe is a new connection, so with several workers each is likely answered.
    let probes = (2 * workers).max(4);
    for g in fleet.gateways() {
        wait_for_picker(g, DEFAULT_MODEL, probes).await?;
    }
    let before = counters(&fleet).await?;
    let label = format!("{flavor} x{gateways} gw");
    let target = Target::balanced(label.clone(), fleet.picker_urls());
    let cfg = LoadConfig {
        workload: workload.clone(),
        concurrency: CONCURRENCY,
        progress: true,
        ..LoadConfig::default()
    };
    let report = run_target(&cfg, &target, salt).await?;
    let after = counters(&fleet).await?;
    if !report.summary.errors.is_empty() {
        for (k, g) in fleet.gateways().iter().enumerate() {
            eprintln!("{label}: gateway {k} log tail:\n{}", g.envoy().log_tail(10));
        }
    }
    drop(fleet);
    Ok(Arm {
        flavor,
        gateways,
        report,
        picks_per_gateway: after.iter().zip(&before).map(|(a, b)| a.0 - b.0).collect(),
        connections_per_gateway: after.iter().zip(&before).map(|(a, b)| a.1 - b.1).collect(),
    })
}

/// Every arm of `opts` in order (flavour by flavour, gateway counts in the order given),
/// each on a fresh calibration pool, so no arm starts with another's cache.
pub async fn run_arms(opts: &ReplicasOptions) -> Result<Vec<Arm>> {
    let workload = opts.workload.workload(opts.quick);
    let mut arms = Vec::new();
    let mut salt = 0;
    for &flavor in &opts.flavors {
        for &n in &opts.gateways {
            salt += 1;
            let sim = sim::start(calibration::sim_config(opts.time_scale))
                .await
                .context("starting the simulator")?;
            let spec = ArmSpec {
                flavor,
                gateways: n,
                workers: opts.workers,
                membership: opts.membership,
            };
            let arm = run_arm(&sim, spec, &workload, salt).await;
            sim.shutdown().await;
            arms.push(arm?);
        }
    }
    Ok(arms)
}

/// Runs every arm and renders the report; the flag says whether every verdict passed.
pub async fn run(opts: &ReplicasOptions) -> Result<(String, bool)> {
    let arms = run_arms(opts).await?;
    let ok = verdicts(&arms).iter().all(Verdict::passed);
    Ok((report(opts, &arms), ok))
}

/// One N-gateway arm against its flavour's 1-gateway arm.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// `wasm x2`, ...
    pub arm: String,
    /// Turns 2+ cache-hit ratio ÷ the 1-gateway arm's.
    pub hit_ratio: f64,
    /// TTFT p50 ÷ the 1-gateway arm's.
    pub ttft_p50: f64,
    /// No request failed.
    pub no_failures: bool,
}

impl Verdict {
    /// Whether the arm meets [`MIN_HIT_RATIO`], [`MAX_TTFT_P50`] and fails nothing.
    pub fn passed(&self) -> bool {
        self.hit_ratio >= MIN_HIT_RATIO && self.ttft_p50 <= MAX_TTFT_P50 && self.no_failures
    }

    /// One line: the two ratios against their bounds, and pass or fail.
    pub fn line(&self) -> String {
        format!(
            "{}: turns 2+ hit ratio {:.3}x of 1 gateway (>= {MIN_HIT_RATIO}), TTFT p50 {:.3}x \
             (<= {MAX_TTFT_P50}){} -> {}",
            self.arm,
            self.hit_ratio,
            self.ttft_p50,
            if self.no_failures {
                ""
            } else {
                ", failed requests"
            },
            if self.passed() { "PASS" } else { "FAIL" }
        )
    }
}

/// Every N-gateway arm (N > 1) whose flavour has a 1-gateway arm, against it.
pub fn verdicts(arms: &[Arm]) -> Vec<Verdict> {
    let ratio = |v: f64, b: f64| if b > 0.0 { v / b } else { f64::INFINITY };
    arms.iter()
        .filter(|a| a.gateways > 1)
        .filter_map(|a| {
            let base = arms
                .iter()
                .find(|b| b.flavor == a.flavor && b.gateways == 1)?;
            Some(Verdict {
                arm: format!("{} x{}", a.flavor, a.gateways),
                hit_ratio: ratio(a.later().cache_hit_ratio, base.later().cache_hit_ratio),
                ttft_p50: ratio(a.report.summary.ttft_p50_s, base.report.summary.ttft_p50_s),
                no_failures: a.failed() == 0,
            })
        })
        .collect()
}

/// The report: a title block, [`arms_table`] and the [`verdicts`].
pub fn report(opts: &ReplicasOptions, arms: &[Arm]) -> String {
    let verdict: String = verdicts(arms)
        .iter()
        .map(|v| format!("{}\n", v.line()))
        .collect();
    format!(
        "prefix affinity across gateway replicas (each its own Envoy process and picker \
         state)\nsimulated pool: 4 replicas x 160k tokens KV, 16k tokens/s prefill, time \
         scale {} (times below are wall-clock); workload: {}, concurrency {CONCURRENCY}; \
         Envoy workers per gateway: {}; pool membership: {}; each turn on a new connection \
         to a gateway drawn at random (an L4 balancer)\n\n{}\n{verdict}",
        opts.time_scale,
        opts.workload.describe(opts.quick),
        opts.workers,
        match opts.membership {
            Membership::Eds => "EDS, one set of files for every gateway",
            Membership::Static => "STATIC lists",
        },
        arms_table(arms)
    )
}

/// `value ÷ base` as `0.00x`, or `-` without a base.
fn ratio(value: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 => format!("{:.2}x", value / b),
        _ => "-".into(),
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn ms(s: f64) -> String {
    format!("{:.1} ms", s * 1000.0)
}

/// A figure of the table: its row label, how to read it from an arm, how to print it.
type Figure = (&'static str, fn(&Arm) -> f64, fn(f64) -> String);

/// A group of turns 2+ in the table: its row label, and how to take it from a [`Followed`].
type Group = (&'static str, fn(&Followed) -> Tally);

/// One column per arm; each ratio row divides by the same flavour's 1-gateway arm.
pub fn arms_table(arms: &[Arm]) -> String {
    let mut header = vec!["gateways".to_string()];
    header.extend(arms.iter().map(|a| format!("{} x{}", a.flavor, a.gateways)));
    let base = |a: &Arm| {
        arms.iter()
            .find(|b| b.flavor == a.flavor && b.gateways == 1)
    };
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut push = |label: &str, cell: &dyn Fn(&Arm) -> String| {
        rows.push((label.to_string(), arms.iter().map(cell).collect()));
    };
    let figures: [Figure; 4] = [
        (
            "cache-hit ratio (all turns)",
            |a| a.report.summary.cache_hit_ratio,
            pct,
        ),
        (
            "cache-hit ratio, turns 2+",
            |a| a.later().cache_hit_ratio,
            pct,
        ),
        ("TTFT p50", |a| a.report.summary.ttft_p50_s, ms),
        ("TTFT p95", Arm::ttft_p95_s, ms),
    ];
    push("requests", &|a| a.report.summary.requests.to_string());
    push("failed", &|a| a.failed().to_string());
    for (label, f, fmt) in figures {
        push(label, &|a| fmt(f(a)));
        push("  vs 1 gateway", &|a| ratio(f(a), base(a).map(f)));
    }
    let groups: [Group; 3] = [
        ("turns 2+ on the previous turn's gateway", |f| f.same),
        ("turns 2+ on an earlier turn's gateway", |f| f.earlier),
        ("turns 2+ on a gateway new to them", |f| f.unseen),
    ];
    for (label, group) in groups {
        push(label, &|a| {
            let f = a.by_previous_gateway();
            match f.requests() {
                0 => "-".into(),
                all => pct(group(&f).requests as f64 / all as f64),
            }
        });
        push("  their cache-hit ratio", &|a| {
            let g = group(&a.by_previous_gateway());
            match g.requests {
                0 => "-".into(),
                _ => pct(g.hit_ratio()),
            }
        });
    }
    push("picks per gateway (Envoy stats)", &|a| {
        a.picks_per_gateway
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join("/")
    });
    push("connections per gateway (Envoy stats)", &|a| {
        a.connections_per_gateway
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join("/")
    });
    let mut out = table(&header, &rows);
    let errors: Vec<String> = arms
        .iter()
        .filter(|a| !a.report.summary.errors.is_empty())
        .map(|a| format!("{}: {:?}", a.report.summary.label, a.report.summary.errors))
        .collect();
    if !errors.is_empty() {
        out.push_str(&format!("failed requests: {}\n", errors.join("; ")));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_parse() {
        let o = ReplicasOptions::parse(&[]).unwrap();
        assert_eq!(o, ReplicasOptions::default());
        assert_eq!(o.gateways, [1, 2, 4]);
        assert_eq!(o.flavors, [Flavor::Wasm, Flavor::Native]);
        let o = ReplicasOptions::parse(&strings(&[
            "--flavor",
            "native",
            "--gateways",
            "1,3",
            "--workers",
            "2",
            "--quick",
            "--time-scale",
            "4",
            "--membership",
            "static",
        ]))
        .unwrap();
        assert_eq!(o.membership, Membership::Static);
        assert_eq!(o.flavors, [Flavor::Native]);
        assert_eq!(o.gateways, [1, 3]);
        assert_eq!((o.workers, o.quick, o.time_scale), (2, true, 4.0));
        let both = ReplicasOptions::parse(&strings(&["--flavor", "both"])).unwrap();
        assert_eq!(both.flavors, [Flavor::Wasm, Flavor::Native]);
        for bad in [
            &["--flavor", "plain"][..],
            &["--gateways", "0"],
            &["--gateways", ","],
            &["--gateways", "x"],
            &["--workers", "0"],
            &["--time-scale", "-1"],
            &["--membership", "dns"],
            &["--what"],
        ] {
            assert!(ReplicasOptions::parse(&strings(bad)).is_err(), "{bad:?}");
        }
    }

    fn rec(conversation: u32, turn: u32, url: &str, prompt: u64, cached: u64) -> RequestRecord {
        RequestRecord {
            conversation,
            turn,
            url: url.into(),
            status: 200,
            ttft_s: Some(0.01 * f64::from(turn + 1)),
            prompt_tokens: prompt,
            cached_tokens: cached,
            usage_seen: true,
            ..RequestRecord::default()
        }
    }

    /// A turn counts as "same" only against its own conversation's previous turn, in
    /// whatever order the records completed.
    #[test]
    fn turns_are_split_by_the_previous_turns_gateway() {
        let records = [
            rec(0, 1, "a", 100, 90),
            rec(1, 0, "b", 50, 0),
            rec(0, 0, "a", 50, 0),
            rec(1, 1, "a", 100, 10),
            rec(0, 2, "b", 200, 20),
            rec(0, 3, "a", 300, 150),
        ];
        let f = followed(&records);
        assert_eq!(
            f.earlier,
            Tally {
                requests: 1,
                prompt: 300,
                cached: 150
            }
        );
        assert_eq!(f.requests(), 4);
        assert_eq!(
            f.same,
            Tally {
                requests: 1,
                prompt: 100,
                cached: 90
            }
        );
        assert_eq!(
            f.unseen,
            Tally {
                requests: 2,
                prompt: 300,
                cached: 30
            }
        );
        assert!((f.unseen.hit_ratio() - 0.1).abs() < 1e-12);
        assert_eq!(f.other().requests, 3);
        assert_eq!(Tally::default().hit_ratio(), 0.0);
    }

    fn arm(flavor: Flavor, gateways: usize, records: Vec<RequestRecord>) -> Arm {
        let summary = Summary::from_records("x", &records, 1.0);
        Arm {
            flavor,
            gateways,
            report: TargetReport { summary, records },
            picks_per_gateway: vec![3; gateways],
            connections_per_gateway: vec![3; gateways],
        }
    }

    /// Ratios divide by the same flavour's 1-gateway arm, and are `-` without one.
    #[test]
    fn the_table_compares_each_arm_with_its_flavours_single_gateway() {
        let one = arm(
            Flavor::Wasm,
            1,
            vec![rec(0, 0, "a", 100, 0), rec(0, 1, "a", 100, 100)],
        );
        let two = arm(
            Flavor::Wasm,
            2,
            vec![rec(0, 0, "a", 100, 0), rec(0, 1, "b", 100, 50)],
        );
        let lone = arm(
            Flavor::Native,
            2,
            vec![rec(0, 0, "a", 100, 0), rec(0, 1, "a", 100, 100)],
        );
        let t = arms_table(&[one, two, lone]);
        let row = |label: &str| -> Vec<String> {
            t.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no row {label}\n{t}"))
                .trim_start_matches(label)
                .split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            row("cache-hit ratio, turns 2+"),
            ["100.0%", "50.0%", "100.0%"]
        );
        // The first "vs 1 gateway" row is the whole-run hit ratio's: 50% vs 25%.
        assert_eq!(row("  vs 1 gateway"), ["1.00x", "0.50x", "-"]);
        assert_eq!(
            row("turns 2+ on the previous turn's gateway"),
            ["100.0%", "0.0%", "100.0%"]
        );
        assert_eq!(
            row("turns 2+ on a gateway new to them"),
            ["0.0%", "100.0%", "0.0%"]
        );
        assert_eq!(row("picks per gateway (Envoy stats)"), ["3", "3/3", "3/3"]);
        assert!(t.starts_with("gateways"), "{t}");
        assert!(t.contains("wasm x2") && t.contains("native x2"), "{t}");
    }
}
