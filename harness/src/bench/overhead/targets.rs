//! The cost targets of `bench overhead` that are set against a floor: the Envoy CPU per
//! request a gateway may spend beyond its host's floor arm (`wasm-floor`, `native-floor`:
//! plain Envoy plus a filter that only holds and reads the body), by body size.
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
}
