//! What the picker remembers of the LoRA adapters it sent to each endpoint, and the
//! scorer's view of an endpoint's loaded adapters built from it.
//!
//! vLLM's `lora_requests_info` lists as running only the adapters with running requests:
//! an adapter still loaded but idle is invisible in the scrape, so every replica with a
//! free slot looks the same to the LoRA affinity scorer and adapters spread over the pool
//! (each spread costs a load). The picker knows better what it sent: per endpoint, an
//! [`AdapterMemory`] keeps the adapters sent there, most recent first, each with the count
//! of its requests still in flight (raised by the pick, lowered by the lease's drop, so
//! giving back takes no lock). The most recent distinct ones are the guess at what is
//! resident: an engine evicts its least recently used adapter when it needs a slot.
//!
//! For a pick of an adapter, [`augmented`] gives a candidate with scraped LoRA state the
//! scraped running list ∪ its in-flight adapters ∪ the guess, the guess cut so the list
//! never exceeds the endpoint's slots; the scorer's tiers are unchanged. Base-model picks
//! never read or write any of it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use scheduler_core::metrics::{EndpointMetrics, LoraState};

/// The most adapter names remembered per endpoint, whatever its scraped slot count says.
pub(crate) const MAX_REMEMBERED: usize = 64;

/// One adapter sent to an endpoint.
#[derive(Debug)]
struct Sent {
    name: Box<str>,
    /// Its requests to the endpoint not yet given back (shared with their leases).
    in_flight: Arc<AtomicU32>,
}

impl Sent {
    fn in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
    }
}

/// One request of an adapter counted in flight at its endpoint; dropping it lowers the
/// count (a lease holds it, so it is given back with the lease, without any lock).
#[derive(Debug)]
pub(crate) struct AdapterMark(Arc<AtomicU32>);

impl Drop for AdapterMark {
    fn drop(&mut self) {
        // Saturating: every mark raised the count once, but a counter must never wrap.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }
}

/// The adapters the picker sent to one endpoint, most recent first (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct AdapterMemory {
    sent: Vec<Sent>,
}

impl AdapterMemory {
    /// A request for `adapter` was sent here, to an endpoint of `slots` adapter slots:
    /// make it the most recent, count the request in flight, forget the least recent idle
    /// ones beyond the slots, and return the mark for the request's lease to hold.
    pub(crate) fn record(&mut self, adapter: &str, slots: u32) -> AdapterMark {
        let entry = match self.sent.iter().position(|s| &*s.name == adapter) {
            Some(at) => self.sent.remove(at),
            None => Sent {
                name: adapter.into(),
                in_flight: Arc::new(AtomicU32::new(0)),
            },
        };
        entry.in_flight.fetch_add(1, Ordering::Relaxed);
        let mark = AdapterMark(Arc::clone(&entry.in_flight));
        self.sent.insert(0, entry);
        let limit = usize::try_from(slots)
            .unwrap_or(MAX_REMEMBERED)
            .clamp(1, MAX_REMEMBERED);
        // An in-flight adapter is kept past the slots (it is surely loaded or queued), but
        // never past the hard bound: its lease then lowers a counter no one reads.
        while self.sent.len() > limit {
            let idle = self.sent.iter().rposition(|s| !s.in_flight());
            match idle {
                Some(at) => drop(self.sent.remove(at)),
                None if self.sent.len() > MAX_REMEMBERED => drop(self.sent.pop()),
                None => break,
            }
        }
        mark
    }

    /// Whether nothing was sent here yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// The adapter names remembered, most recent first (tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn names(&self) -> Vec<&str> {
        self.sent.iter().map(|s| &*s.name).collect()
    }

    /// The adapter names with requests in flight, most recent first (tests).
    #[cfg(test)]
    pub(crate) fn in_flight_names(&self) -> Vec<&str> {
        self.sent
            .iter()
            .filter(|s| s.in_flight())
            .map(|s| &*s.name)
            .collect()
    }
}

/// `scraped` with its running list seen through `memory` (see the module doc), or `None`
/// when it has no LoRA state or the memory adds nothing to it.
pub(crate) fn augmented(
    scraped: &EndpointMetrics,
    memory: &AdapterMemory,
) -> Option<EndpointMetrics> {
    let lora = scraped.lora.as_ref()?;
    if memory.is_empty() {
        return None;
    }
    let slots = usize::try_from(lora.max).unwrap_or(usize::MAX);
    let mut running = lora.running.clone();
    let known = |list: &[String], name: &str| list.iter().any(|r| r == name);
    for s in memory.sent.iter().filter(|s| s.in_flight()) {
        if !known(&running, &s.name) {
            running.push(s.name.to_string());
        }
    }
    for s in memory.sent.iter().filter(|s| !s.in_flight()) {
        if running.len() >= slots {
            break;
        }
        if !known(&running, &s.name) {
            running.push(s.name.to_string());
        }
    }
    if running.len() == lora.running.len() {
        return None;
    }
    Some(EndpointMetrics {
        lora: Some(LoraState {
            max: lora.max,
            running,
            waiting: lora.waiting.clone(),
        }),
        ..scraped.clone()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn scraped(max: u32, running: &[&str]) -> EndpointMetrics {
        EndpointMetrics {
            lora: Some(LoraState {
                max,
                running: running.iter().map(|s| (*s).to_owned()).collect(),
                waiting: Vec::new(),
            }),
            ..EndpointMetrics::default()
        }
    }

    fn running_of(m: Option<EndpointMetrics>) -> Vec<String> {
        m.and_then(|m| m.lora)
            .map(|l| l.running)
            .unwrap_or_default()
    }

    #[test]
    fn the_memory_keeps_the_most_recent_distinct_adapters_up_to_the_slots() {
        let mut memory = AdapterMemory::default();
        for a in ["a", "b", "a", "c", "d"] {
            drop(memory.record(a, 3));
        }
        assert_eq!(memory.names(), ["d", "c", "a"]);
    }

    #[test]
    fn an_in_flight_adapter_is_not_forgotten_for_the_slots_but_is_for_the_hard_bound() {
        let mut memory = AdapterMemory::default();
        let held = memory.record("a", 1);
        drop(memory.record("b", 1));
        assert_eq!(memory.names(), ["b", "a"]);
        drop(memory.record("c", 1));
        assert_eq!(memory.names(), ["c", "a"]);
        drop(held);
        drop(memory.record("d", 1));
        assert_eq!(memory.names(), ["d"]);
        let marks: Vec<AdapterMark> = (0..MAX_REMEMBERED + 10)
            .map(|i| memory.record(&format!("x{i}"), 500))
            .collect();
        assert_eq!(memory.names().len(), MAX_REMEMBERED);
        assert_eq!(memory.names().first(), Some(&"x73"));
        drop(marks);
    }

    #[test]
    fn the_view_adds_in_flight_then_recent_adapters_and_never_exceeds_the_slots() {
        let mut memory = AdapterMemory::default();
        for a in ["old", "mid", "new"] {
            drop(memory.record(a, 8));
        }
        let busy = memory.record("busy", 8);
        drop(memory.record("new", 8));
        // Slots 3, scraped one: scraped, then in flight, then the most recent idle.
        let view = running_of(augmented(&scraped(3, &["s"]), &memory));
        assert_eq!(view, ["s", "busy", "new"]);
        // A scraped adapter the memory also holds is listed once.
        let view = running_of(augmented(&scraped(4, &["mid"]), &memory));
        assert_eq!(view, ["mid", "busy", "new", "old"]);
        // In flight counts even when the scrape already fills the slots.
        let view = running_of(augmented(&scraped(1, &["s"]), &memory));
        assert_eq!(view, ["s", "busy"]);
        drop(busy);
        let view = running_of(augmented(&scraped(2, &[]), &memory));
        assert_eq!(view, ["new", "busy"]);
    }

    #[test]
    fn nothing_is_built_without_lora_state_or_when_the_memory_adds_nothing() {
        let mut memory = AdapterMemory::default();
        assert!(augmented(&scraped(2, &[]), &memory).is_none());
        drop(memory.record("a", 2));
        assert!(augmented(&EndpointMetrics::default(), &memory).is_none());
        assert!(augmented(&scraped(2, &["a"]), &memory).is_none());
        assert!(augmented(&scraped(0, &[]), &memory).is_none());
    }
}
