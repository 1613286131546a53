//! The report of `bench overhead`: one column per arm, ratios against `plain`, the
//! verdicts against the issue targets (Wasm ≥ 0.70, native ≥ 0.90 of plain's requests/s)
//! and the filter logic's own cost for comparison.

use std::time::Duration;

use super::closed_loop::{ClosedLoop, LoopResult};
use super::logic::LogicCost;
use super::overhead::OverheadOptions;
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
    /// `POST`s the backend saw during the measured windows.
    pub(super) backend_posts: u64,
    /// Their body bytes.
    pub(super) backend_bytes: u64,
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
    out.push_str(&format!(
        "filter logic per request, native, in-process: body parse {:.1} µs (router), parse + \
         prefix hashes {:.1} µs (picker; hashes alone {:.1} µs)\n",
        logic.parse_us, logic.parse_and_hash_us, logic.hash_us
    ));
    out
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

/// Envoy CPU time per request in µs (`None` without an Envoy or requests).
fn cpu_us(a: &Arm) -> Option<f64> {
    (a.stack.is_some() && a.total.ok > 0)
        .then(|| a.envoy_cpu.as_secs_f64() * 1e6 / a.total.ok as f64)
}

fn cpu_per_request(a: &Arm) -> String {
    cpu_us(a).map_or_else(|| "-".into(), |us| format!("{us:.0} µs"))
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
            backend_posts: ok,
            backend_bytes: ok * 100,
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
}
