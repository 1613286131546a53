//! The load generator: a multi-turn chat workload sent with streaming and `include_usage`,
//! measuring per request what users feel (time to first token, end-to-end time, cached
//! tokens, errors and the gateway's drop reason), summarized per target.
//!
//! - [`workload`]: conversations, their growing histories and the seeded turn order.
//! - [`client`]: one streamed request over HTTP/1.1 and its SSE parsing.
//! - [`runner`]: dispatch at fixed concurrency or a request rate, with progress on stderr.
//! - [`summary`]: percentiles, cache-hit ratio, throughput, the side-by-side table.
//! - [`classes`]: several tenants' classes at once against one base URL (own workload,
//!   concurrency, headers and mid-stream aborts each), reported per class.
//!
//! A run may have several targets (e.g. a gateway route and round-robin), run one after
//! the other with distinct text so one cannot warm the other's cache. A target is one base
//! URL, or a pool of base URLs with a client-side assignment (`random`, `sticky`,
//! `round-robin`): the simulator's replicas without a gateway (calibration), or several
//! gateway replicas as an L4 load balancer in front of them spreads them
//! ([`Target::balanced`]: every request on a new connection to a base URL drawn per
//! request, so a conversation's turns land on whichever gateway the balancer gives them).

pub mod classes;
pub mod client;
pub mod runner;
pub mod summary;
pub mod workload;

use std::time::Duration;

use serde::Serialize;

pub use classes::{run_classes, tenant_demo, ClassReport, ClassRun, LoadClass};
pub use client::{BaseUrl, ChatExtras, ConnPool, RequestRecord};
pub use summary::{class_table, table, Summary};
pub use workload::Workload;

/// How a request picks among a target's base URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assign {
    /// Uniformly at random (seeded).
    Random,
    /// Conversation i always goes to URL i mod n.
    Sticky,
    /// Requests cycle through the URLs.
    RoundRobin,
}

impl std::str::FromStr for Assign {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "random" => Ok(Self::Random),
            "sticky" => Ok(Self::Sticky),
            "round-robin" | "rr" => Ok(Self::RoundRobin),
            _ => anyhow::bail!("assignment must be random, sticky or round-robin: {s}"),
        }
    }
}

/// How a target's requests use TCP connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Connections {
    /// Keep-alive: a request reuses an idle connection to its base URL when there is one.
    #[default]
    KeepAlive,
    /// Every request opens a connection of its own and closes it at the end: what a client
    /// behind an L4 load balancer looks like to the gateways, since the balancer chooses a
    /// backend per connection (and what hands each request to any Envoy worker).
    PerRequest,
}

impl std::str::FromStr for Connections {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "keep-alive" => Ok(Self::KeepAlive),
            "per-request" | "new" => Ok(Self::PerRequest),
            _ => anyhow::bail!("connections must be keep-alive or per-request: {s}"),
        }
    }
}

/// One column of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Column label.
    pub label: String,
    /// Base URLs (requests go to `<base>/v1/chat/completions`).
    pub urls: Vec<String>,
    /// Choice among `urls` when there are several.
    pub assign: Assign,
    /// Connection reuse.
    pub connections: Connections,
}

impl Target {
    /// Parses `[label=]URL[,URL…]`; the label defaults to the URL list.
    pub fn parse(spec: &str, assign: Assign) -> anyhow::Result<Self> {
        let (label, list) = match spec.split_once('=') {
            Some((l, rest)) if !l.contains("://") => (l.to_string(), rest),
            _ => (String::new(), spec),
        };
        let urls: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_string)
            .collect();
        if urls.is_empty() {
            anyhow::bail!("target without URL: {spec}");
        }
        for u in &urls {
            BaseUrl::parse(u)?;
        }
        let label = if label.is_empty() {
            if urls.len() > 1 {
                format!(
                    "{} x{} ({assign:?})",
                    urls.first().map(String::as_str).unwrap_or(""),
                    urls.len()
                )
            } else {
                urls.join(",")
            }
        } else {
            label
        };
        Ok(Self {
            label,
            urls,
            assign,
            connections: Connections::KeepAlive,
        })
    }

    /// Several gateway replicas behind an L4 load balancer: each request (each turn of a
    /// conversation) on a new connection to a base URL drawn at random, seeded by the
    /// workload's seed. Random rather than round robin because that is what the common
    /// balancers amount to per connection (kube-proxy picks a Service endpoint at random,
    /// a cloud network balancer hashes the connection's ports, new for every connection),
    /// and because a cycle would lock onto the workload's dispatch order: with two
    /// gateways and an even number of requests between a conversation's turns, round
    /// robin sends every turn of it to the same gateway.
    pub fn balanced(label: impl Into<String>, urls: Vec<String>) -> Self {
        Self {
            label: label.into(),
            urls,
            assign: Assign::Random,
            connections: Connections::PerRequest,
        }
    }
}

/// A whole load-generator run.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadConfig {
    /// The workload, the same shape for every target.
    pub workload: Workload,
    /// Targets, run one after the other.
    pub targets: Vec<Target>,
    /// Requests in flight at most.
    pub concurrency: u32,
    /// Requests started per second (Poisson arrivals, seeded); `None` = as fast as
    /// concurrency allows.
    pub rate: Option<f64>,
    /// API keys; conversation i uses key i mod n (one tenant per key).
    pub api_keys: Vec<String>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Print progress lines on stderr.
    pub progress: bool,
    /// Use the same text for every target (default: salted per target).
    pub same_text: bool,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            workload: Workload::default(),
            targets: Vec::new(),
            concurrency: 16,
            rate: None,
            api_keys: Vec::new(),
            timeout: Duration::from_secs(300),
            progress: false,
            same_text: false,
        }
    }
}

/// The result of one target's run.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    /// Figures.
    pub summary: Summary,
    /// Every request, in completion order.
    pub records: Vec<RequestRecord>,
}

/// Runs the workload against every target in turn.
pub async fn run(cfg: &LoadConfig) -> anyhow::Result<Vec<TargetReport>> {
    let mut out = Vec::new();
    for (i, target) in cfg.targets.iter().enumerate() {
        let salt = if cfg.same_text { 0 } else { i as u64 + 1 };
        out.push(runner::run_target(cfg, target, salt).await?);
    }
    Ok(out)
}
