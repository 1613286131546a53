//! Reading Envoy's statistics from the admin interface, for assertions in tests
//! (`upstream_rq_total` of a cluster, the gateway filters' own counters, …).

use super::client;
use anyhow::{anyhow, Context, Result};
use std::collections::BTreeMap;
use std::net::SocketAddr;

/// Counters and gauges by full stat name (histograms are left out).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    values: BTreeMap<String, i64>,
}

impl Stats {
    /// Fetches admin `/stats?format=json`.
    pub async fn fetch(admin: SocketAddr) -> Result<Stats> {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
