//! The Wasm flavour's one picker state per Envoy process: the owner in the VM the others
//! elected (`crate::elected`) and each worker's link to it, over proxy-wasm shared queues.
//!
//! Envoy runs one VM per worker thread, so a picker state kept in the VM would see only its
//! worker's share of the traffic. The elected VM therefore registers the instance's owner
//! queue (`config::Names::owner_queue`) and runs a `filters::picker::remote::Owner`: every
//! worker's picker prepares a request (parse, hash) in its own VM, sends it there, pauses,
//! and resumes when the answer arrives on its own queue (module doc of
//! `filters::picker::remote` for the messages).
//!
//! - **Queues.** The owner's queue is named in the `vm_id` the VMs share (Envoy scopes queue
//!   names by `vm_id`, as it scopes shared data; the name starts with the instance, so other
//!   plugins of that `vm_id` do not meet it). Each picker root registers a reply queue under
//!   a random name at configuration; Envoy calls its `proxy_on_queue_ready` on the worker's
//!   own thread, so a paused stream is resumed by the worker that owns it, with the stream
//!   made the effective context first.
//! - **The owner's own VM.** When the link's root holds the lease (with one worker, its VM
//!   claims it from the main thread's: `crate::elected`), every message the link sends
//!   is handled by the owner at once, with no queue and no bytes, and a pick's answer is in
//!   before `submit` returns: the stream goes on without pausing, and its waker is dropped
//!   unused. Answers for other workers still go by queue.
//! - **A new owner.** Each tick tells the link who holds the owner's lease
//!   ([`WorkerLink::observe_owner`]). When the holder changes (the owner's VM died, was
//!   reloaded or resigned), the link resolves the queue again, says hello to the new owner
//!   and sends it again every pick still waiting, those queued by flow control at the old
//!   owner included: they are answered by the new owner, not left to time out.
//! - **When no owner can be reached** (none elected yet, a queue call fails, no answer within
//!   [`ANSWER_TIMEOUT_MS`], or it lost this worker's state twice), the request is picked in
//!   the VM's own state instead, logged and counted in `infergate.picker.owner_fallbacks`:
//!   the request is served, with affinity limited to what this worker has seen. A late
//!   answer for a request that no longer waits has its lease given back like any other.
//! - **Leases.** A request routed by the owner holds a [`RemoteLease`]; dropping it (the
//!   request's end, or the context's deletion) gives it back, so no path keeps one. The
//!   link sends the lease ids with its next pick (one message instead of two per request
//!   under load, and the owner sees them back before it picks), or with its next tick
//!   ([`TIMEOUT_TICK_MS`]) when no pick comes: an idle worker's ended requests leave the
//!   owner's in-flight counts within a quarter second. Each owner numbers its leases from its
//!   own epoch: ids of a previous owner's leases are unknown to the next and ignored, and
//!   its in-flight counts start from what it picked itself.
//! - **Liveness.** A link that picked through an owner sends an empty release at a tick
//!   when nothing else went to the owner for `HEARTBEAT_MS`, and the owner's tick ends the leases of a
//!   link silent for `HOLDER_TTL_MS` (`filters::picker::remote::liveness`): a worker VM that
//!   dies holding leases does not inflate the in-flight counts for good. A link that goes
//!   away (its root and last stream gone) sends the releases it still batches.

use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::rc::{Rc, Weak};
use std::sync::Arc;

use infergate_filters::flow::EvictSignal;
use infergate_filters::host::{Stats, Waker};
use infergate_filters::picker::remote::{
    Answers, Owner, Released, StateKey, ToOwner, ToWorker, HEARTBEAT_MS,
};
use infergate_filters::picker::timing::ResponseTiming;
use infergate_filters::picker::{PickerShared, PoolId, PreparedPick, ServedElsewhere};
use infergate_filters::stages::{PickerStore, RemoteAnswer, RemotePicks};
use infergate_filters::stats::StatKey;

use crate::abi::{hostcalls, LogLevel, Status};
use crate::config::Names;
use crate::host::{log, VmShared, WasmHost};

/// How long a paused request waits for the owner before it is picked locally.
pub const ANSWER_TIMEOUT_MS: u64 = 1_000;

/// How often a picker root checks for answers that did not come.
pub const TIMEOUT_TICK_MS: u32 = 250;

/// Counter of requests picked in the worker's own state because the owner was unreachable.
pub const OWNER_FALLBACKS: &str = "infergate.picker.owner_fallbacks";

/// Counter of picks a link sent again to a new owner after the previous one went away.
pub const OWNER_RESENDS: &str = "infergate.picker.owner_resends";

/// Counter of messages the owner took from a link in its own VM, with no queue (each pick
/// of a worker whose VM holds the lease is one).
pub const OWNER_LOCAL_MESSAGES: &str = "infergate.owner.local_messages";

/// The owner side, in the elected VM's picker root.
pub struct OwnerService {
    queue: u32,
    owner: Owner,
    /// Messages handled in this VM since the last tick (counted there, one stat call).
    local_messages: u64,
    local_stat: StatKey,
}

impl OwnerService {
    /// Register the owner's queue `name` (taking it over from a previous owner: the last
    /// registrant of a name receives its messages), numbering leases from `first_lease`;
    /// `None` (logged) if the host refuses.
    pub fn register(name: &str, first_lease: u64) -> Option<OwnerService> {
        match hostcalls::register_shared_queue(name) {
            Ok(queue) => Some(OwnerService {
                queue,
                owner: Owner::starting_at(first_lease),
                local_messages: 0,
                local_stat: StatKey::new(OWNER_LOCAL_MESSAGES, &[]),
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

    /// The owner's queue id.
    pub fn queue(&self) -> u32 {
        self.queue
    }

    /// Answer everything waiting on `queue` (if it is the owner's).
    pub fn on_queue_ready(&mut self, vm: &Rc<VmShared>, queue: u32) {
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
            let answers = self.owner.handle(&mut host, &message);
            send_answers(answers);
        }
    }

    /// Handle `message` of the link in this VM, whose reply queue is `local_reply`, without
    /// bytes: its answers are returned, those for other workers sent.
    pub fn handle_local(
        &mut self,
        vm: &Rc<VmShared>,
        message: ToOwner,
        local_reply: u32,
    ) -> Vec<ToWorker> {
        self.local_messages += 1;
        let mut host = WasmHost::new(vm);
        let (mine, others) = self
            .owner
            .handle_message(&mut host, message)
            .into_iter()
            .partition(|(queue, _)| *queue == local_reply);
        send_answers(others);
        mine.into_iter().map(|(_, answer)| answer).collect()
    }

    /// Expire silent holders' leases and dispatch the flow-control queues (the service's
    /// timer). The messages waiting are answered first: after a stall of this VM, the
    /// heartbeats queued meanwhile count before any holder is found silent.
    pub fn on_tick(&mut self, vm: &Rc<VmShared>) {
        self.on_queue_ready(vm, self.queue);
        let mut host = WasmHost::new(vm);
        if self.local_messages > 0 {
            host.counter_add(&self.local_stat, std::mem::take(&mut self.local_messages));
        }
        let answers = self.owner.tick(&mut host);
        send_answers(answers);
    }
}

fn send_answers(answers: Answers) {
    for (reply_queue, answer) in answers {
        if let Err(status) = hostcalls::enqueue_shared_queue(reply_queue, &answer.encode()) {
            // The worker is gone (its VM was replaced): its request went with it.
            log(
                LogLevel::Warn,
                &format!("infergate: picker state owner: answer undeliverable: {status:?}"),
            );
        }
    }
}

/// A pick sent to the owner, waiting for its answer.
struct Pending {
    sent_at_ms: u64,
    /// The pick, to resend after an `UnknownState` answer (once) or to a new owner.
    message: ToOwner,
    resent: bool,
    /// The owner answered [`ToWorker::Queued`]: the request waits in its pool's queue, for
    /// as long as flow control keeps it (its TTL), not [`ANSWER_TIMEOUT_MS`].
    queued: bool,
    waker: Option<Waker>,
}

/// What came back for a ticket, waiting for its stream to take it.
enum Arrived {
    Answer(ToWorker),
    /// No answer within [`ANSWER_TIMEOUT_MS`], or the owner lost the state twice.
    GaveUp(&'static str),
}

/// A worker VM's link to the owner, shared by its picker root and that root's streams.
pub struct WorkerLink {
    vm: Rc<VmShared>,
    /// The owner's queue name.
    owner_name: String,
    /// The owner's lease (holder, epoch) as last observed; `None` before the first tick.
    owner_seen: Option<(u64, u64)>,
    resends: StatKey,
    state: StateKey,
    config: Vec<u8>,
    reply_queue: u32,
    owner_queue: Option<u32>,
    /// The owner when it runs in this VM (this root's duty holds the lease): messages to it
    /// are handled at once, with no queue and no bytes.
    local_owner: Weak<RefCell<OwnerService>>,
    hello_sent: bool,
    pending: BTreeMap<u64, Pending>,
    arrived: BTreeMap<u64, Arrived>,
    /// The owner's leases this link's requests hold now ([`RemoteLease`]s alive).
    held: usize,
    /// Leases of requests that ended, to give back with the next pick or tick.
    releases: Vec<Released>,
    /// Leases whose responses started, to report the same way.
    started: Vec<u64>,
    /// The eviction signals of evictable leases ([`ToWorker::Picked`]'s `evictable`), from
    /// their answer's arrival until they are released.
    evictions: HashMap<u64, Arc<EvictSignal>>,
    /// When a message that names this link (a pick or a release) last went to the owner.
    last_sent_ms: u64,
    next_ticket: u64,
    fallbacks: StatKey,
    warned: bool,
}

/// Shared handle of a [`WorkerLink`].
pub type Link = Rc<RefCell<WorkerLink>>;

impl WorkerLink {
    /// A link for the picker configuration `config` (its JSON bytes): registers this VM's
    /// reply queue under a random name. `None` (logged) if the host refuses.
    pub fn new(vm: &Rc<VmShared>, names: &Names, config: Vec<u8>) -> Option<Link> {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(hostcalls::current_time_nanos().unwrap_or(0));
        let name = names.reply_queue(hasher.finish());
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
            vm: Rc::clone(vm),
            owner_name: names.owner_queue(),
            owner_seen: None,
            resends: StatKey::new(OWNER_RESENDS, &[]),
            state: StateKey::of_config(&config),
            config,
            reply_queue,
            owner_queue: None,
            local_owner: Weak::new(),
            hello_sent: false,
            pending: BTreeMap::new(),
            arrived: BTreeMap::new(),
            held: 0,
            releases: Vec::new(),
            started: Vec::new(),
            evictions: HashMap::new(),
            last_sent_ms: 0,
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
        match hostcalls::resolve_shared_queue(&vm_id, &self.owner_name) {
            Ok(Some(queue)) => {
                self.owner_queue = Some(queue);
                Ok(queue)
            }
            Ok(None) => Err(format!(
                "no picker state owner `{}` in vm_id `{vm_id}` yet (one is elected among the \
                 pickers carrying a `scraper`)",
                self.owner_name
            )),
            Err(status) => Err(format!("resolving the owner's queue failed: {status:?}")),
        }
    }

    fn send_bytes(&mut self, bytes: &[u8]) -> Result<(), String> {
        let queue = self.owner_queue()?;
        hostcalls::enqueue_shared_queue(queue, bytes).map_err(|status: Status| {
            // The owner's VM may have been replaced: resolve and say hello again next time.
            self.owner_queue = None;
            self.hello_sent = false;
            format!("enqueue to the owner failed: {status:?}")
        })
    }

    /// Send `message` to the owner: handled at once when the owner is this VM's (its
    /// answers for this link taken in before this returns), else encoded and queued.
    fn send(&mut self, message: ToOwner) -> Result<(), String> {
        if let Some(owner) = self.local_owner.upgrade() {
            // Busy only if the owner itself is calling out to this link, which it does not.
            if let Ok(mut owner) = owner.try_borrow_mut() {
                let answers = owner.handle_local(&self.vm, message, self.reply_queue);
                drop(owner);
                for answer in answers {
                    self.accept(answer);
                }
                return Ok(());
            }
        }
        let bytes = message
            .encode()
            .ok_or_else(|| "the message does not encode".to_owned())?;
        self.send_bytes(&bytes)
    }

    /// The owner runs in this VM now (`owner`, from this root's duty), or no longer
    /// (`Weak::new()`).
    pub fn set_local_owner(&mut self, owner: Weak<RefCell<OwnerService>>) {
        if !self.local_owner.ptr_eq(&owner) {
            self.local_owner = owner;
            // A hello is due to whichever owner comes next.
            self.hello_sent = false;
        }
    }

    fn send_hello(&mut self) -> Result<(), String> {
        if self.hello_sent {
            return Ok(());
        }
        self.send(ToOwner::Hello {
            state: self.state,
            config: self.config.clone(),
        })?;
        self.hello_sent = true;
        Ok(())
    }

    /// The owner's lease as this tick saw it: `holder` (0: none) and `epoch`. When it
    /// changed hands, the owner's queue is resolved again and every pick still waiting (queued
    /// by flow control at the old owner included) is sent to the new one after a hello; one
    /// that cannot be sent is picked locally at once.
    pub fn observe_owner(&mut self, holder: u64, epoch: u64, now_ms: u64) {
        let seen = Some((holder, epoch));
        if self.owner_seen == seen {
            return;
        }
        let first = self.owner_seen.is_none();
        self.owner_seen = seen;
        self.owner_queue = None;
        self.hello_sent = false;
        if first || holder == 0 {
            // Picks so far went to this owner; with none, they are resent when one appears.
            return;
        }
        let tickets: Vec<u64> = self.pending.keys().copied().collect();
        for ticket in tickets {
            let Some(mut pending) = self.pending.remove(&ticket) else {
                continue;
            };
            let message = pending.message.clone();
            pending.sent_at_ms = now_ms;
            pending.queued = false;
            pending.resent = false;
            // Filed before it goes: an owner in this VM answers at once.
            let waker = pending.waker.take();
            self.pending.insert(ticket, pending);
            match self.send_hello().and_then(|()| self.send(message)) {
                Ok(()) => {
                    WasmHost::new(&self.vm).counter_add(&self.resends, 1);
                    self.keep_waker(ticket, waker);
                }
                Err(_) => {
                    // Counted as a fallback when its stream takes the answer.
                    self.pending.remove(&ticket);
                    self.arrived.insert(
                        ticket,
                        Arrived::GaveUp("the picker state owner changed and cannot be reached"),
                    );
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                }
            }
        }
    }

    /// Hand `waker` to the pick of `ticket` if it still waits for its answer; wake it now
    /// if the answer came in meanwhile (an owner in this VM answered as it was sent).
    fn keep_waker(&mut self, ticket: u64, waker: Option<Waker>) {
        match self.pending.get_mut(&ticket) {
            Some(pending) => pending.waker = waker,
            None => {
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
        }
    }

    /// Count and (once per VM) log a request picked locally for `why`.
    fn fall_back(&mut self, why: &str) {
        WasmHost::new(&self.vm).counter_add(&self.fallbacks, 1);
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

    fn submit(
        &mut self,
        pool: PoolId,
        prepared: &PreparedPick,
        waker: Waker,
    ) -> Result<u64, String> {
        let ticket = self.next_ticket + 1;
        let pick = ToOwner::Pick {
            state: self.state,
            reply_queue: self.reply_queue,
            ticket,
            pool,
            prepared: prepared.clone(),
            releases: self.releases.clone(),
            started: self.started.clone(),
        };
        let now = hostcalls::current_time_nanos().unwrap_or(0) / 1_000_000;
        // Filed before it goes, without its waker: an owner in this VM answers as it is
        // sent, and the stream, still in this call, takes that answer without a wake-up.
        self.pending.insert(
            ticket,
            Pending {
                sent_at_ms: now,
                message: pick.clone(),
                resent: false,
                queued: false,
                waker: None,
            },
        );
        if let Err(why) = self.send_hello().and_then(|()| self.send(pick)) {
            self.pending.remove(&ticket);
            self.fall_back(&why);
            return Err(why);
        }
        self.releases.clear();
        self.started.clear();
        self.next_ticket = ticket;
        self.last_sent_ms = now;
        if let Some(pending) = self.pending.get_mut(&ticket) {
            pending.waker = Some(waker);
        }
        Ok(ticket)
    }

    /// Give a lease back to the owner: with the next pick, or at the next tick.
    fn release(&mut self, released: Released) {
        self.evictions.remove(&released.lease);
        self.releases.push(released);
    }

    /// Report that the response of `lease` started: with the next pick, or at the next tick.
    fn started(&mut self, lease: u64) {
        self.started.push(lease);
    }

    /// Send the leases waiting to go back, if any (best effort: a lost release is logged;
    /// the owner then counts that request in flight until this link falls silent).
    pub fn flush_releases(&mut self) {
        if !self.releases.is_empty() {
            self.send_release();
        }
    }

    /// The tick's message to the owner: the leases waiting to go back, or, when this link
    /// has picked through an owner and nothing went there for [`HEARTBEAT_MS`] at `now_ms`,
    /// an empty release that says this worker lives (its leases are kept). A link that never
    /// reached an owner holds no lease and stays quiet.
    pub fn on_tick(&mut self, now_ms: u64) {
        let silent = now_ms.saturating_sub(self.last_sent_ms) >= HEARTBEAT_MS;
        let waiting = !self.releases.is_empty() || !self.started.is_empty();
        if waiting || (silent && self.last_sent_ms > 0) {
            self.send_release();
        }
    }

    fn send_release(&mut self) {
        let leases = std::mem::take(&mut self.releases);
        let started = std::mem::take(&mut self.started);
        let heartbeat = leases.is_empty();
        let sent = self.send(ToOwner::Release {
            state: self.state,
            reply_queue: self.reply_queue,
            leases,
            started,
        });
        match sent {
            Ok(()) => {
                self.last_sent_ms = hostcalls::current_time_nanos().unwrap_or(0) / 1_000_000;
            }
            // No owner to tell (it went away, none is elected yet): tried again next tick.
            Err(_) if heartbeat => {}
            Err(why) => log(
                LogLevel::Warn,
                &format!("infergate: picker: giving leases back failed: {why}"),
            ),
        }
    }

    /// Whether none of this link's requests is at the owner: no pick waits for an answer
    /// and no request holds a lease (the moment this VM may claim the lease, `crate::elected`).
    pub fn idle(&self) -> bool {
        self.pending.is_empty() && self.arrived.is_empty() && self.held == 0
    }

    /// Whether `queue` is this link's reply queue.
    pub fn is_reply_queue(&self, queue: u32) -> bool {
        queue == self.reply_queue
    }

    /// Take every answer waiting on the reply queue: wake the stream each is for (resend
    /// once after an `UnknownState`), and release the lease of answers nobody waits for.
    pub fn receive(&mut self) {
        loop {
            let bytes = match hostcalls::dequeue_shared_queue(self.reply_queue) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => return,
                Err(status) => {
                    log(
                        LogLevel::Error,
                        &format!("infergate: picker: dequeue failed: {status:?}"),
                    );
                    return;
                }
            };
            let Some(answer) = ToWorker::decode(&bytes) else {
                log(
                    LogLevel::Error,
                    "infergate: picker: dropped a malformed answer",
                );
                continue;
            };
            self.accept(answer);
        }
    }

    /// Take in one answer: file it for its stream (waking the stream if it waits paused),
    /// resend once after an `UnknownState`, give back the lease of an answer nobody waits
    /// for.
    fn accept(&mut self, answer: ToWorker) {
        if let ToWorker::Evict { lease } = answer {
            // Its stream acts when woken; a lease released meanwhile is gone already.
            if let Some(signal) = self.evictions.remove(&lease) {
                signal.raise();
            }
            return;
        }
        if let ToWorker::Picked {
            lease,
            evictable: true,
            ..
        } = answer
        {
            // Kept from now: an eviction may follow before the stream takes the answer.
            self.evictions.insert(lease, EvictSignal::new());
        }
        let ticket = answer.ticket();
        let Some(mut pending) = self.pending.remove(&ticket) else {
            self.release_unclaimed(&answer);
            return;
        };
        if matches!(answer, ToWorker::Queued { .. }) {
            pending.queued = true;
            self.pending.insert(ticket, pending);
            return;
        }
        let mut waker = pending.waker.take();
        if matches!(answer, ToWorker::UnknownState { .. }) && !pending.resent {
            // The owner was reloaded: say hello again and resend, once.
            self.hello_sent = false;
            let message = pending.message.clone();
            pending.resent = true;
            self.pending.insert(ticket, pending);
            if self.send_hello().and_then(|()| self.send(message)).is_ok() {
                self.keep_waker(ticket, waker);
                return;
            }
            self.pending.remove(&ticket);
        }
        let arrived = match answer {
            ToWorker::UnknownState { .. } => {
                Arrived::GaveUp("the picker state owner lost this worker's state")
            }
            answer => Arrived::Answer(answer),
        };
        self.arrived.insert(ticket, arrived);
        if let Some(waker) = waker.take() {
            waker.wake();
        }
    }

    fn release_unclaimed(&mut self, answer: &ToWorker) {
        if let ToWorker::Picked {
            lease,
            release_at_once,
            ..
        } = answer
        {
            self.release(Released::lease(*lease));
            // Flow-control capacity queued requests likely wait for.
            if *release_at_once {
                self.flush_releases();
            }
        }
    }

    /// Give up on picks whose answer is overdue at `now_ms`: their streams are woken to pick
    /// locally.
    pub fn expire(&mut self, now_ms: u64) {
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.queued && now_ms.saturating_sub(p.sent_at_ms) >= ANSWER_TIMEOUT_MS)
            .map(|(ticket, _)| *ticket)
            .collect();
        for ticket in expired {
            if let Some(mut pending) = self.pending.remove(&ticket) {
                self.arrived.insert(
                    ticket,
                    Arrived::GaveUp("the picker state owner did not answer in time"),
                );
                if let Some(waker) = pending.waker.take() {
                    waker.wake();
                }
            }
        }
    }
}

impl Drop for WorkerLink {
    /// The link's root and its last stream are gone (a configuration update, the root's
    /// end): the releases still batched go now, since no tick will send them.
    fn drop(&mut self) {
        self.flush_releases();
    }
}

/// A lease the owner keeps for this worker's request; dropping it gives it back.
pub struct RemoteLease {
    lease: u64,
    link: Link,
    /// It holds flow-control capacity queued requests likely wait for: given back at once
    /// rather than batched.
    flow: bool,
    /// Its pool has flow control (the service its request received is worth sending).
    flow_controlled: bool,
    /// The service its request received, when the usage showed it (0: unknown).
    service: u64,
    /// The endpoint's latency as its request measured it.
    timing: ResponseTiming,
}

impl Drop for RemoteLease {
    fn drop(&mut self) {
        match self.link.try_borrow_mut() {
            Ok(mut link) => {
                link.held = link.held.saturating_sub(1);
                link.release(Released {
                    lease: self.lease,
                    service: self.service,
                    timing: self.timing,
                });
                // Queued requests wait for the capacity this lease holds: send it now.
                if self.flow {
                    link.flush_releases();
                }
            }
            Err(_) => log(
                LogLevel::Error,
                "infergate: picker: link busy when a lease ended; lease kept by the owner",
            ),
        }
    }
}

/// Where a Wasm picker's stage picks: the owner through the link, and the VM's own state
/// (plans always; the picks themselves when there is no link or the owner cannot answer).
pub struct WasmPickerStore {
    local: PickerShared,
    link: Option<Link>,
}

impl WasmPickerStore {
    /// Picks through `link` when there is one, else in `local`.
    pub fn new(local: PickerShared, link: Option<Link>) -> WasmPickerStore {
        WasmPickerStore { local, link }
    }
}

impl PickerStore for WasmPickerStore {
    type Access<'a> = &'a PickerShared;

    fn access(&self) -> Option<&PickerShared> {
        Some(&self.local)
    }

    fn remote(&self) -> Option<&dyn RemotePicks> {
        self.link.as_ref().map(|_| self as &dyn RemotePicks)
    }
}

impl RemotePicks for WasmPickerStore {
    fn submit(&self, pool: PoolId, prepared: &PreparedPick, waker: Waker) -> Result<u64, String> {
        let link = self.link.as_ref().ok_or_else(|| "no link".to_owned())?;
        let mut link = link
            .try_borrow_mut()
            .map_err(|_| "picker link busy".to_owned())?;
        link.submit(pool, prepared, waker)
    }

    fn take_answer(&self, ticket: u64) -> Option<RemoteAnswer> {
        let handle = self.link.as_ref()?;
        let mut link = handle.try_borrow_mut().ok()?;
        Some(match link.arrived.remove(&ticket)? {
            Arrived::Answer(ToWorker::Picked {
                lease,
                endpoint,
                fallbacks,
                prefiller,
                queued_ms,
                release_at_once,
                peer,
                ..
            }) => {
                // Counted until the lease drops.
                link.held += 1;
                RemoteAnswer::Picked {
                    peer,
                    eviction: link.evictions.get(&lease).cloned(),
                    endpoint,
                    fallbacks,
                    prefiller,
                    lease: Box::new(RemoteLease {
                        lease,
                        link: Rc::clone(handle),
                        flow: release_at_once,
                        flow_controlled: queued_ms.is_some(),
                        service: 0,
                        timing: ResponseTiming::default(),
                    }),
                    queued_ms,
                }
            }
            Arrived::Answer(ToWorker::Dropped {
                reason, queued_ms, ..
            }) => RemoteAnswer::Dropped { reason, queued_ms },
            // Never filed: a `Queued` answer keeps the request pending, an eviction goes to
            // its lease's signal.
            Arrived::Answer(ToWorker::Queued { .. } | ToWorker::Evict { .. }) => {
                RemoteAnswer::PickHere("an out-of-order queue answer".to_owned())
            }
            Arrived::Answer(ToWorker::Rejected { rejection, .. }) => {
                RemoteAnswer::Rejected(rejection)
            }
            Arrived::Answer(ToWorker::UnknownState { .. }) => {
                link.fall_back("the picker state owner lost this worker's state");
                RemoteAnswer::PickHere("unknown state".to_owned())
            }
            Arrived::GaveUp(why) => {
                link.fall_back(why);
                RemoteAnswer::PickHere(why.to_owned())
            }
        })
    }

    fn report_service(
        &self,
        lease: &mut dyn std::any::Any,
        service: &mut dyn FnMut() -> Option<u64>,
    ) {
        if let Some(lease) = lease.downcast_mut::<RemoteLease>() {
            if lease.flow_controlled {
                lease.service = service().unwrap_or(0);
            }
        }
    }

    fn report_started(&self, lease: &mut dyn std::any::Any) {
        let Some(lease) = lease.downcast_ref::<RemoteLease>() else {
            return;
        };
        if let Ok(mut link) = lease.link.try_borrow_mut() {
            link.started(lease.lease);
        }
    }

    fn report_timing(&self, lease: &mut dyn std::any::Any, timing: ResponseTiming) {
        if let Some(lease) = lease.downcast_mut::<RemoteLease>() {
            lease.timing = timing;
        }
    }

    fn report_served(&self, lease: &mut dyn std::any::Any, served: &ServedElsewhere) {
        let (Some(lease), Some(handle)) = (lease.downcast_mut::<RemoteLease>(), &self.link) else {
            return;
        };
        let Ok(mut link) = handle.try_borrow_mut() else {
            return;
        };
        let message = ToOwner::Served {
            state: link.state,
            lease: lease.lease,
            endpoint: served.endpoint.clone(),
            block_hashes: served.block_hashes.iter().map(|h| h.0).collect(),
            session: served.session.clone(),
        };
        if let Err(why) = link.send(message) {
            log(
                LogLevel::Warn,
                &format!("infergate: picker: reporting the served endpoint failed: {why}"),
            );
        }
    }

    fn forget(&self, ticket: u64) {
        let Some(mut link) = self.link.as_ref().and_then(|l| l.try_borrow_mut().ok()) else {
            return;
        };
        if link.pending.remove(&ticket).is_some() {
            // Take it out of its pool's queue, if the owner queued it (its `Queued` answer
            // may not be here yet; a cancel of what is not queued does nothing). A dispatch
            // already on its way is given back by `release_unclaimed`.
            let cancel = ToOwner::Cancel {
                state: link.state,
                reply_queue: link.reply_queue,
                ticket,
            };
            if let Err(why) = link.send(cancel) {
                log(
                    LogLevel::Warn,
                    &format!("infergate: picker: leaving the queue failed: {why}"),
                );
            }
        }
        if let Some(Arrived::Answer(answer)) = link.arrived.remove(&ticket) {
            link.release_unclaimed(&answer);
        }
    }
}
