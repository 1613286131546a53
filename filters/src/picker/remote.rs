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
//! `picker::pick_counted`, the same code the native flavour runs under its lock, so the
//! decisions and stats do not depend on the flavour.
//!
//! **Which state.** Each worker's picker config is sent once ([`ToOwner::Hello`]) and named
//! by the hash of its bytes ([`StateKey`]): every worker of one plugin sends the same
//! bytes, so they meet in one state; two listeners with different picker configs get two.
//! An owner that does not know the key of a pick (it was reloaded) answers
//! [`ToWorker::UnknownState`], and the worker says hello again and resends.
//!
//! **Liveness.** Each lease remembers its holder, the worker's reply queue. A worker VM
//! that dies (a trap, a configuration update that destroys its root) never gives its
//! leases back, so every worker is heard from at least every [`HEARTBEAT_MS`] (its picks
//! and releases, or an empty release), and the owner's tick expires the leases of a holder
//! silent for [`HOLDER_TTL_MS`] like releases ([`liveness`]).
//!
//! **Trust.** Only VMs of the same `vm_id` can reach the owner's queue (Envoy scopes queue
//! names by `vm_id`); still, every message is decoded with bounds checks and anything
//! malformed is dropped, never a panic.

use std::collections::HashMap;
use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_64;

pub mod liveness;

use liveness::Holders;
pub use liveness::{HEARTBEAT_MS, HOLDER_TTL_MS, LEASES_EXPIRED};

use super::admit::{Admitted, RemoteOutcome, RemoteWaiter, Waiter};
use super::lease::InFlightLease;
use super::plan::PoolPlan;
use super::prepare::PreparedPick;
use super::state::{PickerShared, PoolId, Rejection};
use super::timing::ResponseTiming;
use crate::codec::{put_string, put_u64s, Reader};
use crate::flow::{Admission, DropReason, Evictee, FlowTicket};
use crate::host::{Clock, SnapshotSource, Stats};
use scheduler_core::flow::QueueKey;
use scheduler_core::types::{BlockHash, Millis};

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

/// A lease given back: its id, the service its request received (prompt + 2 ×
/// completion tokens, as its usage showed; 0 when unknown), with which flow control's
/// weighted policy corrects the estimate it charged at dispatch, and what the request
/// measured of its endpoint's latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// The lease id of [`ToWorker::Picked`].
    pub lease: u64,
    /// The service received; 0: unknown (the estimate stands).
    pub service: u64,
    /// The endpoint's TTFT and time per chunk as the request saw them.
    pub timing: ResponseTiming,
}

impl Released {
    /// A lease whose request's service and timing are unknown.
    pub fn lease(lease: u64) -> Released {
        Released {
            lease,
            service: 0,
            timing: ResponseTiming::default(),
        }
    }
}

/// `u32` count ‖ count × (`u64` lease ‖ `u64` service ‖ 2 × `u64` timing).
fn put_released(out: &mut Vec<u8>, released: &[Released]) -> Option<()> {
    let flat: Vec<u64> = released
        .iter()
        .flat_map(|r| {
            let [ttft, tpot] = r.timing.encode();
            [r.lease, r.service, ttft, tpot]
        })
        .collect();
    put_u64s(out, flat.into_iter())
}

fn read_released(r: &mut Reader<'_>) -> Option<Vec<Released>> {
    let values = r.u64s()?;
    if values.len() % 4 != 0 {
        return None;
    }
    Some(
        values
            .chunks_exact(4)
            .map(|v| Released {
                lease: v[0],
                service: v[1],
                timing: ResponseTiming::decode([v[2], v[3]]),
            })
            .collect(),
    )
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
        releases: Vec<Released>,
        /// Lease ids of [`ToWorker::Picked`] whose responses started (their prefills are
        /// over), sent the same way.
        started: Vec<u64>,
    },
    /// The requests holding `leases` ended: give their in-flight load back (a worker with
    /// no pick to send them with sends them on its next tick, or at once when a lease
    /// holds flow-control capacity a queued request waits for). Sent with no lease, it is
    /// the worker's heartbeat ([`liveness`]).
    Release {
        /// The state that issued the leases.
        state: StateKey,
        /// The worker's queue id: the holder the owner hears from.
        reply_queue: u32,
        /// Lease ids of [`ToWorker::Picked`], with the service their requests received.
        leases: Vec<Released>,
        /// Lease ids of [`ToWorker::Picked`] whose responses started.
        started: Vec<u64>,
    },
    /// The request holding `lease` was served by `endpoint`, not where it was picked (a
    /// retry took a fallback): if it is a current member of the lease's pool, move the lease
    /// there and record the prompt's blocks and session for it.
    Served {
        /// The state that issued the lease.
        state: StateKey,
        /// The lease id of [`ToWorker::Picked`].
        lease: u64,
        /// `ip:port` of the serving endpoint (the owner finds its slot: only the owner
        /// knows the pool's current members and their slots).
        endpoint: String,
        /// The prompt's chained block hashes.
        block_hashes: Vec<u64>,
        /// The request's session id, if its pool reads one.
        session: Option<String>,
    },
    /// The request of `ticket`, answered [`ToWorker::Queued`], left before its dispatch:
    /// take it out of the queue.
    Cancel {
        /// The state that queued it.
        state: StateKey,
        /// The worker's queue id.
        reply_queue: u32,
        /// The worker's ticket.
        ticket: u64,
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
        /// The endpoints to try next, in order (Envoy's retry takes them).
        fallbacks: Vec<String>,
        /// The endpoint that prefills the prompt (`x-prefiller-host-port`), when the pool
        /// disaggregates this request.
        prefiller: Option<String>,
        /// How long the request waited in its pool's queue; `None`: its pool has no flow
        /// control.
        queued_ms: Option<u64>,
        /// Send the lease's release at once rather than with the worker's next message:
        /// the pool was saturated or had requests waiting when it was picked, so queued
        /// requests are likely to wait for the capacity it frees. (A lease of an idle pool
        /// goes back batched, as without flow control; should a queue form meanwhile, the
        /// releases reach the owner with the queued requests' own picks or the worker's
        /// tick, and the owner's tick dispatches.)
        release_at_once: bool,
        /// The request may be evicted: the owner may send [`ToWorker::Evict`] for its
        /// lease, and the worker keeps a signal for it.
        evictable: bool,
        /// The endpoint is a peer cluster's gateway ([`crate::picker::peers`]).
        peer: bool,
    },
    /// Evict the request holding `lease` (a request of a higher band waits for its
    /// capacity): a 429 before its response started, a reset after. Not an answer to a
    /// pick: the lease names the request.
    Evict {
        /// The lease id of [`ToWorker::Picked`].
        lease: u64,
    },
    /// The pool is saturated: the request waits in its queue, and the answer comes when
    /// it is dispatched or dropped (the worker waits past its usual answer timeout).
    Queued {
        /// The pick's ticket.
        ticket: u64,
    },
    /// Flow control dropped the request: answer 429 for `reason`.
    Dropped {
        /// The pick's ticket.
        ticket: u64,
        /// Why.
        reason: DropReason,
        /// How long it waited.
        queued_ms: u64,
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
const QUEUED: u8 = 14;
const DROPPED: u8 = 15;
const EVICT: u8 = 16;
const CANCEL: u8 = 4;
const SERVED: u8 = 5;

impl ToOwner {
    /// The reply queue of the worker that sent this, when the message names it (every
    /// message but a hello and a served-endpoint report).
    pub fn reply_queue(&self) -> Option<u32> {
        match self {
            ToOwner::Pick { reply_queue, .. }
            | ToOwner::Release { reply_queue, .. }
            | ToOwner::Cancel { reply_queue, .. } => Some(*reply_queue),
            ToOwner::Hello { .. } | ToOwner::Served { .. } => None,
        }
    }

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
                started,
            } => {
                out.reserve(
                    64 + 8 * (prepared.block_hashes().len() + 4 * releases.len() + started.len()),
                );
                out.push(PICK);
                out.extend_from_slice(&state.0.to_le_bytes());
                out.extend_from_slice(&reply_queue.to_le_bytes());
                out.extend_from_slice(&ticket.to_le_bytes());
                out.extend_from_slice(&u32::try_from(pool.0).ok()?.to_le_bytes());
                put_released(&mut out, releases)?;
                put_u64s(&mut out, started.iter().copied())?;
                prepared.encode_into(&mut out)?;
            }
            ToOwner::Release {
                state,
                reply_queue,
                leases,
                started,
            } => {
                out.push(RELEASE);
                out.extend_from_slice(&state.0.to_le_bytes());
                out.extend_from_slice(&reply_queue.to_le_bytes());
                put_released(&mut out, leases)?;
                put_u64s(&mut out, started.iter().copied())?;
            }
            ToOwner::Cancel {
                state,
                reply_queue,
                ticket,
            } => {
                out.push(CANCEL);
                out.extend_from_slice(&state.0.to_le_bytes());
                out.extend_from_slice(&reply_queue.to_le_bytes());
                out.extend_from_slice(&ticket.to_le_bytes());
            }
            // `u64` lease ‖ `u16` len ‖ endpoint ‖ `u8` flags (bit 0: session) ‖ `u16` len ‖
            // session ‖ `u32` count ‖ count × `u64` block hash.
            ToOwner::Served {
                state,
                lease,
                endpoint,
                block_hashes,
                session,
            } => {
                out.push(SERVED);
                out.extend_from_slice(&state.0.to_le_bytes());
                out.extend_from_slice(&lease.to_le_bytes());
                put_string(&mut out, endpoint)?;
                out.push(u8::from(session.is_some()));
                put_string(&mut out, session.as_deref().unwrap_or(""))?;
                put_u64s(&mut out, block_hashes.iter().copied())?;
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
                releases: read_released(&mut r)?,
                started: r.u64s()?,
                prepared: PreparedPick::decode_from(&mut r)?,
            },
            RELEASE => ToOwner::Release {
                state,
                reply_queue: r.u32()?,
                leases: read_released(&mut r)?,
                started: r.u64s()?,
            },
            CANCEL => ToOwner::Cancel {
                state,
                reply_queue: r.u32()?,
                ticket: r.u64()?,
            },
            SERVED => {
                let lease = r.u64()?;
                let endpoint = r.string()?;
                let flags = r.u8()?;
                let session = r.string()?;
                if flags > 1 || (flags == 0 && !session.is_empty()) {
                    return None;
                }
                ToOwner::Served {
                    state,
                    lease,
                    endpoint,
                    session: (flags == 1).then_some(session),
                    block_hashes: r.u64s()?,
                }
            }
            _ => return None,
        };
        r.is_empty().then_some(message)
    }
}

impl ToWorker {
    /// The ticket of the pick this answers; for [`ToWorker::Evict`], which answers no
    /// pick, its lease (the word after the tag either way).
    pub fn ticket(&self) -> u64 {
        match self {
            ToWorker::Picked { ticket, .. }
            | ToWorker::Rejected { ticket, .. }
            | ToWorker::UnknownState { ticket }
            | ToWorker::Queued { ticket }
            | ToWorker::Dropped { ticket, .. } => *ticket,
            ToWorker::Evict { lease } => *lease,
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
                fallbacks,
                prefiller,
                queued_ms,
                release_at_once,
                evictable,
                peer,
            } => {
                out.push(PICKED);
                out.extend_from_slice(&ticket.to_le_bytes());
                out.extend_from_slice(&lease.to_le_bytes());
                // An endpoint is an `ip:port` of the configuration, far below u16::MAX, and
                // a pool has far fewer than u16::MAX of them.
                let _ = put_string(&mut out, endpoint);
                let count = u16::try_from(fallbacks.len()).unwrap_or(u16::MAX);
                out.extend_from_slice(&count.to_le_bytes());
                for fallback in fallbacks.iter().take(usize::from(count)) {
                    let _ = put_string(&mut out, fallback);
                }
                // Flags: bit 0 queue time, bit 1 release at once, bit 2 a prefiller follows,
                // bit 3 evictable, bit 4 a peer cluster's gateway.
                out.push(
                    u8::from(queued_ms.is_some())
                        | u8::from(*release_at_once) << 1
                        | u8::from(prefiller.is_some()) << 2
                        | u8::from(*evictable) << 3
                        | u8::from(*peer) << 4,
                );
                out.extend_from_slice(&queued_ms.unwrap_or(0).to_le_bytes());
                if let Some(prefiller) = prefiller {
                    let _ = put_string(&mut out, prefiller);
                }
            }
            ToWorker::Queued { ticket } => {
                out.push(QUEUED);
                out.extend_from_slice(&ticket.to_le_bytes());
            }
            ToWorker::Evict { lease } => {
                out.push(EVICT);
                out.extend_from_slice(&lease.to_le_bytes());
            }
            ToWorker::Dropped {
                ticket,
                reason,
                queued_ms,
            } => {
                out.push(DROPPED);
                out.extend_from_slice(&ticket.to_le_bytes());
                out.push(match reason {
                    DropReason::Saturated => 0,
                    DropReason::TtlExpired => 1,
                    DropReason::ContextCancelled => 2,
                    DropReason::Evicted => 3,
                });
                out.extend_from_slice(&queued_ms.to_le_bytes());
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
            PICKED => {
                let lease = r.u64()?;
                let endpoint = r.string()?;
                let count = u16::from_le_bytes(r.take(2)?.try_into().ok()?);
                let fallbacks = (0..count)
                    .map(|_| r.string())
                    .collect::<Option<Vec<String>>>()?;
                let flags = r.u8()?;
                let queued_ms = r.u64()?;
                if flags & !0b1_1111 != 0 || (flags & 1 == 0 && queued_ms != 0) {
                    return None;
                }
                let prefiller = if flags & 4 != 0 {
                    Some(r.string()?)
                } else {
                    None
                };
                ToWorker::Picked {
                    ticket,
                    lease,
                    endpoint,
                    fallbacks,
                    prefiller,
                    queued_ms: (flags & 1 != 0).then_some(queued_ms),
                    release_at_once: flags & 2 != 0,
                    evictable: flags & 8 != 0,
                    peer: flags & 16 != 0,
                }
            }
            QUEUED => ToWorker::Queued { ticket },
            EVICT => ToWorker::Evict { lease: ticket },
            DROPPED => ToWorker::Dropped {
                ticket,
                reason: match r.u8()? {
                    0 => DropReason::Saturated,
                    1 => DropReason::TtlExpired,
                    2 => DropReason::ContextCancelled,
                    3 => DropReason::Evicted,
                    _ => return None,
                },
                queued_ms: r.u64()?,
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

/// A lease the owner keeps for a worker's request, with the plan whose gauges it raised
/// and, with flow control, the request's share of its pool's load.
#[derive(Debug)]
struct Kept {
    /// The holder: the worker's reply queue.
    holder: u32,
    lease: InFlightLease,
    plan: Arc<PoolPlan>,
    ticket: Option<Admitted>,
}

/// A request waiting in a pool's flow gate, by the worker's `(reply queue, ticket)`.
#[derive(Debug)]
struct Waiting {
    pool: PoolId,
    key: QueueKey,
}

/// The state of one picker configuration and the leases its workers hold.
#[derive(Debug)]
struct OwnedState {
    shared: PickerShared,
    leases: HashMap<u64, Kept>,
    waiting: HashMap<(u32, u64), Waiting>,
}

/// Answers for workers: `(reply queue, message)`.
pub type Answers = Vec<(u32, ToWorker)>;

/// The owner of every worker's picker state (see the module doc).
#[derive(Debug, Default)]
pub struct Owner {
    states: HashMap<StateKey, OwnedState>,
    next_lease: u64,
    holders: Holders,
}

impl Owner {
    /// An owner with no state yet.
    pub fn new() -> Owner {
        Owner::default()
    }

    /// An owner whose lease ids follow `first_lease`: an elected owner starts from its
    /// epoch (shifted high), so a lease id an earlier owner issued, given back to this one
    /// after a failover, is unknown here and dropped rather than mistaken for one of its own.
    pub fn starting_at(first_lease: u64) -> Owner {
        Owner {
            states: HashMap::new(),
            next_lease: first_lease,
            holders: Holders::default(),
        }
    }

    /// How many leases the owner keeps for requests in flight (all states).
    pub fn leases(&self) -> usize {
        self.states.values().map(|s| s.leases.len()).sum()
    }

    /// Handle one message from a worker; the answers to send back, each with its worker's
    /// queue (a release may dispatch queued requests of other workers). A malformed
    /// message, or one for a state or lease the owner does not know, is dropped (logged
    /// where an operator can act on it).
    pub fn handle<H: SnapshotSource + Stats + Clock + ?Sized>(
        &mut self,
        host: &mut H,
        message: &[u8],
    ) -> Answers {
        let Some(message) = ToOwner::decode(message) else {
            host.log_error("infergate: picker state owner: dropped a malformed message");
            return Vec::new();
        };
        self.handle_message(host, message)
    }

    /// Handle one decoded message: what [`Owner::handle`] does after decoding, for a worker
    /// in the owner's own VM, whose messages need no bytes.
    pub fn handle_message<H: SnapshotSource + Stats + Clock + ?Sized>(
        &mut self,
        host: &mut H,
        message: ToOwner,
    ) -> Answers {
        let mut answers = Vec::new();
        if let Some(holder) = message.reply_queue() {
            self.holders.heard(holder, host.now().0);
        }
        match message {
            ToOwner::Hello { state, config } => self.hello(host, state, &config),
            ToOwner::Pick {
                state,
                reply_queue,
                ticket,
                pool,
                prepared,
                releases,
                started,
            } => {
                self.started(state, &started);
                self.release_all(host, state, &releases, &mut answers);
                let answer = self.pick(
                    host,
                    state,
                    (reply_queue, ticket),
                    pool,
                    prepared,
                    &mut answers,
                );
                answers.push((reply_queue, answer));
            }
            ToOwner::Release {
                state,
                leases,
                started,
                ..
            } => {
                self.started(state, &started);
                self.release_all(host, state, &leases, &mut answers);
            }
            ToOwner::Cancel {
                state,
                reply_queue,
                ticket,
            } => self.cancel(host, state, reply_queue, ticket),
            ToOwner::Served {
                state,
                lease,
                endpoint,
                block_hashes,
                session,
            } => self.served(
                host,
                state,
                lease,
                &endpoint,
                &block_hashes,
                session.as_deref(),
            ),
        }
        answers
    }

    /// Expire the leases of silent holders, expire and dispatch the queued requests of
    /// every state, and write the in-flight gauges as the owner counts them (the owner's
    /// timer). The absolute write makes the gauges read the truth again after an owner
    /// change: a dead owner's deltas stay in the process's gauges, and its leases died with
    /// it.
    pub fn tick<H: SnapshotSource + Stats + Clock + ?Sized>(&mut self, host: &mut H) -> Answers {
        let mut answers = Vec::new();
        self.expire_silent_holders(host, &mut answers);
        for state in self.states.values() {
            state.shared.publish_inflight_gauges(host);
        }
        let keys: Vec<StateKey> = self.states.keys().copied().collect();
        for key in keys {
            let plans = match self.states.get(&key) {
                Some(state) if state.shared.has_flow_control() => {
                    // A new snapshot may lift a utilization detector's saturation.
                    state.shared.refresh_snapshot(&*host);
                    state.shared.plans()
                }
                _ => continue,
            };
            for plan in plans.pools() {
                self.run_flow(host, key, plan, &mut answers);
            }
        }
        answers
    }

    fn release_all<H: SnapshotSource + Stats + Clock + ?Sized>(
        &mut self,
        host: &mut H,
        key: StateKey,
        leases: &[Released],
        answers: &mut Answers,
    ) {
        let mut freed: Vec<Arc<PoolPlan>> = Vec::new();
        for &released in leases {
            if let Some(plan) = self.release(host, key, released, host.now()) {
                if !freed.iter().any(|p| Arc::ptr_eq(p, &plan)) {
                    freed.push(plan);
                }
            }
        }
        for plan in &freed {
            self.run_flow(host, key, plan, answers);
        }
    }

    /// Expire and dispatch `plan`'s queue in state `key`: picks for the dispatched, 429s
    /// for the expired.
    fn run_flow<H: SnapshotSource + Stats + Clock + ?Sized>(
        &mut self,
        host: &mut H,
        key: StateKey,
        plan: &Arc<PoolPlan>,
        answers: &mut Answers,
    ) {
        let Some(flow) = plan.flow() else {
            return;
        };
        for outcome in flow.run(host.now().0) {
            match outcome {
                RemoteOutcome::Dispatched(w, ticket, queued_ms) => {
                    if let Some(state) = self.states.get_mut(&key) {
                        state.waiting.remove(&(w.reply_queue, w.ticket));
                    }
                    flow.count_queued(host, w.prepared.flow(), -1);
                    flow.count_dispatched(host, w.prepared.flow(), queued_ms);
                    let answer = self.pick_admitted(
                        host,
                        key,
                        (w.reply_queue, w.ticket),
                        plan,
                        &w.prepared,
                        Some(ticket),
                        Some(queued_ms),
                    );
                    answers.push((w.reply_queue, answer));
                }
                RemoteOutcome::Expired(w, queued_ms) => {
                    if let Some(state) = self.states.get_mut(&key) {
                        state.waiting.remove(&(w.reply_queue, w.ticket));
                    }
                    flow.count_queued(host, w.prepared.flow(), -1);
                    flow.count_rejected(host, w.prepared.flow(), DropReason::TtlExpired);
                    answers.push((
                        w.reply_queue,
                        ToWorker::Dropped {
                            ticket: w.ticket,
                            reason: DropReason::TtlExpired,
                            queued_ms,
                        },
                    ));
                }
            }
        }
    }

    fn cancel<H: Stats + Clock + ?Sized>(
        &mut self,
        host: &mut H,
        key: StateKey,
        reply_queue: u32,
        ticket: u64,
    ) {
        let Some(state) = self.states.get_mut(&key) else {
            return;
        };
        let Some(Waiting { pool, key: queued }) = state.waiting.remove(&(reply_queue, ticket))
        else {
            // Dispatched or expired meanwhile: its answer is on its way, and the worker
            // gives back a lease it no longer wants.
            return;
        };
        let Some(plan) = state.shared.plans().get(pool).cloned() else {
            return;
        };
        if let Some(flow) = plan.flow() {
            if let Some(removed) = flow.gate().cancel(queued, host.now().0) {
                if let Waiter::Remote(w) = &removed.item {
                    flow.count_queued(host, w.prepared.flow(), -1);
                    flow.count_rejected(host, w.prepared.flow(), DropReason::ContextCancelled);
                }
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
                        waiting: HashMap::new(),
                    },
                );
            }
            // The worker built the same bytes, so only a version skew gets here.
            Err(e) => host.log_error(&format!(
                "infergate: picker state owner: a worker's picker config does not build: {e}"
            )),
        }
    }

    /// Admit, queue or refuse the request through its pool's flow gate, then pick for it
    /// if admitted. A request queued with eviction on adds the evictions it makes to
    /// `evictions`, one message to each victim's holder.
    fn pick<H: SnapshotSource + Stats + ?Sized>(
        &mut self,
        host: &mut H,
        key: StateKey,
        (reply_queue, ticket): (u32, u64),
        pool: PoolId,
        prepared: PreparedPick,
        evictions: &mut Answers,
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
        let Some(flow) = plan.flow() else {
            return self.pick_admitted(
                host,
                key,
                (reply_queue, ticket),
                &plan,
                &prepared,
                None,
                None,
            );
        };
        let (arrival, tokens) = flow.arrival(&prepared);
        // The pick is copied into the queue only when it waits there.
        let waiter = || {
            Waiter::Remote(RemoteWaiter {
                reply_queue,
                ticket,
                prepared: prepared.clone(),
            })
        };
        match flow.gate().admit(arrival, tokens, waiter) {
            Admission::Admitted(flow_ticket) => self.pick_admitted(
                host,
                key,
                (reply_queue, ticket),
                &plan,
                &prepared,
                Some(flow_ticket),
                Some(0),
            ),
            Admission::Queued { key: queued, evict } => {
                for evictee in evict {
                    // The owner's gate only holds workers' requests.
                    if let Evictee::Remote { reply_queue, lease } = evictee {
                        evictions.push((reply_queue, ToWorker::Evict { lease }));
                    }
                }
                flow.count_queued(host, prepared.flow(), 1);
                state
                    .waiting
                    .insert((reply_queue, ticket), Waiting { pool, key: queued });
                ToWorker::Queued { ticket }
            }
            Admission::Refused => {
                flow.count_rejected(host, prepared.flow(), DropReason::Saturated);
                ToWorker::Dropped {
                    ticket,
                    reason: DropReason::Saturated,
                    queued_ms: 0,
                }
            }
        }
    }

    /// Pick for an admitted request (`(reply queue, ticket)`); its flow ticket (if any) is
    /// kept with its lease, held by that reply queue.
    #[allow(clippy::too_many_arguments)]
    fn pick_admitted<H: SnapshotSource + Stats + ?Sized>(
        &mut self,
        host: &mut H,
        key: StateKey,
        (holder, ticket): (u32, u64),
        plan: &Arc<PoolPlan>,
        prepared: &PreparedPick,
        flow_ticket: Option<FlowTicket>,
        queued_ms: Option<u64>,
    ) -> ToWorker {
        let Some(state) = self.states.get_mut(&key) else {
            return ToWorker::UnknownState { ticket };
        };
        match super::pick_counted(&mut state.shared, host, plan, prepared) {
            Ok(picked) => {
                self.next_lease = self.next_lease.wrapping_add(1);
                let lease = self.next_lease;
                let mut admitted = flow_ticket
                    .zip(plan.flow())
                    .map(|(t, flow)| flow.admitted(t, prepared));
                let evictable = match (&mut admitted, plan.flow()) {
                    (Some(admitted), Some(flow)) if flow.gate().evicts(admitted.band()) => admitted
                        .make_evictable(Evictee::Remote {
                            reply_queue: holder,
                            lease,
                        }),
                    _ => false,
                };
                state.leases.insert(
                    lease,
                    Kept {
                        holder,
                        lease: picked.lease,
                        plan: Arc::clone(plan),
                        ticket: admitted,
                    },
                );
                let release_at_once = plan
                    .flow()
                    .is_some_and(|f| f.gate().saturated() || f.gate().has_queued());
                ToWorker::Picked {
                    ticket,
                    lease,
                    endpoint: picked.endpoint,
                    fallbacks: picked.fallbacks,
                    prefiller: picked.prefiller,
                    queued_ms,
                    release_at_once,
                    evictable,
                    peer: picked.peer,
                }
            }
            // The flow ticket is dropped here: the capacity goes to the next in line.
            Err(rejection) => ToWorker::Rejected { ticket, rejection },
        }
    }

    /// Give `lease` back; the plan of a lease that held flow-control capacity, whose queue
    /// the caller then runs.
    fn release<H: Stats + ?Sized>(
        &mut self,
        host: &mut H,
        key: StateKey,
        released: Released,
        now: Millis,
    ) -> Option<Arc<PoolPlan>> {
        let state = self.states.get_mut(&key)?;
        let Kept {
            lease,
            plan,
            ticket,
            ..
        } = state.leases.remove(&released.lease)?;
        lease.observe(&released.timing, now, host);
        lease.end(host);
        let admitted = ticket?;
        if let Some(flow) = plan.flow() {
            flow.settle(&admitted, released.service);
        }
        admitted.release();
        Some(plan)
    }

    /// The responses of `leases` started: their requests leave their endpoints' prefills in
    /// progress. Unknown leases (released meanwhile) are ignored.
    fn started(&mut self, key: StateKey, leases: &[u64]) {
        let Some(state) = self.states.get_mut(&key) else {
            return;
        };
        for lease in leases {
            if let Some(kept) = state.leases.get_mut(lease) {
                kept.lease.response_started();
            }
        }
    }

    /// The request of `lease` was served by `endpoint`: if it is a current member of the
    /// lease's pool, move the lease (and its endpoint gauges) there, and record the
    /// prompt's blocks and session for it. An unknown lease (released meanwhile) or an
    /// endpoint that is no member is ignored.
    fn served<H: Stats + ?Sized>(
        &mut self,
        host: &mut H,
        key: StateKey,
        lease: u64,
        endpoint: &str,
        block_hashes: &[u64],
        session: Option<&str>,
    ) {
        let Some(state) = self.states.get_mut(&key) else {
            return;
        };
        let Some(kept) = state.leases.get_mut(&lease) else {
            return;
        };
        if !state
            .shared
            .move_lease(&kept.plan, &mut kept.lease, endpoint, host)
        {
            return;
        }
        let hashes: Vec<BlockHash> = block_hashes.iter().map(|&h| BlockHash(h)).collect();
        state
            .shared
            .record_served(&kept.plan, endpoint, &hashes, session);
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
#[cfg(test)]
mod tests_flow;
