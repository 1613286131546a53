//! One picker state per Envoy process when every worker runs its own VM (the Wasm flavour):
//! the state lives in one *owner*, and the workers' picker requests reach it by message.
//!
//! A Wasm worker cannot share memory with another, so a prefix index or an in-flight count
//! kept per VM sees only the traffic of its worker: at 4 workers the turns of one
//! conversation land on four different indexes. Instead, the singleton service VM on
//! Envoy's main thread (the one that scrapes) owns a [`PickerShared`] per picker
//! configuration, and the workers only prepare (parse, hash) and route:
//!
//! ```text
//! worker VM                                      owner (main-thread VM)
//!   body complete → PreparedPick                   
//!   Pick{ticket, reply queue} ──── shared queue ──▶ pick_counted (snapshot, index, lease)
//!   paused …                                        lease kept under a lease id
//!   on_answer ◀───────────────── worker's queue ─── Picked{ticket, lease, endpoint}
//!   resume; at the request's end the lease id is kept, and goes back with the
//!   worker's next Pick{releases}, or its next tick's Release{leases} ──▶ gauges lowered
//! ```
//!
//! This module is the host-agnostic half: the messages ([`ToOwner`], [`ToWorker`]) with
//! their binary encoding, and the [`Owner`] that answers them. The Wasm adapter moves the
//! bytes through proxy-wasm shared queues and resumes the paused stream. The pick itself is
//! [`super::pick_counted`], the same code the native flavour runs under its lock, so the
//! decisions and stats do not depend on the flavour.
//!
//! **Which state.** Each worker's picker config is sent once ([`ToOwner::Hello`]) and named
//! by the hash of its bytes ([`StateKey`]): every worker of one plugin sends the same
//! bytes, so they meet in one state; two listeners with different picker configs get two.
//! An owner that does not know the key of a pick (it was reloaded) answers
//! [`ToWorker::UnknownState`], and the worker says hello again and resends.
//!
//! **Trust.** Only VMs of the same `vm_id` can reach the owner's queue (Envoy scopes queue
//! names by `vm_id`); still, every message is decoded with bounds checks and anything
//! malformed is dropped, never a panic.

use std::collections::HashMap;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

use super::lease::InFlightLease;
use super::plan::PoolPlan;
use super::prepare::PreparedPick;
use super::state::{PickerShared, PoolId, Rejection};
use crate::codec::{put_string, put_u64s, Reader};
use crate::host::{SnapshotSource, Stats};

/// The owner's queue name (scoped by Envoy to the `vm_id` the owner and workers share).
pub const OWNER_QUEUE: &str = "infergate.picker.owner";

/// Names one picker configuration at the owner: the XXH3 hash of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateKey(pub u64);

impl StateKey {
    /// The key of the configuration `bytes` (what [`ToOwner::Hello`] carries).
    pub fn of_config(bytes: &[u8]) -> StateKey {
        StateKey(xxh3_64(bytes))
    }
}

/// A worker's message to the owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToOwner {
    /// The worker's picker configuration (JSON), so the owner has a state for its key.
    Hello {
        /// `StateKey::of_config(&config)`.
        state: StateKey,
        /// The picker configuration's JSON bytes.
        config: Vec<u8>,
    },
    /// Give `releases` back, then pick for one request and answer on `reply_queue` with
    /// `ticket`. The worker holds the leases of requests that ended since its last message
    /// and sends them here, so a busy worker's releases cost no message of their own and
    /// the pick sees them given back.
    Pick {
        /// The state to pick in.
        state: StateKey,
        /// The worker's queue id.
        reply_queue: u32,
        /// The worker's name for this request, echoed in the answer.
        ticket: u64,
        /// The pool, by its index in the configuration.
        pool: PoolId,
        /// The parsed and hashed request.
        prepared: PreparedPick,
        /// Lease ids of [`ToWorker::Picked`] whose requests ended.
        releases: Vec<u64>,
    },
    /// The requests holding `leases` ended: give their in-flight load back (a worker with
    /// no pick to send them with sends them on its next tick).
    Release {
        /// The state that issued the leases.
        state: StateKey,
        /// Lease ids of [`ToWorker::Picked`].
        leases: Vec<u64>,
    },
}

/// The owner's answer to one [`ToOwner::Pick`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToWorker {
    /// Picked `endpoint`; the request holds `lease` until it ends.
    Picked {
        /// The pick's ticket.
        ticket: u64,
        /// The id to release.
        lease: u64,
        /// `ip:port` of the endpoint.
        endpoint: String,
    },
    /// No endpoint: answer 503 for `rejection`.
    Rejected {
        /// The pick's ticket.
        ticket: u64,
        /// Why.
        rejection: Rejection,
    },
    /// The owner has no state for the pick's key (it was reloaded): say hello and resend.
    UnknownState {
        /// The pick's ticket.
        ticket: u64,
    },
}

const HELLO: u8 = 1;
const PICK: u8 = 2;
const RELEASE: u8 = 3;
const PICKED: u8 = 11;
const REJECTED: u8 = 12;
const UNKNOWN_STATE: u8 = 13;

impl ToOwner {
    /// The binary encoding: a tag byte, then the fields in order, integers little-endian.
    /// `None` only if a name in the prepared pick is longer than `u16::MAX` bytes.
    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        match self {
            ToOwner::Hello { state, config } => {
                out.push(HELLO);
                out.extend_from_slice(&state.0.to_le_bytes());
                out.extend_from_slice(config);
            }
            ToOwner::Pick {
                state,
                reply_queue,
                ticket,
                pool,
                prepared,
                releases,
            } => {
                out.reserve(64 + 8 * (prepared.block_hashes().len() + releases.len()));
                out.push(PICK);
                out.extend_from_slice(&state.0.to_le_bytes());
                out.extend_from_slice(&reply_queue.to_le_bytes());
                out.extend_from_slice(&ticket.to_le_bytes());
                out.extend_from_slice(&u32::try_from(pool.0).ok()?.to_le_bytes());
                put_u64s(&mut out, releases.iter().copied())?;
                prepared.encode_into(&mut out)?;
            }
            ToOwner::Release { state, leases } => {
                out.push(RELEASE);
                out.extend_from_slice(&state.0.to_le_bytes());
                put_u64s(&mut out, leases.iter().copied())?;
            }
        }
        Some(out)
    }

    /// Decode [`ToOwner::encode`]'s output; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<ToOwner> {
        let mut r = Reader(bytes);
        let tag = r.u8()?;
        let state = StateKey(r.u64()?);
        let message = match tag {
            HELLO => {
                let config = r.0.to_vec();
                r.0 = &[];
                ToOwner::Hello { state, config }
            }
            PICK => ToOwner::Pick {
                state,
                reply_queue: r.u32()?,
                ticket: r.u64()?,
                pool: PoolId(usize::try_from(r.u32()?).ok()?),
                releases: r.u64s()?,
                prepared: PreparedPick::decode_from(&mut r)?,
            },
            RELEASE => ToOwner::Release {
                state,
                leases: r.u64s()?,
            },
            _ => return None,
        };
        r.is_empty().then_some(message)
    }
}

impl ToWorker {
    /// The ticket of the pick this answers.
    pub fn ticket(&self) -> u64 {
        match self {
            ToWorker::Picked { ticket, .. }
            | ToWorker::Rejected { ticket, .. }
            | ToWorker::UnknownState { ticket } => *ticket,
        }
    }

    /// The binary encoding (as [`ToOwner::encode`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48);
        match self {
            ToWorker::Picked {
                ticket,
                lease,
                endpoint,
            } => {
                out.push(PICKED);
                out.extend_from_slice(&ticket.to_le_bytes());
                out.extend_from_slice(&lease.to_le_bytes());
                // An endpoint is an `ip:port` of the configuration, far below u16::MAX.
                let _ = put_string(&mut out, endpoint);
            }
            ToWorker::Rejected { ticket, rejection } => {
                out.push(REJECTED);
                out.extend_from_slice(&ticket.to_le_bytes());
                out.push(match rejection {
                    Rejection::NoEndpoints => 0,
                    Rejection::StaleMetrics => 1,
                    Rejection::Unscraped => 2,
                });
            }
            ToWorker::UnknownState { ticket } => {
                out.push(UNKNOWN_STATE);
                out.extend_from_slice(&ticket.to_le_bytes());
            }
        }
        out
    }

    /// Decode [`ToWorker::encode`]'s output; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<ToWorker> {
        let mut r = Reader(bytes);
        let tag = r.u8()?;
        let ticket = r.u64()?;
        let message = match tag {
            PICKED => ToWorker::Picked {
                ticket,
                lease: r.u64()?,
                endpoint: r.string()?,
            },
            REJECTED => ToWorker::Rejected {
                ticket,
                rejection: match r.u8()? {
                    0 => Rejection::NoEndpoints,
                    1 => Rejection::StaleMetrics,
                    2 => Rejection::Unscraped,
                    _ => return None,
                },
            },
            UNKNOWN_STATE => ToWorker::UnknownState { ticket },
            _ => return None,
        };
        r.is_empty().then_some(message)
    }
}

/// A lease the owner keeps for a worker's request, with the plan whose gauges it raised.
#[derive(Debug)]
struct Kept {
    lease: InFlightLease,
    plan: Arc<PoolPlan>,
}

/// The state of one picker configuration and the leases its workers hold.
#[derive(Debug)]
struct OwnedState {
    shared: PickerShared,
    leases: HashMap<u64, Kept>,
}

/// The owner of every worker's picker state (see the module doc).
#[derive(Debug, Default)]
pub struct Owner {
    states: HashMap<StateKey, OwnedState>,
    next_lease: u64,
}

impl Owner {
    /// An owner with no state yet.
    pub fn new() -> Owner {
        Owner::default()
    }

    /// How many leases the owner keeps for requests in flight (all states).
    pub fn leases(&self) -> usize {
        self.states.values().map(|s| s.leases.len()).sum()
    }

    /// Handle one message from a worker; the answer to send back, with the worker's queue.
    /// A malformed message, or one for a state or lease the owner does not know, is
    /// dropped (logged where an operator can act on it).
    pub fn handle<H: SnapshotSource + Stats + ?Sized>(
        &mut self,
        host: &mut H,
        message: &[u8],
    ) -> Option<(u32, ToWorker)> {
        let Some(message) = ToOwner::decode(message) else {
            host.log_error("infergate: picker state owner: dropped a malformed message");
            return None;
        };
        match message {
            ToOwner::Hello { state, config } => {
                self.hello(host, state, &config);
                None
            }
            ToOwner::Pick {
                state,
                reply_queue,
                ticket,
                pool,
                prepared,
                releases,
            } => {
                for lease in releases {
                    self.release(host, state, lease);
                }
                Some((reply_queue, self.pick(host, state, ticket, pool, &prepared)))
            }
            ToOwner::Release { state, leases } => {
                for lease in leases {
                    self.release(host, state, lease);
                }
                None
            }
        }
    }

    fn hello<H: Stats + ?Sized>(&mut self, host: &mut H, key: StateKey, config: &[u8]) {
        if self.states.contains_key(&key) || StateKey::of_config(config) != key {
            return;
        }
        let built = serde_json::from_slice(config)
            .map_err(|e| e.to_string())
            .and_then(|value| PickerShared::from_json(value).map_err(|e| e.to_string()));
        match built {
            Ok(shared) => {
                self.states.insert(
                    key,
                    OwnedState {
                        shared,
                        leases: HashMap::new(),
                    },
                );
            }
            // The worker built the same bytes, so only a version skew gets here.
            Err(e) => host.log_error(&format!(
                "infergate: picker state owner: a worker's picker config does not build: {e}"
            )),
        }
    }

    fn pick<H: SnapshotSource + Stats + ?Sized>(
        &mut self,
        host: &mut H,
        key: StateKey,
        ticket: u64,
        pool: PoolId,
        prepared: &PreparedPick,
    ) -> ToWorker {
        let Some(state) = self.states.get_mut(&key) else {
            return ToWorker::UnknownState { ticket };
        };
        let Some(plan) = state.shared.plans().get(pool).cloned() else {
            return ToWorker::Rejected {
                ticket,
                rejection: Rejection::NoEndpoints,
            };
        };
        match super::pick_counted(&mut state.shared, host, &plan, prepared) {
            Ok(picked) => {
                self.next_lease += 1;
                let lease = self.next_lease;
                state.leases.insert(
                    lease,
                    Kept {
                        lease: picked.lease,
                        plan,
                    },
                );
                ToWorker::Picked {
                    ticket,
                    lease,
                    endpoint: picked.endpoint,
                }
            }
            Err(rejection) => ToWorker::Rejected { ticket, rejection },
        }
    }

    fn release<H: Stats + ?Sized>(&mut self, host: &mut H, key: StateKey, lease: u64) {
        let Some(state) = self.states.get_mut(&key) else {
            return;
        };
        if let Some(Kept { lease, plan }) = state.leases.remove(&lease) {
            let endpoint = lease.endpoint_index();
            state.shared.release(lease);
            plan.count_in_flight(endpoint, -1, host);
        }
    }

    /// The in-flight load the owner's state `key` counts on `endpoint` of `pool` (tests and
    /// diagnostics).
    pub fn inflight(
        &self,
        key: StateKey,
        pool: PoolId,
        endpoint: &str,
    ) -> Option<scheduler_core::types::InFlight> {
        self.states.get(&key)?.shared.inflight(pool, endpoint)
    }
}

#[cfg(test)]
mod tests;
