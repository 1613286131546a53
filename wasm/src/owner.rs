//! The Wasm flavour's one picker state per Envoy process: the owner in the singleton
//! service VM and each worker's link to it, over proxy-wasm shared queues.
//!
//! Envoy runs one VM per worker thread, so a picker state kept in the VM would see only its
//! worker's share of the traffic. The singleton service (role `scraper`, on the main thread)
//! therefore also registers [`OWNER_QUEUE`] and runs a `filters::picker::remote::Owner`:
//! every worker's picker prepares a request (parse, hash) in its own VM, sends it there,
//! pauses, and resumes when the answer arrives on its own queue (module doc of
//! `filters::picker::remote` for the messages).
//!
//! - **Queues.** The owner's queue is named [`OWNER_QUEUE`] in the `vm_id` the owner and the
//!   pickers share (Envoy scopes queue names by `vm_id`, as it scopes shared data). Each
//!   picker root registers a reply queue under a random name at configuration; Envoy calls
//!   its `proxy_on_queue_ready` on the worker's own thread, so a paused stream is resumed by
//!   the worker that owns it, with the stream made the effective context first.
//! - **When the owner cannot be reached** (no service with the same `vm_id`, a queue call
//!   fails, or no answer within [`ANSWER_TIMEOUT_MS`]), the request is picked in the VM's own
//!   state instead, logged and counted in `infergate.picker.owner_fallbacks`: the request is
//!   served, with affinity limited to what this worker has seen. A late answer for a
//!   request that no longer waits has its lease released at once.
//! - **Leases.** A request routed by the owner holds a [`RemoteLease`]; dropping it (the
//!   request's end, or the context's deletion) sends the release, so no path keeps one.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::rc::Rc;

use infergate_filters::host::Stats;
use infergate_filters::picker::remote::{Owner, StateKey, ToOwner, ToWorker, OWNER_QUEUE};
use infergate_filters::picker::{PoolId, PreparedPick};
use infergate_filters::stats::StatKey;

use crate::abi::{hostcalls, LogLevel, Status};
use crate::host::{log, VmShared, WasmHost};

/// How long a paused request waits for the owner before it is picked locally.
pub const ANSWER_TIMEOUT_MS: u64 = 1_000;

/// How often a picker root checks for answers that did not come.
pub const TIMEOUT_TICK_MS: u32 = 250;

/// Counter of requests picked in the worker's own state because the owner was unreachable.
pub const OWNER_FALLBACKS: &str = "infergate.picker.owner_fallbacks";

/// The owner side, in the singleton service's root.
pub struct OwnerService {
    queue: u32,
    owner: Owner,
}

impl OwnerService {
    /// Register [`OWNER_QUEUE`]; `None` (logged) if the host refuses.
    pub fn register() -> Option<OwnerService> {
        match hostcalls::register_shared_queue(OWNER_QUEUE) {
            Ok(queue) => Some(OwnerService {
                queue,
                owner: Owner::new(),
            }),
            Err(status) => {
                log(
                    LogLevel::Error,
                    &format!(
                        "infergate: could not register the picker state owner's queue \
                         ({status:?}): every picker keeps its own state per worker"
                    ),
                );
                None
            }
        }
    }

    /// Answer everything waiting on `queue` (if it is the owner's).
    pub fn on_queue_ready(&mut self, vm: &VmShared, queue: u32) {
        if queue != self.queue {
            return;
        }
        let mut host = WasmHost::new(vm);
        loop {
            let message = match hostcalls::dequeue_shared_queue(self.queue) {
                Ok(Some(message)) => message,
                Ok(None) => return,
                Err(status) => {
                    log(
                        LogLevel::Error,
                        &format!("infergate: picker state owner: dequeue failed: {status:?}"),
                    );
                    return;
                }
            };
            if let Some((reply_queue, answer)) = self.owner.handle(&mut host, &message) {
                if let Err(status) = hostcalls::enqueue_shared_queue(reply_queue, &answer.encode())
                {
                    // The worker is gone (its VM was replaced): its request went with it.
                    log(
                        LogLevel::Warn,
                        &format!("infergate: picker state owner: answer undeliverable: {status:?}"),
                    );
                }
            }
        }
    }
}

/// A pick sent to the owner, waiting for its answer.
#[derive(Clone, Copy, Debug)]
struct Pending {
    context_id: u32,
    sent_at_ms: u64,
    /// Whether the pick was already resent after an `UnknownState` answer.
    resent: bool,
}

/// A worker VM's link to the owner, shared by its picker root and that root's streams.
pub struct WorkerLink {
    state: StateKey,
    config: Vec<u8>,
    reply_queue: u32,
    owner_queue: Option<u32>,
    hello_sent: bool,
    pending: BTreeMap<u64, Pending>,
    next_ticket: u64,
    fallbacks: StatKey,
    warned: bool,
}

/// Shared handle of a [`WorkerLink`].
pub type Link = Rc<RefCell<WorkerLink>>;

/// What a waiting stream is told.
#[derive(Debug)]
pub enum OwnerEvent {
    /// The owner answered.
    Answer(ToWorker),
    /// No answer within [`ANSWER_TIMEOUT_MS`]: pick locally.
    TimedOut,
}

impl WorkerLink {
    /// A link for the picker configuration `config` (its JSON bytes): registers this VM's
    /// reply queue under a random name. `None` (logged) if the host refuses.
    pub fn new(config: Vec<u8>) -> Option<Link> {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(hostcalls::current_time_nanos().unwrap_or(0));
        let name = format!("infergate.picker.reply.{:016x}", hasher.finish());
        let reply_queue = match hostcalls::register_shared_queue(&name) {
            Ok(queue) => queue,
            Err(status) => {
                log(
                    LogLevel::Error,
                    &format!(
                        "infergate: picker could not register its reply queue ({status:?}): it \
                         keeps its own state in this worker"
                    ),
                );
                return None;
            }
        };
        Some(Rc::new(RefCell::new(WorkerLink {
            state: StateKey::of_config(&config),
            config,
            reply_queue,
            owner_queue: None,
            hello_sent: false,
            pending: BTreeMap::new(),
            next_ticket: 0,
            fallbacks: StatKey::new(OWNER_FALLBACKS, &[]),
            warned: false,
        })))
    }

    /// The owner's queue, resolved once it exists.
    fn owner_queue(&mut self) -> Result<u32, String> {
        if let Some(queue) = self.owner_queue {
            return Ok(queue);
        }
        let vm_id = hostcalls::get_property(&["plugin_vm_id"])
            .ok()
            .flatten()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        match hostcalls::resolve_shared_queue(&vm_id, OWNER_QUEUE) {
            Ok(Some(queue)) => {
                self.owner_queue = Some(queue);
                Ok(queue)
            }
            Ok(None) => Err(format!(
                "no picker state owner in vm_id `{vm_id}`: add the singleton service (role \
                 `scraper`) with the same vm_id"
            )),
            Err(status) => Err(format!("resolving the owner's queue failed: {status:?}")),
        }
    }

    fn send(&mut self, message: &ToOwner) -> Result<(), String> {
        let queue = self.owner_queue()?;
        let bytes = message
            .encode()
            .ok_or_else(|| "the pick does not encode".to_owned())?;
        hostcalls::enqueue_shared_queue(queue, &bytes).map_err(|status: Status| {
            // The owner's VM may have been replaced: resolve and say hello again next time.
            self.owner_queue = None;
            self.hello_sent = false;
            format!("enqueue to the owner failed: {status:?}")
        })
    }

    fn send_hello(&mut self) -> Result<(), String> {
        if self.hello_sent {
            return Ok(());
        }
        let hello = ToOwner::Hello {
            state: self.state,
            config: self.config.clone(),
        };
        self.send(&hello)?;
        self.hello_sent = true;
        Ok(())
    }

    /// Send `prepared` for `context_id` to the owner; its ticket, or why not (the caller
    /// then picks locally: [`WorkerLink::fall_back`]).
    pub fn submit(
        &mut self,
        context_id: u32,
        pool: PoolId,
        prepared: &PreparedPick,
        now_ms: u64,
    ) -> Result<u64, String> {
        self.send_hello()?;
        self.next_ticket += 1;
        let ticket = self.next_ticket;
        self.send(&ToOwner::Pick {
            state: self.state,
            reply_queue: self.reply_queue,
            ticket,
            pool,
            prepared: prepared.clone(),
        })?;
        self.pending.insert(
            ticket,
            Pending {
                context_id,
                sent_at_ms: now_ms,
                resent: false,
            },
        );
        Ok(ticket)
    }

    /// The owner did not know our state: say hello again and resend `ticket` once. `false`
    /// if it was already resent or sending failed (the caller picks locally).
    pub fn resend(&mut self, ticket: u64, pool: PoolId, prepared: &PreparedPick) -> bool {
        let Some(pending) = self.pending.get(&ticket).copied() else {
            return false;
        };
        if pending.resent {
            return false;
        }
        self.hello_sent = false;
        let sent = self.send_hello().and_then(|()| {
            self.send(&ToOwner::Pick {
                state: self.state,
                reply_queue: self.reply_queue,
                ticket,
                pool,
                prepared: prepared.clone(),
            })
        });
        if sent.is_err() {
            return false;
        }
        self.pending.insert(
            ticket,
            Pending {
                resent: true,
                ..pending
            },
        );
        true
    }

    /// Count and (once per VM) log a request picked locally for `why`.
    pub fn fall_back(&mut self, vm: &VmShared, why: &str) {
        WasmHost::new(vm).counter_add(&self.fallbacks, 1);
        if !self.warned {
            self.warned = true;
            log(
                LogLevel::Error,
                &format!(
                    "infergate: picker: {why}; picking in this worker's own state (affinity \
                     and load limited to its share of the traffic)"
                ),
            );
        }
    }

    /// Stop waiting for `ticket` (its stream ended).
    pub fn forget(&mut self, ticket: u64) {
        self.pending.remove(&ticket);
    }

    /// Give a lease back to the owner (best effort: a lost release is logged).
    pub fn release(&mut self, lease: u64) {
        let message = ToOwner::Release {
            state: self.state,
            lease,
        };
        if let Err(why) = self.send(&message) {
            log(
                LogLevel::Warn,
                &format!("infergate: picker: releasing lease {lease} failed: {why}"),
            );
        }
    }

    /// Whether `queue` is this link's reply queue.
    pub fn is_reply_queue(&self, queue: u32) -> bool {
        queue == self.reply_queue
    }

    /// Every answer waiting on the reply queue, with the stream it is for. Answers for
    /// tickets nobody waits for any more have their lease released here.
    pub fn take_answers(&mut self) -> Vec<(u32, u64, ToWorker)> {
        let mut out = Vec::new();
        loop {
            let bytes = match hostcalls::dequeue_shared_queue(self.reply_queue) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => break,
                Err(status) => {
                    log(
                        LogLevel::Error,
                        &format!("infergate: picker: dequeue failed: {status:?}"),
                    );
                    break;
                }
            };
            let Some(answer) = ToWorker::decode(&bytes) else {
                log(
                    LogLevel::Error,
                    "infergate: picker: dropped a malformed answer",
                );
                continue;
            };
            let ticket = answer.ticket();
            match self.pending.get(&ticket) {
                // An `UnknownState` answer keeps the ticket pending until it is resent.
                Some(p) if matches!(answer, ToWorker::UnknownState { .. }) => {
                    out.push((p.context_id, ticket, answer));
                }
                Some(_) => {
                    if let Some(p) = self.pending.remove(&ticket) {
                        out.push((p.context_id, ticket, answer));
                    }
                }
                None => self.release_unclaimed(&answer),
            }
        }
        out
    }

    /// Release the lease of an answer no stream took.
    pub fn release_unclaimed(&mut self, answer: &ToWorker) {
        if let ToWorker::Picked { lease, .. } = answer {
            self.release(*lease);
        }
    }

    /// Streams whose answer is overdue at `now_ms` (no longer pending).
    pub fn take_expired(&mut self, now_ms: u64) -> Vec<u32> {
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now_ms.saturating_sub(p.sent_at_ms) >= ANSWER_TIMEOUT_MS)
            .map(|(ticket, _)| *ticket)
            .collect();
        expired
            .into_iter()
            .filter_map(|t| self.pending.remove(&t).map(|p| p.context_id))
            .collect()
    }
}

/// A lease the owner keeps for this worker's request; dropping it gives it back.
pub struct RemoteLease {
    lease: u64,
    link: Link,
}

impl RemoteLease {
    /// Hold `lease` of `link`'s owner.
    pub fn new(lease: u64, link: Link) -> RemoteLease {
        RemoteLease { lease, link }
    }
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        match self.link.try_borrow_mut() {
            Ok(mut link) => link.release(self.lease),
            Err(_) => log(
                LogLevel::Error,
                "infergate: picker: link busy when a lease ended; lease kept by the owner",
            ),
        }
    }
}
