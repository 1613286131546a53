//! The long-context requests that keep one replica's KV cache full, sent straight to that
//! replica (no Envoy, so no router sees them, as traffic from another gateway or a batch
//! job would be).
//!
//! A few lanes each repeat one long prompt with a long answer. What the replica's KV usage
//! counts is the blocks running sequences reference, so a lane must never leave its prompt
//! unreferenced: each lane sends its next request (same prompt, which the replica has
//! cached) while the current one still has [`HogPlan::handover_tokens`] tokens to generate,
//! so the next one is admitted before the current one frees the prompt's blocks. Lanes are
//! started a fraction of a request apart, so their answers (which grow as they decode) do not
//! all end at once. The prompts alone hold [`HogPlan::floor_usage`] of the KV cache; the
//! answers add up to about one more answer per lane on top.
//!
//! When the replica is also given other requests (round robin sends it a quarter of the
//! chat), the lanes' requests carry vLLM's `priority` ([`HogPlan::PRIORITY`], ahead of the
//! chat's 0) on a replica scheduling by priority: a lane's next request never waits behind
//! the chat, and when the cache runs out it is the chat that is preempted. Under first come,
//! first served, a lane's next request would wait behind the chat queued there, the current
//! one would end, the chat would take part of the lane's prompt, and the lane could not come
//! back until the chat left (the blocks it finds cached but unreferenced do not count
//! towards its admission, as in vLLM): the replica's KV usage would dip by a whole lane.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;

use crate::load::client::SseEvents;
use crate::load::workload::filler;
use crate::sim::EngineConfig;

/// Tokens the simulator's chat template adds around one user message
/// (`<|user|>\n`, `\n`, `<|assistant|>\n`: 24 bytes at 4 bytes per token).
const CHAT_TEMPLATE_TOKENS: u32 = 6;

/// The sizes of the long-context requests for one replica.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HogPlan {
    /// Lanes (distinct long prompts), each with one request running at a time.
    pub lanes: u32,
    /// Tokens of each lane's prompt content.
    pub prompt_tokens: u32,
    /// Tokens of each answer (`max_tokens` with `ignore_eos`).
    pub output_tokens: u32,
    /// A lane sends its next request when the current one has this many tokens left.
    pub handover_tokens: u32,
    /// Blocks of the replica's KV cache.
    pub num_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
}

impl HogPlan {
    /// Lanes of the scenario: a few long contexts.
    pub const LANES: u32 = 3;
    /// Answer length: a lane's request runs for seconds (~3 s simulated), and the answers
    /// together swing by one answer's blocks (32, 0.3% of the cache) as they grow and end,
    /// which leaves room for one chat request of up to ~7k tokens beside them.
    pub const OUTPUT_TOKENS: u32 = 512;
    /// Handover margin: a few decode steps, so the next request is admitted well before the
    /// current one ends.
    pub const HANDOVER_TOKENS: u32 = 48;

    /// vLLM request priority of the lanes' requests: ahead of the chat's (0) on a replica
    /// scheduling by priority.
    pub const PRIORITY: i32 = -1;

    /// Lanes whose prompts alone hold `floor` of the KV cache of an engine with `cfg`.
    pub fn for_engine(cfg: &EngineConfig, floor: f64) -> HogPlan {
        let bs = cfg.block_size.max(1);
        let num_blocks = cfg.num_blocks();
        let lanes = Self::LANES;
        let prompt_blocks = ((f64::from(num_blocks) * floor) / f64::from(lanes)).ceil() as u32;
        HogPlan {
            lanes,
            // Whole blocks of shared prompt, the template's tokens included.
            prompt_tokens: (prompt_blocks * bs).saturating_sub(CHAT_TEMPLATE_TOKENS),
            output_tokens: Self::OUTPUT_TOKENS,
            handover_tokens: Self::HANDOVER_TOKENS,
            num_blocks,
            block_size: bs,
        }
    }

    /// The full blocks of one lane's prompt (what its consecutive requests share).
    pub fn prompt_blocks(&self) -> u32 {
        (self.prompt_tokens + CHAT_TEMPLATE_TOKENS) / self.block_size.max(1)
    }

    /// KV usage of the prompts alone: the least the lanes hold whatever their answers do.
    pub fn floor_usage(&self) -> f64 {
        f64::from(self.lanes * self.prompt_blocks()) / f64::from(self.num_blocks.max(1))
    }

    /// KV usage with every lane's answer at its longest at once: the most they hold.
    pub fn ceiling_usage(&self) -> f64 {
        let per_answer = (self.output_tokens + self.handover_tokens).div_ceil(self.block_size) + 1;
        self.floor_usage() + f64::from(self.lanes * per_answer) / f64::from(self.num_blocks.max(1))
    }

    /// Simulated seconds of one request's decode with `running` sequences in the batch.
    pub fn request_sim_secs(&self, cfg: &EngineConfig, running: u32) -> f64 {
        let step_ms = cfg.decode_base_ms + cfg.decode_per_seq_ms * f64::from(running.max(1));
        f64::from(self.output_tokens) * step_ms / 1000.0
    }

    /// Lane `lane`'s request body (`max_tokens` 1 for the warm-up that caches the prompt).
    pub fn body(&self, model: &str, lane: u32, max_tokens: u32) -> String {
        let key = 0x686f_6773_706f_7400 ^ u64::from(lane);
        json!({
            "model": model,
            "messages": [{"role": "user", "content": filler(key, self.prompt_tokens)}],
            "stream": true,
            "ignore_eos": true,
            "max_tokens": max_tokens,
            "priority": Self::PRIORITY,
        })
        .to_string()
    }
}

/// What the lanes did, read when they stop.
#[derive(Debug, Default)]
pub struct HogCounters {
    /// Requests sent (warm-up included).
    pub sent: AtomicU64,
    /// Requests that failed (not 200, or the stream broke).
    pub failed: AtomicU64,
}

/// The running lanes; [`Hog::stop`] ends them.
#[derive(Debug)]
pub struct Hog {
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    counters: Arc<HogCounters>,
    last_error: Arc<std::sync::Mutex<Option<String>>>,
}

impl Hog {
    /// Caches every lane's prompt on `addr` (one token each, all at once), then starts the
    /// lanes `stagger` apart. Returns once every lane runs.
    pub async fn start(
        addr: std::net::SocketAddr,
        model: &str,
        plan: HogPlan,
        stagger: Duration,
    ) -> Result<Hog> {
        let authority = addr.to_string();
        let mut warm = JoinSet::new();
        for lane in 0..plan.lanes {
            let body = Bytes::from(plan.body(model, lane, 1));
            let authority = authority.clone();
            warm.spawn(async move { stream_one(&authority, body, None).await });
        }
        while let Some(r) = warm.join_next().await {
            r.context("warm-up task")?
                .context("caching a long prompt on the full replica")?;
        }
        let (stop, stop_rx) = watch::channel(false);
        let counters = Arc::new(HogCounters::default());
        counters
            .sent
            .store(u64::from(plan.lanes), Ordering::Relaxed);
        let last_error = Arc::new(std::sync::Mutex::new(None));
        let mut tasks = JoinSet::new();
        for lane in 0..plan.lanes {
            if lane > 0 {
                tokio::time::sleep(stagger).await;
            }
            let body = Bytes::from(plan.body(model, lane, plan.output_tokens));
            let left = plan.output_tokens.saturating_sub(plan.handover_tokens);
            tasks.spawn(run_lane(
                authority.clone(),
                body,
                left,
                stop_rx.clone(),
                counters.clone(),
                last_error.clone(),
            ));
        }
        Ok(Hog {
            stop,
            tasks,
            counters,
            last_error,
        })
    }

    /// Requests sent so far and how many failed.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.counters.sent.load(Ordering::Relaxed),
            self.counters.failed.load(Ordering::Relaxed),
        )
    }

    /// The last failure, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    /// Stops every lane (their streams are dropped, which cancels them at the replica).
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// One lane: a request at a time, the next one sent when the current one has `handover`
/// tokens left, until stopped.
async fn run_lane(
    authority: String,
    body: Bytes,
    handover_at: u32,
    mut stop: watch::Receiver<bool>,
    counters: Arc<HogCounters>,
    last_error: Arc<std::sync::Mutex<Option<String>>>,
) {
    let mut current: JoinSet<Result<u32>> = JoinSet::new();
    let (mut ready_tx, mut ready_rx) = oneshot::channel::<()>();
    let spawn = |set: &mut JoinSet<Result<u32>>, tx: oneshot::Sender<()>| {
        let authority = authority.clone();
        let body = body.clone();
        set.spawn(async move { stream_one(&authority, body, Some((handover_at, tx))).await });
    };
    spawn(&mut current, ready_tx);
    counters.sent.fetch_add(1, Ordering::Relaxed);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            // The current request reached its handover point (or ended): send the next.
            _ = &mut ready_rx => {
                (ready_tx, ready_rx) = oneshot::channel();
                spawn(&mut current, ready_tx);
                counters.sent.fetch_add(1, Ordering::Relaxed);
            }
            Some(done) = current.join_next() => {
                let failure = match done {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(format!("{e:#}")),
                    Err(e) => Some(e.to_string()),
                };
                if let Some(f) = failure {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut last) = last_error.lock() {
                        *last = Some(f);
                    }
                    // Do not spin on a replica that refuses.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                if current.is_empty() {
                    (ready_tx, ready_rx) = oneshot::channel();
                    spawn(&mut current, ready_tx);
                    counters.sent.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Sends one streamed chat request to `authority` and reads it to the end; returns the SSE
/// events received. With `handover`, signals once that many events have arrived (or at the
/// end, whichever is first).
async fn stream_one(
    authority: &str,
    body: Bytes,
    handover: Option<(u32, oneshot::Sender<()>)>,
) -> Result<u32> {
    let stream = TcpStream::connect(authority)
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::post("/v1/chat/completions")
        .header("host", authority)
        .header("content-type", "application/json")
        .body(Full::new(body))?;
    let resp = sender.send_request(req).await?;
    if resp.status() != 200 {
        let status = resp.status();
        let text = resp.into_body().collect().await?.to_bytes();
        bail!(
            "{authority} answered {status}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    let mut handover = handover;
    let mut events = SseEvents::default();
    let mut n = 0u32;
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        events.push(&data);
        while events.next_data().is_some() {
            n += 1;
        }
        if handover.as_ref().is_some_and(|(at, _)| n >= *at) {
            if let Some((_, tx)) = handover.take() {
                let _ = tx.send(());
            }
        }
    }
    if let Some((_, tx)) = handover.take() {
        let _ = tx.send(());
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::PROMPTS_HOLD;
    use super::*;

    #[test]
    fn plan_fills_the_calibration_replica_above_the_floor() {
        let cfg = crate::bench::calibration::sim_config(2.0).engine;
        let plan = HogPlan::for_engine(&cfg, PROMPTS_HOLD);
        assert_eq!(plan.num_blocks, 10_000);
        // The prompts alone hold the floor, whatever the answers do.
        assert!(plan.floor_usage() >= PROMPTS_HOLD, "{}", plan.floor_usage());
        assert!(
            plan.floor_usage() < PROMPTS_HOLD + 0.001,
            "{}",
            plan.floor_usage()
        );
        // Answers at their longest still fit: the lanes never preempt each other.
        assert!(plan.ceiling_usage() < 1.0, "{}", plan.ceiling_usage());
        // Each prompt is a long context, and prompt + answer fit the model length.
        assert!(plan.prompt_tokens > 40_000);
        assert!(plan.prompt_tokens + plan.output_tokens <= cfg.effective_max_model_len());
        assert_eq!(
            (plan.prompt_tokens + CHAT_TEMPLATE_TOKENS) % plan.block_size,
            0
        );
    }

    #[test]
    fn body_is_a_long_streamed_chat_request() {
        let cfg = crate::bench::calibration::sim_config(2.0).engine;
        let plan = HogPlan::for_engine(&cfg, PROMPTS_HOLD);
        let v: serde_json::Value = serde_json::from_str(&plan.body("m", 1, 7)).unwrap();
        assert_eq!(v["max_tokens"], 7);
        assert_eq!(v["ignore_eos"], true);
        let content = v["messages"][0]["content"].as_str().unwrap();
        assert_eq!(content.len() as u32, plan.prompt_tokens * 4);
        assert_ne!(plan.body("m", 0, 7), plan.body("m", 1, 7));
    }
}

/// The lanes of a [`HogPlan`] driven on the bare engine model (no sockets, no clock), with
/// or without competing chat requests, sampled as the replica's `/metrics` would be.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod engine_check {
    use super::super::{FULL_AT, PROMPTS_HOLD};
    use super::*;
    use crate::sim::engine::{BlockHash, Engine, EngineEvent, EngineRequest, RequestId, SimTime};
    use std::collections::HashMap;

    struct Outcome {
        min: f64,
        chat_done: usize,
    }

    fn lane_req(plan: &HogPlan, lane: u32, output: u32) -> EngineRequest {
        let prompt = plan.prompt_tokens + CHAT_TEMPLATE_TOKENS;
        let blocks = (prompt + output) / plan.block_size;
        EngineRequest {
            prompt_tokens: prompt,
            // A lane's requests share their blocks' hashes, as the same prompt does.
            block_hashes: (0..u64::from(blocks))
                .map(|i| BlockHash((u64::from(lane) + 1) << 40 | i))
                .collect(),
            output_tokens: output,
            lora: None,
            priority: HogPlan::PRIORITY,
        }
    }

    /// Warms the lanes, starts them as [`Hog::start`] does, keeps `chat` chat-sized
    /// requests outstanding, and samples KV usage every 50 ms for `secs` simulated seconds.
    fn drive(plan: &HogPlan, cfg: &EngineConfig, chat: usize, secs: f64) -> Outcome {
        let mut e = Engine::new(cfg.clone());
        let mut next_id = 0u64;
        let mut id = || {
            next_id += 1;
            RequestId(next_id)
        };
        let mut out = Vec::new();
        for lane in 0..plan.lanes {
            e.submit(SimTime(0), id(), lane_req(plan, lane, 1)).unwrap();
        }
        let mut now = SimTime(0);
        while let Some(t) = e.next_wakeup() {
            now = t;
            e.advance(t, &mut out);
        }
        out.clear();
        let stagger = plan.request_sim_secs(cfg, plan.lanes) / f64::from(plan.lanes);
        let mut lane_of: HashMap<RequestId, u32> = HashMap::new();
        let mut due_lanes: Vec<(SimTime, u32)> = (0..plan.lanes)
            .map(|l| (now.plus_secs(stagger * f64::from(l)), l))
            .collect();
        let start = now.plus_secs(stagger * f64::from(plan.lanes) + 1.0);
        let end = start.plus_secs(secs);
        let mut chats: HashMap<RequestId, ()> = HashMap::new();
        let mut chat_done = 0;
        let mut min = f64::INFINITY;
        let mut next_sample = start;
        let mut n = 0u64;
        loop {
            let t = [
                e.next_wakeup(),
                due_lanes.iter().map(|p| p.0).min(),
                Some(next_sample),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap();
            if t > end {
                break;
            }
            now = t;
            e.advance(now, &mut out);
            let (due, later): (Vec<_>, Vec<_>) = due_lanes.iter().partition(|(at, _)| *at <= now);
            due_lanes = later;
            for (_, lane) in due {
                let r = id();
                lane_of.insert(r, lane);
                e.submit(now, r, lane_req(plan, lane, plan.output_tokens))
                    .unwrap();
            }
            for ev in out.drain(..) {
                match ev {
                    EngineEvent::Token {
                        id: r, index, at, ..
                    } => {
                        let handover = plan.output_tokens - plan.handover_tokens;
                        if let (Some(&lane), true) = (lane_of.get(&r), index + 1 == handover) {
                            due_lanes.push((at, lane));
                        }
                    }
                    EngineEvent::Finished { id: r, .. } => {
                        lane_of.remove(&r);
                        chat_done += usize::from(chats.remove(&r).is_some());
                    }
                }
            }
            while now >= start && chats.len() < chat {
                // Chat-sized: a 4k-token first turn with a 600-token answer, distinct text.
                n += 1;
                let r = id();
                let hashes = (0..(4064 + 600) / 16).map(|i| BlockHash(1 << 60 | n << 20 | i));
                let req = EngineRequest {
                    prompt_tokens: 4064,
                    block_hashes: hashes.collect(),
                    output_tokens: 600,
                    lora: None,
                    priority: 0,
                };
                e.submit(now, r, req).unwrap();
                chats.insert(r, ());
            }
            if now >= next_sample {
                min = min.min(e.stats().kv_usage);
                next_sample = now.plus_secs(0.05);
            }
        }
        Outcome { min, chat_done }
    }

    #[test]
    fn lanes_alone_keep_the_replica_full() {
        let cfg = crate::bench::calibration::sim_config(2.0).engine;
        let plan = HogPlan::for_engine(&cfg, PROMPTS_HOLD);
        let o = drive(&plan, &cfg, 0, 60.0);
        assert!(
            o.min >= plan.floor_usage(),
            "min {} floor {}",
            o.min,
            plan.floor_usage()
        );
        assert!(o.min >= 0.95, "{}", o.min);
    }

    #[test]
    fn under_priority_scheduling_the_replica_stays_full_and_serves_what_it_is_sent() {
        // Round robin keeps sending the full replica its share of the chat. Under FCFS a
        // lane's next request would wait behind that share, the lane's prompt would leave
        // the cache, and KV usage would dip by a lane; with the lanes ahead by priority the
        // chat only ever gets the room the lanes leave, and is still served.
        let mut cfg = crate::bench::calibration::sim_config(2.0).engine;
        cfg.scheduling_policy = crate::sim::engine::SchedulingPolicy::Priority;
        let plan = HogPlan::for_engine(&cfg, PROMPTS_HOLD);
        let o = drive(&plan, &cfg, 8, 60.0);
        assert!(o.min >= FULL_AT, "{}", o.min);
        // About one chat request at a time (prefill, then 600 tokens at ~6.3 ms a step).
        assert!(o.chat_done >= 10, "{}", o.chat_done);
    }
}
