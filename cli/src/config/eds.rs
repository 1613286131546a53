//! Envoy's file-based EDS for the pool clusters (membership [`Membership::Eds`]): one JSON
//! file per pool cluster in one directory, each holding a `resources:` list with that
//! cluster's `envoy.config.endpoint.v3.ClusterLoadAssignment`.
//!
//! Envoy watches the directory (`path_config_source.watched_directory`) and reloads a file
//! when one is moved into it, so every write here goes to a temporary file in the same
//! directory that is then renamed over the real one: Envoy never reads half a file, and a
//! change reaches the cluster at once (this is how a test scales a pool up and down, and
//! how a host is marked unhealthy, draining or degraded by EDS).

use anyhow::{Context, Result};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where a gateway's pool clusters take their members from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Membership {
    /// STATIC clusters holding exactly the pools' endpoints; the picker and the scraper get
    /// the same lists in their configurations (Envoys without EDS).
    #[default]
    Static,
    /// EDS clusters fed from files ([`EdsDir`]); the picker's pools and the scraper follow
    /// the clusters' members as Envoy sees them.
    Eds,
}

/// A member's `health_status` in the load assignment (`envoy.config.core.v3.HealthStatus`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EdsHealth {
    /// `HEALTHY`.
    #[default]
    Healthy,
    /// `DEGRADED`: still serving.
    Degraded,
    /// `UNHEALTHY`.
    Unhealthy,
    /// `DRAINING`: leaving, takes no new requests.
    Draining,
}

impl EdsHealth {
    /// The proto enum name.
    pub fn wire(self) -> &'static str {
        match self {
            EdsHealth::Healthy => "HEALTHY",
            EdsHealth::Degraded => "DEGRADED",
            EdsHealth::Unhealthy => "UNHEALTHY",
            EdsHealth::Draining => "DRAINING",
        }
    }
}

/// One member of a cluster as EDS announces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdsHost {
    /// `ip:port`.
    pub address: SocketAddr,
    /// Its announced health.
    pub health: EdsHealth,
}

impl EdsHost {
    /// A healthy member at `address`.
    pub fn healthy(address: SocketAddr) -> EdsHost {
        EdsHost {
            address,
            health: EdsHealth::Healthy,
        }
    }
}

/// The load assignment of `cluster` over `hosts`, as the EDS file holds it (one resource).
pub fn load_assignment(cluster: &str, hosts: &[EdsHost]) -> serde_json::Value {
    let lb_endpoints: Vec<serde_json::Value> = hosts
        .iter()
        .map(|h| {
            json!({
                "endpoint": {"address": {"socket_address": {
                    "address": h.address.ip().to_string(),
                    "port_value": h.address.port(),
                }}},
                "health_status": h.health.wire(),
            })
        })
        .collect();
    json!({
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": cluster,
            "endpoints": [{"lb_endpoints": lb_endpoints}],
        }]
    })
}

/// The directory of a gateway's EDS files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdsDir {
    dir: PathBuf,
}

impl EdsDir {
    /// The EDS files under `dir` (created if missing).
    pub fn create(dir: impl Into<PathBuf>) -> Result<EdsDir> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the EDS directory {}", dir.display()))?;
        Ok(EdsDir { dir })
    }

    /// The watched directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of `cluster` (`<dir>/<cluster>.json`, a `/` in the name as `_`).
    pub fn path(&self, cluster: &str) -> PathBuf {
        self.dir.join(format!("{}.json", file_stem(cluster)))
    }

    /// Announces `hosts` as the members of `cluster`: writes a temporary file beside the
    /// real one and renames it over it (atomic within the directory).
    pub fn write(&self, cluster: &str, hosts: &[EdsHost]) -> Result<()> {
        let path = self.path(cluster);
        let tmp = self.dir.join(format!(".{}.json.tmp", file_stem(cluster)));
        let text = serde_json::to_vec_pretty(&load_assignment(cluster, hosts))?;
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    }

    /// [`EdsDir::write`] with every member healthy.
    pub fn write_healthy(&self, cluster: &str, addrs: &[SocketAddr]) -> Result<()> {
        let hosts: Vec<EdsHost> = addrs.iter().copied().map(EdsHost::healthy).collect();
        self.write(cluster, &hosts)
    }
}

/// A cluster name as a file name: `/` (Envoy Gateway's `httproute/<ns>/<name>/rule/<i>`)
/// becomes `_`.
fn file_stem(cluster: &str) -> String {
    cluster.replace('/', "_")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn a_write_replaces_the_file_whole_with_one_load_assignment() {
        let run = TempDir::new().unwrap();
        let eds = EdsDir::create(run.path().join("eds")).unwrap();
        eds.write_healthy("pool-0-m", &[addr(1), addr(2)]).unwrap();
        eds.write(
            "pool-0-m",
            &[EdsHost {
                address: addr(3),
                health: EdsHealth::Draining,
            }],
        )
        .unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(eds.path("pool-0-m")).unwrap()).unwrap();
        let resources = v["resources"].as_array().unwrap();
        assert_eq!(resources.len(), 1);
        let cla = &resources[0];
        assert_eq!(
            cla["@type"],
            "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
        );
        assert_eq!(cla["cluster_name"], "pool-0-m");
        let eps = cla["endpoints"][0]["lb_endpoints"].as_array().unwrap();
        assert_eq!(eps.len(), 1);
        assert_eq!(
            eps[0]["endpoint"]["address"]["socket_address"]["port_value"],
            3
        );
        assert_eq!(eps[0]["health_status"], "DRAINING");
        // Only the file itself is left: the temporary one was renamed.
        let names: Vec<_> = std::fs::read_dir(eds.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["pool-0-m.json".to_string()]);
    }

    #[test]
    fn health_names_are_envoys() {
        let wire: Vec<_> = [
            EdsHealth::Healthy,
            EdsHealth::Degraded,
            EdsHealth::Unhealthy,
            EdsHealth::Draining,
        ]
        .iter()
        .map(|h| h.wire())
        .collect();
        assert_eq!(wire, ["HEALTHY", "DEGRADED", "UNHEALTHY", "DRAINING"]);
    }
}
