//! The report of `bench overhead`: one column per arm, ratios against `plain`, each
//! gateway's Envoy CPU beyond its floor with the verdicts ([`super::overhead::targets`]), what
//! tenancy adds to each flavour (Envoy CPU per request: native auth + quota ≤ 3 µs; the
//! first chunk of a stream: ≤ 0.1 ms at p50), the gateways against the ext_proc arms
//! (Envoy plus processor CPU per request and added p50: native ≤ 1/3 of `extproc-parse`,
//! Wasm below it) and the filter logic's own cost for comparison; and the summary of
//! every arm over the runs (worker counts × body sizes).

use std::time::Duration;

use super::closed_loop::{ClosedLoop, LoopResult};
use super::logic::LogicCost;
use super::overhead::first_chunk::{StreamLoop, StreamResult};
use super::overhead::targets::{self, run_name, BeyondFloor, SameEnvoy};
use super::overhead::{OverheadOptions, RunShape, FLOW_PAIRS, TENANCY_PAIRS};
use super::report::{median, ms, percentile_us, table};
use crate::launch::extproc::ExtProcStack;
use crate::launch::{Envoy, Stack};

/// What an arm's client talks to.
#[derive(Debug)]
pub(super) enum Proxy {
    /// Envoy with its gateway filters (or none, or a floor's probe).
    Gateway(Box<Stack>),
    /// Envoy with the `ext_proc` filter and its processor.
    ExtProc(Box<ExtProcStack>),
}

impl Proxy {
    /// The Envoy.
    pub(super) fn envoy(&self) -> &Envoy {
        match self {
            Proxy::Gateway(s) => s.envoy(),
            Proxy::ExtProc(s) => s.envoy(),
        }
    }

    /// The external processor's process id, on an ext_proc arm.
    pub(super) fn processor_pid(&self) -> Option<u32> {
        match self {
            Proxy::Gateway(_) => None,
            Proxy::ExtProc(s) => s.processor().pid(),
        }
    }
}

/// One column of the report.
pub(super) struct Arm {
    /// Column label: `direct`, `plain`, `wasm-floor`, `wasm`, `native-floor` or `native`.
    pub(super) label: &'static str,
    /// The Envoy in front of the backend (`None` for `direct`).
    pub(super) proxy: Option<Proxy>,
    /// The closed-loop client aimed at it.
    pub(super) client: ClosedLoop,
    /// Every measured window, merged.
    pub(super) total: LoopResult,
    /// Requests/s of each round.
    pub(super) round_rps: Vec<f64>,
    /// Envoy CPU time over the measured windows.
    pub(super) envoy_cpu: Duration,
    /// Envoy CPU per request of each round's measured window, µs.
    pub(super) round_cpu_us: Vec<f64>,
    /// Of [`Arm::envoy_cpu`], the main thread's ([`super::report::main_thread_cpu`]).
    pub(super) main_cpu: Duration,
    /// The external processor's CPU time over the measured windows (ext_proc arms).
    pub(super) processor_cpu: Duration,
    /// Its CPU per request of each round's measured window, µs.
    pub(super) round_processor_cpu_us: Vec<f64>,
    /// `POST`s the backend saw during the measured windows.
    pub(super) backend_posts: u64,
    /// Their body bytes.
    pub(super) backend_bytes: u64,
    /// The streamed windows (none for the floors, or when they are off).
    pub(super) stream: Option<StreamArm>,
    /// A default gateway's windows through its own Envoy's plain route.
    pub(super) same_envoy_plain: Option<SameEnvoyPlain>,
}

/// A default gateway arm's second window each round: the same Envoy, the same bodies, on
/// its `/rr/` route, where the gateway filters are disabled per route and Envoy alone
/// round-robins over the same backend. Its Envoy CPU per request is the denominator of the
/// gateway's cost ratio: one process, one configuration, the filters on or off by route.
pub(super) struct SameEnvoyPlain {
    /// The closed-loop client aimed at `/rr/v1/chat/completions`.
    pub(super) client: ClosedLoop,
    /// Every window, merged.
    pub(super) total: LoopResult,
    /// Envoy CPU time over the windows.
    pub(super) envoy_cpu: Duration,
    /// Envoy CPU per request of each round's window, µs.
    pub(super) round_cpu_us: Vec<f64>,
}

impl SameEnvoyPlain {
    /// Envoy CPU per request over every window, µs.
    pub(super) fn cpu_us(&self) -> Option<f64> {
        (self.total.ok > 0).then(|| self.envoy_cpu.as_secs_f64() * 1e6 / self.total.ok as f64)
    }
}

/// An arm's streamed windows.
pub(super) struct StreamArm {
    /// The streaming closed loop aimed at the arm.
    pub(super) client: StreamLoop,
    /// Every streamed window, merged.
    pub(super) total: StreamResult,
    /// Envoy CPU time over the streamed windows.
    pub(super) envoy_cpu: Duration,
    /// Envoy CPU per stream of each round, µs.
    pub(super) round_cpu_us: Vec<f64>,
    /// First-chunk p50 of each round, µs.
    pub(super) round_first_chunk_p50_us: Vec<u32>,
    /// Streams the backend answered during the streamed windows.
    pub(super) backend_streams: u64,
    /// Of those, the ones whose body asked for usage (forced on by a gateway).
    pub(super) usage_forced: u64,
}

impl Arm {
    pub(super) fn envoy_pid(&self) -> Option<u32> {
        self.proxy.as_ref().and_then(|p| p.envoy().pid())
    }

    pub(super) fn processor_pid(&self) -> Option<u32> {
        self.proxy.as_ref().and_then(Proxy::processor_pid)
    }
}

/// The report: the side-by-side table, the ratio verdicts and the filter-logic cost.
pub(super) fn render(
    arms: &[Arm],
    opts: &OverheadOptions,
    shape: RunShape,
    logic: &LogicCost,
) -> String {
    let mut lat: Vec<Vec<u32>> = arms.iter().map(|a| a.total.latencies_us.clone()).collect();
    for l in &mut lat {
        l.sort_unstable();
    }
    let p = |i: usize, q: f64| lat.get(i).map(|l| percentile_us(l, q)).unwrap_or(0);
    let plain = arms.iter().position(|a| a.label == "plain").unwrap_or(0);
    let plain_rps = arms.get(plain).map(|a| a.total.rps()).unwrap_or(0.0);
    let ratio = |a: &Arm| {
        if plain_rps > 0.0 {
            a.total.rps() / plain_rps
        } else {
            0.0
        }
    };
    let round_ratio = |a: &Arm| {
        let base = arms
            .get(plain)
            .map(|b| b.round_rps.clone())
            .unwrap_or_default();
        let r: Vec<f64> = a
            .round_rps
            .iter()
            .zip(&base)
            .filter(|(_, b)| **b > 0.0)
            .map(|(x, b)| x / b)
            .collect();
        median(&r)
    };
    let added = |i: usize, q: f64| {
        let d = i64::from(p(i, q)) - i64::from(p(plain, q));
        format!("{:+.2} ms", d as f64 / 1000.0)
    };
    let cells = |f: &dyn Fn(usize, &Arm) -> String| -> Vec<String> {
        arms.iter().enumerate().map(|(i, a)| f(i, a)).collect()
    };
    let rows: Vec<(String, Vec<String>)> = vec![
        (
            "requests/s".into(),
            cells(&|_, a| format!("{:.0}", a.total.rps())),
        ),
        (
            "rps ÷ plain (totals)".into(),
            cells(&|_, a| format!("{:.3}", ratio(a))),
        ),
        (
            "rps ÷ plain (median of rounds)".into(),
            cells(&|_, a| format!("{:.3}", round_ratio(a))),
        ),
        ("latency p50".into(), cells(&|i, _| ms(p(i, 50.0)))),
        ("latency p99".into(), cells(&|i, _| ms(p(i, 99.0)))),
        ("added p50 vs plain".into(), cells(&|i, _| added(i, 50.0))),
        ("added p99 vs plain".into(), cells(&|i, _| added(i, 99.0))),
        (
            "Envoy CPU per request".into(),
            cells(&|_, a| cpu_per_request(a)),
        ),
        (
            "Envoy CPU per request (median of rounds)".into(),
            cells(&|_, a| {
                if a.proxy.is_none() || a.round_cpu_us.is_empty() {
                    "-".into()
                } else {
                    format!("{:.1} µs", median(&a.round_cpu_us))
                }
            }),
        ),
        (
            "of which Envoy's main thread".into(),
            cells(&|_, a| main_us(a).map_or_else(|| "-".into(), |us| format!("{us:.1} µs"))),
        ),
        ("Envoy CPU busy (cores)".into(), cells(&|_, a| cpu_busy(a))),
        (
            "plain CPU ÷ arm CPU per request".into(),
            cells(&|_, a| {
                cpu_ratio(arms.get(plain), a)
                    .map(|r| format!("{r:.3}"))
                    .unwrap_or_else(|| "-".into())
            }),
        ),
        (
            "requests measured".into(),
            cells(&|_, a| a.total.ok.to_string()),
        ),
        ("errors".into(), cells(&|_, a| errors(a))),
        (
            "body bytes at backend/req".into(),
            cells(&|_, a| bytes_per_post(a)),
        ),
    ];
    let mut rows = rows;
    if arms.iter().any(|a| processor_us(a).is_some()) {
        // After the Envoy CPU rows: the processor's, and the sum.
        let at = rows
            .iter()
            .position(|r| r.0 == "Envoy CPU busy (cores)")
            .unwrap_or(rows.len());
        let plain_total = arms.get(plain).and_then(total_us);
        let extra = vec![
            (
                "processor CPU per request".to_string(),
                cells(&|_, a| {
                    processor_us(a).map_or_else(|| "-".into(), |us| format!("{us:.1} µs"))
                }),
            ),
            (
                "processor CPU per request (median of rounds)".to_string(),
                cells(&|_, a| {
                    if a.round_processor_cpu_us.is_empty() {
                        "-".into()
                    } else {
                        format!("{:.1} µs", median(&a.round_processor_cpu_us))
                    }
                }),
            ),
            (
                "Envoy + processor CPU per request".to_string(),
                cells(&|_, a| total_us(a).map_or_else(|| "-".into(), |us| format!("{us:.1} µs"))),
            ),
            (
                "total CPU added vs plain".to_string(),
                cells(&|_, a| match (total_us(a), plain_total) {
                    (Some(t), Some(p)) => format!("{:+.1} µs", t - p),
                    _ => "-".into(),
                }),
            ),
        ];
        rows.splice(at..at, extra);
    }
    let has_streams = arms.iter().any(|a| a.stream.is_some());
    if has_streams {
        rows.extend(stream_rows(arms));
    }
    let mut header = vec!["arm".to_string()];
    header.extend(arms.iter().map(|a| a.label.to_string()));
    let streamed = if !has_streams {
        String::new()
    } else {
        format!(
            "; streamed windows of {:.1} s, {} chunks per response",
            opts.stream_measure.as_secs_f64(),
            opts.stream_chunks
        )
    };
    let mut out = format!(
        "proxy overhead: {} connections {}, Envoy --concurrency {}, {} rounds × {:.1} s \
         per arm (order rotated), bodies of {} tokens (~{} KB){streamed}\n\n",
        opts.connections,
        opts.arrivals(),
        shape.concurrency,
        opts.rounds,
        opts.measure.as_secs_f64(),
        shape.body_tokens,
        shape.body_tokens * 4 / 1024
    );
    out.push_str(&table(&header, &rows));
    out.push('\n');
    for label in ["wasm", "native"] {
        if let Some(a) = arms.iter().find(|a| a.label == label) {
            let cpu = cpu_ratio(arms.get(plain), a).unwrap_or(0.0);
            out.push_str(&format!(
                "{label}/plain requests/s = {:.3} (median of rounds {:.3}); plain ÷ {label} \
                 Envoy CPU per request {cpu:.3}\n",
                ratio(a),
                round_ratio(a)
            ));
        }
    }
    out.push_str(&targets::render(arms, shape));
    out.push_str(&targets::render_same_envoy(arms, shape));
    for (base, tenancy) in TENANCY_PAIRS {
        let (Some(b), Some(t)) = (
            arms.iter().find(|a| a.label == base),
            arms.iter().find(|a| a.label == tenancy),
        ) else {
            continue;
        };
        out.push_str(&tenancy_text(b, t, opts.stream_chunks));
    }
    for (base, flow) in FLOW_PAIRS {
        let (Some(b), Some(f)) = (
            arms.iter().find(|a| a.label == base),
            arms.iter().find(|a| a.label == flow),
        ) else {
            continue;
        };
        out.push_str(&flow_text(b, f));
    }
    out.push_str(&extproc_text(arms));
    out.push_str(&format!(
        "filter logic per request, native, in-process: body parse {:.1} µs (router), parse + \
         prefix hashes {:.1} µs (picker; hashes alone {:.1} µs), flow admission when not \
         saturated {:.3} µs\n",
        logic.parse_us, logic.parse_and_hash_us, logic.hash_us, logic.admit_us
    ));
    out
}

/// The streamed windows' rows (`-` for an arm without them).
fn stream_rows(arms: &[Arm]) -> Vec<(String, Vec<String>)> {
    let firsts: Vec<Vec<u32>> = arms.iter().map(sorted_firsts).collect();
    let wholes: Vec<Vec<u32>> = arms
        .iter()
        .map(|a| {
            let mut v = a
                .stream
                .as_ref()
                .map(|s| s.total.total_us.clone())
                .unwrap_or_default();
            v.sort_unstable();
            v
        })
        .collect();
    let cells = |f: &dyn Fn(usize, &StreamArm) -> String| -> Vec<String> {
        arms.iter()
            .enumerate()
            .map(|(i, a)| a.stream.as_ref().map_or_else(|| "-".into(), |s| f(i, s)))
            .collect()
    };
    let pct = |v: &[Vec<u32>], i: usize, q: f64| v.get(i).map_or(0, |l| percentile_us(l, q));
    let headers: Vec<Vec<u32>> = arms
        .iter()
        .map(|a| {
            let mut v = a
                .stream
                .as_ref()
                .map(|s| s.total.headers_us.clone())
                .unwrap_or_default();
            v.sort_unstable();
            v
        })
        .collect();
    vec![
        (
            "streamed: response headers p50".into(),
            cells(&|i, _| ms3(pct(&headers, i, 50.0))),
        ),
        (
            "streamed: first chunk p50".into(),
            cells(&|i, _| ms3(pct(&firsts, i, 50.0))),
        ),
        (
            "streamed: first chunk p99".into(),
            cells(&|i, _| ms3(pct(&firsts, i, 99.0))),
        ),
        (
            "streamed: whole stream p50".into(),
            cells(&|i, _| ms3(pct(&wholes, i, 50.0))),
        ),
        (
            "streamed: Envoy CPU per stream".into(),
            cells(&|_, s| stream_cpu_us(s).map_or_else(|| "-".into(), |us| format!("{us:.1} µs"))),
        ),
        (
            "streamed: streams measured".into(),
            cells(&|_, s| s.total.ok.to_string()),
        ),
        (
            "streamed: errors".into(),
            cells(&|_, s| match &s.total.first_error {
                Some(e) if s.total.errors > 0 => format!("{} ({e})", s.total.errors),
                _ => s.total.errors.to_string(),
            }),
        ),
        (
            "streamed: usage forced upstream".into(),
            cells(&|_, s| format!("{}/{}", s.usage_forced, s.backend_streams)),
        ),
        (
            "streamed: quota headers on replies".into(),
            cells(&|_, s| format!("{}/{}", s.total.quota_headers, s.total.ok)),
        ),
    ]
}

/// Microseconds as milliseconds to the µs: first chunks differ by tenths of a millisecond.
fn ms3(us: u32) -> String {
    format!("{:.3} ms", f64::from(us) / 1000.0)
}

fn sorted_firsts(a: &Arm) -> Vec<u32> {
    let mut v = a
        .stream
        .as_ref()
        .map(|s| s.total.first_chunk_us.clone())
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// Envoy CPU per stream in µs, when there is a reading.
fn stream_cpu_us(s: &StreamArm) -> Option<f64> {
    (s.total.ok > 0 && !s.envoy_cpu.is_zero())
        .then(|| s.envoy_cpu.as_secs_f64() * 1e6 / s.total.ok as f64)
}

/// The native auth + quota budget, µs of Envoy CPU per request.
const NATIVE_TENANCY_BUDGET_US: f64 = 3.0;

/// The first-chunk p50 tenancy may add, ms.
const FIRST_CHUNK_BUDGET_MS: f64 = 0.1;

/// Per-round differences `t - b` (rounds paired by index).
pub(super) fn round_differences(b: &[f64], t: &[f64]) -> Vec<f64> {
    b.iter().zip(t).map(|(b, t)| t - b).collect()
}

fn spread(d: &[f64]) -> (f64, f64) {
    let lo = d.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = d.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if d.is_empty() {
        (0.0, 0.0)
    } else {
        (lo, hi)
    }
}

/// What tenancy adds to `b`'s flavour: Envoy CPU per request, and on streams the first
/// chunk and Envoy CPU per stream, with the verdicts.
fn tenancy_text(b: &Arm, t: &Arm, stream_chunks: u32) -> String {
    let flavour = b.label;
    let mut out = String::new();
    if let (Some(cb), Some(ct)) = (cpu_us(b), cpu_us(t)) {
        let d = round_differences(&b.round_cpu_us, &t.round_cpu_us);
        let (lo, hi) = spread(&d);
        let verdict = if flavour == "native" {
            let diff = ct - cb;
            format!(
                "native auth + quota target ≤ {NATIVE_TENANCY_BUDGET_US:.0} µs: {} (the \
                 difference also holds the usage stage on the JSON answer and the billing record)",
                if diff <= NATIVE_TENANCY_BUDGET_US {
                    "met"
                } else {
                    "MISSED"
                }
            )
        } else {
            "reported, no target".into()
        };
        out.push_str(&format!(
            "{flavour} tenancy (auth + quota + usage stages, API key, limits that never refuse): \
             Envoy CPU per request {cb:.1} → {ct:.1} µs = {:+.1} µs (median of per-round \
             differences {:+.1} µs, rounds from {lo:+.1} to {hi:+.1}); {verdict}\n",
            ct - cb,
            median(&d)
        ));
    }
    if let (Some(sb), Some(st)) = (&b.stream, &t.stream) {
        let (fb, ft) = (sorted_firsts(b), sorted_firsts(t));
        if fb.is_empty() || ft.is_empty() {
            return out;
        }
        let (pb, pt) = (percentile_us(&fb, 50.0), percentile_us(&ft, 50.0));
        let added_ms = (f64::from(pt) - f64::from(pb)) / 1000.0;
        let per_round: Vec<f64> = sb
            .round_first_chunk_p50_us
            .iter()
            .zip(&st.round_first_chunk_p50_us)
            .map(|(b, t)| (f64::from(*t) - f64::from(*b)) / 1000.0)
            .collect();
        let verdict = if added_ms <= FIRST_CHUNK_BUDGET_MS {
            "met"
        } else {
            "MISSED"
        };
        let cpu = match (stream_cpu_us(sb), stream_cpu_us(st)) {
            (Some(x), Some(y)) => format!(
                "Envoy CPU per stream {x:.1} → {y:.1} µs = {:+.1} µs (median of rounds {:+.1} µs)",
                y - x,
                median(&round_differences(&sb.round_cpu_us, &st.round_cpu_us))
            ),
            _ => "no CPU reading".into(),
        };
        out.push_str(&format!(
            "{flavour} tenancy, streamed ({} chunks through the usage stage): first chunk p50 \
             {} → {} = {added_ms:+.3} ms (median of per-round differences {:+.3} ms; target ≤ \
             +{FIRST_CHUNK_BUDGET_MS} ms: {verdict}); {cpu}; usage forced upstream on {}/{} \
             streams, usage seen by the client on none of {} checked\n",
            stream_chunks,
            ms3(pb),
            ms3(pt),
            median(&per_round),
            st.usage_forced,
            st.backend_streams,
            st.total.ok
        ));
    }
    out
}

/// The p50 latency flow control may add when the pool is not saturated, µs.
const FLOW_P50_BUDGET_US: f64 = 5.0;

/// What flow control adds to `b`'s flavour when nothing waits: Envoy CPU and p50 latency
/// per request.
fn flow_text(b: &Arm, f: &Arm) -> String {
    let flavour = b.label;
    let p50 = |a: &Arm| {
        let mut l = a.total.latencies_us.clone();
        l.sort_unstable();
        f64::from(percentile_us(&l, 50.0))
    };
    let added = p50(f) - p50(b);
    let verdict = if added <= FLOW_P50_BUDGET_US {
        "met"
    } else {
        "MISSED (through Envoy this difference is within the run-to-run noise; the \
         in-process admission cost is below)"
    };
    let cpu = match (cpu_us(b), cpu_us(f)) {
        (Some(cb), Some(cf)) => format!(
            "Envoy CPU per request {cb:.1} → {cf:.1} µs = {:+.1} µs (median of per-round \
             differences {:+.1} µs)",
            cf - cb,
            median(&round_differences(&b.round_cpu_us, &f.round_cpu_us))
        ),
        _ => "no CPU reading".into(),
    };
    format!(
        "{flavour} flow control, not saturated (every request through the flow gate, none \
         queued): {cpu}; latency p50 {:+.0} µs (target ≤ +{FLOW_P50_BUDGET_US:.0} µs: \
         {verdict})\n",
        added
    )
}

/// The external-processor arm every gateway is set against, and its floor.
const EXTPROC_REFERENCE: &str = "extproc-parse";
const EXTPROC_FLOOR: &str = "extproc-null";

/// A gateway arm's share of the reference allowed by the targets: native ≤ 1/3 of
/// `extproc-parse`'s Envoy + processor CPU and of its added p50; Wasm below it (≤ 1).
const EXTPROC_SHARES: [(&str, f64); 2] = [("native", 1.0 / 3.0), ("wasm", 1.0)];

/// p50 latency in µs over every measured window.
fn p50_us(a: &Arm) -> f64 {
    let mut l = a.total.latencies_us.clone();
    l.sort_unstable();
    f64::from(percentile_us(&l, 50.0))
}

/// The gateways against the ext_proc arms: Envoy + processor CPU per request and the p50
/// added over `plain`, with the verdicts; nothing without `extproc-parse`.
fn extproc_text(arms: &[Arm]) -> String {
    let find = |l: &str| arms.iter().find(|a| a.label == l);
    let (Some(reference), Some(plain)) = (find(EXTPROC_REFERENCE), find("plain")) else {
        return String::new();
    };
    let added = |a: &Arm| p50_us(a) - p50_us(plain);
    let describe = |a: &Arm| {
        format!(
            "{} {} CPU per request (Envoy {} + processor {}), p50 {:+.0} µs over plain",
            a.label,
            total_us(a).map_or_else(|| "-".into(), |t| format!("{t:.1} µs")),
            cpu_us(a).map_or_else(|| "-".into(), |t| format!("{t:.1} µs")),
            processor_us(a).map_or_else(|| "-".into(), |t| format!("{t:.1} µs")),
            added(a)
        )
    };
    let mut out = format!("ext_proc reference: {}", describe(reference));
    if let Some(floor) = find(EXTPROC_FLOOR) {
        out.push_str(&format!("; its floor: {}", describe(floor)));
    }
    if let Some(b) = find("extproc-parse-buffered") {
        out.push_str(&format!("; buffered: {}", describe(b)));
    }
    out.push('\n');
    let Some(ref_total) = total_us(reference) else {
        return out;
    };
    let ref_added = added(reference);
    for (label, share) in EXTPROC_SHARES {
        let Some(a) = find(label) else { continue };
        let Some(total) = total_us(a) else { continue };
        let bound = if share < 1.0 { "≤ 1/3 of" } else { "below" };
        let cpu_ok = if share < 1.0 {
            total <= ref_total * share
        } else {
            total < ref_total
        };
        let lat_ok = if share < 1.0 {
            added(a) <= ref_added * share
        } else {
            added(a) < ref_added
        };
        let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
        out.push_str(&format!(
            "{label} vs {EXTPROC_REFERENCE}: total CPU per request {total:.1} µs = {:.3} of \
             {ref_total:.1} µs (target {bound} it: {}); added p50 {:+.0} µs vs \
             {ref_added:+.0} µs (target {bound} it: {})\n",
            total / ref_total,
            verdict(cpu_ok),
            added(a),
            verdict(lat_ok)
        ));
    }
    out
}

/// An arm's CPU per request in one run, for the summary.
struct SummaryCell {
    label: &'static str,
    total_us: Option<f64>,
    added_p50_us: f64,
}

/// One run's line of the summary.
pub(super) struct RunSummary {
    shape: RunShape,
    cells: Vec<SummaryCell>,
    /// Each gateway arm beyond its floor.
    beyond_floor: Vec<BeyondFloor>,
    /// Each default gateway against its own Envoy's plain route.
    same_envoy: Vec<SameEnvoy>,
}

impl RunSummary {
    /// What the summary keeps of a run's arms.
    pub(super) fn of(shape: RunShape, arms: &[Arm]) -> RunSummary {
        let plain = arms.iter().find(|a| a.label == "plain").map_or(0.0, p50_us);
        RunSummary {
            shape,
            cells: arms
                .iter()
                .map(|a| SummaryCell {
                    label: a.label,
                    total_us: total_us(a),
                    added_p50_us: p50_us(a) - plain,
                })
                .collect(),
            beyond_floor: BeyondFloor::of(arms, shape),
            same_envoy: SameEnvoy::of(arms, shape),
        }
    }
}

/// Every arm over every run: Envoy + processor CPU per request, and the p50 added over
/// `plain`.
pub(super) fn summary(runs: &[RunSummary]) -> String {
    let cells: Vec<(RunShape, &[SummaryCell])> =
        runs.iter().map(|r| (r.shape, r.cells.as_slice())).collect();
    let floors: Vec<(RunShape, &[BeyondFloor])> = runs
        .iter()
        .map(|r| (r.shape, r.beyond_floor.as_slice()))
        .collect();
    let same: Vec<(RunShape, &[SameEnvoy])> = runs
        .iter()
        .map(|r| (r.shape, r.same_envoy.as_slice()))
        .collect();
    format!(
        "bench overhead summary: per arm and run, Envoy + processor CPU per request / p50 \
         latency added over plain\n\n{}\n{}\n{}",
        per_run_table(
            &cells,
            |c| c.label,
            |c| format!(
                "{} / {:+.2} ms",
                c.total_us
                    .map_or_else(|| "-".into(), |t| format!("{t:.1} µs")),
                c.added_p50_us / 1000.0
            )
        ),
        targets::same_envoy_summary(&same),
        targets::summary(&floors)
    )
}

/// A table with a row per arm, in the order the runs first name them, and a column per run:
/// `cell` of the arm's entry in that run, `not run` where the run has none.
pub(super) fn per_run_table<C>(
    runs: &[(RunShape, &[C])],
    label: impl Fn(&C) -> &'static str,
    cell: impl Fn(&C) -> String,
) -> String {
    let mut labels: Vec<&'static str> = Vec::new();
    for c in runs.iter().flat_map(|(_, cells)| cells.iter()) {
        if !labels.contains(&label(c)) {
            labels.push(label(c));
        }
    }
    let mut header = vec!["arm".to_string()];
    header.extend(runs.iter().map(|(shape, _)| run_name(*shape)));
    let rows: Vec<(String, Vec<String>)> = labels
        .iter()
        .map(|l| {
            let cells = runs
                .iter()
                .map(|(_, cells)| {
                    cells
                        .iter()
                        .find(|c| label(c) == *l)
                        .map_or_else(|| "not run".into(), &cell)
                })
                .collect();
            (l.to_string(), cells)
        })
        .collect();
    table(&header, &rows)
}

/// The external processor's CPU time per request in µs (`None` on an arm without one).
fn processor_us(a: &Arm) -> Option<f64> {
    (!a.round_processor_cpu_us.is_empty() && a.total.ok > 0)
        .then(|| a.processor_cpu.as_secs_f64() * 1e6 / a.total.ok as f64)
}

/// Envoy's and the processor's CPU per request together (Envoy's alone without a
/// processor); `None` without an Envoy CPU reading.
fn total_us(a: &Arm) -> Option<f64> {
    Some(cpu_us(a)? + processor_us(a).unwrap_or(0.0))
}

/// Envoy CPU time per request in µs (`None` without an Envoy, a CPU reading or requests).
pub(super) fn cpu_us(a: &Arm) -> Option<f64> {
    (!a.envoy_cpu.is_zero() && a.total.ok > 0)
        .then(|| a.envoy_cpu.as_secs_f64() * 1e6 / a.total.ok as f64)
}

/// The main thread's share of an arm's Envoy CPU per request, µs.
pub(super) fn main_us(a: &Arm) -> Option<f64> {
    (a.proxy.is_some() && a.total.ok > 0)
        .then(|| a.main_cpu.as_secs_f64() * 1e6 / a.total.ok as f64)
}

fn cpu_per_request(a: &Arm) -> String {
    cpu_us(a).map_or_else(|| "-".into(), |us| format!("{us:.1} µs"))
}

/// `plain`'s Envoy CPU per request ÷ `a`'s: the requests/s ratio Envoy would reach if it
/// had a core to itself and were the only bottleneck.
fn cpu_ratio(plain: Option<&Arm>, a: &Arm) -> Option<f64> {
    let per = |x: &Arm| {
        (x.proxy.is_some() && x.total.ok > 0).then(|| x.envoy_cpu.as_secs_f64() / x.total.ok as f64)
    };
    let (p, x) = (per(plain?)?, per(a)?);
    (x > 0.0).then(|| p / x)
}

fn cpu_busy(a: &Arm) -> String {
    let s = a.total.elapsed.as_secs_f64();
    if a.proxy.is_none() || s <= 0.0 {
        return "-".into();
    }
    format!("{:.2}", a.envoy_cpu.as_secs_f64() / s)
}

fn errors(a: &Arm) -> String {
    match &a.total.first_error {
        Some(e) if a.total.errors > 0 => format!("{} ({e})", a.total.errors),
        _ => a.total.errors.to_string(),
    }
}

fn bytes_per_post(a: &Arm) -> String {
    if a.backend_posts == 0 {
        return "-".into();
    }
    (a.backend_bytes / a.backend_posts).to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::Arc;

    const SHAPE: RunShape = RunShape {
        concurrency: 1,
        body_tokens: 8192,
    };

    fn arm(label: &'static str, ok: u64, secs: u64) -> Arm {
        let target: SocketAddr = "127.0.0.1:1".parse().unwrap();
        Arm {
            label,
            proxy: None,
            client: ClosedLoop {
                target,
                path: "/".into(),
                templates: Arc::new(Vec::new()),
                connections: 1,
                rate: None,
            },
            total: LoopResult {
                ok,
                latencies_us: vec![1000; 10],
                elapsed: Duration::from_secs(secs),
                ..LoopResult::default()
            },
            round_rps: vec![ok as f64 / secs as f64],
            envoy_cpu: Duration::ZERO,
            round_cpu_us: Vec::new(),
            main_cpu: Duration::ZERO,
            processor_cpu: Duration::ZERO,
            round_processor_cpu_us: Vec::new(),
            backend_posts: ok,
            backend_bytes: ok * 100,
            stream: None,
            same_envoy_plain: None,
        }
    }

    #[test]
    fn a_default_gateway_is_divided_by_its_own_envoys_plain_route() {
        let mut native = arm("native", 1000, 1);
        native.envoy_cpu = Duration::from_secs(2);
        native.round_cpu_us = vec![2000.0, 2200.0];
        let mut plain_route = arm("native", 1000, 1);
        plain_route.envoy_cpu = Duration::from_secs(1);
        native.same_envoy_plain = Some(SameEnvoyPlain {
            client: plain_route.client,
            total: plain_route.total,
            envoy_cpu: plain_route.envoy_cpu,
            round_cpu_us: vec![1000.0, 1000.0],
        });
        let judged = RunShape {
            concurrency: 1,
            body_tokens: 32 * super::super::overhead::TOKENS_PER_KB,
        };
        let got = SameEnvoy::of(&[arm("plain", 1000, 1), native], judged);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].label, "native");
        assert!((got[0].ratio - 2.0).abs() < 1e-9, "{got:?}");
        assert_eq!(got[0].rounds, [2.0, 2.2]);
        assert_eq!(got[0].max, Some(1.2));
        let text = targets::render_same_envoy(&[], judged);
        assert!(text.is_empty(), "no default gateway, no line");
    }

    #[test]
    fn ratios_are_against_plain() {
        let arms = [
            arm("plain", 1000, 1),
            arm("wasm", 800, 1),
            arm("native", 850, 1),
        ];
        let out = render(
            &arms,
            &OverheadOptions::default(),
            SHAPE,
            &LogicCost::default(),
        );
        assert!(out.contains("wasm/plain requests/s = 0.800"), "{out}");
        assert!(out.contains("native/plain requests/s = 0.850"), "{out}");
        assert!(!out.contains("floor"), "no floor arm, no floor line: {out}");
    }

    #[test]
    fn each_gateway_is_judged_beyond_its_floor() {
        let arms = [
            with_cpu(arm("plain", 1000, 1), &[90.0, 92.0]),
            with_cpu(arm("native-floor", 1000, 1), &[100.0, 100.0]),
            with_cpu(arm("native", 1000, 1), &[110.0, 114.0]),
            with_cpu(arm("native-tenancy", 1000, 1), &[140.0, 140.0]),
            with_cpu(arm("wasm-floor", 1000, 1), &[120.0, 120.0]),
            with_cpu(arm("wasm", 1000, 1), &[200.0, 180.0]),
        ];
        let out = render(
            &arms,
            &OverheadOptions::default(),
            SHAPE,
            &LogicCost::default(),
        );
        assert!(
            out.contains("native beyond native-floor: Envoy CPU per request +12.0 µs (median of per-round differences +12.0 µs); target ≤ 15 µs: met, 3.0 µs of budget left"),
            "{out}"
        );
        assert!(
            out.contains("native-tenancy beyond native-floor: Envoy CPU per request +40.0 µs"),
            "{out}"
        );
        assert!(out.contains("the fuller pipeline, reported"), "{out}");
        assert!(
            out.contains("wasm beyond wasm-floor: Envoy CPU per request +70.0 µs (median of per-round differences +70.0 µs); target ≤ 50 µs: MISSED by 20.0 µs"),
            "{out}"
        );
        let four = RunShape {
            concurrency: 4,
            body_tokens: 512 * 256,
        };
        let out = render(
            &arms,
            &OverheadOptions::default(),
            four,
            &LogicCost::default(),
        );
        assert!(out.contains("no target at 512 KB"), "{out}");
        let four = RunShape {
            concurrency: 4,
            body_tokens: 128 * 256,
        };
        let out = render(
            &arms,
            &OverheadOptions::default(),
            four,
            &LogicCost::default(),
        );
        assert!(
            out.contains("target (set at 1 worker) ≤ 30 µs: met, 18.0 µs of budget left"),
            "{out}"
        );
        let s = summary(&[RunSummary::of(SHAPE, &arms), RunSummary::of(four, &arms)]);
        assert!(s.contains("beyond the floor"), "{s}");
        assert!(
            s.contains("+12.0 µs (≤ 15 µs: met, 3.0 µs of budget left)"),
            "{s}"
        );
        assert!(
            s.contains("+12.0 µs (≤ 30 µs: met, 18.0 µs of budget left)"),
            "{s}"
        );
        assert!(s.contains("+70.0 µs (≤ 50 µs: MISSED by 20.0 µs)"), "{s}");
    }

    fn with_cpu(mut a: Arm, rounds_us: &[f64]) -> Arm {
        a.round_cpu_us = rounds_us.to_vec();
        let total_us: f64 =
            rounds_us.iter().sum::<f64>() * a.total.ok as f64 / rounds_us.len() as f64;
        a.envoy_cpu = Duration::from_secs_f64(total_us / 1e6);
        a
    }

    fn with_streams(mut a: Arm, first_chunk_us: u32, forced: u64) -> Arm {
        let target: SocketAddr = "127.0.0.1:1".parse().unwrap();
        a.stream = Some(StreamArm {
            client: StreamLoop {
                target,
                path: "/".into(),
                templates: Arc::new(Vec::new()),
                connections: 1,
                chunks: super::super::overhead::backend::STREAM_CHUNKS,
            },
            total: StreamResult {
                ok: 10,
                first_chunk_us: vec![first_chunk_us; 10],
                total_us: vec![first_chunk_us + 20_000; 10],
                quota_headers: forced,
                ..StreamResult::default()
            },
            envoy_cpu: Duration::from_micros(10 * 300),
            round_cpu_us: vec![300.0, 300.0],
            round_first_chunk_p50_us: vec![first_chunk_us; 2],
            backend_streams: 10,
            usage_forced: forced,
        });
        a
    }

    #[test]
    fn tenancy_is_reported_against_the_flavours_arm_with_verdicts() {
        let arms = [
            arm("plain", 1000, 1),
            with_streams(with_cpu(arm("native", 1000, 1), &[140.0, 142.0]), 600, 0),
            with_streams(
                with_cpu(arm("native-tenancy", 1000, 1), &[142.0, 144.0]),
                650,
                10,
            ),
            with_streams(with_cpu(arm("wasm", 1000, 1), &[200.0, 200.0]), 900, 0),
            with_streams(
                with_cpu(arm("wasm-tenancy", 1000, 1), &[215.0, 211.0]),
                1100,
                10,
            ),
        ];
        let out = render(
            &arms,
            &OverheadOptions::default(),
            SHAPE,
            &LogicCost::default(),
        );
        assert!(out.contains("native tenancy"), "{out}");
        assert!(out.contains("141.0 → 143.0 µs = +2.0 µs"), "{out}");
        assert!(out.contains("target ≤ 3 µs: met"), "{out}");
        assert!(
            out.contains("first chunk p50 0.600 ms → 0.650 ms = +0.050 ms"),
            "{out}"
        );
        assert!(out.contains("usage forced upstream on 10/10"), "{out}");
        assert!(out.contains("(20 chunks through the usage stage)"), "{out}");
        assert!(
            out.contains("; streamed windows of 2.0 s, 20 chunks per response"),
            "{out}"
        );
        assert!(out.contains("wasm tenancy"), "{out}");
        assert!(out.contains("+13.0 µs"), "{out}");
        assert!(out.contains("reported, no target"), "{out}");
        // 0.2 ms more on the Wasm first chunk misses the 0.1 ms target.
        assert!(
            out.contains(
                "+0.200 ms (median of per-round differences +0.200 ms; target ≤ +0.1 ms: MISSED"
            ),
            "{out}"
        );
        assert!(out.contains("streamed: first chunk p50"), "{out}");
        assert!(out.contains("10/10"), "{out}");
        let slow = [
            with_cpu(arm("native", 1000, 1), &[140.0]),
            with_cpu(arm("native-tenancy", 1000, 1), &[145.0]),
        ];
        let out = render(
            &slow,
            &OverheadOptions::default(),
            SHAPE,
            &LogicCost::default(),
        );
        assert!(out.contains("target ≤ 3 µs: MISSED"), "{out}");
        assert!(
            !out.contains("streamed"),
            "no streamed windows, no streamed rows: {out}"
        );
    }

    fn with_latency(mut a: Arm, p50_us: u32) -> Arm {
        a.total.latencies_us = vec![p50_us; 10];
        a
    }

    fn with_processor(mut a: Arm, rounds_us: &[f64]) -> Arm {
        a.round_processor_cpu_us = rounds_us.to_vec();
        let total_us: f64 =
            rounds_us.iter().sum::<f64>() * a.total.ok as f64 / rounds_us.len() as f64;
        a.processor_cpu = Duration::from_secs_f64(total_us / 1e6);
        a
    }

    #[test]
    fn the_gateways_are_set_against_the_extproc_arm_envoy_plus_processor() {
        let arms = [
            with_latency(with_cpu(arm("plain", 1000, 1), &[90.0]), 1000),
            with_latency(with_cpu(arm("native", 1000, 1), &[140.0]), 1100),
            with_latency(with_cpu(arm("wasm", 1000, 1), &[250.0]), 1500),
            with_latency(
                with_processor(with_cpu(arm("extproc-null", 1000, 1), &[200.0]), &[100.0]),
                1400,
            ),
            with_latency(
                with_processor(with_cpu(arm("extproc-parse", 1000, 1), &[210.0]), &[240.0]),
                1600,
            ),
        ];
        let out = render(
            &arms,
            &OverheadOptions::default(),
            SHAPE,
            &LogicCost::default(),
        );
        // Rows: the processor's CPU, the sum, and what it adds over plain.
        assert!(out.contains("processor CPU per request"), "{out}");
        assert!(out.contains("450.0 µs"), "Envoy 210 + processor 240: {out}");
        assert!(out.contains("+360.0 µs"), "450 - plain's 90: {out}");
        // native: 140 of 450 = 0.311 ≤ 1/3, p50 +100 µs ≤ 600/3.
        assert!(
            out.contains("native vs extproc-parse: total CPU per request 140.0 µs = 0.311 of 450.0 µs (target ≤ 1/3 of it: met); added p50 +100 µs vs +600 µs (target ≤ 1/3 of it: met)"),
            "{out}"
        );
        // wasm: 250 < 450, but +500 µs is not ≤ 1/3; the Wasm target is "below": met.
        assert!(
            out.contains("wasm vs extproc-parse: total CPU per request 250.0 µs = 0.556"),
            "{out}"
        );
        assert!(
            out.contains("+500 µs vs +600 µs (target below it: met)"),
            "{out}"
        );
        assert!(out.contains("its floor: extproc-null 300.0 µs CPU per request (Envoy 200.0 µs + processor 100.0 µs)"), "{out}");
        let slow = [
            with_latency(with_cpu(arm("plain", 1000, 1), &[90.0]), 1000),
            with_latency(with_cpu(arm("native", 1000, 1), &[200.0]), 1300),
            with_latency(
                with_processor(with_cpu(arm("extproc-parse", 1000, 1), &[210.0]), &[240.0]),
                1600,
            ),
        ];
        let out = render(
            &slow,
            &OverheadOptions::default(),
            SHAPE,
            &LogicCost::default(),
        );
        assert!(out.contains("(target ≤ 1/3 of it: MISSED); added p50 +300 µs vs +600 µs (target ≤ 1/3 of it: MISSED)"), "{out}");
        // No ext_proc arm: no processor rows and no comparison.
        let none = [arm("plain", 1000, 1), arm("native", 900, 1)];
        let out = render(
            &none,
            &OverheadOptions::default(),
            SHAPE,
            &LogicCost::default(),
        );
        assert!(
            !out.contains("processor") && !out.contains("extproc"),
            "{out}"
        );
    }

    #[test]
    fn the_summary_has_a_column_per_run_and_a_row_per_arm() {
        let run = |c, kb: u32, native_cpu: f64| {
            let arms = [
                with_latency(with_cpu(arm("plain", 1000, 1), &[90.0]), 1000),
                with_latency(with_cpu(arm("native", 1000, 1), &[native_cpu]), 1250),
            ];
            RunSummary::of(
                RunShape {
                    concurrency: c,
                    body_tokens: kb * 256,
                },
                &arms,
            )
        };
        let mut second = run(4, 128, 300.0);
        second.cells.retain(|c| c.label == "plain");
        let out = summary(&[run(1, 32, 140.0), second]);
        assert!(out.contains("1 worker, 32 KB"), "{out}");
        assert!(out.contains("4 workers, 128 KB"), "{out}");
        assert!(out.contains("140.0 µs / +0.25 ms"), "{out}");
        assert!(out.contains("not run"), "{out}");
    }
}
