//! The scraper loop: every tick, one `GET /metrics` callout per endpoint
//! that has none outstanding; each answer updates that endpoint's sample; the encoded
//! snapshot is published when a round's last answer arrives (and on the next tick if
//! anything changed since), so pickers see new numbers within one round trip.
//!
//! Per endpoint: a 2xx page that carries at least one known metric is a success
//! (`scraped_at = now`, failures reset). Anything else — non-2xx, a page without any
//! known metric, a failed or timed-out callout, a dispatch the host refused, or no
//! answer within twice the timeout — counts one more consecutive failure and keeps the
//! last metrics with their old `scraped_at`, so they age into "unknown" by the pickers'
//! staleness bound, and the pickers drop the endpoint after `maxConsecutiveFailures`.
//!
//! A page larger than `maxMetricsPageBytes` (default 4 MiB) is a failed scrape: adapters
//! hand the answer over through [`Scraper::callout_outcome`], which looks at the body
//! length the host reports before anything is copied, so an engine answering 30 MB never
//! costs 30 MB here. The first such page of a failure streak is logged.
//!
//! Configuration is checked at load ([`Scraper::from_json`]): every entry of `endpoints`
//! must be an `ip:port` (it is the address the callout is routed to), and the interval,
//! the timeout and the page limit must be positive.
//!
//! **Membership.** Beside its static `endpoints`, the scraper follows the Envoy clusters
//! named in `clusters`: their members are scraped too, and published in the snapshot
//! (`Snapshot.clusters`, with each member's health) for the pickers to pick among. How the
//! members are learned is `membership`:
//!
//! - `host` (the default): every tick asks the host
//!   ([`crate::host::ClusterMembership`]); a cluster the host cannot tell keeps its last
//!   membership (and is not published before it is first known).
//! - `admin`: every `membershipIntervalMs` (default 100), one callout to Envoy's admin
//!   `adminPath` (default `/clusters?format=json`) through the cluster `adminCluster`
//!   (default `infergate_admin`, a STATIC cluster pointing at the admin listener), parsed by
//!   [`crate::membership::parse_admin_clusters_where`]. A failed, non-2xx, oversized or
//!   unreadable answer keeps the last membership and counts
//!   `infergate.scraper.membership_updates{result=failed}` (logged once per failure
//!   streak); a good one counts `result=ok`.
//!
//! The scrape targets are the static endpoints, then every member not among them (each
//! address once). When a membership changes, a new member becomes a target at once (and
//! is scraped at the next tick), a member gone stops being one (its outstanding callout is
//! forgotten, its sample leaves the snapshot), and a snapshot is published without waiting
//! for the round, so pickers stop picking a removed host within one publish. The gauge
//! `infergate.scraper.cluster_members{cluster}` counts each followed cluster's members.
//!
//! A third source, `published`, learns the members of a pool imported from other clusters
//! in Endpoint Mode from its peer gateways' export pages (`scraper_pages.rs` has the rules).
//!
//! How a callout reaches one endpoint through Envoy: it goes to cluster `cluster` (an
//! `ORIGINAL_DST` cluster with `use_http_header: true` and `http_header_name:
//! x-gateway-destination-endpoint`), carrying that header and `:authority` set to the
//! endpoint's `ip:port`.

use std::net::SocketAddr;

use std::collections::{BTreeMap, HashMap, HashSet};

use scheduler_core::metrics::{extract, MetricNames};
use scheduler_core::snapshot::{
    encode_with_generation, ClusterMembers, EndpointSample, Member, Snapshot,
};
use scheduler_core::types::Millis;
use serde::Deserialize;

use crate::headers::DESTINATION_ENDPOINT;
use crate::host::{
    CalloutOutcome, CalloutRequest, CalloutToken, Clock, ClusterMembership, HttpCallout,
    SnapshotSink, Stats,
};
use crate::membership::{parse_admin_clusters_where, MAX_ADMIN_PAGE_BYTES};
use crate::stats::{StatKey, StatKind};

/// The scraper's configuration (JSON, camelCase; `role` is removed by the adapter).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScraperConfig {
    /// Static endpoints to scrape (`ip:port`), all pools together; may be empty when
    /// `clusters` is given.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Envoy clusters whose members are scraped too, and published in the snapshot.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// How the members of `clusters` are learned: from the host, or from Envoy's admin.
    #[serde(default)]
    pub membership: MembershipMode,
    /// Mode `admin`: the Envoy cluster that reaches Envoy's admin listener.
    #[serde(default = "default_admin_cluster")]
    pub admin_cluster: String,
    /// Mode `admin`: the admin path that lists the clusters' hosts as JSON.
    #[serde(default = "default_admin_path")]
    pub admin_path: String,
    /// Time between two membership callouts, ms: the admin's (mode `admin`), and each
    /// `published` gateway's page.
    #[serde(default = "default_membership_interval_ms")]
    pub membership_interval_ms: u64,
    /// Time between rounds (the tick period), ms.
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Callout timeout, ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// The Envoy cluster callouts go through.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// The metrics path.
    #[serde(default = "default_path")]
    pub path: String,
    /// Endpoints scraped at another path than `path`, by `ip:port` (a peer cluster's
    /// gateway publishes its pool's load at `/infergate/pools/<pool>/metrics`).
    #[serde(default)]
    pub metrics_paths: BTreeMap<String, String>,
    /// A `/metrics` page longer than this (bytes) is a failed scrape, never copied.
    #[serde(default = "default_max_metrics_page_bytes")]
    pub max_metrics_page_bytes: usize,
    /// Clusters whose members peer gateways publish on their export pages (a pool
    /// imported in Endpoint Mode); fetched every `membershipIntervalMs`.
    #[serde(default)]
    pub published: Vec<PublishedCluster>,
}

impl Default for ScraperConfig {
    /// What an empty JSON object configures: nothing to scrape, every default.
    fn default() -> ScraperConfig {
        ScraperConfig {
            endpoints: Vec::new(),
            clusters: Vec::new(),
            membership: MembershipMode::default(),
            admin_cluster: default_admin_cluster(),
            admin_path: default_admin_path(),
            membership_interval_ms: default_membership_interval_ms(),
            interval_ms: default_interval_ms(),
            timeout_ms: default_timeout_ms(),
            cluster: default_cluster(),
            path: default_path(),
            metrics_paths: BTreeMap::new(),
            max_metrics_page_bytes: default_max_metrics_page_bytes(),
            published: Vec::new(),
        }
    }
}

/// Default `maxMetricsPageBytes`: 4 MiB, some 40× a vLLM page with a few LoRA adapters.
pub const DEFAULT_MAX_METRICS_PAGE_BYTES: usize = 4 * 1024 * 1024;

fn default_max_metrics_page_bytes() -> usize {
    DEFAULT_MAX_METRICS_PAGE_BYTES
}

/// How the scraper learns the members of the clusters it follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MembershipMode {
    /// The host tells ([`crate::host::ClusterMembership`]; the native module).
    #[default]
    Host,
    /// A callout to Envoy's admin `GET /clusters?format=json` (the Wasm module).
    Admin,
}

/// A failing admin answer is logged again after this many more (a minute at the default
/// 100 ms interval).
const ADMIN_FAILURES_PER_LOG: u32 = 600;

fn default_admin_cluster() -> String {
    "infergate_admin".to_owned()
}
fn default_admin_path() -> String {
    "/clusters?format=json".to_owned()
}
fn default_membership_interval_ms() -> u64 {
    100
}

fn default_interval_ms() -> u64 {
    50
}
fn default_timeout_ms() -> u64 {
    250
}
fn default_cluster() -> String {
    "infergate_scrape".to_owned()
}
fn default_path() -> String {
    "/metrics".to_owned()
}

/// Stat keys of one endpoint.
#[derive(Clone, Debug)]
struct EndpointStats {
    ok: StatKey,
    failed: StatKey,
    consecutive_failures: StatKey,
}

/// An outstanding callout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pending {
    token: CalloutToken,
    sent_at: Millis,
}

/// Stat keys of one followed cluster.
#[derive(Clone, Debug)]
struct ClusterStats {
    members: StatKey,
}

/// The admin callout of membership mode `admin`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct AdminCallout {
    /// The callout outstanding, if any.
    pending: Option<Pending>,
    /// When the last one was sent.
    last_sent: Option<Millis>,
    /// Answers that failed in a row (the first of a streak is logged).
    failures: u32,
}

/// The scraper's state (one per process: in the Wasm flavour's elected VM, or, natively,
/// hosted by the filter configs that carry it).
#[derive(Debug)]
pub struct Scraper {
    config: ScraperConfig,
    names: MetricNames,
    /// Per scrape target (static endpoints, then members): its sample, its outstanding
    /// callout and its stat keys, in the same order.
    samples: Vec<EndpointSample>,
    pending: Vec<Option<Pending>>,
    stats: Vec<EndpointStats>,
    /// The last known members of each followed cluster that is known, in `clusters`
    /// order.
    clusters: Vec<ClusterMembers>,
    cluster_stats: Vec<ClusterStats>,
    admin: AdminCallout,
    /// The export pages of the `published` clusters, one per cluster and gateway.
    pages: Vec<pages::PageSource>,
    publishes: StatKey,
    publish_errors: StatKey,
    tick_failures: StatKey,
    membership_ok: StatKey,
    membership_failed: StatKey,
    generation: u64,
    dirty: bool,
    /// Ticks left during which nothing is published (see [`Scraper::hold_first_publish`]).
    held_ticks: u32,
}

/// How many ticks a scraper that took over may hold its first publication at most.
const MAX_HELD_TICKS: u32 = 20;

fn endpoint_stats(endpoint: &str) -> EndpointStats {
    let key = |result| {
        StatKey::new(
            "infergate.scraper.scrapes",
            &[("endpoint", endpoint), ("result", result)],
        )
    };
    EndpointStats {
        ok: key("ok"),
        failed: key("failed"),
        consecutive_failures: StatKey::new(
            "infergate.scraper.consecutive_failures",
            &[("endpoint", endpoint)],
        ),
    }
}

fn outcome_within(
    limit: usize,
    status: u16,
    body_bytes: usize,
    read_body: impl FnOnce() -> Vec<u8>,
) -> CalloutOutcome {
    if body_bytes > limit {
        return CalloutOutcome::TooLarge { status, body_bytes };
    }
    CalloutOutcome::Response {
        status,
        body: read_body(),
    }
}

fn unscraped(address: &str) -> EndpointSample {
    EndpointSample {
        address: address.to_owned(),
        scraped_at: Millis(0),
        consecutive_failures: 0,
        metrics: None,
    }
}

impl Scraper {
    /// Every stat key the scraper can emit, with its kind, so a host can define them all up
    /// front.
    pub fn stat_keys(&self) -> Vec<(StatKind, &StatKey)> {
        let mut keys = vec![
            (StatKind::Counter, &self.publishes),
            (StatKind::Counter, &self.publish_errors),
            (StatKind::Counter, &self.tick_failures),
        ];
        if !self.config.clusters.is_empty() || !self.config.published.is_empty() {
            keys.push((StatKind::Counter, &self.membership_ok));
            keys.push((StatKind::Counter, &self.membership_failed));
        }
        for c in &self.cluster_stats {
            keys.push((StatKind::Gauge, &c.members));
        }
        for e in &self.stats {
            keys.push((StatKind::Counter, &e.ok));
            keys.push((StatKind::Counter, &e.failed));
            keys.push((StatKind::Gauge, &e.consecutive_failures));
        }
        keys
    }

    /// A scraper for `config`; endpoints start unknown, followed clusters without members
    /// until their membership is first learned.
    pub fn new(config: ScraperConfig) -> Scraper {
        let mut targets: Vec<&String> = Vec::with_capacity(config.endpoints.len());
        let mut seen = HashSet::new();
        for e in &config.endpoints {
            if seen.insert(e.as_str()) {
                targets.push(e);
            }
        }
        let samples = targets.iter().map(|a| unscraped(a)).collect();
        let stats = targets.iter().map(|e| endpoint_stats(e)).collect();
        let membership = |result| {
            StatKey::new(
                "infergate.scraper.membership_updates",
                &[("result", result)],
            )
        };
        Scraper {
            pending: vec![None; targets.len()],
            names: MetricNames::default(),
            samples,
            stats,
            clusters: Vec::new(),
            cluster_stats: config
                .clusters
                .iter()
                .chain(config.published.iter().map(|p| &p.cluster))
                .map(|c| ClusterStats {
                    members: StatKey::new("infergate.scraper.cluster_members", &[("cluster", c)]),
                })
                .collect(),
            admin: AdminCallout::default(),
            pages: pages::sources(&config.published),
            publishes: StatKey::new("infergate.scraper.publishes", &[]),
            publish_errors: StatKey::new("infergate.scraper.publish_errors", &[]),
            tick_failures: StatKey::new("infergate.scraper.tick_failures", &[]),
            membership_ok: membership("ok"),
            membership_failed: membership("failed"),
            generation: 0,
            dirty: true,
            held_ticks: 0,
            config,
        }
    }

    /// Parse JSON (the plugin config minus `role`) and check it (see the module doc); the
    /// error names the offending field.
    pub fn from_json(value: serde_json::Value) -> Result<Scraper, String> {
        let config: ScraperConfig =
            serde_json::from_value(value).map_err(|e| format!("scraper config: {e}"))?;
        config.validate()?;
        Ok(Scraper::new(config))
    }

    /// The static endpoints scraped, in configuration order (the members of followed
    /// clusters come and go: [`Scraper::samples`]).
    pub fn endpoints(&self) -> &[String] {
        &self.config.endpoints
    }

    /// The Envoy clusters whose members are followed, in configuration order (the
    /// `published` clusters, learned from pages, are not among them).
    pub fn followed_clusters(&self) -> &[String] {
        &self.config.clusters
    }

    /// The last known members of every followed cluster known so far.
    pub fn clusters(&self) -> &[ClusterMembers] {
        &self.clusters
    }

    /// The largest body accepted in a callout answer, bytes: `maxMetricsPageBytes`, or in
    /// membership mode `admin` the larger admin limit when that is larger.
    pub fn max_page_bytes(&self) -> usize {
        if self.follows_by_admin() {
            self.config.max_metrics_page_bytes.max(MAX_ADMIN_PAGE_BYTES)
        } else {
            self.config.max_metrics_page_bytes
        }
    }

    fn follows_by_admin(&self) -> bool {
        self.config.membership == MembershipMode::Admin && !self.config.clusters.is_empty()
    }

    /// The outcome to report for a callout answered with `status` and a body the host says
    /// is `body_bytes` long. `read_body` copies the body out of the host and is called only
    /// when the length is within [`Scraper::max_page_bytes`]; a longer page becomes
    /// [`CalloutOutcome::TooLarge`] without a copy. Adapters call this (or, when they know
    /// the callout's token, [`Scraper::callout_outcome_for`]) from their callout callback
    /// before [`Scraper::on_callout_done`].
    pub fn callout_outcome(
        &self,
        status: u16,
        body_bytes: usize,
        read_body: impl FnOnce() -> Vec<u8>,
    ) -> CalloutOutcome {
        outcome_within(self.max_page_bytes(), status, body_bytes, read_body)
    }

    /// [`Scraper::callout_outcome`] for the callout of `token`: the admin callout's limit
    /// for the admin answer, `maxMetricsPageBytes` for every other one, so a metrics page
    /// above its limit is never copied even while the admin limit is larger.
    pub fn callout_outcome_for(
        &self,
        token: CalloutToken,
        status: u16,
        body_bytes: usize,
        read_body: impl FnOnce() -> Vec<u8>,
    ) -> CalloutOutcome {
        let limit = if self.admin.pending.is_some_and(|p| p.token == token) {
            MAX_ADMIN_PAGE_BYTES
        } else {
            self.config.max_metrics_page_bytes
        };
        outcome_within(limit, status, body_bytes, read_body)
    }

    /// Count one tick that failed inside the adapter (a contained panic): the stat
    /// `infergate.scraper.tick_failures`.
    pub fn count_tick_failure<H: Stats + ?Sized>(&self, host: &mut H) {
        host.counter_add(&self.tick_failures, 1);
    }

    /// The tick period the adapter should ask its host for, ms.
    pub fn tick_period_ms(&self) -> u64 {
        self.config.interval_ms
    }

    /// The current samples, in target order (static endpoints, then members).
    pub fn samples(&self) -> &[EndpointSample] {
        &self.samples
    }

    /// Callouts outstanding.
    pub fn outstanding(&self) -> usize {
        self.pending.iter().filter(|p| p.is_some()).count()
    }

    /// Forgets every outstanding callout without counting it as a failure: the host that
    /// sent them is gone and will never answer them (an adapter moving the scraper to
    /// another host, whose callout tokens may reuse theirs). The next tick sends a new
    /// round to every target.
    pub fn forget_outstanding(&mut self) {
        for slot in &mut self.pending {
            *slot = None;
        }
        self.admin.pending = None;
        self.pages.iter_mut().for_each(pages::PageSource::forget);
    }

    /// A scraper taking over from another (the Wasm flavour's next elected owner, the
    /// native flavour's scraper of an updated configuration): publish nothing until every
    /// endpoint it knows was scraped once (or failed), at most `MAX_HELD_TICKS` ticks, so
    /// the pickers keep reading the previous scraper's snapshot (members and metrics)
    /// meanwhile rather than an empty one that would refuse their requests.
    pub fn hold_first_publish(&mut self) {
        self.held_ticks = MAX_HELD_TICKS;
    }

    /// Release a held first publication once every followed cluster's members are known
    /// and every target was scraped (or failed) once. A round can complete before that: the
    /// static endpoints (a peer gateway beside a cluster learned from Envoy's admin) may
    /// answer before the members are learned, or after they were and before their first
    /// scrape went out; either snapshot would leave the cluster's pools nothing to pick.
    fn release_hold(&mut self, round_done: bool) {
        let members_known =
            self.clusters.len() == self.config.clusters.len() + self.config.published.len();
        let all_tried = self
            .samples
            .iter()
            .all(|s| s.scraped_at != Millis(0) || s.consecutive_failures > 0);
        if self.held_ticks > 0
            && round_done
            && !self.samples.is_empty()
            && members_known
            && all_tried
        {
            self.held_ticks = 0;
        }
    }

    /// One tick: learn the followed clusters' members (mode `host`: from the host; mode
    /// `admin`: send the admin callout when it is due), publish pending changes, expire
    /// lost callouts, start a new round.
    pub fn on_tick<H>(&mut self, host: &mut H)
    where
        H: HttpCallout + Clock + Stats + SnapshotSink + ClusterMembership + ?Sized,
    {
        self.held_ticks = self.held_ticks.saturating_sub(1);
        let now = host.now();
        match self.config.membership {
            MembershipMode::Host => {
                let learned: Vec<(usize, Vec<Member>)> = self
                    .config
                    .clusters
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| host.cluster_members(c).map(|m| (i, m)))
                    .collect();
                for (i, members) in learned {
                    self.learn(host, i, members);
                }
            }
            MembershipMode::Admin => self.poll_admin(host, now),
        }
        self.poll_pages(host, now);
        // A callout the host never answered (twice its timeout) is a failure.
        let lost_after = self.lost_after_ms();
        for i in 0..self.pending.len() {
            let lost = self
                .pending
                .get(i)
                .copied()
                .flatten()
                .is_some_and(|p| now.since(p.sent_at) > lost_after);
            if lost {
                self.fail(host, i);
            }
        }
        if self.dirty {
            self.publish(host, now);
        }
        for i in 0..self.samples.len() {
            if self.pending.get(i).copied().flatten().is_some() {
                continue;
            }
            let Some(address) = self.samples.get(i).map(|s| s.address.clone()) else {
                continue;
            };
            let path = self
                .config
                .metrics_paths
                .get(&address)
                .unwrap_or(&self.config.path);
            let request = self.page_request(&address, path);
            match host.dispatch_callout(&request) {
                Ok(token) => {
                    if let Some(slot) = self.pending.get_mut(i) {
                        *slot = Some(Pending {
                            token,
                            sent_at: now,
                        });
                    }
                }
                Err(_) => self.fail(host, i),
            }
        }
    }

    /// How long a callout may go unanswered before it counts as lost: twice its timeout.
    fn lost_after_ms(&self) -> u64 {
        self.config.timeout_ms.saturating_mul(2).max(1)
    }

    /// The callout for the Prometheus page at `path` of `address` (`ip:port`): through the
    /// scrape cluster, routed on the destination header (a metrics page, or a peer
    /// gateway's export page).
    fn page_request(&self, address: &str, path: &str) -> CalloutRequest {
        CalloutRequest {
            cluster: self.config.cluster.clone(),
            headers: vec![
                (":method".to_owned(), "GET".to_owned()),
                (":path".to_owned(), path.to_owned()),
                (":authority".to_owned(), address.to_owned()),
                (DESTINATION_ENDPOINT.to_owned(), address.to_owned()),
                ("accept".to_owned(), "text/plain".to_owned()),
            ],
            body: Vec::new(),
            timeout_ms: self.config.timeout_ms,
        }
    }

    /// A callout ended. Unknown tokens (expired earlier) are ignored.
    pub fn on_callout_done<H>(&mut self, host: &mut H, token: CalloutToken, outcome: CalloutOutcome)
    where
        H: Clock + Stats + SnapshotSink + ?Sized,
    {
        if self.admin.pending.is_some_and(|p| p.token == token) {
            self.admin.pending = None;
            self.admin_answer(host, outcome);
            return;
        }
        if self.is_page_callout(token) {
            self.page_answer(host, token, outcome);
            return;
        }
        let Some(i) = self
            .pending
            .iter()
            .position(|p| p.is_some_and(|p| p.token == token))
        else {
            return;
        };
        let now = host.now();
        let limit = self.config.max_metrics_page_bytes;
        let metrics = match outcome {
            // The length is checked here too, for adapters that copied the body anyway.
            CalloutOutcome::Response { status, body }
                if (200..300).contains(&status) && body.len() <= limit =>
            {
                Some(extract(&body, &self.names)).filter(|m| !m.is_empty())
            }
            CalloutOutcome::Response { body, .. } if body.len() > limit => {
                self.log_too_large(host, i, body.len());
                None
            }
            CalloutOutcome::TooLarge { body_bytes, .. } => {
                self.log_too_large(host, i, body_bytes);
                None
            }
            _ => None,
        };
        match metrics {
            Some(metrics) => {
                if let Some(slot) = self.pending.get_mut(i) {
                    *slot = None;
                }
                if let Some(sample) = self.samples.get_mut(i) {
                    sample.metrics = Some(metrics);
                    sample.scraped_at = now;
                    sample.consecutive_failures = 0;
                }
                if let Some(s) = self.stats.get(i) {
                    host.counter_add(&s.ok, 1);
                    host.gauge_set(&s.consecutive_failures, 0);
                }
                self.dirty = true;
            }
            None => self.fail(host, i),
        }
        if self.outstanding() == 0 {
            self.release_hold(true);
            self.publish(host, now);
        }
    }

    /// Log an oversized page of endpoint `i`, once per failure streak (a scrape every 50 ms
    /// must not flood the log).
    fn log_too_large<H: Stats + ?Sized>(&self, host: &mut H, i: usize, bytes: usize) {
        let Some(sample) = self.samples.get(i) else {
            return;
        };
        if sample.consecutive_failures == 0 {
            let address = &sample.address;
            host.log_error(&format!(
                "infergate: scraper: the /metrics page of `{address}` is {bytes} bytes, \
                 above maxMetricsPageBytes ({}): counted as a failed scrape",
                self.config.max_metrics_page_bytes
            ));
        }
    }

    /// Count one failure for endpoint `i` and clear its outstanding callout.
    fn fail<H: Stats + ?Sized>(&mut self, host: &mut H, i: usize) {
        if let Some(slot) = self.pending.get_mut(i) {
            *slot = None;
        }
        if let Some(sample) = self.samples.get_mut(i) {
            sample.consecutive_failures = sample.consecutive_failures.saturating_add(1);
            if let Some(s) = self.stats.get(i) {
                host.counter_add(&s.failed, 1);
                host.gauge_set(
                    &s.consecutive_failures,
                    u64::from(sample.consecutive_failures),
                );
            }
        }
        self.dirty = true;
    }

    /// The members of followed cluster `i` are `members` now: on a change, keep them (each
    /// address once, the first entry kept), set the cluster's gauge, and retarget.
    fn learn<H: Stats + ?Sized>(&mut self, host: &mut H, i: usize, members: Vec<Member>) -> bool {
        let Some(name) = self.followed_name(i).cloned() else {
            return false;
        };
        let mut seen = HashSet::with_capacity(members.len());
        let members: Vec<Member> = members
            .into_iter()
            .filter(|m| seen.insert(m.address.clone()))
            .collect();
        let known = self.clusters.iter().position(|c| c.cluster == name);
        if known.and_then(|k| self.clusters.get(k)).map(|c| &c.members) == Some(&members) {
            return false;
        }
        if let Some(key) = self.cluster_stats.get(i) {
            host.gauge_set(&key.members, members.len() as u64);
        }
        let entry = ClusterMembers {
            cluster: name,
            members,
        };
        match known.and_then(|k| self.clusters.get_mut(k)) {
            Some(slot) => *slot = entry,
            None => {
                self.clusters.push(entry);
                // Keep the configuration's order, whatever order the clusters became known.
                let order: Vec<String> = self.followed_names().cloned().collect();
                self.clusters
                    .sort_by_key(|c| order.iter().position(|n| *n == c.cluster));
            }
        }
        self.retarget();
        true
    }

    /// Every followed cluster: `clusters`, then the `published` ones.
    fn followed_names(&self) -> impl Iterator<Item = &String> {
        let published = self.config.published.iter().map(|p| &p.cluster);
        self.config.clusters.iter().chain(published)
    }

    /// Followed cluster `i` of [`Scraper::followed_names`].
    fn followed_name(&self, i: usize) -> Option<&String> {
        self.followed_names().nth(i)
    }

    /// Make the scrape targets the static endpoints, then every member not among them:
    /// a target kept keeps its sample, callout and stat keys; a new one starts unknown.
    fn retarget(&mut self) {
        let mut wanted: Vec<&str> = Vec::new();
        let mut seen = HashSet::new();
        let members = self.clusters.iter().flat_map(|c| &c.members);
        for address in self
            .config
            .endpoints
            .iter()
            .chain(members.map(|m| &m.address))
        {
            if seen.insert(address.as_str()) {
                wanted.push(address.as_str());
            }
        }
        let unchanged = wanted.len() == self.samples.len()
            && wanted
                .iter()
                .zip(&self.samples)
                .all(|(w, s)| *w == s.address);
        if unchanged {
            return;
        }
        let mut old: HashMap<String, (EndpointSample, Option<Pending>, EndpointStats)> = self
            .samples
            .drain(..)
            .zip(self.pending.drain(..))
            .zip(self.stats.drain(..))
            .map(|((sample, pending), stats)| (sample.address.clone(), (sample, pending, stats)))
            .collect();
        for address in wanted {
            let (sample, pending, stats) = old
                .remove(address)
                .unwrap_or_else(|| (unscraped(address), None, endpoint_stats(address)));
            self.samples.push(sample);
            self.pending.push(pending);
            self.stats.push(stats);
        }
        self.dirty = true;
    }

    /// Mode `admin`: expire a lost admin callout, and send the next one when it is due.
    fn poll_admin<H>(&mut self, host: &mut H, now: Millis)
    where
        H: HttpCallout + Stats + ?Sized,
    {
        if self.config.clusters.is_empty() {
            return;
        }
        let lost_after = self.lost_after_ms();
        if let Some(p) = self.admin.pending {
            if now.since(p.sent_at) <= lost_after {
                return;
            }
            self.admin.pending = None;
            self.admin_failed(host, "no answer");
        }
        let due = self
            .admin
            .last_sent
            .is_none_or(|t| now.since(t) >= self.config.membership_interval_ms);
        if !due {
            return;
        }
        self.admin.last_sent = Some(now);
        let request = CalloutRequest {
            cluster: self.config.admin_cluster.clone(),
            headers: vec![
                (":method".to_owned(), "GET".to_owned()),
                (":path".to_owned(), self.config.admin_path.clone()),
                (":authority".to_owned(), self.config.admin_cluster.clone()),
                ("accept".to_owned(), "application/json".to_owned()),
            ],
            body: Vec::new(),
            timeout_ms: self.config.timeout_ms,
        };
        match host.dispatch_callout(&request) {
            Ok(token) => {
                self.admin.pending = Some(Pending {
                    token,
                    sent_at: now,
                })
            }
            Err(_) => self.admin_failed(host, "the callout was refused"),
        }
    }

    /// Mode `admin`: the admin callout ended with `outcome`.
    fn admin_answer<H>(&mut self, host: &mut H, outcome: CalloutOutcome)
    where
        H: Clock + Stats + SnapshotSink + ?Sized,
    {
        let body = match outcome {
            CalloutOutcome::Response { status, body } if (200..300).contains(&status) => body,
            CalloutOutcome::Response { status, .. } => {
                return self.admin_failed(host, &format!("status {status}"));
            }
            CalloutOutcome::TooLarge { body_bytes, .. } => {
                return self.admin_failed(host, &format!("{body_bytes} bytes, above the limit"));
            }
            CalloutOutcome::Failed => return self.admin_failed(host, "the callout failed"),
        };
        let followed = &self.config.clusters;
        let parsed = parse_admin_clusters_where(&body, |name| followed.iter().any(|c| c == name));
        let clusters = match parsed {
            Ok(clusters) => clusters,
            Err(e) => return self.admin_failed(host, &e.to_string()),
        };
        self.admin.failures = 0;
        host.counter_add(&self.membership_ok, 1);
        let mut changed = false;
        for cluster in clusters {
            if let Some(i) = self
                .config
                .clusters
                .iter()
                .position(|c| c == &cluster.cluster)
            {
                changed |= self.learn(host, i, cluster.members);
            }
        }
        if changed {
            // A removed host must stop getting picks now, not after the next round.
            let now = host.now();
            self.publish(host, now);
        }
    }

    /// Mode `admin`: an admin answer did not give a membership (`why`); the last one stays
    /// (dropping every member would fail every request). It stays for as long as admin
    /// fails, so a host removed meanwhile is still a candidate: logged at the first failure
    /// of a streak and again every [`ADMIN_FAILURES_PER_LOG`] failures.
    fn admin_failed<H: Stats + ?Sized>(&mut self, host: &mut H, why: &str) {
        host.counter_add(&self.membership_failed, 1);
        if self.admin.failures.is_multiple_of(ADMIN_FAILURES_PER_LOG) {
            host.log_error(&format!(
                "infergate: scraper: membership from `{}` via cluster `{}` failed ({why}; {} \
                 failures in a row); the last known members stay until an answer arrives",
                self.config.admin_path,
                self.config.admin_cluster,
                self.admin.failures.saturating_add(1)
            ));
        }
        self.admin.failures = self.admin.failures.saturating_add(1);
    }

    fn publish<H: Stats + SnapshotSink + ?Sized>(&mut self, host: &mut H, now: Millis) {
        if self.held_ticks > 0 {
            // Held (a takeover): published once the first round completes.
            self.dirty = true;
            return;
        }
        self.generation = self.generation.wrapping_add(1);
        let snapshot = Snapshot {
            taken_at: now,
            clusters: self.clusters.clone(),
            endpoints: self.samples.clone(),
        };
        let bytes = encode_with_generation(&snapshot, self.generation);
        match host.publish_snapshot(&bytes) {
            Ok(()) => {
                self.dirty = false;
                host.counter_add(&self.publishes, 1);
            }
            Err(_) => host.counter_add(&self.publish_errors, 1),
        }
    }
}

impl ScraperConfig {
    /// Check what serde cannot (see the module doc); the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            if endpoint.parse::<SocketAddr>().is_err() {
                let shown = crate::reply::truncate_for_message(endpoint, 64);
                return Err(format!(
                    "scraper config: endpoints[{i}]: `{shown}` is not ip:port"
                ));
            }
        }
        let mut followed = HashSet::new();
        for (i, cluster) in self.clusters.iter().enumerate() {
            if cluster.is_empty() {
                return Err(format!("scraper config: clusters[{i}]: empty cluster name"));
            }
            if !followed.insert(cluster.as_str()) {
                let shown = crate::reply::truncate_for_message(cluster, 64);
                return Err(format!(
                    "scraper config: clusters[{i}]: `{shown}` is listed twice"
                ));
            }
        }
        for (endpoint, path) in &self.metrics_paths {
            if !path.starts_with('/') {
                let shown = crate::reply::truncate_for_message(path, 64);
                let endpoint = crate::reply::truncate_for_message(endpoint, 64);
                return Err(format!(
                    "scraper config: metricsPaths: `{endpoint}`: `{shown}` does not start \
                     with `/`"
                ));
            }
        }
        for (i, published) in self.published.iter().enumerate() {
            published.validate(i, &self.clusters)?;
            let earlier = &self.published[..i];
            if earlier.iter().any(|p| p.cluster == published.cluster) {
                return Err(format!(
                    "scraper config: published[{i}]: `{}` is listed twice",
                    crate::reply::truncate_for_message(&published.cluster, 64)
                ));
            }
        }
        if self.admin_cluster.is_empty() {
            return Err("scraper config: adminCluster: empty cluster name".to_owned());
        }
        if !self.admin_path.starts_with('/') {
            let shown = crate::reply::truncate_for_message(&self.admin_path, 64);
            return Err(format!(
                "scraper config: adminPath: `{shown}` does not start with `/`"
            ));
        }
        let positive = [
            ("intervalMs", self.interval_ms),
            ("timeoutMs", self.timeout_ms),
            ("maxMetricsPageBytes", self.max_metrics_page_bytes as u64),
            ("membershipIntervalMs", self.membership_interval_ms),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("scraper config: {field} must be positive"));
        }
        Ok(())
    }
}

#[path = "scraper_pages.rs"]
mod pages;
pub use pages::PublishedCluster;

#[cfg(test)]
#[path = "scraper_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "scraper_membership_tests.rs"]
mod membership_tests;

#[cfg(test)]
#[path = "scraper_pages_tests.rs"]
mod pages_tests;
