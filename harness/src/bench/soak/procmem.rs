//! What the kernel says about a process's memory: resident set size and its peak from
//! `/proc/<pid>/status`, resetting the peak through `/proc/<pid>/clear_refs`, and the
//! proxy-wasm VMs' linear memories found in `/proc/<pid>/smaps`.
//!
//! Envoy reports nothing about its Wasm VMs' memory (admin `/memory` and the `server.memory_*`
//! gauges describe tcmalloc's heap, which V8's Wasm memories are not part of), so they are
//! read from the address space: V8 reserves each Wasm linear memory as one large region
//! (8 GiB plus guard pages on x86_64, so bounds checks are free) and makes its first
//! `memory.size` bytes readable and writable. A VM's memory is therefore the `rw-p` mapping
//! that ends exactly where such a reservation (`---p`, at least 4 GiB) begins; its size is
//! what the module has grown to, and its `Rss` what it has touched. Neither ever shrinks.

use anyhow::{Context, Result};

/// Smallest inaccessible reservation taken to be a Wasm memory's guard region.
const WASM_RESERVATION_MIN: u64 = 4 << 30;

/// `VmRSS` of `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    status_field(pid, "VmRSS:")
}

/// `VmHWM` (peak resident set since start or since [`reset_peak`]) of `pid`, in bytes.
pub fn peak_rss_bytes(pid: u32) -> Result<u64> {
    status_field(pid, "VmHWM:")
}

/// Resets `VmHWM` of `pid` to its current RSS (`echo 5 > /proc/<pid>/clear_refs`).
pub fn reset_peak(pid: u32) -> Result<()> {
    let path = format!("/proc/{pid}/clear_refs");
    std::fs::write(&path, b"5").with_context(|| format!("writing {path}"))
}

fn status_field(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_kb_field(&text, field).with_context(|| format!("no {field} in {path}"))
}

/// `Field:   123 kB` → 123 × 1024.
fn parse_kb_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line
        .get(field.len()..)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The Wasm linear memories of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WasmMemories {
    /// How many linear memories (one per VM instance).
    pub count: u32,
    /// Σ of their current sizes (`memory.size` × 64 KiB), bytes.
    pub size_bytes: u64,
    /// Σ of their resident pages, bytes.
    pub resident_bytes: u64,
}

/// The Wasm linear memories in `/proc/<pid>/smaps`.
pub fn wasm_memories(pid: u32) -> Result<WasmMemories> {
    let path = format!("/proc/{pid}/smaps");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    Ok(parse_wasm_memories(&text))
}

/// One mapping of an smaps listing.
struct Mapping {
    start: u64,
    end: u64,
    perms: String,
    rss_bytes: u64,
}

fn parse_mappings(smaps: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some((a, b)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                out.push(Mapping {
                    start,
                    end,
                    perms: words.next().unwrap_or_default().to_string(),
                    rss_bytes: 0,
                });
                continue;
            }
        }
        if first == "Rss:" {
            if let (Some(m), Some(kb)) = (out.last_mut(), words.next()) {
                m.rss_bytes = kb.parse::<u64>().unwrap_or(0) * 1024;
            }
        }
    }
    out
}

fn parse_wasm_memories(smaps: &str) -> WasmMemories {
    let maps = parse_mappings(smaps);
    let mut out = WasmMemories::default();
    for pair in maps.windows(2) {
        let [mem, guard] = pair else { continue };
        let is_guard = guard.perms.starts_with("---")
            && guard.end.saturating_sub(guard.start) >= WASM_RESERVATION_MIN;
        if is_guard && mem.end == guard.start && mem.perms.starts_with("rw") {
            out.count += 1;
            out.size_bytes += mem.end - mem.start;
            out.resident_bytes += mem.rss_bytes;
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_in_bytes() {
        let text = "Name:\tenvoy\nVmHWM:\t  107416 kB\nVmRSS:\t  100000 kB\n";
        assert_eq!(parse_kb_field(text, "VmRSS:"), Some(100_000 * 1024));
        assert_eq!(parse_kb_field(text, "VmHWM:"), Some(107_416 * 1024));
        assert_eq!(parse_kb_field(text, "VmSwap:"), None);
    }

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        let rss = rss_bytes(me).unwrap();
        assert!(rss > 0);
        assert!(peak_rss_bytes(me).unwrap() >= rss / 2);
        // No Wasm VM lives in a test binary.
        assert_eq!(wasm_memories(me).unwrap().count, 0);
    }

    #[test]
    fn a_wasm_memory_is_the_writable_mapping_before_a_huge_reservation() {
        // Shaped like V8's in Envoy: 1152 KiB grown, 92 kB touched, then the guard region;
        // an unrelated writable mapping and a small inaccessible one do not count.
        let smaps = "\
7f6916000000-7f6916100000 rw-p 00000000 00:00 0
Rss:                  40 kB
7f6916100000-7f6916110000 ---p 00000000 00:00 0
Rss:                   0 kB
7f69161f0000-7f6916310000 rw-p 00000000 00:00 0
Size:               1152 kB
Rss:                  92 kB
7f6916310000-7f6b161f0000 ---p 00000000 00:00 0
Rss:                   0 kB
7f6b161fc000-7f6b1620c000 r--p 00000000 00:00 0
Rss:                   4 kB
";
        let m = parse_wasm_memories(smaps);
        assert_eq!(m.count, 1);
        assert_eq!(m.size_bytes, 1152 * 1024);
        assert_eq!(m.resident_bytes, 92 * 1024);
    }
}
