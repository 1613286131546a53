//! Envoy's memory over a soak: the samples taken while it runs, and the growth rate per
//! 100k requests after warm-up, fitted by least squares (so one allocator burst at the end
//! does not decide the verdict, as a first-vs-last difference would let it).
//!
//! Two fits: over every sample, and over the floor (the lowest sample of each window of
//! [`FLOOR_WINDOW`]). Large requests raise RSS for a moment and the allocator hands the
//! memory back later, so single samples swing by tens of MB; a leak raises the floor,
//! which the transient peaks do not. The verdict is taken on the floor; the peaks are what
//! `bench memory` measures.

use super::procmem::WasmMemories;
use std::time::Duration;

/// One look at Envoy.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Since the soak started.
    pub at: Duration,
    /// Requests finished by then.
    pub done: u64,
    /// Envoy's `VmRSS`, bytes.
    pub rss_bytes: u64,
    /// tcmalloc's allocated bytes (admin `/memory`), if it answered.
    pub heap_allocated_bytes: Option<u64>,
    /// tcmalloc's heap size (what it holds from the OS, in use or free), if it answered.
    pub heap_size_bytes: Option<u64>,
    /// The Wasm VMs' linear memories (zero count in the native flavour).
    pub wasm: WasmMemories,
}

/// RSS growth after warm-up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Growth {
    /// Fitted growth per 100k requests, bytes (negative: it shrank).
    pub bytes_per_100k: f64,
    /// Requests between the first and last sample of the fit.
    pub requests: u64,
    /// Samples in the fit.
    pub samples: usize,
    /// RSS at the first and the last fitted sample, bytes.
    pub rss_first: u64,
    /// See `rss_first`.
    pub rss_last: u64,
}

/// The least-squares slope of `value(sample)` over requests done, for samples taken at or
/// after `warmup`, × 100k. `None` with fewer than 3 such samples or no requests between them.
pub fn growth_of(
    samples: &[Sample],
    warmup: Duration,
    value: impl Fn(&Sample) -> u64,
) -> Option<Growth> {
    let fit: Vec<&Sample> = samples.iter().filter(|s| s.at >= warmup).collect();
    let (first, last) = (fit.first()?, fit.last()?);
    let requests = last.done.saturating_sub(first.done);
    if fit.len() < 3 || requests == 0 {
        return None;
    }
    let n = fit.len() as f64;
    let mean_x = fit.iter().map(|s| s.done as f64).sum::<f64>() / n;
    let mean_y = fit.iter().map(|s| value(s) as f64).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for s in &fit {
        let dx = s.done as f64 - mean_x;
        sxy += dx * (value(s) as f64 - mean_y);
        sxx += dx * dx;
    }
    if sxx == 0.0 {
        return None;
    }
    Some(Growth {
        bytes_per_100k: sxy / sxx * 100_000.0,
        requests,
        samples: fit.len(),
        rss_first: value(first),
        rss_last: value(last),
    })
}

/// The floor is the lowest sample in each window this long.
pub const FLOOR_WINDOW: Duration = Duration::from_secs(10);

/// The lowest-RSS sample of each [`FLOOR_WINDOW`] (counted from the first sample), in order.
pub fn floor_samples(samples: &[Sample]) -> Vec<Sample> {
    let mut out: Vec<Sample> = Vec::new();
    let mut window: Option<(u128, Sample)> = None;
    let step = FLOOR_WINDOW.as_millis().max(1);
    for s in samples {
        let w = s.at.as_millis() / step;
        window = match window {
            Some((cur, low)) if cur == w => {
                Some((cur, if s.rss_bytes < low.rss_bytes { *s } else { low }))
            }
            Some((_, low)) => {
                out.push(low);
                Some((w, *s))
            }
            None => Some((w, *s)),
        };
    }
    out.extend(window.map(|(_, low)| low));
    out
}

/// `bytes` in MB (10^6 bytes), one decimal.
pub fn mb(bytes: f64) -> String {
    format!("{:.1} MB", bytes / 1e6)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample(t: u64, done: u64, rss: u64) -> Sample {
        Sample {
            at: Duration::from_secs(t),
            done,
            rss_bytes: rss,
            ..Sample::default()
        }
    }

    #[test]
    fn the_fit_ignores_warm_up_and_measures_per_100k() {
        // Warm-up grows fast; afterwards 50 bytes per request = 5 MB per 100k.
        let mut s = vec![sample(0, 0, 10_000_000), sample(5, 1000, 60_000_000)];
        for i in 0..10u64 {
            s.push(sample(10 + i, 2000 + i * 1000, 60_000_000 + i * 50_000));
        }
        let g = growth_of(&s, Duration::from_secs(10), |s| s.rss_bytes).unwrap();
        assert!((g.bytes_per_100k - 5_000_000.0).abs() < 1.0, "{g:?}");
        assert_eq!((g.samples, g.requests), (10, 9000));
        assert_eq!(g.rss_first, 60_000_000);
        // Flat after warm-up: no growth.
        let flat: Vec<Sample> = (0..5).map(|i| sample(20 + i, i * 100, 5)).collect();
        let g = growth_of(&flat, Duration::ZERO, |s| s.rss_bytes).unwrap();
        assert_eq!(g.bytes_per_100k, 0.0);
        // Too few samples, or no requests: no figure.
        assert!(growth_of(&s, Duration::from_secs(18), |s| s.rss_bytes).is_none());
        let idle: Vec<Sample> = (0..5).map(|i| sample(i, 7, 5)).collect();
        assert!(growth_of(&idle, Duration::ZERO, |s| s.rss_bytes).is_none());
        assert_eq!(mb(1_240_000.0), "1.2 MB");
    }

    #[test]
    fn the_floor_ignores_peaks_but_not_a_rising_baseline() {
        // A baseline rising 1 MB per 10 s with a 50 MB spike in every window.
        let s: Vec<Sample> = (0..60u64)
            .map(|t| {
                let spike = if t % 10 == 3 { 50_000_000 } else { 0 };
                sample(t, t * 100, 100_000_000 + t / 10 * 1_000_000 + spike)
            })
            .collect();
        let floor = floor_samples(&s);
        assert_eq!(floor.len(), 6);
        assert!(floor.iter().all(|f| f.at.as_secs() % 10 == 0), "{floor:?}");
        let g = growth_of(&floor, Duration::ZERO, |s| s.rss_bytes).unwrap();
        // 1 MB per 1000 requests = 100 MB per 100k.
        assert!((g.bytes_per_100k - 100_000_000.0).abs() < 1.0, "{g:?}");
        assert!(floor_samples(&[]).is_empty());
    }
}
