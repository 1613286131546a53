//! The export stage: publishes the load of each exported pool for the gateways of other
//! clusters, on `GET /infergate/pools/<pool>/metrics`.
//!
//! A pool is exported when its picker config says `"export": true` (the InferencePool's
//! `inference.networking.x-k8s.io/export` annotation); its page's `<pool>` is its
//! `exportName` (the InferencePool's name, as importing clusters know it), else its name. A peer cluster's gateway scrapes
//! this page as it scrapes a model server, so to it the whole pool is one endpoint. The
//! page is [`PoolAggregate`]'s: member counts, and the means of queue, running requests
//! and KV-cache use over the members that are candidates with fresh metrics, computed from
//! the snapshot this gateway's own scraper publishes (no scrape of its own; any worker
//! answers). With `exportMembers`, the page also lists the pool's members that are
//! candidates, for gateways that import the pool in Endpoint Mode (they send requests
//! straight to those members); off by default, as the page needs no credential.
//!
//! Answers: `200` Prometheus text; `404` `pool_not_exported` for a pool that is unknown or
//! not exported (the page would tell a peer nothing true); `405` for a method other than
//! `GET` or `HEAD`. Every other path passes untouched. A gateway that exports no pool has
//! no export stage; its pick stage answers the 404, so a page path never reaches an
//! upstream, and the auth stage lets page paths pass without a tenant.

use std::sync::Arc;

use scheduler_core::snapshot::aggregate::members_to_prometheus;
use scheduler_core::snapshot::{decode, Health, PoolAggregate, Snapshot};

use crate::host::{RequestHeaders, SnapshotFetch};
use crate::picker::{PickerHost, PickerPlans, PoolPlan};
use crate::pipeline::{reply, RequestContext, Stage};
use crate::reply::{truncate_for_message, Reply, MAX_QUOTED_BYTES};
use crate::FilterStatus;

/// Where the pages live: `<EXPORT_PREFIX><pool>/metrics`.
pub const EXPORT_PREFIX: &str = "/infergate/pools/";

/// The page's content type (Prometheus text, version 0.0.4).
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4";

/// The path of `pool`'s page.
pub fn export_path(pool: &str) -> String {
    format!("{EXPORT_PREFIX}{pool}/metrics")
}

/// The export stage over the picker's pools.
#[derive(Debug)]
pub struct ExportStage {
    plans: Arc<PickerPlans>,
}

impl ExportStage {
    /// The stage answering for the exported pools of `plans`; `None` when none is exported
    /// (then the pipeline carries no stage at all).
    pub fn new(plans: Arc<PickerPlans>) -> Option<ExportStage> {
        plans
            .pools()
            .iter()
            .any(|p| p.exported())
            .then_some(ExportStage { plans })
    }

    /// The page of `plan`'s pool from `snapshot` at `now`.
    fn page(plan: &PoolPlan, snapshot: &Snapshot, now: scheduler_core::types::Millis) -> Reply {
        let members: Vec<(&str, Health)> = if plan.follows_cluster() {
            let members = snapshot.cluster(plan.cluster()).into_iter();
            members
                .flat_map(|c| c.members.iter())
                .map(|m| (m.address.as_str(), m.health))
                .collect()
        } else {
            let endpoints = plan.endpoints().iter();
            endpoints.map(|e| (e.as_str(), Health::Healthy)).collect()
        };
        let aggregate = PoolAggregate::of(
            snapshot,
            members.iter().copied(),
            now,
            plan.stale_after_ms(),
        );
        let mut body = aggregate.to_prometheus();
        if plan.exports_members() {
            let candidates = members.iter().filter(|(_, h)| h.is_candidate());
            members_to_prometheus(&mut body, candidates.map(|(a, _)| *a));
        }
        Reply {
            status: 200,
            headers: vec![("content-type".to_owned(), PROMETHEUS_TEXT.to_owned())],
            body: body.into_bytes(),
        }
    }
}

/// The pool a page path names, if `path` is one (query string allowed).
pub fn pool_of(path: &str) -> Option<&str> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let pool = path.strip_prefix(EXPORT_PREFIX)?.strip_suffix("/metrics")?;
    (!pool.is_empty() && !pool.contains('/')).then_some(pool)
}

/// Whether `path` names a pool's page (exported or not): the gateway answers every such
/// path itself, so no request on one reaches an upstream.
pub fn is_export_page(path: &str) -> bool {
    pool_of(path).is_some()
}

/// 404 for a pool this gateway does not export (the pick stage answers it when no pool is
/// exported, and so no export stage runs).
pub fn not_exported(pool: &str) -> Reply {
    let pool = truncate_for_message(pool, MAX_QUOTED_BYTES);
    Reply::openai_error(
        404,
        "invalid_request_error",
        &format!("this gateway exports no pool named `{pool}`"),
        None,
        Some("pool_not_exported"),
    )
}

impl<H: PickerHost + RequestHeaders + ?Sized> Stage<H> for ExportStage {
    fn name(&self) -> &'static str {
        "export"
    }

    fn on_request_headers(
        &self,
        _cx: &mut RequestContext,
        host: &mut H,
        _end_of_stream: bool,
    ) -> FilterStatus {
        let Some(path) = host.request_header(":path") else {
            return FilterStatus::Continue;
        };
        let Some(pool) = pool_of(&path) else {
            return FilterStatus::Continue;
        };
        let method = host.request_header(":method").unwrap_or_default();
        if !method.eq_ignore_ascii_case("GET") && !method.eq_ignore_ascii_case("HEAD") {
            return reply(host, &Reply::method_not_allowed(&method, "GET, HEAD"));
        }
        let plan = self
            .plans
            .pools()
            .iter()
            .find(|p| p.export_name() == Some(pool));
        let Some(plan) = plan else {
            return reply(host, &not_exported(pool));
        };
        // A missing or unreadable snapshot is an empty one: no member is ready, so the page
        // carries no load and a peer's scrape of it fails.
        let snapshot = match host.snapshot_if_changed(None) {
            SnapshotFetch::Changed { bytes, .. } => decode(&bytes).unwrap_or_default(),
            SnapshotFetch::Missing | SnapshotFetch::Unchanged => Snapshot::default(),
        };
        let page = ExportStage::page(plan, &snapshot, host.now());
        reply(host, &page)
    }
}

#[cfg(test)]
#[path = "export_tests.rs"]
mod tests;
