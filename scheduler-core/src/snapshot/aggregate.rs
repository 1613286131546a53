//! One pool's load as a few figures, for the gateways of other clusters.
//!
//! A gateway whose pool is exported to other clusters publishes the pool's load on a page
//! those clusters' gateways scrape: a cluster-level picker treats each peer cluster as one
//! endpoint, so it needs one queue, one KV-cache figure, and how many members stand behind
//! them. The figures are computed from the snapshot this gateway already scrapes, so
//! publishing them costs no scrape of its own.
//!
//! - A member counts as **ready** when Envoy has it as a candidate (its cluster's health)
//!   and its metrics are fresh ([`super::EndpointSample::fresh_metrics`]).
//! - The queue, running and KV-cache figures are **means over the ready members**, as
//!   llm-d's endpoint picker publishes them: what a request sent to the pool meets on an
//!   average replica. A member that lacks one metric is left out of that one mean.
//! - A pool with no ready member publishes its member counts but **no mean**: the page then
//!   carries none of the load metrics, so a peer's scraper counts it as a failed scrape
//!   and, after a few, as a dead peer. Stale means are never published.
//!
//! The page is Prometheus text. The queue and KV-cache means use llm-d's names
//! (`llm_d_epp_average_queue_size`, `llm_d_epp_average_kv_cache_utilization`, KV as a
//! fraction), so a cluster-level picker that reads llm-d's peers reads these too; the rest
//! are this gateway's own (`infergate_pool_*`). One page holds one pool, with no label: a
//! scraper sums every series of a name.
//!
//! The page also **lists the members** that are candidates (every health but unhealthy),
//! one `infergate_pool_member{endpoint="ip:port"} 1` series each ([`members_to_prometheus`],
//! read back by [`parse_members`]): a gateway importing the pool in Endpoint Mode learns
//! from it which replicas it may send requests to, and scrapes them itself.

use alloc::collections::BTreeSet;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::Write;
use core::net::SocketAddr;

use super::{Health, Snapshot};
use crate::types::Millis;

/// The queue mean's metric name (llm-d's).
pub const AVERAGE_QUEUE_SIZE: &str = "llm_d_epp_average_queue_size";
/// The KV-cache mean's metric name (llm-d's), a fraction in 0..=1.
pub const AVERAGE_KV_CACHE_UTILIZATION: &str = "llm_d_epp_average_kv_cache_utilization";
/// The running-requests mean's metric name.
pub const AVERAGE_RUNNING: &str = "infergate_pool_average_running";
/// The member count's metric name.
pub const MEMBERS: &str = "infergate_pool_members";
/// The ready member count's metric name.
pub const READY_MEMBERS: &str = "infergate_pool_ready_members";

/// The member listing's metric name: one series per candidate member.
pub const MEMBER: &str = "infergate_pool_member";
/// The label of [`MEMBER`] that holds the member's `ip:port`.
pub const MEMBER_LABEL: &str = "endpoint";

/// One pool's load, as published to peers.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct PoolAggregate {
    /// Members the pool has (every health).
    pub members: u32,
    /// Members that are candidates with fresh metrics.
    pub ready: u32,
    /// Mean queued requests per ready member reporting a queue.
    pub average_queue_size: Option<f64>,
    /// Mean running requests per ready member reporting them.
    pub average_running: Option<f64>,
    /// Mean KV-cache use (0..=1) of the ready members reporting it.
    pub average_kv_cache_utilization: Option<f64>,
}

/// A running mean.
#[derive(Clone, Copy, Default)]
struct Mean {
    sum: f64,
    count: u32,
}

impl Mean {
    fn add(&mut self, value: Option<f64>) {
        if let Some(v) = value.filter(|v| v.is_finite()) {
            self.sum += v;
            self.count += 1;
        }
    }

    fn value(self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / f64::from(self.count))
    }
}

impl PoolAggregate {
    /// The aggregate of `members` (address and Envoy health) in `snapshot` at `now`, with
    /// metrics older than `max_age_ms` counting as unknown.
    pub fn of<'a>(
        snapshot: &Snapshot,
        members: impl IntoIterator<Item = (&'a str, Health)>,
        now: Millis,
        max_age_ms: u64,
    ) -> PoolAggregate {
        let mut aggregate = PoolAggregate::default();
        let (mut queue, mut running, mut kv) = (Mean::default(), Mean::default(), Mean::default());
        for (address, health) in members {
            aggregate.members = aggregate.members.saturating_add(1);
            if !health.is_candidate() {
                continue;
            }
            let metrics = snapshot
                .endpoints
                .iter()
                .find(|e| e.address == address)
                .and_then(|e| e.fresh_metrics(now, max_age_ms));
            let Some(metrics) = metrics else {
                continue;
            };
            aggregate.ready = aggregate.ready.saturating_add(1);
            queue.add(metrics.waiting.map(f64::from));
            running.add(metrics.running.map(f64::from));
            kv.add(metrics.kv_cache_usage);
        }
        aggregate.average_queue_size = queue.value();
        aggregate.average_running = running.value();
        aggregate.average_kv_cache_utilization = kv.value();
        aggregate
    }

    /// The Prometheus text page (module doc): the counts always, the means when there are
    /// ready members.
    pub fn to_prometheus(&self) -> String {
        let mut page = String::with_capacity(512);
        let mut gauge = |name: &str, help: &str, value: f64| {
            // Writing to a String cannot fail.
            let _ = write!(
                page,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
            );
        };
        gauge(MEMBERS, "Members of the pool.", f64::from(self.members));
        gauge(
            READY_MEMBERS,
            "Members that are candidates with fresh metrics.",
            f64::from(self.ready),
        );
        if self.ready == 0 {
            return page;
        }
        if let Some(v) = self.average_queue_size {
            gauge(
                AVERAGE_QUEUE_SIZE,
                "Mean queued requests per ready member.",
                v,
            );
        }
        if let Some(v) = self.average_running {
            gauge(
                AVERAGE_RUNNING,
                "Mean running requests per ready member.",
                v,
            );
        }
        if let Some(v) = self.average_kv_cache_utilization {
            gauge(
                AVERAGE_KV_CACHE_UTILIZATION,
                "Mean KV-cache use of the ready members, 0 to 1.",
                v,
            );
        }
        page
    }
}

/// Appends the member listing of `members` (`ip:port` each) to `page`.
pub fn members_to_prometheus<'a>(page: &mut String, members: impl IntoIterator<Item = &'a str>) {
    // Writing to a String cannot fail.
    let _ = write!(
        page,
        "# HELP {MEMBER} A member of the pool that is a candidate.\n# TYPE {MEMBER} gauge\n"
    );
    for address in members {
        let _ = writeln!(page, "{MEMBER}{{{MEMBER_LABEL}=\"{address}\"}} 1");
    }
}

/// Why a page gave no member listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembersError {
    /// The page declares no listing (no `# TYPE infergate_pool_member` line): a gateway
    /// that does not publish its members.
    NotListed,
    /// More members than the limit (the count so far, one past it).
    TooMany(usize),
}

/// The members a page lists ([`members_to_prometheus`]), each once, in page order, as
/// canonical `ip:port`. Series whose `endpoint` is not an IP socket address or whose value
/// is not positive are skipped, as is every other line. A page without the listing's
/// `# TYPE` line, or listing more than `max` members, is an error (never a partial or
/// empty membership by mistake). Never panics; linear in the page (a set dedups).
pub fn parse_members(page: &[u8], max: usize) -> Result<Vec<String>, MembersError> {
    let mut members: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut listed = false;
    for raw in crate::metrics::exposition::raw_lines(page) {
        if let Some(rest) = raw.strip_prefix(b"# TYPE ") {
            listed |= rest.split(|&b| b == b' ').next() == Some(MEMBER.as_bytes());
            continue;
        }
        if !raw.starts_with(MEMBER.as_bytes()) {
            continue;
        }
        let Ok(text) = core::str::from_utf8(raw) else {
            continue;
        };
        let crate::metrics::exposition::Line::Sample(sample) =
            crate::metrics::exposition::parse_line(text)
        else {
            continue;
        };
        if sample.name != MEMBER || sample.value.is_nan() || sample.value <= 0.0 {
            continue;
        }
        let address = sample
            .label(MEMBER_LABEL)
            .and_then(|a| a.parse::<SocketAddr>().ok());
        let Some(address) = address else {
            continue;
        };
        if !seen.insert(address) {
            continue;
        }
        if members.len() >= max {
            return Err(MembersError::TooMany(members.len() + 1));
        }
        members.push(address.to_string());
    }
    if listed {
        Ok(members)
    } else {
        Err(MembersError::NotListed)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use alloc::string::ToString;
    use alloc::vec;

    use super::*;
    use crate::metrics::{extract, EndpointMetrics, MetricNames};
    use crate::snapshot::EndpointSample;

    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn sample(address: &str, scraped_at: u64, waiting: u32, kv: f64) -> EndpointSample {
        EndpointSample {
            address: address.to_string(),
            scraped_at: Millis(scraped_at),
            consecutive_failures: 0,
            metrics: Some(EndpointMetrics {
                waiting: Some(waiting),
                running: Some(waiting * 2),
                kv_cache_usage: Some(kv),
                ..EndpointMetrics::default()
            }),
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            taken_at: Millis(10_000),
            endpoints: vec![
                sample("a:1", 9_900, 2, 0.2),
                sample("b:1", 9_950, 5, 0.6),
                // Stale at 10 000 with a 1 s bound.
                sample("c:1", 8_000, 40, 1.0),
                // Unhealthy in Envoy's view below.
                sample("d:1", 9_990, 40, 1.0),
            ],
            clusters: vec![],
        }
    }

    #[test]
    fn means_cover_ready_members_only() {
        let members = [
            ("a:1", Health::Healthy),
            ("b:1", Health::Degraded),
            ("c:1", Health::Healthy),
            ("d:1", Health::Unhealthy),
            ("never-scraped:1", Health::Healthy),
        ];
        let aggregate = PoolAggregate::of(&snapshot(), members, Millis(10_000), 1_000);
        assert_eq!((aggregate.members, aggregate.ready), (5, 2));
        assert_eq!(aggregate.average_queue_size, Some(3.5));
        assert_eq!(aggregate.average_running, Some(7.0));
        let kv = aggregate.average_kv_cache_utilization.unwrap();
        assert!((kv - 0.4).abs() < 1e-9, "{kv}");
    }

    #[test]
    fn the_page_scrapes_back_as_one_endpoint() {
        let members = [("a:1", Health::Healthy), ("b:1", Health::Healthy)];
        let page = PoolAggregate::of(&snapshot(), members, Millis(10_000), 1_000).to_prometheus();
        let metrics = extract(page.as_bytes(), &MetricNames::default());
        // 3.5 queued on average rounds to 4 (the scraper rounds to whole requests).
        assert_eq!(metrics.waiting, Some(4), "{page}");
        assert_eq!(metrics.running, Some(7), "{page}");
        let kv = metrics.kv_cache_usage.unwrap();
        assert!((kv - 0.4).abs() < 1e-9, "{page}");
        assert!(page.contains("infergate_pool_members 2\n"), "{page}");
    }

    #[test]
    fn a_pool_with_no_ready_member_publishes_no_load() {
        let members = [("c:1", Health::Healthy), ("d:1", Health::Unhealthy)];
        let aggregate = PoolAggregate::of(&snapshot(), members, Millis(10_000), 1_000);
        assert_eq!((aggregate.members, aggregate.ready), (2, 0));
        let page = aggregate.to_prometheus();
        assert!(page.contains("infergate_pool_ready_members 0\n"), "{page}");
        // Nothing a scraper schedules on: the peer's scrape fails, and it ends up dead.
        assert!(
            extract(page.as_bytes(), &MetricNames::default()).is_empty(),
            "{page}"
        );
    }

    #[test]
    fn the_member_listing_reads_back() {
        let mut page = PoolAggregate::default().to_prometheus();
        members_to_prometheus(&mut page, ["10.0.0.1:8000", "[::1]:9000", "10.0.0.1:8000"]);
        page.push_str("infergate_pool_member{endpoint=\"not-an-address\"} 1\n");
        page.push_str("infergate_pool_member{endpoint=\"10.0.0.2:8000\"} 0\n");
        page.push_str("infergate_pool_members_total{endpoint=\"10.0.0.3:8000\"} 1\n");
        page.push_str("infergate_pool_member{endpoint=\"10.0.0.4:8000\",zone=\"a\"} 1\n");
        assert_eq!(
            parse_members(page.as_bytes(), 16).unwrap(),
            vec!["10.0.0.1:8000", "[::1]:9000", "10.0.0.4:8000"],
            "{page}"
        );
        assert_eq!(
            parse_members(page.as_bytes(), 2),
            Err(MembersError::TooMany(3))
        );
        // A page without the listing (a gateway that does not publish its members).
        let load_only = PoolAggregate::default().to_prometheus();
        assert_eq!(
            parse_members(load_only.as_bytes(), 16),
            Err(MembersError::NotListed)
        );
        let mut empty = load_only.clone();
        members_to_prometheus(&mut empty, []);
        assert_eq!(parse_members(empty.as_bytes(), 16), Ok(Vec::new()));
        // The load figures are untouched by the listing.
        assert!(extract(page.as_bytes(), &MetricNames::default()).is_empty());
    }

    proptest::proptest! {
        #[test]
        fn member_listings_never_panic(page in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = parse_members(&page, 8);
        }

        #[test]
        fn member_listings_round_trip(ports in proptest::collection::vec(1u16.., 0..40)) {
            let addresses: Vec<String> = ports.iter().map(|p| alloc::format!("10.1.2.3:{p}")).collect();
            let mut page = String::new();
            members_to_prometheus(&mut page, addresses.iter().map(String::as_str));
            let mut expected: Vec<String> = Vec::new();
            for a in addresses {
                if !expected.contains(&a) {
                    expected.push(a);
                }
            }
            proptest::prop_assert_eq!(parse_members(page.as_bytes(), 64).unwrap(), expected);
        }
    }
}
