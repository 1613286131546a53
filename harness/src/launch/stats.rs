//! Reading Envoy's statistics from the admin interface, for assertions in tests
//! (`upstream_rq_total` of a cluster, the gateway filters' own counters, …), and the
//! sample counts of its histograms ([`Histograms`]).
//!
//! Envoy merges the workers' histogram samples on its stats flush (every 5 s by default),
//! so a histogram shows a sample up to one flush after it was recorded. Envoy's counters
//! and gauges are current, but both modules buffer their requests' own and hand them to
//! Envoy within 100 ms (native: every 100 ms; Wasm: at the picker VM's next tick), so
//! [`Stats::fetch`] first waits out [`MODULE_STATS_FLUSH`].

use super::client;
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// How long [`Stats::fetch`] waits before reading, so that what the modules' requests
/// counted has reached Envoy: two of their 100 ms flush periods and a margin.
pub const MODULE_STATS_FLUSH: std::time::Duration = std::time::Duration::from_millis(250);

/// Counters and gauges by full stat name (histograms are left out).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    values: BTreeMap<String, i64>,
}

impl Stats {
    /// Fetches admin `/stats?format=json`, once the module's last flush is in (see the
    /// module doc).
    pub async fn fetch(admin: SocketAddr) -> Result<Stats> {
        tokio::time::sleep(MODULE_STATS_FLUSH).await;
        let resp = client::get(&format!("http://{admin}/stats?format=json")).await?;
        Stats::parse_json(&resp.body)
    }

    /// Parses the admin JSON format: `{"stats": [{"name", "value"}…, {"histograms": …}]}`.
    pub fn parse_json(body: &[u8]) -> Result<Stats> {
        let v: serde_json::Value = serde_json::from_slice(body).context("admin /stats JSON")?;
        let list = v["stats"]
            .as_array()
            .ok_or_else(|| anyhow!("admin /stats: no `stats` array"))?;
        let values = list
            .iter()
            .filter_map(|s| Some((s["name"].as_str()?.to_string(), s["value"].as_i64()?)))
            .collect();
        Ok(Stats { values })
    }

    /// Parses the admin text format (`name: value` per line; histogram lines skipped).
    pub fn parse_text(body: &str) -> Stats {
        let values = body
            .lines()
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(": ")?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect();
        Stats { values }
    }

    /// One stat's value.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.values.get(name).copied()
    }

    /// One stat's value, 0 when absent (Envoy creates some counters lazily).
    pub fn value(&self, name: &str) -> i64 {
        self.get(name).unwrap_or(0)
    }

    /// Every stat whose name starts with `prefix`.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, i64)> {
        self.values
            .range(prefix.to_string()..)
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), *v))
    }

    /// Every stat, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.values.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// Every stat whose name contains `needle` (the gateway's own stats carry a
    /// flavour-specific prefix: `wasmcustom.` for proxy-wasm, the module's metrics
    /// namespace for the dynamic module).
    pub fn containing<'a>(&'a self, needle: &'a str) -> impl Iterator<Item = (&'a str, i64)> {
        self.iter().filter(move |(k, _)| k.contains(needle))
    }

    /// The sum of every stat whose name contains `needle`.
    pub fn sum_containing(&self, needle: &str) -> i64 {
        self.containing(needle).map(|(_, v)| v).sum()
    }

    /// `cluster.<cluster>.upstream_rq_total`.
    pub fn cluster_requests(&self, cluster: &str) -> i64 {
        self.value(&format!("cluster.{cluster}.upstream_rq_total"))
    }
}

/// What Envoy's cumulative histograms hold, by full stat name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histograms {
    totals: BTreeMap<String, HistogramTotals>,
}

/// One histogram's cumulative samples, as Envoy's detailed buckets give them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HistogramTotals {
    /// Samples recorded.
    pub count: u64,
    /// The upper bound of the highest non-empty bucket (0 with no sample): every sample
    /// is at most this.
    pub max: f64,
}

impl Histograms {
    /// Fetches admin `/stats?format=json&histogram_buckets=detailed`.
    pub async fn fetch(admin: SocketAddr) -> Result<Histograms> {
        let url = format!("http://{admin}/stats?format=json&histogram_buckets=detailed");
        let resp = client::get(&url).await?;
        Histograms::parse_json(&resp.body)
    }

    /// Parses the detailed JSON form: a `stats` entry `{"histograms": {"details": [{"name",
    /// "totals": [{"lower_bound", "width", "count"}…]}…]}}` (absent when Envoy has none).
    pub fn parse_json(body: &[u8]) -> Result<Histograms> {
        let v: serde_json::Value = serde_json::from_slice(body).context("admin /stats JSON")?;
        let list = v["stats"]
            .as_array()
            .ok_or_else(|| anyhow!("admin /stats: no `stats` array"))?;
        let mut totals = BTreeMap::new();
        let details = list
            .iter()
            .filter_map(|s| s["histograms"]["details"].as_array())
            .flatten();
        for h in details {
            let Some(name) = h["name"].as_str() else {
                continue;
            };
            let mut t = HistogramTotals::default();
            for bucket in h["totals"].as_array().into_iter().flatten() {
                let count = bucket["count"].as_u64().unwrap_or(0);
                if count == 0 {
                    continue;
                }
                t.count += count;
                let top = bucket["lower_bound"].as_f64().unwrap_or(0.0)
                    + bucket["width"].as_f64().unwrap_or(0.0);
                t.max = t.max.max(top);
            }
            totals.insert(name.to_string(), t);
        }
        Ok(Histograms { totals })
    }

    /// One histogram's totals.
    pub fn get(&self, name: &str) -> Option<HistogramTotals> {
        self.totals.get(name).copied()
    }

    /// Every histogram whose name contains `needle`.
    pub fn containing<'a>(
        &'a self,
        needle: &'a str,
    ) -> impl Iterator<Item = (&'a str, HistogramTotals)> {
        self.totals
            .iter()
            .filter(move |(k, _)| k.contains(needle))
            .map(|(k, v)| (k.as_str(), *v))
    }

    /// The samples of every histogram whose name contains `needle`, added up (`max` the
    /// largest).
    pub fn sum_containing(&self, needle: &str) -> HistogramTotals {
        self.containing(needle)
            .fold(HistogramTotals::default(), |acc, (_, t)| HistogramTotals {
                count: acc.count + t.count,
                max: acc.max.max(t.max),
            })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The shape Envoy 1.40 answers `histogram_buckets=detailed` with.
    #[test]
    fn detailed_histograms_parse_into_counts_and_bounds() {
        let body = br#"{"stats":[{"name":"http.ing.downstream_rq_timeout","value":0},
            {"histograms":{"supported_percentiles":[0,50,100],"details":[
              {"name":"http.admin.downstream_rq_time","totals":[],"intervals":[],
               "percentiles":[{"cumulative":null,"interval":null}]},
              {"name":"wasmcustom.infergate.flow.queue_time_ms.pool.p.band.0",
               "totals":[{"lower_bound":0,"width":0,"count":3},
                         {"lower_bound":1900,"width":100,"count":2},
                         {"lower_bound":5000,"width":10,"count":0}],
               "intervals":[],"percentiles":[]}]}}]}"#;
        let h = Histograms::parse_json(body).unwrap();
        assert_eq!(h.get("http.admin.downstream_rq_time").unwrap().count, 0);
        let q = h
            .get("wasmcustom.infergate.flow.queue_time_ms.pool.p.band.0")
            .unwrap();
        assert_eq!((q.count, q.max), (5, 2000.0));
        let sum = h.sum_containing("downstream_rq_time");
        assert_eq!((sum.count, sum.max), (0, 0.0));
        assert_eq!(h.sum_containing("infergate.flow.").count, 5);
        assert!(h.get("missing").is_none());
        let empty = Histograms::parse_json(br#"{"stats":[{"name":"a","value":1}]}"#).unwrap();
        assert_eq!(empty.containing("").count(), 0);
        assert!(Histograms::parse_json(b"{}").is_err());
    }

    #[test]
    fn json_and_text_forms_parse_counters_and_skip_histograms() {
        let json = br#"{"stats":[{"name":"cluster.rr.upstream_rq_total","value":7},
            {"name":"cluster.rr.upstream_rq_200","value":6},{"name":"server.live","value":1},
            {"histograms":{"supported_quantiles":[0.5]}}]}"#;
        let s = Stats::parse_json(json).unwrap();
        assert_eq!(s.cluster_requests("rr"), 7);
        assert_eq!(s.value("missing"), 0);
        let names: Vec<_> = s.with_prefix("cluster.rr.").map(|(k, _)| k).collect();
        assert_eq!(names.len(), 2);
        assert_eq!(s.sum_containing(".upstream_rq_"), 13);
        assert_eq!(s.containing("live").count(), 1);
        let t = Stats::parse_text("cluster.rr.upstream_rq_total: 7\nh: P0(nan,1)\n");
        assert_eq!(t.get("cluster.rr.upstream_rq_total"), Some(7));
        assert_eq!(t.get("h"), None);
        assert!(Stats::parse_json(b"{}").is_err());
    }
}
