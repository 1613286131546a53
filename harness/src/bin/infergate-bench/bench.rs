//! `cargo xtask bench overhead|affinity|ttft|soak|memory|flow|lora|pd|replicas|pressure`: the
//! affinity, TTFT and overhead numbers, each measured as ratios in one run, the soak and
//! per-request memory figures, flow control's dispatch rate and memory per queued request,
//! LoRA adapter loads through the picker against round robin, TTFT with and without
//! prefill/decode disaggregation, and the hit ratio through several gateway replicas (see
//! `infergate_harness::bench`).

use super::Mode;
use anyhow::{bail, Context, Result};
use infergate_harness::bench::calibration::{self, CalibrationArgs, Route, RunSpec};
use infergate_harness::bench::flow::{self, FlowOptions};
use infergate_harness::bench::lora::{self, LoraOptions};
use infergate_harness::bench::overhead::{self, OverheadOptions};
use infergate_harness::bench::pd::{self, PdOptions};
use infergate_harness::bench::pressure::{self, PressureOptions};
use infergate_harness::bench::replicas::{self, ReplicasOptions};
use infergate_harness::bench::soak::request_memory::{self, MemoryOptions};
use infergate_harness::bench::soak::{self, SoakOptions};
use infergate_harness::launch::{runtime, Flavor};

const USAGE: &str =
    "usage: cargo xtask bench <overhead|affinity|ttft|soak|memory|flow|lora|pd|replicas|pressure> [options]
  overhead  requests/s and latency through Envoy: no filter vs Wasm vs native, each gateway
            also with tenancy; streamed windows time the first chunk
            [--connections N] [--concurrency C] [--rounds R] [--measure-s S]
            [--stream-measure-s S (0: none)] [--arms plain,wasm-floor,wasm,wasm-tenancy,
            wasm-flow,native-floor,native,native-tenancy,native-flow] [--quick]
  affinity  the picker at several Envoy worker counts, each flavour on the calibration
            workload: cache-hit ratio, TTFT p50 and p99 per worker count; exits non-zero
            unless every multi-worker run keeps >= 0.97 x the flavour's 1-worker hit ratio
            and a TTFT p50 at most 10% above its 1-worker p50, with no failed request
            [--workers 1,2,4,8 (--concurrency is the same flag)] [--flavor wasm,native]
            [--time-scale S] [--quick: 3 turns per conversation instead of 6]
  ttft      TTFT and cache hits: /rr vs the picker vs the sticky ceiling
            [--flavor wasm,native] [--concurrency 1] [--time-scale S] [--quick]
  soak      the multi-turn workload for N minutes per flavour (one after the other) with a
            replica killed and restarted every 30 s, 10% of turns aborted mid-stream and 5%
            hostile requests; Envoy's RSS and Wasm VM memory every 10 s, errors by status x
            request kind x injected fault, the picker's in-flight gauges at the end; exits
            non-zero unless RSS grows < 1 MB per 100k requests after warm-up, the in-flight
            gauges are back to 0, every failed request is explained by a replica kill, and
            Envoy still serves
            [--minutes N (10)] [--flavor wasm|native|both (both)] [--clients C (32)]
            [--max-growth-mb M: the growth bound; default 1, or 50 for runs under 5 min,
            which are mostly warm-up (RSS still creeps up a few MB per 100k requests) and
            cannot resolve 1 MB, while a gross leak still fails them]
  memory    the most memory one request can make Envoy take, body limit 4 MiB: peak RSS
            above the level before for each worst-case body (4 MiB of 1e308 in tools, one
            4 MiB string, 100k messages, deep nesting), one alone and N at once, a fresh
            Envoy each time [--flavor wasm|native|both (both)] [--parallel N (8)]
  flow      flow control at saturation: enqueue + dispatch per second in process with N
            queued, and Envoy's memory per queued request (N clients with 32 KB bodies
            queued behind one slot), then every client leaves and the queue must empty
            [--queued N (10000)] [--flavor wasm|native|both (both)] [--quick: 1000]
  lora      LoRA adapter loads with more adapters than a replica's 2 slots (4 replicas):
            the same many-adapter workload (Zipf over the adapters, each adapter's
            conversations sharing its system prompt) through /rr and through the picker with
            the lora-affinity-scorer; loads per 1,000 requests, replicas per adapter, TTFT
            p50/p99; exits non-zero unless every picker arm loads at most a third as often
            as /rr with no failed request
            [--flavor wasm,native] [--workers N (1)] [--time-scale S] [--adapters N (8)]
            [--adapter-prefix-tokens T (1024; 0: no shared prompt)]
            [--lora-weight W (2; 0: no LoRA scorer)]
            [--quick: 96 conversations x 2 turns instead of 200 x 5]
  pd        prefill/decode disaggregation vs aggregated serving, 4 replicas, through the
            picker: a long-prompt workload (6k-token system prompt per conversation,
            64-token questions, 256-token answers, 2 turns, --clients in flight) with the default
            scheduling, then with disagg-profile-handler + prefix-based-pd-decider
            (nonCachedTokens 1024) and N prefill replicas; TTFT p50/p90/p99, end-to-end p50,
            output tokens/s, share of requests prefilled remotely
            [--prefill N (1)] [--clients N (8)] [--flavor wasm,native (wasm)] [--workers N (1)]
            [--time-scale S] [--quick: 16 conversations instead of 64]
  replicas  the calibration workload through 1, 2 and 4 gateway replicas (Envoy processes
            over one simulated pool, each with its own picker state), every turn on a new
            connection to a gateway drawn at random as an L4 balancer would: cache-hit
            ratio (all turns, turns 2+), TTFT p50/p95 and failed requests, each against the
            flavour's 1-gateway figure; fails unless every N-gateway arm keeps 0.95x of the
            turns 2+ hit ratio and TTFT p50 within 1.15x
  pressure  the approximate vs the precise prefix index (native) with a working set twice
            the pool's KV: client-seen and engine-side cache-hit ratios, evictions, TTFT
            p50/p95; fails unless precise beats approx on the engine's hit ratio and TTFT p50
            [--workers N (1)] [--time-scale S] [--quick: 3 turns per conversation]
            [--flavor wasm|native|both (both)] [--gateways 1,2,4] [--workers N (1)]
            [--time-scale S] [--quick: 3 turns per conversation instead of 6]";

/// Entry point of `cargo xtask bench …`.
pub fn run(args: &[String], mode: Mode) -> Result<()> {
    let (which, rest) = match args.split_first() {
        Some((w, rest)) => (w.as_str(), rest),
        None => bail!("{USAGE}"),
    };
    if matches!(which, "-h" | "--help" | "help") {
        println!("{USAGE}");
        return Ok(());
    }
    // Bad arguments fail in the check that comes before the (long) build.
    match which {
        "overhead" => {
            OverheadOptions::parse(rest)?;
        }
        "affinity" | "ttft" => {
            CalibrationArgs::parse(rest, &[Flavor::Wasm], &[1])?;
        }
        "lora" => {
            LoraOptions::parse(rest)?;
        }
        "pd" => {
            PdOptions::parse(rest)?;
        }
        "soak" => {
            SoakOptions::parse(rest)?;
        }
        "memory" => {
            MemoryOptions::parse(rest)?;
        }
        "flow" => {
            FlowOptions::parse(rest)?;
        }
        "replicas" => {
            ReplicasOptions::parse(rest)?;
        }
        "pressure" => {
            PressureOptions::parse(rest)?;
        }
        other => bail!("unknown benchmark `{other}`\n{USAGE}"),
    }
    if mode == Mode::Check {
        return Ok(());
    }
    let report = match which {
        "overhead" => {
            let opts = OverheadOptions::parse(rest)?;
            runtime()?.block_on(overhead::run(&opts))?
        }
        "affinity" => {
            // The tables are printed before a missed criterion becomes the error.
            affinity(rest)?;
            return Ok(());
        }
        "soak" => {
            // Each flavour's report is printed as it ends; a failed verdict is the error.
            runtime()?.block_on(soak::run(&SoakOptions::parse(rest)?))?;
            return Ok(());
        }
        "pd" => {
            // The table is printed before a missed criterion becomes the error.
            let (text, missed) = runtime()?.block_on(pd::run(&PdOptions::parse(rest)?))?;
            println!("\n{text}");
            if !missed.is_empty() {
                bail!("bench pd: {}", missed.join("; "));
            }
            return Ok(());
        }
        "memory" => runtime()?.block_on(request_memory::run(&MemoryOptions::parse(rest)?))?,
        "flow" => runtime()?.block_on(flow::run(&FlowOptions::parse(rest)?))?,
        "pressure" => {
            // The table is printed before a missed criterion becomes the error.
            let opts = PressureOptions::parse(rest)?;
            let (text, ok) = runtime()?.block_on(pressure::run(&opts))?;
            println!("\n{text}");
            if !ok {
                bail!("bench pressure: the precise index did not beat the approximate one");
            }
            return Ok(());
        }
        "replicas" => {
            // The table is printed before a missed criterion becomes the error.
            let opts = ReplicasOptions::parse(rest)?;
            let (text, ok) = runtime()?.block_on(replicas::run(&opts))?;
            println!("\n{text}");
            if !ok {
                bail!(
                    "bench replicas: an arm missed its hit-ratio or TTFT bound against 1 gateway"
                );
            }
            return Ok(());
        }
        "lora" => {
            // The table is printed before a missed criterion becomes the error.
            let (text, ok) = runtime()?.block_on(lora::run(&LoraOptions::parse(rest)?))?;
            println!("\n{text}");
            if !ok {
                bail!("bench lora: the picker did not load adapters 3x less often than /rr");
            }
            return Ok(());
        }
        _ => ttft(rest)?,
    };
    println!("\n{report}");
    Ok(())
}

/// The Envoy worker counts `bench affinity` compares by default.
const AFFINITY_WORKERS: [u32; 4] = [1, 2, 4, 8];

/// `bench affinity`: the picker of every flavour at every Envoy worker count, on one shared
/// simulated pool; prints each flavour's table and fails unless every row meets the
/// criteria (see [`calibration::affinity_table`]).
fn affinity(args: &[String]) -> Result<()> {
    let a = CalibrationArgs::parse(args, &[Flavor::Wasm, Flavor::Native], &AFFINITY_WORKERS)?;
    let mut specs = Vec::new();
    for &f in &a.flavors {
        for &c in &a.concurrencies {
            specs.push(RunSpec::new(format!("{f} x{c}"), f, c, Route::Picker));
        }
    }
    let cols = runtime()?.block_on(calibration::run(a.time_scale, a.quick, &specs))?;
    let mut out = header("prefix affinity across Envoy workers", &a);
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
fn ttft(args: &[String]) -> Result<String> {
    let a = CalibrationArgs::parse(args, &[Flavor::Wasm, Flavor::Native], &[1])?;
    let (first_flavor, first_workers) = first(&a)?;
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
        compare_with_baseline("time to first token: /rr vs the picker", &a, &specs, true)?;
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
    let w = calibration::workload(a.quick);
    format!(
        "{title}\nsimulated pool: 4 replicas × 160k tokens KV, 16k tokens/s prefill, time scale \
         {} (times below are wall-clock); workload: {} conversations × {} turns, ~{}-token \
         system prompts, concurrency 16\n\n",
        a.time_scale, w.conversations, w.turns, w.system_tokens
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
    let cols = runtime()?.block_on(calibration::run(a.time_scale, a.quick, specs))?;
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
