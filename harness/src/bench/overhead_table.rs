//! The report of `bench overhead`: one column per arm, ratios against `plain`, the
//! verdicts against the targets (Wasm ≥ 0.70, native ≥ 0.90 of plain's requests/s), what
//! tenancy adds to each flavour (Envoy CPU per request: native auth + quota ≤ 3 µs; the
//! first chunk of a stream: ≤ 0.1 ms at p50) and the filter logic's own cost for
//! comparison.

use std::time::Duration;

use super::closed_loop::{ClosedLoop, LoopResult};
use super::logic::LogicCost;
use super::overhead::first_chunk::{StreamLoop, StreamResult};
use super::overhead::{OverheadOptions, FLOW_PAIRS, TENANCY_PAIRS};
use super::report::{median, ms, percentile_us, table};
use crate::launch::Stack;

/// One column of the report.
pub(super) struct Arm {
    /// Column label: `direct`, `plain`, `wasm-floor`, `wasm`, `native-floor` or `native`.
    pub(super) label: &'static str,
    /// The Envoy in front of the backend (`None` for `direct`).
    pub(super) stack: Option<Stack>,
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
    /// `POST`s the backend saw during the measured windows.
    pub(super) backend_posts: u64,
    /// Their body bytes.
    pub(super) backend_bytes: u64,
    /// The streamed windows (none for the floors, or when they are off).
    pub(super) stream: Option<StreamArm>,
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
        self.stack.as_ref().and_then(|s| s.envoy().pid())
    }
}

/// The report: the side-by-side table, the ratio verdicts and the filter-logic cost.
pub(super) fn render(arms: &[Arm], opts: &OverheadOptions, logic: &LogicCost) -> String {
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
                if a.stack.is_none() || a.round_cpu_us.is_empty() {
                    "-".into()
                } else {
                    format!("{:.1} µs", median(&a.round_cpu_us))
                }
            }),
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
    if arms.iter().any(|a| a.stream.is_some()) {
        rows.extend(stream_rows(arms));
    }
    let mut header = vec!["arm".to_string()];
    header.extend(arms.iter().map(|a| a.label.to_string()));
    let mut out = format!(
        "proxy overhead: {} connections closed loop, Envoy --concurrency {}, {} rounds × {:.1} s \
         per arm (order rotated), bodies of {} tokens (~{} KB)\n\n",
        opts.connections,
        opts.envoy_concurrency,
        opts.rounds,
        opts.measure.as_secs_f64(),
        opts.body_tokens,
        opts.body_tokens * 4 / 1024
    );
    out.push_str(&table(&header, &rows));
    out.push('\n');
    for (label, target) in [("wasm", 0.70), ("native", 0.90)] {
        if let Some(a) = arms.iter().find(|a| a.label == label) {
            let r = ratio(a);
            let verdict = if r >= target { "met" } else { "MISSED" };
            let cpu = cpu_ratio(arms.get(plain), a).unwrap_or(0.0);
            out.push_str(&format!(
                "{label}/plain requests/s = {r:.3} (median of rounds {:.3}; target ≥ {target:.2}: \
                 {verdict}); CPU-bound ratio (plain ÷ {label} Envoy CPU per request) {cpu:.3}\n",
                round_ratio(a)
            ));
        }
        let floor = format!("{label}-floor");
        if let Some(a) = arms.iter().find(|a| a.label == floor) {
            // Envoy CPU per request the target allows, minus what the floor already spends.
            let budget = match (arms.get(plain).and_then(cpu_us), cpu_us(a)) {
                (Some(p), Some(f)) => budget_text(p / target - f),
                _ => "no CPU reading".into(),
            };
            out.push_str(&format!(
                "{floor}/plain requests/s = {:.3} (median of rounds {:.3}): a {label} filter \
                 that only buffers and reads the body; {budget}\n",
                ratio(a),
                round_ratio(a)
            ));
        }
    }
    for (base, tenancy) in TENANCY_PAIRS {
        let (Some(b), Some(t)) = (
            arms.iter().find(|a| a.label == base),
            arms.iter().find(|a| a.label == tenancy),
        ) else {
            continue;
        };
        out.push_str(&tenancy_text(b, t));
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
fn round_differences(b: &[f64], t: &[f64]) -> Vec<f64> {
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
fn tenancy_text(b: &Arm, t: &Arm) -> String {
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
            super::overhead::backend::STREAM_CHUNKS,
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

/// What a target leaves beyond a floor: `left_us` of Envoy CPU per request (the target's
/// CPU ratio applied to `plain`, minus the floor's own CPU).
fn budget_text(left_us: f64) -> String {
    if left_us > 0.0 {
        format!(
            "at the target's CPU ratio, {left_us:.1} µs of Envoy CPU per request are left for \
             everything beyond reading the body"
        )
    } else {
        format!(
            "the target is below this floor ({:.1} µs of Envoy CPU per request over the \
             target's budget): out of reach for any filter that reads the body",
            -left_us
        )
    }
}

/// Envoy CPU time per request in µs (`None` without an Envoy, a CPU reading or requests).
fn cpu_us(a: &Arm) -> Option<f64> {
    (!a.envoy_cpu.is_zero() && a.total.ok > 0)
        .then(|| a.envoy_cpu.as_secs_f64() * 1e6 / a.total.ok as f64)
}

fn cpu_per_request(a: &Arm) -> String {
    cpu_us(a).map_or_else(|| "-".into(), |us| format!("{us:.1} µs"))
}

/// `plain`'s Envoy CPU per request ÷ `a`'s: the requests/s ratio Envoy would reach if it
/// had a core to itself and were the only bottleneck.
fn cpu_ratio(plain: Option<&Arm>, a: &Arm) -> Option<f64> {
    let per = |x: &Arm| {
        (x.stack.is_some() && x.total.ok > 0).then(|| x.envoy_cpu.as_secs_f64() / x.total.ok as f64)
    };
    let (p, x) = (per(plain?)?, per(a)?);
    (x > 0.0).then(|| p / x)
}

fn cpu_busy(a: &Arm) -> String {
    let s = a.total.elapsed.as_secs_f64();
    if a.stack.is_none() || s <= 0.0 {
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

    fn arm(label: &'static str, ok: u64, secs: u64) -> Arm {
        let target: SocketAddr = "127.0.0.1:1".parse().unwrap();
        Arm {
            label,
            stack: None,
            client: ClosedLoop {
                target,
                path: "/".into(),
                templates: Arc::new(Vec::new()),
                connections: 1,
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
            backend_posts: ok,
            backend_bytes: ok * 100,
            stream: None,
        }
    }

    #[test]
    fn ratios_and_verdicts_are_against_plain() {
        let arms = [
            arm("plain", 1000, 1),
            arm("wasm", 800, 1),
            arm("native", 850, 1),
        ];
        let out = render(&arms, &OverheadOptions::default(), &LogicCost::default());
        assert!(out.contains("wasm/plain requests/s = 0.800"), "{out}");
        assert!(out.contains("target ≥ 0.70: met"), "{out}");
        assert!(out.contains("native/plain requests/s = 0.850"), "{out}");
        assert!(out.contains("target ≥ 0.90: MISSED"), "{out}");
        assert!(!out.contains("floor"), "no floor arm, no floor line: {out}");
    }

    #[test]
    fn a_floor_arm_reports_its_ratio_and_the_cpu_left_by_the_target() {
        let arms = [arm("plain", 1000, 1), arm("native-floor", 950, 1)];
        let out = render(&arms, &OverheadOptions::default(), &LogicCost::default());
        assert!(
            out.contains("native-floor/plain requests/s = 0.950"),
            "{out}"
        );
        // Without an Envoy there is no CPU reading to budget from.
        assert!(out.contains("no CPU reading"), "{out}");
    }

    #[test]
    fn the_budget_says_when_the_target_is_below_the_floor() {
        // plain 85 µs at a 0.90 target allows 94.4 µs: a 90 µs floor leaves 4.4 µs, a 97 µs
        // floor is 2.6 µs over.
        assert!(budget_text(85.0 / 0.9 - 90.0).contains("4.4 µs of Envoy CPU per request are left"));
        let over = budget_text(85.0 / 0.9 - 97.0);
        assert!(over.contains("below this floor (2.6 µs"), "{over}");
        assert!(over.contains("out of reach"), "{over}");
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
        let out = render(&arms, &OverheadOptions::default(), &LogicCost::default());
        assert!(out.contains("native tenancy"), "{out}");
        assert!(out.contains("141.0 → 143.0 µs = +2.0 µs"), "{out}");
        assert!(out.contains("target ≤ 3 µs: met"), "{out}");
        assert!(
            out.contains("first chunk p50 0.600 ms → 0.650 ms = +0.050 ms"),
            "{out}"
        );
        assert!(out.contains("usage forced upstream on 10/10"), "{out}");
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
        let out = render(&slow, &OverheadOptions::default(), &LogicCost::default());
        assert!(out.contains("target ≤ 3 µs: MISSED"), "{out}");
        assert!(
            !out.contains("streamed"),
            "no streamed windows, no streamed rows: {out}"
        );
    }
}
