//! A run-time slowdown of one engine, the state behind the simulator's `/sim/slowdown`
//! control: a throttled GPU or a noisy neighbour, switched on and off while the replica
//! serves.
//!
//! Two knobs, both neutral by default:
//! - `factor` multiplies the duration of every step (prefill, decode and adapter loads), so
//!   a replica's time to first token and its time per output token both grow about
//!   `factor`-fold;
//! - `delay_ms` adds that many simulated milliseconds to every step that computes prompt
//!   tokens, so the time to first token grows by at least that much even for a prompt whose
//!   prefix is cached (whose prefill is otherwise nearly free) on an idle replica.
//!
//! The step in progress keeps the end it was given; the steps started after a change run at
//! the new speed. Nothing else is faked: requests that queue up behind slower steps are
//! counted as waiting, and the time-to-first-token histogram records the longer times.

/// How much slower than its configuration an engine runs (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slowdown {
    factor: f64,
    delay_ms: f64,
}

/// Why a [`Slowdown`] was refused: the parameter at fault and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowdownError {
    /// `"factor"` or `"delay_ms"`.
    pub param: &'static str,
    /// A sentence for the client.
    pub message: String,
}

impl Default for Slowdown {
    fn default() -> Self {
        Self::NONE
    }
}

impl Slowdown {
    /// The configured speed.
    pub const NONE: Self = Self {
        factor: 1.0,
        delay_ms: 0.0,
    };
    /// The largest `factor` accepted.
    pub const MAX_FACTOR: f64 = 1000.0;
    /// The largest `delay_ms` accepted (a minute).
    pub const MAX_DELAY_MS: f64 = 60_000.0;

    /// A slowdown of `factor` (1 ≤ factor ≤ [`Self::MAX_FACTOR`]) and `delay_ms`
    /// (0 ≤ delay_ms ≤ [`Self::MAX_DELAY_MS`]); NaN and infinities are refused.
    pub fn new(factor: f64, delay_ms: f64) -> Result<Self, SlowdownError> {
        if !(1.0..=Self::MAX_FACTOR).contains(&factor) {
            return Err(SlowdownError {
                param: "factor",
                message: format!(
                    "factor must be a number from 1 to {}, got {factor}",
                    Self::MAX_FACTOR
                ),
            });
        }
        if !(0.0..=Self::MAX_DELAY_MS).contains(&delay_ms) {
            return Err(SlowdownError {
                param: "delay_ms",
                message: format!(
                    "delay_ms must be a number from 0 to {}, got {delay_ms}",
                    Self::MAX_DELAY_MS
                ),
            });
        }
        Ok(Self { factor, delay_ms })
    }

    /// What every step's duration is multiplied by (1 = configured speed).
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// Simulated milliseconds added to every step that computes prompt tokens.
    pub fn delay_ms(&self) -> f64 {
        self.delay_ms
    }

    /// The duration of a step that would take `secs` at the configured speed and computes
    /// prompt tokens if `prefills`.
    pub(super) fn step_secs(&self, secs: f64, prefills: bool) -> f64 {
        let delay = if prefills {
            self.delay_ms / 1000.0
        } else {
            0.0
        };
        secs * self.factor + delay
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_and_nan_are_refused_with_their_parameter() {
        for (factor, delay, param) in [
            (0.5, 0.0, "factor"),
            (1000.5, 0.0, "factor"),
            (f64::NAN, 0.0, "factor"),
            (f64::INFINITY, 0.0, "factor"),
            (1.0, -1.0, "delay_ms"),
            (1.0, 60_001.0, "delay_ms"),
            (1.0, f64::NAN, "delay_ms"),
        ] {
            let refused = Slowdown::new(factor, delay).err().map(|e| e.param);
            assert_eq!(refused, Some(param), "factor {factor}, delay {delay}");
        }
        assert_eq!(Slowdown::new(1.0, 0.0), Ok(Slowdown::NONE));
        assert!(Slowdown::new(1000.0, 60_000.0).is_ok());
    }

    #[test]
    fn the_factor_scales_every_step_and_the_delay_only_prefills() {
        let s = Slowdown::new(4.0, 250.0).unwrap();
        assert!((s.step_secs(0.01, false) - 0.04).abs() < 1e-12);
        assert!((s.step_secs(0.01, true) - 0.29).abs() < 1e-12);
        assert!((Slowdown::NONE.step_secs(0.01, true) - 0.01).abs() < 1e-12);
    }
}
