//! Dispatches the workload to one target: first turns first, then later turns in the seeded
//! order, each conversation's next turn only after its previous one finished (its answer
//! is part of the next prompt). Keeps `concurrency` requests in flight, or starts them at a
//! seeded Poisson rate.

use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;

use super::client::{self, BaseUrl, ChatExtras, RequestRecord};
use super::summary::Summary;
use super::workload::Workload;
use super::{Assign, Connections, LoadConfig, Target, TargetReport};

/// Everything one dispatch loop needs: a workload, where it goes and how hard.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Report label.
    pub label: String,
    /// The workload.
    pub workload: Workload,
    /// Base URLs.
    pub urls: Vec<String>,
    /// Choice among `urls`.
    pub assign: Assign,
    /// Connection reuse.
    pub connections: Connections,
    /// Requests in flight at most.
    pub concurrency: u32,
    /// Requests started per second (Poisson, seeded); `None` = as fast as concurrency allows.
    pub rate: Option<f64>,
    /// API keys; conversation i uses key i mod n.
    pub api_keys: Vec<String>,
    /// Extra headers and the mid-stream abort of every request.
    pub extras: ChatExtras,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Progress lines on stderr.
    pub progress: bool,
    /// Varies the text.
    pub salt: u64,
}

/// Runs the whole workload against `target`; `salt` varies the text.
pub async fn run_target(
    cfg: &LoadConfig,
    target: &Target,
    salt: u64,
) -> anyhow::Result<TargetReport> {
    run_plan(&Plan {
        label: target.label.clone(),
        workload: cfg.workload.clone(),
        urls: target.urls.clone(),
        assign: target.assign,
        connections: target.connections,
        concurrency: cfg.concurrency,
        rate: cfg.rate,
        api_keys: cfg.api_keys.clone(),
        extras: ChatExtras::default(),
        timeout: cfg.timeout,
        progress: cfg.progress,
        salt,
    })
    .await
}

/// Runs one plan to the end.
pub async fn run_plan(plan: &Plan) -> anyhow::Result<TargetReport> {
    let w = &plan.workload;
    let salt = plan.salt;
    let bases = plan
        .urls
        .iter()
        .map(|u| BaseUrl::parse(u))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if bases.is_empty() {
        anyhow::bail!("{} has no URL", plan.label);
    }
    let mut convs = w.conversations(salt);
    let mut busy = vec![false; convs.len()];
    let mut remaining = w.order();
    let total = remaining.len();
    let mut rng = SmallRng::seed_from_u64(w.seed ^ salt ^ 0xa551);
    let mut rr = 0usize;
    let concurrency = plan.concurrency.max(1) as usize;
    let mut inflight: JoinSet<(u32, RequestRecord)> = JoinSet::new();
    let mut records = Vec::with_capacity(total);
    let start = Instant::now();
    let mut next_start = start;
    let mut last_progress = start;
    let pool = client::ConnPool::default();

    loop {
        // Start what may start now.
        while inflight.len() < concurrency {
            let Some(pos) = remaining
                .iter()
                .position(|c| !busy.get(*c as usize).copied().unwrap_or(true))
            else {
                break;
            };
            if let Some(rate) = plan.rate {
                if Instant::now() < next_start {
                    break;
                }
                let gap: f64 = -(1.0 - rng.gen::<f64>()).ln() / rate.max(1e-9);
                next_start += Duration::from_secs_f64(gap);
            }
            let conv_idx = remaining.remove(pos);
            let Some(conv) = convs.get_mut(conv_idx as usize) else {
                continue;
            };
            if let Some(b) = busy.get_mut(conv_idx as usize) {
                *b = true;
            }
            let turn = conv.turns_sent;
            let body = Bytes::from(w.next_body(salt, conv).to_string());
            let base_idx = match plan.assign {
                Assign::Sticky => conv_idx as usize % bases.len(),
                Assign::Random => rng.gen_range(0..bases.len()),
                Assign::RoundRobin => {
                    rr += 1;
                    (rr - 1) % bases.len()
                }
            };
            let Some(base) = bases.get(base_idx % bases.len()).cloned() else {
                break;
            };
            let key = if plan.api_keys.is_empty() {
                None
            } else {
                plan.api_keys
                    .get(conv_idx as usize % plan.api_keys.len())
                    .cloned()
            };
            let timeout = plan.timeout;
            let pool = match plan.connections {
                Connections::KeepAlive => pool.clone(),
                // A pool of its own, empty: the request connects anew, and the connection
                // closes when the pool is dropped at the request's end.
                Connections::PerRequest => client::ConnPool::default(),
            };
            let extras = plan.extras.clone();
            inflight.spawn(async move {
                let mut rec =
                    client::chat_with(&pool, &base, body, key.as_deref(), timeout, &extras).await;
                rec.conversation = conv_idx;
                rec.turn = turn;
                (conv_idx, rec)
            });
        }
        if inflight.is_empty() && remaining.is_empty() {
            break;
        }
        // Wait for a completion, or for the next rate slot.
        let ready = remaining
            .iter()
            .any(|c| !busy.get(*c as usize).copied().unwrap_or(true));
        let joined = if plan.rate.is_some() && ready && inflight.len() < concurrency {
            let wait = next_start.saturating_duration_since(Instant::now());
            tokio::select! {
                j = inflight.join_next(), if !inflight.is_empty() => j,
                () = tokio::time::sleep(wait) => None,
            }
        } else {
            inflight.join_next().await
        };
        if let Some(j) = joined {
            let (conv_idx, rec) = j?;
            if let Some(b) = busy.get_mut(conv_idx as usize) {
                *b = false;
            }
            if let Some(conv) = convs.get_mut(conv_idx as usize) {
                if rec.ok() {
                    conv.push("assistant", &rec.content);
                }
            }
            records.push(rec);
        }
        if plan.progress && last_progress.elapsed() >= Duration::from_secs(2) {
            last_progress = Instant::now();
            let errors = records.iter().filter(|r| !r.ok()).count();
            eprintln!(
                "[{}] {}/{} done, {} errors, {:.0} s",
                plan.label,
                records.len(),
                total,
                errors,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let duration = start.elapsed().as_secs_f64();
    let summary = Summary::from_records(&plan.label, &records, duration);
    if plan.progress {
        eprintln!(
            "[{}] finished {} requests in {duration:.1} s",
            plan.label,
            records.len()
        );
    }
    Ok(TargetReport { summary, records })
}
