//! One replica's ZMQ PUB socket and the task that feeds it.
//!
//! The engine task sends the cache changes of each batch of engine work (a step, or a
//! command) over an unbounded channel; this task takes every batch already queued (up to
//! [`MAX_EVENTS_PER_MESSAGE`] events) and sends them as one message. The fault controls of
//! [`KvEventsControl`] act here: a paused publisher leaves batches queued (they go out,
//! merged, on resume), and a message to drop still takes its sequence number, so a
//! subscriber sees the gap.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketSend, ZmqMessage};

use super::encode::{encode_batch, BatchShape};
use crate::engine::CacheEvent;

/// Most events in one message (the rest of a backlog follows in the next messages).
pub const MAX_EVENTS_PER_MESSAGE: usize = 1024;

/// Fault controls and counters of one replica's publisher, shared with its HTTP surface.
#[derive(Debug, Default)]
pub struct KvEventsControl {
    endpoint: String,
    topic: String,
    paused: AtomicBool,
    resumed: Notify,
    drop_next: AtomicU64,
    next_seq: AtomicU64,
    sent_messages: AtomicU64,
    dropped_messages: AtomicU64,
    stored_events: AtomicU64,
    stored_blocks: AtomicU64,
    removed_events: AtomicU64,
    removed_blocks: AtomicU64,
    cleared_events: AtomicU64,
}

/// A snapshot of a publisher's counters (the `GET /sim/kv_events` body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvEventsStats {
    /// `tcp://IP:PORT` the PUB socket is bound to.
    pub endpoint: String,
    /// The topic frame of every message.
    pub topic: String,
    /// Whether publishing is paused.
    pub paused: bool,
    /// Messages still to drop.
    pub drop_pending: u64,
    /// The sequence number the next message gets.
    pub next_seq: u64,
    /// Messages handed to the socket.
    pub sent_messages: u64,
    /// Messages dropped on purpose (their sequence numbers skipped).
    pub dropped_messages: u64,
    /// `BlockStored` events sent.
    pub stored_events: u64,
    /// Blocks in those.
    pub stored_blocks: u64,
    /// `BlockRemoved` events sent.
    pub removed_events: u64,
    /// Blocks in those.
    pub removed_blocks: u64,
    /// `AllBlocksCleared` events sent.
    pub cleared_events: u64,
}

impl KvEventsControl {
    /// Stops sending; batches wait in the queue.
    pub fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
    }

    /// Sends what waited, then keeps sending.
    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
        self.resumed.notify_one();
    }

    /// Drops the next `n` messages (their sequence numbers are used up all the same).
    pub fn drop_next(&self, n: u64) {
        self.drop_next.fetch_add(n, Ordering::SeqCst);
    }

    /// The PUB socket's endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The counters now.
    pub fn stats(&self) -> KvEventsStats {
        let get = |a: &AtomicU64| a.load(Ordering::SeqCst);
        KvEventsStats {
            endpoint: self.endpoint.clone(),
            topic: self.topic.clone(),
            paused: self.paused.load(Ordering::SeqCst),
            drop_pending: get(&self.drop_next),
            next_seq: get(&self.next_seq),
            sent_messages: get(&self.sent_messages),
            dropped_messages: get(&self.dropped_messages),
            stored_events: get(&self.stored_events),
            stored_blocks: get(&self.stored_blocks),
            removed_events: get(&self.removed_events),
            removed_blocks: get(&self.removed_blocks),
            cleared_events: get(&self.cleared_events),
        }
    }

    /// Takes one message off the drop budget, if any is left.
    fn take_drop(&self) -> bool {
        self.drop_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn count(&self, events: &[CacheEvent]) {
        for ev in events {
            match ev {
                CacheEvent::Stored { hashes, .. } => {
                    self.stored_events.fetch_add(1, Ordering::SeqCst);
                    self.stored_blocks
                        .fetch_add(hashes.len() as u64, Ordering::SeqCst);
                }
                CacheEvent::Removed { hashes } => {
                    self.removed_events.fetch_add(1, Ordering::SeqCst);
                    self.removed_blocks
                        .fetch_add(hashes.len() as u64, Ordering::SeqCst);
                }
                CacheEvent::Cleared => {
                    self.cleared_events.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }
}

/// Binds a PUB socket at `tcp://{ip}:{port}` and starts the task sending `rx`'s batches
/// under `topic` until either `stops` signal changes (pool shutdown, replica killed: the
/// socket closes) or the channel closes.
pub async fn spawn(
    ip: std::net::IpAddr,
    port: u16,
    topic: String,
    shape: BatchShape,
    rx: mpsc::UnboundedReceiver<Vec<CacheEvent>>,
    stops: [watch::Receiver<bool>; 2],
) -> anyhow::Result<(Arc<KvEventsControl>, JoinHandle<()>)> {
    let endpoint = format!("tcp://{ip}:{port}");
    let mut socket = zeromq::PubSocket::new();
    socket
        .bind(&endpoint)
        .await
        .map_err(|e| anyhow::anyhow!("KV events: cannot bind {endpoint}: {e}"))?;
    let control = Arc::new(KvEventsControl {
        endpoint,
        topic,
        ..KvEventsControl::default()
    });
    let task = tokio::spawn(run(socket, shape, rx, control.clone(), stops));
    Ok((control, task))
}

async fn run(
    mut socket: zeromq::PubSocket,
    shape: BatchShape,
    mut rx: mpsc::UnboundedReceiver<Vec<CacheEvent>>,
    control: Arc<KvEventsControl>,
    [mut shutdown, mut kill]: [watch::Receiver<bool>; 2],
) {
    let topic = Bytes::from(control.topic.clone().into_bytes());
    let mut backlog: Vec<CacheEvent> = Vec::new();
    loop {
        if control.paused.load(Ordering::SeqCst) {
            tokio::select! {
                () = control.resumed.notified() => continue,
                _ = shutdown.changed() => break,
                _ = kill.changed() => break,
            }
        }
        if backlog.is_empty() {
            let got = tokio::select! {
                b = rx.recv() => b,
                () = control.resumed.notified() => continue,
                _ = shutdown.changed() => break,
                _ = kill.changed() => break,
            };
            let Some(batch) = got else { break };
            backlog = batch;
        }
        while backlog.len() < MAX_EVENTS_PER_MESSAGE {
            match rx.try_recv() {
                Ok(more) => backlog.extend(more),
                Err(_) => break,
            }
        }
        if control.paused.load(Ordering::SeqCst) {
            // Paused while the batch was being taken: it waits with the rest.
            continue;
        }
        let rest = backlog.split_off(backlog.len().min(MAX_EVENTS_PER_MESSAGE));
        let events = std::mem::replace(&mut backlog, rest);
        if events.is_empty() {
            continue;
        }
        let seq = control.next_seq.fetch_add(1, Ordering::SeqCst);
        if control.take_drop() {
            control.dropped_messages.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        let Ok(payload) = encode_batch(&shape, unix_secs_f64(), &events) else {
            continue;
        };
        let frames = vec![
            topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            Bytes::from(payload),
        ];
        let Ok(msg) = ZmqMessage::try_from(frames) else {
            continue;
        };
        // PUB semantics: with no subscriber (or a full one) the message is simply lost.
        let _ = socket.send(msg).await;
        control.sent_messages.fetch_add(1, Ordering::SeqCst);
        control.count(&events);
    }
    let _ = socket.close().await;
}

fn unix_secs_f64() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
