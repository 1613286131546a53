//! The peers file: where each cluster of the ClusterSet runs its gateway.
//!
//! An `InferencePoolImport` names the clusters that export a pool, not where to reach them,
//! so peer discovery is a file, in the shape llm-d's file-based multi-cluster discovery
//! reads: `endpoints: [{name, address, port}]`, one entry per cluster (its name as the
//! imports' `exportingClusters` name it, its gateway's listener). `namespace` and `labels`
//! are accepted and not used. The address must be an IP: the peers cluster is a STATIC
//! Envoy cluster. A file keeps working when clusters come and go, and is what an operator
//! (or a ClusterSet controller) can write without an API to watch.

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

/// A port as llm-d writes it (a string) or as a number.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum Port {
    Number(u16),
    Text(String),
}

/// One entry of the file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    #[serde(default)]
    #[allow(dead_code)]
    namespace: Option<String>,
    address: String,
    port: Port,
    #[serde(default)]
    #[allow(dead_code)]
    labels: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    endpoints: Vec<Entry>,
}

/// Every cluster's gateway, by cluster name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeersFile {
    /// `(cluster name, gateway listener)`, in file order, each name once.
    pub clusters: Vec<(String, SocketAddr)>,
}

impl PeersFile {
    /// Parses the text of a peers file (YAML or JSON).
    pub fn parse(text: &str) -> Result<PeersFile> {
        let file: File = serde_yaml_ng::from_str(text).context("a peers file")?;
        let mut clusters: Vec<(String, SocketAddr)> = Vec::new();
        for (i, entry) in file.endpoints.into_iter().enumerate() {
            let at = format!("endpoints[{i}] ({})", entry.name);
            if entry.name.is_empty() {
                bail!("endpoints[{i}]: name: must not be empty");
            }
            let ip: IpAddr = entry.address.parse().with_context(|| {
                format!(
                    "{at}: address `{}` is not an IP (the peers cluster is STATIC)",
                    entry.address
                )
            })?;
            let port = match entry.port {
                Port::Number(p) => p,
                Port::Text(t) => t
                    .parse()
                    .with_context(|| format!("{at}: port `{t}` is not a port"))?,
            };
            if port == 0 {
                bail!("{at}: port 0 is not a port");
            }
            if clusters.iter().any(|(n, _)| n == &entry.name) {
                bail!("{at}: cluster `{}` is listed twice", entry.name);
            }
            clusters.push((entry.name, SocketAddr::new(ip, port)));
        }
        Ok(PeersFile { clusters })
    }

    /// Reads the file at `path`.
    pub fn load(path: &Path) -> Result<PeersFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        PeersFile::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// The gateway of cluster `name`.
    pub fn gateway(&self, name: &str) -> Option<SocketAddr> {
        self.clusters
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn llm_d_discovery_files_are_read() {
        let file = PeersFile::parse(
            "endpoints:\n\
             - {name: cluster-b, namespace: default, address: 10.1.0.7, port: \"8080\",\n   \
                labels: {region: us-east}}\n\
             - {name: cluster-c, address: 10.2.0.7, port: 8081}\n",
        )
        .unwrap();
        assert_eq!(
            file.gateway("cluster-b"),
            Some("10.1.0.7:8080".parse().unwrap())
        );
        assert_eq!(
            file.gateway("cluster-c"),
            Some("10.2.0.7:8081".parse().unwrap())
        );
        assert_eq!(file.gateway("cluster-a"), None);
    }

    #[test]
    fn what_a_static_cluster_cannot_take_is_refused() {
        for (text, says) in [
            ("endpoints: [{name: b, address: gw.example, port: 80}]", "not an IP"),
            ("endpoints: [{name: b, address: 10.0.0.1, port: \"x\"}]", "not a port"),
            ("endpoints: [{name: b, address: 10.0.0.1, port: 0}]", "port 0"),
            (
                "endpoints: [{name: b, address: 10.0.0.1, port: 1}, {name: b, address: 10.0.0.2, port: 1}]",
                "twice",
            ),
            ("endpoints: [{name: b, address: 10.0.0.1, port: 1, zone: x}]", "unknown field"),
        ] {
            let err = format!("{:#}", PeersFile::parse(text).unwrap_err());
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
