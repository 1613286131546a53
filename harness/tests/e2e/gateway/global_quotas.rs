//! Both flavours: one tenant's tokens per minute shared by two gateway replicas through
//! Envoy's global rate-limit protocol (`infergate-ratelimit`, limitador over a Redis of the
//! test's own), against the same two replicas with the in-process quota stage.
//!
//! A closed loop of clients sends the tenant's requests to the two gateways in turn for
//! [`RUN_SECONDS`] (`INFERGATE_GLOBAL_QUOTAS_RUN_S` overrides it: the 60 s run). Each
//! request pre-debits its prompt estimate plus `max_tokens` (96) but the engine stops after
//! 16 tokens, so the tenant's minute is only filled when every settlement gives the unused
//! part of its pre-debit back. The tokens the engines served the tenant are what was
//! admitted:
//!
//! - global quotas: at most the tenant's TPM plus one request's pre-debit, and at least the
//!   TPM less what the clients' requests in flight hold (so the minute was used, which
//!   takes working settlements); both gateways admitted some; every refusal is the
//!   gateway's own 429 (`rejected-quota-tpm`, OpenAI's JSON, `retry-after`), and the
//!   billing records of refused requests debit nothing;
//! - in-process quotas: more than the TPM plus one pre-debit, since each replica admits
//!   its own full budget.
//!
//! A stream the client leaves mid-way settles too (its hold is released, what was generated
//! is charged).
//!
//! `global_quota_cost` (only with `INFERGATE_GLOBAL_QUOTAS_COST=1`) measures what the global
//! path costs per request against the in-process stage: one gateway, a quota never
//! reached, sequential requests; latency percentiles and Envoy CPU per request.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::tag;
use crate::support::gw::openai_error;
use crate::support::objects::{objective, tenant_quota};
use infergate_cli::config::tenancy::Tenancy;
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::fleet::Fleet;
use infergate_harness::launch::global_quotas::{ratelimit_binary, GlobalQuotaBackend};
use infergate_harness::launch::{Backends, EnvoyOptions, Flavor, PoolSpec, StackOptions};
use infergate_harness::sim::{self, SimConfig, SimHandle};

for_each_flavour!(
    two_gateways_share_one_tenants_tokens_per_minute,
    a_stream_cut_off_settles_its_reservation,
    global_quota_cost
);

const MODEL: &str = "sim-model";
const KEY: &str = "sk-infergate-e2e-global";
const TENANT: &str = "tenant-global";
/// The tenant's tokens per minute (both gateways together, with global quotas).
const TPM: u64 = 3000;
/// Each request's `max_tokens` (in its pre-debit); the engine stops after [`NATURAL`].
const MAX_TOKENS: u64 = 96;
const NATURAL: u32 = 16;
/// Clients sending at once.
const CLIENTS: usize = 6;
/// The CI run's length.
const RUN_SECONDS: u64 = 15;

fn objects(tpm: u64) -> Vec<Value> {
    vec![
        tenant_quota(
            TENANT,
            KEY,
            "standard-traffic",
            json!({"rpm": 100000, "tpm": tpm, "concurrency": 1000}),
            None,
        ),
        objective("standard-traffic", 0),
    ]
}

fn run_length() -> Duration {
    let secs = std::env::var("INFERGATE_GLOBAL_QUOTAS_RUN_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(RUN_SECONDS);
    Duration::from_secs(secs)
}

/// Skips (printing why) when the rate-limit service or Redis is not there; under CI
/// (`CI` set), which builds and installs both, their absence fails the test instead.
fn backend_missing() -> bool {
    let missing = if let Err(e) = ratelimit_binary() {
        format!("{e:#}")
    } else if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        "redis-server is not installed (apt-get install redis-server)".to_owned()
    } else {
        return false;
    };
    assert!(std::env::var_os("CI").is_none(), "{missing}");
    eprintln!("SKIPPED: {missing}");
    true
}

async fn simulator() -> SimHandle {
    sim::start(SimConfig {
        replicas: 2,
        models: vec![MODEL.into()],
        deterministic: true,
        output_tokens: NATURAL,
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

fn options(flavor: Flavor, sim: &SimHandle, tpm: u64, billing: &str) -> StackOptions {
    let mut opts = StackOptions::new(flavor, Backends::External(sim.addrs().to_vec()));
    opts.pools = vec![PoolSpec::on(MODEL, &[0, 1])];
    opts.tenancy = Tenancy {
        objects: objects(tpm),
        jwt: None,
        billing_log: Some(std::env::temp_dir().join(format!(
            "infergate-e2e-global-{}-{}-{billing}.log",
            std::process::id(),
            tag(flavor)
        ))),
    };
    opts.envoy = EnvoyOptions {
        concurrency: crate::support::workers(),
        ..EnvoyOptions::default()
    };
    opts
}

/// What the engines served the tenant: prompt + completion tokens.
fn served_tokens(sim: &SimHandle) -> u64 {
    let mut tokens = 0;
    for i in 0..sim.addrs().len() {
        for (key, totals) in sim.served(i).unwrap() {
            if key.fairness_id == TENANT {
                tokens += totals.prompt_tokens + totals.completion_tokens;
            }
        }
    }
    tokens
}

fn body(i: usize) -> Value {
    json!({"model": MODEL, "max_tokens": MAX_TOKENS,
           "messages": [{"role": "user", "content": format!("request {i}: count a few words")}]})
}

/// One arm's outcome.
#[derive(Debug, Default)]
struct Run {
    /// Admitted requests per gateway.
    admitted: Vec<u64>,
    /// Refusals by dropped reason.
    refused: BTreeMap<String, u64>,
    /// Other statuses.
    other: BTreeMap<u16, u64>,
    /// Tokens the engines served the tenant.
    served: u64,
    /// The largest pre-debit of a billing record.
    max_pre_debit: u64,
    /// Σ pre-debit of admitted requests' records.
    pre_debited: u64,
    /// Σ charged.
    charged: u64,
    /// Records of refused requests that debited something.
    refused_with_debit: u64,
    /// One 429's body and headers, to look at.
    sample_429: Option<(Value, Option<String>)>,
    /// `x-ratelimit-limit-tokens` of the admitted responses (each distinct value once).
    limit_headers: Vec<Option<String>>,
    /// The rate-limit filter's counters (`ratelimit.*` of the service's cluster), summed
    /// over the gateways.
    filter_stats: BTreeMap<String, i64>,
}

/// The closed loop: [`CLIENTS`] clients, request `n` of the whole run to gateway `n % 2`.
async fn drive(fleet: &Fleet, sim: &SimHandle, length: Duration) -> Run {
    let urls: Vec<String> = fleet
        .picker_urls()
        .iter()
        .map(|u| format!("{u}/v1/chat/completions"))
        .collect();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let deadline = Instant::now() + length;
    let auth = format!("Bearer {KEY}");
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let urls = urls.clone();
        let next = std::sync::Arc::clone(&next);
        let auth = auth.clone();
        clients.spawn(async move {
            let mut seen = Vec::new();
            while Instant::now() < deadline {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let gateway = n % urls.len();
                let resp = post_json(&urls[gateway], &body(n), &[("authorization", &auth)])
                    .await
                    .unwrap();
                let reason = resp
                    .header("x-llm-d-request-dropped-reason")
                    .map(str::to_owned);
                let sample = (resp.status == 429).then(|| {
                    (
                        openai_error(&resp, 429),
                        resp.header("retry-after").map(str::to_owned),
                    )
                });
                let limit = resp.header("x-ratelimit-limit-tokens").map(str::to_owned);
                seen.push((gateway, resp.status, reason, sample, limit));
                if resp.status == 429 {
                    // A refused client waits a little, as a client honouring retry-after
                    // would (without waiting the whole minute).
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            seen
        });
    }
    let mut run = Run {
        admitted: vec![0; urls.len()],
        ..Run::default()
    };
    while let Some(done) = clients.join_next().await {
        for (gateway, status, reason, sample, limit) in done.unwrap() {
            match status {
                200 => {
                    run.admitted[gateway] += 1;
                    if !run.limit_headers.contains(&limit) {
                        run.limit_headers.push(limit);
                    }
                }
                429 => {
                    *run.refused.entry(reason.unwrap_or_default()).or_insert(0) += 1;
                    if run.sample_429.is_none() {
                        run.sample_429 = sample;
                    }
                }
                other => *run.other.entry(other).or_insert(0) += 1,
            }
        }
    }
    run.served = served_tokens(sim);
    for gateway in fleet.gateways() {
        let stats = gateway.envoy().stats().await.unwrap();
        for (name, value) in stats.containing(".ratelimit.") {
            let short = name.rsplit('.').next().unwrap_or(name).to_owned();
            *run.filter_stats.entry(short).or_insert(0) += value;
        }
    }
    // The billing logs: every record of the run, from both gateways.
    let requests: u64 = run.admitted.iter().sum::<u64>() + run.refused.values().sum::<u64>();
    let deadline = Instant::now() + Duration::from_secs(10);
    let records = loop {
        let mut records = Vec::new();
        for log in fleet.billing_logs() {
            records.extend(infergate_harness::launch::read_billing_log(log).unwrap());
        }
        if records.len() as u64 >= requests || Instant::now() > deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for r in &records {
        let pre = r["pre_debit"].as_u64().unwrap_or(0);
        run.max_pre_debit = run.max_pre_debit.max(pre);
        run.charged += r["charged"].as_u64().unwrap_or(0);
        if r["outcome"] == "complete" {
            run.pre_debited += pre;
        } else if pre > 0 {
            run.refused_with_debit += 1;
        }
    }
    run
}

async fn arm(flavor: Flavor, global: bool, length: Duration) -> Option<(Run, u64)> {
    let sim = simulator().await;
    let backend = if global {
        Some(GlobalQuotaBackend::start(&objects(TPM)).unwrap())
    } else {
        None
    };
    let mut opts = options(flavor, &sim, TPM, if global { "global" } else { "local" });
    opts.global_quotas = backend.as_ref().map(GlobalQuotaBackend::quotas);
    let fleet = Fleet::start(opts, 2).await.unwrap();
    let run = drive(&fleet, &sim, length).await;
    drop(fleet);
    drop(backend);
    sim.shutdown().await;
    Some((run, TPM))
}

async fn two_gateways_share_one_tenants_tokens_per_minute(flavor: Flavor) {
    if crate::support::unbuilt(flavor) || backend_missing() {
        return;
    }
    let t = tag(flavor);
    let length = run_length();
    let (global, tpm) = arm(flavor, true, length).await.unwrap();
    let (local, _) = arm(flavor, false, length).await.unwrap();
    let figures = |what: &str, r: &Run| {
        format!(
            "{t} {what}, 2 gateways, {} s, {CLIENTS} clients, TPM {tpm}: served {} tokens \
             (charged {}, pre-debited {} for admitted requests, largest pre-debit {}); \
             admitted per gateway {:?}, refused {:?}, other {:?}; rate-limit filter {:?}",
            length.as_secs(),
            r.served,
            r.charged,
            r.pre_debited,
            r.max_pre_debit,
            r.admitted,
            r.refused,
            r.other,
            r.filter_stats
        )
    };
    let g = figures("global quotas", &global);
    let l = figures("in-process quotas", &local);
    println!("{g}\n{l}");

    assert!(global.other.is_empty(), "{g}");
    assert!(
        global.admitted.iter().all(|&n| n > 0),
        "both gateways admit the tenant's requests: {g}"
    );
    assert!(
        global.served <= tpm + global.max_pre_debit,
        "the two gateways together admitted more than one minute's tokens: {g}"
    );
    // The minute is used: what the clients' requests in flight hold at the end (and one
    // more request) is all that may be left. Without settlements the unused part of each
    // pre-debit would stay held and far fewer tokens would be served.
    let held = (CLIENTS as u64 + 1) * global.max_pre_debit;
    assert!(
        global.served + held >= tpm,
        "the tenant's minute was not used (settlements?): {g}"
    );
    assert!(
        global
            .refused
            .get("rejected-quota-tpm")
            .is_some_and(|&n| n > 0),
        "{g}"
    );
    assert_eq!(global.refused.len(), 1, "only TPM refusals: {g}");
    let (error, retry_after) = global.sample_429.as_ref().unwrap();
    assert_eq!(error["type"], "tokens", "{t}: {error}");
    assert_eq!(error["code"], "rate_limit_exceeded", "{t}: {error}");
    let retry: u64 = retry_after.as_deref().unwrap_or("").parse().unwrap();
    assert!((1..=60).contains(&retry), "{t}: retry-after {retry}");
    assert_eq!(
        global.refused_with_debit, 0,
        "a request the service refused debits nothing: {g}"
    );
    assert_eq!(
        global.limit_headers,
        [Some(tpm.to_string())],
        "every admitted response carries the service's x-ratelimit-* headers: {g}"
    );
    assert_eq!(
        global.charged, global.served,
        "billing records charge what the engines served: {g}"
    );

    assert!(local.other.is_empty(), "{l}");
    assert!(
        local.served > tpm + local.max_pre_debit,
        "with in-process quotas each gateway admits its own budget: {l}"
    );
}

/// Latency percentiles of `n` sequential requests through `url`, and the Envoy's CPU
/// time per request (µs).
async fn sequential(url: &str, pid: Option<u32>, n: usize) -> (Vec<Duration>, Option<f64>) {
    let auth = format!("Bearer {KEY}");
    let cpu = |pid: Option<u32>| -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: f64 =
            fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / 100.0)
    };
    // Warm-up: connections, the rate-limit service's own.
    for i in 0..20 {
        post_json(url, &body(i), &[("authorization", &auth)])
            .await
            .unwrap();
    }
    let before = cpu(pid);
    let mut latencies = Vec::with_capacity(n);
    for i in 0..n {
        let start = Instant::now();
        let resp = post_json(url, &body(i), &[("authorization", &auth)])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{}", resp.text());
        latencies.push(start.elapsed());
    }
    let after = cpu(pid);
    latencies.sort();
    let per_request = before.zip(after).map(|(b, a)| (a - b) * 1e6 / n as f64);
    (latencies, per_request)
}

async fn global_quota_cost(flavor: Flavor) {
    if std::env::var("INFERGATE_GLOBAL_QUOTAS_COST").as_deref() != Ok("1") {
        eprintln!("SKIPPED: set INFERGATE_GLOBAL_QUOTAS_COST=1 to measure");
        return;
    }
    if crate::support::unbuilt(flavor) || backend_missing() {
        return;
    }
    let n: usize = std::env::var("INFERGATE_GLOBAL_QUOTAS_COST_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(500);
    let big = 1_000_000_000;
    let mut lines = Vec::new();
    for global in [false, true] {
        let sim = simulator().await;
        let backend = global.then(|| GlobalQuotaBackend::start(&objects(big)).unwrap());
        let mut opts = options(flavor, &sim, big, "cost");
        opts.global_quotas = backend.as_ref().map(GlobalQuotaBackend::quotas);
        let fleet = Fleet::start(opts, 1).await.unwrap();
        let url = format!("{}/v1/chat/completions", fleet.picker_urls()[0]);
        let pid = fleet.gateways()[0].envoy().pid();
        let (lat, cpu) = sequential(&url, pid, n).await;
        let pct = |p: usize| lat[(lat.len() * p / 100).min(lat.len() - 1)].as_secs_f64() * 1e3;
        lines.push(format!(
            "{} {}: {n} sequential requests, p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, \
             Envoy CPU {} µs/request",
            tag(flavor),
            if global {
                "global quotas"
            } else {
                "in-process quotas"
            },
            pct(50),
            pct(90),
            pct(99),
            cpu.map_or("?".into(), |c| format!("{c:.0}"))
        ));
        drop(fleet);
        drop(backend);
        sim.shutdown().await;
    }
    println!("{}", lines.join("\n"));
}

/// A stream the client leaves mid-way still settles: while it runs, its pre-debit is held
/// (a request that needs more than the rest is refused); once the client is gone, what was
/// generated is charged and the rest of the hold released (the same request fits).
async fn a_stream_cut_off_settles_its_reservation(flavor: Flavor) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if crate::support::unbuilt(flavor) || backend_missing() {
        return;
    }
    let t = tag(flavor);
    let tpm = 1000;
    let sim = simulator().await;
    let backend = GlobalQuotaBackend::start(&objects(tpm)).unwrap();
    let mut opts = options(flavor, &sim, tpm, "cut");
    opts.global_quotas = Some(backend.quotas());
    let fleet = Fleet::start(opts, 2).await.unwrap();
    let urls = fleet.picker_urls();
    let auth = format!("Bearer {KEY}");
    // Pre-debit ≈ 400 + the prompt, on gateway 0; read a little, then leave.
    let long = json!({"model": MODEL, "stream": true, "max_tokens": 400, "ignore_eos": true,
                      "messages": [{"role": "user", "content": "a long answer"}]})
    .to_string();
    let addr = urls[0].trim_start_matches("http://").to_owned();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         authorization: {auth}\r\ncontent-length: {}\r\n\r\n",
        long.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(long.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.windows(7).filter(|w| w == b"data: {").count() < 5 {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(
            n > 0,
            "{t}: the stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{t}: {}",
        String::from_utf8_lossy(&got)
    );
    // Pre-debit ≈ 700 on the other gateway: does not fit beside the hold.
    let big = json!({"model": MODEL, "max_tokens": 700,
                     "messages": [{"role": "user", "content": "short"}]});
    let url = format!("{}/v1/chat/completions", urls[1]);
    let resp = post_json(&url, &big, &[("authorization", &auth)])
        .await
        .unwrap();
    assert_eq!(
        resp.status,
        429,
        "{t}: the running stream's hold counts: {}",
        resp.text()
    );
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let resp = post_json(&url, &big, &[("authorization", &auth)])
            .await
            .unwrap();
        if resp.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{t}: the cut stream's hold was never released: {} {}",
            resp.status,
            resp.text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(fleet);
    drop(backend);
    sim.shutdown().await;
}
