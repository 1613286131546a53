//! Latency the gateway measures itself: per endpoint, decaying estimates of the time to
//! first token (TTFT) and the time per output token (TPOT) of the requests this proxy sent
//! there, with the in-flight load each request met when it was sent.
//!
//! The host times every routed request (from its dispatch to its first response chunk, and
//! the gaps between the chunks after it) and hands the [`Observation`] to the endpoint's
//! [`LatencyEstimate`] when the request ends. Nothing is scraped: an engine that exports
//! no latency metric is measured all the same, and what is measured includes the network
//! and Envoy's own queueing, which is what a client waits for.
//!
//! # The estimate
//!
//! Each estimate is an exponentially weighted moving average: a new observation moves it
//! by `smoothing` (α, default 0.2) of the difference, so an observation's weight halves
//! about every three observations after it. TTFT is kept as a line against the in-flight
//! load at dispatch, fitted by exponentially weighted least squares (the same α for the
//! means, the variance of the load and its covariance with TTFT): `ttft(x) = ȳ + b·(x − x̄)`
//! with slope `b = cov / var`, never below 0 (more load never predicts a faster answer),
//! and 0 until the load seen has varied (`var` < 1/4). The prediction for a new request is
//! the line at the endpoint's load now plus the request itself, so an endpoint that answers
//! fast when idle but slows under load is not sent a burst on the strength of its idle
//! answers.
//!
//! TPOT is the mean gap between response chunks after the first, per request, averaged the
//! same way. vLLM and SGLang flush one chunk per output token at their default stream
//! interval; an engine configured to flush every `k` tokens reports `k` times the TPOT,
//! alike on every endpoint of the pool, which leaves their ranking unchanged.
//!
//! Only streamed responses measure TTFT: the first byte of a non-streamed response comes
//! with the whole answer. Their other observations (load, prompt size) still count.
//!
//! # Freshness
//!
//! An estimate counts once it holds `minSamples` TTFT observations (default 3), and only
//! while its newest observation is younger than `staleAfterMs` (default 10 s). An endpoint
//! the picker stopped sending to because it measured slow therefore loses its bad estimate
//! after `staleAfterMs`, is treated as unmeasured again (the latency scorer gives an
//! unmeasured endpoint the best score any measured one has), and is measured afresh: that
//! is how a recovered replica wins its traffic back. The next observation after a stale
//! spell restarts the estimate rather than averaging with a past that no longer holds.
//!
//! Pure arithmetic on the caller's clock: no allocation, no I/O.

use crate::types::Millis;

/// Default `smoothing` (α): the weight of each new observation.
pub const DEFAULT_SMOOTHING: f64 = 0.2;

/// Default `staleAfterMs`: an estimate whose newest observation is older is forgotten.
pub const DEFAULT_STALE_AFTER_MS: u64 = 10_000;

/// Default `minSamples`: TTFT observations before an estimate counts.
pub const DEFAULT_MIN_SAMPLES: u32 = 3;

/// Below this variance of the in-flight load at dispatch, the TTFT line has no slope.
const MIN_LOAD_VARIANCE: f64 = 0.25;

/// `latency-observer-producer` settings: how the estimates are kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencySettings {
    /// `smoothing`, in (0, 1]: the weight of each new observation.
    pub smoothing: f64,
    /// `staleAfterMs`: an estimate whose newest observation is older counts as none.
    pub stale_after_ms: u64,
    /// `minSamples`, ≥ 1: TTFT observations before an estimate counts.
    pub min_samples: u32,
}

impl Default for LatencySettings {
    fn default() -> Self {
        LatencySettings {
            smoothing: DEFAULT_SMOOTHING,
            stale_after_ms: DEFAULT_STALE_AFTER_MS,
            min_samples: DEFAULT_MIN_SAMPLES,
        }
    }
}

/// What one routed request showed of its endpoint, handed over when it ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// When the request ended (the observation's age is measured from here).
    pub at: Millis,
    /// Dispatch to the first response chunk, in ms; `None` for a response that was not
    /// streamed or sent no body.
    pub ttft_ms: Option<f64>,
    /// The mean gap between response chunks after the first, in ms; `None` with fewer
    /// than two chunks.
    pub tpot_ms: Option<f64>,
    /// Requests this proxy had in flight to the endpoint when it sent this one (not
    /// counting it).
    pub inflight_at_dispatch: u32,
    /// The request's estimated prompt tokens.
    pub prompt_tokens: u64,
}

/// An exponentially weighted mean.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Mean {
    value: f64,
    samples: u32,
}

impl Mean {
    fn add(&mut self, alpha: f64, x: f64) {
        self.value = if self.samples == 0 {
            x
        } else {
            self.value + alpha * (x - self.value)
        };
        self.samples = self.samples.saturating_add(1);
    }
}

/// TTFT against the in-flight load at dispatch, fitted by exponentially weighted least
/// squares (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Line {
    /// x̄: mean load at dispatch.
    load: f64,
    /// ȳ: mean TTFT, ms.
    ttft: f64,
    /// Weighted variance of the load.
    var: f64,
    /// Weighted covariance of load and TTFT.
    cov: f64,
    samples: u32,
}

impl Line {
    fn add(&mut self, alpha: f64, load: f64, ttft: f64) {
        if self.samples == 0 {
            *self = Line {
                load,
                ttft,
                samples: 1,
                ..Line::default()
            };
            return;
        }
        // West's incremental weighted update.
        let dx = load - self.load;
        let dy = ttft - self.ttft;
        self.load += alpha * dx;
        self.ttft += alpha * dy;
        self.var = (1.0 - alpha) * (self.var + alpha * dx * dx);
        self.cov = (1.0 - alpha) * (self.cov + alpha * dx * dy);
        self.samples = self.samples.saturating_add(1);
    }

    fn slope(&self) -> f64 {
        if self.var < MIN_LOAD_VARIANCE {
            return 0.0;
        }
        let b = self.cov / self.var;
        if b.is_finite() {
            b.max(0.0)
        } else {
            0.0
        }
    }

    fn at(&self, load: f64) -> f64 {
        let y = self.ttft + self.slope() * (load - self.load);
        if y.is_finite() {
            y.max(0.0)
        } else {
            0.0
        }
    }
}

/// One endpoint's measured latency (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencyEstimate {
    ttft: Line,
    tpot: Mean,
    prompt_tokens: Mean,
    /// The newest observation's time; `None` before the first.
    last: Option<Millis>,
}

/// What the scheduler reads of a fresh estimate for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ObservedLatency {
    /// TTFT predicted for a request sent now, in ms.
    pub ttft_ms: f64,
    /// Mean time per output token, in ms, when measured.
    pub tpot_ms: Option<f64>,
}

impl LatencyEstimate {
    /// Take in one observation (a stale estimate starts over from it).
    pub fn observe(&mut self, settings: &LatencySettings, obs: &Observation) {
        if self
            .last
            .is_some_and(|last| obs.at.since(last) > settings.stale_after_ms)
        {
            *self = LatencyEstimate::default();
        }
        let alpha = settings.smoothing;
        if let Some(ttft) = obs.ttft_ms.filter(|t| t.is_finite() && *t >= 0.0) {
            self.ttft
                .add(alpha, f64::from(obs.inflight_at_dispatch), ttft);
        }
        if let Some(tpot) = obs.tpot_ms.filter(|t| t.is_finite() && *t >= 0.0) {
            self.tpot.add(alpha, tpot);
        }
        self.prompt_tokens.add(alpha, obs.prompt_tokens as f64);
        self.last = Some(self.last.map_or(obs.at, |last| last.max(obs.at)));
    }

    /// Whether the estimate counts at `now`: enough TTFT observations, the newest recent.
    pub fn is_fresh(&self, settings: &LatencySettings, now: Millis) -> bool {
        self.ttft.samples >= settings.min_samples
            && self
                .last
                .is_some_and(|last| now.since(last) <= settings.stale_after_ms)
    }

    /// What a request sent now to an endpoint with `inflight` requests in flight should
    /// expect, if the estimate [counts](LatencyEstimate::is_fresh).
    pub fn view(
        &self,
        settings: &LatencySettings,
        now: Millis,
        inflight: u32,
    ) -> Option<ObservedLatency> {
        if !self.is_fresh(settings, now) {
            return None;
        }
        Some(ObservedLatency {
            ttft_ms: self.ttft.at(f64::from(inflight)),
            tpot_ms: (self.tpot.samples > 0).then_some(self.tpot.value),
        })
    }

    /// Mean TTFT observed, ms (for metrics); `None` before the first streamed response.
    pub fn mean_ttft_ms(&self) -> Option<f64> {
        (self.ttft.samples > 0).then_some(self.ttft.ttft)
    }

    /// Mean time per output token observed, ms (for metrics).
    pub fn mean_tpot_ms(&self) -> Option<f64> {
        (self.tpot.samples > 0).then_some(self.tpot.value)
    }

    /// Mean in-flight load at dispatch of the observed requests.
    pub fn mean_load_at_dispatch(&self) -> Option<f64> {
        (self.ttft.samples > 0).then_some(self.ttft.load)
    }

    /// Mean estimated prompt tokens of the observed requests.
    pub fn mean_prompt_tokens(&self) -> Option<f64> {
        (self.prompt_tokens.samples > 0).then_some(self.prompt_tokens.value)
    }

    /// The TTFT line's slope: extra ms per request in flight.
    pub fn ttft_slope_ms(&self) -> f64 {
        self.ttft.slope()
    }

    /// TTFT observations taken in since the estimate (re)started.
    pub fn ttft_samples(&self) -> u32 {
        self.ttft.samples
    }
}

#[cfg(test)]
mod tests;
