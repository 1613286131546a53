//! A vLLM-faithful engine simulator: a pool of replicas on loopback, each speaking vLLM's
//! OpenAI surface, with a KV cache, prefix caching, continuous batching, queueing and LoRA
//! slots modelled closely enough that routing decisions matter as they do on GPUs.
//!
//! - [`control`]: `/tokenize`, `/reset_prefix_cache`, the KV event fault controls and
//!   `/sim/slowdown`, which makes one replica's engine slower while it serves.
//! - [`engine`]: the pure engine model (no sockets, no clock), unit-tested step by step.
//! - [`driver`]: runs one engine on tokio against a (scalable) wall clock.
//! - [`server`]: the hyper HTTP surface of a replica; [`stream`], [`responses`] and
//!   [`metrics`] shape its bodies; [`prompt`] turns request bodies into tokens and block hashes; [`text`]
//!   makes the deterministic output; [`served`] keeps the totals of what responses delivered;
//!   [`arrivals`] logs the order in which requests reached the pool; [`disagg`] is the
//!   decode replica's sidecar for disaggregated prefill (`x-prefiller-host-port`).
//!
//! [`kv_events`] publishes each replica's KV cache changes as vLLM's KV events over ZMQ
//! PUB, when `SimConfig::kv_events_port_offset` is set.
//!
//! [`start`] runs a pool in-process and returns a [`SimHandle`]; the `infergate-sim`
//! binary wraps it.

pub mod arrivals;
pub mod config;
pub mod control;
pub mod disagg;
pub mod driver;
pub mod engine;
pub mod kv_events;
pub mod metrics;
pub mod prompt;
pub mod responses;
pub mod served;
pub mod server;
pub mod stream;
pub mod text;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use arrivals::Arrival;
pub use config::SimConfig;
pub use driver::{EngineHandle, SimClock};
pub use engine::{EngineConfig, EngineStats, Slowdown};
pub use kv_events::{KvEventsControl, KvEventsStats};
pub use responses::PromptTokensDetails;
pub use served::{ServedKey, ServedTotals};
pub use server::{REPLICA_ADDR_HEADER, REPLICA_HEADER};

/// A running simulated pool.
#[derive(Debug)]
pub struct SimHandle {
    addrs: Vec<SocketAddr>,
    engines: Vec<EngineHandle>,
    ledgers: Vec<served::ServedLedger>,
    health: Vec<Arc<std::sync::atomic::AtomicBool>>,
    kills: Vec<watch::Sender<bool>>,
    kv_events: Vec<Option<Arc<KvEventsControl>>>,
    arrivals: arrivals::ArrivalLog,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl SimHandle {
    /// The bound address of each replica, in replica order.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// `http://127.0.0.1:PORT` of each replica.
    pub fn base_urls(&self) -> Vec<String> {
        self.addrs.iter().map(|a| format!("http://{a}")).collect()
    }

    /// Current engine stats of replica `index`.
    pub async fn stats(&self, index: usize) -> anyhow::Result<EngineStats> {
        match self.engines.get(index) {
            Some(e) => e.stats().await,
            None => anyhow::bail!("no replica {index}"),
        }
    }

    /// What replica `index`'s responses delivered, per fairness id and model.
    pub fn served(&self, index: usize) -> anyhow::Result<Vec<(ServedKey, ServedTotals)>> {
        match self.ledgers.get(index) {
            Some(l) => Ok(l.snapshot()),
            None => anyhow::bail!("no replica {index}"),
        }
    }

    /// Makes replica `index` answer `GET /health` with 200 (`true`, the start) or 503
    /// (`false`); it keeps serving everything else as before.
    pub fn set_healthy(&self, index: usize, healthy: bool) -> anyhow::Result<()> {
        match self.health.get(index) {
            Some(h) => {
                h.store(healthy, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            None => anyhow::bail!("no replica {index}"),
        }
    }

    /// Kills replica `index` as a crashed pod dies: it stops listening and every connection
    /// it holds is closed at once, streams in flight included. The others keep serving.
    pub fn kill(&self, index: usize) -> anyhow::Result<()> {
        match self.kills.get(index) {
            Some(k) => {
                let _ = k.send(true);
                Ok(())
            }
            None => anyhow::bail!("no replica {index}"),
        }
    }

    /// Each replica's KV event endpoint (`tcp://IP:PORT`), `None` with events off.
    pub fn kv_events_endpoints(&self) -> Vec<Option<String>> {
        self.kv_events
            .iter()
            .map(|c| c.as_ref().map(|c| c.endpoint().to_string()))
            .collect()
    }

    /// The fault controls and counters of replica `index`'s KV event publisher (`None`
    /// with events off).
    pub fn kv_events(&self, index: usize) -> anyhow::Result<Option<Arc<KvEventsControl>>> {
        match self.kv_events.get(index) {
            Some(c) => Ok(c.clone()),
            None => anyhow::bail!("no replica {index}"),
        }
    }

    /// Forgets every block replica `index` caches (as vLLM's `/reset_prefix_cache`, or a
    /// restarted engine); with KV events on it publishes `AllBlocksCleared`.
    pub async fn reset_prefix_cache(&self, index: usize) -> anyhow::Result<()> {
        match self.engines.get(index) {
            Some(e) => e.reset_prefix_cache().await,
            None => anyhow::bail!("no replica {index}"),
        }
    }

    /// Runs replica `index`'s engine slower from its next step on, as
    /// `POST /sim/slowdown` does ([`Slowdown::NONE`] restores it); returns the slowdown now
    /// in effect.
    pub async fn set_slowdown(&self, index: usize, slowdown: Slowdown) -> anyhow::Result<Slowdown> {
        match self.engines.get(index) {
            Some(e) => e.set_slowdown(slowdown).await,
            None => anyhow::bail!("no replica {index}"),
        }
    }

    /// The slowdown in effect on replica `index`.
    pub async fn slowdown(&self, index: usize) -> anyhow::Result<Slowdown> {
        match self.engines.get(index) {
            Some(e) => e.slowdown().await,
            None => anyhow::bail!("no replica {index}"),
        }
    }

    /// Every completion request the pool received so far, in arrival order across its
    /// replicas (see [`arrivals`]).
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.snapshot()
    }

    /// Stops accepting, closes every connection and waits for the listeners to end.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Binds every replica's listener and starts serving. Replica K listens on
/// `cfg.port + K`, or on a free port when `cfg.port` is 0.
pub async fn start(cfg: SimConfig) -> anyhow::Result<SimHandle> {
    if cfg.replicas == 0 {
        anyhow::bail!("at least one replica is needed");
    }
    if cfg.models.is_empty() {
        anyhow::bail!("at least one served model name is needed");
    }
    if cfg.kv_events_port_offset == Some(0) {
        anyhow::bail!("kv_events_port_offset must be at least 1 (0 is the HTTP port)");
    }
    let cfg = Arc::new(cfg);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let clock = SimClock::new(cfg.time_scale);
    let mut handle = SimHandle {
        addrs: Vec::new(),
        engines: Vec::new(),
        ledgers: Vec::new(),
        health: Vec::new(),
        kills: Vec::new(),
        kv_events: Vec::new(),
        arrivals: arrivals::ArrivalLog::default(),
        shutdown,
        tasks: Vec::new(),
    };
    for k in 0..cfg.replicas {
        let port = if cfg.port == 0 {
            0
        } else {
            u16::try_from(u32::from(cfg.port) + k)?
        };
        let explicit = cfg.listen.get(k as usize);
        // An ephemeral HTTP port puts the KV-event port at a port nobody reserved: when
        // that one is taken, the replica takes another HTTP port.
        let attempts = if port == 0 && explicit.is_none() {
            8
        } else {
            1
        };
        let mut attempt = 0;
        let (listener, addr, kill, kill_rx, engine, kv_control) = loop {
            attempt += 1;
            let listener = match explicit {
                Some(addr) => TcpListener::bind(addr).await?,
                None => TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await?,
            };
            let addr = listener.local_addr()?;
            let (kill, kill_rx) = watch::channel(false);
            let Some(offset) = cfg.kv_events_port_offset else {
                let engine = EngineHandle::spawn(cfg.engine.clone(), clock);
                break (listener, addr, kill, kill_rx, engine, None);
            };
            let events_port = u16::try_from(u32::from(addr.port()) + u32::from(offset))?;
            let (tx, rx) = mpsc::unbounded_channel();
            let shape = kv_events::BatchShape {
                block_size: cfg.engine.block_size,
                loras: cfg.loras.clone(),
                dp_rank: Some(0),
            };
            let topic = kv_events::topic(&addr.to_string(), cfg.base_model());
            let stops = [shutdown_rx.clone(), kill_rx.clone()];
            match kv_events::publisher::spawn(addr.ip(), events_port, topic, shape, rx, stops).await
            {
                Ok((control, task)) => {
                    handle.tasks.push(task);
                    let engine =
                        EngineHandle::spawn_with_events(cfg.engine.clone(), clock, Some(tx));
                    break (listener, addr, kill, kill_rx, engine, Some(control));
                }
                Err(_) if attempt < attempts => continue,
                Err(e) => return Err(e),
            }
        };
        let mut replica = server::Replica::new(k as usize, addr, engine.clone(), cfg.clone());
        replica.arrivals = handle.arrivals.clone();
        replica.kv_events = kv_control.clone();
        handle.kv_events.push(kv_control);
        let replica = Arc::new(replica);
        handle.addrs.push(addr);
        handle.engines.push(engine);
        handle.ledgers.push(replica.ledger.clone());
        handle.health.push(replica.healthy.clone());
        handle.kills.push(kill);
        handle.tasks.push(tokio::spawn(serve(
            listener,
            replica,
            shutdown_rx.clone(),
            kill_rx,
        )));
    }
    Ok(handle)
}

async fn serve(
    listener: TcpListener,
    replica: Arc<server::Replica>,
    mut shutdown: watch::Receiver<bool>,
    mut kill: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => break,
            _ = kill.changed() => break,
        };
        let Ok((stream, _)) = accepted else { continue };
        let _ = stream.set_nodelay(true);
        let replica = replica.clone();
        let mut stop = shutdown.clone();
        let mut killed = kill.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let replica = replica.clone();
                async move { Ok::<_, std::convert::Infallible>(server::handle(replica, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = stop.changed() => {}
                _ = killed.changed() => {}
            }
        });
    }
}
