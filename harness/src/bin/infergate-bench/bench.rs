//! `cargo xtask bench overhead|affinity|ttft|soak|memory|flow|lora|pd|replicas|pressure|clusters`: the
//! affinity, TTFT and overhead numbers, each measured as ratios in one run, the soak and
//! per-request memory figures, flow control's dispatch rate and memory per queued request,
//! LoRA adapter loads through the picker against round robin, TTFT with and without
//! prefill/decode disaggregation, the hit ratio through several gateway replicas, and a
//! hotspot with and without spillover to a peer cluster (see `infergate_harness::bench`).

use super::Mode;
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use infergate_harness::bench::calibration::{self, CalibrationArgs, Route, RunSpec};
use infergate_harness::bench::cli::ShapedArgs;
use infergate_harness::bench::clusters::{self, ClustersFlags};
use infergate_harness::bench::flow::{self, FlowFlags};
use infergate_harness::bench::lora::{self, LoraFlags};
use infergate_harness::bench::overhead::{self, OverheadFlags};
use infergate_harness::bench::pd::{self, PdFlags};
use infergate_harness::bench::pressure::{self, PressureOptions};
use infergate_harness::bench::replicas::{self, ReplicasFlags};
use infergate_harness::bench::soak::request_memory::{self, MemoryFlags};
use infergate_harness::bench::soak::{self, SoakFlags};
use infergate_harness::launch::{runtime, Flavor};

/// `cargo xtask bench <name>`: each benchmark and its flags.
#[derive(Debug, Subcommand)]
pub enum Bench {
    /// Requests/s and latency through Envoy: no filter vs Wasm vs native
    ///
    /// Requests/s, latency p50/p99 and Envoy CPU per request, a fast backend behind every
    /// arm: Envoy with no filter (plain), the Wasm and the native filters, each gateway also
    /// with tenancy (*-tenancy) and with flow control on but never saturated (*-flow), each
    /// host's floor (a probe filter that only buffers and reads the body), and the ext_proc
    /// architecture (extproc-null, extproc-parse, extproc-parse-buffered: Envoy's and the
    /// processor's CPU apart and summed); at --concurrency 1,4 x --body-kb 32,128,512,
    /// rounds interleaved; streamed windows time the first chunk. The wasm and native arms
    /// also send each round's bodies through their own Envoy's /rr/ route (filters off by
    /// route): Envoy CPU per request through the gateway / through that route, per round.
    /// That ratio, each gateway's Envoy CPU beyond its floor and against extproc-parse are
    /// judged against the cost targets. Fails when an arm fails more than 1% of its
    /// requests.
    #[command(verbatim_doc_comment)]
    Overhead(OverheadFlags),
    /// The picker at several Envoy worker counts, each flavour, on the calibration workload
    ///
    /// Cache-hit ratio, TTFT p50 and p99 per worker count; exits non-zero unless every
    /// multi-worker run keeps >= 0.97 x the flavour's 1-worker hit ratio and a TTFT p50 at
    /// most 10% above its 1-worker p50, with no failed request.
    #[command(
        verbatim_doc_comment,
        mut_arg("flavors", |a| a.default_value("wasm,native")),
        mut_arg("concurrencies", |a| a.default_value("1,2,4,8"))
    )]
    Affinity(ShapedArgs),
    /// TTFT and cache hits: /rr vs the picker vs the sticky ceiling
    ///
    /// The calibration workload through Envoy's round-robin route (/rr), through the picker
    /// of each flavour, and pinned with no Envoy (the sticky ceiling: each conversation on
    /// one replica); cache-hit ratio and TTFT side by side, each picker against /rr.
    #[command(
        verbatim_doc_comment,
        mut_arg("flavors", |a| a.default_value("wasm,native"))
    )]
    Ttft(ShapedArgs),
    /// The multi-turn workload for N minutes per flavour, with faults, watching memory
    ///
    /// Flavours one after the other; a replica killed and restarted every 30 s, 10% of
    /// turns aborted mid-stream and 5% hostile requests; Envoy's RSS and Wasm VM memory
    /// every 10 s, errors by status x request kind x injected fault, the picker's
    /// in-flight gauges at the end. Exits non-zero unless RSS grows less than the bound
    /// after warm-up, the in-flight gauges are back to 0, every failed request is
    /// explained by a replica kill, and Envoy still serves.
    #[command(verbatim_doc_comment)]
    Soak(SoakFlags),
    /// The most memory one request can make Envoy take (body limit 4 MiB)
    ///
    /// Peak RSS above the level before for each worst-case body (4 MiB of 1e308 in tools,
    /// one 4 MiB string, 100k messages, deep nesting, a tool object of 700k members), one
    /// alone and N at once, a fresh Envoy each time.
    #[command(verbatim_doc_comment)]
    Memory(MemoryFlags),
    /// Flow control at saturation: dispatch rate, and Envoy's memory per queued request
    ///
    /// Enqueue + dispatch per second in process with N queued, for each fairness policy;
    /// then N clients with 32 KB bodies queued behind one slot through each flavour:
    /// Envoy's RSS per queued request; then every client leaves and the queue must empty,
    /// each request counted rejected-context-cancelled.
    #[command(verbatim_doc_comment)]
    Flow(FlowFlags),
    /// LoRA adapter loads, /rr vs the picker with the lora-affinity-scorer
    ///
    /// More adapters than a replica's 2 slots (4 replicas): the same many-adapter
    /// workload (Zipf over the adapters, each adapter's conversations sharing its system
    /// prompt) through /rr and through the picker; loads per 1,000 requests, replicas per
    /// adapter, TTFT p50/p99. Exits non-zero unless every picker arm loads at most a third
    /// as often as /rr with no failed request.
    #[command(verbatim_doc_comment)]
    Lora(LoraFlags),
    /// Prefill/decode disaggregation vs aggregated serving, 4 replicas, through the picker
    ///
    /// A long-prompt workload (6k-token system prompt per conversation, 64-token
    /// questions, 256-token answers, 2 turns, --clients in flight) with the default
    /// scheduling, then with disagg-profile-handler + prefix-based-pd-decider
    /// (nonCachedTokens 1024) and N prefill replicas: TTFT p50/p90/p99, end-to-end p50,
    /// output tokens/s, share of requests prefilled remotely.
    #[command(verbatim_doc_comment)]
    Pd(PdFlags),
    /// The calibration workload through 1, 2 and 4 gateway replicas
    ///
    /// Envoy processes over one simulated pool, each with its own picker state, every turn
    /// on a new connection to a gateway drawn at random (seeded) as an L4 balancer would:
    /// cache-hit ratio (all turns, turns 2+, and turns 2+ by whether their gateway served
    /// the turn before, an earlier turn or none), TTFT p50/p95 and failed requests, each
    /// against the flavour's 1-gateway figure. Fails unless every N-gateway arm keeps 0.95x of the
    /// turns 2+ hit ratio and TTFT p50 within 1.15x.
    #[command(verbatim_doc_comment)]
    Replicas(ReplicasFlags),
    /// The approximate vs the precise prefix index (native), the working set twice the KV
    ///
    /// The calibration workload with a working set twice the pool's KV cache (4 replicas x
    /// 65k tokens), once per index, through the native gateway: client-seen and engine-side
    /// cache-hit ratios, evictions, TTFT p50/p95; fails unless precise beats approx on the
    /// engine's hit ratio and TTFT p50.
    #[command(verbatim_doc_comment)]
    Pressure(PressureOptions),
    /// A hotspot on one cluster, with and without spillover to a peer cluster
    ///
    /// Cluster A (2 simulated replicas) and cluster B (6), each behind its own gateway on
    /// its own loopback address; new conversations sent to A as Poisson arrivals: well
    /// within A's capacity, then about twice it with A alone, then with B as A's peer.
    /// Latency p50/p99 through A's gateway, the share served in B, failed requests; fails
    /// unless the spillover arm's p99 is within 1.2x of the unsaturated arm's and the
    /// no-spillover arm's at least 5x (the hotspot is one).
    #[command(verbatim_doc_comment)]
    Clusters(ClustersFlags),
}

/// Entry point of `cargo xtask bench …`: the flags are parsed and checked (the check
/// that comes before the long build stops here).
pub fn run(which: Bench, mode: Mode) -> Result<()> {
    let which = match which {
        Bench::Overhead(f) => Run::Overhead(f.options()),
        Bench::Affinity(a) => Run::Affinity(a.into_args()),
        Bench::Ttft(a) => Run::Ttft(a.into_args()),
        Bench::Soak(f) => Run::Soak(f.options()),
        Bench::Memory(f) => Run::Memory(f.options()),
        Bench::Flow(f) => Run::Flow(f.options()),
        Bench::Lora(f) => Run::Lora(f.options()),
        Bench::Pd(f) => Run::Pd(f.options()),
        Bench::Replicas(f) => Run::Replicas(f.options()),
        Bench::Pressure(o) => Run::Pressure(o),
        Bench::Clusters(f) => Run::Clusters(f.options()),
    };
    if mode == Mode::Check {
        return Ok(());
    }
    let report = match which {
        Run::Overhead(opts) => runtime()?.block_on(overhead::run(&opts))?,
        Run::Affinity(a) => {
            // The tables are printed before a missed criterion becomes the error.
            affinity(&a)?;
            return Ok(());
        }
        Run::Soak(opts) => {
            // Each flavour's report is printed as it ends; a failed verdict is the error.
            runtime()?.block_on(soak::run(&opts))?;
            return Ok(());
        }
        Run::Pd(opts) => {
            // The table is printed before a missed criterion becomes the error.
            let (text, missed) = runtime()?.block_on(pd::run(&opts))?;
            println!("\n{text}");
            if !missed.is_empty() {
                bail!("bench pd: {}", missed.join("; "));
            }
            return Ok(());
        }
        Run::Memory(opts) => runtime()?.block_on(request_memory::run(&opts))?,
        Run::Flow(opts) => runtime()?.block_on(flow::run(&opts))?,
        Run::Pressure(opts) => {
            // The table is printed before a missed criterion becomes the error.
            let (text, ok) = runtime()?.block_on(pressure::run(&opts))?;
            println!("\n{text}");
            if !ok {
                bail!("bench pressure: the precise index did not beat the approximate one");
            }
            return Ok(());
        }
        Run::Replicas(opts) => {
            // The table is printed before a missed criterion becomes the error.
            let (text, ok) = runtime()?.block_on(replicas::run(&opts))?;
            println!("\n{text}");
            if !ok {
                bail!(
                    "bench replicas: an arm missed its hit-ratio or TTFT bound against 1 gateway"
                );
            }
            return Ok(());
        }
        Run::Lora(opts) => {
            // The table is printed before a missed criterion becomes the error.
            let (text, ok) = runtime()?.block_on(lora::run(&opts))?;
            println!("\n{text}");
            if !ok {
                bail!("bench lora: the picker did not load adapters 3x less often than /rr");
            }
            return Ok(());
        }
        Run::Clusters(opts) => {
            // The table is printed before a missed criterion becomes the error.
            let (text, ok) = runtime()?.block_on(clusters::run(&opts))?;
            println!("\n{text}");
            if !ok {
                bail!("bench clusters: a verdict failed");
            }
            return Ok(());
        }
        Run::Ttft(a) => ttft(&a)?,
    };
    println!("\n{report}");
    Ok(())
}

/// A benchmark with its options.
enum Run {
    Overhead(overhead::OverheadOptions),
    Affinity(CalibrationArgs),
    Ttft(CalibrationArgs),
    Soak(soak::SoakOptions),
    Memory(request_memory::MemoryOptions),
    Flow(flow::FlowOptions),
    Lora(lora::LoraOptions),
    Pd(pd::PdOptions),
    Replicas(replicas::ReplicasOptions),
    Pressure(PressureOptions),
    Clusters(clusters::ClustersOptions),
}

/// `bench affinity`: the picker of every flavour at every Envoy worker count, on one shared
/// simulated pool; prints each flavour's table and fails unless every row meets the
/// criteria (see [`calibration::affinity_table`]).
fn affinity(a: &CalibrationArgs) -> Result<()> {
    let mut specs = Vec::new();
    for &f in &a.flavors {
        for &c in &a.concurrencies {
            specs.push(RunSpec::new(format!("{f} x{c}"), f, c, Route::Picker));
        }
    }
    let cols = runtime()?.block_on(calibration::run(
        a.time_scale,
        a.workload.load(a.quick),
        &a.idle_rule.apply(serde_json::Value::Null),
        &specs,
    ))?;
    let mut out = header("prefix affinity across Envoy workers", a);
    out.push_str(&cols.table());
    let mut missed = Vec::new();
    for &f in &a.flavors {
        let runs: Vec<(u32, calibration::Figures)> = a
            .concurrencies
            .iter()
            .filter_map(|&c| Some((c, cols.figures(Route::Picker, Some(&format!("{f} x{c}")))?)))
            .collect();
        let (text, ok) = calibration::affinity_table(f.name(), &runs);
        out.push('\n');
        out.push_str(&text);
        if !ok {
            missed.push(f.name());
        }
    }
    println!("\n{out}");
    if !missed.is_empty() {
        bail!("affinity criteria not met for {}", missed.join(", "));
    }
    Ok(())
}

/// `bench ttft`: /rr, the picker of every flavour, and the sticky ceiling.
fn ttft(a: &CalibrationArgs) -> Result<String> {
    let (first_flavor, first_workers) = first(a)?;
    let mut specs = vec![RunSpec::new(
        "/rr",
        first_flavor,
        first_workers,
        Route::Baseline,
    )];
    for &f in &a.flavors {
        for &c in &a.concurrencies {
            specs.push(RunSpec::new(format!("{f} x{c}"), f, c, Route::Picker));
        }
    }
    specs.push(RunSpec::new(
        "sticky ceiling",
        first_flavor,
        first_workers,
        Route::Sticky,
    ));
    let (mut out, cols) =
        compare_with_baseline("time to first token: /rr vs the picker", a, &specs, true)?;
    if let Some(c) = cols.figures(Route::Sticky, None) {
        out.push_str(&format!(
            "ceiling (each conversation pinned to one replica, no Envoy): cache-hit ratio \
             {:.1}% (turns 2+: {:.1}%), TTFT p50 {:.0} ms; the first turn of every \
             conversation can hit no cache, which bounds the whole-run ratio\n",
            c.all.cache_hit_ratio * 100.0,
            c.later.cache_hit_ratio * 100.0,
            c.all.ttft_p50_s * 1000.0
        ));
    }
    Ok(out)
}

fn first(a: &CalibrationArgs) -> Result<(Flavor, u32)> {
    match (a.flavors.first(), a.concurrencies.first()) {
        (Some(&f), Some(&c)) => Ok((f, c)),
        _ => bail!("at least one flavour and one concurrency are needed"),
    }
}

/// The title block of a calibration report.
pub fn header(title: &str, a: &CalibrationArgs) -> String {
    format!(
        "{title}\nsimulated pool: 4 replicas × 160k tokens KV, 16k tokens/s prefill, time scale \
         {} (times below are wall-clock); workload: {}; picker: the default \
         config with {}\n\n",
        a.time_scale,
        a.workload.describe(a.quick),
        a.idle_rule.describe()
    )
}

/// Runs `specs` (a `/rr` baseline first, then pickers, maybe more) on the calibration
/// workload and renders the header, the side-by-side table and each picker's ratios against
/// the baseline (`with_targets`: also the pass/fail targets). Shared by `demo` and
/// `bench ttft`; returns the text and the columns for callers that add more lines.
pub fn compare_with_baseline(
    title: &str,
    a: &CalibrationArgs,
    specs: &[RunSpec],
    with_targets: bool,
) -> Result<(String, calibration::Columns)> {
    let cols = runtime()?.block_on(calibration::run(
        a.time_scale,
        a.workload.load(a.quick),
        &a.idle_rule.apply(serde_json::Value::Null),
        specs,
    ))?;
    let mut out = header(title, a);
    out.push_str(&cols.table());
    out.push('\n');
    let baseline = cols
        .figures(Route::Baseline, None)
        .context("the /rr column is missing")?;
    for spec in specs.iter().filter(|s| s.route == Route::Picker) {
        if let Some(p) = cols.figures(Route::Picker, Some(&spec.label)) {
            out.push_str(&calibration::comparison(
                &spec.label,
                &baseline,
                &p,
                with_targets,
            ));
        }
    }
    Ok((out, cols))
}
