//! The order in which completion requests reached the pool: one entry per request whose
//! headers a replica read, in arrival order across every replica of the pool.
//!
//! A gateway that holds requests back (admission, queueing) shows its dispatch order here:
//! with one request in flight at a time, the pool sees requests exactly in the order the
//! gateway released them. Each entry says who the request was for (the fairness id header
//! the gateway sets) and which request it was (`x-request-id`, which the gateway forwards).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::served::FAIRNESS_ID_HEADER;

/// Header naming a request; the gateway forwards the client's value.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// One request as it reached a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The replica that received it.
    pub replica: usize,
    /// `x-llm-d-inference-fairness-id`, or empty.
    pub fairness_id: String,
    /// `x-request-id`, or empty.
    pub request_id: String,
    /// When its headers were read.
    pub at: Instant,
}

/// The pool's arrival log, shared by every replica.
#[derive(Debug, Clone, Default)]
pub struct ArrivalLog {
    entries: Arc<Mutex<Vec<Arrival>>>,
}

impl ArrivalLog {
    /// Records a request replica `replica` received with `headers`.
    pub fn record(&self, replica: usize, headers: &hyper::HeaderMap) {
        let text = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        };
        let arrival = Arrival {
            replica,
            fairness_id: text(FAIRNESS_ID_HEADER),
            request_id: text(REQUEST_ID_HEADER),
            at: Instant::now(),
        };
        if let Ok(mut entries) = self.entries.lock() {
            entries.push(arrival);
        }
    }

    /// Every arrival so far, oldest first.
    pub fn snapshot(&self) -> Vec<Arrival> {
        match self.entries.lock() {
            Ok(e) => e.clone(),
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_keep_their_order_and_missing_headers_are_empty() {
        let log = ArrivalLog::default();
        let mut h = hyper::HeaderMap::new();
        h.insert(FAIRNESS_ID_HEADER, "tenant-a".parse().unwrap());
        h.insert(REQUEST_ID_HEADER, "r1".parse().unwrap());
        log.record(1, &h);
        log.clone().record(0, &hyper::HeaderMap::new());
        let got = log.snapshot();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (
                got[0].replica,
                got[0].fairness_id.as_str(),
                got[0].request_id.as_str()
            ),
            (1, "tenant-a", "r1")
        );
        assert_eq!((got[1].replica, got[1].request_id.as_str()), (0, ""));
        assert!(got[0].at <= got[1].at);
    }
}
