//! The tenants scenario's saturation phase: flow control on, and the pool saturated by
//! both tenants. The pool's `eppConfig` ([`epp_config`]) is the picker's default scheduling
//! plus the `flowControl` feature: a `concurrency-detector` that counts the pool saturated
//! at [`MAX_CONCURRENCY`] requests in flight from this Envoy, one band at priority 0 with
//! the `weighted-fairness-policy` (tenant A weight 3, tenant B weight 1; A's premium
//! objective, priority 100, has no band of its own and uses the nearest lower one, so A and
//! B share it), and a best-effort band at priority -10 that holds at most
//! [`BEST_EFFORT_QUEUE`] requests.
//!
//! For [`load_secs`] seconds A keeps [`A_OUTSTANDING`] requests outstanding and B
//! [`B_OUTSTANDING`] (each sends its next request when one comes back), several times what
//! the pool is let serve at once, so both always have requests queued in the gateway;
//! tenant C (best-effort) sends [`C_RATE`] requests a second whatever comes back. All send
//! the same shape of request, so a 3 : 1 share of tokens is also 3 : 1 in requests. Then
//! the clients stop and what is queued drains.
//!
//! While it runs, the demo reads the billing log every [`TAIL_EVERY`] and stamps each new
//! record with the time it read it ([`Tail`]): [`windows`](super::windows) turns the records
//! and the client's answers into figures per window.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::figures::{bills, served, served_since, Bill, Served};
use super::windows::{queue_overall, windows, QueueTimes, Sent, Stamped, Window};
use super::{probe, scrape, wait_lines, TenantsOptions, KEY_A, KEY_B, TENANT_A, TENANT_B};
use crate::bench::calibration;
use crate::launch::{client, PoolSpec, Stack, DEFAULT_MODEL};
use crate::load::workload::filler;
use crate::sim;

/// Tenant C's name: the best-effort tenant of the saturation phase.
pub const TENANT_C: &str = "tenant-c";
/// Tenant C's test key (its sha256 is in the demo's objects; see testdata/README.md).
pub const KEY_C: &str = "sk-infergate-test-tenant-c";
/// Requests in flight from this Envoy at which the pool counts as saturated.
pub const MAX_CONCURRENCY: u32 = 8;
/// Tenant A's weight in the shared band.
pub const WEIGHT_A: u32 = 3;
/// Tenant B's weight in the shared band.
pub const WEIGHT_B: u32 = 1;
/// The band A and B share (A's priority 100 has none of its own).
pub const SHARED_BAND: i32 = 0;
/// The best-effort band: C's objective's priority.
pub const BEST_EFFORT_BAND: i32 = -10;
/// Most requests the best-effort band holds queued; C's others are refused at once.
pub const BEST_EFFORT_QUEUE: u32 = 4;
/// How long a request may wait queued (every band): long enough for A's and B's queues
/// (about a second at these sizes), short enough that C's requests, which wait behind them,
/// expire within the phase.
pub const TTL_SECS: u32 = 5;
/// A's requests outstanding: its quota's concurrency, twice what the pool serves at once.
pub const A_OUTSTANDING: u32 = 16;
/// B's requests outstanding: its quota's concurrency.
pub const B_OUTSTANDING: u32 = 8;
/// C's requests started per second (evenly spaced), whatever comes back.
pub const C_RATE: f64 = 4.0;
/// C's requests outstanding at most (its quota's concurrency).
pub const C_OUTSTANDING: u32 = 16;
/// Prompt tokens of every request of the phase.
pub const PROMPT_TOKENS: u32 = 384;
/// Completion tokens of every request of the phase (`max_tokens` with `ignore_eos`).
pub const COMPLETION_TOKENS: u32 = 64;
/// The figures' window.
pub const WINDOW_SECS: f64 = 2.0;
/// How often the billing log is read while the phase runs.
pub const TAIL_EVERY: Duration = Duration::from_millis(100);
/// One request's timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

// A and B together keep several times what the pool serves at once outstanding, and B more
// than its weighted share of the pool's slots: both stay backlogged the whole time.
const _: () = assert!(A_OUTSTANDING + B_OUTSTANDING >= 3 * MAX_CONCURRENCY);
const _: () = assert!(B_OUTSTANDING > MAX_CONCURRENCY * WEIGHT_B / (WEIGHT_A + WEIGHT_B));

/// Seconds the clients send for: 16 (`quick`) or 40.
pub fn load_secs(quick: bool) -> f64 {
    if quick {
        16.0
    } else {
        40.0
    }
}

/// The pool's `EndpointPickerConfig`: the picker's default scheduling config with the
/// flow-control feature, its plugins and its section added.
pub fn epp_config() -> Value {
    let mut config = infergate_filters::picker::config::default_epp_config();
    config["featureGates"] = json!(["flowControl"]);
    if let Some(plugins) = config["plugins"].as_array_mut() {
        plugins.extend([
            json!({"type": "concurrency-detector", "parameters": {
                "maxConcurrency": MAX_CONCURRENCY,
                "concurrencyMode": "requests",
                "headroom": 0.0,
            }}),
            json!({"type": "weighted-fairness-policy"}),
            json!({"type": "round-robin-fairness-policy"}),
            json!({"type": "fcfs-ordering-policy"}),
        ]);
    }
    config["flowControl"] = json!({
        "maxBytes": "64Mi",
        "maxRequests": "1k",
        "defaultRequestTTL": format!("{TTL_SECS}s"),
        "saturationDetector": {"pluginRef": "concurrency-detector"},
        "priorityBands": [
            {
                "priority": SHARED_BAND,
                "maxRequests": "200",
                "fairnessPolicyRef": "weighted-fairness-policy",
                "orderingPolicyRef": "fcfs-ordering-policy",
            },
            {
                "priority": BEST_EFFORT_BAND,
                "maxRequests": BEST_EFFORT_QUEUE.to_string(),
                "fairnessPolicyRef": "round-robin-fairness-policy",
                "orderingPolicyRef": "fcfs-ordering-policy",
            },
        ],
        "flows": [
            {"fairnessId": TENANT_A, "weight": WEIGHT_A},
            {"fairnessId": TENANT_B, "weight": WEIGHT_B},
        ],
    });
    config
}

/// How one tenant sends during the phase.
#[derive(Clone, Debug, PartialEq)]
pub struct Lane {
    /// The tenant.
    pub tenant: String,
    /// Its API key.
    pub key: String,
    /// Requests outstanding at most.
    pub outstanding: u32,
    /// `None`: the next request when one comes back (closed loop); `Some(r)`: `r` requests
    /// a second, evenly spaced, whatever comes back (up to `outstanding`).
    pub rate: Option<f64>,
}

/// The phase's three lanes: A and B closed-loop, C at a fixed rate.
pub fn lanes() -> Vec<Lane> {
    let lane = |tenant: &str, key: &str, outstanding, rate| Lane {
        tenant: tenant.into(),
        key: key.into(),
        outstanding,
        rate,
    };
    vec![
        lane(TENANT_A, KEY_A, A_OUTSTANDING, None),
        lane(TENANT_B, KEY_B, B_OUTSTANDING, None),
        lane(TENANT_C, KEY_C, C_OUTSTANDING, Some(C_RATE)),
    ]
}

/// What the phase produced.
#[derive(Clone, Debug, Default)]
pub struct SaturationFigures {
    /// Column label (flavour, workers).
    pub label: String,
    /// Seconds the clients sent for.
    pub load_s: f64,
    /// The figures' window.
    pub window_s: f64,
    /// Every answer the clients got, in completion order.
    pub sent: Vec<Sent>,
    /// Every billing record of the phase, stamped.
    pub records: Vec<Stamped>,
    /// The figures per window.
    pub windows: Vec<Window>,
    /// Queue times per priority over the whole phase.
    pub queue: std::collections::BTreeMap<i64, QueueTimes>,
    /// The billing records summed per tenant.
    pub bills: std::collections::BTreeMap<String, Bill>,
    /// What the replicas served per fairness id during the phase.
    pub served: std::collections::BTreeMap<String, Served>,
    /// The gateway's non-zero `infergate.flow.*` counters at the end, names after
    /// `infergate.flow.`.
    pub flow_stats: Vec<(String, i64)>,
    /// The billing log.
    pub billing_log: PathBuf,
    /// Wall time from the first request to the last answer.
    pub wall_s: f64,
}

/// Runs the phase on a fresh simulated pool.
pub async fn run(
    opts: &TenantsOptions,
    objects: &[Value],
    logs: &Path,
) -> Result<SaturationFigures> {
    let sim = sim::start(calibration::sim_config(opts.time_scale))
        .await
        .context("starting the simulator")?;
    let result = run_on(&sim, opts, objects, logs).await;
    sim.shutdown().await;
    result
}

async fn run_on(
    sim: &sim::SimHandle,
    opts: &TenantsOptions,
    objects: &[Value],
    logs: &Path,
) -> Result<SaturationFigures> {
    let label = format!(
        "gateway with flow control ({}, {} workers)",
        opts.flavor, opts.workers
    );
    let billing_log = logs.join("billing-saturation.log");
    let mut so = super::stack_options(sim, opts, objects, &billing_log);
    let mut pool = PoolSpec::all(DEFAULT_MODEL);
    pool.picker_config = epp_config();
    so.pools = vec![pool];
    let stack = Stack::start(so)
        .await
        .with_context(|| format!("starting the {} stack with flow control", opts.flavor))?;
    let probes = probe(&stack).await?;
    wait_lines(&billing_log, probes, Duration::from_secs(5)).await?;
    let offset = std::fs::metadata(&billing_log).map_or(0, |m| m.len());
    let served_before = served(&scrape(sim).await);
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let load_s = load_secs(opts.quick);
    eprintln!(
        "tenants: {label}: A ({A_OUTSTANDING} outstanding, weight {WEIGHT_A}), B \
         ({B_OUTSTANDING}, weight {WEIGHT_B}) and best-effort C ({C_RATE}/s) for {load_s} s \
         at {url}; the pool counts as saturated at {MAX_CONCURRENCY} in flight"
    );

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicUsize::new(0));
    let tail = {
        let (stop, read, path) = (stop.clone(), read.clone(), billing_log.clone());
        tokio::spawn(async move {
            let mut tail = Tail::at(path, offset);
            let mut out = Vec::new();
            loop {
                let last = stop.load(Ordering::Acquire);
                out.extend(tail.read(start.elapsed().as_secs_f64())?);
                read.store(out.len(), Ordering::Release);
                if last {
                    return anyhow::Ok(out);
                }
                tokio::time::sleep(TAIL_EVERY).await;
            }
        })
    };
    let sent = drive(&url, &lanes(), Duration::from_secs_f64(load_s), start).await;
    let wall_s = start.elapsed().as_secs_f64();
    // Every answered request reached the auth stage and gets one line.
    let expected = sent.iter().filter(|s| s.status != 0).count();
    let waited = Instant::now();
    while read.load(Ordering::Acquire) < expected && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(TAIL_EVERY).await;
    }
    stop.store(true, Ordering::Release);
    let records = tail.await.context("the billing log reader")??;
    if records.len() < expected {
        eprintln!(
            "tenants: the billing log {} has {} records of the phase, {expected} expected",
            billing_log.display(),
            records.len()
        );
    }
    let served_after = served(&scrape(sim).await);
    let flow_stats = flow_stats(&stack).await;
    drop(stack);
    let values: Vec<Value> = records.iter().map(|r| r.record.clone()).collect();
    Ok(SaturationFigures {
        label,
        load_s,
        window_s: WINDOW_SECS,
        windows: windows(&records, &sent, WINDOW_SECS, load_s),
        queue: queue_overall(&records),
        bills: bills(&values),
        served: served_since(&served_after, &served_before),
        flow_stats,
        billing_log,
        wall_s,
        sent,
        records,
    })
}

/// The gateway's non-zero flow-control counters (names after `infergate.flow.`).
async fn flow_stats(stack: &Stack) -> Vec<(String, i64)> {
    match stack.envoy().stats().await {
        Ok(stats) => stats
            .containing("infergate.flow.")
            .filter(|(_, v)| *v != 0)
            .filter_map(|(k, v)| {
                k.split_once("infergate.flow.")
                    .map(|(_, rest)| (rest.to_string(), v))
            })
            .collect(),
        Err(e) => vec![(format!("(stats unavailable: {e:#})"), 0)],
    }
}

/// Reads the lines appended to a billing log since an offset, each stamped when read.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    /// A reader of `path` from byte `offset` on.
    pub fn at(path: PathBuf, offset: u64) -> Tail {
        Tail {
            path,
            offset,
            partial: Vec::new(),
        }
    }

    /// The complete lines appended since the last read, stamped `at_s` (a line still being
    /// written waits for the next read). A missing file reads as nothing; a complete line
    /// that is not JSON is an error naming it.
    pub fn read(&mut self, at_s: f64) -> Result<Vec<Stamped>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("opening {}", self.path.display())),
        };
        file.seek(SeekFrom::Start(self.offset))
            .with_context(|| format!("seeking {}", self.path.display()))?;
        let mut new = Vec::new();
        file.read_to_end(&mut new)
            .with_context(|| format!("reading {}", self.path.display()))?;
        self.offset += new.len() as u64;
        self.partial.extend_from_slice(&new);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else {
            return Ok(Vec::new());
        };
        let complete: Vec<u8> = self.partial.drain(..=end).collect();
        let mut out = Vec::new();
        for line in complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let record = serde_json::from_slice(line).with_context(|| {
                format!(
                    "{}: `{}`",
                    self.path.display(),
                    String::from_utf8_lossy(line)
                )
            })?;
            out.push(Stamped { at_s, record });
        }
        Ok(out)
    }
}

/// Sends every lane's requests for `load`, then waits for the outstanding ones; returns
/// every answer, times relative to `start`.
pub async fn drive(url: &str, lanes: &[Lane], load: Duration, start: Instant) -> Vec<Sent> {
    let out: Arc<Mutex<Vec<Sent>>> = Arc::new(Mutex::new(Vec::new()));
    let counter = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for lane in lanes {
        match lane.rate {
            None => {
                for _ in 0..lane.outstanding {
                    let (lane, url, out, counter) =
                        (lane.clone(), url.to_string(), out.clone(), counter.clone());
                    tasks.push(tokio::spawn(async move {
                        while start.elapsed() < load {
                            let n = counter.fetch_add(1, Ordering::Relaxed);
                            let s = send(&url, &lane, n, start).await;
                            if let Ok(mut v) = out.lock() {
                                v.push(s);
                            }
                        }
                    }));
                }
            }
            Some(rate) => {
                let (lane, url, out, counter) =
                    (lane.clone(), url.to_string(), out.clone(), counter.clone());
                tasks.push(tokio::spawn(async move {
                    let every = Duration::from_secs_f64(1.0 / rate.max(0.01));
                    let inflight = Arc::new(AtomicUsize::new(0));
                    let mut spawned = Vec::new();
                    let mut next = Duration::ZERO;
                    while next < load {
                        tokio::time::sleep_until((start + next).into()).await;
                        next += every;
                        if inflight.load(Ordering::Acquire) >= lane.outstanding as usize {
                            continue;
                        }
                        inflight.fetch_add(1, Ordering::AcqRel);
                        let n = counter.fetch_add(1, Ordering::Relaxed);
                        let (lane, url, out, inflight) =
                            (lane.clone(), url.clone(), out.clone(), inflight.clone());
                        spawned.push(tokio::spawn(async move {
                            let s = send(&url, &lane, n, start).await;
                            if let Ok(mut v) = out.lock() {
                                v.push(s);
                            }
                            inflight.fetch_sub(1, Ordering::AcqRel);
                        }));
                    }
                    for t in spawned {
                        let _ = t.await;
                    }
                }));
            }
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    let v = out.lock().map(|v| v.clone()).unwrap_or_default();
    v
}

/// One request of the phase's shape for `lane` (its `n`-th of the phase: its own text).
async fn send(url: &str, lane: &Lane, n: u64, start: Instant) -> Sent {
    let body = json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": filler(0x5a7_0000 + n, PROMPT_TOKENS)}],
        "max_tokens": COMPLETION_TOKENS,
        "ignore_eos": true,
    });
    let auth = format!("Bearer {}", lane.key);
    let sent_s = start.elapsed().as_secs_f64();
    let answer = tokio::time::timeout(
        REQUEST_TIMEOUT,
        client::post_json(url, &body, &[("authorization", auth.as_str())]),
    )
    .await;
    let (status, dropped_reason) = match answer {
        Ok(Ok(r)) => (
            r.status,
            r.header("x-llm-d-request-dropped-reason")
                .map(str::to_string),
        ),
        _ => (0, None),
    };
    Sent {
        tenant: lane.tenant.clone(),
        sent_s,
        done_s: start.elapsed().as_secs_f64(),
        status,
        dropped_reason,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::launch::{load_objects, read_billing_log};
    use infergate_filters::tenants::Tenants;
    use std::io::Write;

    #[test]
    fn the_tail_stamps_complete_lines_only() {
        let path = std::env::temp_dir().join(format!("infergate-tail-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut tail = Tail::at(path.clone(), 0);
        assert!(tail.read(0.0).unwrap().is_empty(), "no file yet");
        let mut f = std::fs::File::create(&path).unwrap();
        write!(f, "{{\"tenant\":\"a\"}}\n{{\"tenant\":").unwrap();
        f.flush().unwrap();
        let first = tail.read(1.0).unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(
            (first[0].at_s, first[0].record["tenant"].as_str()),
            (1.0, Some("a"))
        );
        writeln!(f, "\"b\"}}").unwrap();
        f.flush().unwrap();
        let second = tail.read(2.5).unwrap();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].record["tenant"], "b");
        assert_eq!(second[0].at_s, 2.5);
        assert_eq!(read_billing_log(&path).unwrap().len(), 2);
        writeln!(f, "not json").unwrap();
        f.flush().unwrap();
        assert!(tail.read(3.0).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    /// The config carries the flow-control parts the gateway reads, on top of a scheduling
    /// config the picker compiles.
    #[test]
    fn the_epp_config_adds_flow_control_to_the_default() {
        let c = epp_config();
        assert_eq!(c["featureGates"], json!(["flowControl"]));
        let fc = &c["flowControl"];
        assert_eq!(
            fc["saturationDetector"]["pluginRef"],
            "concurrency-detector"
        );
        let bands = fc["priorityBands"].as_array().unwrap();
        assert_eq!(bands.len(), 2);
        assert_eq!(bands[0]["fairnessPolicyRef"], "weighted-fairness-policy");
        assert_eq!(bands[1]["priority"], BEST_EFFORT_BAND);
        assert_eq!(bands[1]["maxRequests"], "4");
        let plugins = c["plugins"].as_array().unwrap();
        for band in bands {
            for key in ["fairnessPolicyRef", "orderingPolicyRef"] {
                let name = band[key].as_str().unwrap();
                assert!(plugins.iter().any(|p| p["type"] == name), "{name}");
            }
        }
        let detector = plugins
            .iter()
            .find(|p| p["type"] == "concurrency-detector")
            .unwrap();
        assert_eq!(detector["parameters"]["maxConcurrency"], MAX_CONCURRENCY);
        assert_eq!(fc["flows"][0], json!({"fairnessId": TENANT_A, "weight": 3}));
    }

    /// The most of `tenant`'s requests in flight at once, from the answers' intervals.
    fn most_in_flight(sent: &[Sent], tenant: &str) -> usize {
        let mut edges: Vec<(f64, i32)> = sent
            .iter()
            .filter(|s| s.tenant == tenant)
            .flat_map(|s| [(s.sent_s, 1), (s.done_s, -1)])
            .collect();
        // An end before a start at the same instant: a closed loop's next request.
        edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut now, mut most) = (0i32, 0i32);
        for (_, d) in edges {
            now += d;
            most = most.max(now);
        }
        most as usize
    }

    /// The driver against a simulated replica (no gateway): closed-loop lanes keep their
    /// requests outstanding and never more, the rated lane sends at its rate, and every
    /// request stops being sent when the load ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_driver_keeps_each_lane_to_its_shape() {
        let sim = crate::sim::start(crate::sim::SimConfig {
            time_scale: 20.0,
            ..crate::sim::SimConfig::default()
        })
        .await
        .unwrap();
        let url = format!("{}/v1/chat/completions", sim.base_urls()[0]);
        let lane = |tenant: &str, outstanding, rate| Lane {
            tenant: tenant.into(),
            key: "k".into(),
            outstanding,
            rate,
        };
        let lanes = [lane("a", 3, None), lane("c", 8, Some(10.0))];
        let load = Duration::from_millis(1500);
        let sent = drive(&url, &lanes, load, Instant::now()).await;
        sim.shutdown().await;
        assert!(sent.iter().all(|s| s.status == 200), "{sent:?}");
        assert!(sent.iter().all(|s| s.done_s >= s.sent_s && s.sent_s < 1.5));
        let count = |t: &str| sent.iter().filter(|s| s.tenant == t).count();
        assert!(count("a") > 3, "a's lanes loop: {}", count("a"));
        assert_eq!(most_in_flight(&sent, "a"), 3);
        // 10 a second for 1.5 s, evenly spaced from 0.
        assert_eq!(count("c"), 15);
        let mut starts: Vec<f64> = sent
            .iter()
            .filter(|s| s.tenant == "c")
            .map(|s| s.sent_s)
            .collect();
        starts.sort_by(f64::total_cmp);
        assert!(starts.windows(2).all(|w| w[1] - w[0] > 0.05), "{starts:?}");
    }

    /// The gateway's own compilers accept the config and read what the demo means: the
    /// detector, the two bands and their policies, the TTL, the weights.
    #[test]
    fn the_gateway_compiles_the_epp_config_as_meant() {
        use scheduler_core::flow::{
            ConcurrencyMode, Detector, FairnessPolicy, FlowControlConfig, OrderingPolicy,
        };
        use scheduler_core::scheduling::config::EndpointPickerConfig;
        use scheduler_core::scheduling::Scheduler;
        let epp = EndpointPickerConfig::from_value(epp_config()).unwrap();
        Scheduler::new(&epp).unwrap();
        let fc = FlowControlConfig::compile(&epp).unwrap().unwrap();
        assert_eq!(
            fc.detector,
            Detector::Concurrency {
                max_concurrency: u64::from(MAX_CONCURRENCY),
                mode: ConcurrencyMode::Requests,
                headroom: 0.0,
            }
        );
        assert_eq!(fc.default_ttl_ms, u64::from(TTL_SECS) * 1000);
        let bands: Vec<_> = fc
            .bands
            .iter()
            .map(|b| (b.priority, b.max_requests, b.fairness, b.ordering))
            .collect();
        assert_eq!(
            bands,
            [
                (
                    SHARED_BAND,
                    200,
                    FairnessPolicy::Weighted,
                    OrderingPolicy::Fcfs
                ),
                (
                    BEST_EFFORT_BAND,
                    u64::from(BEST_EFFORT_QUEUE),
                    FairnessPolicy::RoundRobin,
                    OrderingPolicy::Fcfs
                ),
            ]
        );
        assert_eq!(
            fc.weights,
            [
                (TENANT_A.to_string(), WEIGHT_A),
                (TENANT_B.to_string(), WEIGHT_B)
            ]
        );
    }

    /// The demo's objects put C in the best-effort band and A and B in the shared one; A and
    /// B keep their quotas' concurrency outstanding (never refused for it) and together
    /// offer several times what the pool serves at once; C offers more than its band holds.
    #[test]
    fn the_lanes_saturate_the_pool_within_the_quotas() {
        let path = TenantsOptions::parse(&[]).unwrap().objects_path();
        let tenants = Tenants::from_objects(&load_objects(&path).unwrap()).unwrap();
        let tenant = |key: &str| {
            let id = tenants.by_api_key(key).unwrap();
            let t = tenants.tenant(id).unwrap();
            let limits = tenants.limit_for(id, DEFAULT_MODEL).unwrap().1.limits;
            (t.name.clone(), t.priority, limits)
        };
        let (c_name, c_priority, c_limits) = tenant(KEY_C);
        assert_eq!((c_name.as_str(), c_priority), (TENANT_C, BEST_EFFORT_BAND));
        let (_, a_priority, a_limits) = tenant(KEY_A);
        let (_, b_priority, b_limits) = tenant(KEY_B);
        // Both above the best-effort band and at or above the shared one: both share it.
        assert!(a_priority >= SHARED_BAND && b_priority == SHARED_BAND);
        let lanes = lanes();
        assert_eq!(
            u64::from(lanes[0].outstanding),
            a_limits.concurrency.unwrap()
        );
        assert_eq!(
            u64::from(lanes[1].outstanding),
            b_limits.concurrency.unwrap()
        );
        assert!(u64::from(lanes[2].outstanding) <= c_limits.concurrency.unwrap());
        // C offers more in one TTL than its band holds.
        assert!(C_RATE * f64::from(TTL_SECS) > f64::from(BEST_EFFORT_QUEUE));
        // Tokens per second A and B may use stay within their tokens per minute even if the
        // pool served a request per slot every 0.3 s.
        let cost = f64::from(PROMPT_TOKENS + COMPLETION_TOKENS);
        let pool_per_s = f64::from(MAX_CONCURRENCY) / 0.3 * cost;
        let a_share = f64::from(WEIGHT_A) / f64::from(WEIGHT_A + WEIGHT_B);
        let minute = 60.0;
        assert!(
            a_share * pool_per_s * load_secs(false)
                < a_limits.tpm.unwrap() as f64 * (1.0 + load_secs(false) / minute)
        );
        assert!(
            (1.0 - a_share) * pool_per_s * load_secs(false)
                < b_limits.tpm.unwrap() as f64 * (1.0 + load_secs(false) / minute)
        );
        assert!(load_secs(true) < load_secs(false));
    }
}
