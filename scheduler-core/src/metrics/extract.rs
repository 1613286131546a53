//! From one `/metrics` page to one [`EndpointMetrics`].
//!
//! A single pass over the page. Lines whose bare metric name is not in [`MetricNames`]
//! are dropped after reading the name, before UTF-8 validation or label parsing, so the
//! cost is dominated by scanning for line ends.
//!
//! Aggregation rules (engines export one series per model, DP rank or engine index):
//! - **Unusable values are missing.** A series whose value is NaN, infinite or negative is
//!   dropped before anything else (an engine that has not computed a gauge yet reports
//!   NaN; none of these quantities can be negative). A field whose every series was
//!   dropped is `None`, never zero.
//! - **Name priority.** For each field the first configured name with at least one usable
//!   series wins; other names are not mixed in.
//! - `waiting`, `running`: the **sum** over series (requests queued or running anywhere on
//!   the endpoint), rounded to the nearest integer and saturated at `u32::MAX`.
//! - `kv_cache_usage`: the **maximum** over series (the fullest engine bounds what a new
//!   request can get), then clamped to [0, 1].
//! - `cache`: from the first series of an info metric whose block-size and block-count
//!   labels both parse as positive integers (`"16"` or `"16.0"`; vLLM writes `"None"`
//!   before the cache is sized, which is skipped); else from the block-size and
//!   block-count gauges (maximum over series), if both are present and positive.
//! - `lora`: among series of the LoRA info metric whose slot-count label parses, the one
//!   with the **newest value** (the gauge value is the time it was set) wins; on a tie the
//!   earlier line wins. Adapter lists are split on `,`, trimmed, empties dropped, and cut
//!   at [`MAX_ADAPTERS`] names (a label of `a,a,a,…` would otherwise cost ~20 bytes of
//!   memory per byte of page).

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use super::exposition::{leading_bare_name, parse_line, raw_lines, Line, Sample};
use super::names::{length_bit, MetricNames, Role};
use super::{CacheConfig, EndpointMetrics, LoraState};

/// Extracts the scheduling metrics from a Prometheus text page. Never fails: anything
/// unreadable is skipped, and a page with none of the metrics yields all-`None`
/// (see [`EndpointMetrics::is_empty`]).
pub fn extract(page: &[u8], names: &MetricNames) -> EndpointMetrics {
    let mut acc = Accumulator::new(names);
    let lengths = names.length_mask();
    for raw in raw_lines(page) {
        let wanted = match leading_bare_name(raw) {
            Some(name) => lengths & length_bit(name.len()) != 0 && names.role_of(name).is_some(),
            // Quoted-name samples start with `{`; comments and garbage are dropped here.
            None => raw.iter().find(|&&b| b != b' ' && b != b'\t') == Some(&b'{'),
        };
        if !wanted {
            continue;
        }
        let Ok(text) = core::str::from_utf8(raw) else {
            continue;
        };
        let Line::Sample(sample) = parse_line(text) else {
            continue;
        };
        if let Some(role) = names.role_of(sample.name.as_bytes()) {
            acc.add(role, &sample, names);
        }
    }
    acc.finish()
}

/// Per-name partial results; index `i` belongs to the `i`-th name of the field's list.
struct Accumulator {
    waiting: Vec<Option<f64>>,
    running: Vec<Option<f64>>,
    kv_usage: Vec<Option<f64>>,
    cache_info: Vec<Option<CacheConfig>>,
    block_size: Vec<Option<f64>>,
    num_blocks: Vec<Option<f64>>,
    lora: Vec<Option<(f64, LoraState)>>,
}

impl Accumulator {
    fn new(names: &MetricNames) -> Self {
        Accumulator {
            waiting: vec![None; names.waiting.len()],
            running: vec![None; names.running.len()],
            kv_usage: vec![None; names.kv_cache_usage.len()],
            cache_info: vec![None; names.cache_info.len()],
            block_size: vec![None; names.cache_block_size.len()],
            num_blocks: vec![None; names.cache_num_blocks.len()],
            lora: vec![None; names.lora_info.len()],
        }
    }

    fn add(&mut self, role: Role, sample: &Sample<'_>, names: &MetricNames) {
        let Some(value) = usable(sample.value) else {
            return;
        };
        match role {
            Role::Waiting(i) => sum_into(self.waiting.get_mut(i), value),
            Role::Running(i) => sum_into(self.running.get_mut(i), value),
            Role::KvUsage(i) => max_into(self.kv_usage.get_mut(i), value),
            Role::CacheBlockSize(i) => max_into(self.block_size.get_mut(i), value),
            Role::CacheNumBlocks(i) => max_into(self.num_blocks.get_mut(i), value),
            Role::CacheInfo(i) => {
                let (Some(slot), Some(spec)) =
                    (self.cache_info.get_mut(i), names.cache_info.get(i))
                else {
                    return;
                };
                if slot.is_some() {
                    return;
                }
                let block_size = sample
                    .label(&spec.block_size_label)
                    .and_then(|v| parse_count(&v))
                    .and_then(|v| u32::try_from(v).ok());
                let num_blocks = sample
                    .label(&spec.num_blocks_label)
                    .and_then(|v| parse_count(&v));
                if let (Some(block_size), Some(num_blocks)) = (block_size, num_blocks) {
                    if block_size > 0 && num_blocks > 0 {
                        *slot = Some(CacheConfig {
                            block_size,
                            num_blocks,
                        });
                    }
                }
            }
            Role::LoraInfo(i) => {
                let (Some(slot), Some(spec)) = (self.lora.get_mut(i), names.lora_info.get(i))
                else {
                    return;
                };
                if slot.as_ref().is_some_and(|(newest, _)| *newest >= value) {
                    return;
                }
                let Some(max) = sample
                    .label(&spec.max_label)
                    .and_then(|v| parse_count(&v))
                    .and_then(|v| u32::try_from(v).ok())
                else {
                    return;
                };
                let running = sample
                    .label(&spec.running_label)
                    .map(|v| split_adapters(&v))
                    .unwrap_or_default();
                let waiting = sample
                    .label(&spec.waiting_label)
                    .map(|v| split_adapters(&v))
                    .unwrap_or_default();
                *slot = Some((
                    value,
                    LoraState {
                        max,
                        running,
                        waiting,
                    },
                ));
            }
        }
    }

    fn finish(self) -> EndpointMetrics {
        let cache = first(self.cache_info).or_else(|| {
            let block_size = first(self.block_size).map(to_count)?;
            let num_blocks = first(self.num_blocks).map(to_count)?;
            let block_size = u32::try_from(block_size).ok()?;
            (block_size > 0 && num_blocks > 0).then_some(CacheConfig {
                block_size,
                num_blocks,
            })
        });
        EndpointMetrics {
            waiting: first(self.waiting).map(to_u32),
            running: first(self.running).map(to_u32),
            kv_cache_usage: first(self.kv_usage).map(|v| v.clamp(0.0, 1.0)),
            cache,
            lora: first(self.lora).map(|(_, state)| state),
        }
    }
}

/// `Some(v)` if `v` can be a gauge of ours: finite and not negative.
fn usable(v: f64) -> Option<f64> {
    (v.is_finite() && v >= 0.0).then_some(v)
}

fn sum_into(slot: Option<&mut Option<f64>>, value: f64) {
    if let Some(slot) = slot {
        *slot = Some(slot.map_or(value, |sum| sum + value));
    }
}

fn max_into(slot: Option<&mut Option<f64>>, value: f64) {
    if let Some(slot) = slot {
        *slot = Some(slot.map_or(value, |max| max.max(value)));
    }
}

/// The first name's result that exists (list order is priority order).
fn first<T>(per_name: Vec<Option<T>>) -> Option<T> {
    per_name.into_iter().flatten().next()
}

/// Rounds a usable value to the nearest integer, saturating (`as` saturates; `core` has no
/// `f64::round` without `std`).
fn to_count(v: f64) -> u64 {
    (v + 0.5) as u64
}

fn to_u32(v: f64) -> u32 {
    u32::try_from(to_count(v)).unwrap_or(u32::MAX)
}

/// Parses a label value holding a count: `"16"`, or an integral float such as `"16.0"`.
fn parse_count(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Ok(n) = text.parse::<u64>() {
        return Some(n);
    }
    let v = usable(text.parse::<f64>().ok()?)?;
    let n = v as u64;
    (n as f64 == v).then_some(n)
}

/// The most adapter names kept per LoRA list: engines serve tens of adapter slots, and the
/// list's 24 bytes per name stay within a few kilobytes, whatever the page.
pub const MAX_ADAPTERS: usize = 256;

fn split_adapters(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .take(MAX_ADAPTERS)
        .map(ToString::to_string)
        .collect()
}
