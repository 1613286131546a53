//! The versioned binary metric snapshot: written by the scraper, decoded by the picker.
//!
//! The scraper encodes one [`Snapshot`] per scrape round and publishes the bytes (proxy-wasm
//! shared data, or process memory for the dynamic module); every picker reads them. So the
//! format is built for the reader:
//!
//! - [`read_header`] is O(1): magic, version, a writer-chosen generation, `taken_at`, the
//!   endpoint count and a hash of the body. [`SnapshotCache`] uses it to skip decoding
//!   when the bytes have not changed, so a request costs a header compare.
//! - [`decode`] is one pass, O(endpoints + bytes), with no work that depends on anything
//!   else; it checks the body hash, bounds every count by the bytes left before
//!   allocating, and returns a typed [`SnapshotError`] — it never panics, whatever the
//!   input. [`decode_into`] reuses a previous snapshot's buffers; [`SnapshotCache`] keeps
//!   a spare for it, so re-decoding a stable pool allocates nothing.
//!
//! Measured (`cargo bench -p scheduler-core --bench snapshot`, 2 shared cores under load):
//! unchanged-snapshot check ≈ 10 ns; re-decode into spare buffers ≈ 1.2 µs for 16
//! endpoints, ≈ 6.6 µs for 100; fresh `decode` ≈ 3.3 µs / 22 µs (allocation-bound).
//!
//! Layout, version 2, all integers little-endian:
//!
//! | field | bytes | notes |
//! |---|---|---|
//! | magic | 4 | `IGSN` |
//! | version | 1 | `2` |
//! | generation | 8 | writer's publish counter (0 if unused) |
//! | taken_at | 8 | ms |
//! | endpoint count | 4 | |
//! | body hash | 8 | xxh3-64 of every byte after the header |
//! | endpoints | … | repeated, see below |
//! | cluster count | 4 | |
//! | clusters | … | repeated, see below |
//!
//! Endpoint: address (`u16` length + UTF-8), `scraped_at` `u64`, `consecutive_failures`
//! `u32`, one presence byte (bit 0 metrics, 1 waiting, 2 running, 3 KV usage, 4 cache,
//! 5 LoRA; bits 6–7 must be zero), then only the present fields: waiting `u32`, running
//! `u32`, KV usage `f64` bits, cache (`u32` block size, `u64` blocks), LoRA (`u32` max,
//! then two lists: `u16` count, each adapter `u16` length + UTF-8).
//!
//! Cluster: name (`u16` length + UTF-8), `u32` member count, then per member its address
//! (`u16` length + UTF-8) and one health byte (0 healthy, 1 degraded, 2 unhealthy; any
//! other value is an error).
//!
//! Limits of the encoder: strings longer than 65 535 bytes are cut at the last char
//! boundary below that, lists longer than 65 535 entries are cut; neither occurs with real
//! addresses or adapter names.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use serde::{Deserialize, Serialize};

use crate::metrics::EndpointMetrics;
use crate::types::Millis;

pub mod aggregate;
mod codec;

pub use aggregate::PoolAggregate;

pub use codec::{
    decode, decode_into, decode_with_header, encode, encode_into, encode_with_generation,
    read_header, reseal,
};

// A test fails by panicking on a broken fixture; the crate-wide ban is for product code.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;

/// The first bytes of every snapshot.
pub const MAGIC: [u8; 4] = *b"IGSN";
/// The format version this code writes and reads.
pub const VERSION: u8 = 2;
/// Bytes in the fixed header.
pub const HEADER_LEN: usize = 33;
/// A sample older than this counts as unknown unless configured otherwise.
pub const DEFAULT_MAX_AGE_MS: u64 = 1_000;

/// All endpoints of one pool as last scraped.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// When the scraper assembled this snapshot.
    pub taken_at: Millis,
    /// One entry per endpoint, in the scraper's order.
    pub endpoints: Vec<EndpointSample>,
    /// The members of every Envoy cluster the scraper follows, as it last learned them
    /// (empty when it follows none). A pool that follows its cluster picks among exactly
    /// these; one with a static list honours their health.
    #[serde(default)]
    pub clusters: Vec<ClusterMembers>,
}

/// How Envoy sees one member of a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Health {
    /// Serving: a candidate.
    #[default]
    Healthy,
    /// Serving but degraded (EDS `DEGRADED`, a failed degraded check): still a candidate.
    Degraded,
    /// Not serving: a failed active health check, outlier-ejected, or EDS
    /// `UNHEALTHY` / `DRAINING` / `TIMEOUT`. Never a candidate.
    Unhealthy,
}

impl Health {
    /// True if an endpoint of this health may be picked.
    pub fn is_candidate(self) -> bool {
        !matches!(self, Health::Unhealthy)
    }
}

/// One member of a cluster: its address and health.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Member {
    /// `ip:port` of the member.
    pub address: String,
    /// Its health as Envoy sees it.
    pub health: Health,
}

/// The members of one Envoy cluster.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ClusterMembers {
    /// The cluster's name.
    pub cluster: String,
    /// Its members, in the order the scraper learned them.
    pub members: Vec<Member>,
}

impl Snapshot {
    /// The members of `cluster`, if this snapshot carries that cluster.
    pub fn cluster(&self, cluster: &str) -> Option<&ClusterMembers> {
        self.clusters.iter().find(|c| c.cluster == cluster)
    }
}

/// What the scraper knows about one endpoint.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct EndpointSample {
    /// `ip:port` of the endpoint.
    pub address: String,
    /// When `metrics` was scraped (the last successful scrape).
    pub scraped_at: Millis,
    /// Scrapes failed in a row since the last success (0 after a success).
    pub consecutive_failures: u32,
    /// The last successfully extracted metrics; `None` if never scraped successfully.
    pub metrics: Option<EndpointMetrics>,
}

impl EndpointSample {
    /// True if the sample is at most `max_age_ms` old at `now`. A `scraped_at` in the
    /// future (clock skew between workers) counts as fresh.
    pub fn is_fresh(&self, now: Millis, max_age_ms: u64) -> bool {
        now.since(self.scraped_at) <= max_age_ms
    }

    /// The metrics if present and fresh; `None` means "unknown" to the scheduler.
    pub fn fresh_metrics(&self, now: Millis, max_age_ms: u64) -> Option<&EndpointMetrics> {
        self.metrics
            .as_ref()
            .filter(|_| self.is_fresh(now, max_age_ms))
    }
}

/// The fixed header, readable without decoding the endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// Format version.
    pub version: u8,
    /// Writer's publish counter (0 if the writer does not keep one).
    pub generation: u64,
    /// When the snapshot was assembled.
    pub taken_at: Millis,
    /// Number of endpoint records that follow.
    pub endpoint_count: u32,
    /// xxh3-64 of the body; together with the rest it identifies the content.
    pub body_hash: u64,
}

/// Why bytes could not be decoded as a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    /// The bytes do not start with [`MAGIC`].
    BadMagic,
    /// Written by a format version this code does not read.
    UnsupportedVersion(u8),
    /// The bytes end before the structure does.
    Truncated,
    /// A string is not valid UTF-8.
    BadUtf8,
    /// A count claims more entries than the remaining bytes could hold.
    CountTooLarge,
    /// A presence byte has reserved bits set, or field bits without the metrics bit.
    BadFlags(u8),
    /// The body does not match the hash in the header.
    BadChecksum,
    /// Bytes left over after the last cluster.
    TrailingBytes(usize),
    /// A member's health byte is not one of the defined values.
    BadHealth(u8),
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::BadMagic => f.write_str("not a snapshot (bad magic)"),
            SnapshotError::UnsupportedVersion(v) => write!(f, "unsupported snapshot version {v}"),
            SnapshotError::Truncated => f.write_str("snapshot truncated"),
            SnapshotError::BadUtf8 => f.write_str("snapshot string is not UTF-8"),
            SnapshotError::CountTooLarge => f.write_str("snapshot count exceeds its bytes"),
            SnapshotError::BadFlags(b) => write!(f, "bad presence flags {b:#04x}"),
            SnapshotError::BadChecksum => f.write_str("snapshot body hash mismatch"),
            SnapshotError::TrailingBytes(n) => write!(f, "{n} trailing bytes after snapshot"),
            SnapshotError::BadHealth(b) => write!(f, "bad member health {b:#04x}"),
        }
    }
}

/// The picker's view: the last decoded snapshot, re-decoded only when the bytes change.
///
/// It keeps a spare snapshot to decode into and swaps on success, so in steady state (same
/// endpoints, same adapters) a re-decode allocates nothing.
#[derive(Clone, Debug, Default)]
pub struct SnapshotCache {
    header: Option<SnapshotHeader>,
    snapshot: Snapshot,
    spare: Snapshot,
}

impl SnapshotCache {
    /// Looks at freshly read snapshot bytes: returns `Ok(false)` after an O(1) header
    /// compare if they are the ones already decoded, else decodes them and returns
    /// `Ok(true)`. On error the previous snapshot is kept (it will age out by staleness).
    pub fn update(&mut self, bytes: &[u8]) -> Result<bool, SnapshotError> {
        let header = read_header(bytes)?;
        if self.header == Some(header) {
            return Ok(false);
        }
        let header = decode_into(bytes, &mut self.spare)?;
        core::mem::swap(&mut self.snapshot, &mut self.spare);
        self.header = Some(header);
        Ok(true)
    }

    /// The last successfully decoded snapshot (empty before the first).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The header of [`Self::snapshot`], `None` before the first decode.
    pub fn header(&self) -> Option<SnapshotHeader> {
        self.header
    }
}
