//! Pool membership: which endpoints an Envoy cluster holds right now, and how healthy each
//! one is, as the scraper learns it and publishes it in the snapshot.
//!
//! The types are the core's ([`Health`], [`Member`], [`ClusterMembers`]), because they
//! travel inside the encoded snapshot from the scraper to every picker.
//!
//! Two ways to learn a cluster's members (the scraper's `membership` setting):
//!
//! - `host`: the host tells ([`crate::host::ClusterMembership`]). The native module reads
//!   the cluster's hosts and their health where Envoy hands them to a load-balancer policy.
//! - `admin`: a periodic callout to Envoy's own admin endpoint, `GET /clusters?format=json`,
//!   through a STATIC cluster that points at the admin address, parsed by
//!   [`parse_admin_clusters`]. This is the proxy-wasm way: a Wasm module cannot see a
//!   cluster's hosts, but it can call out to any cluster.
//!
//! Health as Envoy reports it, mapped to [`Health`] ([`health_of`]):
//!
//! - `Unhealthy`: a failed active health check (or its timeout, or an immediate health
//!   check failure), outlier ejection, a host still waiting for its first active health
//!   check, or EDS `UNHEALTHY` / `DRAINING` / `TIMEOUT`. Envoy itself keeps such hosts out
//!   of load balancing.
//! - `Degraded`: EDS `DEGRADED` or a failed degraded check. Still a candidate.
//! - `Healthy`: everything else (EDS `HEALTHY` or `UNKNOWN`, no failure flag).
//!
//! A host that Envoy keeps only until its connections drain (`pending_dynamic_removal`:
//! gone from service discovery) is not a member at all, so the picker treats it as removed.
//!
//! Parsing is bounded: a body above [`MAX_ADMIN_PAGE_BYTES`], more than [`MAX_CLUSTERS`]
//! clusters or more than [`MAX_HOSTS_PER_CLUSTER`] hosts in one cluster is an error, never a
//! partial membership; fields this code does not read are ignored; a host whose address is
//! not an IP socket address (a pipe, an internal address) is skipped. Nothing here panics
//! on any input.

use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;

pub use scheduler_core::snapshot::{ClusterMembers, Health, Member};

/// The largest admin answer accepted, bytes. An Envoy's `/clusters?format=json` costs about
/// 1.5 KiB per host with its stats, so this is some ten thousand hosts.
pub const MAX_ADMIN_PAGE_BYTES: usize = 16 * 1024 * 1024;
/// The most clusters one admin answer may list.
pub const MAX_CLUSTERS: usize = 4096;
/// The most hosts one cluster may list.
pub const MAX_HOSTS_PER_CLUSTER: usize = 16_384;

/// Why an admin answer could not be read as cluster membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipError {
    /// The body is longer than [`MAX_ADMIN_PAGE_BYTES`] (its length).
    TooLarge(usize),
    /// The body is not the JSON of `/clusters?format=json` (serde's message).
    Json(String),
    /// More than [`MAX_CLUSTERS`] clusters (the count).
    TooManyClusters(usize),
    /// A cluster lists more than [`MAX_HOSTS_PER_CLUSTER`] hosts.
    TooManyHosts {
        /// The cluster.
        cluster: String,
        /// Its host count.
        hosts: usize,
    },
}

impl core::fmt::Display for MembershipError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            MembershipError::TooLarge(n) => write!(
                f,
                "admin clusters answer is {n} bytes, above the limit of {MAX_ADMIN_PAGE_BYTES}"
            ),
            MembershipError::Json(e) => write!(f, "admin clusters answer: {e}"),
            MembershipError::TooManyClusters(n) => write!(
                f,
                "admin clusters answer lists {n} clusters, above the limit of {MAX_CLUSTERS}"
            ),
            MembershipError::TooManyHosts { cluster, hosts } => write!(
                f,
                "admin clusters answer: cluster `{}` lists {hosts} hosts, above the limit of \
                 {MAX_HOSTS_PER_CLUSTER}",
                crate::reply::truncate_for_message(cluster, 64)
            ),
        }
    }
}

/// `GET /clusters?format=json`: only the fields read here.
#[derive(Deserialize)]
struct AdminClusters {
    #[serde(default)]
    cluster_statuses: Vec<ClusterStatus>,
}

#[derive(Deserialize)]
struct ClusterStatus {
    #[serde(default)]
    name: String,
    #[serde(default)]
    host_statuses: Vec<HostStatus>,
}

#[derive(Deserialize)]
struct HostStatus {
    #[serde(default)]
    address: Option<Address>,
    #[serde(default)]
    health_status: HostHealth,
}

#[derive(Deserialize)]
struct Address {
    #[serde(default)]
    socket_address: Option<SocketAddress>,
}

#[derive(Deserialize)]
struct SocketAddress {
    #[serde(default)]
    address: String,
    #[serde(default)]
    port_value: u32,
}

/// Envoy's per-host health flags (its admin `HostHealthStatus`). Absent flags are false.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct HostHealth {
    /// Failed its active health check.
    pub failed_active_health_check: bool,
    /// Ejected by outlier detection.
    pub failed_outlier_check: bool,
    /// Marked degraded by its active health check.
    pub failed_active_degraded_check: bool,
    /// Gone from service discovery; kept until its connections drain.
    pub pending_dynamic_removal: bool,
    /// New, and waiting for its first active health check before Envoy uses it.
    pub pending_active_hc: bool,
    /// Failed an immediate health check (`x-envoy-immediate-health-check-fail`).
    pub excluded_via_immediate_hc_fail: bool,
    /// Its active health check timed out.
    pub active_hc_timeout: bool,
    /// The health EDS assigned (`HEALTHY`, `UNHEALTHY`, `DRAINING`, `TIMEOUT`,
    /// `DEGRADED`, `UNKNOWN`); empty when absent.
    pub eds_health_status: String,
}

/// The [`Health`] of a host with these flags, or `None` when it is no member any more (see
/// the module doc).
pub fn health_of(flags: &HostHealth) -> Option<Health> {
    if flags.pending_dynamic_removal {
        return None;
    }
    let eds = flags.eds_health_status.as_str();
    if flags.failed_active_health_check
        || flags.failed_outlier_check
        || flags.pending_active_hc
        || flags.excluded_via_immediate_hc_fail
        || flags.active_hc_timeout
        || matches!(eds, "UNHEALTHY" | "DRAINING" | "TIMEOUT")
    {
        return Some(Health::Unhealthy);
    }
    if flags.failed_active_degraded_check || eds == "DEGRADED" {
        return Some(Health::Degraded);
    }
    Some(Health::Healthy)
}

/// Every cluster of an Envoy admin `GET /clusters?format=json` answer with its members
/// (see the module doc for the bounds and the health mapping). A cluster listed twice
/// keeps its first entry; a member listed twice in one cluster keeps its first entry.
pub fn parse_admin_clusters(body: &[u8]) -> Result<Vec<ClusterMembers>, MembershipError> {
    parse_admin_clusters_where(body, |_| true)
}

/// [`parse_admin_clusters`], keeping only the clusters `wanted` accepts (the bounds apply to
/// every cluster all the same).
pub fn parse_admin_clusters_where(
    body: &[u8],
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<ClusterMembers>, MembershipError> {
    if body.len() > MAX_ADMIN_PAGE_BYTES {
        return Err(MembershipError::TooLarge(body.len()));
    }
    let parsed: AdminClusters =
        serde_json::from_slice(body).map_err(|e| MembershipError::Json(e.to_string()))?;
    if parsed.cluster_statuses.len() > MAX_CLUSTERS {
        return Err(MembershipError::TooManyClusters(
            parsed.cluster_statuses.len(),
        ));
    }
    let mut out: Vec<ClusterMembers> = Vec::new();
    for cluster in parsed.cluster_statuses {
        if cluster.host_statuses.len() > MAX_HOSTS_PER_CLUSTER {
            return Err(MembershipError::TooManyHosts {
                hosts: cluster.host_statuses.len(),
                cluster: cluster.name,
            });
        }
        if !wanted(&cluster.name) || out.iter().any(|c| c.cluster == cluster.name) {
            continue;
        }
        let mut members: Vec<Member> = Vec::with_capacity(cluster.host_statuses.len());
        for host in &cluster.host_statuses {
            let Some(address) = host_address(host) else {
                continue;
            };
            let Some(health) = health_of(&host.health_status) else {
                continue;
            };
            if members.iter().any(|m| m.address == address) {
                continue;
            }
            members.push(Member { address, health });
        }
        out.push(ClusterMembers {
            cluster: cluster.name,
            members,
        });
    }
    Ok(out)
}

/// `ip:port` of a host, in the form `SocketAddr` prints (IPv6 in brackets), if it is an IP
/// socket address with a port that fits.
fn host_address(host: &HostStatus) -> Option<String> {
    let socket = host.address.as_ref()?.socket_address.as_ref()?;
    let ip: IpAddr = socket.address.parse().ok()?;
    let port = u16::try_from(socket.port_value).ok()?;
    Some(SocketAddr::new(ip, port).to_string())
}

#[cfg(test)]
#[path = "membership_tests.rs"]
mod tests;
