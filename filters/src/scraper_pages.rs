//! Members that other gateways publish: the scraper's `published` clusters, for a pool
//! imported from other clusters in Endpoint Mode ([`crate::picker::peers`]).
//!
//! Each published cluster names the peer gateways whose export page of the pool
//! (`/infergate/pools/<pool>/metrics`) lists the pool's candidate members
//! ([`scheduler_core::snapshot::aggregate::parse_members`]). Every `membershipIntervalMs`
//! the scraper fetches each page (one callout at a time per gateway, through the scrape
//! cluster, as a metrics scrape); the cluster's members are the union of the lists its
//! gateways gave last, each member then scraped at its own `/metrics` like any other.
//!
//! - A page that fails (non-2xx, too large, a failed or lost callout, a refused dispatch)
//!   keeps that gateway's last list, until `maxConsecutiveFailures` fail in a row: then its
//!   members leave the cluster. A peer whose gateway is gone is dropped, even while its
//!   replicas still answer: its export page is the authority on what it serves.
//! - A page that lists more than [`MAX_HOSTS_PER_CLUSTER`] members, or no listing at all
//!   (a gateway whose pool does not publish its members, `exportMembers`), is a failed page.
//! - A member is a destination this gateway will send requests to, so only addresses a
//!   replica can have are taken ([`acceptable`]): never an unspecified, multicast or
//!   link-local address (a cloud's metadata service) or port 0, and a loopback address only
//!   from a gateway that is itself on loopback (clusters simulated on one host).
//! - The cluster is known (published in the snapshot) once each of its gateways answered
//!   or failed once, so a first publish never holds half of it.
//!
//! Counted like the admin membership: `infergate.scraper.membership_updates{result}`, and
//! the cluster's `infergate.scraper.cluster_members{cluster}` gauge.

use std::net::SocketAddr;

use std::net::IpAddr;

use scheduler_core::snapshot::aggregate::{parse_members, MembersError};
use scheduler_core::snapshot::{Health, Member};
use scheduler_core::types::Millis;
use serde::Deserialize;

use super::{Pending, Scraper};
use crate::host::{CalloutOutcome, CalloutToken, HttpCallout, SnapshotSink};
use crate::host::{Clock, Stats};
use crate::membership::MAX_HOSTS_PER_CLUSTER;

/// A cluster whose members peer gateways publish (a pool imported in Endpoint Mode).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PublishedCluster {
    /// The name the members are published under in the snapshot (the pool that follows
    /// them names it as its `cluster`).
    pub cluster: String,
    /// The peer gateways whose pages list the members, `ip:port` each.
    pub gateways: Vec<String>,
    /// The export page's path on every gateway.
    pub path: String,
    /// A gateway whose last this-many pages failed has its members dropped.
    #[serde(default = "default_max_consecutive_failures")]
    pub max_consecutive_failures: u32,
}

fn default_max_consecutive_failures() -> u32 {
    3
}

/// One gateway's page of one published cluster.
#[derive(Clone, Debug, Default)]
pub(super) struct PageSource {
    /// The published cluster, by its index in `published`.
    cluster: usize,
    /// The gateway, `ip:port`.
    gateway: String,
    pending: Option<Pending>,
    last_sent: Option<Millis>,
    /// Pages that failed in a row.
    failures: u32,
    /// Whether the gateway answered or failed once.
    tried: bool,
    /// The members its last good page listed, while it has not failed too often.
    members: Option<Vec<String>>,
}

/// The page sources of `published`, one per cluster and gateway.
pub(super) fn sources(published: &[PublishedCluster]) -> Vec<PageSource> {
    let per_cluster = published.iter().enumerate();
    per_cluster
        .flat_map(|(cluster, p)| {
            p.gateways.iter().map(move |g| PageSource {
                cluster,
                gateway: g.clone(),
                ..PageSource::default()
            })
        })
        .collect()
}

impl PublishedCluster {
    /// Check what serde cannot; the error names the field (`published[i]`).
    pub(super) fn validate(&self, i: usize, followed: &[String]) -> Result<(), String> {
        let shown = |s: &str| crate::reply::truncate_for_message(s, 64).into_owned();
        if self.cluster.is_empty() {
            return Err(format!(
                "scraper config: published[{i}]: empty cluster name"
            ));
        }
        if self.gateways.is_empty() {
            return Err(format!(
                "scraper config: published[{i}].gateways: must list at least one gateway"
            ));
        }
        let twice = (1..self.gateways.len()).find_map(|j| {
            let (earlier, rest) = self.gateways.split_at(j);
            rest.first().filter(|g| earlier.contains(g))
        });
        if let Some(g) = twice {
            return Err(format!(
                "scraper config: published[{i}].gateways: `{}` is listed twice",
                shown(g)
            ));
        }
        if followed.contains(&self.cluster) {
            return Err(format!(
                "scraper config: published[{i}]: `{}` is also in `clusters`",
                shown(&self.cluster)
            ));
        }
        if let Some(g) = self
            .gateways
            .iter()
            .find(|g| g.parse::<SocketAddr>().is_err())
        {
            return Err(format!(
                "scraper config: published[{i}].gateways: `{}` is not ip:port",
                shown(g)
            ));
        }
        if !self.path.starts_with('/') {
            return Err(format!(
                "scraper config: published[{i}].path: `{}` does not start with `/`",
                shown(&self.path)
            ));
        }
        if self.max_consecutive_failures == 0 {
            return Err(format!(
                "scraper config: published[{i}].maxConsecutiveFailures must be positive"
            ));
        }
        Ok(())
    }
}

impl Scraper {
    /// Whether `token` is a page callout's.
    pub(super) fn is_page_callout(&self, token: CalloutToken) -> bool {
        self.pages
            .iter()
            .any(|p| p.pending.is_some_and(|p| p.token == token))
    }

    /// Expire lost page callouts, and send each page whose turn has come.
    pub(super) fn poll_pages<H>(&mut self, host: &mut H, now: Millis)
    where
        H: HttpCallout + Clock + Stats + SnapshotSink + ?Sized,
    {
        let lost_after = self.lost_after_ms();
        let interval = self.config.membership_interval_ms;
        for i in 0..self.pages.len() {
            let Some(page) = self.pages.get(i) else {
                continue;
            };
            if let Some(p) = page.pending {
                if now.since(p.sent_at) <= lost_after {
                    continue;
                }
                self.page_failed(host, i, "no answer");
            }
            let Some(page) = self.pages.get(i) else {
                continue;
            };
            if page.last_sent.is_some_and(|t| now.since(t) < interval) {
                continue;
            }
            let Some(published) = self.config.published.get(page.cluster) else {
                continue;
            };
            let request = self.page_request(&page.gateway, &published.path);
            let dispatched = host.dispatch_callout(&request);
            let Some(page) = self.pages.get_mut(i) else {
                continue;
            };
            page.last_sent = Some(now);
            match dispatched {
                Ok(token) => {
                    page.pending = Some(Pending {
                        token,
                        sent_at: now,
                    })
                }
                Err(_) => self.page_failed(host, i, "the callout was refused"),
            }
        }
    }

    /// The page callout of `token` ended with `outcome`.
    pub(super) fn page_answer<H>(
        &mut self,
        host: &mut H,
        token: CalloutToken,
        outcome: CalloutOutcome,
    ) where
        H: Clock + Stats + SnapshotSink + ?Sized,
    {
        let Some(i) = self
            .pages
            .iter()
            .position(|p| p.pending.is_some_and(|p| p.token == token))
        else {
            return;
        };
        let limit = self.config.max_metrics_page_bytes;
        let body = match outcome {
            CalloutOutcome::Response { body, .. } if body.len() > limit => {
                let why = format!("{} bytes, above the limit", body.len());
                return self.page_failed(host, i, &why);
            }
            CalloutOutcome::Response { status, body } if (200..300).contains(&status) => body,
            CalloutOutcome::Response { status, .. } => {
                return self.page_failed(host, i, &format!("status {status}"));
            }
            CalloutOutcome::TooLarge { body_bytes, .. } => {
                return self.page_failed(host, i, &format!("{body_bytes} bytes, above the limit"));
            }
            CalloutOutcome::Failed => return self.page_failed(host, i, "the callout failed"),
        };
        let members = match parse_members(&body, MAX_HOSTS_PER_CLUSTER) {
            Ok(members) => members,
            Err(MembersError::TooMany(n)) => {
                let why = format!("{n} members, above the limit of {MAX_HOSTS_PER_CLUSTER}");
                return self.page_failed(host, i, &why);
            }
            Err(MembersError::NotListed) => {
                let why = "the page lists no members (is the pool's `exportMembers` on?)";
                return self.page_failed(host, i, why);
            }
        };
        let gateway = self.pages.get(i).map_or("", |p| p.gateway.as_str());
        let members: Vec<String> = members
            .into_iter()
            .filter(|m| acceptable(m, gateway))
            .collect();
        host.counter_add(&self.membership_ok, 1);
        if let Some(page) = self.pages.get_mut(i) {
            page.pending = None;
            page.failures = 0;
            page.tried = true;
            page.members = Some(members);
        }
        self.relearn(host, i);
    }

    /// Gateway page `i` gave no list (`why`): its last list stays until it failed
    /// `maxConsecutiveFailures` times in a row. Logged at the first failure of a streak.
    fn page_failed<H>(&mut self, host: &mut H, i: usize, why: &str)
    where
        H: Clock + Stats + SnapshotSink + ?Sized,
    {
        host.counter_add(&self.membership_failed, 1);
        let Some(page) = self.pages.get_mut(i) else {
            return;
        };
        let Some(published) = self.config.published.get(page.cluster) else {
            return;
        };
        if page.failures == 0 {
            host.log_error(&format!(
                "infergate: scraper: the members of `{}` published by `{}` ({}) are \
                 unreadable ({why}); they are dropped after {} failures in a row",
                published.cluster, page.gateway, published.path, published.max_consecutive_failures
            ));
        }
        page.pending = None;
        page.tried = true;
        page.failures = page.failures.saturating_add(1);
        if page.failures >= published.max_consecutive_failures {
            page.members = None;
        }
        self.relearn(host, i);
    }

    /// Re-learn the members of page `i`'s cluster once every page of it was tried: the
    /// union of its gateways' lists. A change is published at once.
    fn relearn<H>(&mut self, host: &mut H, i: usize)
    where
        H: Clock + Stats + SnapshotSink + ?Sized,
    {
        let Some(cluster) = self.pages.get(i).map(|p| p.cluster) else {
            return;
        };
        let of_cluster = || self.pages.iter().filter(move |p| p.cluster == cluster);
        if !of_cluster().all(|p| p.tried) {
            return;
        }
        let members: Vec<Member> = of_cluster()
            .filter_map(|p| p.members.as_ref())
            .flatten()
            .map(|address| Member {
                address: address.clone(),
                health: Health::Healthy,
            })
            .collect();
        let index = self.config.clusters.len() + cluster;
        if self.learn(host, index, members) {
            let now = host.now();
            self.publish(host, now);
        }
    }
}

/// Whether `member`, published by `gateway`, may be a destination (module doc).
pub(super) fn acceptable(member: &str, gateway: &str) -> bool {
    let Ok(address) = member.parse::<SocketAddr>() else {
        return false;
    };
    let ip = address.ip();
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    if address.port() == 0 || ip.is_unspecified() || ip.is_multicast() || link_local {
        return false;
    }
    let from_loopback = gateway
        .parse::<SocketAddr>()
        .is_ok_and(|g| g.ip().is_loopback());
    !ip.is_loopback() || from_loopback
}

impl PageSource {
    /// Forget the outstanding callout (its host is gone): the next tick sends again.
    pub(super) fn forget(&mut self) {
        self.pending = None;
        self.last_sent = None;
    }
}
