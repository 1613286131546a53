//! The picker's use of flow control: a pool's [`FlowPlan`] (its gate, the objectives'
//! priorities, its stat keys), what waits in the gate ([`Waiter`]), and the request's
//! flow fields ([`FlowFields`]) read when it is prepared.
//!
//! A queued request waits either in process memory ([`Waiter::Local`]: a slot the
//! dispatcher fills and whose waker it fires) or as a message the Wasm flavour's state
//! owner answers when it dispatches ([`Waiter::Remote`]).
//!
//! Stats are written by the request itself, on its own worker, when it learns its fate:
//! `infergate.flow.queued` (gauge, pool × band × flow: +1 when queued, −1 when it leaves
//! the queue), `infergate.flow.dispatches` (pool × band × flow), `infergate.flow.rejections`
//! (pool × band × flow × reason) and `infergate.flow.queue_time_ms` (histogram, pool ×
//! band). A request admitted at once touches none of them.

use std::collections::HashMap;
use std::sync::Arc;

use scheduler_core::flow::{Arrival, Dispatched, FlowControlConfig};
use serde_json::Value;

use super::config::PickerConfigError;
use super::prepare::PreparedPick;
use crate::flow::{
    DropReason, FlowGate, FlowTicket, QueueSlot, Verdict, DEFAULT_FLOW, DEFAULT_OUTPUT_ESTIMATE,
};
use crate::host::Stats;
use crate::stats::StatKey;
use crate::tenants::Tenants;

/// Objective name → priority, from the configuration's `InferenceObjective` objects.
#[derive(Debug, Default)]
pub struct Priorities(HashMap<String, i32>);

impl Priorities {
    /// Compile `objectives` (only `InferenceObjective` objects belong there).
    pub fn from_objectives(objectives: &[Value]) -> Result<Priorities, PickerConfigError> {
        let field = |problem: String| PickerConfigError::Field {
            field: "objectives".into(),
            problem,
        };
        let compiled = Tenants::from_objects(objectives).map_err(|e| field(e.to_string()))?;
        if compiled.iter().next().is_some() {
            return Err(field(
                "holds a TenantQuota; only InferenceObjective objects belong here".into(),
            ));
        }
        Ok(Priorities(
            compiled
                .objectives()
                .iter()
                .map(|o| (o.name.clone(), o.priority))
                .collect(),
        ))
    }

    /// The priority of `objective`: 0 when absent or unknown.
    pub fn of(&self, objective: Option<&str>) -> i32 {
        objective
            .and_then(|name| self.0.get(name).copied())
            .unwrap_or(0)
    }
}

/// A queued request as the Wasm flavour's state owner keeps it: where to answer, and the
/// pick to make once it is dispatched.
#[derive(Debug)]
pub struct RemoteWaiter {
    /// The worker's reply queue.
    pub reply_queue: u32,
    /// The worker's ticket for the request.
    pub ticket: u64,
    /// The prepared pick.
    pub prepared: PreparedPick,
}

/// What waits in a pool's gate.
#[derive(Debug)]
pub enum Waiter {
    /// A request of this process's memory, woken through its slot.
    Local(Arc<QueueSlot>),
    /// A worker's request at the Wasm flavour's state owner.
    Remote(RemoteWaiter),
}

/// What became of remote waiters at a [`FlowPlan::run`]: the owner answers them.
#[derive(Debug)]
pub enum RemoteOutcome {
    /// Dispatched: pick for it now.
    Dispatched(RemoteWaiter, FlowTicket, u64),
    /// Its TTL passed.
    Expired(RemoteWaiter, u64),
}

/// The flow fields of a request, read when it is prepared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowFields {
    /// The priority of its objective (0: none or unknown).
    pub priority: i32,
    /// Its fairness id ([`DEFAULT_FLOW`] when it carries none).
    pub fairness_id: String,
    /// Its body size, counted against `maxBytes`.
    pub bytes: u64,
}

/// The service (prompt + 2 × completion tokens) the weighted policy charges `prepared` at
/// dispatch, and the tokens the token-mode detector counts (prompt + completion): the
/// output limit, or [`DEFAULT_OUTPUT_ESTIMATE`] without one, times the sequences the
/// engine may generate (`n`, `best_of`, the prompts of a batch), stands in for the
/// completion.
fn estimates(prepared: &PreparedPick) -> (u64, u64) {
    let req = prepared.request();
    let prompt = req.prompt_tokens.0;
    let output = req.output_estimate(DEFAULT_OUTPUT_ESTIMATE);
    (
        prompt.saturating_add(output.saturating_mul(2)),
        prompt.saturating_add(output),
    )
}

/// An admitted request's share of its pool's load, with what settling its service needs.
#[derive(Debug)]
pub struct Admitted {
    ticket: FlowTicket,
    band: i32,
    flow: String,
    estimate: u64,
}

impl Admitted {
    /// Give the share back now (the same as dropping it).
    pub fn release(self) {
        drop(self.ticket);
    }

    /// The band it was admitted in.
    pub fn band(&self) -> i32 {
        self.band
    }

    /// Its flow (fairness id).
    pub fn flow(&self) -> &str {
        &self.flow
    }

    /// Offer it for eviction, reached through `evictee` (see
    /// [`FlowTicket::make_evictable`]).
    pub fn make_evictable(&mut self, evictee: crate::flow::Evictee) -> bool {
        self.ticket.make_evictable(self.band, evictee)
    }
}

/// One pool's flow control (module doc).
#[derive(Debug)]
pub struct FlowPlan {
    pool: String,
    gate: Arc<FlowGate<Waiter>>,
    priorities: Arc<Priorities>,
}

impl FlowPlan {
    /// Flow control for `pool` under `config`, priorities from `priorities`.
    pub fn new(pool: &str, config: FlowControlConfig, priorities: Arc<Priorities>) -> FlowPlan {
        FlowPlan {
            pool: pool.to_owned(),
            gate: Arc::new(FlowGate::new(config)),
            priorities,
        }
    }

    /// The pool's gate.
    pub fn gate(&self) -> &FlowGate<Waiter> {
        &self.gate
    }

    /// A request's flow fields from its objective and fairness id headers.
    pub fn fields(
        &self,
        objective: Option<&str>,
        fairness_id: Option<String>,
        bytes: u64,
    ) -> FlowFields {
        FlowFields {
            priority: self.priorities.of(objective),
            fairness_id: fairness_id
                .filter(|f| !f.is_empty())
                .unwrap_or_else(|| DEFAULT_FLOW.to_owned()),
            bytes,
        }
    }

    /// The arrival of `prepared` at the gate, with the load its ticket counts in token
    /// mode.
    pub fn arrival(&self, prepared: &PreparedPick) -> (Arrival<()>, u64) {
        let f = prepared.flow();
        let (service, load_tokens) = estimates(prepared);
        let arrival = Arrival {
            priority: f.priority,
            flow: f.fairness_id.clone(),
            bytes: f.bytes,
            service,
            ttl_ms: None,
            now_ms: prepared.now.0,
            item: (),
        };
        (arrival, load_tokens)
    }

    /// `ticket`, admitted for `prepared`, kept with what its settlement needs.
    pub fn admitted(&self, ticket: FlowTicket, prepared: &PreparedPick) -> Admitted {
        Admitted {
            ticket,
            band: self.gate.band_for(prepared.flow().priority),
            flow: prepared.flow().fairness_id.clone(),
            estimate: estimates(prepared).0,
        }
    }

    /// Correct the weighted policy's counter of `admitted`'s flow by what its request
    /// really received (`service`: prompt + 2 × completion tokens; 0 when unknown, and the
    /// estimate charged at dispatch stands).
    pub fn settle(&self, admitted: &Admitted, service: u64) {
        if service == 0 {
            return;
        }
        let delta = i64::try_from(service)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(admitted.estimate).unwrap_or(i64::MAX));
        self.gate.charge(admitted.band, &admitted.flow, delta);
    }

    /// Expire and dispatch at `now_ms`: local waiters get their verdict (and are woken);
    /// remote ones are returned for the owner to answer.
    pub fn run(&self, now_ms: u64) -> Vec<RemoteOutcome> {
        let mut remote = Vec::new();
        for removed in self.gate.expire(now_ms) {
            match removed.item {
                Waiter::Local(slot) => slot.deliver(Verdict::Dropped {
                    reason: DropReason::TtlExpired,
                    queued_ms: removed.queued_ms,
                }),
                Waiter::Remote(w) => remote.push(RemoteOutcome::Expired(w, removed.queued_ms)),
            }
        }
        for (d, ticket) in self.gate.dispatch(now_ms) {
            let Dispatched {
                item, queued_ms, ..
            } = d;
            match item {
                Waiter::Local(slot) => slot.deliver(Verdict::Dispatched { ticket, queued_ms }),
                Waiter::Remote(w) => remote.push(RemoteOutcome::Dispatched(w, ticket, queued_ms)),
            }
        }
        remote
    }

    fn key(&self, name: &str, band: i32, flow: &str, extra: Option<(&str, &str)>) -> StatKey {
        let band = band.to_string();
        let mut labels = vec![("pool", self.pool.as_str()), ("band", band.as_str())];
        if !flow.is_empty() {
            labels.push(("flow", flow));
        }
        labels.extend(extra);
        StatKey::new(name, &labels)
    }

    /// A request of `fields` joined (`+1`) or left (`-1`) the queue.
    pub fn count_queued<S: Stats + ?Sized>(&self, stats: &mut S, fields: &FlowFields, delta: i64) {
        let band = self.gate.band_for(fields.priority);
        stats.gauge_add(&self.key(QUEUED, band, &fields.fairness_id, None), delta);
    }

    /// A queued request of `fields` was dispatched after `queued_ms`.
    pub fn count_dispatched<S: Stats + ?Sized>(
        &self,
        stats: &mut S,
        fields: &FlowFields,
        queued_ms: u64,
    ) {
        let band = self.gate.band_for(fields.priority);
        stats.counter_add(&self.key(DISPATCHES, band, &fields.fairness_id, None), 1);
        stats.histogram_record(&self.key(QUEUE_TIME, band, "", None), queued_ms);
    }

    /// An admitted request of `band` and `flow` was evicted (`responding`: its response had
    /// started, so it was reset rather than answered 429).
    pub fn count_evicted<S: Stats + ?Sized>(
        &self,
        stats: &mut S,
        band: i32,
        flow: &str,
        responding: bool,
    ) {
        let when = if responding {
            "responding"
        } else {
            "before_response"
        };
        stats.counter_add(&self.key(EVICTIONS, band, flow, Some(("when", when))), 1);
    }

    /// A request of `fields` was refused, or left the queue unserved, for `reason`.
    pub fn count_rejected<S: Stats + ?Sized>(
        &self,
        stats: &mut S,
        fields: &FlowFields,
        reason: DropReason,
    ) {
        let band = self.gate.band_for(fields.priority);
        let key = self.key(
            REJECTIONS,
            band,
            &fields.fairness_id,
            Some(("reason", reason.wire())),
        );
        stats.counter_add(&key, 1);
    }
}

/// Gauge: requests queued, pool × band × flow.
pub const QUEUED: &str = "infergate.flow.queued";
/// Counter: queued requests dispatched, pool × band × flow.
pub const DISPATCHES: &str = "infergate.flow.dispatches";
/// Counter: requests refused or dropped from the queue, pool × band × flow × reason.
pub const REJECTIONS: &str = "infergate.flow.rejections";
/// Counter: admitted requests evicted for a higher band, pool × band × flow × when
/// (`before_response`: answered 429; `responding`: reset).
pub const EVICTIONS: &str = "infergate.flow.evictions";
/// Histogram: time queued of dispatched requests (ms), pool × band.
pub const QUEUE_TIME: &str = "infergate.flow.queue_time_ms";
