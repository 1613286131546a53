//! `cargo xtask bench overhead`: what the gateway filters cost inside Envoy.
//!
//! Envoys with the same `--concurrency` run side by side in front of one
//! [`backend::BenchBackend`]: `plain` (no gateway filter; the client
//! sets the routing headers the filters would set, so the request takes the same route and
//! ORIGINAL_DST pool cluster), `wasm` and `native` (body router + picker + scraper), and the
//! floors `wasm-floor` / `native-floor`: `plain` plus that module's `probe` filter, which only
//! holds each request until its body is complete and reads the body, the least any
//! body-based filter on that host costs. The probe is in the modules' bench builds only
//! (`--features probe`, which `cargo xtask bench overhead` makes; see
//! [`crate::launch::stack::probe_module`]), never in the release modules. The cost targets
//! are set against the floors: the Envoy CPU per request each gateway spends beyond its
//! floor ([`targets`]). A
//! closed-loop client with a fixed number of keep-alive connections sends chat bodies of
//! the run's size (32 KB: ~8k tokens). Each round runs every arm once (warm-up, then a measured window), the order
//! rotating from round to round, so slow drifts of a shared machine hit every arm alike.
//!
//! The default gateways against their own Envoy: each round, right after its measured
//! window, `native` and `wasm` send the same bodies for as long through their own Envoy's
//! `/rr/` route (the gateway filters disabled per route, round robin over the same
//! backend). Envoy CPU per request through the gateway ÷ through that route, per round and
//! over the totals, is the figure the cost targets are set on ([`targets::SameEnvoy`]): one
//! process and one configuration, so nothing but the filters differs.
//!
//! Reported per arm: requests/s, latency p50/p99, the latency added over `plain`, and the
//! Envoy process's CPU time per request (read from `/proc`, so it is the proxy's own cost
//! whatever else the machine was doing). Ratios are computed on totals over all rounds and,
//! as a noise check, as the median of the per-round ratios. A `direct` arm (client straight
//! to the backend) shows what the client and backend alone can do.
//!
//! `native` runs the router and the picker as one `gateway` filter (the launcher's default
//! when nothing must run between them); `native-two` is the same gateway as the two filters
//! `router` and `picker`, the form the global rate-limit filter needs: the difference is
//! what a second filter costs Envoy and the module.
//!
//! Tenancy: `wasm-tenancy` and `native-tenancy` are the same gateways with the platform's
//! tenant objects in the router config ([`tenants`]: limits that never refuse), so their
//! router filter runs auth → route → quota → usage. Every gateway arm sends tenant A's API
//! key, so the difference to the arm without tenants is those stages alone; the report
//! gives it per flavour as Envoy CPU per request (totals, and the median of the per-round
//! differences).
//!
//! Flow control: `wasm-flow` and `native-flow` are the gateways with flow control on in
//! their pool (`featureGates: [flowControl]`, a concurrency detector far above the
//! benchmark's connections), so every request passes the flow gate and none ever waits:
//! the difference to the arm without it is the admission's cost when the pool is not
//! saturated, reported per flavour as Envoy CPU and p50 latency per request.
//!
//! The architecture the gateway replaces: `extproc-null`, `extproc-parse` and
//! `extproc-parse-buffered` are `plain` plus Envoy's `ext_proc` filter calling an
//! `infergate-extproc` process over gRPC ([`crate::launch::extproc`]), one process per
//! arm, which sets the routing headers once the body is complete: `null` answers at once,
//! `parse` first parses the body and hashes its prompt as the core does (the least a real
//! endpoint picker does). The first two stream the body `FULL_DUPLEX_STREAMED` (what
//! llm-d's EPP requires), the last `BUFFERED`. Their client sets no routing header. The
//! report gives the processor's CPU per request (from `/proc`, like Envoy's) beside
//! Envoy's, and their sum.
//!
//! Body sizes and workers: a run is one Envoy `--concurrency` and one body size
//! (`--concurrency 1,4`, `--body-kb 32,128,512`: every combination by default); every arm
//! of a run is in its interleaved rounds, and each run prints its own report. Envoys are
//! started once per concurrency and kept over its body sizes. The run ends with a summary
//! of every arm's CPU and latency in every run.
//!
//! Profiles: with `--profile [DIR]`, each run ends with one more window per arm under
//! `perf` ([`super::profile`]), not counted in the figures, drawn as an SVG flame graph of
//! its Envoy (and of its external processor).
//!
//! Streamed windows: after its measured window, each arm but the floors and the ext_proc
//! arms also runs a
//! streamed window ([`first_chunk`]): the same bodies with `"stream": true`, answered by
//! [`backend`] with 20 SSE chunks a few ms apart, timing the first chunk and the whole
//! stream.
//! On a tenancy arm the gateway forces usage reporting on (the backend counts it) and reads
//! and strips it from every chunk; the client checks that it never sees usage.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde_json::json;

use super::cli::{parse_flags, positive, seconds};
use super::closed_loop::{ClosedLoop, LoopResult, RequestTemplate};
use super::overhead_table::{render, summary, Arm, Proxy, RunSummary, SameEnvoyPlain, StreamArm};
use super::report::{main_thread_cpu, process_cpu};
use crate::launch::extproc::{
    processor_binary, BodyMode, ExtProcOptions, ExtProcStack, ProcessorMode,
};
use crate::launch::{Backends, EnvoyOptions, Flavor, Stack, StackOptions, DEFAULT_MODEL};
use crate::load::workload::filler;
use backend::{BenchBackend, STREAM_CHUNKS, STREAM_HEADER};
use first_chunk::{StreamLoop, StreamResult};

pub mod backend;
pub mod first_chunk;
pub mod targets;
pub mod tenants;

/// One run: Envoy's worker count and the bodies' size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunShape {
    /// Envoy `--concurrency` of every arm.
    pub concurrency: u32,
    /// Prompt tokens of each body (about 4 bytes each).
    pub body_tokens: u32,
}

impl RunShape {
    /// The bodies' size in KB, as the report names it.
    pub fn body_kb(&self) -> u32 {
        self.body_tokens / TOKENS_PER_KB
    }
}

/// Prompt tokens per KB of body (the bodies' filler text is about 4 bytes a token).
pub const TOKENS_PER_KB: u32 = 256;

/// Body sizes of a full run, KB.
pub const DEFAULT_BODY_KB: [u32; 3] = [32, 128, 512];

/// Envoy worker counts of a full run.
pub const DEFAULT_CONCURRENCY: [u32; 2] = [1, 4];

/// The runs of `--quick` (unless `--body-kb`, `--body-tokens` or `--concurrency` says
/// otherwise): 32 KB bodies at 1 worker, 128 KB at 4.
pub const QUICK_RUNS: [RunShape; 2] = [
    RunShape {
        concurrency: 1,
        body_tokens: 32 * TOKENS_PER_KB,
    },
    RunShape {
        concurrency: 4,
        body_tokens: 128 * TOKENS_PER_KB,
    },
];

/// Tokio workers of each external processor (one per core of the bench machine).
const PROCESSOR_THREADS: usize = 2;

/// Options of `bench overhead`.
#[derive(Clone, Debug, PartialEq)]
pub struct OverheadOptions {
    /// Closed-loop connections (requests in flight).
    pub connections: usize,
    /// The runs, each an Envoy `--concurrency` and a body size, in order; runs of one
    /// concurrency share their Envoys (started once, in front of the same backend).
    pub runs: Vec<RunShape>,
    /// Rounds; every arm is measured once per round.
    pub rounds: u32,
    /// Unmeasured traffic before each measured window.
    pub warmup: Duration,
    /// Measured window per arm and round.
    pub measure: Duration,
    /// Distinct bodies cycled through.
    pub bodies: usize,
    /// Backend listeners (endpoints of the pool).
    pub endpoints: usize,
    /// Arms to run, of [`arm_labels`] (all by default; `plain` is always kept, as every
    /// ratio is against it, and a tenancy arm keeps its flavour's arm without tenants).
    pub arms: Vec<String>,
    /// Streamed window per arm and round (zero: no streamed windows).
    pub stream_measure: Duration,
    /// Content chunks per streamed response (the streamed bodies' `max_tokens`, which the
    /// backend answers token by token).
    pub stream_chunks: u32,
    /// `--profile`: after each run's rounds, one more measured window per arm under
    /// `perf`, drawn as a flame graph per process in this directory (not counted in the
    /// figures).
    pub profile: Option<PathBuf>,
    /// `--rate`: requests per second offered to every arm ([`ClosedLoop::rate`]); `None`:
    /// closed loop.
    pub rate: Option<f64>,
}

impl Default for OverheadOptions {
    fn default() -> Self {
        OverheadOptions {
            connections: 8,
            runs: product(&DEFAULT_CONCURRENCY, &kb_tokens(&DEFAULT_BODY_KB)),
            rounds: 5,
            warmup: Duration::from_millis(1000),
            measure: Duration::from_secs(4),
            bodies: 32,
            endpoints: 4,
            arms: arm_labels().map(str::to_string).collect(),
            stream_measure: Duration::from_secs(2),
            stream_chunks: STREAM_CHUNKS,
            profile: None,
            rate: None,
        }
    }
}

fn kb_tokens(kb: &[u32]) -> Vec<u32> {
    kb.iter().map(|k| k.saturating_mul(TOKENS_PER_KB)).collect()
}

/// Every concurrency with every body size, concurrency-major.
fn product(concurrency: &[u32], body_tokens: &[u32]) -> Vec<RunShape> {
    concurrency
        .iter()
        .flat_map(|&c| {
            body_tokens.iter().map(move |&t| RunShape {
                concurrency: c,
                body_tokens: t,
            })
        })
        .collect()
}

/// What an Envoy arm puts in front of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gateway {
    /// The template of this flavour (`plain`: none).
    Flavor(Flavor),
    /// The `plain` template plus that module's `probe` filter (from its bench build), which
    /// only holds the request for its body and reads it: the least any body-based filter of
    /// that host costs.
    Probe(Flavor),
    /// The `plain` template plus Envoy's `ext_proc` filter calling an external processor.
    ExtProc(ProcessorMode, BodyMode),
}

/// One Envoy arm.
#[derive(Clone, Copy, Debug)]
struct EnvoyArm {
    label: &'static str,
    gateway: Gateway,
    /// The tenant objects in the router config.
    tenancy: bool,
    /// Flow control on in the pool's `eppConfig` (never saturated).
    flow: bool,
    /// Native: the router and the picker as two filters (the form the global rate-limit
    /// filter needs) instead of the one `gateway` filter.
    two_filters: bool,
}

const fn envoy_arm(label: &'static str, gateway: Gateway) -> EnvoyArm {
    EnvoyArm {
        label,
        gateway,
        tenancy: false,
        flow: false,
        two_filters: false,
    }
}

impl EnvoyArm {
    /// Whether the client sets the routing headers itself (`plain` and the floors).
    fn client_routes(&self) -> bool {
        matches!(
            self.gateway,
            Gateway::Flavor(Flavor::Plain) | Gateway::Probe(_)
        )
    }
}

/// The Envoy arms, in report order; each tenancy arm right after its flavour's arm, so the
/// rotation measures the two back to back in most rounds.
const ENVOY_ARMS: [EnvoyArm; 13] = [
    envoy_arm("plain", Gateway::Flavor(Flavor::Plain)),
    envoy_arm("wasm-floor", Gateway::Probe(Flavor::Wasm)),
    envoy_arm("wasm", Gateway::Flavor(Flavor::Wasm)),
    EnvoyArm {
        tenancy: true,
        ..envoy_arm("wasm-tenancy", Gateway::Flavor(Flavor::Wasm))
    },
    EnvoyArm {
        flow: true,
        ..envoy_arm("wasm-flow", Gateway::Flavor(Flavor::Wasm))
    },
    envoy_arm("native-floor", Gateway::Probe(Flavor::Native)),
    envoy_arm("native", Gateway::Flavor(Flavor::Native)),
    EnvoyArm {
        two_filters: true,
        ..envoy_arm("native-two", Gateway::Flavor(Flavor::Native))
    },
    EnvoyArm {
        tenancy: true,
        ..envoy_arm("native-tenancy", Gateway::Flavor(Flavor::Native))
    },
    EnvoyArm {
        flow: true,
        ..envoy_arm("native-flow", Gateway::Flavor(Flavor::Native))
    },
    envoy_arm(
        "extproc-null",
        Gateway::ExtProc(ProcessorMode::Null, BodyMode::FullDuplex),
    ),
    envoy_arm(
        "extproc-parse",
        Gateway::ExtProc(ProcessorMode::Parse, BodyMode::FullDuplex),
    ),
    envoy_arm(
        "extproc-parse-buffered",
        Gateway::ExtProc(ProcessorMode::Parse, BodyMode::Buffered),
    ),
];

/// The tenancy arm of each flavour and the arm it is compared with.
pub(super) const TENANCY_PAIRS: [(&str, &str); 2] =
    [("wasm", "wasm-tenancy"), ("native", "native-tenancy")];

/// The flow-control arm of each flavour and the arm it is compared with.
pub(super) const FLOW_PAIRS: [(&str, &str); 2] = [("wasm", "wasm-flow"), ("native", "native-flow")];

/// The pool's `eppConfig` of a flow arm: the picker's default scheduling, with flow
/// control on and a concurrency limit no benchmark load reaches.
pub fn never_saturated_flow_config() -> serde_json::Value {
    let mut epp = infergate_filters::picker::config::default_epp_config();
    if let Some(plugins) = epp["plugins"].as_array_mut() {
        plugins.push(json!({"type": "concurrency-detector",
                            "parameters": {"maxConcurrency": 100_000}}));
        plugins.push(json!({"type": "round-robin-fairness-policy"}));
        plugins.push(json!({"type": "fcfs-ordering-policy"}));
    }
    epp["featureGates"] = json!(["flowControl"]);
    epp["flowControl"] = json!({
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "priorityBands": [{"priority": 0, "fairnessPolicyRef": "round-robin-fairness-policy",
                           "orderingPolicyRef": "fcfs-ordering-policy"}]
    });
    epp
}

/// Every arm, in report order: `direct` (no Envoy), then the Envoy arms.
fn arm_labels() -> impl Iterator<Item = &'static str> {
    std::iter::once("direct").chain(ENVOY_ARMS.iter().map(|a| a.label))
}

/// Whether the arm runs streamed windows: all but the floors, whose probe filter only
/// reads requests, and the ext_proc arms, whose processor never sees the response.
fn streams(label: &str) -> bool {
    !label.ends_with("-floor") && !label.starts_with("extproc-")
}

/// Unmeasured streams before each streamed window.
const STREAM_WARMUP: Duration = Duration::from_millis(300);

/// `bench overhead`'s flags ([`OverheadFlags::options`] makes them the run's
/// [`OverheadOptions`]).
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct OverheadFlags {
    /// Closed-loop connections (requests in flight).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = positive::<usize>)]
    pub connections: usize,
    /// Envoy worker counts, comma-separated, one run each [default: 1,4].
    #[arg(long, value_name = "C,..", value_delimiter = ',', value_parser = positive::<u32>)]
    pub concurrency: Vec<u32>,
    /// Body sizes in KB, comma-separated, one run each per worker count [default:
    /// 32,128,512].
    #[arg(
        verbatim_doc_comment,
        long,
        value_name = "KB,..",
        value_delimiter = ',',
        value_parser = positive::<u32>,
        overrides_with = "body_tokens"
    )]
    pub body_kb: Vec<u32>,
    /// Body sizes in prompt tokens (about 4 bytes each), instead of --body-kb.
    #[arg(
        long,
        value_name = "T,..",
        value_delimiter = ',',
        value_parser = positive::<u32>,
        overrides_with = "body_kb"
    )]
    pub body_tokens: Vec<u32>,
    /// Rounds; every arm is measured once per round [default: 5; --quick: 2].
    #[arg(long, value_name = "R", value_parser = positive::<u32>)]
    pub rounds: Option<u32>,
    /// Unmeasured traffic before each measured window, ms [default: 1000; --quick: 500].
    #[arg(long, value_name = "MS")]
    pub warmup_ms: Option<u64>,
    /// Measured window per arm and round, seconds [default: 4; --quick: 1.5].
    #[arg(long, value_name = "S", value_parser = seconds)]
    pub measure_s: Option<Duration>,
    /// Streamed window per arm and round, seconds; 0: none [default: 2; --quick: 0.6].
    #[arg(long, value_name = "S", value_parser = seconds)]
    pub stream_measure_s: Option<Duration>,
    /// Content chunks per streamed response, 1 ms or more apart [default: 20].
    #[arg(long, value_name = "N", value_parser = positive::<u32>)]
    pub stream_chunks: Option<u32>,
    /// A flame graph per arm and run (one more window under perf, not counted), written
    /// to DIR [default DIR: target/flamegraphs].
    #[arg(verbatim_doc_comment, long, value_name = "DIR", num_args = 0..=1, default_missing_value = DEFAULT_PROFILE_DIR)]
    pub profile: Option<PathBuf>,
    /// 2 short rounds; 32 KB at 1 worker and 128 KB at 4 unless sizes or workers are given.
    #[arg(long)]
    pub quick: bool,
    /// Requests/s offered to every arm, paced, instead of a closed loop.
    #[arg(long, value_name = "RPS", value_parser = positive::<u32>)]
    pub rate: Option<u32>,
    /// The arms to run, comma-separated, of direct, plain, wasm-floor, wasm, wasm-tenancy,
    /// wasm-flow, native-floor, native, native-two, native-tenancy, native-flow,
    /// extproc-null, extproc-parse, extproc-parse-buffered (plain is always run, and a
    /// tenancy or flow arm brings its flavour's arm) [default: all].
    #[arg(verbatim_doc_comment, long, value_name = "ARM,..", value_delimiter = ',', value_parser = arm_label)]
    pub arms: Vec<String>,
}

/// One of [`arm_labels`].
fn arm_label(s: &str) -> Result<String> {
    let s = s.trim();
    match arm_labels().find(|l| *l == s) {
        Some(l) => Ok(l.to_string()),
        None => bail!("unknown arm `{s}`"),
    }
}

impl OverheadFlags {
    /// The run these flags ask for.
    pub fn options(self) -> OverheadOptions {
        let d = OverheadOptions::default();
        let quick = self.quick;
        let mut arms = self.arms;
        if arms.is_empty() {
            arms = d.arms.clone();
        }
        for (base, variant) in TENANCY_PAIRS.iter().chain(&FLOW_PAIRS) {
            if arms.iter().any(|a| a == variant) && !arms.iter().any(|a| a == base) {
                arms.push((*base).into());
            }
        }
        if !arms.iter().any(|a| a == "plain") {
            arms.push("plain".into());
        }
        let body_tokens = if !self.body_tokens.is_empty() {
            Some(self.body_tokens)
        } else if !self.body_kb.is_empty() {
            Some(kb_tokens(&self.body_kb))
        } else {
            None
        };
        let runs = match (quick, self.concurrency.is_empty(), &body_tokens) {
            (true, true, None) => QUICK_RUNS.to_vec(),
            _ => product(
                if self.concurrency.is_empty() {
                    &DEFAULT_CONCURRENCY
                } else {
                    &self.concurrency
                },
                &body_tokens.unwrap_or_else(|| kb_tokens(&DEFAULT_BODY_KB)),
            ),
        };
        let pick = |given: Option<Duration>, full: Duration, short: u64| {
            given.unwrap_or(if quick {
                Duration::from_millis(short)
            } else {
                full
            })
        };
        OverheadOptions {
            connections: self.connections,
            runs,
            rounds: self.rounds.unwrap_or(if quick { 2 } else { d.rounds }),
            warmup: pick(self.warmup_ms.map(Duration::from_millis), d.warmup, 500),
            measure: pick(self.measure_s, d.measure, 1500),
            stream_measure: pick(self.stream_measure_s, d.stream_measure, 600),
            stream_chunks: self.stream_chunks.unwrap_or(d.stream_chunks),
            arms,
            profile: self.profile,
            rate: self.rate.map(f64::from),
            ..d
        }
    }
}

impl OverheadOptions {
    /// How requests arrive: `closed loop`, or `paced at N requests/s in all` (`--rate`).
    pub fn arrivals(&self) -> String {
        self.rate.map_or_else(
            || "closed loop".to_string(),
            |r| format!("paced at {r:.0} requests/s in all"),
        )
    }

    /// Parses the command-line flags (see [`OverheadFlags`]).
    pub fn parse(args: &[String]) -> Result<Self> {
        Ok(parse_flags::<OverheadFlags>(args)?.options())
    }

    /// The Envoy worker counts of the runs, each once, in run order.
    fn concurrencies(&self) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for r in &self.runs {
            if !out.contains(&r.concurrency) {
                out.push(r.concurrency);
            }
        }
        out
    }
}

/// The request bodies: `count` chat requests of about `tokens` prompt tokens each, with
/// distinct text (so the picker's prefix index sees different prompts).
pub fn bodies(count: usize, tokens: u32) -> Vec<Bytes> {
    (0..count as u64)
        .map(|i| chat_body(i, tokens, None))
        .collect()
}

/// The same bodies with `"stream": true`, asking for `chunks` tokens, which the backend
/// streams one chunk each.
pub fn stream_bodies(count: usize, tokens: u32, chunks: u32) -> Vec<Bytes> {
    (0..count as u64)
        .map(|i| chat_body(i, tokens, Some(chunks)))
        .collect()
}

/// A chat body of about `tokens` prompt tokens; streamed, asking for `stream` tokens.
fn chat_body(i: u64, tokens: u32, stream: Option<u32>) -> Bytes {
    let system = filler(0xb0d1 ^ (i << 8), tokens.saturating_sub(32));
    let user = filler(0x05e7 ^ (i << 8), 32.min(tokens));
    let mut body = json!({
        "model": DEFAULT_MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ],
        "max_tokens": 1,
    });
    if let Some(chunks) = stream {
        body["stream"] = json!(true);
        body["max_tokens"] = json!(chunks);
    }
    Bytes::from(body.to_string())
}

/// An arm started for one concurrency, kept over its runs' body sizes.
struct Started {
    label: &'static str,
    /// `None`: `direct`.
    spec: Option<EnvoyArm>,
    proxy: Option<Proxy>,
    target: SocketAddr,
}

/// Starts every wanted arm at `concurrency`.
async fn start_arms(
    opts: &OverheadOptions,
    concurrency: u32,
    addrs: &[SocketAddr],
    processor: Option<&std::path::Path>,
) -> Result<Vec<Started>> {
    let tenancy = tenants::bench_tenancy()?;
    let wanted = |label: &str| opts.arms.iter().any(|a| a == label);
    let mut out = Vec::new();
    if wanted("direct") {
        out.push(Started {
            label: "direct",
            spec: None,
            proxy: None,
            target: *addrs.first().context("no backend address")?,
        });
    }
    let envoy = EnvoyOptions {
        concurrency,
        ..EnvoyOptions::default()
    };
    for spec in &ENVOY_ARMS {
        let label = spec.label;
        if !wanted(label) {
            continue;
        }
        let proxy = match spec.gateway {
            Gateway::ExtProc(mode, body) => {
                let binary = processor
                    .context("the processor binary was not built")?
                    .to_path_buf();
                let stack = ExtProcStack::start(&ExtProcOptions {
                    binary,
                    mode,
                    body,
                    endpoints: addrs.to_vec(),
                    threads: PROCESSOR_THREADS,
                    envoy: envoy.clone(),
                })
                .await
                .with_context(|| format!("starting the {label} stack"))?;
                Proxy::ExtProc(Box::new(stack))
            }
            Gateway::Flavor(flavor) | Gateway::Probe(flavor) => {
                let probe = matches!(spec.gateway, Gateway::Probe(_));
                let base = if probe { Flavor::Plain } else { flavor };
                let mut so = StackOptions::new(base, Backends::External(addrs.to_vec()));
                so.probe = probe.then_some(flavor);
                so.envoy = envoy.clone();
                if spec.tenancy {
                    so.tenancy = tenancy.clone();
                }
                so.two_filters = spec.two_filters;
                if spec.flow {
                    let mut pool = crate::launch::PoolSpec::all(DEFAULT_MODEL);
                    pool.picker_config = never_saturated_flow_config();
                    so.pools = vec![pool];
                }
                let stack = Stack::start(so)
                    .await
                    .with_context(|| format!("starting the {label} stack"))?;
                Proxy::Gateway(Box::new(stack))
            }
        };
        let listener = proxy.envoy().listener();
        eprintln!(
            "{label} Envoy: pid {}, listener {listener}, admin {}{}",
            proxy.envoy().pid().unwrap_or(0),
            proxy.envoy().admin(),
            proxy
                .processor_pid()
                .map(|p| format!(", processor pid {p}"))
                .unwrap_or_default()
        );
        out.push(Started {
            label,
            spec: Some(*spec),
            proxy: Some(proxy),
            target: listener,
        });
    }
    Ok(out)
}

/// The arm's requests for these bodies.
fn templates_for(
    s: &Started,
    addrs: &[SocketAddr],
    bodies: &[Bytes],
    streamed: &[Bytes],
) -> Templates {
    match s.spec {
        None => Templates {
            plain: direct_templates(bodies, &[]),
            streamed: direct_templates(streamed, &[stream_header()]),
        },
        // `plain` and the floors route on client-set headers.
        Some(spec) if spec.client_routes() => Templates {
            plain: plain_templates(bodies, addrs, &[]),
            streamed: plain_templates(streamed, addrs, &[stream_header()]),
        },
        // The processor sets the routing headers; it reads no API key.
        Some(EnvoyArm {
            gateway: Gateway::ExtProc(..),
            ..
        }) => Templates {
            plain: direct_templates(bodies, &[]),
            streamed: direct_templates(streamed, &[stream_header()]),
        },
        // The gateway sets its own; every gateway arm carries the API key (used only where
        // tenants are configured).
        Some(_) => {
            let key = tenants::authorization();
            Templates {
                plain: direct_templates(bodies, std::slice::from_ref(&key)),
                streamed: direct_templates(streamed, &[key, stream_header()]),
            }
        }
    }
}

/// Runs the benchmark: each run's report is printed as it ends; returns the summary over
/// the runs.
pub async fn run(opts: &OverheadOptions) -> Result<String> {
    let backend = BenchBackend::start(opts.endpoints).await?;
    let addrs = backend.addrs().to_vec();
    let processor = if opts.arms.iter().any(|a| a.starts_with("extproc-")) {
        Some(processor_binary()?)
    } else {
        None
    };
    let mut done: Vec<RunSummary> = Vec::new();
    for concurrency in opts.concurrencies() {
        let mut started = start_arms(opts, concurrency, &addrs, processor.as_deref()).await?;
        for shape in opts.runs.iter().filter(|r| r.concurrency == concurrency) {
            let (arms, text) = run_one(opts, *shape, started, &backend, &addrs).await?;
            println!("{text}");
            check_served(&arms)?;
            done.push(RunSummary::of(*shape, &arms));
            started = arms
                .into_iter()
                .map(|a| Started {
                    label: a.label,
                    spec: ENVOY_ARMS.iter().find(|s| s.label == a.label).copied(),
                    target: a.client.target,
                    proxy: a.proxy,
                })
                .collect();
        }
    }
    Ok(summary(&done))
}

/// One run: every arm of `started` on bodies of `shape`, rounds interleaved; the arms back
/// (their proxies still running) and the report.
async fn run_one(
    opts: &OverheadOptions,
    shape: RunShape,
    started: Vec<Started>,
    backend: &BenchBackend,
    addrs: &[SocketAddr],
) -> Result<(Vec<Arm>, String)> {
    let bodies = bodies(opts.bodies, shape.body_tokens);
    let streamed = stream_bodies(opts.bodies, shape.body_tokens, opts.stream_chunks);
    let mut arms = Vec::with_capacity(started.len());
    for s in started {
        let templates = templates_for(&s, addrs, &bodies, &streamed);
        let mut a = arm(s.label, s.proxy, templates, &s.target, opts);
        if DEFAULT_GATEWAYS.contains(&a.label) {
            a.same_envoy_plain = Some(same_envoy_plain(s.target, &bodies, opts));
        }
        arms.push(a);
    }
    for a in &arms {
        wait_until_served(&a.client, a.label).await?;
        if let Some(p) = &a.same_envoy_plain {
            wait_until_served(&p.client, a.label).await?;
        }
    }
    eprintln!(
        "bench overhead: {} rounds × {} arms, {} connections {}, Envoy --concurrency {}, \
         bodies of {} tokens, {} ms warm-up + {:.1} s measured each, then {:.1} s streamed",
        opts.rounds,
        arms.len(),
        opts.connections,
        opts.arrivals(),
        shape.concurrency,
        shape.body_tokens,
        opts.warmup.as_millis(),
        opts.measure.as_secs_f64(),
        opts.stream_measure.as_secs_f64()
    );
    let n = arms.len();
    for round in 0..opts.rounds as usize {
        for k in 0..n {
            let Some(a) = arms.get_mut((round + k) % n) else {
                continue;
            };
            let _ = a.client.run(opts.warmup).await;
            let cpu0 = a.envoy_pid().and_then(process_cpu);
            let main0 = a.envoy_pid().and_then(main_thread_cpu);
            let proc0 = a.processor_pid().and_then(process_cpu);
            let posts0 = backend.counters().posts.load(Ordering::Relaxed);
            let bytes0 = backend.counters().body_bytes.load(Ordering::Relaxed);
            let r = a.client.run(opts.measure).await;
            if let (Some(c0), Some(c1)) = (cpu0, a.envoy_pid().and_then(process_cpu)) {
                let cpu = c1.saturating_sub(c0);
                a.envoy_cpu += cpu;
                a.round_cpu_us.push(per_request_us(cpu, r.ok));
            }
            if let (Some(m0), Some(m1)) = (main0, a.envoy_pid().and_then(main_thread_cpu)) {
                a.main_cpu += m1.saturating_sub(m0);
            }
            if let (Some(c0), Some(c1)) = (proc0, a.processor_pid().and_then(process_cpu)) {
                let cpu = c1.saturating_sub(c0);
                a.processor_cpu += cpu;
                a.round_processor_cpu_us.push(per_request_us(cpu, r.ok));
            }
            a.backend_posts += backend.counters().posts.load(Ordering::Relaxed) - posts0;
            a.backend_bytes += backend.counters().body_bytes.load(Ordering::Relaxed) - bytes0;
            a.round_rps.push(r.rps());
            eprintln!(
                "  round {}/{} {:>22}: {:>7.0} req/s, {} errors",
                round + 1,
                opts.rounds,
                a.label,
                r.rps(),
                r.errors
            );
            a.total.merge(r);
            same_envoy_window(a, opts, round).await;
            stream_window(a, backend, opts, round).await;
        }
    }
    if let Some(dir) = &opts.profile {
        for a in &mut arms {
            profile_window(a, opts, shape, dir).await?;
        }
    }
    let logic = super::logic::measure(&bodies, Duration::from_millis(300));
    let text = render(&arms, opts, shape, &logic);
    Ok((arms, text))
}

/// Largest share of failed requests an arm may have for its figures to stand.
const MAX_ERROR_SHARE: f64 = 0.01;

/// Fails the bench when an arm served nothing or failed more than [`MAX_ERROR_SHARE`] of
/// its requests: its figures would describe a broken proxy, not its cost.
fn check_served(arms: &[Arm]) -> Result<()> {
    for a in arms {
        let all = a.total.ok + a.total.errors;
        if a.total.ok == 0 || a.total.errors as f64 > MAX_ERROR_SHARE * all as f64 {
            bail!(
                "arm {}: {} of {all} requests failed (first: {})",
                a.label,
                a.total.errors,
                a.total.first_error.as_deref().unwrap_or("none answered")
            );
        }
    }
    Ok(())
}

/// Where `--profile` writes without a directory.
const DEFAULT_PROFILE_DIR: &str = "target/flamegraphs";

/// One more measured window of arm `a` with `perf` on its Envoy (and its external
/// processor), not counted in the figures: `DIR/overhead-<workers>w-<KB>KB-<arm>.svg` (and
/// `...-processor.svg`).
async fn profile_window(
    a: &mut Arm,
    opts: &OverheadOptions,
    shape: RunShape,
    dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = format!(
        "overhead-{}w-{}KB-{}",
        shape.concurrency,
        shape.body_kb(),
        a.label
    );
    let title = format!(
        "{}: Envoy --concurrency {}, {} KB bodies",
        a.label,
        shape.concurrency,
        shape.body_kb()
    );
    let mut recordings = Vec::new();
    for (pid, suffix, what) in [
        (a.envoy_pid(), "", "Envoy"),
        (a.processor_pid(), "-processor", "external processor"),
    ] {
        let Some(pid) = pid else { continue };
        let data = dir.join(format!("{name}{suffix}.perf.data"));
        let svg = dir.join(format!("{name}{suffix}.svg"));
        let rec = super::profile::Recording::start(pid, &data, &format!("{title} ({what})"))?;
        recordings.push((rec, data, svg));
    }
    if recordings.is_empty() {
        return Ok(());
    }
    let _ = a.client.run(opts.warmup).await;
    let _ = a.client.run(opts.measure).await;
    for (rec, data, svg) in recordings {
        rec.finish(&svg).await?;
        let _ = std::fs::remove_file(&data);
        eprintln!("  flame graph: {}", svg.display());
    }
    Ok(())
}

/// The arm's streamed window of this round, if it has one.
async fn stream_window(a: &mut Arm, backend: &BenchBackend, opts: &OverheadOptions, round: usize) {
    let pid = a.envoy_pid();
    let label = a.label;
    let Some(s) = a.stream.as_mut() else {
        return;
    };
    let _ = s.client.run(STREAM_WARMUP).await;
    let cpu0 = pid.and_then(process_cpu);
    let streams0 = backend.streams().streams.load(Ordering::Relaxed);
    let forced0 = backend.streams().usage_forced.load(Ordering::Relaxed);
    let r: StreamResult = s.client.run(opts.stream_measure).await;
    if let (Some(c0), Some(c1)) = (cpu0, pid.and_then(process_cpu)) {
        let cpu = c1.saturating_sub(c0);
        s.envoy_cpu += cpu;
        s.round_cpu_us.push(per_request_us(cpu, r.ok));
    }
    s.backend_streams += backend.streams().streams.load(Ordering::Relaxed) - streams0;
    s.usage_forced += backend.streams().usage_forced.load(Ordering::Relaxed) - forced0;
    let mut firsts = r.first_chunk_us.clone();
    firsts.sort_unstable();
    let p50 = super::report::percentile_us(&firsts, 50.0);
    s.round_first_chunk_p50_us.push(p50);
    eprintln!(
        "  round {}/{} {:>14}: {:>7} streams, first chunk p50 {} µs, {} errors",
        round + 1,
        opts.rounds,
        label,
        r.ok,
        p50,
        r.errors
    );
    s.total.merge(r);
}

/// CPU time per request in µs (0 without requests).
fn per_request_us(cpu: Duration, requests: u64) -> f64 {
    if requests == 0 {
        return 0.0;
    }
    cpu.as_secs_f64() * 1e6 / requests as f64
}

/// An arm's requests: the measured window's and the streamed window's.
struct Templates {
    plain: Vec<RequestTemplate>,
    streamed: Vec<RequestTemplate>,
}

fn stream_header() -> (String, String) {
    (STREAM_HEADER.into(), "1".into())
}

fn arm(
    label: &'static str,
    proxy: Option<Proxy>,
    templates: Templates,
    target: &SocketAddr,
    opts: &OverheadOptions,
) -> Arm {
    let target = *target;
    let path = "/v1/chat/completions".to_string();
    let stream = (streams(label) && !opts.stream_measure.is_zero()).then(|| StreamArm {
        client: StreamLoop {
            target,
            path: path.clone(),
            templates: Arc::new(templates.streamed),
            connections: opts.connections,
            chunks: opts.stream_chunks,
        },
        total: StreamResult::default(),
        envoy_cpu: Duration::ZERO,
        round_cpu_us: Vec::new(),
        round_first_chunk_p50_us: Vec::new(),
        backend_streams: 0,
        usage_forced: 0,
    });
    Arm {
        label,
        proxy,
        client: ClosedLoop {
            target,
            path,
            templates: Arc::new(templates.plain),
            connections: opts.connections,
            rate: opts.rate,
        },
        total: LoopResult::default(),
        round_rps: Vec::new(),
        envoy_cpu: Duration::ZERO,
        round_cpu_us: Vec::new(),
        main_cpu: Duration::ZERO,
        processor_cpu: Duration::ZERO,
        round_processor_cpu_us: Vec::new(),
        backend_posts: 0,
        backend_bytes: 0,
        stream,
        same_envoy_plain: None,
    }
}

/// The default gateway arms, which also measure their own Envoy's plain route
/// ([`SameEnvoyPlain`]).
const DEFAULT_GATEWAYS: [&str; 2] = ["native", "wasm"];

/// The plain-route windows of a default gateway arm aimed at `target`.
fn same_envoy_plain(
    target: SocketAddr,
    bodies: &[Bytes],
    opts: &OverheadOptions,
) -> SameEnvoyPlain {
    SameEnvoyPlain {
        client: ClosedLoop {
            target,
            path: "/rr/v1/chat/completions".into(),
            templates: Arc::new(direct_templates(bodies, &[])),
            connections: opts.connections,
            rate: opts.rate,
        },
        total: LoopResult::default(),
        envoy_cpu: Duration::ZERO,
        round_cpu_us: Vec::new(),
    }
}

/// A default gateway arm's window through its own Envoy's plain route, right after its
/// gateway window: warm-up, then the measured window, timed on the same Envoy process.
async fn same_envoy_window(a: &mut Arm, opts: &OverheadOptions, round: usize) {
    let pid = a.envoy_pid();
    let label = a.label;
    let Some(p) = a.same_envoy_plain.as_mut() else {
        return;
    };
    let _ = p.client.run(opts.warmup).await;
    let cpu0 = pid.and_then(process_cpu);
    let r = p.client.run(opts.measure).await;
    if let (Some(c0), Some(c1)) = (cpu0, pid.and_then(process_cpu)) {
        let cpu = c1.saturating_sub(c0);
        p.envoy_cpu += cpu;
        p.round_cpu_us.push(per_request_us(cpu, r.ok));
    }
    eprintln!(
        "  round {}/{} {:>22}: {:>7.0} req/s, {} errors (its Envoy's /rr/ route)",
        round + 1,
        opts.rounds,
        label,
        r.rps(),
        r.errors
    );
    p.total.merge(r);
}

fn direct_templates(bodies: &[Bytes], extra: &[(String, String)]) -> Vec<RequestTemplate> {
    bodies
        .iter()
        .map(|b| RequestTemplate {
            body: b.clone(),
            headers: extra.to_vec(),
        })
        .collect()
}

/// The plain flavour routes on the headers the gateway filters would have set.
fn plain_templates(
    bodies: &[Bytes],
    endpoints: &[SocketAddr],
    extra: &[(String, String)],
) -> Vec<RequestTemplate> {
    bodies
        .iter()
        .zip(endpoints.iter().cycle())
        .map(|(b, ep)| {
            let mut headers = vec![
                ("x-gateway-base-model-name".into(), DEFAULT_MODEL.into()),
                ("x-gateway-destination-endpoint".into(), ep.to_string()),
            ];
            headers.extend_from_slice(extra);
            RequestTemplate {
                body: b.clone(),
                headers,
            }
        })
        .collect()
}

/// Waits until the arm answers 200 (the gateway needs its first metrics snapshot).
async fn wait_until_served(client: &ClosedLoop, label: &str) -> Result<()> {
    let probe = ClosedLoop {
        connections: 1,
        rate: None,
        ..client.clone()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = probe.run(Duration::from_millis(1)).await;
        if r.ok > 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{label}: no successful request within 20 s: {}",
                r.first_error.unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_about_32_kb_and_distinct() {
        let b = bodies(3, 8000);
        assert_eq!(b.len(), 3);
        for body in &b {
            assert!((32_000..33_000).contains(&body.len()), "{}", body.len());
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            assert_eq!(v["model"], DEFAULT_MODEL);
        }
        assert_ne!(b[0], b[1]);
    }

    #[test]
    fn options_parse() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let shape = |c, t| RunShape {
            concurrency: c,
            body_tokens: t,
        };
        let o = OverheadOptions::parse(&s(&["--connections", "4", "--concurrency", "2"])).unwrap();
        assert_eq!(o.connections, 4);
        assert_eq!(
            o.runs,
            [shape(2, 8192), shape(2, 32768), shape(2, 131_072)],
            "one worker count, every default body size"
        );
        let d = OverheadOptions::parse(&[]).unwrap();
        assert_eq!(d, OverheadOptions::default());
        assert_eq!(d.runs.len(), 6, "1 and 4 workers × 32, 128 and 512 KB");
        assert_eq!(d.concurrencies(), [1, 4]);
        let o =
            OverheadOptions::parse(&s(&["--body-kb", "32,512", "--concurrency", "4,1"])).unwrap();
        assert_eq!(
            o.runs,
            [
                shape(4, 8192),
                shape(4, 131_072),
                shape(1, 8192),
                shape(1, 131_072)
            ]
        );
        assert_eq!(o.concurrencies(), [4, 1]);
        let o =
            OverheadOptions::parse(&s(&["--body-tokens", "8000", "--concurrency", "1"])).unwrap();
        assert_eq!(
            o.runs,
            [shape(1, 8000)],
            "--body-tokens still sizes the bodies"
        );
        assert!(OverheadOptions::parse(&s(&["--body-kb", "32,x"])).is_err());
        assert!(OverheadOptions::parse(&s(&["--body-kb", "0"])).is_err());
        assert!(OverheadOptions::parse(&s(&["--concurrency", ""])).is_err());
        assert!(OverheadOptions::parse(&s(&["--rounds", "0"])).is_err());
        assert!(OverheadOptions::parse(&s(&["--bogus"])).is_err());
        let o = OverheadOptions::parse(&s(&["--arms", "native"])).unwrap();
        assert_eq!(o.arms, ["native", "plain"], "plain is always measured");
        assert!(OverheadOptions::parse(&s(&["--arms", "grpc"])).is_err());
        let o = OverheadOptions::parse(&s(&["--arms", "wasm-tenancy"])).unwrap();
        assert_eq!(
            o.arms,
            ["wasm-tenancy", "wasm", "plain"],
            "a tenancy arm is compared with its flavour's arm"
        );
        let o =
            OverheadOptions::parse(&s(&["--arms", "extproc-parse-buffered,extproc-null"])).unwrap();
        assert_eq!(o.arms, ["extproc-parse-buffered", "extproc-null", "plain"]);
        let o = OverheadOptions::parse(&s(&["--profile"])).unwrap();
        assert_eq!(o.profile, Some(PathBuf::from(DEFAULT_PROFILE_DIR)));
        let o = OverheadOptions::parse(&s(&["--profile", "/tmp/f", "--quick"])).unwrap();
        assert_eq!(o.profile, Some(PathBuf::from("/tmp/f")));
        assert_eq!(o.runs, QUICK_RUNS);
        assert_eq!(OverheadOptions::parse(&s(&[])).unwrap().profile, None);
        let o = OverheadOptions::parse(&s(&["--quick", "--stream-measure-s", "0"])).unwrap();
        assert!(o.stream_measure.is_zero());
        assert_eq!(o.stream_chunks, STREAM_CHUNKS);
        let long = OverheadOptions::parse(&s(&["--stream-chunks", "200"])).unwrap();
        assert_eq!(long.stream_chunks, 200);
        assert!(OverheadOptions::parse(&s(&["--stream-chunks", "0"])).is_err());
        assert_eq!(o.runs, QUICK_RUNS, "quick: 32 KB at 1 worker, 128 KB at 4");
        assert_eq!(o.runs, [shape(1, 8192), shape(4, 32768)]);
        let o = OverheadOptions::parse(&s(&["--quick", "--body-kb", "512"])).unwrap();
        assert_eq!(
            o.runs,
            [shape(1, 131_072), shape(4, 131_072)],
            "sizes given: the product"
        );
        let o = OverheadOptions::parse(&s(&["--rounds", "3", "--quick", "--measure-s", "0.5"]))
            .unwrap();
        assert_eq!(
            (o.rounds, o.measure, o.warmup),
            (3, Duration::from_millis(500), Duration::from_millis(500)),
            "a flag given wins over --quick's value, in any order"
        );
        let o = OverheadOptions::parse(&s(&["--body-kb", "32", "--body-tokens", "100"])).unwrap();
        assert_eq!(
            o.runs[0].body_tokens, 100,
            "the later of the two size flags"
        );
        let o = OverheadOptions::parse(&s(&["--body-tokens", "100", "--body-kb", "32"])).unwrap();
        assert_eq!(o.runs[0].body_tokens, 8192);
        assert!(OverheadOptions::parse(&s(&["--measure-s", "nan"])).is_err());
        for arm in [
            "native-tenancy",
            "extproc-null",
            "extproc-parse",
            "extproc-parse-buffered",
        ] {
            assert!(
                OverheadOptions::default().arms.contains(&arm.to_string()),
                "{arm}"
            );
        }
    }

    #[test]
    fn streamed_bodies_differ_only_in_streaming_and_length() {
        let (b, s) = (bodies(2, 100), stream_bodies(2, 100, STREAM_CHUNKS));
        for (b, s) in b.iter().zip(&s) {
            let mut b: serde_json::Value = serde_json::from_slice(b).unwrap();
            let s: serde_json::Value = serde_json::from_slice(s).unwrap();
            assert_eq!(s["stream"], true);
            assert_eq!(s["max_tokens"], STREAM_CHUNKS);
            assert!(
                s.get("stream_options").is_none(),
                "the client never asks for usage"
            );
            b["stream"] = json!(true);
            b["max_tokens"] = json!(STREAM_CHUNKS);
            assert_eq!(b, s);
        }
    }

    #[test]
    fn every_tenancy_arm_has_its_pair_and_streams() {
        let find = |l: &str| ENVOY_ARMS.iter().find(|a| a.label == l).unwrap();
        for (base, tenancy) in TENANCY_PAIRS {
            let (b, t) = (find(base), find(tenancy));
            assert_eq!((b.gateway, b.tenancy), (t.gateway, false));
            assert!(t.tenancy);
            assert!(streams(base) && streams(tenancy));
        }
        assert!(!streams("native-floor"));
        assert!(
            !streams("extproc-parse"),
            "the processor never sees a response"
        );
        assert_eq!(
            find("extproc-parse").gateway,
            Gateway::ExtProc(ProcessorMode::Parse, BodyMode::FullDuplex),
            "the mode llm-d requires"
        );
        assert_eq!(
            find("extproc-parse-buffered").gateway,
            Gateway::ExtProc(ProcessorMode::Parse, BodyMode::Buffered)
        );
        assert!(find("plain").client_routes() && find("wasm-floor").client_routes());
        assert!(!find("extproc-null").client_routes() && !find("native").client_routes());
    }

    #[test]
    fn plain_templates_spread_over_endpoints() {
        let eps: Vec<SocketAddr> = vec![
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ];
        let t = plain_templates(&bodies(4, 10), &eps, &[]);
        let dest: Vec<&str> = t.iter().map(|t| t.headers[1].1.as_str()).collect();
        assert_eq!(
            dest,
            ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1", "127.0.0.1:2"]
        );
    }
}
