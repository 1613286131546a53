//! The gateway filters' own work per request, timed in this process on the benchmark's
//! bodies: what the body router does (parse the body) and what the picker does before it
//! takes its lock (parse again, then hash the prompt into prefix blocks). Native code, one
//! thread; the Wasm flavour runs the same code compiled to `wasm32` under V8. Set against
//! the Envoy CPU per request of `bench overhead`, it tells how much of a flavour's added
//! cost is the filter logic and how much is Envoy's buffering and host calls around it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use infergate_filters::flow::{Admission, FlowGate};
use scheduler_core::flow::{Arrival, FlowControlConfig};
use scheduler_core::prefix::{block_hashes, seed, PrefixConfig};
use scheduler_core::request::{parse, Api};
use scheduler_core::scheduling::config::EndpointPickerConfig;

/// Microseconds per call of each step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LogicCost {
    /// `request::parse` of one body.
    pub parse_us: f64,
    /// `request::parse` + prefix block hashes (default 64-token blocks).
    pub parse_and_hash_us: f64,
    /// Prefix block hashes alone.
    pub hash_us: f64,
    /// A flow gate's admission of a request into a pool that is not saturated, and the
    /// ticket given back with the dispatch check at its end (flow control's whole work
    /// per request when nothing waits).
    pub admit_us: f64,
}

/// Times each step over `bodies` for about `budget` each.
pub fn measure(bodies: &[Bytes], budget: Duration) -> LogicCost {
    let cfg = PrefixConfig::default();
    let parse_us = time_per_call(bodies, budget, |b| {
        parse(Api::ChatCompletions, b)
            .map(|p| p.prompt.len())
            .unwrap_or(0)
    });
    let parse_and_hash_us =
        time_per_call(bodies, budget, |b| match parse(Api::ChatCompletions, b) {
            Ok(p) => block_hashes(seed(&p.model, p.cache_salt.as_deref()), &p.prompt, &cfg).len(),
            Err(_) => 0,
        });
    let prompts: Vec<Bytes> = bodies
        .iter()
        .filter_map(|b| parse(Api::ChatCompletions, b).ok())
        .map(|p| Bytes::from(p.prompt))
        .collect();
    let hash_us = time_per_call(&prompts, budget, |p| block_hashes(7, p, &cfg).len());
    LogicCost {
        parse_us,
        parse_and_hash_us,
        hash_us,
        admit_us: admit_us(budget),
    }
}

/// µs per admission through a gate of the flow arms' configuration (never saturated).
fn admit_us(budget: Duration) -> f64 {
    let epp = super::overhead::never_saturated_flow_config();
    let config = EndpointPickerConfig::from_value(epp)
        .ok()
        .and_then(|epp| FlowControlConfig::compile(&epp).ok().flatten());
    let Some(config) = config else {
        return 0.0;
    };
    let gate: FlowGate<()> = FlowGate::new(config);
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < budget {
        for i in 0..1024u64 {
            let arrival = Arrival {
                priority: 0,
                flow: "tenant-a".to_owned(),
                bytes: 32_768,
                service: 8_000 + 2 * 256,
                ttl_ms: None,
                now_ms: i,
                item: (),
            };
            if let Admission::Admitted(ticket) = gate.admit(arrival, 8_256, || ()) {
                drop(ticket);
            }
            std::hint::black_box(gate.dispatch(i));
            calls += 1;
        }
    }
    start.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64
}

/// Runs `f` over `inputs` round-robin until `budget` has passed; µs per call.
fn time_per_call(inputs: &[Bytes], budget: Duration, f: impl Fn(&[u8]) -> usize) -> f64 {
    if inputs.is_empty() {
        return 0.0;
    }
    let start = Instant::now();
    let mut calls = 0u64;
    let mut sink = 0usize;
    while start.elapsed() < budget {
        for b in inputs {
            sink = sink.wrapping_add(f(b));
            calls += 1;
        }
    }
    std::hint::black_box(sink);
    start.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::bench::overhead::bodies;

    #[test]
    fn every_step_takes_measurable_time() {
        let c = measure(&bodies(2, 2000), Duration::from_millis(20));
        assert!(c.parse_us > 0.0 && c.hash_us > 0.0);
        assert!(c.parse_and_hash_us >= c.parse_us * 0.5, "{c:?}");
        assert!(c.admit_us > 0.0, "the flow arms' config compiles: {c:?}");
    }
}
