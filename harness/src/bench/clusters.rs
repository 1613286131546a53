//! `cargo xtask bench clusters`: a hotspot on one cluster, with and without spillover to a
//! peer cluster.
//!
//! Cluster A is a small pool (2 simulated replicas running 2 sequences each), cluster B a
//! larger one (6 replicas), each behind its own gateway on its own loopback address
//! ([`Clusters`]). Every request is a new conversation (one turn, a 1,000-token system
//! prompt of its own, 64 tokens out), sent to A's gateway as Poisson arrivals. Three arms,
//! each on fresh clusters:
//!
//! 1. **unsaturated**: A's offered load well within its capacity, B as A's peer;
//! 2. **hotspot, no spillover**: about twice A's capacity, A alone (no peers);
//! 3. **hotspot, spillover**: the same load, B as A's peer (Parent Mode, or Endpoint Mode
//!    with `--peer-mode endpoint`), A spilling new conversations once every replica of it
//!    has `--queue-threshold` requests waiting or runs its learned batch.
//!
//! Each arm first sends `--warmup` requests of its own at its rate, unmeasured, so A
//! has seen its replicas queue and learned their batch (see the picker's spill rule): the
//! figures are the steady state, not a cold gateway's first second.
//!
//! The report is each arm's latency through A's gateway (end to end, p50 / p99, over every
//! request a client sent A, wherever it was served), the share served in B, the p50 of the
//! requests served in each cluster (in B: one more gateway on the way) and the failed
//! requests. The verdict holds the spillover arm's p99 to [`MAX_SPILL_P99`] of the
//! unsaturated arm's, and checks that the hotspot is one: without spillover, p99 at least
//! [`MIN_HOTSPOT_P99`] of the unsaturated arm's.

use anyhow::Result;

use super::cli::{flavor_or_both, flavors, parse_flags, positive, workers, FlavorArg};
use super::report::table;
use crate::launch::clusters::{cluster_address, Clusters};
use crate::launch::{Backends, EnvoyOptions, Flavor, PoolSpec, Stack, StackOptions};
use crate::load::runner::run_target;
use crate::load::summary::percentile;
use crate::load::{LoadConfig, RequestRecord, Target, Workload};
use crate::sim::{EngineConfig, SimConfig};
use infergate_cli::config::bootstrap::{PeerMode, Peers};

/// The spillover arm's p99 may be at most this multiple of the unsaturated arm's.
pub const MAX_SPILL_P99: f64 = 1.2;
/// The no-spillover arm's p99 must be at least this multiple of the unsaturated arm's (or
/// the run made no hotspot).
pub const MIN_HOTSPOT_P99: f64 = 5.0;

/// Replicas of cluster A and of cluster B.
const REPLICAS_A: u32 = 2;
const REPLICAS_B: u32 = 6;
/// Sequences one simulated replica runs at once.
const SEQS_PER_REPLICA: u32 = 2;

/// The flags of `bench clusters`.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct ClustersFlags {
    /// Gateway flavour: wasm, native, or both (a comma-separated list).
    #[arg(
        long,
        aliases = ["flavour", "flavors"],
        value_name = "FLAVOR",
        value_delimiter = ',',
        value_parser = flavor_or_both
    )]
    pub flavor: Vec<FlavorArg>,
    /// Envoy worker threads of every gateway.
    #[arg(long, visible_alias = "concurrency", value_name = "N", default_value_t = 1, value_parser = workers)]
    pub workers: u32,
    /// Requests per arm (each a new conversation).
    #[arg(long, value_name = "N", default_value_t = 400, value_parser = positive::<u32>)]
    pub requests: u32,
    /// Requests per second offered to A in the unsaturated arm.
    #[arg(long, value_name = "RPS", default_value_t = 3.0)]
    pub calm_rate: f64,
    /// Requests per second offered to A in the hotspot arms.
    #[arg(long, value_name = "RPS", default_value_t = 16.0)]
    pub hot_rate: f64,
    /// The spillover threshold: requests waiting on every replica of A.
    #[arg(long, value_name = "N", default_value_t = 1.0)]
    pub queue_threshold: f64,
    /// Unmeasured requests before each arm, at its rate (0: measure a cold gateway).
    #[arg(long, value_name = "N", default_value_t = 48)]
    pub warmup: u32,
    /// How A reaches B: `parent` (through B's gateway) or `endpoint`
    /// (straight to B's replicas).
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "MODE",
        default_value = "parent"
    )]
    pub peer_mode: PeerMode,
}

/// The options of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct ClustersOptions {
    /// Gateway flavours, three arms each.
    pub flavors: Vec<Flavor>,
    /// Envoy worker threads.
    pub workers: u32,
    /// Requests per arm.
    pub requests: u32,
    /// The unsaturated arm's offered rate.
    pub calm_rate: f64,
    /// The hotspot arms' offered rate.
    pub hot_rate: f64,
    /// The spillover threshold.
    pub queue_threshold: f64,
    /// Unmeasured requests before each arm.
    pub warmup: u32,
    /// How A reaches B.
    pub peer_mode: PeerMode,
}

impl ClustersFlags {
    /// The run these flags ask for.
    pub fn options(self) -> ClustersOptions {
        ClustersOptions {
            flavors: flavors(&self.flavor, &[Flavor::Wasm, Flavor::Native]),
            workers: self.workers,
            requests: self.requests,
            calm_rate: self.calm_rate,
            hot_rate: self.hot_rate,
            queue_threshold: self.queue_threshold,
            warmup: self.warmup,
            peer_mode: self.peer_mode,
        }
    }
}

impl ClustersOptions {
    /// Parses the flags of [`ClustersFlags`].
    pub fn parse(args: &[String]) -> Result<Self> {
        Ok(parse_flags::<ClustersFlags>(args)?.options())
    }
}

/// The three arms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ArmKind {
    Unsaturated,
    NoSpillover,
    Spillover,
}

impl ArmKind {
    fn label(self) -> &'static str {
        match self {
            ArmKind::Unsaturated => "unsaturated",
            ArmKind::NoSpillover => "hotspot, no spillover",
            ArmKind::Spillover => "hotspot, spillover",
        }
    }
}

/// One arm's figures.
#[derive(Clone, Debug)]
struct ArmFigures {
    kind: ArmKind,
    p50_s: f64,
    p99_s: f64,
    /// p50 of the requests served in A, and in B (`NaN`: none).
    p50_in_s: [f64; 2],
    served_in_b: f64,
    failed: u64,
    requests: usize,
}

/// The simulator of a cluster of `replicas`.
fn simulator(replicas: u32) -> SimConfig {
    SimConfig {
        replicas,
        engine: EngineConfig {
            max_num_seqs: SEQS_PER_REPLICA,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    }
}

/// A cluster's stack options over a simulator of `replicas`.
fn cluster(opts: &ClustersOptions, flavor: Flavor, replicas: u32) -> StackOptions {
    let mut o = StackOptions::new(flavor, Backends::InProcess(Box::new(simulator(replicas))));
    let mut pool = PoolSpec::all(crate::launch::DEFAULT_MODEL);
    pool.peers = Some(Peers {
        spillover: serde_json::json!({"queueDepthThreshold": opts.queue_threshold}),
        mode: opts.peer_mode,
        ..Peers::default()
    });
    o.pools = vec![pool];
    o.envoy = EnvoyOptions {
        concurrency: opts.workers,
        ..EnvoyOptions::default()
    };
    o
}

/// Every request a new conversation: one turn, a system prompt of its own (`seed` tells
/// the warm-up's conversations from the measured ones).
fn workload(requests: u32, seed: u64) -> Workload {
    Workload {
        seed,
        conversations: requests,
        turns: 1,
        system_tokens: 1000,
        user_tokens: 64,
        max_tokens: 64,
        ..Workload::default()
    }
}

/// Runs one arm of `kind` and summarizes it.
async fn arm(opts: &ClustersOptions, flavor: Flavor, kind: ArmKind) -> Result<ArmFigures> {
    let a = cluster(opts, flavor, REPLICAS_A);
    let b = cluster(opts, flavor, REPLICAS_B);
    // A alone, or A and B peers of each other.
    let (clusters, alone): (Option<Clusters>, Option<Stack>) = match kind {
        ArmKind::NoSpillover => {
            let mut a = a;
            for pool in &mut a.pools {
                pool.peers = None;
            }
            (None, Some(Stack::start(a).await?))
        }
        ArmKind::Unsaturated | ArmKind::Spillover => {
            (Some(Clusters::start_each(vec![a, b], true).await?), None)
        }
    };
    let gateway_a = match (&clusters, &alone) {
        (Some(c), _) => c.gateways().first(),
        (None, Some(s)) => Some(s),
        (None, None) => None,
    };
    let Some(gateway_a) = gateway_a else {
        anyhow::bail!("cluster A did not start");
    };
    // A few scrape rounds, so A knows B's load before the first request.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let rate = match kind {
        ArmKind::Unsaturated => opts.calm_rate,
        ArmKind::NoSpillover | ArmKind::Spillover => opts.hot_rate,
    };
    let load = |requests: u32, seed: u64| LoadConfig {
        workload: workload(requests, seed),
        concurrency: 512,
        rate: Some(rate),
        ..LoadConfig::default()
    };
    let target = Target::parse(&gateway_a.picker_url(), crate::load::Assign::Sticky)?;
    // A replica's batch is learned from its first queue: measure after it (the arm's own
    // load, every request finished before the measured ones start).
    if opts.warmup > 0 {
        run_target(&load(opts.warmup, 2), &target, 1).await?;
    }
    let report = run_target(&load(opts.requests, 1), &target, 1).await?;
    Ok(figures(kind, &report.records))
}

/// An arm's figures from its records.
fn figures(kind: ArmKind, records: &[RequestRecord]) -> ArmFigures {
    let mut latencies: Vec<f64> = records
        .iter()
        .filter(|r| r.status == 200 && r.error.is_none())
        .map(|r| r.e2e_s)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let b = cluster_address(1)
        .map(|ip| format!("{ip}:"))
        .unwrap_or_default();
    let in_b = |r: &RequestRecord| r.served_by.as_deref().is_some_and(|s| s.starts_with(&b));
    let p50_where = |want_b: bool| {
        let mut l: Vec<f64> = records
            .iter()
            .filter(|r| r.status == 200 && r.error.is_none() && in_b(r) == want_b)
            .map(|r| r.e2e_s)
            .collect();
        l.sort_by(f64::total_cmp);
        if l.is_empty() {
            f64::NAN
        } else {
            percentile(&l, 50.0)
        }
    };
    ArmFigures {
        kind,
        p50_s: percentile(&latencies, 50.0),
        p99_s: percentile(&latencies, 99.0),
        p50_in_s: [p50_where(false), p50_where(true)],
        served_in_b: records.iter().filter(|r| in_b(r)).count() as f64
            / records.len().max(1) as f64,
        failed: (records.len() - latencies.len()) as u64,
        requests: records.len(),
    }
}

/// Milliseconds, or `-` for none.
fn ms(s: f64) -> String {
    if s.is_nan() {
        "-".to_owned()
    } else {
        format!("{:.0} ms", s * 1e3)
    }
}

/// Runs every flavour's three arms; the report and whether every verdict held.
pub async fn run(opts: &ClustersOptions) -> Result<(String, bool)> {
    let mut out = format!(
        "a hotspot on cluster A ({REPLICAS_A} replicas x {SEQS_PER_REPLICA} sequences), cluster B \
         ({REPLICAS_B} replicas) its peer; {} new conversations per arm through A's gateway \
         (after {} unmeasured) at {} / {} requests/s, spillover at {} waiting per replica or a \
         full batch ({:?} Mode), {} Envoy worker(s)\n",
        opts.requests,
        opts.warmup,
        opts.calm_rate,
        opts.hot_rate,
        opts.queue_threshold,
        opts.peer_mode,
        opts.workers
    );
    let mut ok = true;
    for &flavor in &opts.flavors {
        let mut arms = Vec::new();
        for kind in [
            ArmKind::Unsaturated,
            ArmKind::NoSpillover,
            ArmKind::Spillover,
        ] {
            arms.push(arm(opts, flavor, kind).await?);
        }
        let calm = arms.first().map_or(f64::NAN, |a| a.p99_s);
        let rows: Vec<(String, Vec<String>)> = arms
            .iter()
            .map(|a| {
                (
                    a.kind.label().to_owned(),
                    vec![
                        format!("{:.0} ms", a.p50_s * 1e3),
                        format!("{:.0} ms", a.p99_s * 1e3),
                        format!("{:.2}x", a.p99_s / calm),
                        format!("{:.0}%", a.served_in_b * 100.0),
                        ms(a.p50_in_s[0]),
                        ms(a.p50_in_s[1]),
                        format!("{} of {}", a.failed, a.requests),
                    ],
                )
            })
            .collect();
        out.push_str(&format!("\n{flavor}\n"));
        let header: Vec<String> = [
            "arm",
            "p50",
            "p99",
            "p99 / unsaturated",
            "served in B",
            "p50 in A",
            "p50 in B",
            "failed",
        ]
        .iter()
        .map(|h| (*h).to_owned())
        .collect();
        out.push_str(&table(&header, &rows));
        let ratio = |k: ArmKind| {
            arms.iter()
                .find(|a| a.kind == k)
                .map_or(f64::NAN, |a| a.p99_s / calm)
        };
        let spill = ratio(ArmKind::Spillover);
        let hot = ratio(ArmKind::NoSpillover);
        let failed: u64 = arms.iter().map(|a| a.failed).sum();
        let verdicts = [
            (
                spill <= MAX_SPILL_P99,
                format!("spillover p99 {spill:.2}x the unsaturated (at most {MAX_SPILL_P99}x)"),
            ),
            (
                hot >= MIN_HOTSPOT_P99,
                format!("no-spillover p99 {hot:.2}x the unsaturated (at least {MIN_HOTSPOT_P99}x)"),
            ),
            (failed == 0, format!("{failed} failed request(s)")),
        ];
        for (held, text) in verdicts {
            ok &= held;
            out.push_str(&format!("{}: {text}\n", if held { "PASS" } else { "FAIL" }));
        }
    }
    Ok((out, ok))
}
