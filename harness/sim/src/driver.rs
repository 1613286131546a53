//! Drives one [`Engine`] in real time on tokio: a single task owns the engine, receives
//! commands over a channel, sleeps until the current step ends and forwards each request's
//! events to its own channel.
//!
//! Simulated time runs `time_scale` times faster than the wall clock from the driver's
//! start. Steps are chained in simulated time by the engine, so a late wake-up delivers
//! tokens late but never stretches the simulated timeline.
//!
//! With a KV event sink ([`EngineHandle::spawn_with_events`]) the task enables the engine's
//! cache change log and, after each batch of work (the steps completed at one wake-up, or
//! one command), sends what was logged as one batch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::engine::{
    BlockHash, CacheEvent, Engine, EngineConfig, EngineEvent, EngineRequest, EngineStats,
    RequestId, SimTime, Slowdown, SubmitError, Usage,
};

/// What a request's consumer receives.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// Token `index` was generated.
    Token {
        /// Position in the completion.
        index: u32,
        /// Prompt tokens served from cache.
        cached_tokens: u32,
    },
    /// All tokens were generated.
    Finished(Usage),
}

enum Command {
    Submit {
        req: EngineRequest,
        content: Option<Arc<[u8]>>,
        events: mpsc::UnboundedSender<RequestEvent>,
        reply: oneshot::Sender<Result<RequestId, SubmitError>>,
    },
    Cancel(RequestId),
    Stats(oneshot::Sender<EngineStats>),
    /// KV blocks received from a prefill replica (see `Engine::import_prefix`).
    Import {
        hashes: Vec<BlockHash>,
        content: Option<Arc<[u8]>>,
        lora: Option<String>,
        reply: oneshot::Sender<usize>,
    },
    /// Forget every cached block (see `Engine::reset_prefix_cache`).
    ResetPrefixCache(oneshot::Sender<()>),
    /// Set the slowdown when given (see `Engine::set_slowdown`); answer the one in effect.
    Slowdown(Option<Slowdown>, oneshot::Sender<Slowdown>),
}

/// Maps simulated time to the wall clock.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    start: Instant,
    scale: f64,
}

impl SimClock {
    /// A clock starting now at simulated time 0, running `scale` times faster than real time.
    pub fn new(scale: f64) -> Self {
        Self {
            start: Instant::now(),
            scale: if scale.is_finite() && scale > 0.0 {
                scale
            } else {
                1.0
            },
        }
    }

    /// The current simulated time.
    pub fn now(&self) -> SimTime {
        SimTime::from_secs_f64(self.start.elapsed().as_secs_f64() * self.scale)
    }

    /// The wall-clock instant of simulated time `t`.
    pub fn instant_of(&self, t: SimTime) -> Instant {
        self.start + Duration::from_secs_f64(t.as_secs_f64() / self.scale)
    }
}

/// A cheap handle to a running engine task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: mpsc::UnboundedSender<Command>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

impl EngineHandle {
    /// Starts the engine task; it ends when every handle is dropped.
    pub fn spawn(cfg: EngineConfig, clock: SimClock) -> Self {
        Self::spawn_with_events(cfg, clock, None)
    }

    /// [`EngineHandle::spawn`], sending the cache's changes to `kv_events` when given.
    pub fn spawn_with_events(
        cfg: EngineConfig,
        clock: SimClock,
        kv_events: Option<mpsc::UnboundedSender<Vec<CacheEvent>>>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut engine = Engine::new(cfg);
        engine.set_cache_events(kv_events.is_some());
        tokio::spawn(run(engine, clock, rx, kv_events));
        Self { tx }
    }

    /// Queues a request; its events arrive on the returned receiver.
    pub async fn submit(
        &self,
        req: EngineRequest,
    ) -> anyhow::Result<(RequestId, mpsc::UnboundedReceiver<RequestEvent>)> {
        self.submit_with_bytes(req, None).await
    }

    /// [`EngineHandle::submit`] with the sequence's bytes, the token ids of its KV events
    /// (see [`Engine::submit_with_bytes`]).
    pub async fn submit_with_bytes(
        &self,
        req: EngineRequest,
        content: Option<Arc<[u8]>>,
    ) -> anyhow::Result<(RequestId, mpsc::UnboundedReceiver<RequestEvent>)> {
        let (events, rx) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Submit {
                req,
                content,
                events,
                reply,
            })
            .map_err(|_| anyhow::anyhow!("engine stopped"))?;
        match answer.await? {
            Ok(id) => Ok((id, rx)),
            Err(e) => Err(anyhow::Error::new(SubmitFailed(e))),
        }
    }

    /// Drops a request and frees its blocks.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.tx.send(Command::Cancel(id));
    }

    /// Puts a prompt's KV blocks, computed by another replica, into the prefix cache;
    /// returns the blocks imported (see [`Engine::import_prefix`]).
    pub async fn import_prefix(&self, hashes: Vec<BlockHash>) -> anyhow::Result<usize> {
        self.import_prefix_bytes(hashes, None, None).await
    }

    /// [`EngineHandle::import_prefix`] with the prompt's bytes and adapter, for the KV
    /// events (see [`Engine::import_prefix_bytes`]).
    pub async fn import_prefix_bytes(
        &self,
        hashes: Vec<BlockHash>,
        content: Option<Arc<[u8]>>,
        lora: Option<String>,
    ) -> anyhow::Result<usize> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Import {
                hashes,
                content,
                lora,
                reply,
            })
            .map_err(|_| anyhow::anyhow!("engine stopped"))?;
        Ok(answer.await?)
    }

    /// Forgets every cached block (vLLM's `reset_prefix_cache`); with KV events on, an
    /// `AllBlocksCleared` is published.
    pub async fn reset_prefix_cache(&self) -> anyhow::Result<()> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::ResetPrefixCache(reply))
            .map_err(|_| anyhow::anyhow!("engine stopped"))?;
        Ok(answer.await?)
    }

    /// Runs the engine's steps started from now on slower (see [`Slowdown`]); the step in
    /// progress keeps its end. Returns the slowdown now in effect.
    pub async fn set_slowdown(&self, slowdown: Slowdown) -> anyhow::Result<Slowdown> {
        self.slowdown_command(Some(slowdown)).await
    }

    /// The slowdown in effect ([`Slowdown::NONE`] unless set).
    pub async fn slowdown(&self) -> anyhow::Result<Slowdown> {
        self.slowdown_command(None).await
    }

    async fn slowdown_command(&self, set: Option<Slowdown>) -> anyhow::Result<Slowdown> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Slowdown(set, reply))
            .map_err(|_| anyhow::anyhow!("engine stopped"))?;
        Ok(answer.await?)
    }

    /// The engine's current stats.
    pub async fn stats(&self) -> anyhow::Result<EngineStats> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Command::Stats(reply))
            .map_err(|_| anyhow::anyhow!("engine stopped"))?;
        Ok(answer.await?)
    }
}

/// A refused submission, carried through `anyhow`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitFailed(pub SubmitError);

impl std::fmt::Display for SubmitFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for SubmitFailed {}

async fn run(
    mut engine: Engine,
    clock: SimClock,
    mut rx: mpsc::UnboundedReceiver<Command>,
    kv_events: Option<mpsc::UnboundedSender<Vec<CacheEvent>>>,
) {
    let mut next_id: u64 = 0;
    let mut sinks: HashMap<RequestId, mpsc::UnboundedSender<RequestEvent>> = HashMap::new();
    let mut events = Vec::new();
    loop {
        engine.advance(clock.now(), &mut events);
        deliver(&mut engine, &mut sinks, &mut events);
        publish(&mut engine, kv_events.as_ref());
        let wake = engine.next_wakeup().map(|t| clock.instant_of(t));
        let cmd = match wake {
            Some(at) => tokio::select! {
                cmd = rx.recv() => cmd,
                () = tokio::time::sleep_until(at) => continue,
            },
            None => rx.recv().await,
        };
        let Some(cmd) = cmd else { break };
        // Complete steps that ended before this command arrived.
        engine.advance(clock.now(), &mut events);
        deliver(&mut engine, &mut sinks, &mut events);
        match cmd {
            Command::Submit {
                req,
                content,
                events: sink,
                reply,
            } => {
                next_id += 1;
                let id = RequestId(next_id);
                let result = engine
                    .submit_with_bytes(clock.now(), id, req, content)
                    .map(|()| id);
                if result.is_ok() {
                    sinks.insert(id, sink);
                }
                let _ = reply.send(result);
            }
            Command::Cancel(id) => {
                engine.cancel(id);
                sinks.remove(&id);
            }
            Command::Stats(reply) => {
                let _ = reply.send(engine.stats());
            }
            Command::Import {
                hashes,
                content,
                lora,
                reply,
            } => {
                let n = engine.import_prefix_bytes(&hashes, content.as_deref(), lora.as_deref());
                let _ = reply.send(n);
            }
            Command::ResetPrefixCache(reply) => {
                engine.reset_prefix_cache();
                let _ = reply.send(());
            }
            Command::Slowdown(set, reply) => {
                if let Some(slowdown) = set {
                    engine.set_slowdown(slowdown);
                }
                let _ = reply.send(engine.slowdown());
            }
        }
    }
}

/// Sends the cache changes logged since the last call as one batch.
fn publish(engine: &mut Engine, sink: Option<&mpsc::UnboundedSender<Vec<CacheEvent>>>) {
    let Some(sink) = sink else { return };
    let mut batch = Vec::new();
    engine.drain_cache_events(&mut batch);
    if !batch.is_empty() {
        let _ = sink.send(batch);
    }
}

fn deliver(
    engine: &mut Engine,
    sinks: &mut HashMap<RequestId, mpsc::UnboundedSender<RequestEvent>>,
    events: &mut Vec<EngineEvent>,
) {
    for ev in events.drain(..) {
        let (id, msg, last) = match ev {
            EngineEvent::Token {
                id,
                index,
                cached_tokens,
                ..
            } => (
                id,
                RequestEvent::Token {
                    index,
                    cached_tokens,
                },
                false,
            ),
            EngineEvent::Finished { id, usage, .. } => (id, RequestEvent::Finished(usage), true),
        };
        let gone = match sinks.get(&id) {
            Some(sink) => sink.send(msg).is_err(),
            None => false,
        };
        if gone {
            // The consumer dropped its receiver: the client went away.
            engine.cancel(id);
            sinks.remove(&id);
        } else if last {
            sinks.remove(&id);
        }
    }
}
