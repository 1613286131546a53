//! Picker configuration: per pool its base model, its Envoy cluster, its endpoints, the
//! failure mode, the staleness bound, the fallback count and the `EndpointPickerConfig`.
//!
//! JSON (camelCase), either `{"pools": [POOL, ...]}` or a single `POOL`:
//!
//! ```json
//! {"pool": "llama-pool", "baseModel": "llama", "cluster": "llama-pool",
//!  "endpoints": ["10.0.0.1:8000", "10.0.0.2"], "targetPorts": [8000, 8001],
//!  "fallbacks": 1, "failureMode": "FailClose", "staleAfterMs": 1000,
//!  "maxConsecutiveFailures": 3, "sessionHeader": "x-session-id", "maxSessions": 10000,
//!  "endpointRoles": {"10.0.0.1:8000": "prefill"}, "eppConfig": { ... }}
//! ```
//!
//! Without `endpoints`, a pool follows its cluster: its endpoints are the cluster's
//! members as the scraper learned them from Envoy and published them in the snapshot, and
//! they change as the cluster does (a member's `targetPorts` do not apply: Envoy's hosts
//! carry their ports). With `endpoints`, the list is static (an Envoy without EDS), and a
//! member the snapshot reports unhealthy is still no candidate.
//!
//! A request reaches the pool whose `cluster` (default: its `pool` name) is the cluster
//! Envoy's route chose for it, so two pools may serve one base model (a canary split by
//! Envoy's weighted clusters); when the host cannot tell the cluster, or no pool has it, the
//! first pool serving the request's base model is used. An endpoint given as a bare IP is
//! expanded to one endpoint per `targetPorts` entry (data-parallel ranks of one pod, each
//! scraped and picked on its own); an endpoint with a port stays as it is.
//!
//! Beside `pools`, `objectives` lists `InferenceObjective` objects: the priorities of flow
//! control, for every pool whose `eppConfig` enables it.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use scheduler_core::scheduling::candidates::CandidateRules;
use serde::Deserialize;
use serde_json::Value;

use crate::headers::is_reserved;
use crate::reply::truncate_for_message;

/// What to do when the pool's metrics are stale or missing: `FailClose` (503, the default)
/// or `FailOpen` (the live endpoints by in-proxy state only). The core's type, so the
/// picker and `explain` read the same rules.
pub use scheduler_core::scheduling::candidates::FailureMode;

/// One pool's configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolConfig {
    /// The pool's name (stats label).
    pub pool: String,
    /// The base model it serves; requests are matched on `x-gateway-base-model-name`.
    pub base_model: String,
    /// The Envoy cluster whose requests this pool picks for; `None`: the pool's name.
    #[serde(default)]
    pub cluster: Option<String>,
    /// The pool's static endpoints, `ip:port`, or a bare IP with `targetPorts`. Absent (or
    /// empty): the pool follows the members of its `cluster` as the scraper publishes them
    /// in the snapshot ([`PoolConfig::follows_cluster`]). The picker only ever emits a
    /// current member: one of these ([`PoolConfig::expanded_endpoints`]), or one of the
    /// cluster's members.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// The ports of every bare-IP endpoint (data parallelism: one rank per port).
    #[serde(default)]
    pub target_ports: Vec<u16>,
    /// How many fallback endpoints follow the pick in the destination list (Envoy's retry
    /// takes the next one).
    #[serde(default = "default_fallbacks")]
    pub fallbacks: usize,
    /// Stale or missing metrics → 503 (`FailClose`) or in-proxy load only (`FailOpen`).
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// A sample older than this (ms) counts as unknown.
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// An endpoint whose last this-many scrapes failed is dropped from the candidates
    /// (0 disables the check).
    #[serde(default = "default_max_consecutive_failures")]
    pub max_consecutive_failures: u32,
    /// The `EndpointPickerConfig` document; absent → [`default_epp_config`].
    #[serde(default)]
    pub epp_config: Option<Value>,
    /// Request header carrying a session id (for `session-affinity-scorer`).
    #[serde(default)]
    pub session_header: Option<String>,
    /// Sessions remembered per pool (oldest forgotten first).
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
    /// Prefill/decode roles of the endpoints (see [`super::disagg`]); absent: every
    /// endpoint serves both phases.
    #[serde(default)]
    pub endpoint_roles: super::disagg::EndpointRoles,
    /// Whether the gateway publishes the pool's load for the gateways of other clusters
    /// (the pool's `inference.networking.x-k8s.io/export` annotation), on
    /// `GET /infergate/pools/<pool>/metrics` (`crate::stages::ExportStage`).
    #[serde(default)]
    pub export: bool,
    /// The name the export page is published under (the exported `InferencePool`'s name,
    /// which the importing clusters know it by); absent: the pool's name.
    #[serde(default)]
    pub export_name: Option<String>,
    /// Whether the export page also lists the pool's candidate members, for gateways that
    /// import the pool in Endpoint Mode (they send requests straight to them). Off by
    /// default: the page needs no credential, and the members are internal addresses.
    #[serde(default)]
    pub export_members: bool,
    /// The gateways of other clusters that serve this pool, and when a request goes to one
    /// of them ([`super::peers`]).
    #[serde(default)]
    pub peers: Option<super::peers::PeersConfig>,
    /// The index of the pool of this pool's `peers` ([`PickerConfig::from_json`] adds it
    /// after the configured pools).
    #[serde(skip)]
    pub peers_pool: Option<usize>,
    /// For the pool of a pool's `peers`: that pool's name.
    #[serde(skip)]
    pub peer_of: Option<String>,
}

impl PoolConfig {
    /// The Envoy cluster this pool picks for.
    pub fn cluster_name(&self) -> &str {
        self.cluster.as_deref().unwrap_or(&self.pool)
    }

    /// True if the pool has no static `endpoints` and picks among the members of its
    /// cluster, as the snapshot carries them.
    pub fn follows_cluster(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// The pool's endpoints with every bare IP expanded to one `ip:port` per target port,
    /// in configuration order (see [`expand_target_ports`]).
    pub fn expanded_endpoints(&self) -> Result<Vec<String>, String> {
        expand_target_ports(&self.endpoints, &self.target_ports)
    }

    /// The thresholds that classify the pool's endpoints (shared with `explain`).
    pub fn candidate_rules(&self) -> CandidateRules {
        CandidateRules {
            stale_after_ms: self.stale_after_ms,
            max_consecutive_failures: self.max_consecutive_failures,
            failure_mode: self.failure_mode,
        }
    }
}

/// Expand `endpoints` for `ports`: an `ip:port` stays as it is, a bare IP (v4, or v6 with
/// or without brackets) becomes one `ip:port` per port, in port order. A bare IP with no
/// ports, or an entry that is neither, is the error (the entry, quoted). Shared by every
/// config that lists a pool's endpoints, so the picker and the scraper see the same list.
pub fn expand_target_ports(endpoints: &[String], ports: &[u16]) -> Result<Vec<String>, String> {
    let mut out = Vec::with_capacity(endpoints.len() * ports.len().max(1));
    for endpoint in endpoints {
        if endpoint.parse::<SocketAddr>().is_ok() {
            out.push(endpoint.clone());
            continue;
        }
        let bare = endpoint.trim_start_matches('[').trim_end_matches(']');
        let ip: IpAddr = bare.parse().map_err(|_| {
            format!(
                "`{}` is neither ip:port nor an IP",
                truncate_for_message(endpoint, 64)
            )
        })?;
        if ports.is_empty() {
            return Err(format!(
                "`{}` has no port and targetPorts is empty",
                truncate_for_message(endpoint, 64)
            ));
        }
        out.extend(
            ports
                .iter()
                .map(|&port| SocketAddr::new(ip, port).to_string()),
        );
    }
    Ok(out)
}

/// `pool`'s endpoints expanded, or the first entry that does not expand.
fn expand_pool(pool: &PoolConfig) -> Result<Vec<String>, PickerConfigError> {
    let mut out = Vec::with_capacity(pool.endpoints.len());
    for endpoint in &pool.endpoints {
        let expanded = expand_target_ports(std::slice::from_ref(endpoint), &pool.target_ports)
            .map_err(|_| PickerConfigError::BadEndpoint {
                pool: pool.pool.clone(),
                endpoint: truncate_for_message(endpoint, 64).into_owned(),
            })?;
        out.extend(expanded);
    }
    Ok(out)
}

pub(super) fn default_fallbacks() -> usize {
    1
}

pub(super) fn default_stale_after_ms() -> u64 {
    scheduler_core::snapshot::DEFAULT_MAX_AGE_MS
}

pub(super) fn default_max_consecutive_failures() -> u32 {
    scheduler_core::scheduling::candidates::DEFAULT_MAX_CONSECUTIVE_FAILURES
}

fn default_max_sessions() -> usize {
    10_000
}

/// The scheduling configuration used when a pool sets no `eppConfig`: the llm-d-style
/// default of prefix affinity weighed against queue depth, KV usage and this proxy's own
/// in-flight load, with a max-score pick. Endpoints above 90% KV usage are left out while
/// any endpoint is below it: the scorers alone would still send a full replica the turns
/// of conversations it holds (prefix weight 3) and new requests when this proxy has little
/// in flight there (its load may come from elsewhere), where they queue or preempt.
/// A prompt no endpoint is known to hold is placed by `rendezvous-placement-scorer`
/// (weight 4, above the three load scorers together, whose balance it keeps with its own
/// load bound), so every gateway replica sends a conversation's turns to the same endpoint.
pub fn default_epp_config() -> Value {
    serde_json::json!({
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "inflight-load-producer"},
            {"type": "utilization-filter", "parameters": {
                "conditions": [{"metric": "kv-cache-utilization", "maxValue": 0.9}],
                "fallbackOnEmpty": true}},
            {"type": "prefix-cache-scorer"},
            {"type": "rendezvous-placement-scorer"},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "inflight-load-scorer"},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [{
            "name": "default",
            "plugins": [
                {"pluginRef": "utilization-filter"},
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "rendezvous-placement-scorer", "weight": 4},
                {"pluginRef": "queue-scorer", "weight": 1},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
                {"pluginRef": "inflight-load-scorer", "weight": 1},
                {"pluginRef": "max-score-picker"}
            ]
        }]
    })
}

/// The picker's whole configuration.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PickerConfig {
    /// The pools, matched by base model.
    pub pools: Vec<PoolConfig>,
    /// `InferenceObjective` objects (as the platform has them): an objective's name, which
    /// the auth stage injects as `x-llm-d-inference-objective`, to its priority. They apply
    /// to every pool with flow control.
    #[serde(default)]
    pub objectives: Vec<Value>,
}

/// A configuration the picker cannot run with.
#[derive(Clone, Debug, PartialEq)]
pub enum PickerConfigError {
    /// The JSON does not have the expected shape.
    Json(String),
    /// An endpoint is not an `ip:port`.
    BadEndpoint {
        /// The pool.
        pool: String,
        /// The offending entry.
        endpoint: String,
    },
    /// An endpoint is listed twice in one pool.
    DuplicateEndpoint {
        /// The pool.
        pool: String,
        /// The repeated entry.
        endpoint: String,
    },
    /// Two pools pick for the same Envoy cluster.
    DuplicateCluster(String),
    /// The `eppConfig` does not compile.
    Scheduler {
        /// The pool.
        pool: String,
        /// The core's error.
        error: String,
    },
    /// A field holds a value the picker cannot work with.
    Field {
        /// The field's path, e.g. `pools[0].staleAfterMs`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl core::fmt::Display for PickerConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PickerConfigError::Json(e) => write!(f, "picker config: {e}"),
            PickerConfigError::BadEndpoint { pool, endpoint } => {
                write!(
                    f,
                    "picker config: pool `{pool}`: endpoints: `{endpoint}` is not ip:port"
                )
            }
            PickerConfigError::DuplicateEndpoint { pool, endpoint } => {
                write!(f, "picker config: pool `{pool}`: `{endpoint}` listed twice")
            }
            PickerConfigError::DuplicateCluster(c) => {
                write!(
                    f,
                    "picker config: two pools pick for Envoy cluster `{c}` (set `cluster` \
                     on one of them)"
                )
            }
            PickerConfigError::Scheduler { pool, error } => {
                write!(f, "picker config: pool `{pool}`: eppConfig: {error}")
            }
            PickerConfigError::Field { field, problem } => {
                write!(f, "picker config: {field}: {problem}")
            }
        }
    }
}

impl PickerConfig {
    /// Parse `{"pools": [...]}` or a single pool object; every pool's endpoints come out
    /// expanded for its `targetPorts` (a bare IP without ports is a [`PickerConfigError::BadEndpoint`]).
    pub fn from_json(value: Value) -> Result<PickerConfig, PickerConfigError> {
        let json = |e: serde_json::Error| PickerConfigError::Json(e.to_string());
        let mut config = if value.get("pools").is_some() {
            serde_json::from_value(value).map_err(json)?
        } else {
            let pool: PoolConfig = serde_json::from_value(value).map_err(json)?;
            PickerConfig {
                pools: vec![pool],
                objectives: Vec::new(),
            }
        };
        for pool in &mut config.pools {
            pool.endpoints = expand_pool(pool)?;
        }
        // Each pool's peer gateways become a pool of their own, after the configured ones
        // (so a lookup by base model finds the local pool first).
        let configured = config.pools.len();
        for i in 0..configured {
            let Some(peers) = config
                .pools
                .get(i)
                .and_then(|p| Some((p.peers.as_ref()?, p)))
            else {
                continue;
            };
            let (section, local) = peers;
            let mut pool = section.pool_config(local);
            pool.endpoints = expand_pool(&pool)?;
            let index = config.pools.len();
            config.pools.push(pool);
            if let Some(local) = config.pools.get_mut(i) {
                local.peers_pool = Some(index);
            }
        }
        Ok(config)
    }

    /// Check what serde cannot: endpoint syntax, duplicates (of an endpoint in a pool, of a
    /// cluster across pools), a zero staleness bound (every
    /// sample would count as stale, so a `FailClose` pool would answer only 503s) and a
    /// session header the gateway strips from every request (`x-gateway-*`, `x-llm-d-*`:
    /// affinity would never see it).
    pub fn validate(&self) -> Result<(), PickerConfigError> {
        let mut clusters = HashSet::new();
        for (i, pool) in self.pools.iter().enumerate() {
            if pool.stale_after_ms == 0 {
                return Err(PickerConfigError::Field {
                    field: format!("pools[{i}].staleAfterMs"),
                    problem: "must be positive (0 makes every sample stale)".to_owned(),
                });
            }
            if let Some(header) = &pool.session_header {
                if header.is_empty() || is_reserved(header) {
                    return Err(PickerConfigError::Field {
                        field: format!("pools[{i}].sessionHeader"),
                        problem: format!(
                            "`{}` is a gateway header (x-gateway-*, x-llm-d-*), which is \
                             removed from every request, so affinity would never see it",
                            truncate_for_message(header, 64)
                        ),
                    });
                }
            }
            if !clusters.insert(pool.cluster_name()) {
                return Err(PickerConfigError::DuplicateCluster(
                    pool.cluster_name().to_owned(),
                ));
            }
            let mut seen = HashSet::new();
            for endpoint in &pool.endpoints {
                if endpoint.parse::<SocketAddr>().is_err() {
                    return Err(PickerConfigError::BadEndpoint {
                        pool: pool.pool.clone(),
                        endpoint: truncate_for_message(endpoint, 64).into_owned(),
                    });
                }
                if !seen.insert(endpoint.as_str()) {
                    return Err(PickerConfigError::DuplicateEndpoint {
                        pool: pool.pool.clone(),
                        endpoint: endpoint.clone(),
                    });
                }
            }
            let roles = if pool.follows_cluster() {
                pool.endpoint_roles.check()
            } else {
                pool.endpoint_roles.resolve(&pool.endpoints).map(drop)
            };
            if let Err(problem) = roles {
                return Err(PickerConfigError::Field {
                    field: format!("pools[{i}].endpointRoles"),
                    problem,
                });
            }
            if let Some(peers) = &pool.peers {
                check_peers(i, peers)?;
            }
            let field = |name: &str, problem: &str| PickerConfigError::Field {
                field: format!("pools[{i}].{name}"),
                problem: problem.to_owned(),
            };
            if pool.export_members && !pool.export {
                return Err(field("exportMembers", "needs `export`"));
            }
            if pool.export_members && !pool.endpoint_roles.is_empty() {
                return Err(field(
                    "exportMembers",
                    "a disaggregated pool's members are not interchangeable (an importer \
                     would send whole requests to prefill replicas): import it in Parent Mode",
                ));
            }
        }
        Ok(())
    }
}

/// What serde cannot check of pool `i`'s `peers` section.
fn check_peers(i: usize, peers: &super::peers::PeersConfig) -> Result<(), PickerConfigError> {
    let field = |name: &str, problem: &str| PickerConfigError::Field {
        field: format!("pools[{i}].peers.{name}"),
        problem: problem.to_owned(),
    };
    if peers.endpoints.is_empty() {
        return Err(field(
            "endpoints",
            "must list at least one peer gateway (ip:port)",
        ));
    }
    if let Some(loopback) = &peers.loopback {
        if peers.mode == super::peers::PeerMode::Endpoint {
            return Err(field(
                "loopback",
                "is for Parent Mode: an Endpoint Mode pick has one destination",
            ));
        }
        if loopback.parse::<SocketAddr>().is_err() {
            return Err(field(
                "loopback",
                "must be this gateway's listener, ip:port",
            ));
        }
        if peers.endpoints.contains(loopback) {
            return Err(field(
                "loopback",
                "is listed among the peers: a gateway is no peer of itself",
            ));
        }
    }
    if let Some(key) = &peers.api_key {
        if peers.mode == super::peers::PeerMode::Endpoint {
            return Err(field(
                "apiKey",
                "is for Parent Mode: in Endpoint Mode no peer gateway is on the path",
            ));
        }
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(field(
                "apiKey",
                "must be a non-empty token of visible ASCII characters",
            ));
        }
    }
    let spill = &peers.spillover;
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(spill.queue_depth_threshold) {
        return Err(field(
            "spillover.queueDepthThreshold",
            "must be a positive number",
        ));
    }
    if !positive(spill.kv_cache_util_threshold) || spill.kv_cache_util_threshold > 1.0 {
        return Err(field("spillover.kvCacheUtilThreshold", "must be in (0, 1]"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_pool_object_is_accepted_with_defaults() {
        let c = PickerConfig::from_json(serde_json::json!({
            "pool": "p", "baseModel": "m", "endpoints": ["127.0.0.1:8000"]
        }));
        let c = c.map_err(|e| e.to_string());
        assert!(c.is_ok());
        let pool = c.map(|c| c.pools).unwrap_or_default();
        assert_eq!(pool.len(), 1);
        assert_eq!(
            pool.first().map(|p| p.failure_mode),
            Some(FailureMode::FailClose)
        );
        assert_eq!(pool.first().map(|p| p.stale_after_ms), Some(1000));
    }

    #[test]
    fn bad_and_duplicate_endpoints_are_rejected() {
        let bad = PickerConfig::from_json(serde_json::json!({
            "pool": "p", "baseModel": "m", "endpoints": ["example.com:80"]
        }))
        .and_then(|c| c.validate());
        assert!(matches!(bad, Err(PickerConfigError::BadEndpoint { .. })));
        let dup = PickerConfig::from_json(serde_json::json!({
            "pool": "p", "baseModel": "m", "endpoints": ["127.0.0.1:1", "127.0.0.1:1"]
        }))
        .and_then(|c| c.validate());
        assert!(matches!(
            dup,
            Err(PickerConfigError::DuplicateEndpoint { .. })
        ));
    }

    #[test]
    fn zero_staleness_and_a_stripped_session_header_are_rejected_by_field() {
        let check = |extra: Value| {
            let mut pool = serde_json::json!({"pool": "p", "baseModel": "m", "endpoints": []});
            if let (Some(o), Some(e)) = (pool.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            let ok = serde_json::json!({"pool": "q", "baseModel": "n"});
            PickerConfig::from_json(serde_json::json!({"pools": [ok, pool]}))
                .and_then(|c| c.validate())
                .map_err(|e| e.to_string())
        };
        let e = check(serde_json::json!({"staleAfterMs": 0}))
            .err()
            .unwrap_or_default();
        assert!(e.contains("pools[1].staleAfterMs"), "{e}");
        for header in ["x-gateway-session", "X-LLM-D-Session", ""] {
            let e = check(serde_json::json!({ "sessionHeader": header }))
                .err()
                .unwrap_or_default();
            assert!(e.contains("pools[1].sessionHeader"), "{header}: {e}");
        }
        assert_eq!(
            check(serde_json::json!({"sessionHeader": "x-session-id"})),
            Ok(())
        );
    }

    #[test]
    fn failure_mode_spellings() {
        let c = PickerConfig::from_json(serde_json::json!({
            "pools": [{"pool": "p", "baseModel": "m", "failureMode": "FailOpen"}]
        }));
        assert_eq!(
            c.ok().and_then(|c| c.pools.first().map(|p| p.failure_mode)),
            Some(FailureMode::FailOpen)
        );
        let bad = PickerConfig::from_json(serde_json::json!({
            "pool": "p", "baseModel": "m", "failureMode": "Open"
        }));
        assert!(bad.is_err());
    }
}
