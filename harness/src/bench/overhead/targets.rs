//! The cost targets of `bench overhead`:
//!
//! - **Against the same Envoy's plain route** ([`SameEnvoy`]): each flavour's default
//!   gateway (`native`, `wasm`) also sends every round's bodies through its own Envoy's
//!   `/rr/` route, where the gateway filters are disabled per route. Envoy CPU per request
//!   through the gateway ÷ through that route, at 32 KB and one worker: native ≤ 1.20,
//!   Wasm ≤ 1.50. Other runs report the ratio without a verdict.
//! - **Against a floor** ([`BeyondFloor`]): the Envoy CPU per request a gateway may spend
//!   beyond its host's floor arm (`wasm-floor`, `native-floor`: plain Envoy plus a filter
//!   that only holds and reads the body), by body size.
//!
//! The targets are set at one Envoy worker; a run at more workers is judged against the
//! same figures and says so. A body size without a target is reported without a verdict,
//! and so are the gateways with more stages on (`-tenancy`, `-flow`, `-two`): they show what
//! the full pipeline costs beyond the same floor.

use super::super::overhead_table::{cpu_us, per_run_table, round_differences, Arm};
use super::super::report::median;
use super::RunShape;

/// Envoy CPU per request a flavour's default gateway may spend beyond its floor, µs, by
/// body size in KB.
const BEYOND_FLOOR_US: [(&str, u32, f64); 4] = [
    ("native", 32, 15.0),
    ("native", 128, 30.0),
    ("wasm", 32, 50.0),
    ("wasm", 128, 100.0),
];

/// The flavours, each with its floor arm `<flavour>-floor`.
const FLAVOURS: [&str; 2] = ["wasm", "native"];

/// The largest Envoy CPU per request of a flavour's default gateway ÷ its own Envoy's plain
/// route, judged at 32 KB bodies and one worker.
const SAME_ENVOY_MAX: [(&str, f64); 2] = [("native", 1.20), ("wasm", 1.50)];

/// The body size and worker count the [`SAME_ENVOY_MAX`] targets are judged at.
const SAME_ENVOY_JUDGED: RunShape = RunShape {
    concurrency: 1,
    body_tokens: 32 * super::TOKENS_PER_KB,
};

/// A default gateway against its own Envoy's plain route.
#[derive(Clone, Debug, PartialEq)]
pub struct SameEnvoy {
    /// The gateway arm (`native` or `wasm`).
    pub label: &'static str,
    /// Envoy CPU per request through the gateway ÷ through the plain route, totals over
    /// every round.
    pub ratio: f64,
    /// The ratio of each round's two windows.
    pub rounds: Vec<f64>,
    /// Envoy CPU per request through the gateway and through the plain route, µs.
    pub gateway_us: f64,
    /// See [`SameEnvoy::gateway_us`].
    pub plain_us: f64,
    /// The target, in the run that is judged.
    pub max: Option<f64>,
}

impl SameEnvoy {
    /// Every default gateway arm of `arms` that measured its plain route.
    pub(in crate::bench) fn of(arms: &[Arm], shape: RunShape) -> Vec<SameEnvoy> {
        let mut out = Vec::new();
        for (label, max) in SAME_ENVOY_MAX {
            let Some(a) = arms.iter().find(|a| a.label == label) else {
                continue;
            };
            let Some(p) = a.same_envoy_plain.as_ref() else {
                continue;
            };
            let (Some(gateway_us), Some(plain_us)) = (cpu_us(a), p.cpu_us()) else {
                continue;
            };
            if plain_us <= 0.0 {
                continue;
            }
            let rounds = a
                .round_cpu_us
                .iter()
                .zip(&p.round_cpu_us)
                .filter(|(_, p)| **p > 0.0)
                .map(|(g, p)| g / p)
                .collect();
            out.push(SameEnvoy {
                label: a.label,
                ratio: gateway_us / plain_us,
                rounds,
                gateway_us,
                plain_us,
                max: (shape == SAME_ENVOY_JUDGED).then_some(max),
            });
        }
        out
    }

    /// `≤ max: met` or `MISSED`; `None` outside the judged run.
    pub fn verdict(&self) -> Option<String> {
        let max = self.max?;
        Some(if self.ratio <= max {
            format!("≤ {max:.2}: met")
        } else {
            format!("≤ {max:.2}: MISSED")
        })
    }

    fn cell(&self) -> String {
        match self.verdict() {
            Some(v) => format!("{:.2}× ({v})", self.ratio),
            None => format!("{:.2}×", self.ratio),
        }
    }
}

/// One run's lines: each default gateway against its own Envoy's plain route.
pub(in crate::bench) fn render_same_envoy(arms: &[Arm], shape: RunShape) -> String {
    let mut out = String::new();
    for s in SameEnvoy::of(arms, shape) {
        let rounds: Vec<String> = s.rounds.iter().map(|r| format!("{r:.2}")).collect();
        out.push_str(&format!(
            "{} ÷ its own Envoy's plain route (/rr/): Envoy CPU per request {:.1} µs ÷ {:.1} µs \
             = {:.2}× (per round: {}; median {:.2}); {}\n",
            s.label,
            s.gateway_us,
            s.plain_us,
            s.ratio,
            rounds.join(", "),
            median(&s.rounds),
            s.verdict().map_or_else(
                || "target set at 32 KB and 1 worker, reported".to_string(),
                |v| format!("target {v}")
            )
        ));
    }
    out
}

/// The summary over runs of [`SameEnvoy`]; empty when no run measured it.
pub(in crate::bench) fn same_envoy_summary(runs: &[(RunShape, &[SameEnvoy])]) -> String {
    if runs.iter().all(|(_, cells)| cells.is_empty()) {
        return String::new();
    }
    format!(
        "against the same Envoy's plain route: per default gateway and run, Envoy CPU per \
         request through the gateway ÷ through its own /rr/ route (targets at 32 KB, 1 \
         worker)\n\n{}",
        per_run_table(runs, |c| c.label, SameEnvoy::cell)
    )
}

/// The target of `flavour`'s default gateway at `body_kb`, µs, if one is set.
pub fn target_us(flavour: &str, body_kb: u32) -> Option<f64> {
    BEYOND_FLOOR_US
        .iter()
        .find(|(f, kb, _)| *f == flavour && *kb == body_kb)
        .map(|t| t.2)
}

/// One gateway arm against its flavour's floor.
#[derive(Clone, Debug, PartialEq)]
pub struct BeyondFloor {
    /// The gateway arm (`native`, `native-tenancy`, …).
    pub label: &'static str,
    /// Its flavour.
    pub flavour: &'static str,
    /// Envoy CPU per request over the floor's, totals over every round, µs.
    pub over_us: f64,
    /// The median of the per-round differences, µs (the noise check).
    pub median_round_us: f64,
    /// The target, on the flavour's default arm at a body size that has one, µs.
    pub target_us: Option<f64>,
}

impl BeyondFloor {
    /// Every gateway arm of `arms` whose flavour's floor is also there, in `arms`' order.
    pub(in crate::bench) fn of(arms: &[Arm], shape: RunShape) -> Vec<BeyondFloor> {
        let mut out = Vec::new();
        for flavour in FLAVOURS {
            let floor_label = format!("{flavour}-floor");
            let Some(floor) = arms.iter().find(|a| a.label == floor_label) else {
                continue;
            };
            let Some(floor_us) = cpu_us(floor) else {
                continue;
            };
            for a in arms.iter().filter(|a| is_gateway_of(a.label, flavour)) {
                let Some(us) = cpu_us(a) else { continue };
                let rounds = round_differences(&floor.round_cpu_us, &a.round_cpu_us);
                out.push(BeyondFloor {
                    label: a.label,
                    flavour,
                    over_us: us - floor_us,
                    median_round_us: median(&rounds),
                    target_us: if a.label == flavour {
                        target_us(flavour, shape.body_kb())
                    } else {
                        None
                    },
                });
            }
        }
        out
    }

    /// `met` or `MISSED`, with the budget left or the excess; `None` without a target.
    pub fn verdict(&self) -> Option<String> {
        let target = self.target_us?;
        let left = target - self.over_us;
        Some(if left >= 0.0 {
            format!("≤ {target:.0} µs: met, {left:.1} µs of budget left")
        } else {
            format!("≤ {target:.0} µs: MISSED by {:.1} µs", -left)
        })
    }

    /// The cell of the summary: the excess, and the verdict when there is a target.
    fn cell(&self) -> String {
        match self.verdict() {
            Some(v) => format!("{:+.1} µs ({v})", self.over_us),
            None => format!("{:+.1} µs", self.over_us),
        }
    }
}

/// Whether `label` is one of `flavour`'s gateway arms (not its floor).
fn is_gateway_of(label: &str, flavour: &str) -> bool {
    label == flavour
        || label
            .strip_prefix(flavour)
            .is_some_and(|rest| rest.starts_with('-') && rest != "-floor")
}

/// The lines of one run's report: each gateway arm beyond its floor, with the verdicts.
pub(in crate::bench) fn render(arms: &[Arm], shape: RunShape) -> String {
    let mut out = String::new();
    for b in BeyondFloor::of(arms, shape) {
        let judged = match b.verdict() {
            Some(v) if shape.concurrency == 1 => format!("target {v}"),
            Some(v) => format!("target (set at 1 worker) {v}"),
            None if b.label == b.flavour => {
                format!("no target at {} KB", shape.body_kb())
            }
            None => "the fuller pipeline, reported".into(),
        };
        out.push_str(&format!(
            "{} beyond {}-floor: Envoy CPU per request {:+.1} µs (median of per-round \
             differences {:+.1} µs); {judged}\n",
            b.label, b.flavour, b.over_us, b.median_round_us
        ));
    }
    out
}

/// The summary over runs: each gateway arm's Envoy CPU per request beyond its floor, with
/// the verdicts; empty when no run had a floor.
pub(in crate::bench) fn summary(runs: &[(RunShape, &[BeyondFloor])]) -> String {
    if runs.iter().all(|(_, cells)| cells.is_empty()) {
        return String::new();
    }
    format!(
        "beyond the floor: per gateway arm and run, Envoy CPU per request over its flavour's \
         floor arm (targets set at 1 worker, judged at every worker count)\n\n{}",
        per_run_table(runs, |c| c.label, BeyondFloor::cell)
    )
}

/// `1 worker, 32 KB`.
pub fn run_name(shape: RunShape) -> String {
    format!(
        "{} worker{}, {} KB",
        shape.concurrency,
        if shape.concurrency == 1 { "" } else { "s" },
        shape.body_kb()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_by_flavour_and_size() {
        assert_eq!(target_us("native", 32), Some(15.0));
        assert_eq!(target_us("native", 128), Some(30.0));
        assert_eq!(target_us("wasm", 32), Some(50.0));
        assert_eq!(target_us("wasm", 128), Some(100.0));
        assert_eq!(target_us("native", 512), None);
        assert_eq!(target_us("native-tenancy", 32), None);
    }

    #[test]
    fn gateway_arms_of_a_flavour() {
        assert!(is_gateway_of("native", "native"));
        assert!(is_gateway_of("native-tenancy", "native"));
        assert!(is_gateway_of("native-two", "native"));
        assert!(!is_gateway_of("native-floor", "native"));
        assert!(!is_gateway_of("wasm", "native"));
        assert!(!is_gateway_of("nativex", "native"));
    }

    #[test]
    fn verdicts_give_the_budget_left_or_the_excess() {
        let b = |over_us, target_us| BeyondFloor {
            label: "native",
            flavour: "native",
            over_us,
            median_round_us: over_us,
            target_us,
        };
        assert_eq!(
            b(12.5, Some(15.0)).verdict().as_deref(),
            Some("≤ 15 µs: met, 2.5 µs of budget left")
        );
        assert_eq!(
            b(40.0, Some(15.0)).verdict().as_deref(),
            Some("≤ 15 µs: MISSED by 25.0 µs")
        );
        assert_eq!(b(40.0, None).verdict(), None);
        assert_eq!(b(40.0, None).cell(), "+40.0 µs");
    }

    #[test]
    fn same_envoy_verdicts_at_the_judged_run_only() {
        let s = |ratio, max| SameEnvoy {
            label: "native",
            ratio,
            rounds: vec![ratio],
            gateway_us: ratio * 30.0,
            plain_us: 30.0,
            max,
        };
        assert_eq!(s(1.1, Some(1.2)).cell(), "1.10× (≤ 1.20: met)");
        assert_eq!(s(1.9, Some(1.2)).cell(), "1.90× (≤ 1.20: MISSED)");
        assert_eq!(s(1.9, None).cell(), "1.90×");
        assert_eq!(SAME_ENVOY_JUDGED.body_kb(), 32);
    }
}
