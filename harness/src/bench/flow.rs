//! `cargo xtask bench flow`: what flow control costs when it works, measured two ways.
//!
//! - **Dispatch at saturation, in process.** One pool's flow gate (the filters' own, the
//!   native flavour's code path without Envoy) holding `--queued` requests in process
//!   memory: each step gives one admitted request's capacity back and runs the gate, which
//!   dispatches the next queued request into its slot, whose verdict is then taken, and
//!   queues a new request so the depth stays constant. Reported as µs per enqueue +
//!   dispatch and dispatches per second, for each fairness policy.
//! - **Memory of queued requests, through Envoy.** Per flavour, a pool of one endpoint that
//!   never answers (so the first request holds the pool's only slot), then `--queued`
//!   clients each sending a 32 KB chat body on a connection of its own. Once the gauge
//!   `infergate.flow.queued` shows every one of them queued, Envoy's RSS is read; the
//!   difference to before, per request, is what a queued request costs the proxy (its
//!   connection, its buffered body, the filters' state), and the body's share is shown
//!   beside it. Then every client leaves, and the bench checks that each is counted
//!   `rejected-context-cancelled` and the queue is empty again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::cli::{flavor_or_both, flavors, parse_flags, positive, FlavorArg};
use super::soak::procmem::rss_bytes;
use crate::launch::stats::Stats;
use crate::launch::{
    Backends, EnvoyOptions, FailureMode, Flavor, PoolSpec, Stack, StackOptions, DEFAULT_MODEL,
};
use crate::load::workload::filler;
use infergate_filters::flow::{Admission, FlowGate, QueueSlot, Verdict};
use scheduler_core::flow::{Arrival, FlowControlConfig};
use scheduler_core::scheduling::config::EndpointPickerConfig;

/// Options of `bench flow`.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowOptions {
    /// Requests kept queued.
    pub queued: usize,
    /// The flavours measured through Envoy.
    pub flavors: Vec<Flavor>,
    /// Prompt tokens of each queued body (4 bytes each).
    pub body_tokens: u32,
}

impl Default for FlowOptions {
    fn default() -> Self {
        FlowOptions {
            queued: 10_000,
            flavors: vec![Flavor::Native, Flavor::Wasm],
            body_tokens: 8_000,
        }
    }
}

/// `bench flow`'s flags.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct FlowFlags {
    /// Requests kept queued [default: 10000; --quick: 1000].
    #[arg(long, value_name = "N", value_parser = positive::<usize>)]
    pub queued: Option<usize>,
    /// Flavours, comma-separated: wasm, native or both [default: both, native first].
    #[arg(
        long,
        alias = "flavour",
        value_name = "FLAVOR",
        value_delimiter = ',',
        value_parser = flavor_or_both
    )]
    pub flavor: Vec<FlavorArg>,
    /// Prompt tokens of each queued body (4 bytes each).
    #[arg(long, value_name = "T", default_value_t = 8_000)]
    pub body_tokens: u32,
    /// 1000 queued (unless --queued says otherwise).
    #[arg(long)]
    pub quick: bool,
}

impl FlowFlags {
    /// The run these flags ask for.
    pub fn options(self) -> FlowOptions {
        let d = FlowOptions::default();
        FlowOptions {
            queued: self
                .queued
                .unwrap_or(if self.quick { 1_000 } else { d.queued }),
            flavors: flavors(&self.flavor, &d.flavors),
            body_tokens: self.body_tokens,
        }
    }
}

impl FlowOptions {
    /// Parses the command-line flags (see [`FlowFlags`]).
    pub fn parse(args: &[String]) -> Result<Self> {
        Ok(parse_flags::<FlowFlags>(args)?.options())
    }
}

/// The pool's `eppConfig`: the default scheduling, flow control with one slot and room
/// for `queued` requests (and more), a TTL longer than the run.
fn saturated_config(queued: usize, fairness: &str) -> serde_json::Value {
    let mut epp = infergate_filters::picker::config::default_epp_config();
    if let Some(plugins) = epp["plugins"].as_array_mut() {
        plugins.push(json!({"type": "concurrency-detector",
                            "parameters": {"maxConcurrency": 1}}));
        plugins.push(json!({"type": fairness}));
        plugins.push(json!({"type": "fcfs-ordering-policy"}));
    }
    let room = (queued * 2).to_string();
    epp["featureGates"] = json!(["flowControl"]);
    epp["flowControl"] = json!({
        "maxRequests": room,
        "defaultRequestTTL": "600s",
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "priorityBands": [{"priority": 0, "maxRequests": room, "fairnessPolicyRef": fairness,
                           "orderingPolicyRef": "fcfs-ordering-policy"}]
    });
    epp
}

/// One policy's in-process figure.
#[derive(Clone, Debug)]
pub struct DispatchCost {
    /// The fairness policy.
    pub policy: &'static str,
    /// µs per enqueue + dispatch (slot delivered and taken).
    pub us_per_dispatch: f64,
}

/// Steady-state enqueue + dispatch with `queued` requests waiting in 100 flows, for about
/// `budget`: give the running request's capacity back, dispatch the next (the gate counts
/// its ticket), deliver its verdict to its slot and take it there (the waiting request's
/// side), and queue a new request.
pub fn dispatch_cost(
    queued: usize,
    policy: &'static str,
    budget: Duration,
) -> Result<DispatchCost> {
    let epp = EndpointPickerConfig::from_value(saturated_config(queued, policy))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let config = FlowControlConfig::compile(&epp)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .context("flow control is on")?;
    let gate: FlowGate<Arc<QueueSlot>> = FlowGate::new(config);
    let arrive = |i: u64| {
        let arrival = Arrival {
            priority: 0,
            flow: format!("tenant-{}", i % 100),
            bytes: 32_768,
            service: 8_000 + 2 * (i % 512),
            ttl_ms: None,
            now_ms: i,
            item: (),
        };
        gate.admit(arrival, 8_256, QueueSlot::new)
    };
    let Admission::Admitted(mut running) = arrive(0) else {
        bail!("the first request was not admitted");
    };
    for i in 1..=queued as u64 {
        if !matches!(arrive(i), Admission::Queued { .. }) {
            bail!("request {i} was not queued");
        }
    }
    let start = Instant::now();
    let mut steps = 0u64;
    let mut now = queued as u64 + 1;
    while start.elapsed() < budget {
        for _ in 0..256 {
            drop(running);
            let Some((dispatched, ticket)) = gate.dispatch(now).pop() else {
                bail!("nothing was dispatched");
            };
            let slot = dispatched.item;
            slot.deliver(Verdict::Dispatched {
                ticket,
                queued_ms: dispatched.queued_ms,
            });
            running = match slot.take() {
                Some(Verdict::Dispatched { ticket, .. }) => ticket,
                _ => bail!("the verdict did not reach its slot"),
            };
            if !matches!(arrive(now), Admission::Queued { .. }) {
                bail!("a new request was not queued");
            }
            now += 1;
            steps += 1;
        }
    }
    Ok(DispatchCost {
        policy,
        us_per_dispatch: start.elapsed().as_secs_f64() * 1e6 / steps.max(1) as f64,
    })
}

/// One flavour's memory figure.
#[derive(Clone, Debug)]
pub struct QueuedMemory {
    /// The flavour.
    pub flavor: Flavor,
    /// Requests queued at the reading.
    pub queued: i64,
    /// Envoy's RSS before any request, bytes.
    pub rss_before: u64,
    /// Envoy's RSS with every request queued, bytes.
    pub rss_queued: u64,
    /// Body bytes of each request.
    pub body_bytes: usize,
    /// Requests counted `rejected-context-cancelled` after every client left.
    pub cancelled: i64,
    /// Requests still queued after every client left.
    pub queued_after: i64,
}

impl QueuedMemory {
    /// RSS added per queued request, bytes.
    pub fn per_request(&self) -> f64 {
        if self.queued <= 0 {
            return 0.0;
        }
        self.rss_queued.saturating_sub(self.rss_before) as f64 / self.queued as f64
    }
}

/// A listener that accepts and reads but never answers: the pool's one endpoint, so the
/// first request holds its only slot for as long as the run lasts.
async fn black_hole() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    Ok(addr)
}

fn queued_now(stats: &Stats) -> i64 {
    stats.sum_containing("infergate.flow.queued.")
}

fn cancelled(stats: &Stats) -> i64 {
    stats
        .containing("infergate.flow.rejections.")
        .filter(|(name, _)| name.ends_with("rejected-context-cancelled"))
        .map(|(_, v)| v)
        .sum()
}

/// Opens a connection and sends one chat request with `body`; the connection is kept.
async fn send(listener: SocketAddr, body: &[u8]) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(listener).await?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: \
         application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    Ok(stream)
}

/// Polls the admin stats until `f` holds, for at most `patience`.
async fn wait_for(stack: &Stack, patience: Duration, f: impl Fn(&Stats) -> bool) -> Result<Stats> {
    let deadline = Instant::now() + patience;
    loop {
        let stats = stack.envoy().stats().await?;
        if f(&stats) || Instant::now() > deadline {
            return Ok(stats);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The memory figure of `flavor` with `opts.queued` requests queued.
pub async fn queued_memory(flavor: Flavor, opts: &FlowOptions) -> Result<QueuedMemory> {
    let endpoint = black_hole().await?;
    let mut so = StackOptions::new(flavor, Backends::External(vec![endpoint]));
    let mut pool = PoolSpec::all(DEFAULT_MODEL);
    pool.picker_config = saturated_config(opts.queued, "round-robin-fairness-policy");
    // No metrics from an endpoint that never answers: pick by in-proxy load.
    pool.failure_mode = FailureMode::FailOpen;
    so.pools = vec![pool];
    so.envoy = EnvoyOptions {
        concurrency: 2,
        ..EnvoyOptions::default()
    };
    let stack = Stack::start(so).await.context("starting the stack")?;
    let pid = stack.envoy().pid().context("Envoy's pid")?;
    let listener = stack.envoy().listener();
    let body = json!({"model": DEFAULT_MODEL, "max_tokens": 16, "messages": [
        {"role": "user", "content": filler(0xf10, opts.body_tokens)}]})
    .to_string()
    .into_bytes();
    // Let the scraper's first rounds settle before the reading.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_bytes(pid)?;
    // It holds the pool's one slot until the queued clients have left (were it to leave
    // first, its end would dispatch queued requests instead).
    let holder = send(listener, &body).await.context("the holder")?;
    let mut streams = Vec::with_capacity(opts.queued);
    wait_for(&stack, Duration::from_secs(10), |s| {
        s.sum_containing("infergate.picker.inflight_requests.pool.") >= 1
    })
    .await?;
    for i in 0..opts.queued {
        streams.push(
            send(listener, &body)
                .await
                .with_context(|| format!("request {i}"))?,
        );
    }
    let want = opts.queued as i64;
    let stats = wait_for(&stack, Duration::from_secs(120), |s| queued_now(s) >= want).await?;
    let queued = queued_now(&stats);
    let rss_queued = rss_bytes(pid)?;
    drop(streams);
    let after = wait_for(&stack, Duration::from_secs(60), |s| {
        queued_now(s) == 0 && cancelled(s) >= queued
    })
    .await?;
    drop(holder);
    Ok(QueuedMemory {
        flavor,
        queued,
        rss_before,
        rss_queued,
        body_bytes: body.len(),
        cancelled: cancelled(&after),
        queued_after: queued_now(&after),
    })
}

/// Runs the benchmark; the report.
pub async fn run(opts: &FlowOptions) -> Result<String> {
    let mut out = String::new();
    out.push_str(&format!(
        "flow gate at saturation, in process (native code path), {} queued in 100 flows, one \
         slot: enqueue + dispatch + verdict through the slot\n",
        opts.queued
    ));
    for policy in [
        "round-robin-fairness-policy",
        "global-strict-fairness-policy",
        "weighted-fairness-policy",
    ] {
        let c = dispatch_cost(opts.queued, policy, Duration::from_millis(700))?;
        out.push_str(&format!(
            "  {:<32} {:>7.2} µs per dispatch = {:>9.0} dispatches/s (target ≥ 20,000: {})\n",
            c.policy,
            c.us_per_dispatch,
            1e6 / c.us_per_dispatch,
            if 1e6 / c.us_per_dispatch >= 20_000.0 {
                "met"
            } else {
                "MISSED"
            }
        ));
    }
    for &flavor in &opts.flavors {
        let m = queued_memory(flavor, opts).await?;
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        out.push_str(&format!(
            "{flavor:?}: {} requests queued ({} B bodies) in Envoy (2 workers): RSS {:.1} → {:.1} \
             MiB = {:.1} KiB per queued request, of which {:.1} KiB is its body; every client \
             then left: {} counted rejected-context-cancelled, {} still queued\n",
            m.queued,
            m.body_bytes,
            mib(m.rss_before),
            mib(m.rss_queued),
            m.per_request() / 1024.0,
            m.body_bytes as f64 / 1024.0,
            m.cancelled,
            m.queued_after
        ));
        if m.queued_after != 0 || m.cancelled < m.queued {
            bail!("{out}\n{flavor:?}: the queue did not empty when its clients left");
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_in_process_dispatch_runs_for_every_policy() {
        for policy in [
            "round-robin-fairness-policy",
            "global-strict-fairness-policy",
            "weighted-fairness-policy",
        ] {
            let c = dispatch_cost(200, policy, Duration::from_millis(20)).unwrap();
            assert!(c.us_per_dispatch > 0.0, "{c:?}");
        }
    }

    #[test]
    fn options() {
        let o = FlowOptions::parse(&["--quick".into(), "--flavor".into(), "wasm".into()]).unwrap();
        assert_eq!((o.queued, o.flavors), (1_000, vec![Flavor::Wasm]));
        assert!(FlowOptions::parse(&["--queued".into(), "0".into()]).is_err());
    }
}
