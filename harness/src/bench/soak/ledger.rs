//! Every soak request's outcome, and which failures the injected faults explain.
//!
//! A request fails when it gets a 5xx, no answer, a cut stream or a timeout. A replica
//! kill explains a failure only on that replica, and only for a request that was in flight
//! when the replica died or was sent while it was down (until shortly after it is back and
//! the scraper has seen it). Which replica a request reached comes from Envoy's trace
//! access log (`upstream_host`, written for every request that carries `infergate-trace`)
//! or from the replica's own response header. Client aborts and hostile requests explain
//! nothing: a gateway must answer a hostile request with a 4xx (or serve it), never fail.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use super::hostile::HostileKind;

/// After a killed replica is back, how long its failures are still put down to the kill:
/// the scraper's next rounds, and Envoy learning that pooled connections are gone.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// What a request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A turn of the multi-turn workload, read to its end.
    Turn,
    /// A turn whose client goes away after its first content chunks.
    AbortedTurn,
    /// A hostile request.
    Hostile(HostileKind),
}

impl Kind {
    /// Label for tables.
    pub fn name(self) -> String {
        match self {
            Kind::Turn => "turn".to_string(),
            Kind::AbortedTurn => "turn, client aborts".to_string(),
            Kind::Hostile(h) => format!("hostile {}", h.name()),
        }
    }
}

/// One request, as the client saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The value of its `infergate-trace` header.
    pub trace: u64,
    /// What it was.
    pub kind: Kind,
    /// When it was sent and when it ended, from the soak's start.
    pub start: Duration,
    /// See `start`.
    pub end: Duration,
    /// Status code; 0 when none arrived.
    pub status: u16,
    /// The client stopped reading on purpose.
    pub aborted: bool,
    /// Transport or stream error after (or instead of) the status.
    pub error: Option<String>,
    /// The replica that answered, when its response header came back.
    pub served_by: Option<SocketAddr>,
}

impl Outcome {
    /// A 5xx, no answer, a cut stream or a timeout (an on-purpose abort is none of these).
    pub fn failed(&self) -> bool {
        if self.aborted {
            return false;
        }
        self.status == 0 || self.status >= 500 || (self.status == 200 && self.error.is_some())
    }

    /// The status as tables show it.
    pub fn status_label(&self) -> String {
        match (self.status, &self.error, self.aborted) {
            (_, _, true) => "aborted by client".to_string(),
            (0, Some(e), _) if e.contains("timed out") => "timeout".to_string(),
            (0, _, _) => "no answer".to_string(),
            (200, Some(_), _) => "200, stream cut".to_string(),
            (s, _, _) => s.to_string(),
        }
    }
}

/// One replica kill: down from `killed` to `restarted`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KillWindow {
    /// The replica.
    pub replica: SocketAddr,
    /// When it was killed, from the soak's start.
    pub killed: Duration,
    /// When it listened again.
    pub restarted: Duration,
}

/// What Envoy's trace access log says about one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Traced {
    /// `%UPSTREAM_HOST%`.
    pub upstream: Option<SocketAddr>,
    /// `%RESPONSE_CODE_DETAILS%`.
    pub details: String,
}

/// Parses the trace access log (one JSON object per line; non-JSON lines are skipped):
/// trace id → what Envoy recorded. Only ids of the form `soak-<n>` are kept.
pub fn parse_trace_log(text: &str) -> HashMap<u64, Traced> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let id = v["trace"].as_str()?.strip_prefix("soak-")?.parse().ok()?;
            let upstream = v["upstream_host"].as_str().and_then(|h| h.parse().ok());
            let details = v["response_code_details"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            Some((id, Traced { upstream, details }))
        })
        .collect()
}

/// What injected fault, if any, a request met.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// None.
    None,
    /// Its replica was killed while it was in flight or before it was sent.
    ReplicaKill,
    /// Its own client went away on purpose.
    ClientAbort,
    /// It was hostile.
    Hostile,
}

impl Fault {
    /// Label for tables.
    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::ReplicaKill => "replica killed",
            Fault::ClientAbort => "client abort",
            Fault::Hostile => "hostile input",
        }
    }
}

/// The fault `o` met, given what Envoy traced and the kills.
pub fn fault_of(o: &Outcome, traced: Option<&Traced>, kills: &[KillWindow]) -> Fault {
    let upstream = traced.and_then(|t| t.upstream).or(o.served_by);
    let killed = upstream.is_some_and(|u| {
        kills
            .iter()
            .any(|k| k.replica == u && o.end >= k.killed && o.start <= k.restarted + KILL_GRACE)
    });
    match o.kind {
        _ if killed => Fault::ReplicaKill,
        Kind::Turn => Fault::None,
        Kind::AbortedTurn => Fault::ClientAbort,
        Kind::Hostile(_) => Fault::Hostile,
    }
}

/// Counts by (status, kind, fault), failures split into explained and unexplained.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    /// Requests by (status label, kind label, fault) → (count, an example of the details).
    pub rows: BTreeMap<(String, String, Fault), (u64, String)>,
    /// Failed requests a kill explains.
    pub explained: u64,
    /// Failed requests nothing explains.
    pub unexplained: u64,
    /// Every request.
    pub requests: u64,
    /// Requests that completed as their client meant (200 to the end, an on-purpose abort,
    /// or a 4xx for a hostile request).
    pub fine: u64,
}

impl Tally {
    /// Classifies every outcome.
    pub fn of(outcomes: &[Outcome], traces: &HashMap<u64, Traced>, kills: &[KillWindow]) -> Tally {
        let mut t = Tally::default();
        for o in outcomes {
            let traced = traces.get(&o.trace);
            let fault = fault_of(o, traced, kills);
            t.requests += 1;
            if o.failed() {
                if fault == Fault::ReplicaKill {
                    t.explained += 1;
                } else {
                    t.unexplained += 1;
                }
            } else if o.status == 200 || o.aborted || matches!(o.kind, Kind::Hostile(_)) {
                t.fine += 1;
            }
            let detail = match (traced, &o.error) {
                (Some(tr), _) if !tr.details.is_empty() && tr.details != "via_upstream" => {
                    tr.details.clone()
                }
                (_, Some(e)) => e.chars().take(120).collect(),
                _ => String::new(),
            };
            let row = t
                .rows
                .entry((o.status_label(), o.kind.name(), fault))
                .or_insert((0, String::new()));
            row.0 += 1;
            if row.1.is_empty() {
                row.1 = detail;
            }
        }
        t
    }

    /// The table of rows, one per line.
    pub fn render(&self) -> String {
        let mut out = format!(
            "  {:>8}  {:<18} {:<34} {:<15} example detail\n",
            "count", "status", "request kind", "injected fault"
        );
        for ((status, kind, fault), (n, detail)) in &self.rows {
            out.push_str(&format!(
                "  {n:>8}  {status:<18} {kind:<34} {:<15} {detail}\n",
                fault.name()
            ));
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn at(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn outcome(trace: u64, kind: Kind, span: (u64, u64), status: u16, err: bool) -> Outcome {
        Outcome {
            trace,
            kind,
            start: at(span.0),
            end: at(span.1),
            status,
            aborted: false,
            error: err.then(|| "cut".to_string()),
            served_by: None,
        }
    }

    #[test]
    fn only_the_killed_replica_in_its_window_explains_a_failure() {
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2000".parse().unwrap();
        let kills = [KillWindow {
            replica: a,
            killed: at(10),
            restarted: at(13),
        }];
        let log = [
            (1, a, "upstream_reset_after_response_started{remote_reset}"),
            (
                2,
                a,
                "upstream_reset_before_response_started{connection_failure}",
            ),
            (
                3,
                b,
                "upstream_reset_before_response_started{connection_failure}",
            ),
            (
                4,
                a,
                "upstream_reset_before_response_started{connection_failure}",
            ),
        ]
        .iter()
        .map(|(id, up, d)| {
            format!(
                r#"{{"trace":"soak-{id}","upstream_host":"{up}","response_code_details":"{d}"}}"#
            )
        })
        .chain(["not json".to_string()])
        .collect::<Vec<_>>()
        .join("\n");
        let traces = parse_trace_log(&log);
        assert_eq!(traces.len(), 4);
        let outcomes = [
            // In flight on `a` when it died: explained.
            outcome(1, Kind::Turn, (9, 11), 200, true),
            // Sent to `a` while it was down: explained.
            outcome(2, Kind::Turn, (12, 12), 503, false),
            // On `b`: not explained.
            outcome(3, Kind::Turn, (12, 12), 503, false),
            // On `a`, long after it came back: not explained.
            outcome(4, Kind::Turn, (30, 30), 503, false),
            // A hostile request answered 400: fine.
            outcome(
                5,
                Kind::Hostile(HostileKind::TruncatedJson),
                (12, 12),
                400,
                false,
            ),
            // A hostile request answered 500 with no trace: a gateway failure.
            outcome(
                6,
                Kind::Hostile(HostileKind::HighByteHeader),
                (12, 12),
                500,
                false,
            ),
            // An abort on purpose is no failure.
            Outcome {
                aborted: true,
                ..outcome(7, Kind::AbortedTurn, (1, 2), 200, false)
            },
            outcome(8, Kind::Turn, (1, 2), 200, false),
        ];
        let t = Tally::of(&outcomes, &traces, &kills);
        assert_eq!(t.requests, 8);
        assert_eq!(t.explained, 2);
        assert_eq!(t.unexplained, 3);
        assert_eq!(t.fine, 3);
        let table = t.render();
        assert!(table.contains("200, stream cut"), "{table}");
        assert!(table.contains("replica killed"), "{table}");
        assert!(table.contains("hostile header-0x80-0xff"), "{table}");
        assert!(table.contains("aborted by client"), "{table}");
    }

    #[test]
    fn the_replica_header_stands_in_for_a_missing_trace() {
        let a: SocketAddr = "127.0.0.1:1000".parse().unwrap();
        let kills = [KillWindow {
            replica: a,
            killed: at(10),
            restarted: at(13),
        }];
        let o = Outcome {
            served_by: Some(a),
            ..outcome(1, Kind::AbortedTurn, (9, 11), 200, true)
        };
        assert_eq!(fault_of(&o, None, &kills), Fault::ReplicaKill);
        let late = Outcome {
            start: at(16),
            end: at(16),
            ..o.clone()
        };
        assert_eq!(fault_of(&late, None, &kills), Fault::ClientAbort);
    }
}
