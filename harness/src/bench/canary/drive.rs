//! The canary demo's client: the multi-turn conversations of a [`Workload`], each
//! conversation sending its own session header on every turn, at a fixed concurrency,
//! against a target that can change while the run goes on.
//!
//! The target is read when each request starts, so a rollback that brings a new Envoy up
//! and points the client at it sends every later turn there while the requests already
//! sent finish on the old one; [`Drive::in_flight_on`] tells when the old one has drained.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::load::client::{self, BaseUrl, ChatExtras, ConnPool, RequestRecord};
use crate::load::Workload;

/// Header naming a conversation (the sticky split's key).
pub const SESSION_HEADER: &str = "x-session-id";

/// One request as the demo saw it: the load generator's record and when it started.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The record (its `model` is the version that answered).
    pub record: RequestRecord,
    /// Seconds from the start of the run to the request's start.
    pub started_s: f64,
}

/// A running drive: its shared view for a controller (how far it is, where requests are
/// in flight) and the handle to wait for its records.
#[derive(Clone, Debug)]
pub struct Drive {
    epoch: Instant,
    done: Arc<Mutex<usize>>,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    target: watch::Sender<BaseUrl>,
    /// Requests the workload sends in all.
    pub total: usize,
}

impl Drive {
    /// Seconds since the drive started (the clock of [`Sent::started_s`]).
    pub fn elapsed_s(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Requests finished so far.
    pub fn done(&self) -> usize {
        self.done.lock().map(|d| *d).unwrap_or(0)
    }

    /// Requests in flight to `url` now.
    pub fn in_flight_on(&self, url: &str) -> usize {
        self.in_flight
            .lock()
            .map(|m| m.get(url).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Sends every request started from now on to `url`.
    pub fn retarget(&self, url: &str) -> Result<()> {
        let base = BaseUrl::parse(url)?;
        if self.target.send(base).is_err() {
            bail!("the drive has ended");
        }
        Ok(())
    }

    /// Waits until `done()` reaches `n` (or the drive cannot get there).
    pub async fn wait_done(&self, n: usize) {
        while self.done() < n.min(self.total) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until nothing is in flight to `url`, at most `patience`.
    pub async fn wait_drained(&self, url: &str, patience: Duration) -> Result<()> {
        let deadline = Instant::now() + patience;
        while self.in_flight_on(url) > 0 {
            if Instant::now() > deadline {
                bail!(
                    "{} requests still in flight to {url} after {patience:?}",
                    self.in_flight_on(url)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

/// Starts sending `workload` (text varied by `salt`; conversation `i` sends
/// `x-session-id: <tag>-<i>`) to `url` with `concurrency` requests in flight. Returns the
/// drive's controls and the task that ends with every request, in completion order.
pub fn start(
    workload: Workload,
    salt: u64,
    tag: &str,
    url: &str,
    concurrency: usize,
) -> Result<(Drive, tokio::task::JoinHandle<Result<Vec<Sent>>>)> {
    let (target, watcher) = watch::channel(BaseUrl::parse(url)?);
    let drive = Drive {
        epoch: Instant::now(),
        done: Arc::new(Mutex::new(0)),
        in_flight: Arc::new(Mutex::new(HashMap::new())),
        target,
        total: workload.order().len(),
    };
    let control = drive.clone();
    let tag = tag.to_owned();
    let task = tokio::spawn(async move {
        run(&workload, salt, &tag, watcher, concurrency.max(1), &control).await
    });
    Ok((drive, task))
}

async fn run(
    w: &Workload,
    salt: u64,
    tag: &str,
    target: watch::Receiver<BaseUrl>,
    concurrency: usize,
    drive: &Drive,
) -> Result<Vec<Sent>> {
    let mut convs = w.conversations(salt);
    let mut busy = vec![false; convs.len()];
    let mut remaining = w.order();
    let pool = ConnPool::default();
    let start = drive.epoch;
    let mut tasks: JoinSet<(u32, Sent)> = JoinSet::new();
    let mut out = Vec::with_capacity(remaining.len());
    let header = HeaderName::from_static(SESSION_HEADER);
    loop {
        while tasks.len() < concurrency {
            let Some(pos) = remaining
                .iter()
                .position(|c| !busy.get(*c as usize).copied().unwrap_or(true))
            else {
                break;
            };
            let idx = remaining.remove(pos);
            let Some(conv) = convs.get_mut(idx as usize) else {
                continue;
            };
            if let Some(b) = busy.get_mut(idx as usize) {
                *b = true;
            }
            let turn = conv.turns_sent;
            let body = Bytes::from(w.next_body(salt, conv));
            let base = target.borrow().clone();
            let mut extras = ChatExtras::default();
            if let Ok(v) = HeaderValue::from_str(&format!("{tag}-{idx}")) {
                extras.headers.push((header.clone(), v));
            }
            if let Ok(mut m) = drive.in_flight.lock() {
                *m.entry(base.url.clone()).or_default() += 1;
            }
            let pool = pool.clone();
            let started_s = start.elapsed().as_secs_f64();
            let in_flight = drive.in_flight.clone();
            tasks.spawn(async move {
                let mut record =
                    client::chat_with(&pool, &base, body, None, Duration::from_secs(120), &extras)
                        .await;
                if let Ok(mut m) = in_flight.lock() {
                    if let Some(n) = m.get_mut(&base.url) {
                        *n = n.saturating_sub(1);
                    }
                }
                record.conversation = idx;
                record.turn = turn;
                (idx, Sent { record, started_s })
            });
        }
        let Some(joined) = tasks.join_next().await else {
            break;
        };
        let (idx, sent) = joined?;
        if let Some(b) = busy.get_mut(idx as usize) {
            *b = false;
        }
        if let Some(conv) = convs.get_mut(idx as usize) {
            if sent.record.ok() {
                conv.push("assistant", &sent.record.content);
            }
        }
        out.push(sent);
        if let Ok(mut d) = drive.done.lock() {
            *d += 1;
        }
    }
    Ok(out)
}
