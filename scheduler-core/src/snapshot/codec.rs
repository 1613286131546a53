//! Encoder and decoder of the snapshot format described in the parent module.

use alloc::string::String;
use alloc::vec::Vec;
use xxhash_rust::xxh3::xxh3_64;

use super::{
    ClusterMembers, EndpointSample, Health, Member, Snapshot, SnapshotError, SnapshotHeader,
    HEADER_LEN, MAGIC, VERSION,
};
use crate::metrics::{CacheConfig, EndpointMetrics, LoraState};
use crate::types::Millis;

const HAS_METRICS: u8 = 1 << 0;
const HAS_WAITING: u8 = 1 << 1;
const HAS_RUNNING: u8 = 1 << 2;
const HAS_KV: u8 = 1 << 3;
const HAS_CACHE: u8 = 1 << 4;
const HAS_LORA: u8 = 1 << 5;
const KNOWN_FLAGS: u8 = HAS_METRICS | HAS_WAITING | HAS_RUNNING | HAS_KV | HAS_CACHE | HAS_LORA;

/// Smallest endpoint record: empty address (2), `scraped_at` (8), failures (4), flags (1).
const MIN_ENDPOINT_LEN: usize = 15;
/// Smallest list entry: an empty string's length prefix.
const MIN_STRING_LEN: usize = 2;
const BODY_HASH_AT: usize = 25;
/// Smallest cluster record: an empty name (2) and a member count (4).
const MIN_CLUSTER_LEN: usize = 6;
/// Smallest member record: an empty address (2) and a health byte (1).
const MIN_MEMBER_LEN: usize = 3;

/// Encodes with generation 0. Prefer [`encode_with_generation`] in a publisher.
pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    encode_with_generation(snapshot, 0)
}

/// Encodes, stamping the writer's publish counter into the header.
pub fn encode_with_generation(snapshot: &Snapshot, generation: u64) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(snapshot, generation, &mut out);
    out
}

/// Encodes into `out` (cleared first), so a publisher can reuse one buffer.
pub fn encode_into(snapshot: &Snapshot, generation: u64, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(HEADER_LEN + snapshot.endpoints.len() * 64);
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(&snapshot.taken_at.0.to_le_bytes());
    // More than u32::MAX endpoints cannot be described; the count and the records agree
    // because only that many records are written.
    let count = u32::try_from(snapshot.endpoints.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes()); // body hash, filled in below
    for endpoint in snapshot.endpoints.iter().take(count as usize) {
        encode_endpoint(endpoint, out);
    }
    let clusters = u32::try_from(snapshot.clusters.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&clusters.to_le_bytes());
    for cluster in snapshot.clusters.iter().take(clusters as usize) {
        encode_cluster(cluster, out);
    }
    reseal(out);
}

/// Rewrites the header's body hash to match the bytes after the header (no-op on bytes
/// shorter than a header): for tools that build or mutate snapshot bytes by hand, such as
/// the fuzzer, so the decoder's structural checks are reached rather than the hash check.
pub fn reseal(bytes: &mut [u8]) {
    let hash = xxh3_64(bytes.get(HEADER_LEN..).unwrap_or_default());
    if let Some(slot) = bytes.get_mut(BODY_HASH_AT..HEADER_LEN) {
        slot.copy_from_slice(&hash.to_le_bytes());
    }
}

fn encode_endpoint(endpoint: &EndpointSample, out: &mut Vec<u8>) {
    put_str(&endpoint.address, out);
    out.extend_from_slice(&endpoint.scraped_at.0.to_le_bytes());
    out.extend_from_slice(&endpoint.consecutive_failures.to_le_bytes());
    let Some(m) = &endpoint.metrics else {
        out.push(0);
        return;
    };
    let mut flags = HAS_METRICS;
    for (present, bit) in [
        (m.waiting.is_some(), HAS_WAITING),
        (m.running.is_some(), HAS_RUNNING),
        (m.kv_cache_usage.is_some(), HAS_KV),
        (m.cache.is_some(), HAS_CACHE),
        (m.lora.is_some(), HAS_LORA),
    ] {
        if present {
            flags |= bit;
        }
    }
    out.push(flags);
    if let Some(v) = m.waiting {
        out.extend_from_slice(&v.to_le_bytes());
    }
    if let Some(v) = m.running {
        out.extend_from_slice(&v.to_le_bytes());
    }
    if let Some(v) = m.kv_cache_usage {
        out.extend_from_slice(&v.to_bits().to_le_bytes());
    }
    if let Some(c) = m.cache {
        out.extend_from_slice(&c.block_size.to_le_bytes());
        out.extend_from_slice(&c.num_blocks.to_le_bytes());
    }
    if let Some(l) = &m.lora {
        out.extend_from_slice(&l.max.to_le_bytes());
        put_list(&l.running, out);
        put_list(&l.waiting, out);
    }
}

fn encode_cluster(cluster: &ClusterMembers, out: &mut Vec<u8>) {
    put_str(&cluster.cluster, out);
    let count = u32::try_from(cluster.members.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for member in cluster.members.iter().take(count as usize) {
        put_str(&member.address, out);
        out.push(health_byte(member.health));
    }
}

fn health_byte(health: Health) -> u8 {
    match health {
        Health::Healthy => 0,
        Health::Degraded => 1,
        Health::Unhealthy => 2,
    }
}

fn health_of(byte: u8) -> Result<Health, SnapshotError> {
    match byte {
        0 => Ok(Health::Healthy),
        1 => Ok(Health::Degraded),
        2 => Ok(Health::Unhealthy),
        other => Err(SnapshotError::BadHealth(other)),
    }
}

fn put_str(s: &str, out: &mut Vec<u8>) {
    let mut len = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(len) {
        len -= 1;
    }
    let bytes = s.as_bytes().get(..len).unwrap_or_default();
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_list(items: &[String], out: &mut Vec<u8>) {
    let count = items.len().min(u16::MAX as usize);
    out.extend_from_slice(&(count as u16).to_le_bytes());
    for item in items.iter().take(count) {
        put_str(item, out);
    }
}

/// Reads the fixed header in O(1), without checking the body.
pub fn read_header(bytes: &[u8]) -> Result<SnapshotHeader, SnapshotError> {
    if bytes.get(..MAGIC.len()).is_some_and(|m| m != MAGIC) {
        return Err(SnapshotError::BadMagic);
    }
    let mut r = Reader { bytes, pos: 0 };
    r.take(MAGIC.len())?;
    let version = r.u8()?;
    if version != VERSION {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    Ok(SnapshotHeader {
        version,
        generation: r.u64()?,
        taken_at: Millis(r.u64()?),
        endpoint_count: r.u32()?,
        body_hash: r.u64()?,
    })
}

/// Decodes a snapshot, checking the body hash.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    decode_with_header(bytes).map(|(_, snapshot)| snapshot)
}

/// Decodes a snapshot and returns its header too.
pub fn decode_with_header(bytes: &[u8]) -> Result<(SnapshotHeader, Snapshot), SnapshotError> {
    let mut snapshot = Snapshot::default();
    let header = decode_into(bytes, &mut snapshot)?;
    Ok((header, snapshot))
}

/// Decodes into `out`, reusing its allocations (endpoint list, address and adapter
/// strings), so a reader that keeps a spare snapshot decodes without allocating once
/// the pool is stable. On error `out` holds a partial result and must not be used.
pub fn decode_into(bytes: &[u8], out: &mut Snapshot) -> Result<SnapshotHeader, SnapshotError> {
    decode_checked(bytes, true, out)
}

/// The decoder proper; `verify_hash: false` lets tests reach the structural checks with
/// corrupted bodies.
pub(super) fn decode_checked(
    bytes: &[u8],
    verify_hash: bool,
    out: &mut Snapshot,
) -> Result<SnapshotHeader, SnapshotError> {
    let header = read_header(bytes)?;
    let body = bytes.get(HEADER_LEN..).ok_or(SnapshotError::Truncated)?;
    if verify_hash && xxh3_64(body) != header.body_hash {
        return Err(SnapshotError::BadChecksum);
    }
    let mut r = Reader {
        bytes: body,
        pos: 0,
    };
    let count = r.bounded_count(header.endpoint_count as usize, MIN_ENDPOINT_LEN)?;
    out.taken_at = header.taken_at;
    out.endpoints.truncate(count);
    for i in 0..count {
        match out.endpoints.get_mut(i) {
            Some(endpoint) => decode_endpoint(&mut r, endpoint)?,
            None => {
                let mut endpoint = EndpointSample::default();
                decode_endpoint(&mut r, &mut endpoint)?;
                out.endpoints.push(endpoint);
            }
        }
    }
    let clusters = r.u32()? as usize;
    let clusters = r.bounded_count(clusters, MIN_CLUSTER_LEN)?;
    out.clusters.truncate(clusters);
    for i in 0..clusters {
        match out.clusters.get_mut(i) {
            Some(cluster) => decode_cluster(&mut r, cluster)?,
            None => {
                let mut cluster = ClusterMembers::default();
                decode_cluster(&mut r, &mut cluster)?;
                out.clusters.push(cluster);
            }
        }
    }
    let left = r.remaining();
    if left != 0 {
        return Err(SnapshotError::TrailingBytes(left));
    }
    Ok(header)
}

fn decode_endpoint(r: &mut Reader<'_>, out: &mut EndpointSample) -> Result<(), SnapshotError> {
    r.string_into(&mut out.address)?;
    out.scraped_at = Millis(r.u64()?);
    out.consecutive_failures = r.u32()?;
    let flags = r.u8()?;
    if flags & !KNOWN_FLAGS != 0 || (flags != 0 && flags & HAS_METRICS == 0) {
        return Err(SnapshotError::BadFlags(flags));
    }
    if flags & HAS_METRICS == 0 {
        out.metrics = None;
        return Ok(());
    }
    decode_metrics(
        r,
        flags,
        out.metrics.get_or_insert_with(EndpointMetrics::default),
    )
}

fn decode_cluster(r: &mut Reader<'_>, out: &mut ClusterMembers) -> Result<(), SnapshotError> {
    r.string_into(&mut out.cluster)?;
    let count = r.u32()? as usize;
    let count = r.bounded_count(count, MIN_MEMBER_LEN)?;
    out.members.truncate(count);
    for i in 0..count {
        match out.members.get_mut(i) {
            Some(member) => decode_member(r, member)?,
            None => {
                let mut member = Member::default();
                decode_member(r, &mut member)?;
                out.members.push(member);
            }
        }
    }
    Ok(())
}

fn decode_member(r: &mut Reader<'_>, out: &mut Member) -> Result<(), SnapshotError> {
    r.string_into(&mut out.address)?;
    out.health = health_of(r.u8()?)?;
    Ok(())
}

fn decode_metrics(
    r: &mut Reader<'_>,
    flags: u8,
    out: &mut EndpointMetrics,
) -> Result<(), SnapshotError> {
    let has = |bit: u8| flags & bit != 0;
    out.waiting = if has(HAS_WAITING) {
        Some(r.u32()?)
    } else {
        None
    };
    out.running = if has(HAS_RUNNING) {
        Some(r.u32()?)
    } else {
        None
    };
    out.kv_cache_usage = if has(HAS_KV) {
        Some(f64::from_bits(r.u64()?))
    } else {
        None
    };
    out.cache = if has(HAS_CACHE) {
        Some(CacheConfig {
            block_size: r.u32()?,
            num_blocks: r.u64()?,
        })
    } else {
        None
    };
    if !has(HAS_LORA) {
        out.lora = None;
        return Ok(());
    }
    let lora = out.lora.get_or_insert_with(LoraState::default);
    lora.max = r.u32()?;
    r.list_into(&mut lora.running)?;
    r.list_into(&mut lora.waiting)
}

/// Bounds-checked little-endian reader; every failure is [`SnapshotError::Truncated`].
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.pos.checked_add(n).ok_or(SnapshotError::Truncated)?;
        let out = self
            .bytes
            .get(self.pos..end)
            .ok_or(SnapshotError::Truncated)?;
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(u8::from_le_bytes(self.array()?))
    }

    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Reads a string into `out`, reusing its buffer.
    fn string_into(&mut self, out: &mut String) -> Result<(), SnapshotError> {
        let len = self.u16()? as usize;
        let text = core::str::from_utf8(self.take(len)?).map_err(|_| SnapshotError::BadUtf8)?;
        out.clear();
        out.push_str(text);
        Ok(())
    }

    /// Reads a string list into `out`, reusing its strings.
    fn list_into(&mut self, out: &mut Vec<String>) -> Result<(), SnapshotError> {
        let count = self.u16()? as usize;
        let count = self.bounded_count(count, MIN_STRING_LEN)?;
        out.truncate(count);
        for i in 0..count {
            match out.get_mut(i) {
                Some(item) => self.string_into(item)?,
                None => {
                    let mut item = String::new();
                    self.string_into(&mut item)?;
                    out.push(item);
                }
            }
        }
        Ok(())
    }

    /// Rejects a count whose entries could not fit in the bytes left, before anything is
    /// allocated for them.
    fn bounded_count(&self, count: usize, min_entry_len: usize) -> Result<usize, SnapshotError> {
        match count.checked_mul(min_entry_len) {
            Some(need) if need <= self.remaining() => Ok(count),
            _ => Err(SnapshotError::CountTooLarge),
        }
    }
}
