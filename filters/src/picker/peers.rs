//! Peer clusters: the gateways of other clusters that serve the same pool (the pool is
//! exported there and imported here, an `InferencePoolImport`), and the cluster-level pick
//! that sends a request to one of them.
//!
//! A pool's `peers` section lists the peer gateways. In Parent Mode (the default) a request
//! goes to a peer cluster's gateway, which picks in its own pool. The picker turns the
//! section into a second pool, `<pool>-peers`, whose endpoints are those gateways (in
//! Endpoint Mode: the peers' replicas, below). It is scraped like any pool,
//! at each peer's export page (`GET /infergate/pools/<pool>/metrics`, the pool's mean
//! queue and KV-cache use), so a peer that stops answering is dead after
//! `maxConsecutiveFailures` scrapes and a peer with stale figures is no candidate. It has a
//! scheduler of its own (cluster-level scorers in llm-d's shape: prefix, queue, KV-cache,
//! and this gateway's in-flight load), its own prefix index and in-flight load.
//!
//! For each request of the pool that did not come from a peer ([`crate::headers::PEER_HOP`])
//! and carries no subset hint (`crate::picker::state` applies the rule):
//!
//! 1. **Affinity.** A pool *holds* a request when it holds at least half of the prompt's
//!    blocks (this gateway's record of where it sent each prompt; half, so a system prompt
//!    every request shares pins nothing). A request a peer holds, more than this pool
//!    does, goes back to the peers' pick, which weighs that prefix most; one this pool
//!    holds stays here, saturated or not (its KV cache is here). So a conversation stays in
//!    the cluster that served its first turn, with no shared store.
//! 2. **Local first.** Any other request is picked here, unless this pool is
//!    **saturated**: every live candidate with fresh metrics has `queueDepthThreshold`
//!    requests waiting or `kvCacheUtilThreshold` of its KV cache in use (the utilization
//!    detector's rule; unknown figures never saturate), or is *full*: it runs its learned
//!    batch ([`scheduler_core::flow::BatchCapacity`]), counting this gateway's requests in
//!    flight there. So the pool spills before a new request would wait. A Parent Mode
//!    peer's figures are means over its cluster: no batch is learned for it.
//! 3. **Spillover.** In a saturated pool, a new conversation goes to the cheapest peer
//!    that is *open*: live, with fresh figures below both thresholds (on its published
//!    means) and not full.
//!
//! When no peer can take it (all dead, stale or saturated), the request stays local: the
//! local pool's own failure answers apply. The other way round, a request the local pool
//! would refuse (no live replica; metrics stale or missing under `FailClose`) goes to an
//! open peer when there is one: `failureMode` answers only when no cluster can serve. The destination is then the peer gateway's
//! address (other open peers, then this gateway's own listener, `loopback`, as the
//! fallbacks a connection failure retries), the route is re-matched on
//! [`crate::headers::PEER_ROUTE`] (the pool's `peers.cluster`), and the request carries
//! [`crate::headers::PEER_HOP`].

//!
//! In **Endpoint Mode** a request goes straight to one of the peers' replicas: the peer
//! gateways list them on their export pages (`exportMembers`), the scraper follows them
//! (its `published` clusters) and scrapes each at its own `/metrics`, and the peers pool
//! holds them instead of the gateways. The rules above apply to them as they read; a pick
//! has one destination (the peers cluster is `ORIGINAL_DST` on it), no loopback.

use serde::Deserialize;
use serde_json::Value;

use scheduler_core::flow::UtilizationThresholds;

use super::config::{
    default_fallbacks, default_max_consecutive_failures, default_stale_after_ms, FailureMode,
    PoolConfig,
};
use super::state::PoolId;

/// Suffix of the peers pool's name (`<pool>-peers`).
pub const PEERS_SUFFIX: &str = "-peers";

/// How requests reach a peer cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum PeerMode {
    /// To the peer cluster's gateway, which picks in its own pool.
    #[default]
    Parent,
    /// Straight to a member of the peer's pool, learned from the peer gateway's export
    /// page (the scraper's `published` clusters) and scraped here like a local replica.
    Endpoint,
}

/// When a pool counts as saturated (local) or too busy to take spillover (a peer).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SpillThresholds {
    /// Requests waiting from which an endpoint (or a peer's mean) counts as saturated.
    #[serde(default = "default_queue_depth")]
    pub queue_depth_threshold: f64,
    /// KV-cache use (0..=1) from which an endpoint (or a peer's mean) counts as saturated.
    #[serde(default = "default_kv_cache_util")]
    pub kv_cache_util_threshold: f64,
}

impl Default for SpillThresholds {
    fn default() -> SpillThresholds {
        SpillThresholds {
            queue_depth_threshold: default_queue_depth(),
            kv_cache_util_threshold: default_kv_cache_util(),
        }
    }
}

impl SpillThresholds {
    /// The core's utilization thresholds.
    pub fn utilization(&self) -> UtilizationThresholds {
        UtilizationThresholds {
            queue_depth: self.queue_depth_threshold,
            kv_cache_utilization: self.kv_cache_util_threshold,
        }
    }
}

/// llm-d's utilization detector default.
fn default_queue_depth() -> f64 {
    5.0
}

/// llm-d's utilization detector default.
fn default_kv_cache_util() -> f64 {
    0.8
}

/// A pool's `peers` section.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeersConfig {
    /// The Envoy cluster whose members are the peer gateways; the route that matches
    /// [`crate::headers::PEER_ROUTE`] with this value sends requests to it.
    pub cluster: String,
    /// The peer gateways, `ip:port` each.
    pub endpoints: Vec<String>,
    /// `Parent` (to the peer gateways) or `Endpoint` (to the peers' members).
    #[serde(default)]
    pub mode: PeerMode,
    /// When the local pool spills, and which peers may take it.
    #[serde(default)]
    pub spillover: SpillThresholds,
    /// Other peers to try when the chosen one fails before answering.
    #[serde(default = "default_fallbacks")]
    pub fallbacks: usize,
    /// A peer's figures older than this (ms) make it no candidate.
    #[serde(default = "default_stale_after_ms")]
    pub stale_after_ms: u64,
    /// A peer whose last this-many scrapes failed is dead.
    #[serde(default = "default_max_consecutive_failures")]
    pub max_consecutive_failures: u32,
    /// The cluster-level scheduling config; absent: [`default_peers_epp_config`].
    #[serde(default)]
    pub epp_config: Option<Value>,
    /// This gateway's own listener (`ip:port`, a member of `cluster` too): the last entry
    /// of every peer pick's destination list, so a peer that refuses the connection (its
    /// gateway is gone and not yet dropped) leaves the request to this cluster. It comes
    /// back marked as from a peer, and is picked here.
    #[serde(default)]
    pub loopback: Option<String>,
    /// Parent Mode: the API key this gateway presents to peer gateways that authenticate
    /// tenants (`Authorization: Bearer <key>` on each request it sends them; the client's
    /// own credential never leaves this gateway). A peer holds it as a tenant's key: it
    /// admits, limits and bills what this cluster sends it as that tenant.
    #[serde(default)]
    pub api_key: Option<String>,
}

impl PeersConfig {
    /// The pool of the peers that `local`'s section describes: the peer gateways (Parent
    /// Mode), or the members they publish, which the pool follows as the members of
    /// `cluster` (Endpoint Mode: one destination per pick, as the peers cluster routes on
    /// one address).
    pub(super) fn pool_config(&self, local: &PoolConfig) -> PoolConfig {
        let endpoint_mode = self.mode == PeerMode::Endpoint;
        PoolConfig {
            pool: format!("{}{PEERS_SUFFIX}", local.pool),
            base_model: local.base_model.clone(),
            cluster: Some(self.cluster.clone()),
            endpoints: if endpoint_mode {
                Vec::new()
            } else {
                self.endpoints.clone()
            },
            target_ports: Vec::new(),
            fallbacks: if endpoint_mode { 0 } else { self.fallbacks },
            // A peer whose figures are stale is no candidate: the request stays here.
            failure_mode: FailureMode::FailClose,
            stale_after_ms: self.stale_after_ms,
            max_consecutive_failures: self.max_consecutive_failures,
            epp_config: Some(
                self.epp_config
                    .clone()
                    .unwrap_or_else(default_peers_epp_config),
            ),
            session_header: None,
            max_sessions: 1,
            endpoint_roles: Default::default(),
            export: false,
            export_name: None,
            export_members: false,
            peers: None,
            peers_pool: None,
            peer_of: Some(local.pool.clone()),
        }
    }
}

/// The cluster-level scheduling used when `peers` sets no `eppConfig`: a peer that holds
/// the prompt's prefix first (weight 3), then the shorter mean queue, the emptier mean KV
/// cache and the fewest of this gateway's requests in flight there (weight 1 each),
/// max-score pick. As llm-d's multi-cluster scorers, with the prefix recorded where this
/// gateway sent each prompt. The in-flight count is current where the scraped figures are
/// up to a scrape old: without it, the requests of one scrape interval all go to the same
/// emptiest peer (in Endpoint Mode, one replica, whose batch they overflow).
pub fn default_peers_epp_config() -> Value {
    serde_json::json!({
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "inflight-load-producer"},
            {"type": "prefix-cache-scorer"},
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "inflight-load-scorer"},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [{
            "name": "default",
            "plugins": [
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "queue-scorer", "weight": 1},
                {"pluginRef": "kv-cache-utilization-scorer", "weight": 1},
                {"pluginRef": "inflight-load-scorer", "weight": 1},
                {"pluginRef": "max-score-picker"}
            ]
        }]
    })
}

/// What a pool's plan knows of its peers.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerPlan {
    /// The peers pool.
    pub pool: PoolId,
    /// The Envoy cluster of the peer gateways (the value of the re-route header).
    pub cluster: String,
    /// The spillover thresholds.
    pub spill: UtilizationThresholds,
    /// This gateway's own listener, the last fallback of a peer pick (Parent Mode).
    pub loopback: Option<String>,
    /// The `authorization` value a peer pick carries (Parent Mode, with `apiKey`).
    pub authorization: Option<String>,
}

impl PeersConfig {
    /// What the pool's plan keeps of this section; `pool` is the peers pool's index.
    pub(super) fn plan(&self, pool: usize) -> PeerPlan {
        PeerPlan {
            pool: PoolId(pool),
            cluster: self.cluster.clone(),
            spill: self.spillover.utilization(),
            // The peers cluster of Endpoint Mode routes on one address.
            loopback: self
                .loopback
                .clone()
                .filter(|_| self.mode == PeerMode::Parent),
            authorization: self.api_key.as_ref().map(|key| format!("Bearer {key}")),
        }
    }
}
