//! How long a routed request's endpoint took: the time to its first response chunk (TTFT)
//! and the time per chunk after it, measured by the pick stage and handed to the in-flight
//! lease when the request ends, which feeds its endpoint's measured-latency estimate
//! ([`scheduler_core::latency`]).
//!
//! Two clock reads per request: at dispatch (the pick routes it) and at its first response
//! chunk; the end of the stream is read at the request's end. Every other chunk only
//! counts. TTFT is taken from streamed responses (`text/event-stream`) only: a
//! non-streamed response's first chunk comes with the whole answer.

use scheduler_core::types::Millis;

/// `content-type` of a streamed (SSE) response.
const EVENT_STREAM: &str = "text/event-stream";

/// One request's response clock, kept in the pick stage's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseTimer {
    dispatched: Millis,
    streamed: bool,
    first_chunk: Option<Millis>,
    chunks: u32,
}

impl ResponseTimer {
    /// The request was routed at `now`.
    pub fn dispatched(now: Millis) -> ResponseTimer {
        ResponseTimer {
            dispatched: now,
            streamed: false,
            first_chunk: None,
            chunks: 0,
        }
    }

    /// The response's `content-type` arrived.
    pub fn content_type(&mut self, content_type: Option<&str>) {
        self.streamed = content_type.is_some_and(|c| {
            c.get(..EVENT_STREAM.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(EVENT_STREAM))
        });
    }

    /// Whether the next chunk is the first, whose time [`ResponseTimer::chunk`] needs.
    pub fn wants_clock(&self) -> bool {
        self.streamed && self.first_chunk.is_none()
    }

    /// A response chunk passed; `now` is read only for the first (see
    /// [`ResponseTimer::wants_clock`]).
    pub fn chunk(&mut self, now: impl FnOnce() -> Millis) {
        if !self.streamed {
            return;
        }
        if self.first_chunk.is_none() {
            self.first_chunk = Some(now());
        }
        self.chunks = self.chunks.saturating_add(1);
    }

    /// What the response showed, its request ending at `now`; `completed`: the response
    /// reached its end (a stream cut short gives its TTFT but no time per chunk).
    pub fn timing(&self, now: Millis, completed: bool) -> ResponseTiming {
        let Some(first) = self.first_chunk else {
            return ResponseTiming::default();
        };
        let tpot_us = (completed && self.chunks >= 2)
            .then(|| now.since(first).saturating_mul(1_000) / u64::from(self.chunks - 1));
        ResponseTiming {
            ttft_us: Some(first.since(self.dispatched).saturating_mul(1_000)),
            tpot_us,
        }
    }
}

/// What one request measured of its endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseTiming {
    /// Dispatch to the first chunk of a streamed response, µs.
    pub ttft_us: Option<u64>,
    /// Mean time between the chunks after the first, µs.
    pub tpot_us: Option<u64>,
}

impl ResponseTiming {
    /// Whether there is anything to report.
    pub fn is_empty(&self) -> bool {
        self.ttft_us.is_none() && self.tpot_us.is_none()
    }

    /// TTFT in ms.
    pub fn ttft_ms(&self) -> Option<f64> {
        self.ttft_us.map(|us| us as f64 / 1_000.0)
    }

    /// Time per chunk in ms.
    pub fn tpot_ms(&self) -> Option<f64> {
        self.tpot_us.map(|us| us as f64 / 1_000.0)
    }

    /// The wire form: each value plus one, 0 for none.
    pub fn encode(&self) -> [u64; 2] {
        let wire = |v: Option<u64>| v.map_or(0, |us| us.saturating_add(1));
        [wire(self.ttft_us), wire(self.tpot_us)]
    }

    /// [`ResponseTiming::encode`]'s inverse.
    pub fn decode(wire: [u64; 2]) -> ResponseTiming {
        ResponseTiming {
            ttft_us: wire[0].checked_sub(1),
            tpot_us: wire[1].checked_sub(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_gives_ttft_and_time_per_chunk() {
        let mut t = ResponseTimer::dispatched(Millis(1_000));
        t.content_type(Some("text/event-stream; charset=utf-8"));
        assert!(t.wants_clock());
        t.chunk(|| Millis(1_040));
        assert!(!t.wants_clock());
        for _ in 0..10 {
            t.chunk(|| panic!("the clock is read for the first chunk only"));
        }
        let timing = t.timing(Millis(1_140), true);
        assert_eq!(timing.ttft_ms(), Some(40.0));
        assert_eq!(timing.tpot_us, Some(10_000));
        let cut = t.timing(Millis(1_140), false);
        assert_eq!((cut.ttft_us, cut.tpot_us), (Some(40_000), None));
    }

    #[test]
    fn a_plain_response_measures_nothing() {
        let mut t = ResponseTimer::dispatched(Millis(0));
        t.content_type(Some("application/json"));
        assert!(!t.wants_clock());
        t.chunk(|| Millis(5));
        assert!(t.timing(Millis(9), true).is_empty());
        let mut none = ResponseTimer::dispatched(Millis(0));
        none.content_type(None);
        none.chunk(|| Millis(5));
        assert!(none.timing(Millis(9), true).is_empty());
    }

    #[test]
    fn the_wire_form_round_trips_to_the_microsecond() {
        for timing in [
            ResponseTiming::default(),
            ResponseTiming {
                ttft_us: Some(0),
                tpot_us: Some(12_345),
            },
        ] {
            assert_eq!(ResponseTiming::decode(timing.encode()), timing);
        }
        assert_eq!(
            ResponseTiming::decode([u64::MAX, 0]).ttft_us,
            Some(u64::MAX - 1)
        );
    }
}
