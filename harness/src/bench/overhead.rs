//! `cargo xtask bench overhead`: what the gateway filters cost inside Envoy.
//!
//! Envoys with the same `--concurrency` run side by side in front of one
//! [`FastBackend`](super::fast_backend::FastBackend): `plain` (no gateway filter; the client
//! sets the routing headers the filters would set, so the request takes the same route and
//! ORIGINAL_DST pool cluster), `wasm` and `native` (body router + picker + scraper), and the
//! floors `wasm-floor` / `native-floor`: `plain` plus that module's `probe` filter, which only
//! holds each request until its body is complete and reads the body, the least any
//! body-based filter on that host costs (a target above the floor's ratio is out of reach
//! for any filter that must read the body). A
//! closed-loop client with a fixed number of keep-alive connections sends ~8k-token (32 KB)
//! chat bodies. Each round runs every arm once (warm-up, then a measured window), the order
//! rotating from round to round, so slow drifts of a shared machine hit every arm alike.
//!
//! Reported per arm: requests/s, latency p50/p99, the latency added over `plain`, and the
//! Envoy process's CPU time per request (read from `/proc`, so it is the proxy's own cost
//! whatever else the machine was doing). Ratios are computed on totals over all rounds and,
//! as a noise check, as the median of the per-round ratios. A `direct` arm (client straight
//! to the backend) shows what the client and backend alone can do.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde_json::json;

use super::closed_loop::{ClosedLoop, LoopResult, RequestTemplate};
use super::fast_backend::FastBackend;
use super::overhead_table::{render, Arm};
use super::report::process_cpu;
use crate::launch::{Backends, EnvoyOptions, Flavor, Stack, StackOptions, DEFAULT_MODEL};
use crate::load::workload::filler;

/// Options of `bench overhead`.
#[derive(Clone, Debug, PartialEq)]
pub struct OverheadOptions {
    /// Closed-loop connections (requests in flight).
    pub connections: usize,
    /// Envoy `--concurrency` of every arm.
    pub envoy_concurrency: u32,
    /// Rounds; every arm is measured once per round.
    pub rounds: u32,
    /// Unmeasured traffic before each measured window.
    pub warmup: Duration,
    /// Measured window per arm and round.
    pub measure: Duration,
    /// Prompt size of each body in tokens (4 bytes each).
    pub body_tokens: u32,
    /// Distinct bodies cycled through.
    pub bodies: usize,
    /// Backend listeners (endpoints of the pool).
    pub endpoints: usize,
    /// Arms to run, of `direct`, `plain`, `wasm`, `native` (all by default; `plain` is
    /// always kept, as every ratio is against it).
    pub arms: Vec<String>,
}

impl Default for OverheadOptions {
    fn default() -> Self {
        OverheadOptions {
            connections: 8,
            envoy_concurrency: 1,
            rounds: 5,
            warmup: Duration::from_millis(1000),
            measure: Duration::from_secs(4),
            body_tokens: 8000,
            bodies: 32,
            endpoints: 4,
            arms: arm_labels().map(str::to_string).collect(),
        }
    }
}

/// The Envoy arms: label, template flavour, and the module whose `probe` filter the `plain`
/// template gets (the floors: a filter that only holds the request for its body and reads
/// it, the least any body-based filter of that host costs).
const ENVOY_ARMS: [(&str, Flavor, Option<Flavor>); 5] = [
    ("plain", Flavor::Plain, None),
    ("wasm-floor", Flavor::Plain, Some(Flavor::Wasm)),
    ("wasm", Flavor::Wasm, None),
    ("native-floor", Flavor::Plain, Some(Flavor::Native)),
    ("native", Flavor::Native, None),
];

/// Every arm, in report order: `direct` (no Envoy), then the Envoy arms.
fn arm_labels() -> impl Iterator<Item = &'static str> {
    std::iter::once("direct").chain(ENVOY_ARMS.iter().map(|&(label, _, _)| label))
}

const USAGE: &str = "usage: bench overhead [--connections N] [--concurrency C] [--rounds R] \
                     [--warmup-ms MS] [--measure-s S] [--body-tokens T] [--quick] \
                     [--arms direct,plain,wasm-floor,wasm,native-floor,native]";

impl OverheadOptions {
    /// Parses the command-line flags (see [`USAGE`]).
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut o = OverheadOptions::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .with_context(|| format!("{name} needs a value; {USAGE}"))
            };
            match arg.as_str() {
                "--connections" => o.connections = value(arg)?.parse().context("--connections")?,
                "--concurrency" => {
                    o.envoy_concurrency = value(arg)?.parse().context("--concurrency")?
                }
                "--rounds" => o.rounds = value(arg)?.parse().context("--rounds")?,
                "--warmup-ms" => {
                    o.warmup = Duration::from_millis(value(arg)?.parse().context("--warmup-ms")?)
                }
                "--measure-s" => {
                    o.measure = Duration::from_secs_f64(value(arg)?.parse().context("--measure-s")?)
                }
                "--body-tokens" => o.body_tokens = value(arg)?.parse().context("--body-tokens")?,
                "--arms" => {
                    let list = value(arg)?;
                    o.arms = list.split(',').map(|a| a.trim().to_string()).collect();
                    if let Some(bad) = o.arms.iter().find(|a| !arm_labels().any(|l| l == *a)) {
                        bail!("--arms: unknown arm `{bad}`; {USAGE}");
                    }
                    if !o.arms.iter().any(|a| a == "plain") {
                        o.arms.push("plain".into());
                    }
                }
                "--quick" => {
                    o.rounds = 2;
                    o.measure = Duration::from_secs(2);
                }
                other => bail!("unknown argument `{other}`; {USAGE}"),
            }
        }
        if o.rounds == 0 || o.connections == 0 || o.bodies == 0 {
            bail!("--rounds and --connections must be at least 1");
        }
        Ok(o)
    }
}

/// The request bodies: `count` chat requests of about `tokens` prompt tokens each, with
/// distinct text (so the picker's prefix index sees different prompts).
pub fn bodies(count: usize, tokens: u32) -> Vec<Bytes> {
    (0..count as u64)
        .map(|i| {
            let system = filler(0xb0d1 ^ (i << 8), tokens.saturating_sub(32));
            let user = filler(0x05e7 ^ (i << 8), 32.min(tokens));
            let body = json!({
                "model": DEFAULT_MODEL,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": user},
                ],
                "max_tokens": 1,
            });
            Bytes::from(body.to_string())
        })
        .collect()
}

/// Runs the benchmark and returns the printed report.
pub async fn run(opts: &OverheadOptions) -> Result<String> {
    let backend = FastBackend::start(opts.endpoints).await?;
    let addrs = backend.addrs().to_vec();
    let bodies = bodies(opts.bodies, opts.body_tokens);
    let wanted = |label: &str| opts.arms.iter().any(|a| a == label);
    let mut arms = Vec::new();
    if wanted("direct") {
        arms.push(arm(
            "direct",
            None,
            direct_templates(&bodies),
            addrs.first(),
            opts,
        )?);
    }
    for &(label, flavor, probe) in &ENVOY_ARMS {
        if !wanted(label) {
            continue;
        }
        let mut so = StackOptions::new(flavor, Backends::External(addrs.clone()));
        so.probe = probe;
        so.envoy = EnvoyOptions {
            concurrency: opts.envoy_concurrency,
            ..EnvoyOptions::default()
        };
        let stack = Stack::start(so)
            .await
            .with_context(|| format!("starting the {label} stack"))?;
        // `plain` and the floors route on client-set headers; the gateway sets its own.
        let templates = match flavor {
            Flavor::Plain => plain_templates(&bodies, &addrs),
            _ => direct_templates(&bodies),
        };
        let listener = stack.envoy().listener();
        eprintln!(
            "{label} Envoy: pid {}, listener {listener}, admin {}",
            stack.envoy().pid().unwrap_or(0),
            stack.envoy().admin()
        );
        arms.push(arm(label, Some(stack), templates, Some(&listener), opts)?);
    }
    for a in &arms {
        wait_until_served(&a.client, a.label).await?;
    }
    eprintln!(
        "bench overhead: {} rounds × {} arms, {} connections, Envoy --concurrency {}, \
         {} ms warm-up + {:.1} s measured each",
        opts.rounds,
        arms.len(),
        opts.connections,
        opts.envoy_concurrency,
        opts.warmup.as_millis(),
        opts.measure.as_secs_f64()
    );
    let n = arms.len();
    for round in 0..opts.rounds as usize {
        for k in 0..n {
            let Some(a) = arms.get_mut((round + k) % n) else {
                continue;
            };
            let _ = a.client.run(opts.warmup).await;
            let cpu0 = a.envoy_pid().and_then(process_cpu);
            let posts0 = backend.counters().posts.load(Ordering::Relaxed);
            let bytes0 = backend.counters().body_bytes.load(Ordering::Relaxed);
            let r = a.client.run(opts.measure).await;
            if let (Some(c0), Some(c1)) = (cpu0, a.envoy_pid().and_then(process_cpu)) {
                a.envoy_cpu += c1.saturating_sub(c0);
            }
            a.backend_posts += backend.counters().posts.load(Ordering::Relaxed) - posts0;
            a.backend_bytes += backend.counters().body_bytes.load(Ordering::Relaxed) - bytes0;
            a.round_rps.push(r.rps());
            eprintln!(
                "  round {}/{} {:>6}: {:>7.0} req/s, {} errors",
                round + 1,
                opts.rounds,
                a.label,
                r.rps(),
                r.errors
            );
            a.total.merge(r);
        }
    }
    let logic = super::logic::measure(&bodies, Duration::from_millis(300));
    Ok(render(&arms, opts, &logic))
}

fn arm(
    label: &'static str,
    stack: Option<Stack>,
    templates: Vec<RequestTemplate>,
    target: Option<&SocketAddr>,
    opts: &OverheadOptions,
) -> Result<Arm> {
    let target = *target.context("no address to send to")?;
    Ok(Arm {
        label,
        stack,
        client: ClosedLoop {
            target,
            path: "/v1/chat/completions".into(),
            templates: Arc::new(templates),
            connections: opts.connections,
        },
        total: LoopResult::default(),
        round_rps: Vec::new(),
        envoy_cpu: Duration::ZERO,
        backend_posts: 0,
        backend_bytes: 0,
    })
}

fn direct_templates(bodies: &[Bytes]) -> Vec<RequestTemplate> {
    bodies
        .iter()
        .map(|b| RequestTemplate {
            body: b.clone(),
            headers: Vec::new(),
        })
        .collect()
}

/// The plain flavour routes on the headers the gateway filters would have set.
fn plain_templates(bodies: &[Bytes], endpoints: &[SocketAddr]) -> Vec<RequestTemplate> {
    bodies
        .iter()
        .zip(endpoints.iter().cycle())
        .map(|(b, ep)| RequestTemplate {
            body: b.clone(),
            headers: vec![
                ("x-gateway-base-model-name".into(), DEFAULT_MODEL.into()),
                ("x-gateway-destination-endpoint".into(), ep.to_string()),
            ],
        })
        .collect()
}

/// Waits until the arm answers 200 (the gateway needs its first metrics snapshot).
async fn wait_until_served(client: &ClosedLoop, label: &str) -> Result<()> {
    let probe = ClosedLoop {
        connections: 1,
        ..client.clone()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = probe.run(Duration::from_millis(1)).await;
        if r.ok > 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{label}: no successful request within 20 s: {}",
                r.first_error.unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_about_32_kb_and_distinct() {
        let b = bodies(3, 8000);
        assert_eq!(b.len(), 3);
        for body in &b {
            assert!((32_000..33_000).contains(&body.len()), "{}", body.len());
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            assert_eq!(v["model"], DEFAULT_MODEL);
        }
        assert_ne!(b[0], b[1]);
    }

    #[test]
    fn options_parse() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let o = OverheadOptions::parse(&s(&["--connections", "4", "--concurrency", "2"])).unwrap();
        assert_eq!((o.connections, o.envoy_concurrency), (4, 2));
        assert_eq!(
            OverheadOptions::parse(&[]).unwrap(),
            OverheadOptions::default()
        );
        assert!(OverheadOptions::parse(&s(&["--rounds", "0"])).is_err());
        assert!(OverheadOptions::parse(&s(&["--bogus"])).is_err());
        let o = OverheadOptions::parse(&s(&["--arms", "native"])).unwrap();
        assert_eq!(o.arms, ["native", "plain"], "plain is always measured");
        assert!(OverheadOptions::parse(&s(&["--arms", "grpc"])).is_err());
    }

    #[test]
    fn plain_templates_spread_over_endpoints() {
        let eps: Vec<SocketAddr> = vec![
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ];
        let t = plain_templates(&bodies(4, 10), &eps);
        let dest: Vec<&str> = t.iter().map(|t| t.headers[1].1.as_str()).collect();
        assert_eq!(
            dest,
            ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1", "127.0.0.1:2"]
        );
    }
}
