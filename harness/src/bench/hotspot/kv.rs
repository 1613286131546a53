//! Watching the replicas' KV usage as the gateway's scraper sees it: every replica's
//! `/metrics` page fetched over HTTP every [`INTERVAL`], its KV usage and queue read from
//! vLLM's metric names, kept as timed samples that a run's window is cut from.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::launch::client;

/// How often each replica is scraped (the gateway's scraper runs every 50 ms).
pub const INTERVAL: Duration = Duration::from_millis(100);

/// vLLM's KV usage gauge (0..1), as the simulator exports it.
pub const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// vLLM's older name for the same gauge.
pub const KV_USAGE_OLD: &str = "vllm:gpu_cache_usage_perc";
/// Requests waiting for admission.
pub const WAITING: &str = "vllm:num_requests_waiting";

/// One scrape of one replica.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Since the watch started.
    pub at: Duration,
    /// Replica index.
    pub replica: usize,
    /// KV usage, 0..1.
    pub kv: f64,
    /// Requests waiting.
    pub waiting: f64,
}

/// The value of the first sample of metric `name` on a Prometheus text page.
pub fn metric_value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.trim().parse().ok())
}

/// KV usage over a window of samples of one replica.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvWindow {
    /// Samples in the window.
    pub samples: usize,
    /// Lowest KV usage seen.
    pub min: f64,
    /// Mean KV usage.
    pub mean: f64,
    /// Highest KV usage seen.
    pub max: f64,
    /// Most requests seen waiting.
    pub max_waiting: f64,
}

/// The KV figures of `replica` over samples taken in `[from, to)`.
pub fn window(samples: &[Sample], replica: usize, from: Duration, to: Duration) -> KvWindow {
    let kv: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.replica == replica && s.at >= from && s.at < to)
        .collect();
    if kv.is_empty() {
        return KvWindow::default();
    }
    let n = kv.len() as f64;
    KvWindow {
        samples: kv.len(),
        min: kv.iter().map(|s| s.kv).fold(f64::INFINITY, f64::min),
        mean: kv.iter().map(|s| s.kv).sum::<f64>() / n,
        max: kv.iter().map(|s| s.kv).fold(f64::NEG_INFINITY, f64::max),
        max_waiting: kv.iter().map(|s| s.waiting).fold(0.0, f64::max),
    }
}

/// A background scraper of every replica; [`KvWatch::stop`] returns its samples.
#[derive(Debug)]
pub struct KvWatch {
    start: Instant,
    samples: Arc<Mutex<Vec<Sample>>>,
    failures: Arc<Mutex<u64>>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl KvWatch {
    /// Starts scraping `urls` (replica base URLs, in replica order).
    pub fn start(urls: Vec<String>) -> KvWatch {
        let start = Instant::now();
        let samples = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(0u64));
        let (stop, mut stop_rx) = watch::channel(false);
        let (s, f) = (samples.clone(), failures.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = stop_rx.changed() => return,
                    _ = tick.tick() => {}
                }
                for (replica, url) in urls.iter().enumerate() {
                    let page = client::get(&format!("{url}/metrics")).await;
                    let at = start.elapsed();
                    let parsed = page.ok().filter(|p| p.status == 200).and_then(|p| {
                        let text = p.text();
                        let kv = metric_value(&text, KV_USAGE)
                            .or_else(|| metric_value(&text, KV_USAGE_OLD))?;
                        let waiting = metric_value(&text, WAITING).unwrap_or(0.0);
                        Some(Sample {
                            at,
                            replica,
                            kv,
                            waiting,
                        })
                    });
                    match parsed {
                        Some(sample) => {
                            if let Ok(mut v) = s.lock() {
                                v.push(sample);
                            }
                        }
                        None => {
                            if let Ok(mut n) = f.lock() {
                                *n += 1;
                            }
                        }
                    }
                }
            }
        });
        KvWatch {
            start,
            samples,
            failures,
            stop,
            task,
        }
    }

    /// Time since the watch started (the clock of its samples).
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// The samples so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// The latest sample of `replica`, if any.
    pub fn latest(&self, replica: usize) -> Option<Sample> {
        self.samples
            .lock()
            .ok()
            .and_then(|v| v.iter().rev().find(|s| s.replica == replica).copied())
    }

    /// Stops scraping; returns every sample and the number of failed scrapes.
    pub async fn stop(self) -> (Vec<Sample>, u64) {
        let KvWatch {
            samples,
            failures,
            stop,
            task,
            ..
        } = self;
        let _ = stop.send(true);
        let _ = task.await;
        let samples = samples.lock().map(|v| v.clone()).unwrap_or_default();
        let failures = failures.lock().map(|n| *n).unwrap_or(0);
        (samples, failures)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn metric_value_reads_the_named_series_only() {
        let page = "# HELP vllm:kv_cache_usage_perc KV.\n# TYPE vllm:kv_cache_usage_perc gauge\n\
                    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.9625\n\
                    vllm:num_requests_waiting{engine=\"0\"} 3\n\
                    vllm:num_requests_waiting_total 9\nplain 1.5\n";
        assert_eq!(metric_value(page, KV_USAGE), Some(0.9625));
        assert_eq!(metric_value(page, WAITING), Some(3.0));
        assert_eq!(metric_value(page, "plain"), Some(1.5));
        assert_eq!(metric_value(page, KV_USAGE_OLD), None);
        assert_eq!(metric_value(page, "vllm:kv_cache"), None);
    }

    #[test]
    fn window_takes_one_replica_within_the_bounds() {
        let s = |ms: u64, replica: usize, kv: f64| Sample {
            at: Duration::from_millis(ms),
            replica,
            kv,
            waiting: kv * 10.0,
        };
        let samples = [
            s(0, 0, 0.5),
            s(100, 0, 0.96),
            s(200, 0, 0.98),
            s(200, 1, 0.1),
            s(300, 0, 0.4),
        ];
        let w = window(
            &samples,
            0,
            Duration::from_millis(100),
            Duration::from_millis(300),
        );
        assert_eq!(w.samples, 2);
        assert!((w.min - 0.96).abs() < 1e-12 && (w.max - 0.98).abs() < 1e-12);
        assert!((w.mean - 0.97).abs() < 1e-12);
        assert!((w.max_waiting - 9.8).abs() < 1e-12);
        assert_eq!(
            window(&samples, 2, Duration::ZERO, Duration::from_secs(1)).samples,
            0
        );
    }
}
