//! The soak's clients: each runs multi-turn conversations back to back until the deadline
//! (a finished conversation is followed by a new one with new text, so the load stays
//! steady), and mixes in the faults it injects itself: some turns are abandoned after their
//! first content chunks, some requests are hostile (one kind after another).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::hostile::{self, HostileKind};
use super::ledger::{Kind, Outcome};
use crate::load::workload::Conversation;
use crate::load::{BaseUrl, ChatExtras, ConnPool, Workload};

/// The header that puts a request in Envoy's trace access log.
pub const TRACE_HEADER: &str = "infergate-trace";

/// How the clients behave.
#[derive(Clone, Debug)]
pub struct Mix {
    /// The conversations' shape (its `conversations` count is ignored: each client has one
    /// at a time).
    pub workload: Workload,
    /// Clients, each with one request in flight at a time.
    pub clients: u32,
    /// Share of turns abandoned mid-stream.
    pub abort_share: f64,
    /// Share of requests that are hostile.
    pub hostile_share: f64,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// What the clients share with whoever watches them.
#[derive(Debug, Default)]
pub struct Shared {
    /// Every finished request.
    pub outcomes: Mutex<Vec<Outcome>>,
    /// Finished requests (cheap to read while running).
    pub done: AtomicU64,
    /// Failed requests so far (5xx, no answer, cut, timeout).
    pub failed: AtomicU64,
    /// Failed requests so far by status and kind, as the client saw them (which fault
    /// explains them is only known from Envoy's trace log, at the end).
    pub failed_by: Mutex<BTreeMap<(String, String), u64>>,
    next_trace: AtomicU64,
}

/// Runs `mix.clients` clients against the gateway at `listener` until `deadline`; each
/// finishes the request it has in flight. Times are measured from `epoch`.
pub async fn run(
    mix: Arc<Mix>,
    listener: SocketAddr,
    epoch: Instant,
    deadline: Instant,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let base = BaseUrl::parse(&format!("http://{listener}"))?;
    let pool = ConnPool::default();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..mix.clients {
        let client = Client {
            id: c,
            mix: mix.clone(),
            base: base.clone(),
            listener,
            pool: pool.clone(),
            shared: shared.clone(),
            epoch,
            rng: SmallRng::seed_from_u64(mix.workload.seed ^ (u64::from(c) << 20) ^ 0x50a6),
            generation: 0,
            hostile_next: c as usize,
        };
        tasks.spawn(client.run(deadline));
    }
    while let Some(j) = tasks.join_next().await {
        j?;
    }
    Ok(())
}

struct Client {
    id: u32,
    mix: Arc<Mix>,
    base: BaseUrl,
    listener: SocketAddr,
    pool: ConnPool,
    shared: Arc<Shared>,
    epoch: Instant,
    rng: SmallRng,
    generation: u64,
    hostile_next: usize,
}

impl Client {
    async fn run(mut self, deadline: Instant) {
        let mut conv = self.new_conversation();
        while Instant::now() < deadline {
            if conv.turns_sent >= self.mix.workload.turns {
                conv = self.new_conversation();
            }
            let outcome = if self.rng.gen_bool(self.mix.hostile_share.clamp(0.0, 1.0)) {
                self.hostile().await
            } else {
                let abort = self.rng.gen_bool(self.mix.abort_share.clamp(0.0, 1.0));
                self.turn(&mut conv, abort).await
            };
            if outcome.failed() {
                self.shared.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut by) = self.shared.failed_by.lock() {
                    *by.entry((outcome.status_label(), outcome.kind.name()))
                        .or_insert(0) += 1;
                }
            }
            self.shared.done.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut all) = self.shared.outcomes.lock() {
                all.push(outcome);
            }
        }
    }

    /// A conversation of its own text: the salt names the client and how many it had.
    fn new_conversation(&mut self) -> Conversation {
        self.generation += 1;
        let salt = (u64::from(self.id) << 32) | self.generation;
        let one = Workload {
            conversations: 1,
            ..self.mix.workload.clone()
        };
        one.conversations(salt)
            .into_iter()
            .next()
            .unwrap_or(Conversation {
                index: 0,
                turns_sent: 0,
                messages: Vec::new(),
            })
    }

    fn trace(&self) -> u64 {
        self.shared.next_trace.fetch_add(1, Ordering::Relaxed)
    }

    async fn turn(&mut self, conv: &mut Conversation, abort: bool) -> Outcome {
        let salt = (u64::from(self.id) << 32) | self.generation;
        let body = Bytes::from(self.mix.workload.next_body(salt, conv));
        let trace = self.trace();
        let mut extras = ChatExtras {
            headers: Vec::new(),
            abort_after: abort.then_some(2),
        };
        if let Ok(v) = HeaderValue::from_str(&format!("soak-{trace}")) {
            extras
                .headers
                .push((HeaderName::from_static(TRACE_HEADER), v));
        }
        let start = self.epoch.elapsed();
        let rec = crate::load::client::chat_with(
            &self.pool,
            &self.base,
            body,
            None,
            self.mix.timeout,
            &extras,
        )
        .await;
        let end = self.epoch.elapsed();
        // What the user saw becomes the history, even when they stopped it early.
        if rec.ok() || rec.aborted {
            conv.push("assistant", &rec.content);
        }
        Outcome {
            trace,
            kind: if abort { Kind::AbortedTurn } else { Kind::Turn },
            start,
            end,
            status: rec.status,
            aborted: rec.aborted,
            error: rec.error.clone(),
            served_by: rec.served_by.as_deref().and_then(|s| s.parse().ok()),
        }
    }

    async fn hostile(&mut self) -> Outcome {
        let kind = HostileKind::ALL
            .get(self.hostile_next % HostileKind::ALL.len())
            .copied()
            .unwrap_or(HostileKind::TruncatedJson);
        self.hostile_next += 1;
        let trace = self.trace();
        let (mut headers, body) = kind.build(&self.mix.workload.model);
        headers.extend_from_slice(format!("{TRACE_HEADER}: soak-{trace}\r\n").as_bytes());
        let start = self.epoch.elapsed();
        let answer = hostile::exchange(
            self.listener,
            "/v1/chat/completions",
            &headers,
            &body,
            self.mix.timeout,
        )
        .await;
        Outcome {
            trace,
            kind: Kind::Hostile(kind),
            start,
            end: self.epoch.elapsed(),
            status: answer.status,
            aborted: false,
            error: answer.error,
            served_by: answer.replica.as_deref().and_then(|s| s.parse().ok()),
        }
    }
}
